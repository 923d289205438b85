//! The seeded task generator: small tasks with one verifiable answer, for the demo and tests.
//!
//! Families: the parity of a number, the length and the last letter of a random word, the
//! sentiment of a one-line review, and tool calls in Qwen3's format. Sizes are chosen for a
//! tiny byte-level model (hidden 64, two layers, 128 positions): every example, rendered with
//! the compact template and the byte tokenizer, fits in 128 tokens, and answers are short.
//!
//! Every family is one such a model learns within the demo's minute on two cores, and every
//! family's prompts come from a space far larger than any corpus drawn from it, so a held-out
//! prompt is almost never one a run (or the run it was initialised from) trained on. What
//! decides the answer sits at the end of the prompt (the last digit, the last word, the
//! question asked): a two-layer model learns to look a fixed distance back within a few
//! thousand steps, while copying a word from anywhere in the prompt (an induction circuit)
//! does not form in that budget. Measured before this mix was chosen (PyTorch, same model and
//! steps): copy tasks (uppercase, first letter, a made-up city as a tool argument) stayed at or
//! near 0 after 6,000 steps; arithmetic facts drawn from a few hundred pairs are all seen in training.
//!
//! The same seed gives the same examples on every machine: the generator draws from
//! ChaCha8 keyed by the seed and never from `rand`'s distributions, whose values may change
//! between versions.

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};
use serde::{Deserialize, Serialize};

use super::example::{Conversation, Example, Message, PreferencePair, Role, ToolArguments, ToolCall};
use super::json::Json;
use super::score::answers_match;
use crate::recipe::DataFormat;

/// Bumped whenever the same seed would produce different examples; part of the manifest.
pub const GENERATOR_VERSION: u32 = 2;

/// What the generator makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskParams {
    pub seed: u64,
    pub count: u32,
    /// Adds `convert(amount, from, to)`, whose examples need up to ~170 byte tokens.
    pub multi_arg_tools: bool,
    /// The families drawn; the others are skipped, so a subset's tasks are those of the
    /// whole mix with the rest left out (the same seed, the same tasks in the same order).
    pub families: Families,
}

impl TaskParams {
    /// `count` tasks of every family from `seed`, without multi-argument tools.
    pub fn new(seed: u64, count: u32) -> TaskParams {
        TaskParams { seed, count, multi_arg_tools: false, families: Families::ALL }
    }

    /// Whether some family of [`TaskParams::families`] can be drawn (`convert` alone needs
    /// multi-argument tools); without one the generator makes nothing.
    pub fn can_draw(&self) -> bool {
        TaskFamily::EVERY
            .iter()
            .any(|&f| self.families.contains(f) && (f != TaskFamily::Convert || self.multi_arg_tools))
    }

    /// The longest a rendered example may be (byte tokens, compact template, with eos) for
    /// these parameters to be learnable without truncation.
    pub fn max_byte_tokens(&self) -> usize {
        if self.multi_arg_tools { 192 } else { 128 }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskFamily {
    Parity,
    CountLetters,
    LastLetter,
    Review,
    Weather,
    Time,
    News,
    Convert,
}

/// A set of task families (a bit each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Families(u16);

impl Families {
    pub const ALL: Families = Families(u16::MAX);

    /// The families listed; every family when the list is empty.
    pub fn of(list: &[TaskFamily]) -> Families {
        if list.is_empty() { Families::ALL } else { Families(list.iter().fold(0, |bits, &f| bits | 1 << f as u16)) }
    }

    pub fn contains(self, family: TaskFamily) -> bool {
        self.0 & 1 << family as u16 != 0
    }
}

impl TaskFamily {
    pub const EVERY: [TaskFamily; 8] = {
        use TaskFamily::*;
        [Parity, CountLetters, LastLetter, Review, Weather, Time, News, Convert]
    };

    /// The family whose prompt this is, read back from the generator's own prompt shapes
    /// (`Is 4821 even or odd?`, `Last letter of abc?`, ...): held-out examples are records,
    /// not tasks, and the demo reports exact match per family. `None` for any other text.
    pub fn of_prompt(prompt: &str) -> Option<TaskFamily> {
        use TaskFamily::*;
        if let Some(n) = prompt.strip_prefix("Is ").and_then(|p| p.strip_suffix(" even or odd?")) {
            return n.parse::<u64>().is_ok().then_some(Parity);
        }
        if prompt.starts_with("I am ") {
            return TOOLS.iter().find(|t| prompt.ends_with(&format!(". {}", t.question))).map(|t| t.family);
        }
        const PREFIXES: [(&str, TaskFamily); 4] = [
            ("How many letters in ", CountLetters),
            ("Last letter of ", LastLetter),
            ("Review: ", Review),
            ("Convert ", Convert),
        ];
        PREFIXES.iter().find(|(p, _)| prompt.starts_with(p)).map(|(_, f)| *f)
    }

    pub fn name(self) -> &'static str {
        use TaskFamily::*;
        match self {
            Parity => "parity",
            CountLetters => "count_letters",
            LastLetter => "last_letter",
            Review => "review",
            Weather => "weather",
            Time => "time",
            News => "news",
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

/// `count` tasks of `params.families` from `seed` (none when [`TaskParams::can_draw`] is false).
pub fn generate(params: &TaskParams) -> Vec<Task> {
    let mut key = blake3::Hasher::new_derive_key("mindxtrain task generator v2");
    key.update(&params.seed.to_le_bytes());
    let mut rng = Rng(ChaCha8Rng::from_seed(*key.finalize().as_bytes()));
    if !params.can_draw() {
        return Vec::new();
    }
    let draw = |rng: &mut Rng| loop {
        let task = one_task(rng, params.multi_arg_tools);
        if params.families.contains(task.family) {
            return task;
        }
    };
    (0..params.count).map(|_| draw(&mut rng)).collect()
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
    /// A made-up name (`Tavobe`, `Merukal`), one of some five million: no answer depends on
    /// it; it keeps prompts from repeating.
    fn name(&mut self) -> String {
        const CONSONANTS: &[u8] = b"bdfgklmnprstvz";
        const VOWELS: &[u8] = b"aeiou";
        let mut name = String::new();
        for _ in 0..2 + self.below(2) {
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
    match rng.below(5) {
        0 => parity(rng),
        1 => word_task(rng),
        2 => review(rng),
        _ if multi_arg_tools && rng.below(2) == 0 => convert(rng),
        _ => tool_task(rng),
    }
}

fn near_miss(rng: &mut Rng, value: i64) -> String {
    let delta = rng.range(1, 3);
    (if rng.below(2) == 0 { value + delta } else { value - delta }).to_string()
}

fn parity(rng: &mut Rng) -> Task {
    let n = rng.range(100, 9_999_999);
    let (even, odd) = (text("even"), text("odd"));
    let (answer, wrong) = if n % 2 == 0 { (even, odd) } else { (odd, even) };
    Task { family: TaskFamily::Parity, system: None, prompt: format!("Is {n} even or odd?"), answer, wrong }
}

/// Two questions about a random word: its length and its last letter.
fn word_task(rng: &mut Rng) -> Task {
    let word = rng.word(4, 7);
    if rng.below(2) == 0 {
        let wrong = near_miss(rng, word.len() as i64);
        let prompt = format!("How many letters in {word}?");
        return Task {
            family: TaskFamily::CountLetters,
            system: None,
            prompt,
            answer: text(word.len().to_string()),
            wrong: text(wrong),
        };
    }
    let last = word.chars().last().unwrap_or('a');
    // The first letter when it differs (the classic slip), else the next one in the alphabet.
    let first = word.chars().next().unwrap_or('a');
    let wrong = if first != last {
        first
    } else if last == 'z' {
        'a'
    } else {
        (last as u8 + 1) as char
    };
    let prompt = format!("Last letter of {word}?");
    Task {
        family: TaskFamily::LastLetter,
        system: None,
        prompt,
        answer: text(last.to_string()),
        wrong: text(wrong.to_string()),
    }
}

fn review(rng: &mut Rng) -> Task {
    const THINGS: [&str; 6] = ["room", "food", "staff", "view", "trip", "show"];
    const GOOD: [&str; 8] = ["great", "lovely", "superb", "excellent", "wonderful", "perfect", "pleasant", "fine"];
    const BAD: [&str; 8] = ["awful", "terrible", "horrible", "dreadful", "poor", "bad", "dull", "boring"];
    let thing = *rng.pick(&THINGS);
    let place = rng.name();
    let good = rng.below(2) == 0;
    let word = *rng.pick(if good { &GOOD } else { &BAD });
    let (positive, negative) = (text("positive"), text("negative"));
    let (answer, wrong) = if good { (positive, negative) } else { (negative, positive) };
    Task {
        family: TaskFamily::Review,
        system: None,
        prompt: format!("Review: the {thing} in {place} was {word}."),
        answer,
        wrong,
    }
}

/// A tool the model calls without arguments, and the question that asks for it.
struct Tool {
    family: TaskFamily,
    name: &'static str,
    question: &'static str,
}

const TOOLS: [Tool; 3] = [
    Tool { family: TaskFamily::Weather, name: "get_weather", question: "How is the weather?" },
    Tool { family: TaskFamily::Time, name: "get_time", question: "What is the time?" },
    Tool { family: TaskFamily::News, name: "get_news", question: "Any news?" },
];

fn call(name: &str, arguments: Vec<(&str, Json)>) -> Answer {
    Answer::ToolCall {
        name: name.to_owned(),
        arguments: Json::object(arguments.into_iter().map(|(k, v)| (k.to_owned(), v))),
    }
}

/// A user who introduces themself (a made-up name, so prompts rarely repeat) and asks a
/// question one of the tools answers. No system message lists the tools: with one, the
/// longest example would not fit the tiny model's 128 positions.
fn tool_task(rng: &mut Rng) -> Task {
    let i = rng.below(TOOLS.len());
    let other = (i + 1 + rng.below(TOOLS.len() - 1)) % TOOLS.len();
    let (tool, wrong) = (&TOOLS[i], &TOOLS[other]);
    Task {
        family: tool.family,
        system: None,
        prompt: format!("I am {}. {}", rng.name(), tool.question),
        answer: call(tool.name, Vec::new()),
        wrong: call(wrong.name, Vec::new()),
    }
}

/// `convert(amount, from, to)`: three arguments, for models with longer contexts.
fn convert(rng: &mut Rng) -> Task {
    const CURRENCIES: [&str; 6] = ["USD", "EUR", "GBP", "JPY", "CHF", "CAD"];
    let amount = rng.range(1, 999);
    let from = *rng.pick(&CURRENCIES);
    let to = loop {
        let c = *rng.pick(&CURRENCIES);
        if c != from {
            break c;
        }
    };
    let args = |from: &str, to: &str| {
        vec![("amount", Json::Int(amount.into())), ("from", Json::String(from.into())), ("to", Json::String(to.into()))]
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

#[cfg(test)]
mod tests;
