//! The depthwise causal convolution with SiLU that Gated DeltaNet runs over its concatenated
//! q/k/v projection (transformers' `causal_conv1d_fn`, and `causal_conv1d_update` when decoding):
//!
//! ```text
//! u[t, c] = bias[c] + Σ_{j<W} w[c, j]·x[t + j − (W−1), c]        y = u·σ(u)
//! ```
//!
//! `x` is `[B, T, C]` (the projection's layout: transformers transposes to `[B, C, T]` for
//! `F.conv1d`, the arithmetic is the same), `w` `[C, W]` (the Conv1d weight `[C, 1, W]`
//! squeezed). Positions before the row are zeros, or the given state `[B, C, W−1]`: the row's
//! last `W−1` inputs before it, oldest first (transformers' cache keeps `W` and its oldest
//! column never reaches an output). Packed rows: a token never reads an input from before its
//! document's start ([`Mask`]), which is what running each document alone gives; the state
//! belongs to each row's first document. The CUDA kernels (`crate::gpu::causal_conv1d`) serve
//! f32/bf16 CUDA tensors, the fused CPU kernel (`crate::cpu::conv1d`) f32/f64 CPU tensors, the
//! composed [`reference`](mod@reference) everything else.

use crate::attention::Mask;
use crate::cpu::{self, dispatch};
use crate::on_gpu_or;
use candle_core::{Result, Tensor};

/// What [`backward`] returns.
pub struct Grads {
    /// `[B, T, C]`.
    pub dx: Tensor,
    /// `[C, W]`.
    pub dw: Tensor,
    /// When a bias was given.
    pub dbias: Option<Tensor>,
    /// Of the initial state, when one was given.
    pub dstate: Option<Tensor>,
}

/// The sizes of one call, checked against every operand.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dims {
    pub b: usize,
    pub t: usize,
    pub c: usize,
    pub w: usize,
}

impl Dims {
    pub(crate) fn of(x: &Tensor, w: &Tensor) -> Result<Dims> {
        let (b, t, c) = x.dims3()?;
        let (wc, width) = w.dims2()?;
        if wc != c || width == 0 {
            candle_core::bail!("causal conv1d: weight of shape {:?} for input {:?}", w.dims(), x.dims());
        }
        if t == 0 {
            candle_core::bail!("causal conv1d: input of shape {:?} has no tokens", x.dims());
        }
        Ok(Dims { b, t, c, w: width })
    }

    fn state(&self) -> [usize; 3] {
        [self.b, self.c, self.w - 1]
    }

    fn expect(&self, what: &str, t: &Tensor, shape: &[usize]) -> Result<()> {
        if t.dims() != shape {
            candle_core::bail!("causal conv1d: {what} of shape {:?}, expected {shape:?} for {self:?}", t.dims());
        }
        Ok(())
    }

    /// The bias, or zeros without one.
    fn bias(&self, bias: Option<&Tensor>, x: &Tensor) -> Result<Tensor> {
        match bias {
            Some(b) => {
                self.expect("bias", b, &[self.c])?;
                Ok(b.clone())
            }
            None => Tensor::zeros(self.c, x.dtype(), x.device()),
        }
    }

    /// The initial state, or zeros without one.
    fn initial(&self, initial: Option<&Tensor>, x: &Tensor) -> Result<Tensor> {
        match initial {
            Some(s) => {
                self.expect("initial state", s, &self.state())?;
                Ok(s.clone())
            }
            None => Tensor::zeros(self.state().as_slice(), x.dtype(), x.device()),
        }
    }
}

/// The training forward: `(y, final state)`, `y` `[B, T, C]`, the final state `[B, C, W−1]` (the
/// last document's last `W−1` inputs, zeros before its start). The backward needs only the
/// inputs: it recomputes `u`, `W` multiply-adds an element, about what reading a kept copy costs.
pub fn forward(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    initial: Option<&Tensor>,
    mask: &Mask,
) -> Result<(Tensor, Tensor)> {
    let _profile = crate::profile::scope("causal conv1d fwd", x.device());
    let d = Dims::of(x, w)?;
    mask.check_tokens("causal conv1d", d.b, d.t)?;
    run(&d, x, w, bias, initial, Some(mask.starts()))
}

/// Gradients of [`forward`] for `dy` `[B, T, C]` and, when the final state feeds a later call, its
/// gradient `dstate` `[B, C, W−1]`.
pub fn backward(
    dy: &Tensor,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    initial: Option<&Tensor>,
    mask: &Mask,
    dstate: Option<&Tensor>,
) -> Result<Grads> {
    let _profile = crate::profile::scope("causal conv1d bwd", x.device());
    let d = Dims::of(x, w)?;
    mask.check_tokens("causal conv1d", d.b, d.t)?;
    d.expect("output gradient", dy, x.dims())?;
    let (b, s0) = (d.bias(bias, x)?, d.initial(initial, x)?);
    let ds = match dstate {
        Some(s) => {
            d.expect("state gradient", s, &d.state())?;
            s.clone()
        }
        None => s0.zeros_like()?,
    };
    #[cfg(feature = "cuda")]
    use crate::gpu::causal_conv1d::backward as gpu;
    use cpu::conv1d::backward as fused;
    let starts = mask.starts();
    let [dx, dw, dbias, ds0] = on_gpu_or!(
        [dy, x, w, &b, &s0, &ds],
        gpu(dy, x, w, &b, &s0, starts, &ds),
        dispatch!(
            [dy, x, w, &b, &s0, &ds],
            fused(dy, x, w, &b, &s0, starts, &ds),
            reference::backward(dy, x, w, &b, &s0, starts, &ds)
        )
    )?;
    Ok(Grads { dx, dw, dbias: bias.map(|_| dbias), dstate: initial.map(|_| ds0) })
}

/// Inference: `x` `[B, T, C]` (one token when decoding, more for a prefill) of rows that are one
/// document each, from `state` `[B, C, W−1]`; returns `y` and the new state.
pub fn step(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, state: &Tensor) -> Result<(Tensor, Tensor)> {
    let _profile = crate::profile::scope("causal conv1d step", x.device());
    let d = Dims::of(x, w)?;
    run(&d, x, w, bias, Some(state), None)
}

/// The forward of [`forward`] and [`step`].
fn run(
    d: &Dims,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    initial: Option<&Tensor>,
    starts: Option<&[u32]>,
) -> Result<(Tensor, Tensor)> {
    let (bias, s0) = (d.bias(bias, x)?, d.initial(initial, x)?);
    #[cfg(feature = "cuda")]
    use crate::gpu::causal_conv1d::forward as gpu;
    use cpu::conv1d::forward as fused;
    on_gpu_or!(
        [x, w, &bias, &s0],
        gpu(x, w, &bias, &s0, starts),
        dispatch!([x, w, &bias, &s0], fused(x, w, &bias, &s0, starts), reference::forward(x, w, &bias, &s0, starts))
    )
}

/// Whether token `t` of row `b` may read position `p` (a state position when negative): a
/// token of a document that starts later in the row reads nothing before that start.
pub(crate) fn visible(starts: Option<&[u32]>, d: &Dims, b: usize, t: usize, p: isize) -> bool {
    match starts.map(|s| s[b * d.t + t] as isize) {
        Some(start) if start > 0 => p >= start,
        _ => true,
    }
}

/// The composed form, on any candle device: the referee of the fused kernel. Inputs and state
/// are joined into one `[B, W−1+T, C]` sequence (position `p` at index `p + W−1`) and each tap is
/// a shifted slice of it, masked where a token may not read it.
pub mod reference {
    use super::{Dims, visible};
    use candle_core::{D, Result, Tensor};

    /// `[B, n, 1]`: 1 where the token at `t0 + i` may read position `t0 + i + shift`.
    fn visibility(starts: Option<&[u32]>, d: &Dims, t0: usize, n: usize, shift: isize, x: &Tensor) -> Result<Tensor> {
        let v: Vec<f64> = (0..d.b)
            .flat_map(|b| (t0..t0 + n).map(move |t| f64::from(u8::from(visible(starts, d, b, t, t as isize + shift)))))
            .collect();
        Tensor::from_vec(v, (d.b, n, 1), x.device())?.to_dtype(x.dtype())
    }

    /// The state as rows `[B, W−1, C]` ahead of `x`.
    fn joined(x: &Tensor, s0: &Tensor) -> Result<Tensor> {
        Tensor::cat(&[&s0.transpose(1, 2)?, x], 1)
    }

    /// Tap `j`'s input for every token, `[B, T, C]`, zero where not visible.
    fn tap(xs: &Tensor, d: &Dims, starts: Option<&[u32]>, j: usize) -> Result<Tensor> {
        let shift = j as isize - (d.w as isize - 1);
        xs.narrow(1, j, d.t)?.broadcast_mul(&visibility(starts, d, 0, d.t, shift, xs)?)
    }

    fn pre_activation(xs: &Tensor, w: &Tensor, bias: &Tensor, d: &Dims, starts: Option<&[u32]>) -> Result<Tensor> {
        let mut u = bias.reshape((1, 1, d.c))?.broadcast_as((d.b, d.t, d.c))?.contiguous()?;
        for j in 0..d.w {
            u = (u + tap(xs, d, starts, j)?.broadcast_mul(&w.narrow(1, j, 1)?.reshape((1, 1, d.c))?)?)?;
        }
        Ok(u)
    }

    /// The final state's visibility, `[B, W−1, 1]`: positions `T−W+1 ..` for the last token.
    fn final_visibility(d: &Dims, starts: Option<&[u32]>, x: &Tensor) -> Result<Tensor> {
        let v: Vec<f64> = (0..d.b)
            .flat_map(|b| {
                (0..d.w - 1).map(move |m| {
                    let p = (d.t + m) as isize - (d.w as isize - 1);
                    f64::from(u8::from(visible(starts, d, b, d.t - 1, p)))
                })
            })
            .collect();
        Tensor::from_vec(v, (d.b, d.w - 1, 1), x.device())?.to_dtype(x.dtype())
    }

    pub fn forward(
        x: &Tensor,
        w: &Tensor,
        bias: &Tensor,
        s0: &Tensor,
        starts: Option<&[u32]>,
    ) -> Result<(Tensor, Tensor)> {
        let d = Dims::of(x, w)?;
        let xs = joined(x, s0)?;
        let y = pre_activation(&xs, w, bias, &d, starts)?.silu()?;
        let last = xs.narrow(1, d.t, d.w - 1)?.broadcast_mul(&final_visibility(&d, starts, x)?)?;
        Ok((y, last.transpose(1, 2)?.contiguous()?))
    }

    /// `[dx, dw, dbias, d initial state]`.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        dy: &Tensor,
        x: &Tensor,
        w: &Tensor,
        bias: &Tensor,
        s0: &Tensor,
        starts: &[u32],
        dstate: &Tensor,
    ) -> Result<[Tensor; 4]> {
        let d = Dims::of(x, w)?;
        let starts = Some(starts);
        let xs = joined(x, s0)?;
        let u = pre_activation(&xs, w, bias, &d, starts)?;
        let sig = (u.neg()?.exp()? + 1.0)?.recip()?;
        // d silu/du = σ + silu·(1 − σ)
        let du = (dy * (&sig + ((&u * &sig)? * (1.0 - &sig)?)?)?)?;
        let padded = |g: Tensor, left: usize, right: usize| -> Result<Tensor> {
            let z = |n: usize| Tensor::zeros((d.b, n, d.c), g.dtype(), g.device());
            let (before, after) = (z(left)?, z(right)?);
            Tensor::cat(&[before, g, after], 1)
        };
        // The final state's gradient flows to the positions it copied.
        let dlast = dstate.transpose(1, 2)?.broadcast_mul(&final_visibility(&d, starts, x)?)?;
        let mut dxs = padded(dlast, d.t, 0)?;
        let mut dw = Vec::with_capacity(d.w);
        for j in 0..d.w {
            let shift = j as isize - (d.w as isize - 1);
            let g = du.broadcast_mul(&visibility(starts, &d, 0, d.t, shift, x)?)?;
            dw.push((&g * xs.narrow(1, j, d.t)?)?.sum((0, 1))?);
            let gx = g.broadcast_mul(&w.narrow(1, j, 1)?.reshape((1, 1, d.c))?)?;
            dxs = (dxs + padded(gx, j, d.w - 1 - j)?)?;
        }
        let dx = dxs.narrow(1, d.w - 1, d.t)?;
        let ds0 = dxs.narrow(1, 0, d.w - 1)?.transpose(1, 2)?.contiguous()?;
        Ok([dx, Tensor::stack(&dw, D::Minus1)?, du.sum((0, 1))?, ds0])
    }
}

#[cfg(test)]
mod tests;
