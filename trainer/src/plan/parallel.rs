//! The part of a plan measured for a run on several ranks: the layout it was measured for and
//! the collective stage of the probe (NCCL's knobs timed at the run's own bucket sizes).

use crate::collective::Backend;
use crate::recipe::Sharding;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The layout a plan was measured for; a run at another world size needs another plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParallelPlan {
    pub world_size: usize,
    pub nnodes: usize,
    pub ranks_per_node: usize,
    pub backend: Backend,
    pub sharding: Sharding,
    pub per_device: u64,
    /// Batches each rank accumulates per optimizer step.
    pub grad_accum: u64,
    /// Rows per optimizer step over every rank: `per_device × grad_accum × world_size`.
    pub global_batch: u64,
    pub bucket_bytes: u64,
    /// The run's gradient buckets, in bytes, in the order the backward pass sends them.
    pub buckets: Vec<u64>,
    pub collective: CollectiveStage,
}

/// The probe's collective stage.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CollectiveStage {
    /// Why nothing was measured (one rank), when nothing was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
    /// The operation that decides: `all_reduce` (data parallel, ZeRO-1) or `reduce_scatter`
    /// (ZeRO-2/3).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub scored_by: String,
    pub candidates: Vec<CollectiveCandidate>,
    /// The winner's environment, also written into the plan's `env` (applied verbatim to every
    /// rank's process).
    pub chosen: BTreeMap<String, String>,
    pub elapsed_ms: u64,
    /// The budget ran out before every candidate was timed.
    pub truncated: bool,
}

/// One environment timed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CollectiveCandidate {
    pub env: BTreeMap<String, String>,
    pub timings: Vec<OpTiming>,
    /// Microseconds the run's buckets take with this environment (the scoring operation's time
    /// at each bucket's size, summed); `None` when it failed or was not timed.
    pub score_us: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The median time of one operation at one size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpTiming {
    pub op: String,
    pub bytes: u64,
    pub us: f64,
}

impl CollectiveCandidate {
    /// The score of these timings for `buckets` with `op`; `None` if a size was not timed.
    pub fn score(timings: &[OpTiming], op: &str, buckets: &[u64]) -> Option<f64> {
        buckets.iter().map(|&b| timings.iter().find(|t| t.op == op && t.bytes == b).map(|t| t.us)).sum::<Option<f64>>()
    }
}

/// The buckets a run sends: tensors of `bytes` each, in the order their gradients complete,
/// cut once a bucket holds `bucket_bytes` (as [`crate::parallel::GradReducer`] cuts them).
pub fn bucket_sizes(tensor_bytes: impl IntoIterator<Item = u64>, bucket_bytes: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut pending = 0;
    for b in tensor_bytes {
        pending += b;
        if pending >= bucket_bytes.max(1) {
            out.push(pending);
            pending = 0;
        }
    }
    if pending > 0 {
        out.push(pending);
    }
    out
}

/// The environments the collective stage tries, in order: NCCL's own choice, every algorithm ×
/// protocol pair, then channel counts (with the best pair found by then; see the probe).
///
/// Ring serves every collective, so it is set for all of them. Tree serves only all-reduce:
/// `NCCL_ALGO=Tree` for the whole process leaves `ncclReduce`, `ncclBroadcast` and
/// `ncclAllGather` (ZeRO's reduce-scatter and gather, the host gathers) with no algorithm, and NCCL
/// refuses them (`ncclInvalidUsage`, seen on two H100s, 2026-11-27); so it is set for all-reduce
/// alone, with NCCL 2.24's per-function syntax, its protocol likewise.
pub fn nccl_candidates() -> Vec<BTreeMap<String, String>> {
    let mut out = vec![BTreeMap::new()];
    for (algo, scope) in [("Ring", ""), ("Tree", "allreduce:")] {
        for proto in ["Simple", "LL128", "LL"] {
            out.push(BTreeMap::from([
                ("NCCL_ALGO".into(), format!("{scope}{algo}")),
                ("NCCL_PROTO".into(), format!("{scope}{proto}")),
            ]));
        }
    }
    out
}

/// Channel counts tried on top of the best environment so far.
pub const NCCL_MIN_CHANNELS: [u32; 3] = [8, 16, 32];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cut_where_the_reducer_cuts_them() {
        assert_eq!(bucket_sizes([10, 10, 10, 30, 5], 25), vec![30, 30, 5]);
        assert_eq!(bucket_sizes([100], 25), vec![100]);
        assert_eq!(bucket_sizes([], 25), Vec::<u64>::new());
    }

    #[test]
    fn a_candidate_scores_the_run_s_buckets() {
        let t = |op: &str, bytes, us| OpTiming { op: op.into(), bytes, us };
        let timings = [t("all_reduce", 30, 3.0), t("all_reduce", 5, 1.0), t("reduce_scatter", 30, 2.0)];
        assert_eq!(CollectiveCandidate::score(&timings, "all_reduce", &[30, 30, 5]), Some(7.0));
        assert_eq!(CollectiveCandidate::score(&timings, "reduce_scatter", &[30, 5]), None);
        let c = nccl_candidates();
        assert_eq!(c.len(), 7);
        assert_eq!(c[1]["NCCL_ALGO"], "Ring");
        let tree: Vec<_> = c.iter().filter(|e| e.get("NCCL_ALGO").is_some_and(|a| a.contains("Tree"))).collect();
        assert_eq!(tree.len(), 3);
        assert!(tree.iter().all(|e| e["NCCL_ALGO"] == "allreduce:Tree" && e["NCCL_PROTO"].starts_with("allreduce:")));
    }
}
