//! A streamed answer equals the whole one however its text is cut, and the parsers read back
//! what the chat templates teach a model to write.

use std::path::Path;

use mindxtrain_trainer::data::{ChatTemplate, Conversation, Json, Message, Role, Tokenizer, ToolArguments, ToolCall};
use proptest::prelude::*;

use super::{Answer, AnswerParser, Delta, Format, ParsedCall};

/// `text` cut at `cuts` (byte offsets, moved back to character boundaries), through one parser.
fn streamed(format: &Format, text: &str, cuts: &[usize]) -> (Answer, Vec<Delta>) {
    let mut at: Vec<usize> = cuts
        .iter()
        .map(|&c| {
            let mut c = c % (text.len() + 1);
            while !text.is_char_boundary(c) {
                c -= 1;
            }
            c
        })
        .collect();
    at.push(0);
    at.push(text.len());
    at.sort_unstable();
    let mut parser = AnswerParser::new(format);
    let mut deltas = Vec::new();
    for w in at.windows(2) {
        deltas.extend(parser.push(&text[w[0]..w[1]]));
    }
    deltas.extend(parser.finish());
    let mut answer = Answer::default();
    for d in deltas.clone() {
        answer.add(d);
    }
    (answer, deltas)
}

const FRAGMENTS: &[&str] = &[
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "{\"name\": \"add\", \"arguments\": {\"a\": 1}}",
    "{\"name\": \"other\", \"arguments\": {}}",
    "{bad",
    "\n",
    "  ",
    "hello",
    "é€",
    "<",
    "</",
    "<think",
    "<tool_",
    "}",
];

fn formats() -> Vec<Format> {
    let tools = vec!["add".to_string()];
    vec![
        Format::default(),
        Format { reasoning: true, ..Format::default() },
        Format { reasoning: true, think_open: true, ..Format::default() },
        Format { tools: tools.clone(), ..Format::default() },
        Format { reasoning: true, think_open: false, tools },
    ]
}

proptest! {
    #[test]
    fn any_cut_of_the_text_streams_the_whole_answer(
        pieces in proptest::collection::vec(0..FRAGMENTS.len(), 0..24),
        cuts in proptest::collection::vec(any::<usize>(), 0..12),
    ) {
        let text: String = pieces.iter().map(|&i| FRAGMENTS[i]).collect();
        for format in formats() {
            let (stream, deltas) = streamed(&format, &text, &cuts);
            prop_assert_eq!(&stream, &Answer::parse(&format, &text), "{:?} {:?}", format, text);
            let empty = deltas.iter().any(|d| matches!(d, Delta::Content(s) | Delta::Reasoning(s) if s.is_empty()));
            prop_assert!(!empty, "an empty delta: {:?}", deltas);
            for (i, call) in stream.tool_calls.iter().enumerate() {
                prop_assert_eq!(call.index, i);
            }
            if format == Format::default() {
                prop_assert_eq!(&stream.content, &text, "switched off, the text is the content");
            }
        }
    }
}

#[test]
fn the_stream_of_a_split_tag_is_the_whole_answer() {
    let format = Format { reasoning: true, think_open: false, tools: vec!["add".into()] };
    let text = "<think>\nsum it\n</think>\n\nOn it.\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n</tool_call>";
    let whole = Answer::parse(&format, text);
    assert_eq!(whole.reasoning, "\nsum it\n");
    assert_eq!(whole.content, "On it.");
    assert_eq!(whole.tool_calls, [ParsedCall { index: 0, name: "add".into(), arguments: "{\"a\": 1}".into() }]);
    for cut in 0..=text.len() {
        assert_eq!(streamed(&format, text, &[cut]).0, whole, "cut at {cut}");
        for cut2 in (cut..=text.len()).step_by(3) {
            assert_eq!(streamed(&format, text, &[cut, cut2]).0, whole, "cut at {cut} and {cut2}");
        }
    }
}

/// A conversation whose last assistant turn calls two tools after a sentence.
fn calling() -> (Conversation, Vec<ToolCall>) {
    let args = |s: &str| ToolArguments::Json(Json::parse(s).unwrap());
    let calls = vec![
        ToolCall { name: "get_weather".into(), arguments: args(r#"{"city": "Paris", "days": 2}"#) },
        ToolCall { name: "add".into(), arguments: args(r#"{"b": 1.5, "a": [1, "x"]}"#) },
    ];
    let tool =
        |name: &str| Json::parse(&format!(r#"{{"type": "function", "function": {{"name": "{name}"}}}}"#)).unwrap();
    let mut answer = Message::new(Role::Assistant, "Checking.");
    answer.tool_calls = calls.clone();
    let conv = Conversation {
        messages: vec![Message::new(Role::User, "Weather in Paris?"), answer],
        tools: vec![tool("get_weather"), tool("add")],
    };
    (conv, calls)
}

fn read_back(text: &str, calls: &[ToolCall]) {
    let format = Format { reasoning: true, think_open: false, tools: vec!["get_weather".into(), "add".into()] };
    let a = Answer::parse(&format, text);
    assert_eq!(a.content, "Checking.", "{text:?}");
    assert_eq!(a.reasoning, "");
    let want: Vec<(String, String)> = calls.iter().map(|c| (c.name.clone(), c.arguments.render())).collect();
    let got: Vec<(String, String)> = a.tool_calls.iter().map(|c| (c.name.clone(), c.arguments.clone())).collect();
    assert_eq!(got, want, "{text:?}");
}

#[test]
fn the_builtin_templates_tool_calls_are_read_back() {
    let (conv, calls) = calling();
    let answer = mindxtrain_trainer::data::template::assistant_answer_text(&conv.messages[1]);
    assert!(answer.contains("<tool_call>\n{\"name\": \"get_weather\""), "{answer}");
    read_back(&answer, &calls);
}

#[test]
fn qwen3s_own_templates_tool_calls_are_read_back() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/chat_templates/qwen3.jinja");
    let tokenizer = Tokenizer::byte();
    let template = ChatTemplate::from_file(&path, &tokenizer).unwrap();
    let (conv, calls) = calling();
    // The final turn as Qwen3's template teaches it (its empty think block is in the prompt),
    // and the same after reasoning of the model's own.
    let answer = template.reference_answer(&conv, &tokenizer).unwrap().unwrap();
    assert!(answer.starts_with("Checking.\n<tool_call>\n{\"name\": \"get_weather\""), "{answer:?}");
    read_back(&answer, &calls);
    read_back(&format!("<think>\n\n</think>\n\n{answer}"), &calls);
}
