// Element-wise kernels: unary and binary maps, select and casts, each in a contiguous
// vectorised form (16-byte accesses, grid-stride) and a strided form over collapsed axes.
// The operations reproduce the CPU backend's semantics exactly for integers and booleans
// (wrapping arithmetic, Python-style floor division and remainder, zero for division by zero).
#pragma once
#include "common.cuh"

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

// ---- unary operations -----------------------------------------------------------------------
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
NV_UN_FLOAT(rsqrt, (C)1 / sqrt(x))
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
  __device__ __forceinline__ bool operator()(bool x) const { return !x; }
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

// ---- kernels --------------------------------------------------------------------------------
// Stores the N results of vector `i` as one access when they fit in 16 bytes (a warp then
// writes whole cache lines), else one element at a time.
template <typename U, int N, typename G>
__device__ __forceinline__ void store_vec(U* __restrict__ out, u64 i, G value) {
  if constexpr (sizeof(U) * N <= 16) {
    Vec<U, N> r;
#pragma unroll
    for (int j = 0; j < N; ++j) r.v[j] = value(j);
    reinterpret_cast<Vec<U, N>*>(out)[i] = r;
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) out[i * N + j] = value(j);
  }
}

// Contiguous: `n` elements, 16-byte vectors when all pointers are aligned (checked by the host).
template <typename T, typename U, typename F>
__device__ __forceinline__ void unary_contig(const T* __restrict__ x, U* __restrict__ out, u64 n, F f) {
  const int N = 16 / sizeof(T) > 0 ? 16 / sizeof(T) : 1;
  u64 stride = (u64)gridDim.x * blockDim.x;
  u64 nvec = n / N;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < nvec; i += stride) {
    Vec<T, N> v = reinterpret_cast<const Vec<T, N>*>(x)[i];
    store_vec<U, N>(out, i, [&](int j) { return f(v.v[j]); });
  }
  for (u64 i = nvec * N + (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) out[i] = f(x[i]);
}

template <typename T, typename U, typename F>
__device__ __forceinline__ void unary_strided(const T* __restrict__ x, U* __restrict__ out, u64 n, Dims d, F f) {
  u64 stride = (u64)gridDim.x * blockDim.x;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) out[i] = f(x[offset_of(d, 0, i)]);
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

template <typename T, typename U, typename F>
__device__ __forceinline__ void binary_strided(const T* __restrict__ a, const T* __restrict__ b, U* __restrict__ out,
                                               u64 n, Dims d, F f) {
  u64 stride = (u64)gridDim.x * blockDim.x;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = f(a[offset_of(d, 0, i)], b[offset_of(d, 1, i)]);
}

template <typename T>
__device__ __forceinline__ void select_strided(const bool* __restrict__ c, const T* __restrict__ a,
                                               const T* __restrict__ b, T* __restrict__ out, u64 n, Dims d) {
  u64 stride = (u64)gridDim.x * blockDim.x;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = c[offset_of(d, 0, i)] ? a[offset_of(d, 1, i)] : b[offset_of(d, 2, i)];
}

template <typename S, typename D> struct CastF {
  __device__ __forceinline__ D operator()(S x) const { return convert<D, S>(x); }
};
