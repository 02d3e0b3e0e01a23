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
  u64 stride = (u64)gridDim.x * blockDim.x;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = c[offset_of(d, 0, i)] ? a[offset_of(d, 1, i)] : b[offset_of(d, 2, i)];
}
