//! Reinforcement learning from rewards, as parts the run puts together
//! ([`crate::run`] drives GRPO, GSPO and KTO steps with them):
//!
//! * [`rollout`]: every prompt's `num_generations` completions, sampled in one continuous
//!   batch by the serving engine ([`crate::infer`]) on the model's device;
//! * [`rewards`]: the recipe's reward functions, each with a digest of its definition;
//! * [`advantage`]: group-relative advantages;
//! * [`policy_loss`]: the clipped policy-gradient loss with token-level (GRPO) or
//!   sequence-level (GSPO) ratios and the KL term to the reference;
//! * [`kto`]: KTO's loss and reference point, over [`unpaired`] examples;
//! * [`pack`]: sequences into packed rows for the policy step, and back;
//! * [`prompts`]: which prompts a step takes, from a resumable cursor.
//!
//! Losses are plain functions of per-token log-probabilities on the host (f64): the model's
//! [`crate::model::CausalLm::forward_backward_logps`] runs the forward and backward around them.
//!
//! ```
//! use mindxtrain_trainer::rl::advantage::group_advantages;
//! use mindxtrain_trainer::rl::policy_loss::{Completion, PolicyLoss, Ratio};
//! // Two completions of one prompt: the right one (reward 1) is pushed up, the other down.
//! let adv = group_advantages(&[1.0, 0.0], 2);
//! let loss = PolicyLoss { ratio: Ratio::Token, clip_epsilon: 0.2, kl_coef: 0.0 };
//! let lp = [-0.5, -1.5];
//! let up = loss.completion(&Completion { logp: &lp, old: &lp, reference: None, advantage: adv[0] });
//! assert!(up.d_logp.iter().all(|&d| d < 0.0), "raising its log-probs lowers the loss");
//! ```

pub mod advantage;
pub mod kto;
pub mod pack;
pub mod policy_loss;
pub mod prompts;
pub mod rewards;
pub mod rollout;
pub mod unpaired;
