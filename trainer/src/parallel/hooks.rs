//! The rank's part in a training step, as the model's [`StepHooks`]: gradients handed to the
//! bucketed reduction as each stage completes them, ZeRO-3 weights gathered around each block,
//! and the stages timed when a trace is recorded.

use super::buckets::GradReducer;
use super::trace::Trace;
use super::zero3::Zero3Window;
use crate::model::{Grads, ModelError, Stage, StepHooks, stage_of};
use candle_core::{Device, Tensor};
use std::cell::RefCell;

/// One micro-batch's hooks.
pub struct RankHooks<'s, 'a> {
    /// On the step's last micro-batch: where complete gradients go, added to `earlier`.
    pub reducer: Option<&'s RefCell<GradReducer<'a>>>,
    /// The sums of the step's earlier micro-batches (this rank's).
    pub earlier: &'s RefCell<Grads>,
    pub window: Option<&'s Zero3Window<'a>>,
    pub trace: Option<(&'s Trace, u64)>,
    /// Synchronised at stage boundaries while tracing (a GPU's queued work has then run).
    pub device: &'s Device,
    /// The first reduction error, kept for the step to report (the model sees a generic error).
    pub error: &'s RefCell<Option<crate::collective::CollectiveError>>,
}

fn label(stage: Stage, backward: bool) -> String {
    let pass = if backward { "backward" } else { "forward" };
    match stage {
        Stage::Embedding => format!("embedding {pass}"),
        Stage::Block(l) => format!("block {l} {pass}"),
        Stage::Head => format!("head {pass}"),
    }
}

impl RankHooks<'_, '_> {
    fn fail(&self, e: crate::collective::CollectiveError) -> ModelError {
        let msg = format!("gradient reduction: {e}");
        self.error.borrow_mut().get_or_insert(e);
        ModelError::Batch(msg)
    }
}

impl StepHooks for RankHooks<'_, '_> {
    fn weight(&self, name: &str) -> Option<Tensor> {
        self.window.and_then(|w| w.weight(name))
    }

    fn enter(&self, stage: Stage, backward: bool) -> Result<(), ModelError> {
        if let Some(w) = self.window {
            w.enter(stage, backward)?;
        }
        if let Some((t, _)) = self.trace {
            self.device.synchronize()?;
            t.begin(label(stage, backward));
        }
        Ok(())
    }

    fn leave(&self, stage: Stage, backward: bool) -> Result<(), ModelError> {
        if let Some((t, step)) = self.trace {
            self.device.synchronize()?;
            t.end("compute", step);
        }
        if let Some(w) = self.window {
            w.leave(stage, backward)?;
        }
        Ok(())
    }

    fn grads_ready(&self, stage: Stage, grads: &mut Grads) -> Result<(), ModelError> {
        let Some(reducer) = self.reducer else { return Ok(()) };
        // The embedding is the last stage: whatever is left is complete too.
        let names: Vec<String> =
            grads.keys().filter(|n| stage == Stage::Embedding || stage_of(n) == stage).cloned().collect();
        let mut earlier = self.earlier.borrow_mut();
        let mut r = reducer.borrow_mut();
        for name in names {
            let Some(g) = grads.remove(&name) else { continue };
            // The same sum a single process takes: earlier micro-batches first, this one added.
            let total = match earlier.remove(&name) {
                Some(a) => (a + g)?,
                None => g,
            };
            r.add(name, total).map_err(|e| self.fail(e))?;
        }
        Ok(())
    }
}
