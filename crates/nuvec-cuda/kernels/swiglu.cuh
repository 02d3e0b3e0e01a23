// SwiGLU and its derivative, element-wise over contiguous arrays (fast/swiglu.rs). The vector
// helpers (load, store, round_vec, aligned16) are norm.cuh's.
#pragma once
#include "norm.cuh"

// ---- SwiGLU: silu(gate) · up in f32, rounded once.
template <typename T>
__device__ __forceinline__ void swiglu_elems(const T* __restrict__ gate, const T* __restrict__ up, T* __restrict__ out,
                                             u64 n) {
  typedef typename Acc<T>::type A;
  const int N = 16 / sizeof(T);
  u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x, lanes = (u64)gridDim.x * blockDim.x, start = 0;
  if (aligned16(gate) && aligned16(up) && aligned16(out)) {
    u64 nv = n / N;
    for (u64 i = tid; i < nv; i += lanes) {
      Vec<T, N> a = reinterpret_cast<const Vec<T, N>*>(gate)[i], b = reinterpret_cast<const Vec<T, N>*>(up)[i];
      A y[N];
#pragma unroll
      for (int j = 0; j < N; ++j) y[j] = silu_fast<T>(widen(a.v[j])) * widen(b.v[j]);
      reinterpret_cast<Vec<T, N>*>(out)[i] = round_vec<T, N>(y);
    }
    start = nv * N;
  }
  for (u64 i = start + tid; i < n; i += lanes) out[i] = narrow<T>(silu_fast<T>(widen(gate[i])) * widen(up[i]));
}

// SwiGLU's derivative in one pass: with s = sigmoid(gate), dgate = g·up·s·(1 + gate·(1 − s))
// and dup = g·gate·s (3 reads, 2 writes).
template <typename T>
__device__ __forceinline__ void swiglu_vjp_elems(const T* __restrict__ gate, const T* __restrict__ up,
                                                 const T* __restrict__ g, T* __restrict__ dgate, T* __restrict__ dup,
                                                 u64 n) {
  typedef typename Acc<T>::type A;
  const int N = 16 / sizeof(T);
  u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x, lanes = (u64)gridDim.x * blockDim.x, start = 0;
  auto one = [](A x, A u, A gv, T& dg, T& du) {
    A s = (A)1 / ((A)1 + exp(-x));
    dg = narrow<T>(gv * u * s * ((A)1 + x * ((A)1 - s)));
    du = narrow<T>(gv * x * s);
  };
  if (aligned16(gate) && aligned16(up) && aligned16(g) && aligned16(dgate) && aligned16(dup)) {
    u64 nv = n / N;
    for (u64 i = tid; i < nv; i += lanes) {
      A a[N], b[N], c[N];
      T dg[N], du[N];
      load<T, N>(gate, i, a);
      load<T, N>(up, i, b);
      load<T, N>(g, i, c);
#pragma unroll
      for (int j = 0; j < N; ++j) one(a[j], b[j], c[j], dg[j], du[j]);
      store<T, N>(dgate, i, dg);
      store<T, N>(dup, i, du);
    }
    start = nv * N;
  }
  for (u64 i = start + tid; i < n; i += lanes) one(widen(gate[i]), widen(up[i]), widen(g[i]), dgate[i], dup[i]);
}
