// Times nuvec's row kernels (log-sum-exp, the cross-entropy forward's statistics, softmax) and
// decode GEMVs on the GPU against the copy ceiling measured in the same run, checks them against
// plain reference kernels, and sweeps launch shapes. It compiles the kernels' own headers
// (crates/nuvec-cuda/kernels), so a variant of a header can be timed before the dispatch in
// eval.rs / fast_rows.rs / matmul.rs changes to match; the previous ms_scan, gemv_rows and
// gemv_cols are copied below (`o_` names) to time old against new in one run. Build and run on
// the GPU machine, from the repository root:
//   nvcc -O3 -std=c++17 -arch=sm_90a -I crates/nuvec-cuda/kernels bench/cuda/tune_rows.cu -o tune && ./tune
// -DNV_ROW_LOADS=n / -DNV_GEMV_ROW_LOADS=n set the new kernels' 16-byte loads in flight per
// thread (-DNV_GEMV_COL_LOADS=n gemv_cols'); `./tune targets` stops after the target lines:
//   for u in 4 8 16; do nvcc ... -DNV_GEMV_ROW_LOADS=$u -o tune$u && ./tune$u targets; done
// Prints: the copy ceiling; "target" lines, old and new in GB/s and % of the ceiling, for bf16
// log-sum-exp 16384x4096 and 4096x16384 (a warp per row, as eval.rs), cross-entropy
// 4096x{32000,128256,152064} (a block per row, 256 threads, 1024 past 65536 columns, grid of
// resident blocks, as fast_rows.rs; also with the target's logit read before the statistics),
// the GEMV 1x4096 . W[14336,4096]^T (matmul.rs's gemv_rows launch; in parentheses two other
// GEMV shapes) and the GEMV 1x4096 . B[4096,14336] (gemv_cols, matmul.rs's launch: tiles x
// slices of K; then the blocks per SM and grid each got; in parentheses the down projection's
// shape and M = 4); "check" lines against the references (edge rows with NaN/inf, short and
// unaligned rows for 4 types; GEMVs for M = 1..8 and ragged shapes, gemv_cols for slices 1..12,
// padded B rows, unaligned x, +inf in the rows that end slices; the swept gemv_cols variants),
// each should say 0 bad; then the sweeps (threads per row, softmax; gemv_cols column threads CT
// x loads in flight U x slices, % of the copy ceiling).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>
#include "fast.cuh"
#include "gemv.cuh"

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e), __LINE__); exit(1); } } while (0)

// ---- The previous code paths (fast.cuh's ms_scan with per-vector rescaling and single-load
// remainder; gemv.cuh's warp-per-output gemv_rows with 2 loads in flight), for comparison.
template <typename A, int N> __device__ __forceinline__ void o_ms_push_n(MaxSum<A>& a, const A (&v)[N]) {
  A cm = v[0];
#pragma unroll
  for (int j = 1; j < N; ++j) cm = amax(cm, v[j]);
  if (cm == -(A)INFINITY) {
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
template <typename T>
__device__ __forceinline__ MaxSum<typename Acc<T>::type> o_ms_scan(const T* __restrict__ p, u64 len, u64 first, u64 lanes) {
  typedef typename Acc<T>::type A;
  const int N = 16 / sizeof(T);
  MaxSum<A> acc{-(A)INFINITY, (A)0};
  u64 start = 0;
  if (((unsigned long long)p % 16) == 0) {
    u64 nv = len / N;
    const int U = 8;
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
        o_ms_push_n<A, N>(acc, w);
      }
    }
    for (; i < nv; i += lanes) {
      Vec<T, N> v = reinterpret_cast<const Vec<T, N>*>(p)[i];
      A w[N];
#pragma unroll
      for (int j = 0; j < N; ++j) w[j] = widen(v.v[j]);
      o_ms_push_n<A, N>(acc, w);
    }
    start = nv * N;
  }
  for (u64 i = start + first; i < len; i += lanes) ms_push(acc, widen(p[i]));
  if (acc.s != acc.s && !(acc.m == (A)INFINITY)) acc.m = (A)NAN;
  return acc;
}
template <typename T>
__device__ __forceinline__ MaxSum<typename Acc<T>::type> o_row_max_sum_block(const T* __restrict__ p, u64 len) {
  typedef typename Acc<T>::type A;
  __shared__ A sm[32], ss[32];
  MaxSum<A> acc = ms_warp(o_ms_scan(p, len, threadIdx.x, blockDim.x));
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
template <typename T>
__device__ __forceinline__ MaxSum<typename Acc<T>::type> o_row_max_sum_warp(const T* __restrict__ p, u64 len, int lane) {
  typedef typename Acc<T>::type A;
  MaxSum<A> acc = ms_warp(o_ms_scan(p, len, lane, 32));
  if (acc.m == (A)INFINITY && __any_sync(0xffffffffu, has_nan(p, len, lane, 32))) acc.m = (A)NAN;
  return acc;
}
template <typename T, int M>
__device__ __forceinline__ void o_gemv_rows(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ out, u64 n,
                                            u64 k, u64 ldx, u64 ldw, u64 ldo) {
  const int V = 16 / sizeof(T);
  int lane = threadIdx.x & 31;
  u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
  for (u64 col = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5; col < n; col += warps) {
    const T* wr = w + col * ldw;
    float acc[M];
#pragma unroll
    for (int m = 0; m < M; ++m) acc[m] = 0.0f;
    u64 kv = k / V;
    const int U = 2;
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

// gemv.cuh's previous gemv_cols: 8 row loads per thread issued at the top of the loop (ptxas
// interleaved them with the multiply-adds: 2 in flight), the slice's last rows one at a time.
template <typename T, int M>
__device__ __forceinline__ void o_gemv_cols(const T* __restrict__ x, const T* __restrict__ b, float* __restrict__ partials,
                                          unsigned* __restrict__ counters, T* __restrict__ out, u64 n, u64 k, u64 ldx,
                                          u64 ldb, u64 ldo, u64 slices) {
  const int V = 16 / sizeof(T);
  const int U = 8;
  const int TILE = 8 * V;
  int ct = threadIdx.x % 8, kg = threadIdx.x / 8;
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
    for (; r + 32 * (U - 1) < hi; r += 32 * U) {
      Vec<T, V> bv[U];
#pragma unroll
      for (int u = 0; u < U; ++u) bv[u] = *reinterpret_cast<const Vec<T, V>*>(b + (r + 32 * u) * ldb + c0);
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int m = 0; m < M; ++m) {
          float xv = widen(x[m * ldx + r + 32 * u]);
#pragma unroll
          for (int j = 0; j < V; ++j) acc[m][j] += xv * widen(bv[u].v[j]);
        }
    }
    for (; r < hi; r += 32) {
      Vec<T, V> bv = *reinterpret_cast<const Vec<T, V>*>(b + r * ldb + c0);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float xv = widen(x[m * ldx + r]);
#pragma unroll
        for (int j = 0; j < V; ++j) acc[m][j] += xv * widen(bv.v[j]);
      }
    }
  } else if (c0 < n) {
    for (u64 r = lo + kg; r < hi; r += 32)
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
  __shared__ float red[M][8][TILE];
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int j = 0; j < V; ++j) {
      float v = acc[m][j];
      v += __shfl_xor_sync(0xffffffffu, v, 8);
      v += __shfl_xor_sync(0xffffffffu, v, 2 * 8);
      if (lane < 8) red[m][warp][ct * V + j] = v;
    }
  __syncthreads();
  __shared__ bool last;
  for (int e = threadIdx.x; e < M * TILE; e += blockDim.x) {
    int m = e / TILE, c = e % TILE;
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < 8; ++w) v += red[m][w][c];
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

// ---- Kernels as kernels.rs wraps them (OLD selects the copies above).
template <typename T, bool OLD> __global__ void lse_warp(const T* x, T* o, u64 rows, u64 len) {
  int lane = threadIdx.x & 31;
  u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
  for (u64 row = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5; row < rows; row += warps) {
    auto ms = OLD ? o_row_max_sum_warp(x + row * len, len, lane) : row_max_sum_warp(x + row * len, len, lane);
    if (lane == 0) o[row] = lse_value<T>(ms);
  }
}
template <typename T, bool OLD> __global__ void lse_block(const T* x, T* o, u64 rows, u64 len) {
  for (u64 row = blockIdx.x; row < rows; row += gridDim.x) {
    auto ms = OLD ? o_row_max_sum_block(x + row * len, len) : row_max_sum_block(x + row * len, len);
    if (threadIdx.x == 0) o[row] = lse_value<T>(ms);
  }
}
// norm.cuh's cross_entropy_rows (row_lse, then the target's logit), under its launch bound.
// EARLY reads the target's logit before the statistics instead of after them (thread 0 then
// does not start the next row a memory round trip late, holding the block at its barriers).
template <typename T, bool OLD, bool EARLY = false>
__global__ void __launch_bounds__(1024) ce(const T* x, const i32* t, typename Acc<T>::type* loss, u64 rows, u64 len) {
  typedef typename Acc<T>::type A;
  for (u64 row = blockIdx.x; row < rows; row += gridDim.x) {
    i32 target = t[row];
    if (target < 0) {
      if (threadIdx.x == 0) loss[row] = 0;
      continue;
    }
    A xt = 0;
    if (EARLY && threadIdx.x == 0 && (u64)target < len) xt = widen(x[row * len + target]);
    auto ms = OLD ? o_row_max_sum_block(x + row * len, len) : row_max_sum_block(x + row * len, len);
    A lse = (isinf(ms.m) || ms.m != ms.m) ? ms.m : log(ms.s) + ms.m;
    if (!EARLY && threadIdx.x == 0 && (u64)target < len) xt = widen(x[row * len + target]);
    if (threadIdx.x == 0) loss[row] = (u64)target < len ? lse - xt : (A)NAN;
  }
}
template <typename T> __global__ void sm_block(const T* x, T* o, u64 r, u64 l) { softmax_rows<T>(x, o, r, l); }
template <typename T> __global__ void sm_warp(const T* x, T* o, u64 r, u64 l) { softmax_rows_warp<T>(x, o, r, l); }
template <typename T, int M, bool OLD>
__global__ void grows(const T* x, const T* w, T* o, u64 n, u64 k, u64 ldx, u64 ldw, u64 ldo) {
  if constexpr (OLD) o_gemv_rows<T, M>(x, w, o, n, k, ldx, ldw, ldo);
  else gemv_rows<T, M>(x, w, o, n, k, ldx, ldw, ldo);
}
// kernels.rs's gemv_cols_{M} (CT, U: the new kernel's column threads and loads in flight).
template <typename T, int M, bool OLD, int CT = NV_GEMV_CT, int U = NV_GEMV_COL_LOADS>
__global__ void __launch_bounds__(NV_GEMV_COL_BLOCK) gcols(const T* x, const T* b, float* p, unsigned* c, T* o, u64 n, u64 k,
                                                           u64 ldx, u64 ldb, u64 ldo, u64 s) {
  if constexpr (OLD) o_gemv_cols<T, M>(x, b, p, c, o, n, k, ldx, ldb, ldo, s);
  else gemv_cols<T, M, CT, U>(x, b, p, c, o, n, k, ldx, ldb, ldo, s);
}

// ---- References: a thread per row / output, double precision, the composition's semantics.
template <typename T> __global__ void ref_lse(const T* x, double* o, u64 rows, u64 len) {
  u64 r = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const T* p = x + r * len;
  double m = -INFINITY;
  bool nan = false;
  for (u64 i = 0; i < len; ++i) {
    double v = (double)widen(p[i]);
    if (v != v) nan = true;
    else if (v > m) m = v;
  }
  if (nan) { o[r] = NAN; return; }
  if (isinf(m)) { o[r] = m; return; }
  double s = 0;
  for (u64 i = 0; i < len; ++i) s += exp((double)widen(p[i]) - m);
  o[r] = log(s) + m;
}
// Output c of row m: sum over i of x[m, i] * w[c * wc + i * wi] (W^T: wc = ldw, wi = 1; B [K, N]:
// wc = 1, wi = ldb).
template <typename T> __global__ void ref_gemv(const T* x, const T* w, double* o, double* mag, int M, u64 n, u64 k, u64 ldx, u64 wc, u64 wi) {
  u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= (u64)M * n) return;
  u64 m = e / n, c = e % n;
  double s = 0, a = 0;
  for (u64 i = 0; i < k; ++i) {
    double p = (double)widen(x[m * ldx + i]) * (double)widen(w[c * wc + i * wi]);
    s += p;
    a += fabs(p);
  }
  o[e] = s;
  mag[e] = a;
}
// Deterministic inputs: uniform in [lo, hi) from a hash of the index.
template <typename T> __global__ void fill(T* p, u64 n, float lo, float hi, u32 seed) {
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
    u64 h = (i + 1) * 0x9E3779B97F4A7C15ull ^ ((u64)seed << 32);
    h ^= h >> 29; h *= 0xBF58476D1CE4E5B9ull; h ^= h >> 32;
    p[i] = narrow<T>((typename Acc<T>::type)(lo + (hi - lo) * (float)(h >> 40) * (1.0f / 16777216.0f)));
  }
}

static float time_ms(int iters, const std::function<void()>& f) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) f();
  float best = 1e30f;
  for (int rep = 0; rep < 3; ++rep) {  // best of three batches
    CK(cudaEventRecord(a));
    for (int i = 0; i < iters; ++i) f();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms; CK(cudaEventElapsedTime(&ms, a, b));
    if (ms / iters < best) best = ms / iters;
  }
  CK(cudaGetLastError());
  CK(cudaEventDestroy(a)); CK(cudaEventDestroy(b));
  return best;
}

static int sms;
static double ceil_gbs;

static void target(const char* what, double bytes, const std::function<void()>& old_f, const std::function<void()>& new_f,
                   const char* extra_name = nullptr, const std::function<void()>& extra_f = nullptr) {
  float mo = time_ms(20, old_f), mn = time_ms(20, new_f);
  double go = bytes / mo / 1e6, gn = bytes / mn / 1e6;
  printf("target %-40s old %7.1f GB/s %5.1f%%   new %7.1f GB/s %5.1f%%", what, go, 100 * go / ceil_gbs, gn, 100 * gn / ceil_gbs);
  if (extra_f) {
    double ge = bytes / time_ms(20, extra_f) / 1e6;
    printf("   %s %7.1f GB/s %5.1f%%", extra_name, ge, 100 * ge / ceil_gbs);
  }
  printf("\n");
}

// eval.rs: a warp per row up to 64 KiB (grid_for: rows / 8 blocks of 256, at most 32 per SM).
template <typename T, bool OLD> static void launch_lse_warp(const T* x, T* o, u64 rows, u64 len) {
  u64 g = (rows + 7) / 8, cap = (u64)sms * 32;
  lse_warp<T, OLD><<<(unsigned)(g < cap ? g : cap), 256>>>(x, o, rows, len);
}
// fast_rows.rs: 256 threads per row up to 64 K features, 1024 beyond; row_grid: as many blocks
// as are resident at once.
template <typename T, bool OLD, bool EARLY = false>
static std::function<void()> launch_ce(const T* x, const i32* t, float* loss, u64 rows, u64 len, int threads = 0) {
  int per = 0;
  if (threads == 0) threads = len > 65536 ? 1024 : 256;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, ce<T, OLD, EARLY>, threads, 0));
  u64 resident = (u64)(per > 0 ? per : 1) * sms, g = rows < resident ? rows : resident;
  return [=] { ce<T, OLD, EARLY><<<(unsigned)g, threads>>>(x, t, loss, rows, len); };
}
// matmul.rs: n / 8 blocks of 256 (a warp's worth of threads per output).
template <typename T, int M, bool OLD>
static void launch_gemv(const T* x, const T* w, T* o, u64 n, u64 k, u64 ldx, u64 ldw, u64 ldo, unsigned block = 256,
                        unsigned grid = 0) {
  u64 g = (n + block / 32 - 1) / (block / 32), cap = 65535ull * 32;
  if (grid == 0) grid = (unsigned)(g < cap ? g : cap);
  grows<T, M, OLD><<<grid, block>>>(x, w, o, n, k, ldx, ldw, ldo);
}

// matmul.rs's gemv_cols launch: tiles of NV_GEMV_CT * V columns (CT here), 256 threads, slices as
// many as keep every block resident in one wave, at least 128 rows each (slices = 0), or as
// given. Partials and per-tile counters (zeroed once; the kernel resets them) are shared.
static float* col_partials;
static unsigned* col_counters;
static const u64 col_partials_floats = 16ull << 20, col_counter_words = 1 << 18;
struct ColsPlan { u64 tiles, slices; int per_sm; };
template <typename T, int M, bool OLD, int CT = NV_GEMV_CT, int U = NV_GEMV_COL_LOADS>
static ColsPlan cols_plan(u64 n, u64 k, u64 slices = 0) {
  const u64 V = 16 / sizeof(T);
  int per = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, gcols<T, M, OLD, CT, U>, NV_GEMV_COL_BLOCK, 0));
  u64 tiles = (n + CT * V - 1) / (CT * V), resident = (u64)per * sms;
  if (slices == 0) {
    slices = resident / tiles;
    u64 cap = (k + 127) / 128;
    if (slices > cap) slices = cap;
    if (slices < 1) slices = 1;
    if (slices > 65535) slices = 65535;
  }
  if (slices > 1 && (slices * M * n > col_partials_floats || tiles > col_counter_words)) { printf("cols_plan: buffers too small\n"); exit(1); }
  return {tiles, slices, per};
}
template <typename T, int M, bool OLD, int CT = NV_GEMV_CT, int U = NV_GEMV_COL_LOADS>
static std::function<void()> launch_cols(const T* x, const T* b, T* o, u64 n, u64 k, u64 ldx, u64 ldb, u64 ldo, u64 slices = 0) {
  ColsPlan pl = cols_plan<T, M, OLD, CT, U>(n, k, slices);
  float* p = col_partials;
  unsigned* c = col_counters;
  return [=] { gcols<T, M, OLD, CT, U><<<dim3((unsigned)pl.tiles, (unsigned)pl.slices), NV_GEMV_COL_BLOCK>>>(x, b, p, c, o, n, k, ldx, ldb, ldo, pl.slices); };
}

// ---- Checks.
static float h2f(bf16 v) { return __bfloat162float(v); }
static float h2f(f16 v) { return __half2float(v); }
static float h2f(float v) { return v; }
static double h2f(double v) { return v; }
template <typename T> static T f2h(float v);
template <> bf16 f2h<bf16>(float v) { return __float2bfloat16(v); }
template <> f16 f2h<f16>(float v) { return __float2half(v); }
template <> float f2h<float>(float v) { return v; }
template <> double f2h<double>(float v) { return v; }

static bool agrees(double got, double want, double tol) {
  if (want != want) return got != got;
  if (std::isinf(want)) return got == want;
  return fabs(got - want) <= tol;
}

// Rows of `len` elements, packed (odd lengths leave rows unaligned), starting `shift` elements
// past an aligned address; row kinds cover NaN/inf combinations. Both the warp and the block
// kernel (64 and 256 threads) are checked against ref_lse; returns the mismatches.
template <typename T> static int check_lse(const char* ty, u64 len, u64 shift) {
  const int kinds = 12;
  u64 rows = 3 * kinds, n = rows * len + shift;
  std::vector<T> h(n);
  u64 s = 12345 + len;
  auto rnd = [&] { s = s * 6364136223846793005ull + 1442695040888963407ull; return (float)((s >> 40) & 0xffffff) / 16777216.0f; };
  for (u64 i = 0; i < n; ++i) h[i] = f2h<T>(8 * rnd() - 4);
  for (u64 r = 0; r < rows; ++r) {
    T* p = &h[shift + r * len];
    u64 a = (u64)(rnd() * len), b = (u64)(rnd() * len);
    float inf = INFINITY, nan = NAN;
    switch (r % kinds) {
      case 0: break;                                                   // plain
      case 1: p[a] = f2h<T>(nan); break;                               // one NaN
      case 2: p[a] = f2h<T>(inf); break;                               // +inf: the maximum
      case 3: p[a] = f2h<T>(inf); p[b] = f2h<T>(inf); break;           // two (or one) +inf
      case 4: for (u64 i = 0; i < len; ++i) p[i] = f2h<T>(-inf); break;  // all -inf
      case 5: for (u64 i = 0; i < len; ++i) p[i] = f2h<T>(-inf); p[a] = f2h<T>(nan); break;
      case 6: p[a] = f2h<T>(inf); p[b] = f2h<T>(nan); break;           // +inf and NaN
      case 7: for (u64 i = 0; i < len; ++i) p[i] = f2h<T>(nan); break;   // all NaN
      case 8: for (u64 i = 0; i < len; ++i) p[i] = f2h<T>(-inf); p[a] = f2h<T>(1.5f); break;
      case 9: for (u64 i = 0; i < len; ++i) p[i] = f2h<T>(60 + 30 * rnd()); break;  // exp would overflow
      case 10: for (u64 i = 0; i < len; ++i) p[i] = f2h<T>(i % 3 ? -inf : 2 * rnd()); break;
      case 11: for (u64 i = 0; i < len; ++i) p[i] = f2h<T>((float)i / len * 20 - 10); break;  // rising: rescales
    }
  }
  T *x, *o; double* ref;
  CK(cudaMalloc(&x, n * sizeof(T) + 16)); CK(cudaMalloc(&o, rows * sizeof(T))); CK(cudaMalloc(&ref, rows * 8));
  CK(cudaMemcpy(x, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  ref_lse<T><<<(unsigned)((rows + 63) / 64), 64>>>(x + shift, ref, rows, len);
  std::vector<double> want(rows);
  CK(cudaMemcpy(want.data(), ref, rows * 8, cudaMemcpyDeviceToHost));
  int bad = 0;
  std::vector<T> got(rows);
  for (int variant = 0; variant < 3; ++variant) {
    CK(cudaMemset(o, 0x55, rows * sizeof(T)));
    if (variant == 0) lse_warp<T, false><<<(unsigned)((rows + 7) / 8), 256>>>(x + shift, o, rows, len);
    if (variant == 1) lse_block<T, false><<<(unsigned)rows, 256>>>(x + shift, o, rows, len);
    if (variant == 2) lse_block<T, false><<<5, 64>>>(x + shift, o, rows, len);
    CK(cudaGetLastError());
    CK(cudaMemcpy(got.data(), o, rows * sizeof(T), cudaMemcpyDeviceToHost));
    double rel = sizeof(T) == 2 ? 1.0 / 128 : sizeof(T) == 4 ? 1e-5 : 1e-10;
    for (u64 r = 0; r < rows; ++r) {
      double g = h2f(got[r]);
      if (!agrees(g, want[r], rel * fabs(want[r]) + rel)) {
        if (bad < 5) printf("  lse %s len %llu shift %llu variant %d row %llu (kind %llu): got %g want %g\n", ty, len, shift, variant, r, r % kinds, g, want[r]);
        ++bad;
      }
    }
  }
  CK(cudaFree(x)); CK(cudaFree(o)); CK(cudaFree(ref));
  return bad;
}

template <typename T, int M> static int check_gemv_m(u64 n, u64 k, unsigned block, unsigned grid) {
  const int V = 16 / sizeof(T);
  u64 ldw = (k + V - 1) / V * V, ldx = M > 1 ? ldw + V : k;  // the dispatch's alignment rules
  u64 nx = (u64)M * (ldx > k ? ldx : k), nw = n * ldw;
  T *x, *w, *o; double *ref, *mag;
  CK(cudaMalloc(&x, nx * sizeof(T))); CK(cudaMalloc(&w, nw * sizeof(T))); CK(cudaMalloc(&o, M * n * sizeof(T)));
  CK(cudaMalloc(&ref, M * n * 8)); CK(cudaMalloc(&mag, M * n * 8));
  fill<T><<<256, 256>>>(x, nx, -1, 1, 7 + M);
  fill<T><<<1024, 256>>>(w, nw, -1, 1, 11 + (u32)k);
  ref_gemv<T><<<(unsigned)((M * n + 127) / 128), 128>>>(x, w, ref, mag, M, n, k, ldx, ldw, 1);
  CK(cudaMemset(o, 0x55, M * n * sizeof(T)));
  launch_gemv<T, M, false>(x, w, o, n, k, ldx, ldw, n, block, grid);
  CK(cudaGetLastError());
  std::vector<T> got(M * n);
  std::vector<double> want(M * n), m(M * n);
  CK(cudaMemcpy(got.data(), o, M * n * sizeof(T), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(want.data(), ref, M * n * 8, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(m.data(), mag, M * n * 8, cudaMemcpyDeviceToHost));
  int bad = 0;
  double rel = sizeof(T) == 2 ? 1.0 / 128 : 1e-6;  // the output's rounding
  for (u64 e = 0; e < (u64)M * n; ++e) {
    double g = h2f(got[e]);
    if (!agrees(g, want[e], rel * fabs(want[e]) + 3e-5 * m[e] + 1e-6)) {
      if (bad < 3) printf("  gemv M %d n %llu k %llu block %u: out[%llu] got %g want %g\n", M, n, k, block, e, g, want[e]);
      ++bad;
    }
  }
  CK(cudaFree(x)); CK(cudaFree(w)); CK(cudaFree(o)); CK(cudaFree(ref)); CK(cudaFree(mag));
  return bad;
}
template <typename T> static int check_gemv(u64 n, u64 k, unsigned block = 256, unsigned grid = 0) {
  return check_gemv_m<T, 1>(n, k, block, grid) + check_gemv_m<T, 2>(n, k, block, grid) + check_gemv_m<T, 3>(n, k, block, grid) +
         check_gemv_m<T, 4>(n, k, block, grid) + check_gemv_m<T, 5>(n, k, block, grid) + check_gemv_m<T, 6>(n, k, block, grid) +
         check_gemv_m<T, 7>(n, k, block, grid) + check_gemv_m<T, 8>(n, k, block, grid);
}

// gemv_cols against ref_gemv for each of `slices`: B [k, n] with row stride ldb (n rounded up to
// a vector, plus `pad` vectors), x rows k + 3 apart (M > 1) starting `xoff` elements past an
// aligned address (the cols dispatch does not require x aligned). `edge`: the rows that end a
// slice (for every slice count checked) hold +inf in every fifth column, so the repeated rows of
// a last iteration must add nothing (a product of 0 and inf would give NaN).
template <typename T, int M, int CT = NV_GEMV_CT, int U = NV_GEMV_COL_LOADS>
static int check_cols_m(u64 n, u64 k, u64 pad, u64 xoff, const std::vector<u64>& slice_list, bool edge = false) {
  const u64 V = 16 / sizeof(T);
  u64 ldb = (n + V - 1) / V * V + pad * V, ldx = M > 1 ? k + 3 : k;
  u64 nx = xoff + (u64)M * ldx, nb = k * ldb;
  T *x, *b, *o; double *ref, *mag;
  CK(cudaMalloc(&x, nx * sizeof(T))); CK(cudaMalloc(&b, nb * sizeof(T))); CK(cudaMalloc(&o, M * n * sizeof(T)));
  CK(cudaMalloc(&ref, M * n * 8)); CK(cudaMalloc(&mag, M * n * 8));
  fill<T><<<256, 256>>>(x, nx, -1, 1, 17 + M);
  fill<T><<<1024, 256>>>(b, nb, -1, 1, 19 + (u32)k);
  if (edge) {
    std::vector<T> hb(nb);
    CK(cudaMemcpy(hb.data(), b, nb * sizeof(T), cudaMemcpyDeviceToHost));
    for (u64 s : slice_list) {
      u64 per = (k + s - 1) / s;
      for (u64 e = per; e <= k + per - 1; e += per) {
        u64 r = (e < k ? e : k) - 1;
        for (u64 c = 1; c < n; c += 5) hb[r * ldb + c] = f2h<T>(INFINITY);
      }
    }
    CK(cudaMemcpy(b, hb.data(), nb * sizeof(T), cudaMemcpyHostToDevice));
  }
  ref_gemv<T><<<(unsigned)((M * n + 127) / 128), 128>>>(x + xoff, b, ref, mag, M, n, k, ldx, 1, ldb);
  std::vector<T> got(M * n);
  std::vector<double> want(M * n), m(M * n);
  CK(cudaMemcpy(want.data(), ref, M * n * 8, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(m.data(), mag, M * n * 8, cudaMemcpyDeviceToHost));
  int bad = 0;
  double rel = sizeof(T) == 2 ? 1.0 / 128 : 1e-6;  // the output's rounding
  for (u64 s : slice_list) {
    CK(cudaMemset(o, 0x55, M * n * sizeof(T)));
    launch_cols<T, M, false, CT, U>(x + xoff, b, o, n, k, ldx, ldb, n, s)();
    CK(cudaGetLastError());
    CK(cudaMemcpy(got.data(), o, M * n * sizeof(T), cudaMemcpyDeviceToHost));
    for (u64 e = 0; e < (u64)M * n; ++e) {
      double g = h2f(got[e]);
      if (!agrees(g, want[e], rel * fabs(want[e]) + 3e-5 * m[e] + 1e-6)) {
        if (bad < 3) printf("  gemv cols CT %d U %d M %d n %llu k %llu slices %llu: out[%llu] got %g want %g\n", CT, U, M, n, k, s, e, g, want[e]);
        ++bad;
      }
    }
  }
  CK(cudaFree(x)); CK(cudaFree(b)); CK(cudaFree(o)); CK(cudaFree(ref)); CK(cudaFree(mag));
  return bad;
}
template <typename T>
static int check_cols(u64 n, u64 k, u64 pad, u64 xoff, const std::vector<u64>& sl, bool edge = false) {
  return check_cols_m<T, 1>(n, k, pad, xoff, sl, edge) + check_cols_m<T, 2>(n, k, pad, xoff, sl, edge) +
         check_cols_m<T, 3>(n, k, pad, xoff, sl, edge) + check_cols_m<T, 4>(n, k, pad, xoff, sl, edge) +
         check_cols_m<T, 5>(n, k, pad, xoff, sl, edge) + check_cols_m<T, 6>(n, k, pad, xoff, sl, edge) +
         check_cols_m<T, 7>(n, k, pad, xoff, sl, edge) + check_cols_m<T, 8>(n, k, pad, xoff, sl, edge);
}
// The swept variants (column threads CT, loads U), M = 1 and 2.
template <int CT, int U> static int check_cols_variant(u64 n, u64 k, const std::vector<u64>& sl) {
  return check_cols_m<bf16, 1, CT, U>(n, k, 1, 1, sl) + check_cols_m<bf16, 2, CT, U>(n, k, 0, 0, sl) +
         check_cols_m<float, 1, CT, U>(n, k, 0, 1, sl) + check_cols_m<float, 2, CT, U>(n, k, 1, 0, sl);
}

// Times gemv_cols<bf16, M, CT, U> on B [k, n] for matmul.rs's slice count (auto) and others.
template <int CT, int U, int M = 1> static void sweep_cols(const bf16* x, const bf16* b, bf16* o, u64 n, u64 k) {
  ColsPlan a = cols_plan<bf16, M, false, CT, U>(n, k);
  double bytes = (double)n * k * 2;
  printf("gemv cols bf16 %dx%llu . [%llu,%llu] CT %2d U %2d: %d blocks/SM, %4llu tiles, %% of copy for slices auto(%llu)", M, k, k,
         n, CT, U, a.per_sm, a.tiles, a.slices);
  for (u64 s : {0ull, 1ull, 2ull, 3ull, 4ull, 6ull, 8ull, 12ull}) {
    float ms = time_ms(20, launch_cols<bf16, M, false, CT, U>(x, b, o, n, k, k, n, n, s));
    if (s) printf(" %llu:", s);
    printf(" %5.1f", 100 * bytes / ms / 1e6 / ceil_gbs);
  }
  printf("\n");
}

template <typename T> void rows_case(const char* op, const char* ty, u64 rows, u64 len, void* x, void* o) {
  double bytes = (double)rows * len * sizeof(T) * (op[0] == 's' ? 2 : 1);
  for (int g = 32; g <= 1024; g *= 4) {
    float ms;
    if (op[0] == 'l') {
      if (g == 32) ms = time_ms(20, [&] { lse_warp<T, false><<<(unsigned)((rows + 7) / 8), 256>>>((T*)x, (T*)o, rows, len); });
      else ms = time_ms(20, [&] { lse_block<T, false><<<(unsigned)rows, g>>>((T*)x, (T*)o, rows, len); });
    } else {
      if (g == 32) ms = time_ms(20, [&] { sm_warp<T><<<(unsigned)((rows + 7) / 8), 256>>>((T*)x, (T*)o, rows, len); });
      else ms = time_ms(20, [&] { sm_block<T><<<(unsigned)rows, g>>>((T*)x, (T*)o, rows, len); });
    }
    double gbs = bytes / ms / 1e6;
    printf("%s %s %llux%llu threads/row %4d: %7.1f GB/s %5.1f%%\n", op, ty, rows, len, g, gbs, 100 * gbs / ceil_gbs);
  }
}

int main(int argc, char** argv) {
  bool only_targets = argc > 1 && !strcmp(argv[1], "targets");
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  size_t big = 256ull << 20;
  void *x, *o, *y;
  CK(cudaMalloc(&x, big)); CK(cudaMalloc(&o, big)); CK(cudaMalloc(&y, big));
  fill<float><<<4096, 256>>>((float*)x, big / 4, -4, 4, 1);
  fill<bf16><<<4096, 256>>>((bf16*)y, big / 2, -4, 4, 2);
  float cms = time_ms(20, [&] { CK(cudaMemcpyAsync(o, x, big, cudaMemcpyDeviceToDevice)); });
  ceil_gbs = 2.0 * big / cms / 1e6;
  printf("copy ceiling: %.1f GB/s (%d SMs), NV_ROW_LOADS %d, NV_GEMV_ROW_LOADS %d, NV_GEMV_COL_LOADS %d\n", ceil_gbs, sms, NV_ROW_LOADS,
         NV_GEMV_ROW_LOADS, NV_GEMV_COL_LOADS);
  CK(cudaMalloc(&col_partials, col_partials_floats * 4)); CK(cudaMalloc(&col_counters, col_counter_words * 4));
  CK(cudaMemset(col_counters, 0, col_counter_words * 4));

  // ---- Targets.
  bf16* yb = (bf16*)y;
  bf16* ob = (bf16*)o;
  for (u64 len : {4096ull, 16384ull}) {
    u64 rows = (64ull << 20) / len;  // 128 MiB of bf16
    char what[64];
    snprintf(what, sizeof what, "lse bf16 %llux%llu (warp)", rows, len);
    target(what, (double)rows * len * 2, [&] { launch_lse_warp<bf16, true>(yb, ob, rows, len); },
           [&] { launch_lse_warp<bf16, false>(yb, ob, rows, len); });
    std::vector<unsigned short> a(rows), b(rows);
    launch_lse_warp<bf16, true>(yb, ob, rows, len);
    CK(cudaMemcpy(a.data(), ob, rows * 2, cudaMemcpyDeviceToHost));
    launch_lse_warp<bf16, false>(yb, ob, rows, len);
    CK(cudaMemcpy(b.data(), ob, rows * 2, cudaMemcpyDeviceToHost));
    int d = 0;
    for (u64 r = 0; r < rows; ++r) d += a[r] != b[r] && a[r] + 1 != b[r] && a[r] != b[r] + 1;
    if (d) printf("  lse %llu: %d of %llu outputs differ between old and new by more than 1 bf16 ulp\n", len, d, rows);
  }
  {
    u64 rows = 4096, maxlen = 152064;
    bf16* logits;
    i32* tg;
    float* loss;
    CK(cudaMalloc(&logits, rows * maxlen * 2)); CK(cudaMalloc(&tg, rows * 4)); CK(cudaMalloc(&loss, rows * 4));
    fill<bf16><<<8192, 256>>>(logits, rows * maxlen, -8, 8, 3);
    std::vector<i32> ht(rows);
    for (u64 len : {32000ull, 128256ull, 152064ull}) {
      for (u64 r = 0; r < rows; ++r) ht[r] = (i32)((r * 7919) % len);
      CK(cudaMemcpy(tg, ht.data(), rows * 4, cudaMemcpyHostToDevice));
      char what[64];
      snprintf(what, sizeof what, "cross-entropy bf16 %llux%llu (%d thr)", rows, len, len > 65536 ? 1024 : 256);
      auto ce_old = launch_ce<bf16, true>(logits, tg, loss, rows, len), ce_new = launch_ce<bf16, false>(logits, tg, loss, rows, len);
      int alt = len > 65536 ? 512 : 128;
      target(what, (double)rows * len * 2, ce_old, ce_new, alt == 512 ? "new 512 thr" : "new 128 thr", launch_ce<bf16, false>(logits, tg, loss, rows, len, alt));
      // Old and new agree (f32 losses; summation order and rescaling points differ).
      std::vector<float> lo(rows), ln(rows);
      ce_old();
      CK(cudaMemcpy(lo.data(), loss, rows * 4, cudaMemcpyDeviceToHost));
      ce_new();
      CK(cudaMemcpy(ln.data(), loss, rows * 4, cudaMemcpyDeviceToHost));
      int bad = 0;
      for (u64 r = 0; r < rows; ++r) bad += !(fabsf(lo[r] - ln[r]) <= 1e-4f * fabsf(lo[r]) + 1e-4f);
      if (bad) printf("  cross-entropy %llu: %d of %llu losses differ between old and new\n", len, bad, rows);
    }
    CK(cudaFree(logits)); CK(cudaFree(tg)); CK(cudaFree(loss));
  }
  u64 n = 14336, k = 4096;
  double wbytes = (double)n * k * 2;
  bf16* xv = (bf16*)o;  // up to 8 rows of 14336 inputs
  bf16* out = (bf16*)o + (1 << 20);
  fill<bf16><<<256, 256>>>(xv, 8 * 14336, -1, 1, 4);
  target("gemv rows bf16 1x4096 . [14336,4096]^T", wbytes, [&] { launch_gemv<bf16, 1, true>(xv, yb, out, n, k, k, k, n); },
         [&] { launch_gemv<bf16, 1, false>(xv, yb, out, n, k, k, k, n); });
  // Not a target: the down projection's shape (long K, fewer outputs: 512 blocks), and M = 4.
  target("(gemv rows bf16 1x14336 . [4096,14336]^T)", wbytes, [&] { launch_gemv<bf16, 1, true>(xv, yb, out, k, n, n, n, k); },
         [&] { launch_gemv<bf16, 1, false>(xv, yb, out, k, n, n, n, k); });
  target("(gemv rows bf16 4x4096 . [14336,4096]^T)", wbytes, [&] { launch_gemv<bf16, 4, true>(xv, yb, out, n, k, k, k, n); },
         [&] { launch_gemv<bf16, 4, false>(xv, yb, out, n, k, k, k, n); });
  // B [K, N] row-major (gemv_cols), matmul.rs's launch: the target, then the down projection's
  // shape and M = 4.
  {
    ColsPlan po = cols_plan<bf16, 1, true>(n, k), pn = cols_plan<bf16, 1, false>(n, k);
    target("gemv cols bf16 1x4096 . [4096,14336]", wbytes, launch_cols<bf16, 1, true>(xv, yb, out, n, k, k, n, n),
           launch_cols<bf16, 1, false>(xv, yb, out, n, k, k, n, n));
    printf("  (old %d blocks/SM, %llu x %llu blocks; new %d blocks/SM, %llu x %llu blocks)\n", po.per_sm, po.tiles, po.slices,
           pn.per_sm, pn.tiles, pn.slices);
    target("(gemv cols bf16 1x14336 . [14336,4096])", wbytes, launch_cols<bf16, 1, true>(xv, yb, out, k, n, n, k, k),
           launch_cols<bf16, 1, false>(xv, yb, out, k, n, n, k, k));
    target("(gemv cols bf16 4x4096 . [4096,14336])", wbytes, launch_cols<bf16, 4, true>(xv, yb, out, n, k, k, n, n),
           launch_cols<bf16, 4, false>(xv, yb, out, n, k, k, n, n));
  }
  if (only_targets) return 0;

  // ---- Checks against the references.
  int bad = 0;
  for (u64 len : {1ull, 3ull, 7ull, 8ull, 9ull, 17ull, 100ull, 255ull, 1000ull, 4096ull, 4099ull, 33000ull})
    for (u64 shift : {0ull, 1ull, 5ull}) {
      bad += check_lse<bf16>("bf16", len, shift);
      bad += check_lse<f16>("f16", len, shift);
      bad += check_lse<float>("f32", len, shift);
      bad += check_lse<double>("f64", len, shift);
    }
  printf("check lse (edge rows, 12 lengths x 3 offsets x 4 types x 3 launches): %d bad\n", bad);
  bad = 0;
  for (auto nk : std::vector<std::pair<u64, u64>>{{1, 8}, {7, 13}, {9, 4096}, {37, 1000}, {37, 1003}, {300, 257}, {3, 70001}, {14336, 4096}}) {
    bad += check_gemv<bf16>(nk.first, nk.second);
    bad += check_gemv<f16>(nk.first, nk.second);
    bad += check_gemv<float>(nk.first, nk.second);
  }
  bad += check_gemv<bf16>(1000, 4096, 96, 3);  // 3 warps per block, grid-stride over groups
  bad += check_gemv<float>(77, 515, 512, 2);
  printf("check gemv rows (M 1..8, 8 shapes x 3 types, 2 other launches): %d bad\n", bad);
  {
    std::vector<unsigned short> a(n), b(n);
    launch_gemv<bf16, 1, true>(xv, yb, out, n, k, k, k, n);
    CK(cudaMemcpy(a.data(), out, n * 2, cudaMemcpyDeviceToHost));
    launch_gemv<bf16, 1, false>(xv, yb, out, n, k, k, k, n);
    CK(cudaMemcpy(b.data(), out, n * 2, cudaMemcpyDeviceToHost));
    int d = 0;
    for (u64 i = 0; i < n; ++i) { int e = (int)a[i] - (int)b[i]; if (e > 2 || e < -2) ++d; }
    printf("check gemv rows old vs new 1x4096x14336: %d of %llu outputs differ by more than 2 bf16 ulps\n", d, n);
  }

  bad = 0;
  {
    std::vector<u64> all = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, few = {1, 2, 3, 7};
    // n: below, at and past one tile (64 bf16 / 32 f32 columns), ragged; k: 1 to 4099 rows.
    for (auto nk : std::vector<std::pair<u64, u64>>{{1, 1}, {7, 5}, {8, 13}, {9, 128}, {63, 300}, {65, 1000}, {100, 4099}, {1000, 257}, {777, 2048}}) {
      u64 pad = nk.first % 2, xoff = nk.second % 3;
      bad += check_cols<bf16>(nk.first, nk.second, pad, xoff, all);
      bad += check_cols<f16>(nk.first, nk.second, pad, xoff, all);
      bad += check_cols<float>(nk.first, nk.second, pad, xoff, all);
    }
    bad += check_cols<bf16>(14336, 4096, 0, 0, few);
    bad += check_cols<float>(4096, 14336, 0, 0, few);
    bad += check_cols<bf16>(100, 300, 0, 1, few, true);
    bad += check_cols<f16>(70, 1001, 1, 0, few, true);
    bad += check_cols<float>(33, 515, 0, 2, few, true);
  }
  printf("check gemv cols (M 1..8, 9 ragged shapes x 3 types x slices 1..12, 2 large, 3 with inf at slice ends): %d bad\n", bad);
  bad = 0;
  for (auto nk : std::vector<std::pair<u64, u64>>{{65, 300}, {1000, 4099}}) {
    bad += check_cols_variant<8, 4>(nk.first, nk.second, {1, 3, 7});
    bad += check_cols_variant<8, 16>(nk.first, nk.second, {1, 3, 7});
    bad += check_cols_variant<16, 8>(nk.first, nk.second, {1, 3, 7});
    bad += check_cols_variant<32, 8>(nk.first, nk.second, {1, 3, 7});
  }
  printf("check gemv cols variants (CT/U 8/4 8/16 16/8 32/8, M 1..2, bf16 f32): %d bad\n", bad);
  {
    std::vector<unsigned short> a(n), b(n);
    launch_cols<bf16, 1, true>(xv, yb, out, n, k, k, n, n)();
    CK(cudaMemcpy(a.data(), out, n * 2, cudaMemcpyDeviceToHost));
    launch_cols<bf16, 1, false>(xv, yb, out, n, k, k, n, n)();
    CK(cudaMemcpy(b.data(), out, n * 2, cudaMemcpyDeviceToHost));
    int d = 0;
    for (u64 i = 0; i < n; ++i) { int e = (int)a[i] - (int)b[i]; if (e > 2 || e < -2) ++d; }
    printf("check gemv cols old vs new 1x4096x14336: %d of %llu outputs differ by more than 2 bf16 ulps\n", d, n);
  }

  // ---- Sweeps: threads per row, softmax, gemv_cols slices.
  rows_case<float>("lse", "f32", 16384, 4096, x, o);
  rows_case<float>("lse", "f32", 4096, 16384, x, o);
  rows_case<bf16>("lse", "bf16", 16384, 4096, y, o);
  rows_case<bf16>("lse", "bf16", 4096, 16384, y, o);
  rows_case<float>("softmax", "f32", 4096, 16384, x, o);
  rows_case<bf16>("softmax", "bf16", 16384, 4096, y, o);
  // gemv_cols: column threads per tile (CT; matmul.rs's GEMV_COL_THREADS must follow NV_GEMV_CT),
  // 16-byte loads in flight per thread (U) and slices of K.
  sweep_cols<8, 4>(xv, yb, out, n, k);
  sweep_cols<8, 8>(xv, yb, out, n, k);
  sweep_cols<8, 12>(xv, yb, out, n, k);
  sweep_cols<8, 16>(xv, yb, out, n, k);
  sweep_cols<16, 4>(xv, yb, out, n, k);
  sweep_cols<16, 8>(xv, yb, out, n, k);
  sweep_cols<16, 16>(xv, yb, out, n, k);
  sweep_cols<32, 4>(xv, yb, out, n, k);
  sweep_cols<32, 8>(xv, yb, out, n, k);
  sweep_cols<32, 16>(xv, yb, out, n, k);
  sweep_cols<8, 8>(xv, yb, out, k, n);
  sweep_cols<16, 8>(xv, yb, out, k, n);
  sweep_cols<8, 8, 4>(xv, yb, out, n, k);
  sweep_cols<8, 4, 4>(xv, yb, out, n, k);
  return 0;
}
