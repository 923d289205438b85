use std::collections::{BTreeMap, HashMap};

use candle_core::Device;

use super::*;
use crate::optim::test_inputs::{Reference, follow};

/// lion-pytorch's update in f64.
struct LionPytorch {
    c: LionConfig,
    exp_avg: HashMap<String, Vec<f64>>,
}

impl Reference for LionPytorch {
    fn update(&mut self, name: &str, _dims: &[usize], _step: u64, lr: f64, decays: bool, p: &mut [f64], g: &[f64]) {
        let m = self.exp_avg.entry(name.to_string()).or_insert_with(|| vec![0.0; p.len()]);
        let [beta1, beta2] = self.c.betas;
        for i in 0..p.len() {
            if decays {
                p[i] *= 1.0 - lr * self.c.weight_decay;
            }
            let c = beta1 * m[i] + (1.0 - beta1) * g[i];
            p[i] -= lr
                * if c > 0.0 {
                    1.0
                } else if c < 0.0 {
                    -1.0
                } else {
                    0.0
                };
            m[i] = beta2 * m[i] + (1.0 - beta2) * g[i];
        }
    }
}

#[test]
fn follows_lion_pytorch_s_formula_with_and_without_weight_decay() {
    for betas in [[0.9, 0.99], [0.5, 0.9]] {
        for weight_decay in [0.0, 0.1] {
            let c = LionConfig { betas, weight_decay };
            follow(c, &mut LionPytorch { c, exp_avg: HashMap::new() }, 5, 1e-5);
        }
    }
}

#[test]
fn the_first_step_is_the_gradient_s_sign() {
    // m starts at 0: the direction is sign((1 − β1) g) = sign(g), whatever its size.
    let mut params = BTreeMap::from([("w".to_string(), Tensor::new(&[[1.0f32, 1.0, 1.0]], &Device::Cpu).unwrap())]);
    let grads = BTreeMap::from([("w".to_string(), Tensor::new(&[[3.0f32, -1e-3, 0.0]], &Device::Cpu).unwrap())]);
    Lion::new(LionConfig { betas: [0.9, 0.99], weight_decay: 0.0 }).step(&mut params, &grads, 0.25).unwrap();
    assert_eq!(crate::optim::test_inputs::values(&params["w"]), [0.75, 1.25, 1.0]);
}
