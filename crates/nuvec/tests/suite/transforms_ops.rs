//! Every differentiable operation under the three transforms, in float64:
//!
//! - `vjp` and `jvp` against central finite differences: for random inputs `x`, cotangent `c` and
//!   direction `v`, `<vjp(c), v>` and `<c, jvp(v)>` must both equal the finite-difference
//!   derivative of `<c, f(x)>` along `v`;
//! - `vmap` against a loop: mapping over a random axis of each input (some inputs unmapped)
//!   equals stacking `f` of each slice.
//!
//! Shapes are random (seeded, so failures reproduce), inputs stay inside each op's smooth domain.

use crate::Rng;
use nuvec::transforms::{jvp_flat, vjp_flat, vmap_flat};
use nuvec::{Array, DType, ops};

/// This module's draws.
impl Rng {
    fn dims(&mut self, rank: usize) -> Vec<i32> {
        (0..rank).map(|_| 1 + self.below(4) as i32).collect()
    }
    /// Dimensions of at least 2, so reductions never see a single element (where `std` has no
    /// derivative).
    fn dims2(&mut self, rank: usize) -> Vec<i32> {
        (0..rank).map(|_| 2 + self.below(3) as i32).collect()
    }
    fn array(&mut self, shape: &[i32], dom: Domain) -> Array {
        let n: i32 = shape.iter().product();
        let v: Vec<f64> = (0..n)
            .map(|_| {
                let u = self.unit();
                match dom {
                    Domain::Any => 4.0 * u - 2.0,
                    Domain::Positive => 0.5 + 1.5 * u,
                    Domain::Unit => 1.8 * u - 0.9,
                    Domain::AboveOne => 1.2 + 2.0 * u,
                    Domain::AwayFromZero => (0.5 + 1.5 * u) * if self.bits() & 1 == 0 { 1.0 } else { -1.0 },
                }
            })
            .collect();
        Array::from_slice(&v, shape)
    }
}

#[derive(Clone, Copy)]
enum Domain {
    Any,
    Positive,
    Unit,
    AboveOne,
    AwayFromZero,
}

type OpFn = Box<dyn Fn(&[Array]) -> Array>;
/// A unary operation under test.
type UnaryFn = fn(&Array) -> Array;
/// A binary operation under test.
type BinaryFn = fn(&Array, &Array) -> Array;

/// One case: a function of some inputs, with their shapes and domains.
struct Case {
    name: String,
    f: OpFn,
    inputs: Vec<(Vec<i32>, Domain)>,
}

fn case(name: impl Into<String>, inputs: Vec<(Vec<i32>, Domain)>, f: impl Fn(&[Array]) -> Array + 'static) -> Case {
    Case { name: name.into(), f: Box::new(f), inputs }
}

fn dot(a: &[Array], b: &[Array]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (x * y).sum(..).item::<f64>().unwrap()).sum()
}

fn unary_cases(rng: &mut Rng) -> Vec<Case> {
    use Domain::*;
    let table: Vec<(&str, Domain, UnaryFn)> = vec![
        ("abs", AwayFromZero, |x| x.abs()),
        ("negative", Any, |x| x.negative()),
        ("exp", Any, |x| x.exp()),
        ("expm1", Any, |x| x.expm1()),
        ("log", Positive, |x| x.log()),
        ("log1p", Positive, |x| x.log1p()),
        ("log2", Positive, |x| x.log2()),
        ("log10", Positive, |x| x.log10()),
        ("sqrt", Positive, |x| x.sqrt()),
        ("rsqrt", Positive, |x| x.rsqrt()),
        ("square", Any, |x| x.square()),
        ("reciprocal", AwayFromZero, |x| x.reciprocal()),
        ("sin", Any, |x| x.sin()),
        ("cos", Any, |x| x.cos()),
        ("tan", Unit, |x| x.tan()),
        ("arcsin", Unit, |x| x.arcsin()),
        ("arccos", Unit, |x| x.arccos()),
        ("arctan", Any, |x| x.arctan()),
        ("sinh", Any, |x| x.sinh()),
        ("cosh", Any, |x| x.cosh()),
        ("tanh", Any, |x| x.tanh()),
        ("arcsinh", Any, |x| x.arcsinh()),
        ("arccosh", AboveOne, |x| x.arccosh()),
        ("arctanh", Unit, |x| x.arctanh()),
        ("sigmoid", Any, |x| x.sigmoid()),
        ("erf", Any, |x| x.erf()),
        ("erfinv", Unit, |x| x.erfinv()),
        ("floor", Any, |x| x.floor()),
        ("ceil", Any, |x| x.ceil()),
        ("round", Any, |x| x.round()),
        ("sign", AwayFromZero, |x| x.sign()),
        ("clip", Any, |x| x.clip(-0.7, 0.9)),
    ];
    table
        .into_iter()
        .map(|(name, dom, f)| {
            let r = rng.below(4);
            case(name, vec![(rng.dims(r), dom)], move |x| f(&x[0]))
        })
        .collect()
}

/// A second shape that broadcasts against `a`: some axes set to 1, maybe leading axes dropped.
fn broadcastable(rng: &mut Rng, a: &[i32]) -> Vec<i32> {
    let drop = rng.below(a.len() + 1);
    a[drop..].iter().map(|&d| if rng.below(3) == 0 { 1 } else { d }).collect()
}

fn binary_cases(rng: &mut Rng) -> Vec<Case> {
    use Domain::*;
    let table: Vec<(&str, Domain, Domain, BinaryFn)> = vec![
        ("add", Any, Any, |a, b| a + b),
        ("subtract", Any, Any, |a, b| a - b),
        ("multiply", Any, Any, |a, b| a * b),
        ("divide", Any, AwayFromZero, |a, b| a / b),
        ("power", Positive, Any, |a, b| a.power(b)),
        ("maximum", Any, Any, |a, b| a.maximum(b)),
        ("minimum", Any, Any, |a, b| a.minimum(b)),
        ("logaddexp", Any, Any, |a, b| a.logaddexp(b)),
        ("arctan2", AwayFromZero, AwayFromZero, |a, b| a.arctan2(b)),
        ("remainder", Any, AwayFromZero, |a, b| a.remainder(b)),
        ("floor_divide", Any, AwayFromZero, |a, b| a.floor_divide(b)),
        ("where", Any, Any, |a, b| ops::where_(a.greater(b), a * 2.0, b.square())),
        ("clip_arrays", Any, Any, |a, b| a.clip(b, b + 0.5)),
    ];
    table
        .into_iter()
        .map(|(name, da, db, f)| {
            let r = rng.below(4);
            let sa = rng.dims(r);
            let sb = broadcastable(rng, &sa);
            let (sa, sb) = if rng.below(2) == 0 { (sa, sb) } else { (sb, sa) };
            case(name, vec![(sa, da), (sb, db)], move |x| f(&x[0], &x[1]))
        })
        .collect()
}

/// A random non-empty subset of the axes of a rank-`r` array, some given as negative numbers.
fn some_axes(rng: &mut Rng, r: usize) -> Vec<i32> {
    let mut axes: Vec<i32> = (0..r as i32).filter(|_| rng.below(2) == 0).collect();
    if axes.is_empty() {
        axes.push(rng.below(r) as i32);
    }
    axes.into_iter().map(|a| if rng.below(2) == 0 { a - r as i32 } else { a }).collect()
}

fn reduction_cases(rng: &mut Rng) -> Vec<Case> {
    use Domain::*;
    let mut out = Vec::new();
    for _ in 0..2 {
        let r = 1 + rng.below(3);
        let shape = rng.dims2(r);
        let axes = some_axes(rng, r);
        let keep = rng.below(2) == 0;
        let ax = axes.clone();
        macro_rules! red {
            ($name:literal, $dom:expr, $body:expr) => {{
                let axes = ax.clone();
                let f: fn(&Array, &[i32], bool) -> Array = $body;
                out.push(case(
                    format!("{}{:?}{}", $name, axes, if keep { "k" } else { "" }),
                    vec![(shape.clone(), $dom)],
                    move |x| f(&x[0], &axes, keep),
                ));
            }};
        }
        red!("sum", Any, |x, a, k| ops::sum(x, a, k));
        red!("prod", AwayFromZero, |x, a, k| ops::prod(x, a, k));
        red!("max", Any, |x, a, k| ops::max(x, a, k));
        red!("min", Any, |x, a, k| ops::min(x, a, k));
        red!("mean", Any, |x, a, k| ops::mean(x, a, k));
        red!("var", Any, |x, a, k| ops::var(x, a, k, 0));
        red!("var_ddof1", Any, |x, a, k| ops::var(x, a, k, 1));
        red!("std", Any, |x, a, k| ops::std(x, a, k, 0));
        red!("logsumexp", Any, |x, a, k| ops::logsumexp(x, a, k));
        red!("softmax", Any, |x, a, _| ops::softmax(x, a));
        red!("argmax_blocks", Any, |x, a, _| x * x.argmax(a[0]).astype(DType::F64).sum(..));
        red!("sum_all", Any, |x, _, _| x.sum(..));
    }
    for _ in 0..2 {
        let r = 1 + rng.below(3);
        let shape = rng.dims(r);
        let axis = rng.below(r) as i32 - if rng.below(2) == 0 { r as i32 } else { 0 };
        for reverse in [false, true] {
            for exclusive in [false, true] {
                let o = ops::ScanOptions { reverse, exclusive };
                let tag = format!("[{axis}]{}{}", if reverse { "r" } else { "" }, if exclusive { "x" } else { "" });
                out.push(case(format!("cumsum{tag}"), vec![(shape.clone(), Any)], move |x| x[0].cumsum_with(axis, o)));
                out.push(case(format!("cumprod{tag}"), vec![(shape.clone(), AwayFromZero)], move |x| {
                    x[0].cumprod_with(axis, o)
                }));
                out.push(case(format!("cummax{tag}"), vec![(shape.clone(), Any)], move |x| x[0].cummax_with(axis, o)));
                out.push(case(format!("cummin{tag}"), vec![(shape.clone(), Any)], move |x| x[0].cummin_with(axis, o)));
                out.push(case(format!("logcumsumexp{tag}"), vec![(shape.clone(), Any)], move |x| {
                    x[0].logcumsumexp_with(axis, o)
                }));
            }
        }
    }
    out
}

fn shape_cases(rng: &mut Rng) -> Vec<Case> {
    use Domain::*;
    let s = |v: &[i32]| (v.to_vec(), Any);
    let mut out = vec![
        case("reshape", vec![s(&[2, 3, 4])], |x| x[0].reshape([4, -1])),
        case("flatten", vec![s(&[2, 3, 4])], |x| x[0].flatten(1, 2)),
        case("transpose", vec![s(&[2, 3, 4])], |x| x[0].transpose(&[2, 0, 1]) * ops::arange(0.0, 3.0, 1.0)),
        case("swapaxes", vec![s(&[2, 3, 4])], |x| x[0].swapaxes(0, -1).exp()),
        case("moveaxis", vec![s(&[2, 3, 4])], |x| x[0].moveaxis(-1, 0).sin()),
        case("slice_steps", vec![s(&[5, 6])], |x| x[0].slice(&[4, 1], &[-6, 6], &[-2, 2])),
        case("broadcast_to", vec![s(&[3, 1])], |x| x[0].broadcast_to([2, 3, 4]).square()),
        case("expand_squeeze", vec![s(&[3, 1, 2])], |x| x[0].squeeze(1).expand_dims([0, -1]).exp()),
        case("concatenate", vec![s(&[2, 3]), s(&[4, 3])], |x| ops::concatenate(&x[..2], 0).square()),
        case("stack", vec![s(&[2, 3]), s(&[2, 3])], |x| ops::stack(&x[..2], -1).square()),
        case("split", vec![s(&[6, 2])], |x| {
            let p = x[0].split(3, 0);
            &p[0] * &p[2] + &p[1]
        }),
        case("split_at", vec![s(&[5, 2])], |x| {
            let p = x[0].split_at(&[1, 3], 0);
            p[1].square().sum(0) + p[2].sum(0)
        }),
        case("repeat", vec![s(&[2, 3])], |x| x[0].repeat(3, 1).square()),
        case("repeat_flat", vec![s(&[2, 3])], |x| x[0].repeat(2, None).exp()),
        case("tile", vec![s(&[2, 3])], |x| x[0].tile(&[2, 1, 2]).square()),
        case("pad", vec![s(&[2, 3])], |x| x[0].pad(&[(1, 2), (0, 1)], 0.5).square()),
        case("pad_edge", vec![s(&[2, 3])], |x| x[0].pad_edge(&[(1, 2), (2, 1)]).square()),
        case("tril", vec![s(&[4, 4])], |x| x[0].tril(-1).exp()),
        case("triu", vec![s(&[3, 5])], |x| x[0].triu(1).exp()),
        case("contiguous", vec![s(&[3, 4])], |x| x[0].t().contiguous().square()),
        case("copy", vec![s(&[3, 4])], |x| x[0].copy().sin()),
        case("slice_update", vec![s(&[4, 5]), s(&[2, 2])], |x| {
            x[0].slice_update(x[1].square(), &[1, 0], &[3, 4], &[1, 2])
        }),
        case("matmul", vec![s(&[3, 4]), s(&[4, 2])], |x| x[0].matmul(&x[1])),
        case("matmul_batched_broadcast", vec![s(&[2, 1, 3, 4]), s(&[3, 4, 2])], |x| x[0].matmul(&x[1])),
        case("matmul_vec_mat", vec![s(&[4]), s(&[2, 4, 3])], |x| x[0].matmul(&x[1])),
        case("matmul_mat_vec", vec![s(&[3, 4]), s(&[4])], |x| x[0].matmul(&x[1])),
        case("matmul_dot", vec![s(&[4]), s(&[4])], |x| x[0].matmul(&x[1])),
        case("addmm", vec![s(&[3, 4]), s(&[4, 2]), s(&[2])], |x| x[0].addmm(&x[1], &x[2], 0.5, 2.0)),
        case("mlp", vec![s(&[5, 4]), s(&[4, 6]), s(&[6]), s(&[6, 3])], |x| {
            let h = (x[0].matmul(&x[1]) + &x[2]).tanh();
            h.matmul(&x[3]).softmax(-1).log()
        }),
        case("attention", vec![s(&[2, 3, 4]), s(&[2, 5, 4]), s(&[2, 5, 4])], |x| {
            let scores = x[0].matmul(&x[1].swapaxes(-1, -2)) * 0.5;
            scores.softmax(-1).matmul(&x[2])
        }),
        case("rms_norm_chain", vec![s(&[3, 8]), s(&[8])], |x| {
            &x[0] * (x[0].square().mean_keepdims(-1) + 1e-5).rsqrt() * &x[1]
        }),
    ];
    // One random-shape matmul.
    let (m, k, n) = (1 + rng.below(5) as i32, 1 + rng.below(5) as i32, 1 + rng.below(5) as i32);
    out.push(case(format!("matmul_{m}x{k}x{n}"), vec![s(&[m, k]), s(&[k, n])], |x| x[0].matmul(&x[1])));
    out
}

fn all_cases(seed: u64) -> Vec<Case> {
    let mut rng = Rng(seed);
    let mut v = unary_cases(&mut rng);
    v.extend(binary_cases(&mut rng));
    v.extend(reduction_cases(&mut rng));
    v.extend(shape_cases(&mut rng));
    v.extend(fast_cases(&mut rng));
    v
}

/// The fused operations of `nuvec::fast`, whose forward is a fused primitive and whose reverse
/// mode goes through dedicated primitives (norms, cross entropy, RoPE's inverse rotation).
fn fast_cases(rng: &mut Rng) -> Vec<Case> {
    use Domain::*;
    use nuvec::fast;
    let s = |v: &[i32]| (v.to_vec(), Any);
    let d = 2 + rng.below(7) as i32;
    let targets = Array::from_slice(&[2i32, 0, -100, 4, 1, 3], [2, 3]);
    vec![
        case("fast_rms_norm", vec![s(&[3, d]), s(&[d])], |x| fast::rms_norm(&x[0], &x[1], 1e-5)),
        case("fast_rms_norm_unweighted", vec![s(&[2, 3, d])], |x| fast::rms_norm(&x[0], None, 1e-3)),
        case("fast_add_rms_norm", vec![s(&[3, d]), s(&[3, d]), s(&[d])], |x| {
            let (h, y) = fast::add_rms_norm(&x[0], &x[1], &x[2], 1e-5);
            h.sin() + y
        }),
        case("fast_layer_norm", vec![s(&[3, d]), s(&[d]), s(&[d])], |x| fast::layer_norm(&x[0], &x[1], &x[2], 1e-5)),
        case("fast_layer_norm_bias_only", vec![s(&[4, d]), s(&[d])], |x| fast::layer_norm(&x[0], None, &x[1], 1e-5)),
        case("fast_rms_norm_second_order", vec![s(&[2, d]), s(&[d])], move |x| {
            // The gradient of <c, rms_norm(x, w)> is itself differentiated.
            let c = Array::from_slice(&(0..2 * d).map(|i| (i as f64 * 0.37).sin()).collect::<Vec<_>>(), [2, d]);
            let f = move |a: &[Array]| Ok(vec![(fast::rms_norm(&a[0], &a[1], 1e-5) * &c).sum(..)]);
            let g = nuvec::transforms::vjp_flat(f, x, &[Array::from(1.0f64)]).unwrap().1;
            g[0].square().sum(..) + g[1].square().sum(..)
        }),
        case("fast_rope", vec![s(&[2, 3, 4, 6])], |x| {
            fast::rope(&x[0], 4, false, Some(10000.0), 1.0, &Array::from(3), None)
        }),
        case("fast_rope_traditional_scaled", vec![s(&[1, 2, 5, 8])], |x| {
            fast::rope(&x[0], 8, true, Some(500.0), 0.5, &Array::from(0), None)
        }),
        case("fast_rope_freqs_batch_offsets", vec![s(&[2, 2, 3, 4])], |x| {
            let freqs = Array::from_slice(&[1.0f32, 7.5], [2]);
            fast::rope(&x[0], 4, false, None, 1.0, &Array::from_slice(&[1i32, 5], [2]), &freqs)
        }),
        case("fast_swiglu", vec![s(&[3, d]), s(&[3, d])], |x| fast::swiglu(&x[0], &x[1])),
        case("fast_cross_entropy", vec![s(&[2, 3, 5])], move |x| fast::cross_entropy(&x[0], &targets)),
    ]
}

fn inputs_of(c: &Case, rng: &mut Rng) -> Vec<Array> {
    c.inputs.iter().map(|(s, d)| rng.array(s, *d)).collect()
}

/// vjp and jvp against central differences along random directions.
fn check_derivatives(c: &Case, rng: &mut Rng) -> Result<(), String> {
    let x = inputs_of(c, rng);
    let y = (c.f)(&x);
    let cot = rng.array(y.shape(), Domain::Any);
    let dir: Vec<Array> = x.iter().map(|a| rng.array(a.shape(), Domain::Any)).collect();
    let f = |xs: &[Array]| Ok(vec![(c.f)(xs)]);
    let (_, g) = vjp_flat(f, &x, std::slice::from_ref(&cot)).map_err(|e| format!("vjp: {e}"))?;
    let (_, t) = jvp_flat(f, &x, &dir).map_err(|e| format!("jvp: {e}"))?;
    let h = 1e-6;
    let at = |s: f64| -> f64 {
        let xs: Vec<Array> = x.iter().zip(&dir).map(|(a, d)| a + d * s).collect();
        ((c.f)(&xs) * &cot).sum(..).item::<f64>().unwrap()
    };
    let fd = (at(h) - at(-h)) / (2.0 * h);
    let from_vjp = dot(&g, &dir);
    let from_jvp = dot(&t, std::slice::from_ref(&cot));
    for (what, v) in [("vjp", from_vjp), ("jvp", from_jvp)] {
        if (v - fd).abs() > 1e-5 * (1.0 + fd.abs()) {
            return Err(format!(
                "{what}: {v} but finite differences give {fd} (inputs {:?})",
                c.inputs.iter().map(|i| &i.0).collect::<Vec<_>>()
            ));
        }
    }
    for (gi, xi) in g.iter().zip(&x) {
        if gi.shape() != xi.shape() || gi.dtype() != xi.dtype() {
            return Err(format!(
                "gradient {:?} {:?} for input {:?} {:?}",
                gi.shape(),
                gi.dtype(),
                xi.shape(),
                xi.dtype()
            ));
        }
    }
    Ok(())
}

/// vmap over a random axis of each input (or none) against a loop over the batch.
fn check_vmap(c: &Case, rng: &mut Rng) -> Result<(), String> {
    const B: i32 = 3;
    let n = c.inputs.len();
    let mut axes: Vec<Option<i32>> = (0..n)
        .map(|i| {
            if n > 1 && rng.below(3) == 0 {
                return None;
            }
            let r = c.inputs[i].0.len() as i32 + 1;
            let a = rng.below(r as usize) as i32;
            Some(if rng.below(2) == 0 { a - r } else { a })
        })
        .collect();
    if axes.iter().all(Option::is_none) {
        axes[0] = Some(0);
    }
    let out_axis = if rng.below(2) == 0 { 0 } else { -1 };
    let mut batched = Vec::new();
    let mut per_item: Vec<Vec<Array>> = vec![Vec::new(); B as usize];
    for (i, (shape, dom)) in c.inputs.iter().enumerate() {
        match axes[i] {
            None => {
                let a = rng.array(shape, *dom);
                for item in &mut per_item {
                    item.push(a.clone());
                }
                batched.push(a);
            }
            Some(ax) => {
                let items: Vec<Array> = (0..B).map(|_| rng.array(shape, *dom)).collect();
                for (b, item) in items.iter().enumerate() {
                    per_item[b].push(item.clone());
                }
                batched.push(ops::stack(&items, ax));
            }
        }
    }
    let f = |xs: &[Array]| Ok(vec![(c.f)(xs)]);
    let got = vmap_flat(f, &axes, &[out_axis])(&batched).map_err(|e| format!("vmap {axes:?}: {e}"))?;
    let want = ops::stack(&per_item.iter().map(|xs| (c.f)(xs)).collect::<Vec<_>>(), out_axis);
    if got[0].shape() != want.shape() {
        return Err(format!("vmap {axes:?} -> {out_axis}: shape {:?}, want {:?}", got[0].shape(), want.shape()));
    }
    let (g, w) = (got[0].to_vec::<f64>().map_err(|e| e.to_string())?, want.to_vec::<f64>().unwrap());
    // RoPE's angles are float32 either way; the GPU kernel's range-reduced hardware sine
    // (~4e-7) and the composition's sin may meet in one comparison.
    let tol = if c.name.starts_with("fast_rope") { 2e-6 } else { 1e-9 };
    for (a, b) in g.iter().zip(&w) {
        if (a - b).abs() > tol * (1.0 + b.abs()) {
            return Err(format!("vmap {axes:?} -> {out_axis}: {g:?}\nwant {w:?}"));
        }
    }
    Ok(())
}

fn run_all(check: fn(&Case, &mut Rng) -> Result<(), String>) {
    let mut failures = Vec::new();
    let mut count = 0;
    for seed in [1u64, 2, 3] {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ seed);
        for c in all_cases(seed) {
            count += 1;
            if let Err(e) = check(&c, &mut rng) {
                failures.push(format!("{} (seed {seed}): {e}", c.name));
            }
        }
    }
    assert!(failures.is_empty(), "{} of {count} cases failed:\n{}", failures.len(), failures.join("\n"));
    assert!(count > 150, "only {count} cases");
}

#[test]
fn vjp_and_jvp_match_finite_differences() {
    run_all(check_derivatives);
}

#[test]
fn vmap_matches_a_loop() {
    run_all(check_vmap);
}

#[test]
fn integer_and_boolean_outputs_have_no_gradient() {
    let x = Array::from_slice(&[0.5f64, -1.0, 2.0], [3]);
    let f = |xs: &[Array]| {
        Ok(vec![(xs[0].argmax(0).astype(DType::F64) + xs[0].greater(0.0).astype(DType::F64) * 3.0).sum(..)])
    };
    let (_, g) = vjp_flat(f, std::slice::from_ref(&x), &[Array::from_slice(&[1.0f64], [0i32; 0])]).unwrap();
    assert_eq!(g[0].to_vec::<f64>().unwrap(), vec![0.0; 3]);
    // stop_gradient: d/dx (sg(x) * x) = x.
    let g = nuvec::grad(|x: &Array| (x.stop_gradient() * x).sum(..))(&x).unwrap();
    assert_eq!(g.to_vec::<f64>().unwrap(), vec![0.5, -1.0, 2.0]);
    // Gradients keep the input's dtype, also for half types.
    for dt in [DType::F16, DType::BF16, DType::F32] {
        let x = ops::ones([4], dt);
        let g = nuvec::grad(|x: &Array| x.square().sum(..))(&x).unwrap();
        assert_eq!(g.dtype(), dt);
        assert_eq!(g.astype(DType::F32).to_vec::<f32>().unwrap(), vec![2.0; 4]);
    }
}

/// A half-precision operand beside a float32 one is widened by the kernel as it loads it (no
/// cast in the graph): results equal the cast-first computation bit for bit, for both orders
/// and a broadcast operand; cotangents keep each input's dtype and tangents the output's.
#[test]
fn widened_pairs_match_the_cast_and_keep_their_dtypes() {
    type Op2 = fn(&Array, &Array) -> Array;
    let ops2: [(&str, Op2); 7] = [
        ("add", |a, b| a + b),
        ("subtract", |a, b| a - b),
        ("multiply", |a, b| a * b),
        ("divide", |a, b| a / b),
        ("maximum", |a, b| a.maximum(b)),
        ("power", |a, b| a.abs().power(b)),
        ("less", |a, b| a.less(b)),
    ];
    let base = (ops::arange(0, 20, 1).astype(DType::F32) * 0.37 - 3.0).reshape([4, 5]);
    let w = ops::arange(0, 5, 1).astype(DType::F32) * 0.25 + 0.5;
    for half in [DType::BF16, DType::F16] {
        let h = base.astype(half);
        for (name, f) in ops2 {
            for (a, b, order) in [(&h, &w, "half, float"), (&w, &h, "float, half")] {
                let (a32, b32) = (a.astype(DType::F32), b.astype(DType::F32));
                let got = f(a, b);
                let want = f(&a32, &b32);
                assert_eq!(got.dtype(), want.dtype(), "{name} {half} ({order})");
                assert_eq!(got.to_bytes().unwrap(), want.to_bytes().unwrap(), "{name} {half} ({order})");
            }
        }
        let f = |v: &[Array]| Ok(vec![(&v[0] * &v[1]).sum(..)]);
        let (_, g) = vjp_flat(f, &[h.clone(), w.clone()], &[Array::from(1.0f32)]).unwrap();
        assert_eq!((g[0].dtype(), g[1].dtype()), (half, DType::F32));
        let want_gw = h.astype(DType::F32).sum(0).to_vec::<f32>().unwrap();
        assert_eq!(g[1].to_vec::<f32>().unwrap(), want_gw);
        let f = |v: &[Array]| Ok(vec![&v[0] + &w]);
        let (y, t) = jvp_flat(f, std::slice::from_ref(&h), &[h.ones_like()]).unwrap();
        assert_eq!((y[0].dtype(), t[0].dtype()), (DType::F32, DType::F32));
    }
}
