//! `Throttled`: wraps any backend and charges each transfer a known cost, per call and per
//! byte, so that selection can be tested deterministically (object_store's `ThrottledStore`).
//!
//! The cost is either slept ([`Timing::Sleep`]) or added to a [`VirtualClock`]
//! ([`Timing::Virtual`]) that the code under test reads as its clock: nothing sleeps, and the
//! measured durations are exact. Costs can be changed while files are open
//! ([`Throttled::set_costs`]), to simulate a device that slows down.
//!
//! ```
//! use fastensor_testkit::throttled::{Cost, Costs, Throttled, VirtualClock};
//! use fastensor_testkit::MemoryBackend;
//! use std::sync::Arc;
//!
//! let clock = VirtualClock::new();
//! let store = Arc::new(MemoryBackend::new());
//! let slow = Throttled::virtual_clock("slow", store, Costs::uniform(Cost::new(100_000, 1.0)), &clock);
//! # let _ = slow;
//! ```

use fastensor_core::{
    open_inner, Backend, BackendFile, Capabilities, Error, ErrorKind, LayeredBackend, LayeredFile,
    MemMut, MemRef, OpenMode, ReadRequest, Result, SharedBackend, WriteRequest,
};
use parking_lot::RwLock;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A clock that only moves when told to: wall-clock and CPU nanoseconds. Clones share the
/// same time.
#[derive(Debug, Clone, Default)]
pub struct VirtualClock {
    wall_ns: Arc<AtomicU64>,
    cpu_ns: Arc<AtomicU64>,
}

impl VirtualClock {
    /// A clock at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves the clock forward.
    pub fn advance(&self, wall: Duration, cpu: Duration) {
        self.wall_ns.fetch_add(nanos(wall), Ordering::SeqCst);
        self.cpu_ns.fetch_add(nanos(cpu), Ordering::SeqCst);
    }

    /// Wall-clock time so far.
    pub fn wall(&self) -> Duration {
        Duration::from_nanos(self.wall_ns.load(Ordering::SeqCst))
    }

    /// CPU time so far.
    pub fn cpu(&self) -> Duration {
        Duration::from_nanos(self.cpu_ns.load(Ordering::SeqCst))
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The cost of one kind of transfer: `per_call + bytes * per_byte`, in wall-clock time, and
/// the CPU time it takes.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Cost {
    /// Fixed wall-clock nanoseconds per call.
    pub call_ns: u64,
    /// Wall-clock nanoseconds per byte.
    pub byte_ns: f64,
    /// CPU nanoseconds per call.
    pub cpu_call_ns: u64,
    /// CPU nanoseconds per byte.
    pub cpu_byte_ns: f64,
}

impl Cost {
    /// A wall-clock cost with no CPU time.
    pub fn new(call_ns: u64, byte_ns: f64) -> Self {
        Cost {
            call_ns,
            byte_ns,
            ..Cost::default()
        }
    }

    /// The same cost, also taking CPU time.
    pub fn with_cpu(mut self, cpu_call_ns: u64, cpu_byte_ns: f64) -> Self {
        self.cpu_call_ns = cpu_call_ns;
        self.cpu_byte_ns = cpu_byte_ns;
        self
    }

    /// Wall-clock and CPU time of a transfer of `bytes`.
    pub fn of(&self, bytes: u64) -> (Duration, Duration) {
        let wall = self.call_ns as f64 + self.byte_ns * bytes as f64;
        let cpu = self.cpu_call_ns as f64 + self.cpu_byte_ns * bytes as f64;
        (
            Duration::from_nanos(wall.max(0.0) as u64),
            Duration::from_nanos(cpu.max(0.0) as u64),
        )
    }
}

/// The costs of reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Costs {
    /// Cost of a read.
    pub read: Cost,
    /// Cost of a write.
    pub write: Cost,
}

impl Costs {
    /// The same cost both ways.
    pub fn uniform(cost: Cost) -> Self {
        Costs {
            read: cost,
            write: cost,
        }
    }
}

/// How a [`Throttled`] backend spends its cost.
#[derive(Debug, Clone)]
pub enum Timing {
    /// `std::thread::sleep` for the wall-clock cost (CPU cost is not spent).
    Sleep,
    /// Advance this clock; never sleep.
    Virtual(VirtualClock),
}

#[derive(Debug)]
struct Shared {
    costs: RwLock<Costs>,
    timing: Timing,
    calls: AtomicU64,
    bytes: AtomicU64,
}

impl Shared {
    fn charge(&self, cost: Cost, bytes: u64) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        let (wall, cpu) = cost.of(bytes);
        match &self.timing {
            Timing::Sleep => std::thread::sleep(wall),
            Timing::Virtual(clock) => clock.advance(wall, cpu),
        }
    }
}

/// A backend that forwards to another one (a [`LayeredBackend`]) and charges a known cost per
/// call and per byte, under its own name. Wrapping the same inner backend several times gives several
/// "backends" that share the same files (so data written through one is read through
/// another), each with its own costs.
#[derive(Clone)]
pub struct Throttled {
    name: String,
    inner: SharedBackend,
    capabilities: Option<Capabilities>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Throttled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Throttled")
            .field("name", &self.name)
            .field("inner", &self.inner.name())
            .field("costs", &*self.shared.costs.read())
            .field("timing", &self.shared.timing)
            .finish()
    }
}

impl Throttled {
    /// Wraps `inner` under `name` with these costs and timing.
    pub fn new(
        name: impl Into<String>,
        inner: SharedBackend,
        costs: Costs,
        timing: Timing,
    ) -> Self {
        Throttled {
            name: name.into(),
            inner,
            capabilities: None,
            shared: Arc::new(Shared {
                costs: RwLock::new(costs),
                timing,
                calls: AtomicU64::new(0),
                bytes: AtomicU64::new(0),
            }),
        }
    }

    /// Wraps `inner` under `name`, charging `costs` to `clock` (nothing sleeps).
    pub fn virtual_clock(
        name: impl Into<String>,
        inner: SharedBackend,
        costs: Costs,
        clock: &VirtualClock,
    ) -> Self {
        Self::new(name, inner, costs, Timing::Virtual(clock.clone()))
    }

    /// Reports these capabilities instead of the inner backend's (e.g. read-only).
    pub fn with_capabilities(mut self, capabilities: Capabilities) -> Self {
        self.capabilities = Some(capabilities);
        self
    }

    /// Changes the costs, for every file already open too.
    pub fn set_costs(&self, costs: Costs) {
        *self.shared.costs.write() = costs;
    }

    /// The current costs.
    pub fn costs(&self) -> Costs {
        *self.shared.costs.read()
    }

    /// Transfers charged so far (every request of a batch counts).
    pub fn calls(&self) -> u64 {
        self.shared.calls.load(Ordering::Relaxed)
    }

    /// Bytes charged so far.
    pub fn bytes(&self) -> u64 {
        self.shared.bytes.load(Ordering::Relaxed)
    }
}

impl LayeredBackend for Throttled {
    fn inner(&self) -> &dyn Backend {
        &*self.inner
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn capabilities(&self) -> Capabilities {
        self.capabilities
            .clone()
            .unwrap_or_else(|| self.inner.capabilities())
    }

    fn open(&self, path: &Path, mode: OpenMode) -> Result<Box<dyn BackendFile>> {
        if mode.writable() && !LayeredBackend::capabilities(self).write {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!("backend `{}` is read-only", self.name),
            )
            .with_backend(self.name.clone())
            .with_path(path));
        }
        let inner = open_inner(self, path, mode)?;
        self.wrap(inner, path, mode)
    }

    fn wrap(
        &self,
        inner: Box<dyn BackendFile>,
        _path: &Path,
        _mode: OpenMode,
    ) -> Result<Box<dyn BackendFile>> {
        Ok(Box::new(ThrottledFile {
            inner,
            shared: self.shared.clone(),
        }))
    }
}

struct ThrottledFile {
    inner: Box<dyn BackendFile>,
    shared: Arc<Shared>,
}

impl ThrottledFile {
    fn read_cost(&self) -> Cost {
        self.shared.costs.read().read
    }

    fn write_cost(&self) -> Cost {
        self.shared.costs.read().write
    }
}

impl LayeredFile for ThrottledFile {
    fn inner(&self) -> &dyn BackendFile {
        &*self.inner
    }

    fn read_at(&self, offset: u64, dst: MemMut<'_>) -> Result<usize> {
        let want = dst.len() as u64;
        let n = self.inner.read_at(offset, dst)?;
        self.shared.charge(self.read_cost(), want);
        Ok(n)
    }

    fn write_at(&self, offset: u64, src: MemRef<'_>) -> Result<()> {
        let len = src.len() as u64;
        self.inner.write_at(offset, src)?;
        self.shared.charge(self.write_cost(), len);
        Ok(())
    }

    fn read_batch(&self, requests: &mut [ReadRequest<'_>]) -> Result<()> {
        self.inner.read_batch(requests)?;
        for r in requests.iter() {
            self.shared.charge(self.read_cost(), r.dst.len() as u64);
        }
        Ok(())
    }

    fn write_batch(&self, requests: &[WriteRequest<'_>]) -> Result<()> {
        self.inner.write_batch(requests)?;
        for r in requests {
            self.shared.charge(self.write_cost(), r.src.len() as u64);
        }
        Ok(())
    }
}
