//! fastensor's CUDA backends, with CUDA loaded at run time (the crate builds on machines with
//! no CUDA toolkit, and without a GPU the backends say why they cannot run):
//!
//! * [`GDS`] (`gds`): GPUDirect Storage through cuFile, file <-> GPU memory with no host
//!   copy (or cuFile's compatibility mode, reported by [`GdsBackend::describe`]);
//! * [`CUDA_STAGED`] (`cuda-staged`): `O_DIRECT` reads and writes through pinned host
//!   buffers, overlapped with asynchronous copies to and from the GPU;
//! * [`copies`]: stream-ordered copies between GPU memory and a pool of pinned host memory,
//!   and [`copies::CudaRuntime`], CUDA as the device runtime of offload's GPU tensors (the
//!   traits of `fastensor_core::device_copies`);
//! * [`DeviceBuffer`]: GPU memory usable wherever a host buffer is
//!   ([`as_mem`](DeviceBuffer::as_mem), [`as_mem_mut`](DeviceBuffer::as_mem_mut)).
//!
//! Layering for foreign code: cudarc's `sys`/`result` and [`cufile::ffi`] (raw) ->
//! [`cuda`] and [`cufile`] (`Result`-returning wrappers, RAII types) -> the backends. No call
//! panics when `libcuda.so.1` or `libcufile.so.0` is missing: the first touch of each library
//! is probed and wrapped in `catch_unwind`, and the reason is kept.
//!
//! cuFile is looked for at the path in [`GdsConfig::cufile_path`], else `FASTENSOR_CUFILE`,
//! else in `LD_LIBRARY_PATH`, the CUDA and system library directories and Python's
//! `nvidia/cufile/lib/` (see [`probe`]).
#![deny(missing_docs)]

pub mod copies;
pub mod cuda;
pub mod cufile;
mod device_buffer;
mod gds;
pub mod probe;
mod staged;
#[cfg(feature = "testing")]
pub mod testing;

pub use device_buffer::{copy_to_device, copy_to_host, DeviceBuffer};
pub use gds::{GdsBackend, GdsConfig, GDS};
pub use staged::{StagedBackend, StagedConfig, CUDA_STAGED};

use fastensor_core::{write_end, DeviceSlice, Error, ErrorKind, MemRef, Result};
use std::path::Path;
use std::sync::Arc;

fastensor_core::register_backend!(@built_in GDS, || Arc::new(GdsBackend::default()));
fastensor_core::register_backend!(@built_in CUDA_STAGED, || Arc::new(StagedBackend::default()));

/// Makes sure this crate is linked, so its registrations are seen. The `fastensor` facade
/// calls it under its `gds` feature.
#[inline(never)]
pub fn link() {}

/// The GPUs this process sees, e.g. `1 GPU: NVIDIA H100`, or why there is none.
pub fn gpus() -> String {
    match cuda::driver() {
        Ok(d) => {
            let names: Vec<&str> = (0..d.device_count()).map(|i| d.device_name(i)).collect();
            let n = names.len();
            format!(
                "{n} GPU{}: {}",
                if n == 1 { "" } else { "s" },
                names.join(", ")
            )
        }
        Err(reason) => reason,
    }
}

/// The preamble of a write through a file of the CUDA backends: device memory (else the
/// `unsupported_memory` error), a handle opened for writing (else
/// [`ErrorKind::PermissionDenied`]), an end that fits in 64 bits ([`write_end`]). Returns
/// the source and the end of the write, or `None` for an empty write (nothing to do).
fn device_write<'a>(
    backend: &str,
    path: &Path,
    writable: bool,
    offset: u64,
    src: MemRef<'a>,
) -> Result<Option<(DeviceSlice<'a>, u64)>> {
    let d = src.device_for(backend, path)?;
    if !writable {
        return Err(Error::new(
            ErrorKind::PermissionDenied,
            "the file was opened for reading only",
        )
        .with_backend(backend)
        .with_path(path)
        .with_offset(offset));
    }
    let end = write_end(offset, d.len(), backend, path)?;
    Ok((!d.is_empty()).then_some((d, end)))
}

/// `[start, end)` as `(offset, length)` pieces that end at multiples of `chunk` (> 0): each
/// at most `chunk` bytes, all but the first and last starting and ending on a boundary.
fn chunk_ranges(start: u64, end: u64, chunk: usize) -> Vec<(u64, usize)> {
    let chunk = chunk as u64;
    let mut out = Vec::with_capacity(end.saturating_sub(start).div_ceil(chunk) as usize + 1);
    let mut at = start;
    while at < end {
        let next = (at / chunk + 1).saturating_mul(chunk).min(end);
        out.push((at, (next - at) as usize));
        at = next;
    }
    out
}

/// `reason`, plus where cuFile was found or looked for when CUDA itself is the problem.
fn with_cufile_search(reason: String, explicit: Option<&Path>) -> String {
    if cuda::driver().is_ok() {
        return reason;
    }
    let (candidates, _) = probe::cufile_candidates(explicit);
    let found = candidates.iter().find_map(|c| match c {
        probe::Candidate::Path(p) if p.exists() => Some(p.display().to_string()),
        _ => None,
    });
    match found {
        Some(p) => format!("{reason}; cuFile found at {p}"),
        None => format!("{reason}; libcufile.so.0 not found either"),
    }
}

#[cfg(test)]
mod tests {
    use super::chunk_ranges;

    #[test]
    fn chunk_ranges_end_on_multiples_of_the_chunk() {
        assert_eq!(chunk_ranges(5, 5, 4), vec![]);
        assert_eq!(chunk_ranges(5, 14, 4), vec![(5, 3), (8, 4), (12, 2)]);
        // Not a power of two: pieces still end on multiples of the chunk.
        let c = 12 << 20;
        assert_eq!(
            chunk_ranges(0, 3 * c as u64, c),
            vec![(0, c), (c as u64, c), (2 * c as u64, c)]
        );
    }
}
