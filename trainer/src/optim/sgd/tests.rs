use std::collections::{BTreeMap, HashMap};

use candle_core::Device;

use super::*;
use crate::optim::test_inputs::{Reference, follow};

/// torch's SGD in f64.
struct TorchSgd {
    c: SgdConfig,
    buffers: HashMap<String, Vec<f64>>,
}

impl Reference for TorchSgd {
    fn update(&mut self, name: &str, _dims: &[usize], _step: u64, lr: f64, decays: bool, p: &mut [f64], g: &[f64]) {
        let buf = self.buffers.entry(name.to_string()).or_insert_with(|| vec![0.0; p.len()]);
        for i in 0..p.len() {
            let mut d = g[i];
            if decays {
                d += self.c.weight_decay * p[i];
            }
            if self.c.momentum != 0.0 {
                buf[i] = self.c.momentum * buf[i] + d;
                d = buf[i];
            }
            p[i] -= lr * d;
        }
    }
}

#[test]
fn follows_torch_s_formula_with_and_without_momentum_and_weight_decay() {
    for momentum in [0.0, 0.9] {
        for weight_decay in [0.0, 0.1] {
            let c = SgdConfig { momentum, weight_decay };
            follow(c, &mut TorchSgd { c, buffers: HashMap::new() }, 3, 1e-5);
        }
    }
}

#[test]
fn momentum_keeps_a_buffer_and_no_momentum_keeps_none() {
    let mut params = BTreeMap::from([("w".to_string(), Tensor::new(&[[1.0f32, 2.0]], &Device::Cpu).unwrap())]);
    let grads = BTreeMap::from([("w".to_string(), Tensor::new(&[[0.5f32, -1.0]], &Device::Cpu).unwrap())]);
    let mut plain = Sgd::new(SgdConfig { momentum: 0.0, weight_decay: 0.0 });
    plain.step(&mut params.clone(), &grads, 0.1).unwrap();
    assert_eq!(plain.state_tensors().unwrap().keys().collect::<Vec<_>>(), ["step"]);
    let mut heavy = Sgd::new(SgdConfig { momentum: 0.9, weight_decay: 0.0 });
    heavy.step(&mut params, &grads, 0.1).unwrap();
    heavy.step(&mut params, &grads, 0.1).unwrap();
    assert_eq!(heavy.state_tensors().unwrap().keys().collect::<Vec<_>>(), ["momentum_buffer.w", "step"]);
    // Two steps of the same gradient: buf = g, then 0.9 g + g.
    let want = [1.0 - 0.1 * 0.5 * 2.9, 2.0 + 0.1 * 2.9];
    for (got, want) in crate::optim::test_inputs::values(&params["w"]).iter().zip(want) {
        assert!((f64::from(*got) - want).abs() < 1e-6, "{got} vs {want}");
    }
}
