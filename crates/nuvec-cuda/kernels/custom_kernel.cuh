// The prelude of custom kernels (`fast::CudaKernel`): MLX's type names and helpers, so bodies
// written for `mx.fast.cuda_kernel` compile unchanged. Included as "nuvec_custom_kernel.cuh".
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cooperative_groups.h>

namespace cg = cooperative_groups;

#ifndef WARP_SIZE
#define WARP_SIZE 32
#endif
#ifndef MAX_NDIM
#define MAX_NDIM 10
#endif

// NVRTC has no <cstdint>.
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef unsigned int uint;
typedef __half float16_t;
typedef __nv_bfloat16 bfloat16_t;

struct __align__(8) complex64_t {
  float re, im;
  __device__ __forceinline__ float real() const { return re; }
  __device__ __forceinline__ float imag() const { return im; }
};
__device__ __forceinline__ complex64_t make_complex64(float re, float im) {
  complex64_t z;
  z.re = re;
  z.im = im;
  return z;
}
__device__ __forceinline__ complex64_t operator+(complex64_t a, complex64_t b) { return make_complex64(a.re + b.re, a.im + b.im); }
__device__ __forceinline__ complex64_t operator-(complex64_t a, complex64_t b) { return make_complex64(a.re - b.re, a.im - b.im); }
__device__ __forceinline__ complex64_t operator*(complex64_t a, complex64_t b) {
  return make_complex64(a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re);
}

// Shapes and strides (in elements) of inputs whose body mentions `name_shape` / `name_strides`,
// passed by value. `.data()` gives the pointer `elem_to_loc` takes, as in MLX.
struct Shape {
  int32_t v[MAX_NDIM];
  __device__ __forceinline__ const int32_t* data() const { return v; }
  __device__ __forceinline__ int32_t operator[](int i) const { return v[i]; }
};
struct Strides {
  int64_t v[MAX_NDIM];
  __device__ __forceinline__ const int64_t* data() const { return v; }
  __device__ __forceinline__ int64_t operator[](int i) const { return v[i]; }
};

// The offset (in elements) of row-major element `elem` of an array with these shape and
// strides. Signed arithmetic, so negative strides of reversed views work.
__device__ __forceinline__ int64_t elem_to_loc(int64_t elem, const int32_t* shape, const int64_t* strides, int ndim) {
  int64_t loc = 0;
  for (int i = ndim - 1; i >= 0 && elem > 0; --i) {
    loc += (elem % shape[i]) * strides[i];
    elem /= shape[i];
  }
  return loc;
}
__device__ __forceinline__ int64_t elem_to_loc(int64_t elem, const Shape& shape, const Strides& strides, int ndim) {
  return elem_to_loc(elem, shape.data(), strides.data(), ndim);
}

// Reductions across the 32 lanes of a warp; every lane gets the result.
template <typename T> __device__ __forceinline__ T warp_sum(T v) {
  for (int o = WARP_SIZE / 2; o > 0; o /= 2) v = v + __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <typename T> __device__ __forceinline__ T warp_max(T v) {
  for (int o = WARP_SIZE / 2; o > 0; o /= 2) {
    T w = __shfl_xor_sync(0xffffffffu, v, o);
    v = w > v ? w : v;
  }
  return v;
}
template <typename T> __device__ __forceinline__ T warp_min(T v) {
  for (int o = WARP_SIZE / 2; o > 0; o /= 2) {
    T w = __shfl_xor_sync(0xffffffffu, v, o);
    v = w < v ? w : v;
  }
  return v;
}

// CUDA's half types convert both to and from the built-in arithmetic types, so `h * 3` is
// ambiguous. These overloads settle it: with an integer the result keeps the half type
// (computed in float, rounded once); with float or double it widens to that type.
#define NV_CK_HALF_INT_OPS(H, TO_F, FROM_F, U)                                                    \
  __device__ __forceinline__ H operator+(H a, U b) { return FROM_F(TO_F(a) + (float)b); }         \
  __device__ __forceinline__ H operator-(H a, U b) { return FROM_F(TO_F(a) - (float)b); }         \
  __device__ __forceinline__ H operator*(H a, U b) { return FROM_F(TO_F(a) * (float)b); }         \
  __device__ __forceinline__ H operator/(H a, U b) { return FROM_F(TO_F(a) / (float)b); }         \
  __device__ __forceinline__ H operator+(U a, H b) { return FROM_F((float)a + TO_F(b)); }         \
  __device__ __forceinline__ H operator-(U a, H b) { return FROM_F((float)a - TO_F(b)); }         \
  __device__ __forceinline__ H operator*(U a, H b) { return FROM_F((float)a * TO_F(b)); }         \
  __device__ __forceinline__ H operator/(U a, H b) { return FROM_F((float)a / TO_F(b)); }         \
  __device__ __forceinline__ bool operator==(H a, U b) { return TO_F(a) == (float)b; }            \
  __device__ __forceinline__ bool operator!=(H a, U b) { return TO_F(a) != (float)b; }            \
  __device__ __forceinline__ bool operator<(H a, U b) { return TO_F(a) < (float)b; }              \
  __device__ __forceinline__ bool operator>(H a, U b) { return TO_F(a) > (float)b; }              \
  __device__ __forceinline__ bool operator<=(H a, U b) { return TO_F(a) <= (float)b; }            \
  __device__ __forceinline__ bool operator>=(H a, U b) { return TO_F(a) >= (float)b; }            \
  __device__ __forceinline__ bool operator==(U a, H b) { return (float)a == TO_F(b); }            \
  __device__ __forceinline__ bool operator!=(U a, H b) { return (float)a != TO_F(b); }            \
  __device__ __forceinline__ bool operator<(U a, H b) { return (float)a < TO_F(b); }              \
  __device__ __forceinline__ bool operator>(U a, H b) { return (float)a > TO_F(b); }              \
  __device__ __forceinline__ bool operator<=(U a, H b) { return (float)a <= TO_F(b); }            \
  __device__ __forceinline__ bool operator>=(U a, H b) { return (float)a >= TO_F(b); }

#define NV_CK_HALF_FLOAT_OPS(H, TO_F, F)                                                          \
  __device__ __forceinline__ F operator+(H a, F b) { return (F)TO_F(a) + b; }                     \
  __device__ __forceinline__ F operator-(H a, F b) { return (F)TO_F(a) - b; }                     \
  __device__ __forceinline__ F operator*(H a, F b) { return (F)TO_F(a) * b; }                     \
  __device__ __forceinline__ F operator/(H a, F b) { return (F)TO_F(a) / b; }                     \
  __device__ __forceinline__ F operator+(F a, H b) { return a + (F)TO_F(b); }                     \
  __device__ __forceinline__ F operator-(F a, H b) { return a - (F)TO_F(b); }                     \
  __device__ __forceinline__ F operator*(F a, H b) { return a * (F)TO_F(b); }                     \
  __device__ __forceinline__ F operator/(F a, H b) { return a / (F)TO_F(b); }                     \
  __device__ __forceinline__ bool operator==(H a, F b) { return (F)TO_F(a) == b; }                \
  __device__ __forceinline__ bool operator!=(H a, F b) { return (F)TO_F(a) != b; }                \
  __device__ __forceinline__ bool operator<(H a, F b) { return (F)TO_F(a) < b; }                  \
  __device__ __forceinline__ bool operator>(H a, F b) { return (F)TO_F(a) > b; }                  \
  __device__ __forceinline__ bool operator<=(H a, F b) { return (F)TO_F(a) <= b; }                \
  __device__ __forceinline__ bool operator>=(H a, F b) { return (F)TO_F(a) >= b; }                \
  __device__ __forceinline__ bool operator==(F a, H b) { return a == (F)TO_F(b); }                \
  __device__ __forceinline__ bool operator!=(F a, H b) { return a != (F)TO_F(b); }                \
  __device__ __forceinline__ bool operator<(F a, H b) { return a < (F)TO_F(b); }                  \
  __device__ __forceinline__ bool operator>(F a, H b) { return a > (F)TO_F(b); }                  \
  __device__ __forceinline__ bool operator<=(F a, H b) { return a <= (F)TO_F(b); }                \
  __device__ __forceinline__ bool operator>=(F a, H b) { return a >= (F)TO_F(b); }

#define NV_CK_HALF_OPS(H, TO_F, FROM_F)                \
  NV_CK_HALF_INT_OPS(H, TO_F, FROM_F, signed char)     \
  NV_CK_HALF_INT_OPS(H, TO_F, FROM_F, unsigned char)   \
  NV_CK_HALF_INT_OPS(H, TO_F, FROM_F, short)           \
  NV_CK_HALF_INT_OPS(H, TO_F, FROM_F, unsigned short)  \
  NV_CK_HALF_INT_OPS(H, TO_F, FROM_F, int)             \
  NV_CK_HALF_INT_OPS(H, TO_F, FROM_F, unsigned int)    \
  NV_CK_HALF_INT_OPS(H, TO_F, FROM_F, long)            \
  NV_CK_HALF_INT_OPS(H, TO_F, FROM_F, unsigned long)   \
  NV_CK_HALF_INT_OPS(H, TO_F, FROM_F, long long)       \
  NV_CK_HALF_INT_OPS(H, TO_F, FROM_F, unsigned long long) \
  NV_CK_HALF_FLOAT_OPS(H, TO_F, float)                 \
  NV_CK_HALF_FLOAT_OPS(H, TO_F, double)

NV_CK_HALF_OPS(__half, __half2float, __float2half_rn)
NV_CK_HALF_OPS(__nv_bfloat16, __bfloat162float, __float2bfloat16_rn)

#undef NV_CK_HALF_OPS
#undef NV_CK_HALF_FLOAT_OPS
#undef NV_CK_HALF_INT_OPS
