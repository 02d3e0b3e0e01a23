//! CPU speed benchmark of nuvec's core operations (matrix products, element-wise maps,
//! reductions and softmax on large arrays) and of the fused operations of `nuvec::fast` (the
//! `fast_*` cases; with `NUVEC_FUSED=0` they run as their compositions).
//!
//! Every input is random, created and evaluated before timing. Each timed iteration records
//! the operation and evaluates it; after a warm-up, iterations repeat until at least
//! `NUVEC_BENCH_MIN_ITERS` (10) have run and `NUVEC_BENCH_SECS` (2) seconds have passed, and
//! the median is reported. One machine-readable line per case goes to stdout:
//! `name<TAB>median_ms`; details (iterations, minimum) go to stderr. Everything runs on the
//! CPU device, whatever the default device is.
//!
//! ```text
//! cargo run --release -p nuvec --example bench_cpu            # every case
//! cargo run --release -p nuvec --example bench_cpu -- matmul  # cases whose name contains "matmul"
//! ```
//!
//! `bench/cpu_vs_peers.py` runs the same cases in MLX and NumPy and tabulates them;
//! `bench/cpu_attention_peers.py` the attention cases (`fast_sdpa_*`) in PyTorch and MLX.

use std::time::{Duration, Instant};

use nuvec::fast::AttentionOptions;
use nuvec::{Array, DType, Device, fast};

/// Uniform pseudo-random `f32` values in `[lo, hi)` (xorshift64*), as an evaluated array.
fn random(shape: &[i32], lo: f32, hi: f32, seed: u64) -> Array {
    let n: usize = shape.iter().map(|&d| d as usize).product();
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let data: Vec<f32> = (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            let u = (s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 24) as f32;
            lo + (hi - lo) * u
        })
        .collect();
    let a = Array::from_slice(&data, shape);
    a.eval().expect("input evaluates");
    a
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Times `op` (record and evaluate); returns the median and minimum in milliseconds and the
/// number of timed iterations.
fn time(op: &dyn Fn() -> Array) -> (f64, f64, usize) {
    let min_iters: usize = env_or("NUVEC_BENCH_MIN_ITERS", 10);
    let budget = Duration::from_secs_f64(env_or("NUVEC_BENCH_SECS", 2.0));
    let max_iters: usize = env_or("NUVEC_BENCH_MAX_ITERS", 1000);
    // Warm-up: at least two runs (buffer cache, thread pool, page faults), up to 10% of the budget.
    let start = Instant::now();
    let mut warm = 0;
    while warm < 2 || (start.elapsed() < budget / 10 && warm < 20) {
        let y = op();
        y.eval().expect("benchmark op evaluates");
        drop(y);
        warm += 1;
    }
    let mut samples = Vec::new();
    let start = Instant::now();
    while samples.len() < max_iters && (samples.len() < min_iters || start.elapsed() < budget) {
        let t = Instant::now();
        let y = op();
        y.eval().expect("benchmark op evaluates");
        samples.push(t.elapsed().as_secs_f64() * 1e3);
        drop(y);
    }
    samples.sort_by(f64::total_cmp);
    let n = samples.len();
    let median = if n % 2 == 1 { samples[n / 2] } else { 0.5 * (samples[n / 2 - 1] + samples[n / 2]) };
    (median, samples[0], n)
}

fn main() {
    // A CPU benchmark: record on the CPU even where a GPU backend would be the default.
    nuvec::with_stream(Device::cpu(), run);
}

fn run() {
    let filter: Option<String> = std::env::args().nth(1);
    let wanted = |name: &str| filter.as_deref().is_none_or(|f| name.contains(f));

    type Case = (&'static str, Box<dyn Fn() -> Box<dyn Fn() -> Array>>);
    let cases: Vec<Case> = vec![
        (
            "matmul_f32_1024",
            Box::new(|| {
                let (a, b) = (random(&[1024, 1024], -1.0, 1.0, 1), random(&[1024, 1024], -1.0, 1.0, 2));
                Box::new(move || a.matmul(&b))
            }),
        ),
        (
            "matmul_f32_2048",
            Box::new(|| {
                let (a, b) = (random(&[2048, 2048], -1.0, 1.0, 3), random(&[2048, 2048], -1.0, 1.0, 4));
                Box::new(move || a.matmul(&b))
            }),
        ),
        (
            "matmul_bf16_1024",
            Box::new(|| {
                let a = random(&[1024, 1024], -1.0, 1.0, 5).astype(DType::BF16);
                let b = random(&[1024, 1024], -1.0, 1.0, 6).astype(DType::BF16);
                nuvec::eval(&(&a, &b)).expect("inputs evaluate");
                Box::new(move || a.matmul(&b))
            }),
        ),
        (
            "add_f32_16M",
            Box::new(|| {
                let (a, b) = (random(&[1 << 24], -1.0, 1.0, 7), random(&[1 << 24], -1.0, 1.0, 8));
                Box::new(move || &a + &b)
            }),
        ),
        (
            "exp_f32_16M",
            Box::new(|| {
                let a = random(&[1 << 24], -4.0, 4.0, 9);
                Box::new(move || a.exp())
            }),
        ),
        (
            "sum_all_f32_4096x4096",
            Box::new(|| {
                let a = random(&[4096, 4096], -1.0, 1.0, 10);
                Box::new(move || a.sum(..))
            }),
        ),
        (
            "sum_last_f32_4096x4096",
            Box::new(|| {
                let a = random(&[4096, 4096], -1.0, 1.0, 11);
                Box::new(move || a.sum(-1))
            }),
        ),
        (
            "softmax_rows_f32_4096x4096",
            Box::new(|| {
                let a = random(&[4096, 4096], -4.0, 4.0, 12);
                Box::new(move || a.softmax(-1))
            }),
        ),
        (
            "fast_rms_norm_f32_4096x4096",
            Box::new(|| {
                let (x, w) = (random(&[4096, 4096], -2.0, 2.0, 13), random(&[4096], 0.5, 1.5, 14));
                Box::new(move || fast::rms_norm(&x, &w, 1e-5))
            }),
        ),
        (
            "fast_rms_norm_bf16_4096x4096",
            Box::new(|| {
                let x = random(&[4096, 4096], -2.0, 2.0, 15).astype(DType::BF16);
                let w = random(&[4096], 0.5, 1.5, 16).astype(DType::BF16);
                nuvec::eval(&(&x, &w)).expect("inputs evaluate");
                Box::new(move || fast::rms_norm(&x, &w, 1e-5))
            }),
        ),
        (
            "fast_layer_norm_f32_4096x4096",
            Box::new(|| {
                let x = random(&[4096, 4096], -2.0, 2.0, 17);
                let (w, b) = (random(&[4096], 0.5, 1.5, 18), random(&[4096], -1.0, 1.0, 19));
                Box::new(move || fast::layer_norm(&x, &w, &b, 1e-5))
            }),
        ),
        (
            "fast_swiglu_f32_4096x4096",
            Box::new(|| {
                let (g, u) = (random(&[4096, 4096], -4.0, 4.0, 20), random(&[4096, 4096], -1.0, 1.0, 21));
                Box::new(move || fast::swiglu(&g, &u))
            }),
        ),
        (
            "fast_rope_f32_1x32x1024x128",
            Box::new(|| {
                let x = random(&[1, 32, 1024, 128], -1.0, 1.0, 22);
                let offset = Array::from(7i32);
                Box::new(move || fast::rope(&x, 128, false, Some(10000.0), 1.0, &offset, None))
            }),
        ),
        (
            "fast_cross_entropy_f32_1024x32000",
            Box::new(|| {
                let logits = random(&[1024, 32000], -4.0, 4.0, 23);
                let t: Vec<i32> = (0..1024).map(|i| (i * 7919) % 32000).collect();
                let targets = Array::from_slice(&t, [1024]);
                targets.eval().expect("targets evaluate");
                Box::new(move || fast::cross_entropy(&logits, &targets))
            }),
        ),
        (
            "fast_sdpa_causal_f32_1x8x4096x128",
            Box::new(|| {
                let [q, k, v] = [24, 25, 26].map(|s| random(&[1, 8, 4096, 128], -1.0, 1.0, s));
                Box::new(move || fast::scaled_dot_product_attention(&q, &k, &v, 0.088, &AttentionOptions::causal()))
            }),
        ),
        (
            "fast_sdpa_full_f32_1x8x4096x128",
            Box::new(|| {
                let [q, k, v] = [27, 28, 29].map(|s| random(&[1, 8, 4096, 128], -1.0, 1.0, s));
                Box::new(move || fast::scaled_dot_product_attention(&q, &k, &v, 0.088, &AttentionOptions::default()))
            }),
        ),
        (
            "qmv_f32_b4_g32_1x4096x16384",
            Box::new(|| {
                let (x, w) = (random(&[1, 4096], -1.0, 1.0, 30), random(&[16384, 4096], -1.0, 1.0, 31));
                let (q, s, b) = nuvec::ops::quantize(&w, 32, 4, "affine");
                nuvec::eval(&(&q, &s, b.as_ref().unwrap())).expect("inputs evaluate");
                Box::new(move || nuvec::ops::quantized_matmul(&x, &q, &s, b.as_ref(), true, 32, 4, "affine"))
            }),
        ),
        (
            "qmv_f32_b8_g32_1x576x49152",
            Box::new(|| {
                let (x, w) = (random(&[1, 576], -1.0, 1.0, 32), random(&[49152, 576], -1.0, 1.0, 33));
                let (q, s, b) = nuvec::ops::quantize(&w, 32, 8, "affine");
                nuvec::eval(&(&q, &s, b.as_ref().unwrap())).expect("inputs evaluate");
                Box::new(move || nuvec::ops::quantized_matmul(&x, &q, &s, b.as_ref(), true, 32, 8, "affine"))
            }),
        ),
        (
            "qmv_f32_b4_g32_1x576x576",
            Box::new(|| {
                let (x, w) = (random(&[1, 576], -1.0, 1.0, 34), random(&[576, 576], -1.0, 1.0, 35));
                let (q, s, b) = nuvec::ops::quantize(&w, 32, 4, "affine");
                nuvec::eval(&(&q, &s, b.as_ref().unwrap())).expect("inputs evaluate");
                Box::new(move || nuvec::ops::quantized_matmul(&x, &q, &s, b.as_ref(), true, 32, 4, "affine"))
            }),
        ),
    ];

    for (name, setup) in cases {
        if !wanted(name) {
            continue;
        }
        let op = setup();
        let (median, min, n) = time(&*op);
        println!("{name}\t{median:.3}");
        eprintln!("# {name}: median {median:.3} ms, min {min:.3} ms over {n} iterations");
    }
}
