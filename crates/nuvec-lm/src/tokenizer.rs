//! Tokenizers through the `tokenizers` crate: from a Hugging Face `tokenizer.json` (with
//! `tokenizer_config.json`'s special tokens and chat template), or built from a GGUF file's
//! vocabulary, merges and pre-tokenizer name.

use std::collections::BTreeMap;
use std::path::Path;

use nuvec::io::GgufValue;
use serde_json::{Value, json};

use crate::{Error, Result};

/// A tokenizer and the facts generation needs: special tokens and the chat template.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// The beginning-of-sequence token, if the model has one.
    pub bos: Option<(u32, String)>,
    /// Tokens that end generation.
    pub eos: Vec<u32>,
    /// Prepend `bos` when encoding with special tokens (GGUF's `add_bos_token`; a
    /// `tokenizer.json` does it in its post-processor).
    prepend_bos: bool,
    /// The Jinja chat template, if any.
    pub chat_template: Option<String>,
}

fn tok_error(what: impl std::fmt::Display) -> Error {
    Error::Tokenizer(what.to_string())
}

impl Tokenizer {
    /// A tokenizer from the text of a `tokenizer.json`, with no special tokens or template.
    pub fn from_json(text: &str) -> Result<Tokenizer> {
        let inner: tokenizers::Tokenizer = text.parse().map_err(tok_error)?;
        Ok(Tokenizer { inner, bos: None, eos: Vec::new(), prepend_bos: false, chat_template: None })
    }

    /// Reads `dir/tokenizer.json` and, when present, `dir/tokenizer_config.json`.
    pub fn from_dir(dir: &Path) -> Result<Tokenizer> {
        let path = dir.join("tokenizer.json");
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        let inner: tokenizers::Tokenizer = text.parse().map_err(|e| tok_error(format!("{}: {e}", path.display())))?;
        let config: Value = match std::fs::read_to_string(dir.join("tokenizer_config.json")) {
            Ok(t) => serde_json::from_str(&t).map_err(|e| tok_error(format!("tokenizer_config.json: {e}")))?,
            Err(_) => Value::Null,
        };
        let token = |key: &str| -> Option<(u32, String)> {
            let name = match config.get(key)? {
                Value::String(s) => s.clone(),
                v => v.get("content")?.as_str()?.to_string(),
            };
            Some((inner.token_to_id(&name)?, name))
        };
        let chat_template = match config.get("chat_template") {
            Some(Value::String(s)) => Some(s.clone()),
            // A list of named templates: the default one.
            Some(Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                .or(list.first())
                .and_then(|t| t.get("template")?.as_str().map(str::to_string)),
            _ => std::fs::read_to_string(dir.join("chat_template.jinja")).ok(),
        };
        Ok(Tokenizer {
            bos: token("bos_token"),
            eos: token("eos_token").map(|(id, _)| id).into_iter().collect(),
            prepend_bos: false,
            chat_template,
            inner,
        })
    }

    /// The tokenizer a GGUF file describes (`tokenizer.ggml.*`): GPT-2-style byte-level BPE
    /// with the pre-tokenizer its `tokenizer.ggml.pre` names.
    pub fn from_gguf(meta: &BTreeMap<String, GgufValue>) -> Result<Tokenizer> {
        let get = |k: &str| meta.get(&format!("tokenizer.ggml.{k}"));
        let strings = |k: &str| -> Result<Vec<String>> {
            match get(k) {
                Some(GgufValue::Array(a)) => a
                    .iter()
                    .map(|v| {
                        v.as_str()
                            .map(str::to_string)
                            .ok_or_else(|| tok_error(format!("GGUF: tokenizer.ggml.{k} holds a non-string")))
                    })
                    .collect(),
                _ => Err(tok_error(format!("GGUF: no tokenizer.ggml.{k}"))),
            }
        };
        let model = get("model").and_then(GgufValue::as_str).unwrap_or("");
        if model != "gpt2" && model != "llama" {
            return Err(tok_error(format!(
                "GGUF tokenizer model '{model}' is not supported (byte-level BPE, 'gpt2', and \
                 SentencePiece BPE, 'llama', are); give the model's tokenizer.json instead"
            )));
        }
        let tokens = strings("tokens")?;
        let types: Vec<u64> = match get("token_type") {
            Some(GgufValue::Array(a)) => a.iter().map(|v| v.as_u64().unwrap_or(1)).collect(),
            _ => vec![1; tokens.len()],
        };
        let vocab: serde_json::Map<String, Value> =
            tokens.iter().enumerate().map(|(i, t)| (t.clone(), Value::from(i as u64))).collect();
        // Control (3) and user-defined (4) tokens are matched whole, before the pre-tokenizer.
        let added: Vec<Value> = tokens
            .iter()
            .enumerate()
            .filter(|(i, _)| matches!(types.get(*i), Some(3 | 4)))
            .map(|(i, t)| {
                json!({"id": i, "content": t, "single_word": false, "lstrip": false, "rstrip": false,
                       "normalized": false, "special": types[i] == 3})
            })
            .collect();
        let spec = if model == "llama" {
            let scores: Vec<f32> = match get("scores") {
                Some(GgufValue::Array(a)) => a.iter().map(|v| v.as_f64().unwrap_or(0.0) as f32).collect(),
                _ => vec![0.0; tokens.len()],
            };
            let space_prefix = !matches!(get("add_space_prefix"), Some(GgufValue::Bool(false)));
            let unk = id_of(get("unknown_token_id")).and_then(|i| tokens.get(i as usize)).cloned();
            sentencepiece_spec(&tokens, &scores, vocab, added, space_prefix, unk)
        } else {
            let pre = get("pre").and_then(GgufValue::as_str).unwrap_or("default");
            // Llama 3 takes a word found whole in the vocabulary as it is (llama.cpp, tokenizer.json).
            let ignore_merges = matches!(pre, "llama-bpe" | "llama3" | "llama-v3");
            json!({
                "version": "1.0",
                "truncation": null,
                "padding": null,
                "added_tokens": added,
                "normalizer": null,
                "pre_tokenizer": pre_tokenizer(pre)?,
                "post_processor": null,
                "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
                "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                          "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                          "ignore_merges": ignore_merges, "vocab": vocab, "merges": strings("merges")?}
            })
        };
        let inner: tokenizers::Tokenizer =
            spec.to_string().parse().map_err(|e| tok_error(format!("GGUF tokenizer: {e}")))?;
        let id = |k: &str| id_of(get(k));
        let bos = id("bos_token_id").and_then(|i| Some((i, tokens.get(i as usize)?.clone())));
        let add_bos = matches!(get("add_bos_token"), Some(GgufValue::Bool(true)));
        Ok(Tokenizer {
            bos,
            eos: id("eos_token_id").into_iter().chain(id("eot_token_id")).collect(),
            prepend_bos: add_bos,
            chat_template: meta.get("tokenizer.chat_template").and_then(GgufValue::as_str).map(str::to_string),
            inner,
        })
    }

    /// The ids of `text`; `special` adds the model's special tokens (a BOS) as the tokenizer
    /// defines them.
    pub fn encode(&self, text: &str, special: bool) -> Result<Vec<u32>> {
        let enc = self.inner.encode(text, special).map_err(tok_error)?;
        let mut ids = enc.get_ids().to_vec();
        if special
            && self.prepend_bos
            && let Some((bos, _)) = self.bos
            && ids.first() != Some(&bos)
        {
            ids.insert(0, bos);
        }
        Ok(ids)
    }

    /// The text of `ids`, special tokens included.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, false).map_err(tok_error)
    }

    /// An incremental decoder: each id's new text, never splitting a UTF-8 character.
    pub fn stream(&self) -> Detokenizer<'_> {
        Detokenizer { ids: Vec::new(), tokenizer: self, emitted: 0 }
    }

    /// The id of `token`, if it is in the vocabulary.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Tokens in the vocabulary, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The `tokenizers` tokenizer underneath.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// The prompt text of `messages` (a JSON list of `{"role", "content", ..}`) and `tools`:
    /// the chat template's rendering, ending with the assistant's header, or the last
    /// message's content as is when the model has no template.
    pub fn chat_prompt(&self, messages: &Value, tools: Option<&Value>) -> Result<String> {
        match &self.chat_template {
            Some(source) => {
                let bos = self.bos.as_ref().map(|b| b.1.clone()).unwrap_or_default();
                let eos = self.eos.first().and_then(|&e| self.inner.id_to_token(e)).unwrap_or_default();
                crate::ChatTemplate::new(source.clone(), bos, eos).render(messages, tools, true, None)
            }
            None => {
                let last = messages.as_array().and_then(|m| m.last());
                Ok(last.and_then(|m| m["content"].as_str()).unwrap_or("").to_string())
            }
        }
    }

    /// The ids of a prompt's text: a BOS is added unless the text (a rendered template)
    /// already starts with it.
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>> {
        let has_bos = self.bos.as_ref().is_some_and(|(_, b)| text.starts_with(b.as_str()));
        self.encode(text, !has_bos)
    }
}

/// A token id stored in GGUF metadata.
fn id_of(v: Option<&GgufValue>) -> Option<u32> {
    v.and_then(GgufValue::as_u64).map(|v| v as u32)
}

/// A SentencePiece BPE vocabulary (llama.cpp's `llama` tokenizer model) as transformers'
/// fast Llama tokenizer builds it: a space prefix and `▁` for spaces, byte fallback, and the
/// merges derived from the pieces' scores (every split of a piece into two pieces, the merge
/// of a higher-scored piece first; ties in vocabulary order), as `SentencePieceExtractor`.
fn sentencepiece_spec(
    tokens: &[String],
    scores: &[f32],
    vocab: serde_json::Map<String, Value>,
    added: Vec<Value>,
    space_prefix: bool,
    unk: Option<String>,
) -> Value {
    let index: std::collections::HashMap<&str, usize> =
        tokens.iter().enumerate().map(|(i, t)| (t.as_str(), i)).collect();
    let mut merges: Vec<(f32, &str, &str)> = Vec::new();
    for (i, piece) in tokens.iter().enumerate() {
        let mut local: Vec<(usize, usize, &str, &str)> = piece
            .char_indices()
            .skip(1)
            .filter_map(|(k, _)| {
                let (l, r) = piece.split_at(k);
                Some((*index.get(l)?, *index.get(r)?, l, r))
            })
            .collect();
        local.sort();
        let score = scores.get(i).copied().unwrap_or(0.0);
        merges.extend(local.into_iter().map(|(_, _, l, r)| (score, l, r)));
    }
    // Stable: equal scores keep the order above.
    merges.sort_by(|a, b| b.0.total_cmp(&a.0));
    let merges: Vec<Value> = merges.into_iter().map(|(_, l, r)| json!([l, r])).collect();
    let mut normalizers = Vec::new();
    if space_prefix {
        normalizers.push(json!({"type": "Prepend", "prepend": "\u{2581}"}));
    }
    normalizers.push(json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"}));
    let mut decoders = vec![
        json!({"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    if space_prefix {
        decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    }
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": normalizers},
        "pre_tokenizer": null,
        "post_processor": null,
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {"type": "BPE", "dropout": null, "unk_token": unk, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true,
                  "ignore_merges": false, "vocab": vocab, "merges": merges}
    })
}
/// The `tokenizer.json` pre-tokenizer of llama.cpp's pre-tokenizer name.
fn pre_tokenizer(pre: &str) -> Result<Value> {
    let byte_level =
        |regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": regex});
    let split = |pattern: &str| json!({"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false});
    const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    let steps = match pre {
        "default" | "gpt-2" | "gpt2" => vec![byte_level(true)],
        "smollm" => vec![json!({"type": "Digits", "individual_digits": true}), byte_level(true)],
        "llama-bpe" | "llama3" | "llama-v3" => vec![split(LLAMA3), byte_level(false)],
        "qwen2" => vec![split(QWEN2), byte_level(false)],
        other => {
            return Err(tok_error(format!(
                "GGUF pre-tokenizer '{other}' is not supported (default, gpt-2, smollm, llama-bpe, qwen2 are); \
                 give the model's tokenizer.json instead"
            )));
        }
    };
    Ok(json!({"type": "Sequence", "pretokenizers": steps}))
}

/// Turns ids into text as they come ([`Tokenizer::stream`]): decodes the ids since the last
/// line break and hands out what is new, holding back a trailing incomplete character.
pub struct Detokenizer<'a> {
    tokenizer: &'a Tokenizer,
    ids: Vec<u32>,
    emitted: usize,
}

impl Detokenizer<'_> {
    /// Adds `id`; returns the text that became certain (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.ids.push(id);
        let text = self.tokenizer.decode(&self.ids)?;
        if text.ends_with('\u{FFFD}') || text.len() < self.emitted {
            return Ok(String::new());
        }
        let new = text.get(self.emitted..).unwrap_or("").to_string();
        if text.ends_with('\n') {
            // A line break ends every merge: keep only it, so decodes stay short and a
            // decoder that drops a leading space still sees a token before the next one.
            self.ids = vec![id];
            self.emitted = self.tokenizer.decode(&self.ids)?.len();
        } else {
            self.emitted = text.len();
        }
        Ok(new)
    }

    /// What is left when generation ends (an incomplete character as U+FFFD).
    pub fn finish(&mut self) -> Result<String> {
        let text = self.tokenizer.decode(&self.ids)?;
        let rest = text.get(self.emitted..).unwrap_or("").to_string();
        self.ids.clear();
        self.emitted = 0;
        Ok(rest)
    }
}
