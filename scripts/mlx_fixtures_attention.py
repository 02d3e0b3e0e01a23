#!/usr/bin/env python3
"""Record golden outputs and gradients of MLX's mx.fast.scaled_dot_product_attention on MLX's
CPU: decoding (one query row, and a few speculative rows), prefill and continued prefill,
multi-head, grouped-query and multi-query heads, head dims 32..128 (and a value head dim other
than the query's), no mask, the "causal" string mask, boolean and additive array masks that
broadcast, attention sinks, and sliding windows.

Run from the repository root (MLX and NumPy must be importable):

    python3 scripts/mlx_fixtures_attention.py          # writes crates/nuvec/tests/fixtures/attention.bin
    python3 scripts/mlx_fixtures_attention.py --check  # fails if regenerating would change the file

The replayer is crates/nuvec/tests/suite/mlx_attention.rs. The file format is
scripts/mlx_fixtures.py's. Shapes: q [B, Hq, Lq, D], k [B, Hkv, Lk, D], v [B, Hkv, Lk, Dv], out
[B, Hq, Lq, Dv]; Hq is a multiple of Hkv.
Params: {scale, mask: "none" | "causal" | "array" | "window", window (int with "window", else
null), sinks (bool), grad (bool)}.
Inputs: q, k, v, then the mask array (mask "array": boolean, or additive of q's dtype, broadcast
against [B, Hq, Lq, Lk]), then the sinks ([Hq], q's dtype) when sinks, then the cotangent of the
output when grad. Outputs: out, then (grad) the gradients MLX's vjp gives for q, k and v (the
mask and the sinks get none).
A "window" case is MLX called with the boolean mask in which query i attends key j iff
i + Lk - Lq - window < j <= i + Lk - Lq (causal with lower-right alignment, limited to the
`window` latest keys); MLX has no window argument, and the mask is not stored.
One boolean-mask case masks a whole row out: MLX fills masked scores with the dtype's lowest
finite value, so that row is the plain mean of the values (finite, not NaN).
"""

import argparse
import math
import os
import sys

import mlx.core as mx
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mlx_fixtures import encode_case, encode_file, write_or_check  # noqa: E402

SEED = 20261202
RECORDED_ON = "2026-12-02"
OUT = "crates/nuvec/tests/fixtures/attention.bin"
DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}

# (tag, B, Hq, Hkv, Lq, Lk, D, Dv, mask, window, sinks, grad, scale or None for 1/sqrt(D))
# mask: "none", "causal", "window", or for an array mask "bool2" ([Lq, Lk]), "bool4" ([B, 1,
# Lq, Lk]), "boolrow" ([Lq, Lk] with one row all False), "add4" ([B, Hq, Lq, Lk] additive),
# "add1" ([1, Hq, Lq, Lk] additive).
CASES = [
    # Decoding: one query row against 7, 64 and 300 keys; four speculative rows.
    ("decode/lk7/gqa/d128", 1, 4, 2, 1, 7, 128, 128, "none", None, False, True, None),
    ("decode/lk64/mqa", 1, 4, 1, 1, 64, 32, 32, "none", None, False, False, None),
    ("decode/lk300/mqa", 1, 2, 1, 1, 300, 32, 32, "none", None, False, False, None),
    ("spec/lq4lk37/causal/d80", 1, 4, 1, 4, 37, 80, 80, "causal", None, False, False, None),
    # Prefill and continued prefill.
    ("prefill/l16/mha/causal", 1, 2, 2, 16, 16, 32, 32, "causal", None, False, True, None),
    ("prefill/l16/gqa/none", 1, 4, 2, 16, 16, 32, 32, "none", None, False, True, None),
    ("prefill/l70/mqa/causal", 1, 2, 1, 70, 70, 32, 32, "causal", None, False, False, None),
    ("cont/lq5lk40/mqa/causal", 1, 4, 1, 5, 40, 32, 32, "causal", None, False, True, None),
    ("cont/lq5lk40/gqa/none", 1, 4, 2, 5, 40, 32, 32, "none", None, False, False, None),
    # A value head dim other than the query's; another scale.
    ("dv32/d64/causal", 1, 4, 2, 5, 9, 64, 32, "causal", None, False, True, None),
    ("scale0.5/l16", 1, 2, 1, 16, 16, 32, 32, "none", None, False, False, 0.5),
    # Array masks.
    ("mask/bool2", 2, 2, 1, 6, 11, 32, 32, "bool2", None, False, True, None),
    ("mask/bool4", 2, 2, 1, 3, 20, 32, 32, "bool4", None, False, False, None),
    ("mask/add4", 2, 2, 2, 5, 12, 32, 32, "add4", None, False, True, None),
    ("mask/add1/decode", 2, 2, 1, 1, 30, 32, 32, "add1", None, False, False, None),
    ("mask/boolrow", 1, 2, 1, 4, 8, 32, 32, "boolrow", None, False, False, None),
    # Attention sinks.
    ("sinks/decode/lk33", 1, 4, 1, 1, 33, 64, 64, "none", None, True, False, None),
    ("sinks/l8/causal", 2, 4, 1, 8, 8, 32, 32, "causal", None, True, True, None),
    ("sinks/lq3lk20/causal", 1, 2, 2, 3, 20, 32, 32, "causal", None, True, False, None),
    # Sliding windows.
    ("window1/l40", 1, 2, 1, 40, 40, 32, 32, "window", 1, False, False, None),
    ("window8/l40", 1, 2, 1, 40, 40, 32, 32, "window", 8, False, True, None),
    ("window1/decode/lk64", 1, 4, 1, 1, 64, 32, 32, "window", 1, False, False, None),
    ("window8/decode/lk64", 2, 4, 1, 1, 64, 32, 32, "window", 8, False, False, None),
    ("window8/l40/sinks", 1, 2, 1, 40, 40, 32, 32, "window", 8, True, False, None),
]


class Recorder:
    def __init__(self):
        self.rng = np.random.default_rng(SEED)
        self.cases = []

    def arr(self, shape, dtype, lo=-1.0, hi=1.0):
        return mx.array(self.rng.uniform(lo, hi, size=shape).astype(np.float32)).astype(dtype)

    def bools(self, shape, p_true=0.7):
        m = self.rng.uniform(0.0, 1.0, size=shape) < p_true
        m[..., -1] = True  # every row keeps a key
        return m

    def add(self, name, params, inputs, outputs):
        mx.eval(inputs, outputs)
        self.cases.append(encode_case(name, "scaled_dot_product_attention", params, inputs, outputs))


def window_mask(lq, lk, w):
    """Query i attends key j iff i + lk - lq - w < j <= i + lk - lq."""
    i = np.arange(lq)[:, None] + (lk - lq)
    j = np.arange(lk)[None, :]
    return mx.array((j <= i) & (j > i - w))


def record():
    rec = Recorder()
    for dname, dt in DTYPES.items():
        for tag, b, hq, hkv, lq, lk, d, dv, mask, window, sinks, grad, scale in CASES:
            scale = 1.0 / math.sqrt(d) if scale is None else scale
            q = rec.arr((b, hq, lq, d), dt)
            k = rec.arr((b, hkv, lk, d), dt)
            v = rec.arr((b, hkv, lk, dv), dt)
            stored = []
            if mask in ("none", "causal"):
                kind, m = mask, (None if mask == "none" else "causal")
            elif mask == "window":
                kind, m = "window", window_mask(lq, lk, window)
            else:
                kind = "array"
                if mask == "bool2":
                    m = mx.array(rec.bools((lq, lk)))
                elif mask == "bool4":
                    m = mx.array(rec.bools((b, 1, lq, lk)))
                elif mask == "boolrow":
                    mm = rec.bools((lq, lk))
                    mm[1, :] = False
                    m = mx.array(mm)
                elif mask == "add4":
                    m = rec.arr((b, hq, lq, lk), dt, -3.0, 1.0)
                elif mask == "add1":
                    m = rec.arr((1, hq, lq, lk), dt, -3.0, 1.0)
                else:
                    raise ValueError(mask)
                stored.append(m)
            s = rec.arr((hq,), dt, -1.0, 2.0) if sinks else None
            if sinks:
                stored.append(s)
            params = {"scale": scale, "mask": kind, "window": window, "sinks": sinks, "grad": grad}

            def f(q, k, v, m=m, s=s, scale=scale):
                return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=m, sinks=s)

            name = f"sdpa/{dname}/{tag}"
            out = f(q, k, v)
            if grad:
                cot = rec.arr(out.shape, out.dtype)
                _, grads = mx.vjp(lambda q, k, v: [f(q, k, v)], [q, k, v], [cot])
                rec.add(name, params, [q, k, v] + stored + [cot], [out] + list(grads))
            else:
                rec.add(name, params, [q, k, v] + stored, [out])
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    mx.set_default_device(mx.cpu)
    rec = record()
    data = encode_file("scripts/mlx_fixtures_attention.py", RECORDED_ON, SEED, rec.cases)
    print(f"{len(rec.cases)} cases, {len(data)} bytes")
    write_or_check(OUT, data, "scripts/mlx_fixtures_attention.py", args.check)


if __name__ == "__main__":
    main()
