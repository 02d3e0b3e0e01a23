//! The gated delta rule (Gated DeltaNet's recurrence), as in mlx-lm's `gated_delta.py`.
//!
//! Per batch row and value head, with a state `S` of `[Dv, Dk]` and each step's `q`, `k`
//! (`[Dk]`), `v` (`[Dv]`), gate `g` (a scalar, or `[Dk]` per key channel) and `beta`:
//! `S ← g·S; δ = β(v − S k); S ← S + δ kᵀ; y = S q`. Value head `h` reads the query and key
//! head `h / (Hv / Hk)` (grouped heads). The recurrence runs in `float32`.
//!
//! One primitive ([`FastOp::GatedDelta`]): a backend runs it as one kernel, and its composition,
//! a loop over the steps, is the reference, the fallback and what derivatives and batching
//! differentiate. Its derivative where only the last state is returned is a primitive too
//! ([`FastOp::GatedDeltaVjp`]), so that a backend may run it as kernels of its own (the CUDA
//! backend's chunked backward); its composition is the composition's derivative.

use crate::array::Array;
use crate::dtype::DType;
use crate::ops;

use super::{FastOp, GatedDeltaParams, record};

/// Options of [`gated_delta_with`] and [`gated_delta_steps_with`].
#[derive(Clone, Debug, Default)]
pub struct StepOptions {
    /// The dtype the returned state (or states) is stored in: `float32`, `float16` or
    /// `bfloat16`. `None`: the given state's dtype (`float32` without one) for
    /// [`gated_delta_with`], `float32` for [`gated_delta_steps_with`].
    pub storage: Option<DType>,
    /// A `[B, T]` boolean mask: where it is false the step leaves the state as it is and its
    /// output is zero (padding in a batch of prompts of different lengths).
    pub mask: Option<Array>,
}

/// One gated delta rule scan over `T` steps: returns `(y, state')` with `y` `[B, T, Hv, Dv]` in
/// `q`'s dtype and `state'` `[B, Hv, Dv, Dk]` in `state`'s dtype (`float32` when `state` is
/// `None`, which starts from zeros).
///
/// `q`, `k`: `[B, T, Hk, Dk]`; `v`: `[B, T, Hv, Dv]` with `Hv` a multiple of `Hk`; `g`:
/// `[B, T, Hv]` (a decay per head) or `[B, T, Hv, Dk]` (per key channel); `beta`: `[B, T, Hv]`;
/// `state`: `[B, Hv, Dv, Dk]`. Gates and states are `float32`, `float16` or `bfloat16`. A
/// shape or dtype that does not fit gives a failed array naming the argument.
///
/// Running a prompt in pieces, each starting from the state the last one returned, equals
/// running it whole.
///
/// ```
/// use nuvec::{DType, fast, ops};
/// let (b, t, h, d) = (1, 3, 2, 4);
/// let q = ops::ones(&[b, t, h, d], DType::F32) * 0.5;
/// let k = ops::ones(&[b, t, h, d], DType::F32) * 0.5;
/// let v = ops::ones(&[b, t, h, d], DType::F32);
/// let g = ops::ones(&[b, t, h], DType::F32) * 0.9;
/// let beta = ops::ones(&[b, t, h], DType::F32) * 0.5;
/// let (y, state) = fast::gated_delta(&q, &k, &v, &g, &beta, None);
/// assert_eq!(y.shape(), &[1, 3, 2, 4]);
/// assert_eq!(state.shape(), &[1, 2, 4, 4]);
/// // First step from zeros: S = β v kᵀ, y = S q = β v (k·q) = 0.5 · 1 · 1.
/// assert!((y.i((0, 0, 0, 0)).item::<f32>().unwrap() - 0.5).abs() < 1e-6);
/// ```
#[track_caller]
pub fn gated_delta(q: &Array, k: &Array, v: &Array, g: &Array, beta: &Array, state: Option<&Array>) -> (Array, Array) {
    gated_delta_with(q, k, v, g, beta, state, &StepOptions::default())
}

/// [`gated_delta`] with a mask and the returned state's dtype ([`StepOptions`]).
#[track_caller]
pub fn gated_delta_with(
    q: &Array,
    k: &Array,
    v: &Array,
    g: &Array,
    beta: &Array,
    state: Option<&Array>,
    options: &StepOptions,
) -> (Array, Array) {
    scan(false, q, k, v, g, beta, state, options)
}

/// [`gated_delta`] returning the state after every step, `[B, T, Hv, Dv, Dk]` (`float32`), in
/// place of the last one: step `i`'s state is where a speculative decode rolls back to when
/// the tokens after `i` are rejected.
///
/// ```
/// use nuvec::{DType, fast, ops};
/// let q = ops::ones(&[1, 2, 1, 4], DType::F32) * 0.5;
/// let v = ops::ones(&[1, 2, 1, 4], DType::F32);
/// let g = ops::ones(&[1, 2, 1], DType::F32);
/// let (_, last) = fast::gated_delta(&q, &q, &v, &g, &g, None);
/// let (_, states) = fast::gated_delta_steps(&q, &q, &v, &g, &g, None);
/// assert_eq!(states.shape(), &[1, 2, 1, 4, 4]);
/// assert_eq!(states.i((.., 1)).to_vec::<f32>().unwrap(), last.to_vec::<f32>().unwrap());
/// ```
#[track_caller]
pub fn gated_delta_steps(
    q: &Array,
    k: &Array,
    v: &Array,
    g: &Array,
    beta: &Array,
    state: Option<&Array>,
) -> (Array, Array) {
    let options = StepOptions { storage: Some(DType::F32), mask: None };
    gated_delta_steps_with(q, k, v, g, beta, state, &options)
}

/// [`gated_delta_steps`] with the states stored in `options.storage` (`float32` when `None`,
/// `float16` or `bfloat16` to halve them) and an optional mask.
#[track_caller]
pub fn gated_delta_steps_with(
    q: &Array,
    k: &Array,
    v: &Array,
    g: &Array,
    beta: &Array,
    state: Option<&Array>,
    options: &StepOptions,
) -> (Array, Array) {
    let options = StepOptions { storage: Some(options.storage.unwrap_or(DType::F32)), mask: options.mask.clone() };
    scan(true, q, k, v, g, beta, state, &options)
}

#[track_caller]
#[allow(clippy::too_many_arguments)]
fn scan(
    steps: bool,
    q: &Array,
    k: &Array,
    v: &Array,
    g: &Array,
    beta: &Array,
    state: Option<&Array>,
    options: &StepOptions,
) -> (Array, Array) {
    let state = match state {
        Some(s) => s.clone(),
        None => {
            // Zeros of [B, Hv, Dv, Dk]; bad shapes are reported by the shape rule below.
            let (qs, vs) = (q.shape(), v.shape());
            let shape =
                if qs.len() == 4 && vs.len() == 4 { vec![qs[0], vs[2], vs[3], qs[3]] } else { vec![0, 0, 0, 0] };
            ops::zeros(&shape[..], DType::F32)
        }
    };
    let storage = options.storage.unwrap_or(state.dtype());
    let params = GatedDeltaParams { steps, storage, masked: options.mask.is_some() };
    let mut inputs = vec![q.clone(), k.clone(), v.clone(), g.clone(), beta.clone(), state];
    inputs.extend(options.mask.clone());
    let mut outs = record(FastOp::GatedDelta(params), inputs, 2);
    let states = outs.pop().expect("two outputs");
    (outs.pop().expect("two outputs"), states)
}

/// The composition of [`FastOp::GatedDeltaVjp`]: the composition's derivative with respect to
/// `[q, k, v, g, beta, state]` at the cotangents `[dy, dstate']`.
pub(super) fn vjp_composition(p: &GatedDeltaParams, inputs: &[Array]) -> Vec<Array> {
    let n = 6 + p.masked as usize;
    let mask = inputs[6..n].to_vec();
    let forward = *p;
    let f = move |xs: &[Array]| {
        let mut all = xs.to_vec();
        all.extend(mask.iter().cloned());
        Ok(composition(&forward, &all))
    };
    match crate::transforms::vjp_flat(f, &inputs[..6], &inputs[n..]) {
        Ok((_, d)) => d,
        Err(e) => vec![Array::from_error(e); 6],
    }
}

/// The recurrence as ordinary operations, one step after another, in `float32`: `[y, state']`
/// (or `[y, states]`).
pub(super) fn composition(p: &GatedDeltaParams, inputs: &[Array]) -> Vec<Array> {
    let f32 = |a: &Array| a.astype(DType::F32);
    let (q, k, v, g, beta) = (&inputs[0], &inputs[1], &inputs[2], &inputs[3], &inputs[4]);
    let mask = p.masked.then(|| &inputs[6]);
    let (b, t, hk, dk) = (q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]);
    let (hv, dv) = (v.shape()[2], v.shape()[3]);
    let groups = hv / hk;
    // Query and key heads repeated for their value heads: [B, T, Hv, Dk].
    let by_value_head =
        |x: &Array| f32(x).reshape([b, t, hk, 1, dk]).broadcast_to([b, t, hk, groups, dk]).reshape([b, t, hv, dk]);
    let (q, k, v, beta) = (by_value_head(q), by_value_head(k), f32(v), f32(beta));
    let g = f32(g);
    let channel_gate = g.ndim() == 4;
    let mut s = f32(&inputs[5]);
    let (mut ys, mut states) = (Vec::with_capacity(t as usize), Vec::new());
    for i in 0..t {
        let q_i = q.i((.., i)).expand_dims(2); // [B, Hv, 1, Dk]
        let k_i = k.i((.., i)).expand_dims(2);
        let g_i = if channel_gate { g.i((.., i)).expand_dims(2) } else { g.i((.., i)).reshape([b, hv, 1, 1]) };
        let decayed = &s * g_i;
        let kv_mem = (&decayed * &k_i).sum(-1); // [B, Hv, Dv]
        let delta = (v.i((.., i)) - kv_mem) * beta.i((.., i)).expand_dims(-1);
        let next = decayed + delta.expand_dims(-1) * &k_i;
        let y = (&next * q_i).sum(-1);
        match mask {
            Some(m) => {
                let keep = m.i((.., i));
                s = ops::where_(keep.reshape([b, 1, 1, 1]), &next, &s);
                ys.push(ops::where_(keep.reshape([b, 1, 1]), &y, 0.0f32));
            }
            None => {
                s = next;
                ys.push(y);
            }
        }
        if p.steps {
            states.push(s.astype(p.storage));
        }
    }
    let y = if ys.is_empty() { ops::zeros(&[b, 0, hv, dv][..], q.dtype()) } else { ops::stack(&ys, 1) };
    let y = y.astype(inputs[0].dtype());
    let given = &inputs[5];
    let states = if !p.steps && t > 0 && given.dtype() == p.storage {
        // Written over the given state: in place where this is its only handle (a recorded
        // decode step then replays over the same buffer), a copy otherwise.
        let shape = given.shape().to_vec();
        given.slice_update(s.astype(p.storage), &[0; 4], &shape, &[1; 4])
    } else if !p.steps {
        s.astype(p.storage)
    } else if states.is_empty() {
        ops::zeros(&[b, 0, hv, dv, dk][..], p.storage)
    } else {
        ops::stack(&states, 1)
    };
    vec![y, states]
}
