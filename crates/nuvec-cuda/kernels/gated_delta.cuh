// Gated DeltaNet's recurrence (fast::gated_delta; launched by fast/gated_delta.rs). Per batch row
// and value head a [Dv, Dk] float32 state S; per step S = g·S, δ = β(v − S k), S = S + δ kᵀ,
// y = S q. The whole loop over the T steps runs inside the kernel (decode and prefill alike),
// each state row in registers from the first step to the last.
//
// Three ways, the first two bit-identical where both apply:
// * gated_delta_rows<T, N, AHEAD>: one warp per value row dv, lane l holding
//   S[dv, N·l .. N·l + N), Dk = 32·N; any gate, mask, storage and state dtype.
// * gated_delta_packed<T>: Dk = 128, 8 rows per warp, 4 lanes per row, 32 elements per lane;
//   a float32 gate per head, a float32 state, no mask. Two shuffles per dot product instead of
//   five, and 4 KiB of state in flight per warp instead of 512 bytes (decode is a pass over the
//   state).
// * gated_delta_chunk_prep<T> + gated_delta_chunk_scan<T>: long prompts, 64 steps at a time on
//   tensor cores (the end of this file); results within half-precision rounding of the others.
// Their dot products are one sum in one order: sequential partials of 4 products (a lane's
// share at Dk = 128), added pairwise as the butterfly over lanes xor 1, 2, 4, 8, 16 pairs them.
// The packed kernel adds its 8 partials in registers in the pairing of xor 1, 2, 4 and shuffles
// xor 1, 2 among the row's 4 lanes for xor 8, 16; a + b == b + a exactly, so each lane of the
// butterfly holds that same tree's sum. Every product and sum is an explicit __fmul_rn /
// __fadd_rn, so no FMA contraction can differ between them (or from the composition's steps).
#pragma once
#include "common.cuh"

// The kernels' one parameter. fast/gated_delta.rs writes it as GDN_ARG_WORDS 8-byte words in
// this order.
struct GdnArgs {
  const void* q;      // [B, T, Hk, Dk] of T, last axis contiguous
  const void* k;      // as q
  const void* v;      // [B, T, Hv, Dv] of T, last axis contiguous
  const void* g;      // [B, T, Hv], or [B, T, Hv, Dk] with `channel` (last axis contiguous)
  const void* beta;   // [B, T, Hv]
  const void* state;  // [B, Hv, Dv, Dk], row-major
  const bool* mask;   // [B, T], or null
  void* y;            // [B, T, Hv, Dv] of T, row-major
  void* state_out;    // [B, Hv, Dv, Dk], or [B, T, Hv, Dv, Dk] with `steps`; row-major
  i64 B, T, Hk, Hv, Dv;
  // Strides in elements of the batch, step and head axes.
  i64 q_s[3], k_s[3], v_s[3], g_s[3], beta_s[3];
  i64 mask_s[2];
  // 0 float32, 1 float16, 2 bfloat16.
  i64 g_dt, beta_dt, state_dt, out_dt;
  i64 channel;  // g per key channel
  i64 steps;    // state_out holds every step's state
};
#define GDN_ARG_WORDS 37
static_assert(sizeof(GdnArgs) == 8 * GDN_ARG_WORDS, "GdnArgs must be whole 8-byte words");

// Element i of a float32 (0), float16 (1) or bfloat16 (2) array, as float.
__device__ __forceinline__ float gdn_ld(const void* p, i64 i, i64 dt) {
  if (dt == 1) return __half2float(static_cast<const f16*>(p)[i]);
  if (dt == 2) return __bfloat162float(static_cast<const bf16*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

// The widest vector (in elements of T, at most 16 bytes) that divides N elements.
template <typename T, int N> struct GdnWidth {
  static constexpr int bytes = N * (int)sizeof(T);
  static constexpr int value = bytes % 16 == 0  ? 16 / (int)sizeof(T)
                               : bytes % 8 == 0 ? 8 / (int)sizeof(T)
                               : bytes % 4 == 0 ? 4 / (int)sizeof(T)
                                                : 1;
};

// N consecutive elements of T at p, as floats: vector loads where p is aligned for them.
template <typename T, int N> __device__ __forceinline__ void gdn_load(const T* p, float (&out)[N]) {
  constexpr int W = GdnWidth<T, N>::value;
  if (W > 1 && (u64)p % (W * sizeof(T)) == 0) {
#pragma unroll
    for (int c = 0; c < N / W; ++c) {
      const Vec<T, W> x = reinterpret_cast<const Vec<T, W>*>(p)[c];
#pragma unroll
      for (int j = 0; j < W; ++j) out[c * W + j] = (float)widen(x.v[j]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = (float)widen(p[i]);
  }
}

// N floats rounded to T and stored at p, as gdn_load reads them.
template <typename T, int N> __device__ __forceinline__ void gdn_store(T* p, const float (&x)[N]) {
  constexpr int W = GdnWidth<T, N>::value;
  if (W > 1 && (u64)p % (W * sizeof(T)) == 0) {
#pragma unroll
    for (int c = 0; c < N / W; ++c) {
      Vec<T, W> o;
#pragma unroll
      for (int j = 0; j < W; ++j) o.v[j] = narrow<T>(x[c * W + j]);
      reinterpret_cast<Vec<T, W>*>(p)[c] = o;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) p[i] = narrow<T>(x[i]);
  }
}

// gdn_load of elements i .. i + N of an array of dtype code dt.
template <int N> __device__ __forceinline__ void gdn_load_any(const void* p, i64 i, i64 dt, float (&out)[N]) {
  if (dt == 1) {
    gdn_load<f16, N>(static_cast<const f16*>(p) + i, out);
  } else if (dt == 2) {
    gdn_load<bf16, N>(static_cast<const bf16*>(p) + i, out);
  } else {
    gdn_load<float, N>(static_cast<const float*>(p) + i, out);
  }
}

// gdn_store into elements i .. i + N of an array of dtype code dt.
template <int N> __device__ __forceinline__ void gdn_store_any(void* p, i64 i, i64 dt, const float (&x)[N]) {
  if (dt == 1) {
    gdn_store<f16, N>(static_cast<f16*>(p) + i, x);
  } else if (dt == 2) {
    gdn_store<bf16, N>(static_cast<bf16*>(p) + i, x);
  } else {
    gdn_store<float, N>(static_cast<float*>(p) + i, x);
  }
}

// Σ a[o + i]·b[o + i] over i < M (M ≤ 4), in order: one sequential partial.
template <int M, int O, int N>
__device__ __forceinline__ float gdn_run(const float (&a)[N], const float (&b)[N]) {
  float p = __fmul_rn(a[O], b[O]);
#pragma unroll
  for (int i = 1; i < M; ++i) p = __fadd_rn(p, __fmul_rn(a[O + i], b[O + i]));
  return p;
}

// A lane's share of a dot product over its N elements: the partials of each run of 4, added in
// order (at Dk = 128 a lane has one run).
template <int N> __device__ __forceinline__ float gdn_lane_dot(const float (&a)[N], const float (&b)[N]) {
  float acc = gdn_run<(N < 4 ? N : 4), 0>(a, b);
  if constexpr (N > 4) acc = __fadd_rn(acc, gdn_run<N - 4, 4>(a, b));
  return acc;
}

// The warp's sum, in every lane: the butterfly over xor 1, 2, 4, 8, 16.
__device__ __forceinline__ float gdn_warp_sum(float x) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) x = __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// The packed kernel's dot product of a row held by 4 lanes of 32 elements (lane j: elements
// 32j .. 32j + 32): the partials of gated_delta_rows<T, 4>'s lanes 8j .. 8j + 8, added as its
// xor 1, 2, 4 steps pair them, then its xor 8, 16 steps as shuffles xor 1, 2 within the row.
__device__ __forceinline__ float gdn_row_dot(const float (&a)[32], const float (&b)[32]) {
  const float p0 = gdn_run<4, 0>(a, b), p1 = gdn_run<4, 4>(a, b), p2 = gdn_run<4, 8>(a, b);
  const float p3 = gdn_run<4, 12>(a, b), p4 = gdn_run<4, 16>(a, b), p5 = gdn_run<4, 20>(a, b);
  const float p6 = gdn_run<4, 24>(a, b), p7 = gdn_run<4, 28>(a, b);
  const float x1a = __fadd_rn(p0, p1), x1b = __fadd_rn(p2, p3), x1c = __fadd_rn(p4, p5), x1d = __fadd_rn(p6, p7);
  float x = __fadd_rn(__fadd_rn(x1a, x1b), __fadd_rn(x1c, x1d));
  x = __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

// Asks for the line holding p in L1 (a later step's row: its load then waits less).
__device__ __forceinline__ void gdn_prefetch(const void* p) {
  asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
}

// One step's inputs for a lane of gated_delta_rows.
template <int N> struct GdnStep {
  float q[N], k[N], gc[N];
  float v, g, beta;
  bool keep;
};

template <typename T, int N>
__device__ __forceinline__ void gdn_load_step(const GdnArgs& a, i64 b, i64 t, i64 h, i64 hk, i64 dv, int col,
                                              GdnStep<N>& s) {
  gdn_load<T, N>(static_cast<const T*>(a.q) + b * a.q_s[0] + t * a.q_s[1] + hk * a.q_s[2] + col, s.q);
  gdn_load<T, N>(static_cast<const T*>(a.k) + b * a.k_s[0] + t * a.k_s[1] + hk * a.k_s[2] + col, s.k);
  s.v = (float)widen(static_cast<const T*>(a.v)[b * a.v_s[0] + t * a.v_s[1] + h * a.v_s[2] + dv]);
  const i64 gi = b * a.g_s[0] + t * a.g_s[1] + h * a.g_s[2];
  if (a.channel) {
    gdn_load_any<N>(a.g, gi + col, a.g_dt, s.gc);
  } else {
    s.g = gdn_ld(a.g, gi, a.g_dt);
  }
  s.beta = gdn_ld(a.beta, b * a.beta_s[0] + t * a.beta_s[1] + h * a.beta_s[2], a.beta_dt);
  s.keep = a.mask == nullptr || a.mask[b * a.mask_s[0] + t * a.mask_s[1]];
}

// The recurrence of one value row per warp (rows in (b, h, dv) order, blockDim.x / 32 per
// block), Dk = 32·N. With AHEAD, the next step's inputs load while the current one computes
// (prefill); without, each step loads its own (decode: fewer registers, more warps resident).
template <typename T, int N, bool AHEAD> __device__ __forceinline__ void gated_delta_rows(const GdnArgs& a) {
  constexpr int DK = 32 * N;
  const int lane = threadIdx.x & 31, col = lane * N;
  const i64 row = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= a.B * a.Hv * a.Dv) return;  // the whole warp
  const i64 dv = row % a.Dv, bh = row / a.Dv, h = bh % a.Hv, b = bh / a.Hv, hk = h / (a.Hv / a.Hk);
  float s[N];
  gdn_load_any<N>(a.state, row * DK + col, a.state_dt, s);
  T* y = static_cast<T*>(a.y) + (b * a.T * a.Hv + h) * a.Dv + dv;
  const i64 y_step = a.Hv * a.Dv;
  GdnStep<N> cur{}, next{};
  if (AHEAD && a.T > 0) gdn_load_step<T, N>(a, b, 0, h, hk, dv, col, cur);
  for (i64 t = 0; t < a.T; ++t) {
    if (!AHEAD) {
      gdn_load_step<T, N>(a, b, t, h, hk, dv, col, cur);
    } else if (t + 1 < a.T) {
      gdn_load_step<T, N>(a, b, t + 1, h, hk, dv, col, next);
    }
    float out = 0.0f;
    if (cur.keep) {  // the same for the whole warp (one batch row)
      if (a.channel) {
#pragma unroll
        for (int i = 0; i < N; ++i) s[i] = __fmul_rn(s[i], cur.gc[i]);
      } else {
#pragma unroll
        for (int i = 0; i < N; ++i) s[i] = __fmul_rn(s[i], cur.g);
      }
      const float kv = gdn_warp_sum(gdn_lane_dot<N>(s, cur.k));
      const float delta = __fmul_rn(__fsub_rn(cur.v, kv), cur.beta);
#pragma unroll
      for (int i = 0; i < N; ++i) s[i] = __fadd_rn(s[i], __fmul_rn(delta, cur.k[i]));
      out = gdn_warp_sum(gdn_lane_dot<N>(s, cur.q));
    }
    if (lane == 0) y[t * y_step] = narrow<T>(out);
    if (a.steps) gdn_store_any<N>(a.state_out, (((b * a.T + t) * a.Hv + h) * a.Dv + dv) * DK + col, a.out_dt, s);
    if (AHEAD) cur = next;
  }
  if (!a.steps) gdn_store_any<N>(a.state_out, row * DK + col, a.out_dt, s);
}

// The recurrence at Dk = 128 for 8 value rows per warp (groups of 8 rows in (b, h, dv) order,
// blockDim.x / 32 per block): lane 4r + j holds elements 32j .. 32j + 32 of row 8w + r. The gate
// (float32, per head), v and beta load a step ahead; the next step's q and k rows are prefetched.
template <typename T> __device__ __forceinline__ void gated_delta_packed(const GdnArgs& a) {
  const int lane = threadIdx.x & 31, j = lane & 3, col = j * 32;
  const i64 warp = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const i64 groups = a.Dv >> 3;
  if (warp >= a.B * a.Hv * groups) return;  // the whole warp
  const i64 bh = warp / groups, dv = (warp % groups) * 8 + (lane >> 2), h = bh % a.Hv, b = bh / a.Hv;
  const i64 hk = h / (a.Hv / a.Hk), row = bh * a.Dv + dv;
  float s[32];
  gdn_load<float, 32>(static_cast<const float*>(a.state) + row * 128 + col, s);
  const T* qp = static_cast<const T*>(a.q) + b * a.q_s[0] + hk * a.q_s[2] + col;
  const T* kp = static_cast<const T*>(a.k) + b * a.k_s[0] + hk * a.k_s[2] + col;
  const T* vp = static_cast<const T*>(a.v) + b * a.v_s[0] + h * a.v_s[2] + dv;
  const float* gp = static_cast<const float*>(a.g) + b * a.g_s[0] + h * a.g_s[2];
  const i64 beta0 = b * a.beta_s[0] + h * a.beta_s[2];
  T* y = static_cast<T*>(a.y) + (b * a.T * a.Hv + h) * a.Dv + dv;
  const i64 y_step = a.Hv * a.Dv;
  float v = 0.0f, g = 0.0f, beta = 0.0f;
  if (a.T > 0) {
    v = (float)widen(vp[0]);
    g = gp[0];
    beta = gdn_ld(a.beta, beta0, a.beta_dt);
  }
  for (i64 t = 0; t < a.T; ++t) {
    float k[32], q[32];
    gdn_load<T, 32>(kp + t * a.k_s[1], k);
    gdn_load<T, 32>(qp + t * a.q_s[1], q);
    float v_next = v, g_next = g, beta_next = beta;
    if (t + 1 < a.T) {
      v_next = (float)widen(vp[(t + 1) * a.v_s[1]]);
      g_next = gp[(t + 1) * a.g_s[1]];
      beta_next = gdn_ld(a.beta, beta0 + (t + 1) * a.beta_s[1], a.beta_dt);
      gdn_prefetch(kp + (t + 1) * a.k_s[1]);
      gdn_prefetch(kp + (t + 1) * a.k_s[1] + 31);
      gdn_prefetch(qp + (t + 1) * a.q_s[1]);
      gdn_prefetch(qp + (t + 1) * a.q_s[1] + 31);
    }
#pragma unroll
    for (int i = 0; i < 32; ++i) s[i] = __fmul_rn(s[i], g);
    const float kv = gdn_row_dot(s, k);
    const float delta = __fmul_rn(__fsub_rn(v, kv), beta);
#pragma unroll
    for (int i = 0; i < 32; ++i) s[i] = __fadd_rn(s[i], __fmul_rn(delta, k[i]));
    const float out = gdn_row_dot(s, q);
    if (j == 0) y[t * y_step] = narrow<T>(out);
    if (a.steps) gdn_store_any<32>(a.state_out, (((b * a.T + t) * a.Hv + h) * a.Dv + dv) * 128 + col, a.out_dt, s);
    v = v_next;
    g = g_next;
    beta = beta_next;
  }
  if (!a.steps) gdn_store_any<32>(a.state_out, row * 128 + col, a.out_dt, s);
}

// ---- Chunked prefill: chunks of 64 steps, the WY form on tensor cores -------------------------
//
// Within a chunk of C = 64 steps, with Γ_i the product of the gates of steps ≤ i (in the chunk)
// and S0 the state before it, the deltas δ_i = β_i(v_i − g_i S_{i−1} k_i) solve
//   (I + A) Δ = β⊙V − (βΓ⊙K) S0ᵀ,   A_ij = β_i (Γ_i/Γ_j) k_i·k_j for j < i,
// so with X = (I + A)⁻¹, W = X (βΓ⊙K) and U = X (β⊙V):  Δ = U − W S0ᵀ, and
//   Y = Γ⊙(Q S0ᵀ) + P Δ,   P_ij = (Γ_i/Γ_j) q_i·k_j for j ≤ i,
//   S = Γ_C S0 + ((Γ_C/Γ)⊙Δ)ᵀ K.
// gated_delta_chunk_prep makes W, U, P and the gates' running log-products for every chunk at
// once (a block per chunk and head); gated_delta_chunk_scan carries each head's state through
// its chunks (a block per head and 32 value rows), its inputs staged a chunk ahead by cp.async.
// Products take bf16/f16 operands and accumulate in float32, as flash-linear-attention's do.
// Dk = Dv = 128, a gate per head, no mask. Gates enter as log|g| (at least −80, so a zero
// gate is a factor of e⁻⁸⁰) with their signs carried apart.

#define GDN_C 64
#define GDN_LD 136  // staged rows of 128 elements, padded by 16 bytes (conflict-free fragments)
#define GDN_PLD 72  // staged rows of 64 elements
#define GDN_BV 32   // value rows per scan block
#define GDN_VLD 40  // staged rows of GDN_BV elements

// The scratch the two kernels share (fast/gated_delta.rs allocates it), per (batch, value head)
// bh and padded step t < NT·64: w [bh][t][128], u [bh][t][128], p [bh][chunk][64][64] (lower
// triangle), gam [bh][t][2] (log|Γ_t| within the chunk, sign of Γ_t).
struct GdnChunk {
  void* w;
  void* u;
  void* p;
  float* gam;
  i64 nt;
};

// mma.sync m16n8k16 fragments from staged tiles by ldmatrix: an A fragment (16×16 at (m0, k0)
// of a tile stored [m][k] (_mk) or [k][m] (_km)), or the B fragments (16×8 at (k0, n0)) of two
// n-tiles n0 and n0 + 8 (b[0], b[1] and b[2], b[3]) of a tile stored [n][k] (_nk) or [k][n] (_kn).
template <typename T>
__device__ __forceinline__ void gdn_lda_mk(u32 (&a)[4], const T* s, int ld, int m0, int k0, int lane) {
  ldsm_x4(a, (u32)__cvta_generic_to_shared(s + (m0 + (lane & 15)) * ld + k0 + (lane >> 4) * 8));
}
template <typename T>
__device__ __forceinline__ void gdn_lda_km(u32 (&a)[4], const T* s, int ld, int m0, int k0, int lane) {
  const int k = k0 + (lane & 7) + (lane >> 4) * 8, m = m0 + ((lane >> 3) & 1) * 8;
  ldsm_x4_t(a, (u32)__cvta_generic_to_shared(s + k * ld + m));
}
template <typename T>
__device__ __forceinline__ void gdn_ldb_nk(u32 (&b)[4], const T* s, int ld, int k0, int n0, int lane) {
  const int n = n0 + (lane & 7) + (lane >> 4) * 8, k = k0 + ((lane >> 3) & 1) * 8;
  ldsm_x4(b, (u32)__cvta_generic_to_shared(s + n * ld + k));
}
template <typename T>
__device__ __forceinline__ void gdn_ldb_kn(u32 (&b)[4], const T* s, int ld, int k0, int n0, int lane) {
  const int k = k0 + (lane & 7) + ((lane >> 3) & 1) * 8, n = n0 + (lane >> 4) * 8;
  ldsm_x4_t(b, (u32)__cvta_generic_to_shared(s + k * ld + n));
}
// c0 += a·b[0..2], c1 += a·b[2..4].
template <typename T>
__device__ __forceinline__ void gdn_mma2(float (&c0)[4], float (&c1)[4], const u32 (&a)[4], const u32 (&b)[4]) {
  mma_m16n8k16<T>(c0, a, b[0], b[1]);
  mma_m16n8k16<T>(c1, a, b[2], b[3]);
}

// acc += rows m0 .. m0 + 16 of x [64][GDN_LD] times yᵀ, y [N·16][GDN_LD] (N pairs of n-tiles;
// only pairs ≤ `last`: the causal products skip what lies above the diagonal), over 128 columns.
template <typename T, int N>
__device__ __forceinline__ void gdn_rows_by(float (&acc)[2 * N][4], const T* x, const T* y, int m0, int last,
                                            int lane) {
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    u32 af4[4];
    gdn_lda_mk(af4, x, GDN_LD, m0, 16 * kk, lane);
#pragma unroll
    for (int np = 0; np < N; ++np) {
      if (np <= last) {
        u32 b[4];
        gdn_ldb_nk(b, y, GDN_LD, 16 * kk, 16 * np, lane);
        gdn_mma2<T>(acc[2 * np], acc[2 * np + 1], af4, b);
      }
    }
  }
}

// 16 bytes from global src to shared dst, asynchronously; zeros where !valid.
__device__ __forceinline__ void gdn_cp16(void* dst, const void* src, bool valid) {
  const u32 d = (u32)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void gdn_cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void gdn_cp_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }

// Stages rows [0, 64) of 128 elements (row r at src + r·stride, valid while r < valid) into
// s [64][GDN_LD] by the block's 128 threads.
template <typename T> __device__ __forceinline__ void gdn_stage128(T* s, const T* src, i64 stride, i64 valid) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int e = threadIdx.x + 128 * i, r = e >> 4, c = (e & 15) * 8;
    const bool ok = r < valid;
    gdn_cp16(s + r * GDN_LD + c, ok ? src + r * stride + c : src, ok);
  }
}

// Element i of a float32 / float16 / bfloat16 array (dt 0 / 1 / 2) set to x.
__device__ __forceinline__ void gdn_st(void* p, i64 i, i64 dt, float x) {
  if (dt == 1) {
    static_cast<f16*>(p)[i] = __float2half_rn(x);
  } else if (dt == 2) {
    static_cast<bf16*>(p)[i] = __float2bfloat16_rn(x);
  } else {
    static_cast<float*>(p)[i] = x;
  }
}

// Shared memory of gated_delta_chunk_prep, in bytes.
#define GDN_PREP_SMEM (3 * GDN_C * GDN_LD * 2 + GDN_C * 65 * 4 + GDN_C * GDN_PLD * 2 + 3 * GDN_C * 4)

// One chunk (blockIdx.x) of one (batch, value head) (blockIdx.y): W, U, P and the gates'
// running products, 128 threads.
template <typename T> __device__ __forceinline__ void gated_delta_chunk_prep(const GdnArgs& a, const GdnChunk& c) {
  extern __shared__ __align__(16) unsigned char gdn_smem[];
  T* ks = reinterpret_cast<T*>(gdn_smem);
  T* qs = ks + GDN_C * GDN_LD;
  T* vs = qs + GDN_C * GDN_LD;
  float* af = reinterpret_cast<float*>(vs + GDN_C * GDN_LD);
  T* xs = reinterpret_cast<T*>(af + GDN_C * 65);
  float* gl = reinterpret_cast<float*>(xs + GDN_C * GDN_PLD);  // log|Γ|
  float* gsg = gl + GDN_C;                                      // sign of Γ
  float* bs = gsg + GDN_C;                                      // β
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const i64 ch = blockIdx.x, bh = blockIdx.y, h = bh % a.Hv, b = bh / a.Hv, hk = h / (a.Hv / a.Hk);
  const i64 t0 = ch * GDN_C, valid = a.T - t0;
  const T* q = static_cast<const T*>(a.q) + b * a.q_s[0] + t0 * a.q_s[1] + hk * a.q_s[2];
  const T* k = static_cast<const T*>(a.k) + b * a.k_s[0] + t0 * a.k_s[1] + hk * a.k_s[2];
  const T* v = static_cast<const T*>(a.v) + b * a.v_s[0] + t0 * a.v_s[1] + h * a.v_s[2];
  gdn_stage128(ks, k, a.k_s[1], valid);
  gdn_stage128(qs, q, a.q_s[1], valid);
  gdn_stage128(vs, v, a.v_s[1], valid);
  gdn_cp_commit();
  if (tid < GDN_C) {
    float lg = 0.0f, sg = 1.0f, beta = 0.0f;
    if (tid < valid) {
      const float g = gdn_ld(a.g, b * a.g_s[0] + (t0 + tid) * a.g_s[1] + h * a.g_s[2], a.g_dt);
      lg = fmaxf(__logf(fabsf(g)), -80.0f);
      sg = g < 0.0f ? -1.0f : 1.0f;
      beta = gdn_ld(a.beta, b * a.beta_s[0] + (t0 + tid) * a.beta_s[1] + h * a.beta_s[2], a.beta_dt);
    }
    // Running sums over the chunk's 64 steps: two warps' scans, the second adding the first's total.
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const float l = __shfl_up_sync(0xffffffffu, lg, o), s = __shfl_up_sync(0xffffffffu, sg, o);
      if (lane >= o) {
        lg += l;
        sg *= s;
      }
    }
    gl[tid] = lg;
    gsg[tid] = sg;
    bs[tid] = beta;
  }
  __syncthreads();
  if (tid >= 32 && tid < GDN_C) {
    gl[tid] += gl[31];
    gsg[tid] *= gsg[31];
  }
  gdn_cp_wait_all();
  __syncthreads();
  if (tid < GDN_C) {
    float* gam = c.gam + (bh * c.nt * GDN_C + t0 + tid) * 2;
    gam[0] = gl[tid];
    gam[1] = gsg[tid];
  }
  const int g4 = lane >> 2, t4 = lane & 3, m0 = 16 * warp;
  // P = (Γ_i/Γ_j) q_i·k_j on and below the diagonal, the tiles a scan reads (n-tiles ≤ 2w + 1).
  {
    float acc[8][4] = {};
    gdn_rows_by<T, 4>(acc, qs, ks, m0, warp, lane);
    T* p = static_cast<T*>(c.p) + (bh * c.nt + ch) * GDN_C * GDN_C;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      if (nt <= 2 * warp + 1) {
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int i = m0 + g4 + 8 * hf, j = 8 * nt + 2 * t4;
          float x[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float r = gsg[i] * gsg[j + e] * __expf(gl[i] - gl[j + e]);
            x[e] = j + e <= i ? acc[nt][2 * hf + e] * r : 0.0f;
          }
          *reinterpret_cast<u32*>(p + i * GDN_C + j) = pack_half2<T>(x[0], x[1]);
        }
      }
    }
  }
  // A = β_i (Γ_i/Γ_j) k_i·k_j strictly below the diagonal, in float32.
  {
    float acc[8][4] = {};
    gdn_rows_by<T, 4>(acc, ks, ks, m0, warp, lane);
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = m0 + g4 + 8 * hf, j = 8 * nt + 2 * t4;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float r = gsg[i] * gsg[j + e] * __expf(gl[i] - gl[j + e]);
          af[i * 65 + j + e] = j + e < i ? bs[i] * acc[nt][2 * hf + e] * r : 0.0f;
        }
      }
    }
  }
  __syncthreads();
  if (tid < GDN_C) {
    // X = (I + A)⁻¹ by forward substitution, one column per thread, all in registers.
    const int m = tid;
    float x[GDN_C];
#pragma unroll
    for (int i = 0; i < GDN_C; ++i) {
      float s = i == m ? 1.0f : 0.0f;
#pragma unroll
      for (int j = 0; j < i; ++j) s = fmaf(-af[i * 65 + j], x[j], s);
      x[i] = s;
    }
#pragma unroll
    for (int i = 0; i < GDN_C; ++i) xs[i * GDN_PLD + m] = narrow<T>(x[i]);
  } else {
    // Meanwhile: K ← βΓ⊙K and V ← β⊙V in place.
    for (int e = tid - GDN_C; e < GDN_C * 16; e += 128 - GDN_C) {
      const int r = e >> 4, col = (e & 15) * 8;
      const float fk = bs[r] * gsg[r] * __expf(gl[r]), fv = bs[r];
      Vec<T, 8> kx = *reinterpret_cast<Vec<T, 8>*>(ks + r * GDN_LD + col);
      Vec<T, 8> vx = *reinterpret_cast<Vec<T, 8>*>(vs + r * GDN_LD + col);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        kx.v[j] = narrow<T>(widen(kx.v[j]) * fk);
        vx.v[j] = narrow<T>(widen(vx.v[j]) * fv);
      }
      *reinterpret_cast<Vec<T, 8>*>(ks + r * GDN_LD + col) = kx;
      *reinterpret_cast<Vec<T, 8>*>(vs + r * GDN_LD + col) = vx;
    }
  }
  __syncthreads();
  // W = X K' and U = X V' (X is lower triangular: k-tiles ≤ the warp's m-tile).
#pragma unroll
  for (int which = 0; which < 2; ++which) {
    const T* src = which == 0 ? ks : vs;
    T* dst = static_cast<T*>(which == 0 ? c.w : c.u) + (bh * c.nt * GDN_C + t0) * 128;
    float acc[16][4] = {};
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      if (kk <= warp) {
        u32 af4[4];
        gdn_lda_mk(af4, xs, GDN_PLD, m0, 16 * kk, lane);
#pragma unroll
        for (int np = 0; np < 8; ++np) {
          u32 b[4];
          gdn_ldb_kn(b, src, GDN_LD, 16 * kk, 16 * np, lane);
          gdn_mma2<T>(acc[2 * np], acc[2 * np + 1], af4, b);
        }
      }
    }
#pragma unroll
    for (int nt = 0; nt < 16; ++nt) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = m0 + g4 + 8 * hf, j = 8 * nt + 2 * t4;
        *reinterpret_cast<u32*>(dst + i * 128 + j) = pack_half2<T>(acc[nt][2 * hf], acc[nt][2 * hf + 1]);
      }
    }
  }
}

// Shared memory of gated_delta_chunk_scan, in bytes: two stages of w, q, k (64 × GDN_LD), p
// (64 × GDN_PLD), u (64 × GDN_VLD) and the gates (64 × 2 floats), then S (GDN_BV × GDN_LD) and
// Δ, (Γ_C/Γ)⊙Δ (64 × GDN_VLD each).
#define GDN_STAGE_ELEMS (3 * GDN_C * GDN_LD + GDN_C * GDN_PLD + GDN_C * GDN_VLD)
#define GDN_SCAN_SMEM (2 * (GDN_STAGE_ELEMS * 2 + GDN_C * 8) + (GDN_BV * GDN_LD + 2 * GDN_C * GDN_VLD) * 2)

// Value rows [32·blockIdx.x, +32) of one (batch, value head) (blockIdx.y) through every chunk,
// 128 threads: warp w holds S rows 16(w % 2) .. +16, key columns 64(w / 2) .. +64 in float32
// accumulators, and makes Δ and Y for the chunk's steps 16w .. 16w + 16.
template <typename T> __device__ __forceinline__ void gated_delta_chunk_scan(const GdnArgs& a, const GdnChunk& c) {
  extern __shared__ __align__(16) unsigned char gdn_smem[];
  constexpr int STAGE_BYTES = GDN_STAGE_ELEMS * 2 + GDN_C * 8;
  // Stage `buf`'s tiles, then its gates.
  auto stage = [&](int buf) { return reinterpret_cast<T*>(gdn_smem + buf * STAGE_BYTES); };
  auto gstage = [&](int buf) { return reinterpret_cast<float*>(gdn_smem + buf * STAGE_BYTES + GDN_STAGE_ELEMS * 2); };
  T* sb = reinterpret_cast<T*>(gdn_smem + 2 * STAGE_BYTES);
  T* dn = sb + GDN_BV * GDN_LD;
  T* dd = dn + GDN_C * GDN_VLD;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g4 = lane >> 2, t4 = lane & 3;
  const i64 bh = blockIdx.y, h = bh % a.Hv, b = bh / a.Hv, hk = h / (a.Hv / a.Hk), v0 = (i64)blockIdx.x * GDN_BV;
  const int sm0 = 16 * (warp & 1), sn0 = 64 * (warp >> 1), m0 = 16 * warp;
  const i64 tp = c.nt * GDN_C;
  // The state, rows v0 + sm0 + g4 (+8), columns sn0 + 8nt + 2t4 (+1).
  float s[8][4];
  const i64 srow = (bh * a.Dv + v0 + sm0 + g4) * 128 + sn0 + 2 * t4;
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nt][e] = gdn_ld(a.state, srow + (e >> 1) * 8 * 128 + 8 * nt + (e & 1), a.state_dt);
  }
  auto stage_chunk = [&](int buf, i64 ch) {
    T* ws = stage(buf);
    T* qs = ws + GDN_C * GDN_LD;
    T* ks = qs + GDN_C * GDN_LD;
    T* ps = ks + GDN_C * GDN_LD;
    T* us = ps + GDN_C * GDN_PLD;
    const i64 t0 = ch * GDN_C, valid = a.T - t0;
    gdn_stage128(ws, static_cast<const T*>(c.w) + (bh * tp + t0) * 128, 128, GDN_C);
    gdn_stage128(qs, static_cast<const T*>(a.q) + b * a.q_s[0] + t0 * a.q_s[1] + hk * a.q_s[2], a.q_s[1], valid);
    gdn_stage128(ks, static_cast<const T*>(a.k) + b * a.k_s[0] + t0 * a.k_s[1] + hk * a.k_s[2], a.k_s[1], valid);
    const T* p = static_cast<const T*>(c.p) + (bh * c.nt + ch) * GDN_C * GDN_C;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int e = tid + 128 * i, r = e >> 3, col = (e & 7) * 8;
      gdn_cp16(ps + r * GDN_PLD + col, p + r * GDN_C + col, true);
    }
    const T* u = static_cast<const T*>(c.u) + (bh * tp + t0) * 128 + v0;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int e = tid + 128 * i, r = e >> 2, col = (e & 3) * 8;
      gdn_cp16(us + r * GDN_VLD + col, u + r * 128 + col, true);
    }
    if (tid < 2 * GDN_C / 4) gdn_cp16(gstage(buf) + 4 * tid, c.gam + (bh * tp + t0) * 2 + 4 * tid, true);
    gdn_cp_commit();
  };
  auto write_state = [&]() {
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        *reinterpret_cast<u32*>(sb + (sm0 + g4 + 8 * hf) * GDN_LD + sn0 + 8 * nt + 2 * t4) =
            pack_half2<T>(s[nt][2 * hf], s[nt][2 * hf + 1]);
      }
    }
  };
  stage_chunk(0, 0);
  write_state();
  T* y = static_cast<T*>(a.y);
  for (i64 ch = 0; ch < c.nt; ++ch) {
    const int buf = ch & 1;
    gdn_cp_wait_all();
    __syncthreads();
    if (ch + 1 < c.nt) stage_chunk(buf ^ 1, ch + 1);
    const T* ws = stage(buf);
    const T* qs = ws + GDN_C * GDN_LD;
    const T* ks = qs + GDN_C * GDN_LD;
    const T* ps = ks + GDN_C * GDN_LD;
    const T* us = ps + GDN_C * GDN_PLD;
    const float* gm = gstage(buf);  // [64][2]: log|Γ|, sign
    const float glast = gm[2 * (GDN_C - 1)], slast = gm[2 * (GDN_C - 1) + 1];
    // Δ = U − W Sᵀ for steps m0 .. m0 + 16; also (Γ_C/Γ)⊙Δ for the state's update.
    {
      float acc[4][4] = {};
      gdn_rows_by<T, 2>(acc, ws, sb, m0, 1, lane);
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = m0 + g4 + 8 * hf;
        const float r = slast * gm[2 * i + 1] * __expf(glast - gm[2 * i]);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          const int j = 8 * nt + 2 * t4;
          const float d0 = widen(us[i * GDN_VLD + j]) - acc[nt][2 * hf];
          const float d1 = widen(us[i * GDN_VLD + j + 1]) - acc[nt][2 * hf + 1];
          *reinterpret_cast<u32*>(dn + i * GDN_VLD + j) = pack_half2<T>(d0, d1);
          *reinterpret_cast<u32*>(dd + i * GDN_VLD + j) = pack_half2<T>(d0 * r, d1 * r);
        }
      }
    }
    __syncthreads();
    // Y = Γ⊙(Q Sᵀ) + P Δ for steps m0 .. m0 + 16.
    {
      float acc[4][4] = {};
      gdn_rows_by<T, 2>(acc, qs, sb, m0, 1, lane);
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = m0 + g4 + 8 * hf;
        const float r = gm[2 * i + 1] * __expf(gm[2 * i]);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          acc[nt][2 * hf] *= r;
          acc[nt][2 * hf + 1] *= r;
        }
      }
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        if (kk <= warp) {
          u32 af4[4];
          gdn_lda_mk(af4, ps, GDN_PLD, m0, 16 * kk, lane);
#pragma unroll
          for (int np = 0; np < 2; ++np) {
            u32 b[4];
            gdn_ldb_kn(b, dn, GDN_VLD, 16 * kk, 16 * np, lane);
            gdn_mma2<T>(acc[2 * np], acc[2 * np + 1], af4, b);
          }
        }
      }
      const i64 t0 = ch * GDN_C;
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const i64 t = t0 + m0 + g4 + 8 * hf;
        if (t < a.T) {
          T* yr = y + ((b * a.T + t) * a.Hv + h) * a.Dv + v0 + 2 * t4;
#pragma unroll
          for (int nt = 0; nt < 4; ++nt) {
            *reinterpret_cast<u32*>(yr + 8 * nt) = pack_half2<T>(acc[nt][2 * hf], acc[nt][2 * hf + 1]);
          }
        }
      }
    }
    // S = Γ_C S + ((Γ_C/Γ)⊙Δ)ᵀ K.
    {
      const float r = slast * __expf(glast);
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] *= r;
      }
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        u32 af4[4];
        gdn_lda_km(af4, dd, GDN_VLD, sm0, 16 * kk, lane);
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          u32 b[4];
          gdn_ldb_kn(b, ks, GDN_LD, 16 * kk, sn0 + 16 * np, lane);
          gdn_mma2<T>(s[2 * np], s[2 * np + 1], af4, b);
        }
      }
    }
    __syncthreads();
    write_state();
  }
  gdn_cp_wait_all();
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) gdn_st(a.state_out, srow + (e >> 1) * 8 * 128 + 8 * nt + (e & 1), a.out_dt, s[nt][e]);
  }
}
