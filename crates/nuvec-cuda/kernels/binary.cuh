// Binary maps (`Bin_*` functors over `Ops<T>`, instantiated by binary.rs) and `where`.
#pragma once
#include "arith.cuh"
#include "map.cuh"

// Functor types the kernels take.
#define NV_BIN_SAME(NAME, EXPR) \
  struct Bin_##NAME { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return EXPR; } };
#define NV_BIN_BOOL(NAME, EXPR) \
  struct Bin_##NAME { template <typename T> __device__ __forceinline__ bool operator()(T a, T b) const { return EXPR; } };
NV_BIN_SAME(add, Ops<T>::add(a, b))
NV_BIN_SAME(subtract, Ops<T>::sub(a, b))
NV_BIN_SAME(multiply, Ops<T>::mul(a, b))
NV_BIN_SAME(divide, Ops<T>::div(a, b))
NV_BIN_SAME(floor_divide, Ops<T>::floordiv(a, b))
NV_BIN_SAME(remainder, Ops<T>::rem(a, b))
NV_BIN_SAME(power, Ops<T>::pow(a, b))
NV_BIN_SAME(maximum, Ops<T>::max(a, b))
NV_BIN_SAME(minimum, Ops<T>::min(a, b))
NV_BIN_SAME(logaddexp, Ops<T>::logaddexp(a, b))
NV_BIN_SAME(arctan2, Ops<T>::atan2(a, b))
NV_BIN_BOOL(equal, Ops<T>::eq(a, b))
NV_BIN_BOOL(not_equal, !Ops<T>::eq(a, b))
NV_BIN_BOOL(less, Ops<T>::lt(a, b))
NV_BIN_BOOL(less_equal, Ops<T>::le(a, b))
NV_BIN_BOOL(greater, Ops<T>::lt(b, a))
NV_BIN_BOOL(greater_equal, Ops<T>::le(b, a))
NV_BIN_BOOL(logical_and, truthy(a) && truthy(b))
NV_BIN_BOOL(logical_or, truthy(a) || truthy(b))
NV_BIN_SAME(bitwise_and, Ops<T>::band(a, b))
NV_BIN_SAME(bitwise_or, Ops<T>::bor(a, b))
NV_BIN_SAME(bitwise_xor, Ops<T>::bxor(a, b))
NV_BIN_SAME(left_shift, Ops<T>::shl(a, b))
NV_BIN_SAME(right_shift, Ops<T>::shr(a, b))

template <typename T>
__device__ __forceinline__ void select_strided(const bool* __restrict__ c, const T* __restrict__ a,
                                               const T* __restrict__ b, T* __restrict__ out, u64 n, Dims d) {
  constexpr int R = CopyRunLen<T>::v;
  for_runs<3, R>(d, n, [&](const i64* off, const i64* s, int cnt, u64 i) {
    bool vc[R];
    T va[R], vb[R], r[R];
    load_run<bool, R>(c, off[0], s[0], cnt, vc);
    load_run<T, R>(a, off[1], s[1], cnt, va);
    load_run<T, R>(b, off[2], s[2], cnt, vb);
#pragma unroll
    for (int j = 0; j < R; ++j) r[j] = vc[j] ? va[j] : vb[j];
    store_run<T, R>(out, (i64)i, 1, cnt, r);
  });
}

// `where` over dense operands laid out alike, any of them possibly a scalar (bit 0 of
// `scalars`: c, bit 1: a, bit 2: b): one 16-byte vector of the values per thread.
template <typename T>
__device__ __forceinline__ void select_contig(const bool* __restrict__ c, const T* __restrict__ a,
                                              const T* __restrict__ b, T* __restrict__ out, u64 n, int scalars) {
  constexpr int N = 16 / sizeof(T) > 0 ? 16 / sizeof(T) : 1;
  const bool cs = scalars & 1, as = scalars & 2, bs = scalars & 4;
  u64 stride = (u64)gridDim.x * blockDim.x;
  u64 nvec = n / N;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < nvec; i += stride) {
    Vec<bool, N> vc;
    Vec<T, N> va, vb;
    if (!cs) vc = reinterpret_cast<const Vec<bool, N>*>(c)[i];
    if (!as) va = reinterpret_cast<const Vec<T, N>*>(a)[i];
    if (!bs) vb = reinterpret_cast<const Vec<T, N>*>(b)[i];
    Vec<T, N> r;
#pragma unroll
    for (int j = 0; j < N; ++j) r.v[j] = (cs ? c[0] : vc.v[j]) ? (as ? a[0] : va.v[j]) : (bs ? b[0] : vb.v[j]);
    reinterpret_cast<Vec<T, N>*>(out)[i] = r;
  }
  for (u64 i = nvec * N + (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = (cs ? c[0] : c[i]) ? (as ? a[0] : a[i]) : (bs ? b[0] : b[i]);
}
