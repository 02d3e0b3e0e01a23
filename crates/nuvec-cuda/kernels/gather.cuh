// Gathers and scatters along one axis. Indices wrap once when negative; a gather clamps what
// is still outside the axis, a scatter skips it, so no access leaves a buffer (the CPU
// backend's rules). `d` describes the indices' shape with the operand strides:
//   gather:  d.strides[0] indices, d.strides[1] source (indexed axis stride zeroed)
//   scatter: d.strides[0] indices, d.strides[1] updates, d.strides[2] output (axis zeroed)
#pragma once
#include "arith.cuh"

// An index as i64; unsigned 64-bit values past i64's range saturate (still out of range).
template <typename I> __device__ __forceinline__ i64 index_value(I v) {
  if constexpr (sizeof(I) == 8 && (I)-1 > (I)0) return v > (u64)0x7fffffffffffffffULL ? 0x7fffffffffffffffLL : (i64)v;
  else return (i64)v;
}

template <typename T, typename I>
__device__ __forceinline__ void gather_axis(const T* __restrict__ src, const I* __restrict__ idx, T* __restrict__ out,
                                            u64 n, i64 axis_n, i64 axis_stride, Dims d) {
  u64 stride = (u64)gridDim.x * blockDim.x;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    i64 j = index_value<I>(idx[offset_of(d, 0, i)]);
    if (j < 0) j += axis_n;
    j = j < 0 ? 0 : (j >= axis_n ? axis_n - 1 : j);
    out[i] = src[offset_of(d, 1, i) + j * axis_stride];
  }
}

// The position a scatter writes for element i, or -1 when its index is outside the axis.
template <typename I>
__device__ __forceinline__ i64 scatter_target(const I* idx, u64 i, i64 axis_n, i64 axis_stride, const Dims& d) {
  i64 j = index_value<I>(idx[offset_of(d, 0, i)]);
  if (j < 0) j += axis_n;
  if (j < 0 || j >= axis_n) return -1;
  return offset_of(d, 2, i) + j * axis_stride;
}

// Plain scatter: one of several updates to a position wins.
template <typename T, typename I>
__device__ __forceinline__ void scatter_set(const I* __restrict__ idx, const T* __restrict__ upd, T* __restrict__ out,
                                            u64 n, i64 axis_n, i64 axis_stride, Dims d) {
  u64 stride = (u64)gridDim.x * blockDim.x;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    i64 p = scatter_target<I>(idx, i, axis_n, axis_stride, d);
    if (p >= 0) out[p] = upd[offset_of(d, 1, i)];
  }
}

template <typename T> struct ScSum {
  __device__ T operator()(T a, T b) const {
    if constexpr (IsInt<T>::value) return wrap_add(a, b);
    else return narrow<T>(widen(a) + widen(b));
  }
};
template <typename T> struct ScProd {
  __device__ T operator()(T a, T b) const {
    if constexpr (IsInt<T>::value) return wrap_mul(a, b);
    else return narrow<T>(widen(a) * widen(b));
  }
};
// NaN wins, as on the CPU.
template <typename T> struct ScMax {
  __device__ T operator()(T a, T b) const {
    auto x = widen(a), y = widen(b);
    return (x > y || x != x) ? a : b;
  }
};
template <typename T> struct ScMin {
  __device__ T operator()(T a, T b) const {
    auto x = widen(a), y = widen(b);
    return (x < y || x != x) ? a : b;
  }
};

template <typename T, typename W> __device__ __forceinline__ W bits_of(T v) {
  W w = 0;
  memcpy(&w, &v, sizeof(T));
  return w;
}
template <typename T, typename W> __device__ __forceinline__ T from_bits(W w) {
  T v;
  memcpy(&v, &w, sizeof(T));
  return v;
}

// *p = f(*p, v) atomically, by compare-and-swap on the aligned word holding *p. Elements of
// 1 or 2 bytes share a 4-byte word with their neighbours; the other bytes are written back
// unchanged (device allocations are at least 256-byte aligned and sized, so the word is in
// the allocation).
template <typename T, typename F> __device__ __forceinline__ void atomic_apply(T* p, T v, F f) {
  if constexpr (sizeof(T) == 8) {
    unsigned long long* q = (unsigned long long*)p;
    unsigned long long old = *q, assumed;
    do {
      assumed = old;
      T next = f(from_bits<T, unsigned long long>(assumed), v);
      old = atomicCAS(q, assumed, bits_of<T, unsigned long long>(next));
    } while (assumed != old);
  } else if constexpr (sizeof(T) == 4) {
    unsigned int* q = (unsigned int*)p;
    unsigned int old = *q, assumed;
    do {
      assumed = old;
      T next = f(from_bits<T, unsigned int>(assumed), v);
      old = atomicCAS(q, assumed, bits_of<T, unsigned int>(next));
    } while (assumed != old);
  } else {
    size_t addr = (size_t)p;
    unsigned int* q = (unsigned int*)(addr & ~(size_t)3);
    unsigned int shift = (unsigned int)(addr & 3) * 8;
    unsigned int mask = (sizeof(T) == 1 ? 0xffu : 0xffffu) << shift;
    unsigned int old = *q, assumed;
    do {
      assumed = old;
      T cur = from_bits<T, unsigned int>((assumed & mask) >> shift);
      unsigned int next = (bits_of<T, unsigned int>(f(cur, v)) << shift) & mask;
      old = atomicCAS(q, assumed, (assumed & ~mask) | next);
    } while (assumed != old);
  }
}

template <typename T, typename F> __device__ __forceinline__ void atomic_combine(T* p, T v, F f) {
  atomic_apply(p, v, f);
}
// Native atomic adds where the hardware has them.
template <> __device__ __forceinline__ void atomic_combine<float, ScSum<float>>(float* p, float v, ScSum<float>) { atomicAdd(p, v); }
template <> __device__ __forceinline__ void atomic_combine<double, ScSum<double>>(double* p, double v, ScSum<double>) { atomicAdd(p, v); }
template <> __device__ __forceinline__ void atomic_combine<i32, ScSum<i32>>(i32* p, i32 v, ScSum<i32>) { atomicAdd(p, v); }
template <> __device__ __forceinline__ void atomic_combine<u32, ScSum<u32>>(u32* p, u32 v, ScSum<u32>) { atomicAdd(p, v); }
template <> __device__ __forceinline__ void atomic_combine<u64, ScSum<u64>>(u64* p, u64 v, ScSum<u64>) {
  atomicAdd((unsigned long long*)p, (unsigned long long)v);
}
template <> __device__ __forceinline__ void atomic_combine<i64, ScSum<i64>>(i64* p, i64 v, ScSum<i64>) {
  atomicAdd((unsigned long long*)p, (unsigned long long)v);
}

template <typename T, typename I, typename F>
__device__ __forceinline__ void scatter_reduce(const I* __restrict__ idx, const T* __restrict__ upd, T* out, u64 n,
                                               i64 axis_n, i64 axis_stride, Dims d, F f) {
  u64 stride = (u64)gridDim.x * blockDim.x;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    i64 p = scatter_target<I>(idx, i, axis_n, axis_stride, d);
    if (p >= 0) atomic_combine(out + p, upd[offset_of(d, 1, i)], f);
  }
}
