// Scalar arithmetic with the CPU backend's semantics, shared by the element-wise, reduction,
// gather and integer-product kernels: wrapping integer arithmetic, Python-style floor division
// and remainder (zero for division by zero), NaN-propagating float helpers, and `Ops<T>`, the
// binary operations on one element type (integers, booleans, floats, complex).
#pragma once
#include "common.cuh"

// x·sigmoid(x) for SwiGLU (swiglu.cuh, and the GEMV that applies it as it loads). Results
// rounded to a 2-byte type take the hardware exponential and division (ex2.approx, rcp.approx:
// relative error a few 1e-6 at most, far below the rounding to bf16 or f16, and faster; see
// bench/results/); f32 and f64 keep the precise ones.
template <typename T> __device__ __forceinline__ typename Acc<T>::type silu_fast(typename Acc<T>::type v) {
  typedef typename Acc<T>::type A;
  if constexpr (sizeof(T) == 2) {
    return __fdividef(v, 1.0f + __expf(-v));
  } else {
    return v / ((A)1 + exp(-v));
  }
}

// ---- arithmetic by element kind ---------------------------------------------------------
template <typename T> struct IsSigned { static const bool value = (T)-1 < (T)0; };

template <typename T> __device__ __forceinline__ T wrap_add(T a, T b) { return (T)((u64)a + (u64)b); }
template <typename T> __device__ __forceinline__ T wrap_sub(T a, T b) { return (T)((u64)a - (u64)b); }
template <typename T> __device__ __forceinline__ T wrap_mul(T a, T b) { return (T)((u64)a * (u64)b); }

template <typename T> __device__ __forceinline__ T int_floor_div(T a, T b) {
  if (b == 0) return 0;
  if (IsSigned<T>::value && b == (T)-1) return wrap_sub((T)0, a);
  T q = a / b;
  if (IsSigned<T>::value && (a % b != 0) && ((a < 0) != (b < 0))) q -= 1;
  return q;
}
template <typename T> __device__ __forceinline__ T int_rem(T a, T b) {
  if (b == 0) return 0;
  if (IsSigned<T>::value && b == (T)-1) return 0;
  T r = a % b;
  if (IsSigned<T>::value && r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}
template <typename T> __device__ __forceinline__ T int_pow(T base, T exp) {
  if (IsSigned<T>::value && exp < 0) {
    if (base == 1) return 1;
    if (base == (T)-1) return ((i64)exp % 2 == 0) ? (T)1 : (T)-1;
    return 0;
  }
  u64 e = (u64)exp;
  T r = 1, b = base;
  while (e) {
    if (e & 1) r = wrap_mul(r, b);
    b = wrap_mul(b, b);
    e >>= 1;
  }
  return r;
}
template <typename T> __device__ __forceinline__ T int_shl(T a, T b) {
  if (IsSigned<T>::value && b < 0) return 0;
  if ((u64)b >= sizeof(T) * 8) return 0;
  return (T)((u64)a << (u64)b);
}
template <typename T> __device__ __forceinline__ T int_shr(T a, T b) {
  if (IsSigned<T>::value && b < 0) return 0;
  if ((u64)b >= sizeof(T) * 8) return (IsSigned<T>::value && a < 0) ? (T)-1 : (T)0;
  return a >> b;
}

// Float math in the compute precision (f32 for halves).
template <typename C> __device__ __forceinline__ C fmax_nan(C a, C b) { return (a != a || a > b) ? a : b; }
template <typename C> __device__ __forceinline__ C fmin_nan(C a, C b) { return (a != a || a < b) ? a : b; }
template <typename C> __device__ __forceinline__ C py_fmod(C a, C b) {
  C r = fmod(a, b);
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}
template <typename C> __device__ __forceinline__ C logaddexp_(C a, C b) {
  if (a != a || b != b) return a + b;
  C m = a > b ? a : b;
  if (isinf(m)) return m;
  return m + log1p(exp(-fabs(a - b)));
}
// (x > 0) - (x < 0): NaN and both zeros give +0, as MLX.
template <typename C> __device__ __forceinline__ C sign_(C x) { return x > 0 ? (C)1 : (x < 0 ? (C)-1 : (C)0); }
template <typename C> __device__ __forceinline__ C round_even(C x) { return rint(x); }

// ---- binary operations ----------------------------------------------------------------------
// Each functor maps (T, T) -> T or bool. `Kind` tags: integer (incl. bool), float, complex.
#define NV_FLOAT_BIN(NAME, EXPR)                                                   \
  template <typename T> __device__ __forceinline__ T NAME##_f(T a_, T b_) {        \
    typedef typename Acc<T>::type C;                                               \
    C a = widen(a_), b = widen(b_);                                                \
    return narrow<T>((C)(EXPR));                                                   \
  }
NV_FLOAT_BIN(add, a + b)
NV_FLOAT_BIN(sub, a - b)
NV_FLOAT_BIN(mul, a * b)
NV_FLOAT_BIN(div, a / b)
// The quotient rounds to the element type before flooring (MLX's half precision).
NV_FLOAT_BIN(floordiv, floor(widen(narrow<T>((C)(a / b)))))
NV_FLOAT_BIN(rem, py_fmod(a, b))
NV_FLOAT_BIN(pow, pow(a, b))
NV_FLOAT_BIN(max, fmax_nan(a, b))
NV_FLOAT_BIN(min, fmin_nan(a, b))
NV_FLOAT_BIN(logaddexp, logaddexp_(a, b))
NV_FLOAT_BIN(atan2, atan2(a, b))

template <typename T> struct Ops {
  // Integers and booleans.
  __device__ static T add(T a, T b) { return wrap_add(a, b); }
  __device__ static T sub(T a, T b) { return wrap_sub(a, b); }
  __device__ static T mul(T a, T b) { return wrap_mul(a, b); }
  __device__ static T div(T a, T b) { return b == 0 ? (T)0 : int_floor_div(a, b); }
  __device__ static T floordiv(T a, T b) { return int_floor_div(a, b); }
  __device__ static T rem(T a, T b) { return int_rem(a, b); }
  __device__ static T pow(T a, T b) { return int_pow(a, b); }
  __device__ static T max(T a, T b) { return a > b ? a : b; }
  __device__ static T min(T a, T b) { return a < b ? a : b; }
  __device__ static bool lt(T a, T b) { return a < b; }
  __device__ static bool le(T a, T b) { return a <= b; }
  __device__ static bool eq(T a, T b) { return a == b; }
  __device__ static T band(T a, T b) { return a & b; }
  __device__ static T bor(T a, T b) { return a | b; }
  __device__ static T bxor(T a, T b) { return a ^ b; }
  __device__ static T shl(T a, T b) { return int_shl(a, b); }
  __device__ static T shr(T a, T b) { return int_shr(a, b); }
  __device__ static T logaddexp(T a, T b) { return a; }
  __device__ static T atan2(T a, T b) { return a; }
};
// Booleans: + is or, - is xor, * and / are and (MLX's boolean arithmetic).
template <> struct Ops<bool> {
  __device__ static bool add(bool a, bool b) { return a || b; }
  __device__ static bool sub(bool a, bool b) { return a != b; }
  __device__ static bool mul(bool a, bool b) { return a && b; }
  __device__ static bool div(bool a, bool b) { return a && b; }
  __device__ static bool floordiv(bool a, bool b) { return a && b; }
  __device__ static bool rem(bool a, bool b) { return false; }
  __device__ static bool pow(bool a, bool b) { return a || !b; }
  __device__ static bool max(bool a, bool b) { return a || b; }
  __device__ static bool min(bool a, bool b) { return a && b; }
  __device__ static bool lt(bool a, bool b) { return !a && b; }
  __device__ static bool le(bool a, bool b) { return !a || b; }
  __device__ static bool eq(bool a, bool b) { return a == b; }
  __device__ static bool band(bool a, bool b) { return a && b; }
  __device__ static bool bor(bool a, bool b) { return a || b; }
  __device__ static bool bxor(bool a, bool b) { return a != b; }
  __device__ static bool shl(bool a, bool b) { return b ? false : a; }
  __device__ static bool shr(bool a, bool b) { return b ? false : a; }
  __device__ static bool logaddexp(bool a, bool b) { return a; }
  __device__ static bool atan2(bool a, bool b) { return a; }
};
#define NV_FLOAT_OPS(T)                                                                 \
  template <> struct Ops<T> {                                                           \
    __device__ static T add(T a, T b) { return add_f(a, b); }                           \
    __device__ static T sub(T a, T b) { return sub_f(a, b); }                           \
    __device__ static T mul(T a, T b) { return mul_f(a, b); }                           \
    __device__ static T div(T a, T b) { return div_f(a, b); }                           \
    __device__ static T floordiv(T a, T b) { return floordiv_f(a, b); }                 \
    __device__ static T rem(T a, T b) { return rem_f(a, b); }                           \
    __device__ static T pow(T a, T b) { return pow_f(a, b); }                           \
    __device__ static T max(T a, T b) { return max_f(a, b); }                           \
    __device__ static T min(T a, T b) { return min_f(a, b); }                           \
    __device__ static bool lt(T a, T b) { return widen(a) < widen(b); }                 \
    __device__ static bool le(T a, T b) { return widen(a) <= widen(b); }                \
    __device__ static bool eq(T a, T b) { return widen(a) == widen(b); }                \
    __device__ static T band(T a, T b) { return a; }                                    \
    __device__ static T bor(T a, T b) { return a; }                                     \
    __device__ static T bxor(T a, T b) { return a; }                                    \
    __device__ static T shl(T a, T b) { return a; }                                     \
    __device__ static T shr(T a, T b) { return a; }                                     \
    __device__ static T logaddexp(T a, T b) { return logaddexp_f(a, b); }               \
    __device__ static T atan2(T a, T b) { return atan2_f(a, b); }                       \
  };
NV_FLOAT_OPS(f16)
NV_FLOAT_OPS(bf16)
NV_FLOAT_OPS(float)
NV_FLOAT_OPS(double)

__device__ __forceinline__ c64 c_exp(c64 z) {
  float e = expf(z.re);
  return make_c64(e * cosf(z.im), e * sinf(z.im));
}
__device__ __forceinline__ c64 c_log(c64 z) { return make_c64(logf(hypotf(z.re, z.im)), atan2f(z.im, z.re)); }
template <> struct Ops<c64> {
  __device__ static c64 add(c64 a, c64 b) { return a + b; }
  __device__ static c64 sub(c64 a, c64 b) { return a - b; }
  __device__ static c64 mul(c64 a, c64 b) { return a * b; }
  __device__ static c64 div(c64 a, c64 b) { return a / b; }
  // MLX's complex floor division is plain division.
  __device__ static c64 floordiv(c64 a, c64 b) { return a / b; }
  __device__ static c64 rem(c64 a, c64 b) { return a - b * (a / b); }
  __device__ static c64 pow(c64 a, c64 b) {
    if (a.re == 0.0f && a.im == 0.0f) return (b.re == 0.0f && b.im == 0.0f) ? make_c64(1.0f, 0.0f) : a;
    return c_exp(b * c_log(a));
  }
  __device__ static bool lt(c64 a, c64 b) { return a.re < b.re || (a.re == b.re && a.im < b.im); }
  __device__ static bool le(c64 a, c64 b) { return a.re < b.re || (a.re == b.re && a.im <= b.im); }
  __device__ static c64 max(c64 a, c64 b) { return lt(a, b) ? b : a; }
  __device__ static c64 min(c64 a, c64 b) { return lt(b, a) ? b : a; }
  __device__ static bool eq(c64 a, c64 b) { return a == b; }
  __device__ static c64 band(c64 a, c64 b) { return a; }
  __device__ static c64 bor(c64 a, c64 b) { return a; }
  __device__ static c64 bxor(c64 a, c64 b) { return a; }
  __device__ static c64 shl(c64 a, c64 b) { return a; }
  __device__ static c64 shr(c64 a, c64 b) { return a; }
  // Factored on the operand with the larger real part, so it cannot overflow.
  __device__ static c64 logaddexp(c64 a, c64 b) {
    c64 hi = a.re >= b.re ? a : b, lo = a.re >= b.re ? b : a;
    if (isinf(hi.re) && hi.re > 0) return hi;
    return hi + c_log(c_exp(lo - hi) + make_c64(1.0f, 0.0f));
  }
  __device__ static c64 atan2(c64 a, c64 b) { return a; }
};
