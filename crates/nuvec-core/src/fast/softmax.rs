//! Softmax and log-sum-exp over the last axis.

use crate::array::Array;
use crate::dtype::DType;

/// Half-precision inputs compute their statistics in `float32`.
fn widen(x: &Array) -> Array {
    if x.dtype().is_half() { x.astype(DType::F32) } else { x.clone() }
}

pub(super) fn softmax_composition(x: &Array) -> Array {
    if x.size() == 0 {
        return x.clone();
    }
    let xf = widen(x);
    let m = xf.max_keepdims(-1).stop_gradient();
    let e = (&xf - &m).exp();
    let s = e.sum_keepdims(-1);
    (e / s).astype(x.dtype())
}

pub(super) fn logsumexp_composition(x: &Array) -> Array {
    let xf = widen(x);
    let m = xf.max_keepdims(-1).stop_gradient();
    let out = (&xf - &m).exp().sum_keepdims(-1).log() + &m;
    // Rows whose maximum is infinite (all -inf, or a +inf) give that maximum.
    crate::ops::where_(m.isinf(), &m, &out).astype(x.dtype())
}
