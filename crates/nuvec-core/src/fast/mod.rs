//! Fused operations. Each is one primitive ([`FastOp`]) that a backend may run as a single
//! kernel, and an equivalent composition of ordinary operations: the reference, the CPU
//! fallback, and what defines derivatives and batching.
//!
//! `NUVEC_FUSED=0` makes every backend decline fast primitives, so they all run as their
//! compositions.

pub mod cuda_kernel;
mod softmax;

pub use cuda_kernel::{CudaKernel, KernelConfig, TemplateArg};

use crate::array::Array;
use crate::error::OpErrorKind;
use crate::storage::Spec;

/// A fused operation recorded in the graph.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum FastOp {
    /// Softmax over the last axis; statistics in `float32` for half-precision inputs.
    Softmax,
    /// `log(sum(exp(x)))` over the last axis, kept with size 1; accumulates in `float32`.
    LogSumExp,
}

impl FastOp {
    /// The operation's name.
    pub fn name(&self) -> &'static str {
        match self {
            FastOp::Softmax => "softmax",
            FastOp::LogSumExp => "logsumexp",
        }
    }

    /// Output shapes and dtypes.
    pub fn output_specs(&self, inputs: &[Spec]) -> Result<Vec<Spec>, OpErrorKind> {
        match self {
            FastOp::Softmax | FastOp::LogSumExp => softmax::output_specs(self, inputs),
        }
    }

    /// The operation as ordinary operations on `inputs`.
    pub fn composition(&self, inputs: &[Array]) -> Vec<Array> {
        match self {
            FastOp::Softmax => vec![softmax::softmax_composition(&inputs[0])],
            FastOp::LogSumExp => vec![softmax::logsumexp_composition(&inputs[0])],
        }
    }
}

impl FastOp {
    /// Cotangents of the inputs (dedicated formulas; see each operation).
    pub(crate) fn vjp(&self, x: &[Array], y: &[Array], g: &[Array]) -> Vec<Option<Array>> {
        match self {
            // softmax: dx = y * (g - sum(g * y))
            FastOp::Softmax => {
                let (y, g) = (&y[0], &g[0]);
                vec![Some(y * (g - (g * y).sum_keepdims(-1)))]
            }
            // logsumexp: dx = g * softmax(x) = g * exp(x - y)
            FastOp::LogSumExp => vec![Some(&g[0] * (&x[0] - &y[0]).exp())],
        }
    }

    /// Tangents of the outputs.
    pub(crate) fn jvp(&self, x: &[Array], y: &[Array], t: &[Option<Array>]) -> Vec<Option<Array>> {
        let Some(t) = &t[0] else { return vec![None] };
        match self {
            FastOp::Softmax => {
                let y = &y[0];
                vec![Some(y * (t - (t * y).sum_keepdims(-1)))]
            }
            FastOp::LogSumExp => vec![Some((t * (&x[0] - &y[0]).exp()).sum_keepdims(-1))],
        }
    }

    /// The operation on an input batched on axis 0 (it works row by row over the last axis,
    /// so the batch axis just joins the leading axes).
    pub(crate) fn vmap(&self, x: &[Array], _mapped: &[bool]) -> Vec<(Array, bool)> {
        vec![(Array::from_op(self.name(), crate::primitive::Primitive::Fast(self.clone()), vec![x[0].clone()]), true)]
    }
}

/// Whether fused kernels are enabled (`NUVEC_FUSED` is not `0`). Backends consult this in
/// `supports` for fast primitives.
pub fn fused_enabled() -> bool {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var("NUVEC_FUSED").map(|v| v != "0").unwrap_or(true))
}
