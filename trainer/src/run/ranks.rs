//! A session's part in a distributed run: its collective, the layout, who owns what, and the
//! steps between ranks that a single process does not take (agreeing on the record, the sharded
//! optimizer update, gathering sharded state for a checkpoint or an evaluation).

use super::RunError;
use crate::collective::{Backend, CollectiveError};
use crate::model::{CausalLm, Grads};
use crate::optim::{Optimizer, grad_sq_sums, norm_of_sums, state_parameter};
use crate::parallel::{self, Comm, Distributed, Keep, Layout, Owners, Sharding, Trace, gather_owned};
use crate::recipe::Recipe;
use candle_core::{DType, Device, Tensor};
use std::collections::BTreeMap;
use std::path::PathBuf;

impl From<CollectiveError> for RunError {
    fn from(e: CollectiveError) -> RunError {
        RunError::Collective(e)
    }
}

/// Steps traced by default when `MINDXTRAIN_TRACE` is set (`MINDXTRAIN_TRACE_STEPS` changes it).
const TRACED_STEPS: u64 = 5;

/// The distributed side of a session.
pub(super) struct RankState {
    pub comm: Comm,
    pub layout: Layout,
    /// The owner of every sharded tensor (`None` without sharding).
    pub owners: Option<Owners>,
    /// The trained tensors (adapters, or every weight), name and shape, in name order.
    pub trained: Vec<(String, Vec<usize>)>,
    /// ZeRO-3: the shape of every model weight (each rank keeps only its own).
    pub sharded: Vec<(String, Vec<usize>)>,
    pub device: Device,
    pub trace: Option<(Trace, PathBuf)>,
}

impl RankState {
    /// The rank's state before the run's record is known; [`RankState::set_batch`] fills in the
    /// layout's batch, [`RankState::shard`] the owners.
    pub fn new(dist: Distributed, recipe: &Recipe, device: &Device) -> Result<RankState, RunError> {
        // `recipe check` refuses ZeRO-3 for what it does not cover (preference losses, NF4 bases).
        let sharding = recipe.train.distributed.sharding(recipe.train.fsdp);
        let backend = dist.collective.backend();
        let world = dist.collective.world();
        let trace = match std::env::var_os("MINDXTRAIN_TRACE") {
            Some(dir) if !dir.is_empty() => {
                let steps = std::env::var("MINDXTRAIN_TRACE_STEPS").ok().and_then(|s| s.parse().ok());
                let path = PathBuf::from(dir).join(format!("rank-{}.trace.json", dist.collective.rank()));
                Some((Trace::new(steps.unwrap_or(TRACED_STEPS)), path))
            }
            _ => None,
        };
        let layout = Layout {
            world_size: world,
            backend,
            sharding,
            per_device: u64::from(recipe.train.batch.per_device),
            grad_accum: u64::from(recipe.train.batch.grad_accum),
            global_batch: 0,
            bucket_bytes: recipe.train.distributed.bucket_bytes() as u64,
            topology: dist.topology,
        };
        let comm = Comm::new(dist.collective, backend == Backend::Tcp);
        comm.record_timeline(trace.is_some());
        Ok(RankState {
            comm,
            layout,
            owners: None,
            trained: Vec::new(),
            sharded: Vec::new(),
            device: device.clone(),
            trace,
        })
    }

    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    pub fn world(&self) -> usize {
        self.comm.world()
    }

    pub fn sharding(&self) -> Sharding {
        self.layout.sharding
    }

    pub fn bucket_bytes(&self) -> usize {
        self.layout.bucket_bytes as usize
    }

    /// Fixes the run's global batch and this world's accumulation.
    pub fn set_batch(&mut self, global_batch: u64) -> Result<u64, RunError> {
        let accum = parallel::accumulation(global_batch, self.layout.per_device, self.world())
            .map_err(|e| RunError::Recipe(format!("{} rank(s): {e}", self.world())))?;
        self.layout.global_batch = global_batch;
        self.layout.grad_accum = accum;
        Ok(accum)
    }

    /// Checks that every rank holds rank 0's `value` of `what`.
    pub fn agree(&self, what: &str, value: &str) -> Result<(), RunError> {
        parallel::agree(&self.comm, what, value.as_bytes())?;
        Ok(())
    }

    /// Rank 0's bytes on every rank.
    pub fn rank0_value(&self, value: &[u8]) -> Result<Vec<u8>, RunError> {
        Ok(parallel::from_rank0(&self.comm, value)?)
    }

    /// Assigns owners to the trained tensors (ZeRO-1 and up) and, under ZeRO-3, to every model
    /// weight; under ZeRO-3 the model then drops the weights other ranks keep.
    pub fn shard(&mut self, model: &mut CausalLm, trained: &BTreeMap<String, Tensor>) -> Result<(), RunError> {
        self.trained = trained.iter().map(|(n, t)| (n.clone(), t.dims().to_vec())).collect();
        if self.sharding() == Sharding::None {
            return Ok(());
        }
        let mut tensors: BTreeMap<&str, usize> = trained.iter().map(|(n, t)| (n.as_str(), t.elem_count())).collect();
        if self.sharding() == Sharding::Zero3 {
            self.sharded = model.params().iter().map(|(n, t)| (n.clone(), t.dims().to_vec())).collect();
            for (n, t) in model.params() {
                tensors.insert(n.as_str(), t.elem_count());
            }
        }
        let owners = Owners::assign(tensors, self.world());
        if self.sharding() == Sharding::Zero3 {
            let rank = self.rank();
            model.params_mut().retain(|n, _| owners.keeps(n, rank));
        }
        self.owners = Some(owners);
        Ok(())
    }

    /// Whether this rank updates (and keeps the optimizer state of) `name`.
    pub fn updates(&self, name: &str) -> bool {
        self.owners.as_ref().is_none_or(|o| o.keeps(name, self.rank()))
    }

    fn owner_of(&self, name: &str) -> usize {
        self.owners.as_ref().and_then(|o| o.owner(name)).unwrap_or(0)
    }

    /// The optimizer state this rank keeps, out of a whole checkpoint's.
    pub fn own_optimizer_state(&self, state: BTreeMap<String, Tensor>) -> BTreeMap<String, Tensor> {
        state.into_iter().filter(|(k, _)| state_parameter(k).is_none_or(|name| self.updates(name))).collect()
    }

    /// The gradient norm over every rank's share (ZeRO-2/3, where each holds the gradients of
    /// its own tensors): per-tensor sums of squares gathered and added in name order, as one
    /// process adds them.
    pub fn sharded_grad_norm(&self, grads: &Grads) -> Result<f64, RunError> {
        let all = self.comm.gather_f64(&grad_sq_sums(grads)?)?;
        let mut cursor = vec![0usize; self.world()];
        let mut sums = Vec::with_capacity(self.trained.len());
        for (name, _) in &self.trained {
            let o = self.owner_of(name);
            let v = all[o].get(cursor[o]).copied().ok_or_else(|| {
                CollectiveError::Mismatch(format!("rank {o} sent no gradient norm part for `{name}`"))
            })?;
            cursor[o] += 1;
            sums.push(v);
        }
        if let Some((r, _)) = cursor.iter().enumerate().find(|(r, n)| **n != all[*r].len()) {
            return Err(
                CollectiveError::Mismatch(format!("rank {r} sent gradient norm parts for other tensors")).into()
            );
        }
        Ok(norm_of_sums(sums))
    }

    /// The sharded optimizer update: this rank updates the trained tensors it owns in `target`
    /// with their gradients in `grads`; then every rank gets every updated tensor, unless the
    /// tensors are ZeRO-3 weights (kept by their owners only).
    pub fn update(
        &self,
        optimizer: &mut Optimizer,
        target: &mut BTreeMap<String, Tensor>,
        grads: &Grads,
        lr: f64,
    ) -> Result<(), RunError> {
        let mut mine = BTreeMap::new();
        for (name, _) in self.trained.iter().filter(|(n, _)| self.updates(n)) {
            let t = target.remove(name).ok_or_else(|| RunError::Recipe(format!("rank holds no tensor `{name}`")))?;
            mine.insert(name.clone(), t);
        }
        let own_grads: Grads =
            grads.iter().filter(|(n, _)| self.updates(n)).map(|(n, g)| (n.clone(), g.clone())).collect();
        let stepped = optimizer.step(&mut mine, &own_grads, lr);
        target.extend(mine.clone());
        stepped?;
        let zero3_weights = self.sharding() == Sharding::Zero3
            && self.trained.iter().all(|(n, _)| self.sharded.iter().any(|(s, _)| s == n));
        if !zero3_weights {
            let dtype = mine.values().next().or_else(|| target.values().next()).map_or(DType::F32, Tensor::dtype);
            let all = gather_owned(
                &self.comm,
                |n| self.owner_of(n),
                &self.trained,
                &mine,
                dtype,
                &self.device,
                self.bucket_bytes(),
                Keep::Everywhere,
            )?;
            target.extend(all);
        }
        Ok(())
    }

    /// ZeRO-3: every model weight, gathered on rank 0's host (empty on the other ranks, which
    /// take part in the gather).
    pub fn gather_weights(&self, model: &CausalLm) -> Result<Option<BTreeMap<String, Tensor>>, RunError> {
        if self.sharding() != Sharding::Zero3 {
            return Ok(None);
        }
        let all = gather_owned(
            &self.comm,
            |n| self.owner_of(n),
            &self.sharded,
            model.params(),
            model.dtype(),
            &self.device,
            self.bucket_bytes(),
            Keep::OnHost(0),
        )?;
        Ok(Some(all))
    }

    /// The whole optimizer state, as one process would have it, on rank 0's host (empty on the
    /// others); as it is without sharding.
    pub fn gather_optimizer(&self, optimizer: &Optimizer) -> Result<BTreeMap<String, Tensor>, RunError> {
        let local = optimizer.state_tensors()?;
        if self.sharding() == Sharding::None || optimizer.step_count() == 0 {
            return Ok(local);
        }
        // Every rank has stepped every tensor it owns, so each owner holds all of its state.
        let names: Vec<(String, Vec<usize>)> =
            self.trained.iter().flat_map(|(n, dims)| optimizer.state_shapes(n, dims)).collect();
        let owner = |k: &str| state_parameter(k).map_or(0, |n| self.owner_of(n));
        let mut all = gather_owned(
            &self.comm,
            owner,
            &names,
            &local,
            DType::F32,
            &self.device,
            self.bucket_bytes(),
            Keep::OnHost(0),
        )?;
        if let Some(step) = local.get("step") {
            all.insert("step".into(), step.clone());
        }
        Ok(all)
    }
}
