//! The adapters served over one base: named LoRA slots, loaded and evicted by name, stacked for
//! the multi-LoRA kernel so a batch mixes them row by row.

use std::collections::BTreeSet;

use candle_core::{DType, Device};

use crate::model::{AdapterStack, Adapters, LmConfig, ModelError, Packing};

struct Slot {
    name: String,
    /// Never reused: the prefix cache tells blocks of different adapters apart by it.
    uid: u64,
    adapters: Adapters,
}

/// The served adapters, in slot order.
pub struct AdapterSlots {
    config: LmConfig,
    dtype: DType,
    device: Device,
    /// The groups the base packs: their adapters are stacked per group.
    packed: BTreeSet<(usize, Packing)>,
    max: usize,
    slots: Vec<Slot>,
    stack: Option<AdapterStack>,
    next_uid: u64,
}

/// Why an adapter could not be loaded or found.
#[derive(Debug, thiserror::Error)]
pub enum AdapterError {
    #[error("no adapter {0:?} is served here")]
    Unknown(String),
    #[error("adapter {0:?} is already served")]
    Exists(String),
    #[error("{max} adapters are served already (the engine's limit); evict one first")]
    Full { max: usize },
    #[error("adapter {name:?}: {source}")]
    Model { name: String, source: ModelError },
    #[error(
        "adapter {0:?} adapts the experts of sparse layers, which the engine serves only merged into the base \
         (`mindxtrain serve --merge`, or `mindxtrain export --merge`)"
    )]
    OnExperts(String),
}

impl AdapterSlots {
    /// Slots for adapters over `base`, at most `max` of them.
    pub fn new(base: &crate::model::CausalLm, max: usize) -> AdapterSlots {
        AdapterSlots {
            config: base.config().clone(),
            dtype: base.dtype(),
            device: base.device().clone(),
            packed: base.packed_groups(),
            max,
            slots: Vec::new(),
            stack: None,
            next_uid: 1,
        }
    }

    /// Serves `adapters` under `name` (checked against the base's shape).
    pub fn load(&mut self, name: &str, adapters: Adapters) -> Result<(), AdapterError> {
        if self.slots.iter().any(|s| s.name == name) {
            return Err(AdapterError::Exists(name.into()));
        }
        if self.slots.len() >= self.max {
            return Err(AdapterError::Full { max: self.max });
        }
        let model = |source| AdapterError::Model { name: name.into(), source };
        // The batched per-row adapter kernels cover the projections, not the grouped expert
        // GEMMs: an expert adapter served unmerged would silently give the base's experts.
        if adapters.adapts_experts(&self.config) {
            return Err(AdapterError::OnExperts(name.into()));
        }
        // The names and shapes must be those of this base.
        let checked = Adapters::new(&self.config, adapters.config.clone(), adapters.tensors.clone()).map_err(model)?;
        self.slots.push(Slot { name: name.into(), uid: self.next_uid, adapters: checked });
        self.next_uid += 1;
        self.restack().map_err(model)
    }

    /// Stops serving `name`. The caller makes sure no running request uses it.
    pub fn evict(&mut self, name: &str) -> Result<(), AdapterError> {
        let i = self.slots.iter().position(|s| s.name == name).ok_or_else(|| AdapterError::Unknown(name.into()))?;
        self.slots.remove(i);
        self.restack().map_err(|source| AdapterError::Model { name: name.into(), source })
    }

    fn restack(&mut self) -> Result<(), ModelError> {
        let all: Vec<&Adapters> = self.slots.iter().map(|s| &s.adapters).collect();
        let packed = |layer, g| self.packed.contains(&(layer, g));
        self.stack = if all.is_empty() {
            None
        } else {
            Some(AdapterStack::new(&self.config, &all, (self.dtype, &self.device), packed)?)
        };
        Ok(())
    }

    /// `name`'s slot and prefix-cache tag.
    pub fn find(&self, name: &str) -> Result<(u32, u64), AdapterError> {
        self.slots
            .iter()
            .position(|s| s.name == name)
            .map(|i| (i as u32, self.slots[i].uid))
            .ok_or_else(|| AdapterError::Unknown(name.into()))
    }

    /// The adapters served as `name`.
    pub fn adapters(&self, name: &str) -> Result<&Adapters, AdapterError> {
        self.slots
            .iter()
            .find(|s| s.name == name)
            .map(|s| &s.adapters)
            .ok_or_else(|| AdapterError::Unknown(name.into()))
    }

    /// The current slot of the adapter loaded with `uid` (slots move when another is evicted).
    pub fn slot_of(&self, uid: u64) -> Option<u32> {
        self.slots.iter().position(|s| s.uid == uid).map(|i| i as u32)
    }

    /// The served names, in slot order.
    pub fn names(&self) -> Vec<String> {
        self.slots.iter().map(|s| s.name.clone()).collect()
    }

    pub fn stack(&self) -> Option<&AdapterStack> {
        self.stack.as_ref()
    }
}
