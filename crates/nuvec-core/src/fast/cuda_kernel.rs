//! Custom CUDA kernels written from source: MLX's `mx.fast.cuda_kernel`.
//!
//! [`CudaKernel`] holds a body and the names of its inputs and outputs; each
//! [`call`](CudaKernel::call) validates its arguments and records one
//! `Primitive::CustomKernel` node holding a [`KernelSpec`] (plain data). Only the CUDA backend
//! runs it: it generates the full kernel for the call's dtypes and template arguments, and
//! compiles each generated source once (memory and disk cache) with NVRTC. The kernel has no
//! derivative or batching rule of its own; wrap the call in `custom_function` to give it some.

use std::panic::Location;
use std::sync::Arc;

use crate::array::Array;
use crate::device::{DeviceKind, default_stream};
use crate::dtype::DType;
use crate::error::{Error, OpErrorKind, Result};
use crate::primitive::Primitive;
use crate::shape::check_shape;
use crate::storage::Spec;

pub use crate::primitive::custom_kernel::{KernelSpec, MAX_NDIM, TemplateArg, is_identifier, mentions};

/// The name failed calls report.
const OP: &str = "cuda_kernel";

/// The launch of one call: grid and block sizes, template arguments, output initialisation.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelConfig {
    /// Threads (not blocks) in x, y, z, as MLX's `grid`. The blocks launched are
    /// `ceil(grid / threadgroup)` per axis; extra threads run, so bodies check bounds.
    pub grid: (u32, u32, u32),
    /// Threads per block in x, y, z (at most 1024 in all).
    pub threadgroup: (u32, u32, u32),
    /// Template arguments, emitted at the top of the body in this order.
    pub template: Vec<(String, TemplateArg)>,
    /// Fill every output with this value before the launch; otherwise outputs start
    /// uninitialised (or zeroed, with [`CudaKernel::atomic_outputs`]).
    pub init_value: Option<f64>,
    /// Print the generated source (the CUDA backend prints it when it generates the kernel).
    pub verbose: bool,
}

impl Default for KernelConfig {
    fn default() -> Self {
        KernelConfig { grid: (1, 1, 1), threadgroup: (1, 1, 1), template: Vec::new(), init_value: None, verbose: false }
    }
}

/// A custom CUDA kernel (MLX's `mx.fast.cuda_kernel`).
///
/// The body sees its inputs as `const T* __restrict__ name` (0-d inputs by value), its outputs
/// as `T* name`, template arguments as `constexpr` values and `using` aliases, and, when it
/// mentions them, `name_shape`, `name_strides` and `name_ndim` of an input. The prelude gives
/// `float16_t`, `bfloat16_t`, `uint`, `elem_to_loc`, `warp_sum`/`warp_max`/`warp_min` and
/// `cg` (cooperative groups).
///
/// ```
/// use nuvec::{DType, fast::{CudaKernel, KernelConfig, TemplateArg}, ops};
/// let kernel = CudaKernel::new(
///     "scale",
///     &["inp"],
///     &["out"],
///     "uint i = threadIdx.x + blockIdx.x * blockDim.x;\nout[i] = static_cast<T>(inp[i] * N);",
/// );
/// let config = KernelConfig {
///     grid: (1024, 1, 1),
///     threadgroup: (256, 1, 1),
///     template: vec![("T".into(), TemplateArg::DType(DType::F16)), ("N".into(), TemplateArg::Int(3))],
///     ..Default::default()
/// };
/// let x = ops::ones([1024], DType::F16);
/// let out = kernel.call(&[x], &[([1024], DType::F16)], &config).remove(0);
/// if nuvec::cuda::is_available() {
///     assert_eq!(out.sum(..).astype(DType::F32).item::<f32>().unwrap(), 3072.0);
/// } else {
///     // Without a CUDA GPU the call fails with a clear error instead of panicking.
///     assert!(out.eval().is_err());
/// }
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct CudaKernel {
    name: String,
    input_names: Vec<String>,
    output_names: Vec<String>,
    source: String,
    header: String,
    ensure_row_contiguous: bool,
    atomic_outputs: bool,
    shared_memory: u32,
}

impl CudaKernel {
    /// A kernel named `name` whose body `source` reads `inputs` and writes `outputs`.
    pub fn new(
        name: impl Into<String>,
        inputs: &[impl AsRef<str>],
        outputs: &[impl AsRef<str>],
        source: impl Into<String>,
    ) -> Self {
        CudaKernel {
            name: name.into(),
            input_names: inputs.iter().map(|s| s.as_ref().to_string()).collect(),
            output_names: outputs.iter().map(|s| s.as_ref().to_string()).collect(),
            source: source.into(),
            header: String::new(),
            ensure_row_contiguous: true,
            atomic_outputs: false,
            shared_memory: 0,
        }
    }

    /// Code placed before the kernel: device helpers, `#include`s of CUDA headers.
    pub fn header(mut self, header: impl Into<String>) -> Self {
        self.header = header.into();
        self
    }

    /// Whether inputs are copied to row-major order first (default `true`). With `false` the
    /// body gets views as they are and indexes them through `name_strides`.
    pub fn ensure_row_contiguous(mut self, yes: bool) -> Self {
        self.ensure_row_contiguous = yes;
        self
    }

    /// Whether the body accumulates into its outputs with atomics (`atomicAdd(&out[i], v)`):
    /// then outputs always start initialised, to `init_value` or else zero.
    pub fn atomic_outputs(mut self, yes: bool) -> Self {
        self.atomic_outputs = yes;
        self
    }

    /// Bytes of dynamic shared memory per block (`extern __shared__ T buf[];`).
    pub fn shared_memory(mut self, bytes: u32) -> Self {
        self.shared_memory = bytes;
        self
    }

    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    #[track_caller]
    fn invalid(&self, msg: String) -> Error {
        Error::Op {
            op: OP,
            at: Location::caller(),
            kind: OpErrorKind::InvalidArgument(format!("kernel `{}`: {msg}", self.name)),
        }
    }

    /// What this call would record (for tools and for generating its source with the CUDA
    /// backend): validates the arguments, without recording anything.
    #[track_caller]
    pub fn spec<S: AsRef<[i32]>>(
        &self,
        inputs: &[Array],
        outputs: &[(S, DType)],
        config: &KernelConfig,
    ) -> Result<KernelSpec> {
        self.validate(inputs, outputs, config)?;
        for (name, x) in self.input_names.iter().zip(inputs) {
            let indexed =
                mentions(&self.source, &format!("{name}_shape")) || mentions(&self.source, &format!("{name}_strides"));
            if indexed && x.ndim() > MAX_NDIM {
                return Err(self.invalid(format!(
                    "input `{name}` has {} dimensions; `{name}_shape` and `{name}_strides` hold at most {MAX_NDIM}",
                    x.ndim()
                )));
            }
        }
        let (g, t) = (config.grid, config.threadgroup);
        Ok(KernelSpec {
            name: self.name.clone(),
            input_names: self.input_names.clone(),
            output_names: self.output_names.clone(),
            source: self.source.clone(),
            header: self.header.clone(),
            template: config.template.clone(),
            inputs: inputs.iter().map(Array::spec).collect(),
            outputs: outputs.iter().map(|(s, d)| Spec { shape: s.as_ref().into(), dtype: *d }).collect(),
            blocks: [g.0.div_ceil(t.0), g.1.div_ceil(t.1), g.2.div_ceil(t.2)],
            block: [t.0.min(g.0), t.1.min(g.1), t.2.min(g.2)],
            shared_memory: self.shared_memory,
            init_value: config.init_value.or(self.atomic_outputs.then_some(0.0)),
            ensure_row_contiguous: self.ensure_row_contiguous,
            verbose: config.verbose,
        })
    }

    #[track_caller]
    fn validate<S: AsRef<[i32]>>(&self, inputs: &[Array], outputs: &[(S, DType)], config: &KernelConfig) -> Result<()> {
        if !is_identifier(&self.name) {
            return Err(self.invalid("the name must be a C identifier".into()));
        }
        if self.output_names.is_empty() {
            return Err(self.invalid("output_names must not be empty".into()));
        }
        let mut seen = std::collections::HashSet::new();
        let all = self.input_names.iter().chain(&self.output_names).chain(config.template.iter().map(|(n, _)| n));
        for n in all {
            if !is_identifier(n) {
                return Err(self.invalid(format!("`{n}` (an input, output or template name) is not a C identifier")));
            }
            if !seen.insert(n.as_str()) {
                return Err(self.invalid(format!("the name `{n}` is used twice")));
            }
        }
        if inputs.len() != self.input_names.len() {
            return Err(self.invalid(format!(
                "inputs: expected {} arrays, got {}",
                self.input_names.len(),
                inputs.len()
            )));
        }
        if outputs.len() != self.output_names.len() {
            return Err(self.invalid(format!(
                "outputs: expected {} (shape, dtype) pairs, got {}",
                self.output_names.len(),
                outputs.len()
            )));
        }
        if let Some(e) = inputs.iter().find_map(|a| a.error()) {
            return Err(e);
        }
        for (name, (shape, _)) in self.output_names.iter().zip(outputs) {
            if check_shape(shape.as_ref()).is_err() {
                return Err(self.invalid(format!("output `{name}` has an invalid shape {:?}", shape.as_ref())));
            }
        }
        let (tx, ty, tz) = config.threadgroup;
        if tx == 0 || ty == 0 || tz == 0 || tx as u64 * ty as u64 * tz as u64 > 1024 {
            return Err(self.invalid(format!(
                "threadgroup {:?} must have every size at least 1 and at most 1024 threads in all",
                config.threadgroup
            )));
        }
        if let Some(v) = config.init_value
            && v.is_nan()
            && outputs.iter().any(|o| !o.1.is_inexact())
        {
            return Err(self.invalid("init_value NaN does not fit an integer output".into()));
        }
        Ok(())
    }

    /// Records a call: one array per output name, of the given shapes and dtypes (row-major).
    ///
    /// Bad arguments give failed arrays naming `cuda_kernel` and the argument; on a device
    /// without CUDA the arrays fail with `UnsupportedDevice`. Compile errors surface when the
    /// outputs are evaluated, with NVRTC's log at the body's own line numbers
    /// (`<name>.source(LINE)`).
    #[track_caller]
    pub fn call<S: AsRef<[i32]>>(&self, inputs: &[Array], outputs: &[(S, DType)], config: &KernelConfig) -> Vec<Array> {
        record(OP, self.output_names.len(), self.spec(inputs, outputs, config), inputs)
    }
}

/// Records a custom kernel call of `op` (`cuda_kernel` or `metal_kernel`) from its validated
/// spec: failed arrays (`n` of them) for an error, or on a device without CUDA.
#[track_caller]
pub(crate) fn record(op: &'static str, n: usize, spec: Result<KernelSpec>, inputs: &[Array]) -> Vec<Array> {
    let fail = |e: Error| vec![Array::from_error(e); n.max(1)];
    let spec = match spec {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    let device = default_stream().device;
    if device.kind != DeviceKind::Gpu || !crate::backend::is_available(device) {
        return fail(Error::Op { op, at: Location::caller(), kind: OpErrorKind::UnsupportedDevice(device) });
    }
    let specs = spec.outputs.clone();
    Array::from_node(Primitive::CustomKernel(Arc::new(spec)), inputs.to_vec(), specs)
}
