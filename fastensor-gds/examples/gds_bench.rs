//! File <-> GPU bandwidth of `gds`, `cuda-staged`, and the reference `posix-direct` + copy
//! (O_DIRECT into page-aligned host memory, then `cuMemcpy`), in one run, with ratios; and
//! the ceiling of a read, min(disk, host-to-device copy): the disk's cold `O_DIRECT` read
//! into host memory and a copy from pinned host memory to the GPU, each measured alone.
//!
//! ```sh
//! cargo run --release -p fastensor-gds --example gds_bench -- [DIR] [SIZE_MIB] [REPEAT]
//! ```
//!
//! Reads are cold (the file's page cache is dropped before each one); writes count when
//! durable (`fdatasync`). Every path's first read is checked against the bytes written.
//! The last line, `ceiling_read_gib_s X`, is for scripts that set other loads against it.
//! Exits with status 2, printing why, when CUDA is unavailable.

use fastensor_core::{Availability, Backend, HostBuffer, OpenMode, Result};
use fastensor_gds::{DeviceBuffer, GdsBackend, StagedBackend};
use fastensor_posix::{sys, DirectBackend};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// One way of moving a file into and out of GPU memory.
trait Path2Gpu {
    fn name(&self) -> &str;
    fn read(&self, path: &Path, dev: &mut DeviceBuffer) -> Result<()>;
    fn write(&self, path: &Path, dev: &DeviceBuffer) -> Result<()>;
}

/// A backend that takes device memory directly.
struct Direct(Box<dyn Backend>);

impl Path2Gpu for Direct {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn read(&self, path: &Path, dev: &mut DeviceBuffer) -> Result<()> {
        let f = self.0.open(path, OpenMode::Read)?;
        f.read_at(0, dev.as_mem_mut()).map(|_| ())
    }
    fn write(&self, path: &Path, dev: &DeviceBuffer) -> Result<()> {
        let f = self.0.open(path, OpenMode::Truncate)?;
        f.write_at(0, dev.as_mem())?;
        f.sync()
    }
}

/// `posix-direct` into host memory, then a synchronous copy to the GPU (and the reverse).
struct HostThenCopy {
    backend: DirectBackend,
    host: std::cell::RefCell<HostBuffer>,
}

impl Path2Gpu for HostThenCopy {
    fn name(&self) -> &str {
        "posix-direct+copy"
    }
    fn read(&self, path: &Path, dev: &mut DeviceBuffer) -> Result<()> {
        let mut host = self.host.borrow_mut();
        let f = self.backend.open(path, OpenMode::Read)?;
        f.read_at(0, host.as_mem_mut())?;
        dev.copy_from_host(0, &host)
    }
    fn write(&self, path: &Path, dev: &DeviceBuffer) -> Result<()> {
        let mut host = self.host.borrow_mut();
        dev.copy_to_host(0, &mut host)?;
        let f = self.backend.open(path, OpenMode::Truncate)?;
        f.write_at(0, host.as_mem())?;
        f.sync()
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = PathBuf::from(args.first().cloned().unwrap_or_else(|| ".".into()));
    let mib: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(256);
    let repeat: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(3).max(1);
    if let Err(e) = run(&dir, mib << 20, repeat) {
        eprintln!("gds_bench: {e}");
        std::process::exit(if e.kind() == fastensor_core::ErrorKind::Unavailable {
            2
        } else {
            1
        });
    }
}

fn run(dir: &Path, size: usize, repeat: usize) -> Result<()> {
    let staged = StagedBackend::default();
    if let Availability::Unavailable { reason } = staged.probe() {
        return Err(fastensor_core::Error::new(
            fastensor_core::ErrorKind::Unavailable,
            reason,
        ));
    }
    println!("GPUs: {}", fastensor_gds::gpus());
    let gds = GdsBackend::default();
    println!("gds: {}", gds.describe());
    let mut paths: Vec<Box<dyn Path2Gpu>> = Vec::new();
    if gds.probe().is_available() {
        paths.push(Box::new(Direct(Box::new(gds))));
    }
    paths.push(Box::new(Direct(Box::new(staged))));
    paths.push(Box::new(HostThenCopy {
        backend: DirectBackend::default(),
        host: std::cell::RefCell::new(HostBuffer::new(size)?),
    }));

    let want: Vec<u8> = (0..size)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let src = DeviceBuffer::from_host(&want, 0)?;
    let mut dst = DeviceBuffer::new(size, 0)?;
    let gib = size as f64 / (1u64 << 30) as f64;
    let mut rows = Vec::new();
    for p in &paths {
        let file = dir.join(format!("gds_bench-{}.bin", p.name()));
        let (mut reads, mut writes) = (Vec::new(), Vec::new());
        for rep in 0..repeat {
            let t = Instant::now();
            p.write(&file, &src)?;
            writes.push(gib / t.elapsed().as_secs_f64());
            sys::evict_path(&file)?;
            let t = Instant::now();
            p.read(&file, &mut dst)?;
            reads.push(gib / t.elapsed().as_secs_f64());
            if rep == 0 && dst.to_vec()? != want {
                return Err(fastensor_core::Error::new(
                    fastensor_core::ErrorKind::Corrupt,
                    format!(
                        "{}: the bytes read back differ from those written",
                        p.name()
                    ),
                ));
            }
        }
        let _ = std::fs::remove_file(&file);
        rows.push((p.name().to_string(), median(reads), median(writes)));
    }
    let (disk, copy) = ceiling(dir, size, repeat, &want, &mut dst)?;
    let top = disk.min(copy);
    let (ref_r, ref_w) = rows
        .last()
        .map(|r| (r.1, r.2))
        .unwrap_or((f64::NAN, f64::NAN));
    println!("\n{} MiB file <-> GPU 0, median of {repeat}", size >> 20);
    println!("{:<30} {:>8}", "reference", "GiB/s");
    println!("{:<30} {disk:>8.2}", "disk (posix-direct -> host)");
    println!("{:<30} {copy:>8.2}", "copy (pinned host -> GPU)");
    println!("{:<30} {top:>8.2}", "ceiling = min(disk, copy)");
    println!(
        "\n{:<20} {:>11} {:>10} {:>12} {:>12} {:>12}",
        "path", "read GiB/s", "x ceiling", "x host+copy", "write GiB/s", "x host+copy"
    );
    for (name, r, w) in &rows {
        println!(
            "{name:<20} {r:>11.2} {:>10.2} {:>12.2} {w:>12.2} {:>12.2}",
            r / top,
            r / ref_r,
            w / ref_w
        );
    }
    println!("ceiling_read_gib_s {top:.4}");
    Ok(())
}

/// The read ceiling's two parts: a cold `O_DIRECT` read of the file into host memory, and a
/// copy of the same bytes from pinned host memory to the GPU; medians, GiB/s.
fn ceiling(
    dir: &Path,
    size: usize,
    repeat: usize,
    want: &[u8],
    dst: &mut DeviceBuffer,
) -> Result<(f64, f64)> {
    let gib = size as f64 / (1u64 << 30) as f64;
    let file = dir.join("gds_bench-disk.bin");
    std::fs::write(&file, want).map_err(|e| fastensor_core::Error::io(e, "write failed"))?;
    let direct = DirectBackend::default();
    let mut host = HostBuffer::new(size)?;
    let mut disk = Vec::new();
    for _ in 0..repeat {
        sys::evict_path(&file)?;
        let t = Instant::now();
        direct
            .open(&file, OpenMode::Read)?
            .read_at(0, host.as_mem_mut())?;
        disk.push(gib / t.elapsed().as_secs_f64());
    }
    let _ = std::fs::remove_file(&file);
    let mut pinned = fastensor_gds::cuda::PinnedBuffer::new(size)?;
    pinned.copy_from_slice(want);
    let mut copy = Vec::new();
    for _ in 0..repeat {
        let t = Instant::now();
        fastensor_gds::copy_to_device(dst.device_ptr(), dst.ordinal(), &pinned)?;
        copy.push(gib / t.elapsed().as_secs_f64());
    }
    Ok((median(disk), median(copy)))
}
