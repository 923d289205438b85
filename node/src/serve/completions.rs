//! `POST /v1/completions`: OpenAI's legacy completions, as evaluation harnesses use it
//! (lm-evaluation-harness's `local-completions`): several prompts a request, one choice each in
//! order; `echo` with `logprobs` scores the prompt itself (loglikelihood), `max_tokens` with
//! `stop` generates (generate-until). Whole answers only.
//!
//! Generation runs on the engine like a chat completion; log-probabilities come from one
//! forward over prompt and answer on the engine's thread (`ServedModel::score`): the paged
//! prefill skips what the prefix cache holds and keeps only sampling rows' logits.

use std::ops::ControlFlow;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use mindxtrain_trainer::infer::SamplingParams;
use mindxtrain_x402::{Quote, SettleWhen};
use serde_json::{Value, json};

use super::chat::{admit, internal, model_not_found, random_id, random_seed};
use super::model::{Job, Outcome, ServeModelError, ServedModel};
use super::openai::completion::{CompletionRequest, PromptInput};
use super::openai::{ApiError, Usage};
use super::{AppState, ChatPrice, unix_now};

/// A request read once on the paid path, handed to the handler in the request's extensions.
#[derive(Clone)]
pub struct PreparedCompletion(Arc<Prepared>);

/// A request ready for the engine: one job per prompt.
pub struct Prepared {
    req: CompletionRequest,
    jobs: Vec<Job>,
}

impl Prepared {
    /// Prompt plus answer tokens the request may use.
    fn budget(&self) -> usize {
        self.jobs.iter().map(|j| j.prompt_ids.len() + j.max_tokens).sum()
    }
}

/// Prices a paid request as a chat completion of the same token budget; settled once the
/// answer is complete. A request this model cannot answer is refused before payment.
pub fn prepare_paid(s: &AppState, price: ChatPrice, body: &[u8]) -> Result<Quote, ApiError> {
    let p = prepare(s, body)?;
    let mut quote = Quote::new(price.amount(p.budget()), SettleWhen::AfterBody);
    quote.extensions.insert(PreparedCompletion(Arc::new(p)));
    Ok(quote)
}

pub async fn completions(
    State(s): State<Arc<AppState>>,
    prepared: Option<Extension<PreparedCompletion>>,
    body: Bytes,
) -> Response {
    let prepared = match prepared {
        Some(Extension(PreparedCompletion(p))) => Ok(p),
        None => prepare(&s, &body).map(Arc::new),
    };
    match prepared {
        Ok(p) => answer(s, p).await.map(|v| Json(v).into_response()).unwrap_or_else(|e| e.into_response()),
        Err(e) => e.into_response(),
    }
}

/// Reads a request and checks each prompt against the model.
fn prepare(s: &AppState, body: &[u8]) -> Result<Prepared, ApiError> {
    let req = CompletionRequest::read(body)?;
    let adapter = s.model.resolve(&req.model).ok_or_else(|| model_not_found(&req.model))?;
    let sampling = SamplingParams {
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: 0,
        seed: req.seed.unwrap_or_else(random_seed),
    };
    sampling
        .validate()
        .map_err(|m| ApiError::invalid(if m.starts_with("top_p") { "top_p" } else { "temperature" }, m))?;
    let context = s.model.context;
    let mut jobs = Vec::with_capacity(req.prompts.len());
    for prompt in &req.prompts {
        let prompt_ids = match prompt {
            PromptInput::Text(t) => s.model.encode(t).map_err(|e| ApiError::invalid("prompt", e.to_string()))?,
            PromptInput::Tokens(ids) => ids.clone(),
        };
        if prompt_ids.is_empty() {
            return Err(ApiError::invalid("prompt", "a prompt is empty"));
        }
        if prompt_ids.len() >= context {
            return Err(ApiError {
                code: "context_length_exceeded",
                ..ApiError::invalid(
                    "prompt",
                    format!("a prompt is {} tokens; this model's context is {context}", prompt_ids.len()),
                )
            });
        }
        let max_tokens = (req.max_tokens as usize).min(context - prompt_ids.len());
        jobs.push(Job { prompt_ids, max_tokens, sampling, stops: req.stop.clone(), adapter: adapter.clone() });
    }
    Ok(Prepared { req, jobs })
}

/// Runs every prompt (all at once: the engine batches them) and answers in their order.
async fn answer(s: Arc<AppState>, p: Arc<Prepared>) -> Result<Value, ApiError> {
    let slot = Arc::new(admit(&s, p.budget()).await?);
    let runs: Vec<_> = (0..p.jobs.len())
        .map(|i| {
            let (model, p, slot) = (s.model.clone(), p.clone(), slot.clone());
            tokio::task::spawn_blocking(move || {
                let _slot = slot;
                choice(&model, &p.req, &p.jobs[i], i)
            })
        })
        .collect();
    let mut choices = Vec::with_capacity(runs.len());
    let mut usage = Usage::new(0, 0);
    for run in runs {
        let (choice, used) = run.await.map_err(|e| internal(e.to_string()))?.map_err(|e| match e {
            ServeModelError::Refused(e) => ApiError::invalid("prompt", e.to_string()),
            other => internal(other.to_string()),
        })?;
        choices.push(choice);
        usage = Usage::new(usage.prompt_tokens + used.prompt_tokens, usage.completion_tokens + used.completion_tokens);
    }
    Ok(json!({
        "id": format!("cmpl-{}", random_id()),
        "object": "text_completion",
        "created": unix_now(),
        "model": p.req.model,
        "choices": choices,
        "usage": usage,
    }))
}

/// The choice for prompt `index` and what it used.
fn choice(
    model: &ServedModel,
    req: &CompletionRequest,
    job: &Job,
    index: usize,
) -> Result<(Value, Usage), ServeModelError> {
    let outcome = if job.max_tokens == 0 {
        Outcome { text: String::new(), tokens: Vec::new(), completion_tokens: 0, finish_reason: "length" }
    } else {
        model.complete(job, |_| ControlFlow::Continue(()))?
    };
    let prompt_text = if req.echo { model.decode(&job.prompt_ids)? } else { String::new() };
    let logprobs = match req.logprobs {
        Some(k) => logprobs(model, job, &outcome.tokens, req.echo, k as usize)?,
        None => Value::Null,
    };
    let choice = json!({
        "index": index,
        "text": prompt_text + &outcome.text,
        "logprobs": logprobs,
        "finish_reason": outcome.finish_reason,
    });
    Ok((choice, Usage::new(job.prompt_ids.len(), outcome.completion_tokens)))
}

/// OpenAI's `logprobs` object over the answer's tokens, with the prompt's in front when
/// echoed (the first prompt token, predicted from nothing, has `null`s): each token's text, its
/// log-probability, the `top` most likely tokens at its position, and where its text starts.
fn logprobs(model: &ServedModel, job: &Job, answer: &[u32], echo: bool, top: usize) -> Result<Value, ServeModelError> {
    let ids: Vec<u32> = job.prompt_ids.iter().chain(answer).copied().collect();
    let scored = model.score(&ids, job.adapter.as_deref(), top)?;
    // `scored[i]` is the score of `ids[i + 1]`.
    let first = if echo { 0 } else { job.prompt_ids.len() };
    let (mut tokens, mut token_logprobs, mut top_logprobs, mut text_offset) = (vec![], vec![], vec![], vec![]);
    let mut offset = 0;
    for (i, &id) in ids.iter().enumerate().skip(first) {
        let text = model.decode(&[id])?;
        text_offset.push(offset);
        offset += text.chars().count();
        tokens.push(text);
        match i.checked_sub(1).map(|at| &scored[at]) {
            Some(s) => {
                token_logprobs.push(json!(s.logprob));
                let mut alternatives = serde_json::Map::new();
                for &(alt, lp) in &s.top {
                    alternatives.entry(model.decode(&[alt])?).or_insert(json!(lp));
                }
                top_logprobs.push(Value::Object(alternatives));
            }
            None => {
                token_logprobs.push(Value::Null);
                top_logprobs.push(Value::Null);
            }
        }
    }
    Ok(
        json!({"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs, "text_offset": text_offset}),
    )
}
