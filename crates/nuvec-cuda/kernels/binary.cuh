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
NV_BIN_SAME(logical_and, a && b)
NV_BIN_SAME(logical_or, a || b)
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
