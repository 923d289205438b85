//! NF4 dequantisation on the GPU (`cuda/nf4.cu`).

use super::{Elem, Kernel, Module, PushKernelArg, alloc, device, grid_for, launch, module, tensor, with_views};
use crate::nf4::Nf4Weight;
use candle_core::{DType, Result, Tensor};

const MODULE: Module = module!("nf4");

pub(crate) fn dequantize_rows<T: Elem>(w: &Nf4Weight, r0: usize, n: usize) -> Result<Tensor> {
    let dev = device(&w.codes)?;
    let len = n * w.cols;
    let start = r0 * w.cols;
    let mut out = alloc::<T>(&dev, len)?;
    let k = Kernel::new::<T>(&dev, &MODULE, "nf4_dequant")?;
    let scales = w.scales.to_dtype(DType::F32)?;
    with_views::<u8, _, 1>([&w.codes], |[c]| {
        with_views::<f32, _, 1>([&scales], |[s]| {
            let mut b = k.builder();
            b.arg(&c).arg(&s).arg(&mut out).arg(&start).arg(&len);
            launch(b, grid_for(len, 256))
        })
    })?;
    Ok(tensor(out, &dev, (n, w.cols)))
}
