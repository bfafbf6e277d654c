//! Timing one transfer: wall time and process CPU time.

use fastensor::{Backend, Error, ErrorKind, HostBuffer, OpenMode, Result};
use fastensor_posix::sys;
use std::path::Path;
use std::time::Instant;

/// Block size of the `raw` reference loop, as `dd bs=4M iflag=direct`.
pub const RAW_BLOCK: usize = 4 << 20;

/// The name of the reference row.
pub const RAW: &str = "raw";

/// One timed transfer.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// Wall-clock seconds.
    pub seconds: f64,
    /// CPU seconds (user + system, all threads of the process).
    pub cpu_seconds: f64,
}

fn timed(f: impl FnOnce() -> Result<()>) -> Result<Sample> {
    let cpu0 = sys::process_cpu_seconds();
    let t0 = Instant::now();
    f()?;
    Ok(Sample {
        seconds: t0.elapsed().as_secs_f64(),
        cpu_seconds: sys::process_cpu_seconds() - cpu0,
    })
}

/// Writes `buf` to a new file `path` through `backend`; done when durable (synced).
pub fn write_backend(backend: &dyn Backend, path: &Path, buf: &HostBuffer) -> Result<Sample> {
    let _ = std::fs::remove_file(path);
    timed(|| {
        let f = backend.open(path, OpenMode::Truncate)?;
        f.write_at(0, buf.as_mem())?;
        f.sync()
    })
}

/// Reads all of `path` (page cache dropped first) into `buf` through `backend`.
pub fn read_backend(backend: &dyn Backend, path: &Path, buf: &mut HostBuffer) -> Result<Sample> {
    sys::evict_path(path)?;
    let want = buf.len();
    timed(|| {
        let f = backend.open(path, OpenMode::Read)?;
        let got = f.read_at(0, buf.as_mem_mut())?;
        check_len(got, want, path)
    })
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
pub fn write_raw(path: &Path, buf: &HostBuffer) -> Result<Sample> {
    let _ = std::fs::remove_file(path);
    timed(|| {
        let f = sys::open_file(path, OpenMode::Truncate, true, RAW)?;
        for (i, block) in buf.chunks(RAW_BLOCK).enumerate() {
            let off = (i * RAW_BLOCK) as u64;
            sys::pwrite_all(&f, block, off)
                .map_err(|e| sys::transfer_error(e, "write failed", RAW, path, off))?;
        }
        f.sync_data()
            .map_err(|e| sys::transfer_error(e, "fdatasync failed", RAW, path, 0))
    })
}

/// The reference: a single-threaded `O_DIRECT` read loop of 4 MiB blocks.
pub fn read_raw(path: &Path, buf: &mut HostBuffer) -> Result<Sample> {
    sys::evict_path(path)?;
    let want = buf.len();
    timed(|| {
        let f = sys::open_file(path, OpenMode::Read, true, RAW)?;
        let mut got = 0;
        for (i, block) in buf.chunks_mut(RAW_BLOCK).enumerate() {
            let off = (i * RAW_BLOCK) as u64;
            got += sys::pread_full(&f, block, off)
                .map_err(|e| sys::transfer_error(e, "read failed", RAW, path, off))?;
        }
        check_len(got, want, path)
    })
}
