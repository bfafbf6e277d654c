//! Runs a list of reads or writes on one ring: keeps up to the queue depth in flight, submits
//! and waits with one system call, reaps, resubmits what came back short or interrupted, and
//! refills. Never returns (nor unwinds) with an op in flight.

use crate::ring::Ring;
use crate::URING;
use fastensor_core::align::is_aligned;
use fastensor_core::{Error, ErrorKind, Result};
use fastensor_sys as sys;
use io_uring::{opcode, squeue, types};
use std::collections::VecDeque;
use std::io;
use std::path::Path;

/// Which descriptor of the file an op uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    /// The `O_DIRECT` descriptor (fixed file 0).
    Direct,
    /// The buffered descriptor (fixed file 1), for partial blocks of writes.
    Buffered,
}

/// Where an op's bytes are.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Buf {
    /// The caller's memory, used in place (a write only reads it).
    Caller(*mut u8),
    /// A staging span; after the read, bytes `skip..skip + copy_len` of it go to `dst`.
    StagedRead {
        /// Destination of the copy.
        dst: *mut u8,
        /// Bytes of the span before the wanted ones.
        skip: usize,
        /// Wanted bytes.
        copy_len: usize,
    },
    /// A staging span filled from `src` (the op's length) before the write.
    StagedWrite {
        /// Source of the copy.
        src: *const u8,
    },
}

/// One request on the ring (resubmitted until done).
#[derive(Debug)]
pub(crate) struct Op {
    write: bool,
    target: Target,
    offset: u64,
    len: usize,
    buf: Buf,
    /// Reads: bytes that must arrive before the end of the file is an error.
    need: usize,
    done: usize,
    staging: Option<usize>,
}

impl Op {
    /// A read of `len` bytes at `offset` through the direct descriptor; fewer than `need`
    /// bytes before the end of the file is an error.
    pub(crate) fn read(offset: u64, len: usize, buf: Buf, need: usize) -> Op {
        Op {
            write: false,
            target: Target::Direct,
            offset,
            len,
            buf,
            need,
            done: 0,
            staging: None,
        }
    }

    /// A write of `len` bytes at `offset` through `target`.
    pub(crate) fn write(target: Target, offset: u64, len: usize, buf: Buf) -> Op {
        Op {
            write: true,
            target,
            offset,
            len,
            buf,
            need: len,
            done: 0,
            staging: None,
        }
    }

    fn staged(&self) -> bool {
        !matches!(self.buf, Buf::Caller(_))
    }
}

/// The context errors carry.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ctx<'a> {
    pub(crate) path: &'a Path,
    /// Offset alignment of the direct descriptor.
    pub(crate) block: u64,
    pub(crate) queue_depth: usize,
}

/// Counts the ops in flight on a ring; dropping it drains them, so even a panic cannot
/// leave the kernel writing into memory that is being freed.
struct InFlight<'r> {
    ring: &'r mut Ring,
    count: usize,
}

impl InFlight<'_> {
    /// Submits what is queued and waits for at least `want` completions. Retries on `EINTR`,
    /// `EAGAIN`, `EBUSY` (completion queue busy: the caller reaps next) and `ENOMEM`.
    fn submit_and_wait(&mut self, want: usize) -> io::Result<()> {
        loop {
            match self.ring.uring.submit_and_wait(want) {
                Ok(_) => return Ok(()),
                Err(e) => match rustix::io::Errno::from_io_error(&e) {
                    Some(rustix::io::Errno::INTR) => {}
                    Some(rustix::io::Errno::BUSY) => return Ok(()),
                    Some(rustix::io::Errno::AGAIN | rustix::io::Errno::NOMEM) => {
                        if !self.ring.uring.completion().is_empty() {
                            return Ok(());
                        }
                        std::thread::sleep(std::time::Duration::from_micros(200));
                    }
                    _ => return Err(e),
                },
            }
        }
    }

    /// Waits for every op in flight, discarding the results.
    fn drain(&mut self) {
        while self.count > 0 {
            if let Err(e) = self.submit_and_wait(self.count) {
                // The kernel may still write into memory that is about to be freed or reused:
                // continuing would be undefined behaviour.
                eprintln!("fastensor-uring: cannot wait for in-flight I/O ({e}); aborting");
                std::process::abort();
            }
            let n = self.ring.uring.completion().count();
            self.count = self.count.saturating_sub(n);
        }
        if let Some(s) = self.ring.staging_mut() {
            s.reset();
        }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.drain();
    }
}

/// Runs every op to completion (or to the first error, after which nothing new starts and
/// what is in flight is reaped before returning).
///
/// # Safety
/// For the whole call, every `Buf` pointer must be valid for the op's bytes (`Caller`: `len`
/// bytes, written by reads and read by writes; `StagedRead::dst`: `copy_len` bytes;
/// `StagedWrite::src`: `len` bytes), and nothing else may access the memory reads write.
pub(crate) unsafe fn run(ring: &mut Ring, ops: &mut [Op], ctx: Ctx<'_>) -> Result<()> {
    if ops.is_empty() {
        return Ok(());
    }
    if ops.iter().any(Op::staged) {
        ring.staging().map_err(|e| {
            Error::io(e, "cannot allocate the staging area")
                .with_backend(URING)
                .with_path(ctx.path)
        })?;
    }
    let queue_depth = ctx.queue_depth.max(1);
    // Refill once a quarter of the queue has completed rather than after every completion:
    // fewer wake-ups and system calls for the same work, with the device still kept busy.
    let refill_batch = (queue_depth / 4).max(1);
    let mut reaped: Vec<(u64, i32)> = Vec::with_capacity(queue_depth * 2);
    let mut pending = Pending {
        ops,
        ctx,
        next: 0,
        retry: VecDeque::new(),
        failure: None,
    };
    let mut flight = InFlight { ring, count: 0 };

    loop {
        // SAFETY: the caller's contract, passed on.
        let starved = unsafe { pending.fill(&mut flight, queue_depth) };
        if flight.count == 0 {
            if pending.more() {
                pending.failure =
                    Some(internal(ctx.path, "staging area too small for one request"));
            }
            break;
        }
        let want = if starved {
            1
        } else if pending.more() {
            flight
                .count
                .saturating_sub(queue_depth - refill_batch)
                .max(1)
        } else {
            // Nothing left to submit: one wake-up for the rest.
            flight.count
        };
        if let Err(e) = flight.submit_and_wait(want) {
            // Nothing reaped means the ops may still run: draining (in drop) decides.
            let failure = pending.failure.take().unwrap_or_else(|| {
                Error::io(e, "io_uring_enter failed")
                    .with_backend(URING)
                    .with_path(ctx.path)
            });
            drop(flight);
            return Err(failure);
        }
        reaped.clear();
        reaped.extend(
            flight
                .ring
                .uring
                .completion()
                .map(|c| (c.user_data(), c.result())),
        );
        flight.count -= reaped.len();
        pending.account(flight.ring, &reaped);
    }
    drop(flight);
    match pending.failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The ops of one [`run`] and where it stands: the next op never started, the ops to submit
/// again, the first failure (after which nothing new starts).
struct Pending<'o, 'c> {
    ops: &'o mut [Op],
    ctx: Ctx<'c>,
    next: usize,
    retry: VecDeque<usize>,
    failure: Option<Error>,
}

impl Pending<'_, '_> {
    /// Whether ops remain to be submitted.
    fn more(&self) -> bool {
        self.failure.is_none() && (self.next < self.ops.len() || !self.retry.is_empty())
    }

    /// Pushes ops (those to submit again first) until `queue_depth` are in flight. Returns
    /// whether it stopped for want of staging space (a completion frees some).
    ///
    /// # Safety
    /// As [`run`]'s: every op's buffer stays valid until the op completes.
    unsafe fn fill(&mut self, flight: &mut InFlight<'_>, queue_depth: usize) -> bool {
        while self.failure.is_none() && flight.count < queue_depth {
            let (idx, from_retry) = match self.retry.pop_front() {
                Some(i) => (i, true),
                None if self.next < self.ops.len() => (self.next, false),
                None => break,
            };
            let op = &mut self.ops[idx];
            if op.staged() && op.staging.is_none() {
                let staging = flight.ring.staging_mut().expect("made before the loop");
                let Some(at) = staging.alloc(op.len) else {
                    // Wait for a completion to free staging space.
                    if from_retry {
                        self.retry.push_front(idx);
                    }
                    return true;
                };
                op.staging = Some(at);
                if let Buf::StagedWrite { src } = op.buf {
                    // SAFETY: `src` is valid for `len` bytes (the caller's contract) and the
                    // span at `at` is `len` bytes of the staging area that only this op uses.
                    unsafe { std::ptr::copy_nonoverlapping(src, staging.ptr(at), op.len) };
                }
            }
            if !from_retry {
                self.next += 1;
            }
            let entry = build_entry(flight.ring, op, idx as u64);
            // SAFETY: the entry's buffer is the caller's memory or a staging span, both valid
            // until the op completes (the caller's contract; the staging area lives in the
            // ring). Every pushed op is counted in `flight`, which reaps it before `run`
            // returns or unwinds. The queue has room: at most `queue_depth` ops are in flight
            // and the ring has at least that many entries.
            let pushed = unsafe { flight.ring.uring.submission().push(&entry) };
            pushed.expect("the submission queue has room for the queue depth");
            flight.count += 1;
        }
        false
    }

    /// Accounts the completions `reaped` (`user_data`: the op's index, and its result): an
    /// op to go on is queued again unless the run failed; the first failure is kept.
    fn account(&mut self, ring: &mut Ring, reaped: &[(u64, i32)]) {
        for &(user_data, res) in reaped {
            let idx = user_data as usize;
            match complete(ring, &mut self.ops[idx], res, self.ctx) {
                Step::Done => {}
                Step::Again => {
                    if self.failure.is_none() {
                        self.retry.push_back(idx);
                    }
                }
                Step::Failed(e) => {
                    self.failure.get_or_insert(e);
                }
            }
        }
    }
}

enum Step {
    Done,
    Again,
    Failed(Error),
}

/// Accounts one completion of `op`.
fn complete(ring: &mut Ring, op: &mut Op, res: i32, ctx: Ctx<'_>) -> Step {
    if res < 0 {
        let errno = rustix::io::Errno::from_raw_os_error(-res);
        if errno == rustix::io::Errno::INTR || errno == rustix::io::Errno::AGAIN {
            return Step::Again;
        }
        release(ring, op);
        let what = if op.write {
            "io_uring write failed"
        } else {
            "io_uring read failed"
        };
        let err = io::Error::from_raw_os_error(-res);
        return Step::Failed(sys::transfer_error(
            err,
            what,
            URING,
            ctx.path,
            op.offset + op.done as u64,
        ));
    }
    let n = res as usize;
    if n == 0 && op.write {
        release(ring, op);
        let err = io::Error::new(io::ErrorKind::WriteZero, "the write made no progress");
        return Step::Failed(sys::transfer_error(
            err,
            "io_uring write failed",
            URING,
            ctx.path,
            op.offset + op.done as u64,
        ));
    }
    op.done += n;
    if op.done < op.len {
        let pos = op.offset + op.done as u64;
        // A direct read ends short of a block boundary only at the end of the file.
        let at_eof = !op.write && (n == 0 || !is_aligned(pos, ctx.block));
        if !at_eof {
            return Step::Again;
        }
    }
    finish(ring, op, ctx)
}

/// Completes `op`: checks a read got the bytes it needs and copies staged bytes out.
fn finish(ring: &mut Ring, op: &mut Op, ctx: Ctx<'_>) -> Step {
    let mut step = Step::Done;
    if !op.write {
        if op.done < op.need {
            step = Step::Failed(
                Error::new(ErrorKind::UnexpectedEof, "the file shrank during the read")
                    .with_backend(URING)
                    .with_path(ctx.path)
                    .with_offset(op.offset + op.done as u64),
            );
        } else if let (
            Buf::StagedRead {
                dst,
                skip,
                copy_len,
            },
            Some(at),
        ) = (op.buf, op.staging)
        {
            let staging = ring.staging_mut().expect("staged op");
            // SAFETY: the span at `at` holds the op's `len >= skip + copy_len` bytes (need
            // covers them), and `dst` is valid for `copy_len` bytes (the caller's contract).
            unsafe { std::ptr::copy_nonoverlapping(staging.ptr(at + skip), dst, copy_len) };
        }
    }
    release(ring, op);
    step
}

fn release(ring: &mut Ring, op: &mut Op) {
    if let Some(at) = op.staging.take() {
        if let Some(s) = ring.staging_mut() {
            s.release(at, op.len);
        }
    }
}

fn internal(path: &Path, what: &str) -> Error {
    Error::new(ErrorKind::Other, what.to_string())
        .with_backend(URING)
        .with_path(path)
}

/// The submission entry for the rest of `op`.
fn build_entry(ring: &mut Ring, op: &Op, user_data: u64) -> squeue::Entry {
    let (ptr, fixed) = match (op.buf, op.staging) {
        // SAFETY (pointer arithmetic): `done < len`, inside the caller's buffer.
        (Buf::Caller(p), _) => (p.wrapping_add(op.done), false),
        (_, Some(at)) => {
            let staging = ring.staging_mut().expect("staged op");
            // SAFETY: `at + done` lies inside the span the op holds.
            (unsafe { staging.ptr(at + op.done) }, staging.registered)
        }
        (_, None) => unreachable!("a staged op gets its span before it is submitted"),
    };
    let len = u32::try_from(op.len - op.done).expect("ops are at most 1 GiB");
    let offset = op.offset + op.done as u64;
    let slot = match op.target {
        Target::Direct => 0,
        Target::Buffered => 1,
    };
    macro_rules! entry {
        ($fd:expr) => {
            match (op.write, fixed) {
                (false, false) => opcode::Read::new($fd, ptr, len).offset(offset).build(),
                (false, true) => opcode::ReadFixed::new($fd, ptr, len, 0)
                    .offset(offset)
                    .build(),
                (true, false) => opcode::Write::new($fd, ptr, len).offset(offset).build(),
                (true, true) => opcode::WriteFixed::new($fd, ptr, len, 0)
                    .offset(offset)
                    .build(),
            }
        };
    }
    let entry = if ring.fixed_files {
        entry!(types::Fixed(slot))
    } else {
        entry!(types::Fd(ring.fds[slot as usize]))
    };
    entry.user_data(user_data)
}
