//! Tensor-parallel linear layers over a [`Group`], as MLX's `nn.AllToShardedLinear` and
//! `nn.ShardedToAllLinear` and mlx-lm's `shard_linear`: a layer's weight split over the ranks,
//! each rank holding and computing only its part.
//!
//! * [`Sharding::AllToSharded`]: rank `r` holds rows `r·out/N ..` of the weight (and of the
//!   bias); the input is the same on every rank and each rank's output is its share of the
//!   output features. Attention's query/key/value projections and an MLP's gate and up
//!   projections are split this way, giving each rank its heads or hidden features.
//! * [`Sharding::ShardedToAll`]: rank `r` holds columns `r·in/N ..` of the weight; its input is
//!   its share of the input features, the partial products are summed over the ranks
//!   (`all_sum`) and the bias added once. Attention's output projection and an MLP's down
//!   projection follow the layers above this way.
//!
//! A quantized layer splits its packed weight, scales and biases alike; a column split must
//! keep whole quantization groups on each rank.
//!
//! An embedding table splits by vocabulary rows ([`shard_embedding`]): each rank looks up the
//! ids it holds and the rows are summed over the ranks; as a tied output head each rank makes
//! the logits of its rows and [`ShardedEmbedding::as_linear`] gathers them. An untied head is a
//! [`Sharding::AllToSharded`] layer whose output [`ShardedLinear::forward_gathered`] gathers.

use std::any::Any;

use nuvec_core::{Array, DType, Error, Result, ops};
use nuvec_distributed::Group;

use crate::layers::{Embedding, Layer, Linear};
use crate::module::{Module, Param, join};
use crate::quantize::Quantized;

/// How [`shard_linear`] splits a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sharding {
    /// Output features split: the input on every rank, each rank's output its share.
    AllToSharded,
    /// Input features split: each rank's input its share, the output summed over the ranks.
    ShardedToAll,
}

/// A [`Linear`] (quantized or not) split over a group's ranks by [`shard_linear`].
#[derive(Clone, Debug)]
pub struct ShardedLinear {
    /// This rank's part of the layer, without its bias for [`Sharding::ShardedToAll`].
    pub linear: Linear,
    /// The bias of a [`Sharding::ShardedToAll`] layer, added once after the sum.
    pub bias: Option<Param>,
    /// How the layer is split.
    pub sharding: Sharding,
    group: Group,
}

/// Part `r` of `n` equal parts of `p` along `axis` (0 or 1), frozen as `p` is.
fn part(what: &str, p: &Param, axis: usize, n: usize, r: usize) -> Result<Param> {
    let len = p.shape().get(axis).copied().unwrap_or(0) as usize;
    if n == 0 || !len.is_multiple_of(n) {
        return Err(Error::InvalidArgument(format!(
            "shard_linear: {what}'s axis {axis} ({len}) does not divide into {n} ranks"
        )));
    }
    let (m, r) = ((len / n) as i32, r as i32);
    let value = if axis == 0 { p.i(r * m..(r + 1) * m) } else { p.i((.., r * m..(r + 1) * m)) };
    Ok(Param { value, frozen: p.frozen })
}

/// This rank's part along `axis` of a weight and of its quantization's scales and biases.
fn split_weight(
    weight: &Param,
    quantized: &Option<Quantized>,
    axis: usize,
    group: &Group,
) -> Result<(Param, Option<Quantized>)> {
    let (n, r) = (group.size(), group.rank());
    let mut quantized = quantized.clone();
    if let Some(q) = &mut quantized {
        q.scales = part("scales", &q.scales, axis, n, r)?;
        q.biases = q.biases.as_ref().map(|b| part("biases", b, axis, n, r)).transpose()?;
    }
    Ok((part("weight", weight, axis, n, r)?, quantized))
}

/// `linear` split over `group` as `sharding` says, this rank keeping its part (as mlx-lm's
/// `shard_linear`). Every rank calls it on the same layer. An error names a dimension that does
/// not divide into the ranks, or a column split that would cut a quantization group.
pub fn shard_linear(linear: &Linear, sharding: Sharding, group: &Group) -> Result<ShardedLinear> {
    let n = group.size();
    if let (Sharding::ShardedToAll, Some(q)) = (sharding, &linear.quantized) {
        let input = linear.weight.shape()[1] as i64 * 32 / q.bits as i64;
        if input % (n as i64 * q.group_size as i64) != 0 {
            return Err(Error::InvalidArgument(format!(
                "shard_linear: {input} input features in {n} ranks would cut groups of {}",
                q.group_size
            )));
        }
    }
    let axis = if sharding == Sharding::AllToSharded { 0 } else { 1 };
    let (weight, quantized) = split_weight(&linear.weight, &linear.quantized, axis, group)?;
    let (inner_bias, bias) = match sharding {
        Sharding::AllToSharded => {
            (linear.bias.as_ref().map(|b| part("bias", b, 0, n, group.rank())).transpose()?, None)
        }
        Sharding::ShardedToAll => (None, linear.bias.clone()),
    };
    Ok(ShardedLinear { linear: Linear { weight, bias: inner_bias, quantized }, bias, sharding, group: group.clone() })
}

impl Module for ShardedLinear {
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param)) {
        self.linear.visit(prefix, f);
        self.bias.visit(&join(prefix, "bias"), f);
    }
    fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        self.linear.visit_mut(prefix, f);
        self.bias.visit_mut(&join(prefix, "bias"), f);
    }
    fn visit_layers_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut dyn Any)) {
        f(prefix, self)
    }
}

impl Layer for ShardedLinear {
    /// This rank's output features ([`Sharding::AllToSharded`]), or the whole output from this
    /// rank's input features ([`Sharding::ShardedToAll`]: the sum over ranks runs here, and a
    /// failed sum gives a failed array).
    fn forward(&self, x: &Array) -> Array {
        let y = self.linear.forward(x);
        if self.sharding == Sharding::AllToSharded {
            return y;
        }
        let y = self.group.all_sum(&y).unwrap_or_else(Array::from_error);
        match &self.bias {
            Some(b) => &y + &**b,
            None => y,
        }
    }
}

/// `x`'s last axis gathered over the ranks, in rank order: every rank's share of the features
/// side by side (the output of a layer split by output features, made whole). A failed
/// gather gives a failed array.
pub fn gather_features(group: &Group, x: &Array) -> Array {
    if group.size() == 1 {
        return x.clone();
    }
    let last = x.ndim() as i32 - 1;
    match group.all_gather(&x.moveaxis(last, 0)) {
        Ok(all) => all.moveaxis(0, last),
        Err(e) => Array::from_error(e),
    }
}

impl ShardedLinear {
    /// The whole output on every rank: this rank's output features of a
    /// [`Sharding::AllToSharded`] layer gathered with the other ranks' (an output head split
    /// by vocabulary); a [`Sharding::ShardedToAll`] layer's output as [`Layer::forward`].
    pub fn forward_gathered(&self, x: &Array) -> Array {
        let y = self.forward(x);
        if self.sharding == Sharding::AllToSharded { gather_features(&self.group, &y) } else { y }
    }
}

/// An [`Embedding`] split by vocabulary rows over a group's ranks ([`shard_embedding`]).
#[derive(Clone, Debug)]
pub struct ShardedEmbedding {
    /// This rank's rows of the table.
    pub embedding: Embedding,
    /// The first id this rank holds.
    pub start: i32,
    group: Group,
}

/// `embedding` split over `group` by vocabulary rows, this rank keeping its share; every rank
/// calls it on the same table. An error names a vocabulary that does not divide into the ranks.
pub fn shard_embedding(embedding: &Embedding, group: &Group) -> Result<ShardedEmbedding> {
    let (weight, quantized) = split_weight(&embedding.weight, &embedding.quantized, 0, group)?;
    Ok(ShardedEmbedding::from_part(Embedding { weight, quantized }, group))
}

impl ShardedEmbedding {
    /// A table whose `embedding` already holds this rank's share of the rows (as
    /// [`shard_embedding`] keeps it): rank `r` holds ids `r·rows ..`.
    pub fn from_part(embedding: Embedding, group: &Group) -> ShardedEmbedding {
        let start = embedding.weight.shape()[0] * group.rank() as i32;
        ShardedEmbedding { embedding, start, group: group.clone() }
    }

    /// The vectors of `ids` in `dtype` on every rank: each rank's rows for the ids it holds
    /// (zeros for the others), summed over the ranks.
    pub fn forward_in(&self, ids: &Array, dtype: DType) -> Array {
        let rows = self.embedding.weight.shape()[0];
        let local = ids - self.start;
        let held = ops::logical_and(ops::greater_equal(&local, 0), ops::less(&local, rows));
        let found = self.embedding.forward_in(&local.clip(0, rows - 1), dtype);
        let mine = ops::where_(held.expand_dims(-1), &found, 0.0f32);
        self.group.all_sum(&mine).unwrap_or_else(Array::from_error)
    }

    /// The table as a tied output head: `x Wᵀ` over the whole vocabulary on every rank, each
    /// rank making its rows' logits.
    pub fn as_linear(&self, x: &Array) -> Array {
        gather_features(&self.group, &self.embedding.as_linear(x))
    }
}

impl Module for ShardedEmbedding {
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param)) {
        self.embedding.visit(prefix, f);
    }
    fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        self.embedding.visit_mut(prefix, f);
    }
    fn visit_layers_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut dyn Any)) {
        f(prefix, self)
    }
}

impl Layer for ShardedEmbedding {
    fn forward(&self, ids: &Array) -> Array {
        // A quantized table's rows come out in its scales' dtype, as Embedding's do.
        let dtype = self.embedding.quantized.as_ref().map_or(self.embedding.weight.dtype(), |q| q.scales.dtype());
        self.forward_in(ids, dtype)
    }
}
