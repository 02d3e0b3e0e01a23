//! GPU benchmark of nuvec's CUDA backend on GPU 0: bandwidth and compute ceilings, element-wise
//! maps, row reductions, bf16 matrix products, decode GEMV and the per-operation overhead of
//! lazy graphs.
//!
//! ```text
//! cargo run --release -p nuvec --example bench_gpu                       # every case
//! cargo run --release -p nuvec --example bench_gpu -- --out gpu.tsv      # also write the TSV lines
//! cargo run --release -p nuvec --example bench_gpu -- --only gemv        # cases whose name contains "gemv"
//! ```
//!
//! Without a usable GPU it prints why and exits with status 0.
//!
//! # Method
//!
//! Inputs are pseudo-random (`sin` of a scaled `arange`, never zeros), created and evaluated
//! before timing. Each case first runs warm-up iterations (the first one loads or compiles its
//! kernels), then at least [`BATCHES`] batches of `count` iterations; an iteration records the
//! operation and calls `eval()`, and a batch ends with `nuvec::cuda::synchronize(0)`. The time
//! of one iteration is the batch's wall time divided by `count` (so launch gaps count against
//! nuvec, as they would in a real program), and the reported value is the median over batches.
//! `count` is chosen so a batch lasts about `NUVEC_BENCH_BATCH_MS` (100) ms. Where the inputs of
//! one iteration are smaller than three times the L2 cache (at least 60 MB is assumed),
//! iterations rotate among several copies of them so that the cache does not serve them.
//!
//! # Ceilings
//!
//! * `ceiling_copy_memcpy`: `nuvec::cuda::copy_bandwidth`, a 1 GiB `cuMemcpyDtoD` timed with
//!   CUDA events; bytes read plus bytes written. Every bandwidth fraction is against it.
//! * `copy_proxy_mul1_f32_256M`: `x * 1` as an element-wise "copy" (informational).
//! * `copy_concat_f32_256M`: `concatenate` of the two halves of `x`, nuvec's strided copy
//!   kernel (informational).
//! * `matmul_bf16_8192`: the compute ceiling; the fraction of the 4096 product is against it.
//!   The target (at least 95% of PyTorch's rate) is checked against `bench/gpu_peers.py`.
//!
//! # Output
//!
//! A table on stdout as cases finish, then one machine-readable line per case,
//! `name<TAB>value<TAB>unit<TAB>fraction` (fraction of the ceiling, `-` when none applies,
//! `nan` values for a case that failed), which `--out PATH` also writes (line by line, so a
//! run cut short keeps what it measured). Environment: `NUVEC_BENCH_BATCH_MS` (100),
//! `NUVEC_BENCH_BATCHES` (5, at least 3), `NUVEC_BENCH_WARMUP` (3).

use std::fs::File;
use std::io::Write;
use std::time::{Duration, Instant};

use nuvec::{Array, DType, Device, ops, with_stream};

/// Fewest timed batches per case.
const BATCHES: usize = 5;
/// Element-wise target: fraction of the copy ceiling.
const TARGET_ELEMENTWISE: f64 = 0.90;
/// Row-reduction target: fraction of the copy ceiling.
const TARGET_REDUCE: f64 = 0.85;
/// GEMV target: fraction of the copy ceiling.
const TARGET_GEMV: f64 = 0.85;
/// Lazy-graph overhead target, microseconds per operation.
const TARGET_OVERHEAD_US: f64 = 10.0;

const GPU: Device = Device::gpu(0);
/// The case whose rate is the compute ceiling (measured first, with the copy ceiling).
const CEILING_MATMUL: &str = "matmul_bf16_8192";

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn sync() -> nuvec::Result<()> {
    nuvec::cuda::synchronize(0)
}

/// Pseudo-random values in about [-1, 1] of `shape` and `dtype`, evaluated on the GPU.
fn random(shape: &[i32], dtype: DType, seed: u32) -> nuvec::Result<Array> {
    let n: i64 = shape.iter().map(|&d| d as i64).product();
    assert!(n <= i32::MAX as i64, "random: {n} elements");
    let i = ops::arange_dtype(0, n as i32, 1, DType::F32);
    let s = seed as f32 * 1.618;
    let v = (&i * 0.37f32 + s).sin() * 0.75f32 + (&i * 0.0113f32 + 2.0 * s).cos() * 0.25f32;
    let v = v.reshape(shape).astype(dtype);
    v.eval()?;
    Ok(v)
}

/// `k` random arrays of one shape.
fn randoms(k: usize, shape: &[i32], dtype: DType, seed: u32) -> nuvec::Result<Vec<Array>> {
    (0..k).map(|j| random(shape, dtype, seed + 101 * j as u32)).collect()
}

/// One timed case.
struct Timing {
    /// Median seconds per iteration.
    median: f64,
    /// Fastest batch, seconds per iteration.
    min: f64,
    /// Slowest batch, seconds per iteration.
    max: f64,
    /// Iterations per batch.
    count: usize,
    /// Batches.
    batches: usize,
}

impl Timing {
    /// A timing measured elsewhere as one median.
    fn from_seconds(s: f64) -> Timing {
        Timing { median: s, min: s, max: s, count: 1, batches: 1 }
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { 0.5 * (v[n / 2 - 1] + v[n / 2]) }
}

/// Times `run(i)` (which does the work of iteration `i`: record and `eval`), in batches that
/// end with a synchronize.
fn time_batches(run: &mut dyn FnMut(usize) -> nuvec::Result<()>) -> nuvec::Result<Timing> {
    let warmup: usize = env_or("NUVEC_BENCH_WARMUP", 3).max(1);
    let batches: usize = env_or("NUVEC_BENCH_BATCHES", BATCHES).max(3);
    let batch_time = Duration::from_secs_f64(env_or("NUVEC_BENCH_BATCH_MS", 100.0) / 1e3);
    let mut i = 0usize;
    for _ in 0..warmup {
        run(i)?;
        i += 1;
    }
    sync()?;
    // Estimate the time of one iteration from a short batch.
    let probe = 2;
    let t = Instant::now();
    for _ in 0..probe {
        run(i)?;
        i += 1;
    }
    sync()?;
    let each = t.elapsed().as_secs_f64() / probe as f64;
    let count = ((batch_time.as_secs_f64() / each.max(1e-7)) as usize).clamp(3, 5000);
    let mut per = Vec::with_capacity(batches);
    for _ in 0..batches {
        let t = Instant::now();
        for _ in 0..count {
            run(i)?;
            i += 1;
        }
        sync()?;
        per.push(t.elapsed().as_secs_f64() / count as f64);
    }
    let (min, max) = per.iter().fold((f64::MAX, 0.0f64), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    Ok(Timing { median: median(&mut per), min, max, count, batches })
}

/// Times an operation over rotating inputs: iteration `i` records `op(i)` and evaluates it.
fn time_op(op: &dyn Fn(usize) -> Array) -> nuvec::Result<Timing> {
    time_batches(&mut |i| {
        let y = op(i);
        y.eval()
    })
}

/// A result row.
struct Row {
    name: String,
    value: f64,
    unit: &'static str,
    fraction: Option<f64>,
    target: String,
    detail: String,
}

impl Row {
    fn tsv(&self) -> String {
        let f = self.fraction.map_or("-".to_string(), |f| format!("{f:.4}"));
        format!("{}\t{:.4}\t{}\t{}", self.name, self.value, self.unit, f)
    }
}

/// The benchmark's state: options, ceilings found so far, rows written.
struct Bench {
    only: Option<String>,
    out: Option<File>,
    rows: Vec<Row>,
    /// Copy ceiling, GB/s (bytes read + written).
    copy_gbs: Option<f64>,
    /// bf16 matmul ceiling, TFLOP/s.
    matmul_tflops: Option<f64>,
    /// Bytes of inputs under which iterations rotate among copies (3× L2).
    rotate_below: usize,
}

impl Bench {
    fn wanted(&self, name: &str) -> bool {
        self.only.as_deref().is_none_or(|f| name.contains(f))
    }

    /// Copies needed so one iteration's inputs do not stay in L2 (1 to 8).
    fn copies(&self, input_bytes: usize) -> usize {
        self.rotate_below.div_ceil(input_bytes.max(1)).clamp(1, 8)
    }

    fn push(&mut self, row: Row) {
        let f = row.fraction.map_or("-".to_string(), |f| format!("{:.1}%", 100.0 * f));
        println!("{:<36} {:>12.3} {:<9} {:>8} {:>10}  {}", row.name, row.value, row.unit, f, row.target, row.detail);
        if let Some(file) = self.out.as_mut() {
            let _ = writeln!(file, "{}", row.tsv());
            let _ = file.flush();
        }
        self.rows.push(row);
    }

    fn failed(&mut self, name: &str, unit: &'static str, e: &nuvec::Error) {
        eprintln!("# {name} FAILED: {e}");
        self.push(Row {
            name: name.into(),
            value: f64::NAN,
            unit,
            fraction: None,
            target: String::new(),
            detail: format!("FAILED: {}", e.to_string().lines().next().unwrap_or("")),
        });
    }

    fn detail(t: &Timing) -> String {
        format!(
            "median {:.4} ms (min {:.4}, max {:.4}; {}x{})",
            t.median * 1e3,
            t.min * 1e3,
            t.max * 1e3,
            t.batches,
            t.count
        )
    }

    /// A bandwidth case: `bytes` moved (read + written) per iteration.
    fn bandwidth(
        &mut self,
        name: &str,
        bytes: f64,
        target: Option<f64>,
        setup: impl FnOnce() -> nuvec::Result<Box<dyn Fn(usize) -> Array>>,
    ) {
        if !self.wanted(name) {
            return;
        }
        let result = setup().and_then(|op| time_op(&*op));
        self.bandwidth_row(name, bytes, target, result);
        let _ = nuvec::cuda::clear_cache(0);
    }

    fn bandwidth_row(&mut self, name: &str, bytes: f64, target: Option<f64>, result: nuvec::Result<Timing>) {
        match result {
            Ok(t) => {
                let gbs = bytes / t.median / 1e9;
                let fraction = self.copy_gbs.map(|c| gbs / c);
                let target = target.map_or(String::new(), |g| {
                    let ok = fraction.is_some_and(|f| f >= g);
                    format!(">={:.0}% {}", 100.0 * g, if ok { "ok" } else { "MISS" })
                });
                self.push(Row {
                    name: name.into(),
                    value: gbs,
                    unit: "GB/s",
                    fraction,
                    target,
                    detail: Self::detail(&t),
                });
            }
            Err(e) => self.failed(name, "GB/s", &e),
        }
    }

    /// A matrix-product case of `flops` per iteration.
    fn compute(&mut self, name: &str, flops: f64, setup: impl FnOnce() -> nuvec::Result<Box<dyn Fn(usize) -> Array>>) {
        if !self.wanted(name) {
            return;
        }
        let result = setup().and_then(|op| time_op(&*op));
        let _ = nuvec::cuda::clear_cache(0);
        match result {
            Ok(t) => {
                let tflops = flops / t.median / 1e12;
                if name == CEILING_MATMUL {
                    self.matmul_tflops = Some(tflops);
                }
                let fraction = self.matmul_tflops.map(|c| tflops / c);
                self.push(Row {
                    name: name.into(),
                    value: tflops,
                    unit: "TFLOP/s",
                    fraction,
                    target: ">=95% torch".into(),
                    detail: Self::detail(&t),
                });
            }
            Err(e) => self.failed(name, "TFLOP/s", &e),
        }
    }
}

fn gib(bytes: usize) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut out_path, mut only) = (None::<String>, None::<String>);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--out" => out_path = args.next(),
            "--only" => only = args.next(),
            "-h" | "--help" => {
                println!("usage: bench_gpu [--out PATH] [--only SUBSTRING]");
                return;
            }
            other if !other.starts_with('-') && only.is_none() => only = Some(other.to_string()),
            other => {
                eprintln!("bench_gpu: unknown argument {other:?}");
                std::process::exit(2);
            }
        }
    }

    if !nuvec::cuda::is_available() {
        let why = nuvec::cuda::unavailable_reason().unwrap_or_else(|| "unknown reason".into());
        println!("bench_gpu: no usable CUDA GPU: {why}");
        return;
    }

    let out = out_path.as_ref().map(|p| match File::create(p) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("bench_gpu: cannot create {p}: {e}");
            std::process::exit(2);
        }
    });

    let info = match nuvec::cuda::device_info(0) {
        Ok(i) => i,
        Err(e) => {
            println!("bench_gpu: GPU 0 cannot be opened: {e}");
            std::process::exit(1);
        }
    };
    let l2 = info.l2_cache.max(60 << 20);
    println!(
        "# GPU 0: {} (sm_{}{}), {} SMs, {:.1} GiB, L2 {:.1} MB",
        info.name,
        info.compute_capability.0,
        info.compute_capability.1,
        info.multiprocessors,
        gib(info.total_memory),
        info.l2_cache as f64 / 1e6
    );
    match nuvec_cuda::compile::nvrtc_version() {
        Ok((a, b)) => println!("# NVRTC {a}.{b}; kernel cache {:?}", nuvec_cuda::compile::cache_dir()),
        Err(e) => println!("# NVRTC: {e}"),
    }
    println!(
        "# {} batches (>= 3) of ~{} ms each, median of per-iteration time = batch time / count",
        env_or("NUVEC_BENCH_BATCHES", BATCHES).max(3),
        env_or("NUVEC_BENCH_BATCH_MS", 100.0)
    );
    println!("{:<36} {:>12} {:<9} {:>8} {:>10}  detail", "case", "value", "unit", "of ceil", "target");

    let mut bench = Bench { only, out, rows: Vec::new(), copy_gbs: None, matmul_tflops: None, rotate_below: 3 * l2 };
    let started = Instant::now();
    with_stream(GPU, || run_all(&mut bench));
    if let Ok(m) = nuvec::cuda::memory(0) {
        println!("# GPU memory: peak {:.2} GiB held by arrays", gib(m.peak));
    }
    println!("# total {:.1} s", started.elapsed().as_secs_f64());
    println!("# libraries: {}", loaded_cuda_libraries().join(" "));

    println!("\n# name\tvalue\tunit\tfraction");
    for r in &bench.rows {
        println!("{}", r.tsv());
    }
    if bench.rows.iter().any(|r| r.value.is_nan()) {
        std::process::exit(1);
    }
}

/// The CUDA libraries this process loaded (from `/proc/self/maps`), to tell which NVRTC and
/// cuBLASLt were used.
fn loaded_cuda_libraries() -> Vec<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let mut libs: Vec<String> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| ["libcuda.so", "libnvrtc", "libcublasLt"].iter().any(|n| p.contains(n)))
        .map(str::to_string)
        .collect();
    libs.sort();
    libs.dedup();
    libs
}

fn run_all(b: &mut Bench) {
    ceilings(b);
    elementwise(b);
    reductions(b);
    matmuls(b);
    gemv(b);
    overhead(b);
}

/// Copy ceiling (true device copy), its proxies, and the bf16 matmul ceiling.
fn ceilings(b: &mut Bench) {
    let n: i32 = 1 << 28; // 256M f32 = 1 GiB
    let bytes = 2.0 * 4.0 * n as f64;
    let needs_x =
        ["ceiling_copy_memcpy", "copy_proxy_mul1_f32_256M", "copy_concat_f32_256M"].iter().any(|c| b.wanted(c));
    // The copy ceiling is needed for every fraction: always measure it.
    let x = match random(&[n], DType::F32, 1) {
        Ok(x) => x,
        Err(e) => {
            b.failed("ceiling_copy_memcpy", "GB/s", &e);
            return;
        }
    };
    // cuMemcpyDtoD of 1 GiB timed with CUDA events; set first, so its own row reads 100%.
    let r = nuvec::cuda::copy_bandwidth(0, bytes as usize / 2, 20).map(|gbs| Timing::from_seconds(bytes / (gbs * 1e9)));
    b.copy_gbs = r.as_ref().ok().map(|t| bytes / t.median / 1e9);
    b.bandwidth_row("ceiling_copy_memcpy", bytes, None, r);
    if needs_x {
        let xc = x.clone();
        b.bandwidth("copy_proxy_mul1_f32_256M", bytes, None, move || {
            let one = Array::scalar(1.0f32, DType::F32);
            one.eval()?;
            Ok(Box::new(move |_| &xc * &one))
        });
        let xc = x.clone();
        b.bandwidth("copy_concat_f32_256M", bytes, None, move || {
            let h = n / 2;
            let (lo, hi) = (xc.slice(&[0], &[h], &[1]), xc.slice(&[h], &[n], &[1]));
            nuvec::eval(&(&lo, &hi))?;
            Ok(Box::new(move |_| ops::concatenate(&[lo.clone(), hi.clone()], 0)))
        });
    }
    drop(x);
    let _ = nuvec::cuda::clear_cache(0);
    // Compute ceiling: the 8192³ bf16 product (also reported with the matmul cases).
    matmul_case(b, 8192);
}

fn matmul_case(b: &mut Bench, n: i32) {
    let name = format!("matmul_bf16_{n}");
    let flops = 2.0 * (n as f64).powi(3);
    let bytes = 2 * 2 * (n as usize) * (n as usize);
    let k = b.copies(bytes);
    b.compute(&name, flops, || {
        let a = randoms(k, &[n, n], DType::BF16, 10)?;
        let w = randoms(k, &[n, n], DType::BF16, 20)?;
        Ok(Box::new(move |i| a[i % k].matmul(&w[i % k])))
    });
}

/// `a + b` and `a * b`, f32 and bf16, 64M and 256M elements.
fn elementwise(b: &mut Bench) {
    for (n, tag) in [(1i32 << 26, "64M"), (1i32 << 28, "256M")] {
        for (dtype, dname) in [(DType::F32, "f32"), (DType::BF16, "bf16")] {
            let names = [format!("add_{dname}_{tag}"), format!("mul_{dname}_{tag}")];
            if !names.iter().any(|c| b.wanted(c)) {
                continue;
            }
            let size = dtype.size();
            let input_bytes = 2 * n as usize * size;
            let k = b.copies(input_bytes);
            let inputs = randoms(k, &[n], dtype, 30).and_then(|a| Ok((a, randoms(k, &[n], dtype, 40)?)));
            let (xs, ys) = match inputs {
                Ok(v) => v,
                Err(e) => {
                    b.failed(&names[0], "GB/s", &e);
                    continue;
                }
            };
            let bytes = 3.0 * n as f64 * size as f64;
            for (which, name) in names.iter().enumerate() {
                let (xs, ys) = (xs.clone(), ys.clone());
                b.bandwidth(name, bytes, Some(TARGET_ELEMENTWISE), move || {
                    let op: Box<dyn Fn(usize) -> Array> = if which == 0 {
                        Box::new(move |i| &xs[i % k] + &ys[i % k])
                    } else {
                        Box::new(move |i| &xs[i % k] * &ys[i % k])
                    };
                    Ok(op)
                });
            }
        }
    }
}

/// Row reductions over the last axis.
fn reductions(b: &mut Bench) {
    for (rows, cols) in [(16384i32, 4096i32), (4096, 16384)] {
        for (dtype, dname) in [(DType::F32, "f32"), (DType::BF16, "bf16")] {
            let names: Vec<String> =
                ["sum", "max", "logsumexp"].iter().map(|op| format!("{op}_rows_{dname}_{rows}x{cols}")).collect();
            if !names.iter().any(|c| b.wanted(c)) {
                continue;
            }
            let size = dtype.size();
            let input_bytes = rows as usize * cols as usize * size;
            let k = b.copies(input_bytes);
            let xs = match randoms(k, &[rows, cols], dtype, 50) {
                Ok(v) => v,
                Err(e) => {
                    b.failed(&names[0], "GB/s", &e);
                    continue;
                }
            };
            let bytes = (input_bytes + rows as usize * size) as f64;
            for (which, name) in names.iter().enumerate() {
                let xs = xs.clone();
                b.bandwidth(name, bytes, Some(TARGET_REDUCE), move || {
                    let op: Box<dyn Fn(usize) -> Array> = match which {
                        0 => Box::new(move |i| xs[i % k].sum(-1)),
                        1 => Box::new(move |i| xs[i % k].max(-1)),
                        _ => Box::new(move |i| xs[i % k].logsumexp(-1)),
                    };
                    Ok(op)
                });
            }
        }
    }
}

fn matmuls(b: &mut Bench) {
    matmul_case(b, 4096);
}

/// Decode GEMV: `x[1, 4096] @ W[4096, 14336]` and `x @ W2[14336, 4096].t()`, bf16.
fn gemv(b: &mut Bench) {
    let (k_dim, n_dim) = (4096i32, 14336i32);
    let w_bytes = k_dim as usize * n_dim as usize * 2;
    let bytes = (w_bytes + 2 * (k_dim + n_dim) as usize) as f64;
    let copies = b.copies(w_bytes);
    let x = random(&[1, k_dim], DType::BF16, 60);
    let x = match x {
        Ok(x) => x,
        Err(e) => return b.failed("gemv_bf16_4096x14336", "GB/s", &e),
    };
    let xc = x.clone();
    b.bandwidth("gemv_bf16_4096x14336", bytes, Some(TARGET_GEMV), move || {
        let ws = randoms(copies, &[k_dim, n_dim], DType::BF16, 70)?;
        Ok(Box::new(move |i| xc.matmul(&ws[i % copies])))
    });
    b.bandwidth("gemv_bf16_4096x14336_wt", bytes, Some(TARGET_GEMV), move || {
        let ws = randoms(copies, &[n_dim, k_dim], DType::BF16, 80)?;
        Ok(Box::new(move |i| x.matmul(&ws[i % copies].t())))
    });
}

/// Per-operation cost of a lazy graph of 1000 tiny element-wise ops on `[16]` f32.
fn overhead(b: &mut Bench) {
    const OPS: usize = 1000;
    let (n1, n2) = ("overhead_record_eval_1000x16", "overhead_record_only_1000x16");
    if !b.wanted(n1) && !b.wanted(n2) {
        return;
    }
    let inputs = (|| -> nuvec::Result<(Array, Array, Array)> {
        let x = random(&[16], DType::F32, 90)?;
        let a = random(&[16], DType::F32, 91)? * 0.05f32 + 0.95f32;
        let c = random(&[16], DType::F32, 92)? * 0.1f32;
        nuvec::eval(&(&a, &c))?;
        Ok((x, a, c))
    })();
    let (x, a, c) = match inputs {
        Ok(v) => v,
        Err(e) => return b.failed(n1, "us/op", &e),
    };
    // y ← y·a, then y ← y + c, alternately: values stay bounded.
    let chain = || {
        let mut y = x.clone();
        for i in 0..OPS {
            y = if i % 2 == 0 { &y * &a } else { &y + &c };
        }
        y
    };
    let row = |name: &str, t: &Timing| Row {
        name: name.into(),
        value: t.median * 1e6 / OPS as f64,
        unit: "us/op",
        fraction: None,
        target: format!(
            "<={TARGET_OVERHEAD_US:.0}us {}",
            if t.median * 1e6 / OPS as f64 <= TARGET_OVERHEAD_US { "ok" } else { "MISS" }
        ),
        detail: format!("median {:.3} ms per {OPS}-op chain ({}x{})", t.median * 1e3, t.batches, t.count),
    };
    if b.wanted(n1) {
        match time_batches(&mut |_| chain().eval()) {
            Ok(t) => b.push(row(n1, &t)),
            Err(e) => b.failed(n1, "us/op", &e),
        }
    }
    if b.wanted(n2) {
        // Recording alone: the clock stops before the graph is dropped.
        let mut samples = Vec::new();
        for batch in 0..(BATCHES + 1) {
            let reps = 20;
            let mut spent = Duration::ZERO;
            for _ in 0..reps {
                let t = Instant::now();
                let y = std::hint::black_box(chain());
                spent += t.elapsed();
                drop(y);
            }
            if batch > 0 {
                samples.push(spent.as_secs_f64() / reps as f64); // batch 0 is the warm-up
            }
        }
        let (min, max) = samples.iter().fold((f64::MAX, 0.0f64), |(lo, hi), &v| (lo.min(v), hi.max(v)));
        let t = Timing { median: median(&mut samples), min, max, count: 20, batches: BATCHES };
        b.push(row(n2, &t));
    }
}
