// Host-side helpers shared by the kernel harnesses in bench/cuda (tune_rows.cu, tune_xent.cu):
// error checks, a deterministic fill kernel, event timing, and host conversions of the element
// types. Include after the kernel headers (it uses their types and narrow()).
#pragma once
#include <cstdio>
#include <cstdlib>
#include <functional>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e), __LINE__); exit(1); } } while (0)

// p[i] uniform in [lo, hi) from a hash of (i, seed): the same values on every run.
template <typename T> __global__ void fill(T* p, u64 n, float lo, float hi, u32 seed) {
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
    u64 h = (i + 1) * 0x9E3779B97F4A7C15ull ^ ((u64)seed << 32);
    h ^= h >> 29; h *= 0xBF58476D1CE4E5B9ull; h ^= h >> 32;
    p[i] = narrow<T>((typename Acc<T>::type)(lo + (hi - lo) * (float)(h >> 40) * (1.0f / 16777216.0f)));
  }
}

// Milliseconds per call of `f`: three warm-up calls, then the best of three batches of `iters`.
static float time_ms(int iters, const std::function<void()>& f) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) f();
  float best = 1e30f;
  for (int rep = 0; rep < 3; ++rep) {
    CK(cudaEventRecord(a));
    for (int i = 0; i < iters; ++i) f();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms; CK(cudaEventElapsedTime(&ms, a, b));
    if (ms / iters < best) best = ms / iters;
  }
  CK(cudaGetLastError());
  CK(cudaEventDestroy(a)); CK(cudaEventDestroy(b));
  return best;
}

static float h2f(bf16 v) { return __bfloat162float(v); }
static float h2f(f16 v) { return __half2float(v); }
static float h2f(float v) { return v; }
static double h2f(double v) { return v; }
template <typename T> static T f2h(float v);
template <> bf16 f2h<bf16>(float v) { return __float2bfloat16(v); }
template <> f16 f2h<f16>(float v) { return __float2half(v); }
template <> float f2h<float>(float v) { return v; }
template <> double f2h<double>(float v) { return v; }
