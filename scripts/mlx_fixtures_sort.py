#!/usr/bin/env python3
"""Record golden fixtures of nuvec's sorting operations (sort, argsort, partition,
argpartition, topk) from real MLX.

Run from the repository root (MLX and NumPy must be importable):

    python3 scripts/mlx_fixtures_sort.py            # writes crates/nuvec/tests/fixtures/sort.bin
    python3 scripts/mlx_fixtures_sort.py --check    # fails if regenerating would change the file

The file format, the input generators, the layout recipes and the recorder are those of
scripts/mlx_fixtures.py (imported from it). The replayer is crates/nuvec/tests/suite/mlx_sort.rs.

Parameters per op: sort/argsort {"axis": int or null}; partition/argpartition {"kth", "axis"};
topk {"k", "axis"}; plus the optional "layout" recipe of input 0.

MLX leaves the order inside a partition (and so of topk) to its backend (the CPU's
std::nth_element); the replayer checks those outputs by their defining properties against
MLX's, not element by element.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mlx.core as mx  # noqa: E402

import mlx_fixtures as base  # noqa: E402
from mlx_fixtures import DTYPES, FLOATS, SHORT, layout_for, make  # noqa: E402

OUT_PATH = os.path.join("crates", "nuvec", "tests", "fixtures", "sort.bin")
SORT_OPS = ("sort", "argsort", "partition", "argpartition", "topk")

core_run_op = base.run_op


def run_op(op, p, xs):
    if op in ("sort", "argsort"):
        return [getattr(mx, op)(xs[0], axis=p["axis"])]
    if op in ("partition", "argpartition"):
        return [getattr(mx, op)(xs[0], p["kth"], axis=p["axis"])]
    if op == "topk":
        return [mx.topk(xs[0], p["k"], axis=p["axis"])]
    return core_run_op(op, p, xs)


# The recorder looks the operation up in its module.
base.run_op = run_op


def domain(dtype):
    # Small integers give many ties, which is where stability shows.
    return "ties" if dtype != "bool" else "normal"


AXES = [([3, 4], -1), ([2, 3, 4], 1), ([7], None), ([2, 3, 4], 0), ([3, 5], None), ([4, 1], 1)]


def sort_cases(r):
    r.family = "sort"
    for op in ("sort", "argsort"):
        for i, dtype in enumerate(DTYPES):
            for j in range(2):
                shape, axis = AXES[(i + 3 * j) % len(AXES)]
                r.case(op, SHORT[dtype], f"axis{axis}_{j}", [make(shape, dtype, domain(dtype))], {"axis": axis})
            r.case(op, SHORT[dtype], "distinct", [make([3, 9], dtype, "wide")], {"axis": 1})
        for dtype in FLOATS:
            r.case(op, SHORT[dtype], "specials", [make([4, 9], dtype, "ties", specials=True)], {"axis": 1})
            r.case(op, SHORT[dtype], "specials_axis0", [make([9, 3], dtype, "normal", specials=True)], {"axis": 0})
        for kind in ("transpose", "slice_neg", "broadcast"):
            for axis in (0, -1):
                b, recipe = layout_for([4, 6], kind)
                r.case(op, "f32", f"{kind}_axis{axis}", [make(b, "float32", "ties")], {"axis": axis, "layout": recipe})
        b, recipe = layout_for([3, 4, 5], "transpose")
        r.case(op, "i32", "transpose3d", [make(b, "int32", "ties")], {"axis": 1, "layout": recipe})
        for shape, axis in (([0, 3], 0), ([0, 3], 1), ([2, 0], 1), ([1], 0), ([3, 1], 1), ([], None)):
            r.case(op, "f32", f"edge{shape}_{axis}", [make(shape, "float32")], {"axis": axis})
        r.case(op, "f32", "long", [make([2, 3000], "float32", "wide")], {"axis": 1})
        r.case(op, "i16", "long_ties", [make([5000], "int16", "ties")], {"axis": 0})


def partition_cases(r):
    r.family = "partition"
    for op in ("partition", "argpartition"):
        for i, dtype in enumerate(DTYPES):
            shape, axis = AXES[i % len(AXES)]
            n = 7 if axis is None and shape == [7] else (15 if axis is None else shape[axis])
            for kth in sorted({0, n // 2, n - 1, -1, -n}):
                r.case(op, SHORT[dtype], f"axis{axis}_k{kth}", [make(shape, dtype, domain(dtype))],
                       {"kth": kth, "axis": axis})
        for dtype in FLOATS:
            for kth in (0, 4, 8):
                r.case(op, SHORT[dtype], f"specials_k{kth}", [make([4, 9], dtype, "ties", specials=True)],
                       {"kth": kth, "axis": 1})
        for kind in ("transpose", "slice_neg"):
            b, recipe = layout_for([5, 6], kind)
            r.case(op, "f32", kind, [make(b, "float32", "ties")], {"kth": 2, "axis": 0, "layout": recipe})
        r.case(op, "f32", "size1", [make([3, 1], "float32")], {"kth": 0, "axis": 1})
        r.case(op, "f32", "empty_rows", [make([0, 4], "float32")], {"kth": 1, "axis": 1})
        r.case(op, "f32", "long", [make([2, 3000], "float32", "wide")], {"kth": 1234, "axis": 1})


def topk_cases(r):
    r.family = "topk"
    for i, dtype in enumerate(DTYPES):
        shape, axis = AXES[i % len(AXES)]
        n = 7 if axis is None and shape == [7] else (15 if axis is None else shape[axis])
        for k in sorted({0, 1, n // 2, n}):
            r.case("topk", SHORT[dtype], f"axis{axis}_k{k}", [make(shape, dtype, domain(dtype))], {"k": k, "axis": axis})
    for dtype in FLOATS:
        r.case("topk", SHORT[dtype], "specials", [make([4, 9], dtype, "ties", specials=True)], {"k": 3, "axis": 1})
    b, recipe = layout_for([5, 6], "transpose")
    r.case("topk", "f32", "transpose", [make(b, "float32")], {"k": 2, "axis": 0, "layout": recipe})
    r.case("topk", "f32", "long", [make([2, 5000], "float32", "wide")], {"k": 50, "axis": 1})
    r.case("topk", "f32", "empty_k0", [make([2, 0], "float32")], {"k": 0, "axis": 1})


def record():
    r = base.Recorder("scripts/mlx_fixtures_sort.py")
    for family in (sort_cases, partition_cases, topk_cases):
        base.reseed(family.__name__)
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
    print(f"{'total':>16}: {len(r.cases)} cases, {len(data)} bytes; skipped {len(r.skipped)} (-v lists them)")
    if args.verbose:
        for name, why in r.skipped:
            print(f"  skipped {name}: {why}")
    base.write_or_check(args.out, data, "scripts/mlx_fixtures_sort.py", args.check)


if __name__ == "__main__":
    main()
