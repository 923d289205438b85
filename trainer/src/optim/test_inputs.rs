//! What the optimizers' tests share: seeded random parameters and gradients of the shapes runs
//! train (a projection's matrix, a norm's vector, a 3-D expert weight), and a driver that steps
//! an optimizer and an f64 reference of its formula side by side.

use std::collections::BTreeMap;

use candle_core::{DType, Device, Tensor};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::SeedableRng;

use super::decays;
use super::stateful::{Stateful, UpdateRule};

/// Parameters by name and shape: rank 3 and 2 decay and (Adafactor) factor, rank 1 does neither.
pub const SHAPES: [(&str, &[usize]); 3] = [("experts", &[2, 3, 4]), ("norm", &[6]), ("proj", &[5, 7])];

/// Updates the drivers take.
pub const STEPS: u64 = 8;

/// An optimizer's formula in f64, one parameter at a time; it keeps its own state by name.
pub trait Reference {
    #[allow(clippy::too_many_arguments)]
    fn update(&mut self, name: &str, dims: &[usize], step: u64, lr: f64, decays: bool, p: &mut [f64], g: &[f64]);
}

pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// `n` values uniform in `(-scale, scale)`.
pub fn uniform(rng: &mut ChaCha8Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-scale..scale)).collect()
}

pub fn tensor(values: &[f32], dims: &[usize]) -> Tensor {
    Tensor::from_slice(values, dims, &Device::Cpu).unwrap()
}

pub fn values(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap()
}

/// Random parameters of [`SHAPES`].
pub fn params(rng: &mut ChaCha8Rng) -> BTreeMap<String, Tensor> {
    SHAPES.iter().map(|(n, d)| (n.to_string(), tensor(&uniform(rng, d.iter().product(), 1.0), d))).collect()
}

/// Random gradients for `params`, at a scale that changes from step to step (so that an
/// update can be larger than the ones before it, which Adafactor clips).
pub fn grads(rng: &mut ChaCha8Rng, params: &BTreeMap<String, Tensor>, step: u64) -> BTreeMap<String, Tensor> {
    let scale = [0.3f32, 2.0, 0.05, 1.0, 4.0, 0.5, 0.1, 1.5][(step as usize - 1) % 8];
    params.iter().map(|(n, p)| (n.clone(), tensor(&uniform(rng, p.elem_count(), scale), p.dims()))).collect()
}

/// The learning rate of update `step`: a changing one, as a schedule gives.
pub fn lr(step: u64) -> f64 {
    1e-2 * (1.0 + step as f64 / 4.0)
}

/// Steps an optimizer with `rule` and `reference` [`STEPS`] times from the same random
/// parameters and gradients: every f32 parameter must stay within `tol` of the f64 one, relative
/// to `max(1, |p|)` (f32 rounds each operation to 6e-8 relative; a few of them per update, over
/// a few updates, stay far below the 1e-5 the tests allow, while a term of the formula left out
/// or misweighted moves a parameter by at least `lr · weight_decay · |p|` ≈ 1e-3).
pub fn follow<R: UpdateRule>(rule: R, reference: &mut impl Reference, seed: u64, tol: f64) {
    let mut rng = rng(seed);
    let mut ours = params(&mut rng);
    let mut theirs: BTreeMap<String, Vec<f64>> =
        ours.iter().map(|(n, t)| (n.clone(), values(t).into_iter().map(f64::from).collect())).collect();
    let mut optimizer = Stateful::new(rule.clone());
    for step in 1..=STEPS {
        let g = grads(&mut rng, &ours, step);
        optimizer.step(&mut ours, &g, lr(step)).unwrap();
        for (name, p) in theirs.iter_mut() {
            let dims = ours[name].dims();
            let g: Vec<f64> = values(&g[name]).into_iter().map(f64::from).collect();
            reference.update(name, dims, step, lr(step), decays(dims), p, &g);
        }
    }
    for (name, want) in &theirs {
        for (i, (got, want)) in values(&ours[name]).iter().zip(want).enumerate() {
            let err = (f64::from(*got) - want).abs() / want.abs().max(1.0);
            assert!(err <= tol, "{rule:?}: {name}[{i}] is {got}, the f64 formula gives {want} (error {err:e})");
        }
    }
}
