//! Quantization in MLX's formats: `quantize`, `dequantize` and `quantized_matmul`.
//!
//! The packed weights, scales and biases are byte-for-byte those MLX produces, so checkpoints
//! quantized by MLX (mlx-community) load as they are. See [`QuantMode`] for the formats.

use super::gather::{gathered_matrices, indices_32, matrices};
use crate::array::Array;
use crate::dtype::{DType, promote_types};
use crate::fast::{FastOp, QuantMatmulParams, record};
use crate::primitive::Primitive;
use crate::storage::Spec;

use super::{invalid, propagate};

pub use crate::primitive::QuantMode;

/// The mode and the `(group_size, bits)` after MLX's defaults, or a failed array naming `op`.
#[track_caller]
fn params(
    op: &'static str,
    mode: &str,
    group_size: Option<i32>,
    bits: Option<i32>,
) -> Result<(QuantMode, i32, i32), Array> {
    // Matches rather than closures, so that the failure records the caller's location.
    let mode: QuantMode = match mode.parse() {
        Ok(m) => m,
        Err(e) => return Err(invalid(op, e)),
    };
    let (gs, b) = mode.default_params();
    let (gs, b) = (group_size.unwrap_or(gs), bits.unwrap_or(b));
    match mode.check_params(gs, b) {
        Ok(()) => Ok((mode, gs, b)),
        Err(e) => Err(invalid(op, e)),
    }
}

/// Quantizes `w` along its last axis in groups of `group_size` elements with `bits` bits per
/// element, in `mode` (`"affine"`, `"mxfp4"`, `"mxfp8"` or `"nvfp4"`; `None` takes the mode's
/// default group size and bits: 64/4, 32/4, 32/8, 16/4).
///
/// Returns `(w_q, scales, biases)`: `w_q` is `uint32` of shape `[..., K * bits / 32]`, scales
/// have shape `[..., K / group_size]` (in `w`'s dtype for affine, `uint8` codes otherwise) and
/// biases exist for affine only. `w` needs at least 2 dimensions and a floating dtype, and its
/// last dimension must be a multiple of `group_size`; otherwise the outputs are failed arrays
/// naming the argument. The outputs have no gradient.
///
/// ```
/// use nuvec::ops;
/// let w = ops::arange(0.0, 64.0, 1.0).reshape([2, 32]);
/// let (wq, scales, biases) = ops::quantize(&w, 32, 4, "affine");
/// assert_eq!(wq.shape(), &[2, 4]);
/// assert_eq!(scales.shape(), &[2, 1]);
/// let back = ops::dequantize(&wq, &scales, biases.as_ref(), 32, 4, "affine", None);
/// assert!((back - &w).abs().max(..).item::<f32>().unwrap() <= 1.0);
/// ```
#[track_caller]
pub fn quantize(
    w: &Array,
    group_size: impl Into<Option<i32>>,
    bits: impl Into<Option<i32>>,
    mode: &str,
) -> (Array, Array, Option<Array>) {
    let fail = |f: Array, biases: bool| (f.clone(), f.clone(), biases.then_some(f));
    if let Some(f) = propagate(&[w]) {
        return fail(f, mode.parse::<QuantMode>().map_or(true, QuantMode::has_biases));
    }
    let (mode, gs, bits) = match params("quantize", mode, group_size.into(), bits.into()) {
        Ok(p) => p,
        Err(f) => {
            return fail(f, mode.parse::<QuantMode>().map_or(true, QuantMode::has_biases));
        }
    };
    let mut outs =
        Array::from_op_multi("quantize", Primitive::Quantize { mode, group_size: gs, bits }, vec![w.clone()]);
    if outs.len() == 1 {
        return fail(outs.remove(0), mode.has_biases());
    }
    let biases = if mode.has_biases() { outs.pop() } else { None };
    let scales = outs.pop().unwrap_or_default();
    (outs.pop().unwrap_or_default(), scales, biases)
}

/// The weights `quantize` packed, back in floating point: `scales * q + biases` for affine,
/// `scale * value` for the FP modes.
///
/// `biases` must be given for affine and only for affine. `dtype` defaults to the dtype of the
/// scales and biases for affine and to `bfloat16` for the FP modes. Bad shapes, dtypes or
/// parameters give a failed array naming the argument.
///
/// ```
/// use nuvec::{DType, ops};
/// let w = ops::arange(-1.0, 1.0, 1.0 / 32.0).reshape([2, 32]);
/// let (wq, scales, _) = ops::quantize(&w, None, None, "mxfp8");
/// let back = ops::dequantize(&wq, &scales, None, None, None, "mxfp8", DType::F32);
/// assert_eq!(back.dtype(), DType::F32);
/// assert!((back - &w).abs().max(..).item::<f32>().unwrap() < 0.07);
/// ```
#[allow(clippy::too_many_arguments)]
#[track_caller]
pub fn dequantize(
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    group_size: impl Into<Option<i32>>,
    bits: impl Into<Option<i32>>,
    mode: &str,
    dtype: impl Into<Option<DType>>,
) -> Array {
    let mut all = vec![w, scales];
    all.extend(biases);
    if let Some(f) = propagate(&all) {
        return f;
    }
    let (mode, gs, bits) = match params("dequantize", mode, group_size.into(), bits.into()) {
        Ok(p) => p,
        Err(f) => return f,
    };
    let dtype = dtype.into();
    if let Some(d) = dtype.filter(|d| !d.is_float()) {
        return invalid("dequantize", format!("dtype must be a floating dtype, got {d}"));
    }
    let prim = |dtype| Primitive::Dequantize { mode, group_size: gs, bits, dtype };
    match (mode.has_biases(), biases) {
        (true, None) => invalid("dequantize", "biases must be given for affine quantization"),
        (false, Some(_)) => invalid("dequantize", format!("biases must be None for {mode} quantization")),
        (true, Some(b)) => {
            let t = promote_types(scales.dtype(), b.dtype());
            if !t.is_float() {
                return invalid(
                    "dequantize",
                    format!("scales and biases must be floating, got {} and {}", scales.dtype(), b.dtype()),
                );
            }
            let out = Array::from_op("dequantize", prim(t), vec![w.clone(), scales.astype(t), b.astype(t)]);
            match dtype {
                Some(d) if d != t => out.astype(d),
                _ => out,
            }
        }
        (false, None) => {
            Array::from_op("dequantize", prim(dtype.unwrap_or(DType::BF16)), vec![w.clone(), scales.clone()])
        }
    }
}

/// `x @ dequantize(w)^T` (`transpose = true`, `w` holding `[N, K]`) or `x @ dequantize(w)`
/// (`transpose = false`, `w` holding `[K, N]`) without the caller handling the dequantized
/// weight. The result has `x`'s dtype promoted with the scales' for affine, `x`'s dtype for
/// the FP modes.
///
/// With a 2-D `w` it is one primitive, which the backends run without a dequantized copy of
/// the weight (the GPU's products of up to 8 rows read each packed byte once); its
/// composition (dequantize, then a product) defines the derivatives with respect to `x` (and,
/// for affine, the scales and biases) and is the fallback. The packed weights have no
/// gradient.
///
/// ```
/// use nuvec::ops;
/// let w = ops::arange(0.0, 128.0, 1.0).reshape([2, 64]) / 64.0;
/// let (wq, s, b) = ops::quantize(&w, None, None, "affine");
/// let x = ops::ones(&[3, 64], nuvec::DType::F32);
/// let y = ops::quantized_matmul(&x, &wq, &s, b.as_ref(), true, None, None, "affine");
/// assert_eq!(y.shape(), &[3, 2]);
/// ```
#[allow(clippy::too_many_arguments)]
#[track_caller]
pub fn quantized_matmul(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    transpose: bool,
    group_size: impl Into<Option<i32>>,
    bits: impl Into<Option<i32>>,
    mode: &str,
) -> Array {
    let p = match quantized_matmul_params("quantized_matmul", x, w, scales, biases, transpose, group_size, bits, mode) {
        Ok(p) => p,
        Err(f) => return f,
    };
    let mut inputs = vec![x.clone(), w.clone(), scales.clone()];
    inputs.extend(biases.cloned());
    if w.ndim() == 2 {
        // One weight for every row of x: the backends' kernels take it from here.
        record(FastOp::QuantizedMatmul(p), inputs, 1).remove(0)
    } else {
        quantized_matmul_composition(&p, &inputs)
    }
}

/// `quantized_matmul`'s checks of its arguments (reported as `op`'s), and the product's
/// parameters; nothing is recorded.
#[allow(clippy::too_many_arguments)]
#[track_caller]
fn quantized_matmul_params(
    op: &'static str,
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    transpose: bool,
    group_size: impl Into<Option<i32>>,
    bits: impl Into<Option<i32>>,
    mode: &str,
) -> Result<QuantMatmulParams, Array> {
    let mut all = vec![x, w, scales];
    all.extend(biases);
    if let Some(f) = propagate(&all) {
        return Err(f);
    }
    let (qmode, gs, nbits) = params(op, mode, group_size.into(), bits.into())?;
    if w.dtype() != DType::U32 {
        return Err(invalid(op, format!("w must be uint32 (packed weights), got {}", w.dtype())));
    }
    if w.ndim() < 2 || x.ndim() < 1 {
        return Err(invalid(
            op,
            format!("w needs at least 2 dimensions and x at least 1, got shapes {:?} and {:?}", w.shape(), x.shape()),
        ));
    }
    let dtype = match (qmode.has_biases(), biases) {
        (true, None) => return Err(invalid(op, "biases must be given for affine quantization")),
        (false, Some(_)) => {
            return Err(invalid(op, format!("biases must be None for {qmode} quantization")));
        }
        (true, Some(b)) => promote_types(x.dtype(), promote_types(scales.dtype(), b.dtype())),
        (false, None) => x.dtype(),
    };
    if !dtype.is_float() {
        return Err(invalid(op, format!("x must be floating, got {}", x.dtype())));
    }
    // The dequantization's own checks, reported under this operation's name.
    let scales_dtype = qmode.scales_dtype(dtype);
    let mut specs = vec![w.spec(), Spec { shape: scales.shape().into(), dtype: scales.dtype() }];
    if let Some(b) = biases {
        specs[1].dtype = scales_dtype;
        specs.push(Spec { shape: b.shape().into(), dtype: scales_dtype });
    }
    let prim = Primitive::Dequantize { mode: qmode, group_size: gs, bits: nbits, dtype };
    if let Err(kind) = prim.output_specs(&specs) {
        return Err(Array::failed(op, kind));
    }
    let cols = w.shape()[w.ndim() - 1] as i64 * 32 / nbits as i64;
    let rows = w.shape()[w.ndim() - 2] as i64;
    let inner = if transpose { cols } else { rows };
    if x.shape()[x.ndim() - 1] as i64 != inner {
        return Err(invalid(
            op,
            format!(
                "the last dimension of x (shape {:?}) does not match the dequantized w ({rows}, {cols}) of shape {:?} \
                 with group_size {gs}, bits {nbits} and transpose {transpose}",
                x.shape(),
                w.shape()
            ),
        ));
    }
    Ok(QuantMatmulParams { mode: qmode, group_size: gs, bits: nbits, transpose, dtype })
}

/// `quantized_matmul` as ordinary operations: the weight dequantized in the product's dtype
/// (affine scales and biases cast to it first, as MLX's), then a product. Inputs `[x, w,
/// scales, biases?]`, checked by the operation.
pub(crate) fn quantized_matmul_composition(p: &QuantMatmulParams, inputs: &[Array]) -> Array {
    let (x, w, scales, biases) = (&inputs[0], &inputs[1], &inputs[2], inputs.get(3));
    let mode = p.mode.to_string();
    let (scales, biases) = match biases {
        Some(b) => (scales.astype(p.dtype), Some(b.astype(p.dtype))),
        None => (scales.clone(), None),
    };
    let deq = dequantize(w, &scales, biases.as_ref(), p.group_size, p.bits, &mode, p.dtype);
    let wt = if p.transpose { deq.swapaxes(-1, -2) } else { deq };
    x.astype(p.dtype).matmul(&wt)
}

/// [`quantized_matmul`] with the matrices picked by index (mixture-of-experts routing), as
/// MLX's `gather_qmm`: output `i` is `x[lhs_indices[i]] @ dequantize(w[rhs_indices[i]])ᵀ`
/// (`w` holding `[E, N, K]` packed, `transpose = true`; or `[E, K, N]` without), an index
/// picking one matrix of its operand's flattened batch axes (`None`: every matrix in turn).
/// The index arrays broadcast; the output shape is their shape followed by `[M, N]`.
///
/// Only the experts an index names are read and dequantized. Bad indices or shapes give a
/// failed array naming the argument.
///
/// ```
/// use nuvec::{array, ops};
/// let experts = ops::arange(0.0, 3.0 * 4.0 * 64.0, 1.0).reshape([3, 4, 64]) / 768.0;
/// let (wq, s, b) = ops::quantize(&experts, 64, 8, "affine");
/// let x = ops::ones(&[2, 1, 64], nuvec::DType::F32);
/// let idx = array![2i32, 0];
/// let y = ops::gather_qmm(&x, &wq, &s, b.as_ref(), None, Some(&idx), true, 64, 8, "affine", false);
/// assert_eq!(y.shape(), &[2, 1, 4]);
/// ```
#[allow(clippy::too_many_arguments)]
#[track_caller]
pub fn gather_qmm(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    lhs_indices: Option<&Array>,
    rhs_indices: Option<&Array>,
    transpose: bool,
    group_size: impl Into<Option<i32>>,
    bits: impl Into<Option<i32>>,
    mode: &str,
    sorted_indices: bool,
) -> Array {
    const OP: &str = "gather_qmm";
    // The kernels find runs of equal indices themselves: sorting only makes them longer.
    let _ = sorted_indices;
    let mut all = vec![x, w, scales];
    all.extend(biases);
    all.extend(lhs_indices);
    all.extend(rhs_indices);
    if let Some(f) = propagate(&all) {
        return f;
    }
    if x.ndim() < 2 || w.ndim() < 2 || scales.ndim() != w.ndim() || biases.is_some_and(|b| b.ndim() != w.ndim()) {
        return invalid(
            OP,
            format!(
                "x and w need at least 2 dimensions and the scales and biases w's, got shapes {:?}, {:?} and {:?}",
                x.shape(),
                w.shape(),
                scales.shape()
            ),
        );
    }
    let (li, ri, shape) = match gathered_matrices(OP, x, w, lhs_indices, rhs_indices) {
        Ok(r) => r,
        Err(f) => return f,
    };
    let (group_size, bits) = (group_size.into(), bits.into());
    let p = match quantized_matmul_params(OP, x, w, scales, biases, transpose, group_size, bits, mode) {
        Ok(p) => p,
        Err(f) => return f,
    };
    let y = match (indices_32(&li), indices_32(&ri)) {
        // One primitive a backend may run reading each picked expert in place.
        (Some(l), Some(r)) => {
            let mut inputs = vec![matrices(x), matrices(w), matrices(scales)];
            inputs.extend(biases.map(matrices));
            inputs.extend([l, r]);
            record(FastOp::GatherQmm(p), inputs, 1).remove(0)
        }
        _ => {
            let pick = |a: &Array| matrices(a).take(&ri, 0);
            let b = biases.map(pick);
            quantized_matmul(
                &matrices(x).take(&li, 0),
                &pick(w),
                &pick(scales),
                b.as_ref(),
                transpose,
                group_size,
                bits,
                mode,
            )
        }
    };
    let mut oshape = shape.to_vec();
    oshape.extend_from_slice(&y.shape()[y.ndim().saturating_sub(2)..]);
    y.reshape(oshape)
}
