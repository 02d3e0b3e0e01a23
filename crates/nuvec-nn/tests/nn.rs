//! Activations and losses against MLX 0.32.4 (tests/data/nn.safetensors, recorded on the CPU by
//! make_nn.py); bad arguments give failed arrays naming the loss.

use std::collections::BTreeMap;
use std::path::Path;

use nuvec as _; // the backends
use nuvec_core::{Array, DType};
use nuvec_nn::activations as act;
use nuvec_nn::losses::{self, CrossEntropy, Reduction};

fn fixtures() -> BTreeMap<String, Array> {
    nuvec_io::load_safetensors(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/nn.safetensors")).unwrap()
}

fn close(got: &Array, want: &Array, what: &str) {
    assert_eq!(got.shape(), want.shape(), "{what}");
    assert_eq!(got.dtype(), want.dtype(), "{what}");
    let (g, w) = (got.astype(DType::F32).to_vec::<f32>().unwrap(), want.astype(DType::F32).to_vec::<f32>().unwrap());
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        assert!((a - b).abs() <= 2e-6 * b.abs().max(1.0), "{what}[{i}]: {a} against {b}");
    }
}

#[test]
fn activations_follow_mlx() {
    let f = fixtures();
    let x = &f["x"];
    let all: [(&str, Array); 24] = [
        ("relu", act::relu(x)),
        ("relu6", act::relu6(x)),
        ("relu2", act::relu2(x)),
        ("selu", act::selu(x)),
        ("gelu", act::gelu(x)),
        ("gelu_approx", act::gelu_approx(x)),
        ("gelu_fast_approx", act::gelu_fast_approx(x)),
        ("silu", act::silu(x)),
        ("softplus", act::softplus(x)),
        ("softsign", act::softsign(x)),
        ("mish", act::mish(x)),
        ("hardswish", act::hardswish(x)),
        ("log_sigmoid", act::log_sigmoid(x)),
        ("leaky_relu", act::leaky_relu(x, 0.1)),
        ("elu", act::elu(x, 0.5)),
        ("celu", act::celu(x, 0.5)),
        ("hard_tanh", act::hard_tanh(x, -2.0, 3.0)),
        ("hard_shrink", act::hard_shrink(x, 0.5)),
        ("softshrink", act::softshrink(x, 0.5)),
        ("prelu", act::prelu(x, &f["prelu.alpha"])),
        ("step", act::step(x, 0.5)),
        ("glu", act::glu(x, -1)),
        ("log_softmax", act::log_softmax(x, -1)),
        ("softmin", act::softmin(x, 0)),
    ];
    for (name, got) in &all {
        close(got, &f[&format!("act.{name}")], name);
    }
    // An odd axis: glu's error names split.
    assert!(act::glu(&Array::from_slice(&[1.0f32, 2.0, 3.0], [3]), 0).error().is_some());
}

#[test]
fn losses_follow_mlx() {
    let f = fixtures();
    let (logits, labels) = (&f["ce.logits"], &f["ce.labels"]);
    let ce = |o: CrossEntropy, t: &Array, l: &Array| losses::cross_entropy(l, t, &o);
    close(&ce(CrossEntropy::default(), labels, logits), &f["ce.plain"], "ce");
    let smooth = CrossEntropy { label_smoothing: 0.2, reduction: Reduction::Mean, ..Default::default() };
    close(&ce(smooth, labels, logits), &f["ce.smooth"], "ce smooth");
    let sum = CrossEntropy { reduction: Reduction::Sum, ..Default::default() };
    close(&ce(sum, &f["ce.probs"], logits), &f["ce.probs_loss"], "ce probs");
    let weighted = CrossEntropy { weights: Some(f["ce.w"].clone()), reduction: Reduction::Mean, ..Default::default() };
    close(&ce(weighted, labels, logits), &f["ce.weighted"], "ce weighted");
    let axis0 = CrossEntropy { axis: 0, ..Default::default() };
    close(&ce(axis0, labels, &logits.transpose(&[1, 0])), &f["ce.axis0"], "ce axis 0");

    let (p, t, tb) = (&f["reg.p"], &f["reg.t"], &f["reg.tb"]);
    close(&losses::l1_loss(p, t, Reduction::Mean), &f["reg.l1"], "l1");
    close(&losses::mse_loss(p, t, Reduction::Sum), &f["reg.mse"], "mse");
    close(&losses::smooth_l1_loss(p, t, 0.7, Reduction::None), &f["reg.smooth_l1"], "smooth l1");
    close(&losses::binary_cross_entropy(p, tb, None, true, Reduction::Mean), &f["reg.bce_logits"], "bce logits");
    let bce = losses::binary_cross_entropy(&p.sigmoid(), tb, Some(tb), false, Reduction::None);
    close(&bce, &f["reg.bce_probs"], "bce probs");
    close(&losses::kl_div_loss(&f["kl.p"], &f["kl.q"], -1, Reduction::Mean), &f["kl.loss"], "kl");
    close(&losses::nll_loss(&f["kl.p"], labels, -1, Reduction::Sum), &f["nll.loss"], "nll");
}

#[test]
fn cross_entropy_ignores_an_index_and_rejects_bad_arguments() {
    let f = fixtures();
    let (logits, labels) = (&f["ce.logits"], &f["ce.labels"]);
    // Row 2 ignored: its loss is 0 and the mean is over the other five.
    let mut ids = labels.astype(DType::I64).to_vec::<i64>().unwrap();
    ids[2] = -100;
    let t = Array::from_slice(&ids, [6]);
    let o = CrossEntropy { ignore_index: Some(-100), ..Default::default() };
    let per_row = losses::cross_entropy(logits, &t, &o).to_vec::<f32>().unwrap();
    let plain = f["ce.plain"].to_vec::<f32>().unwrap();
    assert_eq!(per_row[2], 0.0);
    for i in [0, 1, 3, 4, 5] {
        assert!((per_row[i] - plain[i]).abs() < 1e-6);
    }
    let mean = losses::cross_entropy(logits, &t, &CrossEntropy { reduction: Reduction::Mean, ..o.clone() });
    let want = [0, 1, 3, 4, 5].iter().map(|&i| plain[i]).sum::<f32>() / 5.0;
    assert!((mean.item::<f32>().unwrap() - want).abs() < 1e-6);

    for (bad, says) in [
        (losses::cross_entropy(logits, &Array::from_slice(&[1i32, 2], [2]), &CrossEntropy::default()), "targets shape"),
        (
            losses::cross_entropy(logits, labels, &CrossEntropy { label_smoothing: 1.0, ..Default::default() }),
            "label_smoothing",
        ),
        (losses::cross_entropy(logits, labels, &CrossEntropy { axis: 2, ..Default::default() }), "axis"),
        (losses::mse_loss(&f["reg.p"], &f["kl.p"], Reduction::Mean), "predictions shape"),
    ] {
        let e = bad.error().expect("a failed array").to_string();
        assert!(e.contains(says), "{e}");
    }
}
