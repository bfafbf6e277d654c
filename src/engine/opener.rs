//! The engine as the opener of checkpoint files: per-load and per-file decisions.

use super::measure::Count;
use super::Engine;
use fastensor_core::location::Location;
use fastensor_core::policy::{NewLoadFacts, NewLoads};
use fastensor_core::{OpenMode, Place, Result};
use std::path::Path;

/// `path` resolved: a local file, or an object of a store. The one place the engine (and
/// so fastensor) tells locations apart by their spelling; everything above asks the
/// opener ([`FileOpener::place`](fastensor_core::FileOpener::place)), or [`place_of`].
pub(crate) fn resolve(path: &Path) -> Location<'_> {
    Location::of(path)
}

/// What the place `path` names is, as every engine resolves it (what
/// [`FileOpener::place`](fastensor_core::FileOpener::place) answers for an engine): an
/// object URL (`s3://…`) is an object store's place, any other path a local file
/// system's. Pure: no engine is needed to ask.
pub fn place_of(path: &Path) -> Place {
    match resolve(path) {
        Location::Object(_) => Place::OBJECT,
        Location::File(_) => Place::LOCAL,
    }
}

/// Checkpoints opened through the engine pick their backend per transfer, and their
/// transfers are tagged with the checkpoint purpose.
impl fastensor_core::FileOpener for Engine {
    fn open_file(
        &self,
        path: &Path,
        mode: OpenMode,
    ) -> Result<Box<dyn fastensor_core::BackendFile>> {
        if let Location::Object(_) = resolve(path) {
            return self.inner.objects.opener(path)?.open_file(path, mode);
        }
        let file = self.open(path, mode)?;
        file.set_purpose(fastensor_core::Purpose::Checkpoint);
        Ok(Box::new(file))
    }

    /// The engine's file of the swap file, its transfers tagged [`Purpose::Offload`](fastensor_core::Purpose::Offload)
    /// (`fastensor_core::Purpose`), pinned to `pin` or kept to the backends that bypass the
    /// page cache (where one can take it).
    fn open_swap(
        &self,
        path: &Path,
        pin: Option<&str>,
    ) -> Result<Box<dyn fastensor_core::BackendFile>> {
        let file = self.open(path, OpenMode::Truncate)?;
        file.set_purpose(fastensor_core::Purpose::Offload);
        match pin {
            Some(b) => file.pin(Some(b))?,
            None => {
                file.bypass_page_cache();
            }
        }
        Ok(Box::new(file))
    }

    /// CUDA (`fastensor_gds::copies::CudaRuntime`) where the engine is built with the `gds`
    /// feature; else none.
    fn device_runtime(
        &self,
    ) -> Option<std::sync::Arc<dyn fastensor_core::device_copies::DeviceRuntime>> {
        #[cfg(feature = "gds")]
        return Some(fastensor_gds::copies::CudaRuntime::shared());
        #[cfg(not(feature = "gds"))]
        None
    }

    /// An object URL (`s3://…`) is an object store's place; any other path, a local file
    /// system's (`resolve`).
    fn place(&self, path: &Path) -> Place {
        place_of(path)
    }

    /// The pinned backend's capabilities, or every backend's; whether mapped loads are on
    /// ([`EngineBuilder::mapped_loads`](super::EngineBuilder::mapped_loads)) and maps
    /// without a lease allowed
    /// ([`EngineBuilder::unprotected_maps`](super::EngineBuilder::unprotected_maps)); what
    /// the profile's `fastensor tune` measured ([`NewLoads`]).
    fn new_load_facts(&self) -> NewLoadFacts {
        let inner = &self.inner;
        let pinned = inner.pinned().clone();
        let readers = match pinned.as_deref() {
            Some(p) => inner
                .candidate(p)
                .map(|c| c.caps.clone())
                .into_iter()
                .collect(),
            None => inner.candidates.iter().map(|c| c.caps.clone()).collect(),
        };
        NewLoadFacts {
            readers,
            chosen: pinned.is_some(),
            may_map: inner.mapped_loads,
            measured: inner.measured_new_loads,
            unprotected_maps: inner.unprotected_maps,
        }
    }

    /// A local directory's entries; an object prefix's objects.
    fn list_names(&self, dir: &Path) -> Result<Vec<String>> {
        if let Location::Object(_) = resolve(dir) {
            return self.inner.objects.opener(dir)?.list_names(dir);
        }
        let entries = std::fs::read_dir(dir).map_err(|e| {
            fastensor_core::Error::io(e, "cannot list the directory").with_path(dir)
        })?;
        let mut names: Vec<String> = entries
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        names.sort();
        Ok(names)
    }

    /// An object's copy in the engine's cache of remote objects, where it has one
    /// ([`EngineBuilder::object_cache`](super::EngineBuilder::object_cache)); a local file
    /// is read as it is.
    fn local_copy(&self, path: &Path) -> Result<Option<std::path::PathBuf>> {
        match resolve(path) {
            Location::Object(_) => self.inner.objects.local_copy(path),
            Location::File(_) => Ok(None),
        }
    }

    /// [`Engine::remove`]: a local file or an object.
    fn remove_file(&self, path: &Path) -> Result<()> {
        Engine::remove(self, path)
    }

    /// Counted: [`Engine::new_loads`].
    fn note_new_load(&self, placement: NewLoads) {
        self.inner.measurer.count(match placement {
            NewLoads::Mapped => Count::MappedLoads,
            NewLoads::Read => Count::ReadLoads,
        });
    }
}

impl Engine {
    /// Loads into new host memory so far (all tensors or a selection): how many mapped the file,
    /// how many read it through a backend.
    pub fn new_loads(&self) -> (u64, u64) {
        let measurer = &self.inner.measurer;
        (
            measurer.counted(Count::MappedLoads),
            measurer.counted(Count::ReadLoads),
        )
    }

    /// Where loads into new host memory put their bytes as the profile measured it
    /// (`fastensor tune`); `None` when it was not measured (they map).
    pub fn measured_new_loads(&self) -> Option<NewLoads> {
        self.inner.measured_new_loads
    }

    /// Jobs of reads (checkpoint loads read through a backend) decided so far: each chose
    /// one backend for all its reads.
    pub fn read_jobs(&self) -> u64 {
        self.inner.measurer.counted(Count::Jobs)
    }
}
