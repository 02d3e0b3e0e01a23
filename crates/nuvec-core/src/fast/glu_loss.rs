//! The gated MLP activation (SwiGLU) and the cross-entropy loss over the last axis.

use crate::array::Array;
use crate::dtype::{DType, promote_types};
use crate::ops;
use crate::primitive::fast::loss_dtype;

use super::FastOp;

fn wide(x: &Array) -> Array {
    if x.dtype() == DType::F64 { x.clone() } else { x.astype(DType::F32) }
}

/// `silu(gate) · up` in `float32`, rounded once. Only the sigmoid's input is cast: the
/// products widen a half-precision operand as they load it.
pub(super) fn swiglu_composition(gate: &Array, up: &Array) -> Array {
    let dtype = promote_types(gate.dtype(), up.dtype());
    (gate * wide(gate).sigmoid() * up).astype(dtype)
}

/// SwiGLU's cotangents in `float32`, with `s = sigmoid(gate)` and `t = g · s` (shared):
/// `dgate = t · up · (1 + gate · (1 − s))`, `dup = t · gate`, each in its input's dtype.
pub(super) fn swiglu_vjp_composition(gate: &Array, up: &Array, g: &Array) -> Vec<Array> {
    let s = wide(gate).sigmoid();
    let t = g * &s;
    let dgate = &t * up * ((gate * (1.0 - s)) + 1.0);
    let dup = t * gate;
    vec![dgate.astype(gate.dtype()), dup.astype(up.dtype())]
}

/// `silu(gate) · up`, the gated activation of LLaMA-style MLPs, computed in `float32` and
/// rounded once to the inputs' promoted dtype. `gate` and `up` have the same shape.
///
/// ```
/// use nuvec::{array, fast};
/// let y = fast::swiglu(&array![0.0f32, 1.0], &array![3.0f32, 2.0]);
/// let v: Vec<f32> = y.to_vec().unwrap();
/// assert_eq!(v[0], 0.0);
/// assert!((v[1] - 2.0 / (1.0 + (-1f32).exp())).abs() < 1e-6);
/// ```
#[track_caller]
pub fn swiglu(gate: &Array, up: &Array) -> Array {
    super::record(FastOp::SwiGlu, vec![gate.clone(), up.clone()], 1).remove(0)
}

/// Targets as an index into the class axis (`[..., 1]`, in range) and the mask of the rows
/// that count (`0 <= target < classes`).
fn target_index(targets: &Array, classes: i32) -> (Array, Array) {
    let t = targets.astype(DType::I32);
    let keep = ops::logical_and(t.greater_equal(0), t.less(classes));
    (ops::where_(&keep, &t, 0).expand_dims(-1), keep)
}

/// `logsumexp(logits) − logits[target]` in `float32` (`float64` for `float64` logits); 0 where the target is negative (ignored),
/// NaN where it is `≥ classes`.
pub(super) fn cross_entropy_composition(logits: &Array, targets: &Array) -> Array {
    cross_entropy_loss(&wide(logits), logits.dtype(), targets)
}

/// The loss of `cross_entropy_composition` from the widened logits `x`.
fn cross_entropy_loss(x: &Array, dtype: DType, targets: &Array) -> Array {
    let v = *x.shape().last().unwrap_or(&1);
    let (idx, keep) = target_index(targets, v);
    let picked = x.take_along_axis(&idx, -1).squeeze(-1);
    let loss = x.logsumexp(-1) - picked;
    let t = targets.astype(DType::I32);
    let loss = ops::where_(&keep, &loss, 0.0);
    ops::where_(t.greater_equal(v), f32::NAN, &loss).astype(loss_dtype(dtype))
}

/// `g · (softmax(logits) − onehot(target))` in the logits' dtype, zero on rows whose target is
/// out of range (the loss there is 0 or NaN, a constant). The VJP primitive's fourth input,
/// the loss, is what lets the kernel skip recomputing the log-sum-exp (`lse = loss +
/// logits[target]`); the reference does not need it.
pub(super) fn cross_entropy_vjp_composition(logits: &Array, targets: &Array, g: &Array) -> Array {
    cross_entropy_grad(&wide(logits), logits.dtype(), targets, g)
}

/// The gradient of `cross_entropy_vjp_composition` from the widened logits `x`: `g · softmax`
/// everywhere, then `g` taken off at each row's target (a scatter of one value per row, not a
/// one-hot pass over the classes).
fn cross_entropy_grad(x: &Array, dtype: DType, targets: &Array, g: &Array) -> Array {
    let v = *x.shape().last().unwrap_or(&1);
    let (idx, keep) = target_index(targets, v);
    let scale = ops::where_(&keep, wide(g), 0.0).expand_dims(-1);
    let d = x.softmax(-1) * &scale;
    d.scatter_add_along_axis(&idx, scale.negative(), -1).astype(dtype)
}

/// The loss and the gradient together, from one widening of the logits.
pub(super) fn cross_entropy_with_grad_composition(logits: &Array, targets: &Array, g: &Array) -> Vec<Array> {
    let x = wide(logits);
    vec![cross_entropy_loss(&x, logits.dtype(), targets), cross_entropy_grad(&x, logits.dtype(), targets, g)]
}

/// Cross-entropy loss per row: `logsumexp(logits) − logits[target]` over the last (class) axis,
/// in `float32` whatever the logits' dtype (`float64` logits give `float64`). `targets` are integers of the logits' shape without
/// the class axis; a negative target marks a row to ignore (loss 0, no gradient, as PyTorch's
/// `ignore_index = -100`), and a target `≥ classes` gives NaN (and no gradient).
///
/// ```
/// use nuvec::{array, fast};
/// let logits = array![[0.0f32, 0.0], [2.0, 0.0]];
/// let loss = fast::cross_entropy(&logits, &array![1, -100]);
/// let v: Vec<f32> = loss.to_vec().unwrap();
/// assert!((v[0] - 2f32.ln()).abs() < 1e-6);
/// assert_eq!(v[1], 0.0);
/// ```
#[track_caller]
pub fn cross_entropy(logits: &Array, targets: &Array) -> Array {
    // Class indices travel as int32 (vocabularies stay far below 2³¹).
    let targets = if targets.dtype().is_integer() && targets.dtype() != DType::I32 {
        targets.astype(DType::I32)
    } else {
        targets.clone()
    };
    super::record(FastOp::CrossEntropy, vec![logits.clone(), targets], 1).remove(0)
}
