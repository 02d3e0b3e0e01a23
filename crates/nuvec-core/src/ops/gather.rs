//! Gathers and scatters: `take`, `take_along_axis`, `put_along_axis`,
//! `scatter_add_along_axis`, MLX's general `gather` and `scatter*`, and `gather_mm`.
//!
//! All of them lower to the two along-axis primitives (see [`crate::primitive::gather`] for
//! how out-of-range indices behave: negatives wrap once, gathers clamp, scatters drop).
//! Indices over several axes are merged into one index over those axes flattened.

use crate::array::{Array, ScalarOrArray};
use crate::dtype::DType;
use crate::error::OpErrorKind;
use crate::fast::FastOp;
use crate::primitive::ScatterReduce;
use crate::primitive::gather::{gather_axis, scatter_axis, wide};
use crate::shape::{Shape, broadcast_shapes};

use super::{axis_or_fail, invalid, propagate};

/// A failed array unless `idx` holds integers.
#[track_caller]
fn integer_indices(op: &'static str, idx: &Array) -> Result<(), Array> {
    if idx.dtype().is_integer() && idx.dtype() != DType::Bool {
        Ok(())
    } else {
        Err(invalid(op, format!("indices must have an integer dtype, got {}", idx.dtype())))
    }
}

/// The value operand as an array of `dtype` (scalars adapt to it, as MLX's weak scalars do).
fn value_as(v: ScalarOrArray, dtype: DType) -> Array {
    match v {
        ScalarOrArray::Scalar(s) => Array::scalar(s, dtype),
        ScalarOrArray::Array(a) => a.astype(dtype),
    }
}

impl Array {
    /// Elements at `indices` along `axis` (`None`: of the flattened array). The output has the
    /// shape `self.shape[..axis] + indices.shape + self.shape[axis + 1..]`.
    ///
    /// Negative indices count from the end; indices still outside the axis clamp to its ends
    /// (MLX leaves them undefined).
    ///
    /// ```
    /// use nuvec::{array, ops};
    /// let x = array![[1, 2, 3], [4, 5, 6]];
    /// let t = x.take(&array![2, -3], 1);
    /// assert_eq!(t.to_vec::<i32>().unwrap(), vec![3, 1, 6, 4]);
    /// assert_eq!(x.take(&array![5], None).to_vec::<i32>().unwrap(), vec![6]);
    /// ```
    #[track_caller]
    pub fn take(&self, indices: &Array, axis: impl Into<Option<i32>>) -> Array {
        if let Some(f) = propagate(&[self, indices]) {
            return f;
        }
        if let Err(f) = integer_indices("take", indices) {
            return f;
        }
        let (x, axis) = match axis.into() {
            Some(a) => (self.clone(), a),
            None => (self.reshape([-1]), 0),
        };
        let ax = match axis_or_fail("take", axis, x.ndim()) {
            Ok(a) => a,
            Err(f) => return f,
        };
        let n = x.shape()[ax];
        if n == 0 && indices.size() > 0 {
            return invalid("take", format!("cannot take from axis {axis} of size 0"));
        }
        let pre: i64 = x.shape()[..ax].iter().map(|&d| d as i64).product();
        let post: i64 = x.shape()[ax + 1..].iter().map(|&d| d as i64).product();
        let m = indices.size() as i64;
        let mut out_shape: Vec<i32> = x.shape()[..ax].to_vec();
        out_shape.extend_from_slice(indices.shape());
        out_shape.extend_from_slice(&x.shape()[ax + 1..]);
        if [pre, m, post].iter().any(|&d| d > i32::MAX as i64) {
            return Array::failed("take", OpErrorKind::InvalidShape(out_shape.iter().map(|&d| d as i64).collect()));
        }
        let (pre, m, post) = (pre as i32, m as i32, post as i32);
        let src = x.reshape([pre, n, post]);
        let idx = indices.reshape([1, m, 1]).broadcast_to([pre, m, post]);
        gather_axis(&src, &idx, 1).reshape(out_shape)
    }

    /// Elements at `indices` along `axis`, where `indices` has the array's rank and broadcasts
    /// against it on the other axes (`None`: both flattened).
    ///
    /// ```
    /// use nuvec::array;
    /// let x = array![[10, 30, 20], [60, 40, 50]];
    /// let top = x.take_along_axis(&x.argmax_keepdims(1), 1);
    /// assert_eq!(top.to_vec::<i32>().unwrap(), vec![30, 60]);
    /// ```
    #[track_caller]
    pub fn take_along_axis(&self, indices: &Array, axis: impl Into<Option<i32>>) -> Array {
        let (x, idx, ax) = match along_axis("take_along_axis", self, indices, axis.into()) {
            Ok(p) => p,
            Err(f) => return f,
        };
        if x.shape()[ax] == 0 && idx.size() > 0 {
            return invalid("take_along_axis", format!("cannot take from axis {ax} of size 0"));
        }
        let mut src_shape = idx.shape().to_vec();
        src_shape[ax] = x.shape()[ax];
        gather_axis(&x.broadcast_to(src_shape), &idx, ax)
    }

    /// This array with `values` written at `indices` along `axis` (MLX's `put_along_axis`);
    /// `indices` and `values` broadcast together and against the array on the other axes.
    /// With repeated indices one of the values wins; indices outside the axis are ignored.
    ///
    /// ```
    /// use nuvec::{array, ops, DType};
    /// let x = ops::zeros([2, 3], DType::F32);
    /// let y = x.put_along_axis(&array![[1], [2]], 5.0, 1);
    /// assert_eq!(y.to_vec::<f32>().unwrap(), vec![0.0, 5.0, 0.0, 0.0, 0.0, 5.0]);
    /// ```
    #[track_caller]
    pub fn put_along_axis(
        &self,
        indices: &Array,
        values: impl Into<ScalarOrArray>,
        axis: impl Into<Option<i32>>,
    ) -> Array {
        self.scatter_along_axis("put_along_axis", ScatterReduce::None, indices, values.into(), axis.into())
    }

    /// This array with `values` added at `indices` along `axis` (repeated indices accumulate;
    /// indices outside the axis are ignored). MLX's `scatter_add_axis`.
    ///
    /// ```
    /// use nuvec::{array, ops, DType};
    /// let x = ops::zeros([4], DType::F32);
    /// let y = x.scatter_add_along_axis(&array![1, 1, 3], &array![1.0, 2.0, 3.0], 0);
    /// assert_eq!(y.to_vec::<f32>().unwrap(), vec![0.0, 3.0, 0.0, 3.0]);
    /// ```
    #[track_caller]
    pub fn scatter_add_along_axis(
        &self,
        indices: &Array,
        values: impl Into<ScalarOrArray>,
        axis: impl Into<Option<i32>>,
    ) -> Array {
        self.scatter_along_axis("scatter_add_along_axis", ScatterReduce::Sum, indices, values.into(), axis.into())
    }

    #[track_caller]
    fn scatter_along_axis(
        &self,
        op: &'static str,
        reduce: ScatterReduce,
        indices: &Array,
        values: ScalarOrArray,
        axis: Option<i32>,
    ) -> Array {
        let values = value_as(values, self.dtype());
        if let Some(f) = propagate(&[self, indices, &values]) {
            return f;
        }
        if let Err(f) = integer_indices(op, indices) {
            return f;
        }
        let (x, idx, vals, ax) = match axis {
            Some(a) => match axis_or_fail(op, a, self.ndim()) {
                Ok(ax) => (self.clone(), indices.clone(), values, ax),
                Err(f) => return f,
            },
            None => (self.reshape([-1]), indices.reshape([-1]), values.reshape([-1]), 0),
        };
        if idx.ndim() != x.ndim() {
            return invalid(op, format!("indices of {} dimensions for an array of {}", idx.ndim(), x.ndim()));
        }
        // The indices and values broadcast together; on the other axes they take the array's sizes.
        let mut target = match broadcast_shapes(idx.shape(), vals.shape()) {
            Ok(s) => s.to_vec(),
            Err(k) => return Array::failed(op, k),
        };
        if target.len() != x.ndim() {
            return invalid(op, format!("values of shape {:?} have more dimensions than the array", vals.shape()));
        }
        // Every operand broadcasts on the other axes (MLX broadcasts the array too).
        let mut xshape = x.shape().to_vec();
        for d in (0..x.ndim()).filter(|&d| d != ax) {
            let (a, b) = (x.shape()[d], target[d]);
            let s = if a == b || b == 1 {
                a
            } else if a == 1 {
                b
            } else {
                return Array::failed(op, OpErrorKind::ShapeMismatch { lhs: x.shape().to_vec(), rhs: target.clone() });
            };
            (target[d], xshape[d]) = (s, s);
        }
        let x = x.broadcast_to(&xshape);
        let out = scatter_axis(&x, &idx.broadcast_to(&target), &vals.broadcast_to(&target), ax, reduce);
        if axis.is_none() { out.reshape(self.shape()) } else { out }
    }
}

/// Validated `(array, indices broadcast on the other axes, axis)` of an along-axis gather.
#[track_caller]
fn along_axis(op: &'static str, x: &Array, indices: &Array, axis: Option<i32>) -> Result<(Array, Array, usize), Array> {
    if let Some(f) = propagate(&[x, indices]) {
        return Err(f);
    }
    integer_indices(op, indices)?;
    let (x, idx, ax) = match axis {
        Some(a) => (x.clone(), indices.clone(), axis_or_fail(op, a, x.ndim())?),
        None => (x.reshape([-1]), indices.reshape([-1]), 0),
    };
    if idx.ndim() != x.ndim() {
        return Err(invalid(op, format!("indices of {} dimensions for an array of {}", idx.ndim(), x.ndim())));
    }
    let mut shape = idx.shape().to_vec();
    for d in (0..x.ndim()).filter(|&d| d != ax) {
        let (a, b) = (x.shape()[d], idx.shape()[d]);
        shape[d] = if a == b || b == 1 {
            a
        } else if a == 1 {
            b
        } else {
            return Err(Array::failed(
                op,
                OpErrorKind::ShapeMismatch { lhs: x.shape().to_vec(), rhs: idx.shape().to_vec() },
            ));
        };
    }
    Ok((x, idx.broadcast_to(shape), ax))
}

/// The array viewed with the indexed `axes` first, in order, then the others.
fn axes_first(x: &Array, axes: &[usize]) -> (Array, Vec<usize>) {
    let mut perm: Vec<usize> = axes.to_vec();
    perm.extend((0..x.ndim()).filter(|a| !axes.contains(a)));
    let p: Vec<i32> = perm.iter().map(|&a| a as i32).collect();
    (x.transpose(&p), perm)
}

/// What [`general_indices`] yields: the index arrays (widened to one integer dtype and
/// broadcast together), the normalised axes they index, and their common broadcast shape.
type GeneralIndices = (Vec<Array>, Vec<usize>, Vec<i32>);

/// Validated, broadcast indices of a general gather or scatter with their normalised axes.
#[track_caller]
fn general_indices(op: &'static str, a: &Array, indices: &[Array], axes: &[i32]) -> Result<GeneralIndices, Array> {
    let refs: Vec<&Array> = std::iter::once(a).chain(indices).collect();
    if let Some(f) = propagate(&refs) {
        return Err(f);
    }
    if indices.len() != axes.len() {
        return Err(invalid(op, format!("{} index arrays for {} axes", indices.len(), axes.len())));
    }
    let mut ax = Vec::with_capacity(axes.len());
    for (&a0, idx) in axes.iter().zip(indices) {
        integer_indices(op, idx)?;
        let n = axis_or_fail(op, a0, a.ndim())?;
        if ax.contains(&n) {
            return Err(invalid(op, format!("axis {a0} is indexed twice")));
        }
        ax.push(n);
    }
    let mut shape = crate::shape::Shape::new();
    for idx in indices {
        shape = broadcast_shapes(&shape, idx.shape()).map_err(|k| Array::failed(op, k))?;
    }
    let wide_dtype = if indices.iter().any(|i| wide(i).dtype() == DType::I64) { DType::I64 } else { DType::I32 };
    let idx = indices.iter().map(|i| i.astype(wide_dtype).broadcast_to(&shape)).collect();
    Ok((idx, ax, shape.to_vec()))
}

/// Flat positions in `a`'s indexed axes (flattened, in `axes` order) of every window element:
/// shape `index_shape + window sizes of the indexed axes`. A gather clamps each window start
/// into its axis; a scatter marks a window that leaves its axis with the position `len`.
fn flat_positions(a: &Array, idx: &[Array], axes: &[usize], sizes: &[i32], clamp: bool) -> Array {
    let k = axes.len();
    let len: i64 = axes.iter().map(|&ax| a.shape()[ax] as i64).product();
    let dtype =
        if len >= i32::MAX as i64 || idx.iter().any(|i| i.dtype() == DType::I64) { DType::I64 } else { DType::I32 };
    let mut flat = Array::scalar(0, dtype);
    let mut valid: Option<Array> = None;
    let mut stride: i64 = 1;
    for j in (0..k).rev() {
        let (n, s) = (a.shape()[axes[j]], sizes[j]);
        let i = idx[j].astype(dtype);
        let w = crate::ops::where_(i.less(0), &i + n, &i);
        let last = (n - s).max(0);
        let start = if clamp {
            w.clip(0, last)
        } else {
            let ok = w.greater_equal(0).logical_and(w.less_equal(last));
            valid = Some(match valid {
                Some(v) => v.logical_and(&ok),
                None => ok,
            });
            w
        };
        // Window offsets 0..s on their own trailing axis.
        let mut wshape = vec![1; k];
        wshape[j] = s;
        let offsets = crate::ops::arange_dtype(0, s, 1, dtype).reshape(wshape);
        let pos = start.reshape([idx[j].shape(), &vec![1; k][..]].concat()) + offsets;
        flat = flat + pos * Array::scalar(stride, dtype);
        stride *= n as i64;
    }
    match valid {
        Some(v) => {
            let v = v.reshape([v.shape(), &vec![1; k][..]].concat());
            crate::ops::where_(v, &flat, Array::scalar(len, dtype))
        }
        None => flat,
    }
}

/// MLX's general gather: for every position of the broadcast `indices`, the window of
/// `slice_sizes` of `a` that starts at those indices on `axes` (and at 0 on the other axes).
/// The output shape is `indices shape + slice_sizes`.
///
/// ```
/// use nuvec::{array, ops};
/// let a = ops::arange(0, 12, 1).reshape([3, 4]);
/// let g = ops::gather(&a, &[array![2, 0], array![1, 3]], &[0, 1], &[1, 1]);
/// assert_eq!(g.shape(), &[2, 1, 1]);
/// assert_eq!(g.to_vec::<i32>().unwrap(), vec![9, 3]);
/// ```
#[track_caller]
pub fn gather(a: &Array, indices: &[Array], axes: &[i32], slice_sizes: &[i32]) -> Array {
    let (idx, axes, ishape) = match general_indices("gather", a, indices, axes) {
        Ok(p) => p,
        Err(f) => return f,
    };
    if slice_sizes.len() != a.ndim() {
        return invalid("gather", format!("{} slice sizes for an array of {} dimensions", slice_sizes.len(), a.ndim()));
    }
    for (d, (&s, &n)) in slice_sizes.iter().zip(a.shape()).enumerate() {
        if s < 0 || s > n {
            return invalid("gather", format!("slice size {s} of axis {d} is outside 0..={n}"));
        }
    }
    if axes.iter().any(|&ax| a.shape()[ax] == 0) && idx.first().is_some_and(|i| i.size() > 0) {
        return invalid("gather", "cannot gather from an axis of size 0");
    }
    // Only the windows' first `size` elements of the other axes are ever read.
    let stop: Vec<i32> = (0..a.ndim()).map(|d| if axes.contains(&d) { a.shape()[d] } else { slice_sizes[d] }).collect();
    let x = a.slice(&vec![0; a.ndim()], &stop, &[]);
    let (x, perm) = axes_first(&x, &axes);
    let k = axes.len();
    let len: i64 = axes.iter().map(|&ax| a.shape()[ax] as i64).product();
    let others: Vec<i32> = perm[k..].iter().map(|&d| slice_sizes[d]).collect();
    let sizes: Vec<i32> = axes.iter().map(|&ax| slice_sizes[ax]).collect();
    let Ok(len) = i32::try_from(len) else {
        return invalid("gather", "the indexed axes hold more than 2^31 - 1 elements");
    };
    let x = x.reshape([&[len][..], &others].concat());
    let flat = flat_positions(a, &idx, &axes, &sizes, true).reshape([-1]);
    let m = flat.shape()[0];
    let mut ones = vec![1; others.len() + 1];
    ones[0] = m;
    let mut bshape = vec![m];
    bshape.extend_from_slice(&others);
    let g = gather_axis(&x, &flat.reshape(ones).broadcast_to(&bshape), 0);
    // [index..., indexed windows..., other windows...] -> [index..., windows in a's order].
    let g = g.reshape([&ishape[..], &sizes, &others].concat());
    let q = ishape.len();
    let mut out_perm: Vec<i32> = (0..q as i32).collect();
    let mut inv = vec![0; perm.len()];
    for (pos, &d) in perm.iter().enumerate() {
        inv[d] = pos;
    }
    out_perm.extend(inv.iter().map(|&p| (q + p) as i32));
    g.transpose(&out_perm)
}

/// MLX's general scatter: `a` with the windows of `updates` written at `indices` on `axes`.
/// `updates` has the shape `indices shape + window shape` (one window size per axis of `a`).
/// With repeated indices one update wins; windows that leave an axis are ignored.
///
/// ```
/// use nuvec::{array, ops, DType};
/// let a = ops::zeros([3, 2], DType::F32);
/// let s = ops::scatter(&a, &[array![2, 0]], &array![1.0, 2.0, 3.0, 4.0].reshape([2, 1, 2]), &[0]);
/// assert_eq!(s.to_vec::<f32>().unwrap(), vec![3.0, 4.0, 0.0, 0.0, 1.0, 2.0]);
/// ```
#[track_caller]
pub fn scatter(a: &Array, indices: &[Array], updates: &Array, axes: &[i32]) -> Array {
    scatter_general("scatter", ScatterReduce::None, a, indices, updates, axes)
}

/// [`scatter`] adding the updates (repeated indices accumulate).
#[track_caller]
pub fn scatter_add(a: &Array, indices: &[Array], updates: &Array, axes: &[i32]) -> Array {
    scatter_general("scatter_add", ScatterReduce::Sum, a, indices, updates, axes)
}

/// [`scatter`] multiplying by the updates.
#[track_caller]
pub fn scatter_prod(a: &Array, indices: &[Array], updates: &Array, axes: &[i32]) -> Array {
    scatter_general("scatter_prod", ScatterReduce::Prod, a, indices, updates, axes)
}

/// [`scatter`] keeping the larger value.
#[track_caller]
pub fn scatter_max(a: &Array, indices: &[Array], updates: &Array, axes: &[i32]) -> Array {
    scatter_general("scatter_max", ScatterReduce::Max, a, indices, updates, axes)
}

/// [`scatter`] keeping the smaller value.
#[track_caller]
pub fn scatter_min(a: &Array, indices: &[Array], updates: &Array, axes: &[i32]) -> Array {
    scatter_general("scatter_min", ScatterReduce::Min, a, indices, updates, axes)
}

#[track_caller]
pub(crate) fn scatter_general(
    op: &'static str,
    reduce: ScatterReduce,
    a: &Array,
    indices: &[Array],
    updates: &Array,
    axes: &[i32],
) -> Array {
    if let Some(f) = propagate(&[updates]) {
        return f;
    }
    let (idx, axes, ishape) = match general_indices(op, a, indices, axes) {
        Ok(p) => p,
        Err(f) => return f,
    };
    let q = ishape.len();
    if updates.ndim() != q + a.ndim() {
        return invalid(
            op,
            format!(
                "updates of shape {:?} need {} dimensions (indices {:?} + one window size per axis of {:?})",
                updates.shape(),
                q + a.ndim(),
                ishape,
                a.shape()
            ),
        );
    }
    let window: Vec<i32> = updates.shape()[q..].to_vec();
    if let Some(d) = (0..a.ndim()).find(|&d| window[d] > a.shape()[d]) {
        return invalid(op, format!("update window {window:?} is larger than the array {:?} on axis {d}", a.shape()));
    }
    let mut ushape = ishape.clone();
    ushape.extend_from_slice(&window);
    let upd = match broadcast_shapes(updates.shape(), &ushape) {
        Ok(s) if s[..] == ushape[..] => updates.astype(a.dtype()).broadcast_to(&ushape),
        _ => return Array::failed(op, OpErrorKind::ShapeMismatch { lhs: updates.shape().to_vec(), rhs: ushape }),
    };
    // Only the windows' first `size` elements of the other axes are written.
    let stop: Vec<i32> = (0..a.ndim()).map(|d| if axes.contains(&d) { a.shape()[d] } else { window[d] }).collect();
    let partial = stop[..] != a.shape()[..];
    let x = if partial { a.slice(&vec![0; a.ndim()], &stop, &[]) } else { a.clone() };
    let (xt, perm) = axes_first(&x, &axes);
    let k = axes.len();
    let len: i64 = axes.iter().map(|&ax| a.shape()[ax] as i64).product();
    let Ok(len) = i32::try_from(len) else {
        return invalid(op, "the indexed axes hold more than 2^31 - 1 elements");
    };
    let others: Vec<i32> = perm[k..].iter().map(|&d| window[d]).collect();
    let sizes: Vec<i32> = axes.iter().map(|&ax| window[ax]).collect();
    let flat = flat_positions(a, &idx, &axes, &sizes, false).reshape([-1]);
    let m = flat.shape()[0];
    // Updates as [index..., indexed windows..., other windows...] flattened to [m, others...].
    let mut uperm: Vec<i32> = (0..q as i32).collect();
    uperm.extend(perm.iter().map(|&d| (q + d) as i32));
    let upd = upd.transpose(&uperm).reshape([&[m][..], &others].concat());
    let mut ones = vec![1; others.len() + 1];
    ones[0] = m;
    let src = xt.reshape([&[len][..], &others].concat());
    let out = scatter_axis(&src, &flat.reshape(ones).broadcast_to(upd.shape()), &upd, 0, reduce);
    // Back to x's axis order.
    let tshape: Vec<i32> = perm.iter().map(|&d| x.shape()[d]).collect();
    let mut inv = vec![0i32; perm.len()];
    for (pos, &d) in perm.iter().enumerate() {
        inv[d] = pos as i32;
    }
    let out = out.reshape(tshape).transpose(&inv);
    if partial { a.slice_update(&out, &vec![0; a.ndim()], &stop, &[]) } else { out }
}

/// Batched products of matrices picked by index (mixture-of-experts routing): output `i` is
/// `a[lhs_indices[i]] @ b[rhs_indices[i]]`, where an index picks one matrix of the flattened
/// batch axes of its operand (`None`: every matrix in turn). The index arrays broadcast; the
/// output shape is their shape followed by `[M, N]`. Indices wrap once when negative and are
/// clamped into the stack, as [`Array::take`]'s.
///
/// The picked matrices are never copied: a backend reads them in place (on the GPU, a GEMV per
/// output for few rows, tensor-core tiles over runs of equal `rhs_indices` for many).
/// `sorted_indices` promises nothing the result depends on; sorting `rhs_indices` (as
/// mixture-of-experts layers do from 64 choices up) only makes those runs long.
///
/// ```
/// use nuvec::{array, ops};
/// let a = ops::ones([1, 1, 2], nuvec::DType::F32);
/// let experts = ops::arange(0.0, 12.0, 1.0).reshape([3, 2, 2]);
/// let y = ops::gather_mm(&a, &experts, None, Some(&array![2, 0]), false);
/// assert_eq!(y.shape(), &[2, 1, 2]);
/// assert_eq!(y.to_vec::<f32>().unwrap(), vec![18.0, 20.0, 2.0, 4.0]);
/// ```
#[track_caller]
pub fn gather_mm(
    a: &Array,
    b: &Array,
    lhs_indices: Option<&Array>,
    rhs_indices: Option<&Array>,
    sorted_indices: bool,
) -> Array {
    // The kernels find runs of equal indices themselves: sorting only makes them longer.
    let _ = sorted_indices;
    let mut refs = vec![a, b];
    refs.extend(lhs_indices);
    refs.extend(rhs_indices);
    if let Some(f) = propagate(&refs) {
        return f;
    }
    if a.ndim() < 2 || b.ndim() < 2 {
        return invalid("gather_mm", format!("needs matrices, got shapes {:?} and {:?}", a.shape(), b.shape()));
    }
    let (li, ri, shape) = match gathered_matrices("gather_mm", a, b, lhs_indices, rhs_indices) {
        Ok(r) => r,
        Err(f) => return f,
    };
    let (a3, b3) = (matrices(a), matrices(b));
    // One primitive a backend may run without copying the picked matrices (mixture-of-experts
    // stacks are large); other dtypes take the composition directly.
    let out = match (indices_32(&li), indices_32(&ri)) {
        (Some(l), Some(r)) if a.dtype() == b.dtype() && a.dtype().is_float() => {
            crate::fast::record(FastOp::GatherMm, vec![a3, b3, l, r], 1).remove(0)
        }
        _ => FastOp::GatherMm.composition(&[a3, b3, li, ri]).remove(0),
    };
    let mut oshape = shape.to_vec();
    oshape.extend_from_slice(&out.shape()[1..]);
    out.reshape(oshape)
}

/// Indices as the gathered products' kernels take them, 32-bit (`int32` or `uint32`): smaller
/// integer types widened, 64-bit ones `None` (those take the composition).
pub(crate) fn indices_32(i: &Array) -> Option<Array> {
    match i.dtype() {
        DType::I32 | DType::U32 => Some(i.clone()),
        DType::I8 | DType::U8 | DType::I16 | DType::U16 => Some(i.astype(DType::I32)),
        _ => None,
    }
}

/// An operand of at least 2 dimensions as a stack of its matrices, `[batch, rows, columns]`.
pub(crate) fn matrices(x: &Array) -> Array {
    let r = x.ndim();
    x.reshape([-1, x.shape()[r - 2], x.shape()[r - 1]])
}

/// Which matrix of `a` and of `b` (in [`matrices`]' stacks) each output of a gathered product
/// takes, flat, and the outputs' batch shape: the index arrays broadcast, and a missing one
/// takes every matrix of its operand in turn. `a` and `b` have at least 2 dimensions.
#[track_caller]
pub(crate) fn gathered_matrices(
    op: &'static str,
    a: &Array,
    b: &Array,
    lhs_indices: Option<&Array>,
    rhs_indices: Option<&Array>,
) -> Result<(Array, Array, Shape), Array> {
    let batch_index = |x: &Array, idx: Option<&Array>| -> Array {
        match idx {
            Some(i) => i.clone(),
            None => {
                let batch = &x.shape()[..x.ndim() - 2];
                let n: i32 = batch.iter().product();
                crate::ops::arange(0, n, 1).reshape(batch)
            }
        }
    };
    // Matches rather than closures, so that a failure records the caller's location.
    for (name, idx) in [("lhs_indices", lhs_indices), ("rhs_indices", rhs_indices)] {
        if let Some(i) = idx
            && integer_indices(op, i).is_err()
        {
            return Err(invalid(op, format!("{name}: indices must have an integer dtype, got {}", i.dtype())));
        }
    }
    let (li, ri) = (batch_index(a, lhs_indices), batch_index(b, rhs_indices));
    let shape = match broadcast_shapes(li.shape(), ri.shape()) {
        Ok(s) => s,
        Err(k) => return Err(Array::failed(op, k)),
    };
    let (li, ri) = (li.broadcast_to(&shape).reshape([-1]), ri.broadcast_to(&shape).reshape([-1]));
    Ok((li, ri, shape))
}

macro_rules! method_mirrors {
    ($($(#[$m:meta])* fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {$(
        $(#[$m])*
        #[track_caller]
        pub fn $name(x: &Array, $($arg: $ty),*) -> $ret { x.$name($($arg),*) }
    )*};
}

method_mirrors! {
    /// Elements at indices along an axis (see [`Array::take`]).
    fn take(indices: &Array, axis: impl Into<Option<i32>>) -> Array;
    /// Elements at per-position indices along an axis (see [`Array::take_along_axis`]).
    fn take_along_axis(indices: &Array, axis: impl Into<Option<i32>>) -> Array;
    /// Writes values at indices along an axis (see [`Array::put_along_axis`]).
    fn put_along_axis(indices: &Array, values: impl Into<ScalarOrArray>, axis: impl Into<Option<i32>>) -> Array;
    /// Adds values at indices along an axis (see [`Array::scatter_add_along_axis`]).
    fn scatter_add_along_axis(indices: &Array, values: impl Into<ScalarOrArray>, axis: impl Into<Option<i32>>) -> Array;
}
