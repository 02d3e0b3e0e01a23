// Element-wise map templates: each map in a contiguous vectorised form (16-byte accesses,
// grid-stride) and a strided form over collapsed axes, for one operand (unary maps, casts) or
// two (binary maps).
#pragma once
#include "common.cuh"

// Stores the N results of vector `i` as one access when they fit in 16 bytes (a warp then
// writes whole cache lines), else one element at a time.
template <typename U, int N, typename G>
__device__ __forceinline__ void store_vec(U* __restrict__ out, u64 i, G value) {
  if constexpr (sizeof(U) * N <= 16) {
    Vec<U, N> r;
#pragma unroll
    for (int j = 0; j < N; ++j) r.v[j] = value(j);
    reinterpret_cast<Vec<U, N>*>(out)[i] = r;
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) out[i * N + j] = value(j);
  }
}

// Contiguous: `n` elements, 16-byte vectors when all pointers are aligned (checked by the host).
template <typename T, typename U, typename F>
__device__ __forceinline__ void unary_contig(const T* __restrict__ x, U* __restrict__ out, u64 n, F f) {
  const int N = 16 / sizeof(T) > 0 ? 16 / sizeof(T) : 1;
  u64 stride = (u64)gridDim.x * blockDim.x;
  u64 nvec = n / N;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < nvec; i += stride) {
    Vec<T, N> v = reinterpret_cast<const Vec<T, N>*>(x)[i];
    store_vec<U, N>(out, i, [&](int j) { return f(v.v[j]); });
  }
  for (u64 i = nvec * N + (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) out[i] = f(x[i]);
}

template <typename T, typename U, typename F>
__device__ __forceinline__ void unary_strided(const T* __restrict__ x, U* __restrict__ out, u64 n, Dims d, F f) {
  u64 stride = (u64)gridDim.x * blockDim.x;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) out[i] = f(x[offset_of(d, 0, i)]);
}

// mode 0: both dense; 1: a scalar; 2: b scalar.
template <typename T, typename U, typename F>
__device__ __forceinline__ void binary_contig(const T* __restrict__ a, const T* __restrict__ b, U* __restrict__ out,
                                              u64 n, int mode, F f) {
  const int N = 16 / sizeof(T) > 0 ? 16 / sizeof(T) : 1;
  u64 stride = (u64)gridDim.x * blockDim.x;
  u64 nvec = n / N;
  const T sa = mode == 1 ? a[0] : T();
  const T sb = mode == 2 ? b[0] : T();
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < nvec; i += stride) {
    Vec<T, N> va, vb;
    if (mode != 1) va = reinterpret_cast<const Vec<T, N>*>(a)[i];
    if (mode != 2) vb = reinterpret_cast<const Vec<T, N>*>(b)[i];
    store_vec<U, N>(out, i, [&](int j) { return f(mode == 1 ? sa : va.v[j], mode == 2 ? sb : vb.v[j]); });
  }
  for (u64 i = nvec * N + (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = f(mode == 1 ? sa : a[i], mode == 2 ? sb : b[i]);
}

template <typename T, typename U, typename F>
__device__ __forceinline__ void binary_strided(const T* __restrict__ a, const T* __restrict__ b, U* __restrict__ out,
                                               u64 n, Dims d, F f) {
  u64 stride = (u64)gridDim.x * blockDim.x;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = f(a[offset_of(d, 0, i)], b[offset_of(d, 1, i)]);
}
