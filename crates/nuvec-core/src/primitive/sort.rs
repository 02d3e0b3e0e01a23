//! Sorting and selection along one axis: sort, argsort, partition and argpartition, with their
//! shape rule and their derivative and batching rules.
//!
//! Order (as MLX): ascending, NaN after every number (NaNs compare equal to each other), `-0.0`
//! equal to `0.0`, complex numbers by real then imaginary part, `false < true`. Sorts are stable:
//! equal elements keep their index order. A partition puts the element of rank `kth` at `kth`,
//! nothing greater before it and nothing smaller after it; the order within the two sides is
//! left to the backend (the CPU selects, the GPU sorts), as MLX leaves it to its backends.
//!
//! The value forms are, on every backend, the input gathered by the index forms (a backend
//! computes one permutation per row and writes either), so the derivative routes each output's
//! cotangent back through the same permutation.

use crate::array::Array;
use crate::dtype::DType;
use crate::error::OpErrorKind;
use crate::shape::Shape;
use crate::storage::Spec;

use super::Primitive;

/// Which sort a [`Primitive::Sort`] node computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SortOp {
    /// The values in ascending order.
    Sort,
    /// The indices (`uint32`) that sort the values, ties in index order.
    ArgSort,
    /// The values partitioned around rank `kth` (normalised: `0 <= kth < len`).
    Partition(usize),
    /// The indices (`uint32`) of the partition around rank `kth`.
    ArgPartition(usize),
}

impl SortOp {
    /// MLX's name.
    pub fn name(self) -> &'static str {
        match self {
            SortOp::Sort => "sort",
            SortOp::ArgSort => "argsort",
            SortOp::Partition(_) => "partition",
            SortOp::ArgPartition(_) => "argpartition",
        }
    }

    /// Whether the output holds indices rather than values.
    pub fn returns_indices(self) -> bool {
        matches!(self, SortOp::ArgSort | SortOp::ArgPartition(_))
    }

    /// The rank a partition selects (`None` for full sorts).
    pub fn kth(self) -> Option<usize> {
        match self {
            SortOp::Partition(k) | SortOp::ArgPartition(k) => Some(k),
            _ => None,
        }
    }

    /// The index form of this sort (itself when it already returns indices).
    pub fn indices(self) -> SortOp {
        match self {
            SortOp::Sort | SortOp::ArgSort => SortOp::ArgSort,
            SortOp::Partition(k) | SortOp::ArgPartition(k) => SortOp::ArgPartition(k),
        }
    }

    /// The output dtype for an input of `dtype`.
    pub fn output_dtype(self, dtype: DType) -> DType {
        if self.returns_indices() { DType::U32 } else { dtype }
    }
}

/// The shape rule: one input, `axis` in range, `kth` within the axis; the output keeps the shape.
pub(crate) fn output_spec(op: SortOp, axis: usize, x: &Spec) -> Result<Spec, OpErrorKind> {
    if axis >= x.shape.len() {
        return Err(OpErrorKind::InvalidAxis { axis: axis as i32, ndim: x.shape.len() });
    }
    if let Some(k) = op.kth() {
        let len = x.shape[axis];
        if k >= len as usize {
            return Err(OpErrorKind::InvalidArgument(format!("kth {k} is out of range for axis {axis} of size {len}")));
        }
    }
    Ok(Spec { shape: Shape::from(&x.shape[..]), dtype: op.output_dtype(x.dtype) })
}

// ---- derivatives --------------------------------------------------------------------------

/// The permutation a value sort applied along `axis`.
fn permutation(op: SortOp, axis: usize, x: &Array) -> Array {
    let p = Primitive::Sort { op: op.indices(), axis };
    Array::from_op(op.indices().name(), p, vec![x.clone()])
}

/// `out[..., i, ...] = t[..., idx[i], ...]` along `axis` (a gather by a permutation).
fn gather_along(t: &Array, idx: &Array, axis: usize) -> Array {
    t.take_along_axis(idx, axis as i32)
}

/// `out[..., idx[i], ...] = g[..., i, ...]` along `axis`: the transpose of [`gather_along`] for
/// a permutation (every position is written exactly once).
fn scatter_along(g: &Array, idx: &Array, axis: usize) -> Array {
    g.zeros_like().put_along_axis(idx, g, axis as i32)
}

/// The cotangent of the input of a sort: each output's cotangent goes back to the element it
/// copies. Index outputs and integer inputs have none.
pub(crate) fn sort_vjp(op: SortOp, axis: usize, x: &Array, g: &Array) -> Option<Array> {
    if op.returns_indices() || !x.dtype().is_inexact() {
        return None;
    }
    Some(scatter_along(g, &permutation(op, axis, x), axis))
}

/// The tangent of a value sort: the input's tangent gathered by the same permutation.
pub(crate) fn sort_jvp(op: SortOp, axis: usize, x: &Array, t: &Array) -> Option<Array> {
    if op.returns_indices() || !x.dtype().is_inexact() {
        return None;
    }
    Some(gather_along(t, &permutation(op, axis, x), axis))
}

/// The sort on an input batched on axis 0: the same sort one axis further.
pub(crate) fn sort_vmap(op: SortOp, axis: usize, x: &Array) -> Array {
    Array::from_op(op.name(), Primitive::Sort { op, axis: axis + 1 }, vec![x.clone()])
}
