//! The backend interface. Core knows no backend crate: backends (nuvec-cpu, nuvec-cuda)
//! implement [`Backend`], and the facade crate `nuvec` hands them to core through the one
//! link-time hook below.

use std::sync::{Arc, OnceLock};

use crate::device::{Device, DeviceKind, Stream};
use crate::error::{Error, Result};
use crate::primitive::Primitive;
use crate::storage::{HostBuffer, Operand, Output, Spec, Storage};

/// A device backend: runs primitives on its device's memory.
pub trait Backend: Send + Sync {
    /// A short name (`"cpu"`, `"cuda"`).
    fn name(&self) -> &'static str;

    /// The kind of device the backend drives.
    fn kind(&self) -> DeviceKind;

    /// Whether `device` is present and usable. Never panics.
    fn is_available(&self, device: Device) -> bool;

    /// Why `device` (of this backend's kind) is not usable, in words (no driver, no compiler
    /// library, no such device, ...); `None` when it is usable or the backend cannot tell.
    /// Never panics.
    fn unavailable_reason(&self, device: Device) -> Option<String> {
        let _ = device;
        None
    }

    /// Whether [`Backend::eval`] handles `primitive` for these operands. A `Fast` primitive
    /// that is not supported runs as its composition instead.
    fn supports(&self, primitive: &Primitive, inputs: &[Spec], outputs: &[Spec]) -> bool;

    /// Computes `primitive` and fills every output's `data`.
    fn eval(&self, stream: Stream, primitive: &Primitive, inputs: Vec<Operand>, outputs: &mut [Output]) -> Result<()>;

    /// Copies host bytes to `device`.
    fn upload(&self, device: Device, host: &HostBuffer) -> Result<Storage>;

    /// Copies a storage of this backend to the host.
    fn download(&self, storage: &Storage) -> Result<HostBuffer>;

    /// Waits for all work queued on `stream`.
    fn synchronize(&self, stream: Stream) -> Result<()>;

    /// Starts recording the work queued on `stream` into a graph instead of running it
    /// (CUDA graphs). Until [`Backend::end_capture`], allocations on the device come from
    /// memory the graph keeps. Backends without graphs say so.
    fn begin_capture(&self, stream: Stream) -> Result<()> {
        let _ = stream;
        Err(Error::Backend(format!("the {} backend records no graphs", self.name())))
    }

    /// Ends the recording begun by [`Backend::begin_capture`]: the graph, ready to launch, or
    /// why the work could not be recorded (a wait for the device inside, say).
    fn end_capture(&self, stream: Stream) -> Result<Arc<dyn GraphExec>> {
        let _ = stream;
        Err(Error::Backend(format!("the {} backend records no graphs", self.name())))
    }

    /// Copies the elements of `src` (row-contiguous) into `dst` (row-contiguous, as many
    /// elements of the same dtype), both in this backend's memory, queued on `stream`: how a
    /// recorded graph's fixed inputs take new values.
    fn copy_into(&self, stream: Stream, src: &Operand, dst: &crate::storage::Data) -> Result<()> {
        let _ = (stream, src, dst);
        Err(Error::Backend(format!("the {} backend has no copy_into", self.name())))
    }
}

/// A recorded graph of device work (see [`Backend::begin_capture`]), replayed as a whole. It
/// reads and writes the same memory on every launch.
pub trait GraphExec: Send + Sync {
    /// Queues the whole graph on `stream`.
    fn launch(&self, stream: Stream) -> Result<()>;
    /// The number of operations recorded.
    fn len(&self) -> usize;
    /// Whether nothing was recorded.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

unsafe extern "Rust" {
    /// Provided by the facade crate `nuvec` (`#[no_mangle]`): the backends of this build.
    safe fn __nuvec_backends_v1() -> Vec<Arc<dyn Backend>>;
}

fn registry() -> &'static [Arc<dyn Backend>] {
    static REGISTRY: OnceLock<Vec<Arc<dyn Backend>>> = OnceLock::new();
    REGISTRY.get_or_init(__nuvec_backends_v1)
}

/// The backend that runs work on `device`, or `UnsupportedDevice` (whose message then says
/// why, see [`unavailable_reason`]). Every device fails with `InvalidArgument` while
/// `NUVEC_DEVICE` holds a value that is not a device.
pub fn backend_for(device: Device) -> Result<&'static dyn Backend> {
    if let Err(msg) = crate::device::device_env() {
        return Err(Error::InvalidArgument(msg.clone()));
    }
    match registry().iter().find(|b| b.kind() == device.kind && b.is_available(device)) {
        Some(b) => Ok(b.as_ref()),
        None => {
            if let Some(why) = unavailable_reason(device) {
                crate::error::note_unavailable(device, why);
            }
            Err(Error::UnsupportedDevice(device))
        }
    }
}

/// Whether some backend can run work on `device`.
pub fn is_available(device: Device) -> bool {
    backend_for(device).is_ok()
}

/// Why no backend can run work on `device`, as its backends say (`"cuda: libcuda (the NVIDIA
/// driver) was not found"`); `None` when one can.
pub fn unavailable_reason(device: Device) -> Option<String> {
    let of_kind: Vec<&Arc<dyn Backend>> = registry().iter().filter(|b| b.kind() == device.kind).collect();
    if of_kind.is_empty() {
        let kind = if device.is_cpu() { "CPU" } else { "GPU" };
        return Some(format!("this build has no {kind} backend"));
    }
    if of_kind.iter().any(|b| b.is_available(device)) {
        return None;
    }
    let why: Vec<String> = of_kind
        .iter()
        .map(|b| match b.unavailable_reason(device) {
            Some(r) => format!("{}: {r}", b.name()),
            None => format!("{}: {device} is not usable", b.name()),
        })
        .collect();
    Some(why.join("; "))
}
