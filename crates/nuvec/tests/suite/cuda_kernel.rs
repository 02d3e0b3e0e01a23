//! Custom CUDA kernels (`fast::CudaKernel`).
//!
//! [`cases`] lists every kernel these tests run. Without a GPU, `cases_compile_with_nvrtc`
//! still compiles each generated source with NVRTC for sm_90 (CI sets `NUVEC_REQUIRE_NVRTC=1`,
//! so a source that does not compile fails there). The GPU tests run the same cases and compare
//! with values computed on the CPU; they skip without a GPU and fail under `NUVEC_REQUIRE_GPU=1`.

use nuvec::fast::{CudaKernel, KernelConfig, TemplateArg};
use nuvec::{Array, DType, Device, Error, OpErrorKind, ops, with_stream};

use crate::{custom_gpu as gpu, custom_nvrtc as nvrtc};

/// One kernel call: the kernel, its inputs, output shapes and dtypes, and the launch.
struct Case {
    kernel: CudaKernel,
    inputs: Vec<Array>,
    outputs: Vec<(Vec<i32>, DType)>,
    config: KernelConfig,
}

impl Case {
    fn call(&self) -> Vec<Array> {
        self.kernel.call(&self.inputs, &self.outputs, &self.config)
    }
}

fn config(grid: u32, threadgroup: u32, template: Vec<(&str, TemplateArg)>) -> KernelConfig {
    KernelConfig {
        grid: (grid, 1, 1),
        threadgroup: (threadgroup, 1, 1),
        template: template.into_iter().map(|(n, a)| (n.to_string(), a)).collect(),
        ..Default::default()
    }
}

/// Values in a spread of magnitudes and signs, never all equal.
fn wavy(n: i32, seed: f32) -> Vec<f32> {
    (0..n).map(|i| ((i as f32 * 0.7311 + seed).sin() * 3.0 * 64.0).round() / 64.0).collect()
}

const SCALE: &str = "uint i = threadIdx.x + blockIdx.x * blockDim.x;\nout[i] = static_cast<T>(inp[i] * N);";

fn scale_case() -> Case {
    Case {
        kernel: CudaKernel::new("scale", &["inp"], &["out"], SCALE),
        inputs: vec![ops::ones([1024], DType::F16)],
        outputs: vec![(vec![1024], DType::F16)],
        config: config(1024, 256, vec![("T", TemplateArg::DType(DType::F16)), ("N", TemplateArg::Int(3))]),
    }
}

/// Views read through `inp_shape`/`inp_strides`/`inp_ndim`, plus a 0-d input by value.
fn strided_case(x: Array) -> Case {
    let n = x.size() as u32;
    let body = "uint i = threadIdx.x + blockIdx.x * blockDim.x;\n\
                if (i >= SIZE) return;\n\
                out[i] = inp[elem_to_loc(i, inp_shape.data(), inp_strides.data(), inp_ndim)] * s + inp_ndim;";
    Case {
        kernel: CudaKernel::new("strided", &["inp", "s"], &["out"], body).ensure_row_contiguous(false),
        outputs: vec![(x.shape().to_vec(), DType::F32)],
        inputs: vec![x, Array::from(2.0f32)],
        config: config(n, 64, vec![("SIZE", TemplateArg::Int(n as i32))]),
    }
}

/// Strided views of a `[6, 7]` range: transposed, reversed and sliced, broadcast.
fn strided_inputs() -> Vec<Array> {
    let base = ops::arange(0, 42, 1).astype(DType::F32).reshape([6, 7]);
    vec![
        base.t(),
        base.slice(&[5, 1], &[-7, 7], &[-2, 3]),
        ops::arange(0, 5, 1).astype(DType::F32).reshape([5, 1]).broadcast_to([5, 4]),
        base.reshape([2, 3, 7]).transpose(&[2, 0, 1]),
    ]
}

const HIST: &str = "uint i = threadIdx.x + blockIdx.x * blockDim.x;\n\
                    if (i < N) {\n  atomicAdd(&hist[inp[i]], 1u);\n  atomicAdd(&total[0], 0.5f);\n}";

fn histogram_case(values: &[i32], bins: i32, init: Option<f64>) -> Case {
    let n = values.len() as u32;
    Case {
        kernel: CudaKernel::new("histogram", &["inp"], &["hist", "total"], HIST).atomic_outputs(true),
        inputs: vec![Array::from_slice(values, [values.len()])],
        outputs: vec![(vec![bins], DType::U32), (vec![1], DType::F32)],
        config: KernelConfig { init_value: init, ..config(n, 128, vec![("N", TemplateArg::Int(n as i32))]) },
    }
}

const AFFINE: &str = "uint i = threadIdx.x + blockIdx.x * blockDim.x;\n\
                      if (i < n) out[i] = NEGATE ? static_cast<T>(-inp[i] * M) : static_cast<T>(inp[i] * M + 1);";

fn affine_case(dtype: DType, negate: bool, m: i32, n: i32) -> Case {
    let x = Array::from_slice(&wavy(n, 0.3), [n as usize]).astype(dtype);
    Case {
        kernel: CudaKernel::new("affine", &["inp", "n"], &["out"], AFFINE),
        inputs: vec![x, Array::from(n as u32)],
        outputs: vec![(vec![n], dtype)],
        config: config(
            n as u32,
            32,
            vec![("T", TemplateArg::DType(dtype)), ("NEGATE", TemplateArg::Bool(negate)), ("M", TemplateArg::Int(m))],
        ),
    }
}

/// Sums of blocks of 256 through dynamic shared memory, and a warp-level sum check.
const BLOCK_SUM: &str = "extern __shared__ float buf[];\n\
                         uint t = threadIdx.x, i = blockIdx.x * blockDim.x + t;\n\
                         float v = i < n ? inp[i] : 0.0f;\n\
                         buf[t] = v;\n\
                         __syncthreads();\n\
                         for (uint s = blockDim.x / 2; s > 0; s >>= 1) {\n\
                           if (t < s) buf[t] += buf[t + s];\n\
                           __syncthreads();\n\
                         }\n\
                         if (t == 0) sums[blockIdx.x] = buf[0];\n\
                         float w = warp_sum(v);\n\
                         if (t % WARP_SIZE == 0) warps[i / WARP_SIZE] = w;";

fn block_sum_case(values: &[f32]) -> Case {
    let n = values.len() as u32;
    let blocks = n.div_ceil(256) as i32;
    Case {
        kernel: CudaKernel::new("block_sum", &["inp", "n"], &["sums", "warps"], BLOCK_SUM).shared_memory(256 * 4),
        inputs: vec![Array::from_slice(values, [values.len()]), Array::from(n)],
        outputs: vec![(vec![blocks], DType::F32), (vec![blocks * 8], DType::F32)],
        config: config(blocks as u32 * 256, 256, vec![]),
    }
}

/// Reverses chunks of 16384 floats through 64 KiB of shared memory (above the 48 KiB default).
const REVERSE: &str = "extern __shared__ float buf[];\n\
                       const float* src = inp + blockIdx.x * CHUNK;\n\
                       for (uint j = threadIdx.x; j < CHUNK; j += blockDim.x) buf[j] = src[j];\n\
                       __syncthreads();\n\
                       for (uint j = threadIdx.x; j < CHUNK; j += blockDim.x) out[blockIdx.x * CHUNK + j] = buf[CHUNK - 1 - j];";

fn reverse_case(chunks: i32) -> Case {
    let chunk = 16384;
    let n = chunks * chunk;
    Case {
        kernel: CudaKernel::new("reverse_chunks", &["inp"], &["out"], REVERSE).shared_memory(chunk as u32 * 4),
        inputs: vec![Array::from_slice(&wavy(n, 1.0), [n as usize])],
        outputs: vec![(vec![n], DType::F32)],
        config: config(chunks as u32 * 256, 256, vec![("CHUNK", TemplateArg::Int(chunk))]),
    }
}

/// A device function from the header, bf16 in and out.
fn header_case() -> Case {
    let header = "__device__ float cube(float v) {\n  return v * v * v;\n}\n";
    let body =
        "uint i = threadIdx.x;\nif (i < 16) out[i] = static_cast<bfloat16_t>(cube(static_cast<float>(inp[i])) - 1);";
    Case {
        kernel: CudaKernel::new("cube", &["inp"], &["out"], body).header(header),
        inputs: vec![Array::from_slice(&wavy(16, 2.0), [16]).astype(DType::BF16)],
        outputs: vec![(vec![16], DType::BF16)],
        config: config(32, 32, vec![]),
    }
}

/// `y = sin(x) * x` and its vjp `g * (cos(x) * x + sin(x))`, in f64.
const SINX: &str = "uint i = threadIdx.x + blockIdx.x * blockDim.x;\nif (i < n) y[i] = sin(x[i]) * x[i];";
const SINX_VJP: &str =
    "uint i = threadIdx.x + blockIdx.x * blockDim.x;\nif (i < n) dx[i] = g[i] * (cos(x[i]) * x[i] + sin(x[i]));";

fn sinx_kernels() -> (CudaKernel, CudaKernel) {
    (
        CudaKernel::new("sinx", &["x", "n"], &["y"], SINX),
        CudaKernel::new("sinx_vjp", &["x", "g", "n"], &["dx"], SINX_VJP),
    )
}

fn run_sinx(k: &CudaKernel, inputs: &[Array]) -> Array {
    let n = inputs[0].size() as u32;
    let shape = inputs[0].shape().to_vec();
    let mut all = inputs.to_vec();
    all.push(Array::from(n));
    k.call(&all, &[(shape, DType::F64)], &config(n, 64, vec![])).remove(0)
}

/// A body with an error on its third line.
fn broken_case() -> Case {
    let body = "uint i = threadIdx.x;\nif (i < 4)\n  out[i] = inp[i] + undefined_thing;";
    Case {
        kernel: CudaKernel::new("broken", &["inp"], &["out"], body),
        inputs: vec![ops::ones([4], DType::F32)],
        outputs: vec![(vec![4], DType::F32)],
        config: config(4, 4, vec![]),
    }
}

/// The kernel of `gpu.rs`'s `custom_kernel_agrees_with_cpu_ops` (keep the two bodies equal).
fn fma_view_case(d: DType) -> Case {
    let body = "uint i = threadIdx.x + blockIdx.x * blockDim.x;\n\
                if (i >= SIZE) return;\n\
                A a = static_cast<A>(x[elem_to_loc(i, x_shape, x_strides, x_ndim)]);\n\
                y[i] = static_cast<T>(a * static_cast<A>(w[i]) + static_cast<A>(c));";
    let acc = if d == DType::F64 { DType::F64 } else { DType::F32 };
    let x = ops::ones([4, 8], d).slice(&[0, 0], &[4, 8], &[1, 2]);
    Case {
        kernel: CudaKernel::new("fma_view", &["x", "w", "c"], &["y"], body).ensure_row_contiguous(false),
        inputs: vec![x, ops::ones([4, 4], d), Array::from(0.5f32).astype(d)],
        outputs: vec![(vec![4, 4], d)],
        config: config(
            16,
            32,
            vec![("T", TemplateArg::DType(d)), ("A", TemplateArg::DType(acc)), ("SIZE", TemplateArg::Int(16))],
        ),
    }
}

/// Every kernel these tests run that must compile.
fn cases() -> Vec<Case> {
    let mut v = vec![scale_case()];
    v.extend(strided_inputs().into_iter().map(strided_case));
    v.push(histogram_case(&[0, 1, 2, 3], 4, None));
    for (d, neg, m) in [
        (DType::F32, false, 3),
        (DType::F32, true, 3),
        (DType::F64, false, -2),
        (DType::I32, true, 5),
        (DType::F16, false, 2),
    ] {
        v.push(affine_case(d, neg, m, 100));
    }
    v.push(block_sum_case(&wavy(600, 0.0)));
    v.push(reverse_case(2));
    v.push(header_case());
    v.extend([DType::F32, DType::F16, DType::BF16, DType::F64].map(fma_view_case));
    let (f, df) = sinx_kernels();
    let x = Array::from_slice(&[0.5f64, -1.0], [2]);
    for (k, inputs) in [(f, vec![x.clone()]), (df, vec![x.clone(), x])] {
        let n = inputs[0].size() as u32;
        let mut all = inputs;
        all.push(Array::from(n));
        v.push(Case { kernel: k, inputs: all, outputs: vec![(vec![2], DType::F64)], config: config(n, 64, vec![]) });
    }
    v
}

// ---- without a GPU --------------------------------------------------------------------------

#[test]
fn cases_compile_with_nvrtc() {
    if !nvrtc() {
        return;
    }
    let mut failures = Vec::new();
    let all = cases();
    for c in &all {
        let g = nuvec::cuda::generate_custom_kernel(&c.kernel.spec(&c.inputs, &c.outputs, &c.config).unwrap());
        if let Err(e) = nuvec::cuda::compile_custom_kernel(&g.source, &g.key, "sm_90") {
            failures.push(format!("{}:\n{e}\n{}", g.entry, g.source));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} kernels do not compile:\n{}",
        failures.len(),
        all.len(),
        failures.join("\n")
    );
}

#[test]
fn compile_errors_point_at_the_body_line() {
    if !nvrtc() {
        return;
    }
    let c = broken_case();
    let g = nuvec::cuda::generate_custom_kernel(&c.kernel.spec(&c.inputs, &c.outputs, &c.config).unwrap());
    let err = nuvec::cuda::compile_custom_kernel(&g.source, &g.key, "sm_90").unwrap_err().to_string();
    assert!(err.contains("broken.source(3)") && err.contains("undefined_thing"), "{err}");
    // An error in the header is reported at the header's own line.
    let k = CudaKernel::new("hdr", &["inp"], &["out"], "out[0] = f(inp[0]);")
        .header("// helpers\n__device__ float f(float v) { return v + nope; }\n");
    let g = nuvec::cuda::generate_custom_kernel(&k.spec(&c.inputs, &c.outputs, &c.config).unwrap());
    let err = nuvec::cuda::compile_custom_kernel(&g.source, &g.key, "sm_90").unwrap_err().to_string();
    assert!(err.contains("hdr.header(2)") && err.contains("nope"), "{err}");
}

#[test]
fn generated_scale_signature() {
    let c = scale_case();
    let g = nuvec::cuda::generate_custom_kernel(&c.kernel.spec(&c.inputs, &c.outputs, &c.config).unwrap());
    assert_eq!(g.entry, "custom_kernel_scale_float16_t_3");
    let want = "extern \"C\" __global__ void custom_kernel_scale_float16_t_3(\n    const __half* __restrict__ inp,\n    __half* out) {\n  \
                using T = __half;\n  constexpr int N = 3;\n#line 1 \"scale.source\"\n";
    assert!(g.source.contains(want), "{}", g.source);
    assert!(g.source.contains(SCALE));
    // The strided case passes shape, strides and ndim, and the 0-d `s` by value.
    let c = strided_case(strided_inputs().remove(0));
    let g = nuvec::cuda::generate_custom_kernel(&c.kernel.spec(&c.inputs, &c.outputs, &c.config).unwrap());
    let want = "const float* __restrict__ inp,\n    const __grid_constant__ Shape inp_shape,\n    \
                const __grid_constant__ Strides inp_strides,\n    const int inp_ndim,\n    const float s,\n    float* out)";
    assert!(g.source.contains(want), "{}", g.source);
}

#[test]
fn template_arguments_change_entry_and_key() {
    let a = affine_case(DType::F32, false, 3, 8);
    let b = affine_case(DType::F32, true, 3, 8);
    let c = affine_case(DType::F64, false, 3, 8);
    let generate =
        |c: &Case| nuvec::cuda::generate_custom_kernel(&c.kernel.spec(&c.inputs, &c.outputs, &c.config).unwrap());
    let (ga, gb, gc) = (generate(&a), generate(&b), generate(&c));
    assert_eq!(ga.entry, "custom_kernel_affine_float_f_3");
    assert_eq!(gb.entry, "custom_kernel_affine_float_t_3");
    assert_eq!(gc.entry, "custom_kernel_affine_double_f_3");
    assert!(ga.key != gb.key && ga.key != gc.key);
    // Same call, same source and key (what the compile cache is keyed on).
    assert_eq!(generate(&affine_case(DType::F32, false, 3, 50)).key, ga.key);
}

#[test]
fn bad_arguments_give_failed_arrays_naming_the_argument() {
    let x = ops::ones([4], DType::F32);
    let k = CudaKernel::new("k", &["inp"], &["out"], "out[0] = inp[0];");
    let out = [(vec![4], DType::F32)];
    let cfg = config(4, 4, vec![]);
    let check = |arrays: Vec<Array>, n: usize, needle: &str| {
        assert_eq!(arrays.len(), n);
        for a in arrays {
            let e = a.eval().unwrap_err();
            assert_eq!(e.op_name(), Some("cuda_kernel"), "{e}");
            assert!(e.to_string().contains(needle), "`{needle}` not in: {e}");
            // The location is the caller's (this file).
            assert!(e.location().unwrap().file().ends_with("cuda_kernel.rs"), "{e}");
        }
    };
    check(k.call(&[], &out, &cfg), 1, "inputs: expected 1 arrays, got 0");
    check(
        k.call(std::slice::from_ref(&x), &[(vec![4], DType::F32), (vec![4], DType::F32)], &cfg),
        1,
        "outputs: expected 1",
    );
    check(k.call(std::slice::from_ref(&x), &out, &config(4, 2048, vec![])), 1, "threadgroup");
    check(
        k.call(std::slice::from_ref(&x), &out, &KernelConfig { threadgroup: (0, 1, 1), ..cfg.clone() }),
        1,
        "threadgroup",
    );
    check(k.call(std::slice::from_ref(&x), &[(vec![-1], DType::F32)], &cfg), 1, "output `out` has an invalid shape");
    check(CudaKernel::new("a-b", &["inp"], &["out"], "").call(std::slice::from_ref(&x), &out, &cfg), 1, "C identifier");
    check(CudaKernel::new("k", &["inp"], &["inp"], "").call(std::slice::from_ref(&x), &out, &cfg), 1, "used twice");
    check(
        CudaKernel::new("k", &["inp"], &[] as &[&str], "").call(std::slice::from_ref(&x), &out, &cfg),
        1,
        "output_names",
    );
    let two = CudaKernel::new("k", &["inp"], &["a", "b"], "");
    check(two.call(std::slice::from_ref(&x), &out, &cfg), 2, "outputs: expected 2");
    let tpl = config(4, 4, vec![("1N", TemplateArg::Int(1))]);
    check(k.call(std::slice::from_ref(&x), &out, &tpl), 1, "`1N`");
    // A failed input propagates its own error.
    let bad = x.reshape([3]);
    let e = k.call(&[bad], &out, &cfg).remove(0).eval().unwrap_err();
    assert_eq!(e.op_name(), Some("reshape"));
}

#[test]
fn the_cpu_reports_an_unsupported_device() {
    let c = scale_case();
    let outs = with_stream(Device::cpu(), || c.call());
    let e = outs[0].eval().unwrap_err();
    assert_eq!(e.op_name(), Some("cuda_kernel"), "{e}");
    assert_eq!(e.kind(), Some(&OpErrorKind::UnsupportedDevice(Device::cpu())), "{e}");
    assert!(e.to_string().contains("CUDA"), "{e}");
    if !nuvec::cuda::is_available() {
        // On the default device of a machine without a GPU too.
        let e = c.call()[0].eval().unwrap_err();
        assert!(matches!(e.kind(), Some(OpErrorKind::UnsupportedDevice(_))), "{e}");
        let e = with_stream(Device::gpu(0), || c.call())[0].eval().unwrap_err();
        assert_eq!(e.kind(), Some(&OpErrorKind::UnsupportedDevice(Device::gpu(0))), "{e}");
    }
}

// ---- on the GPU -----------------------------------------------------------------------------

#[test]
fn scale_example() {
    if !gpu() {
        return;
    }
    let out = scale_case().call().remove(0);
    assert_eq!(out.dtype(), DType::F16);
    assert_eq!(out.shape(), &[1024]);
    assert_eq!(out.astype(DType::F32).sum(..).item::<f32>().unwrap(), 3072.0);
    assert!(out.astype(DType::F32).to_vec::<f32>().unwrap().iter().all(|&v| v == 3.0));
}

#[test]
fn strided_inputs_use_shape_strides_and_ndim() {
    if !gpu() {
        return;
    }
    for x in strided_inputs() {
        let want: Vec<f32> =
            x.contiguous().to_vec::<f32>().unwrap().iter().map(|v| v * 2.0 + x.ndim() as f32).collect();
        let shape = x.shape().to_vec();
        let out = strided_case(x).call().remove(0);
        assert_eq!(out.shape(), &shape[..]);
        assert_eq!(out.to_vec::<f32>().unwrap(), want, "shape {shape:?}");
    }
    // With row-contiguous copies (the default) the same body sees row-major strides.
    let x = strided_inputs().remove(0);
    let want: Vec<f32> = x.contiguous().to_vec::<f32>().unwrap().iter().map(|v| v * 2.0 + 2.0).collect();
    let mut c = strided_case(x);
    c.kernel = c.kernel.ensure_row_contiguous(true);
    assert_eq!(c.call().remove(0).to_vec::<f32>().unwrap(), want);
}

#[test]
fn atomic_histogram_with_init_value() {
    if !gpu() {
        return;
    }
    let values: Vec<i32> = (0..5000).map(|i| ((i * 7919) % 13 + (i % 3)) % 10).collect();
    let mut want = [0u32; 10];
    for &v in &values {
        want[v as usize] += 1;
    }
    for init in [None, Some(0.0), Some(5.0)] {
        let outs = histogram_case(&values, 10, init).call();
        let base = init.unwrap_or(0.0);
        let hist = outs[0].to_vec::<u32>().unwrap();
        assert_eq!(hist, want.iter().map(|w| w + base as u32).collect::<Vec<_>>(), "init {init:?}");
        assert_eq!(outs[1].item::<f32>().unwrap(), base as f32 + 0.5 * values.len() as f32);
    }
}

#[test]
fn template_instantiations() {
    if !gpu() {
        return;
    }
    for (d, neg, m) in [
        (DType::F32, false, 3),
        (DType::F32, true, 3),
        (DType::F64, false, -2),
        (DType::I32, true, 5),
        (DType::F16, false, 2),
    ] {
        let n = 100;
        let c = affine_case(d, neg, m, n);
        let x = c.inputs[0].astype(DType::F64).to_vec::<f64>().unwrap();
        let out = c.call().remove(0);
        assert_eq!(out.dtype(), d);
        let got = out.astype(DType::F64).to_vec::<f64>().unwrap();
        for (i, (&xi, &g)) in x.iter().zip(&got).enumerate() {
            let w = if neg { -xi * m as f64 } else { xi * m as f64 + 1.0 };
            // Round the expectation through the output dtype.
            let w = Array::from(w).astype(d).astype(DType::F64).item::<f64>().unwrap();
            assert!((g - w).abs() <= 1e-3 * w.abs().max(1.0), "{d:?} neg {neg} m {m} [{i}]: {g} vs {w}");
        }
    }
}

#[test]
fn dynamic_shared_memory() {
    if !gpu() {
        return;
    }
    let values = wavy(600, 0.0);
    let outs = block_sum_case(&values).call();
    let sums = outs[0].to_vec::<f32>().unwrap();
    for (b, s) in sums.iter().enumerate() {
        let want: f32 = values.iter().skip(b * 256).take(256).sum();
        assert!((s - want).abs() < 1e-3, "block {b}: {s} vs {want}");
    }
    let warps = outs[1].to_vec::<f32>().unwrap();
    for (w, s) in warps.iter().enumerate() {
        let want: f32 = values.iter().skip(w * 32).take(32).sum();
        assert!((s - want).abs() < 1e-3, "warp {w}: {s} vs {want}");
    }
    // Above the 48 KiB default: the kernel opts in.
    let c = reverse_case(3);
    let x = c.inputs[0].to_vec::<f32>().unwrap();
    let out = c.call().remove(0).to_vec::<f32>().unwrap();
    for (i, v) in out.iter().enumerate() {
        let (chunk, j) = (i / 16384, i % 16384);
        assert_eq!(*v, x[chunk * 16384 + 16383 - j], "at {i}");
    }
}

#[test]
fn header_helpers() {
    if !gpu() {
        return;
    }
    let c = header_case();
    let x = c.inputs[0].astype(DType::F32).to_vec::<f32>().unwrap();
    let out = c.call().remove(0);
    assert_eq!(out.dtype(), DType::BF16);
    let got = out.astype(DType::F32).to_vec::<f32>().unwrap();
    for (i, (&xi, &g)) in x.iter().zip(&got).enumerate() {
        let want = xi * xi * xi - 1.0;
        // One bf16 rounding (8 significant bits); the device may fuse the multiply-add.
        assert!((g - want).abs() <= want.abs() / 128.0 + 1e-6, "[{i}] cube({xi}) - 1: {g} vs {want}");
    }
}

#[test]
fn compile_errors_surface_as_failed_arrays() {
    if !gpu() {
        return;
    }
    let out = broken_case().call().remove(0);
    let e = out.eval().unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("broken.source(3)") && msg.contains("undefined_thing"), "{msg}");
    // Anything computed from it fails with the same error.
    assert_eq!((&out + 1.0).eval().unwrap_err(), e);
}

#[test]
fn a_second_call_compiles_nothing() {
    if !gpu() {
        return;
    }
    // A source of its own (a unique constant), so no other test shares its module.
    let unique = std::process::id() as i32
        ^ (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos() as i32
            & 0x7fff_ffff);
    let c = |n: i32| Case {
        kernel: CudaKernel::new(
            "cached",
            &["inp"],
            &["out"],
            "uint i = threadIdx.x;\nif (i < 8) out[i] = inp[i] + (TAG != 0 ? 1 : 1);",
        ),
        inputs: vec![ops::full([8], n as f32)],
        outputs: vec![(vec![8], DType::F32)],
        config: config(8, 8, vec![("TAG", TemplateArg::Int(unique))]),
    };
    let first = c(1);
    let key =
        nuvec::cuda::generate_custom_kernel(&first.kernel.spec(&first.inputs, &first.outputs, &first.config).unwrap())
            .key;
    assert_eq!(nuvec::cuda::builds(&key), nuvec::cuda::BuildCounts::default());
    assert_eq!(first.call()[0].to_vec::<f32>().unwrap(), vec![2.0; 8]);
    let after_first = nuvec::cuda::builds(&key);
    assert_eq!(after_first.loaded, 1);
    assert!(after_first.compiled <= 1, "{after_first:?}");
    // Compiled unless the on-disk cache already had it.
    if std::env::var("NUVEC_KERNEL_CACHE").as_deref() == Ok("0") {
        assert_eq!(after_first.compiled, 1);
    }
    for n in 2..5 {
        assert_eq!(c(n).call()[0].to_vec::<f32>().unwrap(), vec![n as f32 + 1.0; 8]);
    }
    assert_eq!(nuvec::cuda::builds(&key), after_first, "later calls reuse the loaded module");
}

#[test]
fn gradients_through_custom_function() {
    if !gpu() {
        return;
    }
    use nuvec::transforms::{custom_function, grad};
    let (fwd, bwd) = sinx_kernels();
    let (fwd2, bwd2) = (fwd.clone(), bwd.clone());
    let f = custom_function(move |x: &Array| run_sinx(&fwd2, std::slice::from_ref(x)))
        .with_vjp(move |x: &Array, _y: &Array, g: &Array| Ok(run_sinx(&bwd2, &[x.clone(), g.clone()])));
    let xs = [0.3f64, -1.2, 2.0, 0.0, 4.5, -3.3];
    let x = Array::from_slice(&xs, [xs.len()]);
    let weights = Array::from_slice(&[1.0f64, -2.0, 0.5, 3.0, 1.5, -1.0], [xs.len()]);
    let w = weights.clone();
    let loss = move |x: &Array| f.call(x).map(|y| (y * &w).sum(..));
    let g = grad(loss)(&x).unwrap().to_vec::<f64>().unwrap();
    // Central differences of the forward kernel itself.
    let h = 1e-6;
    let wv = weights.to_vec::<f64>().unwrap();
    for i in 0..xs.len() {
        let at = |d: f64| {
            let mut v = xs.to_vec();
            v[i] += d;
            let y = run_sinx(&fwd, &[Array::from_slice(&v, [v.len()])]).to_vec::<f64>().unwrap();
            y.iter().zip(&wv).map(|(a, b)| a * b).sum::<f64>()
        };
        let fd = (at(h) - at(-h)) / (2.0 * h);
        assert!((g[i] - fd).abs() < 1e-6 * fd.abs().max(1.0), "d/dx[{i}]: {} vs {fd}", g[i]);
    }
    // Without a rule, transforming the kernel is an error that says what to do.
    let raw = grad(move |x: &Array| Ok::<_, Error>(run_sinx(&fwd, std::slice::from_ref(x)).sum(..)));
    let e = raw(&x).and_then(|g| g.eval().map(|_| g)).unwrap_err();
    assert!(e.to_string().contains("custom_function"), "{e}");
}
