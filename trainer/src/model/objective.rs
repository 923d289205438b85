//! Objectives written over per-token log-probabilities: the forward gives every labelled
//! token's log-probability under the model, the caller turns them into a loss and its
//! derivative per token on the host, and the backward turns those into parameter gradients.
//!
//! A token's loss in the engine is its cross-entropy, `−log p`, so `d loss/d token loss =
//! −d loss/d log p`: any objective of the log-probs (DPO's and ORPO's sequence sums, GRPO's
//! clipped ratios, KTO's reference-point sigmoids) reaches the weights through the same
//! cross-entropy backward as supervised training, with per-token weights.

use candle_core::{DType, Tensor};

use super::ModelError;
use super::block::Grads;
use super::causal_lm::{CausalLm, StepOptions, Trainable};
use super::hooks::{NoHooks, StepHooks};
use super::lora::Adapters;
use crate::batch::{IGNORE, PackedBatch};

/// What an objective computed from a batch's log-probabilities.
#[derive(Debug, Clone, PartialEq)]
pub struct ObjectiveValue {
    /// The loss (reported as it is; the gradient is of `loss_scale ·` it).
    pub loss: f64,
    /// `d loss / d log p` for every position of the batch (`[batch × seq_len]`, row-major);
    /// positions without a label are ignored.
    pub d_logp: Vec<f64>,
}

/// The result of [`CausalLm::forward_backward_logps`].
#[derive(Debug, Clone)]
pub struct ObjectiveOutput {
    pub loss: f64,
    /// The log-probabilities the objective saw (0 where there is no label).
    pub logps: Vec<f64>,
    /// Gradients of `loss_scale · loss`.
    pub grads: Grads,
}

impl CausalLm {
    /// Every labelled token's log-probability (`[batch × seq_len]`, row-major, 0 where the
    /// label is ignored), without gradients. On a GPU the logits are never whole: the head and
    /// its log-sum-exp run in vocabulary chunks.
    pub fn token_logps(&self, batch: &PackedBatch, adapters: Option<&Adapters>) -> Result<Vec<f64>, ModelError> {
        let losses = self.token_losses(batch, adapters)?;
        Ok(negated(&losses)?)
    }

    /// One micro-batch under `objective`: the forward (with dropout and activation
    /// checkpointing as `opts` say), `objective(log-probs)`, then the backward of
    /// `opts.loss_scale · loss`.
    pub fn forward_backward_logps(
        &self,
        batch: &PackedBatch,
        trainable: Trainable,
        adapters: Option<&Adapters>,
        opts: &StepOptions,
        objective: impl FnOnce(&[f64]) -> Result<ObjectiveValue, ModelError>,
    ) -> Result<ObjectiveOutput, ModelError> {
        self.forward_backward_logps_with(batch, trainable, adapters, opts, objective, &NoHooks)
    }

    /// [`CausalLm::forward_backward_logps`] with a distributed run's `hooks` around every stage
    /// (see [`CausalLm::forward_backward_with`]).
    pub fn forward_backward_logps_with(
        &self,
        batch: &PackedBatch,
        trainable: Trainable,
        adapters: Option<&Adapters>,
        opts: &StepOptions,
        objective: impl FnOnce(&[f64]) -> Result<ObjectiveValue, ModelError>,
        hooks: &dyn StepHooks,
    ) -> Result<ObjectiveOutput, ModelError> {
        let ctx = self.step_ctx(batch, trainable, adapters, Some(opts.dropout_seed), hooks)?;
        let (tape, losses) = self.forward_tape(&ctx, batch, opts.activation_checkpointing)?;
        let logps = negated(&losses)?;
        let value = objective(&logps)?;
        if value.d_logp.len() != logps.len() {
            return Err(ModelError::Batch(format!(
                "the objective gave {} derivatives for {} positions",
                value.d_logp.len(),
                logps.len()
            )));
        }
        // Only labelled positions carry a loss; the cross-entropy backward ignores the rest,
        // but a non-finite value there would still poison the sum.
        let d_losses: Vec<f64> = value
            .d_logp
            .iter()
            .zip(&batch.labels)
            .map(|(&d, &l)| if l == IGNORE { 0.0 } else { -d * opts.loss_scale })
            .collect();
        let d_losses = Tensor::from_vec(d_losses, logps.len(), self.device())?.to_dtype(self.dtype())?;
        let grads = self.backward_tape(&ctx, &tape, &d_losses)?;
        Ok(ObjectiveOutput { loss: value.loss, logps, grads })
    }
}

/// `−losses` as f64 on the host.
fn negated(losses: &Tensor) -> Result<Vec<f64>, candle_core::Error> {
    Ok(losses.flatten_all()?.to_dtype(DType::F64)?.to_vec1::<f64>()?.into_iter().map(|l| -l).collect())
}
