#!/usr/bin/env python3
"""Record golden fixtures of nuvec's gathers, scatters and indexing from real MLX.

Run from the repository root (MLX and NumPy must be importable):

    python3 scripts/mlx_fixtures_gather.py            # writes crates/nuvec/tests/fixtures/gather.bin
    python3 scripts/mlx_fixtures_gather.py --check    # fails if regenerating would change the file

The file format is the one of scripts/mlx_fixtures.py (reader: crates/nuvec/tests/suite/fixture.rs);
the replayer is crates/nuvec/tests/suite/mlx_gather.rs. Ops and their params:

    take              inputs (x, indices)             {"axis": int or null}
    take_along_axis   inputs (x, indices)             {"axis": int or null}
    put_along_axis    inputs (x, indices, values)     {"axis": int or null}
    gather_mm         inputs (a, b[, lhs][, rhs])     {"lhs": bool, "rhs": bool}
    index             inputs (x, arrays...)           {"index": [entry, ...]}
    at_<op>           inputs (x, value, arrays...)    {"index": [entry, ...]}   op in set add
                                                      subtract multiply maximum minimum
    entry: {"int": i} | {"slice": [start|null, stop|null, step|null]} | "ellipsis" | "newaxis"
           | {"array": k}  (k-th array input after the fixed ones)

MLX leaves out-of-range array indices undefined, so recorded indices are in range (negatives
included); nuvec's own out-of-range rules are tested in the replay file.
"""

import argparse
import itertools
import os
import sys
import zlib

import mlx.core as mx
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mlx_fixtures import encode_case, encode_file  # noqa: E402

SEED = 20261201
RECORDED_ON = "2026-12-01"
OUT_PATH = os.path.join("crates", "nuvec", "tests", "fixtures", "gather.bin")


class Rec:
    def __init__(self):
        self.cases = []
        self.names = set()
        self.rng = np.random.default_rng(SEED)

    def reseed(self, name):
        self.rng = np.random.default_rng([SEED, zlib.crc32(name.encode())])

    def vals(self, shape, dtype="float32"):
        if dtype.startswith("float") or dtype == "bfloat16":
            return mx.array(self.rng.standard_normal(shape).astype(np.float32)).astype(getattr(mx, dtype))
        return mx.array(self.rng.integers(-50, 50, size=shape).astype(np.int32)).astype(getattr(mx, dtype))

    def idx(self, shape, n, dtype="int32", negative=True):
        v = self.rng.integers(0, max(n, 1), size=shape)
        if negative and n > 0:
            flip = self.rng.random(size=np.shape(v)) < 0.4
            v = np.where(flip, v - n, v)
        return mx.array(np.asarray(v).astype(np.int64)).astype(getattr(mx, dtype))

    def case(self, op, tag, params, inputs, fn):
        name = f"{op}/{tag}"
        assert name not in self.names, name
        self.reseed(name)
        out = fn(*inputs)
        mx.eval(out)
        self.names.add(name)
        self.cases.append(encode_case(name, op, params, inputs, [out]))

    def serialize(self):
        return encode_file("scripts/mlx_fixtures_gather.py", RECORDED_ON, SEED, self.cases)


def to_py_index(entries, arrays):
    out = []
    for e in entries:
        if e == "ellipsis":
            out.append(Ellipsis)
        elif e == "newaxis":
            out.append(None)
        elif "int" in e:
            out.append(e["int"])
        elif "slice" in e:
            out.append(slice(*e["slice"]))
        else:
            out.append(arrays[e["array"]])
    return tuple(out)


def take_cases(r):
    for dtype in ["float32", "int32", "float16", "bool", "int64", "uint8"]:
        for shape, ishape, axis in [([5], [3], 0), ([3, 4], [2, 3], 1), ([3, 4], [5], None), ([2, 3, 4], [], 1),
                                    ([2, 3, 4], [2, 2], -1), ([4, 3], [0], 0), ([3, 0], [2], 0)]:
            x = (r.vals(shape, "int32") > 0) if dtype == "bool" else r.vals(shape, dtype)
            n = int(np.prod(shape)) if axis is None else shape[axis]
            for idt in ["int32", "uint32", "int64", "int16"]:
                i = r.idx(ishape, n, idt, negative=not idt.startswith("u"))
                tag = f"{dtype}/{idt}/{shape}_{ishape}_{axis}".replace(" ", "")
                r.case("take", tag, {"axis": axis}, [x, i], lambda x, i: mx.take(x, i, axis=axis))
    for shape, ishape, axis in [([3, 4], [3, 2], 1), ([3, 4], [1, 4], 0), ([3, 4], [2, 1], 0), ([2, 3, 4], [2, 3, 5], 2),
                                ([1, 4], [3, 2], 1), ([6], [6], None), ([3, 4], [3, 0], 1), ([2, 3, 4], [2, 1, 4], 1)]:
        x = r.vals(shape)
        n = shape[axis] if axis is not None else int(np.prod(shape))
        i = r.idx(ishape, n)
        r.case("take_along_axis", f"{shape}_{ishape}_{axis}".replace(" ", ""), {"axis": axis}, [x, i],
               lambda x, i: mx.take_along_axis(x, i, axis=axis))
        v = r.vals(ishape)
        # Plain puts with repeated indices have no defined winner: keep them unique per line.
        if axis is not None:
            if ishape[axis] > n:
                continue
            perm_shape = [n if d == axis % len(shape) else ishape[d] for d in range(len(shape))]
            perms = np.argsort(r.rng.random(size=perm_shape), axis=axis)
            ui = mx.array(np.take(perms, range(ishape[axis]), axis=axis).astype(np.int32) - n)
        else:
            ui = mx.array(r.rng.permutation(n)[: ishape[0]].astype(np.int32))
        r.case("put_along_axis", f"{shape}_{ishape}_{axis}".replace(" ", ""), {"axis": axis}, [x, ui, v],
               lambda x, i, v: mx.put_along_axis(x, i, v, axis=axis))
    # Scalar and broadcast values.
    x = r.vals([3, 4])
    i = mx.array([[0], [3], [1]])
    r.case("put_along_axis", "scalar_value", {"axis": 1}, [x, i, mx.array(7.5)],
           lambda x, i, v: mx.put_along_axis(x, i, v, axis=1))


def gather_mm_cases(r):
    for ashape, bshape, lhs, rhs in [([1, 1, 4], [3, 4, 5], None, [2, 0, 1, 2]), ([4, 2, 3], [3, 3, 2], [3, 0], [1, 2]),
                                     ([2, 3, 4], [2, 4, 2], None, None), ([5, 1, 3], [4, 3, 2], [[0, 1], [4, 2]], [[3], [0]])]:
        a, b = r.vals(ashape), r.vals(bshape)
        ins = [a, b] + ([mx.array(lhs)] if lhs is not None else []) + ([mx.array(rhs)] if rhs is not None else [])
        params = {"lhs": lhs is not None, "rhs": rhs is not None}

        def f(*xs, lhs=lhs, rhs=rhs):
            k = 2
            li = ri = None
            if lhs is not None:
                li, k = xs[k], k + 1
            if rhs is not None:
                ri = xs[k]
            return mx.gather_mm(xs[0], xs[1], li, ri)
        r.case("gather_mm", f"{ashape}_{bshape}_{lhs}_{rhs}".replace(" ", ""), params, ins, f)


def S(a=None, b=None, c=None):
    return {"slice": [a, b, c]}


INDEX_CASES = [
    # (shape, entries, array shapes (with the axis size each indexes))
    ([5], [{"int": 2}], []),
    ([5], [{"int": -1}], []),
    ([2, 3, 4], [{"int": 1}, {"int": -2}], []),
    ([2, 3, 4], [S(None, None, -1)], []),
    ([2, 3, 4], [S(), S(1, None), S(None, None, 2)], []),
    ([2, 3, 4], [S(-2, -10, -1), {"int": 0}], []),
    ([2, 3, 4], ["ellipsis", {"int": 1}], []),
    ([2, 3, 4], ["newaxis", {"int": 0}, "ellipsis", "newaxis"], []),
    ([2, 3, 4], [S(5, 9)], []),
    ([7], [S(1, 6, 3)], []),
    ([3, 4], [{"array": 0}], [([2, 2], 3)]),
    ([3, 4], [S(), {"array": 0}], [([5], 4)]),
    ([2, 3, 4], [S(), {"array": 0}, {"array": 1}], [([2], 3), ([2], 4)]),
    ([2, 3, 4], [{"array": 0}, S(), {"array": 1}], [([2], 2), ([3, 1], 4)]),
    ([2, 3, 4], [{"array": 0}, "newaxis", {"array": 1}], [([2], 2), ([2], 3)]),
    ([2, 3, 4], [{"int": 0}, S(), {"array": 0}], [([2], 4)]),
    ([2, 3, 4], [S(), {"int": 1}, {"array": 0}], [([2], 4)]),
    ([2, 3, 4], ["newaxis", {"array": 0}], [([2], 2)]),
    ([2, 3, 4], ["ellipsis", {"array": 0}, "newaxis"], [([2], 3)]),
    ([2, 3, 4], [{"array": 0}, "ellipsis", {"array": 1}], [([2], 2), ([2], 4)]),
    ([2, 3, 4], [S(), {"array": 0}, "newaxis", {"array": 1}], [([2], 3), ([2], 4)]),
    ([2, 3, 4], [{"array": 0}, S(1, None), {"int": 0}], [([2], 2)]),
    ([2, 3, 4], [S(None, None, -1), {"array": 0}, S(None, None, 2)], [([3, 2], 3)]),
    ([2, 3, 4], [{"array": 0}, {"array": 1}, {"array": 2}], [([4], 2), ([4], 3), ([1], 4)]),
    ([4, 5], [{"array": 0}], [([0], 4)]),
    ([6], [{"array": 0}], [([], 6)]),
]

UPDATE_OPS = ["set", "add", "subtract", "multiply", "maximum", "minimum"]


def index_cases(r):
    for k, (shape, entries, arrs) in enumerate(INDEX_CASES):
        x = r.vals(shape)
        arrays = [r.idx(s, n) for s, n in arrs]
        tag = f"{k}"
        r.case("index", tag, {"index": entries}, [x] + arrays,
               lambda x, *a, e=entries: x[to_py_index(e, a)])
        out_shape = x[to_py_index(entries, arrays)].shape
        for op in UPDATE_OPS:
            # Repeated positions have no defined winner for plain sets: give sets unique indices.
            if op == "set" and arrays:
                arrays_u = [mx.array(np.arange(-1, -int(np.prod(s)) - 1, -1).reshape(s) % n) if int(np.prod(s)) <= n
                            else None for s, n in arrs]
                if any(a is None for a in arrays_u) or len(arrays_u) > 1:
                    continue
                ins_arrays = arrays_u
            else:
                ins_arrays = arrays
            def f(x, v, *a, e=entries, op=op):
                ix = to_py_index(e, a)
                if op == "set":
                    y = mx.array(x)
                    y[ix] = v
                    return y
                return getattr(x.at[ix], op)(v)
            # MLX's updates treat integers as plain indices even beside arrays (its reads count
            # them as arrays), so the value's shape may be a permutation of the read's.
            for full in [out_shape] + [list(p) for p in itertools.permutations(out_shape)]:
                vshape = list(full[1:]) if len(full) > 1 and k % 2 == 0 else list(full)
                v = r.vals(vshape)
                try:
                    mx.eval(f(x, v, *ins_arrays))
                    break
                except ValueError:
                    continue
            r.case(f"at_{op}", tag, {"index": entries}, [x, v] + ins_arrays, f)
    # Integer data and a scalar value.
    x = r.vals([3, 4], "int32")
    i = mx.array([1, 1, -1])
    r.case("at_add", "int_dup", {"index": [{"array": 0}, S(1, 3)]}, [x, mx.array(3), i],
           lambda x, v, i: x.at[i, 1:3].add(v))


def record():
    r = Rec()
    take_cases(r)
    gather_mm_cases(r)
    index_cases(r)
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=OUT_PATH)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    mx.set_default_device(mx.cpu)
    data = record().serialize()
    if args.check:
        with open(args.out, "rb") as f:
            if f.read() != data:
                sys.exit(f"{args.out} is stale: regenerate it with scripts/mlx_fixtures_gather.py")
        print("up to date")
        return
    with open(args.out, "wb") as f:
        f.write(data)
    print(f"wrote {args.out}: {len(data)} bytes")


if __name__ == "__main__":
    main()
