// RoPE over rows of `len` features, rows laid out [B, M, T] (rows = B·M·T, usually M heads):
// the M rows of one batch b and position t share their rotation, so a thread computes the sines
// and cosines of a chunk of W features once and rotates that chunk in `heads` of those rows,
// keeping 4 rows' loads in flight. (One thread per pair, with 2-byte accesses, sincosf and
// 64-bit index divisions per pair, reached 27–30% of copy on the H200.) Positions are (offset[b] + t)·scale (offset[0] for a scalar
// offset), inverse frequencies from log2(base) or 1/freqs; `sign` −1 is the inverse rotation.
// Features from `dims` on are copied.
//
// Chunks: not traditional, feature i of the first half pairs with i + dims/2, and a chunk is W
// consecutive i (two loads, one in each half); traditional, pairs are adjacent and a chunk is
// W consecutive features (W/2 pairs, one load). With VEC a chunk is one 16-byte vector
// (W = 16 / sizeof(T); fast_rows.rs checks alignment and divisibility); otherwise W is 1 (2
// when traditional) and accesses are per element.
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

// Threads: x over the chunks of a row, y (with blockIdx.x) over the B·T positions, blockIdx.y over
// groups of `heads` of the M rows sharing a position.
template <typename T, int W, bool VEC, int U = 4>
__device__ __forceinline__ void rope_rows(const T* __restrict__ x, T* __restrict__ out, const i32* __restrict__ offset,
                                          int offset_per_batch, const float* __restrict__ freqs, float log2_base,
                                          float scale, float sign, int traditional, u64 len, u64 dims, u64 seq,
                                          u64 per_batch, u64 positions, u64 m_count, u64 heads) {
  typedef typename Acc<T>::type A;
  u64 half = dims / 2;
  u64 rot_chunks = (traditional ? dims : half) / W;
  u64 chunks = rot_chunks + (len - dims + W - 1) / W;
  u64 m0 = (u64)blockIdx.y * heads, m1 = m0 + heads < m_count ? m0 + heads : m_count;
  for (u64 p = (u64)blockIdx.x * blockDim.y + threadIdx.y; p < positions; p += (u64)gridDim.x * blockDim.y) {
    u64 b = p / seq, t = p - b * seq;
    u64 row0 = b * m_count * seq + t;  // the first head's row
    for (u64 c = threadIdx.x; c < chunks; c += blockDim.x) {
      if (c >= rot_chunks) {
        u64 e = dims + (c - rot_chunks) * W, avail = len - e;
        for (u64 m = m0; m < m1; ++m) {
          u64 r = (row0 + m * seq) * len + e;
          Vec<T, W> v;
          rope_ld<T, W, VEC>(x + r, v, avail);
          rope_st<T, W, VEC>(out + r, v, avail);
        }
        continue;
      }
      // The chunk's pairs: W of them (W / 2 when traditional), frequency indices from i0. Their
      // sines are computed after the first rows' loads are issued.
      u64 i0 = traditional ? c * W / 2 : c * W;
      int pairs = traditional ? W / 2 : W;
      float cs[W], sn[W];
      bool have = false;
      auto sines = [&] {
        i32 off = offset[offset_per_batch ? row0 / per_batch : 0];
        float pos = ((float)off + (float)t) * scale;
#pragma unroll
        for (int q = 0; q < W; ++q) {
          if (q >= pairs) break;
          u64 i = i0 + q;
          float inv = freqs ? 1.0f / freqs[i] : exp2f(-(float)i * (log2_base / (float)half));
          rope_sincos(pos * inv, &sn[q], &cs[q]);
          sn[q] *= sign;
        }
        have = true;
      };
      u64 ea = traditional ? c * W : i0, eb = ea + half;
      for (u64 m = m0; m < m1; m += U) {
        Vec<T, W> va[U], vb[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if (m + u < m1) {
            const T* r = x + (row0 + (m + u) * seq) * len;
            rope_ld<T, W, VEC>(r + ea, va[u], W);
            if (!traditional) rope_ld<T, W, VEC>(r + eb, vb[u], W);
          }
        }
        if (!have) sines();
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if (m + u >= m1) continue;
          T* r = out + (row0 + (m + u) * seq) * len;
          if (traditional) {
#pragma unroll
            for (int q = 0; q < W / 2; ++q) {
              A x1 = widen(va[u].v[2 * q]), x2 = widen(va[u].v[2 * q + 1]);
              va[u].v[2 * q] = narrow<T>(x1 * cs[q] - x2 * sn[q]);
              va[u].v[2 * q + 1] = narrow<T>(x1 * sn[q] + x2 * cs[q]);
            }
            rope_st<T, W, VEC>(r + ea, va[u], W);
          } else {
#pragma unroll
            for (int q = 0; q < W; ++q) {
              A x1 = widen(va[u].v[q]), x2 = widen(vb[u].v[q]);
              va[u].v[q] = narrow<T>(x1 * cs[q] - x2 * sn[q]);
              vb[u].v[q] = narrow<T>(x1 * sn[q] + x2 * cs[q]);
            }
            rope_st<T, W, VEC>(r + ea, va[u], W);
            rope_st<T, W, VEC>(r + eb, vb[u], W);
          }
        }
      }
    }
  }
}
