//! The architectures, one file per family (as mlx-lm's `models/`), behind one trait; the
//! blocks they share in `layers` and the mixture-of-experts layers in `switch`.

pub mod gemma3;
pub mod layers;
pub mod llama;
pub mod qwen3_next;
pub mod switch;

use nuvec::distributed::Group;
use nuvec::nn::{Linear, Module, Param, Params, QuantSpec, Quantized, quantize_with};
use nuvec::{Array, ops};

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
    /// failed array ([`LanguageModel::device_positions`] says so beforehand), and so do
    /// rotating or quantized caches.
    fn forward_at(&self, tokens: &Array, caches: &mut [KvCache], at: &Positions) -> Array {
        let _ = (tokens, caches, at);
        Array::failed("forward_at", nuvec::OpErrorKind::InvalidArgument("this model needs host positions".into()))
    }

    /// Whether [`LanguageModel::forward_at`] works for this model.
    fn device_positions(&self) -> bool {
        false
    }

    /// Joins projections that read the same input (queries, keys and values; gate and up)
    /// into one matrix each, so that a step reads them in one kernel; the layers keep row
    /// views of it and their names, so saving and loading see no difference. Called once the
    /// weights are final (loading does).
    fn fuse_projections(&mut self) {}

    /// Splits the model over `group`'s ranks (tensor parallelism, as mlx-lm's `shard`): each
    /// rank keeps its share of every layer's heads and hidden features, and of the vocabulary
    /// where it divides; the layers' partial outputs are summed over the ranks, and every rank
    /// ends with the whole logits. Called on the model's placeholders, each rank then loads only
    /// its part of the checkpoint ([`crate::load::LoadOptions::group`]). Joined projections
    /// come apart ([`LanguageModel::fuse_projections`] joins them again, as loading does).
    /// An error names what does not divide, or an architecture that cannot be split.
    fn shard(&mut self, group: &Group) -> Result<()> {
        let _ = group;
        Err(Error::Config(format!(
            "model_type '{}' cannot be split over ranks (llama, mistral, qwen2 and qwen3 can)",
            self.config().model_type
        )))
    }

    /// The group [`LanguageModel::shard`] split the model over (`None`: not split).
    fn group(&self) -> Option<&Group> {
        None
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
        "llama" | "mistral" | "qwen2" | "qwen3" | "qwen3_moe" => Ok(Box::new(llama::Llama::new(config, tied)?)),
        "gemma3_text" => Ok(Box::new(gemma3::Gemma3::new(config, tied)?)),
        "qwen3_next" => Ok(Box::new(qwen3_next::Qwen3Next::new(config, tied)?)),
        other => Err(Error::Config(format!("model_type '{other}' is not supported"))),
    }
}

/// A checkpoint's weights under the names `config`'s architecture holds them (mlx-lm's
/// `sanitize`): experts stacked ([`switch::stack_experts`]); a multimodal Gemma 3's language
/// model alone, under `model.`; Qwen3-Next's as [`qwen3_next::sanitize`] says.
pub fn sanitize(config: &ModelConfig, weights: Params) -> Result<Params> {
    match config.model_type.as_str() {
        "qwen3_moe" => switch::stack_experts(weights),
        "qwen3_next" => qwen3_next::sanitize(config, weights),
        "gemma3_text" => Ok(gemma3::language_model(weights)),
        _ => Ok(weights),
    }
}

/// Quantizes the layers of `model` (linear, embedding and expert stacks) for which
/// `predicate(path, weight)` gives a spec, as [`quantize_with`].
pub fn quantize(
    model: &mut dyn LanguageModel,
    mut predicate: impl FnMut(&str, &Array) -> Option<QuantSpec>,
) -> Result<()> {
    quantize_with(model, &mut predicate)?;
    switch::quantize_experts(model, &mut predicate)
}

/// Projections of one input joined row-wise into one layer ([`LanguageModel::fuse_projections`]).
pub struct Fused {
    layer: Linear,
    /// The parts' weights when joined (row views of the joined weight): a part replaced since
    /// (new weights loaded) turns the joined layer off.
    sources: Vec<Array>,
}

impl Fused {
    /// Joins `parts` (same input size, dtype, bias and quantization), which become row views
    /// of the joined arrays; `None` when they differ.
    pub fn join(parts: &mut [&mut Linear]) -> Option<Fused> {
        let first = &*parts[0];
        let alike = |l: &Linear| {
            let w = (&l.weight.value, &first.weight.value);
            let quant = match (&l.quantized, &first.quantized) {
                (None, None) => true,
                (Some(a), Some(b)) => {
                    (a.bits, a.group_size, &a.mode, a.biases.is_some())
                        == (b.bits, b.group_size, &b.mode, b.biases.is_some())
                }
                _ => false,
            };
            quant
                && w.0.dtype() == w.1.dtype()
                && w.0.shape()[1..] == w.1.shape()[1..]
                && l.bias.is_some() == first.bias.is_some()
        };
        if parts.len() < 2 || !parts.iter().all(|l| alike(l)) {
            return None;
        }
        let join = |get: &dyn Fn(&Linear) -> Option<Array>| -> Option<Array> {
            let arrays: Option<Vec<Array>> = parts.iter().map(|l| get(l)).collect();
            arrays.map(|a| ops::concatenate(&a, 0))
        };
        let weight = join(&|l| Some(l.weight.value.clone()))?;
        let bias = join(&|l| l.bias.as_ref().map(|b| b.value.clone()));
        let scales = join(&|l| l.quantized.as_ref().map(|q| q.scales.value.clone()));
        let biases = join(&|l| l.quantized.as_ref().and_then(|q| q.biases.as_ref()).map(|b| b.value.clone()));
        let frozen = first.weight.frozen;
        let quantized = first.quantized.as_ref().map(|q| Quantized {
            scales: Param { value: scales.clone().expect("quantized parts have scales"), frozen: true },
            biases: biases.clone().map(|b| Param { value: b, frozen: true }),
            ..q.clone()
        });
        let mut start = 0;
        let mut sources = Vec::new();
        for l in parts.iter_mut() {
            let end = start + l.weight.value.shape()[0];
            let rows = |a: &Array| {
                let s = a.shape();
                let (mut lo, mut hi) = (vec![0; s.len()], s.to_vec());
                (lo[0], hi[0]) = (start, end);
                a.slice(&lo, &hi, &vec![1; s.len()])
            };
            l.weight.value = rows(&weight);
            if let (Some(b), Some(all)) = (&mut l.bias, &bias) {
                b.value = rows(all);
            }
            if let Some(q) = &mut l.quantized {
                q.scales.value = rows(scales.as_ref().expect("quantized parts have scales"));
                if let (Some(b), Some(all)) = (&mut q.biases, &biases) {
                    b.value = rows(all);
                }
            }
            sources.push(l.weight.value.clone());
            start = end;
        }
        let layer = Linear { weight: Param { value: weight, frozen }, bias: bias.map(Param::new), quantized };
        Some(Fused { layer, sources })
    }

    /// The joined product of `input`, or `None` when one of `parts` was replaced since joining.
    pub fn project(&self, input: layers::Input, parts: &[&Linear]) -> Option<Array> {
        let same =
            parts.len() == self.sources.len() && parts.iter().zip(&self.sources).all(|(l, s)| l.weight.value.is(s));
        same.then(|| input.project(&self.layer))
    }
}
