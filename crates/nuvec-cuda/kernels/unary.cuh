// Unary maps: the `Un_*` functors unary.rs instantiates (integer, float and complex forms).
#pragma once
#include "arith.cuh"
#include "map.cuh"

template <typename T> struct UOps {
  // Integers and booleans.
  __device__ static T abs(T x) { return (IsSigned<T>::value && x < 0) ? wrap_sub((T)0, x) : x; }
  __device__ static T sign(T x) { return x > 0 ? (T)1 : (x < 0 ? (T)-1 : (T)0); }
  __device__ static T negative(T x) { return wrap_sub((T)0, x); }
  __device__ static T square(T x) { return wrap_mul(x, x); }
  __device__ static T bitwise_invert(T x) { return ~x; }
};
template <> struct UOps<bool> {
  __device__ static bool abs(bool x) { return x; }
  __device__ static bool sign(bool x) { return x; }
  __device__ static bool negative(bool x) { return x; }
  __device__ static bool square(bool x) { return x; }
  __device__ static bool bitwise_invert(bool x) { return !x; }
};

#define NV_UN_FLOAT(NAME, EXPR)                                                   \
  struct Un_##NAME {                                                             \
    template <typename T> __device__ __forceinline__ T operator()(T x_) const {  \
      typedef typename Acc<T>::type C;                                           \
      C x = widen(x_);                                                           \
      return narrow<T>((C)(EXPR));                                               \
    }                                                                            \
  };
NV_UN_FLOAT(floor, floor(x))
NV_UN_FLOAT(ceil, ceil(x))
NV_UN_FLOAT(round, round_even(x))
NV_UN_FLOAT(exp, exp(x))
NV_UN_FLOAT(expm1, expm1(x))
NV_UN_FLOAT(log, log(x))
NV_UN_FLOAT(log1p, log1p(x))
NV_UN_FLOAT(log2, log2(x))
NV_UN_FLOAT(log10, log10(x))
NV_UN_FLOAT(sqrt, sqrt(x))
// Half types take the hardware rsqrt (relative error 2^-22.9, far below their rounding), not
// a correctly rounded square root and division.
NV_UN_FLOAT(rsqrt, sizeof(T) == 2 ? (C)rsqrtf((float)x) : (C)1 / sqrt(x))
NV_UN_FLOAT(reciprocal, (C)1 / x)
NV_UN_FLOAT(sin, sin(x))
NV_UN_FLOAT(cos, cos(x))
NV_UN_FLOAT(tan, tan(x))
NV_UN_FLOAT(arcsin, asin(x))
NV_UN_FLOAT(arccos, acos(x))
NV_UN_FLOAT(arctan, atan(x))
NV_UN_FLOAT(sinh, sinh(x))
NV_UN_FLOAT(cosh, cosh(x))
NV_UN_FLOAT(tanh, tanh(x))
NV_UN_FLOAT(arcsinh, asinh(x))
NV_UN_FLOAT(arccosh, acosh(x))
NV_UN_FLOAT(arctanh, atanh(x))
NV_UN_FLOAT(sigmoid, (C)1 / ((C)1 + exp(-x)))
NV_UN_FLOAT(erf, erf(x))
NV_UN_FLOAT(erfinv, erfinv(x))
NV_UN_FLOAT(fabs, fabs(x))
NV_UN_FLOAT(fsign, sign_(x))
NV_UN_FLOAT(fnegative, -x)
NV_UN_FLOAT(fsquare, x * x)

#define NV_UN_INT(NAME)                                                                      \
  struct Un_##NAME {                                                                         \
    template <typename T> __device__ __forceinline__ T operator()(T x) const { return UOps<T>::NAME(x); } \
  };
NV_UN_INT(abs)
NV_UN_INT(sign)
NV_UN_INT(negative)
NV_UN_INT(square)
NV_UN_INT(bitwise_invert)
struct Un_logical_not {
  template <typename T> __device__ __forceinline__ bool operator()(T x) const { return !truthy(x); }
};
struct Un_cabs {
  __device__ __forceinline__ float operator()(c64 z) const { return hypotf(z.re, z.im); }
};
struct Un_cnegative {
  __device__ __forceinline__ c64 operator()(c64 z) const { return make_c64(-z.re, -z.im); }
};
struct Un_csquare {
  __device__ __forceinline__ c64 operator()(c64 z) const { return z * z; }
};
struct Un_cconjugate {
  __device__ __forceinline__ c64 operator()(c64 z) const { return make_c64(z.re, -z.im); }
};
struct Un_cexp {
  __device__ __forceinline__ c64 operator()(c64 z) const { return c_exp(z); }
};
struct Un_clog {
  __device__ __forceinline__ c64 operator()(c64 z) const { return c_log(z); }
};
struct Un_csqrt {
  __device__ __forceinline__ c64 operator()(c64 z) const {
    float r = hypotf(z.re, z.im);
    float re = sqrtf(0.5f * (r + z.re));
    float im = copysignf(sqrtf(0.5f * (r - z.re)), z.im);
    return make_c64(re, im);
  }
};
struct Un_creciprocal {
  __device__ __forceinline__ c64 operator()(c64 z) const { return make_c64(1.0f, 0.0f) / z; }
};
struct Un_csign {
  __device__ __forceinline__ c64 operator()(c64 z) const {
    float n = hypotf(z.re, z.im);
    return n == 0.0f ? z : make_c64(z.re / n, z.im / n);
  }
};
