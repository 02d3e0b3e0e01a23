// Cross entropy over contiguous rows of logits: the loss logsumexp(row) − row[t] (0 for t < 0,
// NaN for t ≥ len) and its derivative g·(softmax(row) − onehot(t)) (zero for rows whose target is
// out of range). Statistics in f32 (f64 for double logits).
//
// Three kernels: the loss alone; the derivative given the loss (which gives the log-sum-exp
// back as loss + row[t], so one read of the row and one write); and both at once when an
// evaluation wants both (fast/cross_entropy.rs pairs them), which reads each row once: a cluster of blocks
// shares a row, each block keeping its slice in registers while the cluster agrees on the
// statistics, then writing the slice's gradient.
#pragma once
#include "norm.cuh"

template <typename T>
__device__ __forceinline__ typename Acc<T>::type row_lse(const T* __restrict__ p, u64 len) {
  auto ms = row_max_sum_block(p, len);
  if (isinf(ms.m) || ms.m != ms.m) return ms.m;
  return log(ms.s) + ms.m;
}

template <typename T>
__device__ __forceinline__ void cross_entropy_rows(const T* __restrict__ x, const i32* __restrict__ t,
                                                   typename Acc<T>::type* __restrict__ loss, u64 rows, u64 len) {
  typedef typename Acc<T>::type A;
  for (u64 row = blockIdx.x; row < rows; row += gridDim.x) {
    i32 target = t[row];
    if (target < 0) {
      if (threadIdx.x == 0) loss[row] = 0;
      continue;  // uniform across the block: no barrier is skipped by some threads only
    }
    A lse = row_lse(x + row * len, len);
    if (threadIdx.x == 0) loss[row] = (u64)target < len ? lse - widen(x[row * len + target]) : (A)NAN;
  }
}

// One pass over the logits: the row's log-sum-exp is the loss plus the target's logit.
template <typename T>
__device__ __forceinline__ void cross_entropy_vjp_rows(const T* __restrict__ x, const i32* __restrict__ t,
                                                       const typename Acc<T>::type* __restrict__ g,
                                                       const typename Acc<T>::type* __restrict__ loss,
                                                       T* __restrict__ dx, u64 rows, u64 len) {
  typedef typename Acc<T>::type A;
  bool vec = rows_vectorisable<T>(len, x, dx, x, x);
  for (u64 row = blockIdx.x; row < rows; row += gridDim.x) {
    i32 target = t[row];
    const T* p = x + row * len;
    T* q = dx + row * len;
    // Rows whose target is out of range (ignored, or past the classes) get no gradient.
    bool counted = target >= 0 && (u64)target < len;
    A gv = counted ? g[row] : (A)0;
    A lse = counted ? loss[row] + widen(p[target]) : (A)0;
    A L = log2e_times(lse);
    for_row<T>(len, vec, [&](auto W, u64 v, int) {
      NV_PIECE;
      A a[M];
      T d[M];
      load<T, M>(p, v, a);
#pragma unroll
      for (int j = 0; j < M; ++j) {
        A e = counted ? exp_shifted(a[j], lse, L) : (A)0;
        d[j] = narrow<T>((e - (v * M + j == (u64)target ? (A)1 : (A)0)) * gv);
      }
      store<T, M>(q, v, d);
    });
  }
}

// ---- The loss and its gradient in one read of the row (sm_90: thread-block clusters).
//
// The C blocks of a cluster (C = gridDim's cluster size, at most 8) take one row at a time,
// block r the vectors [r·slice, (r+1)·slice): each thread loads at most U vectors (8 or 10:
// fast/cross_entropy.rs), keeps them in registers, and the block reduces their (max, sum of exp). The blocks publish
// their pair in shared memory, meet at one cluster barrier, and every block merges all C pairs
// (read through distributed shared memory, in rank order so every block gets the same bits);
// then each thread writes the gradient of the vectors it holds. So slice ≤ U × threads
// vectors: fast/cross_entropy.rs picks C and the block size, and rows that do not fit take the
// two kernels above. Rows are whole 16-byte vectors at 16-byte aligned addresses.
//
// The published pairs alternate between two slots by row parity: a block writes slot p of row
// i + 2 only after the barrier of row i + 1, which every block reaches after it has read the
// slots of row i.
#if __CUDA_ARCH__ >= 900
__device__ __forceinline__ u32 cluster_rank() {
  u32 r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ u32 cluster_blocks() {
  u32 r;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(r));
  return r;
}
// Every thread of every block of the cluster arrives; shared-memory writes before it are
// visible to the cluster after it.
__device__ __forceinline__ void cluster_barrier() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// The float at `local`'s offset in the shared memory of the cluster's block `rank`.
__device__ __forceinline__ float cluster_load(const float* local, u32 rank) {
  u32 at = (u32)__cvta_generic_to_shared(local), remote;
  float v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(at), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
  return v;
}
#endif

template <typename T, int U>
__device__ __forceinline__ void cross_entropy_fused_rows(const T* __restrict__ x, const i32* __restrict__ t,
                                                         const float* __restrict__ g, float* __restrict__ loss,
                                                         T* __restrict__ dx, u64 rows, u64 len, u64 slice) {
#if __CUDA_ARCH__ >= 900
  constexpr int N = 16 / sizeof(T);
  typedef Vec<T, N> V;
  __shared__ float pm[2], ps[2], pnan[2], wm[32], ws[32], tm, ts;
  const u32 rank = cluster_rank(), C = cluster_blocks();
  const u64 clusters = gridDim.x / C, nv = len / N;
  const u64 v0 = rank * slice, v1 = v0 + slice < nv ? v0 + slice : nv;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  int parity = 0;
  for (u64 row = blockIdx.x / C; row < rows; row += clusters, parity ^= 1) {
    const i32 target = t[row];
    const bool counted = target >= 0 && (u64)target < len;
    const float gv = counted ? g[row] : 0.f;
    const V* p = reinterpret_cast<const V*>(x + row * len);
    V* q = reinterpret_cast<V*>(dx + row * len);
    // The vectors v0 + threadIdx.x + u·blockDim.x; -inf pads past the slice (adds nothing).
    V v[U];
    MaxSum<float> acc{-INFINITY, 0.f};
    if (counted) {
      V pad;
#pragma unroll
      for (int j = 0; j < N; ++j) pad.v[j] = neg_inf<T>();
#pragma unroll
      for (int u = 0; u < U; ++u) {
        u64 i = v0 + threadIdx.x + (u64)u * blockDim.x;
        v[u] = i < v1 ? p[i] : pad;
      }
      ms_push_vecs<T, N, U>(acc, v);
      // As ms_scan: a NaN element left its NaN in the sum; mark the row with a NaN maximum.
      if (acc.s != acc.s && !(acc.m == INFINITY)) acc.m = NAN;
    }
    acc = ms_warp(acc);
    if (lane == 0) {
      wm[warp] = acc.m;
      ws[warp] = acc.s;
    }
    __syncthreads();
    if (warp == 0) {
      MaxSum<float> b = lane < nw ? MaxSum<float>{wm[lane], ws[lane]} : MaxSum<float>{-INFINITY, 0.f};
      b = ms_warp(b);
      if (lane == 0) {
        pm[parity] = b.m;
        ps[parity] = b.s;
      }
    }
    cluster_barrier();  // also orders wm/ws: the next row writes them only after this
    // Lane r of warp 0 fetches block r's pair; lane 0's merge is the same in every block.
    if (warp == 0) {
      MaxSum<float> b{-INFINITY, 0.f};
      if (lane < C) b = MaxSum<float>{cluster_load(&pm[parity], lane), cluster_load(&ps[parity], lane)};
      b = ms_warp(b);
      if (lane == 0) {
        tm = b.m;
        ts = b.s;
      }
    }
    __syncthreads();
    MaxSum<float> tot{tm, ts};
    if (tot.m == INFINITY) {
      // A +inf maximum made the sums NaN whether or not a NaN was there: look (rare, and the same
      // decision in every block of the cluster, so the second barrier is uniform).
      bool nan = __syncthreads_or(counted && vecs_have_nan(v));
      if (threadIdx.x == 0) pnan[parity] = nan ? 1.f : 0.f;
      cluster_barrier();
      nan = __any_sync(0xffffffffu, lane < C && cluster_load(&pnan[parity], lane) != 0.f);
      if (nan) tot.m = NAN;
    }
    const float lse = (isinf(tot.m) || tot.m != tot.m) ? tot.m : logf(tot.s) + tot.m;
    if (rank == 0 && threadIdx.x == 0) loss[row] = target < 0 ? 0.f : counted ? lse - widen(x[row * len + target]) : NAN;
    const float L = log2e_times(lse);
    // The target's vector (none when the row does not count) takes the one-hot term.
    const u64 tv = counted ? (u64)target / N : ~0ull;
    const int tj = (int)((u64)target % N);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      u64 i = v0 + threadIdx.x + (u64)u * blockDim.x;
      if (i >= v1) break;
      float e[N];
      if (counted) {
        widen_vec(v[u], e);
#pragma unroll
        for (int j = 0; j < N; ++j) {
          e[j] = exp_shifted(e[j], lse, L);
        }
        if (i == tv) {
#pragma unroll
          for (int j = 0; j < N; ++j) e[j] -= j == tj ? 1.f : 0.f;
        }
      } else {
#pragma unroll
        for (int j = 0; j < N; ++j) e[j] = 0.f;
      }
      V d;
#pragma unroll
      for (int j = 0; j < N; ++j) d.v[j] = narrow<T>(e[j] * gv);
      q[i] = d;
    }
  }
  // No block may leave while another can still read its shared memory.
  cluster_barrier();
#else
  __trap();  // fast/cross_entropy.rs launches it on sm_90 and later only
#endif
}
