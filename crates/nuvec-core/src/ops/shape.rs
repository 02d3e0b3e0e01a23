//! Shape operations: views (reshape, transpose, slice, broadcast, expand/squeeze) and
//! operations that move data (concatenate, split, repeat, tile, pad, tril/triu).

use crate::array::{Array, ScalarOrArray};
use crate::dtype::promote_types;
use crate::error::OpErrorKind;
use crate::primitive::Primitive;
use crate::primitive::view::normalize_slice;
use crate::shape::{Axes, IntoShape, Shape, check_shape};

use super::{axes_or_fail, axis_or_fail, dim_or_fail, invalid, propagate};

/// A normalised slice window: the start, stop and step of every axis, in axis order.
type Window = (Vec<i32>, Vec<i32>, Vec<i32>);

impl Array {
    /// The same elements with another shape; one size may be `-1` (inferred). A view when the
    /// strides allow it.
    ///
    /// ```
    /// use nuvec::ops;
    /// let a = ops::arange(0, 6, 1).reshape([2, -1]);
    /// assert_eq!(a.shape(), &[2, 3]);
    /// assert!(a.reshape([4, 2]).is_failed());
    /// ```
    #[track_caller]
    pub fn reshape(&self, shape: impl IntoShape) -> Array {
        if let Some(f) = propagate(&[self]) {
            return f;
        }
        let mut shape = match shape.into_shape() {
            Ok(s) => s,
            Err(bad) => return Array::failed("reshape", OpErrorKind::InvalidShape(bad)),
        };
        let infer: Vec<usize> = (0..shape.len()).filter(|&i| shape[i] == -1).collect();
        if infer.len() > 1 || shape.iter().any(|&d| d < -1) {
            return Array::failed("reshape", OpErrorKind::InvalidShape(shape.iter().map(|&d| d as i64).collect()));
        }
        if let [i] = infer[..] {
            let known: i64 = shape.iter().filter(|&&d| d != -1).map(|&d| d as i64).product();
            let size = self.size() as i64;
            if known == 0 || size % known != 0 {
                return Array::failed(
                    "reshape",
                    OpErrorKind::InvalidArgument(format!(
                        "cannot infer a size for {:?} from {} elements",
                        &shape[..],
                        size
                    )),
                );
            }
            shape[i] = (size / known) as i32;
        }
        if let Err(kind) = check_shape(&shape) {
            return Array::failed("reshape", kind);
        }
        if crate::shape::elem_count(&shape) != self.size() {
            return invalid(
                "reshape",
                format!(
                    "cannot reshape an array of shape {:?} ({} elements) into shape {:?} ({} elements)",
                    self.shape(),
                    self.size(),
                    &shape[..],
                    crate::shape::elem_count(&shape)
                ),
            );
        }
        if shape[..] == self.shape()[..] {
            return self.clone();
        }
        Array::from_op("reshape", Primitive::Reshape(shape), vec![self.clone()])
    }

    /// Merges axes `start..=end` into one.
    #[track_caller]
    pub fn flatten(&self, start: i32, end: i32) -> Array {
        if let Some(f) = propagate(&[self]) {
            return f;
        }
        if self.ndim() == 0 {
            return self.reshape([1]);
        }
        let (s, e) = match (axis_or_fail("flatten", start, self.ndim()), axis_or_fail("flatten", end, self.ndim())) {
            (Ok(s), Ok(e)) => (s, e),
            (Err(f), _) | (_, Err(f)) => return f,
        };
        if s > e {
            return invalid("flatten", format!("start axis {start} is after end axis {end}"));
        }
        let mut shape: Vec<i32> = self.shape()[..s].to_vec();
        let merged: i64 = self.shape()[s..=e].iter().map(|&d| d as i64).product();
        match dim_or_fail("flatten", merged, || vec![merged]) {
            Ok(d) => shape.push(d),
            Err(f) => return f,
        }
        shape.extend_from_slice(&self.shape()[e + 1..]);
        self.reshape(shape)
    }

    /// Permutes the axes: output axis `i` is input axis `axes[i]`.
    #[track_caller]
    pub fn transpose(&self, axes: &[i32]) -> Array {
        if let Some(f) = propagate(&[self]) {
            return f;
        }
        let mut perm = Vec::with_capacity(axes.len());
        for &a in axes {
            match axis_or_fail("transpose", a, self.ndim()) {
                Ok(p) => perm.push(p),
                Err(f) => return f,
            }
        }
        if perm.iter().enumerate().all(|(i, &p)| i == p) && perm.len() == self.ndim() {
            return self.clone();
        }
        Array::from_op("transpose", Primitive::Transpose(perm), vec![self.clone()])
    }

    /// The axes reversed (matrix transpose for 2-d).
    #[track_caller]
    pub fn t(&self) -> Array {
        let perm: Vec<i32> = (0..self.ndim() as i32).rev().collect();
        self.transpose(&perm)
    }

    /// Exchanges two axes.
    #[track_caller]
    pub fn swapaxes(&self, a: i32, b: i32) -> Array {
        if let Some(f) = propagate(&[self]) {
            return f;
        }
        let (a, b) = match (axis_or_fail("swapaxes", a, self.ndim()), axis_or_fail("swapaxes", b, self.ndim())) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(f), _) | (_, Err(f)) => return f,
        };
        let mut perm: Vec<i32> = (0..self.ndim() as i32).collect();
        perm.swap(a, b);
        self.transpose(&perm)
    }

    /// Moves axis `source` to position `destination`.
    #[track_caller]
    pub fn moveaxis(&self, source: i32, destination: i32) -> Array {
        if let Some(f) = propagate(&[self]) {
            return f;
        }
        let (s, d) =
            match (axis_or_fail("moveaxis", source, self.ndim()), axis_or_fail("moveaxis", destination, self.ndim())) {
                (Ok(s), Ok(d)) => (s, d),
                (Err(f), _) | (_, Err(f)) => return f,
            };
        let mut perm: Vec<i32> = (0..self.ndim() as i32).filter(|&a| a as usize != s).collect();
        perm.insert(d, s as i32);
        self.transpose(&perm)
    }

    /// Inserts size-1 axes at `axes` (positions in the output).
    #[track_caller]
    pub fn expand_dims(&self, axes: impl Axes) -> Array {
        if let Some(f) = propagate(&[self]) {
            return f;
        }
        let out_ndim = self.ndim() + axes.axes(self.ndim()).len();
        let list = match axes_or_fail("expand_dims", &axes.axes(out_ndim), out_ndim) {
            Ok(a) => a,
            Err(f) => return f,
        };
        let mut shape = Vec::with_capacity(out_ndim);
        let mut src = self.shape().iter();
        for i in 0..out_ndim {
            if list.contains(&i) {
                shape.push(1);
            } else {
                shape.push(*src.next().unwrap_or(&1));
            }
        }
        self.reshape(shape)
    }

    /// Removes size-1 axes: those listed, or all of them for `..`.
    #[track_caller]
    pub fn squeeze(&self, axes: impl Axes) -> Array {
        if let Some(f) = propagate(&[self]) {
            return f;
        }
        let list: Vec<usize> = if axes.is_all() {
            (0..self.ndim()).filter(|&a| self.shape()[a] == 1).collect()
        } else {
            match axes_or_fail("squeeze", &axes.axes(self.ndim()), self.ndim()) {
                Ok(a) => a,
                Err(f) => return f,
            }
        };
        if let Some(&a) = list.iter().find(|&&a| self.shape()[a] != 1) {
            return invalid("squeeze", format!("axis {a} has size {}, not 1", self.shape()[a]));
        }
        self.squeeze_axes(&list)
    }

    /// Removes the given size-1 axes (already validated).
    pub(crate) fn squeeze_axes(&self, axes: &[usize]) -> Array {
        let shape: Vec<i32> =
            self.shape().iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, &d)| d).collect();
        self.reshape(shape)
    }

    /// A view with `shape`, repeating size-1 axes and adding leading ones (NumPy rules).
    #[track_caller]
    pub fn broadcast_to(&self, shape: impl IntoShape) -> Array {
        if let Some(f) = propagate(&[self]) {
            return f;
        }
        let shape = match shape.into_shape() {
            Ok(s) => s,
            Err(bad) => return Array::failed("broadcast_to", OpErrorKind::InvalidShape(bad)),
        };
        if shape[..] == self.shape()[..] {
            return self.clone();
        }
        if let Err(k) = check_shape(&shape) {
            return Array::failed("broadcast_to", k);
        }
        Array::from_op("broadcast_to", Primitive::Broadcast(shape), vec![self.clone()])
    }

    /// The window `start..stop` by `strides` on every axis (a view). Negative indices count
    /// from the end and bounds clamp, as Python slices.
    ///
    /// ```
    /// use nuvec::ops;
    /// let a = ops::arange(0, 10, 1);
    /// assert_eq!(a.slice(&[8], &[0], &[-3]).to_vec::<i32>().unwrap(), vec![8, 5, 2]);
    /// ```
    #[track_caller]
    pub fn slice(&self, start: &[i32], stop: &[i32], strides: &[i32]) -> Array {
        if let Some(f) = propagate(&[self]) {
            return f;
        }
        match self.normalize_window("slice", start, stop, strides) {
            Ok((start, stop, step)) => {
                Array::from_op("slice", Primitive::Slice { start, stop, step }, vec![self.clone()])
            }
            Err(f) => f,
        }
    }

    /// This array with the window `start..stop` by `strides` replaced by `update` (broadcast
    /// to the window). Arrays are immutable: the result is a new array.
    #[track_caller]
    pub fn slice_update(
        &self,
        update: impl Into<ScalarOrArray>,
        start: &[i32],
        stop: &[i32],
        strides: &[i32],
    ) -> Array {
        let update = update.into();
        let update = match update {
            ScalarOrArray::Scalar(s) => Array::scalar(s, s.weak_dtype_with(self.dtype())),
            ScalarOrArray::Array(a) => a,
        };
        if let Some(f) = propagate(&[self, &update]) {
            return f;
        }
        let (start, stop, step) = match self.normalize_window("slice_update", start, stop, strides) {
            Ok(w) => w,
            Err(f) => return f,
        };
        let window: Vec<i32> =
            (0..self.ndim()).map(|i| crate::primitive::view::slice_len(start[i], stop[i], step[i])).collect();
        match crate::shape::broadcast_shapes(update.shape(), &window) {
            Ok(b) if b[..] == window[..] => {}
            _ => {
                return Array::failed(
                    "slice_update",
                    OpErrorKind::ShapeMismatch { lhs: update.shape().to_vec(), rhs: window.clone() },
                );
            }
        }
        // MLX keeps the destination's dtype.
        let update = update.astype(self.dtype()).broadcast_to(&window);
        Array::from_op("slice_update", Primitive::SliceUpdate { start, stop, step }, vec![self.clone(), update])
    }

    #[track_caller]
    fn normalize_window(
        &self,
        op: &'static str,
        start: &[i32],
        stop: &[i32],
        strides: &[i32],
    ) -> Result<Window, Array> {
        let n = self.ndim();
        if start.len() != n || stop.len() != n || (strides.len() != n && !strides.is_empty()) {
            return Err(invalid(
                op,
                format!(
                    "start, stop and strides need one entry per axis ({n}), got {}, {}, {}",
                    start.len(),
                    stop.len(),
                    strides.len()
                ),
            ));
        }
        let (mut s, mut e, mut st) = (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
        for i in 0..n {
            let step = strides.get(i).copied().unwrap_or(1);
            if step == 0 {
                return Err(invalid(op, format!("stride of axis {i} is zero")));
            }
            let (a, b) = normalize_slice(Some(start[i]), Some(stop[i]), step, self.shape()[i]);
            s.push(a);
            e.push(b);
            st.push(step);
        }
        Ok((s, e, st))
    }

    /// Splits into `sections` equal parts along `axis`.
    #[track_caller]
    pub fn split(&self, sections: i32, axis: i32) -> Vec<Array> {
        // On failure: `sections` copies of the failed array, so callers can index the parts.
        let parts = sections.clamp(1, 1 << 16) as usize;
        if let Some(f) = propagate(&[self]) {
            return vec![f; parts];
        }
        let ax = match axis_or_fail("split", axis, self.ndim()) {
            Ok(a) => a,
            Err(f) => return vec![f; parts],
        };
        let dim = self.shape()[ax];
        if sections <= 0 || dim % sections != 0 {
            let f = invalid("split", format!("axis {axis} of size {dim} does not split into {sections} equal parts"));
            return vec![f; parts];
        }
        let indices: Vec<i32> = (1..sections).map(|i| i * dim / sections).collect();
        self.split_at(&indices, axis)
    }

    /// Splits along `axis` before each of `indices`.
    #[track_caller]
    pub fn split_at(&self, indices: &[i32], axis: i32) -> Vec<Array> {
        // On failure: one failed array per part, so callers can index the parts.
        if let Some(f) = propagate(&[self]) {
            return vec![f; indices.len() + 1];
        }
        let ax = match axis_or_fail("split_at", axis, self.ndim()) {
            Ok(a) => a,
            Err(f) => return vec![f; indices.len() + 1],
        };
        let dim = self.shape()[ax];
        let mut bounds = vec![0];
        for &i in indices {
            let i = if i < 0 { i + dim } else { i }.clamp(0, dim);
            bounds.push(i.max(*bounds.last().unwrap_or(&0)));
        }
        bounds.push(dim);
        bounds
            .windows(2)
            .map(|w| {
                let mut start = vec![0; self.ndim()];
                let mut stop = self.shape().to_vec();
                start[ax] = w[0];
                stop[ax] = w[1];
                self.slice(&start, &stop, &[])
            })
            .collect()
    }

    /// Each element repeated `repeats` times along `axis` (`None`: of the flattened array).
    #[track_caller]
    pub fn repeat(&self, repeats: i32, axis: impl Into<Option<i32>>) -> Array {
        if let Some(f) = propagate(&[self]) {
            return f;
        }
        if repeats < 0 {
            return invalid("repeat", format!("repeats must be non-negative, got {repeats}"));
        }
        let (x, axis) = match axis.into() {
            Some(a) => (self.clone(), a),
            None => (self.reshape([-1]), 0),
        };
        let ax = match axis_or_fail("repeat", axis, x.ndim()) {
            Ok(a) => a,
            Err(f) => return f,
        };
        let mut shape: Vec<i32> = x.shape().to_vec();
        let repeated = shape[ax] as i64 * repeats as i64;
        shape[ax] = match dim_or_fail("repeat", repeated, || x.shape().iter().map(|&d| d as i64).collect()) {
            Ok(d) => d,
            Err(f) => return f,
        };
        let expanded = x.expand_dims(ax as i32 + 1);
        let mut target: Vec<i32> = expanded.shape().to_vec();
        target[ax + 1] = repeats;
        expanded.broadcast_to(target).reshape(shape)
    }

    /// The array repeated `reps[i]` times along each axis (reps shorter than ndim apply to the
    /// trailing axes; longer ones add leading axes).
    #[track_caller]
    pub fn tile(&self, reps: &[i32]) -> Array {
        if let Some(f) = propagate(&[self]) {
            return f;
        }
        if let Some(r) = reps.iter().find(|&&r| r < 0) {
            return invalid("tile", format!("repetitions must be non-negative, got {r}"));
        }
        let n = reps.len().max(self.ndim());
        let mut shape = vec![1; n - self.ndim()];
        shape.extend_from_slice(self.shape());
        let mut reps_full = vec![1; n - reps.len()];
        reps_full.extend_from_slice(reps);
        // [d0, d1] -> [1, d0, 1, d1] broadcast to [r0, d0, r1, d1] -> [r0*d0, r1*d1].
        let mut expanded = Vec::with_capacity(2 * n);
        let mut target = Vec::with_capacity(2 * n);
        for i in 0..n {
            expanded.extend([1, shape[i]]);
            target.extend([reps_full[i], shape[i]]);
        }
        let mut out: Vec<i32> = Vec::with_capacity(n);
        for i in 0..n {
            let d = shape[i] as i64 * reps_full[i] as i64;
            match dim_or_fail("tile", d, || shape.iter().zip(&reps_full).map(|(&a, &b)| a as i64 * b as i64).collect())
            {
                Ok(d) => out.push(d),
                Err(f) => return f,
            }
        }
        // Each axis fits, but their product may pass the element limit: fail naming `tile`
        // here, not `broadcast_to` below.
        if check_shape(&out).is_err() {
            return invalid(
                "tile",
                format!(
                    "tiling shape {:?} by {reps:?} gives shape {out:?}, more elements than an array can hold",
                    self.shape()
                ),
            );
        }
        self.reshape(expanded).broadcast_to(target).reshape(out)
    }

    /// Pads with `value`: `widths[i] = (before, after)` for axis `i`, or one pair for every axis.
    #[track_caller]
    pub fn pad(&self, widths: &[(i32, i32)], value: impl Into<ScalarOrArray>) -> Array {
        if let Some(f) = propagate(&[self]) {
            return f;
        }
        let widths = match self.pad_widths(widths) {
            Ok(w) => w,
            Err(f) => return f,
        };
        let out_shape = match self.padded_shape(&widths) {
            Ok(s) => s,
            Err(f) => return f,
        };
        let base = match value.into() {
            ScalarOrArray::Scalar(s) => Array::scalar(s, self.dtype()),
            ScalarOrArray::Array(a) => a.astype(self.dtype()),
        };
        if base.ndim() != 0 {
            return invalid("pad", format!("the pad value must be a scalar, got shape {:?}", base.shape()));
        }
        let start: Vec<i32> = widths.iter().map(|&(a, _)| a).collect();
        let stop: Vec<i32> = start.iter().zip(self.shape()).map(|(a, d)| a + d).collect();
        base.broadcast_to(out_shape).slice_update(self, &start, &stop, &[])
    }

    /// Pads by repeating the edge values.
    #[track_caller]
    pub fn pad_edge(&self, widths: &[(i32, i32)]) -> Array {
        if let Some(f) = propagate(&[self]) {
            return f;
        }
        let widths = match self.pad_widths(widths) {
            Ok(w) => w,
            Err(f) => return f,
        };
        if let Err(f) = self.padded_shape(&widths) {
            return f;
        }
        let mut out = self.clone();
        for (ax, &(before, after)) in widths.iter().enumerate() {
            if out.is_failed() {
                return out;
            }
            if before == 0 && after == 0 {
                continue;
            }
            if out.shape()[ax] == 0 {
                return invalid("pad", format!("cannot edge-pad the empty axis {ax}"));
            }
            let n = out.shape()[ax];
            let mut parts = Vec::new();
            let edge = |i: i32, count: i32| {
                let e = out.split_at(&[i, i + 1], ax as i32)[1].clone();
                let mut target = e.shape().to_vec();
                target[ax] = count;
                e.broadcast_to(target)
            };
            if before > 0 {
                parts.push(edge(0, before));
            }
            parts.push(out.clone());
            if after > 0 {
                parts.push(edge(n - 1, after));
            }
            out = concatenate(&parts, ax as i32);
        }
        out
    }

    /// The padded shape, or a failed array naming `pad` when an axis or the element count
    /// passes its limit (not `broadcast_to` or `concatenate`, which pad calls).
    #[track_caller]
    fn padded_shape(&self, widths: &[(i32, i32)]) -> Result<Vec<i32>, Array> {
        let mut out: Vec<i32> = Vec::with_capacity(widths.len());
        for (&d, &(a, b)) in self.shape().iter().zip(widths) {
            let wide = d as i64 + a as i64 + b as i64;
            out.push(dim_or_fail("pad", wide, || vec![wide])?);
        }
        if check_shape(&out).is_err() {
            return Err(invalid(
                "pad",
                format!(
                    "padding shape {:?} by {widths:?} gives shape {out:?}, more elements than an array can hold",
                    self.shape()
                ),
            ));
        }
        Ok(out)
    }

    #[track_caller]
    fn pad_widths(&self, widths: &[(i32, i32)]) -> Result<Vec<(i32, i32)>, Array> {
        let widths: Vec<(i32, i32)> = match widths.len() {
            1 => vec![widths[0]; self.ndim()],
            n if n == self.ndim() => widths.to_vec(),
            n => return Err(invalid("pad", format!("{n} pad widths for an array of {} axes", self.ndim()))),
        };
        if let Some(w) = widths.iter().find(|(a, b)| *a < 0 || *b < 0) {
            return Err(invalid("pad", format!("pad widths must be non-negative, got {w:?}")));
        }
        for (&d, &(a, b)) in self.shape().iter().zip(&widths) {
            let wide = d as i64 + a as i64 + b as i64;
            dim_or_fail("pad", wide, || vec![wide])?;
        }
        Ok(widths)
    }

    /// A row-contiguous array with these elements (the array itself when already so).
    #[track_caller]
    pub fn contiguous(&self) -> Array {
        Array::from_op("contiguous", Primitive::Copy, vec![self.clone()])
    }

    /// A copy. Arrays are immutable, so the copy may share bytes with the original.
    #[track_caller]
    pub fn copy(&self) -> Array {
        Array::from_op("copy", Primitive::Copy, vec![self.clone()])
    }

    /// The same values with gradients blocked.
    #[track_caller]
    pub fn stop_gradient(&self) -> Array {
        Array::from_op("stop_gradient", Primitive::StopGradient, vec![self.clone()])
    }

    /// Lower triangle (on and below diagonal `k`) of the last two axes; zeros elsewhere.
    #[track_caller]
    pub fn tril(&self, k: i32) -> Array {
        self.triangle("tril", k, true)
    }

    /// Upper triangle (on and above diagonal `k`) of the last two axes; zeros elsewhere.
    #[track_caller]
    pub fn triu(&self, k: i32) -> Array {
        self.triangle("triu", k, false)
    }

    #[track_caller]
    fn triangle(&self, op: &'static str, k: i32, lower: bool) -> Array {
        if let Some(f) = propagate(&[self]) {
            return f;
        }
        if self.ndim() < 2 {
            return invalid(op, format!("needs at least 2 dimensions, got shape {:?}", self.shape()));
        }
        let (n, m) = (self.shape()[self.ndim() - 2], self.shape()[self.ndim() - 1]);
        let mask = if lower {
            super::tri(n, m, k, crate::dtype::DType::Bool)
        } else {
            super::tri(n, m, k.saturating_sub(1), crate::dtype::DType::Bool).logical_not()
        };
        super::where_(&mask, self, self.zeros_like())
    }
}

/// Joins arrays along `axis` (dtypes promote; other axes must match).
///
/// ```
/// use nuvec::{array, ops};
/// let c = ops::concatenate(&[array![[1, 2]], array![[3, 4]]], 0);
/// assert_eq!(c.shape(), &[2, 2]);
/// ```
#[track_caller]
pub fn concatenate(arrays: &[Array], axis: i32) -> Array {
    let refs: Vec<&Array> = arrays.iter().collect();
    if let Some(f) = propagate(&refs) {
        return f;
    }
    let Some(first) = arrays.first() else {
        return invalid("concatenate", "needs at least one array");
    };
    if first.ndim() == 0 {
        return invalid("concatenate", "cannot concatenate 0-d arrays");
    }
    let ax = match axis_or_fail("concatenate", axis, first.ndim()) {
        Ok(a) => a,
        Err(f) => return f,
    };
    if arrays.len() == 1 {
        return first.clone();
    }
    let dtype = arrays.iter().skip(1).fold(first.dtype(), |d, a| promote_types(d, a.dtype()));
    let inputs: Vec<Array> = arrays.iter().map(|a| a.astype(dtype)).collect();
    Array::from_op("concatenate", Primitive::Concatenate { axis: ax }, inputs)
}

/// Stacks arrays of one shape along a new `axis`.
#[track_caller]
pub fn stack(arrays: &[Array], axis: i32) -> Array {
    let refs: Vec<&Array> = arrays.iter().collect();
    if let Some(f) = propagate(&refs) {
        return f;
    }
    let Some(first) = arrays.first() else {
        return invalid("stack", "needs at least one array");
    };
    if let Some(a) = arrays.iter().find(|a| a.shape() != first.shape()) {
        return Array::failed(
            "stack",
            OpErrorKind::ShapeMismatch { lhs: first.shape().to_vec(), rhs: a.shape().to_vec() },
        );
    }
    let ax = match axis_or_fail("stack", axis, first.ndim() + 1) {
        Ok(a) => a as i32,
        Err(f) => return f,
    };
    let expanded: Vec<Array> = arrays.iter().map(|a| a.expand_dims(ax)).collect();
    concatenate(&expanded, ax)
}

/// Broadcasts arrays to their common shape.
#[track_caller]
pub fn broadcast_arrays(arrays: &[Array]) -> Vec<Array> {
    let refs: Vec<&Array> = arrays.iter().collect();
    if let Some(f) = propagate(&refs) {
        return vec![f; arrays.len().max(1)];
    }
    let mut shape = Shape::new();
    for a in arrays {
        match crate::shape::broadcast_shapes(&shape, a.shape()) {
            Ok(s) => shape = s,
            Err(k) => return vec![Array::failed("broadcast_arrays", k)],
        }
    }
    arrays.iter().map(|a| a.broadcast_to(&shape)).collect()
}

macro_rules! method_mirrors {
    ($($(#[$m:meta])* fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {$(
        $(#[$m])*
        #[track_caller]
        pub fn $name(x: &Array, $($arg: $ty),*) -> $ret { x.$name($($arg),*) }
    )*};
}

method_mirrors! {
    /// Reshapes (see [`Array::reshape`]).
    fn reshape(shape: impl IntoShape) -> Array;
    /// Merges axes `start..=end`.
    fn flatten(start: i32, end: i32) -> Array;
    /// Permutes axes.
    fn transpose(axes: &[i32]) -> Array;
    /// Exchanges two axes.
    fn swapaxes(a: i32, b: i32) -> Array;
    /// Moves one axis.
    fn moveaxis(source: i32, destination: i32) -> Array;
    /// Inserts size-1 axes.
    fn expand_dims(axes: impl Axes) -> Array;
    /// Removes size-1 axes.
    fn squeeze(axes: impl Axes) -> Array;
    /// Broadcasts to a shape.
    fn broadcast_to(shape: impl IntoShape) -> Array;
    /// A strided window.
    fn slice(start: &[i32], stop: &[i32], strides: &[i32]) -> Array;
    /// Replaces a strided window.
    fn slice_update(update: impl Into<ScalarOrArray>, start: &[i32], stop: &[i32], strides: &[i32]) -> Array;
    /// Splits into equal parts.
    fn split(sections: i32, axis: i32) -> Vec<Array>;
    /// Splits before the given indices.
    fn split_at(indices: &[i32], axis: i32) -> Vec<Array>;
    /// Repeats each element.
    fn repeat(repeats: i32, axis: impl Into<Option<i32>>) -> Array;
    /// Tiles the array.
    fn tile(reps: &[i32]) -> Array;
    /// Pads with a constant.
    fn pad(widths: &[(i32, i32)], value: impl Into<ScalarOrArray>) -> Array;
    /// Pads with edge values.
    fn pad_edge(widths: &[(i32, i32)]) -> Array;
    /// A row-contiguous array.
    fn contiguous() -> Array;
    /// A copy.
    fn copy() -> Array;
    /// Blocks gradients.
    fn stop_gradient() -> Array;
    /// Lower triangle.
    fn tril(k: i32) -> Array;
    /// Upper triangle.
    fn triu(k: i32) -> Array;
}
