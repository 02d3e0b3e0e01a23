//! `nuvec::random` beyond the MLX fixtures (`mlx_random.rs`): bad arguments give failed arrays
//! naming the function, gradients flow to distribution parameters but never through the bits,
//! vmap over keys equals a loop, and the per-thread default key sequence.

use nuvec::transforms::{jvp_flat, vjp_flat, vmap_flat};
use nuvec::{Array, DType, array, ops, random};

/// Checks that `a` failed in `op` at this file, with a message containing `words`.
#[track_caller]
fn fails(a: &Array, op: &str, words: &str) {
    let e = a.error().unwrap_or_else(|| panic!("{op}: expected a failed array"));
    assert_eq!(e.op_name(), Some(op), "{e}");
    let at = e.location().expect("location");
    assert!(at.file().ends_with("random.rs"), "{e} points at {}", at.file());
    let msg = e.to_string();
    assert!(msg.contains(words), "{msg:?} does not mention {words:?}");
    assert!(a.eval().is_err() && a.to_vec::<f32>().is_err());
}

#[test]
fn bad_arguments_fail() {
    let k = random::key(0);
    fails(&random::bits([3], 3, Some(&k)), "bits", "width");
    fails(&random::bits([-1], 4, Some(&k)), "bits", "-1");
    fails(&random::bits([2], 4, Some(&Array::from_slice(&[1u32, 2, 3], [3]))), "bits", "shape [2]");
    fails(&random::bits([2], 4, Some(&array![1, 2])), "bits", "uint32");
    fails(&random::split(&k, -2), "split", "num");
    fails(&random::split(&Array::from_slice(&[1u32; 4], [2, 2]), 2), "split", "shape [2]");
    fails(&random::uniform(0.0, 1.0, [2], DType::I32, Some(&k)), "uniform", "int32");
    fails(&random::uniform(0.0, 1.0, [2], DType::F64, Some(&k)), "uniform", "float64");
    fails(&random::uniform(array![0.0, 0.0, 0.0], 1.0, [2], DType::F32, Some(&k)), "uniform", "shape");
    fails(&random::normal([2], DType::I8, 0.0, 1.0, Some(&k)), "normal", "int8");
    fails(&random::randint(0, 5, [2], DType::F32, Some(&k)), "randint", "float32");
    fails(&random::bernoulli(array![1, 0], None, Some(&k)), "bernoulli", "floating");
    fails(&random::bernoulli(array![0.5, 0.5, 0.5], Some(&[2]), Some(&k)), "bernoulli", "broadcast");
    fails(&random::truncated_normal(-1.0, 1.0, None, DType::U8, Some(&k)), "truncated_normal", "uint8");
    fails(&random::gumbel([2], DType::Bool, Some(&k)), "gumbel", "bool");
    fails(&random::laplace([2], DType::I32, 0.0, 1.0, Some(&k)), "laplace", "int32");
    let logits = array![[0.0, 1.0], [2.0, 3.0]];
    fails(&random::categorical(&logits, 2, Some(&k)), "categorical", "axis");
    fails(&random::categorical_shape(&logits, -1, &[3], Some(&k)), "categorical", "broadcast");
    fails(&random::categorical_samples(&logits, -1, -1, Some(&k)), "categorical", "num_samples");
    fails(&random::uniform(0.0, 1.0, [2], DType::F32, Some(&array![1.0, 2.0])), "uniform", "uint32");
    // A failed key propagates its own error.
    let bad = random::split(&k, -1);
    let e = random::normal([2], DType::F32, 0.0, 1.0, Some(&bad)).error().unwrap();
    assert_eq!(e.op_name(), Some("split"));
    assert!(random::set_sequence_key(&array![1.0, 2.0]).is_err());
}

#[test]
fn bits_are_deterministic_and_sized() {
    let k = random::key(123);
    for width in [1, 2, 4] {
        for n in [0, 1, 3, 7, 64] {
            let a = random::bits([n], width, Some(&k));
            let b = random::bits([n], width, Some(&k));
            assert_eq!(a.to_bytes().unwrap(), b.to_bytes().unwrap());
            assert_eq!(a.nbytes(), n as usize * width as usize);
        }
    }
    // Different keys differ; widths view the same byte stream when the word count agrees.
    let a = random::bits([8], 1, Some(&random::key(1))).to_bytes().unwrap();
    let b = random::bits([8], 1, Some(&random::key(2))).to_bytes().unwrap();
    assert_ne!(a, b);
    let w4 = random::bits([2], 4, Some(&random::key(1))).to_bytes().unwrap();
    assert_eq!(a, w4);
    // split(key) halves are split(key, 2)'s rows, and differ from the key.
    let (k1, k2) = random::split2(&k);
    let both: Vec<u32> = random::split(&k, 2).to_vec().unwrap();
    assert_eq!(k1.to_vec::<u32>().unwrap(), both[..2]);
    assert_eq!(k2.to_vec::<u32>().unwrap(), both[2..]);
    let [a3, b3, c3] = random::split_n::<3>(&k);
    let all3: Vec<u32> = random::split(&k, 3).to_vec().unwrap();
    let joined: Vec<u32> = [a3, b3, c3].iter().flat_map(|x| x.to_vec::<u32>().unwrap()).collect();
    assert_eq!(joined, all3);
}

fn f64s(a: &Array) -> Vec<f64> {
    a.astype(DType::F64).to_vec().unwrap()
}

/// Gradients of the parameters of `normal` (in f64) against central finite differences.
#[test]
fn gradients_reach_loc_and_scale_in_f64() {
    let k = random::key(77);
    let f = |x: &[Array]| random::normal([3, 4], DType::F64, &x[0], &x[1], Some(&k));
    let loc = Array::from_slice(&[0.5f64, -1.0, 2.0, 0.0], [4]);
    let scale = Array::from_slice(&[1.5f64, 0.25, 3.0], [3, 1]);
    let w = Array::from_slice(&(0..12).map(|i| (i as f64 * 0.37).sin()).collect::<Vec<_>>(), [3, 4]);
    let loss = |x: &[Array]| (f(x) * &w).sum(..);
    let (_, g) = vjp_flat(|x| Ok(vec![loss(x)]), &[loc.clone(), scale.clone()], &[Array::from(1.0f64)]).unwrap();
    let eps = 1e-6;
    for (i, p) in [&loc, &scale].into_iter().enumerate() {
        let base = f64s(p);
        let got = f64s(&g[i]);
        for j in 0..base.len() {
            let bump = |d: f64| {
                let mut v = base.clone();
                v[j] += d;
                let q = Array::from_slice(&v, p.shape().to_vec());
                let args = if i == 0 { [q, scale.clone()] } else { [loc.clone(), q] };
                loss(&args).item::<f64>().unwrap()
            };
            let fd = (bump(eps) - bump(-eps)) / (2.0 * eps);
            assert!((got[j] - fd).abs() < 1e-6 * (1.0 + fd.abs()), "param {i} elem {j}: {} vs {fd}", got[j]);
        }
    }
}

#[test]
fn no_gradient_flows_through_the_bits() {
    let k = random::key(5);
    // d/dx sum(x * u) = u exactly: the samples are constants of the key.
    let x = Array::from_slice(&[1.0f32; 6], [6]);
    let (outs, g) = vjp_flat(
        |a| Ok(vec![(&a[0] * random::uniform(0.0, 1.0, [6], DType::F32, Some(&k))).sum(..)]),
        &[x],
        &[Array::from(1.0f32)],
    )
    .unwrap();
    let u = random::uniform(0.0, 1.0, [6], DType::F32, Some(&k));
    assert_eq!(g[0].to_vec::<f32>().unwrap(), u.to_vec::<f32>().unwrap());
    assert!((outs[0].item::<f32>().unwrap() - u.sum(..).item::<f32>().unwrap()).abs() < 1e-6);
    // The key itself gets a zero cotangent (or none), never NaN or an error.
    let (_, gk) = vjp_flat(
        |a| Ok(vec![random::bits([4], 4, Some(&a[0])).astype(DType::F32).sum(..)]),
        std::slice::from_ref(&k),
        &[Array::from(1.0f32)],
    )
    .unwrap();
    let zeros = gk[0].astype(DType::F64).abs().sum(..).item::<f64>().unwrap();
    assert_eq!(zeros, 0.0);
    // Forward mode: the tangent of uniform(low, high) in low is 1 - u.
    let (_, t) = jvp_flat(
        |a| Ok(vec![random::uniform(&a[0], 2.0, [5], DType::F32, Some(&k))]),
        &[Array::from(0.0f32)],
        &[Array::from(1.0f32)],
    )
    .unwrap();
    let u = random::uniform(0.0, 1.0, [5], DType::F32, Some(&k));
    let want: Vec<f32> = u.to_vec::<f32>().unwrap().iter().map(|v| 1.0 - v).collect();
    let got: Vec<f32> = t[0].to_vec().unwrap();
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() < 1e-6, "{got:?} vs {want:?}");
    }
}

#[test]
fn vmap_over_keys_equals_a_loop() {
    let keys = random::split(&random::key(31), 5);
    let draw = |k: &Array| {
        vec![
            random::normal([2, 3], DType::F32, 0.0, 1.0, Some(k)),
            random::bits([7], 1, Some(k)).astype(DType::F32),
            random::randint(0, 10, [4], DType::I32, Some(k)).astype(DType::F32),
            random::categorical(&array![[0.1, 0.5, 2.0], [1.0, 0.0, -1.0]], -1, Some(k)).astype(DType::F32),
        ]
    };
    for (axis, input) in [(0, keys.clone()), (1, keys.t())] {
        let mapped = vmap_flat(|x| Ok(draw(&x[0])), &[Some(axis)], &[0, 0, 0, 0])(&[input]).unwrap();
        for (j, m) in mapped.iter().enumerate() {
            let rows: Vec<Array> =
                (0..5).map(|i| draw(&keys.slice(&[i, 0], &[i + 1, 2], &[1, 1]).reshape([2]))[j].clone()).collect();
            let looped = ops::stack(&rows, 0);
            assert_eq!(m.shape(), looped.shape(), "output {j} axis {axis}");
            assert_eq!(m.to_bytes().unwrap(), looped.to_bytes().unwrap(), "output {j} axis {axis}");
        }
    }
}

#[test]
fn default_sequence_is_per_thread_and_replayable() {
    random::seed(99);
    let a: Vec<f32> = random::uniform(0.0, 1.0, [4], DType::F32, None).to_vec().unwrap();
    let b: Vec<f32> = random::uniform(0.0, 1.0, [4], DType::F32, None).to_vec().unwrap();
    assert_ne!(a, b, "successive draws differ");
    // Seeding again repeats them; the draws use the sequence's keys as explicit keys would.
    random::seed(99);
    let k1 = random::next_key();
    let k2 = random::next_key();
    assert_eq!(random::uniform(0.0, 1.0, [4], DType::F32, Some(&k1)).to_vec::<f32>().unwrap(), a);
    assert_eq!(random::uniform(0.0, 1.0, [4], DType::F32, Some(&k2)).to_vec::<f32>().unwrap(), b);
    // Another thread's sequence is its own: seeding it does not move this one.
    let here = random::sequence_key().to_vec::<u32>().unwrap();
    let there = std::thread::spawn(|| {
        random::seed(99);
        random::uniform(0.0, 1.0, [4], DType::F32, None).to_vec::<f32>().unwrap()
    })
    .join()
    .unwrap();
    assert_eq!(there, a);
    assert_eq!(random::sequence_key().to_vec::<u32>().unwrap(), here);
    // A saved sequence key replays what followed it.
    let saved = random::sequence_key();
    let c: Vec<f32> = random::normal([3], DType::F32, 0.0, 1.0, None).to_vec().unwrap();
    random::set_sequence_key(&saved).unwrap();
    assert_eq!(random::normal([3], DType::F32, 0.0, 1.0, None).to_vec::<f32>().unwrap(), c);
}

#[test]
fn distributions_have_their_moments() {
    let k = random::key(2024);
    let n = 200_000;
    let stats = |x: &Array| {
        let v = f64s(x);
        let m = v.iter().sum::<f64>() / v.len() as f64;
        (m, v.iter().map(|a| (a - m) * (a - m)).sum::<f64>() / v.len() as f64)
    };
    let (m, v) = stats(&random::uniform(-1.0, 3.0, [n], DType::F32, Some(&k)));
    assert!((m - 1.0).abs() < 0.02 && (v - 16.0 / 12.0).abs() < 0.02, "uniform {m} {v}");
    let (m, v) = stats(&random::normal([n], DType::F32, 1.0, 2.0, Some(&k)));
    assert!((m - 1.0).abs() < 0.02 && (v - 4.0).abs() < 0.05, "normal {m} {v}");
    let (m, v) = stats(&random::gumbel([n], DType::F32, Some(&k)));
    assert!((m - 0.5772).abs() < 0.02 && (v - 1.6449).abs() < 0.05, "gumbel {m} {v}");
    let z = random::normal([n], DType::Complex64, 0.0, 1.0, Some(&k));
    let re = f64s(&ops::view(&z, DType::F32).reshape([n, 2]).slice(&[0, 0], &[n, 1], &[1, 1]).reshape([n]));
    let var_re = re.iter().map(|a| a * a).sum::<f64>() / n as f64;
    assert!((var_re - 0.5).abs() < 0.02, "complex normal real part variance {var_re}");
    // Integers cover [low, high) evenly; categorical follows the softmax of the logits.
    let r: Vec<i32> = random::randint(-2, 3, [n], DType::I32, Some(&k)).to_vec().unwrap();
    for v in -2..3 {
        let frac = r.iter().filter(|&&x| x == v).count() as f64 / n as f64;
        assert!((frac - 0.2).abs() < 0.01, "randint {v}: {frac}");
    }
    let logits = array![0.0, 1.0, 2.0];
    let p: Vec<f64> = f64s(&logits.softmax(-1));
    for (tag, s) in [
        ("inverse cdf", random::categorical_samples(&logits, -1, n, Some(&k))),
        ("gumbel max", random::categorical(&logits.reshape([1, 3]).broadcast_to([n, 3]), -1, Some(&k))),
    ] {
        let s: Vec<u32> = s.to_vec().unwrap();
        for (c, pc) in p.iter().enumerate() {
            let frac = s.iter().filter(|&&x| x as usize == c).count() as f64 / n as f64;
            assert!((frac - pc).abs() < 0.01, "{tag} category {c}: {frac} vs {pc}");
        }
    }
    let t: Vec<f32> = random::truncated_normal(-0.5, 0.25, Some(&[n]), DType::F32, Some(&k)).to_vec().unwrap();
    assert!(t.iter().all(|v| (-0.5..=0.25).contains(v)));
    let b: Vec<bool> = random::bernoulli(0.7, Some(&[n]), Some(&k)).to_vec().unwrap();
    let frac = b.iter().filter(|&&x| x).count() as f64 / n as f64;
    assert!((frac - 0.7).abs() < 0.01, "bernoulli {frac}");
}
