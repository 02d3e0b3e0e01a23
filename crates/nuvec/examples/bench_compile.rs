//! GPU benchmark of `compile` (`nuvec::transforms::compile_flat`, MLX's `mx.compile`) on GPU 0:
//! element-wise chains, GELU, a hand-written softmax and one Adam update, each timed as the
//! plain function (eager: every operation its own kernel) and compiled (traced once, its
//! element-wise regions fused into generated kernels), as a bandwidth against a copy of the
//! same number of bytes measured in the same run.
//!
//! ```text
//! cargo run --release -p nuvec --example bench_compile                        # every case
//! cargo run --release -p nuvec --example bench_compile -- --out compile.tsv    # also write the TSV lines
//! cargo run --release -p nuvec --example bench_compile -- --only softmax       # cases whose name contains "softmax"
//! NUVEC_DEVICE=cpu cargo run --release -p nuvec --example bench_compile -- --small --only chain10_f32
//! ```
//!
//! Without a usable GPU it prints why and exits with status 0 (unless `--small`, below).
//! `bench/compile_peers.py` times the same cases in PyTorch (eager and `torch.compile`) and
//! `scripts/gpu-compile.sh` runs both on the GPU machine and prints them side by side.
//!
//! # Method
//!
//! As `bench_gpu`'s (the harness is `bench_harness/mod.rs`): the copy ceiling
//! `ceiling_copy_memcpy` (a 1 GiB `cuMemcpyDtoD`) is measured first, whatever `--only` says;
//! each timing runs warm-up iterations, then batches of iterations ending with a synchronize,
//! and reports the median over batches of batch time / iterations; inputs smaller than 3× L2
//! rotate among copies (the same copies for both ways of running the function).
//!
//! For each case, in this order:
//!
//! 1. the case's own ceiling, `<case>_copy`: `bench_harness::copy_bandwidth` of a copy that
//!    moves the case's bytes (half read, half written), timed with CUDA events;
//! 2. the inputs, then a check: the compiled function's first call (which traces, fuses and
//!    builds its kernels, so that none of that is timed) and the plain function, on the same
//!    inputs, must give outputs of the same shapes and dtypes, within a relative error
//!    `‖compiled − eager‖ / ‖eager‖` of 1e-5 (float32) or 1e-2 (bfloat16) per output, never
//!    NaN (`compile` promises equality bit for bit; the tolerance leaves room for a generated
//!    kernel's transcendental functions). A `# <case>: check ...` line gives the errors; a
//!    failed check fails the case;
//! 3. `<case>_eager`: each iteration calls the plain function on the inputs and evaluates
//!    every output in one `eval`;
//! 4. `<case>`: each iteration calls the compiled function (a replay of its cached trace: the
//!    signature never changes) and evaluates every output in one `eval`.
//!
//! Host time (recording or replaying, launching) is part of each iteration, as in a program.
//!
//! # Cases and bytes
//!
//! Bytes are the fewest the function must move: each input read once, each output written
//! once (float32 4 bytes, bfloat16 2). Scalars are Rust `f32`s, weak: they take the array's
//! dtype. "M" is 2^20 elements. `bench/compile_peers.py` writes the same functions, operation
//! for operation.
//!
//! * `chain10_{f32,bf16}_64M`: 64M elements, 10 element-wise operations on one input `x`
//!   (2 transcendental), read `x`, write `y`:
//!   `y = x * 1.5; y = y + 0.5; y = tanh(y); y = y * y; y = y - 0.25; y = y * x; y = y / 3;
//!   y = exp(y); y = y * 0.75; y = y + x`.
//! * `gelu_tanh_{f32,bf16}_64M`: GELU's tanh approximation written out, read `x`, write `y`:
//!   `inner = (x + (x * x * x) * 0.044715) * sqrt(2/π); y = (x * 0.5) * (tanh(inner) + 1)`.
//! * `softmax_{f32,bf16}_8192x4096`: over the last axis, written out (no fused softmax), read
//!   `x`, write `y`: `e = exp(x - max(x, -1, keepdims)); y = e / sum(e, -1, keepdims)`.
//!   `compile` fuses element-wise work, not reductions, so this case cannot reach the bytes
//!   counted (the maximum and the sum each read what they reduce).
//! * `adam_f32_124M`: one Adam step (step 10, bias-corrected, lr 1e-3, betas 0.9 and 0.999,
//!   eps 1e-8, no weight decay) of one parameter of 124M elements, read `p`, `g`, `m`, `v`,
//!   write the new `p`, `m`, `v`:
//!   `m = m * 0.9 + g * 0.1; v = v * 0.999 + (g * g) * 0.001; mhat = m / (1 - 0.9^10);
//!   vhat = v / (1 - 0.999^10); p = p - (mhat * 1e-3) / (sqrt(vhat) + 1e-8)` (the bias
//!   corrections computed in f64 on the host, as `f32` scalars). `v` starts as the square of a
//!   random array.
//!
//! # Targets
//!
//! The compiled function of the cases that fuse into one pass over memory (`chain10_*`,
//! `gelu_tanh_*`, `adam_*`): at least 85% of its same-size copy. Softmax and the eager rows
//! have none.
//!
//! # Output
//!
//! As `bench_gpu`: a table on stdout as rows finish (with the `# ... check` lines), then
//! `name<TAB>value<TAB>unit<TAB>fraction` per row (also written line by line to `--out PATH`),
//! three rows a case: `<case>` (compiled), `<case>_eager` (GB/s of the same bytes; both
//! fractions are of `<case>_copy`) and `<case>_copy` (the copy's GB/s, its fraction of
//! `ceiling_copy_memcpy`). The compiled row's detail says how many times faster than eager it
//! ran. Exit status 1 when a case failed. Environment: `NUVEC_BENCH_BATCH_MS` (100),
//! `NUVEC_BENCH_BATCHES` (5, at least 3), `NUVEC_BENCH_WARMUP` (3); `NUVEC_COMPILE=0` makes the
//! compiled rows run the plain function (a check of the method: both rows should then agree).
//!
//! # `--small`
//!
//! A smoke run: every size divided by 64 (softmax's rows, not its 4096 columns), on the
//! default device (`NUVEC_DEVICE=cpu` for the CPU), without the 1 GiB ceiling and, off the GPU,
//! without copies (fractions `-`) and timed with the host clock. Its numbers mean nothing; it
//! checks that every case builds, compiles and agrees with the plain function.

mod bench_harness;

use std::fs::File;
use std::time::{Duration, Instant};

use bench_harness::{Bench, Row, Timing, copy_bandwidth, copy_ceiling, env_or, median, random, time_outputs};
use nuvec::transforms::{CompileOptions, compile_flat, compile_flat_with};
use nuvec::{Array, DType, with_stream};

/// Target of the one-pass compiled cases: fraction of the same-size copy.
const TARGET_ONE_PASS: f64 = 0.85;
/// Size divisor of `--small`.
const SMALL: i32 = 64;
/// `sqrt(2 / π)`, GELU's constant.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
/// Adam's step (for the bias corrections), learning rate, betas (f64, as Python's floats, for
/// the bias corrections) and epsilon.
const ADAM_STEP: i32 = 10;
const ADAM_LR: f32 = 1e-3;
const ADAM_B1: f64 = 0.9;
const ADAM_B2: f64 = 0.999;
const ADAM_EPS: f32 = 1e-8;

/// A benchmarked function of flat arrays.
type Function = fn(&[Array]) -> nuvec::Result<Vec<Array>>;

/// How this run goes: full size on GPU 0, or `--small` on the default device.
#[derive(Clone, Copy)]
struct Mode {
    /// Size divisor (1, or [`SMALL`]).
    scale: i32,
    /// Whether the device is a GPU (CUDA timing and copies), or the CPU.
    gpu: bool,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("usage: bench_compile [--out PATH] [--only SUBSTRING] [--small]");
        return;
    }
    if args.iter().any(|a| a == "--small") {
        smoke(&args);
    } else {
        bench_harness::main_with("bench_compile", |b| run_all(b, Mode { scale: 1, gpu: true }));
    }
}

fn run_all(b: &mut Bench, mode: Mode) {
    if mode.gpu && mode.scale == 1 {
        copy_ceiling(b);
    }
    let n = (64 << 20) / mode.scale;
    for (dt, tag) in [(DType::F32, "f32"), (DType::BF16, "bf16")] {
        let case = Case::unary(format!("chain10_{tag}_64M"), chain10, &[n], dt, Some(TARGET_ONE_PASS));
        run_case(b, mode, case);
    }
    for (dt, tag) in [(DType::F32, "f32"), (DType::BF16, "bf16")] {
        let case = Case::unary(format!("gelu_tanh_{tag}_64M"), gelu_tanh, &[n], dt, Some(TARGET_ONE_PASS));
        run_case(b, mode, case);
    }
    let rows = 8192 / mode.scale;
    for (dt, tag) in [(DType::F32, "f32"), (DType::BF16, "bf16")] {
        let case = Case::unary(format!("softmax_{tag}_8192x4096"), softmax, &[rows, 4096], dt, None);
        run_case(b, mode, case);
    }
    run_case(b, mode, Case::adam((124 << 20) / mode.scale));
    run_decode(b, mode);
}

// --- the functions (bench/compile_peers.py mirrors them operation for operation) -----------

/// Ten element-wise operations on one input, two of them transcendental.
fn chain10(x: &[Array]) -> nuvec::Result<Vec<Array>> {
    let x = &x[0];
    let y = x * 1.5f32;
    let y = y + 0.5f32;
    let y = y.tanh();
    let y = &y * &y;
    let y = y - 0.25f32;
    let y = y * x;
    let y = y / 3.0f32;
    let y = y.exp();
    let y = y * 0.75f32;
    let y = y + x;
    Ok(vec![y])
}

/// GELU with the tanh approximation, written out.
fn gelu_tanh(x: &[Array]) -> nuvec::Result<Vec<Array>> {
    let x = &x[0];
    let inner = (x + (x * x * x) * 0.044715f32) * SQRT_2_OVER_PI;
    Ok(vec![(x * 0.5f32) * (inner.tanh() + 1.0f32)])
}

/// Softmax over the last axis, written out.
fn softmax(x: &[Array]) -> nuvec::Result<Vec<Array>> {
    let x = &x[0];
    let e = (x - x.max_keepdims(-1)).exp();
    let s = e.sum_keepdims(-1);
    Ok(vec![e / s])
}

/// One bias-corrected Adam step of `p` with gradient `g` and moments `m`, `v`: the new
/// `p`, `m`, `v`.
fn adam(x: &[Array]) -> nuvec::Result<Vec<Array>> {
    let (p, g, m, v) = (&x[0], &x[1], &x[2], &x[3]);
    // The bias corrections, in f64 then rounded once (Python: `1 - 0.9 ** 10`).
    let c1 = (1.0 - ADAM_B1.powi(ADAM_STEP)) as f32;
    let c2 = (1.0 - ADAM_B2.powi(ADAM_STEP)) as f32;
    let m = m * ADAM_B1 as f32 + g * 0.1f32;
    let v = v * ADAM_B2 as f32 + (g * g) * 0.001f32;
    let mhat = &m / c1;
    let vhat = &v / c2;
    let p = p - (mhat * ADAM_LR) / (vhat.sqrt() + ADAM_EPS);
    Ok(vec![p, m, v])
}

// --- cases -----------------------------------------------------------------------------------

/// Inputs of rotation copy `j`.
type Inputs = Box<dyn Fn(u32) -> nuvec::Result<Vec<Array>>>;

/// One benchmarked function with its inputs and byte count.
struct Case {
    /// The compiled row's name (`_eager` and `_copy` are appended for the others).
    name: String,
    /// The function, timed as it is and through `compile_flat`.
    f: Function,
    /// Makes the inputs of rotation copy `j`.
    inputs: Inputs,
    /// Bytes of one set of inputs (for the rotation).
    input_bytes: usize,
    /// Bytes read + written at the least, per call.
    bytes: usize,
    /// The compiled row's target (fraction of the same-size copy).
    target: Option<f64>,
    /// Output dtype, for the check's tolerance.
    dtype: DType,
}

impl Case {
    /// A function of one input `x` of `shape` and `dtype`, whose one output has the same.
    fn unary(name: String, f: Function, shape: &[i32], dtype: DType, target: Option<f64>) -> Case {
        let elems: usize = shape.iter().map(|&d| d as usize).product();
        let nbytes = elems * dtype.size();
        let shape = shape.to_vec();
        let inputs: Inputs = Box::new(move |j| Ok(vec![random(&shape, dtype, 10 + 101 * j)?]));
        Case { name, f, inputs, input_bytes: nbytes, bytes: 2 * nbytes, target, dtype }
    }

    /// The Adam step over `n` float32 elements: read `p`, `g`, `m`, `v`, write `p`, `m`, `v`.
    fn adam(n: i32) -> Case {
        let nbytes = n as usize * 4;
        let inputs: Inputs = Box::new(move |j| {
            let s = 20 + 101 * j;
            let p = random(&[n], DType::F32, s)?;
            let g = random(&[n], DType::F32, s + 1)? * 0.01f32;
            let m = random(&[n], DType::F32, s + 2)? * 0.001f32;
            // A second moment is not negative.
            let v = random(&[n], DType::F32, s + 3)?.square() * 1e-4f32;
            let all = vec![p, g, m, v];
            nuvec::eval(&all)?;
            Ok(all)
        });
        Case {
            name: "adam_f32_124M".into(),
            f: adam,
            inputs,
            input_bytes: 4 * nbytes,
            bytes: 7 * nbytes,
            target: Some(TARGET_ONE_PASS),
            dtype: DType::F32,
        }
    }
}

/// Relative error `‖got − want‖ / ‖want‖` (float32 sums), NaN when either has a NaN.
fn relative_error(got: &Array, want: &Array) -> nuvec::Result<f64> {
    let (g, w) = (got.astype(DType::F32), want.astype(DType::F32));
    let num = (&g - &w).square().sum(..);
    let den = w.square().sum(..);
    nuvec::eval(&[num.clone(), den.clone()])?;
    let (num, den) = (num.to_vec::<f32>()?[0] as f64, den.to_vec::<f32>()?[0] as f64);
    Ok(if den > 0.0 { (num / den).sqrt() } else { num.sqrt() })
}

/// Compares the compiled outputs with the plain function's; an error names the first output
/// that differs. Returns the errors, for the `# check` line.
fn check(case: &Case, compiled: &[Array], eager: &[Array]) -> nuvec::Result<Vec<f64>> {
    let fail = |what: String| nuvec::Error::Backend(format!("{}: compiled and eager differ: {what}", case.name));
    if compiled.len() != eager.len() {
        return Err(fail(format!("{} outputs against {}", compiled.len(), eager.len())));
    }
    let tol = if case.dtype == DType::F32 { 1e-5 } else { 1e-2 };
    let mut errs = Vec::with_capacity(eager.len());
    for (i, (c, e)) in compiled.iter().zip(eager).enumerate() {
        if c.shape() != e.shape() || c.dtype() != e.dtype() || e.dtype() != case.dtype {
            return Err(fail(format!(
                "output {i} is {:?} {:?}, eager {:?} {:?}, expected dtype {:?}",
                c.dtype(),
                c.shape(),
                e.dtype(),
                e.shape(),
                case.dtype
            )));
        }
        let err = relative_error(c, e)?;
        if err.is_nan() || err > tol {
            return Err(fail(format!("output {i} relative error {err:.3e} (tolerance {tol:.0e})")));
        }
        errs.push(err);
    }
    Ok(errs)
}

/// Times `op` on the run's device: the harness's batches on the GPU; on the CPU the same
/// batches on the host clock (a CPU `eval` returns when the work is done).
fn time(mode: Mode, op: &dyn Fn(usize) -> nuvec::Result<Vec<Array>>) -> nuvec::Result<Timing> {
    if mode.gpu {
        return time_outputs(op);
    }
    let warmup: usize = env_or("NUVEC_BENCH_WARMUP", 3).max(1);
    let batches: usize = env_or("NUVEC_BENCH_BATCHES", 5).max(3);
    let batch_time = Duration::from_secs_f64(env_or("NUVEC_BENCH_BATCH_MS", 100.0) / 1e3);
    let run = |i: usize| nuvec::eval(&op(i)?);
    let mut i = 0;
    let t = Instant::now();
    for _ in 0..warmup {
        run(i)?;
        i += 1;
    }
    let each = t.elapsed().as_secs_f64() / warmup as f64;
    let count = ((batch_time.as_secs_f64() / each.max(1e-7)) as usize).clamp(3, 5000);
    let mut per = Vec::with_capacity(batches);
    for _ in 0..batches {
        let t = Instant::now();
        for _ in 0..count {
            run(i)?;
            i += 1;
        }
        per.push(t.elapsed().as_secs_f64() / count as f64);
    }
    let (min, max) = per.iter().fold((f64::MAX, 0.0f64), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    Ok(Timing { median: median(&mut per), min, max, count, batches, host: f64::NAN })
}

/// The GB/s row of a timing against `ceiling` GB/s, with `target` a fraction of it.
fn row(name: &str, bytes: usize, t: &Timing, ceiling: Option<f64>, target: Option<f64>, note: &str) -> Row {
    let gbs = bytes as f64 / t.median / 1e9;
    let fraction = ceiling.map(|c| gbs / c);
    // Without a ceiling (a `--small` run on the CPU) there is nothing to hold a target against.
    let target = match (target, fraction) {
        (Some(g), Some(f)) => format!(">={:.0}% {}", 100.0 * g, if f >= g { "ok" } else { "MISS" }),
        _ => String::new(),
    };
    Row { name: name.into(), value: gbs, unit: "GB/s", fraction, target, detail: format!("{}{note}", Bench::detail(t)) }
}

/// Measures one case: its same-size copy, the check, the plain function, the compiled one.
fn run_case(b: &mut Bench, mode: Mode, case: Case) {
    if !b.wanted(&case.name) {
        return;
    }
    let (name, eager_name, copy_name) =
        (case.name.clone(), format!("{}_eager", case.name), format!("{}_copy", case.name));

    // 1. A copy moving the same bytes, before the case's arrays take memory.
    let copy = mode.gpu.then(|| copy_bandwidth(0, case.bytes / 2, 20));
    let ceiling = match &copy {
        Some(Ok(gbs)) => Some(*gbs),
        // Without it, the 1 GiB copy's ceiling.
        _ => b.copy_gbs,
    };

    // 2-4. Inputs and check, then the two timings.
    let k = b.copies(case.input_bytes);
    let result = (|| -> nuvec::Result<(Timing, Timing)> {
        let ins: Vec<Vec<Array>> = (0..k as u32).map(|j| (case.inputs)(j)).collect::<Result<_, _>>()?;
        for set in &ins {
            nuvec::eval(set)?;
        }
        let compiled = compile_flat(case.f);
        let first = compiled(&ins[0])?;
        nuvec::eval(&first)?;
        let want = (case.f)(&ins[0])?;
        nuvec::eval(&want)?;
        let errs = check(&case, &first, &want)?;
        let errs: Vec<String> = errs.iter().map(|e| format!("{e:.2e}")).collect();
        println!("# {name}: check ok, relative error of compiled to eager {} ({k} input set(s))", errs.join(" "));
        drop((first, want));
        let eager = time(mode, &|i| (case.f)(&ins[i % k]))?;
        let fused = time(mode, &|i| compiled(&ins[i % k]))?;
        Ok((eager, fused))
    })();
    match result {
        Ok((eager, fused)) => {
            let speedup = format!("; {:.2}x eager", eager.median / fused.median);
            b.push(row(&name, case.bytes, &fused, ceiling, case.target, &speedup));
            b.push(row(&eager_name, case.bytes, &eager, ceiling, None, ""));
        }
        Err(e) => {
            b.failed(&name, "GB/s", &e);
            b.failed(&eager_name, "GB/s", &e);
        }
    }
    match copy {
        Some(Ok(gbs)) => b.push(Row {
            name: copy_name,
            value: gbs,
            unit: "GB/s",
            fraction: b.copy_gbs.map(|c| gbs / c),
            target: String::new(),
            detail: format!("cuMemcpyDtoD of {} MB, median of 20", case.bytes / 2 / 1_000_000),
        }),
        Some(Err(e)) => b.failed(&copy_name, "GB/s", &e),
        None => {}
    }
    if mode.gpu {
        let _ = nuvec::cuda::clear_cache(0);
    }
}

// --- a decode-shaped step: eager, compiled, and as a CUDA graph ----------------------------

/// Model width, feed-forward width, layers and heads of the decode step (Llama-3-8B's).
const HIDDEN: i32 = 4096;
const FFN: i32 = 14336;
const LAYERS: usize = 32;
const HEADS: i32 = 32;

/// One layer's bf16 weights, `[out, in]` as `nn::Linear` keeps them.
struct Layer {
    norm1: Array,
    wq: Array,
    wo: Array,
    norm2: Array,
    wgu: Array,
    wd: Array,
}

/// One decode step of batch 1: per layer RMSNorm, the query product, RoPE, the output
/// product and residual, RMSNorm, the fused gate/up product, SwiGLU, the down product and
/// residual (no attention: the step the issue measures).
fn decode_step(layers: &[Layer], x: &Array, hidden: i32, ffn: i32) -> Array {
    let offset = Array::from(7);
    let mut h = x.clone();
    for l in layers {
        let n = nuvec::fast::rms_norm(&h, &l.norm1, 1e-5);
        let q = n.matmul(&l.wq.t()).reshape([1, HEADS, 1, hidden / HEADS]);
        let q = nuvec::fast::rope(&q, hidden / HEADS, false, Some(5e5), 1.0, &offset, None);
        h = &h + q.reshape([1, hidden]).matmul(&l.wo.t());
        let n = nuvec::fast::rms_norm(&h, &l.norm2, 1e-5);
        let gu = n.matmul(&l.wgu.t());
        let (g, u) = (gu.slice(&[0, 0], &[1, ffn], &[1, 1]), gu.slice(&[0, ffn], &[1, 2 * ffn], &[1, 1]));
        h = &h + nuvec::fast::swiglu(&g, &u).matmul(&l.wd.t());
    }
    h
}

/// The decode step timed three ways, as the bandwidth of its weights: eager (one kernel per
/// operation, recorded on every call), compiled, and compiled into a CUDA graph
/// (`CompileOptions::cuda_graph`). Rows `decode32_{eager,compiled,graph}` (fractions of the
/// copy ceiling: the step reads every weight once) and `decode32_graph_host_us` (host
/// microseconds of one graphed call: refilling the input, the launch, copying the result out;
/// target at most 20).
fn run_decode(b: &mut Bench, mode: Mode) {
    let name = "decode32";
    if !b.wanted(name) {
        return;
    }
    let (hidden, ffn) = (HIDDEN / mode.scale.min(16), FFN / mode.scale.min(16));
    let result = (|| -> nuvec::Result<(Timing, Timing, Timing, usize)> {
        let w = |shape: &[i32], seed: u32| -> nuvec::Result<Array> {
            Ok((random(shape, DType::BF16, seed)? * (1.0 / (shape[shape.len() - 1] as f32).sqrt())).astype(DType::BF16))
        };
        let layers: Vec<Layer> = (0..LAYERS as u32)
            .map(|i| {
                let s = 1000 + 16 * i;
                Ok(Layer {
                    norm1: (random(&[hidden], DType::BF16, s)? * 0.1f32 + 1.0f32).astype(DType::BF16),
                    wq: w(&[hidden, hidden], s + 1)?,
                    wo: w(&[hidden, hidden], s + 2)?,
                    norm2: (random(&[hidden], DType::BF16, s + 3)? * 0.1f32 + 1.0f32).astype(DType::BF16),
                    wgu: w(&[2 * ffn, hidden], s + 4)?,
                    wd: w(&[hidden, ffn], s + 5)?,
                })
            })
            .collect::<nuvec::Result<_>>()?;
        let all: Vec<&Array> = layers.iter().flat_map(|l| [&l.norm1, &l.wq, &l.wo, &l.norm2, &l.wgu, &l.wd]).collect();
        nuvec::eval(&all)?;
        let bytes: usize = all.iter().map(|a| a.nbytes()).sum();
        let xs: Vec<Array> = (0..4).map(|j| random(&[1, hidden], DType::BF16, 7 + j)).collect::<nuvec::Result<_>>()?;
        nuvec::eval(&xs)?;
        let step = |x: &[Array]| Ok(vec![decode_step(&layers, &x[0], hidden, ffn)]);
        let compiled = compile_flat(step);
        let graphed = compile_flat_with(step, CompileOptions { cuda_graph: true, ..Default::default() });
        // Trace, then (for the graph) record; the results must agree with the plain step.
        let want = step(&xs[..1])?;
        for _ in 0..3 {
            let (c, g) = (compiled(&xs[..1])?, graphed(&xs[..1])?);
            nuvec::eval(&[&c[0], &g[0], &want[0]])?;
            let (ec, eg) = (relative_error(&c[0], &want[0])?, relative_error(&g[0], &want[0])?);
            if !(ec == 0.0 && eg == 0.0) {
                return Err(nuvec::Error::Backend(format!("decode32: compiled {ec:.2e}, graph {eg:.2e} from eager")));
            }
        }
        if mode.gpu && nuvec::transforms::cuda_graphs_recorded() == 0 {
            return Err(nuvec::Error::Backend("decode32: no CUDA graph was recorded".into()));
        }
        println!("# {name}: compiled and graphed steps equal the plain one bit for bit; {} MB of weights", bytes >> 20);
        let eager = time(mode, &|i| step(&xs[i % xs.len()..][..1]))?;
        let fused = time(mode, &|i| compiled(&xs[i % xs.len()..][..1]))?;
        let graph = time(mode, &|i| graphed(&xs[i % xs.len()..][..1]))?;
        Ok((eager, fused, graph, bytes))
    })();
    let ceiling = b.copy_gbs;
    match result {
        Ok((eager, fused, graph, bytes)) => {
            let host = |t: &Timing| format!("; host {:.1} us/call", t.host * 1e6);
            let vs = format!("{}; {:.2}x eager", host(&graph), eager.median / graph.median);
            b.push(row(&format!("{name}_graph"), bytes, &graph, ceiling, None, &vs));
            b.push(row(&format!("{name}_compiled"), bytes, &fused, ceiling, None, &host(&fused)));
            b.push(row(&format!("{name}_eager"), bytes, &eager, ceiling, None, &host(&eager)));
            let ok = graph.host * 1e6 <= 20.0;
            // The host clock of a CPU run measures whole calls, not the host's share.
            if !mode.gpu {
                return;
            }
            b.push(Row {
                name: format!("{name}_graph_host_us"),
                value: graph.host * 1e6,
                unit: "us",
                fraction: None,
                target: format!("<=20 {}", if ok { "ok" } else { "MISS" }),
                detail: "host time of one graphed call: input copy, launch, result copy".into(),
            });
        }
        Err(e) => {
            for r in ["graph", "compiled", "eager"] {
                b.failed(&format!("{name}_{r}"), "GB/s", &e);
            }
        }
    }
    if mode.gpu {
        let _ = nuvec::cuda::clear_cache(0);
    }
}

// --- --small ---------------------------------------------------------------------------------

/// The `--small` run on the default device: sizes divided by [`SMALL`].
fn smoke(args: &[String]) {
    let (mut out_path, mut only) = (None::<String>, None::<String>);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--small" => {}
            "--out" => out_path = it.next().cloned(),
            "--only" => only = it.next().cloned(),
            other if !other.starts_with('-') && only.is_none() => only = Some(other.to_string()),
            other => {
                eprintln!("bench_compile: unknown argument {other:?}");
                std::process::exit(2);
            }
        }
    }
    let out = out_path.as_ref().map(|p| {
        File::create(p).unwrap_or_else(|e| {
            eprintln!("bench_compile: cannot create {p}: {e}");
            std::process::exit(2);
        })
    });
    let device = nuvec::default_device();
    let gpu = !device.is_cpu();
    let rotate_below =
        if gpu { nuvec::cuda::device_info(0).map_or(60 << 20, |i| i.l2_cache.max(60 << 20)) * 3 } else { 0 };
    println!("# bench_compile --small on {device}: every size divided by {SMALL}; the numbers are a smoke test");
    println!("{:<36} {:>12} {:<9} {:>8} {:>10}  detail", "case", "value", "unit", "of ceil", "target");
    let mut bench = Bench { only, out, rows: Vec::new(), copy_gbs: None, matmul_tflops: None, rotate_below };
    let started = Instant::now();
    with_stream(device, || run_all(&mut bench, Mode { scale: SMALL, gpu }));
    println!("# total {:.1} s", started.elapsed().as_secs_f64());
    println!("\n# name\tvalue\tunit\tfraction");
    for r in &bench.rows {
        println!("{}", r.tsv());
    }
    if bench.rows.iter().any(|r| r.value.is_nan()) {
        std::process::exit(1);
    }
}
