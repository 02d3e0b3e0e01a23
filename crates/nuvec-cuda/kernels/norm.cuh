// The norms of nuvec::fast: RMS norm (with the residual add), layer norm, their derivatives and
// col_sum, plus the row helpers the other fused kernels share (swiglu.cuh, rope.cuh,
// cross_entropy.cuh). Rows are contiguous (fast/mod.rs copies strided inputs first);
// statistics accumulate in f32 (f64 for double). The norms here
// take any row: one block per row, grid-striding over rows; a row is read once from memory and
// again from cache. Rows of whole 16-byte vectors that fit in registers take norm_registers.cuh's
// kernels instead.
//
// The derivative kernels keep each thread's share of the weight (and bias) gradient in
// registers across the rows it visits (NV_RMS_SLOTS values per thread for the RMS norm,
// NV_LN_SLOTS each of weight and bias for the layer norm; at most NV_NORM_VJP_THREADS threads,
// so rows of up to slots × threads features) and write one partial row per block, which
// col_sum adds. More slots spill (sm_90a, 512 threads: 32 slots spilled 178 bytes).
#pragma once
#include "softmax.cuh"

#ifndef NV_RMS_SLOTS
#define NV_RMS_SLOTS 16
#endif
#ifndef NV_LN_SLOTS
#define NV_LN_SLOTS 16
#endif
#ifndef NV_NORM_VJP_THREADS
#define NV_NORM_VJP_THREADS 512
#endif

__device__ __forceinline__ float inv_sqrt(float v) { return rsqrtf(v); }
__device__ __forceinline__ double inv_sqrt(double v) { return rsqrt(v); }
__device__ __forceinline__ bool aligned16(const void* p) { return ((u64)p & 15) == 0; }

// Sums of K values over the block (valid in every thread). `sm` holds 32 × K values.
template <typename A, int K> __device__ __forceinline__ void block_sums(A (&v)[K], A* sm) {
#pragma unroll
  for (int k = 0; k < K; ++k)
    for (int o = 16; o > 0; o >>= 1) v[k] += shfl_xor_any(v[k], o);
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  __syncthreads();  // the previous row's readers are done with sm
  if (lane == 0) {
#pragma unroll
    for (int k = 0; k < K; ++k) sm[k * 32 + warp] = v[k];
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < K; ++k) {
    v[k] = lane < nw ? sm[k * 32 + lane] : (A)0;
    for (int o = 16; o > 0; o >>= 1) v[k] += shfl_xor_any(v[k], o);
  }
}

// A row is visited in pieces of M elements: vectors of N = 16 / sizeof(T) when every pointer
// the kernel touches is 16-byte aligned and the row a multiple of N (`vec`), single elements
// otherwise. `visit(Width<M>{}, v, slot)` gets piece v (elements v·M .. v·M + M) and the
// register index of its first element for this thread; pieces go round-robin over threads in
// the same order on every row.
template <int M> struct Width {
  static constexpr int value = M;
};

template <typename T, typename F> __device__ __forceinline__ void for_row(u64 len, bool vec, F visit) {
  const int N = 16 / sizeof(T);
  int s = 0;
  if (vec) {
    for (u64 v = threadIdx.x; v < len / N; v += blockDim.x, s += N) visit(Width<N>{}, v, s);
  } else {
    for (u64 v = threadIdx.x; v < len; v += blockDim.x, ++s) visit(Width<1>{}, v, s);
  }
}

// As for_row, unrolled over at most S register slots per thread, so that `slot` is a constant
// and accumulators indexed by it stay in registers. The caller guarantees len ≤ S · blockDim.
template <typename T, int S, typename F> __device__ __forceinline__ void for_slots(u64 len, bool vec, F visit) {
  const int N = 16 / sizeof(T);
  if (vec) {
#pragma unroll
    for (int s = 0; s < S / N; ++s) {
      u64 v = threadIdx.x + (u64)s * blockDim.x;
      if (v < len / N) visit(Width<N>{}, v, s * N);
    }
  } else {
#pragma unroll
    for (int s = 0; s < S; ++s) {
      u64 v = threadIdx.x + (u64)s * blockDim.x;
      if (v < len) visit(Width<1>{}, v, s);
    }
  }
}

template <typename T, int M>
__device__ __forceinline__ void load(const T* __restrict__ p, u64 v, typename Acc<T>::type (&out)[M]) {
  Vec<T, M> r = reinterpret_cast<const Vec<T, M>*>(p)[v];
#pragma unroll
  for (int j = 0; j < M; ++j) out[j] = widen(r.v[j]);
}
// The weight's piece, or ones without a weight.
template <typename T, int M>
__device__ __forceinline__ void load_or_one(const T* __restrict__ p, u64 v, typename Acc<T>::type (&out)[M]) {
  if (p) {
    load<T, M>(p, v, out);
  } else {
#pragma unroll
    for (int j = 0; j < M; ++j) out[j] = 1;
  }
}
template <typename T, int M> __device__ __forceinline__ void store(T* __restrict__ p, u64 v, const T (&in)[M]) {
  Vec<T, M> r;
#pragma unroll
  for (int j = 0; j < M; ++j) r.v[j] = in[j];
  reinterpret_cast<Vec<T, M>*>(p)[v] = r;
}

template <typename T> __device__ __forceinline__ bool rows_vectorisable(u64 len, const void* a, const void* b,
                                                                       const void* c, const void* d) {
  const int N = 16 / sizeof(T);
  return len % N == 0 && aligned16(a) && aligned16(b) && aligned16(c) && aligned16(d);
}

// As the composition: the normalised value rounded to T, then times the weight (rounded).
template <typename T> __device__ __forceinline__ T scaled(typename Acc<T>::type y, typename Acc<T>::type w, bool has_w) {
  T r = narrow<T>(y);
  return has_w ? narrow<T>(widen(r) * w) : r;
}

// Pairs of 2-byte elements in one instruction where the architecture has the packed operations.
#if __CUDA_ARCH__ >= 800
#define NV_PACKED_HALVES 1
#else
#define NV_PACKED_HALVES 0
#endif

template <typename T> __device__ __forceinline__ typename Pair2<T>::type pack2(float a, float b);
template <> __device__ __forceinline__ __nv_bfloat162 pack2<bf16>(float a, float b) { return __floats2bfloat162_rn(a, b); }
template <> __device__ __forceinline__ __half2 pack2<f16>(float a, float b) { return __floats2half2_rn(a, b); }

// y rounded to T, times the weight's piece at vector vi when there is a weight (rounded), plus
// the bias's when there is a bias (rounded): the composition's roundings. 2-byte types round,
// multiply and add packed pairs: the product of two such values is exact in float, and so is
// their sum unless one is below the other's rounding unit (then both round to the larger), so
// one rounding of the packed operation gives what rounding the float result gives, in a
// fraction of the instructions (see bench/results/).
template <typename T, int N>
__device__ __forceinline__ Vec<T, N> round_affine(const typename Acc<T>::type (&y)[N], const T* __restrict__ w,
                                                  const T* __restrict__ b, u64 vi) {
  Vec<T, N> r;
  if constexpr (sizeof(T) == 2 && NV_PACKED_HALVES) {
    typedef typename Pair2<T>::type P;
    P p[N / 2], q[N / 2];
#pragma unroll
    for (int j = 0; j < N / 2; ++j) p[j] = pack2<T>(y[2 * j], y[2 * j + 1]);
    // Whole 16-byte loads first: a memcpy straight from global memory loads bytes.
    if (w) {
      Vec<T, N> wv = reinterpret_cast<const Vec<T, N>*>(w)[vi];
      memcpy(q, &wv, sizeof(q));
#pragma unroll
      for (int j = 0; j < N / 2; ++j) p[j] = __hmul2(p[j], q[j]);
    }
    if (b) {
      Vec<T, N> bv = reinterpret_cast<const Vec<T, N>*>(b)[vi];
      memcpy(q, &bv, sizeof(q));
#pragma unroll
      for (int j = 0; j < N / 2; ++j) p[j] = __hadd2(p[j], q[j]);
    }
    memcpy(&r, p, sizeof(r));
  } else {
    typename Acc<T>::type wv[N], bv[N];
    load_or_one<T, N>(w, vi, wv);
    if (b) load<T, N>(b, vi, bv);
#pragma unroll
    for (int j = 0; j < N; ++j) {
      T z = scaled<T>(y[j], wv[j], w != nullptr);
      r.v[j] = b ? narrow<T>(widen(z) + bv[j]) : z;
    }
  }
  return r;
}

// a + b rounded to T (packed pairs for 2-byte types).
template <typename T, int N> __device__ __forceinline__ Vec<T, N> add_vec(const Vec<T, N>& a, const Vec<T, N>& b) {
  Vec<T, N> r;
  if constexpr (sizeof(T) == 2 && NV_PACKED_HALVES) {
    typedef typename Pair2<T>::type P;
    P p[N / 2], q[N / 2];
    memcpy(p, &a, sizeof(p));
    memcpy(q, &b, sizeof(q));
#pragma unroll
    for (int j = 0; j < N / 2; ++j) p[j] = __hadd2(p[j], q[j]);
    memcpy(&r, p, sizeof(r));
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) r.v[j] = narrow<T>(widen(a.v[j]) + widen(b.v[j]));
  }
  return r;
}

// y rounded to T (packed pairs for 2-byte types).
template <typename T, int N> __device__ __forceinline__ Vec<T, N> round_vec(const typename Acc<T>::type (&y)[N]) {
  return round_affine<T, N>(y, nullptr, nullptr, 0);
}

#define NV_PIECE constexpr int M = decltype(W)::value

// ---- RMS norm: y = (x · rsqrt(mean(x²) + eps)) · w; with `res`, h = x + res is written to `h`
// and normalised instead of x.
template <typename T>
__device__ __forceinline__ void rms_norm_rows(const T* __restrict__ x, const T* __restrict__ res, const T* __restrict__ w,
                                              T* __restrict__ h, T* __restrict__ out, u64 rows, u64 len, float eps) {
  typedef typename Acc<T>::type A;
  __shared__ A sm[32];
  bool vec = rows_vectorisable<T>(len, x, out, w ? (const void*)w : x, res ? (const void*)res : x) &&
             (!h || aligned16(h));
  for (u64 row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* p = x + row * len;
    A s[1] = {0};
    if (res) {
      const T* r = res + row * len;
      T* q = h + row * len;
      for_row<T>(len, vec, [&](auto W, u64 v, int) {
        NV_PIECE;
        A a[M], b[M];
        T hv[M];
        load<T, M>(p, v, a);
        load<T, M>(r, v, b);
#pragma unroll
        for (int j = 0; j < M; ++j) {
          hv[j] = narrow<T>(a[j] + b[j]);
          A c = widen(hv[j]);
          s[0] += c * c;
        }
        store<T, M>(q, v, hv);
      });
      p = q;  // read back by the thread that wrote it
    } else {
      for_row<T>(len, vec, [&](auto W, u64 v, int) {
        NV_PIECE;
        A a[M];
        load<T, M>(p, v, a);
#pragma unroll
        for (int j = 0; j < M; ++j) s[0] += a[j] * a[j];
      });
    }
    block_sums<A, 1>(s, sm);
    A n = inv_sqrt(s[0] / (A)len + (A)eps);
    T* q = out + row * len;
    for_row<T>(len, vec, [&](auto W, u64 v, int) {
      NV_PIECE;
      A a[M], wv[M];
      T y[M];
      load<T, M>(p, v, a);
      load_or_one<T, M>(w, v, wv);
#pragma unroll
      for (int j = 0; j < M; ++j) y[j] = scaled<T>(a[j] * n, wv[j], w != nullptr);
      store<T, M>(q, v, y);
    });
  }
}

// ---- Layer norm: y = ((x − μ) · rsqrt(σ² + eps)) · w + b, mean and variance in two passes.
template <typename T>
__device__ __forceinline__ void layer_norm_rows(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                                                T* __restrict__ out, u64 rows, u64 len, float eps) {
  typedef typename Acc<T>::type A;
  __shared__ A sm[32];
  bool vec = rows_vectorisable<T>(len, x, out, w ? (const void*)w : x, b ? (const void*)b : x);
  for (u64 row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* p = x + row * len;
    A s[1] = {0};
    for_row<T>(len, vec, [&](auto W, u64 v, int) {
      NV_PIECE;
      A a[M];
      load<T, M>(p, v, a);
#pragma unroll
      for (int j = 0; j < M; ++j) s[0] += a[j];
    });
    block_sums<A, 1>(s, sm);
    A mu = s[0] / (A)len;
    s[0] = 0;
    for_row<T>(len, vec, [&](auto W, u64 v, int) {
      NV_PIECE;
      A a[M];
      load<T, M>(p, v, a);
#pragma unroll
      for (int j = 0; j < M; ++j) s[0] += (a[j] - mu) * (a[j] - mu);
    });
    block_sums<A, 1>(s, sm);
    A n = inv_sqrt(s[0] / (A)len + (A)eps);
    T* q = out + row * len;
    for_row<T>(len, vec, [&](auto W, u64 v, int) {
      NV_PIECE;
      A a[M], wv[M], bv[M];
      T y[M];
      load<T, M>(p, v, a);
      load_or_one<T, M>(w, v, wv);
      if (b) load<T, M>(b, v, bv);
#pragma unroll
      for (int j = 0; j < M; ++j) {
        y[j] = scaled<T>((a[j] - mu) * n, wv[j], w != nullptr);
        if (b) y[j] = narrow<T>(widen(y[j]) + bv[j]);
      }
      store<T, M>(q, v, y);
    });
  }
}

// ---- RMS norm derivative: with n = rsqrt(mean(x²) + eps) and u = g·w,
// gx = n·u − x·n³·mean(u·x); the block's rows' Σ g·x·n go to part[blockIdx.x].
template <typename T>
__device__ __forceinline__ void rms_norm_vjp_rows(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ g,
                                                  T* __restrict__ gx, typename Acc<T>::type* __restrict__ part, u64 rows,
                                                  u64 len, float eps) {
  typedef typename Acc<T>::type A;
  const int S = NV_RMS_SLOTS;
  __shared__ A sm[64];
  A acc[S];
#pragma unroll
  for (int k = 0; k < S; ++k) acc[k] = 0;
  bool vec = rows_vectorisable<T>(len, x, g, gx, w ? (const void*)w : x);
  for (u64 row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* p = x + row * len;
    const T* gr = g + row * len;
    A s[2] = {0, 0};
    for_row<T>(len, vec, [&](auto W, u64 v, int) {
      NV_PIECE;
      A a[M], gv[M], wv[M];
      load<T, M>(p, v, a);
      load<T, M>(gr, v, gv);
      load_or_one<T, M>(w, v, wv);
#pragma unroll
      for (int j = 0; j < M; ++j) {
        s[0] += a[j] * a[j];
        s[1] += gv[j] * wv[j] * a[j];
      }
    });
    block_sums<A, 2>(s, sm);
    A n = inv_sqrt(s[0] / (A)len + (A)eps);
    A c = n * n * n * (s[1] / (A)len);
    T* q = gx + row * len;
    for_slots<T, S>(len, vec, [&](auto W, u64 v, int slot) {
      NV_PIECE;
      A a[M], gv[M], wv[M];
      T d[M];
      load<T, M>(p, v, a);
      load<T, M>(gr, v, gv);
      load_or_one<T, M>(w, v, wv);
#pragma unroll
      for (int j = 0; j < M; ++j) {
        d[j] = narrow<T>(gv[j] * wv[j] * n - a[j] * c);
        acc[slot + j] += gv[j] * (a[j] * n);
      }
      store<T, M>(q, v, d);
    });
  }
  if (w) {
    A* dst = part + (u64)blockIdx.x * len;
    for_slots<T, S>(len, vec, [&](auto W, u64 v, int slot) {
      NV_PIECE;
#pragma unroll
      for (int j = 0; j < M; ++j) dst[v * M + j] = acc[slot + j];
    });
  }
}

// ---- Layer norm derivative: with x̂ = (x − μ)·n and u = g·w,
// gx = n·(u − mean(u) − x̂·mean(u·x̂)); Σ g·x̂ and Σ g go to part[2·blockIdx.x] and the row after.
template <typename T>
__device__ __forceinline__ void layer_norm_vjp_rows(const T* __restrict__ x, const T* __restrict__ w,
                                                    const T* __restrict__ g, T* __restrict__ gx,
                                                    typename Acc<T>::type* __restrict__ part, u64 rows, u64 len,
                                                    float eps) {
  typedef typename Acc<T>::type A;
  const int S = NV_LN_SLOTS;
  __shared__ A sm[96];
  A aw[S], ab[S];
#pragma unroll
  for (int k = 0; k < S; ++k) aw[k] = ab[k] = 0;
  bool vec = rows_vectorisable<T>(len, x, g, gx, w ? (const void*)w : x);
  for (u64 row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* p = x + row * len;
    const T* gr = g + row * len;
    A s1[1] = {0};
    for_row<T>(len, vec, [&](auto W, u64 v, int) {
      NV_PIECE;
      A a[M];
      load<T, M>(p, v, a);
#pragma unroll
      for (int j = 0; j < M; ++j) s1[0] += a[j];
    });
    block_sums<A, 1>(s1, sm);
    A mu = s1[0] / (A)len;
    A s[3] = {0, 0, 0};
    for_row<T>(len, vec, [&](auto W, u64 v, int) {
      NV_PIECE;
      A a[M], gv[M], wv[M];
      load<T, M>(p, v, a);
      load<T, M>(gr, v, gv);
      load_or_one<T, M>(w, v, wv);
#pragma unroll
      for (int j = 0; j < M; ++j) {
        A c = a[j] - mu, u = gv[j] * wv[j];
        s[0] += c * c;
        s[1] += u;
        s[2] += u * c;
      }
    });
    block_sums<A, 3>(s, sm);
    A n = inv_sqrt(s[0] / (A)len + (A)eps);
    A mean_u = s[1] / (A)len, mean_ux = n * s[2] / (A)len;
    T* q = gx + row * len;
    for_slots<T, S>(len, vec, [&](auto W, u64 v, int slot) {
      NV_PIECE;
      A a[M], gv[M], wv[M];
      T d[M];
      load<T, M>(p, v, a);
      load<T, M>(gr, v, gv);
      load_or_one<T, M>(w, v, wv);
#pragma unroll
      for (int j = 0; j < M; ++j) {
        A xh = (a[j] - mu) * n;
        d[j] = narrow<T>(n * (gv[j] * wv[j] - mean_u - xh * mean_ux));
        aw[slot + j] += gv[j] * xh;
        ab[slot + j] += gv[j];
      }
      store<T, M>(q, v, d);
    });
  }
  A* dst = part + (u64)blockIdx.x * len * 2;
  for_slots<T, S>(len, vec, [&](auto W, u64 v, int slot) {
    NV_PIECE;
#pragma unroll
    for (int j = 0; j < M; ++j) {
      dst[v * M + j] = aw[slot + j];
      dst[len + v * M + j] = ab[slot + j];
    }
  });
}

// The per-block partial rows added up: for each column c < cols, Σ_p part[p·stride + c] goes to
// out[c] when c < split, else to out_hi[c − split] (a null output is skipped). A block of
// NV_COL_SUM_THREADS takes 32 vectors of columns (128 f32 columns), its warps a share of the
// parts each, eight 16-byte loads in flight per thread, then adds the warps' sums in shared
// memory in a fixed order (faster than a thread per column or 4-byte loads; see
// bench/results/).
#define NV_COL_SUM_THREADS 512
// O: the accumulator type (`col_sum`), or the dtype (`col_sum_round`, the RMS norm's weight
// cotangent: rounded once here, so no cast follows).
template <typename A, typename O>
__device__ __forceinline__ void col_sum(const A* __restrict__ part, O* __restrict__ out, O* __restrict__ out_hi,
                                        u64 parts, u64 cols, u64 split, u64 stride) {
  constexpr int N = 16 / sizeof(A), C = 32 * N, W = NV_COL_SUM_THREADS / 32;
  __shared__ A sm[W][C];
  int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
  bool vec = cols % N == 0 && stride % N == 0 && aligned16(part);
  for (u64 c0 = (u64)blockIdx.x * C; c0 < cols; c0 += (u64)gridDim.x * C) {
    u64 c = c0 + (u64)lane * N;
    A s[N];
#pragma unroll
    for (int j = 0; j < N; ++j) s[j] = 0;
    if (vec && c < cols) {
      u64 p = wp;
      for (; p + 7 * W < parts; p += 8 * W) {
        Vec<A, N> r[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) r[k] = *reinterpret_cast<const Vec<A, N>*>(part + (p + k * W) * stride + c);
#pragma unroll
        for (int k = 0; k < 8; ++k)
#pragma unroll
          for (int j = 0; j < N; ++j) s[j] += r[k].v[j];
      }
      for (; p < parts; p += W) {
        Vec<A, N> r = *reinterpret_cast<const Vec<A, N>*>(part + p * stride + c);
#pragma unroll
        for (int j = 0; j < N; ++j) s[j] += r.v[j];
      }
    } else if (!vec) {
      for (u64 p = wp; p < parts; p += W)
#pragma unroll
        for (int j = 0; j < N; ++j)
          if (c + j < cols) s[j] += part[p * stride + c + j];
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
      if (col < split) {
        if (out) out[col] = narrow<O>(sum);
      } else if (out_hi) {
        out_hi[col - split] = narrow<O>(sum);
      }
    }
    __syncthreads();
  }
}
