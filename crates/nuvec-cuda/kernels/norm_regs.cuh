// The norm kernels for rows that fit in registers: RMS norm (with the residual add), layer norm
// and their derivatives, for contiguous, 16-byte aligned rows whose length is a multiple of the
// vector width N = 16 / sizeof(T) and at most 8 · 512 vectors (fast_rows.rs chooses; the rest
// take norm.cuh's looping kernels).
//
// A group of G threads (a multiple of 32, at most 512) takes a row, each thread holding V
// vectors of it: vectors t, t + G, ..., t + (V − 1)·G. The row is read from memory once, every
// load of a row is issued before any is used, and a group loads its next row before it reduces
// the current one, so loads stay in flight through the reductions (H200, bf16 32768×4096:
// without that prefetch the layer norm reached 53–65% of copy, the looping kernels, which
// re-read each row from cache after every reduction, 35–56% for the derivatives). Blocks hold
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

// Sums of K values over the group (valid in every thread of it). `sm` holds 8 × K × 16 values;
// callers alternate two such buffers between consecutive calls, so one barrier suffices: a
// thread writing a buffer has passed the previous call's barrier, which every thread reaches
// only after reading this buffer's previous sums. (Layer norms make two reductions per row.)
template <typename A, int K> __device__ __forceinline__ void group_sums(A (&v)[K], A* sm, const RowGroup& g) {
#pragma unroll
  for (int k = 0; k < K; ++k)
    for (int o = 16; o > 0; o >>= 1) v[k] += shfl_xor_any(v[k], o);
  if (g.size == 32) return;
  int lane = g.t & 31, warp = g.t >> 5, nw = g.size >> 5;
  A* s = sm + g.id * K * 16;
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

// Adds the block's groups' accumulators (the same columns in every group) and writes them to
// dst[0 .. len). `red` holds NV_REG_BLOCK × N values; every thread of the block calls this.
template <typename T, int V, typename A>
__device__ __forceinline__ void block_partial(const A (&acc)[V][16 / sizeof(T)], A* __restrict__ dst, u64 nvec,
                                              const RowGroup& g, A* red) {
  const int N = 16 / sizeof(T);
#pragma unroll
  for (int v = 0; v < V; ++v) {
    __syncthreads();  // the previous vector's readers are done with red
#pragma unroll
    for (int j = 0; j < N; ++j) red[j * blockDim.x + threadIdx.x] = acc[v][j];
    __syncthreads();
    if (g.id == 0 && vec_index(g, v) < nvec) {
#pragma unroll
      for (int j = 0; j < N; ++j) {
        A s = 0;
        for (int k = 0; k < g.count; ++k) s += red[j * blockDim.x + k * g.size + g.t];
        dst[vec_index(g, v) * N + j] = s;
      }
    }
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
  u64 nvec = len / N, row = first_row(g);
  Vec16<T> r[V], b[V], nr[V], nb[V];
  if (row < rows) {
    row_load<T, V>(x + row * len, nvec, g, r);
    if (RES) row_load<T, V>(res + row * len, nvec, g, b);
  }
  for (; row < rows; row += row_stride(g)) {
    u64 next = row + row_stride(g);
    if (next < rows) {
      row_load<T, V>(x + next * len, nvec, g, nr);
      if (RES) row_load<T, V>(res + next * len, nvec, g, nb);
    }
    if (RES) {
#pragma unroll
      for (int v = 0; v < V; ++v)
#pragma unroll
        for (int j = 0; j < N; ++j) r[v].v[j] = narrow<T>(widen(r[v].v[j]) + widen(b[v].v[j]));
      row_store<T, V>(h + row * len, nvec, g, r);
    }
    A s[1] = {0};
#pragma unroll
    for (int v = 0; v < V; ++v)
      if (vec_index(g, v) < nvec) {
#pragma unroll
        for (int j = 0; j < N; ++j) s[0] += widen(r[v].v[j]) * widen(r[v].v[j]);
      }
    group_sums<A, 1>(s, sm[ph], g);
    ph ^= 1;
    A n = inv_sqrt(s[0] / (A)len + (A)eps);
#pragma unroll
    for (int v = 0; v < V; ++v) {
      if (vec_index(g, v) >= nvec) continue;
      A wv[N];
      load_or_one<T, N>(w, vec_index(g, v), wv);
#pragma unroll
      for (int j = 0; j < N; ++j) r[v].v[j] = scaled<T>(widen(r[v].v[j]) * n, wv[j], w != nullptr);
    }
    row_store<T, V>(out + row * len, nvec, g, r);
    row_move<T, V>(r, nr);
    if (RES) row_move<T, V>(b, nb);
  }
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
  u64 nvec = len / N, row = first_row(g);
  Vec16<T> r[V], nr[V];
  if (row < rows) row_load<T, V>(x + row * len, nvec, g, r);
  for (; row < rows; row += row_stride(g)) {
    u64 next = row + row_stride(g);
    if (next < rows) row_load<T, V>(x + next * len, nvec, g, nr);
    A s[1] = {0};
#pragma unroll
    for (int v = 0; v < V; ++v)
      if (vec_index(g, v) < nvec) {
#pragma unroll
        for (int j = 0; j < N; ++j) s[0] += widen(r[v].v[j]);
      }
    group_sums<A, 1>(s, sm[ph], g);
    ph ^= 1;
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
    group_sums<A, 1>(s, sm[ph], g);
    ph ^= 1;
    A n = inv_sqrt(s[0] / (A)len + (A)eps);
#pragma unroll
    for (int v = 0; v < V; ++v) {
      if (vec_index(g, v) >= nvec) continue;
      A wv[N], bv[N];
      load_or_one<T, N>(w, vec_index(g, v), wv);
      if (b) load<T, N>(b, vec_index(g, v), bv);
#pragma unroll
      for (int j = 0; j < N; ++j) {
        T y = scaled<T>((widen(r[v].v[j]) - mu) * n, wv[j], w != nullptr);
        r[v].v[j] = b ? narrow<T>(widen(y) + bv[j]) : y;
      }
    }
    row_store<T, V>(out + row * len, nvec, g, r);
    row_move<T, V>(r, nr);
  }
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
  Vec16<T> wr[V];
#pragma unroll
  for (int v = 0; v < V; ++v)
#pragma unroll
    for (int j = 0; j < N; ++j) acc[v][j] = 0;
  if (w) row_load<T, V>(w, nvec, grp, wr);
  u64 row = first_row(grp);
  Vec16<T> xr[V], gr[V], nx[V], ng[V];
  if (row < rows) {
    row_load<T, V>(x + row * len, nvec, grp, xr);
    row_load<T, V>(g + row * len, nvec, grp, gr);
  }
  for (; row < rows; row += row_stride(grp)) {
    u64 next = row + row_stride(grp);
    if (next < rows) {
      row_load<T, V>(x + next * len, nvec, grp, nx);
      row_load<T, V>(g + next * len, nvec, grp, ng);
    }
    A s[2] = {0, 0};
#pragma unroll
    for (int v = 0; v < V; ++v)
      if (vec_index(grp, v) < nvec) {
#pragma unroll
        for (int j = 0; j < N; ++j) {
          A a = widen(xr[v].v[j]), u = widen(gr[v].v[j]) * (w ? widen(wr[v].v[j]) : (A)1);
          s[0] += a * a;
          s[1] += u * a;
        }
      }
    group_sums<A, 2>(s, sm[ph], grp);
    ph ^= 1;
    A n = inv_sqrt(s[0] / (A)len + (A)eps);
    A c = n * n * n * (s[1] / (A)len);
#pragma unroll
    for (int v = 0; v < V; ++v) {
      if (vec_index(grp, v) >= nvec) continue;
#pragma unroll
      for (int j = 0; j < N; ++j) {
        A a = widen(xr[v].v[j]), gv = widen(gr[v].v[j]);
        acc[v][j] += gv * (a * n);
        xr[v].v[j] = narrow<T>(gv * (w ? widen(wr[v].v[j]) : (A)1) * n - a * c);
      }
    }
    row_store<T, V>(gx + row * len, nvec, grp, xr);
    row_move<T, V>(xr, nx);
    row_move<T, V>(gr, ng);
  }
  if (w) block_partial<T, V, A>(acc, part + (u64)blockIdx.x * len, nvec, grp, red);
}

// ---- Layer norm derivative (norm.cuh's layer_norm_vjp_rows, rows in registers); the block's
// Σ g·x̂ and Σ g go to part[2·blockIdx.x] and the row after.
template <typename T, int V>
__device__ __forceinline__ void layer_norm_vjp_regs(const T* __restrict__ x, const T* __restrict__ w,
                                                    const T* __restrict__ g, T* __restrict__ gx,
                                                    typename Acc<T>::type* __restrict__ part, u64 rows, u64 len,
                                                    float eps, int group) {
  typedef typename Acc<T>::type A;
  const int N = 16 / sizeof(T);
  __shared__ A sm[2][8 * 3 * 16];
  int ph = 0;
  __shared__ A red[NV_REG_BLOCK * N];
  RowGroup grp = row_group(group);
  u64 nvec = len / N;
  A aw[V][N], ab[V][N];
  Vec16<T> wr[V];
#pragma unroll
  for (int v = 0; v < V; ++v)
#pragma unroll
    for (int j = 0; j < N; ++j) aw[v][j] = ab[v][j] = 0;
  if (w) row_load<T, V>(w, nvec, grp, wr);
  u64 row = first_row(grp);
  Vec16<T> xr[V], gr[V], nx[V], ng[V];
  if (row < rows) {
    row_load<T, V>(x + row * len, nvec, grp, xr);
    row_load<T, V>(g + row * len, nvec, grp, gr);
  }
  for (; row < rows; row += row_stride(grp)) {
    u64 next = row + row_stride(grp);
    if (next < rows) {
      row_load<T, V>(x + next * len, nvec, grp, nx);
      row_load<T, V>(g + next * len, nvec, grp, ng);
    }
    A s1[1] = {0};
#pragma unroll
    for (int v = 0; v < V; ++v)
      if (vec_index(grp, v) < nvec) {
#pragma unroll
        for (int j = 0; j < N; ++j) s1[0] += widen(xr[v].v[j]);
      }
    group_sums<A, 1>(s1, sm[ph], grp);
    ph ^= 1;
    A mu = s1[0] / (A)len;
    A s[3] = {0, 0, 0};
#pragma unroll
    for (int v = 0; v < V; ++v)
      if (vec_index(grp, v) < nvec) {
#pragma unroll
        for (int j = 0; j < N; ++j) {
          A c = widen(xr[v].v[j]) - mu, u = widen(gr[v].v[j]) * (w ? widen(wr[v].v[j]) : (A)1);
          s[0] += c * c;
          s[1] += u;
          s[2] += u * c;
        }
      }
    group_sums<A, 3>(s, sm[ph], grp);
    ph ^= 1;
    A n = inv_sqrt(s[0] / (A)len + (A)eps);
    A mean_u = s[1] / (A)len, mean_ux = n * s[2] / (A)len;
#pragma unroll
    for (int v = 0; v < V; ++v) {
      if (vec_index(grp, v) >= nvec) continue;
#pragma unroll
      for (int j = 0; j < N; ++j) {
        A xh = (widen(xr[v].v[j]) - mu) * n, gv = widen(gr[v].v[j]);
        aw[v][j] += gv * xh;
        ab[v][j] += gv;
        xr[v].v[j] = narrow<T>(n * (gv * (w ? widen(wr[v].v[j]) : (A)1) - mean_u - xh * mean_ux));
      }
    }
    row_store<T, V>(gx + row * len, nvec, grp, xr);
    row_move<T, V>(xr, nx);
    row_move<T, V>(gr, ng);
  }
  A* dst = part + (u64)blockIdx.x * len * 2;
  block_partial<T, V, A>(aw, dst, nvec, grp, red);
  block_partial<T, V, A>(ab, dst + len, nvec, grp, red);
}
