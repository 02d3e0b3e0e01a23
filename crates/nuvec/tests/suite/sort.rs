//! sort, argsort, partition, argpartition and topk: the defining properties on random data of
//! every dtype, axis and layout (sortedness, stability, permutations, the partition property,
//! `sort == take(argsort)`), error cases, and derivatives (finite differences in f64, vmap
//! against a loop). Agreement with MLX itself is `mlx_sort.rs`.

use crate::Rng;
use nuvec::transforms::{jvp_flat, vjp_flat, vmap_flat};
use nuvec::{Array, DType, ops};

/// This module's draws.
impl Rng {
    /// Values with many ties (small integers), some NaN when `nan`.
    fn values(&mut self, n: usize, nan: bool) -> Vec<f64> {
        (0..n).map(|_| if nan && self.below(8) == 0 { f64::NAN } else { self.below(9) as f64 - 4.0 }).collect()
    }
    /// Distinct-enough values (no ties in practice) for derivative checks.
    fn smooth(&mut self, shape: &[i32]) -> Array {
        let n: i32 = shape.iter().product();
        let v: Vec<f64> = (0..n).map(|_| 4.0 * self.unit() - 2.0).collect();
        Array::from_slice(&v, shape)
    }
}

/// The rows along `axis` of a row-major `shape`, as lists of flat positions.
fn rows(shape: &[i32], axis: usize) -> Vec<Vec<usize>> {
    let strides: Vec<usize> = (0..shape.len()).map(|i| shape[i + 1..].iter().product::<i32>() as usize).collect();
    let n: usize = shape.iter().product::<i32>() as usize;
    let len = shape[axis] as usize;
    (0..n)
        .filter(|&p| (p / strides[axis]).is_multiple_of(len))
        .map(|p| (0..len).map(|j| p + j * strides[axis]).collect())
        .collect()
}

/// MLX's order on f64 values: NaN last.
fn le(a: f64, b: f64) -> bool {
    b.is_nan() || (!a.is_nan() && a <= b)
}

fn same(a: f64, b: f64) -> bool {
    a == b || (a.is_nan() && b.is_nan())
}

const DTYPES: [DType; 13] = [
    DType::Bool,
    DType::U8,
    DType::U16,
    DType::U32,
    DType::U64,
    DType::I8,
    DType::I16,
    DType::I32,
    DType::I64,
    DType::F16,
    DType::BF16,
    DType::F32,
    DType::F64,
];

/// Random inputs: shape, axis, and a layout (contiguous, transposed, or a strided slice).
fn inputs(rng: &mut Rng, dtype: DType) -> (Array, usize) {
    let rank = 1 + rng.below(3);
    let shape: Vec<i32> = (0..rank).map(|_| 1 + rng.below(7) as i32).collect();
    let n: i32 = shape.iter().product();
    let base = Array::from_slice(&rng.values(n as usize * 2, dtype.is_float()), [n * 2]).astype(dtype);
    let x = match rng.below(3) {
        0 => base.slice(&[0], &[n], &[1]).reshape(&shape[..]),
        1 => {
            let rev: Vec<i32> = shape.iter().rev().copied().collect();
            let perm: Vec<i32> = (0..rank as i32).rev().collect();
            base.slice(&[0], &[n], &[1]).reshape(rev).transpose(&perm)
        }
        _ => base.slice(&[1], &[2 * n], &[2]).reshape(&shape[..]),
    };
    (x, rng.below(rank))
}

fn f64s(x: &Array) -> Vec<f64> {
    x.contiguous().astype(DType::F64).to_vec::<f64>().unwrap()
}

#[test]
fn sort_and_argsort_properties_for_every_dtype_and_layout() {
    let mut rng = Rng(7);
    let mut checked = 0;
    for dtype in DTYPES {
        for _ in 0..12 {
            let (x, axis) = inputs(&mut rng, dtype);
            let ax = axis as i32 - if rng.below(2) == 0 { x.ndim() as i32 } else { 0 };
            let s = x.sort(ax);
            let i = x.argsort(ax);
            assert_eq!(s.dtype(), dtype);
            assert_eq!(i.dtype(), DType::U32);
            assert_eq!(s.shape(), x.shape());
            let (xv, sv) = (f64s(&x), f64s(&s));
            let iv: Vec<u32> = i.contiguous().to_vec::<u32>().unwrap();
            for row in rows(x.shape(), axis) {
                let mut seen = vec![false; row.len()];
                for (j, &p) in row.iter().enumerate() {
                    let k = iv[p] as usize;
                    assert!(
                        k < row.len() && !std::mem::replace(&mut seen[k], true),
                        "{dtype} argsort not a permutation"
                    );
                    assert!(same(xv[row[k]], sv[p]), "{dtype}: sort != take(argsort)");
                    if j > 0 {
                        let (a, b) = (sv[row[j - 1]], sv[p]);
                        assert!(le(a, b), "{dtype}: {a} before {b}");
                        if same(a, b) {
                            assert!(iv[row[j - 1]] < iv[p], "{dtype}: unstable");
                        }
                    }
                }
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 12 * DTYPES.len());
}

#[test]
fn partition_properties_for_every_dtype_and_kth() {
    let mut rng = Rng(11);
    for dtype in DTYPES {
        for _ in 0..12 {
            let (x, axis) = inputs(&mut rng, dtype);
            let len = x.shape()[axis];
            let kth = rng.below(len as usize) as i32 - if rng.below(2) == 0 { len } else { 0 };
            let k = kth.rem_euclid(len) as usize;
            let p = x.partition(kth, axis as i32);
            let ip = x.argpartition(kth, axis as i32);
            let sorted = f64s(&x.sort(axis as i32));
            let (xv, pv) = (f64s(&x), f64s(&p));
            let iv: Vec<u32> = ip.contiguous().to_vec::<u32>().unwrap();
            let is: Vec<u32> = x.argsort(axis as i32).contiguous().to_vec::<u32>().unwrap();
            for row in rows(x.shape(), axis) {
                let pivot = pv[row[k]];
                assert!(same(pivot, sorted[row[k]]), "{dtype} kth {kth}: pivot {pivot}");
                // Ties ranked by index: the selected index is the one a stable sort puts there.
                assert_eq!(iv[row[k]], is[row[k]], "{dtype} kth {kth}: argpartition pivot");
                let mut seen = vec![false; row.len()];
                for (j, &q) in row.iter().enumerate() {
                    assert!(if j < k { le(pv[q], pivot) } else { le(pivot, pv[q]) }, "{dtype} kth {kth}: {:?}", pv);
                    let src = iv[q] as usize;
                    assert!(!std::mem::replace(&mut seen[src], true));
                    assert!(same(xv[row[src]], pv[q]), "{dtype}: partition != take(argpartition)");
                }
            }
        }
    }
}

#[test]
fn topk_returns_the_k_largest() {
    let mut rng = Rng(3);
    for dtype in [DType::I32, DType::F32, DType::BF16, DType::U8] {
        for _ in 0..10 {
            let (x, axis) = inputs(&mut rng, dtype);
            let len = x.shape()[axis];
            let k = rng.below(len as usize + 1) as i32;
            let t = x.topk(k, axis as i32);
            let mut want_shape = x.shape().to_vec();
            want_shape[axis] = k;
            assert_eq!(t.shape(), &want_shape[..]);
            let sorted = f64s(&x.sort(axis as i32));
            let tv = f64s(&t);
            for (r, row) in rows(x.shape(), axis).iter().enumerate() {
                let mut want: Vec<f64> = row[(len - k) as usize..].iter().map(|&p| sorted[p]).collect();
                let mut got: Vec<f64> =
                    rows(t.shape(), axis).get(r).map(|tr| tr.iter().map(|&p| tv[p]).collect()).unwrap_or_default();
                let key = |a: &f64, b: &f64| a.total_cmp(b);
                want.sort_by(key);
                got.sort_by(key);
                assert!(
                    want.len() == got.len() && want.iter().zip(&got).all(|(a, b)| same(*a, *b)),
                    "{dtype}: {got:?} vs {want:?}"
                );
            }
        }
    }
    // None flattens; k == len returns the (flattened) input.
    let x = Array::from_slice(&[4, 8, 1, 6, 3, 9], [2, 3]);
    let mut t = x.topk(2, None).to_vec::<i32>().unwrap();
    t.sort();
    assert_eq!(t, vec![8, 9]);
    assert_eq!(x.topk(6, None).to_vec::<i32>().unwrap(), vec![4, 8, 1, 6, 3, 9]);
    assert_eq!(x.topk(0, 1).shape(), &[2, 0]);
}

#[test]
fn nan_signed_zero_bool_and_complex_order() {
    let x = Array::from_slice(&[3.0f32, f32::NAN, -0.0, 1.0, 0.0, f32::NEG_INFINITY, f32::NAN], [7]);
    let s = x.sort(0).to_vec::<f32>().unwrap();
    assert_eq!(&s[..5], &[f32::NEG_INFINITY, -0.0, 0.0, 1.0, 3.0]);
    assert!(s[4..].iter().skip(1).all(|v| v.is_nan()));
    // Stable: -0.0 (index 2) stays before 0.0 (index 4); NaNs in index order.
    assert_eq!(x.argsort(0).to_vec::<u32>().unwrap(), vec![5, 2, 4, 3, 0, 1, 6]);
    let b = Array::from_slice(&[true, false, true, false], [4]);
    assert_eq!(b.argsort(0).to_vec::<u32>().unwrap(), vec![1, 3, 0, 2]);
    let re = Array::from_slice(&[1.0f32, 1.0, 0.0, -1.0], [4]);
    let im = Array::from_slice(&[2.0f32, -1.0, 5.0, 0.0], [4]);
    let c = &re.astype(DType::Complex64) + &(im.astype(DType::Complex64) * nuvec::Complex64::new(0.0, 1.0));
    assert_eq!(c.argsort(0).to_vec::<u32>().unwrap(), vec![3, 2, 1, 0]);
    let mut top = c.topk(2, 0).astype(DType::F32).to_vec::<f32>().unwrap();
    top.sort_by(f32::total_cmp);
    assert_eq!(top, vec![1.0, 1.0]);
}

#[test]
fn empty_unit_scalar_and_long_axes() {
    let e = ops::zeros([2, 0, 3], DType::F32);
    assert_eq!(e.sort(1).shape(), &[2, 0, 3]);
    assert_eq!(e.argsort(1).dtype(), DType::U32);
    assert_eq!(e.sort(2).eval_shape(), vec![2, 0, 3]);
    assert_eq!(e.topk(0, 1).shape(), &[2, 0, 3]);
    let one = Array::from_slice(&[5.0f32, 2.0], [2, 1]);
    assert_eq!(one.sort(1).to_vec::<f32>().unwrap(), vec![5.0, 2.0]);
    assert_eq!(one.argpartition(0, 1).to_vec::<u32>().unwrap(), vec![0, 0]);
    let s = Array::scalar(5.0, DType::F32);
    assert_eq!(s.sort(None).shape(), &[1]);
    assert_eq!(s.argsort(None).to_vec::<u32>().unwrap(), vec![0]);
    // Rows longer than any GPU block, with many ties.
    let n = 20_000;
    let v: Vec<i32> = (0..n).map(|i| (i * 7919) % 1000).collect();
    let x = Array::from_slice(&v, [n]);
    let idx = x.argsort(0).to_vec::<u32>().unwrap();
    for w in idx.windows(2) {
        let (a, b) = (v[w[0] as usize], v[w[1] as usize]);
        assert!(a < b || (a == b && w[0] < w[1]));
    }
    let p = x.partition(12_345, 0).to_vec::<i32>().unwrap();
    let mut sorted = v.clone();
    sorted.sort();
    assert_eq!(p[12_345], sorted[12_345]);
}

trait EvalShape {
    fn eval_shape(&self) -> Vec<i32>;
}

impl EvalShape for Array {
    fn eval_shape(&self) -> Vec<i32> {
        let c = self.contiguous();
        c.eval().unwrap();
        c.shape().to_vec()
    }
}

#[test]
fn bad_arguments_give_failed_arrays() {
    let x = Array::from_slice(&[3, 1, 2], [3]);
    let cases: Vec<(&str, Array, &str)> = vec![
        ("sort", x.sort(1), "axis"),
        ("argsort", x.argsort(-2), "axis"),
        ("sort", Array::scalar(1.0, DType::F32).sort(-1), "axis"),
        ("partition", x.partition(3, -1), "kth 3"),
        ("partition", x.partition(-4, None), "kth -4"),
        ("argpartition", x.argpartition(5, 0), "kth 5"),
        ("partition", ops::zeros([2, 0], DType::F32).partition(0, 1), "kth 0"),
        ("topk", x.topk(4, -1), "k 4"),
        ("topk", x.topk(-1, -1), "k -1"),
        ("topk", x.topk(1, 2), "axis"),
    ];
    for (op, a, needle) in cases {
        let e = a.eval().expect_err(op);
        let msg = e.to_string();
        assert_eq!(e.op_name(), Some(op), "{msg}");
        assert!(msg.contains(needle), "{op}: {msg}");
    }
    // A failed input fails the sort with the input's error.
    let bad = x.reshape([2, 2]);
    assert_eq!(bad.sort(0).eval().unwrap_err().op_name(), Some("reshape"));
}

// ---- derivatives ----------------------------------------------------------------------------

type OpFn = Box<dyn Fn(&Array) -> Array>;

fn diff_cases() -> Vec<(String, Vec<i32>, OpFn)> {
    let mut v: Vec<(String, Vec<i32>, OpFn)> = Vec::new();
    for (shape, axis) in [(vec![5], 0), (vec![3, 4], 1), (vec![3, 4], 0), (vec![2, 3, 4], 1), (vec![2, 3, 4], -1)] {
        let tag = format!("{shape:?}[{axis}]");
        v.push((format!("sort{tag}"), shape.clone(), Box::new(move |x| x.sort(axis))));
        v.push((format!("sort_squared{tag}"), shape.clone(), Box::new(move |x| x.sort(axis).square() * x)));
        let len = shape[(axis as i64).rem_euclid(shape.len() as i64) as usize];
        for kth in [0, len / 2, -1] {
            v.push((format!("partition{tag}k{kth}"), shape.clone(), Box::new(move |x| x.partition(kth, axis))));
        }
        for k in [1, len - 1] {
            v.push((format!("topk{tag}k{k}"), shape.clone(), Box::new(move |x| x.topk(k, axis).exp())));
        }
        v.push((
            format!("argsort_weights{tag}"),
            shape.clone(),
            Box::new(move |x| x * x.argsort(axis).astype(DType::F64)),
        ));
    }
    v.push(("sort_none".into(), vec![3, 3], Box::new(|x| x.sort(None))));
    v.push(("transposed".into(), vec![3, 4], Box::new(|x| x.transpose(&[1, 0]).sort(0))));
    v
}

fn dot(a: &Array, b: &Array) -> f64 {
    (a * b).sum(..).item::<f64>().unwrap()
}

#[test]
fn vjp_and_jvp_match_finite_differences() {
    let mut rng = Rng(42);
    let mut fails = Vec::new();
    let cases = diff_cases();
    for (name, shape, f) in &cases {
        let x = rng.smooth(shape);
        let y = f(&x);
        let cot = rng.smooth(y.shape());
        let dir = rng.smooth(shape);
        let fun = |xs: &[Array]| Ok(vec![f(&xs[0])]);
        let (_, g) = vjp_flat(fun, std::slice::from_ref(&x), std::slice::from_ref(&cot)).unwrap();
        let (_, t) = jvp_flat(fun, std::slice::from_ref(&x), std::slice::from_ref(&dir)).unwrap();
        let h = 1e-6;
        let at = |s: f64| dot(&f(&(&x + &dir * s)), &cot);
        let fd = (at(h) - at(-h)) / (2.0 * h);
        assert_eq!(g[0].shape(), x.shape(), "{name}");
        assert_eq!(g[0].dtype(), DType::F64, "{name}");
        for (what, v) in [("vjp", dot(&g[0], &dir)), ("jvp", dot(&t[0], &cot))] {
            if (v - fd).abs() > 1e-6 * (1.0 + fd.abs()) {
                fails.push(format!("{name} {what}: {v} vs finite differences {fd}"));
            }
        }
    }
    assert!(fails.is_empty(), "{} of {}:\n{}", fails.len(), cases.len(), fails.join("\n"));
}

#[test]
fn grad_of_sort_routes_cotangents_and_argsort_has_none() {
    let x = Array::from_slice(&[3.0f64, 1.0, 2.0], [3]);
    let w = Array::from_slice(&[1.0f64, 2.0, 3.0], [3]);
    let g = nuvec::grad(|x: &Array| Ok((x.sort(0) * &w).sum(..)))(&x).unwrap();
    // sorted = [x1, x2, x0] weighted 1, 2, 3.
    assert_eq!(g.to_vec::<f64>().unwrap(), vec![3.0, 1.0, 2.0]);
    let g = nuvec::grad(|x: &Array| Ok(x.argsort(0).astype(DType::F64).sum(..)))(&x).unwrap();
    assert_eq!(g.to_vec::<f64>().unwrap(), vec![0.0; 3]);
    // Second order: d/dx sum(sort(x)^3) = 3 x^2, derivative again 6 x.
    let gg = nuvec::grad(|x: &Array| {
        let inner = nuvec::grad(|y: &Array| Ok(y.sort(0).power(3.0).sum(..)));
        Ok((inner(x)? * &w).sum(..))
    })(&x)
    .unwrap();
    // The GPU may sum the cotangents in another order: equal to the last bits.
    let gg = gg.to_vec::<f64>().unwrap();
    assert!(gg.iter().zip([18.0, 12.0, 36.0]).all(|(g, w)| (g - w).abs() < 1e-12 * w), "{gg:?}");
}

#[test]
fn vmap_matches_a_loop() {
    let mut rng = Rng(5);
    for (name, shape, f) in diff_cases() {
        for in_axis in 0..=shape.len() as i32 {
            let items: Vec<Array> = (0..3).map(|_| rng.smooth(&shape)).collect();
            let batched = ops::stack(&items, in_axis);
            let fun = |xs: &[Array]| Ok(vec![f(&xs[0])]);
            let got = vmap_flat(fun, &[Some(in_axis)], &[0])(std::slice::from_ref(&batched)).unwrap();
            let want = ops::stack(&items.iter().map(&f).collect::<Vec<_>>(), 0);
            assert_eq!(got[0].shape(), want.shape(), "{name} in_axis {in_axis}");
            let (a, b) = (f64s(&got[0]), f64s(&want));
            assert!(a.iter().zip(&b).all(|(p, q)| p == q), "{name} in_axis {in_axis}");
        }
    }
    // Index outputs batch too.
    let x = Array::from_slice(&[3, 1, 2, 0, 5, 4], [2, 3]);
    let got = vmap_flat(|xs: &[Array]| Ok(vec![xs[0].argsort(0)]), &[Some(1)], &[1])(std::slice::from_ref(&x)).unwrap();
    assert_eq!(got[0].to_vec::<u32>().unwrap(), x.argsort(0).to_vec::<u32>().unwrap());
}
