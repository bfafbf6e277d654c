//! [`OffloadStore`] and its [`Handle`]s.

use super::packing::{Layout, Written};
use super::payload::Payload;
use super::shared::Shared;
use super::state::{Data, Entry, Failure, Home, State, Step, Taken};
use super::swap::SwapFile;
use super::{worker, HostPool, OffloadConfig, OffloadStats};
use fastensor_core::debug_fields;
use fastensor_core::{Error, ErrorKind, FileOpener, HostBuffer, Result};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Activations offloaded to one swap file, under a memory budget, with background writes
/// and scheduled prefetch. `Send + Sync`. The swap file has no name in its directory (it is
/// made with `O_TMPFILE`, or unlinked as soon as it is open), so nothing is left behind
/// however the process ends (a panic, `process::exit`, `SIGKILL`). Dropping the store stops
/// its I/O threads and closes the file.
pub struct OffloadStore {
    pub(crate) shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

debug_fields!(OffloadStore, "OffloadStore", |s| { path: s.shared.path, config: s.shared.config });

/// A tensor in an [`OffloadStore`]. Dropping it frees the tensor's memory and file space.
pub struct Handle {
    pub(crate) id: u64,
    pub(crate) len: u64,
    pub(crate) label: Arc<str>,
    pub(crate) shared: Arc<Shared>,
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
        // Room a tensor leaves behind starts no read: the next get or transfer does (a
        // graph freed without backward drops every handle, and reads for them are waste).
        drop(st);
        self.shared.notify_changed();
    }
}

static NEXT_FILE: AtomicU64 = AtomicU64::new(0);

impl OffloadStore {
    /// A store whose swap file is a new, unnamed file in `config.dir`, opened through
    /// `opener` ([`FileOpener::open_swap`]: the facade's `Engine` picks the backend per
    /// transfer, among those that bypass the page cache unless `config.pin` names one).
    pub fn new<O: FileOpener + ?Sized>(opener: &O, config: OffloadConfig) -> Result<OffloadStore> {
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
        let swap = fastensor_sys::atomic::unnamed_file(&config.dir, &name).map_err(|e| {
            Error::io(e, "cannot create the offload swap file").with_path(&config.dir)
        })?;
        let path = fastensor_sys::atomic::fd_path(&swap);
        // Written once and read back once: a page-cache copy would hold the memory offload
        // frees (and cost a copy each way, with the page cache's faults).
        let file = opener
            .open_swap(&path, config.pin.as_deref())
            .map_err(|e| {
                Error::new(e.kind(), "cannot open the offload swap file")
                    .with_path(&config.dir)
                    .with_source(e)
            })?;
        let config = OffloadConfig {
            device_runtime: config.device_runtime.or_else(|| opener.device_runtime()),
            ..config
        };
        let mut store = OffloadStore {
            shared: Arc::new(Shared::new(SwapFile(file), path, swap, &config)),
            threads: Vec::new(),
        };
        // From here on, Drop stops the threads whatever fails.
        let s = &store.shared;
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

    /// The pool the buffers [`OffloadStore::get`] returns come from: give them back there
    /// once their bytes are no longer needed, and later reads reuse their memory (already
    /// faulted in) instead of taking fresh memory ([`OffloadConfig::pool`]).
    pub fn pool(&self) -> &Arc<HostPool> {
        &self.shared.pool
    }

    /// The settings.
    pub fn config(&self) -> &OffloadConfig {
        &self.shared.config
    }

    /// Offloads `tensor` under `label` and returns at once: it waits in memory unwritten
    /// while it is among the last put ([`OffloadConfig::write_behind`]), and a background
    /// thread writes it once it is not (or when a put needs its room). Waits first when the
    /// memory budget has no room for it (backpressure), after dropping the tensors kept in
    /// memory that are needed least and starting the writes the room needs. A tensor larger than the
    /// whole budget is written through instead: on the caller's thread, before `put`
    /// returns, never held. Tensors below the small threshold stay in memory. Fails with the
    /// first background failure not yet reported (naming its tensor; `tensor` is then not
    /// stored, and the error says so), or when a written-through tensor cannot be written.
    /// `tensor` is a [`HostBuffer`] (the store owns it) or a [`Payload::foreign`] (memory
    /// owned elsewhere, written in place; the store keeps it, counted in the budget, until
    /// written, then while the budget has room, and drops it after; or until it is taken
    /// back unwritten).
    pub fn put(&self, tensor: impl Into<Payload>, label: impl Into<String>) -> Result<Handle> {
        let tensor: Payload = tensor.into();
        let s = &self.shared;
        let len = tensor.len() as u64;
        let (st, handle, mut entry) = self.begin_put(len, label.into(), Home::Host)?;
        let mut st = st;
        let id = handle.id;
        if tensor.len() < s.config.small_threshold {
            st.stats.small_bytes += len;
            entry.data = Data::Small(Arc::new(tensor));
            st.entries.insert(id, entry);
            return Ok(handle);
        }
        if len > s.config.budget {
            let extent = s.extent_for(&mut st, len)?;
            entry.extent = Some(extent);
            st.entries.insert(id, entry);
            drop(st);
            return self.write_through(handle, extent.offset, &tensor);
        }
        let mut st = s.wait_for_room(st, Home::Host, len);
        let extent = s.extent_for(&mut st, len)?;
        st.hold(len);
        entry.extent = Some(extent);
        st.insert_unwritten(id, entry, tensor);
        st.largest_put = st.largest_put.max(len);
        let limit = s.config.write_behind_bytes(st.largest_put);
        s.wake_for(st.write_behind(limit));
        Ok(handle)
    }

    /// The common start of a put of `len` bytes homed in `home`: the lock, the handle, the
    /// entry (not inserted yet). Fails with the first background failure not yet reported.
    pub(crate) fn begin_put(
        &self,
        len: u64,
        label: String,
        home: Home,
    ) -> Result<(MutexGuard<'_, State>, Handle, Entry)> {
        let s = &self.shared;
        let label: Arc<str> = label.into();
        let resident = fastensor_sys::pages::resident_bytes();
        let mut st = s.lock();
        st.note_resident(resident);
        if let Some(f) = st.unreported.pop_front() {
            let earlier = f.error();
            return Err(Error::new(
                earlier.kind(),
                format!("tensor `{label}` was not stored: an earlier background transfer failed"),
            )
            .with_source(earlier));
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
        let entry = Entry {
            label,
            len,
            home,
            extent: None,
            layout: None,
            data: Data::OnDisk,
            taken: false,
            dropped: false,
            discarded: false,
        };
        Ok((st, handle, entry))
    }

    /// Writes a tensor larger than the budget on the caller's thread (its entry, on disk
    /// once written, is in the table already); a failure drops the handle (and the entry).
    fn write_through(&self, handle: Handle, offset: u64, tensor: &Payload) -> Result<Handle> {
        let t0 = Instant::now();
        let result = worker::write_host(&self.shared, offset, &tensor[..]);
        self.written_through(handle, t0, result)
    }

    /// Counts a write through that started at `t0` and gave `result`: the handle back, or
    /// on failure, the handle dropped (with its entry) and the error naming the tensor.
    pub(crate) fn written_through(
        &self,
        handle: Handle,
        t0: Instant,
        result: Result<Written>,
    ) -> Result<Handle> {
        let mut st = self.shared.lock();
        st.stats.write_time += t0.elapsed();
        st.stats.written_through += 1;
        match result {
            Ok(written) => {
                st.stats.bytes_written += handle.len;
                st.stats.file_bytes_written += written.file_bytes;
                if let Some(e) = st.entries.get_mut(&handle.id) {
                    e.layout = written.layout.map(Arc::new);
                }
                Ok(handle)
            }
            Err(err) => {
                st.stats.errors += 1;
                let f = Failure::new(&err, "write", handle.id, &handle.label);
                drop(st);
                drop(handle);
                Err(f.error())
            }
        }
    }

    /// Returns the tensor's bytes: from memory when it is there (small, still being written,
    /// kept after its write, or read back ahead), else after waiting for its read in flight
    /// or reading it now. Moves the schedule's cursor to this tensor, which starts reading
    /// back the next ones. A failed background transfer of this tensor is returned as an
    /// error naming it. The buffer comes from the store's [`pool`](OffloadStore::pool) when
    /// read back (a copy of memory owned elsewhere is made there too).
    pub fn get(&self, handle: &Handle) -> Result<HostBuffer> {
        self.get_from(handle, true)
    }

    /// As [`OffloadStore::get`], but memory owned elsewhere ([`Payload::foreign`]) is not
    /// trusted to hold the bytes still (its owner changed it since `put`): the tensor comes
    /// from the store's own memory or from disk, after its write has finished; such a tensor
    /// not written yet is [`ErrorKind::Changed`] (the bytes as put exist nowhere else). (A
    /// tensor below the small threshold was never written: it comes from its memory as it
    /// is.)
    pub fn get_written(&self, handle: &Handle) -> Result<HostBuffer> {
        self.get_from(handle, false)
    }

    /// Whether the tensor's write to the swap file has finished: its bytes there are the
    /// ones put (it may also be kept in memory, or read back since). False while it waits
    /// unwritten or is being written, for a tensor never written (small, or taken back
    /// unwritten), after a failed transfer, and for a handle of another store (a tensor
    /// larger than the budget, written by its `put` itself, is written once that `put`
    /// returns). A caller that
    /// sees true at a moment when it knows the memory put was not changed yet knows that
    /// the bytes on disk are the ones it put, whatever happens to that memory later.
    pub fn is_written(&self, handle: &Handle) -> bool {
        if !Arc::ptr_eq(&handle.shared, &self.shared) {
            return false;
        }
        let st = self.shared.lock();
        st.entries.get(&handle.id).is_some_and(|e| {
            e.extent.is_some()
                && matches!(
                    e.data,
                    Data::Kept(_)
                        | Data::OnDisk
                        | Data::Queued
                        | Data::Reading
                        | Data::Loaded(_)
                        | Data::LoadedDevice(_)
                )
        })
    }

    fn get_from(&self, handle: &Handle, trust_foreign: bool) -> Result<HostBuffer> {
        let s = &self.shared;
        match self.take(handle, trust_foreign)? {
            Taken::Payload(Payload::Owned(buf)) => Ok(buf),
            Taken::Payload(other) => s.copy_to_pool(&other),
            Taken::Shared(bytes) => s.copy_to_pool(&bytes),
            Taken::Device(buf) => {
                let len = buf.range().len();
                let mut out = s.pool.take(len)?;
                out.truncate(len);
                s.runtime()?.copy_to_host(buf.device_slice(), &mut out)?;
                Ok(out)
            }
            Taken::Source(src) => {
                src.wait_ready()?;
                let r = src.range();
                let mut out = s.pool.take(r.len())?;
                out.truncate(r.len());
                s.runtime()?.copy_to_host(src.slice(), &mut out)?;
                Ok(out)
            }
        }
    }

    /// Takes the tensor's bytes out of the store for a get: from memory when they are
    /// there, else after waiting for the transfer under way or reading them now (into
    /// memory of the tensor's home). Moves the schedule's cursor to this tensor. With
    /// `trust_foreign` false, memory owned elsewhere is not used (see
    /// [`OffloadStore::get_written`]).
    pub(crate) fn take(&self, handle: &Handle, trust_foreign: bool) -> Result<Taken> {
        let s = &self.shared;
        if !Arc::ptr_eq(&handle.shared, s) {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("tensor `{}` belongs to another offload store", handle.label),
            ));
        }
        let resident = fastensor_sys::pages::resident_bytes();
        let mut st = s.lock();
        st.note_resident(resident);
        st.stats.gets += 1;
        let mut stall = Duration::ZERO;
        loop {
            match st.take_step(handle.id, &handle.label, trust_foreign)? {
                Step::Wait => {
                    let t0 = Instant::now();
                    st = s.wait(st);
                    stall += t0.elapsed();
                }
                Step::Taken(taken) => {
                    if stall.is_zero() {
                        st.stats.gets_from_memory += 1;
                    } else {
                        st.stats.gets_waited += 1;
                        st.stats.get_stall += stall;
                    }
                    s.after_change(&mut st);
                    return Ok(taken);
                }
                Step::Read {
                    offset,
                    layout,
                    home,
                } => {
                    s.after_change(&mut st);
                    drop(st);
                    return self.read_now(handle, offset, layout.as_deref(), home, stall);
                }
            }
        }
    }

    /// Reads a tensor on disk with nothing in flight for it, on the caller's thread.
    fn read_now(
        &self,
        handle: &Handle,
        offset: u64,
        layout: Option<&Layout>,
        home: Home,
        stall: Duration,
    ) -> Result<Taken> {
        let s = &self.shared;
        let t0 = Instant::now();
        let result = worker::read(s, offset, layout, handle.len, home);
        let mut st = s.lock();
        st.stats.get_stall += stall + t0.elapsed();
        st.stats.read_time += t0.elapsed();
        st.stats.gets_from_disk += 1;
        match result {
            Ok((data, file_bytes)) => {
                st.stats.bytes_read += handle.len;
                st.stats.file_bytes_read += file_bytes;
                Ok(Taken::of_read(data))
            }
            Err(err) => {
                st.stats.errors += 1;
                Err(Failure::new(&err, "read", handle.id, &handle.label).error())
            }
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

    /// Writes every tensor still unwritten (GPU tensors kept in device memory included),
    /// and waits until every background write and read
    /// has finished.
    pub fn flush(&self) {
        let kept = self.shared.lock().device_overflow(None, 0);
        self.send_older(kept);
        let mut st = self.shared.lock();
        self.shared.wake_for(st.write_behind(0));
        while !st.jobs.is_empty() || st.entries.values().any(|e| e.data.in_flight()) {
            st = self.shared.wait(st);
        }
    }

    /// The counters, with the bytes held now and their peak.
    pub fn stats(&self) -> OffloadStats {
        let st = self.shared.lock();
        let mut out = st.stats.clone();
        out.budget_bytes = self.shared.config.budget;
        out.held_bytes = st.held;
        out.device_budget_bytes = self.shared.config.device_budget;
        out.device_unwritten_bytes = st.device_unwritten_bytes();
        out.device_held_bytes = st.device_held;
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
        self.shared.notify_changed();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
