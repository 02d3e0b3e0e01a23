//! Tensor-parallel layers on groups of threads: an MLP split as a model is (the first layer's
//! outputs sharded, the second's inputs, summed) gives the single-device output on every rank,
//! plain and quantized, for 1, 2 and 4 ranks; an embedding split by vocabulary looks ids up
//! and serves as a tied output head, and an untied head's logits gather, as the whole table
//! does; splits that do not divide fail naming why.

use nuvec::distributed::Group;
use nuvec::nn::{Embedding, Layer, Linear, Module, Sharding, shard_embedding, shard_linear};
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

#[test]
fn a_split_vocabulary_embeds_and_projects_as_the_whole_one() {
    let table = Embedding::new(96, 64, Some(&random::key(9)));
    let head = Linear::new(64, 96, false, Some(&random::key(10)));
    let ids = Array::from_slice(&[0i32, 95, 47, 48, 3, 71], [2, 3]);
    let h = random::normal([2, 3, 64], DType::F32, 0.0f32, 1.0f32, Some(&random::key(11)));
    for quantized in [false, true] {
        let (table, head) = if quantized {
            (table.to_quantized(32, 8, "affine").unwrap(), head.to_quantized(32, 8, "affine").unwrap())
        } else {
            (table.clone(), head.clone())
        };
        let want = [f64s(&table.forward(&ids)), f64s(&table.as_linear(&h)), f64s(&head.forward(&h))];
        for n in [1, 2, 3] {
            let groups = Group::local(n);
            let got: Vec<[Vec<f64>; 3]> = std::thread::scope(|s| {
                let hs: Vec<_> = groups
                    .into_iter()
                    .map(|g| {
                        let (table, head, ids, h) = (&table, &head, &ids, &h);
                        s.spawn(move || {
                            let t = shard_embedding(table, &g).unwrap();
                            let l = shard_linear(head, Sharding::AllToSharded, &g).unwrap();
                            let rows = t.forward(ids);
                            assert_eq!(rows.shape(), &[2, 3, 64], "{:?}", rows.eval().err());
                            [f64s(&rows), f64s(&t.as_linear(h)), f64s(&l.forward_gathered(h))]
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            for (r, outs) in got.iter().enumerate() {
                for (k, (g, w)) in outs.iter().zip(&want).enumerate() {
                    assert_eq!(g.len(), w.len(), "output {k}, {n} ranks, rank {r}");
                    for (i, (a, b)) in g.iter().zip(w).enumerate() {
                        assert!(
                            (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                            "output {k} quantized {quantized} {n} ranks rank {r} {i}: {a} vs {b}"
                        );
                    }
                }
            }
        }
    }
    let e = shard_embedding(&table, &Group::local(5)[0]).unwrap_err().to_string();
    assert!(e.contains("96") && e.contains("5 ranks"), "{e}");
}
