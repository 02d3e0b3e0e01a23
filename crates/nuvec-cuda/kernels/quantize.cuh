// Affine quantization in MLX's layout: each row is one little-endian bit stream of u32 words,
// element i at bits [i * bits, (i + 1) * bits), so 3-, 5- and 6-bit values may straddle two
// words. Arithmetic is f32 with explicit roundings (no fused multiply-add), matching the CPU
// backend (and MLX) bit for bit.
#pragma once
#include "common.cuh"

// One thread per group: range, snapped scale and bias, then the packed levels.
template <typename T>
__device__ __forceinline__ void affine_quantize(const T* __restrict__ w, u32* __restrict__ out, T* __restrict__ scales,
                                                T* __restrict__ biases, u64 groups, int bits, int group_size) {
  u64 stride = (u64)gridDim.x * blockDim.x;
  float n_bins = (float)((1u << bits) - 1u);
  int words = group_size * bits / 32;
  for (u64 g = (u64)blockIdx.x * blockDim.x + threadIdx.x; g < groups; g += stride) {
    const T* x = w + g * (u64)group_size;
    float w_min = INFINITY, w_max = -INFINITY;
    for (int j = 0; j < group_size; ++j) {
      float v = (float)widen<T>(x[j]);
      if (w_max < v) w_max = v;
      if (v < w_min) w_min = v;
    }
    bool mask = fabsf(w_min) > fabsf(w_max);
    float scale = __fdiv_rn(__fsub_rn(w_max, w_min), n_bins);
    if (scale < 1e-7f) scale = 1e-7f;
    if (!mask) scale = -scale;
    float edge = mask ? w_min : w_max;
    float q0 = rintf(__fdiv_rn(edge, scale));
    float bias = 0.0f;
    if (q0 != 0.0f) {
      scale = __fdiv_rn(edge, q0);
      bias = edge;
    }
    u32* o = out + g * (u64)words;
    u64 acc = 0;
    int filled = 0, at = 0;
    for (int j = 0; j < group_size; ++j) {
      float q = rintf(__fdiv_rn(__fsub_rn((float)widen<T>(x[j]), bias), scale));
      if (q < 0.0f) q = 0.0f;
      if (n_bins < q) q = n_bins;
      acc |= (u64)(u32)q << filled;
      filled += bits;
      if (filled >= 32) {
        o[at++] = (u32)acc;
        acc >>= 32;
        filled -= 32;
      }
    }
    scales[g] = narrow<T>(scale);
    biases[g] = narrow<T>(bias);
  }
}

// One thread per 8 consecutive levels (8 · BITS ≤ 64 bits, at most two words, inside one
// group): scale * q rounded to T, plus the bias rounded to T, stored as one 16-byte vector
// (two for float), so a warp's stores cover one contiguous run. `n` is a multiple of 32
// (rows are whole groups).
template <typename T, int BITS>
__device__ __forceinline__ void affine_dequantize_chunks(const u32* __restrict__ w, const T* __restrict__ scales,
                                                         const T* __restrict__ biases, T* __restrict__ out, u64 n,
                                                         int group_size) {
  const u64 chunks = n >> 3, stride = (u64)gridDim.x * blockDim.x;
  const int group_shift = __ffs(group_size) - 1;  // groups are 32, 64 or 128
  for (u64 c = (u64)blockIdx.x * blockDim.x + threadIdx.x; c < chunks; c += stride) {
    const u64 bit = c * 8 * BITS;
    const u32 shift = (u32)(bit & 31);
    u64 bits = (u64)w[bit >> 5] >> shift;
    if (shift + 8 * BITS > 32) bits |= (u64)w[(bit >> 5) + 1] << (32 - shift);
    const u64 g = (c << 3) >> group_shift;
    const float s = (float)widen<T>(scales[g]), b = (float)widen<T>(biases[g]);
    __align__(16) T v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float level = (float)((u32)(bits >> (j * BITS)) & ((1u << BITS) - 1u));
      T prod = narrow<T>(__fmul_rn(level, s));
      v[j] = narrow<T>(__fadd_rn((float)widen<T>(prod), b));
    }
    uint4* o = reinterpret_cast<uint4*>(out + (c << 3));
    const uint4* src = reinterpret_cast<const uint4*>(v);
#pragma unroll
    for (int i = 0; i < (int)(8 * sizeof(T) / 16); ++i) o[i] = src[i];
  }
}
