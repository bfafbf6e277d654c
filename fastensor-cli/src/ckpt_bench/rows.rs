//! Pieces of the checkpoint benchmark (`fastensor ckpt bench`): a
//! GPT-2-medium-shaped state dict, the disk's measured limit, and timed durable saves and cold
//! loads (page cache dropped before each load), wall and CPU time.

use fastensor::checkpoint::{load, load_into, save, FileOpener, TensorView};
use fastensor::posix::sys;
use fastensor::{DType, Error, HostBuffer, OpenMode, Result, TensorDesc};
use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;
use std::time::Instant;

/// The tensors of GPT-2 medium (24 layers, width 1024, 50257 tokens; about 355 M f32
/// parameters, 1.4 GB, 292 tensors from 4 KiB to 196 MiB). `scale` (0 < scale ≤ 1) shrinks
/// the first dimension of every matrix, keeping the number of tensors, for quick runs.
pub fn gpt2_medium(scale: f64) -> Vec<TensorDesc> {
    let d = 1024u64;
    let rows = |r: u64| ((r as f64 * scale).round() as u64).max(1);
    let mut out = vec![
        TensorDesc::new("wte.weight", DType::F32, [rows(50257), d]),
        TensorDesc::new("wpe.weight", DType::F32, [rows(1024), d]),
    ];
    for l in 0..24 {
        let p = format!("h.{l}.");
        let v = |n: &str, shape: Vec<u64>| TensorDesc::new(format!("{p}{n}"), DType::F32, shape);
        out.extend([
            v("ln_1.weight", vec![d]),
            v("ln_1.bias", vec![d]),
            v("attn.c_attn.weight", vec![rows(d), 3 * d]),
            v("attn.c_attn.bias", vec![3 * d]),
            v("attn.c_proj.weight", vec![rows(d), d]),
            v("attn.c_proj.bias", vec![d]),
            v("ln_2.weight", vec![d]),
            v("ln_2.bias", vec![d]),
            v("mlp.c_fc.weight", vec![rows(d), 4 * d]),
            v("mlp.c_fc.bias", vec![4 * d]),
            v("mlp.c_proj.weight", vec![rows(4 * d), d]),
            v("mlp.c_proj.bias", vec![d]),
        ]);
    }
    out.push(TensorDesc::new("ln_f.weight", DType::F32, [d]));
    out.push(TensorDesc::new("ln_f.bias", DType::F32, [d]));
    out
}

/// One page-aligned buffer per descriptor, filled with pseudo-random bytes.
pub fn state_dict(descs: &[TensorDesc]) -> Result<Vec<HostBuffer>> {
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    descs
        .iter()
        .map(|d| {
            let mut buf = HostBuffer::new(d.byte_len()? as usize)?;
            for w in buf.chunks_mut(8) {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                w.copy_from_slice(&seed.to_le_bytes()[..w.len()]);
            }
            Ok(buf)
        })
        .collect()
}

/// Views of a state dict made by [`state_dict`].
pub fn views<'a>(descs: &[TensorDesc], bufs: &'a [HostBuffer]) -> Vec<TensorView<'a>> {
    descs
        .iter()
        .zip(bufs)
        .map(|(d, b)| TensorView::new(d.clone(), b))
        .collect()
}

/// Wall and CPU seconds of one timed operation.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Timing {
    /// Wall-clock seconds.
    pub wall_s: f64,
    /// CPU seconds of the whole process (all threads).
    pub cpu_s: f64,
}

/// Times `f` (wall and process CPU time).
pub fn timed<T>(f: impl FnOnce() -> Result<T>) -> Result<(T, Timing)> {
    let (w, c) = (Instant::now(), sys::process_cpu_seconds());
    let out = f()?;
    Ok((
        out,
        Timing {
            wall_s: w.elapsed().as_secs_f64(),
            cpu_s: sys::process_cpu_seconds() - c,
        },
    ))
}

/// A row of the benchmark: a durable save and a cold load of `bytes` bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// What was measured, e.g. `fastensor`.
    pub label: String,
    /// Bytes moved each way.
    pub bytes: u64,
    /// The durable save.
    pub save: Timing,
    /// The cold load.
    pub load: Timing,
}

impl Row {
    /// Save bandwidth in MB/s (10^6 bytes).
    pub fn save_mbps(&self) -> f64 {
        self.bytes as f64 / self.save.wall_s / 1e6
    }

    /// Load bandwidth in MB/s.
    pub fn load_mbps(&self) -> f64 {
        self.bytes as f64 / self.load.wall_s / 1e6
    }
}

/// Writes back every dirty page of the system (`sync`) and waits `pause`, so the next
/// measurement starts from a quiet device.
pub fn quiesce(pause: std::time::Duration) {
    rustix::fs::sync();
    std::thread::sleep(pause);
}

/// The pause before every save (after a global `sync`).
const SETTLE: std::time::Duration = std::time::Duration::from_secs(1);

/// Measures a save (`save`, which must be durable; after a global `sync` and a pause of
/// 1 s) then, after dropping `path` from the page cache, a load (`load`).
pub fn measure(
    label: &str,
    bytes: u64,
    path: &Path,
    save: impl FnOnce() -> Result<()>,
    load: impl FnOnce() -> Result<()>,
) -> Result<Row> {
    // Every save starts from a quiet device: what earlier rows wrote is flushed, and the
    // device gets a moment to drain its own write cache, so a row's time does not depend on
    // how much the row before it left behind.
    quiesce(SETTLE);
    let ((), save) = timed(save)?;
    sys::evict_path(path)?;
    let ((), load) = timed(load)?;
    sys::evict_path(path)?;
    Ok(Row {
        label: label.to_string(),
        bytes,
        save,
        load,
    })
}

/// What [`disk_limit`] measured.
#[derive(Debug, Clone, PartialEq)]
pub struct DiskLimit {
    /// The device's limit: the raw loop writing, then reading into one reused 16 MiB buffer.
    pub device: Row,
    /// The limit of a load into new memory ([`DISK_FRESH_LABEL`]): the raw loop reading the
    /// file into its reused buffer while every core faults in fresh memory of the file's
    /// size, both at once (the best overlap a load can reach, interference between the two
    /// included); its save is the device row's.
    pub fresh: Row,
    /// Seconds the fault-in took, alongside the read.
    pub fault_in_s: f64,
    /// Seconds the read took, alongside the fault-in.
    pub read_s: f64,
    /// Threads that faulted the memory in (the machine's cores).
    pub threads: usize,
}

/// The disk's limit: a plain `O_DIRECT` loop writing then (cold) reading `bytes` bytes in
/// 16 MiB requests, one at a time, at `path` (left for the caller to remove: on a file
/// system mounted with `discard`, freeing 1 GB costs the next commit dearly, and that cost
/// belongs to no row).
///
/// Also the limit of a load into new memory (as a load into a new arena gets): that memory
/// must be faulted in, which is CPU work every core can share, and the bytes read, which is
/// device time. Both are run at once: the loop reads the file again, cold, while every core
/// faults in a fresh [`HostBuffer`] of `bytes` bytes. On a virtual machine whose host backs
/// guest memory only when it is first touched, faulting in costs 0.6-1.8 CPU seconds per
/// GiB, more than the device's time, and slows the device's reads down.
pub fn disk_limit(path: &Path, bytes: u64) -> Result<DiskLimit> {
    const BLOCK: usize = 16 << 20;
    let blocks = bytes.div_ceil(BLOCK as u64).max(1);
    let total = blocks * BLOCK as u64;
    let mut buf = HostBuffer::new(BLOCK)?;
    buf.fill(0x5A);
    let io = |e: std::io::Error| Error::io(e, "raw O_DIRECT loop").with_path(path);
    let read_all = || -> Result<()> {
        let mut dst = HostBuffer::new(BLOCK)?;
        let f = sys::open_file(path, OpenMode::Read, true, "bench")?;
        for i in 0..blocks {
            sys::pread_full(&f, &mut dst, i * BLOCK as u64).map_err(io)?;
        }
        Ok(())
    };
    let device = measure(
        DISK_LABEL,
        total,
        path,
        || {
            let f = sys::open_file(path, OpenMode::Truncate, true, "bench")?;
            for i in 0..blocks {
                sys::pwrite_all(&f, &buf, i * BLOCK as u64).map_err(io)?;
            }
            f.sync_data().map_err(io)
        },
        read_all,
    )?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut fresh = HostBuffer::new(total as usize)?;
    let ((fault_in_s, read_s), load) = timed(|| {
        std::thread::scope(|scope| {
            let reader = scope.spawn(|| {
                let t = Instant::now();
                read_all().map(|()| t.elapsed().as_secs_f64())
            });
            let t = Instant::now();
            let faulted = fault_in_pages(&mut fresh, threads).map(|()| t.elapsed().as_secs_f64());
            let read = reader.join().expect("the read loop does not panic");
            Ok((faulted?, read?))
        })
    })?;
    drop(fresh);
    sys::evict_path(path)?;
    let fresh = Row {
        label: DISK_FRESH_LABEL.to_string(),
        bytes: total,
        save: device.save,
        load,
    };
    Ok(DiskLimit {
        device,
        fresh,
        fault_in_s,
        read_s,
        threads,
    })
}

/// Faults in `buf` (as the checkpoint arena does), split between `threads` threads.
fn fault_in_pages(buf: &mut [u8], threads: usize) -> Result<()> {
    let per = buf.len().div_ceil(threads.max(1)).max(1);
    let parts: Vec<&mut [u8]> = buf.chunks_mut(per).collect();
    fastensor::core::parallel::for_each(parts, threads, |part| {
        fault_in(part);
        Ok(())
    })
}

/// The label of [`DiskLimit::device`].
pub const DISK_LABEL: &str = "disk (raw O_DIRECT)";

/// The label of [`DiskLimit::fresh`] (the limit of a load into new memory).
pub const DISK_FRESH_LABEL: &str = "limit into fresh memory";

/// The bytes of `tensors`' data.
pub fn tensor_bytes(tensors: &[TensorView<'_>]) -> u64 {
    tensors.iter().map(|t| t.data.len() as u64).sum()
}

/// A row `label` of fastensor's [`save`] of `tensors` through `opener`, then `load`.
fn fastensor_measure<O: FileOpener + ?Sized>(
    label: &str,
    opener: &O,
    path: &Path,
    tensors: &[TensorView<'_>],
    load: impl FnOnce() -> Result<()>,
) -> Result<Row> {
    let write = || save(opener, path, tensors);
    measure(label, tensor_bytes(tensors), path, write, load)
}

/// fastensor: [`save`] and [`load`] through `opener`.
pub fn fastensor_row<O: FileOpener + ?Sized>(
    opener: &O,
    path: &Path,
    tensors: &[TensorView<'_>],
) -> Result<Row> {
    fastensor_measure("fastensor", opener, path, tensors, || {
        load(opener, path).map(|c| assert_eq!(c.len(), tensors.len()))
    })
}

/// fastensor loading into existing memory: [`save`], then [`load_into`] `dests` (one buffer
/// per tensor, allocated and written before the timing starts, as a model's parameters are
/// when a state dict is loaded into it). The load pays no page faults, only the I/O.
pub fn fastensor_into_row<O: FileOpener + ?Sized>(
    opener: &O,
    path: &Path,
    tensors: &[TensorView<'_>],
    dests: &mut [HostBuffer],
) -> Result<Row> {
    fastensor_measure("fastensor, into existing", opener, path, tensors, || {
        let targets = tensors
            .iter()
            .zip(dests.iter_mut())
            .map(|(t, d)| (t.desc.name.as_str(), d.as_mem_mut()))
            .collect();
        load_into(opener, path, targets).map(|_| ())
    })
}

/// The plain way: one buffered `write` per tensor into the page cache, `fsync`, and a
/// buffered read of the whole file. `prefix` is written first (e.g. a header).
pub fn buffered_row(path: &Path, prefix: &[u8], tensors: &[TensorView<'_>]) -> Result<Row> {
    let io = |e: std::io::Error| Error::io(e, "buffered I/O").with_path(path);
    measure(
        "plain buffered + fsync",
        tensor_bytes(tensors),
        path,
        || {
            let mut f = File::create(path).map_err(io)?;
            f.write_all(prefix).map_err(io)?;
            for t in tensors {
                if let fastensor::MemRef::Host(b) = t.data {
                    f.write_all(b).map_err(io)?;
                }
            }
            f.sync_all().map_err(io)
        },
        || {
            let mut v = Vec::new();
            File::open(path)
                .and_then(|mut f| f.read_to_end(&mut v))
                .map_err(io)?;
            Ok(())
        },
    )
}

/// A table of `rows` with bandwidths, CPU seconds per GiB, and ratios to `reference` (the
/// label of the row the others are compared with) and to the disk row (`disk`); loads are
/// also compared with the limit of a load into fresh memory ([`DISK_FRESH_LABEL`]) when
/// that row is present.
pub fn format_rows(rows: &[Row], reference: &str, disk: &str) -> String {
    let gib = |r: &Row| r.bytes as f64 / (1u64 << 30) as f64;
    let find = |l: &str| rows.iter().find(|r| r.label == l);
    let mut out = format!(
        "{:<28} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}\n",
        "",
        "save s",
        "MB/s",
        "cpu s/GiB",
        "vs ref",
        "of disk",
        "load s",
        "MB/s",
        "cpu s/GiB",
        "vs ref",
        "of disk",
        "of fresh"
    );
    for r in rows {
        let ratio = |f: fn(&Row) -> f64, other: Option<&Row>| {
            other.map_or("-".to_string(), |o| format!("{:.2}x", f(o) / f(r)))
        };
        let of_disk = |f: fn(&Row) -> f64, d: Option<&Row>| {
            d.map_or("-".to_string(), |d| format!("{:.0}%", 100.0 * f(d) / f(r)))
        };
        let load_per_byte = |x: &Row| x.load.wall_s / x.bytes as f64;
        out.push_str(&format!(
            "{:<28} {:>9.3} {:>9.0} {:>9.3} {:>9} {:>9} {:>9.3} {:>9.0} {:>9.3} {:>9} {:>9} {:>9}\n",
            r.label,
            r.save.wall_s,
            r.save_mbps(),
            r.save.cpu_s / gib(r),
            ratio(|x| x.save.wall_s, find(reference)),
            of_disk(|x| x.save.wall_s / x.bytes as f64, find(disk)),
            r.load.wall_s,
            r.load_mbps(),
            r.load.cpu_s / gib(r),
            ratio(|x| x.load.wall_s, find(reference)),
            of_disk(load_per_byte, find(disk)),
            of_disk(load_per_byte, find(DISK_FRESH_LABEL)),
        ));
    }
    out.push_str(&format!(
        "`vs ref`: speed-up over `{reference}` (its time / this time); `of disk`: this bandwidth as a share of the disk's; `of fresh`: as a share of the limit of a load into fresh memory (the device's read while every core faults the memory in).\n"
    ));
    out
}

/// Writes one byte of every page of `mem`, so that its memory is backed.
fn fault_in(mem: &mut [u8]) {
    for i in (0..mem.len()).step_by(4096) {
        mem[i] = 0;
    }
    // The stores must happen even when nothing reads the memory afterwards.
    std::hint::black_box(mem);
}
