// Matrix-vector products for few rows (M <= 8), where a library GEMM leaves bandwidth unused.
// f32 accumulation. Two weight layouts:
//  - gemv_rows: B is W^T with W [N, K] row-major (each output reads one contiguous row of W);
//    one warp per output column, 16-byte loads along K.
//  - gemv_cols: B [K, N] row-major; each thread owns 16 bytes of consecutive columns and a
//    slice of K (blockIdx.y); slices write f32 partials that gemv_finish sums.
#pragma once
#include "common.cuh"

#define NV_GEMV_MAX_M 8
// 16-byte loads each thread issues before using any (bytes in flight bound a GEMV); measured
// best on the H200 at 1×4096·4096×14336 bf16 (bench/cuda/tune_rows.cu).
#ifndef NV_GEMV_ROW_LOADS
#define NV_GEMV_ROW_LOADS 2
#endif
#ifndef NV_GEMV_COL_LOADS
#define NV_GEMV_COL_LOADS 8
#endif

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
    const int U = NV_GEMV_ROW_LOADS;
    u64 i = lane;
    for (; i + 32 * (U - 1) < kv; i += 32 * U) {
      Vec<T, V> wv[U];
#pragma unroll
      for (int u = 0; u < U; ++u) wv[u] = reinterpret_cast<const Vec<T, V>*>(wr)[i + 32 * u];
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int m = 0; m < M; ++m) {
          Vec<T, V> xv = reinterpret_cast<const Vec<T, V>*>(x + m * ldx)[i + 32 * u];
#pragma unroll
          for (int j = 0; j < V; ++j) acc[m] += widen(wv[u].v[j]) * widen(xv.v[j]);
        }
    }
    for (; i < kv; i += 32) {
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

// gemv_cols: a block owns a tile of NV_GEMV_CT * V columns and one slice of K. Its 256 threads
// are NV_GEMV_CT column threads × 32 row groups: a warp reads 4 consecutive rows of 128 bytes, and
// each thread keeps U rows' loads in flight. The row groups are summed in the block (shuffles,
// then shared memory); slices, when the tiles alone do not fill the GPU, leave f32 partials and
// the last block of a tile to arrive (a counter per tile, reset by that block) adds them.
#define NV_GEMV_CT 8
#define NV_GEMV_KG 32
#define NV_GEMV_COL_BLOCK (NV_GEMV_CT * NV_GEMV_KG)

template <typename T, int M>
__device__ __forceinline__ void gemv_cols(const T* __restrict__ x, const T* __restrict__ b, float* __restrict__ partials,
                                          unsigned* __restrict__ counters, T* __restrict__ out, u64 n, u64 k, u64 ldx,
                                          u64 ldb, u64 ldo, u64 slices) {
  const int V = 16 / sizeof(T);
  const int U = NV_GEMV_COL_LOADS;
  const int TILE = NV_GEMV_CT * V;
  int ct = threadIdx.x % NV_GEMV_CT, kg = threadIdx.x / NV_GEMV_CT;
  u64 c0 = (u64)blockIdx.x * TILE + ct * V;
  u64 per = (k + slices - 1) / slices;
  u64 lo = blockIdx.y * per, hi = lo + per < k ? lo + per : k;
  float acc[M][V];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int j = 0; j < V; ++j) acc[m][j] = 0.0f;
  if (c0 + V <= n) {
    u64 r = lo + kg;
    for (; r + NV_GEMV_KG * (U - 1) < hi; r += NV_GEMV_KG * U) {
      Vec<T, V> bv[U];
#pragma unroll
      for (int u = 0; u < U; ++u) bv[u] = *reinterpret_cast<const Vec<T, V>*>(b + (r + NV_GEMV_KG * u) * ldb + c0);
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int m = 0; m < M; ++m) {
          float xv = widen(x[m * ldx + r + NV_GEMV_KG * u]);
#pragma unroll
          for (int j = 0; j < V; ++j) acc[m][j] += xv * widen(bv[u].v[j]);
        }
    }
    for (; r < hi; r += NV_GEMV_KG) {
      Vec<T, V> bv = *reinterpret_cast<const Vec<T, V>*>(b + r * ldb + c0);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float xv = widen(x[m * ldx + r]);
#pragma unroll
        for (int j = 0; j < V; ++j) acc[m][j] += xv * widen(bv.v[j]);
      }
    }
  } else if (c0 < n) {
    for (u64 r = lo + kg; r < hi; r += NV_GEMV_KG)
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float xv = widen(x[m * ldx + r]);
#pragma unroll
        for (int j = 0; j < V; ++j)
          if (c0 + j < n) acc[m][j] += xv * widen(b[r * ldb + c0 + j]);
      }
  }
  // A warp holds 4 row groups of the same columns: fold them with shuffles, then the 8 warps
  // through shared memory.
  __shared__ float red[M][NV_GEMV_COL_BLOCK / 32][TILE];
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int j = 0; j < V; ++j) {
      float v = acc[m][j];
      v += __shfl_xor_sync(0xffffffffu, v, NV_GEMV_CT);
      v += __shfl_xor_sync(0xffffffffu, v, 2 * NV_GEMV_CT);
      if (lane < NV_GEMV_CT) red[m][warp][ct * V + j] = v;
    }
  __syncthreads();
  __shared__ bool last;
  for (int e = threadIdx.x; e < M * TILE; e += blockDim.x) {
    int m = e / TILE, c = e % TILE;
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < NV_GEMV_COL_BLOCK / 32; ++w) v += red[m][w][c];
    u64 col = (u64)blockIdx.x * TILE + c;
    if (col >= n) continue;
    if (slices == 1) out[m * ldo + col] = narrow<T>((typename Acc<T>::type)v);
    else partials[((u64)blockIdx.y * M + m) * n + col] = v;
  }
  if (slices == 1) return;
  // Publish this slice's partials, then count it in; the last slice to arrive sums them.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&counters[blockIdx.x], 1u) == slices - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int e = threadIdx.x; e < M * TILE; e += blockDim.x) {
    int m = e / TILE, c = e % TILE;
    u64 col = (u64)blockIdx.x * TILE + c;
    if (col >= n) continue;
    float v = 0.0f;
    for (u64 sl = 0; sl < slices; ++sl) v += __ldcg(&partials[(sl * M + m) * n + col]);
    out[m * ldo + col] = narrow<T>((typename Acc<T>::type)v);
  }
  if (threadIdx.x == 0) counters[blockIdx.x] = 0;
}
