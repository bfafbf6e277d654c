//! Bringing a file mapping's pages into memory ahead of use, with errors instead of
//! `SIGBUS`: a page past the end of a file truncated under the mapping makes these calls
//! fail (`EFAULT`), where a plain load from it would kill the process.

use std::fs::File;
use std::io;

/// Bytes of one page (the granularity of [`touch`]).
const PAGE: usize = 4096;

/// Pages one `process_vm_readv` call touches (`IOV_MAX`).
const PAGES_PER_CALL: usize = 1024;

/// A private (copy-on-write) mapping of the first `len` bytes of `file`, readable and
/// writable: this process's writes stay its own. Pages another process changes in the file
/// before this process writes them show the change, and a page past the end of a file
/// truncated under the mapping raises `SIGBUS` when read directly: bring pages in with
/// [`populate_read`] and [`touch`], which report that as an error.
pub fn map_private(file: &File, len: usize) -> io::Result<memmap2::MmapMut> {
    // SAFETY: a private mapping: nothing this process does through it reaches the file;
    // the hazards of the file changing underneath are the caller's contract above.
    unsafe { memmap2::MmapOptions::new().len(len).map_copy(file) }
}

/// Reads the pages of the `len` bytes at `ptr` (part of a file mapping of this process)
/// into the page cache and maps them (`MADV_POPULATE_READ`, Linux 5.14 on); nothing is read
/// through `ptr` by this process itself, so the memory may be in use by other threads
/// meanwhile. Returns [`io::ErrorKind::Unsupported`] where the kernel lacks it; an error
/// where a page cannot be read (`EFAULT`: past the end of the file or not mapped; `EIO`:
/// the device failed).
pub fn populate_read(ptr: *const u8, len: usize) -> io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    let start = ptr as usize & !(PAGE - 1);
    let span = ptr as usize + len - start;
    // SAFETY: `madvise` only reads the process's page tables and the file; an address range
    // that is not mapped is reported as an error, never dereferenced by this process.
    let r = unsafe { libc::madvise(start as *mut libc::c_void, span, libc::MADV_POPULATE_READ) };
    if r == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EINVAL) => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "MADV_POPULATE_READ is not supported by this kernel",
        )),
        _ => Err(e),
    }
}

/// Touches one byte of every page of the `len` bytes at `ptr` through the kernel
/// (`process_vm_readv` on this process), faulting in what is not yet mapped; a page that
/// cannot be read (or is not mapped) is an error, not a signal. Memory a process's own CPU
/// has not yet touched can cost a fault of the hypervisor on its first access on virtual
/// machines; touching it here moves that cost onto the threads that load it.
pub fn touch(ptr: *const u8, len: usize) -> io::Result<()> {
    let mut scratch = [0u8; PAGES_PER_CALL];
    let first = ptr as usize;
    let pages: Vec<usize> = (first..first + len).step_by(PAGE).collect();
    // SAFETY: `getpid` has no preconditions.
    let me = unsafe { libc::getpid() };
    for group in pages.chunks(PAGES_PER_CALL) {
        let local = libc::iovec {
            iov_base: scratch.as_mut_ptr().cast(),
            iov_len: group.len(),
        };
        let remote = byte_iovecs(group.iter().map(|&at| at as *mut u8));
        // SAFETY: the kernel copies one byte from each remote address into `scratch` (as
        // long as `group`); an unreadable remote address is an error return, not a fault
        // of this process.
        let n = unsafe {
            libc::process_vm_readv(
                me,
                &local,
                1,
                remote.as_ptr(),
                remote.len() as libc::c_ulong,
                0,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if (n as usize) < group.len() {
            return Err(io::Error::from_raw_os_error(libc::EFAULT));
        }
    }
    Ok(())
}

/// One `iovec` of one byte at each of `bytes`, for `process_vm_readv` or `process_vm_writev`
/// on this process: each such byte is read (or written) through the kernel, which reports an
/// unreachable one as an error instead of faulting. Making the vector dereferences nothing.
pub fn byte_iovecs(bytes: impl IntoIterator<Item = *mut u8>) -> Vec<libc::iovec> {
    bytes
        .into_iter()
        .map(|b| libc::iovec {
            iov_base: b.cast(),
            iov_len: 1,
        })
        .collect()
}

/// Copies `dst.len()` bytes from `src` (part of a file mapping of this process) into `dst`
/// through the kernel (`process_vm_readv` on this process): a page that cannot be read (or
/// is not mapped) is an error, not a signal.
pub fn copy_out(src: *const u8, dst: &mut [u8]) -> io::Result<()> {
    if dst.is_empty() {
        return Ok(());
    }
    let local = libc::iovec {
        iov_base: dst.as_mut_ptr().cast(),
        iov_len: dst.len(),
    };
    let remote = libc::iovec {
        iov_base: src as *mut libc::c_void,
        iov_len: dst.len(),
    };
    // SAFETY: the kernel copies `dst.len()` bytes from this process's `src` into `dst`,
    // which this function borrows mutably for that long; an unreadable source page is an
    // error return, not a fault of this process.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if (n as usize) < dst.len() {
        return Err(io::Error::from_raw_os_error(libc::EFAULT));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn populates_and_touches_a_file_mapping() {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&vec![7u8; 5 * PAGE + 100]).unwrap();
        let map = map_private(&f, 5 * PAGE + 100).unwrap();
        match populate_read(map.as_ptr(), map.len()) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Unsupported => {}
            Err(e) => panic!("{e}"),
        }
        touch(map.as_ptr(), map.len()).unwrap();
        assert_eq!(map[5 * PAGE + 99], 7);
        let mut out = vec![0u8; 2 * PAGE];
        copy_out(map[3 * PAGE..].as_ptr(), &mut out).unwrap();
        assert!(out.iter().all(|&b| b == 7));
    }

    #[test]
    fn a_truncated_file_is_an_error_not_a_signal() {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&vec![1u8; 8 * PAGE]).unwrap();
        // Nothing reads the mapping directly after the truncation.
        let map = map_private(&f, 8 * PAGE).unwrap();
        f.set_len(PAGE as u64).unwrap();
        let tail = map[4 * PAGE..].as_ptr();
        assert!(touch(tail, 2 * PAGE).is_err());
        assert!(copy_out(tail, &mut vec![0u8; 2 * PAGE]).is_err());
        if let Err(e) = populate_read(tail, 2 * PAGE) {
            assert_ne!(e.kind(), io::ErrorKind::Unsupported);
        } else {
            panic!("populating pages past the end of the file succeeded");
        }
    }

    #[test]
    fn an_address_not_mapped_is_an_error_not_a_signal() {
        let nowhere = PAGE as *const u8; // the first pages are never mapped
        assert!(touch(nowhere, PAGE).is_err());
        assert!(copy_out(nowhere, &mut [0u8; 16]).is_err());
        assert!(populate_read(nowhere, PAGE).is_err());
    }
}
