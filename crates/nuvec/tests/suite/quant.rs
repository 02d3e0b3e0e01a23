//! Quantization beyond the MLX fixtures: errors that name the argument and the caller,
//! gradients of `quantized_matmul` against finite differences in float64, batching, and the
//! round trip of every mode.

use nuvec::transforms::{vjp_flat, vmap_flat};
use nuvec::{Array, DType, ops};

/// Deterministic weights with a spread of magnitudes and signs.
fn weights(shape: &[i32], seed: f32) -> Array {
    let n: i32 = shape.iter().product();
    ((ops::arange(0, n, 1).astype(DType::F32) * 0.7311 + seed).sin() * 0.5).reshape(shape)
}

/// Checks that `a` failed in `op`, at this file's `line`, with a message mentioning `words`.
#[track_caller]
fn fails(a: &Array, op: &str, line: u32, words: &[&str]) {
    let e = a.error().unwrap_or_else(|| panic!("expected {op} to fail, got shape {:?}", a.shape()));
    assert_eq!(e.op_name(), Some(op), "{e}");
    let at = e.location().expect("a location");
    assert!(at.file().ends_with("quant.rs") && at.line() == line, "location {}:{} for {e}", at.file(), at.line());
    let msg = e.to_string();
    for w in words {
        assert!(msg.contains(w), "{msg:?} does not mention {w:?}");
    }
}

#[test]
fn bad_arguments_give_failed_arrays_naming_the_argument() {
    let w = weights(&[4, 128], 0.1);
    let ((q, s, b), line) = (ops::quantize(&weights(&[4, 100], 0.1), 64, 4, "affine"), line!());
    for a in [&q, &s, b.as_ref().unwrap()] {
        fails(a, "quantize", line, &["group_size 64", "100"]);
    }
    let ((q, ..), line) = (ops::quantize(&w, 64, 7, "affine"), line!());
    fails(&q, "quantize", line, &["bits 7"]);
    let ((q, ..), line) = (ops::quantize(&w, 48, 4, "affine"), line!());
    fails(&q, "quantize", line, &["group_size 48"]);
    let ((q, ..), line) = (ops::quantize(&w, 64, 4, "int4"), line!());
    fails(&q, "quantize", line, &["mode \"int4\""]);
    let ((q, _, b), line) = (ops::quantize(&w, 64, None, "mxfp4"), line!());
    fails(&q, "quantize", line, &["group_size 64", "mxfp4", "32"]);
    assert!(b.is_none(), "mxfp4 has no biases, even on failure");
    let ((q, ..), line) = (ops::quantize(&w, None, 4, "mxfp8"), line!());
    fails(&q, "quantize", line, &["bits 4", "mxfp8", "8"]);
    let ((q, ..), line) = (ops::quantize(&weights(&[128], 0.1), None, None, "affine"), line!());
    fails(&q, "quantize", line, &["at least 2 dimensions"]);
    let ((q, ..), line) = (ops::quantize(&w.astype(DType::I32), None, None, "affine"), line!());
    fails(&q, "quantize", line, &["int32"]);

    let (q, s, b) = ops::quantize(&w, 64, 4, "affine");
    let (d, line) = (ops::dequantize(&q, &s, None, 64, 4, "affine", None), line!());
    fails(&d, "dequantize", line, &["biases"]);
    let (d, line) = (ops::dequantize(&q, &s, b.as_ref(), 32, 4, "affine", None), line!());
    fails(&d, "dequantize", line, &["scales", "group_size 32"]);
    let (d, line) = (ops::dequantize(&q.astype(DType::I32), &s, b.as_ref(), 64, 4, "affine", None), line!());
    fails(&d, "dequantize", line, &["uint32"]);
    let (d, line) = (ops::dequantize(&q, &s, b.as_ref(), 64, 4, "affine", DType::I32), line!());
    fails(&d, "dequantize", line, &["dtype"]);
    let (fq, fs, _) = ops::quantize(&w, None, None, "mxfp4");
    let (d, line) = (ops::dequantize(&fq, &fs, b.as_ref(), None, None, "mxfp4", None), line!());
    fails(&d, "dequantize", line, &["biases", "mxfp4"]);

    let x = weights(&[3, 100], 0.4);
    let (y, line) = (ops::quantized_matmul(&x, &q, &s, b.as_ref(), true, 64, 4, "affine"), line!());
    fails(&y, "quantized_matmul", line, &["last dimension of x", "transpose true"]);
    let (y, line) =
        (ops::quantized_matmul(&weights(&[3, 128], 0.4), &q, &s, b.as_ref(), true, 64, 3, "affine"), line!());
    fails(&y, "quantized_matmul", line, &["scales"]);
    let (y, line) = (ops::quantized_matmul(&x, &q, &s, None, true, 64, 4, "affine"), line!());
    fails(&y, "quantized_matmul", line, &["biases"]);
}

#[test]
fn every_mode_round_trips_within_its_precision() {
    let w = weights(&[8, 256], 0.3);
    // Affine: the values span at most 1, so one level step is 1 / (2^bits - 1); the snapped
    // scale can clip the far edge by up to one step. FP modes: half the largest gap between
    // codes at the group's scale (FP4 6 and 4, E4M3 a 2^-4 relative step), plus scale rounding.
    let step = |bits: i32| 1.0 / ((1 << bits) - 1) as f32 * 1.01;
    for (mode, bits, bound) in [
        ("affine", 8, step(8)),
        ("affine", 6, step(6)),
        ("affine", 5, step(5)),
        ("affine", 4, step(4)),
        ("affine", 3, step(3)),
        ("affine", 2, step(2)),
        ("mxfp8", 8, 0.04),
        ("mxfp4", 4, 0.25),
        ("nvfp4", 4, 0.12),
    ] {
        let (q, s, b) = ops::quantize(&w, None, bits, mode);
        assert_eq!(q.shape(), &[8, 256 * bits / 32], "{mode}");
        let d = ops::dequantize(&q, &s, b.as_ref(), None, bits, mode, DType::F32);
        let err = (&d - &w).abs().max(..).item::<f32>().unwrap();
        assert!(err <= bound, "{mode} {bits} bits: max error {err}");
        // Quantizing the dequantized weights again gives the same codes (a fixed point).
        let (q2, ..) = ops::quantize(&d, None, bits, mode);
        assert_eq!(q2.to_bytes().unwrap(), q.to_bytes().unwrap(), "{mode} {bits} bits is not a fixed point");
    }
}

/// Central differences of `f` (float64) at `x` along every element, against `grad`.
fn check_fd(what: &str, f: &dyn Fn(&Array) -> f64, x: &Array, grad: &Array) {
    let xs = x.to_vec::<f64>().unwrap();
    let g = grad.to_vec::<f64>().unwrap();
    let h = 1e-6;
    for i in 0..xs.len() {
        let at = |d: f64| {
            let mut v = xs.clone();
            v[i] += d;
            f(&Array::from_slice(&v, x.shape().to_vec()))
        };
        let fd = (at(h) - at(-h)) / (2.0 * h);
        assert!((fd - g[i]).abs() <= 1e-6 * (1.0 + fd.abs()), "{what}[{i}]: finite difference {fd}, gradient {}", g[i]);
    }
}

#[test]
fn quantized_matmul_gradients_match_finite_differences() {
    for transpose in [true, false] {
        let w = weights(if transpose { &[6, 64] } else { &[16, 64] }, 0.2);
        let (q, s, b) = ops::quantize(&w, 32, 4, "affine");
        let (s, b) = (s.astype(DType::F64), b.unwrap().astype(DType::F64));
        let k = if transpose { 64 } else { 16 };
        let x = weights(&[3, k], 0.9).astype(DType::F64);
        let n = if transpose { 6 } else { 64 };
        let cot = weights(&[3, n], 1.7).astype(DType::F64);
        let qmm =
            |x: &Array, s: &Array, b: &Array| ops::quantized_matmul(x, &q, s, Some(b), transpose, 32, 4, "affine");
        let (_, g) = vjp_flat(
            |a| Ok(vec![qmm(&a[0], &a[1], &a[2])]),
            &[x.clone(), s.clone(), b.clone()],
            std::slice::from_ref(&cot),
        )
        .unwrap();
        let loss = |y: Array| (y * &cot).sum(..).item::<f64>().unwrap();
        check_fd(&format!("dx transpose {transpose}"), &|v| loss(qmm(v, &s, &b)), &x, &g[0]);
        check_fd(&format!("dscales transpose {transpose}"), &|v| loss(qmm(&x, v, &b)), &s, &g[1]);
        check_fd(&format!("dbiases transpose {transpose}"), &|v| loss(qmm(&x, &s, v)), &b, &g[2]);
        // The packed weights are integers: no gradient flows to them.
        let (_, gq) = vjp_flat(
            |a| Ok(vec![ops::quantized_matmul(&x, &a[0], &s, Some(&b), transpose, 32, 4, "affine")]),
            std::slice::from_ref(&q),
            std::slice::from_ref(&cot),
        )
        .unwrap();
        assert_eq!(gq[0].astype(DType::F64).abs().max(..).item::<f64>().unwrap(), 0.0, "packed weights got a gradient");
    }
}

#[test]
fn vmap_over_quantize_and_dequantize_matches_a_loop() {
    let w = weights(&[3, 4, 64], 0.5);
    let f = |a: &[Array]| {
        let (q, s, b) = ops::quantize(&a[0], 32, 3, "affine");
        Ok(vec![q.clone(), ops::dequantize(&q, &s, b.as_ref(), 32, 3, "affine", None)])
    };
    let batched = vmap_flat(f, &[Some(1)], &[0, 0])(std::slice::from_ref(&w)).unwrap();
    for i in 0..4 {
        let wi = w.slice(&[0, i, 0], &[3, i + 1, 64], &[1, 1, 1]).squeeze(1);
        let one = f(&[wi]).unwrap();
        for (j, o) in one.iter().enumerate() {
            let bi = batched[j].slice(&[i, 0, 0], &[i + 1, 3, o.shape()[1]], &[1, 1, 1]).squeeze(0);
            assert_eq!(bi.to_bytes().unwrap(), o.to_bytes().unwrap(), "output {j} of batch {i}");
        }
    }
}

/// `|got − want| ≤ tol · scale` element by element, `scale` the row's `Σ|x|·|w|` bound.
fn within(what: &str, got: &Array, want: &Array, bound: &Array, tol: f64) {
    let (g, w, b) = (got.to_vec::<f64>().unwrap(), want.to_vec::<f64>().unwrap(), bound.to_vec::<f64>().unwrap());
    assert_eq!(g.len(), w.len(), "{what}: sizes");
    for i in 0..g.len() {
        let err = (g[i] - w[i]).abs();
        assert!(err <= tol * (b[i] + 1e-3), "{what}: element {i}: {} vs {} (bound {})", g[i], w[i], b[i]);
    }
}

#[test]
fn quantized_matmul_matches_float64_and_its_composition() {
    use nuvec::fast::{FastOp, QuantMatmulParams};
    use nuvec::graph::{Primitive, Spec, backend_for};
    let cpu = backend_for(nuvec::Device::cpu()).unwrap();
    let mut cases: Vec<(&str, i32, i32)> = vec![("mxfp4", 32, 4), ("mxfp8", 32, 8), ("nvfp4", 16, 4)];
    for bits in [2, 3, 4, 5, 6, 8] {
        for gs in [32, 64, 128] {
            cases.push(("affine", gs, bits));
        }
    }
    // Rows of x on both sides of the CPU's dot-product path (16), and a product large enough
    // for the blocked matrix product.
    let shapes: [(i32, i32, i32); 4] = [(1, 40, 256), (5, 40, 256), (17, 40, 256), (64, 512, 1024)];
    for (mode, gs, bits) in cases {
        for dtype in [DType::F32, DType::BF16] {
            for transpose in [true, false] {
                for &(m, n, k) in &shapes {
                    // w[K, N] is quantized along N: the long side goes there.
                    let (n, k) = if transpose { (n, k) } else { (k, n) };
                    if m == 64 && (bits != 4 || dtype != DType::F32) {
                        continue;
                    }
                    let what = format!("{mode} bits {bits} group {gs} {dtype} transpose {transpose} m {m}");
                    let w_shape = if transpose { [n, k] } else { [k, n] };
                    let w = (weights(&w_shape, 0.3 + bits as f32) * 0.2).astype(dtype);
                    let (q, s, b) = ops::quantize(&w, gs, bits, mode);
                    let x = weights(&[m, k], 1.1).astype(dtype);
                    let y = ops::quantized_matmul(&x, &q, &s, b.as_ref(), transpose, gs, bits, mode);
                    assert!(y.error().is_none(), "{what}: {:?}", y.error());
                    assert_eq!(y.shape(), &[m, n], "{what}");
                    assert_eq!(y.dtype(), dtype, "{what}");
                    let p = QuantMatmulParams { mode: mode.parse().unwrap(), group_size: gs, bits, transpose, dtype };
                    let mut inputs = vec![x.clone(), q.clone(), s.clone()];
                    inputs.extend(b.clone());
                    let specs: Vec<Spec> = inputs.iter().map(Array::spec).collect();
                    assert!(
                        cpu.supports(&Primitive::Fast(FastOp::QuantizedMatmul(p)), &specs, &[]),
                        "{what}: CPU kernel"
                    );
                    let composed = FastOp::QuantizedMatmul(p).composition(&inputs).remove(0);
                    // float64 from the weights as the dequantization rounds them.
                    let deq = ops::dequantize(&q, &s, b.as_ref(), gs, bits, mode, dtype).astype(DType::F64);
                    let deq = if transpose { deq.t() } else { deq };
                    let x64 = x.astype(DType::F64);
                    let want = x64.matmul(&deq);
                    let bound = x64.abs().matmul(&deq.abs());
                    let tol = if dtype == DType::F32 { 1e-5 } else { 2f64.powi(-7) };
                    within(&format!("{what} against float64"), &y.astype(DType::F64), &want, &bound, tol);
                    within(
                        &format!("{what} against the composition"),
                        &y.astype(DType::F64),
                        &composed.astype(DType::F64),
                        &bound,
                        2.0 * tol,
                    );
                }
            }
        }
    }
}

/// `float32` rows against scales and biases kept in a half dtype (as a GGUF stores them): a
/// `float32` product of the weight dequantized in `float32`, on the CPU's kernel.
#[test]
fn quantized_matmul_of_float32_rows_takes_half_scales() {
    use nuvec::fast::{FastOp, QuantMatmulParams};
    use nuvec::graph::{Primitive, Spec, backend_for};
    let cpu = backend_for(nuvec::Device::cpu()).unwrap();
    for half in [DType::F16, DType::BF16] {
        for (bits, gs) in [(4, 32), (8, 32), (4, 64), (3, 32)] {
            for transpose in [true, false] {
                for m in [1, 5, 17] {
                    let what = format!("{half} scales, bits {bits} group {gs} transpose {transpose} m {m}");
                    let (n, k) = if transpose { (48, 256) } else { (256, 48) };
                    let w = weights(&if transpose { [n, k] } else { [k, n] }, 0.7) * 0.2;
                    let (q, s, b) = ops::quantize(&w, gs, bits, "affine");
                    let (s, b) = (s.astype(half), b.unwrap().astype(half));
                    let x = weights(&[m, k], 1.3);
                    let y = ops::quantized_matmul(&x, &q, &s, Some(&b), transpose, gs, bits, "affine");
                    assert_eq!(y.dtype(), DType::F32, "{what}");
                    let p = QuantMatmulParams {
                        mode: "affine".parse().unwrap(),
                        group_size: gs,
                        bits,
                        transpose,
                        dtype: DType::F32,
                    };
                    let inputs = [x.clone(), q.clone(), s.clone(), b.clone()];
                    let specs: Vec<Spec> = inputs.iter().map(Array::spec).collect();
                    let fused = Primitive::Fast(FastOp::QuantizedMatmul(p));
                    assert!(cpu.supports(&fused, &specs, &[]), "{what}: CPU kernel");
                    let composed = FastOp::QuantizedMatmul(p).composition(&inputs).remove(0);
                    let (s64, b64) = (s.astype(DType::F64), b.astype(DType::F64));
                    let deq = ops::dequantize(&q, &s64, Some(&b64), gs, bits, "affine", None);
                    let deq = if transpose { deq.t() } else { deq };
                    let x64 = x.astype(DType::F64);
                    let (want, bound) = (x64.matmul(&deq), x64.abs().matmul(&deq.abs()));
                    within(&format!("{what} against float64"), &y.astype(DType::F64), &want, &bound, 1e-5);
                    within(
                        &format!("{what} against the composition"),
                        &y.astype(DType::F64),
                        &composed.astype(DType::F64),
                        &bound,
                        2e-5,
                    );
                }
            }
        }
    }
}

#[test]
fn quantized_matmul_batches_rows_and_keeps_vmap_fused() {
    let w = weights(&[48, 128], 0.4);
    let (q, s, b) = ops::quantize(&w, 64, 4, "affine");
    let x = weights(&[2, 3, 128], 0.8);
    let y = ops::quantized_matmul(&x, &q, &s, b.as_ref(), true, 64, 4, "affine");
    assert_eq!(y.shape(), &[2, 3, 48]);
    let f = |a: &[Array]| Ok(vec![ops::quantized_matmul(&a[0], &q, &s, b.as_ref(), true, 64, 4, "affine")]);
    let mapped = vmap_flat(f, &[Some(0)], &[0])(std::slice::from_ref(&x)).unwrap();
    for i in 0..2 {
        let xi = x.slice(&[i, 0, 0], &[i + 1, 3, 128], &[1, 1, 1]).squeeze(0);
        let one = f(&[xi]).unwrap().remove(0);
        let yi = y.slice(&[i, 0, 0], &[i + 1, 3, 48], &[1, 1, 1]).squeeze(0);
        let mi = mapped[0].slice(&[i, 0, 0], &[i + 1, 3, 48], &[1, 1, 1]).squeeze(0);
        assert_eq!(yi.to_bytes().unwrap(), one.to_bytes().unwrap(), "batch {i}: leading axes");
        assert_eq!(mi.to_bytes().unwrap(), one.to_bytes().unwrap(), "batch {i}: vmap");
    }
}

/// `gather_qmm` on the default device (on a GPU its kernels: tiles of up to 8 rows sharing an
/// expert, rows run one by one where x's are not adjacent) against the product with the
/// dequantized experts in float64, within the rounding of the product's dtype.
#[test]
fn gather_qmm_matches_float64_over_bits_dtypes_and_runs() {
    // (name, Bx, M, L, sorted)
    let cases = [("decode", 6, 1, 6, false), ("runs of 20", 100, 1, 100, true), ("rows of 3", 4, 3, 9, false)];
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for bits in [3, 4, 8] {
            let experts = weights(&[5, 40, 128], 0.6).astype(dtype);
            let (wq, s, b) = ops::quantize(&experts, 64, bits, "affine");
            let deq = ops::dequantize(&wq, &s, b.as_ref(), 64, bits, "affine", DType::F32).astype(DType::F64);
            for &(name, bx, m, l, sorted) in &cases {
                let what = format!("{name} {dtype} {bits} bits");
                let x = (weights(&[bx, m, 128], 1.9) * 2.0).astype(dtype);
                // Sorted: the rows in order, the experts in runs; else rows out of order
                // (not adjacent) and experts with a negative index (wraps) and one past the end.
                let li: Vec<i32> = (0..l).map(|i| if sorted { i } else { (i * 5 + 2) % bx }).collect();
                let mut ri: Vec<i32> = (0..l).map(|i| if sorted { i * 5 / l } else { (i * 3 + 1) % 5 }).collect();
                if !sorted {
                    ri[0] = -2;
                    ri[1] = 7;
                }
                let (li, ri) = (Array::from_slice(&li, vec![l]), Array::from_slice(&ri, vec![l]).astype(DType::U32));
                let ri = if sorted { ri } else { ri.astype(DType::I32) };
                let y =
                    ops::gather_qmm(&x, &wq, &s, b.as_ref(), Some(&li), Some(&ri), true, 64, bits, "affine", sorted);
                assert_eq!(y.shape(), &[l, m, 40], "{what}");
                assert_eq!(y.dtype(), dtype, "{what}");
                let x64 = x.astype(DType::F64);
                let want = ops::gather_mm(&x64, &deq.swapaxes(-1, -2), Some(&li), Some(&ri), false);
                let scale = ops::gather_mm(&x64.abs(), &deq.abs().swapaxes(-1, -2), Some(&li), Some(&ri), false);
                let rel = match dtype {
                    DType::F32 => 1e-5,
                    DType::F16 => 1.0 / 512.0,
                    _ => 1.0 / 64.0,
                };
                let f = |a: &Array| a.astype(DType::F64).to_vec::<f64>().unwrap();
                let (y, want, scale) = (f(&y), f(&want), f(&scale));
                for (i, ((y, w), s)) in y.iter().zip(&want).zip(&scale).enumerate() {
                    assert!((y - w).abs() <= rel * (s + 1e-3), "{what}: element {i}: {y} against {w} (scale {s})");
                }
            }
        }
    }
}

#[test]
fn gather_qmm_matches_a_loop_of_quantized_matmul() {
    let experts = weights(&[4, 24, 128], 0.6);
    let (wq, s, b) = ops::quantize(&experts, 64, 4, "affine");
    let x = weights(&[3, 2, 128], 1.9);
    let lhs = Array::from_slice(&[0i32, 2, 1, 2], vec![4]);
    let rhs = Array::from_slice(&[3i32, 3, 0, 1], vec![4]);
    let y = ops::gather_qmm(&x, &wq, &s, b.as_ref(), Some(&lhs), Some(&rhs), true, 64, 4, "affine", false);
    assert_eq!(y.shape(), &[4, 2, 24]);
    for (i, (l, r)) in [(0, 3), (2, 3), (1, 0), (2, 1)].into_iter().enumerate() {
        let one = |a: &Array, j: i32| {
            let mut stop = a.shape().to_vec();
            stop[0] = j + 1;
            let mut start = vec![0; a.ndim()];
            start[0] = j;
            a.slice(&start, &stop, &vec![1; a.ndim()]).squeeze(0)
        };
        let bi = b.as_ref().map(|b| one(b, r));
        let want = ops::quantized_matmul(&one(&x, l), &one(&wq, r), &one(&s, r), bi.as_ref(), true, 64, 4, "affine");
        let got = one(&y, i as i32);
        // The fused kernel and the batched composition sum in different orders.
        let diff = (&got - &want).abs().max(..).item::<f32>().unwrap();
        assert!(diff <= 1e-5 * (1.0 + want.abs().max(..).item::<f32>().unwrap()), "output {i}: {diff}");
    }
    let bad = ops::gather_qmm(
        &x,
        &wq,
        &s,
        b.as_ref(),
        None,
        Some(&Array::from_slice(&[0.5f32], vec![1])),
        true,
        64,
        4,
        "affine",
        false,
    );
    assert!(bad.error().is_some_and(|e| e.to_string().contains("rhs_indices")));
}
