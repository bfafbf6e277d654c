//! `gds`: GPUDirect Storage through cuFile.
//!
//! * The cuFile driver is opened once per process; files are opened with `O_DIRECT` and
//!   registered once per handle.
//! * A [`DeviceBuffer`](crate::DeviceBuffer) used a second time is registered with cuFile
//!   (`cuFileBufRegister`, cached by address, deregistered when the buffer is freed); other
//!   device memory goes through cuFile's own bounce buffers.
//! * Transfers are split at the driver's maximum direct I/O size and issued in parallel.
//! * Unaligned heads and tails of writes go through a buffered descriptor, as in
//!   `posix-direct`, so bytes outside the range are never rewritten.
//! * Batches of reads use `cuFileBatchIO*` where the library has it, else run in parallel.

mod batch;
mod file;

use crate::cuda;
use crate::cufile::{self, CuFile};
use fastensor_core::{
    Availability, Backend, BackendFile, Capabilities, Error, ErrorKind, OpenMode, Result,
};
use fastensor_sys as sys;
use fastensor_sys::local::LocalFile;
use file::GdsFile;
use std::path::{Path, PathBuf};

/// The name of the GPUDirect Storage backend.
pub const GDS: &str = "gds";

/// Settings of the `gds` backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GdsConfig {
    /// The cuFile library to load; `None` reads `FASTENSOR_CUFILE`, then searches.
    pub cufile_path: Option<PathBuf>,
    /// Threads issuing the pieces of one transfer, the caller's included. Default 4.
    pub threads: usize,
    /// Bytes per cuFile call; capped at the driver's maximum direct I/O size. Default 16 MiB.
    pub chunk_size: usize,
    /// Register device buffers that are used again. Default on.
    pub register_buffers: bool,
    /// Use the cuFile batch API for batches of reads. Default on.
    pub batch: bool,
}

impl Default for GdsConfig {
    fn default() -> Self {
        GdsConfig {
            cufile_path: None,
            threads: 4,
            chunk_size: 16 << 20,
            register_buffers: true,
            batch: true,
        }
    }
}

/// GPUDirect Storage backend: file <-> GPU memory through cuFile.
#[derive(Debug, Clone, Default)]
pub struct GdsBackend {
    config: GdsConfig,
}

impl GdsBackend {
    /// A backend with these settings.
    pub fn new(config: GdsConfig) -> Self {
        GdsBackend { config }
    }

    /// The settings.
    pub fn config(&self) -> &GdsConfig {
        &self.config
    }

    fn cufile(&self) -> std::result::Result<&'static CuFile, String> {
        cufile::cufile(self.config.cufile_path.as_deref())
    }

    /// How cuFile moves the bytes here (`true GDS (nvidia-fs 2.17)` or `compatibility mode
    /// (...)`), the library loaded and the GPUs; or why the backend is unavailable.
    pub fn describe(&self) -> String {
        match self.cufile() {
            Ok(cf) => format!("{}; {}; {}", cf.mode(), cf.library(), crate::gpus()),
            Err(reason) => reason,
        }
    }
}

impl Backend for GdsBackend {
    fn name(&self) -> &str {
        GDS
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            native_batch: self.config.batch,
            ..Capabilities::direct(self.config.threads.max(1) as u32)
        }
        .on_device()
    }

    fn detail(&self) -> Option<String> {
        self.cufile().ok().map(|_| self.describe())
    }

    fn probe(&self) -> Availability {
        match self.cufile() {
            Ok(_) => Availability::Available,
            Err(reason) => Availability::Unavailable {
                reason: crate::with_cufile_search(reason, self.config.cufile_path.as_deref()),
            },
        }
    }

    fn open(&self, path: &Path, mode: OpenMode) -> Result<Box<dyn BackendFile>> {
        let cf = self.cufile().map_err(|reason| {
            Error::new(ErrorKind::Unavailable, reason)
                .with_backend(GDS)
                .with_path(path)
        })?;
        let (direct, buffered, align) = sys::open_direct_pair(path, mode, GDS)?;
        let align = align.offset.max(4096);
        cuda::require()?.bind(0)?;
        let handle = cf
            .register(&direct, path)
            .map_err(|e| e.with_backend(GDS))?;
        let chunk = self
            .config
            .chunk_size
            .clamp(align as usize, cf.max_direct_io().max(align as usize));
        Ok(Box::new(GdsFile {
            handle,
            local: LocalFile::new(GDS, direct, path.to_path_buf()),
            buffered,
            cufile: cf,
            align,
            chunk: chunk - chunk % align as usize,
            threads: self.config.threads.max(1),
            register: self.config.register_buffers,
            batch: if self.config.batch {
                cf.max_batch()
            } else {
                None
            },
            writable: mode.writable(),
        }))
    }
}
