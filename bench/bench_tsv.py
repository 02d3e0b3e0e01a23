"""The benchmark TSV lines (`name<TAB>value<TAB>unit<TAB>fraction`) that bench_gpu, bench_fast and
the PyTorch peer scripts write, read back for scripts/gpu-check.sh's summary tables."""


def load(path):
    rows = {}
    try:
        for line in open(path):
            if line.startswith("#") or not line.strip():
                continue
            f = line.rstrip("\n").split("\t")
            if len(f) >= 4:
                try:
                    rows[f[0]] = (float(f[1]), f[2], None if f[3] == "-" else float(f[3]))
                except ValueError:
                    pass
    except OSError:
        pass
    return rows
