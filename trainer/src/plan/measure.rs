//! Timing candidate choices inside a hard time budget.

use super::{Choices, Measurement};
use mindxtrain_kernels::attention::{AttentionKernels, KEY_TILES};
use mindxtrain_kernels::moe::MoeKernels;
use std::time::{Duration, Instant};
use thiserror::Error;

/// Timed steps per candidate once warmed up (fewer when the budget is short).
const TIMED_STEPS: u32 = 3;

/// One configuration to time.
pub type Candidate = Choices;

/// Runs one training step (forward, backward, optimizer) with the given choices.
pub trait Probe {
    fn step(&mut self, choices: &Choices) -> Result<(), String>;
}

impl<F: FnMut(&Choices) -> Result<(), String>> Probe for F {
    fn step(&mut self, choices: &Choices) -> Result<(), String> {
        self(choices)
    }
}

#[derive(Debug, Error)]
pub enum MeasureError {
    #[error("no candidate completed a step within the {budget_s} s budget: {reasons}")]
    NothingMeasured { budget_s: f64, reasons: String, measurements: Vec<Measurement> },
}

/// The outcome of [`measure`].
#[derive(Debug, Clone)]
pub struct Measured {
    pub best: Choices,
    pub measurements: Vec<Measurement>,
    pub elapsed: Duration,
    pub truncated: bool,
}

/// Matmul blockings tried (token rows per GEMM task), the kernels' default first.
const GEMM_ROWS: [usize; 3] = [128, 64, 256];

/// Every candidate for a CPU run: thread counts up to the machine's, micro-batches that
/// divide `per_device`, activation checkpointing off and on, and matmul blockings. Ordered so the
/// likeliest winners are timed first when the budget is short.
pub fn candidates(logical_cpus: usize, per_device: usize) -> Vec<Candidate> {
    let mut threads: Vec<usize> = std::iter::successors(Some(1usize), |t| Some(t * 2))
        .take_while(|&t| t < logical_cpus)
        .chain(std::iter::once(logical_cpus.max(1)))
        .collect();
    threads.dedup();
    threads.reverse();
    let mut micro: Vec<usize> =
        [1, 2, 4].iter().map(|d| per_device / d).filter(|&m| m >= 1 && per_device.is_multiple_of(m)).collect();
    micro.dedup();
    let mut out = Vec::new();
    for activation_checkpointing in [false, true] {
        for &threads in &threads {
            for &micro_batch in &micro {
                for gemm_rows in GEMM_ROWS {
                    let (attention, moe) = (AttentionKernels::DEFAULT, MoeKernels::default());
                    out.push(Choices { threads, micro_batch, activation_checkpointing, gemm_rows, attention, moe });
                }
            }
        }
    }
    out
}

/// Every candidate for a run on one GPU: micro-batches that divide `per_device` (whole batch
/// first) with activation checkpointing off, then on. A candidate that does not fit the device's
/// memory fails its step and is recorded with the error, so the plan keeps the fastest that fits.
/// The CPU GEMM blocking does not matter there and keeps its default; the host threads are all
/// of `logical_cpus`, for what still runs on the host (drawing a model's initial weights, data).
pub fn gpu_candidates(logical_cpus: usize, per_device: usize) -> Vec<Candidate> {
    let unmeasured = Choices::unmeasured(logical_cpus.max(1));
    let mut micro: Vec<usize> =
        [1, 2, 4, 8].iter().map(|d| per_device / d).filter(|&m| m >= 1 && per_device.is_multiple_of(m)).collect();
    micro.dedup();
    [false, true]
        .into_iter()
        .flat_map(|activation_checkpointing| {
            micro.iter().map(move |&micro_batch| Choices { micro_batch, activation_checkpointing, ..unmeasured })
        })
        .collect()
}

/// `candidates` without those that break the recipe's `train.gradient_checkpointing`
/// (`Some(on)`: only candidates that checkpoint exactly when `on`).
pub fn keeping_checkpointing(candidates: Vec<Candidate>, required: Option<bool>) -> Vec<Candidate> {
    match required {
        Some(on) => candidates.into_iter().filter(|c| c.activation_checkpointing == on).collect(),
        None => candidates,
    }
}

/// dQ splits tried when the recipe allows a non-deterministic backward.
const ATOMIC_DQ_SPLITS: [usize; 2] = [2, 4];

/// The GPU attention kernels to time on top of `base` (the fastest batch split): every forward
/// key tile with the deterministic backward, and, unless `deterministic`, the split dQ with
/// atomics. `base`'s own kernels come first.
pub fn attention_candidates(base: Choices, deterministic: bool) -> Vec<Candidate> {
    let splits: &[usize] = if deterministic { &[1] } else { &[1, ATOMIC_DQ_SPLITS[0], ATOMIC_DQ_SPLITS[1]] };
    let mut out = vec![base];
    for &dq_splits in splits {
        for key_tile in KEY_TILES {
            let c = Choices { attention: AttentionKernels { key_tile, dq_splits }, ..base };
            if !out.contains(&c) {
                out.push(c);
            }
        }
    }
    out
}

/// The CPU grouped-GEMM settings of a mixture-of-experts model to time on top of `base` (the
/// fastest of the other choices): every tile × expert order, `base`'s own first.
pub fn moe_candidates(base: Choices) -> Vec<Candidate> {
    let mut out = vec![base];
    for moe in MoeKernels::candidates() {
        let c = Choices { moe, ..base };
        if !out.contains(&c) {
            out.push(c);
        }
    }
    out
}

/// Times each candidate (one warm-up step, then up to [`TIMED_STEPS`]) and picks the one
/// with the lowest median step time; ties keep the earlier candidate. No candidate
/// starts once the budget is spent, and none is given more than an even share of what
/// is left, so the whole measurement ends within the budget plus one step.
pub fn measure(candidates: &[Candidate], budget: Duration, probe: &mut impl Probe) -> Result<Measured, MeasureError> {
    let start = Instant::now();
    let mut measurements = Vec::with_capacity(candidates.len());
    let mut truncated = false;
    for (i, choices) in candidates.iter().enumerate() {
        let left = budget.saturating_sub(start.elapsed());
        if left.is_zero() {
            truncated = true;
            measurements.push(skipped(choices, "not timed: the autotune budget was spent"));
            continue;
        }
        let share = left / (candidates.len() - i) as u32;
        measurements.push(time_one(choices, share, probe));
    }
    let best =
        measurements.iter().filter_map(|m| m.step_us.map(|t| (t, m.choices))).min_by_key(|(t, _)| *t).map(|(_, c)| c);
    match best {
        Some(best) => Ok(Measured { best, measurements, elapsed: start.elapsed(), truncated }),
        None => Err(MeasureError::NothingMeasured {
            budget_s: budget.as_secs_f64(),
            reasons: measurements.iter().filter_map(|m| m.note.clone()).collect::<Vec<_>>().join("; "),
            measurements,
        }),
    }
}

fn time_one(choices: &Choices, share: Duration, probe: &mut impl Probe) -> Measurement {
    let t0 = Instant::now();
    if let Err(e) = probe.step(choices) {
        return skipped(choices, &format!("failed: {e}"));
    }
    let warm = t0.elapsed();
    let mut times = Vec::new();
    while times.len() < TIMED_STEPS as usize && t0.elapsed() + warm.min(share) <= share {
        let t = Instant::now();
        if let Err(e) = probe.step(choices) {
            return skipped(choices, &format!("failed: {e}"));
        }
        times.push(t.elapsed());
    }
    if times.is_empty() {
        // The warm-up alone used the share: its time is the only honest number we have.
        times.push(warm);
    }
    times.sort();
    Measurement {
        choices: *choices,
        step_us: Some(times[times.len() / 2].as_micros() as u64),
        steps_timed: times.len() as u32,
        note: None,
    }
}

fn skipped(choices: &Choices, why: &str) -> Measurement {
    Measurement { choices: *choices, step_us: None, steps_timed: 0, note: Some(why.to_string()) }
}

#[cfg(test)]
mod tests {
    use super::*;
    const DEFAULT_GEMM_ROWS: usize = mindxtrain_kernels::linear::DEFAULT_BLOCK_ROWS;

    #[test]
    fn candidates_cover_threads_micro_batches_and_checkpointing() {
        let c = candidates(2, 8);
        assert_eq!(c.len(), 2 * 3 * 2 * 3);
        let (attention, moe) = (AttentionKernels::DEFAULT, MoeKernels::default());
        assert_eq!(
            c[0],
            Choices { threads: 2, micro_batch: 8, activation_checkpointing: false, gemm_rows: 128, attention, moe }
        );
        assert!(c.contains(&Choices {
            threads: 1,
            micro_batch: 2,
            activation_checkpointing: true,
            gemm_rows: 256,
            attention,
            moe
        }));
        assert_eq!(candidates(1, 1).len(), 2 * 3);
        assert!(candidates(6, 3).iter().all(|c| 3 % c.micro_batch == 0 && c.threads <= 6));
    }

    #[test]
    fn gpu_candidates_split_the_batch_then_checkpoint() {
        let c = gpu_candidates(16, 8);
        let micro: Vec<(usize, bool)> = c.iter().map(|c| (c.micro_batch, c.activation_checkpointing)).collect();
        assert_eq!(micro, [(8, false), (4, false), (2, false), (1, false), (8, true), (4, true), (2, true), (1, true)]);
        assert!(c.iter().all(|c| c.threads == 16 && c.gemm_rows == DEFAULT_GEMM_ROWS));
        assert_eq!(gpu_candidates(0, 3)[0].threads, 1);
        assert_eq!(gpu_candidates(2, 3).iter().map(|c| c.micro_batch).collect::<Vec<_>>(), [3, 1, 3, 1]);
    }

    #[test]
    fn moe_candidates_keep_the_base_and_cover_every_tile_and_order() {
        let base = candidates(2, 4)[3];
        let c = moe_candidates(base);
        assert_eq!(c[0], base);
        assert_eq!(c.len(), MoeKernels::candidates().len());
        assert!(c.iter().all(|x| Choices { moe: base.moe, ..*x } == base));
        let tiles: std::collections::BTreeSet<_> = c.iter().map(|x| x.moe.tile).collect();
        assert_eq!(tiles.len(), mindxtrain_kernels::moe::GroupedTile::ALL.len());
    }

    #[test]
    fn attention_candidates_keep_the_base_and_respect_determinism() {
        let base = gpu_candidates(2, 4)[1];
        let det = attention_candidates(base, true);
        assert_eq!(det[0], base);
        assert_eq!(det.len(), KEY_TILES.len());
        assert!(det.iter().all(|c| c.attention.deterministic() && c.micro_batch == base.micro_batch));
        let all = attention_candidates(base, false);
        assert_eq!(all.len(), KEY_TILES.len() * 3);
        assert!(all.iter().any(|c| c.attention == AttentionKernels { key_tile: 32, dq_splits: 4 }));
        assert!(all.iter().all(|c| c.attention.validate().is_ok()));
    }

    #[test]
    fn picks_the_fastest_and_records_everything() {
        let cands = candidates(2, 4);
        let mut probe = |c: &Choices| {
            // Fake work proportional to a cost model: 2 threads and micro 4 win. The runner-up
            // is 2 ms slower: sleeps overshoot by far less, even on a loaded 2-core CI machine
            // (at 0.2 ms this test failed there once).
            let cost = 200 / c.threads as u64
                + 100 / c.micro_batch as u64
                + u64::from(c.activation_checkpointing) * 50
                + u64::from(c.gemm_rows != 64) * 20;
            std::thread::sleep(Duration::from_micros(cost * 100));
            Ok(())
        };
        let m = measure(&cands, Duration::from_secs(60), &mut probe).unwrap();
        let (attention, moe) = (AttentionKernels::DEFAULT, MoeKernels::default());
        assert_eq!(
            m.best,
            Choices { threads: 2, micro_batch: 4, activation_checkpointing: false, gemm_rows: 64, attention, moe }
        );
        assert_eq!(m.measurements.len(), cands.len());
        assert!(!m.truncated);
    }

    #[test]
    fn the_budget_is_enforced() {
        let cands = candidates(2, 8);
        let mut probe = |_: &Choices| {
            std::thread::sleep(Duration::from_millis(40));
            Ok(())
        };
        let t = Instant::now();
        let m = measure(&cands, Duration::from_millis(200), &mut probe).unwrap();
        // Budget plus at most one step of overrun.
        assert!(t.elapsed() < Duration::from_millis(200 + 45 + 40), "{:?}", t.elapsed());
        assert!(m.truncated);
        assert!(m.measurements.iter().any(|x| x.step_us.is_none()));
    }

    #[test]
    fn failures_are_recorded_and_all_failing_is_an_error() {
        let cands = candidates(2, 2);
        let mut probe = |c: &Choices| if c.threads == 1 { Err("boom".to_string()) } else { Ok(()) };
        let m = measure(&cands, Duration::from_secs(2), &mut probe).unwrap();
        assert_eq!(m.best.threads, 2);
        assert!(m.measurements.iter().any(|x| x.note.as_deref() == Some("failed: boom")));
        let mut fail = |_: &Choices| Err("no memory".to_string());
        let err = measure(&cands, Duration::from_secs(1), &mut fail).unwrap_err();
        assert!(err.to_string().contains("no memory"), "{err}");
    }
}
