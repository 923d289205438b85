//! The probe's collective stage: at more than one rank, the run's gradient buckets are timed
//! with each NCCL environment tried (NCCL's own choice, each `NCCL_ALGO` × `NCCL_PROTO`, then
//! `NCCL_MIN_NCHANNELS` counts at the best so far), each in a fresh set of rank processes started
//! with that environment, exactly as the run's ranks will be. The winner goes into the plan's
//! `env`; the plan's hash covers it, and the launcher applies it verbatim.

use super::supervise::{Outcome, supervise};
use super::{Job, Launch, RankCommand, Work};
use mindxtrain_trainer::collective::Backend;
use mindxtrain_trainer::plan::parallel::{NCCL_MIN_CHANNELS, nccl_candidates};
use mindxtrain_trainer::plan::{CollectiveCandidate, CollectiveStage};
use mindxtrain_trainer::run::Quiet;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Times the collectives of a run with `buckets` (bytes, sent as `dtype`) on every rank of
/// `launch` within `budget`, scored by `op` (`all_reduce` or `reduce_scatter`). `base_env` is the
/// recipe's environment, which every candidate extends.
#[allow(clippy::too_many_arguments)]
pub fn collective_stage(
    launch: &Launch,
    cmd: &RankCommand,
    recipe_blake3: &str,
    base_env: &BTreeMap<String, String>,
    buckets: &[u64],
    dtype: &str,
    op: &str,
    budget: Duration,
) -> CollectiveStage {
    let started = Instant::now();
    let mut sizes: Vec<u64> = buckets.to_vec();
    sizes.sort_unstable();
    sizes.dedup();
    let mut stage = CollectiveStage { scored_by: op.to_string(), ..CollectiveStage::default() };
    let mut queue: Vec<BTreeMap<String, String>> =
        if launch.backend == Backend::Nccl { nccl_candidates() } else { vec![BTreeMap::new()] };
    let mut channels_added = launch.backend != Backend::Nccl;
    let mut i = 0;
    while i < queue.len() {
        let env = queue[i].clone();
        i += 1;
        if started.elapsed() >= budget {
            stage.truncated = true;
            stage.candidates.push(CollectiveCandidate {
                env,
                timings: Vec::new(),
                score_us: None,
                note: Some("not timed: the autotune budget was spent".into()),
            });
            continue;
        }
        let mut full_env = base_env.clone();
        full_env.extend(env.clone());
        let job = Job {
            recipe_blake3: recipe_blake3.to_string(),
            backend: launch.backend,
            env: full_env,
            timeout_seconds: launch.timeout.as_secs(),
            work: Work::Probe {
                sizes: sizes.clone(),
                ops: vec!["all_reduce".into(), "reduce_scatter".into()],
                dtype: dtype.into(),
            },
        };
        let mut ignore = |_: &str, _: &str, _: serde_json::Value| Ok(());
        let candidate = match supervise(launch, cmd, &job, &mut ignore, &mut Quiet) {
            Ok(Outcome::Probe(timings)) => {
                let score_us = CollectiveCandidate::score(&timings, op, buckets);
                CollectiveCandidate { env, timings, score_us, note: None }
            }
            Ok(other) => CollectiveCandidate {
                env,
                timings: Vec::new(),
                score_us: None,
                note: Some(format!("unexpected outcome {other:?}")),
            },
            Err(e) => {
                CollectiveCandidate { env, timings: Vec::new(), score_us: None, note: Some(format!("failed: {e}")) }
            }
        };
        stage.candidates.push(candidate);
        // After the algorithm × protocol pairs, channel counts on top of the best so far.
        if i == queue.len() && !channels_added {
            channels_added = true;
            let best = best(&stage).unwrap_or_default();
            for n in NCCL_MIN_CHANNELS {
                let mut env = best.clone();
                env.insert("NCCL_MIN_NCHANNELS".into(), n.to_string());
                queue.push(env);
            }
        }
    }
    stage.chosen = best(&stage).unwrap_or_default();
    stage.elapsed_ms = started.elapsed().as_millis() as u64;
    stage
}

/// The environment with the lowest score (the first of equals).
fn best(stage: &CollectiveStage) -> Option<BTreeMap<String, String>> {
    stage
        .candidates
        .iter()
        .filter_map(|c| Some((c.score_us?, &c.env)))
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, env)| env.clone())
}
