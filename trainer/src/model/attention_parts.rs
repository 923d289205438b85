//! Pieces of attention that every forward path shares (training [`super::block`], dense decode
//! [`super::decode`], paged serving [`super::paged`]): partial RoPE and Qwen3.5's output gate.

use candle_core::{Result, Tensor};

/// `σ(x) = 1 / (1 + e^(−x))`.
pub(super) fn sigmoid(x: &Tensor) -> Result<Tensor> {
    (x.neg()?.exp()? + 1.0)?.recip()
}

/// A gated attention's output `attn·σ(gate)` (`sigmoid_gate` = `σ(gate)`), or `attn` ungated.
pub(super) fn gated(attn: &Tensor, sigmoid_gate: Option<&Tensor>) -> Result<Tensor> {
    match sigmoid_gate {
        Some(g) => attn * g,
        None => Ok(attn.clone()),
    }
}

/// RoPE's forward or backward (`op`) on `x` `[.., heads, hd]` with tables `cos`/`sin` over the
/// rotated dims: all of them, or with partial rotary (Qwen3.5) the first `rotary_dim`, the rest
/// passing through.
pub(super) fn rotate(
    x: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    rotary_dim: usize,
    op: fn(&Tensor, &Tensor, &Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    let hd = x.dim(candle_core::D::Minus1)?;
    if rotary_dim == hd {
        return op(x, cos, sin);
    }
    let last = x.rank() - 1;
    let rotated = op(&x.narrow(last, 0, rotary_dim)?.contiguous()?, cos, sin)?;
    Tensor::cat(&[&rotated, &x.narrow(last, rotary_dim, hd - rotary_dim)?], last)
}
