//! The training kernels of the mindxtrain trainer: one module per op, each with an explicit
//! `forward` (the output plus exactly the activations its backward needs) and `backward`
//! (input and parameter gradients).
//!
//! They are written with candle tensor ops, so the same code is the CPU reference and runs on
//! any candle device; fused GPU kernels replace them op by op later and are tested against
//! these. Nothing here uses candle's autograd: its fast norm/rope/softmax ops silently drop
//! gradients (see `shared/notes/gpu.md`). Every op works in f64, and every backward is checked
//! against central finite differences ([`gradcheck`]).

pub mod attention;
pub mod cross_entropy;
pub mod embedding;
pub mod gradcheck;
pub mod linear;
pub mod rmsnorm;
pub mod rope;
pub mod swiglu;

pub use candle_core::{Error, Result};
