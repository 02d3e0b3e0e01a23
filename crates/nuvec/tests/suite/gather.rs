//! Gathers, scatters and indexing beyond the MLX fixtures: nuvec's out-of-range rules, errors,
//! the general `gather`/`scatter` against direct loops, and the derivative and batching rules
//! (vjp and jvp against central finite differences in float64, vmap against a loop).

use nuvec::transforms::{jvp_flat, vjp_flat, vmap_flat};
use nuvec::{Array, DType, Ellipsis, IndexStep, NewAxis, array, ops};

fn f64s(a: &Array) -> Vec<f64> {
    a.astype(DType::F64).to_vec::<f64>().unwrap()
}

fn i32s(a: &Array) -> Vec<i32> {
    a.to_vec::<i32>().unwrap()
}

/// Values that differ everywhere, so a wrong position shows.
fn ramp(shape: &[i32]) -> Array {
    let n: i32 = shape.iter().product();
    (ops::arange(0.0, n as f64, 1.0).astype(DType::F64) * 0.37 + 0.5).sin().reshape(shape)
}

#[test]
fn out_of_range_array_indices_clamp_in_gathers_and_drop_in_scatters() {
    let x = array![10, 20, 30, 40];
    // Negative wraps once; anything beyond the axis clamps to its ends.
    assert_eq!(i32s(&x.take(&array![-1, -4, 7, -9, 2], 0)), vec![40, 10, 40, 10, 30]);
    assert_eq!(i32s(&x.take_along_axis(&array![100i64, -100], 0)), vec![40, 10]);
    assert_eq!(i32s(&x.i(array![5u32, 0])), vec![40, 10]);
    // Scatters skip positions outside the axis (after wrapping negatives once).
    let y = x.put_along_axis(&array![9, -1, -5], array![1, 2, 3], 0);
    assert_eq!(i32s(&y), vec![10, 20, 30, 2]);
    let z = x.at(array![4, -4, -4]).add(1);
    assert_eq!(i32s(&z), vec![12, 20, 30, 40]);
    let m = ops::zeros([3], DType::F32).scatter_add_along_axis(&array![0, 3, 0, -3], array![1.0, 5.0, 2.0, 4.0], 0);
    assert_eq!(f64s(&m), vec![7.0, 0.0, 0.0]);
}

#[test]
fn integer_index_out_of_range_fails_naming_the_op() {
    let x = ops::zeros([2, 3], DType::F32);
    for bad in [x.i(2), x.i((0, -4)), x.i((0, 0, 0)), x.i((Ellipsis, 0, Ellipsis)), x.at(5).set(1.0)] {
        let e = bad.check().unwrap_err();
        assert!(matches!(e.op_name(), Some("index" | "at.set")), "{e}");
    }
    let e = x.take(&array![0.5], 0).check().unwrap_err();
    assert_eq!(e.op_name(), Some("take"));
    assert!(e.to_string().contains("integer"), "{e}");
    assert_eq!(x.take(&array![0], 2).check().unwrap_err().op_name(), Some("take"));
    assert_eq!(x.take_along_axis(&array![0], 1).check().unwrap_err().op_name(), Some("take_along_axis"));
    assert_eq!(x.i(array![true]).check().unwrap_err().op_name(), Some("index"));
    let e = ops::zeros([0], DType::F32).take(&array![0], 0).check().unwrap_err();
    assert_eq!(e.op_name(), Some("take"));
    // Wrong value shape for an update.
    assert_eq!(x.at(0).set(array![1.0, 2.0]).check().unwrap_err().op_name(), Some("at.set"));
    let e = ops::gather(&x, &[array![0]], &[0, 1], &[1, 1]).check().unwrap_err();
    assert_eq!(e.op_name(), Some("gather"));
    let e = ops::scatter_add(&x, &[array![0]], &ops::zeros([1, 3], DType::F32), &[0]).check().unwrap_err();
    assert_eq!(e.op_name(), Some("scatter_add"));
}

#[test]
// `1..=-1` is Python's `1:` with an inclusive negative end, not an empty Rust range.
#[allow(clippy::reversed_empty_ranges)]
fn basic_indexing_gives_views_with_python_rules() {
    let x = ops::arange(0, 24, 1).reshape([2, 3, 4]);
    assert_eq!(i32s(&x.i((1, .., 3))), vec![15, 19, 23]);
    assert_eq!(i32s(&x.i((0, 0, (..).step(-1)))), vec![3, 2, 1, 0]);
    assert_eq!(i32s(&x.i((0, 1, (1..=-1).step(2)))), vec![5, 7]);
    assert_eq!(i32s(&x.i((-1, ..=1, -1))), vec![15, 19]);
    assert_eq!(x.i((NewAxis, Ellipsis, NewAxis, 0)).shape(), &[1, 2, 3, 1]);
    assert_eq!(x.i((.., 5..9)).shape(), &[2, 0, 4]);
    assert_eq!(x.i(()).shape(), &[2, 3, 4]);
    // A view: no copy node between the array and its window.
    let v = x.i((1, 1..3));
    assert_eq!(i32s(&v), vec![16, 17, 18, 19, 20, 21, 22, 23]);
}

#[test]
fn general_gather_and_scatter_match_loops() {
    let a = ramp(&[4, 5, 3]);
    let av = f64s(&a);
    let at = |i: i32, j: i32, k: i32| av[(i * 15 + j * 3 + k) as usize];
    let (i0, i1) = (array![[3, -4], [1, 2]], array![[0], [-2]]);
    // Windows of 2 x 2 on axes 0 and 1 (starts clamp into the axis), first 2 of axis 2.
    let g = ops::gather(&a, &[i0.clone(), i1.clone()], &[0, 1], &[2, 2, 2]);
    assert_eq!(g.shape(), &[2, 2, 2, 2, 2]);
    let gv = f64s(&g);
    let starts0 = [[3, 0], [1, 2]];
    let starts1 = [[0, 0], [3, 3]];
    let mut want = Vec::new();
    for p in 0..2 {
        for q in 0..2 {
            let (s0, s1) = (starts0[p][q].min(2), starts1[p][q]);
            for u in 0..2 {
                for v in 0..2 {
                    for w in 0..2 {
                        want.push(at(s0 + u, s1 + v, w));
                    }
                }
            }
        }
    }
    assert_eq!(gv, want);

    // Scatter-add of windows [1, 5, 2] on axis 0 (repeated index accumulates, -1 wraps).
    let idx = array![0, 2, 0, -1];
    let upd = ramp(&[4, 1, 5, 2]);
    let s = ops::scatter_add(&a, std::slice::from_ref(&idx), &upd, &[0]);
    let (sv, uv) = (f64s(&s), f64s(&upd));
    let mut want = av.clone();
    for (n, &i) in [0, 2, 0, 3].iter().enumerate() {
        for j in 0..5 {
            for k in 0..2 {
                want[i * 15 + j * 3 + k] += uv[n * 10 + j * 2 + k];
            }
        }
    }
    for (g, w) in sv.iter().zip(&want) {
        assert!((g - w).abs() < 1e-12, "{sv:?} vs {want:?}");
    }
    // Max / min / prod / set with distinct indices.
    let idx = array![3, 1];
    let upd = ramp(&[2, 1, 5, 3]) * 3.0;
    let uv = f64s(&upd);
    for (name, r) in [
        ("max", ops::scatter_max(&a, std::slice::from_ref(&idx), &upd, &[0])),
        ("min", ops::scatter_min(&a, std::slice::from_ref(&idx), &upd, &[0])),
        ("prod", ops::scatter_prod(&a, std::slice::from_ref(&idx), &upd, &[0])),
        ("set", ops::scatter(&a, std::slice::from_ref(&idx), &upd, &[0])),
    ] {
        let mut want = av.clone();
        for (n, &i) in [3, 1].iter().enumerate() {
            for e in 0..15 {
                let (p, u) = ((i * 15 + e) as usize, uv[n * 15 + e as usize]);
                want[p] = match name {
                    "max" => want[p].max(u),
                    "min" => want[p].min(u),
                    "prod" => want[p] * u,
                    _ => u,
                };
            }
        }
        assert_eq!(f64s(&r), want, "{name}");
    }
}

#[test]
fn size_zero_indices_and_arrays() {
    let x = ramp(&[3, 4]);
    assert_eq!(x.take(&ops::zeros([0], DType::I32), 1).shape(), &[3, 0]);
    assert_eq!(x.i(ops::zeros([2, 0], DType::I32)).shape(), &[2, 0, 4]);
    let y = x.at(ops::zeros([0], DType::I32)).add(1.0);
    assert_eq!(f64s(&y), f64s(&x));
    let e = ops::zeros([0, 4], DType::F32);
    assert_eq!(e.take(&array![1, 2], 1).shape(), &[0, 2]);
    assert_eq!(e.take_along_axis(&ops::zeros([0, 3], DType::I32), 1).shape(), &[0, 3]);
}

#[test]
fn gather_mm_matches_matmul_of_picked_matrices() {
    let a = ramp(&[3, 2, 4]);
    let b = ramp(&[5, 4, 3]);
    let (li, ri) = (array![[2], [0]], array![4, 1, 1]);
    let y = ops::gather_mm(&a, &b, Some(&li), Some(&ri), false);
    assert_eq!(y.shape(), &[2, 3, 2, 3]);
    let lv = [[2, 2, 2], [0, 0, 0]];
    let rv = [4, 1, 1];
    for (p, lp) in lv.iter().enumerate() {
        for (q, (&l, &r)) in lp.iter().zip(&rv).enumerate() {
            let want = a.i(l).matmul(&b.i(r));
            assert_eq!(f64s(&y.i((p as i32, q as i32))), f64s(&want));
        }
    }
}

/// `gather_mm` on the default device (its kernels on a GPU: a GEMV per output for up to 256
/// rows, tensor-core tiles of 64 or (from 64 rows per matrix of b) 128 rows over runs of equal
/// indices for more) against the product of the picked
/// matrices in float64, within the rounding of the output plus float32 accumulation.
#[test]
fn gather_mm_matches_float64_over_layouts_and_dtypes() {
    // (name, Ba, M, K, Bb, N, L, sorted, transposed b)
    let cases = [
        ("decode", 1, 1, 64, 12, 48, 10, false, true),
        ("few rows of 3", 5, 3, 40, 7, 24, 5, false, true),
        ("sorted runs", 300, 1, 96, 9, 136, 300, true, true),
        ("long sorted runs", 300, 1, 64, 3, 128, 300, true, true),
        ("unsorted", 200, 1, 64, 9, 72, 400, false, true),
        ("row-major b", 80, 1, 32, 5, 64, 80, true, false),
        ("row-major b, many rows", 300, 1, 32, 5, 64, 300, true, false),
        ("matrices taller than a tile", 3, 150, 48, 4, 40, 3, false, true),
    ];
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for &(name, ba, m, k, bb, n, l, sorted, transposed) in &cases {
            let what = format!("{name} {dtype}");
            let a = (ramp(&[ba, m, k]) * 2.0).astype(dtype);
            let b = if transposed {
                ramp(&[bb, n, k]).astype(dtype).swapaxes(-1, -2)
            } else {
                (ramp(&[bb, k, n]) * 1.5 + 0.2).astype(dtype)
            };
            // Every token's index picks its own row of a; the expert indices cycle (sorted:
            // in runs), with a negative one (wraps) and one past the end (clamps) when unsorted.
            let li = ops::arange(0, l, 1).remainder(ba);
            let mut ri: Vec<i32> = (0..l).map(|i| if sorted { i * bb / l } else { (i * 7 + 3) % bb }).collect();
            if !sorted && l > 2 {
                ri[1] = -1;
                ri[2] = bb + 4;
            }
            let ri = Array::from_slice(&ri, [l]);
            let ri = if sorted { ri.astype(DType::U32) } else { ri };
            let y = ops::gather_mm(&a, &b, Some(&li), Some(&ri), sorted);
            let (a64, b64) = (a.astype(DType::F64), b.astype(DType::F64));
            let want = ops::gather_mm(&a64, &b64, Some(&li), Some(&ri), false);
            let scale = ops::gather_mm(&a64.abs(), &b64.abs(), Some(&li), Some(&ri), false);
            assert_eq!(y.shape(), &[l, m, n], "{what}");
            assert_eq!(y.dtype(), dtype, "{what}");
            let rel = match dtype {
                DType::F32 => 1e-5,
                DType::F16 => 1.0 / 1024.0,
                _ => 1.0 / 128.0,
            };
            let (y, want, scale) = (f64s(&y), f64s(&want), f64s(&scale));
            for (i, ((y, w), s)) in y.iter().zip(&want).zip(&scale).enumerate() {
                assert!((y - w).abs() <= rel * (s + 1e-3), "{what}: element {i}: {y} against {w} (scale {s})");
            }
        }
    }
}

/// `<vjp(c), v>`, `<c, jvp(v)>` and the central difference of `<c, f>` along `v` agree.
fn check_derivatives(name: &str, f: impl Fn(&[Array]) -> Array + Clone, inputs: &[Array]) {
    let out = f(inputs);
    let c = ramp(out.shape()) * 1.3 + 0.1;
    let v: Vec<Array> = inputs.iter().map(|x| (ramp(x.shape()) * 2.1 - 0.3).cos()).collect();
    let dot = |a: &[Array], b: &[Array]| -> f64 {
        a.iter().zip(b).map(|(x, y)| (x * y).sum(..).item::<f64>().unwrap()).sum()
    };
    let g = {
        let f = f.clone();
        vjp_flat(move |x| Ok(vec![f(x)]), inputs, std::slice::from_ref(&c)).unwrap().1
    };
    let t = {
        let f = f.clone();
        jvp_flat(move |x| Ok(vec![f(x)]), inputs, &v).unwrap().1
    };
    let h = 1e-6;
    let shifted = |s: f64| -> f64 {
        let xs: Vec<Array> = inputs.iter().zip(&v).map(|(x, d)| x + d * s).collect();
        (f(&xs) * &c).sum(..).item::<f64>().unwrap()
    };
    let fd = (shifted(h) - shifted(-h)) / (2.0 * h);
    let (a, b) = (dot(&g, &v), dot(std::slice::from_ref(&c), &t));
    let tol = 1e-6 * (1.0 + fd.abs());
    assert!((a - fd).abs() < tol, "{name}: vjp {a} vs finite difference {fd}");
    assert!((b - fd).abs() < tol, "{name}: jvp {b} vs finite difference {fd}");
}

#[test]
fn derivatives_match_finite_differences() {
    let idx = array![[2, -1, 0], [0, 0, 1]];
    let x = ramp(&[2, 4]);
    let i1 = idx.clone();
    check_derivatives("take", move |a| a[0].take(&i1, 1), std::slice::from_ref(&x));
    let i2 = idx.clone();
    check_derivatives("take_along_axis", move |a| a[0].take_along_axis(&i2, 1), std::slice::from_ref(&x));
    let i3 = array![[9, -1], [0, 2]];
    check_derivatives("take_clamped", move |a| a[0].take_along_axis(&i3, 1), std::slice::from_ref(&x));
    let v = ramp(&[2, 2]) * 5.0;
    let i4 = array![[3, 1], [0, -2]];
    check_derivatives("put_along_axis", move |a| a[0].put_along_axis(&i4, &a[1], 1), &[x.clone(), v.clone()]);
    let i5 = array![[1, 1], [7, 0]];
    check_derivatives(
        "scatter_add_along_axis",
        move |a| a[0].scatter_add_along_axis(&i5, &a[1], 1),
        &[x.clone(), v.clone()],
    );
    let i6 = array![1, 3];
    check_derivatives(
        "scatter_max",
        move |a| ops::scatter_max(&a[0], std::slice::from_ref(&i6), &a[1].reshape([2, 2, 1]), &[1]),
        &[x.clone(), v.clone()],
    );
    let y = ramp(&[3, 4, 2]);
    let (ia, ib) = (array![0, 2, -1], array![[1], [3]]);
    check_derivatives(
        "index_arrays",
        // The two indexings have different shapes ([3, 4, 1] and [2, 2, 1, 2]): sum each.
        move |a| a[0].i((&ia, .., NewAxis, 1)).square().sum(..) + (a[0].i((1.., &ib)) * 3.0).sum(..),
        std::slice::from_ref(&y),
    );
    // Distinct indices: with duplicates which update a `set` keeps is unspecified (as in MLX),
    // and the derivative gives every duplicate the cotangent, which no finite difference sees.
    let ic = array![2, 0, 1];
    let w = ramp(&[3, 2]);
    check_derivatives("at_set", move |a| a[0].at((&ic, 1..3, 0)).set(&a[1]), &[y.clone(), w.clone()]);
    let id = array![2, 0, 2];
    check_derivatives("at_add", move |a| a[0].at((.., &id)).add(a[1].reshape([1, 3, 1])), &[y.clone(), ramp(&[3])]);
    check_derivatives("at_slice_multiply", move |a| a[0].at((1, ..)).multiply(&a[1]), &[y.clone(), ramp(&[4, 2])]);
    let (la, rb) = (array![1, 0, 1], array![2, 2, 0]);
    check_derivatives(
        "gather_mm",
        move |a| ops::gather_mm(&a[0], &a[1], Some(&la), Some(&rb), false),
        &[ramp(&[2, 2, 3]), ramp(&[3, 3, 2])],
    );
}

#[test]
fn vmap_matches_a_loop() {
    let x = ramp(&[3, 5, 4]);
    let idx = array![[1, 4, -1], [0, 0, 2], [3, 2, 1]];
    let upd = ramp(&[3, 3, 4]);
    type F = fn(&[Array]) -> Array;
    let cases: Vec<(&str, F, Vec<Option<i32>>)> = vec![
        ("take_both", |a| a[0].take(&a[1], 0), vec![Some(0), Some(0)]),
        ("take_src", |a| a[0].take(&a[1], 1), vec![Some(0), None]),
        ("take_idx", |a| a[0].take(&a[1], 0), vec![None, Some(0)]),
        ("index", |a| a[0].i((&a[1], 1..3)), vec![Some(0), Some(0)]),
        ("scatter_add", |a| a[0].at(&a[1]).add(&a[2]), vec![Some(0), Some(0), Some(0)]),
        ("scatter_add_src_only", |a| a[0].at(&a[1]).add(&a[2]), vec![Some(0), None, None]),
        ("put_idx_only", |a| a[0].i(0).put_along_axis(&a[1].i((.., NewAxis)), 9.0, 0), vec![None, Some(0)]),
    ];
    for (name, f, axes) in cases {
        let inputs: Vec<Array> = [x.clone(), idx.clone(), upd.clone()].into_iter().take(axes.len()).collect();
        let mapped = vmap_flat(move |a| Ok(vec![f(a)]), &axes, &[0])(&inputs).unwrap().remove(0);
        let rows: Vec<Array> = (0..3)
            .map(|b| {
                let args: Vec<Array> =
                    inputs.iter().zip(&axes).map(|(a, ax)| if ax.is_some() { a.i(b) } else { a.clone() }).collect();
                f(&args)
            })
            .collect();
        let want = ops::stack(&rows, 0);
        assert_eq!(mapped.shape(), want.shape(), "{name}");
        // Scatter-adds on the GPU add in the order their atomics land: equal to the last bits.
        let (got, want) = (f64s(&mapped), f64s(&want));
        assert!(
            got.iter().zip(&want).all(|(g, w)| (g - w).abs() <= 1e-12 * (1.0 + w.abs())),
            "{name}: {got:?}\n{want:?}"
        );
    }
}
