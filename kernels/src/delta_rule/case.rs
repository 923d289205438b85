//! The sizes and gate shaping every delta-rule test uses (the CPU kernel's, the chunked
//! reference's and the CUDA kernels'), so each suite builds its operands the same way.

use candle_core::{Result, Tensor};

/// Sizes of one case: batch rows, tokens, key heads, value heads (a multiple: GQA), and the key
/// and value head sizes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Case {
    pub b: usize,
    pub t: usize,
    pub hk: usize,
    pub h: usize,
    pub dk: usize,
    pub dv: usize,
}

impl Case {
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

    /// The state: `[B, H, dk, dv]`.
    pub fn state(&self) -> [usize; 4] {
        [self.b, self.h, self.dk, self.dv]
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
