// Programmatic dependent launch (PDL) on the fused kernels, and the sweeps behind run 27's
// launch choices (bench/results/2026-12-02-gpu-run27.md): the RMS derivative's variants (weight
// partials in shared memory, two blocks per SM, the weight re-read, a grid of equal rounds), the
// one-row forward norms by vectors per thread, SwiGLU's grid, RoPE. Inputs rotate among up to 4
// copies (no L2 reuse across iterations, as bench_fast). On the H200:
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -I crates/nuvec-cuda/kernels bench/cuda/tune_launch.cu -o tl
//   ./tl            # PDL against plain launches: RMS norm, its derivative, SwiGLU, RoPE
//   ./tl sweep      # the RMS derivative's variants over 1024..32768 rows of 8192
//   ./tl ones       # one-row RMS norm, residual add + RMS norm, layer norm by vectors per thread
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <vector>
#include "rope.cuh"
#include "norm_regs.cuh"
#include "harness.cuh"

typedef bf16 T;
typedef float A;

// P: 0 plain; 1 wait + trigger at the start; 2 wait only (implicit trigger at exit).
template <int P> __device__ __forceinline__ void pdl() {
  if constexpr (P >= 1) asm volatile("griddepcontrol.wait;" ::: "memory");
  if constexpr (P == 1) asm volatile("griddepcontrol.launch_dependents;" :::);
}

template <int P, int V> __global__ void __launch_bounds__(NV_REG_BLOCK) k_rms_r(const T* x, const T* w, T* o, u64 r, u64 l, int g) { pdl<P>(); rms_norm_regs<T, V, false>(x, nullptr, w, nullptr, o, r, l, 1e-5f, g); }
template <int P, int V> __global__ void __launch_bounds__(NV_REG_BLOCK) k_rms_o(const T* x, const T* w, T* o, u64 r, u64 l) { pdl<P>(); rms_norm_one<T, V, false>(x, nullptr, w, nullptr, o, r, l, 1e-5f); }
template <int P, int V> __global__ void __launch_bounds__(NV_REG_BLOCK, 1) k_rmsb(const T* x, const T* w, const T* gy, T* gx, A* p, u64 r, u64 l, int g) { pdl<P>(); rms_norm_vjp_regs<T, V>(x, w, gy, gx, p, r, l, 1e-5f, g); }
template <int P> __global__ void __launch_bounds__(NV_COL_SUM_THREADS) k_colsum(const A* p, A* o, u64 parts, u64 cols) { pdl<P>(); col_sum<A, A>(p, o, nullptr, parts, cols, cols, cols); }
template <int P> __global__ void k_cast(const A* a, T* b, u64 n) { pdl<P>(); for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) b[i] = narrow<T>(a[i]); }
template <int P> __global__ void k_glu(const T* g, const T* u, T* o, u64 n) { pdl<P>(); swiglu_elems<T>(g, u, o, n); }
template <int P> __global__ void k_gluvjp(const T* g, const T* u, const T* c, T* dg, T* du, u64 n) { pdl<P>(); swiglu_vjp_elems<T>(g, u, c, dg, du, n); }
template <int P> __global__ void k_rope(const T* x, T* out, const i32* off, u64 rows, u64 seq, u64 per_batch) {
  pdl<P>();
  rope_rows<T, 8, true, true, false, false>(x, out, off, 0, nullptr, 13.287712f, 1.0f, 1.0f, rows, 128, 128, seq, per_batch);
}

// The column sum writing the weight's dtype (col_sum with a narrowing store).
template <int P> __global__ void __launch_bounds__(NV_COL_SUM_THREADS) k_colsum_t(const A* __restrict__ part, T* __restrict__ out, u64 parts, u64 cols) {
  pdl<P>();
  constexpr int N = 4, C = 32 * N, W = NV_COL_SUM_THREADS / 32;
  __shared__ A sm[W][C];
  int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
  for (u64 c0 = (u64)blockIdx.x * C; c0 < cols; c0 += (u64)gridDim.x * C) {
    u64 c = c0 + (u64)lane * N;
    A s[N] = {0, 0, 0, 0};
    if (c < cols) {
      u64 p = wp;
      for (; p + 7 * W < parts; p += 8 * W) {
        Vec<A, N> r[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) r[k] = *reinterpret_cast<const Vec<A, N>*>(part + (p + k * W) * cols + c);
#pragma unroll
        for (int k = 0; k < 8; ++k)
#pragma unroll
          for (int j = 0; j < N; ++j) s[j] += r[k].v[j];
      }
      for (; p < parts; p += W) {
        Vec<A, N> r = *reinterpret_cast<const Vec<A, N>*>(part + p * cols + c);
#pragma unroll
        for (int j = 0; j < N; ++j) s[j] += r.v[j];
      }
    }
#pragma unroll
    for (int j = 0; j < N; ++j) sm[wp][j * 32 + lane] = s[j];
    __syncthreads();
    for (int t = threadIdx.x; t < C; t += blockDim.x) {
      u64 col = c0 + t;
      if (col >= cols) continue;
      A sum = 0;
#pragma unroll
      for (int k = 0; k < W; ++k) sum += sm[k][(t % N) * 32 + t / N];
      out[col] = narrow<T>(sum);
    }
    __syncthreads();
  }
}

// RMS derivative with the weight-gradient accumulators in shared memory (planes of float4:
// acc[group][q][vector], q the vector's quarter) instead of registers; PF: next row loaded ahead.
template <int V, bool PF>
__device__ __forceinline__ void rmsb_smem(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ g,
                                          T* __restrict__ gx, A* __restrict__ part, u64 rows, u64 len, float eps, int group) {
  constexpr int N = 8, Q = N / 4;
  extern __shared__ float4 acc4[];
  __shared__ A sm[2][8 * 2 * 16];
  int ph = 0;
  RowGroup grp = row_group(group);
  u64 nvec = len / N;
  float4* mine = acc4 + (u64)grp.id * Q * nvec;
#pragma unroll
  for (int v = 0; v < V; ++v)
    if (vec_index(grp, v) < nvec)
#pragma unroll
      for (int q = 0; q < Q; ++q) mine[q * nvec + vec_index(grp, v)] = make_float4(0, 0, 0, 0);
  Vec16<T> wr[V];
  row_load<T, V>(w, nvec, grp, wr);
  auto body = [&](u64 row, Vec16<T>(&xr)[V], Vec16<T>(&gr)[V]) {
    A s[2] = {0, 0};
#pragma unroll
    for (int v = 0; v < V; ++v)
      if (vec_index(grp, v) < nvec) {
#pragma unroll
        for (int j = 0; j < N; ++j) {
          A a = widen(xr[v].v[j]), u = widen(gr[v].v[j]) * widen(wr[v].v[j]);
          s[0] += a * a;
          s[1] += u * a;
        }
      }
    group_sums(s, sm, ph, grp);
    A n = inv_sqrt(s[0] / (A)len + (A)eps);
    A c = n * n * n * (s[1] / (A)len);
#pragma unroll
    for (int v = 0; v < V; ++v) {
      u64 vi = vec_index(grp, v);
      if (vi >= nvec) continue;
      A y[N];
#pragma unroll
      for (int q = 0; q < Q; ++q) {
        float4 a4 = mine[q * nvec + vi];
        float* af = reinterpret_cast<float*>(&a4);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          int j = q * 4 + k;
          A a = widen(xr[v].v[j]), gv = widen(gr[v].v[j]);
          af[k] += gv * (a * n);
          y[j] = gv * widen(wr[v].v[j]) * n - a * c;
        }
        mine[q * nvec + vi] = a4;
      }
      xr[v] = round_vec<T, N>(y);
    }
    row_store<T, V>(gx + row * len, nvec, grp, xr);
  };
  if constexpr (PF) {
    const T* src[2] = {x, g};
    walk_rows<T, V, 2>(src, rows, len, grp, [&](u64 row, auto& cur) { body(row, cur[0], cur[1]); });
  } else {
    for (u64 row = first_row(grp); row < rows; row += row_stride(grp)) {
      Vec16<T> xr[V], gr[V];
      row_load<T, V>(x + row * len, nvec, grp, xr);
      row_load<T, V>(g + row * len, nvec, grp, gr);
      body(row, xr, gr);
    }
  }
  __syncthreads();
  for (u64 i = threadIdx.x; i < Q * nvec; i += blockDim.x) {
    float4 s = acc4[i];
    for (int k = 1; k < grp.count; ++k) {
      float4 t = acc4[(u64)k * Q * nvec + i];
      s.x += t.x; s.y += t.y; s.z += t.z; s.w += t.w;
    }
    u64 q = i / nvec, vi = i % nvec;
    *reinterpret_cast<float4*>(part + (u64)blockIdx.x * len + vi * N + q * 4) = s;
  }
}
template <int P, int V, bool PF, int B, int MINB>
__global__ void __launch_bounds__(B, MINB) k_rmsbs(const T* x, const T* w, const T* gy, T* gx, A* p, u64 r, u64 l, int g) {
  pdl<P>();
  rmsb_smem<V, PF>(x, w, gy, gx, p, r, l, 1e-5f, g);
}

template <int P, int V> __global__ void __launch_bounds__(NV_REG_BLOCK, 2) k_rmsb2(const T* x, const T* w, const T* gy, T* gx, A* p, u64 r, u64 l, int g) { pdl<P>(); rms_norm_vjp_regs<T, V>(x, w, gy, gx, p, r, l, 1e-5f, g); }
template <int P, int V> __global__ void __launch_bounds__(NV_REG_BLOCK) k_addrms_o(const T* x, const T* res, const T* w, T* h, T* o, u64 r, u64 l) { pdl<P>(); rms_norm_one<T, V, true>(x, res, w, h, o, r, l, 1e-5f); }
template <int P, int V> __global__ void __launch_bounds__(NV_REG_BLOCK) k_ln_o(const T* x, const T* w, const T* b, T* o, u64 r, u64 l) { pdl<P>(); layer_norm_one<T, V>(x, w, b, o, r, l, 1e-5f); }

// The RMS derivative with the weight re-read (from L1) at each row instead of held in registers.
template <int V>
__device__ __forceinline__ void rmsb_rw(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ g,
                                        T* __restrict__ gx, A* __restrict__ part, u64 rows, u64 len, float eps, int group) {
  const int N = 8;
  __shared__ A sm[2][8 * 2 * 16];
  int ph = 0;
  __shared__ A red[NV_REG_BLOCK * N];
  RowGroup grp = row_group(group);
  u64 nvec = len / N;
  A acc[V][N];
  zero(acc);
  const T* src[2] = {x, g};
  walk_rows<T, V, 2>(src, rows, len, grp, [&](u64 row, auto& cur) {
    auto &xr = cur[0], &gr = cur[1];
    A s[2] = {0, 0};
#pragma unroll
    for (int v = 0; v < V; ++v)
      if (vec_index(grp, v) < nvec) {
        Vec16<T> wv = reinterpret_cast<const Vec16<T>*>(w)[vec_index(grp, v)];
#pragma unroll
        for (int j = 0; j < N; ++j) {
          A a = widen(xr[v].v[j]), u = widen(gr[v].v[j]) * widen(wv.v[j]);
          s[0] += a * a;
          s[1] += u * a;
        }
      }
    group_sums(s, sm, ph, grp);
    A n = inv_sqrt(s[0] / (A)len + (A)eps);
    A c = n * n * n * (s[1] / (A)len);
#pragma unroll
    for (int v = 0; v < V; ++v) {
      if (vec_index(grp, v) >= nvec) continue;
      Vec16<T> wv = reinterpret_cast<const Vec16<T>*>(w)[vec_index(grp, v)];
      A y[N];
#pragma unroll
      for (int j = 0; j < N; ++j) {
        A a = widen(xr[v].v[j]), gv = widen(gr[v].v[j]);
        acc[v][j] += gv * (a * n);
        y[j] = gv * widen(wv.v[j]) * n - a * c;
      }
      xr[v] = round_vec<T, N>(y);
    }
    row_store<T, V>(gx + row * len, nvec, grp, xr);
  });
  block_partial<T, V, A>(acc, part + (u64)blockIdx.x * len, nvec, grp, red);
}
template <int P, int V, int MINB> __global__ void __launch_bounds__(NV_REG_BLOCK, MINB) k_rmsb_rw(const T* x, const T* w, const T* gy, T* gx, A* p, u64 r, u64 l, int g) { pdl<P>(); rmsb_rw<V>(x, w, gy, gx, p, r, l, 1e-5f, g); }

// rope.cuh's rope_rows before run 28 (64-bit division and modulo per row), for comparison.
template <typename T, int W, bool VEC>
__device__ __forceinline__ void rope_rows_old(const T* __restrict__ x, T* __restrict__ out, const i32* __restrict__ offset,
                                          int offset_per_batch, const float* __restrict__ freqs, float log2_base,
                                          float scale, float sign, int traditional, u64 rows, u64 len, u64 dims,
                                          u64 seq, u64 per_batch) {
  typedef typename Acc<T>::type A;
  u64 half = dims / 2;
  u64 rot_chunks = (traditional ? dims : half) / W;
  u64 chunks = rot_chunks + (len - dims + W - 1) / W;
  float step = log2_base / (float)half;
  for (u64 row = (u64)blockIdx.x * blockDim.y + threadIdx.y; row < rows; row += (u64)gridDim.x * blockDim.y) {
    const T* p = x + row * len;
    T* q = out + row * len;
    for (u64 c = threadIdx.x; c < chunks; c += blockDim.x) {
      if (c >= rot_chunks) {
        u64 e = dims + (c - rot_chunks) * W, avail = len - e;
        Vec<T, W> v;
        rope_ld<T, W, VEC>(p + e, v, avail);
        rope_st<T, W, VEC>(q + e, v, avail);
        continue;
      }
      // The chunk's pairs: W of them (W / 2 when traditional), frequency indices from i0.
      u64 i0 = traditional ? c * W / 2 : c * W;
      u64 ea = traditional ? c * W : i0, eb = ea + half;
      Vec<T, W> va, vb;
      rope_ld<T, W, VEC>(p + ea, va, W);
      if (!traditional) rope_ld<T, W, VEC>(p + eb, vb, W);
      i32 off = offset[offset_per_batch ? row / per_batch : 0];
      float pos = ((float)off + (float)(row % seq)) * scale;
      if (traditional) {
#pragma unroll
        for (int k = 0; k < W / 2; ++k) {
          float inv = freqs ? 1.0f / freqs[i0 + k] : exp2f(-(float)(i0 + k) * step), sn, cs;
          rope_sincos(pos * inv, &sn, &cs);
          sn *= sign;
          A x1 = widen(va.v[2 * k]), x2 = widen(va.v[2 * k + 1]);
          va.v[2 * k] = narrow<T>(x1 * cs - x2 * sn);
          va.v[2 * k + 1] = narrow<T>(x1 * sn + x2 * cs);
        }
        rope_st<T, W, VEC>(q + ea, va, W);
      } else {
#pragma unroll
        for (int k = 0; k < W; ++k) {
          float inv = freqs ? 1.0f / freqs[i0 + k] : exp2f(-(float)(i0 + k) * step), sn, cs;
          rope_sincos(pos * inv, &sn, &cs);
          sn *= sign;
          A x1 = widen(va.v[k]), x2 = widen(vb.v[k]);
          va.v[k] = narrow<T>(x1 * cs - x2 * sn);
          vb.v[k] = narrow<T>(x1 * sn + x2 * cs);
        }
        rope_st<T, W, VEC>(q + ea, va, W);
        rope_st<T, W, VEC>(q + eb, vb, W);
      }
    }
  }
}

template <int P, bool OLD> __global__ void k_rope_rt(const T* x, T* out, const i32* off, int opb, const float* freqs, float lb, float scale, float sign, int trad, u64 rows, u64 len, u64 dims, u64 seq, u64 per_batch) {
  pdl<P>();
  if constexpr (OLD) rope_rows_old<T, 8, true>(x, out, off, opb, freqs, lb, scale, sign, trad, rows, len, dims, seq, per_batch);
  else rope_rows<T, 8, true, true, false, false>(x, out, off, opb, freqs, lb, scale, sign, rows, len, dims, seq, per_batch);
}

// RoPE variants: D > 0 rows of D features all rotated (len = dims = D at compile time); MODE
// 0: 64-bit row division, 1: 32-bit where rows < 2^32 (rope.cuh), 2: 32-bit always.
template <int D, int MODE>
__device__ __forceinline__ void rope_x(const T* __restrict__ x, T* __restrict__ out, const i32* __restrict__ offset,
                                       int offset_per_batch, float log2_base, float scale, float sign, u64 rows,
                                       u64 len_rt, u64 dims_rt, u64 seq, u64 per_batch) {
  constexpr int W = 8;
  const u64 len = D ? D : len_rt, dims = D ? D : dims_rt;
  u64 half = dims / 2;
  u64 rot_chunks = half / W;
  u64 chunks = rot_chunks + (len - dims + W - 1) / W;
  float step = log2_base / (float)half;
  for (u64 row = (u64)blockIdx.x * blockDim.y + threadIdx.y; row < rows; row += (u64)gridDim.x * blockDim.y) {
    const T* p = x + row * len;
    T* q = out + row * len;
    for (u64 c = threadIdx.x; c < chunks; c += blockDim.x) {
      if (c >= rot_chunks) {
        u64 e = dims + (c - rot_chunks) * W;
        *reinterpret_cast<Vec<T, W>*>(q + e) = *reinterpret_cast<const Vec<T, W>*>(p + e);
        continue;
      }
      u64 i0 = c * W, ea = i0, eb = ea + half;
      Vec<T, W> va = *reinterpret_cast<const Vec<T, W>*>(p + ea), vb = *reinterpret_cast<const Vec<T, W>*>(p + eb);
      u64 t, b = 0;
      if (MODE == 0 || (MODE == 1 && rows > 0xffffffffull)) {
        t = row % seq;
        if (offset_per_batch) b = row / per_batch;
      } else {
        t = (u32)row % (u32)seq;
        if (offset_per_batch) b = (u32)row / (u32)per_batch;
      }
      float pos = ((float)offset[b] + (float)t) * scale;
#pragma unroll
      for (int k = 0; k < W; ++k) {
        float inv = exp2f(-(float)(i0 + k) * step), sn, cs;
        rope_sincos(pos * inv, &sn, &cs);
        sn *= sign;
        A x1 = widen(va.v[k]), x2 = widen(vb.v[k]);
        va.v[k] = narrow<T>(x1 * cs - x2 * sn);
        vb.v[k] = narrow<T>(x1 * sn + x2 * cs);
      }
      *reinterpret_cast<Vec<T, W>*>(q + ea) = va;
      *reinterpret_cast<Vec<T, W>*>(q + eb) = vb;
    }
  }
}
template <int D, int MODE> __global__ void k_rope_x(const T* x, T* out, const i32* off, int opb, float lb, float scale, float sign, u64 rows, u64 len, u64 dims, u64 seq, u64 per_batch) {
  pdl<1>();
  rope_x<D, MODE>(x, out, off, opb, lb, scale, sign, rows, len, dims, seq, per_batch);
}

// The one-row RMS norm (rms_norm_one, 2 vectors per thread) with streaming cache hints on the
// row (LD 1: ld/st.global.cs; 2: loads that skip L1) and/or the weight loaded with the row (WPRE).
template <int LD> __device__ __forceinline__ uint4 ld_row(const uint4* p) {
  if constexpr (LD == 1) return __ldcs(p);
  if constexpr (LD == 2) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
  }
  return *p;
}
template <int V, int LD, bool WPRE>
__global__ void __launch_bounds__(NV_REG_BLOCK) k_rms_x(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ out, u64 rows, u64 len) {
  pdl<1>();
  constexpr int N = 8;
  __shared__ A sm[2][32];
  int ph = 0;
  const u32 nvec = (u32)(len / N);
  for (u64 row = blockIdx.x; row < rows; row += gridDim.x) {
    Vec16<T> r[V], wr[V];
#pragma unroll
    for (int v = 0; v < V; ++v) {
      u32 i = threadIdx.x + (u32)v * blockDim.x;
      if (i < nvec) {
        uint4 u = ld_row<LD>(reinterpret_cast<const uint4*>(x + row * len) + i);
        memcpy(&r[v], &u, 16);
        if (WPRE) wr[v] = reinterpret_cast<const Vec16<T>*>(w)[i];
      }
    }
    A s = 0;
#pragma unroll
    for (int v = 0; v < V; ++v)
      if (threadIdx.x + (u32)v * blockDim.x < nvec) {
#pragma unroll
        for (int j = 0; j < N; ++j) s += widen(r[v].v[j]) * widen(r[v].v[j]);
      }
    A n = inv_sqrt(block_sum(s, sm, ph) / (A)len + (A)1e-5f);
#pragma unroll
    for (int v = 0; v < V; ++v) {
      u32 i = threadIdx.x + (u32)v * blockDim.x;
      if (i >= nvec) continue;
      A y[N];
#pragma unroll
      for (int j = 0; j < N; ++j) y[j] = widen(r[v].v[j]) * n;
      Vec16<T> o = WPRE ? round_affine<T, N>(y, reinterpret_cast<const T*>(&wr[v]), nullptr, 0) : round_affine<T, N>(y, w, nullptr, i);
      uint4 u;
      memcpy(&u, &o, 16);
      uint4* dst = reinterpret_cast<uint4*>(out + row * len) + i;
      if (LD >= 1) __stcs(dst, u); else *dst = u;
    }
  }
}

// ---- launching
static int sms;
static double ceil_gbs;
template <typename... K, typename... Args>
static void go(int pdl_on, void (*k)(K...), unsigned grid, unsigned threads, size_t smem, Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = 0;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = at;
  cfg.numAttrs = pdl_on ? 1 : 0;
  CK(cudaLaunchKernelEx(&cfg, k, (K)args...));
}
template <typename K> static unsigned resident(K k, int threads, size_t smem = 0) {
  int n = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, threads, smem));
  return (unsigned)(n > 0 ? n : 1) * sms;
}
static void report(const char* what, const char* shape, double bytes, float ms) {
  double gbs = bytes / ms / 1e6;
  printf("%-34s %-16s %7.1f GB/s %5.1f%%  %7.2f us\n", what, shape, gbs, 100 * gbs / ceil_gbs, ms * 1000);
  fflush(stdout);
}
static int iters_for(double bytes) { return std::max(20, (int)(30e3 / (bytes / 4.0e6))); }  // ~30 ms a batch

static int K = 4;  // rotating copies (set per case: as many as fit, at most 4)
static u64 CAP;    // elements per buffer
static void copies(u64 n) { K = (int)std::max<u64>(1, std::min<u64>(4, CAP / n)); }
static T *X, *G, *O, *O2, *W;
static A *PART, *DW;
static T* DWT;
static i32* OFF;

template <int P> static void rms_fwd(u64 rows, u64 len, const char* tag) {
  char shape[64];
  snprintf(shape, 64, "%llux%llu", rows, len);
  u64 n = rows * len, nvec = len / 8;
  copies(n);
  double bytes = 4.0 * n + 2.0 * len;
  int it = iters_for(bytes), i = 0;
  char name[64];
  // persistent _r2: group = nvec/2 threads, block of max(1, 256/group) groups
  {
    int grp = (int)((nvec / 2 + 31) / 32 * 32);
    int groups = std::max(1, 256 / grp), threads = groups * grp;
    unsigned gr = (unsigned)std::min<u64>((rows + groups - 1) / groups, resident(k_rms_r<P, 2>, threads));
    snprintf(name, 64, "rms_r2 %s", tag);
    report(name, shape, bytes, time_ms(it, [&] { int k = i++ % K; go(P, k_rms_r<P, 2>, gr, threads, 0, X + k * n, W, O + k * n, rows, len, grp); }));
  }
  auto one = [&](auto kern, int v) {
    unsigned threads = (unsigned)(((nvec + v - 1) / v + 31) / 32 * 32);
    if (threads > 1024 || threads < 64) return;
    snprintf(name, 64, "rms_o%d %s (%d/SM)", v, tag, resident(kern, threads) / sms);
    report(name, shape, bytes, time_ms(it, [&] { int k = i++ % K; go(P, kern, (unsigned)rows, threads, 0, X + k * n, W, O + k * n, rows, len); }));
  };
  one(k_rms_o<P, 2>, 2);
  one(k_rms_o<P, 4>, 4);
  one(k_rms_o<P, 8>, 8);
}

template <int P> static void rms_bwd(u64 rows, u64 len, const char* tag) {
  char shape[64], name[64];
  snprintf(shape, 64, "%llux%llu", rows, len);
  u64 n = rows * len, nvec = len / 8;
  copies(n);
  double bytes = 6.0 * n + 4.0 * len;
  int it = iters_for(bytes), i = 0;
  int grp = (int)((nvec / 2 + 31) / 32 * 32);
  if (grp > 512) return;
  int groups = 512 / grp, threads = groups * grp;
  unsigned g0 = (unsigned)std::min<u64>((rows + groups - 1) / groups, resident(k_rmsb<P, 2>, threads));
  unsigned cs = (unsigned)((len + 127) / 128), cb = (unsigned)((len + 255) / 256);
  snprintf(name, 64, "rmsb k %s [%u]", tag, g0);
  report(name, shape, bytes, time_ms(it, [&] { int k = i++ % K; go(P, k_rmsb<P, 2>, g0, threads, 0, X + k * n, W, G + k * n, O + k * n, PART, rows, len, grp); }));
  snprintf(name, 64, "rmsb+cs+cast %s", tag);
  report(name, shape, bytes, time_ms(it, [&] {
    int k = i++ % K;
    go(P, k_rmsb<P, 2>, g0, threads, 0, X + k * n, W, G + k * n, O + k * n, PART, rows, len, grp);
    go(P, k_colsum<P>, cs, NV_COL_SUM_THREADS, 0, (const A*)PART, DW, (u64)g0, len);
    go(P, k_cast<P>, cb, 256, 0, (const A*)DW, DWT, len);
  }));
  snprintf(name, 64, "rmsb+cs_t %s", tag);
  report(name, shape, bytes, time_ms(it, [&] {
    int k = i++ % K;
    go(P, k_rmsb<P, 2>, g0, threads, 0, X + k * n, W, G + k * n, O + k * n, PART, rows, len, grp);
    go(P, k_colsum_t<P>, cs, NV_COL_SUM_THREADS, 0, (const A*)PART, DWT, (u64)g0, len);
  }));
  auto smem_variant = [&](auto kern, int block, const char* what) {
    int gpb = block / grp;
    if (gpb < 1) return;
    size_t smem = (size_t)gpb * len * 4;
    CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    unsigned g1 = (unsigned)std::min<u64>((rows + gpb - 1) / gpb, resident(kern, gpb * grp, smem));
    snprintf(name, 64, "%s %s [%u]", what, tag, g1);
    report(name, shape, bytes, time_ms(it, [&] {
      int k = i++ % K;
      go(P, kern, g1, gpb * grp, smem, X + k * n, W, G + k * n, O2 + k * n, PART, rows, len, grp);
      go(P, k_colsum_t<P>, cs, NV_COL_SUM_THREADS, 0, (const A*)PART, DWT, (u64)g1, len);
    }));
  };
  smem_variant(k_rmsbs<P, 2, true, 512, 2>, 512, "smem pf b512x2");
  smem_variant(k_rmsbs<P, 2, true, 1024, 1>, 1024, "smem pf b1024");
  smem_variant(k_rmsbs<P, 2, false, 1024, 2>, 1024, "smem nopf b1024x2");
  smem_variant(k_rmsbs<P, 2, false, 512, 3>, 512, "smem nopf b512x3");
}

template <int P> static void glu(u64 rows, u64 len, const char* tag) {
  char shape[64], name[64];
  snprintf(shape, 64, "%llux%llu", rows, len);
  u64 n = rows * len;
  copies(n);
  unsigned grid = (unsigned)std::min<u64>((n / 8 + 2047) / 2048, (u64)sms * 32);
  double bytes = 6.0 * n;
  int it = iters_for(bytes), i = 0;
  // gate X, up G (rotating), out O
  snprintf(name, 64, "swiglu %s", tag);
  report(name, shape, bytes, time_ms(it, [&] { int k = i++ % K; go(P, k_glu<P>, grid, 256, 0, (const T*)(X + k * n), (const T*)(G + k * n), O + k * n, n); }));
  unsigned exact = (unsigned)((n / 8 + 255) / 256);
  snprintf(name, 64, "swiglu exact %s", tag);
  report(name, shape, bytes, time_ms(it, [&] { int k = i++ % K; go(P, k_glu<P>, exact, 256, 0, (const T*)(X + k * n), (const T*)(G + k * n), O + k * n, n); }));
  if (rows <= 4096) {
    double b2 = 10.0 * n;
    int it2 = iters_for(b2);
    snprintf(name, 64, "swiglu_vjp %s", tag);
    report(name, shape, b2, time_ms(it2, [&] { int k = i++ % 2; go(P, k_gluvjp<P>, grid, 256, 0, (const T*)(X + k * n), (const T*)(G + k * n), (const T*)(O2 + k * n), O + k * n, O + (k + 2) * n, n); }));
    snprintf(name, 64, "swiglu_vjp exact %s", tag);
    report(name, shape, b2, time_ms(it2, [&] { int k = i++ % 2; go(P, k_gluvjp<P>, exact, 256, 0, (const T*)(X + k * n), (const T*)(G + k * n), (const T*)(O2 + k * n), O + k * n, O + (k + 2) * n, n); }));
  }
}

template <int P> static void rope(u64 b, const char* tag) {
  char shape[64], name[64];
  snprintf(shape, 64, "%llux32x4096x128", b);
  u64 rows = b * 32 * 4096, n = rows * 128;
  copies(n);
  double bytes = 4.0 * n;
  int it = iters_for(bytes), i = 0;
  unsigned gx = (unsigned)((rows + 31) / 32);
  snprintf(name, 64, "rope %s", tag);
  cudaLaunchConfig_t cfg = {};
  report(name, shape, bytes, time_ms(it, [&] {
    int k = i++ % K;
    cudaLaunchConfig_t c = cfg;
    c.gridDim = dim3(gx);
    c.blockDim = dim3(8, 32);
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    c.attrs = at;
    c.numAttrs = P ? 1 : 0;
    CK(cudaLaunchKernelEx(&c, k_rope<P>, (const T*)(X + k * n), O + k * n, (const i32*)OFF, rows, (u64)4096, rows / b));
  }));
}

// Blocks for `units` units of work, at most `cap` at once: as few as finish in the same number
// of rounds (every block the same count of units, give or take one).
static unsigned balanced(u64 units, u64 cap) { u64 rounds = (units + cap - 1) / cap; return (unsigned)((units + rounds - 1) / rounds); }

static void rmsb_sweep() {
  u64 len = 8192, nvec = len / 8;
  int grp = 512, threads = 512;
  for (u64 rows : {1024ull, 2048ull, 4096ull, 8192ull, 16384ull, 32768ull}) {
    char shape[64], name[64];
    snprintf(shape, 64, "%llux%llu", rows, len);
    u64 n = rows * len;
    copies(n);
    double bytes = 6.0 * n + 4.0 * len;
    int it = iters_for(bytes), i = 0;
    unsigned r1 = resident(k_rmsb<1, 2>, threads), g0 = (unsigned)std::min<u64>(rows, r1), gb = balanced(rows, r1);
    snprintf(name, 64, "rmsb k pdl [%u]", g0);
    report(name, shape, bytes, time_ms(it, [&] { int k = i++ % K; go(1, k_rmsb<1, 2>, g0, threads, 0, X + k * n, W, G + k * n, O + k * n, PART, rows, len, grp); }));
    snprintf(name, 64, "rmsb k pdl bal [%u]", gb);
    report(name, shape, bytes, time_ms(it, [&] { int k = i++ % K; go(1, k_rmsb<1, 2>, gb, threads, 0, X + k * n, W, G + k * n, O + k * n, PART, rows, len, grp); }));
    if (rows == 4096 || rows == 32768) {
      snprintf(name, 64, "rmsb k pdl bal no-w [%u]", gb);
      report(name, shape, bytes, time_ms(it, [&] { int k = i++ % K; go(1, k_rmsb<1, 2>, gb, threads, 0, X + k * n, (T*)nullptr, G + k * n, O + k * n, PART, rows, len, grp); }));
      unsigned r2 = resident(k_rmsb2<1, 2>, threads), g2 = balanced(rows, r2);
      snprintf(name, 64, "rmsb2 (512,2) pdl bal [%u]", g2);
      report(name, shape, bytes, time_ms(it, [&] { int k = i++ % K; go(1, k_rmsb2<1, 2>, g2, threads, 0, X + k * n, W, G + k * n, O + k * n, PART, rows, len, grp); }));
      unsigned r3 = resident(k_rmsb_rw<1, 2, 1>, threads), g3 = balanced(rows, r3);
      snprintf(name, 64, "rmsb_rw (512,1) pdl bal [%u]", g3);
      report(name, shape, bytes, time_ms(it, [&] { int k = i++ % K; go(1, k_rmsb_rw<1, 2, 1>, g3, threads, 0, X + k * n, W, G + k * n, O + k * n, PART, rows, len, grp); }));
      unsigned r4 = resident(k_rmsb_rw<1, 2, 2>, threads), g4 = balanced(rows, r4);
      snprintf(name, 64, "rmsb_rw (512,2) pdl bal [%u]", g4);
      report(name, shape, bytes, time_ms(it, [&] { int k = i++ % K; go(1, k_rmsb_rw<1, 2, 2>, g4, threads, 0, X + k * n, W, G + k * n, O + k * n, PART, rows, len, grp); }));
      unsigned cs = (unsigned)((len + 127) / 128);
      snprintf(name, 64, "rmsb bal + cs_t, pdl [%u]", gb);
      report(name, shape, bytes, time_ms(it, [&] {
        int k = i++ % K;
        go(1, k_rmsb<1, 2>, gb, threads, 0, X + k * n, W, G + k * n, O + k * n, PART, rows, len, grp);
        go(1, k_colsum_t<1>, cs, NV_COL_SUM_THREADS, 0, (const A*)PART, DWT, (u64)gb, len);
      }));
      snprintf(name, 64, "rmsb2 bal + cs_t, pdl [%u]", g2);
      report(name, shape, bytes, time_ms(it, [&] {
        int k = i++ % K;
        go(1, k_rmsb2<1, 2>, g2, threads, 0, X + k * n, W, G + k * n, O + k * n, PART, rows, len, grp);
        go(1, k_colsum_t<1>, cs, NV_COL_SUM_THREADS, 0, (const A*)PART, DWT, (u64)g2, len);
      }));
    }
  }
}

// The one-row kernels of the residual add + RMS norm and the layer norm by vectors per thread.
static void ones() {
  for (u64 rows : {4096ull, 32768ull})
    for (u64 len : {2048ull, 4096ull, 8192ull}) {
      char shape[64], name[64];
      snprintf(shape, 64, "%llux%llu", rows, len);
      u64 n = rows * len, nvec = len / 8;
      copies(2 * n);
      int i = 0;
      auto add = [&](auto kern, int v) {
        unsigned threads = (unsigned)(((nvec + v - 1) / v + 31) / 32 * 32);
        if (threads > 512 || threads < 32) return;
        double bytes = 8.0 * n;
        snprintf(name, 64, "add_rms_o%d pdl (%ux%u)", v, resident(kern, threads) / sms, threads);
        report(name, shape, bytes, time_ms(iters_for(bytes), [&] { int k = i++ % K; go(1, kern, (unsigned)rows, threads, 0, (const T*)(X + 2 * k * n), (const T*)(X + (2 * k + 1) * n), (const T*)W, O + 2 * k * n, O + (2 * k + 1) * n, rows, len); }));
      };
      auto ln = [&](auto kern, int v) {
        unsigned threads = (unsigned)(((nvec + v - 1) / v + 31) / 32 * 32);
        if (threads > 512 || threads < 32) return;
        double bytes = 4.0 * n;
        snprintf(name, 64, "ln_o%d pdl (%ux%u)", v, resident(kern, threads) / sms, threads);
        report(name, shape, bytes, time_ms(iters_for(bytes), [&] { int k = i++ % K; go(1, kern, (unsigned)rows, threads, 0, (const T*)(X + k * n), (const T*)W, (const T*)W, O + k * n, rows, len); }));
      };
      auto rms = [&](auto kern, int v) {
        unsigned threads = (unsigned)(((nvec + v - 1) / v + 31) / 32 * 32);
        if (threads > 512 || threads < 32) return;
        double bytes = 4.0 * n;
        snprintf(name, 64, "rms_o%d pdl (%ux%u)", v, resident(kern, threads) / sms, threads);
        report(name, shape, bytes, time_ms(iters_for(bytes), [&] { int k = i++ % K; go(1, kern, (unsigned)rows, threads, 0, (const T*)(X + k * n), (const T*)W, O + k * n, rows, len); }));
      };
      rms(k_rms_o<1, 2>, 2); rms(k_rms_o<1, 4>, 4); rms(k_rms_o<1, 8>, 8);
      add(k_addrms_o<1, 2>, 2); add(k_addrms_o<1, 4>, 4); add(k_addrms_o<1, 8>, 8);
      ln(k_ln_o<1, 2>, 2); ln(k_ln_o<1, 4>, 4); ln(k_ln_o<1, 8>, 8);
    }
}

// RoPE with its arguments at run time, as the library launches it (the `rope` case above passes
// constants, which the compiler folds): rope.cuh's kernel against its form before run 28.
template <bool OLD> static void rope_rt(u64 b, const char* tag) {
  char shape[64], name[64];
  snprintf(shape, 64, "%llux32x4096x128", b);
  u64 rows = b * 32 * 4096, n = rows * 128;
  copies(n);
  double bytes = 4.0 * n;
  int it = iters_for(bytes), i = 0;
  unsigned gx = (unsigned)((rows + 31) / 32);
  volatile u64 len = 128, dims = 128, seq = 4096;  // not constants to the compiler
  snprintf(name, 64, "rope runtime args %s", tag);
  report(name, shape, bytes, time_ms(it, [&] {
    int k = i++ % K;
    cudaLaunchConfig_t c = {};
    c.gridDim = dim3(gx);
    c.blockDim = dim3(8, 32);
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    c.attrs = at;
    c.numAttrs = 1;
    CK(cudaLaunchKernelEx(&c, k_rope_rt<1, OLD>, (const T*)(X + k * n), O + k * n, (const i32*)OFF, 0, (const float*)nullptr, 13.287712f, 1.0f, 1.0f, 0, rows, (u64)len, (u64)dims, (u64)seq, rows / b));
  }));
}

template <int D, int MODE> static void rope_var(u64 b, const char* tag) {
  char shape[64], name[64];
  snprintf(shape, 64, "%llux32x4096x128", b);
  u64 rows = b * 32 * 4096, n = rows * 128;
  copies(n);
  double bytes = 4.0 * n;
  int it = iters_for(bytes), i = 0;
  unsigned gx = (unsigned)((rows + 31) / 32);
  volatile u64 len = 128, dims = 128, seq = 4096;
  snprintf(name, 64, "rope D%d mode%d %s", D, MODE, tag);
  report(name, shape, bytes, time_ms(it, [&] {
    int k = i++ % K;
    cudaLaunchConfig_t c = {};
    c.gridDim = dim3(gx);
    c.blockDim = dim3(8, 32);
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    c.attrs = at;
    c.numAttrs = 1;
    CK(cudaLaunchKernelEx(&c, k_rope_x<D, MODE>, (const T*)(X + k * n), O + k * n, (const i32*)OFF, 0, 13.287712f, 1.0f, 1.0f, rows, (u64)len, (u64)dims, (u64)seq, rows / b));
  }));
}

static void rms_hints() {
  for (auto sh : {std::pair<u64, u64>{32768, 8192}, {4096, 8192}, {32768, 4096}, {32768, 8192}}) {
    u64 rows = sh.first, len = sh.second, n = rows * len, nvec = len / 8;
    copies(n);
    char shape[64], name[64];
    snprintf(shape, 64, "%llux%llu", rows, len);
    double bytes = 4.0 * n + 2.0 * len;
    int it = iters_for(bytes), i = 0;
    unsigned threads = (unsigned)(((nvec + 1) / 2 + 31) / 32 * 32);
    auto one = [&](auto kern, const char* what) {
      snprintf(name, 64, "rms_o2 %s", what);
      report(name, shape, bytes, time_ms(it, [&] { int k = i++ % K; go(1, kern, (unsigned)rows, threads, 0, (const T*)(X + k * n), (const T*)W, O + k * n, rows, len); }));
    };
    one(k_rms_o<1, 2>, "production");
    one(k_rms_x<2, 0, false>, "copy of it");
    one(k_rms_x<2, 1, false>, "ld/st.cs");
    one(k_rms_x<2, 2, false>, "ld L1::no_allocate");
    one(k_rms_x<2, 0, true>, "weight with the row");
    one(k_rms_x<2, 1, true>, "ld/st.cs + weight with the row");
    one(k_rms_x<2, 2, true>, "no_allocate + weight with the row");
  }
}

int main(int argc, char** argv) {
  const char* only = argc > 1 ? argv[1] : "";
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  // K copies of 32768 x 8192 bf16 (512 MiB each) would be too many: size by the largest case used.
  size_t per = 32768ull * 14336 * 2;  // swiglu 32768 rows: 896 MiB per copy
  size_t big = per * 2;               // two copies for the 32768-row cases; the 4096-row ones fit 4 in 2 copies' space
  CAP = big / 2;
  CK(cudaMalloc(&X, big)); CK(cudaMalloc(&G, big)); CK(cudaMalloc(&O, 2 * big)); CK(cudaMalloc(&O2, big));
  CK(cudaMalloc(&W, 1 << 20)); CK(cudaMalloc(&PART, 64 << 20)); CK(cudaMalloc(&DW, 1 << 20)); CK(cudaMalloc(&DWT, 1 << 20));
  CK(cudaMalloc(&OFF, 16)); CK(cudaMemset(OFF, 0, 16));
  fill<<<4096, 256>>>(X, big / 2, -2.f, 2.f, 1);
  fill<<<4096, 256>>>(G, big / 2, -1.f, 1.f, 2);
  fill<<<4096, 256>>>(O2, big / 2, -1.f, 1.f, 5);
  fill<<<64, 256>>>(W, 1 << 19, 0.5f, 1.5f, 3);
  CK(cudaDeviceSynchronize());
  size_t cb = 1ull << 30;
  float cms = time_ms(20, [&] { CK(cudaMemcpyAsync(O, X, cb, cudaMemcpyDeviceToDevice)); });
  ceil_gbs = 2.0 * cb / cms / 1e6;
  printf("copy ceiling: %.1f GB/s (%d SMs)\n", ceil_gbs, sms);
  bool all = !*only;
  if (strstr(only, "hints")) { rms_hints(); return 0; }
  if (strstr(only, "sweep")) rmsb_sweep();
  if (strstr(only, "ones")) ones();
  if (strstr(only, "sweep") || strstr(only, "ones")) return 0;
  if (all || strstr(only, "fwd")) {
    for (u64 r : {4096ull, 32768ull}) {
      rms_fwd<0>(r, 8192, "plain");
      rms_fwd<1>(r, 8192, "pdl");
      rms_fwd<2>(r, 8192, "pdl-wait");
      if (r == 4096) { rms_fwd<0>(r, 4096, "plain"); rms_fwd<1>(r, 4096, "pdl"); }
    }
  }
  if (all || strstr(only, "bwd")) {
    rms_bwd<0>(4096, 8192, "plain");
    rms_bwd<1>(4096, 8192, "pdl");
    rms_bwd<0>(4096, 4096, "plain");
    rms_bwd<1>(4096, 4096, "pdl");
  }
  if (all || strstr(only, "glu")) {
    glu<0>(4096, 14336, "plain");
    glu<1>(4096, 14336, "pdl");
    glu<0>(32768, 14336, "plain");
    glu<1>(32768, 14336, "pdl");
  }
  if (all || strstr(only, "rope")) {
    for (u64 b : {4ull, 1ull}) {
      rope_var<0, 0>(b, ""); rope_var<0, 1>(b, ""); rope_var<0, 2>(b, "");
      rope_var<128, 0>(b, ""); rope_var<128, 1>(b, ""); rope_var<128, 2>(b, "");
    }
    rope_rt<true>(4, "old");
    rope_rt<false>(4, "new");
    rope_rt<true>(1, "old");
    rope_rt<false>(1, "new");
    rope<0>(4, "plain");
    rope<1>(4, "pdl");
    rope<0>(1, "plain");
    rope<1>(1, "pdl");
  }
  // correctness: the smem derivative agrees with the register one (dx and dw) at 4096x8192
  {
    u64 rows = 4096, len = 8192, n = rows * len;
    int grp = 512;
    unsigned g0 = resident(k_rmsb<0, 2>, 512);
    k_rmsb<0, 2><<<g0, 512>>>(X, W, G, O, PART, rows, len, grp);
    k_colsum_t<0><<<64, NV_COL_SUM_THREADS>>>(PART, DWT, g0, len);
    std::vector<T> a(n), b(n), wa(len), wb(len);
    CK(cudaMemcpy(a.data(), O, 2 * n, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(wa.data(), DWT, 2 * len, cudaMemcpyDeviceToHost));
    size_t smem = 2 * len * 4;
    unsigned g1 = resident(k_rmsbs<0, 2, true, 1024, 1>, 1024, smem);
    k_rmsbs<0, 2, true, 1024, 1><<<g1, 1024, smem>>>(X, W, G, O2, PART, rows, len, grp);
    k_colsum_t<0><<<64, NV_COL_SUM_THREADS>>>(PART, DWT, g1, len);
    CK(cudaMemcpy(b.data(), O2, 2 * n, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(wb.data(), DWT, 2 * len, cudaMemcpyDeviceToHost));
    double md = 0, mw = 0, mx = 0;
    for (u64 j = 0; j < n; ++j) md = std::max(md, (double)fabsf(h2f(a[j]) - h2f(b[j])));
    for (u64 j = 0; j < len; ++j) { mw = std::max(mw, (double)fabsf(h2f(wa[j]) - h2f(wb[j]))); mx = std::max(mx, (double)fabsf(h2f(wa[j]))); }
    printf("smem vs regs derivative: dx max diff %.3g, dw max diff %.3g (max |dw| %.3g)\n", md, mw, mx);
  }
  return 0;
}
