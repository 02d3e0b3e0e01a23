//! Paged attention and cache writes: paged attention equals contiguous attention over the same
//! keys (causal at each sequence's end, windows, sinks), ragged lengths, clamped ids and
//! lengths, writes against a loop, and errors naming the argument.

use nuvec::fast::{self, AttentionOptions};
use nuvec::{Array, DType, ops};

/// Deterministic values in about [-1, 1].
fn values(shape: &[i32], seed: f32) -> Array {
    let n: i32 = shape.iter().product();
    ((ops::arange(0, n, 1).astype(DType::F32) * 0.6180 + seed).sin()).reshape(shape)
}

fn max_diff(a: &Array, b: &Array) -> f64 {
    assert_eq!(a.shape(), b.shape());
    (a.astype(DType::F64) - b.astype(DType::F64)).abs().max(..).item::<f64>().unwrap()
}

/// Sequence `s`'s first `len` keys, contiguous `[1, H, len, D]`, from its blocks.
fn contiguous(cache: &Array, table: &[i32], len: i32) -> Array {
    let bs = cache.shape()[2];
    let parts: Vec<Array> = table
        .iter()
        .map(|&b| cache.slice(&[b, 0, 0, 0], &[b + 1, cache.shape()[1], bs, cache.shape()[3]], &[1, 1, 1, 1]))
        .collect();
    let all = ops::concatenate(&parts, 2);
    all.slice(&[0, 0, 0, 0], &[1, all.shape()[1], len, all.shape()[3]], &[1, 1, 1, 1])
}

struct Case {
    k: Array,
    v: Array,
    tables: Vec<Vec<i32>>,
    lengths: Vec<i32>,
}

fn case(bs: i32, d: i32, dtype: DType) -> Case {
    let blocks = 12;
    let k = values(&[blocks, 2, bs, d], 0.3).astype(dtype);
    let v = values(&[blocks, 2, bs, d], 1.7).astype(dtype);
    // Three sequences: blocks out of order, one shorter than its table, one of a single key.
    let tables = vec![vec![7, 2, 9], vec![0, 11, 4], vec![5, 3, 1]];
    let lengths = vec![3 * bs, 2 * bs - 3, 1];
    Case { k, v, tables, lengths }
}

fn table_array(tables: &[Vec<i32>]) -> Array {
    let flat: Vec<i32> = tables.iter().flatten().copied().collect();
    Array::from_slice(&flat, vec![tables.len() as i32, tables[0].len() as i32])
}

#[test]
fn paged_attention_equals_contiguous_attention() {
    let cases = [
        (8, 16, DType::F32, 1e-5),
        (16, 64, DType::F32, 1e-5),
        (16, 64, DType::BF16, 2e-2),
        // Blocks of fewer than 8 positions (the GPU's cp.async kernel, not TMA's).
        (4, 64, DType::BF16, 2e-2),
    ];
    for (bs, d, dtype, tol) in cases {
        let c = case(bs, d, dtype);
        // Sinks of q's dtype: the GPU's paged kernel reads them.
        let sinks = values(&[4], 2.5).astype(dtype);
        for l in [1, 3] {
            let q = values(&[3, 4, l, d], 0.9).astype(dtype);
            let scale = 1.0 / (d as f32).sqrt();
            let options = [
                ("causal", AttentionOptions::causal()),
                ("window 5", AttentionOptions::causal().window(5)),
                ("sinks", AttentionOptions::causal().sinks(&sinks)),
            ];
            for (what, opts) in options {
                let out = fast::paged_attention(
                    &q,
                    &c.k,
                    &c.v,
                    &table_array(&c.tables),
                    &Array::from_slice(&c.lengths, vec![3]),
                    scale,
                    &opts,
                );
                assert!(out.error().is_none(), "{what}: {:?}", out.error());
                assert_eq!(out.shape(), &[3, 4, l, d]);
                for s in 0..3 {
                    let len = c.lengths[s];
                    let (k, v) = (contiguous(&c.k, &c.tables[s], len), contiguous(&c.v, &c.tables[s], len));
                    let qs = q.slice(&[s as i32, 0, 0, 0], &[s as i32 + 1, 4, l, d], &[1, 1, 1, 1]);
                    let want = fast::scaled_dot_product_attention(&qs, &k, &v, scale, &opts);
                    let got = out.slice(&[s as i32, 0, 0, 0], &[s as i32 + 1, 4, l, d], &[1, 1, 1, 1]);
                    let diff = max_diff(&got, &want);
                    assert!(diff <= tol, "block {bs} D {d} {dtype} L {l} {what} sequence {s}: differs by {diff}");
                }
            }
        }
    }
}

/// Long sequences of grouped heads split their keys into partitions on the GPU: every block
/// size, head size and query count of decoding against contiguous attention (half precision).
#[test]
fn long_sequences_of_grouped_heads_equal_contiguous_attention() {
    let cases = [
        (16, 128, DType::BF16),
        (64, 128, DType::F16),
        (64, 64, DType::BF16),
        (32, 256, DType::BF16),
        (128, 128, DType::BF16),
        // A head size without TMA kernels.
        (16, 96, DType::BF16),
    ];
    for (bs, d, dtype) in cases {
        let (blocks, hkv, hq) = (96, 2, 8);
        let k = values(&[blocks, hkv, bs, d], 0.7).astype(dtype);
        let v = values(&[blocks, hkv, bs, d], 2.9).astype(dtype);
        let per = 2048 / bs;
        // Sequence 0 runs over every block of its table, sequence 1 stops mid-block.
        let tables: Vec<Vec<i32>> = vec![
            (0..per).map(|i| (i * 7) % blocks).collect(),
            (0..per).map(|i| (blocks - 1 - i).rem_euclid(blocks)).collect(),
        ];
        let lengths = vec![per * bs, per * bs / 2 + 5];
        for l in [1, 4] {
            let q = values(&[2, hq, l, d], 1.3).astype(dtype);
            let scale = 1.0 / (d as f32).sqrt();
            let window = AttentionOptions::causal().window(700);
            for (what, opts) in [("causal", AttentionOptions::causal()), ("window 700", window)] {
                let out = fast::paged_attention(
                    &q,
                    &k,
                    &v,
                    &table_array(&tables),
                    &Array::from_slice(&lengths, vec![2]),
                    scale,
                    &opts,
                );
                for s in 0..2 {
                    let len = lengths[s];
                    let (ks, vs) = (contiguous(&k, &tables[s], len), contiguous(&v, &tables[s], len));
                    let qs = q.slice(&[s as i32, 0, 0, 0], &[s as i32 + 1, hq, l, d], &[1, 1, 1, 1]);
                    let want = fast::scaled_dot_product_attention(
                        &qs.astype(DType::F32),
                        &ks.astype(DType::F32),
                        &vs.astype(DType::F32),
                        scale,
                        &opts,
                    );
                    let got = out.slice(&[s as i32, 0, 0, 0], &[s as i32 + 1, hq, l, d], &[1, 1, 1, 1]);
                    let diff = max_diff(&got, &want);
                    assert!(diff <= 1e-2, "block {bs} D {d} {dtype} L {l} {what} sequence {s}: differs by {diff}");
                }
            }
        }
    }
}

#[test]
fn ids_and_lengths_are_clamped_into_the_cache() {
    for (d, dtype) in [(16, DType::F32), (64, DType::BF16)] {
        let c = case(8, d, dtype);
        let q = values(&[3, 4, 2, d], 0.4).astype(dtype);
        let opts = AttentionOptions::causal();
        let bad = table_array(&[vec![-5, 2, 900], vec![0, 11, 4], vec![5, 3, 1]]);
        let clamped = table_array(&[vec![0, 2, 11], vec![0, 11, 4], vec![5, 3, 1]]);
        let lengths = Array::from_slice(&[1_000_000, -4, 2], vec![3]);
        let fixed = Array::from_slice(&[24, 0, 2], vec![3]);
        let a = fast::paged_attention(&q, &c.k, &c.v, &bad, &lengths, 0.25, &opts);
        let b = fast::paged_attention(&q, &c.k, &c.v, &clamped, &fixed, 0.25, &opts);
        assert_eq!(max_diff(&a, &b), 0.0, "clamped ids and lengths");
        // A sequence without keys gives zeros.
        let empty = a.slice(&[1, 0, 0, 0], &[2, 4, 2, d], &[1, 1, 1, 1]);
        assert_eq!(empty.abs().max(..).astype(DType::F32).item::<f32>().unwrap(), 0.0);
    }
}

#[test]
fn paged_write_matches_a_loop_and_skips_slots_outside() {
    let (blocks, h, bs, d) = (3, 2, 4, 5);
    let cache = values(&[blocks, h, bs, d], 0.2);
    let new = values(&[4, h, d], 3.1);
    let slots = [6, -1, 11, 12];
    let out = fast::paged_write(&cache, &new, &Array::from_slice(&slots, vec![4]));
    let mut want: Vec<f32> = cache.to_vec().unwrap();
    let rows: Vec<f32> = new.to_vec().unwrap();
    for (t, &s) in slots.iter().enumerate() {
        if !(0..blocks * bs).contains(&s) {
            continue;
        }
        let (b, p) = (s / bs, s % bs);
        for hh in 0..h {
            for j in 0..d {
                want[(((b * h + hh) * bs + p) * d + j) as usize] = rows[((t as i32 * h + hh) * d + j) as usize];
            }
        }
    }
    assert_eq!(out.to_vec::<f32>().unwrap(), want);
    // Writing a sequence's keys, then attending them, equals attention over them.
    let keys = values(&[6, h, d], 0.7);
    let (k, v) = (ops::zeros([blocks, h, bs, d], DType::F32), ops::zeros([blocks, h, bs, d], DType::F32));
    let slots = Array::from_slice(&[8, 9, 10, 11, 0, 1], vec![6]);
    let (k, v) = (fast::paged_write(&k, &keys, &slots), fast::paged_write(&v, &(&keys * 2.0f32), &slots));
    let q = values(&[1, h, 1, d], 1.3);
    let tables = Array::from_slice(&[2, 0], vec![1, 2]);
    let got = fast::paged_attention(&q, &k, &v, &tables, &Array::from_slice(&[6], vec![1]), 0.5, &Default::default());
    let kc = keys.transpose(&[1, 0, 2]).reshape([1, h, 6, d]);
    let want = fast::scaled_dot_product_attention(&q, &kc, &(&kc * 2.0f32), 0.5, &Default::default());
    assert!(max_diff(&got, &want) < 1e-6);
}

#[test]
fn bad_arguments_name_the_argument() {
    let c = case(8, 16, DType::F32);
    let q = values(&[3, 4, 1, 16], 0.4);
    let tables = table_array(&c.tables);
    let lengths = Array::from_slice(&c.lengths, vec![3]);
    let mask = ops::ones([1, 1, 1, 24], DType::Bool);
    let fails = |a: Array, op: &str, word: &str| {
        let e = a.error().unwrap_or_else(|| panic!("expected {op} to fail"));
        assert_eq!(e.op_name(), Some(op), "{e}");
        assert!(e.to_string().contains(word), "{e} does not mention {word}");
    };
    fails(
        fast::paged_attention(&q, &c.k, &c.v, &tables, &lengths, 0.25, &AttentionOptions::default().mask(&mask)),
        "paged_attention",
        "mask",
    );
    let k6 = ops::zeros([4, 2, 6, 16], DType::F32);
    fails(
        fast::paged_attention(&q, &k6, &k6, &tables, &lengths, 0.25, &Default::default()),
        "paged_attention",
        "power of two",
    );
    fails(
        fast::paged_attention(&q, &c.k, &c.v, &tables.astype(DType::F32), &lengths, 0.25, &Default::default()),
        "paged_attention",
        "block_tables",
    );
    fails(
        fast::paged_attention(&q, &c.k, &c.v, &tables, &Array::from_slice(&[1, 2], vec![2]), 0.25, &Default::default()),
        "paged_attention",
        "lengths",
    );
    let cache = ops::zeros([2, 2, 4, 16], DType::F32);
    fails(
        fast::paged_write(&cache, &ops::zeros([3, 2, 8], DType::F32), &Array::from_slice(&[0, 1, 2], vec![3])),
        "paged_write",
        "same H and D",
    );
    fails(
        fast::paged_write(&cache, &ops::zeros([3, 2, 16], DType::F32), &ops::zeros([3], DType::F32)),
        "paged_write",
        "slots",
    );
}

#[test]
fn ragged_prefill_equals_attention_per_sequence() {
    let c = case(8, 16, DType::F32);
    // New tokens per sequence: 5 of 24 keys, none of 13, 1 of 1.
    let new = [5, 0, 1];
    let starts = [0, 5, 5, 6];
    let q = values(&[6, 4, 16], 2.2);
    let sinks = values(&[4], 0.5);
    for (what, opts) in [
        ("causal", AttentionOptions::causal()),
        ("window 4", AttentionOptions::causal().window(4)),
        ("sinks", AttentionOptions::default().sinks(&sinks)),
    ] {
        for chunk in [1, 4, 64] {
            let out = fast::paged_prefill(
                &q,
                &c.k,
                &c.v,
                &table_array(&c.tables),
                &Array::from_slice(&c.lengths, vec![3]),
                &Array::from_slice(&starts, vec![4]),
                0.25,
                &opts,
                chunk,
            );
            assert!(out.error().is_none(), "{what}: {:?}", out.error());
            assert_eq!(out.shape(), &[6, 4, 16]);
            for s in 0..3 {
                let (n, t0) = (new[s], starts[s]);
                if n == 0 {
                    continue;
                }
                let len = c.lengths[s];
                let (k, v) = (contiguous(&c.k, &c.tables[s], len), contiguous(&c.v, &c.tables[s], len));
                let qs =
                    q.slice(&[t0, 0, 0], &[t0 + n, 4, 16], &[1, 1, 1]).transpose(&[1, 0, 2]).reshape([1, 4, n, 16]);
                // Paged attention is causal at each sequence's end whatever the options say.
                let mut o = AttentionOptions::causal().sinks(opts.sinks);
                if let Some(w) = opts.window {
                    o = o.window(w);
                }
                let want = fast::scaled_dot_product_attention(&qs, &k, &v, 0.25, &o);
                let got =
                    out.slice(&[t0, 0, 0], &[t0 + n, 4, 16], &[1, 1, 1]).transpose(&[1, 0, 2]).reshape([1, 4, n, 16]);
                let diff = max_diff(&got, &want);
                assert!(diff <= 1e-5, "{what} chunk {chunk} sequence {s}: differs by {diff}");
            }
        }
    }
}

/// The derivative (the composition's) with respect to the queries and the caches equals
/// contiguous attention's on the same keys, scattered back into the blocks the table names.
#[test]
fn paged_attention_differentiates_as_contiguous_attention() {
    use nuvec::transforms::grad;
    let c = case(8, 16, DType::F32);
    let q = values(&[3, 4, 2, 16], 0.8);
    let tables = table_array(&c.tables);
    let lengths = Array::from_slice(&c.lengths, vec![3]);
    let opts = AttentionOptions::causal();
    let w = values(&[3, 4, 2, 16], 3.1);
    let loss = |(q, k, v): &(Array, Array, Array)| {
        (fast::paged_attention(q, k, v, &tables, &lengths, 0.25, &opts) * &w).sum(..)
    };
    let (dq, dk, dv) = grad(loss)(&(q.clone(), c.k.clone(), c.v.clone())).unwrap();
    for s in 0..3 {
        let len = c.lengths[s];
        let qs = q.slice(&[s as i32, 0, 0, 0], &[s as i32 + 1, 4, 2, 16], &[1, 1, 1, 1]);
        let ws = w.slice(&[s as i32, 0, 0, 0], &[s as i32 + 1, 4, 2, 16], &[1, 1, 1, 1]);
        let (ks, vs) = (contiguous(&c.k, &c.tables[s], len), contiguous(&c.v, &c.tables[s], len));
        let contiguous_loss = |(q, k, v): &(Array, Array, Array)| {
            (fast::scaled_dot_product_attention(q, k, v, 0.25, &opts) * &ws).sum(..)
        };
        let (gq, gk, gv) = grad(contiguous_loss)(&(qs, ks, vs)).unwrap();
        let got = dq.slice(&[s as i32, 0, 0, 0], &[s as i32 + 1, 4, 2, 16], &[1, 1, 1, 1]);
        assert!(max_diff(&got, &gq) <= 1e-5, "dq of sequence {s}");
        // Sequence s's positions of dk and dv, gathered as its keys were (the tables share no block).
        let (pk, pv) = (contiguous(&dk, &c.tables[s], len), contiguous(&dv, &c.tables[s], len));
        assert!(max_diff(&pk, &gk) <= 1e-5, "dk of sequence {s}");
        assert!(max_diff(&pv, &gv) <= 1e-5, "dv of sequence {s}");
    }
}
