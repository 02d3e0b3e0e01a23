// Sorts along one axis: bitonic networks over (value, index) pairs.
//
// The order is MLX's (ascending, NaN last and equal to NaN, -0 == 0, complex by real then
// imaginary part) with ties broken by index, a total order, so the unstable bitonic network gives
// exactly the stable sort. Rows are padded to a power of two with entries whose index is at
// least `len`, ordered after everything. Partitions are sorted too (a valid partition).
//
// Rows up to SORT_BLOCK_MAX elements sort in shared memory, one block per row; longer rows sort
// in global memory, one launch per network stage. Inputs are read through the strides of the
// other axes (Dims) and the sorted axis's stride; outputs are written row after row.
#pragma once
#include "common.cuh"

#define SORT_BLOCK_MAX 4096

template <typename T> struct SortKey {
  static __device__ __forceinline__ bool nan(T) { return false; }
  static __device__ __forceinline__ bool lt(T a, T b) { return a < b; }
};
template <> struct SortKey<bool> {
  static __device__ __forceinline__ bool nan(bool) { return false; }
  static __device__ __forceinline__ bool lt(bool a, bool b) { return !a && b; }
};
template <> struct SortKey<float> {
  static __device__ __forceinline__ bool nan(float x) { return x != x; }
  static __device__ __forceinline__ bool lt(float a, float b) { return a < b; }
};
template <> struct SortKey<double> {
  static __device__ __forceinline__ bool nan(double x) { return x != x; }
  static __device__ __forceinline__ bool lt(double a, double b) { return a < b; }
};
template <> struct SortKey<f16> {
  static __device__ __forceinline__ bool nan(f16 x) { float f = __half2float(x); return f != f; }
  static __device__ __forceinline__ bool lt(f16 a, f16 b) { return __half2float(a) < __half2float(b); }
};
template <> struct SortKey<bf16> {
  static __device__ __forceinline__ bool nan(bf16 x) { float f = __bfloat162float(x); return f != f; }
  static __device__ __forceinline__ bool lt(bf16 a, bf16 b) { return __bfloat162float(a) < __bfloat162float(b); }
};
template <> struct SortKey<c64> {
  static __device__ __forceinline__ bool nan(c64 x) { return x.re != x.re || x.im != x.im; }
  static __device__ __forceinline__ bool lt(c64 a, c64 b) { return a.re < b.re || (a.re == b.re && a.im < b.im); }
};

// Whether (a, ia) comes before (b, ib); indices >= len are padding, after everything.
template <typename T>
__device__ __forceinline__ bool sort_before(T a, u32 ia, T b, u32 ib, u32 len) {
  bool pa = ia >= len, pb = ib >= len;
  if (pa || pb) return pa == pb ? ia < ib : pb;
  bool na = SortKey<T>::nan(a), nb = SortKey<T>::nan(b);
  if (na != nb) return nb;
  if (!na) {
    if (SortKey<T>::lt(a, b)) return true;
    if (SortKey<T>::lt(b, a)) return false;
  }
  return ia < ib;
}

template <typename T>
__device__ __forceinline__ T sort_load(const T* x, const Dims& d, u64 row, i64 axis_stride, u32 j, u32 len) {
  return j < len ? x[offset_of(d, 0, (i64)row) + (i64)j * axis_stride] : x[offset_of(d, 0, (i64)row)];
}

// One block per row (grid-stride over rows); `p` is the padded length, a power of two of at
// most SORT_BLOCK_MAX; dynamic shared memory holds p values then p indices.
template <typename T, bool INDICES>
__device__ void sort_block(const T* __restrict__ x, void* __restrict__ out, u64 rows, u32 len, u32 p,
                           i64 axis_stride, Dims d) {
  extern __shared__ __align__(16) unsigned char sort_smem[];
  T* keys = reinterpret_cast<T*>(sort_smem);
  u32* idx = reinterpret_cast<u32*>(sort_smem + (u64)p * sizeof(T));
  for (u64 row = blockIdx.x; row < rows; row += gridDim.x) {
    for (u32 i = threadIdx.x; i < p; i += blockDim.x) {
      keys[i] = sort_load(x, d, row, axis_stride, i, len);
      idx[i] = i;
    }
    __syncthreads();
    for (u32 k = 2; k <= p; k <<= 1) {
      for (u32 j = k >> 1; j > 0; j >>= 1) {
        for (u32 i = threadIdx.x; i < p; i += blockDim.x) {
          u32 l = i ^ j;
          if (l > i) {
            bool up = (i & k) == 0;
            T a = keys[i], b = keys[l];
            u32 ia = idx[i], ib = idx[l];
            if (sort_before(b, ib, a, ia, len) == up) {
              keys[i] = b;
              keys[l] = a;
              idx[i] = ib;
              idx[l] = ia;
            }
          }
        }
        __syncthreads();
      }
    }
    for (u32 i = threadIdx.x; i < len; i += blockDim.x) {
      if (INDICES) {
        reinterpret_cast<u32*>(out)[row * len + i] = idx[i];
      } else {
        reinterpret_cast<T*>(out)[row * len + i] = keys[i];
      }
    }
    __syncthreads();
  }
}

// Global-memory network for long rows: fill the padded scratch rows, run every (k, j) stage
// as one launch, then write the first `len` entries of each row.
template <typename T>
__device__ void sort_global_init(const T* __restrict__ x, T* __restrict__ keys, u32* __restrict__ idx, u64 rows,
                                 u32 len, u32 p, i64 axis_stride, Dims d) {
  u64 n = rows * p;
  for (u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x; t < n; t += (u64)gridDim.x * blockDim.x) {
    u64 row = t / p;
    u32 i = (u32)(t - row * p);
    keys[t] = sort_load(x, d, row, axis_stride, i, len);
    idx[t] = i;
  }
}

template <typename T>
__device__ void sort_global_step(T* __restrict__ keys, u32* __restrict__ idx, u64 rows, u32 len, u32 p, u32 k, u32 j) {
  u64 n = rows * p;
  for (u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x; t < n; t += (u64)gridDim.x * blockDim.x) {
    u64 row = t / p;
    u32 i = (u32)(t - row * p);
    u32 l = i ^ j;
    if (l <= i) continue;
    u64 a_at = row * p + i, b_at = row * p + l;
    bool up = (i & k) == 0;
    T a = keys[a_at], b = keys[b_at];
    u32 ia = idx[a_at], ib = idx[b_at];
    if (sort_before(b, ib, a, ia, len) == up) {
      keys[a_at] = b;
      keys[b_at] = a;
      idx[a_at] = ib;
      idx[b_at] = ia;
    }
  }
}

template <typename T, bool INDICES>
__device__ void sort_global_write(const T* __restrict__ keys, const u32* __restrict__ idx, void* __restrict__ out,
                                  u64 rows, u32 len, u32 p) {
  u64 n = rows * len;
  for (u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x; t < n; t += (u64)gridDim.x * blockDim.x) {
    u64 row = t / len;
    u64 from = row * p + (t - row * len);
    if (INDICES) {
      reinterpret_cast<u32*>(out)[t] = idx[from];
    } else {
      reinterpret_cast<T*>(out)[t] = keys[from];
    }
  }
}
