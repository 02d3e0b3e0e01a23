// Softmax and log-sum-exp over contiguous rows, and the row statistics cross entropy shares
// (row_max_sum_block, ...): in f32 (f64 for double inputs). A row's maximum and sum of exponentials come from one online pass (one
// exponential per element, rescaling the sum only when the maximum grows); softmax then
// writes exp(x - max) / sum. A row takes one warp (`_warp` kernels, several rows per block) or,
// past 64 KiB, a whole block (any multiple of 32 threads); fast/softmax.rs chooses.
#pragma once
#include "reduce.cuh"

#ifndef NV_ROW_LOADS
// 16-byte loads in flight per thread: more was faster up to 8 (see bench/results/); past 8,
// kernels under a 1024-thread launch bound (64 registers, as the cross-entropy loss's) spill.
#define NV_ROW_LOADS 8
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

// -inf, the value that adds nothing (exp(-inf) = 0): it pads a partial group of vectors.
template <typename T> __device__ __forceinline__ T neg_inf() { return -(T)INFINITY; }
template <> __device__ __forceinline__ bf16 neg_inf<bf16>() { return __ushort_as_bfloat16((u16)0xff80u); }
template <> __device__ __forceinline__ f16 neg_inf<f16>() { return __ushort_as_half((u16)0xfc00u); }

// A vector's elements in the statistics' precision.
template <typename T, int N>
__device__ __forceinline__ void widen_vec(const Vec<T, N>& v, typename Acc<T>::type (&w)[N]) {
#pragma unroll
  for (int j = 0; j < N; ++j) w[j] = widen(v.v[j]);
}
// bf16 pairs widen by shift and mask: one instruction each, where the conversion spends two on
// the upper half.
template <> __device__ __forceinline__ void widen_vec<bf16, 8>(const Vec<bf16, 8>& v, float (&w)[8]) {
  u32 u[4];
  memcpy(u, &v, sizeof(u));
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    w[2 * j] = __uint_as_float(u[j] << 16);
    w[2 * j + 1] = __uint_as_float(u[j] & 0xffff0000u);
  }
}

// The largest element of U vectors, NaNs skipped (as fmax; all NaN gives NaN). 2-byte types
// compare packed pairs (max.bf16x2 / max.f16x2 skip a NaN the same way), halving the count.
template <typename T> struct Pair2 {};
template <> struct Pair2<bf16> { typedef __nv_bfloat162 type; };
template <> struct Pair2<f16> { typedef __half2 type; };
template <typename T, int N, int U>
__device__ __forceinline__ typename Acc<T>::type vecs_max(const Vec<T, N> (&v)[U]) {
  typedef typename Acc<T>::type A;
#if __CUDA_ARCH__ >= 800
  constexpr bool packed = sizeof(T) == 2;
#else
  constexpr bool packed = false;
#endif
  if constexpr (packed) {
    typedef typename Pair2<T>::type P;
    const int W = U * N / 2;
    P m[W];
    memcpy(m, v, sizeof(m));
#pragma unroll
    for (int s = 1; s < W; s *= 2)
#pragma unroll
      for (int i = 0; i + s < W; i += 2 * s) m[i] = __hmax2(m[i], m[i + s]);
    T h[2];
    memcpy(h, &m[0], sizeof(h));
    return amax(widen(h[0]), widen(h[1]));
  } else {
    A r[U * N];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      A w[N];
      widen_vec(v[u], w);
#pragma unroll
      for (int j = 0; j < N; ++j) r[u * N + j] = w[j];
    }
#pragma unroll
    for (int s = 1; s < U * N; s *= 2)
#pragma unroll
      for (int i = 0; i + s < U * N; i += 2 * s) r[i] = amax(r[i], r[i + s]);
    return r[0];
  }
}

// Whether any element of U vectors is NaN.
template <typename T, int N, int U> __device__ __forceinline__ bool vecs_have_nan(const Vec<T, N> (&v)[U]) {
  bool nan = false;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    typename Acc<T>::type w[N];
    widen_vec(v[u], w);
#pragma unroll
    for (int j = 0; j < N; ++j) nan |= w[j] != w[j];
  }
  return nan;
}

// Adds U vectors at once: one maximum over all their elements, at most one rescale of the sum,
// then independent exponentials summed as a tree (no dependency chain through the running sum).
// -inf elements (a partial group's padding among them) add exp(-inf) = 0. NaNs are the caller's
// to track: here they only make the sum NaN.
template <typename T, int N, int U>
__device__ __forceinline__ void ms_push_vecs(MaxSum<typename Acc<T>::type>& a, const Vec<T, N> (&v)[U]) {
  typedef typename Acc<T>::type A;
  if constexpr (sizeof(A) == 8 && U > 1) {
    // Double's exponential is long: a vector at a time keeps its registers in bounds (under the
    // cross-entropy loss kernel's 1024-thread launch bound among others).
#pragma unroll
    for (int u = 0; u < U; ++u) ms_push_vecs<T, N, 1>(a, reinterpret_cast<const Vec<T, N>(&)[1]>(v[u]));
    return;
  }
  A cm = vecs_max(v);
  if (cm == -(A)INFINITY) {
    // Every element is -inf or NaN, which the maximum skipped: only a NaN counts.
    if (vecs_have_nan(v)) a.s = (A)NAN;
    return;
  }
  if (cm > a.m) {
    a.s = a.s * fast_exp(a.m - cm);
    a.m = cm;
  }
  A mL = log2e_times(a.m), t[U];
  if (sizeof(A) == 4 && mL == -(A)INFINITY) {
    // A maximum below -FLT_MAX / log2(e) (scores masked with the lowest float) overflows mL:
    // the two-step exponential, exact there.
#pragma unroll
    for (int u = 0; u < U; ++u) {
      A w[N];
      widen_vec(v[u], w);
      t[u] = fast_exp(w[0] - a.m);
#pragma unroll
      for (int j = 1; j < N; ++j) t[u] += fast_exp(w[j] - a.m);
    }
  } else {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      A w[N];
      widen_vec(v[u], w);
      t[u] = exp_shifted(w[0], a.m, mL);
#pragma unroll
      for (int j = 1; j < N; ++j) t[u] += exp_shifted(w[j], a.m, mL);
    }
  }
#pragma unroll
  for (int s = 1; s < U; s *= 2)
#pragma unroll
    for (int u = 0; u + s < U; u += 2 * s) t[u] += t[u + s];
  a.s += t[0];
}

// The (max, sum) of `len` elements read by `lanes` threads starting at `first` (< lanes).
template <typename T>
__device__ __forceinline__ MaxSum<typename Acc<T>::type> ms_scan(const T* __restrict__ p, u64 len, u64 first,
                                                                 u64 lanes) {
  typedef typename Acc<T>::type A;
  const int N = 16 / sizeof(T), U = NV_ROW_LOADS;
  MaxSum<A> acc{-(A)INFINITY, (A)0};
  // Elements before the first 16-byte boundary (rows of a length that is no multiple of N start
  // anywhere) and after the last whole vector go one by one: at most one of each per thread.
  u64 head = (16 - (unsigned long long)p % 16) % 16 / sizeof(T);
  if (head > len) head = len;
  for (u64 j = first; j < head; j += lanes) ms_push(acc, widen(p[j]));
  const Vec<T, N>* q = reinterpret_cast<const Vec<T, N>*>(p + head);
  u64 nv = (len - head) / N, i = first;
  // U vectors per thread are loaded before any is used, to keep enough bytes in flight per thread.
  for (; i + (U - 1) * lanes < nv; i += U * lanes) {
    Vec<T, N> v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = q[i + u * lanes];
    ms_push_vecs<T, N, U>(acc, v);
  }
  // The rest, fewer than U vectors, also at once (a thread would otherwise wait on each in
  // turn: with 256 threads, most of a 32000-wide bf16 row's second half); -inf pads the group.
  if (i < nv) {
    Vec<T, N> v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (i + u * lanes < nv) {
        v[u] = q[i + u * lanes];
      } else {
#pragma unroll
        for (int j = 0; j < N; ++j) v[u].v[j] = neg_inf<T>();
      }
    }
    ms_push_vecs<T, N, U>(acc, v);
  }
  for (u64 j = head + nv * N + first; j < len; j += lanes) ms_push(acc, widen(p[j]));
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
