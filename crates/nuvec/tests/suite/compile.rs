//! `compile`: compiled functions give the uncompiled function's results bit for bit (fusion
//! rounds every value to its dtype and never contracts a multiply and an add across steps),
//! trace once per signature, simplify their graph, and compose with every transform.

use std::cell::Cell;

use crate::Rng;
use nuvec::transforms::{
    CompileOptions, compile_flat, compile_flat_with, compiled_graph, grad_flat, jvp_flat, vjp_flat, vmap,
};
use nuvec::{Array, DType, Result, array, bf16, compile, f16, grad, ops as mx};

/// This module's draws.
impl Rng {
    fn float(&mut self) -> f32 {
        (self.bits() >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
    }
    fn array_of(&mut self, shape: &[i32], dtype: DType) -> Array {
        let n: i32 = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|_| self.float()).collect();
        let a = Array::from_slice(&v, shape);
        if dtype.is_integer() { (a * 50.0).astype(dtype) } else { a.astype(dtype) }
    }
}

/// The elements' bits, with every NaN as one value (fused kernels may quiet a NaN's payload).
fn bits(a: &Array) -> Vec<u64> {
    let nan = u64::MAX;
    match a.dtype() {
        DType::F32 => {
            a.to_vec::<f32>().unwrap().iter().map(|x| if x.is_nan() { nan } else { x.to_bits() as u64 }).collect()
        }
        DType::BF16 => {
            a.to_vec::<bf16>().unwrap().iter().map(|x| if x.is_nan() { nan } else { x.to_bits() as u64 }).collect()
        }
        DType::F16 => {
            a.to_vec::<f16>().unwrap().iter().map(|x| if x.is_nan() { nan } else { x.to_bits() as u64 }).collect()
        }
        DType::Bool => a.to_vec::<bool>().unwrap().iter().map(|&x| x as u64).collect(),
        _ => a.astype(DType::I64).to_vec::<i64>().unwrap().iter().map(|&x| x as u64).collect(),
    }
}

fn assert_same(got: &[Array], want: &[Array], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: number of outputs");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.shape(), w.shape(), "{what}: output {i} shape");
        assert_eq!(g.dtype(), w.dtype(), "{what}: output {i} dtype");
        let (gb, wb) = (bits(g), bits(w));
        if let Some(k) = gb.iter().zip(&wb).position(|(a, b)| a != b) {
            panic!("{what}: output {i} differs first at element {k}: bits {:x} vs {:x}", gb[k], wb[k]);
        }
    }
}

/// A random element-wise program over `inputs`: a pool of values grows by unary, binary,
/// `where` and cast steps (with weak scalars and broadcast rows), now and then a reduction
/// broadcast back; a few values of the pool are returned.
fn program(seed: u64, float: DType) -> impl Fn(&[Array]) -> Result<Vec<Array>> {
    move |x: &[Array]| {
        let mut rng = Rng(seed);
        let mut pool: Vec<Array> = x.to_vec();
        let steps = 6 + rng.below(14);
        for _ in 0..steps {
            let a = pool[rng.below(pool.len())].clone();
            let b = pool[rng.below(pool.len())].clone();
            let s = rng.float();
            let v = match rng.below(if float.is_integer() { 9 } else { 22 }) {
                0 => &a + &b,
                1 => &a * &b,
                2 => &a - &b,
                3 => mx::maximum(&a, &b),
                4 => mx::minimum(&a, &b),
                5 => mx::where_(a.greater(&b), &a, &b),
                6 => a.negative(),
                7 => &a * 3 + 1,
                8 => a.square(),
                9 => &a * s,
                10 => &a + s,
                11 => a.exp().minimum(1e4),
                12 => a.tanh(),
                13 => a.sigmoid(),
                14 => a.abs().sqrt(),
                15 => a.abs().log1p(),
                16 => &a / (b.abs() + 1.0),
                17 => a.astype(DType::F32).astype(a.dtype()),
                18 => (&a * s + &b) * &a - s,
                19 => a.sin() * b.cos(),
                20 => &a - a.sum_keepdims(-1) * 0.01,
                _ => mx::logaddexp(&a, &b),
            };
            pool.push(v);
        }
        let n = pool.len();
        Ok(vec![pool[n - 1].clone(), pool[n - 2 - rng.below(3)].clone()])
    }
}

#[test]
fn compiled_equals_uncompiled_bit_for_bit() {
    let mut rng = Rng(0x5eed);
    for case in 0..36u64 {
        let dtype = [DType::F32, DType::F32, DType::BF16, DType::F16, DType::I32][case as usize % 5];
        let shape: Vec<i32> = [vec![3, 37], vec![64, 130], vec![1000], vec![2, 3, 257]][rng.below(4)].clone();
        let last = *shape.last().unwrap();
        let inputs = [rng.array_of(&shape, dtype), rng.array_of(&shape, dtype), rng.array_of(&[last], dtype)];
        // The row vector joins the pool broadcast against the others.
        let f = program(case + 1, dtype);
        let g = move |x: &[Array]| f(&[x[0].clone(), x[1].clone(), &x[2] + x[0].zeros_like()]);
        let want = g(&inputs).unwrap();
        let compiled = compile_flat(g);
        let first = compiled(&inputs).unwrap();
        assert_same(&first, &want, &format!("case {case} ({dtype:?}, {shape:?}), tracing call"));
        let again = compiled(&inputs).unwrap();
        assert_same(&again, &want, &format!("case {case}, replay"));
    }
}

#[test]
fn compiled_reads_views_in_any_layout() {
    // Transposed, strided, broadcast and offset inputs: the GPU kernel walks or copies them.
    let mut rng = Rng(13);
    let (a, b, r) =
        (rng.array_of(&[64, 48], DType::F32), rng.array_of(&[48, 64], DType::F32), rng.array_of(&[64], DType::F32));
    let big = rng.array_of(&[97, 64], DType::BF16);
    let f = |x: &[Array]| {
        let t = x[0].t();
        let strided = x[3].slice(&[1, 0], &[97, 64], &[2, 1]).astype(DType::F32);
        let row = x[2].broadcast_to([48, 64]);
        Ok(vec![((&t * &x[1] + &row).tanh() * strided).exp(), (&x[1] - &t).square() * 0.5])
    };
    let inputs = [a, b, r, big];
    let want = f(&inputs).unwrap();
    let compiled = compile_flat(f);
    assert_same(&compiled(&inputs).unwrap(), &want, "views");
    assert_same(&compiled(&inputs).unwrap(), &want, "views, replay");
}

#[test]
fn multiply_add_chains_round_each_step() {
    // a*b + c is two roundings unfused; a fused kernel must not contract it into one.
    let mut rng = Rng(7);
    let (a, b, c) =
        (rng.array_of(&[4096], DType::F32), rng.array_of(&[4096], DType::F32), rng.array_of(&[4096], DType::F32));
    let f = |x: &[Array]| Ok(vec![&x[0] * &x[1] + &x[2], (&x[0] * &x[0]).square() - &x[1] * &x[2]]);
    let want = f(&[a.clone(), b.clone(), c.clone()]).unwrap();
    let got = compile_flat(f)(&[a, b, c]).unwrap();
    assert_same(&got, &want, "multiply-add");
}

#[test]
fn a_chain_fuses_into_one_node_and_common_work_merges() {
    let x = array![[1.0, 2.0], [3.0, 4.0]];
    let chain = |x: &[Array]| Ok(vec![((&x[0] * 2.0 + 1.0).exp().tanh() - 0.5).sigmoid()]);
    let text = compiled_graph(chain, std::slice::from_ref(&x), CompileOptions::default()).unwrap();
    let nodes: Vec<&str> = text.lines().filter(|l| l.starts_with('n')).collect();
    assert_eq!(nodes.len(), 1, "{text}");
    assert!(nodes[0].starts_with("n0 = compiled(in0"), "{text}");

    // Branches that start from the inputs join the region they meet: GELU and an Adam step
    // (three outputs) are one node each.
    let gelu = |x: &[Array]| {
        let x = &x[0];
        let inner = (x + (x * x * x) * 0.044715) * 0.7978846;
        Ok(vec![(x * 0.5) * (inner.tanh() + 1.0)])
    };
    let text = compiled_graph(gelu, std::slice::from_ref(&x), CompileOptions::default()).unwrap();
    assert_eq!(text.lines().filter(|l| l.starts_with('n')).count(), 1, "{text}");
    let adam = |a: &[Array]| {
        let (p, g, m, v) = (&a[0], &a[1], &a[2], &a[3]);
        let m = m * 0.9 + g * 0.1;
        let v = v * 0.999 + g * g * 0.001;
        let p = p - (&m / 0.65) * 1e-3 / ((&v / 0.01).sqrt() + 1e-8);
        Ok(vec![p, m, v])
    };
    let four = [x.clone(), x.clone() * 0.1, x.clone() * 0.01, x.square()];
    let text = compiled_graph(adam, &four, CompileOptions::default()).unwrap();
    let nodes: Vec<&str> = text.lines().filter(|l| l.starts_with('n')).collect();
    assert_eq!(nodes.len(), 1, "{text}");
    assert_eq!(text.matches("outputs: v").count(), 1, "{text}");
    let want = adam(&four).unwrap();
    assert_same(&compile_flat(adam)(&four).unwrap(), &want, "adam");

    // exp(x) twice is one exp; the sum ends a region and its consumer starts another.
    let twice = |x: &[Array]| Ok(vec![x[0].exp() + x[0].exp(), (x[0].exp() * 2.0).sum(..) * x[0].exp()]);
    let text =
        compiled_graph(twice, std::slice::from_ref(&x), CompileOptions { no_fusion: true, ..Default::default() })
            .unwrap();
    assert_eq!(text.matches("= exp(").count(), 1, "{text}");
    let text = compiled_graph(twice, std::slice::from_ref(&x), CompileOptions::default()).unwrap();
    assert_eq!(text.matches("= sum(").count(), 1, "{text}");

    // Work that does not depend on the inputs is a constant of the trace.
    let w = array![0.5, 0.25];
    let text = compiled_graph(|x: &[Array]| Ok(vec![&x[0] * w.exp()]), &[x], CompileOptions::default()).unwrap();
    assert!(!text.contains("exp"), "{text}");
}

#[test]
fn traces_once_per_signature() {
    let traces = Cell::new(0);
    let f = compile_flat(|x: &[Array]| {
        traces.set(traces.get() + 1);
        Ok(vec![(&x[0] + 1.0).square()])
    });
    let a = array![1.0, 2.0];
    for _ in 0..3 {
        assert_eq!(f(std::slice::from_ref(&a)).unwrap()[0].to_vec::<f32>().unwrap(), vec![4.0, 9.0]);
    }
    assert_eq!(traces.get(), 1);
    // A new shape, dtype or device traces again.
    assert_eq!(f(&[array![1.0, 2.0, 3.0]]).unwrap()[0].to_vec::<f32>().unwrap(), vec![4.0, 9.0, 16.0]);
    assert_eq!(f(&[a.astype(DType::F16)]).unwrap()[0].dtype(), DType::F16);
    assert_eq!(traces.get(), 3);
    f(std::slice::from_ref(&a)).unwrap();
    assert_eq!(traces.get(), 3);

    // Shapeless: one trace for every shape of one rank; a reshape to fixed sizes retraces.
    let traces = Cell::new(0);
    let opts = CompileOptions { shapeless: true, ..Default::default() };
    let f = compile_flat_with(
        |x: &[Array]| {
            traces.set(traces.get() + 1);
            Ok(vec![x[0].exp() * 2.0])
        },
        opts,
    );
    for n in [3, 5, 9] {
        let x = mx::arange(0.0, n as f64, 1.0);
        assert_same(&f(std::slice::from_ref(&x)).unwrap(), &[x.exp() * 2.0], "shapeless");
    }
    assert_eq!(traces.get(), 1);
    let traces = Cell::new(0);
    let f = compile_flat_with(
        |x: &[Array]| {
            traces.set(traces.get() + 1);
            Ok(vec![x[0].reshape([2, -1]).sum_keepdims(0)])
        },
        opts,
    );
    assert_eq!(f(&[mx::arange(0.0, 4.0, 1.0)]).unwrap()[0].to_vec::<f32>().unwrap(), vec![2.0, 4.0]);
    assert_eq!(f(&[mx::arange(0.0, 6.0, 1.0)]).unwrap()[0].to_vec::<f32>().unwrap(), vec![3.0, 5.0, 7.0]);
    assert_eq!(traces.get(), 2);

    // Off (one test only: the switch is global), the function runs on every call.
    let calls = Cell::new(0);
    let f = compile_flat(|x: &[Array]| {
        calls.set(calls.get() + 1);
        Ok(vec![&x[0] * 2.0])
    });
    nuvec::disable_compile();
    let twice = (f(&[array![1.0]]), f(&[array![1.0]]));
    nuvec::enable_compile();
    assert_eq!(twice.0.unwrap()[0].to_vec::<f32>().unwrap(), vec![2.0]);
    assert!(twice.1.is_ok());
    assert_eq!(calls.get(), 2);
}

#[test]
fn compiled_functions_compose_with_transforms() {
    let mut rng = Rng(11);
    let x = rng.array_of(&[5, 6], DType::F32);
    let y = rng.array_of(&[5, 6], DType::F32);
    let f = |x: &[Array]| -> Result<Vec<Array>> { Ok(vec![((&x[0] * &x[1]).tanh() + x[0].exp() * 0.5).square()]) };
    let loss = move |x: &[Array]| -> Result<Array> { Ok(f(x)?.remove(0).sum(..)) };
    let cf = compile_flat(f);

    // grad of compile, compile of grad.
    let want = grad_flat(loss, &[0, 1])(&[x.clone(), y.clone()]).unwrap();
    let got = grad_flat(|a: &[Array]| Ok(cf(a)?.remove(0).sum(..)), &[0, 1])(&[x.clone(), y.clone()]).unwrap();
    assert_close(&got, &want, "grad(compile(f))");
    let cg = compile_flat(|a: &[Array]| grad_flat(loss, &[0, 1])(a));
    assert_close(&cg(&[x.clone(), y.clone()]).unwrap(), &want, "compile(grad(f))");
    assert_close(&cg(&[x.clone(), y.clone()]).unwrap(), &want, "compile(grad(f)), replay");

    // vjp and jvp through a compiled function.
    let ct = [x.ones_like() * 0.5];
    let (_, want) = vjp_flat(f, &[x.clone(), y.clone()], &ct).unwrap();
    let (_, got) = vjp_flat(&cf, &[x.clone(), y.clone()], &ct).unwrap();
    assert_close(&got, &want, "vjp(compile(f))");
    let t = [y.clone(), x.clone()];
    let (_, want) = jvp_flat(f, &[x.clone(), y.clone()], &t).unwrap();
    let (_, got) = jvp_flat(&cf, &[x.clone(), y.clone()], &t).unwrap();
    assert_close(&got, &want, "jvp(compile(f))");

    // vmap of compile (the fused node batches fused), compile of vmap.
    let one = |a: &Array| f(&[a.clone(), a * 2.0]).unwrap().remove(0);
    let want = vmap(one).call(&x).unwrap();
    let cone = compile(move |a: &Array| f(&[a.clone(), a * 2.0]).map(|mut v| v.remove(0)));
    let got = vmap(|a: &Array| cone(a).unwrap()).call(&x).unwrap();
    assert_close(&[got], std::slice::from_ref(&want), "vmap(compile(f))");
    let cv = compile(move |a: &Array| vmap(one).call(a));
    assert_close(&[cv(&x).unwrap()], &[want], "compile(vmap(f))");

    // grad of a tree-compiled function.
    let c = compile(|p: &(Array, Array)| (&p.0 * &p.1).sigmoid().sum(..));
    let (dx, dy) = grad(|p: &(Array, Array)| c(p).unwrap())(&(x.clone(), y.clone())).unwrap();
    let s = (&x * &y).sigmoid();
    let ds = &s * (s.ones_like() - &s);
    assert_close(&[dx, dy], &[&ds * &y, &ds * &x], "grad of a compiled tree function");
}

fn assert_close(got: &[Array], want: &[Array], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (g, w) in got.iter().zip(want) {
        let (g, w) = (g.to_vec::<f32>().unwrap(), w.to_vec::<f32>().unwrap());
        for (i, (a, b)) in g.iter().zip(&w).enumerate() {
            assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "{what}: element {i}: {a} vs {b}");
        }
    }
}

#[test]
fn errors_come_back_from_the_call() {
    let f = compile_flat(|x: &[Array]| Ok(vec![x[0].reshape([7])]));
    let e = f(&[array![1.0, 2.0]]).unwrap_err();
    assert!(e.to_string().contains("reshape"), "{e}");
    let g = compile_flat(|_: &[Array]| Err(nuvec::Error::InvalidArgument("no".into())));
    assert!(g(&[array![1.0]]).is_err());
    let failed = array![1.0].reshape([3]);
    assert!(compile_flat(|x: &[Array]| Ok(vec![x[0].exp()]))(&[failed]).is_err());
}

#[test]
fn fused_programs_run_on_the_gpu() {
    use nuvec::graph::compiled::{Program, Step};
    use nuvec::graph::{BinaryOp, UnaryOp};
    use nuvec::graph::{Compiled, Primitive, Spec, backend_for};
    if !crate::gpu::gpu() {
        return;
    }
    let backend = backend_for(nuvec::Device::gpu(0)).unwrap();
    for d in [DType::F32, DType::BF16, DType::F16, DType::I32] {
        let steps = if d.is_integer() {
            vec![(Step::Binary(BinaryOp::Add, 0, 1), d), (Step::Unary(UnaryOp::Negative, 2), d)]
        } else {
            vec![(Step::Binary(BinaryOp::Multiply, 0, 1), d), (Step::Unary(UnaryOp::Exp, 2), d)]
        };
        let p = Program { inputs: vec![d, d], steps, outputs: vec![3, 2] };
        let spec = Spec { shape: [64, 4096].into_iter().collect(), dtype: d };
        let prim = Primitive::Compiled(Compiled(std::sync::Arc::new(p)));
        assert!(backend.supports(&prim, &[spec.clone(), spec.clone()], &[spec.clone(), spec]), "{d:?}");
    }
}

#[test]
fn captured_state_is_read_and_replaced_on_every_call() {
    use nuvec::transforms::compile_with_state;
    use std::{cell::RefCell, rc::Rc};
    // Three steps of gradient descent on w, the weights held outside the step's arguments.
    let mut rng = Rng(3);
    let (x, target) = (rng.array_of(&[8, 4], DType::F32), rng.array_of(&[8], DType::F32));
    let loss = |w: &Array, x: &Array, t: &Array| (x.matmul(w) - t).square().mean(..);
    let step = |w: &Array, x: &Array, t: &Array| -> (Array, Array) {
        let g = grad(|w: &Array| loss(w, x, t))(w).unwrap();
        (w - g * 0.1, loss(w, x, t))
    };
    let mut w_plain = rng.array_of(&[4], DType::F32);
    let w = Rc::new(RefCell::new(w_plain.clone()));
    let traces = Cell::new(0);
    let (get, set, body) = (w.clone(), w.clone(), w.clone());
    let compiled = compile_with_state(
        |a: &[Array]| {
            traces.set(traces.get() + 1);
            let (next, l) = step(&body.borrow(), &a[0], &a[1]);
            *body.borrow_mut() = next;
            Ok(vec![l])
        },
        move || vec![get.borrow().clone()],
        move |s: Vec<Array>| *set.borrow_mut() = s[0].clone(),
        CompileOptions::default(),
    );
    for i in 0..3 {
        let (next, want) = step(&w_plain, &x, &target);
        w_plain = next;
        let got = compiled(&[x.clone(), target.clone()]).unwrap();
        assert_close(&got, &[want], &format!("loss of step {i}"));
        assert_close(&[w.borrow().clone()], &[w_plain.clone()], &format!("weights after step {i}"));
    }
    assert_eq!(traces.get(), 1);
}

/// Four decode-shaped layers (RMSNorm, products, SwiGLU, residual) over captured bf16 weights.
fn decoder(seed: u64, d: i32) -> impl Fn(&[Array]) -> Result<Vec<Array>> + Clone {
    let mut rng = Rng(seed);
    let layers: Vec<[Array; 4]> = (0..4)
        .map(|_| {
            let s = 1.0 / (d as f32).sqrt();
            [
                rng.array_of(&[d], DType::BF16) + 1.0,
                rng.array_of(&[d, d], DType::BF16) * s,
                rng.array_of(&[d, d], DType::BF16) * s,
                rng.array_of(&[d, d], DType::BF16) * s,
            ]
        })
        .collect();
    nuvec::eval(&layers.iter().flatten().collect::<Vec<_>>()).unwrap();
    move |x: &[Array]| {
        let mut h = x[0].clone();
        for [norm, gate, up, down] in &layers {
            let n = nuvec::fast::rms_norm(&h, norm, 1e-5);
            h = &h + nuvec::fast::swiglu(&n.matmul(gate), &n.matmul(up)).matmul(down);
        }
        Ok(vec![h.clone(), (h * 0.5).tanh().astype(DType::F32)])
    }
}

#[test]
fn cuda_graphs_record_once_then_replay_bit_for_bit() {
    if !crate::gpu::gpu() {
        return;
    }
    let f = decoder(5, 256);
    let graphed = compile_flat_with(f.clone(), CompileOptions { cuda_graph: true, ..Default::default() });
    let before = nuvec::transforms::cuda_graphs_recorded();
    let mut rng = Rng(9);
    for call in 0..5 {
        let x = rng.array_of(&[1, 256], DType::BF16);
        let want = f(std::slice::from_ref(&x)).unwrap();
        let got = graphed(std::slice::from_ref(&x)).unwrap();
        assert_same(&got, &want, &format!("call {call}"));
        // The results are the caller's: the next launch must not overwrite them.
        if call > 1 {
            let again = graphed(&[rng.array_of(&[1, 256], DType::BF16)]).unwrap();
            nuvec::eval(&again).unwrap();
            assert_same(&got, &want, &format!("call {call}, after another launch"));
        }
    }
    // Recorded on the second call, launched ever since.
    assert!(nuvec::transforms::cuda_graphs_recorded() > before);
    // A second signature records its own graph.
    let x = rng.array_of(&[3, 256], DType::BF16);
    for _ in 0..3 {
        assert_same(&graphed(std::slice::from_ref(&x)).unwrap(), &f(std::slice::from_ref(&x)).unwrap(), "batch of 3");
    }
}

/// A recorded graph reads, on every launch, an array evaluated before recording that no one
/// holds afterwards: the graph keeps its memory, so arrays made later cannot take it.
#[test]
fn device_graphs_keep_the_memory_they_read() {
    if !crate::gpu::gpu() {
        return;
    }
    let n = 1 << 16;
    let y = mx::ones([n], DType::F32) + 1.0;
    nuvec::eval(std::slice::from_ref(&y)).unwrap();
    // Only the sum's node holds `y` now; it is let go while recording.
    let total = y.sum(..);
    drop(y);
    let g = nuvec::transforms::DeviceGraph::record(vec![total]).unwrap();
    // Arrays of y's size made now would reuse its memory had the graph let it go.
    let others: Vec<Array> = (0..4).map(|i| mx::full_dtype([n], 7 + i, DType::F32)).collect();
    nuvec::eval(&others).unwrap();
    for launch in 0..3 {
        g.launch().unwrap();
        assert_eq!(g.outputs()[0].item::<f32>().unwrap(), 2.0 * n as f32, "launch {launch}");
    }
    for (i, o) in others.iter().enumerate() {
        assert_eq!(o.to_vec::<f32>().unwrap(), vec![7.0 + i as f32; n as usize]);
    }
}

#[test]
fn work_that_cannot_be_recorded_replays_op_by_op() {
    // (On a CPU nothing records; the results must still be the function's.)
    // The GPU has no complex running sum: it runs on the host, which a graph cannot wait for.
    let f = |x: &[Array]| {
        let c = x[0].astype(DType::Complex64);
        Ok(vec![c.cumsum(-1).abs() + 1.0])
    };
    let graphed = compile_flat_with(f, CompileOptions { cuda_graph: true, ..Default::default() });
    let mut rng = Rng(4);
    for call in 0..4 {
        let x = rng.array_of(&[4, 4], DType::F32);
        assert_same(&graphed(std::slice::from_ref(&x)).unwrap(), &f(&[x]).unwrap(), &format!("call {call}"));
    }
}

#[test]
fn half_precision_chains_equal_eager_bit_for_bit() {
    // Programs of "widen, compute in float32, round" steps, which the GPU runs two elements at
    // a time: sizes with odd tails, weak scalars, several outputs.
    let mut rng = Rng(17);
    for dtype in [DType::BF16, DType::F16] {
        for shape in [vec![1001], vec![64, 130], vec![3, 5, 7]] {
            let (x, y) = (rng.array_of(&shape, dtype), rng.array_of(&shape, dtype));
            let f = |a: &[Array]| {
                let (x, y) = (&a[0], &a[1]);
                let t = ((x * 1.5 + 0.5).tanh() * y - 0.25).exp() / 3.0;
                let g = (x * 0.5) * (((x + x * x * x * 0.044715) * 0.7978846).tanh() + 1.0);
                let m = mx::maximum(&t, y).sigmoid() + mx::minimum(x, y).abs().sqrt() - x.square();
                Ok(vec![t, g, mx::logaddexp(&m, x).sin()])
            };
            let want = f(&[x.clone(), y.clone()]).unwrap();
            let compiled = compile_flat(f);
            for call in 0..2 {
                let got = compiled(&[x.clone(), y.clone()]).unwrap();
                assert_same(&got, &want, &format!("{dtype:?} {shape:?} call {call}"));
            }
        }
    }
}
