//! The Llama decoder and its close relatives: `llama` (Llama 2 and 3.x, SmolLM2), `mistral`,
//! `qwen2` (biases on the query, key and value projections) and `qwen3` (RMS norms on each
//! query and key head). Parameter names are Hugging Face's.

use nuvec::fast::{self, AttentionOptions};
use nuvec::nn::{Embedding, Layer, Linear, Param, RmsNorm};
use nuvec::{Array, DType, ops};
use nuvec_nn::module;

use super::{Fused, LanguageModel};
use crate::Result;
use crate::cache::{KvCache, Positions};
use crate::config::ModelConfig;
use crate::rope::Rope;

/// A placeholder weight: lazy zeros, never evaluated once the checkpoint's weights replace it.
fn linear(input: i32, output: i32, bias: bool) -> Linear {
    Linear {
        weight: Param::new(ops::zeros([output, input], DType::F32)),
        bias: bias.then(|| Param::new(ops::zeros([output], DType::F32))),
        quantized: None,
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
    /// Qwen3's per-head query norm.
    pub q_norm: Option<RmsNorm>,
    /// Qwen3's per-head key norm.
    pub k_norm: Option<RmsNorm>,
    /// The three projections joined ([`LanguageModel::fuse_projections`]).
    pub qkv: Option<Fused>,
}
module!(Attention { q_proj, k_proj, v_proj, o_proj, q_norm, k_norm });

/// The gated MLP: `down(silu(gate(x)) · up(x))`.
pub struct Mlp {
    /// The gate.
    pub gate_proj: Linear,
    /// The up projection.
    pub up_proj: Linear,
    /// The down projection.
    pub down_proj: Linear,
    /// The gate and up projections joined ([`LanguageModel::fuse_projections`]).
    pub gate_up: Option<Fused>,
}
module!(Mlp { gate_proj, up_proj, down_proj });

/// One decoder layer: pre-norm attention and MLP, each added to the residual stream.
pub struct Block {
    /// Attention.
    pub self_attn: Attention,
    /// MLP.
    pub mlp: Mlp,
    /// The norm before attention.
    pub input_layernorm: RmsNorm,
    /// The norm before the MLP.
    pub post_attention_layernorm: RmsNorm,
}
module!(Block { self_attn, mlp, input_layernorm, post_attention_layernorm });

/// The embedding, the layers and the final norm (Hugging Face's `model.` prefix).
pub struct Decoder {
    /// Token embeddings.
    pub embed_tokens: Embedding,
    /// The layers.
    pub layers: Vec<Block>,
    /// The final norm.
    pub norm: RmsNorm,
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
}
module!(Llama { model, lm_head });

impl Llama {
    /// A model of `config`'s shape with placeholder weights; `tied` leaves out `lm_head`.
    pub fn new(config: &ModelConfig, tied: bool) -> Result<Llama> {
        let (h, d) = (config.hidden_size, config.head_dim());
        let (hq, hkv) = (config.num_attention_heads, config.kv_heads());
        let qkv_bias = config.attention_bias || config.model_type == "qwen2";
        let qk_norm = config.model_type == "qwen3";
        let norm = |dims| RmsNorm::new(dims, config.rms_norm_eps);
        let layers = (0..config.num_hidden_layers)
            .map(|_| Block {
                self_attn: Attention {
                    q_proj: linear(h, hq * d, qkv_bias),
                    k_proj: linear(h, hkv * d, qkv_bias),
                    v_proj: linear(h, hkv * d, qkv_bias),
                    o_proj: linear(hq * d, h, config.attention_bias),
                    q_norm: qk_norm.then(|| norm(d)),
                    k_norm: qk_norm.then(|| norm(d)),
                    qkv: None,
                },
                mlp: Mlp {
                    gate_proj: linear(h, config.intermediate_size, config.mlp_bias),
                    up_proj: linear(h, config.intermediate_size, config.mlp_bias),
                    down_proj: linear(config.intermediate_size, h, config.mlp_bias),
                    gate_up: None,
                },
                input_layernorm: norm(h),
                post_attention_layernorm: norm(h),
            })
            .collect();
        let embed_tokens =
            Embedding { weight: Param::new(ops::zeros([config.vocab_size, h], DType::F32)), quantized: None };
        Ok(Llama {
            model: Decoder { embed_tokens, layers, norm: norm(h) },
            lm_head: (!tied).then(|| linear(h, config.vocab_size, false)),
            config: config.clone(),
            rope: Rope::from_config(config)?,
        })
    }

    fn attention(&self, a: &Attention, x: &Array, cache: &mut KvCache, at: Option<&Positions>) -> Array {
        let (b, l) = (x.shape()[0], x.shape()[1]);
        let c = &self.config;
        let (d, hq, hkv) = (c.head_dim(), c.num_attention_heads, c.kv_heads());
        // With the projections joined, one product gives every head: [B, L, Hq + 2·Hkv, D].
        let joined = a.qkv.as_ref().and_then(|f| f.forward(x, &[&a.q_proj, &a.k_proj, &a.v_proj]));
        let joined = joined.map(|y| y.reshape([b, l, hq + 2 * hkv, d]));
        // Heads `first..first + n` of the joined product, else `proj`'s own.
        let heads = |proj: &Linear, first: i32, n: i32, norm: &Option<RmsNorm>| {
            let y = match &joined {
                Some(y) => y.slice(&[0, 0, first, 0], &[b, l, first + n, d], &[1, 1, 1, 1]),
                None => proj.forward(x).reshape([b, l, n, d]),
            };
            let y = match norm {
                Some(n) => n.forward(&y),
                None => y,
            };
            y.transpose(&[0, 2, 1, 3])
        };
        let rope = |y: &Array| match at {
            Some(at) => self.rope.apply_at(y, &at.start),
            None => self.rope.apply(y, cache.offset()),
        };
        let (q, k) = if joined.is_some() && a.q_norm.is_none() && a.k_norm.is_none() {
            // The query and key heads sit together in the joined product: one rotation.
            let qk = rope(&heads(&a.q_proj, 0, hq + hkv, &None));
            let part = |first: i32, n: i32| qk.slice(&[0, first, 0, 0], &[b, first + n, l, d], &[1, 1, 1, 1]);
            (part(0, hq), part(hq, hkv))
        } else {
            (rope(&heads(&a.q_proj, 0, hq, &a.q_norm)), rope(&heads(&a.k_proj, hq, hkv, &a.k_norm)))
        };
        let v = heads(&a.v_proj, hq + hkv, hkv, &None);
        let scale = 1.0 / (d as f32).sqrt();
        let o = match at {
            // One block per row of the fixed-capacity buffers, bounded by the device lengths.
            Some(at) => {
                let (k, v) = cache.update_at(&k, &v, at);
                fast::paged_attention(&q, &k, &v, &at.tables, &at.lengths, scale, &AttentionOptions::default())
            }
            None => {
                let (k, v) = cache.update_and_fetch(&k, &v);
                let options = match (l > 1, cache.window()) {
                    (true, Some(w)) => AttentionOptions::causal().window(w),
                    (true, None) => AttentionOptions::causal(),
                    (false, _) => AttentionOptions::default(),
                };
                fast::scaled_dot_product_attention(&q, &k, &v, scale, &options)
            }
        };
        a.o_proj.forward(&o.transpose(&[0, 2, 1, 3]).reshape([b, l, hq * d]))
    }

    fn run(&self, tokens: &Array, caches: &mut [KvCache], at: Option<&Positions>) -> Array {
        let mut h = self.model.embed_tokens.forward(tokens);
        for (layer, cache) in self.model.layers.iter().zip(caches.iter_mut()) {
            let r = self.attention(&layer.self_attn, &layer.input_layernorm.forward(&h), cache, at);
            h = &h + &r;
            // A failed step (bad cache parameters, say) carries its error out, not on.
            if h.is_failed() {
                return h;
            }
            let x = layer.post_attention_layernorm.forward(&h);
            let m = &layer.mlp;
            let gated = match m.gate_up.as_ref().and_then(|f| f.forward(&x, &[&m.gate_proj, &m.up_proj])) {
                Some(y) => {
                    let s = y.shape().to_vec();
                    let f = s[2] / 2;
                    let half = |from: i32| y.slice(&[0, 0, from], &[s[0], s[1], from + f], &[1, 1, 1]);
                    fast::swiglu(&half(0), &half(f))
                }
                None => fast::swiglu(&m.gate_proj.forward(&x), &m.up_proj.forward(&x)),
            };
            h = &h + &m.down_proj.forward(&gated);
        }
        let h = self.model.norm.forward(&h);
        match &self.lm_head {
            Some(head) => head.forward(&h),
            None => self.model.embed_tokens.as_linear(&h),
        }
    }
}

impl LanguageModel for Llama {
    fn forward(&self, tokens: &Array, caches: &mut [KvCache]) -> Array {
        self.run(tokens, caches, None)
    }

    fn forward_at(&self, tokens: &Array, caches: &mut [KvCache], at: &Positions) -> Array {
        if caches.iter().any(|c| c.window().is_some() || c.quantization().is_some()) {
            let why = "caches: positions on the device need contiguous caches, not rotating or quantized ones";
            return Array::failed("forward_at", nuvec::OpErrorKind::InvalidArgument(why.into()));
        }
        self.run(tokens, caches, Some(at))
    }

    fn device_positions(&self) -> bool {
        self.rope.device_positions()
    }

    fn fuse_projections(&mut self) {
        for layer in &mut self.model.layers {
            let a = &mut layer.self_attn;
            a.qkv = Fused::join(&mut [&mut a.q_proj, &mut a.k_proj, &mut a.v_proj]);
            let m = &mut layer.mlp;
            m.gate_up = Fused::join(&mut [&mut m.gate_proj, &mut m.up_proj]);
        }
    }

    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn new_cache(&self) -> Vec<KvCache> {
        (0..self.config.num_hidden_layers).map(|_| KvCache::new()).collect()
    }
}
