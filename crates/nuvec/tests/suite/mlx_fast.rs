//! Replays MLX's fused operations recorded by `scripts/mlx_fixtures_fast.py` (MLX 0.32.4 on the
//! CPU): `mx.fast.rms_norm`, `layer_norm` and `rope` (halves and interleaved, partial rotation,
//! scalar and per-batch offsets, base or frequencies), the residual add + RMS norm, SwiGLU and
//! cross entropy — forward outputs and the gradients of every floating input, in float32,
//! float16 and bfloat16, on the default device (the GPU's kernels in a GPU run).

use crate::fixture;

use fixture::{Case, Fixture, Tolerance, compare};
use nuvec::transforms::vjp_flat;
use nuvec::{Array, DType, Result, fast};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/fast.bin");

/// MLX's own test tolerances (`test_fast.py`), as relative and absolute bounds, loosened for
/// gradients whose sums over rows round differently.
fn tolerance(d: DType, gradient: bool) -> Tolerance {
    let t = match d {
        DType::F32 => 2e-5,
        DType::F16 => 5e-3,
        _ => 3e-2,
    };
    if gradient { Tolerance::close(4.0 * t, 4.0 * t) } else { Tolerance::close(t, t) }
}

fn flag(case: &Case, key: &str) -> bool {
    case.params.get(key).and_then(|v| v.as_bool()).unwrap_or(false)
}

fn number(case: &Case, key: &str) -> Option<f64> {
    case.params.get(key).and_then(|v| v.as_f64())
}

/// The function a case recorded, over its floating inputs, and those inputs.
type Op = Box<dyn Fn(&[Array]) -> Vec<Array>>;

fn function(case: &Case, x: &[Array]) -> (Op, Vec<Array>, usize) {
    let eps = number(case, "eps").unwrap_or(1e-5) as f32;
    match case.op.as_str() {
        "rms_norm" => {
            let weighted = flag(case, "weight");
            let n = 1 + weighted as usize;
            (Box::new(move |a| vec![fast::rms_norm(&a[0], weighted.then(|| &a[1]), eps)]), x[..n].to_vec(), 1)
        }
        "layer_norm" => {
            let (weighted, biased) = (flag(case, "weight"), flag(case, "bias"));
            let n = 1 + weighted as usize + biased as usize;
            let f = move |a: &[Array]| {
                vec![fast::layer_norm(&a[0], weighted.then(|| &a[1]), biased.then(|| &a[a.len() - 1]), eps)]
            };
            (Box::new(f), x[..n].to_vec(), 1)
        }
        "add_rms_norm" => {
            let f = move |a: &[Array]| {
                let (h, y) = fast::add_rms_norm(&a[0], &a[1], &a[2], eps);
                vec![h, y]
            };
            (Box::new(f), x[..3].to_vec(), 2)
        }
        "swiglu" => (Box::new(|a| vec![fast::swiglu(&a[0], &a[1])]), x[..2].to_vec(), 1),
        "cross_entropy" => {
            let targets = x[1].clone();
            (Box::new(move |a| vec![fast::cross_entropy(&a[0], &targets)]), x[..1].to_vec(), 1)
        }
        "rope" => {
            let dims = number(case, "dims").expect("dims") as i32;
            let traditional = flag(case, "traditional");
            let base = number(case, "base").map(|b| b as f32);
            let scale = number(case, "scale").expect("scale") as f32;
            let mut next = 1;
            let offset = match number(case, "offset") {
                Some(o) => Array::from(o as i32),
                None => {
                    next += 1;
                    x[1].clone()
                }
            };
            let freqs = flag(case, "freqs").then(|| x[next].clone());
            let f = move |a: &[Array]| vec![fast::rope(&a[0], dims, traditional, base, scale, &offset, freqs.as_ref())];
            (Box::new(f), x[..1].to_vec(), 1)
        }
        other => panic!("unknown op {other}"),
    }
}

fn run(case: &Case) -> Result<Vec<(Array, Tolerance)>> {
    let x: Vec<Array> = case.inputs.iter().map(|t| t.to_array()).collect();
    let (f, primals, outputs) = function(case, &x);
    let cots = x[x.len() - outputs..].to_vec();
    let (outs, grads) = vjp_flat(move |a| Ok(f(a)), &primals, &cots)?;
    let d = primals[0].dtype();
    // The cross-entropy loss is float32 (MLX's recorded in float32 too).
    let fwd = outs.into_iter().map(|o| (o, tolerance(d, false)));
    Ok(fwd.chain(grads.into_iter().map(|g| (g, tolerance(d, true)))).collect())
}

#[test]
fn fast_ops_match_mlx() {
    let bytes = std::fs::read(FIXTURE).expect("fixture file");
    let fx = Fixture::parse(&bytes).expect("fixture parses");
    assert!(fx.cases.len() >= 150, "only {} cases", fx.cases.len());
    let mut failures = Vec::new();
    let mut ops = std::collections::BTreeSet::new();
    for case in &fx.cases {
        ops.insert(case.op.clone());
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
        for (i, ((got, tol), want)) in outs.iter().zip(&case.outputs).enumerate() {
            match got.to_bytes() {
                Ok(b) => {
                    if let Err(m) = compare(want, got.dtype(), got.shape(), &b, *tol) {
                        failures.push(format!("{} output {i}: {m}", case.name));
                    }
                }
                Err(e) => failures.push(format!("{} output {i}: {e}", case.name)),
            }
        }
    }
    let want: Vec<&str> = vec!["add_rms_norm", "cross_entropy", "layer_norm", "rms_norm", "rope", "swiglu"];
    assert_eq!(ops.iter().map(String::as_str).collect::<Vec<_>>(), want);
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
}
