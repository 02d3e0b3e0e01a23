//! Devices and streams. Operations record the stream in scope on the calling thread
//! (`with_stream`); there is no per-operation stream argument.

use std::cell::RefCell;
use std::fmt;

/// The kind of a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeviceKind {
    /// The host processor.
    Cpu,
    /// An NVIDIA GPU.
    Gpu,
}

/// A device: the CPU, or a GPU by index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Device {
    /// CPU or GPU.
    pub kind: DeviceKind,
    /// Which one of that kind.
    pub index: u32,
}

impl Device {
    /// The host processor.
    pub const fn cpu() -> Self {
        Device { kind: DeviceKind::Cpu, index: 0 }
    }

    /// GPU number `index`.
    pub const fn gpu(index: u32) -> Self {
        Device { kind: DeviceKind::Gpu, index }
    }

    /// Whether this is the CPU.
    pub const fn is_cpu(self) -> bool {
        matches!(self.kind, DeviceKind::Cpu)
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            DeviceKind::Cpu => write!(f, "cpu"),
            DeviceKind::Gpu => write!(f, "gpu:{}", self.index),
        }
    }
}

/// A queue of work on a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Stream {
    /// The device the work runs on.
    pub device: Device,
    /// Which stream of that device.
    pub index: u32,
}

impl Stream {
    /// The default stream of `device`.
    pub const fn default_for(device: Device) -> Self {
        Stream { device, index: 0 }
    }
}

impl From<Device> for Stream {
    fn from(device: Device) -> Self {
        Stream::default_for(device)
    }
}

impl fmt::Display for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/stream{}", self.device, self.index)
    }
}

thread_local! {
    static STREAM_STACK: RefCell<Vec<Stream>> = const { RefCell::new(Vec::new()) };
}

/// The process's default device: `NUVEC_DEVICE=cpu|gpu` when set, else the GPU when a GPU
/// backend is available, else the CPU.
pub fn default_device() -> Device {
    static DEFAULT: std::sync::OnceLock<Device> = std::sync::OnceLock::new();
    *DEFAULT.get_or_init(|| match std::env::var("NUVEC_DEVICE").as_deref() {
        Ok("cpu") => Device::cpu(),
        Ok("gpu") => Device::gpu(0),
        _ => {
            if crate::backend::is_available(Device::gpu(0)) {
                Device::gpu(0)
            } else {
                Device::cpu()
            }
        }
    })
}

/// The stream operations on this thread record: the innermost [`with_stream`], else the default
/// device's default stream.
pub fn default_stream() -> Stream {
    STREAM_STACK.with(|s| s.borrow().last().copied()).unwrap_or_else(|| Stream::default_for(default_device()))
}

/// Runs `f` with operations on this thread recorded on `stream` (a [`Device`] or [`Stream`]).
///
/// ```
/// use nuvec::{Array, Device, with_stream};
/// let y = with_stream(Device::cpu(), || Array::from(2.0f32) * 3.0);
/// assert_eq!(y.item::<f32>().unwrap(), 6.0);
/// ```
pub fn with_stream<R>(stream: impl Into<Stream>, f: impl FnOnce() -> R) -> R {
    struct Pop;
    impl Drop for Pop {
        fn drop(&mut self) {
            STREAM_STACK.with(|s| s.borrow_mut().pop());
        }
    }
    STREAM_STACK.with(|s| s.borrow_mut().push(stream.into()));
    let _pop = Pop;
    f()
}
