//! Several LoRA adapters over one base, stacked per projection so one batch can mix them
//! (`mindxtrain_kernels::multi_lora`): slot `i` of every stack is adapter `i`.
//!
//! Adapters may differ in rank and targets: the stack's rank is the largest, smaller ones are
//! zero-padded, and a projection an adapter does not target holds zeros in its slot (its rows
//! then get the base alone, as they should).
//!
//! Where the base packs a group of projections into one weight ([`Packing`]), the group gets
//! one stack: each member's `A` stacked along the rank, its `B` along the output, and member
//! `i`'s output rows read only its own rank columns (`LoraStack::member_rows`). The branch then
//! adds exactly what the members' own branches would, with the packed GEMM.

use std::collections::BTreeMap;

use candle_core::{DType, Device, Tensor};
use mindxtrain_kernels::multi_lora::LoraStack;

use super::lora::Adapters;
use super::packed::Packing;
use super::params::Proj;
use super::{LmConfig, ModelError};

/// What one stack adapts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Target {
    Proj(Proj),
    Group(Packing),
}

/// The stacked adapters of a served base.
#[derive(Debug, Clone)]
pub struct AdapterStack {
    stacks: BTreeMap<(usize, Target), LoraStack>,
    slots: usize,
}

/// What every stack shares: the model's shapes, the stacks' rank, dtype and device.
struct Layout<'a> {
    config: &'a LmConfig,
    r: usize,
    dtype: DType,
    device: &'a Device,
}

impl Layout<'_> {
    /// `ad`'s `A` `[r, in]` and `B` `[out, r]` of one projection, zero-padded to the stack's
    /// rank, or zeros where it does not target it; and whether it does.
    fn member(&self, ad: &Adapters, layer: usize, proj: Proj) -> Result<(Tensor, Tensor, bool), ModelError> {
        let (out, inp) = proj.shape(self.config);
        Ok(match ad.pair(layer, proj) {
            Some((a, b)) => {
                let pad = self.r - ad.config.r;
                let a = a.to_dtype(self.dtype)?.to_device(self.device)?.pad_with_zeros(0, 0, pad)?;
                let b = b.to_dtype(self.dtype)?.to_device(self.device)?.pad_with_zeros(1, 0, pad)?;
                (a, b, true)
            }
            None => (
                Tensor::zeros((self.r, inp), self.dtype, self.device)?,
                Tensor::zeros((out, self.r), self.dtype, self.device)?,
                false,
            ),
        })
    }

    /// The stack of `members` (one projection, or a packed group in output order), if any
    /// adapter targets one of them.
    fn stack(&self, adapters: &[&Adapters], layer: usize, members: &[Proj]) -> Result<Option<LoraStack>, ModelError> {
        if !adapters.iter().any(|a| members.iter().any(|&p| a.pair(layer, p).is_some())) {
            return Ok(None);
        }
        let (mut a_parts, mut b_parts, mut scales) = (Vec::new(), Vec::new(), Vec::new());
        for ad in adapters {
            let (mut a_rows, mut b_rows, mut any) = (Vec::new(), Vec::new(), false);
            for &proj in members {
                let (a, b, targeted) = self.member(ad, layer, proj)?;
                a_rows.push(a);
                b_rows.push(b);
                any |= targeted;
            }
            a_parts.push(Tensor::cat(&a_rows, 0)?);
            b_parts.push(Tensor::cat(&b_rows, 0)?);
            scales.push(if any { ad.config.scaling() } else { 0.0 });
        }
        let member_rows = members.iter().map(|p| p.shape(self.config).0).collect();
        Ok(Some(LoraStack { a: Tensor::stack(&a_parts, 0)?, b: Tensor::stack(&b_parts, 0)?, scales, member_rows }))
    }
}

impl AdapterStack {
    /// Stacks `adapters` (slot `i` = `adapters[i]`) in `dtype` on `device`, one stack per
    /// group of each layer that `packed` says the base packs and one per other projection.
    pub fn new(
        config: &LmConfig,
        adapters: &[&Adapters],
        (dtype, device): (DType, &Device),
        packed: impl Fn(usize, Packing) -> bool,
    ) -> Result<AdapterStack, ModelError> {
        let layout = Layout { config, r: adapters.iter().map(|a| a.config.r).max().unwrap_or(0), dtype, device };
        let mut stacks = BTreeMap::new();
        for layer in 0..config.num_hidden_layers {
            let groups: Vec<Packing> = Packing::ALL.into_iter().filter(|&g| packed(layer, g)).collect();
            for proj in Proj::of_layer(config, layer) {
                if groups.iter().any(|g| g.members().contains(&proj)) {
                    continue;
                }
                if let Some(s) = layout.stack(adapters, layer, &[proj])? {
                    stacks.insert((layer, Target::Proj(proj)), s);
                }
            }
            for g in groups {
                if let Some(s) = layout.stack(adapters, layer, g.members())? {
                    stacks.insert((layer, Target::Group(g)), s);
                }
            }
        }
        Ok(AdapterStack { stacks, slots: adapters.len() })
    }

    /// The stack of one projection the base does not pack, if any adapter targets it.
    pub fn get(&self, layer: usize, proj: Proj) -> Option<&LoraStack> {
        self.stacks.get(&(layer, Target::Proj(proj)))
    }

    /// The stack of a packed group, if any adapter targets one of its members.
    pub fn group(&self, layer: usize, packing: Packing) -> Option<&LoraStack> {
        self.stacks.get(&(layer, Target::Group(packing)))
    }

    pub fn slots(&self) -> usize {
        self.slots
    }
}
