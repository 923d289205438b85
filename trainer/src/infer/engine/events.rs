//! What the engine tells its callers: per-request events and its load.

/// Why a completion ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token or stop string.
    Stop,
    /// `max_tokens`, or the context is full.
    Length,
}

/// Token counts of a completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens found in the prefix cache (not computed again).
    pub cached_tokens: usize,
}

/// What a request hears from the engine.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A generated token and the text that became final with it (often empty mid-character
    /// or while it could still start a stop string).
    Token { id: u32, logprob: f32, text: String },
    /// The end: the text still held back, the counts, and the stop token that ended it (the
    /// tokenizer's end of turn or end of text; `None` after a stop string or the length limit).
    /// A trainer learning from the completion needs that token: it is how an answer ends.
    Finished { reason: FinishReason, text: String, usage: Usage, stop_token: Option<u32> },
    /// Generation failed (nothing more follows).
    Failed(String),
}

/// The engine's load, for admission and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    pub waiting: usize,
    pub running: usize,
    pub kv_used_blocks: usize,
    pub kv_total_blocks: usize,
    pub block_size: usize,
    /// Steps run since the engine started.
    pub steps: usize,
    /// Of those, steps queued before the tokens of the step before them were read
    /// ([`super::EngineConfig::overlap_steps`]).
    pub steps_ahead: usize,
}
