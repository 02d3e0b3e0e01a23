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
}

unsafe extern "Rust" {
    /// Provided by the facade crate `nuvec` (`#[no_mangle]`): the backends of this build.
    safe fn __nuvec_backends_v1() -> Vec<Arc<dyn Backend>>;
}

fn registry() -> &'static [Arc<dyn Backend>] {
    static REGISTRY: OnceLock<Vec<Arc<dyn Backend>>> = OnceLock::new();
    REGISTRY.get_or_init(__nuvec_backends_v1)
}

/// The backend that runs work on `device`, or `UnsupportedDevice`.
pub fn backend_for(device: Device) -> Result<&'static dyn Backend> {
    registry()
        .iter()
        .find(|b| b.kind() == device.kind && b.is_available(device))
        .map(|b| b.as_ref())
        .ok_or(Error::UnsupportedDevice(device))
}

/// Whether some backend can run work on `device`.
pub fn is_available(device: Device) -> bool {
    backend_for(device).is_ok()
}
