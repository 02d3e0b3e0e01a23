//! Fused operations. Each is one primitive ([`FastOp`]) that a backend may run as a single
//! kernel, and an equivalent composition of ordinary operations: the reference, the CPU
//! fallback, and what defines derivatives and batching.
//!
//! `NUVEC_FUSED=0` makes every backend decline fast primitives, so they all run as their
//! compositions; `NUVEC_UNFUSED=name,...` declines the ones named.

mod adam;
mod attention;
pub mod cuda_kernel;
mod gated_delta;
mod glu_loss;
mod matmul;
pub mod metal_kernel;
mod norm;
mod paged;
mod plan;
mod rope;
mod softmax;

pub use crate::primitive::fast::{
    AdamParams, AttentionKernel, AttentionParams, FastOp, GatedDeltaParams, MaskInput, PagedParams, QuantMatmulParams,
    RopeParams,
};
pub use adam::adam_step;
pub use attention::{AttentionMask, AttentionOptions, scaled_dot_product_attention};
pub use cuda_kernel::{CudaKernel, KernelConfig, TemplateArg};
pub use gated_delta::{StepOptions, gated_delta, gated_delta_steps, gated_delta_steps_with, gated_delta_with};
pub use glu_loss::{cross_entropy, swiglu};
pub use matmul::{rms_norm_matmul, swiglu_matmul};
pub use metal_kernel::MetalKernel;
pub use norm::{add_rms_norm, layer_norm, rms_norm};
pub use paged::{paged_attention, paged_prefill, paged_write};
pub use plan::{AttentionPlan, VECTOR_MAX_QUERIES, paged_blocks, plan_attention, vector_blocks};
pub use rope::{rope, rope_kv_write, rope_kv_write_rows};

use crate::array::Array;
use crate::error::{Error, OpErrorKind};
use crate::primitive::Primitive;
use crate::transforms::{AxesSpec, jvp_flat, vjp_flat, vmap_impl};

/// Records `op` and returns its outputs, or `n` copies of the failure: how every fast operation
/// (and every fused derivative) enters the graph.
#[track_caller]
pub(crate) fn record(op: FastOp, inputs: Vec<Array>, n: usize) -> Vec<Array> {
    let outs = Array::from_op_multi(op.name(), Primitive::Fast(op), inputs);
    if outs.len() == n { outs } else { vec![outs[0].clone(); n] }
}

impl FastOp {
    /// The operation as ordinary operations on `inputs`.
    pub fn composition(&self, inputs: &[Array]) -> Vec<Array> {
        let opt = |i: usize, present: bool| present.then(|| &inputs[i]);
        match self {
            FastOp::Softmax => vec![softmax::softmax_composition(&inputs[0])],
            FastOp::LogSumExp => vec![softmax::logsumexp_composition(&inputs[0])],
            FastOp::RmsNorm { eps, weighted } => vec![norm::rms_norm_composition(*eps, &inputs[0], opt(1, *weighted))],
            FastOp::AddRmsNorm { eps, weighted } => {
                let h = &inputs[0] + &inputs[1];
                let y = norm::rms_norm_composition(*eps, &h, opt(2, *weighted));
                vec![h, y]
            }
            FastOp::LayerNorm { eps, weighted, biased } => {
                let bias = opt(inputs.len() - 1, *biased);
                vec![norm::layer_norm_composition(*eps, &inputs[0], opt(1, *weighted), bias)]
            }
            FastOp::Rope(p) => vec![rope::composition(p, &inputs[0], &inputs[1], inputs.get(2))],
            FastOp::SwiGlu => vec![glu_loss::swiglu_composition(&inputs[0], &inputs[1])],
            FastOp::SwiGluVjp => glu_loss::swiglu_vjp_composition(&inputs[0], &inputs[1], &inputs[2]),
            FastOp::CrossEntropy => vec![glu_loss::cross_entropy_composition(&inputs[0], &inputs[1])],
            FastOp::RmsNormVjp { eps, weighted } => {
                norm::rms_norm_vjp_composition(*eps, &inputs[0], opt(1, *weighted), &inputs[inputs.len() - 1])
            }
            FastOp::LayerNormVjp { eps, weighted, biased } => {
                let g = &inputs[inputs.len() - 1];
                norm::layer_norm_vjp_composition(*eps, &inputs[0], opt(1, *weighted), *biased, g)
            }
            FastOp::CrossEntropyVjp => {
                vec![glu_loss::cross_entropy_vjp_composition(&inputs[0], &inputs[1], &inputs[2])]
            }
            FastOp::Attention(p) => attention::composition(p, inputs),
            FastOp::AttentionVjp(p) => attention::vjp_composition(p, inputs),
            FastOp::CrossEntropyWithGrad => {
                glu_loss::cross_entropy_with_grad_composition(&inputs[0], &inputs[1], &inputs[2])
            }
            FastOp::AdamStep(p) => adam::composition(p, inputs),
            FastOp::QuantizedMatmul(p) => vec![crate::ops::quantize::quantized_matmul_composition(p, inputs)],
            FastOp::PagedAttention(p) => vec![paged::composition(p, inputs)],
            FastOp::RmsNormMatmul { eps } => {
                vec![matmul::rms_norm_matmul_composition(*eps, &inputs[0], &inputs[1], &inputs[2])]
            }
            FastOp::SwiGluMatmul { add } => {
                vec![matmul::swiglu_matmul_composition(&inputs[0], &inputs[1], &inputs[2], opt(3, *add))]
            }
            FastOp::RopeKvWrite { rope, q_heads, rows } => rope::kv_write_composition(rope, *q_heads, *rows, inputs),
            FastOp::GatedDelta(p) => gated_delta::composition(p, inputs),
            FastOp::GatedDeltaVjp(p) => gated_delta::vjp_composition(p, inputs),
            FastOp::GatherMm => vec![inputs[0].take(&inputs[2], 0).matmul(&inputs[1].take(&inputs[3], 0))],
            FastOp::GatherQmm(p) => {
                let n = inputs.len();
                let (li, ri) = (&inputs[n - 2], &inputs[n - 1]);
                let mut picked = vec![inputs[0].take(li, 0)];
                picked.extend(inputs[1..n - 2].iter().map(|a| a.take(ri, 0)));
                vec![crate::ops::quantize::quantized_matmul_composition(p, &picked)]
            }
        }
    }

    /// Which inputs are rows (batched like `x`) and which are per-feature parameters, for ops
    /// that work row by row over the last axis; `None` for the others.
    fn row_inputs(&self, n: usize) -> Option<usize> {
        match self {
            FastOp::Softmax | FastOp::LogSumExp | FastOp::RmsNorm { .. } | FastOp::LayerNorm { .. } => Some(1),
            FastOp::AddRmsNorm { .. } | FastOp::SwiGlu | FastOp::CrossEntropy => Some(2),
            FastOp::CrossEntropyVjp => Some(4),
            FastOp::CrossEntropyWithGrad => Some(3),
            FastOp::SwiGluVjp => Some(3),
            FastOp::Rope(_) => Some(1).filter(|_| n >= 2),
            // Rows of x against one weight.
            FastOp::QuantizedMatmul(_) | FastOp::RmsNormMatmul { .. } => Some(1),
            FastOp::SwiGluMatmul { add: false } => Some(2),
            // c is batched like the rows but comes after the weight.
            FastOp::SwiGluMatmul { add: true } => None,
            FastOp::RopeKvWrite { .. }
            | FastOp::GatedDelta(_)
            | FastOp::GatedDeltaVjp(_)
            | FastOp::GatherMm
            | FastOp::GatherQmm(_) => None,
            // Element-wise: every input is batched alike.
            FastOp::AdamStep(_) => Some(4),
            // The weight and bias cotangents sum over rows, the batch included.
            FastOp::RmsNormVjp { .. } | FastOp::LayerNormVjp { .. } => None,
            FastOp::Attention(_) | FastOp::AttentionVjp(_) | FastOp::PagedAttention(_) => None,
        }
    }
}

/// How evaluation may run a pending derivative and the pending forward whose output it
/// consumes as one primitive ([`FastOp::joint`]).
pub(crate) struct Joint {
    /// The forward's operation; its inputs are the derivative's first ones.
    pub(crate) forward: FastOp,
    /// Which input of the derivative is the forward's output.
    pub(crate) output_at: usize,
    /// The primitive doing both: inputs the derivative's before `output_at`, outputs the
    /// forward's followed by the derivative's.
    pub(crate) op: FastOp,
}

impl FastOp {
    /// The joint form of this derivative with its forward, where a backend may have one kernel
    /// for both: cross entropy's loss and gradient read the logits once instead of twice.
    pub(crate) fn joint(&self) -> Option<Joint> {
        match self {
            FastOp::CrossEntropyVjp => {
                Some(Joint { forward: FastOp::CrossEntropy, output_at: 3, op: FastOp::CrossEntropyWithGrad })
            }
            _ => None,
        }
    }
}

/// Every output failed with `e`.
fn failed(e: Error, n: usize) -> Vec<Array> {
    vec![Array::from_error(e); n]
}

impl FastOp {
    /// Cotangents of the inputs: dedicated primitives for the norms, cross entropy and RoPE,
    /// closed forms for softmax and log-sum-exp, the composition's otherwise.
    pub(crate) fn vjp(&self, x: &[Array], y: &[Array], g: &[Array]) -> Vec<Option<Array>> {
        match self {
            // softmax: dx = y * (g - sum(g * y))
            FastOp::Softmax => {
                let (y, g) = (&y[0], &g[0]);
                vec![Some(y * (g - (g * y).sum_keepdims(-1)))]
            }
            // logsumexp: dx = g * softmax(x) = g * exp(x - y)
            FastOp::LogSumExp => vec![Some(&g[0] * (&x[0] - &y[0]).exp())],
            FastOp::RmsNorm { eps, weighted } => {
                let mut inputs = x.to_vec();
                inputs.push(g[0].clone());
                let n = 1 + *weighted as usize;
                record(FastOp::RmsNormVjp { eps: *eps, weighted: *weighted }, inputs, n).into_iter().map(Some).collect()
            }
            FastOp::AddRmsNorm { eps, weighted } => {
                // h = x + residual feeds y = rms_norm(h): both see gh + the norm's gx.
                let mut inputs = vec![y[0].clone()];
                inputs.extend(x.get(2).cloned());
                inputs.push(g[1].clone());
                let n = 1 + *weighted as usize;
                let mut d = record(FastOp::RmsNormVjp { eps: *eps, weighted: *weighted }, inputs, n).into_iter();
                let dh = &g[0] + d.next().unwrap_or_default();
                let mut out = vec![Some(dh.clone()), Some(dh)];
                out.extend(d.map(Some));
                out
            }
            FastOp::LayerNorm { eps, weighted, biased } => {
                let mut inputs = vec![x[0].clone()];
                if *weighted {
                    inputs.push(x[1].clone());
                }
                inputs.push(g[0].clone());
                let n = 1 + *weighted as usize + *biased as usize;
                let op = FastOp::LayerNormVjp { eps: *eps, weighted: *weighted, biased: *biased };
                record(op, inputs, n).into_iter().map(Some).collect()
            }
            FastOp::Rope(p) => {
                let inverse = FastOp::Rope(RopeParams { forward: !p.forward, ..*p });
                let mut inputs = vec![g[0].clone()];
                inputs.extend(x[1..].iter().cloned());
                let mut out = vec![Some(record(inverse, inputs, 1).remove(0)), None];
                if x.len() > 2 {
                    let e = OpErrorKind::InvalidArgument("rope: no derivative with respect to freqs".into());
                    out.push(Some(Array::failed("rope", e)));
                }
                out
            }
            FastOp::SwiGlu => {
                let inputs = vec![x[0].clone(), x[1].clone(), g[0].clone()];
                record(FastOp::SwiGluVjp, inputs, 2).into_iter().map(Some).collect()
            }
            FastOp::CrossEntropy => {
                let inputs = vec![x[0].clone(), x[1].clone(), g[0].clone(), y[0].clone()];
                vec![Some(record(FastOp::CrossEntropyVjp, inputs, 1).remove(0)), None]
            }
            // Recorded with lse only without a mask or sinks: the cotangents of q, k and v.
            FastOp::Attention(p) if p.lse => attention::vjp(p, x, y, &g[0]).into_iter().map(Some).collect(),
            // The last state only: a backend may run the derivative as one primitive.
            FastOp::GatedDelta(p) if !p.steps => {
                let mut inputs = x.to_vec();
                inputs.extend(g.iter().cloned());
                let mut d: Vec<Option<Array>> =
                    record(FastOp::GatedDeltaVjp(*p), inputs, 6).into_iter().map(Some).collect();
                d.resize(x.len(), None);
                d
            }
            _ => {
                let op = self.clone();
                match vjp_flat(move |xs| Ok(op.composition(xs)), x, g) {
                    Ok((_, d)) => d.into_iter().map(Some).collect(),
                    Err(e) => failed(e, x.len()).into_iter().map(Some).collect(),
                }
            }
        }
    }

    /// Tangents of the outputs: closed forms for softmax and log-sum-exp, the composition's
    /// otherwise.
    pub(crate) fn jvp(&self, x: &[Array], y: &[Array], t: &[Option<Array>]) -> Vec<Option<Array>> {
        match self {
            FastOp::Softmax | FastOp::LogSumExp => {
                let Some(t) = &t[0] else { return vec![None] };
                if *self == FastOp::Softmax {
                    let y = &y[0];
                    vec![Some(y * (t - (t * y).sum_keepdims(-1)))]
                } else {
                    vec![Some((t * (&x[0] - &y[0]).exp()).sum_keepdims(-1))]
                }
            }
            _ => {
                let tangents: Vec<Array> =
                    t.iter().zip(x).map(|(t, x)| t.clone().unwrap_or_else(|| x.zeros_like())).collect();
                let op = self.clone();
                let r = jvp_flat(move |xs| Ok(op.composition(xs)), x, &tangents).map(|(_, t)| t);
                r.unwrap_or_else(|e| failed(e, y.len())).into_iter().map(Some).collect()
            }
        }
    }

    /// The operation on inputs batched on axis 0. Row-wise operations whose row inputs are all
    /// batched and whose parameters are not stay fused (the batch axis joins the leading axes);
    /// anything else is the batched composition.
    pub(crate) fn vmap(&self, x: &[Array], mapped: &[bool]) -> Vec<(Array, bool)> {
        let fused = self.row_inputs(x.len()).is_some_and(|rows| {
            mapped[..rows].iter().all(|&m| m)
                && !mapped[rows..].iter().any(|&m| m)
                // A per-batch rope offset indexes the original leading axis.
                && (!matches!(self, FastOp::Rope(_)) || x[1].ndim() == 0)
        });
        let n = self.output_count();
        if fused {
            return record(self.clone(), x.to_vec(), n).into_iter().map(|o| (o, true)).collect();
        }
        let axes: Vec<Option<i32>> = mapped.iter().map(|&m| m.then_some(0)).collect();
        let op = self.clone();
        let f = move |xs: &[Array]| Ok(op.composition(xs));
        vmap_impl(&f, x, &AxesSpec::PerLeaf(axes), &AxesSpec::All(Some(0)))
            .unwrap_or_else(|e| failed(e, n))
            .into_iter()
            .map(|o| (o, true))
            .collect()
    }
}

/// Whether fused kernels are enabled (`NUVEC_FUSED` is not `0`). Backends consult this in
/// `supports` for fast primitives.
pub fn fused_enabled() -> bool {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var("NUVEC_FUSED").map(|v| v != "0").unwrap_or(true))
}

/// Whether `op` may run as a fused kernel: [`fused_enabled`], and `NUVEC_UNFUSED` (operation
/// names separated by commas, `rope_kv_write,swiglu_matmul` say) does not name it, so that one
/// fusion can be measured against its composition.
pub fn fused_enabled_for(op: &FastOp) -> bool {
    static UNFUSED: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    let unfused = UNFUSED.get_or_init(|| {
        let v = std::env::var("NUVEC_UNFUSED").unwrap_or_default();
        v.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect()
    });
    fused_enabled() && !unfused.iter().any(|n| n == op.name())
}
