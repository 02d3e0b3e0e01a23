//! Language models on nuvec, as mlx-lm is on MLX: Llama-family models (`llama`, `mistral`,
//! `qwen2`, `qwen3`, the mixture of experts `qwen3_moe`), Gemma 3 (`gemma3_text`, `gemma3`) and
//! Qwen3-Next (`qwen3_next`: Gated DeltaNet layers with recurrent caches between gated
//! attention ones) loaded from a Hugging Face folder or a GGUF file, their tokenizers and
//! chat templates, KV caches, sampling on the device, and streaming generation.
//!
//! ```no_run
//! use nuvec_lm::{GenerateOptions, LoadOptions, PromptCache, generate, load};
//! let m = load(std::path::Path::new("SmolLM2-135M-Instruct.Q4_1.gguf"), &LoadOptions::default())?;
//! let ids = m.tokenizer.encode("The capital of France is", true)?;
//! let mut cache = PromptCache::new(m.model.as_ref());
//! let options = GenerateOptions { max_tokens: 16, ..Default::default() };
//! for token in generate(m.model.as_ref(), Some(&m.tokenizer), &mut cache, &ids, &m.eos, options)? {
//!     print!("{}", token?.text);
//! }
//! # Ok::<(), nuvec_lm::Error>(())
//! ```

#![warn(missing_docs)]

pub mod blocks;
pub mod cache;
pub mod chat;
pub mod config;
pub mod engine;
pub mod fetch;
pub mod generate;
pub mod graph;
pub mod load;
pub mod models;
pub mod rope;
pub mod sample;
pub mod tokenizer;

use std::path::Path;

pub use cache::{KvCache, Positions};
pub use chat::ChatTemplate;
pub use config::ModelConfig;
pub use generate::{
    BatchOutput, FinishReason, GenerateOptions, Generated, Generation, PromptCache, Stats, generate, generate_batch,
    last_logits, tokens,
};
pub use graph::DecodeGraph;
pub use load::{LoadOptions, Loaded, load, load_model, load_random, random_model, save};
pub use models::LanguageModel;
pub use sample::{Sampler, SamplerOptions};
pub use tokenizer::Tokenizer;

/// What can go wrong loading or running a model; each names the file, option or token.
#[derive(Debug)]
pub enum Error {
    /// A configuration or option that cannot be used.
    Config(String),
    /// Weights that do not fit the model.
    Weights(String),
    /// The tokenizer could not be built or used.
    Tokenizer(String),
    /// The chat template failed.
    Template(String),
    /// Fetching the default model failed.
    Fetch(String),
    /// A file could not be read or written.
    Io(String),
    /// An array operation failed.
    Array(nuvec::Error),
}

impl Error {
    pub(crate) fn io(path: &Path, e: std::io::Error) -> Error {
        Error::Io(format!("{}: {e}", path.display()))
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Config(m) => write!(f, "configuration: {m}"),
            Error::Weights(m) => write!(f, "weights: {m}"),
            Error::Tokenizer(m) => write!(f, "tokenizer: {m}"),
            Error::Template(m) => write!(f, "chat template: {m}"),
            Error::Fetch(m) => write!(f, "fetching the default model: {m}"),
            Error::Io(m) => write!(f, "{m}"),
            Error::Array(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<nuvec::Error> for Error {
    fn from(e: nuvec::Error) -> Error {
        Error::Array(e)
    }
}

/// The crate's results.
pub type Result<T> = std::result::Result<T, Error>;
