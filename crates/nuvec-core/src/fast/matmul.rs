//! Products whose left operand a row-wise fused operation makes: an RMS norm
//! ([`rms_norm_matmul`]) or SwiGLU ([`swiglu_matmul`]). A backend may apply the operation as its
//! product kernel loads the rows, so that a decode step's norms and activations cost no kernel
//! of their own; the composition is the fused operation followed by the product.

use super::{FastOp, record, rms_norm, swiglu};
use crate::array::Array;
use crate::ops;

pub(super) fn rms_norm_matmul_composition(eps: f32, x: &Array, weight: &Array, b: &Array) -> Array {
    rms_norm(x, weight, eps).matmul(b)
}

pub(super) fn swiglu_matmul_composition(gate: &Array, up: &Array, b: &Array, c: Option<&Array>) -> Array {
    let y = swiglu(gate, up);
    match c {
        Some(c) => ops::addmm(c, &y, b, 1.0, 1.0),
        None => y.matmul(b),
    }
}

/// `rms_norm(x, weight, eps) @ b`: the normalised rows `x [.., K]` times `b [K, N]`, in the
/// inputs' promoted dtype. On the GPU, for up to 2 rows and `b` a transposed row-major weight
/// (`linear.weight.t()`), the product's kernel normalises the rows as it reads them.
///
/// ```
/// use nuvec::{array, fast};
/// let x = array![[3.0f32, 4.0]];
/// let w = array![1.0f32, 2.0];
/// let b = array![[1.0f32, 0.0, 1.0], [0.0, 1.0, 1.0]];
/// let y: Vec<f32> = fast::rms_norm_matmul(&x, &w, 1e-6, &b).to_vec().unwrap();
/// let r = 12.5f32.sqrt();
/// assert!((y[0] - 3.0 / r).abs() < 1e-5 && (y[1] - 8.0 / r).abs() < 1e-5 && (y[2] - 11.0 / r).abs() < 1e-5);
/// assert!(fast::rms_norm_matmul(&x, &w, 1e-6, &b.t()).check().is_err()); // b must be [2, N]
/// ```
#[track_caller]
pub fn rms_norm_matmul(x: &Array, weight: &Array, eps: f32, b: &Array) -> Array {
    record(FastOp::RmsNormMatmul { eps }, vec![x.clone(), weight.clone(), b.clone()], 1).remove(0)
}

/// `swiglu(gate, up) @ b`, plus `c` when given (`addmm(c, swiglu(gate, up), b)`): the gated
/// rows `[.., K]` times `b [K, N]`, in the inputs' promoted dtype. On the GPU, for up to 2 rows
/// and `b` a transposed row-major weight, the product's kernel applies the activation as it
/// reads the rows and adds `c` as it writes (an MLP's down projection and residual in one
/// kernel).
///
/// ```
/// use nuvec::{array, fast};
/// let gate = array![[0.0f32, 1.0]];
/// let up = array![[3.0f32, 2.0]];
/// let b = array![[1.0f32], [1.0]];
/// let c = array![[10.0f32]];
/// let y: Vec<f32> = fast::swiglu_matmul(&gate, &up, &b, Some(&c)).to_vec().unwrap();
/// assert!((y[0] - (10.0 + 2.0 / (1.0 + (-1f32).exp()))).abs() < 1e-5);
/// ```
#[track_caller]
pub fn swiglu_matmul(gate: &Array, up: &Array, b: &Array, c: Option<&Array>) -> Array {
    let mut inputs = vec![gate.clone(), up.clone(), b.clone()];
    inputs.extend(c.cloned());
    record(FastOp::SwiGluMatmul { add: c.is_some() }, inputs, 1).remove(0)
}
