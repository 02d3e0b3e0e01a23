// Fused row kernels: softmax and log-sum-exp over contiguous rows, statistics in f32 (f64 for
// double inputs). One block per row: an online max-and-sum pass, then (softmax) a write pass.
#pragma once
#include "reduce.cuh"

template <typename A> struct MaxSum {
  A m, s;
};
template <typename A> __device__ __forceinline__ MaxSum<A> ms_merge(MaxSum<A> a, MaxSum<A> b) {
  // NaN in either propagates; an empty side (-inf max, zero sum) contributes nothing.
  if (a.m != a.m || b.m != b.m) return MaxSum<A>{a.m + b.m, a.s + b.s};
  if (b.s == (A)0 && b.m == -(A)INFINITY) return a;
  if (a.s == (A)0 && a.m == -(A)INFINITY) return b;
  A m = a.m > b.m ? a.m : b.m;
  return MaxSum<A>{m, a.s * exp(a.m - m) + b.s * exp(b.m - m)};
}

template <typename T>
__device__ __forceinline__ MaxSum<typename Acc<T>::type> row_max_sum(const T* __restrict__ p, u64 len) {
  typedef typename Acc<T>::type A;
  __shared__ A sm[32], ss[32];
  MaxSum<A> acc{-(A)INFINITY, (A)0};
  for (u64 i = threadIdx.x; i < len; i += blockDim.x) {
    A v = widen(p[i]);
    acc = ms_merge(acc, MaxSum<A>{v, (A)1});
  }
  for (int o = 16; o > 0; o >>= 1) {
    MaxSum<A> other{shfl_xor_any(acc.m, o), shfl_xor_any(acc.s, o)};
    acc = ms_merge(acc, other);
  }
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  if (lane == 0) {
    sm[warp] = acc.m;
    ss[warp] = acc.s;
  }
  __syncthreads();
  if (warp == 0) {
    acc = lane < nw ? MaxSum<A>{sm[lane], ss[lane]} : MaxSum<A>{-(A)INFINITY, (A)0};
    for (int o = 16; o > 0; o >>= 1) {
      MaxSum<A> other{shfl_xor_any(acc.m, o), shfl_xor_any(acc.s, o)};
      acc = ms_merge(acc, other);
    }
    if (lane == 0) {
      sm[0] = acc.m;
      ss[0] = acc.s;
    }
  }
  __syncthreads();
  MaxSum<A> r{sm[0], ss[0]};
  __syncthreads();
  return r;
}

template <typename T>
__device__ __forceinline__ void softmax_rows(const T* __restrict__ x, T* __restrict__ out, u64 rows, u64 len) {
  typedef typename Acc<T>::type A;
  for (u64 row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* p = x + row * len;
    T* q = out + row * len;
    MaxSum<A> ms = row_max_sum(p, len);
    A inv = (A)1 / ms.s;
    // A +inf maximum gives NaN everywhere, as the composition's inf - inf.
    if (isinf(ms.m) && ms.m > 0) inv = (A)NAN;
    for (u64 i = threadIdx.x; i < len; i += blockDim.x) q[i] = narrow<T>(exp(widen(p[i]) - ms.m) * inv);
  }
}

template <typename T>
__device__ __forceinline__ void logsumexp_rows(const T* __restrict__ x, T* __restrict__ out, u64 rows, u64 len) {
  typedef typename Acc<T>::type A;
  for (u64 row = blockIdx.x; row < rows; row += gridDim.x) {
    MaxSum<A> ms = row_max_sum(x + row * len, len);
    if (threadIdx.x == 0) out[row] = narrow<T>((isinf(ms.m) || ms.m != ms.m) ? ms.m : log(ms.s) + ms.m);
  }
}
