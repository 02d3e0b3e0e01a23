//! A model's hyper-parameters: Hugging Face's `config.json` (with mlx-community's
//! `quantization` entry), or the same facts from a GGUF file's metadata.

use std::collections::BTreeMap;

use nuvec::io::GgufValue;
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// The architectures this crate builds (`model_type` in `config.json`; `gemma3` is the
/// text part of Gemma 3's multimodal checkpoints).
pub const ARCHITECTURES: [&str; 8] =
    ["llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "qwen3_next", "gemma3_text", "gemma3"];

/// A decoder's hyper-parameters, as `config.json` names them.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct ModelConfig {
    /// One of [`ARCHITECTURES`].
    pub model_type: String,
    /// Features of the residual stream.
    pub hidden_size: i32,
    /// Decoder layers.
    pub num_hidden_layers: i32,
    /// Features of the MLP's hidden layer.
    pub intermediate_size: i32,
    /// Query heads.
    pub num_attention_heads: i32,
    /// Key-value heads (`num_attention_heads` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_key_value_heads: Option<i32>,
    /// Features per head (`hidden_size / num_attention_heads` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<i32>,
    /// Tokens in the vocabulary.
    pub vocab_size: i32,
    /// The norms' epsilon.
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f32,
    /// RoPE's base.
    #[serde(default = "default_theta")]
    pub rope_theta: f32,
    /// RoPE scaling: `{"type" or "rope_type": "linear" | "llama3" | "yarn" | ..., "factor": ..}`
    /// (transformers 5 writes it, with `rope_theta`, as `rope_parameters`).
    #[serde(default, alias = "rope_parameters", skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<BTreeMap<String, serde_json::Value>>,
    /// The output projection is the embedding table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tie_word_embeddings: Option<bool>,
    /// Biases on the attention projections (Qwen2 has them on q, k and v whatever this says).
    #[serde(default)]
    pub attention_bias: bool,
    /// Biases on the MLP's projections.
    #[serde(default)]
    pub mlp_bias: bool,
    /// The longest context the model was trained for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_position_embeddings: Option<i32>,
    /// mlx-community's quantization of the weights: group size and bits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantization: Option<QuantConfig>,
    /// The end-of-sequence token(s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eos_token_id: Option<serde_json::Value>,
    /// The beginning-of-sequence token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bos_token_id: Option<serde_json::Value>,
    /// The MLP's activation (`silu` when absent; Gemma's `gelu_pytorch_tanh`).
    #[serde(default, alias = "hidden_act", skip_serializing_if = "Option::is_none")]
    pub hidden_activation: Option<String>,
    /// Mixture of experts: experts per layer (`num_local_experts` in transformers 5).
    #[serde(default, alias = "num_local_experts", skip_serializing_if = "Option::is_none")]
    pub num_experts: Option<i32>,
    /// Mixture of experts: experts each token is routed to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_experts_per_tok: Option<i32>,
    /// Mixture of experts: features of each expert's hidden layer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe_intermediate_size: Option<i32>,
    /// Mixture of experts: the chosen experts' weights are renormalized to sum to one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub norm_topk_prob: Option<bool>,
    /// Mixture of experts: every this many layers is sparse (1 when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decoder_sparse_step: Option<i32>,
    /// Mixture of experts: layers that keep a dense MLP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mlp_only_layers: Option<Vec<i32>>,
    /// The kind of each layer: Gemma's `full_attention` or `sliding_attention` (else from the
    /// pattern); Qwen3-Next's `full_attention` or `linear_attention` (else from
    /// `full_attention_interval`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer_types: Option<Vec<String>>,
    /// Qwen3-Next: every this many layers is a full-attention one, the others linear (4 when
    /// absent; `layer_types`, when given, decides).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub full_attention_interval: Option<i32>,
    /// Qwen3-Next's linear attention: query and key heads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub linear_num_key_heads: Option<i32>,
    /// Qwen3-Next's linear attention: value heads (a multiple of the key heads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub linear_num_value_heads: Option<i32>,
    /// Qwen3-Next's linear attention: features per query and key head.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub linear_key_head_dim: Option<i32>,
    /// Qwen3-Next's linear attention: features per value head.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub linear_value_head_dim: Option<i32>,
    /// Qwen3-Next's linear attention: the causal convolution's kernel (positions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub linear_conv_kernel_dim: Option<i32>,
    /// Qwen3-Next: features of the shared expert's hidden layer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_expert_intermediate_size: Option<i32>,
    /// The share of each head RoPE rotates (Qwen3-Next: 0.25 when absent; transformers 5 may
    /// write it in `rope_parameters`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partial_rotary_factor: Option<f32>,
    /// Gemma: every this many layers is a full-attention one, the others slide (6 when absent).
    #[serde(default, alias = "_sliding_window_pattern", skip_serializing_if = "Option::is_none")]
    pub sliding_window_pattern: Option<i32>,
    /// Keys a sliding-window layer attends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_window: Option<i32>,
    /// Gemma: the attention scale is `query_pre_attn_scalar^-1/2` (`head_dim` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query_pre_attn_scalar: Option<f32>,
    /// Gemma 2's cap on attention scores (Gemma 3's configs carry it; its models leave it
    /// unused, as transformers' and mlx-lm's do).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attn_logit_softcapping: Option<f32>,
    /// Gemma: logits become `cap · tanh(logit / cap)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_logit_softcapping: Option<f32>,
    /// Gemma 3 before transformers 5: RoPE's base in the sliding layers (10000 when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_local_base_freq: Option<f32>,
}

/// MLX's affine quantization of a checkpoint: `"quantization": {"group_size": 64, "bits": 4}`,
/// with an entry of its own for a layer quantized otherwise
/// (`"model.embed_tokens": {"group_size": 32, "bits": 8}`), as mlx-lm writes it.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct QuantConfig {
    /// Elements per group.
    pub group_size: i32,
    /// Bits per element.
    pub bits: i32,
    /// Layers quantized with other parameters, by dotted path.
    #[serde(flatten)]
    pub layers: BTreeMap<String, serde_json::Value>,
}

impl QuantConfig {
    /// `(group_size, bits)` of the layer at `path`.
    pub fn of(&self, path: &str) -> (i32, i32) {
        let own = self.layers.get(path).and_then(|v| {
            let n = |k: &str| v.get(k).and_then(serde_json::Value::as_i64).map(|x| x as i32);
            Some((n("group_size")?, n("bits")?))
        });
        own.unwrap_or((self.group_size, self.bits))
    }
}

fn default_eps() -> f32 {
    1e-6
}

fn default_theta() -> f32 {
    10000.0
}

impl ModelConfig {
    /// Reads a `config.json` text; an error names what is missing or of the wrong type.
    pub fn from_json(text: &str) -> Result<ModelConfig> {
        let mut value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| Error::Config(format!("config.json: {e}")))?;
        // A multimodal Gemma 3: the language model's facts sit in `text_config`.
        if value.get("model_type").and_then(|t| t.as_str()) == Some("gemma3")
            && let Some(serde_json::Value::Object(text_config)) = value.get("text_config").cloned()
            && let Some(top) = value.as_object_mut()
        {
            top.extend(text_config);
            top.insert("model_type".into(), "gemma3".into());
        }
        let mut config: ModelConfig =
            serde_json::from_value(value).map_err(|e| Error::Config(format!("config.json: {e}")))?;
        if config.model_type == "gemma3" {
            config.model_type = "gemma3_text".into();
        }
        if let Some(theta) = config.rope_scaling.as_ref().and_then(|s| s.get("rope_theta")).and_then(|t| t.as_f64()) {
            config.rope_theta = theta as f32;
        }
        config.validate()?;
        Ok(config)
    }

    /// The facts of a GGUF file's metadata (`general.architecture` and its keys).
    pub fn from_gguf(meta: &BTreeMap<String, GgufValue>) -> Result<ModelConfig> {
        let arch = meta
            .get("general.architecture")
            .and_then(GgufValue::as_str)
            .ok_or_else(|| Error::Config("GGUF: no general.architecture".into()))?
            .to_string();
        let int = |key: &str| -> Result<i32> {
            meta.get(&format!("{arch}.{key}"))
                .and_then(GgufValue::as_u64)
                .and_then(|v| i32::try_from(v).ok())
                .ok_or_else(|| Error::Config(format!("GGUF: no integer {arch}.{key}")))
        };
        let float = |key: &str| meta.get(&format!("{arch}.{key}")).and_then(GgufValue::as_f64).map(|v| v as f32);
        let heads = int("attention.head_count")?;
        let hidden = int("embedding_length")?;
        let vocab = match int("vocab_size") {
            Ok(v) => v,
            Err(_) => match meta.get("tokenizer.ggml.tokens") {
                Some(GgufValue::Array(t)) => t.len() as i32,
                _ => return Err(Error::Config(format!("GGUF: no {arch}.vocab_size and no token list"))),
            },
        };
        let mut rope_scaling = None;
        if let (Some(GgufValue::String(kind)), Some(factor)) =
            (meta.get(&format!("{arch}.rope.scaling.type")), float("rope.scaling.factor"))
            && kind != "none"
        {
            let mut m = BTreeMap::new();
            m.insert("type".to_string(), serde_json::Value::from(kind.clone()));
            m.insert("factor".to_string(), serde_json::Value::from(factor));
            // llama.cpp's names of YaRN's parameters, as its converter writes them.
            for (key, name) in [
                ("rope.scaling.original_context_length", "original_max_position_embeddings"),
                ("rope.scaling.yarn_beta_fast", "beta_fast"),
                ("rope.scaling.yarn_beta_slow", "beta_slow"),
                ("rope.scaling.yarn_attn_factor", "attention_factor"),
            ] {
                if let Some(v) = float(key) {
                    m.insert(name.to_string(), serde_json::Value::from(v));
                }
            }
            rope_scaling = Some(m);
        }
        // llama.cpp's architecture names for Hugging Face's model types that differ.
        let model_type = match arch.as_str() {
            "qwen3moe" => "qwen3_moe",
            "gemma3" => "gemma3_text",
            a => a,
        };
        let head_dim = int("attention.key_length").ok();
        let mut config = ModelConfig {
            model_type: model_type.to_string(),
            hidden_size: hidden,
            num_hidden_layers: int("block_count")?,
            intermediate_size: int("feed_forward_length")?,
            num_attention_heads: heads,
            num_key_value_heads: int("attention.head_count_kv").ok(),
            head_dim,
            vocab_size: vocab,
            rms_norm_eps: float("attention.layer_norm_rms_epsilon").unwrap_or(1e-5),
            rope_theta: float("rope.freq_base").unwrap_or(10000.0),
            rope_scaling,
            tie_word_embeddings: None,
            attention_bias: false,
            mlp_bias: false,
            max_position_embeddings: int("context_length").ok(),
            quantization: None,
            eos_token_id: None,
            bos_token_id: None,
            ..Default::default()
        };
        if model_type == "qwen3_moe" {
            config.num_experts = Some(int("expert_count")?);
            config.num_experts_per_tok = Some(int("expert_used_count")?);
            config.moe_intermediate_size = Some(int("expert_feed_forward_length")?);
            // llama.cpp's Qwen3-MoE always renormalizes the chosen experts' weights.
            config.norm_topk_prob = Some(true);
        }
        if model_type == "gemma3_text" {
            config.hidden_activation = Some("gelu_pytorch_tanh".into());
            config.sliding_window = int("attention.sliding_window").ok();
            config.rope_local_base_freq = float("rope.freq_base_swa");
            config.final_logit_softcapping = float("final_logit_softcapping");
            // The pattern is an array of per-layer flags (sliding: true) or a period.
            match meta.get(&format!("{arch}.attention.sliding_window_pattern")) {
                Some(GgufValue::Array(flags)) => {
                    let kind = |f: &GgufValue| {
                        if *f == GgufValue::Bool(true) { "sliding_attention" } else { "full_attention" }
                    };
                    config.layer_types = Some(flags.iter().map(|f| kind(f).to_string()).collect());
                }
                Some(v) => config.sliding_window_pattern = v.as_u64().and_then(|p| i32::try_from(p).ok()),
                None => {}
            }
            // An explicit attention scale, else llama.cpp's rule: 1/√head_dim, and
            // 1/√(hidden / heads) for the 62-layer (27B) model.
            config.query_pre_attn_scalar = match float("attention.scale") {
                Some(scale) if scale > 0.0 => Some(1.0 / (scale * scale)),
                _ if config.num_hidden_layers == 62 => Some((hidden / heads) as f32),
                _ => Some(config.head_dim() as f32),
            };
        }
        config.validate()?;
        Ok(config)
    }

    /// Checks the architecture and that the sizes fit together.
    pub fn validate(&self) -> Result<()> {
        if !ARCHITECTURES.contains(&self.model_type.as_str()) {
            return Err(Error::Config(format!(
                "model_type '{}' is not supported (supported: {})",
                self.model_type,
                ARCHITECTURES.join(", ")
            )));
        }
        let positive = [
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("intermediate_size", self.intermediate_size),
            ("num_attention_heads", self.num_attention_heads),
            ("vocab_size", self.vocab_size),
            ("num_key_value_heads", self.kv_heads()),
            ("head_dim", self.head_dim()),
        ];
        if let Some((name, v)) = positive.iter().find(|(_, v)| *v <= 0) {
            return Err(Error::Config(format!("{name} must be positive, got {v}")));
        }
        if self.num_attention_heads % self.kv_heads() != 0 {
            return Err(Error::Config(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_attention_heads,
                self.kv_heads()
            )));
        }
        if self.model_type == "qwen3_moe" {
            let experts = self.num_experts.unwrap_or(0);
            let k = self.num_experts_per_tok.unwrap_or(0);
            if experts <= 0 || k <= 0 || k > experts || self.moe_intermediate_size.unwrap_or(0) <= 0 {
                return Err(Error::Config(format!(
                    "qwen3_moe needs num_experts > 0, 0 < num_experts_per_tok <= num_experts and \
                     moe_intermediate_size > 0, got {experts}, {k} and {:?}",
                    self.moe_intermediate_size
                )));
            }
        }
        if self.model_type == "qwen3_next" {
            self.validate_qwen3_next()?;
        }
        if self.model_type == "gemma3_text" && self.sliding_window.is_some_and(|w| w <= 0) {
            return Err(Error::Config(format!("sliding_window must be positive, got {:?}", self.sliding_window)));
        }
        if self.head_dim() % 2 != 0 {
            return Err(Error::Config(format!("head_dim {} must be even for RoPE", self.head_dim())));
        }
        Ok(())
    }

    /// Qwen3-Next's own sizes: the linear attention's heads and convolution, the layer kinds,
    /// the experts, and the rotated share of each head.
    fn validate_qwen3_next(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Config(format!("qwen3_next: {m}")));
        let sizes = [
            ("linear_num_key_heads", self.linear_num_key_heads),
            ("linear_num_value_heads", self.linear_num_value_heads),
            ("linear_key_head_dim", self.linear_key_head_dim),
            ("linear_value_head_dim", self.linear_value_head_dim),
            ("linear_conv_kernel_dim", self.linear_conv_kernel_dim),
        ];
        for (name, v) in sizes {
            match v {
                None => return bad(format!("{name} is missing")),
                Some(v) if v <= 0 => return bad(format!("{name} must be positive, got {v}")),
                _ => {}
            }
        }
        let (hk, hv) = (self.linear_num_key_heads.unwrap_or(1), self.linear_num_value_heads.unwrap_or(1));
        if hv % hk != 0 {
            return bad(format!("linear_num_value_heads {hv} is not a multiple of linear_num_key_heads {hk}"));
        }
        if self.linear_conv_kernel_dim.unwrap_or(0) < 2 {
            return bad(format!("linear_conv_kernel_dim must be at least 2, got {:?}", self.linear_conv_kernel_dim));
        }
        if let Some(i) = self.full_attention_interval.filter(|&i| i <= 0) {
            return bad(format!("full_attention_interval must be positive, got {i}"));
        }
        if let Some(types) = &self.layer_types {
            if types.len() != self.num_hidden_layers as usize {
                return bad(format!("layer_types has {} entries for {} layers", types.len(), self.num_hidden_layers));
            }
            if let Some(t) = types.iter().find(|t| !matches!(t.as_str(), "linear_attention" | "full_attention")) {
                return bad(format!("layer type '{t}' is not supported (linear_attention, full_attention are)"));
            }
        }
        let experts = self.num_experts.unwrap_or(0);
        if experts < 0 {
            return bad(format!("num_experts must not be negative, got {experts}"));
        }
        if experts > 0 {
            let k = self.num_experts_per_tok.unwrap_or(0);
            let (moe, shared) =
                (self.moe_intermediate_size.unwrap_or(0), self.shared_expert_intermediate_size.unwrap_or(0));
            if k <= 0 || k > experts || moe <= 0 || shared <= 0 {
                return bad(format!(
                    "experts need 0 < num_experts_per_tok <= num_experts, moe_intermediate_size > 0 and \
                     shared_expert_intermediate_size > 0, got {k}, {experts}, {moe} and {shared}"
                ));
            }
        }
        let factor = self.rotary_factor();
        let dims = self.rotary_dims();
        if !(factor > 0.0 && factor <= 1.0) || dims <= 0 || dims % 2 != 0 {
            return bad(format!(
                "partial_rotary_factor {factor} of head_dim {} rotates {dims} features: it must be in (0, 1] \
                 and rotate an even, positive number",
                self.head_dim()
            ));
        }
        if let Some(act) = self.hidden_activation.as_deref().filter(|a| !matches!(*a, "silu" | "swish")) {
            return bad(format!("hidden_act '{act}' is not supported (silu is)"));
        }
        Ok(())
    }

    /// The share of each head RoPE rotates: `partial_rotary_factor`, at the top or in
    /// `rope_parameters`; 0.25 for Qwen3-Next and 1 for the others when absent.
    pub fn rotary_factor(&self) -> f32 {
        let nested = self.rope_scaling.as_ref().and_then(|s| s.get("partial_rotary_factor")).and_then(|v| v.as_f64());
        let default = if self.model_type == "qwen3_next" { 0.25 } else { 1.0 };
        self.partial_rotary_factor.or(nested.map(|f| f as f32)).unwrap_or(default)
    }

    /// Features of each head RoPE rotates (the first ones; the rest pass unrotated).
    pub fn rotary_dims(&self) -> i32 {
        (self.head_dim() as f32 * self.rotary_factor()) as i32
    }

    /// Whether layer `i` is a linear-attention (Gated DeltaNet) layer of Qwen3-Next:
    /// `layer_types`, else all but every `full_attention_interval`-th.
    pub fn is_linear_attention(&self, i: i32) -> bool {
        match &self.layer_types {
            Some(types) => types.get(i as usize).is_some_and(|t| t == "linear_attention"),
            None => (i + 1) % self.full_attention_interval.unwrap_or(4).max(1) != 0,
        }
    }

    /// RoPE's base and scaling for the layers of `kind` (`full_attention` or
    /// `sliding_attention`): transformers 5 writes them per kind in `rope_parameters`; before,
    /// Gemma 3's sliding layers had `rope_local_base_freq` and no scaling.
    pub fn rope_parameters(&self, kind: &str) -> (f32, Option<BTreeMap<String, serde_json::Value>>) {
        if let Some(serde_json::Value::Object(own)) = self.rope_scaling.as_ref().and_then(|s| s.get(kind)) {
            let theta = own.get("rope_theta").and_then(|t| t.as_f64()).map_or(self.rope_theta, |t| t as f32);
            return (theta, Some(own.clone().into_iter().collect()));
        }
        match kind {
            "sliding_attention" if self.model_type == "gemma3_text" => {
                (self.rope_local_base_freq.unwrap_or(10000.0), None)
            }
            _ => (self.rope_theta, self.rope_scaling.clone()),
        }
    }

    /// Whether layer `i` attends a sliding window (`layer_types`, else Gemma's pattern).
    pub fn is_sliding(&self, i: i32) -> bool {
        match &self.layer_types {
            Some(types) => types.get(i as usize).is_some_and(|t| t == "sliding_attention"),
            None => (i + 1) % self.sliding_window_pattern.unwrap_or(6).max(1) != 0,
        }
    }

    /// Whether layer `i` routes tokens to experts (a mixture-of-experts model's sparse layers).
    pub fn is_sparse(&self, i: i32) -> bool {
        let step = self.decoder_sparse_step.unwrap_or(1).max(1);
        self.num_experts.unwrap_or(0) > 0
            && !self.mlp_only_layers.as_ref().is_some_and(|l| l.contains(&i))
            && (i + 1) % step == 0
    }

    /// Key-value heads.
    pub fn kv_heads(&self) -> i32 {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    /// Features per head.
    pub fn head_dim(&self) -> i32 {
        self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// The end-of-sequence tokens `config.json` names.
    pub fn eos_tokens(&self) -> Vec<u32> {
        ids(self.eos_token_id.as_ref())
    }
}

/// A token id or a list of them, as `config.json` and `generation_config.json` write them.
pub(crate) fn ids(v: Option<&serde_json::Value>) -> Vec<u32> {
    match v {
        Some(serde_json::Value::Number(n)) => n.as_u64().map(|n| n as u32).into_iter().collect(),
        Some(serde_json::Value::Array(a)) => a.iter().filter_map(|n| n.as_u64()).map(|n| n as u32).collect(),
        _ => Vec::new(),
    }
}
