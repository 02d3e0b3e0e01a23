//! Tool calls in a model's output, in the formats chat templates teach: Hermes and Qwen
//! (`<tool_call>{"name": .., "arguments": ..}</tool_call>`), Llama 3 (a bare
//! `{"name": .., "parameters": ..}`, after `<|python_tag|>` or not, several joined by `;`)
//! and Mistral (`[TOOL_CALLS][{"name": .., "arguments": ..}, ..]`).

use serde_json::{Value, json};

/// How a model writes its tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `<tool_call>` blocks of JSON (Hermes, Qwen 2.5 and 3).
    Hermes,
    /// The whole reply a JSON call, or several joined by `;` (Llama 3.1 and later).
    Llama3,
    /// `[TOOL_CALLS]` and a JSON list of calls (Mistral).
    Mistral,
}

impl Format {
    /// The format a chat template teaches, told by the markers it writes.
    pub fn of_template(template: &str) -> Option<Format> {
        if template.contains("<tool_call>") {
            Some(Format::Hermes)
        } else if template.contains("[TOOL_CALLS]") {
            Some(Format::Mistral)
        } else if template.contains("<|python_tag|>") || template.contains("\"parameters\"") {
            Some(Format::Llama3)
        } else {
            None
        }
    }
}

/// A tool call found in the output: the function's name and its arguments (JSON text).
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    /// The function's name.
    pub name: String,
    /// Its arguments, as a JSON text.
    pub arguments: String,
}

impl Call {
    /// OpenAI's `tool_calls` entry, with id `id`.
    pub fn to_json(&self, id: &str) -> Value {
        json!({"id": id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}})
    }
}

/// One call from a JSON object `{"name", "arguments" | "parameters"}`.
fn call(v: &Value) -> Option<Call> {
    let name = v.get("name")?.as_str()?.to_string();
    let args = v.get("arguments").or_else(|| v.get("parameters")).cloned().unwrap_or_else(|| json!({}));
    // Arguments written as a JSON string stay that string.
    let arguments = match args {
        Value::String(s) => s,
        other => other.to_string(),
    };
    Some(Call { name, arguments })
}

/// The text outside tool calls and the calls of a whole reply in `format`. A reply whose
/// calls do not parse is all text.
pub fn parse(format: Format, text: &str) -> (String, Vec<Call>) {
    let whole = || (text.to_string(), Vec::new());
    match format {
        Format::Hermes => {
            let (mut rest, mut calls, mut outside) = (text, Vec::new(), String::new());
            while let Some(start) = rest.find("<tool_call>") {
                let after = &rest[start + "<tool_call>".len()..];
                let Some(end) = after.find("</tool_call>") else { break };
                let Some(c) = serde_json::from_str::<Value>(after[..end].trim()).ok().as_ref().and_then(call) else {
                    return whole();
                };
                outside.push_str(&rest[..start]);
                calls.push(c);
                rest = &after[end + "</tool_call>".len()..];
            }
            outside.push_str(rest);
            (outside.trim().to_string(), calls)
        }
        Format::Llama3 => {
            let body = text.trim();
            let body = body.strip_prefix("<|python_tag|>").unwrap_or(body).trim();
            if !body.starts_with('{') {
                return whole();
            }
            let parts: Option<Vec<Call>> = body
                .split(';')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(|p| serde_json::from_str::<Value>(p).ok().as_ref().and_then(call))
                .collect();
            match parts {
                // A semicolon inside an argument splits wrongly: the whole body as one call.
                None => match serde_json::from_str::<Value>(body).ok().as_ref().and_then(call) {
                    Some(c) => (String::new(), vec![c]),
                    None => whole(),
                },
                Some(calls) => (String::new(), calls),
            }
        }
        Format::Mistral => {
            let Some(at) = text.find("[TOOL_CALLS]") else { return whole() };
            let list = text[at + "[TOOL_CALLS]".len()..].trim();
            match serde_json::from_str::<Value>(list) {
                Ok(Value::Array(items)) => match items.iter().map(call).collect::<Option<Vec<Call>>>() {
                    Some(calls) => (text[..at].trim().to_string(), calls),
                    None => whole(),
                },
                _ => whole(),
            }
        }
    }
}

/// How much of a streamed reply's text may be shown now: the part before anything that
/// is, or may become, a tool call (held until the reply ends and [`parse`] reads it).
pub fn shown(format: Format, text: &str) -> usize {
    match format {
        Format::Hermes => before_marker(text, "<tool_call>"),
        Format::Mistral => before_marker(text, "[TOOL_CALLS]"),
        // A Llama 3 call is the whole reply: one that starts as JSON, or with the tag (or a
        // start of it), waits.
        Format::Llama3 => {
            let t = text.trim_start();
            let maybe = t.is_empty()
                || t.starts_with('{')
                || "<|python_tag|>".starts_with(t)
                || t.starts_with("<|python_tag|>");
            if maybe { 0 } else { text.len() }
        }
    }
}

/// Where `marker` starts in `text`, or, when it does not, where a tail that may begin it
/// starts (the end when none may).
fn before_marker(text: &str, marker: &str) -> usize {
    match text.find(marker) {
        Some(at) => at,
        None => (1..marker.len()).rev().find(|&k| text.ends_with(&marker[..k])).map_or(text.len(), |k| text.len() - k),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(name: &str, arguments: &str) -> Call {
        Call { name: name.into(), arguments: arguments.into() }
    }

    #[test]
    fn calls_parse_in_each_format() {
        let hermes = "Let me look.\n<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>{\"name\": \"time\", \"arguments\": {}}</tool_call>";
        assert_eq!(
            parse(Format::Hermes, hermes),
            ("Let me look.".into(), vec![c("weather", r#"{"city":"Paris"}"#), c("time", "{}")])
        );
        assert_eq!(parse(Format::Hermes, "no calls"), ("no calls".into(), vec![]));
        // A block that is not a call leaves the reply as text.
        assert_eq!(parse(Format::Hermes, "<tool_call>oops</tool_call>").1, vec![]);
        let llama = "<|python_tag|>{\"name\": \"weather\", \"parameters\": {\"city\": \"Oslo\"}}; {\"name\": \"time\", \"parameters\": {\"zone\": \"a;b\"}}";
        // The semicolon inside an argument breaks the split, and the whole is no one call.
        assert_eq!(parse(Format::Llama3, llama).1, vec![]);
        let llama =
            "{\"name\": \"weather\", \"parameters\": {\"city\": \"Oslo\"}}; {\"name\": \"time\", \"parameters\": {}}";
        assert_eq!(
            parse(Format::Llama3, llama),
            (String::new(), vec![c("weather", r#"{"city":"Oslo"}"#), c("time", "{}")])
        );
        assert_eq!(parse(Format::Llama3, "Hello {there}").1, vec![]);
        let mistral = "[TOOL_CALLS][{\"name\": \"weather\", \"arguments\": {\"city\": \"Rome\"}}]";
        assert_eq!(parse(Format::Mistral, mistral), (String::new(), vec![c("weather", r#"{"city":"Rome"}"#)]));
    }

    #[test]
    fn streamed_text_waits_where_a_call_may_start() {
        assert_eq!(shown(Format::Hermes, "Hi <tool"), 3);
        assert_eq!(shown(Format::Hermes, "Hi <tool_call>{"), 3);
        assert_eq!(shown(Format::Hermes, "Hi there"), 8);
        assert_eq!(shown(Format::Llama3, "{\"na"), 0);
        assert_eq!(shown(Format::Llama3, "<|pyth"), 0);
        assert_eq!(shown(Format::Llama3, "Sure"), 4);
        assert_eq!(shown(Format::Mistral, "ok [TOOL"), 3);
    }

    #[test]
    fn templates_tell_their_format() {
        assert_eq!(Format::of_template("{{ '<tool_call>' }}"), Some(Format::Hermes));
        assert_eq!(Format::of_template("<|python_tag|>"), Some(Format::Llama3));
        assert_eq!(Format::of_template("[TOOL_CALLS]"), Some(Format::Mistral));
        assert_eq!(Format::of_template("{{ messages }}"), None);
    }
}
