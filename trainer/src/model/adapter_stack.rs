//! Several LoRA adapters over one base, stacked per projection so one batch can mix them
//! (`mindxtrain_kernels::multi_lora`): slot `i` of every stack is adapter `i`.
//!
//! Adapters may differ in rank and targets: the stack's rank is the largest, smaller ones are
//! zero-padded, and a projection an adapter does not target holds zeros in its slot (its rows
//! then get the base alone, as they should).

use std::collections::BTreeMap;

use candle_core::{DType, Device, Tensor};
use mindxtrain_kernels::multi_lora::LoraStack;

use super::lora::Adapters;
use super::params::Proj;
use super::{ModelError, Qwen3Config};

/// The stacked adapters of a served base.
#[derive(Debug, Clone)]
pub struct AdapterStack {
    stacks: BTreeMap<(usize, Proj), LoraStack>,
    slots: usize,
}

impl AdapterStack {
    /// Stacks `adapters` (slot `i` = `adapters[i]`) in `dtype` on `device`.
    pub fn new(
        config: &Qwen3Config,
        adapters: &[&Adapters],
        dtype: DType,
        device: &Device,
    ) -> Result<AdapterStack, ModelError> {
        let slots = adapters.len();
        let r = adapters.iter().map(|a| a.config.r).max().unwrap_or(0);
        let mut stacks = BTreeMap::new();
        for layer in 0..config.num_hidden_layers {
            for proj in Proj::ALL {
                if !adapters.iter().any(|a| a.pair(layer, proj).is_some()) {
                    continue;
                }
                let (out, inp) = proj.shape(config);
                let (mut a_parts, mut b_parts, mut scales) = (Vec::new(), Vec::new(), Vec::new());
                for ad in adapters {
                    let (a, b, s) = match ad.pair(layer, proj) {
                        Some((a, b)) => {
                            let pad = r - ad.config.r;
                            let a = a.to_dtype(dtype)?.to_device(device)?.pad_with_zeros(0, 0, pad)?;
                            let b = b.to_dtype(dtype)?.to_device(device)?.pad_with_zeros(1, 0, pad)?;
                            (a, b, ad.config.scaling())
                        }
                        None => (Tensor::zeros((r, inp), dtype, device)?, Tensor::zeros((out, r), dtype, device)?, 0.0),
                    };
                    a_parts.push(a);
                    b_parts.push(b);
                    scales.push(s);
                }
                let stack = LoraStack { a: Tensor::stack(&a_parts, 0)?, b: Tensor::stack(&b_parts, 0)?, scales };
                stacks.insert((layer, proj), stack);
            }
        }
        Ok(AdapterStack { stacks, slots })
    }

    /// The stack of one projection, if any adapter targets it.
    pub fn get(&self, layer: usize, proj: Proj) -> Option<&LoraStack> {
        self.stacks.get(&(layer, proj))
    }

    pub fn slots(&self) -> usize {
        self.slots
    }
}
