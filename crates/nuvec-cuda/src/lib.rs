//! nuvec-cuda: the CUDA backend.
//!
//! Built on cudarc with dynamic loading, so it compiles with no CUDA installed; at run time
//! [`is_available`] probes libcuda, a device, NVRTC and cuBLASLt without panicking. Kernels
//! are CUDA C++ sources compiled by NVRTC for the device's architecture (`sm_90a` on Hopper)
//! and cached in memory and on disk. Products go through cuBLASLt, with our own GEMV for up
//! to 8 rows.
//!
//! Layout: `eval` dispatches every primitive to its family module (`unary`, `binary`, `copy`,
//! `reduce`, `scan`, `matmul`, `gather`, `sort`, `random`, `quantize`, `fast::{softmax, norm,
//! rope, swiglu, cross_entropy}`, `custom_kernel`, `compiled`; the CPU backend's names), which
//! launches the kernels of the same-named `kernels/*.cuh` and generates their modules
//! ([`kernels::Family`]; `custom_kernel` and `compiled` generate one module per kernel);
//! `operand` holds the pointer, buffer and launch helpers they share.

// Public items of the libraries are documented; examples and tests need no crate docs.
#![warn(missing_docs)]

// The runtime: driver, device memory, NVRTC builds, launches.
mod alloc;
pub mod compile;
mod driver;
mod graph;
pub mod kernels;
mod launch;
pub mod nccl;
// The one dispatch (`eval`) and the operand helpers every family uses (`operand`).
mod eval;
mod operand;
// One module per primitive family, named as in the CPU backend and in `kernels/*.cuh`; each
// holds its launches and the generator of its kernel modules.
mod binary;
mod compiled;
mod copy;
mod custom_kernel;
mod fast;
mod gather;
mod matmul;
mod quantize;
mod random;
mod reduce;
mod scan;
mod sort;
mod unary;

use std::sync::Arc;

use nuvec_core::backend::Backend;
use nuvec_core::device::{Device, DeviceKind, Stream};
use nuvec_core::primitive::Primitive;
use nuvec_core::storage::{HostBuffer, Memory, MemoryStats, Operand, Output, Spec, Storage};
use nuvec_core::{Error, Result};

pub use compile::{BuildCounts, builds};
pub use compiled::{InputArrangement, generate_compiled_kernel};
pub use custom_kernel::{GeneratedKernel, InputParams, generate_custom_kernel};
pub use custom_kernel::{PRELUDE as CUSTOM_KERNEL_PRELUDE, compile_custom_kernel};
pub use driver::DeviceInfo;
pub use fast::gated_delta::{CHUNKED_FROM as GATED_DELTA_CHUNKED_FROM, GatedDeltaKernel, gated_delta_kernel};

use crate::alloc::GpuBuffer;
use crate::driver::Gpu;

/// Whether a CUDA GPU is usable: the driver, a device, NVRTC and cuBLASLt are present.
/// Never panics.
pub fn is_available() -> bool {
    driver::probe().is_ok()
}

/// Why the GPU is not usable, when it is not.
pub fn unavailable_reason() -> Option<String> {
    driver::probe().err()
}

/// Number of CUDA devices.
pub fn device_count() -> usize {
    driver::probe().map(|n| n as usize).unwrap_or(0)
}

/// Name, compute capability, multiprocessors and memory of GPU `index`.
pub fn device_info(index: u32) -> Result<DeviceInfo> {
    Gpu::get(index).map(|g| g.info.clone())
}

/// Waits for all work queued on GPU `index`.
pub fn synchronize(index: u32) -> Result<()> {
    Gpu::get(index)?.synchronize()
}

/// Memory use of GPU `index`: bytes held by arrays, the peak, and the cache.
pub fn memory(index: u32) -> Result<MemoryStats> {
    Gpu::get(index).map(|g| g.alloc.stats())
}

/// Sets a hard limit on the bytes arrays may hold on GPU `index` (allocations past it fail
/// with `OutOfMemory`); returns the previous limit.
pub fn set_memory_limit(index: u32, bytes: usize) -> Result<usize> {
    Gpu::get(index).map(|g| g.alloc.set_memory_limit(bytes))
}

/// Sets the most bytes of freed blocks GPU `index` keeps for reuse; returns the previous
/// limit.
pub fn set_cache_limit(index: u32, bytes: usize) -> Result<usize> {
    let g = Gpu::get(index)?;
    Ok(g.alloc.set_cache_limit(&g, bytes))
}

/// Returns every cached block of GPU `index` to the driver.
pub fn clear_cache(index: u32) -> Result<()> {
    let g = Gpu::get(index)?;
    g.alloc.clear(&g)
}

/// Restarts peak tracking of GPU `index` from the current use.
pub fn reset_peak(index: u32) -> Result<()> {
    Gpu::get(index).map(|g| g.alloc.reset_peak())
}

/// Compiles every kernel module for `arch` (e.g. `"sm_90a"`) with NVRTC into the kernel cache,
/// one module per core at a time; works without a GPU. Returns the number of modules, or the
/// first compile error (with NVRTC's log).
pub fn compile_all(arch: &str) -> Result<usize> {
    let modules = kernels::all_modules();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let first_error = std::sync::Mutex::new(None);
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                while let Some(m) = modules.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)) {
                    if let Err(e) = compile::cached_cubin(&m.source(), &m.key(), arch, &[]) {
                        first_error.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
                    }
                }
            });
        }
    });
    match first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(modules.len()),
    }
}

/// The CUDA backend.
#[derive(Debug, Default)]
pub struct CudaBackend;

impl CudaBackend {
    /// The backend (devices are opened on first use).
    pub fn new() -> Self {
        CudaBackend
    }
}

pub(crate) fn gpu_of(device: Device) -> Result<Arc<Gpu>> {
    if device.kind != DeviceKind::Gpu {
        return Err(Error::UnsupportedDevice(device));
    }
    Gpu::get(device.index)
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn kind(&self) -> DeviceKind {
        DeviceKind::Gpu
    }

    fn is_available(&self, device: Device) -> bool {
        device.kind == DeviceKind::Gpu && (device.index as usize) < device_count()
    }

    fn unavailable_reason(&self, device: Device) -> Option<String> {
        if device.kind != DeviceKind::Gpu {
            return None;
        }
        match driver::probe() {
            Err(why) => Some(why),
            Ok(n) if i64::from(device.index) >= i64::from(n) => {
                Some(format!("{device} is not present ({n} CUDA device{} found)", if n == 1 { "" } else { "s" }))
            }
            Ok(_) => None,
        }
    }

    fn supports(&self, primitive: &Primitive, inputs: &[Spec], outputs: &[Spec]) -> bool {
        eval::supports(primitive, inputs, outputs)
    }

    fn eval(&self, stream: Stream, primitive: &Primitive, inputs: Vec<Operand>, outputs: &mut [Output]) -> Result<()> {
        let gpu = gpu_of(stream.device)?;
        // Driver calls without a stream (a TMA descriptor's encoding) act on the thread's
        // current context, and an evaluation may run on any thread (`async_eval`'s).
        gpu.bind()?;
        eval::eval(&gpu, primitive, inputs, outputs)
    }

    fn upload(&self, device: Device, host: &HostBuffer) -> Result<Storage> {
        let gpu = gpu_of(device)?;
        let (buf, recording) = GpuBuffer::for_upload(&gpu, host.len())?;
        if recording {
            gpu.upload_now(buf.ptr, host.bytes())?;
        } else {
            gpu.upload(buf.ptr, host.bytes())?;
        }
        Ok(Storage::device(device, host.len(), Box::new(buf)))
    }

    fn download(&self, storage: &Storage) -> Result<HostBuffer> {
        let Memory::Device(m) = storage.memory() else {
            return Err(operand::internal("download of host memory"));
        };
        let buf = m.as_any().downcast_ref::<GpuBuffer>().ok_or_else(|| operand::internal("foreign device memory"))?;
        let mut host = HostBuffer::uninit(storage.len())?;
        buf.gpu.download(buf.ptr, host.bytes_mut())?;
        Ok(host)
    }

    fn synchronize(&self, stream: Stream) -> Result<()> {
        gpu_of(stream.device)?.synchronize()
    }

    fn begin_capture(&self, stream: Stream) -> Result<()> {
        graph::begin(&gpu_of(stream.device)?)
    }

    fn end_capture(&self, stream: Stream) -> Result<Arc<dyn nuvec_core::backend::GraphExec>> {
        graph::end(&gpu_of(stream.device)?)
    }

    fn copy_into(&self, stream: Stream, src: &Operand, dst: &nuvec_core::storage::Data) -> Result<()> {
        graph::copy_into(&gpu_of(stream.device)?, src, dst)
    }
}
