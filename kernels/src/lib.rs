//! Fused training kernels for the mindxtrain trainer.
//!
//! Each kernel lives beside the CPU reference the tests compare it with. The GPU builds
//! (`cuda`, `hip` features) arrive with the GPU trainer; until then this crate holds
//! nothing the CPU trainer needs, and the workspace keeps its place in the dependency
//! order `kernels` ← `trainer` ← `node`.
