use super::*;
use crate::optim::test_inputs::{grads, params, rng, tensor, values};
use crate::optim::{AdafactorConfig, SgdConfig};

fn adafactor() -> Stateful<AdafactorConfig> {
    Stateful::new(AdafactorConfig { beta1: Some(0.9), eps: 1e-30, weight_decay: 0.0 })
}

#[test]
fn state_tensors_name_each_buffer_and_parameter() {
    let mut inputs = rng(1);
    let mut p = params(&mut inputs);
    let g = grads(&mut inputs, &p, 1);
    let mut o = adafactor();
    o.step(&mut p, &g, 0.01).unwrap();
    let state = o.state_tensors().unwrap();
    let shapes: Vec<(&str, &[usize])> = state.iter().map(|(k, t)| (k.as_str(), t.dims())).collect();
    assert_eq!(
        shapes,
        [
            ("exp_avg.experts", &[2, 3, 4][..]),
            ("exp_avg.norm", &[6]),
            ("exp_avg.proj", &[5, 7]),
            ("exp_avg_sq.norm", &[6]),
            ("exp_avg_sq_col.experts", &[2, 4]),
            ("exp_avg_sq_col.proj", &[7]),
            ("exp_avg_sq_row.experts", &[2, 3]),
            ("exp_avg_sq_row.proj", &[5]),
            ("step", &[]),
        ]
    );
    for (name, t) in &p {
        let mut want: Vec<_> = o.state_shapes(name, t.dims());
        want.sort();
        let got: Vec<_> = state
            .iter()
            .filter(|(k, _)| state_parameter(k) == Some(name.as_str()))
            .map(|(k, t)| (k.clone(), t.dims().to_vec()))
            .collect();
        assert_eq!(got, want, "state_shapes names what state_tensors holds for {name}");
    }
    assert_eq!(state_parameter("exp_avg_sq_row.model.layers.0.w"), Some("model.layers.0.w"));
    assert_eq!(state_parameter("step"), None);
}

#[test]
fn state_missing_a_buffer_or_holding_a_stranger_is_refused() {
    let mut inputs = rng(1);
    let mut p = params(&mut inputs);
    let g = grads(&mut inputs, &p, 1);
    let mut o = adafactor();
    o.step(&mut p, &g, 0.01).unwrap();
    let full = o.state_tensors().unwrap();
    let rule = *o.config();
    assert_eq!(Stateful::from_state_tensors(rule, &full).unwrap(), o);
    for drop in ["step", "exp_avg.norm", "exp_avg_sq_col.proj", "exp_avg_sq_row.experts"] {
        let mut s = full.clone();
        s.remove(drop);
        assert!(Stateful::from_state_tensors(rule, &s).is_err(), "accepted state without {drop}");
    }
    for stranger in ["momentum_buffer.proj", "exp_avg_sq.proj", "loose"] {
        let mut s = full.clone();
        s.insert(stranger.into(), tensor(&[0.0], &[1]));
        assert!(Stateful::from_state_tensors(rule, &s).is_err(), "accepted state with {stranger}");
    }
    // Without momentum SGD keeps nothing: any buffer is a stranger.
    let mut s = BTreeMap::from([("step".to_string(), Tensor::new(1i64, &Device::Cpu).unwrap())]);
    s.insert("momentum_buffer.w".into(), tensor(&[0.0], &[1]));
    assert!(Stateful::from_state_tensors(SgdConfig { momentum: 0.0, weight_decay: 0.0 }, &s).is_err());
}

#[test]
fn restored_state_of_another_shape_is_refused_before_anything_moves() {
    let mut inputs = rng(1);
    let mut p = params(&mut inputs);
    let g = grads(&mut inputs, &p, 1);
    let mut o = adafactor();
    o.step(&mut p, &g, 0.01).unwrap();
    let mut state = o.state_tensors().unwrap();
    state.insert("exp_avg_sq_row.proj".into(), tensor(&[0.0; 4], &[4]));
    let mut restored = Stateful::from_state_tensors(*o.config(), &state).unwrap();
    let before = p.clone();
    let err = restored.step(&mut p, &g, 0.01).unwrap_err();
    assert!(err.to_string().contains("state of `proj`"), "{err}");
    assert_eq!(restored.step_count(), 1, "a refused step is not counted");
    for (n, t) in &before {
        assert_eq!(values(t), values(&p[n]), "{n} moved");
    }
}
