//! The model a node serves: a trained checkpoint (full weights, or a LoRA adapter over its
//! base) with the recipe's tokenizer and chat template, and one completion on it.

use std::ops::ControlFlow;
use std::path::Path;

use candle_core::Device;
use mindxtrain_trainer::checkpoint;
use mindxtrain_trainer::data::template::encode_pieces;
use mindxtrain_trainer::data::{ChatTemplate, Message, Role, Tokenizer};
use mindxtrain_trainer::generate::{Finish, Limits, Sampling, generate};
use mindxtrain_trainer::model::{Adapters, Qwen3, merge_lora};
use mindxtrain_trainer::recipe::{LoadedRecipe, Recipe};
use thiserror::Error;

use super::stop::TextStream;

#[derive(Debug, Error)]
pub enum ServeModelError {
    #[error("loading the model: {0}")]
    Load(String),
    #[error("{0}")]
    Prompt(String),
    #[error("generation failed: {0}")]
    Generate(String),
}

/// What one completion needs, already checked.
#[derive(Debug, Clone)]
pub struct Job {
    pub prompt_ids: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: Sampling,
    pub stops: Vec<String>,
}

/// How a completion ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub text: String,
    pub completion_tokens: usize,
    /// OpenAI's `finish_reason`: `stop` or `length`.
    pub finish_reason: &'static str,
}

pub struct ServedModel {
    /// The id clients name in `model` (`/v1/models`).
    pub name: String,
    pub recipe: Recipe,
    model: Qwen3,
    adapters: Option<Adapters>,
    tokenizer: Tokenizer,
    template: ChatTemplate,
    /// Prompt plus completion tokens one request may use.
    pub context: usize,
    /// Unix seconds the model was loaded (`created` in `/v1/models`).
    pub loaded_at: u64,
}

/// Where a served model comes from.
#[derive(Debug, Clone)]
pub struct ModelSource<'a> {
    pub recipe: &'a LoadedRecipe,
    pub recipe_dir: &'a Path,
    /// A run's `final/` (or a `checkpoints/step-*`) directory.
    pub checkpoint: &'a Path,
    /// The base an adapter applies to (the run's `--init-from`).
    pub base: Option<&'a Path>,
    /// Fold a LoRA adapter into the base weights: faster decoding, same answers up to rounding.
    pub merge: bool,
    /// Overrides the recipe's `model.name`.
    pub name: Option<String>,
    /// Where the model is loaded and run (the recipe's hardware, or `serve --device`).
    pub device: &'a Device,
}

impl ServedModel {
    pub fn load(src: &ModelSource<'_>) -> Result<ServedModel, ServeModelError> {
        let recipe = src.recipe.recipe.clone();
        let err = |e: &dyn std::fmt::Display| ServeModelError::Load(e.to_string());
        let tokenizer = Tokenizer::from_recipe(&recipe.model, src.recipe_dir).map_err(|e| err(&e))?;
        let (mut model, mut adapters) =
            checkpoint::load_checkpoint(&recipe, src.recipe_dir, src.base, src.checkpoint, src.device)
                .map_err(|e| err(&e))?;
        if src.merge
            && let Some(ad) = adapters.take()
        {
            let merged = merge_lora(model.params(), model.config(), &ad).map_err(|e| err(&e))?;
            *model.params_mut() = merged;
        }
        let context = (recipe.serve.max_model_len as usize).min(model.config().max_position_embeddings);
        Ok(ServedModel {
            name: src.name.clone().unwrap_or_else(|| recipe.model.name.clone()),
            template: ChatTemplate::for_tokenizer(&tokenizer),
            recipe,
            model,
            adapters,
            tokenizer,
            context,
            loaded_at: super::unix_now(),
        })
    }

    /// The chat-templated prompt for `messages` (an assistant turn opened at the end).
    pub fn prompt_ids(&self, messages: &[(String, String)]) -> Result<Vec<u32>, ServeModelError> {
        let mut turns = Vec::with_capacity(messages.len());
        for (i, (role, content)) in messages.iter().enumerate() {
            let role = match role.as_str() {
                "system" | "developer" => Role::System,
                "user" => Role::User,
                "assistant" => Role::Assistant,
                other => {
                    return Err(ServeModelError::Prompt(format!(
                        "messages[{i}].role {other:?}: expected system, developer, user or assistant"
                    )));
                }
            };
            turns.push(Message::new(role, content.clone()));
        }
        let pieces = self.template.generation_prompt(&turns, &[]);
        Ok(encode_pieces(&self.tokenizer, &pieces).map_err(|e| ServeModelError::Prompt(e.to_string()))?.ids)
    }

    /// Runs `job`, handing each new piece of final text to `on_text`, which may stop it
    /// (the client went away). Blocking: call it from a blocking thread.
    pub fn complete(
        &self,
        job: &Job,
        mut on_text: impl FnMut(&str) -> ControlFlow<()>,
    ) -> Result<Outcome, ServeModelError> {
        let stop_ids = [self.tokenizer.im_end_id(), self.tokenizer.eos_id()];
        let mut ids = Vec::new();
        let mut text = TextStream::new(job.stops.clone());
        let mut answer = String::new();
        let mut decode_error = None;
        let mut stopped_by_text = false;
        let limits = Limits { max_tokens: job.max_tokens, vocab: self.tokenizer.vocab_size(), stop_ids: &stop_ids };
        let finish = generate(&self.model, self.adapters.as_ref(), &job.prompt_ids, limits, &job.sampling, |id| {
            ids.push(id);
            let decoded = match self.tokenizer.decode(&ids, true) {
                Ok(d) => d,
                Err(e) => {
                    decode_error = Some(e.to_string());
                    return ControlFlow::Break(());
                }
            };
            let released = text.push(&decoded);
            answer.push_str(&released.text);
            stopped_by_text = released.stopped;
            if !released.text.is_empty() && on_text(&released.text).is_break() || released.stopped {
                return ControlFlow::Break(());
            }
            ControlFlow::Continue(())
        })
        .map_err(|e| ServeModelError::Generate(e.to_string()))?;
        if let Some(e) = decode_error {
            return Err(ServeModelError::Generate(e));
        }
        if !stopped_by_text {
            let decoded = self.tokenizer.decode(&ids, true).map_err(|e| ServeModelError::Generate(e.to_string()))?;
            let rest = text.finish(&decoded);
            if !rest.is_empty() {
                // The client may already be gone; the answer is complete either way.
                let _ = on_text(&rest);
                answer.push_str(&rest);
            }
        }
        Ok(Outcome {
            text: answer,
            completion_tokens: ids.len(),
            finish_reason: if finish == Finish::Length { "length" } else { "stop" },
        })
    }
}
