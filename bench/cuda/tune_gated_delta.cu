// Checks and times gated_delta.cuh's chunked prefill (gated_delta_chunk_prep + _scan) against its
// row kernel (the step-by-step recurrence in float32), at Qwen3-Next's shapes (Hk 16, Hv 32,
// Dk = Dv = 128) and a few small ones. q and k rows are L2-normalised (q also scaled by Dk^-½)
// as the model does; errors are max|chunk − rows| / max|rows| of y and of the final state.
// Build and run on the GPU machine:
//   nvcc -O3 -std=c++17 -arch=sm_90a -I crates/nuvec-cuda/kernels bench/cuda/tune_gated_delta.cu \
//     -o tune_gated_delta && ./tune_gated_delta
#include <cmath>
#include <cstdio>
#include <vector>
#include "gated_delta.cuh"
#include "harness.cuh"

template <typename T> __global__ void __launch_bounds__(128) k_rows(GdnArgs a) { gated_delta_rows<T, 4, true>(a); }
template <typename T, int NH> __global__ void __launch_bounds__(128) k_prep(GdnArgs a, GdnChunk c) { gated_delta_chunk_prep<T, NH>(a, c); }
template <typename T> __global__ void __launch_bounds__(128) k_scan(GdnArgs a, GdnChunk c) { gated_delta_chunk_scan<T>(a, c); }

// Rows of 128 scaled to L2 norm `norm`, one warp each.
template <typename T> __global__ void normalise(T* x, u64 rows, float norm) {
  const u64 r = ((u64)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  float v[4], ss = 0;
  for (int i = 0; i < 4; ++i) { v[i] = widen(x[r * 128 + lane * 4 + i]); ss += v[i] * v[i]; }
  for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  const float f = norm * rsqrtf(ss + 1e-12f);
  for (int i = 0; i < 4; ++i) x[r * 128 + lane * 4 + i] = narrow<T>(v[i] * f);
}

template <typename T> static void to_host(std::vector<float>& out, const T* d, size_t n) {
  std::vector<T> h(n);
  CK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  out.resize(n);
  for (size_t i = 0; i < n; ++i) out[i] = h2f(h[i]);
}

static double rel_err(const std::vector<float>& a, const std::vector<float>& r) {
  double m = 0, d = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    m = fmax(m, fabs((double)r[i]));
    d = fmax(d, fabs((double)a[i] - r[i]));
    if (!std::isfinite(a[i])) return INFINITY;
  }
  return d / fmax(m, 1e-30);
}

template <typename T> struct Case {
  i64 B, T_, Hk, Hv, nt;
  T *q, *k, *v, *y, *y2;
  float *g, *beta, *s0, *s1, *s2;
  GdnArgs a;
  GdnChunk c;

  Case(i64 b, i64 t, i64 hk, i64 hv, float glo, float ghi, u32 seed) : B(b), T_(t), Hk(hk), Hv(hv) {
    nt = (t + GDN_C - 1) / GDN_C;
    const u64 nq = b * t * hk * 128, nv = b * t * hv * 128, ng = b * t * hv, ns = b * hv * 128 * 128;
    CK(cudaMalloc(&q, nq * sizeof(T))); CK(cudaMalloc(&k, nq * sizeof(T)));
    CK(cudaMalloc(&v, nv * sizeof(T))); CK(cudaMalloc(&y, nv * sizeof(T))); CK(cudaMalloc(&y2, nv * sizeof(T)));
    CK(cudaMalloc(&g, ng * 4)); CK(cudaMalloc(&beta, ng * 4));
    CK(cudaMalloc(&s0, ns * 4)); CK(cudaMalloc(&s1, ns * 4)); CK(cudaMalloc(&s2, ns * 4));
    fill<T><<<1024, 256>>>(q, nq, -1, 1, seed);
    fill<T><<<1024, 256>>>(k, nq, -1, 1, seed + 1);
    fill<T><<<1024, 256>>>(v, nv, -1, 1, seed + 2);
    fill<float><<<1024, 256>>>(g, ng, glo, ghi, seed + 3);
    fill<float><<<1024, 256>>>(beta, ng, 0, 1, seed + 4);
    fill<float><<<1024, 256>>>(s0, ns, -0.1f, 0.1f, seed + 5);
    normalise<T><<<(unsigned)((nq / 128 + 7) / 8), 256>>>(q, nq / 128, 1.0f / sqrtf(128.0f));
    normalise<T><<<(unsigned)((nq / 128 + 7) / 8), 256>>>(k, nq / 128, 1.0f);
    const i64 bhp = b * hv * nt * GDN_C;
    CK(cudaMalloc(&c.m, bhp * GDN_C * sizeof(T))); CK(cudaMalloc(&c.p, bhp * GDN_C * sizeof(T)));
    CK(cudaMalloc(&c.gam, bhp * 2 * 4));
    c.nt = nt;
    a = GdnArgs{};
    a.q = q; a.k = k; a.v = v; a.g = g; a.beta = beta; a.state = s0; a.mask = nullptr;
    a.B = b; a.T = t; a.Hk = hk; a.Hv = hv; a.Dv = 128;
    const i64 qs[3] = {t * hk * 128, hk * 128, 128}, vs[3] = {t * hv * 128, hv * 128, 128}, gs[3] = {t * hv, hv, 1};
    for (int i = 0; i < 3; ++i) { a.q_s[i] = qs[i]; a.k_s[i] = qs[i]; a.v_s[i] = vs[i]; a.g_s[i] = gs[i]; a.beta_s[i] = gs[i]; }
    a.g_dt = a.beta_dt = a.state_dt = a.out_dt = 0;
    CK(cudaDeviceSynchronize());
  }
  void rows() {
    GdnArgs r = a; r.y = y; r.state_out = s1;
    const i64 warps = B * Hv * 128;
    k_rows<T><<<(unsigned)((warps + 3) / 4), 128>>>(r);
  }
  void prep() {
    GdnArgs r = a; r.y = y2; r.state_out = s2;
    // Value heads in pairs where a key head has an even number of them.
    if ((Hv / Hk) % 2 == 0) {
      k_prep<T, 2><<<dim3((unsigned)nt, (unsigned)(B * Hv / 2)), 128, GDN_PREP_SMEM(2)>>>(r, c);
    } else {
      k_prep<T, 1><<<dim3((unsigned)nt, (unsigned)(B * Hv)), 128, GDN_PREP_SMEM(1)>>>(r, c);
    }
  }
  void scan() {
    GdnArgs r = a; r.y = y2; r.state_out = s2;
    k_scan<T><<<dim3(128 / GDN_BV, (unsigned)(B * Hv)), 128, GDN_SCAN_SMEM>>>(r, c);
  }
  void chunk() { prep(); scan(); }
  void check(const char* name) {
    rows(); chunk();
    CK(cudaDeviceSynchronize()); CK(cudaGetLastError());
    std::vector<float> ya, yb, sa, sb;
    const u64 nv = B * T_ * Hv * 128, ns = B * Hv * 128 * 128;
    to_host(ya, y, nv); to_host(yb, y2, nv); to_host(sa, s1, ns); to_host(sb, s2, ns);
    printf("check %-34s B %lld T %6lld Hk %2lld Hv %2lld: y err %.2e, state err %.2e\n", name, B, T_, Hk, Hv,
           rel_err(yb, ya), rel_err(sb, sa));
  }
};

template <typename T> static void setup() {
  CK(cudaFuncSetAttribute(k_prep<T, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, GDN_PREP_SMEM(1)));
  CK(cudaFuncSetAttribute(k_prep<T, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, GDN_PREP_SMEM(2)));
  CK(cudaFuncSetAttribute(k_scan<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, GDN_SCAN_SMEM));
  cudaFuncAttributes fa;
  CK(cudaFuncGetAttributes(&fa, k_prep<T, 2>));
  printf("prep %d registers, %d bytes local; ", fa.numRegs, (int)fa.localSizeBytes);
  CK(cudaFuncGetAttributes(&fa, k_scan<T>));
  printf("scan %d registers, %d bytes local\n", fa.numRegs, (int)fa.localSizeBytes);
}

// The check cases.
static void checks() {
  auto run = [](auto&& c, const char* name) { c.check(name); };
  run(Case<bf16>(1, 64, 1, 1, 0.9f, 1.0f, 1), "bf16 one chunk");
  run(Case<bf16>(2, 200, 2, 4, 0.85f, 1.0f, 2), "bf16 partial chunk, grouped");
  run(Case<f16>(2, 200, 2, 4, 0.85f, 1.0f, 3), "f16 partial chunk, grouped");
  run(Case<bf16>(1, 300, 1, 2, -1.0f, 1.0f, 4), "bf16 gates in [-1, 1)");
  run(Case<bf16>(1, 300, 1, 2, 0.0f, 0.3f, 5), "bf16 gates in [0, 0.3)");
  run(Case<f16>(2, 333, 3, 3, 0.8f, 1.0f, 9), "f16 a value head per key head");
  run(Case<bf16>(1, 4096, 16, 32, 0.85f, 1.0f, 6), "bf16 Qwen3-Next heads");
  run(Case<bf16>(1, 8192, 16, 32, 0.99f, 1.0f, 7), "bf16 Qwen3-Next heads, slow decay");
}

int main(int argc, char** argv) {
  setup<bf16>();
  setup<f16>();
  checks();
  const i64 ts[] = {256, 1024, 4096, 8192, 16384, 32768};
  for (i64 t : ts) {
    Case<bf16> c(1, t, 16, 32, 0.85f, 1.0f, 8);
    const int it = t >= 16384 ? 3 : 10;
    const float chunk = time_ms(it, [&] { c.chunk(); }) * 1e3f;
    const float prep = time_ms(it, [&] { c.prep(); }) * 1e3f;
    const float scan = time_ms(it, [&] { c.scan(); }) * 1e3f;
    const float rows = time_ms(t >= 16384 ? 1 : 3, [&] { c.rows(); }) * 1e3f;
    printf("time B 1 T %6lld Hk 16 Hv 32: chunk %8.1f us (prep %7.1f, scan %7.1f), rows %9.1f us, rows/chunk %.1fx\n",
           t, chunk, prep, scan, rows, rows / chunk);
  }
  (void)argc; (void)argv;
  return 0;
}
