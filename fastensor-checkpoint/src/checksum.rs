//! Per-tensor checksums, kept in a safetensors file's own `__metadata__` so that the file
//! stays a plain safetensors file every reader loads.
//!
//! The key [`CHECKSUMS_KEY`] (`"fastensor.checksums"`) holds a JSON object mapping each
//! tensor's name to the CRC-32C (Castagnoli) of its bytes, as 8 lowercase hex digits:
//!
//! ```text
//! "__metadata__": {"fastensor.checksums": "{\"w\":\"1b2edc75\",\"b\":\"00000000\"}"}
//! ```
//!
//! CRC-32C is hardware-accelerated (SSE 4.2 on x86-64, the CRC instructions on ARMv8):
//! the fastest check measured here (`cargo test --release checksum_throughput -- --ignored`;
//! figures in `docs/lab/io-paths.md`, "Figures behind settings in the code"). Every error
//! it misses (a 1 in 2³² chance for random damage; none of up to 32 flipped bits in a row)
//! is beyond what a storage fault makes.
//!
//! * [`compute`] / [`stamp`]: the checksums of tensors about to be saved (in parallel).
//! * [`Checksums`]: the ones a header stores; [`Checksums::check`] verifies one read, on the
//!   I/O thread that made it, when a [`CheckpointFile`](super::CheckpointFile) was opened
//!   with [`verifying`](super::CheckpointFile::verifying).
//! * [`verify_file`]: checks every tensor of a file without loading it anywhere (the
//!   `fastensor ckpt verify` command).

use super::header::corrupt;
use super::source::CheckpointSource;
use super::sums::decode;
pub use super::sums::{checksum, encode, Checksums, CHECKSUMS_KEY};
use super::view::TensorView;
use super::{FileOpener, IO_THREADS};
use crate::{Error, ErrorKind, HostBuffer, MemMut, MemRef, Result};
use fastensor_core::parallel;
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;
use std::sync::Mutex;

/// Threads that compute checksums for a save (tensors in parallel, each on one thread).
fn hash_threads() -> usize {
    std::thread::available_parallelism().map_or(4, |n| n.get().min(8))
}

/// The checksum of every tensor, by name, computed in parallel. Tensors in device memory
/// cannot be read here: [`ErrorKind::Unsupported`] (copy them to the host first).
pub fn compute(tensors: &[TensorView<'_>]) -> Result<BTreeMap<String, u32>> {
    compute_on(tensors, hash_threads())
}

/// [`compute`] on at most `threads` threads.
pub(crate) fn compute_on(
    tensors: &[TensorView<'_>],
    threads: usize,
) -> Result<BTreeMap<String, u32>> {
    let sums = Mutex::new(BTreeMap::new());
    parallel::for_each(tensors.iter().collect(), threads, |t| {
        let MemRef::Host(bytes) = t.data else {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "tensor `{}` is in device memory: checksums are computed on host memory",
                    t.desc.name
                ),
            ));
        };
        let sum = checksum(bytes);
        let mut sums = sums.lock().unwrap_or_else(|p| p.into_inner());
        sums.insert(t.desc.name.clone(), sum);
        Ok(())
    })?;
    Ok(sums.into_inner().unwrap_or_else(|p| p.into_inner()))
}

/// Adds the checksums of `tensors` to `metadata` under [`CHECKSUMS_KEY`] (replacing any
/// there), for a save of `tensors` with `metadata`.
pub fn stamp(tensors: &[TensorView<'_>], metadata: &mut BTreeMap<String, String>) -> Result<()> {
    let sums = compute(tensors)?;
    metadata.insert(CHECKSUMS_KEY.to_string(), encode(&sums));
    Ok(())
}

/// `metadata` for one shard holding the tensors `names`: the checksums restricted to them
/// (the other shards' are left out); `metadata` as it is when it has none.
pub(crate) fn for_shard<'n>(
    metadata: &BTreeMap<String, String>,
    names: impl IntoIterator<Item = &'n str>,
) -> Result<BTreeMap<String, String>> {
    let Some(all) = metadata.get(CHECKSUMS_KEY) else {
        return Ok(metadata.clone());
    };
    let all = decode(all)?;
    let mine = names
        .into_iter()
        .filter_map(|n| all.get(n).map(|&v| (n.to_string(), v)))
        .collect();
    let mut out = metadata.clone();
    out.insert(CHECKSUMS_KEY.to_string(), encode(&mine));
    Ok(out)
}

/// What [`verify_file`] checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verified {
    /// Tensors whose checksums matched (empty ones included).
    pub tensors: usize,
    /// Bytes of tensor data read and checked.
    pub bytes: u64,
}

/// Bytes one worker of [`verify_file`] reads at a time.
const VERIFY_WINDOW: usize = 8 << 20;

/// Checks every tensor of the safetensors file at `path` against the checksums its header
/// stores, streaming the data through small buffers (nothing is loaded whole; tensors are
/// read in parallel). Errors: as [`Checksums::from_header`]; a truncated file or a
/// mismatch is [`ErrorKind::Corrupt`] naming the file and the tensor.
pub fn verify_file<O: FileOpener + ?Sized>(opener: &O, path: &Path) -> Result<Verified> {
    let source = CheckpointSource::single(opener, path)?.verifying()?;
    let file = &source.files()[0];
    let (header, sums) = (file.header(), file.checksums.as_ref().expect("verifying"));
    let ranges: Vec<Range<u64>> = header
        .entries()
        .iter()
        .map(|e| header.file_range(e))
        .filter(|r| r.end > r.start)
        .collect();
    let bytes = ranges.iter().map(|r| r.end - r.start).sum();
    parallel::for_each(ranges, IO_THREADS, |r| {
        let (name, want) = sums.at(&r).expect("every non-empty tensor has one");
        let mut buf = HostBuffer::new(VERIFY_WINDOW.min((r.end - r.start) as usize))?;
        let mut crc = 0u32;
        let mut at = r.start;
        while at < r.end {
            let n = buf.len().min((r.end - at) as usize);
            let got = file.file.read_at(at, MemMut::Host(&mut buf[..n]))?;
            if got == 0 {
                return Err(corrupt(format!(
                    "tensor `{name}`: the file ends before its data does (truncated)"
                ))
                .with_path(path)
                .with_offset(at));
            }
            crc = crc32c::crc32c_append(crc, &buf[..got]);
            at += got as u64;
        }
        if crc != want {
            return Err(Checksums::mismatch(path, name, want, crc, r.start));
        }
        Ok(())
    })?;
    Ok(Verified {
        tensors: header.entries().len(),
        bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, TensorDesc};

    #[test]
    fn stamps_parse_back_and_shards_keep_their_own() {
        let a = vec![1u8; 12];
        let b = vec![2u8; 8];
        let views = [
            TensorView::new(TensorDesc::new("a", DType::F32, [3]), &a[..]),
            TensorView::new(TensorDesc::new("b", DType::U8, [8]), &b[..]),
        ];
        let mut meta = BTreeMap::from([("k".to_string(), "v".to_string())]);
        stamp(&views, &mut meta).unwrap();
        let sums = decode(&meta[CHECKSUMS_KEY]).unwrap();
        assert_eq!(sums["a"], checksum(&a));
        assert_eq!(sums["b"], checksum(&b));
        assert_eq!(meta["k"], "v");
        let shard = for_shard(&meta, ["b"]).unwrap();
        assert_eq!(decode(&shard[CHECKSUMS_KEY]).unwrap().len(), 1);
        // A known CRC-32C (the check value of the standard).
        assert_eq!(checksum(b"123456789"), 0xe306_9283);
        for bad in ["[1]", r#"{"a":"xyz"}"#, r#"{"a":"1234"}"#] {
            assert_eq!(decode(bad).unwrap_err().kind(), ErrorKind::Corrupt, "{bad}");
        }
    }

    /// Throughput of the checksum on one core (release builds: `cargo test --release -p
    /// fastensor --lib checksum_throughput -- --ignored --nocapture`).
    #[test]
    #[ignore]
    fn checksum_throughput() {
        let data: Vec<u8> = (0..256u32 << 20).map(|i| (i * 31 % 251) as u8).collect();
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t = std::time::Instant::now();
            std::hint::black_box(checksum(std::hint::black_box(&data)));
            best = best.min(t.elapsed().as_secs_f64());
        }
        println!(
            "crc32c: {:.1} GB/s on one core (256 MiB, best of 5)",
            data.len() as f64 / best / 1e9
        );
    }
}
