//! The fused kernel against the composed reference on fresh random inputs (a new seed each run,
//! named on failure), every gradient against finite differences, the tap orientation by hand,
//! and the identities: decoding token by token, carrying the state across calls and packing
//! documents each give what one call over the whole gives.

use super::*;
use crate::gradcheck::{assert_close, check, fresh_seed, random};
use candle_core::{DType, Device};

/// One case's tensors, in f64: x, w, bias, initial state, dy, final-state gradient.
struct Data {
    seed: u64,
    x: Tensor,
    w: Tensor,
    bias: Tensor,
    s0: Tensor,
    dy: Tensor,
    dstate: Tensor,
}

impl Data {
    fn new(b: usize, t: usize, c: usize, w: usize) -> Result<Data> {
        let seed = fresh_seed();
        let r = |shape: &[usize], i: u64| random(shape, seed.wrapping_add(i), &Device::Cpu);
        Ok(Data {
            seed,
            x: (r(&[b, t, c], 0)? * 2.0)?,
            w: r(&[c, w], 1)?,
            bias: r(&[c], 2)?,
            s0: (r(&[b, c, w - 1], 3)? * 2.0)?,
            dy: r(&[b, t, c], 4)?,
            dstate: r(&[b, c, w - 1], 5)?,
        })
    }

    fn fail(&self, what: &str) -> impl Fn(candle_core::Error) -> candle_core::Error + '_ {
        let what = what.to_string();
        move |e| candle_core::Error::Msg(format!("{what} (seed {}): {e}", self.seed))
    }
}

fn whole_rows(b: usize, t: usize) -> Result<Mask> {
    Mask::new(&vec![0; b * t], b, t)
}

fn listed(g: &Grads) -> Vec<(&'static str, Tensor)> {
    let mut v = vec![("dx", g.dx.clone()), ("dw", g.dw.clone())];
    v.extend(g.dbias.clone().map(|t| ("dbias", t)));
    v.extend(g.dstate.clone().map(|t| ("dstate", t)));
    v
}

#[test]
fn fused_kernel_matches_the_reference_in_f64_and_f32() -> Result<()> {
    // 80 token rows: several parallel blocks and two reduction blocks, the last partial.
    // Documents start at 2 (shorter than the kernel) and 20 in the first row.
    let (b, t, c, w) = (2, 40, 7, 4);
    let data = Data::new(b, t, c, w)?;
    let segs: Vec<u32> = (0..b * t).map(|i| if i < t { u32::from(i >= 2) + u32::from(i >= 20) } else { 5 }).collect();
    let mask = Mask::new(&segs, b, t)?;
    let (y, last) = reference::forward(&data.x, &data.w, &data.bias, &data.s0, Some(mask.starts()))?;
    let grads = reference::backward(&data.dy, &data.x, &data.w, &data.bias, &data.s0, mask.starts(), &data.dstate)?;
    for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
        let c = |t: &Tensor| t.to_dtype(dtype);
        let (x, wt, bias, s0) = (c(&data.x)?, c(&data.w)?, c(&data.bias)?, c(&data.s0)?);
        let (yf, lastf) = forward(&x, &wt, Some(&bias), Some(&s0), &mask)?;
        assert_close(&yf, &y, tol).map_err(data.fail("y"))?;
        assert_close(&lastf, &last, tol).map_err(data.fail("final state"))?;
        let g = backward(&c(&data.dy)?, &x, &wt, Some(&bias), Some(&s0), &mask, Some(&c(&data.dstate)?))?;
        for ((what, got), want) in listed(&g).into_iter().zip(&grads) {
            assert_close(&got, want, tol).map_err(data.fail(what))?;
        }
    }
    Ok(())
}

#[test]
fn gradients_match_finite_differences() -> Result<()> {
    // A packed row and a whole one; then rows shorter than the state, whose final state still
    // holds initial-state columns.
    for (t, segs) in [(6, vec![0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2]), (2, vec![0, 0, 3, 3])] {
        let (b, c, w) = (2, 3, 4);
        let data = Data::new(b, t, c, w)?;
        let mask = Mask::new(&segs, b, t)?;
        let g = backward(&data.dy, &data.x, &data.w, Some(&data.bias), Some(&data.s0), &mask, Some(&data.dstate))?;
        let both = |y: &Tensor, s: &Tensor| Tensor::cat(&[y.flatten_all()?, s.flatten_all()?], 0);
        let run = |i: &[Tensor]| {
            let (y, s) = forward(&i[0], &i[1], Some(&i[2]), Some(&i[3]), &mask)?;
            both(&y, &s)
        };
        let inputs = [data.x.clone(), data.w.clone(), data.bias.clone(), data.s0.clone()];
        let analytic = [g.dx, g.dw, g.dbias.expect("bias given"), g.dstate.expect("state given")];
        check(run, &inputs, &both(&data.dy, &data.dstate)?, &analytic).map_err(data.fail(&format!("T = {t}")))?;
    }
    Ok(())
}

#[test]
fn the_last_tap_reads_the_current_token() -> Result<()> {
    // W = 2, w = [a, b] per channel (the Conv1d weight's order): y_t = silu(a·x_{t−1} + b·x_t + bias).
    let dev = Device::Cpu;
    let x = Tensor::from_vec(vec![1.0f64, -2.0], (1, 2, 1), &dev)?;
    let w = Tensor::from_vec(vec![0.5f64, 3.0], (1, 2), &dev)?;
    let (bias, s0) = (Tensor::from_vec(vec![0.25f64], 1, &dev)?, Tensor::from_vec(vec![4.0f64], (1, 1, 1), &dev)?);
    let silu = |u: f64| u / (1.0 + (-u).exp());
    let (y, last) = forward(&x, &w, Some(&bias), Some(&s0), &whole_rows(1, 2)?)?;
    let want = [silu(0.5 * 4.0 + 3.0 * 1.0 + 0.25), silu(0.5 * 1.0 + 3.0 * -2.0 + 0.25)];
    let got = y.flatten_all()?.to_vec1::<f64>()?;
    assert!(got.iter().zip(want).all(|(g, w)| (g - w).abs() < 1e-14), "{got:?} vs {want:?}");
    assert_eq!(last.flatten_all()?.to_vec1::<f64>()?, [-2.0]);
    Ok(())
}

#[test]
fn decoding_token_by_token_gives_the_forward() -> Result<()> {
    let (b, t, c, w) = (2, 9, 5, 4);
    let data = Data::new(b, t, c, w)?;
    let (y, last) = forward(&data.x, &data.w, Some(&data.bias), Some(&data.s0), &whole_rows(b, t)?)?;
    let mut state = data.s0.clone();
    for i in 0..t {
        let (yi, next) = step(&data.x.narrow(1, i, 1)?, &data.w, Some(&data.bias), &state)?;
        assert_close(&yi, &y.narrow(1, i, 1)?, 1e-12).map_err(data.fail(&format!("token {i}")))?;
        state = next;
    }
    assert_close(&state, &last, 1e-12).map_err(data.fail("state"))?;
    let (yp, lastp) = step(&data.x, &data.w, Some(&data.bias), &data.s0)?;
    assert_close(&yp, &y, 1e-12).map_err(data.fail("prefill"))?;
    assert_close(&lastp, &last, 1e-12).map_err(data.fail("prefill state"))
}

#[test]
fn a_state_carried_across_two_calls_gives_one_call_over_both() -> Result<()> {
    // Splits after 1 token (shorter than the state) and after 7; a document starts at 9.
    let (b, t, c, w) = (1, 12, 4, 4);
    let data = Data::new(b, t, c, w)?;
    let segs: Vec<u32> = (0..t as u32).map(|i| u32::from(i >= 9)).collect();
    let mask = Mask::new(&segs, b, t)?;
    let (y, last) = forward(&data.x, &data.w, Some(&data.bias), Some(&data.s0), &mask)?;
    let g = backward(&data.dy, &data.x, &data.w, Some(&data.bias), Some(&data.s0), &mask, Some(&data.dstate))?;
    for split in [1, 7] {
        let m = |from: usize, len: usize| Mask::new(&segs[from..from + len], b, len);
        let (m1, m2) = (m(0, split)?, m(split, t - split)?);
        let (x1, x2) = (data.x.narrow(1, 0, split)?, data.x.narrow(1, split, t - split)?);
        let (dy1, dy2) = (data.dy.narrow(1, 0, split)?, data.dy.narrow(1, split, t - split)?);
        let bias = Some(&data.bias);
        let (y1, s1) = forward(&x1, &data.w, bias, Some(&data.s0), &m1)?;
        let (y2, s2) = forward(&x2, &data.w, bias, Some(&s1), &m2)?;
        let fail = data.fail(&format!("split at {split}"));
        assert_close(&Tensor::cat(&[y1, y2], 1)?, &y, 1e-12).map_err(&fail)?;
        assert_close(&s2, &last, 1e-12).map_err(&fail)?;
        let g2 = backward(&dy2, &x2, &data.w, bias, Some(&s1), &m2, Some(&data.dstate))?;
        let g1 = backward(&dy1, &x1, &data.w, bias, Some(&data.s0), &m1, g2.dstate.as_ref())?;
        assert_close(&Tensor::cat(&[&g1.dx, &g2.dx], 1)?, &g.dx, 1e-12).map_err(&fail)?;
        assert_close(&(&g1.dw + &g2.dw)?, &g.dw, 1e-12).map_err(&fail)?;
        let (b1, b2) = (g1.dbias.expect("bias"), g2.dbias.expect("bias"));
        assert_close(&(b1 + b2)?, g.dbias.as_ref().expect("bias"), 1e-12).map_err(&fail)?;
        assert_close(g1.dstate.as_ref().expect("state"), g.dstate.as_ref().expect("state"), 1e-12).map_err(&fail)?;
    }
    Ok(())
}

#[test]
fn packed_documents_give_what_each_gives_alone() -> Result<()> {
    // Documents shorter than, as long as and longer than the kernel, without bias or state
    // (packed training starts each document from zeros).
    let lens = [2, 4, 9];
    let (t, c, w) = (lens.iter().sum::<usize>(), 3, 4);
    let data = Data::new(1, t, c, w)?;
    let segs: Vec<u32> = lens.iter().enumerate().flat_map(|(i, &n)| vec![i as u32; n]).collect();
    let mask = Mask::new(&segs, 1, t)?;
    let (y, last) = forward(&data.x, &data.w, None, None, &mask)?;
    let g = backward(&data.dy, &data.x, &data.w, None, None, &mask, None)?;
    assert!(g.dbias.is_none() && g.dstate.is_none());
    let (mut start, mut dw) = (0, data.w.zeros_like()?);
    for &n in &lens {
        let (x, dy) = (data.x.narrow(1, start, n)?, data.dy.narrow(1, start, n)?);
        let (ya, lasta) = forward(&x, &data.w, None, None, &whole_rows(1, n)?)?;
        let ga = backward(&dy, &x, &data.w, None, None, &whole_rows(1, n)?, None)?;
        let fail = data.fail(&format!("document at {start}"));
        assert_close(&y.narrow(1, start, n)?, &ya, 1e-12).map_err(&fail)?;
        assert_close(&g.dx.narrow(1, start, n)?, &ga.dx, 1e-12).map_err(&fail)?;
        if start + n == t {
            assert_close(&last, &lasta, 1e-12).map_err(&fail)?;
        }
        dw = (dw + ga.dw)?;
        start += n;
    }
    assert_close(&g.dw, &dw, 1e-12).map_err(data.fail("dw"))
}

#[test]
fn bad_shapes_are_errors_that_name_them() -> Result<()> {
    let data = Data::new(1, 5, 3, 4)?;
    let mask = whole_rows(1, 5)?;
    let err = |r: Result<(Tensor, Tensor)>| r.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err(forward(&data.x, &data.w.narrow(0, 0, 2)?, None, None, &mask)).contains("weight of shape [2, 4]"));
    assert!(err(forward(&data.x, &data.w, Some(&data.s0), None, &mask)).contains("bias of shape [1, 3, 3]"));
    assert!(err(forward(&data.x, &data.w, None, Some(&data.bias), &mask)).contains("initial state of shape [3]"));
    assert!(err(forward(&data.x, &data.w, None, None, &whole_rows(1, 4)?)).contains("mask for 1×4"));
    let g = backward(&data.dy.narrow(1, 0, 4)?, &data.x, &data.w, None, None, &mask, None);
    assert!(g.err().is_some_and(|e| e.to_string().contains("output gradient")));
    let g = backward(&data.dy, &data.x, &data.w, None, None, &mask, Some(&data.bias));
    assert!(g.err().is_some_and(|e| e.to_string().contains("state gradient")));
    assert!(err(step(&data.x, &data.w, None, &data.bias)).contains("initial state"));
    assert!(err(step(&data.x.narrow(1, 0, 0)?, &data.w, None, &data.s0)).contains("no tokens"));
    Ok(())
}
