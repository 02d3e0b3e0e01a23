//! Metal kernels on CUDA (`fast::MetalKernel`).
//!
//! [`cases`] lists every kernel these tests run, one or more per row of the supported-feature
//! table in `nuvec_core::fast::metal_kernel`. Without a GPU, `cases_compile_with_nvrtc`
//! translates each and compiles it with NVRTC for sm_90 (CI sets `NUVEC_REQUIRE_NVRTC=1`); the
//! GPU tests run them against values computed on the CPU, skip without a GPU and fail under
//! `NUVEC_REQUIRE_GPU=1`. mlx-lm's own Gated DeltaNet kernels are read from the mlx-lm 0.32.2
//! wheel at test time (fetched once with pip, checked by sha256, cached; never committed).

use std::path::PathBuf;

use nuvec::fast::{KernelConfig, MetalKernel, TemplateArg};
use nuvec::{Array, DType, Device, OpErrorKind, fast, ops, with_stream};
use serde_json::Value;

use crate::{custom_gpu as gpu, custom_nvrtc as nvrtc};

/// One kernel call: the kernel, its inputs, output shapes and dtypes, and the launch.
pub(crate) struct Case {
    pub(crate) kernel: MetalKernel,
    pub(crate) inputs: Vec<Array>,
    pub(crate) outputs: Vec<(Vec<i32>, DType)>,
    pub(crate) config: KernelConfig,
}

impl Case {
    pub(crate) fn call(&self) -> Vec<Array> {
        self.kernel.call(&self.inputs, &self.outputs, &self.config)
    }
    pub(crate) fn f32s(&self) -> Vec<Vec<f32>> {
        self.call().iter().map(|o| o.astype(DType::F32).to_vec::<f32>().unwrap()).collect()
    }
}

pub(crate) fn config(
    grid: (u32, u32, u32),
    threadgroup: (u32, u32, u32),
    template: Vec<(&str, TemplateArg)>,
) -> KernelConfig {
    KernelConfig {
        grid,
        threadgroup,
        template: template.into_iter().map(|(n, a)| (n.to_string(), a)).collect(),
        ..Default::default()
    }
}

/// Values in a spread of magnitudes and signs, never all equal.
pub(crate) fn wavy(n: usize, seed: f32) -> Vec<f32> {
    (0..n).map(|i| ((i as f32 * 0.7311 + seed).sin() * 3.0 * 64.0).round() / 64.0).collect()
}

pub(crate) fn floats(v: &[f32]) -> Array {
    Array::from_slice(v, [v.len()])
}

/// The issue's example.
const SCALE: &str = "uint i = thread_position_in_grid.x;\nout[i] = static_cast<T>(inp[i] * N);";

fn scale_f16() -> Case {
    Case {
        kernel: MetalKernel::new("scale", &["inp"], &["out"], SCALE),
        inputs: vec![ops::ones([1024], DType::F16)],
        outputs: vec![(vec![1024], DType::F16)],
        config: config((1024, 1, 1), (256, 1, 1), vec![("T", DType::F16.into()), ("N", 3.into())]),
    }
}

/// Thread attributes, on a grid that is not a multiple of the threadgroup (extra threads must
/// not run: the output starts at 7 and only the grid's threads write).
const ATTRS: &str = "uint i = thread_position_in_grid.x + grid_size.x * thread_position_in_grid.y;\n\
                     out[i * 4 + 0] = thread_position_in_threadgroup.x + 1000 * threadgroup_position_in_grid.x;\n\
                     out[i * 4 + 1] = threads_per_threadgroup.x * 1000 + threadgroups_per_grid.x * 10 + threadgroups_per_grid.y;\n\
                     out[i * 4 + 2] = thread_index_in_simdgroup + 100 * simdgroup_index_in_threadgroup;\n\
                     out[i * 4 + 3] = threads_per_simdgroup + thread_index_in_threadgroup * 100 + simdgroups_per_threadgroup * 100000;";

fn attributes() -> Case {
    Case {
        kernel: MetalKernel::new("attrs", &[] as &[&str], &["out"], ATTRS),
        inputs: vec![],
        outputs: vec![(vec![100 * 2 * 4 + 4], DType::U32)],
        config: KernelConfig { init_value: Some(7.0), ..config((100, 2, 1), (64, 1, 1), vec![]) },
    }
}

fn attributes_want() -> Vec<u32> {
    let mut want = vec![7u32; 100 * 2 * 4 + 4];
    for y in 0..2u32 {
        for x in 0..100u32 {
            let i = (x + 100 * y) as usize;
            let (t, b) = (x % 64, x / 64);
            want[i * 4] = t + 1000 * b;
            want[i * 4 + 1] = 64 * 1000 + 2 * 10 + 2;
            want[i * 4 + 2] = t % 32 + 100 * (t / 32);
            want[i * 4 + 3] = 32 + t * 100 + 2 * 100000;
        }
    }
    want
}

/// `name_shape`, `name_strides`, `name_ndim` of a transposed view, and a 0-d input.
const STRIDED: &str = "uint i = thread_position_in_grid.x;\n\
                       out[i] = inp[elem_to_loc(i, inp_shape, inp_strides, inp_ndim)] * s + inp_shape[0];";

fn strided() -> Case {
    let x = ops::arange(0, 42, 1).astype(DType::F32).reshape([6, 7]).t();
    Case {
        kernel: MetalKernel::new("strided", &["inp", "s"], &["out"], STRIDED).ensure_row_contiguous(false),
        inputs: vec![x, Array::from(2.0f32)],
        outputs: vec![(vec![7, 6], DType::F32)],
        config: config((42, 1, 1), (42, 1, 1), vec![]),
    }
}

/// A tree sum in threadgroup memory.
const TG_SUM: &str = "threadgroup float buf[64];\n\
                      uint t = thread_position_in_threadgroup.x;\n\
                      buf[t] = inp[thread_position_in_grid.x];\n\
                      threadgroup_barrier(mem_flags::mem_threadgroup);\n\
                      for (uint s = 32; s > 0; s >>= 1) {\n\
                        if (t < s) buf[t] += buf[t + s];\n\
                        threadgroup_barrier(mem_flags::mem_threadgroup);\n\
                      }\n\
                      if (t == 0) out[threadgroup_position_in_grid.x] = buf[0];";

fn threadgroup_sum() -> Case {
    Case {
        kernel: MetalKernel::new("tg_sum", &["inp"], &["out"], TG_SUM),
        inputs: vec![floats(&wavy(256, 0.5))],
        outputs: vec![(vec![4], DType::F32)],
        config: config((256, 1, 1), (64, 1, 1), vec![]),
    }
}

/// SIMD-group reductions, shuffles and broadcasts, one output row per function.
const SIMD: &str = "uint i = thread_position_in_grid.x;\n\
                    float v = inp[i];\n\
                    out[i] = simd_sum(v);\n\
                    out[64 + i] = simd_max(v);\n\
                    out[128 + i] = metal::simd_min(v);\n\
                    out[192 + i] = simd_shuffle_xor(v, 3);\n\
                    out[256 + i] = simd_shuffle_down(v, 1);\n\
                    out[320 + i] = simd_broadcast(v, 5);\n\
                    out[384 + i] = simd_shuffle(v, thread_index_in_simdgroup ^ 1);\n\
                    simdgroup_barrier(mem_flags::mem_none);\n\
                    out[448 + i] = simd_any(v > 2.9f) ? 1.0f : 0.0f;";

fn simd_reductions() -> Case {
    Case {
        kernel: MetalKernel::new("simd", &["inp"], &["out"], SIMD),
        inputs: vec![floats(&wavy(64, 1.5))],
        outputs: vec![(vec![512], DType::F32)],
        config: config((64, 1, 1), (64, 1, 1), vec![]),
    }
}

fn simd_want(x: &[f32]) -> Vec<f32> {
    let mut want = vec![0f32; 512];
    for i in 0..64 {
        let w = &x[i / 32 * 32..i / 32 * 32 + 32];
        let l = i % 32;
        want[i] = w.iter().sum();
        want[64 + i] = w.iter().cloned().fold(f32::MIN, f32::max);
        want[128 + i] = w.iter().cloned().fold(f32::MAX, f32::min);
        want[192 + i] = w[l ^ 3];
        want[256 + i] = if l + 1 < 32 { w[l + 1] } else { w[l] };
        want[320 + i] = w[5];
        want[384 + i] = w[l ^ 1];
        want[448 + i] = if w.iter().any(|&v| v > 2.9) { 1.0 } else { 0.0 };
    }
    want
}

/// Prefix scans over the lanes.
const SCANS: &str = "uint i = thread_position_in_grid.x;\n\
                     out[i] = simd_prefix_inclusive_sum(inp[i]);\n\
                     out[32 + i] = simd_prefix_exclusive_sum(inp[i]);";

fn simd_scans() -> Case {
    let x: Vec<i32> = (0..32).map(|i| (i * 7) % 11 - 3).collect();
    Case {
        kernel: MetalKernel::new("scans", &["inp"], &["out"], SCANS),
        inputs: vec![Array::from_slice(&x, [32])],
        outputs: vec![(vec![64], DType::I32)],
        config: config((32, 1, 1), (32, 1, 1), vec![]),
    }
}

/// Vector types: constructors, arithmetic, swizzles, conversions, dot and length.
const VECTORS: &str = "uint i = thread_position_in_grid.x;\n\
                       const device float4* p = (const device float4*)inp;\n\
                       float4 a = p[i];\n\
                       float4 b = a * 2.0f + float4(1.0f);\n\
                       float2 xy = b.xy;\n\
                       float3 c = float3(xy, b.w) - a.xyz;\n\
                       out[i] = dot(b, a) + xy.y + length(float2(3.0f, 4.0f)) + c[2];\n\
                       half4 h = half4(b);\n\
                       uint3 u = uint3(1, 2, 3);\n\
                       out_h[i] = h.w + half(u.z);";

fn vectors() -> Case {
    Case {
        kernel: MetalKernel::new("vectors", &["inp"], &["out", "out_h"], VECTORS),
        inputs: vec![floats(&wavy(64, 2.5))],
        outputs: vec![(vec![16], DType::F32), (vec![16], DType::F16)],
        config: config((16, 1, 1), (16, 1, 1), vec![]),
    }
}

fn vectors_want(x: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let mut out = vec![];
    let mut out_h = vec![];
    for a in x.chunks(4) {
        let b: Vec<f32> = a.iter().map(|v| v * 2.0 + 1.0).collect();
        let dot: f32 = a.iter().zip(&b).map(|(a, b)| a * b).sum();
        out.push(dot + b[1] + 5.0 + (b[3] - a[2]));
        out_h.push(Array::from(b[3]).astype(DType::F16).astype(DType::F32).item::<f32>().unwrap() + 3.0);
    }
    (out, out_h)
}

/// Assignment through swizzles: `xyzw` and `rgba` spellings, `=` and compound operators, a
/// single `.x` and `.a`, integer vectors, and a swizzle of a vector in device memory.
const SWIZZLE_WRITES: &str = "uint i = thread_position_in_grid.x;\n\
                              const device float4* p = (const device float4*)inp;\n\
                              device float4* o = (device float4*)out;\n\
                              float4 v = p[i];\n\
                              v.xy = float2(v.y, v.x) * 2.0f;\n\
                              v.zw += float2(1.0f, 2.0f);\n\
                              v.x = 3;\n\
                              o[3 * i] = v;\n\
                              float4 c = p[i];\n\
                              c.rgb = c.bgr;\n\
                              c.a -= 1.0f;\n\
                              c.ga *= 0.5f;\n\
                              o[3 * i + 1] = c;\n\
                              int3 k = int3(1, 2, 3) + int(i);\n\
                              k.zx = int2(7, 8);\n\
                              k.yz /= 2;\n\
                              o[3 * i + 2].wzy = float3(k);\n\
                              o[3 * i + 2].x = float(k.x + k.y);";

fn swizzle_writes() -> Case {
    Case {
        kernel: MetalKernel::new("swizzle_writes", &["inp"], &["out"], SWIZZLE_WRITES),
        inputs: vec![floats(&wavy(64, 0.8))],
        outputs: vec![(vec![16 * 12], DType::F32)],
        config: config((16, 1, 1), (16, 1, 1), vec![]),
    }
}

fn swizzle_writes_want(x: &[f32]) -> Vec<f32> {
    let mut want = vec![];
    for (i, a) in x.chunks(4).enumerate() {
        want.extend([3.0, 2.0 * a[0], a[2] + 1.0, a[3] + 2.0]);
        want.extend([a[2], 0.5 * a[1], a[0], 0.5 * (a[3] - 1.0)]);
        let y = (2 + i as i32) / 2;
        want.extend([(8 + y) as f32, 3.0, y as f32, 8.0]);
    }
    want
}

/// Vector comparisons (vector with vector, with a scalar on either side, half vectors), `!`,
/// `all`, `any` and `select` with a bool-vector condition. Each thread compares two float4s.
const COMPARE: &str = "uint i = thread_position_in_grid.x;\n\
                       const device float4* p = (const device float4*)inp;\n\
                       float4 a = p[2 * i];\n\
                       float4 b = p[2 * i + 1];\n\
                       bool4 c[8] = {a < b, a <= b, a > b, a >= b, a == b, a != b, a > 0.0f, 0.5f >= b};\n\
                       uint m = 0;\n\
                       for (int k = 0; k < 8; ++k)\n\
                         for (int j = 0; j < 4; ++j) m |= uint(c[k][j]) << (4 * k + j);\n\
                       bits[i] = m;\n\
                       bool2 h = half2(a.xy) < half2(b.xy);\n\
                       bool3 e = a.xyz == b.xyz;\n\
                       flags[i] = uint(all(a < b)) | uint(any(a < b)) << 1 | uint(all(h)) << 2 | uint(any(h)) << 3\n\
                         | uint(any(e)) << 4 | uint(all(!e)) << 5 | uint(all((!c[5]) == c[4])) << 6;\n\
                       device float4* o = (device float4*)sel;\n\
                       o[2 * i] = select(a, b, a < b);\n\
                       o[2 * i + 1] = metal::select(a, 0.0f, a < 0.0f);";

/// Pairs of float4s `(a, b)`, some with equal components and some with `a < b` throughout, so
/// each comparison, `all` and `any` sees both answers.
fn compare_input(n: usize) -> Vec<f32> {
    let mut x = wavy(8 * n, 1.3);
    for t in 0..n {
        for j in 0..4 {
            if t % 4 == 1 {
                x[8 * t + 4 + j] = x[8 * t + j] + 1.0;
            } else if t % 4 != 3 && (t + j) % 3 == 0 {
                x[8 * t + 4 + j] = x[8 * t + j];
            }
        }
    }
    x
}

fn compare() -> Case {
    Case {
        kernel: MetalKernel::new("compare", &["inp"], &["bits", "flags", "sel"], COMPARE),
        inputs: vec![floats(&compare_input(32))],
        outputs: vec![(vec![32], DType::U32), (vec![32], DType::U32), (vec![32 * 8], DType::F32)],
        config: config((32, 1, 1), (32, 1, 1), vec![]),
    }
}

fn compare_want(x: &[f32]) -> (Vec<u32>, Vec<u32>, Vec<f32>) {
    let (mut bits, mut flags, mut sel) = (vec![], vec![], vec![]);
    let half = |v: f32| Array::from(v).astype(DType::F16).astype(DType::F32).item::<f32>().unwrap();
    for t in x.chunks(8) {
        let (a, b) = (&t[..4], &t[4..]);
        let tests: [&dyn Fn(f32, f32) -> bool; 8] = [
            &|a, b| a < b,
            &|a, b| a <= b,
            &|a, b| a > b,
            &|a, b| a >= b,
            &|a, b| a == b,
            &|a, b| a != b,
            &|a, _| a > 0.0,
            &|_, b| 0.5 >= b,
        ];
        let mut m = 0u32;
        for (k, f) in tests.iter().enumerate() {
            for j in 0..4 {
                m |= (f(a[j], b[j]) as u32) << (4 * k + j);
            }
        }
        bits.push(m);
        let lt: Vec<bool> = (0..4).map(|j| a[j] < b[j]).collect();
        let h: Vec<bool> = (0..2).map(|j| half(a[j]) < half(b[j])).collect();
        let e: Vec<bool> = (0..3).map(|j| a[j] == b[j]).collect();
        let f = lt.iter().all(|&v| v) as u32
            | (lt.iter().any(|&v| v) as u32) << 1
            | (h.iter().all(|&v| v) as u32) << 2
            | (h.iter().any(|&v| v) as u32) << 3
            | (e.iter().any(|&v| v) as u32) << 4
            | (e.iter().all(|&v| !v) as u32) << 5
            | 1 << 6;
        flags.push(f);
        sel.extend((0..4).map(|j| if a[j] < b[j] { b[j] } else { a[j] }));
        sel.extend((0..4).map(|j| if a[j] < 0.0 { 0.0 } else { a[j] }));
    }
    (bits, flags, sel)
}

/// `simd_ballot`: the mask as `uint64_t` and `simd_vote::vote_t`, `.all()`, `.any()`, and
/// `popcount`, `ctz`, `clz` of it. Two SIMD-groups: the first votes mixed, the second all true.
const BALLOT: &str = "uint i = thread_position_in_grid.x;\n\
                      float v = inp[i];\n\
                      simd_vote vote = simd_ballot(v > 0.0f);\n\
                      uint64_t mask = (uint64_t)vote;\n\
                      simd_vote::vote_t same = static_cast<simd_vote::vote_t>(vote);\n\
                      out[i * 8 + 0] = uint(mask);\n\
                      out[i * 8 + 1] = uint(mask >> 32) + uint(same != mask);\n\
                      out[i * 8 + 2] = uint(popcount(mask));\n\
                      out[i * 8 + 3] = uint(vote.all()) | uint(vote.any()) << 1\n\
                        | uint(simd_ballot(v > -100.0f).all()) << 2 | uint(simd_ballot(v > 100.0f).any()) << 3;\n\
                      out[i * 8 + 4] = uint(ctz(mask));\n\
                      out[i * 8 + 5] = uint(clz(mask));\n\
                      out[i * 8 + 6] = popcount(uint(mask) & 0xffu) + 100 * ctz(0u) + 10000 * clz(uint(mask));\n\
                      out[i * 8 + 7] = uint((uint64_t)simd_ballot(thread_index_in_simdgroup == 5));";

fn ballot_input() -> Vec<f32> {
    let mut x = wavy(64, 0.3);
    for v in &mut x[32..] {
        *v = v.abs() + 0.5;
    }
    x
}

fn ballot() -> Case {
    Case {
        kernel: MetalKernel::new("ballot", &["inp"], &["out"], BALLOT),
        inputs: vec![floats(&ballot_input())],
        outputs: vec![(vec![64 * 8], DType::U32)],
        config: config((64, 1, 1), (64, 1, 1), vec![]),
    }
}

fn ballot_want(x: &[f32]) -> Vec<u32> {
    let mut want = vec![];
    for i in 0..64 {
        let w = &x[i / 32 * 32..i / 32 * 32 + 32];
        let mask = w.iter().enumerate().fold(0u64, |m, (l, &v)| m | ((v > 0.0) as u64) << l);
        let low = mask as u32;
        want.extend([
            low,
            0,
            mask.count_ones(),
            (mask == 0xffff_ffff) as u32 | ((mask != 0) as u32) << 1 | 1 << 2,
            if mask == 0 { 64 } else { mask.trailing_zeros() },
            mask.leading_zeros(),
            (low & 0xff).count_ones() + 100 * 32 + 10000 * low.leading_zeros(),
            1 << 5,
        ]);
    }
    want
}

/// Math: `metal::`, `fast::`, `precise::`, Metal-only functions, half and bfloat, limits.
const MATH: &str = "uint i = thread_position_in_grid.x;\n\
                    float x = inp[i];\n\
                    float r = metal::exp(x) + fast::exp(x) + metal::precise::exp(x) + rsqrt(x * x + 1.0f);\n\
                    r += clamp(x, -0.5f, 0.5f) + select(1.0f, 2.0f, x > 0) + fma(x, x, 1.0f) + metal::abs(x);\n\
                    r += as_type<float>(as_type<uint>(x)) + metal::numeric_limits<float>::lowest() * 0.0f + M_PI_F;\n\
                    out[i] = r;\n\
                    half h = half(x);\n\
                    bfloat b = bfloat(x);\n\
                    out_h[i] = exp(h) + max(h, half(0)) + half(float(tanh(b)));";

fn math() -> Case {
    Case {
        kernel: MetalKernel::new("math", &["inp"], &["out", "out_h"], MATH),
        inputs: vec![floats(&wavy(32, 0.1).iter().map(|v| v / 3.0).collect::<Vec<_>>())],
        outputs: vec![(vec![32], DType::F32), (vec![32], DType::F16)],
        config: config((32, 1, 1), (32, 1, 1), vec![]),
    }
}

fn math_want(x: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let r = x
        .iter()
        .map(|&x| {
            3.0 * x.exp()
                + 1.0 / (x * x + 1.0).sqrt()
                + x.clamp(-0.5, 0.5)
                + if x > 0.0 { 2.0 } else { 1.0 }
                + (x * x + 1.0)
                + x.abs()
                + x
                + std::f32::consts::PI
        })
        .collect();
    let h = x.iter().map(|&x| x.exp() + x.max(0.0) + x.tanh()).collect();
    (r, h)
}

/// Atomic outputs: a histogram and a float total.
const HIST: &str = "uint i = thread_position_in_grid.x;\n\
                    if (i < N) {\n\
                      atomic_fetch_add_explicit(&hist[inp[i]], 1u, memory_order_relaxed);\n\
                      atomic_fetch_add_explicit(&total[0], 0.5f, memory_order_relaxed);\n\
                    }";

fn histogram(values: &[i32]) -> Case {
    let n = values.len() as u32;
    Case {
        kernel: MetalKernel::new("histogram", &["inp"], &["hist", "total"], HIST).atomic_outputs(true),
        inputs: vec![Array::from_slice(values, [values.len()])],
        outputs: vec![(vec![10], DType::U32), (vec![1], DType::F32)],
        config: config((n.div_ceil(128) * 128, 1, 1), (128, 1, 1), vec![("N", (n as i32).into())]),
    }
}

/// A helper function in the header.
fn header_helper() -> Case {
    let header = "#include <metal_stdlib>\nusing namespace metal;\n\nfloat cube(float v) {\n  return v * v * v;\n}\n";
    Case {
        kernel: MetalKernel::new(
            "cube",
            &["inp"],
            &["out"],
            "uint i = thread_position_in_grid.x;\nout[i] = cube(inp[i]);",
        )
        .header(header),
        inputs: vec![floats(&wavy(16, 3.0))],
        outputs: vec![(vec![16], DType::F32)],
        config: config((16, 1, 1), (16, 1, 1), vec![]),
    }
}

/// Every small kernel of these tests.
/// Integer vector operators (`% & | ^ << >> ~`, compound ones), `&&` and `||` on bool vectors,
/// and `clamp`, `mix`, `step`, `sign`, `saturate` on float vectors with scalar and vector bounds.
const VECTOR_OPS: &str = "uint i = thread_position_in_grid.x;\n\
                          uint4 a = uint4(i, i + 1, 3 * i + 2, i + 7);\n\
                          uint4 b = uint4(3, 5, 2, 9);\n\
                          uint4 r = (a % b) + (a & b) * 10u + ((a | b) << 2) + ((a ^ b) >> 1) + (~a & 1u);\n\
                          r <<= uint4(1);\n\
                          r |= 1u;\n\
                          r %= 1000u;\n\
                          ((device uint4*)bits)[i] = r;\n\
                          bool4 m = (a > b) && (a < 9u) || !(a == b);\n\
                          flags[i] = uint(m.x) | uint(m.y) << 1 | uint(m.z) << 2 | uint(m.w) << 3;\n\
                          float4 f = ((const device float4*)inp)[i];\n\
                          device float4* g = (device float4*)fl;\n\
                          g[5 * i] = clamp(f, -0.5f, 0.5f);\n\
                          g[5 * i + 1] = mix(f, float4(1.0f), 0.25f);\n\
                          g[5 * i + 2] = step(0.0f, f);\n\
                          g[5 * i + 3] = sign(f);\n\
                          g[5 * i + 4] = saturate(f) + clamp(f, float4(-1.0f, 0.0f, -2.0f, 0.5f), float4(0.0f, 1.0f, 2.0f, 3.0f));";

fn vector_ops() -> Case {
    Case {
        kernel: MetalKernel::new("vector_ops", &["inp"], &["bits", "flags", "fl"], VECTOR_OPS),
        inputs: vec![floats(&wavy(128, 0.9))],
        outputs: vec![(vec![128], DType::U32), (vec![32], DType::U32), (vec![32 * 20], DType::F32)],
        config: config((32, 1, 1), (32, 1, 1), vec![]),
    }
}

fn vector_ops_want(x: &[f32]) -> (Vec<u32>, Vec<u32>, Vec<f32>) {
    let (mut bits, mut flags, mut fl) = (vec![], vec![], vec![]);
    for (i, f) in x.chunks(4).enumerate() {
        let i = i as u32;
        let (a, b) = ([i, i + 1, 3 * i + 2, i + 7], [3u32, 5, 2, 9]);
        let mut m = 0;
        for j in 0..4 {
            let (a, b) = (a[j], b[j]);
            let r = (a % b) + (a & b) * 10 + ((a | b) << 2) + ((a ^ b) >> 1) + (!a & 1);
            bits.push(((r << 1) | 1) % 1000);
            m |= (((a > b) && (a < 9) || a != b) as u32) << j;
        }
        flags.push(m);
        let (lo, hi) = ([-1.0f32, 0.0, -2.0, 0.5], [0.0f32, 1.0, 2.0, 3.0]);
        fl.extend(f.iter().map(|v| v.clamp(-0.5, 0.5)));
        fl.extend(f.iter().map(|v| v + (1.0 - v) * 0.25));
        fl.extend(f.iter().map(|&v| if v < 0.0 { 0.0 } else { 1.0 }));
        fl.extend(f.iter().map(|&v| {
            if v > 0.0 {
                1.0
            } else if v < 0.0 {
                -1.0
            } else {
                0.0
            }
        }));
        fl.extend(f.iter().enumerate().map(|(j, v)| v.clamp(0.0, 1.0) + v.clamp(lo[j], hi[j])));
    }
    (bits, flags, fl)
}

fn cases() -> Vec<Case> {
    vec![
        scale_f16(),
        attributes(),
        strided(),
        threadgroup_sum(),
        simd_reductions(),
        simd_scans(),
        vectors(),
        swizzle_writes(),
        compare(),
        ballot(),
        math(),
        histogram(&[0, 1, 2, 3]),
        header_helper(),
        vector_ops(),
    ]
}

// ---- mlx-lm's kernels --------------------------------------------------------------------

const MLX_LM_WHEEL: &str = "mlx_lm-0.32.2-py3-none-any.whl";
const MLX_LM_SHA256: &str = "5c0991248cfff5872503d74f466d2532dd8cb7fb3670cb9be7a06d7305dadc04";

/// Where fetched files are kept (as nuvec-lm's `fetch::cache_dir`).
fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("NUVEC_CACHE") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("nuvec");
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    home.join(".cache").join("nuvec")
}

fn sha256(path: &std::path::Path) -> String {
    use sha2::Digest;
    let bytes = std::fs::read(path).unwrap();
    sha2::Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn python() -> String {
    std::env::var("NUVEC_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// The mlx-lm 0.32.2 wheel, downloaded with pip the first time and checked by sha256.
pub(crate) fn mlx_lm_wheel() -> Result<PathBuf, String> {
    let dir = cache_dir().join("downloads");
    let path = dir.join(MLX_LM_WHEEL);
    if path.exists() {
        return Ok(path);
    }
    let tmp = dir.join(format!("tmp-{}-{:?}", std::process::id(), std::thread::current().id()));
    std::fs::create_dir_all(&tmp).map_err(|e| e.to_string())?;
    let out = std::process::Command::new(python())
        .args(["-m", "pip", "download", "--no-deps", "--quiet", "--only-binary=:all:", "-d"])
        .arg(&tmp)
        .arg("mlx-lm==0.32.2")
        .output()
        .map_err(|e| format!("could not run pip: {e}"))?;
    let got = tmp.join(MLX_LM_WHEEL);
    let done = if !out.status.success() {
        Err(format!("pip download mlx-lm==0.32.2 failed: {}", String::from_utf8_lossy(&out.stderr).trim()))
    } else if sha256(&got) != MLX_LM_SHA256 {
        Err(format!("{MLX_LM_WHEEL}: sha256 {}, expected {MLX_LM_SHA256}", sha256(&got)))
    } else {
        std::fs::rename(&got, &path).map_err(|e| e.to_string())
    };
    let _ = std::fs::remove_dir_all(&tmp);
    done.map(|()| path)
}

/// Imports a module of the wheel with stand-ins for `mlx` (MLX itself needs a Mac) and every
/// other package outside the standard library, recording every `mx.fast.metal_kernel` built: the kernels
/// exactly as mlx-lm writes them. The module's parent packages are stand-ins too, so their
/// `__init__` files (which import all of mlx-lm) do not run.
const CAPTURE: &str = r#"
import importlib, importlib.abc, importlib.machinery, json, sys, types
whl, module = sys.argv[1], sys.argv[2]
kernels = []
class Meta(type):
    # Any attribute, call, subscript or union of a stand-in is a stand-in; it subclasses too.
    def __getattr__(cls, name):
        return Stub
    def __call__(cls, *a, **kw):
        return Stub
    def __getitem__(cls, key):
        return Stub
    def __iter__(cls):
        return iter(())
    def __or__(cls, other):
        return Stub
    __ror__ = __or__
class Stub(metaclass=Meta):
    pass
def metal_kernel(**kw):
    kernels.append(kw)
    return Stub
def mx_compile(f=None, **kw):
    return f if f is not None else (lambda g: g)
class Loader(importlib.abc.Loader):
    def create_module(self, spec):
        m = types.ModuleType(spec.name)
        m.__path__ = []
        m.__getattr__ = lambda name: Stub
        return m
    def exec_module(self, m):
        if m.__name__ == "mlx.core":
            m.metal = types.SimpleNamespace(is_available=lambda: True)
            m.fast = types.SimpleNamespace(metal_kernel=metal_kernel)
            m.compile = mx_compile
class Outside(importlib.abc.MetaPathFinder):
    # Everything outside the standard library and mlx-lm, installed or not: the same capture
    # on any machine.
    def find_spec(self, name, path, target=None):
        top = name.split(".")[0]
        if top != "mlx_lm" and top not in sys.stdlib_module_names:
            return importlib.machinery.ModuleSpec(name, Loader(), is_package=True)
sys.meta_path.insert(0, Outside())
parts = module.removesuffix(".py").split("/")
for i in range(1, len(parts)):
    pkg = types.ModuleType(".".join(parts[:i]))
    pkg.__path__ = [whl + "/" + "/".join(parts[:i])]
    sys.modules[pkg.__name__] = pkg
sys.path.insert(0, whl)
importlib.import_module(".".join(parts))
print(json.dumps(kernels))
"#;

/// The Metal kernels one module of mlx-lm builds, in order, or why they could not be read.
/// Under `NUVEC_REQUIRE_NVRTC=1` (CI) failing to read them fails the test.
pub(crate) fn mlx_lm_kernels(module: &str) -> Option<Vec<MetalKernel>> {
    let read = || -> Result<Vec<MetalKernel>, String> {
        let wheel = mlx_lm_wheel()?;
        let out = std::process::Command::new(python())
            .args(["-c", CAPTURE])
            .arg(&wheel)
            .arg(module)
            .output()
            .map_err(|e| format!("could not run python: {e}"))?;
        if !out.status.success() {
            return Err(format!("reading {module} failed: {}", String::from_utf8_lossy(&out.stderr)));
        }
        let all: Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
        let strings = |v: &Value| -> Vec<String> {
            v.as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_string()).collect()
        };
        Ok(all
            .as_array()
            .unwrap()
            .iter()
            .map(|k| {
                let kernel = MetalKernel::new(
                    k["name"].as_str().unwrap(),
                    &strings(&k["input_names"]),
                    &strings(&k["output_names"]),
                    k["source"].as_str().unwrap(),
                );
                kernel
                    .header(k.get("header").and_then(Value::as_str).unwrap_or(""))
                    .atomic_outputs(k.get("atomic_outputs").and_then(Value::as_bool).unwrap_or(false))
                    .ensure_row_contiguous(k.get("ensure_row_contiguous").and_then(Value::as_bool).unwrap_or(true))
            })
            .collect())
    };
    match read() {
        Ok(k) => Some(k),
        Err(e) => {
            assert!(std::env::var("NUVEC_REQUIRE_NVRTC").as_deref() != Ok("1"), "mlx-lm's kernels: {e}");
            crate::skipped(&format!("mlx-lm's kernels: {e}"));
            None
        }
    }
}

/// mlx-lm's Gated DeltaNet kernels (`mlx_lm/models/gated_delta.py`).
fn mlx_lm_gated_delta() -> Option<Vec<MetalKernel>> {
    mlx_lm_kernels("mlx_lm/models/gated_delta.py")
}

/// mlx-lm's Mamba-2 SSM decode step (`mlx_lm/models/ssm.py`, `ssm_update_kernel`): its call with
/// `(batch, heads, groups, head_dim, state_dim) = (2, 4, 2, 16, 64)` and the same step composed
/// of ordinary operations, `(out, state)`.
fn ssm_case(kernel: &MetalKernel, dtype: DType) -> (Case, Vec<Array>) {
    let (n, h, hb, d, ds) = (2, 4, 2, 16, 64);
    let values = |len: i32, seed: f32| Array::from_slice(&wavy(len as usize, seed), [len as usize]);
    let x = (values(n * h * d, 0.2).reshape([n, 1, h, d]) * 0.5).astype(dtype);
    let a_log = values(h, 0.9) * 0.1;
    let b = (values(n * hb * ds, 1.7).reshape([n, 1, hb, ds]) * 0.2).astype(dtype);
    let c = (values(n * hb * ds, 2.3).reshape([n, 1, hb, ds]) * 0.2).astype(dtype);
    let dd = values(h, 3.1) * 0.3;
    let dt = (values(n * h, 0.6).reshape([n, 1, h]).abs() * 0.1) + 0.01;
    let state = values(n * h * d * ds, 4.2).reshape([n, h, d, ds]) * 0.1;
    // Head `i` reads group `i / (h / hb)`.
    let per_head = |m: &Array| {
        m.astype(DType::F32).reshape([n, hb, 1, ds]).broadcast_to([n, hb, h / hb, ds]).reshape([n, h, 1, ds])
    };
    let da = (-(a_log.exp()).reshape([1, 1, h]) * &dt).exp().reshape([n, h, 1, 1]);
    let xs = x.astype(DType::F32).reshape([n, h, d, 1]);
    let new_state = &da * &state + &xs * dt.reshape([n, h, 1, 1]) * per_head(&b);
    let out = (&new_state * per_head(&c)).sum([-1]) + x.astype(DType::F32).reshape([n, h, d]) * dd.reshape([1, h, 1]);
    let want = vec![out.reshape([n, 1, h, d]).astype(dtype), new_state];
    let case = Case {
        kernel: kernel.clone(),
        inputs: vec![x, a_log, b, c, dd, dt, state],
        outputs: vec![(vec![n, 1, h, d], dtype), (vec![n, h, d, ds], DType::F32)],
        config: config(
            (32, d as u32, (h * n) as u32),
            (32, 8, 1),
            vec![
                ("T", dtype.into()),
                ("U", DType::F32.into()),
                ("Dh", d.into()),
                ("Ds", ds.into()),
                ("H", h.into()),
                ("G", (h / hb).into()),
            ],
        ),
    };
    (case, want)
}

struct GdnInputs {
    q: Array,
    k: Array,
    v: Array,
    g: Array,
    beta: Array,
    state: Array,
    mask: Array,
    dims: (i32, i32, i32, i32, i32, i32),
}

/// Inputs of one Gated DeltaNet call, `dims = (B, T, Hk, Hv, Dk, Dv)`, q and k L2-normalised.
fn gdn_inputs(dims: (i32, i32, i32, i32, i32, i32), dtype: DType, vector_gate: bool) -> GdnInputs {
    let (b, t, hk, hv, dk, dv) = dims;
    let values = |n: i32, seed: f32| Array::from_slice(&wavy(n as usize, seed), [n as usize]);
    let unit = |x: Array| {
        let n = (&x * &x).sum_keepdims(-1).sqrt();
        &x / n
    };
    let q = unit(values(b * t * hk * dk, 0.1).reshape([b, t, hk, dk])) * (dk as f64).powf(-0.5);
    let k = unit(values(b * t * hk * dk, 0.7).reshape([b, t, hk, dk]));
    let v = values(b * t * hv * dv, 1.3).reshape([b, t, hv, dv]) * 0.3;
    let gshape: Vec<i32> = if vector_gate { vec![b, t, hv, dk] } else { vec![b, t, hv] };
    let gn = gshape.iter().product::<i32>();
    let g = (values(gn, 2.1).reshape(gshape).abs() * -0.05).exp();
    let beta = values(b * t * hv, 0.4).reshape([b, t, hv]).sigmoid();
    let state = values(b * hv * dv * dk, 3.3).reshape([b, hv, dv, dk]) * 0.1;
    let mask_v: Vec<bool> = (0..b * t).map(|i| i % 3 != 1).collect();
    let mask = Array::from_slice(&mask_v, [(b * t) as usize]).reshape([b, t]);
    let cast = |x: Array| x.astype(dtype);
    GdnInputs { q: cast(q), k: cast(k), v: cast(v), g, beta, state, mask, dims }
}

/// A call of one of mlx-lm's kernels as `_gated_delta_kernel_impl` makes it.
fn gdn_case(kernel: &MetalKernel, x: &GdnInputs) -> Case {
    let (b, t, hk, hv, dk, dv) = x.dims;
    let packed = kernel.name().contains("packed");
    let mut inputs = vec![x.q.clone(), x.k.clone(), x.v.clone(), x.g.clone(), x.beta.clone(), x.state.clone()];
    inputs.push(Array::from(t));
    if kernel.name().contains("mask") {
        inputs.push(x.mask.clone());
    }
    let dt = x.q.dtype();
    let (grid, tg) = if packed {
        ((32, dv as u32 / 8, (b * hv) as u32), (32, 2, 1))
    } else {
        ((32, dv as u32, (b * hv) as u32), (32, 4, 1))
    };
    Case {
        kernel: kernel.clone(),
        inputs,
        outputs: vec![(vec![b, t, hv, dv], dt), (vec![b, hv, dv, dk], DType::F32)],
        config: config(
            grid,
            tg,
            vec![
                ("InT", dt.into()),
                ("StT", DType::F32.into()),
                ("Dk", dk.into()),
                ("Dv", dv.into()),
                ("Hk", hk.into()),
                ("Hv", hv.into()),
            ],
        ),
    }
}

pub(crate) fn compile_all(all: &[Case]) {
    let mut failures = Vec::new();
    for c in all {
        let spec =
            c.kernel.spec(&c.inputs, &c.outputs, &c.config).unwrap_or_else(|e| panic!("{}: {e}", c.kernel.name()));
        let g = nuvec::cuda::generate_custom_kernel(&spec);
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

// ---- without a GPU --------------------------------------------------------------------------

#[test]
fn cases_compile_with_nvrtc() {
    if !nvrtc() {
        return;
    }
    compile_all(&cases());
}

#[test]
fn mlx_lm_gated_delta_kernels_compile_with_nvrtc() {
    let Some(kernels) = mlx_lm_gated_delta() else { return };
    let names: Vec<&str> = kernels.iter().map(|k| k.name()).collect();
    assert_eq!(
        names,
        [
            "gated_delta_step",
            "gated_delta_step_mask",
            "gated_delta_step_vec",
            "gated_delta_step_vec_mask",
            "gated_delta_step_xtree",
            "gated_delta_step_packed_btree"
        ]
    );
    if !nvrtc() {
        return;
    }
    let mut all = Vec::new();
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        for k in &kernels {
            let x = gdn_inputs((1, 2, 1, 2, 128, 16), dtype, k.name().contains("vec"));
            all.push(gdn_case(k, &x));
        }
    }
    compile_all(&all);
}

#[test]
fn mlx_lm_ssm_kernel_compiles_with_nvrtc() {
    let Some(kernels) = mlx_lm_kernels("mlx_lm/models/ssm.py") else { return };
    assert_eq!(kernels.iter().map(|k| k.name()).collect::<Vec<_>>(), ["ssm_kernel"]);
    if !nvrtc() {
        return;
    }
    compile_all(&[DType::F32, DType::BF16, DType::F16].map(|d| ssm_case(&kernels[0], d).0));
}

/// One of mlx-lm's fused kernels (`mlx_lm/kernels/`), by name.
fn mlx_lm_fused(name: &str) -> Option<MetalKernel> {
    let all = mlx_lm_kernels(&format!("mlx_lm/kernels/{name}.py"))?;
    Some(all.into_iter().find(|k| k.name() == name).unwrap_or_else(|| panic!("mlx-lm has no kernel {name}")))
}

/// `x * rsqrt(mean(x², -1) + eps)` in float32.
pub(crate) fn rms(x: &Array, eps: f32) -> Array {
    let x = x.astype(DType::F32);
    let d = *x.shape().last().unwrap() as f64;
    let ms = (&x * &x).sum_keepdims(-1) / d + eps as f64;
    &x / ms.sqrt()
}

/// `qk_norm` (`mlx_lm/kernels/qk_norm.py`): `(N, HQ, HK, D) = (3, 4, 2, 80)` (D not a multiple
/// of 32), and its composition `(q, k)`.
fn qk_norm_case(kernel: &MetalKernel, dtype: DType) -> (Case, Vec<Array>) {
    let (n, hq, hk, d) = (3, 4, 2, 80);
    let (scale, eps) = (0.125f32, 1e-6f32);
    let len = n * 2 * (hq + hk) * d;
    let qkvg =
        Array::from_slice(&wavy(len as usize, 0.4), [len as usize]).reshape([n, 2 * (hq + hk) * d]).astype(dtype);
    let rows = qkvg.reshape([n, 2 * (hq + hk), d]);
    let part = |from: i32, to: i32| rows.slice(&[0, from, 0], &[n, to, d], &[1, 1, 1]);
    let q = (rms(&part(0, hq), eps).astype(dtype).astype(DType::F32) * scale as f64).astype(dtype);
    let k = rms(&part(hq, hq + hk), eps).astype(dtype);
    let case = Case {
        kernel: kernel.clone(),
        inputs: vec![qkvg, Array::from(scale), Array::from(eps)],
        outputs: vec![(vec![n, hq, d], dtype), (vec![n, hk, d], dtype)],
        config: config(
            ((n * (hq + hk) * 32) as u32, 1, 1),
            (256, 1, 1),
            vec![("T", dtype.into()), ("D", d.into()), ("HQ", hq.into()), ("HK", hk.into())],
        ),
    };
    (case, vec![q, k])
}

/// `rms_norm_sigmoid_gate` (`mlx_lm/kernels/rms_norm_sigmoid_gate.py`) on a transposed view
/// (the kernel reads strides), `(B, H, L, D) = (2, 3, 5, 64)`, and its composition.
fn norm_gate_case(kernel: &MetalKernel, dtype: DType) -> (Case, Vec<Array>) {
    let (b, h, l, d) = (2, 3, 5, 64);
    let eps = 1e-5f32;
    let len = (b * h * l * d) as usize;
    // (B, L, H, D) in memory, seen as (B, H, L, D).
    let x = Array::from_slice(&wavy(len, 1.1), [len]).reshape([b, l, h, d]).astype(dtype).transpose(&[0, 2, 1, 3]);
    let g = Array::from_slice(&wavy(len, 2.2), [len]).reshape([b, l, h * d]).astype(dtype);
    let normed = rms(&x, eps).transpose(&[0, 2, 1, 3]).reshape([b, l, h * d]);
    let want = (normed * g.astype(DType::F32).sigmoid()).astype(dtype);
    let case = Case {
        kernel: kernel.clone(),
        inputs: vec![x, g, Array::from(eps)],
        outputs: vec![(vec![b, l, h * d], dtype)],
        config: config(((b * l * h * 32) as u32, 1, 1), (256, 1, 1), vec![("T", dtype.into()), ("D", d.into())]),
    };
    (case, vec![want])
}

#[test]
fn mlx_lm_fused_kernels_compile_with_nvrtc() {
    let (Some(qk), Some(gate)) = (mlx_lm_fused("qk_norm"), mlx_lm_fused("rms_norm_sigmoid_gate")) else { return };
    if !nvrtc() {
        return;
    }
    let mut all = Vec::new();
    for d in [DType::F32, DType::BF16, DType::F16] {
        all.push(qk_norm_case(&qk, d).0);
        all.push(norm_gate_case(&gate, d).0);
    }
    compile_all(&all);
}

#[test]
fn translation_of_the_scale_example() {
    let c = scale_f16();
    let spec = c.kernel.spec(&c.inputs, &c.outputs, &c.config).unwrap();
    let g = nuvec::cuda::generate_custom_kernel(&spec);
    assert_eq!(g.entry, "custom_kernel_scale_float16_t_3");
    assert!(g.source.contains("#include \"nuvec_metal_kernel.cuh\""), "{}", g.source);
    assert!(g.source.contains("const metal::uint3 thread_position_in_grid("), "{}", g.source);
    assert!(g.source.contains("#line 1 \"scale.source\"\n") && g.source.contains(SCALE), "{}", g.source);
    // Only the attributes the body mentions are declared; full grids need no guard.
    assert!(!g.source.contains("threads_per_threadgroup(") && !g.source.contains("return;"), "{}", g.source);
    // Atomic outputs shadow the signature's pointers.
    let c = histogram(&[1]);
    let g = nuvec::cuda::generate_custom_kernel(&c.kernel.spec(&c.inputs, &c.outputs, &c.config).unwrap());
    assert!(g.source.contains("atomic<unsigned int>* hist = nv_mk_atomic_hist;"), "{}", g.source);
}

#[test]
fn bad_input_gives_failed_arrays_naming_construct_and_line() {
    let x = ops::ones([4], DType::F32);
    let out = [(vec![4], DType::F32)];
    let cfg = config((4, 1, 1), (4, 1, 1), vec![]);
    let check = |arrays: Vec<Array>, needles: &[&str]| {
        assert_eq!(arrays.len(), 1);
        let e = arrays[0].eval().unwrap_err();
        assert_eq!(e.op_name(), Some("metal_kernel"), "{e}");
        for n in needles {
            assert!(e.to_string().contains(n), "`{n}` not in: {e}");
        }
        assert!(e.location().unwrap().file().ends_with("metal_kernel.rs"), "{e}");
    };
    let k = |body: &str| MetalKernel::new("bad", &["inp"], &["out"], body);
    let call = |k: MetalKernel| k.call(std::slice::from_ref(&x), &out, &cfg);
    check(
        call(k("uint i = thread_position_in_grid.x;\ntexture2d<float> t;\nout[i] = inp[i];")),
        &["`texture2d`", "line 2 of the source", "bad.source:2"],
    );
    check(
        call(k("uint i = 0;\n\nout[i] = simd_shuffle_rotate_down(inp[i], 1);")),
        &["`simd_shuffle_rotate_down`", "line 3"],
    );
    check(
        call(k("float4 v = float4(inp[0]);\nv.xx = float2(1.0f, 2.0f);\nout[0] = v.x;")),
        &["`.xx =`", "repeated component", "line 2 of the source", "bad.source:2"],
    );
    check(call(k("float2x2 m;")), &["`float2x2`", "matrix", "line 1"]);
    check(call(k("out[0] = 1.0f;\npacked_float3 p;")), &["`packed_float3`", "packed", "line 2"]);
    check(call(k("simdgroup_float8x8 m;")), &["`simdgroup_float8x8`", "SIMD-group matrices", "line 1"]);
    check(call(k("if (true) {\n  out[0] = inp[0];\n")), &["syntax error", "`{` is never closed", "line 1"]);
    check(call(k("out[0] = (inp[0];\n")), &["syntax error", "line 1"]);
    check(call(k("out[0] = inp[0];\n/* never closed")), &["syntax error", "line 2"]);
    check(call(k("out[0] = inp[0];").header("[[kernel]] void other() {}")), &["`[[kernel]]`", "line 1 of the header"]);
    check(k("out[0] = inp[0];").call(&[], &out, &cfg), &["inputs: expected 1 arrays, got 0"]);
    let half_out = [(vec![4], DType::F16)];
    check(
        k("out[0] = inp[0];").atomic_outputs(true).call(std::slice::from_ref(&x), &half_out, &cfg),
        &["atomic<T>", "`out`"],
    );
    let d = ops::ones([4], DType::F64);
    check(k("out[0] = inp[0];").call(&[d], &out, &cfg), &["input `inp` is float64"]);
    // A translated body that NVRTC rejects reports the user's line.
    if nvrtc() {
        let c = Case {
            kernel: k("uint i = thread_position_in_grid.x;\nfloat4 v = float4(1.0f);\nout[i] = v.x + undefined_thing;"),
            inputs: vec![x.clone()],
            outputs: out.to_vec(),
            config: cfg.clone(),
        };
        let g = nuvec::cuda::generate_custom_kernel(&c.kernel.spec(&c.inputs, &c.outputs, &c.config).unwrap());
        let err = nuvec::cuda::compile_custom_kernel(&g.source, &g.key, "sm_90").unwrap_err().to_string();
        assert!(err.contains("bad.source(3)") && err.contains("undefined_thing"), "{err}");
    }
}

#[test]
fn the_cpu_reports_an_unsupported_device() {
    let c = scale_f16();
    let e = with_stream(Device::cpu(), || c.call())[0].eval().unwrap_err();
    assert_eq!(e.op_name(), Some("metal_kernel"), "{e}");
    assert_eq!(e.kind(), Some(&OpErrorKind::UnsupportedDevice(Device::cpu())), "{e}");
}

// ---- on the GPU -----------------------------------------------------------------------------

#[test]
fn scale_example_sums_to_3072() {
    if !gpu() {
        return;
    }
    let out = scale_f16().call().remove(0);
    assert_eq!(out.dtype(), DType::F16);
    assert_eq!(out.astype(DType::F32).sum(..).item::<f32>().unwrap(), 3072.0);
}

#[test]
fn thread_attributes_and_exact_grids() {
    if !gpu() {
        return;
    }
    assert_eq!(attributes().call()[0].to_vec::<u32>().unwrap(), attributes_want());
}

#[test]
fn strided_views_and_scalars() {
    if !gpu() {
        return;
    }
    let c = strided();
    let x = c.inputs[0].contiguous().to_vec::<f32>().unwrap();
    let want: Vec<f32> = x.iter().map(|v| v * 2.0 + 7.0).collect();
    assert_eq!(c.f32s()[0], want);
}

pub(crate) fn close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol * w.abs().max(1.0), "{what}[{i}]: {g} vs {w}");
    }
}

#[test]
fn threadgroup_memory_and_barriers() {
    if !gpu() {
        return;
    }
    let x = wavy(256, 0.5);
    let want: Vec<f32> = x.chunks(64).map(|c| c.iter().sum()).collect();
    close(&threadgroup_sum().f32s()[0], &want, 1e-5, "tg_sum");
}

#[test]
fn simd_group_functions() {
    if !gpu() {
        return;
    }
    close(&simd_reductions().f32s()[0], &simd_want(&wavy(64, 1.5)), 1e-5, "simd");
    let c = simd_scans();
    let x = c.inputs[0].to_vec::<i32>().unwrap();
    let got = c.call()[0].to_vec::<i32>().unwrap();
    let mut acc = 0;
    for (i, v) in x.iter().enumerate() {
        assert_eq!(got[32 + i], acc, "exclusive[{i}]");
        acc += v;
        assert_eq!(got[i], acc, "inclusive[{i}]");
    }
}

#[test]
fn vector_types() {
    if !gpu() {
        return;
    }
    let got = vectors().f32s();
    let (out, out_h) = vectors_want(&wavy(64, 2.5));
    close(&got[0], &out, 1e-5, "out");
    close(&got[1], &out_h, 2e-3, "out_h");
}

#[test]
fn swizzle_assignment() {
    if !gpu() {
        return;
    }
    close(&swizzle_writes().f32s()[0], &swizzle_writes_want(&wavy(64, 0.8)), 1e-6, "swizzle_writes");
}

#[test]
fn vector_comparisons_and_select() {
    let (bits, flags, sel) = compare_want(&compare_input(32));
    // The input must exercise both answers of each comparison, or a constant result would pass.
    for b in 0..32 {
        assert!(bits.iter().any(|m| m >> b & 1 == 1) && bits.iter().any(|m| m >> b & 1 == 0), "bit {b}");
    }
    assert!((0..6).all(|b| flags.iter().any(|f| f >> b & 1 == 1) && flags.iter().any(|f| f >> b & 1 == 0)));
    if !gpu() {
        return;
    }
    let outs = compare().call();
    assert_eq!(outs[0].to_vec::<u32>().unwrap(), bits, "comparison bits");
    assert_eq!(outs[1].to_vec::<u32>().unwrap(), flags, "all/any flags");
    assert_eq!(outs[2].to_vec::<f32>().unwrap(), sel, "select");
}

#[test]
fn vector_bit_operators_and_common_functions() {
    let (_, flags, _) = vector_ops_want(&wavy(128, 0.9));
    assert!((0..4).all(|b| flags.iter().any(|f| f >> b & 1 == 1) && flags.iter().any(|f| f >> b & 1 == 0)));
    if !gpu() {
        return;
    }
    let c = vector_ops();
    let (bits, flags, fl) = vector_ops_want(&c.inputs[0].to_vec::<f32>().unwrap());
    let outs = c.call();
    assert_eq!(outs[0].to_vec::<u32>().unwrap(), bits, "integer operators");
    assert_eq!(outs[1].to_vec::<u32>().unwrap(), flags, "&& and ||");
    close(&outs[2].to_vec::<f32>().unwrap(), &fl, 1e-6, "clamp, mix, step, sign, saturate");
}

#[test]
fn simd_ballot_masks() {
    let want = ballot_want(&ballot_input());
    // The first SIMD-group votes mixed, the second all true.
    assert!(want[3] == 6 && want[32 * 8 + 3] == 7, "{:?}", &want[..8]);
    if !gpu() {
        return;
    }
    assert_eq!(ballot().call()[0].to_vec::<u32>().unwrap(), want);
}

#[test]
fn math_functions() {
    if !gpu() {
        return;
    }
    let c = math();
    let x = c.inputs[0].to_vec::<f32>().unwrap();
    let got = c.f32s();
    let (r, h) = math_want(&x);
    close(&got[0], &r, 1e-5, "float");
    close(&got[1], &h, 1e-2, "half");
}

#[test]
fn atomic_outputs_histogram() {
    if !gpu() {
        return;
    }
    let values: Vec<i32> = (0..5000).map(|i| ((i * 7919) % 13 + (i % 3)) % 10).collect();
    let mut want = [0u32; 10];
    for &v in &values {
        want[v as usize] += 1;
    }
    let outs = histogram(&values).call();
    assert_eq!(outs[0].to_vec::<u32>().unwrap(), want);
    assert_eq!(outs[1].item::<f32>().unwrap(), 0.5 * values.len() as f32);
}

#[test]
fn header_functions() {
    if !gpu() {
        return;
    }
    let c = header_helper();
    let want: Vec<f32> = wavy(16, 3.0).iter().map(|v| v * v * v).collect();
    close(&c.f32s()[0], &want, 1e-6, "cube");
}

#[test]
fn mlx_lm_gated_delta_matches_fast_gated_delta() {
    if !gpu() {
        return;
    }
    let Some(kernels) = mlx_lm_gated_delta() else { return };
    for dtype in [DType::F32, DType::BF16] {
        for k in &kernels {
            let vector_gate = k.name().contains("vec");
            let masked = k.name().contains("mask");
            let x = gdn_inputs((2, 5, 2, 4, 128, 64), dtype, vector_gate);
            let outs = gdn_case(k, &x).call();
            let options = fast::StepOptions { storage: Some(DType::F32), mask: masked.then(|| x.mask.clone()) };
            let (y, state) = fast::gated_delta_with(&x.q, &x.k, &x.v, &x.g, &x.beta, Some(&x.state), &options);
            let tol = if dtype == DType::F32 { 1e-4 } else { 2e-2 };
            let f = |a: &Array| a.astype(DType::F32).to_vec::<f32>().unwrap();
            let what = format!("{} {dtype:?}", k.name());
            close(&f(&outs[0]), &f(&y), tol, &format!("{what} y"));
            close(&f(&outs[1]), &f(&state), tol, &format!("{what} state"));
        }
    }
}

#[test]
fn mlx_lm_ssm_matches_its_composition() {
    if !gpu() {
        return;
    }
    let Some(kernels) = mlx_lm_kernels("mlx_lm/models/ssm.py") else { return };
    for dtype in [DType::F32, DType::BF16] {
        let (case, want) = ssm_case(&kernels[0], dtype);
        let got = case.f32s();
        let tol = if dtype == DType::F32 { 1e-4 } else { 2e-2 };
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            close(g, &w.astype(DType::F32).to_vec::<f32>().unwrap(), tol, &format!("ssm {dtype:?} output {i}"));
        }
    }
}

#[test]
fn mlx_lm_fused_kernels_match_their_compositions() {
    if !gpu() {
        return;
    }
    let (Some(qk), Some(gate)) = (mlx_lm_fused("qk_norm"), mlx_lm_fused("rms_norm_sigmoid_gate")) else { return };
    for dtype in [DType::F32, DType::BF16] {
        let tol = if dtype == DType::F32 { 1e-5 } else { 1e-2 };
        for (name, (case, want)) in [("qk_norm", qk_norm_case(&qk, dtype)), ("norm_gate", norm_gate_case(&gate, dtype))]
        {
            for (i, (g, w)) in case.f32s().iter().zip(&want).enumerate() {
                close(g, &w.astype(DType::F32).to_vec::<f32>().unwrap(), tol, &format!("{name} {dtype:?} output {i}"));
            }
        }
    }
}
