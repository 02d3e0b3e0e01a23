"""PyTorch's side of crates/nuvec/examples/bench_quant.rs, under the same case names.

    python3 bench/quant_peers.py [--only SUBSTRING] > quant_peers.tsv

Lines `name<TAB>value<TAB>unit<TAB>impl`:

* `gemv_bf16_M{m}_K{k}_N{n}` and `mm_bf16_M{m}_K{k}_N{n}`: `x @ w.T` in bf16 (cuBLAS), as
  GB/s (decoding, the bytes bench_quant counts) and TFLOP/s (prefill);
* `qmv_bf16_b4_M{m}_K{k}_N{n}` and `qmm_bf16_b4_M{m}_K{k}_N{n}`: `torch._weight_int4pack_mm`
  (tinygemm: 4-bit weights, a bf16 scale and zero per group of 64) where this PyTorch has it,
  counted with bench_quant's bytes for 4 bits (so the GB/s compare directly);
* `decode_bf16_B{b}_Lk{lk}`, and under each `paged_decode_bf16_B{b}_Lk{lk}_bs{bs}` name the
  same figure: `F.scaled_dot_product_attention` (`enable_gqa`) of one query of 32 heads over the
  contiguous cache of 8 heads, GB/s of the bytes bench_quant counts (the paged kernel's target
  is less time than this).

The timing is bench/gpu_peers.py's (`Timer`); weights rotate among copies as bench_quant's do.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_peers import L2_FLOOR, Timer, copy_ceiling_gbs, emit, log, random  # noqa: E402

SHAPES = [(4096, 4096), (4096, 14336), (14336, 4096), (4096, 128256)]
GROUP = 64
PAGED = [(1, 1024), (1, 32768), (8, 8192), (32, 8192), (64, 4096), (64, 16384)]


def copies_for(nbytes):
    l2 = max(torch.cuda.get_device_properties(0).L2_cache_size, L2_FLOOR)
    return max(1, min(8, -(-3 * l2 // max(nbytes, 1))))


def int4_weight(k, n, seed):
    """tinygemm's packed weight and scales-and-zeros for a random [n, k] weight, or None."""
    w = random((n, k), torch.bfloat16, seed) * 0.05
    g = w.float().reshape(n, k // GROUP, GROUP)
    lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    scale = ((hi - lo) / 15).clamp(min=1e-6)
    q = ((g - lo) / scale).round().clamp(0, 15).to(torch.int32).reshape(n, k)
    packed_u8 = (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)
    wp = torch.ops.aten._convert_weight_to_int4pack(packed_u8, 8)
    # tinygemm's zero is the value of level 8: lo + 8 * scale.
    zero = lo + 8 * scale
    sz = torch.cat([scale, zero], dim=-1).reshape(n, k // GROUP, 2).transpose(0, 1).contiguous().to(torch.bfloat16)
    return wp, sz


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default=None)
    args = ap.parse_args()
    want = lambda name: args.only is None or args.only in name  # noqa: E731
    timer = Timer(float(os.environ.get("NUVEC_BENCH_BATCH_MS", 100)), int(os.environ.get("NUVEC_BENCH_BATCHES", 5)), 3)
    dev = torch.cuda.get_device_name(0)
    log(f"# torch {torch.__version__} on {dev}")
    emit(f"ceiling_copy_memcpy\t{copy_ceiling_gbs(timer):.4f}\tGB/s\ttorch_copy")
    int4 = hasattr(torch.ops.aten, "_weight_int4pack_mm")
    for k, n in SHAPES:
        for m in (1, 4, 8):
            io = (m * k + m * n) * 2
            name = f"gemv_bf16_M{m}_K{k}_N{n}"
            if want(name):
                c = copies_for(k * n * 2)
                ws = [random((n, k), torch.bfloat16, 40 + j) for j in range(c)]
                x = random((m, k), torch.bfloat16, 3)
                t = timer.time(lambda i: x @ ws[i % c].T)[0]
                emit(f"{name}\t{(k * n * 2 + io) / t / 1e9:.4f}\tGB/s\ttorch_bf16")
                del ws
            name = f"qmv_bf16_b4_M{m}_K{k}_N{n}"
            if int4 and want(name):
                try:
                    c = copies_for(k * n // 2)
                    ws = [int4_weight(k, n, 10 + j) for j in range(c)]
                    x = random((m, k), torch.bfloat16, 3)
                    t = timer.time(lambda i: torch.ops.aten._weight_int4pack_mm(x, ws[i % c][0], GROUP, ws[i % c][1]))[0]
                    nbytes = k * n // 2 + 2 * 2 * n * (k // GROUP) + io
                    emit(f"{name}\t{nbytes / t / 1e9:.4f}\tGB/s\ttorch_int4pack")
                    del ws
                except Exception as e:  # noqa: BLE001  (a PyTorch without the kernel for this case)
                    log(f"# {name}: int4pack failed: {str(e).splitlines()[0][:200]}")
            torch.cuda.empty_cache()
    for k, n in SHAPES:
        for m in (512, 2048, 8192):
            flops = 2.0 * m * k * n
            name = f"mm_bf16_M{m}_K{k}_N{n}"
            if want(name):
                w = random((n, k), torch.bfloat16, 50)
                x = random((m, k), torch.bfloat16, 4)
                t = timer.time(lambda i: x @ w.T)[0]
                emit(f"{name}\t{flops / t / 1e12:.4f}\tTFLOP/s\ttorch_bf16")
                del w, x
            name = f"qmm_bf16_b4_M{m}_K{k}_N{n}"
            if int4 and want(name):
                try:
                    wp, sz = int4_weight(k, n, 60)
                    x = random((m, k), torch.bfloat16, 4)
                    t = timer.time(lambda i: torch.ops.aten._weight_int4pack_mm(x, wp, GROUP, sz))[0]
                    emit(f"{name}\t{flops / t / 1e12:.4f}\tTFLOP/s\ttorch_int4pack")
                    del wp, sz, x
                except Exception as e:  # noqa: BLE001
                    log(f"# {name}: int4pack failed: {str(e).splitlines()[0][:200]}")
            torch.cuda.empty_cache()

    for b, lk in PAGED:
        names = [f"decode_bf16_B{b}_Lk{lk}"] + [f"paged_decode_bf16_B{b}_Lk{lk}_bs{bs}" for bs in (16, 64)]
        if not any(want(n) for n in names):
            continue
        qb, kvb = b * 32 * 128 * 2, b * 8 * lk * 128 * 2
        c = copies_for(2 * kvb)
        q = random((b, 32, 1, 128), torch.bfloat16, 700)
        ks = [random((b, 8, lk, 128), torch.bfloat16, 710 + j) for j in range(c)]
        vs = [random((b, 8, lk, 128), torch.bfloat16, 720 + j) for j in range(c)]
        sdpa = torch.nn.functional.scaled_dot_product_attention
        t = timer.time(lambda i: sdpa(q, ks[i % c], vs[i % c], scale=128 ** -0.5, enable_gqa=True))[0]
        for n in names:
            emit(f"{n}\t{(2 * kvb + 2 * qb) / t / 1e9:.4f}\tGB/s\ttorch_sdpa")
        del ks, vs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
