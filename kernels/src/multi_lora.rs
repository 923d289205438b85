//! A projection with several LoRA adapters in one batch: `y = x·Wᵀ + Δ`, where row `i`'s
//! branch is `sₐ·(x_i·Aₐᵀ)·Bₐᵀ` for the adapter `a = rows[i]` its request named (none for
//! rows of the base model). One GPU sells many fine-tunes over one base this way: the base GEMM
//! is shared by every row, and only the thin branches differ.
//!
//! Adapters are stacked per projection: `A` `[slots, r, in]`, `B` `[slots, out, r]`, one
//! scaling per slot (adapters of a smaller rank are zero-padded to `r`, which adds nothing).
//! A packed group of up to three projections that read one input (q/k/v, gate/up) is one stack:
//! `A` `[slots, m·r, in]` (the members' `A` along the rank), `B` `[slots, Σ out, r]` (the members'
//! `B` along the output), and member `i`'s output rows read only its own `r` columns of `x·Aᵀ`.
//! The [`reference`] is a loop over the adapters present (gather their rows, two GEMMs,
//! scatter back); on a GPU the branch is two batched kernels over rows (shrink `x·Aᵀ`, then
//! expand into `y`), so a batch of many adapters costs what one does.

use crate::KernelConfig;
use crate::linear;
use candle_core::{Device, Result, Tensor};

/// One projection's adapters, stacked by slot.
#[derive(Debug, Clone)]
pub struct LoraStack {
    /// `[slots, m·r, in]`.
    pub a: Tensor,
    /// `[slots, out, r]`.
    pub b: Tensor,
    /// The scaling of each slot (`alpha / r`, or rsLoRA's).
    pub scales: Vec<f64>,
    /// The output rows of each of the `m` members, in order (one entry: a single projection).
    pub member_rows: Vec<usize>,
}

/// The most members a packed stack may have (the expand kernel's boundaries).
pub const MAX_MEMBERS: usize = 3;

/// Which adapter slot each row of a batch uses (`None`: the base alone).
#[derive(Debug, Clone)]
pub struct RowAdapters {
    rows: Vec<Option<u32>>,
    /// On a GPU: the slots as i32 (−1 for none), for the kernels.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    device: Option<Tensor>,
}

impl RowAdapters {
    pub fn new(rows: Vec<Option<u32>>, device: &Device) -> Result<RowAdapters> {
        let device = match device {
            Device::Cpu => None,
            d => Some(Tensor::new(RowAdapters::slot_ids(&rows).as_slice(), d)?),
        };
        Ok(RowAdapters { rows, device })
    }

    /// The same over `ids` (`[rows]` i32, −1 for none), already on the device and holding
    /// `rows`: a buffer a recorded graph reads, refilled before each replay.
    pub fn on_device(rows: Vec<Option<u32>>, ids: Tensor) -> Result<RowAdapters> {
        if ids.dtype() != candle_core::DType::I32 || ids.elem_count() != rows.len() {
            candle_core::bail!("multi-LoRA: {} row ids of {:?} for {} rows", ids.elem_count(), ids.dtype(), rows.len());
        }
        Ok(RowAdapters { rows, device: Some(ids) })
    }

    /// The rows' slots as the kernels read them (−1 for none).
    pub fn slot_ids(rows: &[Option<u32>]) -> Vec<i32> {
        rows.iter().map(|r| r.map_or(-1, |s| s as i32)).collect()
    }

    pub fn rows(&self) -> &[Option<u32>] {
        &self.rows
    }

    /// Whether any row uses an adapter.
    pub fn any(&self) -> bool {
        self.rows.iter().any(Option::is_some)
    }

    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn device_ids(&self) -> Result<&Tensor> {
        self.device.as_ref().ok_or_else(|| candle_core::Error::Msg("multi-LoRA: row adapters are on the CPU".into()))
    }
}

impl LoraStack {
    /// The rank of each member.
    pub fn rank(&self) -> Result<usize> {
        self.b.dim(2)
    }

    fn check(&self, x: &Tensor, w: &Tensor, rows: &RowAdapters) -> Result<()> {
        let (slots, mr, d_in) = self.a.dims3()?;
        let (b_slots, d_out, r) = self.b.dims3()?;
        let (n, x_in) = x.dims2()?;
        let (w_out, w_in) = w.dims2()?;
        let m = self.member_rows.len();
        let fits = b_slots == slots
            && (1..=MAX_MEMBERS).contains(&m)
            && mr == m * r
            && self.member_rows.iter().sum::<usize>() == d_out
            && (x_in, w_in, w_out) == (d_in, d_in, d_out)
            && self.scales.len() == slots
            && rows.rows.len() == n
            && rows.rows.iter().all(|s| s.is_none_or(|s| (s as usize) < slots));
        if !fits {
            candle_core::bail!(
                "multi-LoRA: x {:?}, W {:?}, A {:?}, B {:?}, members of {:?} rows, {} scales, {} row slots (one past the stack?)",
                x.dims(),
                w.dims(),
                self.a.dims(),
                self.b.dims(),
                self.member_rows,
                self.scales.len(),
                rows.rows.len()
            );
        }
        Ok(())
    }
}

/// `x` `[N, in]`, `w` `[out, in]` → `[N, out]`: the base projection plus each row's adapter.
pub fn forward(cfg: &KernelConfig, x: &Tensor, w: &Tensor, lora: &LoraStack, rows: &RowAdapters) -> Result<Tensor> {
    lora.check(x, w, rows)?;
    if !rows.any() {
        return linear::forward(cfg, x, w);
    }
    let _profile = crate::profile::scope("multi-LoRA", x.device());
    #[cfg(feature = "cuda")]
    if let Some(y) = crate::gpu::multi_lora::forward(cfg, x, w, lora, rows)? {
        return Ok(y);
    }
    reference::forward(cfg, x, w, lora, rows)
}

/// The composed form: one pass per adapter present.
pub mod reference {
    use super::*;

    pub fn forward(cfg: &KernelConfig, x: &Tensor, w: &Tensor, lora: &LoraStack, rows: &RowAdapters) -> Result<Tensor> {
        let mut y = linear::forward(cfg, x, w)?;
        let mut present: Vec<u32> = rows.rows.iter().flatten().copied().collect();
        present.sort_unstable();
        present.dedup();
        for slot in present {
            let picked: Vec<u32> =
                rows.rows.iter().enumerate().filter(|(_, s)| **s == Some(slot)).map(|(i, _)| i as u32).collect();
            let idx = Tensor::new(picked.as_slice(), x.device())?;
            let xs = x.index_select(&idx, 0)?;
            let (a, b) = (lora.a.get(slot as usize)?, lora.b.get(slot as usize)?);
            let xa = (linear::forward(cfg, &xs, &a)? * lora.scales[slot as usize])?;
            let r = lora.rank()?;
            let (mut parts, mut row) = (Vec::new(), 0);
            for (i, &rows) in lora.member_rows.iter().enumerate() {
                let xa_i = xa.narrow(1, i * r, r)?.contiguous()?;
                parts.push(linear::forward(cfg, &xa_i, &b.narrow(0, row, rows)?)?);
                row += rows;
            }
            y = y.index_add(&idx, &Tensor::cat(&parts, 1)?, 0)?;
        }
        Ok(y)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::{assert_close, random};
    use candle_core::DType;

    #[test]
    fn each_row_gets_its_own_adapter_and_base_rows_none() -> Result<()> {
        let dev = Device::Cpu;
        let (n, d_in, d_out, r, slots) = (7, 6, 5, 3, 3);
        let cfg = KernelConfig::default();
        let (x, w) = (random(&[n, d_in], 1, &dev)?, random(&[d_out, d_in], 2, &dev)?);
        let stack = LoraStack {
            a: random(&[slots, r, d_in], 3, &dev)?,
            b: random(&[slots, d_out, r], 4, &dev)?,
            scales: vec![2.0, 0.5, 1.5],
            member_rows: vec![d_out],
        };
        let assign = [Some(2), None, Some(0), Some(2), Some(1), None, Some(0)];
        let rows = RowAdapters::new(assign.to_vec(), &dev)?;
        let y = forward(&cfg, &x, &w, &stack, &rows)?;
        // Row by row, the single-adapter LoRA formula.
        for (i, slot) in assign.iter().enumerate() {
            let xi = x.narrow(0, i, 1)?;
            let mut want = xi.matmul(&w.t()?)?;
            if let Some(s) = slot {
                let (a, b) = (stack.a.get(*s as usize)?, stack.b.get(*s as usize)?);
                want = (want + (xi.matmul(&a.t()?)? * stack.scales[*s as usize])?.matmul(&b.t()?)?)?;
            }
            assert_close(&y.narrow(0, i, 1)?, &want, 1e-12)?;
        }
        // No adapted row: exactly the base projection.
        let none = RowAdapters::new(vec![None; n], &dev)?;
        assert_close(&forward(&cfg, &x, &w, &stack, &none)?, &x.matmul(&w.t()?)?, 0.0)?;
        // f32 follows f64.
        let c = |t: &Tensor| t.to_dtype(DType::F32);
        let s32 = LoraStack { a: c(&stack.a)?, b: c(&stack.b)?, ..stack.clone() };
        assert_close(&forward(&cfg, &c(&x)?, &c(&w)?, &s32, &rows)?, &y, 1e-5)?;
        Ok(())
    }

    /// A packed group's stack adds to each member's rows what that member's own stack adds.
    #[test]
    fn a_packed_stack_equals_its_members_apart() -> Result<()> {
        let dev = Device::Cpu;
        let cfg = KernelConfig::default();
        let (n, d_in, r, slots, outs) = (5, 6, 2, 2, [4usize, 3, 3]);
        let x = random(&[n, d_in], 1, &dev)?;
        let rows = RowAdapters::new(vec![Some(1), None, Some(0), Some(1), Some(0)], &dev)?;
        let scales = vec![0.5, 2.0];
        let members: Vec<(Tensor, LoraStack)> = outs
            .iter()
            .enumerate()
            .map(|(i, &out)| -> Result<_> {
                let a = random(&[slots, r, d_in], 10 + i as u64, &dev)?;
                let b = random(&[slots, out, r], 20 + i as u64, &dev)?;
                let w = random(&[out, d_in], 30 + i as u64, &dev)?;
                Ok((w, LoraStack { a, b, scales: scales.clone(), member_rows: vec![out] }))
            })
            .collect::<Result<_>>()?;
        let cat = |f: &dyn Fn(&(Tensor, LoraStack)) -> Tensor, dim| {
            Tensor::cat(&members.iter().map(f).collect::<Vec<_>>(), dim)
        };
        let packed = LoraStack {
            a: cat(&|m| m.1.a.clone(), 1)?,
            b: cat(&|m| m.1.b.clone(), 1)?,
            scales,
            member_rows: outs.to_vec(),
        };
        let apart =
            Tensor::cat(&members.iter().map(|(w, s)| forward(&cfg, &x, w, s, &rows)).collect::<Result<Vec<_>>>()?, 1)?;
        assert_close(&forward(&cfg, &x, &cat(&|m| m.0.clone(), 0)?, &packed, &rows)?, &apart, 1e-12)?;
        // Members whose rows do not add up to the weight's are refused.
        let bad = LoraStack { member_rows: vec![4, 3, 2], ..packed };
        assert!(forward(&cfg, &x, &cat(&|m| m.0.clone(), 0)?, &bad, &rows).is_err());
        Ok(())
    }

    #[test]
    fn a_slot_past_the_stack_is_an_error() -> Result<()> {
        let dev = Device::Cpu;
        let stack = LoraStack {
            a: random(&[1, 2, 4], 1, &dev)?,
            b: random(&[1, 3, 2], 2, &dev)?,
            scales: vec![1.0],
            member_rows: vec![3],
        };
        let rows = RowAdapters::new(vec![Some(1)], &dev)?;
        let err =
            forward(&KernelConfig::default(), &random(&[1, 4], 3, &dev)?, &random(&[3, 4], 4, &dev)?, &stack, &rows);
        assert!(err.unwrap_err().to_string().contains("multi-LoRA"));
        Ok(())
    }
}
