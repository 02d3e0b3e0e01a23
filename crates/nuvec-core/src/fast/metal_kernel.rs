//! Metal kernels on CUDA: MLX's `mx.fast.metal_kernel`, with bodies in Metal Shading Language.
//!
//! [`MetalKernel`] translates its body (and header) to CUDA C++ when it is called, then records
//! the same node a [`CudaKernel`] records: the CUDA backend generates the signature, compiles
//! with NVRTC once per distinct kernel and launches it. The translation is a CUDA prelude
//! (`crates/nuvec-cuda/kernels/metal_kernel.cuh`, included first) that defines Metal's types and
//! functions, plus these source rewrites, each in place so NVRTC reports the body's own lines:
//!
//! 1. The address spaces `device`, `constant` and `thread` are dropped (CUDA pointers are
//!    generic); `threadgroup` starting a declaration becomes `__shared__`, elsewhere (pointers,
//!    references) it is dropped.
//! 2. Vector type names (`float4`, `half2`, `uint3`, ...) and `vec<T, N>` become `metal::` ones,
//!    because CUDA predefines its own `float4` and `uint3` without Metal's operators.
//! 3. Swizzles `.xy`, `.zyx`, `.rgb` become `.template sw<0, 1>()`, a copy; one that is assigned
//!    to (`=`, `+=`, ...) becomes `.template wsw<0, 1>()`, a reference to its components. An
//!    assigned swizzle that repeats a component (`v.xx = ...`) is refused, as Metal refuses it.
//! 4. `#include <metal_stdlib>` and other `<metal_*>` includes become comments.
//! 5. Floating literals without a suffix (`0.5`, `-1e30`) get an `f`: Metal has no `double`,
//!    so they are floats there, and a `double` would change both the results and the speed.
//! 6. In a conditional `c ? x : 1.0f` (or `c ? 0 : x`) the operand that is not a number is wrapped
//!    in `nv_mk_promote`, which widens half and bfloat to float, as Metal's conversions do;
//!    CUDA's half types convert both ways, which makes such a conditional ambiguous there.
//!
//! The kernel's signature follows MLX's Metal rules: inputs are `const device T*` (0-d inputs
//! `const constant T&`, here by value), outputs `device T*` or, with
//! [`atomic_outputs`](MetalKernel::atomic_outputs), `device atomic<T>*`; `name_shape`,
//! `name_strides` and `name_ndim` exist when the body mentions them; template arguments become
//! `constexpr` values and type aliases; and each thread attribute the body mentions is a value
//! declared before it. `grid` is in threads, as MLX's: threads beyond it do not run (the kernel
//! returns for them when the grid is not a multiple of the threadgroup). That guard and
//! `grid_size` hold the call's grid as constants, so such kernels compile once per grid. The
//! SIMD-group functions shuffle over whole warps: where a body uses them, keep its SIMD-groups
//! whole (a grid that is a multiple of the threadgroup, threadgroups of whole SIMD-groups).
//!
//! | Metal feature | On CUDA | Test (`crates/nuvec/tests/suite/metal_kernel.rs`) |
//! |---|---|---|
//! | `thread_position_in_grid`, `_in_threadgroup`, `threadgroup_position_in_grid`, `threads_per_threadgroup`, `threadgroups_per_grid`, `grid_size`/`threads_per_grid` | `uint3` values from `blockIdx`/`threadIdx`/`blockDim`/`gridDim` and the call's grid | `scale_f16`, `attributes` |
//! | `thread_index_in_threadgroup`, `thread_index_in_simdgroup`, `simdgroup_index_in_threadgroup`, `threads_per_simdgroup`, `simdgroups_per_threadgroup`, `thread_execution_width` | `uint` values; SIMD-groups are warps (32 lanes) | `attributes`, `simd_reductions` |
//! | inputs, 0-d inputs, outputs, `name_shape`/`_strides`/`_ndim`, template arguments | CudaKernel's signature | `scale_f16`, `strided` |
//! | `device`, `constant`, `thread` | dropped | every case |
//! | `threadgroup T buf[N]`, `threadgroup_barrier(mem_flags::...)`, `simdgroup_barrier` | `__shared__`, `__syncthreads()` (+ `__threadfence()` for `mem_device`), `__syncwarp()` | `threadgroup_sum` |
//! | `simd_sum/product/max/min/and/or/xor`, `simd_prefix_{inclusive,exclusive}_{sum,product}`, `simd_shuffle{,_xor,_down,_up}`, `simd_broadcast{,_first}`, `simd_all/any`, `simd_is_first` | warp shuffles and votes (full warps) | `simd_reductions`, `simd_scans` |
//! | `half`, `bfloat`, `uint`, `ushort`, `uchar`, `ulong` | `__half`, `__nv_bfloat16`, ... | `scale_f16`, `math` |
//! | `float2/3/4`, `half4`, `int2`, `uint3`, ... with `+ - * /`, `[]`, constructors, conversions, swizzle reads, `dot`, `length`, `normalize` | `metal::vec<T, N>` | `vectors` |
//! | swizzle assignment: `v.xy = ...`, `v.zw += ...` (`+= -= *= /=`), `c.rgb = c.bgr`, `p[i].wzy = ...`; single `.x`...`.w` and `.r`...`.a` | a reference to the components; `.r` shares `.x`'s storage | `swizzle_writes` |
//! | `<`, `<=`, `>`, `>=`, `==`, `!=` on vectors, and between a vector and a scalar, giving `bool2/3/4`; `!`, `all`, `any` and `select(a, b, boolN)` on bool vectors | elementwise on `metal::vec<bool, N>` | `compare` |
//! | `%`, `&`, `\|`, `^`, `<<`, `>>` (and their compound assignments), `~` on integer vectors; `&&`, `\|\|` on bool vectors; `clamp`, `mix`, `step`, `sign`, `saturate` on float vectors, with scalar or vector bounds | elementwise; `&&` and `\|\|` evaluate both sides, as Metal's vector forms do | `vector_ops` |
//! | `simd_ballot(bool)` giving `simd_vote`: `(uint64_t)` or `simd_vote::vote_t` casts, `.all()`, `.any()`; `simd_active_threads_mask()`; `popcount`, `ctz`, `clz` on integers and `popcount` on vectors | `__ballot_sync(0xffffffff, c)` widened to 64 bits (the high half is zero); `.all()` compares with `__activemask()`; `__popcll`, `__ffsll`, `__clzll` | `ballot` |
//! | `exp`, `log`, `sqrt`, `rsqrt`, `tanh`, `abs`, `max`, `min`, `fma`, `clamp`, `select`, `mix`, `sign`, `step`, `fract`, `saturate`, on float, half, bfloat and vectors; `fast::` and `precise::`; `metal::` names | CUDA math | `math` |
//! | `as_type<T>`, `metal::numeric_limits<T>`, `INFINITY`, `M_PI_F`, ... | bit copies, constants | `math` |
//! | `atomic<T>` (`int`, `uint`, `float`) with `atomic_{load,store,exchange,fetch_add,fetch_sub,fetch_max,fetch_min,fetch_and,fetch_or,fetch_xor,compare_exchange_weak}_explicit`, `memory_order_relaxed`; `atomic_outputs` | CUDA atomics on the same bits | `histogram` |
//! | mlx-lm 0.32.2's Gated DeltaNet kernels (`models/gated_delta.py`, all six), against `fast::gated_delta` | as above | `mlx_lm_gated_delta_*` |
//! | mlx-lm 0.32.2's Mamba-2 SSM step (`models/ssm.py`, `ssm_kernel`), against its composition | as above | `mlx_lm_ssm_*` |
//! | mlx-lm 0.32.2's `qk_norm` and `rms_norm_sigmoid_gate` (`kernels/`, the second through strides), against their compositions | as above | `mlx_lm_fused_*` |
//! | the rest of mlx-lm 0.32.2's Metal kernels, against their compositions: `expert_routing`, `norm_add_norm`, `norm_add`, `norm_add_norm_pre_norm`, `post_expert_norm_combine`, `qk_norm_rope` (`kernels/`); `wkv7_kernel` (`models/rwkv7.py`), `attnres_mix` (`models/kimi_k3.py`), `deepseek_v41_sinkhorn` (`models/deepseek_v41.py`), `bitlinear_matmul` (`models/bitlinear_layers.py`); `kl_forward`, `kl_backward`, `js_forward`, `js_backward` (`tuner/losses.py`, the derivatives against the composition's). A test reads the wheel and checks that these and the rows above are every kernel it builds. MLX's own wheel builds no Metal kernel from source. | as above | `metal_kernel_mlx_lm.rs` |
//!
//! Outside the table, textures, samplers, SIMD-group matrices, quad-groups, matrix and packed
//! types and Metal attributes (`[[buffer(0)]]`) give a failed array naming the construct and its
//! line; so do unclosed brackets, comments and literals, and assigned swizzles with a repeated
//! component. Other errors
//! come from NVRTC when the outputs are evaluated, at `<name>.source(LINE)` or
//! `<name>.header(LINE)`. Metal has no `double`: float64 arrays and template types are refused.

mod translate;

use std::panic::Location;

use crate::array::Array;
use crate::dtype::DType;
use crate::error::{Error, OpErrorKind, Result};

use super::cuda_kernel::{CudaKernel, KernelConfig, KernelSpec, TemplateArg};

/// The name failed calls report.
const OP: &str = "metal_kernel";

/// The header the CUDA backend ships with the Metal prelude.
pub const METAL_PRELUDE_HEADER: &str = "nuvec_metal_kernel.cuh";

/// A kernel written in Metal Shading Language (MLX's `mx.fast.metal_kernel`), run on CUDA.
///
/// ```
/// use nuvec::{DType, fast::{KernelConfig, MetalKernel, TemplateArg}, ops};
/// let kernel = MetalKernel::new(
///     "scale",
///     &["inp"],
///     &["out"],
///     "uint i = thread_position_in_grid.x;\nout[i] = static_cast<T>(inp[i] * N);",
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
pub struct MetalKernel {
    name: String,
    input_names: Vec<String>,
    output_names: Vec<String>,
    source: String,
    header: String,
    ensure_row_contiguous: bool,
    atomic_outputs: bool,
}

/// Thread attributes: name, Metal type, and the CUDA expression of its value.
const ATTRIBUTES: [(&str, &str, &str); 20] = [
    (
        "thread_position_in_grid",
        "uint3",
        "blockIdx.x * blockDim.x + threadIdx.x, blockIdx.y * blockDim.y + threadIdx.y, blockIdx.z * blockDim.z + threadIdx.z",
    ),
    ("thread_position_in_threadgroup", "uint3", "threadIdx.x, threadIdx.y, threadIdx.z"),
    ("threadgroup_position_in_grid", "uint3", "blockIdx.x, blockIdx.y, blockIdx.z"),
    ("threads_per_threadgroup", "uint3", "blockDim.x, blockDim.y, blockDim.z"),
    ("dispatch_threads_per_threadgroup", "uint3", "blockDim.x, blockDim.y, blockDim.z"),
    ("threadgroups_per_grid", "uint3", "gridDim.x, gridDim.y, gridDim.z"),
    ("grid_size", "uint3", "GRID"),
    ("threads_per_grid", "uint3", "GRID"),
    ("grid_origin", "uint3", "0u, 0u, 0u"),
    ("thread_index_in_threadgroup", "uint", "nv_mk_thread_index()"),
    ("thread_index_in_simdgroup", "uint", "nv_mk_thread_index() % 32u"),
    ("simdgroup_index_in_threadgroup", "uint", "nv_mk_thread_index() / 32u"),
    ("threads_per_simdgroup", "uint", "32u"),
    ("thread_execution_width", "uint", "32u"),
    ("simdgroups_per_threadgroup", "uint", "(blockDim.x * blockDim.y * blockDim.z + 31u) / 32u"),
    ("dispatch_simdgroups_per_threadgroup", "uint", "(blockDim.x * blockDim.y * blockDim.z + 31u) / 32u"),
    ("thread_index_in_quadgroup", "uint", "nv_mk_thread_index() % 4u"),
    ("quadgroup_index_in_threadgroup", "uint", "nv_mk_thread_index() / 4u"),
    ("quadgroups_per_threadgroup", "uint", "(blockDim.x * blockDim.y * blockDim.z + 3u) / 4u"),
    ("dispatch_quadgroups_per_threadgroup", "uint", "(blockDim.x * blockDim.y * blockDim.z + 3u) / 4u"),
];

impl MetalKernel {
    /// A kernel named `name` whose Metal body `source` reads `inputs` and writes `outputs`.
    pub fn new(
        name: impl Into<String>,
        inputs: &[impl AsRef<str>],
        outputs: &[impl AsRef<str>],
        source: impl Into<String>,
    ) -> Self {
        MetalKernel {
            name: name.into(),
            input_names: inputs.iter().map(|s| s.as_ref().to_string()).collect(),
            output_names: outputs.iter().map(|s| s.as_ref().to_string()).collect(),
            source: source.into(),
            header: String::new(),
            ensure_row_contiguous: true,
            atomic_outputs: false,
        }
    }

    /// Metal code placed before the kernel: helper functions, constants.
    pub fn header(mut self, header: impl Into<String>) -> Self {
        self.header = header.into();
        self
    }

    /// Whether inputs are copied to row-major order first (default `true`).
    pub fn ensure_row_contiguous(mut self, yes: bool) -> Self {
        self.ensure_row_contiguous = yes;
        self
    }

    /// Whether outputs are `device atomic<T>*` (for `atomic_fetch_add_explicit` and friends);
    /// they then start initialised, to `init_value` or else zero.
    pub fn atomic_outputs(mut self, yes: bool) -> Self {
        self.atomic_outputs = yes;
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

    /// The CUDA body and header a call with these dtypes runs (before the backend adds the
    /// signature), or the first construct that has no translation.
    #[track_caller]
    pub fn translate<S: AsRef<[i32]>>(
        &self,
        inputs: &[Array],
        outputs: &[(S, DType)],
        config: &KernelConfig,
    ) -> Result<(String, String)> {
        let at = |what: &str, f: translate::Failure| {
            self.invalid(format!("{} at line {} of the {what} (`{}.{what}:{}`)", f.message, f.line, self.name, f.line))
        };
        let body = translate::translate(&self.source).map_err(|f| at("source", f))?;
        let header = translate::translate(&self.header).map_err(|f| at("header", f))?;
        let dtypes = inputs.iter().map(|x| ("input", x.dtype())).chain(outputs.iter().map(|o| ("output", o.1)));
        let names = self.input_names.iter().chain(&self.output_names);
        for (name, (what, d)) in names.zip(dtypes) {
            if d == DType::F64 {
                return Err(self.invalid(format!("{what} `{name}` is float64, which Metal does not have")));
            }
        }
        for (name, arg) in &config.template {
            if *arg == TemplateArg::DType(DType::F64) {
                return Err(self.invalid(format!("template type `{name}` is float64, which Metal does not have")));
            }
        }

        let mut pre = String::new();
        for (name, ty, expr) in ATTRIBUTES {
            if super::cuda_kernel::mentions(&body, name) {
                let g = config.grid;
                let expr = expr.replace("GRID", &format!("{}u, {}u, {}u", g.0, g.1, g.2));
                let ty = if ty == "uint" { "uint".to_string() } else { format!("metal::{ty}") };
                pre.push_str(&format!("const {ty} {name}({expr}); "));
            }
        }
        // Metal launches exactly `grid` threads; CUDA launches whole blocks.
        let (g, t) = (config.grid, config.threadgroup);
        if g.0 % t.0.max(1) != 0 || g.1 % t.1.max(1) != 0 || g.2 % t.2.max(1) != 0 {
            pre.push_str(&format!(
                "if (blockIdx.x * blockDim.x + threadIdx.x >= {}u || blockIdx.y * blockDim.y + threadIdx.y >= {}u || \
                 blockIdx.z * blockDim.z + threadIdx.z >= {}u) return; ",
                g.0, g.1, g.2
            ));
        }
        let mut post = String::new();
        if self.atomic_outputs {
            // The outputs, as `atomic<T>*`, shadow the signature's `T*` in an inner block.
            let mut inner = String::new();
            for (name, (_, d)) in self.output_names.iter().zip(outputs) {
                let ty = match d {
                    DType::I32 => "int",
                    DType::U32 => "unsigned int",
                    DType::F32 => "float",
                    d => {
                        return Err(self.invalid(format!(
                            "output `{name}` is {d:?}; `atomic<T>` outputs are int32, uint32 or float32"
                        )));
                    }
                };
                pre.push_str(&format!(
                    "atomic<{ty}>* const nv_mk_atomic_{name} = reinterpret_cast<atomic<{ty}>*>({name}); "
                ));
                inner.push_str(&format!("atomic<{ty}>* {name} = nv_mk_atomic_{name}; "));
            }
            pre.push_str("{ ");
            pre.push_str(&inner);
            post.push_str("\n}");
        }
        let source = format!("{pre}\n#line 1 \"{}.source\"\n{body}{post}\n", self.name);
        let header = format!("#include \"{METAL_PRELUDE_HEADER}\"\n#line 1 \"{}.header\"\n{header}", self.name);
        Ok((source, header))
    }

    /// The [`CudaKernel`] a call with these arguments runs.
    #[track_caller]
    fn cuda<S: AsRef<[i32]>>(
        &self,
        inputs: &[Array],
        outputs: &[(S, DType)],
        config: &KernelConfig,
    ) -> Result<CudaKernel> {
        let (source, header) = self.translate(inputs, outputs, config)?;
        Ok(CudaKernel::new(&self.name, &self.input_names, &self.output_names, source)
            .header(header)
            .ensure_row_contiguous(self.ensure_row_contiguous)
            .atomic_outputs(self.atomic_outputs))
    }

    /// What this call would record (the translated kernel, for tools and for compiling it with
    /// the CUDA backend): validates and translates, without recording anything.
    #[track_caller]
    pub fn spec<S: AsRef<[i32]>>(
        &self,
        inputs: &[Array],
        outputs: &[(S, DType)],
        config: &KernelConfig,
    ) -> Result<KernelSpec> {
        // Counts first, so a wrong count is not reported as a dtype or translation error.
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
        let at = Location::caller();
        let cuda = self.cuda(inputs, outputs, config)?;
        // CudaKernel's validation, reported as this op's.
        cuda.spec(inputs, outputs, config).map_err(|e| match e {
            Error::Op { op: "cuda_kernel", kind, .. } => Error::Op { op: OP, at, kind },
            e => e,
        })
    }

    /// Records a call: one array per output name, of the given shapes and dtypes (row-major).
    ///
    /// Bad arguments and constructs outside the supported table give failed arrays naming
    /// `metal_kernel`, the construct and its line; on a device without CUDA the arrays fail
    /// with `UnsupportedDevice`. NVRTC's errors surface when the outputs are evaluated.
    #[track_caller]
    pub fn call<S: AsRef<[i32]>>(&self, inputs: &[Array], outputs: &[(S, DType)], config: &KernelConfig) -> Vec<Array> {
        super::cuda_kernel::record(OP, self.output_names.len(), self.spec(inputs, outputs, config), inputs)
    }
}
