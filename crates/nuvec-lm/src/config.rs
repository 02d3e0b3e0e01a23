//! A model's hyper-parameters: Hugging Face's `config.json` (with mlx-community's
//! `quantization` entry), or the same facts from a GGUF file's metadata.

use std::collections::BTreeMap;

use nuvec::io::GgufValue;
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// The architectures this crate builds (`model_type` in `config.json`).
pub const ARCHITECTURES: [&str; 4] = ["llama", "mistral", "qwen2", "qwen3"];

/// A decoder's hyper-parameters, as `config.json` names them.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct ModelConfig {
    /// `llama`, `mistral`, `qwen2` or `qwen3`.
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
        let mut config: ModelConfig =
            serde_json::from_str(text).map_err(|e| Error::Config(format!("config.json: {e}")))?;
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
            rope_scaling = Some(m);
        }
        let config = ModelConfig {
            model_type: arch.clone(),
            hidden_size: hidden,
            num_hidden_layers: int("block_count")?,
            intermediate_size: int("feed_forward_length")?,
            num_attention_heads: heads,
            num_key_value_heads: int("attention.head_count_kv").ok(),
            head_dim: int("attention.key_length").ok(),
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
        };
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
        if self.head_dim() % 2 != 0 {
            return Err(Error::Config(format!("head_dim {} must be even for RoPE", self.head_dim())));
        }
        Ok(())
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
