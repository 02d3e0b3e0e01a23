//! Replays quantization recorded from real MLX (`scripts/mlx_fixtures_quant.py`, MLX 0.32.4
//! on the CPU): packed weights, scales and biases byte for byte for every mode, bit width,
//! group size and float dtype; dequantization exactly; `quantized_matmul` (both transposes)
//! and its gradients within tolerance.

use crate::fixture;

use fixture::{Case, Fixture, Tolerance, compare};
use nuvec::transforms::vjp_flat;
use nuvec::{Array, DType, Result, ops};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/quant.bin");

struct Params {
    mode: String,
    group_size: i32,
    bits: i32,
    transpose: bool,
    dtype: Option<DType>,
}

fn params(case: &Case) -> Params {
    let p = &case.params;
    let dtype = p.get("dtype").and_then(|d| d.as_str()).map(|d| match d {
        "float32" => DType::F32,
        "float16" => DType::F16,
        "bfloat16" => DType::BF16,
        other => panic!("unknown dtype {other}"),
    });
    Params {
        mode: p.get("mode").and_then(|m| m.as_str()).expect("mode").to_string(),
        group_size: p.get("group_size").and_then(|g| g.as_i64()).expect("group_size") as i32,
        bits: p.get("bits").and_then(|b| b.as_i64()).expect("bits") as i32,
        transpose: p.get("transpose").and_then(|t| t.as_bool()).unwrap_or(true),
        dtype,
    }
}

/// What [`run`] yields for a case: nuvec's outputs, each with the tolerance it must meet, and
/// the failures of checks made against a float64 reference.
type CaseRun = (Vec<(Array, Tolerance)>, Vec<String>);

/// nuvec's outputs for a case with the tolerance each must meet, and the failures of checks
/// made against a float64 reference.
fn run(case: &Case) -> Result<CaseRun> {
    let p = params(case);
    let x: Vec<Array> = case.inputs.iter().map(|t| t.to_array()).collect();
    let affine = p.mode == "affine";
    let mut extra = Vec::new();
    let outs = match case.op.as_str() {
        "quantize" => {
            let (wq, s, b) = ops::quantize(&x[0], p.group_size, p.bits, &p.mode);
            let deq = ops::dequantize(&wq, &s, b.as_ref(), p.group_size, p.bits, &p.mode, None);
            let mut outs = vec![(wq, Tolerance::BITWISE), (s, Tolerance::BITWISE)];
            outs.extend(b.map(|b| (b, Tolerance::BITWISE)));
            outs.push((deq, Tolerance::EXACT));
            outs
        }
        "dequantize" => {
            let biases = if affine { Some(&x[2]) } else { None };
            let deq = ops::dequantize(&x[0], &x[1], biases, p.group_size, p.bits, &p.mode, p.dtype);
            // Values, not bytes: NaN payloads (from 0 * inf) are not specified.
            vec![(deq, Tolerance::EXACT)]
        }
        "quantized_matmul" => {
            let biases = if affine { Some(&x[3]) } else { None };
            let y = ops::quantized_matmul(&x[0], &x[1], &x[2], biases, p.transpose, p.group_size, p.bits, &p.mode);
            let d = x[0].dtype();
            // nuvec accumulates in f32: close to a float64 product of the same dequantized
            // weights (whose bytes the quantize cases pin to MLX's).
            let deq = ops::dequantize(&x[1], &x[2], biases, p.group_size, p.bits, &p.mode, d).astype(DType::F64);
            let wt = if p.transpose { deq.swapaxes(-1, -2) } else { deq };
            let reference = x[0].astype(DType::F64).matmul(&wt).astype(d);
            let tight = match d {
                DType::F32 => Tolerance::close(1e-5, 1e-5),
                DType::F16 => Tolerance::close(2e-3, 2e-3),
                _ => Tolerance::close(1e-2, 1e-2),
            };
            let want = fixture::Tensor { dtype: d, shape: reference.shape().to_vec(), bytes: reference.to_bytes()? };
            if let Err(m) = compare(&want, y.dtype(), y.shape(), &y.to_bytes()?, tight) {
                // The GPU's decoding kernel applies scale and bias in float32 without rounding
                // each weight to the dtype first, as MLX's kernels do: close to the float64
                // product of the exact weights instead.
                let exact = if affine {
                    let (s, b) = (x[2].astype(DType::F64), x[3].astype(DType::F64));
                    let deq = ops::dequantize(&x[1], &s, Some(&b), p.group_size, p.bits, "affine", DType::F64);
                    let wt = if p.transpose { deq.swapaxes(-1, -2) } else { deq };
                    let r = x[0].astype(DType::F64).matmul(&wt).astype(d);
                    let want = fixture::Tensor { dtype: d, shape: r.shape().to_vec(), bytes: r.to_bytes()? };
                    compare(&want, y.dtype(), y.shape(), &y.to_bytes()?, tight).is_ok()
                } else {
                    false
                };
                if !exact {
                    extra.push(format!("{}: against the float64 reference: {m}", case.name));
                }
            }
            // MLX's fused CPU kernel rounds partial sums in half precision (its own error
            // against float64 reaches a few percent of the row's scale in bfloat16).
            let loose = match d {
                DType::F32 => Tolerance::close(1e-4, 1e-4),
                DType::F16 => Tolerance::close(3e-2, 5e-2),
                _ => Tolerance::close(0.2, 0.3),
            };
            vec![(y, loose)]
        }
        "qmm_vjp" => {
            let (wq, gs, bits, tr) = (x[1].clone(), p.group_size, p.bits, p.transpose);
            let f = move |a: &[Array]| {
                Ok(vec![ops::quantized_matmul(&a[0], &wq, &a[1], Some(&a[2]), tr, gs, bits, "affine")])
            };
            let (outs, grads) =
                vjp_flat(f, &x[..1].iter().chain([&x[2], &x[3]]).cloned().collect::<Vec<_>>(), &[x[4].clone()])?;
            let tol = Tolerance::close(1e-4, 1e-4);
            outs.into_iter().chain(grads).map(|a| (a, tol)).collect()
        }
        other => panic!("unknown op {other}"),
    };
    Ok((outs, extra))
}

#[test]
fn quantization_matches_mlx() {
    let bytes = std::fs::read(FIXTURE).expect("fixture file");
    let fx = Fixture::parse(&bytes).expect("fixture parses");
    assert!(fx.cases.len() >= 130, "only {} cases", fx.cases.len());
    let mut failures = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for case in &fx.cases {
        let p = params(case);
        seen.insert((case.op.clone(), p.mode.clone(), p.bits, p.group_size));
        let outs = match run(case) {
            Ok((o, extra)) => {
                failures.extend(extra);
                o
            }
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
    assert!(
        failures.is_empty(),
        "{} of {} cases differ from MLX:\n{}",
        failures.len(),
        fx.cases.len(),
        failures.join("\n")
    );
    // Every affine bit width with every group size was quantized, and every FP mode.
    for bits in [2, 3, 4, 5, 6, 8] {
        for gs in [32, 64, 128] {
            assert!(
                seen.contains(&("quantize".into(), "affine".into(), bits, gs)),
                "no case for bits {bits} group {gs}"
            );
        }
    }
    for mode in ["mxfp4", "mxfp8", "nvfp4"] {
        assert!(seen.iter().any(|(op, m, ..)| op == "quantize" && m == mode), "no case for {mode}");
    }
}
