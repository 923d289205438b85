use std::collections::{BTreeMap, HashMap};

use candle_core::Device;

use super::*;
use crate::optim::test_inputs::{Reference, follow, values};

/// transformers' Adafactor (scale_parameter=False, relative_step=False) in f64. A parameter of
/// rank ≥ 2 is `outer` matrices of `rows × cols`.
struct TransformersAdafactor {
    c: AdafactorConfig,
    exp_avg: HashMap<String, Vec<f64>>,
    /// `exp_avg_sq_row` and `exp_avg_sq_col`, or `exp_avg_sq` and nothing.
    second: HashMap<String, (Vec<f64>, Vec<f64>)>,
    /// Updates whose root-mean-square was clipped to 1.
    clipped: usize,
}

impl TransformersAdafactor {
    fn new(c: AdafactorConfig) -> Self {
        TransformersAdafactor { c, exp_avg: HashMap::new(), second: HashMap::new(), clipped: 0 }
    }
}

impl Reference for TransformersAdafactor {
    fn update(&mut self, name: &str, dims: &[usize], step: u64, lr: f64, decays: bool, p: &mut [f64], g: &[f64]) {
        let n = p.len();
        let beta2t = 1.0 - (step as f64).powf(-0.8);
        let sq: Vec<f64> = g.iter().map(|x| x * x + self.c.eps).collect();
        let mut update = vec![0.0; n];
        if dims.len() >= 2 {
            let cols = dims[dims.len() - 1];
            let rows = dims[dims.len() - 2];
            let outer = n / (rows * cols);
            let (row, col) = self
                .second
                .entry(name.to_string())
                .or_insert_with(|| (vec![0.0; outer * rows], vec![0.0; outer * cols]));
            let at = |o: usize, r: usize, c: usize| (o * rows + r) * cols + c;
            for o in 0..outer {
                for r in 0..rows {
                    let mean = (0..cols).map(|c| sq[at(o, r, c)]).sum::<f64>() / cols as f64;
                    row[o * rows + r] = beta2t * row[o * rows + r] + (1.0 - beta2t) * mean;
                }
                for c in 0..cols {
                    let mean = (0..rows).map(|r| sq[at(o, r, c)]).sum::<f64>() / rows as f64;
                    col[o * cols + c] = beta2t * col[o * cols + c] + (1.0 - beta2t) * mean;
                }
                let row_mean = row[o * rows..(o + 1) * rows].iter().sum::<f64>() / rows as f64;
                for r in 0..rows {
                    for c in 0..cols {
                        let r_factor = 1.0 / (row[o * rows + r] / row_mean).sqrt();
                        let c_factor = 1.0 / col[o * cols + c].sqrt();
                        update[at(o, r, c)] = r_factor * c_factor * g[at(o, r, c)];
                    }
                }
            }
        } else {
            let (v, _) = self.second.entry(name.to_string()).or_insert_with(|| (vec![0.0; n], Vec::new()));
            for i in 0..n {
                v[i] = beta2t * v[i] + (1.0 - beta2t) * sq[i];
                update[i] = g[i] / v[i].sqrt();
            }
        }
        let rms = (update.iter().map(|u| u * u).sum::<f64>() / n as f64).sqrt();
        if rms > 1.0 {
            self.clipped += 1;
        }
        let scale = lr / rms.max(1.0);
        update.iter_mut().for_each(|u| *u *= scale);
        if let Some(beta1) = self.c.beta1 {
            let m = self.exp_avg.entry(name.to_string()).or_insert_with(|| vec![0.0; n]);
            for i in 0..n {
                m[i] = beta1 * m[i] + (1.0 - beta1) * update[i];
                update[i] = m[i];
            }
        }
        for i in 0..n {
            if decays {
                p[i] -= self.c.weight_decay * lr * p[i];
            }
            p[i] -= update[i];
        }
    }
}

#[test]
fn follows_transformers_formula_with_and_without_beta1_and_weight_decay() {
    for beta1 in [None, Some(0.9)] {
        for weight_decay in [0.0, 0.1] {
            let c = AdafactorConfig { beta1, eps: 1e-8, weight_decay };
            let mut reference = TransformersAdafactor::new(c);
            follow(c, &mut reference, 7, 1e-5);
            assert!(reference.clipped > 0, "the inputs should exercise the update clipping");
        }
    }
    // A large eps dominates g²: the second moments, hence the updates, depend on it.
    let c = AdafactorConfig { beta1: None, eps: 0.5, weight_decay: 0.0 };
    follow(c, &mut TransformersAdafactor::new(c), 7, 1e-5);
}

#[test]
fn matrices_keep_factored_moments_and_vectors_whole_ones() {
    let c = AdafactorConfig { beta1: Some(0.9), eps: 1e-30, weight_decay: 0.0 };
    let shapes = |dims: &[usize]| c.buffers(dims).into_iter().collect::<Vec<_>>();
    assert_eq!(shapes(&[6]), [("exp_avg", vec![6]), ("exp_avg_sq", vec![6])]);
    assert_eq!(shapes(&[5, 7]), [("exp_avg", vec![5, 7]), ("exp_avg_sq_row", vec![5]), ("exp_avg_sq_col", vec![7])]);
    assert_eq!(
        shapes(&[2, 3, 4]),
        [("exp_avg", vec![2, 3, 4]), ("exp_avg_sq_row", vec![2, 3]), ("exp_avg_sq_col", vec![2, 4])]
    );
    let none = AdafactorConfig { beta1: None, ..c };
    assert_eq!(none.buffers(&[5, 7]).len(), 2, "no exp_avg without beta1");
}

#[test]
fn the_first_update_of_a_vector_is_lr_times_the_gradient_s_sign() {
    // Step 1: β2t = 0, so v = g² + eps and d = g / sqrt(g² + eps) ≈ sign(g), of rms ≤ 1.
    let c = AdafactorConfig { beta1: None, eps: 1e-30, weight_decay: 0.0 };
    let mut params = BTreeMap::from([("b".to_string(), Tensor::new(&[1.0f32, 1.0], &Device::Cpu).unwrap())]);
    let grads = BTreeMap::from([("b".to_string(), Tensor::new(&[4.0f32, -0.5], &Device::Cpu).unwrap())]);
    Adafactor::new(c).step(&mut params, &grads, 0.1).unwrap();
    assert_eq!(values(&params["b"]), [0.9, 1.1]);
}
