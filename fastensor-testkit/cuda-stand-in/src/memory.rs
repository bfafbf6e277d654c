//! Device memory and pinned host memory.
//!
//! Device memory is host memory kept in this module's table. The addresses handed out lie in
//! a range reserved with no access rights (`PROT_NONE`), so a host dereference of a device
//! pointer faults at once; copies translate them with [`device_range`]. Every range in use
//! by a copy is *pinned* (counted in its allocation), and a free that finds its memory still
//! in use is a violation, unless the device is lost (it then waits, so that nothing is read
//! after being unmapped).

use crate::errors::{CUresult, INVALID_VALUE, OUT_OF_MEMORY};
use crate::{context, stats};
use std::collections::BTreeMap;
use std::sync::{Condvar, Mutex, MutexGuard};

/// Address space reserved for device pointers.
const RESERVE: u64 = 1 << 40;
/// Alignment of device allocations (CUDA guarantees at least 256 bytes).
const ALIGN: u64 = 4096;
/// Unused addresses between allocations, so that a pointer past the end of one does not
/// land in the next.
const GAP: u64 = 64 << 10;
/// What new device memory holds (CUDA does not zero it).
const FILL: u8 = 0xDB;

/// One device allocation.
#[derive(Debug)]
struct DeviceAlloc {
    len: usize,
    /// The host memory behind it.
    host: usize,
    device: u32,
    /// Copies using it now.
    pending: u32,
    /// cuFile registrations inside it.
    registrations: u32,
}

#[derive(Debug, Default)]
struct DeviceTable {
    /// The reserved range: base and length.
    region: Option<(u64, u64)>,
    /// Next free address in the region (addresses are never reused).
    next: u64,
    /// Bytes allocated per device.
    used: BTreeMap<u32, u64>,
    allocs: BTreeMap<u64, DeviceAlloc>,
}

static DEVICE: Mutex<DeviceTable> = Mutex::new(DeviceTable {
    region: None,
    next: 0,
    used: BTreeMap::new(),
    allocs: BTreeMap::new(),
});
static DEVICE_IDLE: Condvar = Condvar::new();

fn device_table() -> MutexGuard<'static, DeviceTable> {
    DEVICE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Maps `len` bytes of zeroed read-write memory.
fn map(len: usize) -> Option<*mut u8> {
    // SAFETY: an anonymous private mapping at an address the kernel chooses touches no
    // existing memory.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len.max(1),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p.cast())
}

/// Unmaps memory from [`map`].
///
/// # Safety
/// `p..p + len` must be a mapping from `map` that nothing uses any more.
unsafe fn unmap(p: usize, len: usize) {
    // SAFETY: guaranteed by the caller.
    unsafe { libc::munmap(p as *mut libc::c_void, len.max(1)) };
}

/// Reserves the device address range on first use.
fn region(t: &mut DeviceTable) -> Option<(u64, u64)> {
    if t.region.is_none() {
        for len in [RESERVE, RESERVE >> 4, RESERVE >> 8] {
            // SAFETY: a fresh inaccessible mapping at an address the kernel chooses.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len as usize,
                    libc::PROT_NONE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                t.region = Some((p as u64, len));
                t.next = p as u64 + GAP;
                break;
            }
        }
    }
    t.region
}

/// Allocates `len` bytes on `device`; `limit` is the device's size.
pub(crate) fn alloc_device(len: usize, device: u32, limit: u64) -> Result<u64, CUresult> {
    if len == 0 {
        return Err(INVALID_VALUE);
    }
    let mut t = device_table();
    let (base, rlen) = region(&mut t).ok_or(OUT_OF_MEMORY)?;
    let used = t.used.get(&device).copied().unwrap_or(0);
    let span = (len as u64).div_ceil(ALIGN) * ALIGN;
    if used + len as u64 > limit || t.next + span + GAP > base + rlen {
        return Err(OUT_OF_MEMORY);
    }
    let host = map(len).ok_or(OUT_OF_MEMORY)?;
    // SAFETY: host is a fresh mapping of len bytes.
    unsafe { std::ptr::write_bytes(host, FILL, len) };
    let ptr = t.next;
    t.next += span + GAP;
    *t.used.entry(device).or_insert(0) += len as u64;
    t.allocs.insert(
        ptr,
        DeviceAlloc {
            len,
            host: host as usize,
            device,
            pending: 0,
            registrations: 0,
        },
    );
    drop(t);
    stats::live("device_buffers", 1);
    stats::live("device_bytes", len as i64);
    Ok(ptr)
}

/// Frees the allocation at `ptr` (its base).
pub(crate) fn free_device(ptr: u64) -> Result<(), CUresult> {
    let mut t = device_table();
    let Some(a) = t.allocs.get(&ptr) else {
        drop(t);
        stats::violation(
            "invalid_free",
            &format!("cuMemFree({ptr:#x}): no allocation there"),
        );
        return Err(INVALID_VALUE);
    };
    if a.registrations > 0 {
        stats::violation(
            "freed_while_registered",
            &format!("cuMemFree({ptr:#x}) of memory still registered with cuFileBufRegister"),
        );
    }
    // Once the device is lost, queued copies only fail: freeing under them is safe.
    if a.pending > 0 && context::lost().is_none() {
        stats::violation(
            "freed_while_in_use",
            &format!("cuMemFree({ptr:#x}) while a copy still uses it"),
        );
    }
    if a.pending > 0 {
        while t.allocs.get(&ptr).is_some_and(|a| a.pending > 0) {
            t = DEVICE_IDLE.wait(t).unwrap_or_else(|p| p.into_inner());
        }
    }
    let Some(a) = t.allocs.remove(&ptr) else {
        return Err(INVALID_VALUE); // freed by another thread meanwhile
    };
    if let Some(u) = t.used.get_mut(&a.device) {
        *u -= a.len as u64;
    }
    drop(t);
    // SAFETY: the allocation left the table with no copy pending, so nothing uses it.
    unsafe { unmap(a.host, a.len) };
    stats::live("device_buffers", -1);
    stats::live("device_bytes", -(a.len as i64));
    Ok(())
}

/// Bytes allocated on `device`.
pub(crate) fn device_used(device: u32) -> u64 {
    device_table().used.get(&device).copied().unwrap_or(0)
}

/// True when `ptr` lies in the reserved device range (allocated or not).
pub(crate) fn is_device_address(ptr: u64) -> bool {
    device_table()
        .region
        .is_some_and(|(base, len)| ptr >= base && ptr < base + len)
}

/// The allocation holding `ptr`: its base, length and device.
pub(crate) fn device_allocation(ptr: u64) -> Option<(u64, usize, u32)> {
    let t = device_table();
    let (&base, a) = t.allocs.range(..=ptr).next_back()?;
    (ptr < base + a.len as u64).then_some((base, a.len, a.device))
}

/// Adds `delta` to the cuFile registrations counted in the allocation at `base`.
pub(crate) fn count_registration(base: u64, delta: i32) {
    if let Some(a) = device_table().allocs.get_mut(&base) {
        a.registrations = a.registrations.saturating_add_signed(delta);
    }
}

/// Device memory in use by one copy: the host memory behind it, kept mapped until dropped.
#[derive(Debug)]
pub(crate) struct DeviceRange {
    /// Host address of the first byte.
    pub host: *mut u8,
    /// Length in bytes.
    pub len: usize,
    /// The device of the allocation.
    pub device: u32,
    alloc: u64,
}

// SAFETY: the range is plain memory kept mapped by its pin; copies of it are ordered by the
// streams and the callers' contracts, as on a GPU.
unsafe impl Send for DeviceRange {}

impl Drop for DeviceRange {
    fn drop(&mut self) {
        let mut t = device_table();
        if let Some(a) = t.allocs.get_mut(&self.alloc) {
            a.pending -= 1;
        }
        drop(t);
        DEVICE_IDLE.notify_all();
    }
}

/// Translates `ptr + offset .. + len`, where `ptr` lies in an allocation, and pins it. A
/// pointer outside device memory or a range leaving its allocation is a violation named
/// after `call`.
pub(crate) fn device_range(
    call: &str,
    ptr: u64,
    offset: u64,
    len: usize,
) -> Result<DeviceRange, CUresult> {
    let mut t = device_table();
    let in_region = t
        .region
        .is_some_and(|(base, rlen)| ptr >= base && ptr < base + rlen);
    let found = t
        .allocs
        .range_mut(..=ptr)
        .next_back()
        .filter(|(&base, a)| ptr < base + a.len as u64);
    let Some((&base, a)) = found else {
        drop(t);
        let kind = if in_region {
            "out_of_bounds"
        } else {
            "not_device_memory"
        };
        stats::violation(
            kind,
            &format!("{call}: {ptr:#x} is not in any device allocation"),
        );
        return Err(INVALID_VALUE);
    };
    let start = ptr - base + offset;
    if start
        .checked_add(len as u64)
        .is_none_or(|end| end > a.len as u64)
    {
        let msg = format!(
            "{call}: bytes {start}..{} of a {}-byte allocation at {base:#x}",
            start.saturating_add(len as u64),
            a.len
        );
        drop(t);
        stats::violation("out_of_bounds", &msg);
        return Err(INVALID_VALUE);
    }
    a.pending += 1;
    Ok(DeviceRange {
        host: (a.host + start as usize) as *mut u8,
        len,
        device: a.device,
        alloc: base,
    })
}

/// Whether a host range is page-locked memory from `cuMemHostAlloc` or `cuMemHostRegister`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HostKind {
    Allocated,
    Registered,
}

#[derive(Debug)]
struct HostRange {
    len: usize,
    kind: HostKind,
    pending: u32,
}

static PINNED: Mutex<BTreeMap<usize, HostRange>> = Mutex::new(BTreeMap::new());
static PINNED_IDLE: Condvar = Condvar::new();
static PINNED_BYTES: Mutex<u64> = Mutex::new(0);

fn pinned_table() -> MutexGuard<'static, BTreeMap<usize, HostRange>> {
    PINNED.lock().unwrap_or_else(|p| p.into_inner())
}

/// Allocates `len` bytes of "page-locked" host memory, within `limit` bytes in all.
pub(crate) fn alloc_pinned(len: usize, limit: u64) -> Result<*mut u8, CUresult> {
    {
        let mut bytes = PINNED_BYTES.lock().unwrap_or_else(|p| p.into_inner());
        if *bytes + len as u64 > limit {
            return Err(OUT_OF_MEMORY);
        }
        *bytes += len as u64;
    }
    let Some(p) = map(len) else {
        *PINNED_BYTES.lock().unwrap_or_else(|p| p.into_inner()) -= len as u64;
        return Err(OUT_OF_MEMORY);
    };
    pinned_table().insert(
        p as usize,
        HostRange {
            len,
            kind: HostKind::Allocated,
            pending: 0,
        },
    );
    stats::live("pinned_buffers", 1);
    stats::live("pinned_bytes", len as i64);
    Ok(p)
}

/// Removes the range at `p` of `kind`, waiting (and counting a violation) while a copy uses
/// it; returns its length.
fn remove_host(call: &str, p: usize, kind: HostKind) -> Result<usize, CUresult> {
    let mut t = pinned_table();
    match t.get(&p) {
        Some(r) if r.kind == kind => {
            if r.pending > 0 && context::lost().is_none() {
                stats::violation(
                    "freed_while_in_use",
                    &format!("{call}({p:#x}) while an asynchronous copy still uses it"),
                );
            }
        }
        _ => {
            drop(t);
            stats::violation(
                "invalid_free",
                &format!("{call}({p:#x}): not from the matching call"),
            );
            return Err(INVALID_VALUE);
        }
    }
    while t.get(&p).is_some_and(|r| r.pending > 0) {
        t = PINNED_IDLE.wait(t).unwrap_or_else(|p| p.into_inner());
    }
    t.remove(&p).map(|r| r.len).ok_or(INVALID_VALUE)
}

/// Frees memory from [`alloc_pinned`].
pub(crate) fn free_pinned(p: usize) -> Result<(), CUresult> {
    let len = remove_host("cuMemFreeHost", p, HostKind::Allocated)?;
    *PINNED_BYTES.lock().unwrap_or_else(|p| p.into_inner()) -= len as u64;
    // SAFETY: the range left the table with no copy pending.
    unsafe { unmap(p, len) };
    stats::live("pinned_buffers", -1);
    stats::live("pinned_bytes", -(len as i64));
    Ok(())
}

/// Records `p..p + len` (caller's memory) as page-locked.
pub(crate) fn register_host(p: usize, len: usize) -> Result<(), CUresult> {
    let mut t = pinned_table();
    let overlaps = t
        .range(..p.saturating_add(len))
        .next_back()
        .is_some_and(|(&b, r)| b + r.len > p);
    if overlaps || len == 0 {
        return Err(INVALID_VALUE);
    }
    t.insert(
        p,
        HostRange {
            len,
            kind: HostKind::Registered,
            pending: 0,
        },
    );
    drop(t);
    stats::live("host_registrations", 1);
    Ok(())
}

/// Forgets a registration from [`register_host`].
pub(crate) fn unregister_host(p: usize) -> Result<(), CUresult> {
    remove_host("cuMemHostUnregister", p, HostKind::Registered)?;
    stats::live("host_registrations", -1);
    Ok(())
}

/// The page-locked range holding `p`: its base and length.
pub(crate) fn pinned_allocation(p: usize) -> Option<(usize, usize)> {
    let t = pinned_table();
    let (&base, r) = t.range(..=p).next_back()?;
    (p < base + r.len).then_some((base, r.len))
}

/// Page-locked host memory in use by an asynchronous copy, pinned until dropped.
#[derive(Debug)]
pub(crate) struct HostPin {
    base: usize,
}

impl Drop for HostPin {
    fn drop(&mut self) {
        if let Some(r) = pinned_table().get_mut(&self.base) {
            r.pending -= 1;
        }
        PINNED_IDLE.notify_all();
    }
}

/// Pins `p..p + len` when it lies in page-locked memory; `None` for pageable memory.
pub(crate) fn pin_host(p: usize, len: usize) -> Option<HostPin> {
    let mut t = pinned_table();
    let (&base, r) = t.range_mut(..=p).next_back()?;
    if p.checked_add(len)? > base + r.len {
        return None;
    }
    r.pending += 1;
    Some(HostPin { base })
}
