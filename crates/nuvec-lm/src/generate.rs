//! Generation: prefill in chunks, then one token per step, streamed as text. The next step's
//! graph is built and started before the current token is read back (as mlx-lm), unless the
//! penalties need each token on the host first.

use std::collections::VecDeque;
use std::time::Instant;

use nuvec::{Array, DType, ops};

use crate::Result;
use crate::cache::{KvCache, ROLLBACK_STEPS};
use crate::graph::DecodeGraph;
use crate::models::LanguageModel;
use crate::sample::{Sampled, Sampler, SamplerOptions};
use crate::tokenizer::{Detokenizer, Tokenizer};

/// What to generate.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    /// At most this many new tokens.
    pub max_tokens: usize,
    /// How tokens are chosen.
    pub sampler: SamplerOptions,
    /// The prompt is run this many tokens at a time.
    pub prefill_step: usize,
    /// Generation ends when the text contains one of these (left out of the text).
    pub stop: Vec<String>,
    /// Decode steps with the positions on the device, recorded once as a device graph
    /// ([`DecodeGraph`]): `None` on a GPU when the model and caches allow it, `Some(true)`
    /// wherever they allow it (on the CPU the steps run eagerly, the same computation), and
    /// `Some(false)` never.
    pub decode_graph: Option<bool>,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_tokens: 256,
            sampler: SamplerOptions::default(),
            prefill_step: 2048,
            stop: Vec::new(),
            decode_graph: None,
        }
    }
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence token or a stop string.
    Stop,
    /// `max_tokens` reached.
    Length,
}

/// One generated token.
#[derive(Clone, Debug)]
pub struct Generated {
    /// Its id.
    pub token: u32,
    /// The text that became certain with it (possibly empty; held back while a stop string
    /// may be starting).
    pub text: String,
    /// Its log-probability.
    pub logprob: f32,
    /// The most likely alternatives and their log-probabilities, when asked for.
    pub top_logprobs: Vec<(u32, f32)>,
    /// Set on the last token.
    pub finish: Option<FinishReason>,
}

/// Speeds and sizes of a generation, as `mlx_lm.generate` reports them.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stats {
    /// Prompt tokens run through the model (those a prompt cache held are not counted).
    pub prompt_tokens: usize,
    /// Seconds from the start to the first token.
    pub prompt_seconds: f64,
    /// Tokens generated.
    pub generation_tokens: usize,
    /// Seconds from the first token to the last.
    pub generation_seconds: f64,
    /// Peak bytes held by arrays on the device that ran the model.
    pub peak_memory: usize,
}

impl Stats {
    /// Prompt tokens per second.
    pub fn prompt_tps(&self) -> f64 {
        self.prompt_tokens as f64 / self.prompt_seconds.max(1e-9)
    }

    /// Generated tokens per second (the first token counts as the prompt's).
    pub fn generation_tps(&self) -> f64 {
        self.generation_tokens.saturating_sub(1) as f64 / self.generation_seconds.max(1e-9)
    }
}

/// The caches of a conversation and the tokens they hold, so that the next prompt runs only
/// past the prefix they share (mlx-lm's prompt cache).
#[derive(Default)]
pub struct PromptCache {
    /// One cache per layer.
    pub layers: Vec<KvCache>,
    /// The tokens the caches hold.
    pub tokens: Vec<u32>,
    /// The recorded decode step over these caches, once generation made one.
    pub graph: Option<DecodeGraph>,
}

impl PromptCache {
    /// Empty caches for `model`.
    pub fn new(model: &dyn LanguageModel) -> PromptCache {
        PromptCache { layers: model.new_cache(), tokens: Vec::new(), graph: None }
    }

    /// Rotating caches of at most `max_kv_size` positions (the first 4 kept, as mlx-lm's
    /// `--max-kv-size`): memory stays bounded and attention sees a sliding window. Recurrent
    /// layers keep their recurrent caches.
    pub fn rotating(model: &dyn LanguageModel, max_kv_size: i32) -> PromptCache {
        PromptCache::of_kind(model, || KvCache::rotating(max_kv_size, 4))
    }

    /// Caches that keep keys and values quantized ([`KvCache::quantized`], mlx-lm's
    /// `--kv-bits` and `--kv-group-size`). Recurrent layers keep their recurrent caches.
    pub fn quantized(model: &dyn LanguageModel, group_size: i32, bits: i32) -> PromptCache {
        PromptCache::of_kind(model, || KvCache::quantized(group_size, bits))
    }

    /// Paged caches ([`KvCache::paged`]) of blocks of `block_size` positions (a power of
    /// two): the pools grow by blocks, and decoding records as a graph as over contiguous
    /// caches. Every attention layer is paged, sliding-window ones too (attention applies the
    /// window); recurrent layers keep their recurrent caches.
    pub fn paged(model: &dyn LanguageModel, block_size: i32) -> PromptCache {
        PromptCache::of_kind(model, || KvCache::paged(block_size))
    }

    /// `make()`'s caches for the model's attention layers, its own for the recurrent ones.
    fn of_kind(model: &dyn LanguageModel, make: impl Fn() -> KvCache) -> PromptCache {
        let layers = model.new_cache().into_iter().map(|c| if c.is_recurrent() { c } else { make() }).collect();
        PromptCache { layers, tokens: Vec::new(), graph: None }
    }

    /// Keeps the longest prefix of the held tokens that `prompt` starts with, short of the whole
    /// prompt (its last token must run to give logits); returns the tokens still to run.
    fn reuse<'p>(&mut self, prompt: &'p [u32]) -> &'p [u32] {
        let common = self.tokens.iter().zip(prompt).take_while(|(a, b)| a == b).count().min(prompt.len() - 1);
        let drop = (self.tokens.len() - common) as i32;
        // Every cache is asked (none stops early), so that a failure leaves none half trimmed
        // unnoticed: the caches are emptied then.
        let trimmed: Vec<i32> = self.layers.iter_mut().map(|c| c.trim(drop)).collect();
        if trimmed.iter().any(|&n| n != drop) {
            // A rotating cache past its window, or a recurrent one past the steps it keeps,
            // cannot go back: start over.
            self.layers = self.layers.iter().map(KvCache::emptied).collect();
            self.tokens.clear();
            return prompt;
        }
        self.tokens.truncate(common);
        &prompt[common..]
    }
}

/// A streaming generation: an iterator of [`Generated`] tokens.
pub struct Generation<'a> {
    model: &'a dyn LanguageModel,
    cache: &'a mut PromptCache,
    sampler: Sampler,
    text: TextStream<'a>,
    eos: Vec<u32>,
    options: GenerateOptions,
    prompt: Vec<u32>,
    pending: Option<Sampled>,
    generated: Vec<u32>,
    done: bool,
    start: Instant,
    first: Option<Instant>,
    /// Speculative decoding: who proposes tokens, how many per step, and the tokens verified
    /// but not yet handed out.
    draft: Option<Draft<'a>>,
    num_draft: usize,
    queue: VecDeque<Sampled>,
    /// Single-token steps go through the [`DecodeGraph`] (decided once, see [`graphed`]).
    graphed: bool,
    /// The generation's speeds so far.
    pub stats: Stats,
}

/// Whether single-token steps over `layers` go through the [`DecodeGraph`]: the model and
/// contiguous or paged caches allow it, and `decode_graph` (by default: a GPU, unless
/// `NUVEC_LM_GRAPH=0`) asks for it.
fn graphed(model: &dyn LanguageModel, layers: &[KvCache], decode_graph: Option<bool>) -> bool {
    // Recurrent states are new arrays each step, which a recorded step cannot replay.
    let contiguous = |c: &KvCache| c.window().is_none() && c.quantization().is_none() && !c.is_recurrent();
    // A model split over ranks sums its layers' outputs as it builds a step: nothing to replay.
    let allowed = model.device_positions() && layers.iter().all(contiguous) && model.group().is_none();
    let wanted = match decode_graph {
        Some(on) => on,
        None => !nuvec::default_device().is_cpu() && crate::graph::recording_wanted(),
    };
    allowed && wanted
}

/// Runs `ids` through `model` in chunks of `step` tokens, evaluating the caches after each
/// (a prompt, or all of it but the token whose logits are wanted).
pub(crate) fn run_chunks(model: &dyn LanguageModel, caches: &mut [KvCache], ids: &[u32], step: usize) -> Result<()> {
    for chunk in ids.chunks(step.max(1)) {
        model.forward(&tokens(chunk), caches);
        let arrays: Vec<Array> = caches.iter().flat_map(|c| c.arrays()).collect();
        nuvec::eval(&arrays)?;
    }
    Ok(())
}

/// Who proposes tokens for speculative decoding ([`Generation::speculative`]). The model
/// verifies a proposal of `k` tokens in one forward pass and keeps the longest prefix its own
/// choices agree with, plus its own next token: greedy decoding gives exactly the plain
/// greedy tokens, in fewer passes of the large model.
pub enum Draft<'a> {
    /// A smaller model of the same vocabulary, decoding greedily with caches of its own.
    Model {
        /// The draft model.
        model: &'a dyn LanguageModel,
        /// Its caches (empty ones to start: it runs the prompt itself).
        cache: Vec<KvCache>,
        /// Tokens of the sequence its caches hold.
        fed: usize,
    },
    /// Prompt lookup: the tokens that followed the latest earlier occurrence of the sequence's
    /// last `ngram` tokens (no second model; it pays off when replies quote their prompt).
    PromptLookup {
        /// The length of the n-gram matched.
        ngram: usize,
    },
}

impl<'a> Draft<'a> {
    /// A draft model, with empty caches.
    pub fn model(model: &'a dyn LanguageModel) -> Draft<'a> {
        Draft::Model { model, cache: model.new_cache(), fed: 0 }
    }
}

/// Generates from the token ids `prompt` (at least one), continuing `cache`; `eos` ends it.
/// Without a `tokenizer` the tokens come without text (and stop strings are not looked for).
/// Errors (an empty prompt, one longer than the model's context, bad sampler options)
/// come before the first token.
pub fn generate<'a>(
    model: &'a dyn LanguageModel,
    tokenizer: Option<&'a Tokenizer>,
    cache: &'a mut PromptCache,
    prompt: &[u32],
    eos: &[u32],
    options: GenerateOptions,
) -> Result<Generation<'a>> {
    if prompt.is_empty() {
        return Err(crate::Error::Config("generate: the prompt has no tokens".into()));
    }
    if let Some(context) = model.config().max_position_embeddings
        && prompt.len() > context as usize
    {
        return Err(crate::Error::Config(format!(
            "generate: the prompt has {} tokens, more than the model's context of {context}",
            prompt.len()
        )));
    }
    if cache.layers.is_empty() {
        cache.layers = model.new_cache();
    }
    options.sampler.validate()?;
    Ok(Generation {
        graphed: graphed(model, &cache.layers, options.decode_graph),
        model,
        sampler: Sampler::new(options.sampler.clone()),
        text: TextStream::new(tokenizer, &options.stop),
        eos: eos.to_vec(),
        prompt: prompt.to_vec(),
        cache,
        options,
        pending: None,
        generated: Vec::new(),
        done: false,
        start: Instant::now(),
        first: None,
        draft: None,
        num_draft: 0,
        queue: VecDeque::new(),
        stats: Stats::default(),
    })
}

impl<'a> Generation<'a> {
    /// Decodes speculatively: `draft` proposes `num_draft` tokens per step (at least 1), the
    /// model verifies them in one pass. The penalties need each token before the next and
    /// are refused; so are caches that cannot drop rejected tokens (rotating ones), and, for a
    /// model with recurrent layers, more proposals than their caches can take back
    /// ([`ROLLBACK_STEPS`] positions per pass, the verified token included).
    pub fn speculative(mut self, draft: Draft<'a>, num_draft: usize) -> Result<Self> {
        if self.options.sampler.needs_history() {
            return Err(crate::Error::Config(
                "speculative decoding: the repetition, presence and frequency \
                penalties are not supported"
                    .into(),
            ));
        }
        if self.cache.layers.iter().any(|c| c.window().is_some()) {
            return Err(crate::Error::Config(
                "speculative decoding needs caches that can drop tokens, \
                not rotating ones"
                    .into(),
            ));
        }
        if self.cache.layers.iter().any(KvCache::is_recurrent) && num_draft as i32 + 1 > ROLLBACK_STEPS {
            return Err(crate::Error::Config(format!(
                "speculative decoding: the model's recurrent layers take back at most {} positions of a pass, \
                 so at most {} proposals per step, not {num_draft}",
                ROLLBACK_STEPS,
                ROLLBACK_STEPS - 1
            )));
        }
        // The model's recurrent layers take back a verified pass's rejected tokens.
        for c in self.cache.layers.iter_mut() {
            c.keep_steps(1);
        }
        let mut draft = draft;
        if let Draft::Model { cache, .. } = &mut draft {
            // A draft model's recurrent layers take back its single-token steps, up to one
            // proposal's worth.
            for c in cache.iter_mut() {
                c.keep_steps(num_draft as i32);
            }
        }
        if let Draft::Model { model, .. } = &draft
            && model.config().vocab_size != self.model.config().vocab_size
        {
            return Err(crate::Error::Config(format!(
                "speculative decoding: the draft model's vocabulary ({}) differs from the model's ({})",
                model.config().vocab_size,
                self.model.config().vocab_size
            )));
        }
        self.draft = Some(draft);
        self.num_draft = num_draft.max(1);
        Ok(self)
    }

    /// One speculative step: proposals, one verifying pass, the agreed tokens and the model's
    /// next one queued; the caches keep only what was accepted.
    fn speculate(&mut self) -> Result<()> {
        let seq: Vec<u32> = self.cache.tokens.iter().chain(&self.generated).copied().collect();
        let y = *seq.last().expect("a token was generated before speculating");
        let k = self.num_draft.min(self.options.max_tokens.saturating_sub(self.generated.len())).max(1);
        let proposals: Vec<u32> = match self.draft.as_mut().expect("speculating with a draft") {
            Draft::Model { model, cache, fed } => {
                let mut out = Vec::with_capacity(k);
                let mut feed: Vec<u32> = seq[*fed..].to_vec();
                for i in 0..k {
                    let last = last_logits(&model.forward(&tokens(&feed), cache));
                    let d = last.argmax(-1).reshape([-1]).astype(DType::I32).item::<i32>()? as u32;
                    out.push(d);
                    if i + 1 < k {
                        feed = vec![d];
                    }
                }
                *fed = seq.len() + k - 1;
                out
            }
            Draft::PromptLookup { ngram } => lookup(&seq, *ngram, k),
        };
        // The model runs y and the proposals; position i's choice verifies proposal i.
        let ids: Vec<u32> = std::iter::once(y).chain(proposals.iter().copied()).collect();
        let logits = self.model.forward(&tokens(&ids), &mut self.cache.layers);
        let rows = logits.reshape([ids.len() as i32, -1]);
        let sampled = self.sampler.sample(&rows, &[]);
        let chosen: Vec<i32> = sampled.tokens.to_vec()?;
        let agreed = proposals.iter().zip(&chosen).take_while(|(d, t)| **d as i32 == **t).count();
        for i in 0..=agreed as i32 {
            let v = sampled.logprobs.shape()[1];
            self.queue.push_back(Sampled {
                tokens: sampled.tokens.slice(&[i], &[i + 1], &[1]),
                logprobs: sampled.logprobs.slice(&[i, 0], &[i + 1, v], &[1, 1]),
            });
        }
        // The model's caches keep y and the agreed proposals; the draft's what it saw of them.
        let rejected = (proposals.len() - agreed) as i32;
        for c in &mut self.cache.layers {
            if c.trim(rejected) != rejected {
                // Its layers would then disagree on the sequence.
                return Err(crate::Error::Config(format!(
                    "speculative decoding: a cache could not take back the {rejected} rejected tokens"
                )));
            }
        }
        if let Some(Draft::Model { cache, fed, .. }) = &mut self.draft {
            let keep = seq.len() + agreed.min(k - 1);
            let drop = (*fed - keep) as i32;
            let trimmed: Vec<i32> = cache.iter_mut().map(|c| c.trim(drop)).collect();
            *fed = keep;
            if trimmed.iter().any(|&n| n != drop) {
                // Caches that cannot go back that far start over: the draft runs the sequence
                // again next step.
                for c in cache.iter_mut() {
                    *c = c.emptied();
                }
                *fed = 0;
            }
        }
        Ok(())
    }

    /// Runs `tokens [1, L]` and samples the next token from the last position's logits.
    fn step(&mut self, ids: &Array) -> Result<Sampled> {
        // The previous step failed: its error, before anything reads the shape.
        ids.clone().check()?;
        let logits = if ids.shape()[1] == 1 && self.graphed {
            let graph = match &mut self.cache.graph {
                Some(g) => g,
                slot => slot.insert(DecodeGraph::new(1)?),
            };
            graph.step(self.model, &mut self.cache.layers, ids)?
        } else {
            self.model.forward(ids, &mut self.cache.layers)
        };
        // The sequence so far, for the penalties only.
        let history: Vec<u32> = match self.options.sampler.needs_history() {
            true => self.cache.tokens.iter().chain(&self.generated).copied().collect(),
            false => Vec::new(),
        };
        Ok(self.sampler.sample(&last_logits(&logits), &[&history]))
    }

    /// Runs the prompt (all but its last token in chunks of `prefill_step`) and samples the
    /// first token.
    fn prefill(&mut self) -> Result<Sampled> {
        let prompt = std::mem::take(&mut self.prompt);
        let rest = self.cache.reuse(&prompt).to_vec();
        self.stats.prompt_tokens = rest.len();
        let (head, last) = rest.split_at(rest.len() - 1);
        run_chunks(self.model, &mut self.cache.layers, head, self.options.prefill_step)?;
        self.cache.tokens = prompt[..prompt.len() - 1].to_vec();
        let sampled = self.step(&tokens(last))?;
        self.cache.tokens.push(last[0]);
        Ok(sampled)
    }

    fn next_token(&mut self) -> Result<Generated> {
        let current = match (self.queue.pop_front(), self.pending.take()) {
            (Some(s), _) | (None, Some(s)) => s,
            (None, None) if self.first.is_none() => self.prefill()?,
            (None, None) => {
                self.speculate()?;
                self.queue.pop_front().expect("a speculative step queues at least one token")
            }
        };
        // Start the next step before reading this one back, when it needs no host history.
        let pipelined = self.draft.is_none()
            && !self.options.sampler.needs_history()
            && self.generated.len() + 1 < self.options.max_tokens;
        if pipelined {
            crate::graph::queue_before_launch(
                self.cache.graph.as_ref(),
                [current.tokens.clone(), current.logprobs.clone()],
            )?;
            let next = self.step(&current.tokens.reshape([1, 1]))?;
            nuvec::async_eval(&[next.tokens.clone(), next.logprobs.clone()])?;
            self.pending = Some(next);
        }
        let token = current.tokens.item::<i32>()? as u32;
        if self.first.is_none() {
            let now = Instant::now();
            self.first = Some(now);
            self.stats.prompt_seconds = (now - self.start).as_secs_f64();
        }
        let (logprob, top_logprobs) = chosen(&current.logprobs, token, self.options.sampler.top_logprobs)?;
        self.generated.push(token);
        if !pipelined
            && self.draft.is_none()
            && !self.eos.contains(&token)
            && self.generated.len() < self.options.max_tokens
        {
            self.pending = Some(self.step(&tokens(&[token]))?);
        }
        let (text, finish) =
            self.text.push(token, self.eos.contains(&token), self.generated.len() >= self.options.max_tokens)?;
        let now = Instant::now();
        self.stats.generation_tokens = self.generated.len();
        self.stats.generation_seconds = (now - self.first.unwrap_or(now)).as_secs_f64();
        if finish.is_some() {
            self.done = true;
            self.pending = None;
            // The caches hold the tokens that ran: the prompt and all generated but the last
            // (or the last too, when a step started ahead of time ran it).
            let held = self.cache.layers.first().map_or(0, |c| c.offset()) as usize;
            self.cache.tokens.extend(&self.generated);
            self.cache.tokens.truncate(held);
            // Verified tokens past the last one handed out leave the caches too.
            let extra = (held - self.cache.tokens.len()) as i32;
            for c in &mut self.cache.layers {
                c.trim(extra);
            }
            self.queue.clear();
            self.stats.peak_memory = peak_memory();
        }
        Ok(Generated { token, text, logprob, top_logprobs, finish })
    }
}

/// A generation's text as its tokens come: each token's share of it, held back while the end
/// of the text may be the start of a stop string, and cut at the first stop string.
pub(crate) struct TextStream<'a> {
    detok: Option<Detokenizer<'a>>,
    stop: Vec<String>,
    text: String,
    shown: usize,
}

impl<'a> TextStream<'a> {
    pub(crate) fn new(tokenizer: Option<&'a Tokenizer>, stop: &[String]) -> TextStream<'a> {
        TextStream { detok: tokenizer.map(Tokenizer::stream), stop: stop.to_vec(), text: String::new(), shown: 0 }
    }

    /// The text `token` makes certain and, when generation ends with it, why: `eos` (it is an
    /// end-of-sequence token, whose text is left out), `at_max` (the most tokens), or a stop
    /// string.
    pub(crate) fn push(&mut self, token: u32, eos: bool, at_max: bool) -> Result<(String, Option<FinishReason>)> {
        let mut finish = None;
        if eos {
            finish = Some(FinishReason::Stop);
        } else {
            if let Some(d) = &mut self.detok {
                self.text.push_str(&d.push(token)?);
            }
            if at_max {
                finish = Some(FinishReason::Length);
            }
        }
        if finish.is_some()
            && let Some(d) = &mut self.detok
        {
            self.text.push_str(&d.finish()?);
        }
        // Stop strings: cut the text at the first one; hold back a tail that may begin one.
        let mut visible = self.text.len();
        if let Some(cut) = self.stop.iter().filter_map(|s| self.text.find(s.as_str())).min() {
            visible = cut;
            finish = Some(FinishReason::Stop);
        } else if finish.is_none() {
            for s in &self.stop {
                for k in (1..s.len()).rev() {
                    if s.is_char_boundary(k) && self.text.ends_with(&s[..k]) {
                        visible = visible.min(self.text.len() - k);
                    }
                }
            }
        }
        let visible = visible.max(self.shown);
        let text = self.text[self.shown..visible].to_string();
        self.shown = visible;
        Ok((text, finish))
    }
}

/// The log-probability of `token` in `logprobs [1, V]` and, for `k > 0`, the `k` most likely
/// tokens with theirs, most likely first.
pub(crate) fn chosen(logprobs: &Array, token: u32, k: usize) -> Result<(f32, Vec<(u32, f32)>)> {
    let logprob = logprobs.slice(&[0, token as i32], &[1, token as i32 + 1], &[1, 1]).item::<f32>()?;
    if k == 0 {
        return Ok((logprob, Vec::new()));
    }
    // The k best by a partition of the vocabulary, ordered here.
    let k = (k as i32).min(logprobs.shape()[1]);
    let best = (-logprobs).argpartition(k - 1, -1).slice(&[0, 0], &[1, k], &[1, 1]);
    let values: Vec<f32> = logprobs.take_along_axis(&best, -1).to_vec()?;
    let ids = best.astype(DType::I32).to_vec::<i32>()?;
    let mut top: Vec<(u32, f32)> = ids.into_iter().map(|i| i as u32).zip(values).collect();
    top.sort_by(|a, b| b.1.total_cmp(&a.1));
    Ok((logprob, top))
}

impl Iterator for Generation<'_> {
    type Item = Result<Generated>;

    fn next(&mut self) -> Option<Result<Generated>> {
        if self.done {
            return None;
        }
        let out = self.next_token();
        if out.is_err() {
            self.done = true;
        }
        Some(out)
    }
}

/// One sequence of a [`generate_batch`].
#[derive(Clone, Debug)]
pub struct BatchOutput {
    /// The generated tokens (an end-of-sequence token included, when one ended it).
    pub tokens: Vec<u32>,
    /// Their text (empty without a tokenizer; the end-of-sequence token left out), cut at the
    /// first stop string.
    pub text: String,
    /// Why it ended.
    pub finish: FinishReason,
}

/// Generates from several prompts at once, as mlx-lm's `batch_generate`: each prompt is
/// prefilled on its own, then every step decodes one token of all the sequences together
/// (each at its own position; on a GPU as one recorded graph). A sequence ends at an `eos`
/// token, a stop string or `options.max_tokens`; the results come in the prompts' order.
/// Greedy decoding gives each sequence the tokens [`generate`] gives it alone. The
/// penalties use each sequence's own tokens. Errors as [`generate`]'s, and for a model whose
/// positions cannot live on the device (`dynamic` RoPE scaling).
pub fn generate_batch(
    model: &dyn LanguageModel,
    tokenizer: Option<&Tokenizer>,
    prompts: &[Vec<u32>],
    eos: &[u32],
    options: &GenerateOptions,
) -> Result<Vec<BatchOutput>> {
    let config = |m: String| crate::Error::Config(format!("generate_batch: {m}"));
    if prompts.is_empty() || prompts.iter().any(Vec::is_empty) {
        return Err(config("every prompt needs a token, and there must be one".into()));
    }
    let context = model.config().max_position_embeddings;
    if let Some((i, p)) = prompts.iter().enumerate().find(|(_, p)| context.is_some_and(|c| p.len() > c as usize)) {
        return Err(config(format!("prompt {i} has {} tokens, more than the model's context", p.len())));
    }
    if !model.device_positions() {
        return Err(config(
            "the model's RoPE scaling needs host positions (dynamic); generate one prompt at a time".into(),
        ));
    }
    options.sampler.validate()?;
    let b = prompts.len();
    let mut sampler = Sampler::new(options.sampler.clone());
    // Each prompt alone (its own length), then its caches become one row of the batch's.
    let mut rows = Vec::with_capacity(b);
    let mut firsts = Vec::with_capacity(b);
    for p in prompts {
        // Contiguous in place of rotating caches: sliding-window layers apply their window in
        // attention, and positions on the device need caches that keep every position.
        let mut cache: Vec<KvCache> =
            model.new_cache().into_iter().map(|c| if c.window().is_some() { KvCache::new() } else { c }).collect();
        let (head, last) = p.split_at(p.len() - 1);
        run_chunks(model, &mut cache, head, options.prefill_step)?;
        firsts.push(last_logits(&model.forward(&tokens(last), &mut cache)));
        rows.push(cache);
    }
    let mut caches: Vec<KvCache> = (0..model.config().num_hidden_layers as usize)
        .map(|l| KvCache::stack(&rows.iter().map(|r| r[l].clone()).collect::<Vec<_>>()))
        .collect();
    drop(rows);
    // Recorded unless asked otherwise (`decode_graph`, else `NUVEC_LM_GRAPH`), as `generate`'s.
    let record = options.decode_graph.unwrap_or_else(crate::graph::recording_wanted);
    let mut graph = DecodeGraph::recording(b as i32, record)?;
    let mut starts: Vec<i32> = prompts.iter().map(|p| p.len() as i32).collect();
    let mut out: Vec<Vec<u32>> = vec![Vec::new(); b];
    let mut finish: Vec<Option<FinishReason>> = vec![None; b];
    // Each row's tokens so far go to the sampler only for the penalties.
    let mut sample = |logits: &Array, out: &[Vec<u32>]| {
        let past: Vec<Vec<u32>> = match options.sampler.needs_history() {
            true => prompts.iter().zip(out).map(|(p, o)| p.iter().chain(o).copied().collect()).collect(),
            false => Vec::new(),
        };
        let refs: Vec<&[u32]> = past.iter().map(Vec::as_slice).collect();
        sampler.sample(logits, &refs)
    };
    let mut sampled = sample(&ops::concatenate(&firsts, 0), &out);
    loop {
        let ids: Vec<i32> = sampled.tokens.reshape([-1]).to_vec()?;
        for (r, &t) in ids.iter().enumerate() {
            if finish[r].is_some() {
                continue;
            }
            out[r].push(t as u32);
            if eos.contains(&(t as u32)) {
                finish[r] = Some(FinishReason::Stop);
            } else if out[r].len() >= options.max_tokens {
                finish[r] = Some(FinishReason::Length);
            }
        }
        if finish.iter().all(Option::is_some) {
            break;
        }
        // Finished rows run on (their tokens are dropped) so that the step keeps its shape.
        let logits = graph.step_rows(model, &mut caches, &Array::from_slice(&ids, [b as i32, 1]), &starts)?;
        for s in &mut starts {
            *s += 1;
        }
        sampled = sample(&last_logits(&logits), &out);
    }
    out.into_iter()
        .zip(finish)
        .map(|(tokens, finish)| {
            let mut finish = finish.unwrap_or(FinishReason::Length);
            // The end-of-sequence token stays out of the text, as in streaming.
            let shown = if finish == FinishReason::Stop { &tokens[..tokens.len() - 1] } else { &tokens[..] };
            let mut text = match tokenizer {
                Some(t) => t.decode(shown)?,
                None => String::new(),
            };
            if let Some(cut) = options.stop.iter().filter_map(|s| text.find(s.as_str())).min() {
                text.truncate(cut);
                finish = FinishReason::Stop;
            }
            Ok(BatchOutput { tokens, text, finish })
        })
        .collect()
}

/// Token ids as the `[1, L]` `int32` row a model takes.
pub fn tokens(ids: &[u32]) -> Array {
    let v: Vec<i32> = ids.iter().map(|&t| t as i32).collect();
    Array::from_slice(&v, [1, v.len() as i32])
}

/// The last position's logits `[B, V]` of `logits [B, L, V]` (a failed array, which has no
/// such shape, comes back as it is, carrying its error).
pub fn last_logits(logits: &Array) -> Array {
    let s = logits.shape();
    if s.len() != 3 {
        return logits.clone();
    }
    logits.slice(&[0, s[1] - 1, 0], &[s[0], s[1], s[2]], &[1, 1, 1]).squeeze(1)
}

/// Up to `k` tokens that followed the latest earlier occurrence of the last `ngram` tokens of
/// `seq` (none when there is no such occurrence).
fn lookup(seq: &[u32], ngram: usize, k: usize) -> Vec<u32> {
    let n = ngram.max(1);
    if seq.len() <= n {
        return Vec::new();
    }
    let tail = &seq[seq.len() - n..];
    (0..seq.len() - n)
        .rev()
        .find(|&i| &seq[i..i + n] == tail)
        .map(|i| seq[i + n..].iter().take(k).copied().collect())
        .unwrap_or_default()
}

/// Peak bytes held by arrays on the default device since the process started.
pub fn peak_memory() -> usize {
    let device = nuvec::default_device();
    if device.is_cpu() {
        nuvec::memory::host_memory().peak
    } else {
        nuvec::cuda::memory(device.index).map(|m| m.peak).unwrap_or(0)
    }
}
