//! Buffers and layouts: where an evaluated array's elements live and how they are laid out.
//!
//! An evaluated array holds [`Data`]: a shared [`Storage`] (bytes on one device) plus a
//! [`Layout`] (strides and offset in elements). Views share the storage with a new layout.
//! A storage read on another device keeps the copy as a mirror, so a weight crosses the bus
//! once.

use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytemuck::{Pod, Zeroable};

use crate::device::Device;
use crate::error::{Error, Result};
use crate::shape::{Strides, elem_count, row_major_strides};

/// One 64-byte aligned block of host memory; buffers are vectors of them, so typed views
/// need no `unsafe`.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C, align(64))]
struct Block([u8; 64]);

/// Host memory: 64-byte aligned, viewable as a slice of any plain element type.
pub struct HostBuffer {
    blocks: Vec<Block>,
    len: usize,
}

impl HostBuffer {
    /// A buffer of `len` bytes with unspecified (but initialised) contents, taken from the
    /// host buffer cache when one of the same size is there. Fails with
    /// [`Error::OutOfMemory`] when the system refuses the memory or the host memory limit
    /// ([`set_host_memory_limit`]) would be passed.
    pub fn uninit(len: usize) -> Result<HostBuffer> {
        let n = len.div_ceil(64);
        let bytes = n * 64;
        let active = HOST_ACTIVE.fetch_add(bytes, Ordering::Relaxed) + bytes;
        let limit = HOST_LIMIT.load(Ordering::Relaxed);
        if active > limit {
            HOST_ACTIVE.fetch_sub(bytes, Ordering::Relaxed);
            return Err(Error::out_of_memory(Device::cpu(), len, Some(limit)));
        }
        let blocks = match host_cache().take(n) {
            Some(b) => Ok(b),
            None => alloc_blocks(n).or_else(|_| {
                // Freed buffers may be what the system is short of: give them back, once.
                host_cache().clear();
                alloc_blocks(n)
            }),
        }
        .inspect_err(|_| {
            HOST_ACTIVE.fetch_sub(bytes, Ordering::Relaxed);
        })
        .map_err(|_| Error::out_of_memory(Device::cpu(), len, None))?;
        HOST_PEAK.fetch_max(active, Ordering::Relaxed);
        Ok(HostBuffer { blocks, len })
    }

    /// A buffer of `len` zero bytes.
    pub fn zeroed(len: usize) -> Result<HostBuffer> {
        let mut b = HostBuffer::uninit(len)?;
        b.bytes_mut().fill(0);
        Ok(b)
    }

    /// A copy of `bytes`.
    pub fn from_bytes(bytes: &[u8]) -> Result<HostBuffer> {
        let mut b = HostBuffer::uninit(bytes.len())?;
        b.bytes_mut().copy_from_slice(bytes);
        Ok(b)
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.blocks)[..self.len]
    }

    /// The bytes, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        &mut bytemuck::cast_slice_mut(&mut self.blocks)[..len]
    }

    /// The buffer as elements of `T` (`len / size_of::<T>()` of them).
    pub fn as_slice<T: Pod>(&self) -> &[T] {
        let n = self.len / size_of::<T>().max(1);
        &bytemuck::cast_slice(&self.blocks)[..n]
    }

    /// The buffer as writable elements of `T`.
    pub fn as_mut_slice<T: Pod>(&mut self) -> &mut [T] {
        let n = self.len / size_of::<T>().max(1);
        &mut bytemuck::cast_slice_mut(&mut self.blocks)[..n]
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        let blocks = std::mem::take(&mut self.blocks);
        HOST_ACTIVE.fetch_sub(blocks.len() * 64, Ordering::Relaxed);
        host_cache().give(blocks);
    }
}

/// `n` zeroed blocks, or the allocator's refusal (never an abort).
fn alloc_blocks(n: usize) -> std::result::Result<Vec<Block>, std::collections::TryReserveError> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)?;
    v.resize(n, Block([0; 64]));
    Ok(v)
}

static HOST_ACTIVE: AtomicUsize = AtomicUsize::new(0);
static HOST_PEAK: AtomicUsize = AtomicUsize::new(0);
static HOST_LIMIT: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Sets a hard limit on the bytes host arrays may hold (allocations past it fail with
/// [`Error::OutOfMemory`]); returns the previous limit. The default is no limit: the system
/// refusing an allocation is then what fails it.
pub fn set_host_memory_limit(bytes: usize) -> usize {
    HOST_LIMIT.swap(bytes, Ordering::Relaxed)
}

/// Memory use of a device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryStats {
    /// Bytes held by live buffers.
    pub active: usize,
    /// Largest `active` since the start or the last `reset_peak`.
    pub peak: usize,
    /// Bytes of freed buffers kept for reuse.
    pub cache: usize,
}

/// Host memory held by arrays (and the host buffer cache).
pub fn host_memory() -> MemoryStats {
    MemoryStats {
        active: HOST_ACTIVE.load(Ordering::Relaxed),
        peak: HOST_PEAK.load(Ordering::Relaxed),
        cache: host_cache_bytes(),
    }
}

/// Restarts host peak tracking from the current active bytes.
pub fn reset_host_peak() {
    HOST_PEAK.store(HOST_ACTIVE.load(Ordering::Relaxed), Ordering::Relaxed);
}

/// A cache of freed host buffers keyed by size. Large outputs would otherwise be fresh
/// `mmap`s whose page faults cost as much as the arithmetic that fills them.
struct HostCache {
    inner: Mutex<HostCacheInner>,
}

struct HostCacheInner {
    free: HashMap<usize, Vec<Vec<Block>>>,
    bytes: usize,
    limit: usize,
}

/// Buffers below this size come from the system allocator directly (it is fast for them).
const HOST_CACHE_MIN_BYTES: usize = 1 << 16;

fn host_cache() -> &'static HostCache {
    static CACHE: std::sync::OnceLock<HostCache> = std::sync::OnceLock::new();
    CACHE.get_or_init(|| HostCache {
        inner: Mutex::new(HostCacheInner { free: HashMap::new(), bytes: 0, limit: 2 << 30 }),
    })
}

impl HostCacheInner {
    fn clear(&mut self) {
        self.free.clear();
        self.bytes = 0;
    }
}

impl HostCache {
    fn take(&self, blocks: usize) -> Option<Vec<Block>> {
        if blocks * 64 < HOST_CACHE_MIN_BYTES {
            return None;
        }
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let v = g.free.get_mut(&blocks)?.pop()?;
        g.bytes -= blocks * 64;
        Some(v)
    }

    fn clear(&self) {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    fn give(&self, v: Vec<Block>) {
        let bytes = v.len() * 64;
        if bytes < HOST_CACHE_MIN_BYTES {
            return;
        }
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if g.bytes + bytes > g.limit {
            return;
        }
        g.bytes += bytes;
        g.free.entry(v.len()).or_default().push(v);
    }
}

/// Bytes held by the host buffer cache.
pub fn host_cache_bytes() -> usize {
    host_cache().inner.lock().unwrap_or_else(|e| e.into_inner()).bytes
}

/// Sets the most bytes the host buffer cache keeps; returns the previous limit.
pub fn set_host_cache_limit(bytes: usize) -> usize {
    let mut g = host_cache().inner.lock().unwrap_or_else(|e| e.into_inner());
    let old = std::mem::replace(&mut g.limit, bytes);
    if g.bytes > bytes {
        g.clear();
    }
    old
}

/// Memory owned by a device backend (a GPU allocation). The backend downcasts it.
pub trait DeviceMemory: Send + Sync + 'static {
    /// For the owning backend's downcast.
    fn as_any(&self) -> &dyn Any;
    /// For the owning backend's downcast, writable.
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// Where a storage's bytes are.
pub enum Memory {
    /// Host memory.
    Host(HostBuffer),
    /// A device backend's memory.
    Device(Box<dyn DeviceMemory>),
}

/// Bytes on one device. Shared by an array and its views.
pub struct Storage {
    device: Device,
    len: usize,
    memory: Memory,
    mirrors: Mutex<Vec<(Device, Arc<Storage>)>>,
}

impl Storage {
    /// Storage of host bytes.
    pub fn host(buffer: HostBuffer) -> Storage {
        Storage {
            device: Device::cpu(),
            len: buffer.len(),
            memory: Memory::Host(buffer),
            mirrors: Mutex::new(Vec::new()),
        }
    }

    /// Storage of a device backend's memory of `len` bytes.
    pub fn device(device: Device, len: usize, memory: Box<dyn DeviceMemory>) -> Storage {
        Storage { device, len, memory: Memory::Device(memory), mirrors: Mutex::new(Vec::new()) }
    }

    /// The device holding the bytes.
    pub fn location(&self) -> Device {
        self.device
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the storage holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The memory.
    pub fn memory(&self) -> &Memory {
        &self.memory
    }

    /// The memory, writable (only reachable through a uniquely owned storage).
    pub fn memory_mut(&mut self) -> &mut Memory {
        &mut self.memory
    }

    /// The host buffer, when the storage is on the host.
    pub fn host_buffer(&self) -> Option<&HostBuffer> {
        match &self.memory {
            Memory::Host(b) => Some(b),
            Memory::Device(_) => None,
        }
    }

    /// The host buffer, writable, when the storage is on the host.
    pub fn host_buffer_mut(&mut self) -> Option<&mut HostBuffer> {
        match &mut self.memory {
            Memory::Host(b) => Some(b),
            Memory::Device(_) => None,
        }
    }

    /// The copy of this storage on `device`, made once and kept.
    pub fn on_device(self: &Arc<Self>, device: Device) -> Result<Arc<Storage>> {
        if device == self.device {
            return Ok(self.clone());
        }
        let mut mirrors = self.mirrors.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, s)) = mirrors.iter().find(|(d, _)| *d == device) {
            return Ok(s.clone());
        }
        let downloaded;
        let host: &HostBuffer = match &self.memory {
            Memory::Host(b) => b,
            Memory::Device(_) => {
                downloaded = crate::backend::backend_for(self.device)?.download(self)?;
                &downloaded
            }
        };
        let copy = if device.is_cpu() {
            Storage::host(HostBuffer::from_bytes(host.bytes())?)
        } else {
            crate::backend::backend_for(device)?.upload(device, host)?
        };
        let copy = Arc::new(copy);
        mirrors.push((device, copy.clone()));
        Ok(copy)
    }

    /// Forgets the copies on other devices: the bytes are about to be overwritten in place.
    pub fn forget_mirrors(&self) {
        self.mirrors.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// The bytes, copied to the host if they live on a device.
    pub fn read_to_host(self: &Arc<Self>) -> Result<Arc<Storage>> {
        self.on_device(Device::cpu())
    }
}

/// Layout flags computed from a shape and strides.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flags {
    /// Elements in row-major order with no gaps.
    pub row_contiguous: bool,
    /// Elements in column-major order with no gaps.
    pub col_contiguous: bool,
    /// Elements occupy exactly `size` consecutive slots in some order (all strides ≥ 0), so an
    /// element-wise operation may run over the flat range.
    pub contiguous: bool,
}

/// Strides (elements) and offset (elements) of an array's view into its storage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Stride of each axis in elements.
    pub strides: Strides,
    /// Index of element `[0, 0, ...]` in the storage, in elements.
    pub offset: usize,
    /// Derived flags.
    pub flags: Flags,
}

impl Layout {
    /// The row-major layout of a shape at offset 0.
    pub fn row_major(shape: &[i32]) -> Layout {
        Layout::new(shape, row_major_strides(shape), 0)
    }

    /// A layout with its flags computed.
    pub fn new(shape: &[i32], strides: Strides, offset: usize) -> Layout {
        let flags = compute_flags(shape, &strides);
        Layout { strides, offset, flags }
    }
}

fn compute_flags(shape: &[i32], strides: &[isize]) -> Flags {
    if elem_count(shape) == 0 {
        return Flags { row_contiguous: true, col_contiguous: true, contiguous: true };
    }
    let mut row = true;
    let mut acc = 1isize;
    for i in (0..shape.len()).rev() {
        if shape[i] != 1 {
            row &= strides[i] == acc;
            acc *= shape[i] as isize;
        }
    }
    let mut col = true;
    let mut acc = 1isize;
    for i in 0..shape.len() {
        if shape[i] != 1 {
            col &= strides[i] == acc;
            acc *= shape[i] as isize;
        }
    }
    let contiguous = row || col || {
        let mut dims: Vec<(isize, i32)> =
            shape.iter().zip(strides).filter(|(d, _)| **d != 1).map(|(&d, &s)| (s, d)).collect();
        dims.sort_unstable_by_key(|&(s, _)| s);
        let mut acc = 1isize;
        let mut dense = true;
        for (s, d) in dims {
            dense &= s == acc;
            acc *= d as isize;
        }
        dense
    };
    Flags { row_contiguous: row, col_contiguous: col, contiguous }
}

/// An evaluated array's contents: shared storage and this array's layout in it.
#[derive(Clone)]
pub struct Data {
    /// The bytes.
    pub storage: Arc<Storage>,
    /// How this array's elements sit in them.
    pub layout: Layout,
}

impl Data {
    /// Fresh row-major data on the host from bytes.
    pub fn from_host_bytes(shape: &[i32], bytes: &[u8]) -> Result<Data> {
        Ok(Data { storage: Arc::new(Storage::host(HostBuffer::from_bytes(bytes)?)), layout: Layout::row_major(shape) })
    }

    /// Row-major data owning `buffer`.
    pub fn from_host_buffer(shape: &[i32], buffer: HostBuffer) -> Data {
        Data { storage: Arc::new(Storage::host(buffer)), layout: Layout::row_major(shape) }
    }
}

/// A description of an operand without its bytes: what `Backend::supports` decides on.
#[derive(Clone, Debug, PartialEq)]
pub struct Spec {
    /// The shape.
    pub shape: crate::shape::Shape,
    /// The dtype.
    pub dtype: crate::dtype::DType,
}

/// An evaluated input handed to a backend.
#[derive(Clone)]
pub struct Operand {
    /// The shape.
    pub shape: crate::shape::Shape,
    /// The dtype.
    pub dtype: crate::dtype::DType,
    /// The contents, on the backend's device.
    pub data: Data,
    /// The evaluator handed over the only reference: a backend may write its output into
    /// this storage (buffer donation).
    pub donated: bool,
}

impl Operand {
    /// Number of elements.
    pub fn size(&self) -> usize {
        elem_count(&self.shape)
    }

    /// Whether a backend may write its output into this operand's storage: it was donated and
    /// no one else holds it, apart from a device graph being recorded on this thread (which
    /// holds what its work reads; writing there in place is what a recorded step does).
    pub fn writable(&self) -> bool {
        self.donated
            && std::sync::Arc::strong_count(&self.data.storage)
                == 1 + usize::from(crate::transforms::compile::recording_holds(&self.data.storage))
    }
}

/// An output slot a backend fills.
pub struct Output {
    /// The shape the output must have.
    pub shape: crate::shape::Shape,
    /// The dtype the output must have.
    pub dtype: crate::dtype::DType,
    /// The contents, set by the backend.
    pub data: Option<Data>,
}

impl Output {
    /// Number of elements.
    pub fn size(&self) -> usize {
        elem_count(&self.shape)
    }
}

pub(crate) fn internal(msg: impl Into<String>) -> Error {
    Error::Backend(format!("internal error: {}", msg.into()))
}
