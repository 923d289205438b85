//! What a client asks the engine for: a tokenized prompt, how to sample, how long to go, which
//! adapter answers, and where to stop.

use crate::generate::Sampling;

/// The engine's name for a request, unique for its lifetime.
pub type RequestId = u64;

/// How each next token is chosen: [`Sampling`] (temperature, top-p, seed) plus top-k.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// 0 is greedy.
    pub temperature: f64,
    pub top_p: f64,
    /// Keep only the `top_k` most likely tokens; 0 keeps all.
    pub top_k: u32,
    /// The request's own random stream: the same seed gives the same tokens, whatever else
    /// shares the batch.
    pub seed: u64,
}

impl SamplingParams {
    pub const fn greedy() -> SamplingParams {
        SamplingParams { temperature: 0.0, top_p: 1.0, top_k: 0, seed: 0 }
    }

    /// The ranges OpenAI's API accepts (temperature in [0, 2], top_p in (0, 1]).
    pub fn validate(&self) -> Result<(), String> {
        Sampling { temperature: self.temperature, top_p: self.top_p, seed: self.seed }.validate()
    }
}

impl From<Sampling> for SamplingParams {
    fn from(s: Sampling) -> Self {
        SamplingParams { temperature: s.temperature, top_p: s.top_p, top_k: 0, seed: s.seed }
    }
}

/// One completion to run.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub prompt: Vec<u32>,
    /// Tokens to generate at most (cut to what the context leaves).
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// The served adapter that answers (`None`: the base model).
    pub adapter: Option<String>,
    /// Stop strings: the answer ends before the first one (needs the engine's tokenizer).
    pub stop: Vec<String>,
}

impl Request {
    /// A greedy request on the base model.
    pub fn greedy(prompt: Vec<u32>, max_tokens: usize) -> Request {
        Request { prompt, max_tokens, sampling: SamplingParams::greedy(), adapter: None, stop: Vec::new() }
    }
}
