//! The blocks the architectures share (mlx-lm's `models/base.py`): the RMS norm, attention
//! with grouped key-value heads, and the gated MLP. Parameter names are Hugging Face's.

use nuvec::distributed::Group;
use nuvec::fast::{self, AttentionOptions};
use nuvec::nn::{Embedding, Layer, Linear, Param, Sharding, shard_linear};
use nuvec::{Array, DType, ops};
use nuvec_nn::module;

use super::Fused;
use crate::cache::{KvCache, Positions};
use crate::config::ModelConfig;
use crate::rope::Rope;
use crate::{Error, Result};

/// A placeholder weight: lazy zeros, never evaluated once the checkpoint's weights replace it.
pub fn linear(input: i32, output: i32, bias: bool) -> Linear {
    Linear {
        weight: Param::new(ops::zeros([output, input], DType::F32)),
        bias: bias.then(|| Param::new(ops::zeros([output], DType::F32))),
        quantized: None,
    }
}

/// A placeholder table of `vocab` embeddings of `hidden` features (lazy zeros).
pub fn embedding(vocab: i32, hidden: i32) -> Embedding {
    Embedding { weight: Param::new(ops::zeros([vocab, hidden], DType::F32)), quantized: None }
}

/// The logits of the final hidden states `h`: the output projection, or the embedding table
/// when they are tied.
pub fn logits(h: &Array, embed_tokens: &Embedding, lm_head: &Option<Linear>) -> Array {
    match lm_head {
        Some(head) => head.forward(h),
        None => embed_tokens.as_linear(h),
    }
}

/// `residual + layer(x)`: one product (`addmm`, whose few-row GPU kernel adds the residual as
/// it writes) for a float weight without bias, else the layer and an addition.
pub fn plus_linear(residual: &Array, layer: &Linear, x: &Array) -> Array {
    match (&layer.quantized, &layer.bias) {
        (None, None) => ops::addmm(residual, x, &layer.weight.t(), 1.0, 1.0),
        _ => residual + &layer.forward(x),
    }
}

/// This rank's part of `layer` split by output features (rows) over `group`.
pub fn rows_of(layer: &Linear, group: &Group) -> Result<Linear> {
    Ok(shard_linear(layer, Sharding::AllToSharded, group)?.linear)
}

/// This rank's part of `layer` split by input features (columns) over `group`: the ranks' outputs
/// sum to the layer's, so the bias stays with rank 0 alone.
pub fn columns_of(layer: &Linear, group: &Group) -> Result<Linear> {
    let part = shard_linear(layer, Sharding::ShardedToAll, group)?;
    Ok(Linear { bias: part.bias.filter(|_| group.rank() == 0), ..part.linear })
}

/// Root-mean-square normalisation over the last axis, scaled by `weight`, or by
/// `1 + weight` when `shifted` (Gemma's checkpoints store the scale's offset from one).
#[derive(Clone, Debug)]
pub struct Norm {
    /// `[dims]`.
    pub weight: Param,
    /// Added to the mean square.
    pub eps: f32,
    /// The scale is `1 + weight`.
    pub shifted: bool,
}
module!(Norm { weight });

impl Norm {
    /// Over `dims` features, with the identity scale.
    pub fn new(dims: i32, eps: f32, shifted: bool) -> Norm {
        let init = if shifted { ops::zeros([dims], DType::F32) } else { ops::ones([dims], DType::F32) };
        Norm { weight: Param::new(init), eps, shifted }
    }

    /// `x` normalised.
    pub fn forward(&self, x: &Array) -> Array {
        fast::rms_norm(x, &self.scale(), self.eps)
    }

    /// The scale the normalised rows are multiplied by.
    pub fn scale(&self) -> Array {
        if self.shifted { &*self.weight + 1.0f32 } else { self.weight.value.clone() }
    }
}

/// What a layer's first projections read: `x`, or `x` through an RMS norm, which a float
/// projection without bias takes in its product ([`fast::rms_norm_matmul`]: on the GPU the
/// product's kernel normalises the rows as it reads them, so the norm costs no kernel).
#[derive(Clone, Copy)]
pub struct Input<'a> {
    /// The rows.
    pub x: &'a Array,
    /// The norm before the projections.
    pub norm: Option<&'a Norm>,
}

impl<'a> Input<'a> {
    /// `x` through `norm`.
    pub fn normed(x: &'a Array, norm: &'a Norm) -> Input<'a> {
        Input { x, norm: Some(norm) }
    }

    /// The rows the projections read (normalised).
    pub fn rows(&self) -> Array {
        self.norm.map_or_else(|| self.x.clone(), |n| n.forward(self.x))
    }

    /// `layer` of the (normalised) rows: the norm in the product when `layer` has a float
    /// weight and no bias.
    pub fn project(&self, layer: &Linear) -> Array {
        match (self.norm, &layer.quantized, &layer.bias) {
            (Some(n), None, None) => fast::rms_norm_matmul(self.x, &n.scale(), n.eps, &layer.weight.t()),
            _ => layer.forward(&self.rows()),
        }
    }
}

/// The shape and arithmetic of one layer's attention.
#[derive(Clone, Copy, Debug)]
pub struct AttentionSpec {
    /// Query heads.
    pub heads: i32,
    /// Key-value heads.
    pub kv_heads: i32,
    /// Features per head.
    pub head_dim: i32,
    /// Scores are `scale · q·k`.
    pub scale: f32,
    /// Each query attends at most this many keys (a sliding-window layer).
    pub window: Option<i32>,
}

impl AttentionSpec {
    /// `config`'s heads, scaled by `1/√head_dim`, no window.
    pub fn of(config: &ModelConfig) -> AttentionSpec {
        let d = config.head_dim();
        AttentionSpec {
            heads: config.num_attention_heads,
            kv_heads: config.kv_heads(),
            head_dim: d,
            scale: 1.0 / (d as f32).sqrt(),
            window: None,
        }
    }
}

/// Self-attention with grouped key-value heads.
pub struct Attention {
    /// Queries.
    pub q_proj: Linear,
    /// Keys.
    pub k_proj: Linear,
    /// Values.
    pub v_proj: Linear,
    /// Output.
    pub o_proj: Linear,
    /// A norm on each query head (Qwen3, Gemma 3).
    pub q_norm: Option<Norm>,
    /// A norm on each key head.
    pub k_norm: Option<Norm>,
    /// The three projections joined ([`super::LanguageModel::fuse_projections`]).
    pub qkv: Option<Fused>,
}
module!(Attention { q_proj, k_proj, v_proj, o_proj, q_norm, k_norm });

impl Attention {
    /// Placeholder projections of `config`'s shape; `qkv_bias` on queries, keys and values,
    /// `attention_bias` on the output too; `head_norms`: a norm per query and key head,
    /// shifted as Gemma's or not.
    pub fn new(config: &ModelConfig, qkv_bias: bool, head_norms: Option<bool>) -> Attention {
        let (h, d) = (config.hidden_size, config.head_dim());
        let (hq, hkv) = (config.num_attention_heads, config.kv_heads());
        let norm = |shifted| Norm::new(d, config.rms_norm_eps, shifted);
        Attention {
            q_proj: linear(h, hq * d, qkv_bias),
            k_proj: linear(h, hkv * d, qkv_bias),
            v_proj: linear(h, hkv * d, qkv_bias),
            o_proj: linear(hq * d, h, config.attention_bias),
            q_norm: head_norms.map(norm),
            k_norm: head_norms.map(norm),
            qkv: None,
        }
    }

    /// Splits the heads over `group` (tensor parallelism): each rank keeps its query and
    /// key-value heads' rows of the input projections and their columns of the output one,
    /// whose products the caller sums over the ranks. Joined projections come apart.
    pub fn shard(&mut self, group: &Group) -> Result<()> {
        self.qkv = None;
        for p in [&mut self.q_proj, &mut self.k_proj, &mut self.v_proj] {
            *p = rows_of(p, group)?;
        }
        self.o_proj = columns_of(&self.o_proj, group)?;
        Ok(())
    }

    /// Joins the query, key and value projections.
    pub fn fuse(&mut self) {
        self.qkv = Fused::join(&mut [&mut self.q_proj, &mut self.k_proj, &mut self.v_proj]);
    }

    /// Attention of `input [B, L, hidden]` over `cache` and itself, positions from the cache's
    /// count or, with `at`, from the device ([`KvCache::update_at`]); with `residual`, added
    /// to the output projection ([`plus_linear`]).
    pub fn forward(
        &self,
        input: Input,
        cache: &mut KvCache,
        at: Option<&Positions>,
        rope: &Rope,
        spec: &AttentionSpec,
        residual: Option<&Array>,
    ) -> Array {
        let (b, l) = (input.x.shape()[0], input.x.shape()[1]);
        let (d, hq, hkv) = (spec.head_dim, spec.heads, spec.kv_heads);
        // With the projections joined, one product gives every head: [B, L, Hq + 2·Hkv, D].
        let joined = self.qkv.as_ref().and_then(|f| f.project(input, &[&self.q_proj, &self.k_proj, &self.v_proj]));
        let joined = joined.map(|y| y.reshape([b, l, hq + 2 * hkv, d]));
        // Decoding at device positions into a contiguous cache: the rotation and the writes
        // are one operation.
        if let (Some(y), Some(at), None, None) = (&joined, at, &self.q_norm, &self.k_norm)
            && let Some((q, k, v)) = cache.rope_update_at(y, hq, rope, at)
        {
            let o = match at.fresh {
                // The rows start at 0: their keys are the buffers' first `l` positions.
                true => causal(&q, &first(&k, l), &first(&v, l), spec),
                false => over_table(&q, &k, &v, cache, at, spec),
            };
            return self.output(&o, b, l, hq * d, residual);
        }
        // Without the joined product, each projection reads the (normalised) rows.
        let rows = joined.is_none().then(|| input.rows());
        // Heads `first..first + n` of the joined product, else `proj`'s own.
        let heads = |proj: &Linear, first: i32, n: i32, norm: &Option<Norm>| {
            let y = match &joined {
                Some(y) => y.slice(&[0, 0, first, 0], &[b, l, first + n, d], &[1, 1, 1, 1]),
                None => proj.forward(rows.as_ref().unwrap_or(input.x)).reshape([b, l, n, d]),
            };
            let y = match norm {
                Some(n) => n.forward(&y),
                None => y,
            };
            y.transpose(&[0, 2, 1, 3])
        };
        let rotate = |y: &Array| match at {
            Some(at) => rope.apply_at(y, &at.start),
            None => rope.apply(y, cache.offset()),
        };
        let (q, k) = if joined.is_some() && self.q_norm.is_none() && self.k_norm.is_none() {
            // The query and key heads sit together in the joined product: one rotation.
            let qk = rotate(&heads(&self.q_proj, 0, hq + hkv, &None));
            let part = |first: i32, n: i32| qk.slice(&[0, first, 0, 0], &[b, first + n, l, d], &[1, 1, 1, 1]);
            (part(0, hq), part(hq, hkv))
        } else {
            (rotate(&heads(&self.q_proj, 0, hq, &self.q_norm)), rotate(&heads(&self.k_proj, hq, hkv, &self.k_norm)))
        };
        let v = heads(&self.v_proj, hq + hkv, hkv, &None);
        let o = attend(&q, &k, &v, cache, at, spec);
        self.output(&o, b, l, hq * d, residual)
    }

    /// The output projection of the heads `o [B, Hq, L, D]` (plus `residual`).
    fn output(&self, o: &Array, b: i32, l: i32, features: i32, residual: Option<&Array>) -> Array {
        let o = o.transpose(&[0, 2, 1, 3]).reshape([b, l, features]);
        match residual {
            Some(r) => plus_linear(r, &self.o_proj, &o),
            None => self.o_proj.forward(&o),
        }
    }
}

/// Attention of the rotated queries `q [B, Hq, L, D]` over `cache` and the step's keys and
/// values `k`, `v` (`[B, Hkv, L, D]`), which the cache takes: `[B, Hq, L, D]`. Positions come
/// from the cache's count or, with `at`, from the device ([`KvCache::update_at`]); a paged
/// cache is read through its block table either way.
pub fn attend(
    q: &Array,
    k: &Array,
    v: &Array,
    cache: &mut KvCache,
    at: Option<&Positions>,
    spec: &AttentionSpec,
) -> Array {
    // A failed projection's error goes on; its shape may not be [B, H, L, D].
    if let Some(failed) = [q, k, v].into_iter().find(|a| a.is_failed() || a.ndim() != 4) {
        return match failed.is_failed() {
            true => failed.clone(),
            false => Array::failed(
                "attention",
                nuvec::OpErrorKind::InvalidArgument(format!(
                    "q, k and v must be [B, H, L, D], got {:?}",
                    failed.shape()
                )),
            ),
        };
    }
    let (b, l) = (q.shape()[0], q.shape()[2]);
    // Attention over positions written at device-held starts: `paged_attention`, over a
    // paged cache's blocks or one block per row of a contiguous cache.
    let paged = |cache: &mut KvCache, at: &Positions| {
        let (kc, vc) = cache.update_at(k, v, at);
        match at.fresh {
            // Prompts' first positions: their own keys, causal (flash attention, no gather).
            // The writes stay in the caches' arrays, which the caller evaluates.
            true => causal(q, k, v, spec),
            false => over_table(q, &kc, &vc, cache, at, spec),
        }
    };
    match at {
        Some(at) => paged(cache, at),
        None if cache.block_size().is_some() => {
            let (start, end) = (cache.offset(), cache.offset() + l);
            let rows = |n: i32| Array::from_slice(&vec![n; b as usize], [b]);
            let at = Positions::new(rows(start), rows(end));
            paged(cache, &if start == 0 { at.fresh() } else { at })
        }
        None => {
            let (k, v) = cache.update_and_fetch(k, v);
            // The layer's own window holds whatever the cache keeps; a rotating cache's
            // window applies to the queries of a prompt (one query sees its whole buffer).
            let window = spec.window.or(cache.window().filter(|_| l > 1));
            fast::scaled_dot_product_attention(q, &k, &v, spec.scale, &causal_options(l, window))
        }
    }
}

/// Attention options for `l` queries at the end of the keys: causal, within `window`.
fn causal_options(l: i32, window: Option<i32>) -> AttentionOptions<'static> {
    match (l > 1, window) {
        (_, Some(w)) => AttentionOptions::causal().window(w),
        (true, None) => AttentionOptions::causal(),
        (false, None) => AttentionOptions::default(),
    }
}

/// `paged_attention` of `q` over the cache buffers `k` and `v` through the cache's block table
/// (or one block per row of a contiguous cache), up to the rows' device-held lengths.
fn over_table(q: &Array, k: &Array, v: &Array, cache: &KvCache, at: &Positions, spec: &AttentionSpec) -> Array {
    let tables = cache.page_table().unwrap_or(&at.tables);
    let options = spec.window.map_or_else(AttentionOptions::default, |w| AttentionOptions::default().window(w));
    fast::paged_attention(q, k, v, tables, &at.lengths, spec.scale, &options)
}

/// Causal attention of `q [B, Hq, L, D]` over keys and values `[B, Hkv, L, D]` that are the
/// same positions, within `spec`'s window.
fn causal(q: &Array, k: &Array, v: &Array, spec: &AttentionSpec) -> Array {
    fast::scaled_dot_product_attention(q, k, v, spec.scale, &causal_options(q.shape()[2], spec.window))
}

/// The first `l` positions of a `[B, H, capacity, D]` buffer.
fn first(x: &Array, l: i32) -> Array {
    let s = x.shape();
    x.slice(&[0, 0, 0, 0], &[s[0], s[1], l, s[3]], &[1, 1, 1, 1])
}

/// The MLP's activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `x σ(x)`: `silu` (the default).
    Silu,
    /// GELU's tanh approximation: `gelu_pytorch_tanh` (Gemma).
    GeluTanh,
    /// GELU: `gelu`.
    Gelu,
}

impl Activation {
    /// `config`'s `hidden_activation` (or `hidden_act`); an error names an unknown one.
    pub fn of(config: &ModelConfig) -> Result<Activation> {
        match config.hidden_activation.as_deref().unwrap_or("silu") {
            "silu" | "swish" => Ok(Activation::Silu),
            "gelu_pytorch_tanh" | "gelu_new" | "gelu_approx" => Ok(Activation::GeluTanh),
            "gelu" => Ok(Activation::Gelu),
            other => Err(Error::Config(format!(
                "hidden_activation '{other}' is not supported (silu, gelu, gelu_pytorch_tanh are)"
            ))),
        }
    }

    /// `act(gate) · up`.
    pub fn gated(self, gate: &Array, up: &Array) -> Array {
        match self {
            Activation::Silu => fast::swiglu(gate, up),
            Activation::GeluTanh => &nuvec::nn::gelu_approx(gate) * up,
            Activation::Gelu => &nuvec::nn::gelu(gate) * up,
        }
    }
}

/// The gated MLP: `down(act(gate(x)) · up(x))`.
pub struct Mlp {
    /// The gate.
    pub gate_proj: Linear,
    /// The up projection.
    pub up_proj: Linear,
    /// The down projection.
    pub down_proj: Linear,
    /// The gate and up projections joined ([`super::LanguageModel::fuse_projections`]).
    pub gate_up: Option<Fused>,
}
module!(Mlp { gate_proj, up_proj, down_proj });

impl Mlp {
    /// Placeholder projections from `hidden` to `inner` features and back.
    pub fn new(hidden: i32, inner: i32, bias: bool) -> Mlp {
        Mlp {
            gate_proj: linear(hidden, inner, bias),
            up_proj: linear(hidden, inner, bias),
            down_proj: linear(inner, hidden, bias),
            gate_up: None,
        }
    }

    /// Splits the hidden features over `group` (tensor parallelism): each rank keeps its rows of
    /// the gate and up projections and their columns of the down one, whose products the
    /// caller sums over the ranks. Joined projections come apart.
    pub fn shard(&mut self, group: &Group) -> Result<()> {
        self.gate_up = None;
        self.gate_proj = rows_of(&self.gate_proj, group)?;
        self.up_proj = rows_of(&self.up_proj, group)?;
        self.down_proj = columns_of(&self.down_proj, group)?;
        Ok(())
    }

    /// Joins the gate and up projections.
    pub fn fuse(&mut self) {
        self.gate_up = Fused::join(&mut [&mut self.gate_proj, &mut self.up_proj]);
    }

    /// The MLP of `input [.., hidden]`; with `residual`, added to the down projection
    /// ([`plus_linear`]). SwiGLU with a float down projection without bias is one product
    /// ([`fast::swiglu_matmul`]: on the GPU its kernel applies the activation as it reads).
    pub fn forward(&self, input: Input, act: Activation, residual: Option<&Array>) -> Array {
        let (gate, up) = match self.gate_up.as_ref().and_then(|f| f.project(input, &[&self.gate_proj, &self.up_proj])) {
            Some(y) => {
                let s = y.shape().to_vec();
                let r = s.len();
                let f = s[r - 1] / 2;
                let half = |from: i32| {
                    let (mut lo, mut hi) = (vec![0; r], s.clone());
                    (lo[r - 1], hi[r - 1]) = (from, from + f);
                    y.slice(&lo, &hi, &vec![1; r])
                };
                (half(0), half(f))
            }
            None => {
                let x = input.rows();
                (self.gate_proj.forward(&x), self.up_proj.forward(&x))
            }
        };
        let down = &self.down_proj;
        if act == Activation::Silu && down.quantized.is_none() && down.bias.is_none() {
            return fast::swiglu_matmul(&gate, &up, &down.weight.t(), residual);
        }
        let gated = act.gated(&gate, &up);
        match residual {
            Some(r) => plus_linear(r, down, &gated),
            None => down.forward(&gated),
        }
    }
}
