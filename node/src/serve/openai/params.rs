//! Every request parameter of `POST /v1/chat/completions` this server knows, and what it does
//! with each: one table, which the request reader goes by and docs/formats.md lists (a test
//! keeps the two equal).
//!
//! A parameter is honoured, or accepted only at the value that changes nothing (carried out
//! trivially: `presence_penalty: 0`), or refused whatever its value. `null` is the same as
//! leaving a parameter out. A name in no table is refused as OpenAI refuses it
//! ("Unrecognized request argument supplied").

use serde_json::Value;

/// What the server does with a parameter.
#[derive(Debug, Clone, Copy)]
pub enum Treatment {
    /// Carried out (the request reader reads it; `note` says how far).
    Honoured,
    /// Only `neutral` (written as docs/formats.md shows it) is accepted: it changes nothing, so
    /// it is carried out; any other value is a 400 saying it is not supported yet.
    Neutral { neutral: &'static str, is: fn(&Value) -> bool },
    /// Not supported yet, whatever its value.
    Refused,
}

/// One parameter of the table.
#[derive(Debug, Clone, Copy)]
pub struct Param {
    pub name: &'static str,
    pub treatment: Treatment,
    /// What is carried out, or why it is refused (for the docs and the error message).
    pub note: &'static str,
}

const fn honoured(name: &'static str, note: &'static str) -> Param {
    Param { name, treatment: Treatment::Honoured, note }
}

const fn neutral(name: &'static str, neutral: &'static str, is: fn(&Value) -> bool, note: &'static str) -> Param {
    Param { name, treatment: Treatment::Neutral { neutral, is }, note }
}

const fn refused(name: &'static str, note: &'static str) -> Param {
    Param { name, treatment: Treatment::Refused, note }
}

fn zero(v: &Value) -> bool {
    v.as_f64() == Some(0.0)
}
fn one(v: &Value) -> bool {
    v.as_f64() == Some(1.0)
}
fn is_false(v: &Value) -> bool {
    v == &Value::Bool(false)
}
fn is_true(v: &Value) -> bool {
    v == &Value::Bool(true)
}
fn empty_object(v: &Value) -> bool {
    v.as_object().is_some_and(|o| o.is_empty())
}
fn empty_array(v: &Value) -> bool {
    v.as_array().is_some_and(|a| a.is_empty())
}
fn text_format(v: &Value) -> bool {
    v.as_object().is_some_and(|o| o.len() == 1 && o.get("type").and_then(Value::as_str) == Some("text"))
}
fn text_modality(v: &Value) -> bool {
    v.as_array().is_some_and(|a| a.len() == 1 && a[0].as_str() == Some("text"))
}
fn standard_tier(v: &Value) -> bool {
    matches!(v.as_str(), Some("auto" | "default"))
}

/// The body's top-level parameters: OpenAI's, then the vLLM extensions clients send to
/// OpenAI-compatible servers.
pub const PARAMS: &[Param] = &[
    honoured("model", "the checkpoint's id or an `--adapter` id"),
    honoured("messages", "see the message fields below"),
    honoured("max_completion_tokens", "cut to what the context leaves"),
    honoured("max_tokens", "as `max_completion_tokens`"),
    honoured("temperature", "0–2; 0 is greedy"),
    honoured("top_p", "(0, 1]"),
    honoured("seed", "the same seed gives the same answer"),
    honoured("stop", "up to 4 strings; the answer ends before the first"),
    honoured("stream", "server-sent `chat.completion.chunk`s"),
    honoured("stream_options", "`include_usage`; `include_obfuscation: false`; only with `stream: true`"),
    honoured("tools", "with `serve.tool_calls: true` (then given to the chat template); otherwise only `[]`"),
    honoured("tool_choice", "`auto` and `none` (tools not offered); `required` or a named function is refused"),
    honoured("parallel_tool_calls", "`true`; `false` is refused when tools are offered (nothing limits the calls)"),
    neutral("n", "1", one, "one choice per request"),
    neutral("logprobs", "false", is_false, "log-probabilities are not returned yet"),
    neutral("top_logprobs", "0", zero, "log-probabilities are not returned yet"),
    neutral("presence_penalty", "0", zero, "no penalties in the sampler yet"),
    neutral("frequency_penalty", "0", zero, "no penalties in the sampler yet"),
    neutral("logit_bias", "{}", empty_object, "no logit bias in the sampler yet"),
    neutral("response_format", "{\"type\": \"text\"}", text_format, "no constrained decoding (JSON mode) yet"),
    neutral("modalities", "[\"text\"]", text_modality, "text only"),
    neutral("store", "false", is_false, "completions are not stored"),
    neutral("metadata", "{}", empty_object, "completions are not stored"),
    neutral("service_tier", "\"auto\" or \"default\"", standard_tier, "one tier"),
    refused("audio", "text only"),
    refused("prediction", "no predicted outputs"),
    refused("reasoning_effort", "the recipe's `serve.reasoning` decides"),
    refused("verbosity", "the model answers at the length it was trained to"),
    refused("web_search_options", "no web search"),
    refused("user", "no per-user records are kept"),
    refused("safety_identifier", "no per-user records are kept"),
    refused("prompt_cache_key", "the prefix cache needs no key"),
    refused("functions", "deprecated: use `tools`"),
    refused("function_call", "deprecated: use `tool_choice`"),
    // vLLM's extensions.
    honoured("top_k", "-1 or 0 keep every token; k ≥ 1 the k most likely"),
    neutral("min_p", "0", zero, "no min-p in the sampler yet"),
    neutral("repetition_penalty", "1", one, "no penalties in the sampler yet"),
    neutral("chat_template_kwargs", "{}", empty_object, "the template renders as the model was trained"),
    neutral("min_tokens", "0", zero, "the answer may end at any token"),
    neutral("ignore_eos", "false", is_false, "the end of turn ends the answer"),
    neutral("skip_special_tokens", "true", is_true, "special tokens are left out of the text"),
    neutral("include_stop_str_in_output", "false", is_false, "a stop string is cut"),
    neutral("add_generation_prompt", "true", is_true, "an assistant turn is opened"),
    neutral("continue_final_message", "false", is_false, "an assistant turn is opened"),
    neutral("echo", "false", is_false, "the prompt is not repeated"),
    neutral("stop_token_ids", "[]", empty_array, "stop strings only"),
    neutral("use_beam_search", "false", is_false, "sampling only"),
    refused("guided_json", "no constrained decoding yet"),
    refused("guided_regex", "no constrained decoding yet"),
    refused("guided_choice", "no constrained decoding yet"),
    refused("guided_grammar", "no constrained decoding yet"),
    refused("structured_outputs", "no constrained decoding yet"),
];

/// The body's parameters of `POST /v1/completions` (OpenAI's legacy completions, as evaluation
/// harnesses use it). Whatever else OpenAI defines there is refused by name.
pub const COMPLETION_PARAMS: &[Param] = &[
    honoured("model", "the checkpoint's id or an `--adapter` id"),
    honoured(
        "prompt",
        "a string, a list of strings, a list of token ids, or a list of such lists; one choice per prompt",
    ),
    honoured(
        "max_tokens",
        "default 16; 0 generates nothing (with `echo`: scores the prompt); cut to what the context leaves",
    ),
    honoured("echo", "the prompt is repeated before the answer, and scored with `logprobs`"),
    honoured("logprobs", "0–5: each token's log-probability and the most likely tokens at its position"),
    honoured("temperature", "0–2; 0 is greedy"),
    honoured("top_p", "(0, 1]"),
    honoured("seed", "the same seed gives the same answer"),
    honoured("stop", "up to 4 strings; the answer ends before the first"),
    honoured("user", "accepted; no per-user records are kept"),
    neutral("n", "1", one, "one choice per prompt"),
    neutral("stream", "false", is_false, "a whole answer only: no streaming on this route yet"),
    refused("stream_options", "no streaming on this route yet"),
    refused("best_of", "sampling only, one candidate"),
    refused("suffix", "no insertion (fill-in-the-middle)"),
    refused("presence_penalty", "no penalties in the sampler yet"),
    refused("frequency_penalty", "no penalties in the sampler yet"),
    refused("logit_bias", "no logit bias in the sampler yet"),
];

/// `POST /tokenize` (vLLM's shape).
pub const TOKENIZE_PARAMS: &[Param] = &[
    honoured("model", "optional; a served id (the tokenizer is the checkpoint's for every id)"),
    honoured(
        "prompt",
        "a text; special-token strings in it are read as those tokens, as the Hugging Face tokenizer reads them",
    ),
    honoured("add_special_tokens", "with `prompt`: the tokenizer's post-processor adds its specials (default false)"),
    honoured(
        "messages",
        "a conversation, tokenized as chat completions prompt it (the template's assistant turn opened)",
    ),
    honoured("tools", "with `messages`: the tools offered to the chat template"),
    neutral("add_generation_prompt", "true", is_true, "the assistant turn is always opened, as for chat completions"),
    refused("return_token_strs", "token ids only"),
    refused("chat_template", "the model's own chat template only"),
    refused("chat_template_kwargs", "the model's own chat template only"),
];

/// `POST /detokenize` (vLLM's shape).
pub const DETOKENIZE_PARAMS: &[Param] =
    &[honoured("model", "optional; a served id"), honoured("tokens", "token ids; every special token is written out")];

/// The fields of one message in `messages`.
pub const MESSAGE_FIELDS: &[Param] = &[
    honoured("role", "`system`, `developer` (as system), `user`, `assistant`; `tool` with `serve.tool_calls`"),
    honoured("content", "a string or `text` parts; `null` on an assistant turn that calls tools"),
    honoured(
        "tool_calls",
        "assistant turns, with `serve.tool_calls`: `id`, `type: function`, `function.name`, `function.arguments` (a JSON object as a string)",
    ),
    honoured("tool_call_id", "tool turns: the `id` of a call made earlier in the conversation"),
    honoured("reasoning_content", "assistant turns: given to the template as the turn's reasoning"),
    refused("name", "the chat template has no place for a participant's name"),
    refused("refusal", "answers here carry no refusal to echo back"),
    refused("audio", "text only"),
    refused("function_call", "deprecated: use `tool_calls`"),
];

/// The entry for `name` in `table`.
pub fn find(table: &'static [Param], name: &str) -> Option<&'static Param> {
    table.iter().find(|p| p.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rows of the docs' table that follows `heading`: (name, treatment word, neutral).
    fn documented(heading: &str) -> Vec<(String, String)> {
        let docs = include_str!("../../../../docs/formats.md");
        let table = docs.split(heading).nth(1).unwrap_or_else(|| panic!("no {heading:?} in docs/formats.md"));
        table
            .lines()
            .skip_while(|l| !l.starts_with('|'))
            .take_while(|l| l.starts_with('|'))
            .skip(2)
            .map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                (cells[1].trim_matches('`').to_owned(), cells[2].to_owned())
            })
            .collect()
    }

    fn expected(table: &[Param]) -> Vec<(String, String)> {
        table
            .iter()
            .map(|p| {
                let how = match p.treatment {
                    Treatment::Honoured => "honoured".to_owned(),
                    Treatment::Neutral { neutral, .. } => format!("only `{neutral}`"),
                    Treatment::Refused => "refused".to_owned(),
                };
                (p.name.to_owned(), how)
            })
            .collect()
    }

    #[test]
    fn the_docs_list_every_parameter_as_the_code_treats_it() {
        assert_eq!(documented("**Request parameters**"), expected(PARAMS));
        assert_eq!(documented("**Message fields**"), expected(MESSAGE_FIELDS));
        assert_eq!(documented("**Completions parameters**"), expected(COMPLETION_PARAMS));
        assert_eq!(documented("**Tokenize parameters**"), expected(TOKENIZE_PARAMS));
        assert_eq!(documented("**Detokenize parameters**"), expected(DETOKENIZE_PARAMS));
    }

    #[test]
    fn each_neutral_value_passes_its_own_check_and_names_are_unique() {
        for table in [PARAMS, MESSAGE_FIELDS, COMPLETION_PARAMS, TOKENIZE_PARAMS, DETOKENIZE_PARAMS] {
            for (i, p) in table.iter().enumerate() {
                assert!(table[..i].iter().all(|q| q.name != p.name), "{} twice", p.name);
                if let Treatment::Neutral { neutral, is } = p.treatment {
                    let first = neutral.split(" or ").next().unwrap();
                    let v: Value = serde_json::from_str(first).unwrap_or_else(|e| panic!("{}: {e}", p.name));
                    assert!(is(&v), "{}: {neutral} is its own neutral value", p.name);
                }
            }
        }
    }
}
