//! What a recipe's `train.method` means for the engine.

use super::RunError;
use crate::model::{DpoForm, LoraConfig, PreferenceLoss, Trainable};
use crate::recipe::{DpoLoss, Lora, Method, Reward};
use crate::rl::kto::KtoLoss;
use crate::rl::policy_loss::{PolicyLoss, Ratio};

/// The engine-level reading of a method.
#[derive(Debug, Clone, PartialEq)]
pub struct MethodPlan {
    pub name: &'static str,
    pub trainable: Trainable,
    pub lora: Option<LoraConfig>,
    /// Store the frozen base in NF4 (QLoRA).
    pub nf4_base: bool,
    pub preference: Option<PreferenceLoss>,
    /// GRPO, GSPO or KTO.
    pub rl: Option<RlPlan>,
}

/// The learning-from-rewards methods.
#[derive(Debug, Clone, PartialEq)]
pub enum RlPlan {
    /// GRPO (token ratios) or GSPO (sequence ratios): sampled groups, rewards, the clipped loss.
    Policy(GroupPolicy),
    /// KTO on unpaired desirable and undesirable answers.
    Kto(KtoLoss),
}

/// What a GRPO or GSPO step samples and how it learns from it.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupPolicy {
    pub loss: PolicyLoss,
    pub num_generations: usize,
    pub max_new_tokens: usize,
    pub temperature: f64,
    pub rewards: Vec<Reward>,
}

impl GroupPolicy {
    fn new(ratio: Ratio, generations: u32, new_tokens: u32, temperature: f64, rewards: &[Reward]) -> GroupPolicy {
        GroupPolicy {
            loss: PolicyLoss { ratio, clip_epsilon: 0.0, kl_coef: 0.0 },
            num_generations: generations as usize,
            max_new_tokens: new_tokens as usize,
            temperature,
            rewards: rewards.to_vec(),
        }
    }

    fn clipped(mut self, clip_epsilon: f64, kl_coef: f64) -> GroupPolicy {
        self.loss.clip_epsilon = clip_epsilon;
        self.loss.kl_coef = kl_coef;
        self
    }
}

impl RlPlan {
    /// Whether the step needs the reference policy's log-probs.
    pub fn needs_reference(&self) -> bool {
        match self {
            RlPlan::Policy(p) => p.loss.kl_coef > 0.0,
            RlPlan::Kto(_) => true,
        }
    }
}

impl MethodPlan {
    /// Why `method` cannot train across several processes, if it cannot: GRPO and GSPO sample
    /// rollouts from the whole policy and KTO needs every step's reference point, which the
    /// ranks do not share yet; a single process trains them.
    pub fn single_process_only(method: &Method) -> Option<String> {
        let name = match method {
            Method::Grpo(_) => "grpo",
            Method::Gspo(_) => "gspo",
            Method::Kto(_) => "kto",
            _ => return None,
        };
        Some(format!(
            "train.method {name} trains in one process only: a distributed run (hardware.gpus > 1, \
             --nproc-per-node/--nnodes above 1 or --collective) of GRPO, GSPO or KTO is not supported; \
             pass --nproc-per-node 1 (one GPU) or set hardware.gpus: 1"
        ))
    }

    pub fn from_recipe(method: &Method) -> Result<MethodPlan, RunError> {
        let full = |name| MethodPlan {
            name,
            trainable: Trainable::Full,
            lora: None,
            nf4_base: false,
            preference: None,
            rl: None,
        };
        let adapters = |name, lora: &Lora| MethodPlan {
            name,
            trainable: Trainable::Adapters,
            lora: Some(LoraConfig::from(lora)),
            nf4_base: false,
            preference: None,
            rl: None,
        };
        let either = |name, lora: Option<&Lora>| match lora {
            Some(l) => adapters(name, l),
            None => full(name),
        };
        Ok(match method {
            Method::Full => full("full"),
            Method::Cpt => full("cpt"),
            Method::Lora(l) => adapters("lora", l),
            // `recipe check` admits only 4-bit bases.
            Method::Qlora(q) => MethodPlan { nf4_base: true, ..adapters("qlora", &q.lora) },
            Method::Dpo(d) => {
                let form = match d.loss {
                    DpoLoss::Sigmoid => DpoForm::Sigmoid,
                    DpoLoss::Hinge => DpoForm::Hinge,
                    DpoLoss::Ipo => DpoForm::Ipo,
                };
                let loss = PreferenceLoss::Dpo { beta: d.beta, label_smoothing: d.label_smoothing, form };
                MethodPlan { preference: Some(loss), ..either("dpo", d.lora.as_ref()) }
            }
            Method::Orpo(o) => {
                let loss = PreferenceLoss::Orpo { lambda: o.beta };
                MethodPlan { preference: Some(loss), ..either("orpo", o.lora.as_ref()) }
            }
            Method::Kto(k) => {
                let loss = KtoLoss {
                    beta: k.beta,
                    desirable_weight: k.desirable_weight,
                    undesirable_weight: k.undesirable_weight,
                };
                MethodPlan { rl: Some(RlPlan::Kto(loss)), ..either("kto", k.lora.as_ref()) }
            }
            Method::Grpo(g) => {
                let policy =
                    GroupPolicy::new(Ratio::Token, g.num_generations, g.max_new_tokens, g.temperature, &g.rewards)
                        .clipped(g.clip_epsilon, g.kl_coef);
                MethodPlan { rl: Some(RlPlan::Policy(policy)), ..either("grpo", g.lora.as_ref()) }
            }
            Method::Gspo(g) => {
                let policy =
                    GroupPolicy::new(Ratio::Sequence, g.num_generations, g.max_new_tokens, g.temperature, &g.rewards)
                        .clipped(g.clip_epsilon, g.kl_coef);
                MethodPlan { rl: Some(RlPlan::Policy(policy)), ..either("gspo", g.lora.as_ref()) }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recipe::{Dpo, Grpo, Gspo, Kto, Orpo, TargetModule};

    /// Values unlike every default, so a field that did not reach the plan shows.
    fn lora() -> Lora {
        Lora { r: 3, alpha: 7, dropout: 0.25, target_modules: vec![TargetModule::VProj], rslora: true }
    }

    #[test]
    fn every_method_field_reaches_the_method_plan() {
        let adapter = Some(LoraConfig::from(&lora()));
        assert_eq!(
            LoraConfig::from(&lora()),
            LoraConfig { r: 3, alpha: 7.0, dropout: 0.25, target_modules: vec![TargetModule::VProj], rslora: true }
        );

        let dpo = Dpo { beta: 0.3, loss: DpoLoss::Hinge, label_smoothing: 0.0, lora: Some(lora()) };
        let plan = MethodPlan::from_recipe(&Method::Dpo(dpo)).unwrap();
        assert_eq!(
            plan.preference,
            Some(PreferenceLoss::Dpo { beta: 0.3, label_smoothing: 0.0, form: DpoForm::Hinge })
        );
        assert_eq!(plan.lora, adapter);
        let smooth = Dpo { beta: 0.3, loss: DpoLoss::Sigmoid, label_smoothing: 0.2, lora: None };
        let plan = MethodPlan::from_recipe(&Method::Dpo(smooth)).unwrap();
        assert_eq!(
            plan.preference,
            Some(PreferenceLoss::Dpo { beta: 0.3, label_smoothing: 0.2, form: DpoForm::Sigmoid })
        );
        assert_eq!((plan.lora, plan.trainable), (None, Trainable::Full));

        let plan = MethodPlan::from_recipe(&Method::Orpo(Orpo { beta: 0.4, lora: Some(lora()) })).unwrap();
        assert_eq!((plan.preference, plan.lora), (Some(PreferenceLoss::Orpo { lambda: 0.4 }), adapter.clone()));

        let kto = Kto { beta: 0.5, desirable_weight: 1.5, undesirable_weight: 0.7, lora: Some(lora()) };
        let plan = MethodPlan::from_recipe(&Method::Kto(kto)).unwrap();
        let want = KtoLoss { beta: 0.5, desirable_weight: 1.5, undesirable_weight: 0.7 };
        assert_eq!((plan.rl, plan.lora), (Some(RlPlan::Kto(want)), adapter.clone()));

        let rewards = vec![Reward::ToolCall, Reward::Length];
        let grpo = Grpo {
            num_generations: 6,
            kl_coef: 0.3,
            clip_epsilon: 0.15,
            max_new_tokens: 33,
            temperature: 0.6,
            rewards: rewards.clone(),
            lora: Some(lora()),
        };
        let gspo = Gspo {
            num_generations: 6,
            kl_coef: 0.3,
            clip_epsilon: 0.15,
            max_new_tokens: 33,
            temperature: 0.6,
            rewards: rewards.clone(),
            lora: Some(lora()),
        };
        for (method, ratio) in [(Method::Grpo(grpo), Ratio::Token), (Method::Gspo(gspo), Ratio::Sequence)] {
            let plan = MethodPlan::from_recipe(&method).unwrap();
            let want = GroupPolicy {
                loss: PolicyLoss { ratio, clip_epsilon: 0.15, kl_coef: 0.3 },
                num_generations: 6,
                max_new_tokens: 33,
                temperature: 0.6,
                rewards: rewards.clone(),
            };
            assert_eq!((plan.rl, plan.lora), (Some(RlPlan::Policy(want)), adapter.clone()));
        }
    }
}
