// Times nuvec's row kernels (log-sum-exp, the cross-entropy loss, softmax) and decode GEMVs on
// the GPU against the copy ceiling measured in the same run, checks them against plain reference
// kernels, and sweeps launch shapes. It compiles the kernels' own headers
// (crates/nuvec-cuda/kernels), so a variant of a header can be timed before the dispatch in
// fast/*.rs / matmul.rs changes to match. Build and run on the GPU machine, from
// the repository root:
//   nvcc -O3 -std=c++17 -arch=sm_90a -I crates/nuvec-cuda/kernels bench/cuda/tune_rows.cu -o tune && ./tune
// -DNV_ROW_LOADS=n / -DNV_GEMV_ROW_LOADS=n / -DNV_GEMV_COL_LOADS=n set the 16-byte loads in
// flight per thread; `./tune targets` stops after the target lines, `./tune cols` runs only the
// gemv_cols slices sweep:
//   for u in 4 8 16; do nvcc ... -DNV_GEMV_ROW_LOADS=$u -o tune$u && ./tune$u targets; done
// Prints: the copy ceiling; "target" lines in GB/s and % of the ceiling for bf16 log-sum-exp
// 16384x4096 and 4096x16384 (a warp per row, as fast/softmax.rs), the cross-entropy loss
// 4096x{32000,128256,152064} (fast/cross_entropy.rs's launch; also with the other thread count) and the
// GEMV 1x4096 . W[14336,4096]^T (matmul.rs's launch; in parentheses two other GEMV shapes);
// "check" lines against the references (edge rows with NaN/inf, short and unaligned rows for 4
// types; GEMVs for M = 1..8 and ragged shapes), each should say 0 bad; then the sweeps (threads
// per row, softmax, gemv_cols slices).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>
#include "matmul.cuh"
#include "cross_entropy.cuh"
#include "harness.cuh"

// ---- Kernels as kernels.rs wraps them.
template <typename T> __global__ void lse_warp(const T* x, T* o, u64 r, u64 l) { logsumexp_rows_warp<T>(x, o, r, l); }
template <typename T> __global__ void lse_block(const T* x, T* o, u64 r, u64 l) { logsumexp_rows<T>(x, o, r, l); }
template <typename T>
__global__ void __launch_bounds__(1024) ce(const T* x, const i32* t, typename Acc<T>::type* loss, u64 rows, u64 len) {
  cross_entropy_rows<T>(x, t, loss, rows, len);
}
template <typename T> __global__ void sm_block(const T* x, T* o, u64 r, u64 l) { softmax_rows<T>(x, o, r, l); }
template <typename T> __global__ void sm_warp(const T* x, T* o, u64 r, u64 l) { softmax_rows_warp<T>(x, o, r, l); }
template <typename T, int M>
__global__ void grows(const T* x, const T* w, T* o, u64 n, u64 k, u64 ldx, u64 ldw, u64 ldo) {
  gemv_rows<T, M, PRO_NONE>(x, nullptr, 0, 0.0f, w, o, n, k, ldx, ldw, ldo, nullptr, 0.0f);
}
template <typename T> __global__ void __launch_bounds__(NV_GEMV_COL_BLOCK) gcols(const T* x, const T* b, float* p, unsigned* c, T* o, u64 n, u64 k, u64 s) { gemv_cols<T, 1>(x, b, p, c, o, n, k, k, n, n, s); }

// ---- References: a thread per row / output, double precision, the composition's semantics.
template <typename T> __global__ void ref_lse(const T* x, double* o, u64 rows, u64 len) {
  u64 r = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const T* p = x + r * len;
  double m = -INFINITY;
  bool nan = false;
  for (u64 i = 0; i < len; ++i) {
    double v = (double)widen(p[i]);
    if (v != v) nan = true;
    else if (v > m) m = v;
  }
  if (nan) { o[r] = NAN; return; }
  if (isinf(m)) { o[r] = m; return; }
  double s = 0;
  for (u64 i = 0; i < len; ++i) s += exp((double)widen(p[i]) - m);
  o[r] = log(s) + m;
}
template <typename T> __global__ void ref_gemv(const T* x, const T* w, double* o, double* mag, int M, u64 n, u64 k, u64 ldx, u64 ldw) {
  u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= (u64)M * n) return;
  u64 m = e / n, c = e % n;
  double s = 0, a = 0;
  for (u64 i = 0; i < k; ++i) {
    double p = (double)widen(x[m * ldx + i]) * (double)widen(w[c * ldw + i]);
    s += p;
    a += fabs(p);
  }
  o[e] = s;
  mag[e] = a;
}

static int sms;
static double ceil_gbs;

static void target(const char* what, double bytes, const std::function<void()>& f, const char* extra_name = nullptr,
                   const std::function<void()>& extra_f = nullptr) {
  double g = bytes / time_ms(20, f) / 1e6;
  printf("target %-40s %7.1f GB/s %5.1f%%", what, g, 100 * g / ceil_gbs);
  if (extra_f) {
    double ge = bytes / time_ms(20, extra_f) / 1e6;
    printf("   %s %7.1f GB/s %5.1f%%", extra_name, ge, 100 * ge / ceil_gbs);
  }
  printf("\n");
}

// fast/softmax.rs: a warp per row up to 64 KiB (grid_for: rows / 8 blocks of 256, at most 32 per SM).
template <typename T> static void launch_lse_warp(const T* x, T* o, u64 rows, u64 len) {
  u64 g = (rows + 7) / 8, cap = (u64)sms * 32;
  lse_warp<T><<<(unsigned)(g < cap ? g : cap), 256>>>(x, o, rows, len);
}
// fast/cross_entropy.rs: 128 threads per row up to 64 K features, 512 beyond; row_grid: as many blocks
// as are resident at once.
template <typename T>
static std::function<void()> launch_ce(const T* x, const i32* t, float* loss, u64 rows, u64 len, int threads = 0) {
  int per = 0;
  if (threads == 0) threads = len > 65536 ? 512 : 128;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, ce<T>, threads, 0));
  u64 resident = (u64)(per > 0 ? per : 1) * sms, g = rows < resident ? rows : resident;
  return [=] { ce<T><<<(unsigned)g, threads>>>(x, t, loss, rows, len); };
}
// matmul.rs: n / 8 blocks of 256 (a warp's worth of threads per output).
template <typename T, int M>
static void launch_gemv(const T* x, const T* w, T* o, u64 n, u64 k, u64 ldx, u64 ldw, u64 ldo, unsigned block = 256,
                        unsigned grid = 0) {
  u64 g = (n + block / 32 - 1) / (block / 32), cap = 65535ull * 32;
  if (grid == 0) grid = (unsigned)(g < cap ? g : cap);
  grows<T, M><<<grid, block>>>(x, w, o, n, k, ldx, ldw, ldo);
}

// ---- Checks.
static bool agrees(double got, double want, double tol) {
  if (want != want) return got != got;
  if (std::isinf(want)) return got == want;
  return fabs(got - want) <= tol;
}

// Rows of `len` elements, packed (odd lengths leave rows unaligned), starting `shift` elements
// past an aligned address; row kinds cover NaN/inf combinations. Both the warp and the block
// kernel (64 and 256 threads) are checked against ref_lse; returns the mismatches.
template <typename T> static int check_lse(const char* ty, u64 len, u64 shift) {
  const int kinds = 12;
  u64 rows = 3 * kinds, n = rows * len + shift;
  std::vector<T> h(n);
  u64 s = 12345 + len;
  auto rnd = [&] { s = s * 6364136223846793005ull + 1442695040888963407ull; return (float)((s >> 40) & 0xffffff) / 16777216.0f; };
  for (u64 i = 0; i < n; ++i) h[i] = f2h<T>(8 * rnd() - 4);
  for (u64 r = 0; r < rows; ++r) {
    T* p = &h[shift + r * len];
    u64 a = (u64)(rnd() * len), b = (u64)(rnd() * len);
    float inf = INFINITY, nan = NAN;
    switch (r % kinds) {
      case 0: break;                                                   // plain
      case 1: p[a] = f2h<T>(nan); break;                               // one NaN
      case 2: p[a] = f2h<T>(inf); break;                               // +inf: the maximum
      case 3: p[a] = f2h<T>(inf); p[b] = f2h<T>(inf); break;           // two (or one) +inf
      case 4: for (u64 i = 0; i < len; ++i) p[i] = f2h<T>(-inf); break;  // all -inf
      case 5: for (u64 i = 0; i < len; ++i) p[i] = f2h<T>(-inf); p[a] = f2h<T>(nan); break;
      case 6: p[a] = f2h<T>(inf); p[b] = f2h<T>(nan); break;           // +inf and NaN
      case 7: for (u64 i = 0; i < len; ++i) p[i] = f2h<T>(nan); break;   // all NaN
      case 8: for (u64 i = 0; i < len; ++i) p[i] = f2h<T>(-inf); p[a] = f2h<T>(1.5f); break;
      case 9: for (u64 i = 0; i < len; ++i) p[i] = f2h<T>(60 + 30 * rnd()); break;  // exp would overflow
      case 10: for (u64 i = 0; i < len; ++i) p[i] = f2h<T>(i % 3 ? -inf : 2 * rnd()); break;
      case 11: for (u64 i = 0; i < len; ++i) p[i] = f2h<T>((float)i / len * 20 - 10); break;  // rising: rescales
    }
  }
  T *x, *o; double* ref;
  CK(cudaMalloc(&x, n * sizeof(T) + 16)); CK(cudaMalloc(&o, rows * sizeof(T))); CK(cudaMalloc(&ref, rows * 8));
  CK(cudaMemcpy(x, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  ref_lse<T><<<(unsigned)((rows + 63) / 64), 64>>>(x + shift, ref, rows, len);
  std::vector<double> want(rows);
  CK(cudaMemcpy(want.data(), ref, rows * 8, cudaMemcpyDeviceToHost));
  int bad = 0;
  std::vector<T> got(rows);
  for (int variant = 0; variant < 3; ++variant) {
    CK(cudaMemset(o, 0x55, rows * sizeof(T)));
    if (variant == 0) lse_warp<T><<<(unsigned)((rows + 7) / 8), 256>>>(x + shift, o, rows, len);
    if (variant == 1) lse_block<T><<<(unsigned)rows, 256>>>(x + shift, o, rows, len);
    if (variant == 2) lse_block<T><<<5, 64>>>(x + shift, o, rows, len);
    CK(cudaGetLastError());
    CK(cudaMemcpy(got.data(), o, rows * sizeof(T), cudaMemcpyDeviceToHost));
    double rel = sizeof(T) == 2 ? 1.0 / 128 : sizeof(T) == 4 ? 1e-5 : 1e-10;
    for (u64 r = 0; r < rows; ++r) {
      double g = h2f(got[r]);
      if (!agrees(g, want[r], rel * fabs(want[r]) + rel)) {
        if (bad < 5) printf("  lse %s len %llu shift %llu variant %d row %llu (kind %llu): got %g want %g\n", ty, len, shift, variant, r, r % kinds, g, want[r]);
        ++bad;
      }
    }
  }
  CK(cudaFree(x)); CK(cudaFree(o)); CK(cudaFree(ref));
  return bad;
}

template <typename T, int M> static int check_gemv_m(u64 n, u64 k, unsigned block, unsigned grid) {
  const int V = 16 / sizeof(T);
  u64 ldw = (k + V - 1) / V * V, ldx = M > 1 ? ldw + V : k;  // the dispatch's alignment rules
  u64 nx = (u64)M * (ldx > k ? ldx : k), nw = n * ldw;
  T *x, *w, *o; double *ref, *mag;
  CK(cudaMalloc(&x, nx * sizeof(T))); CK(cudaMalloc(&w, nw * sizeof(T))); CK(cudaMalloc(&o, M * n * sizeof(T)));
  CK(cudaMalloc(&ref, M * n * 8)); CK(cudaMalloc(&mag, M * n * 8));
  fill<T><<<256, 256>>>(x, nx, -1, 1, 7 + M);
  fill<T><<<1024, 256>>>(w, nw, -1, 1, 11 + (u32)k);
  ref_gemv<T><<<(unsigned)((M * n + 127) / 128), 128>>>(x, w, ref, mag, M, n, k, ldx, ldw);
  CK(cudaMemset(o, 0x55, M * n * sizeof(T)));
  launch_gemv<T, M>(x, w, o, n, k, ldx, ldw, n, block, grid);
  CK(cudaGetLastError());
  std::vector<T> got(M * n);
  std::vector<double> want(M * n), m(M * n);
  CK(cudaMemcpy(got.data(), o, M * n * sizeof(T), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(want.data(), ref, M * n * 8, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(m.data(), mag, M * n * 8, cudaMemcpyDeviceToHost));
  int bad = 0;
  double rel = sizeof(T) == 2 ? 1.0 / 128 : 1e-6;  // the output's rounding
  for (u64 e = 0; e < (u64)M * n; ++e) {
    double g = h2f(got[e]);
    if (!agrees(g, want[e], rel * fabs(want[e]) + 3e-5 * m[e] + 1e-6)) {
      if (bad < 3) printf("  gemv M %d n %llu k %llu block %u: out[%llu] got %g want %g\n", M, n, k, block, e, g, want[e]);
      ++bad;
    }
  }
  CK(cudaFree(x)); CK(cudaFree(w)); CK(cudaFree(o)); CK(cudaFree(ref)); CK(cudaFree(mag));
  return bad;
}
template <typename T> static int check_gemv(u64 n, u64 k, unsigned block = 256, unsigned grid = 0) {
  return check_gemv_m<T, 1>(n, k, block, grid) + check_gemv_m<T, 2>(n, k, block, grid) + check_gemv_m<T, 3>(n, k, block, grid) +
         check_gemv_m<T, 4>(n, k, block, grid) + check_gemv_m<T, 5>(n, k, block, grid) + check_gemv_m<T, 6>(n, k, block, grid) +
         check_gemv_m<T, 7>(n, k, block, grid) + check_gemv_m<T, 8>(n, k, block, grid);
}

template <typename T> void rows_case(const char* op, const char* ty, u64 rows, u64 len, void* x, void* o) {
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
    printf("%s %s %llux%llu threads/row %4d: %7.1f GB/s %5.1f%%\n", op, ty, rows, len, g, gbs, 100 * gbs / ceil_gbs);
  }
}

int main(int argc, char** argv) {
  bool only_targets = argc > 1 && !strcmp(argv[1], "targets");
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  size_t big = 256ull << 20;
  void *x, *o, *y;
  CK(cudaMalloc(&x, big)); CK(cudaMalloc(&o, big)); CK(cudaMalloc(&y, big));
  fill<float><<<4096, 256>>>((float*)x, big / 4, -4, 4, 1);
  fill<bf16><<<4096, 256>>>((bf16*)y, big / 2, -4, 4, 2);
  float cms = time_ms(20, [&] { CK(cudaMemcpyAsync(o, x, big, cudaMemcpyDeviceToDevice)); });
  ceil_gbs = 2.0 * big / cms / 1e6;
  printf("copy ceiling: %.1f GB/s (%d SMs), NV_ROW_LOADS %d, NV_GEMV_ROW_LOADS %d\n", ceil_gbs, sms, NV_ROW_LOADS, NV_GEMV_ROW_LOADS);

  // ---- Targets.
  bf16* yb = (bf16*)y;
  bf16* ob = (bf16*)o;
  // `./tune cols`: only the gemv_cols slices sweep, three times (its spread is a few points).
  if (argc > 1 && !strcmp(argv[1], "cols")) {
    u64 n = 14336, k = 4096, tiles = (n + 63) / 64;
    double wbytes = (double)n * k * 2;
    float* part;
    unsigned* cnt;
    CK(cudaMalloc(&part, 256 * n * 4)); CK(cudaMalloc(&cnt, 1 << 16)); CK(cudaMemset(cnt, 0, 1 << 16));
    int resident = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, gcols<bf16>, 256, 0));
    printf("gemv cols (NV_GEMV_COL_LOADS %d): %d resident blocks per SM, %llu tiles\n", NV_GEMV_COL_LOADS, resident, tiles);
    for (int rep = 0; rep < 3; ++rep) {
      printf("gemv cols bf16 1x4096 . [4096,14336] %% of copy by slices:");
      for (u64 sl : {1ull, 2ull, 3ull, 4ull, 5ull, 6ull, 8ull}) {
        // The weights alternate between two copies, as bench_gpu's do, so L2 does not serve them.
        int it = 0;
        float ms = time_ms(100, [&] {
          bf16* w = yb + (it++ & 1) * n * k;
          gcols<bf16><<<dim3((unsigned)tiles, (unsigned)sl), 256>>>(ob, w, part, cnt, ob + (1 << 20), n, k, sl);
        });
        printf("  %llu: %5.1f", sl, 100 * wbytes / ms / 1e6 / ceil_gbs);
      }
      printf("\n");
    }
    return 0;
  }
  for (u64 len : {4096ull, 16384ull}) {
    u64 rows = (64ull << 20) / len;  // 128 MiB of bf16
    char what[64];
    snprintf(what, sizeof what, "lse bf16 %llux%llu (warp)", rows, len);
    target(what, (double)rows * len * 2, [&] { launch_lse_warp<bf16>(yb, ob, rows, len); });
  }
  {
    u64 rows = 4096, maxlen = 152064;
    bf16* logits;
    i32* tg;
    float* loss;
    CK(cudaMalloc(&logits, rows * maxlen * 2)); CK(cudaMalloc(&tg, rows * 4)); CK(cudaMalloc(&loss, rows * 4));
    fill<bf16><<<8192, 256>>>(logits, rows * maxlen, -8, 8, 3);
    std::vector<i32> ht(rows);
    for (u64 len : {32000ull, 128256ull, 152064ull}) {
      for (u64 r = 0; r < rows; ++r) ht[r] = (i32)((r * 7919) % len);
      CK(cudaMemcpy(tg, ht.data(), rows * 4, cudaMemcpyHostToDevice));
      char what[64];
      snprintf(what, sizeof what, "cross-entropy bf16 %llux%llu (%d thr)", rows, len, len > 65536 ? 512 : 128);
      int alt = len > 65536 ? 1024 : 256;
      target(what, (double)rows * len * 2, launch_ce<bf16>(logits, tg, loss, rows, len), alt == 1024 ? "1024 thr" : "256 thr",
             launch_ce<bf16>(logits, tg, loss, rows, len, alt));
    }
    CK(cudaFree(logits)); CK(cudaFree(tg)); CK(cudaFree(loss));
  }
  u64 n = 14336, k = 4096;
  double wbytes = (double)n * k * 2;
  bf16* xv = (bf16*)o;  // up to 8 rows of 14336 inputs
  bf16* out = (bf16*)o + (1 << 20);
  fill<bf16><<<256, 256>>>(xv, 8 * 14336, -1, 1, 4);
  target("gemv rows bf16 1x4096 . [14336,4096]^T", wbytes, [&] { launch_gemv<bf16, 1>(xv, yb, out, n, k, k, k, n); });
  // Not a target: the down projection's shape (long K, fewer outputs: 512 blocks), and M = 4.
  target("(gemv rows bf16 1x14336 . [4096,14336]^T)", wbytes, [&] { launch_gemv<bf16, 1>(xv, yb, out, k, n, n, n, k); });
  target("(gemv rows bf16 4x4096 . [14336,4096]^T)", wbytes, [&] { launch_gemv<bf16, 4>(xv, yb, out, n, k, k, k, n); });
  if (only_targets) return 0;

  // ---- Checks against the references.
  int bad = 0;
  for (u64 len : {1ull, 3ull, 7ull, 8ull, 9ull, 17ull, 100ull, 255ull, 1000ull, 4096ull, 4099ull, 33000ull})
    for (u64 shift : {0ull, 1ull, 5ull}) {
      bad += check_lse<bf16>("bf16", len, shift);
      bad += check_lse<f16>("f16", len, shift);
      bad += check_lse<float>("f32", len, shift);
      bad += check_lse<double>("f64", len, shift);
    }
  printf("check lse (edge rows, 12 lengths x 3 offsets x 4 types x 3 launches): %d bad\n", bad);
  bad = 0;
  for (auto nk : std::vector<std::pair<u64, u64>>{{1, 8}, {7, 13}, {9, 4096}, {37, 1000}, {37, 1003}, {300, 257}, {3, 70001}, {14336, 4096}}) {
    bad += check_gemv<bf16>(nk.first, nk.second);
    bad += check_gemv<f16>(nk.first, nk.second);
    bad += check_gemv<float>(nk.first, nk.second);
  }
  bad += check_gemv<bf16>(1000, 4096, 96, 3);  // 3 warps per block, grid-stride over groups
  bad += check_gemv<float>(77, 515, 512, 2);
  printf("check gemv rows (M 1..8, 8 shapes x 3 types, 2 other launches): %d bad\n", bad);

  // ---- Sweeps: threads per row, softmax, gemv_cols slices.
  rows_case<float>("lse", "f32", 16384, 4096, x, o);
  rows_case<float>("lse", "f32", 4096, 16384, x, o);
  rows_case<bf16>("lse", "bf16", 16384, 4096, y, o);
  rows_case<bf16>("lse", "bf16", 4096, 16384, y, o);
  rows_case<float>("softmax", "f32", 4096, 16384, x, o);
  rows_case<bf16>("softmax", "bf16", 16384, 4096, y, o);
  float* part; unsigned* cnt;
  CK(cudaMalloc(&part, 256 * n * 4)); CK(cudaMalloc(&cnt, 1 << 16)); CK(cudaMemset(cnt, 0, 1 << 16));
  u64 tiles = (n + 63) / 64;
  int resident = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, gcols<bf16>, 256, 0));
  printf("gemv cols: %d resident blocks per SM, %llu tiles\n", resident, tiles);
  for (u64 s : {1ull, 2ull, 3ull, 4ull, 6ull, 8ull}) {
    float ms = time_ms(50, [&] { gcols<bf16><<<dim3((unsigned)tiles, (unsigned)s), 256>>>(xv, yb, part, cnt, out, n, k, s); });
    printf("gemv cols bf16 slices %3llu: %7.1f GB/s %5.1f%%\n", s, wbytes / ms / 1e6, 100 * wbytes / ms / 1e6 / ceil_gbs);
  }
  return 0;
}
