//! What an [`OffloadStore`](super::OffloadStore), its I/O threads and its handles share:
//! the swap file, the state under its lock, the condition variables, the host pool and the
//! per-GPU copies.

use super::allocator::round_up;
use super::state::{Home, State};
use super::swap::SwapFile;
use super::HostPool;
use super::OffloadConfig;
use fastensor_core::device_copies::{DeviceCopies, DeviceRuntime};
use fastensor_core::{Error, ErrorKind, HostBuffer, Result};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long a copy waits for pinned memory to come back to its pool before failing.
pub const PINNED_WAIT: Duration = Duration::from_secs(60);

/// What the store, its I/O threads and its handles share.
pub(crate) struct Shared {
    pub(crate) file: SwapFile,
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
    /// Where the buffers of reads back come from (see [`OffloadStore::pool`]).
    pub(crate) pool: Arc<HostPool>,
    /// The copies of each GPU that put a tensor here, made on its first one.
    copies: Mutex<HashMap<u32, Arc<dyn DeviceCopies>>>,
}

impl Shared {
    /// The shared part of a new store over `file` (the opener's handle on `swap`, opened
    /// as `path`).
    pub(crate) fn new(
        file: SwapFile,
        path: PathBuf,
        swap: std::fs::File,
        config: &OffloadConfig,
    ) -> Shared {
        Shared {
            file,
            path,
            swap,
            config: config.clone(),
            state: Mutex::new(State::new(
                config.budget,
                config.device_budget,
                config.prefetch_depth,
            )),
            work: Condvar::new(),
            changed: Condvar::new(),
            pool: config.pool.clone().unwrap_or_default(),
            copies: Mutex::new(HashMap::new()),
        }
    }

    /// Wakes every `put` and `get` waiting for a change.
    pub(crate) fn notify_changed(&self) {
        self.changed.notify_all();
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn wait<'a>(&self, st: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.changed.wait(st).unwrap_or_else(|p| p.into_inner())
    }

    /// Starts the prefetches now possible and wakes the waiters.
    pub(crate) fn after_change(&self, st: &mut State) {
        if st.pump() {
            self.work.notify_all();
        }
        self.changed.notify_all();
    }

    /// The device library of GPU tensors ([`OffloadConfig::device_runtime`]), or an
    /// [`ErrorKind::Unsupported`] error saying there is none.
    pub(crate) fn runtime(&self) -> Result<&Arc<dyn DeviceRuntime>> {
        self.config.device_runtime.as_ref().ok_or_else(|| {
            Error::new(
                ErrorKind::Unsupported,
                "GPU tensors need a device runtime: this store has none \
                 (OffloadConfig::device_runtime; CUDA's is fastensor-gds's CudaRuntime, \
                 in the `gds` feature of fastensor)",
            )
        })
    }

    /// The copies of GPU `gpu` (made on first use, with a pinned pool of the budget's size).
    pub(crate) fn copies(&self, gpu: u32) -> Result<Arc<dyn DeviceCopies>> {
        let mut map = self.copies.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = map.get(&gpu) {
            return Ok(e.clone());
        }
        let engine = self.runtime()?.copies(gpu, self.config.budget)?;
        map.insert(gpu, engine.clone());
        Ok(engine)
    }

    /// The copies of GPU `gpu`, if made.
    pub(crate) fn copies_made(&self, gpu: u32) -> Option<Arc<dyn DeviceCopies>> {
        let map = self.copies.lock().unwrap_or_else(|p| p.into_inner());
        map.get(&gpu).cloned()
    }

    /// Waits until `len` more bytes fit in `home`'s budget, making room by dropping kept
    /// tensors and writing unwritten ones ([`State::evict_for`], again after every change:
    /// another put may take the room a write freed); the time is counted as the puts' wait.
    pub(crate) fn wait_for_room<'a>(
        &self,
        mut st: MutexGuard<'a, State>,
        home: Home,
        len: u64,
    ) -> MutexGuard<'a, State> {
        self.wake_for(st.evict_for(home, len));
        if !st.fits(home, len) {
            let t0 = Instant::now();
            st.put_waiters += 1;
            while !st.fits(home, len) {
                st = self.wait(st);
                self.wake_for(st.evict_for(home, len));
            }
            st.put_waiters -= 1;
            st.stats.put_wait += t0.elapsed();
        }
        st
    }

    /// Wakes I/O threads for `jobs` new jobs.
    pub(crate) fn wake_for(&self, jobs: usize) {
        match jobs {
            0 => {}
            1 => self.work.notify_one(),
            _ => self.work.notify_all(),
        }
    }

    /// An extent of `len` bytes of the swap file, growing the file when none is free.
    pub(crate) fn extent_for(&self, st: &mut State, len: u64) -> Result<super::Extent> {
        loop {
            match st.alloc.alloc(len) {
                Ok(x) => return Ok(x),
                Err(needed) => self.grow(st, needed)?,
            }
        }
    }

    /// A copy of `bytes` in a block of the pool.
    pub(crate) fn copy_to_pool(&self, bytes: &[u8]) -> Result<HostBuffer> {
        let mut buf = self.pool.take(bytes.len())?;
        buf[..bytes.len()].copy_from_slice(bytes);
        buf.truncate(bytes.len());
        Ok(buf)
    }

    /// Grows the swap file to at least `needed` bytes (doubling it at least). Changing a
    /// file's size waits for the direct writes in flight on it (the file system's rule), so
    /// growth is rare: doubling, or [`OffloadConfig::initial_capacity`] reserved at once.
    pub(crate) fn grow(&self, st: &mut State, needed: u64) -> Result<()> {
        let cap = st.alloc.capacity();
        let new = round_up(needed.max(cap * 2));
        self.file.set_len(new)?;
        // Best effort: reserve the blocks so later writes do not allocate.
        let flags = rustix::fs::FallocateFlags::KEEP_SIZE;
        let _ = rustix::fs::fallocate(&self.swap, flags, cap, new - cap);
        st.alloc.grow_to(new);
        Ok(())
    }
}
