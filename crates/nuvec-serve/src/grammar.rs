//! Structured output: `response_format` `json_object` and `json_schema` through constrained
//! decoding with llguidance. A request's grammar allows, before each token, only the tokens
//! that keep the reply a prefix of a document the schema accepts ([`Constraint`]).

use std::sync::{Arc, OnceLock};

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{JsonCompileOptions, Matcher, ParserFactory};
use nuvec_lm::Tokenizer;
use nuvec_lm::engine::Constraint;
use serde_json::{Value, json};

use crate::openai::ApiError;
use crate::tools::Format;

/// The tokenizer as llguidance sees it: every token's bytes, in a trie.
struct Env {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.tokenizer.encode(&String::from_utf8_lossy(s), false).unwrap_or_default()
    }
}

/// Compiles requests' grammars for one tokenizer; made on first use (it indexes the
/// vocabulary once).
pub struct Grammars {
    tokenizer: Arc<Tokenizer>,
    eos: u32,
    factory: OnceLock<Result<ParserFactory, String>>,
}

impl Grammars {
    /// Grammars over `tokenizer`'s tokens, ending with token `eos`.
    pub fn new(tokenizer: Arc<Tokenizer>, eos: u32) -> Grammars {
        Grammars { tokenizer, eos, factory: OnceLock::new() }
    }

    fn factory(&self) -> Result<&ParserFactory, String> {
        let made = self.factory.get_or_init(|| {
            let json: Value =
                serde_json::from_str(&self.tokenizer.inner().to_string(false).map_err(|e| e.to_string())?)
                    .map_err(|e| e.to_string())?;
            let mut words = llguidance::token_bytes_from_tokenizer_json(&json).map_err(|e| e.to_string())?;
            let vocab = self.tokenizer.vocab_size().max(words.len());
            words.resize(vocab, Vec::new());
            let info = TokRxInfo::new(vocab as u32, self.eos);
            let trie = TokTrie::from(&info, &words);
            let env: TokEnv = Arc::new(Env { trie, tokenizer: self.tokenizer.clone() });
            let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
            factory.set_stderr_log_level(0);
            Ok(factory)
        });
        made.as_ref().map_err(Clone::clone)
    }

    /// The constraint of a request's `response_format`: `None` for text.
    pub fn response_format(&self, format: &Value) -> Result<Option<Box<dyn Constraint>>, ApiError> {
        let bad = |m: String| ApiError::invalid("response_format", m);
        let schema = match format.get("type").and_then(Value::as_str) {
            Some("text") => return Ok(None),
            Some("json_object") => json!({"type": "object"}),
            Some("json_schema") => {
                let spec = format.get("json_schema").ok_or_else(|| bad("'json_schema' is missing".into()))?;
                match spec.get("schema") {
                    Some(s @ Value::Object(_)) => s.clone(),
                    Some(Value::Bool(true)) | None => json!({}),
                    Some(_) => return Err(bad("'json_schema.schema' must be a JSON schema object".into())),
                }
            }
            _ => return Err(bad("'type' must be text, json_object or json_schema".into())),
        };
        let mut schema = schema;
        if schema.get("x-guidance").is_none() {
            layout().apply_to(&mut schema);
        }
        let factory =
            self.factory().map_err(|e| bad(format!("structured output is not available for this tokenizer: {e}")))?;
        let parser = factory
            .create_parser(TopLevelGrammar::from_json_schema(schema))
            .map_err(|e| bad(format!("the schema cannot be used: {e}")))?;
        Ok(Some(Box::new(Guided(Matcher::new(Ok(parser))))))
    }

    /// The constraint of a forced tool call: the reply is one call (in `format`) of one of
    /// `tools` (an OpenAI `tools` list), or of the one named `name`, its arguments following
    /// the tool's parameter schema.
    pub fn tool_call(
        &self,
        format: Format,
        tools: &Value,
        name: Option<&str>,
    ) -> Result<Box<dyn Constraint>, ApiError> {
        let bad = |m: String| ApiError::invalid("tool_choice", m);
        let key = if format == Format::Llama3 { "parameters" } else { "arguments" };
        let calls: Vec<Value> = tools
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t.get("function"))
            .filter(|f| name.is_none_or(|n| f["name"] == n))
            .map(|f| {
                let params = f.get("parameters").cloned().unwrap_or_else(|| json!({"type": "object"}));
                json!({
                    "type": "object",
                    "properties": {"name": {"const": f["name"]}, key: params},
                    "required": ["name", key],
                    "additionalProperties": false,
                })
            })
            .collect();
        let mut call = json!({"anyOf": calls});
        layout().apply_to(&mut call);
        let lark = match format {
            Format::Hermes => {
                let (open, close) = (self.marker("<tool_call>"), self.marker("</tool_call>"));
                format!("start: {open} \"\\n\" call \"\\n\" {close}\ncall: %json {call}\n")
            }
            Format::Llama3 => format!("start: call\ncall: %json {call}\n"),
            Format::Mistral => {
                let mut list = json!({"type": "array", "items": call, "minItems": 1});
                layout().apply_to(&mut list);
                format!("start: {} calls\ncalls: %json {list}\n", self.marker("[TOOL_CALLS]"))
            }
        };
        let factory =
            self.factory().map_err(|e| bad(format!("forced tool calls are not available for this tokenizer: {e}")))?;
        let parser = factory
            .create_parser(TopLevelGrammar::from_lark(lark))
            .map_err(|e| bad(format!("the tools' parameters cannot be used: {e}")))?;
        Ok(Box::new(Guided(Matcher::new(Ok(parser)))))
    }

    /// A call marker in Lark: the special token it is in this tokenizer (`<[id]>`: a special
    /// token's bytes are not text), or its text.
    fn marker(&self, text: &str) -> String {
        let decoder = self.tokenizer.inner().get_added_tokens_decoder();
        match decoder.iter().find(|(_, t)| t.special && t.content == text) {
            Some((id, _)) => format!("<[{id}]>"),
            None => format!("{text:?}"),
        }
    }
}

/// OpenAI's JSON layout (one space after separators, no other whitespace): a small model free
/// to write whitespace may write nothing else.
fn layout() -> JsonCompileOptions {
    JsonCompileOptions {
        item_separator: ", ".into(),
        key_separator: ": ".into(),
        whitespace_flexible: false,
        ..Default::default()
    }
}

/// A request's grammar as the engine asks it.
struct Guided(Matcher);

impl Constraint for Guided {
    fn allowed(&mut self) -> nuvec_lm::Result<Vec<bool>> {
        let mask = self.0.compute_mask_or_eos().map_err(|e| nuvec_lm::Error::Config(format!("grammar: {e}")))?;
        let mut allowed = vec![false; mask.len()];
        mask.iter_set_entries(|i| allowed[i] = true);
        Ok(allowed)
    }

    fn commit(&mut self, token: u32) -> nuvec_lm::Result<bool> {
        self.0.consume_token(token).map_err(|e| nuvec_lm::Error::Config(format!("grammar: {e}")))?;
        Ok(self.0.is_stopped())
    }
}
