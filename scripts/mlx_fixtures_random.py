#!/usr/bin/env python3
"""Record golden random numbers from real MLX: keys, splits, raw bits of every width and odd
sizes, and every distribution of mx.random for fixed keys.

Run from the repository root (MLX and NumPy must be importable):

    python3 scripts/mlx_fixtures_random.py          # writes crates/nuvec/tests/fixtures/random.bin
    python3 scripts/mlx_fixtures_random.py --check  # fails if regenerating would change the file

The replayer is crates/nuvec/tests/suite/mlx_random.rs. The file format is scripts/mlx_fixtures.py's.
Each case's inputs are the key (uint32[2]; absent for "key" and the "sequence" cases) followed
by the array arguments. Arguments in params are numbers or references to inputs:

    {"int": 3} / {"float": 0.5}   a Python scalar (MLX turns it into an int32 / float32 array)
    {"input": i}                  inputs[i]
    null                          not given (MLX's default)

Ops and their params (outputs: one array unless noted):

    key               {"seed"}  (a decimal string: seeds take 64 bits)  no inputs
    split             {"num"}
    bits              {"shape", "width"}
    uniform           {"low", "high", "shape", "dtype"}
    normal            {"shape", "dtype", "loc", "scale"}
    randint           {"low", "high", "shape", "dtype"}
    bernoulli         {"p", "shape"}
    truncated_normal  {"lower", "upper", "shape", "dtype"}
    gumbel            {"shape", "dtype"}
    laplace           {"shape", "dtype", "loc", "scale"}
    categorical       {"logits", "axis", "shape", "num_samples"}
    vmap_uniform      {"shape", "in_axis"}    inputs: keys (uint32[n, 2] or [2, n]); outputs:
                      vmap(lambda k: uniform(shape=shape, key=k), in_axes=in_axis)(keys)
    sequence          {"seed"}  no inputs; after mx.random.seed(seed), outputs: uniform((5,)),
                      normal((3,)), randint(0, 100, (4,)), categorical(logits [[0, 1, 2]]) each
                      drawing from the default key sequence

MLX's Python API has no `bits`: the raw-bits cases run MLX's own RandomBits primitive through an
exported function (mx.export_function of `split`, whose serialized state and output type are
rewritten to the wanted shape and width, then mx.import_function). The "split" cases record
`split` directly; widths 1 and 2 and odd sizes come only this way.
"""

import argparse
import os
import struct
import sys
import tempfile

import mlx.core as mx
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mlx_fixtures import encode_case, encode_file  # noqa: E402

SEED = 20261201
RECORDED_ON = "2026-12-01"
OUT = "crates/nuvec/tests/fixtures/random.bin"
DT = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16, "float64": mx.float64,
      "complex64": mx.complex64, "int32": mx.int32, "uint8": mx.uint8, "int64": mx.int64,
      "uint32": mx.uint32, "int8": mx.int8, "bool": mx.bool_}
SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64", "complex64": "c64",
         "int32": "i32", "uint8": "u8", "int64": "i64", "uint32": "u32", "int8": "i8", "bool": "b"}

# ---- raw bits through an exported RandomBits -------------------------------------------------

_MARK = 12345  # split(k, _MARK) serializes RandomBits(shape=[_MARK, 2], width=4)


class BitsRecorder:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="nuvec_random_")
        self.base = os.path.join(self.dir, "split.mlxfn")
        mx.export_function(self.base, lambda k: mx.random.split(k, _MARK), mx.random.key(0))
        with open(self.base, "rb") as f:
            self.template = f.read()
        self.shape_bytes = struct.pack("<Qii", 2, _MARK, 2)

    def __call__(self, shape, width, key):
        new_shape = struct.pack("<Q", len(shape)) + b"".join(struct.pack("<i", d) for d in shape)
        code = {1: 1, 2: 2, 4: 3}[width]  # Dtype::Val of uint8, uint16, uint32
        state = self.shape_bytes + struct.pack("<i", 4)
        out_type = self.shape_bytes + struct.pack("<iB", 3, 4)
        data = self.template
        assert data.count(state) == 1 and data.count(out_type) == 1, "unexpected export format"
        data = data.replace(state, new_shape + struct.pack("<i", width))
        data = data.replace(out_type, new_shape + struct.pack("<iB", code, width))
        path = os.path.join(self.dir, "bits.mlxfn")
        with open(path, "wb") as f:
            f.write(data)
        out = mx.import_function(path)(key)[0]
        mx.eval(out)
        assert out.shape == tuple(shape) and out.dtype == {1: mx.uint8, 2: mx.uint16, 4: mx.uint32}[width]
        return out


# ---- recording --------------------------------------------------------------------------------


class Writer:
    def __init__(self):
        self.rng = np.random.default_rng(SEED)
        self.cases = []
        self.names = set()

    def key(self):
        return mx.array(self.rng.integers(0, 2**32, size=2, dtype=np.uint64).astype(np.uint32))

    def normal(self, shape, dtype=np.float32):
        return mx.array(self.rng.standard_normal(shape).astype(dtype))

    def add(self, name, op, params, inputs, outputs):
        assert name not in self.names, name
        self.names.add(name)
        mx.eval(inputs, outputs)
        self.cases.append(encode_case(name, op, params, inputs, outputs))

    def serialize(self):
        return encode_file("scripts/mlx_fixtures_random.py", RECORDED_ON, SEED, self.cases)


class Args:
    """Arguments of one call: Python values for MLX, their descriptions for params."""

    def __init__(self, key):
        self.inputs = [key] if key is not None else []
        self.params = {}

    def scalar(self, name, v):
        self.params[name] = {"int": v} if isinstance(v, int) else {"float": v}
        return v

    def array(self, name, a):
        self.params[name] = {"input": len(self.inputs)}
        self.inputs.append(a)
        return a

    def none(self, name):
        self.params[name] = None
        return None


def keys_for(w):
    return [("k0", mx.random.key(0)), ("k1", mx.random.key(1)), ("kbig", mx.random.key(2**40 + 12345)),
            ("krand", w.key())]


def key_cases(w):
    for seed in [0, 1, 7, 2**32 - 1, 2**32, 2**40 + 12345, 2**64 - 1]:
        w.add(f"key/u32/{seed}", "key", {"seed": str(seed)}, [], [mx.random.key(seed)])
    for tag, k in keys_for(w):
        for num in [0, 1, 2, 3, 5, 16]:
            w.add(f"split/u32/{tag}_n{num}", "split", {"num": num}, [k], [mx.random.split(k, num)])


def bits_cases(w):
    rec = BitsRecorder()
    shapes = [[], [1], [2], [3], [4], [5], [6], [7], [8], [9], [13], [16], [17], [33], [2, 3], [3, 5], [4, 1, 3],
              [0], [2, 0], [1000], [7, 11]]
    for tag, k in keys_for(w):
        for width in (1, 2, 4):
            for shape in shapes:
                stag = "x".join(map(str, shape)) or "scalar"
                out = rec(shape, width, k)
                w.add(f"bits/w{width}/{tag}_{stag}", "bits", {"shape": shape, "width": width}, [k], [out])
    # Splitting through RandomBits equals split (checks the patching above).
    k = mx.random.key(3)
    assert mx.array_equal(rec([4, 2], 4, k), mx.random.split(k, 4)).item()


def uniform_cases(w):
    for dtype in ["float32", "float16", "bfloat16"]:
        for tag, k in keys_for(w)[:3]:
            for shape in [[], [1], [7], [3, 5], [64]]:
                a = Args(k)
                out = mx.random.uniform(a.scalar("low", 0.0), a.scalar("high", 1.0), shape, DT[dtype], key=k)
                w.add(f"uniform/{SHORT[dtype]}/{tag}_{'x'.join(map(str, shape)) or 'scalar'}", "uniform",
                      dict(a.params, shape=shape, dtype=dtype), a.inputs, [out])
        k = w.key()
        a = Args(k)
        out = mx.random.uniform(a.scalar("low", -2.5), a.scalar("high", 3), [4, 6], DT[dtype], key=k)
        w.add(f"uniform/{SHORT[dtype]}/bounds", "uniform", dict(a.params, shape=[4, 6], dtype=dtype), a.inputs, [out])
        a = Args(k)
        lo = a.array("low", w.normal([4, 1]))
        hi = a.array("high", w.normal([6]) + 4.0)
        out = mx.random.uniform(lo, hi, [4, 6], DT[dtype], key=k)
        w.add(f"uniform/{SHORT[dtype]}/array_bounds", "uniform", dict(a.params, shape=[4, 6], dtype=dtype),
              a.inputs, [out])


def normal_cases(w):
    for dtype in ["float32", "float16", "bfloat16", "float64", "complex64"]:
        for tag, k in keys_for(w)[:3]:
            for shape in [[], [5], [3, 7], [256]]:
                a = Args(k)
                out = mx.random.normal(shape, DT[dtype], a.none("loc"), a.none("scale"), key=k)
                w.add(f"normal/{SHORT[dtype]}/{tag}_{'x'.join(map(str, shape)) or 'scalar'}", "normal",
                      dict(a.params, shape=shape, dtype=dtype), a.inputs, [out])
        k = w.key()
        a = Args(k)
        out = mx.random.normal([4, 5], DT[dtype], a.scalar("loc", 1.5), a.scalar("scale", 0.25), key=k)
        w.add(f"normal/{SHORT[dtype]}/loc_scale", "normal", dict(a.params, shape=[4, 5], dtype=dtype), a.inputs, [out])
        if dtype != "complex64":
            a = Args(k)
            loc = a.array("loc", w.normal([5]))
            scale = a.array("scale", mx.abs(w.normal([4, 1])))
            out = mx.random.normal([4, 5], DT[dtype], loc, scale, key=k)
            w.add(f"normal/{SHORT[dtype]}/array_loc_scale", "normal", dict(a.params, shape=[4, 5], dtype=dtype),
                  a.inputs, [out])


def randint_cases(w):
    for dtype, lo, hi in [("int32", 0, 10), ("int32", -50, 50), ("uint8", 0, 256), ("int64", -3, 1000000),
                          ("int8", -128, 127), ("uint32", 5, 6), ("bool", 0, 2)]:
        for tag, k in keys_for(w)[:2]:
            a = Args(k)
            out = mx.random.randint(a.scalar("low", lo), a.scalar("high", hi), [5, 7], DT[dtype], key=k)
            w.add(f"randint/{SHORT[dtype]}/{tag}_{lo}_{hi}", "randint", dict(a.params, shape=[5, 7], dtype=dtype),
                  a.inputs, [out])
    k = w.key()
    a = Args(k)
    lo = a.array("low", mx.array([[-5], [0], [100]], dtype=mx.int32))
    hi = a.array("high", mx.array([1, 7, 1000, 2**20], dtype=mx.int32) + 100)
    out = mx.random.randint(lo, hi, [3, 4], mx.int32, key=k)
    w.add("randint/i32/array_bounds", "randint", dict(a.params, shape=[3, 4], dtype="int32"), a.inputs, [out])
    a = Args(k)
    out = mx.random.randint(a.scalar("low", 0.5), a.scalar("high", 9.5), [16], mx.int32, key=k)
    w.add("randint/i32/float_bounds", "randint", dict(a.params, shape=[16], dtype="int32"), a.inputs, [out])


def bernoulli_cases(w):
    for tag, k in keys_for(w):
        a = Args(k)
        out = mx.random.bernoulli(a.scalar("p", 0.3), [6, 9], key=k)
        w.add(f"bernoulli/b/{tag}_scalar", "bernoulli", dict(a.params, shape=[6, 9]), a.inputs, [out])
    k = w.key()
    a = Args(k)
    p = a.array("p", mx.array(np.linspace(0.0, 1.0, 11).astype(np.float32)))
    out = mx.random.bernoulli(p, key=k)
    a.params["shape"] = None
    w.add("bernoulli/b/array_p", "bernoulli", a.params, a.inputs, [out])
    a = Args(k)
    p = a.array("p", mx.array(np.array([0.1, 0.5, 0.9], dtype=np.float16)))
    out = mx.random.bernoulli(p, [4, 3], key=k)
    w.add("bernoulli/b/f16_p_shape", "bernoulli", dict(a.params, shape=[4, 3]), a.inputs, [out])
    a = Args(k)
    out = mx.random.bernoulli(a.scalar("p", 1.0), [8], key=k)
    w.add("bernoulli/b/p_one", "bernoulli", dict(a.params, shape=[8]), a.inputs, [out])


def truncated_normal_cases(w):
    for dtype in ["float32", "float16", "bfloat16"]:
        for tag, k in keys_for(w)[:2]:
            a = Args(k)
            out = mx.random.truncated_normal(a.scalar("lower", -1.0), a.scalar("upper", 2.0), [5, 6], DT[dtype], key=k)
            w.add(f"truncated_normal/{SHORT[dtype]}/{tag}", "truncated_normal",
                  dict(a.params, shape=[5, 6], dtype=dtype), a.inputs, [out])
    k = w.key()
    a = Args(k)
    lower = a.array("lower", mx.array([-3.0, -0.5, 0.0, 1.0], dtype=mx.float32))
    upper = a.array("upper", mx.array([[3.0], [0.5]], dtype=mx.float32))
    out = mx.random.truncated_normal(lower, upper, key=k)
    w.add("truncated_normal/f32/array_bounds", "truncated_normal", dict(a.params, shape=None, dtype="float32"),
          a.inputs, [out])


def gumbel_laplace_cases(w):
    for dtype in ["float32", "float16", "bfloat16"]:
        for tag, k in keys_for(w)[:2]:
            w.add(f"gumbel/{SHORT[dtype]}/{tag}", "gumbel", {"shape": [4, 9], "dtype": dtype}, [k],
                  [mx.random.gumbel([4, 9], DT[dtype], key=k)])
    for dtype in ["float32", "float16"]:
        for tag, k in keys_for(w)[:2]:
            w.add(f"laplace/{SHORT[dtype]}/{tag}", "laplace", {"shape": [3, 8], "dtype": dtype, "loc": 0.0,
                                                               "scale": 1.0}, [k],
                  [mx.random.laplace([3, 8], DT[dtype], 0.0, 1.0, key=k)])
        k = w.key()
        w.add(f"laplace/{SHORT[dtype]}/loc_scale", "laplace", {"shape": [10], "dtype": dtype, "loc": -1.0,
                                                               "scale": 3.0}, [k],
              [mx.random.laplace([10], DT[dtype], -1.0, 3.0, key=k)])


def categorical_cases(w):
    def case(tag, logits, axis=-1, shape=None, num_samples=None, key=None):
        k = key if key is not None else w.key()
        a = Args(k)
        a.array("logits", logits)
        out = mx.random.categorical(logits, axis, shape=shape, num_samples=num_samples, key=k)
        w.add(f"categorical/u32/{tag}", "categorical",
              dict(a.params, axis=axis, shape=shape, num_samples=num_samples), a.inputs, [out])

    case("rows", w.normal([6, 5]) * 2.0)
    case("axis0", w.normal([5, 6]), axis=0)
    case("middle_axis", w.normal([2, 7, 3]), axis=1)
    case("shape", w.normal([3, 4]), shape=[5, 3])
    case("num_samples", w.normal([3, 4]), num_samples=6)
    case("num_samples_axis0", w.normal([4, 3]), axis=0, num_samples=5)
    case("one_row_samples", w.normal([1, 10]), num_samples=50)
    case("vector_samples", w.normal([12]) * 3.0, num_samples=40)
    case("vector_shape", w.normal([9]), shape=[4, 5])
    case("vector", w.normal([9]))
    case("neg_inf", mx.array([[-np.inf, 0.0, 1.0, -np.inf], [2.0, -np.inf, -np.inf, 2.0]], dtype=mx.float32))
    case("inf_vector_samples", mx.array([np.inf, 0.0, np.inf, 1.0], dtype=mx.float32), num_samples=16)
    case("f16", w.normal([4, 8]).astype(mx.float16))
    for tag, k in keys_for(w)[:2]:
        case(f"{tag}_rows", w.normal([3, 11]), key=k)


def permutation_cases(w):
    for n in [1, 7, 100]:
        k = w.key()
        a = Args(k)
        w.add(f"permutation/u32/n{n}", "permutation", dict(a.params, n=n), a.inputs, [mx.random.permutation(n, key=k)])
    for tag, x, axis in [("rows", w.normal([6, 3]), 0), ("cols", w.normal([2, 9]), 1), ("neg_axis", w.normal([3, 2, 5]), -1)]:
        k = w.key()
        a = Args(k)
        a.array("x", x)
        w.add(f"permutation/f32/{tag}", "permutation_of", dict(a.params, axis=axis), a.inputs,
              [mx.random.permutation(x, axis=axis, key=k)])


def vmap_cases(w):
    k = mx.random.key(11)
    keys = mx.random.split(k, 4)
    f = lambda kk: mx.random.uniform(shape=(3,), key=kk)  # noqa: E731
    w.add("vmap_uniform/f32/axis0", "vmap_uniform", {"shape": [3], "in_axis": 0}, [keys], [mx.vmap(f)(keys)])
    kt = mx.contiguous(keys.T)
    w.add("vmap_uniform/f32/axis1", "vmap_uniform", {"shape": [3], "in_axis": 1}, [kt],
          [mx.vmap(f, in_axes=1)(kt)])
    g = lambda kk: mx.random.uniform(shape=(2, 5), key=kk)  # noqa: E731
    keys = mx.random.split(mx.random.key(12), 3)
    w.add("vmap_uniform/f32/matrix", "vmap_uniform", {"shape": [2, 5], "in_axis": 0}, [keys], [mx.vmap(g)(keys)])


def sequence_cases(w):
    for seed in [0, 42, 2**33 + 5]:
        mx.random.seed(seed)
        outs = [mx.random.uniform(shape=(5,)), mx.random.normal((3,)), mx.random.randint(0, 100, (4,)),
                mx.random.categorical(mx.array([[0.0, 1.0, 2.0]]))]
        w.add(f"sequence/f32/{seed}", "sequence", {"seed": str(seed)}, [], outs)


def record():
    w = Writer()
    for fam in (key_cases, bits_cases, uniform_cases, normal_cases, randint_cases, bernoulli_cases,
                truncated_normal_cases, gumbel_laplace_cases, categorical_cases, vmap_cases, sequence_cases,
                permutation_cases):
        fam(w)
    return w


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--check", action="store_true", help="fail if the file on disk differs")
    args = ap.parse_args()
    mx.set_default_device(mx.cpu)
    w = record()
    data = w.serialize()
    print(f"{len(w.cases)} cases, {len(data)} bytes")
    if args.check:
        with open(args.out, "rb") as f:
            if f.read() != data:
                sys.exit(f"{args.out} is stale: regenerate it with scripts/mlx_fixtures_random.py")
        print("up to date")
        return
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "wb") as f:
        f.write(data)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
