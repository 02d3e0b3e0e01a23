#!/usr/bin/env python3
"""Record golden fixtures of nuvec's convolutions and tensor contractions from real MLX.

Run from the repository root (MLX and NumPy must be importable):

    python3 scripts/mlx_fixtures_conv.py            # writes crates/nuvec/tests/fixtures/conv.bin
    python3 scripts/mlx_fixtures_conv.py --check    # fails if regenerating would change the file

The file format, the deterministic input streams and the recorder are those of
scripts/mlx_fixtures.py; the replayer is crates/nuvec/tests/suite/mlx_conv.rs.

Operations and their params:
    conv1d, conv2d, conv3d   {"stride", "padding", "dilation": per-axis lists, "groups"}
    conv_general             {"stride", "padding_lo", "padding_hi", "kernel_dilation",
                              "input_dilation": per-axis lists, "groups", "flip"}
    einsum                   {"subscripts"}
    tensordot                {"axes": int, or [axes of a, axes of b]}
    outer, inner             {}
"""

import argparse
import os
import sys

import mlx.core as mx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mlx_fixtures as F  # noqa: E402

RECORDED_ON = "2026-12-02"
OUT_PATH = os.path.join("crates", "nuvec", "tests", "fixtures", "conv.bin")
HALF_AND_WIDE = ["float16", "bfloat16", "float64"]


def run_op(op, p, xs):
    if op in ("conv1d", "conv2d", "conv3d"):
        one = op == "conv1d"
        arg = (lambda v: v[0]) if one else tuple
        f = getattr(mx, op)
        return [f(xs[0], xs[1], stride=arg(p["stride"]), padding=arg(p["padding"]),
                  dilation=arg(p["dilation"]), groups=p["groups"])]
    if op == "conv_general":
        return [mx.conv_general(xs[0], xs[1], stride=p["stride"], padding=(p["padding_lo"], p["padding_hi"]),
                                kernel_dilation=p["kernel_dilation"], input_dilation=p["input_dilation"],
                                groups=p["groups"], flip=p["flip"])]
    if op == "einsum":
        return [mx.einsum(p["subscripts"], *xs)]
    if op == "tensordot":
        return [mx.tensordot(xs[0], xs[1], axes=p["axes"])]
    if op == "outer":
        return [mx.outer(xs[0], xs[1])]
    if op == "inner":
        return [mx.inner(xs[0], xs[1])]
    raise ValueError(op)


def conv_case(r, op, dtype, x_shape, w_shape, stride, padding, dilation, groups):
    x, w = F.make(x_shape, dtype), F.make(w_shape, dtype)
    tag = "x{}_w{}_s{}_p{}_d{}_g{}".format(
        "x".join(map(str, x_shape)), "x".join(map(str, w_shape)),
        "-".join(map(str, stride)), "-".join(map(str, padding)), "-".join(map(str, dilation)), groups)
    r.case(op, F.SHORT[dtype], tag, [x, w],
           {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups})


def conv1d_cases(r):
    # A grid over the geometry in float32, with ordinary, grouped and depthwise weights.
    for stride in (1, 2, 3):
        for padding in (0, 1, 3):
            for dilation in (1, 2):
                for groups, c_out in ((1, 5), (2, 4), (6, 6)):
                    conv_case(r, "conv1d", "float32", [2, 9, 6], [c_out, 3, 6 // groups],
                              [stride], [padding], [dilation], groups)
    # Gated DeltaNet's short convolution: depthwise, kernel 4, causal padding done by hand.
    conv_case(r, "conv1d", "float32", [2, 12, 16], [16, 4, 1], [1], [3], [1], 16)
    conv_case(r, "conv1d", "float32", [1, 1, 8], [8, 1, 1], [1], [0], [1], 8)
    conv_case(r, "conv1d", "float32", [3, 7, 4], [8, 2, 1], [1], [1], [1], 4)  # channel multiplier 2
    conv_case(r, "conv1d", "float32", [0, 7, 4], [3, 2, 4], [1], [0], [1], 1)  # empty batch
    conv_case(r, "conv1d", "float32", [1, 20, 3], [2, 20, 3], [1], [0], [1], 1)  # kernel as long as input
    for dtype in HALF_AND_WIDE:
        conv_case(r, "conv1d", dtype, [2, 9, 6], [4, 3, 6], [2], [1], [1], 1)
        conv_case(r, "conv1d", dtype, [2, 9, 6], [4, 3, 3], [1], [2], [2], 2)
        conv_case(r, "conv1d", dtype, [2, 12, 16], [16, 4, 1], [1], [3], [1], 16)


def conv2d_cases(r):
    for stride in ([1, 1], [2, 1]):
        for padding in ([0, 0], [1, 2]):
            for dilation in ([1, 1], [1, 2]):
                for groups, c_out in ((1, 3), (2, 4), (4, 4)):
                    conv_case(r, "conv2d", "float32", [2, 7, 6, 4], [c_out, 3, 2, 4 // groups],
                              stride, padding, dilation, groups)
    for dtype in HALF_AND_WIDE:
        conv_case(r, "conv2d", dtype, [1, 6, 5, 4], [3, 3, 3, 4], [1, 2], [1, 1], [1, 1], 1)
        conv_case(r, "conv2d", dtype, [1, 6, 5, 4], [4, 3, 3, 1], [1, 1], [1, 1], [2, 1], 4)
    conv_case(r, "conv3d", "float32", [1, 4, 5, 3, 2], [3, 2, 3, 2, 2], [1, 2, 1], [1, 0, 1], [1, 1, 2], 1)
    conv_case(r, "conv3d", "float32", [2, 3, 4, 4, 4], [4, 2, 2, 2, 2], [1, 1, 1], [0, 1, 0], [1, 1, 1], 2)


def conv_general_cases(r):
    def case(dtype, x_shape, w_shape, **p):
        full = {"stride": [1], "padding_lo": [0], "padding_hi": [0], "kernel_dilation": [1],
                "input_dilation": [1], "groups": 1, "flip": False}
        full.update(p)
        tag = "x{}_w{}_".format("x".join(map(str, x_shape)), "x".join(map(str, w_shape))) + "_".join(
            f"{k}{v}" for k, v in sorted(p.items())).replace(" ", "")
        r.case("conv_general", F.SHORT[dtype], tag, [F.make(x_shape, dtype), F.make(w_shape, dtype)], full)

    case("float32", [2, 10, 6], [6, 4, 1], padding_lo=[3], groups=6)  # causal depthwise
    case("float32", [2, 8, 3], [4, 3, 3], padding_lo=[2], padding_hi=[0], stride=[2])
    case("float32", [2, 8, 3], [4, 3, 3], padding_lo=[-1], padding_hi=[-2])
    case("float32", [2, 6, 3], [4, 3, 3], input_dilation=[2], padding_lo=[1], padding_hi=[1])
    case("float32", [2, 6, 3], [4, 3, 3], flip=True, kernel_dilation=[2])
    case("float32", [1, 5, 6, 4], [2, 3, 2, 2], groups=2, input_dilation=[2, 1], padding_lo=[1, 0],
         padding_hi=[0, 2], flip=True, stride=[1, 2])
    case("float64", [1, 6, 5, 2], [3, 2, 2, 2], input_dilation=[1, 3], padding_lo=[0, 1], padding_hi=[2, 0],
         kernel_dilation=[2, 1])
    case("bfloat16", [2, 9, 4], [4, 3, 1], padding_lo=[2], groups=4, flip=True)


EINSUM = [
    ("ij,jk->ik", [[3, 4], [4, 5]]),
    ("bij,bjk->bik", [[2, 3, 4], [2, 4, 5]]),
    ("bhqd,bhkd->bhqk", [[2, 3, 4, 8], [2, 3, 5, 8]]),
    ("bhqk,bhkd->bhqd", [[2, 3, 4, 5], [2, 3, 5, 8]]),
    ("bqhd,bkhd->bhqk", [[2, 4, 3, 8], [2, 5, 3, 8]]),
    ("ij->ji", [[3, 4]]),
    ("ii->i", [[4, 4]]),
    ("ii->", [[4, 4]]),
    ("ii", [[4, 4]]),
    ("iij->ji", [[3, 3, 2]]),
    ("ijij->ij", [[2, 3, 2, 3]]),
    ("ij->", [[3, 4]]),
    ("ij->j", [[3, 4]]),
    ("ijk->kj", [[2, 3, 4]]),
    ("i,i->", [[5], [5]]),
    ("i,i", [[5], [5]]),
    ("i,j->ij", [[3], [4]]),
    ("i,j", [[3], [4]]),
    ("j,i", [[3], [4]]),
    ("ij,ij->ij", [[3, 4], [3, 4]]),
    ("ij,ij->", [[3, 4], [3, 4]]),
    ("ij,ij->i", [[3, 4], [3, 4]]),
    ("ij,j->i", [[3, 4], [4]]),
    ("j,ij->i", [[4], [3, 4]]),
    ("ij,kj->ik", [[3, 4], [5, 4]]),
    ("ij,jk", [[3, 4], [4, 5]]),
    ("ba", [[3, 4]]),
    ("iI->Ii", [[3, 4]]),
    ("ij,jk,kl->il", [[2, 3], [3, 4], [4, 5]]),
    ("ij,jk,kl->", [[2, 3], [3, 4], [4, 5]]),
    ("i,j,k->ijk", [[2], [3], [4]]),
    ("ab,cd->abcd", [[2, 3], [4, 2]]),
    ("bij,jk->bik", [[2, 3, 4], [4, 5]]),
    ("btd,de->bte", [[2, 3, 4], [4, 6]]),
    ("bsd,bs->bd", [[2, 5, 3], [2, 5]]),
    ("ij,ij->ij", [[3, 1], [3, 4]]),
    ("ij,j->ij", [[3, 1], [3]]),
    ("...ij,...jk->...ik", [[2, 1, 3, 4], [5, 4, 2]]),
    ("...ij,...jk", [[2, 3, 4], [2, 4, 5]]),
    ("...,...", [[3], [2, 1]]),
    ("i...->...", [[3, 2, 2]]),
    ("...i->...", [[3, 2, 4]]),
    ("...ii->...i", [[3, 2, 2]]),
    ("b...d,bd->b...", [[2, 3, 4, 5], [2, 5]]),
    ("i...j,j...->i...", [[2, 3, 4], [4, 3]]),
    ("->", [[]]),
    (",->", [[], []]),
    ("i,->i", [[3], []]),
    ("ijk,ikl->jl", [[3, 2, 4], [3, 4, 5]]),
    ("abc,cba->ab", [[2, 3, 4], [4, 3, 2]]),
    ("ii,i->i", [[3, 3], [3]]),
    ("ij,ij,ij->ij", [[2, 3], [2, 3], [2, 3]]),
    ("ij,jk->ik", [[0, 4], [4, 5]]),
    ("ij,jk->ik", [[3, 0], [0, 5]]),
]


def einsum_cases(r):
    for subscripts, shapes in EINSUM:
        tag = subscripts + ":" + ";".join("x".join(map(str, s)) for s in shapes)
        r.case("einsum", "f32", tag, [F.make(s, "float32") for s in shapes], {"subscripts": subscripts})
    for dtype in HALF_AND_WIDE:
        for subscripts, shapes in (EINSUM[2], EINSUM[7], EINSUM[37]):
            tag = subscripts + ":" + ";".join("x".join(map(str, s)) for s in shapes)
            r.case("einsum", F.SHORT[dtype], tag, [F.make(s, dtype) for s in shapes], {"subscripts": subscripts})
    # Mixed dtypes promote.
    r.case("einsum", "f16_f32", "ij,jk->ik", [F.make([3, 4], "float16"), F.make([4, 2], "float32")],
           {"subscripts": "ij,jk->ik"})


def product_cases(r):
    for axes, sa, sb in (
        (1, [2, 3], [3, 4]),
        (2, [2, 3, 4], [3, 4, 5]),
        (0, [2, 3], [4]),
        ([[1], [0]], [2, 3], [3, 4]),
        ([[-1], [0]], [2, 3], [3, 4]),
        ([[0, 2], [2, 0]], [3, 4, 5], [5, 2, 3]),
        ([[1, 0], [0, 1]], [3, 4], [4, 3]),
        ([[], []], [2], [3]),
    ):
        tag = "{}:{};{}".format(axes, "x".join(map(str, sa)), "x".join(map(str, sb))).replace(" ", "")
        r.case("tensordot", "f32", tag, [F.make(sa, "float32"), F.make(sb, "float32")], {"axes": axes})
    r.case("tensordot", "f64", "2", [F.make([2, 3, 4], "float64"), F.make([3, 4, 2], "float64")], {"axes": 2})
    for sa, sb in (([3], [4]), ([2, 3], [4]), ([], [3]), ([2], [2, 2])):
        tag = "{};{}".format("x".join(map(str, sa)), "x".join(map(str, sb)))
        r.case("outer", "f32", tag, [F.make(sa, "float32"), F.make(sb, "float32")])
        r.case("outer", "i32", tag, [F.make(sa, "int32"), F.make(sb, "int32")])
    for sa, sb in (([4], [4]), ([2, 3], [4, 3]), ([], [2, 3]), ([2, 3, 4], [4])):
        tag = "{};{}".format("x".join(map(str, sa)), "x".join(map(str, sb)))
        r.case("inner", "f32", tag, [F.make(sa, "float32"), F.make(sb, "float32")])
    r.case("inner", "bf16", "4;4", [F.make([4], "bfloat16"), F.make([4], "bfloat16")])


def record():
    r = F.Recorder("scripts/mlx_fixtures_conv.py")
    for family in (conv1d_cases, conv2d_cases, conv_general_cases, einsum_cases, product_cases):
        F.reseed(family.__name__)
        r.family = family.__name__
        family(r)
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=OUT_PATH)
    ap.add_argument("--check", action="store_true", help="fail if the file on disk differs")
    ap.add_argument("-v", "--verbose", action="store_true", help="list the combinations MLX rejected")
    args = ap.parse_args()
    mx.set_default_device(mx.cpu)
    F.run_op = run_op
    F.RECORDED_ON = RECORDED_ON
    r = record()
    data = r.serialize()
    for fam, n in r.families.items():
        print(f"{fam:>20}: {n}")
    print(f"{'total':>20}: {len(r.cases)} cases, {len(data)} bytes; skipped {len(r.skipped)} (-v lists them)")
    if args.verbose:
        for name, why in r.skipped:
            print(f"  skipped {name}: {why}")
    F.write_or_check(args.out, data, "scripts/mlx_fixtures_conv.py", args.check)


if __name__ == "__main__":
    main()
