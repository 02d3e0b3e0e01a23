//! Unary maps.

use num_traits::Float as _;
use nuvec_core::Result;
use nuvec_core::dtype::Complex64;
use nuvec_core::primitive::UnaryOp;
use nuvec_core::storage::{Operand, Output};

use crate::elem::{AccFloat, Bits, Float, Num};
use crate::map::map1;
use crate::vmath;
use crate::{for_all, for_float, for_int, unsupported};

pub fn eval(op: UnaryOp, x: Operand, out: &mut Output) -> Result<()> {
    use UnaryOp::*;
    let dtype = x.dtype;
    if op == LogicalNot {
        return for_all!(dtype, T => map1::<T, B8>(x, out, |v| B8::new(v == T::zero())));
    }
    if dtype == nuvec_core::DType::Complex64 {
        return complex(op, x, out);
    }
    match op {
        BitwiseInvert => for_int!(dtype, T => map1::<T, T>(x, out, Bits::not)),
        Abs | Sign | Negative | Square => match dtype {
            d if d.is_float() => for_float!(d, T => simple::<T>(op, x, out)),
            d => for_int!(d, T => simple::<T>(op, x, out)),
        },
        // Fast paths with vectorised polynomials for the hottest single-precision maps.
        Exp if dtype == nuvec_core::DType::F32 => map1::<f32, f32>(x, out, vmath::exp_f32),
        Sigmoid if dtype == nuvec_core::DType::F32 => map1::<f32, f32>(x, out, vmath::sigmoid_f32),
        _ => for_float!(dtype, T => float_math::<T>(op, x, out)),
    }
}

fn simple<T: Num>(op: UnaryOp, x: Operand, out: &mut Output) -> Result<()> {
    match op {
        UnaryOp::Abs => map1::<T, T>(x, out, |v| Num::abs(v)),
        UnaryOp::Sign => map1::<T, T>(x, out, |v| Num::sign(v)),
        UnaryOp::Negative => map1::<T, T>(x, out, |v| Num::neg(v)),
        UnaryOp::Square => map1::<T, T>(x, out, |v| Num::mul(v, v)),
        _ => Err(unsupported(x.dtype)),
    }
}

fn float_math<T: Float>(op: UnaryOp, x: Operand, out: &mut Output) -> Result<()> {
    use UnaryOp::*;
    fn go<T: Float>(x: Operand, out: &mut Output, f: impl Fn(T::Acc) -> T::Acc + Sync + Send + Copy) -> Result<()> {
        map1::<T, T>(x, out, move |v| T::from_acc(f(v.to_acc())))
    }
    let one = <T::Acc as num_traits::One>::one();
    match op {
        Floor => go::<T>(x, out, |v| v.floor()),
        Ceil => go::<T>(x, out, |v| v.ceil()),
        Round => go::<T>(x, out, round_half_even),
        Exp => go::<T>(x, out, |v| v.exp()),
        Expm1 => go::<T>(x, out, |v| v.exp_m1()),
        Log => go::<T>(x, out, |v| v.ln()),
        Log1p => go::<T>(x, out, |v| v.ln_1p()),
        Log2 => go::<T>(x, out, |v| v.log2()),
        Log10 => go::<T>(x, out, |v| v.log10()),
        Sqrt => go::<T>(x, out, |v| v.sqrt()),
        Rsqrt => go::<T>(x, out, move |v| one / v.sqrt()),
        Reciprocal => go::<T>(x, out, move |v| one / v),
        Sin => go::<T>(x, out, |v| v.sin()),
        Cos => go::<T>(x, out, |v| v.cos()),
        Tan => go::<T>(x, out, |v| v.tan()),
        ArcSin => go::<T>(x, out, |v| v.asin()),
        ArcCos => go::<T>(x, out, |v| v.acos()),
        ArcTan => go::<T>(x, out, |v| v.atan()),
        Sinh => go::<T>(x, out, |v| v.sinh()),
        Cosh => go::<T>(x, out, |v| v.cosh()),
        Tanh => go::<T>(x, out, |v| v.tanh()),
        ArcSinh => go::<T>(x, out, |v| v.asinh()),
        ArcCosh => go::<T>(x, out, |v| v.acosh()),
        ArcTanh => go::<T>(x, out, |v| v.atanh()),
        Sigmoid => go::<T>(x, out, move |v| one / (one + (-v).exp())),
        Erf => go::<T>(x, out, |v| v.erf()),
        ErfInv => go::<T>(x, out, |v| v.erfinv()),
        _ => Err(unsupported(x.dtype)),
    }
}

/// Rounds half to even, as `rint`.
fn round_half_even<F: AccFloat>(v: F) -> F {
    let r = v.round();
    let two = F::one() + F::one();
    if (v - v.trunc()).abs() == F::one() / two && (r / two).fract() != F::zero() { r - v.signum() } else { r }
}

fn complex(op: UnaryOp, x: Operand, out: &mut Output) -> Result<()> {
    use UnaryOp::*;
    let go = |x, out: &mut Output, f: fn(Complex64) -> Complex64| map1::<Complex64, Complex64>(x, out, f);
    match op {
        Abs => map1::<Complex64, f32>(x, out, |v| v.norm()),
        Sign => go(x, out, Num::sign),
        Negative => go(x, out, |v| -v),
        Square => go(x, out, |v| v * v),
        Round => go(x, out, |v| Complex64::new(round_half_even(v.re), round_half_even(v.im))),
        Conjugate => go(x, out, |v| v.conj()),
        Exp => go(x, out, |v| v.exp()),
        Log => go(x, out, |v| v.ln()),
        Log2 => go(x, out, |v| v.ln() / std::f32::consts::LN_2),
        Log10 => go(x, out, |v| v.ln() / std::f32::consts::LN_10),
        Sqrt => go(x, out, |v| v.sqrt()),
        Rsqrt => go(x, out, |v| v.sqrt().inv()),
        Reciprocal => go(x, out, |v| v.inv()),
        Sin => go(x, out, |v| v.sin()),
        Cos => go(x, out, |v| v.cos()),
        Tan => go(x, out, |v| v.tan()),
        ArcSin => go(x, out, |v| v.asin()),
        ArcCos => go(x, out, |v| v.acos()),
        ArcTan => go(x, out, |v| v.atan()),
        Sinh => go(x, out, |v| v.sinh()),
        Cosh => go(x, out, |v| v.cosh()),
        Tanh => go(x, out, |v| v.tanh()),
        // asinh is odd; evaluating it on Re z >= 0 avoids cancellation in ln(z + sqrt(1 + z^2)).
        ArcSinh => go(x, out, |v| if v.re < 0.0 { -(-v).asinh() } else { v.asinh() }),
        Log1p => go(x, out, |v| (v + 1.0).ln()),
        ArcCosh => go(x, out, |v| v.acosh()),
        ArcTanh => go(x, out, |v| v.atanh()),
        _ => Err(unsupported(x.dtype)),
    }
}
