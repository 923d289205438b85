//! What a recipe's `train.method` means for the engine.

use super::RunError;
use crate::model::{LoraConfig, PreferenceLoss, Trainable};
use crate::recipe::Method;

/// The engine-level reading of a method.
#[derive(Debug, Clone, PartialEq)]
pub struct MethodPlan {
    pub name: &'static str,
    pub trainable: Trainable,
    pub lora: Option<LoraConfig>,
    /// Store the frozen base in NF4 (QLoRA).
    pub nf4_base: bool,
    pub preference: Option<PreferenceLoss>,
}

impl MethodPlan {
    pub fn from_recipe(method: &Method) -> Result<MethodPlan, RunError> {
        let full =
            |name| MethodPlan { name, trainable: Trainable::Full, lora: None, nf4_base: false, preference: None };
        let adapters = |name, lora: &crate::recipe::Lora| MethodPlan {
            name,
            trainable: Trainable::Adapters,
            lora: Some(LoraConfig::from(lora)),
            nf4_base: false,
            preference: None,
        };
        Ok(match method {
            Method::Full => full("full"),
            Method::Cpt => full("cpt"),
            Method::Lora(l) => adapters("lora", l),
            Method::Qlora(q) => {
                if q.bits != 4 {
                    return Err(RunError::Recipe(format!(
                        "train.method.bits: {} is not supported; QLoRA stores the base in 4-bit NF4",
                        q.bits
                    )));
                }
                MethodPlan { nf4_base: true, ..adapters("qlora", &q.lora) }
            }
            Method::Dpo(d) => {
                if d.loss != crate::recipe::DpoLoss::Sigmoid {
                    return Err(RunError::Recipe(format!(
                        "train.method.loss: {:?} is not supported by the embedded engine; use sigmoid",
                        d.loss
                    )));
                }
                let loss = PreferenceLoss::Dpo { beta: d.beta, label_smoothing: d.label_smoothing };
                let base = match &d.lora {
                    Some(l) => adapters("dpo", l),
                    None => full("dpo"),
                };
                MethodPlan { preference: Some(loss), ..base }
            }
            Method::Orpo(o) => {
                let loss = PreferenceLoss::Orpo { lambda: o.beta };
                let base = match &o.lora {
                    Some(l) => adapters("orpo", l),
                    None => full("orpo"),
                };
                MethodPlan { preference: Some(loss), ..base }
            }
            Method::Kto(_) | Method::Grpo(_) | Method::Gspo(_) => {
                return Err(RunError::Recipe(format!(
                    "train.method.kind: {} is accepted by the schema but the embedded engine trains full, cpt, lora, qlora, dpo and orpo",
                    format!("{:?}", method.kind()).to_lowercase()
                )));
            }
        })
    }
}
