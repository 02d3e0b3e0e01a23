//! Optimizers and learning-rate schedules, as MLX's `mlx.optimizers`: [`Sgd`], [`Adam`],
//! [`AdamW`], [`Lion`], [`Adafactor`]; [`Schedule`]s ([`linear_schedule`], [`cosine_decay`], [`step_decay`],
//! [`exponential_decay`], [`join_schedules`]); [`clip_grad_norm`].
//!
//! An optimizer takes any [`Tree`] of parameters and the same tree of gradients and returns the
//! updated parameters ([`Optimizer::apply_gradients`]); its state (`step` and each leaf's
//! moments, named `"{leaf}.{m|v}"`) is a flat map of arrays that saves and loads
//! ([`Optimizer::state`], [`Optimizer::set_state`]), e.g. with `nuvec::save_safetensors`.
//!
//! ```
//! # use nuvec as _;
//! use nuvec_core::{Array, array};
//! use nuvec_nn::optim::{Adam, Optimizer, cosine_decay};
//! let mut opt = Adam::new(cosine_decay(1e-2, 100, 0.0));
//! opt.bias_correction = true;
//! let params = vec![array![1.0, -2.0]];
//! let grads = vec![array![0.5, 0.5]];
//! let next = opt.apply_gradients(&grads, &params);
//! // Bias-corrected Adam's first step moves each parameter by the learning rate against its
//! // gradient's sign.
//! let moved: Vec<f32> = next[0].to_vec().unwrap();
//! assert!((moved[0] - 0.99).abs() < 1e-6 && (moved[1] + 2.01).abs() < 1e-6);
//! assert_eq!(opt.step(), 1);
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;

use nuvec_core::fast::{self, AdamParams};
use nuvec_core::tree::Tree;
use nuvec_core::{Array, DType, Error, Result};

use crate::module::{Module, Params};

/// A learning rate (or any scheduled value): a constant, or a function of the step (the
/// number of updates made before this one).
#[derive(Clone)]
pub enum Schedule {
    /// The same value at every step.
    Constant(f32),
    /// The value at each step.
    Steps(Arc<dyn Fn(u64) -> f32 + Send + Sync>),
}

impl Schedule {
    /// The value at `step`.
    pub fn at(&self, step: u64) -> f32 {
        match self {
            Schedule::Constant(v) => *v,
            Schedule::Steps(f) => f(step),
        }
    }

    fn steps(f: impl Fn(u64) -> f32 + Send + Sync + 'static) -> Schedule {
        Schedule::Steps(Arc::new(f))
    }
}

impl From<f32> for Schedule {
    fn from(v: f32) -> Schedule {
        Schedule::Constant(v)
    }
}

impl From<f64> for Schedule {
    fn from(v: f64) -> Schedule {
        Schedule::Constant(v as f32)
    }
}

/// From `init` to `end` in a straight line over `steps` steps, then `end` (MLX's
/// `linear_schedule`; a linear warmup). `steps` 0 counts as 1.
pub fn linear_schedule(init: f32, end: f32, steps: u64) -> Schedule {
    let steps = steps.max(1);
    Schedule::steps(move |s| s.min(steps) as f32 * ((end - init) / steps as f32) + init)
}

/// Half a cosine from `init` down to `end` over `decay_steps` steps, then `end` (MLX's
/// `cosine_decay`). `decay_steps` 0 counts as 1.
pub fn cosine_decay(init: f32, decay_steps: u64, end: f32) -> Schedule {
    let n = decay_steps.max(1);
    Schedule::steps(move |s| {
        let decay = 0.5 * (1.0 + ((std::f32::consts::PI / n as f32) * s.min(n) as f32).cos());
        end + decay * (init - end)
    })
}

/// `init · decay_rate^(step / step_size)` (integer division; MLX's `step_decay`). `step_size`
/// 0 counts as 1.
pub fn step_decay(init: f32, decay_rate: f32, step_size: u64) -> Schedule {
    let size = step_size.max(1);
    Schedule::steps(move |s| init * decay_rate.powi((s / size) as i32))
}

/// `init · decay_rate^step` (MLX's `exponential_decay`).
pub fn exponential_decay(init: f32, decay_rate: f32) -> Schedule {
    Schedule::steps(move |s| init * decay_rate.powf(s as f32))
}

/// `schedules[0]` until `boundaries[0]`, then `schedules[1]` counting steps from that boundary,
/// and so on (MLX's `join_schedules`). An error unless there is one boundary fewer than
/// schedules.
pub fn join_schedules(schedules: Vec<Schedule>, boundaries: Vec<u64>) -> Result<Schedule> {
    if schedules.is_empty() || schedules.len() != boundaries.len() + 1 {
        return Err(Error::InvalidArgument(format!(
            "join_schedules: {} schedules need {} boundaries, got {}",
            schedules.len(),
            schedules.len().saturating_sub(1),
            boundaries.len()
        )));
    }
    Ok(Schedule::steps(move |s| {
        let mut out = schedules[0].at(s);
        for (b, sched) in boundaries.iter().zip(&schedules[1..]) {
            if s >= *b {
                out = sched.at(s - b);
            }
        }
        out
    }))
}

/// An optimizer: one update rule applied to every leaf of a parameter tree, with per-leaf
/// state.
pub trait Optimizer {
    /// Updates made so far.
    fn step(&self) -> u64;

    /// The learning rate the next update uses.
    fn learning_rate(&self) -> f32;

    /// The parameters after one update with `gradients` (a tree shaped as `parameters`); the
    /// step and the state advance. A tree of another shape gives failed arrays saying so.
    fn apply_gradients<T: Tree>(&mut self, gradients: &T, parameters: &T) -> T;

    /// The state: `step` (a `uint64` scalar) and each leaf's arrays, named `"{leaf}.{name}"`.
    fn state(&self) -> BTreeMap<String, Array>;

    /// Restores a state saved by [`Optimizer::state`]; an error names a missing `step`.
    fn set_state(&mut self, state: BTreeMap<String, Array>) -> Result<()>;

    /// One update of `model`'s trainable parameters with `gradients` (by dotted name, as
    /// [`value_and_grad`](crate::value_and_grad) gives them), as MLX's `optimizer.update`.
    /// An error names a gradient the model has no trainable parameter for.
    fn update<M: Module + ?Sized>(&mut self, model: &mut M, gradients: &Params) -> Result<()>
    where
        Self: Sized,
    {
        let params = model.trainable_parameters();
        if let Some(extra) = gradients.keys().find(|k| !params.contains_key(*k)) {
            return Err(Error::InvalidArgument(format!("update: no trainable parameter '{extra}'")));
        }
        // Parameters without a gradient keep their values.
        let grads: Params =
            params.keys().filter_map(|k| gradients.get_key_value(k)).map(|(k, g)| (k.clone(), g.clone())).collect();
        let current: Params = grads.keys().map(|k| (k.clone(), params[k].clone())).collect();
        model.update(&self.apply_gradients(&grads, &current))
    }
}

/// What every optimizer keeps: the step, each leaf's named state, and how to update one leaf.
struct Core {
    step: u64,
    lr: Schedule,
    leaves: Vec<BTreeMap<&'static str, Array>>,
}

impl Core {
    fn new(lr: Schedule) -> Core {
        Core { step: 0, lr, leaves: Vec::new() }
    }

    /// One update: `rule(gradient, parameter, learning rate, step, state)` per leaf, the state
    /// made by `init` the first time. The learning rate is a host scalar: multiplying by it
    /// rounds it to the array's dtype, as a scalar array of that dtype would.
    fn apply<T: Tree>(
        &mut self,
        gradients: &T,
        parameters: &T,
        init: impl Fn(&Array) -> BTreeMap<&'static str, Array>,
        rule: impl Fn(&Array, &Array, f32, u64, &mut BTreeMap<&'static str, Array>) -> Array,
    ) -> T {
        let (g, p) = (gradients.flatten(), parameters.flatten());
        if g.len() != p.len() {
            let e =
                Error::InvalidArgument(format!("apply_gradients: {} gradients for {} parameters", g.len(), p.len()));
            return parameters.with_leaves(p.iter().map(|_| Array::from_error(e.clone())).collect());
        }
        if self.leaves.len() != p.len() {
            self.leaves = p.iter().map(&init).collect();
        }
        let lr = self.lr.at(self.step);
        self.step += 1;
        let out = (0..p.len()).map(|i| rule(&g[i], &p[i], lr, self.step, &mut self.leaves[i])).collect();
        parameters.with_leaves(out)
    }

    fn state(&self) -> BTreeMap<String, Array> {
        let mut out = BTreeMap::new();
        out.insert("step".to_string(), Array::scalar(self.step, DType::U64));
        for (i, leaf) in self.leaves.iter().enumerate() {
            for (name, a) in leaf {
                out.insert(format!("{i}.{name}"), a.clone());
            }
        }
        out
    }

    fn set_state(&mut self, mut state: BTreeMap<String, Array>, names: &[&'static str]) -> Result<()> {
        let step = state.remove("step").ok_or_else(|| Error::InvalidArgument("set_state: no \"step\"".into()))?;
        self.step = step.astype(DType::U64).item::<u64>()?;
        let mut leaves: Vec<BTreeMap<&'static str, Array>> = Vec::new();
        for (key, a) in state {
            let bad = || Error::InvalidArgument(format!("set_state: unexpected entry \"{key}\""));
            let (i, name) = key.split_once('.').ok_or_else(bad)?;
            let i: usize = i.parse().map_err(|_| bad())?;
            let name = *names.iter().find(|n| **n == name).ok_or_else(bad)?;
            if leaves.len() <= i {
                leaves.resize(i + 1, BTreeMap::new());
            }
            leaves[i].insert(name, a);
        }
        self.leaves = leaves;
        Ok(())
    }
}

/// An optimizer's `step` and `learning_rate`, from its `core`.
macro_rules! core_methods {
    () => {
        fn step(&self) -> u64 {
            self.core.step
        }
        fn learning_rate(&self) -> f32 {
            self.core.lr.at(self.core.step)
        }
    };
}

/// An optimizer's `state` and `set_state`, from its `core` and the names of a leaf's state.
macro_rules! state_methods {
    ($names:expr) => {
        fn state(&self) -> BTreeMap<String, Array> {
            self.core.state()
        }
        fn set_state(&mut self, state: BTreeMap<String, Array>) -> Result<()> {
            self.core.set_state(state, $names)
        }
    };
}

fn zeros(p: &Array) -> Array {
    nuvec_core::ops::zeros_like(p)
}

/// Stochastic gradient descent with momentum, dampening, Nesterov momentum and weight decay
/// (MLX's `SGD`).
pub struct Sgd {
    core: Core,
    /// Momentum (0: plain descent).
    pub momentum: f32,
    /// L2 weight decay, added to the gradient.
    pub weight_decay: f32,
    /// Dampening of the momentum's gradient term.
    pub dampening: f32,
    /// Nesterov momentum.
    pub nesterov: bool,
}

impl Sgd {
    /// Plain SGD with learning rate (or schedule) `lr`; set the public fields for the rest.
    pub fn new(lr: impl Into<Schedule>) -> Sgd {
        Sgd { core: Core::new(lr.into()), momentum: 0.0, weight_decay: 0.0, dampening: 0.0, nesterov: false }
    }
}

impl Optimizer for Sgd {
    core_methods!();
    fn apply_gradients<T: Tree>(&mut self, gradients: &T, parameters: &T) -> T {
        let (mu, wd, damp, nesterov) = (self.momentum, self.weight_decay, self.dampening, self.nesterov);
        self.core.apply(
            gradients,
            parameters,
            |p| BTreeMap::from([("v", zeros(p))]),
            |g, p, lr, _, st| {
                let g = if wd != 0.0 { g + &(p * wd) } else { g.clone() };
                if mu <= 0.0 {
                    return p - &(&g * lr);
                }
                let mut v = &st["v"] * mu;
                v = if damp > 0.0 { &v + &(&g * (1.0 - damp)) } else { &v + &g };
                let update = if nesterov { &g + &(&v * mu) } else { v.clone() };
                st.insert("v", v);
                p - &(&update * lr)
            },
        )
    }
    state_methods!(&["v"]);
}

/// Adam (MLX's `Adam`): first and second moments with decay rates `betas`, `eps` in the
/// denominator; MLX's default leaves out the bias correction.
pub struct Adam {
    core: Core,
    /// The moments' decay rates.
    pub betas: (f32, f32),
    /// Added to the denominator.
    pub eps: f32,
    /// Divide the moments by `1 - beta^step`.
    pub bias_correction: bool,
    /// Decoupled weight decay (AdamW's; 0 for Adam).
    weight_decay: f32,
}

impl Adam {
    /// Adam with learning rate (or schedule) `lr`, betas (0.9, 0.999), eps 1e-8.
    pub fn new(lr: impl Into<Schedule>) -> Adam {
        Adam { core: Core::new(lr.into()), betas: (0.9, 0.999), eps: 1e-8, bias_correction: false, weight_decay: 0.0 }
    }
}

/// AdamW (MLX's `AdamW`): Adam on parameters first shrunk by `1 - lr · weight_decay`.
pub struct AdamW(Adam);

impl AdamW {
    /// AdamW with learning rate (or schedule) `lr` and `weight_decay` (MLX's default 0.01),
    /// betas (0.9, 0.999), eps 1e-8.
    pub fn new(lr: impl Into<Schedule>, weight_decay: f32) -> AdamW {
        AdamW(Adam { weight_decay, ..Adam::new(lr) })
    }

    /// The Adam settings (betas, eps, bias correction).
    pub fn adam(&mut self) -> &mut Adam {
        &mut self.0
    }
}

impl Optimizer for Adam {
    core_methods!();
    fn apply_gradients<T: Tree>(&mut self, gradients: &T, parameters: &T) -> T {
        let ((b1, b2), eps, bc, wd) = (self.betas, self.eps, self.bias_correction, self.weight_decay);
        self.core.apply(
            gradients,
            parameters,
            |p| BTreeMap::from([("m", zeros(p)), ("v", zeros(p))]),
            |g, p, lr, step, st| {
                let (size, scale) = if bc {
                    (lr / (1.0 - b1.powi(step as i32)), 1.0 / (1.0 - b2.powi(step as i32)).sqrt())
                } else {
                    (lr, 1.0)
                };
                let a = AdamParams { beta1: b1, beta2: b2, eps, decay: 1.0 - lr * wd, step: size, scale };
                // One fused update; the gradient and moments in the parameter's dtype.
                let like = |x: &Array| if x.dtype() == p.dtype() { x.clone() } else { x.astype(p.dtype()) };
                let (p, m, v) = fast::adam_step(p, &like(g), &like(&st["m"]), &like(&st["v"]), &a);
                st.insert("m", m);
                st.insert("v", v);
                p
            },
        )
    }
    state_methods!(&["m", "v"]);
}

impl Optimizer for AdamW {
    fn step(&self) -> u64 {
        self.0.step()
    }
    fn learning_rate(&self) -> f32 {
        self.0.learning_rate()
    }
    fn apply_gradients<T: Tree>(&mut self, gradients: &T, parameters: &T) -> T {
        self.0.apply_gradients(gradients, parameters)
    }
    fn state(&self) -> BTreeMap<String, Array> {
        self.0.state()
    }
    fn set_state(&mut self, state: BTreeMap<String, Array>) -> Result<()> {
        self.0.set_state(state)
    }
}

/// Lion (MLX's `Lion`): the sign of an interpolated momentum, decoupled weight decay.
pub struct Lion {
    core: Core,
    /// The interpolation (first) and momentum (second) rates.
    pub betas: (f32, f32),
    /// Decoupled weight decay.
    pub weight_decay: f32,
}

impl Lion {
    /// Lion with learning rate (or schedule) `lr`, betas (0.9, 0.99), no weight decay.
    pub fn new(lr: impl Into<Schedule>) -> Lion {
        Lion { core: Core::new(lr.into()), betas: (0.9, 0.99), weight_decay: 0.0 }
    }
}

impl Optimizer for Lion {
    core_methods!();
    fn apply_gradients<T: Tree>(&mut self, gradients: &T, parameters: &T) -> T {
        let ((b1, b2), wd) = (self.betas, self.weight_decay);
        self.core.apply(
            gradients,
            parameters,
            |p| BTreeMap::from([("m", zeros(p))]),
            |g, p, lr, _, st| {
                let m = &st["m"];
                let c = &(m * b1) + &(g * (1.0 - b1));
                st.insert("m", &(m * b2) + &(g * (1.0 - b2)));
                let p = if wd > 0.0 { p * (1.0 - lr * wd) } else { p.clone() };
                &p - &(&c.sign() * lr)
            },
        )
    }
    state_methods!(&["m"]);
}

/// The gradients scaled so that their global norm is at most `max_norm`, and that norm
/// (MLX's `clip_grad_norm`): float16 squares are summed in float32; each leaf keeps its dtype.
pub fn clip_grad_norm<T: Tree>(grads: &T, max_norm: f32) -> (T, Array) {
    let leaves = grads.flatten();
    let mut total = Array::scalar(0.0, DType::F32);
    for g in &leaves {
        let g = if g.dtype() == DType::F16 { g.astype(DType::F32) } else { g.clone() };
        total = &total + &g.square().sum(..);
    }
    let norm = total.sqrt();
    let normalizer = nuvec_core::ops::minimum(&(max_norm / &(&norm + 1e-6)), 1.0);
    let clipped = leaves
        .iter()
        .map(|g| if g.dtype().is_float() { (g * &normalizer).astype(g.dtype()) } else { g * &normalizer })
        .collect();
    (grads.with_leaves(clipped), norm)
}

/// Adafactor (MLX's `Adafactor`): second moments factored into row and column means for
/// matrices, updates clipped by their RMS, a step size relative to the step and the
/// parameter's RMS by default.
pub struct Adafactor {
    core: Core,
    /// Added to the squared gradient, and the least parameter scale.
    pub eps: (f32, f32),
    /// The largest RMS of an update before scaling.
    pub clip_threshold: f32,
    /// The second moment's decay exponent: `β₂ = 1 − step^decay_rate`.
    pub decay_rate: f32,
    /// A first moment with this rate, if any.
    pub beta_1: Option<f32>,
    /// Decoupled weight decay.
    pub weight_decay: f32,
    /// Scale the step by the parameter's RMS.
    pub scale_parameter: bool,
    /// Step size `min(1e-2, 1/√step)` instead of the learning rate.
    pub relative_step: bool,
    /// With `relative_step`, start from `1e-6 · step` instead of `1e-2`.
    pub warmup_init: bool,
}

impl Adafactor {
    /// MLX's defaults: relative step sizes (no learning rate), eps (1e-30, 1e-3), clipping at
    /// 1, decay exponent −0.8, no first moment, no weight decay.
    pub fn new() -> Adafactor {
        Adafactor {
            core: Core::new(Schedule::Constant(0.0)),
            eps: (1e-30, 1e-3),
            clip_threshold: 1.0,
            decay_rate: -0.8,
            beta_1: None,
            weight_decay: 0.0,
            scale_parameter: true,
            relative_step: true,
            warmup_init: false,
        }
    }

    /// With the learning rate (or schedule) `lr` in place of relative step sizes.
    pub fn with_learning_rate(lr: impl Into<Schedule>) -> Adafactor {
        Adafactor { core: Core::new(lr.into()), relative_step: false, ..Adafactor::new() }
    }
}

impl Default for Adafactor {
    fn default() -> Adafactor {
        Adafactor::new()
    }
}

impl Optimizer for Adafactor {
    core_methods!();
    fn apply_gradients<T: Tree>(&mut self, gradients: &T, parameters: &T) -> T {
        let (eps, clip, decay, beta_1, wd) =
            (self.eps, self.clip_threshold, self.decay_rate, self.beta_1, self.weight_decay);
        let (scale_parameter, relative, warmup) = (self.scale_parameter, self.relative_step, self.warmup_init);
        self.core.apply(
            gradients,
            parameters,
            |p| {
                let mut st = BTreeMap::new();
                let sh = p.shape();
                if sh.len() >= 2 {
                    st.insert("exp_avg_sq_row", nuvec_core::ops::zeros(&sh[..sh.len() - 1], p.dtype()));
                    let col: Vec<i32> = sh[..sh.len() - 2].iter().chain(&sh[sh.len() - 1..]).copied().collect();
                    st.insert("exp_avg_sq_col", nuvec_core::ops::zeros(col, p.dtype()));
                } else {
                    st.insert("exp_avg_sq", zeros(p));
                }
                if beta_1.is_some() {
                    st.insert("exp_avg", zeros(p));
                }
                st
            },
            |g, p, lr, step, st| {
                let rms = |x: &Array| x.square().mean(..).sqrt();
                let p_rms = rms(p);
                let size = if relative {
                    let min_step = if warmup { 1e-6 * step as f32 } else { 1e-2 };
                    Array::scalar(min_step.min(1.0 / (step as f32).sqrt()), p_rms.dtype())
                } else {
                    Array::scalar(lr, p_rms.dtype())
                };
                let lr = if scale_parameter { &p_rms.maximum(eps.1) * &size } else { size };
                let b2 = 1.0 - (step as f32).powf(decay);
                let sq = &g.square() + eps.0;
                let mut update = if g.ndim() >= 2 {
                    let row = &(&st["exp_avg_sq_row"] * b2) + &(&sq.mean(-1) * (1.0 - b2));
                    let col = &(&st["exp_avg_sq_col"] * b2) + &(&sq.mean(-2) * (1.0 - b2));
                    let r = (&row / &row.mean_keepdims(-1)).rsqrt();
                    let c = col.rsqrt();
                    st.insert("exp_avg_sq_row", row);
                    st.insert("exp_avg_sq_col", col);
                    &(&r.expand_dims(-1) * &c.expand_dims(-2)) * g
                } else {
                    let v = &(&st["exp_avg_sq"] * b2) + &(&sq * (1.0 - b2));
                    let u = &v.rsqrt() * g;
                    st.insert("exp_avg_sq", v);
                    u
                };
                update = &update / &(&rms(&update) / clip).maximum(1.0f32);
                update = &lr * &update;
                if let Some(b1) = beta_1 {
                    let e = &(&st["exp_avg"] * b1) + &(&update * (1.0 - b1));
                    st.insert("exp_avg", e.clone());
                    update = e;
                }
                let p = if wd != 0.0 { p + &(p * &(&lr * -wd)) } else { p.clone() };
                &p - &update
            },
        )
    }
    state_methods!(&["exp_avg_sq_row", "exp_avg_sq_col", "exp_avg_sq", "exp_avg"]);
}
