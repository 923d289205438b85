//! The SwiGLU gate of the MLP: `h = silu(gate) · up`.

use crate::cpu::{self, dispatch};
use crate::on_gpu_or;
use candle_core::{Result, Tensor};

/// Backward needs `gate` and `up`, which the caller keeps; nothing else is saved.
pub fn forward(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    let _profile = crate::profile::scope("swiglu fwd", gate.device());
    check(&[gate, up])?;
    #[cfg(feature = "cuda")]
    use crate::gpu::elementwise::swiglu_forward as gpu;
    use cpu::elementwise::swiglu_forward as fused;
    on_gpu_or!([gate, up], gpu(gate, up), dispatch!([gate, up], fused(gate, up), reference::forward(gate, up)))
}

/// The forward over a packed gate/up projection `gu` `[N, 2f]` (each row the gate's `f` values,
/// then the up's): one GEMM for both projections, and no copy to split its output.
pub fn forward_packed(gu: &Tensor) -> Result<Tensor> {
    let _profile = crate::profile::scope("swiglu fwd", gu.device());
    let (_, width) = gu.dims2()?;
    if width % 2 != 0 {
        candle_core::bail!("swiglu: packed gate/up {:?} has an odd width", gu.dims());
    }
    #[cfg(feature = "cuda")]
    use crate::gpu::elementwise::swiglu_packed_forward as gpu;
    on_gpu_or!([gu], gpu(gu), {
        let f = width / 2;
        forward(&gu.narrow(1, 0, f)?.contiguous()?, &gu.narrow(1, f, f)?.contiguous()?)
    })
}

/// `d_gate = dh·up·σ(g)(1 + g(1 − σ(g)))`, `d_up = dh·silu(g)`.
pub fn backward(dh: &Tensor, gate: &Tensor, up: &Tensor) -> Result<(Tensor, Tensor)> {
    let _profile = crate::profile::scope("swiglu bwd", gate.device());
    check(&[dh, gate, up])?;
    #[cfg(feature = "cuda")]
    use crate::gpu::elementwise::swiglu_backward as gpu;
    use cpu::elementwise::swiglu_backward as fused;
    let cpu_or_reference = || dispatch!([dh, gate, up], fused(dh, gate, up), reference::backward(dh, gate, up));
    on_gpu_or!([dh, gate, up], gpu(dh, gate, up), cpu_or_reference())
}

/// The backward over a packed gate/up projection: `dh` `[N, f]`, `gu` `[N, 2f]` → `[N, 2f]`,
/// each row the gate's gradient then the up's (the layout the packed GEMM's backward reads).
pub fn backward_packed(dh: &Tensor, gu: &Tensor) -> Result<Tensor> {
    let _profile = crate::profile::scope("swiglu bwd", gu.device());
    let (rows, width) = gu.dims2()?;
    if width % 2 != 0 || dh.dims() != [rows, width / 2] {
        candle_core::bail!("swiglu: gradient {:?} for packed gate/up {:?}", dh.dims(), gu.dims());
    }
    #[cfg(feature = "cuda")]
    use crate::gpu::elementwise::swiglu_packed_backward as gpu;
    on_gpu_or!([dh, gu], gpu(dh, gu), {
        let f = width / 2;
        let (dg, du) = backward(dh, &gu.narrow(1, 0, f)?.contiguous()?, &gu.narrow(1, f, f)?.contiguous()?)?;
        Tensor::cat(&[dg, du], 1)
    })
}

fn check(ts: &[&Tensor]) -> Result<()> {
    if ts.iter().any(|t| t.dims() != ts[0].dims()) {
        candle_core::bail!("swiglu: shapes differ: {:?}", ts.iter().map(|t| t.dims()).collect::<Vec<_>>());
    }
    Ok(())
}

/// The composed form, on any candle device: the referee of the fused kernel.
pub mod reference {
    use candle_core::{Result, Tensor};

    pub fn forward(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
        gate.silu()? * up
    }

    pub fn backward(dh: &Tensor, gate: &Tensor, up: &Tensor) -> Result<(Tensor, Tensor)> {
        let sig = (gate.neg()?.exp()? + 1.0)?.recip()?;
        let silu = (gate * &sig)?;
        // σ(1 + g(1 − σ)) = σ + silu·(1 − σ)
        let dsilu = (&sig + (&silu * (1.0 - &sig)?)?)?;
        let d_gate = ((dh * up)? * dsilu)?;
        let d_up = (dh * silu)?;
        Ok((d_gate, d_up))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::{assert_close, check, random};
    use candle_core::{DType, Device};

    #[test]
    fn fused_kernel_matches_the_reference_in_f64_and_f32() -> Result<()> {
        let dev = Device::Cpu;
        // Larger than one parallel chunk, gates spread over ±12.
        let n = [3, 7000];
        let (g, u, dh) = ((random(&n, 1, &dev)? * 12.0)?, random(&n, 2, &dev)?, random(&n, 3, &dev)?);
        let h_ref = reference::forward(&g, &u)?;
        let (dg_ref, du_ref) = reference::backward(&dh, &g, &u)?;
        for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 2e-6)] {
            let c = |t: &Tensor| t.to_dtype(dtype);
            assert_close(&forward(&c(&g)?, &c(&u)?)?, &h_ref, tol)?;
            let (dg, du) = backward(&c(&dh)?, &c(&g)?, &c(&u)?)?;
            assert_close(&dg, &dg_ref, tol)?;
            assert_close(&du, &du_ref, tol)?;
        }
        assert!(forward(&g, &random(&[3, 6999], 4, &dev)?).is_err());
        // Packed: [gate | up] per row gives the same bits as the two apart.
        let gu = Tensor::cat(&[&g, &u], 1)?;
        assert_close(&forward_packed(&gu)?, &forward(&g, &u)?, 0.0)?;
        assert!(forward_packed(&gu.narrow(1, 0, 7001)?).is_err());
        let (dg, du) = backward(&dh, &g, &u)?;
        assert_close(&backward_packed(&dh, &gu)?, &Tensor::cat(&[&dg, &du], 1)?, 0.0)?;
        assert!(backward_packed(&dh.narrow(1, 0, 6999)?, &gu).is_err());
        Ok(())
    }

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
