//! Timing collectives at given sizes: the probe's collective stage runs this on every rank of a
//! throw-away world (one per environment tried) and keeps rank 0's medians.

use super::{Collective, CollectiveError, even_spans};
use crate::plan::OpTiming;
use candle_core::{DType, Device, Tensor};
use std::time::Instant;

/// Timed repetitions per operation and size (after two untimed ones).
const REPS: usize = 5;

/// The median microseconds of `ops` (`all_reduce`, `reduce_scatter`) on buffers of each of
/// `sizes` bytes of `dtype` on `device`. Every rank must call it with the same arguments.
pub fn time_ops(
    c: &mut dyn Collective,
    device: &Device,
    dtype: DType,
    sizes: &[u64],
    ops: &[&str],
) -> Result<Vec<OpTiming>, CollectiveError> {
    let mut out = Vec::new();
    for &bytes in sizes {
        let n = (bytes as usize / dtype.size_in_bytes()).max(1);
        let t = Tensor::ones(n, dtype, device)?;
        let spans = even_spans(n, c.world());
        for &op in ops {
            let mut times = Vec::with_capacity(REPS);
            for rep in 0..REPS + 2 {
                let start = Instant::now();
                let r = match op {
                    "all_reduce" => c.all_reduce(&t)?,
                    "reduce_scatter" => c.reduce_scatter(&t, &spans)?,
                    other => return Err(CollectiveError::Mismatch(format!("no operation `{other}` to time"))),
                };
                // NCCL only queued the work on its own stream: it is done when that stream is.
                c.synchronize()?;
                drop(r);
                if rep >= 2 {
                    times.push(start.elapsed().as_secs_f64() * 1e6);
                }
            }
            times.sort_by(f64::total_cmp);
            out.push(OpTiming { op: op.into(), bytes, us: times[times.len() / 2] });
        }
    }
    Ok(out)
}
