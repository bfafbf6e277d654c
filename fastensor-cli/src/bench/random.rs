//! Random small reads from a cold file: a batch through each backend's `read_batch`, and
//! requests one `read_at` at a time; and both through an `auto` engine file over the same
//! backends (`auto`: a fresh engine each, its exploration included; `auto-explored`: an
//! engine that explored the same kind of run on other blocks first).
//!
//! Every run reads blocks no other run read, so that no run finds what an earlier one left
//! in a cache below the guest's page cache. The same code (posix's `read_batch` is the
//! default loop over `read_at`) ran at 0.72x and at 1.37x its own loop in one run here: one
//! run per row is this disk's noise, not a verdict.
use crate::table::Table;
use fastensor::core::ReadRequest;
use fastensor::Result;
use fastensor::{Backend, BackendFile, Engine, Error, ErrorKind, HostBuffer, OpenMode, Registry};
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

/// `runs` lists of `count` deterministic, distinct 4 KiB-aligned offsets inside `file_bytes`,
/// no offset in two lists while the file has blocks enough (a shuffle of its blocks, dealt
/// out in turn).
fn offsets(runs: usize, count: usize, file_bytes: u64) -> Vec<Vec<u64>> {
    let blocks = (file_bytes / REQUEST as u64).max(1);
    let mut s: u64 = 0x2545_F491_4F6C_DD1D;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let mut order: Vec<u64> = (0..blocks).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, (next() % (i as u64 + 1)) as usize);
    }
    let mut dealt = order.iter().cycle().map(|b| b * REQUEST as u64);
    (0..runs)
        .map(|_| dealt.by_ref().take(count).collect())
        .collect()
}

/// Opens the file read-only through one subject of the table.
type Opener<'a> = Box<dyn Fn(&Path) -> Result<Box<dyn BackendFile>> + 'a>;

fn run_one(
    open: &Opener<'_>,
    path: &Path,
    offs: &[u64],
    batch: bool,
    arena: &mut HostBuffer,
) -> Result<Timing> {
    sys::evict_path(path)?;
    let cpu0 = sys::process_cpu_seconds();
    let t0 = Instant::now();
    let f = open(path)?;
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
        // Fill the file in 64 MiB pieces through the page cache, every 4 KiB block starting
        // with its own offset (so that every read can be checked).
        let f = fastensor_posix::PosixBackend.open(&path, OpenMode::Truncate)?;
        let mut piece = HostBuffer::new(64 << 20)?;
        let mut off = 0u64;
        while off < file_bytes {
            let n = (file_bytes - off).min(piece.len() as u64) as usize;
            for (i, block) in piece[..n].chunks_mut(REQUEST).enumerate() {
                let at = (off + (i * REQUEST) as u64).to_le_bytes();
                let k = at.len().min(block.len());
                block[..k].copy_from_slice(&at[..k]);
            }
            f.write_at(off, (&piece[..n]).into())?;
            off += n as u64;
        }
        f.sync()?;
    }
    let mut subjects: Vec<(String, Opener<'_>)> = backends
        .iter()
        .map(|b| {
            let open: Opener<'_> = Box::new(move |p: &Path| b.open(p, OpenMode::Read));
            (b.name().to_string(), open)
        })
        .collect();
    let engine = || {
        backends
            .iter()
            .fold(Engine::builder().registry(Registry::new()), |e, b| {
                e.backend(b.clone())
            })
            .build()
    };
    let auto: Opener<'_> = Box::new(move |p: &Path| {
        let file: Box<dyn BackendFile> = Box::new(engine()?.open(p, OpenMode::Read)?);
        Ok(file)
    });
    subjects.push(("auto".to_string(), auto));
    // `auto-explored`: an engine that explored both modes on other blocks first (untimed).
    let explored = engine()?;
    let explored_open: Opener<'_> = Box::new(move |p: &Path| {
        let file: Box<dyn BackendFile> = Box::new(explored.open(p, OpenMode::Read)?);
        Ok(file)
    });
    let runs = offsets(subjects.len() * 2 + 4, count, file_bytes);
    let mut runs = runs.iter();
    let mut arena = HostBuffer::new(count * REQUEST)?;
    for batch in [true, false] {
        let offs = runs.next().expect("a warm-up run");
        run_one(&explored_open, &path, offs, batch, &mut arena)?;
    }
    subjects.push(("auto-explored".to_string(), explored_open));
    let mut rows = Vec::new();
    for (name, open) in &subjects {
        for batch in [true, false] {
            let offs = runs.next().expect("two runs per subject");
            let s = run_one(open, &path, offs, batch, &mut arena)?;
            let wrong = offs
                .iter()
                .zip(arena.chunks(REQUEST))
                .find(|(&o, block)| block[..8] != o.to_le_bytes());
            if let Some((o, _)) = wrong {
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    format!("`{name}` read wrong bytes at {o}"),
                )
                .with_path(&path));
            }
            rows.push(RandomRow {
                backend: name.clone(),
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
