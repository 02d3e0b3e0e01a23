//! The Llama decoder and its close relatives: `llama` (Llama 2 and 3.x, SmolLM2), `mistral`,
//! `qwen2` (biases on the query, key and value projections), `qwen3` (RMS norms on each
//! query and key head) and `qwen3_moe` (Qwen3 with experts in place of some MLPs).
//! Parameter names are Hugging Face's.

use std::any::Any;

use nuvec::Array;
use nuvec::distributed::Group;
use nuvec::nn::{Embedding, Linear, Module, Param, ShardedEmbedding, gather_features, shard_embedding};
use nuvec_nn::module;

use super::LanguageModel;
use super::layers::{Activation, Attention, AttentionSpec, Input, Mlp, Norm, embedding, linear, logits, rows_of};
use super::switch::SparseMoe;
use crate::cache::{KvCache, Positions};
use crate::config::ModelConfig;
use crate::rope::Rope;
use crate::{Error, Result};

/// The MLP of a layer: dense, or a mixture of experts (Qwen3-MoE's sparse layers).
pub enum FeedForward {
    /// The gated MLP.
    Dense(Mlp),
    /// Experts picked per token.
    Sparse(SparseMoe),
}

impl Module for FeedForward {
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param)) {
        match self {
            FeedForward::Dense(m) => m.visit(prefix, f),
            FeedForward::Sparse(m) => m.visit(prefix, f),
        }
    }
    fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        match self {
            FeedForward::Dense(m) => m.visit_mut(prefix, f),
            FeedForward::Sparse(m) => m.visit_mut(prefix, f),
        }
    }
    fn visit_layers_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut dyn Any)) {
        match self {
            FeedForward::Dense(m) => m.visit_layers_mut(prefix, f),
            FeedForward::Sparse(m) => m.visit_layers_mut(prefix, f),
        }
    }
}

/// One decoder layer: pre-norm attention and MLP, each added to the residual stream.
pub struct Block {
    /// Attention.
    pub self_attn: Attention,
    /// MLP.
    pub mlp: FeedForward,
    /// The norm before attention.
    pub input_layernorm: Norm,
    /// The norm before the MLP.
    pub post_attention_layernorm: Norm,
}
module!(Block { self_attn, mlp, input_layernorm, post_attention_layernorm });

/// The embedding, the layers and the final norm (Hugging Face's `model.` prefix).
pub struct Decoder {
    /// Token embeddings.
    pub embed_tokens: Embedding,
    /// The layers.
    pub layers: Vec<Block>,
    /// The final norm.
    pub norm: Norm,
}
module!(Decoder { embed_tokens, layers, norm });

/// A Llama-family language model.
pub struct Llama {
    /// The decoder.
    pub model: Decoder,
    /// The output projection (`None`: tied to the embedding table).
    pub lm_head: Option<Linear>,
    config: ModelConfig,
    rope: Rope,
    spec: AttentionSpec,
    act: Activation,
    /// The ranks the model is split over ([`LanguageModel::shard`]), and whether the
    /// vocabulary (embedding table and output head) is split too.
    parallel: Option<(Group, bool)>,
}
module!(Llama { model, lm_head });

impl Llama {
    /// A model of `config`'s shape with placeholder weights; `tied` leaves out `lm_head`.
    pub fn new(config: &ModelConfig, tied: bool) -> Result<Llama> {
        let h = config.hidden_size;
        let qkv_bias = config.attention_bias || config.model_type == "qwen2";
        let head_norms = matches!(config.model_type.as_str(), "qwen3" | "qwen3_moe").then_some(false);
        let norm = || Norm::new(h, config.rms_norm_eps, false);
        let layers = (0..config.num_hidden_layers)
            .map(|i| Block {
                self_attn: Attention::new(config, qkv_bias, head_norms),
                mlp: if config.is_sparse(i) {
                    FeedForward::Sparse(SparseMoe::new(
                        h,
                        config.moe_intermediate_size.unwrap_or(0),
                        config.num_experts.unwrap_or(0),
                        config.num_experts_per_tok.unwrap_or(0),
                        config.norm_topk_prob.unwrap_or(false),
                    ))
                } else {
                    FeedForward::Dense(Mlp::new(h, config.intermediate_size, config.mlp_bias))
                },
                input_layernorm: norm(),
                post_attention_layernorm: norm(),
            })
            .collect();
        Ok(Llama {
            model: Decoder { embed_tokens: embedding(config.vocab_size, h), layers, norm: norm() },
            lm_head: (!tied).then(|| linear(h, config.vocab_size, false)),
            config: config.clone(),
            rope: Rope::from_config(config)?,
            spec: AttentionSpec::of(config),
            act: Activation::of(config)?,
            parallel: None,
        })
    }

    fn run(&self, tokens: &Array, caches: &mut [KvCache], at: Option<&Positions>) -> Array {
        let group = self.parallel.as_ref().map(|(g, _)| g);
        let vocab_split = self.parallel.as_ref().and_then(|(g, split)| split.then_some(g));
        // Split over ranks, each layer's partial outputs are summed, the residual added by
        // rank 0 alone (inside its product).
        let adds_residual = group.is_none_or(|g| g.rank() == 0);
        let sum = |y: Array| match group {
            Some(g) => g.all_sum(&y).unwrap_or_else(Array::from_error),
            None => y,
        };
        // In the model's dtype (its norms'): a GGUF's tables keep float16 scales.
        let dtype = self.model.norm.weight.dtype();
        let mut h = match vocab_split {
            Some(g) => ShardedEmbedding::from_part(self.model.embed_tokens.clone(), g).forward_in(tokens, dtype),
            None => self.model.embed_tokens.forward_in(tokens, dtype),
        };
        for (layer, cache) in self.model.layers.iter().zip(caches.iter_mut()) {
            let x = Input::normed(&h, &layer.input_layernorm);
            h = sum(layer.self_attn.forward(x, cache, at, &self.rope, &self.spec, adds_residual.then_some(&h)));
            // A failed step (bad cache parameters, say) carries its error out, not on.
            if h.is_failed() {
                return h;
            }
            let x = Input::normed(&h, &layer.post_attention_layernorm);
            h = match &layer.mlp {
                FeedForward::Dense(m) => sum(m.forward(x, self.act, adds_residual.then_some(&h))),
                FeedForward::Sparse(m) => &h + &m.forward(&x.rows()),
            };
        }
        let y = logits(&self.model.norm.forward(&h), &self.model.embed_tokens, &self.lm_head);
        match vocab_split {
            Some(g) => gather_features(g, &y),
            None => y,
        }
    }
}

impl LanguageModel for Llama {
    fn forward(&self, tokens: &Array, caches: &mut [KvCache]) -> Array {
        self.run(tokens, caches, None)
    }

    fn forward_at(&self, tokens: &Array, caches: &mut [KvCache], at: &Positions) -> Array {
        self.run(tokens, caches, Some(at))
    }

    fn device_positions(&self) -> bool {
        self.rope.device_positions()
    }

    fn fuse_projections(&mut self) {
        for layer in &mut self.model.layers {
            layer.self_attn.fuse();
            if let FeedForward::Dense(m) = &mut layer.mlp {
                m.fuse();
            }
        }
    }

    fn shard(&mut self, group: &Group) -> Result<()> {
        let (n, c) = (group.size() as i32, &self.config);
        if self.parallel.is_some() {
            return Err(Error::Config("shard: the model is already split over ranks".into()));
        }
        if n == 1 {
            return Ok(());
        }
        let why = |what: String| Error::Config(format!("shard: cannot split over {n} ranks: {what}"));
        if self.model.layers.iter().any(|l| matches!(l.mlp, FeedForward::Sparse(_))) {
            return Err(why("the experts of a mixture-of-experts layer are not split".into()));
        }
        let (hq, hkv) = (c.num_attention_heads, c.kv_heads());
        if hq % n != 0 || hkv % n != 0 {
            return Err(why(format!("{hq} query heads and {hkv} key-value heads must each divide into them")));
        }
        if c.intermediate_size % n != 0 {
            return Err(why(format!("{} hidden MLP features do not divide into them", c.intermediate_size)));
        }
        for layer in &mut self.model.layers {
            layer.self_attn.shard(group)?;
            if let FeedForward::Dense(m) = &mut layer.mlp {
                m.shard(group)?;
            }
        }
        (self.spec.heads, self.spec.kv_heads) = (hq / n, hkv / n);
        // A vocabulary that does not divide stays whole on every rank.
        let vocab_split = c.vocab_size % n == 0;
        if vocab_split {
            self.model.embed_tokens = shard_embedding(&self.model.embed_tokens, group)?.embedding;
            self.lm_head = self.lm_head.as_ref().map(|h| rows_of(h, group)).transpose()?;
        }
        self.parallel = Some((group.clone(), vocab_split));
        Ok(())
    }

    fn group(&self) -> Option<&Group> {
        self.parallel.as_ref().map(|(g, _)| g)
    }

    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn new_cache(&self) -> Vec<KvCache> {
        (0..self.config.num_hidden_layers).map(|_| KvCache::new()).collect()
    }
}
