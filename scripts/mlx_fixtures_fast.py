#!/usr/bin/env python3
"""Record golden outputs and gradients of MLX's fused operations (mx.fast.rms_norm,
mx.fast.layer_norm, mx.fast.rope) and of the compositions nuvec fuses (residual add + RMS norm,
SwiGLU, cross entropy), on MLX's CPU.

Run from the repository root (MLX and NumPy must be importable):

    python3 scripts/mlx_fixtures_fast.py          # writes crates/nuvec/tests/fixtures/fast.bin
    python3 scripts/mlx_fixtures_fast.py --check  # fails if regenerating would change the file

The replayer is crates/nuvec/tests/suite/mlx_fast.rs. The file format is
scripts/mlx_fixtures.py's. Each case's inputs are the operation's arrays followed by the
cotangent of its (first, or for add_rms_norm both) output(s); the outputs are the forward
result(s) followed by the gradients MLX's vjp gives for every floating input, in order.
Params: rms_norm {eps, weight}; layer_norm {eps, weight, bias}; add_rms_norm {eps, weight};
rope {dims, traditional, base (null with freqs), scale, offset (null with an array offset
input), freqs}; swiglu {}; cross_entropy {} (integer targets are an input, no gradient).
"""

import argparse
import os
import sys

import mlx.core as mx
import mlx.nn as nn
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mlx_fixtures import encode_case, encode_file, write_or_check  # noqa: E402

SEED = 20261201
RECORDED_ON = "2026-12-01"
OUT = "crates/nuvec/tests/fixtures/fast.bin"
DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
# Rows of 1..4099 features, some not multiples of 8.
ROWS = [(1, 1), (3, 7), (4, 33), (2, 256), (2, 4099)]


class Recorder:
    def __init__(self):
        self.rng = np.random.default_rng(SEED)
        self.cases = []

    def arr(self, shape, dtype, lo=-2.0, hi=2.0):
        return mx.array(self.rng.uniform(lo, hi, size=shape).astype(np.float32)).astype(dtype)

    def add(self, name, op, params, inputs, outputs):
        mx.eval(inputs, outputs)
        self.cases.append(encode_case(name, op, params, inputs, outputs))


def vjp_case(rec, name, op, params, f, arrays, float_idx, extra_inputs=()):
    """Records f(*arrays), its cotangent and the gradients of the inputs at `float_idx`."""
    outs = f(*arrays)
    outs = list(outs) if isinstance(outs, tuple) else [outs]
    cots = [rec.arr(o.shape, o.dtype, -1.0, 1.0) for o in outs]

    def g(*fl):
        a = list(arrays)
        for i, v in zip(float_idx, fl):
            a[i] = v
        r = f(*a)
        return list(r) if isinstance(r, tuple) else [r]

    _, grads = mx.vjp(g, [arrays[i] for i in float_idx], cots)
    rec.add(name, op, params, list(arrays) + list(extra_inputs) + cots, outs + list(grads))


def record():
    rec = Recorder()
    for dname, dt in DTYPES.items():
        for rows, d in ROWS:
            x = rec.arr((rows, d), dt)
            w = rec.arr((d,), dt, 0.5, 1.5)
            b = rec.arr((d,), dt, -0.5, 0.5)
            for weighted in (True, False):
                p = {"eps": 1e-5, "weight": weighted}
                tag = f"{dname}/{rows}x{d}/{'w' if weighted else 'plain'}"
                if weighted:
                    vjp_case(rec, f"rms_norm/{tag}", "rms_norm", p,
                             lambda x, w: mx.fast.rms_norm(x, w, 1e-5), [x, w], [0, 1])
                else:
                    vjp_case(rec, f"rms_norm/{tag}", "rms_norm", p,
                             lambda x: mx.fast.rms_norm(x, None, 1e-5), [x], [0])
            for weighted, biased in ((True, True), (False, False), (True, False), (False, True)):
                p = {"eps": 1e-5, "weight": weighted, "bias": biased}
                arrays = [x] + ([w] if weighted else []) + ([b] if biased else [])

                def ln(*a, weighted=weighted, biased=biased):
                    ww = a[1] if weighted else None
                    bb = a[-1] if biased else None
                    return mx.fast.layer_norm(a[0], ww, bb, 1e-5)

                vjp_case(rec, f"layer_norm/{dname}/{rows}x{d}/{int(weighted)}{int(biased)}", "layer_norm", p, ln,
                         arrays, list(range(len(arrays))))
            r = rec.arr((rows, d), dt)
            vjp_case(rec, f"add_rms_norm/{dname}/{rows}x{d}", "add_rms_norm", {"eps": 1e-5, "weight": True},
                     lambda x, r, w: (x + r, mx.fast.rms_norm(x + r, w, 1e-5)), [x, r, w], [0, 1, 2])
            u = rec.arr((rows, d), dt)
            vjp_case(rec, f"swiglu/{dname}/{rows}x{d}", "swiglu", {},
                     lambda g, u: nn.silu(g) * u, [rec.arr((rows, d), dt, -5.0, 5.0), u], [0, 1])
            t = mx.array(rec.rng.integers(0, d, size=(rows,)).astype(np.int32))
            logits = rec.arr((rows, d), dt, -4.0, 4.0)
            # nuvec's loss is float32 whatever the logits: MLX's, computed in float32, to compare.
            vjp_case(rec, f"cross_entropy/{dname}/{rows}x{d}", "cross_entropy", {},
                     lambda lg, t: nn.losses.cross_entropy(lg.astype(mx.float32), t, reduction="none"),
                     [logits, t], [0])
        # RoPE: (shape, dims, traditional, base or None for freqs, scale, offset or per-batch list)
        for shape, dims, trad, base, scale, offset in [
            ((1, 4, 5, 64), 64, False, 10000.0, 1.0, 0),
            ((2, 3, 7, 80), 32, False, 10000.0, 1.0, 3),
            ((1, 2, 3, 8), 8, True, 500.0, 0.5, 7),
            ((2, 2, 4, 16), 16, False, 1e6, 2.0, [5, 100]),
            ((1, 2, 6, 24), 16, True, None, 1.0, 2),
            ((3, 8, 12), 6, False, 10000.0, 1.0, [0, 4, 9]),
        ]:
            x = rec.arr(shape, dt)
            freqs = mx.array(np.linspace(1.0, 40.0, dims // 2).astype(np.float32)) if base is None else None
            off = mx.array(np.array(offset, dtype=np.int32)) if isinstance(offset, list) else offset
            p = {"dims": dims, "traditional": trad, "base": base, "scale": scale,
                 "offset": None if isinstance(offset, list) else offset, "freqs": base is None}
            extra = ([off] if isinstance(offset, list) else []) + ([freqs] if freqs is not None else [])

            def rope(x, base=base, dims=dims, trad=trad, scale=scale, off=off, freqs=freqs):
                return mx.fast.rope(x, dims, traditional=trad, base=base, scale=scale, offset=off, freqs=freqs)

            vjp_case(rec, f"rope/{dname}/{'x'.join(map(str, shape))}/{dims}/{int(trad)}", "rope", p, rope, [x], [0],
                     extra_inputs=extra)
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    rec = record()
    data = encode_file("scripts/mlx_fixtures_fast.py", RECORDED_ON, SEED, rec.cases)
    print(f"{len(rec.cases)} cases")
    write_or_check(OUT, data, "scripts/mlx_fixtures_fast.py", args.check)


if __name__ == "__main__":
    main()
