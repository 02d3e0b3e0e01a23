//! The closed set of primitives a graph node can hold, with each one's shape and dtype rule.
//!
//! Each family's rules live in its own module (`elementwise`, `reduce`, `view`, ...); backends
//! implement the same names. Operations in `ops` validate user arguments, cast and broadcast
//! inputs, and then record one of these.

pub mod compiled;
pub mod custom;
pub mod custom_kernel;
pub mod elementwise;
pub mod fast;
pub mod gather;
pub mod linalg;
pub mod quantize;
pub mod random;
pub mod reduce;
pub(crate) mod rules;
pub mod sort;
pub mod view;

pub use compiled::Compiled;
pub use custom::CustomFn;
pub use custom_kernel::KernelSpec;
pub use elementwise::{BinaryOp, UnaryOp};
pub use fast::FastOp;
pub use gather::ScatterReduce;
pub use quantize::QuantMode;
pub use reduce::{ArgReduceOp, ReduceOp, ScanOp};
pub use sort::SortOp;

use crate::dtype::DType;
use crate::error::OpErrorKind;
use crate::shape::Shape;
use crate::storage::Spec;

/// A primitive operation: what a graph node computes from its inputs.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Primitive {
    /// `arange`: `start + i * step` for `i` in `0..n`, in the output dtype.
    Arange {
        /// First value.
        start: f64,
        /// Increment.
        step: f64,
    },
    /// A unary map `T -> T` (or `complex -> f32` for `abs`).
    Unary(UnaryOp),
    /// A binary map on two inputs of one shape and dtype.
    Binary(BinaryOp),
    /// `where(cond, a, b)`: inputs `(bool, T, T)` of one shape.
    Select,
    /// Conversion to another dtype (C-style: floats truncate toward zero into integers).
    AsType(DType),
    /// Reinterpretation of the bytes as another dtype (a view when row-contiguous).
    BitCast(DType),
    /// A row-contiguous copy.
    Copy,
    /// Reshape (a view when the strides allow it, else a copy).
    Reshape(Shape),
    /// Axis permutation (a view).
    Transpose(Vec<usize>),
    /// Strided window `start..stop` by `step` per axis (a view). Indices are normalised:
    /// `0 <= start < dim` for a non-empty window, and `stop` may be `-1` for a reversed window
    /// that ends at index 0.
    Slice {
        /// First index per axis.
        start: Vec<i32>,
        /// End (exclusive) per axis.
        stop: Vec<i32>,
        /// Step per axis (non-zero, may be negative).
        step: Vec<i32>,
    },
    /// Broadcast to a shape (a view with zero strides).
    Broadcast(Shape),
    /// The identity that blocks gradients (a view).
    StopGradient,
    /// The identity (a view): marks a transform's traced inputs.
    Identity,
    /// `src` with the window `start..stop` by `step` replaced by `update` (which has the
    /// window's shape): inputs `(src, update)`.
    SliceUpdate {
        /// First index per axis.
        start: Vec<i32>,
        /// End (exclusive) per axis.
        stop: Vec<i32>,
        /// Step per axis.
        step: Vec<i32>,
    },
    /// Reduction over `axes`; reduced axes are kept with size 1.
    Reduce {
        /// The reduction.
        op: ReduceOp,
        /// The reduced axes, sorted.
        axes: Vec<usize>,
    },
    /// Index of the largest or smallest element along `axis` (kept with size 1), as `uint32`.
    ArgReduce {
        /// Which one.
        op: ArgReduceOp,
        /// The axis.
        axis: usize,
    },
    /// Cumulative reduction along `axis`.
    Scan {
        /// The reduction.
        op: ScanOp,
        /// The axis.
        axis: usize,
        /// From the end towards the start.
        reverse: bool,
        /// Whether element `i` includes input `i`.
        inclusive: bool,
    },
    /// Joins the inputs along `axis`.
    Concatenate {
        /// The axis.
        axis: usize,
    },
    /// Batched matrix product of `[..., M, K]` and `[..., K, N]` with equal batch shapes.
    Matmul,
    /// `alpha * a @ b + beta * c` with `c` broadcast to the output: inputs `(a, b, c)`.
    AddMM {
        /// Scale of the product.
        alpha: f32,
        /// Scale of `c`.
        beta: f32,
    },
    /// A fused operation: one kernel where a backend has it, its composition elsewhere.
    Fast(FastOp),
    /// A fused element-wise program made by `compile`: one kernel where a backend has it, its
    /// steps as ordinary primitives elsewhere.
    Compiled(Compiled),
    /// A user function with its own derivative or batching rules (`custom_function`,
    /// `checkpoint`): evaluated as its body.
    Custom(CustomFn),
    /// Random bits from threefry2x32 keys (`uint32[..., 2]`): one block of `shape` per key,
    /// `width` bytes per element (1, 2 or 4), laid out as MLX draws them. Output shape: the
    /// keys' leading axes, then `shape`.
    RandomBits {
        /// The shape drawn from each key.
        shape: Shape,
        /// Bytes per element.
        width: usize,
    },
    /// Sort, argsort, partition or argpartition along `axis` (see [`sort`]).
    Sort {
        /// Which one.
        op: SortOp,
        /// The axis.
        axis: usize,
    },
    /// A custom CUDA kernel from source (`fast::CudaKernel`); only the CUDA backend runs it.
    CustomKernel(std::sync::Arc<KernelSpec>),
    /// `out[.., j, ..] = src[.., indices[.., j, ..], ..]` along `axis`: inputs `(src, indices)`
    /// of one rank, equal except on `axis`. Negative indices wrap once; others outside the
    /// axis clamp to its ends (see [`gather`]).
    GatherAxis {
        /// The indexed axis.
        axis: usize,
    },
    /// `src` with `updates[.., j, ..]` combined into `src[.., indices[.., j, ..], ..]` along
    /// `axis`: inputs `(src, indices, updates)`. Negative indices wrap once; updates whose index
    /// is still outside the axis are dropped.
    ScatterAxis {
        /// The indexed axis.
        axis: usize,
        /// How updates combine with the values there.
        reduce: ScatterReduce,
    },
    /// Quantization of the last axis of a floating input in groups: outputs the packed `u32`
    /// weights, the scales and (affine only) the biases, in MLX's layout.
    Quantize {
        /// The format.
        mode: QuantMode,
        /// Elements per scale.
        group_size: i32,
        /// Bits per element.
        bits: i32,
    },
    /// The inverse of `Quantize`: inputs `(w, scales)` or, for affine, `(w, scales, biases)`.
    Dequantize {
        /// The format.
        mode: QuantMode,
        /// Elements per scale.
        group_size: i32,
        /// Bits per element.
        bits: i32,
        /// The output dtype (for affine, the scales' dtype).
        dtype: DType,
    },
}

impl Primitive {
    /// A short name for messages and profiles.
    pub fn name(&self) -> &'static str {
        match self {
            Primitive::Arange { .. } => "arange",
            Primitive::Unary(op) => op.name(),
            Primitive::Binary(op) => op.name(),
            Primitive::Select => "where",
            Primitive::AsType(_) => "astype",
            Primitive::BitCast(_) => "view",
            Primitive::Copy => "copy",
            Primitive::Reshape(_) => "reshape",
            Primitive::Transpose(_) => "transpose",
            Primitive::Slice { .. } => "slice",
            Primitive::Broadcast(_) => "broadcast_to",
            Primitive::StopGradient => "stop_gradient",
            Primitive::Identity => "identity",
            Primitive::SliceUpdate { .. } => "slice_update",
            Primitive::Reduce { op, .. } => op.name(),
            Primitive::ArgReduce { op, .. } => op.name(),
            Primitive::Scan { op, .. } => op.name(),
            Primitive::Concatenate { .. } => "concatenate",
            Primitive::Matmul => "matmul",
            Primitive::AddMM { .. } => "addmm",
            Primitive::Fast(f) => f.name(),
            Primitive::Compiled(_) => "compiled",
            Primitive::Custom(c) => c.name(),
            Primitive::RandomBits { .. } => "random_bits",
            Primitive::Sort { op, .. } => op.name(),
            Primitive::CustomKernel(_) => "cuda_kernel",
            Primitive::GatherAxis { .. } => "take_along_axis",
            Primitive::ScatterAxis { reduce, .. } => reduce.name(),
            Primitive::Quantize { .. } => "quantize",
            Primitive::Dequantize { .. } => "dequantize",
        }
    }

    /// Views are evaluated by core on the input's storage, never by a backend (except when a
    /// reshape or bit cast needs a copy first).
    pub fn is_view(&self) -> bool {
        matches!(
            self,
            Primitive::Reshape(_)
                | Primitive::Transpose(_)
                | Primitive::Slice { .. }
                | Primitive::Broadcast(_)
                | Primitive::StopGradient
                | Primitive::Identity
                | Primitive::BitCast(_)
        )
    }

    /// The shapes and dtypes of the outputs for these inputs, or what is wrong with them.
    ///
    /// This is the one shape rule of each primitive; operations call it when they record.
    pub fn output_specs(&self, inputs: &[Spec]) -> Result<Vec<Spec>, OpErrorKind> {
        let one = |shape: Shape, dtype: DType| Ok(vec![Spec { shape, dtype }]);
        let arity = |n: usize| -> Result<(), OpErrorKind> {
            if inputs.len() == n {
                Ok(())
            } else {
                Err(OpErrorKind::InvalidArgument(format!("{} takes {n} inputs, got {}", self.name(), inputs.len())))
            }
        };
        match self {
            Primitive::Arange { .. } => {
                Err(OpErrorKind::InvalidArgument("arange has no inputs; its output is given".into()))
            }
            Primitive::Unary(op) => {
                arity(1)?;
                elementwise::unary_spec(*op, &inputs[0]).map(|s| vec![s])
            }
            Primitive::Binary(op) => {
                arity(2)?;
                elementwise::binary_spec(*op, &inputs[0], &inputs[1]).map(|s| vec![s])
            }
            Primitive::Select => {
                arity(3)?;
                elementwise::select_spec(&inputs[0], &inputs[1], &inputs[2]).map(|s| vec![s])
            }
            Primitive::AsType(d) => {
                arity(1)?;
                one(inputs[0].shape.clone(), *d)
            }
            Primitive::Copy | Primitive::StopGradient | Primitive::Identity => {
                arity(1)?;
                one(inputs[0].shape.clone(), inputs[0].dtype)
            }
            Primitive::BitCast(d) => {
                arity(1)?;
                view::bitcast_shape(&inputs[0], *d).and_then(|s| one(s, *d))
            }
            Primitive::Reshape(shape) => {
                arity(1)?;
                view::reshape_shape(&inputs[0].shape, shape).and_then(|s| one(s, inputs[0].dtype))
            }
            Primitive::Transpose(perm) => {
                arity(1)?;
                view::transpose_shape(&inputs[0].shape, perm).and_then(|s| one(s, inputs[0].dtype))
            }
            Primitive::Slice { start, stop, step } => {
                arity(1)?;
                view::slice_shape(&inputs[0].shape, start, stop, step).and_then(|s| one(s, inputs[0].dtype))
            }
            Primitive::Broadcast(shape) => {
                arity(1)?;
                view::broadcast_shape(&inputs[0].shape, shape).and_then(|s| one(s, inputs[0].dtype))
            }
            Primitive::SliceUpdate { start, stop, step } => {
                arity(2)?;
                view::slice_update_spec(&inputs[0], &inputs[1], start, stop, step).map(|s| vec![s])
            }
            Primitive::Reduce { op, axes } => {
                arity(1)?;
                reduce::reduce_spec(*op, axes, &inputs[0]).map(|s| vec![s])
            }
            Primitive::ArgReduce { axis, .. } => {
                arity(1)?;
                reduce::arg_reduce_spec(*axis, &inputs[0]).map(|s| vec![s])
            }
            Primitive::Scan { axis, .. } => {
                arity(1)?;
                reduce::scan_spec(*axis, &inputs[0]).map(|s| vec![s])
            }
            Primitive::Concatenate { axis } => view::concatenate_spec(*axis, inputs).map(|s| vec![s]),
            Primitive::Matmul => {
                arity(2)?;
                linalg::matmul_spec(&inputs[0], &inputs[1]).map(|s| vec![s])
            }
            Primitive::AddMM { .. } => {
                arity(3)?;
                linalg::addmm_spec(&inputs[0], &inputs[1], &inputs[2]).map(|s| vec![s])
            }
            Primitive::Fast(f) => {
                let specs = f.output_specs(inputs)?;
                // Failures answer with output_count arrays: the two must agree.
                if specs.len() != f.output_count() {
                    return Err(OpErrorKind::InvalidArgument(format!(
                        "{}: {} output specs but output_count says {} (a bug in nuvec)",
                        f.name(),
                        specs.len(),
                        f.output_count()
                    )));
                }
                Ok(specs)
            }
            Primitive::Compiled(c) => c.output_specs(inputs),
            Primitive::Custom(c) => Ok(c.output_specs().to_vec()),
            Primitive::RandomBits { shape, width } => {
                arity(1)?;
                Ok(vec![random::random_bits_spec(&inputs[0], shape, *width)?])
            }
            Primitive::Sort { op, axis } => {
                arity(1)?;
                sort::output_spec(*op, *axis, &inputs[0]).map(|s| vec![s])
            }
            Primitive::CustomKernel(k) => {
                arity(k.input_names.len())?;
                Ok(k.outputs.clone())
            }
            Primitive::GatherAxis { axis } => gather::gather_axis_specs(*axis, inputs),
            Primitive::ScatterAxis { axis, .. } => gather::scatter_axis_specs(*axis, inputs),
            Primitive::Quantize { mode, group_size, bits } => {
                quantize::quantize_specs(*mode, *group_size, *bits, inputs)
            }
            Primitive::Dequantize { mode, group_size, bits, dtype } => {
                quantize::dequantize_specs(*mode, *group_size, *bits, *dtype, inputs)
            }
        }
    }
}
