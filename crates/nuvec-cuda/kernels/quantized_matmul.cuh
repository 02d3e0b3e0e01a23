// Products of a few rows of x with an affine-quantized weight w[N, K] in MLX's layout (each
// row one little-endian bit stream of BITS-bit levels; a scale and a bias per group):
// y[m, n] = Σ_k x[m, k] · (scale · q + bias). Decoding reads the weight once, so the kernel
// lives on the bytes it keeps in flight.
//
// A block of WARPS warps owns R consecutive rows of w; its warps split K. Each lane takes 32
// consecutive levels of a row per step (BITS words, inside one group because groups are 32,
// 64 or 128), so per row and step the group's scale and bias apply once:
// Σ x·(s·q + b) = s·Σ x·q + b·Σ x, with Σ x shared by the R rows. Levels become floats by
// placing them under the exponent of 2^23 (one byte permute and one subtraction, no
// integer-to-float conversion, whose throughput would bound the kernel).
#pragma once
#include "common.cuh"

// A lane's 32 levels: BITS words.
template <int BITS> struct QmvWords {
  u32 w[BITS];
};

template <int BITS> __device__ __forceinline__ QmvWords<BITS> qmv_load(const u32* __restrict__ p) {
  QmvWords<BITS> r;
  if constexpr (BITS % 4 == 0) {
#pragma unroll
    for (int i = 0; i < BITS / 4; ++i) {
      uint4 v = __ldg(reinterpret_cast<const uint4*>(p) + i);
      r.w[4 * i] = v.x;
      r.w[4 * i + 1] = v.y;
      r.w[4 * i + 2] = v.z;
      r.w[4 * i + 3] = v.w;
    }
  } else if constexpr (BITS == 2) {
    uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
    r.w[0] = v.x;
    r.w[1] = v.y;
  } else {
#pragma unroll
    for (int i = 0; i < BITS; ++i) r.w[i] = __ldg(p + i);
  }
  return r;
}

// 2^23 + byte k of v, as a float.
__device__ __forceinline__ float qmv_byte(u32 v, int k) {
  return __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7650u | (u32)k)) - 8388608.0f;
}

// Levels 8·s .. 8·s + 7 of a lane's 32, as floats.
template <int BITS> __device__ __forceinline__ void qmv_levels(const QmvWords<BITS>& q, int s, float (&out)[8]) {
  if constexpr (BITS == 4) {
    u32 v = q.w[s];
    u32 lo = v & 0x0F0F0F0Fu, hi = (v >> 4) & 0x0F0F0F0Fu;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      out[2 * k] = qmv_byte(lo, k);
      out[2 * k + 1] = qmv_byte(hi, k);
    }
  } else if constexpr (BITS == 8) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      out[k] = qmv_byte(q.w[2 * s], k);
      out[4 + k] = qmv_byte(q.w[2 * s + 1], k);
    }
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int bit = (8 * s + j) * BITS, word = bit >> 5, shift = bit & 31;
      u32 v = q.w[word] >> shift;
      if (shift + BITS > 32) v |= q.w[word + 1] << (32 - shift);
      out[j] = __uint_as_float(0x4B000000u | (v & ((1u << BITS) - 1u))) - 8388608.0f;
    }
  }
}

// Eight consecutive elements of x (16-byte aligned) as floats.
template <typename T> __device__ __forceinline__ void qmv_x8(const T* __restrict__ p, float (&out)[8]) {
  if constexpr (sizeof(T) == 4) {
    float4 a = __ldg(reinterpret_cast<const float4*>(p)), b = __ldg(reinterpret_cast<const float4*>(p) + 1);
    out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
    out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
  } else {
    uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
    const T* h = reinterpret_cast<const T*>(&v);
#pragma unroll
    for (int j = 0; j < 8; ++j) out[j] = widen<T>(h[j]);
  }
}

// y[m, n] for m < rows (≤ MT) of x[rows, k]; k a multiple of the group size 2^group_shift.
template <typename T, int BITS, int MT, int R, int WARPS>
__device__ __forceinline__ void qmv_affine(const T* __restrict__ x, const u32* __restrict__ w,
                                           const T* __restrict__ scales, const T* __restrict__ biases,
                                           T* __restrict__ y, int rows, int n, int k, int group_shift) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int row0 = blockIdx.x * R;
  const int chunks = k >> 5, words_per_row = chunks * BITS, groups_per_row = k >> group_shift;
  float acc[R][MT];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m) acc[r][m] = 0.0f;

  // A step's weights, scales and biases. With one or two rows of x the next step's load is
  // issued before this one's arithmetic, so each warp keeps two steps of weight bytes in
  // flight; more rows need the registers for their sums.
  constexpr bool PREFETCH = MT <= 2;
  auto load = [&](int c, QmvWords<BITS>(&q)[R], float(&s)[R], float(&b)[R]) {
    const int g = (c << 5) >> group_shift;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int row = min(row0 + r, n - 1);  // rows past the end repeat the last; never stored
      q[r] = qmv_load<BITS>(w + (u64)row * words_per_row + (u64)c * BITS);
      s[r] = widen<T>(scales[(u64)row * groups_per_row + g]);
      b[r] = widen<T>(biases[(u64)row * groups_per_row + g]);
    }
  };
  QmvWords<BITS> q[R];
  float s[R], b[R];
  int c = warp * 32 + lane;
  if (PREFETCH && c < chunks) load(c, q, s, b);
  for (; c < chunks; c += WARPS * 32) {
    if (!PREFETCH) load(c, q, s, b);
    QmvWords<BITS> nq[R];
    float ns[R], nb[R];
    const bool more = PREFETCH && c + WARPS * 32 < chunks;
    if (more) load(c + WARPS * 32, nq, ns, nb);
    float xs[MT];
#pragma unroll
    for (int m = 0; m < MT; ++m) xs[m] = 0.0f;
#pragma unroll
    for (int sub = 0; sub < 4; ++sub) {
      float xv[MT][8];
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        if (m < rows) {
          qmv_x8<T>(x + (u64)m * k + (c << 5) + sub * 8, xv[m]);
        } else {
#pragma unroll
          for (int j = 0; j < 8; ++j) xv[m][j] = 0.0f;
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) xs[m] += xv[m][j];
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float lv[8];
        qmv_levels<BITS>(q[r], sub, lv);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          float d = 0.0f;
#pragma unroll
          for (int j = 0; j < 8; ++j) d = fmaf(lv[j], xv[m][j], d);
          acc[r][m] = fmaf(s[r], d, acc[r][m]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int m = 0; m < MT; ++m) acc[r][m] = fmaf(b[r], xs[m], acc[r][m]);
    if (more) {
#pragma unroll
      for (int r = 0; r < R; ++r) q[r] = nq[r], s[r] = ns[r], b[r] = nb[r];
    }
  }

  __shared__ float part[WARPS][R * MT];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      float v = acc[r][m];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0) part[warp][r * MT + m] = v;
    }
  __syncthreads();
  const int t = threadIdx.x;
  if (t < R * MT) {
    const int r = t / MT, m = t % MT, row = row0 + r;
    float v = 0.0f;
#pragma unroll
    for (int i = 0; i < WARPS; ++i) v += part[i][t];
    if (row < n && m < rows) y[(u64)m * n + row] = narrow<T>(v);
  }
}
