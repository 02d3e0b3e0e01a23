// Random bits: MLX's threefry2x32 draws, byte for byte as the CPU backend lays them out
// (nuvec_core::primitive::random::fill_key_bytes): each key fills `bytes_per_key` bytes read as
// w = ceil(bytes / 4) little-endian words; counter (j, j + h + odd) gives words j and
// j + h + odd for j < h = w / 2, and when w is odd counter (h, 0) gives word h. The last word
// is cut to the bytes that remain.
#pragma once
#include "common.cuh"

__device__ __forceinline__ uint2 threefry2x32(u32 k0, u32 k1, u32 c0, u32 c1) {
  const u32 rot[2][4] = {{13, 15, 26, 6}, {17, 29, 16, 24}};
  u32 ks[3] = {k0, k1, k0 ^ k1 ^ 0x1BD11BDAu};
  u32 x = c0 + ks[0], y = c1 + ks[1];
#pragma unroll
  for (int i = 0; i < 5; ++i) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      x += y;
      y = __funnelshift_l(y, y, rot[i % 2][r]) ^ x;
    }
    x += ks[(i + 1) % 3];
    y += ks[(i + 2) % 3] + (u32)(i + 1);
  }
  return make_uint2(x, y);
}

// Word `word` of a key's block, cut to the block's end.
__device__ __forceinline__ void put_word(u8* __restrict__ block, u64 bytes, u64 word, u32 v) {
  u64 start = word * 4;
  if (start + 4 <= bytes && (bytes & 3) == 0) {
    *reinterpret_cast<u32*>(block + start) = v;
    return;
  }
  for (u64 b = 0; b < 4 && start + b < bytes; ++b) block[start + b] = (u8)(v >> (8 * b));
}

// One thread per (key, counter): keys are row-major uint32 pairs.
extern "C" __global__ void random_bits(const u32* __restrict__ keys, u8* __restrict__ out, u64 n_keys,
                                       u64 bytes_per_key) {
  u64 words = (bytes_per_key + 3) / 4;
  u64 half = words / 2, odd = words % 2, per_key = half + odd;
  u64 total = n_keys * per_key;
  u64 stride = (u64)gridDim.x * blockDim.x;
  for (u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += stride) {
    u64 i = t / per_key, j = t % per_key;
    u32 k0 = keys[2 * i], k1 = keys[2 * i + 1];
    u8* block = out + i * bytes_per_key;
    if (j < half) {
      uint2 v = threefry2x32(k0, k1, (u32)j, (u32)(j + half + odd));
      put_word(block, bytes_per_key, j, v.x);
      put_word(block, bytes_per_key, j + half + odd, v.y);
    } else {
      put_word(block, bytes_per_key, half, threefry2x32(k0, k1, (u32)half, 0u).x);
    }
  }
}
