//! Reading and writing arrays, as MLX's `mx.load` and `mx.save_*`:
//!
//! - safetensors ([`SafetensorsFile`], [`load_safetensors`], [`save_safetensors`]): the file
//!   is memory-mapped and a tensor is read when asked for; sharded checkpoints through their
//!   `model.safetensors.index.json` ([`load_safetensors_index`]); every dtype of the format
//!   that nuvec has.
//! - NumPy's `.npy` ([`load_npy`], [`save_npy`]) and `.npz` ([`load_npz`], [`save_npz`],
//!   stored or deflated).
//! - GGUF, llama.cpp's format ([`GgufFile`], [`load_gguf`]): metadata and tensors; F32, F16
//!   and BF16 as they are, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and Q2_K … Q6_K dequantized to
//!   float32, or, where the blocks are groups of 32 (all but Q2_K, Q3_K and Q6_K), kept
//!   quantized in MLX's affine format ([`GgufFile::affine`]).
//! - [`load`] picks the format by the file's name.
//!
//! Arrays load on the host; the first operation on another device moves them. A corrupt or
//! truncated file gives an [`Error::Io`] naming the file (and the tensor, where one is at
//! fault); nothing panics.
//!
//! ```
//! # use nuvec as _; // the backends
//! use nuvec_core::{Array, DType};
//! let dir = std::env::temp_dir().join(format!("nuvec-io-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir).unwrap();
//! let path = dir.join("weights.safetensors");
//! let w = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], [2, 2]).astype(DType::BF16);
//! nuvec_io::save_safetensors(&path, &[("layer.weight", &w)], None).unwrap();
//! let file = nuvec_io::SafetensorsFile::open(&path).unwrap();
//! assert_eq!(file.names(), ["layer.weight"]);
//! let back = file.get("layer.weight").unwrap();
//! assert_eq!(back.dtype(), DType::BF16);
//! assert_eq!(back.astype(DType::F32).to_vec::<f32>().unwrap(), [1.0, 2.0, 3.0, 4.0]);
//! std::fs::remove_dir_all(&dir).unwrap();
//! ```

#![warn(missing_docs)]

mod gguf;
mod npy;
mod safetensors_io;

use std::collections::BTreeMap;
use std::path::Path;

pub use gguf::{GgufAffine, GgufFile, GgufTensor, GgufValue, load_gguf};
pub use npy::{load_npy, load_npz, save_npy, save_npz};
pub use nuvec_core::{Array, Error, Result};
pub use safetensors_io::{
    SafetensorsFile, load_safetensors, load_safetensors_index, safetensors_index, save_safetensors,
};

/// Every tensor of the file at `path`, by name, the format chosen by its name: `.safetensors`,
/// a sharded checkpoint's `.json` index, `.npz`, or `.gguf` (its metadata: [`load_gguf`]).
/// (`.npy` holds one array: [`load_npy`].)
pub fn load(path: impl AsRef<Path>) -> Result<BTreeMap<String, Array>> {
    let path = path.as_ref();
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if name.ends_with(".safetensors") {
        load_safetensors(path)
    } else if name.ends_with(".json") {
        load_safetensors_index(path)
    } else if name.ends_with(".npz") {
        load_npz(path)
    } else if name.ends_with(".gguf") {
        Ok(load_gguf(path)?.0)
    } else {
        Err(io_error("load", path, "the format is not known by the name (.safetensors, .json index, .npz, .gguf)"))
    }
}

/// An [`Error::Io`] saying what `op` found wrong with `path`.
pub(crate) fn io_error(op: &str, path: &Path, what: impl std::fmt::Display) -> Error {
    Error::Io(format!("{op}: {}: {what}", path.display()))
}
