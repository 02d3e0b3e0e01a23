"""Writes blocks.gguf (random ggml blocks of each quantized type this reader knows, plain
tensors and metadata of every type) and blocks.npz (the gguf package's dequantization of each
tensor): python3 make_gguf.py, with numpy and gguf installed."""
import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

rng = np.random.default_rng(0)
w = gguf.GGUFWriter("blocks.gguf", "test")
w.add_uint8("t.u8", 7)
w.add_int8("t.i8", -7)
w.add_uint16("t.u16", 700)
w.add_int16("t.i16", -700)
w.add_uint32("t.u32", 70000)
w.add_int32("t.i32", -70000)
w.add_float32("t.f32", 0.25)
w.add_bool("t.bool", True)
w.add_string("t.str", "héllo")
w.add_array("t.arr", ["a", "bc"])
w.add_uint64("t.u64", 2**40)
w.add_int64("t.i64", -(2**40))
w.add_float64("t.f64", -0.125)
want = {}
# (name, type, rows, columns, byte offsets of the block's float16 scales)
for name, qt, rows, cols, scales in [
    ("q4_0", Q.Q4_0, 2, 64, [0]),
    ("q4_1", Q.Q4_1, 2, 64, [0, 2]),
    ("q8_0", Q.Q8_0, 3, 32, [0]),
    ("q4_k", Q.Q4_K, 2, 256, [0, 2]),
    ("q5_k", Q.Q5_K, 1, 512, [0, 2]),
    ("q6_k", Q.Q6_K, 2, 256, [208]),
    ("q5_0", Q.Q5_0, 2, 64, [0]),
    ("q5_1", Q.Q5_1, 2, 64, [0, 2]),
    ("q2_k", Q.Q2_K, 2, 256, [80, 82]),
    ("q3_k", Q.Q3_K, 2, 256, [108]),
]:
    block, size = gguf.GGML_QUANT_SIZES[qt]
    raw = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    for at in scales:
        raw[:, :, at : at + 2] = rng.uniform(-1, 1, size=(rows, cols // block)).astype(np.float16).view(np.uint8).reshape(rows, cols // block, 2)
    raw = raw.reshape(rows, -1)
    w.add_tensor(name, raw, raw_dtype=qt)
    want[name] = dequantize(raw, qt).astype(np.float32)
a = (np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5) / 4
w.add_tensor("f32", a)
w.add_tensor("f16", a.astype(np.float16))
bf = (a.view(np.uint32) >> 16).astype(np.uint16)
w.add_tensor("bf16", bf.view(np.uint8).reshape(2, 6), raw_dtype=Q.BF16)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
np.savez("blocks.npz", **want)
