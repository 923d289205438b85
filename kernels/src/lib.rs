//! The training kernels of the mindxtrain trainer: one module per op, each with an explicit
//! `forward` (the output plus exactly the activations its backward needs) and `backward`
//! (input and parameter gradients).
//!
//! Each op has a composed form written with candle tensor ops (its `reference` module),
//! which runs on any candle device, and a fused CPU kernel (module `cpu`) that serves f32/f64 CPU
//! tensors; tests hold the two together. With the `cuda` feature, CUDA tensors of f32 or bf16
//! take fused GPU kernels (module `gpu`, sources in `kernels/cuda/`), tested against the same
//! references on the device (`scripts/gpu-test`). With the `hip` feature the same sources load
//! on AMD GPUs through hip-sys (module `hip`, on device buffers; built here, never run).
//! The plan's tunables reach the ops as a value, a [`KernelConfig`], never as process-wide state.
//! Nothing here uses candle's autograd: its fast norm/rope/softmax ops silently drop
//! gradients (see `shared/notes/gpu.md`). Every op works in f64, and every backward is checked
//! against central finite differences ([`gradcheck`]).

/// This crate's version, recorded in run manifests.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

pub mod adamw;
pub mod attention;
pub mod causal_conv1d;
mod config;
mod cpu;
pub mod cross_entropy;
pub mod delta_gates;
pub mod delta_rule;
pub mod embedding;
pub mod gated_rmsnorm;
pub mod gemm_algos;
#[cfg(feature = "cuda")]
mod gpu;
pub mod gradcheck;
pub mod graph;
#[cfg(feature = "hip")]
pub mod hip;
pub mod l2norm;
pub mod linear;
pub mod lm_head_ce;
pub mod memory;
pub use memory::{cache_freed_memory, skip_allocation_events};
pub mod moe;
pub mod multi_lora;
pub mod nf4;
pub mod paged_attention;
pub mod profile;
pub mod reduce;
pub mod rmsnorm;
pub mod rope;
pub mod sampling;
pub mod seeded;
pub mod swiglu;

pub use candle_core::{Error, Result};
pub use config::{GemmShapeLog, KernelConfig};

/// Under the `cuda` feature, CUDA tensors of f32/bf16 go to the GPU kernel `$gpu` (the caller
/// imports it under that name, behind the same cfg); everything else evaluates `$rest`.
macro_rules! on_gpu_or {
    ([$($t:expr),+], $gpu:ident($($arg:expr),*), $rest:expr) => {{
        #[cfg(feature = "cuda")]
        let r = $crate::gpu::dispatch!([$($t),+], $gpu($($arg),*), $rest);
        #[cfg(not(feature = "cuda"))]
        let r = $rest;
        r
    }};
}
pub(crate) use on_gpu_or;
