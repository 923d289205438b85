//! What a Gated DeltaNet layer keeps for a sequence while it generates ([`LayerSpec::Recurrent`]):
//! the causal conv's last inputs and the delta rule's state, the same size at any length.
//! Dense decoding holds one [`RecurrentState`] per layer; the serving engine a [`StatePool`] per
//! layer, one slot per running sequence, written in place as a step advances it.

use candle_core::{DType, Device, Tensor};

use super::ModelError;
use super::cache_spec::{LayerSpec, state_dtype};

/// The state of `B` sequences for one layer: conv `[B, conv_channels, conv_kernel − 1]` (model
/// dtype), rule `[B, heads, key_dim, value_dim]` ([`state_dtype`]).
#[derive(Debug, Clone)]
pub struct RecurrentState {
    pub conv: Tensor,
    pub rule: Tensor,
}

impl RecurrentState {
    /// The states with row `i` zeroed where `continues[i]` (`[B]` u32) is 0: the rows of
    /// sequences whose first token a step runs, on the device (`where`, not a product, so a
    /// slot's stale values never leak, not even as NaN).
    pub fn restarted(&self, continues: &Tensor) -> Result<RecurrentState, ModelError> {
        let zeroed = |t: &Tensor| -> candle_core::Result<Tensor> {
            let mut rows = vec![1; t.rank()];
            rows[0] = t.dim(0)?;
            continues.reshape(rows)?.broadcast_as(t.shape())?.where_cond(t, &t.zeros_like()?)
        };
        Ok(RecurrentState { conv: zeroed(&self.conv)?, rule: zeroed(&self.rule)? })
    }
}

/// The two shapes of a recurrent spec for `b` sequences, or `None` for an attention spec.
fn shapes(spec: &LayerSpec, b: usize) -> Option<([usize; 3], [usize; 4])> {
    match *spec {
        LayerSpec::Recurrent { conv_channels, conv_kernel, heads, key_dim, value_dim } => {
            Some(([b, conv_channels, conv_kernel.saturating_sub(1)], [b, heads, key_dim, value_dim]))
        }
        LayerSpec::Attention { .. } => None,
    }
}

impl RecurrentState {
    /// Zeros for `b` sequences: the state before a sequence's first token.
    pub fn zeros(spec: &LayerSpec, b: usize, dtype: DType, device: &Device) -> Result<RecurrentState, ModelError> {
        let (conv, rule) =
            shapes(spec, b).ok_or_else(|| ModelError::Batch("a recurrent state for an attention layer".into()))?;
        Ok(RecurrentState {
            conv: Tensor::zeros(conv.as_slice(), dtype, device)?,
            rule: Tensor::zeros(rule.as_slice(), state_dtype(dtype), device)?,
        })
    }
}

/// One layer's state slots in the serving engine: a [`RecurrentState`] of `slots` rows, allocated
/// once, each row a running sequence's (its slot, `infer::kv::KvManager::state_slot`).
#[derive(Debug)]
pub struct StatePool {
    states: RecurrentState,
}

impl StatePool {
    pub fn new(spec: &LayerSpec, slots: usize, dtype: DType, device: &Device) -> Result<StatePool, ModelError> {
        Ok(StatePool { states: RecurrentState::zeros(spec, slots, dtype, device)? })
    }

    pub fn slots(&self) -> usize {
        self.states.conv.dims()[0]
    }

    /// Slot `slot`'s state (one sequence).
    pub fn read(&self, slot: usize) -> Result<RecurrentState, ModelError> {
        self.check(slot)?;
        // Copies: the slot is overwritten in place after the step that reads it.
        let row = |t: &Tensor| t.narrow(0, slot, 1)?.copy();
        Ok(RecurrentState { conv: row(&self.states.conv)?, rule: row(&self.states.rule)? })
    }

    /// Stores one sequence's `state` in slot `slot`, in place.
    pub fn write(&self, slot: usize, state: &RecurrentState) -> Result<(), ModelError> {
        self.check(slot)?;
        let same = |pool: &Tensor, s: &Tensor| s.dims()[1..] == pool.dims()[1..] && s.dims()[0] == 1;
        if !same(&self.states.conv, &state.conv) || !same(&self.states.rule, &state.rule) {
            return Err(ModelError::Batch(format!(
                "recurrent state {:?} / {:?} for slots {:?} / {:?}",
                state.conv.dims(),
                state.rule.dims(),
                self.states.conv.dims(),
                self.states.rule.dims()
            )));
        }
        self.states.conv.slice_set(&state.conv.to_dtype(self.states.conv.dtype())?, 0, slot)?;
        self.states.rule.slice_set(&state.rule.to_dtype(self.states.rule.dtype())?, 0, slot)?;
        Ok(())
    }

    /// The states of slots `slots` (`[k]` u32 on the pool's device), gathered on the device: a
    /// decode step's sequences advanced together.
    pub fn gather(&self, slots: &Tensor) -> Result<RecurrentState, ModelError> {
        Ok(RecurrentState {
            conv: self.states.conv.index_select(slots, 0)?,
            rule: self.states.rule.index_select(slots, 0)?,
        })
    }

    /// Stores `state`'s row `i` in slot `slots[i]`, in place, on the device (the slots distinct,
    /// as a step's sequences' are).
    pub fn scatter(&self, slots: &Tensor, state: &RecurrentState) -> Result<(), ModelError> {
        let k = slots.elem_count();
        let pairs = [(&self.states.conv, &state.conv), (&self.states.rule, &state.rule)];
        if let Some((pool, s)) = pairs.iter().find(|(pool, s)| s.dims()[1..] != pool.dims()[1..] || s.dims()[0] != k) {
            return Err(ModelError::Batch(format!(
                "{k} state slots for states {:?} of a pool {:?}",
                s.dims(),
                pool.dims()
            )));
        }
        for (pool, s) in pairs {
            // candle's scatter reads one index per element: each slot spread over its row.
            let per_row: usize = s.dims()[1..].iter().product();
            let index = slots.reshape((k, 1))?.broadcast_as((k, per_row))?.contiguous()?.reshape(s.dims())?;
            pool.scatter_set(&index, &s.to_dtype(pool.dtype())?.contiguous()?, 0)?;
        }
        Ok(())
    }

    fn check(&self, slot: usize) -> Result<(), ModelError> {
        match slot < self.slots() {
            true => Ok(()),
            false => Err(ModelError::Batch(format!("state slot {slot} of {}", self.slots()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_keeps_what_was_written_and_leaves_the_others() {
        let spec = LayerSpec::Recurrent { conv_channels: 5, conv_kernel: 3, heads: 2, key_dim: 4, value_dim: 3 };
        let pool = StatePool::new(&spec, 3, DType::F32, &Device::Cpu).unwrap();
        let fresh = RecurrentState {
            conv: Tensor::randn(0f32, 1.0, (1, 5, 2), &Device::Cpu).unwrap(),
            rule: Tensor::randn(0f32, 1.0, (1, 2, 4, 3), &Device::Cpu).unwrap(),
        };
        pool.write(1, &fresh).unwrap();
        let sum = |t: &Tensor| t.abs().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap();
        let back = pool.read(1).unwrap();
        assert_eq!(sum(&(&back.conv - &fresh.conv).unwrap()), 0.0);
        assert_eq!(sum(&(&back.rule - &fresh.rule).unwrap()), 0.0);
        for other in [0, 2] {
            let s = pool.read(other).unwrap();
            assert_eq!(sum(&s.conv) + sum(&s.rule), 0.0, "slot {other} was written");
        }
        assert!(pool.read(3).is_err());
        let wrong = RecurrentState { conv: fresh.rule.clone(), rule: fresh.conv.clone() };
        assert!(pool.write(0, &wrong).is_err());
    }

    /// Gathering slots 2 and 0 reads what was written there, and scattering two fresh states
    /// into slots 0 and 2 leaves slot 1 as it was: the batched decode step's reads and writes.
    #[test]
    fn gathered_and_scattered_slots_are_the_ones_named() {
        let spec = LayerSpec::Recurrent { conv_channels: 5, conv_kernel: 3, heads: 2, key_dim: 4, value_dim: 3 };
        let dev = Device::Cpu;
        let pool = StatePool::new(&spec, 3, DType::F32, &dev).unwrap();
        let random = |b: usize| RecurrentState {
            conv: Tensor::randn(0f32, 1.0, (b, 5, 2), &dev).unwrap(),
            rule: Tensor::randn(0f32, 1.0, (b, 2, 4, 3), &dev).unwrap(),
        };
        let gap =
            |a: &Tensor, b: &Tensor| (a - b).unwrap().abs().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap();
        let each: Vec<RecurrentState> = (0..3).map(|_| random(1)).collect();
        for (slot, s) in each.iter().enumerate() {
            pool.write(slot, s).unwrap();
        }
        let got = pool.gather(&Tensor::new(&[2u32, 0], &dev).unwrap()).unwrap();
        for (row, slot) in [(0, 2), (1, 0)] {
            assert_eq!(gap(&got.conv.narrow(0, row, 1).unwrap(), &each[slot].conv), 0.0);
            assert_eq!(gap(&got.rule.narrow(0, row, 1).unwrap(), &each[slot].rule), 0.0);
        }
        let next = random(2);
        pool.scatter(&Tensor::new(&[2u32, 0], &dev).unwrap(), &next).unwrap();
        for (slot, row) in [(2, 0), (0, 1)] {
            let s = pool.read(slot).unwrap();
            assert_eq!(gap(&s.conv, &next.conv.narrow(0, row, 1).unwrap()), 0.0, "slot {slot}");
            assert_eq!(gap(&s.rule, &next.rule.narrow(0, row, 1).unwrap()), 0.0, "slot {slot}");
        }
        let kept = pool.read(1).unwrap();
        assert_eq!(gap(&kept.conv, &each[1].conv) + gap(&kept.rule, &each[1].rule), 0.0, "slot 1 was written");
        assert!(pool.scatter(&Tensor::new(&[1u32], &dev).unwrap(), &next).is_err(), "one slot for two states");
        // Row 0 restarts (zeros), row 1 keeps its state.
        let restarted = next.restarted(&Tensor::new(&[0u32, 1], &dev).unwrap()).unwrap();
        let sum = |t: &Tensor| t.abs().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap();
        assert_eq!(sum(&restarted.conv.get(0).unwrap()) + sum(&restarted.rule.get(0).unwrap()), 0.0);
        assert_eq!(gap(&restarted.conv.get(1).unwrap(), &next.conv.get(1).unwrap()), 0.0);
        assert_eq!(gap(&restarted.rule.get(1).unwrap(), &next.rule.get(1).unwrap()), 0.0);
    }
}
