//! Random small reads from a cold file: a batch through each backend's `read_batch`, and the
//! same requests one `read_at` at a time.

use crate::table::Table;
use fastensor::core::ReadRequest;
use fastensor::{Backend, Error, ErrorKind, HostBuffer, OpenMode, Result};
use fastensor_posix::sys;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// Bytes per random request.
pub const REQUEST: usize = 4096;

/// One row of the random-read table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RandomRow {
    /// Backend name.
    pub backend: String,
    /// `batch` (one `read_batch` call) or `one-at-a-time` (`read_at` in a loop).
    pub mode: String,
    /// Requests issued.
    pub requests: usize,
    /// Size of the file read from.
    pub file_bytes: u64,
    /// Requests per second.
    pub requests_per_s: f64,
    /// CPU seconds for all the requests.
    pub cpu_seconds: f64,
    /// Requests per second over `posix-direct` one at a time, in the same run.
    pub ratio_to_direct_single: Option<f64>,
}

/// Wall and CPU seconds of a run of requests.
struct Timing {
    seconds: f64,
    cpu_seconds: f64,
}

/// Deterministic, distinct, 4 KiB-aligned offsets inside `file_bytes`.
fn offsets(count: usize, file_bytes: u64) -> Vec<u64> {
    let blocks = file_bytes / REQUEST as u64;
    let mut s: u64 = 0x2545_F491_4F6C_DD1D;
    (0..count)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % blocks) * REQUEST as u64
        })
        .collect()
}

fn run_one(
    backend: &dyn Backend,
    path: &Path,
    offs: &[u64],
    batch: bool,
    arena: &mut HostBuffer,
) -> Result<Timing> {
    sys::evict_path(path)?;
    let cpu0 = sys::process_cpu_seconds();
    let t0 = Instant::now();
    let f = backend.open(path, OpenMode::Read)?;
    let pieces = arena.chunks_mut(REQUEST);
    if batch {
        let mut reqs: Vec<ReadRequest<'_>> = offs
            .iter()
            .zip(pieces)
            .map(|(&o, p)| ReadRequest::new(o, p))
            .collect();
        f.read_batch(&mut reqs)?;
        if let Some(r) = reqs.iter().find(|r| r.done != REQUEST) {
            return Err(Error::new(
                ErrorKind::UnexpectedEof,
                format!("short random read at {}", r.offset),
            )
            .with_path(path));
        }
    } else {
        for (&o, p) in offs.iter().zip(pieces) {
            if f.read_at(o, p.into())? != REQUEST {
                return Err(Error::new(
                    ErrorKind::UnexpectedEof,
                    format!("short random read at {o}"),
                )
                .with_path(path));
            }
        }
    }
    Ok(Timing {
        seconds: t0.elapsed().as_secs_f64(),
        cpu_seconds: sys::process_cpu_seconds() - cpu0,
    })
}

/// Measures `count` random 4 KiB reads from a cold file of `file_bytes` in `dir`, for every
/// backend, as one batch and one at a time.
pub fn measure(
    backends: &[Arc<dyn Backend>],
    dir: &Path,
    count: usize,
    file_bytes: u64,
) -> Result<Vec<RandomRow>> {
    let path = dir.join("random.bin");
    {
        // Fill the file in 64 MiB pieces through the page cache.
        let f = fastensor_posix::PosixBackend.open(&path, OpenMode::Truncate)?;
        let mut piece = HostBuffer::new(64 << 20)?;
        let mut off = 0u64;
        while off < file_bytes {
            let n = (file_bytes - off).min(piece.len() as u64) as usize;
            piece[..8].copy_from_slice(&off.to_le_bytes());
            f.write_at(off, (&piece[..n]).into())?;
            off += n as u64;
            piece[8] = piece[8].wrapping_add(1);
        }
        f.sync()?;
    }
    let offs = offsets(count, file_bytes);
    let mut arena = HostBuffer::new(count * REQUEST)?;
    let mut check = None;
    let mut rows = Vec::new();
    for b in backends {
        for batch in [true, false] {
            let s = run_one(b.as_ref(), &path, &offs, batch, &mut arena)?;
            let sum: u64 = arena.iter().step_by(509).map(|&x| u64::from(x)).sum();
            if *check.get_or_insert(sum) != sum {
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    format!("`{}` read different bytes", b.name()),
                )
                .with_path(&path));
            }
            rows.push(RandomRow {
                backend: b.name().to_string(),
                mode: if batch { "batch" } else { "one-at-a-time" }.to_string(),
                requests: count,
                file_bytes,
                requests_per_s: count as f64 / s.seconds.max(1e-9),
                cpu_seconds: s.cpu_seconds,
                ratio_to_direct_single: None,
            });
        }
    }
    let _ = std::fs::remove_file(&path);
    let base = rows
        .iter()
        .find(|r| r.backend == "posix-direct" && r.mode == "one-at-a-time")
        .map(|r| r.requests_per_s);
    for r in &mut rows {
        r.ratio_to_direct_single = base.map(|b| r.requests_per_s / b);
    }
    Ok(rows)
}

/// The random-read table.
pub fn table(rows: &[RandomRow]) -> Table {
    let mut t = Table::new(&[
        "backend",
        "mode",
        "requests/s",
        "x posix-direct 1-at-a-time",
        "CPU s",
    ]);
    for r in rows {
        t.row(vec![
            r.backend.clone(),
            r.mode.clone(),
            format!("{:.0}", r.requests_per_s),
            r.ratio_to_direct_single
                .map_or("-".into(), |x| format!("{x:.2}")),
            format!("{:.3}", r.cpu_seconds),
        ]);
    }
    t
}
