//! Replays golden fixtures recorded from real MLX (`scripts/mlx_fixtures.py`, MLX 0.32.4 on the
//! CPU) through nuvec and compares every output: dtypes, shapes and integer/boolean values
//! exactly, floating-point values within MLX-like tolerances per dtype and operation.
//!
//! Regenerate the fixtures with `python3 scripts/mlx_fixtures.py`; run this replay with
//! `cargo test -p nuvec --release --test suite -- mlx_fixtures::`. No Python runs at test time.
//!
//! Cases where nuvec is known to disagree with MLX are listed in [`KNOWN_DIFFERENCES`], each
//! with the reason; the test fails on any other disagreement, and on a listed case that now
//! agrees (so the list shrinks as nuvec is fixed).

use crate::fixture;

use std::collections::{BTreeMap, HashSet};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;

use fixture::{Case, Fixture, Json, Tensor, Tolerance, compare};
use nuvec::{Array, DType, Scalar, ScalarOrArray, ScanOptions, ops};

/// The fixture file, relative to this crate.
const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/core_ops.bin");

/// The replay must exercise at least this many cases (guards against a truncated recording).
const MIN_CASES: usize = 300;

// Reasons shared by several known differences (paths as of the recording; see the entries).
const ARANGE_ACCUMULATES: &str = "MLX's arange accumulates `start += step` in the output dtype; nuvec \
    rounds start + i*step computed in f64 (nuvec-cpu/src/copy.rs arange): nuvec is more accurate";

/// Cases where nuvec disagrees with MLX 0.32.4, as `(case name, reason)`: bugs or deliberate
/// differences to decide on in nuvec. Delete an entry once its case agrees (the test says so).
const KNOWN_DIFFERENCES: &[(&str, &str)] =
    &[("arange/bf16/0.0_3.0_0.1", ARANGE_ACCUMULATES), ("arange/f16/0.0_2.0_0.1", ARANGE_ACCUMULATES)];

fn fixture() -> &'static Fixture {
    static FIXTURE_DATA: OnceLock<Fixture> = OnceLock::new();
    FIXTURE_DATA.get_or_init(|| {
        let bytes = std::fs::read(FIXTURE).unwrap_or_else(|e| panic!("reading {FIXTURE}: {e}"));
        Fixture::parse(&bytes).unwrap_or_else(|e| panic!("parsing {FIXTURE}: {e}"))
    })
}

// ---------------------------------------------------------------------------------------------
// Parameters

fn param<'a>(case: &'a Case, key: &str) -> Result<&'a Json, String> {
    case.params.get(key).ok_or_else(|| format!("missing param {key:?}"))
}

fn int_param(case: &Case, key: &str) -> Result<i32, String> {
    param(case, key)?.as_i64().map(|v| v as i32).ok_or_else(|| format!("param {key:?} is not an integer"))
}

fn bool_param(case: &Case, key: &str) -> Result<bool, String> {
    param(case, key)?.as_bool().ok_or_else(|| format!("param {key:?} is not a boolean"))
}

fn f64_param(case: &Case, key: &str) -> Result<f64, String> {
    param(case, key)?.as_f64().ok_or_else(|| format!("param {key:?} is not a number"))
}

fn list_param(case: &Case, key: &str) -> Result<Vec<i32>, String> {
    param(case, key)?.as_i32_vec().ok_or_else(|| format!("param {key:?} is not a list of integers"))
}

/// An optional integer (`null` means "none", e.g. `axis=None`).
fn opt_int_param(case: &Case, key: &str) -> Result<Option<i32>, String> {
    let v = param(case, key)?;
    if v.is_null() { Ok(None) } else { int_param(case, key).map(Some) }
}

/// An optional list of integers (`null` means "all axes").
fn opt_list_param(case: &Case, key: &str) -> Result<Option<Vec<i32>>, String> {
    let v = param(case, key)?;
    if v.is_null() { Ok(None) } else { list_param(case, key).map(Some) }
}

fn dtype_named(name: &str) -> Result<DType, String> {
    DType::ALL.into_iter().find(|d| d.name() == name).ok_or_else(|| format!("unknown dtype {name:?}"))
}

fn dtype_param(case: &Case, key: &str) -> Result<Option<DType>, String> {
    match param(case, key)? {
        Json::Null => Ok(None),
        Json::Str(s) => dtype_named(s).map(Some),
        other => Err(format!("param {key:?} is not a dtype: {other}")),
    }
}

/// A JSON number or boolean as a weak scalar of the same kind (Python's `1`, `1.0`, `True`).
fn scalar_of(v: &Json) -> Result<Scalar, String> {
    match *v {
        Json::Int(i) => Ok(Scalar::Int(i)),
        Json::Float(f) => Ok(Scalar::Float(f)),
        Json::Bool(b) => Ok(Scalar::Bool(b)),
        ref other => Err(format!("not a scalar: {other}")),
    }
}

// ---------------------------------------------------------------------------------------------
// Layouts: the recipes the recorder applied to the stored inputs

fn apply_layout(x: Array, recipe: &Json) -> Result<Array, String> {
    let steps = recipe.as_array().ok_or_else(|| format!("bad layout {recipe}"))?;
    let list = |i: usize| -> Result<Vec<i32>, String> {
        steps.get(i).and_then(Json::as_i32_vec).ok_or_else(|| format!("bad layout {recipe}"))
    };
    match steps.first().and_then(Json::as_str) {
        Some("transpose") => Ok(x.transpose(&list(1)?)),
        Some("slice") => Ok(x.slice(&list(1)?, &list(2)?, &list(3)?)),
        Some("broadcast") => Ok(x.broadcast_to(list(1)?)),
        _ => Err(format!("unknown layout {recipe}")),
    }
}

/// The case's inputs as nuvec arrays, with their layout recipes applied.
fn inputs(case: &Case) -> Result<Vec<Array>, String> {
    let mut xs: Vec<Array> = case.inputs.iter().map(Tensor::to_array).collect();
    if let Some(recipe) = case.params.get("layout") {
        xs[0] = apply_layout(xs[0].clone(), recipe)?;
    }
    if let Some(list) = case.params.get("layouts") {
        for (i, recipe) in list.as_array().ok_or("bad layouts")?.iter().enumerate() {
            if !recipe.is_null() {
                xs[i] = apply_layout(xs[i].clone(), recipe)?;
            }
        }
    }
    Ok(xs)
}

// ---------------------------------------------------------------------------------------------
// Operations: MLX name + params -> the nuvec call

/// The nuvec method for a unary MLX operation.
fn unary_fn(op: &str) -> Option<fn(&Array) -> Array> {
    Some(match op {
        "abs" => Array::abs,
        "sign" => Array::sign,
        "negative" => Array::negative,
        "exp" => Array::exp,
        "expm1" => Array::expm1,
        "log" => Array::log,
        "log1p" => Array::log1p,
        "log2" => Array::log2,
        "log10" => Array::log10,
        "sqrt" => Array::sqrt,
        "rsqrt" => Array::rsqrt,
        "square" => Array::square,
        "reciprocal" => Array::reciprocal,
        "sin" => Array::sin,
        "cos" => Array::cos,
        "tan" => Array::tan,
        "arcsin" => Array::arcsin,
        "arccos" => Array::arccos,
        "arctan" => Array::arctan,
        "sinh" => Array::sinh,
        "cosh" => Array::cosh,
        "tanh" => Array::tanh,
        "arcsinh" => Array::arcsinh,
        "arccosh" => Array::arccosh,
        "arctanh" => Array::arctanh,
        "sigmoid" => Array::sigmoid,
        "erf" => Array::erf,
        "erfinv" => Array::erfinv,
        "floor" => Array::floor,
        "ceil" => Array::ceil,
        "round" => Array::round,
        "isnan" => Array::isnan,
        "isinf" => Array::isinf,
        "isfinite" => Array::isfinite,
        "logical_not" => Array::logical_not,
        "bitwise_invert" => Array::bitwise_invert,
        "conjugate" => Array::conjugate,
        "isposinf" => Array::isposinf,
        "isneginf" => Array::isneginf,
        _ => return None,
    })
}

/// The nuvec function for a binary MLX operation (operands are arrays or weak scalars).
fn binary_fn(op: &str) -> Option<fn(ScalarOrArray, ScalarOrArray) -> Array> {
    Some(match op {
        "add" => ops::add,
        "subtract" => ops::subtract,
        "multiply" => ops::multiply,
        "divide" => ops::divide,
        "floor_divide" => ops::floor_divide,
        "remainder" => ops::remainder,
        "power" => ops::power,
        "maximum" => ops::maximum,
        "minimum" => ops::minimum,
        "logaddexp" => ops::logaddexp,
        "arctan2" => ops::arctan2,
        "equal" => ops::equal,
        "not_equal" => ops::not_equal,
        "less" => ops::less,
        "less_equal" => ops::less_equal,
        "greater" => ops::greater,
        "greater_equal" => ops::greater_equal,
        "logical_and" => ops::logical_and,
        "logical_or" => ops::logical_or,
        "bitwise_and" => ops::bitwise_and,
        "bitwise_or" => ops::bitwise_or,
        "bitwise_xor" => ops::bitwise_xor,
        "left_shift" => ops::left_shift,
        "right_shift" => ops::right_shift,
        _ => return None,
    })
}

/// Calls a reduction taking `impl Axes`: MLX's `axis=None` is nuvec's `..`.
macro_rules! over_axes {
    ($axes:expr, |$a:ident| $call:expr) => {
        match $axes {
            None => {
                let $a = ..;
                $call
            }
            Some(list) => {
                let $a = list;
                $call
            }
        }
    };
}

fn reduction(case: &Case, x: &Array) -> Result<Option<Array>, String> {
    let axes = || opt_list_param(case, "axes");
    let keep = || bool_param(case, "keepdims");
    Ok(Some(match case.op.as_str() {
        "sum" => over_axes!(axes()?, |a| ops::sum(x, a, keep()?)),
        "prod" => over_axes!(axes()?, |a| ops::prod(x, a, keep()?)),
        "max" => over_axes!(axes()?, |a| ops::max(x, a, keep()?)),
        "min" => over_axes!(axes()?, |a| ops::min(x, a, keep()?)),
        "mean" => over_axes!(axes()?, |a| ops::mean(x, a, keep()?)),
        "all" => over_axes!(axes()?, |a| ops::all(x, a, keep()?)),
        "any" => over_axes!(axes()?, |a| ops::any(x, a, keep()?)),
        "logsumexp" => over_axes!(axes()?, |a| ops::logsumexp(x, a, keep()?)),
        "var" => over_axes!(axes()?, |a| ops::var(x, a, keep()?, int_param(case, "ddof")?)),
        "std" => over_axes!(axes()?, |a| ops::std(x, a, keep()?, int_param(case, "ddof")?)),
        "softmax" => over_axes!(axes()?, |a| ops::softmax(x, a)),
        _ => return Ok(None),
    }))
}

fn scan(case: &Case, x: &Array) -> Result<Option<Array>, String> {
    let axis = || opt_int_param(case, "axis");
    let options = || -> Result<ScanOptions, String> {
        Ok(ScanOptions { reverse: bool_param(case, "reverse")?, exclusive: !bool_param(case, "inclusive")? })
    };
    Ok(Some(match case.op.as_str() {
        "cumsum" => ops::cumsum(x, axis()?, options()?),
        "cumprod" => ops::cumprod(x, axis()?, options()?),
        "cummax" => ops::cummax(x, axis()?, options()?),
        "cummin" => ops::cummin(x, axis()?, options()?),
        "logcumsumexp" => ops::logcumsumexp(x, axis()?, options()?),
        _ => return Ok(None),
    }))
}

/// Runs the case's operation in nuvec on `xs`, the inputs with their layouts applied.
fn run(case: &Case, xs: &[Array]) -> Result<Vec<Array>, String> {
    let x = || xs.first().cloned().ok_or_else(|| "the case has no input".to_string());
    let op = case.op.as_str();
    if op == "round" && case.params.get("decimals").is_some() {
        return Ok(vec![x()?.round_decimals(int_param(case, "decimals")?)]);
    }
    if let (Some(f), Some(x0)) = (unary_fn(op), xs.first()) {
        return Ok(vec![f(x0)]);
    }
    if let Some(f) = binary_fn(op) {
        let (a, b): (ScalarOrArray, ScalarOrArray) = match case.params.get("scalar") {
            Some(s) => {
                let s = ScalarOrArray::Scalar(scalar_of(s)?);
                let a = ScalarOrArray::Array(x()?);
                if bool_param(case, "scalar_first")? { (s, a) } else { (a, s) }
            }
            None => (x()?.into(), xs.get(1).ok_or("binary op needs two inputs")?.into()),
        };
        return Ok(vec![f(a, b)]);
    }
    if !xs.is_empty() {
        if let Some(y) = reduction(case, &xs[0])? {
            return Ok(vec![y]);
        }
        if let Some(y) = scan(case, &xs[0])? {
            return Ok(vec![y]);
        }
    }
    let dtype = || dtype_param(case, "dtype")?.ok_or_else(|| "dtype is null".to_string());
    let y = match op {
        "where" => {
            let mut rest = xs[1..].iter();
            let mut operand = |key: &str| -> Result<ScalarOrArray, String> {
                match case.params.get(key) {
                    Some(s) => Ok(ScalarOrArray::Scalar(scalar_of(s)?)),
                    None => Ok(rest.next().ok_or("where needs more inputs")?.into()),
                }
            };
            let (a, b) = (operand("x_scalar")?, operand("y_scalar")?);
            ops::where_(&xs[0], a, b)
        }
        "clip" => {
            let mut rest = xs[1..].iter();
            let mut bound = |key: &str| -> Result<Option<ScalarOrArray>, String> {
                match param(case, key)? {
                    Json::Null => Ok(None),
                    Json::Str(s) if s == "input" => Ok(Some(rest.next().ok_or("clip needs more inputs")?.into())),
                    v => Ok(Some(ScalarOrArray::Scalar(scalar_of(v)?))),
                }
            };
            match (bound("a_min")?, bound("a_max")?) {
                (Some(lo), Some(hi)) => xs[0].clip(lo, hi),
                (Some(lo), None) => xs[0].clip_min(lo),
                (None, Some(hi)) => xs[0].clip_max(hi),
                (None, None) => return Err("clip without bounds".into()),
            }
        }
        "astype" => x()?.astype(dtype()?),
        "view" => x()?.view(dtype()?),
        "argmax" => ops::argmax(&x()?, opt_int_param(case, "axis")?, bool_param(case, "keepdims")?),
        "argmin" => ops::argmin(&x()?, opt_int_param(case, "axis")?, bool_param(case, "keepdims")?),
        "reshape" => x()?.reshape(list_param(case, "shape")?),
        "flatten" => x()?.flatten(int_param(case, "start_axis")?, int_param(case, "end_axis")?),
        "transpose" => match opt_list_param(case, "axes")? {
            None => x()?.t(),
            Some(axes) => x()?.transpose(&axes),
        },
        "swapaxes" => x()?.swapaxes(int_param(case, "axis1")?, int_param(case, "axis2")?),
        "moveaxis" => x()?.moveaxis(int_param(case, "source")?, int_param(case, "destination")?),
        "expand_dims" => x()?.expand_dims(list_param(case, "axes")?),
        "squeeze" => match opt_list_param(case, "axes")? {
            None => x()?.squeeze(..),
            Some(axes) => x()?.squeeze(axes),
        },
        "broadcast_to" => x()?.broadcast_to(list_param(case, "shape")?),
        "slice" => x()?.slice(&list_param(case, "start")?, &list_param(case, "stop")?, &list_param(case, "step")?),
        "concatenate" => ops::concatenate(xs, int_param(case, "axis")?),
        "stack" => ops::stack(xs, int_param(case, "axis")?),
        "split" => {
            let axis = int_param(case, "axis")?;
            return Ok(match case.params.get("sections") {
                Some(_) => x()?.split(int_param(case, "sections")?, axis),
                None => x()?.split_at(&list_param(case, "indices")?, axis),
            });
        }
        "repeat" => x()?.repeat(int_param(case, "repeats")?, opt_int_param(case, "axis")?),
        "tile" => x()?.tile(&list_param(case, "reps")?),
        "pad" => {
            let widths = param(case, "widths")?
                .as_array()
                .ok_or("widths is not a list")?
                .iter()
                .map(|w| match w.as_i32_vec().as_deref() {
                    Some(&[a, b]) => Ok((a, b)),
                    _ => Err(format!("bad pad width {w}")),
                })
                .collect::<Result<Vec<_>, String>>()?;
            match param(case, "mode")?.as_str() {
                Some("edge") => x()?.pad_edge(&widths),
                Some("constant") => x()?.pad(&widths, scalar_of(param(case, "value")?)?),
                m => return Err(format!("unknown pad mode {m:?}")),
            }
        }
        "contiguous" => x()?.contiguous(),
        "copy" => x()?.copy(),
        "tril" => x()?.tril(int_param(case, "k")?),
        "triu" => x()?.triu(int_param(case, "k")?),
        "matmul" => xs[0].matmul(xs.get(1).ok_or("matmul needs two inputs")?),
        "addmm" => {
            let [c, a, b] = xs else {
                return Err("addmm needs three inputs".into());
            };
            ops::addmm(c, a, b, f64_param(case, "alpha")? as f32, f64_param(case, "beta")? as f32)
        }
        "zeros_like" => x()?.zeros_like(),
        "ones_like" => x()?.ones_like(),
        "full_like" => x()?.full_like(scalar_of(param(case, "value")?)?),
        "zeros" => ops::zeros(list_param(case, "shape")?, dtype()?),
        "ones" => ops::ones(list_param(case, "shape")?, dtype()?),
        "full" => {
            let shape = list_param(case, "shape")?;
            match (case.params.get("value"), dtype_param(case, "dtype")?) {
                (Some(v), None) => ops::full(shape, scalar_of(v)?),
                (Some(v), Some(d)) => ops::full_dtype(shape, scalar_of(v)?, d),
                // nuvec's `full` takes no dtype with an array value: cast after broadcasting.
                (None, None) => ops::full(shape, &x()?),
                (None, Some(d)) => ops::full(shape, &x()?).astype(d),
            }
        }
        "arange" => {
            let (start, stop, step) =
                (scalar_of(param(case, "start")?)?, scalar_of(param(case, "stop")?)?, scalar_of(param(case, "step")?)?);
            match dtype_param(case, "dtype")? {
                None => ops::arange(start, stop, step),
                Some(d) => ops::arange_dtype(start, stop, step, d),
            }
        }
        "linspace" => {
            ops::linspace(f64_param(case, "start")?, f64_param(case, "stop")?, int_param(case, "num")?, dtype()?)
        }
        "eye" => ops::eye(int_param(case, "n")?, opt_int_param(case, "m")?, int_param(case, "k")?, dtype()?),
        "tri" => ops::tri(int_param(case, "n")?, opt_int_param(case, "m")?, int_param(case, "k")?, dtype()?),
        "identity" => ops::identity(int_param(case, "n")?, dtype()?),
        _ => return Err(format!("no nuvec mapping for op {op:?}")),
    };
    Ok(vec![y])
}

// ---------------------------------------------------------------------------------------------
// Tolerances

/// MLX's test tolerances per output dtype: `(rtol, atol)`.
fn base_tolerance(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F64 => (1e-12, 1e-13),
        DType::F16 => (1e-3, 1e-3),
        DType::BF16 => (1e-2, 1e-2),
        _ => (1e-5, 1e-6),
    }
}

/// Operations whose results are exactly determined (selection, data movement, casts,
/// correctly rounded IEEE arithmetic): any difference is a bug, so no tolerance.
#[rustfmt::skip]
const EXACT_OPS: &[&str] = &[
    "abs", "sign", "negative", "square", "floor", "ceil", "round", "isnan", "isinf", "isfinite",
    "logical_not", "add", "subtract", "multiply", "maximum", "minimum", "equal", "not_equal",
    "less", "less_equal", "greater", "greater_equal", "logical_and", "logical_or", "bitwise_and",
    "bitwise_or", "bitwise_xor", "left_shift", "right_shift", "where", "clip", "astype", "max",
    "min", "all", "any", "argmax", "argmin", "cummax", "cummin", "reshape", "flatten", "transpose",
    "swapaxes", "moveaxis", "expand_dims", "squeeze", "broadcast_to", "slice", "concatenate",
    "stack", "split", "repeat", "tile", "pad", "contiguous", "copy", "tril", "triu", "zeros",
    "ones", "full", "eye", "tri", "identity", "bitwise_invert", "conjugate", "isposinf", "isneginf",
    "zeros_like", "ones_like", "full_like",
];

/// Operations whose every result is one rounding (or one ulp) from exact: the base tolerance.
#[rustfmt::skip]
const ROUNDED_OPS: &[&str] = &[
    "arange", "linspace", "divide", "floor_divide", "remainder", "sqrt", "rsqrt", "reciprocal",
];

/// Operations that accumulate over many elements: the error grows with the count.
#[rustfmt::skip]
const ACCUMULATING_OPS: &[&str] = &[
    "sum", "prod", "mean", "var", "std", "logsumexp", "cumsum", "cumprod", "logcumsumexp", "matmul",
    "addmm",
];

/// MLX 0.32.4's CPU backend evaluates these float64 operations at float32 accuracy (its SIMD
/// `exp`, `sin`, `cos` and `erf`/`erfinv` approximations; the rest are built on them), while
/// nuvec computes float64 properly. For them float64 outputs get float32's tolerance.
#[rustfmt::skip]
const MLX_F64_AT_F32_ACCURACY: &[&str] = &[
    "exp", "sin", "cos", "sigmoid", "erf", "erfinv", "logaddexp", "softmax", "logsumexp",
    "logcumsumexp",
];

fn max_abs(t: &Tensor) -> f64 {
    t.to_f64().into_iter().filter(|v| v.is_finite()).fold(0.0, |m, v| m.max(v.abs()))
}

/// The tolerance for output `out` of `case` (whose inputs, after layouts, are `xs`).
fn tolerance(case: &Case, xs: &[Array], out: &Tensor) -> Tolerance {
    let op = case.op.as_str();
    if op == "view" {
        return Tolerance::BITWISE;
    }
    if EXACT_OPS.contains(&op) || !out.dtype.is_inexact() {
        return Tolerance::EXACT;
    }
    let (rtol, atol) = if out.dtype == DType::F64 && MLX_F64_AT_F32_ACCURACY.contains(&op) {
        base_tolerance(DType::F32)
    } else {
        base_tolerance(out.dtype)
    };
    if ACCUMULATING_OPS.contains(&op) {
        // Rounding differences from another accumulation order grow like sqrt(n) relative to
        // the result, and like sqrt(n) times the largest term in absolute value (cancellation).
        let (n, magnitude) = match op {
            "matmul" | "addmm" => {
                let (a, b) = if op == "matmul" { (0, 1) } else { (1, 2) };
                let k = xs[a].shape().last().copied().unwrap_or(1) as f64;
                let mut m = max_abs(&case.inputs[a]) * max_abs(&case.inputs[b]);
                if op == "addmm" {
                    m = m * f64_param(case, "alpha").unwrap_or(1.0).abs()
                        + max_abs(&case.inputs[0]) * f64_param(case, "beta").unwrap_or(1.0).abs();
                }
                (k, m)
            }
            "cumsum" | "cumprod" | "logcumsumexp" => {
                let n = match opt_int_param(case, "axis") {
                    Ok(Some(axis)) => xs[0].shape()[axis.rem_euclid(xs[0].ndim() as i32) as usize],
                    _ => xs[0].size() as i32,
                };
                (n as f64, max_abs(&case.inputs[0]))
            }
            _ => {
                let n = xs[0].size() as f64 / out.size().max(1) as f64;
                let m = max_abs(&case.inputs[0]);
                (n, if op == "var" { m * m } else { m })
            }
        };
        let root_n = n.max(1.0).sqrt();
        return Tolerance::close(rtol * 10.0 * root_n, atol * 10.0 + rtol * 2.0 * magnitude * root_n);
    }
    if ROUNDED_OPS.contains(&op) {
        return Tolerance::close(rtol, atol);
    }
    // Transcendental functions: a few ulp of the computing type.
    Tolerance::close(rtol * 4.0, atol * 4.0)
}

// ---------------------------------------------------------------------------------------------
// Replay

/// Why a case failed.
struct Failure {
    name: String,
    detail: String,
}

fn check_case(case: &Case) -> Result<(), String> {
    let xs = inputs(case)?;
    let outs = run(case, &xs)?;
    if outs.len() != case.outputs.len() {
        return Err(format!("{} outputs, MLX gives {}", outs.len(), case.outputs.len()));
    }
    let mut problems = Vec::new();
    for (i, (got, want)) in outs.iter().zip(&case.outputs).enumerate() {
        let bytes = match got.to_bytes() {
            Ok(b) => b,
            Err(e) => {
                problems.push(format!("output {i}: nuvec error: {e}"));
                continue;
            }
        };
        if let Err(m) = compare(want, got.dtype(), got.shape(), &bytes, tolerance(case, &xs, want)) {
            problems.push(format!("output {i}: {m}"));
        }
    }
    if problems.is_empty() { Ok(()) } else { Err(problems.join("; ")) }
}

/// Runs every case; returns the failures (a panic inside nuvec counts as one).
fn replay(cases: &[Case]) -> Vec<Failure> {
    cases
        .iter()
        .filter_map(|case| {
            let result = catch_unwind(AssertUnwindSafe(|| check_case(case)))
                .unwrap_or_else(|p| Err(format!("panicked: {}", panic_message(&p))));
            result.err().map(|detail| Failure {
                name: case.name.clone(),
                detail: format!("[{}] params {}: {detail}", case.op, shorten(&case.params_text, 200)),
            })
        })
        .collect()
}

fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default()
}

fn shorten(s: &str, n: usize) -> String {
    if s.chars().count() <= n { s.to_string() } else { s.chars().take(n).collect::<String>() + "…" }
}

#[test]
fn fixture_file_is_complete() {
    let f = fixture();
    assert!(f.cases.len() >= MIN_CASES, "the fixture holds {} cases, fewer than {MIN_CASES}", f.cases.len());
    assert_eq!(f.meta.get("device").and_then(Json::as_str), Some("cpu"));
    assert!(f.meta.get("mlx_version").and_then(Json::as_str).is_some(), "metadata names no MLX version");
    let mut names = HashSet::new();
    for c in &f.cases {
        assert!(names.insert(c.name.as_str()), "duplicate case name {}", c.name);
    }
}

#[test]
fn nuvec_matches_mlx() {
    let f = fixture();
    let failures = replay(&f.cases);
    let known: BTreeMap<&str, &str> = KNOWN_DIFFERENCES.iter().copied().collect();
    let names: HashSet<&str> = f.cases.iter().map(|c| c.name.as_str()).collect();
    let failed: HashSet<&str> = failures.iter().map(|f| f.name.as_str()).collect();

    let unexpected: Vec<&Failure> = failures.iter().filter(|f| !known.contains_key(f.name.as_str())).collect();
    let mut report: Vec<String> = unexpected.iter().map(|f| format!("  {}: {}", f.name, f.detail)).collect();
    for name in known.keys().filter(|n| !failed.contains(*n)) {
        if names.contains(name) {
            report.push(format!("  {name}: now agrees with MLX; delete it from KNOWN_DIFFERENCES"));
        } else {
            report.push(format!("  {name}: listed in KNOWN_DIFFERENCES but not in the fixture file"));
        }
    }

    let mut per_op: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for c in &f.cases {
        let e = per_op.entry(c.op.as_str()).or_default();
        e.0 += 1;
        e.1 += failed.contains(c.name.as_str()) as usize;
    }
    let summary: Vec<String> =
        per_op.iter().filter(|(_, (_, bad))| *bad > 0).map(|(op, (n, bad))| format!("{op} {bad}/{n}")).collect();
    eprintln!(
        "replayed {} MLX cases: {} differ ({} known); failing by op: {}",
        f.cases.len(),
        failures.len(),
        failures.len() - unexpected.len(),
        if summary.is_empty() { "none".to_string() } else { summary.join(", ") }
    );
    assert!(report.is_empty(), "{} problem(s) replaying MLX fixtures:\n{}", report.len(), report.join("\n"));
}

#[test]
fn comparator_detects_a_flipped_mantissa_bit() {
    let values = [1.5f32, -0.3, 1e-3, 7.0e4, 0.1];
    let want =
        Tensor { dtype: DType::F32, shape: vec![5], bytes: values.iter().flat_map(|v| v.to_le_bytes()).collect() };
    let tol = Tolerance::close(1e-5, 1e-6);
    assert!(compare(&want, DType::F32, &[5], &want.bytes, tol).is_ok());
    // Every mantissa bit under exact comparison, in each element; under the f32 tolerance,
    // every bit from 10 up (2^-14 relative and more) of the elements atol does not dominate.
    for elem in 0..values.len() {
        for bit in 0..23 {
            let mut bytes = want.bytes.clone();
            let word = u32::from_le_bytes(bytes[elem * 4..elem * 4 + 4].try_into().unwrap()) ^ (1 << bit);
            bytes[elem * 4..elem * 4 + 4].copy_from_slice(&word.to_le_bytes());
            let exact = compare(&want, DType::F32, &[5], &bytes, Tolerance::EXACT);
            let m = exact.expect_err("exact comparison missed a flipped bit");
            assert_eq!((m.first_index, m.count), (Some(elem), 1));
            if bit >= 10 && values[elem].abs() >= 0.1 {
                let m = compare(&want, DType::F32, &[5], &bytes, tol).expect_err("tolerance hid a flipped bit");
                assert_eq!(m.first_index, Some(elem));
            }
        }
    }
    // A recorded MLX output with one flipped bit is caught too.
    let case = fixture().cases.iter().find(|c| c.name == "exp/f32/specials").expect("exp/f32/specials");
    let want = &case.outputs[0];
    let mut bytes = want.bytes.clone();
    let at = (0..want.size()).find(|&i| f32::from_le_bytes(bytes[i * 4..i * 4 + 4].try_into().unwrap()).is_normal());
    let i = at.expect("a normal value");
    bytes[i * 4 + 2] ^= 0x20; // mantissa bit 21
    let tol_exp = tolerance(case, &inputs(case).unwrap(), want);
    let m = compare(want, DType::F32, &want.shape, &bytes, tol_exp);
    assert_eq!(m.expect_err("flipped bit not detected").first_index, Some(i));
    // Integers and NaN/infinity are exact.
    let ints =
        Tensor { dtype: DType::I32, shape: vec![2], bytes: [5i32, -7].iter().flat_map(|v| v.to_le_bytes()).collect() };
    let mut flipped = ints.bytes.clone();
    flipped[4] ^= 1;
    assert!(compare(&ints, DType::I32, &[2], &flipped, Tolerance::EXACT).is_err());
    let nan = Tensor { dtype: DType::F32, shape: vec![1], bytes: f32::NAN.to_le_bytes().to_vec() };
    assert!(compare(&nan, DType::F32, &[1], &f32::NAN.to_le_bytes(), Tolerance::EXACT).is_ok());
    assert!(compare(&nan, DType::F32, &[1], &f32::INFINITY.to_le_bytes(), tol).is_err());
    assert!(compare(&nan, DType::F64, &[1], &0f64.to_le_bytes(), tol).is_err(), "dtype must match");
}
