//! Rings and their staging areas, pooled per open file so that a transfer never sets up a
//! ring of its own and threads sharing a handle each get one.
//!
//! Fork safety: a ring is a kernel object shared with every process that holds its
//! descriptor, so a child made by `fork` must never submit on, wait on or register with a
//! ring it inherited (its ops would run in the parent's queues, against the parent's
//! registered files, and each process would reap the other's completions). Every ring
//! records the [`fork::generation`] it was made in; a pool (of a file, or the process-wide
//! [`SPARE`] one) drops the inherited rings it finds, which only closes this process's
//! descriptor of each and unmaps its view of the queues, and sets up new ones. The pools'
//! locks are [`ForkMutex`]es: a child can take them even if a thread of the parent held
//! one at the fork.

use crate::config::UringConfig;
use fastensor_core::HostBuffer;
use fastensor_sys::fork::{self, ForkMutex};
use io_uring::IoUring;
use std::io;
use std::ops::Range;
use std::os::fd::{AsRawFd, RawFd};

/// A page-aligned area from which ops borrow spans for unaligned data, optionally registered
/// with the ring as fixed buffer 0.
#[derive(Debug)]
pub(crate) struct Staging {
    /// Owns the memory; only accessed through `base` after creation.
    _buf: HostBuffer,
    base: *mut u8,
    len: usize,
    unit: usize,
    /// True when registered as fixed buffer 0 of the ring.
    pub(crate) registered: bool,
    /// Free spans, sorted and coalesced.
    free: Vec<Range<usize>>,
}

// SAFETY: `base` points into `_buf`, which Staging owns exclusively (HostBuffer is Send).
unsafe impl Send for Staging {}

impl Staging {
    fn new(len: usize, unit: usize) -> io::Result<Self> {
        let mut buf = HostBuffer::with_alignment(len, unit)
            .map_err(|e| io::Error::new(io::ErrorKind::OutOfMemory, e.to_string()))?;
        let base = buf.as_mut_ptr();
        Ok(Staging {
            _buf: buf,
            base,
            len,
            unit,
            registered: false,
            free: std::iter::once(0..len).collect(),
        })
    }

    /// The address of the byte at `offset` of the area.
    ///
    /// # Safety
    /// `offset` must be at most the area's length.
    pub(crate) unsafe fn ptr(&self, offset: usize) -> *mut u8 {
        debug_assert!(offset <= self.len);
        // SAFETY: the caller keeps `offset` inside the allocation.
        unsafe { self.base.add(offset) }
    }

    /// Takes a span of at least `len` bytes (rounded up to the unit), first fit; `None` when
    /// no free span is large enough now.
    pub(crate) fn alloc(&mut self, len: usize) -> Option<usize> {
        let len = len.max(1).div_ceil(self.unit) * self.unit;
        let i = self.free.iter().position(|r| r.len() >= len)?;
        let start = self.free[i].start;
        self.free[i].start += len;
        if self.free[i].is_empty() {
            self.free.remove(i);
        }
        Some(start)
    }

    /// Gives back the span `alloc` returned for `len` bytes at `start`.
    pub(crate) fn release(&mut self, start: usize, len: usize) {
        let len = len.max(1).div_ceil(self.unit) * self.unit;
        let end = start + len;
        let i = self.free.partition_point(|r| r.start < start);
        self.free.insert(i, start..end);
        if i + 1 < self.free.len() && self.free[i].end == self.free[i + 1].start {
            self.free[i].end = self.free[i + 1].end;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].end == self.free[i].start {
            self.free[i - 1].end = self.free[i].end;
            self.free.remove(i);
        }
    }

    /// Marks the whole area free (only when no op uses it).
    pub(crate) fn reset(&mut self) {
        self.free.clear();
        self.free.push(0..self.len);
    }

    /// The area's size in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

/// One io_uring instance with the file's descriptors registered and a lazily made staging
/// area. Never holds an op in flight between transfers.
///
/// Dropping a ring makes no io_uring call: it closes this process's descriptor of the ring
/// and unmaps its queues and staging area. That is all a process may do with a ring it
/// inherited (see the module docs).
pub(crate) struct Ring {
    // Dropped first: closing the ring releases the registrations before the memory goes.
    pub(crate) uring: IoUring,
    /// The [`fork::generation`] of the process that set the ring up.
    generation: u64,
    /// Descriptors `[direct, buffered]`, registered as fixed files 0 and 1 when `fixed_files`.
    pub(crate) fds: [RawFd; 2],
    pub(crate) fixed_files: bool,
    staging: Option<Staging>,
    staging_size: usize,
    staging_unit: usize,
    register_buffers: bool,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("entries", &self.uring.params().sq_entries())
            .field("fixed_files", &self.fixed_files)
            .field(
                "staging",
                &self.staging.as_ref().map(|s| (s.len(), s.registered)),
            )
            .finish()
    }
}

impl Ring {
    /// Sets up a ring for the descriptors `fds` (`[direct, buffered]`).
    pub(crate) fn new(
        config: &UringConfig,
        fds: [RawFd; 2],
        staging_size: usize,
        staging_unit: usize,
    ) -> io::Result<Ring> {
        let entries = config.effective_queue_depth();
        let build = |coop: bool| {
            let mut b = IoUring::builder();
            if config.sqpoll {
                b.setup_sqpoll(config.sqpoll_idle_ms);
            }
            if coop {
                // Completions run when the task enters the kernel anyway (it always waits in
                // io_uring_enter), so no interrupt is needed to deliver them.
                b.setup_coop_taskrun();
            }
            b.build(entries)
        };
        let uring = match build(true) {
            Ok(r) => r,
            // Kernels before 5.19 do not know COOP_TASKRUN.
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::INVAL.raw_os_error()) => {
                build(false)?
            }
            Err(e) => return Err(e),
        };
        let fixed_files = config.register_files && uring.submitter().register_files(&fds).is_ok();
        Ok(Ring {
            uring,
            generation: fork::generation(),
            fds,
            fixed_files,
            staging: None,
            staging_size,
            staging_unit,
            register_buffers: config.register_buffers,
        })
    }

    /// Whether the ring was set up by a parent of this process (then it must only be
    /// dropped).
    fn inherited(&self) -> bool {
        self.generation != fork::generation()
    }

    /// The staging area, made (and registered, when allowed) on first use. Must only be
    /// called with no op in flight.
    pub(crate) fn staging(&mut self) -> io::Result<&mut Staging> {
        if self.staging.is_none() {
            let mut staging = Staging::new(self.staging_size, self.staging_unit)?;
            if self.register_buffers {
                let iov = rustix::io_uring::iovec {
                    iov_base: staging.base.cast(),
                    iov_len: staging.len,
                };
                // SAFETY: the ring's descriptor is open for as long as `self.uring`, which
                // outlives this call. The iovec describes memory owned by `staging`, which
                // lives in this Ring and is dropped after `uring` (field order), so it stays
                // valid for as long as the registration.
                let res = unsafe {
                    rustix::io_uring::io_uring_register(
                        std::os::fd::BorrowedFd::borrow_raw(self.uring.as_raw_fd()),
                        rustix::io_uring::IoringRegisterOp::RegisterBuffers,
                        std::ptr::from_ref(&iov).cast(),
                        1,
                    )
                };
                // Refused (e.g. RLIMIT_MEMLOCK): plain reads and writes still work.
                staging.registered = res.is_ok();
            }
            self.staging = Some(staging);
        }
        Ok(self.staging.as_mut().expect("made above"))
    }

    /// The staging area when it exists.
    pub(crate) fn staging_mut(&mut self) -> Option<&mut Staging> {
        self.staging.as_mut()
    }

    /// Points the ring at another file's descriptors (one system call when the files are
    /// registered). Must only be called with no op in flight.
    fn retarget(&mut self, fds: [RawFd; 2], register_files: bool) {
        if self.fixed_files {
            if self
                .uring
                .submitter()
                .register_files_update(0, &fds)
                .is_err()
            {
                let _ = self.uring.submitter().unregister_files();
                self.fixed_files = false;
            }
        } else if register_files {
            self.fixed_files = self.uring.submitter().register_files(&fds).is_ok();
        }
        self.fds = fds;
    }

    /// Drops the ring's references to its file's descriptors, so that a ring kept for later
    /// does not hold a closed file open.
    fn detach(&mut self) -> bool {
        if self.fixed_files
            && self
                .uring
                .submitter()
                .register_files_update(0, &[-1, -1])
                .is_err()
        {
            return false;
        }
        self.fds = [-1, -1];
        true
    }
}

/// Rings of closed files, kept for the next file opened with the same settings: setting up a
/// ring and allocating and registering its staging area costs far more than re-pointing its
/// file table, and a file opened for one small transfer should not pay it. In a child made
/// by `fork` the rings inherited here are dropped, never reused (see the module docs).
static SPARE: ForkMutex<Vec<(SpareKey, Ring)>> = ForkMutex::lazy();

/// Rings kept in [`SPARE`] at most.
const MAX_SPARE: usize = 8;

/// What a spare ring must match to be reused.
#[derive(Debug, Clone, PartialEq)]
struct SpareKey {
    config: UringConfig,
    staging_size: usize,
    staging_unit: usize,
}

fn take_spare(key: &SpareKey) -> Option<Ring> {
    let mut spare = SPARE.lock();
    spare.retain(|(_, r)| !r.inherited());
    let i = spare.iter().position(|(k, _)| k == key)?;
    Some(spare.swap_remove(i).1)
}

fn keep_spare(key: SpareKey, ring: Ring) {
    let mut spare = SPARE.lock();
    spare.retain(|(_, r)| !r.inherited());
    if spare.len() < MAX_SPARE {
        spare.push((key, ring));
    }
}

/// The rings of one open file: idle ones wait behind a mutex; a transfer takes one (or sets
/// up a new one when all are busy) and gives it back when done. A file used in a child made
/// by `fork` gets rings of the child's own.
#[derive(Debug)]
pub(crate) struct RingPool {
    idle: ForkMutex<Vec<Ring>>,
    config: UringConfig,
    fds: [RawFd; 2],
    staging_size: usize,
    staging_unit: usize,
}

impl RingPool {
    /// A pool for the descriptors `fds` (`[direct, buffered]`), which must outlive it.
    pub(crate) fn new(config: UringConfig, fds: [RawFd; 2], block: u64) -> Self {
        let staging_size = config.effective_staging(block);
        RingPool {
            idle: ForkMutex::new(Vec::new()),
            config,
            fds,
            staging_size,
            staging_unit: block as usize,
        }
    }

    fn spare_key(&self) -> SpareKey {
        SpareKey {
            config: self.config.clone(),
            staging_size: self.staging_size,
            staging_unit: self.staging_unit,
        }
    }

    /// Takes an idle ring of this file, else a spare ring of a closed file, else sets up a
    /// new one.
    pub(crate) fn take(&self) -> io::Result<RingLease<'_>> {
        let ring = {
            let mut idle = self.idle.lock();
            idle.retain(|r| !r.inherited());
            idle.pop()
        };
        let ring = match ring {
            Some(r) => r,
            None => match take_spare(&self.spare_key()) {
                Some(mut r) => {
                    r.retarget(self.fds, self.config.register_files);
                    r
                }
                None => Ring::new(&self.config, self.fds, self.staging_size, self.staging_unit)?,
            },
        };
        Ok(RingLease {
            ring: Some(ring),
            pool: self,
        })
    }

    fn give_back(&self, ring: Ring) {
        let mut idle = self.idle.lock();
        if idle.len() < self.config.max_idle_rings.max(1) {
            idle.push(ring);
        }
    }
}

impl Drop for RingPool {
    fn drop(&mut self) {
        let key = self.spare_key();
        // `None`: inherited from a parent whose thread held the lock; left alone.
        let Some(idle) = self.idle.get_mut() else {
            return;
        };
        for mut ring in idle.drain(..) {
            // An inherited ring is only dropped: detaching it would change the parent's
            // file table.
            if !ring.inherited() && ring.detach() {
                keep_spare(key.clone(), ring);
            }
        }
    }
}

/// A ring borrowed from a [`RingPool`]; goes back to the pool when dropped (unless a panic
/// is unwinding, in which case the ring is closed).
#[derive(Debug)]
pub(crate) struct RingLease<'p> {
    ring: Option<Ring>,
    pool: &'p RingPool,
}

impl std::ops::Deref for RingLease<'_> {
    type Target = Ring;
    fn deref(&self) -> &Ring {
        self.ring.as_ref().expect("present until drop")
    }
}

impl std::ops::DerefMut for RingLease<'_> {
    fn deref_mut(&mut self) -> &mut Ring {
        self.ring.as_mut().expect("present until drop")
    }
}

impl Drop for RingLease<'_> {
    fn drop(&mut self) {
        if let Some(ring) = self.ring.take() {
            if !std::thread::panicking() {
                self.pool.give_back(ring);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_allocates_first_fit_and_coalesces() {
        let mut s = Staging::new(4 * 4096, 4096).unwrap();
        let a = s.alloc(1).unwrap();
        let b = s.alloc(8192).unwrap();
        let c = s.alloc(4096).unwrap();
        assert_eq!((a, b, c), (0, 4096, 12288));
        assert_eq!(s.alloc(1), None);
        s.release(b, 8192);
        assert_eq!(s.alloc(8193), None);
        s.release(a, 1);
        s.release(c, 4096);
        assert_eq!(s.free.as_slice(), std::slice::from_ref(&(0..16384)));
        assert_eq!(s.alloc(16384), Some(0));
        s.reset();
        assert_eq!(s.free.as_slice(), std::slice::from_ref(&(0..16384)));
    }
}
