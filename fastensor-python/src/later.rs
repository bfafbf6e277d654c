//! `PendingPages`: the pages of a load handed out before they were all in memory
//! (`Engine.load_new_later`), being brought in by a thread of their own.

use fastensor::checkpoint::{Arena, PendingPages};
use fastensor::{Error, ErrorKind};
use pyo3::prelude::*;
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;

/// The pages of a mapped load's tensors, being brought into memory by a thread started
/// with the load (which holds the load's memory alive until it is done; the loads of a
/// process take turns). `wait()` waits
/// for them and raises the error, if any, at every call.
#[pyclass(name = "PendingPages", module = "fastensor._native", frozen)]
pub struct PyPendingPages {
    /// The thread bringing the pages in; taken by the first `wait()`.
    thread: Mutex<Option<JoinHandle<fastensor::Result<()>>>>,
    /// What the thread ended with, once a `wait()` has joined it.
    outcome: OnceLock<Option<PyErr>>,
    bytes: u64,
}

impl PyPendingPages {
    /// Starts bringing `pages` of `arena` in, on a thread of their own.
    pub(crate) fn start(pages: PendingPages, arena: Arc<Arena>) -> PyResult<Self> {
        let bytes = pages.bytes();
        let turns = turns();
        let thread = std::thread::Builder::new()
            .name("fastensor-pages".into())
            .spawn(move || {
                let _turn = turns.lock().unwrap_or_else(|p| p.into_inner());
                pages.bring_in(&arena)
            })
            .map_err(|e| {
                crate::errors::to_py(Error::io(e, "cannot start a thread for the load"))
            })?;
        Ok(PyPendingPages {
            thread: Mutex::new(Some(thread)),
            outcome: OnceLock::new(),
            bytes,
        })
    }
}

/// The lock that lets one load's pages in at a time in this process: each load already
/// keeps several windows in flight, so the shards of a checkpoint come in one after another
/// (why: docs/lab/loads.md, "Figures behind the Python package's rules"). A forked
/// child gets a lock of its own, whatever its parent's threads held.
fn turns() -> Arc<Mutex<()>> {
    static BY_PROCESS: Mutex<Option<(u32, Arc<Mutex<()>>)>> = Mutex::new(None);
    let pid = std::process::id();
    let mut slot = BY_PROCESS.lock().unwrap_or_else(|p| p.into_inner());
    match &*slot {
        Some((owner, lock)) if *owner == pid => lock.clone(),
        _ => {
            let lock = Arc::new(Mutex::new(()));
            *slot = Some((pid, lock.clone()));
            lock
        }
    }
}

#[pymethods]
impl PyPendingPages {
    /// Waits (the GIL released) until every page is in memory. Raises `FileChangedError`
    /// when the file shrank under the mapping (load it again), `OSError` when the device
    /// failed.
    fn wait(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| {
            // The lock is only ever taken with the GIL released, so holding it while the
            // error is made (which takes the GIL) cannot deadlock.
            let mut thread = self.thread.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(handle) = thread.take() {
                let outcome = handle.join().unwrap_or_else(|_| {
                    Err(Error::new(
                        ErrorKind::Other,
                        "the thread bringing the pages in panicked",
                    ))
                });
                let _ = self.outcome.set(outcome.err().map(crate::errors::to_py));
            }
        });
        match self.outcome.get() {
            Some(Some(err)) => Err(err.clone_ref(py)),
            _ => Ok(()),
        }
    }

    /// Bytes the load brings in.
    #[getter]
    fn bytes(&self) -> u64 {
        self.bytes
    }

    fn __repr__(&self) -> String {
        format!("PendingPages(bytes={})", self.bytes)
    }
}
