//! View primitives: reshape, transpose, slice, broadcast, bit cast. Their shape rules, and how
//! each maps an input layout to an output layout without touching the bytes. Also the shape
//! rules of the two copies built on windows and axes like theirs: slice update and concatenate.

use smallvec::SmallVec;

use crate::dtype::DType;
use crate::error::OpErrorKind;
use crate::shape::{Shape, Strides, broadcast_shapes, elem_count};
use crate::storage::{Layout, Spec};

use super::Primitive;

/// Shape of `shape` permuted by `perm`.
pub fn transpose_shape(shape: &[i32], perm: &[usize]) -> Result<Shape, OpErrorKind> {
    let mut seen = vec![false; shape.len()];
    if perm.len() != shape.len() {
        return Err(OpErrorKind::InvalidArgument(format!(
            "axes {perm:?} do not permute the {} axes of the array",
            shape.len()
        )));
    }
    for &p in perm {
        if p >= shape.len() || std::mem::replace(&mut seen[p], true) {
            return Err(OpErrorKind::InvalidArgument(format!("axes {perm:?} are not a permutation")));
        }
    }
    Ok(perm.iter().map(|&p| shape[p]).collect())
}

/// Number of indices `start, start + step, ...` before `stop`.
pub fn slice_len(start: i32, stop: i32, step: i32) -> i32 {
    let n = if step > 0 {
        (stop as i64 - start as i64 + step as i64 - 1) / step as i64
    } else {
        (start as i64 - stop as i64 - step as i64 - 1) / -(step as i64)
    };
    n.max(0) as i32
}

/// Shape of a normalised window.
pub fn slice_shape(shape: &[i32], start: &[i32], stop: &[i32], step: &[i32]) -> Result<Shape, OpErrorKind> {
    let n = shape.len();
    if start.len() != n || stop.len() != n || step.len() != n {
        return Err(OpErrorKind::InvalidArgument(format!(
            "slice needs one start, stop and step per axis ({n}), got {}, {}, {}",
            start.len(),
            stop.len(),
            step.len()
        )));
    }
    let mut out = Shape::new();
    for i in 0..n {
        if step[i] == 0 {
            return Err(OpErrorKind::InvalidArgument("slice step cannot be zero".into()));
        }
        let len = slice_len(start[i], stop[i], step[i]);
        let in_range = |j: i32| j >= 0 && j < shape[i];
        if len > 0 && (!in_range(start[i]) || !in_range(start[i] + (len - 1) * step[i])) {
            return Err(OpErrorKind::InvalidIndex(format!(
                "window {}..{} by {} is outside axis {i} of size {}",
                start[i], stop[i], step[i], shape[i]
            )));
        }
        out.push(len);
    }
    Ok(out)
}

/// Python-style normalisation of `start:stop:step` on an axis of size `dim`: negative indices
/// count from the end and out-of-range bounds clamp.
pub fn normalize_slice(start: Option<i32>, stop: Option<i32>, step: i32, dim: i32) -> (i32, i32) {
    let norm = |v: i32| if v < 0 { v + dim } else { v };
    if step > 0 {
        let s = start.map_or(0, |v| norm(v).clamp(0, dim));
        let e = stop.map_or(dim, |v| norm(v).clamp(0, dim));
        (s, e)
    } else {
        let s = start.map_or(dim - 1, |v| norm(v).clamp(-1, dim - 1));
        let e = stop.map_or(-1, |v| norm(v).clamp(-1, dim - 1));
        (s, e)
    }
}

/// `shape` when it holds as many elements as `input`.
pub fn reshape_shape(input: &[i32], shape: &Shape) -> Result<Shape, OpErrorKind> {
    if elem_count(shape) != elem_count(input) {
        return Err(OpErrorKind::SizeMismatch { expected: elem_count(input), actual: elem_count(shape) });
    }
    Ok(shape.clone())
}

/// `shape` when `input` broadcasts to exactly it.
pub fn broadcast_shape(input: &[i32], shape: &Shape) -> Result<Shape, OpErrorKind> {
    let b = broadcast_shapes(input, shape)?;
    if b[..] != shape[..] {
        return Err(OpErrorKind::ShapeMismatch { lhs: input.to_vec(), rhs: shape.to_vec() });
    }
    Ok(shape.clone())
}

/// `SliceUpdate`'s output (`src`'s spec) when `update` has the window's shape and `src`'s dtype.
pub fn slice_update_spec(
    src: &Spec,
    update: &Spec,
    start: &[i32],
    stop: &[i32],
    step: &[i32],
) -> Result<Spec, OpErrorKind> {
    if src.dtype != update.dtype {
        return Err(OpErrorKind::DTypeMismatch { lhs: src.dtype, rhs: update.dtype });
    }
    let window = slice_shape(&src.shape, start, stop, step)?;
    if window != update.shape {
        return Err(OpErrorKind::ShapeMismatch { lhs: window.to_vec(), rhs: update.shape.to_vec() });
    }
    Ok(src.clone())
}

/// `Concatenate`'s output: the inputs (one dtype, equal shapes but on `axis`) joined on `axis`.
pub fn concatenate_spec(axis: usize, inputs: &[Spec]) -> Result<Spec, OpErrorKind> {
    let first =
        inputs.first().ok_or_else(|| OpErrorKind::InvalidArgument("concatenate needs at least one array".into()))?;
    let mut shape = first.shape.clone();
    if axis >= shape.len() {
        return Err(OpErrorKind::InvalidAxis { axis: axis as i32, ndim: shape.len() });
    }
    for x in &inputs[1..] {
        if x.dtype != first.dtype {
            return Err(OpErrorKind::DTypeMismatch { lhs: first.dtype, rhs: x.dtype });
        }
        let compatible = x.shape.len() == shape.len()
            && x.shape.iter().zip(&first.shape).enumerate().all(|(i, (a, b))| i == axis || a == b);
        if !compatible {
            return Err(OpErrorKind::ShapeMismatch { lhs: first.shape.to_vec(), rhs: x.shape.to_vec() });
        }
        let total = shape[axis] as i64 + x.shape[axis] as i64;
        if total > i32::MAX as i64 {
            return Err(OpErrorKind::InvalidShape(vec![total]));
        }
        shape[axis] = total as i32;
    }
    Ok(Spec { shape, dtype: first.dtype })
}

/// Output shape of reinterpreting `x`'s bytes as `dtype` (the last axis scales when sizes
/// differ, as MLX's `view`).
pub fn bitcast_shape(x: &Spec, dtype: DType) -> Result<Shape, OpErrorKind> {
    let (from, to) = (x.dtype.size() as i64, dtype.size() as i64);
    let mut shape = x.shape.clone();
    if from == to {
        return Ok(shape);
    }
    let last = match shape.last_mut() {
        Some(l) => l,
        None => {
            return Err(OpErrorKind::InvalidArgument(format!(
                "cannot view a scalar of {} as {dtype}: the item sizes differ",
                x.dtype
            )));
        }
    };
    let bytes = *last as i64 * from;
    if bytes % to != 0 {
        return Err(OpErrorKind::InvalidArgument(format!(
            "the last axis ({} bytes) is not a multiple of the size of {dtype}",
            bytes
        )));
    }
    *last = (bytes / to) as i32;
    Ok(shape)
}

/// The output layout of a view primitive applied to an input layout, in units of the output
/// dtype, or `None` when the bytes must be copied to row-major order first.
pub fn view_layout(prim: &Primitive, input: &Spec, layout: &Layout, out_shape: &[i32]) -> Option<Layout> {
    match prim {
        Primitive::StopGradient | Primitive::Identity => Some(layout.clone()),
        Primitive::Transpose(perm) => {
            let strides: Strides = perm.iter().map(|&p| layout.strides[p]).collect();
            Some(Layout::new(out_shape, strides, layout.offset))
        }
        Primitive::Broadcast(shape) => {
            let lead = shape.len() - input.shape.len();
            let mut strides: Strides = SmallVec::from_elem(0, shape.len());
            for i in 0..input.shape.len() {
                strides[lead + i] = if input.shape[i] == 1 && shape[lead + i] != 1 { 0 } else { layout.strides[i] };
            }
            Some(Layout::new(out_shape, strides, layout.offset))
        }
        Primitive::Slice { start, step, .. } => {
            let mut offset = layout.offset as isize;
            let mut strides = Strides::new();
            for i in 0..start.len() {
                if out_shape[i] > 0 {
                    offset += start[i] as isize * layout.strides[i];
                }
                strides.push(layout.strides[i] * step[i] as isize);
            }
            // An empty window views nothing; keep the offset inside the storage.
            if elem_count(out_shape) == 0 {
                offset = layout.offset as isize;
            }
            Some(Layout::new(out_shape, strides, offset as usize))
        }
        Primitive::Reshape(_) => reshape_strides(&input.shape, &layout.strides, out_shape)
            .map(|strides| Layout::new(out_shape, strides, layout.offset)),
        Primitive::BitCast(dtype) => {
            let (from, to) = (input.dtype.size(), dtype.size());
            if from == to {
                return Some(layout.clone());
            }
            if !layout.flags.row_contiguous || !(layout.offset * from).is_multiple_of(to) {
                return None;
            }
            Some(Layout::new(out_shape, crate::shape::row_major_strides(out_shape), layout.offset * from / to))
        }
        _ => None,
    }
}

/// Strides that let `shape`/`strides` be read as `new_shape` with no copy (NumPy's
/// no-copy reshape), if any.
pub fn reshape_strides(shape: &[i32], strides: &[isize], new_shape: &[i32]) -> Option<Strides> {
    let size = elem_count(shape);
    if size == 0 || size == 1 {
        return Some(crate::shape::row_major_strides(new_shape));
    }
    // Drop size-1 axes of the input; they carry no stride information.
    let dims: Vec<(i32, isize)> = shape.iter().zip(strides).filter(|(d, _)| **d != 1).map(|(&d, &s)| (d, s)).collect();
    let mut out: Strides = SmallVec::from_elem(0, new_shape.len());
    let (mut oi, mut ni) = (0usize, 0usize);
    while oi < dims.len() && ni < new_shape.len() {
        // Group old axes [oi, oj) and new axes [ni, nj) with equal element counts.
        let (mut oj, mut nj) = (oi + 1, ni + 1);
        let mut op = dims[oi].0 as i64;
        let mut np = new_shape[ni] as i64;
        while op != np {
            if np < op {
                np *= new_shape[nj] as i64;
                nj += 1;
            } else {
                op *= dims[oj].0 as i64;
                oj += 1;
            }
        }
        // The old group must be contiguous in itself.
        for k in oi..oj - 1 {
            if dims[k].1 != dims[k + 1].1 * dims[k + 1].0 as isize {
                return None;
            }
        }
        // Fill the new group's strides from its innermost axis.
        out[nj - 1] = dims[oj - 1].1;
        for k in (ni..nj - 1).rev() {
            out[k] = out[k + 1] * new_shape[k + 1] as isize;
        }
        oi = oj;
        ni = nj;
    }
    // Trailing size-1 axes of the new shape.
    for k in ni..new_shape.len() {
        out[k] = 1;
    }
    Some(out)
}

// ---- derivatives and batching ---------------------------------------------------------------

use crate::array::Array;

/// The cotangent of a view's input from the cotangent `g` of its output.
pub(crate) fn view_vjp(prim: &Primitive, x: &Array, g: &Array) -> Option<Array> {
    match prim {
        Primitive::Reshape(_) => Some(g.reshape(x.shape())),
        Primitive::Transpose(perm) => {
            let mut inv = vec![0i32; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inv[p] = i as i32;
            }
            Some(g.transpose(&inv))
        }
        Primitive::Slice { start, stop, step } => {
            // Scatter the cotangent back into zeros of the input's shape.
            Some(x.zeros_like().astype(g.dtype()).slice_update(g, start, &window_stop(stop, step, x.shape()), step))
        }
        Primitive::Broadcast(shape) => Some(sum_to_shape(g, x.shape(), shape)),
        Primitive::StopGradient | Primitive::BitCast(_) => None,
        _ => None,
    }
}

/// `stop` values that `slice`/`slice_update`'s Python-style normalisation maps back to a
/// normalised window: a reversed window ending at index 0 (normalised stop -1, which Python
/// would read as the last element) becomes `-(dim + 1)`.
pub(crate) fn window_stop(stop: &[i32], step: &[i32], shape: &[i32]) -> Vec<i32> {
    stop.iter().zip(step).zip(shape).map(|((&b, &s), &d)| if s < 0 && b < 0 { -(d + 1) } else { b }).collect()
}

/// Sums `g` (of shape `from`, a broadcast of `to`) back to shape `to`.
pub(crate) fn sum_to_shape(g: &Array, to: &[i32], from: &[i32]) -> Array {
    let lead = from.len() - to.len();
    let mut axes: Vec<i32> = (0..lead as i32).collect();
    for (i, &d) in to.iter().enumerate() {
        if d == 1 && from[lead + i] != 1 {
            axes.push((lead + i) as i32);
        }
    }
    if axes.is_empty() { g.reshape(to) } else { g.sum_keepdims(&axes).reshape(to) }
}

/// A view applied to a batched input whose batch axis is 0: the same view with the batch axis
/// kept in front.
pub(crate) fn view_vmap(prim: &Primitive, x: &Array, out_shape: &[i32]) -> Array {
    let b = x.shape()[0];
    let with_batch = |s: &[i32]| -> Vec<i32> { std::iter::once(b).chain(s.iter().copied()).collect() };
    match prim {
        Primitive::Reshape(_) => x.reshape(with_batch(out_shape)),
        Primitive::Transpose(perm) => {
            let p: Vec<i32> = std::iter::once(0).chain(perm.iter().map(|&a| a as i32 + 1)).collect();
            x.transpose(&p)
        }
        Primitive::Slice { start, stop, step } => {
            let mut st = vec![0];
            st.extend(start);
            let mut sp = vec![b];
            sp.extend(window_stop(stop, step, &x.shape()[1..]));
            let mut sd = vec![1];
            sd.extend(step);
            x.slice(&st, &sp, &sd)
        }
        Primitive::Broadcast(shape) => {
            // Align the input's axes with the target's trailing axes, batch first.
            let rank = shape.len() + 1;
            let mut aligned = vec![b];
            aligned.extend(std::iter::repeat_n(1, rank - x.ndim()));
            aligned.extend(&x.shape()[1..]);
            x.reshape(aligned).broadcast_to(with_batch(shape))
        }
        Primitive::StopGradient => x.stop_gradient(),
        Primitive::BitCast(d) => x.view(*d),
        _ => x.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reshape_views() {
        // Row-major [2, 3, 4] -> [6, 4] is a view.
        assert_eq!(&reshape_strides(&[2, 3, 4], &[12, 4, 1], &[6, 4]).unwrap()[..], &[4, 1]);
        // Transposed [4, 3] (strides [1, 4]) -> [12] needs a copy.
        assert!(reshape_strides(&[4, 3], &[1, 4], &[12]).is_none());
        // Splitting an axis of a transposed array is still a view.
        assert_eq!(&reshape_strides(&[4, 6], &[1, 4], &[4, 2, 3]).unwrap()[..], &[1, 12, 4]);
        // Size-1 axes anywhere.
        assert_eq!(&reshape_strides(&[3, 1, 2], &[2, 7, 1], &[1, 3, 2, 1]).unwrap()[..], &[6, 2, 1, 1]);
    }

    #[test]
    fn slices() {
        assert_eq!(slice_len(0, 10, 3), 4);
        assert_eq!(slice_len(9, -1, -1), 10);
        assert_eq!(slice_len(5, 2, 1), 0);
        assert_eq!(normalize_slice(None, None, -1, 5), (4, -1));
        assert_eq!(normalize_slice(Some(-2), None, 1, 5), (3, 5));
    }
}
