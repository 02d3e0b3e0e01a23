//! Binary maps, and `where`.

use num_traits::Float as _;
use nuvec_core::primitive::BinaryOp;
use nuvec_core::primitive::elementwise::widened_pair;
use nuvec_core::shape::Strides;
use nuvec_core::storage::{Data, Layout, Operand, Output};
use nuvec_core::{DType, Result};

use crate::elem::{B8, Bits, Float, Num};
use crate::map::{map2, map3};
use crate::{for_all, for_float, for_int, internal, unsupported};

pub fn eval(op: BinaryOp, a: Operand, b: Operand, out: &mut Output) -> Result<()> {
    use BinaryOp::*;
    // A widened pair (a half-precision operand beside a float32 one): widen the narrow one.
    if a.dtype != b.dtype {
        let dtype = widened_pair(a.dtype, b.dtype).ok_or_else(|| internal("binary operands of two dtypes"))?;
        let (a, b) = (widen(a, dtype)?, widen(b, dtype)?);
        return eval(op, a, b, out);
    }
    let dtype = a.dtype;
    match op {
        Add => for_all!(dtype, T => map2::<T, T, T>(a, b, out, Num::add)),
        Subtract => for_all!(dtype, T => map2::<T, T, T>(a, b, out, Num::sub)),
        Multiply => for_all!(dtype, T => map2::<T, T, T>(a, b, out, Num::mul)),
        Divide => for_all!(dtype, T => map2::<T, T, T>(a, b, out, Num::div)),
        FloorDivide => for_all!(dtype, T => map2::<T, T, T>(a, b, out, Num::floor_div)),
        Remainder => for_all!(dtype, T => map2::<T, T, T>(a, b, out, Num::rem)),
        Power => for_all!(dtype, T => map2::<T, T, T>(a, b, out, Num::pow)),
        Maximum => for_all!(dtype, T => map2::<T, T, T>(a, b, out, Num::max)),
        Minimum => for_all!(dtype, T => map2::<T, T, T>(a, b, out, Num::min)),
        Equal => for_all!(dtype, T => map2::<T, T, B8>(a, b, out, |x, y| B8::new(x == y))),
        NotEqual => for_all!(dtype, T => map2::<T, T, B8>(a, b, out, |x, y| B8::new(x != y))),
        Less => for_all!(dtype, T => map2::<T, T, B8>(a, b, out, less::<T>)),
        LessEqual => for_all!(dtype, T => map2::<T, T, B8>(a, b, out, less_equal::<T>)),
        // `a > b` is `b < a`: the operands swapped share the kernels of `<` and `<=`.
        Greater => for_all!(dtype, T => map2::<T, T, B8>(b, a, out, less::<T>)),
        GreaterEqual => for_all!(dtype, T => map2::<T, T, B8>(b, a, out, less_equal::<T>)),
        LogicalAnd => {
            for_all!(dtype, T => map2::<T, T, B8>(a, b, out, |x, y| B8::new(x != T::zero() && y != T::zero())))
        }
        LogicalOr => {
            for_all!(dtype, T => map2::<T, T, B8>(a, b, out, |x, y| B8::new(x != T::zero() || y != T::zero())))
        }
        BitwiseAnd => for_int!(dtype, T => map2::<T, T, T>(a, b, out, Bits::and)),
        BitwiseOr => for_int!(dtype, T => map2::<T, T, T>(a, b, out, Bits::or)),
        BitwiseXor => for_int!(dtype, T => map2::<T, T, T>(a, b, out, Bits::xor)),
        LeftShift => for_int!(dtype, T => map2::<T, T, T>(a, b, out, Bits::shl)),
        RightShift => for_int!(dtype, T => map2::<T, T, T>(a, b, out, Bits::shr)),
        LogAddExp if dtype == DType::Complex64 => {
            map2::<nuvec_core::Complex64, nuvec_core::Complex64, nuvec_core::Complex64>(a, b, out, complex_logaddexp)
        }
        LogAddExp => for_float!(dtype, T => map2::<T, T, T>(a, b, out, logaddexp::<T>)),
        ArcTan2 => for_float!(dtype, T => map2::<T, T, T>(a, b, out, |y, x| T::from_acc(y.to_acc().atan2(x.to_acc())))),
    }
}

/// `x` as `dtype`, its broadcast axes still broadcast (only its distinct elements are cast).
fn widen(x: Operand, dtype: DType) -> Result<Operand> {
    if x.dtype == dtype {
        return Ok(x);
    }
    let strides = &x.data.layout.strides;
    let compact: Vec<i32> = x.shape.iter().zip(strides.iter()).map(|(&d, &s)| if s == 0 { 1 } else { d }).collect();
    let layout = Layout::new(&compact, strides.clone(), x.data.layout.offset);
    let src = Operand {
        shape: compact.as_slice().into(),
        dtype: x.dtype,
        data: Data { storage: x.data.storage.clone(), layout },
        donated: false,
    };
    let mut out = Output { shape: compact.as_slice().into(), dtype, data: None };
    crate::copy::astype(src, &mut out)?;
    let data = out.data.ok_or_else(|| internal("astype wrote no output"))?;
    let wide: Strides =
        data.layout.strides.iter().zip(strides.iter()).map(|(&w, &s)| if s == 0 { 0 } else { w }).collect();
    let layout = Layout::new(&x.shape, wide, data.layout.offset);
    // The widened buffer is this call's own: the map may write its result into it.
    Ok(Operand { shape: x.shape, dtype, data: Data { storage: data.storage, layout }, donated: true })
}

#[inline(always)]
fn less<T: Num>(x: T, y: T) -> B8 {
    B8::new(Num::lt(x, y))
}

#[inline(always)]
fn less_equal<T: Num>(x: T, y: T) -> B8 {
    B8::new(Num::le(x, y))
}

/// `log(e^a + e^b)` factored on the operand with the larger real part, so it cannot overflow.
pub(crate) fn complex_logaddexp(a: nuvec_core::Complex64, b: nuvec_core::Complex64) -> nuvec_core::Complex64 {
    let (hi, lo) = if a.re >= b.re { (a, b) } else { (b, a) };
    if hi.re.is_infinite() && hi.re > 0.0 {
        return hi;
    }
    hi + ((lo - hi).exp() + 1.0).ln()
}

#[inline(always)]
fn logaddexp<T: Float>(a: T, b: T) -> T {
    let (x, y) = (a.to_acc(), b.to_acc());
    if x.is_nan() || y.is_nan() {
        return T::from_acc(x + y);
    }
    let m = x.max(y);
    if m.is_infinite() {
        return T::from_acc(m);
    }
    T::from_acc(m + (-(x - y).abs()).exp().ln_1p())
}

/// `where(cond, a, b)`.
pub fn select(c: Operand, a: Operand, b: Operand, out: &mut Output) -> Result<()> {
    let dtype = a.dtype;
    if c.dtype != DType::Bool {
        return Err(unsupported(c.dtype));
    }
    for_all!(dtype, T => map3::<B8, T, T, T>(c, a, b, out, |c, x, y| if c.get() { x } else { y }))
}
