// Times the cross-entropy loss with its gradient on the GPU: the two-kernel path (loss, then the
// derivative given the loss) against the fused cluster kernel (cross_entropy.cuh), both against
// the copy ceiling measured in the same run (bytes: one read and one write of the logits, the
// targets, the cotangent and the loss), and checks the fused outputs against the two kernels'
// on ragged rows (ignored and out-of-range targets, NaN and inf logits). Build and run on the GPU
// machine, from the repository root:
//   nvcc -O3 -std=c++17 -arch=sm_90a -I crates/nuvec-cuda/kernels bench/cuda/tune_xent.cu -o tx && ./tx
// Prints "check" lines (each should say 0 bad; `./tx q` skips them), then "target" lines for
// bf16 4096 x {32000, 128256, 152064}: the two kernels, and the fused kernel for 128..1024
// threads per block with the fewest blocks per row (cluster, C) that hold it and with 2, 4 and 8
// (C and the resident clusters in brackets). XENT_PAIRS="480:5,320:8" times those
// threads:cluster pairs instead. -DXENT_U=10 times the wide kernel (10 vectors per thread; the
// default is NV_ROW_LOADS, 8).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>
#include "cross_entropy.cuh"
#include "harness.cuh"

#ifndef XENT_U
#define XENT_U NV_ROW_LOADS
#endif

template <typename T>
__global__ void __launch_bounds__(1024) ce(const T* x, const i32* t, float* loss, u64 rows, u64 len) {
  cross_entropy_rows<T>(x, t, loss, rows, len);
}
template <typename T>
__global__ void ce_vjp(const T* x, const i32* t, const float* g, const float* loss, T* dx, u64 rows, u64 len) {
  cross_entropy_vjp_rows<T>(x, t, g, loss, dx, rows, len);
}
template <typename T>
__global__ void __launch_bounds__(1024) ce_fused(const T* x, const i32* t, const float* g, float* loss, T* dx, u64 rows,
                                                 u64 len, u64 slice) {
  cross_entropy_fused_rows<T, XENT_U>(x, t, g, loss, dx, rows, len, slice);
}

static int sms;

// fast/cross_entropy.rs's launches of the two kernels: 128 threads per row up to 64 K classes, 512 beyond,
// as many blocks as are resident.
template <typename T> static std::function<void()> two(const T* x, const i32* t, const float* g, float* loss, T* dx, u64 rows, u64 len) {
  int threads = len > 65536 ? 512 : 128, a = 0, b = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&a, ce<T>, threads, 0));
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, ce_vjp<T>, threads, 0));
  u64 ga = std::min<u64>(rows, (u64)std::max(a, 1) * sms), gb = std::min<u64>(rows, (u64)std::max(b, 1) * sms);
  return [=] {
    ce<T><<<(unsigned)ga, threads>>>(x, t, loss, rows, len);
    ce_vjp<T><<<(unsigned)gb, threads>>>(x, t, g, loss, dx, rows, len);
  };
}

// The fused kernel: C = ceil(vectors / (XENT_U × threads)) blocks per row, as many clusters
// as are resident (cudaOccupancyMaxActiveClusters). Returns an empty function when C > 8.
template <typename T>
static std::function<void()> fused(const T* x, const i32* t, const float* g, float* loss, T* dx, u64 rows, u64 len,
                                   int threads, int* c_out, int* clusters_out, int force = 0) {
  const u64 N = 16 / sizeof(T), nv = len / N, per = (u64)XENT_U * threads;
  u64 C = (nv + per - 1) / per;
  if (C < 1) C = 1;
  if (force) { if ((u64)force < C) return nullptr; C = force; }
  *c_out = (int)C;
  if (C > 16) return nullptr;
  if (C > 8) CK(cudaFuncSetAttribute(ce_fused<T>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  u64 slice = (nv + C - 1) / C;
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = (unsigned)C;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.blockDim = dim3(threads);
  cfg.gridDim = dim3((unsigned)(C * 1024));
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  auto kern = ce_fused<T>;
  if (C > 8) CK(cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  int clusters = 0;
  CK(cudaOccupancyMaxActiveClusters(&clusters, (void*)kern, &cfg));
  if (clusters < 1) clusters = 1;
  u64 k = std::min<u64>(rows, (u64)clusters);
  *clusters_out = (int)k;
  cfg.gridDim = dim3((unsigned)(C * k));
  return [=] {
    cudaLaunchConfig_t c = cfg;
    cudaLaunchAttribute at[1] = {attr[0]};
    c.attrs = at;
    CK(cudaLaunchKernelEx(&c, kern, x, t, g, loss, dx, rows, len, slice));
  };
}

template <typename T> static int check(const char* ty, u64 rows, u64 len, int threads) {
  u64 n = rows * len;
  T *x, *d1, *d2;
  i32* t;
  float *g, *l1, *l2;
  CK(cudaMalloc(&x, n * sizeof(T))); CK(cudaMalloc(&d1, n * sizeof(T))); CK(cudaMalloc(&d2, n * sizeof(T)));
  CK(cudaMalloc(&t, rows * 4)); CK(cudaMalloc(&g, rows * 4)); CK(cudaMalloc(&l1, rows * 4)); CK(cudaMalloc(&l2, rows * 4));
  fill<T><<<256, 256>>>(x, n, -8.f, 8.f, 7);
  std::vector<i32> ht(rows);
  std::vector<float> hg(rows);
  for (u64 r = 0; r < rows; ++r) {
    ht[r] = (i32)((r * 7919) % len);
    hg[r] = 0.5f + (float)(r % 5);
  }
  if (rows > 6) {
    ht[1] = -100;         // ignored
    ht[2] = (i32)len;     // past the classes: NaN loss, no gradient
    ht[5] = (i32)len - 1; // last class
  }
  CK(cudaMemcpy(t, ht.data(), rows * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(g, hg.data(), rows * 4, cudaMemcpyHostToDevice));
  if (rows > 6) {
    T nanv = f2h<T>(NAN), inf = f2h<T>(INFINITY), ninf = f2h<T>(-INFINITY);
    CK(cudaMemcpy(x + 3 * len + len / 2, &nanv, sizeof(T), cudaMemcpyHostToDevice));  // NaN row
    CK(cudaMemcpy(x + 4 * len + len - 1, &inf, sizeof(T), cudaMemcpyHostToDevice));   // +inf row
    CK(cudaMemcpy(x + 6 * len, &ninf, sizeof(T), cudaMemcpyHostToDevice));            // -inf element
  }
  two<T>(x, t, g, l1, d1, rows, len)();
  int C = 0, k = 0;
  auto f = fused<T>(x, t, g, l2, d2, rows, len, threads, &C, &k);
  if (!f) { printf("check %s %llux%llu: cluster of %d, skipped\n", ty, rows, len, C); return 0; }
  f();
  CK(cudaDeviceSynchronize());
  std::vector<T> a(n), b(n);
  std::vector<float> la(rows), lb(rows);
  CK(cudaMemcpy(a.data(), d1, n * sizeof(T), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(b.data(), d2, n * sizeof(T), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(la.data(), l1, rows * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(lb.data(), l2, rows * 4, cudaMemcpyDeviceToHost));
  auto same = [](float p, float q, float tol) {
    if (std::isnan(p) || std::isnan(q)) return std::isnan(p) && std::isnan(q);
    if (std::isinf(p) || std::isinf(q)) return p == q;
    return std::fabs(p - q) <= tol * (1 + std::fabs(p));
  };
  u64 bad = 0;
  for (u64 r = 0; r < rows; ++r) if (!same(la[r], lb[r], 1e-5f)) { if (bad < 4) printf("  loss row %llu: %g vs %g\n", r, la[r], lb[r]); ++bad; }
  float tol = sizeof(T) == 2 ? 1e-2f : 1e-5f;
  for (u64 i = 0; i < n; ++i) if (!same(h2f(a[i]), h2f(b[i]), tol)) { if (bad < 8) printf("  grad %llu (row %llu): %g vs %g\n", i, i / len, h2f(a[i]), h2f(b[i])); ++bad; }
  printf("check %s %llux%llu threads %d cluster %d: %llu bad\n", ty, rows, len, threads, C, bad);
  cudaFree(x); cudaFree(d1); cudaFree(d2); cudaFree(t); cudaFree(g); cudaFree(l1); cudaFree(l2);
  return bad != 0;
}

int main(int argc, char** argv) {
  bool quick = argc > 1;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  size_t cb = 1ull << 30;
  void *ca, *cbuf;
  CK(cudaMalloc(&ca, cb)); CK(cudaMalloc(&cbuf, cb));
  double ceil = 2.0 * cb / time_ms(20, [&] { CK(cudaMemcpyAsync(cbuf, ca, cb, cudaMemcpyDeviceToDevice)); }) / 1e6;
  printf("ceiling copy %.1f GB/s\n", ceil);
  CK(cudaFree(ca)); CK(cudaFree(cbuf));
  int bad = 0;
  for (int th : {256, 512, 1024}) {
    if (quick) break;
    bad += check<bf16>("bf16", 64, 32000, th);
    bad += check<bf16>("bf16", 64, 128256, th);
    bad += check<float>("f32", 64, 40000, th);
    bad += check<f16>("f16", 33, 1000, th);
    bad += check<bf16>("bf16", 9, 8, th);
    bad += check<bf16>("bf16", 700, 152064, th);
  }
  const u64 rows = 4096;
  for (u64 v : {32000ull, 128256ull, 152064ull}) {
    u64 n = rows * v;
    bf16 *x, *dx;
    i32* t;
    float *g, *loss;
    CK(cudaMalloc(&x, n * 2)); CK(cudaMalloc(&dx, n * 2));
    CK(cudaMalloc(&t, rows * 4)); CK(cudaMalloc(&g, rows * 4)); CK(cudaMalloc(&loss, rows * 4));
    fill<bf16><<<1024, 256>>>(x, n, -4.f, 4.f, 3);
    std::vector<i32> ht(rows);
    for (u64 r = 0; r < rows; ++r) ht[r] = (i32)((r * 7919) % v);
    std::vector<float> hg(rows, 1.f / rows);
    CK(cudaMemcpy(t, ht.data(), rows * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(g, hg.data(), rows * 4, cudaMemcpyHostToDevice));
    double bytes = 4.0 * n + 12.0 * rows;
    auto report = [&](const char* what, const std::function<void()>& f) {
      double gbs = bytes / time_ms(10, f) / 1e6;
      printf("target bf16 %llux%llu %-28s %7.1f GB/s %5.1f%%\n", rows, v, what, gbs, 100 * gbs / ceil);
    };
    report("two kernels", two<bf16>(x, t, g, loss, dx, rows, v));
    if (getenv("XENT_PAIRS")) {
      int th, c;
      const char* q = getenv("XENT_PAIRS");
      int used;
      while (sscanf(q, "%d:%d%n", &th, &c, &used) == 2) {
        q += used;
        if (*q == ',') ++q;
        int C = 0, k = 0;
        auto f = fused<bf16>(x, t, g, loss, dx, rows, v, th, &C, &k, c);
        if (!f) continue;
        char what[64];
        snprintf(what, sizeof what, "fused %d thr [C=%d, %d cl]", th, C, k);
        report(what, f);
      }
      continue;
    }
    for (int th : {128, 256, 512, 1024}) {
      for (int force : {0, 2, 4, 8}) {
        int C = 0, k = 0;
        auto f = fused<bf16>(x, t, g, loss, dx, rows, v, th, &C, &k, force);
        if (!f || (force && C == (int)((v / 8 + XENT_U * th - 1) / (XENT_U * th)))) continue;
        char what[64];
        snprintf(what, sizeof what, "fused %d thr [C=%d, %d cl]", th, C, k);
        report(what, f);
      }
    }
    cudaFree(x); cudaFree(dx); cudaFree(t); cudaFree(g); cudaFree(loss);
  }
  printf("checks: %d failing\n", bad);
  return bad != 0;
}
