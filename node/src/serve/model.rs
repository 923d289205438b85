//! The model a node serves: a trained checkpoint (full weights, or a LoRA adapter over its
//! base, and any further adapters over the same base) on the serving engine
//! (`mindxtrain_trainer::infer`), with the recipe's tokenizer and chat template.
//!
//! Every completion is a request to one engine, which batches all of them step by step on the
//! model's device; `complete` only waits for its own request's events.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use candle_core::Device;
use mindxtrain_trainer::checkpoint;
use mindxtrain_trainer::data::template::{Piece, encode_pieces, pieces_to_string};
use mindxtrain_trainer::data::{ChatTemplate, Json, Message, Tokenizer};
use mindxtrain_trainer::infer::{
    Engine, EngineConfig, EngineError, EngineHandle, Event, FinishReason, KvBlocks, Latencies, Request, SamplingParams,
    Stats, TokenLogprob,
};
use mindxtrain_trainer::model::{Adapters, CausalLm, merge_lora};
use mindxtrain_trainer::recipe::{LoadedRecipe, Recipe};
use mindxtrain_trainer::run;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ServeModelError {
    #[error("loading the model: {0}")]
    Load(String),
    #[error("{0}")]
    Prompt(String),
    /// The engine refused the request (unknown adapter, prompt over the context, bad settings).
    #[error("{0}")]
    Refused(EngineError),
    #[error("generation failed: {0}")]
    Generate(String),
}

/// What one completion needs, already checked.
#[derive(Debug, Clone)]
pub struct Job {
    pub prompt_ids: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stops: Vec<String>,
    /// The served adapter that answers ([`ServedModel::resolve`]); `None`: the weights alone.
    pub adapter: Option<String>,
}

/// A templated prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    pub ids: Vec<u32>,
    /// The prompt ends inside an open `<think>` block.
    pub think_open: bool,
}

/// How a completion ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub text: String,
    /// The generated tokens (an end-of-turn token that ended the answer is not one).
    pub tokens: Vec<u32>,
    pub completion_tokens: usize,
    /// OpenAI's `finish_reason`: `stop` or `length`.
    pub finish_reason: &'static str,
}

pub struct ServedModel {
    /// The id clients name in `model` (`/v1/models`): the checkpoint as its run left it.
    pub name: String,
    pub recipe: Recipe,
    engine: EngineHandle,
    /// The engine's name for the checkpoint's own adapter (when served unmerged).
    own_adapter: Option<String>,
    /// Further adapters over the same base, each its own model id.
    extra: Vec<String>,
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
    /// The base an adapter applies to; `None`: the base recorded beside the adapter.
    pub base: Option<&'a Path>,
    /// Use `base` even though it is not the adapter's recorded base.
    pub force_base: bool,
    /// Fold a LoRA adapter into the base weights: faster decoding, same answers up to rounding.
    pub merge: bool,
    /// Overrides the recipe's `model.name`.
    pub name: Option<String>,
    /// Where the model is loaded and run (the recipe's hardware, or `serve --device`).
    pub device: &'a Device,
    /// Further PEFT adapters over the same base, served beside it as `(model id, directory)`.
    pub adapters: &'a [(String, PathBuf)],
}

impl ServedModel {
    pub fn load(src: &ModelSource<'_>) -> Result<ServedModel, ServeModelError> {
        let recipe = src.recipe.recipe.clone();
        let err = |e: &dyn std::fmt::Display| ServeModelError::Load(e.to_string());
        let base = run::adapter_base(&recipe, src.recipe_dir, src.checkpoint, src.base, src.force_base)
            .map_err(|e| err(&e))?;
        let tokenizer = run::base::tokenizer(&recipe, src.recipe_dir, base.as_deref()).map_err(|e| err(&e))?;
        let (mut model, mut adapters) =
            checkpoint::load_checkpoint(&recipe, base.as_deref(), src.checkpoint, src.device).map_err(|e| err(&e))?;
        if src.merge
            && let Some(ad) = adapters.take()
        {
            let merged = merge_lora(model.params(), model.config(), &ad).map_err(|e| err(&e))?;
            *model.params_mut() = merged;
        }
        let name = src.name.clone().unwrap_or_else(|| recipe.model.name.clone());
        let mut extra = Vec::new();
        let mut loaded = Vec::new();
        for (id, dir) in src.adapters {
            if *id == name || extra.contains(id) {
                return Err(ServeModelError::Load(format!("adapter id {id:?} is served twice")));
            }
            let ad = checkpoint::load_adapter(dir, model.config(), model.dtype(), src.device)
                .map_err(|e| ServeModelError::Load(format!("adapter {id:?} ({}): {e}", dir.display())))?;
            extra.push(id.clone());
            loaded.push((id.clone(), ad));
        }
        ServedModel::serve(recipe, name, model, tokenizer, adapters, loaded)
    }

    /// Serves `model`, made or loaded by the caller on its device, under `name` with
    /// `tokenizer` and the recipe's serve limits, as [`ServedModel::load`] serves a checkpoint:
    /// for benchmarks of the serving path on random weights, which have no checkpoint to load.
    pub fn from_model(
        recipe: Recipe,
        name: String,
        model: CausalLm,
        tokenizer: Tokenizer,
    ) -> Result<ServedModel, ServeModelError> {
        ServedModel::serve(recipe, name, model, tokenizer, None, Vec::new())
    }

    /// The engine over `model`, with the checkpoint's own adapter (served as `name`) and the
    /// further ones, each under its model id.
    fn serve(
        recipe: Recipe,
        name: String,
        model: CausalLm,
        tokenizer: Tokenizer,
        own: Option<Adapters>,
        extra: Vec<(String, Adapters)>,
    ) -> Result<ServedModel, ServeModelError> {
        let err = |e: &dyn std::fmt::Display| ServeModelError::Load(e.to_string());
        let context = (recipe.serve.max_model_len as usize).min(model.config().max_position_embeddings);
        let config = engine_config(&recipe, context, model.device(), extra.len() + 1);
        let mut engine = Engine::new(model, Some(tokenizer.clone()), config).map_err(|e| err(&e))?;
        let own_adapter = match own {
            Some(ad) => {
                engine.load_adapter(&name, ad).map_err(|e| err(&e))?;
                Some(name.clone())
            }
            None => None,
        };
        let mut ids = Vec::with_capacity(extra.len());
        for (id, ad) in extra {
            engine.load_adapter(&id, ad).map_err(|e| err(&e))?;
            ids.push(id);
        }
        Ok(ServedModel {
            name,
            template: ChatTemplate::for_tokenizer(&tokenizer),
            recipe,
            engine: EngineHandle::spawn(engine),
            own_adapter,
            extra: ids,
            tokenizer,
            context,
            loaded_at: super::unix_now(),
        })
    }

    /// Every model id this server answers to: the checkpoint's, then each further adapter's.
    pub fn model_ids(&self) -> Vec<String> {
        std::iter::once(self.name.clone()).chain(self.extra.iter().cloned()).collect()
    }

    /// The adapter a model id runs with (`Some(None)`: the weights alone); `None` for an id not
    /// served here.
    pub fn resolve(&self, id: &str) -> Option<Option<String>> {
        if id == self.name {
            return Some(self.own_adapter.clone());
        }
        self.extra.iter().any(|e| e == id).then(|| Some(id.to_string()))
    }

    /// The engine's load (queue, running batch, cache blocks).
    pub fn stats(&self) -> Stats {
        self.engine.stats()
    }

    /// Time to first token and between tokens of every completion so far.
    pub fn latencies(&self) -> Latencies {
        self.engine.latencies()
    }

    /// The chat-templated prompt for `messages` with `tools` offered (an assistant turn
    /// opened at the end).
    pub fn prompt(&self, messages: &[Message], tools: &[Json]) -> Result<Prompt, ServeModelError> {
        let pieces = self.template.generation_prompt(messages, tools);
        let ids = encode_pieces(&self.tokenizer, &pieces).map_err(|e| ServeModelError::Prompt(e.to_string()))?.ids;
        Ok(Prompt { ids, think_open: opens_think(&pieces) })
    }

    /// The checkpoint's tokenizer (every model id served here shares it).
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// `text` as the model's tokens, without a chat template (a completions prompt).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, ServeModelError> {
        self.tokenizer.encode(text).map_err(|e| ServeModelError::Prompt(e.to_string()))
    }

    /// The text of `ids` (special tokens included: an echoed prompt is the prompt).
    pub fn decode(&self, ids: &[u32]) -> Result<String, ServeModelError> {
        self.tokenizer.decode(ids, false).map_err(|e| ServeModelError::Prompt(e.to_string()))
    }

    /// The log-probability of each of `ids[1..]` and the `top` most likely tokens at its
    /// position, under the model `adapter` names ([`ServedModel::resolve`]). Blocking.
    pub fn score(&self, ids: &[u32], adapter: Option<&str>, top: usize) -> Result<Vec<TokenLogprob>, ServeModelError> {
        self.engine.score(ids.to_vec(), adapter.map(str::to_string), top).map_err(ServeModelError::Refused)
    }

    /// Runs `job`, handing each new piece of final text to `on_text`, which may stop it (the
    /// client went away: the engine drops the request and frees its blocks at its next step).
    /// Blocking: call it from a blocking thread.
    pub fn complete(
        &self,
        job: &Job,
        mut on_text: impl FnMut(&str) -> ControlFlow<()>,
    ) -> Result<Outcome, ServeModelError> {
        let request = Request {
            prompt: job.prompt_ids.clone(),
            max_tokens: job.max_tokens,
            sampling: job.sampling,
            adapter: job.adapter.clone(),
            stop: job.stops.clone(),
        };
        let events = self.engine.stream(request).map_err(ServeModelError::Refused)?;
        let mut answer = String::new();
        let mut tokens = Vec::new();
        for event in events {
            match event {
                Event::Token { id, text, .. } => {
                    tokens.push(id);
                    answer.push_str(&text);
                    if !text.is_empty() && on_text(&text).is_break() {
                        // Dropping the stream cancels the request.
                        let completion_tokens = tokens.len();
                        return Ok(Outcome { text: answer, tokens, completion_tokens, finish_reason: "stop" });
                    }
                }
                Event::Finished { reason, text, usage, .. } => {
                    if !text.is_empty() {
                        // The client may already be gone; the answer is complete either way.
                        let _ = on_text(&text);
                        answer.push_str(&text);
                    }
                    let finish_reason = if reason == FinishReason::Length { "length" } else { "stop" };
                    return Ok(Outcome {
                        text: answer,
                        tokens,
                        completion_tokens: usage.completion_tokens,
                        finish_reason,
                    });
                }
                Event::Failed(message) => return Err(ServeModelError::Generate(message)),
            }
        }
        Err(ServeModelError::Generate("the engine stopped".into()))
    }
}

/// Whether a generation prompt ends inside `<think>`: a thinking model's template opens the
/// block itself, and the answer starts with reasoning.
fn opens_think(pieces: &[Piece]) -> bool {
    pieces_to_string(pieces).trim_end().ends_with("<think>")
}

/// The engine for a recipe's `serve` section: `max_batch` sequences at once, `max_model_len`
/// tokens each. On a GPU the cache takes 90% of the memory the weights left free; on the CPU
/// exactly what `max_batch` full-length requests need.
fn engine_config(recipe: &Recipe, context: usize, device: &Device, adapters: usize) -> EngineConfig {
    let seqs = recipe.serve.max_batch.max(1) as usize;
    let block_size = 16;
    EngineConfig {
        block_size,
        max_model_len: context,
        max_num_seqs: seqs,
        max_batched_tokens: 2048.max(seqs),
        kv_blocks: if device.is_cuda() {
            KvBlocks::FreeMemory(0.9)
        } else {
            KvBlocks::Exact(seqs * context.div_ceil(block_size))
        },
        prefix_caching: true,
        max_adapters: adapters.max(8),
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        cuda_graphs: true,
        overlap_steps: true,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use mindxtrain_trainer::data::template::{JinjaTemplate, TemplateContext};
    use mindxtrain_trainer::data::{ChatTemplate, Message, Role};

    use super::opens_think;

    #[test]
    fn a_prompt_that_opens_a_think_block_is_told_from_one_that_closes_it() {
        let turn = [Message::new(Role::User, "hi")];
        // Qwen3 without thinking: an empty block, closed, in the prompt.
        assert!(!opens_think(&ChatTemplate::QWEN3.generation_prompt(&turn, &[])));
        assert!(!opens_think(&ChatTemplate::COMPACT.generation_prompt(&turn, &[])));
        // A thinking model's template ends its prompt inside the block.
        let source = "{% for m in messages %}{{ m.content }}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}";
        let thinking = JinjaTemplate::new(source, "thinking.jinja", TemplateContext::default()).unwrap();
        assert!(opens_think(&ChatTemplate::Jinja(Arc::new(thinking)).generation_prompt(&turn, &[])));
    }
}
