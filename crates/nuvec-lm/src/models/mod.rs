//! The architectures, one file per family (as mlx-lm's `models/`), behind one trait.

pub mod llama;

use nuvec::Array;
use nuvec::nn::Module;

use crate::cache::{KvCache, Positions};
use crate::config::ModelConfig;
use crate::{Error, Result};

/// A causal language model: tokens in, next-token logits out, with a cache per layer.
pub trait LanguageModel: Module + Send + Sync {
    /// The logits `[B, L, vocab]` of `tokens [B, L]` (`int32`), the positions after those
    /// `caches` hold; the caches take the new keys and values.
    fn forward(&self, tokens: &Array, caches: &mut [KvCache]) -> Array;

    /// [`LanguageModel::forward`] with the positions held on the device (`at`), written into
    /// fixed-capacity caches ([`KvCache::update_at`]): the form a recorded decode step
    /// replays. The caches' host-side counts still advance. A model that cannot gives a
    /// failed array; [`LanguageModel::device_positions`] says so beforehand.
    fn forward_at(&self, tokens: &Array, caches: &mut [KvCache], at: &Positions) -> Array {
        let _ = (tokens, caches, at);
        Array::failed("forward_at", nuvec::OpErrorKind::InvalidArgument("this model needs host positions".into()))
    }

    /// Whether [`LanguageModel::forward_at`] works for this model.
    fn device_positions(&self) -> bool {
        false
    }

    /// The hyper-parameters.
    fn config(&self) -> &ModelConfig;

    /// Empty caches, one per layer.
    fn new_cache(&self) -> Vec<KvCache>;
}

/// A model of `config`'s architecture with placeholder weights (lazy zeros) to load into;
/// `tied` leaves out the output projection.
pub fn build(config: &ModelConfig, tied: bool) -> Result<Box<dyn LanguageModel>> {
    match config.model_type.as_str() {
        "llama" | "mistral" | "qwen2" | "qwen3" => Ok(Box::new(llama::Llama::new(config, tied)?)),
        other => Err(Error::Config(format!("model_type '{other}' is not supported"))),
    }
}
