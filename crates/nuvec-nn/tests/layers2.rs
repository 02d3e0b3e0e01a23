//! Convolutions, quantized linear layers and multi-head attention against MLX 0.32.4
//! (tests/data/layers2.safetensors, recorded on the CPU by make_layers2.py).

use std::collections::BTreeMap;
use std::path::Path;

use nuvec as _; // the backends
use nuvec_core::{Array, DType};
use nuvec_nn::{Conv1d, Conv2d, Layer, Linear, Module, MultiHeadAttention, Params, QuantizedLinear};

fn fixtures() -> BTreeMap<String, Array> {
    nuvec_io::load_safetensors(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/layers2.safetensors")).unwrap()
}

/// The fixture's parameters of the module recorded under `prefix`.
fn params(f: &BTreeMap<String, Array>, prefix: &str, module: &impl Module) -> Params {
    module.parameters().into_keys().map(|k| (k.clone(), f[&format!("{prefix}.{k}")].clone())).collect()
}

fn close(got: &Array, want: &Array, what: &str, tol: f32) {
    assert_eq!(got.shape(), want.shape(), "{what}");
    let (g, w) = (got.astype(DType::F32).to_vec::<f32>().unwrap(), want.astype(DType::F32).to_vec::<f32>().unwrap());
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        assert!((a - b).abs() <= tol * b.abs().max(1.0), "{what}[{i}]: {a} against {b}");
    }
}

#[test]
fn convolutions_follow_mlx() {
    let f = fixtures();
    let mut c1 = Conv1d::new(4, 6, 3, 1, true, None);
    (c1.stride, c1.padding) = (2, 1);
    c1.load_weights(&params(&f, "conv1", &c1), true).unwrap();
    close(&c1.forward(&f["conv1.x"]), &f["conv1.y"], "conv1d", 1e-5);
    let mut c2 = Conv2d::new(4, 8, [3, 2], 2, true, None);
    (c2.stride, c2.padding) = ([1, 2], [1, 0]);
    c2.load_weights(&params(&f, "conv2", &c2), true).unwrap();
    close(&c2.forward(&f["conv2.x"]), &f["conv2.y"], "conv2d", 1e-5);
}

#[test]
fn quantized_linear_follows_mlx() {
    let f = fixtures();
    let mut lin = Linear::new(128, 6, true, None);
    lin.load_weights(&params(&f, "qlin", &lin), true).unwrap();
    let q: QuantizedLinear = lin.to_quantized(64, 4, "affine").unwrap();
    close(&q.forward(&f["qlin.x"]), &f["qlin.y"], "quantized linear", 1e-5);
    assert!(q.trainable_parameters().is_empty());
    assert_eq!(q.parameters().into_keys().collect::<Vec<_>>(), ["bias", "biases", "scales", "weight"]);
}

#[test]
fn multi_head_attention_follows_mlx() {
    let f = fixtures();
    let mut mha = MultiHeadAttention::new(16, 4, true, None);
    mha.load_weights(&params(&f, "mha", &mha), true).unwrap();
    let (q, k) = (&f["mha.q"], &f["mha.k"]);
    close(&mha.attend(q, k, k, Some(&f["mha.mask"])), &f["mha.y"], "attention", 1e-5);
    close(&mha.forward(q), &f["mha.self"], "self-attention", 1e-5);
    let bad = mha.attend(&q.reshape([10, 16]), k, k, None);
    assert!(bad.error().unwrap().to_string().contains("MultiHeadAttention"));
}
