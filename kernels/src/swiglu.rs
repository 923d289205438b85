//! The SwiGLU gate of the MLP: `h = silu(gate) · up`.

use candle_core::{Result, Tensor};

/// Backward needs `gate` and `up`, which the caller keeps; nothing else is saved.
pub fn forward(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    gate.silu()? * up
}

/// `d_gate = dh·up·σ(g)(1 + g(1 − σ(g)))`, `d_up = dh·silu(g)`.
pub fn backward(dh: &Tensor, gate: &Tensor, up: &Tensor) -> Result<(Tensor, Tensor)> {
    let sig = (gate.neg()?.exp()? + 1.0)?.recip()?;
    let silu = (gate * &sig)?;
    // σ(1 + g(1 − σ)) = σ + silu·(1 − σ)
    let dsilu = (&sig + (&silu * (1.0 - &sig)?)?)?;
    let d_gate = ((dh * up)? * dsilu)?;
    let d_up = (dh * silu)?;
    Ok((d_gate, d_up))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::{check, random};
    use candle_core::Device;

    #[test]
    fn gradients_match_finite_differences() -> Result<()> {
        let dev = Device::Cpu;
        let g = (random(&[3, 4], 1, &dev)? * 4.0)?;
        let u = random(&[3, 4], 2, &dev)?;
        let dh = random(&[3, 4], 3, &dev)?;
        let (dg, du) = backward(&dh, &g, &u)?;
        check(|t: &[Tensor]| forward(&t[0], &t[1]), &[g, u], &dh, &[dg, du])
    }
}
