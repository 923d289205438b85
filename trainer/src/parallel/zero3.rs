//! ZeRO-3 / FSDP: a rank keeps only the weights it owns; each block's weights are gathered just
//! before the block runs (forward, and again in the backward) and dropped right after, while the
//! next block's are already on their way (prefetch). The embedding, final norm and head are
//! gathered once per step and kept for its length (the head and the embedding are needed at both
//! ends of the pass).

use super::comm::{Comm, Job, Ticket};
use super::owners::Owners;
use crate::collective::{CollectiveError, Span};
use crate::model::{Grads, ModelError, Stage, stage_of};
use candle_core::{DType, Device, Tensor};
use std::cell::RefCell;
use std::collections::BTreeMap;

/// A tensor of the model as the gather lays it out.
#[derive(Debug, Clone)]
struct Slot {
    name: String,
    dims: Vec<usize>,
    len: usize,
    owner: usize,
}

/// The sharded weights of one step, gathered stage by stage.
pub struct Zero3Window<'a> {
    comm: &'a Comm,
    rank: usize,
    local: &'a Grads,
    stages: BTreeMap<Stage, Vec<Slot>>,
    layers: usize,
    dtype: DType,
    device: Device,
    gathered: RefCell<BTreeMap<String, Tensor>>,
    inflight: RefCell<BTreeMap<Stage, Ticket>>,
}

fn model_err(e: CollectiveError) -> ModelError {
    ModelError::Batch(format!("gathering sharded weights: {e}"))
}

impl<'a> Zero3Window<'a> {
    /// `shapes`: every sharded weight of the model; `local`: the ones this rank keeps. Gathers
    /// the embedding, final norm and head now and starts block 0's.
    pub fn open(
        comm: &'a Comm,
        owners: &Owners,
        shapes: &BTreeMap<String, Vec<usize>>,
        local: &'a Grads,
        layers: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Zero3Window<'a>, ModelError> {
        let mut stages: BTreeMap<Stage, Vec<Slot>> = BTreeMap::new();
        for (name, dims) in shapes {
            let Some(owner) = owners.owner(name) else { continue };
            let outer = match stage_of(name) {
                Stage::Block(l) => Stage::Block(l),
                // The head and the embedding are gathered together, once per step.
                _ => Stage::Head,
            };
            let len = dims.iter().product();
            stages.entry(outer).or_default().push(Slot { name: name.clone(), dims: dims.clone(), len, owner });
        }
        let w = Zero3Window {
            comm,
            rank: comm.rank(),
            local,
            stages,
            layers,
            dtype,
            device: device.clone(),
            gathered: RefCell::new(BTreeMap::new()),
            inflight: RefCell::new(BTreeMap::new()),
        };
        w.fetch(Stage::Head)?;
        w.prefetch(Stage::Block(0));
        Ok(w)
    }

    fn start(&self, stage: Stage) -> Result<Option<Ticket>, CollectiveError> {
        let Some(slots) = self.stages.get(&stage) else { return Ok(None) };
        let spans: Vec<Span> = slots.iter().map(|s| Span { len: s.len, owner: s.owner }).collect();
        let mut parts = Vec::new();
        for s in slots.iter().filter(|s| s.owner == self.rank) {
            let t = self.local.get(&s.name).ok_or_else(|| {
                CollectiveError::Mismatch(format!("rank {} owns `{}` but does not hold it", self.rank, s.name))
            })?;
            parts.push(t.to_dtype(self.dtype)?.flatten_all()?);
        }
        let mine = match parts.len() {
            0 => Tensor::zeros(0, self.dtype, &self.device)?,
            1 => parts.pop().unwrap_or_else(|| unreachable!()),
            _ => Tensor::cat(&parts, 0)?,
        };
        Ok(Some(self.comm.submit(Job::AllGather(mine, spans))))
    }

    /// Starts gathering `stage` unless it is here or on its way.
    fn prefetch(&self, stage: Stage) {
        let known = self.inflight.borrow().contains_key(&stage)
            || self.stages.get(&stage).is_none_or(|s| s.iter().all(|s| self.gathered.borrow().contains_key(&s.name)));
        if known {
            return;
        }
        // An error here recurs (and is reported) when the stage is waited for.
        if let Ok(Some(t)) = self.start(stage) {
            self.inflight.borrow_mut().insert(stage, t);
        }
    }

    /// Makes `stage`'s weights available (waiting for its gather).
    fn fetch(&self, stage: Stage) -> Result<(), ModelError> {
        let Some(slots) = self.stages.get(&stage) else { return Ok(()) };
        if slots.iter().all(|s| self.gathered.borrow().contains_key(&s.name)) {
            return Ok(());
        }
        let ticket = self.inflight.borrow_mut().remove(&stage);
        let ticket = match ticket {
            Some(t) => t,
            None => match self.start(stage).map_err(model_err)? {
                Some(t) => t,
                None => return Ok(()),
            },
        };
        let all = self.comm.wait(ticket).map_err(model_err)?.tensor().map_err(model_err)?;
        let mut at = 0;
        let mut g = self.gathered.borrow_mut();
        for s in slots {
            g.insert(s.name.clone(), all.narrow(0, at, s.len)?.reshape(s.dims.as_slice())?);
            at += s.len;
        }
        Ok(())
    }

    fn release(&self, stage: Stage) {
        if let Some(slots) = self.stages.get(&stage) {
            let mut g = self.gathered.borrow_mut();
            for s in slots {
                g.remove(&s.name);
            }
        }
    }

    pub fn weight(&self, name: &str) -> Option<Tensor> {
        self.gathered.borrow().get(name).cloned()
    }

    pub fn enter(&self, stage: Stage, backward: bool) -> Result<(), ModelError> {
        let Stage::Block(l) = stage else { return Ok(()) };
        self.fetch(stage)?;
        let next = if backward { l.checked_sub(1) } else { Some(l + 1).filter(|&n| n < self.layers) };
        if let Some(n) = next {
            self.prefetch(Stage::Block(n));
        }
        Ok(())
    }

    pub fn leave(&self, stage: Stage, _backward: bool) -> Result<(), ModelError> {
        if let Stage::Block(_) = stage {
            self.release(stage);
        }
        Ok(())
    }

    /// Waits for gathers still in flight (a prefetch nobody used), so that every rank's queue of
    /// collectives stays in step.
    pub fn close(self) -> Result<(), ModelError> {
        let tickets: Vec<Ticket> = self.inflight.borrow_mut().values().copied().collect();
        for t in tickets {
            self.comm.wait(t).map_err(model_err)?;
        }
        Ok(())
    }
}
