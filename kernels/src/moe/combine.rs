//! Back from sorted rows to tokens. A token's `k` rows are summed in slot order (its most
//! probable expert first), by one task per token: no atomics, so the sum's order is fixed.
//!
//! * [`forward`]: `out[t] = Σ_j weights[t, j] · y[pos(t, j)]` (the experts' outputs weighted);
//! * [`backward`]: `dy[pos(t, j)] = weights[t, j] · dout[t]` and `dweights[t, j] = dout[t] · y[pos(t, j)]`;
//! * [`scatter_sum`]: `dx[t] = Σ_j dxs[pos(t, j)]`, the backward of gathering a token's row to
//!   each of its experts.

use candle_core::{Result, Tensor};

use super::Groups;
use super::cpu;

/// `y` `[N·k, H]` sorted, `weights` `[N, k]` → `[N, H]`.
pub fn forward(y: &Tensor, weights: &Tensor, groups: &Groups) -> Result<Tensor> {
    let _profile = crate::profile::scope("moe combine fwd", y.device());
    check(y, weights, groups)?;
    match crate::cpu::dtype_of(&[y, weights]) {
        Some(candle_core::DType::F32) => cpu::combine_forward::<f32>(y, weights, groups),
        Some(candle_core::DType::F64) => cpu::combine_forward::<f64>(y, weights, groups),
        _ => reference::forward(y, weights, groups),
    }
}

/// `(dy [N·k, H], dweights [N, k])`.
pub fn backward(dout: &Tensor, y: &Tensor, weights: &Tensor, groups: &Groups) -> Result<(Tensor, Tensor)> {
    let _profile = crate::profile::scope("moe combine bwd", y.device());
    check(y, weights, groups)?;
    if dout.dims() != [groups.tokens, y.dim(1)?] {
        candle_core::bail!(
            "moe combine: gradient {:?} for {} tokens of width {}",
            dout.dims(),
            groups.tokens,
            y.dim(1)?
        );
    }
    match crate::cpu::dtype_of(&[dout, y, weights]) {
        Some(candle_core::DType::F32) => cpu::combine_backward::<f32>(dout, y, weights, groups),
        Some(candle_core::DType::F64) => cpu::combine_backward::<f64>(dout, y, weights, groups),
        _ => reference::backward(dout, y, weights, groups),
    }
}

/// `dxs` `[N·k, d]` sorted → `[N, d]`: each token's rows summed.
pub fn scatter_sum(dxs: &Tensor, groups: &Groups) -> Result<Tensor> {
    let _profile = crate::profile::scope("moe unpermute", dxs.device());
    if dxs.dim(0)? != groups.len() {
        candle_core::bail!("moe unpermute: {:?} for {} sorted rows", dxs.dims(), groups.len());
    }
    match crate::cpu::dtype_of(&[dxs]) {
        Some(candle_core::DType::F32) => cpu::scatter_sum::<f32>(dxs, groups),
        Some(candle_core::DType::F64) => cpu::scatter_sum::<f64>(dxs, groups),
        _ => reference::scatter_sum(dxs, groups),
    }
}

fn check(y: &Tensor, weights: &Tensor, groups: &Groups) -> Result<()> {
    if y.dims2()?.0 != groups.len() || weights.dims() != [groups.tokens, groups.k] {
        candle_core::bail!(
            "moe combine: rows {:?} and weights {:?} for {} tokens × {}",
            y.dims(),
            weights.dims(),
            groups.tokens,
            groups.k
        );
    }
    Ok(())
}

/// The composed form: gathers by slot, then sums over `k` (any device, any dtype).
pub mod reference {
    use super::*;

    fn by_slot(t: &Tensor, groups: &Groups) -> Result<Tensor> {
        t.index_select(&groups.positions, 0)?.reshape((groups.tokens, groups.k, t.dim(1)?))
    }

    pub fn forward(y: &Tensor, weights: &Tensor, groups: &Groups) -> Result<Tensor> {
        by_slot(y, groups)?.broadcast_mul(&weights.unsqueeze(2)?)?.sum(1)
    }

    pub fn backward(dout: &Tensor, y: &Tensor, weights: &Tensor, groups: &Groups) -> Result<(Tensor, Tensor)> {
        let h = y.dim(1)?;
        let dslots = weights.unsqueeze(2)?.broadcast_mul(&dout.unsqueeze(1)?)?.reshape((groups.len(), h))?;
        let dy = dslots.index_select(&groups.slots, 0)?;
        let dw = by_slot(y, groups)?.broadcast_mul(&dout.unsqueeze(1)?)?.sum(2)?;
        Ok((dy, dw))
    }

    pub fn scatter_sum(dxs: &Tensor, groups: &Groups) -> Result<Tensor> {
        by_slot(dxs, groups)?.sum(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::{assert_close, check as gradcheck, random};
    use candle_core::{DType, Device};

    fn groups(n: usize, k: usize, e: usize) -> Result<Groups> {
        let ids: Vec<u32> = (0..n * k).map(|s| ((s * 7 + s / k) % e) as u32).collect();
        // Distinct experts per token: shift the j-th choice.
        let ids: Vec<u32> = ids.chunks(k).flat_map(|c| (0..k).map(move |j| (c[0] + j as u32) % e as u32)).collect();
        Groups::new(&Tensor::from_vec(ids, (n, k), &Device::Cpu)?, e)
    }

    #[test]
    fn fused_kernels_match_the_reference_and_finite_differences() -> Result<()> {
        let dev = Device::Cpu;
        let (n, k, e, h) = (70, 3, 5, 6);
        let g = groups(n, k, e)?;
        let (y, w, dout) = (random(&[n * k, h], 1, &dev)?, random(&[n, k], 2, &dev)?, random(&[n, h], 3, &dev)?);
        let out_ref = reference::forward(&y, &w, &g)?;
        let (dy_ref, dw_ref) = reference::backward(&dout, &y, &w, &g)?;
        let sum_ref = reference::scatter_sum(&y, &g)?;
        for (dt, tol) in [(DType::F64, 1e-12), (DType::F32, 2e-6)] {
            let c = |t: &Tensor| t.to_dtype(dt);
            assert_close(&forward(&c(&y)?, &c(&w)?, &g)?, &out_ref, tol)?;
            let (dy, dw) = backward(&c(&dout)?, &c(&y)?, &c(&w)?, &g)?;
            assert_close(&dy, &dy_ref, tol)?;
            assert_close(&dw, &dw_ref, tol)?;
            assert_close(&scatter_sum(&c(&y)?, &g)?, &sum_ref, tol)?;
        }
        let g = groups(4, 2, 3)?;
        let (y, w, dout) = (random(&[8, 3], 4, &dev)?, random(&[4, 2], 5, &dev)?, random(&[4, 3], 6, &dev)?);
        let (dy, dw) = backward(&dout, &y, &w, &g)?;
        gradcheck(|t: &[Tensor]| forward(&t[0], &t[1], &g), &[y.clone(), w.clone()], &dout, &[dy, dw])?;
        let ds = random(&[8, 3], 7, &dev)?;
        let gathered = |t: &[Tensor]| g.gather(&t[0]);
        gradcheck(gathered, std::slice::from_ref(&dout), &ds, &[scatter_sum(&ds, &g)?])?;
        assert!(forward(&y, &random(&[4, 3], 1, &dev)?, &g).is_err());
        Ok(())
    }
}
