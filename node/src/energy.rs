//! The energy a run drew, from the machine's own counters, for the manifest's
//! `mindxtrain_energy` (the recipe's `receipt.include: energy_kwh`).
//!
//! * [`nvml`]: the run's NVIDIA GPUs (NVML's total-energy counter, before and after);
//! * [`rapl`]: the CPU packages (Linux RAPL, read every few seconds across counter wraps).
//!
//! Both are machine-wide counters: whatever else ran on those GPUs and packages meanwhile is
//! counted too. What could not be read is named in [`Energy::reason`], and with no counter at all
//! `kwh` is null: a number is only ever a sum of counters that were read.

pub mod nvml;
pub mod rapl;

use serde::{Deserialize, Serialize};
use std::path::Path;
use std::time::{Duration, Instant};

/// One counter's share of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Counter {
    /// `nvml` or `rapl`.
    pub source: String,
    /// The GPU (`NVIDIA H200 (NVML index 0)`) or package (`package-0`).
    pub name: String,
    pub joules: f64,
}

/// What a run drew, as the manifest records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Energy {
    /// The counters' sum in kWh; null when no counter could be read.
    pub kwh: Option<f64>,
    /// What the sum leaves out and why; null when every counter in scope was read.
    pub reason: Option<String>,
    pub counters: Vec<Counter>,
    /// Wall-clock seconds between the first and the last reading.
    pub seconds: f64,
}

/// The sum of `counters` in kWh, if there is any.
pub fn kwh(counters: &[Counter]) -> Option<f64> {
    (!counters.is_empty()).then(|| counters.iter().map(|c| c.joules).sum::<f64>() / 3.6e6)
}

impl Energy {
    /// No reading at all, for `reason`.
    pub fn unmeasured(reason: impl Into<String>) -> Energy {
        Energy { kwh: None, reason: Some(reason.into()), counters: Vec::new(), seconds: 0.0 }
    }

    /// Adds `what` to the reason (the measurement covers less than the run).
    pub fn not_counted(&mut self, what: impl Into<String>) {
        let what = what.into();
        self.reason = Some(match self.reason.take() {
            Some(r) => format!("{r}; {what}"),
            None => what,
        });
    }
}

/// A measurement under way: started before a run trains, finished after.
pub struct Meter {
    gpus: Option<nvml::Start>,
    cpu: Option<rapl::Sampler>,
    missing: Vec<String>,
    started: Instant,
}

impl Meter {
    /// Reads the counters of the CUDA devices `gpus` (the run's) and of the CPU packages.
    pub fn start(gpus: &[usize]) -> Meter {
        Meter::start_at(gpus, Path::new(rapl::POWERCAP), rapl::INTERVAL)
    }

    /// As [`Meter::start`], with the powercap directory and sampling interval given.
    pub fn start_at(gpus: &[usize], powercap: &Path, interval: Duration) -> Meter {
        let mut missing = Vec::new();
        let gpus = match gpus {
            [] => None,
            some => {
                nvml::start(some).map_err(|e| missing.push(format!("GPUs (CUDA {}) not counted: {e}", list(some)))).ok()
            }
        };
        let cpu = rapl::Zones::open(powercap)
            .map(|z| rapl::Sampler::start(z, interval))
            .map_err(|e| missing.push(format!("CPU packages not counted: {e}")))
            .ok();
        Meter { gpus, cpu, missing, started: Instant::now() }
    }

    pub fn finish(self) -> Energy {
        let mut missing = self.missing;
        let mut counters = Vec::new();
        let mut take = |what: &str, r: Result<Vec<Counter>, String>| match r {
            Ok(c) => counters.extend(c),
            Err(e) => missing.push(format!("{what} not counted: {e}")),
        };
        if let Some(g) = self.gpus {
            take("GPUs", g.finish());
        }
        if let Some(c) = self.cpu {
            take("CPU packages", c.finish());
        }
        Energy {
            kwh: kwh(&counters),
            reason: (!missing.is_empty()).then(|| missing.join("; ")),
            counters,
            seconds: self.started.elapsed().as_secs_f64(),
        }
    }
}

fn list(gpus: &[usize]) -> String {
    gpus.iter().map(|g| g.to_string()).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_counters_kwh_is_null_and_the_reason_names_each_missing_one() {
        let none = tempfile::tempdir().unwrap();
        let e = Meter::start_at(&[], &none.path().join("powercap"), Duration::from_secs(10)).finish();
        assert_eq!(e.kwh, None);
        assert!(e.counters.is_empty());
        let reason = e.reason.unwrap();
        assert!(reason.starts_with("CPU packages not counted: no RAPL counters"), "{reason}");
        assert!(!reason.contains("GPU"), "a run on no GPU reads no GPU counter: {reason}");
    }

    #[test]
    fn counted_packages_give_kwh_and_a_gpu_counter_is_read_or_named_missing() {
        let root = tempfile::tempdir().unwrap();
        let zone = root.path().join("intel-rapl:0");
        std::fs::create_dir_all(&zone).unwrap();
        std::fs::write(zone.join("max_energy_range_uj"), "1000000000\n").unwrap();
        std::fs::write(zone.join("energy_uj"), "999000000\n").unwrap();
        let meter = Meter::start_at(&[0], root.path(), Duration::from_secs(10));
        std::fs::write(zone.join("energy_uj"), "35000000\n").unwrap();
        let e = meter.finish();
        let rapl: Vec<&Counter> = e.counters.iter().filter(|c| c.source == "rapl").collect();
        assert_eq!(rapl, [&Counter { source: "rapl".into(), name: "intel-rapl:0".into(), joules: 36.0 }]);
        match nvml_wrapper::Nvml::init() {
            // No libnvidia-ml without the driver: the GPU is named as not counted, the sum is the CPU's.
            Err(_) => {
                assert_eq!(e.kwh, Some(36.0 / 3.6e6));
                let reason = e.reason.unwrap();
                assert!(reason.contains("GPUs (CUDA 0) not counted: NVML could not be loaded"), "{reason}");
            }
            // On an NVIDIA machine GPU 0's counter is read and added.
            Ok(_) => {
                let gpu = e.counters.iter().find(|c| c.source == "nvml").expect("GPU 0 counted");
                assert!(gpu.name.contains("NVML index") && gpu.joules >= 0.0, "{gpu:?}");
                assert_eq!(e.kwh, Some((36.0 + gpu.joules) / 3.6e6));
            }
        }
    }
}
