//! [`DeviceBuffer`]: GPU memory owned by fastensor, usable wherever a host buffer is.
//!
//! Every live buffer is recorded in a process-wide table, so the `gds` backend can tell
//! whether a device pointer lies in memory it may register with cuFile (and deregister when
//! the buffer is freed). Pointers from other libraries are transferred without registration.

use crate::cuda::{self, device_error};
use cudarc::driver::result;
use fastensor_core::{
    DeviceRange, DeviceSlice, DeviceSliceMut, Error, ErrorKind, MemMut, MemRef, Result,
};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::ops::Deref;

/// One live allocation in the table.
#[derive(Debug)]
pub(crate) struct Allocation {
    /// Length in bytes.
    pub len: usize,
    /// Transfers that used this allocation so far.
    pub uses: u32,
    /// Registered with cuFile (`cuFileBufRegister`).
    pub registered: bool,
}

/// Live device buffers by base address.
pub(crate) static ALLOCATIONS: Mutex<BTreeMap<u64, Allocation>> = Mutex::new(BTreeMap::new());

/// Device memory on one GPU, freed on drop. It dereferences to its [`DeviceRange`]
/// (address, length, GPU).
#[derive(Debug)]
pub struct DeviceBuffer {
    range: DeviceRange,
}

impl Deref for DeviceBuffer {
    type Target = DeviceRange;

    fn deref(&self) -> &DeviceRange {
        &self.range
    }
}

impl DeviceBuffer {
    /// `len` zeroed bytes on GPU `ordinal`. Without CUDA this is an
    /// [`ErrorKind::Unavailable`] error saying why, never a panic.
    pub fn new(len: usize, ordinal: u32) -> Result<Self> {
        let driver = cuda::require()?;
        driver.bind(ordinal)?;
        if len == 0 {
            return Ok(DeviceBuffer {
                range: DeviceRange::new(0, len, ordinal),
            });
        }
        // SAFETY: the driver is initialised and a context is current; the memory is zeroed
        // before anyone reads it.
        let ptr = unsafe { result::malloc_sync(len) }.map_err(|e| {
            device_error(&format!("cannot allocate {len} bytes on GPU {ordinal}"), e)
        })?;
        let buf = DeviceBuffer {
            range: DeviceRange::new(ptr, len, ordinal),
        };
        // SAFETY: ptr..ptr+len was just allocated in the current context.
        unsafe { result::memset_d8_sync(ptr, 0, len) }
            .map_err(|e| device_error("cuMemsetD8 failed", e))?;
        ALLOCATIONS.lock().insert(
            ptr,
            Allocation {
                len,
                uses: 0,
                registered: false,
            },
        );
        Ok(buf)
    }

    /// A buffer on GPU `ordinal` holding a copy of `data`.
    pub fn from_host(data: &[u8], ordinal: u32) -> Result<Self> {
        let mut buf = Self::new(data.len(), ordinal)?;
        buf.copy_from_host(0, data)?;
        Ok(buf)
    }

    /// The device address of the first byte ([`DeviceRange::ptr`]).
    pub fn device_ptr(&self) -> u64 {
        self.ptr()
    }

    /// The whole buffer as a transfer source.
    pub fn as_mem(&self) -> MemRef<'_> {
        MemRef::Device(self.slice(0, self.len()))
    }

    /// The whole buffer as a transfer destination.
    pub fn as_mem_mut(&mut self) -> MemMut<'_> {
        let len = self.len();
        MemMut::Device(self.slice_mut(0, len))
    }

    /// The bytes `start..start + len` as a device slice. Panics when out of range.
    pub fn slice(&self, start: usize, len: usize) -> DeviceSlice<'_> {
        self.check(start, len);
        // SAFETY: the range lies in memory this buffer owns on GPU `ordinal`; the borrow of
        // self keeps it allocated and unwritten through this buffer for the slice's lifetime.
        unsafe { DeviceSlice::from_raw(self.ptr() + start as u64, len, self.ordinal()) }
    }

    /// The bytes `start..start + len` as a mutable device slice. Panics when out of range.
    pub fn slice_mut(&mut self, start: usize, len: usize) -> DeviceSliceMut<'_> {
        self.check(start, len);
        // SAFETY: as in `slice`, and the exclusive borrow of self rules out other access.
        unsafe { DeviceSliceMut::from_raw(self.ptr() + start as u64, len, self.ordinal()) }
    }

    fn check(&self, start: usize, len: usize) {
        assert!(
            start.checked_add(len).is_some_and(|e| e <= self.len()),
            "device buffer range {start}+{len} out of 0..{}",
            self.len()
        );
    }

    /// Copies `src` into the buffer at `offset`.
    pub fn copy_from_host(&mut self, offset: usize, src: &[u8]) -> Result<()> {
        self.range_ok(offset, src.len())?;
        copy_to_device(self.ptr() + offset as u64, self.ordinal(), src)
    }

    /// Copies the buffer's bytes at `offset` into `dst`.
    pub fn copy_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.range_ok(offset, dst.len())?;
        copy_to_host(self.ptr() + offset as u64, self.ordinal(), dst)
    }

    /// The whole buffer copied to a new vector.
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.len()];
        self.copy_to_host(0, &mut out)?;
        Ok(out)
    }

    fn range_ok(&self, offset: usize, len: usize) -> Result<()> {
        if offset.checked_add(len).is_some_and(|e| e <= self.len()) {
            Ok(())
        } else {
            Err(Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "range {offset}+{len} is outside the device buffer of {} bytes",
                    self.len()
                ),
            ))
        }
    }
}

/// Copies host bytes to device memory at `dst` on GPU `ordinal` (synchronously).
pub fn copy_to_device(dst: u64, ordinal: u32, src: &[u8]) -> Result<()> {
    if src.is_empty() {
        return Ok(());
    }
    cuda::require()?.bind(ordinal)?;
    // SAFETY: callers pass a device range of at least src.len() bytes that they may write
    // (a DeviceSliceMut or a DeviceBuffer they own); the copy is synchronous.
    unsafe { result::memcpy_htod_sync(dst, src) }
        .map_err(|e| device_error("cuMemcpyHtoD failed", e))
}

/// Copies device memory at `src` on GPU `ordinal` to host bytes (synchronously).
pub fn copy_to_host(src: u64, ordinal: u32, dst: &mut [u8]) -> Result<()> {
    if dst.is_empty() {
        return Ok(());
    }
    cuda::require()?.bind(ordinal)?;
    // SAFETY: callers pass a device range of at least dst.len() readable bytes; the copy is
    // synchronous, so dst is written before this returns.
    unsafe { result::memcpy_dtoh_sync(dst, src) }
        .map_err(|e| device_error("cuMemcpyDtoH failed", e))
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.is_empty() {
            return;
        }
        let registered = ALLOCATIONS
            .lock()
            .remove(&self.ptr())
            .is_some_and(|a| a.registered);
        let Ok(driver) = cuda::driver() else { return };
        if driver.bind(self.ordinal()).is_err() {
            return;
        }
        if registered {
            crate::cufile::deregister_buffer(self.ptr());
        }
        // SAFETY: ptr came from cuMemAlloc in this context and is freed once; every transfer
        // borrowing the buffer has ended (the borrow checker guarantees it).
        let _ = unsafe { result::free_sync(self.ptr()) };
    }
}
