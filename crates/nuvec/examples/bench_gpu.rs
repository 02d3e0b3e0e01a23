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
//! The harness is `bench_harness/mod.rs`, shared with the `bench_fast` example.
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
//! * `ceiling_copy_memcpy`: `bench_harness::copy_bandwidth`, a 1 GiB `cuMemcpyDtoD` timed with
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

mod bench_harness;

use std::time::{Duration, Instant};

use bench_harness::{BATCHES, Bench, Row, Timing, copy_ceiling, median, random, randoms, time_batches};
use nuvec::{Array, DType, ops};

/// Element-wise target: fraction of the copy ceiling.
const TARGET_ELEMENTWISE: f64 = 0.90;
/// Row-reduction target: fraction of the copy ceiling.
const TARGET_REDUCE: f64 = 0.85;
/// GEMV target: fraction of the copy ceiling.
const TARGET_GEMV: f64 = 0.85;
/// Lazy-graph overhead target, microseconds per operation.
const TARGET_OVERHEAD_US: f64 = 10.0;

fn main() {
    bench_harness::main_with("bench_gpu", run_all);
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
    // cuMemcpyDtoD of 1 GiB (the harness's copy ceiling), as many bytes as the proxies move.
    copy_ceiling(b);
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
        let t = Timing { median: median(&mut samples), min, max, count: 20, batches: BATCHES, host: f64::NAN };
        b.push(row(n2, &t));
    }
}
