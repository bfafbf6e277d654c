//! [`OffloadStore`] and its [`Handle`]s.

use super::allocator::round_up;
use super::payload::Payload;
use super::state::{Data, Entry, Failure, Job, State};
use super::{worker, OffloadConfig, OffloadStats, Recycler};
use crate::{Engine, EngineFile};
use fastensor_core::{Error, ErrorKind, HostBuffer, OpenMode, Purpose, Result};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What the store, its I/O threads and its handles share.
pub(crate) struct Shared {
    pub(crate) file: EngineFile,
    /// `/proc/self/fd/N` of `swap`: how the engine's backends open the swap file.
    pub(crate) path: PathBuf,
    /// The swap file, which has no name: it goes away with the last descriptor, however
    /// the process ends.
    swap: std::fs::File,
    pub(crate) config: OffloadConfig,
    state: Mutex<State>,
    /// Jobs were queued (I/O threads wait on it).
    pub(crate) work: Condvar,
    /// Something finished or was freed (`put` and `get` wait on it).
    changed: Condvar,
    /// Buffers that reads back go into (see [`OffloadStore::recycler`]).
    pub(crate) recycler: Recycler,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wait<'a>(&self, st: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.changed.wait(st).unwrap_or_else(|p| p.into_inner())
    }

    /// Starts the prefetches now possible and wakes the waiters.
    pub(crate) fn after_change(&self, st: &mut State) {
        if st.pump(self.config.budget, self.config.prefetch_depth) {
            self.work.notify_all();
        }
        self.changed.notify_all();
    }

    /// Grows the swap file to at least `needed` bytes (doubling it at least). Changing a
    /// file's size waits for the direct writes in flight on it (the file system's rule), so
    /// growth is rare: doubling, or [`OffloadConfig::initial_capacity`] reserved at once.
    fn grow(&self, st: &mut State, needed: u64) -> Result<()> {
        let cap = st.alloc.capacity();
        let new = round_up(needed.max(cap * 2));
        fastensor_core::BackendFile::set_len(&self.file, new)?;
        // Best effort: reserve the blocks so later writes do not allocate.
        let flags = rustix::fs::FallocateFlags::KEEP_SIZE;
        let _ = rustix::fs::fallocate(&self.swap, flags, cap, new - cap);
        st.alloc.grow_to(new);
        Ok(())
    }
}

/// Activations offloaded to one swap file, under a memory budget, with background writes
/// and scheduled prefetch. `Send + Sync`. The swap file has no name in its directory (it is
/// made with `O_TMPFILE`, or unlinked as soon as it is open), so nothing is left behind
/// however the process ends (a panic, `process::exit`, `SIGKILL`). Dropping the store stops
/// its I/O threads and closes the file.
pub struct OffloadStore {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

debug_fields!(OffloadStore, "OffloadStore", |s| { path: s.shared.path, config: s.shared.config });

/// A tensor in an [`OffloadStore`]. Dropping it frees the tensor's memory and file space.
pub struct Handle {
    id: u64,
    len: u64,
    label: Arc<str>,
    shared: Arc<Shared>,
}

debug_fields!(Handle, "Handle", |s| { id: s.id, label: s.label, len: s.len });

impl Handle {
    /// The tensor's id in its store (increasing in put order).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The label given to `put`.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The tensor's length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True for an empty tensor.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        st.release(self.id);
        self.shared.after_change(&mut st);
    }
}

static NEXT_FILE: AtomicU64 = AtomicU64::new(0);

impl OffloadStore {
    /// A store whose swap file is a new, unnamed file in `config.dir`, opened through
    /// `engine`.
    pub fn new(engine: &Engine, config: OffloadConfig) -> Result<OffloadStore> {
        if config.budget == 0 {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                "the offload memory budget is 0",
            ));
        }
        let name = format!(
            "fastensor-offload-{}-{}.swap",
            std::process::id(),
            NEXT_FILE.fetch_add(1, Ordering::Relaxed)
        );
        let swap = crate::atomic::unnamed_file(&config.dir, &name).map_err(|e| {
            Error::io(e, "cannot create the offload swap file").with_path(&config.dir)
        })?;
        let path = crate::atomic::fd_path(&swap);
        let file = engine.open(&path, OpenMode::Truncate).map_err(|e| {
            Error::new(e.kind(), "cannot open the offload swap file")
                .with_path(&config.dir)
                .with_source(e)
        })?;
        let mut store = OffloadStore {
            shared: Arc::new(Shared {
                file,
                path,
                swap,
                config: config.clone(),
                state: Mutex::new(State::default()),
                work: Condvar::new(),
                changed: Condvar::new(),
                recycler: Recycler::new(config.budget),
            }),
            threads: Vec::new(),
        };
        // From here on, Drop stops the threads whatever fails.
        let s = &store.shared;
        s.file.set_purpose(Purpose::Offload);
        // Written once and read back once: a page-cache copy would hold the memory offload
        // frees (and cost a copy each way, with the page cache's faults).
        match &s.config.pin {
            Some(b) => s.file.pin(Some(b))?,
            None => {
                s.file.bypass_page_cache();
            }
        }
        if s.config.initial_capacity > 0 {
            let mut st = s.lock();
            s.grow(&mut st, s.config.initial_capacity)?;
        }
        store.threads = worker::spawn(&store.shared, store.shared.config.io_threads)?;
        Ok(store)
    }

    /// A path that opens the swap file while the store lives (`/proc/self/fd/N`: the file
    /// has no name in its directory).
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// Where the buffers [`OffloadStore::get`] returns can be given back once their bytes
    /// are no longer needed: later reads of the same length then reuse them (memory already
    /// faulted in) instead of allocating, up to the budget's worth of spare buffers.
    pub fn recycler(&self) -> Recycler {
        self.shared.recycler.clone()
    }

    /// The settings.
    pub fn config(&self) -> &OffloadConfig {
        &self.shared.config
    }

    /// Offloads `tensor` under `label` and returns at once while a background thread writes
    /// it; waits first when the memory budget has no room for it (backpressure). Tensors
    /// below the small threshold stay in memory. Fails with the first background failure
    /// not yet reported (naming its tensor; `tensor` is then not stored, and the error says
    /// so), or for a tensor larger than the budget. `tensor` is a [`HostBuffer`] (the store
    /// owns it) or a [`Payload::foreign`] (memory owned elsewhere, written in place; the
    /// store drops it once written, counting it in the budget until then).
    pub fn put(&self, tensor: impl Into<Payload>, label: impl Into<String>) -> Result<Handle> {
        let tensor: Payload = tensor.into();
        let s = &self.shared;
        let (budget, depth) = (s.config.budget, s.config.prefetch_depth);
        let len = tensor.len() as u64;
        let label: Arc<str> = label.into().into();
        let mut st = s.lock();
        if let Some(f) = st.unreported.pop_front() {
            let earlier = f.error();
            return Err(Error::new(
                earlier.kind(),
                format!("tensor `{label}` was not stored: an earlier background transfer failed"),
            )
            .with_source(earlier));
        }
        let small = tensor.len() < s.config.small_threshold;
        if !small && len > budget {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("tensor `{label}` ({len} bytes) exceeds the offload budget ({budget})"),
            ));
        }
        let id = st.next_id;
        st.next_id += 1;
        st.stats.puts += 1;
        let handle = Handle {
            id,
            len,
            label: label.clone(),
            shared: s.clone(),
        };
        let mut entry = Entry {
            label,
            len,
            extent: None,
            data: Data::OnDisk,
            taken: false,
            dropped: false,
            discarded: false,
        };
        if small {
            st.stats.small_bytes += len;
            entry.data = Data::Small(Arc::new(tensor));
            st.entries.insert(id, entry);
            return Ok(handle);
        }
        st.evict_for(len, budget, depth);
        if st.held + len > budget {
            let t0 = Instant::now();
            st.put_waiters += 1;
            while st.held + len > budget {
                st = s.wait(st);
                st.evict_for(len, budget, depth);
            }
            st.put_waiters -= 1;
            st.stats.put_wait += t0.elapsed();
        }
        let extent = loop {
            match st.alloc.alloc(len) {
                Ok(x) => break x,
                Err(needed) => s.grow(&mut st, needed)?,
            }
        };
        st.hold(len);
        let buf = Arc::new(tensor);
        entry.extent = Some(extent);
        entry.data = Data::Writing(buf.clone());
        st.entries.insert(id, entry);
        st.jobs.push_back(Job::Write {
            id,
            offset: extent.offset,
            buf,
        });
        s.work.notify_one();
        Ok(handle)
    }

    /// Returns the tensor's bytes: from memory when it is there (small, still being written,
    /// or prefetched), else after waiting for its read in flight or reading it now. Moves
    /// the schedule's cursor to this tensor, which starts the prefetch of the next ones.
    /// A failed background transfer of this tensor is returned as an error naming it.
    pub fn get(&self, handle: &Handle) -> Result<HostBuffer> {
        let s = &self.shared;
        if !Arc::ptr_eq(&handle.shared, s) {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("tensor `{}` belongs to another offload store", handle.label),
            ));
        }
        let id = handle.id;
        let mut st = s.lock();
        st.stats.gets += 1;
        let mut stall = Duration::ZERO;
        loop {
            let e = st.entries.get_mut(&id).expect("a live handle has an entry");
            if e.discarded {
                return Err(Error::new(
                    ErrorKind::InvalidInput,
                    format!("tensor `{}` was discarded", handle.label),
                ));
            }
            let from_memory = match &mut e.data {
                Data::Failed(f) => return Err(f.error()),
                Data::Small(b) => Some(b.clone()),
                Data::Writing(b) => {
                    e.taken = true;
                    Some(b.clone())
                }
                Data::Loaded(_) => {
                    e.taken = true;
                    let Data::Loaded(buf) = std::mem::replace(&mut e.data, Data::OnDisk) else {
                        unreachable!("matched above")
                    };
                    st.held -= handle.len;
                    st.schedule.taken(id);
                    if stall.is_zero() {
                        st.stats.gets_from_memory += 1;
                    } else {
                        st.stats.gets_waited += 1;
                        st.stats.get_stall += stall;
                    }
                    s.after_change(&mut st);
                    return Ok(buf);
                }
                Data::Queued => {
                    st.cancel_queued(id);
                    continue;
                }
                Data::Reading => {
                    let t0 = Instant::now();
                    st = s.wait(st);
                    stall += t0.elapsed();
                    continue;
                }
                Data::OnDisk => None,
            };
            if let Some(b) = from_memory {
                if e.taken {
                    st.schedule.taken(id);
                }
                st.stats.gets_from_memory += 1;
                s.after_change(&mut st);
                drop(st);
                return HostBuffer::from_slice(&b);
            }
            // On disk and nothing in flight: read it here.
            e.taken = true;
            let offset = e.extent.expect("tensors on disk have an extent").offset;
            st.schedule.taken(id);
            s.after_change(&mut st);
            drop(st);
            let t0 = Instant::now();
            let result = worker::read(s, offset, handle.len);
            let mut st = s.lock();
            st.stats.get_stall += stall + t0.elapsed();
            st.stats.read_time += t0.elapsed();
            st.stats.gets_from_disk += 1;
            return match result {
                Ok(buf) => {
                    st.stats.bytes_read += handle.len;
                    Ok(buf)
                }
                Err(err) => {
                    st.stats.errors += 1;
                    Err(Failure::new(&err, "read", id, &handle.label).error())
                }
            };
        }
    }

    /// Starts reading these tensors back now, ahead of the schedule, as the budget allows
    /// (the rest follows as memory frees up).
    pub fn prefetch(&self, handles: &[&Handle]) {
        let mut st = self.shared.lock();
        for h in handles {
            if !st.explicit.contains(&h.id) {
                st.explicit.push_back(h.id);
            }
        }
        self.shared.after_change(&mut st);
    }

    /// Tells the store the order of the coming `get`s (instead of backward order) and starts
    /// prefetching its first tensors.
    pub fn hint_order(&self, order: &[&Handle]) {
        let mut st = self.shared.lock();
        st.schedule.set_hint(order.iter().map(|h| h.id).collect());
        self.shared.after_change(&mut st);
    }

    /// Back to the default backward (last in, first out) order.
    pub fn hint_backward(&self) {
        let mut st = self.shared.lock();
        st.schedule.clear_hint();
        self.shared.after_change(&mut st);
    }

    /// The puts are over and the gets begin with the last tensor put: in backward order
    /// (without a hint), prefetching starts now, as the budget allows, instead of at the
    /// first `get`.
    pub fn expect_backward(&self) {
        let mut st = self.shared.lock();
        let next = st.next_id;
        st.schedule.taken(next);
        self.shared.after_change(&mut st);
    }

    /// The caller has the tensor's bytes from elsewhere (its own memory, still alive) and
    /// will not `get` it: a write of it not yet started is cancelled (its memory leaves the
    /// budget), and the schedule moves past it as a `get` would. Its file space stays until
    /// the handle is dropped.
    pub fn discard(&self, handle: &Handle) {
        let s = &self.shared;
        if !Arc::ptr_eq(&handle.shared, s) {
            return;
        }
        let mut st = s.lock();
        st.discard(handle.id);
        s.after_change(&mut st);
    }

    /// Waits until every background write and read has finished.
    pub fn flush(&self) {
        let mut st = self.shared.lock();
        while !st.jobs.is_empty()
            || st
                .entries
                .values()
                .any(|e| matches!(e.data, Data::Writing(_) | Data::Reading | Data::Queued))
        {
            st = self.shared.wait(st);
        }
    }

    /// The counters, with the bytes held now and their peak.
    pub fn stats(&self) -> OffloadStats {
        let st = self.shared.lock();
        let mut out = st.stats.clone();
        out.budget = self.shared.config.budget;
        out.held_bytes = st.held;
        out.file_capacity = st.alloc.capacity();
        out.file_allocated = st.alloc.allocated();
        out
    }
}

impl Drop for OffloadStore {
    fn drop(&mut self) {
        {
            let mut st = self.shared.lock();
            st.shutdown = true;
            st.jobs.clear();
        }
        self.shared.work.notify_all();
        self.shared.changed.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
