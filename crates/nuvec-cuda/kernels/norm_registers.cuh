// The norm kernels for rows that fit in registers: RMS norm (with the residual add), layer norm
// and their derivatives, for contiguous, 16-byte aligned rows whose length is a multiple of the
// vector width N = 16 / sizeof(T) and at most 8 · 512 vectors (fast/norm.rs chooses; the rest
// take norm.cuh's looping kernels).
//
// A group of G threads (a multiple of 32, at most 512) takes a row, each thread holding V
// vectors of it: vectors t, t + G, ..., t + (V − 1)·G. The row is read from memory once, every
// load of a row is issued before any is used, and a group loads its next row before it reduces
// the current one, so loads stay in flight through the reductions (far faster than without the
// prefetch, or than the looping kernels, which re-read each row from cache after every
// reduction; see bench/results/). Blocks hold
// several groups working on different rows. Groups synchronise on their own named barrier (1 + group index; 0 is
// __syncthreads'), at most 8 of them when G > 32; a group of one warp needs none.
//
// The derivative kernels keep each thread's share of the weight (and bias) gradient in
// registers across the rows its group visits; at the end the block adds its groups' shares and
// writes one partial row, which col_sum adds over blocks.
#pragma once
#include "norm.cuh"

#define NV_REG_BLOCK 512

struct RowGroup {
  int size;   // threads per row (G)
  int id;     // the group's index in its block
  int t;      // the thread's index in its group
  int count;  // groups per block
};

__device__ __forceinline__ RowGroup row_group(int size) {
  return RowGroup{size, (int)threadIdx.x / size, (int)threadIdx.x % size, (int)blockDim.x / size};
}

__device__ __forceinline__ void group_sync(const RowGroup& g) {
  if (g.size > 32) asm volatile("bar.sync %0, %1;" ::"r"(1 + g.id), "r"(g.size) : "memory");
}

// Sums of K values over the group (valid in every thread of it). `sm` is a pair of buffers of
// 8 × K' × 16 values (K' ≥ K); calls alternate between them (`phase`), so one barrier suffices:
// a thread writing a buffer has passed the previous call's barrier, which every thread reaches
// only after reading this buffer's previous sums. (Layer norms make two reductions per row.)
template <typename A, int K, int S>
__device__ __forceinline__ void group_sums(A (&v)[K], A (&sm)[2][S], int& phase, const RowGroup& g) {
  static_assert(S >= 8 * K * 16, "buffers too small for K sums of 8 groups");
#pragma unroll
  for (int k = 0; k < K; ++k)
    for (int o = 16; o > 0; o >>= 1) v[k] += shfl_xor_any(v[k], o);
  if (g.size == 32) return;
  int lane = g.t & 31, warp = g.t >> 5, nw = g.size >> 5;
  A* s = sm[phase] + g.id * K * 16;
  phase ^= 1;
  if (lane == 0) {
#pragma unroll
    for (int k = 0; k < K; ++k) s[k * 16 + warp] = v[k];
  }
  group_sync(g);
#pragma unroll
  for (int k = 0; k < K; ++k) {
    v[k] = lane < nw ? s[k * 16 + lane] : (A)0;
    for (int o = 16; o > 0; o >>= 1) v[k] += shfl_xor_any(v[k], o);
  }
}

template <typename T> using Vec16 = Vec<T, 16 / sizeof(T)>;

// The index in the row of the thread's v-th vector (in the row when below the row's count).
__device__ __forceinline__ u64 vec_index(const RowGroup& g, int v) { return (u64)g.t + (u64)v * g.size; }

template <typename T, int V>
__device__ __forceinline__ void row_load(const T* __restrict__ p, u64 nvec, const RowGroup& g, Vec16<T> (&r)[V]) {
#pragma unroll
  for (int v = 0; v < V; ++v)
    if (vec_index(g, v) < nvec) r[v] = reinterpret_cast<const Vec16<T>*>(p)[vec_index(g, v)];
}

template <typename T, int V>
__device__ __forceinline__ void row_store(T* __restrict__ p, u64 nvec, const RowGroup& g, const Vec16<T> (&r)[V]) {
#pragma unroll
  for (int v = 0; v < V; ++v)
    if (vec_index(g, v) < nvec) reinterpret_cast<Vec16<T>*>(p)[vec_index(g, v)] = r[v];
}

template <typename T, int V> __device__ __forceinline__ void row_move(Vec16<T> (&dst)[V], const Vec16<T> (&src)[V]) {
#pragma unroll
  for (int v = 0; v < V; ++v) dst[v] = src[v];
}

// The first row of a group and the stride between its rows.
__device__ __forceinline__ u64 first_row(const RowGroup& g) { return (u64)blockIdx.x * g.count + g.id; }
__device__ __forceinline__ u64 row_stride(const RowGroup& g) { return (u64)gridDim.x * g.count; }

// Walks the group's rows holding K arrays' rows (src[k] + row·len) in registers: the next row's
// loads are issued before `body(row, cur)` reduces and rewrites the current one, so loads stay
// in flight through the reductions.
template <typename T, int V, int K, typename F>
__device__ __forceinline__ void walk_rows(const T* const (&src)[K], u64 rows, u64 len, const RowGroup& g, F body) {
  u64 nvec = len / (16 / sizeof(T)), row = first_row(g);
  Vec16<T> cur[K][V], nxt[K][V];
  if (row < rows) {
#pragma unroll
    for (int k = 0; k < K; ++k) row_load<T, V>(src[k] + row * len, nvec, g, cur[k]);
  }
  for (; row < rows; row += row_stride(g)) {
    u64 next = row + row_stride(g);
    if (next < rows) {
#pragma unroll
      for (int k = 0; k < K; ++k) row_load<T, V>(src[k] + next * len, nvec, g, nxt[k]);
    }
    body(row, cur);
#pragma unroll
    for (int k = 0; k < K; ++k) row_move<T, V>(cur[k], nxt[k]);
  }
}

// Adds the block's groups' accumulators (the same columns in every group) and writes them to
// dst[0 .. len), a thread's N sums in one Vec<A, N> store (16 or 32 bytes; dst aligned to that:
// part rows are len values apart from a cuMemAlloc'd base, len a multiple of N): writing the
// partial rows a value per thread and store was measurably slower (see bench/results/). `red`
// holds NV_REG_BLOCK × N values; every thread of the block calls this.
template <typename T, int V, typename A>
__device__ __forceinline__ void block_partial(const A (&acc)[V][16 / sizeof(T)], A* __restrict__ dst, u64 nvec,
                                              const RowGroup& g, A* red) {
  const int N = 16 / sizeof(T);
#pragma unroll
  for (int v = 0; v < V; ++v) {
    Vec<A, N> s;
#pragma unroll
    for (int j = 0; j < N; ++j) s.v[j] = acc[v][j];
    if (g.count > 1) {
      __syncthreads();  // the previous vector's readers are done with red
#pragma unroll
      for (int j = 0; j < N; ++j) red[j * blockDim.x + threadIdx.x] = acc[v][j];
      __syncthreads();
#pragma unroll
      for (int j = 0; j < N; ++j) {
        s.v[j] = 0;
        for (int k = 0; k < g.count; ++k) s.v[j] += red[j * blockDim.x + k * g.size + g.t];
      }
    }
    if (g.id == 0 && vec_index(g, v) < nvec) reinterpret_cast<Vec<A, N>*>(dst)[vec_index(g, v)] = s;
  }
}

// ---- RMS norm (norm.cuh's rms_norm_rows, rows in registers); RES: with the residual add.
template <typename T, int V, bool RES>
__device__ __forceinline__ void rms_norm_regs(const T* __restrict__ x, const T* __restrict__ res, const T* __restrict__ w,
                                              T* __restrict__ h, T* __restrict__ out, u64 rows, u64 len, float eps,
                                              int group) {
  typedef typename Acc<T>::type A;
  const int N = 16 / sizeof(T);
  __shared__ A sm[2][8 * 16];
  int ph = 0;
  RowGroup g = row_group(group);
  u64 nvec = len / N;
  const T* src[RES ? 2 : 1];
  src[0] = x;
  if constexpr (RES) src[1] = res;
  walk_rows<T, V, RES ? 2 : 1>(src, rows, len, g, [&](u64 row, auto& cur) {
    auto& r = cur[0];
    if constexpr (RES) {
#pragma unroll
      for (int v = 0; v < V; ++v) r[v] = add_vec<T, N>(r[v], cur[1][v]);
      row_store<T, V>(h + row * len, nvec, g, r);
    }
    A s[1] = {0};
#pragma unroll
    for (int v = 0; v < V; ++v)
      if (vec_index(g, v) < nvec) {
#pragma unroll
        for (int j = 0; j < N; ++j) s[0] += widen(r[v].v[j]) * widen(r[v].v[j]);
      }
    group_sums(s, sm, ph, g);
    A n = inv_sqrt(s[0] / (A)len + (A)eps);
#pragma unroll
    for (int v = 0; v < V; ++v) {
      if (vec_index(g, v) >= nvec) continue;
      A y[N];
#pragma unroll
      for (int j = 0; j < N; ++j) y[j] = widen(r[v].v[j]) * n;
      r[v] = round_affine<T, N>(y, w, nullptr, vec_index(g, v));
    }
    row_store<T, V>(out + row * len, nvec, g, r);
  });
}

// ---- The forward norms with a block per row (the `_o` kernels; fast/norm.rs takes them for
// rows of 64 to 512·V vectors). Nothing is loaded ahead and indices within a row are 32-bit, so
// the kernels keep few registers (32 for the RMS norm at 2 bf16 vectors per thread) and up to
// 2048 threads stay resident per SM: the hardware overlaps one block's reduction with other
// blocks' loads. The bytes in flight per SM decide; so these beat the persistent `_r` kernels
// on long rows (see bench/results/).

// The sum of `v` over the block, in every thread. `sm` alternates between its halves by `phase`,
// so one barrier suffices (as group_sums').
template <typename A> __device__ __forceinline__ A block_sum(A v, A (&sm)[2][32], int& phase) {
  for (int o = 16; o > 0; o >>= 1) v += shfl_xor_any(v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  if (lane == 0) sm[phase][warp] = v;
  __syncthreads();
  v = lane < nw ? sm[phase][lane] : (A)0;
  phase ^= 1;
  for (int o = 16; o > 0; o >>= 1) v += shfl_xor_any(v, o);
  return v;
}

// Loads whose lines L1 and L2 keep last (evict_last, whole lines), for the one-row kernels' rows.
// The rows are read once, yet marking them so lets L2 write the outputs back first and the
// stream runs faster, as torch.compile's RMS norm marks its first read of the row (see
// bench/results/; marking the lines back to normal after the row costs more than the lines left
// marked cost a following kernel). The policy comes from a volatile asm, so it (and every load
// that takes it) stays after the dependent-launch wait; the loads are not volatile, so the
// compiler issues a row's loads together. The persistent kernels' loads (row_load, rows loaded
// ahead) gain nothing so and stay plain.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
__device__ __forceinline__ unsigned long long keep_policy() {
  unsigned long long pol;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}

template <typename V> __device__ __forceinline__ V load_keep(const V* p, unsigned long long pol) {
  static_assert(sizeof(V) == 16, "16-byte vectors");
  unsigned u[4];
  asm("ld.global.L1::evict_last.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
      : "=r"(u[0]), "=r"(u[1]), "=r"(u[2]), "=r"(u[3])
      : "l"(p), "l"(pol));
  V r;
  memcpy(&r, u, 16);
  return r;
}
#else
__device__ __forceinline__ unsigned long long keep_policy() { return 0; }
template <typename V> __device__ __forceinline__ V load_keep(const V* p, unsigned long long) { return *p; }
#endif

// Loads the thread's vectors t, t + B, ... of a row of `nvec` (those in the row), kept in L1 and
// L2 last (load_keep).
template <typename T, int V>
__device__ __forceinline__ void one_load(const T* __restrict__ p, u32 nvec, Vec16<T> (&r)[V]) {
  const unsigned long long pol = keep_policy();
#pragma unroll
  for (int v = 0; v < V; ++v) {
    u32 i = threadIdx.x + (u32)v * blockDim.x;
    if (i < nvec) r[v] = load_keep(reinterpret_cast<const Vec16<T>*>(p) + i, pol);
  }
}

// Σ f(x) over the elements of the thread's vectors of the row, in the statistics' precision.
template <typename T, int V, typename F>
__device__ __forceinline__ typename Acc<T>::type one_sum(u32 nvec, const Vec16<T> (&r)[V], F f) {
  typename Acc<T>::type s = 0;
#pragma unroll
  for (int v = 0; v < V; ++v)
    if (threadIdx.x + (u32)v * blockDim.x < nvec) {
#pragma unroll
      for (int j = 0; j < 16 / (int)sizeof(T); ++j) s += f(widen(r[v].v[j]));
    }
  return s;
}

// Writes the thread's vectors of the row normalised: (x − mu)·n rounded, times the weight and
// plus the bias as round_affine does (mu 0 for the RMS norm).
template <typename T, int V>
__device__ __forceinline__ void one_store(T* q, u32 nvec, const Vec16<T> (&r)[V], typename Acc<T>::type mu,
                                          typename Acc<T>::type n, const T* w, const T* b) {
  constexpr int N = 16 / sizeof(T);
#pragma unroll
  for (int v = 0; v < V; ++v) {
    u32 i = threadIdx.x + (u32)v * blockDim.x;
    if (i >= nvec) continue;
    typename Acc<T>::type y[N];
#pragma unroll
    for (int j = 0; j < N; ++j) y[j] = (widen(r[v].v[j]) - mu) * n;
    reinterpret_cast<Vec16<T>*>(q)[i] = round_affine<T, N>(y, w, b, i);
  }
}

// RMS norm, a block per row; RES: with the residual add (h = x + res written, then normalised).
template <typename T, int V, bool RES>
__device__ __forceinline__ void rms_norm_one(const T* __restrict__ x, const T* __restrict__ res, const T* __restrict__ w,
                                             T* __restrict__ h, T* __restrict__ out, u64 rows, u64 len, float eps) {
  typedef typename Acc<T>::type A;
  __shared__ A sm[2][32];
  int ph = 0;
  const u32 nvec = (u32)(len / (16 / sizeof(T)));
  for (u64 row = blockIdx.x; row < rows; row += gridDim.x) {
    Vec16<T> r[V];
    one_load<T, V>(x + row * len, nvec, r);
    if constexpr (RES) {
      Vec16<T> q[V];
      one_load<T, V>(res + row * len, nvec, q);
#pragma unroll
      for (int v = 0; v < V; ++v) {
        u32 i = threadIdx.x + (u32)v * blockDim.x;
        if (i < nvec) {
          r[v] = add_vec(r[v], q[v]);
          reinterpret_cast<Vec16<T>*>(h + row * len)[i] = r[v];
        }
      }
    }
    A n = inv_sqrt(block_sum(one_sum<T, V>(nvec, r, [](A a) { return a * a; }), sm, ph) / (A)len + (A)eps);
    one_store<T, V>(out + row * len, nvec, r, (A)0, n, w, nullptr);
  }
}

// Layer norm, a block per row: mean, then the variance of the held values, then the output (as
// layer_norm_regs).
template <typename T, int V>
__device__ __forceinline__ void layer_norm_one(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                                               T* __restrict__ out, u64 rows, u64 len, float eps) {
  typedef typename Acc<T>::type A;
  __shared__ A sm[2][32];
  int ph = 0;
  const u32 nvec = (u32)(len / (16 / sizeof(T)));
  for (u64 row = blockIdx.x; row < rows; row += gridDim.x) {
    Vec16<T> r[V];
    one_load<T, V>(x + row * len, nvec, r);
    A mu = block_sum(one_sum<T, V>(nvec, r, [](A a) { return a; }), sm, ph) / (A)len;
    A var = block_sum(one_sum<T, V>(nvec, r, [mu](A a) { return (a - mu) * (a - mu); }), sm, ph) / (A)len;
    one_store<T, V>(out + row * len, nvec, r, mu, inv_sqrt(var + (A)eps), w, b);
  }
}

// ---- One reduction for the layer norm derivative's statistics. Each thread's share of a row
// gives its mean, Σ(x − mean)², Σu and Σu·(x − mean) (u the cotangent times the weight); shares
// of equal size merge without division (Chan et al.; d the difference of the means, n each
// share's count): mean (m₁ + m₂)/2, squares q₁ + q₂ + d²·n/2, Σu·(x − mean) c₁ + c₂ + d·(u₂ − u₁)/2.
// This holds when every thread of the group holds V whole vectors and the group is 32·2^k
// threads (fast/norm.rs chooses). One reduction instead of two (mean, then the rest) is much
// faster; a general merge, with divisions, was compute-bound (see bench/results/).
template <typename A> struct RowMoments {
  A m, q, u, c;
};

template <typename A>
__device__ __forceinline__ RowMoments<A> merge_equal(const RowMoments<A>& a, const RowMoments<A>& b, A half_n) {
  A d = b.m - a.m;
  return RowMoments<A>{(a.m + b.m) * (A)0.5, (a.q + b.q) + d * d * half_n, a.u + b.u,
                       (a.c + b.c) + (A)0.5 * d * (b.u - a.u)};
}

template <typename A> __device__ __forceinline__ RowMoments<A> shfl_moments(const RowMoments<A>& a, int o) {
  return RowMoments<A>{shfl_xor_any(a.m, o), shfl_xor_any(a.q, o), shfl_xor_any(a.u, o), shfl_xor_any(a.c, o)};
}

// The group's moments in every thread of it, from each thread's over n values. `sm`: a pair of
// buffers alternated as group_sums' are.
template <typename A>
__device__ __forceinline__ RowMoments<A> group_moments(RowMoments<A> a, A n, RowMoments<A> (&sm)[2][8 * 16], int& phase,
                                                       const RowGroup& g) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    a = merge_equal(a, shfl_moments(a, o), n * (A)0.5);
    n *= 2;
  }
  if (g.size == 32) return a;
  int lane = g.t & 31, warp = g.t >> 5, nw = g.size >> 5;
  RowMoments<A>* s = sm[phase] + g.id * 16;
  phase ^= 1;
  if (lane == 0) s[warp] = a;
  group_sync(g);
  a = s[lane & (nw - 1)];
  for (int o = 1; o < nw; o <<= 1) {
    a = merge_equal(a, shfl_moments(a, o), n * (A)0.5);
    n *= 2;
  }
  return a;
}

// ---- Layer norm (norm.cuh's layer_norm_rows, rows in registers): mean, then the variance of
// the held values, then the output.
template <typename T, int V>
__device__ __forceinline__ void layer_norm_regs(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                                                T* __restrict__ out, u64 rows, u64 len, float eps, int group) {
  typedef typename Acc<T>::type A;
  const int N = 16 / sizeof(T);
  __shared__ A sm[2][8 * 16];
  int ph = 0;
  RowGroup g = row_group(group);
  u64 nvec = len / N;
  const T* src[1] = {x};
  walk_rows<T, V, 1>(src, rows, len, g, [&](u64 row, auto& cur) {
    auto& r = cur[0];
    A s[1] = {0};
#pragma unroll
    for (int v = 0; v < V; ++v)
      if (vec_index(g, v) < nvec) {
#pragma unroll
        for (int j = 0; j < N; ++j) s[0] += widen(r[v].v[j]);
      }
    group_sums(s, sm, ph, g);
    A mu = s[0] / (A)len;
    s[0] = 0;
#pragma unroll
    for (int v = 0; v < V; ++v)
      if (vec_index(g, v) < nvec) {
#pragma unroll
        for (int j = 0; j < N; ++j) {
          A c = widen(r[v].v[j]) - mu;
          s[0] += c * c;
        }
      }
    group_sums(s, sm, ph, g);
    A n = inv_sqrt(s[0] / (A)len + (A)eps);
#pragma unroll
    for (int v = 0; v < V; ++v) {
      if (vec_index(g, v) >= nvec) continue;
      A y[N];
#pragma unroll
      for (int j = 0; j < N; ++j) y[j] = (widen(r[v].v[j]) - mu) * n;
      r[v] = round_affine<T, N>(y, w, b, vec_index(g, v));
    }
    row_store<T, V>(out + row * len, nvec, g, r);
  });
}

// The weight's element j of the thread's v-th vector, or 1 without a weight.
template <typename T, int V>
__device__ __forceinline__ typename Acc<T>::type weight_at(const T* w, const Vec16<T> (&wr)[V], int v, int j) {
  return w ? widen(wr[v].v[j]) : (typename Acc<T>::type)1;
}

// Zeroed per-thread partial sums of a weight-like cotangent.
template <typename A, int V, int N> __device__ __forceinline__ void zero(A (&acc)[V][N]) {
#pragma unroll
  for (int v = 0; v < V; ++v)
#pragma unroll
    for (int j = 0; j < N; ++j) acc[v][j] = 0;
}

// ---- RMS norm derivative (norm.cuh's rms_norm_vjp_rows, rows in registers); the block's Σ
// g·x·n goes to part[blockIdx.x].
template <typename T, int V>
__device__ __forceinline__ void rms_norm_vjp_regs(const T* __restrict__ x, const T* __restrict__ w,
                                                  const T* __restrict__ g, T* __restrict__ gx,
                                                  typename Acc<T>::type* __restrict__ part, u64 rows, u64 len,
                                                  float eps, int group) {
  typedef typename Acc<T>::type A;
  const int N = 16 / sizeof(T);
  __shared__ A sm[2][8 * 2 * 16];
  int ph = 0;
  __shared__ A red[NV_REG_BLOCK * N];
  RowGroup grp = row_group(group);
  u64 nvec = len / N;
  A acc[V][N];
  zero(acc);
  Vec16<T> wr[V];
  if (w) row_load<T, V>(w, nvec, grp, wr);
  const T* src[2] = {x, g};
  walk_rows<T, V, 2>(src, rows, len, grp, [&](u64 row, auto& cur) {
    auto &xr = cur[0], &gr = cur[1];
    A s[2] = {0, 0};
#pragma unroll
    for (int v = 0; v < V; ++v)
      if (vec_index(grp, v) < nvec) {
#pragma unroll
        for (int j = 0; j < N; ++j) {
          A a = widen(xr[v].v[j]), u = widen(gr[v].v[j]) * weight_at<T, V>(w, wr, v, j);
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
      A y[N];
#pragma unroll
      for (int j = 0; j < N; ++j) {
        A a = widen(xr[v].v[j]), gv = widen(gr[v].v[j]);
        acc[v][j] += gv * (a * n);
        y[j] = gv * weight_at<T, V>(w, wr, v, j) * n - a * c;
      }
      xr[v] = round_vec<T, N>(y);
    }
    row_store<T, V>(gx + row * len, nvec, grp, xr);
  });
  if (w) block_partial<T, V, A>(acc, part + (u64)blockIdx.x * len, nvec, grp, red);
}

// ---- Layer norm derivative (norm.cuh's layer_norm_vjp_rows, rows in registers); the block's
// Σ g·x̂ and Σ g go to part[2·blockIdx.x] and the row after. EQ: every thread holds V whole
// vectors and the group is 32·2^k threads, so the statistics take one reduction (group_moments).
template <typename T, int V, bool EQ>
__device__ __forceinline__ void layer_norm_vjp_regs(const T* __restrict__ x, const T* __restrict__ w,
                                                    const T* __restrict__ g, T* __restrict__ gx,
                                                    typename Acc<T>::type* __restrict__ part, u64 rows, u64 len,
                                                    float eps, int group) {
  typedef typename Acc<T>::type A;
  const int N = 16 / sizeof(T);
  __shared__ A sm[2][8 * 3 * 16];
  __shared__ RowMoments<A> msm[2][8 * 16];
  int ph = 0;
  __shared__ A red[NV_REG_BLOCK * N];
  RowGroup grp = row_group(group);
  u64 nvec = len / N;
  A aw[V][N], ab[V][N];
  zero(aw);
  zero(ab);
  Vec16<T> wr[V];
  if (w) row_load<T, V>(w, nvec, grp, wr);
  const T* src[2] = {x, g};
  walk_rows<T, V, 2>(src, rows, len, grp, [&](u64 row, auto& cur) {
    auto &xr = cur[0], &gr = cur[1];
    // The row's mean, Σ(x − mean)², Σu and Σu·(x − mean).
    RowMoments<A> st;
    if constexpr (EQ) {
      A s = 0;
#pragma unroll
      for (int v = 0; v < V; ++v)
#pragma unroll
        for (int j = 0; j < N; ++j) s += widen(xr[v].v[j]);
      st = RowMoments<A>{s * ((A)1 / (A)(V * N)), 0, 0, 0};
#pragma unroll
      for (int v = 0; v < V; ++v)
#pragma unroll
        for (int j = 0; j < N; ++j) {
          A c = widen(xr[v].v[j]) - st.m, u = widen(gr[v].v[j]) * weight_at<T, V>(w, wr, v, j);
          st.q += c * c;
          st.u += u;
          st.c += u * c;
        }
      st = group_moments(st, (A)(V * N), msm, ph, grp);
    } else {
      A s1[1] = {0};
#pragma unroll
      for (int v = 0; v < V; ++v)
        if (vec_index(grp, v) < nvec) {
#pragma unroll
          for (int j = 0; j < N; ++j) s1[0] += widen(xr[v].v[j]);
        }
      group_sums(s1, sm, ph, grp);
      A mu = s1[0] / (A)len;
      A s[3] = {0, 0, 0};
#pragma unroll
      for (int v = 0; v < V; ++v)
        if (vec_index(grp, v) < nvec) {
#pragma unroll
          for (int j = 0; j < N; ++j) {
            A c = widen(xr[v].v[j]) - mu, u = widen(gr[v].v[j]) * weight_at<T, V>(w, wr, v, j);
            s[0] += c * c;
            s[1] += u;
            s[2] += u * c;
          }
        }
      group_sums(s, sm, ph, grp);
      st = RowMoments<A>{mu, s[0], s[1], s[2]};
    }
    A mu = st.m, n = inv_sqrt(st.q / (A)len + (A)eps);
    A mean_u = st.u / (A)len, mean_ux = n * st.c / (A)len;
#pragma unroll
    for (int v = 0; v < V; ++v) {
      if (vec_index(grp, v) >= nvec) continue;
      A y[N];
#pragma unroll
      for (int j = 0; j < N; ++j) {
        A xh = (widen(xr[v].v[j]) - mu) * n, gv = widen(gr[v].v[j]);
        aw[v][j] += gv * xh;
        ab[v][j] += gv;
        y[j] = n * (gv * weight_at<T, V>(w, wr, v, j) - mean_u - xh * mean_ux);
      }
      xr[v] = round_vec<T, N>(y);
    }
    row_store<T, V>(gx + row * len, nvec, grp, xr);
  });
  A* dst = part + (u64)blockIdx.x * len * 2;
  block_partial<T, V, A>(aw, dst, nvec, grp, red);
  block_partial<T, V, A>(ab, dst + len, nvec, grp, red);
}
