//! Errors. Operations never return `Result`: a bad call gives a *failed array* that carries
//! one of these, and it surfaces at `eval`, `item`, `to_vec` or `check`.

use std::fmt;
use std::panic::Location;

use crate::device::Device;
use crate::dtype::DType;

/// `Result` with nuvec's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong in nuvec.
///
/// `Debug` prints the same readable message as `Display` (as `anyhow` does), so a
/// `fn main() -> nuvec::Result<()>` that returns an error prints the message; `{:#?}` prints
/// the variant and its fields.
#[non_exhaustive]
#[derive(Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// An operation was called with bad arguments.
    #[error("{op} at {}:{}: {}", at.file(), at.line(), describe(op, kind))]
    Op {
        /// The public name of the operation (`"reshape"`, `"matmul"`, ...).
        op: &'static str,
        /// Where the caller called it.
        at: &'static Location<'static>,
        /// What was wrong.
        kind: OpErrorKind,
    },
    /// An allocation failed, or would have passed the device's memory limit.
    #[error("out of memory: {}", describe_oom(op, device, *bytes, *limit))]
    OutOfMemory {
        /// The operation that needed the memory (empty when not known).
        op: &'static str,
        /// Where the memory was wanted.
        device: Device,
        /// The size of the allocation that failed.
        bytes: usize,
        /// The memory limit that refused it, when it was the limit and not the system.
        limit: Option<usize>,
    },
    /// A backend (driver, compiler, library) reported a failure.
    #[error("backend error: {0}")]
    Backend(String),
    /// The device has no backend able to run the work. The message says why when a backend of
    /// its kind knows (for the GPU: no driver, no NVRTC, no device, ...).
    #[error("unsupported device {device}: no backend for it is available{note}", device = .0, note = unavailable_note(.0))]
    UnsupportedDevice(Device),
    /// Reading or writing a file failed.
    #[error("i/o error: {0}")]
    Io(String),
    /// A planning or loading function was given a bad argument.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

/// What was wrong with an operation's arguments.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq)]
pub enum OpErrorKind {
    /// Two shapes that must agree (broadcast, concatenate, matmul) do not.
    ShapeMismatch {
        /// The first shape.
        lhs: Vec<i32>,
        /// The second shape.
        rhs: Vec<i32>,
    },
    /// Two dtypes that must agree do not.
    DTypeMismatch {
        /// The first dtype.
        lhs: DType,
        /// The second dtype.
        rhs: DType,
    },
    /// A count of elements does not match.
    SizeMismatch {
        /// What was needed.
        expected: usize,
        /// What was given.
        actual: usize,
    },
    /// The operation does not accept this dtype.
    UnsupportedDType(DType),
    /// An axis outside `-ndim..ndim`.
    InvalidAxis {
        /// The axis given.
        axis: i32,
        /// The number of dimensions of the array.
        ndim: usize,
    },
    /// A shape with a negative size or too many elements.
    InvalidShape(Vec<i64>),
    /// A bad index.
    InvalidIndex(String),
    /// An allocation failed.
    OutOfMemory(usize),
    /// Anything else, described in words that name the argument.
    InvalidArgument(String),
    /// The operation cannot run on the stream's device (a custom CUDA kernel on the CPU).
    UnsupportedDevice(Device),
}

impl fmt::Display for OpErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpErrorKind::ShapeMismatch { lhs, rhs } => {
                write!(f, "shapes {lhs:?} and {rhs:?} do not match")
            }
            OpErrorKind::DTypeMismatch { lhs, rhs } => {
                write!(f, "dtypes {lhs} and {rhs} do not match")
            }
            OpErrorKind::SizeMismatch { expected, actual } => {
                write!(f, "expected {expected} elements, got {actual}")
            }
            OpErrorKind::UnsupportedDType(d) => write!(f, "dtype {d} is not supported"),
            OpErrorKind::InvalidAxis { axis, ndim } => {
                write!(f, "axis {axis} is out of range for an array of {ndim} dimensions")
            }
            OpErrorKind::InvalidShape(s) => write!(f, "invalid shape {s:?}"),
            OpErrorKind::InvalidIndex(s) => write!(f, "invalid index: {s}"),
            OpErrorKind::OutOfMemory(n) => write!(f, "out of memory allocating {n} bytes"),
            OpErrorKind::InvalidArgument(s) => f.write_str(s),
            OpErrorKind::UnsupportedDevice(d) => match unavailable_reason_of(*d) {
                Some(why) if !d.is_cpu() => write!(f, "unsupported device {d}: it needs a usable CUDA GPU; {why}"),
                _ => write!(f, "unsupported device {d}: it needs a CUDA GPU (see nuvec::cuda::unavailable_reason)"),
            },
        }
    }
}

/// The message of an [`Error::Op`]'s kind. For `matmul`, whose shape errors hold the two
/// operand shapes, it says which dimensions clash.
fn describe(op: &str, kind: &OpErrorKind) -> String {
    match (op, kind) {
        ("matmul", OpErrorKind::ShapeMismatch { lhs, rhs }) => match matmul_clash(lhs, rhs) {
            Some(clash) => format!("{lhs:?} @ {rhs:?}: {clash}"),
            None => kind.to_string(),
        },
        _ => kind.to_string(),
    }
}

/// Which dimensions of `lhs @ rhs` clash under NumPy's rules (a 1-d left operand is a row, a
/// 1-d right operand a column): the inner ones, else the batch ones. `None` when neither does.
fn matmul_clash(lhs: &[i32], rhs: &[i32]) -> Option<String> {
    let (&k, &k2) = (lhs.last()?, if rhs.len() == 1 { rhs.first()? } else { rhs.get(rhs.len().checked_sub(2)?)? });
    if k != k2 {
        return Some(format!("inner dimensions {k} and {k2} differ"));
    }
    let (ba, bb) = (&lhs[..lhs.len().saturating_sub(2)], &rhs[..rhs.len().saturating_sub(2)]);
    let fits = ba.iter().rev().zip(bb.iter().rev()).all(|(&x, &y)| x == y || x == 1 || y == 1);
    (!fits).then(|| format!("batch dimensions {ba:?} and {bb:?} do not broadcast"))
}

/// Why devices are unavailable, as the backend registry found when it could not serve them.
static UNAVAILABLE: std::sync::Mutex<Vec<(Device, String)>> = std::sync::Mutex::new(Vec::new());

/// Records why no backend can run work on `device` (the backend registry calls it), for the
/// messages of [`Error::UnsupportedDevice`] and [`OpErrorKind::UnsupportedDevice`].
pub(crate) fn note_unavailable(device: Device, reason: String) {
    let mut notes = UNAVAILABLE.lock().unwrap_or_else(|e| e.into_inner());
    if !notes.iter().any(|(d, _)| *d == device) {
        notes.push((device, reason));
    }
}

fn unavailable_reason_of(device: Device) -> Option<String> {
    let notes = UNAVAILABLE.lock().unwrap_or_else(|e| e.into_inner());
    notes.iter().find(|(d, _)| *d == device).map(|(_, r)| r.clone())
}

/// `1.5 GiB`-style size for messages.
fn human_bytes(n: usize) -> String {
    const UNITS: [&str; 5] = ["bytes", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 { format!("{n} bytes") } else { format!("{v:.1} {}", UNITS[u]) }
}

fn describe_oom(op: &str, device: &Device, bytes: usize, limit: Option<usize>) -> String {
    let who = if op.is_empty() { String::new() } else { format!("{op} ") };
    let why = match limit {
        Some(l) => format!("it would pass the memory limit of {} (nuvec::memory::set_limit)", human_bytes(l)),
        None => "the system refused it".to_string(),
    };
    format!("{who}on {device} could not allocate {bytes} bytes ({}): {why}", human_bytes(bytes))
}

fn unavailable_note(device: &Device) -> String {
    unavailable_reason_of(*device).map(|r| format!("; {r}")).unwrap_or_default()
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !f.alternate() {
            return fmt::Display::fmt(self, f);
        }
        match self {
            Error::Op { op, at, kind } => {
                f.debug_struct("Op").field("op", op).field("at", at).field("kind", kind).finish()
            }
            Error::OutOfMemory { op, device, bytes, limit } => f
                .debug_struct("OutOfMemory")
                .field("op", op)
                .field("device", device)
                .field("bytes", bytes)
                .field("limit", limit)
                .finish(),
            Error::Backend(s) => f.debug_tuple("Backend").field(s).finish(),
            Error::UnsupportedDevice(d) => f.debug_tuple("UnsupportedDevice").field(d).finish(),
            Error::Io(s) => f.debug_tuple("Io").field(s).finish(),
            Error::InvalidArgument(s) => f.debug_tuple("InvalidArgument").field(s).finish(),
        }
    }
}

impl Error {
    /// A bad call of `op` described in words, located at `at` (for calls that are not
    /// recorded operations: reading values back, making a transform).
    pub(crate) fn misuse(op: &'static str, at: &'static Location<'static>, msg: String) -> Error {
        Error::Op { op, at, kind: OpErrorKind::InvalidArgument(msg) }
    }

    /// An out-of-memory error on `device` for `bytes`; the dispatcher names the operation.
    pub fn out_of_memory(device: Device, bytes: usize, limit: Option<usize>) -> Error {
        Error::OutOfMemory { op: "", device, bytes, limit }
    }

    /// This error with the operation `op` named, when it is an out-of-memory error that names
    /// none yet.
    pub fn in_op(self, op: &'static str) -> Error {
        match self {
            Error::OutOfMemory { op: "", device, bytes, limit } => Error::OutOfMemory { op, device, bytes, limit },
            e => e,
        }
    }
    /// The operation's error kind, for [`Error::Op`].
    pub fn kind(&self) -> Option<&OpErrorKind> {
        match self {
            Error::Op { kind, .. } => Some(kind),
            _ => None,
        }
    }

    /// Where the failing operation was called, for [`Error::Op`].
    pub fn location(&self) -> Option<&'static Location<'static>> {
        match self {
            Error::Op { at, .. } => Some(at),
            _ => None,
        }
    }

    /// The failing operation's name, for [`Error::Op`].
    pub fn op_name(&self) -> Option<&'static str> {
        match self {
            Error::Op { op, .. } => Some(op),
            _ => None,
        }
    }
}
