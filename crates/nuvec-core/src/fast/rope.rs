//! Rotary position embeddings, as MLX's `mx.fast.rope`.
//!
//! `x` is `[B, ..., T, D]`; its first `dims` features are rotated in pairs — the two halves
//! `(x[i], x[i + dims/2])`, or neighbours `(x[2i], x[2i+1])` when `traditional` — by the angle
//! `(offset + t) · scale · θᵢ` with `θᵢ = base^(−2i/dims)` or `1 / freqs[i]`. The rest pass
//! through. The inverse rotation (`forward = false`) is the derivative.

use super::{FastOp, RopeParams};
use crate::array::Array;
use crate::dtype::DType;
use crate::error::OpErrorKind;
use crate::ops;

fn invalid(msg: String) -> OpErrorKind {
    OpErrorKind::InvalidArgument(msg)
}

/// `x[..., start:stop:step]`.
fn last_axis(x: &Array, start: i32, stop: i32, step: i32) -> Array {
    let nd = x.ndim();
    let mut lo = vec![0; nd];
    let mut hi: Vec<i32> = x.shape().to_vec();
    let mut st = vec![1; nd];
    (lo[nd - 1], hi[nd - 1], st[nd - 1]) = (start, stop, step);
    x.slice(&lo, &hi, &st)
}

/// Angles `[..., T, dims/2]` in `float32`: positions `(offset + t) · scale` times `θᵢ`.
fn angles(p: &RopeParams, shape: &[i32], offset: &Array, freqs: Option<&Array>) -> Array {
    let nd = shape.len();
    let (t, half) = (shape[nd - 2], p.dims / 2);
    let inv_freq = match (p.base, freqs) {
        (Some(base), _) => (ops::arange(0, half, 1).astype(DType::F32) * (-(base.ln()) / half as f32)).exp(),
        (None, Some(f)) => f.astype(DType::F32).reciprocal(),
        (None, None) => return Array::failed("rope", invalid("rope: neither base nor freqs".into())),
    };
    let steps = ops::arange(0, t, 1).astype(DType::F32);
    let off = offset.astype(DType::F32);
    let pos = if offset.ndim() == 0 {
        steps + off
    } else {
        // One offset per batch row: [B, 1, ..., 1] + [T] broadcasts to [B, 1, ..., T].
        let mut s = vec![1; nd - 1];
        s[0] = shape[0];
        off.reshape(s) + steps
    };
    (pos * p.scale).expand_dims(-1) * inv_freq
}

pub(super) fn composition(p: &RopeParams, x: &Array, offset: &Array, freqs: Option<&Array>) -> Array {
    let shape = x.shape().to_vec();
    let (d, dims, half) = (shape[shape.len() - 1], p.dims, p.dims / 2);
    let theta = angles(p, &shape, offset, freqs);
    let (c, s) = (theta.cos(), if p.forward { theta.sin() } else { -theta.sin() });
    let xf = if x.dtype() == DType::F64 { x.clone() } else { x.astype(DType::F32) };
    let (x1, x2) = if p.traditional {
        (last_axis(&xf, 0, dims, 2), last_axis(&xf, 1, dims, 2))
    } else {
        (last_axis(&xf, 0, half, 1), last_axis(&xf, half, dims, 1))
    };
    let o1 = &x1 * &c - &x2 * &s;
    let o2 = &x1 * &s + &x2 * &c;
    let rotated = if p.traditional {
        let mut s = shape.clone();
        *s.last_mut().expect("rope inputs are at least 3-D") = dims;
        ops::stack(&[o1, o2], -1).reshape(s)
    } else {
        ops::concatenate(&[o1, o2], -1)
    };
    let out = if dims < d { ops::concatenate(&[rotated, last_axis(&xf, dims, d, 1)], -1) } else { rotated };
    out.astype(x.dtype())
}

/// Rotary position embedding of `x` (`[B, ..., T, D]`), as MLX's `mx.fast.rope`: the first
/// `dims` features of position `t` rotate by `(offset + t) · scale · θᵢ`, with
/// `θᵢ = base^(−2i/dims)` (`base`) or `1 / freqs[i]` (`freqs`, exactly one of the two).
/// `offset` is an integer scalar or one offset per batch row (`[B]`). `traditional` rotates
/// neighbouring pairs instead of the two halves.
///
/// ```
/// use nuvec::{array, fast, Array};
/// // One head, two positions, D = 2: position 1 with base 1 rotates by 1 radian.
/// let x = array![[[1.0f32, 0.0], [1.0, 0.0]]].reshape([1, 1, 2, 2]);
/// let y = fast::rope(&x, 2, false, Some(1.0), 1.0, &Array::from(0), None);
/// let v: Vec<f32> = y.to_vec().unwrap();
/// assert_eq!(&v[..2], &[1.0, 0.0]);
/// assert!((v[2] - 1f32.cos()).abs() < 1e-6 && (v[3] - 1f32.sin()).abs() < 1e-6);
/// // Odd dims are refused, naming the argument.
/// let bad = fast::rope(&x, 1, false, Some(1.0), 1.0, &Array::from(0), None);
/// assert!(bad.check().unwrap_err().to_string().contains("dims"));
/// ```
#[track_caller]
pub fn rope<'a>(
    x: &Array,
    dims: i32,
    traditional: bool,
    base: Option<f32>,
    scale: f32,
    offset: &Array,
    freqs: impl Into<Option<&'a Array>>,
) -> Array {
    let freqs = freqs.into();
    if base.is_some() == freqs.is_some() {
        return Array::failed("rope", invalid("rope: exactly one of base and freqs must be given".into()));
    }
    let offset = if offset.dtype().is_integer() && offset.dtype() != DType::I32 {
        offset.astype(DType::I32)
    } else {
        offset.clone()
    };
    let mut inputs = vec![x.clone(), offset];
    // Frequencies are float32 whatever their dtype (as MLX).
    inputs.extend(freqs.map(|f| if f.dtype().is_float() { f.astype(DType::F32) } else { f.clone() }));
    let p = RopeParams { dims, traditional, base, scale, forward: true };
    super::record(FastOp::Rope(p), inputs, 1).remove(0)
}
