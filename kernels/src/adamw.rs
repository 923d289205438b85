//! The AdamW update, element by element, with `torch.optim.AdamW`'s arithmetic (single-tensor
//! path, f32): the CPU form below is the trainer's optimizer (bit-exact with torch, tested in
//! `trainer/src/optim/adamw/tests.rs`) and the referee of the fused GPU kernel, which updates
//! parameter and moments in one pass over device memory.

use candle_core::{DType, Result, Tensor};

use crate::on_gpu_or;

/// The per-step scalars, computed in f64 as Python computes them and rounded to f32 where
/// torch passes them to a float32 kernel.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Coefficients {
    /// `1 − lr·weight_decay`, applied to decaying parameters.
    pub decay: f32,
    pub lerp_weight: f32,
    pub beta2: f32,
    pub one_minus_beta2: f32,
    pub bias_correction2_sqrt: f32,
    pub eps: f32,
    pub neg_step_size: f32,
}

impl Coefficients {
    /// For update number `step` (1-based) with learning rate `lr`.
    pub fn new(betas: [f64; 2], eps: f64, weight_decay: f64, lr: f64, step: u64) -> Self {
        let [beta1, beta2] = betas;
        let step = step as f64;
        let bias_correction1 = 1.0 - beta1.powf(step);
        let bias_correction2 = 1.0 - beta2.powf(step);
        Coefficients {
            decay: (1.0 - lr * weight_decay) as f32,
            lerp_weight: (1.0 - beta1) as f32,
            beta2: beta2 as f32,
            one_minus_beta2: (1.0 - beta2) as f32,
            // Python's `x ** 0.5`, i.e. pow, not sqrt.
            bias_correction2_sqrt: bias_correction2.powf(0.5) as f32,
            eps: eps as f32,
            neg_step_size: (-(lr / bias_correction1)) as f32,
        }
    }
}

/// Updates `p`, `m` (exp_avg) and `v` (exp_avg_sq) in place from the gradient `g`.
pub fn update(k: &Coefficients, decay: bool, p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32]) {
    for i in 0..p.len() {
        if decay {
            p[i] *= k.decay; // param.mul_(1 - lr * weight_decay)
        }
        // exp_avg.lerp_(grad, 1 - beta1): ATen's two-sided lerp formula.
        let w = k.lerp_weight;
        m[i] = if w.abs() < 0.5 { m[i] + w * (g[i] - m[i]) } else { g[i] - (g[i] - m[i]) * (1.0 - w) };
        // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        v[i] *= k.beta2;
        v[i] += k.one_minus_beta2 * g[i] * g[i];
        // denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
        let denom = v[i].sqrt() / k.bias_correction2_sqrt + k.eps;
        // param.addcdiv_(exp_avg, denom, value=-step_size)
        p[i] += k.neg_step_size * m[i] / denom;
    }
}

/// One update of tensors: returns the new `(p, m, v)`. `p` and `g` share a dtype (f32 or, on
/// the GPU, bf16); the moments are f32. CUDA tensors take the fused kernel, others [`update`].
pub fn step(
    k: &Coefficients,
    decay: bool,
    p: &Tensor,
    g: &Tensor,
    m: &Tensor,
    v: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    let _profile = crate::profile::scope("adamw", p.device());
    let n = p.elem_count();
    if [g, m, v].iter().any(|t| t.elem_count() != n) || m.dtype() != DType::F32 || v.dtype() != DType::F32 {
        candle_core::bail!("adamw: parameter, gradient and f32 moments must have the same number of elements");
    }
    #[cfg(feature = "cuda")]
    use crate::gpu::adamw::step as gpu;
    on_gpu_or!([p, g], gpu(k, decay, p, g, m, v), host(k, decay, p, g, m, v))
}

fn host(
    k: &Coefficients,
    decay: bool,
    p: &Tensor,
    g: &Tensor,
    m: &Tensor,
    v: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    let flat = |t: &Tensor| t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>();
    let (mut pv, gv, mut mv, mut vv) = (flat(p)?, flat(g)?, flat(m)?, flat(v)?);
    update(k, decay, &mut pv, &gv, &mut mv, &mut vv);
    let dev = p.device();
    Ok((
        Tensor::from_vec(pv, p.shape(), dev)?.to_dtype(p.dtype())?,
        Tensor::from_vec(mv, m.shape(), dev)?,
        Tensor::from_vec(vv, v.shape(), dev)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::random;
    use candle_core::Device;

    /// Several steps through `step` follow an f64 evaluation of the same formulas.
    #[test]
    fn steps_follow_the_f64_formulas() -> Result<()> {
        let dev = Device::Cpu;
        let (betas, eps, wd, lr) = ([0.9, 0.999], 1e-8, 0.1, 1e-3);
        let mut p = random(&[8, 16], 1, &dev)?.to_dtype(DType::F32)?;
        let (mut m, mut v) = (p.zeros_like()?, p.zeros_like()?);
        let mut p64 = p.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
        let (mut m64, mut v64) = (vec![0f64; p64.len()], vec![0f64; p64.len()]);
        for t in 1..=5u64 {
            let g = random(&[8, 16], 10 + t, &dev)?.to_dtype(DType::F32)?;
            let k = Coefficients::new(betas, eps, wd, lr, t);
            (p, m, v) = step(&k, true, &p, &g, &m, &v)?;
            let g64 = g.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
            let (bc1, bc2) = (1.0 - 0.9f64.powi(t as i32), 1.0 - 0.999f64.powi(t as i32));
            for i in 0..p64.len() {
                p64[i] *= 1.0 - lr * wd;
                m64[i] = 0.9 * m64[i] + 0.1 * g64[i];
                v64[i] = 0.999 * v64[i] + 0.001 * g64[i] * g64[i];
                p64[i] -= lr / bc1 * m64[i] / (v64[i].sqrt() / bc2.sqrt() + eps);
            }
        }
        let got = p.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
        for (a, b) in got.iter().zip(&p64) {
            assert!((a - b).abs() <= 1e-6 * (1.0 + b.abs()), "{a} vs {b}");
        }
        assert!(step(&Coefficients::new(betas, eps, wd, lr, 1), true, &p, &random(&[3], 1, &dev)?, &m, &v).is_err());
        Ok(())
    }
}
