//! Cross entropy (`kernels/cross_entropy.cuh`): the loss, its derivative given the loss, and
//! both in one read of the logits (a cluster of blocks per row) where that applies.

use nuvec_core::fast::FastOp;
use nuvec_core::storage::Operand;
use nuvec_core::{DType, Result};

use super::{Rows, row_grid};
use crate::driver::Gpu;
use crate::kernels::{Family, Source, ctype};
use crate::launch::{Arg, launch_dependent, resident_clusters};
use crate::operand::{internal, kernel, ptr_of};

/// 16-byte vectors per thread of the fused kernels (cross_entropy.cuh's `U`): each thread holds
/// that many vectors of its row in registers. The wide kernel holds more, in the same 64
/// registers under its 1024-thread bound (ptxas spills a few bytes for 2-byte types).
const FUSED_LOADS: usize = 8;
const WIDE_LOADS: usize = 10;

/// The module of `d`: `cross_entropy`, `cross_entropy_vjp`, and (not for f64: the statistics
/// are f32) `cross_entropy_fused` and `cross_entropy_fused_wide`.
pub(crate) fn source(d: DType) -> String {
    let mut s = Source::new(&["cross_entropy.cuh"]);
    let t = ctype(d);
    let a = ctype(super::acc(d));
    s.kernel(format!(
        "__launch_bounds__(1024) cross_entropy(const {t}* x, const int32_t* t, {a}* loss, u64 rows, u64 len) {{ cross_entropy_rows<{t}>(x, t, loss, rows, len); }}"
    ));
    s.kernel(format!(
        "cross_entropy_vjp(const {t}* x, const int32_t* t, const {a}* g, const {a}* loss, {t}* dx, u64 rows, u64 len) {{ cross_entropy_vjp_rows<{t}>(x, t, g, loss, dx, rows, len); }}"
    ));
    if d != DType::F64 {
        // Clusters need sm_90 (the body traps before).
        for (name, u) in [("cross_entropy_fused", FUSED_LOADS), ("cross_entropy_fused_wide", WIDE_LOADS)] {
            s.kernel(format!(
                "__launch_bounds__(1024) {name}(const {t}* x, const int32_t* t, const float* g, float* loss, {t}* dx, u64 rows, u64 len, u64 slice) {{ cross_entropy_fused_rows<{t}, {u}>(x, t, g, loss, dx, rows, len, slice); }}"
            ));
        }
    }
    s.finish()
}

/// The loss (inputs: logits, targets), its derivative (logits, targets, cotangent, loss), or
/// both (logits, targets, cotangent; outputs: loss, gradient).
pub(crate) fn eval(gpu: &Gpu, op: &FastOp, r: Rows, inputs: &[Operand], out_ptrs: &[u64]) -> Result<()> {
    let x = &inputs[0];
    match op {
        FastOp::CrossEntropy => {
            let ptrs = [ptr_of(x)?, ptr_of(&inputs[1])?, out_ptrs[0]];
            rows(gpu, r, "cross_entropy", &ptrs)
        }
        FastOp::CrossEntropyVjp => {
            let ptrs = [ptr_of(x)?, ptr_of(&inputs[1])?, ptr_of(&inputs[2])?, ptr_of(&inputs[3])?, out_ptrs[0]];
            rows(gpu, r, "cross_entropy_vjp", &ptrs)
        }
        FastOp::CrossEntropyWithGrad => {
            let (xp, t, g) = (ptr_of(x)?, ptr_of(&inputs[1])?, ptr_of(&inputs[2])?);
            let (loss, dx) = (out_ptrs[0], out_ptrs[1]);
            if !fused(gpu, r, [xp, t, g, loss, dx])? {
                rows(gpu, r, "cross_entropy", &[xp, t, loss])?;
                rows(gpu, r, "cross_entropy_vjp", &[xp, t, g, loss, dx])?;
            }
            Ok(())
        }
        _ => Err(internal(format!("no cross-entropy kernel for {}", op.name()))),
    }
}

/// The cross-entropy loss (`ptrs`: logits, targets, loss) or its derivative given the loss
/// (logits, targets, cotangent, loss, gradient): a block per row.
fn rows(gpu: &Gpu, r: Rows, name: &str, ptrs: &[u64]) -> Result<()> {
    let Rows { d, rows, len } = r;
    let mut args: Vec<Arg> = ptrs.iter().map(|&p| Arg::Ptr(p)).collect();
    args.extend([Arg::U64(rows), Arg::U64(len)]);
    // The statistics' loop reads 8 vectors per thread in flight (softmax.cuh): 128 threads per
    // row up to 64 K features, 512 beyond, the faster choices measured (see bench/results/).
    let threads = if len > 65536 { 512 } else { 128 };
    let f = kernel(gpu, Family::CrossEntropy(d), name)?;
    let grid = row_grid(gpu, f, threads, rows, 1)?;
    launch_dependent(gpu, f, grid, (threads, 1), 1, args)
}

/// The loss and the gradient in one read of the logits (cross_entropy.cuh's fused kernel; `ptrs`:
/// logits, targets, cotangent, loss, gradient), where it applies: sm_90 or later, float32 or
/// half logits, rows of whole aligned 16-byte vectors that at most 8 blocks hold in registers.
/// Returns whether it ran.
fn fused(gpu: &Gpu, r: Rows, ptrs: [u64; 5]) -> Result<bool> {
    let Rows { d, rows, len } = r;
    let per = (16 / d.size()) as u64;
    let usable = gpu.info.compute_capability.0 >= 9
        && matches!(d, DType::F32 | DType::F16 | DType::BF16)
        && len.is_multiple_of(per)
        && [ptrs[0], ptrs[4]].iter().all(|p| p % 16 == 0);
    if !usable {
        return Ok(false);
    }
    let nv = (len / per) as usize;
    // Blocks per row (a cluster), threads per block and vectors per thread, from sweeps of
    // bench/cuda/tune_xent.cu (see bench/results/). The registers bound the rows in flight, and
    // a row's blocks meet once per row: rows of up to 4096 vectors in blocks of up to 256
    // threads, up to 16384 in two blocks of up to 1024, longer ones in blocks of 1024 threads
    // holding 10 vectors each.
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
    let f = kernel(gpu, Family::CrossEntropy(d), name)?;
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
