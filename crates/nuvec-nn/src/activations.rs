//! Activation functions, as MLX's `mlx.nn` functions of the same names: compositions of
//! element-wise ops, so they run on every device, differentiate and batch like any op.
//!
//! ```
//! # use nuvec as _;
//! use nuvec_core::array;
//! use nuvec_nn::activations::{relu, silu};
//! let x = array![-1.0f32, 0.0, 2.0];
//! assert_eq!(relu(&x).to_vec::<f32>().unwrap(), [0.0, 0.0, 2.0]);
//! assert!((silu(&x).to_vec::<f32>().unwrap()[2] - 2.0 / (1.0 + (-2f32).exp())).abs() < 1e-6);
//! ```

use nuvec_core::{Array, ops};

/// `max(x, 0)`.
pub fn relu(x: &Array) -> Array {
    x.maximum(0.0f32)
}

/// `min(max(x, 0), 6)`.
pub fn relu6(x: &Array) -> Array {
    x.maximum(0.0f32).minimum(6.0f32)
}

/// `max(x, 0)²`.
pub fn relu2(x: &Array) -> Array {
    x.maximum(0.0f32).square()
}

/// `max(slope · x, x)` (MLX's default slope is 0.01).
pub fn leaky_relu(x: &Array, negative_slope: f32) -> Array {
    (x * negative_slope).maximum(x)
}

/// `x` where positive, else `alpha (eˣ − 1)`.
pub fn elu(x: &Array, alpha: f32) -> Array {
    ops::where_(x.greater(0.0f32), x, &(&x.exp() - 1.0f32) * alpha)
}

/// `max(x, 0) + alpha (e^(min(x, 0) / alpha) − 1)`.
pub fn celu(x: &Array, alpha: f32) -> Array {
    &x.maximum(0.0f32) + &(&(&x.minimum(0.0f32) / alpha).exp() - 1.0f32) * alpha
}

/// `1.0507 · elu(x, 1.67326)`.
pub fn selu(x: &Array) -> Array {
    elu(x, 1.67326) * 1.0507f32
}

/// `x (1 + erf(x / √2)) / 2`.
pub fn gelu(x: &Array) -> Array {
    &(x * &(&(x / std::f32::consts::SQRT_2).erf() + 1.0f32)) / 2.0f32
}

/// The tanh approximation: `x (1 + tanh(√(2/π) (x + 0.044715 x³))) / 2`, computed as
/// `x σ(2√(2/π) (x + 0.044715 x³))` (the same function; fewer passes over `x`, and no
/// cancellation in `1 + tanh` for large negative `x`).
pub fn gelu_approx(x: &Array) -> Array {
    let a = 2.0 * (2.0f32 / std::f32::consts::PI).sqrt();
    x * &(x * &(&(x.square() * (a * 0.044715f32)) + a)).sigmoid()
}

/// The sigmoid approximation: `x σ(1.702 x)`.
pub fn gelu_fast_approx(x: &Array) -> Array {
    x * &(x * 1.702f32).sigmoid()
}

/// `x σ(x)` (swish).
pub fn silu(x: &Array) -> Array {
    x * &x.sigmoid()
}

/// `log(1 + eˣ)`, without overflow.
pub fn softplus(x: &Array) -> Array {
    x.logaddexp(0.0f32)
}

/// `x / (1 + |x|)`.
pub fn softsign(x: &Array) -> Array {
    x / &(&x.abs() + 1.0f32)
}

/// `x tanh(softplus(x))`.
pub fn mish(x: &Array) -> Array {
    x * &softplus(x).tanh()
}

/// `x min(max(x + 3, 0), 6) / 6`.
pub fn hardswish(x: &Array) -> Array {
    &(x * &(x + 3.0f32).maximum(0.0f32).minimum(6.0f32)) / 6.0f32
}

/// `−softplus(−x)`: `log σ(x)` without overflow.
pub fn log_sigmoid(x: &Array) -> Array {
    -softplus(&-x)
}

/// `x` clamped to `[min, max]` (MLX's defaults: −1, 1).
pub fn hard_tanh(x: &Array, min: f32, max: f32) -> Array {
    x.maximum(min).minimum(max)
}

/// `x` where `|x| > lambda`, else 0.
pub fn hard_shrink(x: &Array, lambda: f32) -> Array {
    ops::where_(x.abs().greater(lambda), x, 0.0f32)
}

/// `x − sign(x) lambda` where `|x| > lambda`, else 0.
pub fn softshrink(x: &Array, lambda: f32) -> Array {
    ops::where_(x.abs().greater(lambda), x - &(&x.sign() * lambda), 0.0f32)
}

/// `max(0, x) + alpha min(0, x)`, `alpha` broadcast against `x`.
pub fn prelu(x: &Array, alpha: &Array) -> Array {
    &x.maximum(0.0f32) + &(alpha * &x.minimum(0.0f32))
}

/// 1 where `x ≥ threshold`, else 0, as `int32` (MLX's).
pub fn step(x: &Array, threshold: f32) -> Array {
    ops::where_(x.greater_equal(threshold), 1i32, 0i32)
}

/// The first half of `axis` gated by the sigmoid of the second: `a σ(b)`.
pub fn glu(x: &Array, axis: i32) -> Array {
    let mut halves = x.split(2, axis);
    if halves.len() == 2 {
        return &halves[0] * &halves[1].sigmoid();
    }
    // An axis of odd size: split's failed array, naming it.
    halves.pop().unwrap_or_else(|| x.clone())
}

/// `x − logsumexp(x)` along `axis`, shifted by the maximum first.
pub fn log_softmax(x: &Array, axis: i32) -> Array {
    let x = x - &x.max_keepdims(axis).stop_gradient();
    &x - &x.logsumexp_keepdims(axis)
}

/// `softmax(−x)` along `axis`.
pub fn softmin(x: &Array, axis: i32) -> Array {
    (-x).softmax(axis)
}
