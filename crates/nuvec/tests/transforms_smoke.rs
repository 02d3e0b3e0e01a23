//! First checks of the transforms.

use nuvec::transforms::{grad_flat, jvp_flat, vjp_flat, vmap_flat};
use nuvec::{Array, array, grad, ops, value_and_grad, vmap};

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
    let (_, t) = jvp_flat(|x| Ok(vjp_flat(|y| Ok(vec![y[0].sin()]), x, &[ops::ones([2], nuvec::DType::F32)])?.1), &[array![0.0, 1.0]], &[array![1.0, 1.0]]).unwrap();
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
