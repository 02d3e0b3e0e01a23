//! GPU benchmark of nuvec's ordinary operations on GPU 0, one primitive at a time: every unary
//! and binary element-wise map, `where`, casts, reductions and copies, in `float32`, `bfloat16`
//! and `float16`, on 64M elements (`[8192, 8192]`), contiguous and in the layouts that real
//! programs hand them (a broadcast operand, a transposed operand, a strided slice, mixed
//! dtypes). Each case is a bandwidth against the copy ceiling; the target is at least 85% of
//! it, and at least PyTorch eager's rate on the same case.
//!
//! ```text
//! cargo run --release -p nuvec --example bench_ops                      # every case (~3-4 min)
//! cargo run --release -p nuvec --example bench_ops -- --out ops.tsv     # also write the TSV lines
//! cargo run --release -p nuvec --example bench_ops -- --only _bf16_     # cases whose name contains "_bf16_"
//! ```
//!
//! Without a usable GPU it prints why and exits with status 0. `bench/gpu_ops_peers.py` times
//! the same cases (same names, same byte counts, same inputs) with PyTorch eager, and
//! `scripts/gpu-ops.sh` runs both on the GPU machine and prints them side by side.
//!
//! # Method
//!
//! As `bench_gpu`'s (the harness is `bench_harness/mod.rs`): the copy ceiling
//! `ceiling_copy_memcpy` (a 1 GiB `cuMemcpyDtoD`, bytes read plus written) is measured first,
//! whatever `--only` says; each case runs warm-up iterations, then at least 5 batches of
//! iterations ending with a synchronize, and reports the median over batches of batch time /
//! iterations. An iteration records the operation (views such as `t()` and `slice` included)
//! and evaluates it. Inputs are the harness's pseudo-random values in about [-1, 1] (`random`),
//! transformed into the operation's domain and evaluated before timing; where one iteration's
//! inputs are smaller than 3× L2, iterations rotate among copies of them (`Bench::copies` of
//! each operand's own bytes: one `[8192, 8192]` operand, a small broadcast one, and so on).
//!
//! Inputs by domain: `log`, `log1p`, `log2`, `log10`, `sqrt`, `rsqrt` and `reciprocal` take
//! `|x| + 0.5`; `arcsin`, `arccos`, `arctanh` and `erfinv` take `x / 2` (inside (-1, 1));
//! `arccosh` takes `|x| + 1`; `divide`, `floor_divide` and `remainder` take `|y| + 0.5` as the
//! divisor; `power` takes `|x| + 0.5` as the base; everything else takes `x` (and `y`) as is.
//!
//! # Cases
//!
//! Names are `<op>_<dtype>_<layout>`, `dtype` one of `f32`, `bf16`, `f16`; `n` = 64M = 8192 ×
//! 8192 elements, `s` the dtype's size in bytes. Bytes are those an ideal kernel moves: every
//! distinct element read once, plus the output written once (a `bool` is 1 byte).
//!
//! * Unary, `<op>_<dtype>_contig` (96): every float-valid `nuvec::graph::UnaryOp::ALL` op,
//!   through its `Array` method: abs, sign, negative, square, floor, ceil, round, exp, expm1,
//!   log, log1p, log2, log10, sqrt, rsqrt, reciprocal, sin, cos, tan, arcsin, arccos, arctan,
//!   sinh, cosh, tanh, arcsinh, arccosh, arctanh, sigmoid, erf, erfinv, logical_not (32 ops).
//!   Bytes `n·s + n·s_out` (`logical_not` writes `bool`). Left out: `bitwise_invert` (integers
//!   and booleans only: nuvec, as MLX, rejects floats) and `conjugate` (the identity on real arrays: no
//!   kernel runs).
//! * Binary, `<op>_<dtype>_contig` (57): every float-valid `BinaryOp::ALL` op on two `[8192,
//!   8192]` arrays: add, subtract, multiply, divide, floor_divide, remainder, power, maximum,
//!   minimum, logaddexp, arctan2, equal, not_equal, less, less_equal, greater, greater_equal,
//!   logical_and, logical_or (19 ops). Bytes `2·n·s + n·s_out` (comparisons and logical ops
//!   write `bool`). Left out: `bitwise_and`, `bitwise_or`, `bitwise_xor`, `left_shift`,
//!   `right_shift` (integers and booleans only).
//! * Layouts of `add` and `multiply` (34): `<op>_<dtype>_row`, `x[8192, 8192] op y[8192, 1]`,
//!   bytes `2·n·s + 8192·s`; `_col`, `y[1, 8192]`, the same bytes; `_scalar`, `x + 0.5` or
//!   `x * 1.5` (a weak scalar: the result keeps x's dtype), bytes `2·n·s`; `_transposed`,
//!   `x.t() op y`, both `[8192, 8192]`, bytes `3·n·s`; `_sliced`, `x[:, ::2] op y` with x a
//!   `[8192, 16384]` array (`slice(&[0, 0], &[8192, 16384], &[1, 2])`), bytes `3·n·s` (the
//!   elements used: DRAM moves whole sectors, so the skipped half of x is read too and this
//!   case cannot reach the ceiling by this accounting); and, for `bf16` and `f16` only,
//!   `_mixed`, `x op y` with y `float32` (the result is `float32` by promotion), bytes
//!   `n·s + 4·n + 4·n`.
//! * Ternary, `where_<dtype>_contig` and `where_<dtype>_row` (6): `ops::where_(c, a, b)` with a
//!   `bool` condition `[8192, 8192]` or `[8192, 1]`; bytes `n + 3·n·s` or `8192 + 3·n·s`.
//! * Casts, `cast_<from>_to_<to>_contig` and `cast_<from>_to_<to>_transposed` (14): `astype`
//!   between every ordered pair of `f32`, `bf16`, `f16`, and `bool` to `f32`, of `x` and of
//!   `x.t()`; bytes `n·(s_from + s_to)`.
//! * Reductions, `<op>_<dtype>_rows` and `<op>_<dtype>_cols` (30), `sum_<dtype>_all` (3):
//!   `sum`, `max`, `mean`, `argmax` and `logsumexp` over the last axis (`rows`: one result per
//!   row) and over axis 0 (`cols`: one result per column), and `sum(..)` over everything; bytes
//!   `n·s` plus the output, 8192 (or 1) results of `s` bytes (`argmax`: `uint32`, 4 bytes).
//! * Copies (15): `concat_<dtype>_axis0`, `ops::concatenate` of two `[4096, 8192]` arrays along
//!   axis 0, and `concat_<dtype>_axis1`, of two `[8192, 4096]` along axis 1, bytes `2·n·s`;
//!   `contiguous_<dtype>_transposed`, `x.t().contiguous()`, bytes `2·n·s`;
//!   `broadcast_<dtype>_row` and `broadcast_<dtype>_col`, `y.broadcast_to([8192, 8192])
//!   .contiguous()` of `y[8192, 1]` and `y[1, 8192]`, bytes `n·s + 8192·s`.
//!
//! 255 cases in all, plus the ceiling. At the default batch settings a case takes about 0.6 to
//! 0.8 s (warm-up, probe, 5 batches of ~100 ms, input set-up), so a full run takes about 3 to
//! 4 minutes, longer where kernels are not in the kernel cache and compile at run time; use
//! `--only` to run a family or a dtype.
//!
//! # Output
//!
//! A table on stdout as cases finish (the target column checks >= 85% of the copy ceiling),
//! then one machine-readable line per case, `name<TAB>value<TAB>GB/s<TAB>fraction` (fraction
//! of the copy ceiling, `nan` values for a case that failed), which `--out PATH` also writes,
//! line by line. Environment: `NUVEC_BENCH_BATCH_MS` (100), `NUVEC_BENCH_BATCHES` (5, at least
//! 3), `NUVEC_BENCH_WARMUP` (3).

mod bench_harness;

use bench_harness::{Bench, copy_ceiling, randoms};
use nuvec::graph::{BinaryOp, UnaryOp};
use nuvec::{Array, DType, ops};

/// Every case's target: fraction of the copy ceiling.
const TARGET: f64 = 0.85;
/// Rows of the main operand.
const R: i32 = 8192;
/// Columns of the main operand.
const C: i32 = 8192;
/// Elements of the main operand (64M).
const N: usize = R as usize * C as usize;
/// The dtypes every family runs in.
const DTYPES: [(DType, &str); 3] = [(DType::F32, "f32"), (DType::BF16, "bf16"), (DType::F16, "f16")];

fn main() {
    bench_harness::main_with("bench_ops", run_all);
}

fn run_all(b: &mut Bench) {
    copy_ceiling(b);
    unary(b);
    binary(b);
    layouts(b);
    ternary(b);
    casts(b);
    reductions(b);
    copies(b);
}

/// The values an input takes, so that the operation stays inside its domain.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Domain {
    /// `x` as is, in about [-1, 1].
    Any,
    /// `|x| + 0.5`.
    Positive,
    /// `x / 2`, inside (-1, 1).
    Half,
    /// `|x| + 1`.
    AtLeastOne,
}

impl Domain {
    fn apply(self, x: &Array) -> Array {
        match self {
            Domain::Any => x.clone(),
            Domain::Positive => x.abs() + 0.5f32,
            Domain::Half => x * 0.5f32,
            Domain::AtLeastOne => x.abs() + 1.0f32,
        }
    }
}

/// Rotating copies of one random input, and its domain variants, made when first asked for.
struct Pool {
    base: Vec<Array>,
    variants: [Option<Vec<Array>>; 4],
}

impl Pool {
    /// `k` random arrays of `shape` and `dtype`.
    fn new(k: usize, shape: &[i32], dtype: DType, seed: u32) -> nuvec::Result<Pool> {
        Ok(Pool { base: randoms(k, shape, dtype, seed)?, variants: [None, None, None, None] })
    }

    /// The copies in `domain`, evaluated.
    fn get(&mut self, domain: Domain) -> nuvec::Result<Vec<Array>> {
        let slot = domain as usize;
        if self.variants[slot].is_none() {
            let v: Vec<Array> = self.base.iter().map(|x| domain.apply(x)).collect();
            nuvec::eval(&v)?;
            self.variants[slot] = Some(v);
        }
        Ok(self.variants[slot].clone().unwrap_or_default())
    }
}

/// Times `f` on rotating operands: iteration `i` takes element `i % len` of each list.
fn case(b: &mut Bench, name: &str, bytes: usize, operands: &[&Vec<Array>], f: impl Fn(&[&Array]) -> Array + 'static) {
    if !b.wanted(name) {
        return;
    }
    let lists: Vec<Vec<Array>> = operands.iter().map(|&v| v.clone()).collect();
    b.bandwidth(name, bytes as f64, Some(TARGET), move || {
        Ok(Box::new(move |i| {
            let args: Vec<&Array> = lists.iter().map(|l| &l[i % l.len()]).collect();
            f(&args)
        }))
    });
}

/// A failed row for each wanted name, when the inputs of a group could not be made.
fn fail_all(b: &mut Bench, names: &[String], e: &nuvec::Error) {
    for name in names {
        if b.wanted(name) {
            b.failed(name, "GB/s", e);
        }
    }
}

/// Whether any of `names` was asked for.
fn any_wanted(b: &Bench, names: &[String]) -> bool {
    names.iter().any(|n| b.wanted(n))
}

type Unary = fn(&Array) -> Array;
type Binary = fn(&Array, &Array) -> Array;

/// The `Array` method of a unary op and its input domain; `None` for ops with no float meaning.
fn unary_method(op: UnaryOp) -> Option<(Unary, Domain)> {
    use Domain::{Any, AtLeastOne, Half, Positive};
    use UnaryOp::*;
    Some(match op {
        Abs => (Array::abs, Any),
        Sign => (Array::sign, Any),
        Negative => (Array::negative, Any),
        Square => (Array::square, Any),
        Floor => (Array::floor, Any),
        Ceil => (Array::ceil, Any),
        Round => (Array::round, Any),
        Exp => (Array::exp, Any),
        Expm1 => (Array::expm1, Any),
        Log => (Array::log, Positive),
        Log1p => (Array::log1p, Positive),
        Log2 => (Array::log2, Positive),
        Log10 => (Array::log10, Positive),
        Sqrt => (Array::sqrt, Positive),
        Rsqrt => (Array::rsqrt, Positive),
        Reciprocal => (Array::reciprocal, Positive),
        Sin => (Array::sin, Any),
        Cos => (Array::cos, Any),
        Tan => (Array::tan, Any),
        ArcSin => (Array::arcsin, Half),
        ArcCos => (Array::arccos, Half),
        ArcTan => (Array::arctan, Any),
        Sinh => (Array::sinh, Any),
        Cosh => (Array::cosh, Any),
        Tanh => (Array::tanh, Any),
        ArcSinh => (Array::arcsinh, Any),
        ArcCosh => (Array::arccosh, AtLeastOne),
        ArcTanh => (Array::arctanh, Half),
        Sigmoid => (Array::sigmoid, Any),
        Erf => (Array::erf, Any),
        ErfInv => (Array::erfinv, Half),
        LogicalNot => (Array::logical_not, Any),
        // Integers and booleans only; the identity on real arrays.
        BitwiseInvert | Conjugate => return None,
    })
}

/// The `Array` method of a binary op and its operands' domains; `None` for integer-only ops.
fn binary_method(op: BinaryOp) -> Option<(Binary, Domain, Domain)> {
    use BinaryOp::*;
    use Domain::{Any, Positive};
    Some(match op {
        Add => (|a, b| a.add(b), Any, Any),
        Subtract => (|a, b| a.subtract(b), Any, Any),
        Multiply => (|a, b| a.multiply(b), Any, Any),
        Divide => (|a, b| a.divide(b), Any, Positive),
        FloorDivide => (|a, b| a.floor_divide(b), Any, Positive),
        Remainder => (|a, b| a.remainder(b), Any, Positive),
        Power => (|a, b| a.power(b), Positive, Any),
        Maximum => (|a, b| a.maximum(b), Any, Any),
        Minimum => (|a, b| a.minimum(b), Any, Any),
        LogAddExp => (|a, b| a.logaddexp(b), Any, Any),
        ArcTan2 => (|a, b| a.arctan2(b), Any, Any),
        Equal => (|a, b| a.equal(b), Any, Any),
        NotEqual => (|a, b| a.not_equal(b), Any, Any),
        Less => (|a, b| a.less(b), Any, Any),
        LessEqual => (|a, b| a.less_equal(b), Any, Any),
        Greater => (|a, b| a.greater(b), Any, Any),
        GreaterEqual => (|a, b| a.greater_equal(b), Any, Any),
        LogicalAnd => (|a, b| a.logical_and(b), Any, Any),
        LogicalOr => (|a, b| a.logical_or(b), Any, Any),
        // Integers and booleans only.
        BitwiseAnd | BitwiseOr | BitwiseXor | LeftShift | RightShift => return None,
    })
}

/// Every float-valid unary op, contiguous.
fn unary(b: &mut Bench) {
    for (dtype, dname) in DTYPES {
        let cases: Vec<(String, Unary, Domain, usize)> = UnaryOp::ALL
            .iter()
            .filter_map(|&op| {
                let (f, domain) = unary_method(op)?;
                let out = if op == UnaryOp::LogicalNot { 1 } else { dtype.size() };
                Some((format!("{}_{dname}_contig", op.name()), f, domain, out))
            })
            .collect();
        let names: Vec<String> = cases.iter().map(|c| c.0.clone()).collect();
        if !any_wanted(b, &names) {
            continue;
        }
        let size = dtype.size();
        let mut pool = match Pool::new(b.copies(N * size), &[R, C], dtype, 100) {
            Ok(p) => p,
            Err(e) => {
                fail_all(b, &names, &e);
                continue;
            }
        };
        for (name, f, domain, out) in cases {
            if !b.wanted(&name) {
                continue;
            }
            match pool.get(domain) {
                Ok(xs) => case(b, &name, N * (size + out), &[&xs], move |a| f(a[0])),
                Err(e) => b.failed(&name, "GB/s", &e),
            }
        }
    }
}

/// Every float-valid binary op on two contiguous arrays.
fn binary(b: &mut Bench) {
    for (dtype, dname) in DTYPES {
        let cases: Vec<(String, Binary, Domain, Domain, usize)> = BinaryOp::ALL
            .iter()
            .filter_map(|&op| {
                let (f, dx, dy) = binary_method(op)?;
                let out = if op.is_predicate() { 1 } else { dtype.size() };
                Some((format!("{}_{dname}_contig", op.name()), f, dx, dy, out))
            })
            .collect();
        let names: Vec<String> = cases.iter().map(|c| c.0.clone()).collect();
        if !any_wanted(b, &names) {
            continue;
        }
        let size = dtype.size();
        let k = b.copies(N * size);
        let pools = Pool::new(k, &[R, C], dtype, 100).and_then(|x| Ok((x, Pool::new(k, &[R, C], dtype, 200)?)));
        let (mut px, mut py) = match pools {
            Ok(p) => p,
            Err(e) => {
                fail_all(b, &names, &e);
                continue;
            }
        };
        for (name, f, dx, dy, out) in cases {
            if !b.wanted(&name) {
                continue;
            }
            match px.get(dx).and_then(|x| Ok((x, py.get(dy)?))) {
                Ok((xs, ys)) => case(b, &name, N * (2 * size + out), &[&xs, &ys], move |a| f(a[0], a[1])),
                Err(e) => b.failed(&name, "GB/s", &e),
            }
        }
    }
}

/// `add` and `multiply` with a broadcast operand, a scalar, a transposed operand, a strided
/// slice, and a `float32` operand.
fn layouts(b: &mut Bench) {
    type Scalar = fn(&Array) -> Array;
    let ops: [(&str, Binary, Scalar); 2] =
        [("add", |a, b| a.add(b), |a| a.add(0.5f32)), ("multiply", |a, b| a.multiply(b), |a| a.multiply(1.5f32))];
    let layouts = ["row", "col", "scalar", "transposed", "sliced", "mixed"];
    for (dtype, dname) in DTYPES {
        let names: Vec<String> = ops
            .iter()
            .flat_map(|(op, _, _)| layouts.iter().map(move |l| format!("{op}_{dname}_{l}")))
            .filter(|n| dtype != DType::F32 || !n.ends_with("_mixed"))
            .collect();
        if !any_wanted(b, &names) {
            continue;
        }
        let size = dtype.size();
        let k = b.copies(N * size);
        let want = |b: &Bench, l: &str| ops.iter().any(|(op, _, _)| b.wanted(&format!("{op}_{dname}_{l}")));
        let inputs = (|| -> nuvec::Result<_> {
            let xs = randoms(k, &[R, C], dtype, 100)?;
            let ys = randoms(k, &[R, C], dtype, 200)?;
            let small = b.copies(R as usize * size);
            let rows = randoms(small, &[R, 1], dtype, 300)?;
            let cols = randoms(small, &[1, C], dtype, 400)?;
            let wide =
                if want(b, "sliced") { randoms(b.copies(2 * N * size), &[R, 2 * C], dtype, 500)? } else { vec![] };
            let y32 = if dtype != DType::F32 && want(b, "mixed") {
                randoms(b.copies(N * 4), &[R, C], DType::F32, 600)?
            } else {
                vec![]
            };
            Ok((xs, ys, rows, cols, wide, y32))
        })();
        let (xs, ys, rows, cols, wide, y32) = match inputs {
            Ok(v) => v,
            Err(e) => {
                fail_all(b, &names, &e);
                continue;
            }
        };
        for (op, f, fs) in ops {
            let bcast = 2 * N * size + R as usize * size;
            case(b, &format!("{op}_{dname}_row"), bcast, &[&xs, &rows], move |a| f(a[0], a[1]));
            case(b, &format!("{op}_{dname}_col"), bcast, &[&xs, &cols], move |a| f(a[0], a[1]));
            case(b, &format!("{op}_{dname}_scalar"), 2 * N * size, &[&xs], move |a| fs(a[0]));
            case(b, &format!("{op}_{dname}_transposed"), 3 * N * size, &[&xs, &ys], move |a| f(&a[0].t(), a[1]));
            if !wide.is_empty() {
                case(b, &format!("{op}_{dname}_sliced"), 3 * N * size, &[&wide, &ys], move |a| {
                    f(&a[0].slice(&[0, 0], &[R, 2 * C], &[1, 2]), a[1])
                });
            }
            if !y32.is_empty() {
                case(b, &format!("{op}_{dname}_mixed"), N * (size + 4 + 4), &[&xs, &y32], move |a| f(a[0], a[1]));
            }
        }
    }
}

/// `where(c, a, b)` with a contiguous condition and a `[8192, 1]` one.
fn ternary(b: &mut Bench) {
    for (dtype, dname) in DTYPES {
        let names = [format!("where_{dname}_contig"), format!("where_{dname}_row")];
        if !any_wanted(b, &names) {
            continue;
        }
        let size = dtype.size();
        let k = b.copies(N * size);
        let inputs = (|| -> nuvec::Result<_> {
            let cond = |k: usize, shape: &[i32]| -> nuvec::Result<Vec<Array>> {
                let c: Vec<Array> = randoms(k, shape, DType::F32, 700)?.iter().map(|x| x.greater(0.0f32)).collect();
                nuvec::eval(&c)?;
                Ok(c)
            };
            let full = if b.wanted(&names[0]) { cond(b.copies(N), &[R, C])? } else { vec![] };
            let rows = cond(b.copies(R as usize), &[R, 1])?;
            Ok((full, rows, randoms(k, &[R, C], dtype, 100)?, randoms(k, &[R, C], dtype, 200)?))
        })();
        let (full, rows, xs, ys) = match inputs {
            Ok(v) => v,
            Err(e) => {
                fail_all(b, &names, &e);
                continue;
            }
        };
        let f = |a: &[&Array]| ops::where_(a[0], a[1], a[2]);
        if !full.is_empty() {
            case(b, &names[0], N + 3 * N * size, &[&full, &xs, &ys], f);
        }
        case(b, &names[1], R as usize + 3 * N * size, &[&rows, &xs, &ys], f);
    }
}

/// `astype` between every ordered pair of float dtypes, and `bool` to `float32`, of a
/// contiguous and of a transposed input.
fn casts(b: &mut Bench) {
    let mut pairs: Vec<(DType, &str, DType, &str)> = Vec::new();
    for (from, fname) in DTYPES {
        for (to, tname) in DTYPES {
            if from != to {
                pairs.push((from, fname, to, tname));
            }
        }
    }
    pairs.push((DType::Bool, "bool", DType::F32, "f32"));
    for (from, fname, to, tname) in pairs {
        let names = [format!("cast_{fname}_to_{tname}_contig"), format!("cast_{fname}_to_{tname}_transposed")];
        if !any_wanted(b, &names) {
            continue;
        }
        let k = b.copies(N * from.size());
        let xs = if from == DType::Bool {
            randoms(k, &[R, C], DType::F32, 700).and_then(|v| {
                let c: Vec<Array> = v.iter().map(|x| x.greater(0.0f32)).collect();
                nuvec::eval(&c)?;
                Ok(c)
            })
        } else {
            randoms(k, &[R, C], from, 100)
        };
        let xs = match xs {
            Ok(v) => v,
            Err(e) => {
                fail_all(b, &names, &e);
                continue;
            }
        };
        let bytes = N * (from.size() + to.size());
        case(b, &names[0], bytes, &[&xs], move |a| a[0].astype(to));
        case(b, &names[1], bytes, &[&xs], move |a| a[0].t().astype(to));
    }
}

/// `sum`, `max`, `mean`, `argmax` and `logsumexp` over the rows and over the columns, and
/// `sum` over everything.
fn reductions(b: &mut Bench) {
    // (name, reduce over the last axis, over axis 0, output element size: None for the input's)
    let ops: [(&str, Unary, Unary, Option<usize>); 5] = [
        ("sum", |x| x.sum(-1), |x| x.sum(0), None),
        ("max", |x| x.max(-1), |x| x.max(0), None),
        ("mean", |x| x.mean(-1), |x| x.mean(0), None),
        ("argmax", |x| x.argmax(-1), |x| x.argmax(0), Some(4)),
        ("logsumexp", |x| x.logsumexp(-1), |x| x.logsumexp(0), None),
    ];
    for (dtype, dname) in DTYPES {
        let mut names: Vec<String> =
            ops.iter().flat_map(|(op, ..)| [format!("{op}_{dname}_rows"), format!("{op}_{dname}_cols")]).collect();
        names.push(format!("sum_{dname}_all"));
        if !any_wanted(b, &names) {
            continue;
        }
        let size = dtype.size();
        let xs = match randoms(b.copies(N * size), &[R, C], dtype, 100) {
            Ok(v) => v,
            Err(e) => {
                fail_all(b, &names, &e);
                continue;
            }
        };
        for (op, rows, cols, out) in ops {
            let out = out.unwrap_or(size);
            case(b, &format!("{op}_{dname}_rows"), N * size + R as usize * out, &[&xs], move |a| rows(a[0]));
            case(b, &format!("{op}_{dname}_cols"), N * size + C as usize * out, &[&xs], move |a| cols(a[0]));
        }
        case(b, &format!("sum_{dname}_all"), N * size + size, &[&xs], |a| a[0].sum(..));
    }
}

/// Copies: `concatenate` along either axis, a transposed array made contiguous, and a
/// broadcast array materialized.
fn copies(b: &mut Bench) {
    for (dtype, dname) in DTYPES {
        let names = [
            format!("concat_{dname}_axis0"),
            format!("concat_{dname}_axis1"),
            format!("contiguous_{dname}_transposed"),
            format!("broadcast_{dname}_row"),
            format!("broadcast_{dname}_col"),
        ];
        if !any_wanted(b, &names) {
            continue;
        }
        let size = dtype.size();
        let k = b.copies(N * size);
        let small = b.copies(R as usize * size);
        let inputs = (|| -> nuvec::Result<_> {
            let halves = |shape: &[i32]| -> nuvec::Result<(Vec<Array>, Vec<Array>)> {
                Ok((randoms(k, shape, dtype, 100)?, randoms(k, shape, dtype, 200)?))
            };
            let axis0 = if b.wanted(&names[0]) { halves(&[R / 2, C])? } else { (vec![], vec![]) };
            let axis1 = if b.wanted(&names[1]) { halves(&[R, C / 2])? } else { (vec![], vec![]) };
            let full = if b.wanted(&names[2]) { randoms(k, &[R, C], dtype, 300)? } else { vec![] };
            let rows = randoms(small, &[R, 1], dtype, 400)?;
            let cols = randoms(small, &[1, C], dtype, 500)?;
            Ok((axis0, axis1, full, rows, cols))
        })();
        let ((a0, b0), (a1, b1), full, rows, cols) = match inputs {
            Ok(v) => v,
            Err(e) => {
                fail_all(b, &names, &e);
                continue;
            }
        };
        let concat = |axis: i32| move |a: &[&Array]| ops::concatenate(&[a[0].clone(), a[1].clone()], axis);
        if !a0.is_empty() {
            case(b, &names[0], 2 * N * size, &[&a0, &b0], concat(0));
        }
        if !a1.is_empty() {
            case(b, &names[1], 2 * N * size, &[&a1, &b1], concat(1));
        }
        if !full.is_empty() {
            case(b, &names[2], 2 * N * size, &[&full], |a| a[0].t().contiguous());
        }
        let bcast = N * size + R as usize * size;
        case(b, &names[3], bcast, &[&rows], |a| a[0].broadcast_to([R, C]).contiguous());
        case(b, &names[4], bcast, &[&cols], |a| a[0].broadcast_to([R, C]).contiguous());
    }
}
