// Fused row kernels: softmax and log-sum-exp over contiguous rows, statistics in f32 (f64 for
// double inputs). A row's maximum and sum of exponentials come from one online pass (one
// exponential per element, rescaling the sum only when the maximum grows); softmax then
// writes exp(x - max) / sum. A row takes one warp (`_warp` kernels, several rows per block) or,
// past 64 KiB, a whole block (any multiple of 32 threads); eval.rs chooses.
#pragma once
#include "reduce.cuh"

#ifndef NV_ROW_LOADS
#define NV_ROW_LOADS 8  // H200: 2 → 83%, 4 → 84%, 8 → 86% of copy for bf16 log-sum-exp 16384×4096
#endif

template <typename A> struct MaxSum {
  A m, s;
};

// e^x for the statistics: single precision through exp2 of a pre-scaled argument (one FMUL and
// the hardware ex2, within 2 ulp), double precision exactly.
__device__ __forceinline__ float fast_exp(float x) { return exp2f(x * 1.4426950408889634f); }
__device__ __forceinline__ double fast_exp(double x) { return exp(x); }

// e^(v - m) given also mL = m·log2(e): one FFMA and the hardware ex2 (flushing subnormal results,
// which cannot move a sum that holds e^0 = 1). The exponential is the row kernels' bottleneck
// for 2-byte types, where the multiply-then-exp2f form costs extra instructions per element.
__device__ __forceinline__ float exp_shifted(float v, float, float mL) {
  float y, a = fmaf(v, 1.4426950408889634f, -mL);
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(a));
  return y;
}
__device__ __forceinline__ double exp_shifted(double v, double m, double) { return exp(v - m); }
__device__ __forceinline__ float amax(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double amax(double a, double b) { return fmax(a, b); }
template <typename A> __device__ __forceinline__ A log2e_times(A m) { return m * (A)1.4426950408889634; }

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

// A NaN maximum marks a row that held a NaN (see ms_scan); it wins every merge.
template <typename A> __device__ __forceinline__ MaxSum<A> ms_merge(MaxSum<A> a, MaxSum<A> b) {
  if (a.m != a.m || b.m != b.m) return MaxSum<A>{(A)NAN, (A)NAN};
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
// independent exponentials (no dependency chain through the running sum). NaNs are the
// caller's to track: here they only make the sum NaN.
template <typename A, int N> __device__ __forceinline__ void ms_push_n(MaxSum<A>& a, const A (&v)[N]) {
  A cm = v[0];
#pragma unroll
  for (int j = 1; j < N; ++j) cm = amax(cm, v[j]);
  if (cm == -(A)INFINITY) {
    // Every value is -inf (contributing exp(-inf) = 0) or NaN, which fmax skipped: keep it.
#pragma unroll
    for (int j = 0; j < N; ++j)
      if (v[j] != v[j]) a.s = (A)NAN;
    return;
  }
  if (cm > a.m) {
    a.s = a.s * fast_exp(a.m - cm);
    a.m = cm;
  }
  A mL = log2e_times(a.m), t = 0;
#pragma unroll
  for (int j = 0; j < N; ++j) t += exp_shifted(v[j], a.m, mL);
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
    // NV_ROW_LOADS vectors per thread are loaded before any is used, to keep enough bytes in
    // flight per thread.
    const int U = NV_ROW_LOADS;
    u64 i = first;
    for (; i + (U - 1) * lanes < nv; i += U * lanes) {
      Vec<T, N> v[U];
#pragma unroll
      for (int u = 0; u < U; ++u) v[u] = reinterpret_cast<const Vec<T, N>*>(p)[i + u * lanes];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        A w[N];
#pragma unroll
        for (int j = 0; j < N; ++j) w[j] = widen(v[u].v[j]);
        ms_push_n<A, N>(acc, w);
      }
    }
    for (; i < nv; i += lanes) {
      Vec<T, N> v = reinterpret_cast<const Vec<T, N>*>(p)[i];
      A w[N];
#pragma unroll
      for (int j = 0; j < N; ++j) w[j] = widen(v.v[j]);
      ms_push_n<A, N>(acc, w);
    }
    start = nv * N;
  }
  for (u64 i = start + first; i < len; i += lanes) ms_push(acc, widen(p[i]));
  // A NaN element leaves its NaN in the sum (exp(NaN) is NaN); with a finite maximum nothing
  // else does, so that marks the row (a NaN maximum, see ms_merge) without a test per element.
  // A +inf maximum makes the sum NaN on its own: such rows are rescanned (has_nan).
  if (acc.s != acc.s && !(acc.m == (A)INFINITY)) acc.m = (A)NAN;
  return acc;
}

// Whether any of the elements `first`, `first + lanes`, ... of the row is NaN.
template <typename T> __device__ __forceinline__ bool has_nan(const T* __restrict__ p, u64 len, u64 first, u64 lanes) {
  bool nan = false;
  for (u64 i = first; i < len; i += lanes) nan |= widen(p[i]) != widen(p[i]);
  return nan;
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
  if (acc.m == (A)INFINITY && __syncthreads_or(has_nan(p, len, threadIdx.x, blockDim.x))) acc.m = (A)NAN;
  return acc;
}

// The row's (max, sum) for one warp (valid in every lane).
template <typename T>
__device__ __forceinline__ MaxSum<typename Acc<T>::type> row_max_sum_warp(const T* __restrict__ p, u64 len, int lane) {
  typedef typename Acc<T>::type A;
  MaxSum<A> acc = ms_warp(ms_scan(p, len, lane, 32));
  if (acc.m == (A)INFINITY && __any_sync(0xffffffffu, has_nan(p, len, lane, 32))) acc.m = (A)NAN;
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

// As the composition: NaN for a row with a NaN, the maximum for a row whose maximum is infinite.
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
    auto ms = row_max_sum_warp(x + row * len, len, lane);
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
    auto ms = row_max_sum_warp(x + row * len, len, lane);
    if (lane == 0) out[row] = lse_value<T>(ms);
  }
}
