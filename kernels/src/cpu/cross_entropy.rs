//! Row-wise cross-entropy over `[N, V]` logits: one pass for max and log-sum-exp in the
//! forward, one for `softmax − onehot` in the backward, rows in parallel.

use super::{Real, max, sum, tensor, with_slices};
use candle_core::{Result, Tensor};
use rayon::prelude::*;

/// `targets[r]` is the label of row `r`, `None` when ignored.
pub(crate) fn forward<T: Real>(logits: &Tensor, targets: &[Option<u32>]) -> Result<(Tensor, Tensor)> {
    let (n, v) = logits.dims2()?;
    let mut losses = vec![T::ZERO; n];
    let mut lse = vec![T::ZERO; n];
    with_slices::<T, _, 1>([logits], |[logits]| {
        losses.par_iter_mut().zip(lse.par_iter_mut()).zip(logits.par_chunks(v)).zip(targets).for_each_init(
            || vec![T::ZERO; v],
            |buf, (((loss, lse), row), target)| {
                let m = max(row);
                buf.iter_mut().zip(row).for_each(|(b, &x)| *b = x - m);
                T::exp_in_place(buf);
                *lse = m + sum(buf).ln();
                if let Some(t) = target {
                    *loss = *lse - row[*t as usize];
                }
            },
        );
        Ok(())
    })?;
    Ok((tensor(losses, n)?, tensor(lse, (n, 1))?))
}

/// `dlogits[r] = w_r·(softmax(row r) − onehot(target_r))` with `w_r = d_losses[r]` (0 where
/// ignored).
pub(crate) fn backward<T: Real>(
    d_losses: &Tensor,
    logits: &Tensor,
    lse: &Tensor,
    targets: &[Option<u32>],
) -> Result<Tensor> {
    let (n, v) = logits.dims2()?;
    let mut dlogits = vec![T::ZERO; n * v];
    with_slices::<T, _, 3>([d_losses, logits, lse], |[dl, logits, lse]| {
        dlogits.par_chunks_mut(v).zip(logits.par_chunks(v)).enumerate().for_each(|(r, (d, row))| {
            let Some(t) = targets[r] else { return };
            let w = dl[r];
            d.iter_mut().zip(row).for_each(|(d, &x)| *d = x - lse[r]);
            T::exp_in_place(d);
            d.iter_mut().for_each(|x| *x *= w);
            d[t as usize] -= w;
        });
        Ok(())
    })?;
    tensor(dlogits, (n, v))
}
