//! GPU benchmark of `quantized_matmul` at Llama-3-8B's weight shapes (K×N 4096×4096,
//! 4096×14336, 14336×4096, 4096×128256), bf16 activations, affine weights of 4 and 8 bits in
//! groups of 64, beside the bf16 products of the same shapes.
//!
//! ```text
//! cargo run --release -p nuvec --example bench_quant                      # every case
//! cargo run --release -p nuvec --example bench_quant -- --only qmv_       # decoding only
//! cargo run --release -p nuvec --example bench_quant -- --out quant.tsv   # also write the TSV
//! ```
//!
//! Without a usable GPU it prints why and exits with status 0. `bench/quant_peers.py` times the
//! same cases in PyTorch (bf16 `matmul`, and `_weight_int4pack_mm` for 4 bits) under the same
//! names.
//!
//! # Cases
//!
//! * `qmv_bf16_b{bits}_M{m}_K{k}_N{n}`, m in {1, 4, 8}: decoding, a bandwidth of the bytes an
//!   ideal kernel moves (packed weight, scales and biases, x read and y written) against the
//!   copy ceiling of the same run. Targets: 85% of copy at M 1, 75% at M 8.
//! * `gemv_bf16_M{m}_K{k}_N{n}`: `x @ wᵀ` with a bf16 weight, the same bandwidth (2 bytes per
//!   weight); a 4-bit product should take 3.3× less time.
//! * `qmm_bf16_b4_M{m}_K{k}_N{n}` and `mm_bf16_M{m}_K{k}_N{n}`, m in {512, 2048, 8192}:
//!   prefill in TFLOP/s (`2·M·K·N`); the quantized product's target is 70% of the bf16
//!   product's.
//!
//! Weights rotate among copies so that each iteration reads them from memory (the harness's
//! `copies`). The method is `bench_gpu`'s (`bench_harness/mod.rs`).

mod bench_harness;

use bench_harness::{Bench, Row, copy_ceiling, random, randoms, time_op};
use nuvec::{Array, DType, ops};

/// Llama-3-8B's products, (K, N).
const SHAPES: [(i32, i32); 4] = [(4096, 4096), (4096, 14336), (14336, 4096), (4096, 128256)];
/// Elements per scale and bias.
const GROUP: i32 = 64;
/// Every case's activation dtype.
const DT: DType = DType::BF16;

fn main() {
    bench_harness::main_with("bench_quant", run_all);
}

fn run_all(b: &mut Bench) {
    copy_ceiling(b);
    for (k, n) in SHAPES {
        decode(b, k, n);
    }
    for (k, n) in SHAPES {
        prefill(b, k, n);
    }
}

/// A packed weight `[n, k]` with its scales and biases.
struct Packed {
    w: Array,
    scales: Array,
    biases: Array,
}

impl Packed {
    fn new(k: i32, n: i32, bits: i32, seed: u32) -> nuvec::Result<Packed> {
        let w = random(&[n, k], DT, seed)? * 0.05f32;
        let (w, scales, biases) = ops::quantize(&w, GROUP, bits, "affine");
        let biases = biases.unwrap_or_default();
        nuvec::eval(&[w.clone(), scales.clone(), biases.clone()])?;
        Ok(Packed { w, scales, biases })
    }

    fn bytes(&self) -> usize {
        [&self.w, &self.scales, &self.biases].iter().map(|a| a.size() * a.dtype().size()).sum()
    }

    fn matmul(&self, x: &Array, bits: i32) -> Array {
        ops::quantized_matmul(x, &self.w, &self.scales, Some(&self.biases), true, GROUP, bits, "affine")
    }
}

fn decode(b: &mut Bench, k: i32, n: i32) {
    for m in [1i32, 4, 8] {
        let io = ((m * k + m * n) as usize) * 2;
        for bits in [4, 8] {
            let name = format!("qmv_bf16_b{bits}_M{m}_K{k}_N{n}");
            if !b.wanted(&name) {
                continue;
            }
            let weight = k as usize * n as usize * bits as usize / 8;
            let copies = b.copies(weight);
            let target = match m {
                1 => Some(0.85),
                8 => Some(0.75),
                _ => None,
            };
            // The packed weight, then a bf16 scale and bias per group.
            let bytes = (weight + 2 * 2 * n as usize * (k / GROUP) as usize + io) as f64;
            let setup = || {
                let ws: Vec<Packed> =
                    (0..copies).map(|j| Packed::new(k, n, bits, 10 + j as u32)).collect::<Result<_, _>>()?;
                debug_assert_eq!(ws[0].bytes() + io, bytes as usize);
                let x = random(&[m, k], DT, 3)?;
                Ok(Box::new(move |i: usize| ws[i % copies].matmul(&x, bits)) as Box<dyn Fn(usize) -> Array>)
            };
            let result = setup().and_then(|op| time_op(&*op));
            b.bandwidth_row(&name, bytes, target, result);
            let _ = nuvec::cuda::clear_cache(0);
        }
        let name = format!("gemv_bf16_M{m}_K{k}_N{n}");
        let weight = k as usize * n as usize * 2;
        let copies = b.copies(weight);
        b.bandwidth(&name, (weight + io) as f64, None, || {
            let ws = randoms(copies, &[n, k], DT, 40)?;
            let x = random(&[m, k], DT, 3)?;
            Ok(Box::new(move |i: usize| x.matmul(&ws[i % copies].t())))
        });
    }
}

fn prefill(b: &mut Bench, k: i32, n: i32) {
    for m in [512i32, 2048, 8192] {
        let flops = 2.0 * m as f64 * k as f64 * n as f64;
        let dense_name = format!("mm_bf16_M{m}_K{k}_N{n}");
        let dense = tflops(b, &dense_name, flops, None, || {
            let w = random(&[n, k], DT, 50)?;
            let x = random(&[m, k], DT, 4)?;
            Ok(Box::new(move |_| x.matmul(&w.t())))
        });
        let name = format!("qmm_bf16_b4_M{m}_K{k}_N{n}");
        tflops(b, &name, flops, dense, || {
            let w = Packed::new(k, n, 4, 60)?;
            let x = random(&[m, k], DT, 4)?;
            Ok(Box::new(move |_| w.matmul(&x, 4)))
        });
    }
}

/// A case in TFLOP/s; with `dense` (the bf16 product's TFLOP/s) its fraction of it, against
/// the 70% target.
fn tflops(
    b: &mut Bench,
    name: &str,
    flops: f64,
    dense: Option<f64>,
    setup: impl FnOnce() -> nuvec::Result<Box<dyn Fn(usize) -> Array>>,
) -> Option<f64> {
    if !b.wanted(name) {
        return None;
    }
    let result = setup().and_then(|op| time_op(&*op));
    let _ = nuvec::cuda::clear_cache(0);
    match result {
        Ok(t) => {
            let value = flops / t.median / 1e12;
            let fraction = dense.map(|d| value / d);
            let target = fraction.map_or(String::new(), |f| format!(">=70% {}", if f >= 0.7 { "ok" } else { "MISS" }));
            b.push(Row { name: name.into(), value, unit: "TFLOP/s", fraction, target, detail: Bench::detail(&t) });
            Some(value)
        }
        Err(e) => {
            b.failed(name, "TFLOP/s", &e);
            None
        }
    }
}
