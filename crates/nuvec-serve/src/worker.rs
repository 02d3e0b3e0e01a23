//! The engine thread: the model runs on a thread of its own, which takes requests from the
//! HTTP handlers, runs them as one continuous batch ([`nuvec_lm::engine::Engine`]) and sends
//! each request its tokens as they come.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::time::Duration;

use nuvec::distributed::Group;
use nuvec::{Array, DType};
use nuvec_lm::engine::{Engine, Request};
use nuvec_lm::generate::Generated;
use nuvec_lm::{LanguageModel, Tokenizer};
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedSender;

use crate::openai::Endpoint;

/// What the engine tells a request.
pub(crate) enum Event {
    /// How many prompt tokens came from an earlier request's caches (before the first token).
    Cached(usize),
    /// The next token.
    Token(Generated),
    /// Why the request ended without one.
    Failed(String),
}

/// A request for the engine and where its events go.
pub(crate) struct Job {
    pub request: Request,
    pub events: UnboundedSender<Event>,
    /// The body it came from, its endpoint and which of its choices it is: what the other
    /// ranks of a split model make the same request from.
    pub source: (Arc<Value>, Endpoint, usize),
}

/// How long rank 0 of a split model waits for a request before telling the other ranks it is
/// still there (they wait at most the group's time-out).
const HEARTBEAT: Duration = Duration::from_secs(2);

/// Rank 0's word to the other ranks before each engine step (see [`follow`]): the requests
/// that ended after the last step's tokens (`cancel_before`), those that joined (`add`, with
/// the seed rank 0 drew for them), those whose clients left (`cancel`), and whether to step
/// (`step`: false while idle) or end (`stop`).
fn send_plan(group: &Group, plan: &Value) -> nuvec::Result<()> {
    let bytes = plan.to_string().into_bytes();
    for r in 1..group.size() {
        group.send(&Array::from_slice(&[bytes.len() as i64], [1]), r)?;
        group.send(&Array::from_slice(&bytes, [bytes.len() as i32]), r)?;
    }
    Ok(())
}

fn recv_plan(group: &Group) -> nuvec::Result<Value> {
    let n = group.recv(&[1], DType::I64, 0)?.to_vec::<i64>()?[0];
    let bytes = group.recv(&[n as i32], DType::U8, 0)?.to_vec::<u8>()?;
    serde_json::from_slice(&bytes)
        .map_err(|e| nuvec::Error::Backend(format!("serve: rank 0 sent a plan that is not JSON: {e}")))
}

/// A seed of its own for a request that names none: the ranks of a split model must draw
/// alike.
fn fresh_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new().build_hasher().finish()
}

fn ids(v: &Value) -> impl Iterator<Item = u64> + '_ {
    v.as_array().into_iter().flatten().filter_map(Value::as_u64)
}

/// Counters the engine and the handlers keep (served at `/metrics`).
#[derive(Default)]
pub(crate) struct Metrics {
    pub requests: AtomicU64,
    pub failed: AtomicU64,
    pub prompt_tokens: AtomicU64,
    /// Prompt tokens found in the caches of earlier requests.
    pub cached_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    pub running: AtomicU64,
    /// Bytes of the engine's key-value caches.
    pub cache_bytes: AtomicU64,
    /// The paged KV cache's blocks: in all, held by requests, cached for later prompts; and
    /// requests preempted so far.
    pub blocks_total: AtomicU64,
    pub blocks_held: AtomicU64,
    pub blocks_cached: AtomicU64,
    pub preemptions: AtomicU64,
    pub waiting: AtomicU64,
    /// Seconds from each request's arrival to its first token.
    pub first_token: Histogram,
    /// Seconds between a request's consecutive tokens.
    pub inter_token: Histogram,
}

/// A Prometheus histogram of seconds: counts per bucket (not cumulative here), the sum in
/// microseconds.
pub(crate) struct Histogram {
    counts: [AtomicU64; BOUNDS.len() + 1],
    sum_us: AtomicU64,
}

/// The buckets' upper bounds, in seconds.
const BOUNDS: [f64; 13] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

impl Default for Histogram {
    fn default() -> Self {
        Histogram { counts: std::array::from_fn(|_| AtomicU64::new(0)), sum_us: AtomicU64::new(0) }
    }
}

impl Histogram {
    /// Counts one observation of `d`.
    pub fn observe(&self, d: std::time::Duration) {
        let s = d.as_secs_f64();
        let at = BOUNDS.iter().position(|&b| s <= b).unwrap_or(BOUNDS.len());
        self.counts[at].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }

    /// Prometheus' text of the histogram `name`.
    pub fn text(&self, name: &str, help: &str) -> String {
        let mut out = format!("# HELP {name} {help}\n# TYPE {name} histogram\n");
        let mut total = 0;
        for (i, c) in self.counts.iter().enumerate() {
            total += c.load(Ordering::Relaxed);
            let le = BOUNDS.get(i).map_or_else(|| "+Inf".to_string(), |b| b.to_string());
            out.push_str(&format!("{name}_bucket{{le=\"{le}\"}} {total}\n"));
        }
        let sum = self.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        out.push_str(&format!("{name}_sum {sum}\n{name}_count {total}\n"));
        out
    }
}

/// The handle the handlers hold: requests go in through it. Dropped (the server stopped), it
/// waits for the engine thread to finish the running requests and, for a split model, to tell
/// the other ranks to stop.
pub(crate) struct Worker {
    jobs: Option<std::sync::mpsc::Sender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
    pub metrics: Arc<Metrics>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Worker {
    /// Starts the engine thread over `model` (`nuvec_lm::engine::Engine`'s settings from
    /// `options`: the batch, the prompt cache, the prefill budget).
    pub fn spawn(
        model: Box<dyn LanguageModel>,
        tokenizer: Arc<Tokenizer>,
        eos: Vec<u32>,
        options: &crate::ServeOptions,
    ) -> std::io::Result<Worker> {
        let options = options.clone();
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        let metrics = Arc::new(Metrics::default());
        let m = metrics.clone();
        let thread = std::thread::Builder::new()
            .name("nuvec-engine".into())
            .spawn(move || run(model.as_ref(), &tokenizer, &eos, &options, &rx, &m))?;
        Ok(Worker { jobs: Some(tx), thread: Some(thread), metrics })
    }

    /// Hands `job` to the engine; false when the engine thread is gone.
    pub fn submit(&self, job: Job) -> bool {
        self.metrics.waiting.fetch_add(1, Ordering::Relaxed);
        let sent = self.jobs.as_ref().is_some_and(|j| j.send(job).is_ok());
        if !sent {
            self.metrics.waiting.fetch_sub(1, Ordering::Relaxed);
        }
        sent
    }
}

/// The engine `options` ask for.
fn new_engine<'a>(
    model: &'a dyn LanguageModel,
    tokenizer: &'a Tokenizer,
    eos: &[u32],
    options: &crate::ServeOptions,
) -> Engine<'a> {
    let engine = Engine::new(model, Some(tokenizer), eos, options.max_batch)
        .with_prefix_cache(options.prompt_cache)
        .with_prefill_budget(options.prefill_chunk)
        .with_prefill_rows(options.prefill_rows);
    match options.kv_block_size {
        0 => engine,
        // Recurrent layers (linear attention) keep a state per request that the paged pool
        // does not hold: each request gets caches of its own.
        _ if !Engine::can_page(model) => engine,
        bs => engine.with_paged_kv(bs, options.kv_cache_tokens),
    }
}

fn run(
    model: &dyn LanguageModel,
    tokenizer: &Tokenizer,
    eos: &[u32],
    options: &crate::ServeOptions,
    rx: &std::sync::mpsc::Receiver<Job>,
    metrics: &Metrics,
) {
    let mut engine = new_engine(model, tokenizer, eos, options);
    let mut senders: HashMap<u64, UnboundedSender<Event>> = HashMap::new();
    let mut next = 0u64;
    // Split over ranks, rank 0 leads: the others step as it tells them (`follow`).
    let leader = options.group.as_ref().filter(|g| g.size() > 1 && g.rank() == 0);
    // The plan is made only when there are ranks to tell.
    let tell = |plan: &dyn Fn() -> Value| match leader {
        Some(g) => send_plan(g, &plan()),
        None => Ok(()),
    };
    let mut cancel_before: Vec<u64> = Vec::new();
    loop {
        // Idle, wait for work; busy, take what has come and go on.
        let first = match (engine.is_idle(), leader) {
            (true, None) => match rx.recv() {
                Ok(job) => Some(job),
                Err(_) => return,
            },
            (true, Some(_)) => match rx.recv_timeout(HEARTBEAT) {
                Ok(job) => Some(job),
                Err(RecvTimeoutError::Timeout) => {
                    let ended = std::mem::take(&mut cancel_before);
                    if tell(&|| json!({"step": false, "cancel_before": ended})).is_err() {
                        return;
                    }
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let _ = tell(&|| json!({"stop": true}));
                    return;
                }
            },
            (false, _) => None,
        };
        let (mut added, mut cancelled) = (Vec::new(), Vec::new());
        for mut job in first.into_iter().chain(rx.try_iter()) {
            let id = next;
            next += 1;
            if leader.is_some() {
                let seed = job.request.options.sampler.seed.get_or_insert_with(fresh_seed);
                let (body, endpoint, choice) = &job.source;
                let endpoint = if *endpoint == Endpoint::Chat { "chat" } else { "completion" };
                added.push(json!({"id": id, "body": **body, "endpoint": endpoint, "choice": choice, "seed": *seed}));
            }
            match engine.add(id, job.request) {
                Ok(()) => {
                    senders.insert(id, job.events);
                }
                Err(e) => {
                    metrics.failed.fetch_add(1, Ordering::Relaxed);
                    let _ = job.events.send(Event::Failed(e.to_string()));
                }
            }
        }
        // Requests whose clients went away leave the batch.
        let gone: Vec<u64> = senders.iter().filter(|(_, s)| s.is_closed()).map(|(id, _)| *id).collect();
        for id in gone {
            engine.cancel(id);
            senders.remove(&id);
            cancelled.push(id);
        }
        let ended = std::mem::take(&mut cancel_before);
        if let Err(e) = tell(&|| json!({"step": true, "cancel_before": ended, "add": added, "cancel": cancelled})) {
            for (_, s) in senders.drain() {
                let _ = s.send(Event::Failed(format!("the model's other ranks are gone: {e}")));
            }
            return;
        }
        // A panic inside a step (a bug) fails the requests it held, not the server: the engine
        // starts afresh.
        let events = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| engine.step())) {
            Ok(events) => events,
            Err(_) => {
                for (_, s) in senders.drain() {
                    metrics.failed.fetch_add(1, Ordering::Relaxed);
                    let _ = s.send(Event::Failed("the engine failed during this request".into()));
                }
                engine = new_engine(model, tokenizer, eos, options);
                continue;
            }
        };
        for (id, event) in events {
            if let Some(n) = engine.reused_tokens(id) {
                metrics.cached_tokens.fetch_add(n as u64, Ordering::Relaxed);
                if let Some(s) = senders.get(&id) {
                    let _ = s.send(Event::Cached(n));
                }
            }
            let last = event.as_ref().map_or(true, |g| g.finish.is_some());
            match &event {
                Ok(_) => metrics.generated_tokens.fetch_add(1, Ordering::Relaxed),
                Err(_) => metrics.failed.fetch_add(1, Ordering::Relaxed),
            };
            let event = match event {
                Ok(g) => Event::Token(g),
                Err(e) => Event::Failed(e.to_string()),
            };
            let delivered = senders.get(&id).is_some_and(|s| s.send(event).is_ok());
            if !delivered {
                engine.cancel(id);
                cancel_before.push(id);
            }
            if last || !delivered {
                senders.remove(&id);
            }
        }
        let (running, waiting) = engine.load();
        metrics.running.store(running as u64, Ordering::Relaxed);
        metrics.waiting.store(waiting as u64, Ordering::Relaxed);
        metrics.cache_bytes.store(engine.cache_bytes() as u64, Ordering::Relaxed);
        if let Some(b) = engine.kv_blocks() {
            metrics.blocks_total.store(b.capacity as u64, Ordering::Relaxed);
            metrics.blocks_held.store(b.held as u64, Ordering::Relaxed);
            metrics.blocks_cached.store(b.cached as u64, Ordering::Relaxed);
            metrics.preemptions.store(b.preemptions as u64, Ordering::Relaxed);
        }
    }
}

/// A rank other than 0 of a model split over `group`: takes each engine step rank 0 takes
/// (its [`send_plan`]), making each request from the body its client sent (`prepare`), and
/// returns when rank 0 stops, or with the error of a rank 0 gone.
pub(crate) fn follow(
    model: &dyn LanguageModel,
    tokenizer: &Tokenizer,
    eos: &[u32],
    options: &crate::ServeOptions,
    group: &Group,
    prepare: impl Fn(&Value, Endpoint) -> Result<(crate::Parsed, crate::Constraints), crate::ApiError>,
) -> nuvec::Result<()> {
    let mut engine = new_engine(model, tokenizer, eos, options);
    loop {
        let plan = recv_plan(group)?;
        if plan["stop"] == true {
            return Ok(());
        }
        for id in ids(&plan["cancel_before"]) {
            engine.cancel(id);
        }
        for add in plan["add"].as_array().into_iter().flatten() {
            let endpoint = if add["endpoint"] == "chat" { Endpoint::Chat } else { Endpoint::Completion };
            let choice = add["choice"].as_u64().unwrap_or(0) as usize;
            let id = add["id"].as_u64().unwrap_or(u64::MAX);
            // Rank 0 made this request from the same body; an error here is an error there.
            if let Ok((parsed, constraints)) = prepare(&add["body"], endpoint) {
                let mut options = parsed.options.clone();
                options.sampler.seed = add["seed"].as_u64();
                let constraint = constraints.into_iter().nth(choice).flatten();
                let _ = engine.add(id, Request { prompt: parsed.prompt, options, constraint });
            }
        }
        for id in ids(&plan["cancel"]) {
            engine.cancel(id);
        }
        if plan["step"] == true && std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| engine.step())).is_err() {
            // As rank 0 does on the same failure.
            engine = new_engine(model, tokenizer, eos, options);
        }
    }
}
