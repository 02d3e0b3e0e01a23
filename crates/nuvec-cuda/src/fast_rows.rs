//! Launches of the fused row kernels of `kernels/norm.cuh`: RMS norm (with the residual add),
//! layer norm and their derivatives, SwiGLU, cross entropy and RoPE. Which cases they cover is
//! [`supports`]; the rest run as their compositions.

use std::sync::Arc;

use nuvec_core::fast::FastOp;
use nuvec_core::storage::{Operand, Output, Spec};
use nuvec_core::{DType, Result};

use crate::driver::Gpu;
use crate::eval::{alloc, alloc_out, internal, kernel, ptr_of, row_major};
use crate::kernels::Family;
use crate::launch::{Arg, BLOCK, grid_for, launch, resident_blocks};

/// Register slots per thread of the derivative kernels (NV_RMS_SLOTS, NV_LN_SLOTS and
/// NV_NORM_VJP_THREADS in norm.cuh): they take rows of up to slots × threads features.
const RMS_SLOTS: usize = 16;
const LN_SLOTS: usize = 16;
const VJP_THREADS: usize = 512;
const MAX_THREADS: usize = 1024;

/// The accumulator type of the kernels for rows of `d`.
fn acc(d: DType) -> DType {
    if d == DType::F64 { DType::F64 } else { DType::F32 }
}

/// Whether the fused kernels cover `op` on these inputs.
pub(crate) fn supports(op: &FastOp, inputs: &[Spec]) -> bool {
    let Some(d) = inputs.first().map(|s| s.dtype).filter(|d| d.is_float()) else { return false };
    let same = |specs: &[Spec]| specs.iter().all(|s| s.dtype == d);
    let len = inputs[0].shape.last().copied().unwrap_or(1).max(0) as usize;
    match op {
        FastOp::RmsNorm { .. }
        | FastOp::AddRmsNorm { .. }
        | FastOp::LayerNorm { .. }
        | FastOp::SwiGlu
        | FastOp::SwiGluVjp => same(inputs),
        FastOp::RmsNormVjp { .. } => same(inputs) && len <= RMS_SLOTS * VJP_THREADS,
        FastOp::LayerNormVjp { .. } => same(inputs) && len <= LN_SLOTS * VJP_THREADS,
        FastOp::CrossEntropy => inputs[1].dtype == DType::I32,
        FastOp::CrossEntropyVjp => {
            inputs[1].dtype == DType::I32 && inputs[2].dtype == acc(d) && inputs[3].dtype == acc(d)
        }
        FastOp::Rope(_) => inputs[1].dtype == DType::I32 && inputs.get(2).is_none_or(|f| f.dtype == DType::F32),
        _ => false,
    }
}

/// Threads per block for rows of `len`: about two 16-byte vectors per thread, and at least
/// `len / slots` threads when each thread keeps `slots` values of the row in registers.
fn row_threads(d: DType, len: usize, slots: Option<usize>) -> u32 {
    let per_vec = 16 / d.size();
    let mut t = len.div_ceil(2 * per_vec);
    let mut most = MAX_THREADS;
    if let Some(s) = slots {
        t = t.max(len.div_ceil(s));
        most = VJP_THREADS;
    }
    (t.div_ceil(32) * 32).clamp(32, most) as u32
}

/// Blocks for `rows` rows: as many as fit on the device at once, at most one per row.
fn row_grid(gpu: &Gpu, f: cudarc::driver::sys::CUfunction, threads: u32, rows: u64) -> Result<u32> {
    let resident = resident_blocks(gpu, f, threads)?.max(1) * gpu.info.multiprocessors.max(1) as u64;
    Ok(rows.clamp(1, resident.min(u32::MAX as u64)) as u32)
}

/// Blocks of the derivative kernels, each writing one partial row of the weight cotangent:
/// two per SM (enough to fill it; more would add partial rows to sum).
fn vjp_blocks(gpu: &Gpu, rows: u64) -> u64 {
    rows.min(2 * gpu.info.multiprocessors.max(1) as u64).max(1)
}

fn ptr_or_null(x: Option<&Operand>) -> Result<u64> {
    x.map(ptr_of).transpose().map(|p| p.unwrap_or(0))
}

/// Runs `op` with its fused kernel.
pub(crate) fn eval(gpu: &Arc<Gpu>, op: &FastOp, inputs: Vec<Operand>, outputs: &mut [Output]) -> Result<()> {
    let inputs: Vec<Operand> = inputs.into_iter().map(|x| row_major(gpu, x)).collect::<Result<_>>()?;
    let x = &inputs[0];
    let d = x.dtype;
    let len = x.shape.last().copied().unwrap_or(1).max(0) as u64;
    let rows = (x.size() as u64).checked_div(len).unwrap_or(0);
    let out_ptrs: Vec<u64> = outputs.iter_mut().map(|o| alloc_out(gpu, o)).collect::<Result<_>>()?;
    if x.size() == 0 {
        // Weight cotangents of empty rows are zeros.
        for (o, &p) in outputs.iter().zip(&out_ptrs).skip(1) {
            gpu.zero(p, o.size() * o.dtype.size())?;
        }
        return Ok(());
    }
    let fam = Family::Fast(d);
    // A row kernel's arguments: pointers, then rows, len and eps.
    let rows_launch = |name: &str, slots: Option<usize>, ptrs: Vec<u64>, eps: f32| -> Result<u32> {
        let mut args: Vec<Arg> = ptrs.into_iter().map(Arg::Ptr).collect();
        args.extend([Arg::U64(rows), Arg::U64(len), Arg::F32(eps)]);
        let f = kernel(gpu, fam, name)?;
        let threads = row_threads(d, len as usize, slots);
        let grid = match slots {
            // The derivative kernels write one partial row per block: two blocks per SM.
            Some(_) => vjp_blocks(gpu, rows) as u32,
            None => row_grid(gpu, f, threads, rows)?,
        };
        launch(gpu, f, (grid, 1, 1), (threads, 1, 1), 0, args)?;
        Ok(grid)
    };
    match op {
        FastOp::RmsNorm { eps, weighted } => {
            let w = ptr_or_null(weighted.then(|| &inputs[1]))?;
            rows_launch("rms_norm", None, vec![ptr_of(x)?, 0, w, 0, out_ptrs[0]], *eps)?;
        }
        FastOp::AddRmsNorm { eps, weighted } => {
            let w = ptr_or_null(weighted.then(|| &inputs[2]))?;
            let ptrs = vec![ptr_of(x)?, ptr_of(&inputs[1])?, w, out_ptrs[0], out_ptrs[1]];
            rows_launch("rms_norm", None, ptrs, *eps)?;
        }
        FastOp::LayerNorm { eps, weighted, biased } => {
            let w = ptr_or_null(weighted.then(|| &inputs[1]))?;
            let b = ptr_or_null(biased.then(|| &inputs[inputs.len() - 1]))?;
            rows_launch("layer_norm", None, vec![ptr_of(x)?, w, b, out_ptrs[0]], *eps)?;
        }
        FastOp::RmsNormVjp { eps, weighted } => {
            let w = ptr_or_null(weighted.then(|| &inputs[1]))?;
            let g = ptr_of(&inputs[inputs.len() - 1])?;
            let parts = vjp_blocks(gpu, rows);
            let scratch = if *weighted { Some(alloc(gpu, (parts * len) as usize, acc(d))?) } else { None };
            let sp = scratch.as_ref().map_or(0, |s| s.0);
            let grid = rows_launch("rms_norm_vjp", Some(RMS_SLOTS), vec![ptr_of(x)?, w, g, out_ptrs[0], sp], *eps)?;
            if *weighted {
                col_sum(gpu, d, sp, out_ptrs[1], grid as u64, len, len)?;
            }
        }
        FastOp::LayerNormVjp { eps, weighted, biased } => {
            let w = ptr_or_null(weighted.then(|| &inputs[1]))?;
            let g = ptr_of(&inputs[inputs.len() - 1])?;
            let parts = vjp_blocks(gpu, rows);
            let (sp, _keep) = alloc(gpu, (parts * 2 * len) as usize, acc(d))?;
            let grid = rows_launch("layer_norm_vjp", Some(LN_SLOTS), vec![ptr_of(x)?, w, g, out_ptrs[0], sp], *eps)?;
            let mut next = 1;
            for (want, offset) in [(*weighted, 0), (*biased, len)] {
                if want {
                    let part = sp + offset * acc(d).size() as u64;
                    col_sum(gpu, d, part, out_ptrs[next], grid as u64, len, 2 * len)?;
                    next += 1;
                }
            }
        }
        FastOp::SwiGluVjp => {
            let n = x.size() as u64;
            let f = kernel(gpu, fam, "swiglu_vjp")?;
            let grid = grid_for(gpu, n, BLOCK as u64 * (16 / d.size()) as u64);
            let ptrs = [ptr_of(x)?, ptr_of(&inputs[1])?, ptr_of(&inputs[2])?, out_ptrs[0], out_ptrs[1]];
            let mut args: Vec<Arg> = ptrs.map(Arg::Ptr).into();
            args.push(Arg::U64(n));
            launch(gpu, f, (grid, 1, 1), (BLOCK, 1, 1), 0, args)?;
        }
        FastOp::SwiGlu => {
            let n = x.size() as u64;
            let f = kernel(gpu, fam, "swiglu")?;
            let grid = grid_for(gpu, n, BLOCK as u64 * (16 / d.size()) as u64);
            let args = vec![Arg::Ptr(ptr_of(x)?), Arg::Ptr(ptr_of(&inputs[1])?), Arg::Ptr(out_ptrs[0]), Arg::U64(n)];
            launch(gpu, f, (grid, 1, 1), (BLOCK, 1, 1), 0, args)?;
        }
        FastOp::CrossEntropy | FastOp::CrossEntropyVjp => {
            let (name, mut args) = if *op == FastOp::CrossEntropy {
                ("cross_entropy", vec![Arg::Ptr(ptr_of(x)?), Arg::Ptr(ptr_of(&inputs[1])?), Arg::Ptr(out_ptrs[0])])
            } else {
                let (t, g, loss) = (ptr_of(&inputs[1])?, ptr_of(&inputs[2])?, ptr_of(&inputs[3])?);
                ("cross_entropy_vjp", [ptr_of(x)?, t, g, loss, out_ptrs[0]].map(Arg::Ptr).into())
            };
            args.extend([Arg::U64(rows), Arg::U64(len)]);
            // The statistics' loop reads 8 vectors per thread in flight (fast.cuh): a block of
            // 256 threads per row up to 64 K features, 1024 beyond.
            let threads = if len > 65536 { MAX_THREADS as u32 } else { BLOCK };
            let f = kernel(gpu, fam, name)?;
            let grid = row_grid(gpu, f, threads, rows)?;
            launch(gpu, f, (grid, 1, 1), (threads, 1, 1), 0, args)?;
        }
        FastOp::Rope(p) => {
            let nd = x.shape.len();
            let (seq, dims) = (x.shape[nd - 2].max(1) as u64, p.dims as u64);
            let per_batch = (rows / x.shape[0].max(1) as u64).max(1);
            let offset = &inputs[1];
            let freqs = ptr_or_null(inputs.get(2))?;
            let log2_base = p.base.map_or(0.0, f32::log2);
            let args = vec![
                Arg::Ptr(ptr_of(x)?),
                Arg::Ptr(out_ptrs[0]),
                Arg::Ptr(ptr_of(offset)?),
                Arg::I32((offset.shape.len() == 1) as i32),
                Arg::Ptr(freqs),
                Arg::F32(log2_base),
                Arg::F32(p.scale),
                Arg::F32(if p.forward { 1.0 } else { -1.0 }),
                Arg::I32(p.traditional as i32),
                Arg::U64(rows),
                Arg::U64(len),
                Arg::U64(dims),
                Arg::U64(seq),
                Arg::U64(per_batch),
            ];
            let f = kernel(gpu, fam, "rope")?;
            let grid = grid_for(gpu, rows * (dims / 2).max(len - dims), BLOCK as u64);
            launch(gpu, f, (grid, 1, 1), (BLOCK, 1, 1), 0, args)?;
        }
        _ => return Err(internal(format!("no fused kernel for {}", op.name()))),
    }
    Ok(())
}

/// `out[c] = Σ_p part[p · stride + c]`: the derivative kernels' partial rows added up.
fn col_sum(gpu: &Arc<Gpu>, d: DType, part: u64, out: u64, parts: u64, len: u64, stride: u64) -> Result<()> {
    let f = kernel(gpu, Family::Fast(d), "col_sum")?;
    let grid = grid_for(gpu, len, BLOCK as u64);
    let args = vec![Arg::Ptr(part), Arg::Ptr(out), Arg::U64(parts), Arg::U64(len), Arg::U64(stride)];
    launch(gpu, f, (grid, 1, 1), (BLOCK, 1, 1), 0, args)
}
