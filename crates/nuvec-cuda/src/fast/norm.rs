//! RMS norm (with the residual add), layer norm and their derivatives
//! (`kernels/norm_registers.cuh`, `kernels/norm.cuh`): rows held in registers where they fit
//! (a block per row, or groups of threads per row), looping kernels for the rest, and
//! `col_sum` for the derivatives' weight and bias cotangents.

use std::sync::{Arc, Mutex};

use nuvec_core::fast::FastOp;
use nuvec_core::storage::{Operand, Output};
use nuvec_core::{DType, Result};

use super::{Rows, acc, ptr_or_null, row_grid};
use crate::driver::Gpu;
use crate::kernels::{Family, Source, ctype};
use crate::launch::{Arg, launch_dependent};
use crate::operand::{alloc, internal, kernel, ptr_of};

/// Register slots per thread of the derivative kernels (NV_RMS_SLOTS, NV_LN_SLOTS and
/// NV_NORM_VJP_THREADS in norm.cuh): they take rows of up to slots × threads features.
pub(crate) const RMS_SLOTS: usize = 16;
pub(crate) const LN_SLOTS: usize = 16;
pub(crate) const VJP_THREADS: usize = 512;
const MAX_THREADS: usize = 1024;

/// The module of `d`. The register-row kernels by vectors per thread `v` (`row_plan`): `_r{v}`
/// (groups of threads per row), `_o{v}` (a block per row), and for the layer norm's derivative
/// `_e{v}` (rows every thread of a group holds in equal shares); the residual add and the layer
/// norm take at most 4 vectors, their derivatives 4 (RMS) and 2 (layer), as `v_max` says. Then
/// the looping kernels and `col_sum`.
pub(crate) fn source(d: DType) -> String {
    let mut s = Source::new(&["norm_registers.cuh"]);
    let (t, a) = (ctype(d), ctype(acc(d)));
    for v in [2, 4, 8] {
        let lines = [
            format!(
                "__launch_bounds__(NV_REG_BLOCK) rms_norm_r{v}(const {t}* x, const {t}* res, const {t}* w, {t}* h, {t}* out, u64 rows, u64 len, float eps, int group) {{ rms_norm_regs<{t}, {v}, false>(x, res, w, h, out, rows, len, eps, group); }}"
            ),
            format!(
                "__launch_bounds__(NV_REG_BLOCK) add_rms_norm_r{v}(const {t}* x, const {t}* res, const {t}* w, {t}* h, {t}* out, u64 rows, u64 len, float eps, int group) {{ rms_norm_regs<{t}, {v}, true>(x, res, w, h, out, rows, len, eps, group); }}"
            ),
            format!(
                "__launch_bounds__(NV_REG_BLOCK) layer_norm_r{v}(const {t}* x, const {t}* w, const {t}* b, {t}* out, u64 rows, u64 len, float eps, int group) {{ layer_norm_regs<{t}, {v}>(x, w, b, out, rows, len, eps, group); }}"
            ),
            format!(
                "__launch_bounds__(NV_REG_BLOCK) rms_norm_o{v}(const {t}* x, const {t}* res, const {t}* w, {t}* h, {t}* out, u64 rows, u64 len, float eps) {{ rms_norm_one<{t}, {v}, false>(x, res, w, h, out, rows, len, eps); }}"
            ),
            format!(
                "__launch_bounds__(NV_REG_BLOCK) add_rms_norm_o{v}(const {t}* x, const {t}* res, const {t}* w, {t}* h, {t}* out, u64 rows, u64 len, float eps) {{ rms_norm_one<{t}, {v}, true>(x, res, w, h, out, rows, len, eps); }}"
            ),
            format!(
                "__launch_bounds__(NV_REG_BLOCK) layer_norm_o{v}(const {t}* x, const {t}* w, const {t}* b, {t}* out, u64 rows, u64 len, float eps) {{ layer_norm_one<{t}, {v}>(x, w, b, out, rows, len, eps); }}"
            ),
        ];
        for line in lines.iter().filter(|l| v < 8 || l.contains(") rms_norm_")) {
            s.kernel(line);
        }
    }
    for v in [2, 4] {
        let lines = [
            format!(
                "__launch_bounds__(NV_REG_BLOCK, 1) rms_norm_vjp_r{v}(const {t}* x, const {t}* w, const {t}* g, {t}* gx, {a}* part, u64 rows, u64 len, float eps, int group) {{ rms_norm_vjp_regs<{t}, {v}>(x, w, g, gx, part, rows, len, eps, group); }}"
            ),
            format!(
                "__launch_bounds__(NV_REG_BLOCK, 1) layer_norm_vjp_r{v}(const {t}* x, const {t}* w, const {t}* g, {t}* gx, {a}* part, u64 rows, u64 len, float eps, int group) {{ layer_norm_vjp_regs<{t}, {v}, false>(x, w, g, gx, part, rows, len, eps, group); }}"
            ),
            format!(
                "__launch_bounds__(NV_REG_BLOCK, 1) layer_norm_vjp_e{v}(const {t}* x, const {t}* w, const {t}* g, {t}* gx, {a}* part, u64 rows, u64 len, float eps, int group) {{ layer_norm_vjp_regs<{t}, {v}, true>(x, w, g, gx, part, rows, len, eps, group); }}"
            ),
        ];
        for line in lines.iter().filter(|l| v == 2 || l.contains(") rms_norm_vjp_")) {
            s.kernel(line);
        }
    }
    s.kernel(format!(
        "__launch_bounds__(1024) rms_norm(const {t}* x, const {t}* res, const {t}* w, {t}* h, {t}* out, u64 rows, u64 len, float eps) {{ rms_norm_rows<{t}>(x, res, w, h, out, rows, len, eps); }}"
    ));
    s.kernel(format!(
        "__launch_bounds__(1024) layer_norm(const {t}* x, const {t}* w, const {t}* b, {t}* out, u64 rows, u64 len, float eps) {{ layer_norm_rows<{t}>(x, w, b, out, rows, len, eps); }}"
    ));
    s.kernel(format!(
        "__launch_bounds__(NV_NORM_VJP_THREADS) rms_norm_vjp(const {t}* x, const {t}* w, const {t}* g, {t}* gx, {a}* part, u64 rows, u64 len, float eps) {{ rms_norm_vjp_rows<{t}>(x, w, g, gx, part, rows, len, eps); }}"
    ));
    s.kernel(format!(
        "__launch_bounds__(NV_NORM_VJP_THREADS) layer_norm_vjp(const {t}* x, const {t}* w, const {t}* g, {t}* gx, {a}* part, u64 rows, u64 len, float eps) {{ layer_norm_vjp_rows<{t}>(x, w, g, gx, part, rows, len, eps); }}"
    ));
    s.kernel(format!(
        "__launch_bounds__(NV_COL_SUM_THREADS) col_sum(const {a}* part, {a}* out, {a}* out_hi, u64 parts, u64 cols, u64 split, u64 stride) {{ col_sum<{a}, {a}>(part, out, out_hi, parts, cols, split, stride); }}"
    ));
    // The same, rounded to the dtype (the RMS norm's weight cotangent).
    s.kernel(format!(
        "__launch_bounds__(NV_COL_SUM_THREADS) col_sum_round(const {a}* part, {t}* out, {t}* out_hi, u64 parts, u64 cols, u64 split, u64 stride) {{ col_sum<{a}, {t}>(part, out, out_hi, parts, cols, split, stride); }}"
    ));
    s.finish()
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

/// Blocks of the looping derivative kernels, each writing one partial row of the weight
/// cotangent: two per SM (enough to fill it; more would add partial rows to sum).
fn vjp_blocks(gpu: &Gpu, rows: u64) -> u64 {
    rows.min(2 * gpu.info.multiprocessors.max(1) as u64).max(1)
}

/// A norm kernel: its register-row kernels (`{regs}_r{v}`, norm_registers.cuh), its looping kernel
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
    /// 256, the layer norm 512 (the faster of the two; see bench/results/), the derivatives 512 (NV_REG_BLOCK), each block summing its groups' weight partials into one
    /// row.
    block: u32,
}

// The forward norms take their `_o` kernels (a block per row) for rows of 64 vectors or more,
// faster than the `_r` kernels at every measured shape (see bench/results/). In the `_r`
// kernels, with the next row's loads issued early, 2 vectors per thread keep enough bytes in
// flight. The residual add and the layer norm spill with 8; the derivatives also hold the
// cotangent, the next rows and the weight's partial sums: at most 4 for the RMS norm's, 2 for
// the layer norm's.
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
    /// norm_registers.cuh's `_o` kernels: a block per row of `nvec` 16-byte vectors.
    OneRow { nvec: usize },
    /// norm_registers.cuh: `v` 16-byte vectors per thread, `group` threads per row, several groups
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
/// resident against the loads each has in flight: the RMS norm is fastest at 2 per thread, the
/// residual add + RMS norm and the layer norm, which hold more registers, at 4; 8 is never the
/// fastest (`bench/cuda/tune_launch.cu ones`; see bench/results/).
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
    let f = kernel(gpu, Family::Norm(d), &format!("{}_o{v}", k.regs))?;
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
                let f = kernel(gpu, Family::Norm(d), &format!("{}_{kind}{v}", k.regs))?;
                let groups = (k.block / group).max(1);
                let threads = groups * group;
                tail.push(Arg::I32(group as i32));
                (f, threads, row_grid(gpu, f, threads, rows, groups as u64)?)
            }
            RowPlan::Loop => {
                let f = kernel(gpu, Family::Norm(d), k.looping)?;
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

/// A norm (inputs: x, then the residual, weight and bias it takes) or a norm's derivative (x,
/// weight, cotangent; outputs: x's cotangent, then the weight's and bias's).
pub(crate) fn eval(
    gpu: &Arc<Gpu>,
    op: &FastOp,
    r: Rows,
    inputs: &[Operand],
    outputs: &[Output],
    out_ptrs: &[u64],
) -> Result<()> {
    let Rows { d, rows, len } = r;
    let x = &inputs[0];
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
        _ => return Err(internal(format!("no norm kernel for {}", op.name()))),
    }
    Ok(())
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
    let f = kernel(gpu, Family::Norm(d), name)?;
    let per_block = 32 * (16 / acc(d).size()) as u64;
    let grid = cols.div_ceil(per_block).clamp(1, 65535) as u32;
    let args =
        [part, out, out_hi].map(Arg::Ptr).into_iter().chain([parts, cols, split, stride].map(Arg::U64)).collect();
    launch_dependent(gpu, f, grid, (THREADS, 1), 1, args)
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

    #[test]
    fn norm_kernels_exist_for_the_vectors_per_thread_the_plans_may_choose() {
        let source = Family::Norm(DType::BF16).source();
        let has = |name: &str| source.contains(&format!(" {name}("));
        for name in
            ["rms_norm_r8", "rms_norm_o8", "add_rms_norm_o4", "layer_norm_o4", "rms_norm_vjp_r4", "layer_norm_vjp_e2"]
        {
            assert!(has(name), "{name}");
        }
        // Past the residual add's and layer norm's `v_max` (4; their derivative's 2): not built.
        for name in [
            "add_rms_norm_r8",
            "add_rms_norm_o8",
            "layer_norm_r8",
            "layer_norm_o8",
            "layer_norm_vjp_r4",
            "layer_norm_vjp_e4",
        ] {
            assert!(!has(name), "{name}");
        }
        // Every kernel a plan may name is built: each kernel's `v_min` to `v_max`.
        for k in [&RMS_NORM, &ADD_RMS_NORM, &LAYER_NORM, &RMS_NORM_VJP, &LAYER_NORM_VJP] {
            let mut v = k.v_min;
            while v <= k.v_max {
                assert!(has(&format!("{}_r{v}", k.regs)), "{}_r{v}", k.regs);
                if k.equal {
                    assert!(has(&format!("{}_e{v}", k.regs)), "{}_e{v}", k.regs);
                }
                if k.one_row.is_some() {
                    assert!(has(&format!("{}_o{v}", k.regs)), "{}_o{v}", k.regs);
                }
                v *= 2;
            }
            assert!(has(k.looping), "{}", k.looping);
        }
    }
}
