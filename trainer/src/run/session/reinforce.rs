//! A GRPO or GSPO step: sample `num_generations` completions of each of the step's prompts
//! through the serving engine holding the current policy, score them with the recipe's
//! rewards, normalise the rewards within each prompt's group, and take the clipped
//! policy-gradient step (with the KL term to the reference when `kl_coef > 0`).
//!
//! The policy is updated once per rollout (TRL's `num_iterations: 1`): the sampling policy's
//! log-probs are the policy's own, detached, so every ratio is 1 in value and the gradient is
//! `−A ∇log π` (plus the KL term's); clipping bites only when the sampler and the trainer
//! disagree numerically. Each stage is timed and reported in `train.progress`.

use std::time::Instant;

use serde_json::{Value, json};

use super::{Session, StepGrads};
use crate::data::PromptItem;
use crate::infer::{Engine, EngineConfig, KvBlocks};
use crate::model::Trainable;
use crate::model::rng::SplitMix64;
use crate::rl::advantage::group_advantages;
use crate::rl::pack::{Seq, pack};
use crate::rl::policy_loss::Completion;
use crate::rl::prompts::next_prompts;
use crate::rl::rewards::{RewardSet, RewardStats, Sample, Scores};
use crate::rl::rollout::{Generation, RolloutSpec, rollout};
use crate::run::RunError;
use crate::run::method::GroupPolicy;
use crate::run::sequences;

/// The name the policy's adapters are served under in the rollout engine.
const POLICY: &str = "policy";
/// Stream tags: rollouts and held-out reward evaluation draw from separate streams.
const ROLLOUT_STREAM: u64 = 0x524f_4c4c;
const EVAL_STREAM: u64 = 0x4556_414c;

/// What GRPO and GSPO keep between steps.
pub(crate) struct RolloutState {
    /// The training prompts that leave room for `max_new_tokens` in a row.
    pub prompts: Vec<PromptItem>,
    /// Training prompts left out for being too long.
    pub too_long: usize,
    pub rewards: RewardSet,
    /// Built at the first rollout; the policy's weights are loaded into it before each.
    engine: Option<Engine>,
}

impl RolloutState {
    pub fn new(prompts: Vec<PromptItem>, seq_len: usize, policy: &GroupPolicy) -> Result<RolloutState, RunError> {
        let total = prompts.len();
        let room = seq_len.saturating_sub(policy.max_new_tokens);
        let prompts: Vec<PromptItem> = prompts.into_iter().filter(|p| p.prompt_ids.len() <= room).collect();
        if prompts.is_empty() {
            return Err(RunError::Recipe(format!(
                "data: none of the {total} training prompts leaves room for train.method.max_new_tokens \
                 ({}) within data.seq_len ({seq_len}); RL needs conversations that end with an assistant answer",
                policy.max_new_tokens
            )));
        }
        Ok(RolloutState {
            too_long: total - prompts.len(),
            prompts,
            rewards: RewardSet::new(&policy.rewards),
            engine: None,
        })
    }
}

impl Session<'_> {
    /// One GRPO/GSPO step's gradients.
    pub(in crate::run) fn policy_step(
        &mut self,
        policy: &GroupPolicy,
        loss_scale_opts: StepOpts,
    ) -> Result<StepGrads, RunError> {
        let train = &self.spec.recipe.recipe.train;
        let seq_len = self.spec.recipe.recipe.data.seq_len as usize;
        let count = (train.batch.per_device * train.batch.grad_accum) as usize;
        let seed = self.spec.recipe.recipe.meta.seed;
        let shuffle = self.spec.recipe.recipe.data.shuffle;
        let all = &self.rollouts()?.prompts;
        let (chosen, cursor) = next_prompts(all.len(), count, self.cursor, seed, shuffle);
        let prompts: Vec<PromptItem> = chosen.iter().map(|&i| all[i].clone()).collect();
        self.cursor = cursor;

        let t0 = Instant::now();
        let stream = SplitMix64::derive(seed, &[ROLLOUT_STREAM, self.step]).next_u64();
        let (generations, stats) = self.sample(&prompts, policy, stream)?;
        let rollout_s = t0.elapsed().as_secs_f64();

        let t1 = Instant::now();
        let rewards = &self.rollouts()?.rewards;
        let scores = score(rewards, &prompts, &generations, policy.max_new_tokens);
        let reward_stats = RewardStats::of(rewards, &scores);
        let totals: Vec<f64> = scores.iter().map(|s| s.total).collect();
        let advantages = group_advantages(&totals, policy.num_generations);
        let reward_s = t1.elapsed().as_secs_f64();

        // Completions that teach nothing (a group that scored alike, and no KL term to pull
        // on them) are not computed; the mean still counts them, as TRL's does.
        let t2 = Instant::now();
        let with_kl = policy.loss.kl_coef > 0.0;
        let kept: Vec<usize> = (0..generations.len()).filter(|&k| with_kl || advantages[k] != 0.0).collect();
        let seqs: Vec<Seq> = kept
            .iter()
            .map(|&k| Seq::completion(&prompts[generations[k].prompt].prompt_ids, &generations[k].tokens))
            .collect();
        let micro = self.spec.plan.choices.micro_batch.max(1);
        let mbs = pack(&seqs, seq_len, micro, self.tokenizer.pad_id()).map_err(RunError::Recipe)?;
        let reference = if with_kl {
            let (model, adapters) = self.reference_policy();
            Some(sequences::token_logps(model, adapters, &mbs, seqs.len())?)
        } else {
            None
        };
        let opts = loss_scale_opts(1.0 / generations.len().max(1) as f64);
        let (mut clipped, mut ratios, mut kl_sum, mut kl_tokens) = (0usize, 0usize, 0.0, 0usize);
        let (loss_sum, grads, tokens) = sequences::forward_backward(
            &self.model,
            self.method.trainable,
            self.adapters.as_ref(),
            &mbs,
            &opts,
            |i, lp| {
                let completion = Completion {
                    logp: lp,
                    old: lp,
                    reference: reference.as_ref().map(|r| r[i].as_slice()),
                    advantage: advantages[kept[i]],
                };
                let terms = policy.loss.completion(&completion);
                clipped += terms.clipped;
                ratios += terms.ratios;
                kl_sum += terms.kl_sum;
                kl_tokens += lp.len();
                (terms.loss, terms.d_logp)
            },
        )?;
        let policy_s = t2.elapsed().as_secs_f64();
        let report = json!({
            "rewards": reward_stats.to_json(),
            "reward_mean": reward_stats.mean,
            "reward_std": reward_stats.std,
            "kl": with_kl.then(|| kl_sum / kl_tokens.max(1) as f64),
            "clip_fraction": clipped as f64 / ratios.max(1) as f64,
            "completions": generations.len(),
            "completion_tokens_mean": stats.tokens as f64 / generations.len().max(1) as f64,
            "truncated_fraction": generations.iter().filter(|g| g.truncated).count() as f64 / generations.len().max(1) as f64,
            "generation_tokens": stats.tokens,
            "generation_tokens_per_s": stats.tokens_per_s(),
            "prefix_cached_tokens": stats.cached_tokens,
            "rollout_s": rollout_s,
            "reward_s": reward_s,
            "policy_s": policy_s,
            "policy_tokens_per_s": tokens as f64 / policy_s.max(1e-9),
        });
        Ok(StepGrads { grads, loss: loss_sum / generations.len().max(1) as f64, tokens, rl: Some(report) })
    }

    /// Mean rewards of completions sampled for held-out prompts (at most `max_prompts`) as
    /// the recipe samples, from a stream that is the same at every evaluation.
    pub(super) fn held_out_rewards(&mut self, policy: &GroupPolicy, max_prompts: usize) -> Result<Value, RunError> {
        let prompts: Vec<PromptItem> =
            self.dataset.holdout_prompts(&self.tokenizer)?.into_iter().take(max_prompts).collect();
        let room = (self.spec.recipe.recipe.data.seq_len as usize).saturating_sub(policy.max_new_tokens);
        let prompts: Vec<PromptItem> = prompts.into_iter().filter(|p| p.prompt_ids.len() <= room).collect();
        let stream = SplitMix64::derive(self.spec.recipe.recipe.meta.seed, &[EVAL_STREAM]).next_u64();
        let (generations, _) = self.sample(&prompts, policy, stream)?;
        let rewards = &self.rollouts()?.rewards;
        let stats = RewardStats::of(rewards, &score(rewards, &prompts, &generations, policy.max_new_tokens));
        Ok(json!({
            "prompts": prompts.len(), "completions": generations.len(),
            "mean": stats.mean, "std": stats.std, "per_function": stats.to_json(),
        }))
    }

    fn rollouts(&self) -> Result<&RolloutState, RunError> {
        self.rollouts.as_ref().ok_or_else(|| RunError::Recipe("a rollout outside GRPO or GSPO".into()))
    }

    /// Completions of `prompts` by the current policy.
    fn sample(
        &mut self,
        prompts: &[PromptItem],
        policy: &GroupPolicy,
        seed: u64,
    ) -> Result<(Vec<Generation>, crate::rl::rollout::RolloutStats), RunError> {
        let seq_len = self.spec.recipe.recipe.data.seq_len as usize;
        let threads = self.spec.plan.choices.threads;
        let batch = (self.spec.recipe.recipe.train.batch.per_device * self.spec.recipe.recipe.train.batch.grad_accum)
            as usize
            * policy.num_generations;
        let state = self.rollouts.as_mut().ok_or_else(|| RunError::Recipe("a rollout outside GRPO or GSPO".into()))?;
        match &mut state.engine {
            Some(engine) if self.method.trainable == Trainable::Full => {
                engine.set_weights(self.model.params().clone()).map_err(rollout_err)?;
            }
            Some(_) => {}
            None => {
                let max_num_seqs = batch.clamp(1, 256);
                let config = EngineConfig {
                    block_size: 16,
                    max_model_len: seq_len,
                    max_num_seqs,
                    max_batched_tokens: max_num_seqs.max(2048),
                    // Every sequence of the batch at full length, so nothing is ever preempted.
                    kv_blocks: KvBlocks::Exact(max_num_seqs * seq_len.div_ceil(16) + 1),
                    prefix_caching: true,
                    max_adapters: 1,
                    threads,
                    cuda_graphs: true,
                    overlap_steps: true,
                };
                let engine =
                    Engine::new(self.model.clone(), Some(self.tokenizer.clone()), config).map_err(rollout_err)?;
                state.engine = Some(engine);
            }
        }
        let engine = state.engine.as_mut().expect("built above");
        // The engine batches adapters on the projections, not on a MoE model's experts: a policy
        // that adapts experts is sampled from its merged weights instead.
        let merged = self.adapters.as_ref().filter(|a| a.adapts_experts(self.model.config()));
        if let Some(a) = merged {
            let params = crate::model::merge_lora(self.model.params(), self.model.config(), a)?;
            engine.set_weights(params).map_err(rollout_err)?;
        } else if let Some(a) = &self.adapters {
            if engine.adapters().iter().any(|n| n == POLICY) {
                engine.evict_adapter(POLICY).map_err(rollout_err)?;
            }
            engine.load_adapter(POLICY, a.clone()).map_err(rollout_err)?;
        }
        let ids: Vec<Vec<u32>> = prompts.iter().map(|p| p.prompt_ids.clone()).collect();
        let spec = RolloutSpec {
            per_prompt: policy.num_generations,
            max_new_tokens: policy.max_new_tokens,
            temperature: policy.temperature,
            seed,
            adapter: self.adapters.as_ref().filter(|_| merged.is_none()).map(|_| POLICY),
        };
        Ok(rollout(engine, &ids, &spec)?)
    }
}

/// Builds a step's options from its loss scale.
pub(in crate::run) type StepOpts<'a> = &'a dyn Fn(f64) -> crate::model::StepOptions;

fn rollout_err(e: crate::infer::EngineError) -> RunError {
    crate::rl::rollout::RolloutError::from(e).into()
}

fn score(
    rewards: &RewardSet,
    prompts: &[PromptItem],
    generations: &[Generation],
    max_new_tokens: usize,
) -> Vec<Scores> {
    generations
        .iter()
        .map(|g| {
            rewards.score(&Sample {
                reference: &prompts[g.prompt].reference,
                text: &g.text,
                completion_tokens: g.completion_tokens,
                truncated: g.truncated,
                max_new_tokens,
            })
        })
        .collect()
}
