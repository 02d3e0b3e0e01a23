#!/usr/bin/env python3
"""CPU speed of nuvec's core and fused operations against MLX (CPU) and NumPy, in one run.

Builds and runs `crates/nuvec/examples/bench_cpu.rs`, times the same cases in MLX on its CPU
device and in NumPy with the same method (random inputs made and evaluated before timing; a
warm-up; then at least 10 iterations and about 2 s per case; the median), and prints a markdown
table. The table, with the date, machine, git commit and versions, is written to
`bench/results/<YYYY-MM-DD>-cpu-core.md` (`-cpu-fast.md` when only fused cases ran, e.g.
with the filter `fast_`; those also run as nuvec's compositions, NUVEC_FUSED=0).

Cases run one by one; for each, the three frameworks run back to back, each in its own
process, so thread pools (OpenBLAS's spinning workers, rayon's) never compete and each case's
three numbers see the same machine. With --rounds N the order rotates each round and the
median of the rounds' medians is reported; --wait-idle S waits (up to S seconds) before each
case for other processes to leave the CPUs idle, and the busy fraction seen is recorded. NumPy runs with OPENBLAS_CORETYPE and
OPENBLAS_L2_SIZE unset (they pin an old kernel on this machine's processor and slow it down);
the kernel OpenBLAS then picks is recorded when threadpoolctl is installed.

Usage:
    python3 bench/cpu_vs_peers.py                 # all cases, writes the results file
    python3 bench/cpu_vs_peers.py softmax         # cases whose name contains "softmax"
    python3 bench/cpu_vs_peers.py --no-write      # print only
    python3 bench/cpu_vs_peers.py --rounds 3 --wait-idle 600   # the recorded protocol
Environment: NUVEC_BENCH_SECS (2), NUVEC_BENCH_MIN_ITERS (10), NUVEC_BENCH_MAX_ITERS (1000)
apply to all three frameworks.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# name, kind, work: (FLOPs or bytes moved), unit of the rate.
CASES = [
    ("matmul_f32_1024", "matmul", 2 * 1024**3, "GFLOP/s"),
    ("matmul_f32_2048", "matmul", 2 * 2048**3, "GFLOP/s"),
    ("matmul_bf16_1024", "matmul", 2 * 1024**3, "GFLOP/s"),
    ("add_f32_16M", "map", 3 * 4 * 2**24, "GB/s"),
    ("exp_f32_16M", "map", 2 * 4 * 2**24, "GB/s"),
    ("sum_all_f32_4096x4096", "reduce", 4 * 4096 * 4096, "GB/s"),
    ("sum_last_f32_4096x4096", "reduce", 4 * 4096 * 4096 + 4 * 4096, "GB/s"),
    ("softmax_rows_f32_4096x4096", "map", 2 * 4 * 4096 * 4096, "GB/s"),
    # Fused operations (nuvec::fast), also timed as nuvec's compositions (NUVEC_FUSED=0).
    ("fast_rms_norm_f32_4096x4096", "fast", 2 * 4 * 4096 * 4096, "GB/s"),
    ("fast_rms_norm_bf16_4096x4096", "fast", 2 * 2 * 4096 * 4096, "GB/s"),
    ("fast_layer_norm_f32_4096x4096", "fast", 2 * 4 * 4096 * 4096, "GB/s"),
    ("fast_swiglu_f32_4096x4096", "fast", 3 * 4 * 4096 * 4096, "GB/s"),
    ("fast_rope_f32_1x32x1024x128", "fast", 2 * 4 * 32 * 1024 * 128, "GB/s"),
    ("fast_cross_entropy_f32_1024x32000", "fast", 4 * 1024 * 32000, "GB/s"),
]
NAMES = [c[0] for c in CASES]
KIND = {c[0]: c[1] for c in CASES}


# --------------------------------------------------------------------------- timing (workers)


def _env_num(name: str, default: float) -> float:
    try:
        return float(os.environ[name])
    except (KeyError, ValueError):
        return default


def median_ms(run) -> tuple[float, float, int]:
    """The same method as bench_cpu.rs: warm-up, then >= min iters and ~budget seconds."""
    min_iters = int(_env_num("NUVEC_BENCH_MIN_ITERS", 10))
    budget = _env_num("NUVEC_BENCH_SECS", 2.0)
    max_iters = int(_env_num("NUVEC_BENCH_MAX_ITERS", 1000))
    start = time.perf_counter()
    warm = 0
    while warm < 2 or (time.perf_counter() - start < budget / 10 and warm < 20):
        run()
        warm += 1
    samples = []
    start = time.perf_counter()
    while len(samples) < max_iters and (len(samples) < min_iters or time.perf_counter() - start < budget):
        samples.append(run())
    return statistics.median(samples), min(samples), len(samples)


def mlx_worker(names: list[str]) -> None:
    import mlx.core as mx

    mx.set_default_device(mx.cpu)

    def rnd(shape, lo, hi, seed):
        a = mx.random.uniform(lo, hi, shape, dtype=mx.float32, key=mx.random.key(seed))
        mx.eval(a)
        return a

    def timed(f):
        def run():
            t = time.perf_counter()
            y = f()
            mx.eval(y)
            dt = (time.perf_counter() - t) * 1e3
            del y
            return dt

        return run

    def setup(name):
        if name == "matmul_f32_1024":
            a, b = rnd((1024, 1024), -1, 1, 1), rnd((1024, 1024), -1, 1, 2)
            return lambda: a @ b
        if name == "matmul_f32_2048":
            a, b = rnd((2048, 2048), -1, 1, 3), rnd((2048, 2048), -1, 1, 4)
            return lambda: a @ b
        if name == "matmul_bf16_1024":
            a = rnd((1024, 1024), -1, 1, 5).astype(mx.bfloat16)
            b = rnd((1024, 1024), -1, 1, 6).astype(mx.bfloat16)
            mx.eval(a, b)
            return lambda: a @ b
        if name == "add_f32_16M":
            a, b = rnd((1 << 24,), -1, 1, 7), rnd((1 << 24,), -1, 1, 8)
            return lambda: a + b
        if name == "exp_f32_16M":
            a = rnd((1 << 24,), -4, 4, 9)
            return lambda: mx.exp(a)
        if name == "sum_all_f32_4096x4096":
            a = rnd((4096, 4096), -1, 1, 10)
            return lambda: mx.sum(a)
        if name == "sum_last_f32_4096x4096":
            a = rnd((4096, 4096), -1, 1, 11)
            return lambda: mx.sum(a, axis=-1)
        if name == "softmax_rows_f32_4096x4096":
            a = rnd((4096, 4096), -4, 4, 12)
            return lambda: mx.softmax(a, axis=-1)
        if name.startswith("fast_rms_norm"):
            dt = mx.bfloat16 if "bf16" in name else mx.float32
            x, w = rnd((4096, 4096), -2, 2, 13).astype(dt), rnd((4096,), 0.5, 1.5, 14).astype(dt)
            mx.eval(x, w)
            return lambda: mx.fast.rms_norm(x, w, 1e-5)
        if name == "fast_layer_norm_f32_4096x4096":
            x, w, b = rnd((4096, 4096), -2, 2, 17), rnd((4096,), 0.5, 1.5, 18), rnd((4096,), -1, 1, 19)
            return lambda: mx.fast.layer_norm(x, w, b, 1e-5)
        if name == "fast_swiglu_f32_4096x4096":
            g, u = rnd((4096, 4096), -4, 4, 20), rnd((4096, 4096), -1, 1, 21)
            return lambda: g * mx.sigmoid(g) * u
        if name == "fast_rope_f32_1x32x1024x128":
            x = rnd((1, 32, 1024, 128), -1, 1, 22)
            return lambda: mx.fast.rope(x, 128, traditional=False, base=10000.0, scale=1.0, offset=7)
        if name == "fast_cross_entropy_f32_1024x32000":
            logits = rnd((1024, 32000), -4, 4, 23)
            t = mx.array([(i * 7919) % 32000 for i in range(1024)], dtype=mx.int32)
            mx.eval(t)
            # mlx.nn.losses.cross_entropy without reduction: logsumexp − the target's logit.
            return lambda: mx.logsumexp(logits, axis=-1) - mx.take_along_axis(logits, t[:, None], axis=-1)[:, 0]
        raise KeyError(name)

    for name in names:
        med, mn, n = median_ms(timed(setup(name)))
        print(f"{name}\t{med:.3f}", flush=True)
        print(f"# mlx {name}: median {med:.3f} ms, min {mn:.3f} ms over {n} iterations", file=sys.stderr, flush=True)


def numpy_worker(names: list[str]) -> None:
    import numpy as np

    def rnd(shape, lo, hi, seed):
        return np.random.default_rng(seed).uniform(lo, hi, shape).astype(np.float32)

    def softmax(a):
        e = np.exp(a - a.max(axis=-1, keepdims=True))
        e /= e.sum(axis=-1, keepdims=True)
        return e

    def timed(f):
        def run():
            t = time.perf_counter()
            y = f()
            dt = (time.perf_counter() - t) * 1e3
            del y
            return dt

        return run

    def setup(name):
        if name == "matmul_f32_1024":
            a, b = rnd((1024, 1024), -1, 1, 1), rnd((1024, 1024), -1, 1, 2)
            return lambda: a @ b
        if name == "matmul_f32_2048":
            a, b = rnd((2048, 2048), -1, 1, 3), rnd((2048, 2048), -1, 1, 4)
            return lambda: a @ b
        if name == "matmul_bf16_1024":
            return None  # NumPy has no bfloat16.
        if name == "add_f32_16M":
            a, b = rnd((1 << 24,), -1, 1, 7), rnd((1 << 24,), -1, 1, 8)
            return lambda: a + b
        if name == "exp_f32_16M":
            a = rnd((1 << 24,), -4, 4, 9)
            return lambda: np.exp(a)
        if name == "sum_all_f32_4096x4096":
            a = rnd((4096, 4096), -1, 1, 10)
            return lambda: a.sum()
        if name == "sum_last_f32_4096x4096":
            a = rnd((4096, 4096), -1, 1, 11)
            return lambda: a.sum(axis=-1)
        if name == "softmax_rows_f32_4096x4096":
            a = rnd((4096, 4096), -4, 4, 12)
            return lambda: softmax(a)
        if name == "fast_rms_norm_f32_4096x4096":
            x, w = rnd((4096, 4096), -2, 2, 13), rnd((4096,), 0.5, 1.5, 14)
            return lambda: x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + 1e-5) * w
        if name == "fast_layer_norm_f32_4096x4096":
            x, w, b = rnd((4096, 4096), -2, 2, 17), rnd((4096,), 0.5, 1.5, 18), rnd((4096,), -1, 1, 19)

            def ln():
                c = x - x.mean(axis=-1, keepdims=True)
                return c / np.sqrt((c * c).mean(axis=-1, keepdims=True) + 1e-5) * w + b

            return ln
        if name == "fast_swiglu_f32_4096x4096":
            g, u = rnd((4096, 4096), -4, 4, 20), rnd((4096, 4096), -1, 1, 21)
            return lambda: g / (1 + np.exp(-g)) * u
        if name == "fast_rope_f32_1x32x1024x128":
            x = rnd((1, 32, 1024, 128), -1, 1, 22)

            def rope():
                inv = (10000.0 ** (-np.arange(0, 64, dtype=np.float32) / 64)).astype(np.float32)
                ang = np.arange(7, 7 + 1024, dtype=np.float32)[:, None] * inv[None, :]
                cos, sin = np.cos(ang), np.sin(ang)
                a, b = x[..., :64], x[..., 64:]
                return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)

            return rope
        if name == "fast_cross_entropy_f32_1024x32000":
            logits = rnd((1024, 32000), -4, 4, 23)
            t = np.array([(i * 7919) % 32000 for i in range(1024)])

            def xent():
                m = logits.max(axis=-1, keepdims=True)
                lse = np.log(np.exp(logits - m).sum(axis=-1)) + m[:, 0]
                return lse - logits[np.arange(1024), t]

            return xent
        if name.startswith("fast_"):
            return None  # NumPy has no bfloat16.
        raise KeyError(name)

    try:
        import threadpoolctl

        info = threadpoolctl.threadpool_info()
        print("# blas " + json.dumps(info), file=sys.stderr, flush=True)
    except ImportError:
        pass
    for name in names:
        f = setup(name)
        if f is None:
            print(f"{name}\t-", flush=True)
            continue
        med, mn, n = median_ms(timed(f))
        print(f"{name}\t{med:.3f}", flush=True)
        print(f"# numpy {name}: median {med:.3f} ms, min {mn:.3f} ms over {n} iterations", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- driver


def sh(cmd: list[str], **kw) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT, **kw).stdout.strip()


def parse_tsv(text: str) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for line in text.splitlines():
        if not line or line.startswith("#") or "\t" not in line:
            continue
        name, val = line.split("\t", 1)
        try:
            out[name] = float(val)
        except ValueError:
            out[name] = None
    return out


def run_worker(label: str, cmd: list[str], env: dict[str, str]) -> tuple[dict[str, float | None], str]:
    print(f"== {label}: {' '.join(cmd)}", file=sys.stderr, flush=True)
    p = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sys.stderr.write(p.stderr)
    if p.returncode != 0:
        raise SystemExit(f"{label} failed with exit code {p.returncode}")
    return parse_tsv(p.stdout), p.stderr


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                return " ".join(f for f in ("avx2", "fma", "avx512f", "avx512bw", "avx512_bf16") if f in flags)
    except OSError:
        pass
    return ""


def fmt_ms(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def verdict(r: float | None) -> str:
    if r is None:
        return "—"
    if r <= 1.0:
        return "met (≤ 1.0)"
    if r <= 1.25:
        return "near (≤ 1.25)"
    return "**missed (> 1.25)**"


def cpu_busy(seconds: float = 1.0) -> float:
    """Fraction of all CPUs busy over `seconds` (from /proc/stat); 0 where unreadable."""

    def snap():
        try:
            f = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        except (OSError, ValueError):
            return None
        return sum(f), f[3] + (f[4] if len(f) > 4 else 0)

    a = snap()
    time.sleep(seconds)
    b = snap()
    if a is None or b is None or b[0] == a[0]:
        return 0.0
    return 1.0 - (b[1] - a[1]) / (b[0] - a[0])


def wait_idle(max_wait: float, threshold: float = 0.15) -> float:
    """Waits (up to `max_wait` s) until other processes use under `threshold` of the CPUs;
    returns the last busy fraction seen."""
    deadline = time.time() + max_wait
    busy = cpu_busy()
    while busy >= threshold and time.time() < deadline:
        print(f"== waiting for an idle machine ({busy:.0%} of the CPUs busy)", file=sys.stderr, flush=True)
        time.sleep(5)
        busy = cpu_busy()
    return busy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("filter", nargs="?", default=None, help="only cases whose name contains this")
    ap.add_argument("--worker", choices=["mlx", "numpy"], help=argparse.SUPPRESS)
    ap.add_argument("--no-build", action="store_true", help="use the already built binary")
    ap.add_argument("--no-write", action="store_true", help="print the table only")
    ap.add_argument("--date", default=None, help="date for the results file (default: today)")
    ap.add_argument("--rounds", type=int, default=1, help="rounds per case (the median of their medians is reported)")
    ap.add_argument(
        "--wait-idle",
        type=float,
        default=0,
        metavar="SECONDS",
        help="before each case, wait up to this long for other processes to leave the CPUs idle (< 15%% busy)",
    )
    args = ap.parse_args()

    names = [n for n in NAMES if args.filter is None or args.filter in n]
    if args.worker == "mlx":
        return mlx_worker(names)
    if args.worker == "numpy":
        return numpy_worker(names)
    if not names:
        raise SystemExit(f"no case matches {args.filter!r}")

    if not args.no_build:
        print("== cargo build --release --example bench_cpu -p nuvec", file=sys.stderr, flush=True)
        subprocess.run(["cargo", "build", "--release", "--example", "bench_cpu", "-p", "nuvec"], cwd=ROOT, check=True)
    binary = ROOT / "target" / "release" / "examples" / "bench_cpu"

    base_env = dict(os.environ)
    np_env = {k: v for k, v in base_env.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    workers = [
        ("nuvec", lambda case: [str(binary), case], base_env),
        # The fused cases again as nuvec's compositions of ordinary operations.
        ("composition", lambda case: [str(binary), case], {**base_env, "NUVEC_FUSED": "0"}),
        ("mlx", lambda case: [sys.executable, __file__, "--worker", "mlx", case], base_env),
        ("numpy", lambda case: [sys.executable, __file__, "--worker", "numpy", case], np_env),
    ]
    # Case by case, the three frameworks back to back (in an order that rotates each round), so
    # each case's numbers share the machine's state; each case waits for an idle machine first.
    samples: dict[str, dict[str, list[float]]] = {w[0]: {n: [] for n in names} for w in workers}
    busy_seen: dict[str, float] = {n: 0.0 for n in names}
    np_log = ""
    started = time.time()
    for rnd in range(args.rounds):
        for name in names:
            busy_seen[name] = max(busy_seen[name], wait_idle(args.wait_idle) if args.wait_idle else cpu_busy())
            k = rnd % len(workers)
            for label, cmd, env in workers[k:] + workers[:k]:
                if label == "composition" and KIND[name] != "fast":
                    continue
                got, log = run_worker(label, cmd(name), env)
                if label == "numpy":
                    np_log = log
                if got.get(name) is not None:
                    samples[label][name].append(got[name])
            busy_seen[name] = max(busy_seen[name], cpu_busy())
    elapsed = time.time() - started

    def med(label: str, name: str) -> float | None:
        v = samples[label][name]
        return statistics.median(v) if v else None

    nuvec = {n: med("nuvec", n) for n in names}
    mlx = {n: med("mlx", n) for n in names}
    numpy = {n: med("numpy", n) for n in names}
    comp = {n: med("composition", n) for n in names}

    rows = []
    header = (
        "| case | nuvec ms | MLX ms | NumPy ms | ratio nuvec / faster peer | target (≤ 1.0 goal, none above 1.25) |\n"
        "|---|---:|---:|---:|---:|---|"
    )
    rates = ["| case | work | nuvec | MLX | NumPy | other load seen (CPU busy) |", "|---|---:|---:|---:|---:|---:|"]
    for name, _kind, work, unit in CASES:
        if name not in names:
            continue
        n, m, p = nuvec.get(name), mlx.get(name), numpy.get(name)
        peers = [v for v in (m, p) if v is not None]
        ratio = n / min(peers) if (n is not None and peers) else None
        rows.append(
            f"| {name} | {fmt_ms(n)} | {fmt_ms(m)} | {fmt_ms(p)} | "
            f"{'—' if ratio is None else f'{ratio:.2f}'} | {verdict(ratio)} |"
        )
        wlabel = f"{work / 1e9:.2f} GFLOP" if unit == "GFLOP/s" else f"{work / 2**20:.0f} MiB"

        def rate(v):
            return "—" if v is None else f"{work / (v / 1e3) / 1e9:.1f} {unit}"

        rates.append(f"| {name} | {wlabel} | {rate(n)} | {rate(m)} | {rate(p)} | {busy_seen[name]:.0%} |")
    table = header + "\n" + "\n".join(rows)
    fused = [
        "| case | nuvec fused ms | nuvec composition ms (NUVEC_FUSED=0) | composition / fused |",
        "|---|---:|---:|---:|",
    ]
    for name in names:
        if KIND[name] != "fast":
            continue
        f, c = nuvec.get(name), comp.get(name)
        gain = "—" if (f is None or c is None) else f"{c / f:.2f}"
        fused.append(f"| {name} | {fmt_ms(f)} | {fmt_ms(c)} | {gain} |")
    if len(fused) > 2:
        table += "\n\nThe fused operations against nuvec's own compositions:\n\n" + "\n".join(fused)
    print(table)

    if args.no_write:
        return

    try:
        commit = sh(["git", "rev-parse", "--short", "HEAD"])
        dirty = sh(["git", "status", "--porcelain", "--untracked-files=no"])
        if dirty:
            commit += " (plus uncommitted changes to tracked files)"
    except (subprocess.CalledProcessError, FileNotFoundError):
        commit = "unknown"

    def version(mod: str, cmd: list[str]) -> str:
        try:
            return sh(cmd)
        except Exception:  # noqa: BLE001 - a version we cannot read is reported as such
            return f"{mod}: unknown"

    mlx_v = version("mlx", [sys.executable, "-c", "import mlx.core as mx; print(mx.__version__)"])
    np_v = version("numpy", [sys.executable, "-c", "import numpy as np; print(np.__version__)"])
    rustc_v = version("rustc", ["rustc", "--version"])
    blas = next((l[len("# blas ") :] for l in np_log.splitlines() if l.startswith("# blas ")), None)
    blas_desc = "unknown (threadpoolctl not installed)"
    if blas:
        try:
            b = [x for x in json.loads(blas) if x.get("user_api") == "blas"][0]
            blas_desc = f"{b['internal_api']} {b['version']}, kernel {b['architecture']}, {b['num_threads']} threads"
        except (ValueError, IndexError, KeyError):
            blas_desc = blas

    date = args.date or _dt.date.today().isoformat()
    suite = "fast" if all(KIND[n] == "fast" for n in names) else "core"
    out = ROOT / "bench" / "results" / f"{date}-cpu-{suite}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    title = "fused-op" if suite == "fast" else "core"
    text = f"""# CPU {title} benchmark: nuvec vs MLX (CPU) vs NumPy — {date}

Produced by `python3 bench/cpu_vs_peers.py {" ".join(sys.argv[1:])}` (which builds and runs
`cargo build --release --example bench_cpu -p nuvec`): all three frameworks in one run, case by
case, each framework in its own process, back to back.

- Date: {date} (run took {elapsed:.0f} s, {args.rounds} round(s) per case)
- Machine: {os.cpu_count()} CPUs (nproc {sh(["nproc"])}), {cpu_model()}, flags: {cpu_flags()}; {platform.system()} {platform.release()}
- Other load: CPU busy fraction sampled for 1 s before and after each case (the last column
  of the second table); anything above a few percent means other processes shared the cores.
- Git commit: {commit}
- Versions: {rustc_v}; MLX {mlx_v} (CPU device); NumPy {np_v} (BLAS: {blas_desc}, OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset); Python {platform.python_version()}
- Method: random inputs created and evaluated before timing; each timed iteration records the
  op and evaluates it (`mx.eval` for MLX, `.eval()` for nuvec); warm-up first, then at least
  {int(_env_num("NUVEC_BENCH_MIN_ITERS", 10))} iterations and about {_env_num("NUVEC_BENCH_SECS", 2.0):g} s per case; median in milliseconds (with several
  rounds, the median of the rounds' medians).
  NumPy's softmax is `e = exp(a - max(a, -1)); e /= sum(e, -1)`. NumPy has no bfloat16.
  Fused cases (`fast_*`): MLX runs `mx.fast.rms_norm`, `mx.fast.layer_norm`, `mx.fast.rope`,
  `g * sigmoid(g) * u` and `logsumexp − take_along_axis` (cross entropy without reduction);
  NumPy runs the same formulas in float32 (RoPE's angles computed in each call, as nuvec and
  MLX do). nuvec's compositions run the same binary with `NUVEC_FUSED=0`.

{table}

Achieved rates (matmul: 2·M·N·K FLOPs; others: bytes read + written once, the minimum
traffic; softmax and the norms count one read and one write of the array, SwiGLU two reads
and a write, cross entropy one read of the logits):

{chr(10).join(rates)}
"""
    out.write_text(text)
    print(f"\nwrote {out.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
