//! Custom CUDA kernels from source (`fast::CudaKernel`): the plain data of one recorded call,
//! [`KernelSpec`]. The CUDA backend generates the kernel's full source from it (signature,
//! entry name, module key) when it evaluates the call; core only validates the arguments.

use std::panic::Location;

use crate::dtype::DType;
use crate::error::{Error, OpErrorKind};
use crate::storage::Spec;

/// Most axes an input's `name_shape` and `name_strides` hold (`MAX_NDIM` of the CUDA
/// backend's custom-kernel prelude).
pub const MAX_NDIM: usize = 10;

/// A template argument: an `int` or `bool` constant, or a type alias.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TemplateArg {
    /// `constexpr int NAME = v;`
    Int(i32),
    /// `constexpr bool NAME = v;`
    Bool(bool),
    /// `using NAME = <CUDA type of the dtype>;`
    DType(DType),
}

impl From<i32> for TemplateArg {
    fn from(v: i32) -> Self {
        TemplateArg::Int(v)
    }
}

impl From<bool> for TemplateArg {
    fn from(v: bool) -> Self {
        TemplateArg::Bool(v)
    }
}

impl From<DType> for TemplateArg {
    fn from(v: DType) -> Self {
        TemplateArg::DType(v)
    }
}

/// One validated call of a custom kernel: what the CUDA backend generates the kernel from, and
/// its launch. Names are C identifiers, distinct from each other.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelSpec {
    /// The kernel's name.
    pub name: String,
    /// Input names, in order.
    pub input_names: Vec<String>,
    /// Output names, in order.
    pub output_names: Vec<String>,
    /// The body.
    pub source: String,
    /// Code placed before the kernel (helpers, includes).
    pub header: String,
    /// Template arguments, emitted at the top of the body in this order.
    pub template: Vec<(String, TemplateArg)>,
    /// The inputs' shapes and dtypes at the call (their dtypes, and which are 0-d, shape the
    /// signature).
    pub inputs: Vec<Spec>,
    /// The outputs' shapes and dtypes (row-major buffers).
    pub outputs: Vec<Spec>,
    /// Blocks in x, y, z (zero in any axis: nothing is launched).
    pub blocks: [u32; 3],
    /// Threads per block in x, y, z.
    pub block: [u32; 3],
    /// Bytes of dynamic shared memory.
    pub shared_memory: u32,
    /// Fill value of the outputs.
    pub init_value: Option<f64>,
    /// Copy inputs that are not row-contiguous first.
    pub ensure_row_contiguous: bool,
    /// Print the generated source when the backend generates it.
    pub verbose: bool,
}

impl KernelSpec {
    /// A custom kernel has no derivative or batching rule of its own: transforms reaching
    /// it give failed arrays that say how to provide one.
    #[track_caller]
    pub(crate) fn no_rule(&self, transform: &str) -> Error {
        Error::Op {
            op: "cuda_kernel",
            at: Location::caller(),
            kind: OpErrorKind::InvalidArgument(format!(
                "{transform} of custom kernel `{}` is not defined: wrap the call in `custom_function` with a {transform} rule",
                self.name
            )),
        }
    }
}

fn is_ident_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// Whether `s` is a C identifier.
pub fn is_identifier(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty() && !b[0].is_ascii_digit() && b.iter().all(|&c| is_ident_char(c))
}

/// Whether `word` occurs in `text` as a whole identifier (so the input `x` does not pick up
/// `max_shape`). A body gets `x_shape`, `x_strides` and `x_ndim` only when it mentions them.
pub fn mentions(text: &str, word: &str) -> bool {
    let (t, w) = (text.as_bytes(), word.len());
    let mut from = 0;
    while let Some(pos) = text[from..].find(word) {
        let at = from + pos;
        let before = at == 0 || !is_ident_char(t[at - 1]);
        let after = at + w >= t.len() || !is_ident_char(t[at + w]);
        if before && after {
            return true;
        }
        from = at + 1;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mentions_whole_identifiers_only() {
        assert!(mentions("x_shape[0]", "x_shape"));
        assert!(mentions("a + x_shape", "x_shape"));
        assert!(!mentions("max_shape", "x_shape"));
        assert!(!mentions("x_shapes", "x_shape"));
        assert!(mentions("max_shape + x_shape", "x_shape"));
    }

    #[test]
    fn identifiers() {
        assert!(is_identifier("inp_1") && is_identifier("_x"));
        assert!(!is_identifier("") && !is_identifier("1x") && !is_identifier("a-b") && !is_identifier("a b"));
    }
}
