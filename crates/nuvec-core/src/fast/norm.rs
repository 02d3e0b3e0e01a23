//! RMS and layer normalisation over the last axis, the residual-add + RMS norm pair, and the
//! primitives of their derivatives.
//!
//! Semantics are MLX's: statistics in `float32`, the normalised row cast to the output dtype
//! (`x`'s promoted with the weight's) before the weight multiplies it and the bias is added.

//!
//! The compositions cast `x` to `float32` only for its statistics: elsewhere a half-precision
//! operand meets a `float32` one in a binary op, which widens it as it loads it (exactly), so
//! the full-size passes read 2 bytes per element instead of 4.

use super::{FastOp, record};
use crate::array::Array;
use crate::dtype::{DType, promote_types};

fn f32_of(x: &Array) -> Array {
    if x.dtype() == DType::F64 { x.clone() } else { x.astype(DType::F32) }
}

/// `rsqrt(mean(x²) + eps)` per row, in `float32` (`float64` for `float64` inputs).
fn rms_factor(x: &Array, eps: f32) -> Array {
    (f32_of(x).square().mean_keepdims(-1) + eps).rsqrt()
}

pub(super) fn rms_norm_composition(eps: f32, x: &Array, w: Option<&Array>) -> Array {
    let dtype = w.map_or(x.dtype(), |w| promote_types(x.dtype(), w.dtype()));
    let y = (x * rms_factor(x, eps)).astype(dtype);
    match w {
        Some(w) => y * w,
        None => y,
    }
}

pub(super) fn layer_norm_composition(eps: f32, x: &Array, w: Option<&Array>, b: Option<&Array>) -> Array {
    let dtype = [w, b].into_iter().flatten().fold(x.dtype(), |d, p| promote_types(d, p.dtype()));
    let centred = x - f32_of(x).mean_keepdims(-1);
    let var = centred.square().mean_keepdims(-1);
    let mut y = (centred * (var + eps).rsqrt()).astype(dtype);
    if let Some(w) = w {
        y = y * w;
    }
    if let Some(b) = b {
        y = y + b;
    }
    y
}

/// The RMS norm's cotangents with `n = rsqrt(mean(x²) + eps)` and `u = g·w`:
/// `gx = n·(u − x·c)` with the row factor `c = n²·mean(u·x)` (so each full-size step is one
/// product), `gw = Σ_rows g·x·n`.
pub(super) fn rms_norm_vjp_composition(eps: f32, x: &Array, w: Option<&Array>, g: &Array) -> Vec<Array> {
    let n = rms_factor(x, eps);
    let u = match w {
        Some(w) => g * f32_of(w),
        None => f32_of(g),
    };
    let c = &n * &n * (&u * x).mean_keepdims(-1);
    let gx = (&n * (&u - x * c)).astype(x.dtype());
    let mut out = vec![gx];
    if let Some(w) = w {
        out.push(sum_rows(&(g * (x * &n))).astype(w.dtype()));
    }
    out
}

/// The layer norm's cotangents with `x̂ = (x − μ)·n` and `u = g·w`:
/// `gx = n·(u − mean(u) − x̂·mean(u·x̂))`, `gw = Σ_rows g·x̂`, `gb = Σ_rows g`.
pub(super) fn layer_norm_vjp_composition(
    eps: f32,
    x: &Array,
    w: Option<&Array>,
    biased: bool,
    g: &Array,
) -> Vec<Array> {
    let centred = x - f32_of(x).mean_keepdims(-1);
    let n = (centred.square().mean_keepdims(-1) + eps).rsqrt();
    let xhat = centred * &n;
    let u = match w {
        Some(w) => g * f32_of(w),
        None => f32_of(g),
    };
    let gx = (n * (&u - u.mean_keepdims(-1) - &xhat * (&u * &xhat).mean_keepdims(-1))).astype(x.dtype());
    let mut out = vec![gx];
    if w.is_some() {
        out.push(sum_rows(&(g * &xhat)));
    }
    if biased {
        out.push(sum_rows(&f32_of(g)));
    }
    out
}

/// Sum over every axis but the last.
fn sum_rows(x: &Array) -> Array {
    let lead: Vec<i32> = (0..x.ndim() as i32 - 1).collect();
    if lead.is_empty() { x.clone() } else { x.sum(lead.as_slice()) }
}

/// RMS normalisation over the last axis, as MLX's `mx.fast.rms_norm`:
/// `(x · rsqrt(mean(x²) + eps)).astype(dtype) * weight`, statistics in `float32`, `dtype` the
/// promotion of `x`'s and the weight's.
///
/// ```
/// use nuvec::{array, fast};
/// let x = array![[3.0f32, 4.0], [1.0, 1.0]];
/// let y = fast::rms_norm(&x, &array![1.0f32, 2.0], 0.0);
/// let v: Vec<f32> = y.to_vec().unwrap();
/// let r = (12.5f32).sqrt();
/// assert!((v[0] - 3.0 / r).abs() < 1e-6 && (v[1] - 8.0 / r).abs() < 1e-6);
/// assert!(fast::rms_norm(&x, &array![1.0f32, 2.0, 3.0], 1e-5).check().is_err()); // weight size
/// ```
#[track_caller]
pub fn rms_norm<'a>(x: &Array, weight: impl Into<Option<&'a Array>>, eps: f32) -> Array {
    let weight = weight.into();
    let mut inputs = vec![x.clone()];
    inputs.extend(weight.cloned());
    record(FastOp::RmsNorm { eps, weighted: weight.is_some() }, inputs, 1).remove(0)
}

/// The residual add and RMS norm of a transformer block in one pass: `h = x + residual` and
/// `rms_norm(h, weight, eps)`, returned as `(h, y)`.
///
/// ```
/// use nuvec::{array, fast};
/// let (x, r) = (array![[1.0f32, 2.0]], array![[2.0f32, 2.0]]);
/// let (h, y) = fast::add_rms_norm(&x, &r, None, 1e-6);
/// assert_eq!(h.to_vec::<f32>().unwrap(), vec![3.0, 4.0]);
/// let want = fast::rms_norm(&h, None, 1e-6).to_vec::<f32>().unwrap();
/// assert_eq!(y.to_vec::<f32>().unwrap(), want);
/// ```
#[track_caller]
pub fn add_rms_norm<'a>(x: &Array, residual: &Array, weight: impl Into<Option<&'a Array>>, eps: f32) -> (Array, Array) {
    let weight = weight.into();
    let mut inputs = vec![x.clone(), residual.clone()];
    inputs.extend(weight.cloned());
    let mut outs = record(FastOp::AddRmsNorm { eps, weighted: weight.is_some() }, inputs, 2);
    let y = outs.pop().unwrap_or_default();
    (outs.pop().unwrap_or_default(), y)
}

/// Layer normalisation over the last axis, as MLX's `mx.fast.layer_norm`: mean and variance in
/// `float32`, `((x − μ) · rsqrt(σ² + eps)).astype(dtype) * weight + bias`.
///
/// ```
/// use nuvec::{array, fast};
/// let y = fast::layer_norm(&array![[1.0f32, 3.0]], None, &array![0.5f32, 0.5], 0.0);
/// assert_eq!(y.to_vec::<f32>().unwrap(), vec![-0.5, 1.5]);
/// ```
#[track_caller]
pub fn layer_norm<'a, 'b>(
    x: &Array,
    weight: impl Into<Option<&'a Array>>,
    bias: impl Into<Option<&'b Array>>,
    eps: f32,
) -> Array {
    let (weight, bias) = (weight.into(), bias.into());
    let mut inputs = vec![x.clone()];
    inputs.extend(weight.cloned());
    inputs.extend(bias.cloned());
    record(FastOp::LayerNorm { eps, weighted: weight.is_some(), biased: bias.is_some() }, inputs, 1).remove(0)
}
