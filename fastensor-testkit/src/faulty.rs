//! `Faulty`: wraps any backend and makes chosen transfers fail with a chosen
//! [`ErrorKind`], to test that errors of background I/O surface where they should.
//!
//! ```
//! use fastensor_core::ErrorKind;
//! use fastensor_testkit::faulty::{Fault, Faulty, Op, When};
//! use fastensor_testkit::MemoryBackend;
//! use std::sync::Arc;
//!
//! // The third write fails with an I/O error; every other transfer goes through.
//! let faulty = Faulty::new("faulty", Arc::new(MemoryBackend::new()))
//!     .with_fault(Fault::new(Op::Write, When::Nth(3), ErrorKind::Io));
//! # let _ = faulty;
//! ```

use fastensor_core::{
    Backend, BackendFile, Error, ErrorKind, LayeredBackend, LayeredFile, MemMut, MemRef, OpenMode,
    ReadRequest, Result, SharedBackend, WriteRequest,
};
use parking_lot::RwLock;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Which transfers a [`Fault`] counts and fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Reads only (each request of a batch counts).
    Read,
    /// Writes only (each request of a batch counts).
    Write,
    /// Reads and writes, counted together.
    Any,
}

/// When a [`Fault`] fires, counting the transfers of its [`Op`] from 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// Only the n-th transfer fails.
    Nth(u64),
    /// The n-th transfer and every later one fail.
    From(u64),
}

/// A planned failure: transfers of `op` selected by `when` fail with `kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    /// The transfers counted.
    pub op: Op,
    /// Which of them fail.
    pub when: When,
    /// The kind of the injected error.
    pub kind: ErrorKind,
}

impl Fault {
    /// A fault failing the transfers of `op` selected by `when` with `kind`.
    pub fn new(op: Op, when: When, kind: ErrorKind) -> Self {
        Fault { op, when, kind }
    }
}

#[derive(Debug, Default)]
struct Shared {
    fault: RwLock<Option<Fault>>,
    reads: AtomicU64,
    writes: AtomicU64,
    injected: AtomicU64,
}

impl Shared {
    /// Counts one transfer and returns the error to inject, if any.
    fn check(&self, write: bool, backend: &str, path: &Path, offset: u64) -> Result<()> {
        let (r, w) = if write {
            (
                self.reads.load(Ordering::SeqCst),
                self.writes.fetch_add(1, Ordering::SeqCst) + 1,
            )
        } else {
            (
                self.reads.fetch_add(1, Ordering::SeqCst) + 1,
                self.writes.load(Ordering::SeqCst),
            )
        };
        let Some(fault) = *self.fault.read() else {
            return Ok(());
        };
        let n = match fault.op {
            Op::Read if !write => r,
            Op::Write if write => w,
            Op::Any => r + w,
            _ => return Ok(()),
        };
        let fire = match fault.when {
            When::Nth(k) => n == k,
            When::From(k) => n >= k,
        };
        if !fire {
            return Ok(());
        }
        self.injected.fetch_add(1, Ordering::SeqCst);
        let what = if write { "write" } else { "read" };
        Err(Error::new(
            fault.kind,
            format!("injected fault: {what} #{n} of {:?} transfers", fault.op),
        )
        .with_backend(backend)
        .with_path(path)
        .with_offset(offset))
    }
}

/// A backend that forwards to another one under its own name (a [`LayeredBackend`]) and
/// fails the transfers its [`Fault`] selects. Opening, `sync`, `len` and `set_len` never fail
/// by injection.
/// Clones share the fault and the counters.
#[derive(Clone)]
pub struct Faulty {
    name: String,
    inner: SharedBackend,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Faulty {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Faulty")
            .field("name", &self.name)
            .field("inner", &self.inner.name())
            .field("fault", &*self.shared.fault.read())
            .finish()
    }
}

impl Faulty {
    /// Wraps `inner` under `name`, with no fault yet.
    pub fn new(name: impl Into<String>, inner: SharedBackend) -> Self {
        Faulty {
            name: name.into(),
            inner,
            shared: Arc::default(),
        }
    }

    /// Sets the fault (builder form of [`Faulty::set_fault`]).
    pub fn with_fault(self, fault: Fault) -> Self {
        self.set_fault(Some(fault));
        self
    }

    /// Replaces the fault (`None`: no more failures) and restarts the counters, for every
    /// file already open too.
    pub fn set_fault(&self, fault: Option<Fault>) {
        let mut slot = self.shared.fault.write();
        self.shared.reads.store(0, Ordering::SeqCst);
        self.shared.writes.store(0, Ordering::SeqCst);
        *slot = fault;
    }

    /// Reads attempted since the fault was last set.
    pub fn reads(&self) -> u64 {
        self.shared.reads.load(Ordering::SeqCst)
    }

    /// Writes attempted since the fault was last set.
    pub fn writes(&self) -> u64 {
        self.shared.writes.load(Ordering::SeqCst)
    }

    /// Errors injected so far.
    pub fn injected(&self) -> u64 {
        self.shared.injected.load(Ordering::SeqCst)
    }
}

impl LayeredBackend for Faulty {
    fn inner(&self) -> &dyn Backend {
        &*self.inner
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn wrap(
        &self,
        inner: Box<dyn BackendFile>,
        _path: &Path,
        _mode: OpenMode,
    ) -> Result<Box<dyn BackendFile>> {
        Ok(Box::new(FaultyFile {
            name: self.name.clone(),
            inner,
            shared: self.shared.clone(),
        }))
    }
}

struct FaultyFile {
    name: String,
    inner: Box<dyn BackendFile>,
    shared: Arc<Shared>,
}

impl FaultyFile {
    fn check(&self, write: bool, offset: u64) -> Result<()> {
        self.shared
            .check(write, &self.name, self.inner.path(), offset)
    }
}

impl LayeredFile for FaultyFile {
    fn inner(&self) -> &dyn BackendFile {
        &*self.inner
    }

    fn read_at(&self, offset: u64, dst: MemMut<'_>) -> Result<usize> {
        self.check(false, offset)?;
        self.inner.read_at(offset, dst)
    }

    fn write_at(&self, offset: u64, src: MemRef<'_>) -> Result<()> {
        self.check(true, offset)?;
        self.inner.write_at(offset, src)
    }

    fn read_batch(&self, requests: &mut [ReadRequest<'_>]) -> Result<()> {
        for req in requests.iter() {
            self.check(false, req.offset)?;
        }
        self.inner.read_batch(requests)
    }

    fn write_batch(&self, requests: &[WriteRequest<'_>]) -> Result<()> {
        for req in requests {
            self.check(true, req.offset)?;
        }
        self.inner.write_batch(requests)
    }
}
