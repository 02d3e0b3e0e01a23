#!/usr/bin/env python3
"""PyTorch peers of nuvec's compile benchmark (crates/nuvec/examples/bench_compile.rs).

Times bench_compile's cases on GPU 0, by the same names and byte counts, in two modes (the
prefix of each output line):

* ``torch_eager``: the function as written, one kernel (or more) per operation;
* ``torch_compile``: ``torch.compile(fn)`` in its default mode (Inductor), called once before
  timing so that it compiles, then timed like the eager function; its outputs are compared
  with the eager function's (a ``# torch_compile:<case>: relative error ...`` line on stderr).

The functions mirror bench_compile's operation for operation (Python float scalars, which
PyTorch applies in the tensor's compute type; bfloat16 tensors compute each operation in
float32 and round its result):

* ``chain10_{f32,bf16}_64M``: 64M (2^26) elements, ``y = x * 1.5; y = y + 0.5; y = tanh(y);
  y = y * y; y = y - 0.25; y = y * x; y = y / 3; y = exp(y); y = y * 0.75; y = y + x``;
  bytes: read x, write y.
* ``gelu_tanh_{f32,bf16}_64M``: ``inner = (x + (x * x * x) * 0.044715) * sqrt(2/pi);
  y = (x * 0.5) * (tanh(inner) + 1)``; read x, write y.
* ``softmax_{f32,bf16}_8192x4096``: ``e = exp(x - amax(x, -1, keepdim)); y = e / sum(e, -1,
  keepdim)``; read x, write y.
* ``adam_f32_124M``: 124M (124 * 2^20) elements, one Adam step (step 10, lr 1e-3, betas 0.9,
  0.999, eps 1e-8, no weight decay), functional (new tensors, as nuvec's): ``m = m * 0.9 +
  g * 0.1; v = v * 0.999 + (g * g) * 0.001; mhat = m / (1 - 0.9 ** 10); vhat = v / (1 -
  0.999 ** 10); p = p - (mhat * 1e-3) / (sqrt(vhat) + 1e-8)``; read p, g, m, v, write p, m, v.

Method (as in bench/gpu_peers.py, whose Timer it uses): inputs made before timing (``randn``;
v squared); warm-up iterations; then at least 3 batches (default 5) of ``count`` iterations,
each batch timed with CUDA events around the whole batch, per-iteration time = batch time /
count, median over batches; ``count`` makes a batch last about 100 ms. Inputs smaller than 3x
the L2 cache rotate among copies (both modes the same copies). The copy ceiling
(``torch_eager:ceiling_copy_memcpy``, a 1 GiB ``copy_``, bytes read + written) comes first,
whatever ``--only`` says; each case also times a ``copy_`` that moves its bytes (half read,
half written), ``torch_eager:<case>_copy``, and the fractions of its two modes are of that copy.

Output: on stdout, ``# ...`` comment lines and ``<mode>:<case>\\t<GB/s>\\tGB/s\\t<fraction>``
(``-`` without a ceiling); ``nan`` for a case that failed; progress and errors on stderr.

    python3 bench/compile_peers.py                      # everything
    python3 bench/compile_peers.py --only softmax       # cases whose name contains it
    python3 bench/compile_peers.py --no-compile         # eager only
    python3 bench/compile_peers.py --deadline 300       # end within 300 s

Time: the copies and eager cases run first, then torch.compile case by case; with
``--deadline`` no case starts within 10 s of it and no torch.compile case within 60 s.
"""

import argparse
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_peers import Timer, copy_ceiling_gbs, emit, log, random, rotation_copies, start  # noqa: E402  (the core peers' timing)

SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
ADAM_STEP, ADAM_LR, ADAM_B1, ADAM_B2, ADAM_EPS = 10, 1e-3, 0.9, 0.999, 1e-8
M = 1 << 20  # "M" in case names: 2^20 elements


# --- the functions (bench_compile.rs's, operation for operation) ---------------------------

def chain10(x):
    y = x * 1.5
    y = y + 0.5
    y = torch.tanh(y)
    y = y * y
    y = y - 0.25
    y = y * x
    y = y / 3.0
    y = torch.exp(y)
    y = y * 0.75
    y = y + x
    return (y,)


def gelu_tanh(x):
    inner = (x + (x * x * x) * 0.044715) * SQRT_2_OVER_PI
    return ((x * 0.5) * (torch.tanh(inner) + 1.0),)


def softmax(x):
    e = torch.exp(x - x.amax(-1, keepdim=True))
    s = e.sum(-1, keepdim=True)
    return (e / s,)


def adam(p, g, m, v):
    # The bias corrections in Python floats (f64), applied as float32 scalars.
    c1 = 1 - ADAM_B1 ** ADAM_STEP
    c2 = 1 - ADAM_B2 ** ADAM_STEP
    m = m * ADAM_B1 + g * 0.1
    v = v * ADAM_B2 + (g * g) * 0.001
    mhat = m / c1
    vhat = v / c2
    p = p - (mhat * ADAM_LR) / (torch.sqrt(vhat) + ADAM_EPS)
    return (p, m, v)


# --- cases ---------------------------------------------------------------------------------

class Case:
    """One function, its inputs (``make(j)``: the tensors of rotation copy j) and its bytes."""

    def __init__(self, name, fn, make, input_bytes, nbytes):
        self.name, self.fn, self.make = name, fn, make
        self.input_bytes, self.bytes = input_bytes, nbytes


def build_cases():
    cases = []
    n = 64 * M
    for base, fn in (("chain10", chain10), ("gelu_tanh", gelu_tanh)):
        for dtype, tag in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
            size = torch.tensor([], dtype=dtype).element_size()
            cases.append(Case(f"{base}_{tag}_64M", fn, lambda j, dtype=dtype: (random((n,), dtype, 10 + 101 * j),),
                              n * size, 2 * n * size))
    rows, cols = 8192, 4096
    for dtype, tag in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
        size = torch.tensor([], dtype=dtype).element_size()
        cases.append(Case(f"softmax_{tag}_{rows}x{cols}", softmax,
                          lambda j, dtype=dtype: (random((rows, cols), dtype, 10 + 101 * j),),
                          rows * cols * size, 2 * rows * cols * size))
    na = 124 * M

    def adam_inputs(j):
        s = 20 + 101 * j
        p = random((na,), torch.float32, s)
        g = random((na,), torch.float32, s + 1) * 0.01
        m = random((na,), torch.float32, s + 2) * 0.001
        v = random((na,), torch.float32, s + 3).square() * 1e-4  # a second moment is not negative
        return (p, g, m, v)

    cases.append(Case("adam_f32_124M", adam, adam_inputs, 4 * na * 4, 7 * na * 4))
    return cases


def relative_error(got, want):
    g, w = got.float(), want.float()
    den = w.square().sum().item()
    num = (g - w).square().sum().item()
    return math.sqrt(num / den) if den > 0 else math.sqrt(num)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default=None, help="run cases whose name contains this")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--deadline", type=float, default=float(os.environ.get("GPU_COMPILE_PEERS_DEADLINE", "inf")),
                    help="seconds from the start within which to end: no case starts in its last 10 s, "
                         "no torch.compile case in its last 60 s")
    ap.add_argument("--batch-ms", type=float, default=100.0)
    ap.add_argument("--batches", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()

    l2 = start(show_triton=True)
    if l2 is None:
        return 0
    t0 = time.time()
    timer = Timer(args.batch_ms, args.batches, args.warmup)

    def copies(input_bytes):
        return rotation_copies(l2, input_bytes)

    def left():
        return args.deadline - (time.time() - t0)

    def report(mode, name, value, ceiling):
        frac = f"{value / ceiling:.4f}" if ceiling and math.isfinite(value) and math.isfinite(ceiling) else "-"
        emit(f"{mode}:{name}\t{value:.4f}\tGB/s\t{frac}")

    def sync_after(what):
        try:
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001  (a broken context fails every later case too; say so once)
            log(f"# synchronize after {what} FAILED: {type(e).__name__}")
        torch.cuda.empty_cache()

    copy_gbs = float("nan")
    try:
        copy_gbs = copy_ceiling_gbs(timer)
    except Exception as e:  # noqa: BLE001
        log(f"# ceiling FAILED: {type(e).__name__}: {e}")
    report("torch_eager", "ceiling_copy_memcpy", copy_gbs, copy_gbs)
    torch.cuda.empty_cache()

    cases = [c for c in build_cases() if args.only is None or args.only in c.name]
    case_copy = {}  # name -> GB/s of the copy of its bytes

    def time_mode(mode, case, fn):
        """Times ``fn`` over the case's inputs and reports it; the inputs go when it returns."""
        t_start = time.time()
        prefix = f"torch_{mode}"
        try:
            k = copies(case.input_bytes)
            ins = [case.make(j) for j in range(k)]
            torch.cuda.synchronize()
            if mode == "compile":
                # The first call compiles (not timed); its outputs are checked against eager's.
                got = fn(*ins[0])
                want = case.fn(*ins[0])
                errs = [relative_error(a, b) for a, b in zip(got, want)]
                log(f"# {prefix}:{case.name}: relative error to eager "
                    f"{' '.join(f'{e:.2e}' for e in errs)}; compiled in {time.time() - t_start:.1f} s")
                if any(math.isnan(e) for e in errs):
                    raise RuntimeError("NaN in the compiled outputs")
                del got, want
            med, lo, hi, count = timer.time(lambda i: fn(*ins[i % k]))
            report(prefix, case.name, case.bytes / med / 1e9, case_copy.get(case.name, copy_gbs))
            log(f"# {prefix}:{case.name}: median {med * 1e3:.4f} ms (min {lo * 1e3:.4f}, max {hi * 1e3:.4f}; "
                f"{timer.batches}x{count}, k={k}) {time.time() - t_start:.1f} s")
        except Exception as e:  # noqa: BLE001  (report and go on)
            report(prefix, case.name, float("nan"), None)
            first = str(e).splitlines()[0] if str(e) else ""
            log(f"# {prefix}:{case.name} FAILED: {type(e).__name__}: {first[:200]}")
        sync_after(f"{prefix}:{case.name}")

    for case in cases:
        if left() < 10:
            emit(f"# {case.name} and later skipped (deadline)")
            break
        # The same-size copy: half the case's bytes read, half written.
        try:
            n = case.bytes // 2 // 4
            bufs = [random((n,), torch.float32, 1), torch.empty((n,), device="cuda", dtype=torch.float32)]
            med = timer.time(lambda i: bufs[1].copy_(bufs[0]))[0]
            case_copy[case.name] = 2 * 4 * n / med / 1e9
            report("torch_eager", case.name + "_copy", case_copy[case.name], copy_gbs)
            del bufs
        except Exception as e:  # noqa: BLE001
            report("torch_eager", case.name + "_copy", float("nan"), None)
            log(f"# torch_eager:{case.name}_copy FAILED: {type(e).__name__}: {e}")
        sync_after(f"{case.name}_copy")
        time_mode("eager", case, case.fn)

    if not args.no_compile:
        for case in cases:
            if left() < 60:
                emit(f"# torch_compile:{case.name} and later skipped (deadline)")
                break
            try:
                fn = torch.compile(case.fn)
            except Exception as e:  # noqa: BLE001
                report("torch_compile", case.name, float("nan"), None)
                log(f"# torch_compile:{case.name} FAILED: {type(e).__name__}: {e}")
                continue
            time_mode("compile", case, fn)
    return 0


if __name__ == "__main__":
    sys.exit(main())
