//! Timing one transfer: wall time, the request itself, process CPU time and package energy.

use super::energy::EnergyMeter;
use super::subjects::{Subject, RAW};
use fastensor::{Backend, Error, ErrorKind, HostBuffer, OpenMode, Result};
use fastensor_posix::sys;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::time::Instant;

/// Block size of the `raw` reference loop, as `dd bs=4M iflag=direct`.
pub const RAW_BLOCK: usize = 4 << 20;

/// Page-cache state of the file before a timed read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Cache {
    /// Evicted before every read.
    Cold,
    /// Read through the page cache once before the cell, never evicted.
    Warm,
}

impl Cache {
    /// `cold` or `warm`.
    pub fn as_str(self) -> &'static str {
        match self {
            Cache::Cold => "cold",
            Cache::Warm => "warm",
        }
    }
}

/// One timed transfer.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Wall-clock seconds: open, transfer and (writes) sync.
    pub seconds: f64,
    /// Seconds of the request alone: `read_at`, or `write_at` plus `sync`.
    pub request_seconds: f64,
    /// CPU seconds (user + system, all threads of the process).
    pub cpu_seconds: f64,
    /// CPU package joules, or why not.
    pub joules: std::result::Result<f64, String>,
}

fn timed(meter: &EnergyMeter, f: impl FnOnce() -> Result<f64>) -> Result<Sample> {
    let e0 = meter.start();
    let cpu0 = sys::process_cpu_seconds();
    let t0 = Instant::now();
    let request_seconds = f()?;
    let seconds = t0.elapsed().as_secs_f64();
    let cpu_seconds = sys::process_cpu_seconds() - cpu0;
    Ok(Sample {
        seconds,
        request_seconds,
        cpu_seconds,
        joules: meter.joules_since(&e0),
    })
}

fn clock(f: impl FnOnce() -> Result<()>) -> Result<f64> {
    let t = Instant::now();
    f()?;
    Ok(t.elapsed().as_secs_f64())
}

/// Writes `buf` to a new file `path`; done when durable (synced).
pub fn write(
    subject: &Subject,
    path: &Path,
    buf: &HostBuffer,
    meter: &EnergyMeter,
) -> Result<Sample> {
    let _ = std::fs::remove_file(path);
    match &subject.backend {
        Some(b) => timed(meter, || {
            let f = b.open(path, OpenMode::Truncate)?;
            clock(|| {
                f.write_at(0, buf.as_mem())?;
                f.sync()
            })
        }),
        None => timed(meter, || clock(|| write_raw(path, buf))),
    }
}

/// Reads all of `path` into `buf` (evicted first when `cache` is cold).
pub fn read(
    subject: &Subject,
    path: &Path,
    buf: &mut HostBuffer,
    cache: Cache,
    meter: &EnergyMeter,
) -> Result<Sample> {
    if cache == Cache::Cold {
        sys::evict_path(path)?;
    }
    let want = buf.len();
    match &subject.backend {
        Some(b) => timed(meter, || {
            let f = b.open(path, OpenMode::Read)?;
            clock(|| check_len(f.read_at(0, buf.as_mem_mut())?, want, path))
        }),
        None => timed(meter, || clock(|| read_raw(path, buf))),
    }
}

/// Reads `path` once through the page cache, so warm reads find it cached.
pub fn prime(path: &Path, buf: &mut HostBuffer) -> Result<()> {
    let f = fastensor_posix::PosixBackend.open(path, OpenMode::Read)?;
    check_len(f.read_at(0, buf.as_mem_mut())?, buf.len(), path)
}

fn check_len(got: usize, want: usize, path: &Path) -> Result<()> {
    if got != want {
        return Err(Error::new(
            ErrorKind::UnexpectedEof,
            format!("read {got} of {want} bytes"),
        )
        .with_path(path));
    }
    Ok(())
}

/// The reference: a single-threaded `O_DIRECT` loop of 4 MiB blocks (like `dd`), then
/// `fdatasync`.
pub fn write_raw(path: &Path, buf: &HostBuffer) -> Result<()> {
    let f = sys::open_file(path, OpenMode::Truncate, true, RAW)?;
    for (i, block) in buf.chunks(RAW_BLOCK).enumerate() {
        let off = (i * RAW_BLOCK) as u64;
        sys::pwrite_all(&f, block, off)
            .map_err(|e| sys::transfer_error(e, "write failed", RAW, path, off))?;
    }
    f.sync_data()
        .map_err(|e| sys::transfer_error(e, "fdatasync failed", RAW, path, 0))
}

/// The reference: a single-threaded `O_DIRECT` read loop of 4 MiB blocks.
fn read_raw(path: &Path, buf: &mut HostBuffer) -> Result<()> {
    let want = buf.len();
    let f = sys::open_file(path, OpenMode::Read, true, RAW)?;
    let mut got = 0;
    for (i, block) in buf.chunks_mut(RAW_BLOCK).enumerate() {
        let off = (i * RAW_BLOCK) as u64;
        got += sys::pread_full(&f, block, off)
            .map_err(|e| sys::transfer_error(e, "read failed", RAW, path, off))?;
    }
    check_len(got, want, path)
}
