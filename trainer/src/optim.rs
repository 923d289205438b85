//! AdamW, gradient clipping and learning-rate schedules, each matching the PyTorch / HF
//! transformers formula it replaces so that a step here and a step there agree.
//!
//! Parameters, gradients and optimizer moments are `BTreeMap<String, Tensor>` keyed by the
//! parameter's HF (or PEFT) name; the sorted order makes every reduction deterministic.

mod adamw;
mod clip;
mod error;
mod schedule;

pub use adamw::{AdamW, AdamWConfig, decays};
pub use clip::{clip_grad_norm, clip_to_norm, global_grad_norm, grad_sq_sums, norm_of_sums};
pub use error::OptimError;
pub use schedule::{LrSchedule, Warmup};
