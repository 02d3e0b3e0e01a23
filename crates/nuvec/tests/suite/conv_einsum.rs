//! Convolutions and contractions beyond the MLX fixtures: float64 results against direct loops
//! over random geometries, derivatives against central finite differences (vjp and jvp),
//! vmap against a loop, and failed arrays for bad arguments.

use nuvec::ops::{self, ConvOptions};
use nuvec::transforms::{jvp_flat, vjp_flat, vmap_flat};
use nuvec::{Array, DType};

/// xorshift64*, seeded so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: i32) -> i32 {
        (self.next() % n as u64) as i32
    }
    fn values(&mut self, n: usize) -> Vec<f64> {
        (0..n).map(|_| (self.next() >> 11) as f64 / (1u64 << 53) as f64 * 4.0 - 2.0).collect()
    }
    fn array(&mut self, shape: &[i32]) -> Array {
        let n: i32 = shape.iter().product();
        Array::from_slice(&self.values(n as usize), shape)
    }
}

/// Row-major strides of `shape`.
fn strides(shape: &[i32]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1] as usize;
    }
    s
}

/// Direct-loop convolution in f64 (the definition, written independently of the composition):
/// `y[n, o.., co] = Σ_{k.., c} x̃[n, o·s + k·kd - lo.., g·Cg + c] · w[co, k.., c]`, where `x̃`
/// is `x` with input dilation and zeros outside.
#[allow(clippy::too_many_arguments)]
fn reference(x: &[f64], xs: &[i32], w: &[f64], ws: &[i32], o: &ConvOptions, out: &[i32]) -> Vec<f64> {
    let d = xs.len() - 2;
    let at = |v: &[i32], i: usize, def: i32| {
        if v.is_empty() {
            def
        } else if v.len() == 1 {
            v[0]
        } else {
            v[i]
        }
    };
    let (c_in, c_out, cg) = (xs[d + 1], ws[0], ws[d + 1]);
    let g = o.groups;
    let cog = c_out / g;
    let (sx, sw, so) = (strides(xs), strides(ws), strides(out));
    let total: usize = out.iter().map(|&v| v as usize).product();
    let kernel: Vec<i32> = ws[1..=d].to_vec();
    let taps: i32 = kernel.iter().product();
    let mut y = vec![0.0; total];
    for (flat, yv) in y.iter_mut().enumerate() {
        let idx: Vec<i32> = (0..out.len()).map(|i| (flat / so[i]) as i32 % out[i]).collect();
        let (n, co) = (idx[0], idx[d + 1]);
        let grp = co / cog;
        let mut acc = 0.0;
        for t in 0..taps {
            let mut rem = t;
            let mut k = vec![0; d];
            for i in (0..d).rev() {
                k[i] = rem % kernel[i];
                rem /= kernel[i];
            }
            // Position in the dilated, padded input, then back in the original input.
            let mut pos = Vec::with_capacity(d);
            let mut inside = true;
            for i in 0..d {
                let kk = if o.flip { kernel[i] - 1 - k[i] } else { k[i] };
                let p = idx[i + 1] * at(&o.stride, i, 1) + kk * at(&o.kernel_dilation, i, 1) - at(&o.padding_lo, i, 0);
                let idil = at(&o.input_dilation, i, 1);
                if p < 0 || p % idil != 0 || p / idil >= xs[i + 1] {
                    inside = false;
                    break;
                }
                pos.push(p / idil);
            }
            if !inside {
                continue;
            }
            for c in 0..cg {
                let mut xi = n as usize * sx[0] + (grp * cg + c) as usize * sx[d + 1];
                let mut wi = co as usize * sw[0] + c as usize * sw[d + 1];
                for i in 0..d {
                    xi += pos[i] as usize * sx[i + 1];
                    wi += k[i] as usize * sw[i + 1];
                }
                acc += x[xi] * w[wi];
            }
        }
        *yv = acc;
        let _ = c_in;
    }
    y
}

fn random_geometry(rng: &mut Rng, d: usize) -> (Vec<i32>, Vec<i32>, ConvOptions) {
    let groups = [1, 2, 3][rng.below(3) as usize];
    let depthwise = rng.below(3) == 0;
    let cg = if depthwise { 1 } else { 1 + rng.below(3) };
    let c_in = groups * cg;
    let c_out = if depthwise { c_in } else { groups * (1 + rng.below(3)) };
    let mut o = ConvOptions { groups, flip: rng.below(4) == 0, ..Default::default() };
    let mut xs = vec![1 + rng.below(2)];
    let mut ws = vec![c_out];
    for _ in 0..d {
        let k = 1 + rng.below(3);
        let (s, kd, id) = (1 + rng.below(2), 1 + rng.below(2), 1 + rng.below(2) * rng.below(2));
        let (lo, hi) = (rng.below(3) - 1, rng.below(3) - 1);
        // Long enough for the dilated kernel after padding and cropping.
        let span = (k - 1) * kd + 1;
        let mut len = 2 + rng.below(5);
        while (len - 1) * id + 1 + lo + hi < span {
            len += 1;
        }
        xs.push(len);
        ws.push(k);
        o.stride.push(s);
        o.kernel_dilation.push(kd);
        o.input_dilation.push(id);
        o.padding_lo.push(lo);
        o.padding_hi.push(hi);
    }
    xs.push(c_in);
    ws.push(cg);
    (xs, ws, o)
}

#[test]
fn conv_general_matches_direct_loops_in_f64() {
    let mut rng = Rng(0x5eed_c0de);
    for trial in 0..60 {
        let d = 1 + trial % 3;
        let (xs, ws, o) = random_geometry(&mut rng, d);
        let (xv, wv) =
            (rng.values(xs.iter().product::<i32>() as usize), rng.values(ws.iter().product::<i32>() as usize));
        let y = ops::conv_general(&Array::from_slice(&xv, &xs[..]), &Array::from_slice(&wv, &ws[..]), &o);
        let got: Vec<f64> = y.to_vec().unwrap_or_else(|e| panic!("x {xs:?} w {ws:?} {o:?}: {e}"));
        assert_eq!(y.dtype(), DType::F64);
        let want = reference(&xv, &xs, &wv, &ws, &o, y.shape());
        assert_eq!(got.len(), want.len());
        // Output length along each axis by the formula, independently of the composition.
        for i in 0..d {
            let at = |v: &[i32]| v[i];
            let padded = (xs[i + 1] - 1) * at(&o.input_dilation) + 1 + at(&o.padding_lo) + at(&o.padding_hi);
            let len = (padded - (ws[i + 1] - 1) * at(&o.kernel_dilation) - 1) / at(&o.stride) + 1;
            assert_eq!(y.shape()[i + 1], len, "x {xs:?} w {ws:?} {o:?}");
        }
        for (j, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!((g - w).abs() <= 1e-12 * (1.0 + w.abs()), "x {xs:?} w {ws:?} {o:?}: element {j}: {g} vs {w}");
        }
    }
}

/// `<vjp(c), v>` and `<c, jvp(v)>` against the central difference of `<c, f(x)>` along `v`.
fn check_derivatives(name: &str, x: &[Array], f: &dyn Fn(&[Array]) -> Array, rng: &mut Rng) {
    let y = f(x);
    assert!(!y.is_failed(), "{name}: {:?}", y.error());
    let cot = rng.array(y.shape());
    let dir: Vec<Array> = x.iter().map(|a| rng.array(a.shape())).collect();
    let ff = |xs: &[Array]| Ok(vec![f(xs)]);
    let (_, g) = vjp_flat(ff, x, std::slice::from_ref(&cot)).unwrap();
    let (_, t) = jvp_flat(ff, x, &dir).unwrap();
    let h = 1e-6;
    let at = |s: f64| -> f64 {
        let xs: Vec<Array> = x.iter().zip(&dir).map(|(a, d)| a + d * s).collect();
        (f(&xs) * &cot).sum(..).item::<f64>().unwrap()
    };
    let fd = (at(h) - at(-h)) / (2.0 * h);
    let dot = |a: &[Array], b: &[Array]| -> f64 {
        a.iter().zip(b).map(|(p, q)| (p * q).sum(..).item::<f64>().unwrap()).sum()
    };
    let (from_vjp, from_jvp) = (dot(&g, &dir), dot(&t, std::slice::from_ref(&cot)));
    for (what, v) in [("vjp", from_vjp), ("jvp", from_jvp)] {
        assert!((v - fd).abs() <= 1e-6 * (1.0 + fd.abs()), "{name}: {what} gives {v}, finite differences {fd}");
    }
    for (gi, xi) in g.iter().zip(x) {
        assert_eq!(gi.shape(), xi.shape(), "{name}");
    }
}

#[test]
fn conv_derivatives_match_finite_differences() {
    let mut rng = Rng(77);
    // Gated DeltaNet's causal depthwise convolution, and ordinary/grouped ones.
    let x = rng.array(&[2, 7, 4]);
    let w = rng.array(&[4, 4, 1]);
    check_derivatives("depthwise conv1d", &[x, w], &|v| ops::conv1d(&v[0], &v[1], 1, 3, 1, 4), &mut rng);
    let x = rng.array(&[2, 9, 4]);
    let w = rng.array(&[6, 3, 2]);
    check_derivatives("grouped conv1d", &[x, w], &|v| ops::conv1d(&v[0], &v[1], 2, 1, 2, 2), &mut rng);
    let x = rng.array(&[1, 6, 5, 3]);
    let w = rng.array(&[2, 3, 2, 3]);
    check_derivatives("conv2d", &[x, w], &|v| ops::conv2d(&v[0], &v[1], (2, 1), 1, (1, 2), 1), &mut rng);
    for trial in 0..12 {
        let (xs, ws, o) = random_geometry(&mut rng, 1 + trial % 2);
        let x = rng.array(&xs);
        let w = rng.array(&ws);
        check_derivatives(
            &format!("conv_general {xs:?} {ws:?} {o:?}"),
            &[x, w],
            &|v| ops::conv_general(&v[0], &v[1], &o),
            &mut rng,
        );
    }
}

#[test]
fn einsum_derivatives_match_finite_differences() {
    let mut rng = Rng(99);
    let cases: &[(&str, &[&[i32]])] = &[
        ("bhqd,bhkd->bhqk", &[&[2, 2, 3, 4], &[2, 2, 5, 4]]),
        ("ii->i", &[&[3, 3]]),
        ("ii", &[&[3, 3]]),
        ("ij,jk,kl->il", &[&[2, 3], &[3, 4], &[4, 2]]),
        ("...ij,...jk", &[&[2, 1, 3, 4], &[3, 4, 2]]),
        ("i,j->ij", &[&[3], &[4]]),
        ("ij,ij->i", &[&[3, 1], &[3, 4]]),
        ("iij->j", &[&[2, 2, 3]]),
    ];
    for (s, shapes) in cases {
        let xs: Vec<Array> = shapes.iter().map(|sh| rng.array(sh)).collect();
        check_derivatives(s, &xs, &|v| ops::einsum(s, v), &mut rng);
    }
    let a = rng.array(&[3, 4, 2]);
    let b = rng.array(&[2, 4, 5]);
    check_derivatives("tensordot", &[a, b], &|v| ops::tensordot(&v[0], &v[1], ([1, 2], [1, 0])), &mut rng);
    let a = rng.array(&[3, 4]);
    let b = rng.array(&[2, 4]);
    check_derivatives("inner", &[a.clone(), b.clone()], &|v| ops::inner(&v[0], &v[1]), &mut rng);
    check_derivatives("outer", &[a, b], &|v| ops::outer(&v[0], &v[1]), &mut rng);
}

/// Einsum against the same sum written as nested loops, in f64, for every subscript family.
#[test]
fn einsum_matches_loops() {
    let mut rng = Rng(5);
    let a = rng.array(&[3, 4]);
    let b = rng.array(&[4, 5]);
    let m = rng.array(&[4, 4]);
    let (av, bv, mv): (Vec<f64>, Vec<f64>, Vec<f64>) = (a.to_vec().unwrap(), b.to_vec().unwrap(), m.to_vec().unwrap());
    let close = |got: Array, want: Vec<f64>, what: &str| {
        let g: Vec<f64> = got.to_vec().unwrap();
        assert_eq!(g.len(), want.len(), "{what}");
        for (x, y) in g.iter().zip(&want) {
            assert!((x - y).abs() < 1e-12 * (1.0 + y.abs()), "{what}: {g:?} vs {want:?}");
        }
    };
    let mut mm = vec![0.0; 15];
    for i in 0..3 {
        for k in 0..5 {
            mm[i * 5 + k] = (0..4).map(|j| av[i * 4 + j] * bv[j * 5 + k]).sum();
        }
    }
    close(ops::einsum("ij,jk->ik", &[a.clone(), b.clone()]), mm.clone(), "ij,jk->ik");
    close(ops::einsum("ij,jk", &[a.clone(), b.clone()]), mm.clone(), "implicit");
    let mmt: Vec<f64> = (0..15).map(|f| mm[(f % 3) * 5 + f / 3]).collect();
    close(ops::einsum("ij,jk->ki", &[a.clone(), b.clone()]), mmt, "ij,jk->ki");
    close(ops::einsum("ii->i", std::slice::from_ref(&m)), (0..4).map(|i| mv[i * 5]).collect(), "diagonal");
    close(ops::einsum("ii", std::slice::from_ref(&m)), vec![(0..4).map(|i| mv[i * 5]).sum()], "trace");
    close(
        ops::einsum("ij->j", std::slice::from_ref(&a)),
        (0..4).map(|j| (0..3).map(|i| av[i * 4 + j]).sum()).collect(),
        "sum",
    );
    let outer: Vec<f64> = (0..12 * 20).map(|f| av[f / 20] * bv[f % 20]).collect();
    close(ops::einsum("ij,kl->ijkl", &[a.clone(), b.clone()]), outer.clone(), "outer");
    close(ops::outer(&a, &b), outer, "ops::outer");
    let ab: Vec<f64> = (0..4).map(|j| (0..3).map(|i| av[i * 4 + j] * mv[j * 4 + j]).sum()).collect();
    close(ops::einsum("ij,jj->j", &[a.clone(), m.clone()]), ab, "diagonal meets a product");
}

#[test]
fn vmap_of_conv_and_einsum_equals_a_loop() {
    let mut rng = Rng(3);
    let xs = rng.array(&[3, 2, 6, 4]); // a batch of 3 conv inputs
    let w = rng.array(&[4, 3, 1]);
    let f = |v: &[Array]| Ok(vec![ops::conv1d(&v[0], &v[1], 1, 2, 1, 4)]);
    let batched = vmap_flat(f, &[Some(0), None], &[0])(&[xs.clone(), w.clone()]).unwrap();
    for b in 0..3 {
        let one = ops::conv1d(&xs.slice(&[b, 0, 0, 0], &[b + 1, 2, 6, 4], &[]).squeeze(0), &w, 1, 2, 1, 4);
        let got = batched[0].slice(&[b, 0, 0, 0], &[b + 1, 2, 8, 4], &[]).squeeze(0);
        assert_eq!(batched[0].shape(), &[3, 2, 8, 4]);
        let diff = (got - one).abs().max(..).item::<f64>().unwrap();
        assert!(diff < 1e-12, "batch {b}: {diff}");
    }
    let q = rng.array(&[3, 2, 5]);
    let k = rng.array(&[4, 5]);
    let g = |v: &[Array]| Ok(vec![ops::einsum("id,jd->ij", v)]);
    let batched = vmap_flat(g, &[Some(0), None], &[0])(&[q.clone(), k.clone()]).unwrap();
    for b in 0..3 {
        let one = ops::einsum("id,jd->ij", &[q.slice(&[b, 0, 0], &[b + 1, 2, 5], &[]).squeeze(0), k.clone()]);
        let got = batched[0].slice(&[b, 0, 0], &[b + 1, 2, 4], &[]).squeeze(0);
        let diff = (got - one).abs().max(..).item::<f64>().unwrap();
        assert!(diff < 1e-12, "batch {b}: {diff}");
    }
}

#[test]
fn half_precision_depthwise_tracks_f32() {
    // Half types accumulate in f32: the result is the f32 answer rounded once (up to a few ulp).
    let mut rng = Rng(11);
    let x = rng.array(&[2, 33, 16]).astype(DType::F16);
    let w = rng.array(&[16, 4, 1]).astype(DType::F16);
    let y = ops::conv1d(&x, &w, 1, 3, 1, 16);
    assert_eq!(y.dtype(), DType::F16);
    let want = ops::conv1d(&x.astype(DType::F32), &w.astype(DType::F32), 1, 3, 1, 16);
    let err = (y.astype(DType::F32) - &want).abs().max(..).item::<f32>().unwrap();
    let scale = want.abs().max(..).item::<f32>().unwrap();
    assert!(err <= scale * 2e-3, "{err} vs scale {scale}");
}

fn message(a: &Array) -> String {
    a.error().map(|e| e.to_string()).unwrap_or_else(|| panic!("expected a failed array, got shape {:?}", a.shape()))
}

#[test]
fn bad_arguments_give_failed_arrays() {
    let x = ops::ones([1, 5, 4], DType::F32);
    let w = ops::ones([2, 3, 4], DType::F32);
    let expect = |a: Array, op: &str, words: &str| {
        let m = message(&a);
        assert!(m.contains(op) && m.contains(words), "{m:?} should name {op:?} and say {words:?}");
    };
    expect(ops::conv1d(&x, &w, 0, 0, 1, 1), "conv1d", "stride");
    expect(ops::conv1d(&x, &w, 1, 0, 0, 1), "conv1d", "kernel_dilation");
    expect(ops::conv1d(&x, &w, 1, 0, 1, 0), "conv1d", "groups");
    expect(ops::conv1d(&x, &w, 1, 0, 1, 3), "conv1d", "channels");
    expect(ops::conv1d(&x, &ops::ones([3, 3, 2], DType::F32), 1, 0, 1, 2), "conv1d", "divisible");
    expect(ops::conv1d(&x, &ops::ones([2, 3, 3], DType::F32), 1, 0, 1, 1), "conv1d", "channels");
    expect(ops::conv1d(&x, &ops::ones([2, 9, 4], DType::F32), 1, 0, 1, 1), "conv1d", "shorter");
    expect(ops::conv1d(&x, &ops::ones([2, 0, 4], DType::F32), 1, 0, 1, 1), "conv1d", "kernel");
    expect(ops::conv1d(&x, &ops::ones([2, 3, 4, 1], DType::F32), 1, 0, 1, 1), "conv1d", "weight");
    expect(ops::conv1d(&ops::ones([5, 4], DType::F32), &w, 1, 0, 1, 1), "conv1d", "input");
    expect(ops::conv1d(&x.astype(DType::I32), &w, 1, 0, 1, 1), "conv1d", "int32");
    expect(ops::conv2d(&x, &w, 1, 0, 1, 1), "conv2d", "spatial");
    let bad = ConvOptions { stride: vec![1, 1], ..Default::default() };
    expect(ops::conv_general(&x, &w, &bad), "conv_general", "stride");
    expect(
        ops::conv_general(
            &ops::ones([1, 2, 2, 2, 2, 1], DType::F32),
            &ops::ones([1, 1, 1, 1, 1, 1], DType::F32),
            &ConvOptions::default(),
        ),
        "conv_general",
        "1 to 3",
    );
    // A failed input propagates its own error.
    let failed = x.reshape([7]);
    assert_eq!(message(&ops::conv1d(&failed, &w, 1, 0, 1, 1)), message(&failed));

    let a = ops::ones([3, 4], DType::F32);
    let b = ops::ones([5, 4], DType::F32);
    expect(ops::einsum("ij,jk->ik", &[a.clone(), b.clone()]), "einsum", "size");
    expect(ops::einsum("ij,jk->ik", std::slice::from_ref(&a)), "einsum", "operands");
    expect(ops::einsum("ij->ii", std::slice::from_ref(&a)), "einsum", "repeat");
    expect(ops::einsum("ij->ik", std::slice::from_ref(&a)), "einsum", "no input");
    expect(ops::einsum("ijk->i", std::slice::from_ref(&a)), "einsum", "axes");
    expect(ops::einsum("i1->i", std::slice::from_ref(&a)), "einsum", "letters");
    expect(ops::einsum("i.j->i", std::slice::from_ref(&a)), "einsum", "letters");
    expect(ops::einsum("i->i->", std::slice::from_ref(&a)), "einsum", "->");
    expect(ops::einsum("...i...->i", std::slice::from_ref(&a)), "einsum", "more than one");
    expect(ops::einsum("ii->i", std::slice::from_ref(&a)), "einsum", "sizes");
    expect(ops::einsum("", &[]), "einsum", "operand");
    expect(ops::tensordot(&a, &b, 3), "tensordot", "contract");
    expect(ops::tensordot(&a, &b, 1), "tensordot", "match");
    expect(ops::tensordot(&a, &b, (vec![1, 0], vec![1])), "tensordot", "length");
    expect(ops::tensordot(&a, &b, ([1], [2])), "tensordot", "axis");
    expect(ops::tensordot(&a, &a, ([1, 1], [1, 1])), "tensordot", "repeat");
    expect(ops::inner(&a, &ops::ones([4, 3], DType::F32)), "inner", "");
}
