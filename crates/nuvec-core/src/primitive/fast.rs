//! Fused operations' primitive ([`FastOp`]): what each one is, its parameters, and its shape
//! and dtype rule. The operations that record them, their compositions and their derivatives
//! live in [`crate::fast`].
//!
//! Norm semantics are MLX's: statistics in `float32`, the normalised row cast to the output
//! dtype (`x`'s promoted with the weight's) before the weight multiplies it and the bias is added.

use crate::dtype::{DType, promote_types};
use crate::error::OpErrorKind;
use crate::primitive::QuantMode;
use crate::storage::Spec;

/// A fused operation recorded in the graph.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum FastOp {
    /// Softmax over the last axis; statistics in `float32` for half-precision inputs.
    Softmax,
    /// `log(sum(exp(x)))` over the last axis, kept with size 1; accumulates in `float32`.
    LogSumExp,
    /// [`rms_norm`](crate::fast::rms_norm): inputs `[x, weight?]`.
    RmsNorm {
        /// Added to the mean square.
        eps: f32,
        /// Whether a weight is the second input.
        weighted: bool,
    },
    /// [`add_rms_norm`](crate::fast::add_rms_norm): inputs `[x, residual, weight?]`, outputs `[x + residual, y]`.
    AddRmsNorm {
        /// Added to the mean square.
        eps: f32,
        /// Whether a weight is the third input.
        weighted: bool,
    },
    /// [`layer_norm`](crate::fast::layer_norm): inputs `[x, weight?, bias?]`.
    LayerNorm {
        /// Added to the variance.
        eps: f32,
        /// Whether a weight follows `x`.
        weighted: bool,
        /// Whether a bias comes last.
        biased: bool,
    },
    /// [`rope`](crate::fast::rope): inputs `[x, offset, freqs?]`.
    Rope(RopeParams),
    /// [`swiglu`](crate::fast::swiglu): inputs `[gate, up]`.
    SwiGlu,
    /// [`cross_entropy`](crate::fast::cross_entropy): inputs `[logits, targets]`, output the `float32` loss per row.
    CrossEntropy,
    /// The RMS norm's cotangents: inputs `[x, weight?, g]`, outputs `[gx, gweight?]`
    /// (`gweight` summed over rows in `float32`, rounded to the weight's dtype).
    RmsNormVjp {
        /// The forward's epsilon.
        eps: f32,
        /// Whether the forward had a weight.
        weighted: bool,
    },
    /// The layer norm's cotangents: inputs `[x, weight?, g]`, outputs `[gx, gweight?, gbias?]`.
    LayerNormVjp {
        /// The forward's epsilon.
        eps: f32,
        /// Whether the forward had a weight.
        weighted: bool,
        /// Whether the forward had a bias.
        biased: bool,
    },
    /// SwiGLU's cotangents: inputs `[gate, up, g]`, outputs `[dgate, dup]`.
    SwiGluVjp,
    /// The cross entropy's cotangent of the logits: inputs `[logits, targets, g, loss]` (the
    /// loss gives the kernel each row's log-sum-exp without a second pass).
    CrossEntropyVjp,
    /// [`adam_step`](crate::fast::adam_step): one Adam update of a parameter, inputs
    /// `[p, g, m, v]` of one shape and float dtype, outputs `[p', m', v']`.
    AdamStep(AdamParams),
    /// The loss and the cotangent of the logits at once: inputs `[logits, targets, g]`, outputs
    /// `[loss, dlogits]`. No operation records it: evaluation runs a pending [`cross_entropy`](crate::fast::cross_entropy)
    /// and the `CrossEntropyVjp` that consumes its loss as this one primitive when the backend
    /// has a kernel for it (one read of the logits instead of two).
    CrossEntropyWithGrad,
    /// [`scaled_dot_product_attention`](crate::fast::scaled_dot_product_attention) on a kernel
    /// of the backend: inputs `[q, k, v, mask?, sinks?]`, output `[B, Hq, Lq, Dv]` in `q`'s
    /// dtype, and with [`AttentionParams::lse`] each row's `float32` log-sum-exp `[B, Hq, Lq]`.
    /// Recorded only when [`plan_attention`](crate::fast::plan_attention) chose a kernel.
    Attention(AttentionParams),
    /// The attention's cotangents from its kernel's outputs: inputs `[q, k, v, out, lse, g]`,
    /// outputs `[dq, dk, dv]` in `q`'s dtype (FlashAttention-2's backward: the scores are
    /// recomputed tile by tile from the forward's log-sum-exp, never held whole).
    AttentionVjp(AttentionParams),
    /// [`quantized_matmul`](crate::ops::quantized_matmul) with a 2-D packed weight: inputs
    /// `[x, w, scales, biases?]`, output `x`'s leading shape followed by the product's columns.
    QuantizedMatmul(QuantMatmulParams),
    /// [`paged_attention`](crate::fast::paged_attention): inputs `[q, k_cache, v_cache,
    /// block_tables, lengths, sinks?]` (tables and lengths `int32`), output `[B, Hq, L, Dv]`
    /// in `q`'s dtype.
    PagedAttention(PagedParams),
    /// [`rms_norm_matmul`](crate::fast::rms_norm_matmul): inputs `[x, weight, b]` (`b`
    /// 2-D), output `rms_norm(x, weight) @ b`.
    RmsNormMatmul {
        /// Added to the mean square.
        eps: f32,
    },
    /// [`swiglu_matmul`](crate::fast::swiglu_matmul): inputs `[gate, up, b, c?]` (`b` 2-D),
    /// output `swiglu(gate, up) @ b`, plus `c` (of the output's shape) when `add`.
    SwiGluMatmul {
        /// Whether `c` is the last input.
        add: bool,
    },
    /// [`rope_kv_write`](crate::fast::rope_kv_write): inputs `[qkv, k_cache, v_cache, start,
    /// freqs?]`, outputs `[q, k_cache', v_cache']`; with `rows`
    /// ([`rope_kv_write_rows`](crate::fast::rope_kv_write_rows)), inputs `[qkv, k_pool, v_pool,
    /// start, rows, freqs?]`.
    RopeKvWrite {
        /// The rotation (`forward` always).
        rope: RopeParams,
        /// Query heads: the first of `qkv`'s heads; the rest are keys, then values, as many each.
        q_heads: i32,
        /// The keys and values go to the rows an input names, of pools seen as `[rows, D]`.
        rows: bool,
    },
    /// [`gated_delta`](crate::fast::gated_delta): inputs `[q, k, v, g, beta, state, mask?]`,
    /// outputs `[y, state']`, or `[y, states]` (every step's state) with
    /// [`GatedDeltaParams::steps`].
    GatedDelta(GatedDeltaParams),
    /// The derivative of a [`FastOp::GatedDelta`] that returns only the last state: inputs the
    /// forward's `[q, k, v, g, beta, state, mask?]` then the cotangents `[dy, dstate']`, outputs
    /// the cotangents `[dq, dk, dv, dg, dbeta, dstate]` of the first six.
    GatedDeltaVjp(GatedDeltaParams),
    /// [`gather_mm`](crate::ops::gather_mm) of one float dtype: inputs `[a, b, lhs, rhs]`, `a`
    /// `[Ba, M, K]` and `b` `[Bb, K, N]` stacks of matrices, `lhs` and `rhs` `[L]` (`int32` or
    /// `uint32`) picking one of each per output; output `[L, M, N]`, output `i` being
    /// `a[lhs[i]] @ b[rhs[i]]`. Indices wrap once when negative and are clamped, as `take`'s.
    GatherMm,
    /// [`gather_qmm`](crate::ops::gather_qmm): inputs `[x, w, scales, biases?, lhs, rhs]`, `x`
    /// `[Bx, M, K]`, the packed `w` and its scales and biases stacks of `[rows, words]` and
    /// `[rows, groups]` matrices, `lhs` and `rhs` `[L]` as [`FastOp::GatherMm`]'s; output `[L,
    /// M, N]` in the product's dtype.
    GatherQmm(QuantMatmulParams),
}

/// The parameters of a recorded [`FastOp::GatedDelta`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GatedDeltaParams {
    /// Whether the second output holds the state after every step, `[B, T, Hv, Dv, Dk]`,
    /// instead of the last one, `[B, Hv, Dv, Dk]`.
    pub steps: bool,
    /// The dtype the state outputs are stored in (the recurrence runs in `float32`).
    pub storage: DType,
    /// Whether a `[B, T]` boolean mask is the last input: a step whose mask is false leaves
    /// the state as it is and outputs zeros.
    pub masked: bool,
}

/// The parameters of a recorded [`FastOp::PagedAttention`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PagedParams {
    /// Multiplies `q·kᵀ`.
    pub scale: f32,
    /// The number of keys (its own included) each query attends, if bounded.
    pub window: Option<i32>,
    /// Whether the last input holds per-head sink logits `[Hq]`.
    pub sinks: bool,
    /// Key partitions per query row a kernel splits the longest sequence into
    /// ([`paged_blocks`](crate::fast::paged_blocks) of the table's capacity).
    pub blocks: i32,
}

/// The parameters of a recorded [`FastOp::QuantizedMatmul`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QuantMatmulParams {
    /// The weight's format.
    pub mode: QuantMode,
    /// Elements sharing a scale (and bias).
    pub group_size: i32,
    /// Bits per element.
    pub bits: i32,
    /// `x @ wᵀ` with `w` holding `[N, K]` (else `x @ w`, `w` holding `[K, N]`).
    pub transpose: bool,
    /// The product's dtype: `x`'s promoted with the scales' for affine, `x`'s otherwise.
    pub dtype: DType,
}

impl QuantMatmulParams {
    /// `(K, N)` of the product for a packed weight of shape `[rows, words]`.
    pub fn inner_outer(&self, w: &[i32]) -> (i32, i32) {
        let (rows, cols) = (w[0], (w[1] as i64 * 32 / self.bits as i64) as i32);
        if self.transpose { (cols, rows) } else { (rows, cols) }
    }
}

/// What an attention's mask input is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaskInput {
    /// Booleans: `true` attends.
    Bool,
    /// Added to the scaled scores.
    Additive,
}

/// The kernel that runs an attention, as [`plan_attention`](crate::fast::plan_attention)
/// chooses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AttentionKernel {
    /// One query row per block of threads, for at most 8 queries (decoding, speculative
    /// verification): one pass, or (`passes == 2`) the keys split in `blocks` partitions whose
    /// partial results a second pass combines.
    Vector {
        /// 1 or 2.
        passes: u8,
        /// Key partitions per query row (1 with one pass).
        blocks: i32,
    },
    /// Tiles of queries against tiles of keys with an online softmax; no scores in memory.
    Tiled,
    /// `softmax(scale·q·kᵀ + mask)·v` from ordinary operations, all rows at once.
    Composed,
    /// The composition per block of `rows` query rows, so no score-sized intermediate passes
    /// the cap; each block reads only the keys its rows may attend.
    ComposedBlocks {
        /// Query rows per block.
        rows: i32,
    },
}

/// The parameters of a recorded [`FastOp::Attention`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionParams {
    /// Multiplies `q·kᵀ`.
    pub scale: f32,
    /// Queries are the last `Lq` positions and attend keys up to their own.
    pub causal: bool,
    /// With `causal`, the number of keys (its own included) each query attends.
    pub window: Option<i32>,
    /// Whether the fourth input is a mask, and which kind.
    pub mask: Option<MaskInput>,
    /// Whether the last input holds per-head sink logits `[Hq]`.
    pub sinks: bool,
    /// The planned kernel.
    pub kernel: AttentionKernel,
    /// Whether the kernel also outputs each query row's log-sum-exp of its scaled, masked
    /// scores (`float32` `[B, Hq, Lq]`, `-inf` for a row with no key), from which the fused
    /// backward recomputes the probabilities.
    pub lse: bool,
}

impl FastOp {
    /// The operation's name.
    pub fn name(&self) -> &'static str {
        match self {
            FastOp::Softmax => "softmax",
            FastOp::LogSumExp => "logsumexp",
            FastOp::RmsNorm { .. } => "rms_norm",
            FastOp::AddRmsNorm { .. } => "add_rms_norm",
            FastOp::LayerNorm { .. } => "layer_norm",
            FastOp::Rope(_) => "rope",
            FastOp::SwiGlu => "swiglu",
            FastOp::SwiGluVjp => "swiglu_vjp",
            FastOp::CrossEntropy => "cross_entropy",
            FastOp::RmsNormVjp { .. } => "rms_norm_vjp",
            FastOp::LayerNormVjp { .. } => "layer_norm_vjp",
            FastOp::CrossEntropyVjp => "cross_entropy_vjp",
            FastOp::CrossEntropyWithGrad => "cross_entropy_with_grad",
            FastOp::Attention(_) => "scaled_dot_product_attention",
            FastOp::AttentionVjp(_) => "scaled_dot_product_attention_vjp",
            FastOp::AdamStep(_) => "adam_step",
            FastOp::QuantizedMatmul(_) => "quantized_matmul",
            FastOp::PagedAttention(_) => "paged_attention",
            FastOp::RmsNormMatmul { .. } => "rms_norm_matmul",
            FastOp::SwiGluMatmul { .. } => "swiglu_matmul",
            FastOp::RopeKvWrite { .. } => "rope_kv_write",
            FastOp::GatedDelta(p) if p.steps => "gated_delta_steps",
            FastOp::GatedDelta(_) => "gated_delta",
            FastOp::GatedDeltaVjp(_) => "gated_delta_vjp",
            FastOp::GatherMm => "gather_mm",
            FastOp::GatherQmm(_) => "gather_qmm",
        }
    }

    /// How many outputs the operation has, whatever its inputs: a failure still gives that many
    /// failed arrays.
    pub fn output_count(&self) -> usize {
        match self {
            FastOp::Softmax
            | FastOp::LogSumExp
            | FastOp::RmsNorm { .. }
            | FastOp::LayerNorm { .. }
            | FastOp::Rope(_)
            | FastOp::SwiGlu
            | FastOp::CrossEntropy
            | FastOp::CrossEntropyVjp
            | FastOp::QuantizedMatmul(_)
            | FastOp::PagedAttention(_)
            | FastOp::RmsNormMatmul { .. }
            | FastOp::SwiGluMatmul { .. }
            | FastOp::GatherMm
            | FastOp::GatherQmm(_) => 1,
            FastOp::AddRmsNorm { .. } | FastOp::SwiGluVjp | FastOp::CrossEntropyWithGrad | FastOp::GatedDelta(_) => 2,
            FastOp::RmsNormVjp { weighted, .. } => 1 + *weighted as usize,
            FastOp::LayerNormVjp { weighted, biased, .. } => 1 + *weighted as usize + *biased as usize,
            FastOp::Attention(p) => 1 + p.lse as usize,
            FastOp::AttentionVjp(_) | FastOp::AdamStep(_) | FastOp::RopeKvWrite { .. } => 3,
            FastOp::GatedDeltaVjp(_) => 6,
        }
    }

    /// Output shapes and dtypes.
    pub fn output_specs(&self, inputs: &[Spec]) -> Result<Vec<Spec>, OpErrorKind> {
        match self {
            FastOp::Softmax | FastOp::LogSumExp => softmax_specs(self, inputs),
            FastOp::RmsNorm { weighted, .. } => rms_norm_specs(*weighted, inputs),
            FastOp::AddRmsNorm { weighted, .. } => add_rms_norm_specs(*weighted, inputs),
            FastOp::LayerNorm { weighted, biased, .. } => layer_norm_specs(*weighted, *biased, inputs),
            FastOp::Rope(p) => rope_specs(p, inputs),
            FastOp::SwiGlu => swiglu_specs(inputs),
            FastOp::SwiGluVjp => Ok(inputs[..2].to_vec()),
            FastOp::CrossEntropy => cross_entropy_specs(inputs),
            FastOp::RmsNormVjp { weighted, .. } => rms_norm_vjp_specs(*weighted, inputs),
            FastOp::LayerNormVjp { weighted, biased, .. } => layer_norm_vjp_specs(*weighted, *biased, inputs),
            FastOp::CrossEntropyVjp => Ok(vec![inputs[0].clone()]),
            FastOp::CrossEntropyWithGrad => {
                let mut specs = cross_entropy_specs(&inputs[..2])?;
                specs.push(inputs[0].clone());
                Ok(specs)
            }
            FastOp::Attention(p) => attention_specs(p, inputs),
            FastOp::AttentionVjp(p) => attention_vjp_specs(p, inputs),
            FastOp::AdamStep(_) => adam_specs(inputs),
            FastOp::QuantizedMatmul(p) => quantized_matmul_specs(p, inputs),
            FastOp::PagedAttention(p) => paged_specs(p, inputs),
            FastOp::RmsNormMatmul { .. } => prologue_matmul_specs(self, inputs),
            FastOp::SwiGluMatmul { .. } => prologue_matmul_specs(self, inputs),
            FastOp::RopeKvWrite { rope, q_heads, rows } => rope_kv_write_specs(rope, *q_heads, *rows, inputs),
            FastOp::GatedDelta(p) => gated_delta_specs(p, inputs),
            FastOp::GatedDeltaVjp(p) => gated_delta_vjp_specs(p, inputs),
            FastOp::GatherMm => gather_mm_specs(inputs),
            FastOp::GatherQmm(p) => gather_qmm_specs(p, inputs),
        }
    }
}

// ---- Adam -----------------------------------------------------------------------------------

/// One Adam update's scalars: `m' = β₁ m + (1 − β₁) g`, `v' = β₂ v + (1 − β₂) g²`,
/// `p' = decay · p − step · m' / (scale · √v' + eps)` (AdamW's decay `1 − lr · wd`; without
/// bias correction `step` is the learning rate and `scale` 1).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamParams {
    /// The first moment's decay, β₁.
    pub beta1: f32,
    /// The second moment's decay, β₂.
    pub beta2: f32,
    /// Added to the denominator.
    pub eps: f32,
    /// The parameter's factor before the step.
    pub decay: f32,
    /// The step's size.
    pub step: f32,
    /// The square root of the second moment's factor.
    pub scale: f32,
}

fn adam_specs(inputs: &[Spec]) -> Result<Vec<Spec>, OpErrorKind> {
    let [p, rest @ ..] = inputs else {
        return Err(invalid("adam_step takes the parameter, gradient and two moments".into()));
    };
    if rest.len() != 3 || rest.iter().any(|s| s != p) {
        return Err(invalid(format!("adam_step: the parameter, gradient and moments must match, got {inputs:?}")));
    }
    if !p.dtype.is_float() {
        return Err(OpErrorKind::UnsupportedDType(p.dtype));
    }
    Ok(vec![p.clone(); 3])
}

// ---- quantized products ---------------------------------------------------------------------

/// The product's shape; the operation checked the arguments before recording it.
fn quantized_matmul_specs(p: &QuantMatmulParams, inputs: &[Spec]) -> Result<Vec<Spec>, OpErrorKind> {
    let n_in = 3 + p.mode.has_biases() as usize;
    let (Some(x), Some(w)) = (inputs.first(), inputs.get(1)) else {
        return Err(invalid("quantized_matmul takes x, w, scales and (affine) biases".into()));
    };
    if inputs.len() != n_in || w.shape.len() != 2 || x.shape.is_empty() {
        return Err(invalid(format!("quantized_matmul: unexpected inputs {inputs:?}")));
    }
    let (k, n) = p.inner_outer(&w.shape);
    if x.shape[x.shape.len() - 1] != k {
        return Err(invalid(format!(
            "quantized_matmul: x's last axis must be {k}, got shape {:?}",
            x.shape.as_slice()
        )));
    }
    let mut shape = x.shape.clone();
    *shape.last_mut().expect("x has an axis") = n;
    Ok(vec![Spec { shape, dtype: p.dtype }])
}

/// `[L, M, N]` in the stacks' dtype for `a [Ba, M, K]`, `b [Bb, K, N]` and indices `[L]`.
fn gather_mm_specs(inputs: &[Spec]) -> Result<Vec<Spec>, OpErrorKind> {
    let [a, b, li, ri] = inputs else { return Err(invalid("gather_mm takes a, b and two index arrays".into())) };
    let index = |s: &Spec| s.shape.len() == 1 && matches!(s.dtype, DType::I32 | DType::U32);
    if a.shape.len() != 3 || b.shape.len() != 3 || a.shape[2] != b.shape[1] || !index(li) || li.shape != ri.shape {
        return Err(invalid(format!("gather_mm: unexpected inputs {inputs:?}")));
    }
    if a.dtype != b.dtype || !a.dtype.is_float() || !index(ri) {
        return Err(invalid(format!("gather_mm: unexpected dtypes {inputs:?}")));
    }
    Ok(vec![Spec { shape: [li.shape[0], a.shape[1], b.shape[2]].into_iter().collect(), dtype: a.dtype }])
}

/// `[L, M, N]` for `x [Bx, M, K]`, the packed stack `w [Bw, rows, words]` and indices `[L]`;
/// the operation checked the rest.
fn gather_qmm_specs(p: &QuantMatmulParams, inputs: &[Spec]) -> Result<Vec<Spec>, OpErrorKind> {
    let n_in = 5 + p.mode.has_biases() as usize;
    let (Some(x), Some(w), Some(l)) = (inputs.first(), inputs.get(1), inputs.get(n_in - 2)) else {
        return Err(invalid("gather_qmm takes x, w, scales, (affine) biases and two index arrays".into()));
    };
    if inputs.len() != n_in || x.shape.len() != 3 || w.shape.len() != 3 || l.shape.len() != 1 {
        return Err(invalid(format!("gather_qmm: unexpected inputs {inputs:?}")));
    }
    let (k, n) = p.inner_outer(&w.shape[1..]);
    if x.shape[2] != k {
        return Err(invalid(format!("gather_qmm: x's last axis must be {k}, got shape {:?}", x.shape.as_slice())));
    }
    Ok(vec![Spec { shape: [l.shape[0], x.shape[1], n].into_iter().collect(), dtype: p.dtype }])
}

// ---- gated delta rule ----------------------------------------------------------------------

/// The cotangents of `q`, `k`, `v`, `g`, `beta` and `state`, each like its primal: the
/// forward's inputs must be valid and the two cotangents match its outputs.
fn gated_delta_vjp_specs(p: &GatedDeltaParams, inputs: &[Spec]) -> Result<Vec<Spec>, OpErrorKind> {
    let n = 6 + p.masked as usize;
    if p.steps || inputs.len() != n + 2 {
        return Err(invalid(format!("gated_delta_vjp takes the forward's {n} inputs and the cotangents dy, dstate")));
    }
    let want = gated_delta_specs(p, &inputs[..n])?;
    if inputs[n..] != want[..] {
        return Err(invalid(format!(
            "gated_delta_vjp: dy and dstate must match the forward's outputs {want:?}, got {:?}",
            &inputs[n..]
        )));
    }
    Ok(inputs[..6].to_vec())
}

/// `[y, state']` (or `[y, states]`): `y` `[B, T, Hv, Dv]` in `q`'s dtype, the states in
/// `p.storage`. Checks every argument, naming it.
fn gated_delta_specs(p: &GatedDeltaParams, inputs: &[Spec]) -> Result<Vec<Spec>, OpErrorKind> {
    let op = if p.steps { "gated_delta_steps" } else { "gated_delta" };
    if inputs.len() != 6 + p.masked as usize {
        return Err(invalid(format!("{op} takes q, k, v, g, beta, state and an optional mask")));
    }
    let (q, k, v, g, beta, state) = (&inputs[0], &inputs[1], &inputs[2], &inputs[3], &inputs[4], &inputs[5]);
    for (name, s) in [("q", q), ("k", k), ("v", v)] {
        if s.shape.len() != 4 {
            return Err(invalid(format!(
                "{op}: {name} must be 4-D [B, T, heads, D], got shape {:?}",
                s.shape.as_slice()
            )));
        }
        if !s.dtype.is_float() {
            return Err(invalid(format!("{op}: {name} must be floating point, got {}", s.dtype)));
        }
    }
    if k.shape != q.shape {
        return Err(invalid(format!(
            "{op}: k must have q's shape {:?}, got {:?}",
            q.shape.as_slice(),
            k.shape.as_slice()
        )));
    }
    if k.dtype != q.dtype || v.dtype != q.dtype {
        return Err(invalid(format!(
            "{op}: q, k and v must share a dtype, got {}, {} and {}",
            q.dtype, k.dtype, v.dtype
        )));
    }
    let (b, t, hk, dk) = (q.shape[0], q.shape[1], q.shape[2], q.shape[3]);
    let (hv, dv) = (v.shape[2], v.shape[3]);
    if v.shape[..2] != q.shape[..2] {
        return Err(invalid(format!(
            "{op}: v must be [{b}, {t}, Hv, Dv] like q's batch and steps, got {:?}",
            v.shape.as_slice()
        )));
    }
    if hk == 0 || hv % hk != 0 {
        return Err(invalid(format!("{op}: v's heads ({hv}) must be a multiple of q's and k's heads ({hk})")));
    }
    let scalar_gate = [b, t, hv];
    let channel_gate = [b, t, hv, dk];
    if g.shape.as_slice() != scalar_gate && g.shape.as_slice() != channel_gate {
        return Err(invalid(format!(
            "{op}: g must be {scalar_gate:?} (a gate per head) or {channel_gate:?} (per key channel), got {:?}",
            g.shape.as_slice()
        )));
    }
    if beta.shape.as_slice() != scalar_gate {
        return Err(invalid(format!("{op}: beta must be {scalar_gate:?}, got {:?}", beta.shape.as_slice())));
    }
    for (name, s) in [("g", g), ("beta", beta), ("state", state)] {
        if !s.dtype.is_float() || s.dtype == DType::F64 {
            return Err(invalid(format!("{op}: {name} must be float32, float16 or bfloat16, got {}", s.dtype)));
        }
    }
    if state.shape.as_slice() != [b, hv, dv, dk] {
        return Err(invalid(format!(
            "{op}: state must be {:?} ([B, Hv, Dv, Dk]), got {:?}",
            [b, hv, dv, dk],
            state.shape.as_slice()
        )));
    }
    if p.masked {
        let mask = &inputs[6];
        if mask.shape.as_slice() != [b, t] || mask.dtype != DType::Bool {
            return Err(invalid(format!(
                "{op}: mask must be bool of shape {:?}, got {} of shape {:?}",
                [b, t],
                mask.dtype,
                mask.shape.as_slice()
            )));
        }
    }
    if !matches!(p.storage, DType::F32 | DType::F16 | DType::BF16) {
        return Err(invalid(format!("{op}: storage must be float32, float16 or bfloat16, got {}", p.storage)));
    }
    let y = Spec { shape: [b, t, hv, dv].into_iter().collect(), dtype: q.dtype };
    let states: crate::shape::Shape =
        if p.steps { [b, t, hv, dv, dk].into_iter().collect() } else { [b, hv, dv, dk].into_iter().collect() };
    Ok(vec![y, Spec { shape: states, dtype: p.storage }])
}

// ---- paged attention -----------------------------------------------------------------------

/// `[B, Hq, L, Dv]` in `q`'s dtype; the operation checked the arguments before recording it.
fn paged_specs(p: &PagedParams, inputs: &[Spec]) -> Result<Vec<Spec>, OpErrorKind> {
    let n = 5 + p.sinks as usize;
    if inputs.len() != n || inputs[..3].iter().any(|s| s.shape.len() != 4) {
        return Err(invalid(format!("paged_attention: unexpected inputs {inputs:?}")));
    }
    let (q, v) = (&inputs[0], &inputs[2]);
    if inputs[3].dtype != DType::I32 || inputs[4].dtype != DType::I32 {
        return Err(invalid("paged_attention: block tables and lengths must be int32".into()));
    }
    let mut shape = q.shape.clone();
    shape[3] = v.shape[3];
    Ok(vec![Spec { shape, dtype: q.dtype }])
}

// ---- softmax and log-sum-exp ----------------------------------------------------------------

fn softmax_specs(op: &FastOp, inputs: &[Spec]) -> Result<Vec<Spec>, OpErrorKind> {
    let [x] = inputs else {
        return Err(OpErrorKind::InvalidArgument(format!("{} takes one input", op.name())));
    };
    if !x.dtype.is_inexact() {
        return Err(OpErrorKind::UnsupportedDType(x.dtype));
    }
    let Some(&last) = x.shape.last() else {
        return Err(OpErrorKind::InvalidArgument(format!("{} needs at least one axis", op.name())));
    };
    if last == 0 && op == &FastOp::LogSumExp {
        return Err(OpErrorKind::InvalidArgument("logsumexp over an empty axis".into()));
    }
    let mut shape = x.shape.clone();
    if op == &FastOp::LogSumExp {
        *shape.last_mut().expect("checked above") = 1;
    }
    Ok(vec![Spec { shape, dtype: x.dtype }])
}

// ---- norms ----------------------------------------------------------------------------------

fn invalid(msg: String) -> OpErrorKind {
    OpErrorKind::InvalidArgument(msg)
}

/// Checks `x` (floating, at least 1-D) and a per-feature parameter (1-D of `x`'s last size),
/// returning the output dtype.
fn check_row_param(op: &str, x: &Spec, param: Option<(&str, &Spec)>) -> Result<DType, OpErrorKind> {
    let Some(&last) = x.shape.last() else {
        return Err(invalid(format!("{op}: x must have at least one axis, got a scalar")));
    };
    let mut dtype = x.dtype;
    if let Some((name, p)) = param {
        if p.shape.as_slice() != [last] {
            return Err(invalid(format!(
                "{op}: {name} must have shape [{last}] (x's last axis), got {:?}",
                p.shape.as_slice()
            )));
        }
        dtype = promote_types(dtype, p.dtype);
    }
    if !dtype.is_float() {
        return Err(invalid(format!("{op}: needs floating inputs, got {dtype:?}")));
    }
    Ok(dtype)
}

fn rms_norm_specs(weighted: bool, inputs: &[Spec]) -> Result<Vec<Spec>, OpErrorKind> {
    let (x, w) = match (inputs, weighted) {
        ([x], false) => (x, None),
        ([x, w], true) => (x, Some(("weight", w))),
        _ => return Err(invalid("rms_norm: wrong number of inputs".into())),
    };
    let dtype = check_row_param("rms_norm", x, w)?;
    Ok(vec![Spec { shape: x.shape.clone(), dtype }])
}

fn add_rms_norm_specs(weighted: bool, inputs: &[Spec]) -> Result<Vec<Spec>, OpErrorKind> {
    let (x, r, w) = match (inputs, weighted) {
        ([x, r], false) => (x, r, None),
        ([x, r, w], true) => (x, r, Some(("weight", w))),
        _ => return Err(invalid("add_rms_norm: wrong number of inputs".into())),
    };
    if x.shape != r.shape {
        return Err(invalid(format!(
            "add_rms_norm: residual must have x's shape {:?}, got {:?}",
            x.shape.as_slice(),
            r.shape.as_slice()
        )));
    }
    let h = Spec { shape: x.shape.clone(), dtype: promote_types(x.dtype, r.dtype) };
    let dtype = check_row_param("add_rms_norm", &h, w)?;
    Ok(vec![h.clone(), Spec { shape: x.shape.clone(), dtype }])
}

fn layer_norm_specs(weighted: bool, biased: bool, inputs: &[Spec]) -> Result<Vec<Spec>, OpErrorKind> {
    let n = 1 + weighted as usize + biased as usize;
    if inputs.len() != n {
        return Err(invalid("layer_norm: wrong number of inputs".into()));
    }
    let x = &inputs[0];
    let mut dtype = check_row_param("layer_norm", x, None)?;
    if weighted {
        dtype = promote_types(dtype, check_row_param("layer_norm", x, Some(("weight", &inputs[1])))?);
    }
    if biased {
        dtype = promote_types(dtype, check_row_param("layer_norm", x, Some(("bias", &inputs[n - 1])))?);
    }
    Ok(vec![Spec { shape: x.shape.clone(), dtype }])
}

/// `[gx, gw?]` of the RMS norm from inputs `[x, w?, g]`; `gw` sums in `float32` (`float64` for
/// `float64` rows) and is rounded once to the weight's dtype (no cast after it).
fn rms_norm_vjp_specs(weighted: bool, inputs: &[Spec]) -> Result<Vec<Spec>, OpErrorKind> {
    let mut out = layer_norm_vjp_specs(weighted, false, inputs)?;
    if let (Some(gw), Some(w)) = (out.get_mut(1), inputs.get(1).filter(|_| weighted)) {
        gw.dtype = w.dtype;
    }
    Ok(out)
}

/// `[gx, gw?, gb?]` of the layer norm from inputs `[x, w?, g]`; `gw` and `gb` in `float32`
/// (`float64` for `float64` rows), which the caller casts to the parameters' dtypes.
fn layer_norm_vjp_specs(weighted: bool, biased: bool, inputs: &[Spec]) -> Result<Vec<Spec>, OpErrorKind> {
    let x = &inputs[0];
    let acc = if x.dtype == DType::F64 { DType::F64 } else { DType::F32 };
    let row = Spec { shape: x.shape.last().map(|&d| [d].into_iter().collect()).unwrap_or_default(), dtype: acc };
    let mut out = vec![x.clone()];
    out.extend(std::iter::repeat_n(row, weighted as usize + biased as usize));
    Ok(out)
}

// ---- rotary embeddings ----------------------------------------------------------------------

/// The rotation's parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    /// Features rotated (even, at most the last axis).
    pub dims: i32,
    /// Interleaved pairs instead of halves.
    pub traditional: bool,
    /// `θᵢ = base^(−2i/dims)`; `None` when the frequencies come as an input.
    pub base: Option<f32>,
    /// Positions are multiplied by it.
    pub scale: f32,
    /// The rotation (`true`) or its inverse.
    pub forward: bool,
}

fn rope_kv_write_specs(p: &RopeParams, q_heads: i32, rows: bool, inputs: &[Spec]) -> Result<Vec<Spec>, OpErrorKind> {
    let name = if rows { "rope_kv_write_rows" } else { "rope_kv_write" };
    let n = 4 + rows as usize + p.base.is_none() as usize;
    if inputs.len() != n {
        let what = if rows { "the two pools, start, rows" } else { "the two caches, start" };
        return Err(invalid(format!("{name}: takes qkv, {what} and (without base) freqs")));
    }
    let (qkv, kc, vc, start) = (&inputs[0], &inputs[1], &inputs[2], &inputs[3]);
    let rest = &inputs[4 + rows as usize..];
    let [b, l, h, d] = qkv.shape.as_slice() else {
        return Err(invalid(format!("{name}: qkv must be [B, L, heads, D], got {:?}", qkv.shape.as_slice())));
    };
    let kv = (h - q_heads) / 2;
    if q_heads < 1 || kv < 1 || q_heads + 2 * kv != *h {
        return Err(invalid(format!(
            "{name}: qkv's {h} heads must be {q_heads} query heads and as many key as value heads"
        )));
    }
    if !qkv.dtype.is_float() {
        return Err(invalid(format!("{name}: qkv must be floating, got {:?}", qkv.dtype)));
    }
    for (what, c) in [("k_cache", kc), ("v_cache", vc)] {
        let ok = match rows {
            // A pool: any buffer of rows of D.
            true => c.shape.len() >= 2 && c.shape.last() == Some(d) && c.shape.iter().all(|&n| n >= 1),
            false => c.shape.len() == 4 && c.shape[0] == *b && c.shape[1] == kv && c.shape[3] == *d && c.shape[2] >= 1,
        };
        if !ok || c.dtype != qkv.dtype {
            let want = if rows { format!("[.., {d}]") } else { format!("[{b}, {kv}, S, {d}]") };
            return Err(invalid(format!(
                "{name}: {what} must be {want} of {:?}, got {:?} of {:?}",
                qkv.dtype,
                c.shape.as_slice(),
                c.dtype
            )));
        }
    }
    if !start.dtype.is_integer() || start.shape.as_slice() != [*b] {
        return Err(invalid(format!(
            "{name}: start must be integers of shape [{b}], got {:?}",
            start.shape.as_slice()
        )));
    }
    if rows && (inputs[4].dtype != DType::I32 || inputs[4].shape.as_slice() != [*b, *l, kv]) {
        return Err(invalid(format!(
            "{name}: rows must be int32 of shape [{b}, {l}, {kv}], got {:?} of {:?}",
            inputs[4].shape.as_slice(),
            inputs[4].dtype
        )));
    }
    let mut specs = rope_specs(
        p,
        &[Spec { shape: [*b, q_heads + kv, *l, *d].into_iter().collect(), dtype: qkv.dtype }, start.clone()]
            .into_iter()
            .chain(rest.first().cloned())
            .collect::<Vec<_>>(),
    )
    .map_err(|e| match e {
        OpErrorKind::InvalidArgument(m) => invalid(m.replacen("rope:", &format!("{name}:"), 1)),
        e => e,
    })?;
    specs[0].shape[1] = q_heads;
    Ok(vec![specs.remove(0), kc.clone(), vc.clone()])
}

fn rope_specs(p: &RopeParams, inputs: &[Spec]) -> Result<Vec<Spec>, OpErrorKind> {
    let (x, offset, freqs) = match (inputs, p.base) {
        ([x, o], Some(_)) => (x, o, None),
        ([x, o, f], None) => (x, o, Some(f)),
        _ => return Err(invalid("rope: exactly one of base and freqs must be given".into())),
    };
    let nd = x.shape.len();
    if nd < 3 {
        return Err(invalid(format!(
            "rope: x must be at least 3-D [B, ..., T, D], got shape {:?}",
            x.shape.as_slice()
        )));
    }
    if !x.dtype.is_float() {
        return Err(invalid(format!("rope: x must be floating, got {:?}", x.dtype)));
    }
    let d = x.shape[nd - 1];
    if p.dims <= 0 || p.dims % 2 != 0 || p.dims > d {
        return Err(invalid(format!(
            "rope: dims must be positive, even and at most {d} (x's last axis), got {}",
            p.dims
        )));
    }
    if !offset.dtype.is_integer() {
        return Err(invalid(format!("rope: offset must be an integer, got {:?}", offset.dtype)));
    }
    match offset.shape.as_slice() {
        [] => {}
        [b] if *b == x.shape[0] => {}
        s => {
            return Err(invalid(format!(
                "rope: offset must be a scalar or have shape [{}] (one per batch row), got {s:?}",
                x.shape[0]
            )));
        }
    }
    if let Some(f) = freqs
        && (f.shape.as_slice() != [p.dims / 2] || !f.dtype.is_float())
    {
        return Err(invalid(format!(
            "rope: freqs must be a floating vector of shape [{}] (dims / 2), got {:?} {:?}",
            p.dims / 2,
            f.dtype,
            f.shape.as_slice()
        )));
    }
    Ok(vec![x.clone()])
}

// ---- gated activation and cross entropy -----------------------------------------------------

fn swiglu_specs(inputs: &[Spec]) -> Result<Vec<Spec>, OpErrorKind> {
    let [gate, up] = inputs else {
        return Err(invalid("swiglu: takes gate and up".into()));
    };
    if gate.shape != up.shape {
        return Err(invalid(format!(
            "swiglu: up must have gate's shape {:?}, got {:?}",
            gate.shape.as_slice(),
            up.shape.as_slice()
        )));
    }
    let dtype = promote_types(gate.dtype, up.dtype);
    if !dtype.is_float() {
        return Err(invalid(format!("swiglu: needs floating inputs, got {dtype:?}")));
    }
    Ok(vec![Spec { shape: gate.shape.clone(), dtype }])
}

fn cross_entropy_specs(inputs: &[Spec]) -> Result<Vec<Spec>, OpErrorKind> {
    let [logits, targets] = inputs else {
        return Err(invalid("cross_entropy: takes logits and targets".into()));
    };
    let Some((&v, lead)) = logits.shape.split_last() else {
        return Err(invalid("cross_entropy: logits must have at least one axis (the classes)".into()));
    };
    if !logits.dtype.is_float() {
        return Err(invalid(format!("cross_entropy: logits must be floating, got {:?}", logits.dtype)));
    }
    if v == 0 {
        return Err(invalid("cross_entropy: logits have no classes (last axis of size 0)".into()));
    }
    if !targets.dtype.is_integer() {
        return Err(invalid(format!("cross_entropy: targets must be integers, got {:?}", targets.dtype)));
    }
    if targets.shape.as_slice() != lead {
        return Err(invalid(format!(
            "cross_entropy: targets must have shape {lead:?} (logits' without the class axis), got {:?}",
            targets.shape.as_slice()
        )));
    }
    Ok(vec![Spec { shape: targets.shape.clone(), dtype: loss_dtype(logits.dtype) }])
}

/// `float32`, or `float64` for `float64` logits.
pub(crate) fn loss_dtype(logits: DType) -> DType {
    if logits == DType::F64 { DType::F64 } else { DType::F32 }
}

// ---- products with a prologue ---------------------------------------------------------------

/// `rms_norm_matmul`'s `[x, weight, b]` or `swiglu_matmul`'s `[gate, up, b, c?]`: the product
/// of `x`'s (the gate's) rows `[.., K]` with `b [K, N]`, in the inputs' promoted dtype.
fn prologue_matmul_specs(op: &FastOp, inputs: &[Spec]) -> Result<Vec<Spec>, OpErrorKind> {
    let (name, norm) = (op.name(), matches!(op, FastOp::RmsNormMatmul { .. }));
    let add = matches!(op, FastOp::SwiGluMatmul { add: true });
    if inputs.len() != 3 + add as usize {
        let what = if norm { "x, weight and b" } else { "gate, up, b and c when adding" };
        return Err(invalid(format!("{name}: takes {what}, got {} inputs", inputs.len())));
    }
    let (x, second, b) = (&inputs[0], &inputs[1], &inputs[2]);
    let Some(&k) = x.shape.last() else {
        return Err(invalid(format!("{name}: the rows need at least one axis, got a scalar")));
    };
    if b.shape.len() != 2 || b.shape[0] != k {
        return Err(invalid(format!("{name}: b must be [{k}, N] for rows of {k}, got shape {:?}", b.shape.as_slice())));
    }
    let second_ok = if norm { second.shape.as_slice() == [k] } else { second.shape == x.shape };
    if !second_ok {
        let (what, want) = if norm { ("weight", vec![k]) } else { ("up", x.shape.to_vec()) };
        return Err(invalid(format!("{name}: {what} must have shape {want:?}, got {:?}", second.shape.as_slice())));
    }
    let mut shape = x.shape.clone();
    *shape.last_mut().expect("checked above") = b.shape[1];
    if let Some(c) = inputs.get(3)
        && c.shape != shape
    {
        return Err(invalid(format!(
            "{name}: c must have the product's shape {:?}, got {:?}",
            shape.as_slice(),
            c.shape.as_slice()
        )));
    }
    let dtype = inputs.iter().map(|s| s.dtype).reduce(promote_types).expect("three inputs or more");
    if !dtype.is_float() {
        return Err(invalid(format!("{name}: needs floating inputs, got {dtype:?}")));
    }
    Ok(vec![Spec { shape, dtype }])
}

// ---- attention ------------------------------------------------------------------------------

const SDPA: &str = "scaled_dot_product_attention";

fn attention_specs(p: &AttentionParams, inputs: &[Spec]) -> Result<Vec<Spec>, OpErrorKind> {
    let n = 3 + p.mask.is_some() as usize + p.sinks as usize;
    if inputs.len() != n {
        return Err(invalid(format!("{SDPA}: expected {n} inputs, got {}", inputs.len())));
    }
    let [q, k, v] = [&inputs[0], &inputs[1], &inputs[2]];
    let mask = p.mask.map(|_| (inputs[3].shape.as_slice(), inputs[3].dtype));
    let sinks = p.sinks.then(|| (inputs[n - 1].shape.as_slice(), inputs[n - 1].dtype));
    for (name, s) in [("k", k), ("v", v)] {
        if s.dtype != q.dtype {
            return Err(invalid(format!("{SDPA}: {name} must have q's dtype {:?}, got {:?}", q.dtype, s.dtype)));
        }
    }
    let mut out = check_attention(&q.shape, &k.shape, &v.shape, q.dtype, mask, sinks, p.window)?;
    if p.lse {
        out.push(Spec { shape: q.shape[..3].iter().copied().collect(), dtype: DType::F32 });
    }
    Ok(out)
}

/// `[dq, dk, dv]` from `[q, k, v, out, lse, g]`: the forward's rule on `q`, `k` and `v`, its
/// outputs and the cotangent of the same specs.
fn attention_vjp_specs(p: &AttentionParams, inputs: &[Spec]) -> Result<Vec<Spec>, OpErrorKind> {
    let [q, k, v, out, lse, g] = inputs else {
        return Err(invalid(format!("{SDPA}_vjp: expected 6 inputs, got {}", inputs.len())));
    };
    let forward = AttentionParams { lse: true, mask: None, sinks: false, ..*p };
    let want = attention_specs(&forward, &[q.clone(), k.clone(), v.clone()])?;
    if [out, lse, g].into_iter().zip([&want[0], &want[1], &want[0]]).any(|(a, b)| a != b) {
        return Err(invalid(format!("{SDPA}_vjp: out, lse and g must match the forward's outputs {want:?}")));
    }
    Ok(vec![q.clone(), k.clone(), v.clone()])
}

/// Checks an attention's arguments and returns its output spec `[B, Hq, Lq, Dv]`: `q` is
/// `[B, Hq, Lq, D]`, `k` and `v` are `[B, Hkv, Lk, D]` and `[B, Hkv, Lk, Dv]` with `Hq` a
/// multiple of `Hkv`; a mask (boolean or floating) broadcasts to `[B, Hq, Lq, Lk]`; sinks are
/// floating `[Hq]`; a window is at least 1.
pub fn check_attention(
    q: &[i32],
    k: &[i32],
    v: &[i32],
    dtype: DType,
    mask: Option<(&[i32], DType)>,
    sinks: Option<(&[i32], DType)>,
    window: Option<i32>,
) -> Result<Vec<Spec>, OpErrorKind> {
    for (name, s, dims) in [("q", q, "[B, Hq, Lq, D]"), ("k", k, "[B, Hkv, Lk, D]"), ("v", v, "[B, Hkv, Lk, Dv]")] {
        if s.len() != 4 {
            return Err(invalid(format!("{SDPA}: {name} must be 4-D {dims}, got shape {s:?}")));
        }
    }
    if !dtype.is_float() {
        return Err(invalid(format!("{SDPA}: q, k and v must be floating, got {dtype:?}")));
    }
    let (b, hq, lq, d) = (q[0], q[1], q[2], q[3]);
    if k[0] != b || v[0] != b {
        return Err(invalid(format!("{SDPA}: k and v must have q's batch {b}, got k {k:?}, v {v:?}")));
    }
    if k[3] != d {
        return Err(invalid(format!("{SDPA}: k's head size must be q's {d}, got k {k:?}")));
    }
    if v[1] != k[1] || v[2] != k[2] {
        return Err(invalid(format!("{SDPA}: v must have k's heads and length, got k {k:?}, v {v:?}")));
    }
    let hkv = k[1];
    if hkv == 0 || hq % hkv != 0 {
        return Err(invalid(format!("{SDPA}: q's heads ({hq}) must be a multiple of k's and v's heads ({hkv})")));
    }
    let lk = k[2];
    if let Some((m, md)) = mask {
        let full = [b, hq, lq, lk];
        let fits = m.len() <= 4 && m.iter().rev().zip(full.iter().rev()).all(|(&a, &f)| a == 1 || a == f);
        if !fits {
            return Err(invalid(format!(
                "{SDPA}: mask of shape {m:?} does not broadcast to [B, Hq, Lq, Lk] = {full:?}"
            )));
        }
        if md != DType::Bool && !md.is_float() {
            return Err(invalid(format!("{SDPA}: mask must be boolean or floating (additive), got {md:?}")));
        }
    }
    if let Some((s, sd)) = sinks
        && (s != [hq] || !sd.is_float())
    {
        return Err(invalid(format!(
            "{SDPA}: sinks must be a floating vector of shape [{hq}] (q's heads), got {sd:?} {s:?}"
        )));
    }
    if let Some(w) = window
        && w < 1
    {
        return Err(invalid(format!("{SDPA}: window must be at least 1 key, got {w}")));
    }
    Ok(vec![Spec { shape: [b, hq, lq, v[3]].into_iter().collect(), dtype }])
}
