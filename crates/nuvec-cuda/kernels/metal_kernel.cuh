// The prelude of Metal kernels (`fast::MetalKernel`): Metal Shading Language's types and
// functions on CUDA, so bodies written for `mx.fast.metal_kernel` compile unchanged after the
// few source rewrites `metal_kernel.rs` documents. Included as "nuvec_metal_kernel.cuh".
#pragma once
#include "nuvec_custom_kernel.cuh"

// ---- scalar types ------------------------------------------------------------------------
// `half` comes from cuda_fp16.h (`typedef __half half`).
typedef __nv_bfloat16 bfloat;
typedef unsigned short ushort;
typedef unsigned char uchar;
typedef unsigned long long ulong;

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fffffff)
#endif
#define MAXFLOAT 3.402823466e+38f
#define HUGE_VALF INFINITY
#define FLT_MAX 3.402823466e+38f
#define FLT_MIN 1.175494351e-38f
#define M_PI_F 3.14159265358979323846264338327950288f
#define M_PI_2_F 1.57079632679489661923132169163975144f
#define M_E_F 2.71828182845904523536028747135266250f
#define M_LN2_F 0.693147180559945309417232121458176568f
#define M_LOG2E_F 1.44269504088896340735992468100189214f
#define M_SQRT2_F 1.41421356237309504880168872420969808f

// Keeps a parameter out of template deduction, so `clamp(x, 0, 1)` takes the type of `x`.
template <typename T> struct nv_mk_id { typedef T type; };

// ---- math on half and bfloat (computed in float, rounded once) --------------------------
#define NV_MK_HALF_FN(F)                                                                     \
  __device__ __forceinline__ __half F(__half x) { return __float2half_rn(F(__half2float(x))); } \
  __device__ __forceinline__ __nv_bfloat16 F(__nv_bfloat16 x) {                              \
    return __float2bfloat16_rn(F(__bfloat162float(x)));                                     \
  }
NV_MK_HALF_FN(exp) NV_MK_HALF_FN(exp2) NV_MK_HALF_FN(log) NV_MK_HALF_FN(log2) NV_MK_HALF_FN(log10)
NV_MK_HALF_FN(sqrt) NV_MK_HALF_FN(rsqrt) NV_MK_HALF_FN(sin) NV_MK_HALF_FN(cos) NV_MK_HALF_FN(tan)
NV_MK_HALF_FN(tanh) NV_MK_HALF_FN(sinh) NV_MK_HALF_FN(cosh) NV_MK_HALF_FN(asin) NV_MK_HALF_FN(acos)
NV_MK_HALF_FN(atan) NV_MK_HALF_FN(floor) NV_MK_HALF_FN(ceil) NV_MK_HALF_FN(round) NV_MK_HALF_FN(trunc)
NV_MK_HALF_FN(erf) NV_MK_HALF_FN(expm1) NV_MK_HALF_FN(log1p) NV_MK_HALF_FN(fabs)
#undef NV_MK_HALF_FN

// Metal's `abs`, `max`, `min` are overloaded on every arithmetic type (CUDA's cover int and
// float); these add half, bfloat and the unsigned types.
__device__ __forceinline__ __half abs(__half x) { return __habs(x); }
__device__ __forceinline__ __nv_bfloat16 abs(__nv_bfloat16 x) { return __habs(x); }
__device__ __forceinline__ __half max(__half a, __half b) { return __hmax(a, b); }
__device__ __forceinline__ __half min(__half a, __half b) { return __hmin(a, b); }
__device__ __forceinline__ __nv_bfloat16 max(__nv_bfloat16 a, __nv_bfloat16 b) { return __hmax(a, b); }
__device__ __forceinline__ __nv_bfloat16 min(__nv_bfloat16 a, __nv_bfloat16 b) { return __hmin(a, b); }

template <typename T> __device__ __forceinline__ T clamp(T x, typename nv_mk_id<T>::type lo, typename nv_mk_id<T>::type hi) {
  return x < lo ? lo : (hi < x ? hi : x);
}
template <typename T> __device__ __forceinline__ T saturate(T x) { return clamp(x, T(0), T(1)); }
template <typename T> __device__ __forceinline__ T select(T a, typename nv_mk_id<T>::type b, bool c) { return c ? b : a; }
__device__ __forceinline__ bool all(bool c) { return c; }
__device__ __forceinline__ bool any(bool c) { return c; }
template <typename T> __device__ __forceinline__ T mix(T x, typename nv_mk_id<T>::type y, typename nv_mk_id<T>::type a) {
  return x + (y - x) * a;
}
template <typename T> __device__ __forceinline__ T sign(T x) { return x > T(0) ? T(1) : (x < T(0) ? T(-1) : T(0)); }
template <typename T> __device__ __forceinline__ T step(typename nv_mk_id<T>::type edge, T x) { return x < edge ? T(0) : T(1); }
__device__ __forceinline__ float fract(float x) { return x - floorf(x); }
__device__ __forceinline__ float divide(float a, float b) { return __fdividef(a, b); }

// The translation wraps the other operand of `c ? x : 1.0f` in this: Metal widens a half or
// bfloat there to float, where CUDA C++ finds the conversion ambiguous.
template <typename T> __device__ __forceinline__ T nv_mk_promote(T x) { return x; }
__device__ __forceinline__ float nv_mk_promote(__half x) { return __half2float(x); }
__device__ __forceinline__ float nv_mk_promote(__nv_bfloat16 x) { return __bfloat162float(x); }

// Metal's integer bit counts, for any integer width (`ctz(0)` and `clz(0)` are the width).
template <typename T> struct nv_mk_is_int { static constexpr bool value = false; };
#define NV_MK_INT(T) template <> struct nv_mk_is_int<T> { static constexpr bool value = true; };
NV_MK_INT(char) NV_MK_INT(signed char) NV_MK_INT(unsigned char) NV_MK_INT(short) NV_MK_INT(unsigned short)
NV_MK_INT(int) NV_MK_INT(unsigned) NV_MK_INT(long) NV_MK_INT(unsigned long) NV_MK_INT(long long)
NV_MK_INT(unsigned long long)
#undef NV_MK_INT
template <typename T> __device__ __forceinline__ unsigned long long nv_mk_bits(T x) {
  static_assert(nv_mk_is_int<T>::value, "popcount, ctz and clz take integers");
  if constexpr (sizeof(T) == 8) return (unsigned long long)x;
  else return (unsigned long long)x & ((1ull << (8 * sizeof(T))) - 1);
}
template <typename T> __device__ __forceinline__ T popcount(T x) { return T(__popcll(nv_mk_bits(x))); }
template <typename T> __device__ __forceinline__ T ctz(T x) {
  unsigned long long b = nv_mk_bits(x);
  return T(b == 0 ? 8 * sizeof(T) : __ffsll((long long)b) - 1);
}
template <typename T> __device__ __forceinline__ T clz(T x) { return T(__clzll((long long)nv_mk_bits(x)) - 64 + 8 * sizeof(T)); }

// `as_type<T>(x)`: the bits of `x` read as a `T` of the same size.
template <typename To, typename From> __device__ __forceinline__ To as_type(From x) {
  static_assert(sizeof(To) == sizeof(From), "as_type needs types of the same size");
  To t;
  memcpy(&t, &x, sizeof(To));
  return t;
}

// `fast::` maps to CUDA's fast intrinsics, `precise::` to the correctly rounded functions.
namespace fast {
__device__ __forceinline__ float exp(float x) { return __expf(x); }
__device__ __forceinline__ float exp2(float x) { return exp2f(x); }
__device__ __forceinline__ float log(float x) { return __logf(x); }
__device__ __forceinline__ float log2(float x) { return __log2f(x); }
__device__ __forceinline__ float sin(float x) { return __sinf(x); }
__device__ __forceinline__ float cos(float x) { return __cosf(x); }
__device__ __forceinline__ float tanh(float x) { return tanhf(x); }
__device__ __forceinline__ float sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ float rsqrt(float x) { return rsqrtf(x); }
__device__ __forceinline__ float pow(float x, float y) { return __powf(x, y); }
__device__ __forceinline__ float divide(float a, float b) { return __fdividef(a, b); }
}  // namespace fast
namespace precise {
__device__ __forceinline__ float exp(float x) { return expf(x); }
__device__ __forceinline__ float exp2(float x) { return exp2f(x); }
__device__ __forceinline__ float log(float x) { return logf(x); }
__device__ __forceinline__ float log2(float x) { return log2f(x); }
__device__ __forceinline__ float sin(float x) { return sinf(x); }
__device__ __forceinline__ float cos(float x) { return cosf(x); }
__device__ __forceinline__ float tanh(float x) { return tanhf(x); }
__device__ __forceinline__ float sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ float rsqrt(float x) { return rsqrtf(x); }
__device__ __forceinline__ float pow(float x, float y) { return powf(x, y); }
__device__ __forceinline__ float divide(float a, float b) { return a / b; }
}  // namespace precise

// ---- vector types ------------------------------------------------------------------------
// CUDA predefines `float4`, `uint3`... as plain structs, so Metal's vectors live in `metal::`
// and the translation rewrites the type names (`float4` -> `metal::float4`). A swizzle read
// `.xy` becomes `.template sw<0, 1>()` (a copy); a swizzle that is assigned to, `.xy = ...`
// or `.zw += ...`, becomes `.template wsw<2, 3>()`, a reference to those components. Single
// `.r .g .b .a` share their storage with `.x .y .z .w` through anonymous unions.
namespace metal {
template <typename T, int N> struct vec;
template <typename T, int N, int... I> struct nv_mk_swizzle_ref;

#define NV_MK_VEC_COMMON(N)                                                                    \
  __device__ __forceinline__ T& operator[](int i) { return (&x)[i]; }                           \
  __device__ __forceinline__ const T& operator[](int i) const { return (&x)[i]; }               \
  template <int... I> __device__ __forceinline__ const vec<T, sizeof...(I)> sw() const {        \
    static_assert(((I < N) && ...), "a swizzle names a component the vector does not have");   \
    return vec<T, sizeof...(I)>((*this)[I]...);                                                 \
  }                                                                                             \
  template <int... I> __device__ __forceinline__ nv_mk_swizzle_ref<T, N, I...> wsw() {          \
    return nv_mk_swizzle_ref<T, N, I...>{*this};                                                \
  }                                                                                             \
  template <typename U> __device__ __forceinline__ explicit vec(const vec<U, N>& o) {           \
    for (int i = 0; i < N; ++i) (*this)[i] = static_cast<T>(o[i]);                              \
  }

template <typename T> struct vec<T, 2> {
  union { T x; T r; };
  union { T y; T g; };
  vec() = default;
  __device__ __forceinline__ vec(T s) : x(s), y(s) {}
  __device__ __forceinline__ vec(T a, T b) : x(a), y(b) {}
  NV_MK_VEC_COMMON(2)
};
template <typename T> struct vec<T, 3> {
  union { T x; T r; };
  union { T y; T g; };
  union { T z; T b; };
  vec() = default;
  __device__ __forceinline__ vec(T s) : x(s), y(s), z(s) {}
  __device__ __forceinline__ vec(T a, T b, T c) : x(a), y(b), z(c) {}
  __device__ __forceinline__ vec(vec<T, 2> a, T c) : x(a.x), y(a.y), z(c) {}
  __device__ __forceinline__ vec(T a, vec<T, 2> b) : x(a), y(b.x), z(b.y) {}
  NV_MK_VEC_COMMON(3)
};
template <typename T> struct vec<T, 4> {
  union { T x; T r; };
  union { T y; T g; };
  union { T z; T b; };
  union { T w; T a; };
  vec() = default;
  __device__ __forceinline__ vec(T s) : x(s), y(s), z(s), w(s) {}
  __device__ __forceinline__ vec(T a, T b, T c, T d) : x(a), y(b), z(c), w(d) {}
  __device__ __forceinline__ vec(vec<T, 3> a, T d) : x(a.x), y(a.y), z(a.z), w(d) {}
  __device__ __forceinline__ vec(T a, vec<T, 3> b) : x(a), y(b.x), z(b.y), w(b.z) {}
  __device__ __forceinline__ vec(vec<T, 2> a, vec<T, 2> b) : x(a.x), y(a.y), z(b.x), w(b.y) {}
  __device__ __forceinline__ vec(vec<T, 2> a, T c, T d) : x(a.x), y(a.y), z(c), w(d) {}
  NV_MK_VEC_COMMON(4)
};
#undef NV_MK_VEC_COMMON

// Elementwise binary operators: vector with vector, and with a scalar of the element type on
// either side; R is the result's element type (T, or bool for comparisons, as Metal's).
#define NV_MK_VEC_BINARY(OP, R)                                                                          \
  template <typename T, int N> __device__ __forceinline__ vec<R, N> operator OP(vec<T, N> a, vec<T, N> b) { \
    vec<R, N> r;                                                                                         \
    for (int i = 0; i < N; ++i) r[i] = a[i] OP b[i];                                                     \
    return r;                                                                                            \
  }                                                                                                      \
  template <typename T, int N>                                                                           \
  __device__ __forceinline__ vec<R, N> operator OP(vec<T, N> a, typename nv_mk_id<T>::type b) {          \
    vec<R, N> r;                                                                                         \
    for (int i = 0; i < N; ++i) r[i] = a[i] OP b;                                                        \
    return r;                                                                                            \
  }                                                                                                      \
  template <typename T, int N>                                                                           \
  __device__ __forceinline__ vec<R, N> operator OP(typename nv_mk_id<T>::type a, vec<T, N> b) {          \
    vec<R, N> r;                                                                                         \
    for (int i = 0; i < N; ++i) r[i] = a OP b[i];                                                        \
    return r;                                                                                            \
  }
// Arithmetic, with its compound assignments.
#define NV_MK_VEC_OP(OP)                                                                                \
  NV_MK_VEC_BINARY(OP, T)                                                                               \
  template <typename T, int N> __device__ __forceinline__ vec<T, N>& operator OP##=(vec<T, N>& a, vec<T, N> b) { \
    for (int i = 0; i < N; ++i) a[i] = a[i] OP b[i];                                                    \
    return a;                                                                                           \
  }                                                                                                     \
  template <typename T, int N>                                                                          \
  __device__ __forceinline__ vec<T, N>& operator OP##=(vec<T, N>& a, typename nv_mk_id<T>::type b) {    \
    for (int i = 0; i < N; ++i) a[i] = a[i] OP b;                                                       \
    return a;                                                                                           \
  }
NV_MK_VEC_OP(+) NV_MK_VEC_OP(-) NV_MK_VEC_OP(*) NV_MK_VEC_OP(/)
// The integer ones: a use on float vectors fails to compile, as in Metal.
NV_MK_VEC_OP(%) NV_MK_VEC_OP(&) NV_MK_VEC_OP(|) NV_MK_VEC_OP(^) NV_MK_VEC_OP(<<) NV_MK_VEC_OP(>>)
#undef NV_MK_VEC_OP
template <typename T, int N> __device__ __forceinline__ vec<T, N> operator-(vec<T, N> a) {
  for (int i = 0; i < N; ++i) a[i] = -a[i];
  return a;
}
template <typename T, int N> __device__ __forceinline__ vec<T, N> operator~(vec<T, N> a) {
  for (int i = 0; i < N; ++i) a[i] = ~a[i];
  return a;
}

// Comparisons give bool vectors; `all`, `any` and `select` read them.
NV_MK_VEC_BINARY(<, bool) NV_MK_VEC_BINARY(<=, bool) NV_MK_VEC_BINARY(>, bool)
NV_MK_VEC_BINARY(>=, bool) NV_MK_VEC_BINARY(==, bool) NV_MK_VEC_BINARY(!=, bool)
// Metal's `&&` and `||` on vectors are elementwise (both sides are evaluated).
NV_MK_VEC_BINARY(&&, bool) NV_MK_VEC_BINARY(||, bool)
#undef NV_MK_VEC_BINARY
template <int N> __device__ __forceinline__ vec<bool, N> operator!(vec<bool, N> a) {
  for (int i = 0; i < N; ++i) a[i] = !a[i];
  return a;
}
template <int N> __device__ __forceinline__ bool all(vec<bool, N> a) {
  for (int i = 0; i < N; ++i)
    if (!a[i]) return false;
  return true;
}
template <int N> __device__ __forceinline__ bool any(vec<bool, N> a) {
  for (int i = 0; i < N; ++i)
    if (a[i]) return true;
  return false;
}
// `select(a, b, c)`: `c[i] ? b[i] : a[i]`; `b` may be a scalar, as with the scalar `select`.
template <typename T, int N>
__device__ __forceinline__ vec<T, N> select(vec<T, N> a, typename nv_mk_id<vec<T, N>>::type b, vec<bool, N> c) {
  for (int i = 0; i < N; ++i) a[i] = c[i] ? b[i] : a[i];
  return a;
}

// The target of a swizzle assignment: reads as a vector, and writes each named component.
// Metal refuses a repeated component here; the translation reports it at the user's line.
template <int... I> struct nv_mk_distinct { static constexpr bool value = true; };
template <int A, int... R> struct nv_mk_distinct<A, R...> {
  static constexpr bool value = ((A != R) && ... && true) && nv_mk_distinct<R...>::value;
};
template <typename T, int N, int... I> struct nv_mk_swizzle_ref {
  static_assert(nv_mk_distinct<I...>::value, "a swizzle with a repeated component cannot be assigned to");
  static_assert(((I < N) && ...), "a swizzle names a component the vector does not have");
  typedef vec<T, sizeof...(I)> V;
  vec<T, N>& v;
  __device__ __forceinline__ operator V() const { return V(v[I]...); }
  __device__ __forceinline__ V operator=(V o) {
    int k = 0;
    ((v[I] = o[k++]), ...);
    return o;
  }
  __device__ __forceinline__ V operator+=(V o) { return *this = V(*this) + o; }
  __device__ __forceinline__ V operator-=(V o) { return *this = V(*this) - o; }
  __device__ __forceinline__ V operator*=(V o) { return *this = V(*this) * o; }
  __device__ __forceinline__ V operator/=(V o) { return *this = V(*this) / o; }
};

#define NV_MK_VEC_TYPES(T, NAME) typedef vec<T, 2> NAME##2; typedef vec<T, 3> NAME##3; typedef vec<T, 4> NAME##4;
NV_MK_VEC_TYPES(bool, bool) NV_MK_VEC_TYPES(signed char, char) NV_MK_VEC_TYPES(unsigned char, uchar)
NV_MK_VEC_TYPES(short, short) NV_MK_VEC_TYPES(unsigned short, ushort) NV_MK_VEC_TYPES(int, int)
NV_MK_VEC_TYPES(unsigned int, uint) NV_MK_VEC_TYPES(long long, long) NV_MK_VEC_TYPES(unsigned long long, ulong)
NV_MK_VEC_TYPES(__half, half) NV_MK_VEC_TYPES(__nv_bfloat16, bfloat) NV_MK_VEC_TYPES(float, float)
#undef NV_MK_VEC_TYPES

// Geometric functions of float vectors.
template <typename T, int N> __device__ __forceinline__ T dot(vec<T, N> a, vec<T, N> b) {
  T s = a[0] * b[0];
  for (int i = 1; i < N; ++i) s = s + a[i] * b[i];
  return s;
}
template <int N> __device__ __forceinline__ float length(vec<float, N> a) { return sqrtf(dot(a, a)); }
template <int N> __device__ __forceinline__ vec<float, N> normalize(vec<float, N> a) { return a * rsqrtf(dot(a, a)); }

// Elementwise math on vectors, through the scalar overloads.
#define NV_MK_VEC_FN(F)                                                                \
  template <typename T, int N> __device__ __forceinline__ vec<T, N> F(vec<T, N> a) {  \
    for (int i = 0; i < N; ++i) a[i] = ::F(a[i]);                                       \
    return a;                                                                           \
  }
NV_MK_VEC_FN(exp) NV_MK_VEC_FN(exp2) NV_MK_VEC_FN(log) NV_MK_VEC_FN(log2) NV_MK_VEC_FN(sqrt)
NV_MK_VEC_FN(rsqrt) NV_MK_VEC_FN(sin) NV_MK_VEC_FN(cos) NV_MK_VEC_FN(tanh) NV_MK_VEC_FN(floor)
NV_MK_VEC_FN(ceil) NV_MK_VEC_FN(round) NV_MK_VEC_FN(abs) NV_MK_VEC_FN(fabs) NV_MK_VEC_FN(popcount)
#undef NV_MK_VEC_FN
template <typename T, int N> __device__ __forceinline__ vec<T, N> max(vec<T, N> a, vec<T, N> b) {
  for (int i = 0; i < N; ++i) a[i] = b[i] > a[i] ? b[i] : a[i];
  return a;
}
template <typename T, int N> __device__ __forceinline__ vec<T, N> min(vec<T, N> a, vec<T, N> b) {
  for (int i = 0; i < N; ++i) a[i] = b[i] < a[i] ? b[i] : a[i];
  return a;
}

// Metal's common functions elementwise on vectors; a scalar bound, weight or edge is broadcast.
template <typename T, int N>
__device__ __forceinline__ vec<T, N> clamp(vec<T, N> x, typename nv_mk_id<vec<T, N>>::type lo,
                                           typename nv_mk_id<vec<T, N>>::type hi) {
  for (int i = 0; i < N; ++i) x[i] = x[i] < lo[i] ? lo[i] : (hi[i] < x[i] ? hi[i] : x[i]);
  return x;
}
template <typename T, int N> __device__ __forceinline__ vec<T, N> saturate(vec<T, N> x) { return clamp(x, T(0), T(1)); }
template <typename T, int N>
__device__ __forceinline__ vec<T, N> mix(vec<T, N> x, typename nv_mk_id<vec<T, N>>::type y,
                                         typename nv_mk_id<vec<T, N>>::type a) {
  for (int i = 0; i < N; ++i) x[i] = x[i] + (y[i] - x[i]) * a[i];
  return x;
}
template <typename T, int N> __device__ __forceinline__ vec<T, N> step(typename nv_mk_id<vec<T, N>>::type edge, vec<T, N> x) {
  for (int i = 0; i < N; ++i) x[i] = x[i] < edge[i] ? T(0) : T(1);
  return x;
}
template <typename T, int N> __device__ __forceinline__ vec<T, N> sign(vec<T, N> x) {
  for (int i = 0; i < N; ++i) x[i] = x[i] > T(0) ? T(1) : (x[i] < T(0) ? T(-1) : T(0));
  return x;
}

// Metal's limits, for the types kernels use them with.
template <typename T> struct numeric_limits;
template <> struct numeric_limits<float> {
  static __device__ __forceinline__ float infinity() { return __int_as_float(0x7f800000); }
  static __device__ __forceinline__ float max() { return 3.402823466e+38f; }
  static __device__ __forceinline__ float min() { return 1.175494351e-38f; }
  static __device__ __forceinline__ float lowest() { return -3.402823466e+38f; }
  static __device__ __forceinline__ float epsilon() { return 1.192092896e-07f; }
  static __device__ __forceinline__ float quiet_NaN() { return __int_as_float(0x7fffffff); }
};
template <> struct numeric_limits<__half> {
  static __device__ __forceinline__ __half infinity() { return __ushort_as_half(0x7c00); }
  static __device__ __forceinline__ __half max() { return __ushort_as_half(0x7bff); }
  static __device__ __forceinline__ __half lowest() { return __ushort_as_half(0xfbff); }
  static __device__ __forceinline__ __half epsilon() { return __ushort_as_half(0x1400); }
};
template <> struct numeric_limits<__nv_bfloat16> {
  static __device__ __forceinline__ __nv_bfloat16 infinity() { return __ushort_as_bfloat16(0x7f80); }
  static __device__ __forceinline__ __nv_bfloat16 max() { return __ushort_as_bfloat16(0x7f7f); }
  static __device__ __forceinline__ __nv_bfloat16 lowest() { return __ushort_as_bfloat16(0xff7f); }
};
template <> struct numeric_limits<int> {
  static __device__ __forceinline__ int max() { return 2147483647; }
  static __device__ __forceinline__ int min() { return -2147483647 - 1; }
  static __device__ __forceinline__ int lowest() { return -2147483647 - 1; }
};
template <> struct numeric_limits<unsigned int> {
  static __device__ __forceinline__ unsigned int max() { return 4294967295u; }
  static __device__ __forceinline__ unsigned int min() { return 0u; }
  static __device__ __forceinline__ unsigned int lowest() { return 0u; }
};
}  // namespace metal

// ---- SIMD-groups: Apple's are 32 lanes, like a warp ---------------------------------------
__device__ __forceinline__ unsigned nv_mk_lane() {
  unsigned l;
  asm volatile("mov.u32 %0, %%laneid;" : "=r"(l));
  return l;
}
template <typename T> struct nv_mk_is_half { static constexpr bool value = false; };
template <> struct nv_mk_is_half<__half> { static constexpr bool value = true; };
template <> struct nv_mk_is_half<__nv_bfloat16> { static constexpr bool value = true; };
// Shuffles of any scalar (types narrower than 32 bits go through int) and of vectors.
template <typename T> __device__ __forceinline__ T nv_mk_shfl(T v, int lane) {
  if constexpr (sizeof(T) < 4 && !nv_mk_is_half<T>::value) return static_cast<T>(__shfl_sync(0xffffffffu, static_cast<int>(v), lane));
  else return __shfl_sync(0xffffffffu, v, lane);
}
template <typename T> __device__ __forceinline__ T nv_mk_shfl_xor(T v, int m) {
  if constexpr (sizeof(T) < 4 && !nv_mk_is_half<T>::value) return static_cast<T>(__shfl_xor_sync(0xffffffffu, static_cast<int>(v), m));
  else return __shfl_xor_sync(0xffffffffu, v, m);
}
template <typename T> __device__ __forceinline__ T nv_mk_shfl_down(T v, unsigned d) {
  if constexpr (sizeof(T) < 4 && !nv_mk_is_half<T>::value) return static_cast<T>(__shfl_down_sync(0xffffffffu, static_cast<int>(v), d));
  else return __shfl_down_sync(0xffffffffu, v, d);
}
template <typename T> __device__ __forceinline__ T nv_mk_shfl_up(T v, unsigned d) {
  if constexpr (sizeof(T) < 4 && !nv_mk_is_half<T>::value) return static_cast<T>(__shfl_up_sync(0xffffffffu, static_cast<int>(v), d));
  else return __shfl_up_sync(0xffffffffu, v, d);
}
#define NV_MK_VEC_SHFL(F, A)                                                                       \
  template <typename T, int N> __device__ __forceinline__ metal::vec<T, N> F(metal::vec<T, N> v, A a) { \
    for (int i = 0; i < N; ++i) v[i] = F(v[i], a);                                                 \
    return v;                                                                                      \
  }
NV_MK_VEC_SHFL(nv_mk_shfl, int) NV_MK_VEC_SHFL(nv_mk_shfl_xor, int)
NV_MK_VEC_SHFL(nv_mk_shfl_down, unsigned) NV_MK_VEC_SHFL(nv_mk_shfl_up, unsigned)
#undef NV_MK_VEC_SHFL

template <typename T> __device__ __forceinline__ T simd_shuffle(T v, ushort lane) { return nv_mk_shfl(v, lane); }
template <typename T> __device__ __forceinline__ T simd_broadcast(T v, ushort lane) { return nv_mk_shfl(v, lane); }
template <typename T> __device__ __forceinline__ T simd_broadcast_first(T v) { return nv_mk_shfl(v, __ffs(__activemask()) - 1); }
template <typename T> __device__ __forceinline__ T simd_shuffle_xor(T v, ushort mask) { return nv_mk_shfl_xor(v, mask); }
template <typename T> __device__ __forceinline__ T simd_shuffle_down(T v, ushort d) { return nv_mk_shfl_down(v, d); }
template <typename T> __device__ __forceinline__ T simd_shuffle_up(T v, ushort d) { return nv_mk_shfl_up(v, d); }
// Butterfly reductions: every lane gets the result.
template <typename T> __device__ __forceinline__ T simd_sum(T v) {
  for (int o = 16; o > 0; o /= 2) v = v + nv_mk_shfl_xor(v, o);
  return v;
}
template <typename T> __device__ __forceinline__ T simd_product(T v) {
  for (int o = 16; o > 0; o /= 2) v = v * nv_mk_shfl_xor(v, o);
  return v;
}
template <typename T> __device__ __forceinline__ T simd_max(T v) {
  for (int o = 16; o > 0; o /= 2) v = max(v, nv_mk_shfl_xor(v, o));
  return v;
}
template <typename T> __device__ __forceinline__ T simd_min(T v) {
  for (int o = 16; o > 0; o /= 2) v = min(v, nv_mk_shfl_xor(v, o));
  return v;
}
template <typename T> __device__ __forceinline__ T simd_and(T v) {
  for (int o = 16; o > 0; o /= 2) v = v & nv_mk_shfl_xor(v, o);
  return v;
}
template <typename T> __device__ __forceinline__ T simd_or(T v) {
  for (int o = 16; o > 0; o /= 2) v = v | nv_mk_shfl_xor(v, o);
  return v;
}
template <typename T> __device__ __forceinline__ T simd_xor(T v) {
  for (int o = 16; o > 0; o /= 2) v = v ^ nv_mk_shfl_xor(v, o);
  return v;
}
// Scans over the lanes in order (Hillis-Steele).
template <typename T> __device__ __forceinline__ T simd_prefix_inclusive_sum(T v) {
  unsigned lane = nv_mk_lane();
  for (unsigned o = 1; o < 32; o *= 2) {
    T w = nv_mk_shfl_up(v, o);
    if (lane >= o) v = v + w;
  }
  return v;
}
template <typename T> __device__ __forceinline__ T simd_prefix_exclusive_sum(T v) {
  T s = nv_mk_shfl_up(simd_prefix_inclusive_sum(v), 1u);
  return nv_mk_lane() == 0 ? T(0) : s;
}
template <typename T> __device__ __forceinline__ T simd_prefix_inclusive_product(T v) {
  unsigned lane = nv_mk_lane();
  for (unsigned o = 1; o < 32; o *= 2) {
    T w = nv_mk_shfl_up(v, o);
    if (lane >= o) v = v * w;
  }
  return v;
}
template <typename T> __device__ __forceinline__ T simd_prefix_exclusive_product(T v) {
  T s = nv_mk_shfl_up(simd_prefix_inclusive_product(v), 1u);
  return nv_mk_lane() == 0 ? T(1) : s;
}
__device__ __forceinline__ bool simd_all(bool v) { return __all_sync(0xffffffffu, v); }
__device__ __forceinline__ bool simd_any(bool v) { return __any_sync(0xffffffffu, v); }
// `simd_ballot`'s mask: bit `l` is lane `l`'s vote (32 lanes, so the high half is zero).
struct simd_vote {
  typedef unsigned long long vote_t;
  vote_t v;
  __device__ __forceinline__ explicit constexpr simd_vote(vote_t m = 0) : v(m) {}
  __device__ __forceinline__ explicit constexpr operator vote_t() const { return v; }
  // Every active lane voted true (Metal: all bits of the SIMD-group's threads are set).
  __device__ __forceinline__ bool all() const { return v == (vote_t)__activemask(); }
  __device__ __forceinline__ bool any() const { return v != 0; }
};
__device__ __forceinline__ simd_vote simd_ballot(bool c) { return simd_vote(__ballot_sync(0xffffffffu, c)); }
__device__ __forceinline__ simd_vote simd_active_threads_mask() { return simd_vote(__activemask()); }
__device__ __forceinline__ bool simd_is_first() { return nv_mk_lane() == (unsigned)(__ffs(__activemask()) - 1); }

// ---- barriers ----------------------------------------------------------------------------
struct mem_flags {
  enum : unsigned { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
};
// A device fence first, so writes before the barrier are visible to the whole grid after it.
__device__ __forceinline__ void threadgroup_barrier(unsigned flags) {
  if (flags & mem_flags::mem_device) __threadfence();
  __syncthreads();
}
__device__ __forceinline__ void simdgroup_barrier(unsigned flags) {
  if (flags & mem_flags::mem_device) __threadfence();
  else if (flags & mem_flags::mem_threadgroup) __threadfence_block();
  __syncwarp();
}

// ---- atomics -----------------------------------------------------------------------------
// `atomic<T>` has the layout of `T`, so outputs are reinterpreted in place.
enum memory_order { memory_order_relaxed = 0 };
template <typename T> struct atomic {
  T v;
};
typedef atomic<int> atomic_int;
typedef atomic<unsigned int> atomic_uint;
typedef atomic<float> atomic_float;
typedef atomic<bool> atomic_bool;

template <typename T> __device__ __forceinline__ T atomic_load_explicit(const atomic<T>* o, memory_order) {
  return *reinterpret_cast<const volatile T*>(&o->v);
}
template <typename T> __device__ __forceinline__ void atomic_store_explicit(atomic<T>* o, typename nv_mk_id<T>::type x, memory_order) {
  *reinterpret_cast<volatile T*>(&o->v) = x;
}
template <typename T> __device__ __forceinline__ T atomic_exchange_explicit(atomic<T>* o, typename nv_mk_id<T>::type x, memory_order) {
  return atomicExch(&o->v, x);
}
template <typename T> __device__ __forceinline__ T atomic_fetch_add_explicit(atomic<T>* o, typename nv_mk_id<T>::type x, memory_order) {
  return atomicAdd(&o->v, x);
}
template <typename T> __device__ __forceinline__ T atomic_fetch_sub_explicit(atomic<T>* o, typename nv_mk_id<T>::type x, memory_order) {
  return atomicAdd(&o->v, -x);
}
template <typename T> __device__ __forceinline__ T atomic_fetch_max_explicit(atomic<T>* o, typename nv_mk_id<T>::type x, memory_order) {
  return atomicMax(&o->v, x);
}
template <typename T> __device__ __forceinline__ T atomic_fetch_min_explicit(atomic<T>* o, typename nv_mk_id<T>::type x, memory_order) {
  return atomicMin(&o->v, x);
}
template <typename T> __device__ __forceinline__ T atomic_fetch_and_explicit(atomic<T>* o, typename nv_mk_id<T>::type x, memory_order) {
  return atomicAnd(&o->v, x);
}
template <typename T> __device__ __forceinline__ T atomic_fetch_or_explicit(atomic<T>* o, typename nv_mk_id<T>::type x, memory_order) {
  return atomicOr(&o->v, x);
}
template <typename T> __device__ __forceinline__ T atomic_fetch_xor_explicit(atomic<T>* o, typename nv_mk_id<T>::type x, memory_order) {
  return atomicXor(&o->v, x);
}
// On failure `*expected` gets the value found, as in Metal.
template <typename T>
__device__ __forceinline__ bool atomic_compare_exchange_weak_explicit(atomic<T>* o, T* expected, typename nv_mk_id<T>::type desired,
                                                                      memory_order, memory_order) {
  T old;
  if constexpr (sizeof(T) == 4) {
    unsigned got = atomicCAS(reinterpret_cast<unsigned*>(&o->v), as_type<unsigned>(*expected), as_type<unsigned>(desired));
    old = as_type<T>(got);
  } else {
    old = atomicCAS(&o->v, *expected, desired);
  }
  bool ok = old == *expected;
  *expected = old;
  return ok;
}
__device__ __forceinline__ void atomic_thread_fence(unsigned flags, memory_order) {
  if (flags & mem_flags::mem_device) __threadfence();
  else __threadfence_block();
}

// `metal::` names the same functions (Metal kernels include <metal_stdlib> and use both forms).
namespace metal {
using ::abs; using ::acos; using ::asin; using ::atan; using ::ceil; using ::cos; using ::cosh; using ::erf;
using ::exp; using ::exp2; using ::expm1; using ::fabs; using ::floor; using ::fma; using ::fmax; using ::fmin;
using ::log; using ::log10; using ::log1p; using ::log2; using ::max; using ::min; using ::pow; using ::round;
using ::rsqrt; using ::sin; using ::sinh; using ::sqrt; using ::tan; using ::tanh; using ::trunc;
using ::clamp; using ::saturate; using ::select; using ::mix; using ::sign; using ::step; using ::fract; using ::divide;
using ::as_type; using ::simd_sum; using ::simd_max; using ::simd_min; using ::simd_product; using ::simd_shuffle;
using ::simd_shuffle_xor; using ::simd_shuffle_down; using ::simd_shuffle_up; using ::simd_broadcast;
using ::simd_broadcast_first; using ::simd_prefix_inclusive_sum; using ::simd_prefix_exclusive_sum;
using ::simd_all; using ::simd_any; using ::threadgroup_barrier; using ::simdgroup_barrier;
using ::simd_vote; using ::simd_ballot; using ::simd_active_threads_mask; using ::all; using ::any;
using ::popcount; using ::ctz; using ::clz;
using ::atomic; using ::memory_order; using ::memory_order_relaxed; using ::mem_flags;
using ::atomic_load_explicit; using ::atomic_store_explicit; using ::atomic_fetch_add_explicit;
using ::atomic_fetch_sub_explicit; using ::atomic_fetch_max_explicit; using ::atomic_fetch_min_explicit;
using ::atomic_exchange_explicit; using ::atomic_compare_exchange_weak_explicit;
namespace fast = ::fast;
namespace precise = ::precise;
}  // namespace metal

// Thread attributes, as the kernel's prologue declares them (only those the body mentions).
__device__ __forceinline__ unsigned nv_mk_thread_index() {
  return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}
