//! The fused AdamW update on the GPU (`adamw_*` in `cuda/elementwise.cu`).

use super::{Elem, Kernel, Module, PushKernelArg, alloc, device, grid_for, launch, module, tensor, with_views};
use crate::adamw::Coefficients;
use candle_core::{Result, Tensor};

const MODULE: Module = module!("elementwise");

pub(crate) fn step<T: Elem>(
    k: &Coefficients,
    decay: bool,
    p: &Tensor,
    g: &Tensor,
    m: &Tensor,
    v: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    let dev = device(p)?;
    let n = p.elem_count();
    let (mut p_out, mut m_out, mut v_out) = (alloc::<T>(&dev, n)?, alloc::<f32>(&dev, n)?, alloc::<f32>(&dev, n)?);
    let kernel = Kernel::new::<T>(&dev, &MODULE, "adamw")?;
    with_views::<T, _, 2>([p, g], |[pv, gv]| {
        with_views::<f32, _, 2>([m, v], |[mv, vv]| {
            let mut b = kernel.builder();
            let decay = decay as i32;
            b.arg(&pv).arg(&gv).arg(&mv).arg(&vv).arg(&mut p_out).arg(&mut m_out).arg(&mut v_out).arg(&n).arg(&decay);
            b.arg(&k.decay).arg(&k.lerp_weight).arg(&k.beta2).arg(&k.one_minus_beta2);
            b.arg(&k.bias_correction2_sqrt).arg(&k.eps).arg(&k.neg_step_size);
            launch(b, grid_for(n, 256))
        })
    })?;
    Ok((
        tensor(p_out, &dev, p.shape().clone()),
        tensor(m_out, &dev, m.shape().clone()),
        tensor(v_out, &dev, v.shape().clone()),
    ))
}
