//! Parameter initializers, as MLX's `mlx.nn.init`: each returns a new array of `shape` in
//! `dtype`, drawn from `key` or, without one, from the thread's default key sequence (so that
//! after `random::seed(s)` the values are MLX's after `mx.random.seed(s)`). Replace a layer's
//! parameter with one:
//!
//! ```
//! # use nuvec as _;
//! use nuvec_core::DType;
//! use nuvec_nn::{Linear, Param, init};
//! let mut layer = Linear::new(16, 32, true, None);
//! layer.weight = Param::new(init::glorot_uniform(&[32, 16], 1.0, DType::F32, None).unwrap());
//! let limit = (6.0f32 / 48.0).sqrt();
//! assert!(layer.weight.abs().max(..).item::<f32>().unwrap() <= limit);
//! ```

use nuvec_core::{Array, DType, Error, Result, ops, random};

/// Which count of units He initialization scales by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fan {
    /// Input units: `shape[-1]` times the receptive field.
    In,
    /// Output units: `shape[0]` times the receptive field.
    Out,
}

/// An array filled with `value`.
pub fn constant(shape: &[i32], value: f32, dtype: DType) -> Array {
    ops::full_dtype(shape, value, dtype)
}

/// Normal samples with `mean` and standard deviation `std`.
pub fn normal(shape: &[i32], mean: f32, std: f32, dtype: DType, key: Option<&Array>) -> Array {
    random::normal(shape, dtype, mean, std, key)
}

/// Uniform samples in `[low, high)`.
pub fn uniform(shape: &[i32], low: f32, high: f32, dtype: DType, key: Option<&Array>) -> Array {
    random::uniform(low, high, shape, dtype, key)
}

/// The identity matrix of a square `shape`; an error for any other shape.
pub fn identity(shape: &[i32], dtype: DType) -> Result<Array> {
    match shape {
        &[n, m] if n == m => Ok(ops::eye(n, None, 0, dtype)),
        _ => Err(Error::InvalidArgument(format!("init::identity: the shape must be square, got {shape:?}"))),
    }
}

/// Normal samples with standard deviation `gain · √(2 / (fan_in + fan_out))` (Glorot).
pub fn glorot_normal(shape: &[i32], gain: f32, dtype: DType, key: Option<&Array>) -> Result<Array> {
    let (fan_in, fan_out) = fans("glorot_normal", shape)?;
    let std = gain * (2.0 / (fan_in + fan_out)).sqrt();
    Ok(random::normal(shape, dtype, 0.0, std, key))
}

/// Uniform samples in `±gain · √(6 / (fan_in + fan_out))` (Glorot).
pub fn glorot_uniform(shape: &[i32], gain: f32, dtype: DType, key: Option<&Array>) -> Result<Array> {
    let (fan_in, fan_out) = fans("glorot_uniform", shape)?;
    let limit = gain * (6.0 / (fan_in + fan_out)).sqrt();
    Ok(random::uniform(-limit, limit, shape, dtype, key))
}

/// Normal samples with standard deviation `gain / √fan` (He).
pub fn he_normal(shape: &[i32], fan: Fan, gain: f32, dtype: DType, key: Option<&Array>) -> Result<Array> {
    let n = pick(fans("he_normal", shape)?, fan);
    Ok(random::normal(shape, dtype, 0.0, gain / n.sqrt(), key))
}

/// Uniform samples in `±gain · √(3 / fan)` (He).
pub fn he_uniform(shape: &[i32], fan: Fan, gain: f32, dtype: DType, key: Option<&Array>) -> Result<Array> {
    let n = pick(fans("he_uniform", shape)?, fan);
    let limit = gain * (3.0 / n).sqrt();
    Ok(random::uniform(-limit, limit, shape, dtype, key))
}

/// `(fan_in, fan_out)` of a weight of `shape`: the last and first dimensions, each times the
/// product of those between (a convolution's window).
fn fans(op: &str, shape: &[i32]) -> Result<(f32, f32)> {
    match shape {
        [out, window @ .., input] => {
            let field: i64 = window.iter().map(|&d| d as i64).product();
            Ok(((*input as i64 * field) as f32, (*out as i64 * field) as f32))
        }
        _ => Err(Error::InvalidArgument(format!("init::{op}: the shape needs at least 2 dimensions, got {shape:?}"))),
    }
}

fn pick((fan_in, fan_out): (f32, f32), fan: Fan) -> f32 {
    match fan {
        Fan::In => fan_in,
        Fan::Out => fan_out,
    }
}
