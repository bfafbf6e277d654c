//! A backend whose first write waits at a gate: the test learns when that write has started
//! and lets it finish when it chooses, so what happens meanwhile is ordered, not timed.

use fastensor::{Availability, Backend, BackendFile, Capabilities, MemMut, MemRef, OpenMode};
use std::path::Path;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long [`Gate::wait_entered`] waits before failing the test.
const PATIENCE: Duration = Duration::from_secs(60);

/// Wraps a backend, holding its first write at the gate until [`Gate::release`].
pub struct Gated {
    name: String,
    inner: Arc<dyn Backend>,
    shared: Arc<Shared>,
}

/// The test's side of the gate. Dropping it releases the gate too.
pub struct Gate {
    entered: Receiver<()>,
    release: Sender<()>,
}

/// The writer's side: taken by the first write.
struct Shared {
    entered: Mutex<Option<Sender<()>>>,
    release: Mutex<Option<Receiver<()>>>,
}

impl Gated {
    /// `inner` under `name`, and the gate of its first write.
    pub fn new(name: &str, inner: Arc<dyn Backend>) -> (Gated, Gate) {
        let (entered_tx, entered) = mpsc::channel();
        let (release, release_rx) = mpsc::channel();
        let shared = Arc::new(Shared {
            entered: Mutex::new(Some(entered_tx)),
            release: Mutex::new(Some(release_rx)),
        });
        let gated = Gated {
            name: name.to_string(),
            inner,
            shared,
        };
        (gated, Gate { entered, release })
    }
}

impl Gate {
    /// Returns once the first write is at the gate; fails the test after a minute.
    pub fn wait_entered(&self) {
        self.entered
            .recv_timeout(PATIENCE)
            .expect("no write reached the gate");
    }

    /// Lets the write at the gate go on.
    pub fn release(&self) {
        let _ = self.release.send(());
    }
}

impl Shared {
    /// On the first write only: says so, and waits for the release (or the [`Gate`]'s drop).
    fn pass(&self) {
        let Some(entered) = self.entered.lock().unwrap().take() else {
            return;
        };
        let release = self.release.lock().unwrap().take();
        let _ = entered.send(());
        if let Some(release) = release {
            let _ = release.recv();
        }
    }
}

impl Backend for Gated {
    fn name(&self) -> &str {
        &self.name
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn probe(&self) -> Availability {
        self.inner.probe()
    }

    fn open(&self, path: &Path, mode: OpenMode) -> fastensor::Result<Box<dyn BackendFile>> {
        Ok(Box::new(GatedFile {
            inner: self.inner.open(path, mode)?,
            shared: self.shared.clone(),
        }))
    }
}

struct GatedFile {
    inner: Box<dyn BackendFile>,
    shared: Arc<Shared>,
}

impl BackendFile for GatedFile {
    fn path(&self) -> &Path {
        self.inner.path()
    }

    fn read_at(&self, offset: u64, dst: MemMut<'_>) -> fastensor::Result<usize> {
        self.inner.read_at(offset, dst)
    }

    /// Writes in batches come here one by one (the trait's default `write_batch`).
    fn write_at(&self, offset: u64, src: MemRef<'_>) -> fastensor::Result<()> {
        self.shared.pass();
        self.inner.write_at(offset, src)
    }

    fn sync(&self) -> fastensor::Result<()> {
        self.inner.sync()
    }

    fn len(&self) -> fastensor::Result<u64> {
        self.inner.len()
    }

    fn set_len(&self, len: u64) -> fastensor::Result<()> {
        self.inner.set_len(len)
    }
}
