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

/// Reads a value of `NUVEC_DEVICE`: `cpu`, `gpu` or `gpu:N`, in any case and with surrounding
/// spaces ignored. An empty value means unset (`Ok(None)`); anything else is an error whose
/// message names the variable, the value and the accepted values. Pure: it does not read the
/// environment.
///
/// ```
/// use nuvec::{Device, parse_device_env};
/// assert_eq!(parse_device_env("GPU"), Ok(Some(Device::gpu(0))));
/// assert_eq!(parse_device_env(" cpu "), Ok(Some(Device::cpu())));
/// assert_eq!(parse_device_env(""), Ok(None));
/// assert!(parse_device_env("bogus").unwrap_err().contains("NUVEC_DEVICE"));
/// ```
pub fn parse_device_env(value: &str) -> Result<Option<Device>, String> {
    let v = value.trim().to_ascii_lowercase();
    let index = |i: &str| i.parse::<u32>().ok();
    match v.as_str() {
        "" => Ok(None),
        "cpu" | "cpu:0" => Ok(Some(Device::cpu())),
        "gpu" => Ok(Some(Device::gpu(0))),
        _ => match v.strip_prefix("gpu:").and_then(index) {
            Some(i) => Ok(Some(Device::gpu(i))),
            None => {
                Err(format!("NUVEC_DEVICE={value:?} is not a device: use cpu, gpu or gpu:N (any case), or unset it"))
            }
        },
    }
}

/// `NUVEC_DEVICE`, read once: the device it names, `None` when unset or empty, or why its value
/// is not a device.
pub(crate) fn device_env() -> &'static Result<Option<Device>, String> {
    static ENV: std::sync::OnceLock<Result<Option<Device>, String>> = std::sync::OnceLock::new();
    ENV.get_or_init(|| match std::env::var("NUVEC_DEVICE") {
        Ok(v) => parse_device_env(&v),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(v)) => {
            Err(format!("NUVEC_DEVICE={v:?} is not a device: use cpu, gpu or gpu:N (any case), or unset it"))
        }
    })
}

/// The process's default device: the one `NUVEC_DEVICE` names (see [`parse_device_env`]) when
/// it is set, else the GPU when a GPU backend is available, else the CPU.
///
/// A `NUVEC_DEVICE` value that is not a device is an error, not a silent fallback: the default
/// device is then the CPU, but every evaluation fails with a message naming the variable and
/// its value, until it is fixed or unset.
pub fn default_device() -> Device {
    static DEFAULT: std::sync::OnceLock<Device> = std::sync::OnceLock::new();
    *DEFAULT.get_or_init(|| match device_env() {
        Ok(Some(d)) => *d,
        Err(_) => Device::cpu(),
        Ok(None) => {
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
