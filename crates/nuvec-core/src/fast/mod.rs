//! Fused operations. Each is one primitive ([`FastOp`]) that a backend may run as a single
//! kernel, and an equivalent composition of ordinary operations: the reference, the CPU
//! fallback, and what defines derivatives and batching.
//!
//! `NUVEC_FUSED=0` makes every backend decline fast primitives, so they all run as their
//! compositions.

mod softmax;

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

/// Whether fused kernels are enabled (`NUVEC_FUSED` is not `0`). Backends consult this in
/// `supports` for fast primitives.
pub fn fused_enabled() -> bool {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var("NUVEC_FUSED").map(|v| v != "0").unwrap_or(true))
}
