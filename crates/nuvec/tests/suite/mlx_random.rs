//! Replays random numbers recorded from real MLX (`scripts/mlx_fixtures_random.py`, MLX 0.32.4
//! on the CPU) for fixed keys: keys, splits and raw bits must be bit-identical; so must every
//! integer and boolean result (randint, bernoulli, categorical) and uniform samples, which MLX
//! computes with exactly rounded operations only. Distributions that go through `erfinv`,
//! `erf` or `log` match within a few units in the last place of their dtype.

use crate::fixture;

use fixture::{Case, Fixture, Json, Tolerance, compare};
use nuvec::transforms::vmap_flat;
use nuvec::{Array, DType, Result, ScalarOrArray, random};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/random.bin");

fn dtype(name: &str) -> DType {
    match name {
        "float32" => DType::F32,
        "float16" => DType::F16,
        "bfloat16" => DType::BF16,
        "float64" => DType::F64,
        "complex64" => DType::Complex64,
        "int32" => DType::I32,
        "int64" => DType::I64,
        "int8" => DType::I8,
        "uint8" => DType::U8,
        "uint32" => DType::U32,
        "bool" => DType::Bool,
        other => panic!("unknown dtype {other}"),
    }
}

fn param<'a>(case: &'a Case, name: &str) -> &'a Json {
    case.params.get(name).unwrap_or_else(|| panic!("{}: no parameter {name}", case.name))
}

fn shape(case: &Case) -> Vec<i32> {
    param(case, "shape").as_i32_vec().expect("shape")
}

fn opt_shape(case: &Case) -> Option<Vec<i32>> {
    let s = param(case, "shape");
    if s.is_null() { None } else { s.as_i32_vec() }
}

fn dt(case: &Case) -> DType {
    dtype(param(case, "dtype").as_str().expect("dtype"))
}

/// An argument as MLX's Python binding received it: a scalar, an input array, or absent.
fn arg(case: &Case, name: &str) -> Option<ScalarOrArray> {
    let p = param(case, name);
    if p.is_null() {
        return None;
    }
    if let Some(i) = p.get("input").and_then(Json::as_i64) {
        return Some(case.inputs[i as usize].to_array().into());
    }
    if let Some(i) = p.get("int").and_then(Json::as_i64) {
        return Some((i as i32).into());
    }
    let f = p.get("float").and_then(Json::as_f64).expect("scalar");
    Some(f.into())
}

fn seed(case: &Case) -> u64 {
    param(case, "seed").as_str().and_then(|s| s.parse().ok()).expect("seed")
}

fn run(case: &Case) -> Result<Vec<Array>> {
    let key = case.inputs.first().map(|t| t.to_array());
    let k = key.as_ref();
    let out = match case.op.as_str() {
        "key" => random::key(seed(case)),
        "split" => random::split(k.unwrap(), param(case, "num").as_i64().unwrap() as i32),
        "bits" => random::bits(shape(case), param(case, "width").as_i64().unwrap() as i32, k),
        "uniform" => random::uniform(arg(case, "low").unwrap(), arg(case, "high").unwrap(), shape(case), dt(case), k),
        "normal" => random::normal(
            shape(case),
            dt(case),
            arg(case, "loc").unwrap_or(0.0.into()),
            arg(case, "scale").unwrap_or(1.0.into()),
            k,
        ),
        "randint" => random::randint(arg(case, "low").unwrap(), arg(case, "high").unwrap(), shape(case), dt(case), k),
        "bernoulli" => {
            let s = opt_shape(case);
            random::bernoulli(arg(case, "p").unwrap(), s.as_deref(), k)
        }
        "truncated_normal" => {
            let s = opt_shape(case);
            random::truncated_normal(
                arg(case, "lower").unwrap(),
                arg(case, "upper").unwrap(),
                s.as_deref(),
                dt(case),
                k,
            )
        }
        "gumbel" => random::gumbel(shape(case), dt(case), k),
        "laplace" => random::laplace(
            shape(case),
            dt(case),
            param(case, "loc").as_f64().unwrap() as f32,
            param(case, "scale").as_f64().unwrap() as f32,
            k,
        ),
        "categorical" => {
            let logits = case.inputs[1].to_array();
            let axis = param(case, "axis").as_i64().unwrap() as i32;
            match (opt_shape(case), param(case, "num_samples").as_i64()) {
                (Some(s), _) => random::categorical_shape(&logits, axis, &s, k),
                (None, Some(n)) => random::categorical_samples(&logits, axis, n as i32, k),
                (None, None) => random::categorical(&logits, axis, k),
            }
        }
        "permutation" => random::permutation(param(case, "n").as_i64().unwrap() as i32, k),
        "permutation_of" => {
            random::permutation_of(&case.inputs[1].to_array(), param(case, "axis").as_i64().unwrap() as i32, k)
        }
        "vmap_uniform" => {
            let s = shape(case);
            let axis = param(case, "in_axis").as_i64().unwrap() as i32;
            let in_axes = [Some(axis)];
            let f = vmap_flat(
                move |x: &[Array]| Ok(vec![random::uniform(0.0, 1.0, &s, DType::F32, Some(&x[0]))]),
                &in_axes,
                &[0],
            );
            return f(&[k.unwrap().clone()]);
        }
        "sequence" => {
            random::seed(seed(case));
            return Ok(vec![
                random::uniform(0.0, 1.0, [5], DType::F32, None),
                random::normal([3], DType::F32, 0.0, 1.0, None),
                random::randint(0, 100, [4], DType::I32, None),
                random::categorical(&nuvec::array![[0.0f32, 1.0, 2.0]], -1, None),
            ]);
        }
        other => panic!("{}: unknown op {other}", case.name),
    };
    Ok(vec![out])
}

/// MLX's tolerance for each output: exact where MLX's computation is exactly rounded, else a
/// few units in the last place of the dtype.
fn tolerance(case: &Case, out: DType) -> Tolerance {
    match case.op.as_str() {
        "normal" | "truncated_normal" | "gumbel" | "laplace" | "sequence" => match out {
            DType::F16 => Tolerance::close(2e-3, 2e-3),
            DType::BF16 => Tolerance::close(1.6e-2, 1.6e-2),
            _ => Tolerance::close(2e-5, 2e-6),
        },
        _ => Tolerance::EXACT,
    }
}

#[test]
fn random_numbers_match_mlx() {
    let bytes = std::fs::read(FIXTURE).expect("fixture file");
    let fx = Fixture::parse(&bytes).expect("fixture parses");
    assert!(fx.cases.len() >= 400, "only {} cases", fx.cases.len());
    let mut failures = Vec::new();
    let mut per_op = std::collections::BTreeMap::<&str, usize>::new();
    for case in &fx.cases {
        *per_op.entry(case.op.as_str()).or_default() += 1;
        let outs = match run(case) {
            Ok(o) => o,
            Err(e) => {
                failures.push(format!("{}: {e}", case.name));
                continue;
            }
        };
        assert_eq!(outs.len(), case.outputs.len(), "{}: output count", case.name);
        for (i, (got, want)) in outs.iter().zip(&case.outputs).enumerate() {
            let bytes = match got.to_bytes() {
                Ok(b) => b,
                Err(e) => {
                    failures.push(format!("{} output {i}: {e}", case.name));
                    continue;
                }
            };
            let tol = tolerance(case, got.dtype());
            if let Err(m) = compare(want, got.dtype(), got.shape(), &bytes, tol) {
                failures.push(format!("{} output {i}: {m}", case.name));
            }
        }
    }
    println!("{per_op:?}");
    assert!(
        failures.is_empty(),
        "{} of {} cases differ from MLX:\n{}",
        failures.len(),
        fx.cases.len(),
        failures.join("\n")
    );
}

/// A single flipped bit in a recorded output must be caught (the comparison is not vacuous).
#[test]
fn a_flipped_bit_is_detected() {
    let bytes = std::fs::read(FIXTURE).expect("fixture file");
    let fx = Fixture::parse(&bytes).expect("fixture parses");
    for name in ["bits/w1/k1_13", "uniform/f32/k0_7", "split/u32/k1_n3"] {
        let case = fx.cases.iter().find(|c| c.name == name).expect(name);
        let got = run(case).unwrap().remove(0);
        let mut b = got.to_bytes().unwrap();
        let tol = tolerance(case, got.dtype());
        compare(&case.outputs[0], got.dtype(), got.shape(), &b, tol).unwrap();
        b[3] ^= 1;
        assert!(compare(&case.outputs[0], got.dtype(), got.shape(), &b, tol).is_err(), "{name}");
    }
}
