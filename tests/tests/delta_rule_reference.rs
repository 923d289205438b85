//! Our Gated DeltaNet kernels (`mindxtrain_kernels::{delta_rule, l2norm, causal_conv1d,
//! gated_rmsnorm, delta_gates}`) against transformers' own code for Qwen3.5/3.6 on the same
//! random inputs, gradients by torch autograd (tests/python/delta_rule_check.py): its rule,
//! conv and gated norm functions one by one, then a whole `Qwen3_5GatedDeltaNet` against the
//! layer composed from our kernels. The check that the state's orientation, the l2norm's eps,
//! q's scaling, the conv's taps and state, the gates and the gated norm's gain are
//! transformers'. One interpreter runs every check (importing torch costs seconds on 2 cores);
//! each test asserts its own. The inputs are drawn from a new seed each run, named in every
//! failure.
//!
//! Tolerance: both sides compute in f32 (transformers upcasts to it), in different orders (the
//! chunked rule solves triangular systems), so they part by rounding: measured, the functions
//! under 5e-7 of each tensor's norm, the whole layer up to about 1e-5 (its per-head parameter
//! gradients are sums over every token that partly cancel). 1e-4 leaves room, while every error
//! these checks exist for moves a result by far more: a transposed state or a missing scale is
//! O(1), and dropping the l2norm's or the gated norm's eps moves results of the rows drawn short
//! (|x|² about 3e-6 against eps 1e-6) by 2e-2 of dβ's norm and 2e-1 of the norm gain's.
//!
//! Needs the CPU torch venv of `scripts/setup-torch`; skips without it unless
//! MINDXTRAIN_REQUIRE_TORCH is set.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

use candle_core::{DType, Device, Tensor};
use mindxtrain_kernels::attention::Mask;
use mindxtrain_kernels::gradcheck::{fresh_seed, random};
use mindxtrain_kernels::{KernelConfig, causal_conv1d, delta_gates, delta_rule, gated_rmsnorm, l2norm, linear};
use serde_json::{Value, json};

const TOLERANCE: f64 = 1e-4;
/// transformers' l2norm eps (fixed in its code) and Qwen3.5's `rms_norm_eps`.
const EPS: f64 = 1e-6;
/// Token whose q and k rows are drawn short, where the l2norm's eps matters.
const SHORT: usize = 5;

type Tensors = BTreeMap<String, Tensor>;

fn to_json(t: &Tensor) -> Value {
    let values: Vec<f32> = t.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap();
    json!({"shape": t.dims(), "values": values})
}

fn from_json(v: &Value) -> Tensor {
    let shape: Vec<usize> = serde_json::from_value(v["shape"].clone()).unwrap();
    let values: Vec<f32> = serde_json::from_value(v["values"].clone()).unwrap();
    Tensor::from_vec(values, shape, &Device::Cpu).unwrap()
}

/// Draws f32 tensors, uniform in ±`scale`, each from its own offset of the run's seed.
struct Draw {
    seed: u64,
    n: u64,
}

impl Draw {
    fn next(&mut self, shape: &[usize], scale: f64) -> Tensor {
        self.n += 1;
        (random(shape, self.seed.wrapping_add(self.n), &Device::Cpu).unwrap() * scale)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
    }

    /// The delta rule's operands: q, k `[B, T, Hk, dk]` with token `SHORT` drawn short,
    /// v `[B, T, H, dv]`, β in (0.05, 0.95), g in (−0.5, 0).
    fn delta(&mut self, b: usize, t: usize, (hk, h): (usize, usize), (dk, dv): (usize, usize)) -> Value {
        let short: Vec<f32> = (0..t).map(|i| if i == SHORT { 1e-3 } else { 1.0 }).collect();
        let short = Tensor::from_vec(short, (1, t, 1, 1), &Device::Cpu).unwrap();
        let mut qk = || self.next(&[b, t, hk, dk], 1.0).broadcast_mul(&short).unwrap();
        let (q, k) = (qk(), qk());
        let beta = (self.next(&[b, t, h], 3.0).neg().unwrap().exp().unwrap() + 1.0).unwrap().recip().unwrap();
        let g = self.next(&[b, t, h], 0.25).affine(1.0, -0.25).unwrap();
        json!({
            "q": to_json(&q), "k": to_json(&k), "v": to_json(&self.next(&[b, t, h, dv], 1.0)),
            "beta": to_json(&beta), "g": to_json(&g), "dout": to_json(&self.next(&[b, t, h, dv], 1.0)),
            "s0": to_json(&self.next(&[b, h, dk, dv], 1.0)), "dstate": to_json(&self.next(&[b, h, dk, dv], 1.0)),
        })
    }
}

fn cases(seed: u64) -> Value {
    let mut d = Draw { seed, n: 0 };
    // GQA (two value heads per key head); 80 tokens: past one 64-token chunk on both sides.
    let delta = d.delta(2, 80, (2, 4), (8, 6));
    let mut packed = d.delta(1, 75, (1, 2), (4, 4));
    packed["lens"] = json!([9, 64, 2]);
    let (c, w) = (10, 4);
    let conv = json!({"x": to_json(&d.next(&[2, 12, c], 2.0)), "w": to_json(&d.next(&[c, w], 1.0)),
        "bias": to_json(&d.next(&[c], 1.0)), "dy": to_json(&d.next(&[2, 12, c], 1.0))});
    let conv_packed = json!({"x": to_json(&d.next(&[1, 13, c], 2.0)), "w": to_json(&d.next(&[c, w], 1.0)),
        "dy": to_json(&d.next(&[1, 13, c], 1.0)), "lens": [2, 5, 6]});
    let conv_decode = json!({"x": to_json(&d.next(&[2, 6, c], 2.0)), "w": to_json(&d.next(&[c, w], 1.0)),
        "bias": to_json(&d.next(&[c], 1.0)), "s0": to_json(&d.next(&[2, c, w - 1], 2.0))});
    // [B, T, H, dv] as the layer norms it; the first token's rows short, where eps matters.
    let short =
        Tensor::from_vec([vec![1e-3f32; 4 * 6], vec![1.0; 4 * 4 * 6]].concat(), (1, 5, 4, 6), &Device::Cpu).unwrap();
    let gated_norm = json!({"x": to_json(&d.next(&[2, 5, 4, 6], 1.0).broadcast_mul(&short).unwrap()),
        "z": to_json(&d.next(&[2, 5, 4, 6], 3.0)), "w": to_json(&d.next(&[6], 1.0).affine(1.0, 1.0).unwrap()),
        "dy": to_json(&d.next(&[2, 5, 4, 6], 1.0)), "eps": EPS});
    json!({"delta": delta, "delta_packed": packed, "conv": conv, "conv_packed": conv_packed,
        "conv_decode": conv_decode, "gated_norm": gated_norm, "layer": d.layer()})
}

impl Draw {
    /// A whole Gated DeltaNet layer: hidden states `[2, 70, 12]` (past one chunk), GQA heads,
    /// every parameter drawn (projections scaled so their outputs are about unit size).
    fn layer(&mut self) -> Value {
        let (b, t, hidden, hk, h, dk, dv, width) = (2, 70, 12, 2, 4, 8, 6, 4);
        let conv = 2 * hk * dk + h * dv;
        let proj = 1.0 / (hidden as f64 / 3.0).sqrt();
        let mut v = json!({"hk": hk, "h": h, "dk": dk, "dv": dv, "width": width, "eps": EPS});
        let mut put = |name: &str, t: Tensor| v[name] = to_json(&t);
        put("hidden", self.next(&[b, t, hidden], 1.0));
        put("dout", self.next(&[b, t, hidden], 1.0));
        put("dt_bias", self.next(&[h], 1.0));
        put("A_log", self.next(&[h], 1.0));
        put("conv", self.next(&[conv, width], 1.0));
        put("norm", self.next(&[dv], 0.5).affine(1.0, 1.0).unwrap());
        put("in_proj_qkv", self.next(&[conv, hidden], proj));
        put("in_proj_z", self.next(&[h * dv, hidden], proj));
        put("in_proj_b", self.next(&[h, hidden], proj));
        put("in_proj_a", self.next(&[h, hidden], proj));
        put("out_proj", self.next(&[hidden, h * dv], 1.0 / (h as f64 * dv as f64 / 3.0).sqrt()));
        v
    }
}

struct Run {
    seed: u64,
    cases: Value,
    theirs: Value,
}

/// The inputs and transformers' results, or `None` without the venv.
fn run() -> Option<&'static Run> {
    static RUN: OnceLock<Option<Run>> = OnceLock::new();
    RUN.get_or_init(|| {
        let python = mindxtrain_tests::torch_python()?;
        let seed = fresh_seed();
        let cases = cases(seed);
        let work = tempfile::tempdir().unwrap();
        let (input, output) = (work.path().join("in.json"), work.path().join("out.json"));
        std::fs::write(&input, cases.to_string()).unwrap();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/delta_rule_check.py");
        let out = Command::new(python).arg(script).arg(&input).arg(&output).output().expect("run python");
        assert!(
            out.status.success(),
            "delta_rule_check.py failed (seed {seed}):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let theirs = serde_json::from_slice(&std::fs::read(&output).unwrap()).unwrap();
        Some(Run { seed, cases, theirs })
    })
    .as_ref()
}

/// Every tensor transformers gave for `check` against ours of the same name, by
/// ‖ours − theirs‖ / ‖theirs‖.
fn compare(run: &Run, check: &str, ours: &Tensors) {
    let theirs = run.theirs[check].as_object().unwrap_or_else(|| panic!("no results for {check}"));
    for (name, t) in theirs {
        let theirs = from_json(t);
        let ours = ours.get(name).unwrap_or_else(|| panic!("{check}: no {name} of ours"));
        assert_eq!(ours.dims(), theirs.dims(), "{check}: {name}'s shape (seed {})", run.seed);
        let flat = |t: &Tensor| t.to_dtype(DType::F64).unwrap().flatten_all().unwrap();
        let diff = (flat(ours) - flat(&theirs)).unwrap().sqr().unwrap().sum_all().unwrap().to_scalar::<f64>().unwrap();
        let norm = flat(&theirs).sqr().unwrap().sum_all().unwrap().to_scalar::<f64>().unwrap();
        let err = (diff / norm).sqrt();
        assert!(err <= TOLERANCE, "{check}: {name} is off by {err:e} of its norm (seed {})", run.seed);
        eprintln!("{check}: {name} within {err:.1e}");
    }
}

fn whole_rows(b: usize, t: usize) -> Mask {
    Mask::new(&vec![0; b * t], b, t).unwrap()
}

/// Ours as the layer runs it: l2norm of q and k, then the rule with scale 1/√d_k, back through
/// both; with the case's initial state and final-state gradient when `carry`.
fn our_delta(c: &Value, mask: &Mask, carry: bool) -> Tensors {
    let [q, k, v, beta, g, dout] = ["q", "k", "v", "beta", "g", "dout"].map(|n| from_json(&c[n]));
    let (s0, dstate) = (carry.then(|| from_json(&c["s0"])), carry.then(|| from_json(&c["dstate"])));
    let ((qn, rq), (kn, rk)) = (l2norm::forward(&q, EPS).unwrap(), l2norm::forward(&k, EPS).unwrap());
    let scale = 1.0 / (q.dim(3).unwrap() as f64).sqrt();
    let x = delta_rule::Operands { q: &qn, k: &kn, v: &v, beta: &beta, g: &g, scale };
    let f = delta_rule::forward(&x, s0.as_ref(), mask).unwrap();
    let gr = delta_rule::backward(&x, s0.as_ref(), mask, &f.checkpoints, &dout, dstate.as_ref()).unwrap();
    let mut ours = Tensors::from([
        ("out".into(), f.out),
        ("state".into(), f.state),
        ("dq".into(), l2norm::backward(&gr.dq, &q, &rq).unwrap()),
        ("dk".into(), l2norm::backward(&gr.dk, &k, &rk).unwrap()),
        ("dv".into(), gr.dv),
        ("dbeta".into(), gr.dbeta),
        ("dg".into(), gr.dg),
    ]);
    ours.extend(gr.dstate.map(|d| ("dstate".into(), d)));
    ours
}

fn packed_mask(c: &Value) -> Mask {
    let lens: Vec<usize> = serde_json::from_value(c["lens"].clone()).unwrap();
    let segs: Vec<u32> = lens.iter().enumerate().flat_map(|(i, &n)| vec![i as u32; n]).collect();
    Mask::new(&segs, 1, segs.len()).unwrap()
}

#[test]
fn delta_rule_is_transformers_chunked_and_recurrent_rule() {
    let Some(run) = run() else { return };
    let c = &run.cases["delta"];
    let ours = our_delta(c, &whole_rows(2, 80), true);
    compare(run, "delta_chunk", &ours);
    compare(run, "delta_recurrent", &ours);
}

#[test]
fn packed_documents_are_transformers_documents_run_alone() {
    let Some(run) = run() else { return };
    let c = &run.cases["delta_packed"];
    let ours = our_delta(c, &packed_mask(c), false);
    compare(run, "delta_packed_chunk", &ours);
    compare(run, "delta_packed_recurrent", &ours);
}

#[test]
fn causal_conv1d_is_transformers_causal_conv1d_fn() {
    let Some(run) = run() else { return };
    let c = &run.cases["conv"];
    let [x, w, bias, dy] = ["x", "w", "bias", "dy"].map(|n| from_json(&c[n]));
    let mask = whole_rows(2, 12);
    let (y, _) = causal_conv1d::forward(&x, &w, Some(&bias), None, &mask).unwrap();
    let g = causal_conv1d::backward(&dy, &x, &w, Some(&bias), None, &mask, None).unwrap();
    let ours = Tensors::from([
        ("y".into(), y),
        ("dx".into(), g.dx),
        ("dw".into(), g.dw),
        ("dbias".into(), g.dbias.expect("bias given")),
    ]);
    compare(run, "conv", &ours);
}

#[test]
fn packed_conv_rows_are_transformers_documents_run_alone() {
    let Some(run) = run() else { return };
    let c = &run.cases["conv_packed"];
    let [x, w, dy] = ["x", "w", "dy"].map(|n| from_json(&c[n]));
    let mask = packed_mask(c);
    let (y, _) = causal_conv1d::forward(&x, &w, None, None, &mask).unwrap();
    let g = causal_conv1d::backward(&dy, &x, &w, None, None, &mask, None).unwrap();
    compare(run, "conv_packed", &Tensors::from([("y".into(), y), ("dx".into(), g.dx), ("dw".into(), g.dw)]));
}

#[test]
fn conv_decode_steps_are_transformers_causal_conv1d_update() {
    let Some(run) = run() else { return };
    let c = &run.cases["conv_decode"];
    let [x, w, bias, mut state] = ["x", "w", "bias", "s0"].map(|n| from_json(&c[n]));
    let mut ys = Vec::new();
    for t in 0..x.dim(1).unwrap() {
        let (y, next) = causal_conv1d::step(&x.narrow(1, t, 1).unwrap(), &w, Some(&bias), &state).unwrap();
        ys.push(y);
        state = next;
    }
    compare(run, "conv_decode", &Tensors::from([("y".into(), Tensor::cat(&ys, 1).unwrap()), ("state".into(), state)]));
}

#[test]
fn gated_rmsnorm_is_transformers_qwen3_5_rmsnorm_gated() {
    let Some(run) = run() else { return };
    let c = &run.cases["gated_norm"];
    let [x, z, w, dy] = ["x", "z", "w", "dy"].map(|n| from_json(&c[n]));
    let (y, rstd) = gated_rmsnorm::forward(&x, &z, &w, EPS).unwrap();
    let (dx, dz, dw) = gated_rmsnorm::backward(&dy, &x, &z, &w, &rstd, true).unwrap();
    let ours = Tensors::from([
        ("y".into(), y),
        ("dx".into(), dx),
        ("dz".into(), dz),
        ("dw".into(), dw.expect("asked for dw")),
    ]);
    compare(run, "gated_norm", &ours);
}

/// `Qwen3_5GatedDeltaNet` composed from our kernels, forward then backward, as a decoder block
/// runs it: projections, conv over the q/k/v projection, split, l2norm, gates, the rule, the
/// gated norm per head, the output projection.
fn our_layer(c: &Value) -> Tensors {
    let n = |k: &str| c[k].as_u64().unwrap() as usize;
    let (hk, h, dk, dv) = (n("hk"), n("h"), n("dk"), n("dv"));
    let p = |k: &str| from_json(&c[k]);
    let (hs, dout, a_log, dt_bias, conv_w, norm_w) =
        (p("hidden"), p("dout"), p("A_log"), p("dt_bias"), p("conv"), p("norm"));
    let [w_qkv, w_z, w_b, w_a, w_out] = ["in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"].map(p);
    let (b, t, _) = hs.dims3().unwrap();
    let (cfg, mask, kd) = (KernelConfig::default(), whole_rows(b, t), hk * dk);
    let lin = |x: &Tensor, w: &Tensor| linear::forward(&cfg, x, w).unwrap();
    let (qkv, z, bp, ap) =
        (lin(&hs, &w_qkv), lin(&hs, &w_z).reshape((b, t, h, dv)).unwrap(), lin(&hs, &w_b), lin(&hs, &w_a));
    let (mixed, _) = causal_conv1d::forward(&qkv, &conv_w, None, None, &mask).unwrap();
    let part = |from: usize, len: usize, heads: usize, d: usize| {
        mixed.narrow(2, from, len).unwrap().contiguous().unwrap().reshape((b, t, heads, d)).unwrap()
    };
    let (q, k, v) = (part(0, kd, hk, dk), part(kd, kd, hk, dk), part(2 * kd, h * dv, h, dv));
    let ((qn, rq), (kn, rk)) = (l2norm::forward(&q, EPS).unwrap(), l2norm::forward(&k, EPS).unwrap());
    let (beta, g) = delta_gates::forward(&bp, &ap, &a_log, &dt_bias).unwrap();
    let x = delta_rule::Operands { q: &qn, k: &kn, v: &v, beta: &beta, g: &g, scale: 1.0 / (dk as f64).sqrt() };
    let f = delta_rule::forward(&x, None, &mask).unwrap();
    let (normed, rstd) = gated_rmsnorm::forward(&f.out, &z, &norm_w, EPS).unwrap();
    let normed = normed.reshape((b, t, h * dv)).unwrap();
    let out = lin(&normed, &w_out);

    let back = |dy: &Tensor, x: &Tensor, w: &Tensor| {
        let (dx, dw) = linear::backward(&cfg, dy, x, w, true).unwrap();
        (dx, dw.expect("asked for dw"))
    };
    let (dnormed, dw_out) = back(&dout, &normed, &w_out);
    let dnormed = dnormed.reshape((b, t, h, dv)).unwrap();
    let (dcore, dz, dnorm) = gated_rmsnorm::backward(&dnormed, &f.out, &z, &norm_w, &rstd, true).unwrap();
    let gr = delta_rule::backward(&x, None, &mask, &f.checkpoints, &dcore, None).unwrap();
    let gates = delta_gates::backward(&gr.dbeta, &gr.dg, &bp, &ap, &a_log, &dt_bias).unwrap();
    let (dq, dk_) = (l2norm::backward(&gr.dq, &q, &rq).unwrap(), l2norm::backward(&gr.dk, &k, &rk).unwrap());
    let flat = |t: &Tensor| t.reshape((b, t.dim(1).unwrap(), ())).unwrap();
    let dmixed = Tensor::cat(&[flat(&dq), flat(&dk_), flat(&gr.dv)], 2).unwrap();
    let cg = causal_conv1d::backward(&dmixed, &qkv, &conv_w, None, None, &mask, None).unwrap();
    let (dh_qkv, dw_qkv) = back(&cg.dx, &hs, &w_qkv);
    let (dh_z, dw_z) = back(&flat(&dz), &hs, &w_z);
    let (dh_b, dw_b) = back(&gates.db, &hs, &w_b);
    let (dh_a, dw_a) = back(&gates.da, &hs, &w_a);
    let dhidden = (((dh_qkv + dh_z).unwrap() + dh_b).unwrap() + dh_a).unwrap();
    Tensors::from([
        ("out".into(), out),
        ("dhidden".into(), dhidden),
        ("ddt_bias".into(), gates.ddt_bias),
        ("dA_log".into(), gates.da_log),
        ("dconv".into(), cg.dw),
        ("dnorm".into(), dnorm.expect("asked for dw")),
        ("din_proj_qkv".into(), dw_qkv),
        ("din_proj_z".into(), dw_z),
        ("din_proj_b".into(), dw_b),
        ("din_proj_a".into(), dw_a),
        ("dout_proj".into(), dw_out),
    ])
}

#[test]
fn a_layer_of_our_kernels_is_transformers_qwen3_5_gated_deltanet() {
    let Some(run) = run() else { return };
    compare(run, "layer", &our_layer(&run.cases["layer"]));
}
