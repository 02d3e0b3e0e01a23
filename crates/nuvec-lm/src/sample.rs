//! Choosing the next token on the device, as mlx-lm's samplers and logits processors:
//! logit bias and repetition, presence and frequency penalties, then greedy or sampled with a
//! temperature after top-p, min-p and top-k filters, from a seeded key when one is given.

use std::collections::HashMap;

use nuvec::{Array, DType, ops, random};

/// How tokens are chosen. The defaults are greedy decoding with no penalties.
#[derive(Clone, Debug)]
pub struct SamplerOptions {
    /// Logits are divided by this before sampling; 0 picks the most likely token.
    pub temperature: f32,
    /// Sample among the `top_k` most likely tokens (0: all).
    pub top_k: i32,
    /// Sample among the most likely tokens whose probabilities add up to `top_p` (1: all).
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one (0: none).
    pub min_p: f32,
    /// Logits of tokens in the recent context are divided by this when positive and
    /// multiplied when negative (1: none).
    pub repetition_penalty: f32,
    /// How many recent tokens the penalties look at.
    pub penalty_context: usize,
    /// Subtracted from the logit of each token present in the recent context.
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per time it occurs in the recent context.
    pub frequency_penalty: f32,
    /// Added to the logits of the given tokens.
    pub logit_bias: Vec<(u32, f32)>,
    /// The same seed gives the same tokens; `None` draws from the global random state.
    pub seed: Option<u64>,
    /// Report this many most likely alternatives with each token's log-probability.
    pub top_logprobs: usize,
}

impl Default for SamplerOptions {
    fn default() -> Self {
        SamplerOptions {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            penalty_context: 20,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: None,
            top_logprobs: 0,
        }
    }
}

impl SamplerOptions {
    /// Whether choosing a token needs the tokens before it on the host (the penalties do).
    pub fn needs_history(&self) -> bool {
        self.repetition_penalty != 1.0 || self.presence_penalty != 0.0 || self.frequency_penalty != 0.0
    }

    /// Checks the ranges; an error names the option.
    pub fn validate(&self) -> crate::Result<()> {
        let bad = |what: String| Err(crate::Error::Config(format!("sampler: {what}")));
        // NaN fails these checks too.
        if self.temperature.is_nan() || self.temperature < 0.0 {
            return bad(format!("temperature must be at least 0, got {}", self.temperature));
        }
        if self.top_p.is_nan() || self.top_p <= 0.0 || self.top_p > 1.0 {
            return bad(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if !(0.0..1.0).contains(&self.min_p) {
            return bad(format!("min_p must be in [0, 1), got {}", self.min_p));
        }
        if self.top_k < 0 {
            return bad(format!("top_k must be at least 0, got {}", self.top_k));
        }
        if self.repetition_penalty.is_nan() || self.repetition_penalty <= 0.0 {
            return bad(format!("repetition_penalty must be positive, got {}", self.repetition_penalty));
        }
        Ok(())
    }
}

/// What one step chose: the tokens `[B]` (`int32`) and every token's log-probability `[B, V]`
/// (`float32`, before the filters), still lazy.
pub struct Sampled {
    /// The chosen tokens.
    pub tokens: Array,
    /// Log-probabilities of the whole vocabulary.
    pub logprobs: Array,
}

/// A sampler: [`SamplerOptions`] and its random key.
pub struct Sampler {
    options: SamplerOptions,
    key: Option<Array>,
}

impl Sampler {
    /// A sampler with `options` (seeded when `options.seed` is).
    pub fn new(options: SamplerOptions) -> Sampler {
        let key = options.seed.map(random::key);
        Sampler { options, key }
    }

    /// The options.
    pub fn options(&self) -> &SamplerOptions {
        &self.options
    }

    /// Chooses the next token of each row of `logits [B, V]`; `history[b]` holds row `b`'s
    /// tokens so far (used by the penalties only).
    pub fn sample(&mut self, logits: &Array, history: &[&[u32]]) -> Sampled {
        let o = &self.options;
        let mut logits = logits.astype(DType::F32);
        if !o.logit_bias.is_empty() {
            let ids: Vec<i32> = o.logit_bias.iter().map(|b| b.0 as i32).collect();
            let bias: Vec<f32> = o.logit_bias.iter().map(|b| b.1).collect();
            let ids = Array::from_slice(&ids, [1, ids.len() as i32]);
            logits = logits.scatter_add_along_axis(&ids, Array::from_slice(&bias, [1, bias.len() as i32]), -1);
        }
        if o.needs_history() {
            logits = self.penalize(&logits, history);
        }
        let logprobs = &logits - &logits.logsumexp_keepdims(-1);
        let o = &self.options;
        let tokens = if o.temperature == 0.0 {
            logprobs.argmax(-1)
        } else {
            let mut filtered = logprobs.clone();
            if o.top_p < 1.0 {
                filtered = top_p(&filtered, o.top_p);
            }
            if o.min_p > 0.0 {
                let threshold = &filtered.max_keepdims(-1) + o.min_p.ln();
                filtered = ops::where_(filtered.less(&threshold), f32::NEG_INFINITY, &filtered);
            }
            let vocab = filtered.shape()[filtered.ndim() - 1];
            if o.top_k > 0 && o.top_k < vocab {
                let kth = filtered.topk(o.top_k, -1).min_keepdims(-1);
                filtered = ops::where_(filtered.less(&kth), f32::NEG_INFINITY, &filtered);
            }
            let scaled = &filtered * (1.0 / o.temperature);
            let key = self.key.take().map(|k| {
                let (next, now) = random::split2(&k);
                self.key = Some(next);
                now
            });
            random::categorical(&scaled, -1, key.as_ref())
        };
        Sampled { tokens: tokens.astype(DType::I32), logprobs }
    }

    /// The repetition, presence and frequency penalties over each row's recent tokens.
    fn penalize(&self, logits: &Array, history: &[&[u32]]) -> Array {
        let o = &self.options;
        let rows: Vec<Array> = (0..logits.shape()[0])
            .map(|b| {
                let row = logits.slice(&[b, 0], &[b + 1, logits.shape()[1]], &[1, 1]);
                let recent = history.get(b as usize).copied().unwrap_or(&[]);
                let recent = &recent[recent.len().saturating_sub(o.penalty_context)..];
                if recent.is_empty() {
                    return row;
                }
                let mut counts: HashMap<u32, f32> = HashMap::new();
                for &t in recent {
                    *counts.entry(t).or_default() += 1.0;
                }
                let (ids, n): (Vec<i32>, Vec<f32>) = counts.iter().map(|(&t, &c)| (t as i32, c)).unzip();
                let len = ids.len() as i32;
                let ids = Array::from_slice(&ids, [1, len]);
                let mut chosen = row.take_along_axis(&ids, -1);
                if o.repetition_penalty != 1.0 {
                    let p = o.repetition_penalty;
                    chosen = ops::where_(chosen.less(0.0f32), &chosen * p, &chosen * (1.0 / p));
                }
                let minus = Array::from_slice(&n, [1, len]) * o.frequency_penalty + o.presence_penalty;
                row.put_along_axis(&ids, &(&chosen - &minus), -1)
            })
            .collect();
        ops::concatenate(&rows, 0)
    }
}

/// Keeps the most likely tokens whose probabilities add up to `p` (and the first one past it).
fn top_p(logprobs: &Array, p: f32) -> Array {
    let order = logprobs.argsort(-1);
    let sorted = logprobs.take_along_axis(&order, -1).exp();
    let cumulative = sorted.cumsum(-1);
    // Back to vocabulary order: the running sum at each token's place in the sort.
    let at = ops::zeros_like(&cumulative).put_along_axis(&order, &cumulative, -1);
    ops::where_(at.greater(1.0 - p), logprobs, f32::NEG_INFINITY)
}
