// Copies, ranges and integer products.
#pragma once
#include "elementwise.cuh"

// dst[offset_of(d, 0, i)] = src[offset_of(d, 1, i)] for every element i (any layouts).
template <typename T>
__device__ __forceinline__ void copy_strided(const T* __restrict__ src, T* __restrict__ dst, u64 n, Dims d) {
  u64 stride = (u64)gridDim.x * blockDim.x;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[offset_of(d, 0, i)] = src[offset_of(d, 1, i)];
}

// Integer ranges step by T(start + step) - T(start) (MLX's rule); float ranges are
// start + i * step rounded once.
template <typename T>
__device__ __forceinline__ void arange_fill(T* __restrict__ out, u64 n, double start, double step) {
  u64 stride = (u64)gridDim.x * blockDim.x;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    if constexpr (IsInt<T>::value) {
      T s0 = convert<T, double>(start);
      T st = wrap_sub(convert<T, double>(start + step), s0);
      out[i] = wrap_add(s0, wrap_mul((T)i, st));
    } else {
      out[i] = convert<T, double>(start + (double)i * step);
    }
  }
}

// Integer matrix product, one thread per output; batch offsets from `d` (operands a, b, out).
template <typename T>
__device__ __forceinline__ void matmul_int(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out,
                                           u64 batches, u64 m, u64 n, u64 k, i64 sa0, i64 sa1, i64 sb0, i64 sb1,
                                           Dims d) {
  u64 total = batches * m * n;
  u64 stride = (u64)gridDim.x * blockDim.x;
  for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
    u64 bi = e / (m * n), r = (e / n) % m, c = e % n;
    const T* pa = a + offset_of(d, 0, bi) + (i64)r * sa0;
    const T* pb = b + offset_of(d, 1, bi) + (i64)c * sb1;
    T acc = 0;
    for (u64 l = 0; l < k; ++l) acc = wrap_add(acc, wrap_mul(pa[(i64)l * sa1], pb[(i64)l * sb0]));
    out[e] = acc;
  }
}
