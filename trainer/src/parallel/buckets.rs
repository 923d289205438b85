//! Gradient buckets: gradients that are complete are packed into flat buffers of about
//! `bucket_bytes` and reduced while the backward pass computes the next ones.
//!
//! Data parallel (and ZeRO-1) all-reduces each bucket: every rank gets every sum. ZeRO-2 and
//! ZeRO-3 reduce-scatter it by tensor owner: each rank gets only the sums of the tensors it keeps.
//! The buckets are cut where the gradients arrive, in the backward's order, the same on every rank.

use super::comm::{Comm, Job, Ticket};
use super::owners::Owners;
use crate::collective::{CollectiveError, Span};
use crate::model::Grads;
use candle_core::{DType, Tensor};

/// Where the sums go.
#[derive(Debug, Clone, Copy)]
pub enum Reduce<'a> {
    /// Every rank gets every sum.
    Everyone,
    /// Each sum goes to its tensor's owner.
    Owners(&'a Owners),
}

struct Entry {
    name: String,
    dims: Vec<usize>,
    len: usize,
    /// The rank the sum goes to (`None`: every rank).
    owner: Option<usize>,
}

struct Sent {
    ticket: Ticket,
    entries: Vec<Entry>,
}

/// The reduction of one optimizer step's gradients.
pub struct GradReducer<'a> {
    comm: &'a Comm,
    reduce: Reduce<'a>,
    bucket_bytes: usize,
    pending: Vec<(Entry, Tensor)>,
    pending_bytes: usize,
    sent: Vec<Sent>,
    /// Tickets of the buckets in the order they were sent, for the trace.
    pub tickets: Vec<(Ticket, usize)>,
}

impl<'a> GradReducer<'a> {
    pub fn new(comm: &'a Comm, reduce: Reduce<'a>, bucket_bytes: usize) -> GradReducer<'a> {
        GradReducer {
            comm,
            reduce,
            bucket_bytes: bucket_bytes.max(1),
            pending: Vec::new(),
            pending_bytes: 0,
            sent: Vec::new(),
            tickets: Vec::new(),
        }
    }

    /// Adds one complete gradient; sends the bucket once it holds `bucket_bytes`.
    pub fn add(&mut self, name: String, grad: Tensor) -> Result<(), CollectiveError> {
        if let Some((_, last)) = self.pending.last()
            && (last.dtype() != grad.dtype() || !last.device().same_device(grad.device()))
        {
            self.flush()?;
        }
        let owner = match self.reduce {
            Reduce::Everyone => None,
            Reduce::Owners(o) => Some(o.owner(&name).ok_or_else(|| {
                CollectiveError::Mismatch(format!("gradient `{name}` has no owner among the sharded tensors"))
            })?),
        };
        let len = grad.elem_count();
        self.pending_bytes += len * grad.dtype().size_in_bytes();
        self.pending.push((Entry { name, dims: grad.dims().to_vec(), len, owner }, grad));
        if self.pending_bytes >= self.bucket_bytes {
            self.flush()?;
        }
        Ok(())
    }

    /// Sends what is pending as one bucket.
    pub fn flush(&mut self) -> Result<(), CollectiveError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let (entries, grads): (Vec<Entry>, Vec<Tensor>) = std::mem::take(&mut self.pending).into_iter().unzip();
        let bytes = std::mem::take(&mut self.pending_bytes);
        let flat: Vec<Tensor> = grads.iter().map(|g| g.flatten_all()).collect::<Result<_, _>>()?;
        let flat = if flat.len() == 1 {
            flat.into_iter().next().unwrap_or_else(|| unreachable!())
        } else {
            Tensor::cat(&flat, 0)?
        };
        let job = match self.reduce {
            Reduce::Everyone => Job::AllReduce(flat),
            Reduce::Owners(_) => {
                let spans = entries.iter().map(|e| Span { len: e.len, owner: e.owner.unwrap_or(0) }).collect();
                Job::ReduceScatter(flat, spans)
            }
        };
        let ticket = self.comm.submit(job);
        self.tickets.push((ticket, bytes));
        self.sent.push(Sent { ticket, entries });
        Ok(())
    }

    /// Sends the last bucket and waits for every sum: all of them (every rank gets every sum), or
    /// those of the tensors this rank keeps.
    pub fn finish(mut self) -> Result<Grads, CollectiveError> {
        self.flush()?;
        let rank = self.comm.rank();
        let mut out = Grads::new();
        for sent in std::mem::take(&mut self.sent) {
            let flat = self.comm.wait(sent.ticket)?.tensor()?;
            let mut at = 0;
            for e in sent.entries.iter().filter(|e| e.owner.is_none_or(|o| o == rank)) {
                let g = flat.narrow(0, at, e.len)?.reshape(e.dims.as_slice())?;
                at += e.len;
                out.insert(e.name.clone(), g);
            }
            if at != flat.elem_count() {
                return Err(CollectiveError::Mismatch(format!(
                    "a bucket came back with {} elements for tensors of {at}",
                    flat.elem_count()
                )));
            }
        }
        Ok(out)
    }
}

/// Where gathered tensors go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// Every rank keeps every tensor, on its device (weights after a sharded optimizer step).
    Everywhere,
    /// Only `rank` keeps them, moved to the host; the others drop each bucket as it arrives
    /// (a checkpoint's optimizer state, which fits no single device of a large sharded run).
    OnHost(usize),
}

/// Gathers tensors sharded by `owner(name)` (each rank passes in `mine` those it keeps) in
/// buckets of about `bucket_bytes`, in the order of `names`: each of its `dims`, sent as `dtype`.
/// Returns them all where `keep` says (an empty map elsewhere).
#[allow(clippy::too_many_arguments)]
pub fn gather_owned(
    comm: &Comm,
    owner: impl Fn(&str) -> usize,
    names: &[(String, Vec<usize>)],
    mine: &Grads,
    dtype: DType,
    device: &candle_core::Device,
    bucket_bytes: usize,
    keep: Keep,
) -> Result<Grads, CollectiveError> {
    let rank = comm.rank();
    let keeps = match keep {
        Keep::Everywhere => true,
        Keep::OnHost(r) => r == rank,
    };
    let size = dtype.size_in_bytes();
    let mut out = Grads::new();
    let mut bucket: Vec<&(String, Vec<usize>)> = Vec::new();
    let mut bytes = 0;
    let send = |bucket: &mut Vec<&(String, Vec<usize>)>, out: &mut Grads| -> Result<(), CollectiveError> {
        if bucket.is_empty() {
            return Ok(());
        }
        let mut spans = Vec::with_capacity(bucket.len());
        let mut parts = Vec::new();
        for (name, dims) in bucket.iter().map(|e| (&e.0, &e.1)) {
            let len: usize = dims.iter().product();
            let o = owner(name);
            spans.push(Span { len, owner: o });
            if o == rank {
                let t = mine.get(name).ok_or_else(|| {
                    CollectiveError::Mismatch(format!("rank {rank} owns `{name}` but does not hold it"))
                })?;
                parts.push(t.to_device(device)?.to_dtype(dtype)?.flatten_all()?);
            }
        }
        let mine_flat = match parts.len() {
            0 => Tensor::zeros(0, dtype, device)?,
            1 => parts.pop().unwrap_or_else(|| unreachable!()),
            _ => Tensor::cat(&parts, 0)?,
        };
        let all = comm.run(Job::AllGather(mine_flat, spans))?.tensor()?;
        let all = match (keeps, keep) {
            (false, _) => {
                // A rank that keeps nothing waits for each bucket's gather before it starts the
                // next. Running ahead (every bucket queued while the keeper was still writing a
                // checkpoint) made the keeper receive one whole tensor of other values: at 4
                // ranks on H200s, ZeRO-3's final weights had `layers.0.self_attn.o_proj` at 12x
                // its range, the checkpoint saved just before them did not, and a host wait here
                // (or `CUDA_LAUNCH_BLOCKING=1`) made them equal to data parallel's. Costs nothing
                // that matters: the keeper copies every bucket to its host anyway.
                comm.synchronize()?;
                bucket.clear();
                return Ok(());
            }
            (true, Keep::OnHost(_)) => all.to_device(&candle_core::Device::Cpu)?,
            (true, Keep::Everywhere) => all,
        };
        let mut at = 0;
        for (name, dims) in bucket.drain(..).map(|e| (&e.0, &e.1)) {
            let len: usize = dims.iter().product();
            out.insert(name.clone(), all.narrow(0, at, len)?.reshape(dims.as_slice())?);
            at += len;
        }
        Ok(())
    };
    for entry in names {
        bucket.push(entry);
        bytes += entry.1.iter().product::<usize>() * size;
        if bytes >= bucket_bytes {
            send(&mut bucket, &mut out)?;
            bytes = 0;
        }
    }
    send(&mut bucket, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::{Backend, Collective};
    use candle_core::Device;
    use std::sync::{Arc, Mutex};

    /// Rank `rank` of two, inline as NCCL runs: a gather hands back every span, the other rank's
    /// as `-1`; each gather and each wait for the device is logged.
    struct Logged {
        rank: usize,
        log: Arc<Mutex<Vec<&'static str>>>,
    }

    impl Collective for Logged {
        fn rank(&self) -> usize {
            self.rank
        }
        fn world(&self) -> usize {
            2
        }
        fn backend(&self) -> Backend {
            Backend::Nccl
        }
        fn all_reduce(&mut self, _: &Tensor) -> Result<Tensor, CollectiveError> {
            Err(CollectiveError::Mismatch("no all-reduce in a gather".into()))
        }
        fn reduce_scatter(&mut self, _: &Tensor, _: &[Span]) -> Result<Tensor, CollectiveError> {
            Err(CollectiveError::Mismatch("no reduce-scatter in a gather".into()))
        }
        fn all_gather(&mut self, mine: &Tensor, spans: &[Span]) -> Result<Tensor, CollectiveError> {
            self.log.lock().unwrap_or_else(|e| e.into_inner()).push("gather");
            let (mine, mut at, mut all) = (mine.to_vec1::<f32>()?, 0, Vec::new());
            for s in spans {
                if s.owner == self.rank {
                    all.extend_from_slice(&mine[at..at + s.len]);
                    at += s.len;
                } else {
                    all.extend(std::iter::repeat_n(-1.0f32, s.len));
                }
            }
            Ok(Tensor::new(all, &Device::Cpu)?)
        }
        fn all_gather_bytes(&mut self, b: &[u8]) -> Result<Vec<Vec<u8>>, CollectiveError> {
            Ok(vec![b.to_vec(), b.to_vec()])
        }
        fn synchronize(&mut self) -> Result<(), CollectiveError> {
            self.log.lock().unwrap_or_else(|e| e.into_inner()).push("wait");
            Ok(())
        }
    }

    /// Three tensors, each a bucket of its own (4-byte buckets): `a` kept by rank 0, `b` and `c`
    /// by rank 1. Returns what `rank` gets and the log of its collective.
    fn gather(rank: usize, keep: Keep) -> (Grads, Vec<&'static str>) {
        let log = Arc::new(Mutex::new(Vec::new()));
        let comm = Comm::new(Box::new(Logged { rank, log: log.clone() }), false);
        let names: Vec<(String, Vec<usize>)> = [("a", 3), ("b", 2), ("c", 4)].map(|(n, l)| (n.into(), vec![l])).into();
        let owner = |n: &str| usize::from(n != "a");
        let mut mine = Grads::new();
        for (n, dims) in names.iter().filter(|(n, _)| owner(n) == rank) {
            mine.insert(n.clone(), Tensor::ones(dims.as_slice(), DType::F32, &Device::Cpu).unwrap());
        }
        let out = gather_owned(&comm, owner, &names, &mine, DType::F32, &Device::Cpu, 4, keep).unwrap();
        let log = log.lock().unwrap_or_else(|e| e.into_inner()).clone();
        (out, log)
    }

    /// A rank that keeps nothing of a save's gather waits for each bucket before it sends the
    /// next (on four H200s, running ahead left rank 0 with a whole tensor of other values); the
    /// keeper and a gather every rank keeps go on without waiting.
    #[test]
    fn ranks_that_keep_nothing_wait_for_each_bucket_of_a_gathered_save() {
        let (out, log) = gather(1, Keep::OnHost(0));
        assert!(out.is_empty());
        assert_eq!(log, ["gather", "wait", "gather", "wait", "gather", "wait"]);

        let (out, log) = gather(0, Keep::OnHost(0));
        assert_eq!(log, ["gather", "gather", "gather"]);
        assert_eq!(out["a"].to_vec1::<f32>().unwrap(), [1.0; 3]);
        assert_eq!(out["c"].to_vec1::<f32>().unwrap(), [-1.0; 4], "rank 1's span, as the collective gave it");

        let (out, log) = gather(1, Keep::Everywhere);
        assert_eq!(log, ["gather", "gather", "gather"]);
        assert_eq!(out.len(), 3);
        assert_eq!(out["b"].to_vec1::<f32>().unwrap(), [1.0; 2]);
    }
}
