// Copies, casts and ranges (copy.rs): strided copies by element size, conversions between
// any two element types, `arange`.
#pragma once
#include "arith.cuh"
#include "map.cuh"

// dst[offset_of(d, 0, i)] = src[offset_of(d, 1, i)] for every element i (any layouts).
template <typename T>
__device__ __forceinline__ void copy_strided(const T* __restrict__ src, T* __restrict__ dst, u64 n, Dims d) {
  constexpr int R = CopyRunLen<T>::v;
  for_runs<2, R>(d, n, [&](const i64* off, const i64* s, int cnt, u64) {
    T v[R];
    load_run<T, R>(src, off[1], s[1], cnt, v);
    store_run<T, R>(dst, off[0], s[0], cnt, v);
  });
}

// `rows` blocks of `width` 16-byte vectors, `src_pitch` and `dst_pitch` vectors apart (a
// row-major input of a concatenation into its place in the output): grid (vectors, rows), a
// vector per thread, no index division.
__device__ __forceinline__ void copy_block_rows(const uint4* __restrict__ src, uint4* __restrict__ dst, u64 width,
                                                u64 src_pitch, u64 dst_pitch, u64 rows) {
  for (u64 r = blockIdx.y; r < rows; r += gridDim.y)
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < width; i += (u64)gridDim.x * blockDim.x)
      dst[r * dst_pitch + i] = src[r * src_pitch + i];
}

// A copy that transposes: `d` has 2 or 3 axes ([batch,] A, B), `dst` is contiguous along B
// and `src` along A. A 32x32 tile goes through shared memory so that both sides are read and
// written in whole rows. Grid: (B tiles, A tiles, batch); block 32x8.
template <typename T>
__device__ __forceinline__ void copy_transposed(const T* __restrict__ src, T* __restrict__ dst, Dims d) {
  __shared__ T tile[32][33];
  const int nd = d.ndim;
  const i64 A = dims_at(d.shape, nd - 2), B = dims_at(d.shape, nd - 1);
  const i64 src_b = dims_at(d.strides[1], nd - 1), dst_a = dims_at(d.strides[0], nd - 2);
  if (nd == 3) {
    src += (i64)blockIdx.z * d.strides[1][0];
    dst += (i64)blockIdx.z * d.strides[0][0];
  }
  const i64 a0 = (i64)blockIdx.y * 32, b0 = (i64)blockIdx.x * 32;
  for (int k = threadIdx.y; k < 32; k += 8) {
    i64 a = a0 + threadIdx.x, b = b0 + k;
    if (a < A && b < B) tile[k][threadIdx.x] = src[a + b * src_b];
  }
  __syncthreads();
  for (int k = threadIdx.y; k < 32; k += 8) {
    i64 a = a0 + k, b = b0 + threadIdx.x;
    if (a < A && b < B) dst[a * dst_a + b] = tile[threadIdx.x][k];
  }
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
