//! Our SGD, Lion and Adafactor against the PyTorch ecosystem's on the same tensors: several steps
//! of `torch.optim.SGD`, transformers' `Adafactor` and lion-pytorch's update
//! (tests/python/optimizers.py) from the same parameters, gradients and learning rates, built
//! from the same `train.optimizer` fields as a recipe gives them.
//!
//! Tolerance: both sides compute in f32 with the same formula, operation for operation; they part
//! only where torch fuses a multiply and an add (its vectorised `add(alpha=)`) or sums in another
//! order (Adafactor's means and norm), an ulp (6e-8 relative) here and there: measured, the
//! parameters (of size about 1) agree to one ulp after these steps (Lion's exactly). 1e-6 leaves
//! room for another CPU's vector width, while a recipe field read wrongly moves a parameter by at
//! least `lr · weight_decay · |p|` = 1e-3 per step.
//!
//! Needs the CPU torch venv of `scripts/setup-torch`; skips without it unless
//! MINDXTRAIN_REQUIRE_TORCH is set.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use candle_core::{Device, Tensor};
use mindxtrain_trainer::optim::Optimizer;
use mindxtrain_trainer::recipe::{Optimizer as OptimizerRecipe, OptimizerName};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::SeedableRng;
use serde_json::{Value, json};

/// A projection, a norm's gain and a 3-D expert weight: factored and unfactored Adafactor
/// moments, parameters that decay and one that does not.
const SHAPES: [(&str, &[usize]); 3] = [("experts", &[2, 3, 4]), ("norm", &[6]), ("proj", &[5, 7])];
const STEPS: usize = 6;
const TOLERANCE: f64 = 1e-6;

/// Per step, each gradient's scale: larger and smaller than the steps before, so that
/// Adafactor's update clipping takes part.
const GRAD_SCALES: [f32; STEPS] = [0.3, 2.0, 0.05, 1.0, 4.0, 0.5];

struct Inputs {
    params: BTreeMap<String, Tensor>,
    steps: Vec<(f64, BTreeMap<String, Tensor>)>,
}

fn uniform(rng: &mut ChaCha8Rng, dims: &[usize], scale: f32) -> Tensor {
    let values: Vec<f32> = (0..dims.iter().product()).map(|_| rng.random_range(-scale..scale)).collect();
    Tensor::from_vec(values, dims, &Device::Cpu).unwrap()
}

fn inputs(seed: u64) -> Inputs {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let params = SHAPES.iter().map(|(n, d)| (n.to_string(), uniform(&mut rng, d, 1.0))).collect();
    let steps = GRAD_SCALES
        .iter()
        .enumerate()
        .map(|(i, scale)| {
            let lr = 1e-2 * (1.0 + i as f64 / 3.0);
            (lr, SHAPES.iter().map(|(n, d)| (n.to_string(), uniform(&mut rng, d, *scale))).collect())
        })
        .collect();
    Inputs { params, steps }
}

fn flat(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1().unwrap()
}

/// The recipe's `train.optimizer` and the Python side's description of the same optimizer.
fn cases() -> Vec<(OptimizerRecipe, Value)> {
    let recipe = |name, betas, eps, weight_decay| OptimizerRecipe {
        name,
        betas,
        eps,
        weight_decay,
        ..OptimizerRecipe::default()
    };
    vec![
        (
            recipe(OptimizerName::Sgd, [0.9, 0.95], 1e-8, 0.1),
            json!({"name": "sgd", "momentum": 0.9, "weight_decay": 0.1}),
        ),
        (
            recipe(OptimizerName::Sgd, [0.0, 0.95], 1e-8, 0.0),
            json!({"name": "sgd", "momentum": 0.0, "weight_decay": 0.0}),
        ),
        (
            recipe(OptimizerName::Lion, [0.9, 0.99], 1e-8, 0.1),
            json!({"name": "lion", "betas": [0.9, 0.99], "weight_decay": 0.1}),
        ),
        (
            recipe(OptimizerName::Lion, [0.5, 0.9], 1e-8, 0.0),
            json!({"name": "lion", "betas": [0.5, 0.9], "weight_decay": 0.0}),
        ),
        (
            recipe(OptimizerName::Adafactor, [0.9, 0.95], 1e-8, 0.1),
            json!({"name": "adafactor", "beta1": 0.9, "eps": 1e-8, "weight_decay": 0.1}),
        ),
        (
            recipe(OptimizerName::Adafactor, [0.0, 0.95], 1e-3, 0.0),
            json!({"name": "adafactor", "beta1": null, "eps": 1e-3, "weight_decay": 0.0}),
        ),
    ]
}

#[test]
fn sgd_lion_and_adafactor_step_as_torch_transformers_and_lion_pytorch_do() {
    let Some(python) = mindxtrain_tests::torch_python() else { return };
    let work = tempfile::tempdir().unwrap();
    let inputs = inputs(17);
    let cases = cases();
    let job = json!({
        "params": inputs.params.iter().map(|(n, t)| (n.clone(), json!({"shape": t.dims(), "values": flat(t)})))
            .collect::<serde_json::Map<_, _>>(),
        "steps": inputs.steps.iter().map(|(lr, grads)| json!({
            "lr": lr,
            "grads": grads.iter().map(|(n, g)| (n.clone(), json!(flat(g)))).collect::<serde_json::Map<_, _>>(),
        })).collect::<Vec<_>>(),
        "optimizers": cases.iter().map(|(_, py)| py.clone()).collect::<Vec<_>>(),
    });
    let (input, output) = (work.path().join("in.json"), work.path().join("out.json"));
    std::fs::write(&input, job.to_string()).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/optimizers.py");
    let out = Command::new(&python).arg(script).arg(&input).arg(&output).output().expect("run python");
    assert!(out.status.success(), "python failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let theirs: Vec<BTreeMap<String, Vec<f32>>> = serde_json::from_slice(&std::fs::read(&output).unwrap()).unwrap();
    assert_eq!(theirs.len(), cases.len());

    for ((recipe, described), theirs) in cases.iter().zip(&theirs) {
        let mut params = inputs.params.clone();
        let mut optimizer = Optimizer::from_recipe(recipe).unwrap();
        for (lr, grads) in &inputs.steps {
            optimizer.step(&mut params, grads, *lr).unwrap();
        }
        let mut moved = 0.0f64;
        for (name, t) in &params {
            for (i, (got, want)) in flat(t).iter().zip(&theirs[name]).enumerate() {
                let err = f64::from((got - want).abs()) / f64::from(want.abs()).max(1.0);
                assert!(err <= TOLERANCE, "{described}: {name}[{i}] is {got}, the reference's {want} (error {err:e})");
            }
            let start = flat(&inputs.params[name]);
            moved = flat(t).iter().zip(start).map(|(a, b)| f64::from((a - b).abs())).fold(moved, f64::max);
        }
        assert!(moved > 100.0 * TOLERANCE, "{described}: the parameters hardly moved ({moved:e})");
    }
}
