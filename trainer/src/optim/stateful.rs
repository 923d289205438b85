//! What every optimizer here shares: an update rule applied parameter by parameter, the number
//! of updates taken, and per parameter the f32 buffers the rule keeps (named as the PyTorch
//! optimizer names them in its `state`), on the parameter's device. One checkpoint format for
//! all of them: `step` (i64 scalar) and `{buffer}.{parameter}` (f32, the buffer's shape).

use std::collections::BTreeMap;
use std::fmt::Debug;

use candle_core::{DType, Device, Tensor};

use super::OptimError;
use super::adamw::to_f32_vec;

/// How one optimizer updates one parameter.
pub trait UpdateRule: Debug + Clone + PartialEq {
    /// The buffers kept for a parameter of shape `dims`, each with its shape, in the order
    /// [`UpdateRule::update`] receives them. Every buffer starts at zero.
    fn buffers(&self, dims: &[usize]) -> Vec<(&'static str, Vec<usize>)>;

    /// Update number `step` (1-based) of `p` with gradient `g` (same shape and dtype) and
    /// learning rate `lr`: returns the new value, of `p`'s dtype, and updates `buffers` in place.
    /// `decays`: whether weight decay applies to this parameter ([`super::decays`]).
    fn update(
        &self,
        step: u64,
        lr: f64,
        decays: bool,
        p: &Tensor,
        g: &Tensor,
        buffers: &mut [Tensor],
    ) -> Result<Tensor, OptimError>;
}

/// An optimizer: its rule (the configuration) and its state.
#[derive(Debug, Clone)]
pub struct Stateful<R> {
    rule: R,
    step: u64,
    /// Per parameter, its buffers in the rule's order, each with its name.
    buffers: BTreeMap<String, Vec<(&'static str, Tensor)>>,
}

const STEP_KEY: &str = "step";

/// The parameter a state tensor belongs to (`exp_avg.model.layers.0.w` → `model.layers.0.w`);
/// `None` for the update count. Buffer names hold no dot, parameter names may.
pub fn state_parameter(key: &str) -> Option<&str> {
    key.split_once('.').map(|(_, name)| name)
}

impl<R: UpdateRule> PartialEq for Stateful<R> {
    /// Same rule, step and buffer values (wherever the buffers live).
    fn eq(&self, other: &Self) -> bool {
        let same = |a: &(&str, Tensor), b: &(&str, Tensor)| {
            a.0 == b.0
                && a.1.dims() == b.1.dims()
                && to_f32_vec(&a.1).ok().is_some_and(|x| Some(x) == to_f32_vec(&b.1).ok())
        };
        self.rule == other.rule
            && self.step == other.step
            && self.buffers.len() == other.buffers.len()
            && self
                .buffers
                .iter()
                .zip(&other.buffers)
                .all(|((a, ba), (b, bb))| a == b && ba.len() == bb.len() && ba.iter().zip(bb).all(|(x, y)| same(x, y)))
    }
}

impl<R: UpdateRule> Stateful<R> {
    pub fn new(rule: R) -> Self {
        Stateful { rule, step: 0, buffers: BTreeMap::new() }
    }

    pub fn config(&self) -> &R {
        &self.rule
    }

    /// Updates taken so far (torch's `state["step"]`).
    pub fn step_count(&self) -> u64 {
        self.step
    }

    /// One update of every parameter in `params` with learning rate `lr`. Each parameter needs a
    /// gradient of its shape; a gradient without a parameter is an error too (a name mismatch
    /// would otherwise silently freeze a weight). Parameters keep their dtype and device; the
    /// arithmetic is f32. Nothing changes when the inputs are refused.
    pub fn step(
        &mut self,
        params: &mut BTreeMap<String, Tensor>,
        grads: &BTreeMap<String, Tensor>,
        lr: f64,
    ) -> Result<(), OptimError> {
        self.check(params, grads)?;
        self.step += 1;
        for (name, p) in params.iter_mut() {
            let kept = match self.buffers.remove(name) {
                // Buffers restored from a checkpoint are on the host: they move to the
                // parameter's device once.
                Some(kept) => kept.into_iter().map(|(b, t)| Ok((b, on_device(t, p.device())?))).collect(),
                None => self
                    .rule
                    .buffers(p.dims())
                    .into_iter()
                    .map(|(b, dims)| Ok((b, Tensor::zeros(dims, DType::F32, p.device())?)))
                    .collect::<Result<Vec<_>, candle_core::Error>>(),
            }?;
            let (names, mut tensors): (Vec<&'static str>, Vec<Tensor>) = kept.into_iter().unzip();
            *p = self.rule.update(self.step, lr, super::decays(p.dims()), p, &grads[name], &mut tensors)?;
            self.buffers.insert(name.clone(), names.into_iter().zip(tensors).collect());
        }
        Ok(())
    }

    /// Every gradient has its parameter and shape, and every parameter's kept buffers are the
    /// ones the rule gives a parameter of its shape.
    fn check(&self, params: &BTreeMap<String, Tensor>, grads: &BTreeMap<String, Tensor>) -> Result<(), OptimError> {
        if let Some(name) = grads.keys().find(|n| !params.contains_key(*n)) {
            return Err(OptimError::State(format!("gradient `{name}` has no parameter")));
        }
        for (name, p) in params {
            let g = grads.get(name).ok_or_else(|| OptimError::MissingGrad(name.clone()))?;
            if g.dims() != p.dims() {
                return Err(OptimError::ShapeMismatch {
                    name: name.clone(),
                    param: p.dims().to_vec(),
                    grad: g.dims().to_vec(),
                });
            }
            let Some(kept) = self.buffers.get(name) else { continue };
            let kept: Vec<(&str, Vec<usize>)> = kept.iter().map(|(b, t)| (*b, t.dims().to_vec())).collect();
            let want = self.rule.buffers(p.dims());
            if kept != want {
                return Err(OptimError::State(format!(
                    "state of `{name}` is {kept:?}; a parameter of shape {:?} needs {want:?}",
                    p.dims()
                )));
            }
        }
        Ok(())
    }

    /// The state of a parameter `name` of shape `dims`, named as [`Stateful::state_tensors`]
    /// names it, with shapes (for gathering state that ranks keep in shares).
    pub fn state_shapes(&self, name: &str, dims: &[usize]) -> Vec<(String, Vec<usize>)> {
        self.rule.buffers(dims).into_iter().map(|(buffer, d)| (format!("{buffer}.{name}"), d)).collect()
    }

    /// The state as tensors for a checkpoint, on the host: `step` and `{buffer}.{parameter}`.
    pub fn state_tensors(&self) -> Result<BTreeMap<String, Tensor>, OptimError> {
        let mut out = BTreeMap::new();
        let step = i64::try_from(self.step).map_err(|_| OptimError::State("step overflows i64".into()))?;
        out.insert(STEP_KEY.to_string(), Tensor::new(step, &Device::Cpu)?);
        for (name, kept) in &self.buffers {
            for (buffer, t) in kept {
                out.insert(format!("{buffer}.{name}"), t.to_device(&Device::Cpu)?);
            }
        }
        Ok(out)
    }

    /// Every set of buffers the rule keeps for some parameter, in its order: one per parameter
    /// rank the rule tells apart (vectors, and matrices, whose layout higher ranks share).
    fn layouts(&self) -> Vec<Vec<&'static str>> {
        let mut out: Vec<Vec<&'static str>> = Vec::new();
        for dims in [&[1usize][..], &[1, 1]] {
            let names = self.rule.buffers(dims).into_iter().map(|(n, _)| n).collect();
            if !out.contains(&names) {
                out.push(names);
            }
        }
        out
    }

    /// Rebuilds the optimizer from [`Stateful::state_tensors`] output: the update count, and per
    /// parameter exactly one of the rule's sets of buffers (their shapes are checked against the
    /// parameter at the next step).
    pub fn from_state_tensors(rule: R, state: &BTreeMap<String, Tensor>) -> Result<Self, OptimError> {
        let step_t = state.get(STEP_KEY).ok_or_else(|| OptimError::State("missing `step`".into()))?;
        let step = step_t.to_dtype(DType::I64)?.flatten_all()?.to_vec1::<i64>()?;
        let step = match step.as_slice() {
            [s] if *s >= 0 => *s as u64,
            other => return Err(OptimError::State(format!("`step` must be one non-negative integer, got {other:?}"))),
        };
        let mut found: BTreeMap<&str, BTreeMap<&str, &Tensor>> = BTreeMap::new();
        for (key, t) in state.iter().filter(|(k, _)| *k != STEP_KEY) {
            match key.split_once('.') {
                Some((buffer, name)) => found.entry(name).or_default().insert(buffer, t),
                None => return Err(OptimError::State(format!("unexpected tensor `{key}`"))),
            };
        }
        let mut optimizer = Stateful::new(rule);
        optimizer.step = step;
        let layouts = optimizer.layouts();
        for (name, kept) in found {
            let layout = layouts.iter().find(|l| l.len() == kept.len() && l.iter().all(|b| kept.contains_key(b)));
            let Some(layout) = layout else {
                let kept: Vec<_> = kept.keys().collect();
                return Err(OptimError::State(format!(
                    "`{name}` has state {kept:?}; {:?} keeps one of {layouts:?}",
                    optimizer.rule
                )));
            };
            let buffers =
                layout.iter().map(|b| Ok((*b, kept[b].to_dtype(DType::F32)?))).collect::<Result<_, OptimError>>()?;
            optimizer.buffers.insert(name.to_string(), buffers);
        }
        Ok(optimizer)
    }
}

fn on_device(t: Tensor, device: &Device) -> Result<Tensor, candle_core::Error> {
    if t.device().same_device(device) { Ok(t) } else { t.to_device(device) }
}

#[cfg(test)]
mod tests;
