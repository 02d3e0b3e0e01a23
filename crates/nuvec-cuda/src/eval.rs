//! Running primitives on the GPU: operand pointers, output buffers, and the choice of kernel
//! for each layout.

use std::sync::Arc;

use cudarc::driver::sys::CUdeviceptr;
use nuvec_core::device::Device;
use nuvec_core::primitive::{ArgReduceOp, BinaryOp, Primitive, ReduceOp, ScanOp, UnaryOp};
use nuvec_core::shape::{elem_count, row_major_strides};
use nuvec_core::storage::{Data, Layout, Memory, Operand, Output, Storage};
use nuvec_core::{DType, Error, Result};

use crate::alloc::GpuBuffer;
use crate::driver::Gpu;
use crate::kernels::Family;
use crate::launch::{Arg, BLOCK, Dims, grid_for, launch, launch_dependent};

pub(crate) fn internal(msg: impl Into<String>) -> Error {
    Error::Backend(format!("internal error in the CUDA backend: {}", msg.into()))
}

/// The device pointer of an operand's element `[0, ...]`.
pub(crate) fn ptr_of(op: &Operand) -> Result<CUdeviceptr> {
    buffer_ptr(&op.data.storage).map(|p| p + (op.data.layout.offset * op.dtype.size()) as u64)
}

fn buffer_ptr(storage: &Storage) -> Result<CUdeviceptr> {
    match storage.memory() {
        Memory::Device(m) => m
            .as_any()
            .downcast_ref::<GpuBuffer>()
            .map(|b| b.ptr)
            .ok_or_else(|| internal("device memory of another backend")),
        Memory::Host(_) => Err(internal("operand is in host memory")),
    }
}

/// A fresh buffer for `n` elements of `dtype`.
pub(crate) fn alloc(gpu: &Arc<Gpu>, n: usize, dtype: DType) -> Result<(CUdeviceptr, Arc<Storage>)> {
    let bytes = n * dtype.size();
    let buf = GpuBuffer::new(gpu, bytes)?;
    let ptr = buf.ptr;
    Ok((ptr, Arc::new(Storage::device(Device::gpu(gpu.index), bytes, Box::new(buf)))))
}

/// A row-major output buffer.
pub(crate) fn alloc_out(gpu: &Arc<Gpu>, out: &mut Output) -> Result<CUdeviceptr> {
    let (ptr, storage) = alloc(gpu, out.size(), out.dtype)?;
    out.data = Some(Data { storage, layout: Layout::row_major(&out.shape) });
    Ok(ptr)
}

/// The kernel `name` of module `family`.
pub(crate) fn kernel(gpu: &Gpu, family: Family, name: &str) -> Result<cudarc::driver::sys::CUfunction> {
    gpu.modules.get(gpu, &family.key(), || family.source(), &[])?.function(name)
}

/// Launches an element-wise kernel over `n` items with the standard grid.
fn launch_1d(gpu: &Gpu, f: cudarc::driver::sys::CUfunction, n: u64, per_thread: u64, args: Vec<Arg>) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let grid = grid_for(gpu, n.div_ceil(per_thread), BLOCK as u64);
    launch(gpu, f, (grid, 1, 1), (BLOCK, 1, 1), 0, args)
}

/// Whether an operand's elements form one dense run (any axis order, no broadcast).
fn dense(op: &Operand) -> bool {
    op.data.layout.flags.contiguous && op.data.layout.strides.iter().zip(&op.shape).all(|(&s, &d)| d == 1 || s != 0)
}

/// Whether an operand is one value repeated (every stride zero).
fn scalar_like(op: &Operand) -> bool {
    op.data.layout.strides.iter().zip(&op.shape).all(|(&s, &d)| d == 1 || s == 0)
}

fn aligned(ptrs: &[CUdeviceptr]) -> bool {
    ptrs.iter().all(|p| p % 16 == 0)
}

/// The output of an element-wise map over a dense operand: its strides, in the operand's own
/// buffer when it was donated and holds the output's type.
fn dense_output(gpu: &Arc<Gpu>, src: &Operand, out: &mut Output) -> Result<CUdeviceptr> {
    let layout = Layout::new(&out.shape, src.data.layout.strides.clone(), 0);
    if src.donated && src.dtype == out.dtype && Arc::strong_count(&src.data.storage) == 1 {
        let ptr = ptr_of(src)?;
        out.data = Some(src.data.clone());
        return Ok(ptr);
    }
    let (ptr, storage) = alloc(gpu, out.size(), out.dtype)?;
    out.data = Some(Data { storage, layout });
    Ok(ptr)
}

pub(crate) fn unary_family_kernel(
    gpu: &Arc<Gpu>,
    family: Family,
    name: &str,
    x: Operand,
    out: &mut Output,
) -> Result<()> {
    let n = out.size() as u64;
    if n == 0 {
        alloc_out(gpu, out)?;
        return Ok(());
    }
    let xp = ptr_of(&x)?;
    if dense(&x) {
        let op = dense_output(gpu, &x, out)?;
        if aligned(&[xp, op]) {
            let f = kernel(gpu, family, &format!("{name}_c"))?;
            let per = (16 / x.dtype.size()).max(1) as u64;
            return launch_1d(gpu, f, n, per, vec![Arg::Ptr(xp), Arg::Ptr(op), Arg::U64(n)]);
        }
        let d = Dims::new(&[n as i32], &[&[1]])?;
        let f = kernel(gpu, family, &format!("{name}_s"))?;
        return launch_1d(gpu, f, n, 1, vec![Arg::Ptr(xp), Arg::Ptr(op), Arg::U64(n), Arg::Dims(Box::new(d))]);
    }
    let op = alloc_out(gpu, out)?;
    let d = Dims::new(&x.shape, &[&x.data.layout.strides])?;
    let f = kernel(gpu, family, &format!("{name}_s"))?;
    launch_1d(gpu, f, n, 1, vec![Arg::Ptr(xp), Arg::Ptr(op), Arg::U64(n), Arg::Dims(Box::new(d))])
}

pub(crate) fn unary(gpu: &Arc<Gpu>, op: UnaryOp, x: Operand, out: &mut Output) -> Result<()> {
    let family = Family::Unary(x.dtype);
    unary_family_kernel(gpu, family, &format!("unary_{}", op.name()), x, out)
}

pub(crate) fn astype(gpu: &Arc<Gpu>, x: Operand, out: &mut Output) -> Result<()> {
    let family = Family::Cast(x.dtype);
    let name = format!("cast_{}", out.dtype.name());
    unary_family_kernel(gpu, family, &name, x, out)
}

pub(crate) fn binary(gpu: &Arc<Gpu>, op: BinaryOp, a: Operand, b: Operand, out: &mut Output) -> Result<()> {
    let n = out.size() as u64;
    if n == 0 {
        alloc_out(gpu, out)?;
        return Ok(());
    }
    let family = Family::Binary(a.dtype);
    let name = op.name();
    let (ap, bp) = (ptr_of(&a)?, ptr_of(&b)?);
    let (sa, sb) = (scalar_like(&a), scalar_like(&b));
    let flat = match (dense(&a) && !sa, dense(&b) && !sb) {
        (true, true) if a.data.layout.strides == b.data.layout.strides => Some((0, &a)),
        (true, false) if sb => Some((2, &a)),
        (false, true) if sa => Some((1, &b)),
        _ => None,
    };
    if let Some((mode, lead)) = flat {
        // Write in place into a donated input of the output's type.
        let donor = [&a, &b].into_iter().find(|o| {
            o.donated
                && o.dtype == out.dtype
                && dense(o)
                && !scalar_like(o)
                && o.data.layout.strides == lead.data.layout.strides
        });
        let op_ptr = match donor {
            Some(d) => dense_output(gpu, d, out)?,
            None => {
                let layout = Layout::new(&out.shape, lead.data.layout.strides.clone(), 0);
                let (ptr, storage) = alloc(gpu, out.size(), out.dtype)?;
                out.data = Some(Data { storage, layout });
                ptr
            }
        };
        let vec_ptrs: Vec<CUdeviceptr> = match mode {
            0 => vec![ap, bp, op_ptr],
            1 => vec![bp, op_ptr],
            _ => vec![ap, op_ptr],
        };
        if aligned(&vec_ptrs) {
            let f = kernel(gpu, family, &format!("binary_{name}_c"))?;
            let per = (16 / a.dtype.size()).max(1) as u64;
            let args = vec![Arg::Ptr(ap), Arg::Ptr(bp), Arg::Ptr(op_ptr), Arg::U64(n), Arg::I32(mode)];
            return launch_1d(gpu, f, n, per, args);
        }
        let (s_a, s_b): (&[isize], &[isize]) = match mode {
            0 => (&[1], &[1]),
            1 => (&[0], &[1]),
            _ => (&[1], &[0]),
        };
        let d = Dims::new(&[n as i32], &[s_a, s_b])?;
        let f = kernel(gpu, family, &format!("binary_{name}_s"))?;
        let args = vec![Arg::Ptr(ap), Arg::Ptr(bp), Arg::Ptr(op_ptr), Arg::U64(n), Arg::Dims(Box::new(d))];
        return launch_1d(gpu, f, n, 1, args);
    }
    let op_ptr = alloc_out(gpu, out)?;
    let d = Dims::new(&out.shape, &[&a.data.layout.strides, &b.data.layout.strides])?;
    let f = kernel(gpu, family, &format!("binary_{name}_s"))?;
    let args = vec![Arg::Ptr(ap), Arg::Ptr(bp), Arg::Ptr(op_ptr), Arg::U64(n), Arg::Dims(Box::new(d))];
    launch_1d(gpu, f, n, 1, args)
}

pub(crate) fn select(gpu: &Arc<Gpu>, c: Operand, a: Operand, b: Operand, out: &mut Output) -> Result<()> {
    let n = out.size() as u64;
    let op_ptr = alloc_out(gpu, out)?;
    if n == 0 {
        return Ok(());
    }
    let d = Dims::new(&out.shape, &[&c.data.layout.strides, &a.data.layout.strides, &b.data.layout.strides])?;
    let f = kernel(gpu, Family::Select(a.dtype), "select_s")?;
    let args = vec![
        Arg::Ptr(ptr_of(&c)?),
        Arg::Ptr(ptr_of(&a)?),
        Arg::Ptr(ptr_of(&b)?),
        Arg::Ptr(op_ptr),
        Arg::U64(n),
        Arg::Dims(Box::new(d)),
    ];
    launch_1d(gpu, f, n, 1, args)
}

/// Copies `src` (any layout) into `dst` at the positions given by `dst_strides`.
pub(crate) fn copy_into(gpu: &Arc<Gpu>, src: &Operand, dst: CUdeviceptr, dst_strides: &[isize]) -> Result<()> {
    let n = src.size() as u64;
    if n == 0 {
        return Ok(());
    }
    let d = Dims::new(&src.shape, &[dst_strides, &src.data.layout.strides])?;
    let f = kernel(gpu, Family::Copy(src.dtype.size()), "copy_s")?;
    launch_1d(gpu, f, n, 1, vec![Arg::Ptr(ptr_of(src)?), Arg::Ptr(dst), Arg::U64(n), Arg::Dims(Box::new(d))])
}

/// A row-major copy.
pub(crate) fn copy(gpu: &Arc<Gpu>, x: Operand, out: &mut Output) -> Result<()> {
    let op = alloc_out(gpu, out)?;
    if x.data.layout.flags.row_contiguous {
        return gpu.copy_device(op, ptr_of(&x)?, x.size() * x.dtype.size());
    }
    copy_into(gpu, &x, op, &row_major_strides(&out.shape))
}

/// The operand as a row-major array (itself when it already is).
pub(crate) fn row_major(gpu: &Arc<Gpu>, x: Operand) -> Result<Operand> {
    if x.data.layout.flags.row_contiguous {
        return Ok(x);
    }
    let mut o = Output { shape: x.shape.clone(), dtype: x.dtype, data: None };
    let (shape, dtype) = (x.shape.clone(), x.dtype);
    copy(gpu, x, &mut o)?;
    Ok(Operand { shape, dtype, data: o.data.ok_or_else(|| internal("copy gave no output"))?, donated: true })
}

pub(crate) fn concatenate(gpu: &Arc<Gpu>, axis: usize, inputs: Vec<Operand>, out: &mut Output) -> Result<()> {
    let op = alloc_out(gpu, out)?;
    let strides = row_major_strides(&out.shape);
    let mut at = 0usize;
    for x in &inputs {
        let base = op + (at * strides[axis] as usize * out.dtype.size()) as u64;
        copy_into(gpu, x, base, &strides)?;
        at += x.shape[axis] as usize;
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
    let (base, strides) = if src.donated && dense(&src) && Arc::strong_count(&src.data.storage) == 1 {
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

/// Rows up to this many bytes are reduced by one warp each.
const WARP_ROW_BYTES: usize = 64 << 10;

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
    let family = Family::Reduce(x.dtype);
    let name = op.name();
    let xp = ptr_of(&x)?;
    let strides = &x.data.layout.strides;
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
        let target = 4 * sms;
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
            let grid = n_out.min(65535 * 32) as u32;
            let args = vec![Arg::Ptr(pp), Arg::Ptr(op_ptr), Arg::U64(n_out), Arg::U64(segs)];
            launch(gpu, f, (grid, 1, 1), (BLOCK, 1, 1), 0, args)?;
        }
        return Ok(());
    }
    // Kept axes form one dense run: column reduction.
    let kept_dims = Dims::new(&kept_shape, &[&kept_strides])?;
    if kept_dims.ndim == 1 && kept_dims.strides[0][0] == 1 && kept_dims.shape[0] as u64 == n_out {
        let blocks_x = n_out.div_ceil(BLOCK as u64);
        let segs = if blocks_x >= 2 * sms { 1 } else { (2 * sms).div_ceil(blocks_x).min(n_red.div_ceil(64)).max(1) };
        let f = kernel(gpu, family, &format!("reduce_cols_{name}"))?;
        let partials =
            if segs > 1 { Some(alloc(gpu, (n_out * segs) as usize * acc_size(x.dtype), DType::U8)?) } else { None };
        let pp = partials.as_ref().map(|p| p.0).unwrap_or(0);
        let args = vec![
            Arg::Ptr(xp),
            Arg::Ptr(pp),
            Arg::Ptr(op_ptr),
            Arg::U64(n_out),
            Arg::U64(n_red),
            Arg::U64(segs),
            Arg::Dims(Box::new(red)),
        ];
        launch(gpu, f, (blocks_x as u32, segs as u32, 1), (BLOCK, 1, 1), 0, args)?;
        if segs > 1 {
            let f = kernel(gpu, family, &format!("reduce_cols_finish_{name}"))?;
            let args = vec![Arg::Ptr(pp), Arg::Ptr(op_ptr), Arg::U64(n_out), Arg::U64(segs)];
            launch(gpu, f, (blocks_x as u32, 1, 1), (BLOCK, 1, 1), 0, args)?;
        }
        return Ok(());
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

pub(crate) fn scan(
    gpu: &Arc<Gpu>,
    op: ScanOp,
    axis: usize,
    reverse: bool,
    inclusive: bool,
    x: Operand,
    out: &mut Output,
) -> Result<()> {
    let nd = x.shape.len();
    let len = x.shape[axis] as u64;
    let n = out.size() as u64;
    if n == 0 || len == 0 {
        alloc_out(gpu, out)?;
        return Ok(());
    }
    // Lines must be contiguous: move the axis last (a copy) when it is not already.
    let last = axis + 1 == nd;
    let perm: Vec<usize> = (0..nd).filter(|&a| a != axis).chain([axis]).collect();
    let moved_shape: Vec<i32> = perm.iter().map(|&a| x.shape[a]).collect();
    let (input, tmp_out_strides) = if last && x.data.layout.flags.row_contiguous {
        (x, None)
    } else {
        let (ptr, storage) = alloc(gpu, x.size(), x.dtype)?;
        let moved = Operand {
            shape: moved_shape.iter().copied().collect(),
            dtype: x.dtype,
            data: Data {
                storage: x.data.storage.clone(),
                layout: Layout::new(
                    &moved_shape,
                    perm.iter().map(|&a| x.data.layout.strides[a]).collect(),
                    x.data.layout.offset,
                ),
            },
            donated: false,
        };
        copy_into(gpu, &moved, ptr, &row_major_strides(&moved_shape))?;
        let out_strides = row_major_strides(&out.shape);
        let strides: Vec<isize> = perm.iter().map(|&a| out_strides[a]).collect();
        let op = Operand {
            shape: moved.shape.clone(),
            dtype: x.dtype,
            data: Data { storage, layout: Layout::row_major(&moved_shape) },
            donated: true,
        };
        (op, Some(strides))
    };
    let f = kernel(gpu, Family::Scan(input.dtype), &format!("scan_{}", op.name()))?;
    let lines = n / len;
    let grid = lines.min(65535 * 32) as u32;
    match tmp_out_strides {
        None => {
            let op_ptr = alloc_out(gpu, out)?;
            let args = vec![
                Arg::Ptr(ptr_of(&input)?),
                Arg::Ptr(op_ptr),
                Arg::U64(lines),
                Arg::U64(len),
                Arg::I32(reverse as i32),
                Arg::I32(inclusive as i32),
            ];
            launch(gpu, f, (grid, 1, 1), (BLOCK, 1, 1), 0, args)
        }
        Some(back) => {
            let (tp, tstore) = alloc(gpu, input.size(), input.dtype)?;
            let args = vec![
                Arg::Ptr(ptr_of(&input)?),
                Arg::Ptr(tp),
                Arg::U64(lines),
                Arg::U64(len),
                Arg::I32(reverse as i32),
                Arg::I32(inclusive as i32),
            ];
            launch(gpu, f, (grid, 1, 1), (BLOCK, 1, 1), 0, args)?;
            let scanned = Operand {
                shape: input.shape.clone(),
                dtype: input.dtype,
                data: Data { storage: tstore, layout: Layout::row_major(&input.shape) },
                donated: false,
            };
            let op_ptr = alloc_out(gpu, out)?;
            copy_into(gpu, &scanned, op_ptr, &back)
        }
    }
}

pub(crate) fn fast(gpu: &Arc<Gpu>, op: &nuvec_core::fast::FastOp, x: Operand, out: &mut Output) -> Result<()> {
    use nuvec_core::fast::FastOp;
    let x = row_major(gpu, x)?;
    let len = *x.shape.last().unwrap_or(&1) as u64;
    let rows = (x.size() as u64).checked_div(len).unwrap_or(0);
    let op_ptr = alloc_out(gpu, out)?;
    if rows == 0 {
        return Ok(());
    }
    let name = match op {
        FastOp::Softmax => "softmax",
        FastOp::LogSumExp => "logsumexp",
        #[allow(unreachable_patterns)]
        _ => return Err(internal(format!("no kernel for {}", op.name()))),
    };
    let args = vec![Arg::Ptr(ptr_of(&x)?), Arg::Ptr(op_ptr), Arg::U64(rows), Arg::U64(len)];
    // A warp per row up to 64 KiB rows (measured on the H200: 92–96% of copy bandwidth for f32
    // log-sum-exp at 4096 and 16384 columns; larger groups per row were slower), a block above.
    if len as usize * x.dtype.size() <= WARP_ROW_BYTES {
        let f = kernel(gpu, Family::Fast(x.dtype), &format!("{name}_warp"))?;
        let grid = grid_for(gpu, rows, (BLOCK / 32) as u64);
        return launch_dependent(gpu, f, grid, (BLOCK, 1), 1, args);
    }
    let f = kernel(gpu, Family::Fast(x.dtype), name)?;
    let grid = rows.min(65535 * 32) as u32;
    launch_dependent(gpu, f, grid, (BLOCK, 1), 1, args)
}

/// Dispatch of one primitive.
pub(crate) fn eval(gpu: &Arc<Gpu>, primitive: &Primitive, inputs: Vec<Operand>, outputs: &mut [Output]) -> Result<()> {
    if let Primitive::Fast(op) = primitive {
        use nuvec_core::fast::FastOp;
        if !matches!(op, FastOp::Softmax | FastOp::LogSumExp) {
            return crate::fast_rows::eval(gpu, op, inputs, outputs);
        }
    }
    let out = outputs.first_mut().ok_or_else(|| internal("no output"))?;
    let mut it = inputs.into_iter();
    let mut next = || it.next().ok_or_else(|| internal(format!("{} is missing an input", primitive.name())));
    match primitive {
        Primitive::Arange { start, step } => arange(gpu, *start, *step, out),
        Primitive::Unary(op) => unary(gpu, *op, next()?, out),
        Primitive::Binary(op) => {
            let (a, b) = (next()?, next()?);
            binary(gpu, *op, a, b, out)
        }
        Primitive::Select => {
            let (c, a, b) = (next()?, next()?, next()?);
            select(gpu, c, a, b, out)
        }
        Primitive::AsType(_) => astype(gpu, next()?, out),
        Primitive::Copy | Primitive::Reshape(_) | Primitive::BitCast(_) => copy(gpu, next()?, out),
        Primitive::Concatenate { axis } => {
            let all: Vec<Operand> = std::iter::from_fn(|| next().ok()).collect();
            concatenate(gpu, *axis, all, out)
        }
        Primitive::SliceUpdate { start, step, .. } => {
            let (src, update) = (next()?, next()?);
            slice_update(gpu, start, step, src, update, out)
        }
        Primitive::Reduce { op, axes } => reduce(gpu, *op, axes, next()?, out),
        Primitive::ArgReduce { op, axis } => arg_reduce(gpu, *op, *axis, next()?, out),
        Primitive::Scan { op, axis, reverse, inclusive } => scan(gpu, *op, *axis, *reverse, *inclusive, next()?, out),
        Primitive::Matmul => {
            let (a, b) = (next()?, next()?);
            crate::matmul::matmul(gpu, a, b, None, 1.0, 0.0, out)
        }
        Primitive::AddMM { alpha, beta } => {
            let (a, b, c) = (next()?, next()?, next()?);
            crate::matmul::matmul(gpu, a, b, Some(c), *alpha, *beta, out)
        }
        Primitive::Fast(op) => fast(gpu, op, next()?, out),
        Primitive::RandomBits { .. } => random_bits(gpu, next()?, out),
        Primitive::Sort { op, axis } => crate::sort::sort(gpu, *op, *axis, next()?, out),
        Primitive::GatherAxis { axis } => {
            let (src, idx) = (next()?, next()?);
            gather_axis(gpu, *axis, src, idx, out)
        }
        Primitive::ScatterAxis { axis, reduce } => {
            let (src, idx, upd) = (next()?, next()?, next()?);
            scatter_axis(gpu, *axis, *reduce, src, idx, upd, out)
        }
        Primitive::Quantize { group_size, bits, .. } => {
            crate::quantize::quantize(gpu, *group_size, *bits, next()?, outputs)
        }
        Primitive::Dequantize { group_size, bits, .. } => {
            let (w, s, b) = (next()?, next()?, next()?);
            crate::quantize::dequantize(gpu, *group_size, *bits, [w, s, b], out)
        }
        p => Err(internal(format!("{} is not a GPU primitive", p.name()))),
    }
}

/// Random bits: one thread per key and counter pair (`kernels/random.cuh`).
pub(crate) fn random_bits(gpu: &Arc<Gpu>, keys: Operand, out: &mut Output) -> Result<()> {
    let op = alloc_out(gpu, out)?;
    let n_keys = keys.size() / 2;
    let bytes = out.size() * out.dtype.size();
    if n_keys == 0 || bytes == 0 {
        return Ok(());
    }
    let keys = row_major(gpu, keys)?;
    let per_key = bytes / n_keys;
    let pairs = per_key.div_ceil(4).div_ceil(2);
    let f = kernel(gpu, Family::Random, "random_bits")?;
    let args = vec![Arg::Ptr(ptr_of(&keys)?), Arg::Ptr(op), Arg::U64(n_keys as u64), Arg::U64(per_key as u64)];
    launch_1d(gpu, f, (n_keys * pairs) as u64, 1, args)
}

/// Strides with the indexed axis zeroed: the offset of an element's line.
fn without_axis(strides: &[isize], axis: usize) -> Vec<isize> {
    let mut s = strides.to_vec();
    s[axis] = 0;
    s
}

pub(crate) fn gather_axis(gpu: &Arc<Gpu>, axis: usize, src: Operand, idx: Operand, out: &mut Output) -> Result<()> {
    let n = out.size() as u64;
    let op = alloc_out(gpu, out)?;
    if n == 0 {
        return Ok(());
    }
    let src_strides = without_axis(&src.data.layout.strides, axis);
    let d = Dims::new(&out.shape, &[&idx.data.layout.strides, &src_strides])?;
    let f = kernel(gpu, Family::Gather(src.dtype), &format!("gather_{}", idx.dtype.name()))?;
    let (axis_n, axis_stride) = (src.shape[axis] as i64, src.data.layout.strides[axis] as i64);
    launch_1d(
        gpu,
        f,
        n,
        1,
        vec![
            Arg::Ptr(ptr_of(&src)?),
            Arg::Ptr(ptr_of(&idx)?),
            Arg::Ptr(op),
            Arg::U64(n),
            Arg::I64(axis_n),
            Arg::I64(axis_stride),
            Arg::Dims(Box::new(d)),
        ],
    )
}

pub(crate) fn scatter_axis(
    gpu: &Arc<Gpu>,
    axis: usize,
    reduce: nuvec_core::primitive::ScatterReduce,
    src: Operand,
    idx: Operand,
    upd: Operand,
    out: &mut Output,
) -> Result<()> {
    use nuvec_core::primitive::ScatterReduce as R;
    copy(gpu, src, out)?;
    let data = out.data.as_ref().ok_or_else(|| internal("copy gave no output"))?;
    let base = buffer_ptr(&data.storage)?;
    let n = idx.size() as u64;
    if n == 0 {
        return Ok(());
    }
    let out_strides = row_major_strides(&out.shape);
    let dst = without_axis(&out_strides, axis);
    let d = Dims::new(&idx.shape, &[&idx.data.layout.strides, &upd.data.layout.strides, &dst])?;
    let r = match reduce {
        R::None => "none",
        R::Sum => "sum",
        R::Prod => "prod",
        R::Max => "max",
        R::Min => "min",
    };
    let f = kernel(gpu, Family::Gather(upd.dtype), &format!("scatter_{r}_{}", idx.dtype.name()))?;
    launch_1d(
        gpu,
        f,
        n,
        1,
        vec![
            Arg::Ptr(ptr_of(&idx)?),
            Arg::Ptr(ptr_of(&upd)?),
            Arg::Ptr(base),
            Arg::U64(n),
            Arg::I64(out.shape[axis] as i64),
            Arg::I64(out_strides[axis] as i64),
            Arg::Dims(Box::new(d)),
        ],
    )
}
