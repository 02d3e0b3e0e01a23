//! A first run of nuvec on the default device (the GPU when one is usable, else the CPU;
//! `NUVEC_DEVICE=cpu|gpu|gpu:N` chooses): lazy arrays, broadcasting, reductions, a small network's
//! forward pass, and errors that surface as values instead of panics.
//!
//! ```text
//! cargo run --release -p nuvec --example quickstart
//! ```

use std::time::Instant;

use nuvec::{DType, Device, array, default_device, ops, parse_device_env, random};

/// Uniform values in [-1, 1) from the seeded key `seed` (MLX's threefry: the same on every
/// device and run).
fn noise(shape: &[i32], seed: u64) -> nuvec::Array {
    random::uniform(-1.0, 1.0, shape, DType::F32, Some(&random::key(seed)))
}

/// Why the default device is the one it is.
fn why(device: Device) -> String {
    match std::env::var("NUVEC_DEVICE") {
        Ok(v) if !v.trim().is_empty() => match parse_device_env(&v) {
            Ok(_) => format!("NUVEC_DEVICE={v}"),
            // Every evaluation fails with this message, so the first `eval` below stops the run.
            Err(e) => format!("{e}; every evaluation fails until it is fixed"),
        },
        _ if device.is_cpu() => match nuvec::cuda::unavailable_reason() {
            Some(r) => format!("no usable GPU: {r}"),
            None => "the CPU".into(),
        },
        _ => "a usable GPU was found".into(),
    }
}

fn main() -> nuvec::Result<()> {
    let device = default_device();
    println!("default device: {device} ({})", why(device));

    // Arrays are lazy: this records a graph; `item`/`to_vec`/`eval` run it.
    let a = array![[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]];
    let centered = &a - a.mean_keepdims(-1);
    println!("a - mean(a, -1) = {centered}");
    println!("softmax rows    = {}", a.softmax(-1));
    println!("cumsum          = {}", ops::arange(1, 6, 1).cumsum(None));

    // A two-layer MLP forward pass on a batch of 256 inputs.
    let (batch, din, hidden, classes) = (256, 512, 1024, 10);
    let x = noise(&[batch, din], 1);
    let w1 = noise(&[din, hidden], 2) * (1.0 / (din as f32).sqrt());
    let w2 = noise(&[hidden, classes], 3) * (1.0 / (hidden as f32).sqrt());
    nuvec::eval(&(&x, &w1, &w2))?;
    let start = Instant::now();
    let h = x.matmul(&w1).maximum(0.0);
    let logits = h.matmul(&w2);
    let logp = &logits - logits.logsumexp_keepdims(-1);
    let labels = logits.argmax(-1);
    nuvec::eval(&(&logp, &labels))?;
    println!(
        "MLP forward {batch}x{din} -> {hidden} -> {classes}: {:.2} ms, mean log-prob {:.4}",
        start.elapsed().as_secs_f64() * 1e3,
        logp.mean(..).item::<f32>()?
    );

    // Mistakes give failed arrays that name the operation, the caller and the reason. Returned
    // from `main` with `?`, the error prints the same message.
    let wrong = a.matmul(&a);
    match wrong.eval() {
        Err(e) => println!("as expected: {e}"),
        Ok(()) => println!("unexpected success"),
    }
    Ok(())
}
