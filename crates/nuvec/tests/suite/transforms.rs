//! The transforms' contracts: simple gradients, nesting in every order, vmap axes, trees,
//! custom rules, checkpointing and errors.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use nuvec::transforms::{checkpoint_flat, custom_function_flat, grad_flat, jvp_flat, vjp_flat, vmap_flat};
use nuvec::{Array, DType, array, checkpoint, custom_function, grad, jvp, ops, value_and_grad, vjp, vmap};

fn close(a: &Array, b: &[f32]) {
    let v = a.to_vec::<f32>().unwrap();
    assert_eq!(v.len(), b.len(), "{v:?} vs {b:?}");
    for (x, y) in v.iter().zip(b) {
        assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()), "{v:?} vs {b:?}");
    }
}

#[test]
fn grads_of_simple_functions() {
    let x = array![0.5, -1.0, 2.0];
    close(&grad(|x: &Array| (x * x).sum(..))(&x).unwrap(), &[1.0, -2.0, 4.0]);
    close(&grad(|x: &Array| x.exp().sum(..))(&x).unwrap(), &[0.5f32.exp(), (-1.0f32).exp(), 2.0f32.exp()]);
    let g = grad(|x: &Array| x.softmax(-1).slice(&[0], &[1], &[1]).sum(..))(&x).unwrap();
    let s = x.softmax(-1).to_vec::<f32>().unwrap();
    close(&g, &[s[0] * (1.0 - s[0]), -s[0] * s[1], -s[0] * s[2]]);
    // Matmul, broadcasting, reductions over axes.
    let w = array![[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]];
    let gw = grad(|w: &Array| array![1.0, 1.0, 1.0].matmul(w).square().sum(..))(&w).unwrap();
    close(&gw, &[18.0, 24.0, 18.0, 24.0, 18.0, 24.0]);
    let (v, g) = value_and_grad(|x: &Array| (x * 2.0 + 1.0).mean(..))(&x).unwrap();
    close(&v, &[(2.0 * 1.5 + 3.0) / 3.0]);
    close(&g, &[2.0 / 3.0; 3]);
}

#[test]
fn nested_and_mixed() {
    // d²/dx² x³ = 6x
    let d2 = grad(|x: &Array| grad(|y: &Array| (y * y * y).sum(..))(x).unwrap().sum(..));
    close(&d2(&array![2.0]).unwrap(), &[12.0]);
    // jvp of vjp, vmap of grad.
    let (_, t) = jvp_flat(
        |x| Ok(vjp_flat(|y| Ok(vec![y[0].sin()]), x, &[ops::ones([2], nuvec::DType::F32)])?.1),
        &[array![0.0, 1.0]],
        &[array![1.0, 1.0]],
    )
    .unwrap();
    close(&t[0], &[-(0.0f32).sin(), -(1.0f32).sin()]);
    let per_row = vmap_flat(|x| grad_flat(|v| Ok((&v[0] * &v[0]).sum(..)), &[0])(x), &[Some(0)], &[0]);
    close(&per_row(&[array![[1.0, 2.0], [3.0, 4.0]]]).unwrap()[0], &[2.0, 4.0, 6.0, 8.0]);
}

#[test]
fn vmap_axes() {
    let f = vmap(|(a, b): &(Array, Array)| a.matmul(b)).in_axes(vec![Some(0), None]).out_axes(1);
    let a = ops::arange(0, 12, 1).astype(nuvec::DType::F32).reshape([3, 2, 2]);
    let b = array![[1.0, 0.0], [0.0, 2.0]];
    let out: Array = f.call(&(a.clone(), b.clone())).unwrap();
    assert_eq!(out.shape(), &[2, 3, 2]);
    let want = a.matmul(&b).moveaxis(0, 1);
    close(&out, &want.to_vec::<f32>().unwrap());
}

#[test]
fn nesting_in_every_order() {
    let x = array![0.5, -1.5, 2.0];
    // Third derivative of x^4 is 24x.
    let d1 = |x: &Array| grad(|y: &Array| (y * y * y * y).sum(..))(x).unwrap();
    let d2 = move |x: &Array| grad(move |y: &Array| d1(y).sum(..))(x).unwrap();
    let d3 = grad(move |y: &Array| d2(y).sum(..));
    close(&d3(&x).unwrap(), &[12.0, -36.0, 48.0]);
    // vmap of vmap: an outer product.
    let inner = |xs: &[Array]| Ok(vec![&xs[0] * &xs[1]]);
    let outer = vmap_flat(move |xs| vmap_flat(inner, &[None, Some(0)], &[0])(xs), &[Some(0), None], &[0]);
    let o = outer(&[array![1.0, 2.0], array![3.0, 4.0, 5.0]]).unwrap();
    assert_eq!(o[0].shape(), &[2, 3]);
    close(&o[0], &[3.0, 4.0, 5.0, 6.0, 8.0, 10.0]);
    // grad of vmap: d/dx sum_b sin(x_b * w) = w cos(x w).
    let w = array![2.0];
    let g = grad(|x: &Array| {
        let w = w.clone();
        vmap_flat(move |xs| Ok(vec![(&xs[0] * &w).sin()]), &[Some(0)], &[0])(std::slice::from_ref(x)).unwrap()[0]
            .sum(..)
    })(&x)
    .unwrap();
    let want: Vec<f32> = [0.5f32, -1.5, 2.0].iter().map(|v| 2.0 * (2.0 * v).cos()).collect();
    close(&g, &want);
    // jvp of grad: the Hessian-vector product of sum(x^3) is 6 x v.
    let v = array![1.0, 2.0, -1.0];
    let (_, hv) =
        jvp_flat(|xs| grad_flat(|ys| Ok((&ys[0] * &ys[0] * &ys[0]).sum(..)), &[0])(xs), std::slice::from_ref(&x), &[v])
            .unwrap();
    close(&hv[0], &[3.0, -18.0, -12.0]);
    // vjp of jvp.
    let (_, ct) = vjp_flat(
        |xs| Ok(jvp_flat(|ys| Ok(vec![ys[0].exp()]), xs, &[ops::ones([3], DType::F32)])?.1),
        std::slice::from_ref(&x),
        &[ops::ones([3], DType::F32)],
    )
    .unwrap();
    close(&ct[0], &[0.5f32.exp(), (-1.5f32).exp(), 2.0f32.exp()]);
}

#[test]
fn vmap_in_and_out_axes() {
    let a = ops::arange(0, 24, 1).astype(DType::F32).reshape([2, 3, 4]);
    let b = ops::arange(0, 12, 1).astype(DType::F32).reshape([4, 3]);
    // Mapping over axis 1 (as -2) of `a` and axis 1 of `b`, output batch axis last (-1).
    let f = vmap_flat(|xs| Ok(vec![xs[0].matmul(&xs[1]), xs[0].sum(..)]), &[Some(-2), Some(1)], &[-1, 0]);
    let out = f(&[a.clone(), b.clone()]).unwrap();
    assert_eq!(out[0].shape(), &[2, 3]);
    assert_eq!(out[1].shape(), &[3]);
    for i in 0..3 {
        let ai = a.slice(&[0, i, 0], &[2, i + 1, 4], &[1, 1, 1]).reshape([2, 4]);
        let bi = b.slice(&[0, i], &[4, i + 1], &[1, 1]).reshape([4]);
        let got = out[0].slice(&[0, i], &[2, i + 1], &[1, 1]).reshape([2]);
        close(&got, &ai.matmul(&bi).to_vec::<f32>().unwrap());
        close(&out[1].slice(&[i], &[i + 1], &[1]), &[ai.sum(..).item::<f32>().unwrap()]);
    }
    // Mismatched mapped sizes are an error naming vmap.
    let err = f(&[a.clone(), ops::zeros([4, 5], DType::F32)]).unwrap_err().to_string();
    assert!(err.contains("vmap"), "{err}");
    // An out-of-range in_axis is an error too.
    let err =
        vmap_flat(|xs| Ok(vec![xs[0].clone()]), &[Some(3)], &[0])(std::slice::from_ref(&a)).unwrap_err().to_string();
    assert!(err.contains("vmap"), "{err}");
    // Tree form with unmapped arguments and a negative out axis.
    let g = vmap(|(x, y): &(Array, Array)| x * y).in_axes(vec![Some(-1), None]).out_axes(-1);
    let o: Array = g.call(&(a.clone(), array![1.0, 10.0, 100.0])).unwrap();
    assert_eq!(o.shape(), &[2, 3, 4]);
    let want = &a * array![1.0, 10.0, 100.0].reshape([1, 3, 1]);
    close(&o, &want.to_vec::<f32>().unwrap());
}

#[test]
fn gradients_come_back_shaped_like_the_argument() {
    let mut map = HashMap::new();
    map.insert("w".to_string(), array![1.0, 2.0]);
    map.insert("b".to_string(), array![3.0]);
    let g = grad(|p: &HashMap<String, Array>| (&p["w"] * &p["b"]).sum(..))(&map).unwrap();
    close(&g["w"], &[3.0, 3.0]);
    close(&g["b"], &[3.0]);
    let mut bt = BTreeMap::new();
    bt.insert("layers".to_string(), vec![array![1.0], array![2.0]]);
    let g = grad(|p: &BTreeMap<String, Vec<Array>>| (&p["layers"][0] * &p["layers"][1]).sum(..))(&bt).unwrap();
    close(&g["layers"][0], &[2.0]);
    close(&g["layers"][1], &[1.0]);
    let g = grad(|p: &(Array, Option<Array>)| p.1.as_ref().map_or(p.0.sum(..), |o| (&p.0 * o).sum(..)))(&(
        array![2.0],
        Some(array![5.0]),
    ))
    .unwrap();
    close(&g.0, &[5.0]);
    close(g.1.as_ref().unwrap(), &[2.0]);
    // value_and_grad with auxiliary outputs: (loss, aux) comes back, aux without gradient.
    let ((loss, aux), gx) = value_and_grad(|x: &Array| ((x * x).sum(..), x * 3.0))(&array![1.0, 2.0]).unwrap();
    close(&loss, &[5.0]);
    close(&aux, &[3.0, 6.0]);
    close(&gx, &[2.0, 4.0]);
    // vjp and jvp over trees.
    let (out, ct) = vjp(|(a, b): &(Array, Array)| a * b, &(array![2.0], array![3.0]), &array![1.0]).unwrap();
    close(&out, &[6.0]);
    close(&ct.0, &[3.0]);
    close(&ct.1, &[2.0]);
    let (_, t) = jvp(|x: &Array| x.square(), &array![3.0], &array![1.0]).unwrap();
    close(&t, &[6.0]);
}

#[test]
fn custom_rules_are_used() {
    // A deliberately wrong vjp (10 g instead of e^x g) must be what grad returns.
    let f = custom_function(|x: &Array| x.exp()).with_vjp(|_x: &Array, _y: &Array, g: &Array| Ok(g * 10.0));
    let df = grad(move |x: &Array| f.call(x).map(|y| y.sum(..)));
    close(&df(&array![0.0, 1.0]).unwrap(), &[10.0, 10.0]);
    // Without rules the body is differentiated; with a jvp rule, jvp uses it.
    let plain = custom_function(|x: &Array| x.exp());
    let dp = grad(move |x: &Array| plain.call(x).map(|y| y.sum(..)));
    close(&dp(&array![0.0, 1.0]).unwrap(), &[1.0, 1.0f32.exp()]);
    let fj = custom_function(|x: &Array| x.sin()).with_jvp(|_x: &Array, t: &Array| Ok(t * -1.0));
    let (y, t) = jvp(move |x: &Array| fj.call(x), &array![0.3], &array![2.0]).unwrap();
    close(&y, &[0.3f32.sin()]);
    close(&t, &[-2.0]);
    // A vmap rule: the batched result is whatever the rule says (here: sum over the batch).
    let fv = custom_function_flat(|xs| Ok(vec![xs[0].square()])).with_vmap(|xs, axes| {
        let a = axes[0].unwrap();
        Ok((vec![xs[0].sum(a)], vec![0]))
    });
    let fv = Arc::new(fv);
    let out = vmap_flat(move |xs| fv.call(xs), &[Some(0)], &[0])(&[array![[1.0, 2.0], [3.0, 4.0]]]).unwrap();
    close(&out[0], &[4.0, 6.0]);
    // Custom rules survive nesting: grad of the custom vjp under vmap.
    let f2 = Arc::new(custom_function(|x: &Array| x.exp()).with_vjp(|_x: &Array, _y: &Array, g: &Array| Ok(g * 10.0)));
    let per_row = vmap_flat(
        move |xs| {
            let f2 = f2.clone();
            grad_flat(move |ys| Ok(f2.call(&ys[0])?.sum(..)), &[0])(xs)
        },
        &[Some(0)],
        &[0],
    );
    close(&per_row(&[array![[1.0, 2.0], [3.0, 4.0]]]).unwrap()[0], &[10.0; 4]);
}

#[test]
fn checkpoint_recomputes_and_gives_equal_gradients() {
    let calls = Arc::new(AtomicUsize::new(0));
    let body = {
        let calls = calls.clone();
        move |xs: &[Array]| {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok(vec![(&xs[0] * &xs[1]).tanh().exp()])
        }
    };
    let x = [array![0.1, -0.4, 0.7], array![1.5, 0.5, -2.0]];
    let plain = body.clone();
    let (_, want) = vjp_flat(plain, &x, &[ops::ones([3], DType::F32)]).unwrap();
    assert_eq!(calls.swap(0, Ordering::SeqCst), 1);
    let ck = checkpoint_flat(body);
    let (_, got) = vjp_flat(|xs| ck(xs), &x, &[ops::ones([3], DType::F32)]).unwrap();
    nuvec::eval(&got).unwrap();
    // Once forward, once more to recompute the intermediates for the backward pass.
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    for (g, w) in got.iter().zip(&want) {
        close(g, &w.to_vec::<f32>().unwrap());
    }
    // The tree form.
    let block = checkpoint(|(a, b): &(Array, Array)| (a * b).sin());
    let g = grad(move |p: &(Array, Array)| block(p).map(|y| y.sum(..)))(&(array![0.5], array![2.0])).unwrap();
    close(&g.0, &[2.0 * 1.0f32.cos()]);
    close(&g.1, &[0.5 * 1.0f32.cos()]);
}

#[test]
fn errors_are_reported_not_panicked() {
    // grad of a non-scalar.
    let err = grad(|x: &Array| x * 2.0)(&array![1.0, 2.0]).unwrap_err().to_string();
    assert!(err.contains("grad") || err.contains("scalar"), "{err}");
    // Cotangents of the wrong shape.
    let err =
        vjp_flat(|xs| Ok(vec![xs[0].exp()]), &[array![1.0, 2.0]], &[array![1.0, 2.0, 3.0]]).unwrap_err().to_string();
    assert!(err.contains("vjp"), "{err}");
    // Tangents of the wrong count.
    let err = jvp_flat(|xs| Ok(vec![xs[0].exp()]), &[array![1.0]], &[]).unwrap_err().to_string();
    assert!(err.contains("jvp"), "{err}");
    // A failed array inside the function surfaces as its error.
    let err = grad(|x: &Array| x.reshape([5]).sum(..))(&array![1.0, 2.0]).unwrap_err().to_string();
    assert!(err.contains("reshape"), "{err}");
}
