//! Operations with MLX's names, as free functions (`use nuvec::ops as mx;` ports MLX code line
//! by line). Each is also a method of [`Array`].
//!
//! Operations never fail on the spot: bad arguments give a failed array naming the operation,
//! the argument and the reason, and a failed input makes the output fail with the same error.

mod conv;
mod creation;
mod einsum;
pub(crate) mod elementwise;
mod gather;
mod indexing;
mod linalg;
mod operators;
pub(crate) mod quantize;
mod reduce;
mod shape;
mod sort;

pub use conv::*;
pub use creation::*;
pub use einsum::*;
pub use elementwise::*;
pub use gather::*;
pub use indexing::*;
pub use linalg::*;
pub use quantize::*;
pub use reduce::*;
pub use shape::*;
pub use sort::*;

use crate::array::Array;
use crate::error::OpErrorKind;

/// The first failed array among `inputs`, as the output of an operation on them.
pub(crate) fn propagate(inputs: &[&Array]) -> Option<Array> {
    inputs.iter().find_map(|a| a.error()).map(Array::from_error)
}

/// Normalised axes, or a failed array naming `op`.
#[track_caller]
pub(crate) fn axes_or_fail(op: &'static str, axes: &[i32], ndim: usize) -> Result<Vec<usize>, Array> {
    match crate::shape::normalize_axes(axes, ndim) {
        Ok(a) => Ok(a),
        Err(k) => Err(Array::failed(op, k)),
    }
}

/// One normalised axis, or a failed array naming `op`.
#[track_caller]
pub(crate) fn axis_or_fail(op: &'static str, axis: i32, ndim: usize) -> Result<usize, Array> {
    match crate::shape::normalize_axis(axis, ndim) {
        Ok(a) => Ok(a),
        Err(k) => Err(Array::failed(op, k)),
    }
}

/// A size computed in 64 bits as an axis size, or a failed array when it passes `i32::MAX`.
#[track_caller]
pub(crate) fn dim_or_fail(op: &'static str, size: i64, shape: impl FnOnce() -> Vec<i64>) -> Result<i32, Array> {
    if (0..=i32::MAX as i64).contains(&size) {
        Ok(size as i32)
    } else {
        Err(Array::failed(op, OpErrorKind::InvalidShape(shape())))
    }
}

/// A failed array for an argument described in words.
#[track_caller]
pub(crate) fn invalid(op: &'static str, msg: impl Into<String>) -> Array {
    Array::failed(op, OpErrorKind::InvalidArgument(msg.into()))
}
