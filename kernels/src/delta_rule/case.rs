//! The sizes and gate shaping every delta-rule test uses (the CPU kernel's, the chunked
//! reference's and the CUDA kernels'), so each suite builds its operands the same way.

use super::Dims;
use candle_core::{Result, Tensor};

/// Sizes of one case: the kernels' own [`Dims`] (batch rows, tokens, key heads, value heads,
/// key and value head sizes; its `state()` is the state's shape).
pub(crate) type Case = Dims;

impl Dims {
    /// q and k: `[B, T, Hk, dk]`.
    pub fn qk(&self) -> [usize; 4] {
        [self.b, self.t, self.hk, self.dk]
    }

    /// v and the output: `[B, T, H, dv]`.
    pub fn v(&self) -> [usize; 4] {
        [self.b, self.t, self.h, self.dv]
    }

    /// β and g: `[B, T, H]`.
    pub fn gates(&self) -> [usize; 3] {
        [self.b, self.t, self.h]
    }

    /// The attention scale the model uses, 1/√dk.
    pub fn scale(&self) -> f64 {
        1.0 / (self.dk as f64).sqrt()
    }
}

/// β = σ(x): in (0, 1), as the model's sigmoid gives it.
pub(crate) fn beta_of(x: &Tensor) -> Result<Tensor> {
    x.neg()?.exp()?.affine(1.0, 1.0)?.recip()
}

/// g in (−0.2, 0) from x in [−1, 1): a decay slow enough that the state remembers across a
/// 64-token chunk, so a checkpoint carried wrong shows.
pub(crate) fn decay_of(x: &Tensor) -> Result<Tensor> {
    x.affine(0.1, -0.1)
}
