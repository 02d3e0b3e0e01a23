"""Writes this directory's fixtures with NumPy and the safetensors package (the files nuvec-io's
tests read): python3 make_fixtures.py, with numpy and safetensors installed."""
import json

import numpy as np
from safetensors.numpy import save_file

a = np.arange(12, dtype=np.float32).reshape(3, 4) / 8 - 0.5
save_file(
    {
        "f32": a,
        "f16": a.astype(np.float16),
        "i64": np.arange(-3, 3, dtype=np.int64),
        "u8": np.arange(5, dtype=np.uint8) * 50,
        "bool": np.array([True, False, True]),
        "scalar": np.array(2.5, dtype=np.float64),
    },
    "numpy.safetensors",
    metadata={"format": "np", "note": "fixture"},
)
# A checkpoint in two shards and its index.
save_file({"a.weight": a, "a.bias": np.arange(4, dtype=np.float32)}, "shard-1.safetensors")
save_file({"b.weight": a.T.copy()}, "shard-2.safetensors")
with open("shards.safetensors.index.json", "w") as f:
    json.dump(
        {
            "metadata": {"total_size": 0},
            "weight_map": {
                "a.weight": "shard-1.safetensors",
                "a.bias": "shard-1.safetensors",
                "b.weight": "shard-2.safetensors",
            },
        },
        f,
        indent=1,
    )
np.savez_compressed(
    "numpy.npz",
    f16=a.astype(np.float16),
    i32=np.arange(-4, 4, dtype=np.int32),
    c64=(a[0] + 1j * a[1]).astype(np.complex64),
    fortran=np.asfortranarray(a.astype(np.float64)),
    big=np.arange(6, dtype=">i4").reshape(2, 3),
    empty=np.zeros((0, 3), dtype=np.float32),
)
np.save("fortran.npy", np.asfortranarray(np.arange(24, dtype=np.int16).reshape(2, 3, 4)))
