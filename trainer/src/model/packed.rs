//! Projections that read the same input, stored as one matrix for serving: q/k/v (the input
//! norm's output) and gate/up (the post-attention norm's; on a Qwen3.5-MoE sparse layer the
//! shared expert's). A decode step then streams each
//! group's weights in one GEMV instead of three or two, each of which pays its own ramp and
//! drain (k and v at 8 MiB each ran at a third of the copy bandwidth on an H200).
//!
//! Packing keeps one copy of the weights: the group's rows are stacked into one tensor and the
//! separate parameters become row ranges of it (contiguous views), so every other reader of
//! `q_proj` and the rest still finds it by its HF name.

use std::collections::BTreeSet;

use candle_core::Tensor;

use super::params::{Proj, base_weight_name};
use super::{CausalLm, ModelError};

/// A group of projections packed together, in output order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Packing {
    Qkv,
    GateUp,
    SharedGateUp,
}

impl Packing {
    pub const ALL: [Packing; 3] = [Packing::Qkv, Packing::GateUp, Packing::SharedGateUp];

    pub fn members(self) -> &'static [Proj] {
        match self {
            Packing::Qkv => &[Proj::Q, Proj::K, Proj::V],
            Packing::GateUp => &[Proj::Gate, Proj::Up],
            Packing::SharedGateUp => &[Proj::SharedGate, Proj::SharedUp],
        }
    }
}

impl CausalLm {
    /// Packs every group of every layer whose members are all dense (a sparse layer has no
    /// dense gate/up, a Qwen3-MoE one no shared expert either; NF4 weights stay as they are). Nothing to do when packed already;
    /// [`CausalLm::params_mut`] unpacks.
    pub fn pack_projections(&mut self) -> Result<(), ModelError> {
        // Packing is for the serving engine, which runs attention layers only.
        self.check_servable()?;
        if !self.packed.is_empty() {
            return Ok(());
        }
        for layer in 0..self.config.num_hidden_layers {
            for packing in Packing::ALL {
                let names: Vec<String> = packing.members().iter().map(|&p| base_weight_name(layer, p)).collect();
                let Some(parts) = names.iter().map(|n| self.params.get(n)).collect::<Option<Vec<&Tensor>>>() else {
                    continue;
                };
                let packed = Tensor::cat(&parts, 0)?;
                let mut row = 0;
                for name in names {
                    let rows = self.params[&name].dim(0)?;
                    self.params.insert(name, packed.narrow(0, row, rows)?);
                    row += rows;
                }
                self.packed.insert((layer, packing), packed);
            }
        }
        Ok(())
    }

    /// Layer `layer`'s packed `packing` weight `[Σ out, in]`, if packed.
    pub fn packed(&self, layer: usize, packing: Packing) -> Option<&Tensor> {
        self.packed.get(&(layer, packing))
    }

    /// Every packed group, by layer.
    pub fn packed_groups(&self) -> BTreeSet<(usize, Packing)> {
        self.packed.keys().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    #[test]
    fn packing_keeps_every_weight_under_its_name_and_one_copy_of_it() {
        let c = crate::model::tests::tiny(false);
        let mut m = CausalLm::init_random(&c, 7, DType::F32, &Device::Cpu).unwrap();
        let before = m.params().clone();
        m.pack_projections().unwrap();
        for (name, t) in &before {
            let now = &m.params()[name];
            assert_eq!(now.dims(), t.dims(), "{name}");
            assert_eq!(
                now.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
            );
        }
        for layer in 0..c.num_hidden_layers {
            let qkv = m.packed(layer, Packing::Qkv).unwrap();
            let (q, _) = Proj::Q.shape(&c);
            let (kv, _) = Proj::K.shape(&c);
            assert_eq!(qkv.dims(), [q + 2 * kv, c.hidden_size]);
            // The separate k is a view of the packed rows q..q+kv, not a second copy.
            let k = &m.params()[&base_weight_name(layer, Proj::K)];
            let (ks, _) = k.storage_and_layout();
            let (ps, _) = qkv.storage_and_layout();
            assert!(std::ptr::eq(&*ks, &*ps), "layer {layer}: k_proj is not a view of the packed q/k/v");
            assert_eq!(m.packed(layer, Packing::GateUp).unwrap().dim(0).unwrap(), 2 * c.intermediate_size);
        }
    }

    /// A Qwen3.5-MoE sparse layer packs its shared expert's gate/up, and has no dense MLP to pack.
    #[test]
    fn a_moe_hybrid_packs_its_shared_expert() {
        let c = crate::model::qwen3_5::moe_tests::tiny_hybrid_moe();
        let mut m = CausalLm::init_random(&c, 7, DType::F32, &Device::Cpu).unwrap();
        m.pack_projections().unwrap();
        for layer in 0..c.num_hidden_layers {
            assert!(m.packed(layer, Packing::GateUp).is_none());
            let shared = m.packed(layer, Packing::SharedGateUp).expect("shared gate/up packed");
            assert_eq!(shared.dims(), [2 * c.intermediate_size, c.hidden_size]);
            let up = &m.params()[&base_weight_name(layer, Proj::SharedUp)];
            let want = shared.narrow(0, c.intermediate_size, c.intermediate_size).unwrap();
            assert_eq!(up.to_vec2::<f32>().unwrap(), want.to_vec2::<f32>().unwrap());
        }
    }
}
