//! The CUDA driver: finding it without panicking, and one context per device with its stream,
//! properties, allocator, kernel modules and cuBLASLt handle.

use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys;
use nuvec_core::{Error, Result};

use crate::alloc::Allocator;
use crate::compile::Modules;

/// Turns a driver status into nuvec's error.
pub(crate) fn check(status: sys::CUresult, what: &str) -> Result<()> {
    if status == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    if status == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        return Err(Error::Backend(format!("CUDA driver: {what} ran out of device memory")));
    }
    Err(Error::Backend(format!("CUDA driver: {what} failed with {status:?}")))
}

/// Whether the driver library, a device and NVRTC are all present. Probes the libraries before
/// cudarc touches them (cudarc panics on a missing library). Never panics.
pub fn probe() -> std::result::Result<i32, String> {
    static PROBE: OnceLock<std::result::Result<i32, String>> = OnceLock::new();
    PROBE
        .get_or_init(|| {
            let found = std::panic::catch_unwind(|| {
                // SAFETY: these only try to dlopen the libraries by name.
                unsafe {
                    (
                        sys::is_culib_present(),
                        cudarc::nvrtc::sys::is_culib_present(),
                        cudarc::cublaslt::sys::is_culib_present(),
                    )
                }
            })
            .map_err(|_| "probing the CUDA libraries panicked".to_string())?;
            match found {
                (false, _, _) => return Err("libcuda (the NVIDIA driver) was not found".into()),
                (_, false, _) => return Err("libnvrtc was not found (install the CUDA toolkit or the nvidia-cuda-nvrtc wheel and put its lib folder on LD_LIBRARY_PATH)".into()),
                (_, _, false) => return Err("libcublasLt was not found".into()),
                _ => {}
            }
            std::panic::catch_unwind(|| {
                // SAFETY: the library is present; cuInit and cuDeviceGetCount only write the count.
                unsafe {
                    check(sys::cuInit(0), "cuInit")?;
                    let mut n = 0;
                    check(sys::cuDeviceGetCount(&mut n), "cuDeviceGetCount")?;
                    Ok::<i32, Error>(n)
                }
            })
            .map_err(|_| "the CUDA driver is missing a required symbol".to_string())?
            .map_err(|e| e.to_string())
            .and_then(|n| if n > 0 { Ok(n) } else { Err("no CUDA device is present".into()) })
        })
        .clone()
}

/// Whether NVRTC can be loaded (it compiles kernels even on a machine without a GPU).
pub fn probe_nvrtc() -> std::result::Result<(), String> {
    static PROBE: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    PROBE
        .get_or_init(|| {
            // SAFETY: only tries to dlopen the library by name.
            let found = std::panic::catch_unwind(|| unsafe { cudarc::nvrtc::sys::is_culib_present() });
            match found {
                Ok(true) => Ok(()),
                _ => Err("libnvrtc was not found (install the CUDA toolkit or the nvidia-cuda-nvrtc wheel \
                          and put its lib folder on LD_LIBRARY_PATH)"
                    .into()),
            }
        })
        .clone()
}

/// What a device is.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceInfo {
    /// Device name (`"NVIDIA H200"`).
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// Number of streaming multiprocessors.
    pub multiprocessors: i32,
    /// Device memory in bytes.
    pub total_memory: usize,
    /// L2 cache in bytes.
    pub l2_cache: usize,
}

/// One GPU: its primary context, the stream all work goes to, and per-device state.
pub(crate) struct Gpu {
    pub(crate) index: u32,
    pub(crate) ctx: sys::CUcontext,
    /// The stream all work goes to (see [`Gpu::stream`]).
    main_stream: sys::CUstream,
    pub(crate) info: DeviceInfo,
    pub(crate) alloc: Allocator,
    pub(crate) modules: Modules,
    pub(crate) blas: Mutex<Option<crate::matmul::Blas>>,
    /// Zeroed `u32` counters (pointer, count) that kernels use to elect the last block of a
    /// group and leave at zero again; grown on demand.
    counters: Mutex<(sys::CUdeviceptr, usize)>,
}

// SAFETY: the context and stream handles are plain driver handles that the driver allows to be
// used from any thread once the context is current there (`bind` does that before every use).
unsafe impl Send for Gpu {}
// SAFETY: as above; mutable per-device state sits behind mutexes.
unsafe impl Sync for Gpu {}

impl Gpu {
    /// The device, created on first use.
    pub(crate) fn get(index: u32) -> Result<Arc<Gpu>> {
        static GPUS: OnceLock<Mutex<Vec<Option<Arc<Gpu>>>>> = OnceLock::new();
        let count = probe().map_err(Error::Backend)?;
        if index as i32 >= count {
            return Err(Error::UnsupportedDevice(nuvec_core::Device::gpu(index)));
        }
        let all = GPUS.get_or_init(|| Mutex::new(vec![None; count as usize]));
        let mut all = all.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(g) = &all[index as usize] {
            return Ok(g.clone());
        }
        let gpu = Arc::new(Gpu::create(index)?);
        all[index as usize] = Some(gpu.clone());
        Ok(gpu)
    }

    fn create(index: u32) -> Result<Gpu> {
        // SAFETY: plain driver calls on a present device; every out-pointer is a local.
        unsafe {
            let mut dev = 0;
            check(sys::cuDeviceGet(&mut dev, index as i32), "cuDeviceGet")?;
            let mut ctx = std::ptr::null_mut();
            check(sys::cuDevicePrimaryCtxRetain(&mut ctx, dev), "cuDevicePrimaryCtxRetain")?;
            check(sys::cuCtxSetCurrent(ctx), "cuCtxSetCurrent")?;
            let mut stream = std::ptr::null_mut();
            check(
                sys::cuStreamCreate(&mut stream, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32),
                "cuStreamCreate",
            )?;
            let attr = |a: sys::CUdevice_attribute| -> Result<i32> {
                let mut v = 0;
                check(sys::cuDeviceGetAttribute(&mut v, a, dev), "cuDeviceGetAttribute")?;
                Ok(v)
            };
            let mut name = [0i8; 256];
            check(sys::cuDeviceGetName(name.as_mut_ptr(), 256, dev), "cuDeviceGetName")?;
            let name = std::ffi::CStr::from_ptr(name.as_ptr()).to_string_lossy().into_owned();
            let mut total = 0usize;
            check(sys::cuDeviceTotalMem_v2(&mut total, dev), "cuDeviceTotalMem")?;
            use sys::CUdevice_attribute::*;
            let info = DeviceInfo {
                name,
                compute_capability: (
                    attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
                    attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
                ),
                multiprocessors: attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
                total_memory: total,
                l2_cache: attr(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as usize,
            };
            Ok(Gpu {
                index,
                ctx,
                main_stream: stream,
                alloc: Allocator::new(total),
                modules: Modules::new(crate::compile::arch_for(info.compute_capability)),
                info,
                blas: Mutex::new(None),
                counters: Mutex::new((0, 0)),
            })
        }
    }

    /// At least `n` zeroed `u32` counters. Kernels that take them must leave them at zero; work
    /// on the one stream is ordered, so every launch finds them so.
    pub(crate) fn counters(&self, n: usize) -> Result<sys::CUdeviceptr> {
        let mut c = self.counters.lock().unwrap_or_else(|e| e.into_inner());
        if c.1 < n {
            let want = n.next_power_of_two().max(1024);
            let (ptr, _) = self.alloc.alloc(self, want * 4)?;
            self.bind()?;
            self.finish_main()?;
            // SAFETY: `ptr` starts a fresh allocation of `want` u32s on this device. The memset
            // is synchronous, so the counters are zero before any kernel, including one
            // recorded now into a CUDA graph (an asynchronous memset would be recorded too,
            // and other threads' kernels would find the counters unset).
            unsafe { check(sys::cuMemsetD32_v2(ptr, 0, want), "cuMemsetD32")? };
            self.finish_legacy()?;
            // The old counters are kept: recorded graphs read them on every launch.
            *c = (ptr, want);
        }
        Ok(c.0)
    }

    /// Makes the context current on this thread.
    pub(crate) fn bind(&self) -> Result<()> {
        // SAFETY: the context was retained in `create` and is never released.
        unsafe { check(sys::cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent") }
    }

    /// The stream this thread's work goes to: the device's one stream, or the stream of the
    /// CUDA graph this thread is recording (`graph.rs`), whose work only runs when the graph is
    /// launched (on the device's stream).
    pub(crate) fn stream(&self) -> sys::CUstream {
        crate::graph::recording_stream(self.index).unwrap_or(self.main_stream)
    }

    /// Waits for all queued work (on this thread's stream: inside a recording, that fails).
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: the stream belongs to this context.
        unsafe { check(sys::cuStreamSynchronize(self.stream()), "cuStreamSynchronize") }
    }

    /// Waits for all work queued on the device's stream, also while this thread records a
    /// graph (the allocator's wait before a block goes back to the driver).
    pub(crate) fn synchronize_device(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: the stream belongs to this context.
        unsafe { check(sys::cuStreamSynchronize(self.main_stream), "cuStreamSynchronize") }
    }

    /// Copies host bytes into device memory at `dst`, ordered on the stream.
    pub(crate) fn upload(&self, dst: sys::CUdeviceptr, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: `dst` holds at least `src.len()` bytes (the caller allocated it so). The copy
        // is from pageable memory, which the driver stages before returning, so `src` may be
        // freed afterwards.
        unsafe {
            check(
                sys::cuMemcpyHtoDAsync_v2(dst, src.as_ptr() as *const c_void, src.len(), self.stream()),
                "cuMemcpyHtoDAsync",
            )
        }
    }

    /// Copies host bytes to `dst` before returning, outside any recording (what a recorded
    /// graph reads must be there before its first launch).
    pub(crate) fn upload_now(&self, dst: sys::CUdeviceptr, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        self.bind()?;
        self.finish_main()?;
        // SAFETY: `dst` holds at least `src.len()` bytes (a fresh block of the caller's); the
        // copy is synchronous, so `src` outlives it.
        unsafe { check(sys::cuMemcpyHtoD_v2(dst, src.as_ptr() as *const c_void, src.len()), "cuMemcpyHtoD")? };
        self.finish_legacy()
    }

    /// Waits for the device's stream: a block fresh from the caching allocator may still be
    /// read by work queued there before it was freed, so it is written out of stream order
    /// only after that work.
    fn finish_main(&self) -> Result<()> {
        // SAFETY: the device's stream lives as long as `self`; it never records.
        unsafe { check(sys::cuStreamSynchronize(self.main_stream), "cuStreamSynchronize") }
    }

    /// Waits for the work of the legacy default stream (synchronous copies and memsets may
    /// return before the device has written); the device's own streams do not wait for it.
    fn finish_legacy(&self) -> Result<()> {
        // SAFETY: the null stream is the bound context's legacy stream.
        unsafe { check(sys::cuStreamSynchronize(std::ptr::null_mut()), "cuStreamSynchronize") }
    }

    /// Copies device bytes to the host after all queued work.
    pub(crate) fn download(&self, src: sys::CUdeviceptr, dst: &mut [u8]) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: `src` holds at least `dst.len()` bytes; the stream is synchronised before
        // the host reads `dst`.
        unsafe {
            check(
                sys::cuMemcpyDtoHAsync_v2(dst.as_mut_ptr() as *mut c_void, src, dst.len(), self.stream()),
                "cuMemcpyDtoHAsync",
            )?;
            check(sys::cuStreamSynchronize(self.stream()), "cuStreamSynchronize")
        }
    }

    /// Copies `bytes` between device buffers, ordered on the stream.
    pub(crate) fn copy_device(&self, dst: sys::CUdeviceptr, src: sys::CUdeviceptr, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: both ranges are inside live allocations of this device.
        unsafe { check(sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, self.stream()), "cuMemcpyDtoDAsync") }
    }

    /// Zeros `bytes` of a device buffer, ordered on the stream.
    pub(crate) fn zero(&self, dst: sys::CUdeviceptr, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: the range is inside a live allocation of this device.
        unsafe { check(sys::cuMemsetD8Async(dst, 0, bytes, self.stream()), "cuMemsetD8Async") }
    }
}
