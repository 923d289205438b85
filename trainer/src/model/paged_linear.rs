//! The serving engine's pass of a Gated DeltaNet layer over a step's rows, its sequences' states
//! in their slots of the layer's [`StatePool`], read and written on the model's device.
//!
//! The sequences that decode one token run as one batch: their states are gathered from their
//! slots (zeroed for a sequence whose first token this is), advanced one token by the kernels'
//! `step` (`[k, 1, ..]`), and scattered back, so a decode step costs a handful of launches per
//! layer whatever its batch, and reads its slots from device memory (a CUDA graph replays it).
//! A prompt chunk of several tokens runs on its own from its slot's state, or from zeros at the
//! sequence's first token, so a new, preempted or recomputed sequence never reads its slot's
//! last owner. The plan ([`StateStep`]) is made once per step and serves every recurrent layer.

use candle_core::{Device, Tensor};
use mindxtrain_kernels::paged_attention::PagedMeta;

use super::linear_attention::LinearInputs;
use super::recurrent::StatePool;
use super::{CausalLm, ModelError};

/// Where a step's sequences keep their recurrent states ([`super::PagedInputs::state_slots`]).
#[derive(Debug, Clone, Copy)]
pub enum StateSlots<'a> {
    /// Each sequence's slot, in the order of the step's metadata (a direct step: prefill chunks
    /// and decodes in any mix).
    Host(&'a [u32]),
    /// A decode step replayed as a CUDA graph, one row per sequence: `[R]` u32 slots and `[R]`
    /// u32 flags, 0 where the row is its sequence's first token (its state: zeros), read from
    /// the step's buffer so that a replay needs nothing from the host.
    Device { slots: &'a Tensor, continues: &'a Tensor },
}

impl StateSlots<'_> {
    /// The sequences named.
    pub(super) fn len(&self) -> usize {
        match self {
            StateSlots::Host(s) => s.len(),
            StateSlots::Device { slots, .. } => slots.elem_count(),
        }
    }
}

/// How a step's sequences reach their recurrent states.
pub(super) struct StateStep {
    /// The sequences that decode one token, advanced together.
    batch: Option<DecodeGroup>,
    /// The others (prompt chunks of several tokens), one by one.
    chunks: Vec<Chunk>,
    /// `[N]` u32: where each of the step's rows sits in `[batch rows | chunk rows]`, when that
    /// is not the step's own order (a step of decodes only keeps it).
    order: Option<Tensor>,
    /// Every slot named on the host, for the range check against each pool.
    slots: Vec<u32>,
}

struct DecodeGroup {
    /// `[k]` u32 state slots.
    slots: Tensor,
    /// `[k]` u32 flags, 0 where the sequence starts here (none when every one continues).
    continues: Option<Tensor>,
    /// `[k]` u32 rows of the step, when not all of them in order.
    rows: Option<Tensor>,
    count: usize,
}

struct Chunk {
    first: usize,
    rows: usize,
    slot: usize,
    /// Whether the chunk starts at the sequence's first token (its state: zeros).
    fresh: bool,
}

impl StateStep {
    /// The plan for the sequences of `meta` holding state slots `slots` (in `meta`'s order).
    pub(super) fn new(meta: &PagedMeta, slots: StateSlots<'_>, device: &Device) -> Result<StateStep, ModelError> {
        if slots.len() != meta.sequences() {
            return Err(ModelError::Batch(format!("{} state slots for {} sequences", slots.len(), meta.sequences())));
        }
        let slots = match slots {
            StateSlots::Host(s) => s,
            StateSlots::Device { slots, continues } => {
                let group = DecodeGroup {
                    slots: slots.clone(),
                    continues: Some(continues.clone()),
                    rows: None,
                    count: slots.elem_count(),
                };
                return Ok(StateStep { batch: Some(group), chunks: Vec::new(), order: None, slots: Vec::new() });
            }
        };
        let (mut decode_rows, mut decode_slots, mut continues, mut chunks) = (vec![], vec![], vec![], vec![]);
        for (s, &slot) in slots.iter().enumerate() {
            let (first, rows, context, _) = meta.seq(s);
            match rows {
                1 => {
                    decode_rows.push(first as u32);
                    decode_slots.push(slot);
                    continues.push(u32::from(context > 1));
                }
                _ => chunks.push(Chunk { first, rows, slot: slot as usize, fresh: context == rows }),
            }
        }
        // The rows in the order the layer computes them: the batch's, then each chunk's.
        let computed: Vec<u32> = decode_rows
            .iter()
            .copied()
            .chain(chunks.iter().flat_map(|c| c.first as u32..(c.first + c.rows) as u32))
            .collect();
        let in_order = computed.iter().enumerate().all(|(i, &r)| r as usize == i);
        let order = match in_order {
            true => None,
            false => {
                let mut at = vec![0u32; computed.len()];
                for (i, &row) in computed.iter().enumerate() {
                    at[row as usize] = i as u32;
                }
                Some(Tensor::new(at.as_slice(), device)?)
            }
        };
        let count = decode_rows.len();
        let batch = match count {
            0 => None,
            _ => Some(DecodeGroup {
                slots: Tensor::new(decode_slots.as_slice(), device)?,
                continues: match continues.contains(&0) {
                    true => Some(Tensor::new(continues.as_slice(), device)?),
                    false => None,
                },
                rows: match chunks.is_empty() && in_order {
                    true => None,
                    false => Some(Tensor::new(decode_rows.as_slice(), device)?),
                },
                count,
            }),
        };
        Ok(StateStep { batch, chunks, order, slots: slots.to_vec() })
    }
}

impl CausalLm {
    /// Layer `layer`'s mixer over the step's normed rows `h1`, their projections made by
    /// `project` (each row with its adapter): every sequence advanced from the state in its slot
    /// of `pool`, the new states written back in place. Returns `out_proj`'s input
    /// `[N, value_dim]` in the step's row order.
    pub(super) fn paged_linear(
        &self,
        layer: usize,
        h1: &Tensor,
        project: impl FnMut(super::Proj, &Tensor) -> candle_core::Result<Tensor>,
        plan: &StateStep,
        pool: &StatePool,
    ) -> Result<Tensor, ModelError> {
        if let Some(&slot) = plan.slots.iter().find(|&&s| s as usize >= pool.slots()) {
            return Err(ModelError::Batch(format!("state slot {slot} of {}", pool.slots())));
        }
        let all = LinearInputs::project(h1, project)?;
        let mut parts = Vec::with_capacity(plan.chunks.len() + 1);
        if let Some(g) = &plan.batch {
            let inputs = match &g.rows {
                Some(rows) => all.select(rows)?,
                None => all.rows(0, g.count)?,
            };
            let state = match &g.continues {
                Some(continues) => pool.gather(&g.slots)?.restarted(continues)?,
                None => pool.gather(&g.slots)?,
            };
            let (mixed, next) = self.linear_step(layer, &inputs, (g.count, 1), Some(&state))?;
            pool.scatter(&g.slots, &next)?;
            parts.push(mixed);
        }
        for c in &plan.chunks {
            let state = match c.fresh {
                true => None,
                false => Some(pool.read(c.slot)?),
            };
            let (mixed, next) = self.linear_step(layer, &all.rows(c.first, c.rows)?, (1, c.rows), state.as_ref())?;
            pool.write(c.slot, &next)?;
            parts.push(mixed);
        }
        let mixed = match parts.len() {
            1 => parts.remove(0),
            _ => Tensor::cat(&parts, 0)?,
        };
        Ok(match &plan.order {
            Some(at) => mixed.index_select(at, 0)?,
            None => mixed,
        })
    }
}
