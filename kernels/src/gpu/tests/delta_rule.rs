//! The gated delta rule's CUDA kernels against the fused CPU kernel in f64 on the same (rounded)
//! inputs: every output and gradient, at shapes that cross the kernels' edges; decoding token by
//! token against one forward; and the time of a forward and backward at a Qwen3.6-27B layer.

use super::*;
use crate::attention::Mask;
use crate::delta_rule::case::{Case, beta_of, decay_of};
use crate::delta_rule::{self, Forward, Grads, Operands};

/// One case's operands on the GPU (in the dtype under test) and on the CPU (in f64, the same
/// values), with the output and state gradients.
struct Data {
    gpu: [Tensor; 5],
    cpu: [Tensor; 5],
    s0: (Tensor, Tensor),
    dout: (Tensor, Tensor),
    dstate: (Tensor, Tensor),
    scale: f64,
    seed: u64,
}

impl Data {
    fn new(c: Case, dtype: DType) -> Result<Data> {
        let mut inp = Inputs::new(dtype);
        let (qk, s, state) = (c.qk(), c.gates(), c.state());
        // Unit-norm q and k rows, as the model's l2norm gives them; β in (0, 1); g in (−0.2, 0),
        // so the state remembers across a chunk and a checkpoint carried wrong shows.
        let unit = |(gpu, cpu): (Tensor, Tensor)| -> Result<(Tensor, Tensor)> {
            let cpu = cpu.broadcast_div(&cpu.sqr()?.sum_keepdim(3)?.sqrt()?)?.to_dtype(dtype)?;
            Ok((cpu.to_device(gpu.device())?, cpu.to_dtype(DType::F64)?))
        };
        let map = |(gpu, cpu): (Tensor, Tensor), f: &dyn Fn(&Tensor) -> Result<Tensor>| -> Result<(Tensor, Tensor)> {
            let cpu = f(&cpu)?.to_dtype(dtype)?;
            Ok((cpu.to_device(gpu.device())?, cpu.to_dtype(DType::F64)?))
        };
        let (q, k) = (unit(inp.make(&qk, 1.0)?)?, unit(inp.make(&qk, 1.0)?)?);
        let v = inp.make(&c.v(), 1.0)?;
        let beta = map(inp.make(&s, 2.0)?, &beta_of)?;
        let g = map(inp.make(&s, 1.0)?, &decay_of)?;
        // States in f32 whatever the operands' dtype, as the op keeps them.
        let f32_pair = |cpu: Tensor| -> Result<(Tensor, Tensor)> {
            let g32 = cpu.to_dtype(DType::F32)?;
            Ok((g32.to_device(&super::gpu())?, g32.to_dtype(DType::F64)?))
        };
        let s0 = f32_pair(inp.make(&state, 1.0)?.1)?;
        let dstate = f32_pair(inp.make(&state, 1.0)?.1)?;
        let dout = inp.make(&c.v(), 1.0)?;
        let [q, k, v, beta, g] = [q, k, v, beta, g];
        Ok(Data {
            gpu: [q.0, k.0, v.0, beta.0, g.0],
            cpu: [q.1, k.1, v.1, beta.1, g.1],
            s0,
            dout,
            dstate,
            scale: c.scale(),
            seed: inp.seed,
        })
    }
}

fn ops(x: &[Tensor; 5], scale: f64) -> Operands<'_> {
    Operands { q: &x[0], k: &x[1], v: &x[2], beta: &x[3], g: &x[4], scale }
}

/// Row 0 holds three documents (one starting mid-chunk, one at the second chunk's first token
/// when the row is long enough), the other rows one each.
fn packed(c: Case) -> Result<Mask> {
    let ids: Vec<u32> = (0..c.b * c.t)
        .map(|i| if i < c.t { u32::from(i >= c.t / 4) + u32::from(i >= 64.min(c.t - 1)) } else { 9 })
        .collect();
    Mask::new(&ids, c.b, c.t)
}

fn grads_listed(g: &Grads) -> Vec<(&'static str, Tensor)> {
    let mut v = vec![("dq", g.dq.clone()), ("dk", g.dk.clone()), ("dv", g.dv.clone())];
    v.extend([("dbeta", g.dbeta.clone()), ("dg", g.dg.clone())]);
    v.extend(g.dstate.clone().map(|s| ("dstate", s)));
    v
}

fn forward_listed(f: &Forward) -> [(&'static str, Tensor); 3] {
    [("out", f.out.clone()), ("state", f.state.clone()), ("checkpoints", f.checkpoints.clone())]
}

/// Where a failed comparison is worst (NaN first) and how many elements are off, to say which
/// tokens, heads or columns a kernel got wrong.
fn worst(got: &Tensor, want: &Tensor) -> Result<String> {
    let flat = |t: &Tensor| t.to_device(&Device::Cpu)?.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>();
    let (g, w) = (flat(got)?, flat(want)?);
    let scale = w.iter().fold(0f64, |m, x| m.max(x.abs()));
    let off = |i: usize| if g[i].is_nan() { f64::INFINITY } else { (g[i] - w[i]).abs() };
    let at = (0..g.len()).max_by(|&a, &b| off(a).total_cmp(&off(b))).unwrap_or(0);
    let bad = (0..g.len()).filter(|&i| off(i) > 1e-3 * scale).count();
    let mut index = Vec::new();
    let mut rest = at;
    for &d in want.dims().iter().rev() {
        index.push(rest % d.max(1));
        rest /= d.max(1);
    }
    index.reverse();
    Ok(format!("worst at {index:?}: {} for {}; {bad} of {} off by over 1e-3 of the largest", g[at], w[at], g.len()))
}

#[test]
fn delta_rule_matches_the_cpu_kernel_with_every_gradient() -> Result<()> {
    // The 27B head (128×128, three value heads a key head) over 150 tokens (a partial third
    // chunk); tiny heads (5×3: most lanes and columns padding); d_v = 72 (the backward's two
    // column tiles, the second partial); d_k = 64 with one key head for four value heads.
    let cases = [
        Case { b: 2, t: 150, hk: 2, h: 6, dk: 128, dv: 128 },
        Case { b: 1, t: 70, hk: 1, h: 3, dk: 5, dv: 3 },
        Case { b: 2, t: 129, hk: 2, h: 6, dk: 40, dv: 72 },
        Case { b: 1, t: 64, hk: 1, h: 4, dk: 64, dv: 64 },
        // Two value heads a key head, four chunks (the last partial), documents starting at 50
        // and 64 in row 0.
        Case { b: 2, t: 200, hk: 2, h: 4, dk: 32, dv: 48 },
    ];
    // Every comparison runs and prints; the failures are listed together at the end.
    let mut failed = Vec::new();
    let mut check = |what: String, got: &Tensor, want: &Tensor, tol: f64, seed: u64| -> Result<()> {
        // An all-zero reference (the checkpoint entering a row's only chunk, with no initial
        // state) has no relative error: it must come back exactly.
        let zero = want.abs()?.max_all()?.to_scalar::<f64>()? == 0.0;
        let err = if zero {
            got.abs()?.to_dtype(DType::F64)?.max_all()?.to_device(&Device::Cpu)?.to_scalar::<f64>()?
        } else {
            rel_err(got, want)?
        };
        println!("{what}: {} error {err:.2e} (bound {tol:.0e})", if zero { "absolute" } else { "relative" });
        if err.is_nan() || err > tol {
            failed.push(format!("{what}: error {err:e} over {tol:e} (seed {seed}); {}", worst(got, want)?));
        }
        Ok(())
    };
    for c in cases {
        for (dtype, tol) in DTYPES {
            let data = Data::new(c, dtype)?;
            let mask = packed(c)?;
            for with_state in [false, true] {
                let tag = format!("delta rule {c:?} {dtype:?} initial state {with_state}");
                let init = |s: &(Tensor, Tensor)| with_state.then(|| (s.0.clone(), s.1.clone()));
                let s0 = init(&data.s0);
                let f = fused(|| delta_rule::forward(&ops(&data.gpu, data.scale), s0.as_ref().map(|s| &s.0), &mask))?;
                let want = delta_rule::forward(&ops(&data.cpu, data.scale), s0.as_ref().map(|s| &s.1), &mask)?;
                assert_eq!((f.out.dtype(), f.state.dtype()), (dtype, DType::F32), "{tag}");
                for ((what, got), (_, want)) in forward_listed(&f).into_iter().zip(forward_listed(&want)) {
                    // The output is stored in the dtype; the states in f32 always.
                    let bound = if what == "out" { tol } else { tol.min(F32_TOL) };
                    check(format!("{tag} {what}"), &got, &want, bound, data.seed)?;
                }
                let ds = init(&data.dstate);
                let on_gpu = || {
                    delta_rule::backward(
                        &ops(&data.gpu, data.scale),
                        s0.as_ref().map(|s| &s.0),
                        &mask,
                        &f.checkpoints,
                        &data.dout.0,
                        ds.as_ref().map(|s| &s.0),
                    )
                };
                let g = fused(on_gpu)?;
                let want = delta_rule::backward(
                    &ops(&data.cpu, data.scale),
                    s0.as_ref().map(|s| &s.1),
                    &mask,
                    &want.checkpoints,
                    &data.dout.1,
                    ds.as_ref().map(|s| &s.1),
                )?;
                let (got, want) = (grads_listed(&g), grads_listed(&want));
                assert_eq!(got.len(), want.len(), "{tag}: gradients returned");
                for ((what, got), (_, want)) in got.into_iter().zip(want) {
                    check(format!("{tag} {what}"), &got, &want, tol, data.seed)?;
                }
                // Deterministic: no atomics, partials summed in a fixed order.
                let again = on_gpu()?;
                for (a, b) in [(&g.dq, &again.dq), (&g.dk, &again.dk), (&g.dg, &again.dg)] {
                    let same = a.eq(b)?.to_dtype(DType::F32)?.min_all()?.to_scalar::<f32>()?;
                    assert_eq!(same, 1.0, "{tag}: a second backward differs");
                }
            }
        }
    }
    assert!(failed.is_empty(), "{} comparisons failed:\n{}", failed.len(), failed.join("\n"));
    Ok(())
}

#[test]
fn delta_rule_steps_token_by_token_give_the_forward() -> Result<()> {
    // Rows of one document each, from a given state: decoding one token at a time carries the
    // state the forward carries, with the same arithmetic in the same order: the same bits.
    let c = Case { b: 2, t: 20, hk: 2, h: 6, dk: 128, dv: 128 };
    for dtype in [DType::F32, DType::BF16] {
        let data = Data::new(c, dtype)?;
        let x = ops(&data.gpu, data.scale);
        let whole = Mask::new(&vec![0; c.b * c.t], c.b, c.t)?;
        let f = fused(|| delta_rule::forward(&x, Some(&data.s0.0), &whole))?;
        let mut state = data.s0.0.clone();
        let mut outs = Vec::with_capacity(c.t);
        for t in 0..c.t {
            let one: Vec<Tensor> = data.gpu.iter().map(|x| x.narrow(1, t, 1)).collect::<Result<_>>()?;
            let one: [Tensor; 5] = one.try_into().expect("five operands");
            let (o, s) = fused(|| delta_rule::step(&ops(&one, data.scale), &state))?;
            outs.push(o);
            state = s;
        }
        let stepped = Tensor::cat(&outs, 1)?;
        let same = |a: &Tensor, b: &Tensor| -> Result<f32> {
            a.to_dtype(DType::F32)?.eq(&b.to_dtype(DType::F32)?)?.to_dtype(DType::F32)?.min_all()?.to_scalar::<f32>()
        };
        assert_eq!(same(&stepped, &f.out)?, 1.0, "{dtype:?}: stepped outputs differ (seed {})", data.seed);
        assert_eq!(same(&state, &f.state)?, 1.0, "{dtype:?}: stepped state differs (seed {})", data.seed);
        // And the step agrees with the CPU kernel's.
        let (_, want) = delta_rule::step(&ops(&data.cpu, data.scale), &data.s0.1)?;
        let (_, got) = delta_rule::step(&x, &data.s0.0)?;
        expect_close(&format!("step state {dtype:?}"), &got, &want, F32_TOL, data.seed)?;
    }
    Ok(())
}

#[test]
fn delta_rule_timing_at_the_27b_layer_shape() -> Result<()> {
    // Qwen3.6-27B's linear-attention layer: 16 key heads, 48 value heads, 128×128 states; two
    // packed rows of 4096 bf16 tokens. A print, not an assertion: it predicts the training step.
    let c = Case { b: 2, t: 4096, hk: 16, h: 48, dk: 128, dv: 128 };
    let data = Data::new(c, DType::BF16)?;
    let mask = packed(c)?;
    let x = ops(&data.gpu, data.scale);
    let f = delta_rule::forward(&x, None, &mask)?;
    let fwd = time_ms(&mut || delta_rule::forward(&x, None, &mask).map(drop))?;
    let bwd = time_ms(&mut || delta_rule::backward(&x, None, &mask, &f.checkpoints, &data.dout.0, None).map(drop))?;
    println!("delta rule {c:?} bf16: forward {fwd:.2} ms, backward {bwd:.2} ms");
    Ok(())
}
