//! A KTO step: the step's preference pairs become unpaired desirable and undesirable examples
//! ([`crate::rl::unpaired`]); the reference point `z₀` is estimated without gradient on
//! mismatched prompt/answer pairs; then each example's loss ([`crate::rl::kto`]) is
//! differentiated through its answer's tokens.

use serde_json::json;

use super::{Session, StepGrads};
use crate::rl::kto::{KtoLoss, reference_point};
use crate::rl::pack::{Seq, pack};
use crate::rl::unpaired::{mismatched, unpair};
use crate::run::RunError;
use crate::run::sequences;

use super::reinforce::StepOpts;

impl Session<'_> {
    pub(in crate::run) fn kto_step(&mut self, loss: KtoLoss, opts: StepOpts) -> Result<StepGrads, RunError> {
        let train = &self.spec.recipe.recipe.train;
        let seq_len = self.spec.recipe.recipe.data.seq_len as usize;
        let mut it = self.dataset.preference_batches(train.batch.per_device as usize, self.cursor)?;
        let batches: Vec<_> = (0..train.batch.grad_accum).map(|_| it.next_batch()).collect::<Result<_, _>>()?;
        self.cursor = it.cursor();
        let examples = unpair(&batches).map_err(|e| RunError::Recipe(format!("KTO: {e}")))?;
        let kl_seqs = mismatched(&examples).map_err(|e| RunError::Recipe(format!("KTO: {e}")))?;
        let seqs: Vec<Seq> = examples.iter().map(|e| e.seq.clone()).collect();
        let micro = self.spec.plan.choices.micro_batch.max(1);
        let pad = self.tokenizer.pad_id();
        let mbs = pack(&seqs, seq_len, micro, pad).map_err(RunError::Recipe)?;
        let kl_mbs = pack(&kl_seqs, seq_len, micro, pad).map_err(RunError::Recipe)?;

        let sums = |v: Vec<Vec<f64>>| -> Vec<f64> { v.iter().map(|s| s.iter().sum()).collect() };
        let (ref_model, ref_adapters) = self.reference_policy();
        let reference = sums(sequences::token_logps(ref_model, ref_adapters, &mbs, seqs.len())?);
        let kl_reference = sums(sequences::token_logps(ref_model, ref_adapters, &kl_mbs, kl_seqs.len())?);
        let kl_policy = sums(sequences::token_logps(&self.model, self.adapters.as_ref(), &kl_mbs, kl_seqs.len())?);
        let z0 = reference_point(&kl_policy, &kl_reference);

        let n = examples.len();
        let mut ratios = vec![0.0; n];
        let (loss_sum, grads, tokens) = sequences::forward_backward(
            &self.model,
            self.method.trainable,
            self.adapters.as_ref(),
            &mbs,
            &opts(1.0 / n as f64),
            |i, lp| {
                let policy: f64 = lp.iter().sum();
                ratios[i] = policy - reference[i];
                let (l, d) = loss.example(policy, reference[i], z0, examples[i].desirable);
                (l, vec![d; lp.len()])
            },
        )?;
        let mean = |desirable: bool| {
            let v: Vec<f64> = (0..n).filter(|&i| examples[i].desirable == desirable).map(|i| ratios[i]).collect();
            (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
        };
        let report = json!({
            "kl": z0,
            "desirable_logratio": mean(true),
            "undesirable_logratio": mean(false),
            "examples": n,
        });
        Ok(StepGrads { grads, loss: loss_sum / n as f64, tokens, rl: Some(report) })
    }
}
