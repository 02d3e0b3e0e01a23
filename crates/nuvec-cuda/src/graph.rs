//! CUDA graphs: recording the device stream's work (`Backend::begin_capture`), the memory a
//! recording allocates (a pool the graph keeps), and launching the graph.
//!
//! A recording thread sends its work to a stream of its own ([`Gpu::stream`]), so other
//! threads' work on the device is neither recorded nor held back; the graph is launched on the
//! device's one stream, after everything queued before. A recording is a chain: a block freed
//! during it may serve a later allocation of the same recording, as the caching allocator
//! reuses blocks in stream order. What the pool hands out stays the graph's until the graph is
//! dropped, since every launch writes the same addresses.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::sys;
use nuvec_core::backend::GraphExec;
use nuvec_core::storage::{Data, Operand};
use nuvec_core::{Result, Stream};

use crate::driver::{Gpu, check};

/// This thread's recording: the device, its recording stream and its pool.
struct Recording {
    gpu: u32,
    stream: sys::CUstream,
    pool: Arc<Pool>,
}

thread_local! {
    static RECORDING: RefCell<Option<Recording>> = const { RefCell::new(None) };
}

/// The stream this thread records on for GPU `gpu`, if it is recording.
pub(crate) fn recording_stream(gpu: u32) -> Option<sys::CUstream> {
    RECORDING.with(|r| r.borrow().as_ref().filter(|r| r.gpu == gpu).map(|r| r.stream))
}

/// The pool this thread's recording on GPU `gpu` allocates from, if it is recording.
pub(crate) fn recording_pool(gpu: u32) -> Option<Arc<Pool>> {
    RECORDING.with(|r| r.borrow().as_ref().filter(|r| r.gpu == gpu).map(|r| r.pool.clone()))
}
use crate::operand::{buffer_ptr, internal, ptr_of};

/// The memory of one recording.
pub(crate) struct Pool {
    gpu: Arc<Gpu>,
    state: Mutex<PoolState>,
}

#[derive(Default)]
struct PoolState {
    /// Blocks freed during the recording, by size.
    free: BTreeMap<usize, Vec<sys::CUdeviceptr>>,
    /// Every block the pool took from the device's allocator.
    owned: Vec<(sys::CUdeviceptr, usize)>,
    /// Blocks of values copied in while recording: never handed out again, since the graph
    /// reads them on every launch.
    kept: std::collections::HashSet<sys::CUdeviceptr>,
}

impl Pool {
    fn new(gpu: &Arc<Gpu>) -> Pool {
        Pool { gpu: gpu.clone(), state: Mutex::new(PoolState::default()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A block of at least `bytes`: a freed one of the recording's, else a new one.
    pub(crate) fn alloc(&self, bytes: usize) -> Result<(sys::CUdeviceptr, usize)> {
        let size = crate::alloc::round(bytes);
        if let Some(ptr) = self.lock().free.get_mut(&size).and_then(|v| v.pop()) {
            return Ok((ptr, size));
        }
        let (ptr, size) = self.gpu.alloc.alloc(&self.gpu, bytes)?;
        self.lock().owned.push((ptr, size));
        Ok((ptr, size))
    }

    /// A new block for a value copied in while recording, kept until the graph goes.
    pub(crate) fn alloc_kept(&self, bytes: usize) -> Result<(sys::CUdeviceptr, usize)> {
        let (ptr, size) = self.gpu.alloc.alloc(&self.gpu, bytes)?;
        let mut state = self.lock();
        state.owned.push((ptr, size));
        state.kept.insert(ptr);
        Ok((ptr, size))
    }

    /// Takes a block back for the rest of the recording.
    pub(crate) fn free(&self, ptr: sys::CUdeviceptr, size: usize) {
        let mut state = self.lock();
        if state.kept.contains(&ptr) {
            return;
        }
        state.free.entry(size).or_default().push(ptr);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // The graph is gone: its blocks go back to the allocator; work queued later that
        // reuses them runs after every launch of the graph.
        for (ptr, size) in std::mem::take(&mut self.lock().owned) {
            self.gpu.alloc.free(&self.gpu, ptr, size);
        }
    }
}

/// A recorded, instantiated graph and the memory it reads and writes.
pub(crate) struct Recorded {
    gpu: Arc<Gpu>,
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    nodes: usize,
    _pool: Arc<Pool>,
}

// SAFETY: graph handles are plain driver handles, used with the context bound (`bind`).
unsafe impl Send for Recorded {}
// SAFETY: as above; launching only reads the handles.
unsafe impl Sync for Recorded {}

impl GraphExec for Recorded {
    fn launch(&self, stream: Stream) -> Result<()> {
        let _ = stream; // one stream per device
        self.gpu.bind()?;
        // SAFETY: the graph was instantiated in this context, and the memory it uses is kept
        // by `_pool` and by the arrays the caller holds.
        unsafe { check(sys::cuGraphLaunch(self.exec, self.gpu.stream()), "cuGraphLaunch") }
    }

    fn len(&self) -> usize {
        self.nodes
    }
}

impl Drop for Recorded {
    fn drop(&mut self) {
        if self.gpu.bind().is_ok() {
            // SAFETY: handles created by `end_capture`, destroyed once; launches already queued
            // keep what they need (the driver defers the release).
            unsafe {
                let _ = sys::cuGraphExecDestroy(self.exec);
                let _ = sys::cuGraphDestroy(self.graph);
            }
        }
    }
}

/// Starts recording this thread's work on `gpu` (on a new stream); allocations now come from a
/// new pool.
pub(crate) fn begin(gpu: &Arc<Gpu>) -> Result<()> {
    if recording_stream(gpu.index).is_some() {
        return Err(internal("this thread is already recording a CUDA graph"));
    }
    gpu.bind()?;
    let mut stream: sys::CUstream = std::ptr::null_mut();
    let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
    // Relaxed: allocating (and loading a module) while recording is allowed; waiting is not.
    let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: a new stream of the bound context, written into the local.
    unsafe {
        check(sys::cuStreamCreate(&mut stream, flags), "cuStreamCreate")?;
        if let Err(e) = check(sys::cuStreamBeginCapture_v2(stream, mode), "cuStreamBeginCapture") {
            let _ = sys::cuStreamDestroy_v2(stream);
            return Err(e);
        }
    }
    let pool = Arc::new(Pool::new(gpu));
    RECORDING.with(|r| *r.borrow_mut() = Some(Recording { gpu: gpu.index, stream, pool }));
    Ok(())
}

/// Ends this thread's recording begun by [`begin`] and instantiates the graph.
pub(crate) fn end(gpu: &Arc<Gpu>) -> Result<Arc<dyn GraphExec>> {
    let recording = RECORDING.with(|r| r.borrow_mut().take_if(|r| r.gpu == gpu.index));
    let Recording { stream, pool, .. } =
        recording.ok_or_else(|| internal("this thread is not recording a CUDA graph on this device"))?;
    gpu.bind()?;
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    // SAFETY: `stream` is recording (begun by `begin`) and is not used after this; the graph
    // handle is written locally.
    let ended = unsafe {
        let ended = check(sys::cuStreamEndCapture(stream, &mut graph), "cuStreamEndCapture");
        let _ = sys::cuStreamDestroy_v2(stream);
        ended
    };
    ended?;
    let mut nodes = 0usize;
    let mut exec: sys::CUgraphExec = std::ptr::null_mut();
    // SAFETY: `graph` is the valid graph just recorded; out-pointers are locals.
    let made = unsafe {
        check(sys::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut nodes), "cuGraphGetNodes")
            .and_then(|()| check(sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0), "cuGraphInstantiate"))
    };
    if let Err(e) = made {
        // SAFETY: the graph was created above and is not used again.
        unsafe {
            let _ = sys::cuGraphDestroy(graph);
        }
        return Err(e);
    }
    Ok(Arc::new(Recorded { gpu: gpu.clone(), graph, exec, nodes, _pool: pool }))
}

/// Copies `src`'s elements into `dst`'s, in stream order.
pub(crate) fn copy_into(gpu: &Arc<Gpu>, src: &Operand, dst: &Data) -> Result<()> {
    if !src.data.layout.flags.row_contiguous || !dst.layout.flags.row_contiguous {
        return Err(internal("copy_into takes row-contiguous arrays"));
    }
    let bytes = src.size() * src.dtype.size();
    let from = ptr_of(src)?;
    let to = buffer_ptr(&dst.storage)? + (dst.layout.offset * src.dtype.size()) as u64;
    if dst.storage.len() < dst.layout.offset * src.dtype.size() + bytes {
        return Err(internal("copy_into: the destination is smaller than the source"));
    }
    gpu.bind()?;
    // SAFETY: both ranges lie in live device buffers of this context (checked above), and the
    // copy is ordered on the device's one stream.
    unsafe { check(sys::cuMemcpyDtoDAsync_v2(to, from, bytes, gpu.stream()), "cuMemcpyDtoDAsync") }
}
