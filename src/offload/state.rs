//! The store's bookkeeping, kept under one lock: tensors and where their bytes are, the
//! budget, the job queue of the I/O threads, and what to keep in memory or read back.
//!
//! The budget counts every byte the store holds: tensors being written, tensors written and
//! still kept in memory, reads queued or running, and tensors read back and not yet taken.
//! A tensor written stays in memory while the budget has room (the last ones put are the
//! first ones wanted back); room is made by dropping the kept tensors least needed: those
//! the schedule does not expect soon, oldest first, then the farthest expected ones.

use super::allocator::{Extent, ExtentAllocator};
use super::payload::Payload;
use super::schedule::Schedule;
use super::OffloadStats;
use fastensor_core::{Error, ErrorKind, HostBuffer};
use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;

/// A failed background transfer, kept to be reported (possibly several times).
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    kind: ErrorKind,
    message: String,
    backend: Option<String>,
    path: Option<PathBuf>,
    offset: Option<u64>,
    /// The OS error behind it (`errno`), kept as the source of every error returned.
    os_error: Option<i32>,
    /// The cause's text, when it is no OS error.
    cause: Option<String>,
}

impl Failure {
    /// Records `err`, which happened while `what` the tensor `label`.
    pub(crate) fn new(err: &Error, what: &str, id: u64, label: &str) -> Self {
        Failure {
            kind: err.kind(),
            message: format!(
                "offloaded tensor `{label}` (id {id}): {what} failed: {}",
                err.message()
            ),
            backend: err.backend().map(String::from),
            path: err.path().map(PathBuf::from),
            offset: err.offset(),
            os_error: err.raw_os_error(),
            cause: std::error::Error::source(err).map(|s| s.to_string()),
        }
    }

    /// The error to return.
    pub(crate) fn error(&self) -> Error {
        let mut e = Error::new(self.kind, self.message.clone());
        if let Some(b) = &self.backend {
            e = e.with_backend(b.clone());
        }
        if let Some(p) = &self.path {
            e = e.with_path(p);
        }
        if let Some(o) = self.offset {
            e = e.with_offset(o);
        }
        match (self.os_error, &self.cause) {
            (Some(code), _) => e.with_source(std::io::Error::from_raw_os_error(code)),
            (None, Some(cause)) => e.with_source(cause.clone()),
            (None, None) => e,
        }
    }
}

/// Where a tensor's bytes are.
#[derive(Debug)]
pub(crate) enum Data {
    /// Below the small threshold: in memory only.
    Small(Arc<Payload>),
    /// In memory and being written (counted in the budget).
    Writing(Arc<Payload>),
    /// Written, and still in memory as it was put (counted in the budget; dropped when the
    /// budget needs the room).
    Kept(Arc<Payload>),
    /// On disk only.
    OnDisk,
    /// A read is queued (its bytes are reserved in the budget).
    Queued,
    /// A read is running.
    Reading,
    /// Read back ahead of its `get`: in memory and on disk.
    Loaded(HostBuffer),
    /// A background transfer failed.
    Failed(Failure),
}

impl Data {
    /// In memory and on disk: may be dropped to make room.
    fn droppable(&self) -> bool {
        matches!(self, Data::Kept(_) | Data::Loaded(_))
    }
}

/// One tensor.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) label: Arc<str>,
    pub(crate) len: u64,
    pub(crate) extent: Option<Extent>,
    pub(crate) data: Data,
    /// Already returned by `get` (not expected again by the schedule).
    pub(crate) taken: bool,
    /// The handle was dropped while a transfer ran; the transfer's end frees it.
    pub(crate) dropped: bool,
    /// The caller took its bytes elsewhere (`OffloadStore::discard`): no `get` is answered.
    pub(crate) discarded: bool,
}

/// Work for an I/O thread.
#[derive(Debug)]
pub(crate) enum Job {
    /// Write the buffer at the offset.
    Write {
        id: u64,
        offset: u64,
        buf: Arc<Payload>,
    },
    /// Read `len` bytes at the offset.
    Read { id: u64, offset: u64, len: u64 },
}

impl Job {
    fn id(&self) -> u64 {
        match self {
            Job::Write { id, .. } | Job::Read { id, .. } => *id,
        }
    }
}

/// Everything under the store's lock.
#[derive(Debug, Default)]
pub(crate) struct State {
    pub(crate) entries: BTreeMap<u64, Entry>,
    pub(crate) jobs: VecDeque<Job>,
    pub(crate) alloc: ExtentAllocator,
    pub(crate) schedule: Schedule,
    /// Tensors asked for with `prefetch`, first served.
    pub(crate) explicit: VecDeque<u64>,
    /// Failures not yet reported by a `put`.
    pub(crate) unreported: VecDeque<Failure>,
    pub(crate) held: u64,
    pub(crate) put_waiters: usize,
    pub(crate) next_id: u64,
    pub(crate) shutdown: bool,
    pub(crate) stats: OffloadStats,
}

impl State {
    /// Adds `bytes` to the held bytes and tracks the peak.
    pub(crate) fn hold(&mut self, bytes: u64) {
        self.held += bytes;
        self.stats.peak_held_bytes = self.stats.peak_held_bytes.max(self.held);
    }

    /// Records a reading of the process's resident memory.
    pub(crate) fn note_resident(&mut self, bytes: Option<u64>) {
        if let Some(b) = bytes {
            self.stats.peak_resident_bytes = self.stats.peak_resident_bytes.max(b);
        }
    }

    /// True for a tensor the schedule may still expect.
    fn expected(e: &Entry) -> bool {
        !e.taken && !e.dropped && !matches!(e.data, Data::Small(_) | Data::Failed(_))
    }

    /// The tensors wanted in memory soon, nearest first: explicit prefetches, then the
    /// schedule's next `depth`.
    pub(crate) fn desired(&self, depth: usize) -> Vec<u64> {
        let live = |id: &u64| self.entries.get(id).is_some_and(Self::expected);
        let mut out: Vec<u64> = self.explicit.iter().copied().filter(live).collect();
        let explicit = out.len();
        for id in self.schedule.next(&self.entries, depth, Self::expected) {
            if !out[..explicit].contains(&id) {
                out.push(id);
            }
        }
        out
    }

    /// Queues reads for the desired tensors on disk while the budget has room for them,
    /// dropping kept tensors expected later (or not at all) to make it; no read starts
    /// while a `put` waits for room. Tensors larger than the budget are never read ahead.
    /// Returns whether a job was queued.
    pub(crate) fn pump(&mut self, budget: u64, depth: usize) -> bool {
        if self.put_waiters > 0 || self.shutdown {
            return false;
        }
        let desired = self.desired(depth);
        let mut queued = false;
        for (rank, &id) in desired.iter().enumerate() {
            let e = &self.entries[&id];
            if !matches!(e.data, Data::OnDisk) || e.len > budget {
                continue;
            }
            let len = e.len;
            if self.held + len > budget {
                self.drop_for(len, budget, &desired, rank + 1);
                if self.held + len > budget {
                    break;
                }
            }
            let e = self.entries.get_mut(&id).expect("desired ids are live");
            let extent = e.extent.expect("tensors on disk have an extent");
            e.data = Data::Queued;
            self.hold(len);
            self.stats.prefetches += 1;
            self.jobs.push_back(Job::Read {
                id,
                offset: extent.offset,
                len,
            });
            queued = true;
        }
        self.explicit
            .retain(|id| self.entries.get(id).is_some_and(Self::expected));
        queued
    }

    /// Drops kept and read-back tensors until `need` more bytes fit in the budget: first
    /// those not in `desired` (oldest first), then those of `desired` (nearest first) from
    /// rank `from` on, the farthest first. Desired tensors before rank `from` stay.
    fn drop_for(&mut self, need: u64, budget: u64, desired: &[u64], from: usize) {
        let wanted: std::collections::HashSet<u64> = desired.iter().copied().collect();
        let mut order: Vec<u64> = self
            .entries
            .iter()
            .filter(|(id, e)| e.data.droppable() && !wanted.contains(id))
            .map(|(&id, _)| id)
            .collect();
        order.extend(
            desired[from.min(desired.len())..]
                .iter()
                .rev()
                .copied()
                .filter(|id| self.entries[id].data.droppable()),
        );
        for id in order {
            if self.held + need <= budget {
                break;
            }
            let e = self.entries.get_mut(&id).expect("listed above");
            e.data = Data::OnDisk;
            self.held -= e.len;
            self.stats.evictions += 1;
        }
    }

    /// Makes room for a `put` of `need` bytes: drops kept and read-back tensors, the least
    /// needed first (see [`State::drop_for`]; a `put` may drop any of them).
    pub(crate) fn evict_for(&mut self, need: u64, budget: u64, depth: usize) {
        if self.held + need <= budget {
            return;
        }
        let desired = self.desired(depth);
        self.drop_for(need, budget, &desired, 0);
    }

    /// Removes a tensor and frees its extent.
    fn remove(&mut self, id: u64) {
        if let Some(e) = self.entries.remove(&id) {
            if let Some(x) = e.extent {
                self.alloc.free(x);
            }
        }
        self.schedule.forget(id);
    }

    /// The handle of `id` was dropped.
    pub(crate) fn release(&mut self, id: u64) {
        let Some(e) = self.entries.get_mut(&id) else {
            return;
        };
        match &e.data {
            Data::Writing(_) | Data::Reading => {
                e.dropped = true;
                return;
            }
            Data::Queued => {
                self.jobs.retain(|j| j.id() != id);
                self.held -= e.len;
            }
            Data::Loaded(_) | Data::Kept(_) => self.held -= e.len,
            Data::Small(_) => self.stats.small_bytes -= e.len,
            Data::OnDisk | Data::Failed(_) => {}
        }
        self.remove(id);
    }

    /// The caller needs `id` no more from the store (see `OffloadStore::discard`).
    pub(crate) fn discard(&mut self, id: u64) {
        let Some(e) = self.entries.get_mut(&id) else {
            return;
        };
        e.taken = true;
        e.discarded = true;
        if e.data.droppable() {
            e.data = Data::OnDisk;
            self.held -= e.len;
        } else if self.jobs.iter().any(|j| j.id() == id) {
            // A write not yet started (never on disk: nothing to read) or a queued read.
            self.cancel_queued(id);
        }
        self.schedule.taken(id);
    }

    /// Cancels the queued transfer of `id` (a read its `get` does itself instead, or a write
    /// of a tensor discarded before it started): its memory leaves the budget.
    pub(crate) fn cancel_queued(&mut self, id: u64) {
        self.jobs.retain(|j| j.id() != id);
        let e = self.entries.get_mut(&id).expect("caller checked");
        e.data = Data::OnDisk;
        self.held -= e.len;
    }

    /// Records the end of a write: the tensor stays in memory (kept) unless its handle was
    /// dropped, its bytes were taken or discarded meanwhile.
    pub(crate) fn write_done(
        &mut self,
        id: u64,
        buf: Arc<Payload>,
        result: fastensor_core::Result<()>,
    ) {
        if let Err(err) = result {
            return self.fail(id, &err, "background write");
        }
        let e = self
            .entries
            .get_mut(&id)
            .expect("written tensors stay until done");
        self.stats.bytes_written += e.len;
        if e.dropped {
            self.held -= e.len;
            self.remove(id);
        } else if e.taken || e.discarded {
            e.data = Data::OnDisk;
            self.held -= e.len;
        } else {
            e.data = Data::Kept(buf);
        }
    }

    /// Records the end of a read.
    pub(crate) fn read_done(&mut self, id: u64, result: fastensor_core::Result<HostBuffer>) {
        let buf = match result {
            Ok(buf) => buf,
            Err(err) => return self.fail(id, &err, "background read"),
        };
        let e = self
            .entries
            .get_mut(&id)
            .expect("read tensors stay until done");
        self.stats.bytes_read += e.len;
        if e.dropped {
            self.held -= e.len;
            self.remove(id);
        } else if e.discarded {
            // Read before the caller discarded it: not needed any more.
            e.data = Data::OnDisk;
            self.held -= e.len;
        } else {
            e.data = Data::Loaded(buf);
        }
    }

    /// Records a background transfer of `id` that failed during `what`: the entry keeps
    /// the failure (its `get` raises it), the failure waits to be reported, and the entry's
    /// bytes are no longer held; an entry whose handle was dropped goes.
    fn fail(&mut self, id: u64, err: &fastensor_core::Error, what: &str) {
        let e = self
            .entries
            .get_mut(&id)
            .expect("transferred tensors stay until done");
        let f = Failure::new(err, what, id, &e.label);
        e.data = Data::Failed(f.clone());
        let (len, dropped) = (e.len, e.dropped);
        self.unreported.push_back(f);
        self.stats.errors += 1;
        self.held -= len;
        if dropped {
            self.remove(id);
        }
    }
}
