// Scans (cumulative sums, products, extrema and log-add-exp) along contiguous lines.
#pragma once
#include "reduce.cuh"

// Inclusive or exclusive scan of contiguous lines of `len`, one block per line. OP: 0 sum,
// 1 prod, 2 max, 3 min, 6 logaddexp.
template <typename T, int OP> struct ScanOp {
  typedef typename Acc<T>::type A;
  __device__ static A identity() {
    if constexpr (OP == 6) return -(A)INFINITY;
    else return Red<T, OP>::init();
  }
  __device__ static A op(A a, A b) {
    if constexpr (OP == 6) return logaddexp_(a, b);
    else return Red<T, OP>::merge(a, b);
  }
};
template <int OP> struct ScanOp<bool, OP> {
  typedef bool A;
  __device__ static bool identity() { return Red<bool, OP>::init(); }
  __device__ static bool op(bool a, bool b) { return Red<bool, OP>::merge(a, b); }
};

template <typename T, int OP>
__device__ __forceinline__ void scan_lines(const T* __restrict__ x, T* __restrict__ out, u64 lines, u64 len,
                                           bool reverse, bool inclusive) {
  typedef ScanOp<T, OP> S;
  typedef typename S::A A;
  const int K = 8;
  __shared__ A warp_tot[32];
  __shared__ A carry_s;
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (u64 line = blockIdx.x; line < lines; line += gridDim.x) {
    const T* p = x + line * len;
    T* q = out + line * len;
    A carry = S::identity();
    for (u64 tile = 0; tile < len; tile += (u64)blockDim.x * K) {
      A v[K];
      A local = S::identity();
#pragma unroll
      for (int k = 0; k < K; ++k) {
        u64 i = tile + (u64)threadIdx.x * K + k;
        u64 src = reverse ? len - 1 - i : i;
        v[k] = i < len ? widen(p[src]) : S::identity();
        local = S::op(local, v[k]);
      }
      // Exclusive scan of the thread totals across the block.
      A incl = local;
      for (int o = 1; o < 32; o <<= 1) {
        A y = shfl_up_any(incl, o);
        if (lane >= o) incl = S::op(y, incl);
      }
      if (lane == 31) warp_tot[warp] = incl;
      __syncthreads();
      if (warp == 0) {
        A w = lane < nw ? warp_tot[lane] : S::identity();
        for (int o = 1; o < 32; o <<= 1) {
          A y = shfl_up_any(w, o);
          if (lane >= o) w = S::op(y, w);
        }
        if (lane < nw) warp_tot[lane] = w;
      }
      __syncthreads();
      A before_warp = warp > 0 ? warp_tot[warp - 1] : S::identity();
      A excl_in_warp = shfl_up_any(incl, 1);
      if (lane == 0) excl_in_warp = S::identity();
      A run = S::op(carry, S::op(before_warp, excl_in_warp));
#pragma unroll
      for (int k = 0; k < K; ++k) {
        u64 i = tile + (u64)threadIdx.x * K + k;
        A next = S::op(run, v[k]);
        if (i < len) {
          u64 dst = reverse ? len - 1 - i : i;
          q[dst] = narrow<T>(inclusive ? next : run);
        }
        run = next;
      }
      if (threadIdx.x == 0) carry_s = S::op(carry, warp_tot[nw - 1]);
      __syncthreads();
      carry = carry_s;
      __syncthreads();
    }
  }
}
