// Checks and times attention's backward kernels (attention.cuh) on the GPU: the tiled forward
// with its log-sum-exp, then delta, the key-block kernel and dq's narrowing, against a plain
// float32 reference on small shapes, and in TFLOP/s (2.5 times the forward's FLOPs) on
// LLaMA-3-8B's heads (32 query, 8 key-value, D 128), causal. Build and run on the GPU machine,
// from the repository root:
//   nvcc -O3 -std=c++17 -arch=sm_90a -Xptxas -v -I crates/nuvec-cuda/kernels \
//     bench/cuda/tune_attention_bwd.cu -o tab -ldl && ./tab
// NW 0 is the Hopper (TMA + wgmma) kernel, with its statistics kernel.
// -DATB_BR=32 measures 32 query rows per step (the library takes 64).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>
#include "attention.cuh"
#include "harness.cuh"
#include "attention_tma.cuh"

template <typename T, int D>
__global__ void __launch_bounds__(256) fwd(const T* q, const T* k, const T* v, T* out, float* lse, int Hq, int Hkv,
                                           int Lq, int Lk, int causal, int window, float scale) {
  attention_tiled<T, D>(q, k, v, out, lse, nullptr, (i64)Hq * Lq * D, (i64)Lq * D, D, (i64)Hkv * Lk * D,
                        (i64)Lk * D, D, (i64)Hkv * Lk * D, (i64)Lk * D, D, Hq, Hkv, Lq, Lk, causal, window, scale);
}
template <typename T, int D>
__global__ void delta_k(const T* o, const T* g, float* delta, i64 rows) { attention_backward_delta<T, D>(o, g, delta, rows); }
template <typename T, int D, int NW>
__global__ void __launch_bounds__(NW * 32) bwd(const T* q, const T* k, const T* v, const T* go, const float* lse,
                                           const float* delta, float* dq, T* dk, T* dv, int Hq, int Hkv, int Lq, int Lk,
                                           int causal, int window, float scale) {
  attention_backward<T, D, NW>(q, k, v, go, lse, delta, dq, dk, dv, (i64)Hq * Lq * D, (i64)Lq * D, D,
                           (i64)Hkv * Lk * D, (i64)Lk * D, D, (i64)Hkv * Lk * D, (i64)Lk * D, D, (i64)Hq * Lq * D,
                           (i64)Lq * D, D, Hq, Hkv, Lq, Lk, causal, window, scale);
}
template <typename T>
__global__ void dq_k(const float* acc, T* dq, i64 n, float scale) { attention_backward_dq<T>(acc, dq, n, scale); }

template <typename T, int D>
__global__ void __launch_bounds__(384, 1) bwdw(const __grid_constant__ AtwMap mq, const __grid_constant__ AtwMap mk,
                                               const __grid_constant__ AtwMap mv, const __grid_constant__ AtwMap mg,
                                               const float* stats, float* dq, T* dk, T* dv, int Hq, int Hkv, int Lq,
                                               int Lk, int causal, int window, float scale, int chunk, int split,
                                               float* dkv) {
  attention_backward_wgmma<T, D>(&mq, &mk, &mv, &mg, stats, dq, dk, dv, Hq, Hkv, Lq, Lk, causal, window, scale, chunk,
                                 split, dkv);
}
template <typename T, int D>
__global__ void stats_k(const T* o, const T* g, const float* lse, float* stats, i64 heads, int Lq) {
  attention_backward_stats<T, D>(o, g, lse, stats, heads, Lq);
}

// Reference, a thread per query row: P and dS rows into [B, Hq, Lq, Lk] float32 matrices, dq.
template <typename T, int D>
__global__ void ref_rows(const T* q, const T* k, const T* v, const T* go, float* P, float* dS, float* dq, int B, int Hq,
                         int Hkv, int Lq, int Lk, int causal, int window, float scale) {
  int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= B * Hq * Lq) return;
  int i = r % Lq, h = (r / Lq) % Hq, b = r / (Lq * Hq), kh = h / (Hq / Hkv);
  const T* qr = q + (i64)r * D;
  const T* gr = go + (i64)r * D;
  float* pr = P + (i64)r * Lk;
  float* sr = dS + (i64)r * Lk;
  int lo, hi;
  att_range(i, Lq, Lk, causal, window, &lo, &hi);
  float m = -INFINITY;
  for (int j = 0; j < Lk; ++j) {
    float s = -INFINITY;
    if (j >= lo && j < hi) {
      s = 0;
      const T* kr = k + (((i64)b * Hkv + kh) * Lk + j) * D;
      for (int d = 0; d < D; ++d) s += widen(qr[d]) * widen(kr[d]);
      s *= scale;
    }
    pr[j] = s;
    m = fmaxf(m, s);
  }
  float l = 0;
  for (int j = 0; j < Lk; ++j) l += pr[j] == -INFINITY ? 0.0f : expf(pr[j] - m);
  float dsum = 0;
  for (int j = 0; j < Lk; ++j) {
    float p = pr[j] == -INFINITY ? 0.0f : expf(pr[j] - m) / l;
    pr[j] = p;
    const T* vr = v + (((i64)b * Hkv + kh) * Lk + j) * D;
    float dp = 0;
    for (int d = 0; d < D; ++d) dp += widen(gr[d]) * widen(vr[d]);
    sr[j] = dp;
    dsum += p * dp;
  }
  for (int d = 0; d < D; ++d) dq[(i64)r * D + d] = 0;
  for (int j = 0; j < Lk; ++j) {
    float ds = pr[j] * (sr[j] - dsum);
    sr[j] = ds;
    const T* kr = k + (((i64)b * Hkv + kh) * Lk + j) * D;
    for (int d = 0; d < D; ++d) dq[(i64)r * D + d] += scale * ds * widen(kr[d]);
  }
}

// Reference dk, dv: a thread per key row and feature.
template <typename T, int D>
__global__ void ref_keys(const T* q, const T* go, const float* P, const float* dS, float* dk, float* dv, int B, int Hq,
                         int Hkv, int Lq, int Lk, float scale) {
  i64 x = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (x >= (i64)B * Hkv * Lk * D) return;
  int d = x % D, j = (x / D) % Lk, kh = (x / D / Lk) % Hkv, b = x / D / Lk / Hkv, G = Hq / Hkv;
  float a = 0, c = 0;
  for (int hh = 0; hh < G; ++hh) {
    int h = kh * G + hh;
    for (int i = 0; i < Lq; ++i) {
      i64 r = ((i64)b * Hq + h) * Lq + i;
      a += dS[r * Lk + j] * widen(q[r * D + d]);
      c += P[r * Lk + j] * widen(go[r * D + d]);
    }
  }
  dk[x] = a * scale;
  dv[x] = c;
}

template <typename T>
struct Buffers {
  T *q, *k, *v, *go, *o, *dq, *dk, *dv;
  float *lse, *delta, *acc, *stats, *dkv;
};

template <typename T, int D>
static Buffers<T> make(int B, int Hq, int Hkv, int Lq, int Lk) {
  Buffers<T> x;
  size_t nq = (size_t)B * Hq * Lq * D, nk = (size_t)B * Hkv * Lk * D, rows = (size_t)B * Hq * Lq;
  CK(cudaMalloc(&x.q, nq * 2)); CK(cudaMalloc(&x.go, nq * 2)); CK(cudaMalloc(&x.o, nq * 2)); CK(cudaMalloc(&x.dq, nq * 2));
  CK(cudaMalloc(&x.k, nk * 2)); CK(cudaMalloc(&x.v, nk * 2)); CK(cudaMalloc(&x.dk, nk * 2)); CK(cudaMalloc(&x.dv, nk * 2));
  CK(cudaMalloc(&x.lse, rows * 4)); CK(cudaMalloc(&x.delta, rows * 4)); CK(cudaMalloc(&x.acc, nq * 4));
  CK(cudaMalloc(&x.stats, (size_t)B * Hq * ((Lq + 63) / 64) * 128 * 4));
  CK(cudaMalloc(&x.dkv, nk * 8));
  fill<T><<<1024, 256>>>(x.q, nq, -1, 1, 1);
  fill<T><<<1024, 256>>>(x.k, nk, -1, 1, 2);
  fill<T><<<1024, 256>>>(x.v, nk, -1, 1, 3);
  fill<T><<<1024, 256>>>(x.go, nq, -1, 1, 4);
  return x;
}

template <typename T, int D>
static void forward(Buffers<T>& x, int B, int Hq, int Hkv, int Lq, int Lk, int causal, int window, float scale) {
  int smem = (128 + 2 * 64) * (D * 2 + 16);
  CK(cudaFuncSetAttribute(fwd<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  fwd<T, D><<<dim3((Lq + 127) / 128, B * Hq), 256, smem>>>(x.q, x.k, x.v, x.o, x.lse, Hq, Hkv, Lq, Lk, causal, window, scale);
  CK(cudaGetLastError());
}

static int g_chunk = 0;  // heads per chunk of the Hopper backward (0: all)
static int g_split = 1;  // blocks sharing a key tile's query heads (their dK, dV added in float32)

template <typename T, int D, int NW>
static void main_kernel(Buffers<T>& x, int B, int Hq, int Hkv, int Lq, int Lk, int causal, int window, float scale) {
  if constexpr (NW == 0) {
    constexpr int smem = atv_smem(D);
    static AtwMap mq, mk, mv, mg;
    static const void* made = nullptr;
    static int shape[5];
    int now[5] = {B, Hq, Hkv, Lq, Lk};
    if (made != x.q || memcmp(now, shape, sizeof now)) {
      mq = tensor_map(x.q, B, Hq, Lq, D, ATV_BR);
      mg = tensor_map(x.go, B, Hq, Lq, D, ATV_BR);
      mk = tensor_map(x.k, B, Hkv, Lk, D, ATV_BC);
      mv = tensor_map(x.v, B, Hkv, Lk, D, ATV_BC);
      made = x.q;
      memcpy(shape, now, sizeof now);
    }
    CK(cudaFuncSetAttribute(bwdw<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    int tiles = (Lk + ATV_BC - 1) / ATV_BC;
    bwdw<T, D><<<tiles * B * Hkv * g_split, 384, smem>>>(mq, mk, mv, mg, x.stats, x.acc, x.dk, x.dv, Hq, Hkv, Lq, Lk,
                                                         causal, window, scale,
                                                         (g_chunk > 0 ? g_chunk : B * Hkv) * g_split, g_split, x.dkv);
    CK(cudaGetLastError());
    return;
  } else {
  constexpr int smem = att_bwd_smem(D, NW);
  CK(cudaFuncSetAttribute(bwd<T, D, NW>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int tiles = (Lk + 16 * NW - 1) / (16 * NW);
  bwd<T, D, NW><<<tiles * B * Hkv, NW * 32, smem>>>(x.q, x.k, x.v, x.go, x.lse, x.delta, x.acc, x.dk, x.dv, Hq, Hkv, Lq,
                                                    Lk, causal, window, scale);
  CK(cudaGetLastError());
  }
}

template <typename T, int D, int NW>
static void backward(Buffers<T>& x, int B, int Hq, int Hkv, int Lq, int Lk, int causal, int window, float scale) {
  i64 rows = (i64)B * Hq * Lq, n = rows * D;
  if constexpr (NW == 0) {
    i64 padded = (i64)B * Hq * ((Lq + 63) / 64) * 64;
    stats_k<T, D><<<(padded + 7) / 8, 256>>>(x.o, x.go, x.lse, x.stats, (i64)B * Hq, Lq);
  } else {
    delta_k<T, D><<<(rows + 7) / 8, 256>>>(x.o, x.go, x.delta, rows);
  }
  CK(cudaMemsetAsync(x.acc, 0, n * 4));
  const i64 nk = (i64)B * Hkv * Lk * D;
  if (NW == 0 && g_split > 1) CK(cudaMemsetAsync(x.dkv, 0, nk * 8));
  main_kernel<T, D, NW>(x, B, Hq, Hkv, Lq, Lk, causal, window, scale);
  dq_k<T><<<(n + 255) / 256, 256>>>(x.acc, x.dq, n, scale);
  if (NW == 0 && g_split > 1) {
    dq_k<T><<<(nk + 255) / 256, 256>>>(x.dkv, x.dk, nk, 1.0f);
    dq_k<T><<<(nk + 255) / 256, 256>>>(x.dkv + nk, x.dv, nk, 1.0f);
  }
}

template <typename T>
static double worst(const std::vector<T>& got, const std::vector<float>& want) {
  double m = 1e-6, e = 0;
  for (size_t i = 0; i < want.size(); ++i) m = fmax(m, fabs(want[i]));
  for (size_t i = 0; i < want.size(); ++i) e = fmax(e, fabs(h2f(got[i]) - want[i]));
  return e / m;
}

template <typename T, int D, int NW>
static void check(int B, int Hq, int Hkv, int Lq, int Lk, int causal, int window) {
  float scale = 1.0f / sqrtf((float)D);
  Buffers<T> x = make<T, D>(B, Hq, Hkv, Lq, Lk);
  forward<T, D>(x, B, Hq, Hkv, Lq, Lk, causal, window, scale);
  backward<T, D, NW>(x, B, Hq, Hkv, Lq, Lk, causal, window, scale);
  size_t nq = (size_t)B * Hq * Lq * D, nk = (size_t)B * Hkv * Lk * D, rows = (size_t)B * Hq * Lq;
  float *P, *dS, *rq, *rk, *rv;
  CK(cudaMalloc(&P, rows * Lk * 4)); CK(cudaMalloc(&dS, rows * Lk * 4));
  CK(cudaMalloc(&rq, nq * 4)); CK(cudaMalloc(&rk, nk * 4)); CK(cudaMalloc(&rv, nk * 4));
  ref_rows<T, D><<<(rows + 127) / 128, 128>>>(x.q, x.k, x.v, x.go, P, dS, rq, B, Hq, Hkv, Lq, Lk, causal, window, scale);
  ref_keys<T, D><<<(nk + 127) / 128, 128>>>(x.q, x.go, P, dS, rk, rv, B, Hq, Hkv, Lq, Lk, scale);
  CK(cudaDeviceSynchronize());
  std::vector<T> dq(nq), dk(nk), dv(nk);
  std::vector<float> wq(nq), wk(nk), wv(nk);
  CK(cudaMemcpy(dq.data(), x.dq, nq * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(dk.data(), x.dk, nk * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(dv.data(), x.dv, nk * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(wq.data(), rq, nq * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(wk.data(), rk, nk * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(wv.data(), rv, nk * 4, cudaMemcpyDeviceToHost));
  printf("check %s BR%d NW%d D%d B%d Hq%d Hkv%d Lq%d Lk%d causal %d window %d: dq %.2e dk %.2e dv %.2e\n",
         IsBf16<T>::value ? "bf16" : "f16", ATB_BR, NW, D, B, Hq, Hkv, Lq, Lk, causal, window, worst(dq, wq),
         worst(dk, wk), worst(dv, wv));
  cudaFree(P); cudaFree(dS); cudaFree(rq); cudaFree(rk); cudaFree(rv);
  cudaFree(x.q); cudaFree(x.k); cudaFree(x.v); cudaFree(x.go); cudaFree(x.o); cudaFree(x.dq); cudaFree(x.dk);
  cudaFree(x.dv); cudaFree(x.lse); cudaFree(x.delta); cudaFree(x.acc); cudaFree(x.stats);
}

template <typename T, int D, int NW>
static void timing(int B, int L) {
  int Hq = 32, Hkv = 8;
  float scale = 1.0f / sqrtf((float)D);
  Buffers<T> x = make<T, D>(B, Hq, Hkv, L, L);
  forward<T, D>(x, B, Hq, Hkv, L, L, 1, 0, scale);
  double flops = 2.0 * B * Hq * (double)L * L * D;  // causal forward
  float f = time_ms(10, [&] { forward<T, D>(x, B, Hq, Hkv, L, L, 1, 0, scale); });
  float b = time_ms(10, [&] { backward<T, D, NW>(x, B, Hq, Hkv, L, L, 1, 0, scale); });
  float mk = time_ms(10, [&] { main_kernel<T, D, NW>(x, B, Hq, Hkv, L, L, 1, 0, scale); });
  printf("timing split %d chunk %d BR%d NW%d D%d B%d L%d causal: forward %.3f ms %.0f TFLOP/s; backward %.3f ms %.0f TFLOP/s (main kernel %.3f ms)\n",
         g_split, g_chunk, ATB_BR, NW, D, B, L, f, flops / f / 1e9, b, 2.5 * flops / b / 1e9, mk);
}

template <typename T, int NW>
static void checks() {
  check<T, 64, NW>(1, 4, 4, 40, 40, 0, 0);
  check<T, 128, NW>(2, 8, 2, 77, 77, 1, 0);
  check<T, 128, NW>(1, 4, 1, 50, 130, 1, 0);
  check<T, 64, NW>(1, 2, 2, 129, 65, 1, 0);
  check<T, 128, NW>(1, 4, 2, 300, 300, 1, 100);
  check<T, 128, NW>(2, 4, 4, 33, 200, 0, 0);
  check<T, 128, NW>(1, 4, 2, 520, 520, 1, 0);
  check<T, 64, NW>(1, 4, 2, 260, 390, 0, 0);
}

int main(int argc, char** argv) {
  checks<bf16, 0>();
  checks<f16, 0>();
  g_chunk = 3;
  g_split = 2;
  checks<bf16, 0>();
  g_split = 4;
  checks<f16, 0>();
  g_chunk = 0;
  for (auto [b, l] : {std::pair{1, 2048}, {4, 2048}, {1, 4096}, {4, 4096}, {1, 8192}}) {
    for (int sp : {1, 2, 4}) {
      g_split = sp;
      for (int c : {0, 64 * 1024 * 1024 / (4 * l * 128 * 8)}) {
        g_chunk = c < 1 ? (c == 0 ? 0 : 1) : c;
        timing<bf16, 128, 0>(b, l);
      }
    }
  }
  g_split = 1;
  g_chunk = 0;
  timing<bf16, 64, 0>(1, 8192);
  return 0;
}
