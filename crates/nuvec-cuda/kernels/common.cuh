// Shared definitions of nuvec's CUDA kernels: element types, the precision each computes in,
// and strided indexing. Compiled by NVRTC; the only headers used are CUDA's fp16/bf16 ones.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>

// NVRTC has no <math.h> macros.
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fffffff)
#endif

// Element types by their standard names, which the generated kernel wrappers use (kernels.rs:
// `ctype`; core's custom-kernel generator uses the same names), and by the short names of the
// templates. NVRTC has no <cstdint>; host compilers (the bench/cuda harnesses) take theirs.
#ifdef __CUDACC_RTC__
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
#else
#include <cstdint>
#endif
typedef signed char i8;
typedef short i16;
typedef int i32;
typedef long long i64;
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef __half f16;
typedef __nv_bfloat16 bf16;

// Programmatic dependent launch (sm_90+; launch.rs's `launch_dependent`). A kernel launched
// that way may start while the kernel before it on the stream is still running; it waits here
// for that kernel to finish and its writes to be visible before touching memory, then lets the
// next kernel start its own launch. So, after another kernel of this kind, a kernel's launch
// and ramp-up overlap the previous one's last blocks (see bench/results/); after any other
// kernel only the launch is saved (that one lets its dependents
// start when it exits). Called first in every kernel that may be launched so; a no-op in a
// plain launch.
__device__ __forceinline__ void nv_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

struct __align__(8) c64 {
  float re, im;
};
__device__ __forceinline__ c64 make_c64(float re, float im) { c64 z; z.re = re; z.im = im; return z; }
__device__ __forceinline__ c64 operator+(c64 a, c64 b) { return make_c64(a.re + b.re, a.im + b.im); }
__device__ __forceinline__ c64 operator-(c64 a, c64 b) { return make_c64(a.re - b.re, a.im - b.im); }
// Explicit roundings (no fused multiply-add), so results match the CPU bit for bit.
__device__ __forceinline__ c64 operator*(c64 a, c64 b) {
  return make_c64(__fsub_rn(__fmul_rn(a.re, b.re), __fmul_rn(a.im, b.im)),
                  __fadd_rn(__fmul_rn(a.re, b.im), __fmul_rn(a.im, b.re)));
}
__device__ __forceinline__ c64 operator/(c64 a, c64 b) {
  float d = __fadd_rn(__fmul_rn(b.re, b.re), __fmul_rn(b.im, b.im));
  return make_c64(__fdiv_rn(__fadd_rn(__fmul_rn(a.re, b.re), __fmul_rn(a.im, b.im)), d),
                  __fdiv_rn(__fsub_rn(__fmul_rn(a.im, b.re), __fmul_rn(a.re, b.im)), d));
}
__device__ __forceinline__ bool operator==(c64 a, c64 b) { return a.re == b.re && a.im == b.im; }
__device__ __forceinline__ bool operator!=(c64 a, c64 b) { return !(a == b); }
// complex64_t is this c64 here: custom kernels' own prelude (custom_kernel.cuh) defines a
// different complex64_t, so the two headers are not meant to be included together.
typedef c64 complex64_t;

// The precision an element type computes in: half types widen to float.
template <typename T> struct Acc { typedef T type; };
template <> struct Acc<f16> { typedef float type; };
template <> struct Acc<bf16> { typedef float type; };

template <typename T> __device__ __forceinline__ typename Acc<T>::type widen(T x) { return x; }
template <> __device__ __forceinline__ float widen<f16>(f16 x) { return __half2float(x); }
template <> __device__ __forceinline__ float widen<bf16>(bf16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T narrow(typename Acc<T>::type x) { return x; }
template <> __device__ __forceinline__ f16 narrow<f16>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ bf16 narrow<bf16>(float x) { return __float2bfloat16_rn(x); }

// Conversions between any two element types, with the CPU backend's semantics: integers wrap,
// floats saturate into integers (NaN gives 0, as Rust's `as`), non-zero is true, complex to
// real keeps the real part. Every source goes through a carrier: i64, u64, double or c64.
__device__ __forceinline__ i64 carry(i8 x) { return x; }
__device__ __forceinline__ i64 carry(i16 x) { return x; }
__device__ __forceinline__ i64 carry(i32 x) { return x; }
__device__ __forceinline__ i64 carry(i64 x) { return x; }
__device__ __forceinline__ u64 carry(bool x) { return x ? 1 : 0; }
__device__ __forceinline__ u64 carry(u8 x) { return x; }
__device__ __forceinline__ u64 carry(u16 x) { return x; }
__device__ __forceinline__ u64 carry(u32 x) { return x; }
__device__ __forceinline__ u64 carry(u64 x) { return x; }
__device__ __forceinline__ float carry(f16 x) { return __half2float(x); }
__device__ __forceinline__ float carry(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float carry(float x) { return x; }
__device__ __forceinline__ double carry(double x) { return x; }
__device__ __forceinline__ c64 carry(c64 x) { return x; }

template <typename D> struct Lim;
#define NV_LIM(T, LO, HI, MAXV) \
  template <> struct Lim<T> { \
    static __device__ __forceinline__ double lo() { return LO; } \
    static __device__ __forceinline__ double hi() { return HI; } \
    static __device__ __forceinline__ T max() { return MAXV; } \
  };
NV_LIM(u8, 0.0, 255.0, (u8)255)
NV_LIM(u16, 0.0, 65535.0, (u16)65535)
NV_LIM(u32, 0.0, 4294967295.0, (u32)4294967295u)
NV_LIM(u64, 0.0, 18446744073709551616.0, (u64)0xffffffffffffffffULL)
NV_LIM(i8, -128.0, 127.0, (i8)127)
NV_LIM(i16, -32768.0, 32767.0, (i16)32767)
NV_LIM(i32, -2147483648.0, 2147483647.0, (i32)2147483647)
NV_LIM(i64, -9223372036854775808.0, 9223372036854775808.0, (i64)0x7fffffffffffffffLL)

template <typename D> struct From {
  // Integer destinations.
  __device__ static D i(i64 v) { return (D)v; }
  __device__ static D u(u64 v) { return (D)v; }
  __device__ static D f(double v) {
    if (v != v) return (D)0;
    if (v <= Lim<D>::lo()) return (D)Lim<D>::lo();
    if (v >= Lim<D>::hi()) return Lim<D>::max();
    return (D)v;
  }
  __device__ static D c(c64 v) { return f((double)v.re); }
};
template <> struct From<bool> {
  __device__ static bool i(i64 v) { return v != 0; }
  __device__ static bool u(u64 v) { return v != 0; }
  __device__ static bool f(double v) { return v != 0.0; }
  __device__ static bool c(c64 v) { return v.re != 0.0f || v.im != 0.0f; }
};
template <> struct From<float> {
  __device__ static float i(i64 v) { return (float)v; }
  __device__ static float u(u64 v) { return (float)v; }
  __device__ static float f(double v) { return (float)v; }
  __device__ static float c(c64 v) { return v.re; }
};
template <> struct From<double> {
  __device__ static double i(i64 v) { return (double)v; }
  __device__ static double u(u64 v) { return (double)v; }
  __device__ static double f(double v) { return v; }
  __device__ static double c(c64 v) { return (double)v.re; }
};
template <> struct From<f16> {
  __device__ static f16 i(i64 v) { return __double2half((double)v); }
  __device__ static f16 u(u64 v) { return __double2half((double)v); }
  __device__ static f16 f(double v) { return __double2half(v); }
  __device__ static f16 c(c64 v) { return __float2half_rn(v.re); }
};
template <> struct From<bf16> {
  __device__ static bf16 i(i64 v) { return __double2bfloat16((double)v); }
  __device__ static bf16 u(u64 v) { return __double2bfloat16((double)v); }
  __device__ static bf16 f(double v) { return __double2bfloat16(v); }
  __device__ static bf16 c(c64 v) { return __float2bfloat16_rn(v.re); }
};
template <> struct From<c64> {
  __device__ static c64 i(i64 v) { return make_c64((float)v, 0.0f); }
  __device__ static c64 u(u64 v) { return make_c64((float)v, 0.0f); }
  __device__ static c64 f(double v) { return make_c64((float)v, 0.0f); }
  __device__ static c64 c(c64 v) { return v; }
};

template <typename D> __device__ __forceinline__ D from_carrier(i64 v) { return From<D>::i(v); }
template <typename D> __device__ __forceinline__ D from_carrier(u64 v) { return From<D>::u(v); }
template <typename D> __device__ __forceinline__ D from_carrier(float v) {
  return From<D>::f((double)v);
}
template <> __device__ __forceinline__ f16 from_carrier<f16>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ bf16 from_carrier<bf16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ float from_carrier<float>(float v) { return v; }
template <typename D> __device__ __forceinline__ D from_carrier(double v) { return From<D>::f(v); }
template <typename D> __device__ __forceinline__ D from_carrier(c64 v) { return From<D>::c(v); }

template <typename D, typename S> __device__ __forceinline__ D convert(S x) { return from_carrier<D>(carry(x)); }

// Whether x is non-zero (NaN is): convert<bool> without the detour through the carrier types.
template <typename T> __device__ __forceinline__ bool truthy(T x) { return x != T(0); }
template <> __device__ __forceinline__ bool truthy<bool>(bool x) { return x; }
template <> __device__ __forceinline__ bool truthy<f16>(f16 x) { return __half2float(x) != 0.0f; }
template <> __device__ __forceinline__ bool truthy<bf16>(bf16 x) { return __bfloat162float(x) != 0.0f; }
template <> __device__ __forceinline__ bool truthy<c64>(c64 x) { return x.re != 0.0f || x.im != 0.0f; }

// Strided indexing over at most NV_MAX_DIMS collapsed axes.
#define NV_MAX_DIMS 10
struct Dims {
  i64 shape[NV_MAX_DIMS];
  i64 strides[4][NV_MAX_DIMS];
  int ndim;
};

// `d` is read with constant indices only (loops over NV_MAX_DIMS, unrolled, guarded by
// `ndim`): a run-time index into a by-value kernel parameter makes every thread copy the whole
// struct to local memory, which made strided kernels a third as fast.

// `v[a]`.
__device__ __forceinline__ i64 dims_at(const i64 (&v)[NV_MAX_DIMS], int a) {
  i64 r = 0;
#pragma unroll
  for (int j = 0; j < NV_MAX_DIMS; ++j)
    if (j == a) r = v[j];
  return r;
}

// Offset of element `i` (row-major order over `shape`) in operand `k`.
__device__ __forceinline__ i64 offset_of(const Dims& d, int k, i64 i) {
  i64 off = 0;
#pragma unroll
  for (int a = NV_MAX_DIMS - 1; a >= 0; --a) {
    if (a < d.ndim) {
      i64 q = i / d.shape[a];
      off += (i - q * d.shape[a]) * d.strides[k][a];
      i = q;
    }
  }
  return off;
}

template <typename T, int N> struct __align__(sizeof(T) * N) Vec {
  T v[N];
};

// Warp and block reductions.
template <typename T, typename F> __device__ __forceinline__ T warp_reduce(T x, F f) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = f(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// Identities of the reductions for each element type.
template <typename T> struct Make0 {
  __device__ static T zero() { return (T)0; }
  __device__ static T one() { return (T)1; }
  __device__ static T lowest() { return ((T)-1 < (T)0) ? (T)((u64)1 << (sizeof(T) * 8 - 1)) : (T)0; }
  __device__ static T highest() { return ((T)-1 < (T)0) ? (T)~((u64)1 << (sizeof(T) * 8 - 1)) : (T)~(T)0; }
};
template <> struct Make0<bool> {
  __device__ static bool zero() { return false; }
  __device__ static bool one() { return true; }
  __device__ static bool lowest() { return false; }
  __device__ static bool highest() { return true; }
};
#define NV_MAKE0_FLOAT(T, CONV)                                             \
  template <> struct Make0<T> {                                             \
    __device__ static T zero() { return CONV(0.0f); }                       \
    __device__ static T one() { return CONV(1.0f); }                        \
    __device__ static T lowest() { return CONV(-INFINITY); }                \
    __device__ static T highest() { return CONV(INFINITY); }                \
  };
#define NV_ID(x) (x)
NV_MAKE0_FLOAT(float, NV_ID)
NV_MAKE0_FLOAT(double, (double))
NV_MAKE0_FLOAT(f16, __float2half_rn)
NV_MAKE0_FLOAT(bf16, __float2bfloat16_rn)
template <> struct Make0<c64> {
  __device__ static c64 zero() { return make_c64(0.0f, 0.0f); }
  __device__ static c64 one() { return make_c64(1.0f, 0.0f); }
  __device__ static c64 lowest() { return make_c64(-INFINITY, -INFINITY); }
  __device__ static c64 highest() { return make_c64(INFINITY, INFINITY); }
};

#define NV_INT_TYPES(X) X(u8) X(u16) X(u32) X(u64) X(i8) X(i16) X(i32) X(i64)
template <typename T> struct IsInt { static const bool value = false; };
#define NV_IS_INT(T) template <> struct IsInt<T> { static const bool value = true; };
NV_INT_TYPES(NV_IS_INT)

// ---- Half-precision tensor-core fragments (attention, quantized_matmul) -------------------

template <typename T> struct IsBf16 { static const bool value = false; };
template <> struct IsBf16<bf16> { static const bool value = true; };

// c += a · b on tensor cores: mma.sync m16n8k16, f16 or bf16 in (T), f32 accumulate.
template <typename T>
__device__ __forceinline__ void mma_m16n8k16(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  if constexpr (IsBf16<T>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Four 8×8 tiles of 16-bit elements from shared memory (ldmatrix): lanes 8j .. 8j + 8 give the
// addresses of tile j's rows; _t transposes each tile.
__device__ __forceinline__ void ldsm_x4(u32 (&r)[4], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(u32 (&r)[4], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Two floats rounded to T and packed in one register (x in the low half).
template <typename T> __device__ __forceinline__ u32 pack_half2(float x, float y) {
  if constexpr (IsBf16<T>::value) {
    __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    return *reinterpret_cast<u32*>(&h);
  } else {
    __half2 h = __floats2half2_rn(x, y);
    return *reinterpret_cast<u32*>(&h);
  }
}
