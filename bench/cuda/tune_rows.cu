// Sweeps launch shapes of nuvec's row kernels (log-sum-exp, softmax) and decode GEMVs on the
// GPU, against the copy ceiling measured in the same run. It compiles the kernels' own headers
// (crates/nuvec-cuda/kernels), so a variant of a header can be timed before the dispatch in
// eval.rs / matmul.rs is changed to match. Build and run (on the GPU machine):
//   nvcc -O3 -std=c++17 -arch=sm_90 -I crates/nuvec-cuda/kernels bench/cuda/tune_rows.cu -o tune && ./tune
// -DNV_ROW_LOADS=n, -DNV_GEMV_ROW_LOADS=n and -DNV_GEMV_COL_LOADS=n set the loads in flight per
// thread.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>
#include "fast.cuh"
#include "gemv.cuh"

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e), __LINE__); exit(1); } } while (0)

template <typename T> __global__ void lse_block(const T* x, T* o, u64 r, u64 l) { logsumexp_rows<T>(x, o, r, l); }
template <typename T> __global__ void lse_warp(const T* x, T* o, u64 r, u64 l) { logsumexp_rows_warp<T>(x, o, r, l); }
template <typename T> __global__ void sm_block(const T* x, T* o, u64 r, u64 l) { softmax_rows<T>(x, o, r, l); }
template <typename T> __global__ void sm_warp(const T* x, T* o, u64 r, u64 l) { softmax_rows_warp<T>(x, o, r, l); }
template <typename T> __global__ void grows(const T* x, const T* w, T* o, u64 n, u64 k) { gemv_rows<T, 1>(x, w, o, n, k, k, k, n); }
template <typename T> __global__ void __launch_bounds__(NV_GEMV_COL_BLOCK) gcols(const T* x, const T* b, float* p, unsigned* c, T* o, u64 n, u64 k, u64 s) { gemv_cols<T, 1>(x, b, p, c, o, n, k, k, n, n, s); }

static float time_ms(int iters, const std::function<void()>& f) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) f();
  CK(cudaEventRecord(a));
  for (int i = 0; i < iters; ++i) f();
  CK(cudaEventRecord(b));
  CK(cudaEventSynchronize(b));
  float ms; CK(cudaEventElapsedTime(&ms, a, b));
  CK(cudaGetLastError());
  return ms / iters;
}

template <typename T> void rows_case(const char* op, const char* ty, u64 rows, u64 len, void* x, void* o, double ceil, int sms) {
  double bytes = (double)rows * len * sizeof(T) * (op[0] == 's' ? 2 : 1);
  for (int g = 32; g <= 1024; g *= 4) {
    float ms;
    if (op[0] == 'l') {
      if (g == 32) ms = time_ms(20, [&] { lse_warp<T><<<(unsigned)((rows + 7) / 8), 256>>>((T*)x, (T*)o, rows, len); });
      else ms = time_ms(20, [&] { lse_block<T><<<(unsigned)rows, g>>>((T*)x, (T*)o, rows, len); });
    } else {
      if (g == 32) ms = time_ms(20, [&] { sm_warp<T><<<(unsigned)((rows + 7) / 8), 256>>>((T*)x, (T*)o, rows, len); });
      else ms = time_ms(20, [&] { sm_block<T><<<(unsigned)rows, g>>>((T*)x, (T*)o, rows, len); });
    }
    double gbs = bytes / ms / 1e6;
    printf("%s %s %llux%llu threads/row %4d: %7.1f GB/s %5.1f%%\n", op, ty, rows, len, g, gbs, 100 * gbs / ceil);
  }
}

int main() {
  int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  size_t big = 256ull << 20;
  void *x, *o, *y;
  CK(cudaMalloc(&x, big)); CK(cudaMalloc(&o, big)); CK(cudaMalloc(&y, big));
  // Inputs: uniform in [-4, 4) as bytes of the element type (f32 and bf16 views of one buffer).
  {
    std::vector<float> h(big / 4);
    for (size_t i = 0; i < h.size(); ++i) h[i] = ((i * 2654435761u) % 8000) / 1000.0f - 4.0f;
    CK(cudaMemcpy(x, h.data(), big, cudaMemcpyHostToDevice));
    std::vector<unsigned short> hb(big / 2);
    for (size_t i = 0; i < hb.size(); ++i) { float f = h[i % h.size()]; unsigned u; memcpy(&u, &f, 4); hb[i] = u >> 16; }
    CK(cudaMemcpy(y, hb.data(), big, cudaMemcpyHostToDevice));
  }
  float cms = time_ms(20, [&] { CK(cudaMemcpyAsync(o, x, big, cudaMemcpyDeviceToDevice)); });
  double ceil = 2.0 * big / cms / 1e6;
  printf("copy ceiling: %.1f GB/s (%d SMs)\n", ceil, sms);
  rows_case<float>("lse", "f32", 16384, 4096, x, o, ceil, sms);
  rows_case<float>("lse", "f32", 4096, 16384, x, o, ceil, sms);
  rows_case<bf16>("lse", "bf16", 16384, 4096, y, o, ceil, sms);
  rows_case<bf16>("lse", "bf16", 4096, 16384, y, o, ceil, sms);
  rows_case<bf16>("lse", "bf16", 32768, 4096, y, o, ceil, sms);
  rows_case<float>("softmax", "f32", 4096, 16384, x, o, ceil, sms);
  rows_case<bf16>("softmax", "bf16", 16384, 4096, y, o, ceil, sms);
  // Decode GEMV: bf16 1×4096 · [4096, 14336] (cols layout) and W [14336, 4096] (rows layout).
  u64 n = 14336, k = 4096;
  double wbytes = (double)n * k * 2;
  float* part; unsigned* cnt;
  CK(cudaMalloc(&part, 256 * n * 4)); CK(cudaMalloc(&cnt, 1 << 16)); CK(cudaMemset(cnt, 0, 1 << 16));
  bf16* xv = (bf16*)o;  // any 4096 values
  bf16* out = (bf16*)o + 8192;
  float ms = time_ms(50, [&] { grows<bf16><<<(unsigned)((n + 7) / 8), 256>>>(xv, (bf16*)y, out, n, k); });
  printf("gemv rows bf16 1x%llux%llu: %7.1f GB/s %5.1f%%\n", k, n, wbytes / ms / 1e6, 100 * wbytes / ms / 1e6 / ceil);
  u64 tiles = (n + 63) / 64;
  int resident = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, gcols<bf16>, 256, 0));
  printf("gemv cols: %d resident blocks per SM, %llu tiles\n", resident, tiles);
  for (u64 s : {1ull, 2ull, 3ull, 4ull, 6ull, 8ull, 12ull}) {
    float ms = time_ms(50, [&] { gcols<bf16><<<dim3((unsigned)tiles, (unsigned)s), 256>>>(xv, (bf16*)y, part, cnt, out, n, k, s); });
    printf("gemv cols bf16 slices %3llu: %7.1f GB/s %5.1f%%\n", s, wbytes / ms / 1e6, 100 * wbytes / ms / 1e6 / ceil);
  }
  // Correctness of the split: slices 1 and 3 agree (f32 accumulation in a different order).
  std::vector<unsigned short> r1(n), r3(n);
  gcols<bf16><<<dim3((unsigned)tiles, 1), 256>>>(xv, (bf16*)y, part, cnt, out, n, k, 1);
  CK(cudaMemcpy(r1.data(), out, n * 2, cudaMemcpyDeviceToHost));
  gcols<bf16><<<dim3((unsigned)tiles, 3), 256>>>(xv, (bf16*)y, part, cnt, out, n, k, 3);
  CK(cudaMemcpy(r3.data(), out, n * 2, cudaMemcpyDeviceToHost));
  int bad = 0;
  for (u64 i = 0; i < n; ++i) { int d = (int)r1[i] - (int)r3[i]; if (d > 2 || d < -2) ++bad; }
  printf("gemv cols slices 1 vs 3: %d of %llu outputs differ by more than 2 bf16 ulps\n", bad, n);
  return 0;
}
