// Helpers of the generated kernels of compiled element-wise programs (compiled.rs): the
// rounding barrier between steps, and N-element loads and stores in 16-byte vectors.
#pragma once
#include "common.cuh"

// The rounding barrier: x + -0.0 is exact for every x (signed zeros included), and neither
// NVVM (inline asm is opaque) nor ptxas (an add with an explicit rounding mode is never
// contracted) can fuse the step that made x with the step that reads it into one FMA.
__device__ __forceinline__ float cl_round(float x) {
  float y;
  asm volatile("add.rn.f32 %0, %1, 0f80000000;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ double cl_round(double x) {
  double y;
  asm volatile("add.rn.f64 %0, %1, 0d8000000000000000;" : "=d"(y) : "d"(x));
  return y;
}
__device__ __forceinline__ c64 cl_round(c64 z) { return make_c64(cl_round(z.re), cl_round(z.im)); }

// Elements [i * N, i * N + N) of `p` into `v`, as 16-byte vectors (fewer bytes when N
// elements are less); `p` is 16-byte aligned.
template <typename T, int N>
__device__ __forceinline__ void cl_load(const T* p, u64 i, T (&v)[N]) {
  constexpr int C = 16 / sizeof(T) < N ? 16 / sizeof(T) : N;
#pragma unroll
  for (int c = 0; c < N / C; ++c) {
    Vec<T, C> x = reinterpret_cast<const Vec<T, C>*>(p + i * N)[c];
#pragma unroll
    for (int j = 0; j < C; ++j) v[c * C + j] = x.v[j];
  }
}

// `v` into elements [i * N, i * N + N) of `p`, as cl_load reads them.
template <typename T, int N>
__device__ __forceinline__ void cl_store(T* p, u64 i, const T (&v)[N]) {
  constexpr int C = 16 / sizeof(T) < N ? 16 / sizeof(T) : N;
#pragma unroll
  for (int c = 0; c < N / C; ++c) {
    Vec<T, C> x;
#pragma unroll
    for (int j = 0; j < C; ++j) x.v[j] = v[c * C + j];
    reinterpret_cast<Vec<T, C>*>(p + i * N)[c] = x;
  }
}
