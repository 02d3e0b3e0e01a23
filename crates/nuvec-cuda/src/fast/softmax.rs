//! Softmax and log-sum-exp over rows (`kernels/softmax.cuh`): a warp per row up to 64 KiB
//! rows, a block per row above.

use nuvec_core::fast::FastOp;
use nuvec_core::{DType, Result};

use super::Rows;
use crate::driver::Gpu;
use crate::kernels::{Family, Source, ctype};
use crate::launch::{Arg, BLOCK, grid_for, launch_dependent};
use crate::operand::{internal, kernel};
use crate::reduce::WARP_ROW_BYTES;

/// The module of `d`: `softmax`, `logsumexp` and their `_warp` forms.
pub(crate) fn source(d: DType) -> String {
    let mut s = Source::new(&["softmax.cuh"]);
    let t = ctype(d);
    for (name, f) in [("softmax", "softmax_rows"), ("logsumexp", "logsumexp_rows")] {
        s.kernel(format!("{name}(const {t}* x, {t}* out, u64 rows, u64 len) {{ {f}<{t}>(x, out, rows, len); }}"));
        s.kernel(format!(
            "{name}_warp(const {t}* x, {t}* out, u64 rows, u64 len) {{ {f}_warp<{t}>(x, out, rows, len); }}"
        ));
    }
    s.finish()
}

/// Softmax or log-sum-exp of the rows at `x` into `out`.
pub(crate) fn eval(gpu: &Gpu, op: &FastOp, r: Rows, x: u64, out: u64) -> Result<()> {
    let Rows { d, rows, len } = r;
    let name = match op {
        FastOp::Softmax => "softmax",
        FastOp::LogSumExp => "logsumexp",
        _ => return Err(internal(format!("no kernel for {}", op.name()))),
    };
    let args = vec![Arg::Ptr(x), Arg::Ptr(out), Arg::U64(rows), Arg::U64(len)];
    // A warp per row up to 64 KiB rows (larger groups per row measured slower; see
    // bench/results/), a block above.
    if len as usize * d.size() <= WARP_ROW_BYTES {
        let f = kernel(gpu, Family::Softmax(d), &format!("{name}_warp"))?;
        let grid = grid_for(gpu, rows, (BLOCK / 32) as u64);
        return launch_dependent(gpu, f, grid, (BLOCK, 1), 1, args);
    }
    let f = kernel(gpu, Family::Softmax(d), name)?;
    let grid = rows.min(65535 * 32) as u32;
    launch_dependent(gpu, f, grid, (BLOCK, 1), 1, args)
}
