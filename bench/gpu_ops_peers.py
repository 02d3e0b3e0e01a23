#!/usr/bin/env python3
"""PyTorch eager peers of nuvec's per-primitive GPU benchmark (crates/nuvec/examples/bench_ops.rs).

Times every case of bench_ops on GPU 0 with PyTorch eager (no torch.compile), with the same case
names, the same byte counts and the same inputs (the harness's pseudo-random formula,
``sin(0.37 i + s) * 0.75 + cos(0.0113 i + 2 s) * 0.25`` with ``s = 1.618 seed``, cast to the
dtype), in float32, bfloat16 and float16 on 64M elements ([8192, 8192]):

* ``ceiling_copy_memcpy``: ``y.copy_(x)`` of a 1 GiB f32 tensor (bytes read + written); every
  fraction is against it;
* unary ``<op>_<dtype>_contig``: abs, sign, neg, square, floor, ceil, round, exp, expm1, log,
  log1p, log2, log10, sqrt, rsqrt, reciprocal, sin, cos, tan, asin, acos, atan, sinh, cosh,
  tanh, asinh, acosh, atanh, sigmoid, erf, erfinv, logical_not under MLX's names;
* binary ``<op>_<dtype>_contig``: add, sub, mul, div, floor_divide, remainder, pow, maximum,
  minimum, logaddexp, atan2, eq, ne, lt, le, gt, ge, logical_and, logical_or;
* layouts of add and mul: ``_row`` (``x + y[8192, 1]``), ``_col`` (``x + y[1, 8192]``),
  ``_scalar`` (``x + 0.5``, ``x * 1.5``), ``_transposed`` (``x.t() + y``), ``_sliced``
  (``x[:, ::2] + y``, x [8192, 16384]), ``_mixed`` (bf16/f16 ``x`` + f32 ``y``);
* ``where_<dtype>_contig`` / ``_row``: ``torch.where(c, a, b)``, c bool [8192, 8192] or [8192, 1];
* ``cast_<from>_to_<to>_contig`` / ``_transposed``: ``x.to(d)`` and ``x.t().to(d)`` for every
  ordered pair of f32, bf16, f16, and bool to f32;
* reductions ``<op>_<dtype>_rows`` / ``_cols`` (over dim -1 / dim 0): sum, amax, mean, argmax,
  logsumexp; ``sum_<dtype>_all``: ``x.sum()``;
* copies: ``concat_<dtype>_axis0`` / ``_axis1`` (``torch.cat`` of two halves),
  ``contiguous_<dtype>_transposed`` (``x.t().contiguous()``), ``broadcast_<dtype>_row`` / ``_col``
  (``y.expand(8192, 8192).contiguous()``).

Inputs are moved into each op's domain as in bench_ops (``|x| + 0.5`` for log-, sqrt- and
reciprocal-like ops, the divisor of divide/floor_divide/remainder and the base of power; ``x / 2``
for asin, acos, atanh, erfinv; ``|x| + 1`` for acosh). Bytes count every distinct element read
once plus the output written once (bool 1 byte; argmax's output counts 4 bytes per index, as
nuvec's uint32, though torch writes int64), exactly as bench_ops does.

Method (as bench_ops's harness): inputs made before timing; warm-up iterations; then at least 3
batches (default 5) of ``count`` iterations, each batch timed with CUDA events around the whole
batch, per-iteration time = batch time / count, median over batches; ``count`` makes a batch last
about 100 ms. Inputs of one [8192, 8192] operand smaller than 3x the L2 cache (at least 60 MiB
assumed) rotate among copies.

Output: on stdout, ``# ...`` comment lines and one line per case
``torch_eager:<case>\\t<value>\\tGB/s\\t<fraction>``, the fraction against torch's own copy
ceiling; progress and errors on stderr. A case that fails prints ``nan``.

    python3 bench/gpu_ops_peers.py                    # everything (~3 min)
    python3 bench/gpu_ops_peers.py --only _bf16_      # cases whose name contains "_bf16_"
    python3 bench/gpu_ops_peers.py --deadline 250     # start no case after 250 s
"""

import argparse
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_peers import L2_FLOOR, Timer, copy_ceiling_gbs, emit, log  # noqa: E402  (the core peers' timing)

R, C = 8192, 8192
N = R * C
DTYPES = (("f32", torch.float32, 4), ("bf16", torch.bfloat16, 2), ("f16", torch.float16, 2))


def random(shape, dtype, seed):
    """The nuvec harness's ``random``: computed in float32 on the GPU, then cast."""
    n = math.prod(shape)
    i = torch.arange(n, device="cuda", dtype=torch.float32)
    s = seed * 1.618
    v = torch.sin(i * 0.37 + s) * 0.75 + torch.cos(i * 0.0113 + 2.0 * s) * 0.25
    del i
    return v.reshape(shape).to(dtype)


def randoms(k, shape, dtype, seed):
    return [random(shape, dtype, seed + 101 * j) for j in range(k)]


# Input domains, as bench_ops's ``Domain``.
def as_is(x):
    return x


def positive(x):
    return x.abs() + 0.5


def half(x):
    return x * 0.5


def at_least_one(x):
    return x.abs() + 1.0


# MLX's name -> (torch function, input domain); bench_ops's unary list, in UnaryOp::ALL order.
UNARY = (
    ("abs", torch.abs, as_is),
    ("sign", torch.sign, as_is),
    ("negative", torch.neg, as_is),
    ("square", torch.square, as_is),
    ("floor", torch.floor, as_is),
    ("ceil", torch.ceil, as_is),
    ("round", torch.round, as_is),
    ("exp", torch.exp, as_is),
    ("expm1", torch.expm1, as_is),
    ("log", torch.log, positive),
    ("log1p", torch.log1p, positive),
    ("log2", torch.log2, positive),
    ("log10", torch.log10, positive),
    ("sqrt", torch.sqrt, positive),
    ("rsqrt", torch.rsqrt, positive),
    ("reciprocal", torch.reciprocal, positive),
    ("sin", torch.sin, as_is),
    ("cos", torch.cos, as_is),
    ("tan", torch.tan, as_is),
    ("arcsin", torch.asin, half),
    ("arccos", torch.acos, half),
    ("arctan", torch.atan, as_is),
    ("sinh", torch.sinh, as_is),
    ("cosh", torch.cosh, as_is),
    ("tanh", torch.tanh, as_is),
    ("arcsinh", torch.asinh, as_is),
    ("arccosh", torch.acosh, at_least_one),
    ("arctanh", torch.atanh, half),
    ("sigmoid", torch.sigmoid, as_is),
    ("erf", torch.erf, as_is),
    ("erfinv", torch.erfinv, half),
    ("logical_not", torch.logical_not, as_is),
)
UNARY_BOOL_OUT = {"logical_not"}

# MLX's name -> (torch function, x domain, y domain); in BinaryOp::ALL order.
BINARY = (
    ("add", torch.add, as_is, as_is),
    ("subtract", torch.sub, as_is, as_is),
    ("multiply", torch.mul, as_is, as_is),
    ("divide", torch.div, as_is, positive),
    ("floor_divide", torch.floor_divide, as_is, positive),
    ("remainder", torch.remainder, as_is, positive),
    ("power", torch.pow, positive, as_is),
    ("maximum", torch.maximum, as_is, as_is),
    ("minimum", torch.minimum, as_is, as_is),
    ("logaddexp", torch.logaddexp, as_is, as_is),
    ("arctan2", torch.atan2, as_is, as_is),
    ("equal", torch.eq, as_is, as_is),
    ("not_equal", torch.ne, as_is, as_is),
    ("less", torch.lt, as_is, as_is),
    ("less_equal", torch.le, as_is, as_is),
    ("greater", torch.gt, as_is, as_is),
    ("greater_equal", torch.ge, as_is, as_is),
    ("logical_and", torch.logical_and, as_is, as_is),
    ("logical_or", torch.logical_or, as_is, as_is),
)
BINARY_BOOL_OUT = {"equal", "not_equal", "less", "less_equal", "greater", "greater_equal", "logical_and",
                   "logical_or"}


def build_cases(copies):
    """Every case, in bench_ops's order: (name, bytes, make); make() returns (fn, operand lists)
    and iteration i calls fn on element i % len of each list."""
    cases = []

    def case(name, nbytes, make):
        cases.append((name, nbytes, make))

    def pool(k, shape, dtype, seed, domain=as_is):
        return [domain(x) for x in randoms(k, shape, dtype, seed)]

    def conds(k, shape):
        return [x > 0 for x in randoms(k, shape, torch.float32, 700)]

    # Unary, contiguous.
    for dname, dtype, size in DTYPES:
        for op, fn, dom in UNARY:
            out = 1 if op in UNARY_BOOL_OUT else size

            def make(dtype=dtype, size=size, fn=fn, dom=dom):
                return fn, [pool(copies(N * size), (R, C), dtype, 100, dom)]
            case(f"{op}_{dname}_contig", N * (size + out), make)

    # Binary, contiguous.
    for dname, dtype, size in DTYPES:
        for op, fn, dx, dy in BINARY:
            out = 1 if op in BINARY_BOOL_OUT else size

            def make(dtype=dtype, size=size, fn=fn, dx=dx, dy=dy):
                k = copies(N * size)
                return fn, [pool(k, (R, C), dtype, 100, dx), pool(k, (R, C), dtype, 200, dy)]
            case(f"{op}_{dname}_contig", N * (2 * size + out), make)

    # Layouts of add and multiply.
    layout_ops = (("add", torch.add, lambda a: a + 0.5), ("multiply", torch.mul, lambda a: a * 1.5))
    for dname, dtype, size in DTYPES:
        k, small = copies(N * size), copies(R * size)
        bcast = 2 * N * size + R * size
        for op, fn, fs in layout_ops:
            case(f"{op}_{dname}_row", bcast,
                 lambda dtype=dtype, fn=fn, k=k, small=small:
                 (fn, [randoms(k, (R, C), dtype, 100), randoms(small, (R, 1), dtype, 300)]))
            case(f"{op}_{dname}_col", bcast,
                 lambda dtype=dtype, fn=fn, k=k, small=small:
                 (fn, [randoms(k, (R, C), dtype, 100), randoms(small, (1, C), dtype, 400)]))
            case(f"{op}_{dname}_scalar", 2 * N * size,
                 lambda dtype=dtype, fs=fs, k=k: (fs, [randoms(k, (R, C), dtype, 100)]))
            case(f"{op}_{dname}_transposed", 3 * N * size,
                 lambda dtype=dtype, fn=fn, k=k:
                 (lambda a, b, fn=fn: fn(a.t(), b),
                  [randoms(k, (R, C), dtype, 100), randoms(k, (R, C), dtype, 200)]))
            case(f"{op}_{dname}_sliced", 3 * N * size,
                 lambda dtype=dtype, fn=fn, k=k, size=size:
                 (lambda a, b, fn=fn: fn(a[:, ::2], b),
                  [randoms(copies(2 * N * size), (R, 2 * C), dtype, 500), randoms(k, (R, C), dtype, 200)]))
            if dtype != torch.float32:
                case(f"{op}_{dname}_mixed", N * (size + 4 + 4),
                     lambda dtype=dtype, fn=fn, k=k:
                     (fn, [randoms(k, (R, C), dtype, 100), randoms(copies(N * 4), (R, C), torch.float32, 600)]))

    # Ternary.
    for dname, dtype, size in DTYPES:
        k = copies(N * size)
        case(f"where_{dname}_contig", N + 3 * N * size,
             lambda dtype=dtype, k=k: (torch.where, [conds(copies(N), (R, C)), randoms(k, (R, C), dtype, 100),
                                                     randoms(k, (R, C), dtype, 200)]))
        case(f"where_{dname}_row", R + 3 * N * size,
             lambda dtype=dtype, k=k: (torch.where, [conds(copies(R), (R, 1)), randoms(k, (R, C), dtype, 100),
                                                     randoms(k, (R, C), dtype, 200)]))

    # Casts.
    pairs = [(f, fd, fs, t, td, ts) for f, fd, fs in DTYPES for t, td, ts in DTYPES if f != t]
    pairs.append(("bool", torch.bool, 1, "f32", torch.float32, 4))
    for fname, fdt, fsize, tname, tdt, tsize in pairs:
        def inputs(fdt=fdt, fsize=fsize):
            k = copies(N * fsize)
            return conds(k, (R, C)) if fdt == torch.bool else randoms(k, (R, C), fdt, 100)
        nbytes = N * (fsize + tsize)
        case(f"cast_{fname}_to_{tname}_contig", nbytes,
             lambda inputs=inputs, tdt=tdt: (lambda a, tdt=tdt: a.to(tdt), [inputs()]))
        case(f"cast_{fname}_to_{tname}_transposed", nbytes,
             lambda inputs=inputs, tdt=tdt: (lambda a, tdt=tdt: a.t().to(tdt), [inputs()]))

    # Reductions.
    reduce_ops = (
        ("sum", lambda x: x.sum(-1), lambda x: x.sum(0), None),
        ("max", lambda x: x.amax(-1), lambda x: x.amax(0), None),
        ("mean", lambda x: x.mean(-1), lambda x: x.mean(0), None),
        ("argmax", lambda x: x.argmax(-1), lambda x: x.argmax(0), 4),
        ("logsumexp", lambda x: torch.logsumexp(x, -1), lambda x: torch.logsumexp(x, 0), None),
    )
    for dname, dtype, size in DTYPES:
        def xs(dtype=dtype, size=size):
            return [randoms(copies(N * size), (R, C), dtype, 100)]
        for op, rows, cols, out in reduce_ops:
            out = out or size
            case(f"{op}_{dname}_rows", N * size + R * out, lambda xs=xs, rows=rows: (rows, xs()))
            case(f"{op}_{dname}_cols", N * size + C * out, lambda xs=xs, cols=cols: (cols, xs()))
        case(f"sum_{dname}_all", N * size + size, lambda xs=xs: (lambda a: a.sum(), xs()))

    # Copies.
    for dname, dtype, size in DTYPES:
        k = copies(N * size)
        small = copies(R * size)
        case(f"concat_{dname}_axis0", 2 * N * size,
             lambda dtype=dtype, k=k: (lambda a, b: torch.cat([a, b], 0),
                                       [randoms(k, (R // 2, C), dtype, 100), randoms(k, (R // 2, C), dtype, 200)]))
        case(f"concat_{dname}_axis1", 2 * N * size,
             lambda dtype=dtype, k=k: (lambda a, b: torch.cat([a, b], 1),
                                       [randoms(k, (R, C // 2), dtype, 100), randoms(k, (R, C // 2), dtype, 200)]))
        case(f"contiguous_{dname}_transposed", 2 * N * size,
             lambda dtype=dtype, k=k: (lambda a: a.t().contiguous(), [randoms(k, (R, C), dtype, 300)]))
        case(f"broadcast_{dname}_row", N * size + R * size,
             lambda dtype=dtype, small=small: (lambda a: a.expand(R, C).contiguous(),
                                               [randoms(small, (R, 1), dtype, 400)]))
        case(f"broadcast_{dname}_col", N * size + C * size,
             lambda dtype=dtype, small=small: (lambda a: a.expand(R, C).contiguous(),
                                               [randoms(small, (1, C), dtype, 500)]))
    return cases


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default=None, help="run cases whose name contains this")
    ap.add_argument("--deadline", type=float, default=float(os.environ.get("GPU_OPS_PEERS_DEADLINE", "inf")),
                    help="seconds from the start after which no case starts")
    ap.add_argument("--list", action="store_true", help="print the case names and bytes, run nothing")
    ap.add_argument("--batch-ms", type=float, default=float(os.environ.get("NUVEC_BENCH_BATCH_MS", "100")))
    ap.add_argument("--batches", type=int, default=int(os.environ.get("NUVEC_BENCH_BATCHES", "5")))
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()

    if args.list:
        for name, nbytes, _ in build_cases(lambda b: 1):
            if args.only is None or args.only in name:
                emit(f"{name}\t{nbytes}")
        return 0
    if not torch.cuda.is_available():
        emit("# torch sees no CUDA device")
        return 0
    t0 = time.time()
    props = torch.cuda.get_device_properties(0)
    l2 = max(getattr(props, "L2_cache_size", 0), L2_FLOOR)
    emit(f"# torch {torch.__version__} (CUDA {torch.version.cuda}), {props.name}, "
         f"{props.multi_processor_count} SMs, L2 {getattr(props, 'L2_cache_size', 0) / 1e6:.1f} MB")
    timer = Timer(args.batch_ms, args.batches, args.warmup)

    def copies(input_bytes):
        return max(1, min(8, math.ceil(3 * l2 / max(1, input_bytes))))

    copy_gbs = None

    def report(name, value):
        frac = f"{value / copy_gbs:.4f}" if copy_gbs and math.isfinite(value) else "-"
        emit(f"torch_eager:{name}\t{value:.4f}\tGB/s\t{frac}")

    # The copy ceiling first, whatever --only says: every fraction is against it.
    try:
        copy_gbs = copy_ceiling_gbs(timer)
        report("ceiling_copy_memcpy", copy_gbs)
    except Exception as e:
        report("ceiling_copy_memcpy", float("nan"))
        log(f"# ceiling FAILED: {type(e).__name__}: {e}")

    done = 0
    for name, nbytes, make in build_cases(copies):
        if args.only is not None and args.only not in name:
            continue
        if time.time() - t0 > args.deadline:
            emit(f"# torch_eager:{name} skipped (deadline)")
            continue
        t_start = time.time()
        try:
            fn, lists = make()
            # One tuple per step of the rotation: iteration i takes element i % len of each list.
            period = math.lcm(*(len(v) for v in lists))
            ins = [tuple(v[j % len(v)] for v in lists) for j in range(period)]
            del lists
            med, lo, hi, count = timer.time(lambda i: fn(*ins[i % period]))
            report(name, nbytes / med / 1e9)
            log(f"# torch_eager:{name}: median {med * 1e3:.4f} ms (min {lo * 1e3:.4f}, max {hi * 1e3:.4f}; "
                f"{timer.batches}x{count}, k={period}) {time.time() - t_start:.1f} s")
            done += 1
        except Exception as e:  # report and go on
            report(name, float("nan"))
            first = str(e).splitlines()[0] if str(e) else ""
            log(f"# torch_eager:{name} FAILED: {type(e).__name__}: {first}")
        finally:
            fn = lists = ins = None
            torch.cuda.empty_cache()
    emit(f"# {done} cases in {time.time() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
