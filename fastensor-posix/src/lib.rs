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

fastensor_core::register_backend!(POSIX, || Arc::new(PosixBackend));
fastensor_core::register_backend!(POSIX_DIRECT, || Arc::new(DirectBackend::default()));
fastensor_core::register_backend!(MMAP, || Arc::new(MmapBackend));

/// Makes sure this crate is linked, so its registrations are seen. The `fastensor` facade
/// calls it; programs that use this crate directly may too.
#[inline(never)]
pub fn link() {}
