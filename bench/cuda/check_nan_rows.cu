// Device check of log-sum-exp rows with NaNs hidden among -inf (one vector all -inf but a NaN):
// every row below must give NaN. nvcc -std=c++17 -arch=sm_90 -I crates/nuvec-cuda/kernels
#include <cstdio>
#include <cmath>
#include "softmax.cuh"
template <typename T> __global__ void k(const T* x, T* o, u64 r, u64 l) { logsumexp_rows_warp<T>(x, o, r, l); }
template <typename T> int check(const char* name) {
  const int L = 64;
  T h[2 * L];
  for (int i = 0; i < 2 * L; ++i) h[i] = (T)(i % 5);
  for (int i = 16; i < 24; ++i) h[i] = (T)-INFINITY;
  h[20] = (T)NAN;
  h[L + 0] = (T)NAN;
  h[L + 1] = (T)-INFINITY;
  T *x, *o, r[2];
  cudaMalloc(&x, sizeof h); cudaMalloc(&o, sizeof r);
  cudaMemcpy(x, h, sizeof h, cudaMemcpyHostToDevice);
  k<T><<<1, 256>>>(x, o, 2, L);
  cudaMemcpy(r, o, sizeof r, cudaMemcpyDeviceToHost);
  int bad = !std::isnan((double)r[0]) + !std::isnan((double)r[1]);
  printf("%s: %g %g -> %s\n", name, (double)r[0], (double)r[1], bad ? "WRONG" : "NaN, NaN ok");
  return bad;
}
int main() { return check<float>("f32") + check<double>("f64"); }
