//! Every optimizer on a CUDA device against itself on the CPU: the same random parameters,
//! gradients and learning rates over several steps, with f32 parameters (the same f32
//! arithmetic: only the order of Adafactor's sums and the GPU's fused multiply-adds differ, an ulp
//! here and there) and with bf16 ones on both (the f32 update rounded to bf16 each step: within a
//! bf16 ulp or two). Needs a GPU: built with the `cuda` feature by scripts/build-gpu and run there
//! by scripts/gpu-test.

use std::collections::BTreeMap;

use candle_core::{DType, Device, Tensor};

use super::Optimizer;
use super::test_inputs::{STEPS, grads, lr, params, rng, values};
use crate::recipe::{Optimizer as OptimizerRecipe, OptimizerName};

fn on(device: &Device, dtype: DType, tensors: &BTreeMap<String, Tensor>) -> BTreeMap<String, Tensor> {
    tensors.iter().map(|(n, t)| (n.clone(), t.to_dtype(dtype).unwrap().to_device(device).unwrap())).collect()
}

/// The parameters after [`STEPS`] updates of `name` on `device`, with parameters of `dtype`.
fn trained(name: OptimizerName, device: &Device, dtype: DType) -> (BTreeMap<String, Tensor>, Optimizer) {
    let recipe = OptimizerRecipe { name, weight_decay: 0.1, ..OptimizerRecipe::default() };
    let mut optimizer = Optimizer::from_recipe(&recipe).unwrap();
    let mut inputs = rng(23);
    let start = params(&mut inputs);
    let mut p = on(device, dtype, &start);
    for step in 1..=STEPS {
        let g = on(device, dtype, &grads(&mut inputs, &start, step));
        optimizer.step(&mut p, &g, lr(step)).unwrap();
    }
    (p, optimizer)
}

#[test]
fn every_optimizer_steps_on_the_gpu_as_on_the_cpu() {
    let gpu = Device::new_cuda(0).expect("a CUDA device");
    for name in [OptimizerName::AdamW, OptimizerName::Sgd, OptimizerName::Lion, OptimizerName::Adafactor] {
        for (dtype, tol) in [(DType::F32, 1e-5), (DType::BF16, 1.6e-2)] {
            let (cpu, cpu_state) = trained(name, &Device::Cpu, dtype);
            let (dev, dev_state) = trained(name, &gpu, dtype);
            for (n, t) in &dev {
                assert!(t.device().is_cuda() && t.dtype() == dtype, "{name:?} {n} left the GPU or its dtype");
                for (i, (a, b)) in values(t).iter().zip(values(&cpu[n])).enumerate() {
                    let err = f64::from((a - b).abs()) / f64::from(b.abs()).max(1.0);
                    assert!(err <= tol, "{name:?} {dtype:?} {n}[{i}]: GPU {a}, CPU {b}");
                }
            }
            if dtype == DType::F32 {
                // The state comes back to the host with the names and shapes of the CPU's.
                let (a, b) = (dev_state.state_tensors().unwrap(), cpu_state.state_tensors().unwrap());
                let shapes = |s: &BTreeMap<String, Tensor>| {
                    s.iter().map(|(k, t)| (k.clone(), t.dims().to_vec())).collect::<Vec<_>>()
                };
                assert_eq!(shapes(&a), shapes(&b), "{name:?}");
            }
        }
    }
}
