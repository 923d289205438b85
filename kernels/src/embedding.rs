//! Token embedding: a gather forward, a scatter-add backward.

use candle_core::{Result, Tensor};

/// `ids`: u32 `[n]`, `table`: `[vocab, hidden]` → `[n, hidden]`.
pub fn forward(ids: &Tensor, table: &Tensor) -> Result<Tensor> {
    let _profile = crate::profile::scope("embedding fwd", table.device());
    table.index_select(ids, 0)
}

/// Gradient of the table: rows of `dy` added at their token ids (repeated ids accumulate).
/// candle's CPU index_add walks the ids in order, so the sum is deterministic.
pub fn backward(dy: &Tensor, ids: &Tensor, table_shape: (usize, usize)) -> Result<Tensor> {
    let _profile = crate::profile::scope("embedding bwd", dy.device());
    Tensor::zeros(table_shape, dy.dtype(), dy.device())?.index_add(ids, dy, 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::{check, random};
    use candle_core::Device;

    #[test]
    fn gradients_match_finite_differences_with_repeated_ids() -> Result<()> {
        let dev = Device::Cpu;
        let table = random(&[6, 3], 1, &dev)?;
        let ids = Tensor::new(&[1u32, 4, 1, 0, 5], &dev)?;
        let dy = random(&[5, 3], 2, &dev)?;
        let dt = backward(&dy, &ids, (6, 3))?;
        check(|t: &[Tensor]| forward(&ids, &t[0]), &[table], &dy, &[dt])
    }
}
