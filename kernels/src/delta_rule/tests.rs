//! The fused kernel against the composed reference on fresh random inputs (a new seed each run,
//! named on failure), every gradient against finite differences, and the recurrence's
//! identities: decoding token by token, carrying the state across calls and packing documents
//! each give what one call over the whole gives.

use super::case::{Case, beta_of, decay_of};
use super::*;
use crate::gradcheck::{assert_close, check, fresh_seed, random};
use candle_core::{Device, IndexOp};

/// The operands and gradients of one case, in f64.
struct Data {
    seed: u64,
    x: [Tensor; 5],
    s0: Tensor,
    dout: Tensor,
    dstate: Tensor,
    scale: f64,
}

impl Data {
    fn new(c: Case) -> Result<Data> {
        let seed = fresh_seed();
        let dev = Device::Cpu;
        let r = |shape: &[usize], i: u64| random(shape, seed.wrapping_add(i), &dev);
        // β in (0.1, 0.9).
        let beta = beta_of(&(r(&c.gates(), 3)? * 2.2)?)?;
        let x = [r(&c.qk(), 0)?, r(&c.qk(), 1)?, r(&c.v(), 2)?, beta, decay_of(&r(&c.gates(), 4)?)?];
        let state = c.state();
        Ok(Data { seed, x, s0: r(&state, 5)?, dout: r(&c.v(), 6)?, dstate: r(&state, 7)?, scale: c.scale() })
    }

    fn ops(&self) -> Operands<'_> {
        Operands::of(&self.x, self.scale)
    }

    /// A narrow of every operand along the tokens (or the batch, `dim` 0).
    fn slice(&self, dim: usize, start: usize, len: usize) -> Result<[Tensor; 5]> {
        let n = |t: &Tensor| t.narrow(dim, start, len);
        Ok([n(&self.x[0])?, n(&self.x[1])?, n(&self.x[2])?, n(&self.x[3])?, n(&self.x[4])?])
    }

    fn fail(&self, what: &str) -> impl Fn(candle_core::Error) -> candle_core::Error + '_ {
        let what = what.to_string();
        move |e| candle_core::Error::Msg(format!("{what} (seed {}): {e}", self.seed))
    }
}

fn whole_rows(b: usize, t: usize) -> Result<Mask> {
    Mask::new(&vec![0; b * t], b, t)
}

/// Grads as a list, for comparisons.
fn listed(g: &Grads) -> Vec<(&'static str, Tensor)> {
    let mut v = vec![("dq", g.dq.clone()), ("dk", g.dk.clone()), ("dv", g.dv.clone())];
    v.extend([("dbeta", g.dbeta.clone()), ("dg", g.dg.clone())]);
    v.extend(g.dstate.clone().map(|s| ("dstate", s)));
    v
}

#[test]
fn fused_kernel_matches_the_reference_in_f64_and_f32() -> Result<()> {
    // Three chunks; documents start mid-chunk and exactly at the second chunk's first token.
    let c = Case { b: 2, t: 150, hk: 2, h: 4, dk: 5, dv: 3 };
    let data = Data::new(c)?;
    let segs: Vec<u32> =
        (0..c.b * c.t).map(|i| if i < c.t { u32::from(i >= 40) + u32::from(i >= 64) } else { 7 }).collect();
    let mask = Mask::new(&segs, c.b, c.t)?;
    let (x, starts) = (data.ops(), Some(mask.starts()));
    let (out, state, kept) = reference::forward(&x, &data.s0, starts, true)?;
    let grads = reference::backward(&x, mask.starts(), &kept, &data.dout, &data.dstate)?;
    for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-4)] {
        let cast = |t: &Tensor| t.to_dtype(dtype);
        let xs = [cast(&data.x[0])?, cast(&data.x[1])?, cast(&data.x[2])?, cast(&data.x[3])?, cast(&data.x[4])?];
        let xd = Operands::of(&xs, data.scale);
        let f = forward(&xd, Some(&cast(&data.s0)?), &mask)?;
        for (what, got, want) in
            [("out", &f.out, &out), ("state", &f.state, &state), ("checkpoints", &f.checkpoints, &kept)]
        {
            assert_eq!(got.dtype(), dtype);
            assert_close(got, want, tol).map_err(data.fail(what))?;
        }
        let g = backward(&xd, Some(&data.s0), &mask, &f.checkpoints, &cast(&data.dout)?, Some(&cast(&data.dstate)?))?;
        for ((what, got), want) in listed(&g).into_iter().zip(&grads) {
            assert_close(&got, want, tol).map_err(data.fail(what))?;
        }
    }
    // bf16 operands run in f32, as transformers runs them: the output comes back in bf16, the
    // state stays f32, both as the f32 kernel gives them on the same (rounded) values.
    let xs: Vec<Tensor> = data.x.iter().map(|t| t.to_dtype(DType::BF16)).collect::<Result<_>>()?;
    let xs: [Tensor; 5] = xs.try_into().expect("five operands");
    let f = forward(&Operands::of(&xs, data.scale), None, &mask)?;
    let x32 = xs.clone().map(|t| t.to_dtype(DType::F32).expect("to f32"));
    let f32_run = forward(&Operands::of(&x32, data.scale), None, &mask)?;
    assert_eq!((f.out.dtype(), f.state.dtype()), (DType::BF16, DType::F32));
    assert_close(&f.out, &f32_run.out.to_dtype(DType::BF16)?, 0.0).map_err(data.fail("bf16 out"))?;
    assert_close(&f.state, &f32_run.state, 0.0).map_err(data.fail("bf16 state"))
}

#[test]
fn gradients_match_finite_differences() -> Result<()> {
    // Past one chunk, with documents starting in both chunks, GQA, and a gradient for the
    // final state as well as for the output.
    let c = Case { b: 1, t: CHUNK + 6, hk: 1, h: 2, dk: 2, dv: 2 };
    let data = Data::new(c)?;
    let segs: Vec<u32> = (0..c.t as u32).map(|t| u32::from(t >= 3) + u32::from(t >= CHUNK as u32 + 2)).collect();
    let mask = Mask::new(&segs, c.b, c.t)?;
    let f = forward(&data.ops(), Some(&data.s0), &mask)?;
    let g = backward(&data.ops(), Some(&data.s0), &mask, &f.checkpoints, &data.dout, Some(&data.dstate))?;
    let both = |out: &Tensor, state: &Tensor| Tensor::cat(&[out.flatten_all()?, state.flatten_all()?], 0);
    let run = |t: &[Tensor]| {
        let x = [t[0].clone(), t[1].clone(), t[2].clone(), t[3].clone(), t[4].clone()];
        let f = forward(&Operands::of(&x, data.scale), Some(&t[5]), &mask)?;
        both(&f.out, &f.state)
    };
    let mut inputs = data.x.to_vec();
    inputs.push(data.s0.clone());
    let analytic = [g.dq, g.dk, g.dv, g.dbeta, g.dg, g.dstate.expect("initial state given")];
    check(run, &inputs, &both(&data.dout, &data.dstate)?, &analytic).map_err(data.fail("gradcheck"))
}

#[test]
fn decoding_token_by_token_gives_the_forward() -> Result<()> {
    let c = Case { b: 2, t: 20, hk: 1, h: 3, dk: 4, dv: 5 };
    let data = Data::new(c)?;
    let f = forward(&data.ops(), Some(&data.s0), &whole_rows(c.b, c.t)?)?;
    let mut state = data.s0.clone();
    for t in 0..c.t {
        let xt = data.slice(1, t, 1)?;
        let (out, next) = step(&Operands::of(&xt, data.scale), &state)?;
        assert_close(&out, &f.out.narrow(1, t, 1)?, 1e-12).map_err(data.fail(&format!("token {t}")))?;
        state = next;
    }
    assert_close(&state, &f.state, 1e-12).map_err(data.fail("state"))?;
    // A prefill is a step over many tokens.
    let (out, last) = step(&data.ops(), &data.s0)?;
    assert_close(&out, &f.out, 1e-12).map_err(data.fail("prefill"))?;
    assert_close(&last, &f.state, 1e-12).map_err(data.fail("prefill state"))
}

#[test]
fn a_state_carried_across_two_calls_gives_one_call_over_both() -> Result<()> {
    // Split inside the second chunk of the whole; each part has a document start of its own.
    let c = Case { b: 2, t: 90, hk: 2, h: 2, dk: 3, dv: 4 };
    let (split, data) = (70, Data::new(c)?);
    let segs: Vec<u32> = (0..c.b * c.t).map(|i| u32::from(i % c.t >= 30) + u32::from(i % c.t >= 80)).collect();
    let mask = Mask::new(&segs, c.b, c.t)?;
    let part = |from: usize, len: usize| -> Result<Mask> {
        let s: Vec<u32> = (0..c.b).flat_map(|b| segs[b * c.t + from..b * c.t + from + len].to_vec()).collect();
        Mask::new(&s, c.b, len)
    };
    let (m1, m2) = (part(0, split)?, part(split, c.t - split)?);
    let (x1, x2) = (data.slice(1, 0, split)?, data.slice(1, split, c.t - split)?);
    let (x1, x2) = (Operands::of(&x1, data.scale), Operands::of(&x2, data.scale));
    let whole = forward(&data.ops(), Some(&data.s0), &mask)?;
    let f1 = forward(&x1, Some(&data.s0), &m1)?;
    let f2 = forward(&x2, Some(&f1.state), &m2)?;
    let out = Tensor::cat(&[&f1.out, &f2.out], 1)?;
    assert_close(&out, &whole.out, 1e-12).map_err(data.fail("out"))?;
    assert_close(&f2.state, &whole.state, 1e-12).map_err(data.fail("state"))?;
    // Back through both calls: the second's initial-state gradient is the first's state gradient.
    let g = backward(&data.ops(), Some(&data.s0), &mask, &whole.checkpoints, &data.dout, Some(&data.dstate))?;
    let (d1, d2) = (data.dout.narrow(1, 0, split)?, data.dout.narrow(1, split, c.t - split)?);
    let g2 = backward(&x2, Some(&f1.state), &m2, &f2.checkpoints, &d2, Some(&data.dstate))?;
    let g1 = backward(&x1, Some(&data.s0), &m1, &f1.checkpoints, &d1, g2.dstate.as_ref())?;
    for ((what, whole), ((_, a), (_, b))) in listed(&g).into_iter().zip(listed(&g1).into_iter().zip(listed(&g2))) {
        let joined = if what == "dstate" { a } else { Tensor::cat(&[a, b], 1)? };
        assert_close(&joined, &whole, 1e-12).map_err(data.fail(what))?;
    }
    Ok(())
}

#[test]
fn packed_documents_give_what_each_gives_alone() -> Result<()> {
    // One row of three documents, the second across the chunk boundary, against each document
    // as a row of its own (no initial state: packed training starts every document from zero).
    let lens = [5, CHUNK, 11];
    let c = Case { b: 1, t: lens.iter().sum(), hk: 1, h: 2, dk: 3, dv: 2 };
    let data = Data::new(c)?;
    let segs: Vec<u32> = lens.iter().enumerate().flat_map(|(i, &n)| vec![i as u32; n]).collect();
    let mask = Mask::new(&segs, 1, c.t)?;
    let packed = forward(&data.ops(), None, &mask)?;
    let g = backward(&data.ops(), None, &mask, &packed.checkpoints, &data.dout, None)?;
    assert!(g.dstate.is_none());
    let mut start = 0;
    for &n in &lens {
        let xs = data.slice(1, start, n)?;
        let x = Operands::of(&xs, data.scale);
        let alone = forward(&x, None, &whole_rows(1, n)?)?;
        let dout = data.dout.narrow(1, start, n)?;
        let ga = backward(&x, None, &whole_rows(1, n)?, &alone.checkpoints, &dout, None)?;
        let doc = format!("document at {start}");
        assert_close(&packed.out.narrow(1, start, n)?, &alone.out, 1e-12).map_err(data.fail(&doc))?;
        for ((what, packed), (_, alone)) in listed(&g).into_iter().zip(listed(&ga)) {
            assert_close(&packed.narrow(1, start, n)?, &alone, 1e-12).map_err(data.fail(&format!("{doc} {what}")))?;
        }
        if start + n == c.t {
            assert_close(&packed.state, &alone.state, 1e-12).map_err(data.fail("the last document's state"))?;
        }
        start += n;
    }
    Ok(())
}

#[test]
fn a_document_start_forgets_the_state_and_the_output_reads_the_updated_state() -> Result<()> {
    // By hand, d_k = d_v = 1: S = e^g·S₀ + k·β(v − e^g·S₀·k), o = S·scale·q.
    let dev = Device::Cpu;
    let t1 = |v: &[f64], shape: &[usize]| Tensor::from_vec(v.to_vec(), shape, &dev);
    let (q, k, v) = (t1(&[2.0, 2.0], &[1, 2, 1, 1])?, t1(&[0.5, 0.5], &[1, 2, 1, 1])?, t1(&[3.0, 3.0], &[1, 2, 1, 1])?);
    let (beta, g) = (t1(&[0.25, 0.25], &[1, 2, 1])?, t1(&[-0.5, -0.5], &[1, 2, 1])?);
    let s0 = t1(&[4.0], &[1, 1, 1, 1])?;
    let x = [q, k, v, beta, g];
    let ops = Operands::of(&x, 0.5);
    let (a, s_prev) = ((-0.5f64).exp(), 4.0);
    let s1 = a * s_prev + 0.5 * 0.25 * (3.0 - a * s_prev * 0.5);
    let fresh = 0.5 * 0.25 * 3.0;
    for (segs, second) in [([0, 0], a * s1 + 0.5 * 0.25 * (3.0 - a * s1 * 0.5)), ([0, 1], fresh)] {
        let f = forward(&ops, Some(&s0), &Mask::new(&segs, 1, 2)?)?;
        let got = f.out.flatten_all()?.to_vec1::<f64>()?;
        assert!((got[0] - s1).abs() < 1e-14 && (got[1] - second).abs() < 1e-14, "{segs:?}: {got:?}");
        assert!((f.state.flatten_all()?.to_vec1::<f64>()?[0] - second).abs() < 1e-14);
    }
    Ok(())
}

#[test]
fn bad_shapes_are_errors_that_name_them() -> Result<()> {
    let c = Case { b: 1, t: 4, hk: 2, h: 4, dk: 3, dv: 2 };
    let data = Data::new(c)?;
    let mask = whole_rows(1, 4)?;
    let err = |r: Result<Forward>| r.err().map(|e| e.to_string()).unwrap_or_default();
    let mut bad = data.x.clone();
    bad[1] = data.x[1].narrow(3, 0, 2)?;
    assert!(err(forward(&Operands::of(&bad, 1.0), None, &mask)).contains("k of shape [1, 4, 2, 2]"));
    let mut bad = data.x.clone();
    bad[2] = data.x[2].narrow(2, 0, 3)?;
    assert!(err(forward(&Operands::of(&bad, 1.0), None, &mask)).contains("v of shape [1, 4, 3, 2]"));
    let mut bad = data.x.clone();
    bad[3] = data.x[3].i((.., .., 0))?;
    assert!(err(forward(&Operands::of(&bad, 1.0), None, &mask)).contains("beta of shape [1, 4]"));
    assert!(err(forward(&data.ops(), Some(&data.s0.narrow(3, 0, 1)?), &mask)).contains("initial state"));
    assert!(err(forward(&data.ops(), None, &whole_rows(1, 5)?)).contains("mask for 1×5"));
    let f = forward(&data.ops(), None, &mask)?;
    let g = backward(&data.ops(), None, &mask, &f.checkpoints.narrow(4, 0, 1)?, &data.dout, None);
    assert!(g.err().is_some_and(|e| e.to_string().contains("checkpoints")));
    let g = backward(&data.ops(), None, &mask, &f.checkpoints, &data.dout.narrow(1, 0, 3)?, None);
    assert!(g.err().is_some_and(|e| e.to_string().contains("output gradient")));
    assert!(step(&data.ops(), &data.s0.narrow(1, 0, 2)?).is_err());
    let none = data.slice(1, 0, 0)?;
    assert!(err(forward(&Operands::of(&none, 1.0), None, &whole_rows(1, 0)?)).contains("no tokens"));
    Ok(())
}
