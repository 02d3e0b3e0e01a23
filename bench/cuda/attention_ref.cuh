// The attention harnesses' float32 reference and buffers (contiguous [B, H, L, D] operands
// filled from a hash): include after attention.cuh and harness.cuh.
#pragma once
#include <cmath>

// Reference, a thread per query row: the output row and its log-sum-exp, in float32.
template <typename T, int D>
__global__ void ref_k(const T* q, const T* k, const T* v, const T* sinks, float* out, float* lse, int B, int Hq,
                      int Hkv, int Lq, int Lk, int causal, int window, float scale) {
  int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= B * Hq * Lq) return;
  int i = r % Lq, h = (r / Lq) % Hq, b = r / (Lq * Hq), kh = h / (Hq / Hkv);
  const T* qr = q + (i64)r * D;
  int lo, hi;
  att_range(i, Lq, Lk, causal, window, &lo, &hi);
  float m = sinks ? widen(sinks[h]) : -INFINITY;
  for (int j = lo; j < hi; ++j) {
    const T* kr = k + (((i64)b * Hkv + kh) * Lk + j) * D;
    float s = 0;
    for (int d = 0; d < D; ++d) s += widen(qr[d]) * widen(kr[d]);
    m = fmaxf(m, s * scale);
  }
  float l = sinks ? expf(widen(sinks[h]) - m) : 0.0f, ls = 0;
  float* o = out + (i64)r * D;
  for (int d = 0; d < D; ++d) o[d] = 0;
  for (int j = lo; j < hi; ++j) {
    const T* kr = k + (((i64)b * Hkv + kh) * Lk + j) * D;
    const T* vr = v + (((i64)b * Hkv + kh) * Lk + j) * D;
    float s = 0;
    for (int d = 0; d < D; ++d) s += widen(qr[d]) * widen(kr[d]);
    float p = expf(s * scale - m);
    l += p;
    ls += p;
    for (int d = 0; d < D; ++d) o[d] += p * widen(vr[d]);
  }
  for (int d = 0; d < D; ++d) o[d] = l > 0 ? o[d] / l : 0.0f;
  // The kernels' log-sum-exp leaves the sink out.
  lse[r] = ls > 0 ? m + logf(ls) : -INFINITY;
}

template <typename T>
struct Buffers {
  T *q, *k, *v, *o, *sinks;
  float* lse;
};

template <typename T, int D>
static Buffers<T> make(int B, int Hq, int Hkv, int Lq, int Lk) {
  Buffers<T> x;
  size_t nq = (size_t)B * Hq * Lq * D, nk = (size_t)B * Hkv * Lk * D;
  CK(cudaMalloc(&x.q, nq * 2)); CK(cudaMalloc(&x.o, nq * 2)); CK(cudaMalloc(&x.k, nk * 2)); CK(cudaMalloc(&x.v, nk * 2));
  CK(cudaMalloc(&x.lse, (size_t)B * Hq * Lq * 4)); CK(cudaMalloc(&x.sinks, Hq * 2));
  fill<T><<<1024, 256>>>(x.q, nq, -1, 1, 1);
  fill<T><<<1024, 256>>>(x.k, nk, -1, 1, 2);
  fill<T><<<1024, 256>>>(x.v, nk, -1, 1, 3);
  fill<T><<<1, 32>>>(x.sinks, Hq, -1, 2, 4);
  return x;
}
template <typename T>
static void release(Buffers<T>& x) { cudaFree(x.q); cudaFree(x.k); cudaFree(x.v); cudaFree(x.o); cudaFree(x.lse); cudaFree(x.sinks); }
