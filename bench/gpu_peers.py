#!/usr/bin/env python3
"""PyTorch peers of nuvec's GPU benchmark (crates/nuvec/examples/bench_gpu.rs).

Times the same cases as bench_gpu on GPU 0 with PyTorch eager and ``torch.compile``:

* ceilings: ``y.copy_(x)`` of a 1 GiB f32 array (bytes read + written), ``x * 1`` and
  ``torch.cat`` of the two halves (informational), and the bf16 8192^3 matmul rate;
* element-wise ``a + b`` and ``a * b``, f32 and bf16, 64M and 256M elements;
* row reductions ``sum``, ``amax`` and ``logsumexp`` over the last axis of [16384, 4096] and
  [4096, 16384], f32 and bf16;
* bf16 matmul 4096^3 and 8192^3 (TFLOP/s);
* decode GEMV ``x[1, 4096] @ W[4096, 14336]`` and ``x @ W2[14336, 4096].t()``, bf16;
* eager only: per-op time of a chain of 1000 tiny element-wise ops on a [16] f32 tensor.

Method (as in bench_gpu): random inputs made before timing; warm-up iterations (for
torch.compile the first call compiles); then at least 3 batches (default 5) of ``count``
iterations, each batch timed with CUDA events around the whole batch, per-iteration time =
batch time / count, median over batches. ``count`` makes a batch last about 100 ms. Inputs
smaller than 3x the L2 cache (at least 60 MB assumed) rotate among copies.

Output: on stdout, ``# ...`` comment lines and one line per case
``torch_eager:<case>\\t<value>\\t<unit>\\t<fraction>`` (or ``torch_compile:``), the fraction
being against torch's own copy ceiling (GB/s) or its eager 8192^3 matmul rate (TFLOP/s);
progress and errors on stderr. A case that fails prints ``nan``.

    python3 bench/gpu_peers.py                     # everything
    python3 bench/gpu_peers.py --only gemv         # cases whose name contains "gemv"
    python3 bench/gpu_peers.py --no-compile        # eager only
    python3 bench/gpu_peers.py --budget 150        # stop starting torch.compile cases after 150 s
"""

import argparse
import math
import os
import statistics
import sys
import time

import torch

L2_FLOOR = 60 * 1000 * 1000
OPS = 1000


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def emit(line):
    print(line, flush=True)


def start(show_triton=False):
    """Prints the device banner the peers scripts begin with; returns the L2 size (at least
    L2_FLOOR) that input rotation is planned from, or None when torch sees no CUDA device."""
    if not torch.cuda.is_available():
        emit("# torch sees no CUDA device")
        return None
    props = torch.cuda.get_device_properties(0)
    emit(f"# torch {torch.__version__} (CUDA {torch.version.cuda}), {props.name}, "
         f"{props.multi_processor_count} SMs, L2 {getattr(props, 'L2_cache_size', 0) / 1e6:.1f} MB")
    if show_triton:
        try:
            import triton
            emit(f"# triton {triton.__version__}")
        except Exception as e:  # noqa: BLE001
            emit(f"# triton: {type(e).__name__}")
    return max(getattr(props, "L2_cache_size", 0), L2_FLOOR)


def rotation_copies(l2, input_bytes):
    """Copies of an input set to rotate through so that together they exceed 3x the L2."""
    return max(1, min(8, math.ceil(3 * l2 / max(1, input_bytes))))


class Timer:
    def __init__(self, batch_ms, batches, warmup):
        self.batch_ms = batch_ms
        self.batches = max(3, batches)
        self.warmup = max(1, warmup)

    def time(self, run):
        """Median seconds per iteration of ``run(i)``."""
        i = 0
        for _ in range(self.warmup):
            run(i)
            i += 1
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        probe = 2
        start.record()
        for _ in range(probe):
            run(i)
            i += 1
        end.record()
        end.synchronize()
        each_ms = start.elapsed_time(end) / probe
        count = int(min(5000, max(3, self.batch_ms / max(each_ms, 1e-4))))
        per = []
        for _ in range(self.batches):
            start.record()
            for _ in range(count):
                run(i)
                i += 1
            end.record()
            end.synchronize()
            per.append(start.elapsed_time(end) / 1e3 / count)
        return statistics.median(per), min(per), max(per), count


def copy_ceiling_gbs(timer):
    """torch's copy ceiling: ``y.copy_(x)`` of a 1 GiB f32 array, bytes read + written, GB/s."""
    n = 1 << 28
    src = torch.empty((n,), device="cuda", dtype=torch.float32).normal_()
    bufs = [src, torch.empty_like(src)]
    del src
    med = timer.time(lambda i: bufs[1].copy_(bufs[0]))[0]
    bufs.clear()
    torch.cuda.empty_cache()
    return 2 * 4 * n / med / 1e9


def random(shape, dtype, seed):
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return torch.randn(shape, device="cuda", dtype=torch.float32, generator=g).to(dtype)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default=None, help="run cases whose name contains this")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--budget", type=float, default=float(os.environ.get("GPU_PEERS_BUDGET", "170")),
                    help="seconds after which no new torch.compile case starts")
    ap.add_argument("--batch-ms", type=float, default=100.0)
    ap.add_argument("--batches", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()

    l2 = start()
    if l2 is None:
        return 0
    t0 = time.time()
    timer = Timer(args.batch_ms, args.batches, args.warmup)

    def copies(input_bytes):
        return rotation_copies(l2, input_bytes)

    def wanted(name):
        return args.only is None or args.only in name

    # Each case: (name, unit, amount per iteration (bytes or flops), make) where make() returns
    # (fn, inputs, k): iteration i calls fn(*inputs[i % k]). ``eager_only`` cases skip compile.
    cases = []

    def case(name, unit, amount, eager_only=False):
        def deco(make):
            cases.append((name, unit, amount, make, eager_only))
            return make
        return deco

    n = 1 << 28
    copy_bytes = 2 * 4 * n

    @case("ceiling_copy_memcpy", "GB/s", copy_bytes, eager_only=True)
    def _():
        x = random((n,), torch.float32, 1)
        y = torch.empty_like(x)
        return (lambda a, b: b.copy_(a)), [(x, y)], 1

    @case("copy_proxy_mul1_f32_256M", "GB/s", copy_bytes)
    def _():
        return (lambda a: a * 1.0), [(random((n,), torch.float32, 1),)], 1

    @case("copy_concat_f32_256M", "GB/s", copy_bytes)
    def _():
        x = random((n,), torch.float32, 1)
        return (lambda a, b: torch.cat([a, b], 0)), [(x[: n // 2], x[n // 2:])], 1

    def matmul_case(size):
        @case(f"matmul_bf16_{size}", "TFLOP/s", 2.0 * size ** 3)
        def _():
            k = copies(2 * 2 * size * size)
            ins = [(random((size, size), torch.bfloat16, 10 + j), random((size, size), torch.bfloat16, 20 + j))
                   for j in range(k)]
            return (lambda a, b: a @ b), ins, k

    matmul_case(8192)

    for count, tag in ((1 << 26, "64M"), (1 << 28, "256M")):
        for dtype, dname in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
            size = torch.tensor([], dtype=dtype).element_size()
            for op, fn in (("add", lambda a, b: a + b), ("mul", lambda a, b: a * b)):
                def make(count=count, dtype=dtype, size=size, fn=fn):
                    k = copies(2 * count * size)
                    return fn, [(random((count,), dtype, 30 + j), random((count,), dtype, 40 + j)) for j in range(k)], k
                case(f"{op}_{dname}_{tag}", "GB/s", 3 * count * size)(make)

    for rows, cols in ((16384, 4096), (4096, 16384)):
        for dtype, dname in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
            size = torch.tensor([], dtype=dtype).element_size()
            for op, fn in (("sum", lambda a: a.sum(-1)), ("max", lambda a: a.amax(-1)),
                           ("logsumexp", lambda a: torch.logsumexp(a, -1))):
                def make(rows=rows, cols=cols, dtype=dtype, size=size, fn=fn):
                    k = copies(rows * cols * size)
                    return fn, [(random((rows, cols), dtype, 50 + j),) for j in range(k)], k
                case(f"{op}_rows_{dname}_{rows}x{cols}", "GB/s", (rows * cols + rows) * size)(make)

    matmul_case(4096)

    kd, nd = 4096, 14336
    gemv_bytes = kd * nd * 2 + 2 * (kd + nd)  # W, x and the output, bf16

    @case("gemv_bf16_4096x14336", "GB/s", gemv_bytes)
    def _():
        k = copies(kd * nd * 2)
        x = random((1, kd), torch.bfloat16, 60)
        return (lambda a, w: a @ w), [(x, random((kd, nd), torch.bfloat16, 70 + j)) for j in range(k)], k

    @case("gemv_bf16_4096x14336_wt", "GB/s", gemv_bytes)
    def _():
        k = copies(kd * nd * 2)
        x = random((1, kd), torch.bfloat16, 60)
        return (lambda a, w: a @ w.t()), [(x, random((nd, kd), torch.bfloat16, 80 + j)) for j in range(k)], k

    results = {}

    def report(mode, name, unit, value):
        results[(mode, name)] = value  # first, so a ceiling's own fraction reads 1
        ceiling = results.get(("torch_eager", "ceiling_copy_memcpy" if unit == "GB/s" else "matmul_bf16_8192"))
        frac = f"{value / ceiling:.4f}" if ceiling and math.isfinite(value) and ceiling > 0 else "-"
        emit(f"{mode}:{name}\t{value:.4f}\t{unit}\t{frac}")

    def run_case(mode, name, unit, amount, make):
        try:
            fn, ins, k = make()
            if mode == "torch_compile":
                torch._dynamo.reset()
                fn = torch.compile(fn, dynamic=False)
            t_start = time.time()
            med, lo, hi, count = timer.time(lambda i: fn(*ins[i % k]))
            value = amount / med / (1e9 if unit == "GB/s" else 1e12)
            report(mode, name, unit, value)
            log(f"# {mode}:{name}: median {med * 1e3:.4f} ms (min {lo * 1e3:.4f}, max {hi * 1e3:.4f}; "
                f"{timer.batches}x{count}, k={k}) {time.time() - t_start:.1f} s")
        except Exception as e:  # report and go on
            report(mode, name, unit, float("nan"))
            log(f"# {mode}:{name} FAILED: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        finally:
            torch.cuda.empty_cache()

    for name, unit, amount, make, _eager_only in cases:
        if wanted(name):
            run_case("torch_eager", name, unit, amount, make)

    if wanted("overhead_record_eval_1000x16"):
        try:
            x = random((16,), torch.float32, 90)
            a = random((16,), torch.float32, 91) * 0.05 + 0.95
            c = random((16,), torch.float32, 92) * 0.1

            def chain(_i):
                y = x
                for j in range(OPS):
                    y = y * a if j % 2 == 0 else y + c
                return y

            med, lo, hi, count = Timer(args.batch_ms, args.batches, 1).time(chain)
            emit(f"torch_eager:overhead_record_eval_1000x16\t{med * 1e6 / OPS:.4f}\tus/op\t-")
            log(f"# torch_eager:overhead: median {med * 1e3:.3f} ms per chain ({count} chains per batch)")
        except Exception as e:
            emit("torch_eager:overhead_record_eval_1000x16\tnan\tus/op\t-")
            log(f"# overhead FAILED: {e}")

    if not args.no_compile:
        for name, unit, amount, make, eager_only in cases:
            if eager_only or not wanted(name):
                continue
            if time.time() - t0 > args.budget:
                log(f"# torch_compile:{name} skipped: past the {args.budget:.0f} s budget")
                emit(f"# torch_compile:{name} skipped (time budget)")
                continue
            run_case("torch_compile", name, unit, amount, make)
    emit(f"# total {time.time() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
