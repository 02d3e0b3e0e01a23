//! The one dispatch of primitives to the family modules: [`supports`] says which cases the GPU
//! runs, [`eval`] runs one; each arm is one call into the family's module.

use std::sync::Arc;

use nuvec_core::primitive::{Primitive, ScatterReduce};
use nuvec_core::storage::{Operand, Output, Spec};
use nuvec_core::{DType, Result};

use crate::driver::Gpu;
use crate::operand::internal;
use crate::{binary, compiled, copy, custom_kernel, fast, gather, matmul, quantize, random, reduce, scan, sort, unary};

/// Whether the GPU runs `primitive` on inputs and outputs of these specs.
pub(crate) fn supports(primitive: &Primitive, inputs: &[Spec], outputs: &[Spec]) -> bool {
    let d = inputs.first().map(|s| s.dtype).unwrap_or_else(|| outputs.first().map(|s| s.dtype).unwrap_or(DType::F32));
    match primitive {
        Primitive::Arange { .. } => !matches!(outputs[0].dtype, DType::Bool | DType::Complex64),
        Primitive::Unary(op) => unary::functor(*op, d).is_some(),
        Primitive::Binary(op) => binary::has_binary_pair(*op, d, inputs[1].dtype),
        Primitive::Select | Primitive::AsType(_) | Primitive::Copy | Primitive::Concatenate { .. } => true,
        Primitive::SliceUpdate { .. } => true,
        Primitive::GatherAxis { .. } => gather::INDEX_DTYPES.contains(&inputs[1].dtype),
        Primitive::ScatterAxis { reduce, .. } => {
            gather::INDEX_DTYPES.contains(&inputs[1].dtype)
                && (*reduce == ScatterReduce::None || gather::has_scatter_reduce(d))
        }
        Primitive::Reshape(_) | Primitive::BitCast(_) => true,
        Primitive::Reduce { op, .. } => reduce::reduce_ops(d).contains(op),
        Primitive::ArgReduce { .. } => d != DType::Complex64,
        Primitive::Scan { op, .. } => scan::scan_ops(d).contains(op),
        Primitive::Matmul => d.is_float() || d.is_integer(),
        Primitive::AddMM { .. } => d.is_float(),
        Primitive::Fast(op) => fast::supports(op, d, inputs),
        Primitive::RandomBits { .. } => d == DType::U32,
        Primitive::Sort { axis, .. } => {
            inputs.first().and_then(|x| x.shape.get(*axis)).is_some_and(|&len| sort::supports(len as usize))
        }
        Primitive::CustomKernel(_) => true,
        Primitive::Compiled(c) => compiled::supports(c, inputs, outputs),
        Primitive::Quantize { .. } | Primitive::Dequantize { .. } => quantize::supports(primitive, inputs),
        _ => false,
    }
}

/// Runs `primitive` on the GPU.
pub(crate) fn eval(gpu: &Arc<Gpu>, primitive: &Primitive, inputs: Vec<Operand>, outputs: &mut [Output]) -> Result<()> {
    let mut it = inputs.into_iter();
    let mut next = || it.next().ok_or_else(|| internal(format!("{} is missing an input", primitive.name())));
    match primitive {
        Primitive::Arange { start, step } => copy::arange(gpu, *start, *step, first(outputs)?),
        Primitive::Unary(op) => unary::unary(gpu, *op, next()?, first(outputs)?),
        Primitive::Binary(op) => binary::binary(gpu, *op, next()?, next()?, first(outputs)?),
        Primitive::Select => binary::select(gpu, next()?, next()?, next()?, first(outputs)?),
        Primitive::AsType(_) => copy::astype(gpu, next()?, first(outputs)?),
        Primitive::Copy | Primitive::Reshape(_) | Primitive::BitCast(_) => copy::copy(gpu, next()?, first(outputs)?),
        Primitive::Concatenate { axis } => {
            copy::concatenate(gpu, *axis, std::iter::from_fn(|| next().ok()).collect(), first(outputs)?)
        }
        Primitive::SliceUpdate { start, step, .. } => {
            copy::slice_update(gpu, start, step, next()?, next()?, first(outputs)?)
        }
        Primitive::Reduce { op, axes } => reduce::reduce(gpu, *op, axes, next()?, first(outputs)?),
        Primitive::ArgReduce { op, axis } => reduce::arg_reduce(gpu, *op, *axis, next()?, first(outputs)?),
        Primitive::Scan { op, axis, reverse, inclusive } => {
            scan::scan(gpu, *op, *axis, *reverse, *inclusive, next()?, first(outputs)?)
        }
        Primitive::Matmul => matmul::matmul(gpu, next()?, next()?, None, 1.0, 0.0, first(outputs)?),
        Primitive::AddMM { alpha, beta } => {
            matmul::matmul(gpu, next()?, next()?, Some(next()?), *alpha, *beta, first(outputs)?)
        }
        Primitive::Fast(op) => fast::eval(gpu, op, it.collect(), outputs),
        Primitive::RandomBits { .. } => random::random_bits(gpu, next()?, first(outputs)?),
        Primitive::Sort { op, axis } => sort::sort(gpu, *op, *axis, next()?, first(outputs)?),
        Primitive::GatherAxis { axis } => gather::gather_axis(gpu, *axis, next()?, next()?, first(outputs)?),
        Primitive::ScatterAxis { axis, reduce } => {
            gather::scatter_axis(gpu, *axis, *reduce, next()?, next()?, next()?, first(outputs)?)
        }
        Primitive::Quantize { group_size, bits, .. } => quantize::quantize(gpu, *group_size, *bits, next()?, outputs),
        Primitive::Dequantize { group_size, bits, .. } => {
            quantize::dequantize(gpu, *group_size, *bits, [next()?, next()?, next()?], first(outputs)?)
        }
        Primitive::CustomKernel(spec) => custom_kernel::eval(gpu, spec, it.collect(), outputs),
        Primitive::Compiled(c) => compiled::eval(gpu, c, it.collect(), outputs),
        p => Err(internal(format!("{} is not a GPU primitive", p.name()))),
    }
}

/// The output of a one-output primitive.
fn first(outputs: &mut [Output]) -> Result<&mut Output> {
    outputs.first_mut().ok_or_else(|| internal("no output"))
}
