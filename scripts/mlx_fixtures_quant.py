#!/usr/bin/env python3
"""Record golden quantization fixtures from real MLX: quantize, dequantize, quantized_matmul and
its gradients, for every mode, bit width, group size and float dtype.

Run from the repository root (MLX and NumPy must be importable):

    python3 scripts/mlx_fixtures_quant.py          # writes crates/nuvec/tests/fixtures/quant.bin
    python3 scripts/mlx_fixtures_quant.py --check  # fails if regenerating would change the file

The replayer is crates/nuvec/tests/suite/mlx_quant.rs. The file format is scripts/mlx_fixtures.py's;
each case's "op" and params say what ran (params: mode, group_size, bits, and per op below):

    quantize          inputs: w;  outputs: w_q, scales, [biases,] dequantize(w_q, ...) in the
                      default dtype (MLX's round trip, also checking dequantize)
    dequantize        inputs: w_q (random words), scales, [biases];  params: dtype (or null);
                      outputs: the dequantized weights
    quantized_matmul  inputs: x, w_q, scales, [biases];  params: transpose;  outputs: the product
    qmm_vjp           inputs: x, w_q, scales, [biases], cotangent;  params: transpose;
                      outputs: the product, then the gradients wrt x, scales, biases
"""

import argparse
import os
import sys

import mlx.core as mx
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mlx_fixtures import encode_case, encode_file  # noqa: E402

SEED = 20261201
RECORDED_ON = "2026-12-01"
OUT = "crates/nuvec/tests/fixtures/quant.bin"

FLOATS = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
FP_MODES = {"mxfp4": (32, 4), "mxfp8": (32, 8), "nvfp4": (16, 4)}


class Writer:
    def __init__(self):
        self.rng = np.random.default_rng(SEED)
        self.cases = []
        self.names = set()

    def weights(self, shape, group_size):
        """Rows of different character: zero-centred, positive only, negative only, wide
        magnitude range across groups, plus an all-zero group and a constant group."""
        rows, k = int(np.prod(shape[:-1])), shape[-1]
        v = self.rng.standard_normal((rows, k)).astype(np.float32) * 0.05
        if rows > 1:
            v[1] = np.abs(v[1]) * 20 + 0.5
        if rows > 2:
            v[2] = -np.abs(v[2]) * 3 - 0.01
        if rows > 3:
            groups = k // group_size
            v[3] *= np.repeat(np.exp2(self.rng.integers(-12, 8, size=groups)).astype(np.float32), group_size)
        v[0, :group_size] = 0.0
        if k >= 2 * group_size:
            v[0, group_size:2 * group_size] = 0.3
        return v.reshape(shape)

    def add(self, name, op, params, inputs, outputs):
        assert name not in self.names, name
        self.names.add(name)
        mx.eval(inputs, outputs)
        self.cases.append(encode_case(name, op, params, inputs, outputs))

    def serialize(self):
        return encode_file("scripts/mlx_fixtures_quant.py", RECORDED_ON, SEED, self.cases)


def quantize_cases(w):
    for dname, dt in FLOATS.items():
        for bits in (2, 3, 4, 5, 6, 8):
            for gs in (32, 64, 128):
                x = mx.array(w.weights([4, 256], gs)).astype(dt)
                outs = list(mx.quantize(x, group_size=gs, bits=bits, mode="affine"))
                outs.append(mx.dequantize(*outs, group_size=gs, bits=bits, mode="affine"))
                params = {"mode": "affine", "group_size": gs, "bits": bits}
                w.add(f"quantize/affine/{SHORT[dname]}/b{bits}g{gs}", "quantize", params, [x], outs)
        for mode, (gs, bits) in FP_MODES.items():
            x = mx.array(w.weights([4, 256], gs)).astype(dt)
            outs = list(mx.quantize(x, mode=mode))
            outs.append(mx.dequantize(*outs, mode=mode))
            params = {"mode": mode, "group_size": gs, "bits": bits}
            w.add(f"quantize/{mode}/{SHORT[dname]}", "quantize", params, [x], outs)
    # Leading batch axes.
    x = mx.array(w.weights([2, 3, 64], 32))
    outs = list(mx.quantize(x, group_size=32, bits=3))
    outs.append(mx.dequantize(*outs, group_size=32, bits=3))
    w.add("quantize/affine/f32/batched_b3g32", "quantize", {"mode": "affine", "group_size": 32, "bits": 3}, [x], outs)


def dequantize_cases(w):
    """Every bit pattern: random packed words with random scales (and biases)."""
    for dname, dt in FLOATS.items():
        for bits in (2, 3, 4, 5, 6, 8):
            gs = 64
            rows, k = 3, 128
            wq = mx.array(w.rng.integers(0, 2**32, size=(rows, k * bits // 32), dtype=np.uint32))
            s = mx.array(w.rng.standard_normal((rows, k // gs)).astype(np.float32)).astype(dt)
            b = mx.array(w.rng.standard_normal((rows, k // gs)).astype(np.float32)).astype(dt)
            out = mx.dequantize(wq, s, b, group_size=gs, bits=bits)
            params = {"mode": "affine", "group_size": gs, "bits": bits, "dtype": None}
            w.add(f"dequantize/affine/{SHORT[dname]}/b{bits}", "dequantize", params, [wq, s, b], [out])
    for mode, (gs, bits) in FP_MODES.items():
        rows, k = 3, 128
        wq = mx.array(w.rng.integers(0, 2**32, size=(rows, k * bits // 32), dtype=np.uint32))
        if mode == "nvfp4":
            codes = w.rng.integers(0, 127, size=(rows, k // gs))
        else:
            codes = w.rng.integers(100, 150, size=(rows, k // gs))
        s = mx.array(codes.astype(np.uint8))
        for dname in (None, "float32", "float16"):
            out = mx.dequantize(wq, s, mode=mode, dtype=FLOATS[dname] if dname else None)
            params = {"mode": mode, "group_size": gs, "bits": bits, "dtype": dname}
            tag = SHORT[dname] if dname else "default"
            w.add(f"dequantize/{mode}/{tag}", "dequantize", params, [wq, s], [out])


def qmm_cases(w):
    combos = [("affine", 64, 4), ("affine", 32, 3), ("affine", 128, 8), ("affine", 64, 6)]
    combos += [(m, gs, b) for m, (gs, b) in FP_MODES.items()]
    for mode, gs, bits in combos:
        for dname, dt in FLOATS.items():
            for transpose in (True, False):
                # The quantized axis (the last of w) holds 128 elements either way.
                n, k = (48, 128) if transpose else (128, 48)
                wshape = [n, k] if transpose else [k, n]
                wf = mx.array(w.weights(wshape, gs)).astype(dt)
                q = list(mx.quantize(wf, group_size=gs, bits=bits, mode=mode))
                x = mx.array(w.rng.standard_normal((2, 3, k)).astype(np.float32)).astype(dt)
                y = mx.quantized_matmul(x, *q[:2], q[2] if len(q) > 2 else None, transpose=transpose,
                                        group_size=gs, bits=bits, mode=mode)
                params = {"mode": mode, "group_size": gs, "bits": bits, "transpose": transpose}
                t = "t" if transpose else "n"
                w.add(f"quantized_matmul/{mode}/{SHORT[dname]}/b{bits}g{gs}{t}", "quantized_matmul", params,
                      [x] + q, [y])
    # Gradients (affine, f32): wrt x, scales and biases.
    for transpose in (True, False):
        n, k, gs, bits = (16, 64, 32, 4) if transpose else (64, 16, 32, 4)
        wf = mx.array(w.weights([n, k] if transpose else [k, n], gs))
        wq, s, b = mx.quantize(wf, group_size=gs, bits=bits)
        x = mx.array(w.rng.standard_normal((5, k)).astype(np.float32))
        cot = mx.array(w.rng.standard_normal((5, n)).astype(np.float32))

        def f(x, s, b):
            return mx.quantized_matmul(x, wq, s, b, transpose=transpose, group_size=gs, bits=bits)

        outs, grads = mx.vjp(lambda x, s, b: [f(x, s, b)], [x, s, b], [cot])
        params = {"mode": "affine", "group_size": gs, "bits": bits, "transpose": transpose}
        w.add(f"qmm_vjp/affine/f32/{'t' if transpose else 'n'}", "qmm_vjp", params, [x, wq, s, b, cot],
              outs + list(grads))


def record():
    w = Writer()
    quantize_cases(w)
    dequantize_cases(w)
    qmm_cases(w)
    return w


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    mx.set_default_device(mx.cpu)
    w = record()
    data = w.serialize()
    if args.check:
        with open(OUT, "rb") as fh:
            if fh.read() != data:
                sys.exit(f"{OUT} is out of date")
        print("up to date")
        return
    with open(OUT, "wb") as fh:
        fh.write(data)
    print(f"wrote {OUT}: {len(w.cases)} cases, {len(data)} bytes")


if __name__ == "__main__":
    main()
