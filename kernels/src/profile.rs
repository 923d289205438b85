//! Where a step's time goes, op by op: with `MINDXTRAIN_PROFILE` set in the environment, each
//! public op of this crate waits for its device before and after itself and adds the time to
//! its label. The waits serialise the GPU, so a profiled step is slower than a real one: the
//! totals attribute time, they do not measure speed. Unset, a scope is one cached flag check.
//!
//! Scopes nest (callers such as the trainer open their own around glue code): a label is
//! charged its *self* time, what its nested scopes did not take, so the labels add up to the
//! profiled span without counting anything twice.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! let x = Tensor::ones((4, 8), candle_core::DType::F32, &Device::Cpu)?;
//! let w = Tensor::ones((3, 8), candle_core::DType::F32, &Device::Cpu)?;
//! mindxtrain_kernels::linear::forward(&Default::default(), &x, &w)?;
//! // Empty unless MINDXTRAIN_PROFILE was set when the process first asked.
//! for (label, calls, seconds) in mindxtrain_kernels::profile::take() {
//!     println!("{label}: {calls} calls, {seconds:.3} s");
//! }
//! # Ok::<(), candle_core::Error>(())
//! ```

use candle_core::Device;
use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("MINDXTRAIN_PROFILE").is_some_and(|v| !v.is_empty() && v != "0"))
}

static TOTALS: Mutex<BTreeMap<&'static str, (u64, f64)>> = Mutex::new(BTreeMap::new());

thread_local! {
    /// Per open scope on this thread, innermost last: the time its nested scopes took.
    static NESTED: std::cell::RefCell<Vec<f64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Times from its creation to its drop, device work included, under `label`.
#[must_use = "the scope times until it is dropped"]
pub struct Scope<'a> {
    label: &'static str,
    device: &'a Device,
    start: Option<Instant>,
}

/// Starts timing `label` on `device` (a no-op unless profiling is on).
pub fn scope<'a>(label: &'static str, device: &'a Device) -> Scope<'a> {
    Scope::open(label, device, enabled())
}

impl<'a> Scope<'a> {
    fn open(label: &'static str, device: &'a Device, on: bool) -> Scope<'a> {
        let start = on.then(|| {
            // A failed wait only blurs the attribution; the op itself reports real errors.
            let _ = device.synchronize();
            NESTED.with(|n| n.borrow_mut().push(0.0));
            Instant::now()
        });
        Scope { label, device, start }
    }
}

impl Drop for Scope<'_> {
    fn drop(&mut self) {
        let Some(start) = self.start else { return };
        let _ = self.device.synchronize();
        let elapsed = start.elapsed().as_secs_f64();
        let nested = NESTED.with(|n| {
            let mut n = n.borrow_mut();
            let inner = n.pop().unwrap_or(0.0);
            if let Some(parent) = n.last_mut() {
                *parent += elapsed;
            }
            inner
        });
        let secs = (elapsed - nested).max(0.0);
        let mut totals = TOTALS.lock().unwrap_or_else(|e| e.into_inner());
        let e = totals.entry(self.label).or_default();
        e.0 += 1;
        e.1 += secs;
    }
}

/// The totals so far as `(label, calls, self seconds)`, slowest first; clears them.
pub fn take() -> Vec<(&'static str, u64, f64)> {
    let mut totals = TOTALS.lock().unwrap_or_else(|e| e.into_inner());
    let mut v: Vec<_> = std::mem::take(&mut *totals).into_iter().map(|(l, (n, s))| (l, n, s)).collect();
    v.sort_by(|a, b| b.2.total_cmp(&a.2));
    v
}

#[cfg(test)]
mod tests {
    use super::{Scope, TOTALS};
    use std::time::Duration;

    fn total(label: &str) -> Option<(u64, f64)> {
        TOTALS.lock().unwrap().get(label).copied()
    }

    #[test]
    fn nested_scopes_charge_only_their_own_time() {
        let dev = candle_core::Device::Cpu;
        {
            let _outer = Scope::open("test outer", &dev, true);
            std::thread::sleep(Duration::from_millis(20));
            let _inner = Scope::open("test inner", &dev, true);
            std::thread::sleep(Duration::from_millis(30));
        }
        let (inner, outer) = (total("test inner").unwrap(), total("test outer").unwrap());
        assert_eq!((inner.0, outer.0), (1, 1));
        assert!(inner.1 >= 0.030, "inner {inner:?}");
        // The outer scope ran ≥ 50 ms but is charged only its own ~20 ms.
        assert!(outer.1 >= 0.020 && outer.1 < 0.045, "outer {outer:?}");
    }

    #[test]
    fn a_scope_that_is_off_records_nothing() {
        drop(Scope::open("test off", &candle_core::Device::Cpu, false));
        assert_eq!(total("test off"), None);
    }
}
