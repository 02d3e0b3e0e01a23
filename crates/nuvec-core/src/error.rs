//! Errors. Operations never return `Result`: a bad call gives a *failed array* that carries
//! one of these, and it surfaces at `eval`, `item`, `to_vec` or `check`.

use std::fmt;
use std::panic::Location;

use crate::device::Device;
use crate::dtype::DType;

/// `Result` with nuvec's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong in nuvec.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum Error {
    /// An operation was called with bad arguments.
    #[error("{op} at {}:{}: {kind}", at.file(), at.line())]
    Op {
        /// The public name of the operation (`"reshape"`, `"matmul"`, ...).
        op: &'static str,
        /// Where the caller called it.
        at: &'static Location<'static>,
        /// What was wrong.
        kind: OpErrorKind,
    },
    /// An allocation of this many bytes failed or would pass the memory limit.
    #[error("out of memory: could not allocate {0} bytes")]
    OutOfMemory(usize),
    /// A backend (driver, compiler, library) reported a failure.
    #[error("backend error: {0}")]
    Backend(String),
    /// The device has no backend able to run the work.
    #[error("unsupported device {0}: no backend for it is available")]
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
            OpErrorKind::UnsupportedDevice(d) => {
                write!(f, "unsupported device {d}: it needs a CUDA GPU (see nuvec::cuda::unavailable_reason)")
            }
        }
    }
}

impl Error {
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
