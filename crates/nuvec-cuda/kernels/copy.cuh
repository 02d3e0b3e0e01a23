// Copies, casts and ranges (copy.rs): strided copies by element size, conversions between
// any two element types, `arange`.
#pragma once
#include "arith.cuh"
#include "map.cuh"

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

// Conversion of one element (casts run as unary maps).
template <typename S, typename D> struct CastF {
  __device__ __forceinline__ D operator()(S x) const { return convert<D, S>(x); }
};
