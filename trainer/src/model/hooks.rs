//! What a distributed run does around the parts of one training step: hand each part's
//! gradients to the reduction as soon as they are complete (so they travel while the backward
//! pass goes on), and gather the weights of a part this rank does not keep (ZeRO-3).
//!
//! A single-process step passes [`NoHooks`]; `crate::parallel` implements the rest.

use candle_core::Tensor;

use super::ModelError;
use super::block::Grads;

/// A part of the model, in the order the forward pass meets them: the embedding, the blocks,
/// then the head (final norm and `lm_head`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stage {
    Embedding,
    Block(usize),
    Head,
}

/// Called by [`super::CausalLm`]'s forward and backward around every [`Stage`]. Methods take `&self`:
/// implementations keep their state in cells, as the step borrows them for its whole length.
pub trait StepHooks {
    /// A weight the model does not hold (ZeRO-3: gathered for the current stage).
    fn weight(&self, _name: &str) -> Option<Tensor> {
        None
    }

    /// Before `stage` runs forward, or backward when `backward`.
    fn enter(&self, _stage: Stage, _backward: bool) -> Result<(), ModelError> {
        Ok(())
    }

    /// After `stage` ran.
    fn leave(&self, _stage: Stage, _backward: bool) -> Result<(), ModelError> {
        Ok(())
    }

    /// Every gradient of `stage` is complete for this micro-batch: take from `grads` what
    /// should travel now (what is left is returned by the step as usual). A parameter's gradient
    /// is complete after the last stage that reaches it: tied embeddings get theirs at
    /// [`Stage::Embedding`], after the head has added its part.
    fn grads_ready(&self, _stage: Stage, _grads: &mut Grads) -> Result<(), ModelError> {
        Ok(())
    }
}

/// A step on one process: nothing to gather, nothing to send.
pub struct NoHooks;

impl StepHooks for NoHooks {}

/// The stage whose backward completes a parameter's gradient, from its HF or PEFT name:
/// `…layers.{i}.…` → block `i`; the final norm and an untied `lm_head` → the head; the embedding
/// (tied or not) → the embedding stage.
pub fn stage_of(name: &str) -> Stage {
    if let Some(i) = name.find("layers.") {
        let digits: String = name[i + "layers.".len()..].chars().take_while(char::is_ascii_digit).collect();
        if let Ok(layer) = digits.parse() {
            return Stage::Block(layer);
        }
    }
    if name.contains("embed_tokens") { Stage::Embedding } else { Stage::Head }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_the_stage_that_completes_them() {
        assert_eq!(stage_of("model.layers.12.mlp.down_proj.weight"), Stage::Block(12));
        assert_eq!(stage_of("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"), Stage::Block(0));
        assert_eq!(stage_of("model.embed_tokens.weight"), Stage::Embedding);
        assert_eq!(stage_of("lm_head.weight"), Stage::Head);
        assert_eq!(stage_of("model.norm.weight"), Stage::Head);
        assert!(
            Stage::Embedding < Stage::Block(0) && Stage::Block(3) < Stage::Block(10) && Stage::Block(99) < Stage::Head
        );
    }
}
