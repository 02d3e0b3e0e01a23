//! Scaled-dot-product attention: its options, the operation, and its composition.
//!
//! [`plan_attention`](super::plan_attention) chooses how each call runs; this file records the
//! planned kernel or builds the planned composition. The composition follows MLX's: `q`
//! scaled in its dtype, scores from a product in that dtype, a softmax with `float32`
//! statistics, masked scores set to the dtype's lowest finite value (a query whose every key
//! is masked out averages the values, as in MLX). A causal query before the first key (more
//! queries than keys) attends nothing and gives zeros, in every plan.

use crate::array::Array;
use crate::dtype::DType;
use crate::error::{Error, OpErrorKind};
use crate::ops::{self, propagate};
use crate::primitive::fast::{AttentionKernel, AttentionParams, MaskInput};

use super::{FastOp, plan_attention, record};

/// Which keys each query attends, besides its window.
#[derive(Clone, Copy, Debug, Default)]
pub enum AttentionMask<'a> {
    /// Every key.
    #[default]
    None,
    /// Keys up to the query's own position, the queries being the last `Lq` of the `Lk`
    /// positions: query `i` attends keys `0..=i + Lk − Lq`.
    Causal,
    /// An array broadcastable to `[B, Hq, Lq, Lk]`: booleans (`true` attends) or values added
    /// to the scaled scores.
    Array(&'a Array),
}

/// The options of [`scaled_dot_product_attention`]: mask, sinks, window and a cap on memory.
/// The one options type of attention: new features extend it.
///
/// ```
/// use nuvec::fast::AttentionOptions;
/// let o = AttentionOptions::causal().window(128).max_score_bytes(64 << 20);
/// assert_eq!(o.window, Some(128));
/// ```
#[non_exhaustive]
#[derive(Clone, Copy, Debug, Default)]
pub struct AttentionOptions<'a> {
    /// Which keys each query attends.
    pub mask: AttentionMask<'a>,
    /// Per-head logits `[Hq]` that join each softmax's denominator but attend to nothing.
    pub sinks: Option<&'a Array>,
    /// Each query attends at most this many keys: its own position and the `window − 1`
    /// before it (keys `i + Lk − Lq − window < j ≤ i + Lk − Lq`). Implies the causal bound.
    pub window: Option<i32>,
    /// No intermediate of the size of the scores exceeds this many bytes.
    pub max_score_bytes: Option<usize>,
}

impl<'a> AttentionOptions<'a> {
    /// Causal attention.
    pub fn causal() -> Self {
        AttentionMask::Causal.into()
    }

    /// With an array mask (boolean, or additive) broadcastable to `[B, Hq, Lq, Lk]`.
    pub fn mask(self, mask: &'a Array) -> Self {
        AttentionOptions { mask: AttentionMask::Array(mask), ..self }
    }

    /// With per-head sink logits `[Hq]` (or none).
    pub fn sinks(self, sinks: impl Into<Option<&'a Array>>) -> Self {
        AttentionOptions { sinks: sinks.into(), ..self }
    }

    /// With a sliding window of `keys` keys per query (causal).
    pub fn window(self, keys: i32) -> Self {
        AttentionOptions { window: Some(keys), ..self }
    }

    /// With no score-sized intermediate above `bytes`.
    pub fn max_score_bytes(self, bytes: usize) -> Self {
        AttentionOptions { max_score_bytes: Some(bytes), ..self }
    }

    /// Whether queries see only keys up to their own position.
    pub(crate) fn is_causal(&self) -> bool {
        matches!(self.mask, AttentionMask::Causal) || self.window.is_some()
    }

    /// The array mask, if any.
    pub(crate) fn mask_array(&self) -> Option<&'a Array> {
        match self.mask {
            AttentionMask::Array(m) => Some(m),
            _ => None,
        }
    }
}

impl<'a> From<AttentionMask<'a>> for AttentionOptions<'a> {
    fn from(mask: AttentionMask<'a>) -> Self {
        AttentionOptions { mask, ..Default::default() }
    }
}

/// Attention of queries `q [B, Hq, Lq, D]` over keys `k [B, Hkv, Lk, D]` and values
/// `v [B, Hkv, Lk, Dv]`: `softmax(scale · q·kᵀ + mask) · v`, as MLX's
/// `mx.fast.scaled_dot_product_attention`, in `q`'s dtype (`float32`, `float16`, `bfloat16`
/// or `float64`; `k` and `v` the same). Grouped queries (`Hq` a multiple of `Hkv`) share their
/// key-value head without copying it; `q`, `k` and `v` may be any views (a slice of a cache).
///
/// [`plan_attention`] says how it runs: a kernel of the device (a vector kernel for up to 8
/// queries, a tiled one for more), or the composition of ordinary operations — all rows at
/// once, or blocks of rows so that no intermediate passes `max_score_bytes`. The composition
/// holds, per query row, `B · Hq · Lk'` scores (`Lk'` the keys the row's block may attend) in
/// `q`'s dtype, their probabilities, and with sinks a `float32` copy; `max_intermediate_bytes`
/// counts 4 bytes per score. With 2 to 8 causal queries the composition runs each row alone,
/// so every row is bit-identical to the same row decoded alone (speculative verification).
///
/// Bad arguments (rank other than 4, `Hq` not a multiple of `Hkv`, head sizes that differ, a
/// mask that does not broadcast, a window of 0, integer dtypes, a cap of 0 or below one row's
/// scores) give a failed array naming the argument.
///
/// ```
/// use nuvec::{DType, fast, random};
/// use nuvec::fast::AttentionOptions;
/// let key = random::key(0);
/// let q = random::normal([1, 4, 3, 16], DType::F32, 0.0, 1.0, Some(&key));
/// let k = random::normal([1, 2, 5, 16], DType::F32, 0.0, 1.0, Some(&random::key(1)));
/// let v = random::normal([1, 2, 5, 8], DType::F32, 0.0, 1.0, Some(&random::key(2)));
/// let o = fast::scaled_dot_product_attention(&q, &k, &v, 0.25, &AttentionOptions::causal());
/// assert_eq!(o.shape(), &[1, 4, 3, 8]);
/// // Each head's last query attends every key: plain softmax attention over all 5.
/// let plain = fast::scaled_dot_product_attention(&q, &k, &v, 0.25, &Default::default());
/// let (a, b): (Vec<f32>, Vec<f32>) = (o.to_vec().unwrap(), plain.to_vec().unwrap());
/// for h in 0..4 {
///     let last = (h * 3 + 2) * 8..(h * 3 + 3) * 8;
///     assert!(a[last.clone()].iter().zip(&b[last]).all(|(x, y)| (x - y).abs() < 1e-6));
/// }
/// ```
///
/// [`plan_attention`]: super::plan_attention
#[track_caller]
pub fn scaled_dot_product_attention(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f32,
    options: &AttentionOptions<'_>,
) -> Array {
    let mut given = vec![q, k, v];
    given.extend(options.mask_array());
    given.extend(options.sinks);
    if let Some(f) = propagate(&given) {
        return f;
    }
    for (name, x) in [("k", k), ("v", v)] {
        if x.dtype() != q.dtype() {
            let msg = format!("{name} must have q's dtype {:?}, got {:?}", q.dtype(), x.dtype());
            return Array::failed("scaled_dot_product_attention", OpErrorKind::InvalidArgument(msg));
        }
    }
    let plan = match plan_attention(q.shape(), k.shape(), v.shape(), q.dtype(), options) {
        Ok(p) => p,
        Err(Error::Op { kind, .. }) => return Array::failed("scaled_dot_product_attention", kind),
        Err(e) => return Array::from_error(e),
    };
    let parts = Parts { q, k, v, scale, options };
    match plan.kernel {
        AttentionKernel::Composed => parts.rows(0, q.shape()[2]),
        AttentionKernel::ComposedBlocks { rows } => parts.blocks(rows),
        kernel => {
            let params = params(options, scale, kernel);
            let n = 1 + params.lse as usize;
            let mut outs = record(FastOp::Attention(params), given.into_iter().cloned().collect(), n);
            if params.lse {
                // The fused backward reads it; the caller never holds it.
                crate::transforms::keep_for_transforms(&outs[1]);
            }
            outs.remove(0)
        }
    }
}

/// The parameters recording `kernel` for `options`. While a transform traces (only a
/// derivative reads it), the tiled kernel also outputs the rows' log-sum-exp where the fused
/// backward covers the options (no array mask, no sinks).
pub(super) fn params(options: &AttentionOptions<'_>, scale: f32, kernel: AttentionKernel) -> AttentionParams {
    let mask =
        options.mask_array().map(|m| if m.dtype() == DType::Bool { MaskInput::Bool } else { MaskInput::Additive });
    let sinks = options.sinks.is_some();
    let lse = kernel == AttentionKernel::Tiled && mask.is_none() && !sinks && crate::transforms::tracing();
    AttentionParams { scale, causal: options.is_causal(), window: options.window, mask, sinks, kernel, lse }
}

/// The composition of a recorded attention (the fallback of its kernel, and what defines its
/// derivatives and batching): the rows one by one for 2 to 8 causal queries, else all at once;
/// with `lse`, also the rows' log-sum-exp.
pub(super) fn composition(p: &AttentionParams, inputs: &[Array]) -> Vec<Array> {
    let mut options = if p.causal { AttentionOptions::causal() } else { AttentionOptions::default() };
    options.window = p.window;
    if p.mask.is_some() {
        options = options.mask(&inputs[3]);
    }
    if p.sinks {
        options = options.sinks(&inputs[inputs.len() - 1]);
    }
    let parts = Parts { q: &inputs[0], k: &inputs[1], v: &inputs[2], scale: p.scale, options: &options };
    let lq = inputs[0].shape()[2];
    let out = if p.causal && (2..=8).contains(&lq) { parts.blocks(1) } else { parts.rows(0, lq) };
    if p.lse { vec![out, parts.lse()] } else { vec![out] }
}

/// The cotangents of an attention whose kernel gave its rows' log-sum-exp: inputs
/// `[q, k, v, out, lse, g]`. The fused backward where the backend has it, else the
/// composition's derivative.
pub(super) fn vjp(p: &AttentionParams, x: &[Array], y: &[Array], g: &Array) -> Vec<Array> {
    let inputs = vec![x[0].clone(), x[1].clone(), x[2].clone(), y[0].clone(), y[1].clone(), g.clone()];
    record(FastOp::AttentionVjp(*p), inputs, 3)
}

/// The composition of [`FastOp::AttentionVjp`]: the composition's derivative with respect to
/// `q`, `k` and `v` (the forward's outputs are not needed).
pub(super) fn vjp_composition(p: &AttentionParams, inputs: &[Array]) -> Vec<Array> {
    let forward = AttentionParams { lse: false, ..*p };
    let f = move |xs: &[Array]| Ok(composition(&forward, xs));
    match crate::transforms::vjp_flat(f, &inputs[..3], &inputs[5..6]) {
        Ok((_, d)) => d,
        Err(e) => vec![Array::from_error(e); 3],
    }
}

/// The lowest finite value of `d`, which masked scores take.
fn lowest(d: DType) -> f64 {
    match d {
        DType::F16 => -65504.0,
        DType::BF16 => -3.3895313892515355e38,
        DType::F64 => f64::MIN,
        _ => f32::MIN as f64,
    }
}

/// One attention's arguments.
struct Parts<'a, 'o> {
    q: &'a Array,
    k: &'a Array,
    v: &'a Array,
    scale: f32,
    options: &'a AttentionOptions<'o>,
}

impl Parts<'_, '_> {
    /// The composition per block of `rows` query rows, joined along the query axis.
    fn blocks(&self, rows: i32) -> Array {
        let lq = self.q.shape()[2];
        let rows = rows.max(1);
        let outs: Vec<Array> = (0..lq).step_by(rows as usize).map(|r0| self.rows(r0, (r0 + rows).min(lq))).collect();
        if outs.len() == 1 { outs.into_iter().next().unwrap_or_default() } else { ops::concatenate(&outs, 2) }
    }

    /// Each row's log-sum-exp of its scaled, masked scores in `float32` `[B, Hq, Lq]` (`-inf`
    /// for a row with no key), as the tiled kernel gives it: products of the inputs in `float32`.
    /// Causal bounds and windows only (the options of a kernel that outputs it).
    fn lse(&self) -> Array {
        let [b, hq, lq, d] = [0, 1, 2, 3].map(|i| self.q.shape()[i]);
        let [hkv, lk] = [self.k.shape()[1], self.k.shape()[2]];
        let wide = |x: &Array| x.astype(DType::F32);
        let q = wide(self.q).reshape([b, hkv, (hq / hkv) * lq, d]);
        let s = (q.matmul(&wide(self.k).swapaxes(-1, -2)) * self.scale).reshape([b, hkv, hq / hkv, lq, lk]);
        let s = match self.allowed(0, lq, 0, lk) {
            Some(allowed) => ops::where_(&allowed, &s, f32::NEG_INFINITY),
            None => s,
        };
        s.logsumexp(-1).reshape([b, hq, lq])
    }

    /// Which of keys `lo..hi` each query row `r0..r1` may attend under the causal bound and the
    /// window, `[rows, keys]`: row `i` sees keys `j ≤ i + Lk − Lq`, and with a window
    /// `j > i + Lk − Lq − w`. `None` when the bounds exclude none of them.
    fn allowed(&self, r0: i32, r1: i32, lo: i32, hi: i32) -> Option<Array> {
        if !self.options.is_causal() {
            return None;
        }
        let off = self.k.shape()[2] - self.q.shape()[2];
        let pos = ops::arange_dtype(r0 + off, r1 + off, 1, DType::I32).reshape([r1 - r0, 1]);
        let keys = ops::arange_dtype(lo, hi, 1, DType::I32).reshape([1, hi - lo]);
        let excluded_late = hi - 1 > r0 + off;
        let excluded_early = self.options.window.is_some_and(|w| lo <= r1 - 1 + off - w);
        match (excluded_late, excluded_early, self.options.window) {
            (true, true, Some(w)) => Some(keys.less_equal(&pos).logical_and(keys.greater(pos - w))),
            (true, _, _) => Some(keys.less_equal(&pos)),
            (false, true, Some(w)) => Some(keys.greater(pos - w)),
            _ => None,
        }
    }

    /// The composition for query rows `r0..r1`, reading only the keys they may attend.
    fn rows(&self, r0: i32, r1: i32) -> Array {
        let [b, hq, lq, d] = [0, 1, 2, 3].map(|i| self.q.shape()[i]);
        let [hkv, lk, dv] = [self.k.shape()[1], self.k.shape()[2], self.v.shape()[3]];
        let (g, n, off) = (hq / hkv, r1 - r0, lk - lq);
        let causal = self.options.is_causal();
        // Keys the rows may attend: up to the last row's position, from the first row's window.
        let hi = if causal { (r1 - 1 + off + 1).clamp(0, lk) } else { lk };
        let lo = match (causal, self.options.window) {
            (true, Some(w)) => (r0 + off - w + 1).clamp(0, hi),
            _ => 0,
        };
        let nk = hi - lo;
        let dtype = self.q.dtype();
        let whole = |x: &Array, a: i32, z: i32, axis: usize| {
            if a == 0 && z == x.shape()[axis] {
                x.clone()
            } else {
                let (mut start, mut stop) = ([0; 4], [x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3]]);
                (start[axis], stop[axis]) = (a, z);
                x.slice(&start, &stop, &[1; 4])
            }
        };
        let q = whole(self.q, r0, r1, 2);
        let (k, v) = (whole(self.k, lo, hi, 2), whole(self.v, lo, hi, 2));
        if nk == 0 {
            // No key to attend (more causal queries than keys): zeros.
            return ops::zeros([b, hq, n, dv], dtype);
        }
        let qs = (&q * self.scale).astype(dtype).reshape([b, hkv, g * n, d]);
        let mut s = qs.matmul(&k.swapaxes(-1, -2)).reshape([b, hkv, g, n, nk]);
        let low = lowest(s.dtype());
        if let Some(allowed) = self.allowed(r0, r1, lo, hi) {
            s = ops::where_(&allowed, &s, low);
        }
        if let Some(m) = self.options.mask_array() {
            let m4 = m.reshape(broadcast_dims(m.shape()));
            let [mb, mh, ml, mk] = [0, 1, 2, 3].map(|i| m4.shape()[i]);
            let m4 = if ml == 1 { m4 } else { whole(&m4, r0, r1, 2) };
            let m4 = if mk == 1 { m4 } else { whole(&m4, lo, hi, 3) };
            let (ml, mk) = (m4.shape()[2], m4.shape()[3]);
            let m5 = if mh == 1 { m4.reshape([mb, 1, 1, ml, mk]) } else { m4.reshape([mb, hkv, g, ml, mk]) };
            s = if m.dtype() == DType::Bool { ops::where_(&m5, &s, low) } else { s + m5 };
        }
        let p = match self.options.sinks {
            Some(sinks) => {
                let wide = if dtype == DType::F64 { DType::F64 } else { DType::F32 };
                let s = s.astype(wide);
                let sink = sinks.astype(wide).reshape([1, hkv, g, 1, 1]);
                let lse = ops::logaddexp(s.logsumexp_keepdims(-1), sink);
                (s - lse).exp().astype(dtype)
            }
            None => s.softmax(-1).astype(dtype),
        };
        let out = p.reshape([b, hkv, g * n, nk]).matmul(&v).reshape([b, hq, n, dv]);
        if causal && r0 + off < 0 {
            // Rows before the first key (more causal queries than keys) attend nothing: zeros.
            let seen = ops::arange_dtype(r0 + off, r1 + off, 1, DType::I32).reshape([n, 1]).greater_equal(0);
            ops::where_(&seen, &out, 0.0)
        } else {
            out
        }
    }
}

/// `shape` with leading 1s to four axes.
fn broadcast_dims(shape: &[i32]) -> [i32; 4] {
    let mut out = [1; 4];
    out[4 - shape.len()..].copy_from_slice(shape);
    out
}
