// Times one-row decode GEMVs (y = W·x, W [N, K] row-major bf16, Llama-3-8B's projections) on
// the GPU: nuvec's gemv_rows as matmul.rs launches it, a pipelined variant that streams W
// through a ring of shared memory with TMA bulk copies (gemv_ring below), cuBLAS, and the read
// ceiling measured in the same run. Weights rotate among copies larger than L2 together, as a
// model's layers do. Build and run on the GPU machine, from the repository root:
//   nvcc -O3 -std=c++17 -arch=sm_90a -I crates/nuvec-cuda/kernels bench/cuda/tune_gemv.cu -lcublas -o tg && ./tg
// Prints per shape: µs per call and GB/s for each kernel, as a fraction of the read ceiling,
// and the largest difference of gemv_ring and cuBLAS from gemv_rows (relative to max |y|).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cublas_v2.h>
#include "matmul.cuh"
#include "attention.cuh"
#include "harness.cuh"

__global__ void rows1(const bf16* x, const bf16* w, bf16* o, u64 n, u64 k) {
  gemv_rows<bf16, 1, PRO_NONE>(x, nullptr, 0, 0.0f, w, o, n, k, k, k, n, nullptr, 0.0f);
}

// The read ceiling: every byte read once in 16-byte loads, folded so nothing is optimised away.
__global__ void read_all(const uint4* p, u64 n, u32* sink) {
  u32 acc = 0;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
    uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) sink[0] = acc;
}

// The mbarriers are attention.cuh's (atw_bar_init, atw_expect, atw_bar_wait); a bulk copy of
// contiguous bytes has no helper there.
__device__ __forceinline__ u32 smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, u32 bytes, u64* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_addr(dst)),
               "l"(src), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}

// gemv_ring: persistent blocks (one per SM); block b takes tiles of C adjacent rows b, b + grid,
// ...; thread 0 keeps STAGES tiles in flight, each one TMA bulk copy into its stage of the ring
// (C rows are contiguous), completing on the stage's mbarrier. Every thread owns the same PER
// 16-byte columns of every row (its x slice sits in registers), sums its C partial dots, and
// the block folds them through shared memory. No registers hold loads in flight, so the bytes
// in flight are the ring's, not the threads'.
template <int C, int STAGES, int THREADS, int PER>
__global__ void __launch_bounds__(THREADS, 1) gemv_ring(const bf16* x, const bf16* w, bf16* out, int n, int k) {
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ __align__(8) u64 full[STAGES];
  __shared__ float red[THREADS / 32][C];
  const int tiles = n / C;
  const u32 stage = (u32)C * k * 2;
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) atw_bar_init(smem_addr(&full[s]), 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x == 0)
    for (int s = 0; s < STAGES; ++s) {
      int t = blockIdx.x + s * gridDim.x;
      if (t < tiles) {
        atw_expect(smem_addr(&full[s]), stage);
        bulk_copy(ring + (u64)s * stage, w + (u64)t * C * k, stage, &full[s]);
      }
    }
  float xf[PER][8];
#pragma unroll
  for (int p = 0; p < PER; ++p) {
    Vec<bf16, 8> v = reinterpret_cast<const Vec<bf16, 8>*>(x)[threadIdx.x + p * THREADS];
#pragma unroll
    for (int e = 0; e < 8; ++e) xf[p][e] = widen(v.v[e]);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int i = 0;
  for (int t = blockIdx.x; t < tiles; t += gridDim.x, ++i) {
    const int s = i % STAGES;
    atw_bar_wait(smem_addr(&full[s]), (i / STAGES) & 1);
    const bf16* tile = reinterpret_cast<const bf16*>(ring + (u64)s * stage);
    float acc[C];
#pragma unroll
    for (int c = 0; c < C; ++c) {
      acc[c] = 0.0f;
#pragma unroll
      for (int p = 0; p < PER; ++p) {
        Vec<bf16, 8> v = reinterpret_cast<const Vec<bf16, 8>*>(tile + (u64)c * k)[threadIdx.x + p * THREADS];
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[c] += widen(v.v[e]) * xf[p][e];
      }
    }
    constexpr int P = C <= 8 ? 8 : (C <= 16 ? 16 : 32);
    float a[P];
#pragma unroll
    for (int r = 0; r < P; ++r) a[r] = r < C ? acc[r] : 0.0f;
    float v = warp_sum_scatter<P>(a, lane);
    if (lane % (32 / P) == 0 && lane / (32 / P) < C) red[warp][lane / (32 / P)] = v;
    __syncthreads();  // the stage is read and the partial sums written
    if (threadIdx.x == 0) {
      int next = t + STAGES * gridDim.x;
      if (next < tiles) {
        atw_expect(smem_addr(&full[s]), stage);
        bulk_copy(ring + (u64)s * stage, w + (u64)next * C * k, stage, &full[s]);
      }
    }
    if (threadIdx.x < C) {
      float sum = 0.0f;
#pragma unroll
      for (int q = 0; q < THREADS / 32; ++q) sum += red[q][threadIdx.x];
      out[(u64)t * C + threadIdx.x] = narrow<bf16>(sum);
    }
    __syncthreads();  // red is written again by the next tile
  }
}

struct Shape {
  const char* name;
  int n, k;
};

template <int C, int STAGES, int PER>
static void launch_ring(const bf16* x, const bf16* w, bf16* y, int n, int k, int sms) {
  constexpr int THREADS = 256;
  const int smem = C * k * 2 * STAGES;
  static bool set = false;
  if (!set) {
    CK(cudaFuncSetAttribute(gemv_ring<C, STAGES, THREADS, PER>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    set = true;
  }
  int tiles = n / C;
  gemv_ring<C, STAGES, THREADS, PER><<<tiles < sms ? tiles : sms, THREADS, smem>>>(x, w, y, n, k);
}

int main() {
  int dev = 0, sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  printf("device %s, %d SMs, L2 %d MB\n", prop.name, sms, prop.l2CacheSize >> 20);
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return 1;
  u32* sink;
  CK(cudaMalloc(&sink, 4));
  const Shape shapes[] = {{"qkv 6144x4096", 6144, 4096},
                          {"o 4096x4096", 4096, 4096},
                          {"gate_up 28672x4096", 28672, 4096},
                          {"down 4096x14336", 4096, 14336},
                          {"lm_head 128256x4096", 128256, 4096}};
  // The read ceiling over 1 GiB.
  const u64 big = 1ull << 30;
  uint4* buf;
  CK(cudaMalloc(&buf, big));
  CK(cudaMemset(buf, 1, big));
  float read_ms = time_ms(20, [&] { read_all<<<sms * 8, 512>>>(buf, big / 16, sink); });
  double ceiling = big / (read_ms * 1e-3) / 1e9;
  printf("read ceiling: %.0f GB/s\n", ceiling);
  CK(cudaFree(buf));
  for (const Shape& s : shapes) {
    const u64 bytes = (u64)s.n * s.k * 2;
    int copies = (int)std::max<u64>(2, (4ull * prop.l2CacheSize + bytes - 1) / bytes);
    std::vector<bf16*> ws(copies);
    for (auto& w : ws) {
      CK(cudaMalloc(&w, bytes));
      fill<bf16><<<1024, 256>>>(w, (u64)s.n * s.k, -0.05f, 0.05f, 7);
    }
    bf16 *x, *y0, *y1, *y2;
    CK(cudaMalloc(&x, s.k * 2));
    CK(cudaMalloc(&y0, s.n * 2));
    CK(cudaMalloc(&y1, s.n * 2));
    CK(cudaMalloc(&y2, s.n * 2));
    fill<bf16><<<64, 256>>>(x, s.k, -1.0f, 1.0f, 3);
    int it = 0;
    auto next = [&] { return ws[it++ % copies]; };
    float t_rows = time_ms(50, [&] { rows1<<<s.n / 8, 256>>>(x, next(), y0, s.n, s.k); });
    float alpha = 1.0f, beta = 0.0f;
    float t_blas = time_ms(50, [&] {
      cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, s.n, 1, s.k, &alpha, next(), CUDA_R_16BF, s.k, x, CUDA_R_16BF, s.k,
                   &beta, y1, CUDA_R_16BF, s.n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    });
    auto gbs = [&](float ms) { return bytes / (ms * 1e-3) / 1e9; };
    printf("%-22s rows %6.1f us %5.0f GB/s %.2f | cublas %6.1f us %.2f", s.name, t_rows * 1e3, gbs(t_rows),
           gbs(t_rows) / ceiling, t_blas * 1e3, gbs(t_blas) / ceiling);
    auto ring = [&](const char* label, auto launch) {
      float t = time_ms(50, [&] { launch(next()); });
      printf(" | %s %6.1f us %.2f", label, t * 1e3, gbs(t) / ceiling);
    };
    if (s.k == 4096) {
      ring("ring c4s6", [&](bf16* w) { launch_ring<4, 6, 2>(x, w, y2, s.n, s.k, sms); });
      ring("c2s12", [&](bf16* w) { launch_ring<2, 12, 2>(x, w, y2, s.n, s.k, sms); });
      ring("c8s3", [&](bf16* w) { launch_ring<8, 3, 2>(x, w, y2, s.n, s.k, sms); });
    } else {
      ring("ring c1s7", [&](bf16* w) { launch_ring<1, 7, 7>(x, w, y2, s.n, s.k, sms); });
      ring("c2s3", [&](bf16* w) { launch_ring<2, 3, 7>(x, w, y2, s.n, s.k, sms); });
    }
    CK(cudaDeviceSynchronize());
    // Each kernel once more on copy 0, compared with gemv_rows.
    rows1<<<s.n / 8, 256>>>(x, ws[0], y0, s.n, s.k);
    cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, s.n, 1, s.k, &alpha, ws[0], CUDA_R_16BF, s.k, x, CUDA_R_16BF, s.k, &beta,
                 y1, CUDA_R_16BF, s.n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (s.k == 4096)
      launch_ring<4, 6, 2>(x, ws[0], y2, s.n, s.k, sms);
    else
      launch_ring<1, 7, 7>(x, ws[0], y2, s.n, s.k, sms);
    CK(cudaDeviceSynchronize());
    std::vector<bf16> a(s.n), b(s.n), c(s.n);
    CK(cudaMemcpy(a.data(), y0, s.n * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(b.data(), y1, s.n * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(c.data(), y2, s.n * 2, cudaMemcpyDeviceToHost));
    double top = 0, db = 0, dc = 0;
    for (int i = 0; i < s.n; ++i) {
      top = std::max(top, (double)fabsf(h2f(a[i])));
      db = std::max(db, (double)fabsf(h2f(a[i]) - h2f(b[i])));
      dc = std::max(dc, (double)fabsf(h2f(a[i]) - h2f(c[i])));
    }
    printf(" | diff cublas %.1e ring %.1e\n", db / top, dc / top);
    for (auto w : ws) CK(cudaFree(w));
    CK(cudaFree(x));
    CK(cudaFree(y0));
    CK(cudaFree(y1));
    CK(cudaFree(y2));
  }
  return 0;
}
