// Element-wise map templates: each map in a contiguous vectorised form (16-byte accesses,
// grid-stride) and a strided form over collapsed axes, for one operand (unary maps, casts) or
// two (binary maps).
#pragma once
#include "common.cuh"

// Stores the N results of vector `i` in 16-byte accesses (a warp then writes whole cache
// lines; a widening map's N results take several), or one element at a time when N of them
// do not fill 16 bytes evenly.
template <typename U, int N, typename G>
__device__ __forceinline__ void store_vec(U* __restrict__ out, u64 i, G value) {
  constexpr int C = 16 / sizeof(U) < N ? 16 / sizeof(U) : N;
  if constexpr (C > 0 && N % C == 0) {
#pragma unroll
    for (int c = 0; c < N / C; ++c) {
      Vec<U, C> r;
#pragma unroll
      for (int j = 0; j < C; ++j) r.v[j] = value(c * C + j);
      reinterpret_cast<Vec<U, C>*>(out + i * N)[c] = r;
    }
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) out[i * N + j] = value(j);
  }
}

// Strided maps walk the collapsed axes (`Dims`) in runs: each thread takes up to R consecutive
// elements of the innermost axis, computes every operand's offset once per run (32-bit
// division when the sizes allow), then loads an operand's run as 16-byte vectors when it is
// contiguous and aligned, as one value when it is broadcast, element by element otherwise.
// `body(off, s, cnt, i)`: the K operands' offsets of the run's first element and strides along
// the innermost axis, the run's length, and the run's first row-major element index.
template <int K, int R, typename I, typename Body>
__device__ __forceinline__ void for_runs_as(const Dims& d, u64 n, Body body) {
  const int last = d.ndim - 1;
  const I inner = (I)dims_at(d.shape, last);
  i64 inner_s[K];
#pragma unroll
  for (int k = 0; k < K; ++k) inner_s[k] = dims_at(d.strides[k], last);
  const I per_row = (inner + R - 1) / R;
  const I runs = (I)(n / (u64)inner) * per_row;
  const I step = (I)gridDim.x * blockDim.x;
  for (I r = (I)blockIdx.x * blockDim.x + threadIdx.x; r < runs; r += step) {
    I row = last > 0 ? r / per_row : 0;
    I j0 = (r - row * per_row) * R;
    i64 off[K];
#pragma unroll
    for (int k = 0; k < K; ++k) off[k] = (i64)j0 * inner_s[k];
    I q = row;
#pragma unroll
    for (int a = NV_MAX_DIMS - 2; a >= 0; --a) {
      if (a < last) {
        I s = (I)d.shape[a];
        I nq = q / s;
        I rem = q - nq * s;
#pragma unroll
        for (int k = 0; k < K; ++k) off[k] += (i64)rem * d.strides[k][a];
        q = nq;
      }
    }
    int cnt = inner - j0 < (I)R ? (int)(inner - j0) : R;
    body(off, inner_s, cnt, (u64)row * (u64)inner + (u64)j0);
  }
}

template <int K, int R, typename Body>
__device__ __forceinline__ void for_runs(const Dims& d, u64 n, Body body) {
  u64 inner = (u64)dims_at(d.shape, d.ndim - 1);
  u64 runs = n / inner * ((inner + R - 1) / R);
  if (runs + (u64)gridDim.x * blockDim.x < (1ull << 32)) for_runs_as<K, R, unsigned int>(d, n, body);
  else for_runs_as<K, R, u64>(d, n, body);
}

// Elements per run of a map over operands of these sizes: 32 bytes of the narrowest (two
// 16-byte accesses in flight per operand), at most 8 elements (16 two-byte values converted
// to f32 cost more registers than the extra access gains). Copies and `where`, which do no
// arithmetic, take 32 bytes of any size (CopyRunLen).
template <typename A, typename B> struct RunLen {
  static constexpr int w = 32 / (sizeof(A) < sizeof(B) ? sizeof(A) : sizeof(B));
  static constexpr int v = w < 8 ? w : 8;
};
template <typename T> struct CopyRunLen {
  static constexpr int v = 32 / sizeof(T) < 16 ? 32 / sizeof(T) : 16;
};

template <typename T, int R>
__device__ __forceinline__ void load_run(const T* __restrict__ p, i64 off, i64 s, int cnt, T (&v)[R]) {
  constexpr int C = 16 / sizeof(T) < R ? 16 / sizeof(T) : R;
  if (s == 1 && cnt == R && R % C == 0 && ((unsigned long long)(p + off) % (C * sizeof(T))) == 0) {
#pragma unroll
    for (int c = 0; c < R / C; ++c) {
      Vec<T, C> x = reinterpret_cast<const Vec<T, C>*>(p + off)[c];
#pragma unroll
      for (int j = 0; j < C; ++j) v[c * C + j] = x.v[j];
    }
  } else if (s == 0) {
    T x = p[off];
#pragma unroll
    for (int j = 0; j < R; ++j) v[j] = x;
  } else {
#pragma unroll
    for (int j = 0; j < R; ++j)
      if (j < cnt) v[j] = p[off + j * s];
  }
}

template <typename T, int R>
__device__ __forceinline__ void store_run(T* __restrict__ p, i64 off, i64 s, int cnt, const T (&v)[R]) {
  constexpr int C = 16 / sizeof(T) < R ? 16 / sizeof(T) : R;
  if (s == 1 && cnt == R && R % C == 0 && ((unsigned long long)(p + off) % (C * sizeof(T))) == 0) {
#pragma unroll
    for (int c = 0; c < R / C; ++c) {
      Vec<T, C> x;
#pragma unroll
      for (int j = 0; j < C; ++j) x.v[j] = v[c * C + j];
      reinterpret_cast<Vec<T, C>*>(p + off)[c] = x;
    }
  } else {
#pragma unroll
    for (int j = 0; j < R; ++j)
      if (j < cnt) p[off + j * s] = v[j];
  }
}

// Elements per thread of a contiguous one-operand map: a 16-byte vector of the input, but no
// more than 32 bytes of results (unary.rs's `contig_elems` says the same).
template <typename T, typename U> __host__ __device__ constexpr int contig_elems() {
  constexpr int in = 16 / sizeof(T) > 0 ? 16 / sizeof(T) : 1;
  constexpr int out = 32 / sizeof(U) > 0 ? 32 / sizeof(U) : 1;
  return in < out ? in : out;
}

// Contiguous: `n` elements, 16-byte vectors when all pointers are aligned (checked by the host).
template <typename T, typename U, typename F>
__device__ __forceinline__ void unary_contig(const T* __restrict__ x, U* __restrict__ out, u64 n, F f) {
  const int N = contig_elems<T, U>();
  u64 stride = (u64)gridDim.x * blockDim.x;
  u64 nvec = n / N;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < nvec; i += stride) {
    Vec<T, N> v = reinterpret_cast<const Vec<T, N>*>(x)[i];
    store_vec<U, N>(out, i, [&](int j) { return f(v.v[j]); });
  }
  for (u64 i = nvec * N + (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) out[i] = f(x[i]);
}

// `out` row-major, `x` anywhere.
template <typename T, typename U, typename F>
__device__ __forceinline__ void unary_strided(const T* __restrict__ x, U* __restrict__ out, u64 n, Dims d, F f) {
  constexpr int R = RunLen<T, U>::v;
  for_runs<1, R>(d, n, [&](const i64* off, const i64* s, int cnt, u64 i) {
    T v[R];
    U r[R];
    load_run<T, R>(x, off[0], s[0], cnt, v);
#pragma unroll
    for (int j = 0; j < R; ++j) r[j] = f(v[j]);
    store_run<U, R>(out, (i64)i, 1, cnt, r);
  });
}

// mode 0: both dense; 1: a scalar; 2: b scalar.
template <typename T, typename U, typename F>
__device__ __forceinline__ void binary_contig(const T* __restrict__ a, const T* __restrict__ b, U* __restrict__ out,
                                              u64 n, int mode, F f) {
  const int N = 16 / sizeof(T) > 0 ? 16 / sizeof(T) : 1;
  u64 stride = (u64)gridDim.x * blockDim.x;
  u64 nvec = n / N;
  const T sa = mode == 1 ? a[0] : T();
  const T sb = mode == 2 ? b[0] : T();
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < nvec; i += stride) {
    Vec<T, N> va, vb;
    if (mode != 1) va = reinterpret_cast<const Vec<T, N>*>(a)[i];
    if (mode != 2) vb = reinterpret_cast<const Vec<T, N>*>(b)[i];
    store_vec<U, N>(out, i, [&](int j) { return f(mode == 1 ? sa : va.v[j], mode == 2 ? sb : vb.v[j]); });
  }
  for (u64 i = nvec * N + (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = f(mode == 1 ? sa : a[i], mode == 2 ? sb : b[i]);
}

// `out` row-major, `a` and `b` anywhere (broadcast included).
template <typename T, typename U, typename F>
__device__ __forceinline__ void binary_strided(const T* __restrict__ a, const T* __restrict__ b, U* __restrict__ out,
                                               u64 n, Dims d, F f) {
  constexpr int R = RunLen<T, U>::v;
  for_runs<2, R>(d, n, [&](const i64* off, const i64* s, int cnt, u64 i) {
    T va[R], vb[R];
    U r[R];
    load_run<T, R>(a, off[0], s[0], cnt, va);
    load_run<T, R>(b, off[1], s[1], cnt, vb);
#pragma unroll
    for (int j = 0; j < R; ++j) r[j] = f(va[j], vb[j]);
    store_run<U, R>(out, (i64)i, 1, cnt, r);
  });
}

// Binary maps of a widened pair (a half-precision operand beside a float32 one): each operand
// is widened to float as it is loaded, in registers. Contiguous: 4 elements per step (one
// 16-byte vector of the float operand, 8 bytes of the half one); mode as binary_contig's.
template <typename TA, typename TB, typename U, typename F>
__device__ __forceinline__ void binary_widened_contig(const TA* __restrict__ a, const TB* __restrict__ b,
                                                      U* __restrict__ out, u64 n, int mode, F f) {
  constexpr int N = 4;
  u64 stride = (u64)gridDim.x * blockDim.x;
  u64 nvec = n / N;
  const float sa = mode == 1 ? widen(a[0]) : 0.0f;
  const float sb = mode == 2 ? widen(b[0]) : 0.0f;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < nvec; i += stride) {
    Vec<TA, N> va;
    Vec<TB, N> vb;
    if (mode != 1) va = reinterpret_cast<const Vec<TA, N>*>(a)[i];
    if (mode != 2) vb = reinterpret_cast<const Vec<TB, N>*>(b)[i];
    store_vec<U, N>(out, i, [&](int j) {
      return f(mode == 1 ? sa : (float)widen(va.v[j]), mode == 2 ? sb : (float)widen(vb.v[j]));
    });
  }
  for (u64 i = nvec * N + (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = f(mode == 1 ? sa : (float)widen(a[i]), mode == 2 ? sb : (float)widen(b[i]));
}

// `out` row-major, `a` and `b` anywhere.
template <typename TA, typename TB, typename U, typename F>
__device__ __forceinline__ void binary_widened_strided(const TA* __restrict__ a, const TB* __restrict__ b,
                                                       U* __restrict__ out, u64 n, Dims d, F f) {
  constexpr int R = RunLen<TA, TB>::v;
  for_runs<2, R>(d, n, [&](const i64* off, const i64* s, int cnt, u64 i) {
    TA va[R];
    TB vb[R];
    U r[R];
    load_run<TA, R>(a, off[0], s[0], cnt, va);
    load_run<TB, R>(b, off[1], s[1], cnt, vb);
#pragma unroll
    for (int j = 0; j < R; ++j) r[j] = f((float)widen(va[j]), (float)widen(vb[j]));
    store_run<U, R>(out, (i64)i, 1, cnt, r);
  });
}
