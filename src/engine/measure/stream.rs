//! Sequential read streams: the page-cache state a stream's reads are keyed by, and runs of
//! reads through one path, measured together as one observation.
//!
//! A read that starts where the last one ended continues a stream. It is keyed by the
//! page-cache state probed at the stream's first read (probed again where that may have
//! changed, see [`ReadStream::begin`]), not by the state of its own bytes: a buffered stream
//! from the device is served mostly by the readahead its earlier reads started, and keying
//! each read by its bytes would credit those cheap reads to the cached context. A run
//! through a path that reads ahead, from the device, spans the device's readahead window
//! (so that it holds the window's waits as well as the cheap reads the window serves) and is
//! recorded joined with the run before it (see [`ReadStream::paired`]); other runs end after
//! [`Run::MAX_TRANSFERS`] reads or [`Run::MAX_BYTES`] bytes. Measurement notes:
//! `docs/lab/selection.md`.

use fastensor_core::{CacheState, Direction, TransferContext};
use fastensor_select::KeyShape;
use std::time::Duration;

/// The sequential read stream of a file.
#[derive(Debug, Clone)]
pub(crate) struct ReadStream {
    /// The readahead window of the file's device, in bytes (`read_ahead_kb`).
    window: u64,
    /// Where the last read ended (`u64::MAX` before the first read).
    end: u64,
    /// The page-cache state probed at the stream's first read (or at its last re-probe).
    cache: CacheState,
    /// Where the page cache was last probed (in a cold stream, or last asked whether the
    /// bytes were read before, see [`ReadStream::begin`]).
    probed_at: u64,
    /// Reads ending here or before need not ask whether the bytes beyond the stream's
    /// readahead are cached: they were, further on (see [`ReadStream::begin`]).
    cached_beyond_to: u64,
    /// The backend (index among the engine's candidates) of the stream's last read.
    last_path: usize,
    /// Whether that backend reads through the page cache (and so reads ahead).
    last_keeps_cache: bool,
    /// Bytes the stream has read through `last_path` since that path took it over.
    path_bytes: u64,
    /// Reads of the stream through `last_path` since that path took it over.
    path_reads: u32,
    /// Whether `last_path` took the stream over from another path (rather than starting
    /// it): its reads are then warm-up reads until it has warmed up, chosen or exploring
    /// (see [`ReadStream::warm`]).
    took_over: bool,
    /// The reads measured together so far.
    run: Option<Run>,
    /// The reads of an exploring path while it warms up (see [`Run::warm_up`]).
    warming: Option<Run>,
    /// The last full run spanning a readahead window, as measured (see
    /// [`ReadStream::paired`]).
    last_window: Option<Run>,
    /// Whether `last_window` is a path's first window, held back (not recorded yet).
    window_held: bool,
    /// A first window held back whose pairing ended: recorded alone.
    unpaired: Option<Run>,
}

/// One measured read, handed to [`ReadStream::finish`].
#[derive(Debug)]
pub(crate) struct Measured {
    /// Its context.
    pub(crate) ctx: TransferContext,
    /// Bytes read.
    pub(crate) bytes: u64,
    /// Wall time.
    pub(crate) wall: Duration,
    /// CPU time, when it was read.
    pub(crate) cpu: Option<Duration>,
}

/// Consecutive reads of one stream (or writes, see `write_run.rs`) through one path in one
/// context: one observation.
#[derive(Debug, Clone)]
pub(crate) struct Run {
    /// The context of the run's first read (the others share its key).
    pub(crate) ctx: TransferContext,
    /// The backend (index among the engine's candidates).
    pub(crate) path: usize,
    /// Bytes read.
    pub(crate) bytes: u64,
    /// Wall time of the reads.
    pub(crate) wall: Duration,
    /// CPU time of the reads whose CPU time was read (see [`Run::cpu`]).
    cpu_read: Duration,
    /// Bytes of those reads.
    cpu_bytes: u64,
    /// Reads in the run.
    pub(crate) transfers: u32,
    /// Wall time of the run's slowest read.
    slowest: Duration,
    /// The readahead window the run spans, in bytes (`None`: a run that does not, see
    /// [`Run::full`]).
    window: Option<u64>,
    /// The reads of a path warming up in the stream (see [`ReadStream::warm`]):
    /// not a fair sample of the path (it pays for the switch), but one that shows a path
    /// far behind the leader already, so it is offered to the selector for that alone.
    pub(crate) warm_up: bool,
}

impl Run {
    /// A run ends after this many reads.
    pub(crate) const MAX_TRANSFERS: u32 = 8;

    /// A run ends once it has read this many bytes.
    pub(crate) const MAX_BYTES: u64 = 4 << 20;

    /// A run of writes ends once it has written this many bytes (see `write_run.rs`).
    pub(crate) const MAX_WRITE_BYTES: u64 = 512 << 10;

    /// A run of the one transfer `m` through `path`; `window`: the readahead window of a path
    /// through the page cache (a read from the device through it starts a run spanning the
    /// window).
    pub(crate) fn start(m: Measured, path: usize, window: Option<u64>) -> Run {
        Run {
            window: window.filter(|_| m.ctx.cache != CacheState::Cached),
            ctx: m.ctx,
            path,
            bytes: m.bytes,
            wall: m.wall,
            cpu_read: m.cpu.unwrap_or_default(),
            cpu_bytes: if m.cpu.is_some() { m.bytes } else { 0 },
            transfers: 1,
            slowest: m.wall,
            warm_up: false,
        }
    }

    /// Whether a transfer through `path` in `ctx` belongs to this run.
    pub(crate) fn takes(&self, ctx: &TransferContext, path: usize) -> bool {
        path == self.path
            && self.ctx.purpose == ctx.purpose
            && KeyShape::of(&self.ctx) == KeyShape::of(ctx)
    }

    /// Adds the transfer `m` to the run.
    pub(crate) fn add(&mut self, m: &Measured) {
        self.bytes += m.bytes;
        self.wall += m.wall;
        self.slowest = self.slowest.max(m.wall);
        if let Some(cpu) = m.cpu {
            self.cpu_read += cpu;
            self.cpu_bytes += m.bytes;
        }
        self.transfers += 1;
    }

    /// The wall time a warm-up run is judged by when it is offered to rule its path out
    /// (see `Selector::record_if_far`): its own, but for small reads (under
    /// [`LARGE`](super::LARGE) each) through a path that keeps the page cache, that
    /// of its other reads scaled to the whole run (`None` for a single such read). Such a
    /// path waits for its readahead now and then, and one wait decides a short run's mean;
    /// a path slow on every read is still ruled out.
    pub(crate) fn far_test_wall(&self, keeps_cache: bool) -> Option<Duration> {
        let small = self.bytes < u64::from(self.transfers) * super::LARGE;
        if !(keeps_cache && small && self.ctx.direction == Direction::Read) {
            return Some(self.wall);
        }
        let others = self.transfers.checked_sub(1).filter(|&n| n > 0)?;
        let rest = self.wall.saturating_sub(self.slowest);
        Some(rest.mul_f64(f64::from(self.transfers) / f64::from(others)))
    }

    /// CPU time of the run: that of the reads whose CPU time was read, scaled to all the
    /// run's bytes (a stream's reads read the CPU clock one in several, see
    /// `Measurer::reads_cpu`); `None` when none was read.
    pub(crate) fn cpu(&self) -> Option<Duration> {
        (self.cpu_bytes > 0).then(|| {
            self.cpu_read
                .mul_f64(self.bytes as f64 / self.cpu_bytes as f64)
        })
    }

    /// This run and `earlier` (the run before it) as one.
    fn joined(&self, earlier: &Run) -> Run {
        Run {
            bytes: self.bytes + earlier.bytes,
            wall: self.wall + earlier.wall,
            cpu_read: self.cpu_read + earlier.cpu_read,
            cpu_bytes: self.cpu_bytes + earlier.cpu_bytes,
            transfers: self.transfers.saturating_add(earlier.transfers),
            slowest: self.slowest.max(earlier.slowest),
            ..self.clone()
        }
    }

    /// Whether the run has all the transfers it takes: a run spanning a readahead window
    /// once it has read the window (or as many reads as the window has pages), others
    /// after [`Run::MAX_TRANSFERS`] transfers or [`Run::MAX_BYTES`] bytes
    /// ([`Run::MAX_WRITE_BYTES`] for writes).
    pub(crate) fn full(&self) -> bool {
        let (transfers, bytes) = match self.window {
            _ if self.ctx.direction == Direction::Write => {
                (Self::MAX_TRANSFERS, Self::MAX_WRITE_BYTES)
            }
            Some(window) => {
                let pages = window / fastensor_sys::page_size();
                (u32::try_from(pages).unwrap_or(u32::MAX).max(1), window)
            }
            None => (Self::MAX_TRANSFERS, Self::MAX_BYTES),
        };
        self.transfers >= transfers || self.bytes >= bytes
    }
}

impl ReadStream {
    /// Reads of at least this many bytes in a `Cached` stream are each probed again (a probe
    /// costs about half a microsecond, a few percent of such a read from the cache); smaller
    /// ones every [`LARGE`](super::LARGE) bytes.
    pub(crate) const REPROBE_EACH: u64 = 64 << 10;

    /// No stream yet, in a file on a device whose readahead window is `window` bytes.
    pub(crate) const fn new(window: u64) -> ReadStream {
        ReadStream {
            window,
            end: u64::MAX,
            cache: CacheState::Unknown,
            probed_at: 0,
            cached_beyond_to: 0,
            last_path: usize::MAX,
            last_keeps_cache: false,
            path_bytes: 0,
            path_reads: 0,
            took_over: false,
            run: None,
            warming: None,
            last_window: None,
            window_held: false,
            unpaired: None,
        }
    }

    /// A path that takes over a stream (or starts one, exploring) is measured only after this
    /// many reads there, and for a path through the page cache only after a readahead window
    /// of bytes or [`Self::WARM_UP_MAX_READS`] reads (see [`ReadStream::warm`]).
    pub(crate) const WARM_UP_READS: u32 = 2;

    /// See [`Self::WARM_UP_READS`]: what warming a slow path up costs at small sizes.
    pub(crate) const WARM_UP_MAX_READS: u32 = 32;

    /// The page-cache state a read of `len` bytes at `offset` is keyed by, asking `probe`
    /// only where needed: at a stream's first read; in a stream that started cached, at
    /// every read of [`Self::REPROBE_EACH`] or more and every [`LARGE`](super::LARGE)
    /// bytes otherwise (it turns cold where the cached bytes end); and in a cold stream,
    /// every `LARGE` bytes of bytes read before (`reread`), so that a second pass turns
    /// cached where an earlier pass left the bytes cached. Where the stream's last read went
    /// through the page cache, bytes found cached count as cached only where they were read
    /// before through it (`read_through_cache`) or where `cached_beyond` finds bytes cached
    /// beyond the stream's own readahead (asked about [`Self::beyond_readahead`], at most
    /// once per range; `None`: cannot tell, the stream stays as it was). Also returns, for a
    /// read that continues the stream, the backend of the stream's last read.
    pub(crate) fn begin(
        &mut self,
        offset: u64,
        len: usize,
        reread: impl FnOnce() -> bool,
        probe: impl FnOnce() -> CacheState,
        read_through_cache: impl FnOnce() -> bool,
        cached_beyond: impl FnOnce(std::ops::Range<u64>) -> Option<bool>,
    ) -> (CacheState, Option<usize>) {
        let continues = self.end == offset;
        if !continues {
            self.end_pairing();
            self.cached_beyond_to = 0;
        }
        let previous = continues.then_some(self.last_path);
        if continues {
            let far = offset.saturating_sub(self.probed_at) >= super::LARGE;
            let due = match self.cache {
                CacheState::Cached => len as u64 >= Self::REPROBE_EACH || far,
                CacheState::Cold if far => {
                    // Asked once per `LARGE` bytes, not at every read of a first pass.
                    let again = reread();
                    if !again {
                        self.probed_at = offset;
                    }
                    again
                }
                _ => false,
            };
            if !due {
                return (self.cache, previous);
            }
        }
        let before = self.cache;
        self.cache = probe();
        self.probed_at = offset;
        let end = offset.saturating_add(len as u64);
        if continues
            && self.last_keeps_cache
            && self.cache == CacheState::Cached
            && end > self.cached_beyond_to
            && !read_through_cache()
        {
            let beyond = self.beyond_readahead(offset, len);
            match cached_beyond(beyond.clone()) {
                Some(true) => self.cached_beyond_to = beyond.end,
                Some(false) => self.cache = CacheState::Cold,
                // Cannot tell: the stream stays as it was.
                None => self.cache = before,
            }
        }
        (self.cache, previous)
    }

    /// The bytes asked about to tell whether the bytes of a read of `len` at `offset` are
    /// cached for a reason other than the stream's own readahead: 1 MiB (or `len`, if less)
    /// beyond what readahead can have reached, that is two readahead windows (the kernel
    /// reads one window ahead while the stream reads the one before) or one read's length
    /// (`mmap` asks for the next read's range) past the read's end, whichever is further.
    pub(crate) fn beyond_readahead(&self, offset: u64, len: usize) -> std::ops::Range<u64> {
        let len = len as u64;
        let start = offset
            .saturating_add(len)
            .saturating_add((2 * self.window).max(len));
        start..start.saturating_add(len.clamp(1, 1 << 20))
    }

    /// Notes that a read through `path` covered `range` (`continued`: it continued the
    /// stream; `exploring`: it was an exploration's measurement; `keeps_cache`: the path
    /// reads through the page cache), measured as `measured` (`None` when it measured
    /// nothing useful). A read is not kept while its path warms up in the stream
    /// (see [`ReadStream::warm`]), but gathered into warm-up runs, returned every 8 reads
    /// or 4 MiB and when the warm-up ends (see [`Run::warm_up`]). Returns the runs that
    /// ended, to be recorded.
    pub(crate) fn finish(
        &mut self,
        continued: bool,
        range: std::ops::Range<u64>,
        path: usize,
        keeps_cache: bool,
        exploring: bool,
        measured: Option<Measured>,
    ) -> [Option<Run>; 5] {
        let [a, b, c, d] = 'runs: {
            let read = range.end - range.start;
            let same = continued && path == self.last_path;
            // Whether `path` took the stream over from another path (rather than starting it).
            let took_over = if same { self.took_over } else { continued };
            let warming = continued && (exploring || took_over) && !self.warm(path, keeps_cache);
            self.last_keeps_cache = keeps_cache;
            self.took_over = took_over;
            if same {
                self.path_bytes += read;
                self.path_reads = self.path_reads.saturating_add(1);
            } else {
                self.path_bytes = read;
                self.path_reads = 1;
            }
            self.end = range.end;
            self.last_path = path;
            // A warm-up run ends with the first read that is not part of it, or once it holds 8
            // reads or 4 MiB (so that a path far behind is ruled out early).
            let warmed = self.warming.take_if(|w| !warming || w.path != path);
            if warming {
                if let Some(m) = measured {
                    match self.warming.as_mut() {
                        Some(w) if w.takes(&m.ctx, path) => w.add(&m),
                        _ => {
                            let mut w = Run::start(m, path, None);
                            w.warm_up = true;
                            self.warming = Some(w);
                        }
                    }
                }
                let full = self.warming.take_if(|w| w.full());
                break 'runs [self.run.take(), None, warmed, full];
            }
            let Some(m) = measured else {
                break 'runs [self.run.take(), None, warmed, None];
            };
            if let Some(run) = self.run.as_mut() {
                if continued && run.takes(&m.ctx, path) {
                    run.add(&m);
                    let ended = self.run.take_if(|r| r.full());
                    break 'runs [ended, None, warmed, None];
                }
            }
            let ended = self.run.take();
            let run = Run::start(m, path, keeps_cache.then_some(self.window));
            if run.full() {
                [ended, Some(run), warmed, None]
            } else {
                self.run = Some(run);
                [ended, None, warmed, None]
            }
        };
        let mut ended = [a, b, c, d, None];
        for slot in ended.iter_mut() {
            if let Some(run) = slot.take_if(|r| !r.warm_up) {
                *slot = self.paired(run);
            }
        }
        ended[4] = self.unpaired.take();
        ended
    }

    /// A run that ended, as it is recorded (`None`: held back): a full run spanning a
    /// readahead window joined with the full one before it in the stream, through the same
    /// path in the same context. Reading from the device through the page cache alternates
    /// between windows that wait for the device and windows already read ahead, so a median
    /// over single windows follows whichever half it lands in; over pairs it measures the
    /// stream. A path's first window is held back until the run after it (recorded alone, a
    /// first window in the fast half can make a slow path an exploration's leader). A run of
    /// the same path and context that is not a full window (the stream's last reads) is
    /// joined with the window before it too, and ends the pairing; any other run ends it
    /// alone.
    fn paired(&mut self, run: Run) -> Option<Run> {
        let window = run.window.is_some() && run.full();
        if !self
            .last_window
            .as_ref()
            .is_some_and(|e| e.takes(&run.ctx, run.path))
        {
            self.end_pairing();
        }
        let earlier = self.last_window.take();
        self.window_held = false;
        if window {
            self.last_window = Some(run.clone());
        }
        match earlier {
            Some(earlier) => Some(run.joined(&earlier)),
            None if window => {
                self.window_held = true;
                None
            }
            None => Some(run),
        }
    }

    /// Ends the pairing of windows (the stream broke, or a run of another path or context
    /// ended): a first window still held back is then recorded alone (a stream of a single
    /// window, say one 8 MiB read, is measured by it).
    fn end_pairing(&mut self) {
        if let Some(window) = self.last_window.take() {
            if self.window_held {
                debug_assert!(self.unpaired.is_none(), "one window is held at a time");
                self.unpaired = Some(window);
            }
        }
        self.window_held = false;
    }

    /// Whether a read through `path` continuing the stream finds `path` warmed up in it
    /// (see [`Self::WARM_UP_READS`]). Until then its cost is the previous path's state (the
    /// pages it left cached or in flight) and its own readahead ramping up to the window,
    /// which the stream pays once per switch, not per read; a chosen path's warm-up is no
    /// more its cost than an exploring one's.
    fn warm(&self, path: usize, keeps_cache: bool) -> bool {
        path == self.last_path
            && self.path_reads >= Self::WARM_UP_READS
            && (!keeps_cache
                || self.path_bytes >= self.window
                || self.path_reads >= Self::WARM_UP_MAX_READS)
    }

    /// The runs not recorded yet (to be recorded when the file is dropped): the run in
    /// progress, and a first window held back.
    pub(crate) fn take_runs(&mut self) -> [Option<Run>; 2] {
        let run = self.run.take().and_then(|r| self.paired(r));
        self.end_pairing();
        [run, self.unpaired.take()]
    }
}

#[cfg(test)]
mod tests;
