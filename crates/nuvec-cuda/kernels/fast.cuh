// Fused row kernels: softmax and log-sum-exp over contiguous rows, statistics in f32 (f64 for
// double inputs). A row's maximum and sum of exponentials come from one online pass (one
// exponential per element, rescaling the sum only when the maximum grows); softmax then
// writes exp(x - max) / sum. Rows up to 64 KiB take one warp each; longer rows one block.
#pragma once
#include "reduce.cuh"

template <typename A> struct MaxSum {
  A m, s;
};

// e^x for the statistics: single precision through exp2 of a pre-scaled argument (one FMUL and
// the hardware ex2, within 2 ulp), double precision exactly.
__device__ __forceinline__ float fast_exp(float x) { return exp2f(x * 1.4426950408889634f); }
__device__ __forceinline__ double fast_exp(double x) { return exp(x); }

// Adds one value to a running (max, sum of exp(x - max)).
template <typename A> __device__ __forceinline__ void ms_push(MaxSum<A>& a, A v) {
  if (v == -(A)INFINITY) return;  // contributes exp(-inf) = 0 (and avoids -inf - -inf)
  if (v > a.m) {
    a.s = a.s * fast_exp(a.m - v) + (A)1;
    a.m = v;
  } else {
    a.s += fast_exp(v - a.m);  // NaN input: the sum becomes NaN
  }
}

template <typename A> __device__ __forceinline__ MaxSum<A> ms_merge(MaxSum<A> a, MaxSum<A> b) {
  if (b.s == (A)0 && b.m == -(A)INFINITY) return a;
  if (a.s == (A)0 && a.m == -(A)INFINITY) return b;
  A m = a.m > b.m ? a.m : b.m;
  return MaxSum<A>{m, a.s * fast_exp(a.m - m) + b.s * fast_exp(b.m - m)};
}

template <typename A> __device__ __forceinline__ MaxSum<A> ms_warp(MaxSum<A> acc) {
  for (int o = 16; o > 0; o >>= 1) {
    MaxSum<A> other{shfl_xor_any(acc.m, o), shfl_xor_any(acc.s, o)};
    acc = ms_merge(acc, other);
  }
  return acc;
}

// Adds N values at once: one rescale when their maximum raises the running maximum, then N
// independent exponentials (no dependency chain through the running sum).
template <typename A, int N> __device__ __forceinline__ void ms_push_n(MaxSum<A>& a, const A (&v)[N]) {
  A cm = v[0];
  bool nan = false;
#pragma unroll
  for (int j = 0; j < N; ++j) {
    cm = v[j] > cm ? v[j] : cm;
    nan |= v[j] != v[j];
  }
  if (nan) {
    a.s = (A)NAN;
    return;
  }
  if (cm == -(A)INFINITY) return;  // every value contributes exp(-inf) = 0
  if (cm > a.m) {
    a.s = a.s * fast_exp(a.m - cm);
    a.m = cm;
  }
  A t = 0;
#pragma unroll
  for (int j = 0; j < N; ++j) t += fast_exp(v[j] - a.m);
  a.s += t;
}

// The (max, sum) of `len` elements read by `lanes` threads starting at `first`.
template <typename T>
__device__ __forceinline__ MaxSum<typename Acc<T>::type> ms_scan(const T* __restrict__ p, u64 len, u64 first,
                                                                 u64 lanes) {
  typedef typename Acc<T>::type A;
  const int N = 16 / sizeof(T);
  MaxSum<A> acc{-(A)INFINITY, (A)0};
  u64 start = 0;
  if (((unsigned long long)p % 16) == 0) {
    u64 nv = len / N;
#pragma unroll 2
    for (u64 i = first; i < nv; i += lanes) {
      Vec<T, N> v = reinterpret_cast<const Vec<T, N>*>(p)[i];
      A w[N];
#pragma unroll
      for (int j = 0; j < N; ++j) w[j] = widen(v.v[j]);
      ms_push_n<A, N>(acc, w);
    }
    start = nv * N;
  }
  for (u64 i = start + first; i < len; i += lanes) ms_push(acc, widen(p[i]));
  return acc;
}

// The row's (max, sum) for a whole block (valid in every thread).
template <typename T>
__device__ __forceinline__ MaxSum<typename Acc<T>::type> row_max_sum_block(const T* __restrict__ p, u64 len) {
  typedef typename Acc<T>::type A;
  __shared__ A sm[32], ss[32];
  MaxSum<A> acc = ms_warp(ms_scan(p, len, threadIdx.x, blockDim.x));
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  if (lane == 0) {
    sm[warp] = acc.m;
    ss[warp] = acc.s;
  }
  __syncthreads();
  acc = lane < nw ? MaxSum<A>{sm[lane], ss[lane]} : MaxSum<A>{-(A)INFINITY, (A)0};
  acc = ms_warp(acc);
  __syncthreads();
  return acc;
}

template <typename T, typename A>
__device__ __forceinline__ void softmax_write(const T* __restrict__ p, T* __restrict__ q, u64 len, MaxSum<A> ms,
                                              u64 first, u64 lanes) {
  A inv = (A)1 / ms.s;
  // A +inf maximum (or NaN) gives NaN everywhere, as the composition's inf - inf.
  if ((isinf(ms.m) && ms.m > 0) || ms.m != ms.m) inv = (A)NAN;
  // An all -inf row: the composition gives NaN too (exp(-inf - -inf)).
  if (ms.s == (A)0) inv = (A)NAN;
  const int N = 16 / sizeof(T);
  u64 start = 0;
  if (((unsigned long long)p % 16) == 0 && ((unsigned long long)q % 16) == 0) {
    u64 nv = len / N;
    for (u64 i = first; i < nv; i += lanes) {
      Vec<T, N> v = reinterpret_cast<const Vec<T, N>*>(p)[i];
      Vec<T, N> r;
#pragma unroll
      for (int j = 0; j < N; ++j) r.v[j] = narrow<T>(fast_exp(widen(v.v[j]) - ms.m) * inv);
      reinterpret_cast<Vec<T, N>*>(q)[i] = r;
    }
    start = nv * N;
  }
  for (u64 i = start + first; i < len; i += lanes) q[i] = narrow<T>(fast_exp(widen(p[i]) - ms.m) * inv);
}

template <typename T, typename A> __device__ __forceinline__ T lse_value(MaxSum<A> ms) {
  if (isinf(ms.m) || ms.m != ms.m) return narrow<T>(ms.m);
  return narrow<T>(log(ms.s) + ms.m);
}

template <typename T>
__device__ __forceinline__ void softmax_rows(const T* __restrict__ x, T* __restrict__ out, u64 rows, u64 len) {
  for (u64 row = blockIdx.x; row < rows; row += gridDim.x) {
    auto ms = row_max_sum_block(x + row * len, len);
    softmax_write(x + row * len, out + row * len, len, ms, threadIdx.x, blockDim.x);
  }
}

template <typename T>
__device__ __forceinline__ void softmax_rows_warp(const T* __restrict__ x, T* __restrict__ out, u64 rows, u64 len) {
  int lane = threadIdx.x & 31;
  u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
  for (u64 row = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5; row < rows; row += warps) {
    auto ms = ms_warp(ms_scan(x + row * len, len, lane, 32));
    softmax_write(x + row * len, out + row * len, len, ms, lane, 32);
  }
}

template <typename T>
__device__ __forceinline__ void logsumexp_rows(const T* __restrict__ x, T* __restrict__ out, u64 rows, u64 len) {
  for (u64 row = blockIdx.x; row < rows; row += gridDim.x) {
    auto ms = row_max_sum_block(x + row * len, len);
    if (threadIdx.x == 0) out[row] = lse_value<T>(ms);
  }
}

template <typename T>
__device__ __forceinline__ void logsumexp_rows_warp(const T* __restrict__ x, T* __restrict__ out, u64 rows, u64 len) {
  int lane = threadIdx.x & 31;
  u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
  for (u64 row = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5; row < rows; row += warps) {
    auto ms = ms_warp(ms_scan(x + row * len, len, lane, 32));
    if (lane == 0) out[row] = lse_value<T>(ms);
  }
}
