//! Copies, casts, ranges, concatenation and slice updates (`kernels/copy.cuh`): strided copies
//! by element size, casts as one-operand maps, `arange`.

use std::sync::Arc;

use cudarc::driver::sys::CUdeviceptr;
use nuvec_core::shape::row_major_strides;
use nuvec_core::storage::{Operand, Output};
use nuvec_core::{DType, Result};

use crate::driver::Gpu;
use crate::kernels::{Family, Source, ctype};
use crate::launch::{Arg, BLOCK, Dims, launch};
use crate::operand::{Cost, aligned, alloc_out, buffer_ptr, dense, internal, kernel, launch_1d, ptr_of};

/// The copy module of elements of `size` bytes (1, 2, 4 or 8): `copy_s` (any layouts),
/// `copy_t` (a transposing copy through shared-memory tiles) and `copy_rows` (blocks of
/// 16-byte vectors between two row pitches).
pub(crate) fn source(size: usize) -> String {
    let t = ctype(match size {
        1 => DType::U8,
        2 => DType::U16,
        4 => DType::U32,
        _ => DType::U64,
    });
    let mut s = Source::new(&["copy.cuh"]);
    s.kernel(format!("copy_s(const {t}* src, {t}* dst, u64 n, Dims d) {{ copy_strided<{t}>(src, dst, n, d); }}"));
    s.kernel(format!("copy_t(const {t}* src, {t}* dst, Dims d) {{ copy_transposed<{t}>(src, dst, d); }}"));
    s.kernel(
        "copy_rows(const uint4* src, uint4* dst, u64 width, u64 src_pitch, u64 dst_pitch, u64 rows) { copy_block_rows(src, dst, width, src_pitch, dst_pitch, rows); }",
    );
    s.finish()
}

/// The casts from `src` to every dtype: `cast_{dst}_c` and `cast_{dst}_s`.
pub(crate) fn cast_source(src: DType) -> String {
    let mut s = Source::new(&["copy.cuh"]);
    let s_ = ctype(src);
    for dst in DType::ALL {
        let (d_, n) = (ctype(dst), dst.name());
        s.map_kernel(
            true,
            format!(
                "cast_{n}_c(const {s_}* x, {d_}* out, u64 n) {{ unary_contig<{s_}, {d_}>(x, out, n, CastF<{s_}, {d_}>()); }}"
            ),
        );
        s.kernel(format!(
            "cast_{n}_s(const {s_}* x, {d_}* out, u64 n, Dims d) {{ unary_strided<{s_}, {d_}>(x, out, n, d, CastF<{s_}, {d_}>()); }}"
        ));
    }
    s.finish()
}

/// `arange` into `d`.
pub(crate) fn arange_source(d: DType) -> String {
    let mut s = Source::new(&["copy.cuh"]);
    let t = ctype(d);
    s.kernel(format!(
        "arange({t}* out, u64 n, double start, double step) {{ arange_fill<{t}>(out, n, start, step); }}"
    ));
    s.finish()
}

/// Copies `src` (any layout) into `dst` at the positions given by `dst_strides`.
pub(crate) fn copy_into(gpu: &Arc<Gpu>, src: &Operand, dst: CUdeviceptr, dst_strides: &[isize]) -> Result<()> {
    let n = src.size() as u64;
    if n == 0 {
        return Ok(());
    }
    let d = Dims::new(&src.shape, &[dst_strides, &src.data.layout.strides])?;
    if let Some(grid) = transposed_grid(&d) {
        let f = kernel(gpu, Family::Copy(src.dtype.size()), "copy_t")?;
        let args = vec![Arg::Ptr(ptr_of(src)?), Arg::Ptr(dst), Arg::Dims(Box::new(d))];
        return launch(gpu, f, grid, (32, 8, 1), 0, args);
    }
    let f = kernel(gpu, Family::Copy(src.dtype.size()), "copy_s")?;
    launch_1d(gpu, f, n, 1, vec![Arg::Ptr(ptr_of(src)?), Arg::Ptr(dst), Arg::U64(n), Arg::Dims(Box::new(d))])
}

/// The grid of `copy_t` when the copy `d` (operand 0 the destination) transposes its last two
/// axes: the destination contiguous along the last, the source along the one before, at most
/// one batch axis, and each side longer than a tile's edge.
fn transposed_grid(d: &Dims) -> Option<(u32, u32, u32)> {
    let nd = d.ndim as usize;
    // A source broadcast along the last axis (stride 0) is not a transpose: the strided walk
    // reads it once per run.
    if !(2..=3).contains(&nd) || d.strides[0][nd - 1] != 1 || d.strides[1][nd - 2] != 1 || d.strides[1][nd - 1] == 0 {
        return None;
    }
    let (a, b) = (d.shape[nd - 2], d.shape[nd - 1]);
    let batch = if nd == 3 { d.shape[0] } else { 1 };
    let (ta, tb) = ((a as u64).div_ceil(32), (b as u64).div_ceil(32));
    (a >= 32 && b >= 32 && ta <= 65535 && batch <= 65535 && tb <= u32::MAX as u64).then_some((
        tb as u32,
        ta as u32,
        batch as u32,
    ))
}

/// A row-major copy.
pub(crate) fn copy(gpu: &Arc<Gpu>, x: Operand, out: &mut Output) -> Result<()> {
    let op = alloc_out(gpu, out)?;
    if x.data.layout.flags.row_contiguous {
        return gpu.copy_device(op, ptr_of(&x)?, x.size() * x.dtype.size());
    }
    copy_into(gpu, &x, op, &row_major_strides(&out.shape))
}

pub(crate) fn astype(gpu: &Arc<Gpu>, x: Operand, out: &mut Output) -> Result<()> {
    let family = Family::Cast(x.dtype);
    let name = format!("cast_{}", out.dtype.name());
    crate::unary::map(gpu, family, &name, x, out, Cost::Light)
}

pub(crate) fn concatenate(gpu: &Arc<Gpu>, axis: usize, inputs: Vec<Operand>, out: &mut Output) -> Result<()> {
    let op = alloc_out(gpu, out)?;
    let strides = row_major_strides(&out.shape);
    let size = out.dtype.size();
    let rows: usize = out.shape[..axis].iter().map(|&d| d as usize).product();
    let mut at = 0usize;
    for x in &inputs {
        let base = op + (at * strides[axis] as usize * size) as u64;
        at += x.shape[axis] as usize;
        // A row-major input is `rows` blocks of the output: with no rows before the axis one
        // device copy, else a vector per thread when the blocks are whole 16-byte vectors.
        if x.data.layout.flags.row_contiguous && x.size() > 0 {
            let src = ptr_of(x)?;
            let (width, pitch) = (x.size() / rows * size, out.size() / rows * size);
            if rows == 1 {
                gpu.copy_device(base, src, width)?;
                continue;
            }
            if width % 16 == 0 && pitch % 16 == 0 && aligned(&[src, base]) {
                let f = kernel(gpu, Family::Copy(size), "copy_rows")?;
                let (w, p) = ((width / 16) as u64, (pitch / 16) as u64);
                let grid = (w.div_ceil(BLOCK as u64).min(1 << 16) as u32, rows.min(65535) as u32, 1);
                let args =
                    vec![Arg::Ptr(src), Arg::Ptr(base), Arg::U64(w), Arg::U64(w), Arg::U64(p), Arg::U64(rows as u64)];
                launch(gpu, f, grid, (BLOCK, 1, 1), 0, args)?;
                continue;
            }
        }
        copy_into(gpu, x, base, &strides)?;
    }
    Ok(())
}

pub(crate) fn slice_update(
    gpu: &Arc<Gpu>,
    start: &[i32],
    step: &[i32],
    src: Operand,
    update: Operand,
    out: &mut Output,
) -> Result<()> {
    let (base, strides) = if src.writable() && dense(&src) {
        let p = ptr_of(&src)?;
        let strides = src.data.layout.strides.clone();
        out.data = Some(src.data.clone());
        (p, strides)
    } else {
        copy(gpu, src, out)?;
        let data = out.data.as_ref().ok_or_else(|| internal("copy gave no output"))?;
        (buffer_ptr(&data.storage)?, row_major_strides(&out.shape))
    };
    let mut offset = 0isize;
    let mut window = strides.clone();
    for i in 0..start.len() {
        offset += start[i] as isize * strides[i];
        window[i] = strides[i] * step[i] as isize;
    }
    let dst = (base as i64 + offset as i64 * out.dtype.size() as i64) as u64;
    copy_into(gpu, &update, dst, &window)
}

pub(crate) fn arange(gpu: &Arc<Gpu>, start: f64, step: f64, out: &mut Output) -> Result<()> {
    let n = out.size() as u64;
    let op = alloc_out(gpu, out)?;
    let f = kernel(gpu, Family::Arange(out.dtype), "arange")?;
    launch_1d(gpu, f, n, 1, vec![Arg::Ptr(op), Arg::U64(n), Arg::F64(start), Arg::F64(step)])
}
