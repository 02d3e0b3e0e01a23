//! Replays golden fixtures of convolutions and tensor contractions recorded from real MLX
//! (`scripts/mlx_fixtures_conv.py`, MLX 0.32.4 on the CPU): conv1d/conv2d/conv3d/conv_general
//! over strides, padding, dilations, groups (depthwise included) and dtypes; einsum over many
//! subscripts; tensordot, outer and inner. Dtypes and shapes must match exactly, values within
//! tolerances that grow with the length of each sum.
//!
//! Regenerate with `python3 scripts/mlx_fixtures_conv.py`; run with
//! `cargo test -p nuvec --release --test suite -- mlx_conv::`.

use crate::fixture;

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;

use fixture::{Case, Fixture, Json, Tensor, Tolerance, compare};
use nuvec::ops::{self, ConvOptions, TensordotAxes};
use nuvec::{Array, DType};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/conv.bin");

/// The replay must exercise at least this many cases (guards against a truncated recording).
const MIN_CASES: usize = 150;

fn fixture() -> &'static Fixture {
    static DATA: OnceLock<Fixture> = OnceLock::new();
    DATA.get_or_init(|| {
        let bytes = std::fs::read(FIXTURE).unwrap_or_else(|e| panic!("reading {FIXTURE}: {e}"));
        Fixture::parse(&bytes).unwrap_or_else(|e| panic!("parsing {FIXTURE}: {e}"))
    })
}

fn list(case: &Case, key: &str) -> Result<Vec<i32>, String> {
    case.params.get(key).and_then(Json::as_i32_vec).ok_or_else(|| format!("param {key:?} is not a list of integers"))
}

fn int(case: &Case, key: &str) -> Result<i32, String> {
    case.params
        .get(key)
        .and_then(Json::as_i64)
        .map(|v| v as i32)
        .ok_or_else(|| format!("param {key:?} is not an integer"))
}

fn run(case: &Case, xs: &[Array]) -> Result<Array, String> {
    let p = |k: &str| list(case, k);
    Ok(match case.op.as_str() {
        "conv1d" => {
            ops::conv1d(&xs[0], &xs[1], p("stride")?[0], p("padding")?[0], p("dilation")?[0], int(case, "groups")?)
        }
        "conv2d" => {
            let two =
                |k: &str| -> Result<[i32; 2], String> { p(k)?.try_into().map_err(|_| format!("{k} needs 2 values")) };
            ops::conv2d(&xs[0], &xs[1], two("stride")?, two("padding")?, two("dilation")?, int(case, "groups")?)
        }
        "conv3d" => {
            let three =
                |k: &str| -> Result<[i32; 3], String> { p(k)?.try_into().map_err(|_| format!("{k} needs 3 values")) };
            ops::conv3d(&xs[0], &xs[1], three("stride")?, three("padding")?, three("dilation")?, int(case, "groups")?)
        }
        "conv_general" => {
            let opts = ConvOptions {
                stride: p("stride")?,
                padding_lo: p("padding_lo")?,
                padding_hi: p("padding_hi")?,
                kernel_dilation: p("kernel_dilation")?,
                input_dilation: p("input_dilation")?,
                groups: int(case, "groups")?,
                flip: case.params.get("flip").and_then(Json::as_bool).ok_or("param \"flip\" is not a boolean")?,
            };
            ops::conv_general(&xs[0], &xs[1], &opts)
        }
        "einsum" => {
            let s =
                case.params.get("subscripts").and_then(Json::as_str).ok_or("param \"subscripts\" is not a string")?;
            ops::einsum(s, xs)
        }
        "tensordot" => {
            let axes = case.params.get("axes").ok_or("missing param \"axes\"")?;
            let axes = match axes.as_i64() {
                Some(n) => TensordotAxes::Count(n as i32),
                None => {
                    let pair = axes.as_array().filter(|a| a.len() == 2).ok_or("bad axes")?;
                    let l = |j: &Json| j.as_i32_vec().ok_or("bad axes");
                    TensordotAxes::Pairs(l(&pair[0])?, l(&pair[1])?)
                }
            };
            ops::tensordot(&xs[0], &xs[1], axes)
        }
        "outer" => ops::outer(&xs[0], &xs[1]),
        "inner" => ops::inner(&xs[0], &xs[1]),
        other => return Err(format!("no nuvec call for MLX op {other:?}")),
    })
}

fn max_abs(t: &Tensor) -> f64 {
    t.to_f64().into_iter().filter(|v| v.is_finite()).fold(0.0, |m, v| m.max(v.abs()))
}

/// Terms summed into each output element, for the tolerance.
fn terms(case: &Case) -> f64 {
    let input_size: usize = case.inputs.iter().map(Tensor::size).product();
    let out = case.outputs[0].size().max(1);
    match case.op.as_str() {
        // Each output sums K·C_in/groups products.
        op if op.starts_with("conv") => {
            let w = &case.inputs[1].shape;
            w[1..].iter().map(|&d| d as f64).product()
        }
        "outer" => 1.0,
        _ => (input_size as f64 / out as f64).max(1.0),
    }
}

fn tolerance(case: &Case, out: &Tensor) -> Tolerance {
    // MLX 0.32.4's CPU convolution computes float64 in float32 (its answers are float32
    // values), while nuvec computes float64 properly (checked against direct loops in
    // tests/conv_einsum.rs): float64 convolutions get float32's tolerance.
    let dtype = if out.dtype == DType::F64 && case.op.starts_with("conv") { DType::F32 } else { out.dtype };
    let (rtol, atol) = match dtype {
        DType::F64 => (1e-12, 1e-13),
        DType::F16 => (1e-3, 1e-3),
        DType::BF16 => (1e-2, 1e-2),
        _ => (1e-5, 1e-6),
    };
    let magnitude: f64 = case.inputs.iter().map(max_abs).take(2).product();
    let root_n = terms(case).sqrt();
    Tolerance::close(rtol * 10.0 * root_n, atol * 10.0 + rtol * 2.0 * magnitude * root_n)
}

fn check_case(case: &Case) -> Result<(), String> {
    let xs: Vec<Array> = case.inputs.iter().map(Tensor::to_array).collect();
    let got = run(case, &xs)?;
    let want = &case.outputs[0];
    let bytes = got.to_bytes().map_err(|e| format!("nuvec error: {e}"))?;
    compare(want, got.dtype(), got.shape(), &bytes, tolerance(case, want)).map_err(|m| m.to_string())
}

#[test]
fn fixture_file_is_complete() {
    let f = fixture();
    assert!(f.cases.len() >= MIN_CASES, "the fixture holds {} cases, fewer than {MIN_CASES}", f.cases.len());
    assert_eq!(f.meta.get("device").and_then(Json::as_str), Some("cpu"));
    let mut per_op: BTreeMap<&str, usize> = BTreeMap::new();
    for c in &f.cases {
        *per_op.entry(c.op.as_str()).or_default() += 1;
        assert_eq!(c.outputs.len(), 1, "{}", c.name);
    }
    for op in ["conv1d", "conv2d", "conv3d", "conv_general", "einsum", "tensordot", "outer", "inner"] {
        assert!(per_op.get(op).copied().unwrap_or(0) > 0, "no cases of {op}: {per_op:?}");
    }
}

#[test]
fn nuvec_matches_mlx() {
    let f = fixture();
    let failures: Vec<String> = f
        .cases
        .iter()
        .filter_map(|case| {
            let r = catch_unwind(AssertUnwindSafe(|| check_case(case))).unwrap_or_else(|_| Err("panicked".to_string()));
            r.err().map(|e| format!("  {} [{}]: {e}", case.name, case.params_text))
        })
        .collect();
    eprintln!("replayed {} MLX cases, {} differ", f.cases.len(), failures.len());
    assert!(failures.is_empty(), "{} case(s) differ from MLX:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn tolerance_catches_a_wrong_tap() {
    // The replay must notice a kernel that drops one tap: perturb the weight of a recorded
    // conv1d case and check the comparison fails.
    let case = fixture()
        .cases
        .iter()
        .find(|c| c.op == "conv1d" && c.inputs[0].dtype == DType::F32)
        .expect("a float32 conv1d case");
    let xs: Vec<Array> = case.inputs.iter().map(Tensor::to_array).collect();
    let w = &xs[1];
    let mut mask = vec![1.0f32; w.size()];
    mask[0] = 0.0;
    let broken = vec![xs[0].clone(), w * Array::from_slice(&mask, w.shape())];
    let got = run(case, &broken).unwrap();
    let bytes = got.to_bytes().unwrap();
    let want = &case.outputs[0];
    assert!(compare(want, got.dtype(), got.shape(), &bytes, tolerance(case, want)).is_err());
}
