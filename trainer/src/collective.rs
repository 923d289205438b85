//! Collectives across the ranks of a run: one [`Collective`] trait, two engines behind it.
//!
//! * [`Mesh`]: TCP between every pair of ranks, for CPU ranks (CI, CPU-only machines) and for
//!   ranks that share one GPU (host-staged: a device tensor is copied to the host, reduced, and
//!   copied back). **CPU only in spirit**: it is correct anywhere, but it moves every byte through
//!   the kernel's TCP stack, so GPUs use NCCL.
//! * `Nccl` (feature `cuda`): NVIDIA's NCCL through cudarc's bindings, on a stream of its own so
//!   that gradient buckets are reduced while the backward pass goes on. RCCL, its AMD twin, has
//!   the same API (no HIP launch path exists yet; see docs/architecture.md).
//!
//! Every operation sums in rank order: rank 0's value, plus rank 1's, plus rank 2's… for every
//! element, on every rank, in every run. On the mesh this is how the bytes are combined; it makes a
//! run's result independent of message timing, and equal to one rank accumulating the same
//! micro-batches one after another when every rank holds one of them. (NCCL chooses its own order;
//! at two ranks `a + b == b + a`, so it agrees too.)
//!
//! Ranks find each other through [`rendezvous`]: a TCP server on the launching node that assigns
//! ranks, hands out the mesh addresses (and NCCL's unique id), relays rank 0's events to the node
//! and stops every rank when one fails.
//!
//! Why not MPI (the `mpi` crate over OpenMPI): MPI ranks are started by `mpirun`, while our ranks
//! are started by `mindxtrain train` itself (the same launch path as NCCL's); the `mpi` crate needs
//! libclang and OpenMPI's headers in every build; and MPI's reduction order changes with the
//! algorithm it picks, which would lose the rank-order sum above.

mod abort;
pub mod bench;
mod error;
mod host;
mod mesh;
#[cfg(feature = "cuda")]
mod nccl;
pub mod rendezvous;
mod spans;
mod wire;

pub use abort::Abort;
pub use error::CollectiveError;
pub use mesh::Mesh;
#[cfg(feature = "cuda")]
pub use nccl::Nccl;
pub use spans::{Span, even_spans};

use candle_core::Tensor;
use serde::{Deserialize, Serialize};

/// Which engine moves the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// TCP between every pair of ranks (host memory).
    Tcp,
    /// NCCL on CUDA devices.
    Nccl,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Tcp => "tcp",
            Backend::Nccl => "nccl",
        }
    }
}

impl std::str::FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> Result<Backend, String> {
        match s {
            "tcp" => Ok(Backend::Tcp),
            "nccl" => Ok(Backend::Nccl),
            other => Err(format!("`{other}`: the collective backends are `nccl` (GPUs) and `tcp` (CPU, host-staged)")),
        }
    }
}

/// Sums and gathers across the ranks of one run. Every rank calls the same operations in the same
/// order with buffers of the same length; a rank that calls something else gets
/// [`CollectiveError::Mismatch`] rather than a wrong result.
///
/// Buffers are flat (1-D) tensors of f32, f64, bf16 or f16, on the CPU or a CUDA device; results
/// come back on the input's device and in its dtype. A backend may return before the bytes have
/// moved (NCCL queues the work on its stream); every result is ready for whatever the caller's
/// device does with it next, in order.
pub trait Collective: Send {
    fn rank(&self) -> usize;
    fn world(&self) -> usize;
    fn backend(&self) -> Backend;

    /// The elementwise sum of `t` over every rank, on every rank.
    fn all_reduce(&mut self, t: &Tensor) -> Result<Tensor, CollectiveError>;

    /// `t` is cut into consecutive `spans`, each owned by one rank; returns the sums over every
    /// rank of the spans this rank owns, concatenated in span order (empty when it owns none).
    fn reduce_scatter(&mut self, t: &Tensor, spans: &[Span]) -> Result<Tensor, CollectiveError>;

    /// The inverse: `mine` holds this rank's spans concatenated (as [`Collective::reduce_scatter`]
    /// returns them); returns every span, in order, on every rank.
    fn all_gather(&mut self, mine: &Tensor, spans: &[Span]) -> Result<Tensor, CollectiveError>;

    /// Small host values from every rank (losses, norms, flags, digests), in rank order.
    fn all_gather_bytes(&mut self, bytes: &[u8]) -> Result<Vec<Vec<u8>>, CollectiveError>;

    /// Waits until every operation issued so far has finished on the device (a backend that
    /// queues work on a device stream; the host-side ones finish before they return).
    fn synchronize(&mut self) -> Result<(), CollectiveError> {
        Ok(())
    }

    /// Starts recording when each operation runs on the device (a backend whose work is queued on
    /// a device stream; the host-side ones are timed by their caller).
    fn record_timeline(&mut self, _on: bool) {}

    /// The operations recorded since the last call: label, start and end on the host clock.
    fn timeline(&mut self) -> Vec<(String, std::time::Instant, std::time::Instant)> {
        Vec::new()
    }
}

/// An f64 per rank in rank order, through [`Collective::all_gather_bytes`].
pub fn all_gather_f64(c: &mut dyn Collective, values: &[f64]) -> Result<Vec<Vec<f64>>, CollectiveError> {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    c.all_gather_bytes(&bytes)?
        .into_iter()
        .map(|b| {
            if b.len() % 8 != 0 {
                return Err(CollectiveError::Mismatch(format!("{} bytes are not f64 values", b.len())));
            }
            Ok(b.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect())
        })
        .collect()
}

/// Checks that every rank holds the same `what` (a digest, a step number): a clear error naming
/// the first rank that differs from rank 0.
pub fn check_same(c: &mut dyn Collective, what: &str, value: &str) -> Result<(), CollectiveError> {
    let all = c.all_gather_bytes(value.as_bytes())?;
    let first = String::from_utf8_lossy(&all[0]).into_owned();
    for (rank, v) in all.iter().enumerate().skip(1) {
        let v = String::from_utf8_lossy(v);
        if v != first {
            return Err(CollectiveError::Mismatch(format!("rank {rank} has {what} {v}, rank 0 has {first}")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
