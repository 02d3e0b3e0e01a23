//! Gemma 3's language model (`gemma3_text`, and the text part of the multimodal `gemma3`):
//! sliding-window layers between full-attention ones, each kind with its own RoPE; norms
//! before and after both the attention and the MLP, scaling by `1 + weight`; embeddings
//! scaled by `√hidden`; a GELU MLP; logits soft-capped when `final_logit_softcapping` says
//! so (`attn_logit_softcapping` is left unused, as transformers and mlx-lm leave it for
//! Gemma 3). Parameter names are Hugging Face's.

use nuvec::Array;
use nuvec::nn::{Embedding, Linear, Params};
use nuvec_nn::module;

use super::LanguageModel;
use super::layers::{Activation, Attention, AttentionSpec, Input, Mlp, Norm, embedding, linear, logits};
use crate::Result;
use crate::cache::{KvCache, Positions};
use crate::config::ModelConfig;
use crate::rope::Rope;

/// One decoder layer: attention and MLP, each between two norms, added to the residual.
pub struct Block {
    /// Attention.
    pub self_attn: Attention,
    /// MLP.
    pub mlp: Mlp,
    /// Before attention.
    pub input_layernorm: Norm,
    /// After attention.
    pub post_attention_layernorm: Norm,
    /// Before the MLP.
    pub pre_feedforward_layernorm: Norm,
    /// After the MLP.
    pub post_feedforward_layernorm: Norm,
}
module!(Block {
    self_attn,
    mlp,
    input_layernorm,
    post_attention_layernorm,
    pre_feedforward_layernorm,
    post_feedforward_layernorm
});

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

/// A Gemma 3 language model.
pub struct Gemma3 {
    /// The decoder.
    pub model: Decoder,
    /// The output projection (`None`: tied to the embedding table, Gemma's default).
    pub lm_head: Option<Linear>,
    config: ModelConfig,
    /// The full-attention layers' rotation and the sliding ones'.
    ropes: [Rope; 2],
    /// Each layer's attention.
    specs: Vec<AttentionSpec>,
    act: Activation,
}
module!(Gemma3 { model, lm_head });

impl Gemma3 {
    /// A model of `config`'s shape with placeholder weights; `tied` leaves out `lm_head`.
    pub fn new(config: &ModelConfig, tied: bool) -> Result<Gemma3> {
        let h = config.hidden_size;
        let norm = || Norm::new(h, config.rms_norm_eps, true);
        let layers = (0..config.num_hidden_layers)
            .map(|_| Block {
                self_attn: Attention::new(config, config.attention_bias, Some(true)),
                mlp: Mlp::new(h, config.intermediate_size, config.mlp_bias),
                input_layernorm: norm(),
                post_attention_layernorm: norm(),
                pre_feedforward_layernorm: norm(),
                post_feedforward_layernorm: norm(),
            })
            .collect();
        let scalar = config.query_pre_attn_scalar.unwrap_or(config.head_dim() as f32);
        let specs = (0..config.num_hidden_layers)
            .map(|i| AttentionSpec {
                scale: 1.0 / scalar.sqrt(),
                window: config.sliding_window.filter(|_| config.is_sliding(i)),
                ..AttentionSpec::of(config)
            })
            .collect();
        Ok(Gemma3 {
            model: Decoder { embed_tokens: embedding(config.vocab_size, h), layers, norm: norm() },
            lm_head: (!tied).then(|| linear(h, config.vocab_size, false)),
            config: config.clone(),
            ropes: [Rope::for_layers(config, "full_attention")?, Rope::for_layers(config, "sliding_attention")?],
            specs,
            act: Activation::of(config)?,
        })
    }
}

impl Gemma3 {
    fn run(&self, tokens: &Array, caches: &mut [KvCache], at: Option<&Positions>) -> Array {
        // In the model's dtype (its norms'): a GGUF's tables keep float16 scales.
        let embedded = self.model.embed_tokens.forward_in(tokens, self.model.norm.weight.dtype());
        let mut h = &embedded * (self.config.hidden_size as f32).sqrt();
        let layers = self.model.layers.iter().zip(&self.specs);
        for ((layer, spec), cache) in layers.zip(caches.iter_mut()) {
            let rope = &self.ropes[spec.window.is_some() as usize];
            let a = layer.self_attn.forward(Input::normed(&h, &layer.input_layernorm), cache, at, rope, spec, None);
            h = &h + &layer.post_attention_layernorm.forward(&a);
            if h.is_failed() {
                return h;
            }
            let m = layer.mlp.forward(Input::normed(&h, &layer.pre_feedforward_layernorm), self.act, None);
            h = &h + &layer.post_feedforward_layernorm.forward(&m);
        }
        let logits = logits(&self.model.norm.forward(&h), &self.model.embed_tokens, &self.lm_head);
        match self.config.final_logit_softcapping {
            Some(cap) => &(&logits / cap).tanh() * cap,
            None => logits,
        }
    }
}

impl LanguageModel for Gemma3 {
    fn forward(&self, tokens: &Array, caches: &mut [KvCache]) -> Array {
        self.run(tokens, caches, None)
    }

    /// Over contiguous or paged caches (the sliding layers' window applied by attention), not
    /// the rotating ones [`LanguageModel::new_cache`] gives: [`crate::PromptCache::paged`].
    fn forward_at(&self, tokens: &Array, caches: &mut [KvCache], at: &Positions) -> Array {
        self.run(tokens, caches, Some(at))
    }

    fn device_positions(&self) -> bool {
        self.ropes.iter().all(Rope::device_positions)
    }

    fn fuse_projections(&mut self) {
        for layer in &mut self.model.layers {
            layer.self_attn.fuse();
            layer.mlp.fuse();
        }
    }

    fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Rotating caches of the window's size for the sliding layers.
    fn new_cache(&self) -> Vec<KvCache> {
        self.specs.iter().map(|s| s.window.map_or_else(KvCache::new, |w| KvCache::rotating(w, 0))).collect()
    }
}

/// The language model's weights of a Gemma 3 checkpoint under `model.` and `lm_head.`: a
/// multimodal checkpoint's `language_model.` (transformers 4) or `model.language_model.`
/// (transformers 5) prefix taken off, its vision tower and projector left out.
pub fn language_model(weights: Params) -> Params {
    weights
        .into_iter()
        .filter_map(|(name, w)| {
            let name = if let Some(rest) = name.strip_prefix("model.language_model.") {
                format!("model.{rest}")
            } else if let Some(rest) = name.strip_prefix("language_model.") {
                rest.to_string()
            } else {
                name
            };
            let vision = ["vision_tower", "multi_modal_projector"].iter().any(|v| name.contains(v));
            (!vision).then_some((name, w))
        })
        .collect()
}
