#!/usr/bin/env python3
"""Record golden fixtures of nuvec's core operations from real MLX.

Run from the repository root (MLX and NumPy must be importable):

    python3 scripts/mlx_fixtures.py            # writes crates/nuvec/tests/fixtures/core_ops.bin
    python3 scripts/mlx_fixtures.py --check    # fails if regenerating would change the file

The replayer is crates/nuvec/tests/suite/mlx_fixtures.rs (reader: crates/nuvec/tests/suite/fixture.rs).
Recording is deterministic: every input comes from NumPy streams seeded by SEED and the name of
the case before (see reseed), and the metadata holds a fixed date (RECORDED_ON), so regenerating
with the same MLX gives a byte-identical file, and adding a case leaves the others' inputs alone.

File format (all integers little-endian)
----------------------------------------
    magic         8 bytes  b"NVFIX001"
    meta_len      u32, then meta_len bytes of UTF-8 JSON:
                  {"mlx_version", "device": "cpu", "date", "seed", "generator"}
    case_count    u32
    case_count times:
        name      u16 length + UTF-8   unique, "<op>/<dtype>/<tag>"
        op        u16 length + UTF-8   the MLX function name ("add", "cumsum", "where", ...)
        params    u32 length + UTF-8 JSON object (keys per op, see run_op below)
        n_in      u8, then n_in tensors
        n_out     u8, then n_out tensors
    tensor:
        dtype     u8   MLX/nuvec order: bool=0 uint8 uint16 uint32 uint64 int8 int16 int32 int64
                       float16 bfloat16 float32 float64 complex64=13
        ndim      u8
        dims      ndim x u64
        data      raw little-endian row-major bytes (bool: one byte, 0 or 1)

Inputs are stored contiguous. A case may carry layout recipes that the recorder and the replayer
both apply to the stored inputs before calling the operation, so the operation sees a view:
    params["layout"]   a recipe for input 0
    params["layouts"]  a list with one recipe (or null) per input
    recipe:            ["transpose", perm]                 -> transpose(x, perm)
                       ["slice", starts, stops, steps]     -> x[start:stop:step, ...] (one entry
                                                              per axis, Python slice rules)
                       ["broadcast", shape]                -> broadcast_to(x, shape)

Combinations MLX rejects (an exception at record or eval time) are skipped and listed with -v.
"""

import argparse
import json
import math
import os
import struct
import sys
import zlib
from collections import Counter

import mlx.core as mx
import numpy as np

SEED = 20261129
# Fixed so that regenerating gives the same bytes; bump it when the recipe below changes.
RECORDED_ON = "2026-11-29"
MAGIC = b"NVFIX001"
OUT_PATH = os.path.join("crates", "nuvec", "tests", "fixtures", "core_ops.bin")

DTYPES = [
    "bool", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
    "float16", "bfloat16", "float32", "float64", "complex64",
]
CODE = {name: i for i, name in enumerate(DTYPES)}
SHORT = {
    "bool": "b", "uint8": "u8", "uint16": "u16", "uint32": "u32", "uint64": "u64", "int8": "i8",
    "int16": "i16", "int32": "i32", "int64": "i64", "float16": "f16", "bfloat16": "bf16",
    "float32": "f32", "float64": "f64", "complex64": "c64",
}
UNSIGNED = ["uint8", "uint16", "uint32", "uint64"]
SIGNED = ["int8", "int16", "int32", "int64"]
INTS = UNSIGNED + SIGNED
FLOATS = ["float16", "bfloat16", "float32", "float64"]

UNARY = [
    "abs", "sign", "negative", "exp", "expm1", "log", "log1p", "log2", "log10", "sqrt", "rsqrt",
    "square", "reciprocal", "sin", "cos", "tan", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh",
    "arcsinh", "arccosh", "arctanh", "sigmoid", "erf", "erfinv", "floor", "ceil", "round", "isnan",
    "isinf", "isfinite", "logical_not", "bitwise_invert", "conjugate", "isposinf", "isneginf",
]
BINARY = [
    "add", "subtract", "multiply", "divide", "floor_divide", "remainder", "power", "maximum",
    "minimum", "logaddexp", "arctan2", "equal", "not_equal", "less", "less_equal", "greater",
    "greater_equal", "logical_and", "logical_or", "bitwise_and", "bitwise_or", "bitwise_xor",
    "left_shift", "right_shift",
]
REDUCE = ["sum", "prod", "max", "min", "mean", "all", "any", "logsumexp"]
# Reductions whose MLX CPU kernel misbehaves on an empty reduced axis (see mlx_defect).
EMPTY_REDUCTION_HANGS = {"sum", "prod", "max", "min", "mean", "all", "any", "logsumexp", "var", "std"}
SCANS = ["cumsum", "cumprod", "cummax", "cummin", "logcumsumexp"]

# Float value ranges, and the values outside an operation's domain mixed into some cases.
DOMAINS = {
    "normal": (-3.0, 3.0),
    "wide": (-100.0, 100.0),
    "pos": (0.1, 10.0),
    "unit": (-0.95, 0.95),
    "ge1": (1.0, 10.0),
    "small": (-4.0, 4.0),
    "trig": (-1.4, 1.4),
    "near1": (0.5, 1.5),
}
OUT_OF_DOMAIN = {
    "pos": [-1.0, -0.5, 0.0, -0.0, -3.0],
    "unit": [-1.0, 1.0, 1.5, -2.0],
    "ge1": [0.5, 0.0, -1.0],
    "log1p": [-1.0, -1.5, -2.0],
}
SPECIALS = [math.nan, math.inf, -math.inf, 0.0, -0.0]

rng = np.random.default_rng(SEED)


def reseed(key):
    """Restarts the input stream from (SEED, key): each case draws its inputs from a stream keyed
    by the previous case's name, so adding or removing a case leaves the other cases' inputs as
    they were (at most the next case changes)."""
    global rng
    rng = np.random.default_rng([SEED, zlib.crc32(key.encode("utf-8"))])


# --------------------------------------------------------------------------------------------
# Inputs


def size_of(shape):
    return int(np.prod(shape, dtype=np.int64)) if shape else 1


def int_range(dtype, domain):
    """Inclusive integer range for `dtype` drawn under `domain`."""
    info = np.iinfo(np.dtype(dtype))
    if domain == "wide_bits":
        return int(info.min), int(info.max)
    if domain == "shift":
        return 0, info.bits - 1
    if domain in ("normal", "wide"):
        lo, hi = -50, 50
    elif domain == "ties":
        lo, hi = -3, 3
    elif domain == "pos":
        lo, hi = 1, 10
    elif domain == "power_base":
        lo, hi = -3, 3
    elif domain == "power_exp":
        lo, hi = 0, 4
    else:
        flo, fhi = DOMAINS.get(domain, (-3.0, 3.0))
        lo, hi = math.ceil(flo), math.floor(fhi)
    return max(lo, int(info.min)), min(hi, int(info.max))


def gen_values(shape, dtype, domain="normal", specials=False, ood=None, nonzero=False):
    """A NumPy array of `shape` holding values for `dtype` (bfloat16 as float32 values)."""
    n = size_of(shape)
    if dtype == "bool":
        draw = rng.random(n) < 0.5
        # A false divisor is an integer division by zero: undefined behaviour in MLX's C++.
        return (np.ones(n, bool) if nonzero else draw).reshape(shape)
    if dtype in INTS:
        lo, hi = int_range(dtype, domain)
        v = rng.integers(lo, hi, size=n, endpoint=True, dtype=np.dtype(dtype))
        if nonzero:
            v[v == 0] = 1
        return v.reshape(shape)
    if domain == "ties":
        v = rng.integers(-3, 3, size=n, endpoint=True).astype(np.float64)
    elif domain == "halves":
        v = rng.integers(-6, 6, size=n, endpoint=True) + np.where(rng.random(n) < 0.6, 0.5, rng.random(n))
    elif domain == "power_base":
        v = rng.uniform(0.2, 4.0, n)
    elif domain == "power_exp":
        v = rng.uniform(-3.0, 3.0, n)
    else:
        lo, hi = DOMAINS[domain]
        v = rng.uniform(lo, hi, n)
    if nonzero:
        v[np.abs(v) < 0.25] = 1.0
    if ood is not None and n:
        mask = rng.random(n) < 0.2
        v[mask] = rng.choice(OUT_OF_DOMAIN[ood], size=int(mask.sum()))
    if specials and n:
        mask = rng.random(n) < 0.3
        v[mask] = rng.choice(SPECIALS, size=int(mask.sum()))
    if dtype == "complex64":
        return (v + 1j * rng.uniform(-3.0, 3.0, n)).astype(np.complex64).reshape(shape)
    if dtype == "float64":
        return v.reshape(shape)
    return v.astype(np.float32).reshape(shape)


def to_mx(values, dtype):
    if dtype == "bfloat16":
        return mx.array(values.astype(np.float32)).astype(mx.bfloat16)
    if dtype == "float16":
        return mx.array(values.astype(np.float16))
    if dtype == "float64":
        return mx.array(values.astype(np.float64), dtype=mx.float64)
    return mx.array(values.astype(np.dtype(dtype) if dtype != "bool" else np.bool_))


def make(shape, dtype, domain="normal", **kw):
    return to_mx(gen_values(list(shape), dtype, domain, **kw), dtype)


def layout_for(shape, kind):
    """(base shape, recipe) such that applying the recipe to a base array gives `shape`."""
    shape = list(shape)
    if kind == "transpose":
        return shape[::-1], ["transpose", list(range(len(shape)))[::-1]]
    if kind == "transpose_last2":
        perm = list(range(len(shape)))
        perm[-2], perm[-1] = perm[-1], perm[-2]
        base = [shape[p] for p in perm]
        return base, ["transpose", perm]
    if kind in ("slice", "slice_neg"):
        base, starts, stops, steps = [], [], [], []
        for i, d in enumerate(shape):
            step = [2, -1, 3, -2][i % 4] if kind == "slice_neg" else [2, 1, 3][i % 3]
            if d == 0:
                step = 1
            front, back = 1, 1
            dim = front + (max(d, 1) - 1) * abs(step) + 1 + back if d else 2
            if step > 0:
                start = front if d else 1
                stop = start + (d - 1) * step + 1 if d else 1
            else:
                start = front + (d - 1) * abs(step)
                stop = front - 1
            base.append(dim)
            starts.append(start)
            stops.append(stop)
            steps.append(step)
        return base, ["slice", starts, stops, steps]
    if kind == "broadcast":
        # Size-1 axes where the shape allows it, and one fewer leading axis.
        base = [1 if (i % 2 == 0 and d != 0) else d for i, d in enumerate(shape)]
        if len(base) > 1:
            base = base[1:] if base[0] == 1 else base
        return base, ["broadcast", shape]
    raise ValueError(kind)


def apply_layout(x, recipe):
    if recipe is None:
        return x
    kind = recipe[0]
    if kind == "transpose":
        return mx.transpose(x, recipe[1])
    if kind == "slice":
        return x[tuple(slice(a, b, c) for a, b, c in zip(recipe[1], recipe[2], recipe[3]))]
    if kind == "broadcast":
        return mx.broadcast_to(x, recipe[1])
    raise ValueError(recipe)


# --------------------------------------------------------------------------------------------
# Running an operation: the op names and params the Rust replayer maps one to one.


def dt(name):
    if name is None:
        return None
    return mx.bool_ if name == "bool" else getattr(mx, name)


def run_op(op, p, xs):
    if op == "round" and "decimals" in p:
        return [mx.round(xs[0], p["decimals"])]
    if op in UNARY:
        return [getattr(mx, op)(xs[0])]
    if op in ("zeros_like", "ones_like"):
        return [getattr(mx, op)(xs[0])]
    if op == "full_like":
        return [mx.full_like(xs[0], p["value"])]
    if op in BINARY:
        if "scalar" in p:
            s = p["scalar"]
            args = (s, xs[0]) if p.get("scalar_first") else (xs[0], s)
            return [getattr(mx, op)(*args)]
        return [getattr(mx, op)(xs[0], xs[1])]
    if op == "where":
        rest = list(xs[1:])
        x = p["x_scalar"] if "x_scalar" in p else rest.pop(0)
        y = p["y_scalar"] if "y_scalar" in p else rest.pop(0)
        return [mx.where(xs[0], x, y)]
    if op == "clip":
        rest = list(xs[1:])
        bound = lambda v: rest.pop(0) if v == "input" else v
        lo = bound(p["a_min"])
        hi = bound(p["a_max"])
        return [mx.clip(xs[0], lo, hi)]
    if op == "astype":
        return [xs[0].astype(dt(p["dtype"]))]
    if op == "view":
        return [mx.view(xs[0], dt(p["dtype"]))]
    if op in REDUCE:
        return [getattr(mx, op)(xs[0], axis=p["axes"], keepdims=p["keepdims"])]
    if op in ("var", "std"):
        return [getattr(mx, op)(xs[0], axis=p["axes"], keepdims=p["keepdims"], ddof=p["ddof"])]
    if op in ("argmax", "argmin"):
        return [getattr(mx, op)(xs[0], axis=p["axis"], keepdims=p["keepdims"])]
    if op == "softmax":
        return [mx.softmax(xs[0], axis=p["axes"])]
    if op in SCANS:
        return [getattr(mx, op)(xs[0], axis=p["axis"], reverse=p["reverse"], inclusive=p["inclusive"])]
    if op == "reshape":
        return [mx.reshape(xs[0], p["shape"])]
    if op == "flatten":
        return [mx.flatten(xs[0], p["start_axis"], p["end_axis"])]
    if op == "transpose":
        return [mx.transpose(xs[0], p["axes"]) if p["axes"] is not None else mx.transpose(xs[0])]
    if op == "swapaxes":
        return [mx.swapaxes(xs[0], p["axis1"], p["axis2"])]
    if op == "moveaxis":
        return [mx.moveaxis(xs[0], p["source"], p["destination"])]
    if op == "expand_dims":
        return [mx.expand_dims(xs[0], p["axes"])]
    if op == "squeeze":
        return [mx.squeeze(xs[0], p["axes"]) if p["axes"] is not None else mx.squeeze(xs[0])]
    if op == "broadcast_to":
        return [mx.broadcast_to(xs[0], p["shape"])]
    if op == "slice":
        return [xs[0][tuple(slice(a, b, c) for a, b, c in zip(p["start"], p["stop"], p["step"]))]]
    if op == "concatenate":
        return [mx.concatenate(list(xs), axis=p["axis"])]
    if op == "stack":
        return [mx.stack(list(xs), axis=p["axis"])]
    if op == "split":
        parts = p["sections"] if "sections" in p else p["indices"]
        return list(mx.split(xs[0], parts, axis=p["axis"]))
    if op == "repeat":
        return [mx.repeat(xs[0], p["repeats"], axis=p["axis"])]
    if op == "tile":
        return [mx.tile(xs[0], p["reps"])]
    if op == "pad":
        widths = [tuple(w) for w in p["widths"]]
        if p["mode"] == "edge":
            return [mx.pad(xs[0], widths, mode="edge")]
        return [mx.pad(xs[0], widths, mode="constant", constant_values=p["value"])]
    if op == "contiguous":
        return [mx.contiguous(xs[0])]
    if op == "copy":
        return [mx.array(xs[0])]
    if op in ("tril", "triu"):
        return [getattr(mx, op)(xs[0], k=p["k"])]
    if op == "matmul":
        return [mx.matmul(xs[0], xs[1])]
    if op == "addmm":
        return [mx.addmm(xs[0], xs[1], xs[2], alpha=p["alpha"], beta=p["beta"])]
    if op in ("zeros", "ones"):
        return [getattr(mx, op)(p["shape"], dtype=dt(p["dtype"]))]
    if op == "full":
        value = xs[0] if "value" not in p else p["value"]
        if p["dtype"] is None:
            return [mx.full(p["shape"], value)]
        return [mx.full(p["shape"], value, dtype=dt(p["dtype"]))]
    if op == "arange":
        if p["dtype"] is None:
            return [mx.arange(p["start"], p["stop"], p["step"])]
        return [mx.arange(p["start"], p["stop"], p["step"], dtype=dt(p["dtype"]))]
    if op == "linspace":
        return [mx.linspace(p["start"], p["stop"], p["num"], dtype=dt(p["dtype"]))]
    if op == "eye":
        return [mx.eye(p["n"], p["m"], k=p["k"], dtype=dt(p["dtype"]))]
    if op == "tri":
        return [mx.tri(p["n"], p["m"], k=p["k"], dtype=dt(p["dtype"]))]
    if op == "identity":
        return [mx.identity(p["n"], dtype=dt(p["dtype"]))]
    raise ValueError(f"unknown op {op}")


# --------------------------------------------------------------------------------------------
# Recording


def tensor_bytes(a):
    name = str(a.dtype).split(".")[-1]
    a = mx.contiguous(a)
    if name == "bfloat16":
        raw = np.array(a.view(mx.uint16))
    elif name == "bool":
        raw = np.array(a).astype(np.uint8)
    else:
        raw = np.array(a)
    raw = np.ascontiguousarray(raw)
    out = bytearray()
    out += struct.pack("<BB", CODE[name], a.ndim)
    for d in a.shape:
        out += struct.pack("<Q", d)
    out += raw.astype(raw.dtype.newbyteorder("<"), copy=False).tobytes(order="C")
    return bytes(out)


def encode_case(name, op, params, inputs, outputs):
    """One case in the file format: name, op, params (compact sorted JSON), inputs, outputs."""
    pjson = json.dumps(params, sort_keys=True, separators=(",", ":"), allow_nan=False)
    blob = bytearray()
    for s, fmt in ((name, "<H"), (op, "<H"), (pjson, "<I")):
        b = s.encode("utf-8")
        blob += struct.pack(fmt, len(b)) + b
    for group in (inputs, outputs):
        blob += struct.pack("<B", len(group))
        for x in group:
            blob += tensor_bytes(x)
    return bytes(blob)


def encode_file(generator, date, seed, cases):
    """A whole fixture file: magic, metadata (MLX version, device, date, seed, generator), cases."""
    meta = {"mlx_version": mx.__version__, "device": "cpu", "date": date, "seed": seed, "generator": generator}
    m = json.dumps(meta, sort_keys=True, separators=(",", ":")).encode("utf-8")
    out = bytearray(MAGIC)
    out += struct.pack("<I", len(m)) + m
    out += struct.pack("<I", len(cases))
    for c in cases:
        out += c
    return bytes(out)


def write_or_check(path, data, script, check):
    """Writes the fixture file, or with `check` exits with an error when it differs from `data`."""
    if check:
        with open(path, "rb") as f:
            if f.read() != data:
                sys.exit(f"{path} is stale: regenerate it with {script}")
        print("up to date")
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    print(f"wrote {path}")


def mlx_defect(op, p, views, outs):
    """Why MLX 0.32.4's answer for this call is not a reference (a bug, self-inconsistent or
    undefined behaviour), or None. Such calls are not recorded; outs are not evaluated yet."""
    x = views[0] if views else None
    name = lambda a: str(a.dtype).split(".")[-1]
    if op in EMPTY_REDUCTION_HANGS and x.size == 0 and any(o.size for o in outs):
        # reduction_op spins (sometimes forever) in nd_loop when it reduces an empty axis into
        # a non-empty output; what it returns is unreliable.
        return "reduction over an empty axis can hang"
    if op == "logsumexp" and name(x) in ["bool"] + UNSIGNED:
        # logsumexp subtracts the maximum in the input dtype, which wraps around.
        return "logsumexp of bool/unsigned wraps"
    if op == "softmax" and name(x) not in FLOATS + ["complex64"]:
        axes = p["axes"] if p["axes"] is not None else list(range(x.ndim))
        if sorted(a % x.ndim for a in axes) != [x.ndim - 1]:
            # The fused last-axis path gives float32; the composed path keeps the integer
            # dtype (all zeros or ones).
            return "softmax of integers over other axes keeps the integer dtype"
    if op == "full" and p.get("dtype") is not None and name(outs[0]) != p["dtype"]:
        return "full ignores dtype here, contrary to its documentation"
    if op in ("cummax", "cummin") and name(x) in ("float16", "bfloat16"):
        if bool(mx.any(mx.isnan(x)).item()):
            # float32 and float64 propagate NaN; the half types do not.
            return "cummax/cummin of half types drop NaN"
    return None


class Recorder:
    def __init__(self, generator="scripts/mlx_fixtures.py"):
        self.generator = generator
        self.cases = []
        self.names = set()
        self.skipped = []
        self.families = Counter()
        self.family = "?"

    def case(self, op, dtype, tag, inputs, params=None):
        """Runs `op` in MLX on `inputs` (contiguous mx arrays) and records it unless rejected."""
        params = dict(params or {})
        base = f"{op}/{dtype}/{tag}"
        name, k = base, 1
        while name in self.names:
            k += 1
            name = f"{base}#{k}"
        try:
            return self._record(name, op, params, inputs)
        finally:
            reseed(name)

    def _record(self, name, op, params, inputs):
        views = list(inputs)
        if "layout" in params:
            views[0] = apply_layout(views[0], params["layout"])
        for i, recipe in enumerate(params.get("layouts", [])):
            views[i] = apply_layout(views[i], recipe)
        try:
            outs = run_op(op, params, views)
            defect = mlx_defect(op, params, views, outs)
            if defect:
                self.skipped.append((name, f"MLX defect: {defect}"))
                return False
            mx.eval(outs)
        except Exception as e:  # MLX rejects the combination: nothing to record
            self.skipped.append((name, str(e).splitlines()[0]))
            return False
        self.names.add(name)
        self.families[self.family] += 1
        self.cases.append(encode_case(name, op, params, inputs, outs))
        return True

    def serialize(self):
        # RECORDED_ON is read at call time: a script reusing this recorder may set its own.
        return encode_file(self.generator, RECORDED_ON, SEED, self.cases)


SHAPES = [[3, 4], [7], [2, 3, 4], [], [1], [0], [4, 0, 3], [1, 5], [2, 1, 3, 2], [5, 1], [3, 2, 2]]




# --------------------------------------------------------------------------------------------
# The cases


UNARY_DOMAIN = {
    "abs": "normal", "sign": "ties", "negative": "normal", "square": "normal", "floor": "halves",
    "ceil": "halves", "round": "halves", "exp": "small", "expm1": "small", "log": "pos",
    "log1p": "pos", "log2": "pos", "log10": "pos", "sqrt": "pos", "rsqrt": "pos", "reciprocal": "normal",
    "sin": "wide", "cos": "wide", "tan": "trig", "arcsin": "unit", "arccos": "unit", "arctan": "wide",
    "sinh": "small", "cosh": "small", "tanh": "normal", "arcsinh": "wide", "arccosh": "ge1",
    "arctanh": "unit", "sigmoid": "wide", "erf": "normal", "erfinv": "unit", "isnan": "normal",
    "isinf": "normal", "isfinite": "normal", "logical_not": "ties", "bitwise_invert": "normal",
    "conjugate": "normal", "isposinf": "normal", "isneginf": "normal",
}
UNARY_OOD = {
    "log": "pos", "log2": "pos", "log10": "pos", "sqrt": "pos", "rsqrt": "pos", "log1p": "log1p",
    "arcsin": "unit", "arccos": "unit", "arctanh": "unit", "erfinv": "unit", "arccosh": "ge1",
}


def unary_cases(r):
    r.family = "unary"
    for op in UNARY:
        dom = UNARY_DOMAIN[op]
        for i, dtype in enumerate(DTYPES):
            shape = SHAPES[(i + len(op)) % len(SHAPES)]
            r.case(op, SHORT[dtype], "x".join(map(str, shape)) or "scalar", [make(shape, dtype, dom)])
        # Out-of-domain values (NaN / inf results) and the IEEE specials, in every float type.
        for dtype in FLOATS:
            r.case(op, SHORT[dtype], "specials", [make([4, 6], dtype, dom, specials=True, ood=UNARY_OOD.get(op))])
        # Views: the kernel must read strided and broadcast inputs.
        for kind in ("transpose", "slice_neg", "broadcast"):
            base, recipe = layout_for([3, 5], kind)
            r.case(op, "f32", kind, [make(base, "float32", dom, ood=UNARY_OOD.get(op))], {"layout": recipe})
        base, recipe = layout_for([2, 3, 4], "slice")
        r.case(op, "i32", "slice", [make(base, "int32", dom)], {"layout": recipe})
    for dtype, decimals in [("float32", 2), ("float32", -1), ("float16", 1), ("bfloat16", 1), ("float64", 3),
                            ("int32", -1), ("int8", 1)]:
        r.case("round", SHORT[dtype], f"decimals{decimals}", [make([3, 4], dtype, "wide")], {"decimals": decimals})
    # Larger inputs run the vectorised paths, with a tail that is not a multiple of the width.
    for op in ("exp", "log", "sin", "tanh", "sigmoid", "erf", "sqrt", "abs", "floor", "round"):
        for dtype in ("float32", "float16", "bfloat16"):
            r.case(op, SHORT[dtype], "long", [make([1031], dtype, UNARY_DOMAIN[op])])


SHAPE_PAIRS = [
    ([3, 4], [3, 4]),
    ([3, 1], [1, 4]),
    ([2, 3, 4], [4]),
    ([2, 1, 3], [4, 1]),
    ([0, 3], [1, 3]),
    ([5], [1]),
    ([], [2, 3]),
    ([1], []),
    ([2, 0], [2, 1]),
    ([6], [6]),
]
BINARY_DOMAINS = {
    # op: (domain of a, domain of b, b nonzero)
    "divide": ("normal", "normal", True),
    "floor_divide": ("wide", "normal", True),
    "remainder": ("wide", "normal", True),
    "power": ("power_base", "power_exp", False),
    "logaddexp": ("wide", "wide", False),
    "arctan2": ("ties", "ties", False),
    "left_shift": ("normal", "shift", False),
    "right_shift": ("wide", "shift", False),
    "bitwise_and": ("wide_bits", "wide_bits", False),
    "bitwise_or": ("wide_bits", "wide_bits", False),
    "bitwise_xor": ("wide_bits", "wide_bits", False),
}
TIES_OPS = {"maximum", "minimum", "equal", "not_equal", "less", "less_equal", "greater", "greater_equal",
            "logical_and", "logical_or"}
MIXED_PAIRS = [
    ("int8", "uint8"), ("float16", "bfloat16"), ("uint64", "int32"), ("int32", "float16"),
    ("bool", "float32"), ("uint32", "int64"), ("uint16", "int8"), ("float32", "float64"),
    ("bool", "int8"), ("bfloat16", "int64"),
]


def binary_domains(op, dtype_a, dtype_b):
    da, db, nz = BINARY_DOMAINS.get(op, ("ties" if op in TIES_OPS else "normal",) * 2 + (False,))
    # Shifts by a float or of a float make no sense; wide_bits only exists for integers.
    fix = lambda d, dtype: "wide" if d in ("wide_bits", "shift") and dtype not in INTS else d
    return fix(da, dtype_a), fix(db, dtype_b), nz


def binary_cases(r):
    r.family = "binary"
    for op in BINARY:
        for i, dtype in enumerate(DTYPES):
            sa, sb = SHAPE_PAIRS[(i + len(op)) % len(SHAPE_PAIRS)]
            da, db, nz = binary_domains(op, dtype, dtype)
            if op in ("left_shift", "right_shift") and dtype in SIGNED:
                da = "normal"
            a, b = make(sa, dtype, da), make(sb, dtype, db, nonzero=nz)
            r.case(op, SHORT[dtype], f"{'x'.join(map(str, sa)) or 's'}_{'x'.join(map(str, sb)) or 's'}", [a, b])
        for dtype in FLOATS:
            da, db, _ = binary_domains(op, dtype, dtype)
            r.case(op, SHORT[dtype], "specials", [make([4, 5], dtype, da, specials=True),
                                                  make([4, 5], dtype, db, specials=True)])
        for ta, tb in MIXED_PAIRS:
            da, db, nz = binary_domains(op, ta, tb)
            r.case(op, f"{SHORT[ta]}_{SHORT[tb]}", "mixed", [make([3, 4], ta, da), make([4], tb, db, nonzero=nz)])
        # Views on either side.
        da, db, nz = binary_domains(op, "float32", "float32")
        base_a, rec_a = layout_for([3, 4], "transpose")
        base_b, rec_b = layout_for([3, 4], "slice_neg")
        r.case(op, "f32", "transpose_slice", [make(base_a, "float32", da), make(base_b, "float32", db, nonzero=nz)],
               {"layouts": [rec_a, rec_b]})
        base_b, rec_b = layout_for([2, 3, 4], "broadcast")
        r.case(op, "f32", "broadcast", [make([2, 3, 4], "float32", da), make(base_b, "float32", db, nonzero=nz)],
               {"layouts": [None, rec_b]})
        dint = "int32" if op not in ("left_shift", "right_shift") else "uint8"
        da, db, nz = binary_domains(op, dint, dint)
        base_a, rec_a = layout_for([4, 3], "transpose")
        r.case(op, SHORT[dint], "transpose", [make(base_a, dint, da), make([4, 3], dint, db, nonzero=nz)],
               {"layouts": [rec_a, None]})
    # Large operands run the vectorised paths.
    for op in ("add", "multiply", "divide", "maximum", "power", "less", "logaddexp"):
        for dtype in ("float32", "float16", "int32"):
            da, db, nz = binary_domains(op, dtype, dtype)
            r.case(op, SHORT[dtype], "long", [make([1031], dtype, da), make([1031], dtype, db, nonzero=nz)])
    # Quotients within half an ulp of an integer: MLX rounds them to the half type before flooring.
    for dtype in ("float16", "bfloat16"):
        r.case("floor_divide", SHORT[dtype], "rounded_quotient",
               [to_mx(np.array([-50.0, 7.0, 100.0, 3.0], np.float32), dtype),
                to_mx(np.array([0.476, 0.7001, 1.0001, 0.29998], np.float32), dtype)])
    # Unsigned wrap-around is defined behaviour in both.
    r.case("add", "u8", "wrap", [to_mx(np.array([250, 255, 3], np.uint8), "uint8"),
                                  to_mx(np.array([10, 1, 250], np.uint8), "uint8")])
    r.case("subtract", "u8", "wrap", [to_mx(np.array([0, 5, 3], np.uint8), "uint8"),
                                       to_mx(np.array([1, 10, 250], np.uint8), "uint8")])
    r.case("multiply", "u16", "wrap", [to_mx(np.array([300, 65535], np.uint16), "uint16"),
                                        to_mx(np.array([300, 2], np.uint16), "uint16")])


WEAK = [
    # (op, array dtype, scalar, scalar first?, domain)
    ("add", "int32", 1.5, False, "normal"),
    ("add", "uint8", 1.5, False, "pos"),
    ("add", "int64", 2.0, False, "normal"),
    ("add", "float16", 2.0, False, "normal"),
    ("multiply", "bfloat16", 0.5, False, "normal"),
    ("add", "float64", 0.1, False, "normal"),
    ("add", "bool", 1, False, "normal"),
    ("add", "bool", True, False, "normal"),
    ("multiply", "bool", 2.5, False, "normal"),
    ("add", "uint8", 3, False, "pos"),
    ("add", "uint8", True, False, "pos"),
    ("multiply", "int8", -2, False, "normal"),
    ("subtract", "uint16", 1, False, "pos"),
    ("divide", "uint32", 2, False, "pos"),
    ("floor_divide", "int32", 2.0, False, "normal"),
    ("subtract", "int16", 2, True, "normal"),
    ("divide", "float16", 1.0, True, "normal"),
    ("power", "int32", 2, False, "power_base"),
    ("power", "float32", 2, True, "normal"),
    ("greater", "int32", 0.5, False, "normal"),
    ("equal", "uint8", 1, False, "ties"),
    ("maximum", "bfloat16", 0.0, False, "normal"),
    ("minimum", "int8", 2, True, "normal"),
    ("remainder", "int32", 3, False, "normal"),
    ("remainder", "float32", -1.5, False, "normal"),
    ("add", "float32", True, False, "normal"),
    ("add", "uint64", 1, False, "pos"),
    ("add", "complex64", 1.5, False, "normal"),
    ("multiply", "float16", 3, False, "normal"),
    ("subtract", "bfloat16", 1, True, "normal"),
    ("less", "float16", 1, False, "ties"),
    ("logical_and", "float32", True, False, "ties"),
    ("bitwise_and", "uint8", 7, False, "wide_bits"),
    ("bitwise_or", "bool", True, False, "normal"),
    ("left_shift", "int32", 3, False, "normal"),
    ("right_shift", "uint16", 2, False, "wide_bits"),
    ("arctan2", "int32", 1.0, True, "ties"),
    ("logaddexp", "float16", 0.5, False, "normal"),
]


def weak_scalar_cases(r):
    r.family = "weak scalar"
    for op, dtype, scalar, first, dom in WEAK:
        kind = type(scalar).__name__
        side = "left" if first else "right"
        r.case(op, SHORT[dtype], f"scalar_{kind}_{side}", [make([2, 3], dtype, dom)],
               {"scalar": scalar, "scalar_first": first})


def where_clip_cases(r):
    r.family = "where/clip"
    for dtype in ["float32", "int32", "float16", "bool", "bfloat16", "uint8", "float64", "int64", "complex64"]:
        r.case("where", SHORT[dtype], "bcast", [make([3, 1], "bool"), make([1, 4], dtype), make([4], dtype)])
    r.case("where", "f32_i32", "mixed", [make([2, 3], "bool"), make([2, 3], "float32"), make([2, 3], "int32")])
    r.case("where", "i8_u8", "mixed", [make([2, 3], "bool"), make([2, 3], "int8"), make([3], "uint8")])
    r.case("where", "f32", "cond_float", [make([2, 3], "float32", "ties"), make([2, 3], "float32"), make([2, 3], "float32")])
    r.case("where", "f16", "scalar_y", [make([5], "bool"), make([5], "float16")], {"y_scalar": 0.0})
    r.case("where", "i32", "scalar_x", [make([5], "bool"), make([5], "int32")], {"x_scalar": 7})
    r.case("where", "f32", "scalar_both", [make([2, 2], "bool")], {"x_scalar": 1.5, "y_scalar": -1})
    r.case("where", "f32", "empty", [make([0, 2], "bool"), make([1, 2], "float32"), make([2], "float32")])
    base, recipe = layout_for([3, 4], "transpose")
    r.case("where", "f32", "transpose", [make(base, "bool"), make([3, 4], "float32"), make([3, 4], "float32")],
           {"layouts": [recipe, None, None]})

    for dtype in ["float32", "float16", "bfloat16", "float64", "int32", "uint8", "int8", "int64"]:
        lo = 2 if dtype in UNSIGNED else -2
        r.case("clip", SHORT[dtype], "scalars", [make([3, 5], dtype, "wide")], {"a_min": lo, "a_max": 5})
    r.case("clip", "f32", "float_bounds", [make([3, 5], "float32", specials=True)], {"a_min": -0.5, "a_max": 1.25})
    r.case("clip", "f32", "min_only", [make([7], "float32")], {"a_min": 0.0, "a_max": None})
    r.case("clip", "i32", "max_only", [make([7], "int32")], {"a_min": None, "a_max": 3})
    r.case("clip", "i32", "float_bounds", [make([7], "int32")], {"a_min": -1.5, "a_max": 2.5})
    r.case("clip", "f32", "arrays", [make([3, 4], "float32"), make([4], "float32", "small"), make([3, 1], "float32", "small")],
           {"a_min": "input", "a_max": "input"})
    r.case("clip", "u8", "arrays", [make([2, 3], "uint8", "wide"), make([3], "uint8"), make([2, 1], "uint8")],
           {"a_min": "input", "a_max": "input"})
    base, recipe = layout_for([4, 3], "slice_neg")
    r.case("clip", "f32", "slice_neg", [make(base, "float32")], {"a_min": -1.0, "a_max": 1.0, "layout": recipe})


def astype_cases(r):
    r.family = "astype/view"
    for src in DTYPES:
        for dst in DTYPES:
            if src == dst:
                continue
            if src in FLOATS and dst in UNSIGNED:
                # Out-of-range float -> int conversions are undefined in C++; stay in range.
                vals = to_mx(np.abs(gen_values([3, 4], src, "wide")) * 1.25, src)
            elif src in FLOATS and dst in SIGNED:
                vals = make([3, 4], src, "wide")
            elif src in FLOATS:
                vals = make([3, 4], src, "wide", specials=True)
            elif src in ("uint64", "int64", "uint32", "int32"):
                vals = make([3, 4], src, "wide_bits")
            elif src == "complex64" and dst in UNSIGNED:
                vals = to_mx(np.abs(gen_values([3, 4], src, "wide").real) + 0j, src)
            elif src == "complex64" and dst != "bool":
                vals = make([3, 4], src, "wide")
            else:
                vals = make([3, 4], src, "wide_bits" if src in INTS else "ties")
            r.case("astype", f"{SHORT[src]}_{SHORT[dst]}", "3x4", [vals], {"dtype": dst})
    # Rounding into half types: ties-to-even, overflow to infinity, subnormals.
    edge = np.array([1.0009765625, 1.00048828125, 1.00146484375, 65504.0, 65520.0, 70000.0, -1e6, 1e-7,
                     6e-8, 3.0e-5, 1.00390625, 1.005859375, 3.4e38, -1.0e-40, 0.1, 1 / 3], np.float32)
    for dst in ("float16", "bfloat16", "int32", "bool"):
        v = edge if dst in ("float16", "bfloat16") else np.array([0.0, -0.0, 0.5, -0.99, 2.999, -7.5, 1e-30, 100.25],
                                                                    np.float32)
        r.case("astype", f"f32_{SHORT[dst]}", "edges", [to_mx(v, "float32")], {"dtype": dst})
    r.case("astype", "f64_f32", "edges", [to_mx(np.array([1e300, -1e-300, 0.1, 1 + 2**-30, 2**-149 * 0.75], np.float64), "float64")],
           {"dtype": "float32"})
    base, recipe = layout_for([3, 4], "transpose")
    r.case("astype", "f32_i16", "transpose", [make(base, "float32", "wide")], {"dtype": "int16", "layout": recipe})
    base, recipe = layout_for([5, 2], "slice_neg")
    r.case("astype", "i32_f16", "slice_neg", [make(base, "int32")], {"dtype": "float16", "layout": recipe})
    base, recipe = layout_for([2, 3], "broadcast")
    r.case("astype", "u8_f32", "broadcast", [make(base, "uint8")], {"dtype": "float32", "layout": recipe})

    views = [
        ("float32", "int32"), ("float32", "uint32"), ("int32", "float32"), ("float16", "int16"),
        ("float16", "bfloat16"), ("bfloat16", "uint16"), ("uint8", "int8"), ("int8", "bool"),
        ("float32", "uint8"), ("uint8", "float32"), ("int64", "float64"), ("float64", "uint16"),
        ("int16", "int8"), ("uint32", "float16"), ("complex64", "float32"), ("float32", "complex64"),
        ("float64", "complex64"),
    ]
    for src, dst in views:
        shape = [2, 8]
        dom = "wide_bits" if src in INTS else ("ties" if src == "bool" else "wide")
        vals = make(shape, src, dom) if src != "int8" or dst != "bool" else to_mx(
            rng.integers(0, 2, size=shape).astype(np.int8), "int8")
        r.case("view", f"{SHORT[src]}_{SHORT[dst]}", "2x8", [vals], {"dtype": dst})
    base, recipe = layout_for([4, 3], "transpose")
    r.case("view", "f32_i32", "transpose", [make(base, "float32", specials=True)], {"dtype": "int32", "layout": recipe})
    base, recipe = layout_for([3, 4], "transpose")
    r.case("view", "i32_u8", "transpose", [make(base, "int32", "wide_bits")], {"dtype": "uint8", "layout": recipe})
    r.case("view", "f32_i32", "scalar", [make([], "float32")], {"dtype": "int32"})


REDUCE_DOMAIN = {"prod": "near1", "all": "ties", "any": "ties", "argmax": "ties", "argmin": "ties",
                 "logsumexp": "wide"}
AXES_CONFIGS = [
    ([2, 3, 4], None), ([2, 3, 4], [0]), ([2, 3, 4], [-1]), ([2, 3, 4], [0, 2]), ([2, 3, 4], [1, 2]),
    ([5], [0]), ([3, 0, 2], [1]), ([3, 0, 2], [0, 2]), ([1, 7], [1]), ([4, 1, 3, 2], [0, 3]),
    ([2, 3, 4], []), ([], None), ([6, 5], [0]),
]


def reduction_cases(r):
    r.family = "reduction"
    for op in REDUCE + ["var", "std", "softmax"]:
        dom = REDUCE_DOMAIN.get(op, "normal")
        for i, dtype in enumerate(DTYPES):
            shape, axes = AXES_CONFIGS[(i + len(op)) % len(AXES_CONFIGS)]
            p = {"axes": axes}
            if op != "softmax":
                p["keepdims"] = i % 3 == 0
            if op in ("var", "std"):
                p["ddof"] = i % 3
            if op == "prod" and dtype in INTS:
                d = "ties"
            else:
                d = dom
            r.case(op, SHORT[dtype], f"axes{axes}".replace(" ", ""), [make(shape, dtype, d)], p)
        for j, (shape, axes) in enumerate(AXES_CONFIGS):
            p = {"axes": axes}
            if op != "softmax":
                p["keepdims"] = j % 2 == 1
            if op in ("var", "std"):
                p["ddof"] = j % 2
            r.case(op, "f32", f"{'x'.join(map(str, shape)) or 's'}_axes{axes}".replace(" ", ""),
                   [make(shape, "float32", dom)], p)
        p = {"axes": [1]} if op == "softmax" else {"axes": [1], "keepdims": False}
        if op in ("var", "std"):
            p["ddof"] = 1
        for dtype in FLOATS:
            r.case(op, SHORT[dtype], "specials", [make([3, 5], dtype, dom, specials=True)], p)
        base, recipe = layout_for([4, 6], "transpose")
        r.case(op, "f32", "transpose", [make(base, "float32", dom)], dict(p, layout=recipe))
        base, recipe = layout_for([4, 6], "slice_neg")
        r.case(op, "i32", "slice_neg", [make(base, "int32", "ties")], dict(p, layout=recipe))
        base, recipe = layout_for([3, 4, 5], "broadcast")
        r.case(op, "f32", "broadcast", [make(base, "float32", dom)],
               dict(p, axes=[0, 2] if op != "softmax" else [0], layout=recipe))
        # Long rows: accumulation order and precision over many elements.
        for dtype in ("float32", "float16", "bfloat16"):
            q = dict(p, axes=[-1])
            r.case(op, SHORT[dtype], "long", [make([3, 700], dtype, dom)], q)
    # No axes: MLX returns the input unchanged (sum and prod keep its dtype).
    for op, dtype in [("sum", "bool"), ("sum", "int8"), ("prod", "uint8"), ("max", "int16"), ("all", "float32"),
                      ("any", "int32"), ("mean", "int32"), ("var", "float16"), ("logsumexp", "int32"),
                      ("softmax", "float32")]:
        p = {"axes": []} if op == "softmax" else {"axes": [], "keepdims": False}
        if op == "var":
            p["ddof"] = 0
        r.case(op, SHORT[dtype], "no_axes", [make([2, 3], dtype, "ties")], p)
    for op in ("var", "std"):
        for ddof in (0, 1, 2, 5):
            r.case(op, "f32", f"ddof{ddof}", [make([3, 5], "float32")], {"axes": [1], "keepdims": False, "ddof": ddof})
    r.family = "arg reduction"
    for op in ("argmax", "argmin"):
        for i, dtype in enumerate(DTYPES):
            shape, axis = [([3, 4], 1), ([2, 3, 4], 0), ([5], None), ([2, 3, 4], -1), ([3, 1], 1)][i % 5]
            r.case(op, SHORT[dtype], f"axis{axis}", [make(shape, dtype, "ties")], {"axis": axis, "keepdims": i % 2 == 0})
        for dtype in FLOATS:
            r.case(op, SHORT[dtype], "specials", [make([4, 5], dtype, specials=True)], {"axis": 1, "keepdims": False})
        base, recipe = layout_for([4, 5], "transpose")
        r.case(op, "f32", "transpose", [make(base, "float32", "ties")], {"axis": 0, "keepdims": False, "layout": recipe})
        r.case(op, "f32", "long", [make([2, 1000], "float32", "wide")], {"axis": 1, "keepdims": True})


def scan_cases(r):
    r.family = "scan"
    dom = {"cumprod": "near1", "logcumsumexp": "wide"}
    for op in SCANS:
        for i, dtype in enumerate(DTYPES):
            shape, axis = [([3, 4], 1), ([2, 3, 4], 0), ([6], None), ([2, 3, 4], -1), ([0, 3], 1), ([2, 5], 0)][i % 6]
            d = "ties" if (op == "cumprod" and dtype in INTS) else dom.get(op, "normal")
            r.case(op, SHORT[dtype], f"axis{axis}", [make(shape, dtype, d)],
                   {"axis": axis, "reverse": i % 2 == 1, "inclusive": (i // 2) % 2 == 0})
        for reverse in (False, True):
            for inclusive in (True, False):
                r.case(op, "f32", f"rev{int(reverse)}_inc{int(inclusive)}", [make([3, 6], "float32", dom.get(op, "normal"))],
                       {"axis": 1, "reverse": reverse, "inclusive": inclusive})
        for dtype in FLOATS:
            r.case(op, SHORT[dtype], "specials", [make([3, 6], dtype, dom.get(op, "normal"), specials=True)],
                   {"axis": 1, "reverse": False, "inclusive": True})
        base, recipe = layout_for([4, 5], "transpose")
        r.case(op, "f32", "transpose", [make(base, "float32", dom.get(op, "normal"))],
               {"axis": 1, "reverse": True, "inclusive": True, "layout": recipe})
        base, recipe = layout_for([4, 5], "slice_neg")
        r.case(op, "i32", "slice_neg", [make(base, "int32", "ties")],
               {"axis": 0, "reverse": False, "inclusive": False, "layout": recipe})
        r.case(op, "f32", "long", [make([2, 600], "float32", dom.get(op, "normal"))],
               {"axis": 1, "reverse": False, "inclusive": True})


def shape_cases(r):
    r.family = "shape"
    for dtype, shape, new in [("float32", [2, 3, 4], [4, 6]), ("int32", [2, 3, 4], [-1]), ("uint8", [2, 3, 4], [2, -1, 2]),
                              ("float16", [0, 3], [3, 0]), ("bool", [], [1, 1]), ("bfloat16", [6], [2, 1, 3]),
                              ("complex64", [4], [2, 2]), ("int64", [1], [])]:
        r.case("reshape", SHORT[dtype], f"to{new}".replace(" ", ""), [make(shape, dtype)], {"shape": new})
    base, recipe = layout_for([3, 4], "transpose")
    r.case("reshape", "f32", "transpose", [make(base, "float32")], {"shape": [12], "layout": recipe})
    base, recipe = layout_for([4, 6], "slice_neg")
    r.case("reshape", "i16", "slice_neg", [make(base, "int16")], {"shape": [2, 12], "layout": recipe})
    base, recipe = layout_for([2, 3], "broadcast")
    r.case("reshape", "f32", "broadcast", [make(base, "float32")], {"shape": [3, 2], "layout": recipe})

    for dtype, shape, s, e in [("float32", [2, 3, 4], 0, -1), ("int8", [2, 3, 4], 1, 2), ("float16", [2, 3, 4, 1], 0, 1),
                               ("int32", [], 0, -1), ("bool", [3, 0, 2], 1, -1)]:
        r.case("flatten", SHORT[dtype], f"{s}_{e}", [make(shape, dtype)], {"start_axis": s, "end_axis": e})
    base, recipe = layout_for([3, 4, 2], "transpose")
    r.case("flatten", "f32", "transpose", [make(base, "float32")], {"start_axis": 0, "end_axis": 1, "layout": recipe})

    for dtype, shape, axes in [("float32", [2, 3, 4], None), ("int32", [2, 3, 4], [1, 0, 2]), ("uint16", [2, 3, 4], [2, 0, 1]),
                               ("bfloat16", [3, 5], None), ("bool", [0, 2, 1], [-1, 0, 1]), ("float64", [2, 1, 3, 2], [3, 1, 0, 2])]:
        r.case("transpose", SHORT[dtype], f"axes{axes}".replace(" ", ""), [make(shape, dtype)], {"axes": axes})
    base, recipe = layout_for([4, 6], "slice_neg")
    r.case("transpose", "f32", "slice_neg", [make(base, "float32")], {"axes": [1, 0], "layout": recipe})

    for dtype, shape, a, b in [("float32", [2, 3, 4], 0, 2), ("int8", [2, 3], -1, 0), ("float16", [1, 2, 3], 1, 1)]:
        r.case("swapaxes", SHORT[dtype], f"{a}_{b}", [make(shape, dtype)], {"axis1": a, "axis2": b})
    for dtype, shape, s, d in [("float32", [2, 3, 4], 0, -1), ("int32", [2, 3, 4], -1, 0), ("bfloat16", [2, 3, 4, 5], 1, 2)]:
        r.case("moveaxis", SHORT[dtype], f"{s}_{d}", [make(shape, dtype)], {"source": s, "destination": d})
    for dtype, shape, axes in [("float32", [2, 3], [0]), ("int32", [2, 3], [-1]), ("uint8", [2, 3], [0, 3]),
                               ("bool", [], [0]), ("float16", [4], [1, -1])]:
        r.case("expand_dims", SHORT[dtype], f"axes{axes}".replace(" ", ""), [make(shape, dtype)], {"axes": axes})
    for dtype, shape, axes in [("float32", [1, 3, 1, 2], None), ("int32", [1, 3, 1], [0]), ("float64", [2, 1, 1], [-1, 1]),
                               ("bool", [1], None), ("float16", [1, 0, 1], [2])]:
        r.case("squeeze", SHORT[dtype], f"axes{axes}".replace(" ", ""), [make(shape, dtype)], {"axes": axes})
    for dtype, shape, new in [("float32", [3], [2, 3]), ("int32", [1, 3], [4, 3]), ("bool", [], [2, 2]),
                              ("float16", [2, 1], [2, 0]), ("uint64", [3, 1, 2], [2, 3, 4, 2])]:
        r.case("broadcast_to", SHORT[dtype], f"to{new}".replace(" ", ""), [make(shape, dtype)], {"shape": new})

    slices = [
        ([10], [2], [8], [1]), ([10], [8], [0], [-3]), ([10], [-3], [-11], [-1]), ([10], [0], [100], [4]),
        ([10], [5], [2], [1]), ([4, 6], [1, 0], [3, 6], [1, 2]), ([4, 6], [3, -1], [-5, 0], [-1, -2]),
        ([2, 3, 4], [0, 1, 3], [2, 3, 0], [1, 1, -1]), ([0, 4], [0, 1], [0, 3], [1, 1]), ([5], [-100], [100], [2]),
        ([6], [100], [-100], [-2]),
    ]
    for i, (shape, start, stop, step) in enumerate(slices):
        dtype = ["float32", "int32", "uint8", "float16", "bool", "bfloat16", "int64", "float64"][i % 8]
        r.case("slice", SHORT[dtype], f"{i}", [make(shape, dtype)], {"start": start, "stop": stop, "step": step})
    base, recipe = layout_for([4, 6], "transpose")
    r.case("slice", "f32", "transpose", [make(base, "float32")],
           {"start": [3, 1], "stop": [-5, 6], "step": [-1, 2], "layout": recipe})

    concat = [
        ([[2, 3], [4, 3]], ["float32", "float32"], 0), ([[2, 3], [2, 1], [2, 2]], ["int32"] * 3, 1),
        ([[2, 3], [2, 3]], ["int8", "uint8"], -1), ([[0, 3], [2, 3]], ["float16", "float16"], 0),
        ([[2, 2], [2, 2]], ["float16", "bfloat16"], 1), ([[3], [4]], ["bool", "int32"], 0),
        ([[1, 2, 3], [1, 2, 1]], ["float64", "float32"], 2),
    ]
    for shapes, dtypes, axis in concat:
        tag = "_".join(SHORT[d] for d in dtypes)
        r.case("concatenate", tag, f"axis{axis}_{len(shapes)}", [make(s, d) for s, d in zip(shapes, dtypes)], {"axis": axis})
    base, recipe = layout_for([3, 2], "transpose")
    r.case("concatenate", "f32", "transpose", [make(base, "float32"), make([3, 4], "float32")],
           {"axis": 1, "layouts": [recipe, None]})
    for shape, dtype, axis, n in [([2, 3], "float32", 0, 2), ([2, 3], "int32", 1, 3), ([2, 3], "float16", -1, 2),
                                  ([], "int8", 0, 3), ([0, 2], "bool", 1, 2)]:
        r.case("stack", SHORT[dtype], f"axis{axis}_{n}", [make(shape, dtype) for _ in range(n)], {"axis": axis})
    for shape, dtype, p in [([6, 2], "float32", {"sections": 3, "axis": 0}), ([2, 6], "int32", {"indices": [1, 3], "axis": 1}),
                            ([5], "float16", {"indices": [0, 2], "axis": 0}), ([5], "uint8", {"indices": [2, 10], "axis": 0}),
                            ([3, 4], "bfloat16", {"sections": 2, "axis": -1}), ([4, 2], "bool", {"sections": 1, "axis": 0})]:
        r.case("split", SHORT[dtype], "_".join(f"{k}{v}" for k, v in sorted(p.items())).replace(" ", ""),
               [make(shape, dtype)], p)
    for shape, dtype, reps, axis in [([2, 3], "float32", 2, 0), ([2, 3], "int32", 3, 1), ([2, 3], "float16", 2, None),
                                     ([3], "bool", 0, 0), ([2, 2], "uint8", 1, -1)]:
        r.case("repeat", SHORT[dtype], f"{reps}_axis{axis}", [make(shape, dtype)], {"repeats": reps, "axis": axis})
    for shape, dtype, reps in [([2, 3], "float32", [2]), ([2, 3], "int32", [2, 1]), ([2, 3], "float16", [1, 2, 3]),
                               ([3], "bool", [2, 3]), ([2, 2], "int64", [0, 2])]:
        r.case("tile", SHORT[dtype], f"reps{reps}".replace(" ", ""), [make(shape, dtype)], {"reps": reps})
    for shape, dtype, widths, value, mode in [
        ([2, 3], "float32", [[1, 2], [0, 1]], 0, "constant"), ([2, 3], "int32", [[1, 1]], 7, "constant"),
        ([3], "float16", [[2, 0]], 1.5, "constant"), ([2, 2], "bool", [[1, 0], [0, 1]], True, "constant"),
        ([2, 3], "bfloat16", [[0, 0], [2, 2]], -1.0, "constant"), ([0, 2], "float32", [[1, 1], [1, 1]], 2.0, "constant"),
        ([2, 3], "float32", [[1, 2], [2, 1]], 0, "edge"), ([3], "int8", [[3, 2]], 0, "edge"),
        ([2, 3], "uint8", [[1, 1], [1, 1]], 1.9, "constant"),
    ]:
        r.case("pad", SHORT[dtype], f"{mode}_{widths}".replace(" ", ""), [make(shape, dtype)],
               {"widths": widths, "value": value, "mode": mode})
    for kind in ("transpose", "slice_neg", "broadcast"):
        base, recipe = layout_for([3, 4], kind)
        r.case("contiguous", "f32", kind, [make(base, "float32")], {"layout": recipe})
        r.case("copy", "i32", kind, [make(base, "int32")], {"layout": recipe})
    r.case("copy", "bf16", "plain", [make([5], "bfloat16")])
    for op in ("tril", "triu"):
        for shape, dtype, k in [([4, 4], "float32", 0), ([3, 5], "int32", 1), ([5, 3], "float16", -1), ([2, 3, 3], "bool", 0),
                                ([4, 4], "float32", 5), ([4, 4], "uint8", -2)]:
            r.case(op, SHORT[dtype], f"{'x'.join(map(str, shape))}_k{k}", [make(shape, dtype)], {"k": k})
        base, recipe = layout_for([4, 4], "transpose")
        r.case(op, "f32", "transpose", [make(base, "float32")], {"k": 1, "layout": recipe})


def matmul_cases(r):
    r.family = "matmul"
    shapes = [
        ([3], [3]), ([3], [3, 4]), ([2, 3], [3]), ([2, 3], [3, 4]), ([2, 2, 3], [3, 4]), ([2, 1, 3, 4], [3, 4, 5]),
        ([4, 3], [3, 0]), ([0, 3], [3, 2]), ([2, 0], [0, 3]), ([1, 1], [1, 1]), ([33, 17], [17, 29]),
        ([3, 2, 5], [5]), ([5], [2, 5, 3]),
    ]
    for dtype in FLOATS:
        for sa, sb in shapes:
            r.case("matmul", SHORT[dtype], f"{'x'.join(map(str, sa))}@{'x'.join(map(str, sb))}",
                   [make(sa, dtype), make(sb, dtype)])
    r.case("matmul", "f32", "64x64", [make([64, 64], "float32"), make([64, 64], "float32")])
    r.case("matmul", "f16", "48x64", [make([48, 64], "float16"), make([64, 40], "float16")])
    r.case("matmul", "f16_f32", "mixed", [make([3, 4], "float16"), make([4, 2], "float32")])
    r.case("matmul", "i32_f32", "mixed", [make([3, 4], "int32"), make([4, 2], "float32")])
    r.case("matmul", "i32", "ints", [make([3, 4], "int32"), make([4, 2], "int32")])
    base_a, rec_a = layout_for([5, 4], "transpose")
    base_b, rec_b = layout_for([4, 3], "transpose")
    r.case("matmul", "f32", "transpose_both", [make(base_a, "float32"), make(base_b, "float32")], {"layouts": [rec_a, rec_b]})
    base_b, rec_b = layout_for([4, 6], "slice_neg")
    r.case("matmul", "f32", "slice_neg", [make([3, 4], "float32"), make(base_b, "float32")], {"layouts": [None, rec_b]})
    base_a, rec_a = layout_for([2, 3, 4], "broadcast")
    r.case("matmul", "bf16", "broadcast", [make(base_a, "bfloat16"), make([2, 4, 2], "bfloat16")], {"layouts": [rec_a, None]})
    base_a, rec_a = layout_for([2, 3, 4], "transpose_last2")
    r.case("matmul", "f64", "transpose_last2", [make(base_a, "float64"), make([4, 2], "float64")], {"layouts": [rec_a, None]})
    r.case("matmul", "f32", "specials", [make([3, 4], "float32", specials=True), make([4, 2], "float32")])

    r.family = "addmm"
    for dtype in FLOATS:
        for sc, alpha, beta in [([3, 4], 1.0, 1.0), ([4], 0.5, 2.0), ([1, 4], 2.0, 0.0), ([], -1.0, 0.5)]:
            r.case("addmm", SHORT[dtype], f"c{'x'.join(map(str, sc)) or 's'}_a{alpha}_b{beta}",
                   [make(sc, dtype), make([3, 5], dtype), make([5, 4], dtype)], {"alpha": alpha, "beta": beta})
    r.case("addmm", "f32", "batched", [make([2, 3, 4], "float32"), make([2, 3, 5], "float32"), make([5, 4], "float32")],
           {"alpha": 1.5, "beta": 0.25})
    base, rec = layout_for([3, 5], "transpose")
    r.case("addmm", "f32", "transpose", [make([3, 4], "float32"), make(base, "float32"), make([5, 4], "float32")],
           {"alpha": 1.0, "beta": 1.0, "layouts": [None, rec, None]})


def creation_cases(r):
    r.family = "creation"
    for i, dtype in enumerate(DTYPES):
        shape = [[2, 3], [], [0], [4], [1, 2, 1]][i % 5]
        r.case("zeros", SHORT[dtype], "x".join(map(str, shape)) or "scalar", [], {"shape": shape, "dtype": dtype})
        r.case("ones", SHORT[dtype], "x".join(map(str, shape)) or "scalar", [], {"shape": shape, "dtype": dtype})
    for shape, value, dtype in [([2, 3], 1.5, None), ([2, 2], 7, None), ([3], True, None), ([2], 1.7, "int8"),
                                ([2, 2], 200, "uint8"), ([0, 3], 2.5, "float16"), ([3], 0.1, "bfloat16"),
                                ([2, 1], 3, "float64"), ([], 2, "bool")]:
        r.case("full", SHORT[dtype] if dtype else "default", f"{type(value).__name__}_{'x'.join(map(str, shape)) or 's'}",
               [], {"shape": shape, "value": value, "dtype": dtype})
    r.case("full", "f32", "array_value", [make([3], "float32")], {"shape": [2, 3], "dtype": None})
    r.case("full", "i32_f16", "array_value", [make([1, 2], "int32")], {"shape": [3, 2], "dtype": "float16"})
    for op, dtype, value in [("zeros_like", "float16", None), ("ones_like", "int8", None), ("ones_like", "bool", None),
                             ("full_like", "int8", 2.7), ("full_like", "float32", 3), ("full_like", "bfloat16", -1.5),
                             ("full_like", "uint16", True)]:
        base, recipe = layout_for([2, 3], "transpose")
        p = {"layout": recipe} if value is None else {"layout": recipe, "value": value}
        r.case(op, SHORT[dtype], "transpose", [make(base, dtype)], p)
    for start, stop, step, dtype in [(0, 10, 1, None), (0, 10, 3, None), (10, 0, -3, None), (0.0, 1.0, 0.1, None),
                                     (-1.5, 2.5, 0.5, None), (0, 5, 1, "float16"), (0, 5, 1, "bfloat16"), (0, 0, 1, None),
                                     (5, 0, 1, None), (0, 10, 2, "int8"), (0.5, 10, 1.5, "int32"), (1, 2, 0.25, "float64"),
                                     (3, 1000, 7, "int64"), (0, 3, 1, "uint32"), (-2.0, 2.0, 0.3, None),
                                     (0.0, 3.0, 0.1, "bfloat16"), (0.0, 2.0, 0.1, "float16"), (1.0, 0.0, -0.07, "float32")]:
        r.case("arange", SHORT[dtype] if dtype else "default", f"{start}_{stop}_{step}", [],
               {"start": start, "stop": stop, "step": step, "dtype": dtype})
    for start, stop, num, dtype in [(0, 1, 5, "float32"), (0, 1, 1, "float32"), (0, 1, 0, "float32"),
                                    (-3, 7, 11, "int32"), (1, 0, 4, "float32"), (0, 10, 7, "float16"),
                                    (0.5, 2.5, 9, "float64"), (-1, 1, 100, "bfloat16")]:
        r.case("linspace", SHORT[dtype], f"{start}_{stop}_{num}", [], {"start": start, "stop": stop, "num": num, "dtype": dtype})
    for n, m, k, dtype in [(3, None, 0, "float32"), (3, 4, 0, "int32"), (4, 3, 1, "float16"), (3, 3, -1, "bool"),
                           (3, 3, 5, "float32"), (0, None, 0, "float32"), (2, 5, -1, "uint8")]:
        r.case("eye", SHORT[dtype], f"{n}_{m}_{k}", [], {"n": n, "m": m, "k": k, "dtype": dtype})
    for n, m, k, dtype in [(3, None, 0, "float32"), (3, 4, 1, "int32"), (4, 3, -1, "float16"), (2, 2, 0, "bool"),
                           (3, 5, -4, "float32")]:
        r.case("tri", SHORT[dtype], f"{n}_{m}_{k}", [], {"n": n, "m": m, "k": k, "dtype": dtype})
    for n, dtype in [(0, "float32"), (1, "float32"), (4, "int32"), (3, "bool"), (3, "bfloat16")]:
        r.case("identity", SHORT[dtype], f"{n}", [], {"n": n, "dtype": dtype})


def record():
    r = Recorder()
    for family in (unary_cases, binary_cases, weak_scalar_cases, where_clip_cases, astype_cases, reduction_cases,
                   scan_cases, shape_cases, matmul_cases, creation_cases):
        reseed(family.__name__)
        family(r)
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=OUT_PATH)
    ap.add_argument("--check", action="store_true", help="fail if the file on disk differs")
    ap.add_argument("-v", "--verbose", action="store_true", help="list the combinations MLX rejected")
    args = ap.parse_args()
    mx.set_default_device(mx.cpu)
    r = record()
    data = r.serialize()
    for fam, n in r.families.items():
        print(f"{fam:>16}: {n}")
    defects = sum(why.startswith("MLX defect") for _, why in r.skipped)
    print(f"{'total':>16}: {len(r.cases)} cases, {len(data)} bytes; skipped {len(r.skipped) - defects} "
          f"calls MLX rejects and {defects} where MLX is defective (-v lists them)")
    if args.verbose:
        for name, why in r.skipped:
            print(f"  skipped {name}: {why}")
    write_or_check(args.out, data, "scripts/mlx_fixtures.py", args.check)


if __name__ == "__main__":
    main()
