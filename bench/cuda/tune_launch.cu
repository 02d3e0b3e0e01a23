// Programmatic dependent launch (PDL) on the fused kernels, and the sweeps behind runs 27–28's
// launch choices (bench/results/2026-12-02-gpu-run27.md, -run28.md): the RMS derivative (kernel,
// column sum, cast; grids of equal rounds, two blocks per SM, no weight), the one-row forward
// norms by vectors per thread, SwiGLU's grid, RoPE. Every kernel is the library's template with
// a `pdl<P>()` prologue. Inputs rotate among up to 4 copies (no L2 reuse across iterations, as
// bench_fast). The variants measured and not kept (weight partials in shared memory, the weight
// re-read per row, RoPE's earlier forms, cache hints on the RMS norm) are in this file as of
// commit 1bd6a8b. Run 30 (bench/results/2026-12-02-gpu-run30.md): the one-row kernels' read of
// the row with L1/L2 evict_last (`keep`, `l2`; the plain-load form is `ldh<0>` below); the weight loaded with the row and a Triton cubin timed here are in this file as of
// commit f32232d. On the H200:
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -I crates/nuvec-cuda/kernels bench/cuda/tune_launch.cu -o tl
//   ./tl            # PDL against plain launches: RMS norm, its derivative, SwiGLU, RoPE
//   ./tl sweep      # the RMS derivative over 1024..32768 rows of 8192
//   ./tl ones       # one-row RMS norm, residual add + RMS norm, layer norm by vectors per thread
//   ./tl keep       # the one-row RMS norm's read of the row (plain, L1 and/or L2 evict_last),
//                   # store hints, the lines set back to normal after the row
//   ./tl l2         # a following kernel's L2 after each form of the norm
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <vector>
#include "rope.cuh"
#include "norm_registers.cuh"
#include "swiglu.cuh"
#include "harness.cuh"

typedef bf16 T;
typedef float A;

// P: 0 plain; 1 wait + trigger at the start; 2 wait only (implicit trigger at exit).
template <int P> __device__ __forceinline__ void pdl() {
  if constexpr (P >= 1) asm volatile("griddepcontrol.wait;" ::: "memory");
  if constexpr (P == 1) asm volatile("griddepcontrol.launch_dependents;" :::);
}

template <int P, int V> __global__ void __launch_bounds__(NV_REG_BLOCK) k_rms_r(const T* x, const T* w, T* o, u64 r, u64 l, int g) { pdl<P>(); rms_norm_regs<T, V, false>(x, nullptr, w, nullptr, o, r, l, 1e-5f, g); }
template <int P, int V> __global__ void __launch_bounds__(NV_REG_BLOCK) k_rms_o(const T* x, const T* w, T* o, u64 r, u64 l) { pdl<P>(); rms_norm_one<T, V, false>(x, nullptr, w, nullptr, o, r, l, 1e-5f); }
template <int P, int V> __global__ void __launch_bounds__(NV_REG_BLOCK, 1) k_rmsb(const T* x, const T* w, const T* gy, T* gx, A* p, u64 r, u64 l, int g) { pdl<P>(); rms_norm_vjp_regs<T, V>(x, w, gy, gx, p, r, l, 1e-5f, g); }
template <int P> __global__ void __launch_bounds__(NV_COL_SUM_THREADS) k_colsum(const A* p, A* o, u64 parts, u64 cols) { pdl<P>(); col_sum<A, A>(p, o, nullptr, parts, cols, cols, cols); }
template <int P> __global__ void k_cast(const A* a, T* b, u64 n) { pdl<P>(); for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) b[i] = narrow<T>(a[i]); }
template <int P> __global__ void k_glu(const T* g, const T* u, T* o, u64 n) { pdl<P>(); swiglu_elems<T>(g, u, o, n); }
template <int P> __global__ void k_gluvjp(const T* g, const T* u, const T* c, T* dg, T* du, u64 n) { pdl<P>(); swiglu_vjp_elems<T>(g, u, c, dg, du, n); }
// RoPE's production kernel with its arguments at run time, as the library launches it.
template <int P> __global__ void k_rope(const T* x, T* out, const i32* off, u64 rows, u64 len, u64 dims, u64 seq, u64 per_batch) {
  pdl<P>();
  rope_rows<T, 8, true, true, false, false>(x, out, off, 0, nullptr, 13.287712f, 1.0f, 1.0f, rows, len, dims, seq, per_batch);
}
// The column sum rounding to the weight's dtype (the library's col_sum_round).
template <int P> __global__ void __launch_bounds__(NV_COL_SUM_THREADS) k_colsum_t(const A* p, T* o, u64 parts, u64 cols) { pdl<P>(); col_sum<A, T>(p, o, nullptr, parts, cols, cols, cols); }

template <int P, int V> __global__ void __launch_bounds__(NV_REG_BLOCK, 2) k_rmsb2(const T* x, const T* w, const T* gy, T* gx, A* p, u64 r, u64 l, int g) { pdl<P>(); rms_norm_vjp_regs<T, V>(x, w, gy, gx, p, r, l, 1e-5f, g); }
template <int P, int V> __global__ void __launch_bounds__(NV_REG_BLOCK) k_addrms_o(const T* x, const T* res, const T* w, T* h, T* o, u64 r, u64 l) { pdl<P>(); rms_norm_one<T, V, true>(x, res, w, h, o, r, l, 1e-5f); }
// The one-row RMS norm's read of the row in other forms (run 30). H: 0 plain, 1 L1::evict_last,
// 3 the library's load_keep (L1::evict_last + L2 evict_last policy), 8 the L2 evict_last policy only, 9 L1 evict_last + L2 evict_last policy at
// fraction 0.5. Not volatile, so the compiler issues a row's loads together.
template <int H> __device__ __forceinline__ Vec16<T> ldh(const Vec16<T>* p) {
  if constexpr (H == 3) return load_keep(p, keep_policy());
  uint4 u;
  if constexpr (H == 0) asm("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w) : "l"(p));
  if constexpr (H == 1) asm("ld.global.L1::evict_last.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w) : "l"(p));
  if constexpr (H == 8 || H == 9) {
    u64 pol;
    if constexpr (H == 9) asm("createpolicy.fractional.L2::evict_last.b64 %0, 0.5;" : "=l"(pol));
    else asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
    if constexpr (H == 8) asm("ld.global.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;" : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w) : "l"(p), "l"(pol));
    else asm("ld.global.L1::evict_last.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;" : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w) : "l"(p), "l"(pol));
  }
  Vec16<T> r;
  memcpy(&r, &u, 16);
  return r;
}
// SH: the output's stores 0 plain, 1 L2 evict_first policy, 2 .cs. DEMOTE: the row's lines back
// to evict_normal in L2 after the row (a thread per 128-byte line).
template <int SH> __device__ __forceinline__ void sth(Vec16<T>* p, const Vec16<T>& v) {
  uint4 u;
  memcpy(&u, &v, 16);
  if constexpr (SH == 0) *reinterpret_cast<uint4*>(p) = u;
  if constexpr (SH == 1) {
    u64 pol;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1,%2,%3,%4}, %5;" ::"l"(p), "r"(u.x), "r"(u.y), "r"(u.z), "r"(u.w), "l"(pol) : "memory");
  }
  if constexpr (SH == 2) asm volatile("st.global.cs.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(u.x), "r"(u.y), "r"(u.z), "r"(u.w) : "memory");
}
// The library's one-row RMS norm (rms_norm_one) with the row read by ldh<LH>, stored by sth<SH>,
// and with DEMOTE its lines set back after the row; V vectors per thread.
template <int P, int LH, int SH, bool DEMOTE, int V = 2> __global__ void __launch_bounds__(NV_REG_BLOCK) k_rms_form(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ o, u64 rows, u64 len) {
  pdl<P>();
  __shared__ A sm[2][32];
  int ph = 0;
  const u32 nvec = (u32)(len / 8);
  for (u64 row = blockIdx.x; row < rows; row += gridDim.x) {
    const Vec16<T>* xr = reinterpret_cast<const Vec16<T>*>(x + row * len);
    Vec16<T> r[V];
#pragma unroll
    for (int v = 0; v < V; ++v) {
      u32 i = threadIdx.x + (u32)v * blockDim.x;
      if (i < nvec) r[v] = ldh<LH>(xr + i);
    }
    A n = inv_sqrt(block_sum(one_sum<T, V>(nvec, r, [](A a) { return a * a; }), sm, ph) / (A)len + 1e-5f);
#pragma unroll
    for (int v = 0; v < V; ++v) {
      u32 i = threadIdx.x + (u32)v * blockDim.x;
      if (i >= nvec) continue;
      float y[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) y[j] = widen(r[v].v[j]) * n;
      sth<SH>(reinterpret_cast<Vec16<T>*>(o + row * len) + i, round_affine<T, 8>(y, w, nullptr, i));
      if constexpr (DEMOTE) if ((i & 7) == 0) asm volatile("applypriority.global.L2::evict_normal [%0], 128;" ::"l"(xr + i) : "memory");
    }
  }
}
// A kernel that re-reads a buffer that fits in L2 `passes` times: its time after a norm shows
// what the norm's L2 priorities leave to the next kernel.
__global__ void reread(const uint4* p, u64 n, int passes, unsigned* sink) {
  unsigned acc = 0;
  for (int k = 0; k < passes; ++k)
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
      uint4 u = p[i];
      acc ^= u.x + u.y + u.z + u.w;
    }
  if (acc == 0x12345678u) sink[0] = acc;
}
template <int P, int V> __global__ void __launch_bounds__(NV_REG_BLOCK) k_ln_o(const T* x, const T* w, const T* b, T* o, u64 r, u64 l) { pdl<P>(); layer_norm_one<T, V>(x, w, b, o, r, l, 1e-5f); }

// ---- launching
static int sms;
static double ceil_gbs;
template <typename... K, typename... Args>
static void go(int pdl_on, void (*k)(K...), unsigned grid, dim3 threads, size_t smem, Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = threads;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = 0;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = at;
  cfg.numAttrs = pdl_on ? 1 : 0;
  CK(cudaLaunchKernelEx(&cfg, k, (K)args...));
}
template <typename K> static unsigned resident(K k, int threads, size_t smem = 0) {
  int n = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, threads, smem));
  return (unsigned)(n > 0 ? n : 1) * sms;
}
static void report(const char* what, const char* shape, double bytes, float ms) {
  double gbs = bytes / ms / 1e6;
  printf("%-34s %-16s %7.1f GB/s %5.1f%%  %7.2f us\n", what, shape, gbs, 100 * gbs / ceil_gbs, ms * 1000);
  fflush(stdout);
}
static int iters_for(double bytes) { return std::max(20, (int)(30e3 / (bytes / 4.0e6))); }  // ~30 ms a batch

static int K = 4;  // rotating copies (set per case: as many as fit, at most 4)
static u64 CAP;    // elements per buffer
static void copies(u64 n) { K = (int)std::max<u64>(1, std::min<u64>(4, CAP / n)); }
// A case of rows × len elements: its label, element count, vectors per row, the bytes the op
// moves (per element and per column) and iterations per batch; sets the rotating copies.
struct Case {
  char shape[64];
  u64 n, nvec;
  double bytes;
  int it;
  Case(u64 rows, u64 len, double per_elem, double per_col)
      : n(rows * len), nvec(len / 8), bytes(per_elem * (double)(rows * len) + per_col * (double)len), it(iters_for(bytes)) {
    snprintf(shape, 64, "%llux%llu", rows, len);
    copies(n);
  }
};
static T *X, *G, *O, *O2, *W;
static A *PART, *DW;
static T* DWT;
static i32* OFF;

template <int P> static void rms_fwd(u64 rows, u64 len, const char* tag) {
  Case c(rows, len, 4.0, 2.0);
  int i = 0;
  char name[64];
  // persistent _r2: group = nvec/2 threads, block of max(1, 256/group) groups
  {
    int grp = (int)((c.nvec / 2 + 31) / 32 * 32);
    int groups = std::max(1, 256 / grp), threads = groups * grp;
    unsigned gr = (unsigned)std::min<u64>((rows + groups - 1) / groups, resident(k_rms_r<P, 2>, threads));
    snprintf(name, 64, "rms_r2 %s", tag);
    report(name, c.shape, c.bytes, time_ms(c.it, [&] { int k = i++ % K; go(P, k_rms_r<P, 2>, gr, threads, 0, X + k * c.n, W, O + k * c.n, rows, len, grp); }));
  }
  auto one = [&](auto kern, int v) {
    unsigned threads = (unsigned)(((c.nvec + v - 1) / v + 31) / 32 * 32);
    if (threads > 1024 || threads < 64) return;
    snprintf(name, 64, "rms_o%d %s (%d/SM)", v, tag, resident(kern, threads) / sms);
    report(name, c.shape, c.bytes, time_ms(c.it, [&] { int k = i++ % K; go(P, kern, (unsigned)rows, threads, 0, X + k * c.n, W, O + k * c.n, rows, len); }));
  };
  one(k_rms_o<P, 2>, 2);
  one(k_rms_o<P, 4>, 4);
  one(k_rms_o<P, 8>, 8);
}

template <int P> static void rms_bwd(u64 rows, u64 len, const char* tag) {
  Case c(rows, len, 6.0, 4.0);
  char name[64];
  int i = 0;
  int grp = (int)((c.nvec / 2 + 31) / 32 * 32);
  if (grp > 512) return;
  int groups = 512 / grp, threads = groups * grp;
  unsigned g0 = (unsigned)std::min<u64>((rows + groups - 1) / groups, resident(k_rmsb<P, 2>, threads));
  unsigned cs = (unsigned)((len + 127) / 128), cb = (unsigned)((len + 255) / 256);
  snprintf(name, 64, "rmsb k %s [%u]", tag, g0);
  report(name, c.shape, c.bytes, time_ms(c.it, [&] { int k = i++ % K; go(P, k_rmsb<P, 2>, g0, threads, 0, X + k * c.n, W, G + k * c.n, O + k * c.n, PART, rows, len, grp); }));
  snprintf(name, 64, "rmsb+cs+cast %s", tag);
  report(name, c.shape, c.bytes, time_ms(c.it, [&] {
    int k = i++ % K;
    go(P, k_rmsb<P, 2>, g0, threads, 0, X + k * c.n, W, G + k * c.n, O + k * c.n, PART, rows, len, grp);
    go(P, k_colsum<P>, cs, NV_COL_SUM_THREADS, 0, (const A*)PART, DW, (u64)g0, len);
    go(P, k_cast<P>, cb, 256, 0, (const A*)DW, DWT, len);
  }));
  snprintf(name, 64, "rmsb+cs_t %s", tag);
  report(name, c.shape, c.bytes, time_ms(c.it, [&] {
    int k = i++ % K;
    go(P, k_rmsb<P, 2>, g0, threads, 0, X + k * c.n, W, G + k * c.n, O + k * c.n, PART, rows, len, grp);
    go(P, k_colsum_t<P>, cs, NV_COL_SUM_THREADS, 0, (const A*)PART, DWT, (u64)g0, len);
  }));
}

template <int P> static void glu(u64 rows, u64 len, const char* tag) {
  Case c(rows, len, 6.0, 0.0);
  char name[64];
  unsigned grid = (unsigned)std::min<u64>((c.n / 8 + 2047) / 2048, (u64)sms * 32);
  int i = 0;
  // gate X, up G (rotating), out O
  snprintf(name, 64, "swiglu %s", tag);
  report(name, c.shape, c.bytes, time_ms(c.it, [&] { int k = i++ % K; go(P, k_glu<P>, grid, 256, 0, (const T*)(X + k * c.n), (const T*)(G + k * c.n), O + k * c.n, c.n); }));
  unsigned exact = (unsigned)((c.n / 8 + 255) / 256);
  snprintf(name, 64, "swiglu exact %s", tag);
  report(name, c.shape, c.bytes, time_ms(c.it, [&] { int k = i++ % K; go(P, k_glu<P>, exact, 256, 0, (const T*)(X + k * c.n), (const T*)(G + k * c.n), O + k * c.n, c.n); }));
  if (rows <= 4096) {
    double b2 = 10.0 * c.n;
    int it2 = iters_for(b2);
    snprintf(name, 64, "swiglu_vjp %s", tag);
    report(name, c.shape, b2, time_ms(it2, [&] { int k = i++ % 2; go(P, k_gluvjp<P>, grid, 256, 0, (const T*)(X + k * c.n), (const T*)(G + k * c.n), (const T*)(O2 + k * c.n), O + k * c.n, O + (k + 2) * c.n, c.n); }));
    snprintf(name, 64, "swiglu_vjp exact %s", tag);
    report(name, c.shape, b2, time_ms(it2, [&] { int k = i++ % 2; go(P, k_gluvjp<P>, exact, 256, 0, (const T*)(X + k * c.n), (const T*)(G + k * c.n), (const T*)(O2 + k * c.n), O + k * c.n, O + (k + 2) * c.n, c.n); }));
  }
}

template <int P> static void rope(u64 b, const char* tag) {
  char shape[64], name[64];
  snprintf(shape, 64, "%llux32x4096x128", b);
  u64 rows = b * 32 * 4096, n = rows * 128;
  copies(n);
  double bytes = 4.0 * n;
  int it = iters_for(bytes), i = 0;
  unsigned gx = (unsigned)((rows + 31) / 32);
  snprintf(name, 64, "rope %s", tag);
  volatile u64 len = 128, seq = 4096;  // run-time values to the compiler, as in the library
  report(name, shape, bytes, time_ms(it, [&] { int k = i++ % K; go(P, k_rope<P>, gx, dim3(8, 32), 0, (const T*)(X + k * n), O + k * n, (const i32*)OFF, rows, (u64)len, (u64)len, (u64)seq, rows / b); }));
}

// Blocks for `units` units of work, at most `cap` at once: as few as finish in the same number
// of rounds (every block the same count of units, give or take one).
static unsigned balanced(u64 units, u64 cap) { u64 rounds = (units + cap - 1) / cap; return (unsigned)((units + rounds - 1) / rounds); }

static void rmsb_sweep() {
  u64 len = 8192;
  int grp = 512, threads = 512;
  for (u64 rows : {1024ull, 2048ull, 4096ull, 8192ull, 16384ull, 32768ull}) {
    Case c(rows, len, 6.0, 4.0);
    char name[64];
    int i = 0;
    unsigned r1 = resident(k_rmsb<1, 2>, threads), g0 = (unsigned)std::min<u64>(rows, r1), gb = balanced(rows, r1);
    snprintf(name, 64, "rmsb k pdl [%u]", g0);
    report(name, c.shape, c.bytes, time_ms(c.it, [&] { int k = i++ % K; go(1, k_rmsb<1, 2>, g0, threads, 0, X + k * c.n, W, G + k * c.n, O + k * c.n, PART, rows, len, grp); }));
    snprintf(name, 64, "rmsb k pdl bal [%u]", gb);
    report(name, c.shape, c.bytes, time_ms(c.it, [&] { int k = i++ % K; go(1, k_rmsb<1, 2>, gb, threads, 0, X + k * c.n, W, G + k * c.n, O + k * c.n, PART, rows, len, grp); }));
    if (rows == 4096 || rows == 32768) {
      snprintf(name, 64, "rmsb k pdl bal no-w [%u]", gb);
      report(name, c.shape, c.bytes, time_ms(c.it, [&] { int k = i++ % K; go(1, k_rmsb<1, 2>, gb, threads, 0, X + k * c.n, (T*)nullptr, G + k * c.n, O + k * c.n, PART, rows, len, grp); }));
      unsigned r2 = resident(k_rmsb2<1, 2>, threads), g2 = balanced(rows, r2);
      snprintf(name, 64, "rmsb2 (512,2) pdl bal [%u]", g2);
      report(name, c.shape, c.bytes, time_ms(c.it, [&] { int k = i++ % K; go(1, k_rmsb2<1, 2>, g2, threads, 0, X + k * c.n, W, G + k * c.n, O + k * c.n, PART, rows, len, grp); }));
      unsigned cs = (unsigned)((len + 127) / 128);
      snprintf(name, 64, "rmsb bal + cs_t, pdl [%u]", gb);
      report(name, c.shape, c.bytes, time_ms(c.it, [&] {
        int k = i++ % K;
        go(1, k_rmsb<1, 2>, gb, threads, 0, X + k * c.n, W, G + k * c.n, O + k * c.n, PART, rows, len, grp);
        go(1, k_colsum_t<1>, cs, NV_COL_SUM_THREADS, 0, (const A*)PART, DWT, (u64)gb, len);
      }));
      snprintf(name, 64, "rmsb2 bal + cs_t, pdl [%u]", g2);
      report(name, c.shape, c.bytes, time_ms(c.it, [&] {
        int k = i++ % K;
        go(1, k_rmsb2<1, 2>, g2, threads, 0, X + k * c.n, W, G + k * c.n, O + k * c.n, PART, rows, len, grp);
        go(1, k_colsum_t<1>, cs, NV_COL_SUM_THREADS, 0, (const A*)PART, DWT, (u64)g2, len);
      }));
    }
  }
}

// The one-row kernels of the residual add + RMS norm and the layer norm by vectors per thread.
static void ones() {
  for (u64 rows : {4096ull, 32768ull})
    for (u64 len : {2048ull, 4096ull, 8192ull}) {
      char shape[64], name[64];
      snprintf(shape, 64, "%llux%llu", rows, len);
      u64 n = rows * len, nvec = len / 8;
      copies(2 * n);
      int i = 0;
      auto add = [&](auto kern, int v) {
        unsigned threads = (unsigned)(((nvec + v - 1) / v + 31) / 32 * 32);
        if (threads > 512 || threads < 32) return;
        double bytes = 8.0 * n;
        snprintf(name, 64, "add_rms_o%d pdl (%ux%u)", v, resident(kern, threads) / sms, threads);
        report(name, shape, bytes, time_ms(iters_for(bytes), [&] { int k = i++ % K; go(1, kern, (unsigned)rows, threads, 0, (const T*)(X + 2 * k * n), (const T*)(X + (2 * k + 1) * n), (const T*)W, O + 2 * k * n, O + (2 * k + 1) * n, rows, len); }));
      };
      auto ln = [&](auto kern, int v) {
        unsigned threads = (unsigned)(((nvec + v - 1) / v + 31) / 32 * 32);
        if (threads > 512 || threads < 32) return;
        double bytes = 4.0 * n;
        snprintf(name, 64, "ln_o%d pdl (%ux%u)", v, resident(kern, threads) / sms, threads);
        report(name, shape, bytes, time_ms(iters_for(bytes), [&] { int k = i++ % K; go(1, kern, (unsigned)rows, threads, 0, (const T*)(X + k * n), (const T*)W, (const T*)W, O + k * n, rows, len); }));
      };
      auto rms = [&](auto kern, int v) {
        unsigned threads = (unsigned)(((nvec + v - 1) / v + 31) / 32 * 32);
        if (threads > 512 || threads < 32) return;
        double bytes = 4.0 * n;
        snprintf(name, 64, "rms_o%d pdl (%ux%u)", v, resident(kern, threads) / sms, threads);
        report(name, shape, bytes, time_ms(iters_for(bytes), [&] { int k = i++ % K; go(1, kern, (unsigned)rows, threads, 0, (const T*)(X + k * n), (const T*)W, O + k * n, rows, len); }));
      };
      rms(k_rms_o<1, 2>, 2); rms(k_rms_o<1, 4>, 4); rms(k_rms_o<1, 8>, 8);
      add(k_addrms_o<1, 2>, 2); add(k_addrms_o<1, 4>, 4); add(k_addrms_o<1, 8>, 8);
      ln(k_ln_o<1, 2>, 2); ln(k_ln_o<1, 4>, 4); ln(k_ln_o<1, 8>, 8);
    }
}


// The one-row RMS norm (the library's, as built) against its read in the forms of ldh, store
// hints and the lines set back after the row (k_rms_form).
static void keep() {
  for (u64 rows : {32768ull, 4096ull})
    for (u64 len : {8192ull, 4096ull, 2048ull}) {
      Case c(rows, len, 4.0, 2.0);
      char name[64];
      int i = 0;
      auto run = [&](const char* tag, auto kern, int v) {
        unsigned threads = (unsigned)(((c.nvec + v - 1) / v + 31) / 32 * 32);
        if (threads > 1024 || threads < 32) return;
        snprintf(name, 64, "%s v%d (%u/SM)", tag, v, resident(kern, threads) / sms);
        report(name, c.shape, c.bytes, time_ms(c.it, [&] { int k = i++ % K; go(1, kern, (unsigned)rows, threads, 0, (const T*)(X + k * c.n), (const T*)W, O + k * c.n, rows, len); }));
      };
      for (int rep = 0; rep < 2; ++rep) {
        run("rms_o", k_rms_o<1, 2>, 2);
        run("plain", k_rms_form<1, 0, 0, false>, 2);
        run("L1 EL", k_rms_form<1, 1, 0, false>, 2);
        run("L2 EL", k_rms_form<1, 8, 0, false>, 2);
        run("L1+L2 EL", k_rms_form<1, 3, 0, false>, 2);
        run("L1+L2 EL .5", k_rms_form<1, 9, 0, false>, 2);
        run("L1+L2 EL", k_rms_form<1, 3, 0, false, 4>, 4);
        run("st L2 EF", k_rms_form<1, 0, 1, false>, 2);
        run("st .cs", k_rms_form<1, 0, 2, false>, 2);
        run("L1+L2 EL, st L2 EF", k_rms_form<1, 3, 1, false>, 2);
        run("L1+L2 EL, demote", k_rms_form<1, 3, 0, true>, 2);
        run("L2 EL, demote", k_rms_form<1, 8, 0, true>, 2);
      }
    }
}

// The L2 a following kernel finds after each form of the norm.
static void l2() {
  // The next kernel: 24 MiB read 20 times right after a 32768x8192 norm.
  u64 rows = 32768, len = 8192, n = rows * len, m = (24ull << 20) / 16;
  copies(n);
  const uint4* buf = reinterpret_cast<const uint4*>(O2);
  unsigned* sink = reinterpret_cast<unsigned*>(DW);
  cudaEvent_t e0, e1, e2;
  CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1)); CK(cudaEventCreate(&e2));
  auto victim = [&](const char* tag, auto kern) {
    double tn = 0, tv = 0;
    for (int r = 0; r < 12; ++r) {
      int k = r % K;
      CK(cudaEventRecord(e0));
      go(0, kern, (unsigned)rows, 512u, 0, (const T*)(X + k * n), (const T*)W, O + k * n, rows, len);
      CK(cudaEventRecord(e1));
      reread<<<sms * 4, 512>>>(buf, m, 20, sink);
      CK(cudaEventRecord(e2));
      CK(cudaEventSynchronize(e2));
      float a, b;
      CK(cudaEventElapsedTime(&a, e0, e1)); CK(cudaEventElapsedTime(&b, e1, e2));
      if (r >= 2) { tn += a; tv += b; }
    }
    printf("after %-28s norm %7.2f us, next kernel (24 MiB x 20) %7.2f us\n", tag, tn * 100, tv * 100);
  };
  for (int rep = 0; rep < 2; ++rep) {
    victim("plain", k_rms_form<0, 0, 0, false>);
    victim("ld L1+L2 EL", k_rms_form<0, 3, 0, false>);
    victim("ld L2 EL", k_rms_form<0, 8, 0, false>);
    victim("ld L1+L2 EL, demote", k_rms_form<0, 3, 0, true>);
    victim("st L2 EF", k_rms_form<0, 0, 1, false>);
  }
}

int main(int argc, char** argv) {
  const char* only = argc > 1 ? argv[1] : "";
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  // K copies of 32768 x 8192 bf16 (512 MiB each) would be too many: size by the largest case used.
  size_t per = 32768ull * 14336 * 2;  // swiglu 32768 rows: 896 MiB per copy
  size_t big = per * 2;               // two copies for the 32768-row cases; the 4096-row ones fit 4 in 2 copies' space
  CAP = big / 2;
  CK(cudaMalloc(&X, big)); CK(cudaMalloc(&G, big)); CK(cudaMalloc(&O, 2 * big)); CK(cudaMalloc(&O2, big));
  CK(cudaMalloc(&W, 1 << 20)); CK(cudaMalloc(&PART, 64 << 20)); CK(cudaMalloc(&DW, 1 << 20)); CK(cudaMalloc(&DWT, 1 << 20));
  CK(cudaMalloc(&OFF, 16)); CK(cudaMemset(OFF, 0, 16));
  fill<<<4096, 256>>>(X, big / 2, -2.f, 2.f, 1);
  fill<<<4096, 256>>>(G, big / 2, -1.f, 1.f, 2);
  fill<<<4096, 256>>>(O2, big / 2, -1.f, 1.f, 5);
  fill<<<64, 256>>>(W, 1 << 19, 0.5f, 1.5f, 3);
  CK(cudaDeviceSynchronize());
  size_t cb = 1ull << 30;
  float cms = time_ms(20, [&] { CK(cudaMemcpyAsync(O, X, cb, cudaMemcpyDeviceToDevice)); });
  ceil_gbs = 2.0 * cb / cms / 1e6;
  printf("copy ceiling: %.1f GB/s (%d SMs)\n", ceil_gbs, sms);
  bool all = !*only;
  if (strstr(only, "sweep")) rmsb_sweep();
  if (strstr(only, "ones")) ones();
  if (strstr(only, "keep")) { keep(); return 0; }
  if (strstr(only, "l2")) { l2(); return 0; }
  if (strstr(only, "sweep") || strstr(only, "ones")) return 0;
  if (all || strstr(only, "fwd")) {
    for (u64 r : {4096ull, 32768ull}) {
      rms_fwd<0>(r, 8192, "plain");
      rms_fwd<1>(r, 8192, "pdl");
      rms_fwd<2>(r, 8192, "pdl-wait");
      if (r == 4096) { rms_fwd<0>(r, 4096, "plain"); rms_fwd<1>(r, 4096, "pdl"); }
    }
  }
  if (all || strstr(only, "bwd")) {
    rms_bwd<0>(4096, 8192, "plain");
    rms_bwd<1>(4096, 8192, "pdl");
    rms_bwd<0>(4096, 4096, "plain");
    rms_bwd<1>(4096, 4096, "pdl");
  }
  if (all || strstr(only, "glu")) {
    glu<0>(4096, 14336, "plain");
    glu<1>(4096, 14336, "pdl");
    glu<0>(32768, 14336, "plain");
    glu<1>(32768, 14336, "pdl");
  }
  if (all || strstr(only, "rope")) {
    rope<0>(4, "plain");
    rope<1>(4, "pdl");
    rope<0>(1, "plain");
    rope<1>(1, "pdl");
  }
  return 0;
}
