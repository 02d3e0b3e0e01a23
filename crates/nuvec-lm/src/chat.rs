//! Chat templates: a model's Jinja template rendered through `minijinja` with what Hugging
//! Face's `apply_chat_template` provides (`messages`, `tools`, `add_generation_prompt`, the
//! special tokens, `raise_exception`, `strftime_now`, Python's `tojson` and string methods).

use minijinja::value::{Kwargs, Value as JValue};
use minijinja::{Environment, Error as JError, ErrorKind};
use serde_json::Value;

use crate::{Error, Result};

/// A chat template and the special tokens it may print.
pub struct ChatTemplate {
    source: String,
    bos_token: String,
    eos_token: String,
}

impl ChatTemplate {
    /// The template `source`, with the texts of the model's BOS and EOS tokens.
    pub fn new(source: impl Into<String>, bos_token: impl Into<String>, eos_token: impl Into<String>) -> ChatTemplate {
        ChatTemplate { source: source.into(), bos_token: bos_token.into(), eos_token: eos_token.into() }
    }

    /// The prompt of `messages` (a JSON list of `{"role", "content", ..}`), with `tools`
    /// (a JSON list of function specs) when given, ending with the assistant's header when
    /// `add_generation_prompt`. `extra` (a JSON object) adds variables, such as
    /// `enable_thinking`. A template error, or one the template raises, names its reason.
    pub fn render(
        &self,
        messages: &Value,
        tools: Option<&Value>,
        add_generation_prompt: bool,
        extra: Option<&Value>,
    ) -> Result<String> {
        let mut env = Environment::new();
        // As transformers' environment: a block tag's line break and indentation are dropped.
        let syntax = minijinja::syntax::SyntaxConfig::builder().trim_blocks(true).lstrip_blocks(true).build();
        env.set_syntax(syntax.map_err(template_error)?);
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> std::result::Result<JValue, JError> {
            Err(JError::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_function("strftime_now", |format: String| strftime_now(&format));
        env.add_filter("tojson", tojson);
        let template = env.template_from_str(&self.source).map_err(template_error)?;
        let mut vars = serde_json::Map::new();
        if let Some(Value::Object(extra)) = extra {
            vars.extend(extra.clone());
        }
        vars.insert("messages".into(), messages.clone());
        if let Some(t) = tools {
            vars.insert("tools".into(), t.clone());
        }
        vars.insert("add_generation_prompt".into(), Value::Bool(add_generation_prompt));
        vars.insert("bos_token".into(), Value::from(self.bos_token.clone()));
        vars.insert("eos_token".into(), Value::from(self.eos_token.clone()));
        template.render(JValue::from(minijinja::value::Serde(&vars))).map_err(template_error)
    }
}

fn template_error(e: JError) -> Error {
    let mut msg = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        msg.push_str(&format!(": {s}"));
        source = s.source();
    }
    Error::Template(msg)
}

/// Python's `json.dumps(value, ensure_ascii=False, indent=..)`, as transformers' `tojson`:
/// `", "` and `": "` separators, keys in their order, `indent` spaces per level when given.
fn tojson(value: JValue, kwargs: Kwargs) -> std::result::Result<JValue, JError> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value).map_err(|e| JError::new(ErrorKind::BadSerialization, e.to_string()))?;
    let (item, key) = match &separators {
        Some(s) if s.len() == 2 => (s[0].clone(), s[1].clone()),
        _ if indent.is_some() => (",".into(), ": ".into()),
        _ => (", ".into(), ": ".into()),
    };
    let style = PyJson { indent, item, key, ascii: ensure_ascii.unwrap_or(false), sort: sort_keys.unwrap_or(false) };
    let mut out = String::new();
    style.write(&json, 0, &mut out);
    Ok(JValue::from_safe_string(out))
}

/// The layout of Python's `json.dumps`.
struct PyJson {
    indent: Option<usize>,
    item: String,
    key: String,
    ascii: bool,
    sort: bool,
}

impl PyJson {
    fn write(&self, v: &Value, level: usize, out: &mut String) {
        let newline = |out: &mut String, level: usize| {
            if let Some(n) = self.indent {
                out.push('\n');
                out.push_str(&" ".repeat(n * level));
            }
        };
        match v {
            Value::String(s) => self.string(s, out),
            Value::Array(a) if !a.is_empty() => {
                out.push('[');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item);
                    }
                    newline(out, level + 1);
                    self.write(x, level + 1, out);
                }
                newline(out, level);
                out.push(']');
            }
            Value::Object(m) if !m.is_empty() => {
                let mut entries: Vec<(&String, &Value)> = m.iter().collect();
                if self.sort {
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                out.push('{');
                for (i, (k, x)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item);
                    }
                    newline(out, level + 1);
                    self.string(k, out);
                    out.push_str(&self.key);
                    self.write(x, level + 1, out);
                }
                newline(out, level);
                out.push('}');
            }
            other => out.push_str(&other.to_string()),
        }
    }

    fn string(&self, s: &str, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ascii && !c.is_ascii()) => {
                    let mut buf = [0u16; 2];
                    for unit in c.encode_utf16(&mut buf) {
                        out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// Today's date and time (UTC) in a `strftime` format: `%Y %m %d %B %b %A %a %H %M %S %%`.
fn strftime_now(format: &str) -> std::result::Result<String, JError> {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    Ok(strftime(format, secs as i64))
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = ["Thursday", "Friday", "Saturday", "Sunday", "Monday", "Tuesday", "Wednesday"];

/// `format` for the UTC time `secs` after 1970-01-01 (the civil-from-days algorithm).
fn strftime(format: &str, secs: i64) -> String {
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('B') => out.push_str(MONTHS[month as usize - 1]),
            Some('b') => out.push_str(&MONTHS[month as usize - 1][..3]),
            Some('A') => out.push_str(DAYS[days.rem_euclid(7) as usize]),
            Some('a') => out.push_str(&DAYS[days.rem_euclid(7) as usize][..3]),
            Some('H') => out.push_str(&format!("{:02}", rem / 3600)),
            Some('M') => out.push_str(&format!("{:02}", rem / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", rem % 60)),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_matches_known_dates() {
        // A leap day's afternoon, a Thursday.
        assert_eq!(strftime("%d %B %Y %a %H:%M:%S", 1_709_211_909), "29 February 2024 Thu 13:05:09");
        assert_eq!(strftime("%Y-%m-%d %A %b %%", 0), "1970-01-01 Thursday Jan %");
    }

    #[test]
    fn tojson_is_pythons_layout() {
        let t = ChatTemplate::new(
            "{{ x | tojson }}|{{ x | tojson(indent=2) }}|{{ 'é' | tojson(ensure_ascii=True) }}",
            "",
            "",
        );
        let x = serde_json::json!({"b": [1, "a<b"], "a": {}});
        let out = t.render(&serde_json::json!([]), None, false, Some(&serde_json::json!({"x": x}))).unwrap();
        assert_eq!(
            out,
            "{\"b\": [1, \"a<b\"], \"a\": {}}|{\n  \"b\": [\n    1,\n    \"a<b\"\n  ],\n  \"a\": {}\n}|\"\\u00e9\""
        );
    }

    #[test]
    fn raise_exception_is_an_error() {
        let t = ChatTemplate::new("{{ raise_exception('only user and assistant roles') }}", "", "");
        let e = t.render(&serde_json::json!([]), None, false, None).unwrap_err();
        assert!(e.to_string().contains("only user and assistant roles"), "{e}");
    }
}
