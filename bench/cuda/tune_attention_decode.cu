// Checks and times attention's tensor-core vector kernels (decode: up to 8 queries) on the GPU,
// cp.async (KIND 0: NW warps, ST ring stages) and TMA (KIND 1: NW consumer warps and a
// producer warp): each against the float32 reference on small shapes and speculative rows bit
// for bit against the same rows decoded alone, then GB/s of K and V read with LLaMA-3-8B's
// heads (32 query, 8 key-value, D 128) for partition targets (fast::vector_blocks' blocks in
// all, rounded down per key-value head), beside a plain read of the same K and V (the ceiling).
// Build and run on the GPU machine, from the repository root:
//   nvcc -O3 -std=c++17 -arch=sm_90a -I crates/nuvec-cuda/kernels -I bench/cuda \
//     bench/cuda/tune_attention_decode.cu -o tad -ldl && ./tad     (./tad check: the checks only)
#include <cstdio>
#include <cstring>
#include <vector>
#include "attention.cuh"
#include "harness.cuh"
#include "attention_ref.cuh"
#include "attention_tma.cuh"

// The partitions' counters (zeros, left so by the kernels), after 1 GiB of partials.
__device__ __forceinline__ unsigned* g_count_dev(float* part) {
  return part ? reinterpret_cast<unsigned*>(part + (1 << 28) - (1 << 20)) : nullptr;
}

#define VEC_ARGS                                                                                                  \
  const T *q, const T *k, const T *v, T *out, const T *sinks, float *part, i64 qs0, i64 qs1, i64 qs2, i64 ks0, \
      i64 ks1, i64 ks2, int Hq, int Hkv, int Lq, int Lk, int causal, int window, int blocks, float scale
template <typename T, int D, int NW, int ST>
__global__ void __launch_bounds__(NW * 32) vec_k(VEC_ARGS) {
  attention_vector_mma<T, D, D, NW, ST>(q, k, v, out, nullptr, sinks, part, g_count_dev(part), qs0, qs1, qs2, ks0, ks1, ks2, ks0, ks1, ks2,
                                        0, 0, 0, 0, Hq, Hkv, Lq, Lk, causal, window, 0, blocks, scale);
}
template <typename T, int D, int NW, int ST>
__global__ void __launch_bounds__(NW * 32 + 32) tma_k(const __grid_constant__ AtwMap mk, const __grid_constant__ AtwMap mv,
                                                      const T* q, T* out, const T* sinks, float* part, i64 qs0,
                                                      i64 qs1, i64 qs2, int Hq, int Hkv, int Lq, int Lk, int causal,
                                                      int window, int blocks, float scale) {
  attention_vector_tma<T, D, NW, ST>(&mk, &mv, q, out, nullptr, sinks, part, g_count_dev(part), qs0, qs1, qs2, 0, 0, 0, 0, Hq, Hkv, Lq, Lk,
                                     causal, window, 0, blocks, scale);
}
// The ceiling: every 16-byte chunk of K and V read once (a sum kept so nothing is dropped).
__global__ void read_k(const int4* a, const int4* b, i64 n, int* sink) {
  int acc = 0;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
    int4 x = a[i], y = b[i];
    acc ^= x.x ^ x.y ^ x.z ^ x.w ^ y.x ^ y.y ^ y.z ^ y.w;
  }
  if (acc == 0x12345678) *sink = acc;
}

// fast::vector_blocks with `target` blocks in all (rounded down with g_floor).
static bool g_floor = true;
static int parts(int heads, int lk, int target) {
  int want = g_floor ? target / heads : (target + heads - 1) / heads, most = (lk + 255) / 256;
  want = want > 128 ? 128 : want;
  return want < 1 ? 1 : (want > most ? most : want);
}

struct Run {
  int B, Hq, Hkv, Lq, Lk, causal, window;
  bool sinks;
};
static float* g_part = nullptr;

// One decode: the vector kernel (KIND 0 cp.async, 1 TMA), which merges its partitions itself.
template <typename T, int D, int KIND, int NW, int ST>
static void decode(Buffers<T>& x, const Run& r, int blocks) {
  float scale = 1.0f / sqrtf((float)D);
  float* part = blocks > 1 ? g_part : nullptr;
  const int G = r.Hq / r.Hkv;
  dim3 grid(r.B * r.Hkv * r.Lq * ((G + 15) / 16), blocks);
  const T* sinks = r.sinks ? x.sinks : nullptr;
  i64 qs[3] = {(i64)r.Hq * r.Lq * D, (i64)r.Lq * D, D}, ks[3] = {(i64)r.Hkv * r.Lk * D, (i64)r.Lk * D, D};
  if constexpr (KIND == 0) {
    int smem = att_vector_smem(D, D, NW, ST);
    CK(cudaFuncSetAttribute(vec_k<T, D, NW, ST>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    vec_k<T, D, NW, ST><<<grid, NW * 32, smem>>>(x.q, x.k, x.v, x.o, sinks, part, qs[0], qs[1], qs[2], ks[0], ks[1],
                                                 ks[2], r.Hq, r.Hkv, r.Lq, r.Lk, r.causal, r.window, blocks, scale);
  } else {
    static AtwMap mk, mv;
    static const void* made = nullptr;
    static int shape[3];
    int now[3] = {r.B, r.Hkv, r.Lk};
    if (made != x.k || memcmp(now, shape, sizeof now)) {
      mk = tensor_map(x.k, r.B, r.Hkv, r.Lk, D, NW * 16);
      mv = tensor_map(x.v, r.B, r.Hkv, r.Lk, D, NW * 16);
      made = x.k;
      memcpy(shape, now, sizeof now);
    }
    int smem = att_vector_tma_smem(D, NW, ST);
    CK(cudaFuncSetAttribute(tma_k<T, D, NW, ST>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    tma_k<T, D, NW, ST><<<grid, NW * 32 + 32, smem>>>(mk, mv, x.q, x.o, sinks, part, qs[0], qs[1], qs[2], r.Hq, r.Hkv,
                                                      r.Lq, r.Lk, r.causal, r.window, blocks, scale);
  }
  CK(cudaGetLastError());
}

static int failures = 0;

template <typename T, int D, int KIND, int NW, int ST>
static void check(Run r, int target) {
  float scale = 1.0f / sqrtf((float)D);
  Buffers<T> x = make<T, D>(r.B, r.Hq, r.Hkv, r.Lq, r.Lk);
  const size_t nq = (size_t)r.B * r.Hq * r.Lq * D, rows = (size_t)r.B * r.Hq * r.Lq;
  const int lk_eff = r.window > 0 && r.window < r.Lk ? r.window : r.Lk;
  const int blocks = parts(r.B * r.Hkv, lk_eff, target);
  CK(cudaMemset(x.o, 0xff, nq * 2));
  decode<T, D, KIND, NW, ST>(x, r, blocks);
  float *ro, *rl;
  CK(cudaMalloc(&ro, nq * 4)); CK(cudaMalloc(&rl, rows * 4));
  ref_k<T, D><<<(rows + 127) / 128, 128>>>(x.q, x.k, x.v, r.sinks ? x.sinks : nullptr, ro, rl, r.B, r.Hq, r.Hkv, r.Lq,
                                           r.Lk, r.causal, r.window, scale);
  CK(cudaDeviceSynchronize());
  std::vector<T> o(nq);
  std::vector<float> wo(nq);
  CK(cudaMemcpy(o.data(), x.o, nq * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(wo.data(), ro, nq * 4, cudaMemcpyDeviceToHost));
  double eo = 0;
  for (size_t i = 0; i < nq; ++i) {
    double e = fabs(h2f(o[i]) - wo[i]);
    eo = std::isnan(e) ? 1e9 : fmax(eo, e);
  }
  // Speculative rows: query i of Lq causal queries equals the same query decoded alone over
  // its own keys (Lq 1, the first Lk - (Lq - 1 - i) keys), bit for bit.
  int spec = 0;
  if (r.causal && r.Lq > 1) {
    for (int i = 0; i < r.Lq; ++i) {
      const int lk1 = r.Lk - (r.Lq - 1 - i);
      Run one{r.B, r.Hq, r.Hkv, 1, lk1, 1, r.window, r.sinks};
      Buffers<T> y = make<T, D>(r.B, r.Hq, r.Hkv, 1, lk1);
      CK(cudaMemcpy2D(y.q, D * 2, x.q + (size_t)i * D, (size_t)r.Lq * D * 2, D * 2, (size_t)r.B * r.Hq, cudaMemcpyDeviceToDevice));
      CK(cudaMemcpy2D(y.k, (size_t)lk1 * D * 2, x.k, (size_t)r.Lk * D * 2, (size_t)lk1 * D * 2, (size_t)r.B * r.Hkv, cudaMemcpyDeviceToDevice));
      CK(cudaMemcpy2D(y.v, (size_t)lk1 * D * 2, x.v, (size_t)r.Lk * D * 2, (size_t)lk1 * D * 2, (size_t)r.B * r.Hkv, cudaMemcpyDeviceToDevice));
      CK(cudaMemcpy(y.sinks, x.sinks, r.Hq * 2, cudaMemcpyDeviceToDevice));
      const int lk1_eff = r.window > 0 && r.window < lk1 ? r.window : lk1;
      decode<T, D, KIND, NW, ST>(y, one, parts(r.B * r.Hkv, lk1_eff, target));
      CK(cudaDeviceSynchronize());
      std::vector<T> o1((size_t)r.B * r.Hq * D);
      CK(cudaMemcpy(o1.data(), y.o, o1.size() * 2, cudaMemcpyDeviceToHost));
      for (int bh = 0; bh < r.B * r.Hq; ++bh)
        if (memcmp(&o1[(size_t)bh * D], &o[((size_t)bh * r.Lq + i) * D], D * 2)) ++spec;
      release(y);
    }
  }
  bool ok = eo < (IsBf16<T>::value ? 2e-2 : 4e-3) && spec == 0;
  failures += !ok;
  printf("check %s %s D%d %s NW%d ST%d B%d Hq%d Hkv%d Lq%d Lk%d causal %d window %d sinks %d parts %d: out %.2e, "
         "speculative rows differing %d\n",
         ok ? "ok  " : "FAIL", IsBf16<T>::value ? "bf16" : "f16", D, KIND ? "tma" : "cp.async", NW, ST, r.B, r.Hq, r.Hkv,
         r.Lq, r.Lk, r.causal, r.window, r.sinks, blocks, eo, spec);
  cudaFree(ro); cudaFree(rl);
  release(x);
}

template <typename T, int D, int KIND, int NW, int ST>
static void checks() {
  for (int target : {1000, 132}) {
    check<T, D, KIND, NW, ST>({1, 32, 8, 1, 4096, 0, 0, false}, target);
    check<T, D, KIND, NW, ST>({2, 8, 2, 1, 1000, 0, 0, true}, target);
    check<T, D, KIND, NW, ST>({1, 32, 8, 4, 3000, 1, 0, false}, target);
    check<T, D, KIND, NW, ST>({2, 40, 2, 3, 777, 1, 0, true}, target);  // 20 grouped heads: two row groups
    check<T, D, KIND, NW, ST>({1, 8, 8, 8, 5000, 1, 700, false}, target);
    check<T, D, KIND, NW, ST>({3, 4, 1, 2, 70, 1, 0, false}, target);
    check<T, D, KIND, NW, ST>({1, 16, 2, 1, 9, 0, 0, true}, target);
    check<T, D, KIND, NW, ST>({1, 4, 1, 2, 40000, 1, 0, true}, target);  // 128 partitions
  }
}

static double g_ceiling = 0;
template <typename T, int D, int KIND, int NW, int ST>
static void timing(const Run& r, const char* name, int target) {
  Buffers<T> x = make<T, D>(r.B, r.Hq, r.Hkv, r.Lq, r.Lk);
  const int blocks = parts(r.B * r.Hkv, r.Lk, target);
  const double bytes = 2.0 * r.B * r.Hkv * (double)r.Lk * D * 2 + 2.0 * r.B * r.Hq * r.Lq * D * 2;
  const int iters = (int)fmin(2000, fmax(20, 2e9 / bytes));
  float ms = time_ms(iters, [&] { decode<T, D, KIND, NW, ST>(x, r, blocks); });
  printf("timing %-14s %-8s NW%d ST%d target %4d%s parts %3d: %5.0f GB/s (%.1f us)\n", name,
         KIND ? "tma" : "cp.async", NW, ST, target, g_floor ? " floor" : "", blocks, bytes / ms / 1e6,
         ms * 1e3);
  release(x);
}

static void ceiling(const Run& r, const char* name) {
  Buffers<bf16> x = make<bf16, 128>(r.B, r.Hq, r.Hkv, r.Lq, r.Lk);
  const i64 n = (i64)r.B * r.Hkv * r.Lk * 128 * 2 / 16;
  int* sink;
  CK(cudaMalloc(&sink, 4));
  const double bytes = 2.0 * n * 16;
  const int iters = (int)fmin(2000, fmax(20, 2e9 / bytes));
  float ms = time_ms(iters, [&] { read_k<<<132 * 8, 512>>>((const int4*)x.k, (const int4*)x.v, n, sink); });
  g_ceiling = bytes / ms / 1e6;
  printf("timing %-26s read of K and V (ceiling): %5.0f GB/s (%.1f us)\n", name, g_ceiling, ms * 1e3);
  cudaFree(sink);
  release(x);
}

template <int KIND, int NW, int ST>
static void sweep(const Run& r, const char* name) {
  for (int target : {132, 264}) timing<bf16, 128, KIND, NW, ST>(r, name, target);
}

int main(int argc, char** argv) {
  CK(cudaMalloc(&g_part, (size_t)1 << 30));
  CK(cudaMemset(g_part + (1 << 28) - (1 << 20), 0, 4 << 20));
  checks<bf16, 128, 0, 4, 3>();
  checks<f16, 128, 0, 4, 3>();
  checks<bf16, 64, 0, 4, 3>();
  checks<bf16, 96, 0, 4, 3>();
  checks<bf16, 256, 0, 4, 2>();
  checks<bf16, 128, 1, 4, 4>();
  checks<f16, 128, 1, 4, 4>();
  checks<bf16, 64, 1, 4, 4>();
  checks<bf16, 256, 1, 4, 2>();
  checks<bf16, 128, 1, 8, 2>();
  printf("%d failures\n", failures);
  if (argc > 1 && !strcmp(argv[1], "check")) return failures != 0;  // ./tad check: no timings
  const Run runs[] = {{1, 32, 8, 1, 1024, 0, 0, false},   {1, 32, 8, 1, 4096, 0, 0, false},
                      {1, 32, 8, 1, 32768, 0, 0, false},  {1, 32, 8, 1, 131072, 0, 0, false},
                      {8, 32, 8, 1, 8192, 0, 0, false},   {32, 32, 8, 1, 8192, 0, 0, false},
                      {64, 32, 8, 1, 4096, 0, 0, false},  {1, 32, 8, 4, 32768, 1, 0, false},
                      {32, 32, 8, 4, 8192, 1, 0, false}};
  const char* names[] = {"B1 Lk1k",  "B1 Lk4k",  "B1 Lk32k",     "B1 Lk131k",     "B8 Lk8k",
                         "B32 Lk8k", "B64 Lk4k", "B1 Lq4 Lk32k", "B32 Lq4 Lk8k"};
  for (int c = 0; c < 9; ++c) {
    const Run& r = runs[c];
    ceiling(r, names[c]);
    sweep<0, 4, 3>(r, names[c]);
    sweep<0, 4, 2>(r, names[c]);
    sweep<1, 4, 2>(r, names[c]);
    sweep<1, 4, 3>(r, names[c]);
    sweep<1, 4, 4>(r, names[c]);
    sweep<1, 2, 4>(r, names[c]);
  }
  return failures != 0;
}
