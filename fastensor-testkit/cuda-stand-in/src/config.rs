//! The stand-in's settings, read once from the environment (see the crate documentation).

use std::sync::OnceLock;
use std::time::Duration;

/// Faults to inject, from `FASTENSOR_STAND_IN_FAULT`. Each `…_from` is the index (from 0) of
/// the first call that fails; every later call fails too.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Faults {
    /// `read-error@N`: `cuFileRead` (and batch reads) fail with `EIO`.
    pub read_error_from: Option<u64>,
    /// `short-read@N`: `cuFileRead` (and batch reads) move at most half the bytes asked.
    pub short_read_from: Option<u64>,
    /// `zero-read@N`: `cuFileRead` (and batch reads) return 0 bytes before the end of file.
    pub zero_read_from: Option<u64>,
    /// `write-error@N`: `cuFileWrite` fails with `EIO`.
    pub write_error_from: Option<u64>,
    /// `batch-fail@N`: batch requests end with `CUFILE_FAILED`.
    pub batch_fail_from: Option<u64>,
    /// `pinned-oom@N`: `cuMemHostAlloc` fails with `CUDA_ERROR_OUT_OF_MEMORY`.
    pub pinned_oom_from: Option<u64>,
    /// `device-oom@N`: `cuMemAlloc` fails with `CUDA_ERROR_OUT_OF_MEMORY`.
    pub device_oom_from: Option<u64>,
    /// `device-lost@BYTES`: after that many bytes moved to or from device memory, the device
    /// is lost: the transfer under way and every later call fail with `CUDA_ERROR_UNKNOWN`.
    pub device_lost_after: Option<u64>,
}

/// Every setting.
#[derive(Debug, Clone)]
pub struct Config {
    /// Number of devices (`FASTENSOR_STAND_IN_DEVICES`, default 1).
    pub devices: u32,
    /// Device memory per device, bytes (`FASTENSOR_STAND_IN_DEVICE_MEMORY`, default 8 GiB).
    pub device_memory: u64,
    /// Pinned host memory, bytes (`FASTENSOR_STAND_IN_PINNED_MEMORY`, default 4 GiB).
    pub pinned_memory: u64,
    /// Delay before each asynchronous operation runs (`FASTENSOR_STAND_IN_DELAY_US`, 50 µs).
    pub delay: Duration,
    /// Largest cuFile batch (`FASTENSOR_STAND_IN_MAX_BATCH`, default 128).
    pub max_batch: u32,
    /// Where the counters go at exit (`FASTENSOR_STAND_IN_STATS`).
    pub stats_path: Option<String>,
    /// Faults to inject.
    pub faults: Faults,
    /// Settings that could not be parsed, for the counters and one message.
    pub errors: Vec<String>,
}

/// The settings of this process.
pub(crate) fn get() -> &'static Config {
    static CONFIG: OnceLock<Config> = OnceLock::new();
    CONFIG.get_or_init(|| {
        let c = from_env(|k| std::env::var(k).ok());
        for e in &c.errors {
            eprintln!("CUDA stand-in: ignoring {e}");
        }
        c
    })
}

/// Parses the settings from `var` (an environment lookup).
pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Config {
    let mut errors = Vec::new();
    let mut num = |name: &str, default: u64| match var(name) {
        None => default,
        Some(v) if v.trim().is_empty() => default,
        Some(v) => parse_size(&v).unwrap_or_else(|| {
            errors.push(format!("{name}={v} (not a number)"));
            default
        }),
    };
    let devices = u32::try_from(num("FASTENSOR_STAND_IN_DEVICES", 1)).unwrap_or(1);
    let device_memory = num("FASTENSOR_STAND_IN_DEVICE_MEMORY", 8 << 30);
    let pinned_memory = num("FASTENSOR_STAND_IN_PINNED_MEMORY", 4 << 30);
    let delay = Duration::from_micros(num("FASTENSOR_STAND_IN_DELAY_US", 50));
    let max_batch = u32::try_from(num("FASTENSOR_STAND_IN_MAX_BATCH", 128).max(1)).unwrap_or(128);
    let stats_path = var("FASTENSOR_STAND_IN_STATS").filter(|p| !p.is_empty());
    let faults = match var("FASTENSOR_STAND_IN_FAULT") {
        Some(spec) => parse_faults(&spec, &mut errors),
        None => Faults::default(),
    };
    Config {
        devices,
        device_memory,
        pinned_memory,
        delay,
        max_batch,
        stats_path,
        faults,
        errors,
    }
}

/// Parses `name@N,...`; unknown names and bad numbers go to `errors`.
pub fn parse_faults(spec: &str, errors: &mut Vec<String>) -> Faults {
    let mut f = Faults::default();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, n) = match item.split_once('@') {
            Some((name, n)) => (name.trim(), parse_size(n)),
            None => (item, Some(0)),
        };
        let Some(n) = n else {
            errors.push(format!("fault `{item}` (bad number)"));
            continue;
        };
        let slot = match name {
            "read-error" => &mut f.read_error_from,
            "short-read" => &mut f.short_read_from,
            "zero-read" => &mut f.zero_read_from,
            "write-error" => &mut f.write_error_from,
            "batch-fail" => &mut f.batch_fail_from,
            "pinned-oom" => &mut f.pinned_oom_from,
            "device-oom" => &mut f.device_oom_from,
            "device-lost" => &mut f.device_lost_after,
            _ => {
                errors.push(format!("fault `{item}` (unknown name)"));
                continue;
            }
        };
        *slot = Some(n);
    }
    f
}

/// `123`, `4K`, `16M`, `2G` (powers of 1024), `4GB` (of 1000): as every size of fastensor is
/// read ([`fastensor_core::size`]).
pub fn parse_size(s: &str) -> Option<u64> {
    fastensor_core::size::parse_size(s).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_and_sizes_parse() {
        let mut errors = Vec::new();
        let f = parse_faults(
            "read-error@3, device-lost@4M,pinned-oom,nope@1",
            &mut errors,
        );
        assert_eq!(f.read_error_from, Some(3));
        assert_eq!(f.device_lost_after, Some(4 << 20));
        assert_eq!(f.pinned_oom_from, Some(0));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(parse_size("2G"), Some(2 << 30));
        assert_eq!(parse_size("x"), None);
    }

    #[test]
    fn defaults_apply_without_variables() {
        let c = from_env(|_| None);
        assert_eq!(c.devices, 1);
        assert_eq!(c.faults, Faults::default());
        assert!(c.errors.is_empty());
        let c = from_env(|k| (k == "FASTENSOR_STAND_IN_DEVICES").then(|| "two".to_string()));
        assert_eq!(c.devices, 1);
        assert_eq!(c.errors.len(), 1);
    }
}
