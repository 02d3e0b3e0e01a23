//! Gathers and scatters along one axis: the two primitives every indexing operation lowers to
//! (`take`, `take_along_axis`, `put_along_axis`, MLX's general `gather`/`scatter`, `x.i(..)`
//! with array indices and `x.at(..)` updates), with their shape, derivative and batching rules.
//!
//! Index semantics (MLX leaves out-of-range indices undefined; these are ours, chosen so no
//! kernel ever reads or writes outside a buffer): a negative index `i` means `i + n`; a gather
//! clamps what is still outside `0..n` to the nearest end; a scatter drops updates whose index
//! is still outside `0..n`.

use crate::array::Array;
use crate::dtype::DType;
use crate::error::OpErrorKind;
use crate::ops;
use crate::storage::Spec;

use super::Primitive;

/// How a scatter combines an update with the value already at its position.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScatterReduce {
    /// The update replaces the value (one of several updates to a position wins).
    None,
    /// Added.
    Sum,
    /// Multiplied.
    Prod,
    /// The larger.
    Max,
    /// The smaller.
    Min,
}

impl ScatterReduce {
    /// The name of the scatter operation with this reduction.
    pub fn name(self) -> &'static str {
        match self {
            ScatterReduce::None => "scatter",
            ScatterReduce::Sum => "scatter_add",
            ScatterReduce::Prod => "scatter_prod",
            ScatterReduce::Max => "scatter_max",
            ScatterReduce::Min => "scatter_min",
        }
    }
}

fn check_indices(src: &Spec, idx: &Spec, axis: usize) -> Result<(), OpErrorKind> {
    if !idx.dtype.is_integer() || idx.dtype == DType::Bool {
        return Err(OpErrorKind::InvalidArgument(format!("indices must have an integer dtype, got {}", idx.dtype)));
    }
    if axis >= src.shape.len() {
        return Err(OpErrorKind::InvalidAxis { axis: axis as i32, ndim: src.shape.len() });
    }
    let same = idx.shape.len() == src.shape.len()
        && idx.shape.iter().zip(&src.shape).enumerate().all(|(i, (a, b))| i == axis || a == b);
    if !same {
        return Err(OpErrorKind::ShapeMismatch { lhs: src.shape.to_vec(), rhs: idx.shape.to_vec() });
    }
    Ok(())
}

/// Shape rule of [`Primitive::GatherAxis`]: inputs `(src, indices)` of one rank, equal except
/// on `axis`; the output has the indices' shape and the source's dtype.
pub fn gather_axis_specs(axis: usize, inputs: &[Spec]) -> Result<Vec<Spec>, OpErrorKind> {
    let [src, idx] = inputs else {
        return Err(OpErrorKind::InvalidArgument(format!("gather_axis takes 2 inputs, got {}", inputs.len())));
    };
    check_indices(src, idx, axis)?;
    if src.shape[axis] == 0 && idx.shape.iter().all(|&d| d > 0) {
        return Err(OpErrorKind::InvalidIndex(format!("cannot gather from the empty axis {axis}")));
    }
    Ok(vec![Spec { shape: idx.shape.clone(), dtype: src.dtype }])
}

/// Shape rule of [`Primitive::ScatterAxis`]: inputs `(src, indices, updates)` where the indices
/// and updates share one shape, equal to the source's except on `axis`.
pub fn scatter_axis_specs(axis: usize, inputs: &[Spec]) -> Result<Vec<Spec>, OpErrorKind> {
    let [src, idx, upd] = inputs else {
        return Err(OpErrorKind::InvalidArgument(format!("scatter_axis takes 3 inputs, got {}", inputs.len())));
    };
    check_indices(src, idx, axis)?;
    if idx.shape != upd.shape {
        return Err(OpErrorKind::ShapeMismatch { lhs: idx.shape.to_vec(), rhs: upd.shape.to_vec() });
    }
    if src.dtype != upd.dtype {
        return Err(OpErrorKind::DTypeMismatch { lhs: src.dtype, rhs: upd.dtype });
    }
    Ok(vec![src.clone()])
}

/// `src[.., idx[..], ..]` along `axis` (the primitive, no argument checks beyond its rule).
pub(crate) fn gather_axis(src: &Array, idx: &Array, axis: usize) -> Array {
    Array::from_op("take_along_axis", Primitive::GatherAxis { axis }, vec![src.clone(), idx.clone()])
}

/// The scatter primitive along `axis`.
pub(crate) fn scatter_axis(src: &Array, idx: &Array, upd: &Array, axis: usize, reduce: ScatterReduce) -> Array {
    Array::from_op(reduce.name(), Primitive::ScatterAxis { axis, reduce }, vec![src.clone(), idx.clone(), upd.clone()])
}

/// Indices in a signed type wide enough for index arithmetic against axis sizes.
pub(crate) fn wide(idx: &Array) -> Array {
    match idx.dtype() {
        DType::I64 | DType::U64 | DType::U32 => idx.astype(DType::I64),
        _ => idx.astype(DType::I32),
    }
}

/// Indices with negatives wrapped and the rest clamped into `0..n`: the positions a gather reads.
pub(crate) fn clamped(idx: &Array, n: i32) -> Array {
    let idx = &wide(idx);
    let wrapped = ops::where_(idx.less(0), idx + n, idx);
    wrapped.clip(0, (n - 1).max(0))
}

/// Where a scatter writes (a negative index wraps once; anything else outside is dropped).
pub(crate) fn in_range(idx: &Array, n: i32) -> Array {
    let idx = &wide(idx);
    idx.greater_equal(-n).logical_and(idx.less(n))
}

/// Cotangents of `(src, indices)` of a gather along `axis`.
pub(crate) fn gather_vjp(axis: usize, x: &[Array], g: &Array) -> Vec<Option<Array>> {
    let n = x[0].shape()[axis];
    let zeros = ops::zeros(x[0].shape(), g.dtype());
    vec![Some(scatter_axis(&zeros, &clamped(&x[1], n), g, axis, ScatterReduce::Sum)), None]
}

/// Cotangents of `(src, indices, updates)` of a scatter along `axis`.
pub(crate) fn scatter_vjp(axis: usize, reduce: ScatterReduce, x: &[Array], y: &Array, g: &Array) -> Vec<Option<Array>> {
    let (src, idx, upd) = (&x[0], &x[1], &x[2]);
    let n = src.shape()[axis];
    let valid = in_range(idx, n);
    let at = clamped(idx, n);
    // The cotangent at each update's position (zero for dropped updates).
    let g_at = ops::where_(&valid, gather_axis(g, &at, axis), ops::zeros(idx.shape(), g.dtype()));
    match reduce {
        ScatterReduce::None => {
            let cleared = scatter_axis(g, idx, &upd.zeros_like().astype(g.dtype()), axis, ScatterReduce::None);
            vec![Some(cleared), None, Some(g_at)]
        }
        ScatterReduce::Sum => vec![Some(g.clone()), None, Some(g_at)],
        ScatterReduce::Max | ScatterReduce::Min => {
            // Every input equal to the result receives the cotangent (ties share nothing out).
            let src_won = src.equal(y).astype(g.dtype());
            let upd_won = upd.equal(gather_axis(y, &at, axis)).astype(g.dtype());
            vec![Some(g * src_won), None, Some(g_at * upd_won)]
        }
        ScatterReduce::Prod => {
            let f = || ops::invalid("scatter_prod", "has no derivative rule");
            vec![Some(f()), None, Some(f())]
        }
    }
}

/// Tangent of a gather along `axis` (linear in the source).
pub(crate) fn gather_jvp(axis: usize, x: &[Array], t: &[Option<Array>]) -> Option<Array> {
    t[0].as_ref().map(|ts| gather_axis(ts, &x[1], axis))
}

/// Tangent of a scatter along `axis`.
pub(crate) fn scatter_jvp(
    axis: usize,
    reduce: ScatterReduce,
    x: &[Array],
    y: &Array,
    t: &[Option<Array>],
) -> Option<Array> {
    let (src, idx, upd) = (&x[0], &x[1], &x[2]);
    if t[0].is_none() && t[2].is_none() {
        return None;
    }
    let ts = t[0].clone().unwrap_or_else(|| src.zeros_like());
    let tu = t[2].clone().unwrap_or_else(|| upd.zeros_like());
    match reduce {
        ScatterReduce::None | ScatterReduce::Sum => Some(scatter_axis(&ts, idx, &tu, axis, reduce)),
        ScatterReduce::Max | ScatterReduce::Min => {
            let at = clamped(idx, src.shape()[axis]);
            let src_won = src.equal(y).astype(ts.dtype());
            let upd_won = upd.equal(gather_axis(y, &at, axis)).astype(tu.dtype());
            Some(scatter_axis(&(ts * src_won), idx, &(tu * upd_won), axis, ScatterReduce::Sum))
        }
        ScatterReduce::Prod => Some(ops::invalid("scatter_prod", "has no derivative rule")),
    }
}

/// A gather or scatter on batched inputs: the batch is one more axis on which the source and
/// the indices agree, so the same primitive runs one axis further in.
pub(crate) fn gather_scatter_vmap(prim: &Primitive, x: &[Array], mapped: &[bool]) -> Array {
    let b = super::rules::batch_size(x, mapped);
    let full: Vec<Array> = x.iter().zip(mapped).map(|(a, &m)| super::rules::batched(a, m, b)).collect();
    match prim {
        Primitive::GatherAxis { axis } => gather_axis(&full[0], &full[1], axis + 1),
        Primitive::ScatterAxis { axis, reduce } => scatter_axis(&full[0], &full[1], &full[2], axis + 1, *reduce),
        p => ops::invalid(p.name(), "is not a gather or scatter"),
    }
}
