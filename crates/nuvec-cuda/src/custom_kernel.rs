//! Custom kernels (`fast::CudaKernel`): generating a call's source from its `KernelSpec`
//! (once per distinct kernel, see [`source`]), compiling it once, filling outputs, and
//! launching with the parameters the generated signature declares.

mod source;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys;
use nuvec_core::fast::cuda_kernel::{KernelSpec, MAX_NDIM, TemplateArg};
use nuvec_core::fast::metal_kernel::METAL_PRELUDE_HEADER;
use nuvec_core::storage::{Operand, Output};
use nuvec_core::{DType, Error, Result, Scalar};

pub use source::{GeneratedKernel, InputParams, PRELUDE_HEADER};

use crate::driver::{Gpu, check};
use crate::launch::{Arg, allow_shared, launch};
use crate::operand::{alloc_out, internal, ptr_of, row_major};

/// The prelude every generated source includes.
pub const PRELUDE: &str = include_str!("../kernels/custom_kernel.cuh");

/// The prelude of translated Metal kernels (`fast::MetalKernel`), which includes [`PRELUDE`].
pub const METAL_PRELUDE: &str = include_str!("../kernels/metal_kernel.cuh");

/// The headers a generated source may include.
const PRELUDES: [(&str, &str); 2] = [(PRELUDE_HEADER, PRELUDE), (METAL_PRELUDE_HEADER, METAL_PRELUDE)];

/// Compiles a generated custom-kernel source for `arch` (e.g. `"sm_90"`) with NVRTC, without
/// any cache; works without a GPU. Errors carry NVRTC's log.
pub fn compile_custom_kernel(source: &str, key: &str, arch: &str) -> Result<Vec<u8>> {
    crate::compile::compile_cubin(source, key, arch, &PRELUDES)
}

/// The kernel a call runs, as the backend generates it (for tools, tests and compile checks
/// with [`compile_custom_kernel`]).
pub fn generate_custom_kernel(spec: &KernelSpec) -> GeneratedKernel {
    source::generate(spec)
}

/// What generation reads from a call: calls with equal keys have the same kernel.
#[derive(PartialEq, Eq, Hash)]
struct SourceKey {
    name: String,
    input_names: Vec<String>,
    output_names: Vec<String>,
    source: String,
    header: String,
    template: Vec<(String, TemplateArg)>,
    /// Each input's dtype and whether it is 0-d.
    inputs: Vec<(DType, bool)>,
    outputs: Vec<DType>,
}

/// The generated kernel of a call, generated once per distinct kernel.
fn generated(spec: &KernelSpec) -> Arc<GeneratedKernel> {
    static CACHE: OnceLock<Mutex<HashMap<SourceKey, Arc<GeneratedKernel>>>> = OnceLock::new();
    let key = SourceKey {
        name: spec.name.clone(),
        input_names: spec.input_names.clone(),
        output_names: spec.output_names.clone(),
        source: spec.source.clone(),
        header: spec.header.clone(),
        template: spec.template.clone(),
        inputs: spec.inputs.iter().map(|x| (x.dtype, x.shape.is_empty())).collect(),
        outputs: spec.outputs.iter().map(|o| o.dtype).collect(),
    };
    let mut cache = CACHE.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    cache.entry(key).or_insert_with(|| Arc::new(source::generate(spec))).clone()
}

/// Packs plain values into the 8-byte words `Arg::Bytes` holds.
fn words(bytes: &[u8]) -> Vec<u64> {
    let mut w = vec![0u64; bytes.len().div_ceil(8).max(1)];
    bytemuck::cast_slice_mut::<u64, u8>(&mut w)[..bytes.len()].copy_from_slice(bytes);
    w
}

/// Sets `n` elements of `dtype` at `ptr` to `value` (converted as `astype` would).
fn fill(gpu: &Gpu, ptr: sys::CUdeviceptr, n: usize, dtype: DType, value: f64) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let pattern = Scalar::Float(value).to_bytes(dtype);
    gpu.bind()?;
    // SAFETY: `ptr` starts a live allocation of `n` elements of `dtype` on this device; the
    // memsets are ordered on its stream.
    unsafe {
        match pattern.len() {
            _ if pattern.iter().all(|&b| b == 0) => {
                check(sys::cuMemsetD8Async(ptr, 0, n * pattern.len(), gpu.stream()), "cuMemsetD8Async")
            }
            1 => check(sys::cuMemsetD8Async(ptr, pattern[0], n, gpu.stream()), "cuMemsetD8Async"),
            2 => {
                let v = u16::from_ne_bytes([pattern[0], pattern[1]]);
                check(sys::cuMemsetD16Async(ptr, v, n, gpu.stream()), "cuMemsetD16Async")
            }
            4 => {
                let v = u32::from_ne_bytes([pattern[0], pattern[1], pattern[2], pattern[3]]);
                check(sys::cuMemsetD32Async(ptr, v, n, gpu.stream()), "cuMemsetD32Async")
            }
            size => {
                // No 8-byte memset: write one element, then double the filled prefix.
                gpu.upload(ptr, &pattern)?;
                let mut done = 1usize;
                while done < n {
                    let take = done.min(n - done);
                    gpu.copy_device(ptr + (done * size) as u64, ptr, take * size)?;
                    done += take;
                }
                Ok(())
            }
        }
    }
}

/// The value of a 0-d operand, read back to pass by value.
fn scalar_bytes(gpu: &Gpu, x: &Operand) -> Result<Vec<u8>> {
    let mut bytes = vec![0u8; x.dtype.size()];
    gpu.download(ptr_of(x)?, &mut bytes)?;
    Ok(bytes)
}

/// Runs one custom-kernel call.
pub(crate) fn eval(gpu: &Arc<Gpu>, spec: &KernelSpec, inputs: Vec<Operand>, outputs: &mut [Output]) -> Result<()> {
    let k = generated(spec);
    if spec.verbose {
        println!("{}", k.source);
    }
    if inputs.len() != k.inputs.len() || outputs.len() != spec.outputs.len() {
        return Err(internal(format!("{}: operand counts do not match the kernel", k.entry)));
    }
    let module = gpu.modules.get(gpu, &k.key, || k.source.clone(), &PRELUDES)?;
    let function = module.function(&k.entry)?;

    // Row-major copies are kept until the launch is queued; later frees are stream-ordered.
    let mut kept = Vec::with_capacity(inputs.len());
    let mut args = Vec::new();
    for (x, p) in inputs.into_iter().zip(&k.inputs) {
        if p.by_value {
            args.push(Arg::Bytes(words(&scalar_bytes(gpu, &x)?)));
            continue;
        }
        let x = if spec.ensure_row_contiguous { row_major(gpu, x)? } else { x };
        args.push(Arg::Ptr(ptr_of(&x)?));
        if p.shape {
            let mut shape = [0i32; MAX_NDIM];
            shape[..x.shape.len()].copy_from_slice(&x.shape);
            args.push(Arg::Bytes(words(bytemuck::cast_slice(&shape))));
        }
        if p.strides {
            let mut strides = [0i64; MAX_NDIM];
            for (s, &v) in strides.iter_mut().zip(&x.data.layout.strides) {
                *s = v as i64;
            }
            args.push(Arg::Bytes(words(bytemuck::cast_slice(&strides))));
        }
        if p.ndim {
            args.push(Arg::I32(x.shape.len() as i32));
        }
        kept.push(x);
    }
    for out in outputs.iter_mut() {
        let ptr = alloc_out(gpu, out)?;
        if let Some(v) = spec.init_value {
            fill(gpu, ptr, out.size(), out.dtype, v)?;
        }
        args.push(Arg::Ptr(ptr));
    }
    if spec.blocks.contains(&0) {
        return Ok(());
    }
    allow_shared(gpu, function, spec.shared_memory).map_err(|e| {
        Error::Backend(format!("custom kernel {}: {} bytes of shared memory: {e}", k.entry, spec.shared_memory))
    })?;
    let [bx, by, bz] = spec.blocks;
    let [tx, ty, tz] = spec.block;
    launch(gpu, function, (bx, by, bz), (tx, ty, tz), spec.shared_memory, args)
        .map_err(|e| Error::Backend(format!("custom kernel {}: {e}", k.entry)))?;
    drop(kept);
    Ok(())
}
