//! fastensor backends over POSIX file descriptors:
//!
//! * [`POSIX`] (`posix`): page-cache `pread`/`pwrite`, the baseline;
//! * [`POSIX_DIRECT`] (`posix-direct`): `O_DIRECT`, chunks in parallel, zero-copy when aligned;
//! * [`MMAP`] (`mmap`): reads through a memory map.
//!
//! Each is registered with the fastensor registry. The [`sys`] module holds the file helpers
//! other backend crates share (opening with clear errors, direct-I/O alignment, page-cache
//! eviction).
#![deny(missing_docs)]

mod buffered;
mod direct;
mod mmap;
pub use fastensor_sys as sys;

pub use buffered::{PosixBackend, POSIX};
pub use direct::{DirectBackend, DirectConfig, POSIX_DIRECT};
pub use mmap::{MmapBackend, MMAP};

use std::sync::Arc;

fastensor_core::register_backend!(@built_in POSIX, || Arc::new(PosixBackend));
fastensor_core::register_backend!(@built_in POSIX_DIRECT, || Arc::new(DirectBackend::default()));
fastensor_core::register_backend!(@built_in MMAP, || Arc::new(MmapBackend));

/// The `read_batch` of the backends that read through the page cache: asks for every
/// request's bytes up front ([`sys::will_need`]), so the device serves the batch's cold
/// reads together (and no mapping's page fault reads a readahead window around a small
/// random read), then reads each request with `read_at`.
fn read_batch_through_cache(
    file: &dyn fastensor_core::BackendFile,
    fd: &std::fs::File,
    requests: &mut [fastensor_core::ReadRequest<'_>],
) -> fastensor_core::Result<()> {
    if requests.len() > 1 {
        sys::will_need(fd, requests.iter().map(|r| (r.offset, r.dst.len() as u64)));
    }
    for req in requests.iter_mut() {
        req.done = file.read_at(req.offset, req.dst.reborrow())?;
    }
    Ok(())
}

/// Makes sure this crate is linked, so its registrations are seen. The `fastensor` facade
/// calls it; programs that use this crate directly may too.
#[inline(never)]
pub fn link() {}
