//! RMS and layer normalisation over the last axis, the residual-add + RMS norm pair, and the
//! primitives of their derivatives.
//!
//! Semantics are MLX's: statistics in `float32`, the normalised row cast to the output dtype
//! (`x`'s promoted with the weight's) before the weight multiplies it and the bias is added.

use crate::array::Array;
use crate::dtype::{DType, promote_types};
use crate::error::OpErrorKind;
use crate::primitive::Primitive;
use crate::storage::Spec;

use super::FastOp;

fn invalid(msg: String) -> OpErrorKind {
    OpErrorKind::InvalidArgument(msg)
}

/// Checks `x` (floating, at least 1-D) and a per-feature parameter (1-D of `x`'s last size),
/// returning the output dtype.
fn check_row_param(op: &str, x: &Spec, param: Option<(&str, &Spec)>) -> Result<DType, OpErrorKind> {
    let Some(&last) = x.shape.last() else {
        return Err(invalid(format!("{op}: x must have at least one axis, got a scalar")));
    };
    let mut dtype = x.dtype;
    if let Some((name, p)) = param {
        if p.shape.as_slice() != [last] {
            return Err(invalid(format!(
                "{op}: {name} must have shape [{last}] (x's last axis), got {:?}",
                p.shape.as_slice()
            )));
        }
        dtype = promote_types(dtype, p.dtype);
    }
    if !dtype.is_float() {
        return Err(invalid(format!("{op}: needs floating inputs, got {dtype:?}")));
    }
    Ok(dtype)
}

pub(super) fn rms_norm_specs(weighted: bool, inputs: &[Spec]) -> Result<Vec<Spec>, OpErrorKind> {
    let (x, w) = match (inputs, weighted) {
        ([x], false) => (x, None),
        ([x, w], true) => (x, Some(("weight", w))),
        _ => return Err(invalid("rms_norm: wrong number of inputs".into())),
    };
    let dtype = check_row_param("rms_norm", x, w)?;
    Ok(vec![Spec { shape: x.shape.clone(), dtype }])
}

pub(super) fn add_rms_norm_specs(weighted: bool, inputs: &[Spec]) -> Result<Vec<Spec>, OpErrorKind> {
    let (x, r, w) = match (inputs, weighted) {
        ([x, r], false) => (x, r, None),
        ([x, r, w], true) => (x, r, Some(("weight", w))),
        _ => return Err(invalid("add_rms_norm: wrong number of inputs".into())),
    };
    if x.shape != r.shape {
        return Err(invalid(format!(
            "add_rms_norm: residual must have x's shape {:?}, got {:?}",
            x.shape.as_slice(),
            r.shape.as_slice()
        )));
    }
    let h = Spec { shape: x.shape.clone(), dtype: promote_types(x.dtype, r.dtype) };
    let dtype = check_row_param("add_rms_norm", &h, w)?;
    Ok(vec![h.clone(), Spec { shape: x.shape.clone(), dtype }])
}

pub(super) fn layer_norm_specs(weighted: bool, biased: bool, inputs: &[Spec]) -> Result<Vec<Spec>, OpErrorKind> {
    let n = 1 + weighted as usize + biased as usize;
    if inputs.len() != n {
        return Err(invalid("layer_norm: wrong number of inputs".into()));
    }
    let x = &inputs[0];
    let mut dtype = check_row_param("layer_norm", x, None)?;
    if weighted {
        dtype = promote_types(dtype, check_row_param("layer_norm", x, Some(("weight", &inputs[1])))?);
    }
    if biased {
        dtype = promote_types(dtype, check_row_param("layer_norm", x, Some(("bias", &inputs[n - 1])))?);
    }
    Ok(vec![Spec { shape: x.shape.clone(), dtype }])
}

/// `[gx, gw?]` of the RMS norm from inputs `[x, w?, g]`; `gw` sums in `float32` (`float64` for
/// `float64` rows) and is rounded once to the weight's dtype (no cast after it).
pub(super) fn rms_norm_vjp_specs(weighted: bool, inputs: &[Spec]) -> Result<Vec<Spec>, OpErrorKind> {
    let mut out = layer_norm_vjp_specs(weighted, false, inputs)?;
    if let (Some(gw), Some(w)) = (out.get_mut(1), inputs.get(1).filter(|_| weighted)) {
        gw.dtype = w.dtype;
    }
    Ok(out)
}

/// `[gx, gw?, gb?]` of the layer norm from inputs `[x, w?, g]`; `gw` and `gb` in `float32`
/// (`float64` for `float64` rows), which the caller casts to the parameters' dtypes.
pub(super) fn layer_norm_vjp_specs(weighted: bool, biased: bool, inputs: &[Spec]) -> Result<Vec<Spec>, OpErrorKind> {
    let x = &inputs[0];
    let acc = if x.dtype == DType::F64 { DType::F64 } else { DType::F32 };
    let row = Spec { shape: x.shape.last().map(|&d| [d].into_iter().collect()).unwrap_or_default(), dtype: acc };
    let mut out = vec![x.clone()];
    out.extend(std::iter::repeat_n(row, weighted as usize + biased as usize));
    Ok(out)
}

fn f32_of(x: &Array) -> Array {
    if x.dtype() == DType::F64 { x.clone() } else { x.astype(DType::F32) }
}

/// `x * rsqrt(mean(x²) + eps)` in `float32` (`float64` for `float64` inputs), and the factor.
fn rms_normalise(x: &Array, eps: f32) -> (Array, Array) {
    let xf = f32_of(x);
    let n = (xf.square().mean_keepdims(-1) + eps).rsqrt();
    (&xf * &n, n)
}

pub(super) fn rms_norm_composition(eps: f32, x: &Array, w: Option<&Array>) -> Array {
    let dtype = w.map_or(x.dtype(), |w| promote_types(x.dtype(), w.dtype()));
    let y = rms_normalise(x, eps).0.astype(dtype);
    match w {
        Some(w) => y * w,
        None => y,
    }
}

pub(super) fn layer_norm_composition(eps: f32, x: &Array, w: Option<&Array>, b: Option<&Array>) -> Array {
    let dtype = [w, b].into_iter().flatten().fold(x.dtype(), |d, p| promote_types(d, p.dtype()));
    let xf = f32_of(x);
    let centred = &xf - xf.mean_keepdims(-1);
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
/// `gx = n·u − x·n³·mean(u·x)`, `gw = Σ_rows g·x·n`.
pub(super) fn rms_norm_vjp_composition(eps: f32, x: &Array, w: Option<&Array>, g: &Array) -> Vec<Array> {
    let (xhat, n) = rms_normalise(x, eps);
    let gf = f32_of(g);
    let u = match w {
        Some(w) => &gf * f32_of(w),
        None => gf.clone(),
    };
    let xf = f32_of(x);
    let gx = (&u * &n - &xf * (&n * &n * &n) * (&u * &xf).mean_keepdims(-1)).astype(x.dtype());
    let mut out = vec![gx];
    if let Some(w) = w {
        out.push(sum_rows(&(gf * xhat)).astype(w.dtype()));
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
    let xf = f32_of(x);
    let centred = &xf - xf.mean_keepdims(-1);
    let n = (centred.square().mean_keepdims(-1) + eps).rsqrt();
    let xhat = centred * &n;
    let gf = f32_of(g);
    let u = match w {
        Some(w) => &gf * f32_of(w),
        None => gf.clone(),
    };
    let gx = (n * (&u - u.mean_keepdims(-1) - &xhat * (&u * &xhat).mean_keepdims(-1))).astype(x.dtype());
    let mut out = vec![gx];
    if w.is_some() {
        out.push(sum_rows(&(&gf * &xhat)));
    }
    if biased {
        out.push(sum_rows(&gf));
    }
    out
}

/// Sum over every axis but the last.
fn sum_rows(x: &Array) -> Array {
    let lead: Vec<i32> = (0..x.ndim() as i32 - 1).collect();
    if lead.is_empty() { x.clone() } else { x.sum(lead.as_slice()) }
}

/// Records `op` and returns its outputs, or `n` copies of the failure.
#[track_caller]
pub(super) fn record(op: FastOp, inputs: Vec<Array>, n: usize) -> Vec<Array> {
    let outs = Array::from_op_multi(op.name(), Primitive::Fast(op), inputs);
    if outs.len() == n { outs } else { vec![outs[0].clone(); n] }
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
