//! Making arrays from host values: slices, scalars, vectors, nested literals (`array!`).

use crate::array::{Array, State};
use crate::dtype::{DType, Element, Scalar, bf16, f16};
use crate::error::OpErrorKind;
use crate::shape::{IntoShape, Shape, elem_count};
use crate::storage::Data;

impl Array {
    /// An evaluated array of `data` with `shape` (row-major).
    ///
    /// ```
    /// use nuvec::Array;
    /// let a = Array::from_slice(&[1i32, 2, 3, 4, 5, 6], [2, 3]);
    /// assert_eq!(a.shape(), &[2, 3]);
    /// assert!(Array::from_slice(&[1.0f32; 5], [2, 3]).is_failed());
    /// ```
    #[track_caller]
    pub fn from_slice<T: Element>(data: &[T], shape: impl IntoShape) -> Array {
        let shape = match shape.into_shape() {
            Ok(s) => s,
            Err(bad) => return Array::failed("from_slice", OpErrorKind::InvalidShape(bad)),
        };
        if let Err(kind) = crate::shape::check_shape(&shape) {
            return Array::failed("from_slice", kind);
        }
        if elem_count(&shape) != data.len() {
            return Array::failed(
                "from_slice",
                OpErrorKind::SizeMismatch { expected: elem_count(&shape), actual: data.len() },
            );
        }
        let mut bytes = Vec::with_capacity(std::mem::size_of_val(data));
        T::extend_bytes(data, &mut bytes);
        Array::from_bytes(shape, T::DTYPE, &bytes)
    }

    /// An evaluated array from raw native-endian bytes (row-major).
    pub(crate) fn from_bytes(shape: Shape, dtype: DType, bytes: &[u8]) -> Array {
        match Data::from_host_bytes(&shape, bytes) {
            Ok(data) => Array::with_state(shape, dtype, State::Ready(data)),
            Err(e) => Array::from_error(e),
        }
    }

    /// A 0-d array holding `value` converted to `dtype`.
    pub fn scalar(value: impl Into<Scalar>, dtype: DType) -> Array {
        let value = value.into();
        Array::from_bytes(Shape::new(), dtype, &value.to_bytes(dtype))
    }

    /// An array of host bytes with the given shape and dtype, or a failed array when the byte
    /// count does not match.
    #[track_caller]
    pub fn from_raw_bytes(bytes: &[u8], shape: impl IntoShape, dtype: DType) -> Array {
        let shape = match shape.into_shape() {
            Ok(s) => s,
            Err(bad) => return Array::failed("from_raw_bytes", OpErrorKind::InvalidShape(bad)),
        };
        if let Err(kind) = crate::shape::check_shape(&shape) {
            return Array::failed("from_raw_bytes", kind);
        }
        let want = elem_count(&shape) * dtype.size();
        if want != bytes.len() {
            return Array::failed("from_raw_bytes", OpErrorKind::SizeMismatch { expected: want, actual: bytes.len() });
        }
        Array::from_bytes(shape, dtype, bytes)
    }
}

macro_rules! from_element {
    ($($t:ty),*) => {$(
        impl From<$t> for Array {
            /// A 0-d array.
            fn from(v: $t) -> Array { Array::from_slice(&[v], ()) }
        }
        impl From<Vec<$t>> for Array {
            /// A 1-d array.
            fn from(v: Vec<$t>) -> Array { let n = v.len(); Array::from_slice(&v, [n]) }
        }
        impl From<&[$t]> for Array {
            /// A 1-d array.
            fn from(v: &[$t]) -> Array { Array::from_slice(v, [v.len()]) }
        }
        impl<const N: usize> From<[$t; N]> for Array {
            /// A 1-d array.
            fn from(v: [$t; N]) -> Array { Array::from_slice(&v, [N]) }
        }
        impl FromIterator<$t> for Array {
            fn from_iter<I: IntoIterator<Item = $t>>(iter: I) -> Array {
                let v: Vec<$t> = iter.into_iter().collect();
                Array::from(v)
            }
        }
    )*};
}
from_element!(bool, u8, u16, u32, u64, i8, i16, i32, i64, f16, bf16, f32, f64, crate::dtype::Complex64);

impl From<&Array> for Array {
    fn from(a: &Array) -> Array {
        a.clone()
    }
}

/// An operand of a binary operation: an array, or a weak Rust scalar that takes the other
/// operand's dtype (MLX's rule for Python scalars).
#[derive(Clone)]
pub enum ScalarOrArray {
    /// A weak scalar.
    Scalar(Scalar),
    /// An array.
    Array(Array),
}

impl From<&Array> for ScalarOrArray {
    fn from(a: &Array) -> Self {
        ScalarOrArray::Array(a.clone())
    }
}
impl From<Array> for ScalarOrArray {
    fn from(a: Array) -> Self {
        ScalarOrArray::Array(a)
    }
}
impl From<&&Array> for ScalarOrArray {
    fn from(a: &&Array) -> Self {
        ScalarOrArray::Array((*a).clone())
    }
}
impl From<Scalar> for ScalarOrArray {
    fn from(s: Scalar) -> Self {
        ScalarOrArray::Scalar(s)
    }
}
macro_rules! scalar_operand {
    ($($t:ty),*) => {$(
        impl From<$t> for ScalarOrArray {
            fn from(v: $t) -> Self { ScalarOrArray::Scalar(Scalar::from(v)) }
        }
    )*};
}
scalar_operand!(bool, u8, u16, u32, u64, i8, i16, i32, i64, usize, isize, f16, bf16, f32, f64, crate::dtype::Complex64);

impl ScalarOrArray {
    /// The operand as an array: a weak scalar gets its default dtype.
    pub fn into_array(self) -> Array {
        match self {
            ScalarOrArray::Array(a) => a,
            ScalarOrArray::Scalar(s) => Array::scalar(s, s.default_dtype()),
        }
    }
}

/// A nested literal of fixed-size arrays (`[[1.0, 2.0], [3.0, 4.0]]`), as `array!` takes it.
pub trait ArrayLiteral {
    /// The element type at the leaves.
    type Elem: Element;
    /// Appends the sizes of the nested dimensions.
    fn push_shape(out: &mut Vec<i32>);
    /// Appends the leaves in row-major order.
    fn push_values(&self, out: &mut Vec<Self::Elem>);
}

macro_rules! literal_leaf {
    ($($t:ty),*) => {$(
        impl ArrayLiteral for $t {
            type Elem = $t;
            fn push_shape(_out: &mut Vec<i32>) {}
            fn push_values(&self, out: &mut Vec<$t>) { out.push(*self) }
        }
    )*};
}
literal_leaf!(bool, u8, u16, u32, u64, i8, i16, i32, i64, f16, bf16, f32, f64, crate::dtype::Complex64);

impl<L: ArrayLiteral, const N: usize> ArrayLiteral for [L; N] {
    type Elem = L::Elem;
    fn push_shape(out: &mut Vec<i32>) {
        out.push(N as i32);
        L::push_shape(out)
    }
    fn push_values(&self, out: &mut Vec<L::Elem>) {
        self.iter().for_each(|x| x.push_values(out))
    }
}

impl Array {
    /// Builds an array from a nested literal. Unsuffixed float literals (Rust's `f64` default)
    /// become `float32`, as in MLX, unless the source says `f64`; used by [`array!`].
    #[doc(hidden)]
    pub fn __from_literal<L: ArrayLiteral>(literal: L, source: &str) -> Array {
        let mut shape = Vec::new();
        L::push_shape(&mut shape);
        let mut values = Vec::new();
        literal.push_values(&mut values);
        let a = Array::from_slice(&values, shape);
        if L::Elem::DTYPE == DType::F64 && !source.contains("f64") { a.astype(DType::F32).contiguous_eval() } else { a }
    }

    /// Evaluates a freshly converted constant so literals are ready arrays.
    fn contiguous_eval(self) -> Array {
        let _ = self.eval();
        self
    }
}

/// An array from a (nested) literal: `array![1, 2, 3]` (`int32`), `array![[1.0, 2.0], [3.0,
/// 4.0]]` (`float32`), `array![1.0f64, 2.0]` (`float64`), `array![true, false]`.
///
/// ```
/// use nuvec::{array, DType};
/// assert_eq!(array![[1.0, 2.0], [3.0, 4.0]].dtype(), DType::F32);
/// assert_eq!(array![1, 2, 3].shape(), &[3]);
/// assert_eq!(array![1.5f64].dtype(), DType::F64);
/// ```
#[macro_export]
macro_rules! array {
    ($($t:tt)*) => {
        $crate::Array::__from_literal([$($t)*], stringify!($($t)*))
    };
}
