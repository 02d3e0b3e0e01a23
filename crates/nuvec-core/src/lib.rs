//! nuvec-core: lazy arrays, dtypes, primitives, operations and evaluation.
//!
//! Users depend on the facade crate `nuvec`, which re-exports this crate and wires in the
//! backends; items here make no stability promise when used directly.

// Public items of the libraries are documented; examples and tests need no crate docs.
#![warn(missing_docs)]

pub mod array;
pub mod backend;
pub mod device;
pub mod dtype;
pub mod error;
mod eval;
pub mod fast;
pub mod ops;
pub mod primitive;
pub mod random;
pub mod shape;
pub mod storage;
pub mod transforms;
pub mod tree;

pub use array::{Array, ArrayLiteral, ScalarOrArray};
pub use device::{Device, DeviceKind, Stream, default_device, default_stream, with_stream};
pub use dtype::{Category, Complex64, DType, Element, Scalar, bf16, f16, promote_types};
pub use error::{Error, OpErrorKind, Result};
pub use eval::{async_eval, eval};
pub use ops::{At, Ellipsis, Index, IndexStep, IntoIndex, IntoIndexEntry, NewAxis, ScanOptions, VarOptions};
pub use shape::{Axes, IntoShape, Shape};
pub use tree::{Leaves, tree_map, tree_map_with};
