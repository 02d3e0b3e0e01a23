//! Device memory: plain `cuMemAlloc` allocations behind a cache of freed blocks.
//!
//! All work runs on one stream per device, so a block freed while a queued kernel still reads
//! it is safe to hand to the next allocation: the next kernel using it runs after the earlier
//! one. The memory limit is hard: an allocation that would pass it fails with `OutOfMemory`
//! rather than evicting or thrashing.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::sys;
use nuvec_core::storage::{DeviceMemory, MemoryStats};
use nuvec_core::{Device, Error, Result};

use crate::driver::{Gpu, check};

struct State {
    free: BTreeMap<usize, Vec<sys::CUdeviceptr>>,
    active: usize,
    peak: usize,
    cached: usize,
    memory_limit: usize,
    cache_limit: usize,
}

/// The caching allocator of one device.
pub(crate) struct Allocator {
    state: Mutex<State>,
}

/// Rounds a request to the block size it is served with.
pub(crate) fn round(bytes: usize) -> usize {
    let bytes = bytes.max(1);
    if bytes <= 4096 {
        bytes.div_ceil(256) * 256
    } else if bytes <= 1 << 20 {
        bytes.div_ceil(4096) * 4096
    } else {
        bytes.div_ceil(1 << 20) << 20
    }
}

impl Allocator {
    pub(crate) fn new(total: usize) -> Allocator {
        Allocator {
            state: Mutex::new(State {
                free: BTreeMap::new(),
                active: 0,
                peak: 0,
                cached: 0,
                memory_limit: total,
                cache_limit: total,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A block of at least `bytes`.
    pub(crate) fn alloc(&self, gpu: &Gpu, bytes: usize) -> Result<(sys::CUdeviceptr, usize)> {
        let size = round(bytes);
        {
            let mut s = self.lock();
            if s.active + size > s.memory_limit {
                return Err(Error::out_of_memory(Device::gpu(gpu.index), bytes, Some(s.memory_limit)));
            }
            if let Some(ptr) = s.free.get_mut(&size).and_then(|v| v.pop()) {
                s.cached -= size;
                s.active += size;
                s.peak = s.peak.max(s.active);
                return Ok((ptr, size));
            }
        }
        gpu.bind()?;
        let mut ptr = 0;
        // SAFETY: cuMemAlloc writes the new pointer into the local.
        let mut status = unsafe { sys::cuMemAlloc_v2(&mut ptr, size) };
        if status == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            // Give cached blocks back to the driver and try once more.
            self.clear(gpu)?;
            // SAFETY: as above.
            status = unsafe { sys::cuMemAlloc_v2(&mut ptr, size) };
        }
        if status == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            return Err(Error::out_of_memory(Device::gpu(gpu.index), bytes, None));
        }
        check(status, "cuMemAlloc")?;
        let mut s = self.lock();
        s.active += size;
        s.peak = s.peak.max(s.active);
        Ok((ptr, size))
    }

    /// Returns a block to the cache (or to the driver beyond the cache limit).
    pub(crate) fn free(&self, gpu: &Gpu, ptr: sys::CUdeviceptr, size: usize) {
        let mut s = self.lock();
        s.active -= size;
        if s.cached + size <= s.cache_limit {
            s.cached += size;
            s.free.entry(size).or_default().push(ptr);
            return;
        }
        drop(s);
        if gpu.synchronize_device().is_ok() {
            // SAFETY: the block is no longer referenced by any array, and the stream has
            // finished every kernel that used it.
            unsafe {
                let _ = sys::cuMemFree_v2(ptr);
            }
        }
    }

    /// Frees every cached block.
    pub(crate) fn clear(&self, gpu: &Gpu) -> Result<()> {
        gpu.synchronize_device()?;
        let blocks: Vec<sys::CUdeviceptr> = {
            let mut s = self.lock();
            s.cached = 0;
            std::mem::take(&mut s.free).into_values().flatten().collect()
        };
        for p in blocks {
            // SAFETY: cached blocks belong to no array and no queued work (synchronised above).
            unsafe { check(sys::cuMemFree_v2(p), "cuMemFree")? };
        }
        Ok(())
    }

    pub(crate) fn stats(&self) -> MemoryStats {
        let s = self.lock();
        let mut m = MemoryStats::default();
        m.active = s.active;
        m.peak = s.peak;
        m.cache = s.cached;
        m
    }

    pub(crate) fn reset_peak(&self) {
        let mut s = self.lock();
        s.peak = s.active;
    }

    pub(crate) fn set_memory_limit(&self, bytes: usize) -> usize {
        std::mem::replace(&mut self.lock().memory_limit, bytes)
    }

    pub(crate) fn set_cache_limit(&self, gpu: &Gpu, bytes: usize) -> usize {
        let old = std::mem::replace(&mut self.lock().cache_limit, bytes);
        if self.lock().cached > bytes {
            let _ = self.clear(gpu);
        }
        old
    }
}

/// A device allocation owned by an array's storage; freed into the cache on drop (or into the
/// pool of the CUDA graph recording that allocated it).
pub(crate) struct GpuBuffer {
    pub(crate) ptr: sys::CUdeviceptr,
    size: usize,
    pub(crate) gpu: Arc<Gpu>,
    pool: Option<Arc<crate::graph::Pool>>,
}

impl GpuBuffer {
    pub(crate) fn new(gpu: &Arc<Gpu>, bytes: usize) -> Result<GpuBuffer> {
        let pool = crate::graph::recording_pool(gpu.index);
        let (ptr, size) = match &pool {
            Some(p) => p.alloc(bytes)?,
            None => gpu.alloc.alloc(gpu, bytes)?,
        };
        Ok(GpuBuffer { ptr, size, gpu: gpu.clone(), pool })
    }

    /// A buffer for host bytes about to be copied in. While this thread records a CUDA graph
    /// the copy cannot be part of it (the host bytes may be gone by a launch), so it is made
    /// now, into a block the recording keeps for the graph's life; the bool says so.
    pub(crate) fn for_upload(gpu: &Arc<Gpu>, bytes: usize) -> Result<(GpuBuffer, bool)> {
        match crate::graph::recording_pool(gpu.index) {
            Some(pool) => {
                let (ptr, size) = pool.alloc_kept(bytes)?;
                Ok((GpuBuffer { ptr, size, gpu: gpu.clone(), pool: Some(pool) }, true))
            }
            None => Ok((GpuBuffer::new(gpu, bytes)?, false)),
        }
    }
}

impl Drop for GpuBuffer {
    fn drop(&mut self) {
        match &self.pool {
            Some(p) => p.free(self.ptr, self.size),
            None => self.gpu.alloc.free(&self.gpu, self.ptr, self.size),
        }
    }
}

impl DeviceMemory for GpuBuffer {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}
