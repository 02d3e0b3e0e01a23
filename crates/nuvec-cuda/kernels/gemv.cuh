// Matrix-vector products for few rows (M <= 8), where a library GEMM leaves bandwidth unused.
// f32 accumulation. Two weight layouts:
//  - gemv_rows: B is W^T with W [N, K] row-major (each output reads one contiguous row of W);
//    one warp per output column, 16-byte loads along K.
//  - gemv_cols: B [K, N] row-major; each thread owns 16 bytes of consecutive columns and a
//    slice of K (blockIdx.y); slices write f32 partials that gemv_finish sums.
#pragma once
#include "common.cuh"

#define NV_GEMV_MAX_M 8

template <typename T, int M>
__device__ __forceinline__ void gemv_rows(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ out,
                                          u64 n, u64 k, u64 ldx, u64 ldw, u64 ldo) {
  const int V = 16 / sizeof(T);
  int lane = threadIdx.x & 31;
  u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
  for (u64 col = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5; col < n; col += warps) {
    const T* wr = w + col * ldw;
    float acc[M];
#pragma unroll
    for (int m = 0; m < M; ++m) acc[m] = 0.0f;
    u64 kv = k / V;
    for (u64 i = lane; i < kv; i += 32) {
      Vec<T, V> wv = reinterpret_cast<const Vec<T, V>*>(wr)[i];
#pragma unroll
      for (int m = 0; m < M; ++m) {
        Vec<T, V> xv = reinterpret_cast<const Vec<T, V>*>(x + m * ldx)[i];
#pragma unroll
        for (int j = 0; j < V; ++j) acc[m] += widen(wv.v[j]) * widen(xv.v[j]);
      }
    }
    for (u64 i = kv * V + lane; i < k; i += 32) {
      float wv = widen(wr[i]);
#pragma unroll
      for (int m = 0; m < M; ++m) acc[m] += wv * widen(x[m * ldx + i]);
    }
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float v = acc[m];
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0) out[m * ldo + col] = narrow<T>((typename Acc<T>::type)v);
    }
  }
}

template <typename T, int M>
__device__ __forceinline__ void gemv_cols(const T* __restrict__ x, const T* __restrict__ b, float* __restrict__ partials,
                                          T* __restrict__ out, u64 n, u64 k, u64 ldx, u64 ldb, u64 ldo, u64 slices) {
  const int V = 16 / sizeof(T);
  const int U = 4;  // rows whose loads are issued together
  u64 c0 = ((u64)blockIdx.x * blockDim.x + threadIdx.x) * V;
  if (c0 >= n) return;
  u64 per = (k + slices - 1) / slices;
  u64 lo = blockIdx.y * per, hi = lo + per < k ? lo + per : k;
  float acc[M][V];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int j = 0; j < V; ++j) acc[m][j] = 0.0f;
  if (c0 + V <= n) {
    u64 r = lo;
    for (; r + U <= hi; r += U) {
      Vec<T, V> bv[U];
#pragma unroll
      for (int u = 0; u < U; ++u) bv[u] = *reinterpret_cast<const Vec<T, V>*>(b + (r + u) * ldb + c0);
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int m = 0; m < M; ++m) {
          float xv = widen(x[m * ldx + r + u]);
#pragma unroll
          for (int j = 0; j < V; ++j) acc[m][j] += xv * widen(bv[u].v[j]);
        }
    }
    for (; r < hi; ++r) {
      Vec<T, V> bv = *reinterpret_cast<const Vec<T, V>*>(b + r * ldb + c0);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float xv = widen(x[m * ldx + r]);
#pragma unroll
        for (int j = 0; j < V; ++j) acc[m][j] += xv * widen(bv.v[j]);
      }
    }
  } else {
    for (u64 r = lo; r < hi; ++r)
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float xv = widen(x[m * ldx + r]);
#pragma unroll
        for (int j = 0; j < V; ++j)
          if (c0 + j < n) acc[m][j] += xv * widen(b[r * ldb + c0 + j]);
      }
  }
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int j = 0; j < V; ++j)
      if (c0 + j < n) {
        if (slices == 1) out[m * ldo + c0 + j] = narrow<T>((typename Acc<T>::type)acc[m][j]);
        else partials[((u64)blockIdx.y * M + m) * n + c0 + j] = acc[m][j];
      }
}

template <typename T, int M>
__device__ __forceinline__ void gemv_finish(const float* __restrict__ partials, T* __restrict__ out, u64 n, u64 ldo,
                                            u64 slices) {
  u64 stride = (u64)gridDim.x * blockDim.x;
  for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < (u64)M * n; e += stride) {
    u64 m = e / n, c = e % n;
    float s = 0.0f;
    for (u64 sl = 0; sl < slices; ++sl) s += partials[(sl * M + m) * n + c];
    out[m * ldo + c] = narrow<T>((typename Acc<T>::type)s);
  }
}
