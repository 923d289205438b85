//! The gated delta rule: the token mixer of Gated DeltaNet layers (Qwen3.5/3.6 hybrids), as
//! transformers' `torch_recurrent_gated_delta_rule` / `torch_chunk_gated_delta_rule` compute it.
//!
//! Per head a state `S` `[d_k, d_v]` (indexed as transformers' `recurrent_state`
//! `[B, H, d_k, d_v]`), and per token `t`, with `q̃ = scale·q`:
//!
//! ```text
//! S'  = exp(g_t)·S_{t−1}        g is a log-decay (≤ 0 in the model)
//! u   = S'ᵀ k_t                 what the decayed state recalls for k_t
//! δ   = β_t·(v_t − u)           the delta rule's correction
//! S_t = S' + k_t δᵀ
//! o_t = S_tᵀ q̃_t                the output reads the updated state
//! ```
//!
//! q and k arrive as the model feeds the kernel: the caller L2-normalises them first
//! ([`crate::l2norm`], transformers' `use_qk_l2norm_in_kernel=True`) and passes
//! `scale = 1/√d_k`, which transformers always applies. v, β and g have `H` heads, q and k
//! `H_k` with `H_k | H`: head `h` reads q/k head `h / (H/H_k)` (the model's
//! `repeat_interleave`), and the q/k gradients sum over the heads that share them.
//! Packed rows: at a token where a document starts ([`Mask`]) the state restarts from zero, so
//! documents never see each other; a given initial state belongs to each row's first document.
//!
//! transformers runs the rule in f32 whatever the inputs' dtype and returns the output in the
//! inputs' dtype and the state in f32; narrower inputs are widened here the same way, so the
//! fused CPU kernel (`crate::cpu::delta_rule`) serves them. CUDA tensors of f32 or bf16 take the
//! CUDA kernels (`crate::gpu::delta_rule`: f32 arithmetic and state, bf16 read and written as
//! bf16); other devices the composed [`reference`](mod@reference).

use crate::attention::Mask;
use crate::cpu::{self, dispatch};
use candle_core::{DType, Result, Tensor};

#[cfg(test)]
pub(crate) mod case;
#[cfg(test)]
mod chunked;
#[cfg(test)]
mod tests;

/// Tokens between two states the forward keeps for the backward (FLA's chunk length, so the
/// GPU chunked kernels can keep the same `[.., chunks, d_k, d_v]` states).
pub const CHUNK: usize = 64;

/// The operands of one call. Shapes: q, k `[B, T, H_k, d_k]`; v `[B, T, H, d_v]`; beta
/// (the write strength, σ of a projection) and g (the log-decay) `[B, T, H]`.
#[derive(Clone, Copy)]
pub struct Operands<'a> {
    pub q: &'a Tensor,
    pub k: &'a Tensor,
    pub v: &'a Tensor,
    pub beta: &'a Tensor,
    pub g: &'a Tensor,
    /// Multiplies q (transformers: `d_k^-0.5`).
    pub scale: f64,
}

/// What [`forward`] returns.
pub struct Forward {
    /// `[B, T, H, d_v]`.
    pub out: Tensor,
    /// The state after the last token, `[B, H, d_k, d_v]`: where decoding continues.
    pub state: Tensor,
    /// The state entering each chunk of [`CHUNK`] tokens, `[B, H, ⌈T/CHUNK⌉, d_k, d_v]`, from
    /// which the backward recomputes the chunk's per-token states. Memory: `4·B·H·⌈T/64⌉·d_k·d_v`
    /// bytes in f32, 64× less than per-token states (128 MiB per row at T = 4096 with Qwen3.6's
    /// 32 value heads of 128×128).
    pub checkpoints: Tensor,
}

/// What [`backward`] returns, each gradient shaped as its operand.
pub struct Grads {
    pub dq: Tensor,
    pub dk: Tensor,
    pub dv: Tensor,
    pub dbeta: Tensor,
    pub dg: Tensor,
    /// Of the initial state, when one was given.
    pub dstate: Option<Tensor>,
}

/// The sizes of one call, checked against every operand.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dims {
    pub b: usize,
    pub t: usize,
    pub hk: usize,
    pub h: usize,
    pub dk: usize,
    pub dv: usize,
}

impl Dims {
    pub(crate) fn of(x: &Operands) -> Result<Dims> {
        let (b, t, hk, dk) = x.q.dims4()?;
        let (_, _, h, dv) = x.v.dims4()?;
        let d = Dims { b, t, hk, h, dk, dv };
        let bad = |what: &str, t: &Tensor| -> Result<Dims> {
            candle_core::bail!(
                "delta rule: {what} of shape {:?} for q {:?} and v {:?}",
                t.dims(),
                x.q.dims(),
                x.v.dims()
            )
        };
        if x.k.dims() != x.q.dims() {
            return bad("k", x.k);
        }
        if x.v.dims()[..2] != [b, t] || hk == 0 || !h.is_multiple_of(hk) {
            return bad("v", x.v);
        }
        if t == 0 {
            candle_core::bail!("delta rule: q of shape {:?} has no tokens", x.q.dims());
        }
        for (what, s) in [("beta", x.beta), ("g", x.g)] {
            if s.dims() != [b, t, h] {
                return bad(what, s);
            }
        }
        Ok(d)
    }

    /// Value heads per q/k head.
    pub fn rep(&self) -> usize {
        self.h / self.hk
    }

    pub fn chunks(&self) -> usize {
        self.t.div_ceil(CHUNK)
    }

    pub(crate) fn state(&self) -> [usize; 4] {
        [self.b, self.h, self.dk, self.dv]
    }

    fn expect(&self, what: &str, t: &Tensor, shape: &[usize]) -> Result<()> {
        if t.dims() != shape {
            candle_core::bail!("delta rule: {what} of shape {:?}, expected {shape:?} for {self:?}", t.dims());
        }
        Ok(())
    }
}

/// The training forward over `x`'s tokens from `initial` (zero when `None`), documents kept
/// apart by `mask`. The state and checkpoints come in the working dtype (f32 unless f64).
pub fn forward(x: &Operands, initial: Option<&Tensor>, mask: &Mask) -> Result<Forward> {
    let _profile = crate::profile::scope("delta rule fwd", x.q.device());
    let d = Dims::of(x)?;
    mask.check_tokens("delta rule", d.b, d.t)?;
    let (out, state, checkpoints) = recurrence(&d, x, initial, Some(mask.starts()), true)?;
    Ok(Forward { out, state, checkpoints })
}

/// Gradients of [`forward`] for the output gradient `dout` `[B, T, H, d_v]` and, when the final
/// state feeds a later call, its gradient `dstate` (`[B, H, d_k, d_v]`). `checkpoints` is the
/// forward's (it holds the initial state, so `initial` only says whether to return its gradient).
pub fn backward(
    x: &Operands,
    initial: Option<&Tensor>,
    mask: &Mask,
    checkpoints: &Tensor,
    dout: &Tensor,
    dstate: Option<&Tensor>,
) -> Result<Grads> {
    let _profile = crate::profile::scope("delta rule bwd", x.q.device());
    let d = Dims::of(x)?;
    mask.check_tokens("delta rule", d.b, d.t)?;
    d.expect("checkpoints", checkpoints, &[d.b, d.h, d.chunks(), d.dk, d.dv])?;
    d.expect("output gradient", dout, &[d.b, d.t, d.h, d.dv])?;
    if let Some(s) = initial {
        d.expect("initial state", s, &d.state())?;
    }
    let dtype = working_dtype(x.q.dtype());
    let ds = match dstate {
        Some(s) => {
            d.expect("state gradient", s, &d.state())?;
            s.to_dtype(dtype)?
        }
        None => Tensor::zeros(d.state().as_slice(), dtype, x.q.device())?,
    };
    let starts = mask.starts();
    let composed = || {
        let owned = widened(x)?;
        let w = Operands::of(&owned, x.scale);
        let (checkpoints, dout) = (checkpoints.to_dtype(dtype)?, dout.to_dtype(dtype)?);
        use cpu::delta_rule::backward as fused;
        dispatch!(
            [w.q, w.k, w.v, w.beta, w.g, &checkpoints, &dout, &ds],
            fused(&w, starts, &checkpoints, &dout, &ds),
            reference::backward(&w, starts, &checkpoints, &dout, &ds)
        )
    };
    #[cfg(feature = "cuda")]
    let composed = || {
        use crate::gpu::delta_rule::{MAX_DK, backward as gpu};
        if d.dk > MAX_DK {
            return composed();
        }
        crate::gpu::dispatch!([x.q, x.k, x.v], gpu(x, starts, checkpoints, dout, &ds), composed())
    };
    let [dq, dk, dv, dbeta, dg, ds0] = composed()?;
    // Each gradient in its operand's dtype, as autograd returns it.
    let like = |g: Tensor, x: &Tensor| g.to_dtype(x.dtype());
    Ok(Grads {
        dq: like(dq, x.q)?,
        dk: like(dk, x.k)?,
        dv: like(dv, x.v)?,
        dbeta: like(dbeta, x.beta)?,
        dg: like(dg, x.g)?,
        dstate: initial.map(|s| like(ds0, s)).transpose()?,
    })
}

/// Inference: the recurrence over `x`'s tokens (one when decoding, more for a prefill) of rows
/// that are one document each, from `state`; returns the output and the new state (in the
/// working dtype) and keeps nothing for a backward.
pub fn step(x: &Operands, state: &Tensor) -> Result<(Tensor, Tensor)> {
    let _profile = crate::profile::scope("delta rule step", x.q.device());
    let d = Dims::of(x)?;
    let (out, state, _) = recurrence(&d, x, Some(state), None, false)?;
    Ok((out, state))
}

/// The forward of [`forward`] and [`step`] in the working dtype, the output cast back to q's:
/// `(out, final state, checkpoints)`, the checkpoints kept when `keep`.
fn recurrence(
    d: &Dims,
    x: &Operands,
    initial: Option<&Tensor>,
    starts: Option<&[u32]>,
    keep: bool,
) -> Result<(Tensor, Tensor, Tensor)> {
    let s0 = initial_state(d, x, initial)?;
    let composed = || {
        let owned = widened(x)?;
        let w = Operands::of(&owned, x.scale);
        use cpu::delta_rule::forward as fused;
        let (out, state, checkpoints) = dispatch!(
            [w.q, w.k, w.v, w.beta, w.g, &s0],
            fused(&w, &s0, starts, keep),
            reference::forward(&w, &s0, starts, keep)
        )?;
        Ok((out.to_dtype(x.q.dtype())?, state, checkpoints))
    };
    // The CUDA kernels take CUDA tensors of f32 or bf16 (q, k and v of one dtype; β and g are
    // read in f32 whatever theirs) with d_k up to the state rows a warp holds; other heads,
    // dtypes and devices take the fused CPU kernel or the composed reference.
    #[cfg(feature = "cuda")]
    if d.dk <= crate::gpu::delta_rule::MAX_DK {
        use crate::gpu::delta_rule::forward as gpu;
        return crate::gpu::dispatch!([x.q, x.k, x.v], gpu(x, &s0, starts, keep), composed());
    }
    composed()
}

/// The initial state in the working dtype (f64 for f64 inputs, else f32), zeros without one.
fn initial_state(d: &Dims, x: &Operands, initial: Option<&Tensor>) -> Result<Tensor> {
    let dtype = working_dtype(x.q.dtype());
    match initial {
        Some(s) => {
            d.expect("initial state", s, &d.state())?;
            s.to_dtype(dtype)
        }
        None => Tensor::zeros(d.state().as_slice(), dtype, x.q.device()),
    }
}

fn working_dtype(dtype: DType) -> DType {
    if dtype == DType::F64 { DType::F64 } else { DType::F32 }
}

/// The operand tensors in the working dtype (`to_dtype` to the same dtype is a cheap clone).
fn widened(x: &Operands) -> Result<[Tensor; 5]> {
    let dtype = working_dtype(x.q.dtype());
    Ok([
        x.q.to_dtype(dtype)?,
        x.k.to_dtype(dtype)?,
        x.v.to_dtype(dtype)?,
        x.beta.to_dtype(dtype)?,
        x.g.to_dtype(dtype)?,
    ])
}

impl<'a> Operands<'a> {
    fn of(t: &'a [Tensor; 5], scale: f64) -> Operands<'a> {
        Operands { q: &t[0], k: &t[1], v: &t[2], beta: &t[3], g: &t[4], scale }
    }
}

/// The composed form, on any candle device: the referee of the fused kernel, token by token
/// over whole `[B, H, d_k, d_v]` states (the recurrence written as the module doc states it).
pub mod reference {
    use super::{CHUNK, Dims, Operands};
    use candle_core::{IndexOp, Result, Tensor};

    /// q or k `[B, T, H_k, d_k]` read per value head: `[B, T, H, d_k]`.
    fn per_value_head(t: &Tensor, d: &Dims) -> Result<Tensor> {
        t.unsqueeze(3)?.broadcast_as((d.b, d.t, d.hk, d.rep(), d.dk))?.reshape((d.b, d.t, d.h, d.dk))
    }

    /// The state token `t` starts from: `s`, zeroed in the rows where a document starts at `t`.
    fn restarted(s: &Tensor, starts: Option<&[u32]>, d: &Dims, t: usize) -> Result<Tensor> {
        let Some(starts) = starts else { return Ok(s.clone()) };
        let keep: Vec<f64> = (0..d.b).map(|b| f64::from(t == 0 || starts[b * d.t + t] as usize != t)).collect();
        s.broadcast_mul(&Tensor::new(keep, s.device())?.to_dtype(s.dtype())?.reshape((d.b, 1, 1, 1))?)
    }

    /// One token's operands, each `[B, H, ..]`.
    struct Token {
        k: Tensor,
        v: Tensor,
        beta: Tensor,
        alpha: Tensor,
    }

    impl Token {
        fn at(k: &Tensor, x: &Operands, alpha: &Tensor, t: usize) -> Result<Token> {
            Ok(Token { k: k.i((.., t))?, v: x.v.i((.., t))?, beta: x.beta.i((.., t))?, alpha: alpha.i((.., t))? })
        }
    }

    /// From the previous state `p`: `(S', u, δ, S_t)`.
    fn advance(p: &Tensor, x: &Token) -> Result<(Tensor, Tensor, Tensor, Tensor)> {
        let sp = p.broadcast_mul(&x.alpha.unsqueeze(2)?.unsqueeze(3)?)?;
        let u = sp.broadcast_mul(&x.k.unsqueeze(3)?)?.sum(2)?;
        let delta = (&x.v - &u)?.broadcast_mul(&x.beta.unsqueeze(2)?)?;
        let s = (&sp + x.k.unsqueeze(3)?.broadcast_mul(&delta.unsqueeze(2)?)?)?;
        Ok((sp, u, delta, s))
    }

    /// `(out, final state, checkpoints)`; checkpoints `[B, H, 0, d_k, d_v]` unless `keep`.
    pub fn forward(x: &Operands, s0: &Tensor, starts: Option<&[u32]>, keep: bool) -> Result<(Tensor, Tensor, Tensor)> {
        let d = Dims::of(x)?;
        let q = (per_value_head(x.q, &d)? * x.scale)?;
        let (k, alpha) = (per_value_head(x.k, &d)?, x.g.exp()?);
        let (mut s, mut outs, mut kept) = (s0.clone(), Vec::with_capacity(d.t), Vec::new());
        for t in 0..d.t {
            if keep && t % CHUNK == 0 {
                kept.push(s.clone());
            }
            (_, _, _, s) = advance(&restarted(&s, starts, &d, t)?, &Token::at(&k, x, &alpha, t)?)?;
            outs.push(s.broadcast_mul(&q.i((.., t))?.unsqueeze(3)?)?.sum(2)?);
        }
        let checkpoints = if keep {
            Tensor::stack(&kept, 2)?
        } else {
            Tensor::zeros((d.b, d.h, 0, d.dk, d.dv), s0.dtype(), s0.device())?
        };
        Ok((Tensor::stack(&outs, 1)?, s, checkpoints))
    }

    /// `[dq, dk, dv, dβ, dg, d initial state]`.
    pub fn backward(
        x: &Operands,
        starts: &[u32],
        checkpoints: &Tensor,
        dout: &Tensor,
        dstate: &Tensor,
    ) -> Result<[Tensor; 6]> {
        let d = Dims::of(x)?;
        let q = (per_value_head(x.q, &d)? * x.scale)?;
        let (k, alpha) = (per_value_head(x.k, &d)?, x.g.exp()?);
        let mut ds = dstate.clone();
        let mut grads: Vec<[Tensor; 5]> = Vec::with_capacity(d.t);
        for c in (0..d.chunks()).rev() {
            let (t0, t1) = (c * CHUNK, (c * CHUNK + CHUNK).min(d.t));
            // The chunk's states, recomputed from the one kept at its start.
            let mut s = checkpoints.i((.., .., c))?;
            let mut saved = Vec::with_capacity(t1 - t0);
            for t in t0..t1 {
                let (sp, u, delta, next) =
                    advance(&restarted(&s, Some(starts), &d, t)?, &Token::at(&k, x, &alpha, t)?)?;
                saved.push((sp, u, delta, next.clone()));
                s = next;
            }
            for t in (t0..t1).rev() {
                let (sp, u, delta, s) = &saved[t - t0];
                let x_t = Token::at(&k, x, &alpha, t)?;
                let (q_t, do_t) = (q.i((.., t))?, dout.i((.., t))?);
                // o = Sᵀq̃
                let dq = (s.broadcast_mul(&do_t.unsqueeze(2)?)?.sum(3)? * x.scale)?;
                ds = (ds + q_t.unsqueeze(3)?.broadcast_mul(&do_t.unsqueeze(2)?)?)?;
                // S = S' + kδᵀ
                let mut dk = ds.broadcast_mul(&delta.unsqueeze(2)?)?.sum(3)?;
                let ddelta = ds.broadcast_mul(&x_t.k.unsqueeze(3)?)?.sum(2)?;
                // δ = β(v − u)
                let dbeta = (&ddelta * (&x_t.v - u)?)?.sum(2)?;
                let dv = ddelta.broadcast_mul(&x_t.beta.unsqueeze(2)?)?;
                // u = S'ᵀk
                let dsp = (&ds - x_t.k.unsqueeze(3)?.broadcast_mul(&dv.unsqueeze(2)?)?)?;
                dk = (dk - sp.broadcast_mul(&dv.unsqueeze(2)?)?.sum(3)?)?;
                // S' = exp(g)·P, P = S_{t−1} or zero where a document starts
                let dg = (&dsp * sp)?.sum((2, 3))?;
                ds = restarted(&dsp.broadcast_mul(&x_t.alpha.unsqueeze(2)?.unsqueeze(3)?)?, Some(starts), &d, t)?;
                grads.push([dq, dk, dv, dbeta, dg]);
            }
        }
        grads.reverse();
        let along_t = |i: usize| Tensor::stack(&grads.iter().map(|g| g[i].clone()).collect::<Vec<_>>(), 1);
        // q and k gradients summed over the value heads that read them.
        let per_key_head = |g: Tensor| g.reshape((d.b, d.t, d.hk, d.rep(), d.dk))?.sum(3);
        Ok([per_key_head(along_t(0)?)?, per_key_head(along_t(1)?)?, along_t(2)?, along_t(3)?, along_t(4)?, ds])
    }
}
