//! Loss functions, as MLX's `mlx.nn.losses`: each returns the per-element (or per-row) loss
//! reduced by a [`Reduction`]. Shapes that do not match give a failed array naming the
//! loss and the argument.
//!
//! ```
//! # use nuvec as _;
//! use nuvec_core::array;
//! use nuvec_nn::losses::{CrossEntropy, Reduction, cross_entropy};
//! let logits = array![[0.0f32, 0.0], [2.0, 0.0]];
//! let opts = CrossEntropy { reduction: Reduction::Mean, ignore_index: Some(-100), ..Default::default() };
//! // The second row is ignored: the mean is the first row's log 2.
//! let loss = cross_entropy(&logits, &array![1, -100], &opts);
//! assert!((loss.item::<f32>().unwrap() - 2f32.ln()).abs() < 1e-6);
//! ```

use std::panic::Location;

use nuvec_core::{Array, DType, Error, OpErrorKind, fast, ops};

/// How a loss's elements combine into the result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduction {
    /// Every element's loss.
    None,
    /// Their mean.
    Mean,
    /// Their sum.
    Sum,
}

impl Reduction {
    fn apply(self, loss: Array) -> Array {
        match self {
            Reduction::None => loss,
            Reduction::Mean => loss.mean(..),
            Reduction::Sum => loss.sum(..),
        }
    }
}

#[track_caller]
fn fail(op: &'static str, what: String) -> Array {
    Array::from_error(Error::Op { op, at: Location::caller(), kind: OpErrorKind::InvalidArgument(what) })
}

#[track_caller]
fn same_shape(op: &'static str, a: &Array, b: &Array, names: (&str, &str)) -> Option<Array> {
    (a.shape() != b.shape()).then(|| {
        fail(op, format!("{} shape {:?} does not match {} shape {:?}", names.0, a.shape(), names.1, b.shape()))
    })
}

/// Options of [`cross_entropy`]: MLX's defaults are `CrossEntropy::default()`.
#[derive(Clone, Debug)]
pub struct CrossEntropy {
    /// Each row's weight, of the loss's shape.
    pub weights: Option<Array>,
    /// The class axis.
    pub axis: i32,
    /// Mixes the target with the uniform distribution: in `[0, 1)`.
    pub label_smoothing: f32,
    /// Class-index targets equal to this give no loss, and are left out of a mean.
    pub ignore_index: Option<i64>,
    /// MLX's default: `Reduction::None`.
    pub reduction: Reduction,
}

impl Default for CrossEntropy {
    fn default() -> CrossEntropy {
        CrossEntropy { weights: None, axis: -1, label_smoothing: 0.0, ignore_index: None, reduction: Reduction::None }
    }
}

/// Cross entropy of `logits` against `targets`: class indices (the logits' shape without the
/// class axis) or probabilities (the logits' shape).
#[track_caller]
pub fn cross_entropy(logits: &Array, targets: &Array, options: &CrossEntropy) -> Array {
    const OP: &str = "cross_entropy";
    let o = options;
    if !(0.0..1.0).contains(&o.label_smoothing) {
        return fail(OP, format!("label_smoothing must be in [0, 1), got {}", o.label_smoothing));
    }
    let nd = logits.ndim() as i32;
    let axis = if o.axis < 0 { o.axis + nd } else { o.axis };
    if !(0..nd).contains(&axis) {
        return fail(OP, format!("axis {} is out of range for logits of {nd} dimensions", o.axis));
    }
    let probs = targets.ndim() == logits.ndim();
    let mut class_shape = logits.shape().to_vec();
    class_shape.remove(axis as usize);
    if (probs && targets.shape() != logits.shape()) || (!probs && targets.shape() != class_shape.as_slice()) {
        return fail(
            OP,
            format!("targets shape {:?} does not match logits shape {:?}", targets.shape(), logits.shape()),
        );
    }
    if !probs && !targets.dtype().is_integer() {
        return fail(OP, format!("class targets must be integers, got {}", targets.dtype()));
    }
    let valid = match o.ignore_index {
        Some(i) if !probs => Some(targets.not_equal(Array::scalar(i, targets.dtype()))),
        _ => None,
    };
    let fused = !probs && o.label_smoothing == 0.0 && axis == nd - 1;
    // Ignored rows' targets: -1 for the fused kernel, which skips negative ones; 0 (any class)
    // for the composition, whose loss there is masked below.
    let targets = match &valid {
        Some(v) => ops::where_(v, targets, Array::scalar(if fused { -1 } else { 0 }, targets.dtype())),
        None => targets.clone(),
    };
    let mut loss = if fused {
        fast::cross_entropy(logits, &targets).astype(logits.dtype())
    } else {
        composed_cross_entropy(logits, &targets, axis, probs, o.label_smoothing)
    };
    if let Some(w) = &o.weights {
        if w.shape() != loss.shape() {
            return fail(OP, format!("weights shape {:?} does not match the loss's {:?}", w.shape(), loss.shape()));
        }
        loss = &loss * w;
    }
    match valid {
        Some(v) => {
            let loss = ops::where_(&v, &loss, 0.0f32);
            match o.reduction {
                // Over the rows that count (none: 0).
                Reduction::Mean => &loss.sum(..) / &v.astype(DType::F32).sum(..).maximum(1.0f32),
                r => r.apply(loss),
            }
        }
        None => o.reduction.apply(loss),
    }
}

/// Cross entropy per row as MLX composes it: `logsumexp(x) − x[target]` on the logits shifted
/// by their maximum, mixed with their mean for label smoothing.
fn composed_cross_entropy(logits: &Array, targets: &Array, axis: i32, probs: bool, smoothing: f32) -> Array {
    let shifted = logits - &logits.max_keepdims(axis).stop_gradient();
    let score = if probs {
        (&shifted * targets).sum(axis)
    } else {
        shifted.take_along_axis(&targets.expand_dims(axis), axis).squeeze(axis)
    };
    let lse = shifted.logsumexp(axis);
    if smoothing > 0.0 {
        &(&lse - &(&score * (1.0 - smoothing))) - &(&shifted.mean(axis) * smoothing)
    } else {
        &lse - &score
    }
}

/// Binary cross entropy of `inputs` (logits with `with_logits`, else probabilities, whose logs
/// are clipped at −100) against `targets` in `[0, 1]`, optionally weighted (MLX's default
/// reduction: mean).
#[track_caller]
pub fn binary_cross_entropy(
    inputs: &Array,
    targets: &Array,
    weights: Option<&Array>,
    with_logits: bool,
    reduction: Reduction,
) -> Array {
    const OP: &str = "binary_cross_entropy";
    if let Some(f) = same_shape(OP, inputs, targets, ("inputs", "targets")) {
        return f;
    }
    let mut loss = if with_logits {
        &inputs.logaddexp(0.0f32) - &(inputs * targets)
    } else {
        let log_p = inputs.log().maximum(-100.0f32);
        let log_q = (1.0f32 - inputs).log().maximum(-100.0f32);
        -(&(targets * &log_p) + &(&(1.0f32 - targets) * &log_q))
    };
    if let Some(w) = weights {
        if let Some(f) = same_shape(OP, w, &loss, ("weights", "loss")) {
            return f;
        }
        loss = &loss * w;
    }
    reduction.apply(loss)
}

/// `|predictions − targets|` (MLX's default reduction: mean).
#[track_caller]
pub fn l1_loss(predictions: &Array, targets: &Array, reduction: Reduction) -> Array {
    if let Some(f) = same_shape("l1_loss", predictions, targets, ("predictions", "targets")) {
        return f;
    }
    reduction.apply((predictions - targets).abs())
}

/// `(predictions − targets)²` (MLX's default reduction: mean).
#[track_caller]
pub fn mse_loss(predictions: &Array, targets: &Array, reduction: Reduction) -> Array {
    if let Some(f) = same_shape("mse_loss", predictions, targets, ("predictions", "targets")) {
        return f;
    }
    reduction.apply((predictions - targets).square())
}

/// Huber-style: `0.5 d² / beta` where `d = |predictions − targets| < beta`, else
/// `d − 0.5 beta` (MLX's defaults: beta 1, mean).
#[track_caller]
pub fn smooth_l1_loss(predictions: &Array, targets: &Array, beta: f32, reduction: Reduction) -> Array {
    if let Some(f) = same_shape("smooth_l1_loss", predictions, targets, ("predictions", "targets")) {
        return f;
    }
    let d = (predictions - targets).abs();
    reduction.apply(ops::where_(d.less(beta), &(&d.square() * 0.5f32) / beta, &d - 0.5 * beta))
}

/// Negative log likelihood: `−inputs[target]` along `axis` (`inputs` are log-probabilities;
/// MLX's default reduction: none).
#[track_caller]
pub fn nll_loss(inputs: &Array, targets: &Array, axis: i32, reduction: Reduction) -> Array {
    reduction.apply(-inputs.take_along_axis(&targets.expand_dims(axis), axis).squeeze(axis))
}

/// Kullback–Leibler divergence `Σ e^t (t − inputs)` along `axis`, both log-probabilities (MLX's
/// default reduction: none).
#[track_caller]
pub fn kl_div_loss(inputs: &Array, targets: &Array, axis: i32, reduction: Reduction) -> Array {
    reduction.apply((&targets.exp() * &(targets - inputs)).sum(axis))
}
