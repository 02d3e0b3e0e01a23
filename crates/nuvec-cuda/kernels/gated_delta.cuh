// Gated DeltaNet's recurrence (fast::gated_delta; launched by fast/gated_delta.rs). Per batch row
// and value head a [Dv, Dk] float32 state S; per step S = g·S, δ = β(v − S k), S = S + δ kᵀ,
// y = S q. The whole loop over the T steps runs inside the kernel (decode and prefill alike),
// each state row in registers from the first step to the last.
//
// Two kernels, bit-identical where both apply:
// * gated_delta_rows<T, N, AHEAD>: one warp per value row dv, lane l holding
//   S[dv, N·l .. N·l + N), Dk = 32·N; any gate, mask, storage and state dtype.
// * gated_delta_packed<T>: Dk = 128, 8 rows per warp, 4 lanes per row, 32 elements per lane;
//   a float32 gate per head, a float32 state, no mask. Two shuffles per dot product instead of
//   five, and 4 KiB of state in flight per warp instead of 512 bytes (decode is a pass over the
//   state).
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
