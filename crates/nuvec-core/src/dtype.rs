//! Element types: the 14 dtypes, MLX's promotion table, host element types and scalars.

use std::fmt;

pub use half::{bf16, f16};
/// A complex number with `f32` parts, the element type of [`DType::Complex64`].
pub type Complex64 = num_complex::Complex<f32>;

/// The element type of an array.
///
/// The order is MLX's and is part of the fixture format (`DType as u8`).
#[repr(u8)]
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// Booleans, stored as one byte holding 0 or 1.
    Bool,
    /// Unsigned 8-bit integers.
    U8,
    /// Unsigned 16-bit integers.
    U16,
    /// Unsigned 32-bit integers.
    U32,
    /// Unsigned 64-bit integers.
    U64,
    /// Signed 8-bit integers.
    I8,
    /// Signed 16-bit integers.
    I16,
    /// Signed 32-bit integers.
    I32,
    /// Signed 64-bit integers.
    I64,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
    /// IEEE single precision.
    F32,
    /// IEEE double precision.
    F64,
    /// Complex numbers with `f32` parts.
    Complex64,
}

/// The kind of a dtype, as MLX's `Dtype::Category`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Category {
    /// `Bool`.
    Bool,
    /// `U8` … `U64`.
    Unsigned,
    /// `I8` … `I64`.
    Signed,
    /// `F16`, `BF16`, `F32`, `F64`.
    Float,
    /// `Complex64`.
    Complex,
}

impl DType {
    /// Every dtype, in MLX's order.
    pub const ALL: [DType; 14] = [
        DType::Bool,
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::Complex64,
    ];

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::Bool | DType::U8 | DType::I8 => 1,
            DType::U16 | DType::I16 | DType::F16 | DType::BF16 => 2,
            DType::U32 | DType::I32 | DType::F32 => 4,
            DType::U64 | DType::I64 | DType::F64 | DType::Complex64 => 8,
        }
    }

    /// The dtype's category.
    pub const fn category(self) -> Category {
        match self {
            DType::Bool => Category::Bool,
            DType::U8 | DType::U16 | DType::U32 | DType::U64 => Category::Unsigned,
            DType::I8 | DType::I16 | DType::I32 | DType::I64 => Category::Signed,
            DType::F16 | DType::BF16 | DType::F32 | DType::F64 => Category::Float,
            DType::Complex64 => Category::Complex,
        }
    }

    /// Real floating point (`F16`, `BF16`, `F32`, `F64`).
    pub const fn is_float(self) -> bool {
        matches!(self.category(), Category::Float)
    }

    /// Floating point or complex.
    pub const fn is_inexact(self) -> bool {
        matches!(self.category(), Category::Float | Category::Complex)
    }

    /// Signed or unsigned integer (not `Bool`).
    pub const fn is_integer(self) -> bool {
        matches!(self.category(), Category::Signed | Category::Unsigned)
    }

    /// `F16` or `BF16`: types whose arithmetic accumulates in `f32`.
    pub const fn is_half(self) -> bool {
        matches!(self, DType::F16 | DType::BF16)
    }

    /// MLX's name (`"float32"`, `"bfloat16"`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::U8 => "uint8",
            DType::U16 => "uint16",
            DType::U32 => "uint32",
            DType::U64 => "uint64",
            DType::I8 => "int8",
            DType::I16 => "int16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::Complex64 => "complex64",
        }
    }

    /// The dtype with the given fixture code (`DType as u8`).
    pub fn from_code(code: u8) -> Option<DType> {
        DType::ALL.get(code as usize).copied()
    }

    /// The dtype itself when inexact, else `F32` (MLX's `at_least_float`).
    pub const fn at_least_float(self) -> DType {
        if self.is_inexact() { self } else { DType::F32 }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// MLX's type promotion: the dtype a binary operation on `a` and `b` computes in.
///
/// Integers of mixed sign widen to the next signed size; `uint64` with a signed type gives
/// `float32`; any integer with a float gives the float; `float16` with `bfloat16` gives
/// `float32`; anything with `complex64` gives `complex64`.
pub fn promote_types(a: DType, b: DType) -> DType {
    use DType::*;
    if a == b {
        return a;
    }
    if a == Complex64 || b == Complex64 {
        return Complex64;
    }
    if a == Bool {
        return b;
    }
    if b == Bool {
        return a;
    }
    match (a.is_float(), b.is_float()) {
        (true, true) => {
            if a == F64 || b == F64 {
                F64
            } else if a == F32 || b == F32 {
                F32
            } else {
                // f16 with bf16
                F32
            }
        }
        (true, false) => a,
        (false, true) => b,
        (false, false) => promote_integers(a, b),
    }
}

fn promote_integers(a: DType, b: DType) -> DType {
    use DType::*;
    let (ua, ub) = (a.category() == Category::Unsigned, b.category() == Category::Unsigned);
    if ua == ub {
        return if a.size() >= b.size() { a } else { b };
    }
    let (u, s) = if ua { (a, b) } else { (b, a) };
    match u {
        U64 => F32,
        _ => {
            // Signed type wide enough for both.
            let bytes = (u.size() * 2).max(s.size());
            match bytes {
                1 => I8,
                2 => I16,
                4 => I32,
                _ => I64,
            }
        }
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A host element type: one per dtype (`bool`, `u8` … `i64`, `f16`, `bf16`, `f32`, `f64`,
/// [`Complex64`]).
pub trait Element: Copy + Send + Sync + PartialEq + fmt::Debug + 'static + sealed::Sealed {
    /// The dtype of arrays of this element.
    const DTYPE: DType;
    /// Appends the element's bytes (native endian) to `out`.
    fn extend_bytes(values: &[Self], out: &mut Vec<u8>);
    /// Reads elements back from their bytes.
    fn from_bytes(bytes: &[u8]) -> Vec<Self>;
    /// The element as a scalar of its kind.
    fn to_scalar(self) -> Scalar;
}

macro_rules! pod_element {
    ($($t:ty => $d:ident, $kind:ident, $conv:expr;)*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            fn extend_bytes(values: &[Self], out: &mut Vec<u8>) {
                out.extend_from_slice(bytemuck::cast_slice(values));
            }
            fn from_bytes(bytes: &[u8]) -> Vec<Self> {
                bytemuck::pod_collect_to_vec(bytes)
            }
            fn to_scalar(self) -> Scalar {
                let f: fn($t) -> Scalar = $conv;
                f(self)
            }
        }
    )*};
}

pod_element! {
    u8 => U8, Int, |v| Scalar::Int(v as i64);
    u16 => U16, Int, |v| Scalar::Int(v as i64);
    u32 => U32, Int, |v| Scalar::Int(v as i64);
    u64 => U64, Int, Scalar::UInt;
    i8 => I8, Int, |v| Scalar::Int(v as i64);
    i16 => I16, Int, |v| Scalar::Int(v as i64);
    i32 => I32, Int, |v| Scalar::Int(v as i64);
    i64 => I64, Int, Scalar::Int;
    f16 => F16, Float, |v| Scalar::Float(v.to_f64());
    bf16 => BF16, Float, |v| Scalar::Float(v.to_f64());
    f32 => F32, Float, |v| Scalar::Float(v as f64);
    f64 => F64, Float, Scalar::Float;
    Complex64 => Complex64, Complex, Scalar::Complex;
}

impl sealed::Sealed for bool {}
impl Element for bool {
    const DTYPE: DType = DType::Bool;
    fn extend_bytes(values: &[Self], out: &mut Vec<u8>) {
        out.extend(values.iter().map(|&b| b as u8));
    }
    fn from_bytes(bytes: &[u8]) -> Vec<Self> {
        bytes.iter().map(|&b| b != 0).collect()
    }
    fn to_scalar(self) -> Scalar {
        Scalar::Bool(self)
    }
}

/// A Rust scalar used as an operand. Scalars are *weak* (MLX's rule for Python scalars): they
/// take the dtype of the array they meet when it can hold their kind.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scalar {
    /// A boolean.
    Bool(bool),
    /// A signed integer.
    Int(i64),
    /// An unsigned integer above `i64::MAX` range (kept exact).
    UInt(u64),
    /// A real number.
    Float(f64),
    /// A complex number.
    Complex(Complex64),
}

impl Scalar {
    /// The dtype a lone scalar gets: `Bool`, `I32`, `F32` or `Complex64` (MLX's defaults).
    pub fn default_dtype(self) -> DType {
        match self {
            Scalar::Bool(_) => DType::Bool,
            Scalar::Int(_) | Scalar::UInt(_) => DType::I32,
            Scalar::Float(_) => DType::F32,
            Scalar::Complex(_) => DType::Complex64,
        }
    }

    /// The dtype this weak scalar takes next to an array of `dtype`.
    pub fn weak_dtype_with(self, dtype: DType) -> DType {
        match self {
            Scalar::Bool(_) => dtype,
            Scalar::Int(_) | Scalar::UInt(_) => {
                if dtype == DType::Bool {
                    DType::I32
                } else {
                    dtype
                }
            }
            Scalar::Float(_) => {
                if dtype.is_inexact() {
                    dtype
                } else {
                    DType::F32
                }
            }
            Scalar::Complex(_) => DType::Complex64,
        }
    }

    /// Whether the value is representable in `dtype` (integers must be in range; reals and
    /// booleans fit any inexact dtype).
    pub fn fits(self, dtype: DType) -> bool {
        let v: i128 = match self {
            Scalar::Int(v) => v as i128,
            Scalar::UInt(v) => v as i128,
            Scalar::Bool(_) => return true,
            Scalar::Float(_) => return dtype.is_inexact(),
            Scalar::Complex(_) => return dtype == DType::Complex64,
        };
        let (lo, hi): (i128, i128) = match dtype {
            DType::U8 => (0, u8::MAX as i128),
            DType::U16 => (0, u16::MAX as i128),
            DType::U32 => (0, u32::MAX as i128),
            DType::U64 => (0, u64::MAX as i128),
            DType::I8 => (i8::MIN as i128, i8::MAX as i128),
            DType::I16 => (i16::MIN as i128, i16::MAX as i128),
            DType::I32 => (i32::MIN as i128, i32::MAX as i128),
            DType::I64 => (i64::MIN as i128, i64::MAX as i128),
            DType::Bool => (0, 1),
            _ => return true,
        };
        (lo..=hi).contains(&v)
    }

    /// The value as `f64` (real part for complex).
    pub fn as_f64(self) -> f64 {
        match self {
            Scalar::Bool(b) => b as u8 as f64,
            Scalar::Int(v) => v as f64,
            Scalar::UInt(v) => v as f64,
            Scalar::Float(v) => v,
            Scalar::Complex(c) => c.re as f64,
        }
    }

    /// The scalar's bytes as an element of `dtype` (C-style conversion, as `astype`).
    pub fn to_bytes(self, dtype: DType) -> Vec<u8> {
        let mut out = Vec::with_capacity(dtype.size());
        macro_rules! put {
            ($v:expr) => {
                out.extend_from_slice(bytemuck::bytes_of(&$v))
            };
        }
        // Integers convert through i128 so that u64 and i64 values both stay exact.
        let int = |s: Scalar| -> i128 {
            match s {
                Scalar::Bool(b) => b as i128,
                Scalar::Int(v) => v as i128,
                Scalar::UInt(v) => v as i128,
                Scalar::Float(v) => v as i128,
                Scalar::Complex(c) => c.re as i128,
            }
        };
        match dtype {
            DType::Bool => out.push((self.as_f64() != 0.0 || matches!(self, Scalar::Complex(c) if c.im != 0.0)) as u8),
            DType::U8 => put!(int(self) as u8),
            DType::U16 => put!(int(self) as u16),
            DType::U32 => put!(int(self) as u32),
            DType::U64 => put!(int(self) as u64),
            DType::I8 => put!(int(self) as i8),
            DType::I16 => put!(int(self) as i16),
            DType::I32 => put!(int(self) as i32),
            DType::I64 => put!(int(self) as i64),
            DType::F16 => put!(f16::from_f64(self.as_f64())),
            DType::BF16 => put!(bf16::from_f64(self.as_f64())),
            DType::F32 => put!(self.as_f64() as f32),
            DType::F64 => put!(self.as_f64()),
            DType::Complex64 => put!(match self {
                Scalar::Complex(c) => c,
                s => Complex64::new(s.as_f64() as f32, 0.0),
            }),
        }
        out
    }
}

macro_rules! scalar_from {
    ($($t:ty => $variant:ident as $as:ty),*) => {$(
        impl From<$t> for Scalar {
            fn from(v: $t) -> Self { Scalar::$variant(v as $as) }
        }
    )*};
}
scalar_from!(u8 => Int as i64, u16 => Int as i64, u32 => Int as i64, i8 => Int as i64,
    i16 => Int as i64, i32 => Int as i64, i64 => Int as i64, usize => Int as i64,
    isize => Int as i64, f32 => Float as f64, f64 => Float as f64);

impl From<u64> for Scalar {
    fn from(v: u64) -> Self {
        if v <= i64::MAX as u64 { Scalar::Int(v as i64) } else { Scalar::UInt(v) }
    }
}
impl From<bool> for Scalar {
    fn from(v: bool) -> Self {
        Scalar::Bool(v)
    }
}
impl From<f16> for Scalar {
    fn from(v: f16) -> Self {
        Scalar::Float(v.to_f64())
    }
}
impl From<bf16> for Scalar {
    fn from(v: bf16) -> Self {
        Scalar::Float(v.to_f64())
    }
}
impl From<Complex64> for Scalar {
    fn from(v: Complex64) -> Self {
        Scalar::Complex(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promotion_matches_mlx_table() {
        // Rows and columns in DType::ALL order; recorded from MLX 0.32.4 (`(a + b).dtype`).
        const TABLE: [&str; 14] = [
            "b u8 u16 u32 u64 i8 i16 i32 i64 f16 bf16 f32 f64 c64",
            "u8 u8 u16 u32 u64 i16 i16 i32 i64 f16 bf16 f32 f64 c64",
            "u16 u16 u16 u32 u64 i32 i32 i32 i64 f16 bf16 f32 f64 c64",
            "u32 u32 u32 u32 u64 i64 i64 i64 i64 f16 bf16 f32 f64 c64",
            "u64 u64 u64 u64 u64 f32 f32 f32 f32 f16 bf16 f32 f64 c64",
            "i8 i16 i32 i64 f32 i8 i16 i32 i64 f16 bf16 f32 f64 c64",
            "i16 i16 i32 i64 f32 i16 i16 i32 i64 f16 bf16 f32 f64 c64",
            "i32 i32 i32 i64 f32 i32 i32 i32 i64 f16 bf16 f32 f64 c64",
            "i64 i64 i64 i64 f32 i64 i64 i64 i64 f16 bf16 f32 f64 c64",
            "f16 f16 f16 f16 f16 f16 f16 f16 f16 f16 f32 f32 f64 c64",
            "bf16 bf16 bf16 bf16 bf16 bf16 bf16 bf16 bf16 f32 bf16 f32 f64 c64",
            "f32 f32 f32 f32 f32 f32 f32 f32 f32 f32 f32 f32 f64 c64",
            "f64 f64 f64 f64 f64 f64 f64 f64 f64 f64 f64 f64 f64 c64",
            "c64 c64 c64 c64 c64 c64 c64 c64 c64 c64 c64 c64 c64 c64",
        ];
        let short = |d: DType| match d {
            DType::Bool => "b",
            DType::U8 => "u8",
            DType::U16 => "u16",
            DType::U32 => "u32",
            DType::U64 => "u64",
            DType::I8 => "i8",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::Complex64 => "c64",
        };
        for (i, row) in TABLE.iter().enumerate() {
            for (j, want) in row.split(' ').enumerate() {
                let got = promote_types(DType::ALL[i], DType::ALL[j]);
                assert_eq!(short(got), want, "{} + {}", DType::ALL[i], DType::ALL[j]);
            }
        }
    }

    #[test]
    fn weak_scalars_follow_mlx() {
        assert_eq!(Scalar::Int(1).weak_dtype_with(DType::Bool), DType::I32);
        assert_eq!(Scalar::Int(1).weak_dtype_with(DType::U8), DType::U8);
        assert_eq!(Scalar::Float(1.5).weak_dtype_with(DType::I32), DType::F32);
        assert_eq!(Scalar::Float(1.5).weak_dtype_with(DType::F16), DType::F16);
        assert_eq!(Scalar::Bool(true).weak_dtype_with(DType::U16), DType::U16);
    }
}
