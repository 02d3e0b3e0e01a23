// Matrix products the backend computes itself (matmul.rs; the rest go to cuBLASLt): few-row
// float products and integer products.
//
// Matrix-vector products for few rows (M <= 8), where a library GEMM leaves bandwidth unused.
// f32 accumulation. Two weight layouts:
//  - gemv_rows: B is W^T with W [N, K] row-major (each output reads one contiguous row of W);
//    a block computes a few adjacent outputs together, K split over all its threads.
//  - gemv_cols: B [K, N] row-major; each thread owns 16 bytes of consecutive columns and runs
//    of U rows in a slice of K (blockIdx.y); slices write f32 partials that the tile's last
//    block adds.
#pragma once
#include "arith.cuh"

#define NV_GEMV_MAX_M 8
// gemv_rows: 16-byte loads of W each thread issues before using any (bytes in flight bound a
// GEMV): one per output of its group (up to 8 / M, at least 2), times steps along K.
#ifndef NV_GEMV_ROW_LOADS
#define NV_GEMV_ROW_LOADS 8
#endif
// One row (decoding one sequence): twice as many, a whole 4096-long row's share in one round
// trip (see bench/results/).
#ifndef NV_GEMV_ROW_LOADS_1
#define NV_GEMV_ROW_LOADS_1 16
#endif
#ifndef NV_GEMV_COL_LOADS
#define NV_GEMV_COL_LOADS 8
#endif

// Sums each of P (a power of two, at most 32) values over the warp's lanes with P - 1 + 5 -
// log2(P) shuffles instead of 5·P: each step sends half of the values still held to the partner
// lane and keeps the other half. Lane l ends with the total of value l / (32 / P).
template <int P> __device__ __forceinline__ float warp_sum_scatter(float (&a)[P], int lane) {
  int held = P;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    if (held > 1) {
      bool up = lane & o;
      held /= 2;
#pragma unroll
      for (int i = 0; i < P / 2; ++i)
        if (i < held) {
          float keep = up ? a[i + held] : a[i], send = up ? a[i] : a[i + held];
          a[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
        }
    } else {
      a[0] += __shfl_xor_sync(0xffffffffu, a[0], o);
    }
  }
  return a[0];
}

// What gemv_rows does to x as it loads it (fast::rms_norm_matmul, fast::swiglu_matmul):
//  - PRO_NONE reads x;
//  - PRO_RMS_NORM multiplies x by the norm's weight x2 and scales each sum by its row's
//    rsqrt(mean(x²) + eps) as it writes (a block reads whole rows of x anyway, so the statistic
//    costs it no load);
//  - PRO_SWIGLU reads silu(x) · x2, rounded to T as fast::swiglu writes it.
#define PRO_NONE 0
#define PRO_RMS_NORM 1
#define PRO_SWIGLU 2

// gemv_rows: a block takes C adjacent outputs (rows of W) at a time (plus beta · add, when
// add is given: addmm's c), C·M ≤ 16, and splits K over
// all its threads, each reading all C rows: C × U loads in flight per thread, each x vector read
// once for C rows, and a block done in a round trip or two to memory. (A warp per output took
// eight round trips at K = 4096, 2 loads at a time, and the last wave's blocks left the GPU
// idle.) Sums fold within warps (warp_sum_scatter), then across warps in shared memory. Any
// grid covers the outputs (matmul.rs launches a warp's worth of threads per output, 256 per
// block); blockDim must be a multiple of 32. x2 is PRO's second operand, its rows ldx2 apart
// (0: one vector for every row).
template <typename T, int M, int PRO>
__device__ __forceinline__ void gemv_rows(const T* __restrict__ x, const T* __restrict__ x2, u64 ldx2, float eps,
                                          const T* __restrict__ w, T* __restrict__ out, u64 n, u64 k, u64 ldx,
                                          u64 ldw, u64 ldo, const T* add, float beta) {
  const int V = 16 / sizeof(T);
  const int L = M == 1 ? NV_GEMV_ROW_LOADS_1 : NV_GEMV_ROW_LOADS;
  const int CM = 8 / M > 2 ? 8 / M : 2, C = L < CM ? L : CM;
  const int U = L / C > 0 ? L / C : 1;
  // Sums per block: C·M products, and with the norm each row's sum of squares.
  const int R = C * M, S = PRO == PRO_RMS_NORM ? M : 0, P = R + S <= 8 ? 8 : (R + S <= 16 ? 16 : 32);
  __shared__ float red[32][P];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const u64 th = blockDim.x, kv = k / V;
  for (u64 c0 = (u64)blockIdx.x * C; c0 < n; c0 += (u64)gridDim.x * C) {
    // Past the last output, rows repeat the last one (cached) and their sums are dropped.
    const T* wr[C];
#pragma unroll
    for (int c = 0; c < C; ++c) wr[c] = w + (c0 + c < n ? c0 + c : n - 1) * ldw;
    float acc[C][M], ss[M];
#pragma unroll
    for (int m = 0; m < M; ++m) {
      ss[m] = 0.0f;
#pragma unroll
      for (int c = 0; c < C; ++c) acc[c][m] = 0.0f;
    }
    // Element e of row m's operand as PRO makes it.
    auto operand = [&](int m, float v, T v2) -> float {
      if constexpr (PRO == PRO_RMS_NORM) {
        ss[m] += v * v;
        return v * widen(v2);
      } else if constexpr (PRO == PRO_SWIGLU) {
        return widen(narrow<T>(silu_fast<T>(v) * widen(v2)));
      } else {
        return v;
      }
    };
    // W travels as 32-bit words: as elements, 2-byte types took a register each to cross the
    // loop's branch.
    typedef Vec<u32, 4> Raw;
    // A prologue's operands (SwiGLU's come from L2) are loaded with W, in flight together, for
    // one or two rows (more would spill); plain x is read where it is used (L1 keeps it).
    constexpr bool XPRE = PRO != PRO_NONE && M <= 2;
    constexpr int XU = XPRE ? U : 1, XM = XPRE ? M : 1;
    Raw xr[XU][XM], x2r[XU][XM];
    auto step = [&](const Raw(&raw)[C], int u, u64 j) {
      Vec<T, V> wv[C];
      memcpy(wv, raw, sizeof(wv));
#pragma unroll
      for (int m = 0; m < M; ++m) {
        Vec<T, V> xv, x2v;
        if constexpr (XPRE) {
          memcpy(&xv, &xr[u][m], sizeof(xv));
          memcpy(&x2v, &x2r[u][m], sizeof(x2v));
        } else {
          xv = reinterpret_cast<const Vec<T, V>*>(x + m * ldx)[j];
          if constexpr (PRO != PRO_NONE) x2v = reinterpret_cast<const Vec<T, V>*>(x2 + m * ldx2)[j];
        }
        float xf[V];
#pragma unroll
        for (int e = 0; e < V; ++e) xf[e] = operand(m, widen(xv.v[e]), PRO != PRO_NONE ? x2v.v[e] : xv.v[e]);
#pragma unroll
        for (int c = 0; c < C; ++c)
#pragma unroll
          for (int e = 0; e < V; ++e) acc[c][m] += widen(wv[c].v[e]) * xf[e];
      }
    };
    // Loads are issued at the end of an iteration, across the loop's branch from their use:
    // ptxas does not move them past it, where within one block it spreads them among the
    // multiply-adds of the first ones to arrive (a warp stalling before issuing the rest). Past
    // the end of K the index repeats the last vector (cached; its products are skipped) rather
    // than a predicate splitting the loads again.
    Raw wv[U][C];
    auto load = [&](u64 j) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        u64 i = j + u * th < kv ? j + u * th : kv - 1;
#pragma unroll
        for (int c = 0; c < C; ++c) wv[u][c] = reinterpret_cast<const Raw*>(wr[c])[i];
        if constexpr (XPRE) {
#pragma unroll
          for (int m = 0; m < M; ++m) {
            xr[u][m] = reinterpret_cast<const Raw*>(x + m * ldx)[i];
            x2r[u][m] = reinterpret_cast<const Raw*>(x2 + m * ldx2)[i];
          }
        }
      }
    };
    u64 j = threadIdx.x;
    if (j < kv) load(j);
    while (j < kv) {
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (j + u * th < kv) step(wv[u], u, j + u * th);
      j += U * th;
      if (j < kv) load(j);
    }
    for (u64 e = kv * V + threadIdx.x; e < k; e += th)
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float xe = operand(m, widen(x[m * ldx + e]), PRO != PRO_NONE ? x2[m * ldx2 + e] : x[m * ldx + e]);
#pragma unroll
        for (int c = 0; c < C; ++c) acc[c][m] += widen(wr[c][e]) * xe;
      }
    float a[P];
#pragma unroll
    for (int r = 0; r < P; ++r) a[r] = r < R ? acc[r / M][r % M] : (r < R + S ? ss[(r - R) % M] : 0.0f);
    float v = warp_sum_scatter<P>(a, lane);
    if (lane % (32 / P) == 0) red[warp][lane / (32 / P)] = v;
    __syncthreads();
    for (int r = threadIdx.x; r < R; r += blockDim.x) {
      float s = 0.0f;
      for (int q = 0; q < nw; ++q) s += red[q][r];
      if constexpr (PRO == PRO_RMS_NORM) {
        float sq = 0.0f;
        for (int q = 0; q < nw; ++q) sq += red[q][R + r % M];
        s *= rsqrtf(sq / (float)k + eps);
      }
      u64 col = c0 + r / M;
      // addmm: beta · add joins the sum before its one rounding (add is [M, n] row-major).
      if (add != nullptr && col < n) s += beta * widen(add[(r % M) * ldo + col]);
      if (col < n) out[(r % M) * ldo + col] = narrow<T>((typename Acc<T>::type)s);
    }
    __syncthreads();  // red is written again by the next group
  }
}

// gemv_cols: a block owns a tile of NV_GEMV_CT * V columns and one slice of K. Its 256 threads
// are NV_GEMV_CT column threads × 32 row groups: a warp reads 128 bytes of 4 rows at a time, and
// each thread takes U consecutive rows, so its U loads of B are in flight together and its x
// values are one vector load. The row groups are summed in the block (shuffles, then shared
// memory); slices, when the tiles alone leave SMs idle, leave f32 partials and the last block
// of a tile to arrive (a counter per tile, reset by that block) adds them. matmul.rs launches
// about two blocks per SM: more bytes in flight than that measured slower (see bench/results/).
#define NV_GEMV_CT 8
#define NV_GEMV_KG 32
#define NV_GEMV_COL_BLOCK (NV_GEMV_CT * NV_GEMV_KG)

// A 16-byte load of data no kernel writes while this one runs, kept out of L1 (each byte of B is
// read once; x and the partials keep the cache).
template <typename T, int V> __device__ __forceinline__ Vec<T, V> load_once(const T* p) {
  static_assert(sizeof(Vec<T, V>) == 16, "16-byte loads");
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return *reinterpret_cast<Vec<T, V>*>(&r);
}

template <typename T, int M>
__device__ __forceinline__ void gemv_cols(const T* __restrict__ x, const T* __restrict__ b, float* __restrict__ partials,
                                          unsigned* __restrict__ counters, T* __restrict__ out, u64 n, u64 k, u64 ldx,
                                          u64 ldb, u64 ldo, u64 slices) {
  const int V = 16 / sizeof(T);
  const int U = NV_GEMV_COL_LOADS;
  const int TILE = NV_GEMV_CT * V;
  static_assert(U % V == 0, "x is read in 16-byte vectors");
  int ct = threadIdx.x % NV_GEMV_CT, kg = threadIdx.x / NV_GEMV_CT;
  u64 c0 = (u64)blockIdx.x * TILE + ct * V;
  // Slices start on multiples of U, so a thread's rows start on a 16-byte boundary of x.
  u64 per = ((k + slices - 1) / slices + U - 1) / U * U;
  u64 lo = min((u64)blockIdx.y * per, k), hi = min(lo + per, k);
  bool x_vec = (reinterpret_cast<u64>(x) % 16 == 0) && (ldx % V == 0);
  float acc[M][V];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int j = 0; j < V; ++j) acc[m][j] = 0.0f;
  u64 r = lo + (u64)kg * U;
  if (c0 + V <= n) {
    for (; r + U <= hi; r += NV_GEMV_KG * U) {
      Vec<T, V> bv[U];
#pragma unroll
      for (int u = 0; u < U; ++u) bv[u] = load_once<T, V>(b + (r + u) * ldb + c0);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float xf[U];
        if (x_vec) {
#pragma unroll
          for (int q = 0; q < U / V; ++q) {
            Vec<T, V> xq = *reinterpret_cast<const Vec<T, V>*>(x + m * ldx + r + q * V);
#pragma unroll
            for (int j = 0; j < V; ++j) xf[q * V + j] = widen(xq.v[j]);
          }
        } else {
#pragma unroll
          for (int u = 0; u < U; ++u) xf[u] = widen(x[m * ldx + r + u]);
        }
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
          for (int j = 0; j < V; ++j) acc[m][j] += xf[u] * widen(bv[u].v[j]);
      }
    }
    // The slice's last rows, when they are fewer than U, are this thread's if r stopped in them.
    for (; r < hi; ++r) {
      Vec<T, V> bv = load_once<T, V>(b + r * ldb + c0);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float xv = widen(x[m * ldx + r]);
#pragma unroll
        for (int j = 0; j < V; ++j) acc[m][j] += xv * widen(bv.v[j]);
      }
    }
  } else if (c0 < n) {
    for (; r < hi; r += NV_GEMV_KG * U)
      for (u64 q = r; q < min(r + U, hi); ++q)
#pragma unroll
        for (int m = 0; m < M; ++m) {
          float xv = widen(x[m * ldx + q]);
#pragma unroll
          for (int j = 0; j < V; ++j)
            if (c0 + j < n) acc[m][j] += xv * widen(b[q * ldb + c0 + j]);
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

// Integer matrix product, one thread per output; batch offsets from `d` (operands a, b, out).
template <typename T>
__device__ __forceinline__ void matmul_int(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out,
                                           u64 batches, u64 m, u64 n, u64 k, i64 sa0, i64 sa1, i64 sb0, i64 sb1,
                                           Dims d) {
  u64 total = batches * m * n;
  u64 stride = (u64)gridDim.x * blockDim.x;
  for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
    u64 bi = e / (m * n), r = (e / n) % m, c = e % n;
    const T* pa = a + offset_of(d, 0, bi) + (i64)r * sa0;
    const T* pb = b + offset_of(d, 1, bi) + (i64)c * sb1;
    T acc = 0;
    for (u64 l = 0; l < k; ++l) acc = wrap_add(acc, wrap_mul(pa[(i64)l * sa1], pb[(i64)l * sb0]));
    out[e] = acc;
  }
}
