//! Reads and writes between a registered file and device memory, for `cuFileRead`,
//! `cuFileWrite` and the batch API: arguments checked and device memory pinned
//! ([`prepare`]), faults injected, and descriptors opened with `O_DIRECT` read and written
//! through page-aligned bounce buffers at aligned offsets, as direct I/O requires.

use crate::cufile::{self, CUfileError, RegisteredFile};
use crate::errors::cufile as e;
use crate::memory::{self, DeviceRange};
use crate::{config, context, stats};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};

/// Direct I/O alignment.
const BLOCK: u64 = 4096;
/// Largest bounce buffer.
const PIECE: usize = 4 << 20;

/// What one read or write does when a fault fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    None,
    Error,
    Short,
    Zero,
}

static READS: AtomicU64 = AtomicU64::new(0);
static WRITES: AtomicU64 = AtomicU64::new(0);

/// The fault, if any, for the next read.
pub(crate) fn read_fault() -> Fault {
    let f = &config::get().faults;
    // One call number for every read fault.
    let n = READS.fetch_add(1, Ordering::SeqCst);
    let hit = |from: Option<u64>| from.is_some_and(|from| n >= from);
    let fault = if hit(f.read_error_from) {
        Fault::Error
    } else if hit(f.zero_read_from) {
        Fault::Zero
    } else if hit(f.short_read_from) {
        Fault::Short
    } else {
        Fault::None
    };
    match fault {
        Fault::Error => stats::fault("read-error"),
        Fault::Zero => stats::fault("zero-read"),
        Fault::Short => stats::fault("short-read"),
        Fault::None => {}
    }
    fault
}

/// A read or write from or to a registered file: device memory translated and pinned.
#[derive(Debug)]
pub(crate) struct Io {
    pub file: RegisteredFile,
    pub device: DeviceRange,
    pub offset: u64,
}

/// Resolves the arguments of a cuFile read or write; errors are `CUfileOpError` values.
pub(crate) fn prepare(
    call: &str,
    fh: *mut c_void,
    base: u64,
    size: usize,
    file_offset: i64,
    buf_offset: i64,
) -> Result<Io, CUfileError> {
    cufile::ready()?;
    let file = cufile::file(call, fh)?;
    let current = context::current(call).map_err(CUfileError::cuda)?;
    let (Ok(offset), Ok(skip)) = (u64::try_from(file_offset), u64::try_from(buf_offset)) else {
        return Err(CUfileError::op(e::INVALID_VALUE));
    };
    if memory::device_allocation(base).is_none() {
        stats::violation(
            "not_device_memory",
            &format!("{call}: {base:#x} is not device memory"),
        );
        return Err(CUfileError::op(e::CUDA_POINTER_INVALID));
    }
    let device = memory::device_range(call, base, skip, size)
        .map_err(|_| CUfileError::op(e::CUDA_POINTER_RANGE_ERROR))?;
    if device.device != current {
        stats::violation(
            "context_mismatch",
            &format!(
                "{call}: memory of device {} with device {current}'s context current",
                device.device
            ),
        );
        return Err(CUfileError::op(e::CUDA_CONTEXT_MISMATCH));
    }
    Ok(Io {
        file,
        device,
        offset,
    })
}

/// Why a read or write failed: an OS error (`errno`) or a `CUfileOpError`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    Os(c_int),
    Op(c_int),
}

impl Failure {
    /// What cuFileRead and cuFileWrite return for it (setting `errno` for an OS error).
    pub(crate) fn returned(self) -> isize {
        match self {
            Failure::Os(code) => {
                // SAFETY: __errno_location returns this thread's errno.
                unsafe { *libc::__errno_location() = code };
                -1
            }
            Failure::Op(code) => -(code as isize),
        }
    }
}

/// Counts `bytes` moved to or from the device; a lost device is `CU_FILE_CUDA_DRIVER_ERROR`.
fn account(bytes: usize) -> Result<(), Failure> {
    context::account(bytes).map_err(|_| Failure::Op(e::CUDA_DRIVER_ERROR))
}

/// Reads into `io`'s device memory: the bytes read (short only at the end of the file, or
/// when a fault says so).
pub(crate) fn read(io: &Io, fault: Fault) -> Result<usize, Failure> {
    let want = match fault {
        Fault::Error => return Err(Failure::Os(libc::EIO)),
        Fault::Zero => return Ok(0),
        Fault::Short => io.device.len.div_ceil(2),
        Fault::None => io.device.len,
    };
    account(want)?;
    let n = pread_into(io.file, io.offset, io.device.host, want).map_err(Failure::Os)?;
    stats::add("bytes.cufile_read", n as i64);
    Ok(n)
}

/// Writes `io`'s device memory to the file: every byte.
pub(crate) fn write(call: &str, io: &Io) -> Result<usize, Failure> {
    let f = config::get().faults.write_error_from;
    if context::fault_fires("write-error", &WRITES, f) {
        return Err(Failure::Os(libc::EIO));
    }
    let len = io.device.len;
    account(len)?;
    if io.file.direct && (!io.offset.is_multiple_of(BLOCK) || !(len as u64).is_multiple_of(BLOCK)) {
        stats::violation(
            "unaligned_cufile_write",
            &format!(
                "{call}: {len} bytes at {} on an O_DIRECT file: direct I/O needs 4096-byte \
                 alignment (cuFile would read, modify and write the blocks around it)",
                io.offset
            ),
        );
        return Err(Failure::Os(libc::EINVAL));
    }
    pwrite_from(io.file, io.offset, io.device.host, len).map_err(Failure::Os)?;
    stats::add("bytes.cufile_write", len as i64);
    Ok(len)
}

/// A page-aligned buffer for direct I/O.
struct Bounce {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl Bounce {
    fn new(len: usize) -> Result<Self, c_int> {
        let layout = std::alloc::Layout::from_size_align(len.max(1), BLOCK as usize)
            .map_err(|_| libc::EINVAL)?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            return Err(libc::ENOMEM);
        }
        Ok(Bounce { ptr, layout })
    }
}

impl Drop for Bounce {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

/// `pread` until `len` bytes or the end of the file; the bytes read.
fn pread_full(fd: c_int, buf: *mut u8, len: usize, offset: u64) -> Result<usize, c_int> {
    let mut done = 0;
    while done < len {
        // SAFETY: buf is writable for len bytes (callers' contract).
        let n = unsafe {
            libc::pread(
                fd,
                buf.add(done).cast(),
                len - done,
                (offset + done as u64) as libc::off_t,
            )
        };
        match n {
            0 => break,
            n if n > 0 => done += n as usize,
            _ => match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(code) => return Err(code),
                None => return Err(libc::EIO),
            },
        }
    }
    Ok(done)
}

/// Reads `len` bytes at `offset` of `file` into `dst`: through aligned bounce buffers when
/// the descriptor has `O_DIRECT`.
fn pread_into(file: RegisteredFile, offset: u64, dst: *mut u8, len: usize) -> Result<usize, c_int> {
    if !file.direct {
        return pread_full(file.fd, dst, len, offset);
    }
    let mut done = 0usize;
    while done < len {
        let at = offset + done as u64;
        let want = (len - done).min(PIECE);
        let lo = at - at % BLOCK;
        let hi = (at + want as u64).div_ceil(BLOCK) * BLOCK;
        let bounce = Bounce::new((hi - lo) as usize)?;
        let got = pread_full(file.fd, bounce.ptr, (hi - lo) as usize, lo)?;
        let avail = ((lo + got as u64).saturating_sub(at) as usize).min(want);
        // SAFETY: the bounce buffer holds `got` bytes from lo, avail of them from at; dst is
        // writable for len bytes (translated, pinned device memory).
        unsafe {
            std::ptr::copy_nonoverlapping(bounce.ptr.add((at - lo) as usize), dst.add(done), avail)
        };
        done += avail;
        if avail < want {
            break;
        }
    }
    Ok(done)
}

/// Writes `len` bytes from `src` at `offset` of `file` (aligned when it has `O_DIRECT`).
fn pwrite_from(file: RegisteredFile, offset: u64, src: *const u8, len: usize) -> Result<(), c_int> {
    let mut done = 0usize;
    while done < len {
        let n = (len - done).min(PIECE);
        let bounce = if file.direct {
            let b = Bounce::new(n)?;
            // SAFETY: src is readable for len bytes; the bounce buffer holds n.
            unsafe { std::ptr::copy_nonoverlapping(src.add(done), b.ptr, n) };
            Some(b)
        } else {
            None
        };
        // SAFETY: as above.
        let from = bounce
            .as_ref()
            .map_or(unsafe { src.add(done) }, |b| b.ptr.cast_const());
        let mut written = 0usize;
        while written < n {
            // SAFETY: `from` is readable for n bytes.
            let r = unsafe {
                libc::pwrite(
                    file.fd,
                    from.add(written).cast(),
                    n - written,
                    (offset + (done + written) as u64) as libc::off_t,
                )
            };
            match r {
                r if r > 0 => written += r as usize,
                0 => return Err(libc::EIO),
                _ => match std::io::Error::last_os_error().raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(code) => return Err(code),
                    None => return Err(libc::EIO),
                },
            }
        }
        done += n;
    }
    Ok(())
}
