//! `nuvec serve`: an OpenAI-compatible HTTP server for a nuvec-lm model, as `mlx_lm.server`,
//! vLLM and llama.cpp's server are.
//!
//! - `POST /v1/chat/completions` and `POST /v1/completions`, streamed as server-sent events
//!   (ending in `data: [DONE]`, with `stream_options.include_usage`) or whole; `max_tokens`
//!   / `max_completion_tokens`, `stop`, `temperature`, `top_p`, `top_k`, `min_p`, the
//!   penalties, `logit_bias`, `seed`, `n`, `logprobs` / `top_logprobs` in OpenAI's shapes. A
//!   parameter the server does not support is a 400 naming it.
//! - `GET /v1/models`, `GET /health`, `GET /metrics` (Prometheus text), and a chat page at
//!   `GET /` (one HTML file in the binary: streamed replies, sampling settings, a stop
//!   button, tokens/s).
//! - Requests run as one continuous batch on a thread of the model's own
//!   ([`nuvec_lm::engine::Engine`]): each joins the running batch once its prompt is
//!   prefilled and leaves when it ends or its client goes away. The caches of the last
//!   requests are kept, so a conversation's next turn runs only its new tokens.
//! - `--api-key` is checked in constant time; a full queue is a 429, a body over the limit a
//!   413; shutdown (Ctrl-C) lets running requests finish.
//!
//! ```no_run
//! let loaded = nuvec_lm::load(std::path::Path::new("model.gguf"), &Default::default())?;
//! let server = nuvec_serve::Server::start(loaded, nuvec_serve::ServeOptions::default())?;
//! println!("serving on http://{}", server.addr());
//! server.wait()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod grammar;
mod openai;
pub mod tools;
mod worker;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Body;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::StreamExt;
use nuvec_lm::engine::{Constraint, Request};
use nuvec_lm::generate::Generated;
use nuvec_lm::{LanguageModel, Loaded, Tokenizer};
use serde_json::{Value, json};
use tokio::sync::mpsc;

pub use openai::{ApiError, Endpoint, Limits, Parsed, parse};
use worker::{Event, Job, Worker};

/// How to serve.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// The address to listen on.
    pub host: String,
    /// The port (0: any free one).
    pub port: u16,
    /// The model's id in requests and `/v1/models` (by default its file or folder name).
    pub model_id: Option<String>,
    /// Requests decoding together at most.
    pub max_batch: usize,
    /// Requests waiting at most; more are answered 429.
    pub max_queue: usize,
    /// Choices one request may ask for at most (`n`).
    pub max_n: usize,
    /// Tokens generated when a request does not say.
    pub default_max_tokens: usize,
    /// The sampling temperature when a request does not say.
    pub default_temperature: f32,
    /// Request bodies larger than this many bytes are answered 413.
    pub max_body: usize,
    /// Requests must carry `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// Prompt caching (0: off): a prompt that starts as an earlier one (a conversation's next
    /// turn) runs only the rest, reading the paged cache's full blocks, or with
    /// `kv_block_size` 0 the kept caches of this many ended requests.
    pub prompt_cache: usize,
    /// Prompt tokens prefilled per engine step at most: a long prompt joining delays the
    /// running requests' tokens by one such chunk at a time.
    pub prefill_chunk: usize,
    /// Prompts prefilled together in one forward pass at most, within `prefill_chunk` tokens
    /// (1: one at a time).
    pub prefill_rows: usize,
    /// Positions per block of the paged KV cache every request's keys and values share (0:
    /// each request's caches of its own, no preemption; so too for a model with recurrent
    /// layers, whose state per request the pool does not hold).
    pub kv_block_size: usize,
    /// Positions the paged KV cache holds at most (its pool grows to this as needed); when it
    /// is full the newest requests are preempted and resume later.
    pub kv_cache_tokens: usize,
    /// The ranks the model is split over (tensor parallelism, `LanguageModel::shard`): rank 0
    /// serves ([`Server::start`]) and tells the others each engine step ([`follow`]).
    pub group: Option<nuvec::distributed::Group>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            host: "127.0.0.1".into(),
            port: 8080,
            model_id: None,
            max_batch: 16,
            max_queue: 256,
            max_n: 16,
            default_max_tokens: 512,
            default_temperature: 0.0,
            max_body: 4 << 20,
            api_key: None,
            prompt_cache: 8,
            prefill_chunk: 512,
            prefill_rows: 64,
            kv_block_size: 16,
            kv_cache_tokens: 1 << 16,
            group: None,
        }
    }
}

struct App {
    worker: Worker,
    preparer: Preparer,
    api_key: Option<String>,
    max_queue: usize,
    max_body: usize,
    created: u64,
    ids: AtomicU64,
}

/// A running server (see the crate docs).
pub struct Server {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<std::io::Result<()>>>,
}

impl Server {
    /// Loads nothing: serves `loaded` on `options.host:options.port` from threads of its own
    /// (the HTTP runtime, and the engine thread that owns the model), and returns once it
    /// listens.
    pub fn start(loaded: Loaded, options: ServeOptions) -> std::io::Result<Server> {
        let listener = std::net::TcpListener::bind((options.host.as_str(), options.port))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let app = app(loaded, &options)?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new().name("nuvec-serve".into()).spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener)?;
                let shutdown = async move {
                    tokio::select! {
                        _ = stopped => {}
                        _ = tokio::signal::ctrl_c() => {}
                    }
                };
                axum::serve(listener, app).with_graceful_shutdown(shutdown).await
            })
        })?;
        Ok(Server { addr, stop: Some(stop), thread: Some(thread) })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Blocks until the server stops (Ctrl-C, or [`Server::stop`] elsewhere).
    pub fn wait(mut self) -> std::io::Result<()> {
        match self.thread.take().map(std::thread::JoinHandle::join) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(std::io::Error::other("the server thread panicked")),
            None => Ok(()),
        }
    }

    /// Stops taking connections, lets running requests finish, and waits for that.
    pub fn stop(mut self) -> std::io::Result<()> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        self.wait()
    }
}

/// What requests are checked and prepared with: the same on every rank of a split model.
struct Preparer {
    tokenizer: Arc<Tokenizer>,
    grammars: grammar::Grammars,
    limits: Limits,
}

impl Preparer {
    /// A request's checked form and each choice's constraint (its own copy of the grammar).
    fn prepare(&self, body: &Value, endpoint: Endpoint) -> Result<(Parsed, Constraints), ApiError> {
        let parsed = parse(body, endpoint, &self.tokenizer, &self.limits)?;
        let constraints = (0..parsed.n)
            .map(|_| match (&parsed.response_format, &parsed.forced_call, parsed.tools) {
                (Some(f), ..) => self.grammars.response_format(f),
                (None, Some((tools, name)), Some(format)) => {
                    self.grammars.tool_call(format, tools, name.as_deref()).map(Some)
                }
                _ => Ok(None),
            })
            .collect::<Result<Vec<_>, ApiError>>()?;
        Ok((parsed, constraints))
    }
}

/// `loaded`'s model, end tokens and request preparer, once checked servable.
fn parts(loaded: Loaded, options: &ServeOptions) -> std::io::Result<(Box<dyn LanguageModel>, Vec<u32>, Preparer)> {
    let Loaded { model, tokenizer, eos, path } = loaded;
    if !model.device_positions() {
        return Err(std::io::Error::other(
            "this model's RoPE scaling needs host positions (dynamic): it cannot be served as a batch",
        ));
    }
    let id = options
        .model_id
        .clone()
        .unwrap_or_else(|| path.file_name().map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned()));
    let limits = Limits {
        model_names: vec![id, path.display().to_string()],
        default_max_tokens: options.default_max_tokens,
        max_prompt: model.config().max_position_embeddings.map(|c| c as usize),
        max_n: options.max_n,
        default_temperature: options.default_temperature,
    };
    let tokenizer = Arc::new(tokenizer);
    // The grammar's end is the model's first end-of-sequence token.
    let grammars = grammar::Grammars::new(tokenizer.clone(), eos.first().copied().unwrap_or(0));
    Ok((model, eos, Preparer { tokenizer, grammars, limits }))
}

/// Runs rank `r > 0` of a model split over `options.group`, whose rank 0 serves
/// ([`Server::start`] with the same group): each engine step rank 0 takes, with the requests
/// made from the bodies its clients sent. Returns when rank 0 stops, or with an error when it
/// is gone (within the group's time-out).
pub fn follow(loaded: Loaded, options: ServeOptions) -> std::io::Result<()> {
    let group = options.group.clone().filter(|g| g.size() > 1 && g.rank() > 0).ok_or_else(|| {
        std::io::Error::other("follow: a rank other than 0 of a group of several ranks is needed (ServeOptions::group)")
    })?;
    let (model, eos, preparer) = parts(loaded, &options)?;
    let tokenizer = preparer.tokenizer.clone();
    // Ctrl-C reaches every rank of a terminal's launch: rank 0 stops the group, after its
    // running requests, so the others let it.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    std::thread::Builder::new().name("nuvec-ctrl-c".into()).spawn(move || {
        runtime.block_on(async { while tokio::signal::ctrl_c().await.is_ok() {} });
    })?;
    worker::follow(model.as_ref(), &tokenizer, &eos, &options, &group, |body, endpoint| {
        preparer.prepare(body, endpoint)
    })
    .map_err(|e| std::io::Error::other(e.to_string()))
}

/// The router over `loaded`.
fn app(loaded: Loaded, options: &ServeOptions) -> std::io::Result<Router> {
    let (model, eos, preparer) = parts(loaded, options)?;
    let worker = Worker::spawn(model, preparer.tokenizer.clone(), eos, options)?;
    let created = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let state = Arc::new(App {
        worker,
        preparer,
        api_key: options.api_key.clone(),
        max_queue: options.max_queue,
        max_body: options.max_body,
        created,
        ids: AtomicU64::new(0),
    });
    Ok(Router::new()
        .route("/", get(|| async { axum::response::Html(include_str!("chat.html")) }))
        .route("/health", get(|| async { axum::Json(json!({"status": "ok"})) }))
        .route("/v1/models", get(models))
        .route("/metrics", get(metrics))
        .route(
            "/v1/chat/completions",
            post(|s: State<Arc<App>>, h: HeaderMap, b: Body| complete(s, h, b, Endpoint::Chat)),
        )
        .route(
            "/v1/completions",
            post(|s: State<Arc<App>>, h: HeaderMap, b: Body| complete(s, h, b, Endpoint::Completion)),
        )
        .fallback(|| async { error(&ApiError::new(404, "invalid_request_error", "no such route")) })
        // Bodies are read (and limited) by the handlers, to answer OpenAI's error body.
        .layer(DefaultBodyLimit::disable())
        .with_state(state))
}

fn error(e: &ApiError) -> Response {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, axum::Json(e.body())).into_response()
}

fn server_error(message: impl Into<String>) -> ApiError {
    ApiError::new(500, "server_error", message)
}

async fn models(State(app): State<Arc<App>>) -> Response {
    let id = &app.preparer.limits.model_names[0];
    axum::Json(
        json!({"object": "list", "data": [{"id": id, "object": "model", "created": app.created, "owned_by": "nuvec"}]}),
    )
    .into_response()
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    let m = &app.worker.metrics;
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let mut text = String::new();
    for (name, kind, help, value) in [
        ("nuvec_requests_total", "counter", "Requests accepted.", get(&m.requests)),
        ("nuvec_requests_failed_total", "counter", "Requests that ended in an error.", get(&m.failed)),
        ("nuvec_prompt_tokens_total", "counter", "Prompt tokens of accepted requests.", get(&m.prompt_tokens)),
        (
            "nuvec_prompt_tokens_cached_total",
            "counter",
            "Prompt tokens found in earlier requests' caches.",
            get(&m.cached_tokens),
        ),
        ("nuvec_generation_tokens_total", "counter", "Tokens generated.", get(&m.generated_tokens)),
        ("nuvec_requests_running", "gauge", "Requests in the decoding batch.", get(&m.running)),
        ("nuvec_requests_waiting", "gauge", "Requests waiting to join the batch.", get(&m.waiting)),
        ("nuvec_kv_cache_bytes", "gauge", "Bytes of the engine's key-value caches.", get(&m.cache_bytes)),
        ("nuvec_kv_blocks_total", "gauge", "Blocks of the paged KV cache.", get(&m.blocks_total)),
        ("nuvec_kv_blocks_held", "gauge", "Blocks of the paged KV cache requests hold.", get(&m.blocks_held)),
        (
            "nuvec_kv_blocks_cached",
            "gauge",
            "Blocks of the paged KV cache no request holds, kept for prompts that start alike.",
            get(&m.blocks_cached),
        ),
        ("nuvec_preemptions_total", "counter", "Requests preempted when the KV cache was full.", get(&m.preemptions)),
    ] {
        text.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"));
    }
    text.push_str(
        &m.first_token.text("nuvec_time_to_first_token_seconds", "Seconds from a request to its first token."),
    );
    text.push_str(&m.inter_token.text("nuvec_inter_token_latency_seconds", "Seconds between a request's tokens."));
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// Whether `headers` carry the API key, compared in constant time.
fn authorized(app: &App, headers: &HeaderMap) -> bool {
    let Some(key) = &app.api_key else { return true };
    let given =
        headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    let Some(given) = given else { return false };
    let (a, b) = (given.as_bytes(), key.as_bytes());
    let diff = a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y));
    diff == 0 && a.len() == b.len()
}

async fn complete(State(app): State<Arc<App>>, headers: HeaderMap, body: Body, endpoint: Endpoint) -> Response {
    let arrived = Instant::now();
    if !authorized(&app, &headers) {
        let message = "a valid API key is needed (Authorization: Bearer <key>)";
        return error(&ApiError {
            code: Some("invalid_api_key"),
            ..ApiError::new(401, "invalid_request_error", message)
        });
    }
    let body: Bytes = match axum::body::to_bytes(body, app.max_body).await {
        Ok(b) => b,
        Err(_) => {
            let message = format!("the request body is larger than {} bytes", app.max_body);
            return error(&ApiError::new(413, "invalid_request_error", message));
        }
    };
    let body: Arc<Value> = match serde_json::from_slice(&body) {
        Ok(v) => Arc::new(v),
        Err(e) => return error(&ApiError::invalid("body", format!("the body is not valid JSON: {e}"))),
    };
    // Templates, tokenizing and grammars are CPU work: off the runtime's threads.
    let (work, source) = (app.clone(), body.clone());
    let prepared = tokio::task::spawn_blocking(move || work.preparer.prepare(&source, endpoint)).await;
    let (parsed, constraints) = match prepared {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => return error(&e),
        Err(_) => return error(&server_error("the request could not be prepared")),
    };
    let metrics = &app.worker.metrics;
    if metrics.waiting.load(Ordering::Relaxed) as usize + parsed.n > app.max_queue {
        let message = format!("the server's queue is full ({} requests): try again later", app.max_queue);
        return error(&ApiError::new(429, "rate_limit_error", message));
    }
    let mut receivers = Vec::with_capacity(parsed.n);
    for (i, constraint) in constraints.into_iter().enumerate() {
        let mut options = parsed.options.clone();
        options.sampler.seed = options.sampler.seed.map(|s| s.wrapping_add(i as u64));
        let (tx, rx) = mpsc::unbounded_channel();
        let request = Request { prompt: parsed.prompt.clone(), options, constraint };
        if !app.worker.submit(Job { request, events: tx, source: (body.clone(), endpoint, i) }) {
            return error(&server_error("the engine has stopped"));
        }
        receivers.push(rx);
    }
    metrics.requests.fetch_add(1, Ordering::Relaxed);
    metrics.prompt_tokens.fetch_add(parsed.prompt.len() as u64, Ordering::Relaxed);
    let id = format!(
        "{}-{:x}{:04x}",
        if endpoint == Endpoint::Chat { "chatcmpl" } else { "cmpl" },
        app.created,
        app.ids.fetch_add(1, Ordering::Relaxed)
    );
    let reply = Reply {
        app: app.clone(),
        id,
        endpoint,
        prompt_tokens: parsed.prompt.len(),
        logprobs: parsed.logprobs,
        tools: parsed.tools,
        arrived,
    };
    if parsed.stream { reply.stream(receivers, parsed.include_usage) } else { reply.whole(receivers).await }
}

/// Each choice's constraint, if any.
pub(crate) type Constraints = Vec<Option<Box<dyn Constraint>>>;

/// What the answer to one request needs.
struct Reply {
    app: Arc<App>,
    id: String,
    endpoint: Endpoint,
    prompt_tokens: usize,
    logprobs: Option<usize>,
    tools: Option<tools::Format>,
    arrived: Instant,
}

impl Reply {
    fn created(&self) -> u64 {
        SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
    }

    fn model(&self) -> &str {
        &self.app.preparer.limits.model_names[0]
    }

    fn first_token(&self) {
        self.app.worker.metrics.first_token.observe(self.arrived.elapsed());
    }

    /// Times a token of a choice whose previous token came at `last` (now, after).
    fn token(&self, last: &mut Option<Instant>) {
        let now = Instant::now();
        if let Some(t) = last.replace(now) {
            self.app.worker.metrics.inter_token.observe(now - t);
        }
    }

    /// A fresh tool call id.
    fn call_id(&self) -> String {
        format!("call_{:x}{:06x}", self.app.created, self.app.ids.fetch_add(1, Ordering::Relaxed))
    }

    /// OpenAI's usage: prompt tokens (`cached` of them from earlier requests' caches, for the
    /// first choice), completion tokens, their total.
    fn usage(&self, completion: usize, cached: usize) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        })
    }

    /// Waits for every choice and answers with the whole completion.
    async fn whole(self, receivers: Vec<mpsc::UnboundedReceiver<Event>>) -> Response {
        let mut choices = Vec::with_capacity(receivers.len());
        let (mut completion, mut cached) = (0, None);
        for (index, mut rx) in receivers.into_iter().enumerate() {
            let mut tokens: Vec<Generated> = Vec::new();
            let mut last = None;
            let finish = loop {
                match rx.recv().await {
                    Some(Event::Cached(n)) => {
                        cached.get_or_insert(n);
                    }
                    Some(Event::Token(g)) => {
                        if tokens.is_empty() && index == 0 {
                            self.first_token();
                        }
                        self.token(&mut last);
                        let finish = g.finish;
                        tokens.push(g);
                        if let Some(f) = finish {
                            break f;
                        }
                    }
                    Some(Event::Failed(e)) => return error(&server_error(e)),
                    None => return error(&server_error("the engine stopped during the request")),
                }
            };
            completion += tokens.len();
            let text: String = tokens.iter().map(|g| g.text.as_str()).collect();
            let t = &self.app.preparer.tokenizer;
            choices.push(match self.endpoint {
                Endpoint::Chat => {
                    let (content, calls) = match self.tools {
                        Some(format) => tools::parse(format, &text),
                        None => (text, Vec::new()),
                    };
                    let mut message = json!({"role": "assistant", "content": content, "refusal": null, "annotations": []});
                    let mut reason = openai::finish_name(finish);
                    if !calls.is_empty() {
                        if content.is_empty() {
                            message["content"] = Value::Null;
                        }
                        message["tool_calls"] = calls.iter().map(|c| c.to_json(&self.call_id())).collect();
                        reason = "tool_calls";
                    }
                    json!({
                        "index": index,
                        "message": message,
                        "logprobs": self.logprobs.map(|_| json!({"content": tokens.iter().map(|g| openai::chat_logprob(t, g)).collect::<Vec<_>>()})),
                        "finish_reason": reason,
                    })
                }
                Endpoint::Completion => json!({
                    "index": index,
                    "text": text,
                    "logprobs": self.logprobs.map(|_| openai::completion_logprobs(t, &tokens, 0)),
                    "finish_reason": openai::finish_name(finish),
                }),
            });
        }
        let object = if self.endpoint == Endpoint::Chat { "chat.completion" } else { "text_completion" };
        axum::Json(json!({
            "id": self.id,
            "object": object,
            "created": self.created(),
            "model": self.model(),
            "choices": choices,
            "usage": self.usage(completion, cached.unwrap_or(0)),
        }))
        .into_response()
    }

    /// Answers with server-sent events: a chunk per token of each choice, the usage when
    /// asked, then `[DONE]`.
    fn stream(self, receivers: Vec<mpsc::UnboundedReceiver<Event>>, include_usage: bool) -> Response {
        let (out, events) = mpsc::unbounded_channel::<String>();
        let n = receivers.len();
        let merged = futures_util::stream::select_all(receivers.into_iter().enumerate().map(|(i, rx)| {
            futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|e| (e, rx)) })
                .map(move |e| (i, e))
                .boxed()
        }));
        tokio::spawn(async move {
            let mut merged = merged;
            let (mut started, mut finished, mut completion) = (vec![false; n], 0, 0);
            // With tools, each choice's text so far and how much of it was shown.
            let (mut texts, mut sent) = (vec![String::new(); n], vec![0usize; n]);
            let mut last = vec![None; n];
            // Characters of each choice's text streamed so far (completion logprobs' offsets).
            let mut shown = vec![0usize; n];
            let created = self.created();
            let object = if self.endpoint == Endpoint::Chat { "chat.completion.chunk" } else { "text_completion" };
            let chunk = |choices: Value, usage: Option<Value>| {
                let mut c = json!({"id": self.id, "object": object, "created": created, "model": self.model(), "choices": choices});
                if let Some(u) = usage {
                    c["usage"] = u;
                }
                c.to_string()
            };
            let mut cached = None;
            let fail = |message: &str| {
                let _ = out.send(json!({"error": {"message": message, "type": "server_error"}}).to_string());
                let _ = out.send("[DONE]".into());
            };
            loop {
                // A client that goes away cancels its requests (the receivers drop with this
                // task), also before their first token.
                let next = tokio::select! {
                    next = merged.next() => next,
                    _ = out.closed() => return,
                };
                let Some((i, event)) = next else {
                    // The engine stopped before every choice ended.
                    fail("the engine stopped during the request");
                    return;
                };
                let g = match event {
                    Event::Cached(n) => {
                        cached.get_or_insert(n);
                        continue;
                    }
                    Event::Token(g) => g,
                    Event::Failed(e) => {
                        fail(&e);
                        return;
                    }
                };
                completion += 1;
                self.token(&mut last[i]);
                let t = &self.app.preparer.tokenizer;
                let finish = g.finish.map(openai::finish_name);
                let choice = match self.endpoint {
                    Endpoint::Chat => {
                        let mut delta = json!({"content": g.text});
                        let mut finish = finish;
                        if let Some(format) = self.tools {
                            // Text that may be a tool call waits; the calls go out whole at the end.
                            texts[i].push_str(&g.text);
                            let upto = match g.finish {
                                Some(_) => texts[i].len(),
                                None => tools::shown(format, &texts[i]).max(sent[i]),
                            };
                            delta["content"] = texts[i][sent[i]..upto].into();
                            if g.finish.is_some() {
                                let (_, calls) = tools::parse(format, &texts[i]);
                                if !calls.is_empty() {
                                    delta["content"] = "".into();
                                    let calls: Vec<Value> = calls
                                        .iter()
                                        .enumerate()
                                        .map(|(j, c)| {
                                            let mut v = c.to_json(&self.call_id());
                                            v["index"] = j.into();
                                            v
                                        })
                                        .collect();
                                    delta["tool_calls"] = calls.into();
                                    finish = Some("tool_calls");
                                }
                            }
                            sent[i] = upto;
                        }
                        if !started[i] {
                            delta["role"] = "assistant".into();
                        }
                        let lp = self.logprobs.map(|_| json!({"content": [openai::chat_logprob(t, &g)]}));
                        json!({"index": i, "delta": delta, "logprobs": lp, "finish_reason": finish})
                    }
                    Endpoint::Completion => {
                        let lp =
                            self.logprobs.map(|_| openai::completion_logprobs(t, std::slice::from_ref(&g), shown[i]));
                        shown[i] += g.text.chars().count();
                        json!({"index": i, "text": g.text, "logprobs": lp, "finish_reason": finish})
                    }
                };
                if !started.iter().any(|&s| s) {
                    self.first_token();
                }
                started[i] = true;
                if out.send(chunk(json!([choice]), None)).is_err() {
                    // The client went away: dropping the receivers cancels its requests.
                    return;
                }
                if g.finish.is_some() {
                    finished += 1;
                    if finished == n {
                        break;
                    }
                }
            }
            if include_usage {
                let _ = out.send(chunk(json!([]), Some(self.usage(completion, cached.unwrap_or(0)))));
            }
            let _ = out.send("[DONE]".into());
        });
        let stream = futures_util::stream::unfold(events, |mut events| async move {
            events.recv().await.map(|data| (Ok::<_, Infallible>(SseEvent::default().data(data)), events))
        });
        Sse::new(stream).into_response()
    }
}
