//! CPU speed of a training step through the transforms, and of graph building.
//!
//! - `mlp_grad_step`: one SGD step of a two-layer MLP (batch 256, 1024 inputs, 1024 hidden,
//!   10 classes, ReLU, softmax cross-entropy against one-hot targets): `value_and_grad`, the
//!   parameter update and `eval` of the loss and new parameters.
//! - `record_per_op_us`: recording (no evaluation) a chain of 100 000 small element-wise ops,
//!   in microseconds per op; `record_grad_per_op_us`: the same chain inside `grad`, recording
//!   the forward and backward graphs, per forward op.
//!
//! Each case prints `name<TAB>median` to stdout (milliseconds, or microseconds for the
//! per-op cases); `bench/grad_vs_peers.py` runs MLX and PyTorch on the same step.
//!
//! ```text
//! cargo run --release -p nuvec --example bench_grad
//! ```

use std::time::Instant;

use nuvec::{Array, DType, Device, ops, value_and_grad};

/// Uniform pseudo-random values in `[-scale, scale)` (xorshift64*), evaluated.
fn random(shape: &[i32], scale: f32, seed: u64) -> Array {
    let n: usize = shape.iter().map(|&d| d as usize).product();
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let data: Vec<f32> = (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            let u = (s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 24) as f32;
            scale * (2.0 * u - 1.0)
        })
        .collect();
    let a = Array::from_slice(&data, shape);
    a.eval().expect("input evaluates");
    a
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

type Params = (Array, Array, Array, Array);

fn loss((w1, b1, w2, b2): &Params, x: &Array, onehot: &Array) -> Array {
    let logits = (x.matmul(w1) + b1).maximum(0.0).matmul(w2) + b2;
    (logits.logsumexp(-1) - (&logits * onehot).sum(-1)).mean(..)
}

fn mlp_step_ms() -> f64 {
    let (batch, din, hidden, classes) = (256, 1024, 1024, 10);
    let x = random(&[batch, din], 1.0, 1);
    let labels = ops::arange(0, batch, 1).remainder(classes);
    let onehot = labels.reshape([batch, 1]).equal(ops::arange(0, classes, 1)).astype(DType::F32);
    onehot.eval().unwrap();
    let mut p: Params = (
        random(&[din, hidden], 1.0 / 32.0, 2),
        ops::zeros([hidden], DType::F32),
        random(&[hidden, classes], 1.0 / 32.0, 3),
        ops::zeros([classes], DType::F32),
    );
    let step = value_and_grad(|p: &Params| loss(p, &x, &onehot));
    let mut times = Vec::new();
    let mut first = None;
    let mut last = 0.0;
    for i in 0..40 {
        let t = Instant::now();
        let (l, g) = step(&p).unwrap();
        p = (&p.0 - &g.0 * 0.1, &p.1 - &g.1 * 0.1, &p.2 - &g.2 * 0.1, &p.3 - &g.3 * 0.1);
        nuvec::eval(&(&l, &p)).unwrap();
        if i >= 5 {
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        last = l.item::<f32>().unwrap();
        first.get_or_insert(last);
    }
    eprintln!("mlp loss {:.4} -> {last:.4}", first.unwrap());
    median(times)
}

fn record_per_op_us(with_grad: bool) -> f64 {
    const N: usize = 100_000;
    let x = ops::ones([4], DType::F32);
    x.eval().unwrap();
    let chain = |x: &Array| {
        let mut y = x.clone();
        for i in 0..N {
            y = if i % 2 == 0 { &y * 1.0001 } else { &y + 0.5 };
        }
        y.sum(..)
    };
    let mut times = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        if with_grad {
            let g = nuvec::grad(chain)(&x).unwrap();
            times.push(t.elapsed().as_secs_f64() * 1e6 / N as f64);
            drop(g);
        } else {
            let y = chain(&x);
            times.push(t.elapsed().as_secs_f64() * 1e6 / N as f64);
            drop(y);
        }
    }
    median(times)
}

fn main() {
    let filter = std::env::args().nth(1).unwrap_or_default();
    nuvec::with_stream(Device::cpu(), || run(&filter));
}

/// A named case and the function measuring it.
type BenchCase = (&'static str, fn() -> f64);

fn run(filter: &str) {
    let cases: [BenchCase; 3] = [
        ("mlp_grad_step", mlp_step_ms),
        ("record_per_op_us", || record_per_op_us(false)),
        ("record_grad_per_op_us", || record_per_op_us(true)),
    ];
    for (name, run) in cases {
        if name.contains(filter) {
            println!("{name}\t{:.4}", run());
        }
    }
}
