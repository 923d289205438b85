//! The optimizer a recipe names (`train.optimizer.name`), built from its `train.optimizer` and
//! restored from a checkpoint only by the optimizer that saved it.

use std::collections::BTreeMap;

use candle_core::Tensor;

use super::{Adafactor, AdafactorConfig, AdamW, AdamWConfig, Lion, LionConfig, OptimError, Sgd, SgdConfig};
use crate::recipe::{Optimizer as OptimizerRecipe, OptimizerName};

/// One of the optimizers a run can train with; every one keeps its state per parameter, so a
/// rank of a sharded run keeps the state of the tensors it owns.
#[derive(Debug, Clone, PartialEq)]
pub enum Optimizer {
    AdamW(AdamW),
    Sgd(Sgd),
    Lion(Lion),
    Adafactor(Adafactor),
}

/// The same call on whichever optimizer it is.
macro_rules! each {
    ($self:expr, $o:ident => $call:expr) => {
        match $self {
            Optimizer::AdamW($o) => $call,
            Optimizer::Sgd($o) => $call,
            Optimizer::Lion($o) => $call,
            Optimizer::Adafactor($o) => $call,
        }
    };
}

impl Optimizer {
    /// A fresh optimizer as `train.optimizer` describes it.
    pub fn from_recipe(recipe: &OptimizerRecipe) -> Result<Self, OptimError> {
        Ok(match recipe.name {
            OptimizerName::AdamW => Optimizer::AdamW(AdamW::new(AdamWConfig::from_recipe(recipe))),
            OptimizerName::Sgd => Optimizer::Sgd(Sgd::new(SgdConfig::from_recipe(recipe))),
            OptimizerName::Lion => Optimizer::Lion(Lion::new(LionConfig::from_recipe(recipe))),
            OptimizerName::Adafactor => Optimizer::Adafactor(Adafactor::new(AdafactorConfig::from_recipe(recipe))),
            OptimizerName::AdamW8bit => return Err(OptimError::AdamW8bitNotBuilt),
        })
    }

    /// The optimizer `train.optimizer` describes with the state a checkpoint saved: refused when
    /// `saved` (the name the checkpoint recorded) is not the recipe's optimizer, whose state
    /// would be read as another's.
    pub fn restore(
        recipe: &OptimizerRecipe,
        saved: &str,
        state: &BTreeMap<String, Tensor>,
    ) -> Result<Self, OptimError> {
        let fresh = Optimizer::from_recipe(recipe)?;
        if saved != fresh.name() {
            return Err(OptimError::OtherOptimizer { saved: saved.to_string(), recipe: fresh.name().to_string() });
        }
        fresh.with_state(state)
    }

    /// This optimizer's configuration with `state` ([`Optimizer::state_tensors`] of the same
    /// optimizer) in place of its own.
    pub fn with_state(&self, state: &BTreeMap<String, Tensor>) -> Result<Self, OptimError> {
        Ok(match self {
            Optimizer::AdamW(o) => Optimizer::AdamW(AdamW::from_state_tensors(*o.config(), state)?),
            Optimizer::Sgd(o) => Optimizer::Sgd(Sgd::from_state_tensors(*o.config(), state)?),
            Optimizer::Lion(o) => Optimizer::Lion(Lion::from_state_tensors(*o.config(), state)?),
            Optimizer::Adafactor(o) => Optimizer::Adafactor(Adafactor::from_state_tensors(*o.config(), state)?),
        })
    }

    /// The recipe's name for it, which checkpoints record beside its state.
    pub fn name(&self) -> &'static str {
        match self {
            Optimizer::AdamW(_) => "adamw",
            Optimizer::Sgd(_) => "sgd",
            Optimizer::Lion(_) => "lion",
            Optimizer::Adafactor(_) => "adafactor",
        }
    }

    /// Updates taken so far.
    pub fn step_count(&self) -> u64 {
        each!(self, o => o.step_count())
    }

    /// One update of every parameter in `params` with learning rate `lr` (see
    /// [`super::Stateful::step`]).
    pub fn step(
        &mut self,
        params: &mut BTreeMap<String, Tensor>,
        grads: &BTreeMap<String, Tensor>,
        lr: f64,
    ) -> Result<(), OptimError> {
        each!(self, o => o.step(params, grads, lr))
    }

    /// The state as tensors for a checkpoint, on the host.
    pub fn state_tensors(&self) -> Result<BTreeMap<String, Tensor>, OptimError> {
        each!(self, o => o.state_tensors())
    }

    /// The state tensors kept for a parameter `name` of shape `dims`, with their shapes.
    pub fn state_shapes(&self, name: &str, dims: &[usize]) -> Vec<(String, Vec<usize>)> {
        each!(self, o => o.state_shapes(name, dims))
    }
}

#[cfg(test)]
mod tests;
