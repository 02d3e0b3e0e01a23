//! Reductions and arg-reductions (`kernels/reduce.cuh`): rows (a warp per row, or blocks with
//! partials for long rows), columns, and any other layout one thread per output (after a
//! row-major copy when that would leave few threads long walks).

use std::sync::Arc;

use cudarc::driver::sys::CUdeviceptr;
use nuvec_core::primitive::{ArgReduceOp, ReduceOp};
use nuvec_core::shape::elem_count;
use nuvec_core::storage::{Operand, Output};
use nuvec_core::{DType, Result};

use crate::driver::Gpu;
use crate::kernels::{Family, Source, ctype};
use crate::launch::{Arg, BLOCK, Dims, grid_for, launch};
use crate::operand::{aligned, alloc, alloc_out, kernel, launch_1d, ptr_of, row_major};

/// Reductions a module of `d` holds.
pub fn reduce_ops(d: DType) -> &'static [ReduceOp] {
    if d == DType::Bool {
        &[ReduceOp::And, ReduceOp::Or, ReduceOp::Max, ReduceOp::Min]
    } else if d == DType::Complex64 {
        &[ReduceOp::Sum, ReduceOp::Prod]
    } else {
        &[ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min]
    }
}

/// The template argument of a reduction (`OP` of `Red<T, OP>`).
fn reduce_code(op: ReduceOp) -> i32 {
    match op {
        ReduceOp::Sum => 0,
        ReduceOp::Prod => 1,
        ReduceOp::Max => 2,
        ReduceOp::Min => 3,
        ReduceOp::And => 4,
        ReduceOp::Or => 5,
    }
}

/// The reduction module of `d`: six kernels per reduction (rows by blocks or warps and their
/// merge, columns and their merge, any layout).
pub(crate) fn source(d: DType) -> String {
    let mut s = Source::new(&["reduce.cuh"]);
    let t = ctype(d);
    for &op in reduce_ops(d) {
        let (n, c) = (op.name(), reduce_code(op));
        let a = format!("typename Red<{t}, {c}>::A");
        s.kernel(format!(
            "reduce_rows_{n}(const {t}* x, {a}* partials, {t}* out, u64 rows, u64 len, u64 segs, Dims d) {{ reduce_rows<{t}, {c}>(x, partials, out, rows, len, segs, d); }}"
        ));
        s.kernel(format!(
            "reduce_rows_warp_{n}(const {t}* x, {t}* out, u64 rows, u64 len, Dims d) {{ reduce_rows_warp<{t}, {c}>(x, out, rows, len, d); }}"
        ));
        s.kernel(format!(
            "reduce_finish_{n}(const {a}* partials, {t}* out, u64 rows, u64 segs) {{ reduce_finish<{t}, {c}>(partials, out, rows, segs); }}"
        ));
        s.kernel(format!(
            "reduce_cols_{n}(const {t}* x, {a}* partials, {t}* out, u64 cols, u64 red, u64 segs, Dims d) {{ reduce_cols<{t}, {c}>(x, partials, out, cols, red, segs, d); }}"
        ));
        if d.size() < 4 {
            s.kernel(format!(
                "reduce_cols_vec_{n}(const {t}* x, {a}* partials, {t}* out, u64 cols, u64 red, u64 segs, i64 s) {{ reduce_cols_vec<{t}, {c}>(x, partials, out, cols, red, segs, s); }}"
            ));
        }
        s.kernel(format!(
            "reduce_cols_finish_{n}(const {a}* partials, {t}* out, u64 cols, u64 segs) {{ reduce_cols_finish<{t}, {c}>(partials, out, cols, segs); }}"
        ));
        s.kernel(format!(
            "reduce_general_{n}(const {t}* x, {t}* out, u64 n_out, u64 n_red, Dims kept, Dims red) {{ reduce_general<{t}, {c}>(x, out, n_out, n_red, kept, red); }}"
        ));
    }
    s.finish()
}

/// The arg-reduction module of `d`: `argmax` and `argmin`.
pub(crate) fn arg_source(d: DType) -> String {
    let mut s = Source::new(&["reduce.cuh"]);
    let t = ctype(d);
    for (n, max) in [("argmax", true), ("argmin", false)] {
        s.kernel(format!(
            "{n}(const {t}* x, u32* out, u64 n_out, u64 len, i64 axis_stride, Dims d) {{ arg_reduce<{t}, {max}>(x, out, n_out, len, axis_stride, d); }}"
        ));
        let a = format!("typename Acc<{t}>::type");
        s.kernel(format!(
            "{n}_rows(const {t}* x, u32* out, {a}* pv, u32* pi, u64 n_out, u64 len, u64 ld, int segs) {{ arg_reduce_rows<{t}, {max}>(x, out, pv, pi, n_out, (u32)len, ld, (u32)segs); }}"
        ));
        s.kernel(format!(
            "{n}_cols(const {t}* x, u32* out, {a}* pv, u32* pi, u64 cols, u64 len, i64 axis_stride, u64 segs) {{ arg_reduce_cols<{t}, {max}>(x, out, pv, pi, cols, len, axis_stride, segs); }}"
        ));
        s.kernel(format!(
            "{n}_cols_finish(const {a}* pv, const u32* pi, u32* out, u64 cols, u64 segs) {{ arg_reduce_cols_finish<{t}, {max}>(pv, pi, out, cols, segs); }}"
        ));
    }
    s.finish()
}

/// Rows up to this many bytes are reduced by one warp each.
pub(crate) const WARP_ROW_BYTES: usize = 64 << 10;

/// Bytes of a reduction's accumulator (f32 for half precision).
fn acc_size(d: DType) -> usize {
    if d.is_half() { 4 } else { d.size() }
}

pub(crate) fn reduce(gpu: &Arc<Gpu>, op: ReduceOp, axes: &[usize], x: Operand, out: &mut Output) -> Result<()> {
    let n_out = out.size() as u64;
    let op_ptr = alloc_out(gpu, out)?;
    if n_out == 0 {
        return Ok(());
    }
    reduce_to(gpu, op, axes, x, op_ptr, n_out)
}

/// [`reduce`] into `n_out` values at `op_ptr`.
fn reduce_to(gpu: &Arc<Gpu>, op: ReduceOp, axes: &[usize], x: Operand, op_ptr: CUdeviceptr, n_out: u64) -> Result<()> {
    let family = Family::Reduce(x.dtype);
    let name = op.name();
    let xp = ptr_of(&x)?;
    let strides = &x.data.layout.strides;
    // The reduced elements' order is free: widest stride first, so that a transposed or
    // permuted run still collapses into one.
    let mut axes = axes.to_vec();
    axes.sort_by_key(|&a| std::cmp::Reverse(strides[a].unsigned_abs()));
    let axes = &axes[..];
    let kept: Vec<usize> = (0..x.shape.len()).filter(|a| !axes.contains(a)).collect();
    let kept_shape: Vec<i32> = kept.iter().map(|&a| x.shape[a]).collect();
    let kept_strides: Vec<isize> = kept.iter().map(|&a| strides[a]).collect();
    let red_shape: Vec<i32> = axes.iter().map(|&a| x.shape[a]).collect();
    let red_strides: Vec<isize> = axes.iter().map(|&a| strides[a]).collect();
    let n_red = elem_count(&red_shape) as u64;
    let red = Dims::new(&red_shape, &[&red_strides])?;
    let sms = gpu.info.multiprocessors.max(1) as u64;
    // Reduced axes form one dense run per output: row reduction.
    let red_is_run = n_red == 0 || (red.ndim == 1 && (red.strides[0][0] == 1 || red.shape[0] == 1));
    if red_is_run {
        let len = n_red;
        let kept_dims = Dims::new(&kept_shape, &[&kept_strides])?;
        // Rows up to 64 KiB: a warp each (enough rows to fill the GPU); longer: blocks.
        if len as usize * x.dtype.size() <= WARP_ROW_BYTES && n_out > 1 {
            let f = kernel(gpu, family, &format!("reduce_rows_warp_{name}"))?;
            let grid = grid_for(gpu, n_out, (BLOCK / 32) as u64);
            let args =
                vec![Arg::Ptr(xp), Arg::Ptr(op_ptr), Arg::U64(n_out), Arg::U64(len), Arg::Dims(Box::new(kept_dims))];
            return launch(gpu, f, (grid, 1, 1), (BLOCK, 1, 1), 0, args);
        }
        // Split long rows so every multiprocessor has work, then merge the partials.
        let target = 8 * sms;
        let segs = if n_out >= target { 1 } else { target.div_ceil(n_out).min(len.div_ceil(8192)).max(1) };
        let f = kernel(gpu, family, &format!("reduce_rows_{name}"))?;
        let partials =
            if segs > 1 { Some(alloc(gpu, (n_out * segs) as usize * acc_size(x.dtype), DType::U8)?) } else { None };
        let pp = partials.as_ref().map(|p| p.0).unwrap_or(0);
        let grid = (n_out * segs).min(65535 * 32) as u32;
        let args = vec![
            Arg::Ptr(xp),
            Arg::Ptr(pp),
            Arg::Ptr(op_ptr),
            Arg::U64(n_out),
            Arg::U64(len),
            Arg::U64(segs),
            Arg::Dims(Box::new(kept_dims)),
        ];
        launch(gpu, f, (grid, 1, 1), (BLOCK, 1, 1), 0, args)?;
        if segs > 1 {
            let f = kernel(gpu, family, &format!("reduce_finish_{name}"))?;
            let grid = n_out.min(1 << 20) as u32;
            let args = vec![Arg::Ptr(pp), Arg::Ptr(op_ptr), Arg::U64(n_out), Arg::U64(segs)];
            launch(gpu, f, (grid, 1, 1), (BLOCK, 1, 1), 0, args)?;
        }
        return Ok(());
    }
    // Kept axes form one dense run: column reduction.
    let kept_dims = Dims::new(&kept_shape, &[&kept_strides])?;
    if kept_dims.ndim == 1 && kept_dims.strides[0][0] == 1 && kept_dims.shape[0] as u64 == n_out {
        // Narrow elements: several adjacent columns per thread in one 4-byte load.
        let v = (4 / x.dtype.size()) as u64;
        let stride = red.strides[0][0];
        let narrow =
            v > 1 && red.ndim == 1 && n_out.is_multiple_of(v) && stride % v as i64 == 0 && xp.is_multiple_of(4);
        let (kernel_name, per, last) = if narrow {
            (format!("reduce_cols_vec_{name}"), v, Arg::I64(stride))
        } else {
            (format!("reduce_cols_{name}"), 1, Arg::Dims(Box::new(red)))
        };
        let blocks_x = (n_out / per).div_ceil(BLOCK as u64);
        let segs = column_segments(gpu, blocks_x, n_red);
        let partials =
            if segs > 1 { Some(alloc(gpu, (n_out * segs) as usize * acc_size(x.dtype), DType::U8)?) } else { None };
        let pp = partials.as_ref().map(|p| p.0).unwrap_or(0);
        let f = kernel(gpu, family, &kernel_name)?;
        let args =
            vec![Arg::Ptr(xp), Arg::Ptr(pp), Arg::Ptr(op_ptr), Arg::U64(n_out), Arg::U64(n_red), Arg::U64(segs), last];
        launch(gpu, f, (blocks_x as u32, segs as u32, 1), (BLOCK, 1, 1), 0, args)?;
        return finish_cols(gpu, family, name, pp, op_ptr, n_out, segs);
    }
    // The general kernel walks each output's elements in one thread: for few long
    // reductions, a row-major copy first puts them on a fast path.
    if n_red >= 64 * n_out && !x.data.layout.flags.row_contiguous {
        return reduce_to(gpu, op, axes, row_major(gpu, x)?, op_ptr, n_out);
    }
    let f = kernel(gpu, family, &format!("reduce_general_{name}"))?;
    let args = vec![
        Arg::Ptr(xp),
        Arg::Ptr(op_ptr),
        Arg::U64(n_out),
        Arg::U64(n_red),
        Arg::Dims(Box::new(kept_dims)),
        Arg::Dims(Box::new(red)),
    ];
    launch_1d(gpu, f, n_out, 1, args)
}

/// Merges a column kernel's `segs` partials per column into the output (nothing for one).
fn finish_cols(
    gpu: &Gpu,
    family: Family,
    name: &str,
    pp: CUdeviceptr,
    out: CUdeviceptr,
    cols: u64,
    segs: u64,
) -> Result<()> {
    if segs <= 1 {
        return Ok(());
    }
    let f = kernel(gpu, family, &format!("reduce_cols_finish_{name}"))?;
    let args = vec![Arg::Ptr(pp), Arg::Ptr(out), Arg::U64(cols), Arg::U64(segs)];
    launch(gpu, f, (cols.div_ceil(BLOCK as u64) as u32, 1, 1), (BLOCK, 1, 1), 0, args)
}

/// Segments of the reduced axis for a column kernel of `blocks_x` blocks across: enough for
/// eight blocks per SM, at least 64 rows each (grid.y allows 65535).
fn column_segments(gpu: &Gpu, blocks_x: u64, len: u64) -> u64 {
    let sms = gpu.info.multiprocessors.max(1) as u64;
    if blocks_x >= 8 * sms { 1 } else { (8 * sms).div_ceil(blocks_x).min(len.div_ceil(64)).clamp(1, 65535) }
}

/// `arg_reduce` over a strided axis with consecutive outputs (columns): one thread per column
/// and segment, enough segments to fill the GPU, then a merge in segment order.
fn arg_reduce_cols(
    gpu: &Arc<Gpu>,
    op: ArgReduceOp,
    x: &Operand,
    out: CUdeviceptr,
    cols: u64,
    len: u64,
    axis_stride: i64,
) -> Result<()> {
    let blocks_x = cols.div_ceil(BLOCK as u64);
    let segs = column_segments(gpu, blocks_x, len);
    let xp = ptr_of(x)?;
    segmented(gpu, op, x.dtype, "cols", out, cols, segs, (blocks_x as u32, BLOCK), |pv, pi| {
        let reach = [Arg::U64(cols), Arg::U64(len), Arg::I64(axis_stride), Arg::U64(segs)];
        [Arg::Ptr(xp), Arg::Ptr(out), Arg::Ptr(pv), Arg::Ptr(pi)].into_iter().chain(reach).collect()
    })
}

/// Launches `{op}_{form}` on a grid of `(grid, segs)` blocks of `block` threads for `n`
/// outputs, `args(pv, pi)` its arguments. With `segs > 1` each segment leaves a (value, index)
/// pair at `pv`/`pi` (scratch, segment-major), which `{op}_cols_finish` merges in segment
/// order into `out`.
#[allow(clippy::too_many_arguments)]
fn segmented(
    gpu: &Arc<Gpu>,
    op: ArgReduceOp,
    dtype: DType,
    form: &str,
    out: CUdeviceptr,
    n: u64,
    segs: u64,
    (grid, block): (u32, u32),
    args: impl FnOnce(u64, u64) -> Vec<Arg>,
) -> Result<()> {
    let family = Family::ArgReduce(dtype);
    // Partial values in the accumulator type (at most 8 bytes), then their u32 indices.
    let part = if segs > 1 { Some(alloc(gpu, (n * segs) as usize * 12, DType::U8)?) } else { None };
    let pv = part.as_ref().map_or(0, |p| p.0);
    let pi = pv + n * segs * 8;
    let f = kernel(gpu, family, &format!("{}_{form}", op.name()))?;
    launch(gpu, f, (grid, segs as u32, 1), (block, 1, 1), 0, args(pv, pi))?;
    if segs > 1 {
        let f = kernel(gpu, family, &format!("{}_cols_finish", op.name()))?;
        let args = vec![Arg::Ptr(pv), Arg::Ptr(pi), Arg::Ptr(out), Arg::U64(n), Arg::U64(segs)];
        launch(gpu, f, ((n as u32).div_ceil(BLOCK), 1, 1), (BLOCK, 1, 1), 0, args)?;
    }
    Ok(())
}

pub(crate) fn arg_reduce(gpu: &Arc<Gpu>, op: ArgReduceOp, axis: usize, x: Operand, out: &mut Output) -> Result<()> {
    let n_out = out.size() as u64;
    let op_ptr = alloc_out(gpu, out)?;
    if n_out == 0 {
        return Ok(());
    }
    let kept: Vec<usize> = (0..x.shape.len()).filter(|&a| a != axis).collect();
    let kept_shape: Vec<i32> = kept.iter().map(|&a| x.shape[a]).collect();
    let kept_strides: Vec<isize> = kept.iter().map(|&a| x.data.layout.strides[a]).collect();
    let d = Dims::new(&kept_shape, &[&kept_strides])?;
    let (len, axis_stride) = (x.shape[axis] as u64, x.data.layout.strides[axis] as i64);
    if d.ndim == 1 && d.strides[0][0] == 1 && d.shape[0] as u64 == n_out && axis_stride != 1 && len < u32::MAX as u64 {
        return arg_reduce_cols(gpu, op, &x, op_ptr, n_out, len, axis_stride);
    }
    let per = (16 / x.dtype.size()) as u64;
    let xp = ptr_of(&x)?;
    // Rows at any distance apart (the last position's logits of a prompt's, say).
    let ld = if d.shape[0] == 1 { len } else { d.strides[0][0] as u64 };
    let rows = d.ndim == 1 && d.strides[0][0] >= 0 && ld % per == 0;
    if rows && axis_stride == 1 && len % per == 0 && len < u32::MAX as u64 && aligned(&[xp]) {
        // A block per row and segment: rows too few to fill the GPU split into segments of at
        // least 512 vectors, merged after. Blocks no wider than their vectors.
        let nvec = len / per;
        let sms = gpu.info.multiprocessors.max(1) as u64;
        let segs = if n_out >= sms { 1 } else { (2 * sms).div_ceil(n_out).min(nvec / 512).clamp(1, 64) };
        let block = nvec.div_ceil(segs).next_multiple_of(32).clamp(32, BLOCK as u64) as u32;
        let grid = n_out.min(1 << 20) as u32;
        return segmented(gpu, op, x.dtype, "rows", op_ptr, n_out, segs, (grid, block), |pv, pi| {
            let reach = [Arg::U64(n_out), Arg::U64(len), Arg::U64(ld), Arg::I32(segs as i32)];
            [Arg::Ptr(xp), Arg::Ptr(op_ptr), Arg::Ptr(pv), Arg::Ptr(pi)].into_iter().chain(reach).collect()
        });
    }
    let f = kernel(gpu, Family::ArgReduce(x.dtype), op.name())?;
    let grid = grid_for(gpu, n_out, (BLOCK / 32) as u64);
    let args = vec![
        Arg::Ptr(ptr_of(&x)?),
        Arg::Ptr(op_ptr),
        Arg::U64(n_out),
        Arg::U64(x.shape[axis] as u64),
        Arg::I64(x.data.layout.strides[axis] as i64),
        Arg::Dims(Box::new(d)),
    ];
    launch(gpu, f, (grid, 1, 1), (BLOCK, 1, 1), 0, args)
}
