//! Preference losses on a [`PreferenceBatch`]: DPO (sigmoid with label smoothing, hinge, IPO)
//! and ORPO.
//!
//! Chosen and rejected rows run as one batch of `2B` rows. Each row's log-probability is the
//! sum over its target tokens, so the loss reaches the tokens through per-token weights on
//! the cross-entropy backward and the same engine serves SFT and preferences.

use std::collections::BTreeMap;

use candle_core::Tensor;

use super::ModelError;
use super::causal_lm::{CausalLm, StepOptions, Trainable};
use super::lora::Adapters;
use super::objective::ObjectiveValue;
use crate::batch::{IGNORE, PackedBatch, PreferenceBatch};

/// Which preference objective, with its strength.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PreferenceLoss {
    /// DPO against a reference policy, in one of TRL's forms ([`DpoForm`]).
    Dpo { beta: f64, label_smoothing: f64, form: DpoForm },
    /// `nll_c − λ·log σ(log odds(ā_c) − log odds(ā_r))` with `ā` the per-token mean log-prob of
    /// a response and `odds(p) = p / (1 − p)` (TRL's ORPO). `nll_c = −ā_c` is the chosen
    /// response's per-token mean NLL; TRL averages it over the batch's tokens instead, which
    /// weighs long responses more.
    Orpo { lambda: f64 },
}

/// The forms of the DPO loss, as TRL's `DPOTrainer` computes them (`loss_type`). With
/// `h = (π_c − ref_c) − (π_r − ref_r)` the margin of sequence log-probs:
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DpoForm {
    /// `−(1−ε)·log σ(βh) − ε·log σ(−βh)`, log-probs summed over response tokens.
    Sigmoid,
    /// `max(0, 1 − βh)` (SLiC's hinge), summed log-probs.
    Hinge,
    /// `(h − 1/(2β))²` (Azar et al.'s IPO) with each log-prob averaged over its response's
    /// tokens, as TRL averages them for IPO.
    Ipo,
}

/// The result of one preference micro-batch.
#[derive(Debug, Clone)]
pub struct PreferenceOutput {
    /// Sum over pairs of the pair loss (the caller divides by `pairs` across micro-batches).
    pub loss_sum: f64,
    pub pairs: usize,
    /// Policy sequence log-probs of each chosen and rejected row.
    pub chosen_logps: Vec<f64>,
    pub rejected_logps: Vec<f64>,
    /// Gradients of `loss_scale · loss_sum`.
    pub grads: BTreeMap<String, Tensor>,
}

impl CausalLm {
    /// The log-probability of each row's labelled tokens (a sum), without gradients.
    pub fn sequence_logps(&self, batch: &PackedBatch, adapters: Option<&Adapters>) -> Result<Vec<f64>, ModelError> {
        Ok(row_sums(&self.token_logps(batch, adapters)?, batch.seq_len))
    }

    /// One preference micro-batch. DPO's reference log-probs are `reference` (per pair:
    /// chosen, rejected) or, when `None`, this model with adapters off (the frozen base), which
    /// only makes sense when training adapters.
    pub fn forward_backward_preference(
        &self,
        batch: &PreferenceBatch,
        loss: PreferenceLoss,
        reference: Option<&[(f64, f64)]>,
        trainable: Trainable,
        adapters: Option<&Adapters>,
        opts: &StepOptions,
    ) -> Result<PreferenceOutput, ModelError> {
        self.forward_backward_preference_with(batch, loss, reference, trainable, adapters, opts, &super::NoHooks)
    }

    /// [`CausalLm::forward_backward_preference`] with a distributed run's `hooks` (see
    /// [`CausalLm::forward_backward_with`]).
    #[allow(clippy::too_many_arguments)]
    pub fn forward_backward_preference_with(
        &self,
        batch: &PreferenceBatch,
        loss: PreferenceLoss,
        reference: Option<&[(f64, f64)]>,
        trainable: Trainable,
        adapters: Option<&Adapters>,
        opts: &StepOptions,
        hooks: &dyn super::StepHooks,
    ) -> Result<PreferenceOutput, ModelError> {
        let pairs = batch.chosen.batch;
        if batch.rejected.batch != pairs {
            return Err(ModelError::Batch(format!("{pairs} chosen rows but {} rejected", batch.rejected.batch)));
        }
        let both = stack_rows(&batch.chosen, &batch.rejected)?;
        let t = both.seq_len;
        let refs = match (loss, reference) {
            (PreferenceLoss::Orpo { .. }, _) => Vec::new(),
            (PreferenceLoss::Dpo { .. }, Some(r)) => r.to_vec(),
            (PreferenceLoss::Dpo { .. }, None) => {
                if trainable != Trainable::Adapters {
                    return Err(ModelError::Lora("DPO without reference log-probs needs adapters to train".into()));
                }
                let base = self.sequence_logps(&both, None)?;
                (0..pairs).map(|i| (base[i], base[pairs + i])).collect()
            }
        };
        if matches!(loss, PreferenceLoss::Dpo { .. }) && refs.len() != pairs {
            return Err(ModelError::Batch(format!("{} reference pairs for {pairs} rows", refs.len())));
        }
        let counts = row_counts(&both.labels, t);
        let objective = |logps: &[f64]| {
            let logps = row_sums(logps, t);
            let (chosen, rejected) = logps.split_at(pairs);
            // d loss / d row log-prob, per row, then spread over the row's tokens.
            let mut d_logp = vec![0.0; 2 * pairs];
            let mut loss_sum = 0.0;
            match loss {
                PreferenceLoss::Dpo { beta, label_smoothing: eps, form } => {
                    for i in 0..pairs {
                        // IPO compares per-token means: each sum (the reference's too) over its count.
                        let (nc, nr) = match form {
                            DpoForm::Ipo => (counts[i] as f64, counts[pairs + i] as f64),
                            DpoForm::Sigmoid | DpoForm::Hinge => (1.0, 1.0),
                        };
                        if nc == 0.0 || nr == 0.0 {
                            return Err(ModelError::Batch(format!("pair {i} has a response without target tokens")));
                        }
                        let h = (chosen[i] - refs[i].0) / nc - (rejected[i] - refs[i].1) / nr;
                        // d loss / d h.
                        let dh = match form {
                            DpoForm::Sigmoid => {
                                let z = beta * h;
                                loss_sum += -(1.0 - eps) * log_sigmoid(z) - eps * log_sigmoid(-z);
                                (-(1.0 - eps) * sigmoid(-z) + eps * sigmoid(z)) * beta
                            }
                            DpoForm::Hinge => {
                                let gap = 1.0 - beta * h;
                                loss_sum += gap.max(0.0);
                                if gap > 0.0 { -beta } else { 0.0 }
                            }
                            DpoForm::Ipo => {
                                let off = h - 1.0 / (2.0 * beta);
                                loss_sum += off * off;
                                2.0 * off
                            }
                        };
                        d_logp[i] = dh / nc;
                        d_logp[pairs + i] = -dh / nr;
                    }
                }
                PreferenceLoss::Orpo { lambda } => {
                    for i in 0..pairs {
                        let (nc, nr) = (counts[i], counts[pairs + i]);
                        if nc == 0 || nr == 0 {
                            return Err(ModelError::Batch(format!("pair {i} has a response without target tokens")));
                        }
                        let (ac, ar) = (chosen[i] / nc as f64, rejected[i] / nr as f64);
                        // log odds(a) = a − log(1 − e^a); 1 − e^a = −expm1(a) keeps precision near a = 0.
                        let log_odds = (ac - ar) - ((-ac.exp_m1()).ln() - (-ar.exp_m1()).ln());
                        loss_sum += -ac - lambda * log_sigmoid(log_odds);
                        let s = sigmoid(-log_odds);
                        let d_ac = -1.0 - lambda * s / (-ac.exp_m1());
                        let d_ar = lambda * s / (-ar.exp_m1());
                        d_logp[i] = d_ac / nc as f64;
                        d_logp[pairs + i] = d_ar / nr as f64;
                    }
                }
            }
            let d_logp = d_logp.iter().flat_map(|&d| std::iter::repeat_n(d, t)).collect();
            Ok(ObjectiveValue { loss: loss_sum, d_logp })
        };
        let out = self.forward_backward_logps_with(&both, trainable, adapters, opts, objective, hooks)?;
        let logps = row_sums(&out.logps, t);
        let (chosen, rejected) = logps.split_at(pairs);
        Ok(PreferenceOutput {
            loss_sum: out.loss,
            pairs,
            chosen_logps: chosen.to_vec(),
            rejected_logps: rejected.to_vec(),
            grads: out.grads,
        })
    }
}

/// Per-row sums of a row-major `[rows × t]` list.
pub fn row_sums(values: &[f64], t: usize) -> Vec<f64> {
    values.chunks(t.max(1)).map(|row| row.iter().sum()).collect()
}

pub(crate) fn sigmoid(x: f64) -> f64 {
    if x >= 0.0 { 1.0 / (1.0 + (-x).exp()) } else { x.exp() / (1.0 + x.exp()) }
}

pub(crate) fn log_sigmoid(x: f64) -> f64 {
    if x >= 0.0 { -(-x).exp().ln_1p() } else { x - x.exp().ln_1p() }
}

fn row_counts(labels: &[i64], t: usize) -> Vec<usize> {
    labels.chunks(t).map(|row| row.iter().filter(|&&l| l != IGNORE).count()).collect()
}

/// `a` then `b` as one batch, the shorter rows padded (segment 0, ignored labels).
fn stack_rows(a: &PackedBatch, b: &PackedBatch) -> Result<PackedBatch, ModelError> {
    let t = a.seq_len.max(b.seq_len);
    let mut out = PackedBatch {
        batch: a.batch + b.batch,
        seq_len: t,
        input_ids: Vec::new(),
        position_ids: Vec::new(),
        segment_ids: Vec::new(),
        labels: Vec::new(),
    };
    for p in [a, b] {
        let n = p.batch * p.seq_len;
        if [p.input_ids.len(), p.position_ids.len(), p.segment_ids.len(), p.labels.len()].iter().any(|&l| l != n) {
            return Err(ModelError::Batch("preference rows with inconsistent lengths".into()));
        }
        for r in 0..p.batch {
            let span = r * p.seq_len..(r + 1) * p.seq_len;
            let pad = t - p.seq_len;
            out.input_ids.extend(p.input_ids[span.clone()].iter().copied().chain(std::iter::repeat_n(0, pad)));
            out.position_ids.extend(p.position_ids[span.clone()].iter().copied().chain(std::iter::repeat_n(0, pad)));
            out.segment_ids.extend(p.segment_ids[span.clone()].iter().copied().chain(std::iter::repeat_n(0, pad)));
            out.labels.extend(p.labels[span].iter().copied().chain(std::iter::repeat_n(IGNORE, pad)));
        }
    }
    Ok(out)
}
