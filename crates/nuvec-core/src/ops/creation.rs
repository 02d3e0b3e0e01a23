//! Arrays made from nothing: constants, ranges, identity and triangular masks.

use crate::array::{Array, ScalarOrArray};
use crate::dtype::{DType, Scalar};
use crate::error::OpErrorKind;
use crate::primitive::Primitive;
use crate::shape::{IntoShape, Shape, check_shape};
use crate::storage::Spec;

use super::invalid;

#[track_caller]
fn shape_or_fail(op: &'static str, shape: impl IntoShape) -> Result<Shape, Array> {
    // Explicit matches: `#[track_caller]` does not reach through closures.
    let shape = match shape.into_shape() {
        Ok(s) => s,
        Err(bad) => return Err(Array::failed(op, OpErrorKind::InvalidShape(bad))),
    };
    match check_shape(&shape) {
        Ok(()) => Ok(shape),
        Err(k) => Err(Array::failed(op, k)),
    }
}

/// An array of `shape` filled with `value` (a weak scalar takes its default dtype: `float32`
/// for floats, `int32` for integers; an array value is broadcast).
///
/// ```
/// use nuvec::{ops, DType};
/// let a = ops::full([2, 2], 7);
/// assert_eq!((a.dtype(), a.to_vec::<i32>().unwrap()), (DType::I32, vec![7; 4]));
/// ```
#[track_caller]
pub fn full(shape: impl IntoShape, value: impl Into<ScalarOrArray>) -> Array {
    let shape = match shape_or_fail("full", shape) {
        Ok(s) => s,
        Err(f) => return f,
    };
    let value = value.into().into_array();
    if let Some(f) = super::propagate(&[&value]) {
        return f;
    }
    match crate::shape::broadcast_shapes(value.shape(), &shape) {
        Ok(b) if b[..] == shape[..] => value.broadcast_to(&shape),
        _ => Array::failed("full", OpErrorKind::ShapeMismatch { lhs: value.shape().to_vec(), rhs: shape.to_vec() }),
    }
}

/// An array of `shape` filled with `value` converted to `dtype`.
#[track_caller]
pub fn full_dtype(shape: impl IntoShape, value: impl Into<Scalar>, dtype: DType) -> Array {
    full_named("full", shape, value.into(), dtype)
}

/// `full_dtype` reporting errors as `op` (`zeros`, `ones`, ...).
#[track_caller]
fn full_named(op: &'static str, shape: impl IntoShape, value: Scalar, dtype: DType) -> Array {
    let shape = match shape_or_fail(op, shape) {
        Ok(s) => s,
        Err(f) => return f,
    };
    if !value.fits(dtype) && !matches!(value, Scalar::Float(_)) {
        return invalid(op, format!("the value {value:?} cannot be represented as {dtype}"));
    }
    Array::scalar(value, dtype).broadcast_to(&shape)
}

/// Zeros of `shape` and `dtype`.
///
/// ```
/// use nuvec::{ops, DType};
/// assert_eq!(ops::zeros([3], DType::F16).to_vec::<nuvec::f16>().unwrap().len(), 3);
/// ```
#[track_caller]
pub fn zeros(shape: impl IntoShape, dtype: DType) -> Array {
    full_named("zeros", shape, Scalar::Int(0), dtype)
}

/// Ones of `shape` and `dtype`.
#[track_caller]
pub fn ones(shape: impl IntoShape, dtype: DType) -> Array {
    full_named("ones", shape, Scalar::Int(1), dtype)
}

/// Zeros with the shape and dtype of `x`.
#[track_caller]
pub fn zeros_like(x: &Array) -> Array {
    x.zeros_like()
}

/// Ones with the shape and dtype of `x`.
#[track_caller]
pub fn ones_like(x: &Array) -> Array {
    x.ones_like()
}

/// `value` with the shape and dtype of `x`.
#[track_caller]
pub fn full_like(x: &Array, value: impl Into<Scalar>) -> Array {
    x.full_like(value)
}

impl Array {
    /// Zeros with this array's shape and dtype.
    #[track_caller]
    pub fn zeros_like(&self) -> Array {
        self.full_like(0)
    }

    /// Ones with this array's shape and dtype.
    #[track_caller]
    pub fn ones_like(&self) -> Array {
        self.full_like(1)
    }

    /// `value` with this array's shape and dtype.
    #[track_caller]
    pub fn full_like(&self, value: impl Into<Scalar>) -> Array {
        if let Some(f) = super::propagate(&[self]) {
            return f;
        }
        full_named("full_like", self.shape(), value.into(), self.dtype())
    }
}

/// `start, start + step, ...` below `stop` (above, for a negative step). The dtype is
/// `float32` when any bound is a float, else `int32`.
///
/// ```
/// use nuvec::ops;
/// assert_eq!(ops::arange(0, 10, 3).to_vec::<i32>().unwrap(), vec![0, 3, 6, 9]);
/// assert_eq!(ops::arange(0.0, 1.0, 0.25).shape(), &[4]);
/// ```
#[track_caller]
pub fn arange(start: impl Into<Scalar>, stop: impl Into<Scalar>, step: impl Into<Scalar>) -> Array {
    let (start, stop, step) = (start.into(), stop.into(), step.into());
    let float = [start, stop, step].iter().any(|s| matches!(s, Scalar::Float(_)));
    arange_dtype(start, stop, step, if float { DType::F32 } else { DType::I32 })
}

/// `arange` with an explicit dtype.
#[track_caller]
pub fn arange_dtype(start: impl Into<Scalar>, stop: impl Into<Scalar>, step: impl Into<Scalar>, dtype: DType) -> Array {
    let (start, stop, step) = (start.into().as_f64(), stop.into().as_f64(), step.into().as_f64());
    if step == 0.0 || !step.is_finite() || !start.is_finite() || !stop.is_finite() {
        return invalid("arange", format!("start {start}, stop {stop} and step {step} must be finite with step != 0"));
    }
    if dtype == DType::Bool || dtype == DType::Complex64 {
        return Array::failed("arange", OpErrorKind::UnsupportedDType(dtype));
    }
    let n = ((stop - start) / step).ceil().max(0.0);
    if n > i32::MAX as f64 {
        return invalid("arange", format!("{n} elements exceed the largest axis"));
    }
    let shape: Shape = [n as i32].into_iter().collect();
    Array::from_node(Primitive::Arange { start, step }, vec![], vec![Spec { shape, dtype }]).remove(0)
}

/// `num` evenly spaced values from `start` to `stop` inclusive, as `dtype` (MLX: `float32`).
#[track_caller]
pub fn linspace(start: f64, stop: f64, num: i32, dtype: DType) -> Array {
    if num < 0 {
        return invalid("linspace", format!("num must be non-negative, got {num}"));
    }
    if !dtype.is_inexact() {
        let f = linspace(start, stop, num, DType::F32);
        return f.astype(dtype);
    }
    if num == 1 {
        return full_dtype([1], start, dtype);
    }
    // (1 − t)·start + t·stop hits both ends exactly.
    let t = arange_dtype(0, num, 1, DType::F32) / (num - 1) as f32;
    let t_bar = 1.0f32 - &t;
    (t_bar * start as f32 + t * stop as f32).astype(dtype)
}

/// `n × m` (`m = n` when `None`) with ones on diagonal `k` (above the main one for `k > 0`).
#[track_caller]
pub fn eye(n: i32, m: impl Into<Option<i32>>, k: i32, dtype: DType) -> Array {
    eye_named("eye", n, m.into().unwrap_or(n), k, dtype)
}

#[track_caller]
fn eye_named(op: &'static str, n: i32, m: i32, k: i32, dtype: DType) -> Array {
    if n < 0 || m < 0 {
        return invalid(op, format!("sizes must be non-negative, got {n} × {m}"));
    }
    // Diagonals past either edge are all zeros: clamp k so `row + k` cannot overflow.
    let k = k.clamp(-(n.saturating_add(1)), m.saturating_add(1));
    let rows = arange(0, n, 1).reshape([n, 1]);
    let cols = arange(0, m, 1).reshape([1, m]);
    (rows + k).equal(&cols).astype(dtype)
}

/// The `n × n` identity.
#[track_caller]
pub fn identity(n: i32, dtype: DType) -> Array {
    eye_named("identity", n, n, 0, dtype)
}

/// `n × m` with ones at and below diagonal `k`.
#[track_caller]
pub fn tri(n: i32, m: impl Into<Option<i32>>, k: i32, dtype: DType) -> Array {
    let m = m.into().unwrap_or(n);
    if n < 0 || m < 0 {
        return invalid("tri", format!("sizes must be non-negative, got {n} × {m}"));
    }
    // Past either edge the mask is all ones or all zeros: clamp k so `row + k` cannot overflow.
    let k = k.clamp(-(n.saturating_add(1)), m.saturating_add(1));
    let rows = arange(0, n, 1).reshape([n, 1]);
    let cols = arange(0, m, 1).reshape([1, m]);
    (rows + k).greater_equal(&cols).astype(dtype)
}
