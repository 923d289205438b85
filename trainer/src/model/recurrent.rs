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
}
