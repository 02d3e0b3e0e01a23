//! Operands and outputs on the GPU: device pointers, fresh output buffers, layout tests, the
//! kernel lookup and the standard element-wise launch, shared by every family module.

use std::sync::Arc;

use cudarc::driver::sys::{CUdeviceptr, CUfunction};
use nuvec_core::device::Device;
use nuvec_core::storage::{Data, Layout, Memory, Operand, Output, Storage};
use nuvec_core::{DType, Error, Result};

use crate::alloc::GpuBuffer;
use crate::driver::Gpu;
use crate::kernels::Family;
use crate::launch::{Arg, BLOCK, grid_for, launch};

pub(crate) fn internal(msg: impl Into<String>) -> Error {
    Error::Backend(format!("internal error in the CUDA backend: {}", msg.into()))
}

/// The device pointer of an operand's element `[0, ...]`.
pub(crate) fn ptr_of(op: &Operand) -> Result<CUdeviceptr> {
    buffer_ptr(&op.data.storage).map(|p| p + (op.data.layout.offset * op.dtype.size()) as u64)
}

/// The device pointer of a storage's first byte.
pub(crate) fn buffer_ptr(storage: &Storage) -> Result<CUdeviceptr> {
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

/// The operand as a row-major array (itself when it already is).
pub(crate) fn row_major(gpu: &Arc<Gpu>, x: Operand) -> Result<Operand> {
    if x.data.layout.flags.row_contiguous {
        return Ok(x);
    }
    fresh_copy(gpu, x)
}

/// A row-major copy of the operand in a buffer of its own (whose first element is aligned).
pub(crate) fn fresh_copy(gpu: &Arc<Gpu>, x: Operand) -> Result<Operand> {
    let mut o = Output { shape: x.shape.clone(), dtype: x.dtype, data: None };
    let (shape, dtype) = (x.shape.clone(), x.dtype);
    crate::copy::copy(gpu, x, &mut o)?;
    Ok(Operand { shape, dtype, data: o.data.ok_or_else(|| internal("copy gave no output"))?, donated: true })
}

/// Whether an operand's elements form one dense run (any axis order, no broadcast).
pub(crate) fn dense(op: &Operand) -> bool {
    op.data.layout.flags.contiguous && op.data.layout.strides.iter().zip(&op.shape).all(|(&s, &d)| d == 1 || s != 0)
}

/// Whether an operand is one value repeated (every stride zero).
pub(crate) fn scalar_like(op: &Operand) -> bool {
    op.data.layout.strides.iter().zip(&op.shape).all(|(&s, &d)| d == 1 || s == 0)
}

/// Whether every pointer is 16-byte aligned (the vectorised kernels' condition).
pub(crate) fn aligned(ptrs: &[CUdeviceptr]) -> bool {
    ptrs.iter().all(|p| p % 16 == 0)
}

/// The output of an element-wise map over a dense operand: its strides, in the operand's own
/// buffer when it was donated and holds the output's type.
pub(crate) fn dense_output(gpu: &Arc<Gpu>, src: &Operand, out: &mut Output) -> Result<CUdeviceptr> {
    let layout = Layout::new(&out.shape, src.data.layout.strides.clone(), 0);
    if src.writable() && src.dtype == out.dtype {
        let ptr = ptr_of(src)?;
        out.data = Some(src.data.clone());
        return Ok(ptr);
    }
    let (ptr, storage) = alloc(gpu, out.size(), out.dtype)?;
    out.data = Some(Data { storage, layout });
    Ok(ptr)
}

/// The kernel `name` of module `family` (compiled on first use); a kernel of a family whose
/// kernels wait for the one before them is marked so that `launch` starts it early.
pub(crate) fn kernel(gpu: &Gpu, family: Family, name: &str) -> Result<CUfunction> {
    let f = gpu.modules.get(gpu, &family.key(), || family.source(), &[])?.function(name)?;
    if family.dependent_launch() {
        crate::launch::mark_dependent(f);
    }
    Ok(f)
}

/// Launches an element-wise kernel over `n` items with the standard grid (at most 32 blocks per
/// SM, each thread looping over the items).
pub(crate) fn launch_1d(gpu: &Gpu, f: CUfunction, n: u64, per_thread: u64, args: Vec<Arg>) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let grid = grid_for(gpu, n.div_ceil(per_thread), BLOCK as u64);
    launch(gpu, f, (grid, 1, 1), (BLOCK, 1, 1), 0, args)
}

/// How a contiguous map's kernel is launched: `Light` maps (a few instructions per element,
/// bound by memory) get a grid as large as the work, one vector per thread; `Heavy` ones
/// (libdevice transcendental functions) the capped grid-stride launch, where fewer threads
/// with more work each were faster (bench/results/2026-12-02-gpu-ops.md).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cost {
    Light,
    Heavy,
}

/// Launches a contiguous map over `n` items, `per_thread` to a thread, by its cost.
pub(crate) fn launch_map(gpu: &Gpu, f: CUfunction, n: u64, per_thread: u64, cost: Cost, args: Vec<Arg>) -> Result<()> {
    if cost == Cost::Heavy || n == 0 {
        return launch_1d(gpu, f, n, per_thread, args);
    }
    let grid = n.div_ceil(per_thread).div_ceil(BLOCK as u64).clamp(1, i32::MAX as u64) as u32;
    launch(gpu, f, (grid, 1, 1), (BLOCK, 1, 1), 0, args)
}
