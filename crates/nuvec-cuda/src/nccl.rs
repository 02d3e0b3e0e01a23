//! NCCL collectives over arrays on the GPU, through cudarc's bindings loaded at run time: a
//! machine without NCCL gets an error saying so ([`nccl_unavailable_reason`]), never a panic.
//!
//! A communicator ([`Nccl`]) is one rank's: it drives one GPU, and every rank of the group
//! makes its own from the same [`nccl_unique_id`] (one process per GPU, or one thread per GPU
//! of one process). A collective is queued on the GPU's stream after the work that makes its
//! input, then waited for within the communicator's time-out: a rank that dies or never comes
//! ends the collective with an error (the communicator aborted), not a hang.

use std::ffi::{CStr, c_void};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use cudarc::driver::sys as cu;
use cudarc::nccl::sys;
use nuvec_core::device::Device;
use nuvec_core::storage::{Data, Layout, Memory};
use nuvec_core::{Array, DType, Error, Result};

use crate::driver::{Gpu, check};
use crate::gpu_of;
use crate::operand::{alloc, buffer_ptr};

/// How [`Nccl::all_reduce`] and [`Nccl::reduce_scatter`] combine the ranks' values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// The sum.
    Sum,
    /// The maximum.
    Max,
    /// The minimum.
    Min,
}

/// The NCCL library (`libnccl.so`, else `libnccl.so.2`) in a folder of `LD_LIBRARY_PATH` or of
/// the system's library folders, if there is one. cudarc opens it as `libnccl.so`, which NCCL's
/// runtime packages (pip's `nvidia-nccl-*`, Debian's `libnccl2`) do not provide: a launcher
/// links this file under that name for its ranks.
pub fn nccl_library() -> Option<PathBuf> {
    let path = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    let system =
        ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/local/lib", "/usr/lib"];
    let dirs = path.split(':').filter(|d| !d.is_empty()).chain(system);
    dirs.flat_map(|d| ["libnccl.so", "libnccl.so.2"].map(|n| PathBuf::from(d).join(n))).find(|p| p.exists())
}

/// Why NCCL cannot be used in this process, or `None` when it can (probed once).
pub fn nccl_unavailable_reason() -> Option<String> {
    static PROBE: OnceLock<Option<String>> = OnceLock::new();
    PROBE
        .get_or_init(|| {
            // SAFETY: only tries to open the library by the names cudarc uses.
            if unsafe { sys::is_culib_present() } {
                return None;
            }
            Some(match nccl_library() {
                Some(p) => format!(
                    "NCCL is at {} but is opened as libnccl.so: put a folder holding a link of that name to it on \
                     LD_LIBRARY_PATH (distributed::launch and `nuvec launch` do this for their ranks)",
                    p.display()
                ),
                None => "NCCL was not found (libnccl.so): install it (pip's nvidia-nccl-cu13, or the libnccl2 \
                         package) and put its folder on LD_LIBRARY_PATH"
                    .into(),
            })
        })
        .clone()
}

fn loaded() -> Result<()> {
    match nccl_unavailable_reason() {
        Some(why) => Err(Error::Backend(format!("nccl: {why}"))),
        None => Ok(()),
    }
}

/// The message of an NCCL status, naming the call.
fn nccl_error(what: &str, status: sys::ncclResult_t) -> Error {
    // SAFETY: NCCL returns a static string for every status.
    let text = unsafe { CStr::from_ptr(sys::ncclGetErrorString(status)) }.to_string_lossy().into_owned();
    Error::Backend(format!("nccl: {what} failed: {text} ({status:?})"))
}

fn nccl_check(what: &str, status: sys::ncclResult_t) -> Result<()> {
    match status {
        sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress => Ok(()),
        s => Err(nccl_error(what, s)),
    }
}

/// A new communicator's identity: one rank makes it and hands its bytes to the others, which
/// pass them to [`Nccl::new`].
pub fn nccl_unique_id() -> Result<[u8; 128]> {
    loaded()?;
    let mut id = sys::ncclUniqueId { internal: [0; 128] };
    // SAFETY: `id` is a valid out-pointer.
    nccl_check("ncclGetUniqueId", unsafe { sys::ncclGetUniqueId(&mut id) })?;
    Ok(id.internal.map(|c| c as u8))
}

/// The identity of GPU `device` (its UUID), to tell whether two ranks share a GPU, which NCCL
/// refuses.
pub fn gpu_uuid(device: Device) -> Result<[u8; 16]> {
    let gpu = gpu_of(device)?;
    let mut uuid = cu::CUuuid { bytes: [0; 16] };
    // SAFETY: plain driver queries with local out-pointers on a present device.
    unsafe {
        let mut dev = 0;
        check(cu::cuDeviceGet(&mut dev, gpu.index as i32), "cuDeviceGet")?;
        check(cu::cuDeviceGetUuid_v2(&mut uuid, dev), "cuDeviceGetUuid")?;
    }
    Ok(uuid.bytes.map(|b| b as u8))
}

fn nccl_type(dtype: DType) -> Result<sys::ncclDataType_t> {
    use sys::ncclDataType_t::*;
    Ok(match dtype {
        DType::Bool | DType::U8 => ncclUint8,
        DType::I8 => ncclInt8,
        DType::I32 => ncclInt32,
        DType::U32 => ncclUint32,
        DType::I64 => ncclInt64,
        DType::U64 => ncclUint64,
        DType::F16 => ncclFloat16,
        DType::BF16 => ncclBfloat16,
        DType::F32 => ncclFloat32,
        DType::F64 => ncclFloat64,
        other => return Err(Error::InvalidArgument(format!("nccl: {other:?} arrays have no NCCL type"))),
    })
}

/// One rank's NCCL communicator on one GPU (see the module docs).
pub struct Nccl {
    comm: sys::ncclComm_t,
    gpu: Arc<Gpu>,
    rank: usize,
    size: usize,
    timeout: Duration,
    /// Calls on one communicator must not interleave; an aborted one takes no more.
    state: Mutex<bool>,
}

// SAFETY: the communicator is a handle NCCL allows any thread to use, one call at a time, which
// `state`'s lock ensures.
unsafe impl Send for Nccl {}
// SAFETY: as above.
unsafe impl Sync for Nccl {}

impl std::fmt::Debug for Nccl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Nccl {{ rank: {}, size: {}, gpu: {} }}", self.rank, self.size, self.gpu.index)
    }
}

impl Nccl {
    /// Rank `rank` of `size` on GPU `device`, joining the ranks that pass the same `id`
    /// ([`nccl_unique_id`]); it returns once all have joined. Later collectives wait at most
    /// `timeout`.
    pub fn new(device: Device, rank: usize, size: usize, id: &[u8; 128], timeout: Duration) -> Result<Nccl> {
        loaded()?;
        if rank >= size {
            return Err(Error::InvalidArgument(format!("nccl: rank {rank} of {size}")));
        }
        let gpu = gpu_of(device)?;
        gpu.bind()?;
        let id = sys::ncclUniqueId { internal: id.map(|b| b as core::ffi::c_char) };
        let mut comm = std::ptr::null_mut();
        // SAFETY: `comm` is a valid out-pointer; the GPU's context is current on this thread,
        // which NCCL takes as the communicator's device.
        nccl_check("ncclCommInitRank", unsafe { sys::ncclCommInitRank(&mut comm, size as i32, id, rank as i32) })?;
        Ok(Nccl { comm, gpu, rank, size, timeout, state: Mutex::new(false) })
    }

    /// This communicator's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The GPU it drives.
    pub fn device(&self) -> Device {
        Device::gpu(self.gpu.index)
    }

    /// `x` evaluated, row-major, in this GPU's memory (a host array's copy there, which `x`'s
    /// storage keeps), with the address of its first element.
    fn input(&self, x: &Array) -> Result<(Array, u64)> {
        let x = x.contiguous();
        x.eval()?;
        let data = x.data()?;
        if matches!(data.storage.memory(), Memory::Device(_)) && data.storage.location() != self.device() {
            return Err(Error::InvalidArgument(format!(
                "nccl: the array is on {}, this rank's communicator on {}",
                data.storage.location(),
                self.device()
            )));
        }
        let storage = data.storage.on_device(self.device())?;
        let ptr = buffer_ptr(&storage)? + (data.layout.offset * x.dtype().size()) as u64;
        Ok((x, ptr))
    }

    /// A fresh row-major array of `shape` on this GPU, with its address.
    fn output(&self, shape: &[i32], dtype: DType) -> Result<(Array, u64)> {
        let n = shape.iter().map(|&d| d as usize).product();
        let (ptr, storage) = alloc(&self.gpu, n, dtype)?;
        let data = Data { storage, layout: Layout::row_major(shape) };
        Ok((Array::from_data(shape.to_vec(), dtype, data), ptr))
    }

    /// Queues `call` (NCCL calls on `stream`) and waits for it within the time-out; on a
    /// failure or a time-out the communicator is aborted and takes no more calls.
    fn run(&self, what: &str, call: impl FnOnce(sys::cudaStream_t) -> sys::ncclResult_t) -> Result<()> {
        let mut aborted = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if *aborted {
            return Err(Error::Backend(format!("nccl: {what}: the group ended after an earlier failure")));
        }
        self.gpu.bind()?;
        let stream = self.gpu.stream();
        let result = nccl_check(what, call(stream as sys::cudaStream_t)).and_then(|()| self.wait(what, stream));
        if result.is_err() {
            *aborted = true;
            // SAFETY: the communicator is valid and no other call runs on it (the lock).
            unsafe { sys::ncclCommAbort(self.comm) };
        }
        result
    }

    /// Waits for `stream`'s work up to now, checking NCCL's asynchronous errors, at most the
    /// time-out.
    fn wait(&self, what: &str, stream: cu::CUstream) -> Result<()> {
        let start = Instant::now();
        loop {
            // SAFETY: a query of a live stream of the bound context.
            match unsafe { cu::cuStreamQuery(stream) } {
                cu::CUresult::CUDA_SUCCESS => return Ok(()),
                cu::CUresult::CUDA_ERROR_NOT_READY => {}
                e => return check(e, "cuStreamQuery"),
            }
            let mut status = sys::ncclResult_t::ncclSuccess;
            // SAFETY: a valid communicator and out-pointer.
            nccl_check("ncclCommGetAsyncError", unsafe { sys::ncclCommGetAsyncError(self.comm, &mut status) })?;
            nccl_check(what, status)?;
            if start.elapsed() > self.timeout {
                return Err(Error::Backend(format!(
                    "nccl: {what} on rank {} of {} did not finish within {:?}: a rank failed or left (the group \
                     cannot go on)",
                    self.rank, self.size, self.timeout
                )));
            }
            // Spin while a collective is likely to end soon; past that, a waiting rank (an idle
            // server's follower) leaves its core to others.
            if start.elapsed() < Duration::from_millis(1) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    /// The ranks' `x` combined element-wise by `op`, on every rank.
    pub fn all_reduce(&self, x: &Array, op: ReduceOp) -> Result<Array> {
        let (x, src) = self.input(x)?;
        let (y, dst) = self.output(x.shape(), x.dtype())?;
        let (n, t) = (x.size(), nccl_type(x.dtype())?);
        let op = match op {
            ReduceOp::Sum => sys::ncclRedOp_t::ncclSum,
            ReduceOp::Max => sys::ncclRedOp_t::ncclMax,
            ReduceOp::Min => sys::ncclRedOp_t::ncclMin,
        };
        // SAFETY: `src` and `dst` hold `n` elements of `t` on this GPU and live until the wait
        // ends (`x` and `y` are held).
        self.run("ncclAllReduce", |s| unsafe {
            sys::ncclAllReduce(src as *const c_void, dst as *mut c_void, n, t, op, self.comm, s)
        })?;
        Ok(y)
    }

    /// Every rank's `x` (same shape everywhere) stacked along a new first axis in rank order.
    pub fn all_gather(&self, x: &Array) -> Result<Array> {
        let (x, src) = self.input(x)?;
        let shape: Vec<i32> = std::iter::once(self.size as i32).chain(x.shape().iter().copied()).collect();
        let (y, dst) = self.output(&shape, x.dtype())?;
        let (n, t) = (x.size(), nccl_type(x.dtype())?);
        // SAFETY: `dst` holds `size · n` elements; both live until the wait ends.
        self.run("ncclAllGather", |s| unsafe {
            sys::ncclAllGather(src as *const c_void, dst as *mut c_void, n, t, self.comm, s)
        })?;
        Ok(y)
    }

    /// The ranks' `x` summed, rank `r` keeping part `r` of `size` equal parts of the first axis.
    pub fn reduce_scatter(&self, x: &Array) -> Result<Array> {
        let first = x.shape().first().copied().unwrap_or(0) as usize;
        if x.ndim() == 0 || !first.is_multiple_of(self.size) {
            return Err(Error::InvalidArgument(format!(
                "nccl: reduce_scatter of shape {:?} over {} ranks: the first axis must divide",
                x.shape(),
                self.size
            )));
        }
        let (x, src) = self.input(x)?;
        let mut shape = x.shape().to_vec();
        shape[0] /= self.size as i32;
        let (y, dst) = self.output(&shape, x.dtype())?;
        let (n, t) = (y.size(), nccl_type(x.dtype())?);
        // SAFETY: `src` holds `size · n` elements and `dst` `n`; both live until the wait ends.
        self.run("ncclReduceScatter", |s| unsafe {
            sys::ncclReduceScatter(
                src as *const c_void,
                dst as *mut c_void,
                n,
                t,
                sys::ncclRedOp_t::ncclSum,
                self.comm,
                s,
            )
        })?;
        Ok(y)
    }

    /// Sends `x` to rank `peer`, which takes it with [`Nccl::recv`].
    pub fn send(&self, x: &Array, peer: usize) -> Result<()> {
        self.peer(peer)?;
        let (x, src) = self.input(x)?;
        let (n, t) = (x.size(), nccl_type(x.dtype())?);
        // SAFETY: `src` holds `n` elements and lives until the wait ends.
        self.run("ncclSend", |s| unsafe { sys::ncclSend(src as *const c_void, n, t, peer as i32, self.comm, s) })
    }

    /// The array of `shape` and `dtype` rank `peer` sends with [`Nccl::send`].
    pub fn recv(&self, shape: &[i32], dtype: DType, peer: usize) -> Result<Array> {
        self.peer(peer)?;
        let (y, dst) = self.output(shape, dtype)?;
        let (n, t) = (y.size(), nccl_type(dtype)?);
        // SAFETY: `dst` holds `n` elements and lives until the wait ends.
        self.run("ncclRecv", |s| unsafe { sys::ncclRecv(dst as *mut c_void, n, t, peer as i32, self.comm, s) })?;
        Ok(y)
    }

    fn peer(&self, peer: usize) -> Result<()> {
        if peer >= self.size || peer == self.rank {
            return Err(Error::InvalidArgument(format!(
                "nccl: rank {} of {} cannot exchange with rank {peer}",
                self.rank, self.size
            )));
        }
        Ok(())
    }
}

impl Drop for Nccl {
    fn drop(&mut self) {
        let aborted = *self.state.lock().unwrap_or_else(|e| e.into_inner());
        if !aborted && self.gpu.bind().is_ok() {
            // SAFETY: the communicator is valid and no call runs on it (we own it).
            unsafe { sys::ncclCommDestroy(self.comm) };
        }
    }
}
