// Attention of few queries (decoding, speculative rows): a block of NW warps per key-value
// head, group of up to R of its query rows (grouped heads x queries, which so read the keys
// and values once) and key partition. A warp takes tiles of 32 keys, one per lane: the tile's
// keys and values are staged in shared memory by coalesced cp.async, each lane makes its key's scores for
// every row, an online softmax (base 2) per row runs over the tile, and the values, read once
// per key, accumulate with each lane owning DV/32 of the output. The warps merge in a fixed
// order. With two passes, each partition writes its unnormalised output, maximum and sum, and
// the second pass merges the partitions in order.
//
// A row's partitions depend only on its own key range and the batch x heads count, and keys
// are visited relative to the partition's start, so a row gives the same bits whatever rows
// run beside it: a speculative row equals the same row decoded alone.
#include "common.cuh"

#define ATT_LOG2E 1.4426950408889634f
#define ATT_LN2 0.6931471805599453f

// A row's split of its `keys` keys over the `blocks` partitions planned for the longest row
// (fast::vector_blocks): at most one per 256 keys (VECTOR_MIN_KEYS_PER_BLOCK), of a whole
// number of 64-key tiles; `*parts` of them hold keys. A function of the row's keys alone, so a
// row splits as it would if decoded alone.
__device__ __forceinline__ void att_split(int blocks, int keys, int* parts, int* chunk) {
  int most = (keys + 255) / 256;
  most = most < blocks ? most : blocks;
  most = most > 1 ? most : 1;
  const int c = ((keys + most - 1) / most + 63) / 64 * 64;
  *chunk = c;
  *parts = keys > 0 ? (keys + c - 1) / c : 1;
}

// The keys query row i attends: [lo, hi).
__device__ __forceinline__ void att_range(int i, int Lq, int Lk, int causal, int window, int* lo, int* hi) {
  int h = Lk;
  if (causal) {
    h = i + Lk - Lq + 1;
    h = h < 0 ? 0 : (h > Lk ? Lk : h);
  }
  int l = 0;
  if (causal && window > 0) l = h - window > 0 ? h - window : 0;
  *lo = l;
  *hi = h;
}

__device__ __forceinline__ float att_warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// Output of a merged (maximum, sum, output) with the sink logit (already base 2) joining the
// sum; zeros for a row with no key.
template <typename T, int DV>
__device__ __forceinline__ void att_finish(float m, float l, float o, bool has_sink, float sink, T* dst) {
  if (has_sink) {
    float m2 = fmaxf(m, sink);
    float a = m == -INFINITY ? 0.0f : exp2f(m - m2);
    o *= a;
    l = l * a + exp2f(sink - m2);
  }
  *dst = narrow<T>(l > 0.0f ? o / l : 0.0f);
}

// Rows of one key-value head: `rows` of its grouped query heads x queries, starting at
// `first` (row g = head-in-group * Lq + query).
template <typename T, int D, int DV, int R, int NW>
__device__ __forceinline__ void attention_vector(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ out,
    const void* __restrict__ mask, const T* __restrict__ sinks, float* __restrict__ part,
    i64 qs0, i64 qs1, i64 qs2, i64 ks0, i64 ks1, i64 ks2, i64 vs0, i64 vs1, i64 vs2,
    i64 ms0, i64 ms1, i64 ms2, i64 ms3, int Hq, int Hkv, int Lq, int Lk, int causal, int window,
    int mask_kind, int blocks, float scale) {
  constexpr int EV = (DV + 31) / 32;
  constexpr int VEC = 16 / sizeof(T);           // elements per 16-byte chunk
  constexpr int KPAD = D * sizeof(T) + 16;      // bytes per staged key (the pad: no bank conflicts)
  constexpr int VROW = DV * sizeof(T);          // bytes per staged value
  constexpr int KCH = D * sizeof(T) / 16, VCH = VROW / 16;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int G = Hq / Hkv, groups = (G * Lq + R - 1) / R;
  const int grp = blockIdx.x % groups;
  const int kh = (int)((blockIdx.x / groups) % Hkv);
  const int b = (int)(blockIdx.x / ((i64)groups * Hkv));
  const int p = blockIdx.y;
  const i64 bkv = (i64)gridDim.x / groups;  // batch x key-value heads

  // Each warp's staged keys and values (dynamic: NW * 32 * (KPAD + VROW) bytes); after the
  // loop, the warps' outputs for the merge.
  extern __shared__ __align__(16) unsigned char att_dyn[];
  __shared__ float qsm[R][D];
  __shared__ float sm[NW][R], sl[NW][R];

  // Each row's key range in this partition.
  int rs[R], re[R], rh[R], ri[R];
  int kmin = Lk, kmax = 0;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    int g = grp * R + r;
    rs[r] = 0;
    re[r] = 0;
    rh[r] = kh * G + g / Lq;
    ri[r] = g % Lq;
    if (g >= G * Lq) continue;
    int lo, hi;
    att_range(ri[r], Lq, Lk, causal, window, &lo, &hi);
    int nb, chunk;
    att_split(blocks, hi - lo, &nb, &chunk);
    if (p >= nb) continue;
    rs[r] = lo + p * chunk;
    re[r] = min(hi, rs[r] + chunk);
    if (re[r] > rs[r]) {
      kmin = min(kmin, rs[r]);
      kmax = max(kmax, re[r]);
    }
  }
  for (int x = threadIdx.x; x < R * D; x += blockDim.x) {
    int r = x / D, c = x % D;
    int g = grp * R + r;
    qsm[r][c] = g < G * Lq ? widen(q[b * qs0 + (kh * G + g / Lq) * qs1 + (g % Lq) * qs2 + c]) * (scale * ATT_LOG2E) : 0.0f;
  }
  __syncthreads();

  const T* kb = k + b * ks0 + kh * ks1;
  const T* vb = v + b * vs0 + kh * vs1;
  i64 mrow[R];
#pragma unroll
  for (int r = 0; r < R; ++r) mrow[r] = b * ms0 + rh[r] * ms1 + ri[r] * ms2;

  float m[R], l[R], o[R][EV];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
#pragma unroll
    for (int e = 0; e < EV; ++e) o[r][e] = 0.0f;
  }

  unsigned char* kst = att_dyn + warp * 32 * (KPAD + VROW);
  unsigned char* vst = kst + 32 * KPAD;
  const u32 ksa = (u32)__cvta_generic_to_shared(kst), vsa = ksa + 32 * KPAD;
  // Tiles of 32 keys at absolute positions; tile t goes to warp t % NW, so a row's keys meet the
  // same warps in the same order whatever rows share the block.
  const int t0 = kmin / 32, t1 = (kmax + 31) / 32;
  int tfirst = t0 + ((warp - t0 % NW) + NW) % NW;
  for (int t = tfirst; t < t1; t += NW) {
    const int j = t * 32 + lane;
    __syncwarp();
    // The tile's keys and values, coalesced (consecutive lanes, consecutive 16-byte chunks),
    // all in flight at once; keys outside the block's range are zeros.
    for (int x = lane; x < 32 * KCH; x += 32) {
      const int kk = x / KCH, c = x % KCH, jj = t * 32 + kk;
      const bool ok = jj >= kmin && jj < kmax;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(ksa + kk * KPAD + c * 16),
                   "l"(kb + (ok ? jj : kmin) * ks2 + c * VEC), "r"(ok ? 16 : 0)
                   : "memory");
    }
    for (int x = lane; x < 32 * VCH; x += 32) {
      const int kk = x / VCH, c = x % VCH, jj = t * 32 + kk;
      const bool ok = jj >= kmin && jj < kmax;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(vsa + kk * VROW + c * 16),
                   "l"(vb + (ok ? jj : kmin) * vs2 + c * VEC), "r"(ok ? 16 : 0)
                   : "memory");
    }
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;" ::: "memory");
    __syncwarp();
    float s[R];
#pragma unroll
    for (int r = 0; r < R; ++r) s[r] = 0.0f;
#pragma unroll 4
    for (int c = 0; c < KCH; ++c) {
      int4 raw = *reinterpret_cast<const int4*>(kst + lane * KPAD + c * 16);
      const T* kv = reinterpret_cast<const T*>(&raw);
      float kf[VEC];
#pragma unroll
      for (int e = 0; e < VEC; ++e) kf[e] = widen(kv[e]);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float* qr = &qsm[r][c * VEC];
#pragma unroll
        for (int e = 0; e < VEC; ++e) s[r] = fmaf(qr[e], kf[e], s[r]);
      }
    }
    float pr[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float x = s[r];
      bool in = j >= rs[r] && j < re[r];
      if (in && mask_kind == 1) {
        if (!((const bool*)mask)[mrow[r] + j * ms3]) x = -3.402823466e38f;
      } else if (in && mask_kind == 2) {
        x += widen(((const T*)mask)[mrow[r] + j * ms3]) * ATT_LOG2E;
      }
      x = in ? x : -INFINITY;
      float mt = x;
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, off));
      float m2 = fmaxf(m[r], mt);
      if (m2 == -INFINITY) {
        pr[r] = 0.0f;
        continue;
      }
      float a = exp2f(m[r] - m2);
      pr[r] = exp2f(x - m2);
      l[r] = l[r] * a + pr[r];
#pragma unroll
      for (int e = 0; e < EV; ++e) o[r][e] *= a;
      m[r] = m2;
    }
    // o += p v, key by key (each key's probabilities come from its lane).
#pragma unroll 8
    for (int kk = 0; kk < 32; ++kk) {
      const int jj = t * 32 + kk;
      if (jj < kmin || jj >= kmax) continue;
      const T* vr = reinterpret_cast<const T*>(vst + kk * VROW);
      float vf[EV];
#pragma unroll
      for (int e = 0; e < EV; ++e) {
        int c = lane * EV + e;
        vf[e] = (DV % 32 == 0 || c < DV) ? widen(vr[c]) : 0.0f;
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float pk = __shfl_sync(0xffffffffu, pr[r], kk);
#pragma unroll
        for (int e = 0; e < EV; ++e) o[r][e] = fmaf(pk, vf[e], o[r][e]);
      }
    }
  }

  // Per warp: the lanes' sums; then the warps merge in order, row by row.
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float lw = att_warp_sum(l[r]);
    if (lane == 0) {
      sm[warp][r] = m[r];
      sl[warp][r] = lw;
    }
  }
  __syncthreads();
  float* so = reinterpret_cast<float*>(att_dyn);  // [NW][R][EV * 32]
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int e = 0; e < EV; ++e) so[(warp * R + r) * EV * 32 + lane * EV + e] = o[r][e];
  __syncthreads();
  const bool two = part != 0;
  for (int x = threadIdx.x; x < R * DV; x += blockDim.x) {
    const int r = x / DV, c = x % DV;
    const int g = grp * R + r;
    if (g >= G * Lq) continue;
    const int hr = kh * G + g / Lq, ir = g % Lq;
    int lo, hi;
    att_range(ir, Lq, Lk, causal, window, &lo, &hi);
    int nb, chunk;
    att_split(blocks, hi - lo, &nb, &chunk);
    if (p >= nb) continue;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < NW; ++w) M = fmaxf(M, sm[w][r]);
    float L = 0.0f, O = 0.0f;
#pragma unroll
    for (int w = 0; w < NW; ++w) {
      float wg = sm[w][r] == -INFINITY ? 0.0f : exp2f(sm[w][r] - M);
      L += sl[w][r] * wg;
      O += so[(w * R + r) * EV * 32 + c] * wg;
    }
    const i64 row = ((i64)b * Hq + hr) * Lq + ir;
    if (two) {
      const i64 slot = row * blocks + p;
      part[slot * DV + c] = O;
      if (c == 0) {
        float* ml = part + bkv * G * Lq * blocks * DV;
        ml[slot * 2] = M;
        ml[slot * 2 + 1] = L;
      }
    } else {
      float sink = sinks ? widen(sinks[hr]) * ATT_LOG2E : 0.0f;
      att_finish<T, DV>(M, L, O, sinks != 0, sink, out + row * DV + c);
    }
  }
}

// Merges row r's `nb` partitions in order (part: [rows][blocks][DV] unnormalised outputs, then
// [rows][blocks][2] maxima and sums) into its output, columns c0, c0 + step, ... Reads through
// L2 (other blocks wrote the partitions).
template <typename T, int DV>
__device__ __forceinline__ void att_merge_row(const float* part, i64 rows, int blocks, i64 r, int nb,
                                              const T* __restrict__ sinks, int h, T* __restrict__ out, int c0,
                                              int step) {
  const float* ml = part + rows * blocks * DV + r * blocks * 2;
  const float* po = part + r * blocks * DV;
  float M = -INFINITY;
#pragma unroll 8
  for (int p = 0; p < nb; ++p) M = fmaxf(M, __ldcg(ml + 2 * p));
  const float sink = sinks ? widen(sinks[h]) * ATT_LOG2E : 0.0f;
  for (int c = c0; c < DV; c += step) {
    float O = 0.0f, L = 0.0f;
#pragma unroll 8
    for (int p = 0; p < nb; ++p) {
      const float mp = __ldcg(ml + 2 * p);
      const float w = mp == -INFINITY ? 0.0f : exp2f(mp - M);
      O += __ldcg(po + (i64)p * DV + c) * w;
      L += __ldcg(ml + 2 * p + 1) * w;
    }
    att_finish<T, DV>(M, L, O, sinks != 0, sink, out + r * DV + c);
  }
}

// The second pass of the float32 vector kernel: one block per row.
template <typename T, int DV>
__device__ __forceinline__ void attention_vector_merge(
    const float* __restrict__ part, const T* __restrict__ sinks, T* __restrict__ out, i64 rows, int Hq, int Hkv, int Lq,
    int Lk, int causal, int window, int blocks) {
  const i64 r = blockIdx.x;
  const int i = (int)(r % Lq), h = (int)((r / Lq) % Hq);
  int lo, hi, nb, chunk;
  att_range(i, Lq, Lk, causal, window, &lo, &hi);
  att_split(blocks, hi - lo, &nb, &chunk);
  att_merge_row<T, DV>(part, rows, blocks, r, nb, sinks, h, out, threadIdx.x, blockDim.x);
}

// ---- tiled attention (prefill) ----------------------------------------------------------------
// FlashAttention-2's forward on tensor cores (mma.sync m16n8k16, bf16/f16 in, f32 accumulate):
// a block of 8 warps takes 128 query rows (16 per warp) of one head and walks tiles of 64 keys
// and values staged in shared memory by cp.async, the next tile's keys loading while this
// tile's values are used and the reverse. Scores stay in registers, the online softmax is in
// base 2, and a tile wholly inside every row's causal and window bounds skips the masking.

#define ATT_BR 128
#define ATT_BC 64

__device__ __forceinline__ void att_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void att_wait1() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }

// Stages rows first..first+ROWS-1 of a [rows, D] matrix (row stride `rs` elements) into `dst`
// (ROW bytes per row); rows outside [0, valid) are zeros. NT, when given, is the threads taking
// part (the first NT), so that the loop unrolls.
// att_stage with row `row` at `row_at(row)` (a paged cache's rows are not evenly spaced); row 0
// is read, for nothing, in place of rows outside.
template <typename T, int D, int ROW, int ROWS, int NT = 0, typename RowAt>
__device__ __forceinline__ void att_stage_at(u32 dst, RowAt row_at, int first, int valid) {
  constexpr int CH = D * (int)sizeof(T) / 16;
#pragma unroll
  for (int x = threadIdx.x; x < ROWS * CH; x += NT ? NT : (int)blockDim.x) {
    int r = x / CH, c = x % CH, row = first + r;
    bool ok = row >= 0 && row < valid;
    const T* g = row_at(ok ? row : 0) + c * (16 / (int)sizeof(T));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst + r * ROW + c * 16), "l"(g),
                 "r"(ok ? 16 : 0)
                 : "memory");
  }
}
template <typename T, int D, int ROW, int ROWS, int NT = 0>
__device__ __forceinline__ void att_stage(u32 dst, const T* src, i64 rs, int first, int valid) {
  att_stage_at<T, D, ROW, ROWS, NT>(dst, [=](int row) { return src + row * rs; }, first, valid);
}

// Accumulator tiles 2 kk and 2 kk + 1 (16 columns) repacked in T as the A fragment of the next
// product's k-step kk (mma.sync's and wgmma's register operand): P for P V, dS for dS K.
template <typename T, int NT>
__device__ __forceinline__ void att_frag(u32 (&f)[4], const float (&s)[NT][4], int kk) {
  f[0] = pack_half2<T>(s[2 * kk][0], s[2 * kk][1]);
  f[1] = pack_half2<T>(s[2 * kk][2], s[2 * kk][3]);
  f[2] = pack_half2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
  f[3] = pack_half2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

// acc (16 rows x D) += p (16 rows x K, accumulators repacked as A fragments) times the K rows
// of `sb` (staged [rows][D] with ROW bytes per row): O += P V; dV += P^T dO, dK += dS^T Q.
template <typename T, int D, int ROW, int K>
__device__ __forceinline__ void att_accumulate(float (&acc)[D / 8][4], const float (&p)[K / 8][4], u32 sb, int lane) {
  const int m = lane >> 3;
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    u32 pf[4];
    att_frag<T>(pf, p, kk);
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      u32 bfr[4];
      ldsm_x4_t(bfr, sb + (kk * 16 + (m & 1) * 8 + (lane & 7)) * ROW + (dp * 16 + (m >> 1) * 8) * 2);
      mma_m16n8k16<T>(acc[2 * dp], pf, bfr[0], bfr[1]);
      mma_m16n8k16<T>(acc[2 * dp + 1], pf, bfr[2], bfr[3]);
    }
  }
}

// 2^x; with FTZ one MUFU.EX2 that flushes subnormal results (exp2f adds the fix-ups).
template <bool FTZ> __device__ __forceinline__ float att_exp2(float x) {
  if constexpr (FTZ) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
  } else {
    return exp2f(x);
  }
}

// One tile's online softmax, straight-line for each case: MASK applies the bounds per score;
// FOLD (a positive scale) takes the maximum of the raw scores and scales inside the exponent's
// FMA, one instruction a score fewer.
template <int NT, bool FTZ, bool MASK, bool FOLD>
__device__ __forceinline__ void att_softmax_tile(float (&s)[NT][4], float (&mrow)[2], float (&lrow)[2],
                                                 float (&alpha)[2], int j0, int r0, int t4, int Lk, int off,
                                                 int causal, int window, float sl2) {
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      float x = FOLD ? s[n][c] : s[n][c] * sl2;
      if constexpr (MASK) {
        const int j = j0 + n * 8 + 2 * t4 + (c & 1), pos = r0 + (c >> 1) * 8 + off;
        const bool ok = j < Lk && (!causal || j <= pos) && !(causal && window > 0 && j <= pos - window);
        x = ok ? x : -INFINITY;
      }
      s[n][c] = x;
    }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float mx = -INFINITY;
#pragma unroll
    for (int n = 0; n < NT; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * i], s[n][2 * i + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    if constexpr (FOLD) mx *= sl2;
    const float mn = fmaxf(mrow[i], mx), ms = mn == -INFINITY ? 0.0f : mn;
    alpha[i] = att_exp2<FTZ>(mrow[i] - ms);
    mrow[i] = mn;
    float sum = 0.0f;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      s[n][2 * i] = att_exp2<FTZ>(FOLD ? fmaf(s[n][2 * i], sl2, -ms) : s[n][2 * i] - ms);
      s[n][2 * i + 1] = att_exp2<FTZ>(FOLD ? fmaf(s[n][2 * i + 1], sl2, -ms) : s[n][2 * i + 1] - ms);
      sum += s[n][2 * i] + s[n][2 * i + 1];
    }
    lrow[i] = lrow[i] * alpha[i] + sum;
  }
}

// A tile's scores (NT accumulator tiles of 8 keys from j0) scaled to base 2, masked where the
// bounds of some row of [first, first + rows) cut the tile, and run through the online softmax:
// s becomes the probabilities, `alpha` the rescale of the rows' old outputs. This thread's rows
// are r0 (c = 0, 1) and r0 + 8 (c = 2, 3); a row's 4 threads are a quad.
template <int NT, bool FTZ>
__device__ __forceinline__ void att_softmax(float (&s)[NT][4], float (&mrow)[2], float (&lrow)[2], float (&alpha)[2],
                                            int j0, int first, int rows, int r0, int t4, int Lk, int off, int causal,
                                            int window, float sl2) {
  const bool inside = j0 + NT * 8 <= Lk && (!causal || j0 + NT * 8 - 1 <= first + off) &&
                      !(causal && window > 0 && j0 <= first + rows - 1 + off - window);
  // Two copies, not four: a third costs registers (spills at D 64); a negative scale is rare.
  if (inside && sl2 > 0.0f)
    att_softmax_tile<NT, FTZ, false, true>(s, mrow, lrow, alpha, j0, r0, t4, Lk, off, causal, window, sl2);
  else
    att_softmax_tile<NT, FTZ, true, false>(s, mrow, lrow, alpha, j0, r0, t4, Lk, off, causal, window, sl2);
}

// Finishes this thread's rows r0 and r0 + 8 of head h: the quad's sums, the log-sum-exp (when
// `lse`), the sink, the division and the store of the DT accumulator tiles of 8 features; rows
// past Lq are not written.
template <typename T, int DT>
__device__ __forceinline__ void att_store(const float (&o)[DT][4], const float (&mrow)[2], const float (&lrow)[2],
                                          int r0, int t4, int b, int h, int Hq, int Lq, float* __restrict__ lse,
                                          const T* __restrict__ sinks, T* __restrict__ out) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float l = lrow[i];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int r = r0 + i * 8;
    if (lse && t4 == 0 && r < Lq)
      lse[((i64)b * Hq + h) * Lq + r] = l > 0.0f ? (mrow[i] + log2f(l)) * ATT_LN2 : -INFINITY;
    float scl = 1.0f;
    if (sinks) {
      const float sk2 = widen(sinks[h]) * ATT_LOG2E, m2 = fmaxf(mrow[i], sk2);
      const float a = mrow[i] == -INFINITY ? 0.0f : exp2f(mrow[i] - m2);
      scl = a;
      l = l * a + exp2f(sk2 - m2);
    }
    const float inv = l > 0.0f ? scl / l : 0.0f;
    if (r >= Lq) continue;
    T* dst = out + (((i64)b * Hq + h) * Lq + r) * (DT * 8);
#pragma unroll
    for (int n = 0; n < DT; ++n) {
      const u32 pk = pack_half2<T>(o[n][2 * i] * inv, o[n][2 * i + 1] * inv);
      *reinterpret_cast<u32*>(dst + n * 8 + 2 * t4) = pk;
    }
  }
}

template <typename T, int D>
__device__ __forceinline__ void attention_tiled(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ out,
    float* __restrict__ lse, const T* __restrict__ sinks, i64 qs0, i64 qs1, i64 qs2, i64 ks0, i64 ks1, i64 ks2,
    i64 vs0, i64 vs1, i64 vs2, int Hq, int Hkv, int Lq, int Lk, int causal, int window, float scale) {
  constexpr int ROW = D * 2 + 16;  // staged row bytes: the pad spreads ldmatrix rows over the banks
  constexpr int KS = D / 16, NT = ATT_BC / 8, DT = D / 8;
  extern __shared__ __align__(16) unsigned char att_smem[];
  const u32 sq = (u32)__cvta_generic_to_shared(att_smem);
  const u32 sk = sq + ATT_BR * ROW, sv = sk + ATT_BC * ROW;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  // The longest causal tiles first.
  const int qt = gridDim.x - 1 - blockIdx.x;
  const int h = blockIdx.y % Hq, b = blockIdx.y / Hq, kh = h / (Hq / Hkv);
  const int q0 = qt * ATT_BR, off = Lk - Lq;
  int kend = causal ? min(Lk, q0 + ATT_BR - 1 + off + 1) : Lk;
  kend = max(kend, 0);
  int kbeg = (causal && window > 0) ? max(0, q0 + off - window + 1) : 0;
  const int jt0 = kbeg / ATT_BC, jt1 = (kend + ATT_BC - 1) / ATT_BC;
  const T* kb = k + b * ks0 + kh * ks1;
  const T* vb = v + b * vs0 + kh * vs1;

  att_stage<T, D, ROW, ATT_BR>(sq, q + b * qs0 + h * qs1, qs2, q0, Lq);
  if (jt0 < jt1) att_stage<T, D, ROW, ATT_BC>(sk, kb, ks2, jt0 * ATT_BC, kend);
  att_commit();
  if (jt0 < jt1) att_stage<T, D, ROW, ATT_BC>(sv, vb, vs2, jt0 * ATT_BC, kend);
  att_commit();
  att_wait1();
  __syncthreads();

  // This warp's 16 query rows as A fragments.
  u32 qf[KS][4];
  {
    const int m = lane >> 3, r = warp * 16 + (m & 1) * 8 + (lane & 7);
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) ldsm_x4(qf[kk], sq + r * ROW + (kk * 16 + (m >> 1) * 8) * 2);
  }
  const float sl2 = scale * ATT_LOG2E;
  const int r0 = q0 + warp * 16 + g;  // this thread's rows: r0 and r0 + 8
  float o[DT][4], mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f};
#pragma unroll
  for (int n = 0; n < DT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

  for (int jt = jt0; jt < jt1; ++jt) {
    float s[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
    {
      const int m = lane >> 3;
#pragma unroll
      for (int kk = 0; kk < KS; ++kk) {
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
          u32 bfr[4];
          const int kr = np * 16 + (m >> 1) * 8 + (lane & 7);
          ldsm_x4(bfr, sk + kr * ROW + (kk * 16 + (m & 1) * 8) * 2);
          mma_m16n8k16<T>(s[2 * np], qf[kk], bfr[0], bfr[1]);
          mma_m16n8k16<T>(s[2 * np + 1], qf[kk], bfr[2], bfr[3]);
        }
      }
    }
    __syncthreads();
    if (jt + 1 < jt1) att_stage<T, D, ROW, ATT_BC>(sk, kb, ks2, (jt + 1) * ATT_BC, kend);
    att_commit();

    float alpha[2];
    att_softmax<NT, false>(s, mrow, lrow, alpha, jt * ATT_BC, q0, ATT_BR, r0, t4, Lk, off, causal, window, sl2);
#pragma unroll
    for (int n = 0; n < DT; ++n) {
      o[n][0] *= alpha[0];
      o[n][1] *= alpha[0];
      o[n][2] *= alpha[1];
      o[n][3] *= alpha[1];
    }
    att_wait1();
    __syncthreads();
    // O += P V, P's accumulators repacked as A fragments (two score tiles per 16 keys).
    att_accumulate<T, D, ROW, ATT_BC>(o, s, sv, lane);
    __syncthreads();
    if (jt + 1 < jt1) att_stage<T, D, ROW, ATT_BC>(sv, vb, vs2, (jt + 1) * ATT_BC, kend);
    att_commit();
    att_wait1();
    __syncthreads();
  }

  att_store<T, DT>(o, mrow, lrow, r0, t4, b, h, Hq, Lq, lse, sinks, out);
}

// ---- backward (FlashAttention-2's) ------------------------------------------------------------
// A block of NW warps owns 16 * NW keys of one key-value head, 16 per warp, and walks the tiles of
// ATB_BR query rows that attend them, for each query head of its group, the next tile's queries and
// cotangents loading while this one's are used. Per tile it recomputes the
// transposed scores S^T = K Q^T on tensor cores and the probabilities P^T from the forward's
// log-sum-exp, then accumulates dV += P^T dO and dK += dS^T Q in registers (dS = P (dP - delta),
// dP^T = V dO^T, delta = rowsum(dO O)). The tile's dQ += dS K goes through shared memory to a
// float32 accumulator by vector atomic adds, which a last kernel scales and narrows. Keys stay in their
// block, so dK and dV need no atomics, and the transposed layout makes P^T and dS^T the A
// operands of their products straight from the accumulators.

// Query rows per step (BACKWARD_ROWS in fast/attention.rs; bench/cuda/tune_attention_bwd.cu may
// override it to measure others).
#ifndef ATB_BR
#define ATB_BR 64
#endif

// delta = rowsum(dO * O) for rows of D features (row-major), a warp per row.
// rowsum(o * g) over a row of D features, by the calling warp (every lane gets it).
template <typename T, int D>
__device__ __forceinline__ float att_row_dot(const T* __restrict__ o, const T* __restrict__ g, i64 row, int lane) {
  float s = 0.0f;
#pragma unroll
  for (int d = lane; d < D; d += 32) s += widen(o[row * D + d]) * widen(g[row * D + d]);
  return att_warp_sum(s);
}

template <typename T, int D>
__device__ __forceinline__ void attention_backward_delta(const T* __restrict__ o, const T* __restrict__ g,
                                                         float* __restrict__ delta, i64 rows) {
  const i64 row = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  const float s = att_row_dot<T, D>(o, g, row, lane);
  if (lane == 0) delta[row] = s;
}

// dQ = scale * its float32 accumulator, in T.
template <typename T>
__device__ __forceinline__ void attention_backward_dq(const float* __restrict__ acc, T* __restrict__ dq, i64 n,
                                                      float scale) {
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
    dq[i] = narrow<T>(acc[i] * scale);
}

// Shared memory of a backward block of NW warps for head size D: keys and values, two stages of
// queries and cotangents (rows of D 2-byte features and a 16-byte pad), dS^T (padded rows of ATB_BR),
// and two stages of the rows' log-sum-exp and delta.
__host__ __device__ constexpr int att_bwd_smem(int D, int NW) {
  return 2 * 16 * NW * (D * 2 + 16) + 4 * ATB_BR * (D * 2 + 16) + 16 * NW * (ATB_BR * 2 + 16) + 4 * ATB_BR * 4;
}

// acc = the 16 rows of `sa` from `row0` times the ATB_BR rows of `sb`, transposed (S^T = K Q^T,
// dP^T = V dO^T): both staged [rows][D] with ROW bytes per row.
template <typename T, int D, int ROW>
__device__ __forceinline__ void att_rows_t(float (&acc)[ATB_BR / 8][4], u32 sa, u32 sb, int row0, int lane) {
  const int m = lane >> 3;
#pragma unroll
  for (int n = 0; n < ATB_BR / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    u32 af[4];
    ldsm_x4(af, sa + (row0 + (m & 1) * 8 + (lane & 7)) * ROW + (kk * 16 + (m >> 1) * 8) * 2);
#pragma unroll
    for (int np = 0; np < ATB_BR / 16; ++np) {
      u32 bfr[4];
      ldsm_x4(bfr, sb + (np * 16 + (m >> 1) * 8 + (lane & 7)) * ROW + (kk * 16 + (m & 1) * 8) * 2);
      mma_m16n8k16<T>(acc[2 * np], af, bfr[0], bfr[1]);
      mma_m16n8k16<T>(acc[2 * np + 1], af, bfr[2], bfr[3]);
    }
  }
}

template <typename T, int D, int NW>
__device__ __forceinline__ void attention_backward(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ go,
    const float* __restrict__ lse, const float* __restrict__ delta, float* __restrict__ dq, T* __restrict__ dk,
    T* __restrict__ dv, i64 qs0, i64 qs1, i64 qs2, i64 ks0, i64 ks1, i64 ks2, i64 vs0, i64 vs1, i64 vs2, i64 gs0,
    i64 gs1, i64 gs2, int Hq, int Hkv, int Lq, int Lk, int causal, int window, float scale) {
  constexpr int BC = 16 * NW, ROW = D * 2 + 16, DSROW = ATB_BR * 2 + 16, STAGE = ATB_BR * ROW;
  constexpr int QT = ATB_BR / 8, DT = D / 8;
  extern __shared__ __align__(16) unsigned char att_smem[];
  const u32 sk = (u32)__cvta_generic_to_shared(att_smem);
  const u32 sv = sk + BC * ROW, sq0 = sv + BC * ROW, sg0 = sq0 + 2 * STAGE, sds = sg0 + 2 * STAGE;
  unsigned char* ds_tile = att_smem + 2 * BC * ROW + 4 * STAGE;
  float* s_stats = reinterpret_cast<float*>(ds_tile + BC * DSROW);  // [stage][lse, delta][ATB_BR]
  const u32 sstats = sds + BC * DSROW;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3, m = lane >> 3;
  // Key tiles slowest, so that (causal) the tiles most query rows attend start first.
  const int heads = gridDim.x / ((Lk + BC - 1) / BC);
  const int kt = blockIdx.x / heads, bh = blockIdx.x % heads;
  const int kh = bh % Hkv, b = bh / Hkv, group = Hq / Hkv, off = Lk - Lq, j0 = kt * BC;
  // Query rows whose bounds reach these keys: position >= j0, and with a window, position
  // - window < the last key.
  const int ibeg = causal ? max(0, j0 - off) : 0;
  const int iend = (causal && window > 0) ? min(Lq, j0 + BC - 1 + window - off) : Lq;
  const int it0 = ibeg / ATB_BR, nt = iend > ibeg ? (iend + ATB_BR - 1) / ATB_BR - it0 : 0, steps = group * nt;

  att_stage<T, D, ROW, BC>(sk, k + b * ks0 + kh * ks1, ks2, j0, Lk);
  att_stage<T, D, ROW, BC>(sv, v + b * vs0 + kh * vs1, vs2, j0, Lk);
  // Step t's queries, cotangents and row statistics into stage t & 1.
  auto stage = [&](int t) {
    const int h = kh * group + t / nt, i0 = (it0 + t % nt) * ATB_BR, buf = t & 1;
    att_stage<T, D, ROW, ATB_BR>(sq0 + buf * STAGE, q + b * qs0 + h * qs1, qs2, i0, Lq);
    att_stage<T, D, ROW, ATB_BR>(sg0 + buf * STAGE, go + b * gs0 + h * gs1, gs2, i0, Lq);
    if (threadIdx.x < 2 * ATB_BR) {
      const int x = threadIdx.x % ATB_BR, i = i0 + x;
      const float* src = (threadIdx.x < ATB_BR ? lse : delta) + ((i64)b * Hq + h) * Lq + (i < Lq ? i : 0);
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(sstats + (buf * 2 * ATB_BR + threadIdx.x) * 4),
                   "l"(src), "r"(i < Lq ? 4 : 0)
                   : "memory");
    }
  };
  if (steps > 0) stage(0);
  att_commit();

  const float sl2 = scale * ATT_LOG2E;
  const int jr = j0 + warp * 16 + g;  // this thread's keys: jr and jr + 8
  float dka[DT][4], dva[DT][4];
#pragma unroll
  for (int n = 0; n < DT; ++n)
#pragma unroll
    for (int c = 0; c < 4; ++c) dka[n][c] = dva[n][c] = 0.0f;

  for (int t = 0; t < steps; ++t) {
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    __syncthreads();
    // Every warp is past step t - 1: its stage is free for step t + 1.
    if (t + 1 < steps) stage(t + 1);
    att_commit();
    const int h = kh * group + t / nt, i0 = (it0 + t % nt) * ATB_BR, buf = t & 1;
    const i64 rows = ((i64)b * Hq + h) * Lq;
    const u32 sq = sq0 + buf * STAGE, sg = sg0 + buf * STAGE;
    const float* s_lse = s_stats + buf * 2 * ATB_BR;
    const float* s_delta = s_lse + ATB_BR;

    // S^T: this warp's 16 keys x the tile's ATB_BR queries.
    float s[QT][4];
    att_rows_t<T, D, ROW>(s, sk, sq, warp * 16, lane);
    // P^T, zero outside each row's bounds.
#pragma unroll
    for (int n = 0; n < QT; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int j = jr + (c >> 1) * 8, il = n * 8 + 2 * t4 + (c & 1), pos = i0 + il + off;
        const bool ok = j < Lk && i0 + il < Lq && (!causal || j <= pos) && !(causal && window > 0 && j <= pos - window);
        s[n][c] = ok ? exp2f(s[n][c] * sl2 - s_lse[il] * ATT_LOG2E) : 0.0f;
      }
    // dV += P^T dO.
    att_accumulate<T, D, ROW, ATB_BR>(dva, s, sg, lane);
    // dP^T = V dO^T, then dS^T = P^T (dP^T - delta) in place.
    float dpt[QT][4];
    att_rows_t<T, D, ROW>(dpt, sv, sg, warp * 16, lane);
#pragma unroll
    for (int n = 0; n < QT; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c) s[n][c] *= dpt[n][c] - s_delta[n * 8 + 2 * t4 + (c & 1)];
    // dK += dS^T Q; dS^T to shared memory for dQ.
    att_accumulate<T, D, ROW, ATB_BR>(dka, s, sq, lane);
#pragma unroll
    for (int n = 0; n < QT; ++n) {
      const int kr = warp * 16 + g, col = n * 8 + 2 * t4;
      *reinterpret_cast<u32*>(ds_tile + kr * DSROW + col * 2) = pack_half2<T>(s[n][0], s[n][1]);
      *reinterpret_cast<u32*>(ds_tile + (kr + 8) * DSROW + col * 2) = pack_half2<T>(s[n][2], s[n][3]);
    }
    __syncthreads();
    // dQ (ATB_BR queries x D) += dS K: a warp per 16 rows x 16 features at a time.
    for (int w = warp; w < (ATB_BR / 16) * (DT / 2); w += NW) {
      const int mt = w % (ATB_BR / 16), dp = w / (ATB_BR / 16);
      float acc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
      for (int kk = 0; kk < BC / 16; ++kk) {
        u32 af[4], bfr[4];
        ldsm_x4_t(af, sds + (kk * 16 + (m >> 1) * 8 + (lane & 7)) * DSROW + (mt * 16 + (m & 1) * 8) * 2);
        ldsm_x4_t(bfr, sk + (kk * 16 + (m & 1) * 8 + (lane & 7)) * ROW + (dp * 16 + (m >> 1) * 8) * 2);
        mma_m16n8k16<T>(acc[0], af, bfr[0], bfr[1]);
        mma_m16n8k16<T>(acc[1], af, bfr[2], bfr[3]);
      }
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = i0 + mt * 16 + g + half * 8;
        if (i >= Lq) continue;
#pragma unroll
        for (int nn = 0; nn < 2; ++nn) {
          float* dst = dq + (rows + i) * D + (2 * dp + nn) * 8 + 2 * t4;
          asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(dst), "f"(acc[nn][2 * half]),
                       "f"(acc[nn][2 * half + 1])
                       : "memory");
        }
      }
    }
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");

  // dK = scale dS^T Q and dV, for the keys inside Lk.
#pragma unroll
  for (int c2 = 0; c2 < 2; ++c2) {
    const int j = jr + c2 * 8;
    if (j >= Lk) continue;
    const i64 at = (((i64)b * Hkv + kh) * Lk + j) * D;
#pragma unroll
    for (int n = 0; n < DT; ++n) {
      *reinterpret_cast<u32*>(dk + at + n * 8 + 2 * t4) = pack_half2<T>(dka[n][2 * c2] * scale, dka[n][2 * c2 + 1] * scale);
      *reinterpret_cast<u32*>(dv + at + n * 8 + 2 * t4) = pack_half2<T>(dva[n][2 * c2], dva[n][2 * c2 + 1]);
    }
  }
}

// ---- vector attention on tensor cores (half precision) ----------------------------------------
// The vector kernels' work for float16/bfloat16 with mma.sync: a block takes one query of the
// grouped heads of one key-value head (up to 16 heads, the rows of one m16 tile) and one key
// partition, and walks its keys in tiles of NW * 16 from the partition's first key through a
// ring of stages, so that several tiles are in flight while one is used: decoding streams K
// and V, and only bytes in flight make it fast. Warp w of NW takes keys 16 w .. 16 w + 15 of
// each tile (att_vector_keys); the warps merge in order at the end. A row reads the same keys
// in the same order, with the same warps, whatever the number of queries: a speculative row
// equals the same row decoded alone.
//   attention_vector_mma: all threads fill the ring with cp.async (rows padded by 16 bytes
//     against bank conflicts); any GPU, every head size.
//   attention_vector_tma (Hopper): a producer warp fills it by TMA (128-byte swizzle) under
//     mbarriers; head sizes of whole 64-feature panels.

// One warp's 16 keys of a staged tile: scores for the 16 rows (qf, the rows' A fragments) by
// D/16 MMAs, bounds (keys j0.., only those in [klo, kmax)) and the mask, the online softmax on the
// accumulators, and O += P V by DV/8 MMAs. kaddr(key, feature) and vaddr(key, feature) are the
// shared addresses of a staged key's and value's 8 features from `feature` on.
template <typename T, int D, int DV, typename KA, typename VA>
__device__ __forceinline__ void att_vector_keys(const u32 (&qf)[D / 16][4], float (&o)[DV / 8][4], float (&mrow)[2],
                                                float (&lrow)[2], KA kaddr, VA vaddr, int j0, int klo, int kmax,
                                                const bool (&row_ok)[2], const void* mask, int mask_kind, i64 mr0,
                                                i64 mr1, i64 ms3, float sl2, int lane) {
  const int m = lane >> 3, g8 = lane & 7, t4 = lane & 3;
  float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    u32 bfr[4];
    ldsm_x4(bfr, kaddr((m >> 1) * 8 + g8, kk * 16 + (m & 1) * 8));
    mma_m16n8k16<T>(s[0], qf[kk], bfr[0], bfr[1]);
    mma_m16n8k16<T>(s[1], qf[kk], bfr[2], bfr[3]);
  }
  // Scale and mask; rows g (c = 0, 1) and g + 8 (c = 2, 3).
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int j = j0 + nt * 8 + 2 * t4 + (c & 1), half = c >> 1;
      float x = s[nt][c] * sl2;
      const bool in = j >= klo && j < kmax && row_ok[half];
      if (in && mask_kind == 1) {
        if (!((const bool*)mask)[(half ? mr1 : mr0) + j * ms3]) x = -3.402823466e38f;
      } else if (in && mask_kind == 2) {
        x += widen(((const T*)mask)[(half ? mr1 : mr0) + j * ms3]) * ATT_LOG2E;
      }
      s[nt][c] = in ? x : -INFINITY;
    }
  float alpha[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = fmaxf(fmaxf(s[0][2 * r], s[0][2 * r + 1]), fmaxf(s[1][2 * r], s[1][2 * r + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float mn = fmaxf(mrow[r], mx), ms = mn == -INFINITY ? 0.0f : mn;
    alpha[r] = exp2f(mrow[r] - ms);
    mrow[r] = mn;
    float sum = 0.0f;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      s[nt][2 * r] = exp2f(s[nt][2 * r] - ms);
      s[nt][2 * r + 1] = exp2f(s[nt][2 * r + 1] - ms);
      sum += s[nt][2 * r] + s[nt][2 * r + 1];
    }
    lrow[r] = lrow[r] * alpha[r] + sum;
  }
#pragma unroll
  for (int d = 0; d < DV / 8; ++d) {
    o[d][0] *= alpha[0];
    o[d][1] *= alpha[0];
    o[d][2] *= alpha[1];
    o[d][3] *= alpha[1];
  }
  u32 pf[4];
  att_frag<T>(pf, s, 0);
#pragma unroll
  for (int dp = 0; dp < DV / 16; ++dp) {
    u32 bfr[4];
    ldsm_x4_t(bfr, vaddr((m & 1) * 8 + g8, dp * 16 + (m >> 1) * 8));
    mma_m16n8k16<T>(o[2 * dp], pf, bfr[0], bfr[1]);
    mma_m16n8k16<T>(o[2 * dp + 1], pf, bfr[2], bfr[3]);
  }
}

// The rows' queries (zeros past the group's nrows) staged through `qsh` (rows of D features
// and a 16-byte pad) by the first `threads` threads, then their A fragments. Ends with a
// barrier of those threads (named barrier 1 unless they are the whole block).
template <typename T, int D>
__device__ __forceinline__ void att_vector_queries(u32 (&qf)[D / 16][4], unsigned char* qsh, const T* qrow, i64 qs1,
                                                   int nrows, int threads, int lane) {
  constexpr int KROW = D * 2 + 16, KCH = D * 2 / 16;
  for (int x = threadIdx.x; x < 16 * KCH; x += threads) {
    const int r = x / KCH, c = x % KCH;
    int4 val = make_int4(0, 0, 0, 0);
    if (r < nrows) {
      const T* src = qrow + r * qs1 + c * 8;
      T tmp[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) tmp[u] = src[u];
      val = *reinterpret_cast<int4*>(tmp);
    }
    *reinterpret_cast<int4*>(qsh + r * KROW + c * 16) = val;
  }
  if (threads == (int)blockDim.x) __syncthreads();
  else asm volatile("bar.sync 1, %0;" ::"r"(threads) : "memory");
  const u32 qa = (u32)__cvta_generic_to_shared(qsh);
  const int m = lane >> 3, r = (m & 1) * 8 + (lane & 7);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) ldsm_x4(qf[kk], qa + r * KROW + (kk * 16 + (m >> 1) * 8) * 2);
}

// The end of a vector block: the NW warps' states merged in order through shared memory `so`
// (NW * 16 * DV floats, free by now), then each row's partition (two passes) or output. Starts
// with a barrier of the first NW warps (named barrier 1 unless they are the whole block).
template <typename T, int DV, int NW>
__device__ __forceinline__ void att_vector_store(float (&o)[DV / 8][4], float (&mrow)[2], float (&lrow)[2], float* so,
                                                 float (&sm)[NW][16], float (&sl)[NW][16], int nrows, int h0,
                                                 int b, int i, int p, int nb, int Hq, int Lq, i64 rows_total,
                                                 int blocks, const T* sinks, float* part, unsigned* count, T* out) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
  auto sync = [&] {
    if (NW * 32 == (int)blockDim.x) __syncthreads();
    else asm volatile("bar.sync 1, %0;" ::"n"(NW * 32) : "memory");
  };
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    lrow[r] += __shfl_xor_sync(0xffffffffu, lrow[r], 1);
    lrow[r] += __shfl_xor_sync(0xffffffffu, lrow[r], 2);
  }
  sync();  // every warp is done with the staged tiles
  if (t4 == 0) {
    sm[warp][g] = mrow[0];
    sm[warp][g + 8] = mrow[1];
    sl[warp][g] = lrow[0];
    sl[warp][g + 8] = lrow[1];
  }
#pragma unroll
  for (int d = 0; d < DV / 8; ++d)
#pragma unroll
    for (int c = 0; c < 4; ++c) so[(warp * 16 + g + (c >> 1) * 8) * DV + d * 8 + 2 * t4 + (c & 1)] = o[d][c];
  sync();
  for (int x = threadIdx.x; x < nrows * DV; x += NW * 32) {
    const int r = x / DV, c = x % DV;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < NW; ++w) M = fmaxf(M, sm[w][r]);
    float L = 0.0f, O = 0.0f;
#pragma unroll
    for (int w = 0; w < NW; ++w) {
      const float wg = sm[w][r] == -INFINITY ? 0.0f : exp2f(sm[w][r] - M);
      L += sl[w][r] * wg;
      O += so[(w * 16 + r) * DV + c] * wg;
    }
    const int h = h0 + r;
    const i64 row = ((i64)b * Hq + h) * Lq + i;
    if (part) {
      const i64 slot = row * blocks + p;
      part[slot * DV + c] = O;
      if (c == 0) {
        float* ml = part + rows_total * blocks * DV;
        ml[slot * 2] = M;
        ml[slot * 2 + 1] = L;
      }
    } else {
      const float sink = sinks ? widen(sinks[h]) * ATT_LOG2E : 0.0f;
      att_finish<T, DV>(M, L, O, sinks != 0, sink, out + row * DV + c);
    }
  }
  if (!part) return;
  // Both passes in one launch: the last of the rows' partitions to finish (counted per grid
  // column in `count`, which it leaves at zero) merges them all.
  __shared__ int last;
  __threadfence();
  sync();
  if (threadIdx.x == 0) last = atomicAdd(count + blockIdx.x, 1u) == (unsigned)nb - 1;
  sync();
  if (!last) return;
  __threadfence();
  if (threadIdx.x == 0) count[blockIdx.x] = 0;
  // All rows at once (the merge is the launch's tail): the partitions' maxima and sums into
  // shared memory (`so`, free again), each row's weights, then 4 columns of a row per thread.
  const i64 row0 = ((i64)b * Hq + h0) * Lq + i;  // row r is row0 + r Lq
  const float* ml = part + rows_total * blocks * DV;
  float *w = so, *ls = so + 16 * nb, *rm = ls + 16 * nb, *rl = rm + 16;
  for (int x = threadIdx.x; x < nrows * nb; x += NW * 32) {
    const int r = x / nb, q = x % nb;
    const float2 v = __ldcg(reinterpret_cast<const float2*>(ml + ((row0 + (i64)r * Lq) * blocks + q) * 2));
    w[x] = v.x;
    ls[x] = v.y;
  }
  sync();
  if (threadIdx.x < nrows) {
    const int r = threadIdx.x;
    float M = -INFINITY, L = 0.0f;
    for (int q = 0; q < nb; ++q) M = fmaxf(M, w[r * nb + q]);
    for (int q = 0; q < nb; ++q) {
      const float mq = w[r * nb + q], wq = mq == -INFINITY ? 0.0f : exp2f(mq - M);
      w[r * nb + q] = wq;
      L += ls[r * nb + q] * wq;
    }
    rm[r] = M;
    rl[r] = L;
  }
  sync();
  for (int x = threadIdx.x; x < nrows * (DV / 4); x += NW * 32) {
    const int r = x / (DV / 4), c = (x % (DV / 4)) * 4;
    const i64 row = row0 + (i64)r * Lq;
    const float* po = part + row * blocks * DV + c;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 8
    for (int q = 0; q < nb; ++q) {
      const float4 v = __ldcg(reinterpret_cast<const float4*>(po + (i64)q * DV));
      const float wq = w[r * nb + q];
      acc.x += v.x * wq;
      acc.y += v.y * wq;
      acc.z += v.z * wq;
      acc.w += v.w * wq;
    }
    const int h = h0 + r;
    const float sink = sinks ? widen(sinks[h]) * ATT_LOG2E : 0.0f;
    T* dst = out + row * DV + c;
    att_finish<T, DV>(rm[r], rl[r], acc.x, sinks != 0, sink, dst);
    att_finish<T, DV>(rm[r], rl[r], acc.y, sinks != 0, sink, dst + 1);
    att_finish<T, DV>(rm[r], rl[r], acc.z, sinks != 0, sink, dst + 2);
    att_finish<T, DV>(rm[r], rl[r], acc.w, sinks != 0, sink, dst + 3);
  }
}

// The block's rows and keys: grid x is batch x key-value heads x queries x groups of 16 grouped
// heads, grid y the partitions.
struct AttVectorBlock {
  int b, kh, i, h0, nrows, p, parts, kmin, kmax;
  bool any;
};
__device__ __forceinline__ AttVectorBlock att_vector_block(int Hq, int Hkv, int Lq, int Lk, int causal, int window,
                                                           int blocks) {
  AttVectorBlock a;
  const int G = Hq / Hkv, hgroups = (G + 15) / 16;
  const int hg = (int)(blockIdx.x % hgroups);
  a.i = (int)((blockIdx.x / hgroups) % Lq);
  a.kh = (int)((blockIdx.x / ((i64)hgroups * Lq)) % Hkv);
  a.b = (int)(blockIdx.x / ((i64)hgroups * Lq * Hkv));
  a.p = blockIdx.y;
  a.h0 = a.kh * G + hg * 16;
  a.nrows = min(16, G - hg * 16);
  int lo, hi, nb, chunk;
  att_range(a.i, Lq, Lk, causal, window, &lo, &hi);
  att_split(blocks, hi - lo, &nb, &chunk);
  a.any = a.p < nb;
  a.parts = nb;
  a.kmin = lo + a.p * chunk;
  a.kmax = min(hi, a.kmin + chunk);
  return a;
}

#define ATT_VECTOR_ARGS                                                                                      \
  const T *__restrict__ q, const T *__restrict__ k, const T *__restrict__ v, T *__restrict__ out,            \
      const void *__restrict__ mask, const T *__restrict__ sinks, float *__restrict__ part,                 \
      unsigned *__restrict__ count, i64 qs0, i64 qs1, i64 qs2, i64 ks0, i64 ks1, i64 ks2, i64 vs0, i64 vs1, \
      i64 vs2, i64 ms0, i64 ms1, i64 ms2, i64 ms3, int Hq, int Hkv, int Lq, int Lk, int causal, int window,  \
      int mask_kind, int blocks, float scale

// Dynamic shared memory of attention_vector_mma: ST stages of NW * 16 keys and values.
constexpr int att_vector_smem(int D, int DV, int NW, int ST) { return ST * NW * 16 * (D * 2 + 16 + DV * 2 + 16); }

// attention_vector_mma's block `a` with key j's row at k_at(j) and its value's at v_at(j).
template <typename T, int D, int DV, int NW, int ST, typename KAt, typename VAt>
__device__ __forceinline__ void att_vector_mma_run(const AttVectorBlock& a, KAt k_at, VAt v_at, const T* __restrict__ q,
                                                   T* __restrict__ out, const void* __restrict__ mask,
                                                   const T* __restrict__ sinks, float* __restrict__ part,
                                                   unsigned* __restrict__ count, i64 qs0, i64 qs1, i64 qs2, i64 ms0,
                                                   i64 ms1, i64 ms2, i64 ms3, int Hq, int Hkv, int Lq, int mask_kind,
                                                   int blocks, float scale) {
  constexpr int KT = NW * 16, KROW = D * 2 + 16, VROW = DV * 2 + 16;
  constexpr int STAGE = KT * (KROW + VROW);
  extern __shared__ __align__(16) unsigned char att_dyn[];
  __shared__ __align__(16) unsigned char qsh[16 * KROW];
  __shared__ float sm[NW][16], sl[NW][16];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2;
  const int kmin = a.kmin, kmax = a.kmax, tiles = (kmax - kmin + KT - 1) / KT;

  // The ring: tile t (keys kmin + t KT ..) in stage t % ST; keys at or past kmax are zeros.
  const u32 ring = (u32)__cvta_generic_to_shared(att_dyn);
  auto stage = [&](int t) {
    const u32 ks = ring + (t % ST) * STAGE;
    att_stage_at<T, D, KROW, KT, NW * 32>(ks, k_at, kmin + t * KT, kmax);
    att_stage_at<T, DV, VROW, KT, NW * 32>(ks + KT * KROW, v_at, kmin + t * KT, kmax);
  };
#pragma unroll
  for (int s = 0; s < ST - 1; ++s) {
    if (s < tiles) stage(s);
    att_commit();
  }
  u32 qf[D / 16][4];
  att_vector_queries<T, D>(qf, qsh, q + a.b * qs0 + a.h0 * qs1 + a.i * qs2, qs1, a.nrows, NW * 32, lane);
  const float sl2 = scale * ATT_LOG2E;
  const i64 mr0 = a.b * ms0 + (i64)(a.h0 + g) * ms1 + a.i * ms2, mr1 = mr0 + 8 * ms1;
  const bool row_ok[2] = {g < a.nrows, g + 8 < a.nrows};
  float o[DV / 8][4], mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f};
#pragma unroll
  for (int d = 0; d < DV / 8; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;

  for (int t = 0; t < tiles; ++t) {
    asm volatile("cp.async.wait_group %0;" ::"n"(ST - 2) : "memory");
    __syncthreads();  // tile t is in, and every warp is done with the stage refilled next
    if (t + ST - 1 < tiles) stage(t + ST - 1);
    att_commit();
    const int j0 = kmin + t * KT + warp * 16;
    if (j0 >= kmax) continue;
    const u32 ksa = ring + (t % ST) * STAGE + warp * 16 * KROW, vsa = ring + (t % ST) * STAGE + KT * KROW + warp * 16 * VROW;
    att_vector_keys<T, D, DV>(
        qf, o, mrow, lrow, [&](int r, int c) { return ksa + r * KROW + c * 2; },
        [&](int r, int c) { return vsa + r * VROW + c * 2; }, j0, kmin, kmax, row_ok, mask, mask_kind, mr0, mr1, ms3, sl2,
        lane);
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");
  att_vector_store<T, DV, NW>(o, mrow, lrow, reinterpret_cast<float*>(att_dyn), sm, sl, a.nrows, a.h0, a.b, a.i, a.p,
                              a.parts, Hq, Lq, (i64)gridDim.x / ((Hq / Hkv + 15) / 16) * (Hq / Hkv), blocks, sinks,
                              part, count, out);
}

template <typename T, int D, int DV, int NW, int ST>
__device__ __forceinline__ void attention_vector_mma(ATT_VECTOR_ARGS) {
  const AttVectorBlock a = att_vector_block(Hq, Hkv, Lq, Lk, causal, window, blocks);
  if (!a.any) return;
  const T* kb = k + a.b * ks0 + a.kh * ks1;
  const T* vb = v + a.b * vs0 + a.kh * vs1;
  att_vector_mma_run<T, D, DV, NW, ST>(
      a, [=](int j) { return kb + j * ks2; }, [=](int j) { return vb + j * vs2; }, q, out, mask, sinks, part, count,
      qs0, qs1, qs2, ms0, ms1, ms2, ms3, Hq, Hkv, Lq, mask_kind, blocks, scale);
}

// A paged kernel's block: sequence b's length, clamped to its table's capacity, as its keys
// (causal at the end).
__device__ __forceinline__ AttVectorBlock att_paged_block(const int* __restrict__ lengths, int bs_log2, int max_blocks,
                                                          int Hq, int Hkv, int Lq, int window, int blocks) {
  const int b = (int)(blockIdx.x / ((i64)((Hq / Hkv + 15) / 16) * Lq * Hkv));
  const int Lk = min(max(lengths[b], 0), max_blocks << bs_log2);
  return att_vector_block(Hq, Hkv, Lq, Lk, 1, window, blocks);
}

// Entry i of a table row, the id clamped into the cache's nblocks blocks.
__device__ __forceinline__ int att_paged_id(const int* __restrict__ row, int i, int nblocks) {
  return min(max(row[i], 0), nblocks - 1);
}

// Paged decode: attention_vector_mma's work over sequence b's keys, the first lengths[b]
// (clamped to the table's capacity) positions of the blocks its row of `tables` names in
// order (block ids clamped into the cache), causal at the end. Key j sits at position
// j % 2^bs_log2 of block tables[b][j >> bs_log2]; caches are [blocks, Hkv, block size, D] with
// strides (s0, s1, s2).
template <typename T, int D, int DV, int NW, int ST>
__device__ __forceinline__ void attention_paged_mma(
    const T* __restrict__ q, const T* __restrict__ kc, const T* __restrict__ vc, const int* __restrict__ tables,
    const int* __restrict__ lengths, T* __restrict__ out, const T* __restrict__ sinks, float* __restrict__ part,
    unsigned* __restrict__ count, i64 qs0, i64 qs1, i64 qs2, i64 ks0, i64 ks1, i64 ks2, i64 vs0, i64 vs1, i64 vs2,
    int nblocks, int bs_log2, int max_blocks, int Hq, int Hkv, int Lq, int window, int blocks, float scale) {
  const AttVectorBlock a = att_paged_block(lengths, bs_log2, max_blocks, Hq, Hkv, Lq, window, blocks);
  if (!a.any) return;
  const int* tb = tables + (i64)a.b * max_blocks;
  const int within = (1 << bs_log2) - 1;
  const T* kb = kc + a.kh * ks1;
  const T* vb = vc + a.kh * vs1;
  auto block_of = [=](int j) { return (i64)att_paged_id(tb, j >> bs_log2, nblocks); };
  att_vector_mma_run<T, D, DV, NW, ST>(
      a, [=](int j) { return kb + block_of(j) * ks0 + (j & within) * ks2; },
      [=](int j) { return vb + block_of(j) * vs0 + (j & within) * vs2; }, q, out, nullptr, sinks, part, count, qs0, qs1,
      qs2, 0, 0, 0, 0, Hq, Hkv, Lq, 0, blocks, scale);
}

// ---- tiled attention on Hopper (prefill, wgmma) -----------------------------------------------
// FlashAttention-3's forward (sm_90a): a block of 64 * NC query rows of one head is a producer
// warpgroup, whose one thread stages tiles by TMA, and NC consumer warpgroups of 64 rows on
// warpgroup MMAs. Tiles sit in shared memory in the 128-byte swizzled layout the MMAs read: rows
// of 64 features, a head of D features being D / 64 such column panels. S = Q K^T reads both
// operands from shared memory; O += P V takes P from the score registers and V transposed from
// shared memory. Masking, the online softmax and the finish are the mma.sync kernel's
// (att_softmax, with the flushing exponential, and att_store).

#define ATW_F8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
                  "+f"(d[i + 6]), "+f"(d[i + 7])

// d (64 x N, a warpgroup's accumulators) = A B (+ d when acc), A and B by shared-memory descriptor,
// both K-major (ss); d += A B, A from registers (fragments as mma.sync's), B transposed (rs).
template <typename T> __device__ __forceinline__ void atw_ss64(float (&d)[32], u64 a, u64 b, int acc) {
  if constexpr (IsBf16<T>::value) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %34, 0; wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;}"
                 : ATW_F8(0), ATW_F8(8), ATW_F8(16), ATW_F8(24) : "l"(a), "l"(b), "r"(acc));
  } else {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %34, 0; wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;}"
                 : ATW_F8(0), ATW_F8(8), ATW_F8(16), ATW_F8(24) : "l"(a), "l"(b), "r"(acc));
  }
}
template <typename T> __device__ __forceinline__ void atw_rs64(float (&d)[32], const u32 (&a)[4], u64 b) {
  if constexpr (IsBf16<T>::value) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %37, 0; wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;}"
                 : ATW_F8(0), ATW_F8(8), ATW_F8(16), ATW_F8(24) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
  } else {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %37, 0; wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;}"
                 : ATW_F8(0), ATW_F8(8), ATW_F8(16), ATW_F8(24) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
  }
}
template <typename T> __device__ __forceinline__ void atw_ss128(float (&d)[64], u64 a, u64 b, int acc) {
  if constexpr (IsBf16<T>::value) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %66, 0; wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;}"
                 : ATW_F8(0), ATW_F8(8), ATW_F8(16), ATW_F8(24), ATW_F8(32), ATW_F8(40), ATW_F8(48), ATW_F8(56) : "l"(a), "l"(b), "r"(acc));
  } else {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %66, 0; wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;}"
                 : ATW_F8(0), ATW_F8(8), ATW_F8(16), ATW_F8(24), ATW_F8(32), ATW_F8(40), ATW_F8(48), ATW_F8(56) : "l"(a), "l"(b), "r"(acc));
  }
}
template <typename T> __device__ __forceinline__ void atw_rs128(float (&d)[64], const u32 (&a)[4], u64 b) {
  if constexpr (IsBf16<T>::value) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %69, 0; wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;}"
                 : ATW_F8(0), ATW_F8(8), ATW_F8(16), ATW_F8(24), ATW_F8(32), ATW_F8(40), ATW_F8(48), ATW_F8(56) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
  } else {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %69, 0; wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;}"
                 : ATW_F8(0), ATW_F8(8), ATW_F8(16), ATW_F8(24), ATW_F8(32), ATW_F8(40), ATW_F8(48), ATW_F8(56) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
  }
}
template <typename T> __device__ __forceinline__ void atw_ss176(float (&d)[88], u64 a, u64 b, int acc) {
  if constexpr (IsBf16<T>::value) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %90, 0; wgmma.mma_async.sync.aligned.m64n176k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87}, %88, %89, p, 1, 1, 0, 0;}"
                 : ATW_F8(0), ATW_F8(8), ATW_F8(16), ATW_F8(24), ATW_F8(32), ATW_F8(40), ATW_F8(48), ATW_F8(56), ATW_F8(64), ATW_F8(72), ATW_F8(80) : "l"(a), "l"(b), "r"(acc));
  } else {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %90, 0; wgmma.mma_async.sync.aligned.m64n176k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87}, %88, %89, p, 1, 1, 0, 0;}"
                 : ATW_F8(0), ATW_F8(8), ATW_F8(16), ATW_F8(24), ATW_F8(32), ATW_F8(40), ATW_F8(48), ATW_F8(56), ATW_F8(64), ATW_F8(72), ATW_F8(80) : "l"(a), "l"(b), "r"(acc));
  }
}
template <typename T> __device__ __forceinline__ void atw_ss256(float (&d)[128], u64 a, u64 b, int acc) {
  if constexpr (IsBf16<T>::value) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %130, 0; wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 0;}"
                 : ATW_F8(0), ATW_F8(8), ATW_F8(16), ATW_F8(24), ATW_F8(32), ATW_F8(40), ATW_F8(48), ATW_F8(56), ATW_F8(64), ATW_F8(72), ATW_F8(80), ATW_F8(88), ATW_F8(96), ATW_F8(104), ATW_F8(112), ATW_F8(120) : "l"(a), "l"(b), "r"(acc));
  } else {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %130, 0; wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 0;}"
                 : ATW_F8(0), ATW_F8(8), ATW_F8(16), ATW_F8(24), ATW_F8(32), ATW_F8(40), ATW_F8(48), ATW_F8(56), ATW_F8(64), ATW_F8(72), ATW_F8(80), ATW_F8(88), ATW_F8(96), ATW_F8(104), ATW_F8(112), ATW_F8(120) : "l"(a), "l"(b), "r"(acc));
  }
}
template <typename T> __device__ __forceinline__ void atw_rs256(float (&d)[128], const u32 (&a)[4], u64 b) {
  if constexpr (IsBf16<T>::value) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %133, 0; wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;}"
                 : ATW_F8(0), ATW_F8(8), ATW_F8(16), ATW_F8(24), ATW_F8(32), ATW_F8(40), ATW_F8(48), ATW_F8(56), ATW_F8(64), ATW_F8(72), ATW_F8(80), ATW_F8(88), ATW_F8(96), ATW_F8(104), ATW_F8(112), ATW_F8(120) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
  } else {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %133, 0; wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;}"
                 : ATW_F8(0), ATW_F8(8), ATW_F8(16), ATW_F8(24), ATW_F8(32), ATW_F8(40), ATW_F8(48), ATW_F8(56), ATW_F8(64), ATW_F8(72), ATW_F8(80), ATW_F8(88), ATW_F8(96), ATW_F8(104), ATW_F8(112), ATW_F8(120) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
  }
}

// A shared-memory matrix descriptor: 128-byte swizzle; `lbo` and `sbo` in bytes.
__device__ __forceinline__ u64 atw_desc(u32 addr, u32 lbo, u32 sbo) {
  return (u64)((addr & 0x3FFFF) >> 4) | ((u64)(lbo >> 4) << 16) | ((u64)(sbo >> 4) << 32) | (1ull << 62);
}
// The same on accumulators held as N / 8 tiles of 8 columns (mma.sync's layout, in order).
template <int N, typename T> __device__ __forceinline__ void atw_ss(float (&acc8)[N / 8][4], u64 a, u64 b, int acc) {
  float(&d)[N / 2] = reinterpret_cast<float(&)[N / 2]>(acc8);
  if constexpr (N == 64) atw_ss64<T>(d, a, b, acc);
  else if constexpr (N == 128) atw_ss128<T>(d, a, b, acc);
  else if constexpr (N == 176) atw_ss176<T>(d, a, b, acc);
  else atw_ss256<T>(d, a, b, acc);
}
template <int N, typename T> __device__ __forceinline__ void atw_rs(float (&acc8)[N / 8][4], const u32 (&a)[4], u64 b) {
  float(&d)[N / 2] = reinterpret_cast<float(&)[N / 2]>(acc8);
  if constexpr (N == 64) atw_rs64<T>(d, a, b);
  else if constexpr (N == 128) atw_rs128<T>(d, a, b);
  else atw_rs256<T>(d, a, b);
}
__device__ __forceinline__ void atw_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void atw_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void atw_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
// Keeps the compiler from moving reads of accumulators above the wait that completes them.
template <int N> __device__ __forceinline__ void atw_hold(float (&d)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int c = 0; c < 4; ++c) asm volatile("" : "+f"(d[i][c])::"memory");
}
// mbarriers: the producer's staged tiles (full) and the consumers' releases (empty).
__device__ __forceinline__ void atw_bar_init(u32 bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void atw_bar_wait(u32 bar, u32 parity) {
  u32 done;
  do {
    asm volatile("{.reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p;}"
                 : "=r"(done)
                 : "r"(bar), "r"(parity)
                 : "memory");
  } while (!done);
}
__device__ __forceinline__ void atw_bar_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
// Waits for a staged tile (TMA writes through the async proxy the MMAs read by).
__device__ __forceinline__ void atw_acquire(u32 bar, u32 parity) { atw_bar_wait(bar, parity); }
// A consumer warp is done reading a stage: its first lane arrives for the warp.
__device__ __forceinline__ void atw_release(u32 bar, int lane) {
  __syncwarp();
  if (lane == 0) atw_bar_arrive(bar);
}

// Named barriers 1..NC that make the NC consumer warpgroups take turns, in a cycle, issuing
// their MMAs, so one's softmax runs while another's products use the tensor cores.
__device__ __forceinline__ void atw_turn_wait(int c) { asm volatile("bar.sync %0, 256;" ::"r"(1 + c) : "memory"); }
template <int NC> __device__ __forceinline__ void atw_turn_pass(int c) {
  asm volatile("bar.arrive %0, 256;" ::"r"(1 + (c + 1) % NC) : "memory");
}

// A TMA tensor map (CUtensorMap), passed by value as a __grid_constant__ kernel parameter.
struct alignas(64) AtwMap {
  u64 bits[16];
};
// Arrives on `bar` expecting `bytes` more from the TMA copies that complete on it.
__device__ __forceinline__ void atw_expect(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
// Copies `rows` rows of features [0, D) from (row0, head, batch) of the [B, H, L, D] tensor of
// `m` into D / 64 swizzled panels of [rows][64] at `dst`, completing on `bar`; rows past L are
// zeros.
template <int D, int ROWS>
__device__ __forceinline__ void atw_tma(u32 dst, const AtwMap* m, int row0, int head, int batch, u32 bar) {
#pragma unroll
  for (int p = 0; p < D / 64; ++p)
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, "
        "%5}], [%6];" ::"r"(dst + p * ROWS * 128),
        "l"(reinterpret_cast<u64>(m)), "r"(p * 64), "r"(row0), "r"(head), "r"(batch), "r"(bar)
        : "memory");
}

// Dynamic shared memory of a block of NC consumer warpgroups: the 1024-byte alignment slack, the
// queries, ST stages of keys and of values, and the barriers.
constexpr int atw_smem(int D, int BC, int NC, int ST) { return 1024 + 64 * NC * D * 2 + 2 * ST * BC * D * 2 + 128; }

// A block is a producer warpgroup, whose first thread stages the queries and each key and value
// tile by TMA into ST-deep rings guarded by mbarriers, and NC consumer warpgroups of 64
// query rows each. A consumer issues the next tile's scores before it waits on this tile's
// P V, so the softmax of one runs while the tensor cores do the other.
template <typename T, int D, int BC, int NC, int ST>
__device__ __forceinline__ void attention_wgmma(const AtwMap* mq, const AtwMap* mk, const AtwMap* mv,
                                                T* __restrict__ out, float* __restrict__ lse,
                                                const T* __restrict__ sinks, int Hq, int Hkv, int Lq, int Lk,
                                                int causal, int window, float scale) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int KB = BC * D * 2;
  extern __shared__ __align__(1024) unsigned char atw_dyn[];
  const u32 sq = ((u32)__cvta_generic_to_shared(atw_dyn) + 1023) & ~1023u;
  constexpr int BR = 64 * NC;
  const u32 sk = sq + BR * D * 2, sv = sk + ST * KB, bars = sv + ST * KB;
  // Barriers (8 bytes each): the queries, then per stage key full/empty and value full/empty.
  const u32 qfull = bars;
  auto kfull = [&](int s) { return bars + 8 + s * 32; };
  auto kempty = [&](int s) { return bars + 16 + s * 32; };
  auto vfull = [&](int s) { return bars + 24 + s * 32; };
  auto vempty = [&](int s) { return bars + 32 + s * 32; };
  const int qt = gridDim.x - 1 - blockIdx.x;  // the longest causal tiles first
  const int h = blockIdx.y % Hq, b = blockIdx.y / Hq, kh = h / (Hq / Hkv);
  const int q0 = qt * BR, off = Lk - Lq;
  int kend = causal ? min(Lk, q0 + BR - 1 + off + 1) : Lk;
  kend = max(kend, 0);
  const int kbeg = (causal && window > 0) ? max(0, q0 + off - window + 1) : 0;
  const int jt0 = kbeg / BC, jt1 = (kend + BC - 1) / BC;
  if (threadIdx.x == 0) {
    atw_bar_init(qfull, 1);
    for (int s = 0; s < ST; ++s) {
      atw_bar_init(kfull(s), 1);
      atw_bar_init(vfull(s), 1);
      atw_bar_init(kempty(s), 4 * NC);
      atw_bar_init(vempty(s), 4 * NC);
    }
  }
  __syncthreads();

  const int wg = threadIdx.x >> 7, t = threadIdx.x & 127;
  if (wg == 0) {
    // The producer: one thread issuing TMA copies; the consumers take the register file.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;");
    if (t != 0) return;
    atw_expect(qfull, BR * D * 2);
    atw_tma<D, BR>(sq, mq, q0, h, b, qfull);
    for (int jt = jt0; jt < jt1; ++jt) {
      const int n = jt - jt0, st = n % ST;
      const u32 use = (u32)(n / ST);
      if (use > 0) atw_bar_wait(kempty(st), (use - 1) & 1);
      atw_expect(kfull(st), KB);
      atw_tma<D, BC>(sk + st * KB, mk, jt * BC, kh, b, kfull(st));
      if (use > 0) atw_bar_wait(vempty(st), (use - 1) & 1);
      atw_expect(vfull(st), KB);
      atw_tma<D, BC>(sv + st * KB, mv, jt * BC, kh, b, vfull(st));
    }
    return;
  }
  if constexpr (NC == 2) asm volatile("setmaxnreg.inc.sync.aligned.u32 240;");
  else asm volatile("setmaxnreg.inc.sync.aligned.u32 160;");
  const int c = wg - 1, warp = t >> 5, lane = t & 31, g = lane >> 2, t4 = lane & 3;
  const int w0 = q0 + c * 64;  // this warpgroup's first row
  const float sl2 = scale * ATT_LOG2E;
  const int r0 = w0 + warp * 16 + g;  // this thread's rows: r0 and r0 + 8
  float o[D / 8][4], s[BC / 8][4], mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f}, alpha[2];
  u32 p[BC / 16][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;

  // S = Q K^T for the tile in stage st.
  auto scores = [&](int st) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const u32 col = (kk & 3) * 32;
      const u64 da = atw_desc(sq + (kk >> 2) * (BR * 128) + c * 64 * 128 + col, 16, 1024);
      const u64 db = atw_desc(sk + st * KB + (kk >> 2) * (BC * 128) + col, 16, 1024);
      atw_ss<BC, T>(s, da, db, kk > 0);
    }
  };
  // O += P V for the tile in stage st.
  auto values = [&](int st) {
#pragma unroll
    for (int kk = 0; kk < BC / 16; ++kk)
      atw_rs<D, T>(o, p[kk], atw_desc(sv + st * KB + kk * 16 * 128, BC * 128, 1024));
  };
  auto pack = [&]() {
#pragma unroll
    for (int kk = 0; kk < BC / 16; ++kk) att_frag<T>(p[kk], s, kk);
  };

  // Turns: the first consumer issues first; the second passes no turn after its last.
  auto rescale = [&]() {
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      o[i][0] *= alpha[0];
      o[i][1] *= alpha[0];
      o[i][2] *= alpha[1];
      o[i][3] *= alpha[1];
    }
  };

  // Turns: the first consumer issues first; the last passes no turn after its last.
  if (c == NC - 1 && jt0 < jt1) atw_turn_pass<NC>(c);
  if (jt0 < jt1) {
    atw_acquire(qfull, 0);
    atw_turn_wait(c);
    atw_acquire(kfull(0), 0);
    atw_fence();
    scores(0);
    atw_commit();
    atw_turn_pass<NC>(c);
    atw_wait0();
    atw_hold<BC / 8>(s);
    atw_release(kempty(0), lane);
    att_softmax<BC / 8, true>(s, mrow, lrow, alpha, jt0 * BC, w0, 64, r0, t4, Lk, off, causal, window, sl2);
    pack();
    for (int jt = jt0 + 1; jt < jt1; ++jt) {
      const int n = jt - jt0, st = n % ST, pst = (n - 1) % ST;
      atw_turn_wait(c);
      atw_acquire(kfull(st), (u32)(n / ST) & 1);
      atw_fence();
      scores(st);
      atw_commit();
      // The previous tile's P V, on outputs rescaled to its maximum while these scores run.
      rescale();
      atw_acquire(vfull(pst), (u32)((n - 1) / ST) & 1);
      atw_fence();
      values(pst);
      atw_commit();
      atw_turn_pass<NC>(c);
      asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
      atw_hold<BC / 8>(s);
      atw_release(kempty(st), lane);
      att_softmax<BC / 8, true>(s, mrow, lrow, alpha, jt * BC, w0, 64, r0, t4, Lk, off, causal, window, sl2);
      atw_wait0();
      atw_hold<D / 8>(o);
      atw_release(vempty(pst), lane);
      pack();
    }
    const int n = jt1 - 1 - jt0, pst = n % ST;
    atw_turn_wait(c);
    rescale();
    atw_acquire(vfull(pst), (u32)(n / ST) & 1);
    atw_fence();
    values(pst);
    atw_commit();
    if (c < NC - 1) atw_turn_pass<NC>(c);
    atw_wait0();
    atw_hold<D / 8>(o);
    atw_release(vempty(pst), lane);
  }

  att_store<T, D / 8>(o, mrow, lrow, r0, t4, b, h, Hq, Lq, lse, sinks, out);
#endif
}

// ---- vector attention on Hopper (decode, TMA) -------------------------------------------------
// attention_vector_mma's work with the ring filled by TMA: warp NW of the block is the producer,
// whose first lane copies tile after tile of keys and values (D / 64 swizzled panels each) into
// ST stages as soon as the consumer warps release them (mbarriers), so the copies run ahead of
// the MMAs without a block-wide barrier per tile.

// Dynamic shared memory of attention_vector_tma: the 1024-byte alignment slack, ST stages of
// NW * 16 keys and values, the barriers.
constexpr int att_vector_tma_smem(int D, int NW, int ST) { return 1024 + ST * 2 * NW * 16 * D * 2 + 16 * ST; }

// The TMA kernel's block `a` over tiles of keys from kbase (a.kmin or below it; keys before
// a.kmin are masked): load(row0, stage, bar, lane), called by every lane of the producer warp,
// issues the copies of the keys and values of the tile from row0 into the stage (keys, then
// values) and the expected bytes on bar.
template <typename T, int D, int NW, int ST, typename Load>
__device__ __forceinline__ void att_vector_tma_run(const AttVectorBlock& a, int kbase, Load load,
                                                   const T* __restrict__ q, T* __restrict__ out,
                                                   const void* __restrict__ mask, const T* __restrict__ sinks,
                                                   float* __restrict__ part, unsigned* __restrict__ count, i64 qs0,
                                                   i64 qs1, i64 qs2, i64 ms0, i64 ms1, i64 ms2, i64 ms3, int Hq,
                                                   int Hkv, int Lq, int mask_kind, int blocks, float scale) {
  constexpr int KT = NW * 16, PANEL = KT * 128, TILE = KT * D * 2;
  extern __shared__ __align__(1024) unsigned char atd_dyn[];
  __shared__ __align__(16) unsigned char qsh[16 * (D * 2 + 16)];
  __shared__ float sm[NW][16], sl[NW][16];
  const u32 ring = ((u32)__cvta_generic_to_shared(atd_dyn) + 1023) & ~1023u, bars = ring + ST * 2 * TILE;
  auto full = [&](int s) { return bars + s * 16; };
  auto empty = [&](int s) { return bars + s * 16 + 8; };
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2;
  const int kmin = a.kmin, kmax = a.kmax, tiles = (kmax - kbase + KT - 1) / KT;
  if (threadIdx.x == 0) {
    for (int s = 0; s < ST; ++s) {
      atw_bar_init(full(s), 1);
      atw_bar_init(empty(s), NW);
    }
  }
  __syncthreads();
  if (warp == NW) {
    // The producer warp (load issues from its first lane): rows outside [kmin, kmax) are masked.
    for (int t = 0; t < tiles; ++t) {
      const int s = t % ST;
      if (t >= ST) atw_bar_wait(empty(s), (u32)(t / ST - 1) & 1);
      load(kbase + t * KT, ring + s * 2 * TILE, full(s), lane);
    }
    return;
  }
  u32 qf[D / 16][4];
  att_vector_queries<T, D>(qf, qsh, q + a.b * qs0 + a.h0 * qs1 + a.i * qs2, qs1, a.nrows, NW * 32, lane);
  const float sl2 = scale * ATT_LOG2E;
  const i64 mr0 = a.b * ms0 + (i64)(a.h0 + g) * ms1 + a.i * ms2, mr1 = mr0 + 8 * ms1;
  const bool row_ok[2] = {g < a.nrows, g + 8 < a.nrows};
  float o[D / 8][4], mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f};
#pragma unroll
  for (int d = 0; d < D / 8; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
  // Key r's 8 features from c: panel c / 64, row r, 16-byte chunk (c % 64) / 8 swizzled by r % 8.
  auto swz = [](u32 base, int r, int c) { return base + (c >> 6) * PANEL + r * 128 + ((((c & 63) >> 3) ^ (r & 7)) << 4); };
  for (int t = 0; t < tiles; ++t) {
    const int s = t % ST, j0 = kbase + t * KT + warp * 16;
    atw_bar_wait(full(s), (u32)(t / ST) & 1);
    if (j0 < kmax && j0 + 16 > kmin) {
      const u32 kt = ring + s * 2 * TILE, vt = kt + TILE;
      att_vector_keys<T, D, D>(
          qf, o, mrow, lrow, [&](int r, int c) { return swz(kt, warp * 16 + r, c); },
          [&](int r, int c) { return swz(vt, warp * 16 + r, c); }, j0, kmin, kmax, row_ok, mask, mask_kind, mr0, mr1,
          ms3, sl2, lane);
    }
    atw_release(empty(s), lane);
  }
  att_vector_store<T, D, NW>(o, mrow, lrow, reinterpret_cast<float*>(atd_dyn + (ring - (u32)__cvta_generic_to_shared(atd_dyn))),
                             sm, sl, a.nrows, a.h0, a.b, a.i, a.p, a.parts, Hq, Lq,
                             (i64)gridDim.x / ((Hq / Hkv + 15) / 16) * (Hq / Hkv), blocks, sinks, part, count, out);
}

template <typename T, int D, int NW, int ST>
__device__ __forceinline__ void attention_vector_tma(const AtwMap* mk, const AtwMap* mv, const T* __restrict__ q,
                                                     T* __restrict__ out, const void* __restrict__ mask,
                                                     const T* __restrict__ sinks, float* __restrict__ part,
                                                     unsigned* __restrict__ count, i64 qs0, i64 qs1, i64 qs2, i64 ms0, i64 ms1, i64 ms2, i64 ms3, int Hq,
                                                     int Hkv, int Lq, int Lk, int causal, int window, int mask_kind,
                                                     int blocks, float scale) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int KT = NW * 16, TILE = KT * D * 2;
  const AttVectorBlock a = att_vector_block(Hq, Hkv, Lq, Lk, causal, window, blocks);
  if (!a.any) return;
  // Rows past Lk arrive as zeros.
  auto load = [&](int row0, u32 dst, u32 bar, int lane) {
    if (lane != 0) return;
    atw_expect(bar, 2 * TILE);
    atw_tma<D, KT>(dst, mk, row0, a.kh, a.b, bar);
    atw_tma<D, KT>(dst + TILE, mv, row0, a.kh, a.b, bar);
  };
  att_vector_tma_run<T, D, NW, ST>(a, a.kmin, load, q, out, mask, sinks, part, count, qs0, qs1, qs2, ms0, ms1, ms2,
                                   ms3, Hq, Hkv, Lq, mask_kind, blocks, scale);
#endif
}

// Paged decode on Hopper: attention_paged_mma's work with the ring filled by TMA. The maps
// view each cache as [blocks, Hkv, block size, D] in boxes of `rows` = min(block size, tile)
// positions, so a tile of keys is tile / rows boxes per 64-feature panel, each from the block
// the table names (its index and id clamped). Tiles start at multiples of `rows`; positions
// past a sequence's length are read and masked, so they must hold finite values (as the
// composition, whose product multiplies them by zero, needs too).
template <typename T, int D, int NW, int ST>
__device__ __forceinline__ void attention_paged_tma(const AtwMap* mk, const AtwMap* mv, const T* __restrict__ q,
                                                    const int* __restrict__ tables, const int* __restrict__ lengths,
                                                    T* __restrict__ out, const T* __restrict__ sinks,
                                                    float* __restrict__ part, unsigned* __restrict__ count, i64 qs0,
                                                    i64 qs1, i64 qs2, int nblocks, int bs_log2, int max_blocks,
                                                    int rows, int Hq, int Hkv, int Lq, int window, int blocks,
                                                    float scale) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int KT = NW * 16, PANEL = KT * 128, TILE = KT * D * 2;
  const AttVectorBlock a = att_paged_block(lengths, bs_log2, max_blocks, Hq, Hkv, Lq, window, blocks);
  if (!a.any) return;
  const int* tb = tables + (i64)a.b * max_blocks;
  const int within = (1 << bs_log2) - 1;
  // The warp's lanes hold the block ids of 32 consecutive boxes from box `first`, loaded at once
  // (one wait on memory per 32 boxes, not one per box).
  int first = -32, ids = 0;
  const int box_log2 = 31 - __clz(rows);
  auto load = [&](int row0, u32 dst, u32 bar, int lane) {
    if (lane == 0) atw_expect(bar, 2 * TILE);
    for (int r = 0; r < KT; r += rows) {
      const int j = row0 + r, box = j >> box_log2;
      if (box - first >= 32) {
        first = box;
        const int at = min(((first + lane) << box_log2) >> bs_log2, max_blocks - 1);
        ids = att_paged_id(tb, at, nblocks);
      }
      const int id = __shfl_sync(0xffffffffu, ids, box - first);
      if (lane != 0) continue;
#pragma unroll
      for (int p = 0; p < D / 64; ++p)
#pragma unroll
        for (int m = 0; m < 2; ++m)
          asm volatile(
              "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, "
              "%4, %5}], [%6];" ::"r"(dst + m * TILE + p * PANEL + r * 128),
              "l"(reinterpret_cast<u64>(m ? mv : mk)), "r"(p * 64), "r"(j & within), "r"(a.kh), "r"(id), "r"(bar)
              : "memory");
    }
  };
  att_vector_tma_run<T, D, NW, ST>(a, a.kmin & ~(rows - 1), load, q, out, nullptr, sinks, part, count, qs0, qs1, qs2,
                                   0, 0, 0, 0, Hq, Hkv, Lq, 0, blocks, scale);
#endif
}

// ---- backward on Hopper (wgmma) -----------------------------------------------------------------
// FlashAttention-3's backward (sm_90a): a block owns 128 keys of one key-value head. A producer
// warpgroup's first thread stages the keys and values once, then per step the 64 query rows of
// one head of the group (Q, dO and the rows' statistics) by TMA into two-stage rings; two consumer
// warpgroups own 64 keys each. Per step a consumer makes S^T = K Q^T and dP^T = V dO^T by wgmma
// from shared memory, P^T (from the rows' log-sum-exp) and dS^T = P^T (dP^T - delta) in
// registers, accumulates dV += P^T dO and dK += dS^T Q with those as register operands, and
// writes dS^T transposed to shared memory (stmatrix), from which dQ = dS K (64 features per
// consumer; at D 64 the first consumer's) is made after a barrier and added to float32 by
// vector atomics while the tensor cores make dV and dK.

// d = A B with B transposed (MN-major), both by descriptor: dQ = dS K reads K as it is staged.
template <typename T> __device__ __forceinline__ void atw_sst64(float (&d)[32], u64 a, u64 b, int acc) {
  if constexpr (IsBf16<T>::value) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %34, 0; wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 1;}"
                 : ATW_F8(0), ATW_F8(8), ATW_F8(16), ATW_F8(24) : "l"(a), "l"(b), "r"(acc));
  } else {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %34, 0; wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 1;}"
                 : ATW_F8(0), ATW_F8(8), ATW_F8(16), ATW_F8(24) : "l"(a), "l"(b), "r"(acc));
  }
}

#define ATV_BR 64  // query rows per step
#define ATV_BC 128  // keys per block

// Dynamic shared memory of a block: alignment slack, keys and values, two stages of queries and
// cotangents, two dS tiles, two stages of the rows' statistics, the barriers.
constexpr int atv_smem(int D) {
  return 1024 + 2 * ATV_BC * D * 2 + 2 * 2 * ATV_BR * D * 2 + 2 * ATV_BR * ATV_BC * 2 + 2 * 2 * ATV_BR * 4 + 64;
}

// The rows' statistics for the Hopper backward, by 64-row tiles of each head: 64 values of
// lse * log2(e) (+inf past Lq or for a row without keys, so that its P is 0), then 64 of
// delta = rowsum(dO * O). A warp per padded row.
template <typename T, int D>
__device__ __forceinline__ void attention_backward_stats(const T* __restrict__ o, const T* __restrict__ g,
                                                         const float* __restrict__ lse, float* __restrict__ stats,
                                                         i64 heads, int Lq) {
  const int tiles = (Lq + ATV_BR - 1) / ATV_BR;
  const i64 r = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (r >= heads * tiles * ATV_BR) return;
  const i64 bh = r / (tiles * ATV_BR);
  const int i = (int)(r % (tiles * ATV_BR)), lane = threadIdx.x & 31;
  float s = 0.0f, l2 = INFINITY;
  if (i < Lq) {
    const i64 row = bh * Lq + i;
    s = att_row_dot<T, D>(o, g, row, lane);
    const float l = lse[row];
    l2 = l == -INFINITY ? INFINITY : l * ATT_LOG2E;
  }
  if (lane == 0) {
    float* dst = stats + (bh * tiles + i / ATV_BR) * 2 * ATV_BR + i % ATV_BR;
    dst[0] = l2;
    dst[ATV_BR] = s;
  }
}

template <bool B> struct AtvBool {
  static constexpr bool value = B;
};

// Stores four 8x8 tiles of 2-byte values transposed (the accumulators' fragments, as mma's A).
__device__ __forceinline__ void atv_stsm4t(u32 addr, const u32 (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(r[0]),
               "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

template <typename T, int D>
__device__ __forceinline__ void attention_backward_wgmma(const AtwMap* mq, const AtwMap* mk, const AtwMap* mv,
                                                         const AtwMap* mg, const float* __restrict__ stats,
                                                         float* __restrict__ dq, T* __restrict__ dk, T* __restrict__ dv,
                                                         int Hq, int Hkv, int Lq, int Lk, int causal, int window,
                                                         float scale, int chunk, int split,
                                                         float* __restrict__ dkv) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int BC = ATV_BC, BR = ATV_BR, QB = BR * D * 2, KB = BC * D * 2, DSB = BR * BC * 2;
  extern __shared__ __align__(1024) unsigned char atv_dyn[];
  const u32 sk = ((u32)__cvta_generic_to_shared(atv_dyn) + 1023) & ~1023u;
  const u32 sv = sk + KB, sq = sv + KB, sg = sq + 2 * QB, sds = sg + 2 * QB, sst = sds + 2 * DSB;
  const u32 bars = sst + 2 * 2 * BR * 4, kvfull = bars;
  auto full = [&](int s) { return bars + 8 + s * 16; };
  auto empty = [&](int s) { return bars + 16 + s * 16; };
  // With `split` > 1 a key tile's query heads are split between that many blocks (more, shorter
  // blocks where few would leave SMs idle), which add dK and dV to float32 `dkv` ([dK; dV]).
  // Heads (x split) in chunks of `chunk` (whose queries, cotangents and dQ stay in L2 while the
  // chunk runs), key tiles slowest within a chunk, so that (causal) the tiles most query rows
  // attend start first.
  const int ktiles = (Lk + BC - 1) / BC, heads = gridDim.x / ktiles;
  const int c0 = blockIdx.x / (chunk * ktiles) * chunk, cn = min(chunk, heads - c0);
  const int kt = (blockIdx.x - c0 * ktiles) / cn, vh = c0 + (blockIdx.x - c0 * ktiles) % cn;
  const int bh = vh / split, group = Hq / Hkv, hs = group / split;
  const int kh = bh % Hkv, b = bh / Hkv, h1 = kh * group + (vh % split) * hs, off = Lk - Lq, j0 = kt * BC;
  const int tiles = (Lq + BR - 1) / BR;
  const int ibeg = causal ? max(0, j0 - off) : 0;
  const int iend = (causal && window > 0) ? min(Lq, j0 + BC - 1 + window - off) : Lq;
  const int it0 = ibeg / BR, nt = iend > ibeg ? (iend + BR - 1) / BR - it0 : 0, steps = hs * nt;
  if (threadIdx.x == 0) {
    atw_bar_init(kvfull, 1);
    for (int s = 0; s < 2; ++s) {
      atw_bar_init(full(s), 1);
      atw_bar_init(empty(s), 8);
    }
  }
  __syncthreads();

  const int wg = threadIdx.x >> 7, t = threadIdx.x & 127;
  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;");
    if (t != 0 || steps == 0) return;
    atw_expect(kvfull, 2 * KB);
    atw_tma<D, BC>(sk, mk, j0, kh, b, kvfull);
    atw_tma<D, BC>(sv, mv, j0, kh, b, kvfull);
    for (int n = 0; n < steps; ++n) {
      const int st = n & 1, h = h1 + n / nt, i0 = (it0 + n % nt) * BR;
      if (n >= 2) atw_bar_wait(empty(st), ((n >> 1) - 1) & 1);
      atw_expect(full(st), 2 * QB + 2 * BR * 4);
      atw_tma<D, BR>(sq + st * QB, mq, i0, h, b, full(st));
      atw_tma<D, BR>(sg + st * QB, mg, i0, h, b, full(st));
      const float* src = stats + (((i64)b * Hq + h) * tiles + i0 / BR) * 2 * BR;
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                       sst + st * 2 * BR * 4),
                   "l"(src), "r"(2 * BR * 4), "r"(full(st))
                   : "memory");
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;");
  const int c = wg - 1, warp = t >> 5, lane = t & 31, g = lane >> 2, t4 = lane & 3;
  const int jr = j0 + c * 64 + warp * 16 + g;  // this thread's keys: jr and jr + 8
  const float sl2 = scale * ATT_LOG2E;
  float dka[D / 8][4], dva[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dka[n][e] = dva[n][e] = 0.0f;
  // dQ's feature panel: at D 128 each consumer takes one, at D 64 the first takes the only one
  // (splitting the keys instead measured slower: twice the atomic additions).
  const int FP = D == 128 ? c : 0;
  if (steps > 0) atw_bar_wait(kvfull, 0);
  // The steps, in a copy per role (a branch around wgmma would serialise them).
  auto run = [&](auto makes) {
  constexpr bool makes_dq = decltype(makes)::value;
  for (int n = 0; n < steps; ++n) {
    const int st = n & 1, h = h1 + n / nt, i0 = (it0 + n % nt) * BR;
    const u32 q_ = sq + st * QB, g_ = sg + st * QB, ds_ = sds + st * DSB;
    const float* lse2 = reinterpret_cast<const float*>(atv_dyn + (sst + st * 2 * BR * 4 - (u32)__cvta_generic_to_shared(atv_dyn)));
    const float* dl = lse2 + BR;
    atw_bar_wait(full(st), (n >> 1) & 1);
    float s[BR / 8][4], dp[BR / 8][4];
    atw_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const u32 col = (kk & 3) * 32;
      atw_ss<BR, T>(s, atw_desc(sk + (kk >> 2) * (BC * 128) + c * 64 * 128 + col, 16, 1024),
                    atw_desc(q_ + (kk >> 2) * (BR * 128) + col, 16, 1024), kk > 0);
    }
    atw_commit();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const u32 col = (kk & 3) * 32;
      atw_ss<BR, T>(dp, atw_desc(sv + (kk >> 2) * (BC * 128) + c * 64 * 128 + col, 16, 1024),
                    atw_desc(g_ + (kk >> 2) * (BR * 128) + col, 16, 1024), kk > 0);
    }
    atw_commit();
    asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
    atw_hold<BR / 8>(s);
    // P^T, zero outside each row's bounds (keys past Lk too: their K rows are zeros, P need not be).
    const bool inside = j0 + BC <= Lk && (!causal || j0 + BC - 1 <= i0 + off) &&
                        !(causal && window > 0 && j0 <= i0 + BR - 1 + off - window);
    if (inside) {
#pragma unroll
      for (int x = 0; x < BR / 8; ++x)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[x][e] = att_exp2<true>(fmaf(s[x][e], sl2, -lse2[x * 8 + 2 * t4 + (e & 1)]));
    } else {
#pragma unroll
      for (int x = 0; x < BR / 8; ++x)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = jr + (e >> 1) * 8, il = x * 8 + 2 * t4 + (e & 1), pos = i0 + il + off;
          const bool ok = j < Lk && (!causal || j <= pos) && !(causal && window > 0 && j <= pos - window);
          s[x][e] = ok ? att_exp2<true>(fmaf(s[x][e], sl2, -lse2[il])) : 0.0f;
        }
    }
    atw_wait0();
    atw_hold<BR / 8>(dp);
    // P^T and dS^T = P^T (dP^T - delta) (in place) as register operands.
    u32 pf[BR / 16][4], df[BR / 16][4];
#pragma unroll
    for (int kk = 0; kk < BR / 16; ++kk) {
#pragma unroll
      for (int x = 2 * kk; x < 2 * kk + 2; ++x)
#pragma unroll
        for (int e = 0; e < 4; ++e) dp[x][e] = s[x][e] * (dp[x][e] - dl[x * 8 + 2 * t4 + (e & 1)]);
      att_frag<T>(pf[kk], s, kk);
      att_frag<T>(df[kk], dp, kk);
    }
    // dS ([rows][keys], this consumer's keys the panel c) for dQ, in the 128-byte swizzle.
    {
      const int mi = lane >> 3, ch = warp * 2 + (mi & 1);
#pragma unroll
      for (int kk = 0; kk < BR / 16; ++kk) {
        const int row = kk * 16 + (mi >> 1) * 8 + (lane & 7);
        atv_stsm4t(ds_ + c * (BR * 128) + row * 128 + ((ch ^ (row & 7)) << 4), df[kk]);
      }
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    asm volatile("bar.sync 1, 256;" ::: "memory");
    // dQ (64 rows x 64 features) = dS K first, then dV += P^T dO and dK += dS^T Q (dO and Q
    // transposed: MN-major), so that dQ's additions run under those.
    float dqa[8][4];
    atw_fence();
    if constexpr (makes_dq) {
#pragma unroll
      for (int kk = 0; kk < BC / 16; ++kk)
        atw_sst64<T>(reinterpret_cast<float(&)[32]>(dqa),
                     atw_desc(ds_ + (kk >> 2) * (BR * 128) + (kk & 3) * 32, 16, 1024),
                     atw_desc(sk + FP * (BC * 128) + kk * 16 * 128, BC * 128, 1024), kk > 0);
    }
    atw_commit();
#pragma unroll
    for (int kk = 0; kk < BR / 16; ++kk) atw_rs<D, T>(dva, pf[kk], atw_desc(g_ + kk * 16 * 128, BR * 128, 1024));
#pragma unroll
    for (int kk = 0; kk < BR / 16; ++kk) atw_rs<D, T>(dka, df[kk], atw_desc(q_ + kk * 16 * 128, BR * 128, 1024));
    atw_commit();
    asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
    atw_hold<8>(dqa);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = i0 + warp * 16 + g + half * 8;
      if (i >= Lq || !makes_dq) continue;
      float* row = dq + (((i64)b * Hq + h) * Lq + i) * D + FP * 64 + 2 * t4;
#pragma unroll
      for (int x = 0; x < 8; ++x)
        asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(row + x * 8), "f"(dqa[x][2 * half]),
                     "f"(dqa[x][2 * half + 1])
                     : "memory");
    }
    atw_wait0();
    atw_hold<D / 8>(dka);
    atw_hold<D / 8>(dva);
    atw_release(empty(st), lane);
  }
  };
  if (D == 128 || c == 0) run(AtvBool<true>());
  else run(AtvBool<false>());

  // dK = scale dS^T Q and dV, for the keys inside Lk.
  const i64 nkv = (i64)(gridDim.x / ktiles / split) * Lk * D;
#pragma unroll
  for (int c2 = 0; c2 < 2; ++c2) {
    const int j = jr + c2 * 8;
    if (j >= Lk) continue;
    const i64 at = (((i64)b * Hkv + kh) * Lk + j) * D;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      if (split > 1) {
        asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(dkv + at + n * 8 + 2 * t4),
                     "f"(dka[n][2 * c2] * scale), "f"(dka[n][2 * c2 + 1] * scale)
                     : "memory");
        asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(dkv + nkv + at + n * 8 + 2 * t4),
                     "f"(dva[n][2 * c2]), "f"(dva[n][2 * c2 + 1])
                     : "memory");
      } else {
        *reinterpret_cast<u32*>(dk + at + n * 8 + 2 * t4) =
            pack_half2<T>(dka[n][2 * c2] * scale, dka[n][2 * c2 + 1] * scale);
        *reinterpret_cast<u32*>(dv + at + n * 8 + 2 * t4) = pack_half2<T>(dva[n][2 * c2], dva[n][2 * c2 + 1]);
      }
    }
  }
#endif
}
