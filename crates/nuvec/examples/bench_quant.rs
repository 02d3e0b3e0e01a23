//! GPU benchmark of `quantized_matmul` at Llama-3-8B's weight shapes (K×N 4096×4096,
//! 4096×14336, 14336×4096, 4096×128256), bf16 activations, affine weights of 4 and 8 bits in
//! groups of 64, beside the bf16 products of the same shapes; and of `fast::paged_attention`
//! beside contiguous decoding.
//!
//! ```text
//! cargo run --release -p nuvec --example bench_quant                      # every case
//! cargo run --release -p nuvec --example bench_quant -- --only qmv_       # decoding only
//! cargo run --release -p nuvec --example bench_quant -- --only decode_    # attention only
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
//! * `decode_bf16_B{b}_Lk{lk}` and `paged_decode_bf16_B{b}_Lk{lk}_bs{bs}`: one query of 32
//!   heads of 128 over 8 key-value heads of `lk` keys, contiguous (`scaled_dot_product_attention`)
//!   and paged (blocks of `bs` positions, each sequence's blocks scattered over the cache), in
//!   GB/s of the cache read once; the paged case's fraction is of the contiguous case's (target
//!   95%), and the peers' column is PyTorch's SDPA on the contiguous cache.
//!
//! Weights rotate among copies so that each iteration reads them from memory (the harness's
//! `copies`). The method is `bench_gpu`'s (`bench_harness/mod.rs`).

mod bench_harness;

use bench_harness::{Bench, Row, copy_ceiling, random, randoms, time_op};
use nuvec::{Array, DType, fast, ops};

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
    for (batch, lk) in PAGED {
        paged(b, batch, lk);
    }
}

/// Paged decoding's (batch, keys): Llama-3-8B's attention (32 query heads over 8 of 128).
const PAGED: [(i32, i32); 6] = [(1, 1024), (1, 32768), (8, 8192), (32, 8192), (64, 4096), (64, 16384)];
const HQ: i32 = 32;
const HKV: i32 = 8;
const HEAD: i32 = 128;

/// Contiguous decoding, then paged decoding over the same number of keys with blocks of 16 and
/// 64 positions.
fn paged(b: &mut Bench, batch: i32, lk: i32) {
    let scale = 1.0 / (HEAD as f32).sqrt();
    let q_bytes = (batch * HQ * HEAD) as usize * 2;
    let kv_bytes = batch as usize * (HKV * lk * HEAD) as usize * 2;
    let bytes = (2 * kv_bytes + 2 * q_bytes) as f64;
    let copies = b.copies(2 * kv_bytes);
    let name = format!("decode_bf16_B{batch}_Lk{lk}");
    let mut contiguous = None;
    if b.wanted(&name) || b.wanted("paged_decode") {
        let setup = || {
            let q = random(&[batch, HQ, 1, HEAD], DT, 700)?;
            let ks = randoms(copies, &[batch, HKV, lk, HEAD], DT, 710)?;
            let vs = randoms(copies, &[batch, HKV, lk, HEAD], DT, 720)?;
            let opts = fast::AttentionOptions::default();
            Ok(Box::new(move |i: usize| {
                fast::scaled_dot_product_attention(&q, &ks[i % copies], &vs[i % copies], scale, &opts)
            }) as Box<dyn Fn(usize) -> Array>)
        };
        let result = setup().and_then(|op| time_op(&*op));
        contiguous = result.as_ref().ok().map(|t| bytes / t.median / 1e9);
        b.bandwidth_row(&name, bytes, None, result);
        let _ = nuvec::cuda::clear_cache(0);
    }
    for bs in [16, 64] {
        let name = format!("paged_decode_bf16_B{batch}_Lk{lk}_bs{bs}");
        if !b.wanted(&name) {
            continue;
        }
        let setup = || {
            let blocks = batch * lk / bs;
            let q = random(&[batch, HQ, 1, HEAD], DT, 700)?;
            let ks = randoms(copies, &[blocks, HKV, bs, HEAD], DT, 730)?;
            let vs = randoms(copies, &[blocks, HKV, bs, HEAD], DT, 740)?;
            // Every block once, in an order far from the cache's (7919 is prime, blocks a power of two).
            let ids: Vec<i32> = (0..blocks as i64).map(|j| (j * 7919 % blocks as i64) as i32).collect();
            let tables = Array::from_slice(&ids, vec![batch, lk / bs]);
            let lengths = ops::full_dtype([batch], lk, DType::I32);
            let opts = fast::AttentionOptions::causal();
            Ok(Box::new(move |i: usize| {
                fast::paged_attention(&q, &ks[i % copies], &vs[i % copies], &tables, &lengths, scale, &opts)
            }) as Box<dyn Fn(usize) -> Array>)
        };
        match setup().and_then(|op| time_op(&*op)) {
            Ok(t) => {
                let value = bytes / t.median / 1e9;
                let fraction = contiguous.map(|c| value / c);
                let target =
                    fraction.map_or(String::new(), |f| format!(">=95% {}", if f >= 0.95 { "ok" } else { "MISS" }));
                b.push(Row { name, value, unit: "GB/s", fraction, target, detail: Bench::detail(&t) });
            }
            Err(e) => b.failed(&name, "GB/s", &e),
        }
        let _ = nuvec::cuda::clear_cache(0);
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
