//! The server over loopback with the tiny random Llama of nuvec-lm's fixtures and a word
//! tokenizer: OpenAI's shapes, streaming, greedy replies equal to generating alone (also
//! under many concurrent streams), bad requests answered with the right status, clients
//! that go away.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;

use nuvec::DType;
use nuvec_lm::{GenerateOptions, LoadOptions, Loaded, PromptCache, Tokenizer, generate, load_model};
use nuvec_serve::{ServeOptions, Server};
use serde_json::{Value, json};

fn fixture() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../nuvec-lm/tests/fixtures/tiny/llama")
}

/// Words `t0` … `t127` as tokens 0 … 127, and a chat template that writes each message's
/// content followed by a space.
fn tokenizer() -> Tokenizer {
    let vocab: serde_json::Map<String, Value> = (0..128).map(|i| (format!("t{i}"), Value::from(i))).collect();
    let spec = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": false},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "t0"}
    });
    let mut t = Tokenizer::from_json(&spec.to_string()).unwrap();
    t.chat_template = Some("{% for m in messages %}{{ m.content }} {% endfor %}".into());
    t
}

fn loaded() -> Loaded {
    let model =
        load_model(&fixture(), &LoadOptions { dtype: Some(DType::F32), quantize: None, ..Default::default() }).unwrap();
    Loaded { model, tokenizer: tokenizer(), eos: vec![], path: fixture() }
}

fn start(options: ServeOptions) -> Server {
    Server::start(loaded(), ServeOptions { port: 0, ..options }).unwrap()
}

/// One HTTP/1.0 request (so that the reply is not chunked): status and body.
fn http(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    let mut req = format!("{method} {path} HTTP/1.0\r\nHost: localhost\r\nContent-Length: {}\r\n", body.len());
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("Content-Type: application/json\r\n\r\n");
    s.write_all(req.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, body.to_string())
}

fn post(addr: SocketAddr, path: &str, body: &Value) -> (u16, Value) {
    let (status, text) = http(addr, "POST", path, &[], body.to_string().as_bytes());
    (status, serde_json::from_str(&text).unwrap_or_else(|_| Value::String(text)))
}

/// The data lines of a server-sent event stream.
fn events(body: &str) -> Vec<String> {
    body.lines().filter_map(|l| l.strip_prefix("data: ")).map(str::to_string).collect()
}

/// The text greedy decoding of `prompt` gives alone, `max` tokens.
fn alone(prompt: &str, max: usize) -> String {
    let m = loaded();
    let ids = m.tokenizer.encode_prompt(prompt).unwrap();
    let mut cache = PromptCache::new(m.model.as_ref());
    let options = GenerateOptions { max_tokens: max, ..Default::default() };
    generate(m.model.as_ref(), Some(&m.tokenizer), &mut cache, &ids, &[], options)
        .unwrap()
        .map(|t| t.unwrap().text)
        .collect()
}

#[test]
fn chat_and_completions_in_openai_shapes() {
    let server = start(ServeOptions::default());
    let addr = server.addr();
    let prompt = "t5 t17 t99 t3";
    let want = alone(&format!("{prompt} "), 12);

    let (status, r) = post(
        addr,
        "/v1/chat/completions",
        &json!({
            "model": "llama", "messages": [{"role": "user", "content": prompt}], "max_tokens": 12, "temperature": 0
        }),
    );
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["object"], "chat.completion");
    assert!(r["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(r["choices"][0]["message"]["role"], "assistant");
    assert_eq!(r["choices"][0]["message"]["content"], want.as_str(), "greedy reply equals generating alone");
    assert_eq!(r["choices"][0]["finish_reason"], "length");
    assert_eq!(r["usage"]["prompt_tokens"], 4);
    assert_eq!(r["usage"]["completion_tokens"], 12);
    assert_eq!(r["usage"]["total_tokens"], 16);

    // Text completion of the same prompt, from its text and from its ids, with logprobs.
    let (status, r) =
        post(addr, "/v1/completions", &json!({"prompt": format!("{prompt} "), "max_tokens": 12, "logprobs": 2}));
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["object"], "text_completion");
    assert_eq!(r["choices"][0]["text"], want.as_str());
    let lp = &r["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 12);
    assert!(lp["token_logprobs"].as_array().unwrap().iter().all(|v| v.as_f64().unwrap() <= 0.0));
    assert_eq!(lp["top_logprobs"][0].as_object().unwrap().len(), 2);
    // Offsets are where each token's text starts in the reply, whole and streamed.
    let offsets = lp["text_offset"].clone();
    assert_eq!(offsets[0], 0);
    let body = json!({"prompt": format!("{prompt} "), "max_tokens": 12, "logprobs": 2, "stream": true});
    let (_, text) = http(addr, "POST", "/v1/completions", &[], body.to_string().as_bytes());
    let ev = events(&text);
    let streamed: Vec<Value> = ev[..ev.len() - 1]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .map(|c| c["choices"][0]["logprobs"]["text_offset"][0].clone())
        .collect();
    assert_eq!(Value::Array(streamed), offsets);
    let (_, by_ids) = post(addr, "/v1/completions", &json!({"prompt": [5, 17, 99, 3], "max_tokens": 12}));
    assert_eq!(by_ids["choices"][0]["text"], want.as_str());

    // Chat log-probabilities: the chosen token is the most likely one under greedy decoding.
    let (_, r) = post(
        addr,
        "/v1/chat/completions",
        &json!({
            "messages": [{"role": "user", "content": [{"type": "text", "text": prompt}]}],
            "max_completion_tokens": 3, "logprobs": true, "top_logprobs": 3
        }),
    );
    let content = r["choices"][0]["logprobs"]["content"].as_array().unwrap().clone();
    assert_eq!(content.len(), 3);
    for c in &content {
        assert_eq!(c["top_logprobs"].as_array().unwrap().len(), 3);
        assert_eq!(c["top_logprobs"][0]["token"], c["token"]);
        assert!(c["bytes"].is_array());
    }

    // Streaming: a role, then the deltas that make the same text, the finish reason, the
    // usage, [DONE].
    let body = json!({"messages": [{"role": "user", "content": prompt}], "max_tokens": 12, "stream": true,
                      "stream_options": {"include_usage": true}});
    let (status, text) = http(addr, "POST", "/v1/chat/completions", &[], body.to_string().as_bytes());
    assert_eq!(status, 200);
    let ev = events(&text);
    assert_eq!(ev.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = ev[..ev.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let streamed: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(streamed, want);
    let finish: Vec<&Value> =
        chunks.iter().map(|c| &c["choices"][0]["finish_reason"]).filter(|f| !f.is_null()).collect();
    assert_eq!(finish, [&json!("length")]);
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 12);

    // n choices sampled with a seed: each choice is its own, the same seed repeats them.
    let body = json!({"prompt": prompt, "max_tokens": 6, "n": 3, "temperature": 1.0, "seed": 7});
    let (_, a) = post(addr, "/v1/completions", &body);
    let (_, b) = post(addr, "/v1/completions", &body);
    assert_eq!(a["choices"].as_array().unwrap().len(), 3);
    assert_eq!(a["choices"], b["choices"], "the same seed gives the same choices");
    assert_eq!(a["usage"]["completion_tokens"], 18);

    // Stop strings end the text before them.
    let stop = want.split_whitespace().nth(2).unwrap().to_string();
    let (_, r) =
        post(addr, "/v1/completions", &json!({"prompt": format!("{prompt} "), "max_tokens": 12, "stop": [stop]}));
    assert_eq!(r["choices"][0]["finish_reason"], "stop");
    assert!(want.starts_with(r["choices"][0]["text"].as_str().unwrap()));

    // The next turn of the conversation starts from the first turn's caches.
    let metric = |name: &str| -> u64 {
        let (_, m) = http(addr, "GET", "/metrics", &[], b"");
        m.lines().find_map(|l| l.strip_prefix(&format!("{name} "))).unwrap().parse().unwrap()
    };
    let first = json!([{"role": "user", "content": prompt}]);
    let (_, r) = post(addr, "/v1/chat/completions", &json!({"messages": first, "max_tokens": 12}));
    assert_eq!(r["choices"][0]["message"]["content"], want.as_str());
    let before = metric("nuvec_prompt_tokens_cached_total");
    let turn = json!([{"role": "user", "content": prompt}, {"role": "assistant", "content": want}, {"role": "user", "content": "t1 t2"}]);
    let (_, r) = post(addr, "/v1/chat/completions", &json!({"messages": turn, "max_tokens": 5}));
    let whole = format!("{prompt} {want} t1 t2 ");
    assert_eq!(r["choices"][0]["message"]["content"], alone(&whole, 5).as_str());
    assert!(metric("nuvec_prompt_tokens_cached_total") - before >= 4 + 11, "the first turn's caches were reused");
    let cached = r["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(cached >= 4 + 11 && cached < r["usage"]["prompt_tokens"].as_u64().unwrap(), "{r}");
    // The kept caches' bytes.
    assert!(metric("nuvec_kv_cache_bytes") > 0);

    let (status, models) = http(addr, "GET", "/v1/models", &[], b"");
    assert_eq!(status, 200);
    assert_eq!(serde_json::from_str::<Value>(&models).unwrap()["data"][0]["id"], "llama");
    assert_eq!(http(addr, "GET", "/health", &[], b"").0, 200);
    let (_, metrics) = http(addr, "GET", "/metrics", &[], b"");
    assert!(metrics.contains("nuvec_generation_tokens_total"), "{metrics}");
    // Latency histograms: cumulative buckets ending in +Inf, which counts every observation.
    for name in ["nuvec_time_to_first_token_seconds", "nuvec_inter_token_latency_seconds"] {
        let value = |suffix: &str| -> u64 {
            let line = metrics.lines().find(|l| l.starts_with(&format!("{name}{suffix}"))).unwrap();
            line.rsplit(' ').next().unwrap().parse().unwrap()
        };
        let count = value("_count");
        assert!(count >= 10 && value("_bucket{le=\"+Inf\"}") == count, "{metrics}");
        assert!(value("_bucket{le=\"0.001\"}") <= count);
    }
    server.stop().unwrap();
}

#[test]
fn bad_requests_get_openai_errors_and_the_server_keeps_serving() {
    let server = start(ServeOptions { max_body: 4096, ..Default::default() });
    let addr = server.addr();
    let chat = |extra: Value| {
        let mut body = json!({"messages": [{"role": "user", "content": "t1 t2"}], "max_tokens": 2});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        post(addr, "/v1/chat/completions", &body)
    };
    for (extra, status, param) in [
        (json!({"frobnicate": 1}), 400, "frobnicate"),
        (json!({"tools": [{"type": "function", "function": {"name": "f"}}]}), 400, "tools"),
        (json!({"tools": [{"type": "retrieval"}]}), 400, "tools"),
        (json!({"functions": []}), 400, "functions"),
        (json!({"response_format": {"type": "json_object"}}), 400, "response_format"),
        (json!({"max_tokens": "ten"}), 400, "max_tokens"),
        (json!({"temperature": 3}), 400, "temperature"),
        (json!({"n": 0}), 400, "n"),
        (json!({"stop": 5}), 400, "stop"),
        (json!({"logit_bias": {"999999": 1}}), 400, "logit_bias"),
        (json!({"messages": []}), 400, "messages"),
        (json!({"messages": [{"role": "wizard", "content": "x"}]}), 400, "messages"),
        (json!({"top_logprobs": 2}), 400, "top_logprobs"),
        (json!({"model": "gpt-4"}), 404, "model"),
        // The tiny model's context is 256 tokens.
        (json!({"max_tokens": 1000}), 400, "max_tokens"),
        (json!({"max_completion_tokens": 255}), 400, "max_completion_tokens"),
    ] {
        let (got, r) = chat(extra.clone());
        assert_eq!(got, status, "{extra}: {r}");
        assert_eq!(r["error"]["param"], param, "{extra}: {r}");
        assert!(!r["error"]["message"].as_str().unwrap().is_empty());
    }
    let long: Vec<String> = (0..300).map(|i| format!("t{}", i % 128)).collect();
    let (status, r) = chat(json!({"messages": [{"role": "user", "content": long.join(" ")}]}));
    assert_eq!(status, 400, "{r}");
    assert!(r["error"]["message"].as_str().unwrap().contains("context"));
    let (status, text) = http(addr, "POST", "/v1/chat/completions", &[], b"{not json");
    assert_eq!(status, 400);
    assert!(text.contains("not valid JSON"));
    let (status, text) = http(addr, "POST", "/v1/completions", &[], &vec![b' '; 8192]);
    assert_eq!(status, 413);
    assert!(text.contains("larger than 4096 bytes"), "{text}");
    assert_eq!(http(addr, "GET", "/v2/nothing", &[], b"").0, 404);
    // Still serving.
    assert_eq!(chat(json!({})).0, 200);
    server.stop().unwrap();

    let server = start(ServeOptions { api_key: Some("sekret".into()), ..Default::default() });
    let body = json!({"prompt": "t1", "max_tokens": 1}).to_string();
    let (status, text) =
        http(server.addr(), "POST", "/v1/completions", &[("Authorization", "Bearer wrong")], body.as_bytes());
    assert_eq!(status, 401);
    assert!(text.contains("invalid_api_key"));
    assert_eq!(http(server.addr(), "POST", "/v1/completions", &[], body.as_bytes()).0, 401);
    let ok = http(server.addr(), "POST", "/v1/completions", &[("Authorization", "Bearer sekret")], body.as_bytes());
    assert_eq!(ok.0, 200);
    server.stop().unwrap();
}

#[test]
fn concurrent_streams_equal_their_requests_alone_and_clients_may_leave() {
    // 256 streams through a batch of 16 over a paged KV cache of 24 blocks of 4, too few for 16
    // requests at once (the newest are preempted and resume); four more clients leave
    // mid-stream.
    let options =
        ServeOptions { max_batch: 16, max_queue: 1024, kv_block_size: 4, kv_cache_tokens: 96, ..Default::default() };
    let server = start(options);
    let addr = server.addr();
    let prompts: Vec<String> = (0..256)
        .map(|i| (0..(2 + i % 7)).map(|j| format!("t{}", (i * 13 + j * 5) % 128)).collect::<Vec<_>>().join(" "))
        .collect();
    let wants: Vec<String> = prompts.iter().map(|p| alone(&format!("{p} "), 10)).collect();
    // Clients that go away mid-stream leave nothing behind.
    let leavers: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(move || {
                let body = json!({"prompt": "t1 t2 t3", "max_tokens": 200, "stream": true}).to_string();
                let mut s = TcpStream::connect(addr).unwrap();
                let req = format!("POST /v1/completions HTTP/1.0\r\nContent-Length: {}\r\n\r\n{body}", body.len());
                s.write_all(req.as_bytes()).unwrap();
                let mut first = [0u8; 256];
                let _ = s.read(&mut first).unwrap();
            })
        })
        .collect();
    let handles: Vec<_> = prompts
        .iter()
        .cloned()
        .map(|p| {
            std::thread::spawn(move || {
                let body = json!({"messages": [{"role": "user", "content": p}], "max_tokens": 10, "stream": true});
                let (status, text) = http(addr, "POST", "/v1/chat/completions", &[], body.to_string().as_bytes());
                assert_eq!(status, 200);
                let ev = events(&text);
                assert_eq!(ev.last().unwrap(), "[DONE]");
                ev[..ev.len() - 1]
                    .iter()
                    .map(|e| serde_json::from_str::<Value>(e).unwrap())
                    .filter_map(|c| c["choices"][0]["delta"]["content"].as_str().map(str::to_string))
                    .collect::<String>()
            })
        })
        .collect();
    for h in leavers {
        h.join().unwrap();
    }
    for (i, (h, want)) in handles.into_iter().zip(&wants).enumerate() {
        assert_eq!(&h.join().unwrap(), want, "stream {i} differs from its request alone");
    }
    // The leavers' requests were cancelled: nothing runs or waits.
    let gauge = |name: &str| -> u64 {
        let (_, m) = http(addr, "GET", "/metrics", &[], b"");
        m.lines().find_map(|l| l.strip_prefix(&format!("{name} "))).unwrap().parse().unwrap()
    };
    let mut tries = 0;
    while gauge("nuvec_requests_running") + gauge("nuvec_requests_waiting") > 0 {
        tries += 1;
        assert!(tries < 200, "requests of clients that left are still running");
        // A request makes the engine take a step and notice the closed streams.
        post(addr, "/v1/completions", &json!({"prompt": "t1", "max_tokens": 1}));
    }
    // Every block went back; the pool was full at times.
    assert_eq!(gauge("nuvec_kv_blocks_total"), 24);
    assert_eq!(gauge("nuvec_kv_blocks_held"), 0, "KV blocks leaked");
    assert!(gauge("nuvec_preemptions_total") > 0, "a pool of 24 blocks preempts");
    server.stop().unwrap();
}

/// A model with recurrent layers (Qwen3-Next's linear attention), whose state per request the
/// paged KV cache does not hold, is served with each request's caches of its own under the
/// default (paged) options: concurrent replies equal generating alone.
#[test]
fn a_model_with_recurrent_layers_is_served_without_the_paged_cache() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../nuvec-lm/tests/fixtures/tiny/qwen3_next");
    let load = || {
        let model =
            load_model(&path, &LoadOptions { dtype: Some(DType::F32), quantize: None, ..Default::default() }).unwrap();
        Loaded { model, tokenizer: tokenizer(), eos: vec![], path: path.clone() }
    };
    let m = load();
    let server = Server::start(load(), ServeOptions { port: 0, ..Default::default() }).unwrap();
    let addr = server.addr();
    let prompts = ["t5 t17 t99 t3", "t1 t2", "t40 t41 t42 t43 t44 t45 t46"];
    let handles: Vec<_> = prompts
        .iter()
        .map(|p| {
            let body = json!({"prompt": format!("{p} "), "max_tokens": 8, "temperature": 0});
            std::thread::spawn(move || post(addr, "/v1/completions", &body))
        })
        .collect();
    for (p, h) in prompts.iter().zip(handles) {
        let (status, r) = h.join().unwrap();
        assert_eq!(status, 200, "{r}");
        let ids = m.tokenizer.encode_prompt(&format!("{p} ")).unwrap();
        let options = GenerateOptions { max_tokens: 8, ..Default::default() };
        let mut cache = PromptCache::new(m.model.as_ref());
        let want: String = generate(m.model.as_ref(), Some(&m.tokenizer), &mut cache, &ids, &[], options)
            .unwrap()
            .map(|t| t.unwrap().text)
            .collect();
        assert_eq!(r["choices"][0]["text"], want.as_str(), "{p}");
    }
    // No paged pool: its gauges stay at zero.
    let (_, metrics) = http(addr, "GET", "/metrics", &[], b"");
    assert!(metrics.contains("nuvec_kv_blocks_total 0"), "{metrics}");
    server.stop().unwrap();
}

/// `python3` with `NUVEC_IO_PYTHONPATH` as its `PYTHONPATH`; without it, `None` and test
/// `name` says SKIPPED.
fn python(name: &str) -> Option<std::process::Command> {
    let Some(path) = std::env::var_os("NUVEC_IO_PYTHONPATH") else {
        eprintln!("SKIPPED {name}: NUVEC_IO_PYTHONPATH is not set");
        return None;
    };
    let mut command = std::process::Command::new("python3");
    command.env("PYTHONPATH", path);
    Some(command)
}

/// OpenAI's own Python client against the server: models, chat (with log-probabilities),
/// streaming with usage, text completions with `n`, and an unsupported parameter's error.
/// Needs `NUVEC_IO_PYTHONPATH` holding the `openai` package, which `.ci/run` installs;
/// without it the test says SKIPPED.
#[test]
fn the_openai_python_client_talks_to_the_server() {
    let Some(mut python) = python("the_openai_python_client_talks_to_the_server") else { return };
    let server = start(ServeOptions::default());
    let want = alone("t5 t17 t99 ", 8);
    let script = r#"
import sys, openai
c = openai.OpenAI(base_url=sys.argv[1], api_key="unused")
assert [m.id for m in c.models.list()] == ["llama"]
r = c.chat.completions.create(model="llama", messages=[{"role": "user", "content": "t5 t17 t99"}],
                              max_tokens=8, logprobs=True, top_logprobs=2)
ch = r.choices[0]
assert ch.message.content == sys.argv[2], (ch.message.content, sys.argv[2])
assert ch.finish_reason == "length" and r.usage.completion_tokens == 8 and r.usage.prompt_tokens == 3
assert len(ch.logprobs.content) == 8 and len(ch.logprobs.content[0].top_logprobs) == 2
s = c.chat.completions.create(model="llama", messages=[{"role": "user", "content": "t5 t17 t99"}],
                              max_tokens=8, stream=True, stream_options={"include_usage": True})
text, usage = "", None
for chunk in s:
    if chunk.choices:
        text += chunk.choices[0].delta.content or ""
    else:
        usage = chunk.usage
assert text == sys.argv[2] and usage.total_tokens == 11, (text, usage)
r = c.completions.create(model="llama", prompt="t5 t17 t99 ", max_tokens=8, n=2, temperature=0.7, seed=3)
assert len(r.choices) == 2 and r.usage.completion_tokens == 16
try:
    c.chat.completions.create(model="llama", messages=[{"role": "user", "content": "t1"}],
                              extra_body={"frobnicate": 1})
    raise SystemExit("an unsupported parameter was accepted")
except openai.BadRequestError as e:
    assert "frobnicate" in str(e), e
print("ok")
"#;
    let out = python.arg("-c").arg(script).arg(format!("http://{}/v1", server.addr())).arg(&want).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("No module named 'openai'") {
        eprintln!("SKIPPED the_openai_python_client_talks_to_the_server: no openai package in NUVEC_IO_PYTHONPATH");
        return;
    }
    assert!(out.status.success(), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
    server.stop().unwrap();
}

/// A model that answers by a table: the token after token `t` is `next[t]`, whatever came
/// before (logits of one-hot rows).
struct Scripted {
    next: nuvec::Array,
    config: nuvec_lm::ModelConfig,
}

impl nuvec::nn::Module for Scripted {
    fn visit(&self, _: &str, _: &mut dyn FnMut(&str, &nuvec::nn::Param)) {}
    fn visit_mut(&mut self, _: &str, _: &mut dyn FnMut(&str, &mut nuvec::nn::Param)) {}
}

impl nuvec_lm::LanguageModel for Scripted {
    fn forward(&self, tokens: &nuvec::Array, _: &mut [nuvec_lm::KvCache]) -> nuvec::Array {
        self.next.take(&tokens.astype(DType::I32), 0)
    }
    fn forward_at(&self, tokens: &nuvec::Array, c: &mut [nuvec_lm::KvCache], _: &nuvec_lm::Positions) -> nuvec::Array {
        self.forward(tokens, c)
    }
    fn device_positions(&self) -> bool {
        true
    }
    fn config(&self) -> &nuvec_lm::ModelConfig {
        &self.config
    }
    fn new_cache(&self) -> Vec<nuvec_lm::KvCache> {
        vec![nuvec_lm::KvCache::new()]
    }
}

/// A scripted model that calls a `weather` tool in Hermes' format when asked `weather?`, and
/// answers `It is sunny` to the tool's result and to anything else; its template renders
/// tools and tool messages.
fn tool_caller() -> Loaded {
    let words = [
        "<unk>",
        "weather?",
        "<tool_call>",
        "{\"name\":",
        "\"weather\",",
        "\"arguments\":",
        "{\"city\":",
        "\"Paris\"}}",
        "</tool_call>",
        "<eos>",
        "tools:",
        "weather",
        "result:",
        "22C",
        "It",
        "is",
        "sunny",
        "Paris",
    ];
    let id = |w: &str| words.iter().position(|x| *x == w).unwrap() as i32;
    let mut next: Vec<i32> = (0..words.len() as i32).map(|_| id("<eos>")).collect();
    let chain = |from: &str, to: &str, next: &mut Vec<i32>| next[id(from) as usize] = id(to);
    for pair in words[1..10].windows(2) {
        chain(pair[0], pair[1], &mut next);
    }
    // Unknown words (any other prompt) get the same answer.
    for (a, b) in [("22C", "It"), ("<unk>", "It"), ("It", "is"), ("is", "sunny"), ("sunny", "<eos>")] {
        chain(a, b, &mut next);
    }
    let v = words.len() as i32;
    let one_hot = nuvec::ops::equal(
        nuvec::Array::from_slice(&next, [v, 1]),
        nuvec::ops::arange(0.0, v as f64, 1.0).astype(DType::I32).reshape([1, v]),
    );
    let next = one_hot.astype(DType::F32) * 20.0;
    let vocab: serde_json::Map<String, Value> =
        words.iter().enumerate().map(|(i, w)| (w.to_string(), Value::from(i))).collect();
    let spec = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,
        "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": null,
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": false},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
    });
    let mut tokenizer = Tokenizer::from_json(&spec.to_string()).unwrap();
    tokenizer.chat_template = Some(
        "{% if tools %}tools:{% for t in tools %} {{ t.function.name }}{% endfor %} {% endif %}\
         {% for m in messages %}{% if m.role == 'tool' %}result: {{ m.content }} \
         {% elif m.tool_calls %}{% for c in m.tool_calls %}<tool_call> {{ c.function.name }} \
         {{ c.function.arguments.city }} </tool_call> {% endfor %}{% else %}{{ m.content }} {% endif %}{% endfor %}"
            .into(),
    );
    let config = nuvec_lm::ModelConfig { vocab_size: v, ..Default::default() };
    Loaded {
        model: Box::new(Scripted { next, config }),
        tokenizer,
        eos: vec![id("<eos>") as u32],
        path: "scripted".into(),
    }
}

#[test]
fn tool_calls_are_read_from_the_reply_whole_and_streamed() {
    let server = Server::start(tool_caller(), ServeOptions { port: 0, ..Default::default() }).unwrap();
    let addr = server.addr();
    let tools = json!([{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]);
    let ask = json!([{"role": "user", "content": "weather?"}]);
    let (status, r) = post(addr, "/v1/chat/completions", &json!({"messages": ask, "tools": tools}));
    assert_eq!(status, 200, "{r}");
    let choice = &r["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert!(choice["message"]["content"].is_null());
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert!(call["id"].as_str().unwrap().starts_with("call_"));
    assert_eq!(call["function"]["name"], "weather");
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"city": "Paris"}));

    // Streamed: no text of the call shows; one delta carries it.
    let body = json!({"messages": ask, "tools": tools, "stream": true});
    let (_, text) = http(addr, "POST", "/v1/chat/completions", &[], body.to_string().as_bytes());
    let ev = events(&text);
    let chunks: Vec<Value> = ev[..ev.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    let shown: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(shown, "");
    let calls: Vec<&Value> = chunks.iter().filter_map(|c| c["choices"][0]["delta"].get("tool_calls")).collect();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0][0]["function"]["name"], "weather");
    assert_eq!(calls[0][0]["index"], 0);
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "tool_calls");

    // The call and its result go back through the template; the model answers.
    let turn = json!([
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "22C"}
    ]);
    let (status, r) = post(addr, "/v1/chat/completions", &json!({"messages": turn, "tools": tools}));
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["choices"][0]["message"]["content"], "It is sunny");
    assert_eq!(r["choices"][0]["finish_reason"], "stop");
    assert!(r["choices"][0]["message"].get("tool_calls").is_none());

    // With tool_choice none the model sees the tools, but its reply stays text.
    let (_, r) = post(addr, "/v1/chat/completions", &json!({"messages": ask, "tools": tools, "tool_choice": "none"}));
    assert!(r["choices"][0]["message"]["content"].as_str().unwrap().starts_with("<tool_call>"), "{r}");
    assert!(r["choices"][0]["message"].get("tool_calls").is_none());
    // Without tools, the reply is text. A forced call needs a grammar over the tokenizer, which
    // llguidance cannot make for a word-level one: refused, naming the parameter.
    let (_, r) = post(addr, "/v1/chat/completions", &json!({"messages": ask}));
    assert!(r["choices"][0]["message"]["content"].as_str().unwrap().starts_with("<tool_call>"));
    let (status, r) =
        post(addr, "/v1/chat/completions", &json!({"messages": ask, "tools": tools, "tool_choice": "required"}));
    assert_eq!((status, r["error"]["param"].as_str()), (400, Some("tool_choice")));
    server.stop().unwrap();

    // A template that writes no tool calls cannot take tools.
    let server = start(ServeOptions::default());
    let (status, r) = post(server.addr(), "/v1/chat/completions", &json!({"messages": ask, "tools": tools}));
    assert_eq!((status, r["error"]["param"].as_str()), (400, Some("tools")));
    server.stop().unwrap();
}

/// The tiny Llama with a byte-level tokenizer (token `b` is byte `b`, as GPT-2's byte
/// alphabet writes it) and byte 0 as its end: every ASCII text has tokens.
fn byte_level() -> Loaded {
    byte_level_with(&[])
}

/// [`byte_level`] with `specials` (id, text) as special added tokens in place of those bytes.
fn byte_level_with(specials: &[(u32, &str)]) -> Loaded {
    let printable = |b: u32| (33..=126).contains(&b);
    let mut next = 256;
    let vocab: serde_json::Map<String, Value> = (0..128u32)
        .filter(|b| !specials.iter().any(|(id, _)| id == b))
        .map(|b| {
            let c = if printable(b) {
                char::from_u32(b).unwrap()
            } else {
                next += 1;
                char::from_u32(next - 1).unwrap()
            };
            (c.to_string(), Value::from(b))
        })
        .collect();
    let added: Vec<Value> = specials
        .iter()
        .map(|(id, text)| {
            json!({"id": id, "content": text, "single_word": false, "lstrip": false, "rstrip": false,
                   "normalized": false, "special": true})
        })
        .collect();
    let spec = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added, "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": []}
    });
    let mut tokenizer = Tokenizer::from_json(&spec.to_string()).unwrap();
    tokenizer.chat_template = Some("{% for m in messages %}{{ m.content }}\n{% endfor %}".into());
    let model =
        load_model(&fixture(), &LoadOptions { dtype: Some(DType::F32), quantize: None, ..Default::default() }).unwrap();
    Loaded { model, tokenizer, eos: vec![0], path: fixture() }
}

#[test]
fn response_format_json_schema_constrains_the_reply() {
    let server = Server::start(byte_level(), ServeOptions { port: 0, ..Default::default() }).unwrap();
    let addr = server.addr();
    let schema = json!({
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 6}, "n": {"type": "integer", "enum": [1, 2, 3]}},
        "required": ["name", "n"],
        "additionalProperties": false
    });
    let format = json!({"type": "json_schema", "json_schema": {"name": "thing", "schema": schema, "strict": true}});
    let ask = json!([{"role": "user", "content": "Give me a thing."}]);
    for (stream, temperature, seed) in [(false, 0.0, 0), (false, 1.0, 1), (true, 1.0, 2), (false, 1.0, 3)] {
        let body = json!({"messages": ask, "response_format": format, "max_tokens": 200, "stream": stream,
                          "temperature": temperature, "seed": seed});
        let content = match stream {
            false => {
                let (status, r) = post(addr, "/v1/chat/completions", &body);
                assert_eq!(status, 200, "{r}");
                assert_eq!(r["choices"][0]["finish_reason"], "stop", "{r}");
                r["choices"][0]["message"]["content"].as_str().unwrap().to_string()
            }
            true => {
                let (_, text) = http(addr, "POST", "/v1/chat/completions", &[], body.to_string().as_bytes());
                let ev = events(&text);
                ev[..ev.len() - 1]
                    .iter()
                    .map(|e| serde_json::from_str::<Value>(e).unwrap())
                    .filter_map(|c| c["choices"][0]["delta"]["content"].as_str().map(str::to_string))
                    .collect()
            }
        };
        let v: Value = serde_json::from_str(&content).unwrap_or_else(|e| panic!("{content:?} is not JSON: {e}"));
        let o = v.as_object().unwrap();
        assert_eq!(o.len(), 2, "{content}");
        assert!(o["name"].as_str().unwrap().chars().count() <= 6, "{content}");
        assert!([1, 2, 3].contains(&o["n"].as_i64().unwrap()), "{content}");
    }
    // Unconstrained, the tiny random model writes no JSON.
    let (_, r) = post(addr, "/v1/chat/completions", &json!({"messages": ask, "max_tokens": 20}));
    assert!(serde_json::from_str::<Value>(r["choices"][0]["message"]["content"].as_str().unwrap()).is_err());
    // Any object: a reply cut by max_tokens is the start of one.
    let body = json!({"messages": ask, "max_tokens": 40, "response_format": {"type": "json_object"}});
    let (_, r) = post(addr, "/v1/chat/completions", &body);
    let content = r["choices"][0]["message"]["content"].as_str().unwrap();
    // Greedy, the tiny model writes a long first key: closing it makes an object.
    assert_eq!(r["choices"][0]["finish_reason"], "length");
    let closed: Value = serde_json::from_str(&format!("{content}\": 1}}")).unwrap();
    assert!(closed.is_object(), "{content}");
    for bad in [
        json!({"type": "xml"}),
        json!({"type": "json_schema"}),
        json!({"type": "json_schema", "json_schema": {"schema": 5}}),
    ] {
        let (status, r) = post(addr, "/v1/chat/completions", &json!({"messages": ask, "response_format": bad}));
        assert_eq!((status, r["error"]["param"].as_str()), (400, Some("response_format")), "{bad}");
    }
    server.stop().unwrap();
}

/// Headless Chromium (Debian's package) through its DevTools protocol: commands on one
/// page's session, answered in order.
struct Browser {
    child: std::process::Child,
    ws: tungstenite::WebSocket<TcpStream>,
    session: String,
    next: u64,
}

impl Browser {
    /// A browser showing `url`; `None` without a `chromium` on the PATH.
    fn open(url: &str) -> Option<Browser> {
        use std::io::BufRead;
        let profile = std::env::temp_dir().join(format!("nuvec-serve-chromium-{}", std::process::id()));
        let mut child = std::process::Command::new("chromium")
            .args([
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--remote-debugging-port=0",
                "--window-size=900,600",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stderr(std::process::Stdio::piped())
            .spawn()
            .ok()?;
        let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
        let url_line = stderr.lines().map_while(Result::ok).find(|l| l.contains("DevTools listening on"))?;
        let ws_url = url_line.split_whitespace().last().unwrap().to_string();
        let addr = ws_url.trim_start_matches("ws://").split('/').next().unwrap().to_string();
        let stream = TcpStream::connect(&addr).unwrap();
        let (ws, _) = tungstenite::client(ws_url.as_str(), stream).unwrap();
        let mut b = Browser { child, ws, session: String::new(), next: 1 };
        let target = b.call("Target.createTarget", json!({"url": url}))["targetId"].clone();
        let attached = b.call("Target.attachToTarget", json!({"targetId": target, "flatten": true}));
        b.session = attached["sessionId"].as_str().unwrap().to_string();
        Some(b)
    }

    /// Sends `method` (on the page's session once attached) and waits for its result.
    fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next;
        self.next += 1;
        let mut msg = json!({"id": id, "method": method, "params": params});
        if !self.session.is_empty() {
            msg["sessionId"] = self.session.clone().into();
        }
        self.ws.send(tungstenite::Message::text(msg.to_string())).unwrap();
        loop {
            let reply = self.ws.read().unwrap();
            let Ok(text) = reply.to_text() else { continue };
            let v: Value = serde_json::from_str(text).unwrap();
            if v["id"] == id {
                assert!(v.get("error").is_none(), "{method}: {v}");
                return v["result"].clone();
            }
        }
    }

    /// The value of a JavaScript expression in the page.
    fn eval(&mut self, expression: &str) -> Value {
        self.call("Runtime.evaluate", json!({"expression": expression, "returnByValue": true}))["result"]["value"]
            .clone()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Standard base64 (a DevTools screenshot's encoding) to bytes.
fn base64(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let digits: Vec<u8> = text.bytes().filter(|&c| c != b'=' && !c.is_ascii_whitespace()).map(value).collect();
    digits
        .chunks(4)
        .flat_map(|q| {
            let n = q.iter().enumerate().fold(0u32, |n, (i, &d)| n | (d as u32) << (18 - 6 * i));
            n.to_be_bytes()[1..q.len()].to_vec()
        })
        .collect()
}

/// The chat page in headless Chromium: it loads, names the model, sends a typed message and
/// shows the streamed reply (the text greedy decoding gives) with its tokens/s; a screenshot
/// is kept in the target folder. Without `chromium` the test says SKIPPED.
#[test]
fn the_chat_page_streams_a_reply_in_chromium() {
    let server = start(ServeOptions::default());
    let Some(mut page) = Browser::open(&format!("http://{}/", server.addr())) else {
        eprintln!("SKIPPED the_chat_page_streams_a_reply_in_chromium: no chromium on the PATH");
        return;
    };
    let wait = |page: &mut Browser, expression: &str| -> Value {
        for _ in 0..200 {
            let v = page.eval(expression);
            if !v.is_null() && v != false {
                return v;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        panic!("the page never gave {expression}");
    };
    assert_eq!(wait(&mut page, "document.getElementById('model').textContent === 'llama' || null"), true);
    page.eval(
        "document.getElementById('temperature').value = '0'; document.getElementById('max_tokens').value = '12'; \
         document.getElementById('prompt').value = 't5 t17 t99 t3'; document.getElementById('form').requestSubmit(); true",
    );
    let stats = wait(&mut page, "document.querySelector('.stats') && document.querySelector('.stats').textContent");
    let reply = page.eval("document.querySelector('.assistant').textContent");
    assert_eq!(reply.as_str(), Some(alone("t5 t17 t99 t3 ", 12).as_str()), "the page shows the streamed reply");
    let stats = stats.as_str().unwrap();
    assert!(stats.starts_with("12 tokens") && stats.contains("tokens/s") && stats.ends_with("length"), "{stats}");
    let png = page.call("Page.captureScreenshot", json!({"format": "png"}))["data"].as_str().map(base64).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let shot = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/nuvec-serve-chat-page.png");
    std::fs::write(&shot, png).unwrap();
    eprintln!("screenshot: {}", shot.display());
    drop(page);
    server.stop().unwrap();
}

/// `tool_choice` required or naming a function: the reply is a call in the template's format
/// whose arguments follow the tool's parameters, even from the tiny random model.
#[test]
fn tool_choice_forces_a_call_through_the_grammar() {
    // The markers as text, and as special tokens (as some tokenizers have them).
    for specials in [&[][..], &[(126, "<tool_call>"), (127, "</tool_call>")][..]] {
        forced_calls(specials);
    }
}

fn forced_calls(specials: &[(u32, &str)]) {
    let mut loaded = byte_level_with(specials);
    loaded.tokenizer.chat_template =
        Some("{% for m in messages %}{{ m.content }}\n{% endfor %}{% if tools %}<tool_call>{% endif %}".into());
    let server = Server::start(loaded, ServeOptions { port: 0, ..Default::default() }).unwrap();
    let addr = server.addr();
    let city = json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 5}},
                      "required": ["city"], "additionalProperties": false});
    let tools = json!([
        {"type": "function", "function": {"name": "weather", "parameters": city}},
        {"type": "function", "function": {"name": "time", "parameters": {"type": "object", "properties": {}, "additionalProperties": false}}}
    ]);
    let ask = json!([{"role": "user", "content": "Weather in Oslo?"}]);
    for (choice, want) in
        [(json!({"type": "function", "function": {"name": "weather"}}), Some("weather")), (json!("required"), None)]
    {
        for stream in [false, true] {
            let body =
                json!({"messages": ask, "tools": tools, "tool_choice": choice, "max_tokens": 80, "stream": stream});
            let calls: Vec<Value> = match stream {
                false => {
                    let (status, r) = post(addr, "/v1/chat/completions", &body);
                    assert_eq!(status, 200, "{r}");
                    assert_eq!(r["choices"][0]["finish_reason"], "tool_calls", "{r}");
                    r["choices"][0]["message"]["tool_calls"].as_array().unwrap().clone()
                }
                true => {
                    let (_, text) = http(addr, "POST", "/v1/chat/completions", &[], body.to_string().as_bytes());
                    let ev = events(&text);
                    let chunks: Vec<Value> =
                        ev[..ev.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
                    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "tool_calls");
                    chunks
                        .iter()
                        .filter_map(|c| c["choices"][0]["delta"].get("tool_calls"))
                        .flat_map(|c| c.as_array().unwrap().clone())
                        .collect()
                }
            };
            assert_eq!(calls.len(), 1, "{calls:?}");
            let name = calls[0]["function"]["name"].as_str().unwrap();
            let args: Value = serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
            match name {
                "weather" => assert!(args["city"].as_str().unwrap().chars().count() <= 5, "{args}"),
                "time" => assert_eq!(args, json!({})),
                other => panic!("a call of {other}"),
            }
            if let Some(w) = want {
                assert_eq!(name, w);
            }
        }
    }
    let body =
        json!({"messages": ask, "tools": tools, "tool_choice": {"type": "function", "function": {"name": "nope"}}});
    let (status, r) = post(addr, "/v1/chat/completions", &body);
    assert_eq!((status, r["error"]["param"].as_str()), (400, Some("tool_choice")));
    server.stop().unwrap();
}

/// The `llm-comply` PyPI suite's OpenAI chat checks (0.5.0) against the scripted model: the
/// text, system prompt, multi-turn, streaming and streaming-usage checks pass. Its tool-calling and image checks
/// need a model that calls tools unforced and reads images, and its error check wants a
/// request without `model` refused, which this server (as mlx-lm's) serves with its model.
/// Needs `NUVEC_IO_PYTHONPATH` holding `llm_comply`, which `.ci/run` installs; without it
/// the test says SKIPPED.
#[test]
fn llm_comply_openai_chat_checks_pass() {
    let Some(mut python) = python("llm_comply_openai_chat_checks_pass") else { return };
    let server = Server::start(tool_caller(), ServeOptions { port: 0, ..Default::default() }).unwrap();
    let checks = [
        "chat-basic-response",
        "chat-system-prompt",
        "chat-multi-turn",
        "chat-streaming-response",
        "chat-streaming-usage",
    ];
    let out = python
        .args(["-m", "llm_comply.cli", "--format", "openai-chat", "-k", "unused", "-m", "scripted", "--json", "-f"])
        .arg(checks.join(","))
        .arg("-u")
        .arg(format!("http://{}/v1", server.addr()))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("No module named 'llm_comply'") {
        eprintln!("SKIPPED llm_comply_openai_chat_checks_pass: no llm_comply package in NUVEC_IO_PYTHONPATH");
        return;
    }
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {stderr}"));
    let results = report["results"].as_array().unwrap();
    assert_eq!(results.len(), checks.len(), "{report:#}");
    for r in results {
        assert_eq!(r["status"], "passed", "{r:#}");
    }
    server.stop().unwrap();
}

/// A model split over two ranks (threads here, over a local group): rank 0 serves, rank 1
/// takes the same steps; greedy, seeded (n = 2) and streamed replies equal the whole model's,
/// an unseeded sampled reply completes (the ranks draw alike), and stopping the server ends the
/// other rank.
#[test]
fn tensor_parallel_server_answers_as_the_whole_model() {
    let mut ranks = nuvec::distributed::Group::local(2).into_iter();
    let (g0, g1) = (ranks.next().unwrap(), ranks.next().unwrap());
    let split = |g: &nuvec::distributed::Group| {
        let options = LoadOptions { dtype: Some(DType::F32), group: Some(g.clone()), ..Default::default() };
        Loaded {
            model: load_model(&fixture(), &options).unwrap(),
            tokenizer: tokenizer(),
            eos: vec![],
            path: fixture(),
        }
    };
    let loaded = split(&g1);
    let follower =
        std::thread::spawn(move || nuvec_serve::follow(loaded, ServeOptions { group: Some(g1), ..Default::default() }));
    let server = Server::start(split(&g0), ServeOptions { port: 0, group: Some(g0), ..Default::default() }).unwrap();
    let whole = start(ServeOptions::default());
    let bodies = [
        ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "t5 t9 t2"}], "max_tokens": 12})),
        ("/v1/completions", json!({"prompt": "t1 t2 t3 ", "max_tokens": 10, "temperature": 0.9, "seed": 3, "n": 2})),
    ];
    for (path, body) in &bodies {
        let (a, b) = (post(server.addr(), path, body), post(whole.addr(), path, body));
        assert_eq!((a.0, &a.1["choices"]), (200, &b.1["choices"]), "{path} {body}");
    }
    let body = json!({"messages": [{"role": "user", "content": "t7 t7"}], "max_tokens": 9, "stream": true});
    let text = |addr| {
        let (status, out) = http(addr, "POST", "/v1/chat/completions", &[], body.to_string().as_bytes());
        assert_eq!(status, 200);
        let chunks: Vec<Value> = events(&out).iter().filter_map(|e| serde_json::from_str(e).ok()).collect();
        chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect::<String>()
    };
    let streamed = text(server.addr());
    assert!(!streamed.is_empty());
    assert_eq!(streamed, text(whole.addr()));
    let sampled = json!({"prompt": "t4", "max_tokens": 6, "temperature": 1.0});
    let (status, reply) = post(server.addr(), "/v1/completions", &sampled);
    assert_eq!((status, &reply["usage"]["completion_tokens"]), (200, &json!(6)), "{reply}");
    server.stop().unwrap();
    whole.stop().unwrap();
    follower.join().unwrap().unwrap();
}
