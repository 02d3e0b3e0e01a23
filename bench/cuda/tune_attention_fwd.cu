// Checks and times attention's tiled forward kernels (attention.cuh) on the GPU: the Hopper
// (TMA + wgmma) kernel against a plain float32 reference on small shapes (outputs and
// log-sum-exp), and both it and the mma.sync kernel in TFLOP/s (4 B Hq Lq Lk D FLOPs, halved
// when causal) with LLaMA-3-8B's heads (32 query, 8 key-value) at D 64, 128 and 256. Build and
// run on the GPU machine, from the repository root:
//   nvcc -O3 -std=c++17 -arch=sm_90a -Xptxas -v -I crates/nuvec-cuda/kernels \
//     bench/cuda/tune_attention_fwd.cu -o taf -ldl && ./taf
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>
#include "attention.cuh"
#include "harness.cuh"
#include "attention_tma.cuh"
#include "attention_ref.cuh"

template <typename T, int D>
__global__ void __launch_bounds__(256) mma_k(const T* q, const T* k, const T* v, T* out, float* lse, int Hq, int Hkv,
                                             int Lq, int Lk, int causal, int window, float scale) {
  attention_tiled<T, D>(q, k, v, out, lse, nullptr, (i64)Hq * Lq * D, (i64)Lq * D, D, (i64)Hkv * Lk * D,
                        (i64)Lk * D, D, (i64)Hkv * Lk * D, (i64)Lk * D, D, Hq, Hkv, Lq, Lk, causal, window, scale);
}
template <typename T, int D, int BC, int NC, int ST>
__global__ void __launch_bounds__(128 * (NC + 1), 1) tma_k(const __grid_constant__ AtwMap mq, const __grid_constant__ AtwMap mk,
                                                          const __grid_constant__ AtwMap mv, T* out, float* lse,
                                                          const T* sinks, int Hq, int Hkv, int Lq, int Lk, int causal,
                                                          int window, float scale) {
  attention_wgmma<T, D, BC, NC, ST>(&mq, &mk, &mv, out, lse, sinks, Hq, Hkv, Lq, Lk, causal, window, scale);
}

template <typename T, int D, int BC, int NC, int ST>
static void wgmma(Buffers<T>& x, bool sinks, int B, int Hq, int Hkv, int Lq, int Lk, int causal, int window, float scale) {
  constexpr int smem = atw_smem(D, BC, NC, ST);
  static AtwMap mq, mk, mv;
  static const void* made = nullptr;
  static int shape[5];
  int now[5] = {B, Hq, Hkv, Lq, Lk};
  if (made != x.q || memcmp(now, shape, sizeof now)) {
    mq = tensor_map(x.q, B, Hq, Lq, D, 64 * NC);
    mk = tensor_map(x.k, B, Hkv, Lk, D, BC);
    mv = tensor_map(x.v, B, Hkv, Lk, D, BC);
    made = x.q;
    memcpy(shape, now, sizeof now);
  }
  CK(cudaFuncSetAttribute(tma_k<T, D, BC, NC, ST>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  tma_k<T, D, BC, NC, ST><<<dim3((Lq + 64 * NC - 1) / (64 * NC), B * Hq), 128 * (NC + 1), smem>>>(
      mq, mk, mv, x.o, x.lse, sinks ? x.sinks : nullptr, Hq, Hkv, Lq, Lk, causal, window, scale);
  CK(cudaGetLastError());
}
template <typename T, int D>
static void mma(Buffers<T>& x, int B, int Hq, int Hkv, int Lq, int Lk, int causal, int window, float scale) {
  int smem = (128 + 2 * 64) * (D * 2 + 16);
  CK(cudaFuncSetAttribute(mma_k<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  mma_k<T, D><<<dim3((Lq + 127) / 128, B * Hq), 256, smem>>>(x.q, x.k, x.v, x.o, x.lse, Hq, Hkv, Lq, Lk, causal, window, scale);
  CK(cudaGetLastError());
}

static int failures = 0;
static float scale_sign = 1.0f;  // -1 checks a negative scale (the softmax's unfolded path)

template <typename T, int D, int BC, int NC, int ST>
static void check(int B, int Hq, int Hkv, int Lq, int Lk, int causal, int window, bool sinks) {
  float scale = scale_sign / sqrtf((float)D);
  Buffers<T> x = make<T, D>(B, Hq, Hkv, Lq, Lk);
  size_t nq = (size_t)B * Hq * Lq * D, rows = (size_t)B * Hq * Lq;
  CK(cudaMemset(x.o, 0xff, nq * 2));
  wgmma<T, D, BC, NC, ST>(x, sinks, B, Hq, Hkv, Lq, Lk, causal, window, scale);
  float *ro, *rl;
  CK(cudaMalloc(&ro, nq * 4)); CK(cudaMalloc(&rl, rows * 4));
  ref_k<T, D><<<(rows + 127) / 128, 128>>>(x.q, x.k, x.v, sinks ? x.sinks : nullptr, ro, rl, B, Hq, Hkv, Lq, Lk, causal, window, scale);
  CK(cudaDeviceSynchronize());
  std::vector<T> o(nq);
  std::vector<float> wo(nq), l(rows), wl(rows);
  CK(cudaMemcpy(o.data(), x.o, nq * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(wo.data(), ro, nq * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(l.data(), x.lse, rows * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(wl.data(), rl, rows * 4, cudaMemcpyDeviceToHost));
  double eo = 0, el = 0;
  for (size_t i = 0; i < nq; ++i) {
    double e = fabs(h2f(o[i]) - wo[i]);
    eo = std::isnan(e) ? 1e9 : fmax(eo, e);
  }
  for (size_t i = 0; i < rows; ++i) {
    if (std::isinf(wl[i]) && std::isinf(l[i])) continue;
    double e = fabs(l[i] - wl[i]);
    el = std::isnan(e) ? 1e9 : fmax(el, e);
  }
  bool ok = eo < (IsBf16<T>::value ? 2e-2 : 4e-3) && el < 1e-3;
  failures += !ok;
  printf("check %s %s D%d BC%d NC%d ST%d scale %+.3f B%d Hq%d Hkv%d Lq%d Lk%d causal %d window %d sinks %d: out %.2e lse %.2e\n",
         ok ? "ok  " : "FAIL", IsBf16<T>::value ? "bf16" : "f16", D, BC, NC, ST, scale, B, Hq, Hkv, Lq, Lk, causal, window, sinks, eo, el);
  cudaFree(ro); cudaFree(rl);
  release(x);
}

template <typename T, int D, int BC, int NC, int ST>
static void checks() {
  check<T, D, BC, NC, ST>(1, 2, 2, 128, 128, 0, 0, false);
  check<T, D, BC, NC, ST>(1, 4, 4, 40, 40, 0, 0, false);
  check<T, D, BC, NC, ST>(2, 8, 2, 77, 77, 1, 0, false);
  check<T, D, BC, NC, ST>(1, 4, 1, 50, 130, 1, 0, false);
  check<T, D, BC, NC, ST>(1, 2, 2, 129, 65, 1, 0, false);
  check<T, D, BC, NC, ST>(1, 4, 2, 300, 300, 1, 100, false);
  check<T, D, BC, NC, ST>(2, 4, 4, 33, 200, 0, 0, true);
  check<T, D, BC, NC, ST>(1, 4, 2, 520, 520, 1, 0, true);
  scale_sign = -1.0f;
  check<T, D, BC, NC, ST>(1, 4, 2, 300, 300, 1, 0, false);
  check<T, D, BC, NC, ST>(1, 4, 2, 200, 333, 0, 0, true);
  scale_sign = 1.0f;
}

template <typename T, int D, int BC, int NC, int ST>
static void timing(int B, int Hq, int Hkv, int L, int causal) {
  float scale = 1.0f / sqrtf((float)D);
  Buffers<T> x = make<T, D>(B, Hq, Hkv, L, L);
  double flops = 4.0 * B * Hq * (double)L * L * D / (causal ? 2 : 1);
  float w = time_ms(10, [&] { wgmma<T, D, BC, NC, ST>(x, false, B, Hq, Hkv, L, L, causal, 0, scale); });
  float m = 0;
  if constexpr (D <= 128) m = time_ms(10, [&] { mma<T, D>(x, B, Hq, Hkv, L, L, causal, 0, scale); });
  printf("timing D%d BC%d NC%d ST%d B%d Hq%d Hkv%d L%d causal %d: wgmma %.0f TFLOP/s, mma.sync %.0f\n", D, BC, NC, ST, B, Hq, Hkv, L,
         causal, flops / w / 1e9, m > 0 ? flops / m / 1e9 : 0.0);
  release(x);
}

int main() {
  checks<bf16, 128, 128, 2, 2>();
  checks<f16, 128, 128, 2, 2>();
  checks<bf16, 64, 128, 3, 2>();
  checks<bf16, 256, 64, 2, 2>();
  checks<bf16, 128, 128, 2, 3>();
  checks<bf16, 128, 176, 2, 2>();
  checks<f16, 128, 176, 2, 2>();
  printf("%d failures\n", failures);
  for (int c : {1, 0}) {
    timing<bf16, 128, 128, 2, 2>(1, 32, 8, 4096, c);
    timing<bf16, 128, 128, 2, 3>(1, 32, 8, 4096, c);
    timing<bf16, 128, 176, 2, 2>(1, 32, 8, 4096, c);
    timing<bf16, 128, 128, 2, 2>(1, 32, 8, 16384, c);
    timing<bf16, 128, 128, 2, 3>(1, 32, 8, 16384, c);
    timing<bf16, 128, 176, 2, 2>(1, 32, 8, 16384, c);
    timing<bf16, 128, 128, 2, 2>(4, 32, 8, 4096, c);
    timing<bf16, 64, 128, 3, 2>(1, 32, 8, 8192, c);
    timing<bf16, 64, 128, 3, 3>(1, 32, 8, 8192, c);
    timing<bf16, 256, 64, 2, 2>(1, 32, 8, 8192, c);
  }
  return failures != 0;
}
