//! How the engine measures a cold read stream, against the stream's own speed.
//!
//! `cargo run --release --example stream_runs -- DIR CHUNK BACKEND...`
//!
//! Writes a 256 MiB file in DIR; then, twice per backend, drops its page cache and reads it
//! once in reads of CHUNK bytes through an engine allowed only that backend, and prints the
//! stream's speed (bytes over the whole read) next to the samples the engine recorded for
//! the context (GB/s, oldest first), their median and their mean cost. The selector compares
//! candidates on such medians, so the samples of a path should measure what the stream
//! costs through it.

use fastensor::engine::evict;
use fastensor::{Engine, HostBuffer, OpenMode};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        return Err("usage: stream_runs DIR CHUNK BACKEND...".into());
    }
    let path = std::path::Path::new(&args[0]).join(".stream_runs.bin");
    let chunk: usize = args[1].parse()?;
    let size: usize = 256 << 20;
    let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    std::fs::write(&path, &data)?;
    drop(data);
    let mut buf = HostBuffer::new(chunk)?;
    for backend in &args[2..] {
        for _ in 0..2 {
            evict(&path)?;
            let engine = Engine::builder().backends([backend.as_str()]).build()?;
            let file = engine.open(&path, OpenMode::Read)?;
            let start = Instant::now();
            let mut off = 0u64;
            while (off as usize) < size {
                file.read_at(off, &mut buf[..])?;
                off += chunk as u64;
            }
            let stream = size as f64 / start.elapsed().as_nanos() as f64;
            drop(file); // records the run in progress
            for c in engine
                .dictionary()
                .contexts
                .iter()
                .filter(|c| c.cache == "cold")
            {
                for cand in c
                    .candidates
                    .iter()
                    .filter(|c| !c.time_ns_per_byte.is_empty())
                {
                    let costs = &cand.time_ns_per_byte;
                    let mut sorted = costs.clone();
                    sorted.sort_by(f64::total_cmp);
                    let median = sorted[sorted.len() / 2];
                    let mean = costs.iter().sum::<f64>() / costs.len() as f64;
                    let each: Vec<String> =
                        costs.iter().map(|x| format!("{:.2}", 1.0 / x)).collect();
                    println!(
                        "{backend} {chunk} B: stream {stream:.2} GB/s | {} samples: median {:.2} GB/s, mean cost {:.2} GB/s | {}",
                        costs.len(),
                        1.0 / median,
                        1.0 / mean,
                        each.join(" ")
                    );
                }
            }
        }
    }
    std::fs::remove_file(&path)?;
    Ok(())
}
