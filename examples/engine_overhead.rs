//! What the engine adds to a small transfer: 4 KiB reads and writes through an engine,
//! against the same system calls made directly, in one run.
//!
//! `cargo run --release --example engine_overhead -- DIR [--rounds N]`
//!
//! Three workloads on a 64 MiB file in DIR, each timed per transfer, median over the rounds
//! (default 5; the contenders take turns within each round):
//!
//! * `cached read`: the file read in 4 KiB reads from the page cache, 4 passes;
//! * `cached write`: the file written in 4 KiB writes into the page cache, 4 passes;
//! * `cold read`: the file read once in 4 KiB reads after its page cache was dropped.
//!
//! Contenders: `raw` (`pread`/`pwrite` on a `std::fs::File`), an engine allowed only
//! `posix` (the selector still chooses, measures and records every transfer), an engine
//! allowed only `mmap` (reads), and `auto` (every backend; a fresh engine every round, so
//! its exploration is included).

use fastensor::engine::evict;
use fastensor::{Engine, HostBuffer, OpenMode};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

const FILE_BYTES: usize = 64 << 20;
const CHUNK: usize = 4096;
const PASSES: usize = 4;

#[derive(Clone, Copy, PartialEq)]
enum Work {
    CachedRead,
    CachedWrite,
    ColdRead,
}

impl Work {
    fn label(self) -> &'static str {
        match self {
            Work::CachedRead => "cached read",
            Work::CachedWrite => "cached write",
            Work::ColdRead => "cold read",
        }
    }

    fn passes(self) -> usize {
        match self {
            Work::ColdRead => 1,
            _ => PASSES,
        }
    }
}

/// Nanoseconds per transfer of `work` by `contender` on `path`.
fn time_one(
    contender: &str,
    work: Work,
    path: &Path,
    buf: &mut HostBuffer,
) -> fastensor::Result<f64> {
    if work == Work::ColdRead {
        evict(path)?;
    } else {
        // Everything cached before a cached pass.
        let _ = std::fs::read(path);
    }
    let transfers = work.passes() * FILE_BYTES / CHUNK;
    let offsets =
        || (0..work.passes()).flat_map(|_| (0..FILE_BYTES / CHUNK).map(|i| (i * CHUNK) as u64));
    let start;
    if contender == "raw" {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| fastensor::Error::io(e, "cannot open").with_path(path))?;
        let io = |e| fastensor::Error::io(e, "raw transfer failed").with_path(path);
        start = Instant::now();
        for off in offsets() {
            match work {
                Work::CachedWrite => file.write_all_at(&buf[..CHUNK], off).map_err(io)?,
                _ => file.read_exact_at(&mut buf[..CHUNK], off).map_err(io)?,
            }
        }
    } else {
        let engine = match contender {
            "auto" => Engine::builder().build()?,
            one => Engine::builder().backends([one]).build()?,
        };
        let mode = match work {
            Work::CachedWrite => OpenMode::ReadWrite,
            _ => OpenMode::Read,
        };
        let file = engine.open(path, mode)?;
        start = Instant::now();
        for off in offsets() {
            match work {
                Work::CachedWrite => file.write_at(off, &buf[..CHUNK])?,
                _ => {
                    file.read_at(off, &mut buf[..CHUNK])?;
                }
            }
        }
    }
    Ok(start.elapsed().as_nanos() as f64 / transfers as f64)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mut dir: Option<PathBuf> = None;
    let mut rounds = 5usize;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--rounds" => rounds = args.next().ok_or("--rounds needs a value")?.parse()?,
            _ => dir = Some(PathBuf::from(a)),
        }
    }
    let dir = dir.ok_or("usage: engine_overhead DIR [--rounds N]")?;
    let path = dir.join(".engine_overhead.bin");
    let data: Vec<u8> = (0..FILE_BYTES).map(|i| (i % 251) as u8).collect();
    std::fs::write(&path, &data)?;
    let mut buf = HostBuffer::new(CHUNK)?;
    println!(
        "4 KiB transfers on a 64 MiB file in {}, {rounds} rounds, median ns per transfer",
        dir.display()
    );
    for work in [Work::CachedRead, Work::CachedWrite, Work::ColdRead] {
        let contenders: &[&str] = match work {
            Work::CachedWrite => &["raw", "posix", "auto"],
            _ => &["raw", "posix", "mmap", "auto"],
        };
        let mut times: Vec<Vec<f64>> = vec![Vec::new(); contenders.len()];
        for round in 0..rounds {
            // A different contender goes first every round.
            for k in 0..contenders.len() {
                let i = (k + round) % contenders.len();
                times[i].push(time_one(contenders[i], work, &path, &mut buf)?);
            }
        }
        let raw = median(times[0].clone());
        for (name, t) in contenders.iter().zip(times) {
            let m = median(t);
            println!(
                "{:13} {:6} {:8.0} ns   {:5.2}x raw   ({:+.0} ns)",
                work.label(),
                name,
                m,
                m / raw,
                m - raw
            );
        }
    }
    std::fs::remove_file(&path)?;
    Ok(())
}
