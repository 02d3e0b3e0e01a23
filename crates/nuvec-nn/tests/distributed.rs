//! Tensor-parallel layers on groups of threads: an MLP split as a model is (the first layer's
//! outputs sharded, the second's inputs, summed) gives the single-device output on every rank,
//! plain and quantized, for 1, 2 and 4 ranks; splits that do not divide fail naming why.

use nuvec::distributed::Group;
use nuvec::nn::{Layer, Linear, Module, Sharding, shard_linear};
use nuvec::{Array, DType, random};

fn f64s(a: &Array) -> Vec<f64> {
    a.astype(DType::F64).to_vec::<f64>().unwrap()
}

/// Every rank's output of `x` through `first` split AllToSharded and `second` ShardedToAll.
fn sharded_outputs(n: usize, first: &Linear, second: &Linear, x: &Array) -> Vec<(Vec<f64>, Vec<String>)> {
    let groups = Group::local(n);
    std::thread::scope(|s| {
        let hs: Vec<_> = groups
            .into_iter()
            .map(|g| {
                s.spawn(move || {
                    let a = shard_linear(first, Sharding::AllToSharded, &g).unwrap();
                    let b = shard_linear(second, Sharding::ShardedToAll, &g).unwrap();
                    let y = b.forward(&nuvec::nn::relu(&a.forward(x)));
                    let mut names: Vec<String> = a.parameters().keys().cloned().collect();
                    names.extend(b.parameters().keys().map(|k| format!("second.{k}")));
                    (f64s(&y), names)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn a_split_mlp_matches_the_whole_one() {
    let key = random::key(7);
    let (k1, k2) = random::split2(&key);
    let first = Linear::new(64, 128, true, Some(&k1));
    let second = Linear::new(128, 64, true, Some(&k2));
    let x = random::normal([3, 64], DType::F32, 0.0f32, 1.0f32, Some(&random::key(8)));
    for quantized in [false, true] {
        let (first, second) = if quantized {
            (first.to_quantized(32, 4, "affine").unwrap(), second.to_quantized(32, 4, "affine").unwrap())
        } else {
            (first.clone(), second.clone())
        };
        let want = f64s(&second.forward(&nuvec::nn::relu(&first.forward(&x))));
        for n in [1, 2, 4] {
            for (r, (got, names)) in sharded_outputs(n, &first, &second, &x).into_iter().enumerate() {
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (g - w).abs() <= 1e-4 * (1.0 + w.abs()),
                        "quantized {quantized} {n} ranks, rank {r}, {i}: {g} vs {w}"
                    );
                }
                assert!(
                    names.contains(&"weight".to_string()) && names.contains(&"second.bias".to_string()),
                    "{names:?}"
                );
                assert_eq!(names.iter().any(|n| n == "scales"), quantized, "{names:?}");
            }
        }
    }
}

#[test]
fn splits_that_do_not_divide_fail_naming_why() {
    let groups = Group::local(3);
    let layer = Linear::new(64, 128, true, None);
    let e = shard_linear(&layer, Sharding::AllToSharded, &groups[0]).unwrap_err().to_string();
    assert!(e.contains("weight") && e.contains("128") && e.contains("3 ranks"), "{e}");
    let q = Linear::new(96, 8, false, None).to_quantized(32, 4, "affine").unwrap();
    let two = Group::local(2);
    let e = shard_linear(&q, Sharding::ShardedToAll, &two[0]).unwrap_err().to_string();
    assert!(e.contains("groups of 32"), "{e}");
}
