//! A model's own chat template (Jinja), rendered as transformers' `apply_chat_template`
//! renders it: `trim_blocks` and `lstrip_blocks` on, loop controls, Python's string methods,
//! transformers' `tojson` and `raise_exception`, the tokenizer's special tokens as variables,
//! and `{% generation %}` blocks, whose output spans are the assistant tokens
//! (`return_assistant_tokens_mask`).
//!
//! `strftime_now` is deliberately not defined: templates that use it (Llama 3's) then take
//! their fixed fallback date, so the same data renders to the same bytes on every day.

use std::ops::Range;

use minijinja::syntax::SyntaxConfig;
use minijinja::{Environment, Error, ErrorKind, Value};

use super::tojson::tojson;
use crate::data::error::DataError;

/// Noncharacters (never valid in interchange text) that bracket the output of a
/// `{% generation %}` block while rendering; removed before anything sees the text.
const GEN_OPEN: char = '\u{FDD0}';
const GEN_CLOSE: char = '\u{FDD1}';
const GEN_FILTER: &str = "__mindxtrain_generation";
const NAME: &str = "chat_template";

/// A compiled chat template with the variables every render gets.
#[derive(Debug)]
pub struct JinjaTemplate {
    env: Environment<'static>,
    /// Where the template came from (`DIR/tokenizer_config.json`, a `.jinja` file).
    pub origin: String,
    /// BLAKE3 (hex) of the template's source text, as the model ships it.
    pub blake3: String,
    /// Whether the template marks assistant output with `{% generation %}`.
    pub has_generation: bool,
    /// The `enable_thinking` every render gets (Qwen3: `false` puts an empty think block
    /// into the generation prompt).
    pub enable_thinking: bool,
    /// The tokenizer's control tokens, which message text may not hold.
    pub control_tokens: Vec<String>,
    vars: Vec<(String, Value)>,
}

/// What a template is rendered with besides the conversation.
#[derive(Debug, Clone, Default)]
pub struct TemplateContext {
    /// The tokenizer's special tokens by role (`bos_token`, `eos_token`, ...).
    pub vars: Vec<(String, Value)>,
    pub enable_thinking: bool,
    pub control_tokens: Vec<String>,
}

/// A rendered conversation: the text, and the byte ranges `{% generation %}` blocks wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    pub text: String,
    pub generation: Vec<Range<usize>>,
}

impl JinjaTemplate {
    /// Compiles `source`; `origin` names it in errors and in the manifest.
    pub fn new(source: &str, origin: &str, context: TemplateContext) -> Result<JinjaTemplate, DataError> {
        let TemplateContext { mut vars, enable_thinking, control_tokens } = context;
        let err = |e: Error| DataError::Template { origin: origin.to_owned(), message: describe(&e) };
        let (rewritten, has_generation) = rewrite_generation_tags(source);
        let mut env = Environment::new();
        env.set_syntax(SyntaxConfig::builder().trim_blocks(true).lstrip_blocks(true).build().map_err(err)?);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_filter(GEN_FILTER, |body: String| format!("{GEN_OPEN}{body}{GEN_CLOSE}"));
        env.add_function("raise_exception", |message: String| -> Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, message))
        });
        env.add_template_owned(NAME, rewritten).map_err(err)?;
        vars.push(("enable_thinking".into(), Value::from(enable_thinking)));
        Ok(JinjaTemplate {
            env,
            origin: origin.to_owned(),
            blake3: blake3::hash(source.as_bytes()).to_hex().to_string(),
            has_generation,
            enable_thinking,
            control_tokens,
            vars,
        })
    }

    /// Renders `messages` (a list of message maps) with `tools` (a list, or none).
    pub fn render(&self, messages: &Value, tools: &Value, add_generation_prompt: bool) -> Result<Rendered, DataError> {
        let mut ctx: Vec<(String, Value)> = self.vars.clone();
        ctx.push(("messages".into(), messages.clone()));
        ctx.push(("tools".into(), tools.clone()));
        ctx.push(("documents".into(), Value::from(())));
        ctx.push(("add_generation_prompt".into(), Value::from(add_generation_prompt)));
        let template = self.env.get_template(NAME).map_err(|e| self.error(&e))?;
        let marked = template.render(Value::from_pairs(ctx)).map_err(|e| self.error(&e))?;
        let mut text = String::with_capacity(marked.len());
        let mut generation = Vec::new();
        let mut open = None;
        for c in marked.chars() {
            match c {
                GEN_OPEN => open = Some(text.len()),
                GEN_CLOSE => {
                    if let Some(start) = open.take()
                        && start < text.len()
                    {
                        generation.push(start..text.len());
                    }
                }
                c => text.push(c),
            }
        }
        Ok(Rendered { text, generation })
    }

    fn error(&self, e: &Error) -> DataError {
        DataError::Template { origin: self.origin.clone(), message: describe(e) }
    }
}

/// The error with the template line it points at.
fn describe(e: &Error) -> String {
    let mut message = match e.kind() {
        // raise_exception's message is the template author's; show it as written.
        ErrorKind::InvalidOperation => e.detail().map_or_else(|| e.to_string(), str::to_owned),
        _ => e.to_string(),
    };
    if let Some(line) = e.line() {
        message.push_str(&format!(" (template line {line})"));
    }
    message
}

/// `{% generation %}` / `{% endgeneration %}` (transformers' `AssistantTracker` tags) become a
/// filter block that marks its output. A filter block is a block tag like the one it replaces,
/// so `trim_blocks`, `lstrip_blocks` and `-`/`+` markers act on it exactly as on the original.
fn rewrite_generation_tags(source: &str) -> (String, bool) {
    let mut out = String::with_capacity(source.len() + 64);
    let mut rest = source;
    let mut found = false;
    while let Some(at) = rest.find("{%") {
        out.push_str(&rest[..at]);
        let tag = &rest[at..];
        match parse_generation_tag(tag) {
            Some((len, open_marker, name, close_marker)) => {
                found = true;
                let body = if name == "generation" { format!("filter {GEN_FILTER}") } else { "endfilter".to_owned() };
                out.push_str(&format!("{{%{open_marker} {body} {close_marker}%}}"));
                rest = &tag[len..];
            }
            None => {
                out.push_str("{%");
                rest = &tag[2..];
            }
        }
    }
    out.push_str(rest);
    (out, found)
}

/// `{%[-+]? (end)?generation [-+]?%}` at the start of `tag`: its length, its markers and name.
fn parse_generation_tag(tag: &str) -> Option<(usize, &str, &str, &str)> {
    let inner = &tag[2..];
    let open_marker = if inner.starts_with(['-', '+']) { &inner[..1] } else { "" };
    let after_open = inner[open_marker.len()..].trim_start();
    let name = ["endgeneration", "generation"].into_iter().find(|n| after_open.starts_with(n))?;
    let after_name = &after_open[name.len()..];
    let trimmed = after_name.trim_start();
    if trimmed.len() == after_name.len() && !trimmed.starts_with(['-', '+', '%']) {
        return None; // `generation_prompt`, `generations`: another word
    }
    let close_marker = if trimmed.starts_with(['-', '+']) { &trimmed[..1] } else { "" };
    let end = trimmed[close_marker.len()..].strip_prefix("%}")?;
    Some((tag.len() - end.len(), open_marker, name, close_marker))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_tags_become_filter_blocks_with_their_markers() {
        let (s, found) = rewrite_generation_tags("a{%- generation %}b{% endgeneration -%}c{% if x %}{% endif %}");
        assert!(found);
        assert_eq!(s, format!("a{{%- filter {GEN_FILTER} %}}b{{% endfilter -%}}c{{% if x %}}{{% endif %}}"));
        let (s, found) = rewrite_generation_tags("{% set generation_prompt = 1 %}{%generation%}x{%endgeneration%}");
        assert!(found);
        assert!(s.starts_with("{% set generation_prompt = 1 %}"), "{s}");
        assert!(!rewrite_generation_tags("{{ '{%' }}").1);
    }

    #[test]
    fn generation_spans_are_byte_ranges_of_the_clean_text() {
        let t = JinjaTemplate::new(
            "{% for m in messages %}{% if m.role == 'assistant' %}[A]{% generation %}{{ m.content }}!{% endgeneration %}\n{% else %}[U]{{ m.content }}\n{% endif %}{% endfor %}",
            "test",
            TemplateContext::default(),
        )
        .unwrap();
        let messages = super::super::labels::json_value(
            crate::data::Json::parse(
                &serde_json::to_string(&serde_json::json!([
                    {"role": "user", "content": "hé"}, {"role": "assistant", "content": "ok"},
                    {"role": "user", "content": "q"}, {"role": "assistant", "content": "yes"}
                ]))
                .unwrap(),
            )
            .unwrap(),
        );
        let r = t.render(&messages, &Value::from(()), false).unwrap();
        // trim_blocks eats the newline after `{% endgeneration %}`, as Jinja2 does.
        assert_eq!(r.text, "[U]hé\n[A]ok![U]q\n[A]yes!");
        let spans: Vec<&str> = r.generation.iter().map(|s| &r.text[s.clone()]).collect();
        assert_eq!(spans, ["ok!", "yes!"]);
    }

    #[test]
    fn raise_exception_and_syntax_errors_name_the_template() {
        let t = JinjaTemplate::new(
            "{{ raise_exception('roles must alternate') }}",
            "m/tokenizer_config.json",
            TemplateContext::default(),
        )
        .unwrap();
        let err = t.render(&Value::from(Vec::<Value>::new()), &Value::from(()), false).unwrap_err();
        assert!(
            err.to_string().contains("m/tokenizer_config.json") && err.to_string().contains("roles must alternate"),
            "{err}"
        );
        let err = JinjaTemplate::new("{% for %}", "bad.jinja", TemplateContext::default()).unwrap_err();
        assert!(err.to_string().contains("bad.jinja") && err.to_string().contains("line 1"), "{err}");
    }

    #[test]
    fn tojson_writes_what_python_json_dumps_writes() {
        let t = JinjaTemplate::new(
            "{{ x | tojson }}|{{ x | tojson(indent=2) }}|{{ x | tojson(separators=(',', ':'), sort_keys=true) }}|{{ 'é<' | tojson }}|{{ 'é' | tojson(ensure_ascii=true) }}",
            "t",
            TemplateContext {
                vars: vec![("x".into(), super::super::labels::json_value(crate::data::Json::parse(r#"{"b": [1, 2.5, null, true], "a": {}}"#).unwrap()))],
                ..TemplateContext::default()
            },
        )
        .unwrap();
        let r = t.render(&Value::from(()), &Value::from(()), false).unwrap();
        assert_eq!(
            r.text,
            "{\"b\": [1, 2.5, null, true], \"a\": {}}|{\n  \"b\": [\n    1,\n    2.5,\n    null,\n    true\n  ],\n  \"a\": {}\n}|{\"a\":{},\"b\":[1,2.5,null,true]}|\"é<\"|\"\\u00e9\""
        );
    }
}
