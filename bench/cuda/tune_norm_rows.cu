// The forward norms a block per row (norm_registers.cuh's `_o` kernels) against the persistent `_r`
// kernels and a minimal one-row RMS norm (`simple`: no bounds checks, compile-time block size),
// bf16, against the copy ceiling measured in the same run; also the RMS norm with its weight
// loaded with the row (`rms pre-w`). One input buffer (4096-row cases get some L2 reuse, so
// bench_fast decides between close kernels), and the residual add's residual is the input
// shifted by 7 rows (its reads hit L2: compare the add kernels with each other only). Numbers
// in bench/results/2026-12-02-gpu-run25.md. Build and run on the GPU machine, from the
// repository root (-Xptxas -v lists registers):
//   nvcc -O3 -std=c++17 -arch=sm_90a -I crates/nuvec-cuda/kernels bench/cuda/tune_norm_rows.cu -o tnr && ./tnr
#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>
#include "norm_registers.cuh"
#include "harness.cuh"

typedef bf16 T;
typedef float A;

template <int V> __global__ void __launch_bounds__(NV_REG_BLOCK) rms_o(const T* x, const T* w, T* o, u64 r, u64 l) { rms_norm_one<T, V, false>(x, nullptr, w, nullptr, o, r, l, 1e-5f); }
template <int V> __global__ void __launch_bounds__(NV_REG_BLOCK) addrms_o(const T* x, const T* w, T* o, u64 r, u64 l) { rms_norm_one<T, V, true>(x, x + 7 * l, w, o + 7 * l, o, r, l, 1e-5f); }
template <int V> __global__ void __launch_bounds__(NV_REG_BLOCK) ln_o(const T* x, const T* w, T* o, u64 r, u64 l) { layer_norm_one<T, V>(x, w, w + 16384, o, r, l, 1e-5f); }
template <int V> __global__ void __launch_bounds__(NV_REG_BLOCK) ln_r(const T* x, const T* w, T* o, u64 r, u64 l, int g) { layer_norm_regs<T, V>(x, w, w + 16384, o, r, l, 1e-5f, g); }
template <int V> __global__ void __launch_bounds__(NV_REG_BLOCK) addrms_r(const T* x, const T* w, T* o, u64 r, u64 l, int g) { rms_norm_regs<T, V, true>(x, x + 7 * l, w, o + 7 * l, o, r, l, 1e-5f, g); }
template <int V> __global__ void __launch_bounds__(NV_REG_BLOCK) rms_r(const T* x, const T* w, T* o, u64 r, u64 l, int g) { rms_norm_regs<T, V, false>(x, nullptr, w, nullptr, o, r, l, 1e-5f, g); }

// One row per block of TH threads; each thread V vectors (t, t + TH, ...). ROWS rows per block
// in sequence when ROWS > 1 (grid = rows / ROWS).
template <int V, int TH, int ROWS>
__global__ void __launch_bounds__(TH) simple(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ o, u64 rows, u64 len) {
  constexpr int N = 8, NW = TH / 32;
  __shared__ float red[2][NW];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int rr = 0; rr < ROWS; ++rr) {
    u64 row = (u64)blockIdx.x * ROWS + rr;
    if (row >= rows) return;
    const Vec<T, N>* p = reinterpret_cast<const Vec<T, N>*>(x + row * len);
    Vec<T, N> r[V];
#pragma unroll
    for (int v = 0; v < V; ++v) r[v] = p[threadIdx.x + v * TH];
    float s = 0;
#pragma unroll
    for (int v = 0; v < V; ++v)
#pragma unroll
      for (int j = 0; j < N; ++j) { float f = widen(r[v].v[j]); s += f * f; }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (lane == 0) red[rr & 1][warp] = s;
    __syncthreads();
    s = lane < NW ? red[rr & 1][lane] : 0.f;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    float n = rsqrtf(s / (float)len + 1e-5f);
    Vec<T, N>* q = reinterpret_cast<Vec<T, N>*>(o + row * len);
#pragma unroll
    for (int v = 0; v < V; ++v) {
      float y[N];
#pragma unroll
      for (int j = 0; j < N; ++j) y[j] = widen(r[v].v[j]) * n;
      q[threadIdx.x + v * TH] = round_affine<T, N>(y, w, nullptr, threadIdx.x + v * TH);
    }
  }
}


template <int V> __global__ void __launch_bounds__(512) rms_pre(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ out, u64 rows, u64 len) {
  constexpr int N = 8;
  __shared__ float sm[2][32];
  int ph = 0;
  const u32 nvec = (u32)(len / N);
  for (u64 row = blockIdx.x; row < rows; row += gridDim.x) {
    Vec16<T> r[V], wv[V];
    one_load<T, V>(x + row * len, nvec, r);
    one_load<T, V>(w, nvec, wv);
    float s = 0;
#pragma unroll
    for (int v = 0; v < V; ++v)
      if (threadIdx.x + (u32)v * blockDim.x < nvec) {
#pragma unroll
        for (int j = 0; j < N; ++j) s += widen(r[v].v[j]) * widen(r[v].v[j]);
      }
    float n = inv_sqrt(block_sum(s, sm, ph) / (float)len + 1e-5f);
#pragma unroll
    for (int v = 0; v < V; ++v) {
      u32 i = threadIdx.x + (u32)v * blockDim.x;
      if (i >= nvec) continue;
      __nv_bfloat162 p[N / 2], q[N / 2];
#pragma unroll
      for (int j = 0; j < N / 2; ++j) p[j] = __floats2bfloat162_rn(widen(r[v].v[2 * j]) * n, widen(r[v].v[2 * j + 1]) * n);
      memcpy(q, &wv[v], sizeof(q));
#pragma unroll
      for (int j = 0; j < N / 2; ++j) p[j] = __hmul2(p[j], q[j]);
      Vec16<T> o;
      memcpy(&o, p, sizeof(o));
      reinterpret_cast<Vec16<T>*>(out + row * len)[i] = o;
    }
  }
}

static int sms;
static double ceil_gbs;
static void report(const char* what, u64 rows, u64 len, unsigned grid, int th, double bytes, float ms) {
  double gbs = bytes / ms / 1e6;
  printf("%-26s %6llux%-5llu block %4d grid %6u: %7.1f GB/s %5.1f%%\n", what, rows, len, th, grid, gbs, 100 * gbs / ceil_gbs);
}
template <typename K> static unsigned resident(K k, int threads) {
  int n = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, threads, 0));
  return (unsigned)(n > 0 ? n : 1) * sms;
}

template <int V, int TH, int ROWS> static void run_simple(u64 rows, u64 len, T* x, T* w, T* o, double bytes) {
  if ((u64)V * TH * 8 != len) return;
  unsigned grid = (unsigned)((rows + ROWS - 1) / ROWS);
  char what[64];
  snprintf(what, sizeof what, "simple V%d rows/blk %d", V, ROWS);
  report(what, rows, len, grid, TH, bytes, time_ms(20, [&] { simple<V, TH, ROWS><<<grid, TH>>>(x, w, o, rows, len); }));
}

template <int V> static void run_o(u64 rows, u64 len, T* x, T* w, T* o, double bytes) {
  u64 nvec = len / 8;
  int g = (int)(((nvec + V - 1) / V + 31) / 32 * 32);
  if (g > 512) return;
  unsigned grid = (unsigned)rows;
  char what[64];
  snprintf(what, sizeof what, "o V%d (new production)", V);
  report(what, rows, len, grid, g, bytes, time_ms(20, [&] { rms_o<V><<<grid, g>>>(x, w, o, rows, len); }));
  snprintf(what, sizeof what, "rms pre-w V%d", V);
  report(what, rows, len, grid, g, bytes, time_ms(20, [&] { rms_pre<V><<<grid, g>>>(x, w, o, rows, len); }));
  snprintf(what, sizeof what, "ln o V%d", V);
  report(what, rows, len, grid, g, bytes, time_ms(20, [&] { ln_o<V><<<grid, g>>>(x, w, o, rows, len); }));
  if (rows * len > (128ull << 20)) return;
  snprintf(what, sizeof what, "addrms o V%d", V);
  report(what, rows, len, grid, g, 2 * bytes, time_ms(20, [&] { addrms_o<V><<<grid, g>>>(x, w, o, rows, len); }));
  int groups = 512 / g, threads = groups * g;
  unsigned rg = (unsigned)std::min<u64>((rows + groups - 1) / groups, resident(ln_r<V>, threads));
  snprintf(what, sizeof what, "ln r V%d (old)", V);
  report(what, rows, len, rg, threads, bytes, time_ms(20, [&] { ln_r<V><<<rg, threads>>>(x, w, o, rows, len, g); }));
  rg = (unsigned)std::min<u64>((rows + (256 / g > 0 ? 256 / g : 1) - 1) / (256 / g > 0 ? 256 / g : 1), resident(addrms_r<V>, g > 256 ? g : 256 / g * g));
  int at = g > 256 ? g : 256 / g * g;
  snprintf(what, sizeof what, "addrms r V%d (old)", V);
  report(what, rows, len, rg, at, 2 * bytes, time_ms(20, [&] { addrms_r<V><<<rg, at>>>(x, w, o, rows, len, g); }));
}

template <int V> static void run_regs(u64 rows, u64 len, T* x, T* w, T* o, double bytes, int bt) {
  u64 nvec = len / 8;
  int g = (int)(((nvec + V - 1) / V + 31) / 32 * 32);
  if (g > bt) return;
  int groups = bt / g, threads = groups * g;
  u64 want = (rows + groups - 1) / groups;
  unsigned grid = (unsigned)std::min<u64>(want, resident(rms_r<V>, threads));
  char what[64];
  snprintf(what, sizeof what, "regs V%d (production)", V);
  report(what, rows, len, grid, threads, bytes, time_ms(20, [&] { rms_r<V><<<grid, threads>>>(x, w, o, rows, len, g); }));
}

int main() {
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  size_t big = 512ull << 20;
  T *x, *o, *w;
  CK(cudaMalloc(&x, big)); CK(cudaMalloc(&o, big)); CK(cudaMalloc(&w, 1 << 20));
  fill<T><<<1024, 256>>>(x, big / 2, -4.f, 4.f, 1);
  fill<T><<<64, 256>>>(w, (1 << 20) / 2, 0.75f, 1.25f, 2);
  float cms = time_ms(20, [&] { CK(cudaMemcpyAsync(o, x, big, cudaMemcpyDeviceToDevice)); });
  ceil_gbs = 2.0 * big / cms / 1e6;
  printf("copy ceiling: %.1f GB/s (%d SMs)\n", ceil_gbs, sms);
  struct { u64 rows, len; } shapes[] = {{32768, 4096}, {32768, 8192}, {4096, 8192}, {32768, 2048}, {4096, 4096}};
  for (auto s : shapes) {
    double bytes = 2.0 * s.rows * s.len * 2 + s.len * 2;
    u64 r = s.rows, l = s.len;
    run_regs<2>(r, l, x, w, o, bytes, 256);
    run_regs<2>(r, l, x, w, o, bytes, 512);
    run_regs<4>(r, l, x, w, o, bytes, 256);
    run_o<2>(r, l, x, w, o, bytes);
    run_o<4>(r, l, x, w, o, bytes);
    if (r * l > (64ull << 20)) continue;
    run_simple<1, 256, 1>(r, l, x, w, o, bytes);
    run_simple<2, 128, 1>(r, l, x, w, o, bytes);
    run_simple<2, 256, 1>(r, l, x, w, o, bytes);
    run_simple<4, 128, 1>(r, l, x, w, o, bytes);
    run_simple<2, 512, 1>(r, l, x, w, o, bytes);
    run_simple<4, 256, 1>(r, l, x, w, o, bytes);
    run_simple<8, 128, 1>(r, l, x, w, o, bytes);
    run_simple<2, 256, 4>(r, l, x, w, o, bytes);
    run_simple<4, 256, 4>(r, l, x, w, o, bytes);
    run_simple<2, 512, 4>(r, l, x, w, o, bytes);
  }
  return 0;
}
