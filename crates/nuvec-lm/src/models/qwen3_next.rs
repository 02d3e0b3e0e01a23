//! Qwen3-Next (`qwen3_next`, mlx-lm's `qwen3_next.py`): Gated DeltaNet layers
//! (`linear_attention`: a short causal convolution, then the gated delta rule's recurrence,
//! [`fast::gated_delta`]) between gated full-attention layers (`full_attention`: query and key
//! head norms, partial RoPE, the output gated by a sigmoid), and sparse experts beside a shared
//! one. Parameter names are Hugging Face's; the norms that scale by `1 + weight` hold the
//! scale itself, as mlx-lm's converted checkpoints do ([`sanitize`] adds the one to a Hub
//! checkpoint's).

use std::any::Any;

use nuvec::fast::{self, StepOptions};
use nuvec::nn::{Embedding, Layer, Linear, Module, Param, Params, join};
use nuvec::{Array, DType, OpErrorKind, ops};
use nuvec_nn::module;

use super::LanguageModel;
use super::layers::{Activation, AttentionSpec, Input, Mlp, Norm, attend, embedding, linear, logits, plus_linear};
use super::switch::{SparseMoe, stack_experts};
use crate::Result;
use crate::cache::{KvCache, Positions, ROLLBACK_STEPS};
use crate::config::ModelConfig;
use crate::rope::Rope;

/// A failed array naming Qwen3-Next and `why`.
fn failed(why: String) -> Array {
    Array::failed("qwen3_next", OpErrorKind::InvalidArgument(why))
}

/// Full attention with a gate on its output: `q_proj` gives each head's query and then its
/// gate, and the heads' output is multiplied by `σ(gate)` before `o_proj`.
pub struct GatedAttention {
    /// Queries and gates: `[2 · Hq · D, hidden]`, each head's query rows, then its gate rows.
    pub q_proj: Linear,
    /// Keys.
    pub k_proj: Linear,
    /// Values.
    pub v_proj: Linear,
    /// Output.
    pub o_proj: Linear,
    /// A norm on each query head.
    pub q_norm: Norm,
    /// A norm on each key head.
    pub k_norm: Norm,
}
module!(GatedAttention { q_proj, k_proj, v_proj, o_proj, q_norm, k_norm });

impl GatedAttention {
    fn new(config: &ModelConfig) -> GatedAttention {
        let (h, d) = (config.hidden_size, config.head_dim());
        let (hq, hkv, bias) = (config.num_attention_heads, config.kv_heads(), config.attention_bias);
        GatedAttention {
            q_proj: linear(h, 2 * hq * d, bias),
            k_proj: linear(h, hkv * d, bias),
            v_proj: linear(h, hkv * d, bias),
            o_proj: linear(hq * d, h, bias),
            q_norm: Norm::new(d, config.rms_norm_eps, false),
            k_norm: Norm::new(d, config.rms_norm_eps, false),
        }
    }

    /// `residual` plus the attention of the normalised rows `x [B, L, hidden]` over `cache`
    /// (positions from its count, or from the device with `at`).
    fn forward(
        &self,
        x: &Array,
        cache: &mut KvCache,
        at: Option<&Positions>,
        rope: &Rope,
        spec: &AttentionSpec,
        residual: &Array,
    ) -> Array {
        // The sizes from the residual stream, which the caller checked (a failed `x` has none).
        let (b, l) = (residual.shape()[0], residual.shape()[1]);
        let (hq, hkv, d) = (spec.heads, spec.kv_heads, spec.head_dim);
        let qg = self.q_proj.forward(x).reshape([b, l, hq, 2 * d]);
        let half = |from: i32| qg.slice(&[0, 0, 0, from], &[b, l, hq, from + d], &[1, 1, 1, 1]);
        let (q, gate) = (half(0), half(d).reshape([b, l, hq * d]));
        let heads = |y: Array| y.transpose(&[0, 2, 1, 3]);
        let q = heads(self.q_norm.forward(&q));
        let k = heads(self.k_norm.forward(&self.k_proj.forward(x).reshape([b, l, hkv, d])));
        let v = heads(self.v_proj.forward(x).reshape([b, l, hkv, d]));
        let offset = cache.offset();
        let rotate = |y: &Array| match at {
            Some(at) => rope.apply_at(y, &at.start),
            None => rope.apply(y, offset),
        };
        let o = attend(&rotate(&q), &rotate(&k), &v, cache, at, spec);
        let o = o.transpose(&[0, 2, 1, 3]).reshape([b, l, hq * d]);
        plus_linear(residual, &self.o_proj, &(&o * &gate.sigmoid()))
    }
}

/// A depthwise causal convolution's weight, in MLX's `Conv1d` layout `[C, K, 1]` (one filter
/// of `K` taps per channel).
pub struct DepthwiseConv {
    /// `[C, K, 1]`.
    pub weight: Param,
}
module!(DepthwiseConv { weight });

/// The sizes of a linear-attention layer.
#[derive(Clone, Copy, Debug)]
struct LinearDims {
    key_heads: i32,
    value_heads: i32,
    key_dim: i32,
    value_dim: i32,
    kernel: i32,
}

/// Gated DeltaNet: the rows' queries, keys and values through a depthwise causal convolution
/// (SiLU after), queries and keys L2-normalised, then the gated delta rule
/// ([`fast::gated_delta`]) with the decay `exp(−exp(A_log) · softplus(a + dt_bias))` and the
/// write strength `σ(b)`; its output RMS-normalised per value head and gated by `silu(z)`.
// `A_log` is the checkpoints' name.
#[allow(non_snake_case)]
pub struct GatedDeltaNet {
    /// Queries, keys, values and output gates `z`, grouped by key head (each key head's query,
    /// key, then its value heads' values and gates).
    pub in_proj_qkvz: Linear,
    /// The write strengths `b` and decay inputs `a` of each value head, grouped by key head.
    pub in_proj_ba: Linear,
    /// The convolution over queries, keys and values.
    pub conv1d: DepthwiseConv,
    /// Added to `a` before the softplus.
    pub dt_bias: Param,
    /// The log of each value head's decay rate.
    pub A_log: Param,
    /// The norm of each value head's output (its scale is the weight, not `1 + weight`).
    pub norm: Norm,
    /// Output.
    pub out_proj: Linear,
    dims: LinearDims,
}
module!(GatedDeltaNet { in_proj_qkvz, in_proj_ba, conv1d, dt_bias, A_log, norm, out_proj });

impl GatedDeltaNet {
    fn new(config: &ModelConfig) -> GatedDeltaNet {
        let get = |v: Option<i32>| v.unwrap_or(1);
        let dims = LinearDims {
            key_heads: get(config.linear_num_key_heads),
            value_heads: get(config.linear_num_value_heads),
            key_dim: get(config.linear_key_head_dim),
            value_dim: get(config.linear_value_head_dim),
            kernel: config.linear_conv_kernel_dim.unwrap_or(4),
        };
        let (h, hk, hv) = (config.hidden_size, dims.key_heads, dims.value_heads);
        let (keys, values) = (hk * dims.key_dim, hv * dims.value_dim);
        let channels = 2 * keys + values;
        GatedDeltaNet {
            in_proj_qkvz: linear(h, 2 * keys + 2 * values, false),
            in_proj_ba: linear(h, 2 * hv, false),
            conv1d: DepthwiseConv { weight: Param::new(ops::zeros([channels, dims.kernel, 1], DType::F32)) },
            dt_bias: Param::new(ops::ones([hv], DType::F32)),
            A_log: Param::new(ops::zeros([hv], DType::F32)),
            norm: Norm::new(dims.value_dim, config.rms_norm_eps, false),
            out_proj: linear(values, h, false),
            dims,
        }
    }

    /// `residual` plus the layer of the normalised rows `x [B, T, hidden]`, continuing the
    /// recurrent `cache`; with `at.valid` (rows padded at their end) the pads leave the state
    /// and the convolution's window alone.
    fn forward(&self, x: &Array, cache: &mut KvCache, at: Option<&Positions>, residual: &Array) -> Array {
        if !cache.is_recurrent() {
            return failed(
                "a linear-attention layer needs a recurrent cache (KvCache::recurrent, as the model's \
                 new_cache gives), not one of keys and values"
                    .into(),
            );
        }
        // The sizes from the residual stream, which the caller checked (a failed `x` has none).
        let (b, t) = (residual.shape()[0], residual.shape()[1]);
        let LinearDims { key_heads: hk, value_heads: hv, key_dim: dk, value_dim: dv, kernel } = self.dims;
        let per = hv / hk;
        // Hugging Face's `fix_query_key_value_ordering`: the projections are grouped by key head.
        let qkvz = self.in_proj_qkvz.forward(x).reshape([b, t, hk, 2 * dk + 2 * per * dv]);
        let ba = self.in_proj_ba.forward(x).reshape([b, t, hk, 2 * per]);
        let part = |y: &Array, from: i32, n: i32| y.slice(&[0, 0, 0, from], &[b, t, hk, from + n], &[1, 1, 1, 1]);
        let z = part(&qkvz, 2 * dk + per * dv, per * dv).reshape([b, t, hv, dv]);
        let write = part(&ba, 0, per).reshape([b, t, hv]);
        let a = part(&ba, per, per).reshape([b, t, hv]);
        let flat = |y: Array, n: i32| y.reshape([b, t, n]);
        let mixed = ops::concatenate(
            &[
                flat(part(&qkvz, 0, dk), hk * dk),
                flat(part(&qkvz, dk, dk), hk * dk),
                flat(part(&qkvz, 2 * dk, per * dv), hv * dv),
            ],
            -1,
        );
        let valid = at.and_then(|at| at.valid.as_ref());
        // Pads (a row's positions past its real tokens) are zeros, and masked out of the state.
        let mask = valid.map(|v| {
            let positions = ops::arange(0, t, 1).astype(DType::I32).reshape([1, t]);
            positions.less(v.astype(DType::I32).reshape([b, 1]))
        });
        let mixed = match &mask {
            Some(m) => ops::where_(m.expand_dims(-1), &mixed, 0.0f32),
            None => mixed,
        };
        let c = 2 * hk * dk + hv * dv;
        // Handed over, so that the state and the window are updated in place (a recorded
        // decode step replays over the same buffers).
        let (window, state) = cache.take_recurrent_state().unwrap_or_else(|| {
            (ops::zeros([b, kernel - 1, c], mixed.dtype()), ops::zeros([b, hv, dv, dk], DType::F32))
        });
        // The causal convolution over the window held and the new positions: output t is
        // Σⱼ w[:, j] · inputs[t + j], summed in float32 and rounded once, as a convolution is.
        let inputs = ops::concatenate(&[window.clone(), mixed.clone()], 1);
        let taps = self.conv1d.weight.reshape([c, kernel]).transpose(&[1, 0]).astype(DType::F32);
        let mut conv = None;
        for j in 0..kernel {
            let tap = inputs.slice(&[0, j, 0], &[b, j + t, c], &[1, 1, 1]).astype(DType::F32)
                * taps.slice(&[j, 0], &[j + 1, c], &[1, 1]);
            conv = Some(match conv {
                Some(sum) => &sum + &tap,
                None => tap,
            });
        }
        let conv = conv.unwrap_or_else(|| failed("the convolution has no taps".into())).astype(mixed.dtype());
        let conv = nuvec::nn::silu(&conv);
        let split = |from: i32, n: i32| conv.slice(&[0, 0, from], &[b, t, from + n], &[1, 1, 1]);
        let (q, k) = (split(0, hk * dk).reshape([b, t, hk, dk]), split(hk * dk, hk * dk).reshape([b, t, hk, dk]));
        let v = split(2 * hk * dk, hv * dv).reshape([b, t, hv, dv]);
        // L2 norms (ε = 10⁻⁶ on the sum of squares) as RMS norms, the read-out's 1/√Dk on q:
        // x / √(Σx² + ε) = rms_norm(x, ε / Dk) / √Dk.
        let eps = 1e-6 / dk as f32;
        let q = fast::rms_norm(&q, None, eps) * (1.0 / dk as f32);
        let k = fast::rms_norm(&k, None, eps) * (1.0 / (dk as f32).sqrt());
        // The decay and write strength of each step and value head, in float32.
        let rate = self.A_log.astype(DType::F32).exp();
        let g = (-(&rate * &nuvec::nn::softplus(&(&a.astype(DType::F32) + &self.dt_bias.astype(DType::F32))))).exp();
        let beta = write.sigmoid();
        let options = StepOptions { storage: None, mask };
        // A pass a speculative step may take back keeps every step's state.
        let stepwise = cache.keeps_steps() && valid.is_none() && t > 1 && t <= ROLLBACK_STEPS;
        let (y, states) = match stepwise {
            true => fast::gated_delta_steps_with(&q, &k, &v, &g, &beta, Some(&state), &options),
            false => fast::gated_delta_with(&q, &k, &v, &g, &beta, Some(&state), &options),
        };
        cache.update_recurrent(&inputs, t, &state, &states, valid, Some(window));
        // Hugging Face's RMSNormGated: the norm, then × silu(z) in float32.
        let y = self.norm.forward(&y).astype(DType::F32) * nuvec::nn::silu(&z.astype(DType::F32));
        plus_linear(residual, &self.out_proj, &y.astype(x.dtype()).reshape([b, t, hv * dv]))
    }
}

/// Qwen3-Next's sparse block: routed experts ([`SparseMoe`], under the same names) plus a
/// shared expert every token goes through, weighted by `σ(shared_expert_gate(x))`.
pub struct SharedExpertMoe {
    /// The router and the routed experts (`gate`, `switch_mlp`).
    pub experts: SparseMoe,
    /// The shared expert.
    pub shared_expert: Mlp,
    /// The shared expert's weight per token, before the sigmoid: `[1, hidden]`.
    pub shared_expert_gate: Linear,
}

impl Module for SharedExpertMoe {
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param)) {
        self.experts.visit(prefix, f);
        self.shared_expert.visit(&join(prefix, "shared_expert"), f);
        self.shared_expert_gate.visit(&join(prefix, "shared_expert_gate"), f);
    }
    fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        self.experts.visit_mut(prefix, f);
        self.shared_expert.visit_mut(&join(prefix, "shared_expert"), f);
        self.shared_expert_gate.visit_mut(&join(prefix, "shared_expert_gate"), f);
    }
    fn visit_layers_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut dyn Any)) {
        self.experts.visit_layers_mut(prefix, f);
        self.shared_expert.visit_layers_mut(&join(prefix, "shared_expert"), f);
        self.shared_expert_gate.visit_layers_mut(&join(prefix, "shared_expert_gate"), f);
    }
}

impl SharedExpertMoe {
    /// The block applied to `x [.., hidden]`.
    pub fn forward(&self, x: &Array) -> Array {
        let shared = self.shared_expert.forward(Input { x, norm: None }, Activation::Silu, None);
        &self.experts.forward(x) + &(&self.shared_expert_gate.forward(x).sigmoid() * &shared)
    }
}

/// The MLP of a layer: dense, or experts with a shared one.
// One per layer, built once: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub enum FeedForward {
    /// The gated MLP.
    Dense(Mlp),
    /// Experts picked per token and the shared expert.
    Sparse(SharedExpertMoe),
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

/// One decoder layer: pre-norm token mixing (linear or full attention, one of the two) and
/// MLP, each added to the residual stream.
pub struct Block {
    /// Gated DeltaNet (a `linear_attention` layer).
    pub linear_attn: Option<GatedDeltaNet>,
    /// Gated full attention (a `full_attention` layer).
    pub self_attn: Option<GatedAttention>,
    /// MLP.
    pub mlp: FeedForward,
    /// The norm before the token mixing.
    pub input_layernorm: Norm,
    /// The norm before the MLP.
    pub post_attention_layernorm: Norm,
}
module!(Block { linear_attn, self_attn, mlp, input_layernorm, post_attention_layernorm });

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

/// A Qwen3-Next language model.
pub struct Qwen3Next {
    /// The decoder.
    pub model: Decoder,
    /// The output projection (`None`: tied to the embedding table).
    pub lm_head: Option<Linear>,
    config: ModelConfig,
    rope: Rope,
    spec: AttentionSpec,
    act: Activation,
}
module!(Qwen3Next { model, lm_head });

impl Qwen3Next {
    /// A model of `config`'s shape with placeholder weights; `tied` leaves out `lm_head`.
    pub fn new(config: &ModelConfig, tied: bool) -> Result<Qwen3Next> {
        config.validate()?;
        let h = config.hidden_size;
        let norm = || Norm::new(h, config.rms_norm_eps, false);
        let layers = (0..config.num_hidden_layers)
            .map(|i| {
                let recurrent = config.is_linear_attention(i);
                let mlp = match config.is_sparse(i) {
                    true => FeedForward::Sparse(SharedExpertMoe {
                        // Transformers' default renormalizes the chosen experts' weights.
                        experts: SparseMoe::new(
                            h,
                            config.moe_intermediate_size.unwrap_or(0),
                            config.num_experts.unwrap_or(0),
                            config.num_experts_per_tok.unwrap_or(0),
                            config.norm_topk_prob.unwrap_or(true),
                        ),
                        shared_expert: Mlp::new(h, config.shared_expert_intermediate_size.unwrap_or(0), false),
                        shared_expert_gate: linear(h, 1, false),
                    }),
                    false => FeedForward::Dense(Mlp::new(h, config.intermediate_size, config.mlp_bias)),
                };
                Block {
                    linear_attn: recurrent.then(|| GatedDeltaNet::new(config)),
                    self_attn: (!recurrent).then(|| GatedAttention::new(config)),
                    mlp,
                    input_layernorm: norm(),
                    post_attention_layernorm: norm(),
                }
            })
            .collect();
        Ok(Qwen3Next {
            model: Decoder { embed_tokens: embedding(config.vocab_size, h), layers, norm: norm() },
            lm_head: (!tied).then(|| linear(h, config.vocab_size, false)),
            config: config.clone(),
            rope: Rope::partial(config, "full_attention", config.rotary_dims())?,
            spec: AttentionSpec::of(config),
            act: Activation::of(config)?,
        })
    }

    fn run(&self, tokens: &Array, caches: &mut [KvCache], at: Option<&Positions>) -> Array {
        let layers = &self.model.layers;
        if caches.len() != layers.len() {
            return failed(format!("{} caches for {} layers", caches.len(), layers.len()));
        }
        if tokens.ndim() != 2 {
            return failed(format!("tokens must be [B, L], got {:?}", tokens.shape()));
        }
        // In the model's dtype (its norms').
        let mut h = self.model.embed_tokens.forward_in(tokens, self.model.norm.weight.dtype());
        for (i, (layer, cache)) in layers.iter().zip(caches.iter_mut()).enumerate() {
            // A failed step carries its error out, not on (a failed array has no shape to read).
            if h.is_failed() {
                return h;
            }
            let x = layer.input_layernorm.forward(&h);
            h = match (&layer.linear_attn, &layer.self_attn) {
                (Some(m), _) => m.forward(&x, cache, at, &h),
                (None, Some(a)) => a.forward(&x, cache, at, &self.rope, &self.spec, &h),
                (None, None) => return failed(format!("layer {i} has no token mixing")),
            };
            if h.is_failed() {
                return h;
            }
            let x = Input::normed(&h, &layer.post_attention_layernorm);
            h = match &layer.mlp {
                FeedForward::Dense(m) => m.forward(x, self.act, Some(&h)),
                FeedForward::Sparse(m) => &h + &m.forward(&x.rows()),
            };
        }
        logits(&self.model.norm.forward(&h), &self.model.embed_tokens, &self.lm_head)
    }
}

impl LanguageModel for Qwen3Next {
    fn forward(&self, tokens: &Array, caches: &mut [KvCache]) -> Array {
        self.run(tokens, caches, None)
    }

    /// The linear-attention layers need no positions; rows padded at their end
    /// ([`Positions::valid`]) keep the pads out of their state.
    fn forward_at(&self, tokens: &Array, caches: &mut [KvCache], at: &Positions) -> Array {
        self.run(tokens, caches, Some(at))
    }

    fn device_positions(&self) -> bool {
        self.rope.device_positions()
    }

    fn fuse_projections(&mut self) {
        for layer in &mut self.model.layers {
            match &mut layer.mlp {
                FeedForward::Dense(m) => m.fuse(),
                FeedForward::Sparse(m) => m.shared_expert.fuse(),
            }
        }
    }

    fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// A recurrent cache for each linear-attention layer, a contiguous one for each other.
    fn new_cache(&self) -> Vec<KvCache> {
        let kind = |b: &Block| if b.linear_attn.is_some() { KvCache::recurrent() } else { KvCache::new() };
        self.model.layers.iter().map(kind).collect()
    }
}

/// The norms whose checkpoints on the Hub hold the offset of their scale from one.
const CENTRED_NORMS: [&str; 5] = [
    ".input_layernorm.weight",
    ".post_attention_layernorm.weight",
    "model.norm.weight",
    ".q_norm.weight",
    ".k_norm.weight",
];

/// A convolution weight in PyTorch's layout `[C, 1, K]` (not MLX's `[C, K, 1]`).
fn torch_conv(w: &Array) -> bool {
    w.ndim() == 3 && w.shape()[1] == 1 && w.shape()[2] != 1
}

/// A Qwen3-Next checkpoint's weights as the model holds them (mlx-lm's `sanitize`): the
/// multi-token-prediction head dropped (and `lm_head` when the embeddings are tied), experts
/// stacked, convolution weights in MLX's layout, and, for a checkpoint in the Hub's layout
/// (experts one by one, or PyTorch's convolutions), one added to the zero-centred norms'
/// weights. A checkpoint mlx-lm converted (or [`crate::save`] wrote) loads as it is.
pub fn sanitize(config: &ModelConfig, weights: Params) -> Result<Params> {
    let hub =
        weights.iter().any(|(k, w)| k.contains(".mlp.experts.") || (k.ends_with("conv1d.weight") && torch_conv(w)));
    let tied = config.tie_word_embeddings.unwrap_or(false);
    let kept = weights.into_iter().filter(|(k, _)| !(k.contains("mtp.") || (tied && k == "lm_head.weight"))).collect();
    let stacked = stack_experts(kept)?;
    Ok(stacked
        .into_iter()
        .map(|(k, w)| {
            let w = if k.ends_with("conv1d.weight") && torch_conv(&w) {
                w.swapaxes(1, 2)
            } else if hub && w.ndim() == 1 && CENTRED_NORMS.iter().any(|s| k.ends_with(s)) {
                &w + 1.0f32
            } else {
                w
            };
            (k, w)
        })
        .collect())
}
