//! Sequential read streams: the page-cache state a stream's reads are keyed by, and runs of
//! reads through one path, measured together.
//!
//! A read that starts where the last one ended continues a stream. Its cost depends on the
//! path's own effect on the cache: a buffered stream from the device is served mostly by the
//! readahead its earlier reads started, so most of its reads are cheap and a few wait. Such a
//! stream is learned per path over runs of reads (one observation per run: their mean cost,
//! which is what the stream's total time is made of), under the page-cache state probed at
//! the stream's first read, not per state of each read's bytes (which would credit the cheap,
//! read-ahead reads to the cached context and leave the direct paths' single cold reads
//! looking best). A run through a path that reads ahead, from the device, spans
//! [`Run::READ_AHEAD_BYTES`], so that it holds the waits of a whole readahead window as well
//! as the cheap reads that window serves (a median over shorter runs picks the cheap ones: a
//! mapped 64 KiB stream was measured at 0.97 GB/s over runs of 512 KiB and ran at 0.52),
//! and each such run is recorded joined with the one before it (windows that wait for the
//! device and windows already read ahead come in turn; see [`ReadStream::paired`]); other
//! runs end after [`Run::MAX_TRANSFERS`] reads or [`Run::MAX_BYTES`] bytes.

use fastensor_core::{CacheState, Direction, TransferContext};
use fastensor_select::KeyShape;
use std::time::Duration;

/// The sequential read stream of a file.
#[derive(Debug, Clone)]
pub(crate) struct ReadStream {
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
    /// (see [`ReadStream::WARM_UP_BYTES`]).
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
    /// Whether the run spans a readahead window (see [`Run::READ_AHEAD_BYTES`]).
    long: bool,
    /// The reads of a path warming up in the stream (see [`ReadStream::WARM_UP_BYTES`]):
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

    /// A run of reads from the device through a path that keeps the page cache (and so reads
    /// ahead) ends once it has read this many bytes (the largest `read_ahead_kb` commonly
    /// set, that of some virtual disks; the default is 128 KiB), or after
    /// [`Run::READ_AHEAD_MAX_TRANSFERS`] reads.
    pub(crate) const READ_AHEAD_BYTES: u64 = 8 << 20;

    /// See [`Run::READ_AHEAD_BYTES`].
    pub(crate) const READ_AHEAD_MAX_TRANSFERS: u32 = 2048;

    /// A run of the one transfer `m` through `path` (`keeps_cache`: a path through the page
    /// cache).
    pub(crate) fn start(m: Measured, path: usize, keeps_cache: bool) -> Run {
        Run {
            long: keeps_cache && m.ctx.cache != CacheState::Cached,
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
    /// (see `Selector::record_if_far`): its own, but for a run of reads under
    /// [`Run::ONE_WAIT_BELOW`] each through a path that keeps the page cache, that of
    /// its other reads scaled to the whole run (`None` for a single such read). A read
    /// from the device through the page cache waits for its readahead now and then
    /// (cold streams through `posix` were traced waiting 5-8 ms once every 8-16 MiB);
    /// the small reads between are cheap, so a short run's mean is decided by whether
    /// one of its reads waited: 8 reads of 64 KiB with one such wait average over 0.6
    /// ms, where the path streams at about 0.11 ms a read (the fixed `posix`'s cold 64
    /// KiB phase: 456 ms for 4096 reads) and a direct read costs 0.08-0.1 ms. Judged by
    /// their mean, warm-up runs (at 64 KiB the only measurements that can rule a path
    /// out early) dropped `posix` and `mmap` from cold 64 KiB contexts on this machine
    /// at 0.005-0.1 GB/s (the leaders at 0.5-0.9 GB/s: too far behind for any later
    /// look; costs that fit one long wait in a run of 8 reads or in a single read; the
    /// runs were not traced one by one), and a warm engine starting from those contexts
    /// re-read its 64 KiB phase from the device in one to three rounds of six (337-385
    /// ms against 26-39 from the cache). A path slow on every read is still ruled out
    /// by such a run.
    pub(crate) fn far_test_wall(&self, keeps_cache: bool) -> Option<Duration> {
        let small = self.bytes < u64::from(self.transfers) * Self::ONE_WAIT_BELOW;
        if !(keeps_cache && small && self.ctx.direction == Direction::Read) {
            return Some(self.wall);
        }
        let others = self.transfers.checked_sub(1).filter(|&n| n > 0)?;
        let rest = self.wall.saturating_sub(self.slowest);
        Some(rest.mul_f64(f64::from(self.transfers) / f64::from(others)))
    }

    /// See [`Run::far_test_wall`].
    pub(crate) const ONE_WAIT_BELOW: u64 = 1 << 20;

    /// CPU time of the run: that of the reads whose CPU time was read, scaled to all the
    /// run's bytes (a stream's reads read the CPU clock one in several, see
    /// `Inner::reads_cpu`); `None` when none was read.
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

    /// Whether the run has all the transfers it takes.
    pub(crate) fn full(&self) -> bool {
        if self.ctx.direction == Direction::Write {
            self.transfers >= Self::MAX_TRANSFERS || self.bytes >= Self::MAX_WRITE_BYTES
        } else if self.long {
            self.transfers >= Self::READ_AHEAD_MAX_TRANSFERS || self.bytes >= Self::READ_AHEAD_BYTES
        } else {
            self.transfers >= Self::MAX_TRANSFERS || self.bytes >= Self::MAX_BYTES
        }
    }
}

impl ReadStream {
    /// A stream that started `Cached` is probed again after this many bytes, so that it
    /// notices when it runs into bytes that are not cached; a `Cold` one reading bytes read
    /// before, so that it notices bytes an earlier pass left cached (see
    /// [`ReadStream::begin`]).
    pub(crate) const REPROBE_BYTES: u64 = 1 << 20;

    /// Reads of at least this many bytes in a `Cached` stream are each probed (a probe
    /// costs about half a microsecond, a few percent of such a read from the cache).
    pub(crate) const REPROBE_EACH: u64 = 64 << 10;

    /// No stream yet.
    pub(crate) const NONE: ReadStream = ReadStream {
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
    };

    /// A path that takes over a stream, exploring or chosen (and an exploring path that
    /// starts one), is measured only after
    /// [`Self::WARM_UP_READS`] reads there and, for a path that keeps the page cache,
    /// either this many bytes or [`Self::WARM_UP_MAX_READS`] reads: until then its cost is
    /// the previous path's state (the pages it left cached, or none read ahead for this one)
    /// and its own readahead ramping up (the kernel doubles the window per read up to the
    /// device's `read_ahead_kb`, 8 MiB on some virtual disks), which the stream pays once
    /// per switch, not per read. The read count bounds what warming a slow path up costs at
    /// small sizes (a direct 4 KiB read costs 50 µs where a cached one costs 2). A path that
    /// bypasses the page cache reads nothing ahead: its first reads only wait behind what
    /// the previous path left in flight (a stream of mixed sizes, its small reads through
    /// the page cache: 1 MiB direct reads measured so at 0.17-0.48 GB/s there, 2.8-3.2 in a
    /// stream of 1 MiB reads, and the mixed stream's samples then chose the 1 MiB stream's
    /// path). A chosen path's warm-up is no more its cost than an
    /// exploring one's: taken as samples, the two 15-18 ms reads that `posix` took to warm
    /// up in a cold 8 MiB stream, where it ran at 3.3 ms a read, made the choice give way
    /// to `mmap` after two reads, which then paid its own warm-up, and so on (about 90 ms
    /// of a 445 ms phase in a traced round).
    pub(crate) const WARM_UP_BYTES: u64 = 8 << 20;

    /// See [`Self::WARM_UP_BYTES`].
    pub(crate) const WARM_UP_READS: u32 = 2;

    /// See [`Self::WARM_UP_BYTES`].
    pub(crate) const WARM_UP_MAX_READS: u32 = 32;

    /// The page-cache state a read of `len` bytes at `offset` is keyed by, asking `probe`
    /// only where needed: at a stream's first read; in a stream that started cached, at
    /// every read of [`Self::REPROBE_EACH`] or more and every [`Self::REPROBE_BYTES`]
    /// otherwise (it turns cold where the cached bytes end); and in a cold stream, every
    /// [`Self::REPROBE_BYTES`] of bytes read before (`reread` tells whether the read's
    /// bytes all were): a second pass over a file whose first pass began through a direct
    /// path (as a cold-read exploration does) turns cached where that pass went through the
    /// page cache. Without it, the whole second pass stayed keyed by its first read's
    /// state: its cached reads went to the direct paths, and the paths that did read the
    /// cache were credited with cold reads at cache speed (a cold 1 MiB context chose
    /// `mmap` on such samples). A stream whose last read went through the page cache caches
    /// the bytes ahead of it by its own readahead, so there bytes found cached count as
    /// cached only where they were read before through the page cache
    /// (`read_through_cache`), or, for bytes cached some other way (written, or read by
    /// another process), where `cached_beyond` (asked about [`Self::beyond_readahead`], at
    /// most once per that range) finds bytes cached beyond the readahead's reach too; where
    /// it finds them not cached the read is cold, and where it cannot tell (past the end of
    /// the file) the stream stays as it was. Keyed by the probe alone, a second pass that
    /// read the cached stretch an earlier pass left and ran on into bytes that pass read
    /// directly stayed keyed cached there: its reads through `posix` took 15-18 ms each for
    /// 8 MiB, through `mmap` 9-25 ms (from the cache: 0.5-1.5), taken as cached samples.
    /// Also returns, for a read that continues the stream, the backend of the stream's last
    /// read.
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
            let far = offset.saturating_sub(self.probed_at) >= Self::REPROBE_BYTES;
            let due = match self.cache {
                CacheState::Cached => len as u64 >= Self::REPROBE_EACH || far,
                CacheState::Cold if far => {
                    // Asked once per `REPROBE_BYTES`, not at every read of a first pass.
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
            let beyond = Self::beyond_readahead(offset, len);
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
    /// beyond what readahead can have reached, that is two windows of
    /// [`Run::READ_AHEAD_BYTES`] (the kernel reads one window ahead while the stream reads
    /// the one before) or one read's length (`mmap` asks for the next read's range) past
    /// the read's end, whichever is further.
    pub(crate) fn beyond_readahead(offset: u64, len: usize) -> std::ops::Range<u64> {
        let len = len as u64;
        let start = offset
            .saturating_add(len)
            .saturating_add((2 * Run::READ_AHEAD_BYTES).max(len));
        start..start.saturating_add(len.clamp(1, 1 << 20))
    }

    /// Notes that a read through `path` covered `range` (`continued`: it continued the
    /// stream; `exploring`: it was an exploration's measurement; `keeps_cache`: the path
    /// reads through the page cache), measured as `measured` (`None` when it measured
    /// nothing useful). A read is not kept while its path warms up in the stream
    /// (see [`Self::WARM_UP_BYTES`]), but gathered into warm-up runs, returned every 8 reads
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
        let [a, b, c, d] =
            self.finish_runs(continued, range, path, keeps_cache, exploring, measured);
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
    /// between windows that wait for the device and windows its readahead already brought in
    /// (`mmap` at 64 KiB: runs of 8-10 GB/s and 1.2-1.7 GB/s in turn, 2.2 GB/s over the
    /// whole stream), so a median over single windows follows whichever half it lands in;
    /// over pairs it measures the stream. A path's first window is held back until the run
    /// after it, and recorded joined with it: recorded alone, a first window that lands in
    /// the fast half can make a slow path the leader of an exploration, which then confirms
    /// it with more samples (most likely how `mmap` at 1 MiB got 7 samples at 0.55-0.95
    /// GB/s against 2.5-3.1 for the direct paths, 80-130 ms of a 190 ms cold phase). A run
    /// of the same path and context that is not a full window (the stream's last reads) is
    /// joined with the window before it too, held back or not, and ends the pairing; any
    /// other run ends it alone.
    fn paired(&mut self, run: Run) -> Option<Run> {
        let window = run.long && run.full();
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

    /// [`ReadStream::finish`] before the pairing of readahead windows.
    fn finish_runs(
        &mut self,
        continued: bool,
        range: std::ops::Range<u64>,
        path: usize,
        keeps_cache: bool,
        exploring: bool,
        measured: Option<Measured>,
    ) -> [Option<Run>; 4] {
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
                        let mut w = Run::start(m, path, false);
                        w.warm_up = true;
                        self.warming = Some(w);
                    }
                }
            }
            let full = self.warming.take_if(|w| w.full());
            return [self.run.take(), None, warmed, full];
        }
        let Some(m) = measured else {
            return [self.run.take(), None, warmed, None];
        };
        if let Some(run) = self.run.as_mut() {
            if continued && run.takes(&m.ctx, path) {
                run.add(&m);
                let ended = self.run.take_if(|r| r.full());
                return [ended, None, warmed, None];
            }
        }
        let ended = self.run.take();
        let run = Run::start(m, path, keeps_cache);
        if run.full() {
            [ended, Some(run), warmed, None]
        } else {
            self.run = Some(run);
            [ended, None, warmed, None]
        }
    }

    /// Whether a read through `path` continuing the stream finds `path` warmed up in it.
    fn warm(&self, path: usize, keeps_cache: bool) -> bool {
        path == self.last_path
            && self.path_reads >= Self::WARM_UP_READS
            && (!keeps_cache
                || self.path_bytes >= Self::WARM_UP_BYTES
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
mod tests {
    use super::*;

    fn read(bytes: u64, cache: CacheState) -> Measured {
        Measured {
            ctx: crate::engine::test_read(bytes, cache),
            bytes,
            wall: Duration::from_micros(10),
            cpu: Some(Duration::from_micros(1)),
        }
    }

    #[test]
    fn a_stream_carries_its_first_probe_and_a_cached_one_reprobes() {
        let mut s = ReadStream::NONE;
        let probes = std::cell::Cell::new(0);
        let begin = |s: &mut ReadStream, off: u64, len: usize, state: CacheState| {
            s.begin(
                off,
                len,
                || true,
                || {
                    probes.set(probes.get() + 1);
                    state
                },
                || panic!("no stream here reads through the page cache"),
                |_| panic!("no stream here reads through the page cache"),
            )
        };
        assert_eq!(
            begin(&mut s, 0, 4096, CacheState::Cold),
            (CacheState::Cold, None)
        );
        s.finish(false, 0..4096, 1, false, false, None);
        // Continues: no probe, cold carried, previous path known.
        let got = begin(&mut s, 4096, 4096, CacheState::Cached);
        assert_eq!(got, (CacheState::Cold, Some(1)));
        s.finish(true, 4096..8192, 1, false, false, None);
        // A jump starts a new stream: probed.
        let got = begin(&mut s, 1 << 30, 1 << 16, CacheState::Cached);
        assert_eq!(got, (CacheState::Cached, None));
        s.finish(
            false,
            (1 << 30)..(1 << 30) + (1 << 16),
            2,
            false,
            false,
            None,
        );
        // A cached stream re-probes reads of 64 KiB and more.
        let got = begin(&mut s, (1 << 30) + (1 << 16), 1 << 16, CacheState::Cold);
        assert_eq!(got, (CacheState::Cold, Some(2)));
        assert_eq!(probes.get(), 3);
    }

    #[test]
    fn a_cold_stream_through_a_direct_path_reprobes_bytes_read_before() {
        const MIB: u64 = 1 << 20;
        let probes = std::cell::Cell::new(0);
        let begin = |s: &mut ReadStream, off: u64, reread: bool, state: CacheState| {
            s.begin(
                off,
                MIB as usize,
                || reread,
                || {
                    probes.set(probes.get() + 1);
                    state
                },
                || panic!("no stream here reads through the page cache"),
                |_| panic!("no stream here reads through the page cache"),
            )
        };
        // A second pass through a direct path: its first MiB cold, the next cached (an
        // earlier pass read it through the page cache), then cold again.
        let mut s = ReadStream::NONE;
        assert_eq!(
            begin(&mut s, 0, true, CacheState::Cold),
            (CacheState::Cold, None)
        );
        s.finish(false, 0..MIB, 0, false, false, None);
        let got = begin(&mut s, MIB, true, CacheState::Cached);
        assert_eq!(got, (CacheState::Cached, Some(0)));
        s.finish(true, MIB..2 * MIB, 0, false, false, None);
        let got = begin(&mut s, 2 * MIB, true, CacheState::Cold);
        assert_eq!(got, (CacheState::Cold, Some(0)));
        assert_eq!(probes.get(), 3);
        // First reads are not probed again: nothing cached them but this stream.
        let mut s = ReadStream::NONE;
        begin(&mut s, 0, false, CacheState::Cold);
        s.finish(false, 0..MIB, 0, false, false, None);
        let got = begin(&mut s, MIB, false, CacheState::Cached);
        assert_eq!(got, (CacheState::Cold, Some(0)));
        assert_eq!(probes.get(), 4);
        // A cold stream through the page cache, over bytes read before, is probed too, but
        // bytes found cached count only where they were read through the page cache before
        // (`through`), or else where bytes beyond its readahead's reach are cached as well
        // (`beyond`): its own readahead caches what follows it.
        let asked = std::cell::Cell::new(0);
        let begin_ahead =
            |s: &mut ReadStream, off: u64, state, through: bool, beyond: Option<bool>| {
                s.begin(
                    off,
                    MIB as usize,
                    || true,
                    || {
                        probes.set(probes.get() + 1);
                        state
                    },
                    || through,
                    |_| {
                        asked.set(asked.get() + 1);
                        beyond
                    },
                )
            };
        use CacheState::{Cached, Cold};
        for (through, beyond, then) in [
            (false, Some(false), Cold),
            (false, None, Cold),
            (false, Some(true), Cached),
            (true, Some(false), Cached),
        ] {
            let mut s = ReadStream::NONE;
            assert_eq!(begin_ahead(&mut s, 0, Cold, false, None), (Cold, None));
            s.finish(false, 0..MIB, 0, true, false, None);
            let got = begin_ahead(&mut s, MIB, Cached, through, beyond);
            assert_eq!(got, (then, Some(0)), "{through} {beyond:?}");
        }
        assert_eq!(probes.get(), 4 + 8);
        assert_eq!(asked.get(), 3);
    }

    #[test]
    fn one_wait_does_not_decide_a_short_warm_up_run_through_the_page_cache() {
        let measured = |bytes: u64, micros: u64| Measured {
            ctx: crate::engine::test_read(bytes, CacheState::Cold),
            bytes,
            wall: Duration::from_micros(micros),
            cpu: None,
        };
        let run_of = |bytes: u64, walls: &[u64]| {
            let mut run = Run::start(measured(bytes, walls[0]), 0, true);
            for &w in &walls[1..] {
                run.add(&measured(bytes, w));
            }
            run
        };
        // 8 reads of 64 KiB, one of which waited 5 ms for the device: judged as the other
        // seven, 10 µs a read, through a path that keeps the page cache.
        let waited = run_of(64 << 10, &[10, 10, 5000, 10, 10, 10, 10, 10]);
        assert_eq!(waited.far_test_wall(true), Some(Duration::from_micros(80)));
        assert_eq!(
            waited.far_test_wall(false),
            Some(Duration::from_micros(5070))
        );
        // Slow on every read: judged as slow.
        let slow = run_of(64 << 10, &[600; 8]);
        assert_eq!(slow.far_test_wall(true), Some(Duration::from_micros(4800)));
        // A single small read tells nothing; reads of 1 MiB are judged as they are.
        assert_eq!(run_of(64 << 10, &[5000]).far_test_wall(true), None);
        let large = run_of(1 << 20, &[5000, 300]);
        assert_eq!(large.far_test_wall(true), Some(Duration::from_micros(5300)));
    }

    #[test]
    fn a_cold_first_pass_asks_whether_it_reads_again_once_a_mib() {
        const K64: u64 = 64 << 10;
        let asked = std::cell::Cell::new(0);
        let mut s = ReadStream::NONE;
        for i in 0..64u64 {
            let off = i * K64;
            let ask = || {
                asked.set(asked.get() + 1);
                false
            };
            let (cache, _) = s.begin(
                off,
                K64 as usize,
                ask,
                || CacheState::Cold,
                || false,
                |_| None,
            );
            assert_eq!(cache, CacheState::Cold);
            s.finish(i > 0, off..off + K64, 0, false, false, None);
        }
        // 4 MiB of first reads through a direct path: asked at 1, 2 and 3 MiB.
        assert_eq!(asked.get(), 3);
    }

    #[test]
    fn a_cached_stream_through_the_page_cache_asks_what_is_cached_beyond_its_readahead() {
        const MIB: u64 = 1 << 20;
        // A stream of 8 MiB reads that starts cached and goes on through a path that keeps
        // the page cache, over bytes cached some other way than by reading them through the
        // page cache (written, say). `cached_to`: where those cached bytes end; the probe
        // finds every read cached (the stream's readahead is ahead of it).
        let run = |cached_to: u64, reads: u64| {
            let asked = std::cell::RefCell::new(Vec::new());
            let mut s = ReadStream::NONE;
            let mut states = Vec::new();
            for i in 0..reads {
                let off = i * 8 * MIB;
                let (cache, _) = s.begin(
                    off,
                    (8 * MIB) as usize,
                    || true,
                    || CacheState::Cached,
                    || false,
                    |range| {
                        asked.borrow_mut().push(range.start / MIB);
                        (range.end <= 1 << 30).then_some(range.end <= cached_to)
                    },
                );
                states.push(cache);
                s.finish(i > 0, off..off + 8 * MIB, 0, true, false, None);
            }
            (states, asked.into_inner())
        };
        // Cached up to 64 MiB. The first read starts the stream (nothing asked); the read
        // at 8 MiB asks about 32-33 MiB (16 MiB past its end), cached, which vouches for
        // the reads ending by 33 MiB; the read at 32 MiB asks about 56-57, and the read at
        // 56 MiB about 80-81, not cached: it turns the stream cold (its bytes were cached,
        // but so close to where the cached bytes end that its readahead cannot be told
        // apart). The reads after it, still found cached (their own readahead's), ask
        // again, and stay cold.
        let (states, asked) = run(64 * MIB, 10);
        use CacheState::{Cached, Cold};
        assert_eq!(
            states,
            vec![Cached, Cached, Cached, Cached, Cached, Cached, Cached, Cold, Cold, Cold]
        );
        assert_eq!(asked, vec![32, 56, 80, 88, 96]);
        // Near the end of the file nothing can be told: the stream stays as it was (cached).
        let (states, _) = run(2 << 30, 128);
        assert!(states.iter().all(|&c| c == Cached));
    }

    /// Path 0 owns a cold stream; path 1 takes it over while exploring for `reads` reads of
    /// 64 KiB; then path 0 takes it back, exploiting. Returns the reads of path 1 kept in
    /// the runs that ended, those runs' lengths, and the lengths of its warm-up runs.
    fn take_over(keeps_cache: bool, reads: u32) -> (u32, Vec<u32>, Vec<u32>) {
        let mut s = ReadStream::NONE;
        let mut runs = Vec::new();
        let mut end = 0u64;
        let cold = || Some(read(1 << 16, CacheState::Cold));
        s.finish(false, 0..1 << 16, 0, keeps_cache, false, cold());
        end += 1 << 16;
        for _ in 0..reads {
            let out = s.finish(true, end..end + (1 << 16), 1, keeps_cache, true, cold());
            end += 1 << 16;
            runs.extend(out.into_iter().flatten().filter(|r| r.path == 1));
        }
        // Exploiting, the path that takes the stream back warms up first too: its read is
        // not measured.
        let out = s.finish(true, end..end + (1 << 16), 0, keeps_cache, false, cold());
        assert!(out.iter().flatten().all(|r| r.path == 1));
        runs.extend(out.into_iter().flatten());
        let [run, held] = s.take_runs();
        assert!(run.is_none() && held.is_none());
        let lens = |warm_up: bool| -> Vec<u32> {
            runs.iter()
                .filter(|r| r.warm_up == warm_up)
                .map(|r| r.transfers)
                .collect()
        };
        (lens(false).iter().sum(), lens(false), lens(true))
    }

    #[test]
    fn an_exploring_path_is_measured_once_it_has_warmed_up_in_the_stream() {
        // Through the page cache: the first 32 reads of 64 KiB (2 MiB, less than 8 MiB) are
        // the warm-up (offered in runs of 8 reads), the next 16 are kept in one run (a
        // readahead window is 8 MiB).
        assert_eq!(take_over(true, 48), (16, vec![16], vec![8, 8, 8, 8]));
        // 8 MiB past the warm-up, a run through the page cache ends.
        assert_eq!(
            take_over(true, 32 + 160),
            (160, vec![160], vec![8, 8, 8, 8])
        );
        // A direct path warms up in two reads and is measured in runs of 8.
        assert_eq!(take_over(false, 20), (18, vec![8, 8, 2], vec![2]));
        // A warm-up cut short by a switch ends there.
        assert_eq!(take_over(true, 10), (0, vec![], vec![8, 2]));
    }

    #[test]
    fn a_chosen_path_is_measured_once_it_has_warmed_up_in_a_stream_it_took_over() {
        // Path 0 (direct) starts a cold stream of 1 MiB reads, measured at once; path 1
        // (through the page cache), chosen, takes it over for 12 reads.
        let mut s = ReadStream::NONE;
        let mut recorded = Vec::new();
        for i in 0..16u64 {
            let (path, keeps_cache) = if i < 4 { (0, false) } else { (1, true) };
            let range = (i << 20)..((i + 1) << 20);
            let m = read(1 << 20, CacheState::Cold);
            let out = s.finish(i > 0, range, path, keeps_cache, false, Some(m));
            recorded.extend(out.into_iter().flatten());
        }
        recorded.extend(s.take_runs().into_iter().flatten());
        let runs: Vec<(usize, u32, bool)> = recorded
            .iter()
            .map(|r| (r.path, r.transfers, r.warm_up))
            .collect();
        // Path 0's 4 reads in one run; path 1's first 8 MiB offered as warm-up runs of 4
        // MiB (far behind the leader, they rule it out), its last 4 reads measured.
        assert_eq!(
            runs,
            vec![(0, 4, false), (1, 4, true), (1, 4, true), (1, 4, false)]
        );
    }

    #[test]
    fn readahead_windows_are_recorded_in_pairs() {
        // A cold stream of 1 MiB reads: through the page cache, windows of 8 reads wait for
        // the device (2 ms a read) and the next ones find it read ahead (0.2 ms), in turn.
        let record = |keeps_cache: bool, reads: u64| {
            let mut s = ReadStream::NONE;
            let mut recorded = Vec::new();
            for i in 0..=reads {
                // The last read goes through another path: the stream's run ends.
                let path = usize::from(i == reads);
                let slow = (i / 8) % 2 == 0;
                let m = Measured {
                    wall: Duration::from_micros(if slow { 2000 } else { 200 }),
                    ..read(1 << 20, CacheState::Cold)
                };
                let range = (i << 20)..((i + 1) << 20);
                let out = s.finish(i > 0, range, path, keeps_cache, false, Some(m));
                recorded.extend(out.into_iter().flatten().filter(|r| r.path == 0));
            }
            recorded.extend(s.take_runs().into_iter().flatten().filter(|r| r.path == 0));
            recorded
                .iter()
                .map(|r| (r.bytes >> 20, r.wall.as_micros()))
                .collect::<Vec<_>>()
        };
        // Each window with the one before (the first one only so): every pair costs the
        // stream's mean, 1.1 ms a read.
        assert_eq!(record(true, 40), vec![(16, 17600); 4]);
        // A first window held back, and the last full window, are recorded with the run
        // that ends the pairing; a held window alone when the stream has no other run of
        // its path.
        assert_eq!(record(true, 12), vec![(12, 16800)]);
        assert_eq!(record(true, 20), vec![(16, 17600), (12, 9600)]);
        assert_eq!(record(true, 8), vec![(8, 16000)]);
        let mut s = ReadStream::NONE;
        for i in 0..8u64 {
            let out = s.finish(
                i > 0,
                (i << 20)..((i + 1) << 20),
                0,
                true,
                false,
                Some(read(1 << 20, CacheState::Cold)),
            );
            assert!(out.iter().all(Option::is_none));
        }
        s.begin(
            1 << 30,
            1 << 20,
            || false,
            || CacheState::Cold,
            || false,
            |_| None,
        );
        let out = s.finish(
            false,
            (1 << 30)..(1 << 30) + (1 << 20),
            0,
            true,
            false,
            None,
        );
        let lone: Vec<u64> = out.iter().flatten().map(|r| r.bytes >> 20).collect();
        assert_eq!(
            lone,
            vec![8],
            "a new stream records the last one's held window"
        );
        // Direct runs (4 MiB, nothing read ahead) are recorded as they are.
        assert_eq!(record(false, 40).len(), 10);
        assert!(record(false, 40).iter().all(|&(mib, _)| mib == 4));
    }

    #[test]
    fn a_direct_read_taking_over_from_a_path_through_the_page_cache_is_not_measured() {
        let mut s = ReadStream::NONE;
        let mut recorded = Vec::new();
        let mut end = 0;
        // A stream of mixed sizes: 4 KiB reads through path 0 (through the page cache), a
        // 1 MiB read through path 1 (direct) after them, then another one.
        for (i, (len, path, keeps_cache)) in [
            (4096u64, 0, true),
            (4096, 0, true),
            (1 << 20, 1, false),
            (1 << 20, 1, false),
            (1 << 20, 1, false),
        ]
        .into_iter()
        .enumerate()
        {
            let out = s.finish(
                i > 0,
                end..end + len,
                path,
                keeps_cache,
                false,
                Some(read(len, CacheState::Cold)),
            );
            end += len;
            recorded.extend(out.into_iter().flatten());
        }
        recorded.extend(s.take_runs().into_iter().flatten());
        let direct: Vec<u32> = recorded
            .iter()
            .filter(|r| r.path == 1)
            .map(|r| r.transfers)
            .collect();
        // The first 1 MiB read waited for path 0's readahead, and path 1 warms up in two
        // reads: only the third is measured (the first two, far behind, could rule it out).
        assert_eq!(direct, [2, 1]);
        assert_eq!(
            recorded
                .iter()
                .filter(|r| r.path == 1)
                .map(|r| r.warm_up)
                .collect::<Vec<_>>(),
            [true, false]
        );
    }

    #[test]
    fn only_reads_from_the_device_through_the_page_cache_run_long() {
        let lens = |keeps_cache: bool, cache: CacheState| {
            let mut s = ReadStream::NONE;
            let mut lens = Vec::new();
            for i in 0..300u64 {
                let range = i * 4096..(i + 1) * 4096;
                let out = s.finish(i > 0, range, 0, keeps_cache, false, Some(read(4096, cache)));
                lens.extend(out.into_iter().flatten().map(|r| r.transfers));
            }
            lens.len()
        };
        // 300 reads of 4 KiB: one run in progress through the page cache from the device,
        // runs of 8 otherwise.
        assert_eq!(lens(true, CacheState::Cold), 0);
        assert_eq!(lens(true, CacheState::Cached), 37);
        assert_eq!(lens(false, CacheState::Cold), 37);
    }

    #[test]
    fn runs_gather_reads_of_one_path_and_context() {
        let mut s = ReadStream::NONE;
        let mut recorded = Vec::new();
        let mut end = 0;
        // 20 reads of 4 KiB through path 0, continuing: runs of 8.
        for i in 0..20 {
            let out = s.finish(
                i > 0,
                end..end + 4096,
                0,
                false,
                false,
                Some(read(4096, CacheState::Cold)),
            );
            end += 4096;
            recorded.extend(out.into_iter().flatten());
        }
        assert_eq!(
            recorded.iter().map(|r| r.transfers).collect::<Vec<_>>(),
            [8, 8]
        );
        assert_eq!(recorded[0].bytes, 8 * 4096);
        assert_eq!(recorded[0].wall, Duration::from_micros(80));
        // A switch of path ends the run of 4; the new path warms up in two reads, then
        // starts its own run.
        for i in 0..3 {
            let out = s.finish(
                true,
                end..end + 4096,
                1,
                false,
                false,
                Some(read(4096, CacheState::Cold)),
            );
            end += 4096;
            let ended: Vec<(u32, usize, bool)> = out
                .iter()
                .flatten()
                .map(|r| (r.transfers, r.path, r.warm_up))
                .collect();
            let expected: &[(u32, usize, bool)] = match i {
                0 => &[(4, 0, false)],
                1 => &[],
                _ => &[(2, 1, true)],
            };
            assert_eq!(ended, expected);
        }
        // Another size class ends a run too; a big read is a run of its own at once.
        let out = s.finish(
            true,
            end..end + (8 << 20),
            1,
            false,
            false,
            Some(read(8 << 20, CacheState::Cold)),
        );
        assert_eq!(out[0].as_ref().map(|r| r.transfers), Some(1));
        assert_eq!(out[1].as_ref().map(|r| r.bytes), Some(8 << 20));
        // The CPU time of the reads that read it stands for the whole run (scaled to its
        // bytes); with none read, the run's is unknown.
        let unread = || {
            let mut m = read(4096, CacheState::Cold);
            m.cpu = None;
            m
        };
        s.finish(false, 0..4096, 0, false, false, Some(unread()));
        s.finish(
            true,
            4096..8192,
            0,
            false,
            false,
            Some(read(4096, CacheState::Cold)),
        );
        let run = s.take_runs()[0].clone().unwrap();
        assert_eq!(run.transfers, 2);
        assert_eq!(run.cpu(), Some(Duration::from_micros(2)));
        s.finish(false, 0..4096, 0, false, false, Some(unread()));
        s.finish(true, 4096..8192, 0, false, false, Some(unread()));
        assert_eq!(s.take_runs()[0].as_ref().unwrap().cpu(), None);
        // An unmeasured read ends the run in progress.
        s.finish(
            false,
            0..4096,
            0,
            false,
            false,
            Some(read(4096, CacheState::Cold)),
        );
        let out = s.finish(true, 4096..8192, 0, false, false, None);
        assert_eq!(out[0].as_ref().map(|r| r.transfers), Some(1));
        assert!(s.take_runs().iter().all(Option::is_none));
    }
}
