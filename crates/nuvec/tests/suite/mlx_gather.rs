//! Replays the gather, scatter and indexing fixtures recorded from MLX 0.32.4 on the CPU
//! (`scripts/mlx_fixtures_gather.py` -> `tests/fixtures/gather.bin`): `take`,
//! `take_along_axis`, `put_along_axis`, `gather_mm`, `x[index]` and `x.at[index].<op>(v)` /
//! `x[index] = v` over every index form. Integer results must match exactly; float results
//! within a few ulps (sums of repeated indices may add in another order).

use crate::fixture;

use fixture::{Case, Fixture, Json, Tolerance, compare};
use nuvec::{Array, DType, Index, ops};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gather.bin");

/// The replay must exercise at least this many cases (guards against a truncated recording).
const MIN_CASES: usize = 250;

fn axis(case: &Case) -> Option<i32> {
    case.params.get("axis").and_then(|a| a.as_i64()).map(|a| a as i32)
}

fn entries(index: &Json, arrays: &[Array]) -> Result<Vec<Index>, String> {
    let list = index.as_array().ok_or("index is not a list")?;
    list.iter()
        .map(|e| {
            if let Some(s) = e.as_str() {
                return match s {
                    "ellipsis" => Ok(Index::Ellipsis),
                    "newaxis" => Ok(Index::NewAxis),
                    other => Err(format!("unknown entry {other}")),
                };
            }
            if let Some(i) = e.get("int").and_then(|v| v.as_i64()) {
                return Ok(Index::Int(i));
            }
            if let Some(k) = e.get("array").and_then(|v| v.as_i64()) {
                return arrays.get(k as usize).cloned().map(Index::Array).ok_or("missing array input".into());
            }
            if let Some(s) = e.get("slice").and_then(|v| v.as_array()) {
                let part = |i: usize| s.get(i).and_then(|v| v.as_i64());
                return Ok(Index::Slice { start: part(0), stop: part(1), step: part(2).unwrap_or(1) });
            }
            Err(format!("bad entry in {index:?}"))
        })
        .collect()
}

fn run(case: &Case) -> Result<Array, String> {
    let xs: Vec<Array> = case.inputs.iter().map(|t| t.to_array()).collect();
    let op = case.op.as_str();
    Ok(match op {
        "take" => xs[0].take(&xs[1], axis(case)),
        "take_along_axis" => xs[0].take_along_axis(&xs[1], axis(case)),
        "put_along_axis" => xs[0].put_along_axis(&xs[1], &xs[2], axis(case)),
        "gather_mm" => {
            let flag = |k: &str| case.params.get(k).and_then(|v| v.as_bool()).unwrap_or(false);
            let mut k = 2;
            let lhs = flag("lhs").then(|| {
                k += 1;
                xs[k - 1].clone()
            });
            let rhs = flag("rhs").then(|| xs[k].clone());
            ops::gather_mm(&xs[0], &xs[1], lhs.as_ref(), rhs.as_ref(), false)
        }
        "index" => {
            let idx = entries(case.params.get("index").ok_or("no index")?, &xs[1..])?;
            xs[0].i(idx)
        }
        _ if op.starts_with("at_") => {
            let idx = entries(case.params.get("index").ok_or("no index")?, &xs[2..])?;
            let at = xs[0].at(idx);
            let v = &xs[1];
            match &op[3..] {
                "set" => at.set(v),
                "add" => at.add(v),
                "subtract" => at.subtract(v),
                "multiply" => at.multiply(v),
                "maximum" => at.maximum(v),
                "minimum" => at.minimum(v),
                other => return Err(format!("unknown update {other}")),
            }
        }
        other => return Err(format!("unknown op {other}")),
    })
}

fn tolerance(case: &Case, dtype: DType) -> Tolerance {
    let exactish = matches!(case.op.as_str(), "take" | "take_along_axis" | "put_along_axis" | "index" | "at_set");
    if exactish || !dtype.is_inexact() {
        return Tolerance::EXACT;
    }
    let eps = match dtype {
        DType::F16 => 1e-3,
        DType::BF16 => 8e-3,
        _ => 1e-5,
    };
    Tolerance { rtol: eps, atol: eps, bitwise: false }
}

#[test]
fn replays_mlx_gather_fixtures() {
    let bytes = std::fs::read(FIXTURE).unwrap_or_else(|e| panic!("reading {FIXTURE}: {e}"));
    let fx = Fixture::parse(&bytes).unwrap_or_else(|e| panic!("parsing {FIXTURE}: {e}"));
    assert!(fx.cases.len() >= MIN_CASES, "only {} cases", fx.cases.len());
    let mut failures = Vec::new();
    let mut ops_seen = std::collections::BTreeSet::new();
    for case in &fx.cases {
        ops_seen.insert(case.op.clone());
        let want = &case.outputs[0];
        let result = run(case).and_then(|got| {
            let bytes = got.to_bytes().map_err(|e| format!("nuvec error: {e}"))?;
            compare(want, got.dtype(), got.shape(), &bytes, tolerance(case, want.dtype)).map_err(|m| m.to_string())
        });
        if let Err(e) = result {
            failures.push(format!("{} ({}): {e}", case.name, case.params_text));
        }
    }
    for op in ["take", "take_along_axis", "put_along_axis", "gather_mm", "index", "at_set", "at_add", "at_multiply"] {
        assert!(ops_seen.contains(op), "no case of {op}");
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ from MLX:\n{}",
        failures.len(),
        fx.cases.len(),
        failures.join("\n")
    );
}
