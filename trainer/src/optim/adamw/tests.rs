use std::collections::BTreeMap;

use candle_core::Device;

use super::*;

fn cpu(v: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_slice(v, shape, &Device::Cpu).unwrap()
}

fn values(t: &Tensor) -> Vec<f32> {
    to_f32_vec(t).unwrap()
}

fn config(weight_decay: f64) -> AdamWConfig {
    AdamWConfig { betas: [0.9, 0.95], eps: 1e-8, weight_decay }
}

/// The grads of the torch run below: step t (0-based).
fn torch_grads(t: usize) -> BTreeMap<String, Tensor> {
    let t = t as f32;
    let w: Vec<f32> = [0.1f32, -0.2, 0.3, 0.0]
        .iter()
        .zip([0.0f32, 0.05, -0.4, 0.01])
        .map(|(a, b)| a * (t + 1.0) + b * (t * t))
        .collect();
    let n: Vec<f32> = [0.5f32, -1.5].iter().map(|x| x / (t + 1.0)).collect();
    BTreeMap::from([("norm".to_string(), cpu(&n, &[2])), ("w".to_string(), cpu(&w, &[2, 2]))])
}

fn torch_params() -> BTreeMap<String, Tensor> {
    BTreeMap::from([
        ("norm".to_string(), cpu(&[1.0, 0.25], &[2])),
        ("w".to_string(), cpu(&[1.0, -2.0, 0.5, 3.0], &[2, 2])),
    ])
}

/// Three steps of torch 2.11 `AdamW(lr=1e-2, betas=(0.9, 0.95), eps=1e-8)` with weight decay
/// 0.1 on `w` and none on the 1-D `norm` (two param groups), same parameters and gradients:
/// the float32 bit patterns torch printed.
#[test]
fn three_steps_match_torch_bit_for_bit() {
    let mut params = torch_params();
    let mut opt = AdamW::new(config(0.1));
    for t in 0..3 {
        opt.step(&mut params, &torch_grads(t), 1e-2).unwrap();
    }
    let bits = |name: &str| values(&params[name]).iter().map(|x| x.to_bits() as i32).collect::<Vec<_>>();
    assert_eq!(bits("w"), [1064816475, -1074039325, 1056326813, 1077836511]);
    assert_eq!(bits("norm"), [1064878913, 1049524605]);
    assert_eq!(opt.step_count(), 3);
}

#[test]
fn first_step_is_sign_descent_after_decay() {
    // Step 1: m_hat = g and v_hat = g^2, so p <- p (1 - lr wd) - lr g / (|g| + eps).
    let (lr, wd) = (0.1, 0.01);
    let mut params = BTreeMap::from([("w".to_string(), cpu(&[1.0, -1.0, 2.0, 0.0], &[2, 2]))]);
    let grads = BTreeMap::from([("w".to_string(), cpu(&[0.5, -0.25, 0.0, 4.0], &[2, 2]))]);
    let mut opt = AdamW::new(config(wd));
    opt.step(&mut params, &grads, lr).unwrap();
    let got = values(&params["w"]);
    let want = [1.0 * 0.999 - 0.1 * 0.5 / (0.5 + 1e-8), -0.999 + 0.1, 2.0 * 0.999, -0.1 * 4.0 / (4.0 + 1e-8)];
    for (g, w) in got.iter().zip(want) {
        assert!((*g as f64 - w).abs() < 1e-6, "{got:?} vs {want:?}");
    }
}

#[test]
fn vectors_do_not_decay_matrices_do() {
    let zero_grad = |shape: &[usize]| cpu(&vec![0.0; shape.iter().product()], shape);
    let mut params =
        BTreeMap::from([("gain".to_string(), cpu(&[2.0, 2.0], &[2])), ("proj".to_string(), cpu(&[2.0, 2.0], &[1, 2]))]);
    let grads = BTreeMap::from([("gain".to_string(), zero_grad(&[2])), ("proj".to_string(), zero_grad(&[1, 2]))]);
    let mut opt = AdamW::new(config(0.5));
    opt.step(&mut params, &grads, 0.1).unwrap();
    assert_eq!(values(&params["gain"]), [2.0, 2.0]);
    assert_eq!(values(&params["proj"]), [2.0 * 0.95, 2.0 * 0.95]);
    assert!(!decays(&[7]) && decays(&[3, 4]));
}

/// Textbook AdamW in f64 over many steps: the f32 result stays within f32 rounding of it.
#[test]
fn many_steps_follow_the_f64_reference() {
    let c = config(0.05);
    let n = 64;
    let init: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.37).sin()).collect();
    let mut params = BTreeMap::from([("w".to_string(), cpu(&init, &[8, 8]))]);
    let mut opt = AdamW::new(c);
    let (mut p, mut m, mut v): (Vec<f64>, Vec<f64>, Vec<f64>) =
        (init.iter().map(|&x| x as f64).collect(), vec![0.0; n], vec![0.0; n]);
    for step in 1..=50u64 {
        let lr = 1e-3 * (1.0 + (step as f64) / 10.0);
        let g: Vec<f32> = (0..n).map(|i| ((i as f32) * 1.3 + step as f32).cos() * 0.1).collect();
        opt.step(&mut params, &BTreeMap::from([("w".to_string(), cpu(&g, &[8, 8]))]), lr).unwrap();
        let [b1, b2] = c.betas;
        for i in 0..n {
            let gi = g[i] as f64;
            p[i] *= 1.0 - lr * c.weight_decay;
            m[i] = b1 * m[i] + (1.0 - b1) * gi;
            v[i] = b2 * v[i] + (1.0 - b2) * gi * gi;
            let m_hat = m[i] / (1.0 - b1.powi(step as i32));
            let v_hat = v[i] / (1.0 - b2.powi(step as i32));
            p[i] -= lr * m_hat / (v_hat.sqrt() + c.eps);
        }
    }
    for (got, want) in values(&params["w"]).iter().zip(&p) {
        assert!((*got as f64 - want).abs() < 2e-5, "{got} vs {want}");
    }
}

#[test]
fn state_round_trip_resumes_bit_for_bit() {
    let mut straight = torch_params();
    let mut opt = AdamW::new(config(0.1));
    for t in 0..3 {
        opt.step(&mut straight, &torch_grads(t), 1e-2).unwrap();
    }

    let mut resumed = torch_params();
    let mut first = AdamW::new(config(0.1));
    first.step(&mut resumed, &torch_grads(0), 1e-2).unwrap();
    let state = first.state_tensors().unwrap();
    assert_eq!(
        state.keys().collect::<Vec<_>>(),
        ["exp_avg.norm", "exp_avg.w", "exp_avg_sq.norm", "exp_avg_sq.w", "step"]
    );
    let mut second = AdamW::from_state_tensors(config(0.1), &state).unwrap();
    assert_eq!(second, first);
    for t in 1..3 {
        second.step(&mut resumed, &torch_grads(t), 1e-2).unwrap();
    }
    for name in ["w", "norm"] {
        assert_eq!(values(&straight[name]), values(&resumed[name]));
    }
}

#[test]
fn bad_state_is_rejected() {
    let mut opt = AdamW::new(config(0.1));
    let mut params = torch_params();
    opt.step(&mut params, &torch_grads(0), 1e-2).unwrap();
    let full = opt.state_tensors().unwrap();
    for drop in ["step", "exp_avg.w", "exp_avg_sq.norm"] {
        let mut s = full.clone();
        s.remove(drop);
        assert!(AdamW::from_state_tensors(config(0.1), &s).is_err(), "accepted state without {drop}");
    }
    let mut s = full.clone();
    s.insert("momentum.w".into(), cpu(&[0.0], &[1]));
    assert!(AdamW::from_state_tensors(config(0.1), &s).is_err());
}

#[test]
fn gradients_must_match_parameters() {
    let mut opt = AdamW::new(config(0.0));
    let mut params = torch_params();
    let mut grads = torch_grads(0);
    grads.remove("norm");
    assert!(matches!(opt.step(&mut params, &grads, 1e-2), Err(OptimError::MissingGrad(n)) if n == "norm"));
    let mut grads = torch_grads(0);
    grads.insert("w".into(), cpu(&[0.0; 4], &[4]));
    assert!(matches!(opt.step(&mut params, &grads, 1e-2), Err(OptimError::ShapeMismatch { .. })));
    let mut grads = torch_grads(0);
    grads.insert("ghost".into(), cpu(&[0.0], &[1]));
    assert!(matches!(opt.step(&mut params, &grads, 1e-2), Err(OptimError::State(_))));
    assert_eq!(opt.step_count(), 0, "a rejected step must not advance the count");
}

#[test]
fn bf16_parameters_keep_their_dtype() {
    let mut params = BTreeMap::from([("w".to_string(), cpu(&[1.0, 2.0], &[1, 2]).to_dtype(DType::BF16).unwrap())]);
    let grads = BTreeMap::from([("w".to_string(), cpu(&[1.0, -1.0], &[1, 2]))]);
    AdamW::new(config(0.0)).step(&mut params, &grads, 0.5).unwrap();
    assert_eq!(params["w"].dtype(), DType::BF16);
    assert_eq!(values(&params["w"]), [0.5, 2.5]);
}
