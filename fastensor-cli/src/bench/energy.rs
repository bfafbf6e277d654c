//! Energy: the CPU package through RAPL (`/sys/class/powercap/intel-rapl:N/energy_uj`,
//! wraparound handled with `max_energy_range_uj`); GPU energy through NVML is not built.
//!
//! RAPL counts the whole package, not only this process: other work on the machine during a
//! transfer is charged to it.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The default powercap root.
pub const POWERCAP_ROOT: &str = "/sys/class/powercap";

/// Why GPU energy is never reported by this build.
pub const NVML_NOT_BUILT: &str =
    "NVML support not built: this build does not load libnvidia-ml.so.1, so GPU energy is not measured";

/// Whether an energy source can be read, and what it is or why not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourceStatus {
    /// True when the source is read around every timed transfer.
    pub available: bool,
    /// What is read (the zones), when available.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Why not, when unavailable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// One RAPL package zone.
#[derive(Debug, Clone)]
struct Zone {
    energy: PathBuf,
    max_range: u64,
    name: String,
}

/// The RAPL package zones under a powercap root.
#[derive(Debug, Clone)]
pub struct Rapl {
    zones: Vec<Zone>,
}

fn read_u64(path: &Path) -> Result<u64, String> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::PermissionDenied {
            format!(
                "cannot read {}: permission denied (RAPL energy is readable by root only since Linux 5.10)",
                path.display()
            )
        } else {
            format!("cannot read {}: {e}", path.display())
        }
    })?;
    text.trim()
        .parse()
        .map_err(|_| format!("{} does not hold a number", path.display()))
}

/// True for `intel-rapl:N` (a package zone, not a sub-zone `intel-rapl:N:M`).
fn is_package_zone(name: &str) -> bool {
    name.strip_prefix("intel-rapl:")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

impl Rapl {
    /// Finds the package zones under `root` and checks they can be read; `Err` says why not.
    pub fn open(root: &Path) -> Result<Rapl, String> {
        let entries = std::fs::read_dir(root).map_err(|e| {
            format!(
                "no RAPL: cannot list {} ({e}); the kernel exposes no powercap interface here",
                root.display()
            )
        })?;
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| is_package_zone(n))
            .collect();
        names.sort();
        if names.is_empty() {
            return Err(format!(
                "no RAPL: {} has no intel-rapl:N package zone",
                root.display()
            ));
        }
        let mut zones = Vec::new();
        for n in names {
            let dir = root.join(&n);
            let max_range = read_u64(&dir.join("max_energy_range_uj"))?;
            let energy = dir.join("energy_uj");
            read_u64(&energy)?;
            let label = std::fs::read_to_string(dir.join("name"))
                .map(|s| s.trim().to_string())
                .unwrap_or_default();
            zones.push(Zone {
                energy,
                max_range,
                name: format!("{n} ({label})"),
            });
        }
        Ok(Rapl { zones })
    }

    /// The zones read, for the report.
    pub fn describe(&self) -> String {
        let names: Vec<&str> = self.zones.iter().map(|z| z.name.as_str()).collect();
        format!("RAPL {}", names.join(" + "))
    }

    /// The counters now, microjoules, one per zone.
    pub fn read(&self) -> Result<Vec<u64>, String> {
        self.zones.iter().map(|z| read_u64(&z.energy)).collect()
    }

    /// Joules between two readings, summed over the zones, each counter unwrapped once.
    pub fn joules(&self, before: &[u64], after: &[u64]) -> f64 {
        self.zones
            .iter()
            .zip(before.iter().zip(after))
            .map(|(z, (&b, &a))| delta_uj(b, a, z.max_range) as f64 / 1e6)
            .sum()
    }
}

/// Microjoules from `before` to `after` on a counter that wraps to 0 after `max_range`.
pub fn delta_uj(before: u64, after: u64, max_range: u64) -> u64 {
    if after >= before {
        after - before
    } else {
        max_range.saturating_sub(before) + after
    }
}

/// Reads the CPU package energy around timed transfers, where RAPL is readable.
#[derive(Debug, Clone)]
pub struct EnergyMeter {
    cpu: Result<Rapl, String>,
}

impl EnergyMeter {
    /// A meter over the powercap tree at `root`.
    pub fn new(root: &Path) -> Self {
        EnergyMeter {
            cpu: Rapl::open(root),
        }
    }

    /// CPU energy: readable or why not.
    pub fn cpu_status(&self) -> SourceStatus {
        match &self.cpu {
            Ok(r) => SourceStatus {
                available: true,
                source: Some(r.describe()),
                reason: None,
            },
            Err(why) => SourceStatus {
                available: false,
                source: None,
                reason: Some(why.clone()),
            },
        }
    }

    /// GPU energy: never, in this build.
    pub fn gpu_status(&self) -> SourceStatus {
        SourceStatus {
            available: false,
            source: None,
            reason: Some(NVML_NOT_BUILT.to_string()),
        }
    }

    /// A reading to pass to [`EnergyMeter::joules_since`] (`Err` when unavailable).
    pub fn start(&self) -> Result<Vec<u64>, String> {
        self.cpu.as_ref().map_err(Clone::clone)?.read()
    }

    /// CPU joules since `start`.
    pub fn joules_since(&self, start: &Result<Vec<u64>, String>) -> Result<f64, String> {
        let rapl = self.cpu.as_ref().map_err(Clone::clone)?;
        let before = start.as_ref().map_err(Clone::clone)?;
        Ok(rapl.joules(before, &rapl.read()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zone(root: &Path, name: &str, energy: u64, max: u64) {
        let d = root.join(name);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("energy_uj"), format!("{energy}\n")).unwrap();
        std::fs::write(d.join("max_energy_range_uj"), format!("{max}\n")).unwrap();
        std::fs::write(d.join("name"), "package-0\n").unwrap();
    }

    #[test]
    fn missing_or_empty_trees_say_why() {
        let dir = tempfile::tempdir().unwrap();
        let meter = EnergyMeter::new(&dir.path().join("absent"));
        let s = meter.cpu_status();
        assert!(!s.available && s.reason.unwrap().contains("no RAPL"));
        assert!(meter.joules_since(&meter.start()).is_err());
        let empty = EnergyMeter::new(dir.path()).cpu_status();
        assert!(empty.reason.unwrap().contains("no intel-rapl"));
        assert!(meter
            .gpu_status()
            .reason
            .unwrap()
            .contains("NVML support not built"));
    }

    #[test]
    fn fake_tree_sums_packages_and_unwraps() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        zone(root, "intel-rapl:0", 1_000_000, 10_000_000);
        zone(root, "intel-rapl:1", 9_500_000, 10_000_000);
        zone(root, "intel-rapl:0:0", 5, 10); // a sub-zone: not counted
        let meter = EnergyMeter::new(root);
        assert!(meter.cpu_status().available, "{:?}", meter.cpu_status());
        let start = meter.start();
        assert_eq!(start.as_ref().unwrap(), &vec![1_000_000, 9_500_000]);
        // Package 0 moves 2.5 J; package 1 wraps: 0.5 J to the top, then 1 J.
        zone(root, "intel-rapl:0", 3_500_000, 10_000_000);
        zone(root, "intel-rapl:1", 1_000_000, 10_000_000);
        let j = meter.joules_since(&start).unwrap();
        assert!((j - 4.0).abs() < 1e-9, "{j}");
        assert_eq!(delta_uj(5, 7, 10), 2);
        assert_eq!(delta_uj(8, 2, 10), 4);
    }
}
