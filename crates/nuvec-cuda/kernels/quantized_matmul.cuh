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
#include "gather_mm.cuh"

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

// y[m, n] for m < rows (≤ MT) of x[rows, k], weight rows row0 .. row0 + R; k a multiple of the
// group size 2^group_shift.
template <typename T, int BITS, int MT, int R, int WARPS>
__device__ __forceinline__ void qmv_affine(const T* __restrict__ x, const u32* __restrict__ w,
                                           const T* __restrict__ scales, const T* __restrict__ biases,
                                           T* __restrict__ y, int rows, int n, int k, int group_shift, int row0) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
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

// ---- Tensor cores: 4- and 8-bit weights, half-precision x -----------------------------------
//
// mma.sync m16n8k16 with a block's 16 weight rows as A and the ≤ 8 rows of x as B (n = 8):
// tensor cores take the products, so 8 rows of x cost what 1 does. The k order inside a tile
// is free as long as A and B agree, so each thread dequantizes a contiguous 16-byte run of
// its two rows (lane / 4 and lane / 4 + 8), one group, and feeds its own slots of the tile
// with them: 4-bit levels pair as (j, j + 4) of a word (the mask that isolates them places
// both under a half's exponent at once), 8-bit levels as (j, j + 1). Warps split K; each
// issues U steps of weight loads before their arithmetic.

// The packed pair of T, and the bits that make a 4-bit level q under them read as magic + q
// (bf16: 128 + q; f16: 1024 + q), so one mask and one subtraction convert two levels.
template <typename T> struct QmvPair;
template <> struct QmvPair<bf16> {
  typedef __nv_bfloat162 type;
  static constexpr u32 magic = 0x43004300u;
};
template <> struct QmvPair<f16> {
  typedef __half2 type;
  static constexpr u32 magic = 0x64006400u;
};

// Two levels (`bits` holds them at bits 0-3 and 16-19) as scale · q + bias, packed.
template <typename T> __device__ __forceinline__ u32 qmv_tc_pair4(u32 bits, u32 s2, u32 b2) {
  typedef typename QmvPair<T>::type T2;
  const u32 magic = QmvPair<T>::magic, placed = bits | magic;
  const T2 q = __hsub2(*reinterpret_cast<const T2*>(&placed), *reinterpret_cast<const T2*>(&magic));
  T2 v = __hfma2(q, *reinterpret_cast<const T2*>(&s2), *reinterpret_cast<const T2*>(&b2));
  return *reinterpret_cast<u32*>(&v);
}

template <typename T> __device__ __forceinline__ u32 qmv_tc_splat(T v) {
  const u16 h = *reinterpret_cast<const u16*>(&v);
  return (u32)h | ((u32)h << 16);
}

// y[m, n] for m < rows (≤ 8) of x[rows, k]: a block of WARPS warps owns 16 weight rows from row0.
template <typename T, int BITS, int WARPS, int U>
__device__ __forceinline__ void qmv_tc(const T* __restrict__ x, const u32* __restrict__ w,
                                       const T* __restrict__ scales, const T* __restrict__ biases,
                                       T* __restrict__ y, int rows, int n, int k, int group_shift, int row0) {
  constexpr int E = 128 / BITS;  // levels per thread per step: 16 bytes of a row
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int ra = min(row0 + g, n - 1), rb = min(row0 + g + 8, n - 1);
  const int words_per_row = (k >> 5) * BITS, groups_per_row = k >> group_shift;
  const int steps = (k + 4 * E - 1) / (4 * E);
  const bool has_x = g < rows;
  float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  // U steps of this thread's weight runs, scales and biases, from step `base + warp`.
  auto load = [&](int base, uint4(&wa)[U], uint4(&wb)[U], T(&sa)[U], T(&ba)[U], T(&sb)[U], T(&bb)[U]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int k0 = (base + u * WARPS + warp) * 4 * E + t * E;
      if (k0 < k) {  // k is a multiple of 32, so a thread's run is whole or absent
        const int at = (k0 * BITS) >> 5;
        wa[u] = __ldg(reinterpret_cast<const uint4*>(w + (u64)ra * words_per_row + at));
        wb[u] = __ldg(reinterpret_cast<const uint4*>(w + (u64)rb * words_per_row + at));
        const int gi = k0 >> group_shift;
        sa[u] = scales[(u64)ra * groups_per_row + gi], ba[u] = biases[(u64)ra * groups_per_row + gi];
        sb[u] = scales[(u64)rb * groups_per_row + gi], bb[u] = biases[(u64)rb * groups_per_row + gi];
      } else {
        wa[u] = wb[u] = make_uint4(0, 0, 0, 0);
        sa[u] = ba[u] = sb[u] = bb[u] = narrow<T>(0.0f);
      }
    }
  };
  for (int base = 0; base < steps; base += WARPS * U) {
    uint4 wa[U], wb[U];
    T sa[U], ba[U], sb[U], bb[U];
    load(base, wa, wb, sa, ba, sb, bb);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int k0 = (base + u * WARPS + warp) * 4 * E + t * E;
      if (base + u * WARPS >= steps) break;  // no warp of the block has this step
      // x's row g over this thread's run, as E / 2 words of two halves.
      u32 xw[E / 2];
      if (has_x && k0 < k) {
#pragma unroll
        for (int i = 0; i < E / 8; ++i) {
          uint4 v = __ldg(reinterpret_cast<const uint4*>(x + (u64)g * k + k0) + i);
          xw[4 * i] = v.x, xw[4 * i + 1] = v.y, xw[4 * i + 2] = v.z, xw[4 * i + 3] = v.w;
        }
      } else {
#pragma unroll
        for (int i = 0; i < E / 2; ++i) xw[i] = 0u;
      }
      const u32 wva[4] = {wa[u].x, wa[u].y, wa[u].z, wa[u].w}, wvb[4] = {wb[u].x, wb[u].y, wb[u].z, wb[u].w};
      if constexpr (BITS == 4) {
        const u32 s2a = qmv_tc_splat(sa[u]), b2a = qmv_tc_splat(ba[u]);
        const u32 s2b = qmv_tc_splat(sb[u]), b2b = qmv_tc_splat(bb[u]);
        // Word i holds levels 8i..8i+7; pair (i, j) is levels (8i + j, 8i + j + 4).
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          u32 pa[4], pb[4], px[4];
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            pa[j] = qmv_tc_pair4<T>((wva[i] >> (4 * j)) & 0x000F000Fu, s2a, b2a);
            pb[j] = qmv_tc_pair4<T>((wvb[i] >> (4 * j)) & 0x000F000Fu, s2b, b2b);
          }
          // x's levels 8i..8i+7 are words 4i..4i+3 of two halves each.
          px[0] = __byte_perm(xw[4 * i], xw[4 * i + 2], 0x5410);
          px[1] = __byte_perm(xw[4 * i], xw[4 * i + 2], 0x7632);
          px[2] = __byte_perm(xw[4 * i + 1], xw[4 * i + 3], 0x5410);
          px[3] = __byte_perm(xw[4 * i + 1], xw[4 * i + 3], 0x7632);
          const u32 a0[4] = {pa[0], pb[0], pa[1], pb[1]}, a1[4] = {pa[2], pb[2], pa[3], pb[3]};
          mma_m16n8k16<T>(c, a0, px[0], px[1]);
          mma_m16n8k16<T>(c, a1, px[2], px[3]);
        }
      } else {
        const float fsa = widen<T>(sa[u]), fba = widen<T>(ba[u]), fsb = widen<T>(sb[u]), fbb = widen<T>(bb[u]);
        // Word i holds levels 4i..4i+3; pairs (4i, 4i + 1) and (4i + 2, 4i + 3) are x's words
        // 2i and 2i + 1.
#pragma unroll
        for (int i = 0; i < 4; i += 2) {
          u32 pa[4], pb[4];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              const u32 va = wva[i + h], vb = wvb[i + h];
              pa[2 * h + j] = pack_half2<T>(fmaf(qmv_byte(va, 2 * j), fsa, fba), fmaf(qmv_byte(va, 2 * j + 1), fsa, fba));
              pb[2 * h + j] = pack_half2<T>(fmaf(qmv_byte(vb, 2 * j), fsb, fbb), fmaf(qmv_byte(vb, 2 * j + 1), fsb, fbb));
            }
          }
          const u32 a0[4] = {pa[0], pb[0], pa[1], pb[1]}, a1[4] = {pa[2], pb[2], pa[3], pb[3]};
          mma_m16n8k16<T>(c, a0, xw[2 * i], xw[2 * i + 1]);
          mma_m16n8k16<T>(c, a1, xw[2 * i + 2], xw[2 * i + 3]);
        }
      }
    }
  }
  // c: (row g, x rows 2t and 2t + 1), (row g + 8, the same); the warps' sums add up here.
  __shared__ float part[WARPS][32][4];
#pragma unroll
  for (int i = 0; i < 4; ++i) part[warp][lane][i] = c[i];
  __syncthreads();
  if (threadIdx.x < 128) {
    const int l = threadIdx.x >> 2, i = threadIdx.x & 3;
    float v = 0.0f;
#pragma unroll
    for (int wi = 0; wi < WARPS; ++wi) v += part[wi][l][i];
    const int row = row0 + (l >> 2) + (i >= 2 ? 8 : 0), m = 2 * (l & 3) + (i & 1);
    if (row < n && m < rows) y[(u64)m * n + row] = narrow<T>(v);
  }
}

// ---- gather_qmm: the products above over experts picked by index ----------------------------
//
// gather_runs (gather_mm.cuh) lists tiles of at most 8 output rows sharing a matrix of w, or
// (tiles null: few rows, where listing them costs more than it saves) each output's M ≤ 8 rows
// are a tile of their own, `direct` of them; each block loops over (tile, block of weight
// rows) items and runs qmv_affine or qmv_tc on them,
// with the expert's w, scales and biases (stacks sw and ss apart). A tile whose rows of x
// (row-major [Bx, M, K]) are not adjacent in memory runs row by row. Every call ends with a
// barrier: the next one writes the same shared memory.
template <typename Call>
__device__ __forceinline__ void gq_items(Call call, const u32* lhs, const u32* rhs, const int* tiles,
                                         const int* count, int direct, int flags, i64 bx, i64 bw, int m, int k,
                                         int blocks) {
  const i64 items = (i64)(tiles ? *count : direct) * blocks;
  for (i64 item = blockIdx.x; item < items; item += gridDim.x) {
    const int tile = (int)(item / blocks), blk = (int)(item % blocks);
    const int r0 = tiles ? tiles[2 * tile] : tile * m, r1 = tiles ? tiles[2 * tile + 2] : r0 + m;
    const int e = tiles ? tiles[2 * tile + 1] : (int)gm_pick(rhs, tile, flags & 2, bw);
    auto x_at = [&](int r) { return (gm_pick(lhs, r / m, flags & 1, bx) * m + r % m) * (i64)k; };
    const i64 x0 = x_at(r0);
    bool adjacent = true;
    for (int r = r0 + 1; r < r1; ++r) adjacent = adjacent && x_at(r) == x0 + (i64)(r - r0) * k;
    if (adjacent) {
      call(x0, e, r0, r1 - r0, blk);
      __syncthreads();
    } else {
      for (int r = r0; r < r1; ++r) {
        call(x_at(r), e, r, 1, blk);
        __syncthreads();
      }
    }
  }
}

// TC: qmv_tc (16 weight rows a block, U steps of loads), else qmv_affine (R rows a block).
template <typename T, bool TC, int BITS, int R, int WARPS, int U>
__device__ __forceinline__ void gather_qmv(const T* x, const u32* w, const T* scales, const T* biases, T* y,
                                           const u32* lhs, const u32* rhs, const int* tiles, const int* count,
                                           int direct, int flags, i64 bx, i64 bw, int m, int n, int k, int group_shift,
                                           i64 sw, i64 ss) {
  constexpr int ROWS = TC ? 16 : R;
  auto call = [&](i64 xo, int e, int r, int rows, int blk) {
    const T *xe = x + xo, *se = scales + e * ss, *be = biases + e * ss;
    if constexpr (TC) {
      qmv_tc<T, BITS, WARPS, U>(xe, w + e * sw, se, be, y + (i64)r * n, rows, n, k, group_shift, blk * ROWS);
    } else {
      qmv_affine<T, BITS, 8, R, WARPS>(xe, w + e * sw, se, be, y + (i64)r * n, rows, n, k, group_shift, blk * ROWS);
    }
  };
  gq_items(call, lhs, rhs, tiles, count, direct, flags, bx, bw, m, k, (n + ROWS - 1) / ROWS);
}
