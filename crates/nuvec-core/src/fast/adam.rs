//! One Adam (or AdamW) update of a parameter as one primitive: the optimizers' rule, which
//! as ordinary operations makes a dozen passes over the parameter and its moments.

use super::{AdamParams, FastOp, record};
use crate::array::Array;

/// One Adam update of the parameter `p` with gradient `g` and moments `m`, `v` (all of one
/// shape and float dtype): returns `(p', m', v')` with `m' = β₁ m + (1 − β₁) g`,
/// `v' = β₂ v + (1 − β₂) g²` and `p' = decay · p − step · m' / (scale · √v' + eps)`.
/// Half-precision inputs are computed in `float32` and rounded once by the fused kernel;
/// the composition rounds after each operation. Mismatched inputs give failed arrays.
///
/// ```
/// use nuvec::{array, fast};
/// let params = fast::AdamParams { beta1: 0.9, beta2: 0.999, eps: 1e-8, decay: 1.0, step: 0.1, scale: 1.0 };
/// let zero = array![0.0f32, 0.0];
/// let (p, m, v) = fast::adam_step(&array![1.0f32, 2.0], &array![0.5f32, -0.5], &zero, &zero, &params);
/// let m: Vec<f32> = m.to_vec().unwrap();
/// assert!((m[0] - 0.05).abs() < 1e-7);
/// let v: Vec<f32> = v.to_vec().unwrap();
/// assert_eq!(v[0], 0.25 * (1.0 - 0.999f32));
/// let p: Vec<f32> = p.to_vec().unwrap();
/// assert!((p[0] - (1.0 - 0.1 * 0.05 / (v[0].sqrt() + 1e-8))).abs() < 1e-6);
/// ```
#[track_caller]
pub fn adam_step(p: &Array, g: &Array, m: &Array, v: &Array, params: &AdamParams) -> (Array, Array, Array) {
    let inputs = vec![p.clone(), g.clone(), m.clone(), v.clone()];
    let mut out = record(FastOp::AdamStep(*params), inputs, 3).into_iter();
    let mut next = || out.next().unwrap_or_default();
    (next(), next(), next())
}

/// The update as ordinary operations, in the order the fused kernels compute it.
pub(super) fn composition(a: &AdamParams, inputs: &[Array]) -> Vec<Array> {
    let [p, g, m, v] = inputs else {
        return inputs.to_vec();
    };
    let m = &(m * a.beta1) + &(g * (1.0 - a.beta1));
    let v = &(v * a.beta2) + &(&g.square() * (1.0 - a.beta2));
    let p = if a.decay != 1.0 { p * a.decay } else { p.clone() };
    let root = if a.scale != 1.0 { &v.sqrt() * a.scale } else { v.sqrt() };
    let p = &p - &(&(&m * a.step) / &(&root + a.eps));
    vec![p, m, v]
}
