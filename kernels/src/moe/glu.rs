//! SwiGLU on the experts' fused gate/up output: row `p` of `gu` is `[gate_p | up_p]`
//! (`[M, 2F]`, as HF's `gate_up_proj`), the output `silu(gate)·up` (`[M, F]`). The backward
//! writes its gradient straight into that fused layout, the one the grouped input-gradient GEMM
//! reads: no split or concatenation of `[M, 2F]` buffers in either direction.

use candle_core::{Result, Tensor};

use super::cpu;

/// `[M, 2F]` → `[M, F]`.
pub fn forward(gu: &Tensor) -> Result<Tensor> {
    let _profile = crate::profile::scope("moe swiglu fwd", gu.device());
    check(gu)?;
    if gu.device().is_cuda() {
        // The dense packed kernel: one pass, 16-byte chunks where the width allows.
        return crate::swiglu::forward_packed(gu);
    }
    match crate::cpu::dtype_of(&[gu]) {
        Some(candle_core::DType::F32) => cpu::glu_forward::<f32>(gu),
        Some(candle_core::DType::F64) => cpu::glu_forward::<f64>(gu),
        _ => reference::forward(gu),
    }
}

/// `dm` `[M, F]`, `gu` `[M, 2F]` → `dgu` `[M, 2F]`.
pub fn backward(dm: &Tensor, gu: &Tensor) -> Result<Tensor> {
    let _profile = crate::profile::scope("moe swiglu bwd", gu.device());
    let f = check(gu)?;
    if dm.dims() != [gu.dim(0)?, f] {
        candle_core::bail!("moe swiglu: gradient {:?} for gate/up {:?}", dm.dims(), gu.dims());
    }
    if gu.device().is_cuda() {
        return crate::swiglu::backward_packed(dm, gu);
    }
    match crate::cpu::dtype_of(&[dm, gu]) {
        Some(candle_core::DType::F32) => cpu::glu_backward::<f32>(dm, gu),
        Some(candle_core::DType::F64) => cpu::glu_backward::<f64>(dm, gu),
        _ => reference::backward(dm, gu),
    }
}

fn check(gu: &Tensor) -> Result<usize> {
    let (_, w) = gu.dims2()?;
    if w % 2 != 0 {
        candle_core::bail!("moe swiglu: gate/up width {w} is odd");
    }
    Ok(w / 2)
}

/// The composed form: the dense SwiGLU's reference on the two halves.
pub mod reference {
    use super::*;
    use crate::swiglu;

    pub fn forward(gu: &Tensor) -> Result<Tensor> {
        let f = gu.dim(1)? / 2;
        swiglu::reference::forward(&gu.narrow(1, 0, f)?, &gu.narrow(1, f, f)?)
    }

    pub fn backward(dm: &Tensor, gu: &Tensor) -> Result<Tensor> {
        let f = gu.dim(1)? / 2;
        let (dg, du) = swiglu::reference::backward(dm, &gu.narrow(1, 0, f)?, &gu.narrow(1, f, f)?)?;
        Tensor::cat(&[dg, du], 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::{assert_close, check as gradcheck, random};
    use candle_core::{DType, Device};

    #[test]
    fn fused_kernels_match_the_reference_and_finite_differences() -> Result<()> {
        let dev = Device::Cpu;
        let gu = (random(&[40, 18], 1, &dev)? * 6.0)?;
        let dm = random(&[40, 9], 2, &dev)?;
        let (m_ref, d_ref) = (reference::forward(&gu)?, reference::backward(&dm, &gu)?);
        for (dt, tol) in [(DType::F64, 1e-12), (DType::F32, 2e-6)] {
            assert_close(&forward(&gu.to_dtype(dt)?)?, &m_ref, tol)?;
            assert_close(&backward(&dm.to_dtype(dt)?, &gu.to_dtype(dt)?)?, &d_ref, tol)?;
        }
        let (gu, dm) = (random(&[3, 8], 3, &dev)?, random(&[3, 4], 4, &dev)?);
        gradcheck(|t: &[Tensor]| forward(&t[0]), std::slice::from_ref(&gu), &dm, &[backward(&dm, &gu)?])?;
        assert!(forward(&random(&[2, 3], 5, &dev)?).is_err());
        assert!(backward(&random(&[2, 3], 5, &dev)?, &gu).is_err());
        Ok(())
    }
}
