//! Replays MLX's `mx.fast.scaled_dot_product_attention` recorded by
//! `scripts/mlx_fixtures_attention.py` (MLX 0.32.4 on the CPU): decoding and speculative rows,
//! prefill and continued prefill, multi-head, grouped-query and multi-query heads, head dims 32
//! to 128 and a value head dim other than the query's, no mask, the causal mask, boolean and
//! additive array masks that broadcast (one with a row masked out entirely), attention sinks and
//! sliding windows (recorded in MLX as the equivalent boolean mask) — forward outputs and, for a
//! third of the cases, the gradients of q, k and v, in float32, float16 and bfloat16, on the
//! default device. Every case runs twice: as is, and with the scores capped at one query row
//! (`max_score_bytes`), so that the blocked composition answers the same.

use crate::fixture;

use fixture::{Case, Fixture, Tolerance, compare};
use nuvec::fast::{self, AttentionOptions};
use nuvec::transforms::vjp_flat;
use nuvec::{Array, DType, Result};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/attention.bin");

/// Relative and absolute bounds at MLX's attention test tolerances (float32 1e-4, float16 5e-3,
/// bfloat16 3e-2), loosened for gradients whose sums over rows and heads round differently.
fn tolerance(d: DType, gradient: bool) -> Tolerance {
    let t = match d {
        DType::F32 => 1e-4,
        DType::F16 => 5e-3,
        _ => 3e-2,
    };
    if gradient { Tolerance::close(4.0 * t, 4.0 * t) } else { Tolerance::close(t, t) }
}

fn flag(case: &Case, key: &str) -> bool {
    case.params.get(key).and_then(|v| v.as_bool()).unwrap_or(false)
}

/// The options a case recorded, over its inputs `x` (q, k, v, [mask], [sinks], [cotangent]),
/// with the scores capped at `max_score_bytes` when given.
fn options<'a>(case: &Case, x: &'a [Array], max_score_bytes: Option<usize>) -> AttentionOptions<'a> {
    let mut next = 3;
    let mut o = match case.params.get("mask").and_then(|m| m.as_str()) {
        Some("none") => AttentionOptions::default(),
        Some("causal") => AttentionOptions::causal(),
        Some("window") => {
            let w = case.params.get("window").and_then(|w| w.as_i64()).expect("window") as i32;
            AttentionOptions::causal().window(w)
        }
        Some("array") => {
            next += 1;
            AttentionOptions::default().mask(&x[3])
        }
        other => panic!("{}: unknown mask {other:?}", case.name),
    };
    if flag(case, "sinks") {
        o = o.sinks(&x[next]);
    }
    if let Some(cap) = max_score_bytes {
        o = o.max_score_bytes(cap);
    }
    o
}

/// nuvec's outputs for a case (out, then dq, dk, dv with a gradient), each with its tolerance.
/// `capped` limits the scores to one query row across batch and heads: `B·Hq·Lk` float32s.
fn run(case: &Case, capped: bool) -> Result<Vec<(Array, Tolerance)>> {
    let x: Vec<Array> = case.inputs.iter().map(|t| t.to_array()).collect();
    let scale = case.params.get("scale").and_then(|s| s.as_f64()).expect("scale") as f32;
    let (q, k) = (x[0].shape(), x[1].shape());
    let row = q[0] as usize * q[1] as usize * k[2] as usize * 4;
    let opts = options(case, &x, capped.then_some(row));
    let d = x[0].dtype();
    let attend = |a: &[Array]| -> Array { fast::scaled_dot_product_attention(&a[0], &a[1], &a[2], scale, &opts) };
    if !flag(case, "grad") {
        return Ok(vec![(attend(&x[..3]), tolerance(d, false))]);
    }
    let (outs, grads) = vjp_flat(|a| Ok(vec![attend(a)]), &x[..3], &x[x.len() - 1..])?;
    let fwd = outs.into_iter().map(|o| (o, tolerance(d, false)));
    Ok(fwd.chain(grads.into_iter().map(|g| (g, tolerance(d, true)))).collect())
}

/// Replays every case (capped or not) and panics listing each mismatch.
fn replay(capped: bool) {
    let bytes = std::fs::read(FIXTURE).expect("fixture file");
    let fx = Fixture::parse(&bytes).expect("fixture parses");
    assert!(fx.cases.len() >= 70, "only {} cases", fx.cases.len());
    let suffix = if capped { " (scores capped at one row)" } else { "" };
    let mut failures = Vec::new();
    let mut masks = std::collections::BTreeSet::new();
    let (mut sinks, mut grads) = (0, 0);
    for case in &fx.cases {
        assert_eq!(case.op, "scaled_dot_product_attention", "{}", case.name);
        masks.insert(case.params.get("mask").and_then(|m| m.as_str()).unwrap_or("?").to_string());
        sinks += flag(case, "sinks") as usize;
        grads += flag(case, "grad") as usize;
        let outs = match run(case, capped) {
            Ok(o) => o,
            Err(e) => {
                failures.push(format!("{}{suffix}: {e}", case.name));
                continue;
            }
        };
        if outs.len() != case.outputs.len() {
            failures.push(format!("{}{suffix}: {} outputs, MLX {}", case.name, outs.len(), case.outputs.len()));
            continue;
        }
        for (i, ((got, tol), want)) in outs.iter().zip(&case.outputs).enumerate() {
            match got.to_bytes() {
                Ok(b) => {
                    if let Err(m) = compare(want, got.dtype(), got.shape(), &b, *tol) {
                        failures.push(format!("{}{suffix} output {i}: {m}", case.name));
                    }
                }
                Err(e) => failures.push(format!("{}{suffix} output {i}: {e}", case.name)),
            }
        }
    }
    assert_eq!(masks.iter().map(String::as_str).collect::<Vec<_>>(), vec!["array", "causal", "none", "window"]);
    assert!(sinks > 0 && grads > 0, "{sinks} cases with sinks, {grads} with gradients");
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn mlx_scaled_dot_product_attention() {
    replay(false);
}

#[test]
fn mlx_scaled_dot_product_attention_blocked() {
    replay(true);
}
