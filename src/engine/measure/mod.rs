//! Learning from transfers: one [`Measurer`] per engine owns the clock, the CPU accounting,
//! the page-cache probes, the bookkeeping of streams, re-reads and write runs, the usage
//! counters, and the selector those measurements teach.
//!
//! The data path calls it at two points around each transfer:
//!
//! * [`Measurer::before`] (before the backend is picked) gives the transfer's [`Ticket`]: its
//!   context (page-cache state, the stream's previous path, requests in flight, purpose),
//!   which the pick asks the selector about, and counts the request in flight for as long as
//!   the ticket lives. [`Measurer::start`] then starts the clock once the backend is picked
//!   and its handle open (whether the CPU clock is read depends on the pick).
//! * [`Measurer::after`] (right after the backend's call, failed or not) stops the clock and
//!   does all the accounting: usage, re-read counts, runs of stream reads and of writes, and
//!   what the selector is told.
//!
//! What a transfer's context and cost are:
//!
//! * A read's context includes the page-cache state of its bytes, asked without reading
//!   anything (`cachestat`, else `mincore`, see `probe.rs`). A read that continues a stream
//!   (it starts where the last one ended) carries the state probed at the stream's first
//!   read, and stream reads are measured in runs (their mean cost): runs through a path that
//!   reads ahead, from the device, span the device's readahead window and are recorded in
//!   pairs; other runs end after 8 reads or 4 MiB. A path that takes a stream over, and an
//!   exploring one, is measured only once warmed up there; its warm-up reads, like a
//!   backend's first transfer on a file of [`LARGE`] bytes or more (not from the page
//!   cache), are offered only to rule a path far behind out (see `stream.rs`).
//! * The writes the selector chose are recorded in runs of up to 8 writes or 512 KiB; an
//!   exploration's writes through a path that bypasses the page cache one by one (see
//!   `write_run.rs`).
//! * The bytes read again (through the same open file) give the workload's re-read rate,
//!   which the selector weighs cold reads with (see `reread.rs` and
//!   [`Reuse`](fastensor_select::Reuse)).
//! * Writes with a durable purpose
//!   ([`Purpose::durable_writes`](fastensor_core::Purpose::durable_writes)) are timed until
//!   their bytes have reached the device (the data path writes them back inside the timing).
//! * Wall time is read for every transfer; the process CPU clock only while exploring, when
//!   the objective weighs CPU, and on one exploiting transfer in [`CPU_SAMPLE_EVERY`]; the
//!   others carry the candidate's last measured CPU cost per byte.
//! * The selector's [`Epochs`](fastensor_select::Epochs) are published without its lock, so that files can reuse
//!   their kept answers while those stand (see `decisions.rs`).

mod account;
mod learn;
mod probe;
mod reread;
mod stream;
mod usage;
mod write_run;

pub use probe::{evict, SystemClock};
pub(crate) use usage::{Count, Usage};

use super::Candidate;
use fastensor_core::{CacheState, Direction, FileLocation, MemoryKind, Purpose, TransferContext};
use fastensor_core::{Clock, ClockReading};
use fastensor_select::{Dictionary, Selector, SelectorConfig};
use fastensor_sys::fork::ForkMutex;
use reread::FileReads;
use std::collections::BTreeMap;
use std::fs::File;
use std::ops::Range;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, MutexGuard};
use std::time::Duration;
use stream::ReadStream;
use usage::{Counters, InFlight};
use write_run::WriteRun;

/// A transfer of this many bytes or more is large: its own time dwarfs the fixed costs of
/// one transfer (a reading of the CPU clock, a page-cache probe, a handle's set-up, one
/// readahead wait). An exploring read continuing a stream reads the CPU clock when it is
/// large, else one in [`CPU_SAMPLE_EVERY`]; an exploring first transfer through a backend
/// that is large (and not from the page cache) is offered as a warm-up read (see
/// `account.rs`); a stream re-probes the page cache every `LARGE` bytes; and a warm-up run
/// of small reads is judged without its slowest (see `Run::far_test_wall`).
pub(crate) const LARGE: u64 = 1 << 20;

/// One exploiting transfer in this many reads the process CPU clock.
pub(crate) const CPU_SAMPLE_EVERY: u64 = 16;

/// The readahead window assumed where the device's cannot be read (no sysfs, no backing
/// device): the largest `read_ahead_kb` commonly set (some virtual disks'). A run longer than
/// the true window only measures less often; a shorter one would miss its waits.
const FALLBACK_WINDOW: u64 = 8 << 20;

/// What an engine learns from its transfers, and the selector it teaches (see the module).
/// Its locks are fork-safe ([`fastensor_sys::fork`]): in a child made by `fork`, one that a
/// thread of the parent held at the fork starts again from the value the engine was built
/// with (the selector's dictionary as built, no device windows).
pub(crate) struct Measurer {
    selector: ForkMutex<Selector>,
    /// The selector's [`Epochs`](fastensor_select::Epochs) as last seen (`state`, `choices`), readable without its
    /// lock.
    epochs: [AtomicU64; 2],
    /// Event counters, the requests in flight among them (see [`Count`]).
    counters: Counters,
    /// Use per candidate (same order as the engine's candidates).
    usage: Vec<Usage>,
    /// The readahead window of each device seen (`major:minor` -> bytes), read from sysfs
    /// once per device rather than at every file open.
    windows: ForkMutex<BTreeMap<String, u64>>,
    /// The selector's settings and dictionary as built (what a child restarts from).
    built: (SelectorConfig, Dictionary),
    /// Each candidate's name and whether it keeps the page cache (same order).
    paths: Vec<(String, bool)>,
    clock: Arc<dyn Clock>,
    /// Whether reads probe the page cache (else every read context is `Unknown`).
    detect_cache: bool,
    /// Whether the objective weighs CPU time (then every transfer reads the CPU clock).
    objective_uses_cpu: bool,
}

/// What the measurer asks of the file a transfer goes to.
pub(crate) trait MeasuredFile {
    /// The file's measurement state.
    fn state(&self) -> &ForkMutex<FileState>;
    /// The file system and device of the file.
    fn location(&self) -> &Arc<FileLocation>;
    /// The purpose its transfers carry.
    fn purpose(&self) -> Purpose;
    /// A read-only descriptor of the file for page-cache probes (`None`: none could be
    /// opened).
    fn probe_file(&self) -> Option<&File>;
}

/// What the measurer keeps per file: its read stream, the bytes it read, its run of writes,
/// and which candidates it used.
#[derive(Debug)]
pub(crate) struct FileState {
    stream: ReadStream,
    reads: FileReads,
    writes: WriteRun,
    /// Bit `i`: a transfer went through the engine's candidate `i` (the first one through a
    /// handle pays its set-up: a mapping's first page faults, a ring's registration).
    used: u64,
}

impl FileState {
    fn new(window: u64) -> FileState {
        FileState {
            stream: ReadStream::new(window),
            reads: FileReads::default(),
            writes: WriteRun::default(),
            used: 0,
        }
    }

    /// Whether this is the first transfer through the engine's candidate `index` on this
    /// file (noting that it happened). That transfer pays its handle's one-off set-up,
    /// whenever the handle was opened. Candidates past the 64th are never taken for first.
    fn first_use(&mut self, index: usize) -> bool {
        let Some(bit) = u32::try_from(index).ok().and_then(|i| 1u64.checked_shl(i)) else {
            return false;
        };
        let first = self.used & bit == 0;
        self.used |= bit;
        first
    }
}

/// What is about to move: its direction, size (the largest request of a batch or job),
/// memory, and shape.
pub(crate) struct What {
    pub(crate) direction: Direction,
    pub(crate) bytes: u64,
    pub(crate) memory: MemoryKind,
    pub(crate) shape: Shape,
}

/// How a transfer is made up, which decides its context and how it is accounted for.
#[derive(Debug)]
pub(crate) enum Shape {
    /// One read or write at `offset`: a read continues the file's stream or starts one;
    /// measured alone or in a run.
    Single { offset: u64 },
    /// A batch of `requests`, its first request at `first` (probed for a read); each piece
    /// measured whole, the CPU clock always read.
    Batch { requests: usize, first: Range<u64> },
    /// A job of reads, `in_flight` at once (`at_once` of them counted in its measurement),
    /// `probe` the range its page-cache state is asked for; measured whole, wall time only,
    /// requests not counted in flight.
    Job {
        in_flight: u32,
        at_once: u32,
        probe: Range<u64>,
    },
}

/// A transfer between [`Measurer::before`] and [`Measurer::after`]: its context, the stream
/// path it continues, its clock reading, and its count among the requests in flight.
pub(crate) struct Ticket<'m> {
    ctx: TransferContext,
    stay: Option<usize>,
    shape: Shape,
    started: Option<Started>,
    _in_flight: Option<InFlight<'m>>,
}

/// The path a ticket's transfer went through, and when it started.
struct Started {
    path: usize,
    exploring: bool,
    at: Start,
}

/// A clock reading at a transfer's start: wall time alone, or wall and CPU time.
enum Start {
    Wall(Duration),
    Both(ClockReading),
}

impl Ticket<'_> {
    /// The transfer's context.
    pub(crate) fn ctx(&self) -> &TransferContext {
        &self.ctx
    }

    /// For a read that continues a stream, the candidate of the stream's last read.
    pub(crate) fn stay(&self) -> Option<usize> {
        self.stay
    }
}

impl Measurer {
    /// The measurer of an engine with `candidates`, teaching `selector` (built with
    /// `config`), timing with `clock`; `detect_cache`: whether reads probe the page cache.
    pub(crate) fn new(
        mut selector: Selector,
        config: SelectorConfig,
        candidates: &[Candidate],
        clock: Arc<dyn Clock>,
        detect_cache: bool,
    ) -> Measurer {
        let paths: Vec<(String, bool)> = candidates
            .iter()
            .map(|c| (c.name().to_string(), c.caps.reads_through_page_cache()))
            .collect();
        selector.reuse_mut().set_keeping(keeping(&paths));
        Measurer {
            objective_uses_cpu: selector.objective_uses_cpu(),
            built: (config, selector.dictionary()),
            selector: ForkMutex::new(selector),
            epochs: Default::default(),
            counters: Counters::default(),
            usage: candidates.iter().map(|_| Usage::default()).collect(),
            windows: ForkMutex::default(),
            paths,
            clock,
            detect_cache,
        }
    }

    /// The measurement state of a new file at `location`.
    pub(crate) fn file_state(&self, location: &FileLocation) -> FileState {
        FileState::new(self.read_ahead_window(&location.device))
    }

    /// The ticket of a transfer about to run on `file`: its context (and, for a read that
    /// continues a stream, the stream's last path), counted in flight while it lives.
    pub(crate) fn before(&self, file: &impl MeasuredFile, what: What) -> Ticket<'_> {
        let What {
            direction,
            bytes,
            memory,
            shape,
        } = what;
        let read = direction == Direction::Read;
        let (guard, in_flight, (cache, stay)) = match &shape {
            Shape::Single { offset } => {
                let (guard, n) = InFlight::enter(&self.counters);
                let state = if read {
                    self.stream_state(file, *offset, bytes as usize)
                } else {
                    (CacheState::Unknown, None)
                };
                (Some(guard), n, state)
            }
            Shape::Batch { requests, first } => {
                let cache = if read {
                    self.cache_state(file, first.clone())
                } else {
                    CacheState::Unknown
                };
                let (guard, n) = InFlight::enter(&self.counters);
                let n = n.max(u32::try_from(*requests).unwrap_or(u32::MAX));
                (Some(guard), n, (cache, None))
            }
            Shape::Job {
                in_flight, probe, ..
            } => (
                None,
                *in_flight,
                (self.cache_state(file, probe.clone()), None),
            ),
        };
        let ctx = TransferContext {
            direction,
            bytes,
            memory,
            location: file.location().clone(),
            in_flight,
            purpose: file.purpose(),
            cache,
        };
        Ticket {
            ctx,
            stay,
            shape,
            started: None,
            _in_flight: guard,
        }
    }

    /// Starts the clock of `ticket`'s transfer through the candidate `path` (`exploring`:
    /// an exploration's measurement). A single transfer reads the CPU clock when sampled
    /// (see [`Measurer::reads_cpu`]), a batch always, a job never; a job is counted here.
    pub(crate) fn start(&self, ticket: &mut Ticket<'_>, path: usize, exploring: bool) {
        let clock = &*self.clock;
        let at = match ticket.shape {
            Shape::Single { .. } => {
                // A stream's reads are measured in runs, whose CPU time a share of their
                // small reads gives (see `Run::cpu`).
                let sampled = exploring && (ticket.stay.is_none() || ticket.ctx.bytes >= LARGE);
                if self.reads_cpu(sampled) {
                    Start::Both(clock.now())
                } else {
                    Start::Wall(clock.wall())
                }
            }
            Shape::Batch { .. } => Start::Both(clock.now()),
            Shape::Job { .. } => {
                self.counters.add(Count::Jobs, 1);
                Start::Wall(clock.wall())
            }
        };
        ticket.started = Some(Started {
            path,
            exploring,
            at,
        });
    }

    /// Ends `ticket`'s transfer on `file`: `done` is `(moved, wanted)` bytes when it
    /// succeeded, `None` when it failed (then nothing is accounted; the clock is still read,
    /// as a refused transfer's time passed). Stops the clock and accounts for the transfer
    /// (see `account.rs`).
    pub(crate) fn after(
        &self,
        file: &impl MeasuredFile,
        ticket: &mut Ticket<'_>,
        done: Option<(usize, usize)>,
    ) {
        let Some(started) = ticket.started.take() else {
            debug_assert!(false, "`after` without `start`");
            return;
        };
        if let Shape::Job { .. } = ticket.shape {
            // A job that failed or read nothing measures nothing.
            if !matches!(done, Some((moved, _)) if moved > 0) {
                return;
            }
        }
        let (wall, cpu) = match started.at {
            Start::Both(start) => {
                let (wall, cpu) = self.clock.now().since(start);
                (wall, Some(cpu))
            }
            Start::Wall(start) => (self.clock.wall().saturating_sub(start), None),
        };
        let Some((moved, wanted)) = done else {
            return;
        };
        let timed = account::Timed {
            path: started.path,
            exploring: started.exploring,
            moved,
            wanted,
            wall,
            cpu,
        };
        match ticket.shape {
            Shape::Single { offset } => self.account_single(file, ticket, offset, timed),
            Shape::Batch { .. } => self.account_batch(file, ticket, timed),
            Shape::Job { at_once, .. } => self.account_job(ticket, at_once, timed),
        }
    }

    /// Accounts for a file being closed: the stream reads and the writes measured but not
    /// recorded yet, and the bytes read once (see `FileReads`). `state` is `None` when it
    /// was inherited from a parent whose thread held its lock (nothing to account for).
    pub(crate) fn close(&self, state: Option<&mut FileState>) {
        let Some(state) = state else {
            return;
        };
        self.counters.add_reads(state.reads.finish(), 0);
        let [read, window] = state.stream.take_runs();
        let writes = state.writes.take();
        for run in [read, window, writes].into_iter().flatten() {
            self.record_run(run);
        }
    }

    /// The measurement state of `file`, locked (a fresh one after a fork that caught it
    /// locked).
    fn state<'f>(&self, file: &'f impl MeasuredFile) -> MutexGuard<'f, FileState> {
        file.state().lock_or(|| self.file_state(file.location()))
    }

    /// The page-cache state a read of `range` is keyed by outside streams.
    fn cache_state(&self, file: &impl MeasuredFile, range: Range<u64>) -> CacheState {
        if !self.detect_cache {
            return CacheState::Unknown;
        }
        let len = (range.end - range.start) as usize;
        match file.probe_file() {
            Some(f) => probe::cache_state(f, range.start, len),
            None => CacheState::Unknown,
        }
    }

    /// The page-cache state a single read of `len` bytes at `offset` is keyed by (see
    /// [`ReadStream::begin`]), and for a read that continues the stream the candidate of
    /// the stream's last read.
    fn stream_state(
        &self,
        file: &impl MeasuredFile,
        offset: u64,
        len: usize,
    ) -> (CacheState, Option<usize>) {
        let end = offset + len as u64;
        let mut state = self.state(file);
        let FileState { stream, reads, .. } = &mut *state;
        stream.begin(
            offset,
            len,
            || reads.covers(offset, end),
            || self.cache_state(file, offset..end),
            || reads.covers_through_cache(offset, end),
            |range| {
                if !self.detect_cache {
                    return None;
                }
                probe::cached_range(file.probe_file()?, range)
            },
        )
    }

    /// The readahead window of the device `device` (see [`Measurer::windows`]).
    fn read_ahead_window(&self, device: &str) -> u64 {
        let mut windows = self.windows.lock();
        *windows
            .entry(device.to_string())
            .or_insert_with(|| fastensor_sys::read_ahead_bytes(device).unwrap_or(FALLBACK_WINDOW))
    }

    /// Whether the next transfer reads the process CPU clock: when the objective needs it,
    /// when `sampled` (a transfer measured on its own while exploring), and one other
    /// transfer in [`CPU_SAMPLE_EVERY`].
    fn reads_cpu(&self, sampled: bool) -> bool {
        sampled
            || self.objective_uses_cpu
            || self
                .counters
                .add(Count::Transfers, 1)
                .is_multiple_of(CPU_SAMPLE_EVERY)
    }

    /// Adds one to the counter `c`.
    pub(crate) fn count(&self, c: Count) {
        self.counters.add(c, 1);
    }

    /// The counter `c`.
    pub(crate) fn counted(&self, c: Count) -> u64 {
        self.counters.get(c)
    }

    /// Use per candidate (same order as the engine's candidates).
    pub(crate) fn usage(&self) -> &[Usage] {
        &self.usage
    }

    /// Counts a transfer through the candidate at `index` in its use, with its CPU time
    /// when it was read.
    fn add_usage(&self, index: usize, bytes: u64, wall: Duration, cpu: Option<Duration>) {
        if let Some(u) = self.usage.get(index) {
            u.add(bytes, wall, cpu);
        }
    }
}

/// The names of the paths that keep the page cache.
fn keeping(paths: &[(String, bool)]) -> impl Iterator<Item = String> + '_ {
    paths
        .iter()
        .filter(|(_, keeps)| *keeps)
        .map(|(name, _)| name.clone())
}
