//! The engine as the opener of checkpoint files: per-load and per-file decisions.

use super::measure::Count;
use super::Engine;
use fastensor_core::{OpenMode, Result};
use std::path::Path;

/// Checkpoints opened through the engine pick their backend per transfer, and their
/// transfers are tagged with the checkpoint purpose.
impl fastensor_core::FileOpener for Engine {
    fn open_file(
        &self,
        path: &Path,
        mode: OpenMode,
    ) -> Result<Box<dyn fastensor_core::BackendFile>> {
        let file = self.open(path, mode)?;
        file.set_purpose(fastensor_core::Purpose::Checkpoint);
        Ok(Box::new(file))
    }

    /// A load into new host memory maps the file unless a backend is pinned, mapped loads
    /// were turned off ([`EngineBuilder::mapped_loads`](super::EngineBuilder::mapped_loads)),
    /// none of the engine's backends reads local files through the page cache (`posix`,
    /// `mmap`: without them the caller chose to bypass it, or the engine's files are not
    /// local files), or the profile's `fastensor tune` found reading into fresh memory
    /// faster on this machine ([`NewLoads`](super::NewLoads)). Mapping never costs more
    /// device reads than reading, and spares what reading into new memory costs on top:
    /// the kernel zeroing every page before the read overwrites it.
    fn maps_new_loads(&self, _path: &Path) -> bool {
        const PAGE_CACHE_READERS: [&str; 2] = ["posix", "mmap"];
        let inner = &self.inner;
        let map = inner.mapped_loads
            && inner.measured_new_loads != Some(super::NewLoads::Read)
            && inner.pinned.read().is_none()
            && inner
                .candidates
                .iter()
                .any(|c| PAGE_CACHE_READERS.contains(&c.name()));
        inner.measurer.count(if map {
            Count::MappedLoads
        } else {
            Count::ReadLoads
        });
        map
    }

    /// Off unless [`EngineBuilder::unprotected_maps`](super::EngineBuilder::unprotected_maps)
    /// turned it on.
    fn maps_unprotected(&self, _path: &Path) -> bool {
        self.inner.unprotected_maps
    }
}

impl Engine {
    /// Loads of whole checkpoints into new host memory decided so far: how many mapped the
    /// file, how many read it through a backend.
    pub fn new_loads(&self) -> (u64, u64) {
        let measurer = &self.inner.measurer;
        (
            measurer.counted(Count::MappedLoads),
            measurer.counted(Count::ReadLoads),
        )
    }

    /// Where loads into new host memory put their bytes as the profile measured it
    /// (`fastensor tune`); `None` when it was not measured (they map).
    pub fn measured_new_loads(&self) -> Option<super::NewLoads> {
        self.inner.measured_new_loads
    }

    /// Jobs of reads (checkpoint loads read through a backend) decided so far: each chose
    /// one backend for all its reads.
    pub fn read_jobs(&self) -> u64 {
        self.inner.measurer.counted(Count::Jobs)
    }
}
