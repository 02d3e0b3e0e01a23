//! The speed of one training step (`value_and_grad`, AdamW's update, `eval`) on the default
//! device, against the matrix-product ceiling measured in the same run:
//!
//! - `gpt2`: GPT-2 small (124M parameters, tied embeddings), batch 8 of 1024 tokens, bfloat16
//!   parameters and activations, fused causal attention and cross entropy.
//! - `lm`: the same architecture at 4 layers of 256 features and 4 heads, vocabulary 256,
//!   batch 8 of 128 tokens, float32 (`train_lm`'s model).
//! - `mlp`: 784 → 1024 → 1024 → 10 with ReLU, batch 256, float32, cross entropy.
//!
//! Each case prints `case<TAB>ms per step<TAB>tokens/s<TAB>ceiling ms<TAB>device`, where the
//! ceiling is the step's matrix-product FLOPs (6 per parameter and token, and attention's) at
//! the rate one large product of the same dtype reaches here. `bench/train_peers.py` times the
//! same steps in PyTorch.
//!
//! ```text
//! cargo run --release -p nuvec --example bench_train -- [--only gpt2,lm,mlp] [--steps N] [--warmup W]
//! NUVEC_DEVICE=cpu cargo run --release -p nuvec --example bench_train -- --only lm,mlp
//! ```

#[path = "train_lm/gpt.rs"]
mod gpt;

use std::time::Instant;

use nuvec::nn::{Layer, Linear, Module, module, value_and_grad};
use nuvec::optim::{AdamW, Optimizer};
use nuvec::{Array, DType, fast, random};

use gpt::{Config, Gpt};

/// GPT-2 small (124M parameters), its vocabulary padded to a multiple of 64.
const GPT2: Config = Config { vocab: 50304, context: 1024, layers: 12, heads: 12, dims: 768 };

/// The MLP case's model.
#[derive(Clone)]
struct Mlp {
    l1: Linear,
    l2: Linear,
    l3: Linear,
}
module!(Mlp { l1, l2, l3 });

impl Mlp {
    fn loss(&self, (x, labels): &(Array, Array)) -> Array {
        let h = self.l2.forward(&self.l1.forward(x).maximum(0.0f32)).maximum(0.0f32);
        fast::cross_entropy(&self.l3.forward(&h), labels).mean(..)
    }
}

/// The arguments: `--only`, `--steps`, `--warmup`.
struct Args {
    only: Vec<String>,
    steps: usize,
    warmup: usize,
}

fn args() -> Args {
    let mut a = Args { only: vec!["gpt2".into(), "lm".into(), "mlp".into()], steps: 10, warmup: 3 };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    for pair in argv.chunks(2) {
        let value = pair.get(1).map(String::as_str).unwrap_or("");
        match pair[0].as_str() {
            "--only" => a.only = value.split(',').map(str::to_string).collect(),
            "--steps" => a.steps = value.parse().expect("--steps takes a count"),
            "--warmup" => a.warmup = value.parse().expect("--warmup takes a count"),
            other => panic!("unknown argument {other}: use --only, --steps, --warmup"),
        }
    }
    a
}

/// Milliseconds per step of `steps` calls of `step` after `warmup` ones; `step` returns the
/// loss, read at the end so that the device has finished.
fn time(warmup: usize, steps: usize, mut step: impl FnMut() -> Array) -> f64 {
    for _ in 0..warmup {
        step().astype(DType::F32).item::<f32>().expect("warm-up step");
    }
    let start = Instant::now();
    let mut loss = None;
    for _ in 0..steps {
        loss = Some(step());
    }
    let l = loss.map(|l| l.astype(DType::F32).item::<f32>().expect("step")).unwrap_or(f32::NAN);
    assert!(l.is_finite(), "the loss is {l}");
    start.elapsed().as_secs_f64() * 1e3 / steps as f64
}

/// One AdamW step of `model` on `batch` with `loss`, evaluated; returns the loss.
fn step<M: Module + Clone, D>(model: &mut M, opt: &mut AdamW, loss: fn(&M, &D) -> Array, batch: &D) -> Array {
    let (value, grads) = value_and_grad(model, loss, batch).expect("gradients");
    opt.update(model, &grads).expect("update");
    nuvec::eval(&(&value, &model.parameters(), &opt.state())).expect("step evaluates");
    value
}

/// FLOPs per second of a `[m, k] @ [k, n]` product in `dtype`, as this device runs it.
fn matmul_rate(m: i32, k: i32, n: i32, dtype: DType) -> f64 {
    let key = random::key(9);
    let a = random::normal([m, k], dtype, 0.0, 1.0, Some(&key));
    let b = random::normal([k, n], dtype, 0.0, 1.0, Some(&key));
    nuvec::eval(&(&a, &b)).expect("inputs");
    let reps = 20;
    let ms = time(3, reps, || {
        let s = a.matmul(&b).sum(..);
        s.eval().expect("product");
        s
    });
    2.0 * m as f64 * k as f64 * n as f64 / (ms / 1e3)
}

fn report(case: &str, ms: f64, tokens: f64, flops: f64, rate: f64) {
    let ceiling = flops / rate * 1e3;
    eprintln!(
        "{case}: {ms:.2} ms/step, {:.0} tokens/s; matmul ceiling {ceiling:.2} ms ({:.0}% of it), {:.1} TFLOP/s model",
        tokens / ms * 1e3,
        100.0 * ceiling / ms,
        flops / ms / 1e9
    );
    println!("{case}\t{ms:.3}\t{:.0}\t{ceiling:.3}\t{}", tokens / ms * 1e3, nuvec::default_device());
}

/// A transformer case: `config`, `batch` sequences of the full context, in `dtype`.
fn lm_case(name: &str, config: &Config, batch: i32, dtype: DType, a: &Args) {
    let mut model = Gpt::new(config);
    model.set_dtype(dtype);
    // Parameters in matrix products: the matrices but the learned positions (an addition).
    let in_products: usize = model
        .parameters()
        .iter()
        .filter(|(k, v)| v.ndim() == 2 && k.as_str() != "wpe.weight")
        .map(|(_, v)| v.size())
        .sum();
    let key = random::key(1);
    let shape = [batch, config.context];
    let ids = random::randint(0, config.vocab, shape, DType::I32, Some(&key));
    let targets = random::randint(0, config.vocab, shape, DType::I32, Some(&random::split2(&key).1));
    nuvec::eval(&(&model.parameters(), &ids, &targets)).expect("model");
    let mut opt = AdamW::new(6e-4, 0.1);
    opt.adam().betas = (0.9, 0.95);
    let batch_data = (ids, targets);
    let loss: fn(&Gpt, &(Array, Array)) -> Array = |m, (x, y)| m.loss(x, y);
    let ms = time(a.warmup, a.steps, || step(&mut model, &mut opt, loss, &batch_data));
    let tokens = (batch * config.context) as f64;
    let (l, d) = (config.context as f64, config.dims as f64);
    let attention = 6.0 * config.layers as f64 * l * d * tokens;
    let flops = 6.0 * in_products as f64 * tokens + attention;
    let (m, k, n) = if dtype == DType::F32 { (1024, 256, 1024) } else { (8192, 768, 3072) };
    report(name, ms, tokens, flops, matmul_rate(m, k, n, dtype));
}

fn mlp_case(a: &Args) {
    let key = random::key(2);
    let ks = random::split(&key, 5);
    let k = |i: i32| ks.take(&Array::scalar(i, DType::I32), 0);
    let mut model = Mlp {
        l1: Linear::new(784, 1024, true, Some(&k(0))),
        l2: Linear::new(1024, 1024, true, Some(&k(1))),
        l3: Linear::new(1024, 10, true, Some(&k(2))),
    };
    let batch = 256;
    let x = random::normal([batch, 784], DType::F32, 0.0, 1.0, Some(&k(3)));
    let labels = random::randint(0, 10, [batch], DType::I32, Some(&k(4)));
    nuvec::eval(&(&model.parameters(), &x, &labels)).expect("model");
    let mut opt = AdamW::new(1e-3, 0.01);
    let data = (x, labels);
    let ms = time(a.warmup, a.steps, || step(&mut model, &mut opt, Mlp::loss, &data));
    let flops = 6.0 * (784.0 * 1024.0 + 1024.0 * 1024.0 + 1024.0 * 10.0) * batch as f64;
    report("mlp", ms, batch as f64, flops, matmul_rate(256, 1024, 1024, DType::F32));
}

fn main() {
    let a = args();
    eprintln!("device: {}", nuvec::default_device());
    println!("case\tms_per_step\ttokens_per_s\tceiling_ms\tdevice");
    for case in &a.only {
        match case.as_str() {
            "gpt2" => lm_case("gpt2", &GPT2, 8, DType::BF16, &a),
            "lm" => lm_case("lm", &gpt::SMALL, 8, DType::F32, &a),
            "mlp" => mlp_case(&a),
            other => panic!("unknown case {other}: use gpt2, lm, mlp"),
        }
    }
}
