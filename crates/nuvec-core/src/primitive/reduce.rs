//! Reductions, arg-reductions and scans. Operations cast the input to the dtype the reduction
//! accumulates in (`sum` of `int8` runs in `int32`, as MLX), so a kernel maps `T -> T`
//! (`all`/`any` map to `bool`; arg-reductions to `uint32`). Half-precision floats accumulate
//! in `f32` inside the kernel.

use crate::dtype::DType;

/// A reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Maximum (NaN propagates).
    Max,
    /// Minimum (NaN propagates).
    Min,
    /// Logical and of the elements' truth.
    And,
    /// Logical or of the elements' truth.
    Or,
}

impl ReduceOp {
    /// MLX's name of the reduction.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::And => "all",
            ReduceOp::Or => "any",
        }
    }

    /// The dtype the input is cast to before reducing (MLX: sums and products of booleans and
    /// small integers widen to 32 bits).
    pub fn compute_dtype(self, dtype: DType) -> DType {
        match (self, dtype) {
            (ReduceOp::Sum | ReduceOp::Prod, DType::Bool | DType::I8 | DType::I16) => DType::I32,
            (ReduceOp::Sum | ReduceOp::Prod, DType::U8 | DType::U16) => DType::U32,
            _ => dtype,
        }
    }

    /// The output dtype for an input in its compute dtype.
    pub fn output_dtype(self, dtype: DType) -> DType {
        match self {
            ReduceOp::And | ReduceOp::Or => DType::Bool,
            _ => dtype,
        }
    }
}

/// An arg-reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ArgReduceOp {
    /// Index of the first largest element.
    ArgMax,
    /// Index of the first smallest element.
    ArgMin,
}

impl ArgReduceOp {
    /// MLX's name.
    pub fn name(self) -> &'static str {
        match self {
            ArgReduceOp::ArgMax => "argmax",
            ArgReduceOp::ArgMin => "argmin",
        }
    }
}

/// A cumulative reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScanOp {
    /// Running sum.
    Sum,
    /// Running product.
    Prod,
    /// Running maximum.
    Max,
    /// Running minimum.
    Min,
    /// Running `log(sum(exp(x)))`.
    LogAddExp,
}

impl ScanOp {
    /// MLX's name.
    pub fn name(self) -> &'static str {
        match self {
            ScanOp::Sum => "cumsum",
            ScanOp::Prod => "cumprod",
            ScanOp::Max => "cummax",
            ScanOp::Min => "cummin",
            ScanOp::LogAddExp => "logcumsumexp",
        }
    }

    /// The dtype the input is cast to (MLX: `cumsum` of `bool` counts in `int32`;
    /// `logcumsumexp` of integers runs in `float32`).
    pub fn compute_dtype(self, dtype: DType) -> DType {
        match (self, dtype) {
            (ScanOp::Sum, DType::Bool) => DType::I32,
            (ScanOp::LogAddExp, d) => d.at_least_float(),
            (_, d) => d,
        }
    }
}
