//! Quantized layers, `quantize` over a model, initializers and training mode against MLX
//! 0.32.4 (tests/data/quant.safetensors, recorded on the CPU by make_quant.py).

use std::collections::BTreeMap;
use std::path::Path;

use nuvec as _; // the backends
use nuvec_core::{Array, DType, ops, random};
use nuvec_nn::init::{self, Fan};
use nuvec_nn::{Dropout, Embedding, Layer, Linear, Module, Params, QuantSpec, quantize, quantize_with};

fn fixtures() -> BTreeMap<String, Array> {
    nuvec_io::load_safetensors(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/quant.safetensors")).unwrap()
}

/// The fixture's arrays under `prefix.`, by the rest of their names.
fn under(f: &BTreeMap<String, Array>, prefix: &str) -> Params {
    let p = format!("{prefix}.");
    f.iter().filter_map(|(k, v)| k.strip_prefix(&p).map(|n| (n.to_string(), v.clone()))).collect()
}

fn close(got: &Array, want: &Array, what: &str, tol: f32) {
    assert_eq!(got.shape(), want.shape(), "{what}");
    let (g, w) = (got.astype(DType::F32).to_vec::<f32>().unwrap(), want.astype(DType::F32).to_vec::<f32>().unwrap());
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        assert!((a - b).abs() <= tol * b.abs().max(1.0), "{what}[{i}]: {a} against {b}");
    }
}

fn same(got: &Params, want: &Params, what: &str) {
    assert_eq!(got.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>(), "{what}");
    for (k, w) in want {
        assert_eq!(got[k].dtype(), w.dtype(), "{what}: {k}");
        close(&got[k], w, &format!("{what}: {k}"), 0.0);
    }
}

#[test]
fn quantized_linear_follows_mlx_in_two_modes() {
    let f = fixtures();
    let mut lin = Linear::new(128, 12, true, None);
    let mut weights = under(&f, "lin");
    weights.remove("x");
    lin.load_weights(&weights, true).unwrap();
    for (mode, gs, bits) in [("affine", 32, 8), ("mxfp4", 32, 4)] {
        let q = lin.to_quantized(gs, bits, mode).unwrap();
        let mut want = under(&f, &format!("q_{mode}"));
        let y = want.remove("y").unwrap();
        same(&q.parameters(), &want, mode);
        close(&q.forward(&f["lin.x"]), &y, mode, 1e-4);
        assert!(q.trainable_parameters().is_empty(), "{mode}: quantized layers start frozen");
    }
    // A quantized checkpoint loads into a quantized layer.
    let mut fresh = Linear::new(128, 12, true, None).to_quantized(32, 8, "affine").unwrap();
    let mut want = under(&f, "q_affine");
    want.remove("y");
    fresh.load_weights(&want, true).unwrap();
    close(&fresh.forward(&f["lin.x"]), &f["q_affine.y"], "loaded", 1e-4);
}

#[test]
fn quantized_embedding_follows_mlx() {
    let f = fixtures();
    let mut emb = Embedding::new(40, 64, None);
    emb.load_weights(&under(&f, "emb"), true).unwrap();
    let q = emb.to_quantized(64, 4, "affine").unwrap();
    let mut want = under(&f, "qemb");
    for k in ["ids", "rows", "h", "logits"] {
        want.remove(k);
    }
    same(&q.parameters(), &want, "quantized embedding");
    close(&q.forward(&f["qemb.ids"]), &f["qemb.rows"], "rows", 1e-5);
    close(&q.as_linear(&f["qemb.h"]), &f["qemb.logits"], "as_linear", 1e-4);
}

struct Net {
    embed: Embedding,
    layers: Vec<Linear>,
    head: Linear,
}
nuvec_nn::module!(Net { embed, layers, head });

#[test]
fn quantize_walks_a_model_as_mlx() {
    let f = fixtures();
    let mut net = Net {
        embed: Embedding::new(16, 64, None),
        layers: vec![Linear::new(64, 64, true, None), Linear::new(64, 64, false, None)],
        head: Linear::new(64, 16, true, None),
    };
    let want = under(&f, "net");
    // The layers the checkpoint has scales for, as mlx-lm loads a quantized model.
    quantize_with(&mut net, |path, _| {
        want.contains_key(&format!("{path}.scales")).then(|| QuantSpec::new(64, 4, "affine"))
    })
    .unwrap();
    assert_eq!(net.parameters().keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>());
    net.load_weights(&want, true).unwrap();
    assert!(net.head.quantized.is_none() && net.layers[1].quantized.is_some());
    // What is left quantizes with defaults; quantizing twice passes over quantized layers.
    quantize(&mut net, None, None, "affine").unwrap();
    assert!(net.head.quantized.is_some());
    assert!(net.trainable_parameters().is_empty());
    // Rows that do not split into groups: an error naming the layer.
    let mut odd = vec![Linear::new(64, 8, false, None), Linear::new(48, 8, false, None)];
    let err = quantize(&mut odd, 64, 4, "affine").unwrap_err().to_string();
    assert!(err.contains("layer '1'") && err.contains("groups of 64"), "{err}");
    assert!(odd[0].quantized.is_some() && odd[1].quantized.is_none());
    let err = Linear::new(64, 8, false, None).to_quantized(64, 4, "int3").unwrap_err().to_string();
    assert!(err.contains("Linear.to_quantized") && err.contains("int3"), "{err}");
}

#[test]
fn initializers_follow_mlx() {
    let f = fixtures();
    type Init = fn(&[i32]) -> Array;
    let cases: [(&str, Init); 6] = [
        ("normal", |s| init::normal(s, 0.5, 2.0, DType::F32, None)),
        ("uniform", |s| init::uniform(s, -3.0, 1.0, DType::F32, None)),
        ("glorot_normal", |s| init::glorot_normal(s, 2.0, DType::F32, None).unwrap()),
        ("glorot_uniform", |s| init::glorot_uniform(s, 1.0, DType::F32, None).unwrap()),
        ("he_normal", |s| init::he_normal(s, Fan::Out, 1.0, DType::F32, None).unwrap()),
        ("he_uniform", |s| init::he_uniform(s, Fan::In, 0.5, DType::F32, None).unwrap()),
    ];
    for (i, (name, make)) in cases.into_iter().enumerate() {
        let want = &f[&format!("init.{name}")];
        random::seed(100 + i as u64);
        close(&make(want.shape()), want, name, 1e-6);
    }
    assert_eq!(init::identity(&[3, 3], DType::F32).unwrap().to_vec::<f32>().unwrap()[..4], [1.0, 0.0, 0.0, 0.0]);
    assert!(init::identity(&[3, 2], DType::F32).is_err());
    assert!(init::glorot_uniform(&[7], 1.0, DType::F32, None).unwrap_err().to_string().contains("2 dimensions"));
    assert_eq!(init::constant(&[2], 0.25, DType::BF16).astype(DType::F32).to_vec::<f32>().unwrap(), [0.25, 0.25]);
}

#[test]
fn train_and_eval_reach_every_dropout() {
    struct Block {
        drop: Dropout,
        layers: Vec<Dropout>,
    }
    nuvec_nn::module!(Block { drop, layers });
    let mut b = Block { drop: Dropout::new(0.5), layers: vec![Dropout::new(0.9)] };
    let x = ops::ones([64], DType::F32);
    b.train(false);
    assert!(!b.drop.training && !b.layers[0].training);
    assert_eq!(b.layers[0].forward(&x).to_vec::<f32>().unwrap(), vec![1.0; 64]);
    b.train(true);
    let dropped = b.drop.forward(&x).to_vec::<f32>().unwrap();
    assert!(dropped.iter().all(|&v| v == 0.0 || v == 2.0) && dropped.contains(&0.0), "{dropped:?}");
}
