// Reductions and arg-reductions. Half-precision sums and products accumulate in f32.
#pragma once
#include "arith.cuh"

// Reducer: identity, step, merge and finish. OP: 0 sum, 1 prod, 2 max, 3 min, 4 and, 5 or.
template <typename T, int OP> struct Red {
  typedef typename Acc<T>::type A;
  __device__ static A init() {
    if constexpr (OP == 0) return widen(Make0<T>::zero());
    else if constexpr (OP == 1) return widen(Make0<T>::one());
    else if constexpr (OP == 2) return widen(Make0<T>::lowest());
    else return widen(Make0<T>::highest());
  }
  __device__ static A step(A a, T x) { return merge(a, widen(x)); }
  __device__ static A merge(A a, A b) {
    if constexpr (OP == 0) return Ops<A>::add(a, b);
    else if constexpr (OP == 1) return Ops<A>::mul(a, b);
    else if constexpr (OP == 2) return Ops<A>::max(a, b);
    else return Ops<A>::min(a, b);
  }
  __device__ static T finish(A a) { return narrow<T>(a); }
};
template <int OP> struct Red<bool, OP> {
  typedef bool A;
  __device__ static bool init() { return OP == 1 || OP == 3 || OP == 4; }
  __device__ static bool step(bool a, bool x) { return merge(a, x); }
  __device__ static bool merge(bool a, bool b) { return (OP == 1 || OP == 3 || OP == 4) ? (a && b) : (a || b); }
  __device__ static bool finish(bool a) { return a; }
};

template <typename A> __device__ __forceinline__ A shfl_xor_any(A v, int o) {
  if constexpr (sizeof(A) == 1) {
    return (A)__shfl_xor_sync(0xffffffffu, (int)v, o);
  } else if constexpr (sizeof(A) == 8) {
    u64 bits;
    memcpy(&bits, &v, 8);
    bits = __shfl_xor_sync(0xffffffffu, bits, o);
    A r;
    memcpy(&r, &bits, 8);
    return r;
  } else if constexpr (sizeof(A) == 2) {
    unsigned short bits;
    memcpy(&bits, &v, 2);
    bits = (unsigned short)__shfl_xor_sync(0xffffffffu, (unsigned)bits, o);
    A r;
    memcpy(&r, &bits, 2);
    return r;
  } else {
    u32 bits;
    memcpy(&bits, &v, 4);
    bits = __shfl_xor_sync(0xffffffffu, bits, o);
    A r;
    memcpy(&r, &bits, 4);
    return r;
  }
}
template <typename A> __device__ __forceinline__ A shfl_up_any(A v, int o) {
  if constexpr (sizeof(A) == 8) {
    u64 bits;
    memcpy(&bits, &v, 8);
    bits = __shfl_up_sync(0xffffffffu, bits, o);
    A r;
    memcpy(&r, &bits, 8);
    return r;
  } else {
    u32 bits = 0;
    memcpy(&bits, &v, sizeof(A));
    bits = __shfl_up_sync(0xffffffffu, bits, o);
    A r;
    memcpy(&r, &bits, sizeof(A));
    return r;
  }
}

// Block-wide merge of one value per thread; the result is valid in thread 0.
template <typename T, int OP>
__device__ __forceinline__ typename Red<T, OP>::A block_merge(typename Red<T, OP>::A v) {
  typedef Red<T, OP> R;
  typedef typename R::A A;
  __shared__ A warp_vals[32];
  for (int o = 16; o > 0; o >>= 1) v = R::merge(v, shfl_xor_any(v, o));
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (blockDim.x <= 32) return v;
  if (lane == 0) warp_vals[warp] = v;
  __syncthreads();
  int nw = (blockDim.x + 31) >> 5;
  v = lane < nw ? warp_vals[lane] : R::init();
  if (warp == 0)
    for (int o = 16; o > 0; o >>= 1) v = R::merge(v, shfl_xor_any(v, o));
  __syncthreads();
  return v;
}

// Each block reduces segment `seg` of row `row`: rows of `len` contiguous elements start at
// offset_of(d, 0, row). `segs` segments per row; partials[row * segs + seg] gets the result
// (or out[row] directly when segs == 1).
template <typename T, int OP>
__device__ __forceinline__ void reduce_rows(const T* __restrict__ x, typename Red<T, OP>::A* __restrict__ partials,
                                            T* __restrict__ out, u64 rows, u64 len, u64 segs, Dims d) {
  typedef Red<T, OP> R;
  typedef typename R::A A;
  const int N = 16 / sizeof(T);
  u64 seg_len = (len + segs - 1) / segs;
  seg_len = (seg_len + N - 1) / N * N;
  for (u64 job = blockIdx.x; job < rows * segs; job += gridDim.x) {
    u64 row = job / segs, seg = job % segs;
    const T* p = x + offset_of(d, 0, row);
    u64 lo = seg * seg_len, hi = lo + seg_len < len ? lo + seg_len : len;
    A acc = R::init();
    if (lo < hi) {
      const T* q = p + lo;
      u64 n = hi - lo;
      if (((unsigned long long)q % 16) == 0) {
        u64 nv = n / N;
        const Vec<T, N>* qv = reinterpret_cast<const Vec<T, N>*>(q);
        // Two vectors in flight per thread, into two accumulators.
        A acc2 = R::init();
        u64 i = threadIdx.x;
        for (; i + blockDim.x < nv; i += 2 * blockDim.x) {
          Vec<T, N> v = qv[i], w = qv[i + blockDim.x];
#pragma unroll
          for (int j = 0; j < N; ++j) {
            acc = R::step(acc, v.v[j]);
            acc2 = R::step(acc2, w.v[j]);
          }
        }
        if (i < nv) {
          Vec<T, N> v = qv[i];
#pragma unroll
          for (int j = 0; j < N; ++j) acc = R::step(acc, v.v[j]);
        }
        acc = R::merge(acc, acc2);
        for (u64 i = nv * N + threadIdx.x; i < n; i += blockDim.x) acc = R::step(acc, q[i]);
      } else {
        for (u64 i = threadIdx.x; i < n; i += blockDim.x) acc = R::step(acc, q[i]);
      }
    }
    acc = block_merge<T, OP>(acc);
    if (threadIdx.x == 0) {
      if (segs == 1) out[row] = R::finish(acc);
      else partials[job] = acc;
    }
  }
}

// Rows up to a few ten thousand elements: one warp per row, 16-byte loads when the row is
// aligned.
template <typename T, int OP>
__device__ __forceinline__ void reduce_rows_warp(const T* __restrict__ x, T* __restrict__ out, u64 rows, u64 len,
                                                 Dims d) {
  typedef Red<T, OP> R;
  typedef typename R::A A;
  const int N = 16 / sizeof(T);
  int lane = threadIdx.x & 31;
  u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
  for (u64 row = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5; row < rows; row += warps) {
    const T* p = x + offset_of(d, 0, row);
    A acc = R::init();
    u64 start = 0;
    if (((unsigned long long)p % 16) == 0) {
      u64 nv = len / N;
#pragma unroll 4
      for (u64 i = lane; i < nv; i += 32) {
        Vec<T, N> v = reinterpret_cast<const Vec<T, N>*>(p)[i];
#pragma unroll
        for (int j = 0; j < N; ++j) acc = R::step(acc, v.v[j]);
      }
      start = nv * N;
    }
    for (u64 i = start + lane; i < len; i += 32) acc = R::step(acc, p[i]);
    for (int o = 16; o > 0; o >>= 1) acc = R::merge(acc, shfl_xor_any(acc, o));
    if (lane == 0) out[row] = R::finish(acc);
  }
}

// Merges `segs` partials per row.
template <typename T, int OP>
__device__ __forceinline__ void reduce_finish(const typename Red<T, OP>::A* __restrict__ partials, T* __restrict__ out,
                                              u64 rows, u64 segs) {
  typedef Red<T, OP> R;
  typedef typename R::A A;
  for (u64 row = blockIdx.x; row < rows; row += gridDim.x) {
    A acc = R::init();
    for (u64 i = threadIdx.x; i < segs; i += blockDim.x) acc = R::merge(acc, partials[row * segs + i]);
    acc = block_merge<T, OP>(acc);
    if (threadIdx.x == 0) out[row] = R::finish(acc);
  }
}

// Column reduction: outputs are `cols` contiguous elements; element (r, j) of the input is at
// offset_of(d, 0, r) + j. Block (bx, by) handles columns bx*blockDim.. and slice `by` of the
// reduced positions; `segs` slices write partials[seg * cols + j].
template <typename T, int OP>
__device__ __forceinline__ void reduce_cols(const T* __restrict__ x, typename Red<T, OP>::A* __restrict__ partials,
                                            T* __restrict__ out, u64 cols, u64 red, u64 segs, Dims d) {
  typedef Red<T, OP> R;
  typedef typename R::A A;
  u64 j = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  u64 seg = blockIdx.y;
  u64 per = (red + segs - 1) / segs;
  u64 lo = seg * per, hi = lo + per < red ? lo + per : red;
  A acc = R::init();
  if (d.ndim == 1) {
    // One reduced axis: step a pointer, four independent loads in flight.
    const i64 s = d.strides[0][0];
    const T* p = x + (i64)lo * s + j;
    A a1 = R::init(), a2 = R::init(), a3 = R::init();
    u64 r = lo;
    for (; r + 4 <= hi; r += 4, p += 4 * s) {
      acc = R::step(acc, p[0]);
      a1 = R::step(a1, p[s]);
      a2 = R::step(a2, p[2 * s]);
      a3 = R::step(a3, p[3 * s]);
    }
    for (; r < hi; ++r, p += s) acc = R::step(acc, p[0]);
    acc = R::merge(R::merge(acc, a1), R::merge(a2, a3));
  } else {
    for (u64 r = lo; r < hi; ++r) acc = R::step(acc, x[offset_of(d, 0, r) + j]);
  }
  if (segs == 1) out[j] = R::finish(acc);
  else partials[seg * cols + j] = acc;
}

// reduce_cols for elements narrower than 4 bytes over one strided axis: each thread takes
// V = 4 / sizeof(T) adjacent columns in one 4-byte load (a warp then reads 128 bytes of a
// row), two rows in flight. The host checks that columns, stride and pointer allow it.
template <typename T, int OP>
__device__ __forceinline__ void reduce_cols_vec(const T* __restrict__ x, typename Red<T, OP>::A* __restrict__ partials,
                                                T* __restrict__ out, u64 cols, u64 red, u64 segs, i64 s) {
  typedef Red<T, OP> R;
  typedef typename R::A A;
  constexpr int V = 4 / sizeof(T);
  u64 j = ((u64)blockIdx.x * blockDim.x + threadIdx.x) * V;
  if (j >= cols) return;
  u64 seg = blockIdx.y;
  u64 per = (red + segs - 1) / segs;
  u64 lo = seg * per, hi = lo + per < red ? lo + per : red;
  A acc[V], acc2[V];
#pragma unroll
  for (int k = 0; k < V; ++k) acc[k] = acc2[k] = R::init();
  const T* p = x + (i64)lo * s + j;
  u64 r = lo;
  for (; r + 2 <= hi; r += 2, p += 2 * s) {
    Vec<T, V> v = *reinterpret_cast<const Vec<T, V>*>(p), w = *reinterpret_cast<const Vec<T, V>*>(p + s);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      acc[k] = R::step(acc[k], v.v[k]);
      acc2[k] = R::step(acc2[k], w.v[k]);
    }
  }
  if (r < hi) {
    Vec<T, V> v = *reinterpret_cast<const Vec<T, V>*>(p);
#pragma unroll
    for (int k = 0; k < V; ++k) acc[k] = R::step(acc[k], v.v[k]);
  }
#pragma unroll
  for (int k = 0; k < V; ++k) {
    A a = R::merge(acc[k], acc2[k]);
    if (segs == 1) out[j + k] = R::finish(a);
    else partials[seg * cols + j + k] = a;
  }
}

template <typename T, int OP>
__device__ __forceinline__ void reduce_cols_finish(const typename Red<T, OP>::A* __restrict__ partials,
                                                   T* __restrict__ out, u64 cols, u64 segs) {
  typedef Red<T, OP> R;
  u64 j = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  typename R::A acc = R::init();
  for (u64 s = 0; s < segs; ++s) acc = R::merge(acc, partials[s * cols + j]);
  out[j] = R::finish(acc);
}

// Anything else: one thread per output; `kept` maps outputs to offsets, `red` the reduced
// positions.
template <typename T, int OP>
__device__ __forceinline__ void reduce_general(const T* __restrict__ x, T* __restrict__ out, u64 n_out, u64 n_red,
                                               Dims kept, Dims red) {
  typedef Red<T, OP> R;
  u64 stride = (u64)gridDim.x * blockDim.x;
  for (u64 o = (u64)blockIdx.x * blockDim.x + threadIdx.x; o < n_out; o += stride) {
    const T* p = x + offset_of(kept, 0, o);
    typename R::A acc = R::init();
    for (u64 r = 0; r < n_red; ++r) acc = R::step(acc, p[offset_of(red, 0, r)]);
    out[o] = R::finish(acc);
  }
}

// Index of the first maximum (ARGMAX) or minimum along a line; NaN counts as the extreme.
// One warp per output line; the line of output o starts at offset_of(d, 0, o).
template <typename T, bool ARGMAX>
__device__ __forceinline__ void arg_reduce(const T* __restrict__ x, u32* __restrict__ out, u64 n_out, u64 len,
                                           i64 axis_stride, Dims d) {
  typedef typename Acc<T>::type A;
  int lane = threadIdx.x & 31;
  u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
  for (u64 o = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5; o < n_out; o += warps) {
    const T* p = x + offset_of(d, 0, o);
    bool have = false;
    A best = A();
    u64 at = 0;
#pragma unroll 4
    for (u64 i = lane; i < len; i += 32) {
      A v = widen(p[(i64)i * axis_stride]);
      bool nan_v = !(v == v), nan_b = have && !(best == best);
      bool better = !have || (!nan_b && (nan_v || (ARGMAX ? Ops<A>::lt(best, v) : Ops<A>::lt(v, best))));
      if (better) {
        best = v;
        at = i;
        have = true;
      }
    }
    // Merge lanes: prefer NaN, then the extreme, then the smaller index.
    for (int off = 16; off > 0; off >>= 1) {
      A ov = shfl_xor_any(best, off);
      u64 oat = __shfl_xor_sync(0xffffffffu, at, off);
      bool ohave = __shfl_xor_sync(0xffffffffu, (int)have, off);
      if (!ohave) continue;
      bool nan_o = !(ov == ov), nan_b = have && !(best == best);
      bool take;
      if (!have) take = true;
      else if (nan_o != nan_b) take = nan_o;
      else if (nan_o) take = oat < at;
      else if (ARGMAX ? Ops<A>::lt(best, ov) : Ops<A>::lt(ov, best)) take = true;
      else if (ARGMAX ? Ops<A>::lt(ov, best) : Ops<A>::lt(best, ov)) take = false;
      else take = oat < at;
      if (take) {
        best = ov;
        at = oat;
        have = true;
      }
    }
    if (lane == 0) out[o] = (u32)at;
  }
}

// Whether candidate (v, i) replaces (best, at): NaN first, then the extreme, then the smaller
// index. `have` is false until the first candidate.
template <typename A, bool ARGMAX>
__device__ __forceinline__ bool arg_takes(A best, u32 at, bool have, A v, u32 i) {
  if (!have) return true;
  bool nan_v = !(v == v), nan_b = !(best == best);
  if (nan_v != nan_b) return nan_v;
  if (nan_v) return i < at;
  if (ARGMAX ? Ops<A>::lt(best, v) : Ops<A>::lt(v, best)) return true;
  if (ARGMAX ? Ops<A>::lt(v, best) : Ops<A>::lt(best, v)) return false;
  return i < at;
}

// Merges a warp's candidates into every lane (arg_takes's order).
template <typename A, bool ARGMAX>
__device__ __forceinline__ void arg_warp_merge(A& best, u32& at, bool& have) {
  for (int off = 16; off > 0; off >>= 1) {
    A ov = shfl_xor_any(best, off);
    u32 oat = __shfl_xor_sync(0xffffffffu, at, off);
    bool ohave = __shfl_xor_sync(0xffffffffu, (int)have, off);
    if (ohave && arg_takes<A, ARGMAX>(best, at, have, ov, oat)) {
      best = ov;
      at = oat;
      have = true;
    }
  }
}

// arg_reduce over contiguous, 16-byte aligned rows of `len` elements (a multiple of the
// vector; rows `ld` elements apart), one block per row and segment (blockIdx.y of segs): the
// block reads its part of the row in 16-byte vectors, each thread keeps its first extreme,
// then warps and the block merge. With segs > 1 each block leaves its pair in part_v/part_i
// (segment-major, as arg_reduce_cols does) for arg_reduce_cols_finish: a few long rows (a
// decode step's logits) then spread over the GPU instead of one SM.
template <typename T, bool ARGMAX>
__device__ __forceinline__ void arg_reduce_rows(const T* __restrict__ x, u32* __restrict__ out,
                                                typename Acc<T>::type* __restrict__ part_v, u32* __restrict__ part_i,
                                                u64 n_out, u32 len, u64 ld, u32 segs) {
  typedef typename Acc<T>::type A;
  constexpr int N = 16 / sizeof(T);
  __shared__ A s_best[32];
  __shared__ u32 s_at[32];
  __shared__ bool s_have[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const u32 nvec = len / N, per = (nvec + segs - 1) / segs, seg = blockIdx.y;
  const u32 lo = seg * per, hi = min(nvec, lo + per);
  for (u64 o = blockIdx.x; o < n_out; o += gridDim.x) {
    const Vec<T, N>* p = reinterpret_cast<const Vec<T, N>*>(x + o * ld);
    A best = A();
    u32 at = 0;
    bool have = false;
#pragma unroll 2
    for (u32 i = lo + threadIdx.x; i < hi; i += blockDim.x) {
      Vec<T, N> v = p[i];
#pragma unroll
      for (int j = 0; j < N; ++j) {
        A e = widen(v.v[j]);
        // Within a thread indices grow, so ties keep the earlier one without comparing them.
        bool nan_e = !(e == e), nan_b = have && !(best == best);
        if (!have || (!nan_b && (nan_e || (ARGMAX ? Ops<A>::lt(best, e) : Ops<A>::lt(e, best))))) {
          best = e;
          at = i * N + j;
          have = true;
        }
      }
    }
    arg_warp_merge<A, ARGMAX>(best, at, have);
    if (lane == 0) {
      s_best[warp] = best;
      s_at[warp] = at;
      s_have[warp] = have;
    }
    __syncthreads();
    if (warp == 0) {
      const int warps = blockDim.x >> 5;
      have = lane < warps && s_have[lane];
      best = have ? s_best[lane] : A();
      at = have ? s_at[lane] : 0;
      arg_warp_merge<A, ARGMAX>(best, at, have);
      if (lane == 0 && segs == 1) out[o] = at;
      if (lane == 0 && segs > 1) {
        part_v[(u64)seg * n_out + o] = best;
        part_i[(u64)seg * n_out + o] = have ? at : 0xffffffffu;
      }
    }
    __syncthreads();
  }
}

// Column form of arg_reduce: the outputs are consecutive (stride 1) and the reduced axis is
// strided, so one thread per output and segment of the axis reads whole rows across a warp.
// With segs > 1 each segment leaves a (value, index) pair, index ~0 for none, and
// arg_reduce_cols_finish merges them in segment order (the first extreme or NaN wins).
template <typename T, bool ARGMAX>
__device__ __forceinline__ bool arg_better(typename Acc<T>::type best, bool have, typename Acc<T>::type v) {
  typedef typename Acc<T>::type A;
  bool nan_v = !(v == v), nan_b = have && !(best == best);
  return !have || (!nan_b && (nan_v || (ARGMAX ? Ops<A>::lt(best, v) : Ops<A>::lt(v, best))));
}

template <typename T, bool ARGMAX>
__device__ __forceinline__ void arg_reduce_cols(const T* __restrict__ x, u32* __restrict__ out,
                                                typename Acc<T>::type* __restrict__ part_v, u32* __restrict__ part_i,
                                                u64 cols, u64 len, i64 axis_stride, u64 segs) {
  typedef typename Acc<T>::type A;
  u64 j = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  u64 seg = blockIdx.y;
  u64 per = (len + segs - 1) / segs;
  u64 lo = seg * per, hi = lo + per < len ? lo + per : len;
  const T* p = x + j + (i64)lo * axis_stride;
  bool have = false;
  A best = A();
  u32 at = 0xffffffffu;
#pragma unroll 4
  for (u64 i = lo; i < hi; ++i) {
    A v = widen(p[(i64)(i - lo) * axis_stride]);
    if (arg_better<T, ARGMAX>(best, have, v)) {
      best = v;
      at = (u32)i;
      have = true;
    }
  }
  if (segs == 1) {
    out[j] = at;
  } else {
    part_v[seg * cols + j] = best;
    part_i[seg * cols + j] = at;
  }
}

template <typename T, bool ARGMAX>
__device__ __forceinline__ void arg_reduce_cols_finish(const typename Acc<T>::type* __restrict__ part_v,
                                                       const u32* __restrict__ part_i, u32* __restrict__ out, u64 cols,
                                                       u64 segs) {
  typedef typename Acc<T>::type A;
  u64 j = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  bool have = false;
  A best = A();
  u32 at = 0;
  for (u64 s = 0; s < segs; ++s) {
    u32 i = part_i[s * cols + j];
    if (i == 0xffffffffu) continue;
    A v = part_v[s * cols + j];
    if (arg_better<T, ARGMAX>(best, have, v)) {
      best = v;
      at = i;
      have = true;
    }
  }
  out[j] = at;
}
