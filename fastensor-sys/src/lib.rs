//! The OS helpers every fastensor layer shares: opening files (refusing special ones),
//! mapping OS errors, the file facts direct I/O needs, page-cache probes, file location,
//! sync, preallocation and eviction; private file mappings and the read leases that keep
//! them from changes to their files. Used by the backends and by the engine alike, so the
//! engine keeps its cache probes and device identity in every build.
#![deny(missing_docs)]

pub mod atomic;
mod cache;
pub mod filemap;
pub mod fork;
pub mod lease;
pub mod local;
pub mod pages;
pub mod populate;

pub use cache::{
    cached_pages, evict_page_cache, evict_path, page_ready, page_size, read_ahead_bytes, will_need,
};

use fastensor_core::align::DirectAlignment;
use fastensor_core::{Error, ErrorKind, FileLocation, OpenMode, Result};
use rustix::fs::{AtFlags, OFlags, StatxFlags};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Opens `path` as `mode` requires, optionally with `O_DIRECT`. Directories and every other
/// file that is not a regular file (FIFOs, devices, sockets) are refused with
/// [`ErrorKind::InvalidInput`], without blocking (the open itself is non-blocking, so a FIFO
/// with no writer does not hang it); a file system that refuses `O_DIRECT` gives
/// [`ErrorKind::Unsupported`]. Errors name the file and `backend`.
pub fn open_file(path: &Path, mode: OpenMode, direct: bool, backend: &str) -> Result<File> {
    let mut opts = OpenOptions::new();
    opts.read(true);
    match mode {
        OpenMode::Read => {}
        OpenMode::ReadWrite => {
            opts.write(true);
        }
        OpenMode::Create => {
            opts.write(true).create(true);
        }
        OpenMode::Truncate => {
            opts.write(true).create(true).truncate(true);
        }
    }
    let mut flags = OFlags::NONBLOCK;
    if direct {
        flags |= OFlags::DIRECT;
    }
    opts.custom_flags(flags.bits() as i32);
    let what = if mode.writable() {
        "cannot open for writing"
    } else {
        "cannot open for reading"
    };
    let file = match opts.open(path) {
        Ok(f) => f,
        Err(e) if direct && e.raw_os_error() == Some(22) && !path.is_dir() => {
            return Err(Error::new(
                ErrorKind::Unsupported,
                "the file system refuses O_DIRECT (direct I/O)",
            )
            .with_source(e)
            .with_path(path)
            .with_backend(backend));
        }
        Err(e) => return Err(Error::io(e, what).with_path(path).with_backend(backend)),
    };
    let meta = file.metadata().map_err(|e| {
        Error::io(e, "cannot stat")
            .with_path(path)
            .with_backend(backend)
    })?;
    if meta.is_dir() {
        return Err(
            Error::new(ErrorKind::InvalidInput, "is a directory, not a file")
                .with_path(path)
                .with_backend(backend),
        );
    }
    if !meta.is_file() {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!("not a regular file ({})", file_kind(&meta.file_type())),
        )
        .with_path(path)
        .with_backend(backend));
    }
    // Transfers block as usual (O_NONBLOCK means nothing to a regular file's reads, but
    // the descriptor is handed on).
    rustix::fs::fcntl_getfl(&file)
        .and_then(|fl| rustix::fs::fcntl_setfl(&file, fl - OFlags::NONBLOCK))
        .map_err(|e| {
            Error::io(e.into(), "cannot clear O_NONBLOCK")
                .with_path(path)
                .with_backend(backend)
        })?;
    Ok(file)
}

/// What a file type is, in words ("a FIFO", "a character device", "a directory").
pub fn file_kind(ft: &std::fs::FileType) -> &'static str {
    use rustix::fs::FileType as Raw;
    use std::fs::FileType;
    use std::os::unix::fs::FileTypeExt;
    type Test = fn(&FileType) -> bool;
    let types: [(Test, Raw); 7] = [
        (FileType::is_file, Raw::RegularFile),
        (FileType::is_dir, Raw::Directory),
        (FileType::is_fifo, Raw::Fifo),
        (FileType::is_char_device, Raw::CharacterDevice),
        (FileType::is_block_device, Raw::BlockDevice),
        (FileType::is_socket, Raw::Socket),
        (FileType::is_symlink, Raw::Symlink),
    ];
    let raw = types
        .iter()
        .find(|(is, _)| is(ft))
        .map_or(Raw::Unknown, |t| t.1);
    type_in_words(raw)
}

/// What a file type is, in words ("a FIFO", "a character device", "a directory").
pub(crate) fn type_in_words(t: rustix::fs::FileType) -> &'static str {
    use rustix::fs::FileType;
    match t {
        FileType::RegularFile => "a regular file",
        FileType::Directory => "a directory",
        FileType::Symlink => "a symbolic link",
        FileType::Fifo => "a FIFO",
        FileType::Socket => "a socket",
        FileType::CharacterDevice => "a character device",
        FileType::BlockDevice => "a block device",
        FileType::Unknown => "a special file",
    }
}

/// Opens `path` twice for a direct-I/O backend: an `O_DIRECT` descriptor as `mode` requires,
/// and a buffered one (read-only for [`OpenMode::Read`], else read-write, never creating or
/// truncating again) for the partial blocks at the ends of writes; with the direct
/// descriptor's alignment ([`direct_alignment`]). Errors as [`open_file`].
pub fn open_direct_pair(
    path: &Path,
    mode: OpenMode,
    backend: &str,
) -> Result<(File, File, DirectAlignment)> {
    let direct = open_file(path, mode, true, backend)?;
    let buffered_mode = match mode {
        OpenMode::Read => OpenMode::Read,
        _ => OpenMode::ReadWrite,
    };
    let buffered = open_file(path, buffered_mode, false, backend)?;
    let align = direct_alignment(&direct);
    Ok((direct, buffered, align))
}

/// The direct-I/O alignment of an open file, from `statx(STATX_DIOALIGN)` where the kernel
/// reports it, else [`DirectAlignment::PAGE`].
pub fn direct_alignment(file: &File) -> DirectAlignment {
    match rustix::fs::statx(file, c"", AtFlags::EMPTY_PATH, StatxFlags::DIOALIGN) {
        Ok(stx)
            if StatxFlags::from_bits_retain(stx.stx_mask).contains(StatxFlags::DIOALIGN)
                && stx.stx_dio_mem_align.is_power_of_two()
                && stx.stx_dio_offset_align.is_power_of_two() =>
        {
            DirectAlignment {
                memory: u64::from(stx.stx_dio_mem_align),
                offset: u64::from(stx.stx_dio_offset_align),
            }
        }
        _ => DirectAlignment::PAGE,
    }
}

/// The file system type and device of `path` (its parent directory when it does not exist).
pub fn file_location(path: &Path) -> FileLocation {
    let probe = if path.exists() {
        path.to_path_buf()
    } else {
        path.parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map(Path::to_path_buf)
            .unwrap_or_else(|| ".".into())
    };
    let device = rustix::fs::stat(&probe)
        .map(|st| {
            let dev = st.st_dev;
            format!("{}:{}", rustix::fs::major(dev), rustix::fs::minor(dev))
        })
        .unwrap_or_default();
    // `f_type`'s integer type differs between architectures.
    #[allow(clippy::unnecessary_cast)]
    let fs_type = rustix::fs::statfs(&probe)
        .map(|s| fs_name(s.f_type as i64))
        .unwrap_or_default();
    FileLocation { fs_type, device }
}

fn fs_name(magic: i64) -> String {
    match magic {
        0xEF53 => "ext4".into(),
        0x5846_5342 => "xfs".into(),
        0x9123_683E => "btrfs".into(),
        0x0102_1994 => "tmpfs".into(),
        0x8584_58F6 => "ramfs".into(),
        0x6969 => "nfs".into(),
        0x794C_7630 => "overlayfs".into(),
        0x2FC1_2FC1 => "zfs".into(),
        0xF2F5_2010 => "f2fs".into(),
        0x6573_5546 => "fuse".into(),
        other => format!("0x{other:x}"),
    }
}

/// CPU time (user + system) this process has used so far, in seconds, all threads included.
pub fn process_cpu_seconds() -> f64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Reads until `buf` is full or the file ends; returns the bytes read. Retries on `EINTR`
/// and short reads.
pub fn pread_full(file: &File, mut buf: &mut [u8], mut offset: u64) -> std::io::Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut total = 0;
    while !buf.is_empty() {
        match file.read_at(buf, offset) {
            Ok(0) => break,
            Ok(n) => {
                total += n;
                offset += n as u64;
                buf = &mut buf[n..];
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(total)
}

/// Writes all of `buf` at `offset`, retrying on `EINTR` and short writes.
pub fn pwrite_all(file: &File, buf: &[u8], offset: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    file.write_all_at(buf, offset)
}

/// Wraps an OS error of a transfer with its context.
pub fn transfer_error(
    err: std::io::Error,
    what: &str,
    backend: &str,
    path: &Path,
    offset: u64,
) -> Error {
    Error::io(err, what)
        .with_backend(backend)
        .with_path(path)
        .with_offset(offset)
}

/// `fdatasync` of `file`, errors naming the backend and path.
pub fn sync_file(file: &File, backend: &str, path: &Path) -> Result<()> {
    file.sync_data()
        .map_err(|e| transfer_error(e, "fdatasync failed", backend, path, 0))
}

/// Writes the dirty page-cache pages of `offset..offset + len` to the device and waits for
/// them (`sync_file_range` with `WAIT_BEFORE | WRITE | WAIT_AFTER`): the cost a buffered
/// write has not paid yet when `write` returns. It does not flush metadata (no journal
/// commit), so it costs a direct write nothing. A no-op for `len == 0`.
pub fn flush_range(file: &File, offset: u64, len: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    if len == 0 {
        return Ok(());
    }
    let (Ok(off), Ok(n)) = (i64::try_from(offset), i64::try_from(len)) else {
        return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
    };
    let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
        | libc::SYNC_FILE_RANGE_WRITE
        | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    // SAFETY: the descriptor is open for the lifetime of `file`; the call reads no memory.
    let rc = unsafe { libc::sync_file_range(file.as_raw_fd(), off, n, flags) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The length of `file`, errors naming the backend and path.
pub fn file_len(file: &File, backend: &str, path: &Path) -> Result<u64> {
    file.metadata()
        .map(|m| m.len())
        .map_err(|e| transfer_error(e, "cannot stat", backend, path, 0))
}

/// Allocates the part of `[offset, end)` that lies past the current end of `file`
/// (`fallocate`), so parallel direct writes there are overwrites rather than appends. A no-op
/// when the range ends inside the file, or where the file system cannot allocate ahead.
/// Errors name the backend and path.
pub fn allocate_past_end(
    file: &File,
    offset: u64,
    end: u64,
    backend: &str,
    path: &Path,
) -> Result<()> {
    let len = file_len(file, backend, path)?;
    if end <= len {
        return Ok(());
    }
    let start = offset.max(len);
    let flags = rustix::fs::FallocateFlags::empty();
    match rustix::fs::fallocate(file, flags, start, end - start) {
        Ok(()) => Ok(()),
        // Not supported here: the writes simply extend the file.
        Err(e) if e == rustix::io::Errno::OPNOTSUPP || e == rustix::io::Errno::NOSYS => Ok(()),
        Err(e) => Err(transfer_error(
            e.into(),
            "cannot allocate space",
            backend,
            path,
            start,
        )),
    }
}

/// Cuts or extends `file` to `len` bytes, errors naming the backend and path.
pub fn set_file_len(file: &File, len: u64, backend: &str, path: &Path) -> Result<()> {
    file.set_len(len)
        .map_err(|e| transfer_error(e, "cannot set the length", backend, path, len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::mincore_pages;
    use std::io::Write;
    use std::path::PathBuf;
    use tempfile::TempDir;

    /// A temporary directory holding the file `f` with `contents`, and the file's path.
    fn temp_file(contents: &[u8]) -> (TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, contents).unwrap();
        (dir, path)
    }

    #[test]
    fn file_kinds_are_named_in_words() {
        let (dir, file) = temp_file(b"x");
        let link = dir.path().join("l");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let kind = |meta: std::io::Result<std::fs::Metadata>| file_kind(&meta.unwrap().file_type());
        assert_eq!(kind(std::fs::metadata(&file)), "a regular file");
        assert_eq!(kind(std::fs::metadata(dir.path())), "a directory");
        assert_eq!(kind(std::fs::symlink_metadata(&link)), "a symbolic link");
        assert_eq!(kind(std::fs::metadata("/dev/null")), "a character device");
    }

    #[test]
    fn will_need_brings_exactly_the_ranges_asked_for_into_the_page_cache() {
        let (_dir, path) = temp_file(&vec![5u8; 4 << 20]);
        let f = File::open(&path).unwrap();
        evict_page_cache(&f).unwrap();
        let Some((0, _)) = cached_pages(&f, 0, 4 << 20) else {
            return; // this file system keeps its pages (tmpfs) or cannot tell
        };
        let page = page_size();
        // Two neighbours (asked for as one range) and one far away.
        will_need(&f, [(0, page), (page, page), (3 << 20, page)]);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while cached_pages(&f, 0, 2 * page) != Some((2, 2))
            || cached_pages(&f, 3 << 20, page) != Some((1, 1))
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the ranges never arrived"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // Nothing was read around them.
        let (between, _) = cached_pages(&f, 2 * page, (2 << 20) - 2 * page).unwrap();
        assert_eq!(between, 0);
    }

    #[test]
    fn read_ahead_bytes_is_the_devices_read_ahead_kb() {
        let dir = tempfile::tempdir().unwrap();
        let device = file_location(dir.path()).device;
        let sysfs = format!("/sys/class/bdi/{device}/read_ahead_kb");
        if let Ok(kb) = std::fs::read_to_string(sysfs) {
            let kb: u64 = kb.trim().parse().unwrap();
            assert_eq!(read_ahead_bytes(&device), (kb > 0).then_some(kb * 1024));
        }
        assert_eq!(read_ahead_bytes(""), None);
        assert_eq!(read_ahead_bytes("../../etc"), None);
        assert_eq!(read_ahead_bytes("4095:1048575"), None);
    }

    #[test]
    fn flush_range_writes_back_a_buffered_range() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let mut f = File::create(&path).unwrap();
        f.write_all(&vec![3u8; 1 << 20]).unwrap();
        flush_range(&f, 0, 1 << 20).unwrap();
        flush_range(&f, 4096, 0).unwrap();
        // Any descriptor of the file will do, a read-only one included.
        let r = File::open(&path).unwrap();
        flush_range(&r, 0, 1 << 20).unwrap();
        assert!(flush_range(&r, u64::MAX, 1).is_err());
    }

    #[test]
    fn cached_pages_sees_eviction_and_reads_nothing() {
        let (_dir, path) = temp_file(&vec![5u8; 1 << 20]);
        let f = File::open(&path).unwrap();
        let page = page_size();
        let pages = (1u64 << 20) / page;
        assert_eq!(cached_pages(&f, 0, 1 << 20), Some((pages, pages)));
        // An unaligned range counts every page it touches.
        assert_eq!(cached_pages(&f, 100, page), Some((2, 2)));
        assert_eq!(cached_pages(&f, 0, 0), None);
        f.sync_all().unwrap();
        evict_page_cache(&f).unwrap();
        let (cached, total) = cached_pages(&f, 0, 1 << 20).unwrap();
        assert_eq!(total, pages);
        if file_location(&path).fs_type != "tmpfs" {
            assert!(cached < pages / 2, "{cached} of {pages} pages still cached");
        }
        // Asking twice starts no readahead: still (nearly) nothing cached. Some file
        // systems (tmpfs) cannot drop pages at all.
        let again = cached_pages(&f, 0, 1 << 20).unwrap().0;
        assert!(again <= cached, "{again} > {cached}");
        // mincore agrees with cachestat.
        let m = mincore_pages(&f, 0, 1 << 20, page).unwrap();
        assert_eq!(m, cached);
    }

    #[test]
    fn page_ready_tells_a_cached_page_from_one_on_the_device() {
        let (_dir, path) = temp_file(&vec![5u8; 1 << 20]);
        let f = File::open(&path).unwrap();
        // `None` where the file system cannot tell (no `RWF_NOWAIT` for buffered reads).
        let Some(ready) = page_ready(&f, (1 << 20) - 1) else {
            return;
        };
        assert!(ready);
        // Past the end there is nothing to wait for.
        assert_eq!(page_ready(&f, 4 << 20), Some(true));
        f.sync_all().unwrap();
        let last = (1u64 << 20) - page_size();
        // Evicted, the page must come from the device, which a read that may not wait
        // refuses. On a busy machine the page is now and then back in the cache by the time
        // of the read (it was then read from the cache: it must be there afterwards); one
        // refusal is the rule, not guaranteed (see below).
        let mut refused = false;
        for _ in 0..50 {
            evict_page_cache(&f).unwrap();
            if cached_pages(&f, last, 1) != Some((0, 1)) {
                continue;
            }
            match page_ready(&f, last) {
                Some(false) => refused = true,
                ready => assert_eq!(
                    (ready, cached_pages(&f, last, 1)),
                    (Some(true), Some((1, 1))),
                    "a page read without waiting must have been cached"
                ),
            }
            if refused {
                break;
            }
        }
        if !refused {
            // The read that may not wait starts readahead; on a disk whose host caches it,
            // that read can complete before the kernel looks again, and the no-wait read
            // then succeeds from the cache. Every such answer was checked above.
            eprintln!("page_ready: the device answered every no-wait read in time here");
        }
    }
}
