//! Element-wise primitives: unary maps, binary maps, select and casts. Inputs reach a backend
//! already broadcast to one shape and cast to the dtype the operation computes in, so a
//! kernel only sees `T -> T`, `(T, T) -> T` or `(T, T) -> bool`.

use crate::dtype::{Category, DType};
use crate::error::OpErrorKind;
use crate::storage::Spec;

/// Declares an operation enum and its `ALL` list from one list of variants, so the two cannot
/// drift apart.
macro_rules! op_enum {
    ($(#[$meta:meta])* $name:ident { $($variant:ident,)* }) => {
        $(#[$meta])*
        pub enum $name {
            $($variant,)*
        }

        impl $name {
            /// Every operation, in declaration order (for backends that build a kernel per
            /// operation and for tests that visit them all).
            pub const ALL: [$name; [$($name::$variant,)*].len()] = [$($name::$variant,)*];
        }
    };
}

op_enum! {
    /// A unary element-wise function.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    #[allow(missing_docs)]
    UnaryOp {
        Abs,
        Sign,
        Negative,
        Square,
        Floor,
        Ceil,
        Round,
        Exp,
        Expm1,
        Log,
        Log1p,
        Log2,
        Log10,
        Sqrt,
        Rsqrt,
        Reciprocal,
        Sin,
        Cos,
        Tan,
        ArcSin,
        ArcCos,
        ArcTan,
        Sinh,
        Cosh,
        Tanh,
        ArcSinh,
        ArcCosh,
        ArcTanh,
        Sigmoid,
        Erf,
        ErfInv,
        LogicalNot,
        BitwiseInvert,
        Conjugate,
    }
}

impl UnaryOp {
    /// MLX's name of the operation.
    pub fn name(self) -> &'static str {
        use UnaryOp::*;
        match self {
            Abs => "abs",
            Sign => "sign",
            Negative => "negative",
            Square => "square",
            Floor => "floor",
            Ceil => "ceil",
            Round => "round",
            Exp => "exp",
            Expm1 => "expm1",
            Log => "log",
            Log1p => "log1p",
            Log2 => "log2",
            Log10 => "log10",
            Sqrt => "sqrt",
            Rsqrt => "rsqrt",
            Reciprocal => "reciprocal",
            Sin => "sin",
            Cos => "cos",
            Tan => "tan",
            ArcSin => "arcsin",
            ArcCos => "arccos",
            ArcTan => "arctan",
            Sinh => "sinh",
            Cosh => "cosh",
            Tanh => "tanh",
            ArcSinh => "arcsinh",
            ArcCosh => "arccosh",
            ArcTanh => "arctanh",
            Sigmoid => "sigmoid",
            Erf => "erf",
            ErfInv => "erfinv",
            LogicalNot => "logical_not",
            BitwiseInvert => "bitwise_invert",
            Conjugate => "conjugate",
        }
    }

    /// Transcendental functions: integer and boolean inputs are computed in `float32`.
    pub fn is_float_math(self) -> bool {
        use UnaryOp::*;
        !matches!(self, Abs | Sign | Negative | Square | Floor | Ceil | Round | LogicalNot | BitwiseInvert | Conjugate)
    }

    /// The dtype the input is cast to before the kernel runs, or `None` when the operation
    /// does not accept `dtype` (MLX's rules).
    pub fn compute_dtype(self, dtype: DType) -> Option<DType> {
        use UnaryOp::*;
        let complex = dtype == DType::Complex64;
        match self {
            LogicalNot => Some(dtype),
            BitwiseInvert => (dtype == DType::Bool || dtype.is_integer()).then_some(dtype),
            Negative => (dtype != DType::Bool).then_some(dtype),
            Floor | Ceil => (!complex).then_some(dtype),
            Abs | Sign | Square | Round | Conjugate => Some(dtype),
            Sigmoid | Erf | ErfInv | Expm1 if complex => None,
            _ => Some(dtype.at_least_float()),
        }
    }

    /// The output dtype for an input already in its compute dtype.
    pub fn output_dtype(self, dtype: DType) -> DType {
        match (self, dtype) {
            (UnaryOp::Abs, DType::Complex64) => DType::F32,
            (UnaryOp::LogicalNot, _) => DType::Bool,
            _ => dtype,
        }
    }

    /// Whether a backend kernel is needed for `dtype`, or the op is the identity there
    /// (`floor` of an integer, `conjugate` of a real).
    pub fn is_identity_for(self, dtype: DType) -> bool {
        use UnaryOp::*;
        match self {
            Floor | Ceil | Round => !dtype.is_inexact(),
            Abs => matches!(dtype.category(), Category::Unsigned | Category::Bool),
            Conjugate => dtype != DType::Complex64,
            _ => false,
        }
    }
}

op_enum! {
    /// A binary element-wise function.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    #[allow(missing_docs)]
    BinaryOp {
        Add,
        Subtract,
        Multiply,
        Divide,
        FloorDivide,
        Remainder,
        Power,
        Maximum,
        Minimum,
        LogAddExp,
        ArcTan2,
        Equal,
        NotEqual,
        Less,
        LessEqual,
        Greater,
        GreaterEqual,
        LogicalAnd,
        LogicalOr,
        BitwiseAnd,
        BitwiseOr,
        BitwiseXor,
        LeftShift,
        RightShift,
    }
}

impl BinaryOp {
    /// MLX's name of the operation.
    pub fn name(self) -> &'static str {
        use BinaryOp::*;
        match self {
            Add => "add",
            Subtract => "subtract",
            Multiply => "multiply",
            Divide => "divide",
            FloorDivide => "floor_divide",
            Remainder => "remainder",
            Power => "power",
            Maximum => "maximum",
            Minimum => "minimum",
            LogAddExp => "logaddexp",
            ArcTan2 => "arctan2",
            Equal => "equal",
            NotEqual => "not_equal",
            Less => "less",
            LessEqual => "less_equal",
            Greater => "greater",
            GreaterEqual => "greater_equal",
            LogicalAnd => "logical_and",
            LogicalOr => "logical_or",
            BitwiseAnd => "bitwise_and",
            BitwiseOr => "bitwise_or",
            BitwiseXor => "bitwise_xor",
            LeftShift => "left_shift",
            RightShift => "right_shift",
        }
    }

    /// Comparisons and logical operations return `Bool`.
    pub fn is_predicate(self) -> bool {
        use BinaryOp::*;
        matches!(self, Equal | NotEqual | Less | LessEqual | Greater | GreaterEqual | LogicalAnd | LogicalOr)
    }

    /// The dtype both inputs are cast to, from their promoted dtype, or `None` when the
    /// operation does not accept it (MLX's rules).
    pub fn compute_dtype(self, promoted: DType) -> Option<DType> {
        use BinaryOp::*;
        let complex = promoted == DType::Complex64;
        match self {
            Divide | LogAddExp => Some(promoted.at_least_float()),
            ArcTan2 => (!complex).then_some(promoted.at_least_float()),
            BitwiseAnd | BitwiseOr | BitwiseXor => {
                (promoted == DType::Bool || promoted.is_integer()).then_some(promoted)
            }
            LeftShift | RightShift => match promoted {
                DType::Bool => Some(DType::U8),
                d if d.is_integer() => Some(d),
                _ => None,
            },
            Remainder if complex => None,
            // Complex numbers order lexicographically (real part, then imaginary), as in MLX.
            _ => Some(promoted),
        }
    }

    /// The output dtype for inputs in their compute dtype.
    pub fn output_dtype(self, dtype: DType) -> DType {
        if self.is_predicate() { DType::Bool } else { dtype }
    }
}

/// The output of a unary map: `x`'s shape, in the op's output dtype.
pub fn unary_spec(op: UnaryOp, x: &Spec) -> Result<Spec, OpErrorKind> {
    if op.compute_dtype(x.dtype) != Some(x.dtype) {
        return Err(OpErrorKind::UnsupportedDType(x.dtype));
    }
    Ok(Spec { shape: x.shape.clone(), dtype: op.output_dtype(x.dtype) })
}

/// The dtype a binary map computes in when its operands' dtypes differ: one half-precision
/// float (`bfloat16`, `float16`) beside a `float32`, which backends widen as they load it
/// rather than in a separate cast. `None` for any other pair.
pub fn widened_pair(a: DType, b: DType) -> Option<DType> {
    let half = |d: DType| matches!(d, DType::BF16 | DType::F16);
    ((half(a) && b == DType::F32) || (a == DType::F32 && half(b))).then_some(DType::F32)
}

/// The output of a binary map: inputs of one shape and of one dtype, or a [`widened_pair`]
/// (ops broadcast and promote first).
pub fn binary_spec(op: BinaryOp, a: &Spec, b: &Spec) -> Result<Spec, OpErrorKind> {
    same_shape(a, b)?;
    let dtype = if a.dtype == b.dtype {
        a.dtype
    } else {
        widened_pair(a.dtype, b.dtype).ok_or(OpErrorKind::DTypeMismatch { lhs: a.dtype, rhs: b.dtype })?
    };
    if op.compute_dtype(dtype) != Some(dtype) {
        return Err(OpErrorKind::UnsupportedDType(dtype));
    }
    Ok(Spec { shape: a.shape.clone(), dtype: op.output_dtype(dtype) })
}

/// The output of `where(c, a, b)`: a bool condition and two values of one dtype, one shape.
pub fn select_spec(c: &Spec, a: &Spec, b: &Spec) -> Result<Spec, OpErrorKind> {
    same_shape(c, a)?;
    same_shape(a, b)?;
    if c.dtype != DType::Bool {
        return Err(OpErrorKind::UnsupportedDType(c.dtype));
    }
    if a.dtype != b.dtype {
        return Err(OpErrorKind::DTypeMismatch { lhs: a.dtype, rhs: b.dtype });
    }
    Ok(a.clone())
}

fn same_shape(a: &Spec, b: &Spec) -> Result<(), OpErrorKind> {
    if a.shape == b.shape {
        Ok(())
    } else {
        Err(OpErrorKind::ShapeMismatch { lhs: a.shape.to_vec(), rhs: b.shape.to_vec() })
    }
}

// ---- derivatives and batching ---------------------------------------------------------------

use crate::array::Array;

impl UnaryOp {
    /// `d f(x) / dx` applied to `t` (a cotangent or tangent), given input `x` and output `y`.
    /// `None` when the derivative is zero (integer and boolean maps, steps).
    pub(crate) fn derivative(self, x: &Array, y: &Array, t: &Array) -> Option<Array> {
        use UnaryOp::*;
        if !x.dtype().is_inexact() {
            return None;
        }
        let one = || x.ones_like();
        Some(match self {
            Abs => t * x.sign(),
            Sign | Floor | Ceil | Round | LogicalNot | BitwiseInvert => return None,
            Negative => t.negative(),
            Square => t * x * 2.0,
            Exp => t * y,
            Expm1 => t * (y + 1.0),
            Log => t / x,
            Log1p => t / (x + 1.0),
            Log2 => t / (x * std::f64::consts::LN_2),
            Log10 => t / (x * std::f64::consts::LN_10),
            Sqrt => t / (y * 2.0),
            Rsqrt => t * y.power(3.0) * -0.5,
            Reciprocal => (t * y * y).negative(),
            Sin => t * x.cos(),
            Cos => (t * x.sin()).negative(),
            Tan => t * (y.square() + 1.0),
            ArcSin => t * (one() - x.square()).rsqrt(),
            ArcCos => (t * (one() - x.square()).rsqrt()).negative(),
            ArcTan => t / (x.square() + 1.0),
            Sinh => t * x.cosh(),
            Cosh => t * x.sinh(),
            Tanh => t * (one() - y.square()),
            ArcSinh => t * (x.square() + 1.0).rsqrt(),
            ArcCosh => t * (x.square() - 1.0).rsqrt(),
            ArcTanh => t / (one() - x.square()),
            Sigmoid => t * y * (one() - y),
            Erf => t * x.square().negative().exp() * std::f64::consts::FRAC_2_SQRT_PI,
            ErfInv => t * y.square().exp() * (std::f64::consts::PI.sqrt() / 2.0),
            Conjugate => t.conjugate(),
        })
    }
}

impl BinaryOp {
    /// The cotangents of `a` and `b` for cotangent `g` of output `y` (`None`: zero).
    pub(crate) fn vjp(self, a: &Array, b: &Array, y: &Array, g: &Array) -> [Option<Array>; 2] {
        use BinaryOp::*;
        if !a.dtype().is_inexact() || !y.dtype().is_inexact() {
            return [None, None];
        }
        match self {
            Add => [Some(g.clone()), Some(g.clone())],
            Subtract => [Some(g.clone()), Some(g.negative())],
            Multiply => [Some(g * b), Some(g * a)],
            Divide => [Some(g / b), Some((g * y / b).negative())],
            Power => {
                let da = g * b * a.power(b - 1.0);
                // d/db a^b = a^b log a, taken as 0 where a == 0 (as MLX).
                let log_a = crate::ops::where_(a.equal(0.0), 0.0, a.log());
                [Some(da), Some(g * y * log_a)]
            }
            Maximum => {
                let m = a.greater(b);
                [Some(g * &m), Some(g * m.logical_not())]
            }
            Minimum => {
                let m = a.less(b);
                [Some(g * &m), Some(g * m.logical_not())]
            }
            LogAddExp => [Some(g * (a - y).exp()), Some(g * (b - y).exp())],
            ArcTan2 => {
                let d = a.square() + b.square();
                [Some(g * b / &d), Some((g * a / &d).negative())]
            }
            Remainder => [Some(g.clone()), Some((g * a.floor_divide(b)).negative())],
            FloorDivide => [None, None],
            _ => [None, None],
        }
    }

    /// The output tangent from tangents of `a` and `b` (`None`: zero).
    pub(crate) fn jvp(self, a: &Array, b: &Array, y: &Array, ta: Option<&Array>, tb: Option<&Array>) -> Option<Array> {
        let [da, db] = match (ta, tb) {
            (None, None) => return None,
            _ => [ta, tb],
        };
        // Every binary derivative here is linear in the cotangent, so the vjp rule applied to a
        // tangent gives the matching jvp term.
        let terms =
            [da.and_then(|t| self.vjp(a, b, y, t)[0].clone()), db.and_then(|t| self.vjp(a, b, y, t)[1].clone())];
        match terms {
            [Some(x), Some(z)] => Some(x + z),
            [Some(x), None] | [None, Some(x)] => Some(x),
            [None, None] => None,
        }
    }
}
