//! The optimizers (AdamW, SGD, Lion, Adafactor), gradient clipping and learning-rate
//! schedules, each matching the PyTorch / HF transformers formula it replaces so that a step
//! here and a step there agree.
//!
//! Parameters, gradients and optimizer state are `BTreeMap<String, Tensor>` keyed by the
//! parameter's HF (or PEFT) name; the sorted order makes every reduction deterministic.

mod adafactor;
mod adamw;
mod clip;
mod error;
#[cfg(all(test, feature = "cuda"))]
mod gpu_tests;
mod lion;
mod optimizer;
mod schedule;
mod sgd;
mod stateful;
#[cfg(test)]
mod test_inputs;

pub use adafactor::{Adafactor, AdafactorConfig};
pub use adamw::{AdamW, AdamWConfig, decays};
pub use clip::{clip_grad_norm, clip_to_norm, global_grad_norm, grad_sq_sums, norm_of_sums};
pub use error::OptimError;
pub use lion::{Lion, LionConfig};
pub use optimizer::Optimizer;
pub use schedule::{LrSchedule, Warmup};
pub use sgd::{Sgd, SgdConfig};
pub use stateful::{Stateful, UpdateRule, state_parameter};
