//! Replays the sorting fixtures recorded from real MLX 0.32.4 on the CPU
//! (`scripts/mlx_fixtures_sort.py` → `tests/fixtures/sort.bin`) through nuvec.
//!
//! `sort` and `argsort` are defined element by element (stable, NaN last) and must match MLX
//! bit for bit. MLX leaves the order inside a partition to its backend (`std::nth_element` on
//! the CPU), so `partition`, `argpartition` and `topk` are checked by what defines them, against
//! MLX's own output: same dtype and shape, the same element (and, for argpartition, the same
//! index) at `kth`, nothing greater before it and nothing smaller after it, each row a
//! permutation of the input row, and `topk` the same multiset as MLX's per row.

use crate::fixture;

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashSet};
use std::sync::OnceLock;

use fixture::{Case, Fixture, Json, Tensor, Tolerance, compare, decode_f64};
use nuvec::{Array, DType};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/sort.bin");

/// Guards against a truncated recording.
const MIN_CASES: usize = 300;

fn fixture() -> &'static Fixture {
    static DATA: OnceLock<Fixture> = OnceLock::new();
    DATA.get_or_init(|| {
        let bytes = std::fs::read(FIXTURE).unwrap_or_else(|e| panic!("reading {FIXTURE}: {e}"));
        Fixture::parse(&bytes).unwrap_or_else(|e| panic!("parsing {FIXTURE}: {e}"))
    })
}

fn int(case: &Case, key: &str) -> Result<i32, String> {
    case.params.get(key).and_then(Json::as_i64).map(|v| v as i32).ok_or_else(|| format!("param {key:?}"))
}

fn axis(case: &Case) -> Result<Option<i32>, String> {
    match case.params.get("axis") {
        Some(Json::Null) => Ok(None),
        Some(_) => int(case, "axis").map(Some),
        None => Err("missing axis".into()),
    }
}

fn input(case: &Case) -> Result<Array, String> {
    let x = case.inputs[0].to_array();
    let Some(recipe) = case.params.get("layout") else {
        return Ok(x);
    };
    let steps = recipe.as_array().ok_or("bad layout")?;
    let list = |i: usize| steps.get(i).and_then(Json::as_i32_vec).ok_or(format!("bad layout {recipe}"));
    match steps.first().and_then(Json::as_str) {
        Some("transpose") => Ok(x.transpose(&list(1)?)),
        Some("slice") => Ok(x.slice(&list(1)?, &list(2)?, &list(3)?)),
        Some("broadcast") => Ok(x.broadcast_to(list(1)?)),
        _ => Err(format!("unknown layout {recipe}")),
    }
}

/// The input as MLX's op sees it: flattened for `axis = None`.
fn operand(case: &Case) -> Result<(Array, usize), String> {
    let x = input(case)?;
    match axis(case)? {
        None => Ok((x.reshape([-1]), 0)),
        Some(a) => Ok((x.clone(), a.rem_euclid(x.ndim().max(1) as i32) as usize)),
    }
}

/// MLX's order on decoded values (NaN last, NaNs equal; complex by real then imaginary part).
fn order(dtype: DType, a: &[f64], b: &[f64]) -> Ordering {
    let key = |v: &[f64]| -> (bool, f64, f64) {
        let im = if dtype == DType::Complex64 { v[1] } else { 0.0 };
        (v[0].is_nan() || im.is_nan(), v[0], im)
    };
    let (ka, kb) = (key(a), key(b));
    if ka.0 || kb.0 {
        return ka.0.cmp(&kb.0);
    }
    ka.1.partial_cmp(&kb.1).unwrap().then(ka.2.partial_cmp(&kb.2).unwrap())
}

/// Rows along `axis` of a row-major `shape`, as flat positions.
fn rows(shape: &[i32], axis: usize) -> Vec<Vec<usize>> {
    let strides: Vec<usize> = (0..shape.len()).map(|i| shape[i + 1..].iter().product::<i32>() as usize).collect();
    let n = shape.iter().product::<i32>() as usize;
    let len = shape[axis] as usize;
    if len == 0 {
        return vec![];
    }
    (0..n)
        .filter(|&p| (p / strides[axis]).is_multiple_of(len))
        .map(|p| (0..len).map(|j| p + j * strides[axis]).collect())
        .collect()
}

/// Elements of a tensor as decoded values (two per complex element).
struct Values {
    dtype: DType,
    v: Vec<f64>,
}

impl Values {
    fn of(t: &Tensor) -> Values {
        Values { dtype: t.dtype, v: decode_f64(t.dtype, &t.bytes) }
    }
    fn of_array(a: &Array) -> Result<Values, String> {
        let bytes = a.to_bytes().map_err(|e| e.to_string())?;
        Ok(Values { dtype: a.dtype(), v: decode_f64(a.dtype(), &bytes) })
    }
    fn at(&self, i: usize) -> &[f64] {
        let w = if self.dtype == DType::Complex64 { 2 } else { 1 };
        &self.v[i * w..(i + 1) * w]
    }
}

fn got_tensor(a: &Array) -> Result<(DType, Vec<i32>, Vec<u8>), String> {
    let bytes = a.to_bytes().map_err(|e| e.to_string())?;
    Ok((a.dtype(), a.shape().to_vec(), bytes))
}

fn same_header(want: &Tensor, got: &Array) -> Result<(), String> {
    if want.dtype != got.dtype() || want.shape[..] != got.shape()[..] {
        return Err(format!("MLX {} {:?}, nuvec {} {:?}", want.dtype, want.shape, got.dtype(), got.shape()));
    }
    Ok(())
}

/// Checks a partition (values, or the values its indices pick) around `k` per row.
fn check_partition(
    x: &Values,
    xrows: &[Vec<usize>],
    got: &dyn Fn(usize, usize) -> Vec<f64>,
    want: &dyn Fn(usize, usize) -> Vec<f64>,
    k: usize,
) -> Result<(), String> {
    let d = x.dtype;
    for (r, row) in xrows.iter().enumerate() {
        let pivot = got(r, k);
        if order(d, &pivot, &want(r, k)) != Ordering::Equal {
            return Err(format!("row {r}: element at kth {k} is {pivot:?}, MLX {:?}", want(r, k)));
        }
        for j in 0..row.len() {
            let o = order(d, &got(r, j), &pivot);
            if (j < k && o == Ordering::Greater) || (j > k && o == Ordering::Less) {
                return Err(format!("row {r}: position {j} holds {:?} against pivot {pivot:?}", got(r, j)));
            }
        }
        // The row is a permutation of the input row.
        let sorted = |f: &dyn Fn(usize) -> Vec<f64>| {
            let mut v: Vec<Vec<f64>> = (0..row.len()).map(f).collect();
            v.sort_by(|a, b| {
                order(d, a, b)
                    .then_with(|| a.iter().zip(b).map(|(p, q)| p.total_cmp(q)).fold(Ordering::Equal, Ordering::then))
            });
            v
        };
        let a = sorted(&|j| got(r, j));
        let b = sorted(&|j| x.at(row[j]).to_vec());
        let eq = a.iter().zip(&b).all(|(p, q)| p.iter().zip(q).all(|(s, t)| s == t || (s.is_nan() && t.is_nan())));
        if !eq {
            return Err(format!("row {r} is not a permutation of the input row"));
        }
    }
    Ok(())
}

fn run(case: &Case) -> Result<(), String> {
    let (x, ax) = operand(case)?;
    let want = &case.outputs[0];
    let xv = Values::of_array(&x.contiguous())?;
    let xrows = rows(x.shape(), ax);
    match case.op.as_str() {
        "sort" | "argsort" => {
            let got = if case.op == "sort" { x.sort(ax as i32) } else { x.argsort(ax as i32) };
            // Through the public entry point too (None flattens there).
            let public =
                if case.op == "sort" { input(case)?.sort(axis(case)?) } else { input(case)?.argsort(axis(case)?) };
            for g in [&got, &public] {
                let (dtype, shape, bytes) = got_tensor(g)?;
                let tol = Tolerance { bitwise: true, ..Tolerance::EXACT };
                compare(want, dtype, &shape, &bytes, tol).map_err(|m| m.to_string())?;
            }
            Ok(())
        }
        "partition" | "argpartition" => {
            let kth = int(case, "kth")?;
            let got = if case.op == "partition" {
                input(case)?.partition(kth, axis(case)?)
            } else {
                input(case)?.argpartition(kth, axis(case)?)
            };
            same_header(want, &got)?;
            let len = x.shape()[ax];
            let k = kth.rem_euclid(len) as usize;
            let outrows = rows(want.shape.as_slice(), ax);
            if case.op == "partition" {
                let (gv, wv) = (Values::of_array(&got)?, Values::of(want));
                check_partition(
                    &xv,
                    &xrows,
                    &|r, j| gv.at(outrows[r][j]).to_vec(),
                    &|r, j| wv.at(outrows[r][j]).to_vec(),
                    k,
                )
            } else {
                let gi: Vec<u32> = got.contiguous().to_vec::<u32>().map_err(|e| e.to_string())?;
                let wi: Vec<u32> = decode_f64(DType::U32, &want.bytes).iter().map(|&v| v as u32).collect();
                let pick = |idx: &Vec<u32>, r: usize, j: usize| xv.at(xrows[r][idx[outrows[r][j]] as usize]).to_vec();
                check_partition(&xv, &xrows, &|r, j| pick(&gi, r, j), &|r, j| pick(&wi, r, j), k)?;
                // Ties are ranked by index, so the index at kth is MLX's unless NaNs tie there.
                for r in 0..xrows.len() {
                    let (g, w) = (gi[outrows[r][k]], wi[outrows[r][k]]);
                    if g != w && !pick(&wi, r, k).iter().any(|v| v.is_nan()) {
                        return Err(format!("row {r}: index at kth {k} is {g}, MLX {w}"));
                    }
                }
                Ok(())
            }
        }
        "topk" => {
            let k = int(case, "k")?;
            let got = input(case)?.topk(k, axis(case)?);
            same_header(want, &got)?;
            let (gv, wv) = (Values::of_array(&got.contiguous())?, Values::of(want));
            for (r, row) in rows(want.shape.as_slice(), ax).iter().enumerate() {
                let sorted = |v: &Values| {
                    let mut s: Vec<Vec<f64>> = row.iter().map(|&p| v.at(p).to_vec()).collect();
                    s.sort_by(|a, b| order(v.dtype, a, b));
                    s
                };
                let (a, b) = (sorted(&gv), sorted(&wv));
                if a.iter().zip(&b).any(|(p, q)| order(gv.dtype, p, q) != Ordering::Equal) {
                    return Err(format!("row {r}: {a:?}, MLX {b:?}"));
                }
            }
            Ok(())
        }
        op => Err(format!("unknown op {op}")),
    }
}

#[test]
fn fixture_is_complete() {
    let f = fixture();
    assert!(f.cases.len() >= MIN_CASES, "{} cases", f.cases.len());
    assert_eq!(f.meta.get("device").and_then(Json::as_str), Some("cpu"));
    let mut names = HashSet::new();
    let mut ops: BTreeMap<&str, usize> = BTreeMap::new();
    let mut dtypes = HashSet::new();
    for c in &f.cases {
        assert!(names.insert(c.name.as_str()), "duplicate {}", c.name);
        *ops.entry(c.op.as_str()).or_default() += 1;
        dtypes.insert(c.inputs[0].dtype);
    }
    assert_eq!(ops.keys().copied().collect::<Vec<_>>(), ["argpartition", "argsort", "partition", "sort", "topk"]);
    assert_eq!(dtypes.len(), 14, "every dtype is recorded");
}

#[test]
fn nuvec_matches_mlx() {
    let f = fixture();
    let failures: Vec<String> =
        f.cases.iter().filter_map(|c| run(c).err().map(|e| format!("  {} {}: {e}", c.name, c.params_text))).collect();
    assert!(
        failures.is_empty(),
        "{} of {} cases differ from MLX:\n{}",
        failures.len(),
        f.cases.len(),
        failures.join("\n")
    );
}

#[test]
fn the_checks_catch_wrong_answers() {
    // A case whose partition MLX put in an order nuvec does not reproduce exactly still passes,
    // but swapping the pivot out of place, or a wrong sort, fails.
    let case = fixture().cases.iter().find(|c| c.name == "partition/f32/long").expect("partition/f32/long");
    let (x, ax) = operand(case).unwrap();
    let xv = Values::of_array(&x.contiguous()).unwrap();
    let xrows = rows(x.shape(), ax);
    let wv = Values::of(&case.outputs[0]);
    let outrows = rows(&case.outputs[0].shape, ax);
    let k = int(case, "kth").unwrap() as usize;
    let swapped = |r: usize, j: usize| {
        let j = if j == k {
            k + 1
        } else if j == k + 1 {
            k
        } else {
            j
        };
        wv.at(outrows[r][j]).to_vec()
    };
    let want = |r: usize, j: usize| wv.at(outrows[r][j]).to_vec();
    assert!(check_partition(&xv, &xrows, &want, &want, k).is_ok());
    assert!(check_partition(&xv, &xrows, &swapped, &want, k).is_err());
    let sort_case = fixture().cases.iter().find(|c| c.name == "sort/f32/long").expect("sort/f32/long");
    let (x, ax) = operand(sort_case).unwrap();
    let (dtype, shape, bytes) = got_tensor(&x.sort(ax as i32).swapaxes(0, 0).negative().negative()).unwrap();
    let tol = Tolerance { bitwise: true, ..Tolerance::EXACT };
    assert!(compare(&sort_case.outputs[0], dtype, &shape, &bytes, tol).is_ok());
    // The unsorted input (a partition would not do: a backend may partition by sorting).
    let (dtype, shape, bytes) = got_tensor(&x.contiguous()).unwrap();
    assert!(compare(&sort_case.outputs[0], dtype, &shape, &bytes, tol).is_err());
}
