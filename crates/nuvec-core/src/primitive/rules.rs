//! Derivative and batching rules of every primitive: the dispatch to each family's rules
//! (`elementwise`, `view`, `reduce`, `fast`), and the rules of the structural primitives
//! (select, casts, copies, concatenation, window updates, products) which sit here.
//!
//! Conventions: `vjp` gets one cotangent per output and returns one per requested input
//! (`None` for zero); `jvp` gets an optional tangent per input and returns one per output;
//! `vmap` gets inputs whose batch axis, when mapped, is axis 0 and returns outputs batched on
//! axis 0 (or `None` when an output does not depend on the batch).

use crate::array::Array;
use crate::ops;
use crate::primitive::view::{view_vjp, view_vmap, window_stop};
use crate::primitive::{Primitive, gather, quantize, reduce, sort};

/// Zeros like `x` in the dtype of `x` when a rule needs a tangent for a missing one.
/// The batch size of a vmap rule's inputs: the first mapped input's axis 0 (1 when none is).
pub(crate) fn batch_size(x: &[Array], mapped: &[bool]) -> i32 {
    x.iter().zip(mapped).find(|(_, m)| **m).map_or(1, |(a, _)| a.shape()[0])
}

/// `x` batched on axis 0: itself when mapped, else broadcast along a batch axis of `b` (a view).
pub(crate) fn batched(x: &Array, mapped: bool, b: i32) -> Array {
    if mapped {
        return x.clone();
    }
    let mut s = vec![b];
    s.extend_from_slice(x.shape());
    x.expand_dims(0).broadcast_to(s)
}

fn zero(x: &Array) -> Array {
    x.zeros_like()
}

impl Primitive {
    /// Cotangents of the inputs listed in `argnums`.
    pub(crate) fn vjp(
        &self,
        inputs: &[Array],
        outputs: &[Array],
        cots: &[Array],
        argnums: &[usize],
    ) -> Vec<Option<Array>> {
        let all = self.vjp_all(inputs, outputs, cots);
        argnums
            .iter()
            .map(|&i| {
                all.get(i).cloned().flatten().map(|c| {
                    // Cotangents take their input's floating dtype (rules may promote).
                    if inputs[i].dtype().is_inexact() && c.dtype() != inputs[i].dtype() {
                        c.astype(inputs[i].dtype())
                    } else {
                        c
                    }
                })
            })
            .collect()
    }

    fn vjp_all(&self, x: &[Array], y: &[Array], g: &[Array]) -> Vec<Option<Array>> {
        let g0 = &g[0];
        match self {
            Primitive::Arange { .. } => vec![],
            Primitive::Unary(op) => vec![op.derivative(&x[0], &y[0], g0)],
            Primitive::Binary(op) => op.vjp(&x[0], &x[1], &y[0], g0).to_vec(),
            Primitive::Select => {
                let z = zero(g0);
                vec![None, Some(ops::where_(&x[0], g0, &z)), Some(ops::where_(&x[0], &z, g0))]
            }
            Primitive::AsType(_) => {
                vec![(x[0].dtype().is_inexact() && g0.dtype().is_inexact()).then(|| g0.astype(x[0].dtype()))]
            }
            Primitive::Copy | Primitive::Identity => vec![Some(g0.clone())],
            p if p.is_view() => vec![view_vjp(p, &x[0], g0)],
            Primitive::SliceUpdate { start, stop, step } => {
                let window = window_stop(stop, step, x[0].shape());
                vec![
                    Some(g0.slice_update(0.0, start, &window, step)),
                    Some(g0.slice(start, &window, step).reshape(x[1].shape())),
                ]
            }
            Primitive::Reduce { op, axes } => vec![reduce::reduce_vjp(*op, axes, &x[0], &y[0], g0)],
            Primitive::ArgReduce { .. } => vec![None],
            Primitive::Scan { op, axis, reverse, inclusive } => {
                vec![reduce::scan_vjp(*op, *axis, *reverse, *inclusive, &x[0], &y[0], g0)]
            }
            Primitive::Concatenate { axis } => {
                let mut bounds = Vec::with_capacity(x.len());
                let mut at = 0;
                for a in &x[..x.len() - 1] {
                    at += a.shape()[*axis];
                    bounds.push(at);
                }
                g0.split_at(&bounds, *axis as i32).into_iter().map(Some).collect()
            }
            Primitive::Matmul => {
                let [da, db] = matmul_vjp(&x[0], &x[1], g0);
                vec![da, db]
            }
            Primitive::AddMM { alpha, beta } => {
                let [da, db] = matmul_vjp(&x[0], &x[1], g0);
                vec![da.map(|d| d * *alpha), db.map(|d| d * *alpha), Some(g0 * *beta)]
            }
            Primitive::Fast(op) => op.vjp(x, y, g),
            Primitive::Custom(c) => c.vjp(x, y, g),
            Primitive::Compiled(c) => c.vjp(x, g),
            // Keys are integers: nothing flows back through random bits.
            Primitive::RandomBits { .. } => vec![None],
            Primitive::Sort { op, axis } => vec![sort::sort_vjp(*op, *axis, &x[0], g0)],
            Primitive::CustomKernel(k) => vec![Some(Array::from_error(k.no_rule("vjp"))); x.len()],
            Primitive::GatherAxis { axis } => gather::gather_vjp(*axis, x, g0),
            Primitive::ScatterAxis { axis, reduce } => gather::scatter_vjp(*axis, *reduce, x, &y[0], g0),
            Primitive::Dequantize { .. } => quantize::dequantize_vjp(self, x, g0),
            _ => vec![None; x.len()],
        }
    }

    /// Tangents of the outputs from (optional) tangents of the inputs.
    pub(crate) fn jvp(&self, x: &[Array], y: &[Array], t: &[Option<Array>]) -> Vec<Option<Array>> {
        let tz = |i: usize| t[i].clone().unwrap_or_else(|| zero(&x[i]));
        let float_out = y.first().is_some_and(|o| o.dtype().is_inexact());
        if !float_out && !matches!(self, Primitive::Custom(_) | Primitive::CustomKernel(_) | Primitive::Compiled(_)) {
            return vec![None; y.len()];
        }
        match self {
            Primitive::Unary(op) => vec![t[0].as_ref().and_then(|ti| op.derivative(&x[0], &y[0], ti))],
            Primitive::Binary(op) => {
                // With a widened operand, its tangent alone may be half precision.
                let t = op.jvp(&x[0], &x[1], &y[0], t[0].as_ref(), t[1].as_ref());
                vec![t.map(|t| if t.dtype() == y[0].dtype() { t } else { t.astype(y[0].dtype()) })]
            }
            Primitive::Select => vec![Some(ops::where_(&x[0], tz(1), tz(2)))],
            Primitive::AsType(d) => vec![t[0].as_ref().filter(|ti| ti.dtype().is_inexact()).map(|ti| ti.astype(*d))],
            Primitive::StopGradient | Primitive::BitCast(_) => vec![None],
            // Linear primitives: the same primitive applied to the tangents.
            Primitive::Copy
            | Primitive::Identity
            | Primitive::Reshape(_)
            | Primitive::Transpose(_)
            | Primitive::Slice { .. }
            | Primitive::Broadcast(_)
            | Primitive::Concatenate { .. }
            | Primitive::SliceUpdate { .. } => {
                let tangents: Vec<Array> = (0..x.len()).map(tz).collect();
                vec![Some(Array::from_op(self.name(), self.clone(), tangents))]
            }
            Primitive::Reduce { op: reduce::ReduceOp::Sum, .. } | Primitive::Scan { op: reduce::ScanOp::Sum, .. } => {
                vec![t[0].clone().map(|ti| Array::from_op(self.name(), self.clone(), vec![ti]))]
            }
            Primitive::Reduce { op, axes } => {
                // Directional derivative through the vjp rule's weights: sum(weights * t).
                let Some(ti) = &t[0] else { return vec![None] };
                let ones = y[0].ones_like();
                let weights = reduce::reduce_vjp(*op, axes, &x[0], &y[0], &ones);
                let axes_i: Vec<i32> = axes.iter().map(|&a| a as i32).collect();
                vec![weights.map(|w| (w * ti).sum_keepdims(&axes_i))]
            }
            Primitive::Scan { op, axis, reverse, inclusive } => {
                let Some(ti) = &t[0] else { return vec![None] };
                vec![scan_jvp(*op, *axis, *reverse, *inclusive, &x[0], &y[0], ti)]
            }
            Primitive::Matmul => {
                let terms = [t[0].as_ref().map(|ta| ta.matmul(&x[1])), t[1].as_ref().map(|tb| x[0].matmul(tb))];
                vec![sum_terms(terms)]
            }
            Primitive::AddMM { alpha, beta } => {
                let terms = [
                    t[0].as_ref().map(|ta| ta.matmul(&x[1]) * *alpha),
                    t[1].as_ref().map(|tb| x[0].matmul(tb) * *alpha),
                    t[2].as_ref().map(|tc| tc * *beta),
                ];
                vec![sum_terms(terms)]
            }
            Primitive::Fast(op) => op.jvp(x, y, t),
            Primitive::Custom(c) => c.jvp(x, y, t),
            Primitive::Compiled(c) => c.jvp(x, t),
            Primitive::CustomKernel(k) => vec![Some(Array::from_error(k.no_rule("jvp"))); y.len()],
            Primitive::RandomBits { .. } => vec![None],
            Primitive::Sort { op, axis } => vec![t[0].as_ref().and_then(|ti| sort::sort_jvp(*op, *axis, &x[0], ti))],
            Primitive::GatherAxis { axis } => vec![gather::gather_jvp(*axis, x, t)],
            Primitive::ScatterAxis { axis, reduce } => vec![gather::scatter_jvp(*axis, *reduce, x, &y[0], t)],
            Primitive::Arange { .. } | Primitive::ArgReduce { .. } | Primitive::Quantize { .. } => vec![None; y.len()],
            Primitive::Dequantize { .. } => quantize::dequantize_jvp(self, x, t),
        }
    }

    /// The primitive on batched inputs (batch axis 0 where `mapped`).
    pub(crate) fn vmap(&self, x: &[Array], mapped: &[bool], y: &[Array]) -> Vec<(Array, bool)> {
        // Unmapped inputs get a leading axis of size 1, so broadcasting lines them up.
        let lead = |i: usize| if mapped[i] { x[i].clone() } else { x[i].expand_dims(0) };
        let b = batch_size(x, mapped);
        // A batched version of every input, materialised by broadcasting where unmapped.
        let full = |i: usize| batched(&x[i], mapped[i], b);
        let one = |a: Array| vec![(a, true)];
        match self {
            Primitive::Unary(op) => one(crate::ops::elementwise::unary(*op, &x[0])),
            Primitive::Binary(op) => one(crate::ops::elementwise::binary(*op, lead(0), lead(1))),
            Primitive::Select => one(ops::where_(lead(0), lead(1), lead(2))),
            Primitive::AsType(d) => one(x[0].astype(*d)),
            Primitive::Copy => one(x[0].contiguous()),
            Primitive::Identity => one(x[0].clone()),
            p if p.is_view() => one(view_vmap(p, &x[0], y[0].shape())),
            Primitive::SliceUpdate { start, stop, step } => {
                let window = window_stop(stop, step, &x[0].shape()[if mapped[0] { 1 } else { 0 }..]);
                let st: Vec<i32> = std::iter::once(0).chain(start.iter().copied()).collect();
                let sp: Vec<i32> = std::iter::once(b).chain(window).collect();
                let sd: Vec<i32> = std::iter::once(1).chain(step.iter().copied()).collect();
                one(full(0).slice_update(full(1), &st, &sp, &sd))
            }
            Primitive::Reduce { op, axes } => {
                let ax: Vec<usize> = axes.iter().map(|&a| a + 1).collect();
                one(Array::from_op(op.name(), Primitive::Reduce { op: *op, axes: ax }, vec![x[0].clone()]))
            }
            Primitive::ArgReduce { op, axis } => {
                one(Array::from_op(op.name(), Primitive::ArgReduce { op: *op, axis: axis + 1 }, vec![x[0].clone()]))
            }
            Primitive::Scan { op, axis, reverse, inclusive } => {
                let p = Primitive::Scan { op: *op, axis: axis + 1, reverse: *reverse, inclusive: *inclusive };
                one(Array::from_op(op.name(), p, vec![x[0].clone()]))
            }
            Primitive::Concatenate { axis } => {
                let all: Vec<Array> = (0..x.len()).map(full).collect();
                one(ops::concatenate(&all, *axis as i32 + 1))
            }
            Primitive::Matmul => one(lead(0).matmul(&lead(1))),
            Primitive::AddMM { alpha, beta } => one(ops::addmm(&lead(2), &lead(0), &lead(1), *alpha, *beta)),
            Primitive::Fast(op) => op.vmap(x, mapped),
            Primitive::Custom(c) => c.vmap(x, mapped),
            Primitive::Compiled(c) => c.vmap(x, mapped),
            Primitive::CustomKernel(k) => vec![(Array::from_error(k.no_rule("vmap")), true); y.len()],
            Primitive::Arange { .. } => y.iter().map(|o| (o.clone(), false)).collect(),
            Primitive::RandomBits { .. } => one(crate::primitive::random::random_bits_vmap(self, &x[0])),
            Primitive::Sort { op, axis } => one(sort::sort_vmap(*op, *axis, &x[0])),
            Primitive::GatherAxis { .. } | Primitive::ScatterAxis { .. } => {
                one(gather::gather_scatter_vmap(self, x, mapped))
            }
            Primitive::Quantize { .. } | Primitive::Dequantize { .. } => quantize::quantize_vmap(self, x, mapped),
            _ => y.iter().map(|o| (o.clone(), false)).collect(),
        }
    }
}

fn sum_terms<const N: usize>(terms: [Option<Array>; N]) -> Option<Array> {
    terms.into_iter().flatten().reduce(|a, b| a + b)
}

/// Cotangents of a batched product `a @ b` (equal batch shapes).
fn matmul_vjp(a: &Array, b: &Array, g: &Array) -> [Option<Array>; 2] {
    if !g.dtype().is_inexact() {
        return [None, None];
    }
    [Some(g.matmul(&b.swapaxes(-1, -2))), Some(a.swapaxes(-1, -2).matmul(g))]
}

fn scan_jvp(
    op: reduce::ScanOp,
    axis: usize,
    reverse: bool,
    inclusive: bool,
    x: &Array,
    y: &Array,
    t: &Array,
) -> Option<Array> {
    use reduce::ScanOp;
    let ax = axis as i32;
    let o = ops::ScanOptions { reverse, exclusive: !inclusive };
    match op {
        ScanOp::Sum => Some(t.cumsum_with(ax, o)),
        ScanOp::Prod => Some(y * (t / x).cumsum_with(ax, o)),
        ScanOp::LogAddExp => Some((t * x.exp()).cumsum_with(ax, o) * y.negative().exp()),
        ScanOp::Max | ScanOp::Min => {
            // Output i copies input src[i]: its tangent is t[src[i]] (a one-hot product along
            // the axis; -1 or n for "none" matches no index).
            let n = x.shape()[axis];
            let src = reduce::scan_sources(op, axis, reverse, inclusive, x, y);
            let onehot = src.moveaxis(ax, -1).expand_dims(-1).equal(ops::arange(0, n, 1)).astype(t.dtype());
            Some(onehot.matmul(&t.moveaxis(ax, -1).expand_dims(-1)).squeeze(-1).moveaxis(-1, ax))
        }
    }
}
