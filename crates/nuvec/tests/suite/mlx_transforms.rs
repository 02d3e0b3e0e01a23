//! Replays golden gradients recorded from real MLX (`scripts/mlx_fixtures_transforms.py`, MLX
//! 0.32.4 on the CPU): `vjp`, `value_and_grad`, `jvp`, `vmap` with several in/out axes, vmap of
//! grad, jvp of vjp and grad of grad, over op chains and small models written here exactly as in
//! the script (same names).

use crate::fixture;

use fixture::{Case, Fixture, Tolerance, compare};
use nuvec::transforms::{grad_flat, jvp_flat, value_and_grad_flat, vjp_flat, vmap_flat};
use nuvec::{Array, Result, ops};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/transforms.bin");

fn mlp(x: &[Array]) -> Array {
    ((x[0].matmul(&x[1]) + &x[2]).tanh().matmul(&x[3])).softmax(-1)
}
fn attention(x: &[Array]) -> Array {
    (x[0].matmul(&x[1].swapaxes(-1, -2)) * 0.5).softmax(-1).matmul(&x[2])
}
fn rms_norm(x: &[Array]) -> Array {
    &x[0] * ((&x[0] * &x[0]).mean_keepdims(-1) + 1e-5).rsqrt() * &x[1]
}
fn layer_norm(x: &[Array]) -> Array {
    let mu = x[0].mean_keepdims(-1);
    let var = ops::var(&x[0], -1, true, 0);
    (&x[0] - mu) * (var + 1e-5).rsqrt()
}
fn scans(x: &[Array]) -> Array {
    let rev = ops::ScanOptions { reverse: true, exclusive: false };
    x[0].exp().cumsum(1) * x[0].cumprod(0) + x[0].logcumsumexp_with(-1, rev)
}
fn max_min(x: &[Array]) -> Array {
    x[0].maximum(&x[1]) * x[0].min(0) + x[0].max_keepdims(1)
}
fn pow_div(x: &[Array]) -> Array {
    x[0].power(&x[1]) / (&x[1] * &x[1] + 1.0)
}
fn where_clip(x: &[Array]) -> Array {
    ops::where_(x[0].greater(0.0), &x[0] * &x[0], x[0].clip(-0.5, 0.5))
}
fn shapes(x: &[Array]) -> Array {
    let a = x[0].transpose(&[2, 0, 1]).reshape([4, 6]);
    let b = x[0].slice(&[0, 0, 1], &[2, 3, 4], &[1, 2, 1]).pad(&[(0, 0), (1, 0), (0, 0)], 0.0).reshape([3, 6]);
    ops::concatenate(&[a, b.tile(&[1, 1]) * 2.0], 0)
}
fn var_std(x: &[Array]) -> Array {
    ops::var(&x[0], 1, false, 1) + ops::std(&x[0], 0, false, 0).sum(..)
}
fn lse_softmax(x: &[Array]) -> Array {
    x[0].logsumexp(0) + x[0].softmax(-1).sum(0) * ops::arange(0.0, 5.0, 1.0)
}
fn smooth(x: &[Array]) -> Array {
    let x = &x[0];
    x.erf() * x.sigmoid() + x.arctan2(x * x + 1.0) + x.logaddexp(x.negative()) + x.sin() * x.cosh()
}
fn batched_matmul(x: &[Array]) -> Array {
    x[0].matmul(&x[1])
}
fn prod_mean(x: &[Array]) -> Array {
    x[0].prod(1) * x[0].mean(..)
}
fn tri(x: &[Array]) -> Array {
    x[0].tril(0).matmul(&x[0].triu(1)) + x[0].slice(&[0, 0], &[4, 1], &[1, 1]).repeat(4, 1)
}
fn stack_split(x: &[Array]) -> Array {
    let p = x[0].split(2, 1);
    ops::stack(&[&p[0] * &x[1], &p[1] - &x[1]], -1)
}

fn function(name: &str) -> fn(&[Array]) -> Array {
    match name {
        "mlp" => mlp,
        "attention" => attention,
        "rms_norm" => rms_norm,
        "layer_norm" => layer_norm,
        "scans" => scans,
        "max_min" => max_min,
        "pow_div" => pow_div,
        "where_clip" => where_clip,
        "shapes" => shapes,
        "var_std" => var_std,
        "lse_softmax" => lse_softmax,
        "smooth" => smooth,
        "batched_matmul" => batched_matmul,
        "prod_mean" => prod_mean,
        "tri" => tri,
        "stack_split" => stack_split,
        other => panic!("the fixture names an unknown function {other}"),
    }
}

/// The number of primal arguments (the rest of a case's inputs are cotangents or tangents).
fn arity(case: &Case) -> usize {
    case.params.get("n").and_then(|j| j.as_i64()).expect("params.n") as usize
}

fn axes_of(case: &Case, key: &str) -> Vec<Option<i32>> {
    let list = case.params.get(key).and_then(|j| j.as_array()).expect("in_axes");
    list.iter().map(|a| a.as_i64().map(|v| v as i32)).collect()
}

fn run(case: &Case) -> Result<Vec<Array>> {
    let f = function(&case.op);
    let inputs: Vec<Array> = case.inputs.iter().map(|t| t.to_array()).collect();
    let n = arity(case);
    let kind = case.params.get("kind").and_then(|k| k.as_str()).unwrap_or("?");
    let apply = move |xs: &[Array]| Ok(vec![f(xs)]);
    let loss = move |xs: &[Array]| {
        let y = f(xs);
        Ok((&y * &y).sum(..) / 2.0)
    };
    let all: Vec<usize> = (0..n).collect();
    Ok(match kind {
        "vjp" => {
            let (out, g) = vjp_flat(apply, &inputs[..n], &inputs[n..])?;
            out.into_iter().chain(g).collect()
        }
        "grad" => {
            let (v, g) = value_and_grad_flat(loss, &all)(&inputs)?;
            std::iter::once(v).chain(g).collect()
        }
        "jvp" => {
            let (out, t) = jvp_flat(apply, &inputs[..n], &inputs[n..])?;
            out.into_iter().chain(t).collect()
        }
        "vmap" => {
            let out_axes = case.params.get("out_axes").and_then(|j| j.as_i64()).unwrap() as i32;
            vmap_flat(apply, &axes_of(case, "in_axes"), &[out_axes])(&inputs)?
        }
        "vmap_grad" => {
            let axes = axes_of(case, "in_axes");
            let outs = vec![0; n];
            vmap_flat(grad_flat(loss, &all), &axes, &outs)(&inputs)?
        }
        "jvp_of_vjp" => {
            let (primals, cot, tans) = (&inputs[..n], inputs[n].clone(), &inputs[n + 1..]);
            let grads_of = move |xs: &[Array]| Ok(vjp_flat(apply, xs, std::slice::from_ref(&cot))?.1);
            jvp_flat(grads_of, primals, tans)?.1
        }
        "grad_grad" => {
            let inner = move |xs: &[Array]| Ok(grad_flat(move |ys: &[Array]| Ok(f(ys).sum(..)), &[0])(xs)?[0].sum(..));
            grad_flat(inner, &[0])(&inputs)?
        }
        other => panic!("unknown transform kind {other}"),
    })
}

#[test]
fn transforms_match_mlx() {
    let bytes = std::fs::read(FIXTURE).expect("fixture file");
    let fx = Fixture::parse(&bytes).expect("fixture parses");
    assert!(fx.cases.len() >= 100, "only {} cases", fx.cases.len());
    let tol = Tolerance::close(2e-4, 2e-5);
    let mut failures = Vec::new();
    for case in &fx.cases {
        let outs = match run(case) {
            Ok(o) => o,
            Err(e) => {
                failures.push(format!("{}: {e}", case.name));
                continue;
            }
        };
        if outs.len() != case.outputs.len() {
            failures.push(format!("{}: {} outputs, MLX {}", case.name, outs.len(), case.outputs.len()));
            continue;
        }
        for (i, (got, want)) in outs.iter().zip(&case.outputs).enumerate() {
            let bytes = match got.to_bytes() {
                Ok(b) => b,
                Err(e) => {
                    failures.push(format!("{} output {i}: {e}", case.name));
                    continue;
                }
            };
            if let Err(m) = compare(want, got.dtype(), got.shape(), &bytes, tol) {
                failures.push(format!("{} output {i}: {m}", case.name));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ from MLX:\n{}",
        failures.len(),
        fx.cases.len(),
        failures.join("\n")
    );
}
