//! Continuous batching, as servers run a model: requests join a running batch after their
//! prompt is prefilled and leave it when they end, and every step decodes one token of each
//! request in the batch together (each at its own position, with its own sampler, stop
//! strings and limits).
//!
//! ```no_run
//! use nuvec_lm::engine::{Engine, Request};
//! use nuvec_lm::{GenerateOptions, load};
//! let m = load(std::path::Path::new("SmolLM2-135M-Instruct.Q4_1.gguf"), &Default::default())?;
//! let mut engine = Engine::new(m.model.as_ref(), Some(&m.tokenizer), &m.eos, 8);
//! for (id, text) in ["The capital of France is", "Two plus two is"].iter().enumerate() {
//!     let prompt = m.tokenizer.encode(text, true)?;
//!     let options = GenerateOptions { max_tokens: 16, ..Default::default() };
//!     engine.add(id as u64, Request { prompt, options, constraint: None })?;
//! }
//! while !engine.is_idle() {
//!     for (id, event) in engine.step() {
//!         print!("[{id}] {}", event?.text);
//!     }
//! }
//! # Ok::<(), nuvec_lm::Error>(())
//! ```
//!
//! With [`Engine::with_paged_kv`] every request's keys and values live in blocks of one pool
//! ([`BlockPool`]): a request holds only the blocks its positions fill, full blocks are shared
//! by prompts that start alike (prefix caching), and when the pool is full the newest request
//! is preempted (its blocks let go, its tokens and sampler kept) and resumes, its positions
//! recomputed, when there is room again. A model with recurrent layers (Qwen3-Next's linear
//! attention) keeps a state per request that the pool does not hold: its requests run over
//! caches of their own ([`Engine::can_page`]).

use std::collections::{HashMap, VecDeque};

use nuvec::Array;

use crate::blocks::BlockPool;
use crate::cache::{KvCache, Positions};
use crate::generate::{FinishReason, GenerateOptions, Generated, TextStream, chosen, last_logits, run_chunks};
use crate::graph::DecodeGraph;
use crate::models::LanguageModel;
use crate::sample::{Sampled, Sampler};
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// A request: its prompt's tokens, how to generate (`max_tokens`, the sampler, stop
/// strings, the prefill chunk) and what limits the tokens (a grammar, say).
pub struct Request {
    /// The prompt's token ids (at least one).
    pub prompt: Vec<u32>,
    /// How to generate.
    pub options: GenerateOptions,
    /// Which tokens may come next.
    pub constraint: Option<Box<dyn Constraint>>,
}

/// Which tokens may come next (a grammar, a JSON schema): asked before each token of a
/// request is chosen, and told the token chosen.
pub trait Constraint: Send {
    /// The tokens allowed next: `true` at their ids (ids past the end are not allowed).
    fn allowed(&mut self) -> Result<Vec<bool>>;

    /// `token` was chosen; whether the constraint is now complete (the request ends).
    fn commit(&mut self, token: u32) -> Result<bool>;
}

/// A request in the running batch (or preempted, waiting to resume).
struct Sequence<'a> {
    id: u64,
    prompt: Vec<u32>,
    options: GenerateOptions,
    constraint: Option<Box<dyn Constraint>>,
    sampler: Sampler,
    text: TextStream<'a>,
    generated: Vec<u32>,
    /// Positions its rows of the batch's caches hold.
    length: i32,
    /// The model's context, which ends it.
    context: Option<usize>,
    /// Paged: its full blocks named so far, and the last one's name.
    named: (usize, u64),
}

impl Sequence<'_> {
    /// The token at position `p`: the prompt's, then the generated ones fed back.
    fn token(&self, p: usize) -> u32 {
        match p.checked_sub(self.prompt.len()) {
            None => self.prompt[p],
            Some(g) => self.generated[g],
        }
    }
}

/// What a queued request does: run a new prompt, or resume a preempted sequence (its
/// positions computed again from its tokens).
enum Job<'a> {
    New(Request),
    Resume(Box<Sequence<'a>>),
}

/// A request being prefilled: its caches (or, paged, its blocks) hold `done` of `tokens`,
/// and `head` of them run before it joins the batch.
struct Filling<'a> {
    id: u64,
    job: Job<'a>,
    tokens: Vec<u32>,
    head: usize,
    caches: Vec<KvCache>,
    blocks: Vec<i32>,
    named: (usize, u64),
    done: usize,
}

/// The paged engine's pool: its blocks, each running sequence's (in `running`'s order), and
/// how many times a sequence was preempted.
struct Paged {
    pool: BlockPool,
    rows: Vec<Vec<i32>>,
    preemptions: usize,
    /// Some running sequence lacks a block for a step started ahead: none is.
    tight: bool,
}

/// The state of a paged engine's pool ([`Engine::kv_blocks`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvBlocks {
    /// Positions per block.
    pub block_size: usize,
    /// Blocks in the pool.
    pub capacity: usize,
    /// Blocks requests hold.
    pub held: usize,
    /// Blocks no request holds that keep their tokens for later prompts.
    pub cached: usize,
    /// Sequences preempted so far (each resumed later).
    pub preemptions: usize,
}

/// A continuous batch over one model (see the module docs). Requests are taken in the order
/// they were added, at most `max_batch` running at once.
pub struct Engine<'a> {
    model: &'a dyn LanguageModel,
    tokenizer: Option<&'a Tokenizer>,
    eos: Vec<u32>,
    max_batch: usize,
    waiting: VecDeque<(u64, Job<'a>)>,
    running: Vec<Sequence<'a>>,
    /// The running sequences' caches, one row each in `running`'s order.
    caches: Vec<KvCache>,
    graph: Option<DecodeGraph>,
    /// The next step, started before this one's tokens were read (for `running`, in order).
    ahead: Option<Vec<Sampled>>,
    /// The request whose prompt is being prefilled, a budget of tokens per step at a time.
    filling: Option<Filling<'a>>,
    /// Prompt tokens prefilled per step at most (the rest waits for the next step).
    prefill_budget: usize,
    /// Ended requests' caches and the tokens they hold, most recent last, at most
    /// `prefixes` of them (prompt caching across requests).
    kept: Vec<(Vec<u32>, Vec<KvCache>)>,
    prefixes: usize,
    /// Prompt tokens each request found in a kept cache, until asked for.
    reused: HashMap<u64, usize>,
    /// The pool of a paged engine.
    paged: Option<Paged>,
    /// Forward passes over prompts so far.
    prefill_passes: usize,
    /// Prompts prefilled together at most.
    prefill_rows: usize,
}

impl<'a> Engine<'a> {
    /// An engine with nothing to do, for `model` (and `tokenizer`, for the text and stop
    /// strings), generation ending at any of `eos`.
    pub fn new(model: &'a dyn LanguageModel, tokenizer: Option<&'a Tokenizer>, eos: &[u32], max_batch: usize) -> Self {
        Engine {
            model,
            tokenizer,
            eos: eos.to_vec(),
            max_batch: max_batch.max(1),
            waiting: VecDeque::new(),
            running: Vec::new(),
            caches: Vec::new(),
            graph: None,
            ahead: None,
            filling: None,
            prefill_budget: usize::MAX,
            kept: Vec::new(),
            prefixes: 0,
            reused: Default::default(),
            paged: None,
            prefill_passes: 0,
            prefill_rows: usize::MAX,
        }
    }

    /// Whether [`Engine::with_paged_kv`] can hold `model`'s caches: not when it has recurrent
    /// layers, whose state per request the pool does not hold.
    pub fn can_page(model: &dyn LanguageModel) -> bool {
        !model.new_cache().iter().any(KvCache::is_recurrent)
    }

    /// Keeps every request's keys and values in one pool per layer of `positions` positions
    /// (whole blocks), in blocks of `block_size` (rounded up to a power of two); the pool grows
    /// as needed up to that size (see the module docs). With [`Engine::with_prefix_cache`]
    /// (any number of entries) full blocks are shared by prompts that start alike and stay
    /// cached until the pool needs them. A model with recurrent layers cannot
    /// ([`Engine::can_page`]): its requests are refused when added.
    pub fn with_paged_kv(mut self, block_size: usize, positions: usize) -> Self {
        let bs = block_size.clamp(1, 1 << 16).next_power_of_two();
        let blocks = positions.div_ceil(bs).clamp(1, i32::MAX as usize);
        self.paged = Some(Paged { pool: BlockPool::new(bs, blocks), rows: Vec::new(), preemptions: 0, tight: false });
        self.fresh_pool();
        self
    }

    /// An empty pool: every block free, the layers' caches without buffers.
    fn fresh_pool(&mut self) {
        let Some(p) = &mut self.paged else { return };
        let (bs, blocks) = (p.pool.block_size(), p.pool.capacity());
        (p.pool, p.rows) = (BlockPool::new(bs, blocks), Vec::new());
        self.caches = self.model.new_cache().iter().map(|_| KvCache::paged_shared(bs as i32, blocks as i32)).collect();
    }

    /// A paged engine's pool: blocks held, cached and in all, and preemptions so far.
    pub fn kv_blocks(&self) -> Option<KvBlocks> {
        self.paged.as_ref().map(|p| KvBlocks {
            block_size: p.pool.block_size(),
            capacity: p.pool.capacity(),
            held: p.pool.held(),
            cached: p.pool.cached(),
            preemptions: p.preemptions,
        })
    }

    /// Keeps the caches of the last `entries` requests that ended: a request whose prompt
    /// starts as one of them did (a conversation's next turn) runs only the rest.
    pub fn with_prefix_cache(mut self, entries: usize) -> Self {
        self.prefixes = entries;
        self
    }

    /// Prefills at most `tokens` prompt tokens per step (at least one), so that a long prompt
    /// joining delays the running requests' next tokens by a bounded time; by default a
    /// request's whole prompt runs in the step it joins.
    pub fn with_prefill_budget(mut self, tokens: usize) -> Self {
        self.prefill_budget = tokens.max(1);
        self
    }

    /// Prefills at most `prompts` prompts together in one forward pass (at least one); by
    /// default every waiting prompt that fits the step's budget and the batch joins it.
    pub fn with_prefill_rows(mut self, prompts: usize) -> Self {
        self.prefill_rows = prompts.max(1);
        self
    }

    /// How many of request `id`'s prompt tokens came from a kept cache (asked once, after its
    /// first token).
    pub fn reused_tokens(&mut self, id: u64) -> Option<usize> {
        self.reused.remove(&id)
    }

    /// Fresh caches for a request, or a kept cache holding the longest start of `prompt` (all
    /// of it but its last token at most, whose logits are needed), and its length.
    fn caches_for(&mut self, prompt: &[u32]) -> (Vec<KvCache>, usize) {
        let shared = |t: &[u32]| t.iter().zip(prompt).take_while(|(a, b)| a == b).count().min(prompt.len() - 1);
        let best = self.kept.iter().enumerate().map(|(i, (t, _))| (shared(t), i)).max();
        if let Some((n, i)) = best.filter(|(n, _)| *n > 0) {
            let (_, mut caches) = self.kept.remove(i);
            let mut whole = true;
            for c in &mut caches {
                let extra = c.offset() - n as i32;
                whole &= c.trim(extra) == extra;
            }
            // A recurrent cache cannot go back past the steps it keeps: fresh caches then.
            if whole {
                return (caches, n);
            }
        }
        // Contiguous in place of rotating caches: sliding-window layers apply their window in
        // attention, and a batch's rows need caches that keep every position.
        let fresh = self
            .model
            .new_cache()
            .into_iter()
            .map(|c| if c.window().is_some() || c.quantization().is_some() { KvCache::new() } else { c })
            .collect();
        (fresh, 0)
    }

    /// Keeps `caches`, which hold `tokens`, for later prompts that start the same way.
    fn keep(&mut self, tokens: Vec<u32>, caches: Vec<KvCache>) {
        if self.prefixes == 0 || tokens.is_empty() {
            return;
        }
        // Its own buffers now, cut to its length, not a view of the batch's that keeps all of
        // them alive.
        let caches: Vec<KvCache> = caches.iter().map(KvCache::compact).collect();
        let arrays: Vec<Array> = caches.iter().flat_map(KvCache::arrays).collect();
        if nuvec::eval(&arrays).is_err() {
            return;
        }
        self.kept.push((tokens, caches));
        if self.kept.len() > self.prefixes {
            self.kept.remove(0);
        }
    }

    /// Queues request `id`; an error says why it cannot run (no tokens, longer than the
    /// model's context, a sampler option out of range, a model that needs host positions).
    pub fn add(&mut self, id: u64, request: Request) -> Result<()> {
        let bad = |m: String| Err(Error::Config(format!("request {id}: {m}")));
        if request.prompt.is_empty() {
            return bad("the prompt has no tokens".into());
        }
        if let Some(context) = self.model.config().max_position_embeddings
            && request.prompt.len() > context as usize
        {
            return bad(format!(
                "the prompt has {} tokens, more than the model's context of {context}",
                request.prompt.len()
            ));
        }
        if !self.model.device_positions() {
            return bad("the model's RoPE scaling needs host positions (dynamic): it cannot be batched".into());
        }
        if self.paged.is_some() && !Engine::can_page(self.model) {
            return bad("the model's recurrent (linear-attention) layers keep a state per request, which the paged \
                 KV cache does not hold: run it without a paged KV cache"
                .into());
        }
        if let Some(p) = &self.paged
            && request.prompt.len() >= p.pool.capacity() * p.pool.block_size()
        {
            let room = p.pool.capacity() * p.pool.block_size();
            return bad(format!(
                "the prompt has {} tokens; the KV cache holds {room} positions, and one more is needed to generate",
                request.prompt.len()
            ));
        }
        request.options.sampler.validate()?;
        self.waiting.push_back((id, Job::New(request)));
        Ok(())
    }

    /// Drops request `id`, waiting or running (a client that went away); whether it was there.
    pub fn cancel(&mut self, id: u64) -> bool {
        if self.filling.as_ref().is_some_and(|f| f.id == id) {
            let f = self.filling.take().expect("checked");
            self.release(&f.blocks);
            self.reused.remove(&id);
            return true;
        }
        if let Some(i) = self.waiting.iter().position(|(w, _)| *w == id) {
            self.waiting.remove(i);
            self.reused.remove(&id);
            return true;
        }
        match self.running.iter().position(|s| s.id == id) {
            Some(i) => {
                self.leave(&[i]);
                true
            }
            None => false,
        }
    }

    /// Whether no request is waiting or running.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty() && self.filling.is_none()
    }

    /// Bytes the engine's key-value caches hold: the batch's, the prompt being prefilled,
    /// and those kept for later prompts.
    pub fn cache_bytes(&self) -> usize {
        let kept = self.kept.iter().flat_map(|(_, c)| c);
        let filling = self.filling.iter().flat_map(|f| &f.caches);
        self.caches.iter().chain(kept).chain(filling).flat_map(KvCache::arrays).map(|a| a.nbytes()).sum()
    }

    /// Forward passes the engine ran over prompts so far: prompts that join in the same step
    /// run together in one.
    pub fn prefill_passes(&self) -> usize {
        self.prefill_passes
    }

    /// Requests running and waiting (being prefilled included).
    pub fn load(&self) -> (usize, usize) {
        (self.running.len(), self.waiting.len() + self.filling.is_some() as usize)
    }

    /// One step: waiting requests join while there is room (their prompts run together), then
    /// the batch decodes one token of every running request, the new ones' first. A step
    /// started ahead already holds the batch's tokens: requests join after it, for the next.
    /// Each event is a request's next token or the error that ended it; a request's last
    /// token has `finish` set, and it has left the batch.
    pub fn step(&mut self) -> Vec<(u64, Result<Generated>)> {
        let mut events = Vec::new();
        let t0 = std::time::Instant::now();
        let early = self.ahead.is_none();
        let mut prefilled = if early { self.admit(&mut events) } else { 0 };
        let (t1, decoded) = (std::time::Instant::now(), self.running.len());
        self.make_room(&mut events);
        if !self.running.is_empty() {
            match self.decode_and_start_next() {
                Ok(tokens) => self.hand_out(tokens, &mut events),
                Err(e) => self.fail_batch(&e.to_string(), &mut events),
            }
        }
        let t2 = std::time::Instant::now();
        if !early {
            prefilled = self.admit(&mut events);
        }
        crate::graph::log(|| {
            let ms = |a: std::time::Instant, b: std::time::Instant| (b - a).as_secs_f64() * 1e3;
            format!(
                "step: {prefilled} prompt tokens in {:.1} ms; decoded {decoded} rows in {:.1} ms; {} running, {} waiting",
                ms(t0, t1) + ms(t2, std::time::Instant::now()),
                ms(t1, t2),
                self.running.len(),
                self.waiting.len()
            )
        });
        events
    }

    /// Waiting requests join while there is room, their prompts run (all but the last token:
    /// the next step feeds it with the batch's tokens and chooses their first), the budget's
    /// worth in the order the requests came. Prompts that fit whole run together, one forward
    /// pass over rows padded to the longest; one that does not runs a chunk alone and goes on
    /// next step. The prompt tokens run.
    fn admit(&mut self, events: &mut Vec<(u64, Result<Generated>)>) -> usize {
        let mut budget = self.prefill_budget;
        let mut group: Vec<Filling<'a>> = Vec::new();
        let (mut real, mut longest) = (0, 0);
        while self.running.len() + group.len() < self.max_batch && group.len() < self.prefill_rows && budget > 0 {
            let mut f = match self.filling.take() {
                Some(f) => f,
                None if !self.room_for_next(group.len()) => break,
                None => {
                    let Some((id, job)) = self.waiting.pop_front() else { break };
                    self.start(id, job)
                }
            };
            let n = f.head - f.done;
            if let Some(first) = group.first() {
                // Padding may at most double the work; contiguous rows join only empty caches.
                let wide = (group.len() + 1) * longest.max(n) > 2 * (real + n);
                let mixed = self.paged.is_none() && (f.done > 0 || first.done > 0);
                if self.would_share(&f, &group) {
                    // Back to the queue: it looks its blocks up again next step.
                    self.release(&f.blocks);
                    self.waiting.push_front((f.id, f.job));
                    break;
                }
                if n > budget || wide || mixed {
                    self.filling = Some(f);
                    break;
                }
            }
            // A paged request takes the blocks of what runs now (and of its last prompt token).
            let whole = n <= budget;
            if !self.take_blocks(&mut f.blocks, if whole { f.head + 1 } else { f.done + budget }) {
                if self.running.is_empty() && group.is_empty() {
                    self.release(&f.blocks);
                    events.push((f.id, Err(Error::Config(format!("request {}: the KV cache is full", f.id)))));
                    continue;
                }
                // Running requests will leave room.
                self.filling = Some(f);
                break;
            }
            if !whole {
                // Longer than what is left of the budget: a chunk now, the rest next steps.
                if let Err(e) = self.prefill(&mut f, budget) {
                    self.prefill_failed(vec![f], e, events);
                    break;
                }
                (f.done, budget) = (f.done + budget, 0);
                self.name_filled(&mut f);
                self.filling = Some(f);
                break;
            }
            (budget, real, longest) = (budget - n, real + n, longest.max(n));
            group.push(f);
        }
        self.run_group(group, events);
        self.prefill_budget - budget
    }

    /// Whether `f` starts as a request of `group` does for more whole blocks than it found
    /// cached: with the prefix cache on, it waits a step and reads them (the choices of one
    /// prompt run it once).
    fn would_share(&self, f: &Filling, group: &[Filling]) -> bool {
        let Some(p) = self.paged.as_ref().filter(|_| self.prefixes > 0) else { return false };
        let bs = p.pool.block_size();
        let shared =
            |g: &Filling| f.tokens[..f.head].iter().zip(&g.tokens[..g.head]).take_while(|(a, b)| a == b).count();
        group.iter().any(|g| shared(g) / bs * bs > f.done)
    }

    /// Runs the prompts of `group` (all but their last tokens), which then join the batch:
    /// one alone as it came, several in one forward pass ([`Engine::prefill_rows`]).
    fn run_group(&mut self, mut group: Vec<Filling<'a>>, events: &mut Vec<(u64, Result<Generated>)>) {
        let all: Vec<usize> = (0..group.len()).collect();
        let todo: Vec<usize> = all.iter().copied().filter(|&i| group[i].head > group[i].done).collect();
        let ran = match (&self.paged, group.as_mut_slice()) {
            (_, []) => return,
            // Alone: its own caches (an empty one must hold a row to join a batch).
            (None, [f]) if f.head > f.done || f.done > 0 => {
                let n = f.head - f.done;
                self.prefill(f, n).map(|_| std::mem::take(&mut f.caches))
            }
            (None, _) => self.prefill_rows(&mut group, &all),
            (Some(_), _) if todo.len() < 2 => {
                let alone = todo.first().map(|&i| {
                    let f = &mut group[i];
                    self.prefill(f, f.head - f.done)
                });
                alone.unwrap_or(Ok(())).map(|_| Vec::new())
            }
            (Some(_), _) => self.prefill_rows(&mut group, &todo),
        };
        let caches = match ran {
            Ok(caches) => caches,
            Err(e) => return self.prefill_failed(group, e, events),
        };
        let rows = group
            .into_iter()
            .map(|mut f| {
                f.done = f.head;
                self.name_filled(&mut f);
                let Filling { id, job, blocks, named, .. } = f;
                (self.sequence(id, job, named), blocks)
            })
            .collect();
        self.push(rows, caches);
    }

    /// Runs rows `rows` of `group` in one forward pass: their tokens from where their caches
    /// end to their heads, padded at the end to the longest (the pads' keys land past each
    /// row's length, where its own later tokens overwrite them; recurrent layers leave the
    /// pads out of their state). Contiguous rows start empty
    /// and come back as one cache of `rows.len()` rows; paged ones write their blocks (topped
    /// up for the pads; without room, one by one).
    fn prefill_rows(&mut self, group: &mut [Filling<'a>], rows: &[usize]) -> Result<Vec<KvCache>> {
        let n = |f: &Filling| f.head - f.done;
        let l = rows.iter().map(|&i| n(&group[i])).max().unwrap_or(0).max(1);
        let mut ids = vec![0i32; rows.len() * l];
        for (r, &i) in rows.iter().enumerate() {
            let f = &group[i];
            for (j, &t) in f.tokens[f.done..f.head].iter().enumerate() {
                ids[r * l + j] = t as i32;
            }
        }
        let b = rows.len() as i32;
        let tokens = Array::from_slice(&ids, [b, l as i32]);
        let starts: Vec<i32> = rows.iter().map(|&i| group[i].done as i32).collect();
        let ends: Vec<i32> = starts.iter().map(|s| s + l as i32).collect();
        let at = Positions::new(Array::from_slice(&starts, [b]), Array::from_slice(&ends, [b]));
        let at = if starts.iter().all(|&s| s == 0) { at.fresh() } else { at };
        // Rows shorter than the longest are padded: recurrent layers keep the pads out.
        let valid: Vec<i32> = rows.iter().map(|&i| n(&group[i]) as i32).collect();
        let at = if valid.iter().any(|&v| v < l as i32) { at.with_valid(Array::from_slice(&valid, [b])) } else { at };
        if self.paged.is_none() {
            self.prefill_passes += 1;
            let mut caches = std::mem::take(&mut group[rows[0]].caches);
            self.model.forward_at(&tokens, &mut caches, &at);
            nuvec::eval(&caches.iter().flat_map(KvCache::arrays).collect::<Vec<_>>())?;
            return Ok(caches);
        }
        for &i in rows {
            let end = group[i].done + l;
            if !self.take_blocks(&mut group[i].blocks, end) {
                for &i in rows {
                    let f = &mut group[i];
                    self.prefill(f, f.head - f.done)?;
                }
                return Ok(Vec::new());
            }
        }
        let blocks: Vec<Vec<i32>> = rows.iter().map(|&i| group[i].blocks.clone()).collect();
        let offset = starts.iter().copied().max().unwrap_or(0) as usize;
        self.prefill_passes += 1;
        self.with_pool(blocks, offset, |model, view| {
            model.forward_at(&tokens, view, &at);
            nuvec::eval(&view.iter().flat_map(KvCache::arrays).collect::<Vec<_>>())
        })?;
        Ok(Vec::new())
    }

    /// The requests of `group` end with `e`, their blocks let go; a paged engine's batch too
    /// (the pool it reads is unknown).
    fn prefill_failed(&mut self, group: Vec<Filling<'a>>, e: Error, events: &mut Vec<(u64, Result<Generated>)>) {
        let message = e.to_string();
        let mut e = Some(e);
        for f in group {
            self.release(&f.blocks);
            events.push((f.id, Err(e.take().unwrap_or_else(|| Error::Config(message.clone())))));
        }
        if self.paged.is_some() {
            self.fail_batch("a prompt's prefill into the shared KV cache failed", events);
        }
    }

    /// Every running request ends with `message` (the batch's state is unknown after a failed
    /// step); a paged engine starts a fresh pool, its cached blocks forgotten, and the request
    /// being prefilled waits again at the head of the queue.
    fn fail_batch(&mut self, message: &str, events: &mut Vec<(u64, Result<Generated>)>) {
        for s in self.running.drain(..) {
            events.push((s.id, Err(Error::Config(message.to_string()))));
        }
        (self.ahead, self.graph) = (None, None);
        if self.paged.is_none() {
            self.caches.clear();
            return;
        }
        if let Some(f) = self.filling.take() {
            self.waiting.push_front((f.id, f.job));
        }
        self.fresh_pool();
    }

    /// Whether the next waiting request may start, `joining` more about to join: a paged
    /// engine keeps room for the prompt and a block per running or joining request (a request
    /// that could not go on would be preempted).
    fn room_for_next(&self, joining: usize) -> bool {
        let (Some(p), Some((_, job))) = (&self.paged, self.waiting.front()) else { return true };
        let tokens = match job {
            Job::New(r) => r.prompt.len() + 1,
            Job::Resume(s) => s.prompt.len() + s.generated.len(),
        };
        let rows = self.running.len() + joining;
        rows == 0 || p.pool.available() >= tokens.div_ceil(p.pool.block_size()) + rows
    }

    /// The filling state of a request leaving the queue: fresh caches, or a kept cache or
    /// cached blocks holding the start of its tokens.
    fn start(&mut self, id: u64, job: Job<'a>) -> Filling<'a> {
        let (tokens, head) = match &job {
            Job::New(r) => (r.prompt.clone(), r.prompt.len() - 1),
            Job::Resume(s) => {
                // Every position but the last token's, which the next step feeds.
                let mut t: Vec<u32> = s.prompt.iter().chain(&s.generated).copied().collect();
                t.pop();
                let n = t.len();
                (t, n)
            }
        };
        let mut f = Filling { id, job, tokens, head, caches: Vec::new(), blocks: Vec::new(), named: (0, 0), done: 0 };
        match &mut self.paged {
            Some(p) => {
                if self.prefixes > 0 {
                    let (blocks, name) = p.pool.lookup(&f.tokens, f.head);
                    (f.done, f.named) = (blocks.len() * p.pool.block_size(), (blocks.len(), name));
                    f.blocks = blocks;
                }
            }
            None => (f.caches, f.done) = self.caches_for(&f.tokens),
        }
        if matches!(f.job, Job::New(_)) {
            self.reused.insert(id, f.done);
        }
        f
    }

    /// Gives `blocks` (a paged request's) the blocks of `positions` positions; `false` when the
    /// pool has too few (those taken are kept).
    fn take_blocks(&mut self, blocks: &mut Vec<i32>, positions: usize) -> bool {
        let Some(p) = &mut self.paged else { return true };
        while blocks.len() * p.pool.block_size() < positions {
            match p.pool.take() {
                Some(b) => blocks.push(b),
                None => return false,
            }
        }
        true
    }

    /// A paged request lets go of `blocks`.
    fn release(&mut self, blocks: &[i32]) {
        if let Some(p) = &mut self.paged {
            p.pool.release(blocks);
        }
    }

    /// Runs the next `n` of `f`'s tokens into its caches, or into its blocks of the pool.
    fn prefill(&mut self, f: &mut Filling, n: usize) -> Result<()> {
        let chunk = &f.tokens[f.done..f.done + n];
        let step = match &f.job {
            Job::New(r) => r.options.prefill_step,
            Job::Resume(s) => s.options.prefill_step,
        };
        self.prefill_passes += n.div_ceil(step.max(1));
        if self.paged.is_none() {
            return run_chunks(self.model, &mut f.caches, chunk, step);
        }
        self.with_pool(vec![f.blocks.clone()], f.done, |model, view| run_chunks(model, view, chunk, step))
    }

    /// Runs `work` over a view of the pool holding rows of `blocks` and `offset` positions.
    fn with_pool<T>(
        &mut self,
        blocks: Vec<Vec<i32>>,
        offset: usize,
        work: impl FnOnce(&dyn LanguageModel, &mut [KvCache]) -> T,
    ) -> T {
        // A recorded step would hold the pool: the writes would not be in place.
        self.graph = None;
        let mut view: Vec<KvCache> = self.caches.iter_mut().map(|c| c.lend(blocks.clone(), offset as i32)).collect();
        let out = work(self.model, &mut view);
        for (c, v) in self.caches.iter_mut().zip(view) {
            c.restore(v);
        }
        out
    }

    /// Names the full blocks a paged request has filled (prefix caching).
    fn name_filled(&mut self, f: &mut Filling) {
        let Some(p) = self.paged.as_mut().filter(|_| self.prefixes > 0) else { return };
        let bs = p.pool.block_size();
        while (f.named.0 + 1) * bs <= f.done {
            let k = f.named.0;
            f.named = (k + 1, p.pool.name(f.blocks[k], f.named.1, &f.tokens[k * bs..(k + 1) * bs]));
        }
    }

    /// Names the full blocks running sequence `i` has written whose tokens are known.
    fn name_running(&mut self, i: usize) {
        let Some(p) = self.paged.as_mut().filter(|_| self.prefixes > 0) else { return };
        let s = &mut self.running[i];
        let bs = p.pool.block_size();
        let known = (s.length as usize).min(s.prompt.len() + s.generated.len());
        while (s.named.0 + 1) * bs <= known {
            let k = s.named.0;
            let tokens: Vec<u32> = (k * bs..(k + 1) * bs).map(|q| s.token(q)).collect();
            s.named = (k + 1, p.pool.name(p.rows[i][k], s.named.1, &tokens));
        }
    }

    /// Before a paged step: every running sequence gets the blocks of the position the step
    /// writes (none when a step started ahead wrote it) and, where the pool has them, of the
    /// one after (for a step started ahead; without it, none is). Without room for the next
    /// positions, the request being prefilled, then the newest running ones, are preempted:
    /// they let go of their blocks and wait at the head of the queue, their tokens and
    /// samplers kept.
    fn make_room(&mut self, events: &mut Vec<(u64, Result<Generated>)>) {
        let Some(p) = &mut self.paged else { return };
        let bs = p.pool.block_size();
        // A step started ahead wrote its positions already: this step writes none unless it
        // starts another.
        let pending = self.ahead.is_none() as usize;
        let mut changed = false;
        let mut i = 0;
        while i < self.running.len() {
            let need = (self.running[i].length as usize + pending).div_ceil(bs);
            if p.rows[i].len() >= need {
                i += 1;
                continue;
            }
            if let Some(b) = p.pool.take() {
                p.rows[i].push(b);
                changed = true;
                continue;
            }
            if let Some(f) = self.filling.take() {
                p.pool.release(&f.blocks);
                p.preemptions += 1;
                self.waiting.push_front((f.id, f.job));
                continue;
            }
            let last = self.running.len() - 1;
            if last == 0 {
                // Nothing else to preempt: the pool cannot hold this request.
                let (id, room) = (self.running[0].id, p.pool.capacity() * bs);
                let message = format!("request {id}: its tokens fill the KV cache of {room} positions");
                events.push((id, Err(Error::Config(message))));
                self.leave(&[0]);
                return;
            }
            let s = self.remove_row(last);
            let p = self.paged.as_mut().expect("paged");
            p.preemptions += 1;
            self.waiting.push_front((s.id, Job::Resume(Box::new(s))));
            return self.make_room(events);
        }
        p.tight = false;
        for (s, row) in self.running.iter().zip(&mut p.rows) {
            while row.len() * bs < s.length as usize + pending + 1 && !p.tight {
                match p.pool.take() {
                    Some(b) => {
                        row.push(b);
                        changed = true;
                    }
                    None => p.tight = true,
                }
            }
        }
        if changed {
            self.set_rows();
        }
    }

    /// The batch's caches take the running sequences' blocks.
    fn set_rows(&mut self) {
        let Some(p) = &self.paged else { return };
        let longest = self.running.iter().map(|s| s.length).max().unwrap_or(0);
        KvCache::set_rows_of(&mut self.caches, &p.rows, longest);
    }

    /// Takes running sequence `i` out of a paged batch (preempted): its blocks let go, its
    /// row gone from the caches and from a step started ahead.
    fn remove_row(&mut self, i: usize) -> Sequence<'a> {
        self.name_running(i);
        let mut s = self.leave(&[i]).pop().expect("sequence i runs");
        s.named = (0, 0);
        s
    }

    /// The running sequence of a request whose caches hold all its tokens but the last: a new
    /// request's, or a resumed one as it was.
    fn sequence(&self, id: u64, job: Job<'a>, named: (usize, u64)) -> Sequence<'a> {
        let request = match job {
            Job::New(r) => r,
            Job::Resume(mut s) => {
                s.length = s.prompt.len() as i32 + s.generated.len() as i32 - 1;
                s.named = named;
                return *s;
            }
        };
        let Request { prompt, options, constraint } = request;
        Sequence {
            id,
            context: self.model.config().max_position_embeddings.map(|c| c.max(1) as usize),
            constraint,
            sampler: Sampler::new(options.sampler.clone()),
            text: TextStream::new(self.tokenizer, &options.stop),
            generated: Vec::new(),
            length: prompt.len() as i32 - 1,
            prompt,
            options,
            named,
        }
    }

    /// Sequences join the running batch as its last rows, with their blocks (paged) or with
    /// `caches`, which hold their rows in order (contiguous).
    fn push(&mut self, rows: Vec<(Sequence<'a>, Vec<i32>)>, caches: Vec<KvCache>) {
        if rows.is_empty() {
            return;
        }
        let first = self.running.len();
        match &mut self.paged {
            Some(p) => {
                for (s, blocks) in rows {
                    p.rows.push(blocks);
                    self.running.push(s);
                }
                for i in first..self.running.len() {
                    self.name_running(i);
                }
                self.set_rows();
            }
            None => {
                self.caches = match self.caches.is_empty() {
                    true => caches,
                    false => {
                        self.caches.iter().zip(&caches).map(|(b, c)| KvCache::stack(&[b.clone(), c.clone()])).collect()
                    }
                };
                self.running.extend(rows.into_iter().map(|(s, _)| s));
            }
        }
        self.graph = None;
    }

    /// This step's tokens, started last step or now, evaluated; when nothing needs them on the
    /// host first (no constraint, no penalties, nobody waiting to join), the next step is
    /// started from them before they are read, as `generate` does.
    fn decode_and_start_next(&mut self) -> Result<Vec<Sampled>> {
        let sampled = match self.ahead.take() {
            Some(s) => s,
            None => {
                // Each row's last token the caches do not hold: a prompt's, or the latest chosen.
                let ids: Vec<i32> = self.running.iter().map(|s| s.token(s.length as usize) as i32).collect();
                self.decode(&Array::from_slice(&ids, [ids.len() as i32, 1]))?
            }
        };
        let host_free = self.waiting.is_empty()
            && self.filling.is_none()
            && !self.paged.as_ref().is_some_and(|p| p.tight)
            && self.running.iter().all(|s| s.constraint.is_none() && !s.options.sampler.needs_history());
        if host_free {
            let current = sampled.iter().flat_map(|s| [s.tokens.clone(), s.logprobs.clone()]);
            crate::graph::queue_before_launch(self.graph.as_ref(), current)?;
            let ids: Vec<Array> = sampled.iter().map(|s| s.tokens.reshape([1, 1])).collect();
            let next = self.decode(&nuvec::ops::concatenate(&ids, 0).astype(nuvec::DType::I32))?;
            let lazy: Vec<Array> = next.iter().flat_map(|s| [s.tokens.clone(), s.logprobs.clone()]).collect();
            nuvec::async_eval(&lazy)?;
            self.ahead = Some(next);
        }
        Ok(sampled)
    }

    /// One step of every running request from token ids `[B, 1]`, its tokens chosen (lazy).
    fn decode(&mut self, ids: &Array) -> Result<Vec<Sampled>> {
        let b = self.running.len() as i32;
        let starts: Vec<i32> = self.running.iter().map(|s| s.length).collect();
        if self.graph.is_none() {
            self.graph =
                Some(DecodeGraph::recording(b, crate::graph::recording_wanted() && self.model.group().is_none())?);
        }
        let graph = self.graph.as_mut().expect("made above");
        let logits = last_logits(&graph.step_rows(self.model, &mut self.caches, ids, &starts)?);
        let mut sampled = Vec::with_capacity(self.running.len());
        for (r, s) in self.running.iter_mut().enumerate() {
            s.length += 1;
            let row = logits.slice(&[r as i32, 0], &[r as i32 + 1, logits.shape()[1]], &[1, 1]);
            sampled.push(choose(s, &row)?);
        }
        Ok(sampled)
    }

    /// Each running request's event from its sampled token; those that ended leave.
    fn hand_out(&mut self, sampled: Vec<Sampled>, events: &mut Vec<(u64, Result<Generated>)>) {
        let picked = match read_chosen(&sampled) {
            Ok(p) => p,
            Err(e) => return self.fail_batch(&e.to_string(), events),
        };
        let mut ended = Vec::new();
        for (i, ((s, t), &p)) in self.running.iter_mut().zip(&sampled).zip(&picked).enumerate() {
            let event = emit(s, t, p, &self.eos);
            if event.as_ref().map_or(true, |e| e.finish.is_some()) {
                ended.push(i);
            }
            events.push((s.id, event));
        }
        for i in 0..self.running.len() {
            self.name_running(i);
        }
        self.leave(&ended);
    }

    /// Running requests `ended` (indices) leave the batch, and their rows the caches; their
    /// sequences, in `running`'s order.
    fn leave(&mut self, ended: &[usize]) -> Vec<Sequence<'a>> {
        if ended.is_empty() {
            return Vec::new();
        }
        if let Some(p) = &mut self.paged {
            let mut i = 0;
            p.rows.retain(|blocks| {
                i += 1;
                let gone = ended.contains(&(i - 1));
                if gone {
                    p.pool.release(blocks);
                }
                !gone
            });
        } else if self.prefixes > 0 {
            for &i in ended {
                // Its row alone, holding its prompt and the tokens fed back after it.
                let s = &self.running[i];
                let held = s.length as usize;
                let tokens: Vec<u32> = s.prompt.iter().chain(&s.generated).copied().take(held).collect();
                let row: Vec<KvCache> = self.caches.iter().map(|c| c.select(&[i as i32], s.length)).collect();
                self.keep(tokens, row);
            }
        }
        let keep: Vec<usize> = (0..self.running.len()).filter(|i| !ended.contains(i)).collect();
        let longest = keep.iter().map(|&i| self.running[i].length).max().unwrap_or(0);
        let rows: Vec<i32> = keep.iter().map(|&i| i as i32).collect();
        if self.paged.is_none() {
            self.caches = match keep.is_empty() {
                true => Vec::new(),
                false => self.caches.iter().map(|c| c.select(&rows, longest)).collect(),
            };
        }
        let (stay, gone): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.running).into_iter().enumerate().partition(|(i, _)| !ended.contains(i));
        self.running = stay.into_iter().map(|(_, s)| s).collect();
        // A step started ahead keeps the rows that stay (theirs are in the selected caches).
        if let Some(ahead) = self.ahead.take()
            && !keep.is_empty()
        {
            let mut rows = ahead.into_iter().enumerate();
            self.ahead = Some(keep.iter().filter_map(|&k| rows.find(|(j, _)| *j == k).map(|(_, s)| s)).collect());
        }
        self.set_rows();
        self.graph = None;
        gone.into_iter().map(|(_, s)| s).collect()
    }
}

/// The next token of `s` from `logits [1, V]` (its own sampler, history and constraint).
fn choose(s: &mut Sequence, logits: &Array) -> Result<Sampled> {
    let history: Vec<u32> = match s.options.sampler.needs_history() {
        true => s.prompt.iter().chain(&s.generated).copied().collect(),
        false => Vec::new(),
    };
    let logits = match &mut s.constraint {
        Some(c) => {
            let allowed = c.allowed()?;
            if !allowed.contains(&true) {
                return Err(Error::Config(format!("request {}: its constraint allows no token", s.id)));
            }
            let v = logits.shape()[logits.ndim() - 1] as usize;
            let bias: Vec<f32> = (0..v)
                .map(|i| if allowed.get(i).copied().unwrap_or(false) { 0.0 } else { f32::NEG_INFINITY })
                .collect();
            logits.astype(nuvec::DType::F32) + Array::from_slice(&bias, [1, v as i32])
        }
        None => logits.clone(),
    };
    Ok(s.sampler.sample(&logits, &[&history]))
}

/// Each sampled row's token and its log-probability, read to the host in one transfer (one
/// wait for the device per step, not two per request).
fn read_chosen(sampled: &[Sampled]) -> Result<Vec<(u32, f32)>> {
    if sampled.is_empty() {
        return Ok(Vec::new());
    }
    let tokens: Vec<Array> = sampled.iter().map(|s| s.tokens.reshape([1, 1])).collect();
    let logprobs: Vec<Array> = sampled.iter().zip(&tokens).map(|(s, t)| s.logprobs.take_along_axis(t, -1)).collect();
    let (tokens, logprobs) = (nuvec::ops::concatenate(&tokens, 0), nuvec::ops::concatenate(&logprobs, 0));
    // Token ids below 2^24 are exact in float32.
    let both = nuvec::ops::concatenate(&[tokens.astype(nuvec::DType::F32), logprobs.astype(nuvec::DType::F32)], 1);
    let host = both.to_vec::<f32>()?;
    Ok(host.chunks(2).map(|c| (c[0] as u32, c[1])).collect())
}

/// The event of `s`'s sampled `token` (its log-probability `logprob`), which joins its tokens.
fn emit(s: &mut Sequence, sampled: &Sampled, (token, logprob): (u32, f32), eos: &[u32]) -> Result<Generated> {
    let top_logprobs = match s.options.sampler.top_logprobs {
        0 => Vec::new(),
        k => chosen(&sampled.logprobs, token, k)?.1,
    };
    s.generated.push(token);
    let complete = match &mut s.constraint {
        Some(c) => c.commit(token)?,
        None => false,
    };
    // The model's context ends the request too: positions past it are not trained.
    let full = s.context.is_some_and(|c| s.prompt.len() + s.generated.len() >= c);
    let at_max = s.generated.len() >= s.options.max_tokens || full;
    let (text, mut finish) = s.text.push(token, eos.contains(&token), at_max || complete)?;
    if complete && !eos.contains(&token) {
        finish = Some(FinishReason::Stop);
    }
    Ok(Generated { token, text, logprob, top_logprobs, finish })
}
