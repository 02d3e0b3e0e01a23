// Gated DeltaNet's recurrence (fast::gated_delta; launched by fast/gated_delta.rs). Per batch row
// and value head a [Dv, Dk] float32 state S; per step S = g·S, δ = β(v − S k), S = S + δ kᵀ,
// y = S q. The whole loop over the T steps runs inside the kernel (decode and prefill alike),
// each state row in registers from the first step to the last.
//
// Four ways, the first three bit-identical where they apply:
// * gated_delta_rows<T, N, AHEAD>: one warp per value row dv, lane l holding
//   S[dv, N·l .. N·l + N), Dk = 32·N; any gate, mask, storage and state dtype.
// * gated_delta_packed<T>: Dk = 128, 8 rows per warp, 4 lanes per row, 32 elements per lane;
//   a float32 gate per head, a float32 state, no mask. Two shuffles per dot product instead of
//   five, and 4 KiB of state in flight per warp instead of 512 bytes (decode is a pass over the
//   state).
// * gated_delta_decode<T>: the packed kernel's cases at T = 1, 8 rows per warp in the row
//   kernel's layout (whole-row loads and stores).
// * gated_delta_chunk_prep<T, NH> + gated_delta_chunk_scan<T>: long prompts, 64 steps at a time on
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

// The 8 rows' sums of partials x[i] over the warp, in the pairing of xor 1, 2, 4, 8, 16: lane l
// ends with row l & 7's.
__device__ __forceinline__ float gdn_sum8(const float (&x)[8], int lane) {
  const bool b0 = lane & 1, b1 = lane & 2, b2 = lane & 4;
  float y[4], z[2];
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    const float keep = b0 ? x[2 * m + 1] : x[2 * m], send = b0 ? x[2 * m] : x[2 * m + 1];
    y[m] = __fadd_rn(keep, __shfl_xor_sync(0xffffffffu, send, 1));
  }
#pragma unroll
  for (int n = 0; n < 2; ++n) {
    const float keep = b1 ? y[2 * n + 1] : y[2 * n], send = b1 ? y[2 * n] : y[2 * n + 1];
    z[n] = __fadd_rn(keep, __shfl_xor_sync(0xffffffffu, send, 2));
  }
  const float keep = b2 ? z[1] : z[0], send = b2 ? z[0] : z[1];
  float w = __fadd_rn(keep, __shfl_xor_sync(0xffffffffu, send, 4));
  w = __fadd_rn(w, __shfl_xor_sync(0xffffffffu, w, 8));
  return __fadd_rn(w, __shfl_xor_sync(0xffffffffu, w, 16));
}

// One step (T = 1) at Dk = 128, as gated_delta_packed takes it (a float32 gate per head, a
// float32 state, no mask), 8 value rows per warp with lane l holding elements 4l .. 4l + 4 of
// each: the row kernel's layout 8 rows deep, so each state load and store is a whole 512-byte
// row per instruction, where the packed kernel's lanes each read their own 128-byte run (a pass
// over the state wants whole lines per instruction). Sums follow gated_delta_rows<T, 4>'s
// butterfly (gdn_sum8): bit-identical results.
template <typename T> __device__ __forceinline__ void gated_delta_decode(const GdnArgs& a) {
  const int lane = threadIdx.x & 31, col = 4 * lane;
  const int warp = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int groups = (int)(a.Dv >> 3);
  if (warp >= (int)(a.B * a.Hv) * groups) return;
  const int bh = warp / groups, dv0 = (warp % groups) * 8, h = bh % (int)a.Hv, b = bh / (int)a.Hv;
  const int hk = h / (int)(a.Hv / a.Hk);
  const i64 row0 = (i64)bh * a.Dv + dv0;
  const float* sp = static_cast<const float*>(a.state) + row0 * 128 + col;
  float s[8][4];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float4 x = *reinterpret_cast<const float4*>(sp + i * 128);
    s[i][0] = x.x;
    s[i][1] = x.y;
    s[i][2] = x.z;
    s[i][3] = x.w;
  }
  float k[4], q[4];
  gdn_load<T, 4>(static_cast<const T*>(a.k) + b * a.k_s[0] + hk * a.k_s[2] + col, k);
  gdn_load<T, 4>(static_cast<const T*>(a.q) + b * a.q_s[0] + hk * a.q_s[2] + col, q);
  const float v = (float)widen(static_cast<const T*>(a.v)[b * a.v_s[0] + h * a.v_s[2] + dv0 + (lane & 7)]);
  const float g = static_cast<const float*>(a.g)[b * a.g_s[0] + h * a.g_s[2]];
  const float beta = gdn_ld(a.beta, b * a.beta_s[0] + h * a.beta_s[2], a.beta_dt);
  float p[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) s[i][e] = __fmul_rn(s[i][e], g);
    p[i] = gdn_run<4, 0>(s[i], k);
  }
  const float delta = __fmul_rn(__fsub_rn(v, gdn_sum8(p, lane)), beta);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float d = __shfl_sync(0xffffffffu, delta, i);
#pragma unroll
    for (int e = 0; e < 4; ++e) s[i][e] = __fadd_rn(s[i][e], __fmul_rn(d, k[e]));
    p[i] = gdn_run<4, 0>(s[i], q);
  }
  const float out = gdn_sum8(p, lane);
  if (lane < 8) static_cast<T*>(a.y)[(i64)bh * a.Dv + dv0 + lane] = narrow<T>(out);
#pragma unroll
  for (int i = 0; i < 8; ++i) gdn_store_any<4>(a.state_out, (row0 + i) * 128 + col, a.out_dt, s[i]);
}

// ---- Chunked prefill: chunks of 64 steps, the WY form on tensor cores -------------------------
//
// Within a chunk of C = 64 steps, with Γ_i the product of the gates of steps ≤ i (in the chunk)
// and S0 the state before it, the deltas δ_i = β_i(v_i − g_i S_{i−1} k_i) solve
//   (I + A) Δ = diag(β) R,   R = V − Γ⊙(K S0ᵀ),   A_ij = β_i (Γ_i/Γ_j) k_i·k_j for j < i,
// so with M = (I + A)⁻¹ diag(β):  Δ = M R, and
//   Y = Γ⊙(Q S0ᵀ) + P Δ,   P_ij = (Γ_i/Γ_j) q_i·k_j for j ≤ i,
//   S = Γ_C S0 + ((Γ_C/Γ)⊙Δ)ᵀ K.
// gated_delta_chunk_prep makes M, P and the gates' running log-products for every chunk at once
// (a block per chunk and key head's value heads: q and k are staged once); it never reads v.
// gated_delta_chunk_scan carries each head's state through its chunks (a block per head and 32
// value rows), its inputs staged a chunk ahead by cp.async.
// Products take bf16/f16 operands and accumulate in float32, as flash-linear-attention's do.
// Dk = Dv = 128, a gate per head, no mask. Gates enter as log|g| (at least −80, so a zero
// gate is a factor of e⁻⁸⁰) with their signs carried apart.

#define GDN_C 64
#define GDN_LD 136  // staged rows of 128 elements, padded by 16 bytes (conflict-free fragments)
#define GDN_PLD 72  // staged rows of 64 elements
#define GDN_ALD 68  // rows of Aᵀ in floats: 16-byte aligned, conflict-free transposed stores
#define GDN_BV 32   // value rows per scan block
#define GDN_VLD 40  // staged rows of GDN_BV elements

// The scratch the two kernels share (fast/gated_delta.rs allocates it), per (batch, value head)
// bh and chunk ch: m, p [bh][ch][64][64] (M whole, P's lower triangle), and per padded step t
// gam [bh][t][2] (log|Γ_t| within the chunk, sign of Γ_t). The derivative also asks for
// xf, pf [bh][ch][64][64] (X = (I + A)⁻¹ and P's lower triangle in float32) and s0
// [bh][ch][Dv][Dk] (each chunk's first state); null in the forward.
struct GdnChunk {
  void* m;
  void* p;
  float* gam;
  i64 nt;
  float* xf;
  float* pf;
  float* s0;
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

// acc += rows m0 .. m0 + 16 of a lower-triangular x [64][GDN_PLD] (M or P: k-tiles ≤ the row
// tile `last`) times y [64][GDN_VLD] (R or Δ), over the scan block's 32 value columns.
template <typename T>
__device__ __forceinline__ void gdn_causal_by(float (&acc)[4][4], const T* x, const T* y, int m0, int last, int lane) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    if (kk <= last) {
      u32 af4[4];
      gdn_lda_mk(af4, x, GDN_PLD, m0, 16 * kk, lane);
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        u32 b[4];
        gdn_ldb_kn(b, y, GDN_VLD, 16 * kk, 16 * np, lane);
        gdn_mma2<T>(acc[2 * np], acc[2 * np + 1], af4, b);
      }
    }
  }
}

// 16 bytes from global src to shared address dst, asynchronously; _z: zeros where !valid.
__device__ __forceinline__ void gdn_cp16(u32 dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void gdn_cp16_z(u32 dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void gdn_cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void gdn_cp_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }

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

// Two elements of T packed in one register, as floats (the low half first).
template <typename T> __device__ __forceinline__ float2 gdn_unpack2(u32 x) {
  if constexpr (IsBf16<T>::value) {
    return make_float2(__uint_as_float(x << 16), __uint_as_float(x & 0xffff0000u));
  } else {
    return __half22float2(*reinterpret_cast<__half2*>(&x));
  }
}

// Shared memory of gated_delta_chunk_prep with NH value heads, in bytes: k and q (64 × GDN_LD;
// M's staging once they are used), Aᵀ per head (64 × GDN_ALD floats), the gates (3 × 64 floats
// per head).
#define GDN_PREP_SMEM(NH) (2 * GDN_C * GDN_LD * 2 + (NH) * GDN_C * GDN_ALD * 4 + 3 * (NH) * GDN_C * 4)

// One chunk (blockIdx.x) of NH (1 or 2) value heads sharing a key head (blockIdx.y): P, M and
// the gates' running products of each, 128 threads.
template <typename T, int NH>
__device__ __forceinline__ void gated_delta_chunk_prep(const GdnArgs& a, const GdnChunk& c) {
  extern __shared__ __align__(16) unsigned char gdn_smem[];
  T* ks = reinterpret_cast<T*>(gdn_smem);
  T* qs = ks + GDN_C * GDN_LD;
  float* at = reinterpret_cast<float*>(qs + GDN_C * GDN_LD);  // [NH][j][i] = A_ij
  float* gl = at + NH * GDN_C * GDN_ALD;                       // [NH][64] log|Γ|
  float* gsg = gl + NH * GDN_C;                                // sign of Γ
  float* bs = gsg + NH * GDN_C;                                // β
  T* xs = ks;                                                  // [NH][64][GDN_PLD]: M
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int groups = (int)(a.Hv / NH), ch = blockIdx.x, b = blockIdx.y / groups, h0 = (blockIdx.y % groups) * NH;
  const int hk = h0 / (int)(a.Hv / a.Hk);
  const i64 t0 = (i64)ch * GDN_C, valid = a.T - t0;
  {
    const T* q = static_cast<const T*>(a.q) + b * a.q_s[0] + t0 * a.q_s[1] + hk * a.q_s[2];
    const T* k = static_cast<const T*>(a.k) + b * a.k_s[0] + t0 * a.k_s[1] + hk * a.k_s[2];
    const u32 dk = (u32)__cvta_generic_to_shared(ks), dq = (u32)__cvta_generic_to_shared(qs);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int e = tid + 128 * i, r = e >> 4, col = (e & 15) * 8;
      const bool ok = r < valid;
      gdn_cp16_z(dk + (r * GDN_LD + col) * 2, ok ? k + r * a.k_s[1] + col : k, ok);
      gdn_cp16_z(dq + (r * GDN_LD + col) * 2, ok ? q + r * a.q_s[1] + col : q, ok);
    }
    gdn_cp_commit();
  }
  // The gates: thread tid takes head tid / 64, step tid % 64; running sums over the chunk by two
  // warps' scans, the second adding the first's total.
  const bool gate_thread = NH == 2 || tid < GDN_C;
  const int gh = tid >> 6, gt = tid & 63;
  if (gate_thread) {
    float lg = 0.0f, sg = 1.0f, beta = 0.0f;
    const i64 h = h0 + gh;
    if (gt < valid) {
      const float g = gdn_ld(a.g, b * a.g_s[0] + (t0 + gt) * a.g_s[1] + h * a.g_s[2], a.g_dt);
      lg = fmaxf(__logf(fabsf(g)), -80.0f);
      sg = g < 0.0f ? -1.0f : 1.0f;
      beta = gdn_ld(a.beta, b * a.beta_s[0] + (t0 + gt) * a.beta_s[1] + h * a.beta_s[2], a.beta_dt);
    }
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
  if (gate_thread && gt >= 32) {
    gl[tid] += gl[gh * GDN_C + 31];
    gsg[tid] *= gsg[gh * GDN_C + 31];
  }
  gdn_cp_wait_all();
  __syncthreads();
  if (gate_thread) {
    float* gam = c.gam + (((i64)b * a.Hv + h0 + gh) * c.nt * GDN_C + t0 + gt) * 2;
    *reinterpret_cast<float2*>(gam) = make_float2(gl[tid], gsg[tid]);
  }
  // Warp w takes rows 16w .. 16w + 16 of K Kᵀ and Q Kᵀ, only the tiles on or below the diagonal
  // (n-tiles ≤ 2w + 1), and gates them for each head.
  const int g4 = lane >> 2, t4 = lane & 3, m0 = 16 * warp;
  {
    float acc[8][4] = {};
    gdn_rows_by<T, 4>(acc, ks, ks, m0, warp, lane);
#pragma unroll
    for (int hh = 0; hh < NH; ++hh) {
      const float* l = gl + hh * GDN_C;
      const float* sgn = gsg + hh * GDN_C;
      float* ah = at + hh * GDN_C * GDN_ALD;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int i = m0 + g4 + 8 * hf, j = 8 * nt + 2 * t4;
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float x = 0.0f;
            if (nt <= 2 * warp + 1 && j + e < i) {
              x = bs[hh * GDN_C + i] * acc[nt][2 * hf + e] * sgn[i] * sgn[j + e] * __expf(l[i] - l[j + e]);
            }
            ah[(j + e) * GDN_ALD + i] = x;
          }
        }
      }
    }
  }
  {
    float acc[8][4] = {};
    gdn_rows_by<T, 4>(acc, qs, ks, m0, warp, lane);
#pragma unroll
    for (int hh = 0; hh < NH; ++hh) {
      const float* l = gl + hh * GDN_C;
      const float* sgn = gsg + hh * GDN_C;
      T* p = static_cast<T*>(c.p) + (((i64)b * a.Hv + h0 + hh) * c.nt + ch) * GDN_C * GDN_C;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        if (nt <= 2 * warp + 1) {
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
            const int i = m0 + g4 + 8 * hf, j = 8 * nt + 2 * t4;
            float x[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              x[e] = j + e <= i ? acc[nt][2 * hf + e] * sgn[i] * sgn[j + e] * __expf(l[i] - l[j + e]) : 0.0f;
            }
            *reinterpret_cast<u32*>(p + i * GDN_C + j) = pack_half2<T>(x[0], x[1]);
            if (c.pf) {
              float* pf = c.pf + ((((i64)b * a.Hv + h0 + hh) * c.nt + ch) * GDN_C + i) * GDN_C + j;
              *reinterpret_cast<float2*>(pf) = make_float2(x[0], x[1]);
            }
          }
        }
      }
    }
  }
  __syncthreads();
  if (gate_thread) {
    // Column gt of head gh's X = (I + A)⁻¹ by right-looking substitution: each x_j, once final,
    // updates the rows below it, so the dependent chain is 64 steps long, not 64²/2.
    const float* ah = at + gh * GDN_C * GDN_ALD;
    float x[GDN_C];
#pragma unroll
    for (int i = 0; i < GDN_C; ++i) x[i] = i == gt ? 1.0f : 0.0f;
#pragma unroll
    for (int j = 0; j < GDN_C - 1; ++j) {
      const float xj = x[j];
      const float4* col = reinterpret_cast<const float4*>(ah + j * GDN_ALD);
#pragma unroll
      for (int q4 = (j + 1) / 4; q4 < GDN_C / 4; ++q4) {
        const float4 a4 = col[q4];
        if (4 * q4 + 0 > j) x[4 * q4 + 0] = fmaf(-a4.x, xj, x[4 * q4 + 0]);
        if (4 * q4 + 1 > j) x[4 * q4 + 1] = fmaf(-a4.y, xj, x[4 * q4 + 1]);
        if (4 * q4 + 2 > j) x[4 * q4 + 2] = fmaf(-a4.z, xj, x[4 * q4 + 2]);
        if (4 * q4 + 3 > j) x[4 * q4 + 3] = fmaf(-a4.w, xj, x[4 * q4 + 3]);
      }
    }
    if (c.xf) {
      float* xf = c.xf + (((i64)b * a.Hv + h0 + gh) * c.nt + ch) * GDN_C * GDN_C + gt;
#pragma unroll
      for (int i = 0; i < GDN_C; ++i) xf[i * GDN_C] = x[i];
    }
    // M = X diag(β), staged for whole-row stores.
    const float bm = bs[tid];
    T* xh = xs + gh * GDN_C * GDN_PLD;
#pragma unroll
    for (int i = 0; i < GDN_C; ++i) xh[i * GDN_PLD + gt] = narrow<T>(x[i] * bm);
  }
  __syncthreads();
#pragma unroll
  for (int e = tid; e < NH * GDN_C * 8; e += 128) {
    const int hh = e >> 9, r = (e >> 3) & 63, col = (e & 7) * 8;
    T* dst = static_cast<T*>(c.m) + (((i64)b * a.Hv + h0 + hh) * c.nt + ch) * GDN_C * GDN_C + r * GDN_C + col;
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(xs + (hh * GDN_C + r) * GDN_PLD + col);
  }
}

// Shared memory of gated_delta_chunk_scan, in bytes: two stages of q, k (64 × GDN_LD), m, p
// (64 × GDN_PLD), v (64 × GDN_VLD) and the gates (64 × 2 floats); then S twice (GDN_BV ×
// GDN_LD), R, Δ and (Γ_C/Γ)⊙Δ (64 × GDN_VLD each).
#define GDN_STAGE_ELEMS (2 * GDN_C * GDN_LD + 2 * GDN_C * GDN_PLD + GDN_C * GDN_VLD)
#define GDN_STAGE_BYTES (GDN_STAGE_ELEMS * 2 + GDN_C * 8)
#define GDN_SCAN_SMEM (2 * GDN_STAGE_BYTES + (2 * GDN_BV * GDN_LD + 3 * GDN_C * GDN_VLD) * 2)

// Value rows [32·blockIdx.x, +32) of one (batch, value head) (blockIdx.y) through every chunk,
// 128 threads: warp w holds S rows 16(w % 2) .. +16, key columns 64(w / 2) .. +64 in float32
// accumulators, and makes R, Δ and Y for the chunk's steps 16w .. 16w + 16. The state goes
// through shared memory as T, in two buffers, one read while the other is written.
template <typename T> __device__ __forceinline__ void gated_delta_chunk_scan(const GdnArgs& a, const GdnChunk& c) {
  extern __shared__ __align__(16) unsigned char gdn_smem[];
  // Byte offsets of a stage's tiles.
  constexpr u32 OQ = 0, OK = GDN_C * GDN_LD * 2, OM = 2 * OK, OP = OM + GDN_C * GDN_PLD * 2,
                OV = OP + GDN_C * GDN_PLD * 2, OG = GDN_STAGE_ELEMS * 2;
  const u32 smem0 = (u32)__cvta_generic_to_shared(gdn_smem);
  T* sbuf = reinterpret_cast<T*>(gdn_smem + 2 * GDN_STAGE_BYTES);
  T* rs = sbuf + 2 * GDN_BV * GDN_LD;
  T* dn = rs + GDN_C * GDN_VLD;
  T* dd = dn + GDN_C * GDN_VLD;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g4 = lane >> 2, t4 = lane & 3;
  const int bh = blockIdx.y, h = bh % (int)a.Hv, b = bh / (int)a.Hv, hk = h / (int)(a.Hv / a.Hk);
  const int v0 = blockIdx.x * GDN_BV, sm0 = 16 * (warp & 1), sn0 = 64 * (warp >> 1), m0 = 16 * warp;
  const int nch = (int)c.nt, steps = (int)a.T;
  // The state, rows v0 + sm0 + g4 (+8), columns sn0 + 8nt + 2t4 (+1).
  float s[8][4];
  const i64 srow = ((i64)bh * a.Dv + v0 + sm0 + g4) * 128 + sn0 + 2 * t4;
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nt][e] = gdn_ld(a.state, srow + (e >> 1) * 8 * 128 + 8 * nt + (e & 1), a.state_dt);
  }
  // The thread's sources in chunk 0, advanced a chunk per stage: q and k rows qr + 8i, m and p
  // rows mr + 16i, v rows vr + 32i (the addressing would otherwise outweigh the products).
  const int qr = tid >> 4, qc = (tid & 15) * 8, mr = tid >> 3, mc = (tid & 7) * 8, vr = tid >> 2, vc = (tid & 3) * 8;
  const i64 qs1 = a.q_s[1], ks1 = a.k_s[1], vs1 = a.v_s[1];
  const T* qsrc = static_cast<const T*>(a.q) + b * a.q_s[0] + hk * a.q_s[2] + qr * qs1 + qc;
  const T* ksrc = static_cast<const T*>(a.k) + b * a.k_s[0] + hk * a.k_s[2] + qr * ks1 + qc;
  const T* vsrc = static_cast<const T*>(a.v) + b * a.v_s[0] + h * a.v_s[2] + vr * vs1 + v0 + vc;
  const T* msrc = static_cast<const T*>(c.m) + (i64)bh * nch * GDN_C * GDN_C + mr * GDN_C + mc;
  const T* psrc = static_cast<const T*>(c.p) + (i64)bh * nch * GDN_C * GDN_C + mr * GDN_C + mc;
  const float* gsrc = c.gam + (i64)bh * nch * GDN_C * 2 + 4 * tid;
  const u32 dq = (qr * GDN_LD + qc) * 2, dm = (mr * GDN_PLD + mc) * 2, dv = (vr * GDN_VLD + vc) * 2;
  auto stage_chunk = [&](int buf, int ch) {
    const u32 st = smem0 + buf * GDN_STAGE_BYTES;
    const int valid = steps - ch * GDN_C;
    if (valid >= GDN_C) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        gdn_cp16(st + OQ + dq + i * 8 * GDN_LD * 2, qsrc + i * 8 * qs1);
        gdn_cp16(st + OK + dq + i * 8 * GDN_LD * 2, ksrc + i * 8 * ks1);
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) gdn_cp16(st + OV + dv + i * 32 * GDN_VLD * 2, vsrc + i * 32 * vs1);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const bool ok = qr + 8 * i < valid;
        gdn_cp16_z(st + OQ + dq + i * 8 * GDN_LD * 2, ok ? qsrc + i * 8 * qs1 : qsrc, ok);
        gdn_cp16_z(st + OK + dq + i * 8 * GDN_LD * 2, ok ? ksrc + i * 8 * ks1 : ksrc, ok);
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const bool ok = vr + 32 * i < valid;
        gdn_cp16_z(st + OV + dv + i * 32 * GDN_VLD * 2, ok ? vsrc + i * 32 * vs1 : vsrc, ok);
      }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      gdn_cp16(st + OM + dm + i * 16 * GDN_PLD * 2, msrc + i * 16 * GDN_C);
      gdn_cp16(st + OP + dm + i * 16 * GDN_PLD * 2, psrc + i * 16 * GDN_C);
    }
    if (tid < 32) gdn_cp16(st + OG + 16 * tid, gsrc);
    gdn_cp_commit();
    qsrc += GDN_C * qs1;
    ksrc += GDN_C * ks1;
    vsrc += GDN_C * vs1;
    msrc += GDN_C * GDN_C;
    psrc += GDN_C * GDN_C;
    gsrc += GDN_C * 2;
  };
  auto write_state = [&](T* sb) {
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
  write_state(sbuf);
  // y rows of steps m0 + g4 (+8) of each chunk, columns v0 + 2t4 + 8nt (+1).
  T* yrow = static_cast<T*>(a.y) + (((i64)b * steps + m0 + g4) * a.Hv + h) * a.Dv + v0 + 2 * t4;
  const i64 y8 = 8 * a.Hv * a.Dv;
  for (int ch = 0; ch < nch; ++ch) {
    const int buf = ch & 1;
    if (c.s0) {
      float* s0 = c.s0 + (((i64)bh * nch + ch) * a.Dv + v0 + sm0 + g4) * 128 + sn0 + 2 * t4;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        *reinterpret_cast<float2*>(s0 + 8 * nt) = make_float2(s[nt][0], s[nt][1]);
        *reinterpret_cast<float2*>(s0 + 8 * 128 + 8 * nt) = make_float2(s[nt][2], s[nt][3]);
      }
    }
    gdn_cp_wait_all();
    __syncthreads();
    if (ch + 1 < nch) stage_chunk(buf ^ 1, ch + 1);
    const T* qs = reinterpret_cast<const T*>(gdn_smem + buf * GDN_STAGE_BYTES);
    const T* ks = qs + GDN_C * GDN_LD;
    const T* ms = ks + GDN_C * GDN_LD;
    const T* ps = ms + GDN_C * GDN_PLD;
    const T* vs = ps + GDN_C * GDN_PLD;
    const T* sb = sbuf + buf * GDN_BV * GDN_LD;
    const float2* gm = reinterpret_cast<const float2*>(gdn_smem + buf * GDN_STAGE_BYTES + OG);  // log|Γ|, sign
    const float2 gc = gm[GDN_C - 1];
    // K Sᵀ and Q Sᵀ for steps m0 .. m0 + 16, sharing S's fragments.
    float ak[4][4] = {}, aq[4][4] = {};
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      u32 fk[4], fq[4];
      gdn_lda_mk(fk, ks, GDN_LD, m0, 16 * kk, lane);
      gdn_lda_mk(fq, qs, GDN_LD, m0, 16 * kk, lane);
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        u32 bf[4];
        gdn_ldb_nk(bf, sb, GDN_LD, 16 * kk, 16 * np, lane);
        gdn_mma2<T>(ak[2 * np], ak[2 * np + 1], fk, bf);
        gdn_mma2<T>(aq[2 * np], aq[2 * np + 1], fq, bf);
      }
    }
    // R = V − Γ⊙(K Sᵀ); Y starts as Γ⊙(Q Sᵀ).
    float rd[2];  // Γ_C/Γ_i of the thread's two steps
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int i = m0 + g4 + 8 * hf;
      const float2 g2 = gm[i];
      const float gi = g2.y * __expf(g2.x);
      rd[hf] = gc.y * g2.y * __expf(gc.x - g2.x);
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int j = 8 * nt + 2 * t4;
        const float2 v2 = gdn_unpack2<T>(*reinterpret_cast<const u32*>(vs + i * GDN_VLD + j));
        *reinterpret_cast<u32*>(rs + i * GDN_VLD + j) =
            pack_half2<T>(fmaf(-gi, ak[nt][2 * hf], v2.x), fmaf(-gi, ak[nt][2 * hf + 1], v2.y));
        aq[nt][2 * hf] *= gi;
        aq[nt][2 * hf + 1] *= gi;
      }
    }
    __syncthreads();
    // Δ = M R (M is lower triangular: k-tiles ≤ the warp's m-tile); also (Γ_C/Γ)⊙Δ.
    {
      float ad[4][4] = {};
      gdn_causal_by<T>(ad, ms, rs, m0, warp, lane);
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = m0 + g4 + 8 * hf;
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          const int j = 8 * nt + 2 * t4;
          *reinterpret_cast<u32*>(dn + i * GDN_VLD + j) = pack_half2<T>(ad[nt][2 * hf], ad[nt][2 * hf + 1]);
          *reinterpret_cast<u32*>(dd + i * GDN_VLD + j) =
              pack_half2<T>(ad[nt][2 * hf] * rd[hf], ad[nt][2 * hf + 1] * rd[hf]);
        }
      }
    }
    __syncthreads();
    // Y += P Δ, then out.
    {
      gdn_causal_by<T>(aq, ps, dn, m0, warp, lane);
      const int t = ch * GDN_C + m0 + g4;
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        if (t + 8 * hf < steps) {
#pragma unroll
          for (int nt = 0; nt < 4; ++nt) {
            *reinterpret_cast<u32*>(yrow + hf * y8 + 8 * nt) = pack_half2<T>(aq[nt][2 * hf], aq[nt][2 * hf + 1]);
          }
        }
      }
      yrow += 8 * y8;
    }
    // S = Γ_C S + ((Γ_C/Γ)⊙Δ)ᵀ K, into the other buffer.
    {
      const float r = gc.y * __expf(gc.x);
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
          u32 bf[4];
          gdn_ldb_kn(bf, ks, GDN_LD, 16 * kk, sn0 + 16 * np, lane);
          gdn_mma2<T>(s[2 * np], s[2 * np + 1], af4, bf);
        }
      }
    }
    write_state(sbuf + (buf ^ 1) * GDN_BV * GDN_LD);
  }
  gdn_cp_wait_all();
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) gdn_st(a.state_out, srow + (e >> 1) * 8 * 128 + 8 * nt + (e & 1), a.out_dt, s[nt][e]);
  }
}

// ---- the derivative ---------------------------------------------------------------------------
// fast::gated_delta's vjp at Dk = Dv = 128 (a gate per head, no mask, the last state), 64 steps at
// a time as the chunked forward. Per chunk, with Γ_i the gates' running product from its start,
// r_i = Γ_C/Γ_i, S₀ its first state, M = X diag(β) with X = (I + A)⁻¹, and P, as
// gated_delta_chunk_prep makes them:
//   R = V − Γ⊙(K S₀ᵀ), Δ = M R, Y = Γ⊙(Q S₀ᵀ) + P Δ, S_C = Γ_C S₀ + Δᵀ diag(r) K.
// Back from the cotangent dS_C of its last state:
//   dΔ = Pᵀ dY + diag(r) K dS_Cᵀ, dV = dR = Mᵀ dΔ, dS₀ = Γ_C dS_C + dYᵀ diag(Γ) Q − dRᵀ diag(Γ) K,
// and through dP = dY Δᵀ, dM = dΔ Rᵀ (X's and A's derivatives) to dq, dk, dβ and the gates' log
// running products, whose reversed running sums are the log gates'. Three kernels after the
// forward's prep and scan (which then keep X, P and every chunk's S₀ in float32):
// gated_delta_bwd_scan carries dS back across the chunks, 16 value rows per block;
// gated_delta_bwd_chunk takes every chunk at once; gated_delta_bwd_heads sums q's and k's
// cotangents over the value heads that share them.

// The derivative's outputs and scratch (fast/gated_delta.rs writes it as GDN_GRAD_WORDS words).
struct GdnGrad {
  const void* dy;  // [B, T, Hv, Dv] of T, last axis contiguous
  const void* ds;  // [B, Hv, Dv, Dk] of the storage dtype (a.out_dt), row-major
  void* dq;        // [B, T, Hk, Dk] of T, row-major
  void* dk;        // as dq
  void* dv;        // [B, T, Hv, Dv] of T, row-major
  void* dg;        // [B, T, Hv] of the gate's dtype, row-major
  void* dbeta;     // [B, T, Hv] of β's dtype, row-major
  void* dstate;    // [B, Hv, Dv, Dk] of the state's dtype, row-major
  float* dsc;      // [bh][chunk][Dv][Dk]: the cotangent of each chunk's last state
  float* dqv;      // [B, T, Hv, Dk]: q's cotangent per value head
  float* dkv;      // as dqv, k's
  i64 dy_s[3];
};
#define GDN_GRAD_WORDS 14
static_assert(sizeof(GdnGrad) == 8 * GDN_GRAD_WORDS, "GdnGrad must be whole 8-byte words");

#define GDN_FLD 132  // float32 rows of 128, padded: 16-byte rows, row i + 1 four banks on
#define GDN_SLD 65   // float32 rows of 64
#define GDN_TLD 17   // float32 rows of a 16-column value tile
#define GDN_BR 16    // value rows (or columns) per tile of the derivative

// Rows of q or k (src at the chunk's first step) as float32 into dst [64][GDN_FLD], zeros past
// the last step; 256 threads.
template <typename T>
__device__ __forceinline__ void gdn_stage_f32(float* dst, const T* src, i64 step, int valid, int tid) {
  for (int e = tid; e < GDN_C * 16; e += 256) {
    const int r = e >> 4, col = (e & 15) * 8;
    float x[8] = {};
    if (r < valid) gdn_load<T, 8>(src + r * step + col, x);
    *reinterpret_cast<float4*>(dst + r * GDN_FLD + col) = make_float4(x[0], x[1], x[2], x[3]);
    *reinterpret_cast<float4*>(dst + r * GDN_FLD + col + 4) = make_float4(x[4], x[5], x[6], x[7]);
  }
}

// Four floats of shared memory at p (16-byte aligned).
__device__ __forceinline__ float4 gdn_f4(const float* p) { return *reinterpret_cast<const float4*>(p); }

// acc + a·b over four lanes.
__device__ __forceinline__ float gdn_dot4(float4 a, float4 b, float acc) {
  return fmaf(a.w, b.w, fmaf(a.z, b.z, fmaf(a.y, b.y, fmaf(a.x, b.x, acc))));
}

// A [64][64] float32 matrix of the scratch into dst [64][GDN_SLD]; `lower`: zeros above the
// diagonal (P's upper triangle is never written).
__device__ __forceinline__ void gdn_stage_square(float* dst, const float* src, bool lower, int tid) {
  for (int e = tid; e < GDN_C * GDN_C; e += 256) {
    const int i = e >> 6, j = e & 63;
    dst[i * GDN_SLD + j] = lower && j > i ? 0.0f : src[e];
  }
}

// 16 value columns v0 .. v0 + 16 of dy or v rows (src at the chunk's first step) into dst
// [64][GDN_TLD], zeros past the last step.
template <typename T>
__device__ __forceinline__ void gdn_stage_tile(float* dst, const T* src, i64 step, int valid, int tid) {
  for (int e = tid; e < GDN_C * GDN_BR; e += 256) {
    const int r = e >> 4, col = e & 15;
    dst[r * GDN_TLD + col] = r < valid ? (float)widen(src[r * step + col]) : 0.0f;
  }
}

// Per step i of chunk ch (threads 0 .. 63): Γ_i, r_i = Γ_C/Γ_i, β_i (0 past the last step), and
// with ls / sg non-null log|Γ_i| and its sign.
__device__ __forceinline__ void gdn_stage_gates(const GdnArgs& a, const GdnChunk& c, int bh, int ch, int valid,
                                                float* gg, float* rr, float* bb, float* ls, float* sg, int tid) {
  if (tid < GDN_C) {
    const float2* gam = reinterpret_cast<const float2*>(c.gam) + ((i64)bh * c.nt + ch) * GDN_C;
    const float2 gi = gam[tid], gc = gam[GDN_C - 1];
    const i64 b = bh / a.Hv, h = bh % a.Hv, t = (i64)ch * GDN_C + tid;
    gg[tid] = gi.y * __expf(gi.x);
    rr[tid] = gc.y * gi.y * __expf(gc.x - gi.x);
    bb[tid] = tid < valid ? gdn_ld(a.beta, b * a.beta_s[0] + t * a.beta_s[1] + h * a.beta_s[2], a.beta_dt) : 0.0f;
    if (ls) {
      ls[tid] = gi.x;
      sg[tid] = gi.y;
    }
  }
}

// dq += a·xq and dk = b·xo + (c·xi + dk) over a thread's 32 columns of float32 rows (runs of
// four from c0, 16 apart).
__device__ __forceinline__ void gdn_qk_update(float (&dq)[32], float (&dk)[32], int c0, float a, const float* xq,
                                              float b, const float* xo, float c, const float* xi) {
#pragma unroll
  for (int m = 0; m < 8; ++m) {
    const int col = c0 + 16 * m;
    const float4 q4 = gdn_f4(xq + col), o4 = gdn_f4(xo + col), i4 = gdn_f4(xi + col);
    const float qv[4] = {q4.x, q4.y, q4.z, q4.w}, ov[4] = {o4.x, o4.y, o4.z, o4.w}, iv[4] = {i4.x, i4.y, i4.z, i4.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      dq[4 * m + e] = fmaf(a, qv[e], dq[4 * m + e]);
      dk[4 * m + e] = fmaf(b, ov[e], fmaf(c, iv[e], dk[4 * m + e]));
    }
  }
}

#define GDN_BWD_SCAN_SMEM \
  ((2 * GDN_C * GDN_FLD + 2 * GDN_C * GDN_SLD + 4 * GDN_C * GDN_TLD + GDN_BR * GDN_FLD + 3 * GDN_C) * 4)

// dS rows [16·blockIdx.x, +16) of one (batch, value head) (blockIdx.y) from the last chunk to the
// first, 256 threads: writes each chunk's dS_C to d.dsc and the first state's to d.dstate.
template <typename T>
__device__ __forceinline__ void gated_delta_bwd_scan(const GdnArgs& a, const GdnChunk& c, const GdnGrad& d) {
  extern __shared__ __align__(16) unsigned char gdn_smem[];
  float* ks = reinterpret_cast<float*>(gdn_smem);
  float* qs = ks + GDN_C * GDN_FLD;
  float* ps = qs + GDN_C * GDN_FLD;
  float* xs = ps + GDN_C * GDN_SLD;
  float* dy = xs + GDN_C * GDN_SLD;  // dY
  float* dd = dy + GDN_C * GDN_TLD;  // dΔ
  float* gy = dd + GDN_C * GDN_TLD;  // Γ⊙dY
  float* gr = gy + GDN_C * GDN_TLD;  // Γ⊙dR
  float* ds = gr + GDN_C * GDN_TLD;  // [16][GDN_FLD] dS
  float* gg = ds + GDN_BR * GDN_FLD;
  float* rr = gg + GDN_C;
  float* bb = rr + GDN_C;
  const int tid = threadIdx.x, bh = blockIdx.y, v0 = GDN_BR * blockIdx.x;
  const i64 b = bh / a.Hv, h = bh % a.Hv, hk = h / (a.Hv / a.Hk), nt = c.nt;
  for (int e = tid; e < GDN_BR * 128; e += 256) {
    const int r = e >> 7, col = e & 127;
    ds[r * GDN_FLD + col] = gdn_ld(d.ds, ((i64)bh * a.Dv + v0 + r) * 128 + col, a.out_dt);
  }
  // Thread (i, v) of the [64][16] tiles: step i, columns vi + 4n; thread (vr, c) of dS: row vr,
  // columns 4vc .. 4vc + 4 and 64 on.
  const int i = tid >> 2, vi = tid & 3, vr = tid >> 4, vc = tid & 15;
  for (i64 ch = nt - 1; ch >= 0; --ch) {
    const i64 t0 = ch * GDN_C;
    const int valid = (int)min((i64)GDN_C, a.T - t0);
    __syncthreads();
    float* dsc = d.dsc + ((bh * nt + ch) * a.Dv + v0) * 128;
    for (int e = tid; e < GDN_BR * 128; e += 256) dsc[e] = ds[(e >> 7) * GDN_FLD + (e & 127)];
    gdn_stage_f32<T>(ks, static_cast<const T*>(a.k) + b * a.k_s[0] + t0 * a.k_s[1] + hk * a.k_s[2], a.k_s[1], valid, tid);
    gdn_stage_f32<T>(qs, static_cast<const T*>(a.q) + b * a.q_s[0] + t0 * a.q_s[1] + hk * a.q_s[2], a.q_s[1], valid, tid);
    const i64 sq = (bh * nt + ch) * GDN_C * GDN_C;
    gdn_stage_square(ps, c.pf + sq, true, tid);
    gdn_stage_square(xs, c.xf + sq, false, tid);
    const T* dysrc = static_cast<const T*>(d.dy) + b * d.dy_s[0] + t0 * d.dy_s[1] + h * d.dy_s[2] + v0;
    gdn_stage_tile<T>(dy, dysrc, d.dy_s[1], valid, tid);
    gdn_stage_gates(a, c, bh, (int)ch, valid, gg, rr, bb, nullptr, nullptr, tid);
    __syncthreads();
    // dΔ = Pᵀ dY + diag(r) K dSᵀ.
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      const int v = vi + 4 * n;
      float x = 0.0f, y = 0.0f;
      for (int j = i; j < GDN_C; ++j) x = fmaf(ps[j * GDN_SLD + i], dy[j * GDN_TLD + v], x);
#pragma unroll 8
      for (int col = 0; col < 128; col += 4) y = gdn_dot4(gdn_f4(ks + i * GDN_FLD + col), gdn_f4(ds + v * GDN_FLD + col), y);
      dd[i * GDN_TLD + v] = fmaf(rr[i], y, x);
      gy[i * GDN_TLD + v] = gg[i] * dy[i * GDN_TLD + v];
    }
    __syncthreads();
    // dR = diag(β) Xᵀ dΔ.
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      const int v = vi + 4 * n;
      float x = 0.0f;
      for (int j = i; j < GDN_C; ++j) x = fmaf(xs[j * GDN_SLD + i], dd[j * GDN_TLD + v], x);
      gr[i * GDN_TLD + v] = gg[i] * bb[i] * x;
    }
    __syncthreads();
    // dS = Γ_C dS + dYᵀ diag(Γ) Q − dRᵀ diag(Γ) K.
    const float gc = gg[GDN_C - 1];
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      const int col = 4 * vc + 64 * n;
      float4 x = gdn_f4(ds + vr * GDN_FLD + col);
      x = make_float4(gc * x.x, gc * x.y, gc * x.z, gc * x.w);
#pragma unroll 8
      for (int j = 0; j < GDN_C; ++j) {
        const float y = gy[j * GDN_TLD + vr], r = -gr[j * GDN_TLD + vr];
        const float4 q4 = gdn_f4(qs + j * GDN_FLD + col), k4 = gdn_f4(ks + j * GDN_FLD + col);
        x.x = fmaf(r, k4.x, fmaf(y, q4.x, x.x));
        x.y = fmaf(r, k4.y, fmaf(y, q4.y, x.y));
        x.z = fmaf(r, k4.z, fmaf(y, q4.z, x.z));
        x.w = fmaf(r, k4.w, fmaf(y, q4.w, x.w));
      }
      *reinterpret_cast<float4*>(ds + vr * GDN_FLD + col) = x;
    }
  }
  __syncthreads();
  for (int e = tid; e < GDN_BR * 128; e += 256) {
    const int r = e >> 7, col = e & 127;
    gdn_st(d.dstate, ((i64)bh * a.Dv + v0 + r) * 128 + col, a.state_dt, ds[r * GDN_FLD + col]);
  }
}

// Shared memory of gated_delta_bwd_chunk in floats: k, q; X, P; seven per-step vectors; then a
// region holding either a value tile's S₀ and dS_C rows and nine [64][16] tiles, or five
// [64][64] squares once the tiles are done.
#define GDN_BWD_TILES (2 * GDN_BR * GDN_FLD + 9 * GDN_C * GDN_TLD)
#define GDN_BWD_SQUARES (5 * GDN_C * GDN_SLD)
#define GDN_BWD_REGION (GDN_BWD_TILES > GDN_BWD_SQUARES ? GDN_BWD_TILES : GDN_BWD_SQUARES)
#define GDN_BWD_CHUNK_SMEM ((2 * GDN_C * GDN_FLD + 2 * GDN_C * GDN_SLD + 7 * GDN_C + GDN_BWD_REGION) * 4)

// One chunk (blockIdx.x) of one (batch, value head) (blockIdx.y), 256 threads: dv, dg and dβ,
// and q's and k's cotangents for this value head (d.dqv, d.dkv).
template <typename T>
__device__ __forceinline__ void gated_delta_bwd_chunk(const GdnArgs& a, const GdnChunk& c, const GdnGrad& d) {
  extern __shared__ __align__(16) unsigned char gdn_smem[];
  float* ks = reinterpret_cast<float*>(gdn_smem);
  float* qs = ks + GDN_C * GDN_FLD;
  float* xs = qs + GDN_C * GDN_FLD;
  float* ps = xs + GDN_C * GDN_SLD;
  float* gg = ps + GDN_C * GDN_SLD;  // Γ
  float* rr = gg + GDN_C;            // Γ_C/Γ
  float* bb = rr + GDN_C;            // β
  float* ls = bb + GDN_C;            // log|Γ|
  float* sg = ls + GDN_C;            // sign of Γ
  float* dl = sg + GDN_C;            // the cotangent of log|Γ|
  float* db = dl + GDN_C;            // β's cotangent
  float* region = db + GDN_C;
  // The value tiles.
  float* s0t = region;                // [16][GDN_FLD] S₀ rows
  float* dst = s0t + GDN_BR * GDN_FLD;  // dS_C rows
  float* vt = dst + GDN_BR * GDN_FLD;   // [64][GDN_TLD] each: V, dY, R, Δ, dΔ, dR
  float* yt = vt + GDN_C * GDN_TLD;
  float* rt = yt + GDN_C * GDN_TLD;
  float* et = rt + GDN_C * GDN_TLD;
  float* ft = et + GDN_C * GDN_TLD;
  float* gt = ft + GDN_C * GDN_TLD;
  // The squares, once the tiles are done: dP (then F), dM, Xᵀ dX, dA, K Kᵀ (then E).
  float* sp = region;
  float* sm = sp + GDN_C * GDN_SLD;
  float* sy = sm + GDN_C * GDN_SLD;
  float* sa = sy + GDN_C * GDN_SLD;
  float* sk = sa + GDN_C * GDN_SLD;
  const int tid = threadIdx.x, ch = blockIdx.x, bh = blockIdx.y;
  const i64 b = bh / a.Hv, h = bh % a.Hv, hk = h / (a.Hv / a.Hk), nt = c.nt, t0 = (i64)ch * GDN_C;
  const int valid = (int)min((i64)GDN_C, a.T - t0);
  gdn_stage_f32<T>(ks, static_cast<const T*>(a.k) + b * a.k_s[0] + t0 * a.k_s[1] + hk * a.k_s[2], a.k_s[1], valid, tid);
  gdn_stage_f32<T>(qs, static_cast<const T*>(a.q) + b * a.q_s[0] + t0 * a.q_s[1] + hk * a.q_s[2], a.q_s[1], valid, tid);
  const i64 sq = ((i64)bh * nt + ch) * GDN_C * GDN_C;
  gdn_stage_square(xs, c.xf + sq, false, tid);
  gdn_stage_square(ps, c.pf + sq, true, tid);
  gdn_stage_gates(a, c, bh, ch, valid, gg, rr, bb, ls, sg, tid);
  if (tid < GDN_C) {
    dl[tid] = 0.0f;
    db[tid] = 0.0f;
  }
  // Thread (i, j) of the squares: row i, columns j0 + 4m; of [64][128] (dq, dk): row i, columns
  // 4j0 + 16m' .. + 4 (m' < 8).
  const int i = tid >> 2, j0 = tid & 3, c0 = 4 * j0;
  float dp[16] = {}, dm[16] = {}, dq[32] = {}, dk[32] = {};
  float dli = 0.0f, dlc = 0.0f, ss = 0.0f;
  const float* s0 = c.s0 + ((i64)bh * nt + ch) * a.Dv * 128;
  const float* dsc = d.dsc + ((i64)bh * nt + ch) * a.Dv * 128;
  for (int v0 = 0; v0 < 128; v0 += GDN_BR) {
    __syncthreads();
    for (int e = tid; e < GDN_BR * 32; e += 256) {
      const int r = e >> 5, col = (e & 31) * 4;
      const float4 x = *reinterpret_cast<const float4*>(s0 + (v0 + r) * 128 + col);
      const float4 y = *reinterpret_cast<const float4*>(dsc + (v0 + r) * 128 + col);
      *reinterpret_cast<float4*>(s0t + r * GDN_FLD + col) = x;
      *reinterpret_cast<float4*>(dst + r * GDN_FLD + col) = y;
      ss = fmaf(x.x, y.x, fmaf(x.y, y.y, fmaf(x.z, y.z, fmaf(x.w, y.w, ss))));
    }
    const i64 vstep = a.v_s[1], ystep = d.dy_s[1];
    gdn_stage_tile<T>(vt, static_cast<const T*>(a.v) + b * a.v_s[0] + t0 * vstep + h * a.v_s[2] + v0, vstep, valid, tid);
    gdn_stage_tile<T>(yt, static_cast<const T*>(d.dy) + b * d.dy_s[0] + t0 * ystep + h * d.dy_s[2] + v0, ystep, valid,
                      tid);
    __syncthreads();
    // K S₀ᵀ, Q S₀ᵀ and K dS_Cᵀ at (i, v), then R.
    float kS[4] = {}, qS[4] = {}, kD[4] = {};
#pragma unroll 4
    for (int col = 0; col < 128; col += 4) {
      const float4 k4 = gdn_f4(ks + i * GDN_FLD + col), q4 = gdn_f4(qs + i * GDN_FLD + col);
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        const int v = j0 + 4 * n;
        const float4 s4 = gdn_f4(s0t + v * GDN_FLD + col);
        kS[n] = gdn_dot4(k4, s4, kS[n]);
        qS[n] = gdn_dot4(q4, s4, qS[n]);
        kD[n] = gdn_dot4(k4, gdn_f4(dst + v * GDN_FLD + col), kD[n]);
      }
    }
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      const int v = j0 + 4 * n;
      rt[i * GDN_TLD + v] = fmaf(-gg[i], kS[n], vt[i * GDN_TLD + v]);
    }
    __syncthreads();
    // Δ = X diag(β) R, dΔ = Pᵀ dY + diag(r) K dS_Cᵀ.
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      const int v = j0 + 4 * n;
      float x = 0.0f, y = 0.0f;
      for (int j = 0; j <= i; ++j) x = fmaf(xs[i * GDN_SLD + j] * bb[j], rt[j * GDN_TLD + v], x);
      for (int j = i; j < GDN_C; ++j) y = fmaf(ps[j * GDN_SLD + i], yt[j * GDN_TLD + v], y);
      y = fmaf(rr[i], kD[n], y);
      et[i * GDN_TLD + v] = x;
      ft[i * GDN_TLD + v] = y;
      const float rd = rr[i] * x * kD[n];
      dli = fmaf(gg[i], yt[i * GDN_TLD + v] * qS[n], dli - rd);
      dlc += rd;
    }
    __syncthreads();
    // dR = dV = diag(β) Xᵀ dΔ.
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      const int v = j0 + 4 * n;
      float x = 0.0f;
      for (int j = i; j < GDN_C; ++j) x = fmaf(xs[j * GDN_SLD + i], ft[j * GDN_TLD + v], x);
      x *= bb[i];
      gt[i * GDN_TLD + v] = x;
      dli = fmaf(-gg[i], x * kS[n], dli);
      if (i < valid) {
        static_cast<T*>(d.dv)[((b * a.T + t0 + i) * a.Hv + h) * a.Dv + v0 + v] = narrow<T>(x);
      }
    }
    __syncthreads();
    // dP += dY Δᵀ, dM += dΔ Rᵀ; dQ += diag(Γ) dY S₀, dK += diag(r) Δ dS_C − diag(Γ) dR S₀.
#pragma unroll
    for (int v = 0; v < GDN_BR; ++v) {
      const float y = yt[i * GDN_TLD + v], f = ft[i * GDN_TLD + v];
      const float gy = gg[i] * y, re = rr[i] * et[i * GDN_TLD + v], gd = -gg[i] * gt[i * GDN_TLD + v];
#pragma unroll
      for (int m = 0; m < 16; ++m) {
        const int j = j0 + 4 * m;
        dp[m] = fmaf(y, et[j * GDN_TLD + v], dp[m]);
        dm[m] = fmaf(f, rt[j * GDN_TLD + v], dm[m]);
      }
      const float* s0v = s0t + v * GDN_FLD;
      gdn_qk_update(dq, dk, c0, gy, s0v, gd, s0v, re, dst + v * GDN_FLD);
    }
  }
  __syncthreads();
  // The squares: dP and dM (lower triangles), K Kᵀ.
#pragma unroll
  for (int m = 0; m < 16; ++m) {
    const int j = j0 + 4 * m;
    sp[i * GDN_SLD + j] = j <= i ? dp[m] : 0.0f;
    sm[i * GDN_SLD + j] = j <= i ? dm[m] : 0.0f;
    float x = 0.0f;
#pragma unroll 8
    for (int col = 0; col < 128; col += 4) x = gdn_dot4(gdn_f4(ks + i * GDN_FLD + col), gdn_f4(ks + j * GDN_FLD + col), x);
    sk[i * GDN_SLD + j] = x;
  }
  __syncthreads();
  // Xᵀ dX with dX = dM diag(β): rows i, columns j ≤ ... (X is lower triangular).
#pragma unroll
  for (int m = 0; m < 16; ++m) {
    const int j = j0 + 4 * m;
    float x = 0.0f;
    for (int r = max(i, j); r < GDN_C; ++r) x = fmaf(xs[r * GDN_SLD + i], sm[r * GDN_SLD + j], x);
    sy[i * GDN_SLD + j] = x * bb[j];
  }
  __syncthreads();
  // dA = −(Xᵀ dX) Xᵀ below the diagonal; then E, F and the gates' and β's cotangents.
  float rowl = 0.0f, rowb = 0.0f;
#pragma unroll
  for (int m = 0; m < 16; ++m) {
    const int j = j0 + 4 * m;
    float e = 0.0f, f = 0.0f;
    if (j <= i) {
      const float g = sg[i] * sg[j] * __expf(ls[i] - ls[j]);
      const float dpv = sp[i * GDN_SLD + j];
      f = dpv * g;
      float col = dpv * ps[i * GDN_SLD + j];
      atomicAdd(&db[j], sm[i * GDN_SLD + j] * xs[i * GDN_SLD + j]);
      if (j < i) {
        float da = 0.0f;
        for (int r = 0; r <= j; ++r) da = fmaf(sy[i * GDN_SLD + r], xs[j * GDN_SLD + r], da);
        da = -da;
        const float kkg = sk[i * GDN_SLD + j] * g;
        e = da * bb[i] * g;
        rowb = fmaf(da, kkg, rowb);
        col = fmaf(da, bb[i] * kkg, col);
      }
      rowl += col;
      atomicAdd(&dl[j], -col);
    }
    sa[i * GDN_SLD + j] = e;
    sp[i * GDN_SLD + j] = f;
  }
  rowl += __shfl_xor_sync(0xffffffffu, rowl, 1);
  rowl += __shfl_xor_sync(0xffffffffu, rowl, 2);
  rowb += __shfl_xor_sync(0xffffffffu, rowb, 1);
  rowb += __shfl_xor_sync(0xffffffffu, rowb, 2);
  dli += __shfl_xor_sync(0xffffffffu, dli, 1);
  dli += __shfl_xor_sync(0xffffffffu, dli, 2);
  if (j0 == 0) {
    atomicAdd(&dl[i], rowl + dli);
    atomicAdd(&db[i], rowb);
  }
  // ℓ_C: Γ_C <dS_C, S₀> + Σ r_i δ_i·(dS_C k_i).
  float lc = dlc + gg[GDN_C - 1] * ss;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) lc += __shfl_xor_sync(0xffffffffu, lc, o);
  if ((tid & 31) == 0) atomicAdd(&dl[GDN_C - 1], lc);
  __syncthreads();
  // dQ += F K; dK += Fᵀ Q + E K + Eᵀ K.
  for (int j = 0; j < GDN_C; ++j) {
    const float f = sp[i * GDN_SLD + j], ft2 = sp[j * GDN_SLD + i];
    const float e = sa[i * GDN_SLD + j] + sa[j * GDN_SLD + i];
    const float* kj = ks + j * GDN_FLD;
    gdn_qk_update(dq, dk, c0, f, kj, ft2, qs + j * GDN_FLD, e, kj);
  }
  if (i < valid) {
    const i64 o = ((b * a.T + t0 + i) * a.Hv + h) * 128;
#pragma unroll
    for (int m = 0; m < 8; ++m) {
      const int col = c0 + 16 * m;
      *reinterpret_cast<float4*>(d.dqv + o + col) = make_float4(dq[4 * m], dq[4 * m + 1], dq[4 * m + 2], dq[4 * m + 3]);
      *reinterpret_cast<float4*>(d.dkv + o + col) = make_float4(dk[4 * m], dk[4 * m + 1], dk[4 * m + 2], dk[4 * m + 3]);
    }
  }
  __syncthreads();
  // The log gates' cotangents are dℓ's sums from each step to the chunk's end; the gate's, over it.
  if (tid < valid) {
    float x = 0.0f;
    for (int r = tid; r < GDN_C; ++r) x += dl[r];
    const i64 t = t0 + tid;
    const float g = gdn_ld(a.g, b * a.g_s[0] + t * a.g_s[1] + h * a.g_s[2], a.g_dt);
    gdn_st(d.dg, (b * a.T + t) * a.Hv + h, a.g_dt, x / g);
    gdn_st(d.dbeta, (b * a.T + t) * a.Hv + h, a.beta_dt, db[tid]);
  }
}

// q's and k's cotangents: the value heads' sums per key head, rounded to T (one element per
// thread of [B, T, Hk, 128]).
template <typename T> __device__ __forceinline__ void gated_delta_bwd_heads(const GdnArgs& a, const GdnGrad& d) {
  const i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= a.B * a.T * a.Hk * 128) return;
  const i64 col = e & 127, hk = (e >> 7) % a.Hk, bt = (e >> 7) / a.Hk, groups = a.Hv / a.Hk;
  float x = 0.0f, y = 0.0f;
  for (i64 j = 0; j < groups; ++j) {
    const i64 o = (bt * a.Hv + hk * groups + j) * 128 + col;
    x += d.dqv[o];
    y += d.dkv[o];
  }
  static_cast<T*>(d.dq)[e] = narrow<T>(x);
  static_cast<T*>(d.dk)[e] = narrow<T>(y);
}
