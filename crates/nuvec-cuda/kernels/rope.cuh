// RoPE over rows of `len` features ([rows = B·…·T, len]); positions (offset[b] + t)·scale with
// b = row / per_batch (offset[0] for a scalar offset) and t = row % seq, inverse frequencies
// from log2(base) or 1/freqs; `sign` −1 is the inverse rotation. Features from `dims` on are
// copied.
//
// Chunks: not traditional, feature i of the first half pairs with i + dims/2, and a chunk is W
// consecutive i (two loads, one in each half); traditional, pairs are adjacent and a chunk is
// W consecutive features (W/2 pairs, one load). With VEC a chunk is one 16-byte vector
// (W = 16 / sizeof(T); fast/rope.rs checks alignment and divisibility); otherwise W is 1 (2
// when traditional) and accesses are per element.
//
// Threads: x over a row's chunks, y (with the grid) over rows in memory order, so the device
// streams consecutive rows. Each thread computes its chunk's sines: the range-reduced hardware
// sincos is cheap enough that sharing sines among the rows (heads) of one position, or a
// precomputed table, measured slower (see bench/results/).
#pragma once
#include "norm.cuh"

template <typename T, int W, bool VEC>
__device__ __forceinline__ void rope_ld(const T* __restrict__ p, Vec<T, W>& o, u64 avail) {
  if constexpr (VEC) {
    o = *reinterpret_cast<const Vec<T, W>*>(p);
  } else {
#pragma unroll
    for (int j = 0; j < W; ++j)
      if ((u64)j < avail) o.v[j] = p[j];
  }
}

template <typename T, int W, bool VEC>
__device__ __forceinline__ void rope_st(T* __restrict__ p, const Vec<T, W>& o, u64 avail) {
  if constexpr (VEC) {
    *reinterpret_cast<Vec<T, W>*>(p) = o;
  } else {
#pragma unroll
    for (int j = 0; j < W; ++j)
      if ((u64)j < avail) p[j] = o.v[j];
  }
}

// sin and cos of a float32 angle: reduced by 2π in two parts (k·C1 exact through the FMA, C2 the
// rest of 2π), then the hardware approximations, accurate to ~4e-7 on [−π, π] — well inside the
// error of the float32 angle itself (~|angle|·6e-8), where sincosf's slow path for large angles
// made the kernel compute-bound.
__device__ __forceinline__ void rope_sincos(float a, float* s, float* c) {
  float k = rintf(a * 0.159154943091895336f);
  float r = fmaf(k, -6.28318548202514648f, a);
  r = fmaf(k, 1.74845553146951720e-7f, r);
  __sincosf(r, s, c);
}

// TRAD: traditional pairs; FREQS: inverse frequencies 1/freqs[i] (else from log2_base). Both
// fixed at compile time, like R32 below: as run-time arguments they slow the kernel down
// (bench/cuda/tune_launch.cu `rope`; see bench/results/).
// One row's chunks from threadIdx.x on: pairs rotated at the position pos() (called after the
// chunk's loads are issued: computed before them, it delays them), features from dims on copied
// from p to q.
template <typename T, int W, bool VEC, bool TRAD, bool FREQS, typename Pos>
__device__ __forceinline__ void rope_row(const T* __restrict__ p, T* __restrict__ q, const float* __restrict__ freqs,
                                         float step, float sign, u64 len, u64 dims, Pos pos_of) {
  typedef typename Acc<T>::type A;
  u64 half = dims / 2;
  u64 rot_chunks = (TRAD ? dims : half) / W;
  u64 chunks = rot_chunks + (len - dims + W - 1) / W;
  for (u64 c = threadIdx.x; c < chunks; c += blockDim.x) {
    if (c >= rot_chunks) {
      u64 e = dims + (c - rot_chunks) * W, avail = len - e;
      Vec<T, W> v;
      rope_ld<T, W, VEC>(p + e, v, avail);
      rope_st<T, W, VEC>(q + e, v, avail);
      continue;
    }
    // The chunk's pairs: W of them (W / 2 when traditional), frequency indices from i0.
    u64 i0 = TRAD ? c * W / 2 : c * W;
    u64 ea = TRAD ? c * W : i0, eb = ea + half;
    Vec<T, W> va, vb;
    rope_ld<T, W, VEC>(p + ea, va, W);
    if constexpr (!TRAD) rope_ld<T, W, VEC>(p + eb, vb, W);
    float pos = pos_of();
    if constexpr (TRAD) {
#pragma unroll
      for (int k = 0; k < W / 2; ++k) {
        float inv = FREQS ? 1.0f / freqs[i0 + k] : exp2f(-(float)(i0 + k) * step), sn, cs;
        rope_sincos(pos * inv, &sn, &cs);
        sn *= sign;
        A x1 = widen(va.v[2 * k]), x2 = widen(va.v[2 * k + 1]);
        va.v[2 * k] = narrow<T>(x1 * cs - x2 * sn);
        va.v[2 * k + 1] = narrow<T>(x1 * sn + x2 * cs);
      }
      rope_st<T, W, VEC>(q + ea, va, W);
    } else {
#pragma unroll
      for (int k = 0; k < W; ++k) {
        float inv = FREQS ? 1.0f / freqs[i0 + k] : exp2f(-(float)(i0 + k) * step), sn, cs;
        rope_sincos(pos * inv, &sn, &cs);
        sn *= sign;
        A x1 = widen(va.v[k]), x2 = widen(vb.v[k]);
        va.v[k] = narrow<T>(x1 * cs - x2 * sn);
        vb.v[k] = narrow<T>(x1 * sn + x2 * cs);
      }
      rope_st<T, W, VEC>(q + ea, va, W);
      rope_st<T, W, VEC>(q + eb, vb, W);
    }
  }
}

template <typename T, int W, bool VEC, bool R32, bool TRAD, bool FREQS>
__device__ __forceinline__ void rope_rows(const T* __restrict__ x, T* __restrict__ out, const i32* __restrict__ offset,
                                          int offset_per_batch, const float* __restrict__ freqs, float log2_base,
                                          float scale, float sign, u64 rows, u64 len, u64 dims, u64 seq,
                                          u64 per_batch) {
  float step = log2_base / (float)(dims / 2);
  for (u64 row = (u64)blockIdx.x * blockDim.y + threadIdx.y; row < rows; row += (u64)gridDim.x * blockDim.y) {
    // The row's position. R32: rows < 2^32, in 32-bit arithmetic (a 64-bit division by a
    // run-time divisor is a long routine; both forms in one kernel behind a branch are slower
    // too; see bench/results/).
    auto pos = [&]() {
      u64 t, b = 0;
      if constexpr (R32) {
        t = (u32)row % (u32)seq;
        if (offset_per_batch) b = (u32)row / (u32)per_batch;
      } else {
        t = row % seq;
        if (offset_per_batch) b = row / per_batch;
      }
      return ((float)offset[b] + (float)t) * scale;
    };
    rope_row<T, W, VEC, TRAD, FREQS>(x + row * len, out + row * len, freqs, step, sign, len, dims, pos);
  }
}

// A decoding step's RoPE and cache writes (fast::rope_kv_write): qkv [B, L, HQ + 2·HKV, D]
// row-major, one row per head and position; query rows rotate into q [B, HQ, L, D], key rows
// rotate into k_cache [B, HKV, S, D] at position start[b] + l, value rows copy into v_cache
// there. With `dst` (fast::rope_kv_write_rows, a paged pool), head h of position l of row b goes
// to row dst[b, l, h] of the pools seen as [cap, D] instead. Rows whose destination falls
// outside are dropped. Threads as in rope_rows.
template <typename T, int W, bool VEC, bool TRAD, bool FREQS>
__device__ __forceinline__ void rope_kv_write(const T* __restrict__ qkv, T* __restrict__ q, T* __restrict__ kc,
                                              T* __restrict__ vc, const i32* __restrict__ start,
                                              const i32* __restrict__ dst, const float* __restrict__ freqs,
                                              float log2_base, float scale, u32 rows, u32 seq, u32 hq, u32 hkv, u32 d,
                                              u32 dims, u32 cap) {
  float step = log2_base / (float)(dims / 2);
  const u32 heads = hq + 2 * hkv;
  for (u32 row = blockIdx.x * blockDim.y + threadIdx.y; row < rows; row += gridDim.x * blockDim.y) {
    u32 h = row % heads, bl = row / heads, l = bl % seq, b = bl / seq;
    i64 at = (i64)start[b] + l;
    const T* p = qkv + (u64)row * d;
    auto pos = [&]() { return (float)at * scale; };
    if (h < hq) {
      rope_row<T, W, VEC, TRAD, FREQS>(p, q + ((u64)(b * hq + h) * seq + l) * d, freqs, step, 1.0f, d, dims, pos);
      continue;
    }
    // The key or value head, and the cache row it goes to.
    u32 kvh = (h - hq) % hkv;
    i64 to = dst ? (i64)dst[(u64)bl * hkv + kvh] : ((i64)b * hkv + kvh) * cap + at;
    bool inside = dst ? (to >= 0 && to < (i64)cap) : (at >= 0 && at < (i64)cap);
    if (!inside) continue;
    if (h < hq + hkv) {
      rope_row<T, W, VEC, TRAD, FREQS>(p, kc + (u64)to * d, freqs, step, 1.0f, d, dims, pos);
    } else {
      // No rotation: every chunk is a copy (dims 0).
      rope_row<T, W, VEC, TRAD, FREQS>(p, vc + (u64)to * d, freqs, step, 1.0f, d, 0, pos);
    }
  }
}
