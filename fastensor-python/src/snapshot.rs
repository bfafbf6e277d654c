//! `save_file_async`: the tensors are copied into one page-aligned staging buffer laid out
//! as the file's data section (so the save writes it straight from memory, in large
//! requests), then written by a background thread. The staging buffer goes back to a pool
//! of one when the save ends, so the next snapshot reuses memory already faulted in.

use crate::errors::to_py;
use fastensor::checkpoint::{self, TensorView};
use fastensor::core::parallel;
use fastensor::fork::{self, ForkMutex};
use fastensor::{Engine, Error, HostBuffer, MemRef, Result, TensorDesc};
use pyo3::exceptions::{PyRuntimeError, PyTimeoutError};
use pyo3::prelude::*;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Threads that copy a snapshot (memory bandwidth, and fresh pages faulted in parallel).
const COPY_THREADS: usize = 4;

/// Bytes one copy task moves.
const COPY_CHUNK: usize = 8 << 20;

/// The staging buffer kept between async saves (at most one: the largest needed so far).
#[derive(Default)]
pub struct StagingPool {
    kept: Mutex<Option<HostBuffer>>,
}

impl StagingPool {
    /// A buffer of at least `len` bytes: the kept one if large enough, else a new one.
    fn take(&self, len: usize) -> Result<HostBuffer> {
        let kept = self.kept.lock().unwrap_or_else(|p| p.into_inner()).take();
        match kept {
            Some(b) if b.len() >= len => Ok(b),
            _ => HostBuffer::new(len.max(1)),
        }
    }

    /// Keeps `buf` for the next snapshot, unless a larger one is kept already.
    fn give_back(&self, buf: HostBuffer) {
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        if kept.as_ref().is_none_or(|k| k.len() < buf.len()) {
            *kept = Some(buf);
        }
    }

    /// Bytes kept.
    pub fn bytes(&self) -> usize {
        self.kept
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map_or(0, |b| b.len())
    }

    /// Frees the kept buffer.
    pub fn clear(&self) {
        *self.kept.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

/// A copy of tensors' bytes, laid out as a safetensors data section.
pub struct Snapshot {
    descs: Vec<TensorDesc>,
    buffer: HostBuffer,
    len: usize,
}

impl Snapshot {
    /// Copies every tensor (host memory only) into a staging buffer from `pool`.
    pub fn take(pool: &StagingPool, tensors: &[TensorView<'_>]) -> Result<Snapshot> {
        let mut pieces = Vec::with_capacity(tensors.len());
        let mut len = 0usize;
        for t in tensors {
            match t.data {
                MemRef::Host(bytes) => pieces.push((len, bytes)),
                MemRef::Device(_) => {
                    return Err(Error::new(
                        fastensor::ErrorKind::Unsupported,
                        format!(
                            "tensor `{}`: an asynchronous save snapshots host memory only",
                            t.desc.name
                        ),
                    ))
                }
            }
            len += t.data.len();
        }
        let mut buffer = pool.take(len)?;
        // Chunks of at most COPY_CHUNK bytes, copied by a few threads.
        let mut tasks: Vec<(&mut [u8], &[u8])> = Vec::new();
        let mut rest: &mut [u8] = &mut buffer[..len];
        for (_, bytes) in &pieces {
            let (dst, tail) = rest.split_at_mut(bytes.len());
            rest = tail;
            for (d, s) in dst.chunks_mut(COPY_CHUNK).zip(bytes.chunks(COPY_CHUNK)) {
                tasks.push((d, s));
            }
        }
        parallel::for_each(tasks, COPY_THREADS, |(d, s)| {
            d.copy_from_slice(s);
            Ok(())
        })?;
        Ok(Snapshot {
            descs: tensors.iter().map(|t| t.desc.clone()).collect(),
            buffer,
            len,
        })
    }
}

/// Where a background save stands.
enum State {
    Running,
    Saved,
    /// Failed; not yet raised.
    Failed(Error),
    /// Failed, and raised by an earlier `wait()`: raised again as is.
    Raised(PyErr),
}

/// The state of a background save, and a signal when it ends.
struct Outcome {
    state: Mutex<State>,
    finished: Condvar,
}

impl Outcome {
    fn running(&self) -> bool {
        matches!(
            *self.state.lock().unwrap_or_else(|p| p.into_inner()),
            State::Running
        )
    }

    /// Blocks until the save has finished (successfully or not).
    fn wait_finished(&self) {
        let mut guard = self.state.lock().unwrap_or_else(|p| p.into_inner());
        while matches!(*guard, State::Running) {
            guard = self.finished.wait(guard).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// The background saves still running, by target path: a new save to a path starts writing
/// only once the one before it has finished, so saves to one path land in the order they
/// were made.
#[derive(Default)]
struct Running {
    /// The fork generation the saves belong to ([`fork::generation`]).
    generation: u64,
    saves: Vec<(PathBuf, Arc<Outcome>)>,
}

static RUNNING: ForkMutex<Running> = ForkMutex::lazy();

/// Runs `f` on this process's running saves. A fork child starts with none: the parent's
/// saves run in threads that do not exist there (their records are set aside, not read).
fn with_running<T>(f: impl FnOnce(&mut Vec<(PathBuf, Arc<Outcome>)>) -> T) -> T {
    let mut running = RUNNING.lock();
    let now = fork::generation();
    if running.generation != now {
        std::mem::forget(std::mem::take(&mut running.saves));
        running.generation = now;
    }
    running.saves.retain(|(_, o)| o.running());
    f(&mut running.saves)
}

/// The key of a target path: absolute where its place has directories, so two spellings of
/// one path are one key (an object's URL as it is).
fn path_key(path: &std::path::Path) -> PathBuf {
    if !fastensor::engine::place_of(path).directories {
        return path.to_path_buf();
    }
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// The paths of the background saves of this process that have not finished.
pub fn pending_paths() -> Vec<PathBuf> {
    with_running(|saves| saves.iter().map(|(p, _)| p.clone()).collect())
}

/// Blocks until every background save of this process started so far has finished.
pub fn wait_all() {
    let outcomes: Vec<Arc<Outcome>> =
        with_running(|saves| saves.iter().map(|(_, o)| o.clone()).collect());
    for o in outcomes {
        o.wait_finished();
    }
}

/// A save running in the background: `wait()` for its outcome, `done()` to poll.
#[pyclass(name = "SaveHandle", module = "fastensor._native", frozen)]
pub struct SaveHandle {
    path: PathBuf,
    outcome: Arc<Outcome>,
    started: Instant,
    /// The fork generation of the process whose thread runs the save.
    generation: u64,
}

impl SaveHandle {
    /// Starts the background save of `snapshot` to `path` (with a checksum of every tensor
    /// when `checksums`); fails when no thread can be started for it.
    pub fn spawn(
        engine: Engine,
        pool: Arc<StagingPool>,
        path: PathBuf,
        snapshot: Snapshot,
        metadata: BTreeMap<String, String>,
        checksums: bool,
    ) -> Result<SaveHandle> {
        let outcome = Arc::new(Outcome {
            state: Mutex::new(State::Running),
            finished: Condvar::new(),
        });
        let done = outcome.clone();
        let target = path.clone();
        let key = path_key(&path);
        let before = with_running(|saves| {
            let before = saves
                .iter()
                .rev()
                .find(|(p, _)| *p == key)
                .map(|(_, o)| o.clone());
            saves.push((key, outcome.clone()));
            before
        });
        let spawned = std::thread::Builder::new()
            .name("fastensor-save".into())
            .spawn(move || {
                if let Some(before) = before {
                    before.wait_finished(); // saves to one path land in order
                }
                let result = checkpoint::save_section(
                    &engine,
                    &target,
                    &snapshot.descs,
                    snapshot.buffer[..snapshot.len].into(),
                    &metadata,
                    checksums,
                );
                pool.give_back(snapshot.buffer);
                *done.state.lock().unwrap_or_else(|p| p.into_inner()) = match result {
                    Ok(()) => State::Saved,
                    Err(e) => State::Failed(e),
                };
                done.finished.notify_all();
            });
        if let Err(e) = spawned {
            // Nothing will run: the save is over (a later save to the path must not wait).
            *outcome.state.lock().unwrap_or_else(|p| p.into_inner()) = State::Saved;
            return Err(Error::io(e, "cannot start the background save's thread").with_path(&path));
        }
        Ok(SaveHandle {
            path,
            outcome,
            started: Instant::now(),
            generation: fork::generation(),
        })
    }

    /// Refuses a handle inherited through `fork`: its save runs (or ran) in the parent,
    /// whose thread does not exist here, so waiting for it would never end.
    fn check_process(&self) -> PyResult<()> {
        if self.generation == fork::generation() {
            return Ok(());
        }
        Err(PyRuntimeError::new_err(format!(
            "the save of {} was started by the parent of this forked process; only the \
             parent can wait for it",
            self.path.display()
        )))
    }
}

#[pymethods]
impl SaveHandle {
    /// True once the save has finished (successfully or not).
    fn done(&self) -> PyResult<bool> {
        self.check_process()?;
        Ok(!self.outcome.running())
    }

    /// Blocks until the save has finished and raises its error, if any. With `timeout`
    /// (seconds), raises `TimeoutError` if it has not finished by then; the save goes on.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        self.check_process()?;
        let deadline = timeout.map(|t| Instant::now() + Duration::from_secs_f64(t.max(0.0)));
        let finished = py.detach(|| {
            let mut guard = self.outcome.state.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if !matches!(*guard, State::Running) {
                    return true;
                }
                guard = match deadline {
                    None => self
                        .outcome
                        .finished
                        .wait(guard)
                        .unwrap_or_else(|p| p.into_inner()),
                    Some(d) => {
                        let left = d.saturating_duration_since(Instant::now());
                        if left.is_zero() {
                            return false;
                        }
                        self.outcome
                            .finished
                            .wait_timeout(guard, left)
                            .unwrap_or_else(|p| p.into_inner())
                            .0
                    }
                };
            }
        });
        if !finished {
            return Err(PyTimeoutError::new_err(format!(
                "the save of {} has not finished yet",
                self.path.display()
            )));
        }
        let mut state = self.outcome.state.lock().unwrap_or_else(|p| p.into_inner());
        match std::mem::replace(&mut *state, State::Saved) {
            State::Running | State::Saved => Ok(()),
            State::Failed(e) => {
                let err = to_py(e);
                *state = State::Raised(err.clone_ref(py));
                Err(err)
            }
            State::Raised(err) => {
                *state = State::Raised(err.clone_ref(py));
                Err(err)
            }
        }
    }

    /// The file being saved.
    #[getter]
    fn path(&self) -> crate::located::Located {
        crate::located::Located(self.path.clone())
    }

    /// Seconds since the save started.
    #[getter]
    fn elapsed(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    fn __repr__(&self) -> String {
        let state = match self.done() {
            Ok(true) => "done",
            Ok(false) => "running",
            Err(_) => "the parent's",
        };
        format!("<SaveHandle {} ({state})>", self.path.display())
    }
}
