//! OpenAI's request and response shapes: a request body checked key by key (a key this server
//! does not support is an error naming it, never ignored) into what the engine runs, and the
//! JSON of completions, chunks, log-probabilities and errors.

use serde_json::{Map, Value, json};

use nuvec_lm::generate::{FinishReason, GenerateOptions, Generated};
use nuvec_lm::{SamplerOptions, Tokenizer};

/// An error answered to the client: HTTP status, OpenAI's `type`, the message and the
/// parameter it is about.
#[derive(Debug)]
pub struct ApiError {
    /// The HTTP status.
    pub status: u16,
    /// OpenAI's error type (`invalid_request_error`, ...).
    pub kind: &'static str,
    /// What went wrong.
    pub message: String,
    /// The request parameter at fault.
    pub param: Option<String>,
    /// OpenAI's error code (`model_not_found`, ...).
    pub code: Option<&'static str>,
}

impl ApiError {
    /// An error of HTTP `status` and OpenAI's type `kind`, about no parameter.
    pub fn new(status: u16, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, kind, message: message.into(), param: None, code: None }
    }

    /// A 400 about `param`.
    pub fn invalid(param: &str, message: impl Into<String>) -> ApiError {
        ApiError { param: Some(param.to_string()), ..ApiError::new(400, "invalid_request_error", message) }
    }

    /// OpenAI's error body.
    pub fn body(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

/// Which endpoint a body is for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Endpoint {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completion,
}

/// A checked request: the prompt's ids and how to generate each of its `n` choices.
#[derive(Debug)]
pub struct Parsed {
    /// The prompt's token ids.
    pub prompt: Vec<u32>,
    /// How to generate (each choice's seed is the request's plus its index).
    pub options: GenerateOptions,
    /// Choices to generate.
    pub n: usize,
    /// Stream chunks as server-sent events.
    pub stream: bool,
    /// Stream a last chunk with the usage.
    pub include_usage: bool,
    /// Report log-probabilities (with this many alternatives).
    pub logprobs: Option<usize>,
    /// Tool calls are read from the reply, in this format.
    pub tools: Option<crate::tools::Format>,
    /// The reply follows this `response_format` (checked when its grammar is made).
    pub response_format: Option<Value>,
    /// The reply must be a call of one of these tools (of the named one, if any).
    pub forced_call: Option<(Value, Option<String>)>,
}

/// Server-wide limits and defaults a request is checked against.
pub struct Limits {
    /// The served model's names (its id; the path it was loaded from).
    pub model_names: Vec<String>,
    /// Tokens generated when the request does not say (mlx-lm's server: 512).
    pub default_max_tokens: usize,
    /// The longest prompt, in tokens (the model's context).
    pub max_prompt: Option<usize>,
    /// The most choices one request may ask for.
    pub max_n: usize,
    /// The sampling temperature when the request does not say (mlx-lm's server: 0).
    pub default_temperature: f32,
}

const COMMON: [&str; 18] = [
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "repetition_context_size",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "seed",
    "stop",
    "n",
    "stream",
    "stream_options",
    "logprobs",
    "user",
];
const CHAT_ONLY: [&str; 7] =
    ["messages", "max_completion_tokens", "top_logprobs", "metadata", "tools", "tool_choice", "response_format"];
const COMPLETION_ONLY: [&str; 4] = ["prompt", "echo", "best_of", "suffix"];

/// Checks `body` (a JSON object) for `endpoint` and makes its prompt with `tokenizer`.
pub fn parse(body: &Value, endpoint: Endpoint, tokenizer: &Tokenizer, limits: &Limits) -> Result<Parsed, ApiError> {
    let Value::Object(o) = body else {
        return Err(ApiError::invalid("body", "the request body must be a JSON object"));
    };
    let own: &[&str] = match endpoint {
        Endpoint::Chat => &CHAT_ONLY,
        Endpoint::Completion => &COMPLETION_ONLY,
    };
    if let Some(k) = o.keys().find(|k| !COMMON.contains(&k.as_str()) && !own.contains(&k.as_str())) {
        let why = match k.as_str() {
            "functions" | "function_call" => "use 'tools' and 'tool_choice'",
            "parallel_tool_calls" => "calls are parallel whenever the model writes several",
            _ => "this server does not support it",
        };
        return Err(ApiError::invalid(k, format!("unsupported parameter '{k}': {why}")));
    }
    if let Some(m) = o.get("model") {
        let name = m.as_str().ok_or_else(|| ApiError::invalid("model", "'model' must be a string"))?;
        if !limits.model_names.iter().any(|n| n == name) {
            let message = format!("the model '{name}' does not exist (this server serves '{}')", limits.model_names[0]);
            return Err(ApiError { status: 404, code: Some("model_not_found"), ..ApiError::invalid("model", message) });
        }
    }
    let tools = match endpoint {
        Endpoint::Chat => tools(o, tokenizer)?,
        Endpoint::Completion => None,
    };
    let prompt = match endpoint {
        Endpoint::Chat => chat_prompt(o, tokenizer, tools.as_ref().map(|t| &t.specs))?,
        Endpoint::Completion => completion_prompt(o, tokenizer)?,
    };
    if let Some(max) = limits.max_prompt
        && prompt.len() > max
    {
        return Err(ApiError::invalid(
            if endpoint == Endpoint::Chat { "messages" } else { "prompt" },
            format!("the prompt has {} tokens, more than the model's context of {max}", prompt.len()),
        ));
    }
    if prompt.is_empty() {
        return Err(ApiError::invalid("prompt", "the prompt has no tokens"));
    }
    for (key, only) in [("echo", Value::Bool(false)), ("best_of", Value::from(1)), ("suffix", Value::Null)] {
        if let Some(v) = o.get(key)
            && *v != only
        {
            return Err(ApiError::invalid(key, format!("'{key}' is not supported (only {only})")));
        }
    }

    let key = if o.contains_key("max_completion_tokens") { "max_completion_tokens" } else { "max_tokens" };
    let asked = count(o.get(key).unwrap_or(&Value::Null), key, 1)?;
    // Prompt and reply fit the model's context: a limit asked for past it is an error, the
    // default is cut to it.
    let room = limits.max_prompt.map(|c| c - prompt.len());
    if let (Some(a), Some(r)) = (asked, room)
        && a > r
    {
        return Err(ApiError::invalid(
            key,
            format!(
                "the prompt's {} tokens and {a} more exceed the model's context of {}",
                prompt.len(),
                prompt.len() + r
            ),
        ));
    }
    let max_tokens = asked.unwrap_or(limits.default_max_tokens).min(room.unwrap_or(usize::MAX)).max(1);
    let n = count_or(o, "n", 1, 1)?;
    if n > limits.max_n {
        return Err(ApiError::invalid("n", format!("'n' must be at most {}", limits.max_n)));
    }
    let stream = flag(o, "stream")?;
    let include_usage = match o.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(so)) => {
            if !stream {
                return Err(ApiError::invalid("stream_options", "'stream_options' needs 'stream': true"));
            }
            if let Some(k) = so.keys().find(|k| *k != "include_usage") {
                return Err(ApiError::invalid("stream_options", format!("unsupported stream option '{k}'")));
            }
            flag(so, "include_usage")?
        }
        Some(_) => return Err(ApiError::invalid("stream_options", "'stream_options' must be an object")),
    };
    let logprobs = match endpoint {
        Endpoint::Chat => match flag(o, "logprobs")? {
            true => Some(count_or(o, "top_logprobs", 0, 0)?),
            false if o.get("top_logprobs").is_some_and(|v| !v.is_null()) => {
                return Err(ApiError::invalid("top_logprobs", "'top_logprobs' needs 'logprobs': true"));
            }
            false => None,
        },
        Endpoint::Completion => count(o.get("logprobs").unwrap_or(&Value::Null), "logprobs", 0)?,
    };
    if logprobs.is_some_and(|k| k > 20) {
        return Err(ApiError::invalid(
            if endpoint == Endpoint::Chat { "top_logprobs" } else { "logprobs" },
            "at most 20 alternatives",
        ));
    }

    let float = |key: &str, default: f32, lo: f32, hi: f32| -> Result<f32, ApiError> {
        match o.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => match v.as_f64() {
                Some(x) if (lo as f64..=hi as f64).contains(&x) => Ok(x as f32),
                Some(x) => Err(ApiError::invalid(key, format!("'{key}' must be in [{lo}, {hi}], got {x}"))),
                None => Err(ApiError::invalid(key, format!("'{key}' must be a number"))),
            },
        }
    };
    let sampler = SamplerOptions {
        temperature: float("temperature", limits.default_temperature, 0.0, 2.0)?,
        top_p: float("top_p", 1.0, 0.0, 1.0)?,
        top_k: i32::try_from(count_or(o, "top_k", 0, 0)?).unwrap_or(i32::MAX),
        min_p: float("min_p", 0.0, 0.0, 1.0)?,
        repetition_penalty: float("repetition_penalty", 1.0, 0.0, 10.0)?,
        penalty_context: count_or(o, "repetition_context_size", 20, 1)?,
        presence_penalty: float("presence_penalty", 0.0, -2.0, 2.0)?,
        frequency_penalty: float("frequency_penalty", 0.0, -2.0, 2.0)?,
        logit_bias: logit_bias(o, tokenizer)?,
        seed: match o.get("seed") {
            None | Some(Value::Null) => None,
            Some(v) => Some(
                v.as_u64()
                    .or_else(|| v.as_i64().map(|s| s as u64))
                    .ok_or_else(|| ApiError::invalid("seed", "'seed' must be an integer"))?,
            ),
        },
        top_logprobs: logprobs.unwrap_or(0),
    };
    sampler.validate().map_err(|e| ApiError::invalid("sampling", e.to_string()))?;
    let stop = match o.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) if a.len() <= 4 => a
            .iter()
            .map(|s| s.as_str().map(str::to_string))
            .collect::<Option<Vec<String>>>()
            .ok_or_else(|| ApiError::invalid("stop", "'stop' must be a string or a list of strings"))?,
        Some(_) => return Err(ApiError::invalid("stop", "'stop' must be a string or a list of up to 4 strings")),
    };
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid("stop", "a stop string is empty"));
    }
    let options = GenerateOptions { max_tokens, sampler, stop, ..Default::default() };
    let response_format = match o.get("response_format") {
        None | Some(Value::Null) => None,
        Some(f @ Value::Object(_)) => Some(f.clone()),
        Some(_) => return Err(ApiError::invalid("response_format", "'response_format' must be an object")),
    };
    if response_format.is_some() && tools.is_some() {
        return Err(ApiError::invalid("response_format", "'response_format' with 'tools' is not supported"));
    }
    let forced_call = tools.as_ref().and_then(|t| match &t.choice {
        Choice::Any => Some((t.specs.clone(), None)),
        Choice::Named(name) => Some((t.specs.clone(), Some(name.clone()))),
        Choice::Auto | Choice::None => None,
    });
    let tools = tools.filter(|t| t.choice != Choice::None).map(|t| t.format);
    Ok(Parsed { prompt, options, n, stream, include_usage, logprobs, tools, response_format, forced_call })
}

/// A chat request's `tools` (function specs) and `tool_choice`: the specs for the template
/// and the format the model writes calls in, or `None` when no tool may be called.
fn tools(o: &Map<String, Value>, tokenizer: &Tokenizer) -> Result<Option<Tools>, ApiError> {
    let specs = match o.get("tools") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(a)) if a.is_empty() => return Ok(None),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(ApiError::invalid("tools", "'tools' must be a list")),
    };
    for (i, t) in specs.iter().enumerate() {
        let ok = t.get("type").and_then(Value::as_str) == Some("function")
            && t.get("function").and_then(|f| f.get("name")).and_then(Value::as_str).is_some_and(|n| !n.is_empty());
        if !ok {
            return Err(ApiError::invalid(
                "tools",
                format!("tool {i} must be {{\"type\": \"function\", \"function\": {{\"name\": ..}}}}"),
            ));
        }
    }
    let bad_choice = || {
        ApiError::invalid(
            "tool_choice",
            "'tool_choice' must be auto, none, required or {\"type\": \"function\", \"function\": {\"name\": ..}}",
        )
    };
    let choice = match o.get("tool_choice") {
        None | Some(Value::Null) => Choice::Auto,
        Some(Value::String(c)) if c == "auto" => Choice::Auto,
        Some(Value::String(c)) if c == "none" => Choice::None,
        Some(Value::String(c)) if c == "required" => Choice::Any,
        Some(Value::Object(c)) if c.get("type").and_then(Value::as_str) == Some("function") => {
            let name = c.get("function").and_then(|f| f.get("name")).and_then(Value::as_str).ok_or_else(bad_choice)?;
            if !specs.iter().any(|t| t["function"]["name"] == name) {
                return Err(ApiError::invalid("tool_choice", format!("no tool is named '{name}'")));
            }
            Choice::Named(name.to_string())
        }
        Some(_) => return Err(bad_choice()),
    };
    let format = tokenizer.chat_template.as_deref().and_then(crate::tools::Format::of_template);
    let Some(format) = format else {
        return Err(ApiError::invalid("tools", "this model's chat template does not write tool calls"));
    };
    // The specs go to the template as they came, as transformers hands them over.
    Ok(Some(Tools { specs: Value::Array(specs.clone()), format, choice }))
}

/// What `tool_choice` asks.
#[derive(Clone, PartialEq, Debug)]
pub(crate) enum Choice {
    /// The model may call a tool (calls are read from the reply).
    Auto,
    /// The model sees the tools, but its reply is text.
    None,
    /// The reply is a call of one of the tools.
    Any,
    /// The reply is a call of this tool.
    Named(String),
}

/// A chat request's tools: their specs, the format the model writes calls in, and what
/// `tool_choice` asks.
pub(crate) struct Tools {
    /// The `tools` list as the request gave it.
    pub specs: Value,
    /// How the model writes calls.
    pub format: crate::tools::Format,
    /// What `tool_choice` asks.
    pub choice: Choice,
}

/// A non-negative integer at least `min`, or `None` for null.
fn count(v: &Value, key: &str, min: u64) -> Result<Option<usize>, ApiError> {
    match v {
        Value::Null => Ok(None),
        _ => match v.as_u64() {
            Some(x) if x >= min => Ok(Some(x as usize)),
            _ => Err(ApiError::invalid(key, format!("'{key}' must be an integer of at least {min}"))),
        },
    }
}

fn count_or(o: &Map<String, Value>, key: &str, default: usize, min: u64) -> Result<usize, ApiError> {
    Ok(count(o.get(key).unwrap_or(&Value::Null), key, min)?.unwrap_or(default))
}

fn flag(o: &Map<String, Value>, key: &str) -> Result<bool, ApiError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ApiError::invalid(key, format!("'{key}' must be a boolean"))),
    }
}

/// `logit_bias`: token ids (as strings) to biases in [-100, 100].
fn logit_bias(o: &Map<String, Value>, tokenizer: &Tokenizer) -> Result<Vec<(u32, f32)>, ApiError> {
    let bad = |m: String| ApiError::invalid("logit_bias", m);
    match o.get("logit_bias") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| {
                let id: u32 = k.parse().map_err(|_| bad(format!("'{k}' is not a token id")))?;
                if id as usize >= tokenizer.vocab_size() {
                    return Err(bad(format!("token {id} is not in the vocabulary")));
                }
                match v.as_f64() {
                    Some(b) if (-100.0..=100.0).contains(&b) => Ok((id, b as f32)),
                    _ => Err(bad(format!("the bias of token {id} must be a number in [-100, 100]"))),
                }
            })
            .collect(),
        Some(_) => Err(bad("'logit_bias' must be an object of token ids to biases".into())),
    }
}

/// A chat request's prompt: its messages (text content, or lists of text parts; the
/// assistant's tool calls and the tools' results) through the chat template, with `tools`.
fn chat_prompt(o: &Map<String, Value>, tokenizer: &Tokenizer, tools: Option<&Value>) -> Result<Vec<u32>, ApiError> {
    let bad = |m: String| ApiError::invalid("messages", m);
    let Some(Value::Array(messages)) = o.get("messages") else {
        return Err(bad("'messages' must be a list of messages".into()));
    };
    if messages.is_empty() {
        return Err(bad("'messages' is empty".into()));
    }
    let mut plain = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let Value::Object(m) = m else { return Err(bad(format!("message {i} is not an object"))) };
        let role = match m.get("role").and_then(Value::as_str) {
            Some(r @ ("system" | "developer" | "user" | "assistant" | "tool")) => {
                if r == "developer" {
                    "system"
                } else {
                    r
                }
            }
            Some(r) => return Err(bad(format!("message {i}: role '{r}' is not supported"))),
            None => return Err(bad(format!("message {i} has no role"))),
        };
        let allowed: &[&str] = match role {
            "assistant" => &["role", "content", "name", "tool_calls", "refusal"],
            "tool" => &["role", "content", "tool_call_id", "name"],
            _ => &["role", "content", "name"],
        };
        if let Some(k) = m.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(bad(format!("message {i}: '{k}' is not supported for role '{role}'")));
        }
        let content = match m.get("content") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => {
                let mut text = String::new();
                for p in parts {
                    match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                        (Some("text"), Some(t)) => text.push_str(t),
                        (kind, _) => {
                            return Err(bad(format!(
                                "message {i}: content part of type {} is not supported (text only)",
                                kind.unwrap_or("none")
                            )));
                        }
                    }
                }
                text
            }
            Some(Value::Null) | None => String::new(),
            Some(_) => return Err(bad(format!("message {i}: 'content' must be a string or a list of parts"))),
        };
        let mut out = json!({"role": role, "content": content});
        for key in ["name", "tool_call_id"] {
            if let Some(v) = m.get(key) {
                out[key] = v.clone();
            }
        }
        if let Some(calls) = m.get("tool_calls") {
            let Value::Array(calls) = calls else {
                return Err(bad(format!("message {i}: 'tool_calls' must be a list")));
            };
            // Templates print the arguments as JSON themselves: hand them over parsed.
            let calls: Vec<Value> = calls
                .iter()
                .map(|c| {
                    let mut c = c.clone();
                    if let Some(Value::String(a)) = c.pointer("/function/arguments")
                        && let Ok(parsed) = serde_json::from_str::<Value>(a)
                    {
                        c["function"]["arguments"] = parsed;
                    }
                    c
                })
                .collect();
            out["tool_calls"] = Value::Array(calls);
        }
        plain.push(out);
    }
    let text = tokenizer.chat_prompt(&Value::Array(plain), tools).map_err(|e| bad(format!("chat template: {e}")))?;
    tokenizer.encode_prompt(&text).map_err(|e| bad(e.to_string()))
}

/// A completion request's prompt: a string, or token ids.
fn completion_prompt(o: &Map<String, Value>, tokenizer: &Tokenizer) -> Result<Vec<u32>, ApiError> {
    let bad = |m: &str| ApiError::invalid("prompt", m);
    match o.get("prompt") {
        Some(Value::String(s)) => tokenizer.encode_prompt(s).map_err(|e| bad(&e.to_string())),
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
            tokenizer.encode_prompt(a[0].as_str().unwrap_or("")).map_err(|e| bad(&e.to_string()))
        }
        Some(Value::Array(a)) if a.iter().all(Value::is_u64) => {
            let ids: Vec<u32> =
                a.iter().filter_map(Value::as_u64).map(|v| u32::try_from(v).unwrap_or(u32::MAX)).collect();
            match ids.iter().find(|&&id| id as usize >= tokenizer.vocab_size()) {
                Some(id) => Err(ApiError::invalid("prompt", format!("token {id} is not in the vocabulary"))),
                None => Ok(ids),
            }
        }
        Some(Value::Array(_)) => Err(bad("a list of several prompts is not supported: send one request each")),
        _ => Err(bad("'prompt' must be a string or a list of token ids")),
    }
}

/// OpenAI's name of a finish reason.
pub fn finish_name(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
    }
}

/// A token's text and its bytes, as log-probabilities report them.
fn token_text(tokenizer: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let text = tokenizer.decode(&[id]).unwrap_or_default();
    let bytes = text.as_bytes().to_vec();
    (text, bytes)
}

/// One token's entry of a chat choice's `logprobs.content`.
pub fn chat_logprob(tokenizer: &Tokenizer, g: &Generated) -> Value {
    let entry = |id: u32, lp: f32| {
        let (token, bytes) = token_text(tokenizer, id);
        json!({"token": token, "logprob": lp, "bytes": bytes})
    };
    let mut e = entry(g.token, g.logprob);
    e["top_logprobs"] = Value::Array(g.top_logprobs.iter().map(|&(id, lp)| entry(id, lp)).collect());
    e
}

/// A completion choice's `logprobs` of its tokens, its text starting at character `offset`
/// (the offsets count characters, as OpenAI's do).
pub fn completion_logprobs(tokenizer: &Tokenizer, tokens: &[Generated], offset: usize) -> Value {
    let (mut texts, mut lps, mut tops, mut offsets) = (vec![], vec![], vec![], vec![]);
    let mut at = offset;
    for g in tokens {
        let (text, _) = token_text(tokenizer, g.token);
        offsets.push(at);
        at += g.text.chars().count();
        texts.push(Value::from(text));
        lps.push(Value::from(g.logprob));
        let mut top = Map::new();
        for &(id, lp) in &g.top_logprobs {
            top.insert(token_text(tokenizer, id).0, Value::from(lp));
        }
        tops.push(Value::Object(top));
    }
    json!({"tokens": texts, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
}
