//! The seeded task generator: small tasks with one verifiable answer, for the demo and tests.
//!
//! Families: arithmetic on small integers, string transforms on short random words, and tool
//! calls in Qwen3's format. Sizes are chosen for a tiny byte-level model (hidden 64, two
//! layers, 128 positions): every example, rendered with the compact template and the byte
//! tokenizer, fits in 128 tokens, and answers are short. Most tasks reward copying and simple
//! per-character rules, which such a model learns in a few hundred steps; arithmetic facts
//! must be memorised, so they show learning on the training set more than on the holdout.
//!
//! The same seed gives the same examples on every machine: the generator draws from
//! ChaCha8 keyed by the seed and never from `rand`'s distributions, whose values may change
//! between versions.

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};
use serde::Serialize;

use super::example::{Conversation, Example, Message, PreferencePair, Role, ToolArguments, ToolCall};
use super::json::Json;
use super::score::answers_match;
use crate::recipe::DataFormat;

/// Bumped whenever the same seed would produce different examples; part of the manifest.
pub const GENERATOR_VERSION: u32 = 1;

/// What the generator makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TaskParams {
    pub seed: u64,
    pub count: u32,
    /// Adds `convert(amount, from, to)`, whose examples need up to ~170 byte tokens.
    pub multi_arg_tools: bool,
}

impl TaskParams {
    /// The longest a rendered example may be (byte tokens, compact template, with eos) for
    /// these parameters to be learnable without truncation.
    pub fn max_byte_tokens(&self) -> usize {
        if self.multi_arg_tools { 192 } else { 128 }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskFamily {
    Add,
    Subtract,
    Multiply,
    Uppercase,
    Reverse,
    SortLetters,
    CountLetters,
    FirstLetter,
    LastLetter,
    Weather,
    Time,
    Convert,
}

impl TaskFamily {
    /// The family whose prompt this is, read back from the generator's own prompt shapes
    /// (`What is 3 + 4?`, `Reverse: abc`, ...): held-out examples are records, not tasks, and
    /// the demo reports exact match per family. `None` for any other text.
    pub fn of_prompt(prompt: &str) -> Option<TaskFamily> {
        use TaskFamily::*;
        const PREFIXES: [(&str, TaskFamily); 9] = [
            ("Uppercase: ", Uppercase),
            ("Reverse: ", Reverse),
            ("Sort the letters: ", SortLetters),
            ("How many letters in ", CountLetters),
            ("First letter of ", FirstLetter),
            ("Last letter of ", LastLetter),
            ("Weather in ", Weather),
            ("Time in ", Time),
            ("Convert ", Convert),
        ];
        if let Some(expr) = prompt.strip_prefix("What is ").and_then(|p| p.strip_suffix('?')) {
            let mut parts = expr.split(' ');
            let (a, op, b) = (parts.next()?, parts.next()?, parts.next()?);
            let numbers = a.parse::<i64>().is_ok() && b.parse::<i64>().is_ok() && parts.next().is_none();
            return match op {
                "+" if numbers => Some(Add),
                "-" if numbers => Some(Subtract),
                "*" if numbers => Some(Multiply),
                _ => None,
            };
        }
        PREFIXES.iter().find(|(p, _)| prompt.starts_with(p)).map(|(_, f)| *f)
    }

    pub fn name(self) -> &'static str {
        use TaskFamily::*;
        match self {
            Add => "add",
            Subtract => "subtract",
            Multiply => "multiply",
            Uppercase => "uppercase",
            Reverse => "reverse",
            SortLetters => "sort_letters",
            CountLetters => "count_letters",
            FirstLetter => "first_letter",
            LastLetter => "last_letter",
            Weather => "weather",
            Time => "time",
            Convert => "convert",
        }
    }
}

/// A generated task: the question, the reference answer and a plausible wrong answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Task {
    pub family: TaskFamily,
    pub system: Option<String>,
    pub prompt: String,
    pub answer: Answer,
    /// A wrong answer of the same shape: the rejected side of a preference pair.
    pub wrong: Answer,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Answer {
    Text(String),
    ToolCall { name: String, arguments: Json },
}

impl Answer {
    fn message(&self) -> Message {
        match self {
            Answer::Text(t) => Message::new(Role::Assistant, t.clone()),
            Answer::ToolCall { name, arguments } => {
                let mut m = Message::new(Role::Assistant, "");
                m.tool_calls = vec![ToolCall { name: name.clone(), arguments: ToolArguments::Json(arguments.clone()) }];
                m
            }
        }
    }

    /// The answer as the model writes it after the generation prompt.
    pub fn text(&self) -> String {
        super::template::assistant_answer_text(&self.message())
    }
}

impl Task {
    fn prompt_messages(&self) -> Vec<Message> {
        let mut messages = Vec::new();
        if let Some(system) = &self.system {
            messages.push(Message::new(Role::System, system.clone()));
        }
        messages.push(Message::new(Role::User, self.prompt.clone()));
        messages
    }

    /// The task as a conversation (tool calls structured, as Qwen3's template expects).
    pub fn conversation(&self) -> Conversation {
        let mut messages = self.prompt_messages();
        messages.push(self.answer.message());
        Conversation { messages, tools: Vec::new() }
    }

    pub fn example(&self, format: DataFormat) -> Example {
        match format {
            DataFormat::Preference => Example::Preference(PreferencePair {
                prompt: self.prompt_messages(),
                chosen: vec![self.answer.message()],
                rejected: vec![self.wrong.message()],
                tools: Vec::new(),
            }),
            // Instruction records read back as this same conversation; text (pre-training)
            // renders the conversation with every token learned.
            _ => Example::Chat(self.conversation()),
        }
    }

    /// The task as one JSONL record of `format` (text becomes the chat record: the
    /// pre-training corpus is the rendered conversations).
    pub fn record(&self, format: DataFormat) -> serde_json::Value {
        use serde_json::json;
        let message_json = |m: &Message| {
            let mut v = json!({"role": m.role.as_str(), "content": m.content});
            if !m.tool_calls.is_empty() {
                v["tool_calls"] = m
                    .tool_calls
                    .iter()
                    .map(|c| {
                        let arguments = match &c.arguments {
                            ToolArguments::Json(j) => serde_json::to_value(j).unwrap_or_default(),
                            ToolArguments::Raw(s) => json!(s),
                        };
                        json!({"type": "function", "function": {"name": c.name, "arguments": arguments}})
                    })
                    .collect();
            }
            v
        };
        match format {
            DataFormat::Instruction => {
                let mut v = json!({"instruction": self.prompt, "output": self.answer.text()});
                if let Some(system) = &self.system {
                    v["system"] = json!(system);
                }
                v
            }
            DataFormat::Preference => json!({
                "prompt": self.prompt_messages().iter().map(message_json).collect::<Vec<_>>(),
                "chosen": [message_json(&self.answer.message())],
                "rejected": [message_json(&self.wrong.message())],
            }),
            DataFormat::Chat | DataFormat::Text => {
                json!({"messages": self.conversation().messages.iter().map(message_json).collect::<Vec<_>>()})
            }
        }
    }

    /// Exact match of a model's output against this task's answer.
    pub fn is_correct(&self, output: &str) -> bool {
        answers_match(&self.answer.text(), output)
    }
}

/// `count` tasks from `seed`.
pub fn generate(params: &TaskParams) -> Vec<Task> {
    let mut key = blake3::Hasher::new_derive_key("mindxtrain task generator v1");
    key.update(&params.seed.to_le_bytes());
    let mut rng = Rng(ChaCha8Rng::from_seed(*key.finalize().as_bytes()));
    (0..params.count).map(|_| one_task(&mut rng, params.multi_arg_tools)).collect()
}

/// The tasks as JSONL text of `format`, one record a line.
pub fn generate_jsonl(params: &TaskParams, format: DataFormat) -> String {
    let mut out = String::new();
    for task in generate(params) {
        out.push_str(&task.record(format).to_string());
        out.push('\n');
    }
    out
}

struct Rng(ChaCha8Rng);

impl Rng {
    /// Uniform in `0..n` by multiply-shift (bias below 2^-50 for the small `n` used here).
    fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.0.next_u64()) * n as u128) >> 64) as usize
    }
    fn range(&mut self, lo: i64, hi_inclusive: i64) -> i64 {
        lo + self.below((hi_inclusive - lo + 1) as usize) as i64
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
    fn word(&mut self, min: usize, max: usize) -> String {
        let len = min + self.below(max - min + 1);
        (0..len).map(|_| (b'a' + self.below(26) as u8) as char).collect()
    }
    /// A made-up place name (`Tavo`, `Meruk`): copying it is the skill, not recalling it.
    fn place(&mut self) -> String {
        const CONSONANTS: &[u8] = b"bdfgklmnprstvz";
        const VOWELS: &[u8] = b"aeiou";
        let mut name = String::new();
        for _ in 0..2 {
            name.push(*self.pick(CONSONANTS) as char);
            name.push(*self.pick(VOWELS) as char);
        }
        if self.below(2) == 1 {
            name.push(*self.pick(CONSONANTS) as char);
        }
        let mut chars = name.chars();
        chars.next().map(|c| c.to_ascii_uppercase().to_string() + chars.as_str()).unwrap_or_default()
    }
}

fn text(s: impl Into<String>) -> Answer {
    Answer::Text(s.into())
}

fn one_task(rng: &mut Rng, multi_arg_tools: bool) -> Task {
    match rng.below(3) {
        0 => arithmetic(rng),
        1 => string_task(rng),
        _ => tool_task(rng, multi_arg_tools),
    }
}

fn near_miss(rng: &mut Rng, value: i64) -> String {
    let delta = rng.range(1, 3);
    (if rng.below(2) == 0 { value + delta } else { value - delta }).to_string()
}

fn arithmetic(rng: &mut Rng) -> Task {
    let (family, a, b, op, value) = match rng.below(3) {
        0 => {
            let (a, b) = (rng.range(0, 20), rng.range(0, 20));
            (TaskFamily::Add, a, b, '+', a + b)
        }
        1 => {
            let (x, y) = (rng.range(0, 20), rng.range(0, 20));
            let (a, b) = (x.max(y), x.min(y));
            (TaskFamily::Subtract, a, b, '-', a - b)
        }
        _ => {
            let (a, b) = (rng.range(0, 9), rng.range(0, 9));
            (TaskFamily::Multiply, a, b, '*', a * b)
        }
    };
    Task {
        family,
        system: None,
        prompt: format!("What is {a} {op} {b}?"),
        answer: text(value.to_string()),
        wrong: text(near_miss(rng, value)),
    }
}

fn string_task(rng: &mut Rng) -> Task {
    let word = rng.word(3, 6);
    let (family, prompt, answer) = match rng.below(6) {
        0 => (TaskFamily::Uppercase, format!("Uppercase: {word}"), word.to_uppercase()),
        1 => (TaskFamily::Reverse, format!("Reverse: {word}"), word.chars().rev().collect()),
        2 => {
            let mut letters: Vec<char> = word.chars().collect();
            letters.sort_unstable();
            (TaskFamily::SortLetters, format!("Sort the letters: {word}"), letters.into_iter().collect())
        }
        3 => (TaskFamily::CountLetters, format!("How many letters in {word}?"), word.len().to_string()),
        4 => (TaskFamily::FirstLetter, format!("First letter of {word}?"), word[..1].to_owned()),
        _ => (TaskFamily::LastLetter, format!("Last letter of {word}?"), word[word.len() - 1..].to_owned()),
    };
    // The word itself, unless that happens to be right (reversing a palindrome); then a
    // different letter.
    let wrong = if word != answer && word.len() > 1 {
        word.clone()
    } else {
        let c = answer.chars().next().map_or('a', |c| if c == 'z' { 'a' } else { (c as u8 + 1) as char });
        format!("{c}{}", &answer[1.min(answer.len())..])
    };
    let wrong = if family == TaskFamily::CountLetters { near_miss(rng, word.len() as i64) } else { wrong };
    Task { family, system: None, prompt, answer: text(answer), wrong: text(wrong) }
}

fn call(name: &str, arguments: Vec<(&str, Json)>) -> Answer {
    Answer::ToolCall {
        name: name.to_owned(),
        arguments: Json::object(arguments.into_iter().map(|(k, v)| (k.to_owned(), v))),
    }
}

fn tool_task(rng: &mut Rng, multi_arg_tools: bool) -> Task {
    const CURRENCIES: [&str; 6] = ["USD", "EUR", "GBP", "JPY", "CHF", "CAD"];
    let kinds = if multi_arg_tools { 3 } else { 2 };
    match rng.below(kinds) {
        0 | 1 => {
            let (city, other) = (rng.place(), rng.place());
            let (family, tool, prompt) = if rng.below(2) == 0 {
                (TaskFamily::Weather, "get_weather", format!("Weather in {city}?"))
            } else {
                (TaskFamily::Time, "get_time", format!("Time in {city}?"))
            };
            let wrong_city = if other == city { format!("{city}a") } else { other };
            Task {
                family,
                system: Some(format!("{tool}(city)")),
                prompt,
                answer: call(tool, vec![("city", Json::String(city))]),
                wrong: call(tool, vec![("city", Json::String(wrong_city))]),
            }
        }
        _ => {
            let amount = rng.range(1, 999);
            let from = *rng.pick(&CURRENCIES);
            let to = loop {
                let c = *rng.pick(&CURRENCIES);
                if c != from {
                    break c;
                }
            };
            let args = |from: &str, to: &str| {
                vec![
                    ("amount", Json::Int(amount.into())),
                    ("from", Json::String(from.into())),
                    ("to", Json::String(to.into())),
                ]
            };
            Task {
                family: TaskFamily::Convert,
                system: Some("convert(amount, from, to)".into()),
                prompt: format!("Convert {amount} {from} to {to}."),
                answer: call("convert", args(from, to)),
                // Swapped currencies: the classic mistake.
                wrong: call("convert", args(to, from)),
            }
        }
    }
}

#[cfg(test)]
mod tests;
