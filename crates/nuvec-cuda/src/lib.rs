//! nuvec-cuda: the CUDA backend.
//!
//! Built on cudarc with dynamic loading, so it compiles with no CUDA installed; at run time
//! [`is_available`] probes libcuda, a device, NVRTC and cuBLASLt without panicking. Kernels
//! are CUDA C++ sources compiled by NVRTC for the device's architecture (`sm_90a` on Hopper)
//! and cached in memory and on disk. Products go through cuBLASLt, with our own GEMV for up
//! to 8 rows.

mod alloc;
pub mod compile;
mod custom_kernel;
mod driver;
mod eval;
mod fast_rows;
pub mod kernels;
mod launch;
mod matmul;
mod quantize;
mod sort;

use std::sync::Arc;

use nuvec_core::backend::Backend;
use nuvec_core::device::{Device, DeviceKind, Stream};
use nuvec_core::primitive::Primitive;
use nuvec_core::storage::{HostBuffer, Memory, MemoryStats, Operand, Output, Spec, Storage};
use nuvec_core::{DType, Error, Result};

pub use compile::{BuildCounts, builds};
pub use custom_kernel::{GeneratedKernel, InputParams, generate_custom_kernel};
pub use custom_kernel::{PRELUDE as CUSTOM_KERNEL_PRELUDE, compile_custom_kernel};
pub use driver::DeviceInfo;

use crate::alloc::GpuBuffer;
use crate::driver::Gpu;
use crate::kernels::{has_binary, reduce_ops, scan_ops, unary_functor};

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

fn gpu_of(device: Device) -> Result<Arc<Gpu>> {
    if device.kind != DeviceKind::Gpu {
        return Err(Error::UnsupportedDevice(device));
    }
    Gpu::get(device.index)
}

fn kernel_dtype(d: DType) -> bool {
    !matches!(d, DType::Complex64)
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

    fn supports(&self, primitive: &Primitive, inputs: &[Spec], outputs: &[Spec]) -> bool {
        let d =
            inputs.first().map(|s| s.dtype).unwrap_or_else(|| outputs.first().map(|s| s.dtype).unwrap_or(DType::F32));
        match primitive {
            Primitive::Arange { .. } => !matches!(outputs[0].dtype, DType::Bool | DType::Complex64),
            Primitive::Unary(op) => unary_functor(*op, d).is_some(),
            Primitive::Binary(op) => has_binary(*op, d),
            Primitive::Select | Primitive::AsType(_) | Primitive::Copy | Primitive::Concatenate { .. } => true,
            Primitive::SliceUpdate { .. } => true,
            Primitive::GatherAxis { .. } => crate::kernels::INDEX_DTYPES.contains(&inputs[1].dtype),
            Primitive::ScatterAxis { reduce, .. } => {
                crate::kernels::INDEX_DTYPES.contains(&inputs[1].dtype)
                    && (*reduce == nuvec_core::primitive::ScatterReduce::None || crate::kernels::has_scatter_reduce(d))
            }
            Primitive::Reshape(_) | Primitive::BitCast(_) => true,
            Primitive::Reduce { op, .. } => reduce_ops(d).contains(op),
            Primitive::ArgReduce { .. } => kernel_dtype(d),
            Primitive::Scan { op, .. } => scan_ops(d).contains(op),
            Primitive::Matmul => d.is_float() || d.is_integer(),
            Primitive::AddMM { .. } => d.is_float(),
            Primitive::Fast(op) => {
                use nuvec_core::fast::FastOp;
                nuvec_core::fast::fused_enabled()
                    && d.is_float()
                    && (matches!(op, FastOp::Softmax | FastOp::LogSumExp) || fast_rows::supports(op, inputs))
            }
            Primitive::RandomBits { .. } => d == DType::U32,
            Primitive::Sort { axis, .. } => {
                inputs.first().and_then(|x| x.shape.get(*axis)).is_some_and(|&len| sort::supports(len as usize))
            }
            Primitive::CustomKernel(_) => true,
            Primitive::Quantize { .. } | Primitive::Dequantize { .. } => quantize::supports(primitive, inputs),
            _ => false,
        }
    }

    fn eval(&self, stream: Stream, primitive: &Primitive, inputs: Vec<Operand>, outputs: &mut [Output]) -> Result<()> {
        let gpu = gpu_of(stream.device)?;
        if let Primitive::CustomKernel(spec) = primitive {
            return custom_kernel::eval(&gpu, spec, inputs, outputs);
        }
        eval::eval(&gpu, primitive, inputs, outputs)
    }

    fn upload(&self, device: Device, host: &HostBuffer) -> Result<Storage> {
        let gpu = gpu_of(device)?;
        let buf = GpuBuffer::new(&gpu, host.len())?;
        gpu.upload(buf.ptr, host.bytes())?;
        Ok(Storage::device(device, host.len(), Box::new(buf)))
    }

    fn download(&self, storage: &Storage) -> Result<HostBuffer> {
        let Memory::Device(m) = storage.memory() else {
            return Err(eval::internal("download of host memory"));
        };
        let buf = m.as_any().downcast_ref::<GpuBuffer>().ok_or_else(|| eval::internal("foreign device memory"))?;
        let mut host = HostBuffer::uninit(storage.len());
        buf.gpu.download(buf.ptr, host.bytes_mut())?;
        Ok(host)
    }

    fn synchronize(&self, stream: Stream) -> Result<()> {
        gpu_of(stream.device)?.synchronize()
    }
}

/// The device-to-device copy bandwidth of GPU `index` in GB/s (bytes read plus bytes written),
/// measured with `cuMemcpyDtoD` of `bytes` between two fresh buffers: the ceiling memory-bound
/// kernels are compared with. Median of `iters` copies timed with CUDA events after warm-up.
pub fn copy_bandwidth(index: u32, bytes: usize, iters: usize) -> Result<f64> {
    use cudarc::driver::sys;
    let gpu = Gpu::get(index)?;
    let (src, dst) = (GpuBuffer::new(&gpu, bytes)?, GpuBuffer::new(&gpu, bytes)?);
    gpu.bind()?;
    let mut times = Vec::with_capacity(iters);
    // SAFETY: events are created, recorded on this device's stream and destroyed here; the
    // copies stay inside the two buffers of `bytes` each.
    unsafe {
        let mut start = std::ptr::null_mut();
        let mut end = std::ptr::null_mut();
        driver::check(sys::cuEventCreate(&mut start, 0), "cuEventCreate")?;
        driver::check(sys::cuEventCreate(&mut end, 0), "cuEventCreate")?;
        // Non-zero contents, so compressible memory cannot flatter the number.
        driver::check(sys::cuMemsetD32Async(src.ptr, 0x3f8ccccd, bytes / 4, gpu.stream), "cuMemsetD32Async")?;
        for i in 0..iters + 3 {
            driver::check(sys::cuEventRecord(start, gpu.stream), "cuEventRecord")?;
            gpu.copy_device(dst.ptr, src.ptr, bytes)?;
            driver::check(sys::cuEventRecord(end, gpu.stream), "cuEventRecord")?;
            driver::check(sys::cuEventSynchronize(end), "cuEventSynchronize")?;
            let mut ms = 0f32;
            driver::check(sys::cuEventElapsedTime_v2(&mut ms, start, end), "cuEventElapsedTime")?;
            if i >= 3 {
                times.push(ms as f64);
            }
        }
        sys::cuEventDestroy_v2(start);
        sys::cuEventDestroy_v2(end);
    }
    times.sort_by(|a, b| a.total_cmp(b));
    let ms = times.get(times.len() / 2).copied().unwrap_or(f64::NAN);
    Ok(2.0 * bytes as f64 / (ms * 1e-3) / 1e9)
}
