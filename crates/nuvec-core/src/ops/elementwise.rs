//! Element-wise operations: unary maps, binary maps with broadcasting and weak scalars,
//! `where_`, `clip`, casts.

use crate::array::{Array, ScalarOrArray};
use crate::dtype::{DType, Scalar, promote_types};
use crate::error::OpErrorKind;
use crate::primitive::elementwise::widened_pair;
use crate::primitive::{BinaryOp, Primitive, UnaryOp};

use super::propagate;

/// Records a unary map after casting to the dtype it computes in.
#[track_caller]
pub(crate) fn unary(op: UnaryOp, x: &Array) -> Array {
    if let Some(f) = propagate(&[x]) {
        return f;
    }
    let Some(dtype) = op.compute_dtype(x.dtype()) else {
        return Array::failed(op.name(), OpErrorKind::UnsupportedDType(x.dtype()));
    };
    let x = x.astype(dtype);
    if op.is_identity_for(dtype) {
        return x;
    }
    Array::from_op(op.name(), Primitive::Unary(op), vec![x])
}

/// Two operands as arrays of their promoted dtype (weak scalars take the array's dtype). A
/// weak integer scalar out of the range of that dtype is an error, as in MLX, rather than a
/// silent wrap-around.
fn promote_operands(a: ScalarOrArray, b: ScalarOrArray) -> Result<(Array, Array, DType), OpErrorKind> {
    let weak = |s: Scalar, d: DType| -> Result<Array, OpErrorKind> {
        if s.fits(d) {
            Ok(Array::scalar(s, d))
        } else {
            Err(OpErrorKind::InvalidArgument(format!("the scalar {s:?} cannot be represented as {d}")))
        }
    };
    Ok(match (a, b) {
        (ScalarOrArray::Array(x), ScalarOrArray::Array(y)) => {
            let d = promote_types(x.dtype(), y.dtype());
            (x, y, d)
        }
        (ScalarOrArray::Array(x), ScalarOrArray::Scalar(s)) => {
            let d = s.weak_dtype_with(x.dtype());
            (x, weak(s, d)?, d)
        }
        (ScalarOrArray::Scalar(s), ScalarOrArray::Array(y)) => {
            let d = s.weak_dtype_with(y.dtype());
            (weak(s, d)?, y, d)
        }
        (ScalarOrArray::Scalar(s), ScalarOrArray::Scalar(t)) => {
            let d = promote_types(s.default_dtype(), t.default_dtype());
            (weak(s, d)?, weak(t, d)?, d)
        }
    })
}

/// Records a binary map: promote, cast to the compute dtype, broadcast.
#[track_caller]
pub(crate) fn binary(op: BinaryOp, a: impl Into<ScalarOrArray>, b: impl Into<ScalarOrArray>) -> Array {
    binary_as(op.name(), op, a.into(), b.into())
}

/// `binary`, reporting errors as `name` (for operations built on one, such as `clip`).
#[track_caller]
fn binary_as(name: &'static str, op: BinaryOp, a: ScalarOrArray, b: ScalarOrArray) -> Array {
    let (a, b, promoted) = match promote_operands(a, b) {
        Ok(p) => p,
        Err(kind) => return Array::failed(name, kind),
    };
    if let Some(f) = propagate(&[&a, &b]) {
        return f;
    }
    let Some(mut dtype) = op.compute_dtype(promoted) else {
        return Array::failed(name, OpErrorKind::UnsupportedDType(promoted));
    };
    // Logical ops read their operands' truth in place when they share a dtype; otherwise
    // each is cast to `bool`, which is narrower than any promotion.
    if matches!(op, BinaryOp::LogicalAnd | BinaryOp::LogicalOr) && a.dtype() != b.dtype() {
        dtype = DType::Bool;
    }
    let shape = match crate::shape::broadcast_shapes(a.shape(), b.shape()) {
        Ok(s) => s,
        Err(kind) => return Array::failed(name, kind),
    };
    // A half-precision operand beside a float32 one stays as it is: backends widen it as they
    // load it, saving a pass that writes it out in float32.
    let keep = |x: &Array, other: &Array| {
        x.dtype() != dtype && other.dtype() == dtype && widened_pair(x.dtype(), dtype) == Some(dtype)
    };
    let (keep_a, keep_b) = (keep(&a, &b), keep(&b, &a));
    let a = if keep_a { a } else { a.astype(dtype) }.broadcast_to(&shape);
    let b = if keep_b { b } else { b.astype(dtype) }.broadcast_to(&shape);
    Array::from_op(op.name(), Primitive::Binary(op), vec![a, b])
}

macro_rules! unary_ops {
    ($($name:ident => $op:ident, $doc:literal;)*) => {
        impl Array {$(
            #[doc = $doc]
            #[track_caller]
            pub fn $name(&self) -> Array { unary(UnaryOp::$op, self) }
        )*}
        $(
            #[doc = $doc]
            #[track_caller]
            pub fn $name(x: &Array) -> Array { x.$name() }
        )*
    };
}

unary_ops! {
    abs => Abs, "Absolute value (`float32` magnitude for `complex64`).";
    sign => Sign, "−1, 0 or 1 by the sign of each element.";
    negative => Negative, "Negation. Not defined for `bool`: use `logical_not`.";
    square => Square, "`x * x`.";
    floor => Floor, "Largest integer not above each element.";
    ceil => Ceil, "Smallest integer not below each element.";
    exp => Exp, "`e^x`. Integers compute in `float32`.";
    expm1 => Expm1, "`e^x − 1`, accurate near 0.";
    log => Log, "Natural logarithm.";
    log1p => Log1p, "`ln(1 + x)`, accurate near 0.";
    log2 => Log2, "Base-2 logarithm.";
    log10 => Log10, "Base-10 logarithm.";
    sqrt => Sqrt, "Square root.";
    rsqrt => Rsqrt, "`1 / sqrt(x)`.";
    reciprocal => Reciprocal, "`1 / x`.";
    sin => Sin, "Sine.";
    cos => Cos, "Cosine.";
    tan => Tan, "Tangent.";
    arcsin => ArcSin, "Inverse sine.";
    arccos => ArcCos, "Inverse cosine.";
    arctan => ArcTan, "Inverse tangent.";
    sinh => Sinh, "Hyperbolic sine.";
    cosh => Cosh, "Hyperbolic cosine.";
    tanh => Tanh, "Hyperbolic tangent.";
    arcsinh => ArcSinh, "Inverse hyperbolic sine.";
    arccosh => ArcCosh, "Inverse hyperbolic cosine.";
    arctanh => ArcTanh, "Inverse hyperbolic tangent.";
    sigmoid => Sigmoid, "Logistic function `1 / (1 + e^−x)`.";
    erf => Erf, "Error function.";
    erfinv => ErfInv, "Inverse error function.";
    logical_not => LogicalNot, "Logical negation of each element's truth (a `bool` array).";
    bitwise_invert => BitwiseInvert, "Bitwise complement of integers (`!` of booleans).";
    conjugate => Conjugate, "Complex conjugate (identity on real arrays).";
}

impl Array {
    /// Rounds to the nearest integer, halves to even (MLX's `round`).
    #[track_caller]
    pub fn round(&self) -> Array {
        unary(UnaryOp::Round, self)
    }

    /// Rounds to `decimals` digits after the point (before it when negative).
    #[track_caller]
    pub fn round_decimals(&self, decimals: i32) -> Array {
        if decimals == 0 {
            return self.round();
        }
        // MLX: round(x * s) * (1 / s) with s = 10^decimals in single precision, computed in
        // the array's float type (integers through float32), cast back.
        let dtype = self.dtype().at_least_float();
        let scale = 10f32.powi(decimals);
        let scaled = self.astype(dtype) * Array::scalar(scale, dtype);
        (scaled.round() * Array::scalar(1.0 / scale, dtype)).astype(self.dtype())
    }

    /// Whether each element is NaN.
    #[track_caller]
    pub fn isnan(&self) -> Array {
        if self.dtype().is_inexact() { self.not_equal(self) } else { zeros_bool(self) }
    }

    /// Whether each element is +∞ or −∞.
    #[track_caller]
    pub fn isinf(&self) -> Array {
        if self.dtype().is_inexact() { self.abs().equal(f64::INFINITY) } else { zeros_bool(self) }
    }

    /// Whether each element is finite (neither NaN nor infinite).
    #[track_caller]
    pub fn isfinite(&self) -> Array {
        if self.dtype().is_inexact() {
            self.isinf().logical_not().logical_and(self.isnan().logical_not())
        } else {
            super::full(self.shape(), true)
        }
    }

    /// Whether each element is +∞.
    #[track_caller]
    pub fn isposinf(&self) -> Array {
        if self.dtype().is_float() { self.equal(f64::INFINITY) } else { zeros_bool(self) }
    }

    /// Whether each element is −∞.
    #[track_caller]
    pub fn isneginf(&self) -> Array {
        if self.dtype().is_float() { self.equal(f64::NEG_INFINITY) } else { zeros_bool(self) }
    }

    /// Converts to `dtype` (C-style: floats truncate toward zero into integers; non-zero is
    /// `true`).
    ///
    /// ```
    /// use nuvec::{array, DType};
    /// assert_eq!(array![1.7, -1.7].astype(DType::I32).to_vec::<i32>().unwrap(), vec![1, -1]);
    /// ```
    #[track_caller]
    pub fn astype(&self, dtype: DType) -> Array {
        if dtype == self.dtype() && !self.is_failed() {
            return self.clone();
        }
        Array::from_op("astype", Primitive::AsType(dtype), vec![self.clone()])
    }

    /// Reinterprets the bytes as `dtype`; the last axis scales when the sizes differ.
    #[track_caller]
    pub fn view(&self, dtype: DType) -> Array {
        if dtype == self.dtype() && !self.is_failed() {
            return self.clone();
        }
        Array::from_op("view", Primitive::BitCast(dtype), vec![self.clone()])
    }

    /// Elements clamped to `[min, max]` (`maximum` then `minimum`, with broadcasting).
    #[track_caller]
    pub fn clip(&self, min: impl Into<ScalarOrArray>, max: impl Into<ScalarOrArray>) -> Array {
        let (min, max) = (min.into(), max.into());
        let arrays: Vec<&Array> = [&min, &max]
            .into_iter()
            .filter_map(|b| if let ScalarOrArray::Array(a) = b { Some(a) } else { None })
            .collect();
        if let Some(f) = propagate(&[&[self][..], &arrays[..]].concat()) {
            return f;
        }
        let mut shape: crate::shape::Shape = self.shape().into();
        for bound in [&min, &max] {
            if let ScalarOrArray::Array(b) = bound {
                match crate::shape::broadcast_shapes(&shape, b.shape()) {
                    Ok(s) => shape = s,
                    Err(kind) => return Array::failed("clip", kind),
                }
            }
        }
        self.clip_min(min).clip_max(max)
    }

    /// Elements clamped from below.
    #[track_caller]
    pub fn clip_min(&self, min: impl Into<ScalarOrArray>) -> Array {
        binary_as("clip", BinaryOp::Maximum, self.into(), min.into())
    }

    /// Elements clamped from above.
    #[track_caller]
    pub fn clip_max(&self, max: impl Into<ScalarOrArray>) -> Array {
        binary_as("clip", BinaryOp::Minimum, self.into(), max.into())
    }
}

fn zeros_bool(x: &Array) -> Array {
    if let Some(f) = propagate(&[x]) {
        return f;
    }
    super::full(x.shape(), false)
}

macro_rules! binary_ops {
    ($($name:ident => $op:ident, $doc:literal;)*) => {
        impl Array {$(
            #[doc = $doc]
            #[track_caller]
            pub fn $name(&self, other: impl Into<ScalarOrArray>) -> Array { binary(BinaryOp::$op, self, other) }
        )*}
        $(
            #[doc = $doc]
            #[track_caller]
            pub fn $name(a: impl Into<ScalarOrArray>, b: impl Into<ScalarOrArray>) -> Array {
                binary(BinaryOp::$op, a, b)
            }
        )*
    };
}

binary_ops! {
    add => Add, "Sum, with broadcasting and weak scalars.";
    subtract => Subtract, "Difference.";
    multiply => Multiply, "Product.";
    divide => Divide, "True division (integers divide in `float32`).";
    floor_divide => FloorDivide, "Division rounded toward −∞ (integers stay integers).";
    remainder => Remainder, "Remainder with the sign of the divisor (Python's `%`).";
    power => Power, "`a` to the power `b`.";
    maximum => Maximum, "Larger of the two (NaN propagates).";
    minimum => Minimum, "Smaller of the two (NaN propagates).";
    logaddexp => LogAddExp, "`log(e^a + e^b)` without overflow.";
    arctan2 => ArcTan2, "Angle of the point `(b, a)`: `atan(a / b)` in the right quadrant.";
    equal => Equal, "`a == b` element-wise.";
    not_equal => NotEqual, "`a != b` element-wise.";
    less => Less, "`a < b` element-wise.";
    less_equal => LessEqual, "`a <= b` element-wise.";
    greater => Greater, "`a > b` element-wise.";
    greater_equal => GreaterEqual, "`a >= b` element-wise.";
    logical_and => LogicalAnd, "Logical and of the elements' truth.";
    logical_or => LogicalOr, "Logical or of the elements' truth.";
    bitwise_and => BitwiseAnd, "Bitwise and of integers or booleans.";
    bitwise_or => BitwiseOr, "Bitwise or of integers or booleans.";
    bitwise_xor => BitwiseXor, "Bitwise exclusive or of integers or booleans.";
    left_shift => LeftShift, "`a << b` on integers.";
    right_shift => RightShift, "`a >> b` on integers (arithmetic for signed types).";
}

/// Rounds to the nearest integer, halves to even.
#[track_caller]
pub fn round(x: &Array) -> Array {
    x.round()
}

/// Whether each element is NaN.
#[track_caller]
pub fn isnan(x: &Array) -> Array {
    x.isnan()
}

/// Whether each element is infinite.
#[track_caller]
pub fn isinf(x: &Array) -> Array {
    x.isinf()
}

/// Whether each element is finite.
#[track_caller]
pub fn isfinite(x: &Array) -> Array {
    x.isfinite()
}

/// Whether each element is +∞.
#[track_caller]
pub fn isposinf(x: &Array) -> Array {
    x.isposinf()
}

/// Whether each element is −∞.
#[track_caller]
pub fn isneginf(x: &Array) -> Array {
    x.isneginf()
}

/// Converts to `dtype`.
#[track_caller]
pub fn astype(x: &Array, dtype: DType) -> Array {
    x.astype(dtype)
}

/// Reinterprets the bytes as `dtype`.
#[track_caller]
pub fn view(x: &Array, dtype: DType) -> Array {
    x.view(dtype)
}

/// Clamps to `[min, max]`.
#[track_caller]
pub fn clip(x: &Array, min: impl Into<ScalarOrArray>, max: impl Into<ScalarOrArray>) -> Array {
    x.clip(min, max)
}

/// `x` where `condition` holds, else `y`, with broadcasting and weak scalars (MLX's `where`).
///
/// ```
/// use nuvec::{array, ops};
/// let x = array![1.0, -2.0, 3.0];
/// let relu = ops::where_(&x.greater(0.0), &x, 0.0);
/// assert_eq!(relu.to_vec::<f32>().unwrap(), vec![1.0, 0.0, 3.0]);
/// ```
#[track_caller]
pub fn where_(condition: impl Into<ScalarOrArray>, x: impl Into<ScalarOrArray>, y: impl Into<ScalarOrArray>) -> Array {
    let cond = condition.into().into_array();
    let (x, y, dtype) = match promote_operands(x.into(), y.into()) {
        Ok(p) => p,
        Err(kind) => return Array::failed("where", kind),
    };
    if let Some(f) = propagate(&[&cond, &x, &y]) {
        return f;
    }
    let shape = match crate::shape::broadcast_shapes(cond.shape(), x.shape())
        .and_then(|s| crate::shape::broadcast_shapes(&s, y.shape()))
    {
        Ok(s) => s,
        Err(kind) => return Array::failed("where", kind),
    };
    let cond = cond.astype(DType::Bool).broadcast_to(&shape);
    let x = x.astype(dtype).broadcast_to(&shape);
    let y = y.astype(dtype).broadcast_to(&shape);
    Array::from_op("where", Primitive::Select, vec![cond, x, y])
}
