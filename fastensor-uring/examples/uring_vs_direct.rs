//! Compares the `uring` backend with `posix-direct` in one run:
//!
//! 1. large sequential transfers (reads and writes of `SIZE_MIB`, default 256 MiB): bandwidth
//!    and CPU seconds per GiB (process CPU time, all threads);
//! 2. 10,000 random 4 KiB reads from a cold 1 GiB file: `uring` as one batch, `posix-direct`
//!    one `read_at` at a time.
//!
//! ```text
//! cargo run --release -p fastensor-uring --example uring_vs_direct -- DIR [SIZE_MIB] [REPS]
//! ```

use fastensor_core::{Backend, BackendFile, HostBuffer, OpenMode, ReadRequest};
use fastensor_posix::sys::{evict_path, process_cpu_seconds};
use fastensor_posix::{DirectBackend, DirectConfig};
use fastensor_uring::{UringBackend, UringConfig};
use std::path::{Path, PathBuf};
use std::time::Instant;

const GIB: f64 = (1u64 << 30) as f64;
const MIB: f64 = (1u64 << 20) as f64;

#[derive(Debug, Clone, Copy)]
struct Sample {
    secs: f64,
    cpu: f64,
}

impl Sample {
    fn mbps(&self, bytes: usize) -> f64 {
        bytes as f64 / MIB / self.secs
    }
    fn cpu_per_gib(&self, bytes: usize) -> f64 {
        self.cpu / (bytes as f64 / GIB)
    }
}

fn measure(f: impl FnOnce()) -> Sample {
    let c0 = process_cpu_seconds();
    let t0 = Instant::now();
    f();
    Sample {
        secs: t0.elapsed().as_secs_f64(),
        cpu: process_cpu_seconds() - c0,
    }
}

/// Best of `reps` by wall time; the CPU time is the median over the repetitions.
fn best(mut samples: Vec<Sample>) -> Sample {
    if std::env::var_os("VERBOSE").is_some() {
        let secs: Vec<String> = samples
            .iter()
            .map(|s| format!("{:.3}s/{:.3}cpu", s.secs, s.cpu))
            .collect();
        eprintln!("  samples: {}", secs.join(" "));
    }
    let mut cpus: Vec<f64> = samples.iter().map(|s| s.cpu).collect();
    cpus.sort_by(f64::total_cmp);
    samples.sort_by(|a, b| a.secs.total_cmp(&b.secs));
    Sample {
        secs: samples[0].secs,
        cpu: cpus[cpus.len() / 2],
    }
}

/// One write (with sync) and one cold read of the whole buffer.
fn large_once(backend: &dyn Backend, path: &Path, buf: &mut HostBuffer) -> (Sample, Sample) {
    let bytes = buf.len();
    let _ = std::fs::remove_file(path);
    let f = backend
        .open(path, OpenMode::Truncate)
        .expect("open for writing");
    let w = measure(|| {
        f.write_at(0, buf.as_mem()).expect("write");
        f.sync().expect("sync");
    });
    drop(f);
    evict_path(path).expect("evict");
    let f = backend
        .open(path, OpenMode::Read)
        .expect("open for reading");
    let r = measure(|| {
        let n = f.read_at(0, buf.as_mem_mut()).expect("read");
        assert_eq!(n, bytes);
    });
    (w, r)
}

fn offsets(count: usize, file_len: u64, seed: u64) -> Vec<u64> {
    let mut x = seed | 1;
    let blocks = file_len / 4096;
    (0..count)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % blocks) * 4096
        })
        .collect()
}

fn random_reads(f: &dyn BackendFile, path: &Path, offs: &[u64], batch: bool) -> Sample {
    let mut bufs: Vec<HostBuffer> = offs
        .iter()
        .map(|_| HostBuffer::new(4096).unwrap())
        .collect();
    evict_path(path).expect("evict");
    if batch {
        let mut reqs: Vec<ReadRequest<'_>> = offs
            .iter()
            .zip(bufs.iter_mut())
            .map(|(&o, b)| ReadRequest::new(o, b.as_mem_mut()))
            .collect();
        measure(|| f.read_batch(&mut reqs).expect("batch read"))
    } else {
        measure(|| {
            for (&o, b) in offs.iter().zip(bufs.iter_mut()) {
                f.read_at(o, b.as_mem_mut()).expect("read");
            }
        })
    }
}

fn make_file(path: &Path, len: usize) {
    if std::fs::metadata(path)
        .map(|m| m.len() == len as u64)
        .unwrap_or(false)
    {
        return;
    }
    let f = DirectBackend::default()
        .open(path, OpenMode::Truncate)
        .unwrap();
    let mut chunk = HostBuffer::new(64 << 20).unwrap();
    for (i, b) in chunk.iter_mut().enumerate() {
        *b = (i * 31 % 251) as u8;
    }
    let mut off = 0;
    while off < len {
        let n = chunk.len().min(len - off);
        f.write_at(off as u64, fastensor_core::MemRef::Host(&chunk[..n]))
            .unwrap();
        off += n;
    }
    f.sync().unwrap();
}

fn run_large(
    direct: &DirectBackend,
    uring_configs: &[(String, UringBackend)],
    dir: &Path,
    bytes: usize,
    size_mib: usize,
    reps: usize,
) {
    let dc = direct.config();
    println!(
        "# large transfers: {size_mib} MiB, best of {reps} (interleaved; cpu = median); posix-direct = {} threads x {} MiB",
        dc.threads,
        dc.chunk_size >> 20
    );
    let mut buf = HostBuffer::new(bytes).expect("buffer");
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (i % 253) as u8;
    }
    let path = dir.join("uring_vs_direct.large");
    println!(
        "{:<26} {:>10} {:>12} {:>10} {:>12}",
        "backend", "write MB/s", "write cpu/GiB", "read MB/s", "read cpu/GiB"
    );
    let row = |name: &str, w: Sample, r: Sample| {
        println!(
            "{:<26} {:>10.0} {:>12.3}s {:>10.0} {:>11.3}s",
            name,
            w.mbps(bytes),
            w.cpu_per_gib(bytes),
            r.mbps(bytes),
            r.cpu_per_gib(bytes)
        );
    };
    // Backends take turns within each repetition, so drift of the disk hits all alike.
    let mut backends: Vec<(&str, &dyn Backend)> = vec![("posix-direct", direct)];
    for (name, b) in uring_configs {
        backends.push((name, b));
    }
    let mut samples = vec![(Vec::new(), Vec::new()); backends.len()];
    for _ in 0..reps {
        for (i, (_, b)) in backends.iter().enumerate() {
            let (w, r) = large_once(*b, &path, &mut buf);
            samples[i].0.push(w);
            samples[i].1.push(r);
        }
    }
    let mut results = Vec::new();
    for ((name, _), (w, r)) in backends.iter().zip(samples) {
        let (w, r) = (best(w), best(r));
        row(name, w, r);
        results.push((name.to_string(), w, r));
    }
    let (dw, dr) = (results[0].1, results[0].2);
    let uring_results = &results[1..];
    let _ = std::fs::remove_file(&path);
    println!("# ratios uring / posix-direct (bandwidth: >= 0.95 wanted; cpu: < 1 wanted)");
    for (name, w, r) in uring_results {
        println!(
            "{:<26} write bw {:.3}  write cpu {:.3}  read bw {:.3}  read cpu {:.3}",
            name,
            w.mbps(bytes) / dw.mbps(bytes),
            w.cpu / dw.cpu,
            r.mbps(bytes) / dr.mbps(bytes),
            r.cpu / dr.cpu
        );
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().unwrap_or_else(|| {
        eprintln!("usage: uring_vs_direct DIR [SIZE_MIB] [REPS]");
        std::process::exit(2)
    }));
    let size_mib: usize = args.next().map_or(256, |s| s.parse().expect("SIZE_MIB"));
    let reps: usize = args.next().map_or(3, |s| s.parse().expect("REPS"));
    let bytes = size_mib << 20;

    let direct = DirectBackend::new(DirectConfig::default());
    // `URING_CONFIGS="QDxCHUNK_KIB,..."` overrides the uring settings compared.
    let spec = std::env::var("URING_CONFIGS").unwrap_or_else(|_| "16x2048,32x1024,8x4096".into());
    let uring_configs: Vec<(String, UringBackend)> = spec
        .split(',')
        .map(|c| {
            let (qd, kib) = c.split_once('x').expect("QDxCHUNK_KIB");
            let cfg = UringConfig {
                queue_depth: qd.trim().parse().expect("queue depth"),
                chunk_size: kib.trim().parse::<usize>().expect("chunk KiB") << 10,
                ..UringConfig::default()
            };
            let name = format!("uring qd={} x {}KiB", cfg.queue_depth, cfg.chunk_size >> 10);
            (name, UringBackend::new(cfg))
        })
        .collect();
    let only = std::env::var("ONLY").unwrap_or_default();
    if only != "random" {
        run_large(&direct, &uring_configs, &dir, bytes, size_mib, reps);
    }
    if only == "large" {
        return;
    }
    // Random 4 KiB reads from a cold 1 GiB file.
    let count = 10_000;
    let file_len = 1usize << 30;
    let rpath = dir.join("uring_vs_direct.1g");
    make_file(&rpath, file_len);
    let offs = offsets(count, file_len as u64, 0x5EED);
    println!(
        "# {count} random 4 KiB reads from a cold 1 GiB file (page cache dropped before each)"
    );
    let iops = |s: Sample| count as f64 / s.secs;
    // The best of `reps` runs of the random reads through `backend` (one `read_batch`, or a
    // `read_at` loop), printed as `label`.
    let random = |backend: &dyn Backend, batch: bool, label: &str| {
        let f = backend.open(&rpath, OpenMode::Read).unwrap();
        let s = best(
            (0..reps)
                .map(|_| random_reads(f.as_ref(), &rpath, &offs, batch))
                .collect(),
        );
        println!("{:<34} {:>10.0} req/s  cpu {:.3}s", label, iops(s), s.cpu);
        s
    };
    let d_one = random(&direct, false, "posix-direct read_at loop");
    for (name, b) in &uring_configs {
        let s = random(b, true, &format!("{name} read_batch"));
        println!(
            "  ratio vs posix-direct: {:.2}x (>= 2x wanted)",
            iops(s) / iops(d_one)
        );
    }
    random(&UringBackend::default(), false, "uring read_at loop (qd 1)");
    if std::env::var_os("KEEP").is_none() {
        let _ = std::fs::remove_file(&rpath);
    }
}
