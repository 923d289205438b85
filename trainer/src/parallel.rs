//! Training on several ranks: data parallel and ZeRO sharding over [`crate::collective`].
//!
//! * **Data** ([`shard`]): an optimizer step reads `grad_accum × world` batches of `per_device`
//!   rows from the one data stream every rank opens at the same cursor; rank `r` computes batches
//!   `r, r + world, r + 2·world, …`. The global batch (`per_device × grad_accum × world`) is fixed
//!   when a run starts and kept when it resumes at another world size (the accumulation changes).
//! * **Gradients** ([`buckets`], [`hooks`]): as the backward pass completes each block's
//!   gradients they are packed into buckets and reduced by the collective while the pass goes on
//!   (on the TCP mesh's own thread, or NCCL's own stream).
//! * **Sharding** ([`Sharding`], [`owners`], [`zero3`]): ZeRO-1 keeps each tensor's optimizer
//!   state on one rank (its owner) and all-gathers the updated weights; ZeRO-2 also reduces each
//!   gradient only to its owner; ZeRO-3 (FSDP) also keeps each weight only on its owner, gathering
//!   a block's weights just before it runs, with the next block's gather in flight.
//!
//! Whole tensors are sharded (not slices of a flat buffer), and every sum is taken in rank order,
//! so ZeRO-1/2/3 end on the same bytes as unsharded data parallel at the same world size.

pub mod buckets;
pub mod comm;
pub mod hooks;
pub mod owners;
pub mod trace;
pub mod zero3;

pub use buckets::{GradReducer, Keep, Reduce, gather_owned};
pub use comm::{Comm, Job, Ticket};
pub use hooks::RankHooks;
pub use owners::Owners;
pub use trace::Trace;
pub use zero3::Zero3Window;

use crate::collective::rendezvous::Topology;
use crate::collective::{Backend, Collective, CollectiveError};
pub use crate::recipe::Sharding;
use serde::{Deserialize, Serialize};

/// A rank of a distributed run: its collective and how the run is laid out.
pub struct Distributed {
    pub collective: Box<dyn Collective>,
    pub topology: Topology,
}

/// How a distributed run is laid out, as `run.started`, the plan and the manifest record it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Layout {
    pub world_size: usize,
    pub backend: Backend,
    pub sharding: Sharding,
    pub per_device: u64,
    /// Batches each rank accumulates per optimizer step at this world size.
    pub grad_accum: u64,
    /// Rows per optimizer step: `per_device × grad_accum × world_size`.
    pub global_batch: u64,
    pub bucket_bytes: u64,
    pub topology: Topology,
}

/// The batches of one optimizer step that `rank` computes: every `world`-th, from `rank`.
///
/// ```
/// use mindxtrain_trainer::parallel::shard;
/// assert_eq!(shard(vec![0, 1, 2, 3, 4, 5], 1, 3), vec![1, 4]);
/// assert_eq!(shard(vec![0, 1, 2], 0, 1), vec![0, 1, 2]);
/// ```
pub fn shard<T>(batches: Vec<T>, rank: usize, world: usize) -> Vec<T> {
    let world = world.max(1);
    batches.into_iter().enumerate().filter(|(i, _)| i % world == rank).map(|(_, b)| b).collect()
}

/// The accumulation one rank needs to keep a run's global batch at `world` ranks.
pub fn accumulation(global_batch: u64, per_device: u64, world: usize) -> Result<u64, String> {
    let per_step = per_device * world as u64;
    if per_step == 0 || !global_batch.is_multiple_of(per_step) || global_batch == 0 {
        let rows = global_batch / per_device.max(1);
        let fits: Vec<String> = (1..=rows.min(64)).filter(|w| rows.is_multiple_of(*w)).map(|w| w.to_string()).collect();
        return Err(format!(
            "the run's global batch is {global_batch} rows, which {world} rank(s) of per_device {per_device} cannot \
             split evenly; world sizes that fit: {}",
            fits.join(", ")
        ));
    }
    Ok(global_batch / per_step)
}

/// One value every rank agrees on: rank 0's, after checking the others hold the same `what`.
pub fn agree(comm: &Comm, what: &str, value: &[u8]) -> Result<Vec<u8>, CollectiveError> {
    let all = comm.run(Job::Bytes(value.to_vec()))?.bytes()?;
    if let Some((rank, _)) = all.iter().enumerate().skip(1).find(|(_, v)| *v != &all[0]) {
        return Err(CollectiveError::Mismatch(format!(
            "rank {rank} has another {what} than rank 0 ({} vs {})",
            String::from_utf8_lossy(&all[rank]),
            String::from_utf8_lossy(&all[0])
        )));
    }
    Ok(all.into_iter().next().unwrap_or_default())
}

/// Rank 0's bytes, on every rank (a broadcast through the gather).
pub fn from_rank0(comm: &Comm, value: &[u8]) -> Result<Vec<u8>, CollectiveError> {
    Ok(comm.run(Job::Bytes(value.to_vec()))?.bytes()?.into_iter().next().unwrap_or_default())
}

#[cfg(test)]
mod tests;
