//! `y = x·Wᵀ` with `W` stored `[out, in]` as in PyTorch/HF. The leading dims of `x` are
//! flattened, so one GEMM serves any batch shape.

use candle_core::{Result, Tensor};

/// `x`: `[.., in]`, `w`: `[out, in]` → `[.., out]`. Backward needs `x` and `w`, both owned by
/// the caller already, so nothing extra is saved.
pub fn forward(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let (lead, in_dim) = split_last(x)?;
    let out_dim = w.dim(0)?;
    let y = x.reshape((lead.iter().product::<usize>(), in_dim))?.matmul(&w.t()?)?;
    let mut shape = lead;
    shape.push(out_dim);
    y.reshape(shape)
}

/// Gradients of [`forward`]: `dx = dy·W`, and `dW = dyᵀ·x` when `want_dw` (frozen weights
/// skip that GEMM entirely).
pub fn backward(dy: &Tensor, x: &Tensor, w: &Tensor, want_dw: bool) -> Result<(Tensor, Option<Tensor>)> {
    let (lead, in_dim) = split_last(x)?;
    let n: usize = lead.iter().product();
    let dy2 = dy.reshape((n, w.dim(0)?))?;
    let dx = dy2.matmul(w)?.reshape(x.shape())?;
    let dw = if want_dw { Some(dy2.t()?.matmul(&x.reshape((n, in_dim))?)?) } else { None };
    Ok((dx, dw))
}

/// `dW = dyᵀ·x` alone (for a weight whose input gradient is not needed).
pub fn weight_grad(dy: &Tensor, x: &Tensor) -> Result<Tensor> {
    let (lead, in_dim) = split_last(x)?;
    let n: usize = lead.iter().product();
    let out_dim = dy.dim(dy.rank() - 1)?;
    dy.reshape((n, out_dim))?.t()?.matmul(&x.reshape((n, in_dim))?)
}

fn split_last(x: &Tensor) -> Result<(Vec<usize>, usize)> {
    let dims = x.dims();
    match dims.split_last() {
        Some((&last, lead)) => Ok((lead.to_vec(), last)),
        None => candle_core::bail!("linear: a scalar has no feature dimension"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::{check, random};
    use candle_core::Device;

    #[test]
    fn gradients_match_finite_differences() -> Result<()> {
        let dev = Device::Cpu;
        let x = random(&[2, 3, 4], 1, &dev)?;
        let w = random(&[5, 4], 2, &dev)?;
        let dy = random(&[2, 3, 5], 3, &dev)?;
        let (dx, dw) = backward(&dy, &x, &w, true)?;
        let f = |t: &[Tensor]| forward(&t[0], &t[1]);
        check(f, &[x.clone(), w.clone()], &dy, &[dx, dw.expect("dw")])?;
        assert_eq!(weight_grad(&dy, &x)?.to_vec2::<f64>()?, backward(&dy, &x, &w, true)?.1.unwrap().to_vec2::<f64>()?);
        Ok(())
    }
}
