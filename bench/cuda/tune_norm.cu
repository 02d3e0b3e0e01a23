// Sweeps the launch shapes of the register-row norm kernels (norm_registers.cuh: `_r` persistent
// groups with the next row ahead, `_o` a block per row) against norm.cuh's looping kernels, and
// times RoPE (rope.cuh), against the copy ceiling measured in the same run, bf16, at the shapes
// of bench_fast. Bytes are those of an ideal kernel (as bench_fast counts
// them). Build and run on the GPU machine (-Xptxas -v lists registers and spills per kernel; an
// argument norm or rope runs one part):
//   nvcc -O3 -std=c++17 -arch=sm_90a -I crates/nuvec-cuda/kernels bench/cuda/tune_norm.cu -o tune_norm && ./tune_norm
#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>
#include "norm_registers.cuh"
#include "rope.cuh"

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e), __LINE__); exit(1); } } while (0)

typedef bf16 T;
typedef float A;

template <int V> __global__ void __launch_bounds__(NV_REG_BLOCK) rms_r(const T* x, const T* w, T* o, u64 r, u64 l, int g) { rms_norm_regs<T, V, false>(x, nullptr, w, nullptr, o, r, l, 1e-5f, g); }
template <int V> __global__ void __launch_bounds__(NV_REG_BLOCK) rms_o(const T* x, const T* w, T* o, u64 r, u64 l) { rms_norm_one<T, V, false>(x, nullptr, w, nullptr, o, r, l, 1e-5f); }
template <int V> __global__ void __launch_bounds__(NV_REG_BLOCK) ln_o(const T* x, const T* w, const T* b, T* o, u64 r, u64 l) { layer_norm_one<T, V>(x, w, b, o, r, l, 1e-5f); }
template <int V> __global__ void __launch_bounds__(NV_REG_BLOCK) ln_r(const T* x, const T* w, const T* b, T* o, u64 r, u64 l, int g) { layer_norm_regs<T, V>(x, w, b, o, r, l, 1e-5f, g); }
template <int V> __global__ void __launch_bounds__(NV_REG_BLOCK, 1) rmsb_r(const T* x, const T* w, const T* gy, T* gx, A* p, u64 r, u64 l, int g) { rms_norm_vjp_regs<T, V>(x, w, gy, gx, p, r, l, 1e-5f, g); }
template <int V> __global__ void __launch_bounds__(NV_REG_BLOCK, 1) lnb_r(const T* x, const T* w, const T* gy, T* gx, A* p, u64 r, u64 l, int g) { layer_norm_vjp_regs<T, V, false>(x, w, gy, gx, p, r, l, 1e-5f, g); }
__global__ void __launch_bounds__(1024) rms_loop(const T* x, const T* w, T* o, u64 r, u64 l) { rms_norm_rows<T>(x, nullptr, w, nullptr, o, r, l, 1e-5f); }
__global__ void __launch_bounds__(NV_NORM_VJP_THREADS) rmsb_loop(const T* x, const T* w, const T* gy, T* gx, A* p, u64 r, u64 l) { rms_norm_vjp_rows<T>(x, w, gy, gx, p, r, l, 1e-5f); }
__global__ void rope_k(const T* x, T* o, const i32* off, u64 rows, u64 len, u64 seq) {
  rope_rows<T, 8, true>(x, o, off, 0, nullptr, 13.2877f, 1.0f, 1.0f, 0, rows, len, len, seq, rows);
}

__global__ void __launch_bounds__(NV_COL_SUM_THREADS) colsum(const A* p, A* o, u64 parts, u64 len) { col_sum<A>(p, o, nullptr, parts, len, len, len); }

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

static int sms;
static double ceil_gbs;
static void report(const char* what, u64 rows, u64 len, int v, int threads, unsigned grid, double bytes, float ms) {
  double gbs = bytes / ms / 1e6;
  printf("%-10s %6llux%-5llu V %d block %4d grid %5u: %7.1f GB/s %5.1f%%\n", what, rows, len, v, threads, grid, gbs, 100 * gbs / ceil_gbs);
}

template <typename K> static unsigned resident(K k, int threads) {
  int n = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, threads, 0));
  return (unsigned)(n > 0 ? n : 1) * sms;
}

template <int V> static void sweep_bwd(u64 rows, u64 len, T* x, T* w, T* gy, T* o, A* part, A* dw) {
  u64 nvec = len / 8;
  int g = (int)(((nvec + V - 1) / V + 31) / 32 * 32);
  if (g > 512) return;
  double xb = (double)rows * len * 2, wb = (double)len * 2;
  int groups = 512 / g, threads = groups * g;
  u64 want = (rows + groups - 1) / groups;
  unsigned grid = (unsigned)std::min<u64>(want, resident(rmsb_r<V>, threads));
  report("rms bwd", rows, len, V, threads, grid, 3 * xb + 2 * wb, time_ms(20, [&] {
    rmsb_r<V><<<grid, threads>>>(x, w, gy, o, part, rows, len, g);
    colsum<<<(unsigned)((len + 127) / 128), NV_COL_SUM_THREADS>>>(part, dw, grid, len);
  }));
  grid = (unsigned)std::min<u64>(want, resident(lnb_r<V>, threads));
  report("ln bwd", rows, len, V, threads, grid, 3 * xb + 3 * wb, time_ms(20, [&] {
    lnb_r<V><<<grid, threads>>>(x, w, gy, o, part, rows, len, g);
    colsum<<<(unsigned)((len + 127) / 128), NV_COL_SUM_THREADS>>>(part, dw, grid, len);
  }));
}

template <int V> static void sweep(u64 rows, u64 len, T* x, T* w, T* b, T* o) {
  u64 nvec = len / 8;
  int g = (int)(((nvec + V - 1) / V + 31) / 32 * 32);
  if (g > 512) return;
  double xb = (double)rows * len * 2, wb = (double)len * 2;
  // The `_o` kernels: a block per row.
  unsigned all = (unsigned)rows;
  report("rms fwd o", rows, len, V, g, all, 2 * xb + wb, time_ms(20, [&] { rms_o<V><<<all, g>>>(x, w, o, rows, len); }));
  report("ln fwd o", rows, len, V, g, all, 2 * xb + 2 * wb, time_ms(20, [&] { ln_o<V><<<all, g>>>(x, w, b, o, rows, len); }));
  for (int bt : {256, 512}) {
    if (g > bt) continue;
    int groups = bt / g, threads = groups * g;
    u64 want = (rows + groups - 1) / groups;
    unsigned grid = (unsigned)std::min<u64>(want, resident(rms_r<V>, threads));
    report("rms fwd", rows, len, V, threads, grid, 2 * xb + wb, time_ms(20, [&] { rms_r<V><<<grid, threads>>>(x, w, o, rows, len, g); }));
    grid = (unsigned)std::min<u64>(want, resident(ln_r<V>, threads));
    report("ln fwd", rows, len, V, threads, grid, 2 * xb + 2 * wb, time_ms(20, [&] { ln_r<V><<<grid, threads>>>(x, w, b, o, rows, len, g); }));
  }
}

int main(int argc, char** argv) {
  // An argument (norm, rope) runs only that part.
  auto want = [&](const char* p) { return argc < 2 || strcmp(argv[1], p) == 0; };
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  size_t big = 512ull << 20;
  T *x, *gy, *o, *w, *b;
  A *part, *dw;
  CK(cudaMalloc(&x, big)); CK(cudaMalloc(&gy, big)); CK(cudaMalloc(&o, big));
  CK(cudaMalloc(&w, 1 << 20)); CK(cudaMalloc(&b, 1 << 20)); CK(cudaMalloc(&part, 64 << 20)); CK(cudaMalloc(&dw, 1 << 20));
  {
    std::vector<unsigned short> h(big / 2);
    for (size_t i = 0; i < h.size(); ++i) { float f = ((i * 2654435761u) % 8000) / 1000.0f - 4.0f; unsigned u; memcpy(&u, &f, 4); h[i] = u >> 16; }
    CK(cudaMemcpy(x, h.data(), big, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(gy, h.data() + 7, big - 16, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(w, h.data(), 1 << 20, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b, h.data() + 3, 1 << 20, cudaMemcpyHostToDevice));
  }
  float cms = time_ms(20, [&] { CK(cudaMemcpyAsync(o, x, big, cudaMemcpyDeviceToDevice)); });
  ceil_gbs = 2.0 * big / cms / 1e6;
  printf("copy ceiling: %.1f GB/s (%d SMs)\n", ceil_gbs, sms);
  struct { u64 rows, len; } shapes[] = {{32768, 4096}, {4096, 8192}, {4096, 4096}, {32768, 2048}, {32768, 8192}};
  for (auto s : shapes) {
    if (!want("norm")) break;
    double xb = (double)s.rows * s.len * 2, wb = (double)s.len * 2;
    int t = (int)std::min<u64>(1024, (s.len / 16 + 31) / 32 * 32);
    unsigned grid = (unsigned)std::min<u64>(s.rows, resident(rms_loop, t));
    report("rms fwd*", s.rows, s.len, 0, t, grid, 2 * xb + wb, time_ms(20, [&] { rms_loop<<<grid, t>>>(x, w, o, s.rows, s.len); }));
    if (s.len <= 8192) {
      int tb = (int)std::max<u64>(t, (s.len / 16 + 31) / 32 * 32);
      unsigned gb = (unsigned)std::min<u64>(s.rows, 2 * sms);
      report("rms bwd*", s.rows, s.len, 0, tb, gb, 3 * xb + 2 * wb, time_ms(20, [&] {
        rmsb_loop<<<gb, tb>>>(x, w, gy, o, part, s.rows, s.len);
        colsum<<<(unsigned)((s.len + 127) / 128), NV_COL_SUM_THREADS>>>(part, dw, gb, s.len);
      }));
    }
    sweep<2>(s.rows, s.len, x, w, b, o);
    sweep<4>(s.rows, s.len, x, w, b, o);
    sweep<8>(s.rows, s.len, x, w, b, o);
    sweep_bwd<2>(s.rows, s.len, x, w, gy, o, part, dw);
    sweep_bwd<4>(s.rows, s.len, x, w, gy, o, part, dw);
  }
  // RoPE [B, 32, T, 128], all dims rotated, halves: rope.cuh as fast/rope.rs launches it (8
  // chunks × 32 rows per block, rows in memory order).
  i32* off;
  CK(cudaMalloc(&off, 64)); CK(cudaMemset(off, 0, 64));
  for (u64 bsz : {1ull, 4ull}) {
    if (!want("rope")) break;
    u64 m = 32, seq = 4096, len = 128, rows = bsz * m * seq;
    double bytes = 2.0 * rows * len * 2;
    float ms = time_ms(20, [&] { rope_k<<<(unsigned)((rows + 31) / 32), dim3(8, 32)>>>(x, o, off, rows, len, seq); });
    printf("rope %llux32x%llux128 rope.cuh: %7.1f GB/s %5.1f%%\n", bsz, seq, bytes / ms / 1e6, 100 * bytes / ms / 1e6 / ceil_gbs);
  }
  return 0;
}
