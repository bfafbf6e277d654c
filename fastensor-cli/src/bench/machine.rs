//! The machine fingerprint of a report: kernel, CPU, memory, device and file system.

use serde::{Deserialize, Serialize};
use std::path::Path;

/// Where a run happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    /// Kernel release.
    pub kernel: String,
    /// CPU model name (`/proc/cpuinfo`), empty when unknown.
    pub cpu_model: String,
    /// Logical CPUs this process may use.
    pub cpus: usize,
    /// Physical memory, bytes (0 when unknown).
    pub memory_bytes: u64,
    /// File system type of the bench directory.
    pub file_system: String,
    /// Block device `major:minor` of the bench directory.
    pub device: String,
    /// Model of that device (sysfs), empty when unknown.
    pub device_model: String,
    /// The bench directory.
    pub dir: String,
}

fn cpuinfo_model() -> String {
    let text = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    text.lines()
        .find(|l| l.starts_with("model name") || l.starts_with("Hardware"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_default()
}

fn mem_total() -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

impl Machine {
    /// This machine, measuring `dir`.
    pub fn this(dir: &Path) -> Machine {
        let loc = fastensor_posix::sys::file_location(dir);
        Machine {
            kernel: fastensor::profile::kernel_release(),
            cpu_model: cpuinfo_model(),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            memory_bytes: mem_total(),
            device_model: fastensor::profile::device_model(&loc.device),
            file_system: loc.fs_type,
            device: loc.device,
            dir: dir.display().to_string(),
        }
    }
}
