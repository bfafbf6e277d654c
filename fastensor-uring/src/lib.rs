//! fastensor io_uring backend ([`URING`], `uring`): `O_DIRECT` files, many requests in flight
//! from one thread, registered (fixed) files and staging buffers, and batches of small
//! requests submitted with one system call per queue-depth's worth.
//!
//! * Large transfers are split into [`UringConfig::chunk_size`] requests, up to
//!   [`UringConfig::queue_depth`] in flight on one ring: the submitting thread alone keeps the
//!   device busy.
//! * Aligned host buffers are read into and written from in place (zero copy); unaligned ones
//!   and the partial blocks at the ends of reads go through a page-aligned staging area
//!   registered with the ring (`READ_FIXED`/`WRITE_FIXED`). Partial blocks of writes go
//!   through a buffered descriptor, as in `posix-direct` (no read-modify-write).
//! * Short transfers, `EINTR` and `EAGAIN` are resubmitted; errors carry the errno, the
//!   offset, the file and the backend.
//! * Rings are pooled per open file and reused; threads sharing a handle each take their own.
//!   A child process made by `fork` never submits on a ring it inherited (the kernel shares
//!   it with the parent): it sets up its own, for inherited open files too.
//!
//! [`probe`] explains why io_uring cannot run (kernel without it, `io_uring_disabled`, a
//! seccomp policy) instead of failing later.
#![deny(missing_docs)]

mod config;
mod engine;
mod file;
mod probe;
mod ring;

pub use config::UringConfig;
pub use probe::{probe, probe_with, DISABLED_SYSCTL};

use fastensor_core::knobs::Knob;
use fastensor_core::{
    knobs, Availability, Backend, BackendFile, Capabilities, KnobSpec, Knobs, OpenMode, Result,
    SharedBackend,
};
use fastensor_sys as sys;
use std::path::Path;
use std::sync::Arc;

/// The name of the io_uring backend.
pub const URING: &str = "uring";

/// The io_uring backend.
#[derive(Debug, Clone, Default)]
pub struct UringBackend {
    config: UringConfig,
}

impl UringBackend {
    /// A backend with these settings.
    pub fn new(config: UringConfig) -> Self {
        UringBackend { config }
    }

    /// The settings.
    pub fn config(&self) -> &UringConfig {
        &self.config
    }
}

/// The knobs of `uring`.
const KNOBS: &[Knob<UringConfig>] = &fastensor_core::knob_table![
    "qd", ["4", "16", "64"], "requests in flight per ring", Count32(queue_depth);
    "chunk", ["512K", "2M", "8M"], "bytes per request of a large transfer", Size(chunk_size);
    "sqpoll", ["false"], "a kernel thread polls the submission queue", Flag(sqpoll);
];

impl Backend for UringBackend {
    fn name(&self) -> &str {
        URING
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            native_batch: true,
            ..Capabilities::direct(self.config.effective_queue_depth())
        }
    }

    fn probe(&self) -> Availability {
        probe()
    }

    fn knobs(&self) -> Vec<KnobSpec> {
        knobs::specs(KNOBS, UringConfig::default())
    }

    fn with_knobs(&self, knobs: &Knobs) -> Result<SharedBackend> {
        let config = knobs::apply(URING, KNOBS, &self.config, knobs)?;
        Ok(Arc::new(UringBackend::new(config)))
    }

    fn open(&self, path: &Path, mode: OpenMode) -> Result<Box<dyn BackendFile>> {
        let (direct, buffered, align) = sys::open_direct_pair(path, mode, URING)?;
        let file = file::UringFile::new(direct, buffered, align, &self.config, path.to_path_buf())?;
        Ok(Box::new(file))
    }
}

fastensor_core::register_backend!(@built_in URING, || Arc::new(UringBackend::default()));

/// Makes sure this crate is linked, so its registrations are seen. The `fastensor` facade
/// calls it; programs that use this crate directly may too.
#[inline(never)]
pub fn link() {}
