//! Tensor contractions: `einsum`, `tensordot`, `outer` and `inner`, lowered to transposes,
//! reshapes, diagonal views, sums, products and batched matrix products (so their derivatives
//! and backends come from those).

use std::collections::BTreeMap;

use crate::array::Array;
use crate::dtype::promote_types;
use crate::error::OpErrorKind;

use super::{invalid, propagate};

/// A label of an axis: a letter's byte, or `ELLIPSIS + k` for the `k`-th axis of `...`
/// counted from the right (ellipsis axes broadcast right-aligned, as NumPy's).
type Label = u32;
const ELLIPSIS: Label = 1 << 16;

/// One term of the subscripts: its letters and where its `...` sits, if any.
struct Term {
    letters: Vec<u8>,
    ellipsis_at: Option<usize>,
}

#[track_caller]
fn parse_term(term: &str) -> Result<Term, Array> {
    let bytes = term.as_bytes();
    let (mut letters, mut ellipsis_at, mut i) = (Vec::new(), None, 0);
    while i < bytes.len() {
        let c = bytes[i];
        if c.is_ascii_alphabetic() {
            letters.push(c);
            i += 1;
        } else if c == b'.' && bytes[i..].starts_with(b"...") {
            if ellipsis_at.is_some() {
                return Err(invalid("einsum", format!("subscript term {term:?} holds more than one '...'")));
            }
            ellipsis_at = Some(letters.len());
            i += 3;
        } else {
            let ch = term[i..].chars().next().unwrap_or('?');
            return Err(invalid("einsum", format!("subscripts must be letters or '...', got {ch:?} in {term:?}")));
        }
    }
    Ok(Term { letters, ellipsis_at })
}

/// The axis labels of a term applied to an array of `ndim` axes.
#[track_caller]
fn labels_of(term: &Term, ndim: usize, which: usize, text: &str) -> Result<Vec<Label>, Array> {
    let n = term.letters.len();
    let fits = match term.ellipsis_at {
        Some(_) => n <= ndim,
        None => n == ndim,
    };
    if !fits {
        return Err(invalid(
            "einsum",
            format!("subscripts {text:?} of operand {which} name {n} axes, but the operand has {ndim}"),
        ));
    }
    let mut labels: Vec<Label> = term.letters.iter().map(|&c| c as Label).collect();
    if let Some(at) = term.ellipsis_at {
        let e = ndim - n;
        let dots = (0..e).map(|j| ELLIPSIS + (e - 1 - j) as Label);
        labels.splice(at..at, dots);
    }
    Ok(labels)
}

fn describe(l: Label) -> String {
    if l >= ELLIPSIS { format!("'...' axis {}", l - ELLIPSIS) } else { format!("'{}'", l as u8 as char) }
}

/// An operand while the contraction proceeds: the array and one label per axis.
struct Operand {
    x: Array,
    labels: Vec<Label>,
}

impl Operand {
    /// Takes the diagonal of every label that names two axes.
    fn diagonals(mut self) -> Operand {
        while let Some((a, b)) = repeated(&self.labels) {
            let n = self.x.shape()[a];
            let nd = self.x.ndim();
            let mut perm: Vec<i32> = (0..nd as i32).filter(|&i| i as usize != a && i as usize != b).collect();
            perm.extend([a as i32, b as i32]);
            let moved = self.x.transpose(&perm);
            let mut flat: Vec<i32> = moved.shape()[..nd - 2].to_vec();
            flat.push(n * n);
            let flat = moved.reshape(flat);
            // Element (i, i) of an n×n block sits at i·(n + 1).
            let mut start = vec![0; nd - 1];
            let mut stop = flat.shape().to_vec();
            let mut step = vec![1; nd - 1];
            start[nd - 2] = 0;
            stop[nd - 2] = n * n;
            step[nd - 2] = n + 1;
            self.x = flat.slice(&start, &stop, &step);
            let l = self.labels[a];
            self.labels = perm[..nd - 2].iter().map(|&i| self.labels[i as usize]).collect();
            self.labels.push(l);
        }
        self
    }

    /// Sums the axes whose labels `keep` rejects.
    fn sum_unless(mut self, keep: impl Fn(Label) -> bool) -> Operand {
        let drop: Vec<i32> = (0..self.labels.len()).filter(|&i| !keep(self.labels[i])).map(|i| i as i32).collect();
        if !drop.is_empty() {
            self.x = self.x.sum(drop.as_slice());
            self.labels.retain(|&l| keep(l));
        }
        self
    }

    /// The array with its axes in `order` (labels it holds).
    fn arranged(&self, order: &[Label]) -> Array {
        let perm: Vec<i32> =
            order.iter().map(|l| self.labels.iter().position(|m| m == l).expect("label present") as i32).collect();
        if perm.iter().enumerate().all(|(i, &p)| i as i32 == p) { self.x.clone() } else { self.x.transpose(&perm) }
    }

    fn size_of(&self, l: Label) -> i32 {
        self.x.shape()[self.labels.iter().position(|&m| m == l).expect("label present")]
    }
}

fn repeated(labels: &[Label]) -> Option<(usize, usize)> {
    (0..labels.len()).find_map(|a| (a + 1..labels.len()).find(|&b| labels[b] == labels[a]).map(|b| (a, b)))
}

/// Contracts two operands over the labels in neither `later` nor the other's private axes.
fn contract(a: Operand, b: Operand, later: &dyn Fn(Label) -> bool, sizes: &BTreeMap<Label, i32>) -> Operand {
    let a = a.sum_unless(|l| later(l) || b.labels.contains(&l));
    let b = b.sum_unless(|l| later(l) || a.labels.contains(&l));
    let shared: Vec<Label> = a.labels.iter().copied().filter(|l| b.labels.contains(l)).collect();
    let batch: Vec<Label> = shared.iter().copied().filter(|&l| later(l)).collect();
    let summed: Vec<Label> = shared.iter().copied().filter(|&l| !later(l)).collect();
    let a_only: Vec<Label> = a.labels.iter().copied().filter(|l| !shared.contains(l)).collect();
    let b_only: Vec<Label> = b.labels.iter().copied().filter(|l| !shared.contains(l)).collect();
    let labels: Vec<Label> = batch.iter().chain(&a_only).chain(&b_only).copied().collect();

    if summed.is_empty() {
        // Nothing to sum: a broadcast product, aligned as [batch, a_only, b_only].
        let mut sa: Vec<i32> = batch.iter().chain(&a_only).map(|&l| a.size_of(l)).collect();
        sa.extend(std::iter::repeat_n(1, b_only.len()));
        let mut sb: Vec<i32> = batch.iter().map(|&l| b.size_of(l)).collect();
        sb.extend(std::iter::repeat_n(1, a_only.len()));
        sb.extend(b_only.iter().map(|&l| b.size_of(l)));
        let xa = a.arranged(&[&batch[..], &a_only[..]].concat()).reshape(sa);
        let xb = b.arranged(&[&batch[..], &b_only[..]].concat()).reshape(sb);
        return Operand { x: xa * xb, labels };
    }

    // Shared axes meet at their full size (one side may be 1 and broadcast).
    let full = |op: &Operand, order: &[Label]| -> Array {
        let x = op.arranged(order);
        let target: Vec<i32> =
            order.iter().map(|l| if shared.contains(l) { sizes[l] } else { op.size_of(*l) }).collect();
        if x.shape() == &target[..] { x } else { x.broadcast_to(target) }
    };
    let xa = full(&a, &[&batch[..], &a_only[..], &summed[..]].concat());
    let xb = full(&b, &[&batch[..], &summed[..], &b_only[..]].concat());
    let prod = |ls: &[Label], op: &Operand| -> i32 {
        ls.iter().map(|l| if shared.contains(l) { sizes[l] } else { op.size_of(*l) }).product()
    };
    let (nb, m, k, n) = (prod(&batch, &a), prod(&a_only, &a), prod(&summed, &a), prod(&b_only, &b));
    let y = xa.reshape([nb, m, k]).matmul(&xb.reshape([nb, k, n]));
    let shape: Vec<i32> = batch
        .iter()
        .map(|l| sizes[l])
        .chain(a_only.iter().map(|&l| a.size_of(l)))
        .chain(b_only.iter().map(|&l| b.size_of(l)))
        .collect();
    Operand { x: y.reshape(shape), labels }
}

/// Einstein summation over `operands` as MLX's (and NumPy's) `einsum`: `"ij,jk->ik"` names each
/// operand's axes with letters; letters repeated across operands are multiplied together, letters
/// missing from the output are summed, a letter repeated within one operand takes its diagonal,
/// and `...` stands for broadcast axes. Without `->`, the output holds the `...` axes and then
/// the letters used once, in alphabetical order. Sizes of 1 broadcast against a label's size.
///
/// ```
/// use nuvec::{array, ops};
/// let a = array![[1.0, 2.0], [3.0, 4.0]];
/// let b = array![[5.0, 6.0], [7.0, 8.0]];
/// assert_eq!(ops::einsum("ij,jk->ik", &[a.clone(), b.clone()]).to_vec::<f32>().unwrap(), vec![19.0, 22.0, 43.0, 50.0]);
/// assert_eq!(ops::einsum("ii", &[a.clone()]).item::<f32>().unwrap(), 5.0); // the trace
/// assert!(ops::einsum("ij,jk->ik", &[a]).is_failed()); // one operand for two terms
/// ```
#[track_caller]
pub fn einsum(subscripts: &str, operands: &[Array]) -> Array {
    let refs: Vec<&Array> = operands.iter().collect();
    if let Some(f) = propagate(&refs) {
        return f;
    }
    match plan_einsum(subscripts, operands) {
        Ok(y) => y,
        Err(f) => f,
    }
}

#[track_caller]
fn plan_einsum(subscripts: &str, operands: &[Array]) -> Result<Array, Array> {
    let (lhs, rhs) = match subscripts.split_once("->") {
        Some((_, r)) if r.contains("->") => {
            return Err(invalid("einsum", format!("subscripts {subscripts:?} hold more than one '->'")));
        }
        Some((l, r)) => (l, Some(r)),
        None => (subscripts, None),
    };
    let terms: Vec<&str> = lhs.split(',').collect();
    if operands.is_empty() {
        return Err(invalid("einsum", "needs at least one operand"));
    }
    if terms.len() != operands.len() {
        return Err(invalid(
            "einsum",
            format!("subscripts {subscripts:?} have {} input terms for {} operands", terms.len(), operands.len()),
        ));
    }
    let dtype = operands.iter().skip(1).fold(operands[0].dtype(), |d, a| promote_types(d, a.dtype()));
    let mut ops = Vec::with_capacity(operands.len());
    let mut sizes: BTreeMap<Label, i32> = BTreeMap::new();
    for (i, (t, x)) in terms.iter().zip(operands).enumerate() {
        let labels = labels_of(&parse_term(t)?, x.ndim(), i, t)?;
        for (axis, (&l, &d)) in labels.iter().zip(x.shape()).enumerate() {
            let earlier = labels[..axis].iter().position(|&m| m == l).map(|p| x.shape()[p]);
            if let Some(earlier) = earlier.filter(|&e| e != d) {
                return Err(invalid(
                    "einsum",
                    format!("{} names axes of sizes {earlier} and {d} in operand {i} {:?}", describe(l), x.shape()),
                ));
            }
            let s = sizes.entry(l).or_insert(d);
            if *s == 1 {
                *s = d;
            } else if d != 1 && d != *s {
                return Err(Array::failed(
                    "einsum",
                    OpErrorKind::InvalidArgument(format!(
                        "{} has size {d} in operand {i} {:?} but size {s} elsewhere, and neither is 1",
                        describe(l),
                        x.shape()
                    )),
                ));
            }
        }
        ops.push(Operand { x: x.astype(dtype), labels });
    }
    let dots: Vec<Label> = {
        let e = sizes.keys().filter(|&&l| l >= ELLIPSIS).count();
        (0..e).rev().map(|k| ELLIPSIS + k as Label).collect()
    };
    let output: Vec<Label> = match rhs {
        Some(r) => {
            let t = parse_term(r)?;
            let mut out: Vec<Label> = t.letters.iter().map(|&c| c as Label).collect();
            if let Some(at) = t.ellipsis_at {
                out.splice(at..at, dots.iter().copied());
            }
            if let Some((a, _)) = repeated(&out) {
                return Err(invalid("einsum", format!("output subscripts {r:?} repeat {}", describe(out[a]))));
            }
            if let Some(&l) = out.iter().find(|l| !sizes.contains_key(l)) {
                return Err(invalid("einsum", format!("output subscript {} appears in no input", describe(l))));
            }
            out
        }
        None => {
            let mut once: Vec<Label> = Vec::new();
            for l in sizes.keys().copied().filter(|&l| l < ELLIPSIS) {
                let count: usize = ops.iter().map(|o| o.labels.iter().filter(|&&m| m == l).count()).sum();
                if count == 1 {
                    once.push(l);
                }
            }
            dots.iter().copied().chain(once).collect()
        }
    };

    let ops: Vec<Operand> = ops.into_iter().map(Operand::diagonals).collect();
    let needed_after = |i: usize, l: Label| output.contains(&l) || ops[i + 1..].iter().any(|o| o.labels.contains(&l));
    let mut rest = ops.iter();
    let first = rest.next().expect("at least one operand");
    let mut acc = Operand { x: first.x.clone(), labels: first.labels.clone() }.sum_unless(|l| needed_after(0, l));
    for (i, b) in rest.enumerate() {
        let b = Operand { x: b.x.clone(), labels: b.labels.clone() };
        acc = contract(acc, b, &|l| needed_after(i + 1, l), &sizes);
    }
    let acc = acc.sum_unless(|l| output.contains(&l));
    let y = acc.arranged(&output);
    let target: Vec<i32> = output.iter().map(|l| sizes[l]).collect();
    Ok(if y.shape() == &target[..] { y } else { y.broadcast_to(target) })
}

/// The axes `tensordot` contracts: the last `n` of `a` with the first `n` of `b`, or two
/// explicit lists (negative axes count from the end).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TensordotAxes {
    /// The last `n` axes of `a` with the first `n` of `b`.
    Count(i32),
    /// Axes of `a` paired with axes of `b`.
    Pairs(Vec<i32>, Vec<i32>),
}

impl From<i32> for TensordotAxes {
    fn from(n: i32) -> Self {
        TensordotAxes::Count(n)
    }
}

impl<const N: usize> From<([i32; N], [i32; N])> for TensordotAxes {
    fn from((a, b): ([i32; N], [i32; N])) -> Self {
        TensordotAxes::Pairs(a.to_vec(), b.to_vec())
    }
}

impl From<(Vec<i32>, Vec<i32>)> for TensordotAxes {
    fn from((a, b): (Vec<i32>, Vec<i32>)) -> Self {
        TensordotAxes::Pairs(a, b)
    }
}

impl From<(&[i32], &[i32])> for TensordotAxes {
    fn from((a, b): (&[i32], &[i32])) -> Self {
        TensordotAxes::Pairs(a.to_vec(), b.to_vec())
    }
}

/// Sum of products over the given axes of `a` and `b`; the result holds `a`'s other axes then
/// `b`'s. `axes` is a count `n` (the last `n` axes of `a` with the first `n` of `b`) or two lists.
///
/// ```
/// use nuvec::{DType, ops};
/// let a = ops::ones([2, 3, 4], DType::F32);
/// let b = ops::ones([4, 3, 5], DType::F32);
/// assert_eq!(ops::tensordot(&a, &b, ([1, 2], [1, 0])).shape(), &[2, 5]);
/// assert_eq!(ops::tensordot(&a, &b, 1).shape(), &[2, 3, 3, 5]);
/// ```
#[track_caller]
pub fn tensordot(a: &Array, b: &Array, axes: impl Into<TensordotAxes>) -> Array {
    tensordot_named("tensordot", a, b, axes.into())
}

#[track_caller]
fn tensordot_named(op: &'static str, a: &Array, b: &Array, axes: TensordotAxes) -> Array {
    if let Some(f) = propagate(&[a, b]) {
        return f;
    }
    let (ra, rb) = (a.ndim() as i32, b.ndim() as i32);
    let (xa, xb) = match axes {
        TensordotAxes::Count(n) => {
            if n < 0 || n > ra || n > rb {
                return invalid(
                    op,
                    format!("cannot contract {n} axes of arrays with shapes {:?} and {:?}", a.shape(), b.shape()),
                );
            }
            ((ra - n..ra).collect(), (0..n).collect())
        }
        TensordotAxes::Pairs(x, y) => (x, y),
    };
    if xa.len() != xb.len() {
        return invalid(op, format!("axes lists {xa:?} and {xb:?} differ in length"));
    }
    // Axes pair up by position, so their order is kept (normalize_axes would sort them).
    let norm = |axes: &[i32], ndim: usize| -> Result<Vec<usize>, Array> {
        let mut r: Vec<usize> = Vec::with_capacity(axes.len());
        for &a in axes {
            let ax = super::axis_or_fail(op, a, ndim)?;
            if r.contains(&ax) {
                return Err(invalid(op, format!("axes {axes:?} repeat axis {a}")));
            }
            r.push(ax);
        }
        Ok(r)
    };
    let (ca, cb) = match (norm(&xa, a.ndim()), norm(&xb, b.ndim())) {
        (Ok(x), Ok(y)) => (x, y),
        (Err(f), _) | (_, Err(f)) => return f,
    };
    if let Some(i) = (0..ca.len()).find(|&i| a.shape()[ca[i]] != b.shape()[cb[i]]) {
        return Array::failed(
            op,
            OpErrorKind::InvalidArgument(format!(
                "axis {} of {:?} (size {}) and axis {} of {:?} (size {}) must match",
                ca[i],
                a.shape(),
                a.shape()[ca[i]],
                cb[i],
                b.shape(),
                b.shape()[cb[i]]
            )),
        );
    }
    let free_a: Vec<usize> = (0..a.ndim()).filter(|i| !ca.contains(i)).collect();
    let free_b: Vec<usize> = (0..b.ndim()).filter(|i| !cb.contains(i)).collect();
    let dims = |x: &Array, axes: &[usize]| -> i32 { axes.iter().map(|&i| x.shape()[i]).product() };
    let (m, k, n) = (dims(a, &free_a), dims(a, &ca), dims(b, &free_b));
    let perm_a: Vec<i32> = free_a.iter().chain(&ca).map(|&i| i as i32).collect();
    let perm_b: Vec<i32> = cb.iter().chain(&free_b).map(|&i| i as i32).collect();
    let shape: Vec<i32> = free_a.iter().map(|&i| a.shape()[i]).chain(free_b.iter().map(|&i| b.shape()[i])).collect();
    a.transpose(&perm_a).reshape([m, k]).matmul(&b.transpose(&perm_b).reshape([k, n])).reshape(shape)
}

/// Outer product: every element of `a` (flattened) times every element of `b` (flattened),
/// shape `[a.size(), b.size()]`.
///
/// ```
/// use nuvec::{array, ops};
/// let y = ops::outer(&array![1, 2], &array![1, 10, 100]);
/// assert_eq!(y.to_vec::<i32>().unwrap(), vec![1, 10, 100, 2, 20, 200]);
/// ```
#[track_caller]
pub fn outer(a: &Array, b: &Array) -> Array {
    if let Some(f) = propagate(&[a, b]) {
        return f;
    }
    a.reshape([-1, 1]) * b.reshape([1, -1])
}

/// Inner product: the sum of products over the last axes of `a` and `b` (a plain product when
/// either is 0-d); the result holds `a`'s other axes then `b`'s.
///
/// ```
/// use nuvec::{array, ops};
/// assert_eq!(ops::inner(&array![1.0, 2.0, 3.0], &array![4.0, 5.0, 6.0]).item::<f32>().unwrap(), 32.0);
/// ```
#[track_caller]
pub fn inner(a: &Array, b: &Array) -> Array {
    if let Some(f) = propagate(&[a, b]) {
        return f;
    }
    if a.ndim() == 0 || b.ndim() == 0 {
        return a * b;
    }
    if a.shape().last() != b.shape().last() {
        return Array::failed("inner", OpErrorKind::ShapeMismatch { lhs: a.shape().to_vec(), rhs: b.shape().to_vec() });
    }
    tensordot_named("inner", a, b, TensordotAxes::Pairs(vec![-1], vec![-1]))
}
