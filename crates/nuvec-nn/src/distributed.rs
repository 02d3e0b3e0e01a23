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

use std::any::Any;

use nuvec_core::{Array, Error, Result};
use nuvec_distributed::Group;

use crate::layers::{Layer, Linear};
use crate::module::{Module, Param, join};

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

/// Part `r` of `n` equal parts of `a` along `axis` (0 or 1).
fn part(what: &str, a: &Array, axis: usize, n: usize, r: usize) -> Result<Array> {
    let len = a.shape().get(axis).copied().unwrap_or(0) as usize;
    if n == 0 || !len.is_multiple_of(n) {
        return Err(Error::InvalidArgument(format!(
            "shard_linear: {what}'s axis {axis} ({len}) does not divide into {n} ranks"
        )));
    }
    let (m, r) = ((len / n) as i32, r as i32);
    let out = if axis == 0 { a.i(r * m..(r + 1) * m) } else { a.i((.., r * m..(r + 1) * m)) };
    Ok(out)
}

/// `linear` split over `group` as `sharding` says, this rank keeping its part (as mlx-lm's
/// `shard_linear`). Every rank calls it on the same layer. An error names a dimension that does
/// not divide into the ranks, or a column split that would cut a quantization group.
pub fn shard_linear(linear: &Linear, sharding: Sharding, group: &Group) -> Result<ShardedLinear> {
    let (n, r) = (group.size(), group.rank());
    let axis = if sharding == Sharding::AllToSharded { 0 } else { 1 };
    let frozen = |p: &Param, v: Array| Param { value: v, frozen: p.frozen };
    let split = |what: &str, p: &Param| part(what, p, axis, n, r).map(|v| frozen(p, v));
    let mut quantized = linear.quantized.clone();
    if let Some(q) = &mut quantized {
        if axis == 1 {
            let input = linear.weight.shape()[1] as i64 * 32 / q.bits as i64;
            if input % (n as i64 * q.group_size as i64) != 0 {
                return Err(Error::InvalidArgument(format!(
                    "shard_linear: {input} input features in {n} ranks would cut groups of {}",
                    q.group_size
                )));
            }
        }
        q.scales = split("scales", &q.scales)?;
        q.biases = q.biases.as_ref().map(|b| split("biases", b)).transpose()?;
    }
    let weight = split("weight", &linear.weight)?;
    let (inner_bias, bias) = match sharding {
        Sharding::AllToSharded => {
            (linear.bias.as_ref().map(|b| part("bias", b, 0, n, r).map(|v| frozen(b, v))).transpose()?, None)
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
