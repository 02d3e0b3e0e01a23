//! Optimizers, schedules and clip_grad_norm against MLX 0.32.4 (tests/data/optim.safetensors,
//! recorded on the CPU by make_optim.py); the state's save and restore.

use std::collections::BTreeMap;
use std::path::Path;

use nuvec as _; // the backends
use nuvec_core::{Array, DType};
use nuvec_nn::optim::{self, Adafactor, Adam, AdamW, Lion, Optimizer, Schedule, Sgd};

fn fixtures() -> BTreeMap<String, Array> {
    nuvec_io::load_safetensors(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/optim.safetensors")).unwrap()
}

fn close(got: &Array, want: &Array, what: &str, tol: f32) {
    assert_eq!(got.shape(), want.shape(), "{what}");
    assert_eq!(got.dtype(), want.dtype(), "{what}");
    let (g, w) = (got.astype(DType::F32).to_vec::<f32>().unwrap(), want.astype(DType::F32).to_vec::<f32>().unwrap());
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        assert!((a - b).abs() <= tol * b.abs().max(1.0), "{what}[{i}]: {a} against {b}");
    }
}

fn linear_cosine() -> Schedule {
    optim::join_schedules(vec![optim::linear_schedule(0.0, 0.1, 2), optim::cosine_decay(0.1, 10, 0.0)], vec![2])
        .unwrap()
}

/// Four updates of {a, b} with MLX's recorded gradients, each compared with MLX's parameters.
fn check(name: &str, opt: &mut impl Optimizer, f: &BTreeMap<String, Array>) {
    let mut p = vec![f["param.a"].clone(), f["param.b"].clone()];
    for s in 0..4 {
        let g = vec![f[&format!("grad.{s}.a")].clone(), f[&format!("grad.{s}.b")].clone()];
        p = opt.apply_gradients(&g, &p);
        for (k, x) in ["a", "b"].iter().zip(&p) {
            close(x, &f[&format!("{name}.{s}.{k}")], &format!("{name} step {s} {k}"), 2e-6);
        }
    }
    assert_eq!(opt.step(), 4);
}

#[test]
fn optimizers_follow_mlx() {
    let f = fixtures();
    check("sgd", &mut Sgd::new(0.1), &f);
    let mut s = Sgd::new(0.1);
    (s.momentum, s.weight_decay, s.dampening) = (0.9, 0.01, 0.1);
    check("sgd_momentum", &mut s, &f);
    let mut s = Sgd::new(0.1);
    (s.momentum, s.nesterov) = (0.9, true);
    check("sgd_nesterov", &mut s, &f);
    check("adam", &mut Adam::new(0.01), &f);
    let mut a = Adam::new(0.01);
    a.bias_correction = true;
    check("adam_bc", &mut a, &f);
    check("adamw", &mut AdamW::new(0.01, 0.1), &f);
    let mut l = Lion::new(0.01);
    l.weight_decay = 0.1;
    check("lion", &mut l, &f);
    check("adam_cosine", &mut Adam::new(optim::cosine_decay(0.01, 5, 0.0)), &f);
    let mut s = Sgd::new(linear_cosine());
    s.momentum = 0.5;
    check("sgd_join", &mut s, &f);
    check("adafactor", &mut Adafactor::new(), &f);
    let mut a = Adafactor::with_learning_rate(0.01);
    (a.beta_1, a.weight_decay) = (Some(0.9), 0.1);
    check("adafactor_lr", &mut a, &f);
    let mut a = Adafactor::new();
    (a.warmup_init, a.scale_parameter, a.clip_threshold) = (true, false, 0.5);
    check("adafactor_warm", &mut a, &f);
}

#[test]
fn schedules_follow_mlx() {
    let f = fixtures();
    for (name, s) in [
        ("linear", optim::linear_schedule(0.0, 1.0, 10)),
        ("cosine", optim::cosine_decay(1.0, 10, 0.1)),
        ("step", optim::step_decay(1.0, 0.5, 3)),
        ("exponential", optim::exponential_decay(1.0, 0.9)),
        ("join", linear_cosine()),
    ] {
        let got: Vec<f32> = (0..14).map(|i| s.at(i)).collect();
        close(&Array::from_slice(&got, [14]), &f[&format!("schedule.{name}")], name, 1e-6);
    }
    assert!(optim::join_schedules(vec![Schedule::Constant(1.0)], vec![3]).is_err());
}

#[test]
fn clip_grad_norm_follows_mlx() {
    let f = fixtures();
    let g = vec![f["clip.in.a"].clone(), f["clip.in.b"].clone()];
    for max in [1, 100] {
        let (clipped, norm) = optim::clip_grad_norm(&g, max as f32);
        close(&norm, &f[&format!("clip.{max}.norm")], "norm", 1e-6);
        close(&clipped[0], &f[&format!("clip.{max}.a")], "a", 1e-6);
        // float16 keeps its dtype: within its rounding.
        close(&clipped[1], &f[&format!("clip.{max}.b")], "b", 1e-3);
    }
}

#[test]
fn state_saves_and_restores() {
    let f = fixtures();
    let g = |s: usize| vec![f[&format!("grad.{s}.a")].clone(), f[&format!("grad.{s}.b")].clone()];
    let mut a = Adam::new(0.01);
    let p1 = a.apply_gradients(&g(0), &vec![f["param.a"].clone(), f["param.b"].clone()]);
    let dir = std::env::temp_dir().join(format!("nuvec-nn-state-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("adam.safetensors");
    let state = a.state();
    assert_eq!(state.keys().collect::<Vec<_>>(), ["0.m", "0.v", "1.m", "1.v", "step"]);
    let refs: Vec<(&str, &Array)> = state.iter().map(|(k, v)| (k.as_str(), v)).collect();
    nuvec_io::save_safetensors(&path, &refs, None).unwrap();
    let mut b = Adam::new(0.01);
    b.set_state(nuvec_io::load_safetensors(&path).unwrap()).unwrap();
    assert_eq!(b.step(), 1);
    // The restored optimizer's next steps are the recorded ones.
    let mut pa = a.apply_gradients(&g(1), &p1);
    let mut pb = b.apply_gradients(&g(1), &p1);
    for s in 2..4 {
        pa = a.apply_gradients(&g(s), &pa);
        pb = b.apply_gradients(&g(s), &pb);
    }
    for (k, (x, y)) in ["a", "b"].iter().zip(pa.iter().zip(&pb)) {
        assert_eq!(x.to_vec::<f32>().unwrap(), y.to_vec::<f32>().unwrap());
        close(y, &f[&format!("adam.3.{k}")], k, 2e-6);
    }
    assert!(b.set_state(BTreeMap::new()).unwrap_err().to_string().contains("step"));
    // Trees of other shapes give failed arrays, not a panic.
    let bad = b.apply_gradients(&vec![f["grad.0.a"].clone()], &vec![f["param.a"].clone(), f["param.b"].clone()]);
    assert!(bad[0].error().is_some());
    std::fs::remove_dir_all(&dir).unwrap();
}
