//! Quantized weights in MLX's formats: the modes, the shape rules of `Quantize` and
//! `Dequantize`, and their derivative and batching rules.
//!
//! Every mode packs the quantized values of a row as one little-endian bit stream of `u32`
//! words: element `i` occupies bits `i * bits .. (i + 1) * bits` (so 3-, 5- and 6-bit values
//! cross word boundaries, exactly as MLX stores them). Scales (and, for `affine`, biases) hold
//! one value per group of `group_size` consecutive elements of the last axis.

use std::fmt;
use std::str::FromStr;

use crate::array::Array;
use crate::dtype::DType;
use crate::error::OpErrorKind;
use crate::primitive::Primitive;
use crate::shape::Shape;
use crate::storage::Spec;

/// A quantization format (MLX's `mode` argument).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum QuantMode {
    /// `w ≈ scale * q + bias` with unsigned `q` of 2–8 bits; scales and biases in the weight's
    /// dtype.
    #[default]
    Affine,
    /// FP4 (E2M1) values with one power-of-two (E8M0) scale per 32 elements.
    Mxfp4,
    /// FP8 (E4M3) values with one power-of-two (E8M0) scale per 32 elements.
    Mxfp8,
    /// FP4 (E2M1) values with one FP8 (E4M3) scale per 16 elements.
    Nvfp4,
}

impl QuantMode {
    /// MLX's name of the mode.
    pub fn name(self) -> &'static str {
        match self {
            QuantMode::Affine => "affine",
            QuantMode::Mxfp4 => "mxfp4",
            QuantMode::Mxfp8 => "mxfp8",
            QuantMode::Nvfp4 => "nvfp4",
        }
    }

    /// The default `(group_size, bits)` of the mode.
    pub fn default_params(self) -> (i32, i32) {
        match self {
            QuantMode::Affine => (64, 4),
            QuantMode::Mxfp4 => (32, 4),
            QuantMode::Mxfp8 => (32, 8),
            QuantMode::Nvfp4 => (16, 4),
        }
    }

    /// Whether the mode stores biases (only `affine` does).
    pub fn has_biases(self) -> bool {
        self == QuantMode::Affine
    }

    /// The dtype of the scales: the weight's dtype for `affine`, `u8` (an FP8 or E8M0 code)
    /// otherwise.
    pub fn scales_dtype(self, weight: DType) -> DType {
        if self == QuantMode::Affine { weight } else { DType::U8 }
    }

    /// What is wrong with `group_size` and `bits` for this mode, naming the argument.
    pub fn check_params(self, group_size: i32, bits: i32) -> Result<(), String> {
        match self {
            QuantMode::Affine => {
                if ![32, 64, 128].contains(&group_size) {
                    return Err(format!(
                        "group_size {group_size} is not supported for affine quantization (use 32, 64 or 128)"
                    ));
                }
                if ![2, 3, 4, 5, 6, 8].contains(&bits) {
                    return Err(format!(
                        "bits {bits} is not supported for affine quantization (use 2, 3, 4, 5, 6 or 8)"
                    ));
                }
            }
            mode => {
                let (gs, b) = mode.default_params();
                if group_size != gs {
                    return Err(format!(
                        "group_size {group_size} is not supported: {} quantization requires {gs}",
                        mode.name()
                    ));
                }
                if bits != b {
                    return Err(format!("bits {bits} is not supported: {} quantization requires {b}", mode.name()));
                }
            }
        }
        Ok(())
    }
}

impl fmt::Display for QuantMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for QuantMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "affine" => QuantMode::Affine,
            "mxfp4" => QuantMode::Mxfp4,
            "mxfp8" => QuantMode::Mxfp8,
            "nvfp4" => QuantMode::Nvfp4,
            _ => {
                return Err(format!("mode {s:?} is not one of \"affine\", \"mxfp4\", \"mxfp8\", \"nvfp4\""));
            }
        })
    }
}

fn bad(msg: String) -> OpErrorKind {
    OpErrorKind::InvalidArgument(msg)
}

/// Output specs of `Quantize`: packed weights, scales and (affine) biases.
pub(crate) fn quantize_specs(
    mode: QuantMode,
    group_size: i32,
    bits: i32,
    inputs: &[Spec],
) -> Result<Vec<Spec>, OpErrorKind> {
    let [w] = inputs else {
        return Err(bad(format!("quantize takes 1 input, got {}", inputs.len())));
    };
    mode.check_params(group_size, bits).map_err(bad)?;
    if !w.dtype.is_float() {
        return Err(OpErrorKind::UnsupportedDType(w.dtype));
    }
    let k = match w.shape.last() {
        Some(&k) if w.shape.len() >= 2 => k,
        _ => {
            return Err(bad(format!("w must have at least 2 dimensions, got shape {:?}", &w.shape[..])));
        }
    };
    if k % group_size != 0 {
        return Err(bad(format!(
            "the last dimension of w ({k}, shape {:?}) is not divisible by group_size {group_size}",
            &w.shape[..]
        )));
    }
    let with_last = |d: i64| -> Shape {
        let mut s = w.shape.clone();
        *s.last_mut().unwrap() = d as i32;
        s
    };
    let packed = with_last(k as i64 * bits as i64 / 32);
    let groups = with_last((k / group_size) as i64);
    let mut out = vec![
        Spec { shape: packed, dtype: DType::U32 },
        Spec { shape: groups.clone(), dtype: mode.scales_dtype(w.dtype) },
    ];
    if mode.has_biases() {
        out.push(Spec { shape: groups, dtype: w.dtype });
    }
    Ok(out)
}

/// Output spec of `Dequantize`. For `affine` the output dtype is the scales' dtype (the
/// operation casts afterwards, as MLX does).
pub(crate) fn dequantize_specs(
    mode: QuantMode,
    group_size: i32,
    bits: i32,
    dtype: DType,
    inputs: &[Spec],
) -> Result<Vec<Spec>, OpErrorKind> {
    let n = if mode.has_biases() { 3 } else { 2 };
    if inputs.len() != n {
        return Err(bad(format!("dequantize in {mode} mode takes {n} inputs, got {}", inputs.len())));
    }
    mode.check_params(group_size, bits).map_err(bad)?;
    let (wq, scales) = (&inputs[0], &inputs[1]);
    if wq.dtype != DType::U32 {
        return Err(bad(format!("w must be uint32 (packed weights), got {}", wq.dtype)));
    }
    if wq.shape.len() < 2 {
        return Err(bad(format!("w must have at least 2 dimensions, got shape {:?}", &wq.shape[..])));
    }
    if scales.dtype != mode.scales_dtype(dtype) {
        return Err(bad(format!(
            "scales must be {} for {mode} quantization, got {}",
            mode.scales_dtype(dtype),
            scales.dtype
        )));
    }
    if !dtype.is_float() {
        return Err(bad(format!("dtype must be a floating dtype, got {dtype}")));
    }
    let rank = wq.shape.len();
    let same_lead = scales.shape.len() == rank && scales.shape[..rank - 1] == wq.shape[..rank - 1];
    let k = wq.shape[rank - 1] as i64 * 32 / bits as i64;
    if !same_lead
        || k != scales.shape[rank - 1] as i64 * group_size as i64
        || (wq.shape[rank - 1] as i64 * 32) % bits as i64 != 0
    {
        return Err(bad(format!(
            "scales of shape {:?} do not match w of shape {:?} with group_size {group_size} and bits {bits}",
            &scales.shape[..],
            &wq.shape[..]
        )));
    }
    if k > i32::MAX as i64 {
        return Err(OpErrorKind::InvalidShape(vec![k]));
    }
    if mode.has_biases() {
        let b = &inputs[2];
        if b.shape != scales.shape {
            return Err(bad(format!(
                "biases of shape {:?} do not match scales of shape {:?}",
                &b.shape[..],
                &scales.shape[..]
            )));
        }
        if b.dtype != scales.dtype {
            return Err(OpErrorKind::DTypeMismatch { lhs: scales.dtype, rhs: b.dtype });
        }
    }
    let mut shape = wq.shape.clone();
    shape[rank - 1] = k as i32;
    Ok(vec![Spec { shape, dtype }])
}

/// `g` summed over each quantization group of its last axis.
fn group_sum(g: &Array, group_size: i32) -> Array {
    let mut s: Vec<i32> = g.shape()[..g.ndim() - 1].to_vec();
    s.extend([-1, group_size]);
    g.reshape(s).sum(-1)
}

/// Cotangents of `Dequantize`'s inputs: none for the packed integers; for `affine`,
/// `d scales = Σ_group g·q` and `d biases = Σ_group g`. The FP modes' scales are integer
/// codes and get none (MLX has no gradient there either).
pub(crate) fn dequantize_vjp(p: &Primitive, x: &[Array], g: &Array) -> Vec<Option<Array>> {
    let Primitive::Dequantize { mode: QuantMode::Affine, group_size, .. } = p else {
        return vec![None; x.len()];
    };
    let g = g.astype(x[1].dtype());
    // The integer levels q, recomputed as the dequantization with unit scales and zero biases.
    let q = Array::from_op(p.name(), p.clone(), vec![x[0].clone(), x[1].ones_like(), x[2].zeros_like()]);
    vec![None, Some(group_sum(&(&g * &q), *group_size)), Some(group_sum(&g, *group_size))]
}

/// Tangent of `Dequantize`: linear in scales and biases.
pub(crate) fn dequantize_jvp(p: &Primitive, x: &[Array], t: &[Option<Array>]) -> Vec<Option<Array>> {
    if !matches!(p, Primitive::Dequantize { mode: QuantMode::Affine, .. }) || (t[1].is_none() && t[2].is_none()) {
        return vec![None];
    }
    let ts = t[1].clone().unwrap_or_else(|| x[1].zeros_like());
    let tb = t[2].clone().unwrap_or_else(|| x[2].zeros_like());
    vec![Some(Array::from_op(p.name(), p.clone(), vec![x[0].clone(), ts, tb]))]
}

/// Both primitives act on the last axis only, so batching is the same primitive on inputs
/// whose unmapped members are broadcast along the batch axis.
pub(crate) fn quantize_vmap(p: &Primitive, x: &[Array], mapped: &[bool]) -> Vec<(Array, bool)> {
    let b = super::rules::batch_size(x, mapped);
    let full: Vec<Array> = x.iter().zip(mapped).map(|(a, &m)| super::rules::batched(a, m, b)).collect();
    Array::from_op_multi(p.name(), p.clone(), full).into_iter().map(|a| (a, true)).collect()
}
