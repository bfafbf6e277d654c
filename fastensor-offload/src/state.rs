//! The store's bookkeeping, kept under one lock: tensors and where their bytes are, the
//! budget, the job queue of the I/O threads, and what to keep in memory or read back.
//!
//! The budget counts every byte the store holds in host memory (pageable, or a GPU's pinned
//! pool): tensors being written, tensors written and still kept in memory, reads queued or
//! running, and tensors read back and not yet taken. GPU tensors written straight from
//! device memory (the direct path) count against a device budget of their own instead, as
//! do their reads back into device memory.
//! The last tensors put wait in memory unwritten, up to the write-behind limit: backward
//! takes them first, so they never touch the disk. Older ones are written, oldest first, and
//! a tensor written stays in memory while the budget has room; room is made by dropping the
//! kept tensors least needed: those the schedule does not expect soon, oldest first, then
//! the farthest expected ones.
//! GPU tensors likewise wait unwritten in their own device memory, the last ones put on
//! each GPU up to the device write-behind limit; the put that passes it copies out the
//! oldest ([`State::device_overflow`]).

use super::allocator::{Extent, ExtentAllocator};
use super::packing::{Layout, Written};
use super::payload::Payload;
use super::schedule::Schedule;
use super::OffloadStats;
use fastensor_core::device_copies::{DeviceMemory, DeviceSource, OutgoingCopy};
use fastensor_core::{Error, ErrorKind, Result};
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
    /// In memory and not written yet (counted in the budget): one of the last tensors put,
    /// which backward takes first. Written once the unwritten bytes pass the store's
    /// write-behind limit or a put needs the room ([`State::write_behind`]); a tensor taken
    /// (or dropped) while unwritten is never written nor read.
    Unwritten(Arc<Payload>),
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
    /// Read back ahead of its `get` (into the host pool or a pinned block): in memory and on
    /// disk.
    Loaded(Payload),
    /// A background transfer failed.
    Failed(Failure),
    /// A GPU tensor in its own device memory, as lent, not copied out yet (counted in no
    /// budget): one of the last GPU tensors put, which backward takes first. Copied out once
    /// its GPU's unwritten bytes pass the device write-behind limit
    /// ([`State::device_overflow`]); taken (or dropped) before, it is never copied.
    OnDevice(DeviceSource),
    /// A GPU tensor being copied into a pinned block (the staged path: the copy and its
    /// device memory are in the tensor's job), then written.
    Staging,
    /// A GPU tensor being written from its device memory (the direct path).
    WritingDevice(Arc<DeviceSource>),
    /// Read back ahead of its `get` into device memory (the direct path).
    LoadedDevice(Box<dyn DeviceMemory>),
}

impl Data {
    /// A transfer queued or under way.
    pub(crate) fn in_flight(&self) -> bool {
        matches!(
            self,
            Data::Writing(_)
                | Data::Reading
                | Data::Queued
                | Data::Staging
                | Data::WritingDevice(_)
        )
    }

    /// In memory and on disk: may be dropped to make room.
    fn droppable(&self) -> bool {
        matches!(
            self,
            Data::Kept(_) | Data::Loaded(_) | Data::LoadedDevice(_)
        )
    }
}

/// Where a tensor's bytes live while the store holds them, and where reads back go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Home {
    /// Host memory (the host pool).
    Host,
    /// A GPU tensor staged through its GPU's pinned pool.
    Pinned(u32),
    /// A GPU tensor written from and read back into device memory.
    Device(u32),
}

/// One tensor.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) label: Arc<str>,
    pub(crate) len: u64,
    pub(crate) home: Home,
    pub(crate) extent: Option<Extent>,
    /// How the tensor lies in its extent, where chunks of it were written packed.
    pub(crate) layout: Option<Arc<Layout>>,
    pub(crate) data: Data,
    /// Already returned by `get` (not expected again by the schedule).
    pub(crate) taken: bool,
    /// The handle was dropped while a transfer ran; the transfer's end frees it.
    pub(crate) dropped: bool,
    /// The caller took its bytes elsewhere (`OffloadStore::discard`): no `get` is answered.
    pub(crate) discarded: bool,
}

/// A tensor's bytes taken out of the store by a get.
pub(crate) enum Taken {
    /// Bytes the get now owns (a block read back, kept memory no one else holds).
    Payload(Payload),
    /// Bytes still shared (small, being written, or kept and held elsewhere): copied.
    Shared(Arc<Payload>),
    /// A GPU tensor read back into device memory.
    Device(Box<dyn DeviceMemory>),
    /// A GPU tensor's own memory, not written yet (the direct path).
    Source(Arc<DeviceSource>),
}

impl Taken {
    /// The bytes a read gave (`worker::read`'s result).
    pub(crate) fn of_read(data: Data) -> Taken {
        match data {
            Data::Loaded(p) => Taken::Payload(p),
            Data::LoadedDevice(buf) => Taken::Device(buf),
            _ => unreachable!("a read gives bytes in memory"),
        }
    }
}

/// What a get does next (see [`State::take_step`]).
pub(crate) enum Step {
    /// Wait for a transfer under way, then look again.
    Wait,
    /// The bytes, taken.
    Taken(Taken),
    /// Read them now, at this offset (laid out so) into memory of this home.
    Read {
        offset: u64,
        layout: Option<Arc<Layout>>,
        home: Home,
    },
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
    /// Read `len` bytes at the offset (laid out so) into memory of `home`.
    Read {
        id: u64,
        offset: u64,
        layout: Option<Arc<Layout>>,
        len: u64,
        home: Home,
    },
    /// Wait for a GPU tensor's copy into its pinned block, then write the block.
    Stage {
        id: u64,
        offset: u64,
        copy: Box<dyn OutgoingCopy>,
    },
    /// Write a GPU tensor from its device memory.
    WriteDevice {
        id: u64,
        offset: u64,
        src: Arc<DeviceSource>,
    },
}

impl Job {
    fn id(&self) -> u64 {
        match self {
            Job::Write { id, .. }
            | Job::Read { id, .. }
            | Job::Stage { id, .. }
            | Job::WriteDevice { id, .. } => *id,
        }
    }
}

/// Everything under the store's lock.
#[derive(Debug, Default)]
pub(crate) struct State {
    /// The host budget, the device budget, the prefetch depth.
    pub(crate) budget: u64,
    pub(crate) device_budget: u64,
    pub(crate) depth: usize,
    pub(crate) entries: BTreeMap<u64, Entry>,
    pub(crate) jobs: VecDeque<Job>,
    pub(crate) alloc: ExtentAllocator,
    pub(crate) schedule: Schedule,
    /// Tensors asked for with `prefetch`, first served.
    pub(crate) explicit: VecDeque<u64>,
    /// Failures not yet reported by a `put`.
    pub(crate) unreported: VecDeque<Failure>,
    /// Bytes held in host memory (pageable and pinned).
    pub(crate) held: u64,
    /// Bytes held in device memory (the direct path).
    pub(crate) device_held: u64,
    pub(crate) put_waiters: usize,
    /// The largest host tensor put so far (bytes).
    pub(crate) largest_put: u64,
    /// The tensors in memory not written yet ([`Data::Unwritten`]), oldest first, with their
    /// lengths, and the sum of those.
    unwritten: BTreeMap<u64, u64>,
    unwritten_bytes: u64,
    /// The GPU tensors kept in their device memory ([`Data::OnDevice`]), oldest first, with
    /// their GPU and length, and the sum of those per GPU.
    on_device: BTreeMap<u64, (u32, u64)>,
    on_device_bytes: BTreeMap<u32, u64>,
    pub(crate) next_id: u64,
    pub(crate) shutdown: bool,
    pub(crate) stats: OffloadStats,
}

impl State {
    /// An empty state under these budgets and prefetch depth.
    pub(crate) fn new(budget: u64, device_budget: u64, depth: usize) -> State {
        State {
            budget,
            device_budget,
            depth,
            ..Default::default()
        }
    }

    /// Whether `home` counts against the device budget.
    fn on_device(home: Home) -> bool {
        matches!(home, Home::Device(_))
    }

    /// Bytes held against `home`'s budget, and that budget.
    pub(crate) fn room(&self, home: Home) -> (u64, u64) {
        if Self::on_device(home) {
            (self.device_held, self.device_budget)
        } else {
            (self.held, self.budget)
        }
    }

    /// Whether `len` more bytes fit in `home`'s budget now.
    pub(crate) fn fits(&self, home: Home, len: u64) -> bool {
        let (held, budget) = self.room(home);
        held + len <= budget
    }

    /// Adds `bytes` held in `home`'s memory and tracks the peak.
    pub(crate) fn hold_in(&mut self, home: Home, bytes: u64) {
        if Self::on_device(home) {
            self.device_held += bytes;
            self.stats.peak_device_held_bytes =
                self.stats.peak_device_held_bytes.max(self.device_held);
        } else {
            self.held += bytes;
            self.stats.peak_held_bytes = self.stats.peak_held_bytes.max(self.held);
        }
    }

    /// Takes `bytes` held in `home`'s memory off the count.
    pub(crate) fn unhold(&mut self, home: Home, bytes: u64) {
        if Self::on_device(home) {
            self.device_held -= bytes;
        } else {
            self.held -= bytes;
        }
    }

    /// Adds `bytes` to the host bytes held and tracks the peak.
    pub(crate) fn hold(&mut self, bytes: u64) {
        self.hold_in(Home::Host, bytes);
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
    /// schedule's next `depth`, as far as the budgets hold them (the schedule's list ends
    /// before the first tensor whose bytes, added to those before it in its memory, would
    /// pass that memory's budget: more could never be held at once; one larger than its
    /// budget is never held, and passed over).
    pub(crate) fn desired(&self, depth: usize) -> Vec<u64> {
        let live = |id: &u64| self.entries.get(id).is_some_and(Self::expected);
        let mut out: Vec<u64> = self.explicit.iter().copied().filter(live).collect();
        let explicit = out.len();
        let (mut host, mut device) = (0u64, 0u64);
        let within_budgets = |e: &Entry| {
            let (sum, budget) = if Self::on_device(e.home) {
                (&mut device, self.device_budget)
            } else {
                (&mut host, self.budget)
            };
            if e.len > budget || matches!(e.data, Data::OnDevice(_)) {
                // Never held (read back on its get), or never read: passed over.
                return true;
            }
            *sum = sum.saturating_add(e.len);
            *sum <= budget
        };
        for id in self
            .schedule
            .next(&self.entries, depth, Self::expected, within_budgets)
        {
            if !out[..explicit].contains(&id) {
                out.push(id);
            }
        }
        out
    }

    /// The next step of a get of `id` (labelled `label`): the bytes taken out of the store
    /// (the schedule's cursor moved to it), a wait for a transfer under way, or a read to
    /// do now. With `trust_foreign` false, memory owned elsewhere is not used.
    pub(crate) fn take_step(&mut self, id: u64, label: &str, trust_foreign: bool) -> Result<Step> {
        loop {
            let e = self
                .entries
                .get_mut(&id)
                .expect("a live handle has an entry");
            if e.discarded {
                return Err(Error::new(
                    ErrorKind::InvalidInput,
                    format!("tensor `{label}` was discarded"),
                ));
            }
            let (home, len) = (e.home, e.len);
            let foreign = |p: &Arc<Payload>| matches!(**p, Payload::Foreign(_));
            let step = match &mut e.data {
                Data::Kept(p) if !trust_foreign && foreign(p) => {
                    e.data = Data::OnDisk;
                    self.unhold(home, len);
                    continue;
                }
                Data::Writing(p) if !trust_foreign && foreign(p) => return Ok(Step::Wait),
                Data::Unwritten(p) if !trust_foreign && foreign(p) => {
                    return Err(Error::new(
                        ErrorKind::Changed,
                        format!(
                            "tensor `{label}` is not written yet: its bytes as put exist only \
                             in its owner's memory, which the owner may have changed"
                        ),
                    ));
                }
                Data::Reading | Data::Staging => return Ok(Step::Wait),
                Data::Failed(f) => return Err(f.error()),
                Data::Queued => {
                    self.cancel_queued(id);
                    continue;
                }
                Data::OnDisk => {
                    let offset = e.extent.expect("tensors on disk have an extent").offset;
                    let layout = e.layout.clone();
                    Step::Read {
                        offset,
                        layout,
                        home,
                    }
                }
                Data::Small(b) => {
                    let b = b.clone();
                    return Ok(Step::Taken(Taken::Shared(b)));
                }
                Data::Writing(b) => Step::Taken(Taken::Shared(b.clone())),
                Data::WritingDevice(src) => Step::Taken(Taken::Source(src.clone())),
                Data::OnDevice(_) => {
                    let Data::OnDevice(src) = std::mem::replace(&mut e.data, Data::OnDisk) else {
                        unreachable!("matched above")
                    };
                    self.never_on_disk(id);
                    Step::Taken(Taken::Source(Arc::new(src)))
                }
                _ => {
                    // Unwritten, kept or read back: the bytes leave the store.
                    let data = std::mem::replace(&mut e.data, Data::OnDisk);
                    self.unhold(home, len);
                    if matches!(data, Data::Unwritten(_)) {
                        self.never_written(id);
                    }
                    Step::Taken(match data {
                        Data::Kept(p) | Data::Unwritten(p) => match Arc::try_unwrap(p) {
                            Ok(p) => Taken::Payload(p),
                            Err(shared) => Taken::Shared(shared),
                        },
                        other => Taken::of_read(other),
                    })
                }
            };
            self.entries.get_mut(&id).expect("live").taken = true;
            self.schedule.taken(id);
            return Ok(step);
        }
    }

    /// Queues reads for the desired tensors on disk while their budget has room for them,
    /// dropping kept tensors expected later (or not at all) to make it; no read starts
    /// while a `put` waits for room. Tensors larger than their budget are never read ahead.
    /// Returns whether a job was queued.
    pub(crate) fn pump(&mut self) -> bool {
        if self.put_waiters > 0 || self.shutdown {
            return false;
        }
        let desired = self.desired(self.depth);
        let mut queued = false;
        for (rank, &id) in desired.iter().enumerate() {
            let e = &self.entries[&id];
            let (home, len) = (e.home, e.len);
            if !matches!(e.data, Data::OnDisk) || len > self.room(home).1 {
                continue;
            }
            if !self.fits(home, len) {
                self.drop_for(home, len, &desired, rank + 1);
                if !self.fits(home, len) {
                    break;
                }
            }
            let e = self.entries.get_mut(&id).expect("desired ids are live");
            let extent = e.extent.expect("tensors on disk have an extent");
            e.data = Data::Queued;
            let layout = e.layout.clone();
            self.hold_in(home, len);
            self.stats.prefetches += 1;
            self.jobs.push_back(Job::Read {
                id,
                offset: extent.offset,
                layout,
                len,
                home,
            });
            queued = true;
        }
        self.explicit
            .retain(|id| self.entries.get(id).is_some_and(Self::expected));
        queued
    }

    /// Drops kept and read-back tensors held against `home`'s budget until `need` more bytes
    /// fit: first those not in `desired` (oldest first), then those of `desired` (nearest
    /// first) from rank `from` on, the farthest first. Desired tensors before rank `from`
    /// stay.
    fn drop_for(&mut self, home: Home, need: u64, desired: &[u64], from: usize) {
        let device = Self::on_device(home);
        let same = |e: &Entry| e.data.droppable() && Self::on_device(e.home) == device;
        let wanted: std::collections::HashSet<u64> = desired.iter().copied().collect();
        let mut order: Vec<u64> = self
            .entries
            .iter()
            .filter(|(id, e)| same(e) && !wanted.contains(id))
            .map(|(&id, _)| id)
            .collect();
        order.extend(
            desired[from.min(desired.len())..]
                .iter()
                .rev()
                .copied()
                .filter(|id| same(&self.entries[id])),
        );
        for id in order {
            if self.fits(home, need) {
                break;
            }
            let e = self.entries.get_mut(&id).expect("listed above");
            e.data = Data::OnDisk;
            let (h, len) = (e.home, e.len);
            self.unhold(h, len);
            self.stats.evictions += 1;
        }
    }

    /// Makes room in `home`'s budget for a `put` of `need` bytes: drops kept and read-back
    /// tensors, the least needed first (see [`State::drop_for`]; a `put` may drop any of
    /// them); where that is not enough, starts the writes of the unwritten tensors the room
    /// needs (host memory: they leave it once written). Returns how many writes it queued.
    pub(crate) fn evict_for(&mut self, home: Home, need: u64) -> usize {
        if self.fits(home, need) {
            return 0;
        }
        let desired = self.desired(self.depth);
        self.drop_for(home, need, &desired, 0);
        if self.fits(home, need) || Self::on_device(home) {
            return 0;
        }
        let (_, budget) = self.room(home);
        self.write_behind(budget.saturating_sub(need))
    }

    /// Starts writing unwritten tensors, oldest first (the ones backward needs last), until
    /// at most `limit` bytes of them remain; returns how many writes it queued.
    pub(crate) fn write_behind(&mut self, limit: u64) -> usize {
        let mut queued = 0;
        while self.unwritten_bytes > limit {
            let (id, len) = self
                .unwritten
                .pop_first()
                .expect("bytes counted are listed");
            self.unwritten_bytes -= len;
            let e = self
                .entries
                .get_mut(&id)
                .expect("unwritten tensors are live");
            let Data::Unwritten(buf) = &e.data else {
                unreachable!("listed as unwritten")
            };
            let buf = buf.clone();
            let offset = e.extent.expect("unwritten tensors have an extent").offset;
            e.data = Data::Writing(buf.clone());
            self.jobs.push_back(Job::Write { id, offset, buf });
            queued += 1;
        }
        queued
    }

    /// Adds `entry` as the tensor `id`, in memory and not written yet (`buf`).
    pub(crate) fn insert_unwritten(&mut self, id: u64, mut entry: Entry, buf: Payload) {
        self.unwritten.insert(id, entry.len);
        self.unwritten_bytes += entry.len;
        entry.data = Data::Unwritten(Arc::new(buf));
        self.entries.insert(id, entry);
    }

    /// The unwritten tensor `id` leaves the store without a write (taken, discarded or
    /// dropped).
    fn never_written(&mut self, id: u64) {
        if let Some(len) = self.unwritten.remove(&id) {
            self.unwritten_bytes -= len;
            self.stats.bytes_never_written += len;
        }
    }

    /// Adds `entry` as the GPU tensor `id` of GPU `gpu`, kept in its own device memory
    /// (`src`) unwritten.
    pub(crate) fn insert_on_device(
        &mut self,
        id: u64,
        gpu: u32,
        mut entry: Entry,
        src: DeviceSource,
    ) {
        let len = entry.len;
        self.on_device.insert(id, (gpu, len));
        let sum = self.on_device_bytes.entry(gpu).or_default();
        *sum += len;
        entry.data = Data::OnDevice(src);
        self.entries.insert(id, entry);
    }

    /// The GPU tensors of GPU `gpu` kept in device memory beyond `limit` bytes, oldest
    /// first (the ones backward needs last), taken out to be copied out and written
    /// (`OffloadStore::send_device`); each is [`Data::Staging`] meanwhile, so a get of it
    /// waits. `None` for `gpu`: every GPU's, down to `limit` each. Tracks the peak of the
    /// bytes kept (after this: a put's own tensor joins before the oldest leave).
    pub(crate) fn device_overflow(
        &mut self,
        gpu: Option<u32>,
        limit: u64,
    ) -> Vec<(u64, DeviceSource)> {
        let mut out = Vec::new();
        let over: Vec<u64> = self
            .on_device
            .iter()
            .filter(|(_, (g, _))| gpu.is_none_or(|want| *g == want))
            .map(|(&id, _)| id)
            .collect();
        for id in over {
            let (g, _) = self.on_device[&id];
            if self.on_device_bytes.get(&g).copied().unwrap_or(0) <= limit {
                continue;
            }
            self.leave_device(id);
            let e = self.entries.get_mut(&id).expect("kept tensors are live");
            let Data::OnDevice(src) = std::mem::replace(&mut e.data, Data::Staging) else {
                unreachable!("listed as kept on its device")
            };
            out.push((id, src));
        }
        let total = self.device_unwritten_bytes();
        self.stats.peak_device_unwritten_bytes = self.stats.peak_device_unwritten_bytes.max(total);
        out
    }

    /// Takes `id` off the list of GPU tensors kept in device memory; its bytes there.
    fn leave_device(&mut self, id: u64) -> u64 {
        let Some((gpu, len)) = self.on_device.remove(&id) else {
            return 0;
        };
        if let Some(sum) = self.on_device_bytes.get_mut(&gpu) {
            *sum -= len;
        }
        len
    }

    /// The GPU tensor `id`, kept in device memory, leaves the store without a write (taken,
    /// discarded or dropped).
    fn never_on_disk(&mut self, id: u64) {
        self.stats.bytes_never_written += self.leave_device(id);
    }

    /// Bytes of GPU tensors kept in device memory now, all GPUs together.
    pub(crate) fn device_unwritten_bytes(&self) -> u64 {
        self.on_device_bytes.values().sum()
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

    /// Whether `data` is a transfer under way whose end frees the entry of a dropped handle.
    fn in_transfer(data: &Data) -> bool {
        matches!(
            data,
            Data::Writing(_) | Data::Reading | Data::Staging | Data::WritingDevice(_)
        )
    }

    /// The handle of `id` was dropped.
    pub(crate) fn release(&mut self, id: u64) {
        let Some(e) = self.entries.get_mut(&id) else {
            return;
        };
        if Self::in_transfer(&e.data) {
            e.dropped = true;
            return;
        }
        let (home, len) = (e.home, e.len);
        match &e.data {
            Data::Queued => {
                self.jobs.retain(|j| j.id() != id);
                self.unhold(home, len);
            }
            Data::Small(_) => self.stats.small_bytes -= len,
            Data::OnDisk | Data::Failed(_) => {}
            Data::Unwritten(_) => {
                self.unhold(home, len);
                self.never_written(id);
            }
            Data::OnDevice(_) => self.never_on_disk(id),
            _ => self.unhold(home, len), // kept or read back
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
        if matches!(e.data, Data::OnDevice(_)) {
            // Given back to its owner unwritten: the lent memory is released now.
            e.data = Data::OnDisk;
            self.never_on_disk(id);
        } else if e.data.droppable() || matches!(e.data, Data::Unwritten(_)) {
            // No get is answered after a discard: what was never written is never read.
            let unwritten = matches!(e.data, Data::Unwritten(_));
            e.data = Data::OnDisk;
            let (home, len) = (e.home, e.len);
            self.unhold(home, len);
            if unwritten {
                self.never_written(id);
            }
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
        let (home, len) = (e.home, e.len);
        self.unhold(home, len);
    }

    /// Records the end of a write: the tensor stays in memory (kept) unless its handle was
    /// dropped, its bytes were taken or discarded meanwhile. `buf` is what was written from
    /// (`None` for device memory, which the direct path never keeps).
    pub(crate) fn write_done(
        &mut self,
        id: u64,
        buf: Option<Arc<Payload>>,
        result: fastensor_core::Result<Written>,
    ) {
        let written = match result {
            Ok(w) => w,
            Err(err) => return self.fail(id, &err, "background write"),
        };
        let e = self
            .entries
            .get_mut(&id)
            .expect("written tensors stay until done");
        self.stats.bytes_written += e.len;
        self.stats.file_bytes_written += written.file_bytes;
        e.layout = written.layout.map(Arc::new);
        let (home, len) = (e.home, e.len);
        if e.dropped {
            self.unhold(home, len);
            self.remove(id);
            return;
        }
        match buf {
            Some(buf) if !e.taken && !e.discarded => e.data = Data::Kept(buf),
            _ => {
                e.data = Data::OnDisk;
                self.unhold(home, len);
            }
        }
    }

    /// Records the end of a read; whether its handle is still alive (the room of a dropped
    /// tensor starts no further read).
    pub(crate) fn read_done(
        &mut self,
        id: u64,
        result: fastensor_core::Result<(Data, u64)>,
    ) -> bool {
        let data = match result {
            Ok((data, file_bytes)) => {
                self.stats.file_bytes_read += file_bytes;
                data
            }
            Err(err) => {
                self.fail(id, &err, "background read");
                return true;
            }
        };
        let e = self
            .entries
            .get_mut(&id)
            .expect("read tensors stay until done");
        self.stats.bytes_read += e.len;
        let (home, len) = (e.home, e.len);
        if e.dropped {
            self.unhold(home, len);
            self.remove(id);
            false
        } else if e.discarded {
            // Read before the caller discarded it: not needed any more.
            e.data = Data::OnDisk;
            self.unhold(home, len);
            true
        } else {
            e.data = data;
            true
        }
    }

    /// Records a background transfer of `id` that failed during `what`: the entry keeps
    /// the failure (its `get` raises it), the failure waits to be reported, and the entry's
    /// bytes are no longer held; an entry whose handle was dropped goes.
    fn fail(&mut self, id: u64, err: &fastensor_core::Error, what: &str) {
        let e = &self.entries[&id];
        let (home, len) = (e.home, e.len);
        self.unhold(home, len);
        self.record_failure(id, err, what);
    }

    /// Records a failure of `id` during `what` whose bytes are held no more: the entry keeps
    /// it (its `get` raises it), it waits to be reported by a put, and an entry whose handle
    /// was dropped goes.
    pub(crate) fn record_failure(&mut self, id: u64, err: &fastensor_core::Error, what: &str) {
        let e = self
            .entries
            .get_mut(&id)
            .expect("transferred tensors stay until done");
        let f = Failure::new(err, what, id, &e.label);
        e.data = Data::Failed(f.clone());
        let dropped = e.dropped;
        self.unreported.push_back(f);
        self.stats.errors += 1;
        if dropped {
            self.remove(id);
        }
    }
}
