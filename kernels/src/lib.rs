//! The training kernels of the mindxtrain trainer: one module per op, each with an explicit
//! `forward` (the output plus exactly the activations its backward needs) and `backward`
//! (input and parameter gradients).
//!
//! Each op has a composed form written with candle tensor ops (its `reference` module),
//! which runs on any candle device, and a fused CPU kernel (module `cpu`) that serves f32/f64 CPU
//! tensors; tests hold the two together. Fused GPU kernels join them op by op. Nothing here uses candle's autograd: its fast norm/rope/softmax ops silently drop
//! gradients (see `shared/notes/gpu.md`). Every op works in f64, and every backward is checked
//! against central finite differences ([`gradcheck`]).

pub mod attention;
mod cpu;
pub mod cross_entropy;
pub mod embedding;
pub mod gradcheck;
pub mod linear;
pub mod rmsnorm;
pub mod rope;
pub mod swiglu;

pub use candle_core::{Error, Result};
