use candle_core::DType;

use super::*;
use crate::optim::test_inputs::{STEPS, grads, lr, params, rng, tensor, values};

fn recipe(name: OptimizerName) -> OptimizerRecipe {
    OptimizerRecipe { name, betas: [0.8, 0.97], eps: 1e-6, weight_decay: 0.05, ..OptimizerRecipe::default() }
}

const BUILT: [OptimizerName; 4] =
    [OptimizerName::AdamW, OptimizerName::Sgd, OptimizerName::Lion, OptimizerName::Adafactor];

#[test]
fn each_name_builds_its_optimizer_from_the_fields_it_reads() {
    let o = |name| Optimizer::from_recipe(&recipe(name)).unwrap();
    let want_adamw = AdamWConfig { betas: [0.8, 0.97], eps: 1e-6, weight_decay: 0.05 };
    assert!(matches!(o(OptimizerName::AdamW), Optimizer::AdamW(a) if *a.config() == want_adamw));
    let want_sgd = SgdConfig { momentum: 0.8, weight_decay: 0.05 };
    assert!(matches!(o(OptimizerName::Sgd), Optimizer::Sgd(s) if *s.config() == want_sgd));
    let want_lion = LionConfig { betas: [0.8, 0.97], weight_decay: 0.05 };
    assert!(matches!(o(OptimizerName::Lion), Optimizer::Lion(l) if *l.config() == want_lion));
    let want_adafactor = AdafactorConfig { beta1: Some(0.8), eps: 1e-6, weight_decay: 0.05 };
    assert!(matches!(o(OptimizerName::Adafactor), Optimizer::Adafactor(a) if *a.config() == want_adafactor));
    let no_beta1 = OptimizerRecipe { betas: [0.0, 0.95], ..recipe(OptimizerName::Adafactor) };
    assert!(
        matches!(Optimizer::from_recipe(&no_beta1).unwrap(), Optimizer::Adafactor(a) if a.config().beta1.is_none())
    );
    for name in BUILT {
        assert_eq!(serde_json::to_value(name).unwrap(), o(name).name(), "checkpoints record the recipe's name");
    }
}

#[test]
fn adamw_8bit_is_refused_naming_what_works() {
    let err = Optimizer::from_recipe(&recipe(OptimizerName::AdamW8bit)).unwrap_err();
    assert!(matches!(err, OptimError::AdamW8bitNotBuilt), "{err}");
    assert!(err.to_string().contains("use adamw, lion, adafactor or sgd"), "{err}");
}

/// Every optimizer saved after one update and restored continues bit for bit as if never
/// stopped, and the four give four different results.
#[test]
fn every_optimizer_resumes_bit_for_bit_and_each_steps_its_own_way() {
    let mut finals = Vec::new();
    for name in BUILT {
        let r = recipe(name);
        let mut inputs = rng(11);
        let start = params(&mut inputs);
        let g: Vec<_> = (1..=STEPS).map(|s| grads(&mut inputs, &start, s)).collect();

        let mut straight = start.clone();
        let mut whole = Optimizer::from_recipe(&r).unwrap();
        for (s, g) in (1..=STEPS).zip(&g) {
            whole.step(&mut straight, g, lr(s)).unwrap();
        }

        let mut resumed = start.clone();
        let mut first = Optimizer::from_recipe(&r).unwrap();
        for (s, g) in (1..=3).zip(&g) {
            first.step(&mut resumed, g, lr(s)).unwrap();
        }
        let mut second = Optimizer::restore(&r, first.name(), &first.state_tensors().unwrap()).unwrap();
        assert_eq!(second, first, "{name:?}: restored state");
        for (s, g) in (4..=STEPS).zip(&g[3..]) {
            second.step(&mut resumed, g, lr(s)).unwrap();
        }
        assert_eq!(second.step_count(), STEPS);
        for (n, t) in &straight {
            assert_eq!(values(t), values(&resumed[n]), "{name:?}: {n} after a resume");
        }
        finals.push(values(&straight["proj"]));
    }
    for i in 0..finals.len() {
        for j in i + 1..finals.len() {
            assert_ne!(finals[i], finals[j], "{:?} and {:?} gave the same weights", BUILT[i], BUILT[j]);
        }
    }
}

#[test]
fn a_checkpoint_of_another_optimizer_is_refused_naming_both() {
    let mut lion = Optimizer::from_recipe(&recipe(OptimizerName::Lion)).unwrap();
    let mut inputs = rng(2);
    let mut p = params(&mut inputs);
    let g = grads(&mut inputs, &p, 1);
    lion.step(&mut p, &g, 0.01).unwrap();
    let state = lion.state_tensors().unwrap();
    // AdamW's exp_avg has Lion's name: only the recorded name tells them apart.
    let err = Optimizer::restore(&recipe(OptimizerName::AdamW), "lion", &state).unwrap_err();
    assert!(matches!(&err, OptimError::OtherOptimizer { saved, recipe } if saved == "lion" && recipe == "adamw"));
    let text = err.to_string();
    assert!(text.contains("state of lion") && text.contains("train.optimizer.name is adamw"), "{text}");
    // Another optimizer's buffers under this one's name are refused too.
    assert!(Optimizer::restore(&recipe(OptimizerName::Sgd), "sgd", &state).is_err());
}

#[test]
fn bf16_parameters_keep_their_dtype_under_every_optimizer() {
    for name in BUILT {
        let mut o = Optimizer::from_recipe(&recipe(name)).unwrap();
        let w = tensor(&[1.0, 2.0, -1.0, 0.5], &[2, 2]).to_dtype(DType::BF16).unwrap();
        let mut params = BTreeMap::from([("w".to_string(), w)]);
        let grads = BTreeMap::from([("w".to_string(), tensor(&[1.0, -1.0, 0.5, 2.0], &[2, 2]))]);
        o.step(&mut params, &grads, 0.1).unwrap();
        assert_eq!(params["w"].dtype(), DType::BF16, "{name:?}");
        assert_ne!(values(&params["w"]), [1.0, 2.0, -1.0, 0.5], "{name:?} did not move the weights");
    }
}
