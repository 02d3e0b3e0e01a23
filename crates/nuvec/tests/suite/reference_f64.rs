//! Float64-reference property test over random chains of operations.
//!
//! Each case draws an input (random shape with size-0 and size-1 axes, `f32`/`f64`/`f16`/`bf16`
//! or integer dtype, plain or strided layout), then a chain of 3–8 operations: element-wise
//! unary and binary maps with broadcasting and weak scalars, comparisons and `where`, `clip`,
//! `astype`, reductions over random axes with or without `keepdims`, arg-reductions, scans,
//! views (transpose, reshape, slice, broadcast, expand/squeeze, swap/move axes, flatten),
//! concatenate/stack/split/pad/repeat/tile/tril, matmul and addmm, softmax and logsumexp. The
//! chain runs through nuvec and, independently, through the small interpreter below over
//! row-major `f64` host tensors (nuvec is never called for the reference).
//!
//! Next to every reference value the interpreter carries a bound on how far a correct
//! implementation may be from it: the rounding of each step in the dtype nuvec computes and
//! stores in (`f32` accumulation for half precision), propagated through the chain by interval
//! evaluation. Results must agree within twice that bound, which is typically about 1e-6
//! relative for `f32` chains, 1e-14 for `f64`, 1e-3 for `f16` and 1e-2 for `bf16` (results use
//! up to the whole bound), and exact for integer and boolean results (NaN equals NaN). Steps
//! whose inputs leave an operation's domain get a recorded fix-up (`abs(x) + 0.5` before `log`,
//! `tanh(x) * 0.75` before `arcsin`, ...), and steps that would overflow or wrap the dtype, or
//! leave the comparison meaningless (over a quarter of the elements with a bound above 10% of
//! their value), are redrawn.
//!
//! The cases come from proptest with a fixed seed (256 cases; `PROPTEST_CASES=n` for more,
//! `NUVEC_REF_SEED=n` for another seed) and shrink on failure; a failure prints the chain with
//! every input's dtype, shape, layout and values, and the elements that differ, and the case to
//! replay with `NUVEC_REF_CASE`. A second, seeded run checks that the generator exercises every
//! operation; with `NUVEC_REF_STATS=1 ... generator_covers_every_operation -- --nocapture` it
//! prints how often each operation ran and how much of their error bounds the results used.
//!
//! Run: `cargo test -p nuvec --release --test suite -- reference_f64::`.

use nuvec::{Array, DType, ScalarOrArray, ScanOptions, VarOptions, bf16, f16, ops};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestCaseError};

// ------------------------------------------------------------------------------------------
// Random numbers (SplitMix64): every choice inside a case derives from the case's seeds.

#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next() % ((hi - lo + 1) as u64)) as i64
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
    fn shuffle<T>(&mut self, xs: &mut [T]) {
        for i in (1..xs.len()).rev() {
            let j = self.below(i + 1);
            xs.swap(i, j);
        }
    }
    /// Index drawn with the given weights.
    fn weighted(&mut self, weights: &[u32]) -> usize {
        let total: u32 = weights.iter().sum();
        let mut r = self.below(total as usize) as u32;
        for (i, &w) in weights.iter().enumerate() {
            if r < w {
                return i;
            }
            r -= w;
        }
        weights.len() - 1
    }
}

// ------------------------------------------------------------------------------------------
// Dtype rules, written out independently of nuvec (MLX's rules).

fn is_float(d: DType) -> bool {
    matches!(d, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
}

fn is_int(d: DType) -> bool {
    matches!(d, DType::U8 | DType::U16 | DType::U32 | DType::U64 | DType::I8 | DType::I16 | DType::I32 | DType::I64)
}

fn is_unsigned(d: DType) -> bool {
    matches!(d, DType::U8 | DType::U16 | DType::U32 | DType::U64)
}

fn at_least_float(d: DType) -> DType {
    if is_float(d) { d } else { DType::F32 }
}

fn byte_size(d: DType) -> usize {
    match d {
        DType::Bool | DType::U8 | DType::I8 => 1,
        DType::U16 | DType::I16 | DType::F16 | DType::BF16 => 2,
        DType::U32 | DType::I32 | DType::F32 => 4,
        _ => 8,
    }
}

/// Unit roundoff of a stored value.
fn unit(d: DType) -> f64 {
    match d {
        DType::F64 => 2f64.powi(-53),
        DType::F32 => 2f64.powi(-24),
        DType::F16 => 2f64.powi(-11),
        DType::BF16 => 2f64.powi(-8),
        _ => 0.0,
    }
}

/// Unit roundoff of the precision a kernel computes in (`f32` for half precision).
fn acc_unit(d: DType) -> f64 {
    match d {
        DType::F64 => 2f64.powi(-53),
        DType::F32 | DType::F16 | DType::BF16 => 2f64.powi(-24),
        _ => 0.0,
    }
}

/// Absolute rounding error near zero (smallest normal; subnormal step for `f16`).
fn tiny(d: DType) -> f64 {
    match d {
        DType::F64 => f64::MIN_POSITIVE,
        DType::F32 | DType::BF16 => f32::MIN_POSITIVE as f64,
        DType::F16 => 2f64.powi(-24),
        _ => 0.0,
    }
}

/// The value rounded to `d` (`x` must be in range for integers).
fn round_to(d: DType, x: f64) -> f64 {
    match d {
        DType::F64 => x,
        DType::F32 => x as f32 as f64,
        DType::F16 => f16::from_f64(x).to_f64(),
        DType::BF16 => bf16::from_f64(x).to_f64(),
        DType::Bool => (x != 0.0) as u8 as f64,
        // Integers wrap (C-style conversion, as a weak scalar meeting a narrower array).
        DType::U8 => x as i64 as u8 as f64,
        DType::U16 => x as i64 as u16 as f64,
        DType::U32 => x as i64 as u32 as f64,
        DType::I8 => x as i64 as i8 as f64,
        DType::I16 => x as i64 as i16 as f64,
        DType::I32 => x as i64 as i32 as f64,
        _ => x,
    }
}

/// Range of an integer dtype.
fn int_range(d: DType) -> (f64, f64) {
    match d {
        DType::Bool => (0.0, 1.0),
        DType::U8 => (0.0, 255.0),
        DType::U16 => (0.0, 65535.0),
        DType::U32 => (0.0, 4294967295.0),
        DType::U64 => (0.0, 18446744073709551615.0),
        DType::I8 => (-128.0, 127.0),
        DType::I16 => (-32768.0, 32767.0),
        DType::I32 => (-2147483648.0, 2147483647.0),
        _ => (-9223372036854775808.0, 9223372036854775807.0),
    }
}

/// Largest magnitude a chain may reach in `d` before a step is redrawn.
fn limit(d: DType) -> f64 {
    match d {
        DType::F16 => 2.0e4,
        DType::BF16 | DType::F32 | DType::F64 => 1.0e15,
        DType::Bool => 1.0,
        d => {
            let (lo, hi) = int_range(d);
            lo.abs().min(hi).min(2f64.powi(52))
        }
    }
}

/// MLX's promotion of two dtypes.
fn promote(a: DType, b: DType) -> DType {
    use DType::*;
    if a == b {
        return a;
    }
    if a == Bool {
        return b;
    }
    if b == Bool {
        return a;
    }
    match (is_float(a), is_float(b)) {
        (true, true) => {
            if a == F64 || b == F64 {
                F64
            } else {
                F32 // f32 with anything, or f16 with bf16
            }
        }
        (true, false) => a,
        (false, true) => b,
        (false, false) => {
            let (ua, ub) = (is_unsigned(a), is_unsigned(b));
            if ua == ub {
                return if byte_size(a) >= byte_size(b) { a } else { b };
            }
            let (u, s) = if ua { (a, b) } else { (b, a) };
            if u == U64 {
                return F32;
            }
            match (byte_size(u) * 2).max(byte_size(s)) {
                1 => I8,
                2 => I16,
                4 => I32,
                _ => I64,
            }
        }
    }
}

/// The dtype a weak Rust scalar takes next to an array of `d`.
fn weak_dtype(s: Sc, d: DType) -> DType {
    match s {
        Sc::F(_) => {
            if is_float(d) {
                d
            } else {
                DType::F32
            }
        }
        Sc::I(_) => {
            if d == DType::Bool {
                DType::I32
            } else {
                d
            }
        }
    }
}

/// Accumulation dtype of `sum`/`prod` (small integers widen to 32 bits).
fn sum_dtype(d: DType) -> DType {
    match d {
        DType::Bool | DType::I8 | DType::I16 => DType::I32,
        DType::U8 | DType::U16 => DType::U32,
        d => d,
    }
}

// ------------------------------------------------------------------------------------------
// Reference tensors: row-major f64 values with an absolute error bound per element.

#[derive(Clone, Debug)]
struct Ref {
    shape: Vec<usize>,
    dtype: DType,
    v: Vec<f64>,
    /// How far a correct implementation may be from `v` (`inf`: anything goes; for booleans
    /// and arg-reductions `>= 1` means the result is undecided).
    e: Vec<f64>,
}

impl Ref {
    fn exact(shape: Vec<usize>, dtype: DType, v: Vec<f64>) -> Ref {
        let e = vec![0.0; v.len()];
        Ref { shape, dtype, v, e }
    }
    fn ndim(&self) -> usize {
        self.shape.len()
    }
    fn n(&self) -> usize {
        self.v.len()
    }
    fn with_shape(&self, shape: Vec<usize>) -> Ref {
        assert_eq!(numel(&shape), self.n());
        Ref { shape, ..self.clone() }
    }
}

fn numel(s: &[usize]) -> usize {
    s.iter().product()
}

fn row_strides(s: &[usize]) -> Vec<usize> {
    let mut st = vec![0; s.len()];
    let mut acc = 1;
    for i in (0..s.len()).rev() {
        st[i] = acc;
        acc *= s[i].max(1);
    }
    st
}

fn unravel(mut i: usize, s: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; s.len()];
    for d in (0..s.len()).rev() {
        if s[d] > 0 {
            idx[d] = i % s[d];
            i /= s[d];
        }
    }
    idx
}

fn dot(idx: &[usize], st: &[usize]) -> usize {
    idx.iter().zip(st).map(|(a, b)| a * b).sum()
}

/// Output element `i` is `x[src(index_i)]`, or `fill` (exact) where `src` gives `None`.
fn gather(x: &Ref, shape: Vec<usize>, src: impl Fn(&[usize]) -> Option<Vec<usize>>, fill: f64) -> Ref {
    let st = row_strides(&x.shape);
    let n = numel(&shape);
    let (mut v, mut e) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        match src(&unravel(i, &shape)) {
            Some(s) => {
                let j = dot(&s, &st);
                v.push(x.v[j]);
                e.push(x.e[j]);
            }
            None => {
                v.push(fill);
                e.push(0.0);
            }
        }
    }
    Ref { shape, dtype: x.dtype, v, e }
}

/// Output axis `i` is input axis `perm[i]`.
fn r_transpose(x: &Ref, perm: &[usize]) -> Ref {
    let shape = perm.iter().map(|&p| x.shape[p]).collect();
    gather(
        x,
        shape,
        |idx| {
            let mut s = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                s[p] = idx[i];
            }
            Some(s)
        },
        0.0,
    )
}

fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let da = if i + a.len() >= n { a[i + a.len() - n] } else { 1 };
        let db = if i + b.len() >= n { b[i + b.len() - n] } else { 1 };
        out[i] = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return None;
        };
    }
    Some(out)
}

fn r_broadcast(x: &Ref, shape: &[usize]) -> Ref {
    let lead = shape.len() - x.ndim();
    gather(
        x,
        shape.to_vec(),
        |idx| Some((0..x.ndim()).map(|i| if x.shape[i] == 1 { 0 } else { idx[lead + i] }).collect()),
        0.0,
    )
}

/// Python's `slice(start, stop, step).indices(dim)`: the first index and the length.
fn py_slice(start: i32, stop: i32, step: i32, dim: usize) -> (i64, usize) {
    let d = dim as i64;
    let (s, t, k) = (start as i64, stop as i64, step as i64);
    let norm = |v: i64| if v < 0 { v + d } else { v };
    if k > 0 {
        let a = norm(s).clamp(0, d);
        let b = norm(t).clamp(0, d);
        (a, if b > a { ((b - a + k - 1) / k) as usize } else { 0 })
    } else {
        let a = norm(s).clamp(-1, d - 1);
        let b = norm(t).clamp(-1, d - 1);
        (a, if a > b { ((a - b - k - 1) / -k) as usize } else { 0 })
    }
}

fn r_slice(x: &Ref, start: &[i32], stop: &[i32], step: &[i32]) -> Ref {
    let plan: Vec<(i64, usize)> = (0..x.ndim()).map(|i| py_slice(start[i], stop[i], step[i], x.shape[i])).collect();
    let shape = plan.iter().map(|p| p.1).collect();
    gather(
        x,
        shape,
        |idx| Some((0..idx.len()).map(|i| (plan[i].0 + idx[i] as i64 * step[i] as i64) as usize).collect()),
        0.0,
    )
}

fn r_concat(xs: &[Ref], axis: usize) -> Ref {
    let mut shape = xs[0].shape.clone();
    shape[axis] = xs.iter().map(|x| x.shape[axis]).sum();
    let n = numel(&shape);
    let (mut v, mut e) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        let mut idx = unravel(i, &shape);
        let mut k = 0;
        while idx[axis] >= xs[k].shape[axis] {
            idx[axis] -= xs[k].shape[axis];
            k += 1;
        }
        let j = dot(&idx, &row_strides(&xs[k].shape));
        v.push(xs[k].v[j]);
        e.push(xs[k].e[j]);
    }
    Ref { shape, dtype: xs[0].dtype, v, e }
}

fn r_pad(x: &Ref, widths: &[(usize, usize)], value: f64) -> Ref {
    let shape = x.shape.iter().zip(widths).map(|(d, (a, b))| d + a + b).collect();
    gather(
        x,
        shape,
        |idx| {
            let mut s = Vec::with_capacity(idx.len());
            for (i, &k) in idx.iter().enumerate() {
                let (a, _) = widths[i];
                if k < a || k >= a + x.shape[i] {
                    return None;
                }
                s.push(k - a);
            }
            Some(s)
        },
        value,
    )
}

fn r_repeat(x: &Ref, r: usize, axis: usize) -> Ref {
    let mut shape = x.shape.clone();
    shape[axis] *= r;
    gather(
        x,
        shape,
        |idx| {
            let mut s = idx.to_vec();
            s[axis] /= r;
            Some(s)
        },
        0.0,
    )
}

fn r_tile(x: &Ref, reps: &[usize]) -> Ref {
    let n = reps.len().max(x.ndim());
    let mut base = vec![1; n - x.ndim()];
    base.extend(&x.shape);
    let mut r = vec![1; n - reps.len()];
    r.extend(reps);
    let shape: Vec<usize> = (0..n).map(|i| base[i] * r[i]).collect();
    let lead = n - x.ndim();
    gather(x, shape, |idx| Some((0..x.ndim()).map(|i| idx[lead + i] % base[lead + i]).collect()), 0.0)
}

/// `tril` (`lower`) or `triu` of the last two axes: the kept triangle, exact zeros elsewhere.
fn r_triangle(x: &Ref, k: i64, lower: bool) -> Ref {
    let nd = x.ndim();
    let mut out = x.clone();
    for i in 0..x.n() {
        let idx = unravel(i, &x.shape);
        let (r, c) = (idx[nd - 2] as i64, idx[nd - 1] as i64);
        let keep = if lower { c <= r + k } else { c >= r + k };
        if !keep {
            out.v[i] = 0.0;
            out.e[i] = 0.0;
        }
    }
    out
}

/// The rounding error of storing `y` in `d` after computing it with `ulps` units of roundoff
/// in `d`'s compute precision.
fn round_err(d: DType, y: f64, ulps: f64) -> f64 {
    if !is_float(d) {
        return 0.0;
    }
    ulps * acc_unit(d) * y.abs() + unit(d) * y.abs() + tiny(d)
}

/// How far `f` moves when its argument moves by up to `e` (interval sampling; `dom` clamps the
/// samples into the function's domain).
fn spread1(f: &dyn Fn(f64) -> f64, v: f64, e: f64, dom: (f64, f64)) -> f64 {
    if e == 0.0 {
        return 0.0;
    }
    if !e.is_finite() {
        return f64::INFINITY;
    }
    let y = f(v);
    let mut m: f64 = 0.0;
    for k in [-1.0, -0.75, -0.5, -0.25, 0.25, 0.5, 0.75, 1.0] {
        let d = (f((v + k * e).clamp(dom.0, dom.1)) - y).abs();
        if d.is_nan() {
            return f64::INFINITY;
        }
        m = m.max(d);
    }
    m * (1.0 + 1e-9)
}

fn spread2(f: &dyn Fn(f64, f64) -> f64, a: f64, ea: f64, b: f64, eb: f64) -> f64 {
    if ea == 0.0 && eb == 0.0 {
        return 0.0;
    }
    if !ea.is_finite() || !eb.is_finite() {
        return f64::INFINITY;
    }
    let y = f(a, b);
    let ks = [-1.0, -0.5, 0.0, 0.5, 1.0];
    let mut m: f64 = 0.0;
    for ka in ks {
        for kb in ks {
            let d = (f(a + ka * ea, b + kb * eb) - y).abs();
            if d.is_nan() {
                return f64::INFINITY;
            }
            m = m.max(d);
        }
    }
    m * (1.0 + 1e-9)
}

/// The rounding error of one step: none for exact operations, none for a correctly rounded
/// one (`ulps == 1`: IEEE `+ - * / sqrt`) on exact inputs whose result is representable, else
/// [`round_err`].
fn step_err(dtype: DType, y: f64, ulps: f64, exact: bool, exact_inputs: bool) -> f64 {
    if exact || (ulps == 1.0 && exact_inputs && round_to(dtype, y) == y && round_to(DType::F32, y) == y) {
        0.0
    } else {
        round_err(dtype, y, ulps)
    }
}

/// `f` of each element, in `dtype` (`exact`: no rounding; else `ulps` in compute precision).
fn r_map1(x: &Ref, dtype: DType, f: &dyn Fn(f64) -> f64, ulps: f64, exact: bool, dom: (f64, f64)) -> Ref {
    let mut out = Ref { shape: x.shape.clone(), dtype, v: Vec::with_capacity(x.n()), e: Vec::with_capacity(x.n()) };
    for (&v, &e) in x.v.iter().zip(&x.e) {
        let y = f(v);
        let err = spread1(f, v, e, dom) + step_err(dtype, y, ulps, exact, e == 0.0);
        out.v.push(y);
        out.e.push(err);
    }
    out
}

/// `f` of element pairs of two tensors of one shape, in `dtype`.
fn r_map2(a: &Ref, b: &Ref, dtype: DType, f: &dyn Fn(f64, f64) -> f64, ulps: f64, exact: bool) -> Ref {
    assert_eq!(a.shape, b.shape);
    let mut out = Ref { shape: a.shape.clone(), dtype, v: Vec::with_capacity(a.n()), e: Vec::with_capacity(a.n()) };
    for i in 0..a.n() {
        let y = f(a.v[i], b.v[i]);
        let exact_inputs = a.e[i] == 0.0 && b.e[i] == 0.0;
        let err = spread2(f, a.v[i], a.e[i], b.v[i], b.e[i]) + step_err(dtype, y, ulps, exact, exact_inputs);
        out.v.push(y);
        out.e.push(err);
    }
    out
}

/// Conversion to `d` (C-style: floats truncate into integers, non-zero is true).
fn r_cast(x: &Ref, d: DType) -> Ref {
    if x.dtype == d {
        return x.clone();
    }
    let mut out = Ref { shape: x.shape.clone(), dtype: d, v: vec![], e: vec![] };
    for (&v, &e) in x.v.iter().zip(&x.e) {
        let (y, err) = if d == DType::Bool {
            let y = (v != 0.0) as u8 as f64;
            (y, if e > 0.0 && v.abs() <= e { 1.0 } else { 0.0 })
        } else if is_float(d) {
            // Integers have no -0: the reference's `0 * -3` must not reach a float as -0.
            let v = if is_float(x.dtype) { v } else { v + 0.0 };
            // Exact when an exact value is representable (small integers, wider floats).
            (v, if e == 0.0 && round_to(d, v) == v { 0.0 } else { e + round_err(d, v, 0.0) })
        } else if is_float(x.dtype) {
            let f = |t: f64| t.trunc();
            (v.trunc(), spread1(&f, v, e, (f64::NEG_INFINITY, f64::INFINITY)))
        } else {
            (v, e)
        };
        out.v.push(y);
        out.e.push(err);
    }
    out
}

/// Whether `pred(a, b)` holds, undecided (`e = 1`) where the errors allow either answer.
fn r_compare(a: &Ref, b: &Ref, pred: fn(f64, f64) -> bool) -> Ref {
    let mut out = Ref { shape: a.shape.clone(), dtype: DType::Bool, v: vec![], e: vec![] };
    for i in 0..a.n() {
        let ed = a.e[i] + b.e[i];
        let undecided = ed > 0.0 && (a.v[i] - b.v[i]).abs() <= ed;
        out.v.push(pred(a.v[i], b.v[i]) as u8 as f64);
        out.e.push(if undecided { 1.0 } else { 0.0 });
    }
    out
}

/// Three-valued logic: `(truth, undecided)` of a value with an error bound (an undecided
/// boolean has `e = 1`).
fn truth(v: f64, e: f64) -> (bool, bool) {
    (v != 0.0, e > 0.0 && v.abs() <= e)
}

fn r_logic(a: &Ref, b: &Ref, and: bool) -> Ref {
    let mut out = Ref { shape: a.shape.clone(), dtype: DType::Bool, v: vec![], e: vec![] };
    for i in 0..a.n() {
        let (x, ux) = truth(a.v[i], a.e[i]);
        let (y, uy) = truth(b.v[i], b.e[i]);
        let both_decided = !ux && !uy;
        let (v, u) = if and {
            let v = x && y;
            // Decided when both are decided, or one decided operand is false.
            let one_false = (!ux && !x) || (!uy && !y);
            (v, !(both_decided || one_false))
        } else {
            let v = x || y;
            // Decided when both are decided, or one decided operand is true.
            let one_true = (!ux && x) || (!uy && y);
            (v, !(both_decided || one_true))
        };
        out.v.push(v as u8 as f64);
        out.e.push(if u { 1.0 } else { 0.0 });
    }
    out
}

fn r_not(a: &Ref) -> Ref {
    let mut out = Ref { shape: a.shape.clone(), dtype: DType::Bool, v: vec![], e: vec![] };
    for i in 0..a.n() {
        let (x, u) = truth(a.v[i], a.e[i]);
        out.v.push((!x) as u8 as f64);
        out.e.push(if u { 1.0 } else { 0.0 });
    }
    out
}

/// `where(c, x, y)` with broadcasting; an undecided condition allows either branch.
fn r_where(c: &Ref, x: &Ref, y: &Ref) -> Ref {
    let d = promote(x.dtype, y.dtype);
    let (x, y) = (r_cast(x, d), r_cast(y, d));
    let c = r_cast(c, DType::Bool);
    let shape =
        broadcast_shapes(&c.shape, &x.shape).and_then(|s| broadcast_shapes(&s, &y.shape)).expect("where shapes");
    let (c, x, y) = (r_broadcast(&c, &shape), r_broadcast(&x, &shape), r_broadcast(&y, &shape));
    let mut out = Ref { shape, dtype: d, v: vec![], e: vec![] };
    for i in 0..c.n() {
        let (t, u) = truth(c.v[i], c.e[i]);
        let (v, e) = if t { (x.v[i], x.e[i]) } else { (y.v[i], y.e[i]) };
        out.v.push(v);
        out.e.push(if u { (x.v[i] - y.v[i]).abs() + x.e[i].max(y.e[i]) } else { e });
    }
    out
}

/// Groups of flat indices reduced into each output element (row-major over the kept axes;
/// each group in row-major order of the reduced axes).
fn groups(shape: &[usize], axes: &[usize]) -> Vec<Vec<usize>> {
    let st = row_strides(shape);
    let kept: Vec<usize> = (0..shape.len()).filter(|a| !axes.contains(a)).collect();
    let kshape: Vec<usize> = kept.iter().map(|&a| shape[a]).collect();
    let rshape: Vec<usize> = axes.iter().map(|&a| shape[a]).collect();
    let mut out = Vec::with_capacity(numel(&kshape));
    for o in 0..numel(&kshape) {
        let ko = unravel(o, &kshape);
        let mut g = Vec::with_capacity(numel(&rshape));
        for r in 0..numel(&rshape) {
            let ro = unravel(r, &rshape);
            let mut idx = vec![0; shape.len()];
            for (i, &a) in kept.iter().enumerate() {
                idx[a] = ko[i];
            }
            for (i, &a) in axes.iter().enumerate() {
                idx[a] = ro[i];
            }
            g.push(dot(&idx, &st));
        }
        out.push(g);
    }
    out
}

fn reduced_shape(shape: &[usize], axes: &[usize], keepdims: bool) -> Vec<usize> {
    if keepdims {
        shape.iter().enumerate().map(|(i, &d)| if axes.contains(&i) { 1 } else { d }).collect()
    } else {
        shape.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, &d)| d).collect()
    }
}

/// A reduction of one group: its values and their error bounds to the reduced value and its bound.
type Fold = dyn Fn(&[f64], &[f64]) -> (f64, f64);

fn r_reduce(x: &Ref, axes: &[usize], keepdims: bool, dtype: DType, fold: &Fold) -> Ref {
    let mut out = Ref { shape: reduced_shape(&x.shape, axes, keepdims), dtype, v: vec![], e: vec![] };
    for g in groups(&x.shape, axes) {
        let vs: Vec<f64> = g.iter().map(|&i| x.v[i]).collect();
        let es: Vec<f64> = g.iter().map(|&i| x.e[i]).collect();
        let (v, e) = fold(&vs, &es);
        out.v.push(v);
        out.e.push(e);
    }
    out
}

/// An integer result outside its dtype's range wraps in nuvec (and MLX); the reference marks it
/// NaN so that the step is redrawn.
/// So does a float sum beyond the dtype's range (`mean`/`var` of `float16` store their sum in
/// `float16`, as MLX's compositions do).
fn wrapped(d: DType, y: f64) -> f64 {
    if is_int(d) {
        let (lo, hi) = int_range(d);
        if y < lo || y > hi {
            return f64::NAN;
        }
    } else if is_float(d) && y.abs() > limit(d) {
        return f64::NAN;
    }
    y
}

fn sum_fold(d: DType) -> impl Fn(&[f64], &[f64]) -> (f64, f64) {
    move |vs, es| {
        let y: f64 = wrapped(d, vs.iter().sum());
        let mag: f64 = vs.iter().map(|v| v.abs()).sum();
        let e: f64 = es.iter().sum::<f64>() + vs.len() as f64 * acc_unit(d) * mag + round_err(d, y, 0.0);
        (y, e)
    }
}

fn prod_fold(d: DType) -> impl Fn(&[f64], &[f64]) -> (f64, f64) {
    move |vs, es| {
        let y: f64 = wrapped(d, vs.iter().product());
        let hi: f64 = vs.iter().zip(es).map(|(v, e)| v.abs() + e).product();
        let lo: f64 = vs.iter().map(|v| v.abs()).product();
        let e = (hi - lo) + vs.len() as f64 * acc_unit(d) * hi + round_err(d, y, 0.0);
        (y, e)
    }
}

fn extreme_fold(max: bool) -> impl Fn(&[f64], &[f64]) -> (f64, f64) {
    move |vs, es| {
        let y = vs
            .iter()
            .copied()
            .fold(if max { f64::NEG_INFINITY } else { f64::INFINITY }, |a, b| if max { a.max(b) } else { a.min(b) });
        (y, es.iter().copied().fold(0.0, f64::max))
    }
}

fn r_sum(x: &Ref, axes: &[usize], keepdims: bool) -> Ref {
    let d = sum_dtype(x.dtype);
    r_reduce(&r_cast(x, d), axes, keepdims, d, &sum_fold(d))
}

/// `x * c` with a weak scalar `c` rounded to `x`'s dtype.
fn r_scale(x: &Ref, c: f64) -> Ref {
    let d = x.dtype;
    let mut out = x.clone();
    for i in 0..x.n() {
        let y = x.v[i] * c;
        out.v[i] = y;
        out.e[i] = x.e[i] * c.abs() + unit(d) * y.abs() + round_err(d, y, 1.0);
    }
    out
}

fn r_mean(x: &Ref, axes: &[usize], keepdims: bool) -> Ref {
    let n: usize = axes.iter().map(|&a| x.shape[a]).product();
    let s = r_cast(&r_sum(x, axes, keepdims), at_least_float(x.dtype));
    r_scale(&s, 1.0 / n as f64)
}

fn r_binary(op: &Bn, a: &Ref, b: &Ref) -> Ref {
    let promoted = promote(a.dtype, b.dtype);
    let cd = bin_compute_dtype(op.kind, promoted).expect("generator only draws valid binary dtypes");
    let shape = broadcast_shapes(&a.shape, &b.shape).expect("generator only draws broadcastable shapes");
    let (a, b) = (r_broadcast(&r_cast(a, cd), &shape), r_broadcast(&r_cast(b, cd), &shape));
    match op.kind {
        BK::Compare(pred) => r_compare(&a, &b, pred),
        BK::Logic(and) => r_logic(&a, &b, and),
        BK::FloorDiv if is_float(cd) => {
            // floor(q) of the rounded quotient (rounded to the element type for half precision,
            // as MLX): undecided where rounding can reach an integer.
            let u = unit(cd).max(acc_unit(cd));
            let mut out = r_map2(&a, &b, cd, &|x, y| (x / y).floor(), 0.0, true);
            for i in 0..out.n() {
                let q = a.v[i] / b.v[i];
                if (q - q.round()).abs() <= 4.0 * u * q.abs() && q != q.round() {
                    out.e[i] += 1.0;
                }
            }
            out
        }
        BK::Atan2 => {
            // The sign of an exact zero is not tracked reliably (reductions of +-0 depend on
            // order): at a zero on the branch cut or at the origin, any angle goes.
            let mut out = r_map2(&a, &b, cd, &op.f, 8.0, false);
            for i in 0..out.n() {
                // y == 0 with x <= 0: the branch cut (x < 0) and the origin (x == 0).
                if a.v[i] == 0.0 && b.v[i] <= 0.0 {
                    out.e[i] = out.e[i].max(2.0 * std::f64::consts::PI);
                }
            }
            out
        }
        BK::Rem if is_float(cd) => {
            // A sawtooth of period |b|: widely uncertain inputs can land anywhere in it.
            let mut out = r_map2(&a, &b, cd, &op.f, 1.0, false);
            for i in 0..out.n() {
                let (p, ea, eb) = (b.v[i].abs(), a.e[i], b.e[i]);
                if ea > p / 8.0 || eb * (a.v[i] / b.v[i]).abs() > p / 8.0 {
                    out.e[i] = out.e[i].max(p + eb);
                }
            }
            out
        }
        BK::LogAddExp => {
            // `max + log1p(exp(-|a - b|))` cancels: its rounding scales with the larger operand.
            let mut out = r_map2(&a, &b, cd, &op.f, 8.0, false);
            for i in 0..out.n() {
                out.e[i] += 4.0 * acc_unit(cd) * (a.v[i].max(b.v[i]).abs() + 1.0);
            }
            out
        }
        // `ulps == 1`: correctly rounded (`+ - * /`, and `remainder`'s exact fmod plus one add).
        k => r_map2(
            &a,
            &b,
            cd,
            &op.f,
            if matches!(k, BK::Pow | BK::Atan2 | BK::LogAddExp) { 8.0 } else { 1.0 },
            !is_float(cd) || matches!(k, BK::MaxMin),
        ),
    }
}

fn var_of(x: &Ref, axes: &[usize], keepdims: bool, ddof: usize) -> Ref {
    let xf = r_cast(x, at_least_float(x.dtype));
    let mu = r_mean(&xf, axes, true);
    let sub = bins().into_iter().find(|b| b.name == "subtract").expect("subtract");
    let d = r_binary(&sub, &xf, &mu);
    let sq = r_map1(&d, d.dtype, &|v| v * v, 1.0, false, (f64::NEG_INFINITY, f64::INFINITY));
    let n: usize = axes.iter().map(|&a| x.shape[a]).product();
    let divisor = (n as f64 - ddof as f64).max(0.0);
    r_scale(&r_sum(&sq, axes, keepdims), 1.0 / divisor)
}

fn r_logsumexp(x: &Ref, axes: &[usize], keepdims: bool) -> Ref {
    let d = at_least_float(x.dtype);
    let x = r_cast(x, d);
    let fold = move |vs: &[f64], es: &[f64]| {
        let m = vs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = vs.iter().map(|v| (v - m).exp()).sum();
        let y = m + s.ln();
        let spread = vs.iter().map(|v| (v - m).abs()).fold(0.0, f64::max);
        let emax = es.iter().copied().fold(0.0, f64::max);
        let e = emax + acc_unit(d) * (vs.len() as f64 + 8.0 + 2.0 * spread + 2.0 * m.abs()) + round_err(d, y, 2.0);
        (y, e)
    };
    r_reduce(&x, axes, keepdims, d, &fold)
}

fn r_softmax(x: &Ref, axes: &[usize]) -> Ref {
    let d = at_least_float(x.dtype);
    let x = r_cast(x, d);
    let mut out = Ref { shape: x.shape.clone(), dtype: d, v: vec![0.0; x.n()], e: vec![0.0; x.n()] };
    for g in groups(&x.shape, axes) {
        let m = g.iter().map(|&i| x.v[i]).fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = g.iter().map(|&i| (x.v[i] - m).exp()).sum();
        let emax = g.iter().map(|&i| x.e[i]).fold(0.0, f64::max);
        let spread = g.iter().map(|&i| (x.v[i] - m).abs()).fold(0.0, f64::max);
        for &i in &g {
            let p = (x.v[i] - m).exp() / s;
            out.v[i] = p;
            out.e[i] = p * ((2.0 * emax).exp_m1() + acc_unit(d) * (g.len() as f64 + 8.0 + 2.0 * spread))
                + round_err(d, p, 0.0);
        }
    }
    out
}

/// Index of the first extreme along `axis` (`u32`); undecided (`e = inf`) where errors allow
/// another index.
fn r_argext(x: &Ref, axis: usize, keepdims: bool, max: bool) -> Ref {
    let mut out = Ref { shape: reduced_shape(&x.shape, &[axis], keepdims), dtype: DType::U32, v: vec![], e: vec![] };
    for g in groups(&x.shape, &[axis]) {
        let better = |a: f64, b: f64| if max { a > b } else { a < b };
        let mut at = 0;
        for (j, &i) in g.iter().enumerate() {
            if better(x.v[i], x.v[g[at]]) {
                at = j;
            }
        }
        let (bv, be) = (x.v[g[at]], x.e[g[at]]);
        let decided = g.iter().enumerate().all(|(j, &i)| {
            if j == at {
                return true;
            }
            let ed = be + x.e[i];
            if ed == 0.0 {
                better(bv, x.v[i]) || (bv == x.v[i] && j > at)
            } else {
                (bv - x.v[i]).abs() > ed && better(bv, x.v[i])
            }
        });
        out.v.push(at as f64);
        out.e.push(if decided { 0.0 } else { f64::INFINITY });
    }
    out
}

/// `all` (`and`) or `any` over axes of the elements' truth.
fn r_all_any(x: &Ref, axes: &[usize], keepdims: bool, and: bool) -> Ref {
    let fold = move |vs: &[f64], es: &[f64]| {
        let t: Vec<(bool, bool)> = vs.iter().zip(es).map(|(&v, &e)| truth(v, e)).collect();
        let (v, undecided) = if and {
            let v = t.iter().all(|p| p.0);
            (v, !(t.iter().any(|p| !p.1 && !p.0) || t.iter().all(|p| !p.1)))
        } else {
            let v = t.iter().any(|p| p.0);
            (v, !(t.iter().any(|p| !p.1 && p.0) || t.iter().all(|p| !p.1)))
        };
        (v as u8 as f64, if undecided { 1.0 } else { 0.0 })
    };
    r_reduce(x, axes, keepdims, DType::Bool, &fold)
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum ScanK {
    Sum,
    Prod,
    Max,
    Min,
    LogAddExp,
}

fn r_scan(x: &Ref, axis: Option<usize>, k: ScanK, reverse: bool, exclusive: bool) -> Ref {
    let (x, axis) = match axis {
        Some(a) => (x.clone(), a),
        None => (x.with_shape(vec![x.n()]), 0),
    };
    let d = match k {
        ScanK::Sum if x.dtype == DType::Bool => DType::I32,
        ScanK::LogAddExp => at_least_float(x.dtype),
        _ => x.dtype,
    };
    let x = r_cast(&x, d);
    let mut out = Ref { shape: x.shape.clone(), dtype: d, v: vec![0.0; x.n()], e: vec![0.0; x.n()] };
    let (lo, hi) = if is_float(d) { (f64::NEG_INFINITY, f64::INFINITY) } else { int_range(d) };
    let acc = acc_unit(d);
    let init = match k {
        ScanK::Sum => 0.0,
        ScanK::Prod => 1.0,
        ScanK::Max | ScanK::LogAddExp => lo,
        ScanK::Min => hi,
    };
    for g in groups(&x.shape, &[axis]) {
        let order: Vec<usize> = if reverse { g.iter().rev().copied().collect() } else { g.clone() };
        // Inclusive running values and their bounds.
        let (mut y, mut ey) = (init, 0.0);
        let (mut mag, mut hi_prod, mut lo_prod, mut lae_err) = (0.0, 1.0, 1.0, 0.0);
        let mut incl = Vec::with_capacity(order.len());
        for (j, &i) in order.iter().enumerate() {
            let (v, e) = (x.v[i], x.e[i]);
            let steps = (j + 1) as f64;
            let bound = match k {
                ScanK::Sum => {
                    y += v;
                    mag += v.abs();
                    ey += e;
                    if is_float(d) { ey + steps * acc * mag + round_err(d, y, 0.0) } else { ey }
                }
                ScanK::Prod => {
                    y *= v;
                    hi_prod *= v.abs() + e;
                    lo_prod *= v.abs();
                    if is_float(d) {
                        (hi_prod - lo_prod) + steps * acc * hi_prod + round_err(d, y, 0.0)
                    } else {
                        hi_prod - lo_prod
                    }
                }
                ScanK::Max | ScanK::Min => {
                    y = if k == ScanK::Max { y.max(v) } else { y.min(v) };
                    ey = ey.max(e);
                    ey
                }
                ScanK::LogAddExp => {
                    let m = y.max(v);
                    y = if m == f64::NEG_INFINITY { m } else { m + ((y - m).exp() + (v - m).exp()).ln() };
                    ey = ey.max(e);
                    lae_err += 4.0 * acc * (y.abs() + v.abs() + 1.0);
                    ey + lae_err + round_err(d, y, 0.0)
                }
            };
            incl.push((y, bound));
        }
        for (j, &i) in order.iter().enumerate() {
            let (v, e) = if !exclusive {
                incl[j]
            } else if j == 0 {
                (init, 0.0)
            } else {
                incl[j - 1]
            };
            out.v[i] = v;
            out.e[i] = e;
        }
    }
    out
}

/// `a @ b` with NumPy's rules for 1-d operands and batch broadcasting.
fn r_matmul(a: &Ref, b: &Ref) -> Ref {
    let d = promote(a.dtype, b.dtype);
    let (a, b) = (r_cast(a, d), r_cast(b, d));
    let a2 = if a.ndim() == 1 { a.with_shape(vec![1, a.n()]) } else { a.clone() };
    let b2 = if b.ndim() == 1 { b.with_shape(vec![b.n(), 1]) } else { b.clone() };
    let (ra, rb) = (a2.ndim(), b2.ndim());
    let (m, k, n) = (a2.shape[ra - 2], a2.shape[ra - 1], b2.shape[rb - 1]);
    let batch = broadcast_shapes(&a2.shape[..ra - 2], &b2.shape[..rb - 2]).expect("matmul batch");
    let mut sa = batch.clone();
    sa.extend([m, k]);
    let mut sb = batch.clone();
    sb.extend([k, n]);
    let (a3, b3) = (r_broadcast(&a2, &sa), r_broadcast(&b2, &sb));
    let nb = numel(&batch);
    // f16 products may accumulate in f16; everything else accumulates in f32 or better.
    let u_mm = if d == DType::F16 { unit(d) } else { acc_unit(d) };
    let mut out = Ref { shape: vec![], dtype: d, v: vec![], e: vec![] };
    for bi in 0..nb {
        for i in 0..m {
            for j in 0..n {
                let (mut y, mut mag, mut prop) = (0.0, 0.0, 0.0);
                for l in 0..k {
                    let ia = bi * m * k + i * k + l;
                    let ib = bi * k * n + l * n + j;
                    let (x, ex, z, ez) = (a3.v[ia], a3.e[ia], b3.v[ib], b3.e[ib]);
                    y += x * z;
                    mag += (x * z).abs();
                    prop += x.abs() * ez + z.abs() * ex + ex * ez;
                }
                out.v.push(y);
                out.e.push(if is_float(d) {
                    prop + (k as f64 + 2.0) * u_mm * mag + round_err(d, y, 0.0)
                } else {
                    prop
                });
            }
        }
    }
    let mut shape = batch;
    if a.ndim() > 1 {
        shape.push(m);
    }
    if b.ndim() > 1 {
        shape.push(n);
    }
    out.shape = shape;
    out
}

// ---- special functions the reference needs (std has no erf) ------------------------------

/// erf to a few ulps: below 1, `2/sqrt(pi) * exp(-x^2) * sum 2^n x^(2n+1) / (2n+1)!!` (all
/// terms positive, so no cancellation); above, Laplace's continued fraction of erfc.
fn erf(x: f64) -> f64 {
    let ax = x.abs();
    let r = if ax < 1.0 {
        let (mut term, mut sum, mut n) = (ax, ax, 0.0);
        loop {
            n += 1.0;
            term *= 2.0 * ax * ax / (2.0 * n + 1.0);
            sum += term;
            if term <= 1e-17 * sum || n > 1000.0 {
                break;
            }
        }
        2.0 / std::f64::consts::PI.sqrt() * (-ax * ax).exp() * sum
    } else if ax < 7.0 {
        let mut k = ax;
        for n in (1..=200).rev() {
            k = ax + (n as f64 / 2.0) / k;
        }
        1.0 - (-ax * ax).exp() / (std::f64::consts::PI.sqrt() * k)
    } else {
        1.0
    };
    r.copysign(x)
}

/// Inverse of [`erf`] on (-1, 1) by bisection then Newton.
fn erfinv(y: f64) -> f64 {
    if !(-1.0..=1.0).contains(&y) {
        return f64::NAN;
    }
    if y.abs() == 1.0 {
        return f64::INFINITY.copysign(y);
    }
    let (mut lo, mut hi) = (-6.0, 6.0);
    for _ in 0..60 {
        let mid = 0.5 * (lo + hi);
        if erf(mid) < y {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let mut x = 0.5 * (lo + hi);
    for _ in 0..3 {
        x -= (erf(x) - y) / (2.0 / std::f64::consts::PI.sqrt() * (-x * x).exp());
    }
    x
}

// ------------------------------------------------------------------------------------------
// Operation tables: each entry pairs a nuvec call with its reference function.

#[derive(Clone, Copy, PartialEq, Debug)]
enum Dom {
    All,
    /// Strictly positive (log, sqrt, ...).
    Pos,
    /// Above −1 (log1p).
    AboveMinusOne,
    /// Inside (−1, 1) (arcsin, arctanh, erfinv, ...).
    Unit,
    /// Above 1 (arccosh).
    AboveOne,
    /// Away from the poles of tan.
    Tan,
    /// Bounded so that exponentials stay finite.
    Bounded,
    /// Away from zero (reciprocal).
    NonZero,
}

#[derive(Clone, Copy)]
struct Un {
    name: &'static str,
    nv: fn(&Array) -> Array,
    f: fn(f64) -> f64,
    dom: Dom,
    /// Transcendental: integers compute in `f32`; `ulps` of error in compute precision.
    math: bool,
    ulps: f64,
    exact: bool,
}

fn unaries() -> Vec<Un> {
    let u = |name, nv, f, dom, math, ulps, exact| Un { name, nv, f, dom, math, ulps, exact };
    vec![
        u("abs", Array::abs as fn(&Array) -> Array, f64::abs as fn(f64) -> f64, Dom::All, false, 0.0, true),
        u("negative", Array::negative, |x| -x, Dom::All, false, 0.0, true),
        u("square", Array::square, |x| x * x, Dom::All, false, 1.0, false),
        u(
            "sign",
            Array::sign,
            |x| {
                if x > 0.0 {
                    1.0
                } else if x < 0.0 {
                    -1.0
                } else {
                    0.0
                }
            },
            Dom::All,
            false,
            0.0,
            true,
        ),
        u("floor", Array::floor, f64::floor, Dom::All, false, 0.0, true),
        u("ceil", Array::ceil, f64::ceil, Dom::All, false, 0.0, true),
        u("round", Array::round, f64::round_ties_even, Dom::All, false, 0.0, true),
        u("exp", Array::exp, f64::exp, Dom::Bounded, true, 8.0, false),
        u("expm1", Array::expm1, f64::exp_m1, Dom::Bounded, true, 8.0, false),
        u("log", Array::log, f64::ln, Dom::Pos, true, 8.0, false),
        u("log1p", Array::log1p, f64::ln_1p, Dom::AboveMinusOne, true, 8.0, false),
        u("log2", Array::log2, f64::log2, Dom::Pos, true, 8.0, false),
        u("log10", Array::log10, f64::log10, Dom::Pos, true, 8.0, false),
        u("sqrt", Array::sqrt, f64::sqrt, Dom::Pos, true, 1.0, false),
        u("rsqrt", Array::rsqrt, |x| 1.0 / x.sqrt(), Dom::Pos, true, 4.0, false),
        u("reciprocal", Array::reciprocal, |x| 1.0 / x, Dom::NonZero, true, 1.0, false),
        u("sin", Array::sin, f64::sin, Dom::All, true, 8.0, false),
        u("cos", Array::cos, f64::cos, Dom::All, true, 8.0, false),
        u("tan", Array::tan, f64::tan, Dom::Tan, true, 8.0, false),
        u("arcsin", Array::arcsin, f64::asin, Dom::Unit, true, 8.0, false),
        u("arccos", Array::arccos, f64::acos, Dom::Unit, true, 8.0, false),
        u("arctan", Array::arctan, f64::atan, Dom::All, true, 8.0, false),
        u("sinh", Array::sinh, f64::sinh, Dom::Bounded, true, 8.0, false),
        u("cosh", Array::cosh, f64::cosh, Dom::Bounded, true, 8.0, false),
        u("tanh", Array::tanh, f64::tanh, Dom::All, true, 8.0, false),
        u("arcsinh", Array::arcsinh, f64::asinh, Dom::All, true, 8.0, false),
        u("arccosh", Array::arccosh, f64::acosh, Dom::AboveOne, true, 8.0, false),
        u("arctanh", Array::arctanh, f64::atanh, Dom::Unit, true, 8.0, false),
        u("sigmoid", Array::sigmoid, |x| 1.0 / (1.0 + (-x).exp()), Dom::All, true, 8.0, false),
        u("erf", Array::erf, erf, Dom::All, true, 8.0, false),
        u("erfinv", Array::erfinv, erfinv, Dom::Unit, true, 8.0, false),
    ]
}

/// Kinds of binary operations, for dtype rules and bounds.
#[derive(Clone, Copy, Debug)]
enum BK {
    Arith,
    /// True division: integers divide in `f32`.
    Div,
    FloorDiv,
    Rem,
    Pow,
    MaxMin,
    Atan2,
    LogAddExp,
    Bitwise,
    Shift,
    Compare(fn(f64, f64) -> bool),
    Logic(bool),
}

#[derive(Clone, Copy)]
struct Bn {
    name: &'static str,
    nv: fn(ScalarOrArray, ScalarOrArray) -> Array,
    f: fn(f64, f64) -> f64,
    kind: BK,
}

fn int_of(x: f64) -> i64 {
    x as i64
}

fn bins() -> Vec<Bn> {
    let b = |name, nv, f, kind| Bn { name, nv, f, kind };
    type Nv = fn(ScalarOrArray, ScalarOrArray) -> Array;
    type F = fn(f64, f64) -> f64;
    let none: F = |_, _| f64::NAN;
    vec![
        b("add", (|a, b| ops::add(a, b)) as Nv, (|x, y| x + y) as F, BK::Arith),
        b("subtract", |a, b| ops::subtract(a, b), |x, y| x - y, BK::Arith),
        b("multiply", |a, b| ops::multiply(a, b), |x, y| x * y, BK::Arith),
        b("divide", |a, b| ops::divide(a, b), |x, y| x / y, BK::Div),
        b("floor_divide", |a, b| ops::floor_divide(a, b), |x, y| (x / y).floor(), BK::FloorDiv),
        b(
            "remainder",
            |a, b| ops::remainder(a, b),
            |x, y| {
                let r = x % y;
                if r != 0.0 && ((r < 0.0) != (y < 0.0)) { r + y } else { r }
            },
            BK::Rem,
        ),
        b("power", |a, b| ops::power(a, b), f64::powf, BK::Pow),
        // MLX's `x > y ? x : y` (NaN first): max(-0, +0) is +0.
        b("maximum", |a, b| ops::maximum(a, b), |x, y| if x.is_nan() || x > y { x } else { y }, BK::MaxMin),
        b("minimum", |a, b| ops::minimum(a, b), |x, y| if x.is_nan() || x < y { x } else { y }, BK::MaxMin),
        b("arctan2", |a, b| ops::arctan2(a, b), f64::atan2, BK::Atan2),
        b(
            "logaddexp",
            |a, b| ops::logaddexp(a, b),
            |x, y| {
                let m = x.max(y);
                m + ((x - m).exp() + (y - m).exp()).ln()
            },
            BK::LogAddExp,
        ),
        b("bitwise_and", |a, b| ops::bitwise_and(a, b), |x, y| (int_of(x) & int_of(y)) as f64, BK::Bitwise),
        b("bitwise_or", |a, b| ops::bitwise_or(a, b), |x, y| (int_of(x) | int_of(y)) as f64, BK::Bitwise),
        b("bitwise_xor", |a, b| ops::bitwise_xor(a, b), |x, y| (int_of(x) ^ int_of(y)) as f64, BK::Bitwise),
        b("left_shift", |a, b| ops::left_shift(a, b), |x, y| x * 2f64.powi(y as i32), BK::Shift),
        b("right_shift", |a, b| ops::right_shift(a, b), |x, y| (x / 2f64.powi(y as i32)).floor(), BK::Shift),
        b("equal", |a, b| ops::equal(a, b), none, BK::Compare(|x, y| x == y)),
        b("not_equal", |a, b| ops::not_equal(a, b), none, BK::Compare(|x, y| x != y)),
        b("less", |a, b| ops::less(a, b), none, BK::Compare(|x, y| x < y)),
        b("less_equal", |a, b| ops::less_equal(a, b), none, BK::Compare(|x, y| x <= y)),
        b("greater", |a, b| ops::greater(a, b), none, BK::Compare(|x, y| x > y)),
        b("greater_equal", |a, b| ops::greater_equal(a, b), none, BK::Compare(|x, y| x >= y)),
        b("logical_and", |a, b| ops::logical_and(a, b), none, BK::Logic(true)),
        b("logical_or", |a, b| ops::logical_or(a, b), none, BK::Logic(false)),
    ]
}

fn bin(name: &str) -> Bn {
    bins().into_iter().find(|b| b.name == name).unwrap_or_else(|| panic!("no binary op {name}"))
}

fn un(name: &str) -> Un {
    unaries().into_iter().find(|u| u.name == name).unwrap_or_else(|| panic!("no unary op {name}"))
}

/// The dtype both operands are cast to (MLX's rules), or `None` when the op rejects it.
fn bin_compute_dtype(k: BK, promoted: DType) -> Option<DType> {
    match k {
        BK::Div | BK::LogAddExp | BK::Atan2 => Some(at_least_float(promoted)),
        BK::Logic(_) => Some(DType::Bool),
        BK::Bitwise => (promoted == DType::Bool || is_int(promoted)).then_some(promoted),
        BK::Shift => is_int(promoted).then_some(promoted),
        _ => Some(promoted),
    }
}

// ------------------------------------------------------------------------------------------
// nuvec side: building arrays from reference values and reading results back.

fn make_array(v: &[f64], shape: &[usize], d: DType) -> Array {
    macro_rules! typed {
        ($t:ty, $conv:expr) => {{
            let data: Vec<$t> = v.iter().map(|&x| $conv(x)).collect();
            Array::from_slice(&data, shape.to_vec())
        }};
    }
    match d {
        DType::Bool => typed!(bool, |x: f64| x != 0.0),
        DType::U8 => typed!(u8, |x: f64| x as u8),
        DType::U16 => typed!(u16, |x: f64| x as u16),
        DType::U32 => typed!(u32, |x: f64| x as u32),
        DType::U64 => typed!(u64, |x: f64| x as u64),
        DType::I8 => typed!(i8, |x: f64| x as i8),
        DType::I16 => typed!(i16, |x: f64| x as i16),
        DType::I32 => typed!(i32, |x: f64| x as i32),
        DType::I64 => typed!(i64, |x: f64| x as i64),
        DType::F16 => typed!(f16, f16::from_f64),
        DType::BF16 => typed!(bf16, bf16::from_f64),
        DType::F32 => typed!(f32, |x: f64| x as f32),
        DType::F64 => typed!(f64, |x: f64| x),
        d => panic!("no host type for {d}"),
    }
}

fn read(a: &Array) -> Result<Vec<f64>, String> {
    fn conv<T: nuvec::Element + Copy>(a: &Array, f: impl Fn(T) -> f64) -> Result<Vec<f64>, String> {
        a.to_vec::<T>().map(|v| v.into_iter().map(f).collect()).map_err(|e| e.to_string())
    }
    match a.dtype() {
        DType::Bool => conv::<bool>(a, |x| x as u8 as f64),
        DType::U8 => conv::<u8>(a, |x| x as f64),
        DType::U16 => conv::<u16>(a, |x| x as f64),
        DType::U32 => conv::<u32>(a, |x| x as f64),
        DType::U64 => conv::<u64>(a, |x| x as f64),
        DType::I8 => conv::<i8>(a, |x| x as f64),
        DType::I16 => conv::<i16>(a, |x| x as f64),
        DType::I32 => conv::<i32>(a, |x| x as f64),
        DType::I64 => conv::<i64>(a, |x| x as f64),
        DType::F16 => conv::<f16>(a, |x| x.to_f64()),
        DType::BF16 => conv::<bf16>(a, |x| x.to_f64()),
        DType::F32 => conv::<f32>(a, |x| x as f64),
        DType::F64 => conv::<f64>(a, |x| x),
        d => Err(format!("unexpected dtype {d}")),
    }
}

fn fmt_vals(v: &[f64]) -> String {
    let items: Vec<String> = v.iter().map(|x| format!("{x}")).collect();
    format!("[{}]", items.join(", "))
}

fn dims(s: &[usize]) -> Vec<i32> {
    s.iter().map(|&d| d as i32).collect()
}

/// Compares nuvec's values with the reference: within twice the bound, NaN equal to NaN.
fn compare(got: &[f64], r: &Ref) -> Vec<String> {
    let mut bad = Vec::new();
    if got.len() != r.n() {
        bad.push(format!("nuvec gave {} elements, the reference {}", got.len(), r.n()));
        return bad;
    }
    for (i, &g) in got.iter().enumerate() {
        let (w, e) = (r.v[i], r.e[i]);
        let ok = if w.is_nan() {
            g.is_nan()
        } else if w.is_infinite() {
            g == w || e.is_infinite()
        } else if !e.is_finite() || (r.dtype == DType::Bool && e >= 1.0) {
            true
        } else if e == 0.0 {
            g == w
        } else {
            (g - w).abs() <= 2.0 * e
        };
        stats::ratio(r.dtype, g, w, e);
        if !ok {
            bad.push(format!(
                "  [{i}] at {:?}: nuvec {g}, reference {w}, allowed error {:.3e}, actual error {:.3e}",
                unravel(i, &r.shape),
                2.0 * e,
                (g - w).abs()
            ));
        }
    }
    bad
}

// ------------------------------------------------------------------------------------------
// Chains.

/// An array with its reference and its name in the chain's log.
#[derive(Clone)]
struct Val {
    a: Array,
    r: Ref,
    name: String,
}

/// A weak Rust scalar operand.
#[derive(Clone, Copy, Debug)]
enum Sc {
    F(f64),
    I(i64),
}

impl Sc {
    fn value(self) -> f64 {
        match self {
            Sc::F(v) => v,
            Sc::I(v) => v as f64,
        }
    }
    fn nv(self) -> ScalarOrArray {
        match self {
            Sc::F(v) => v.into(),
            Sc::I(v) => v.into(),
        }
    }
}

#[derive(Clone)]
enum Opnd {
    A(Val),
    S(Sc),
}

impl Opnd {
    fn nv(&self) -> ScalarOrArray {
        match self {
            Opnd::A(v) => ScalarOrArray::from(&v.a),
            Opnd::S(s) => s.nv(),
        }
    }
    fn label(&self) -> String {
        match self {
            Opnd::A(v) => v.name.clone(),
            Opnd::S(Sc::F(x)) => format!("{x:?}"),
            Opnd::S(Sc::I(x)) => format!("{x}"),
        }
    }
    /// The reference operand; a weak scalar takes its dtype from `other`.
    fn r(&self, other: DType) -> Ref {
        match self {
            Opnd::A(v) => v.r.clone(),
            Opnd::S(s) => {
                let d = weak_dtype(*s, other);
                Ref::exact(vec![], d, vec![round_to(d, s.value())])
            }
        }
    }
    fn dtype(&self) -> Option<DType> {
        match self {
            Opnd::A(v) => Some(v.r.dtype),
            Opnd::S(_) => None,
        }
    }
}

/// How fresh input values are drawn.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Vk {
    General,
    /// Magnitude in [0.5, 3], random sign (denominators).
    AwayFromZero,
    /// In [0.5, 2.5] (bases of powers).
    Positive,
    /// Small exponents / shift amounts.
    Small,
    /// Few distinct values (ties).
    Ties,
}

type Res<T> = Result<T, String>;

struct Chain {
    log: Vec<String>,
    counter: usize,
    /// Set when an intermediate of the current step left its dtype's range (the step is
    /// redrawn: wrapping or overflow is not what the reference models).
    spoiled: bool,
}

const MAX_ELEMS: usize = 384;

impl Chain {
    fn name(&mut self) -> String {
        self.counter += 1;
        format!("t{}", self.counter)
    }

    /// Records a step: checks that nuvec accepted it with the reference's shape and dtype.
    fn rec(&mut self, lines: &mut Vec<String>, desc: String, a: Array, r: Ref) -> Res<Val> {
        let name = self.name();
        lines.push(format!("{name} = {desc}  -> {} {:?}", r.dtype, r.shape));
        if let Some(e) = a.error() {
            return Err(format!("nuvec rejected a valid call: {e}"));
        }
        if a.shape() != dims(&r.shape).as_slice() || a.dtype() != r.dtype {
            return Err(format!(
                "nuvec recorded shape {:?} and dtype {}, the reference says {:?} and {}",
                a.shape(),
                a.dtype(),
                r.shape,
                r.dtype
            ));
        }
        if !in_range(&r) {
            self.spoiled = true;
        }
        Ok(Val { a, r, name })
    }

    /// Values for a fresh input of `n` elements.
    fn values(rng: &mut Rng, n: usize, d: DType, vk: Vk) -> Vec<f64> {
        (0..n)
            .map(|_| {
                let x = if d == DType::Bool {
                    rng.below(2) as f64
                } else if is_float(d) {
                    match vk {
                        Vk::General => (rng.unit() * 5.0 - 2.5) * if rng.chance(0.1) { 0.01 } else { 1.0 },
                        Vk::AwayFromZero => (0.5 + rng.unit() * 2.5) * if rng.chance(0.5) { -1.0 } else { 1.0 },
                        Vk::Positive => 0.5 + rng.unit() * 2.0,
                        Vk::Small => rng.range(-2, 2) as f64 * 0.5,
                        Vk::Ties => rng.range(-2, 2) as f64 * 0.5,
                    }
                } else {
                    let (lo, hi) = if is_unsigned(d) { (0, 9) } else { (-6, 6) };
                    match vk {
                        Vk::General | Vk::Ties => rng.range(lo, hi) as f64,
                        Vk::AwayFromZero => {
                            let m = rng.range(1, 5) as f64;
                            if is_unsigned(d) || rng.chance(0.5) { m } else { -m }
                        }
                        Vk::Positive => rng.range(1, 3) as f64,
                        Vk::Small => rng.range(0, 3) as f64,
                    }
                };
                round_to(d, x)
            })
            .collect()
    }

    /// A fresh input of `shape` and `d`, built with a random layout (plain, transposed,
    /// strided, reversed, lazily reshaped) or a creation op.
    fn fresh(&mut self, rng: &mut Rng, lines: &mut Vec<String>, shape: &[usize], d: DType, vk: Vk) -> Res<Val> {
        let n = numel(shape);
        let v = Chain::values(rng, n, d, vk);
        let r = Ref::exact(shape.to_vec(), d, v.clone());
        let nd = shape.len();
        // Constants and ranges only where any values will do.
        let general = matches!(vk, Vk::General | Vk::Ties);
        let how = rng.weighted(&[10, 3, 3, 2, if general { 2 } else { 0 }, if general { 1 } else { 0 }]);
        let (a, desc) = match how {
            1 if nd >= 2 => {
                // Stored with permuted axes, transposed back.
                let mut perm: Vec<usize> = (0..nd).collect();
                rng.shuffle(&mut perm);
                let stored = r_transpose(&r, &perm);
                let mut inv = vec![0i32; nd];
                for (i, &p) in perm.iter().enumerate() {
                    inv[p] = i as i32;
                }
                let a = make_array(&stored.v, &stored.shape, d).transpose(&inv);
                (a, format!("input stored as {:?} then transpose({inv:?})", stored.shape))
            }
            2 if nd >= 1 => {
                // A strided window of a larger array: every axis steps by 2, -1 or 1 with offset.
                let mut big_shape = Vec::new();
                let (mut start, mut stop, mut step) = (vec![], vec![], vec![]);
                for &dim in shape {
                    match rng.below(3) {
                        0 => {
                            big_shape.push(2 * dim + 1);
                            start.push(1);
                            stop.push((2 * dim + 1) as i32);
                            step.push(2);
                        }
                        1 => {
                            big_shape.push(dim);
                            start.push(dim as i32 - 1);
                            stop.push(-(dim as i32) - 1);
                            step.push(-1);
                        }
                        _ => {
                            big_shape.push(dim + 2);
                            start.push(1);
                            stop.push(dim as i32 + 1);
                            step.push(1);
                        }
                    }
                }
                // Fill the big array with junk, then place the values where the slice reads.
                let mut big = Chain::values(rng, numel(&big_shape), d, Vk::General);
                let bst = row_strides(&big_shape);
                for (i, &vi) in v.iter().enumerate() {
                    let idx = unravel(i, shape);
                    let src: Vec<usize> = (0..nd)
                        .map(|k| {
                            let (first, _) = py_slice(start[k], stop[k], step[k], big_shape[k]);
                            (first + idx[k] as i64 * step[k] as i64) as usize
                        })
                        .collect();
                    big[dot(&src, &bst)] = vi;
                }
                let a = make_array(&big, &big_shape, d).slice(&start, &stop, &step);
                (a, format!("input: slice {start:?}:{stop:?}:{step:?} of {big_shape:?} {}", fmt_vals(&big)))
            }
            3 => (make_array(&v, &[n], d).reshape(dims(shape)), format!("input stored flat [{n}] then reshape")),
            4 if n > 0 && d != DType::Bool => {
                // A constant from `full`.
                let c = v[0];
                let r = Ref::exact(shape.to_vec(), d, vec![c; n]);
                let a = ops::full_dtype(dims(shape), c, d);
                let desc = format!("full({:?}, {c}, {d})", dims(shape));
                return self.rec(lines, desc, a, r);
            }
            5 if nd == 1 && d != DType::Bool => {
                // arange with a step that lands exactly on `n` elements.
                let step = rng.pick(&[1.0, 2.0, -1.0, 0.5]);
                let step = if is_unsigned(d) || !is_float(d) && step == 0.5 { 1.0 } else { step };
                let start = if is_unsigned(d) { 0.0 } else { rng.range(-3, 3) as f64 };
                let stop = start + n as f64 * step;
                let vals: Vec<f64> = (0..n).map(|i| round_to(d, start + i as f64 * step)).collect();
                let r = Ref::exact(shape.to_vec(), d, vals);
                let a = ops::arange_dtype(start, stop, step, d);
                return self.rec(lines, format!("arange({start}, {stop}, {step}, {d})"), a, r);
            }
            _ => (make_array(&v, shape, d), "input".to_string()),
        };
        self.rec(lines, format!("{desc} {d} {shape:?} = {}", fmt_vals(&v)), a, r)
    }

    fn unary(&mut self, lines: &mut Vec<String>, x: &Val, op: &Un) -> Res<Val> {
        let d = if op.math { at_least_float(x.r.dtype) } else { x.r.dtype };
        let xr = r_cast(&x.r, d);
        let dom = if op.name == "sqrt" { (0.0, f64::INFINITY) } else { (f64::NEG_INFINITY, f64::INFINITY) };
        let mut r = if !is_float(d) {
            // Integer abs/sign/negative/square/floor/...: exact.
            r_map1(&xr, d, &op.f, 0.0, true, dom)
        } else {
            r_map1(&xr, d, &op.f, op.ulps, op.exact, dom)
        };
        if op.name == "sin" || op.name == "cos" {
            // Sampling cannot follow the oscillation of a widely uncertain argument.
            for i in 0..r.n() {
                if xr.e[i] > 0.3 {
                    r.e[i] = r.e[i].max(2.0);
                }
            }
        }
        self.rec(lines, format!("{}({})", op.name, x.name), (op.nv)(&x.a), r)
    }

    fn binary(&mut self, lines: &mut Vec<String>, a: &Opnd, b: &Opnd, op: &Bn) -> Res<Val> {
        let (da, db) = (a.dtype(), b.dtype());
        let ar = a.r(db.unwrap_or(DType::F32));
        let br = b.r(da.unwrap_or(DType::F32));
        let r = r_binary(op, &ar, &br);
        self.rec(lines, format!("{}({}, {})", op.name, a.label(), b.label()), (op.nv)(a.nv(), b.nv()), r)
    }

    fn astype(&mut self, lines: &mut Vec<String>, x: &Val, d: DType) -> Res<Val> {
        self.rec(lines, format!("astype({}, {d})", x.name), x.a.astype(d), r_cast(&x.r, d))
    }

    fn clip(&mut self, lines: &mut Vec<String>, x: &Val, lo: Sc, hi: Sc) -> Res<Val> {
        let a = x.a.clip(lo.nv(), hi.nv());
        let mx = bin("maximum");
        let mn = bin("minimum");
        let t = r_binary(&mx, &x.r, &Opnd::S(lo).r(x.r.dtype));
        let r = r_binary(&mn, &t, &Opnd::S(hi).r(t.dtype));
        self.rec(lines, format!("clip({}, {:?}, {:?})", x.name, lo, hi), a, r)
    }

    /// Makes `x` satisfy `dom` with recorded fix-up operations, or gives `None`.
    fn fix_domain(&mut self, rng: &mut Rng, lines: &mut Vec<String>, x: &Val, dom: Dom) -> Res<Option<Val>> {
        let ok = |r: &Ref| -> bool {
            r.v.iter().zip(&r.e).all(|(&v, &e)| {
                let (lo, hi) = (v - 4.0 * e, v + 4.0 * e);
                match dom {
                    Dom::All => v.is_finite(),
                    Dom::Pos => lo >= 0.05,
                    Dom::AboveMinusOne => lo >= -0.9,
                    Dom::Unit => lo >= -0.9 && hi <= 0.9,
                    Dom::AboveOne => lo >= 1.05,
                    Dom::Tan => lo >= -1.3 && hi <= 1.3,
                    Dom::Bounded => lo >= -8.0 && hi <= 8.0,
                    Dom::NonZero => v.abs() - 4.0 * e >= 0.1,
                }
            })
        };
        if ok(&x.r) {
            return Ok(Some(x.clone()));
        }
        let int = !is_float(x.r.dtype);
        let one = |v: f64| if int { Sc::I(v as i64) } else { Sc::F(v) };
        let fixed = match dom {
            Dom::All => return Ok(None),
            Dom::Pos | Dom::NonZero | Dom::AboveOne => {
                let t = self.unary(lines, x, &un("abs"))?;
                let c = if dom == Dom::AboveOne { Sc::F(1.25) } else { one(if int { 1.0 } else { 0.5 }) };
                self.binary(lines, &Opnd::A(t), &Opnd::S(c), &bin("add"))?
            }
            Dom::AboveMinusOne => self.unary(lines, x, &un("abs"))?,
            Dom::Unit => {
                let t = self.unary(lines, x, &un("tanh"))?;
                self.binary(lines, &Opnd::A(t), &Opnd::S(Sc::F(0.75)), &bin("multiply"))?
            }
            Dom::Tan | Dom::Bounded => {
                let b = if dom == Dom::Tan { 1.25 } else { rng.pick(&[2.0, 8.0]) };
                let lo = if is_unsigned(x.r.dtype) { 0.0 } else { -b };
                self.clip(lines, x, one(lo), one(b))?
            }
        };
        Ok(if ok(&fixed.r) { Some(fixed) } else { None })
    }

    /// A shape that broadcasts with `s`: trailing axes of `s`, some set to 1, sometimes with
    /// extra leading axes.
    fn broadcastable(rng: &mut Rng, s: &[usize]) -> Vec<usize> {
        let keep = if s.is_empty() { 0 } else { rng.range(0, s.len() as i64) as usize };
        let keep = if rng.chance(0.6) { s.len() } else { keep };
        let mut out: Vec<usize> = s[s.len() - keep..].iter().map(|&d| if rng.chance(0.25) { 1 } else { d }).collect();
        if keep == s.len() && rng.chance(0.15) && numel(s) * 3 <= MAX_ELEMS {
            out.insert(0, rng.range(1, 3) as usize);
        }
        out
    }

    fn other_dtype(rng: &mut Rng, d: DType) -> DType {
        if rng.chance(0.8) {
            return d;
        }
        if is_float(d) {
            rng.pick(&[DType::F16, DType::BF16, DType::F32, DType::F64, DType::I32, DType::U8])
        } else if d == DType::Bool {
            DType::Bool
        } else {
            rng.pick(&[DType::I32, DType::I16, DType::U8, DType::I64, DType::F32])
        }
    }

    /// One random step from `x`; `None` when the drawn operation does not apply.
    fn step(&mut self, rng: &mut Rng, lines: &mut Vec<String>, x: &Val) -> Res<Option<Val>> {
        let d = x.r.dtype;
        let float = is_float(d);
        let boolean = d == DType::Bool;
        // unary, binary-fresh, binary-scalar, self-binary, where, compare, clip, astype, reduce,
        // scan, view, concat/stack, matmul, softmax/lse, movement
        let w: [u32; 15] = if boolean {
            [3, 4, 1, 1, 6, 0, 0, 5, 5, 2, 6, 3, 0, 0, 3]
        } else if float {
            [20, 12, 6, 5, 5, 2, 3, 4, 10, 5, 14, 4, 5, 5, 4]
        } else {
            [8, 14, 6, 4, 5, 2, 3, 5, 8, 5, 14, 4, 4, 2, 4]
        };
        match rng.weighted(&w) {
            0 => self.op_unary(rng, lines, x),
            1 => self.op_binary_fresh(rng, lines, x),
            2 => self.op_binary_scalar(rng, lines, x),
            3 => self.op_self_binary(rng, lines, x),
            4 => self.op_where(rng, lines, x),
            5 => self.op_compare(rng, lines, x),
            6 => {
                if boolean {
                    return Ok(None);
                }
                let (lo, hi) = if float {
                    let lo = rng.pick(&[-2.0, -1.0, -0.5, 0.0, 0.25]);
                    (Sc::F(lo), Sc::F(lo + rng.pick(&[0.5, 1.0, 2.5])))
                } else {
                    let lo = if is_unsigned(d) { rng.range(0, 3) } else { rng.range(-4, 1) };
                    (Sc::I(lo), Sc::I(lo + rng.range(1, 5)))
                };
                self.clip(lines, x, lo, hi).map(Some)
            }
            7 => self.op_astype(rng, lines, x),
            8 => self.op_reduce(rng, lines, x),
            9 => self.op_scan(rng, lines, x),
            10 => self.op_view(rng, lines, x),
            11 => self.op_concat(rng, lines, x),
            12 => self.op_matmul(rng, lines, x),
            13 => self.op_softmax(rng, lines, x),
            _ => self.op_movement(rng, lines, x),
        }
    }

    fn op_unary(&mut self, rng: &mut Rng, lines: &mut Vec<String>, x: &Val) -> Res<Option<Val>> {
        let d = x.r.dtype;
        if d == DType::Bool {
            let r = r_not(&x.r);
            let a = if rng.chance(0.5) { x.a.logical_not() } else { x.a.bitwise_invert() };
            return self.rec(lines, format!("logical_not/bitwise_invert({})", x.name), a, r).map(Some);
        }
        if is_int(d) && rng.chance(0.7) {
            let names = ["abs", "negative", "square", "sign", "floor", "ceil", "round", "bitwise_invert"];
            let name = rng.pick(&names);
            if name == "bitwise_invert" {
                let (lo, hi) = int_range(d);
                let f = move |v: f64| if is_unsigned(d) { hi + lo - v } else { -v - 1.0 };
                let r = r_map1(&x.r, d, &f, 0.0, true, (f64::NEG_INFINITY, f64::INFINITY));
                return self.rec(lines, format!("bitwise_invert({})", x.name), x.a.bitwise_invert(), r).map(Some);
            }
            return self.unary(lines, x, &un(name)).map(Some);
        }
        let ops = unaries();
        let op = ops[rng.below(ops.len())];
        let Some(x) = self.fix_domain(rng, lines, x, op.dom)? else { return Ok(None) };
        self.unary(lines, &x, &op).map(Some)
    }

    /// The second operand's values kind and fix-ups for a binary op, with `x` as the left
    /// (`left == true`) or right operand.
    fn op_binary_fresh(&mut self, rng: &mut Rng, lines: &mut Vec<String>, x: &Val) -> Res<Option<Val>> {
        let d = x.r.dtype;
        let names: &[&str] = if d == DType::Bool {
            &["logical_and", "logical_or", "bitwise_and", "bitwise_or", "bitwise_xor"]
        } else if is_float(d) {
            &[
                "add",
                "subtract",
                "multiply",
                "divide",
                "maximum",
                "minimum",
                "power",
                "arctan2",
                "logaddexp",
                "floor_divide",
                "remainder",
            ]
        } else {
            &[
                "add",
                "subtract",
                "multiply",
                "divide",
                "maximum",
                "minimum",
                "floor_divide",
                "remainder",
                "bitwise_and",
                "bitwise_or",
                "bitwise_xor",
                "left_shift",
                "right_shift",
                "power",
            ]
        };
        let op = bin(rng.pick(names));
        let shape = Chain::broadcastable(rng, &x.r.shape);
        let od = match op.kind {
            BK::Bitwise | BK::Shift | BK::Logic(_) => d,
            _ => Chain::other_dtype(rng, d),
        };
        let left = rng.chance(0.7);
        // x as the left operand unless the op needs special values on one side.
        let (vk_other, fix_x) = match op.kind {
            BK::Div | BK::FloorDiv | BK::Rem => {
                if left {
                    (Vk::AwayFromZero, Dom::All)
                } else {
                    (Vk::General, Dom::NonZero)
                }
            }
            BK::Pow => {
                if is_float(promote(d, od)) {
                    if left { (Vk::Small, Dom::Pos) } else { (Vk::Positive, Dom::Tan) }
                } else if left {
                    (Vk::Small, Dom::All)
                } else {
                    return Ok(None);
                }
            }
            BK::Shift => {
                if left {
                    (Vk::Small, Dom::All)
                } else {
                    return Ok(None);
                }
            }
            _ => (if rng.chance(0.2) { Vk::Ties } else { Vk::General }, Dom::All),
        };
        let other = self.fresh(rng, lines, &shape, od, vk_other)?;
        let Some(x) = self.fix_domain(rng, lines, x, fix_x)? else { return Ok(None) };
        if matches!(op.kind, BK::Div | BK::FloorDiv | BK::Rem) && !is_float(promote(x.r.dtype, od)) {
            // Integer division by zero is left to the implementation: keep divisors non-zero.
            let divisor = if left { &other.r } else { &x.r };
            if divisor.v.iter().zip(&divisor.e).any(|(&v, &e)| v.abs() <= e || v == 0.0) {
                return Ok(None);
            }
        }
        if bin_compute_dtype(op.kind, promote(x.r.dtype, od)).is_none() {
            return Ok(None);
        }
        let (a, b) = if left { (Opnd::A(x), Opnd::A(other)) } else { (Opnd::A(other), Opnd::A(x)) };
        self.binary(lines, &a, &b, &op).map(Some)
    }

    fn op_binary_scalar(&mut self, rng: &mut Rng, lines: &mut Vec<String>, x: &Val) -> Res<Option<Val>> {
        let d = x.r.dtype;
        if d == DType::Bool {
            return Ok(None);
        }
        let names = ["add", "subtract", "multiply", "divide", "maximum", "minimum", "power"];
        let op = bin(rng.pick(&names));
        let int_scalar = !is_float(d) && rng.chance(0.7);
        let s = if op.name == "power" {
            if int_scalar { Sc::I(rng.range(0, 3)) } else { Sc::F(rng.pick(&[0.5, 2.0, -1.0, 1.5])) }
        } else if int_scalar {
            Sc::I(rng.range(1, 4))
        } else {
            Sc::F(rng.pick(&[0.5, -1.5, 2.0, 0.25, 3.0, -0.75]))
        };
        let left = op.name == "power" || op.name == "divide" || rng.chance(0.6);
        let dom = if op.name == "power" && matches!(s, Sc::F(_)) { Dom::Pos } else { Dom::All };
        let Some(x) = self.fix_domain(rng, lines, x, dom)? else { return Ok(None) };
        let (a, b) = if left { (Opnd::A(x), Opnd::S(s)) } else { (Opnd::S(s), Opnd::A(x)) };
        self.binary(lines, &a, &b, &op).map(Some)
    }

    /// `x op x`, `x op reduce(x, keepdims)` or `x op x.T`: one array used twice.
    fn op_self_binary(&mut self, rng: &mut Rng, lines: &mut Vec<String>, x: &Val) -> Res<Option<Val>> {
        let d = x.r.dtype;
        if d == DType::Bool {
            let op = bin(rng.pick(&["logical_and", "logical_or", "bitwise_xor"]));
            return self.binary(lines, &Opnd::A(x.clone()), &Opnd::A(x.clone()), &op).map(Some);
        }
        let op = bin(rng.pick(&["add", "subtract", "multiply", "maximum", "minimum"]));
        let other = match rng.below(3) {
            0 => x.clone(),
            1 if x.r.ndim() >= 1 && x.r.n() > 0 => {
                let ax = rng.below(x.r.ndim());
                let (a, r, what) = if rng.chance(0.5) {
                    (x.a.max_keepdims(ax as i32), r_reduce(&x.r, &[ax], true, d, &extreme_fold(true)), "max_keepdims")
                } else {
                    let sd = sum_dtype(d);
                    (
                        x.a.sum_keepdims(ax as i32),
                        r_sum(&x.r, &[ax], true),
                        if sd == d { "sum_keepdims" } else { "sum_keepdims(widened)" },
                    )
                };
                self.rec(lines, format!("{what}({}, {ax})", x.name), a, r)?
            }
            2 if x.r.ndim() == 2 && x.r.shape[0] == x.r.shape[1] => {
                self.rec(lines, format!("transpose({}, [1, 0])", x.name), x.a.t(), r_transpose(&x.r, &[1, 0]))?
            }
            _ => x.clone(),
        };
        self.binary(lines, &Opnd::A(x.clone()), &Opnd::A(other), &op).map(Some)
    }

    fn comparison(&mut self, rng: &mut Rng, lines: &mut Vec<String>, x: &Val) -> Res<Val> {
        let name = rng.pick(&["equal", "not_equal", "less", "less_equal", "greater", "greater_equal"]);
        let op = bin(name);
        let d = x.r.dtype;
        let other = if rng.chance(0.3) || d == DType::Bool {
            let s = if is_float(d) { Sc::F(rng.pick(&[0.0, 0.5, -0.5, 1.0])) } else { Sc::I(rng.range(0, 2)) };
            Opnd::S(s)
        } else {
            let shape = Chain::broadcastable(rng, &x.r.shape);
            let od = Chain::other_dtype(rng, d);
            Opnd::A(self.fresh(rng, lines, &shape, od, Vk::Ties)?)
        };
        if d == DType::Bool {
            return self.binary(lines, &Opnd::A(x.clone()), &Opnd::A(x.clone()), &op);
        }
        self.binary(lines, &Opnd::A(x.clone()), &other, &op)
    }

    fn op_compare(&mut self, rng: &mut Rng, lines: &mut Vec<String>, x: &Val) -> Res<Option<Val>> {
        self.comparison(rng, lines, x).map(Some)
    }

    fn op_where(&mut self, rng: &mut Rng, lines: &mut Vec<String>, x: &Val) -> Res<Option<Val>> {
        let d = x.r.dtype;
        if d == DType::Bool {
            // Back to numbers: where(x, a, b) with fresh a and scalar or fresh b.
            let od = rng.pick(&[DType::F32, DType::F16, DType::I32, DType::BF16, DType::F64]);
            let sa = Chain::broadcastable(rng, &x.r.shape);
            let a = self.fresh(rng, lines, &sa, od, Vk::General)?;
            let b = if rng.chance(0.5) {
                Opnd::S(if is_float(od) { Sc::F(-1.0) } else { Sc::I(-1) })
            } else {
                let both = broadcast_shapes(&x.r.shape, &a.r.shape).unwrap_or_default();
                let sb = Chain::broadcastable(rng, &both);
                Opnd::A(self.fresh(rng, lines, &sb, od, Vk::General)?)
            };
            let r = r_where(&x.r, &a.r, &b.r(od));
            let arr = ops::where_(&x.a, &a.a, b.nv());
            return self.rec(lines, format!("where({}, {}, {})", x.name, a.name, b.label()), arr, r).map(Some);
        }
        let cond = self.comparison(rng, lines, x)?;
        let y = if rng.chance(0.4) {
            Opnd::S(if is_float(d) { Sc::F(rng.pick(&[0.0, -1.0, 2.0])) } else { Sc::I(rng.range(0, 3)) })
        } else {
            let shape = Chain::broadcastable(rng, &cond.r.shape);
            let od = Chain::other_dtype(rng, d);
            Opnd::A(self.fresh(rng, lines, &shape, od, Vk::General)?)
        };
        let swap = rng.chance(0.3);
        let (p, q) = if swap { (y.clone(), Opnd::A(x.clone())) } else { (Opnd::A(x.clone()), y.clone()) };
        let pr = p.r(q.dtype().unwrap_or(d));
        let qr = q.r(p.dtype().unwrap_or(d));
        let r = r_where(&cond.r, &pr, &qr);
        let arr = ops::where_(&cond.a, p.nv(), q.nv());
        self.rec(lines, format!("where({}, {}, {})", cond.name, p.label(), q.label()), arr, r).map(Some)
    }

    fn op_astype(&mut self, rng: &mut Rng, lines: &mut Vec<String>, x: &Val) -> Res<Option<Val>> {
        let d = x.r.dtype;
        let targets: &[DType] = if is_float(d) {
            &[DType::F16, DType::BF16, DType::F32, DType::F64, DType::I32, DType::I16, DType::Bool]
        } else {
            &[DType::F16, DType::BF16, DType::F32, DType::F64, DType::I32, DType::I64, DType::U8, DType::Bool]
        };
        let t = rng.pick(targets);
        if is_int(t) && !is_int(d) && d != DType::Bool {
            // Float to integer: only values inside the target's range.
            let (lo, hi) = int_range(t);
            if x.r.v.iter().zip(&x.r.e).any(|(&v, &e)| v - e < lo || v + e > hi) {
                return Ok(None);
            }
        }
        if is_int(t) && is_int(d) {
            let (lo, hi) = int_range(t);
            if x.r.v.iter().any(|&v| v < lo || v > hi) {
                return Ok(None);
            }
        }
        self.astype(lines, x, t).map(Some)
    }

    /// Random axes for a reduction (sorted, unique) and how to pass them.
    fn axes(rng: &mut Rng, nd: usize) -> (Vec<usize>, Vec<i32>) {
        let mut all: Vec<usize> = (0..nd).collect();
        rng.shuffle(&mut all);
        let k = if nd == 0 { 0 } else { rng.range(1, nd as i64) as usize };
        let mut chosen: Vec<usize> = all[..k].to_vec();
        let given: Vec<i32> =
            chosen.iter().map(|&a| if rng.chance(0.3) { a as i32 - nd as i32 } else { a as i32 }).collect();
        chosen.sort_unstable();
        (chosen, given)
    }

    fn op_reduce(&mut self, rng: &mut Rng, lines: &mut Vec<String>, x: &Val) -> Res<Option<Val>> {
        let d = x.r.dtype;
        let nd = x.r.ndim();
        let (axes, given) = Chain::axes(rng, nd);
        let keep = rng.chance(0.4);
        let names: &[&str] = if d == DType::Bool {
            &["sum", "all", "any", "argmax", "max"]
        } else if is_float(d) {
            &["sum", "prod", "max", "min", "mean", "var", "std", "logsumexp", "all", "any", "argmax", "argmin"]
        } else {
            &["sum", "prod", "max", "min", "mean", "all", "any", "argmax", "argmin", "var"]
        };
        let name = rng.pick(names);
        if axes.is_empty() && matches!(name, "sum" | "prod" | "max" | "min" | "all" | "any") {
            // A reduction over no axes (of a 0-d array): its dtype rule is not settled.
            return Ok(None);
        }
        let empty_reduced = axes.iter().any(|&a| x.r.shape[a] == 0);
        let desc = format!("{name}({}, axes={given:?}, keepdims={keep})", x.name);
        let (a, r) = match name {
            "sum" => {
                (if keep { x.a.sum_keepdims(given.clone()) } else { x.a.sum(given.clone()) }, r_sum(&x.r, &axes, keep))
            }
            "prod" => {
                let sd = sum_dtype(d);
                let r = r_reduce(&r_cast(&x.r, sd), &axes, keep, sd, &prod_fold(sd));
                (if keep { x.a.prod_keepdims(given.clone()) } else { x.a.prod(given.clone()) }, r)
            }
            "max" | "min" => {
                if empty_reduced {
                    return Ok(None);
                }
                let max = name == "max";
                let r = r_reduce(&x.r, &axes, keep, d, &extreme_fold(max));
                let a = match (max, keep) {
                    (true, true) => x.a.max_keepdims(given.clone()),
                    (true, false) => x.a.max(given.clone()),
                    (false, true) => x.a.min_keepdims(given.clone()),
                    (false, false) => x.a.min(given.clone()),
                };
                (a, r)
            }
            "mean" => (
                if keep { x.a.mean_keepdims(given.clone()) } else { x.a.mean(given.clone()) },
                r_mean(&x.r, &axes, keep),
            ),
            "var" | "std" => {
                let ddof = rng.below(2);
                let opts = VarOptions { ddof: ddof as i32, keepdims: keep };
                let v = var_of(&x.r, &axes, keep, ddof);
                if name == "var" {
                    (x.a.var_with(given.clone(), opts), v)
                } else {
                    let r = r_map1(&v, v.dtype, &f64::sqrt, 2.0, false, (0.0, f64::INFINITY));
                    (x.a.std_with(given.clone(), opts), r)
                }
            }
            "logsumexp" => {
                if empty_reduced {
                    return Ok(None);
                }
                let r = r_logsumexp(&x.r, &axes, keep);
                (if keep { x.a.logsumexp_keepdims(given.clone()) } else { x.a.logsumexp(given.clone()) }, r)
            }
            "all" | "any" => {
                let and = name == "all";
                let r = r_all_any(&x.r, &axes, keep, and);
                let a = match (and, keep) {
                    (true, true) => x.a.all_keepdims(given.clone()),
                    (true, false) => x.a.all(given.clone()),
                    (false, true) => x.a.any_keepdims(given.clone()),
                    (false, false) => x.a.any(given.clone()),
                };
                (a, r)
            }
            _ => {
                // argmax / argmin over one axis, or of the flattened array.
                let max = name == "argmax";
                let flat = nd == 0 || rng.chance(0.25);
                let (xr, axis, given_axis) = if flat {
                    (x.r.with_shape(vec![x.r.n()]), 0, None)
                } else {
                    let ax = rng.below(nd);
                    (x.r.clone(), ax, Some(if rng.chance(0.3) { ax as i32 - nd as i32 } else { ax as i32 }))
                };
                if xr.shape[axis] == 0 {
                    return Ok(None);
                }
                let r = r_argext(&xr, axis, keep, max);
                let a = match (max, keep) {
                    (true, true) => x.a.argmax_keepdims(given_axis),
                    (true, false) => x.a.argmax(given_axis),
                    (false, true) => x.a.argmin_keepdims(given_axis),
                    (false, false) => x.a.argmin(given_axis),
                };
                return self
                    .rec(lines, format!("{name}({}, axis={given_axis:?}, keepdims={keep})", x.name), a, r)
                    .map(Some);
            }
        };
        self.rec(lines, desc, a, r).map(Some)
    }

    fn op_scan(&mut self, rng: &mut Rng, lines: &mut Vec<String>, x: &Val) -> Res<Option<Val>> {
        let d = x.r.dtype;
        let k = if d == DType::Bool {
            ScanK::Sum
        } else if is_float(d) {
            rng.pick(&[ScanK::Sum, ScanK::Prod, ScanK::Max, ScanK::Min, ScanK::LogAddExp])
        } else {
            rng.pick(&[ScanK::Sum, ScanK::Prod, ScanK::Max, ScanK::Min])
        };
        let nd = x.r.ndim();
        let (axis, given) = if nd == 0 || rng.chance(0.2) {
            (None, None)
        } else {
            let ax = rng.below(nd);
            (Some(ax), Some(if rng.chance(0.3) { ax as i32 - nd as i32 } else { ax as i32 }))
        };
        let opts = ScanOptions { reverse: rng.chance(0.3), exclusive: rng.chance(0.3) };
        let r = r_scan(&x.r, axis, k, opts.reverse, opts.exclusive);
        let a = match k {
            ScanK::Sum => x.a.cumsum_with(given, opts),
            ScanK::Prod => x.a.cumprod_with(given, opts),
            ScanK::Max => x.a.cummax_with(given, opts),
            ScanK::Min => x.a.cummin_with(given, opts),
            ScanK::LogAddExp => x.a.logcumsumexp_with(given, opts),
        };
        let name = match k {
            ScanK::Sum => "cumsum",
            ScanK::Prod => "cumprod",
            ScanK::Max => "cummax",
            ScanK::Min => "cummin",
            ScanK::LogAddExp => "logcumsumexp",
        };
        self.rec(lines, format!("{name}({}, axis={given:?}, {opts:?})", x.name), a, r).map(Some)
    }

    fn op_view(&mut self, rng: &mut Rng, lines: &mut Vec<String>, x: &Val) -> Res<Option<Val>> {
        let s = x.r.shape.clone();
        let nd = s.len();
        match rng.below(9) {
            0 if nd >= 2 => {
                let mut perm: Vec<usize> = (0..nd).collect();
                rng.shuffle(&mut perm);
                let given: Vec<i32> =
                    perm.iter().map(|&p| if rng.chance(0.3) { p as i32 - nd as i32 } else { p as i32 }).collect();
                let r = r_transpose(&x.r, &perm);
                self.rec(lines, format!("transpose({}, {given:?})", x.name), x.a.transpose(&given), r).map(Some)
            }
            1 => {
                // Reshape: merge or split axes, add or drop size-1 axes, maybe one -1.
                let n = x.r.n();
                let mut target: Vec<usize> = match rng.below(4) {
                    0 => vec![n],
                    1 if nd >= 2 => {
                        let i = rng.below(nd - 1);
                        let mut t = s.clone();
                        let merged = t[i] * t[i + 1];
                        t.splice(i..i + 2, [merged]);
                        t
                    }
                    2 => {
                        let mut t = s.clone();
                        t.insert(rng.below(nd + 1), 1);
                        t
                    }
                    _ => {
                        // Split the first splittable axis.
                        let mut t = s.clone();
                        if let Some(i) = (0..nd).find(|&i| t[i] >= 4 && t[i].is_multiple_of(2)) {
                            let half = t[i] / 2;
                            t.splice(i..i + 1, [2, half]);
                        } else {
                            t.retain(|&d| d != 1);
                        }
                        t
                    }
                };
                if numel(&target) != n {
                    target = vec![n];
                }
                let mut given: Vec<i32> = dims(&target);
                let non_zero = target.iter().all(|&d| d != 0);
                if non_zero && !given.is_empty() && rng.chance(0.4) {
                    let i = rng.below(given.len());
                    given[i] = -1;
                }
                let r = x.r.with_shape(target);
                self.rec(lines, format!("reshape({}, {given:?})", x.name), x.a.reshape(given), r).map(Some)
            }
            2 if nd >= 1 => {
                let (mut start, mut stop, mut step) = (vec![], vec![], vec![]);
                for &dim in &s {
                    let dim = dim as i64;
                    let st = rng.pick(&[1, 1, 2, 3, -1, -2]);
                    start.push(rng.range(-dim - 2, dim + 2) as i32);
                    stop.push(rng.range(-dim - 2, dim + 2) as i32);
                    step.push(st);
                }
                if rng.chance(0.3) {
                    // Whole axes: start/stop past the ends.
                    for i in 0..nd {
                        if step[i] > 0 {
                            start[i] = 0;
                            stop[i] = s[i] as i32 + 5;
                        } else {
                            start[i] = -1;
                            stop[i] = -(s[i] as i32) - 5;
                        }
                    }
                }
                let r = r_slice(&x.r, &start, &stop, &step);
                let given_step = if step.iter().all(|&k| k == 1) && rng.chance(0.5) { vec![] } else { step.clone() };
                let a = x.a.slice(&start, &stop, &given_step);
                self.rec(lines, format!("slice({}, {start:?}, {stop:?}, {given_step:?})", x.name), a, r).map(Some)
            }
            3 => {
                // Broadcast: size-1 axes grow, leading axes appear.
                let mut target: Vec<usize> =
                    s.iter().map(|&d| if d == 1 && rng.chance(0.7) { rng.range(0, 3) as usize } else { d }).collect();
                if rng.chance(0.5) {
                    target.insert(0, rng.range(1, 3) as usize);
                }
                if numel(&target) > MAX_ELEMS {
                    return Ok(None);
                }
                let r = r_broadcast(&x.r, &target);
                self.rec(lines, format!("broadcast_to({}, {target:?})", x.name), x.a.broadcast_to(dims(&target)), r)
                    .map(Some)
            }
            4 => {
                let out_nd = nd + rng.range(1, 2) as usize;
                let mut pos: Vec<usize> = (0..out_nd).collect();
                rng.shuffle(&mut pos);
                let mut chosen: Vec<usize> = pos[..out_nd - nd].to_vec();
                let given: Vec<i32> =
                    chosen.iter().map(|&a| if rng.chance(0.3) { a as i32 - out_nd as i32 } else { a as i32 }).collect();
                chosen.sort_unstable();
                let mut target = Vec::new();
                let mut src = s.iter();
                for i in 0..out_nd {
                    target.push(if chosen.contains(&i) { 1 } else { *src.next().unwrap_or(&1) });
                }
                let r = x.r.with_shape(target);
                self.rec(lines, format!("expand_dims({}, {given:?})", x.name), x.a.expand_dims(given), r).map(Some)
            }
            5 => {
                let ones: Vec<usize> = (0..nd).filter(|&i| s[i] == 1).collect();
                let all = ones.is_empty() || rng.chance(0.4);
                let removed = if ones.is_empty() { 0 } else { ones[rng.below(ones.len())] };
                let target: Vec<usize> = if all {
                    s.iter().copied().filter(|&d| d != 1).collect()
                } else {
                    s.iter().enumerate().filter(|&(j, _)| j != removed).map(|(_, &d)| d).collect()
                };
                let r = x.r.with_shape(target);
                if all {
                    self.rec(lines, format!("squeeze({}, ..)", x.name), x.a.squeeze(..), r).map(Some)
                } else {
                    let given = if rng.chance(0.3) { removed as i32 - nd as i32 } else { removed as i32 };
                    self.rec(lines, format!("squeeze({}, {given})", x.name), x.a.squeeze(given), r).map(Some)
                }
            }
            6 if nd >= 2 => {
                let (i, j) = (rng.below(nd), rng.below(nd));
                let mut perm: Vec<usize> = (0..nd).collect();
                perm.swap(i, j);
                let r = r_transpose(&x.r, &perm);
                self.rec(
                    lines,
                    format!("swapaxes({}, {i}, {j})", x.name),
                    x.a.swapaxes(i as i32, j as i32 - nd as i32),
                    r,
                )
                .map(Some)
            }
            7 if nd >= 2 => {
                let (src, dst) = (rng.below(nd), rng.below(nd));
                let mut perm: Vec<usize> = (0..nd).filter(|&a| a != src).collect();
                perm.insert(dst, src);
                let r = r_transpose(&x.r, &perm);
                self.rec(lines, format!("moveaxis({}, {src}, {dst})", x.name), x.a.moveaxis(src as i32, dst as i32), r)
                    .map(Some)
            }
            8 if nd >= 1 => {
                let a = rng.below(nd);
                let b = a + rng.below(nd - a);
                let mut target: Vec<usize> = s[..a].to_vec();
                target.push(s[a..=b].iter().product());
                target.extend(&s[b + 1..]);
                let r = x.r.with_shape(target);
                self.rec(
                    lines,
                    format!("flatten({}, {a}, {})", x.name, b as i32 - nd as i32),
                    x.a.flatten(a as i32, b as i32 - nd as i32),
                    r,
                )
                .map(Some)
            }
            _ => Ok(None),
        }
    }

    fn op_concat(&mut self, rng: &mut Rng, lines: &mut Vec<String>, x: &Val) -> Res<Option<Val>> {
        let s = x.r.shape.clone();
        let nd = s.len();
        if rng.chance(0.25) {
            // stack with a fresh array of the same shape along a new axis.
            let other = self.fresh(rng, lines, &s, x.r.dtype, Vk::General)?;
            let ax = rng.below(nd + 1);
            let ex = |r: &Ref| {
                let mut t = r.shape.clone();
                t.insert(ax, 1);
                r.with_shape(t)
            };
            let r = r_concat(&[ex(&x.r), ex(&other.r)], ax);
            if r.n() > MAX_ELEMS {
                return Ok(None);
            }
            let a = ops::stack(&[x.a.clone(), other.a.clone()], ax as i32);
            return self.rec(lines, format!("stack([{}, {}], {ax})", x.name, other.name), a, r).map(Some);
        }
        if nd == 0 {
            return Ok(None);
        }
        let ax = rng.below(nd);
        let mut parts = vec![x.clone()];
        for _ in 0..rng.range(1, 2) {
            let p = if rng.chance(0.3) {
                x.clone()
            } else {
                let mut t = s.clone();
                t[ax] = rng.range(0, 3) as usize;
                let od = if rng.chance(0.8) { x.r.dtype } else { Chain::other_dtype(rng, x.r.dtype) };
                self.fresh(rng, lines, &t, od, Vk::General)?
            };
            parts.push(p);
        }
        rng.shuffle(&mut parts);
        let d = parts.iter().skip(1).fold(parts[0].r.dtype, |acc, p| promote(acc, p.r.dtype));
        let refs: Vec<Ref> = parts.iter().map(|p| r_cast(&p.r, d)).collect();
        let r = r_concat(&refs, ax);
        if r.n() > MAX_ELEMS {
            return Ok(None);
        }
        let arrays: Vec<Array> = parts.iter().map(|p| p.a.clone()).collect();
        let given = if rng.chance(0.3) { ax as i32 - nd as i32 } else { ax as i32 };
        let names: Vec<&str> = parts.iter().map(|p| p.name.as_str()).collect();
        self.rec(lines, format!("concatenate({names:?}, {given})",), ops::concatenate(&arrays, given), r).map(Some)
    }

    fn op_matmul(&mut self, rng: &mut Rng, lines: &mut Vec<String>, x: &Val) -> Res<Option<Val>> {
        let d = x.r.dtype;
        if d == DType::Bool || x.r.ndim() == 0 {
            return Ok(None);
        }
        let s = x.r.shape.clone();
        let nd = s.len();
        let od = if rng.chance(0.85) { d } else { Chain::other_dtype(rng, d) };
        if promote(d, od) == DType::Bool {
            return Ok(None);
        }
        let vk = if is_float(promote(d, od)) { Vk::General } else { Vk::Small };
        let n = rng.pick(&[0, 1, 2, 3, 4, 5, 1, 3]);
        // x on the left: other is [K, N], [K] or batched; on the right: other is [M, K] or [K].
        let left = rng.chance(0.7);
        let k = if left {
            s[nd - 1]
        } else if nd == 1 {
            s[0]
        } else {
            s[nd - 2]
        };
        let mut oshape = match rng.below(3) {
            0 => vec![k],
            _ if left => vec![k, n],
            _ => vec![n, k],
        };
        if nd >= 3 && rng.chance(0.5) && oshape.len() == 2 {
            // Batch axes that broadcast against x's.
            let batch: Vec<usize> = s[..nd - 2].iter().map(|&b| if rng.chance(0.3) { 1 } else { b }).collect();
            oshape.splice(0..0, batch);
        }
        let other = self.fresh(rng, lines, &oshape, od, vk)?;
        let (a, b) = if left { (x, &other) } else { (&other, x) };
        let r = r_matmul(&a.r, &b.r);
        if r.n() > MAX_ELEMS {
            return Ok(None);
        }
        if is_float(r.dtype) && r.ndim() >= 1 && rng.chance(0.3) {
            // addmm with a broadcast bias.
            let bias_shape = Chain::broadcastable(rng, &r.shape);
            if broadcast_shapes(&bias_shape, &r.shape).as_deref() != Some(&r.shape[..]) {
                return Ok(None);
            }
            let c = self.fresh(rng, lines, &bias_shape, r.dtype, Vk::General)?;
            let (alpha, beta) = (rng.pick(&[1.0f32, 0.5, -2.0]), rng.pick(&[1.0f32, 0.0, 0.25, -1.0]));
            let scaled = r_scale(&r, alpha as f64);
            let cs = r_scale(&r_broadcast(&c.r, &r.shape), beta as f64);
            let out = r_map2(&scaled, &cs, r.dtype, &|p, q| p + q, 1.0, false);
            let arr = ops::addmm(&c.a, &a.a, &b.a, alpha, beta);
            return self
                .rec(lines, format!("addmm({}, {}, {}, alpha={alpha}, beta={beta})", c.name, a.name, b.name), arr, out)
                .map(Some);
        }
        self.rec(lines, format!("matmul({}, {})", a.name, b.name), a.a.matmul(&b.a), r).map(Some)
    }

    fn op_softmax(&mut self, rng: &mut Rng, lines: &mut Vec<String>, x: &Val) -> Res<Option<Val>> {
        let nd = x.r.ndim();
        if x.r.dtype == DType::Bool {
            return Ok(None);
        }
        let (axes, given) = if nd >= 1 && rng.chance(0.5) { (vec![nd - 1], vec![-1]) } else { Chain::axes(rng, nd) };
        if rng.chance(0.6) {
            let r = r_softmax(&x.r, &axes);
            return self.rec(lines, format!("softmax({}, {given:?})", x.name), x.a.softmax(given.clone()), r).map(Some);
        }
        if axes.iter().any(|&a| x.r.shape[a] == 0) {
            return Ok(None);
        }
        let keep = rng.chance(0.5);
        let r = r_logsumexp(&x.r, &axes, keep);
        let a = ops::logsumexp(&x.a, given.clone(), keep);
        self.rec(lines, format!("logsumexp({}, {given:?}, keepdims={keep})", x.name), a, r).map(Some)
    }

    fn op_movement(&mut self, rng: &mut Rng, lines: &mut Vec<String>, x: &Val) -> Res<Option<Val>> {
        let s = x.r.shape.clone();
        let nd = s.len();
        match rng.below(5) {
            0 => {
                let widths: Vec<(usize, usize)> = (0..nd).map(|_| (rng.below(3), rng.below(3))).collect();
                let value =
                    if is_float(x.r.dtype) { Sc::F(rng.pick(&[0.0, 1.5, -1.0])) } else { Sc::I(rng.range(0, 2)) };
                let d = x.r.dtype;
                let fill = round_to(d, value.value());
                let r = r_pad(&x.r, &widths, fill);
                if r.n() > MAX_ELEMS {
                    return Ok(None);
                }
                let w: Vec<(i32, i32)> = widths.iter().map(|&(a, b)| (a as i32, b as i32)).collect();
                self.rec(lines, format!("pad({}, {w:?}, {value:?})", x.name), x.a.pad(&w, value.nv()), r).map(Some)
            }
            1 => {
                let reps = rng.range(0, 3) as usize;
                let (xr, ax, given) = if nd == 0 || rng.chance(0.3) {
                    (x.r.with_shape(vec![x.r.n()]), 0, None)
                } else {
                    let a = rng.below(nd);
                    (x.r.clone(), a, Some(a as i32))
                };
                let r = r_repeat(&xr, reps, ax);
                if r.n() > MAX_ELEMS {
                    return Ok(None);
                }
                self.rec(lines, format!("repeat({}, {reps}, {given:?})", x.name), x.a.repeat(reps as i32, given), r)
                    .map(Some)
            }
            2 => {
                let len = rng.range(0, nd as i64 + 1) as usize;
                let reps: Vec<usize> = (0..len).map(|_| rng.range(1, 3) as usize).collect();
                let r = r_tile(&x.r, &reps);
                if r.n() > MAX_ELEMS {
                    return Ok(None);
                }
                let given: Vec<i32> = reps.iter().map(|&r| r as i32).collect();
                self.rec(lines, format!("tile({}, {given:?})", x.name), x.a.tile(&given), r).map(Some)
            }
            3 if nd >= 2 => {
                let k = rng.range(-2, 2);
                let lower = rng.chance(0.5);
                let r = r_triangle(&x.r, k, lower);
                let a = if lower { x.a.tril(k as i32) } else { x.a.triu(k as i32) };
                self.rec(lines, format!("{}({}, {k})", if lower { "tril" } else { "triu" }, x.name), a, r).map(Some)
            }
            4 if nd >= 1 => {
                let ax = rng.below(nd);
                let dim = s[ax];
                let divisors: Vec<usize> = (1..=dim.max(1)).filter(|&k| dim.is_multiple_of(k)).collect();
                let (parts, desc, bounds) = if rng.chance(0.5) && dim > 0 {
                    let k = rng.pick(&divisors);
                    let bounds: Vec<usize> = (0..=k).map(|i| i * dim / k).collect();
                    (x.a.split(k as i32, ax as i32), format!("split({}, {k}, {ax})", x.name), bounds)
                } else {
                    let mut idx: Vec<i32> =
                        (0..rng.range(1, 3)).map(|_| rng.range(-(dim as i64) - 1, dim as i64 + 1) as i32).collect();
                    if rng.chance(0.7) {
                        idx.sort_unstable();
                    }
                    // Bounds as nuvec documents them: negative from the end, clamped, and never
                    // before the previous one.
                    let mut bounds = vec![0usize];
                    for &i in &idx {
                        let i = if i < 0 { i as i64 + dim as i64 } else { i as i64 }.clamp(0, dim as i64) as usize;
                        bounds.push(i.max(*bounds.last().unwrap_or(&0)));
                    }
                    bounds.push(dim);
                    (x.a.split_at(&idx, ax as i32), format!("split_at({}, {idx:?}, {ax})", x.name), bounds)
                };
                if parts.len() != bounds.len() - 1 {
                    return Err(format!("{desc}: nuvec gave {} parts, expected {}", parts.len(), bounds.len() - 1));
                }
                let which = rng.below(parts.len());
                let mut start = vec![0i32; nd];
                let mut stop = dims(&s);
                start[ax] = bounds[which] as i32;
                stop[ax] = bounds[which + 1] as i32;
                let r = r_slice(&x.r, &start, &stop, &vec![1; nd]);
                self.rec(lines, format!("{desc}[{which}]"), parts[which].clone(), r).map(Some)
            }
            _ => Ok(None),
        }
    }

    /// A random starting input of the case's family.
    fn input(&mut self, rng: &mut Rng, lines: &mut Vec<String>, family: DType) -> Res<Val> {
        let nd = rng.weighted(&[2, 5, 8, 6, 3]);
        let zero_ok = rng.chance(0.08);
        let mut shape: Vec<usize> = (0..nd)
            .map(|_| if zero_ok && rng.chance(0.3) { 0 } else { rng.pick(&[1, 1, 2, 2, 3, 3, 4, 5, 6, 7]) })
            .collect();
        while numel(&shape) > 160 {
            let i = (0..shape.len()).max_by_key(|&i| shape[i]).unwrap_or(0);
            shape[i] = (shape[i] / 2).max(1);
        }
        let vk = if rng.chance(0.2) { Vk::Ties } else { Vk::General };
        self.fresh(rng, lines, &shape, family, vk)
    }
}

/// Whether every value is finite and inside the dtype's range.
fn in_range(r: &Ref) -> bool {
    let lim = limit(r.dtype);
    r.v.iter().zip(&r.e).all(|(&v, &e)| {
        v.is_infinite() && e == 0.0
            || v.is_finite()
                && v.abs() + if e.is_finite() { e } else { 0.0 } <= lim
                && (!is_int(r.dtype) || {
                    let (lo, hi) = int_range(r.dtype);
                    v >= lo && v <= hi && v.fract() == 0.0
                })
    })
}

/// Whether a step's result keeps the chain meaningful: finite, in range, small enough, and
/// most elements with a useful error bound.
fn acceptable(r: &Ref, last: bool) -> bool {
    if r.n() > MAX_ELEMS {
        return false;
    }
    let lim = limit(r.dtype);
    for (&v, &e) in r.v.iter().zip(&r.e) {
        if !v.is_finite() {
            if !(last && v.is_infinite() && e == 0.0) {
                return false;
            }
            continue;
        }
        if v.abs() + if e.is_finite() { e } else { 0.0 } > lim {
            return false;
        }
        if is_int(r.dtype) {
            let (lo, hi) = int_range(r.dtype);
            if v < lo || v > hi {
                return false;
            }
        }
    }
    if r.n() == 0 {
        return true;
    }
    let scale = r.v.iter().map(|v| v.abs()).filter(|v| v.is_finite()).fold(0.0, f64::max);
    let loose =
        r.v.iter()
            .zip(&r.e)
            .filter(|&(&v, &e)| {
                if r.dtype == DType::Bool || r.dtype == DType::U32 {
                    e >= 1.0
                } else {
                    e > 0.1 * v.abs().max(1e-2 * scale).max(if is_float(r.dtype) { 1e-6 } else { 0.0 })
                }
            })
            .count();
    loose * 4 <= r.n()
}

/// The case: a dtype family, a seed for the input and one seed per step.
#[derive(Clone, Debug)]
struct Case {
    family: usize,
    input_seed: u64,
    steps: Vec<u64>,
}

const FAMILIES: [DType; 10] = [
    DType::F32,
    DType::F32,
    DType::F32,
    DType::F64,
    DType::F16,
    DType::BF16,
    DType::I32,
    DType::I64,
    DType::I16,
    DType::U8,
];

fn run_case(case: &Case) -> Result<(), String> {
    let family = FAMILIES[case.family % FAMILIES.len()];
    let mut chain = Chain { log: vec![], counter: 0, spoiled: false };
    let mut rng = Rng::new(case.input_seed);
    let mut lines = vec![];
    let mut cur = match chain.input(&mut rng, &mut lines, family) {
        Ok(v) => v,
        Err(e) => return Err(format!("{}\n{e}", lines.join("\n"))),
    };
    chain.log.append(&mut lines);
    for (i, &seed) in case.steps.iter().enumerate() {
        let last = i + 1 == case.steps.len();
        let mut rng = Rng::new(seed ^ (i as u64).wrapping_mul(0xA24B_AED4_963E_E407));
        for _attempt in 0..16 {
            let mut lines = vec![];
            let saved = chain.counter;
            chain.spoiled = false;
            match chain.step(&mut rng, &mut lines, &cur) {
                Err(e) => {
                    chain.log.extend(lines);
                    return Err(format!("{}\n{e}", chain.log.join("\n")));
                }
                Ok(None) => chain.counter = saved,
                Ok(Some(next)) => {
                    if !chain.spoiled && acceptable(&next.r, last) {
                        stats::record(&lines, true);
                        chain.log.extend(lines);
                        cur = next;
                        break;
                    }
                    stats::record(&lines, false);
                    chain.counter = saved;
                }
            }
        }
        // Sometimes evaluate (and check) an intermediate result, which changes what later
        // steps see (evaluated views, no donation).
        if !last && rng.chance(0.25) {
            if rng.chance(0.5) {
                let got = read(&cur.a).map_err(|e| format!("{}\nreading {}: {e}", chain.log.join("\n"), cur.name))?;
                let bad = compare(&got, &cur.r);
                if !bad.is_empty() {
                    return Err(report(&chain, &cur, &got, &bad));
                }
            } else if let Err(e) = cur.a.eval() {
                return Err(format!("{}\neval of {} failed: {e}", chain.log.join("\n"), cur.name));
            }
        }
    }
    let got = read(&cur.a).map_err(|e| format!("{}\nreading {}: {e}", chain.log.join("\n"), cur.name))?;
    let bad = compare(&got, &cur.r);
    if !bad.is_empty() {
        return Err(report(&chain, &cur, &got, &bad));
    }
    Ok(())
}

/// Statistics: how often each operation was drawn and kept (always counted), and how much of
/// their bounds results used (counted with `NUVEC_REF_STATS=1`, which also prints them).
mod stats {
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    static COUNTS: Mutex<BTreeMap<String, (usize, usize)>> = Mutex::new(BTreeMap::new());

    pub fn enabled() -> bool {
        std::env::var("NUVEC_REF_STATS").is_ok()
    }

    /// Operations kept in some chain so far (in any test of this binary).
    pub fn kept() -> Vec<String> {
        COUNTS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(_, c)| c.0 > 0)
            .map(|(k, _)| k.clone())
            .collect()
    }

    pub fn record(lines: &[String], kept: bool) {
        let mut c = COUNTS.lock().unwrap_or_else(|e| e.into_inner());
        for l in lines {
            let op = l.split(" = ").nth(1).unwrap_or("").split(['(', ' ', ':']).next().unwrap_or("").to_string();
            let e = c.entry(op).or_default();
            if kept { e.0 += 1 } else { e.1 += 1 }
        }
    }

    /// Per dtype: elements compared exactly, within a bound, skipped; the largest
    /// |error| / bound; the geometric mean of bound / |value|; elements using > 10% of their bound.
    #[derive(Default)]
    struct Tally {
        exact: usize,
        bounded: usize,
        skipped: usize,
        worst: f64,
        log_rel: f64,
        n_rel: usize,
        tenth: usize,
    }

    static RATIOS: Mutex<BTreeMap<String, Tally>> = Mutex::new(BTreeMap::new());

    pub fn ratio(d: nuvec::DType, g: f64, w: f64, e: f64) {
        if !enabled() {
            return;
        }
        let mut m = RATIOS.lock().unwrap_or_else(|e| e.into_inner());
        let t = m.entry(d.to_string()).or_default();
        if !e.is_finite() || !w.is_finite() || (e >= 1.0 && d == nuvec::DType::Bool) {
            t.skipped += 1;
        } else if e == 0.0 {
            t.exact += 1;
        } else {
            t.bounded += 1;
            let r = (g - w).abs() / e;
            t.worst = t.worst.max(r);
            if r > 0.1 {
                t.tenth += 1;
            }
            if w != 0.0 {
                t.log_rel += (e / w.abs()).ln();
                t.n_rel += 1;
            }
        }
    }

    pub fn print() {
        if enabled() {
            for (d, t) in RATIOS.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                let rel = (t.log_rel / t.n_rel.max(1) as f64).exp();
                eprintln!(
                    "{d:>10}: exact {:>7}, bounded {:>7} (typical bound {rel:.1e} relative; {} use >10% of it; worst {:.3}), skipped {:>5}",
                    t.exact, t.bounded, t.tenth, t.worst, t.skipped
                );
            }
            for (op, (k, r)) in COUNTS.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                eprintln!("{op:>24}: kept {k:>6}, redrawn {r:>5}");
            }
        }
    }
}

fn report(chain: &Chain, cur: &Val, got: &[f64], bad: &[String]) -> String {
    let mut s = String::from("chain:\n");
    for l in &chain.log {
        s.push_str("  ");
        s.push_str(l);
        s.push('\n');
    }
    s.push_str(&format!(
        "result {} ({} {:?}) differs from the f64 reference in {} of {} elements:\n",
        cur.name,
        cur.r.dtype,
        cur.r.shape,
        bad.len(),
        cur.r.n()
    ));
    for b in bad.iter().take(24) {
        s.push_str(b);
        s.push('\n');
    }
    s.push_str(&format!(
        "nuvec:     {}\nreference: {}\nbound:     {}\n",
        fmt_vals(got),
        fmt_vals(&cur.r.v),
        fmt_vals(&cur.r.e)
    ));
    s
}

/// The case named by `NUVEC_REF_CASE`, if set.
fn replay() -> Option<Case> {
    let v = std::env::var("NUVEC_REF_CASE").ok()?;
    let nums: Vec<u64> =
        v.split(|c: char| !c.is_ascii_digit()).filter(|t| !t.is_empty()).filter_map(|t| t.parse().ok()).collect();
    let (&family, rest) = nums.split_first()?;
    let (&input_seed, steps) = rest.split_first()?;
    Some(Case { family: family as usize, input_seed, steps: steps.to_vec() })
}

fn config() -> Config {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256);
    Config {
        cases,
        failure_persistence: None,
        rng_seed: RngSeed::Fixed(
            std::env::var("NUVEC_REF_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(0x6e75_7665_6301),
        ),
        max_shrink_iters: 4096,
        ..Config::default()
    }
}

fn case_strategy() -> impl Strategy<Value = Case> {
    (0..FAMILIES.len(), any::<u64>(), prop::collection::vec(any::<u64>(), 3..=8))
        .prop_map(|(family, input_seed, steps)| Case { family, input_seed, steps })
}

proptest! {
    #![proptest_config(config())]

    /// Random op chains agree with the f64 reference within their error bounds.
    /// `NUVEC_REF_CASE="family,input_seed,step_seed,..."` replays one case (as printed).
    #[test]
    fn random_chains_match_f64_reference(case in case_strategy()) {
        let case = replay().unwrap_or(case);
        run_case(&case).map_err(TestCaseError::fail)?;
    }
}

// ------------------------------------------------------------------------------------------
// The reference checked on its own (no nuvec), so a wrong reference cannot pass silently.

/// A seeded run of its own (400 cases) that must pass and must exercise every operation of
/// the catalogue at least once (guards the generator against silently dropping operations).
/// With `NUVEC_REF_STATS=1 -- --nocapture` it prints the per-op and per-dtype statistics.
#[test]
fn generator_covers_every_operation() {
    let mut rng = Rng::new(0xC0FE);
    let mut run = |n: usize| {
        for _ in 0..n {
            let case = Case {
                family: rng.below(FAMILIES.len()),
                input_seed: rng.next(),
                steps: (0..rng.range(3, 8)).map(|_| rng.next()).collect(),
            };
            if let Err(e) = run_case(&case) {
                panic!("{case:?}\n{e}");
            }
        }
    };
    run(400);
    let required = [
        "input",
        "full",
        "arange",
        "abs",
        "negative",
        "square",
        "sign",
        "floor",
        "ceil",
        "round",
        "exp",
        "expm1",
        "log",
        "log1p",
        "log2",
        "log10",
        "sqrt",
        "rsqrt",
        "reciprocal",
        "sin",
        "cos",
        "tan",
        "arcsin",
        "arccos",
        "arctan",
        "sinh",
        "cosh",
        "tanh",
        "arcsinh",
        "arccosh",
        "arctanh",
        "sigmoid",
        "erf",
        "erfinv",
        "bitwise_invert",
        "add",
        "subtract",
        "multiply",
        "divide",
        "floor_divide",
        "remainder",
        "power",
        "maximum",
        "minimum",
        "arctan2",
        "logaddexp",
        "bitwise_and",
        "bitwise_or",
        "bitwise_xor",
        "left_shift",
        "right_shift",
        "equal",
        "not_equal",
        "less",
        "less_equal",
        "greater",
        "greater_equal",
        "logical_and",
        "logical_or",
        "where",
        "clip",
        "astype",
        "sum",
        "prod",
        "max",
        "min",
        "mean",
        "var",
        "std",
        "logsumexp",
        "all",
        "any",
        "argmax",
        "argmin",
        "cumsum",
        "cumprod",
        "cummax",
        "cummin",
        "logcumsumexp",
        "transpose",
        "reshape",
        "slice",
        "broadcast_to",
        "expand_dims",
        "squeeze",
        "swapaxes",
        "moveaxis",
        "flatten",
        "concatenate",
        "stack",
        "matmul",
        "addmm",
        "softmax",
        "pad",
        "repeat",
        "tile",
        "tril",
        "triu",
        "split",
        "split_at",
    ];
    let missing = |seen: &[String]| -> Vec<&str> {
        required.iter().copied().filter(|op| !seen.contains(&op.to_string())).collect()
    };
    // Which steps a chain keeps depends on the values the device computed (last-bit
    // differences steer the generator), so a rare operation may need more cases elsewhere.
    if !missing(&stats::kept()).is_empty() {
        run(1200);
    }
    stats::print();
    let missing = missing(&stats::kept());
    assert!(missing.is_empty(), "operations never exercised: {missing:?}");
}

#[test]
fn reference_special_functions() {
    // erf against published values.
    for (x, want) in [
        (0.0, 0.0),
        (0.5, 0.520_499_877_813_046_5),
        (1.0, 0.842_700_792_949_714_9),
        (2.0, 0.995_322_265_018_952_7),
        (2.4, 0.999_311_486_103_355),
        (3.5, 0.999_999_256_901_627_7),
        (5.5, 0.999_999_999_999_992_7),
    ] {
        assert!((erf(x) - want).abs() <= 4e-16, "erf({x}) = {}, want {want}", erf(x));
        assert!((erf(-x) + want).abs() <= 4e-16);
    }
    for y in [-0.9, -0.3, 0.0, 0.1, 0.75] {
        assert!((erf(erfinv(y)) - y).abs() < 1e-14, "erfinv({y})");
    }
}

#[test]
fn reference_rules() {
    assert_eq!(py_slice(8, 0, -3, 10), (8, 3));
    assert_eq!(py_slice(-2, 100, 1, 5), (3, 2));
    assert_eq!(py_slice(-100, -100, -1, 5), (-1, 0));
    assert_eq!(py_slice(0, 5, 2, 0), (0, 0));
    assert_eq!(promote(DType::U8, DType::I8), DType::I16);
    assert_eq!(promote(DType::U32, DType::I32), DType::I64);
    assert_eq!(promote(DType::F16, DType::BF16), DType::F32);
    assert_eq!(promote(DType::I64, DType::F16), DType::F16);
    let x = Ref::exact(vec![2, 3], DType::F32, (0..6).map(|v| v as f64).collect());
    assert_eq!(r_transpose(&x, &[1, 0]).v, vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    assert_eq!(r_sum(&x, &[1], false).v, vec![3.0, 12.0]);
    assert_eq!(r_scan(&x, Some(1), ScanK::Sum, true, true).v, vec![3.0, 2.0, 0.0, 9.0, 5.0, 0.0]);
    assert_eq!(r_argext(&Ref::exact(vec![4], DType::I32, vec![1.0, 3.0, 3.0, 0.0]), 0, false, true).v, vec![1.0]);
    let m = r_matmul(&x, &r_transpose(&x, &[1, 0]));
    assert_eq!(m.v, vec![5.0, 14.0, 14.0, 50.0]);
    assert_eq!(
        r_tile(&Ref::exact(vec![2], DType::I32, vec![1.0, 2.0]), &[2, 2]).v,
        vec![1.0, 2.0, 1.0, 2.0, 1.0, 2.0, 1.0, 2.0]
    );
}
