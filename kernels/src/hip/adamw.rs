//! The fused AdamW update (`adamw_*` in `cuda/elementwise.cu`): torch's single-tensor
//! arithmetic in one pass over parameter, gradient and the f32 moments.

use super::module::{ELEMENTWISE, args, grid_stride, launch};
use super::{DeviceBuffer, Elem, HipDevice, Result, same_len};
use crate::adamw::Coefficients;

/// One update: returns the new `(p, m, v)`; `decay` applies the weight decay to `p`.
pub fn step<T: Elem>(
    dev: &HipDevice,
    k: &Coefficients,
    decay: bool,
    p: &DeviceBuffer<T>,
    g: &DeviceBuffer<T>,
    m: &DeviceBuffer<f32>,
    v: &DeviceBuffer<f32>,
) -> Result<(DeviceBuffer<T>, DeviceBuffer<f32>, DeviceBuffer<f32>)> {
    let n = p.len();
    for (what, len) in [("the gradient", g.len()), ("m", m.len()), ("v", v.len())] {
        same_len("adamw", what, len, n)?;
    }
    let (mut p_out, mut m_out, mut v_out) = (dev.alloc::<T>(n)?, dev.alloc::<f32>(n)?, dev.alloc::<f32>(n)?);
    let mut args = args![
        p,
        g,
        m,
        v,
        &mut p_out,
        &mut m_out,
        &mut v_out,
        n,
        decay as i32,
        k.decay,
        k.lerp_weight,
        k.beta2,
        k.one_minus_beta2,
        k.bias_correction2_sqrt,
        k.eps,
        k.neg_step_size,
    ];
    launch(dev, &ELEMENTWISE, &T::kernel("adamw"), grid_stride(n), &mut args)?;
    Ok((p_out, m_out, v_out))
}
