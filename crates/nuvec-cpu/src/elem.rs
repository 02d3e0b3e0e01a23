//! Element types as kernels see them, with the arithmetic each dtype defines.
//!
//! `bool` is stored as one byte; kernels see it as [`B8`], whose arithmetic is logical
//! (`+` is or, `*` is and), which is what MLX's boolean arithmetic gives.

use bytemuck::{Pod, Zeroable};
use half::{bf16, f16};
use nuvec_core::DType;
use nuvec_core::dtype::Complex64;

/// A boolean stored as a byte holding 0 or 1.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Pod, Zeroable)]
#[repr(transparent)]
pub struct B8(pub u8);

impl B8 {
    /// From a Rust bool.
    #[inline(always)]
    pub fn new(b: bool) -> B8 {
        B8(b as u8)
    }
    /// As a Rust bool.
    #[inline(always)]
    pub fn get(self) -> bool {
        self.0 != 0
    }
}

/// Runs `$body` with `$T` bound to the kernel type of `$dtype`.
#[macro_export]
#[doc(hidden)]
macro_rules! for_all {
    ($dtype:expr, $T:ident => $body:expr) => {{
        #[allow(unused_imports)]
        use half::{bf16, f16};
        use $crate::elem::B8;
        match $dtype {
            nuvec_core::DType::Bool => {
                type $T = B8;
                $body
            }
            nuvec_core::DType::U8 => {
                type $T = u8;
                $body
            }
            nuvec_core::DType::U16 => {
                type $T = u16;
                $body
            }
            nuvec_core::DType::U32 => {
                type $T = u32;
                $body
            }
            nuvec_core::DType::U64 => {
                type $T = u64;
                $body
            }
            nuvec_core::DType::I8 => {
                type $T = i8;
                $body
            }
            nuvec_core::DType::I16 => {
                type $T = i16;
                $body
            }
            nuvec_core::DType::I32 => {
                type $T = i32;
                $body
            }
            nuvec_core::DType::I64 => {
                type $T = i64;
                $body
            }
            nuvec_core::DType::F16 => {
                type $T = f16;
                $body
            }
            nuvec_core::DType::BF16 => {
                type $T = bf16;
                $body
            }
            nuvec_core::DType::F32 => {
                type $T = f32;
                $body
            }
            nuvec_core::DType::F64 => {
                type $T = f64;
                $body
            }
            nuvec_core::DType::Complex64 => {
                type $T = nuvec_core::dtype::Complex64;
                $body
            }
            #[allow(unreachable_patterns)]
            d => Err($crate::unsupported(d)),
        }
    }};
}

/// Runs `$body` with `$T` bound to the kernel type of a real (non-complex) `$dtype`.
#[macro_export]
#[doc(hidden)]
macro_rules! for_real {
    ($dtype:expr, $T:ident => $body:expr) => {{
        #[allow(unused_imports)]
        use half::{bf16, f16};
        use $crate::elem::B8;
        match $dtype {
            nuvec_core::DType::Bool => {
                type $T = B8;
                $body
            }
            nuvec_core::DType::U8 => {
                type $T = u8;
                $body
            }
            nuvec_core::DType::U16 => {
                type $T = u16;
                $body
            }
            nuvec_core::DType::U32 => {
                type $T = u32;
                $body
            }
            nuvec_core::DType::U64 => {
                type $T = u64;
                $body
            }
            nuvec_core::DType::I8 => {
                type $T = i8;
                $body
            }
            nuvec_core::DType::I16 => {
                type $T = i16;
                $body
            }
            nuvec_core::DType::I32 => {
                type $T = i32;
                $body
            }
            nuvec_core::DType::I64 => {
                type $T = i64;
                $body
            }
            nuvec_core::DType::F16 => {
                type $T = f16;
                $body
            }
            nuvec_core::DType::BF16 => {
                type $T = bf16;
                $body
            }
            nuvec_core::DType::F32 => {
                type $T = f32;
                $body
            }
            nuvec_core::DType::F64 => {
                type $T = f64;
                $body
            }
            d => Err($crate::unsupported(d)),
        }
    }};
}

/// Runs `$body` with `$T` bound to the kernel type of a floating `$dtype`.
#[macro_export]
#[doc(hidden)]
macro_rules! for_float {
    ($dtype:expr, $T:ident => $body:expr) => {{
        #[allow(unused_imports)]
        use half::{bf16, f16};
        match $dtype {
            nuvec_core::DType::F16 => {
                type $T = f16;
                $body
            }
            nuvec_core::DType::BF16 => {
                type $T = bf16;
                $body
            }
            nuvec_core::DType::F32 => {
                type $T = f32;
                $body
            }
            nuvec_core::DType::F64 => {
                type $T = f64;
                $body
            }
            d => Err($crate::unsupported(d)),
        }
    }};
}

/// Runs `$body` with `$T` bound to the kernel type of a boolean or integer `$dtype`.
#[macro_export]
#[doc(hidden)]
macro_rules! for_int {
    ($dtype:expr, $T:ident => $body:expr) => {{
        use $crate::elem::B8;
        match $dtype {
            nuvec_core::DType::Bool => {
                type $T = B8;
                $body
            }
            nuvec_core::DType::U8 => {
                type $T = u8;
                $body
            }
            nuvec_core::DType::U16 => {
                type $T = u16;
                $body
            }
            nuvec_core::DType::U32 => {
                type $T = u32;
                $body
            }
            nuvec_core::DType::U64 => {
                type $T = u64;
                $body
            }
            nuvec_core::DType::I8 => {
                type $T = i8;
                $body
            }
            nuvec_core::DType::I16 => {
                type $T = i16;
                $body
            }
            nuvec_core::DType::I32 => {
                type $T = i32;
                $body
            }
            nuvec_core::DType::I64 => {
                type $T = i64;
                $body
            }
            d => Err($crate::unsupported(d)),
        }
    }};
}

/// Conversions every element type has, for casts (C-style: wrap between integers, truncate
/// floats into integers, non-zero is true, complex to real keeps the real part).
pub trait Cast: Copy {
    /// From a signed integer.
    fn from_i64(v: i64) -> Self;
    /// From an unsigned integer.
    fn from_u64(v: u64) -> Self;
    /// From a single-precision float.
    fn from_f32(v: f32) -> Self;
    /// From a double-precision float.
    fn from_f64(v: f64) -> Self;
    /// From a complex number.
    fn from_c64(v: Complex64) -> Self;
    /// Converts into another element type.
    fn cast<D: Cast>(self) -> D;
    /// The value as `f64` (real part of complex).
    fn to_f64(self) -> f64;
}

macro_rules! cast_int {
    ($($t:ty => $via:ident),*) => {$(
        impl Cast for $t {
            #[inline(always)] fn from_i64(v: i64) -> Self { v as $t }
            #[inline(always)] fn from_u64(v: u64) -> Self { v as $t }
            #[inline(always)] fn from_f32(v: f32) -> Self { v as $t }
            #[inline(always)] fn from_f64(v: f64) -> Self { v as $t }
            #[inline(always)] fn from_c64(v: Complex64) -> Self { v.re as $t }
            #[inline(always)] fn cast<D: Cast>(self) -> D { D::$via(self as _) }
            #[inline(always)] fn to_f64(self) -> f64 { self as f64 }
        }
    )*};
}
cast_int!(u8 => from_u64, u16 => from_u64, u32 => from_u64, u64 => from_u64,
    i8 => from_i64, i16 => from_i64, i32 => from_i64, i64 => from_i64);

impl Cast for B8 {
    #[inline(always)]
    fn from_i64(v: i64) -> Self {
        B8::new(v != 0)
    }
    #[inline(always)]
    fn from_u64(v: u64) -> Self {
        B8::new(v != 0)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        B8::new(v != 0.0)
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        B8::new(v != 0.0)
    }
    #[inline(always)]
    fn from_c64(v: Complex64) -> Self {
        B8::new(v.re != 0.0 || v.im != 0.0)
    }
    #[inline(always)]
    fn cast<D: Cast>(self) -> D {
        D::from_u64(self.0 as u64)
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self.0 as f64
    }
}

impl Cast for f32 {
    #[inline(always)]
    fn from_i64(v: i64) -> Self {
        v as f32
    }
    #[inline(always)]
    fn from_u64(v: u64) -> Self {
        v as f32
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    #[inline(always)]
    fn from_c64(v: Complex64) -> Self {
        v.re
    }
    #[inline(always)]
    fn cast<D: Cast>(self) -> D {
        D::from_f32(self)
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as f64
    }
}

impl Cast for f64 {
    #[inline(always)]
    fn from_i64(v: i64) -> Self {
        v as f64
    }
    #[inline(always)]
    fn from_u64(v: u64) -> Self {
        v as f64
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v as f64
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v
    }
    #[inline(always)]
    fn from_c64(v: Complex64) -> Self {
        v.re as f64
    }
    #[inline(always)]
    fn cast<D: Cast>(self) -> D {
        D::from_f64(self)
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self
    }
}

macro_rules! cast_half {
    ($($t:ty),*) => {$(
        impl Cast for $t {
            #[inline(always)] fn from_i64(v: i64) -> Self { <$t>::from_f64(v as f64) }
            #[inline(always)] fn from_u64(v: u64) -> Self { <$t>::from_f64(v as f64) }
            #[inline(always)] fn from_f32(v: f32) -> Self { <$t>::from_f32(v) }
            #[inline(always)] fn from_f64(v: f64) -> Self { <$t>::from_f64(v) }
            #[inline(always)] fn from_c64(v: Complex64) -> Self { <$t>::from_f32(v.re) }
            #[inline(always)] fn cast<D: Cast>(self) -> D { D::from_f32(self.to_f32()) }
            #[inline(always)] fn to_f64(self) -> f64 { <$t>::to_f64(self) }
        }
    )*};
}
cast_half!(f16, bf16);

impl Cast for Complex64 {
    #[inline(always)]
    fn from_i64(v: i64) -> Self {
        Complex64::new(v as f32, 0.0)
    }
    #[inline(always)]
    fn from_u64(v: u64) -> Self {
        Complex64::new(v as f32, 0.0)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        Complex64::new(v, 0.0)
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        Complex64::new(v as f32, 0.0)
    }
    #[inline(always)]
    fn from_c64(v: Complex64) -> Self {
        v
    }
    #[inline(always)]
    fn cast<D: Cast>(self) -> D {
        D::from_c64(self)
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self.re as f64
    }
}

/// What every kernel element type is.
pub trait Elem: Pod + Cast + PartialEq + Send + Sync + std::fmt::Debug + 'static {
    /// The dtype this type carries.
    const DTYPE: DType;
}

macro_rules! elem {
    ($($t:ty => $d:ident),*) => {$( impl Elem for $t { const DTYPE: DType = DType::$d; } )*};
}
elem!(B8 => Bool, u8 => U8, u16 => U16, u32 => U32, u64 => U64, i8 => I8, i16 => I16, i32 => I32,
    i64 => I64, f16 => F16, bf16 => BF16, f32 => F32, f64 => F64, Complex64 => Complex64);

/// Arithmetic with MLX's semantics for the type: integers wrap, integer division by zero gives
/// zero (rather than trapping), floor division and remainder follow Python, `max`/`min`
/// propagate NaN.
pub trait Num: Elem {
    /// Additive identity.
    fn zero() -> Self;
    /// Multiplicative identity.
    fn one() -> Self;
    /// `a + b`.
    fn add(self, b: Self) -> Self;
    /// `a - b`.
    fn sub(self, b: Self) -> Self;
    /// `a * b`.
    fn mul(self, b: Self) -> Self;
    /// `a / b`.
    fn div(self, b: Self) -> Self;
    /// `floor(a / b)`.
    fn floor_div(self, b: Self) -> Self;
    /// Remainder with the sign of `b`.
    fn rem(self, b: Self) -> Self;
    /// `a ^ b`.
    fn pow(self, b: Self) -> Self;
    /// Larger (NaN wins).
    fn max(self, b: Self) -> Self;
    /// Smaller (NaN wins).
    fn min(self, b: Self) -> Self;
    /// `a < b`.
    fn lt(self, b: Self) -> bool;
    /// `a <= b`.
    fn le(self, b: Self) -> bool;
    /// `-a`.
    fn neg(self) -> Self;
    /// `|a|`.
    fn abs(self) -> Self;
    /// −1, 0 or 1.
    fn sign(self) -> Self;
    /// Whether the value is NaN.
    fn is_nan(self) -> bool {
        false
    }
    /// The smallest value (−∞ for floats), the identity of `max`.
    fn lowest() -> Self;
    /// The largest value (+∞ for floats), the identity of `min`.
    fn highest() -> Self;
}

macro_rules! num_int {
    ($($t:ty, $signed:tt);*) => {$(
        impl Num for $t {
            #[inline(always)] fn zero() -> Self { 0 }
            #[inline(always)] fn one() -> Self { 1 }
            #[inline(always)] fn add(self, b: Self) -> Self { self.wrapping_add(b) }
            #[inline(always)] fn sub(self, b: Self) -> Self { self.wrapping_sub(b) }
            #[inline(always)] fn mul(self, b: Self) -> Self { self.wrapping_mul(b) }
            #[inline(always)] fn div(self, b: Self) -> Self { if b == 0 { 0 } else { self.wrapping_div(b) } }
            #[inline(always)] fn floor_div(self, b: Self) -> Self {
                if b == 0 { return 0; }
                let q = self.wrapping_div(b);
                num_int!(@floor $signed, self, b, q)
            }
            #[inline(always)] fn rem(self, b: Self) -> Self {
                if b == 0 { return 0; }
                let r = self.wrapping_rem(b);
                num_int!(@rem $signed, r, b)
            }
            #[inline(always)] fn pow(self, b: Self) -> Self { int_pow(self as i128, b as i128) as $t }
            #[inline(always)] fn max(self, b: Self) -> Self { if self > b { self } else { b } }
            #[inline(always)] fn min(self, b: Self) -> Self { if self < b { self } else { b } }
            #[inline(always)] fn lt(self, b: Self) -> bool { self < b }
            #[inline(always)] fn le(self, b: Self) -> bool { self <= b }
            #[inline(always)] fn neg(self) -> Self { self.wrapping_neg() }
            #[inline(always)] fn abs(self) -> Self { num_int!(@abs $signed, self) }
            #[inline(always)] fn sign(self) -> Self { num_int!(@sign $signed, self) }
            #[inline(always)] fn lowest() -> Self { <$t>::MIN }
            #[inline(always)] fn highest() -> Self { <$t>::MAX }
        }
    )*};
    (@floor signed, $a:expr, $b:expr, $q:expr) => { if ($a.wrapping_rem($b) != 0) && ((($a < 0) as u8) ^ (($b < 0) as u8) == 1) { $q.wrapping_sub(1) } else { $q } };
    (@floor unsigned, $a:expr, $b:expr, $q:expr) => { $q };
    (@rem signed, $r:expr, $b:expr) => { if $r != 0 && (($r < 0) != ($b < 0)) { $r + $b } else { $r } };
    (@rem unsigned, $r:expr, $b:expr) => { $r };
    (@abs signed, $a:expr) => { $a.wrapping_abs() };
    (@abs unsigned, $a:expr) => { $a };
    (@sign signed, $a:expr) => { $a.signum() };
    (@sign unsigned, $a:expr) => { ($a > 0) as Self };
}
num_int!(u8, unsigned; u16, unsigned; u32, unsigned; u64, unsigned; i8, signed; i16, signed; i32, signed; i64, signed);

/// Integer power by squaring; negative exponents give 0 except for bases ±1 (truncated
/// reciprocal), as C's integer arithmetic would.
fn int_pow(base: i128, exp: i128) -> i128 {
    if exp < 0 {
        return match base {
            1 => 1,
            -1 => {
                if exp % 2 == 0 {
                    1
                } else {
                    -1
                }
            }
            _ => 0,
        };
    }
    let (mut result, mut b, mut e) = (1i128, base, exp);
    while e > 0 {
        if e & 1 == 1 {
            result = result.wrapping_mul(b);
        }
        b = b.wrapping_mul(b);
        e >>= 1;
    }
    result
}

impl Num for B8 {
    fn zero() -> Self {
        B8(0)
    }
    fn one() -> Self {
        B8(1)
    }
    #[inline(always)]
    fn add(self, b: Self) -> Self {
        B8(self.0 | b.0)
    }
    #[inline(always)]
    fn sub(self, b: Self) -> Self {
        B8(self.0 ^ b.0)
    }
    #[inline(always)]
    fn mul(self, b: Self) -> Self {
        B8(self.0 & b.0)
    }
    #[inline(always)]
    fn div(self, b: Self) -> Self {
        B8(self.0 & b.0)
    }
    #[inline(always)]
    fn floor_div(self, b: Self) -> Self {
        B8(self.0 & b.0)
    }
    #[inline(always)]
    fn rem(self, _b: Self) -> Self {
        B8(0)
    }
    #[inline(always)]
    fn pow(self, b: Self) -> Self {
        B8(self.0 | (b.0 ^ 1))
    }
    #[inline(always)]
    fn max(self, b: Self) -> Self {
        B8(self.0 | b.0)
    }
    #[inline(always)]
    fn min(self, b: Self) -> Self {
        B8(self.0 & b.0)
    }
    #[inline(always)]
    fn lt(self, b: Self) -> bool {
        self.0 < b.0
    }
    #[inline(always)]
    fn le(self, b: Self) -> bool {
        self.0 <= b.0
    }
    #[inline(always)]
    fn neg(self) -> Self {
        self
    }
    #[inline(always)]
    fn abs(self) -> Self {
        self
    }
    #[inline(always)]
    fn sign(self) -> Self {
        self
    }
    fn lowest() -> Self {
        B8(0)
    }
    fn highest() -> Self {
        B8(1)
    }
}

/// Floating-point types and the precision they compute in (`f16`/`bf16`/`f32` in `f32`).
pub trait Float: Num {
    /// The computing type.
    type Acc: AccFloat;
    /// Widens.
    fn to_acc(self) -> Self::Acc;
    /// Rounds back.
    fn from_acc(v: Self::Acc) -> Self;
}

/// `f32` or `f64`: the types float kernels compute in.
pub trait AccFloat: num_traits::Float + Cast + Send + Sync + std::fmt::Debug + 'static {
    /// `e^x` as kernels compute it (a vectorisable polynomial in single precision).
    fn vexp(self) -> Self;
    /// Error function.
    fn erf(self) -> Self;
    /// Inverse error function.
    fn erfinv(self) -> Self;
}

impl AccFloat for f32 {
    #[inline(always)]
    fn vexp(self) -> Self {
        crate::vmath::exp_f32(self)
    }
    #[inline(always)]
    fn erf(self) -> Self {
        libm::erff(self)
    }
    fn erfinv(self) -> Self {
        erfinv_f64(self as f64) as f32
    }
}

impl AccFloat for f64 {
    #[inline(always)]
    fn vexp(self) -> Self {
        self.exp()
    }
    #[inline(always)]
    fn erf(self) -> Self {
        libm::erf(self)
    }
    fn erfinv(self) -> Self {
        erfinv_f64(self)
    }
}

/// Inverse error function: Giles' approximation refined by two Newton steps on `erf`.
fn erfinv_f64(y: f64) -> f64 {
    if y.is_nan() || !(-1.0..=1.0).contains(&y) {
        return f64::NAN;
    }
    if y == 1.0 {
        return f64::INFINITY;
    }
    if y == -1.0 {
        return f64::NEG_INFINITY;
    }
    let w = -((1.0 - y) * (1.0 + y)).ln();
    let mut x = if w < 5.0 {
        let w = w - 2.5;
        let mut p = 2.810_226_36e-08;
        for c in [
            3.432_739_39e-07,
            -3.523_387_7e-06,
            -4.391_506_54e-06,
            0.000_218_580_87,
            -0.001_253_725_03,
            -0.004_177_681_64,
            0.246_640_727,
            1.501_409_41,
        ] {
            p = c + p * w;
        }
        p * y
    } else {
        let w = w.sqrt() - 3.0;
        let mut p = -0.000_200_214_257;
        for c in [
            0.000_100_950_558,
            0.001_349_343_22,
            -0.003_673_428_44,
            0.005_739_507_73,
            -0.007_622_461_3,
            0.009_438_870_47,
            1.001_674_06,
            2.832_976_82,
        ] {
            p = c + p * w;
        }
        p * y
    };
    for _ in 0..2 {
        let err = libm::erf(x) - y;
        x -= err / (2.0 / std::f64::consts::PI.sqrt() * (-x * x).exp());
    }
    x
}

macro_rules! num_float {
    ($($t:ty => $acc:ty, $to:expr, $from:expr);*) => {$(
        impl Num for $t {
            #[inline(always)] fn zero() -> Self { $from(0.0) }
            #[inline(always)] fn one() -> Self { $from(1.0) }
            #[inline(always)] fn add(self, b: Self) -> Self { $from($to(self) + $to(b)) }
            #[inline(always)] fn sub(self, b: Self) -> Self { $from($to(self) - $to(b)) }
            #[inline(always)] fn mul(self, b: Self) -> Self { $from($to(self) * $to(b)) }
            #[inline(always)] fn div(self, b: Self) -> Self { $from($to(self) / $to(b)) }
            // The quotient rounds to the element type before flooring (MLX's half precision).
            #[inline(always)] fn floor_div(self, b: Self) -> Self { $from($to($from($to(self) / $to(b))).floor()) }
            #[inline(always)] fn rem(self, b: Self) -> Self {
                let (a, b) = ($to(self), $to(b));
                let r = a % b;
                $from(if r != 0.0 && ((r < 0.0) != (b < 0.0)) { r + b } else { r })
            }
            #[inline(always)] fn pow(self, b: Self) -> Self { $from(num_traits::Float::powf($to(self), $to(b))) }
            #[inline(always)] fn max(self, b: Self) -> Self {
                let (x, y) = ($to(self), $to(b));
                if x.is_nan() || x > y { self } else { b }
            }
            #[inline(always)] fn min(self, b: Self) -> Self {
                let (x, y) = ($to(self), $to(b));
                if x.is_nan() || x < y { self } else { b }
            }
            #[inline(always)] fn lt(self, b: Self) -> bool { $to(self) < $to(b) }
            #[inline(always)] fn le(self, b: Self) -> bool { $to(self) <= $to(b) }
            #[inline(always)] fn neg(self) -> Self { $from(-$to(self)) }
            #[inline(always)] fn abs(self) -> Self { $from($to(self).abs()) }
            // (x > 0) - (x < 0): NaN and both zeros give +0, as MLX.
            #[inline(always)] fn sign(self) -> Self {
                let x = $to(self);
                $from(if x > 0.0 { 1.0 } else if x < 0.0 { -1.0 } else { 0.0 })
            }
            #[inline(always)] fn is_nan(self) -> bool { $to(self).is_nan() }
            #[inline(always)] fn lowest() -> Self { $from(<$acc>::NEG_INFINITY) }
            #[inline(always)] fn highest() -> Self { $from(<$acc>::INFINITY) }
        }
        impl Float for $t {
            type Acc = $acc;
            #[inline(always)] fn to_acc(self) -> $acc { $to(self) }
            #[inline(always)] fn from_acc(v: $acc) -> Self { $from(v) }
        }
    )*};
}
num_float!(
    f32 => f32, (|x: f32| x), (|x: f32| x);
    f64 => f64, (|x: f64| x), (|x: f64| x);
    f16 => f32, (|x: f16| x.to_f32()), f16::from_f32;
    bf16 => f32, (|x: bf16| x.to_f32()), bf16::from_f32
);

impl Num for Complex64 {
    fn zero() -> Self {
        Complex64::new(0.0, 0.0)
    }
    fn one() -> Self {
        Complex64::new(1.0, 0.0)
    }
    #[inline(always)]
    fn add(self, b: Self) -> Self {
        self + b
    }
    #[inline(always)]
    fn sub(self, b: Self) -> Self {
        self - b
    }
    #[inline(always)]
    fn mul(self, b: Self) -> Self {
        self * b
    }
    #[inline(always)]
    fn div(self, b: Self) -> Self {
        self / b
    }
    /// MLX's complex floor division is plain division.
    fn floor_div(self, b: Self) -> Self {
        self / b
    }
    fn rem(self, b: Self) -> Self {
        self - b * (self / b)
    }
    fn pow(self, b: Self) -> Self {
        if self == Complex64::new(0.0, 0.0) {
            return if b == Complex64::new(0.0, 0.0) { Complex64::new(1.0, 0.0) } else { self };
        }
        self.powc(b)
    }
    // Complex order is lexicographic (real part first), as MLX's.
    fn max(self, b: Self) -> Self {
        if self.lt(b) { b } else { self }
    }
    fn min(self, b: Self) -> Self {
        if b.lt(self) { b } else { self }
    }
    fn lt(self, b: Self) -> bool {
        self.re < b.re || (self.re == b.re && self.im < b.im)
    }
    fn le(self, b: Self) -> bool {
        self.re < b.re || (self.re == b.re && self.im <= b.im)
    }
    fn neg(self) -> Self {
        -self
    }
    fn abs(self) -> Self {
        Complex64::new(self.norm(), 0.0)
    }
    fn sign(self) -> Self {
        let n = self.norm();
        if n == 0.0 { self } else { self / n }
    }
    fn is_nan(self) -> bool {
        self.re.is_nan() || self.im.is_nan()
    }
    fn lowest() -> Self {
        Complex64::new(f32::NEG_INFINITY, f32::NEG_INFINITY)
    }
    fn highest() -> Self {
        Complex64::new(f32::INFINITY, f32::INFINITY)
    }
}

/// Bitwise operations of booleans and integers.
pub trait Bits: Num {
    /// `a & b`.
    fn and(self, b: Self) -> Self;
    /// `a | b`.
    fn or(self, b: Self) -> Self;
    /// `a ^ b`.
    fn xor(self, b: Self) -> Self;
    /// `a << b` (0 once every bit is shifted out).
    fn shl(self, b: Self) -> Self;
    /// `a >> b` (arithmetic for signed types).
    fn shr(self, b: Self) -> Self;
    /// `!a`.
    fn not(self) -> Self;
}

macro_rules! bits_int {
    ($($t:ty),*) => {$(
        impl Bits for $t {
            #[inline(always)] fn and(self, b: Self) -> Self { self & b }
            #[inline(always)] fn or(self, b: Self) -> Self { self | b }
            #[inline(always)] fn xor(self, b: Self) -> Self { self ^ b }
            #[inline(always)] fn shl(self, b: Self) -> Self {
                let s = b as i128;
                if s < 0 || s >= <$t>::BITS as i128 { 0 } else { self << s }
            }
            #[inline(always)] fn shr(self, b: Self) -> Self {
                let s = b as i128;
                if s < 0 { return 0; }
                let s = s.min(<$t>::BITS as i128 - 1) as u32;
                #[allow(unused_comparisons)]
                let negative = self < 0;
                if (b as i128) >= <$t>::BITS as i128 { if negative { !0 } else { 0 } } else { self >> s }
            }
            #[inline(always)] fn not(self) -> Self { !self }
        }
    )*};
}
bits_int!(u8, u16, u32, u64, i8, i16, i32, i64);

impl Bits for B8 {
    fn and(self, b: Self) -> Self {
        B8(self.0 & b.0)
    }
    fn or(self, b: Self) -> Self {
        B8(self.0 | b.0)
    }
    fn xor(self, b: Self) -> Self {
        B8(self.0 ^ b.0)
    }
    fn shl(self, b: Self) -> Self {
        B8(if b.0 == 0 { self.0 } else { 0 })
    }
    fn shr(self, b: Self) -> Self {
        B8(if b.0 == 0 { self.0 } else { 0 })
    }
    fn not(self) -> Self {
        B8(self.0 ^ 1)
    }
}
