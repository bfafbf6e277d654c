//! The backends' handles on an engine file: opened when first needed and kept, each checked
//! to reach the file first opened; and the backends that refused the file.

use super::identity::FileId;
use super::{reopened, replaced, EngineFile};
use crate::engine::Candidate;
use fastensor_core::{BackendFile, Error, ErrorKind, OpenMode, Result};
use std::collections::BTreeSet;
use std::sync::{Arc, RwLockReadGuard, RwLockWriteGuard};

pub(super) type Handle = Arc<dyn BackendFile>;

/// The handles of one file, and the backends that refused it.
#[derive(Default)]
pub(super) struct Handles {
    /// Per candidate of the engine (same order): its handle, once opened, and whether it
    /// was opened writable.
    pub(super) open: Vec<Option<(Handle, bool)>>,
    /// Backends that refused this file (e.g. `O_DIRECT` on tmpfs).
    pub(super) refused: BTreeSet<String>,
}

impl Handles {
    /// No handle open yet, for an engine of `candidates`, and no refusal.
    pub(super) fn new(candidates: usize) -> Handles {
        Handles {
            open: vec![None; candidates],
            refused: BTreeSet::new(),
        }
    }

    /// The open handles, with whether each was opened writable.
    pub(super) fn all(&self) -> impl Iterator<Item = &(Handle, bool)> {
        self.open.iter().flatten()
    }
}

impl EngineFile {
    /// The handles, locked for reading (none after a fork that caught them locked).
    pub(super) fn handles(&self) -> RwLockReadGuard<'_, Handles> {
        self.handles
            .read_or(|| Handles::new(self.engine.candidates.len()))
    }

    /// The handles, locked for writing (none after a fork that caught them locked).
    pub(super) fn handles_mut(&self) -> RwLockWriteGuard<'_, Handles> {
        self.handles
            .write_or(|| Handles::new(self.engine.candidates.len()))
    }

    /// The backends that have an open handle on this file.
    pub fn open_backends(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .handles()
            .open
            .iter()
            .zip(&self.engine.candidates)
            .filter(|(h, _)| h.is_some())
            .map(|(_, c)| c.name().to_string())
            .collect();
        names.sort();
        names
    }

    /// The handle of the engine's candidate at `index`, opened when first needed and kept.
    pub(super) fn handle(&self, index: usize) -> Result<Handle> {
        if let Some(Some((h, _))) = self.handles().open.get(index) {
            return Ok(h.clone());
        }
        let c = &self.engine.candidates[index];
        let writable = self.writable && c.caps.write;
        let mode = if writable {
            OpenMode::ReadWrite
        } else {
            OpenMode::Read
        };
        let h: Handle = Arc::from(self.open_handle(c, mode)?);
        let mut handles = self.handles_mut();
        let entry = handles.open[index].get_or_insert((h, writable));
        Ok(entry.0.clone())
    }

    /// `c`'s handle on the file first opened: opened at the path while the path names that
    /// file, else through the descriptor kept on it (`/proc/self/fd/N`, see
    /// [`EngineFile::probe_file`]), so that a file renamed over the path, or the path
    /// removed, changes nothing: every handle of one engine file reaches one file (a load
    /// never mixes two checkpoints). Without that descriptor, a path that names another
    /// file is [`ErrorKind::Changed`], a path that names none [`ErrorKind::NotFound`].
    fn open_handle(&self, c: &Candidate, mode: OpenMode) -> Result<Box<dyn BackendFile>> {
        if self.check_identity().is_ok() {
            let h = c.backend.open(&self.path, mode)?;
            if self.check_identity().is_ok() {
                return Ok(h);
            }
        }
        match self.probe_file() {
            Some(kept) => {
                let via = fastensor_sys::atomic::fd_path(kept);
                reopened::open(&*c.backend, &via, &self.path, mode)
            }
            None => {
                self.check_identity()?;
                c.backend.open(&self.path, mode) // (the path names the file again)
            }
        }
    }

    /// Fails unless the path still names the file first opened.
    fn check_identity(&self) -> Result<()> {
        let Some(first) = &self.identity else {
            return Ok(());
        };
        match FileId::of(&self.path) {
            Some(now) if now.same_file(first) => Ok(()),
            Some(_) => Err(replaced(&self.path, "since it was opened")),
            None => Err(Error::new(
                ErrorKind::NotFound,
                "the file was removed or renamed since it was opened: open it again",
            )
            .with_path(&self.path)),
        }
    }

    /// A handle open on the file (`writable`: one opened writable), else the first
    /// candidate's that can (write, if `writable`).
    pub(super) fn any_handle(&self, writable: bool) -> Result<Handle> {
        if let Some((h, _)) = self.handles().all().find(|(_, w)| *w || !writable) {
            return Ok(h.clone());
        }
        let index = self
            .engine
            .candidates
            .iter()
            .position(|c| !writable || c.caps.write)
            .ok_or_else(|| {
                Error::new(ErrorKind::Unsupported, "no available backend can write")
                    .with_path(&self.path)
            })?;
        self.handle(index)
    }
}
