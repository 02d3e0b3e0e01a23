//! The harness shared by the GPU benchmark examples (`bench_gpu`, `bench_fast`): command line,
//! device header, pseudo-random inputs, batch timing, the copy ceiling, and the result table and
//! TSV lines. Each example includes it with `mod bench_harness;` (Cargo does not build a folder
//! without `main.rs` as an example of its own).
//!
//! Method: each case first runs warm-up iterations (the first one loads or compiles its
//! kernels), then at least [`BATCHES`] batches of `count` iterations; an iteration records the
//! operation and evaluates it, and a batch ends with `nuvec::cuda::synchronize(0)`. The time of
//! one iteration is the batch's wall time divided by `count` (so launch gaps count against
//! nuvec, as they would in a real program), and the reported value is the median over batches.
//! `count` is chosen so a batch lasts about `NUVEC_BENCH_BATCH_MS` (100) ms. Where the inputs of
//! one iteration are smaller than three times the L2 cache (at least 60 MB is assumed),
//! iterations rotate among several copies of them so that the cache does not serve them.

// Each example uses a different part of the harness; what one leaves unused is not dead.
#![allow(dead_code)]

use std::fs::File;
use std::io::Write;
use std::time::{Duration, Instant};

use nuvec::{Array, DType, Device, ops, with_stream};

/// Fewest timed batches per case.
pub const BATCHES: usize = 5;

/// The device every case runs on.
pub const GPU: Device = Device::gpu(0);

/// The case whose rate is the compute ceiling (measured first, with the copy ceiling).
pub const CEILING_MATMUL: &str = "matmul_bf16_8192";

/// The copy ceiling's case name; every bandwidth fraction is against its rate.
pub const CEILING_COPY: &str = "ceiling_copy_memcpy";

/// `name` parsed from the environment, or `default` when unset or unparsable.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Waits for the work queued on GPU 0.
pub fn sync() -> nuvec::Result<()> {
    nuvec::cuda::synchronize(0)
}

/// Pseudo-random values in about [-1, 1] of `shape` and `dtype`, evaluated on the GPU.
pub fn random(shape: &[i32], dtype: DType, seed: u32) -> nuvec::Result<Array> {
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
pub fn randoms(k: usize, shape: &[i32], dtype: DType, seed: u32) -> nuvec::Result<Vec<Array>> {
    (0..k).map(|j| random(shape, dtype, seed + 101 * j as u32)).collect()
}

/// Calls per batch whose host time is measured.
const HOST_PROBES: usize = 32;

/// One timed case.
pub struct Timing {
    /// Median seconds per iteration.
    pub median: f64,
    /// Fastest batch, seconds per iteration.
    pub min: f64,
    /// Slowest batch, seconds per iteration.
    pub max: f64,
    /// Iterations per batch.
    pub count: usize,
    /// Batches.
    pub batches: usize,
    /// Median host seconds of one iteration's call (recording, tracing and launching, until
    /// `eval` returns), over the first `HOST_PROBES` calls of each batch, while the launch queue
    /// is short (a full queue blocks the call for the GPU's time): near `median`, the case is
    /// bound by the host, not the GPU. NaN where not measured.
    pub host: f64,
}

impl Timing {
    /// A timing measured elsewhere as one median.
    pub fn from_seconds(s: f64) -> Timing {
        Timing { median: s, min: s, max: s, count: 1, batches: 1, host: f64::NAN }
    }
}

/// The median of `v` (sorted in place).
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { 0.5 * (v[n / 2 - 1] + v[n / 2]) }
}

/// Times `run(i)` (which does the work of iteration `i`: record and `eval`), in batches that
/// end with a synchronize.
pub fn time_batches(run: &mut dyn FnMut(usize) -> nuvec::Result<()>) -> nuvec::Result<Timing> {
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
    let mut host = Vec::with_capacity(batches * count);
    for _ in 0..batches {
        let t = Instant::now();
        for j in 0..count {
            let call = Instant::now();
            run(i)?;
            // Early in a batch, before the launch queue can fill and block the host.
            if j < HOST_PROBES {
                host.push(call.elapsed().as_secs_f64());
            }
            i += 1;
        }
        sync()?;
        per.push(t.elapsed().as_secs_f64() / count as f64);
    }
    if std::env::var_os("NUVEC_BENCH_VERBOSE").is_some() {
        let ms: Vec<String> = per.iter().map(|s| format!("{:.4}", s * 1e3)).collect();
        eprintln!("batches (ms per iteration): {}", ms.join(" "));
    }
    let (min, max) = per.iter().fold((f64::MAX, 0.0f64), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    Ok(Timing { median: median(&mut per), min, max, count, batches, host: median(&mut host) })
}

/// Times an operation over rotating inputs: iteration `i` records `op(i)` and evaluates it.
pub fn time_op(op: &dyn Fn(usize) -> Array) -> nuvec::Result<Timing> {
    time_batches(&mut |i| {
        let y = op(i);
        y.eval()
    })
}

/// An operation with several outputs (a value and its gradients, say): iteration `i` records
/// them from its inputs; all are evaluated together, in one `eval`.
pub type Outputs = Box<dyn Fn(usize) -> nuvec::Result<Vec<Array>>>;

/// Times an [`Outputs`] operation: iteration `i` records `op(i)` and evaluates every output in
/// one call, so the graph is scheduled as a whole.
pub fn time_outputs(op: &dyn Fn(usize) -> nuvec::Result<Vec<Array>>) -> nuvec::Result<Timing> {
    time_batches(&mut |i| nuvec::eval(&op(i)?))
}

/// A result row.
pub struct Row {
    /// Case name (the TSV key that the PyTorch peers share).
    pub name: String,
    /// Measured value, NaN for a case that failed.
    pub value: f64,
    /// Unit of `value`.
    pub unit: &'static str,
    /// Fraction of the relevant ceiling, if one applies.
    pub fraction: Option<f64>,
    /// The target and whether it was met, for the table.
    pub target: String,
    /// Timing details, for the table.
    pub detail: String,
}

impl Row {
    /// The machine-readable line: `name<TAB>value<TAB>unit<TAB>fraction`.
    pub fn tsv(&self) -> String {
        let f = self.fraction.map_or("-".to_string(), |f| format!("{f:.4}"));
        format!("{}\t{:.4}\t{}\t{}", self.name, self.value, self.unit, f)
    }
}

/// The benchmark's state: options, ceilings found so far, rows written.
pub struct Bench {
    /// Only cases whose name contains it run.
    pub only: Option<String>,
    /// Where TSV lines also go, line by line.
    pub out: Option<File>,
    /// Rows so far.
    pub rows: Vec<Row>,
    /// Copy ceiling, GB/s (bytes read + written).
    pub copy_gbs: Option<f64>,
    /// bf16 matmul ceiling, TFLOP/s.
    pub matmul_tflops: Option<f64>,
    /// Bytes of inputs under which iterations rotate among copies (3× L2).
    pub rotate_below: usize,
}

impl Bench {
    /// Whether the case `name` was asked for.
    pub fn wanted(&self, name: &str) -> bool {
        self.only.as_deref().is_none_or(|f| name.contains(f))
    }

    /// Copies needed so one iteration's inputs do not stay in L2 (1 to 8).
    pub fn copies(&self, input_bytes: usize) -> usize {
        self.rotate_below.div_ceil(input_bytes.max(1)).clamp(1, 8)
    }

    /// Prints `row` to the table, writes its TSV line to `--out`, and keeps it.
    pub fn push(&mut self, row: Row) {
        let f = row.fraction.map_or("-".to_string(), |f| format!("{:.1}%", 100.0 * f));
        println!("{:<36} {:>12.3} {:<9} {:>8} {:>10}  {}", row.name, row.value, row.unit, f, row.target, row.detail);
        if let Some(file) = self.out.as_mut() {
            let _ = writeln!(file, "{}", row.tsv());
            let _ = file.flush();
        }
        self.rows.push(row);
    }

    /// A NaN row for a case that failed.
    pub fn failed(&mut self, name: &str, unit: &'static str, e: &nuvec::Error) {
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

    /// The table's timing column.
    pub fn detail(t: &Timing) -> String {
        format!(
            "median {:.4} ms (min {:.4}, max {:.4}; {}x{}; host {:.4})",
            t.median * 1e3,
            t.min * 1e3,
            t.max * 1e3,
            t.batches,
            t.count,
            t.host * 1e3
        )
    }

    /// A bandwidth case: `bytes` moved (read + written) per iteration.
    pub fn bandwidth(
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

    /// A bandwidth case of several outputs evaluated together, `bytes` moved per iteration.
    /// With `latency`, a second row `<name>_us` gives the microseconds per call, the useful
    /// figure where launches rather than memory bound the time.
    pub fn bandwidth_outputs(
        &mut self,
        name: &str,
        bytes: f64,
        target: Option<f64>,
        latency: bool,
        setup: impl FnOnce() -> nuvec::Result<Outputs>,
    ) {
        let us_name = format!("{name}_us");
        let wanted = self.wanted(name) || (latency && self.wanted(&us_name));
        if !wanted {
            return;
        }
        let result = setup().and_then(|op| time_outputs(&*op));
        let micros = result.as_ref().ok().map(|t| (t.median * 1e6, Self::detail(t)));
        self.bandwidth_row(name, bytes, target, result);
        if latency {
            match micros {
                Some((value, detail)) => {
                    self.push(Row { name: us_name, value, unit: "us", fraction: None, target: String::new(), detail })
                }
                None => self.push(Row {
                    name: us_name,
                    value: f64::NAN,
                    unit: "us",
                    fraction: None,
                    target: String::new(),
                    detail: "FAILED (see above)".into(),
                }),
            }
        }
        let _ = nuvec::cuda::clear_cache(0);
    }

    /// The row of a bandwidth case from its timing: GB/s, fraction of the copy ceiling, and
    /// whether it meets `target` (a fraction of the copy ceiling).
    pub fn bandwidth_row(&mut self, name: &str, bytes: f64, target: Option<f64>, result: nuvec::Result<Timing>) {
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
    pub fn compute(
        &mut self,
        name: &str,
        flops: f64,
        setup: impl FnOnce() -> nuvec::Result<Box<dyn Fn(usize) -> Array>>,
    ) {
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

/// Measures the copy ceiling (`ceiling_copy_memcpy`, whatever `--only` says: every fraction
/// needs it): a 1 GiB `cuMemcpyDtoD` timed with CUDA events, bytes read plus bytes written.
pub fn copy_ceiling(b: &mut Bench) {
    let bytes = 2.0 * f64::from(1u32 << 30);
    let r = copy_bandwidth(0, bytes as usize / 2, 20).map(|gbs| Timing::from_seconds(bytes / (gbs * 1e9)));
    // Set before the row is pushed, so the ceiling's own row reads 100%.
    b.copy_gbs = r.as_ref().ok().map(|t| bytes / t.median / 1e9);
    b.bandwidth_row(CEILING_COPY, bytes, None, r);
}

/// The device-to-device copy bandwidth of GPU `index` in GB/s (bytes read plus bytes written),
/// measured with `cuMemcpyDtoD` of `bytes` between two fresh buffers in the device's primary
/// context (the one the backend uses): the ceiling memory-bound kernels are compared with.
/// Median of `iters` copies timed with CUDA events after 3 warm-up copies.
pub fn copy_bandwidth(index: u32, bytes: usize, iters: usize) -> nuvec::Result<f64> {
    use cudarc::driver::sys;
    let check = |status: sys::CUresult, what: &str| match status {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        e => Err(nuvec::Error::Backend(format!("{what} failed: {e:?}"))),
    };
    let mut times = Vec::with_capacity(iters);
    // SAFETY: the context is the device's primary one, retained and released here; the
    // buffers, stream and events are created, used and destroyed here, and the copies stay
    // inside the two buffers of `bytes` each.
    unsafe {
        check(sys::cuInit(0), "cuInit")?;
        let mut dev = 0;
        check(sys::cuDeviceGet(&mut dev, index as i32), "cuDeviceGet")?;
        let mut ctx = std::ptr::null_mut();
        check(sys::cuDevicePrimaryCtxRetain(&mut ctx, dev), "cuDevicePrimaryCtxRetain")?;
        check(sys::cuCtxSetCurrent(ctx), "cuCtxSetCurrent")?;
        let mut stream = std::ptr::null_mut();
        check(sys::cuStreamCreate(&mut stream, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32), "cuStreamCreate")?;
        let (mut src, mut dst) = (0, 0);
        check(sys::cuMemAlloc_v2(&mut src, bytes), "cuMemAlloc")?;
        check(sys::cuMemAlloc_v2(&mut dst, bytes), "cuMemAlloc")?;
        let mut start = std::ptr::null_mut();
        let mut end = std::ptr::null_mut();
        check(sys::cuEventCreate(&mut start, 0), "cuEventCreate")?;
        check(sys::cuEventCreate(&mut end, 0), "cuEventCreate")?;
        // Non-zero contents, so compressible memory cannot flatter the number.
        check(sys::cuMemsetD32Async(src, 0x3f8ccccd, bytes / 4, stream), "cuMemsetD32Async")?;
        for i in 0..iters + 3 {
            check(sys::cuEventRecord(start, stream), "cuEventRecord")?;
            check(sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, stream), "cuMemcpyDtoDAsync")?;
            check(sys::cuEventRecord(end, stream), "cuEventRecord")?;
            check(sys::cuEventSynchronize(end), "cuEventSynchronize")?;
            let mut ms = 0f32;
            check(sys::cuEventElapsedTime_v2(&mut ms, start, end), "cuEventElapsedTime")?;
            if i >= 3 {
                times.push(ms as f64);
            }
        }
        sys::cuEventDestroy_v2(start);
        sys::cuEventDestroy_v2(end);
        sys::cuMemFree_v2(src);
        sys::cuMemFree_v2(dst);
        sys::cuStreamDestroy_v2(stream);
        sys::cuDevicePrimaryCtxRelease_v2(dev);
    }
    times.sort_by(|a, b| a.total_cmp(b));
    let ms = times.get(times.len() / 2).copied().unwrap_or(f64::NAN);
    Ok(2.0 * bytes as f64 / (ms * 1e-3) / 1e9)
}

/// Bytes as GiB.
pub fn gib(bytes: usize) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// The whole run of a benchmark example called `prog`: parses `--out PATH` and `--only
/// SUBSTRING` (or a bare substring), prints the GPU, NVRTC and method header and the table's
/// heading, calls `run_all` on GPU 0's stream, then prints memory, time, libraries and every
/// TSV line again. Exits with status 0 without a usable GPU, 1 when a case failed.
pub fn main_with(prog: &str, run_all: impl FnOnce(&mut Bench)) {
    let mut args = std::env::args().skip(1);
    let (mut out_path, mut only) = (None::<String>, None::<String>);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--out" => out_path = args.next(),
            "--only" => only = args.next(),
            "-h" | "--help" => {
                println!("usage: {prog} [--out PATH] [--only SUBSTRING]");
                return;
            }
            other if !other.starts_with('-') && only.is_none() => only = Some(other.to_string()),
            other => {
                eprintln!("{prog}: unknown argument {other:?}");
                std::process::exit(2);
            }
        }
    }

    if !nuvec::cuda::is_available() {
        let why = nuvec::cuda::unavailable_reason().unwrap_or_else(|| "unknown reason".into());
        println!("{prog}: no usable CUDA GPU: {why}");
        return;
    }

    let out = out_path.as_ref().map(|p| match File::create(p) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("{prog}: cannot create {p}: {e}");
            std::process::exit(2);
        }
    });

    let info = match nuvec::cuda::device_info(0) {
        Ok(i) => i,
        Err(e) => {
            println!("{prog}: GPU 0 cannot be opened: {e}");
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
pub fn loaded_cuda_libraries() -> Vec<String> {
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
