//! The CPU packages' energy from Linux RAPL (`/sys/class/powercap/intel-rapl:N/energy_uj`, also
//! used by AMD's RAPL driver). A package counter counts microjoules up to
//! `max_energy_range_uj` and then starts again from zero, within minutes under load (262 kJ is
//! 22 minutes at 200 W), so one reading before and one after a run would miss every wrap but
//! one. A [`Sampler`] reads the counters every [`INTERVAL`] on a thread of its own and adds up
//! the steps between readings, each at most one wrap long.

use super::Counter;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Where the kernel lists its power-capping zones.
pub const POWERCAP: &str = "/sys/class/powercap";
/// Between two readings a package may not wrap twice: 262 kJ (a usual range) in 10 s is 26 kW.
pub const INTERVAL: Duration = Duration::from_secs(10);

/// One package's counter and what it has counted since the first reading.
#[derive(Debug)]
struct Zone {
    /// The zone's own name (`package-0`), else its directory's.
    name: String,
    energy: PathBuf,
    max_range: u64,
    last: u64,
    total_uj: u128,
}

/// Every CPU package's counter (`intel-rapl:N`; the sub-zones `intel-rapl:N:M` are parts of
/// their package and would count twice).
#[derive(Debug)]
pub struct Zones {
    zones: Vec<Zone>,
}

/// Microjoules from `before` to `after` on a counter that wraps after `max_range`.
pub fn step(before: u64, after: u64, max_range: u64) -> u64 {
    if after >= before { after - before } else { max_range.saturating_sub(before) + after }
}

fn read_u64(path: &Path) -> Result<u64, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    text.trim().parse().map_err(|e| format!("{}: {text:?} is not a counter ({e})", path.display()))
}

/// `intel-rapl:N` with N digits only.
fn is_package(name: &str) -> bool {
    name.strip_prefix("intel-rapl:").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

impl Zones {
    /// The packages under `root` (a sysfs powercap directory, or a copy laid out like one),
    /// each read once. `Err` says why there is nothing to count.
    pub fn open(root: &Path) -> Result<Zones, String> {
        let entries = match std::fs::read_dir(root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(format!("no RAPL counters ({} does not exist)", root.display()));
            }
            Err(e) => return Err(format!("{}: {e}", root.display())),
        };
        let mut dirs: Vec<(String, PathBuf)> = entries
            .filter_map(Result::ok)
            .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
            .filter(|(name, _)| is_package(name))
            .collect();
        dirs.sort();
        if dirs.is_empty() {
            return Err(format!("no RAPL package zone (intel-rapl:N) under {}", root.display()));
        }
        let zones = dirs
            .into_iter()
            .map(|(dir_name, dir)| {
                let name = std::fs::read_to_string(dir.join("name")).map(|n| n.trim().to_string()).unwrap_or(dir_name);
                let energy = dir.join("energy_uj");
                let (last, max_range) = (read_u64(&energy)?, read_u64(&dir.join("max_energy_range_uj"))?);
                Ok(Zone { name, energy, max_range, last, total_uj: 0 })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Zones { zones })
    }

    /// Reads every counter and adds what it counted since the last reading.
    pub fn sample(&mut self) -> Result<(), String> {
        for z in &mut self.zones {
            let now = read_u64(&z.energy)?;
            z.total_uj += u128::from(step(z.last, now, z.max_range));
            z.last = now;
        }
        Ok(())
    }

    pub fn counters(&self) -> Vec<Counter> {
        self.zones
            .iter()
            .map(|z| Counter { source: "rapl".into(), name: z.name.clone(), joules: z.total_uj as f64 / 1e6 })
            .collect()
    }
}

/// [`Zones`] read every [`INTERVAL`] until [`Sampler::finish`].
pub struct Sampler {
    zones: Arc<Mutex<Zones>>,
    /// The first reading that failed, which voids the count.
    failed: Arc<Mutex<Option<String>>>,
    stop: mpsc::Sender<()>,
    thread: Option<JoinHandle<()>>,
}

impl Sampler {
    pub fn start(zones: Zones, interval: Duration) -> Sampler {
        let zones = Arc::new(Mutex::new(zones));
        let failed = Arc::new(Mutex::new(None));
        let (stop, stopped) = mpsc::channel::<()>();
        let (z, f) = (zones.clone(), failed.clone());
        let thread = std::thread::Builder::new()
            .name("rapl".into())
            .spawn(move || {
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(interval) {
                    sample_into(&z, &f);
                }
            })
            .ok();
        Sampler { zones, failed, stop, thread }
    }

    /// The last reading and the packages' counts; `Err` when a reading failed or the thread
    /// could not be started (steps would have gone uncounted).
    pub fn finish(mut self) -> Result<Vec<Counter>, String> {
        self.halt();
        sample_into(&self.zones, &self.failed);
        if let Some(e) = self.failed.lock().map_err(|_| "RAPL sampler poisoned".to_string())?.clone() {
            return Err(e);
        }
        Ok(self.zones.lock().map_err(|_| "RAPL sampler poisoned".to_string())?.counters())
    }

    fn halt(&mut self) {
        let _ = self.stop.send(());
        match self.thread.take() {
            Some(t) => {
                let _ = t.join();
            }
            None => {
                if let Ok(mut f) = self.failed.lock() {
                    f.get_or_insert_with(|| "the RAPL sampling thread could not be started".into());
                }
            }
        }
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.halt();
        }
    }
}

fn sample_into(zones: &Mutex<Zones>, failed: &Mutex<Option<String>>) {
    let result = zones.lock().map_err(|_| "RAPL sampler poisoned".to_string()).and_then(|mut z| z.sample());
    if let (Err(e), Ok(mut f)) = (result, failed.lock()) {
        f.get_or_insert(e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A powercap directory as sysfs lays it out: two packages, a sub-zone and an MMIO zone
    /// (both of which count what a package already counts).
    fn powercap() -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        for (dir, name, energy, max) in [
            ("intel-rapl:0", "package-0", 262_000_000_000u64, 262_143_328_850u64),
            ("intel-rapl:1", "package-1", 5_000_000, 262_143_328_850),
            ("intel-rapl:0:0", "core", 1, 262_143_328_850),
            ("intel-rapl-mmio:0", "package-0", 1, 262_143_328_850),
        ] {
            let d = root.path().join(dir);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("name"), format!("{name}\n")).unwrap();
            std::fs::write(d.join("energy_uj"), format!("{energy}\n")).unwrap();
            std::fs::write(d.join("max_energy_range_uj"), format!("{max}\n")).unwrap();
        }
        root
    }

    /// Replaces a counter's file in one step, as sysfs shows a counter (a sampler reading the
    /// file meanwhile must not see it empty).
    fn set(root: &Path, dir: &str, uj: u64) {
        let tmp = root.join(dir).join("energy_uj.tmp");
        std::fs::write(&tmp, format!("{uj}\n")).unwrap();
        std::fs::rename(tmp, root.join(dir).join("energy_uj")).unwrap();
    }

    #[test]
    fn packages_are_counted_across_a_wrap_and_sub_zones_are_not() {
        let root = powercap();
        let mut zones = Zones::open(root.path()).unwrap();
        // Package 0 wraps: 143,328,850 µJ to the top of its range, then 3,456,671,150 µJ.
        set(root.path(), "intel-rapl:0", 3_456_671_150);
        set(root.path(), "intel-rapl:1", 905_000_000);
        set(root.path(), "intel-rapl:0:0", 999_999_999);
        zones.sample().unwrap();
        set(root.path(), "intel-rapl:1", 3_605_000_000);
        zones.sample().unwrap();
        let c = zones.counters();
        let names: Vec<&str> = c.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["package-0", "package-1"]);
        assert_eq!(c[0].joules, 3600.0, "one wrap: 3,600,000,000 µJ");
        assert_eq!(c[1].joules, 3600.0);
        let kwh = super::super::kwh(&c).unwrap();
        assert!((kwh - 0.002).abs() < 1e-15, "{kwh}");
    }

    #[test]
    fn a_sampler_counts_between_its_readings_and_its_end() {
        let root = powercap();
        let sampler = Sampler::start(Zones::open(root.path()).unwrap(), Duration::from_millis(5));
        set(root.path(), "intel-rapl:1", 6_000_000);
        std::thread::sleep(Duration::from_millis(50));
        set(root.path(), "intel-rapl:1", 7_000_000);
        let c = sampler.finish().unwrap();
        assert_eq!(c[1].joules, 2.0);
        assert_eq!(c[0].joules, 0.0);
    }

    #[test]
    fn why_nothing_is_counted_is_said() {
        let root = powercap();
        let e = Zones::open(&root.path().join("missing")).unwrap_err();
        assert!(e.contains("no RAPL counters") && e.contains("does not exist"), "{e}");
        let empty = tempfile::tempdir().unwrap();
        assert!(Zones::open(empty.path()).unwrap_err().contains("no RAPL package zone"));
        let mut zones = Zones::open(root.path()).unwrap();
        std::fs::remove_file(root.path().join("intel-rapl:1/energy_uj")).unwrap();
        assert!(zones.sample().unwrap_err().contains("intel-rapl:1/energy_uj"));
    }
}
