//! Launches of the fused row kernels of `kernels/norm.cuh`, `kernels/norm_regs.cuh`,
//! `kernels/cross_entropy.cuh` and `kernels/rope.cuh`: RMS norm (with the residual add), layer
//! norm and their derivatives, SwiGLU, cross entropy and RoPE. Which cases they cover is
//! [`supports`]; the rest run as their compositions.

use std::sync::{Arc, Mutex};

use nuvec_core::fast::{FastOp, RopeParams};
use nuvec_core::storage::{Operand, Output, Spec};
use nuvec_core::{DType, Result};

use crate::driver::Gpu;
use crate::eval::{alloc, alloc_out, internal, kernel, ptr_of, row_major};
use crate::kernels::Family;
use crate::launch::{Arg, BLOCK, launch_dependent, resident_blocks, resident_clusters};

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
        FastOp::CrossEntropyWithGrad => inputs[1].dtype == DType::I32 && inputs[2].dtype == acc(d),
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

/// Blocks for `rows` rows, `per_block` rows per block: as many as fit on the device at once.
fn row_grid(gpu: &Gpu, f: cudarc::driver::sys::CUfunction, threads: u32, rows: u64, per_block: u64) -> Result<u32> {
    let resident = resident_blocks(gpu, f, threads)?.max(1) * gpu.info.multiprocessors.max(1) as u64;
    Ok(rows.div_ceil(per_block.max(1)).clamp(1, resident.min(u32::MAX as u64)) as u32)
}

/// Blocks of the looping derivative kernels, each writing one partial row of the weight
/// cotangent: two per SM (enough to fill it; more would add partial rows to sum).
fn vjp_blocks(gpu: &Gpu, rows: u64) -> u64 {
    rows.min(2 * gpu.info.multiprocessors.max(1) as u64).max(1)
}

/// Blocks of `BLOCK` threads for an element-wise kernel over `n` elements of `d`, one 16-byte
/// vector per thread: the whole array in one pass (the kernels' grid-stride loops then run
/// once where the pointers are 16-byte aligned; otherwise their scalar loops take it all).
/// H200, bf16 SwiGLU 32768×14336: 96.8% of copy with the grid capped at 32 blocks per SM,
/// 102.8% so (the two reads and one write beat a copy's one and one), derivative 4096 rows
/// 94.3% → 99.5%.
fn vector_grid(d: DType, n: u64) -> u32 {
    n.div_ceil((16 / d.size()) as u64).div_ceil(BLOCK as u64).clamp(1, i32::MAX as u64) as u32
}

/// A norm kernel: its register-row kernels (`{regs}_r{v}`, norm_regs.cuh), its looping kernel
/// (norm.cuh), and how the register kernels are launched.
struct NormKernel {
    regs: &'static str,
    /// Whether there is a register kernel `{regs}_e{v}` for rows that every thread of a group
    /// of 32·2^k holds in equal shares (one reduction of merged moments instead of two).
    equal: bool,
    /// Where there are one-row-per-block kernels `{regs}_o{v}` (the forward norms): the vectors
    /// per thread they take where the row allows (`one_row_kernel`).
    one_row: Option<usize>,
    /// The looping kernel, for rows the register kernels do not take (one RMS norm serves the
    /// residual add too, with a null residual).
    looping: &'static str,
    /// Register slots per thread of the looping derivative kernels; `None` for forward kernels.
    slots: Option<usize>,
    /// Vectors per thread: `v_min` where groups of up to 512 threads hold the row, more for
    /// longer rows, at most `v_max` (more spills under ptxas, sm_90a).
    v_min: usize,
    v_max: usize,
    /// Threads per block: as many groups of G as fit (at least one). The RMS norm forward takes
    /// 256, the layer norm 512 (H200, bf16 32768×4096: 88.6% against 86.5% with 256), the
    /// derivatives 512 (NV_REG_BLOCK), each block summing its groups' weight partials into one
    /// row.
    block: u32,
}

// The forward norms take their `_o` kernels (a block per row) for rows of 64 vectors or more:
// H200, bf16, bench_fast, against the `_r` kernels: 32768 rows, RMS norm 94–97% of copy (86–92%),
// residual add + RMS norm 99% (90%), layer norm 96% (88%); 4096 rows, residual add 86% (81%),
// layer norm 74–75% (70%); 1 and 16 rows, a shorter call either way. (The plain RMS norm at 4096
// rows was slower so, 67–82% against 74–84%, while its `_o` kernel took 8 vectors per thread;
// at 2, 87.5% against 83.9% in the sweep: `one_row_kernel`.)
// In the `_r` kernels, with the next row's loads issued early, 2 vectors per thread keep enough
// bytes in flight (H200, bf16 RMS norm and layer norm rows of 2048–8192: 2 beat 4 and 8 once the
// outputs are rounded in packed pairs; before, the layer norm was faster with 4). The residual
// add and the layer norm spill with 8; the derivatives also hold the cotangent, the next rows and
// the weight's partial sums: at most 4 for the RMS norm's, 2 for the layer norm's.
const RMS_NORM: NormKernel = NormKernel {
    regs: "rms_norm",
    equal: false,
    one_row: Some(2),
    looping: "rms_norm",
    slots: None,
    v_min: 2,
    v_max: 8,
    block: 256,
};
const ADD_RMS_NORM: NormKernel = NormKernel {
    regs: "add_rms_norm",
    equal: false,
    one_row: Some(4),
    looping: "rms_norm",
    slots: None,
    v_min: 2,
    v_max: 4,
    block: 256,
};
const LAYER_NORM: NormKernel = NormKernel {
    regs: "layer_norm",
    equal: false,
    one_row: Some(4),
    looping: "layer_norm",
    slots: None,
    v_min: 2,
    v_max: 4,
    block: 512,
};
const RMS_NORM_VJP: NormKernel = NormKernel {
    regs: "rms_norm_vjp",
    equal: false,
    one_row: None,
    looping: "rms_norm_vjp",
    slots: Some(RMS_SLOTS),
    v_min: 2,
    v_max: 4,
    block: 512,
};
const LAYER_NORM_VJP: NormKernel = NormKernel {
    regs: "layer_norm_vjp",
    equal: true,
    one_row: None,
    looping: "layer_norm_vjp",
    slots: Some(LN_SLOTS),
    v_min: 2,
    v_max: 2,
    block: 512,
};

/// How a norm kernel covers its rows.
#[derive(Clone, Copy)]
enum RowPlan {
    /// norm_regs.cuh's `_o` kernels: a block per row of `nvec` 16-byte vectors.
    OneRow { nvec: usize },
    /// norm_regs.cuh: `v` 16-byte vectors per thread, `group` threads per row, several groups
    /// per block.
    Regs { v: usize, group: u32, equal: bool },
    /// norm.cuh's looping kernels, one block per row.
    Loop,
}

/// The register kernels take rows of whole, aligned 16-byte vectors that `k`'s vectors per
/// thread cover with at most 512 threads.
fn row_plan(d: DType, len: usize, ptrs: &[u64], k: &NormKernel) -> RowPlan {
    let per = 16 / d.size();
    let nvec = len / per;
    let mut v = k.v_min;
    while v < k.v_max && nvec.div_ceil(v) > 512 {
        v *= 2;
    }
    if nvec == 0 || !len.is_multiple_of(per) || ptrs.iter().any(|p| p % 16 != 0) || nvec.div_ceil(v) > 512 {
        return RowPlan::Loop;
    }
    // A block per row from 64 vectors (a warp at 2 per thread) up; shorter rows share blocks in
    // groups.
    if k.one_row.is_some() && nvec >= 64 && nvec <= 512 * k.v_max && one_rows_enabled() {
        return RowPlan::OneRow { nvec };
    }
    let group = nvec.div_ceil(v).div_ceil(32) * 32;
    let equal = nvec == v * group && (group / 32).is_power_of_two();
    RowPlan::Regs { v, group: group as u32, equal }
}

/// Whether the forward norms may take their `_o` kernels: `NUVEC_NORM_ONE_ROW=0` keeps the
/// persistent `_r` kernels (for comparisons).
fn one_rows_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("NUVEC_NORM_ONE_ROW").map_or(true, |v| v != "0"))
}

/// The `_o` kernel for rows of `nvec` vectors and its block size: `k.one_row` vectors per thread,
/// more where the row needs over 512 threads, fewer where it would leave a block under 64.
/// Those kernels are latency-bound, and the number of vectors per thread trades the threads
/// resident against the loads each has in flight. H200, bf16, % of copy at 4096 and 32768 rows
/// of 2048, 4096 and 8192 (`bench/cuda/tune_launch.cu ones`): the RMS norm is fastest at 2 per
/// thread (4096×8192: 93.6%, 4 per thread 92.4%, 8 90.4%), the residual add + RMS norm and
/// the layer norm, which hold more registers, at 4 (4096×8192: 94.8% and 90.0%, at 2 87.7%
/// and 81.9%, as few blocks of 512 fit); 8 per thread is never the fastest.
fn one_row_kernel(gpu: &Gpu, d: DType, k: &NormKernel, nvec: usize) -> Result<(cudarc::driver::sys::CUfunction, u32)> {
    // The choice per device, dtype, kernel and row length, made once: the small calls are
    // bound by the host.
    type Key = (usize, DType, &'static str, usize);
    static CHOSEN: Mutex<Vec<(Key, (usize, u32))>> = Mutex::new(Vec::new());
    let key = (gpu as *const Gpu as usize, d, k.regs, nvec);
    if let Some(&(_, (f, t))) = CHOSEN.lock().unwrap_or_else(|e| e.into_inner()).iter().find(|(c, _)| *c == key) {
        return Ok((f as cudarc::driver::sys::CUfunction, t));
    }
    // `NUVEC_NORM_ONE_V` (2, 4 or 8) overrides the preference, for comparisons.
    let forced = std::env::var("NUVEC_NORM_ONE_V").ok().and_then(|v| v.parse::<usize>().ok());
    let v = one_row_vectors(k, nvec, forced)
        .ok_or_else(|| internal(format!("no one-row kernel for rows of {nvec} vectors")))?;
    let threads = nvec.div_ceil(v).next_multiple_of(32);
    let f = kernel(gpu, Family::Fast(d), &format!("{}_o{v}", k.regs))?;
    CHOSEN.lock().unwrap_or_else(|e| e.into_inner()).push((key, (f as usize, threads as u32)));
    Ok((f, threads as u32))
}

/// Vectors per thread of `k`'s `_o` kernel for rows of `nvec` vectors (`one_row_kernel`): the
/// preferred count (`want`, else `k.one_row`), doubled while a row needs over 512 threads,
/// halved while a block would have under 64; `None` where no kernel of 2 to `k.v_max` vectors
/// per thread covers the row with 32 to 512 threads.
fn one_row_vectors(k: &NormKernel, nvec: usize, want: Option<usize>) -> Option<usize> {
    let mut v = want.or(k.one_row).unwrap_or(2).clamp(2, k.v_max).next_power_of_two();
    while v < k.v_max && nvec.div_ceil(v) > 512 {
        v *= 2;
    }
    while v > 2 && nvec.div_ceil(v) < 64 {
        v /= 2;
    }
    (32..=512).contains(&nvec.div_ceil(v).next_multiple_of(32)).then_some(v)
}

/// A norm kernel ready to launch: its function, block, grid and trailing arguments.
struct RowLaunch {
    f: cudarc::driver::sys::CUfunction,
    threads: u32,
    grid: u32,
    tail: Vec<Arg>,
}

impl RowLaunch {
    /// `k` for `rows` rows of `len` elements at `ptrs`.
    fn new(gpu: &Gpu, d: DType, k: &NormKernel, ptrs: &[u64], rows: u64, len: u64, eps: f32) -> Result<RowLaunch> {
        let mut tail = vec![Arg::U64(rows), Arg::U64(len), Arg::F32(eps)];
        let (f, threads, grid) = match row_plan(d, len as usize, ptrs, k) {
            RowPlan::OneRow { nvec } => {
                let (f, threads) = one_row_kernel(gpu, d, k, nvec)?;
                (f, threads, rows.clamp(1, i32::MAX as u64) as u32)
            }
            RowPlan::Regs { v, group, equal } => {
                let kind = if k.equal && equal { 'e' } else { 'r' };
                let f = kernel(gpu, Family::Fast(d), &format!("{}_{kind}{v}", k.regs))?;
                let groups = (k.block / group).max(1);
                let threads = groups * group;
                tail.push(Arg::I32(group as i32));
                (f, threads, row_grid(gpu, f, threads, rows, groups as u64)?)
            }
            RowPlan::Loop => {
                let f = kernel(gpu, Family::Fast(d), k.looping)?;
                let threads = row_threads(d, len as usize, k.slots);
                // The derivative kernels write one partial row per block: two blocks per SM.
                let grid = match k.slots {
                    Some(_) => vjp_blocks(gpu, rows) as u32,
                    None => row_grid(gpu, f, threads, rows, 1)?,
                };
                (f, threads, grid)
            }
        };
        Ok(RowLaunch { f, threads, grid, tail })
    }

    fn run(self, gpu: &Gpu, ptrs: &[u64]) -> Result<()> {
        let mut args: Vec<Arg> = ptrs.iter().map(|&p| Arg::Ptr(p)).collect();
        args.extend(self.tail);
        launch_dependent(gpu, self.f, self.grid, (self.threads, 1), 1, args)
    }
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
    let norm = |k: &NormKernel, ptrs: &[u64], eps: f32| RowLaunch::new(gpu, d, k, ptrs, rows, len, eps);
    match op {
        FastOp::RmsNorm { eps, weighted } => {
            let w = ptr_or_null(weighted.then(|| &inputs[1]))?;
            let ptrs = [ptr_of(x)?, 0, w, 0, out_ptrs[0]];
            norm(&RMS_NORM, &ptrs, *eps)?.run(gpu, &ptrs)?;
        }
        FastOp::AddRmsNorm { eps, weighted } => {
            let w = ptr_or_null(weighted.then(|| &inputs[2]))?;
            let ptrs = [ptr_of(x)?, ptr_of(&inputs[1])?, w, out_ptrs[0], out_ptrs[1]];
            norm(&ADD_RMS_NORM, &ptrs, *eps)?.run(gpu, &ptrs)?;
        }
        FastOp::LayerNorm { eps, weighted, biased } => {
            let w = ptr_or_null(weighted.then(|| &inputs[1]))?;
            let b = ptr_or_null(biased.then(|| &inputs[inputs.len() - 1]))?;
            let ptrs = [ptr_of(x)?, w, b, out_ptrs[0]];
            norm(&LAYER_NORM, &ptrs, *eps)?.run(gpu, &ptrs)?;
        }
        FastOp::RmsNormVjp { eps, weighted } => {
            let w = ptr_or_null(weighted.then(|| &inputs[1]))?;
            let g = ptr_of(&inputs[inputs.len() - 1])?;
            let mut ptrs = [ptr_of(x)?, w, g, out_ptrs[0], 0];
            let run = norm(&RMS_NORM_VJP, &ptrs, *eps)?;
            // One partial row of the weight's cotangent per block, summed and rounded to the
            // weight's dtype, which `supports` makes x's.
            debug_assert!(outputs.get(1).is_none_or(|o| o.dtype == d));
            let parts = run.grid as u64;
            let scratch = if *weighted { Some(alloc(gpu, (parts * len) as usize, acc(d))?) } else { None };
            ptrs[4] = scratch.as_ref().map_or(0, |s| s.0);
            run.run(gpu, &ptrs)?;
            if *weighted {
                col_sum(gpu, d, "col_sum_round", ptrs[4], out_ptrs[1], 0, parts, len, len, len)?;
            }
        }
        FastOp::LayerNormVjp { eps, weighted, biased } => {
            let w = ptr_or_null(weighted.then(|| &inputs[1]))?;
            let g = ptr_of(&inputs[inputs.len() - 1])?;
            let mut ptrs = [ptr_of(x)?, w, g, out_ptrs[0], 0];
            let run = norm(&LAYER_NORM_VJP, &ptrs, *eps)?;
            let parts = run.grid as u64;
            let (sp, _keep) = alloc(gpu, (parts * 2 * len) as usize, acc(d))?;
            ptrs[4] = sp;
            run.run(gpu, &ptrs)?;
            // Weight and bias partials side by side in each part row: one sum over both.
            let mut outs = out_ptrs[1..].iter().copied();
            let w_out = if *weighted { outs.next().unwrap_or(0) } else { 0 };
            let b_out = if *biased { outs.next().unwrap_or(0) } else { 0 };
            if *weighted || *biased {
                col_sum(gpu, d, "col_sum", sp, w_out, b_out, parts, 2 * len, len, 2 * len)?;
            }
        }
        FastOp::SwiGluVjp => {
            let n = x.size() as u64;
            let f = kernel(gpu, fam, "swiglu_vjp")?;
            let ptrs = [ptr_of(x)?, ptr_of(&inputs[1])?, ptr_of(&inputs[2])?, out_ptrs[0], out_ptrs[1]];
            let mut args: Vec<Arg> = ptrs.map(Arg::Ptr).into();
            args.push(Arg::U64(n));
            launch_dependent(gpu, f, vector_grid(d, n), (BLOCK, 1), 1, args)?;
        }
        FastOp::SwiGlu => {
            let n = x.size() as u64;
            let f = kernel(gpu, fam, "swiglu")?;
            let args = vec![Arg::Ptr(ptr_of(x)?), Arg::Ptr(ptr_of(&inputs[1])?), Arg::Ptr(out_ptrs[0]), Arg::U64(n)];
            launch_dependent(gpu, f, vector_grid(d, n), (BLOCK, 1), 1, args)?;
        }
        FastOp::CrossEntropy => {
            let ptrs = [ptr_of(x)?, ptr_of(&inputs[1])?, out_ptrs[0]];
            cross_entropy(gpu, d, "cross_entropy", &ptrs, rows, len)?;
        }
        FastOp::CrossEntropyVjp => {
            let ptrs = [ptr_of(x)?, ptr_of(&inputs[1])?, ptr_of(&inputs[2])?, ptr_of(&inputs[3])?, out_ptrs[0]];
            cross_entropy(gpu, d, "cross_entropy_vjp", &ptrs, rows, len)?;
        }
        FastOp::CrossEntropyWithGrad => {
            let (xp, t, g) = (ptr_of(x)?, ptr_of(&inputs[1])?, ptr_of(&inputs[2])?);
            let (loss, dx) = (out_ptrs[0], out_ptrs[1]);
            if !cross_entropy_fused(gpu, d, [xp, t, g, loss, dx], rows, len)? {
                cross_entropy(gpu, d, "cross_entropy", &[xp, t, loss], rows, len)?;
                cross_entropy(gpu, d, "cross_entropy_vjp", &[xp, t, g, loss, dx], rows, len)?;
            }
        }
        FastOp::Rope(p) => rope(gpu, p, x, &inputs[1], inputs.get(2), out_ptrs[0], rows, len)?,
        _ => return Err(internal(format!("no fused kernel for {}", op.name()))),
    }
    Ok(())
}

/// The cross-entropy loss (`ptrs`: logits, targets, loss) or its derivative given the loss
/// (logits, targets, cotangent, loss, gradient): a block per row.
fn cross_entropy(gpu: &Gpu, d: DType, name: &str, ptrs: &[u64], rows: u64, len: u64) -> Result<()> {
    let mut args: Vec<Arg> = ptrs.iter().map(|&p| Arg::Ptr(p)).collect();
    args.extend([Arg::U64(rows), Arg::U64(len)]);
    // The statistics' loop reads 8 vectors per thread in flight (fast.cuh): 128 threads per row
    // up to 64 K features, 512 beyond (H200, bf16 4096 rows: 32000 wide 91% of copy with 128,
    // 83% with 256; 128256 wide 95% with 512, 84% with 1024, one block per SM that idles while
    // it reduces).
    let threads = if len > 65536 { 512 } else { 128 };
    let f = kernel(gpu, Family::Fast(d), name)?;
    let grid = row_grid(gpu, f, threads, rows, 1)?;
    launch_dependent(gpu, f, grid, (threads, 1), 1, args)
}

/// 16-byte vectors per thread of the fused cross-entropy kernels (cross_entropy.cuh's `U`): each
/// thread holds that many vectors of its row in registers. The wide kernel holds more, in the
/// same 64 registers under its 1024-thread bound (nvcc's ptxas, sm_90a: 12 bytes of spills for
/// bf16/f16, none for f32; 78% of copy at 152064 bf16 classes all the same).
const FUSED_LOADS: usize = 8;
const WIDE_LOADS: usize = 10;

/// The loss and the gradient in one read of the logits (cross_entropy.cuh's fused kernel; `ptrs`:
/// logits, targets, cotangent, loss, gradient), where it applies: sm_90 or later, float32 or
/// half logits, rows of whole aligned 16-byte vectors that at most 8 blocks hold in registers.
/// Returns whether it ran.
fn cross_entropy_fused(gpu: &Gpu, d: DType, ptrs: [u64; 5], rows: u64, len: u64) -> Result<bool> {
    let per = (16 / d.size()) as u64;
    let usable = gpu.info.compute_capability.0 >= 9
        && matches!(d, DType::F32 | DType::F16 | DType::BF16)
        && len.is_multiple_of(per)
        && [ptrs[0], ptrs[4]].iter().all(|p| p % 16 == 0);
    if !usable {
        return Ok(false);
    }
    let nv = (len / per) as usize;
    // Blocks per row (a cluster), threads per block and vectors per thread, from sweeps on the
    // H200 (bf16, 4096 rows; bench/cuda/tune_xent.cu). The registers bound the rows in flight,
    // and a row's blocks meet once per row: rows of up to 4096 vectors in blocks of up to 256
    // threads (32000 classes, two blocks: 77-79% of copy; one of 512: 77-79%, four of 128:
    // 75%), up to 16384 in two blocks of up to 1024 (128256: 77-79%; four of 512: 70%, eight of
    // 256: 74%), longer ones in blocks of 1024 threads holding 10 vectors each (152064: two
    // blocks, 80%; with 8 vectors, five blocks of 480: 65-67%, eight of 320: 67%, three of
    // 1024: 60%; two blocks with 2 more vectors per thread in shared memory: 78%).
    let (threads, cluster, wide) = if nv <= 4096 {
        (nv.div_ceil(FUSED_LOADS).clamp(32, 256), nv.div_ceil(256 * FUSED_LOADS), false)
    } else if nv <= 16384 {
        (nv.div_ceil(2 * FUSED_LOADS), 2, false)
    } else {
        (1024, nv.div_ceil(1024 * WIDE_LOADS), true)
    };
    let threads = threads.next_multiple_of(32);
    if cluster > 8 {
        return Ok(false);
    }
    let name = if wide { "cross_entropy_fused_wide" } else { "cross_entropy_fused" };
    let f = kernel(gpu, Family::Fast(d), name)?;
    let resident = resident_clusters(gpu, f, threads as u32, cluster as u32)?;
    if resident == 0 {
        return Ok(false);
    }
    let clusters = rows.min(resident).min(u32::MAX as u64 / 8);
    let slice = nv.div_ceil(cluster) as u64;
    let mut args: Vec<Arg> = ptrs.map(Arg::Ptr).into();
    args.extend([Arg::U64(rows), Arg::U64(len), Arg::U64(slice)]);
    launch_dependent(gpu, f, (clusters * cluster as u64) as u32, (threads as u32, 1), cluster as u32, args)?;
    Ok(true)
}

/// The derivative kernels' partial rows added up (col_sum in norm.cuh): for each column
/// `c < cols`, `Σ_p part[p · stride + c]` goes to `out[c]` below `split`, else to
/// `out_hi[c − split]`; a null (0) output is skipped. 128 f32 columns per block. `name`:
/// `col_sum` writes the accumulator's dtype, `col_sum_round` rounds to `d`.
#[allow(clippy::too_many_arguments)]
fn col_sum(
    gpu: &Arc<Gpu>,
    d: DType,
    name: &str,
    part: u64,
    out: u64,
    out_hi: u64,
    parts: u64,
    cols: u64,
    split: u64,
    stride: u64,
) -> Result<()> {
    const THREADS: u32 = 512; // NV_COL_SUM_THREADS
    let f = kernel(gpu, Family::Fast(d), name)?;
    let per_block = 32 * (16 / acc(d).size()) as u64;
    let grid = cols.div_ceil(per_block).clamp(1, 65535) as u32;
    let args =
        [part, out, out_hi].map(Arg::Ptr).into_iter().chain([parts, cols, split, stride].map(Arg::U64)).collect();
    launch_dependent(gpu, f, grid, (THREADS, 1), 1, args)
}

/// RoPE (rope.cuh): a thread per chunk of a row's features, rows in memory order.
#[allow(clippy::too_many_arguments)]
fn rope(
    gpu: &Arc<Gpu>,
    p: &RopeParams,
    x: &Operand,
    offset: &Operand,
    freqs: Option<&Operand>,
    out: u64,
    rows: u64,
    len: u64,
) -> Result<()> {
    let d = x.dtype;
    let nd = x.shape.len();
    let (seq, dims) = (x.shape[nd - 2].max(1) as u64, p.dims as u64);
    // Rows per offset entry (a per-batch offset indexes the first axis).
    let per_batch = (rows / x.shape[0].max(1) as u64).max(1);
    let (xp, per) = (ptr_of(x)?, (16 / d.size()) as u64);
    let rotated = if p.traditional { dims } else { dims / 2 };
    let vec = xp.is_multiple_of(16) && out.is_multiple_of(16) && len.is_multiple_of(per) && rotated.is_multiple_of(per);
    let (name, width) = match (vec, p.traditional) {
        (true, false) => ("rope_vec", per),
        (true, true) => ("rope_vec_t", per),
        (false, false) => ("rope_s1", 1),
        (false, true) => ("rope_s2", 2),
    };
    let chunks = rotated / width + (len - dims).div_ceil(width);
    // Block: a row's chunks across x, rows across y; the grid covers the rows in memory order.
    let bx = chunks.clamp(1, BLOCK as u64);
    let by = (BLOCK as u64 / bx).max(1);
    let gx = rows.div_ceil(by).clamp(1, i32::MAX as u64);
    let args = vec![
        Arg::Ptr(xp),
        Arg::Ptr(out),
        Arg::Ptr(ptr_of(offset)?),
        Arg::I32((offset.shape.len() == 1) as i32),
        Arg::Ptr(ptr_or_null(freqs)?),
        Arg::F32(p.base.map_or(0.0, f32::log2)),
        Arg::F32(p.scale),
        Arg::F32(if p.forward { 1.0 } else { -1.0 }),
        Arg::U64(rows),
        Arg::U64(len),
        Arg::U64(dims),
        Arg::U64(seq),
        Arg::U64(per_batch),
    ];
    let f_suffix = if freqs.is_some() { "_f" } else { "" };
    let wide = if rows > u32::MAX as u64 { "_w" } else { "" };
    let f = kernel(gpu, Family::Fast(d), &format!("{name}{f_suffix}{wide}"))?;
    launch_dependent(gpu, f, gx as u32, (bx as u32, by as u32), 1, args)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(d: DType, len: usize, ptr: u64, k: &NormKernel) -> &'static str {
        match row_plan(d, len, &[ptr, 0], k) {
            RowPlan::OneRow { .. } => "one row",
            RowPlan::Regs { .. } => "regs",
            RowPlan::Loop => "loop",
        }
    }

    #[test]
    fn norm_rows_take_the_kernels_their_rules_name() {
        let one = if one_rows_enabled() { "one row" } else { "regs" };
        // Forward norms: a block per row from 64 vectors.
        assert_eq!(plan(DType::BF16, 4096, 0, &RMS_NORM), one);
        assert_eq!(plan(DType::BF16, 4096, 0, &LAYER_NORM), one);
        assert_eq!(plan(DType::F32, 8192, 0, &ADD_RMS_NORM), one);
        // Short rows share blocks in groups; derivatives keep their persistent kernels.
        assert_eq!(plan(DType::BF16, 256, 0, &RMS_NORM), "regs");
        assert_eq!(plan(DType::BF16, 4096, 0, &RMS_NORM_VJP), "regs");
        assert_eq!(plan(DType::BF16, 4096, 0, &LAYER_NORM_VJP), "regs");
        // Ragged or unaligned rows, and rows past 512 threads' vectors, loop.
        assert_eq!(plan(DType::BF16, 4100, 0, &RMS_NORM), "loop");
        assert_eq!(plan(DType::BF16, 4096, 8, &RMS_NORM), "loop");
        assert_eq!(plan(DType::F32, 65536, 0, &LAYER_NORM), "loop");
        assert_eq!(plan(DType::BF16, 32768, 0, &RMS_NORM), one);
    }

    #[test]
    fn one_row_kernels_take_their_vectors_per_thread_where_the_row_allows() {
        // bf16 rows of 2048, 4096, 8192, 16384 and 32768: 256, 512, 1024, 2048, 4096 vectors.
        let v = |k: &NormKernel, nvec: usize| one_row_vectors(k, nvec, None);
        assert_eq!([256, 512, 1024, 4096].map(|n| v(&RMS_NORM, n)), [Some(2), Some(2), Some(2), Some(8)]);
        assert_eq!([256, 512, 1024, 2048].map(|n| v(&LAYER_NORM, n)), [Some(4), Some(4), Some(4), Some(4)]);
        assert_eq!(v(&ADD_RMS_NORM, 4096), None);
        // Short rows: fewer vectors, so that a block keeps 64 threads; long ones more, so that
        // it stays within 512.
        assert_eq!(v(&LAYER_NORM, 128), Some(2));
        assert_eq!(v(&RMS_NORM, 2048), Some(4));
        assert_eq!(one_row_vectors(&LAYER_NORM, 1024, Some(2)), Some(2));
    }
}
