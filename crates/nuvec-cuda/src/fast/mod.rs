//! The fused operations of `nuvec::fast` with kernels of their own, one file each as in the CPU
//! backend: softmax and log-sum-exp, the norms, RoPE, SwiGLU, cross entropy, attention, and
//! products of few rows with quantized weights, paged attention, the gated delta rule, products of matrices picked by index, and the
//! products whose operand a norm or SwiGLU makes (the GEMV of `matmul.rs` applies them as it loads). Which cases they cover is [`supports`] (the rest run as their compositions); [`eval`] makes the inputs
//! row-major, allocates the outputs and hands the rows to the operation's file. Every kernel
//! here is launched with `launch_dependent`.

pub(crate) mod attention;
pub(crate) mod cross_entropy;
pub(crate) mod gated_delta;
pub(crate) mod gather_mm;
pub(crate) mod norm;
pub(crate) mod quantized_matmul;
pub(crate) mod rope;
pub(crate) mod softmax;
pub(crate) mod swiglu;

use std::sync::Arc;

use nuvec_core::fast::FastOp;
use nuvec_core::storage::{Operand, Output, Spec};
use nuvec_core::{DType, Result};

use crate::driver::Gpu;
use crate::launch::resident_blocks;
use crate::operand::{alloc_out, internal, ptr_of, row_major};

/// Whether a fused kernel covers `op` on these inputs (`d`: the dtype of the first input).
pub(crate) fn supports(op: &FastOp, d: DType, inputs: &[Spec]) -> bool {
    if !(nuvec_core::fast::fused_enabled_for(op) && d.is_float()) {
        return false;
    }
    if matches!(op, FastOp::Softmax | FastOp::LogSumExp) {
        return true;
    }
    let Some(d) = inputs.first().map(|s| s.dtype).filter(|d| d.is_float()) else { return false };
    let same = |specs: &[Spec]| specs.iter().all(|s| s.dtype == d);
    let len = inputs[0].shape.last().copied().unwrap_or(1).max(0) as usize;
    match op {
        FastOp::RmsNorm { .. }
        | FastOp::AddRmsNorm { .. }
        | FastOp::LayerNorm { .. }
        | FastOp::SwiGlu
        | FastOp::SwiGluVjp => same(inputs),
        FastOp::RmsNormVjp { .. } => same(inputs) && len <= norm::RMS_SLOTS * norm::VJP_THREADS,
        FastOp::LayerNormVjp { .. } => same(inputs) && len <= norm::LN_SLOTS * norm::VJP_THREADS,
        FastOp::CrossEntropy => inputs[1].dtype == DType::I32,
        FastOp::CrossEntropyVjp => {
            inputs[1].dtype == DType::I32 && inputs[2].dtype == acc(d) && inputs[3].dtype == acc(d)
        }
        FastOp::CrossEntropyWithGrad => inputs[1].dtype == DType::I32 && inputs[2].dtype == acc(d),
        FastOp::Rope(_) => inputs[1].dtype == DType::I32 && inputs.get(2).is_none_or(|f| f.dtype == DType::F32),
        FastOp::Attention(p) => attention::supports(p, inputs),
        FastOp::AttentionVjp(p) => attention::supports_vjp(p, inputs),
        FastOp::QuantizedMatmul(p) => quantized_matmul::supports(p, inputs),
        FastOp::PagedAttention(p) => attention::supports_paged(p, inputs),
        FastOp::GatedDelta(p) => gated_delta::gated_delta_kernel(p, inputs).is_some(),
        FastOp::GatedDeltaVjp(p) => gated_delta::supports_vjp(p, inputs),
        FastOp::GatherMm => gather_mm::supports(inputs),
        FastOp::GatherQmm(p) => quantized_matmul::gather_supports(p, inputs),
        FastOp::RopeKvWrite { rows: given, .. } => {
            let rows: i64 = inputs[0].shape.iter().map(|&d| d as i64).product();
            let cache: i64 = inputs[1].shape.iter().map(|&d| d as i64).product();
            same(&inputs[..3])
                && inputs[3].dtype == DType::I32
                && (!given || inputs[4].dtype == DType::I32)
                && inputs.get(4 + *given as usize).is_none_or(|f| f.dtype == DType::F32)
                && rows.max(cache) < i32::MAX as i64
        }
        FastOp::RmsNormMatmul { .. } | FastOp::SwiGluMatmul { .. } => {
            // The GEMV's few rows (matmul.rs); more rows gain nothing from a prologue.
            let k = inputs[2].shape.first().copied().unwrap_or(0).max(1) as usize;
            same(inputs)
                && d != DType::F64
                && inputs[2].shape.len() == 2
                && (inputs[0].shape.iter().map(|&d| d.max(0) as usize).product::<usize>() / k) as u64
                    <= crate::matmul::gemv_rows_max()
        }
        _ => false,
    }
}

/// The rows an operation runs over: the first input's last axis.
#[derive(Clone, Copy)]
pub(crate) struct Rows {
    /// The dtype of the rows.
    pub d: DType,
    /// How many rows.
    pub rows: u64,
    /// Elements per row.
    pub len: u64,
}

/// Runs `op` with its fused kernels.
pub(crate) fn eval(gpu: &Arc<Gpu>, op: &FastOp, inputs: Vec<Operand>, outputs: &mut [Output]) -> Result<()> {
    // Attention reads through its operands' strides.
    match op {
        FastOp::Attention(p) => return attention::eval(gpu, p, inputs, outputs),
        FastOp::AttentionVjp(p) => return attention::backward(gpu, p, inputs, outputs),
        FastOp::PagedAttention(p) => {
            let out = outputs.first_mut().ok_or_else(|| internal("paged_attention without an output"))?;
            return attention::paged(gpu, p, inputs, out);
        }
        FastOp::QuantizedMatmul(p) => {
            let out = outputs.first_mut().ok_or_else(|| internal("quantized_matmul without an output"))?;
            return quantized_matmul::eval(gpu, p, inputs, out);
        }
        FastOp::RmsNormMatmul { .. } | FastOp::SwiGluMatmul { .. } => {
            let out = outputs.first_mut().ok_or_else(|| internal(format!("{} without an output", op.name())))?;
            return crate::matmul::fused(gpu, op, inputs, out);
        }
        FastOp::RopeKvWrite { rope: p, q_heads, rows } => {
            return rope::kv_write(gpu, p, *q_heads, *rows, inputs, outputs);
        }
        // Reads q, k, v, the gate and beta through their strides.
        FastOp::GatedDelta(p) => return gated_delta::eval(gpu, p, inputs, outputs),
        FastOp::GatedDeltaVjp(p) => return gated_delta::backward(gpu, p, inputs, outputs),
        // Reads the stacks through their strides.
        FastOp::GatherMm => {
            let out = outputs.first_mut().ok_or_else(|| internal("gather_mm without an output"))?;
            return gather_mm::eval(gpu, inputs, out);
        }
        FastOp::GatherQmm(p) => {
            let out = outputs.first_mut().ok_or_else(|| internal("gather_qmm without an output"))?;
            return quantized_matmul::gather_eval(gpu, p, inputs, out);
        }
        _ => {}
    }
    let inputs: Vec<Operand> = inputs.into_iter().map(|x| row_major(gpu, x)).collect::<Result<_>>()?;
    let x = inputs.first().ok_or_else(|| internal(format!("{} is missing an input", op.name())))?;
    let len = x.shape.last().copied().unwrap_or(1).max(0) as u64;
    let rows = Rows { d: x.dtype, rows: (x.size() as u64).checked_div(len).unwrap_or(0), len };
    let out_ptrs: Vec<u64> = outputs.iter_mut().map(|o| alloc_out(gpu, o)).collect::<Result<_>>()?;
    if x.size() == 0 {
        // Weight cotangents of empty rows are zeros.
        for (o, &p) in outputs.iter().zip(&out_ptrs).skip(1) {
            gpu.zero(p, o.size() * o.dtype.size())?;
        }
        return Ok(());
    }
    match op {
        FastOp::Softmax | FastOp::LogSumExp => softmax::eval(gpu, op, rows, ptr_of(x)?, out_ptrs[0]),
        FastOp::RmsNorm { .. }
        | FastOp::AddRmsNorm { .. }
        | FastOp::LayerNorm { .. }
        | FastOp::RmsNormVjp { .. }
        | FastOp::LayerNormVjp { .. } => norm::eval(gpu, op, rows, &inputs, outputs, &out_ptrs),
        FastOp::SwiGlu | FastOp::SwiGluVjp => swiglu::eval(gpu, op, &inputs, &out_ptrs),
        FastOp::CrossEntropy | FastOp::CrossEntropyVjp | FastOp::CrossEntropyWithGrad => {
            cross_entropy::eval(gpu, op, rows, &inputs, &out_ptrs)
        }
        FastOp::Rope(p) => rope::eval(gpu, p, rows, x, &inputs[1], inputs.get(2), out_ptrs[0]),
        _ => Err(internal(format!("no fused kernel for {}", op.name()))),
    }
}

/// The accumulator type of the kernels for rows of `d`.
pub(crate) fn acc(d: DType) -> DType {
    if d == DType::F64 { DType::F64 } else { DType::F32 }
}

/// Blocks for `rows` rows, `per_block` rows per block: as many as fit on the device at once.
pub(crate) fn row_grid(
    gpu: &Gpu,
    f: cudarc::driver::sys::CUfunction,
    threads: u32,
    rows: u64,
    per_block: u64,
) -> Result<u32> {
    let resident = resident_blocks(gpu, f, threads)?.max(1) * gpu.info.multiprocessors.max(1) as u64;
    Ok(rows.div_ceil(per_block.max(1)).clamp(1, resident.min(u32::MAX as u64)) as u32)
}

/// An optional operand's pointer, or null (0).
pub(crate) fn ptr_or_null(x: Option<&Operand>) -> Result<u64> {
    x.map(ptr_of).transpose().map(|p| p.unwrap_or(0))
}
