//! One optimizer step: the step's batches read from the data stream, this rank's share computed
//! micro-batch by micro-batch, the gradients reduced (across ranks), clipped, and applied.

use super::RunError;
use super::method::RlPlan;
use super::microbatch::{accumulate, split, split_pairs};
use super::session::{Session, reference_logps};
use crate::batch::{PackedBatch, PreferenceBatch};
use crate::collective::CollectiveError;
use crate::model::{Grads, NoHooks, StepHooks, StepOptions, Trainable};
use crate::optim::{clip_grad_norm, clip_to_norm, global_grad_norm};
use crate::parallel::trace::Event;
use crate::parallel::{self, GradReducer, RankHooks, Reduce, Sharding, Zero3Window};
use std::cell::RefCell;

/// One forward/backward's rows.
enum Micro {
    Packed(PackedBatch),
    Pairs(PreferenceBatch),
}

/// What an optimizer step did, for the progress report.
pub(super) struct Stepped {
    /// Per-token (or per-pair) mean loss over the whole global batch.
    pub loss: f64,
    pub tokens: u64,
    pub grad_norm: f64,
    pub lr: f64,
    /// What an RL step adds to `train.progress` (rewards, KL, clipping, timings).
    pub rl: Option<serde_json::Value>,
}

impl Session<'_> {
    /// One optimizer step over the global batch: `grad_accum × world` batches of `per_device`
    /// rows, this rank's share split into the plan's micro-batches.
    pub(super) fn one_step(&mut self) -> Result<Stepped, RunError> {
        if let Some(rl) = self.method.rl.clone() {
            return self.rl_step(rl);
        }
        let train = &self.spec.recipe.recipe.train;
        let per_device = train.batch.per_device as usize;
        let micro = self.spec.plan.choices.micro_batch.min(per_device).max(1);
        let (rank, world) = self.ranks.as_ref().map_or((0, 1), |r| (r.rank(), r.world()));
        let n = self.accum as usize * world;
        // Every rank reads every batch of the step (packing ids is cheap): the cursor, the token
        // count and the loss denominator are then the same everywhere without a message.
        let (micros, tokens, denominator) = if self.method.preference.is_some() {
            let mut it = self.dataset.preference_batches(per_device, self.cursor)?;
            let batches: Vec<PreferenceBatch> = (0..n).map(|_| it.next_batch()).collect::<Result<_, _>>()?;
            self.cursor = it.cursor();
            let pairs: usize = batches.iter().map(|b| b.chosen.batch).sum();
            let tokens = batches.iter().map(|b| (b.chosen.input_ids.len() + b.rejected.input_ids.len()) as u64).sum();
            let micros = parallel::shard(batches, rank, world)
                .iter()
                .flat_map(|b| split_pairs(b, micro))
                .map(Micro::Pairs)
                .collect::<Vec<_>>();
            (micros, tokens, pairs as f64)
        } else {
            let mut it = self.dataset.batches(per_device, self.cursor)?;
            let batches: Vec<PackedBatch> = (0..n).map(|_| it.next_batch()).collect::<Result<_, _>>()?;
            self.cursor = it.cursor();
            let targets: usize = batches.iter().map(|b| b.target_tokens()).sum();
            let tokens = batches.iter().map(|b| b.segment_ids.iter().filter(|&&s| s != 0).count() as u64).sum::<u64>();
            let micros = parallel::shard(batches, rank, world)
                .iter()
                .flat_map(|b| split(b, micro))
                .map(Micro::Packed)
                .collect::<Vec<_>>();
            (micros, tokens, targets.max(1) as f64)
        };
        let opts = self.step_options()(1.0 / denominator);
        let (loss_sum, mut grads) = match self.ranks.is_some() {
            false => self.local_grads(&micros, &opts)?,
            true => self.ranked_grads(&micros, &opts)?,
        };
        let clip = train.optimizer.grad_clip;
        let (loss_sum, grad_norm) = match &self.ranks {
            None => (loss_sum, if clip > 0.0 { clip_grad_norm(&mut grads, clip)? } else { global_grad_norm(&grads)? }),
            Some(r) => {
                let loss_sum = r.comm.sum_f64(loss_sum)?;
                let norm = if matches!(r.sharding(), Sharding::Zero2 | Sharding::Zero3) {
                    r.sharded_grad_norm(&grads)?
                } else {
                    global_grad_norm(&grads)?
                };
                clip_to_norm(&mut grads, norm, clip)?;
                (loss_sum, norm)
            }
        };
        let lr = self.schedule.lr(self.step);
        let target = match (self.method.trainable, self.adapters.as_mut()) {
            (Trainable::Adapters, Some(a)) => &mut a.tensors,
            _ => self.model.params_mut(),
        };
        match &self.ranks {
            Some(r) if r.sharding() != Sharding::None => r.update(&mut self.optimizer, target, &grads, lr)?,
            _ => self.optimizer.step(target, &grads, lr)?,
        }
        self.step += 1;
        Ok(Stepped { loss: loss_sum / denominator, tokens, grad_norm, lr, rl: None })
    }

    /// This step's options at a given loss scale (the dropout stream is the step's own); the
    /// closure borrows nothing, so the RL steps can hold it while they change the session.
    fn step_options(&self) -> impl Fn(f64) -> StepOptions + use<> {
        let checkpointing = self.spec.plan.choices.activation_checkpointing;
        let dropout_seed = self.spec.recipe.recipe.meta.seed ^ (self.step + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        move |loss_scale| StepOptions { activation_checkpointing: checkpointing, dropout_seed, loss_scale }
    }

    /// GRPO, GSPO (rollouts scored, then the policy's step) and KTO: one process only, which
    /// [`Session::open`] ensures (a distributed run of them is refused there).
    fn rl_step(&mut self, rl: RlPlan) -> Result<Stepped, RunError> {
        let opts = self.step_options();
        let mut out = match rl {
            RlPlan::Policy(policy) => self.policy_step(&policy, &opts)?,
            RlPlan::Kto(loss) => self.kto_step(loss, &opts)?,
        };
        let target = match (self.method.trainable, self.adapters.as_mut()) {
            (Trainable::Adapters, Some(a)) => &mut a.tensors,
            _ => self.model.params_mut(),
        };
        if out.grads.is_empty() {
            // A step whose groups all scored alike has nothing to learn: zero gradients, and
            // the optimizer steps as it would on any other (as TRL's does).
            for (name, p) in target.iter() {
                out.grads.insert(name.clone(), p.zeros_like()?);
            }
        }
        let clip = self.spec.recipe.recipe.train.optimizer.grad_clip;
        let grad_norm = if clip > 0.0 { clip_grad_norm(&mut out.grads, clip)? } else { global_grad_norm(&out.grads)? };
        let lr = self.schedule.lr(self.step);
        self.optimizer.step(target, &out.grads, lr)?;
        self.step += 1;
        Ok(Stepped { loss: out.loss, tokens: out.tokens, grad_norm, lr, rl: out.rl })
    }

    /// One micro-batch's forward and backward.
    fn compute(&self, mb: &Micro, opts: &StepOptions, hooks: &dyn StepHooks) -> Result<(f64, Grads), RunError> {
        let (trainable, adapters) = (self.method.trainable, self.adapters.as_ref());
        Ok(match mb {
            Micro::Packed(b) => {
                let out = self.model.forward_backward_with(b, trainable, adapters, opts, hooks)?;
                (out.loss_sum, out.grads)
            }
            Micro::Pairs(b) => {
                let loss = self.method.preference.ok_or_else(|| RunError::Recipe("pairs without a loss".into()))?;
                let reference = self.reference.as_ref().map(|f| reference_logps(f, b)).transpose()?;
                let out = self.model.forward_backward_preference_with(
                    b,
                    loss,
                    reference.as_deref(),
                    trainable,
                    adapters,
                    opts,
                    hooks,
                )?;
                (out.loss_sum, out.grads)
            }
        })
    }

    /// A single process: the micro-batches' gradients summed in order.
    fn local_grads(&self, micros: &[Micro], opts: &StepOptions) -> Result<(f64, Grads), RunError> {
        let (mut loss_sum, mut grads) = (0.0, Grads::new());
        for mb in micros {
            let (loss, g) = self.compute(mb, opts, &NoHooks)?;
            loss_sum += loss;
            accumulate(&mut grads, g)?;
        }
        Ok((loss_sum, grads))
    }

    /// A rank: its micro-batches summed in order, the last one's gradients handed to the
    /// reduction stage by stage while its backward goes on; returns this rank's loss sum and the
    /// reduced gradients (all of them, or those of the tensors it owns under ZeRO-2/3).
    fn ranked_grads(&self, micros: &[Micro], opts: &StepOptions) -> Result<(f64, Grads), RunError> {
        let r = self.ranks.as_ref().ok_or_else(|| RunError::Recipe("not a distributed run".into()))?;
        let reduce = match (r.sharding(), &r.owners) {
            (Sharding::Zero2 | Sharding::Zero3, Some(o)) => Reduce::Owners(o),
            _ => Reduce::Everyone,
        };
        let reducer = RefCell::new(GradReducer::new(&r.comm, reduce, r.bucket_bytes()));
        let earlier = RefCell::new(Grads::new());
        let error = RefCell::new(None::<CollectiveError>);
        let window = match (&r.owners, r.sharding()) {
            (Some(o), Sharding::Zero3) => {
                let shapes = r.sharded.iter().cloned().collect();
                let layers = self.model.config().num_hidden_layers;
                let w =
                    Zero3Window::open(&r.comm, o, &shapes, self.model.params(), layers, self.model.dtype(), &r.device);
                Some(w.map_err(|e| collective_or(&error, e.into()))?)
            }
            _ => None,
        };
        let step = self.step + 1;
        let trace = r.trace.as_ref().map(|(t, _)| t).filter(|t| t.covers(step)).map(|t| (t, step));
        let mut loss_sum = 0.0;
        for (i, mb) in micros.iter().enumerate() {
            let hooks = RankHooks {
                reducer: (i + 1 == micros.len()).then_some(&reducer),
                earlier: &earlier,
                window: window.as_ref(),
                trace,
                device: &r.device,
                error: &error,
            };
            let (loss, g) = self.compute(mb, opts, &hooks).map_err(|e| collective_or(&error, e))?;
            loss_sum += loss;
            accumulate(&mut earlier.borrow_mut(), g)?;
        }
        if let Some(w) = window {
            w.close().map_err(|e| collective_or(&error, e.into()))?;
        }
        let reducer = reducer.into_inner();
        let buckets = reducer.tickets.clone();
        let grads = reducer.finish()?;
        if let Some(name) = earlier.borrow().keys().next() {
            return Err(RunError::Recipe(format!("gradient `{name}` was never handed to the reduction")));
        }
        let spans = r.comm.take_spans();
        if let (Some((t, step)), Some((_, path))) = (trace, &r.trace) {
            for (i, (ticket, bytes)) in buckets.iter().enumerate() {
                if let Some((_, s)) = spans.iter().find(|(id, _)| *id == ticket.id()) {
                    let name = format!("bucket {i} ({:.2} MiB)", *bytes as f64 / (1 << 20) as f64);
                    t.add(Event { lane: "comm", name, step, start_us: t.us(s.start), end_us: t.us(s.end) });
                }
            }
            for (label, start, end) in r.comm.device_timeline() {
                t.add(Event { lane: "comm", name: label, step, start_us: t.us(start), end_us: t.us(end) });
            }
            let doc = t.to_json(r.rank());
            if let Some(dir) = path.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            std::fs::write(path, serde_json::to_vec_pretty(&doc).unwrap_or_default())
                .map_err(|e| RunError::Io { path: path.display().to_string(), message: e.to_string() })?;
        }
        Ok((loss_sum, grads))
    }
}

/// The collective's own error when the hooks recorded one (the model only saw its text).
fn collective_or(error: &RefCell<Option<CollectiveError>>, e: RunError) -> RunError {
    error.borrow_mut().take().map_or(e, RunError::Collective)
}
