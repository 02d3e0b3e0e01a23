#!/usr/bin/env python3
"""Record golden outputs of mlx-lm's gated delta rule (Gated DeltaNet's recurrence), the
reference nuvec's fast::gated_delta follows, on MLX's CPU.

Run from the repository root (MLX, mlx-lm and NumPy must be importable):

    python3 scripts/mlx_fixtures_gated_delta.py          # writes crates/nuvec/tests/fixtures/gated_delta.bin
    python3 scripts/mlx_fixtures_gated_delta.py --check  # fails if regenerating would change the file

The replayer is `gated_delta::mlx_gated_delta_ops_match` in crates/nuvec/tests/suite/gated_delta.rs.
The file format is scripts/mlx_fixtures.py's. Each case calls
mlx_lm.models.gated_delta.gated_delta_ops (the loop of operations; its Metal kernels do not exist
on the CPU build): inputs [q, k, v, g, beta, state?, mask?], outputs [y, state']. Params:
{"state": whether a state is given (else zeros), "mask": whether a [B, T] mask is the last
input}. Every state is float32, so MLX computes in float32 whatever the inputs' dtype, as nuvec
does.

Masked steps: mlx-lm's kernels write y = 0 there, and nuvec follows them; gated_delta_ops leaves
the step's unmasked output in y (only its state is masked), so the recorded y is zeroed at the
masked steps. The state is recorded as gated_delta_ops returns it.
"""

import argparse
import os
import sys

import mlx.core as mx
import numpy as np
from mlx_lm.models.gated_delta import gated_delta_ops

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mlx_fixtures import encode_case, encode_file, write_or_check  # noqa: E402

SEED = 20261205
RECORDED_ON = "2026-12-05"
OUT = "crates/nuvec/tests/fixtures/gated_delta.bin"
DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}

# (tag, dtype, B, T, Hk, Hv, Dk, Dv, per-channel gate, mask, state given)
CASES = [
    ("scalar_gate", "float32", 2, 5, 2, 2, 16, 8, False, False, True),
    ("channel_gate", "float32", 1, 6, 1, 2, 8, 12, True, False, False),
    ("masked", "float32", 3, 4, 1, 1, 8, 8, False, True, True),
    ("masked_channel_gate", "float32", 2, 5, 1, 2, 8, 4, True, True, True),
    ("grouped_4x", "float32", 1, 3, 2, 8, 32, 16, False, False, True),
    ("decode_dk128", "float32", 2, 1, 1, 2, 128, 16, False, False, True),
    ("scalar_gate", "bfloat16", 2, 7, 1, 2, 16, 8, False, False, True),
    ("channel_gate_masked", "bfloat16", 2, 4, 2, 4, 16, 8, True, True, True),
    ("scalar_gate", "float16", 1, 9, 1, 3, 8, 8, False, False, False),
]


def record():
    rng = np.random.default_rng(SEED)

    def arr(shape, lo, hi, dtype=mx.float32):
        return mx.array(rng.uniform(lo, hi, size=shape).astype(np.float32)).astype(dtype)

    cases = []
    for tag, dname, b, t, hk, hv, dk, dv, channel, masked, given in CASES:
        dt = DTYPES[dname]
        # Keys and queries of about unit norm, gates in (0.5, 1), as a trained model's are.
        a = (3.0 / dk) ** 0.5
        q, k = arr((b, t, hk, dk), -a, a, dt), arr((b, t, hk, dk), -a, a, dt)
        v = arr((b, t, hv, dv), -1.0, 1.0, dt)
        g = arr((b, t, hv, dk) if channel else (b, t, hv), 0.5, 1.0, dt)
        beta = arr((b, t, hv), 0.0, 1.0, dt)
        state = arr((b, hv, dv, dk), -0.5, 0.5) if given else None
        mask = None
        if masked:
            # Left padding of a different length per row (row 0 unpadded), and one hole.
            m = np.ones((b, t), dtype=bool)
            for i in range(1, b):
                m[i, : min(i, t - 1)] = False
            m[0, t // 2] = False
            mask = mx.array(m)
        y, s = gated_delta_ops(q, k, v, g, beta, state, mask)
        if mask is not None:
            y = mx.where(mask[:, :, None, None], y, mx.zeros_like(y))
        inputs = [q, k, v, g, beta] + ([state] if given else []) + ([mask] if masked else [])
        mx.eval(inputs, y, s)
        name = f"gated_delta_ops/{dname}/{tag}"
        cases.append(encode_case(name, "gated_delta_ops", {"state": given, "mask": masked}, inputs, [y, s]))
    return cases


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    cases = record()
    data = encode_file("scripts/mlx_fixtures_gated_delta.py", RECORDED_ON, SEED, cases)
    print(f"{len(cases)} cases, {len(data)} bytes")
    write_or_check(OUT, data, "scripts/mlx_fixtures_gated_delta.py", args.check)


if __name__ == "__main__":
    main()
