//! Reductions, arg-reductions and scans. Operations cast the input to the dtype the reduction
//! accumulates in (`sum` of `int8` runs in `int32`, as MLX), so a kernel maps `T -> T`
//! (`all`/`any` map to `bool`; arg-reductions to `uint32`). Half-precision floats accumulate
//! in `f32` inside the kernel.

use crate::dtype::DType;
use crate::error::OpErrorKind;
use crate::storage::Spec;

/// A reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Maximum (NaN propagates).
    Max,
    /// Minimum (NaN propagates).
    Min,
    /// Logical and of the elements' truth.
    And,
    /// Logical or of the elements' truth.
    Or,
}

impl ReduceOp {
    /// MLX's name of the reduction.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::And => "all",
            ReduceOp::Or => "any",
        }
    }

    /// The dtype the input is cast to before reducing (MLX: sums and products of booleans and
    /// small integers widen to 32 bits).
    pub fn compute_dtype(self, dtype: DType) -> DType {
        match (self, dtype) {
            (ReduceOp::Sum | ReduceOp::Prod, DType::Bool | DType::I8 | DType::I16) => DType::I32,
            (ReduceOp::Sum | ReduceOp::Prod, DType::U8 | DType::U16) => DType::U32,
            _ => dtype,
        }
    }

    /// The output dtype for an input in its compute dtype.
    pub fn output_dtype(self, dtype: DType) -> DType {
        match self {
            ReduceOp::And | ReduceOp::Or => DType::Bool,
            _ => dtype,
        }
    }
}

/// An arg-reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ArgReduceOp {
    /// Index of the first largest element.
    ArgMax,
    /// Index of the first smallest element.
    ArgMin,
}

impl ArgReduceOp {
    /// MLX's name.
    pub fn name(self) -> &'static str {
        match self {
            ArgReduceOp::ArgMax => "argmax",
            ArgReduceOp::ArgMin => "argmin",
        }
    }
}

/// A cumulative reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScanOp {
    /// Running sum.
    Sum,
    /// Running product.
    Prod,
    /// Running maximum.
    Max,
    /// Running minimum.
    Min,
    /// Running `log(sum(exp(x)))`.
    LogAddExp,
}

impl ScanOp {
    /// MLX's name.
    pub fn name(self) -> &'static str {
        match self {
            ScanOp::Sum => "cumsum",
            ScanOp::Prod => "cumprod",
            ScanOp::Max => "cummax",
            ScanOp::Min => "cummin",
            ScanOp::LogAddExp => "logcumsumexp",
        }
    }

    /// The dtype the input is cast to (MLX: `cumsum` of `bool` counts in `int32`;
    /// `logcumsumexp` of integers runs in `float32`).
    pub fn compute_dtype(self, dtype: DType) -> DType {
        match (self, dtype) {
            (ScanOp::Sum, DType::Bool) => DType::I32,
            (ScanOp::LogAddExp, d) => d.at_least_float(),
            (_, d) => d,
        }
    }
}

// ---- shape rules --------------------------------------------------------------------------

fn check_axis(axis: usize, ndim: usize) -> Result<(), OpErrorKind> {
    if axis < ndim { Ok(()) } else { Err(OpErrorKind::InvalidAxis { axis: axis as i32, ndim }) }
}

/// `Reduce`'s output: `x` with `axes` kept at size 1, in the reduction's output dtype.
pub fn reduce_spec(op: ReduceOp, axes: &[usize], x: &Spec) -> Result<Spec, OpErrorKind> {
    let mut shape = x.shape.clone();
    for &a in axes {
        check_axis(a, shape.len())?;
        shape[a] = 1;
    }
    Ok(Spec { shape, dtype: op.output_dtype(x.dtype) })
}

/// `ArgReduce`'s output: `x` with `axis` kept at size 1, as `uint32`.
pub fn arg_reduce_spec(axis: usize, x: &Spec) -> Result<Spec, OpErrorKind> {
    check_axis(axis, x.shape.len())?;
    let mut shape = x.shape.clone();
    shape[axis] = 1;
    Ok(Spec { shape, dtype: DType::U32 })
}

/// `Scan`'s output: `x`'s shape and dtype.
pub fn scan_spec(axis: usize, x: &Spec) -> Result<Spec, OpErrorKind> {
    check_axis(axis, x.shape.len())?;
    Ok(x.clone())
}

// ---- derivatives --------------------------------------------------------------------------

use crate::array::Array;

/// The cotangent of a reduction's input `x` from the cotangent `g` of its output `y` (both with
/// the reduced axes kept).
pub(crate) fn reduce_vjp(op: ReduceOp, axes: &[usize], x: &Array, y: &Array, g: &Array) -> Option<Array> {
    if !x.dtype().is_inexact() {
        return None;
    }
    let axes_i: Vec<i32> = axes.iter().map(|&a| a as i32).collect();
    match op {
        ReduceOp::Sum => Some(g.broadcast_to(x.shape())),
        ReduceOp::Prod => {
            // d prod / d x_i = product of the others: exclusive cumulative products from both
            // sides, exact where x has zeros.
            let moved = move_axes_last(x, &axes_i);
            let flat = moved.reshape(flat_shape(&moved, axes.len()));
            let left = flat.cumprod_with(-1, crate::ops::ScanOptions { reverse: false, exclusive: true });
            let right = flat.cumprod_with(-1, crate::ops::ScanOptions { reverse: true, exclusive: true });
            let others = (left * right).reshape(moved.shape());
            Some(g.broadcast_to(x.shape()) * restore_axes(&others, x.ndim(), &axes_i))
        }
        ReduceOp::Max | ReduceOp::Min => {
            // Split equally among the elements that attain the extreme (as MLX).
            let mask = x.equal(y).astype(x.dtype());
            let count = mask.sum_keepdims(&axes_i);
            Some(g * mask / count)
        }
        ReduceOp::And | ReduceOp::Or => None,
    }
}

/// `x` with `axes` moved to the end (in order).
fn move_axes_last(x: &Array, axes: &[i32]) -> Array {
    let keep: Vec<i32> = (0..x.ndim() as i32).filter(|a| !axes.contains(a)).collect();
    let perm: Vec<i32> = keep.iter().chain(axes.iter()).copied().collect();
    x.transpose(&perm)
}

/// The shape of `x` with its last `n` axes merged into one.
fn flat_shape(x: &Array, n: usize) -> Vec<i32> {
    let r = x.ndim();
    let mut s: Vec<i32> = x.shape()[..r - n].to_vec();
    s.push(x.shape()[r - n..].iter().product());
    s
}

/// Undoes `move_axes_last`.
fn restore_axes(x: &Array, ndim: usize, axes: &[i32]) -> Array {
    let keep: Vec<i32> = (0..ndim as i32).filter(|a| !axes.contains(a)).collect();
    let order: Vec<i32> = keep.iter().chain(axes.iter()).copied().collect();
    let mut inv = vec![0i32; ndim];
    for (i, &a) in order.iter().enumerate() {
        inv[a as usize] = i as i32;
    }
    x.transpose(&inv)
}

/// The cotangent of a scan's input.
pub(crate) fn scan_vjp(
    op: ScanOp,
    axis: usize,
    reverse: bool,
    inclusive: bool,
    x: &Array,
    y: &Array,
    g: &Array,
) -> Option<Array> {
    if !x.dtype().is_inexact() {
        return None;
    }
    let ax = axis as i32;
    let back = crate::ops::ScanOptions { reverse: !reverse, exclusive: !inclusive };
    match op {
        // Each output sums the inputs before it: the cotangent sums the outputs after it.
        ScanOp::Sum => Some(g.cumsum_with(ax, back)),
        ScanOp::Prod => {
            // y_i = prod_{j<=i} x_j: dx_j = sum_{i>=j} g_i y_i / x_j (x_j != 0).
            Some((g * y).cumsum_with(ax, back) / x)
        }
        ScanOp::LogAddExp => {
            // y_i = log sum_{j<=i} e^{x_j}: dx_j = e^{x_j} sum_{i>=j} g_i e^{-y_i}.
            Some(x.exp() * (g * y.negative().exp()).cumsum_with(ax, back))
        }
        ScanOp::Max | ScanOp::Min => {
            // Route each g_i to the input output i copies, through a one-hot matrix along the
            // axis (quadratic in its length).
            let n = x.shape()[axis];
            let mut shape = vec![1; x.ndim()];
            shape[axis] = n;
            let idx = crate::ops::arange(0, n, 1).reshape(shape).broadcast_to(x.shape());
            let src = scan_sources(op, axis, reverse, inclusive, x, y);
            let onehot = src.expand_dims(ax + 1).equal(idx.expand_dims(ax));
            Some((g.expand_dims(ax + 1) * onehot.astype(g.dtype())).sum(ax))
        }
    }
}

/// For cummax/cummin: the input index each output copies, i.e. the latest position (in scan
/// order) where the running extreme was set; -1 or n where an exclusive output copies nothing.
pub(crate) fn scan_sources(op: ScanOp, axis: usize, reverse: bool, inclusive: bool, x: &Array, y: &Array) -> Array {
    use crate::ops::{ScanOptions, where_};
    let ax = axis as i32;
    let n = x.shape()[axis];
    let mut shape = vec![1; x.ndim()];
    shape[axis] = n;
    let idx = crate::ops::arange(0, n, 1).reshape(shape).broadcast_to(x.shape());
    let inclusive_y = if inclusive {
        y.clone()
    } else {
        let o = ScanOptions { reverse, exclusive: false };
        if op == ScanOp::Max { x.cummax_with(ax, o) } else { x.cummin_with(ax, o) }
    };
    let hit = x.equal(&inclusive_y);
    let src = if reverse {
        where_(&hit, &idx, n).cummin_with(ax, ScanOptions { reverse: true, exclusive: false })
    } else {
        where_(&hit, &idx, -1).cummax(ax)
    };
    if inclusive {
        return src;
    }
    // Exclusive output i copies inclusive output i - 1 (i + 1 when reversed).
    let mut widths = vec![(0, 0); x.ndim()];
    widths[axis] = if reverse { (0, 1) } else { (1, 0) };
    let mut start = vec![0; x.ndim()];
    let mut stop: Vec<i32> = x.shape().to_vec();
    if reverse {
        start[axis] = 1;
    } else {
        stop[axis] = n - 1;
    }
    src.slice(&start, &stop, &[]).pad(&widths, -1)
}
