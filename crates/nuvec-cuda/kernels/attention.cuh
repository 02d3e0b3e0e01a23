// Attention of few queries (decoding, speculative rows): a block of ATT_WARPS warps per query
// row and key partition. Each warp takes groups of ATT_KEYS consecutive keys, lanes split the
// head, a butterfly shuffle makes each score, and an online softmax (base 2) accumulates the
// values; the warps merge in a fixed order. With two passes, each partition writes its
// unnormalised output, maximum and sum, and the second pass merges the partitions in order.
//
// A row's partitions depend only on its own key range and the batch x heads count, and keys
// are visited relative to the partition's start, so a row gives the same bits whatever rows
// run beside it: a speculative row equals the same row decoded alone.
#include "common.cuh"

#define ATT_WARPS 8
#define ATT_KEYS 4
#define ATT_LOG2E 1.4426950408889634f

// Mirrors fast::vector_blocks in nuvec-core: the same partitions on host and device.
__device__ __forceinline__ int att_blocks(i64 rows, int keys) {
  i64 r = rows > 1 ? rows : 1;
  i64 want = (256 + r - 1) / r;
  int k = keys > 1 ? keys : 1;
  i64 most = (k + 511) / 512;
  return (int)(want < 1 ? 1 : (want > most ? most : want));
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

template <typename T, int D, int DV>
__device__ __forceinline__ void attention_vector(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ out,
    const void* __restrict__ mask, const T* __restrict__ sinks, float* __restrict__ part,
    i64 qs0, i64 qs1, i64 qs2, i64 ks0, i64 ks1, i64 ks2, i64 vs0, i64 vs1, i64 vs2,
    i64 ms0, i64 ms1, i64 ms2, i64 ms3, int Hq, int Hkv, int Lq, int Lk, int causal, int window,
    int mask_kind, int blocks, float scale) {
  const int E = (D + 31) / 32, EV = (DV + 31) / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const i64 r = blockIdx.x;
  const int i = (int)(r % Lq);
  const int h = (int)((r / Lq) % Hq);
  const int b = (int)(r / ((i64)Lq * Hq));
  const int kh = h / (Hq / Hkv);
  int lo, hi;
  att_range(i, Lq, Lk, causal, window, &lo, &hi);
  const int n = hi - lo;
  const int nb = att_blocks((i64)gridDim.x / Lq, n);
  const int p = blockIdx.y;
  if (p >= nb) return;
  const int chunk = (n + nb - 1) / nb;
  const int start = lo + p * chunk;
  const int end = min(hi, start + chunk);

  float qr[E];
  const T* qp = q + b * qs0 + h * qs1 + i * qs2;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    int c = lane * E + e;
    qr[e] = (D % 32 == 0 || c < D) ? widen(qp[c]) * (scale * ATT_LOG2E) : 0.0f;
  }
  const T* kb = k + b * ks0 + kh * ks1;
  const T* vb = v + b * vs0 + kh * vs1;
  const i64 mrow = b * ms0 + h * ms1 + i * ms2;

  float m = -INFINITY, l = 0.0f, o[EV];
#pragma unroll
  for (int e = 0; e < EV; ++e) o[e] = 0.0f;

  for (int j0 = start + warp * ATT_KEYS; j0 < end; j0 += ATT_WARPS * ATT_KEYS) {
    float kr[ATT_KEYS][E], vr[ATT_KEYS][EV];
#pragma unroll
    for (int u = 0; u < ATT_KEYS; ++u) {
      int j = j0 + u < end ? j0 + u : j0;
#pragma unroll
      for (int e = 0; e < E; ++e) {
        int c = lane * E + e;
        kr[u][e] = (D % 32 == 0 || c < D) ? widen(kb[j * ks2 + c]) : 0.0f;
      }
#pragma unroll
      for (int e = 0; e < EV; ++e) {
        int c = lane * EV + e;
        vr[u][e] = (DV % 32 == 0 || c < DV) ? widen(vb[j * vs2 + c]) : 0.0f;
      }
    }
    float s[ATT_KEYS];
#pragma unroll
    for (int u = 0; u < ATT_KEYS; ++u) {
      float dot = 0.0f;
#pragma unroll
      for (int e = 0; e < E; ++e) dot = fmaf(qr[e], kr[u][e], dot);
      s[u] = dot;
    }
#pragma unroll
    for (int u = 0; u < ATT_KEYS; ++u) s[u] = att_warp_sum(s[u]);
#pragma unroll
    for (int u = 0; u < ATT_KEYS; ++u) {
      int j = j0 + u;
      if (j >= end) break;
      float x = s[u];
      if (mask_kind == 1) {
        if (!((const bool*)mask)[mrow + j * ms3]) x = -3.402823466e38f;
      } else if (mask_kind == 2) {
        x += widen(((const T*)mask)[mrow + j * ms3]) * ATT_LOG2E;
      }
      float m2 = fmaxf(m, x);
      if (m2 == -INFINITY) continue;
      float a = exp2f(m - m2), pr = exp2f(x - m2);
      l = l * a + pr;
#pragma unroll
      for (int e = 0; e < EV; ++e) o[e] = fmaf(o[e], a, pr * vr[u][e]);
      m = m2;
    }
  }

  // Merge the warps in order.
  __shared__ float sm[ATT_WARPS], sl[ATT_WARPS], so[ATT_WARPS][EV * 32];
  if (lane == 0) {
    sm[warp] = m;
    sl[warp] = l;
  }
#pragma unroll
  for (int e = 0; e < EV; ++e) so[warp][lane * EV + e] = o[e];
  __syncthreads();
  float M = -INFINITY;
#pragma unroll
  for (int w = 0; w < ATT_WARPS; ++w) M = fmaxf(M, sm[w]);
  float L = 0.0f;
  float wgt[ATT_WARPS];
#pragma unroll
  for (int w = 0; w < ATT_WARPS; ++w) {
    wgt[w] = sm[w] == -INFINITY ? 0.0f : exp2f(sm[w] - M);
    L += sl[w] * wgt[w];
  }
  const bool two = part != 0;
  const i64 slot = r * blocks + p;
  for (int c = threadIdx.x; c < DV; c += blockDim.x) {
    float O = 0.0f;
#pragma unroll
    for (int w = 0; w < ATT_WARPS; ++w) O += so[w][c] * wgt[w];
    if (two) {
      part[slot * DV + c] = O;
    } else {
      float sink = sinks ? widen(sinks[h]) * ATT_LOG2E : 0.0f;
      att_finish<T, DV>(M, L, O, sinks != 0, sink, out + r * DV + c);
    }
  }
  if (two && threadIdx.x == 0) {
    float* ml = part + (i64)gridDim.x * blocks * DV;
    ml[slot * 2] = M;
    ml[slot * 2 + 1] = L;
  }
}

// The second pass: merges a row's partitions in order. One block per row.
template <typename T, int DV>
__device__ __forceinline__ void attention_vector_merge(
    const float* __restrict__ part, const T* __restrict__ sinks, T* __restrict__ out, i64 rows, int Hq, int Lq, int Lk,
    int causal, int window, int blocks) {
  const i64 r = blockIdx.x;
  const int i = (int)(r % Lq), h = (int)((r / Lq) % Hq);
  int lo, hi;
  att_range(i, Lq, Lk, causal, window, &lo, &hi);
  const int nb = att_blocks(rows / Lq, hi - lo);
  const float* ml = part + rows * blocks * DV;
  float M = -INFINITY;
  for (int p = 0; p < nb; ++p) M = fmaxf(M, ml[(r * blocks + p) * 2]);
  float sink = sinks ? widen(sinks[h]) * ATT_LOG2E : 0.0f;
  for (int c = threadIdx.x; c < DV; c += blockDim.x) {
    float O = 0.0f, L = 0.0f;
    for (int p = 0; p < nb; ++p) {
      i64 slot = r * blocks + p;
      float mp = ml[slot * 2];
      float w = mp == -INFINITY ? 0.0f : exp2f(mp - M);
      O += part[slot * DV + c] * w;
      L += ml[slot * 2 + 1] * w;
    }
    att_finish<T, DV>(M, L, O, sinks != 0, sink, out + r * DV + c);
  }
}
