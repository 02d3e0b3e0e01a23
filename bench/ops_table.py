#!/usr/bin/env python3
"""Side-by-side table of bench_ops (nuvec) and bench/gpu_ops_peers.py (PyTorch eager).

    python3 bench/ops_table.py bench_ops.tsv gpu_ops_peers.tsv

Per case, in bench_ops's order (then any case only torch measured): nuvec's GB/s and its
fraction of nuvec's copy ceiling, torch eager's GB/s and its fraction of torch's copy ceiling,
nuvec / torch, and the flags ``<85%`` (nuvec under 85% of the copy ceiling), ``<torch`` (nuvec
slower than torch eager) and ``FAILED``/``missing``. Ends with counts. scripts/gpu-ops.sh runs it.
"""

import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_tsv import load  # noqa: E402

TARGET = 0.85
CEILING = "ceiling_copy_memcpy"


def fmt(v, digits=1):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:.{digits}f}"


def pct(f):
    return "-" if f is None or math.isnan(f) else f"{100 * f:.0f}%"


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    nu, peers = load(sys.argv[1]), load(sys.argv[2])
    torch = {n.split(":", 1)[1]: v for n, v in peers.items() if n.startswith("torch_eager:")}
    names = list(nu) + [n for n in torch if n not in nu]
    print(f"{'case':<36} {'nuvec':>8} {'of copy':>7} {'torch':>8} {'of copy':>7} {'nu/torch':>8}  flags")
    counts = {"cases": 0, "ok": 0, "<85%": 0, "<torch": 0, "failed": 0, "missing": 0, "no torch": 0}
    worst = []
    for n in names:
        v, _, frac = nu.get(n, (None, "", None))
        t, _, tfrac = torch.get(n, (None, "", None))
        have_v = v is not None and not math.isnan(v)
        have_t = t is not None and not math.isnan(t) and t > 0
        ratio = v / t if have_v and have_t else None
        flags = []
        if n != CEILING:
            counts["cases"] += 1
            if v is None:
                flags.append("missing")
                counts["missing"] += 1
            elif not have_v:
                flags.append("FAILED")
                counts["failed"] += 1
            else:
                if frac is not None and frac < TARGET:
                    flags.append("<85%")
                    counts["<85%"] += 1
                if ratio is not None and ratio < 1.0:
                    flags.append("<torch")
                    counts["<torch"] += 1
                if ratio is None:
                    counts["no torch"] += 1
                if not flags and ratio is not None and frac is not None:
                    counts["ok"] += 1
                if ratio is not None:
                    worst.append((ratio, n))
        print(f"{n:<36} {fmt(v):>8} {pct(frac):>7} {fmt(t):>8} {pct(tfrac):>7} {fmt(ratio, 3):>8}  {' '.join(flags)}")
    print(f"\nops: {counts['cases']} cases; {counts['ok']} meet both targets (>=85% of copy and >= torch eager); "
          f"{counts['<85%']} under 85% of copy; {counts['<torch']} slower than torch; {counts['failed']} failed; "
          f"{counts['missing']} not run by nuvec; {counts['no torch']} without a torch figure")
    if worst:
        worst.sort()
        print("slowest against torch: " + ", ".join(f"{n} {r:.2f}" for r, n in worst[:8]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
