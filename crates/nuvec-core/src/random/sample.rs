//! Distributions, each a composition of ordinary operations on random bits, step for step as
//! MLX composes them so that the same key gives the same numbers.

use crate::array::{Array, ScalarOrArray};
use crate::dtype::{DType, Scalar, bf16, f16, promote_types};
use crate::error::OpErrorKind;
use crate::ops::{self, ScanOptions};
use crate::shape::{IntoShape, Shape, broadcast_shapes};

use super::key::{bits, bits_from, checked_key};

macro_rules! tri {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(f) => return f,
        }
    };
}

#[track_caller]
fn invalid(op: &'static str, msg: String) -> Array {
    Array::failed(op, OpErrorKind::InvalidArgument(msg))
}

#[track_caller]
fn shape_of(op: &'static str, shape: impl IntoShape) -> Result<Shape, Array> {
    let shape = shape.into_shape().map_err(|bad| Array::failed(op, OpErrorKind::InvalidShape(bad)))?;
    crate::shape::check_shape(&shape).map_err(|k| Array::failed(op, k))?;
    Ok(shape)
}

/// An operand as an array, converted the way MLX's Python binding does (a weak scalar takes
/// its default dtype first), then cast to `dtype`.
fn as_dtype(x: ScalarOrArray, dtype: DType) -> Array {
    x.into_array().astype(dtype)
}

/// Whether `x` is the weak scalar `v` (so the step using it can be left out, as MLX does when
/// no `loc`/`scale` is given).
fn is_scalar(x: &ScalarOrArray, v: f64) -> bool {
    match x {
        ScalarOrArray::Scalar(Scalar::Float(f)) => *f == v,
        ScalarOrArray::Scalar(Scalar::Int(i)) => *i as f64 == v,
        ScalarOrArray::Scalar(Scalar::UInt(u)) => *u as f64 == v,
        _ => false,
    }
}

/// The largest value below one in `dtype`, as an `f32` (samples stay below `high`).
fn below_one(dtype: DType) -> Option<f32> {
    match dtype {
        DType::F32 => Some(f32::from_bits(1.0f32.to_bits() - 1)),
        DType::F16 => Some(f16::from_bits(f16::ONE.to_bits() - 1).to_f32()),
        DType::BF16 => Some(bf16::from_bits(bf16::ONE.to_bits() - 1).to_f32()),
        _ => None,
    }
}

/// `uniform` on a checked key.
#[track_caller]
fn uniform_from(op: &'static str, lo: Array, hi: Array, shape: &Shape, dtype: DType, key: &Array) -> Array {
    let Some(upper) = below_one(dtype) else {
        return invalid(op, format!("uniform samples need float16, bfloat16 or float32, got {dtype}"));
    };
    if let Some(f) = ops::propagate(&[&lo, &hi]) {
        return f;
    }
    let range = &hi - &lo;
    match broadcast_shapes(shape, range.shape()) {
        Ok(s) if s == *shape => {}
        _ => {
            return invalid(
                op,
                format!("cannot draw samples of shape {:?} for bounds of shape {:?}", shape.to_vec(), range.shape()),
            );
        }
    }
    // bits / 2^32 in float32, kept below one, then scaled into [low, high) in `dtype`.
    let maxval = Array::scalar(u32::MAX as f32, DType::F32);
    let unit = bits_from(op, shape, 4, key).divide(&maxval).minimum(Array::scalar(upper, DType::F32)).astype(dtype);
    range * unit + lo
}

/// Samples uniform in `[low, high)` of `shape` and `dtype` (float16, bfloat16 or float32).
/// `low` and `high` are scalars or arrays that broadcast to `shape`.
///
/// ```
/// use nuvec::{DType, random};
/// let k = random::key(0);
/// let u: Vec<f32> = random::uniform(-1.0, 1.0, [1000], DType::F32, Some(&k)).to_vec().unwrap();
/// assert!(u.iter().all(|v| (-1.0..1.0).contains(v)));
/// assert!(random::uniform(0.0, 1.0, [2], DType::I32, Some(&k)).is_failed());
/// ```
#[track_caller]
pub fn uniform(
    low: impl Into<ScalarOrArray>,
    high: impl Into<ScalarOrArray>,
    shape: impl IntoShape,
    dtype: DType,
    key: Option<&Array>,
) -> Array {
    let shape = tri!(shape_of("uniform", shape));
    if below_one(dtype).is_none() {
        return invalid("uniform", format!("dtype must be float16, bfloat16 or float32, got {dtype}"));
    }
    let key = tri!(checked_key("uniform", key));
    uniform_from("uniform", as_dtype(low.into(), dtype), as_dtype(high.into(), dtype), &shape, dtype, &key)
}

/// Standard uniform samples in `[0, 1)` on a checked key.
#[track_caller]
fn unit_from(op: &'static str, shape: &Shape, dtype: DType, key: &Array) -> Array {
    uniform_from(op, Array::scalar(0.0, dtype), Array::scalar(1.0, dtype), shape, dtype, key)
}

/// Normal samples of `shape` with mean `loc` and standard deviation `scale` (scalars or arrays
/// that broadcast to `shape`), in a floating dtype or `complex64` (whose real and imaginary
/// parts each have variance 1/2 before scaling). Drawn as MLX does: `sqrt(2) * erfinv(u)` with
/// `u` uniform in `(-1, 1)`.
///
/// ```
/// use nuvec::{DType, random};
/// let x = random::normal([4096], DType::F32, 2.0, 0.5, Some(&random::key(1)));
/// let mean: f32 = x.mean(..).item().unwrap();
/// assert!((mean - 2.0).abs() < 0.05);
/// ```
#[track_caller]
pub fn normal(
    shape: impl IntoShape,
    dtype: DType,
    loc: impl Into<ScalarOrArray>,
    scale: impl Into<ScalarOrArray>,
    key: Option<&Array>,
) -> Array {
    let op = "normal";
    let mut shape = tri!(shape_of(op, shape));
    let (loc, scale) = (loc.into(), scale.into());
    let complex = dtype == DType::Complex64;
    if !dtype.is_float() && !complex {
        return invalid(op, format!("dtype must be a floating type or complex64, got {dtype}"));
    }
    let key = tri!(checked_key(op, key));
    let low = Array::scalar(f32::from_bits((-1.0f32).to_bits() - 1), DType::F32);
    let high = Array::scalar(1.0f32, DType::F32);
    if complex {
        shape.push(2);
        let parts = uniform_from(op, low, high, &shape, DType::F32, &key).erfinv();
        let mut z = parts.view(DType::Complex64).squeeze(-1);
        if !is_scalar(&scale, 1.0) {
            z = as_dtype(scale, DType::Complex64) * z;
        }
        if !is_scalar(&loc, 0.0) {
            z = as_dtype(loc, DType::Complex64) + z;
        }
        return z;
    }
    let samples = uniform_from(op, low, high, &shape, DType::F32, &key);
    let mut applied = Array::scalar(std::f64::consts::SQRT_2, dtype);
    if !is_scalar(&scale, 1.0) {
        applied = applied * as_dtype(scale, dtype);
    }
    let mut out = applied * samples.erfinv().astype(dtype);
    if !is_scalar(&loc, 0.0) {
        out = as_dtype(loc, dtype) + out;
    }
    out
}

/// Integers uniform in `[low, high)` of `shape` and an integer (or bool) `dtype`.
///
/// ```
/// use nuvec::{DType, random};
/// let r: Vec<i32> = random::randint(-3, 4, [500], DType::I32, Some(&random::key(2))).to_vec().unwrap();
/// assert!(r.iter().all(|v| (-3..4).contains(v)));
/// ```
#[track_caller]
pub fn randint(
    low: impl Into<ScalarOrArray>,
    high: impl Into<ScalarOrArray>,
    shape: impl IntoShape,
    dtype: DType,
    key: Option<&Array>,
) -> Array {
    let op = "randint";
    let shape = tri!(shape_of(op, shape));
    if dtype.is_inexact() {
        return invalid(op, format!("dtype must be an integer type or bool, got {dtype}"));
    }
    let (low, high) = (low.into().into_array(), high.into().into_array());
    if let Some(f) = ops::propagate(&[&low, &high]) {
        return f;
    }
    let key = tri!(checked_key(op, key));
    let u = uniform_from(op, low.astype(DType::F32), high.astype(DType::F32), &shape, DType::F32, &key);
    // Floor (a cast truncates toward zero), then clamp: the bounds may not be representable in
    // float32, so the samples could reach past them.
    let hi = (&high - Array::scalar(1, high.dtype())).astype(dtype);
    u.floor().astype(dtype).minimum(hi).maximum(low.astype(dtype))
}

/// Booleans that are true with probability `p` (a floating scalar or array), of `shape` (the
/// shape of `p` when `None`).
///
/// ```
/// use nuvec::random;
/// let b = random::bernoulli(0.25, Some(&[10000]), Some(&random::key(3)));
/// let frac: f32 = b.astype(nuvec::DType::F32).mean(..).item().unwrap();
/// assert!((frac - 0.25).abs() < 0.02);
/// ```
#[track_caller]
pub fn bernoulli(p: impl Into<ScalarOrArray>, shape: Option<&[i32]>, key: Option<&Array>) -> Array {
    let op = "bernoulli";
    let p = p.into().into_array();
    if let Some(f) = ops::propagate(&[&p]) {
        return f;
    }
    if !p.dtype().is_float() {
        return invalid(op, format!("p must have a floating dtype, got {}", p.dtype()));
    }
    let shape: Shape = match shape {
        Some(s) => tri!(shape_of(op, s)),
        None => p.shape().into(),
    };
    match broadcast_shapes(&shape, p.shape()) {
        Ok(s) if s == shape => {}
        _ => {
            return invalid(op, format!("p of shape {:?} does not broadcast to shape {:?}", p.shape(), shape.to_vec()));
        }
    }
    let key = tri!(checked_key(op, key));
    // p on the scale [0, just above u32::MAX], so p >= 1 always gives true and p <= 0 false.
    let upper = Array::scalar(f32::from_bits((u32::MAX as f32).to_bits() + 1), DType::F32);
    bits_from(op, &shape, 4, &key).less(p * upper)
}

/// Normal samples truncated to `[lower, upper]` (scalars or arrays), of `shape` (their
/// broadcast shape when `None`) and a floating `dtype` (float16, bfloat16 or float32).
///
/// ```
/// use nuvec::{DType, random};
/// let x: Vec<f32> = random::truncated_normal(-0.5, 1.0, Some(&[256]), DType::F32, Some(&random::key(4)))
///     .to_vec()
///     .unwrap();
/// assert!(x.iter().all(|v| (-0.5..=1.0).contains(v)));
/// ```
#[track_caller]
pub fn truncated_normal(
    lower: impl Into<ScalarOrArray>,
    upper: impl Into<ScalarOrArray>,
    shape: Option<&[i32]>,
    dtype: DType,
    key: Option<&Array>,
) -> Array {
    let op = "truncated_normal";
    if below_one(dtype).is_none() {
        return invalid(op, format!("dtype must be float16, bfloat16 or float32, got {dtype}"));
    }
    let (lower, upper) = (as_dtype(lower.into(), dtype), as_dtype(upper.into(), dtype));
    if let Some(f) = ops::propagate(&[&lower, &upper]) {
        return f;
    }
    let shape: Shape = match shape {
        Some(s) => tri!(shape_of(op, s)),
        None => match broadcast_shapes(lower.shape(), upper.shape()) {
            Ok(s) => s,
            Err(k) => return Array::failed(op, k),
        },
    };
    let key = tri!(checked_key(op, key));
    let sqrt2 = Array::scalar(std::f64::consts::SQRT_2, dtype);
    let a = (&lower / &sqrt2).erf();
    let b = (&upper / &sqrt2).erf();
    let out = &sqrt2 * uniform_from(op, a, b, &shape, dtype, &key).erfinv();
    upper.minimum(out).maximum(lower)
}

/// Samples of the standard Gumbel distribution, `-log(-log(u))` with `u` uniform in `[0, 1)`.
///
/// ```
/// use nuvec::{DType, random};
/// let g = random::gumbel([8], DType::F32, Some(&random::key(5)));
/// assert_eq!(g.shape(), &[8]);
/// ```
#[track_caller]
pub fn gumbel(shape: impl IntoShape, dtype: DType, key: Option<&Array>) -> Array {
    let op = "gumbel";
    let shape = tri!(shape_of(op, shape));
    if below_one(dtype).is_none() {
        return invalid(op, format!("dtype must be float16, bfloat16 or float32, got {dtype}"));
    }
    let key = tri!(checked_key(op, key));
    gumbel_from(op, &shape, dtype, &key)
}

#[track_caller]
fn gumbel_from(op: &'static str, shape: &Shape, dtype: DType, key: &Array) -> Array {
    unit_from(op, shape, dtype, key).log().negative().log().negative()
}

/// Laplace samples with location `loc` and scale `scale`, by the inverse CDF of a uniform
/// sample in `(-1, 1)` (as MLX).
///
/// ```
/// use nuvec::{DType, random};
/// let x = random::laplace([16], DType::F32, 0.0, 1.0, Some(&random::key(6)));
/// assert_eq!(x.shape(), &[16]);
/// ```
#[track_caller]
pub fn laplace(shape: impl IntoShape, dtype: DType, loc: f32, scale: f32, key: Option<&Array>) -> Array {
    let op = "laplace";
    let shape = tri!(shape_of(op, shape));
    if !dtype.is_float() {
        return invalid(op, format!("dtype must be a floating type, got {dtype}"));
    }
    let key = tri!(checked_key(op, key));
    let low = Array::scalar(f32::from_bits((-1.0f32).to_bits() - 1), DType::F32);
    let u = uniform_from(op, low, Array::scalar(1.0f32, DType::F32), &shape, DType::F32, &key);
    let mut out = (u.sign() * (Array::scalar(-1.0, dtype) * u.abs()).log1p()).astype(dtype);
    if scale != 1.0 {
        out = Array::scalar(scale, dtype) * out;
    }
    if loc != 0.0 {
        out = Array::scalar(loc, dtype) + out;
    }
    out
}

/// What `categorical` draws: one sample per row of the logits, samples of a given shape, or a
/// number of samples per row.
enum Draw {
    PerRow,
    Shape(Shape),
    PerRowN(i32),
}

/// Indices sampled from the categorical distributions whose unnormalised log-probabilities
/// lie along `axis` of `logits`: one per distribution, as `uint32`.
///
/// ```
/// use nuvec::{array, random};
/// let logits = array![[0.0, 20.0, 0.0], [20.0, 0.0, 0.0]];
/// let s: Vec<u32> = random::categorical(&logits, -1, Some(&random::key(7))).to_vec().unwrap();
/// assert_eq!(s, vec![1, 0]);
/// ```
#[track_caller]
pub fn categorical(logits: &Array, axis: i32, key: Option<&Array>) -> Array {
    categorical_draw(logits, axis, Draw::PerRow, key)
}

/// [`categorical`] drawing samples of `shape`, which must broadcast with the logits' shape
/// without `axis` (so `shape` may add leading axes of independent samples).
#[track_caller]
pub fn categorical_shape(logits: &Array, axis: i32, shape: &[i32], key: Option<&Array>) -> Array {
    let shape = tri!(shape_of("categorical", shape));
    categorical_draw(logits, axis, Draw::Shape(shape), key)
}

/// [`categorical`] drawing `num_samples` samples per distribution (a new last axis).
#[track_caller]
pub fn categorical_samples(logits: &Array, axis: i32, num_samples: i32, key: Option<&Array>) -> Array {
    if num_samples < 0 {
        return invalid("categorical", format!("num_samples must be non-negative, got {num_samples}"));
    }
    categorical_draw(logits, axis, Draw::PerRowN(num_samples), key)
}

#[track_caller]
fn categorical_draw(logits: &Array, axis: i32, draw: Draw, key: Option<&Array>) -> Array {
    let op = "categorical";
    if let Some(f) = ops::propagate(&[logits]) {
        return f;
    }
    let axis = tri!(ops::axis_or_fail(op, axis, logits.ndim()));
    let mut reduced: Shape = logits.shape().into();
    reduced.remove(axis);
    let (logits, shape) = match draw {
        Draw::PerRow => (logits.clone(), reduced),
        Draw::Shape(shape) => {
            match broadcast_shapes(&shape, &reduced) {
                Ok(s) if s == shape => {}
                _ => {
                    return invalid(
                        op,
                        format!(
                            "shape {:?} does not broadcast with the logits' shape without the axis, {:?}",
                            shape.to_vec(),
                            reduced.to_vec()
                        ),
                    );
                }
            }
            (logits.clone(), shape)
        }
        Draw::PerRowN(n) => {
            let mut shape = reduced;
            shape.push(n);
            (logits.expand_dims(-1), shape)
        }
    };
    let key = tri!(checked_key(op, key));
    let n = logits.shape()[axis];
    if n > 0 && logits.size() == n as usize && !shape.is_empty() {
        return categorical_inverse_cdf(op, &logits.reshape([n]), &shape, &key);
    }
    // Gumbel-max: the argmax of logits plus Gumbel noise, the category axis at `offset`.
    let offset = axis + shape.len() + 1 - logits.ndim();
    let mut gshape = shape.clone();
    gshape.insert(offset, n);
    let g = gumbel_from(op, &gshape, DType::F32, &key);
    (g + &logits).argmax(offset as i32)
}

/// One distribution, many samples: the inverse of its CDF at uniform points, which needs
/// memory for the logits and the samples only (the Gumbel-max trick needs their product).
#[track_caller]
fn categorical_inverse_cdf(op: &'static str, logits: &Array, shape: &Shape, key: &Array) -> Array {
    let dtype = promote_types(logits.dtype(), DType::F32);
    let x = logits.astype(dtype);
    let m = x.max(..);
    // exp(x - m) is NaN when m is infinite; then the distribution is uniform over the maxima.
    let w = ops::where_(m.isinf(), x.equal(&m).astype(dtype), (&x - &m).exp());
    let cdf = w.cumsum_with(0, ScanOptions { reverse: false, exclusive: true });
    let u = unit_from(op, shape, DType::F32, key) * w.sum(..);
    // searchsorted(cdf, u, right) - 1: how many CDF points lie at or below u, less one.
    let at_or_below = cdf.less_equal(u.expand_dims(-1)).astype(DType::U32).sum(-1);
    at_or_below - Array::scalar(1u32, DType::U32)
}

/// A random permutation of `0..n` (uint32), as MLX's `permutation(n)`: the order that sorts
/// `n` random 32-bit words.
///
/// ```
/// use nuvec::random;
/// let p = random::permutation(5, Some(&random::key(3)));
/// let mut v = p.to_vec::<u32>().unwrap();
/// v.sort();
/// assert_eq!(v, [0, 1, 2, 3, 4]);
/// ```
#[track_caller]
pub fn permutation(n: i32, key: Option<&Array>) -> Array {
    if n < 0 {
        return invalid("permutation", format!("n must be non-negative, got {n}"));
    }
    let key = tri!(checked_key("permutation", key));
    random_order(n, &key)
}

/// The indices that sort `n` random words drawn with `key`.
fn random_order(n: i32, key: &Array) -> Array {
    bits([n], 4, Some(key)).argsort(0)
}

/// `x` shuffled along `axis` by one random permutation, as MLX's `permutation(x, axis)`.
///
/// ```
/// use nuvec::{array, random};
/// let x = array![[1.0f32, 2.0], [3.0, 4.0], [5.0, 6.0]];
/// let y = random::permutation_of(&x, 0, Some(&random::key(1)));
/// let mut rows = y.to_vec::<f32>().unwrap();
/// rows.sort_by(f32::total_cmp);
/// assert_eq!(rows, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
/// ```
#[track_caller]
pub fn permutation_of(x: &Array, axis: i32, key: Option<&Array>) -> Array {
    let op = "permutation";
    if let Some(e) = x.error() {
        return Array::from_error(e);
    }
    let nd = x.ndim() as i32;
    if axis < -nd || axis >= nd {
        return Array::failed(op, OpErrorKind::InvalidAxis { axis, ndim: x.ndim() });
    }
    let ax = if axis < 0 { axis + nd } else { axis };
    let key = tri!(checked_key(op, key));
    x.take(&random_order(x.shape()[ax as usize], &key), ax)
}
