//! Layers and modules against MLX 0.32.4 (tests/data/layers.safetensors, recorded on the CPU by
//! make_layers.py): outputs, parameter names, an MLP's loss and gradients; freezing, strict
//! loading, saving.

use std::collections::BTreeMap;
use std::path::Path;

use nuvec as _; // the backends
use nuvec_core::{Array, DType};
use nuvec_nn::{Dropout, Embedding, Layer, LayerNorm, Linear, Module, Params, RmsNorm, Rope, Sequential, module};

fn fixtures() -> BTreeMap<String, Array> {
    nuvec_io::load_safetensors(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/layers.safetensors")).unwrap()
}

fn close(got: &Array, want: &Array, what: &str) {
    assert_eq!(got.shape(), want.shape(), "{what}");
    let (g, w) = (got.astype(DType::F32).to_vec::<f32>().unwrap(), want.astype(DType::F32).to_vec::<f32>().unwrap());
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{what}[{i}]: {a} against {b}");
    }
}

/// The fixture's entries under `prefix`, less it, but for the layer outputs `y`.
fn params(f: &BTreeMap<String, Array>, prefix: &str) -> Params {
    f.iter()
        .filter_map(|(k, v)| Some((k.strip_prefix(prefix)?.to_string(), v.clone())))
        .filter(|(k, _)| k != "y")
        .collect()
}

#[test]
fn layers_follow_mlx() {
    let f = fixtures();
    let x = &f["x"];
    let mut lin = Linear::new(8, 6, true, None);
    lin.load_weights(&params(&f, "linear."), false).unwrap();
    close(&lin.forward(x), &f["linear.y"], "linear");

    let mut emb = Embedding::new(10, 4, None);
    emb.load_weights(&BTreeMap::from([("weight".to_string(), f["embedding.weight"].clone())]), true).unwrap();
    close(&emb.forward(&f["embedding.ids"]), &f["embedding.y"], "embedding");
    close(&emb.as_linear(&f["embedding.linear_x"]), &f["embedding.linear"], "embedding as linear");

    let mut rms = RmsNorm::new(8, 1e-5);
    rms.load_weights(&BTreeMap::from([("weight".to_string(), f["rms.weight"].clone())]), true).unwrap();
    close(&rms.forward(x), &f["rms.y"], "rms norm");
    let mut ln = LayerNorm::new(8, 1e-5, true, true);
    ln.load_weights(&params(&f, "ln."), false).unwrap();
    close(&ln.forward(x), &f["ln.y"], "layer norm");
    close(&LayerNorm::new(8, 1e-5, false, false).forward(x), &f["ln_plain.y"], "layer norm, no affine");
    let rope = Rope::new(8);
    close(&rope.forward(&f["rope.x"]), &f["rope.y"], "rope");
    close(&rope.forward_at(&f["rope.x"], 3), &f["rope.y3"], "rope at 3");
    let mut drop = Dropout::new(0.5);
    let y = drop.forward(&nuvec_core::ops::ones([1000], DType::F32)).to_vec::<f32>().unwrap();
    assert!(y.iter().all(|&v| v == 0.0 || v == 2.0) && y.iter().filter(|&&v| v == 0.0).count() > 350);
    drop.training = false;
    assert_eq!(drop.forward(x).to_vec::<f32>().unwrap(), x.to_vec::<f32>().unwrap());
}

#[derive(Clone)]
struct Mlp {
    layers: Vec<Linear>,
}
module!(Mlp { layers });

#[test]
fn an_mlp_has_mlx_names_loss_and_gradients() {
    let f = fixtures();
    let mut mlp = Mlp { layers: vec![Linear::new(8, 16, true, None), Linear::new(16, 2, false, None)] };
    let names: Vec<String> = mlp.parameters().into_keys().collect();
    assert_eq!(names, ["layers.0.bias", "layers.0.weight", "layers.1.weight"]);
    mlp.load_weights(&params(&f, "mlp.param."), true).unwrap();
    let loss = |m: &Mlp, (x, t): &(Array, Array)| {
        let h = nuvec_nn::activations::gelu(&m.layers[0].forward(x));
        nuvec_nn::losses::mse_loss(&m.layers[1].forward(&h), t, nuvec_nn::losses::Reduction::Mean)
    };
    let data = (f["mlp.x"].clone(), f["mlp.t"].clone());
    let (value, grads) = nuvec_nn::value_and_grad(&mlp, loss, &data).unwrap();
    close(&value, &f["mlp.loss"], "loss");
    assert_eq!(grads.len(), 3);
    for (k, g) in &grads {
        close(g, &f[&format!("mlp.grad.{k}")], k);
    }
    // Frozen parameters get no gradient.
    mlp.layers[0].freeze();
    let (_, grads) = nuvec_nn::value_and_grad(&mlp, loss, &data).unwrap();
    assert_eq!(grads.keys().collect::<Vec<_>>(), ["layers.1.weight"]);
    mlp.unfreeze();
    assert_eq!(mlp.trainable_parameters().len(), 3);
}

#[test]
fn weights_load_strictly_and_save() {
    let f = fixtures();
    let mut seq = Sequential {
        layers: vec![Box::new(Linear::new(8, 16, true, None)), Box::new(Linear::new(16, 2, false, None))],
    };
    let mut w = params(&f, "mlp.param.");
    seq.load_weights(&w, true).unwrap();
    let dir = std::env::temp_dir().join(format!("nuvec-nn-weights-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["w.safetensors", "w.npz"] {
        seq.save_weights(&dir.join(name)).unwrap();
        let mut back = Sequential {
            layers: vec![Box::new(Linear::new(8, 16, true, None)), Box::new(Linear::new(16, 2, false, None))],
        };
        back.load_weights_file(&dir.join(name)).unwrap();
        for (k, v) in back.parameters() {
            assert_eq!(v.to_vec::<f32>().unwrap(), w[&k].to_vec::<f32>().unwrap(), "{name} {k}");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
    // Strict: a missing name, an extra name, a wrong shape are errors naming them.
    let missing = w.remove("layers.1.weight").unwrap();
    assert!(seq.load_weights(&w, true).unwrap_err().to_string().contains("'layers.1.weight' is missing"));
    seq.load_weights(&w, false).unwrap();
    w.insert("layers.1.weight".into(), missing.clone());
    w.insert("layers.2.weight".into(), missing.clone());
    assert!(seq.load_weights(&w, true).unwrap_err().to_string().contains("no parameter 'layers.2.weight'"));
    w.remove("layers.2.weight");
    w.insert("layers.1.weight".into(), missing.t());
    assert!(seq.load_weights(&w, false).unwrap_err().to_string().contains("'layers.1.weight' has shape [2, 16]"));
    let x = f["mlp.x"].clone();
    assert_eq!(seq.forward(&x).shape(), [4, 2]);
    // update: given names only, and each must exist.
    let w0 = seq.parameters()["layers.1.weight"].clone();
    seq.update(&BTreeMap::from([("layers.0.bias".to_string(), nuvec_core::ops::zeros([16], DType::F32))])).unwrap();
    assert_eq!(seq.parameters()["layers.0.bias"].sum(..).item::<f32>().unwrap(), 0.0);
    assert_eq!(seq.parameters()["layers.1.weight"].to_vec::<f32>().unwrap(), w0.to_vec::<f32>().unwrap());
    assert!(seq.update(&BTreeMap::from([("nope".to_string(), x)])).unwrap_err().to_string().contains("'nope'"));
}
