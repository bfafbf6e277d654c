//! The checks of the conformance suite, one function each (listed by `checks()`).

use super::{CheckResult, Harness};
use crate::data;
use fastensor_core::{BackendFile, ErrorKind, OpenMode, ReadRequest, WriteRequest};
use std::path::{Path, PathBuf};

fn compare(what: &str, got: &[u8], want: &[u8]) -> CheckResult {
    match data::first_difference(got, want) {
        None => Ok(()),
        Some(i) => Err(format!(
            "{what}: {} bytes read, {} expected; first difference at byte {i}",
            got.len(),
            want.len()
        )),
    }
}

/// A file a check made (see [`test_file`]): where it is, what it holds, a handle to it.
struct TestFile {
    path: PathBuf,
    content: Vec<u8>,
    f: Box<dyn BackendFile>,
}

/// A file at a fresh path (`tag`, see [`Harness::path`]) created holding `len` test bytes of
/// `seed` ([`data::bytes`], through [`Harness::create`]), then opened in `mode`.
fn test_file(
    h: &Harness<'_>,
    tag: &str,
    (len, seed): (usize, u64),
    mode: OpenMode,
) -> Result<TestFile, String> {
    let path = h.path(tag);
    let content = data::bytes(len, seed);
    h.create(&path, &content)?;
    let f = h.open(&path, mode)?;
    Ok(TestFile { path, content, f })
}

/// Reads the whole file at `path` (through the harness's reference reader) and compares it
/// with `want`.
fn file_matches(h: &Harness<'_>, path: &Path, what: &str, want: &[u8]) -> CheckResult {
    compare(what, &h.read_whole(path)?, want)
}

/// Reads `len` bytes at `offset` of `f` (an aligned buffer) and compares them with `want`.
fn read_matches(
    h: &Harness<'_>,
    f: &dyn BackendFile,
    (offset, len): (u64, usize),
    what: &str,
    want: &[u8],
) -> CheckResult {
    compare(what, &h.read(f, offset, len, 0)?, want)
}

/// Reads `len` bytes at `offset` of `f`, which must return none; else an error saying
/// `what` returned how many.
fn reads_nothing(
    h: &Harness<'_>,
    f: &dyn BackendFile,
    offset: u64,
    len: usize,
    what: &str,
) -> CheckResult {
    let got = h.read(f, offset, len, 0)?;
    if !got.is_empty() {
        return Err(format!("{what} returned {} bytes", got.len()));
    }
    Ok(())
}

/// `f`'s length, which must be `want`; else an error of `what` and the length.
fn has_len(f: &dyn BackendFile, want: u64, what: &str) -> CheckResult {
    let len = f.len().map_err(|e| e.to_string())?;
    if len != want {
        return Err(format!("{what} {len} bytes long"));
    }
    Ok(())
}

const MIB: usize = 1 << 20;

pub(super) fn round_trip_sizes(h: &Harness<'_>) -> CheckResult {
    for (i, size) in [
        0,
        1,
        511,
        4095,
        4096,
        4097,
        MIB - 1,
        MIB,
        MIB + 1,
        64 * MIB + 3,
    ]
    .into_iter()
    .enumerate()
    {
        let TestFile {
            content: want, f, ..
        } = test_file(h, "size", (size, 100 + i as u64), OpenMode::Read)?;
        let len = f.len().map_err(|e| e.to_string())?;
        if len != size as u64 {
            return Err(format!(
                "after writing {size} bytes the file is {len} bytes long"
            ));
        }
        let got = h.read(f.as_ref(), 0, size, 0)?;
        compare(&format!("round trip of {size} bytes"), &got, &want)?;
    }
    Ok(())
}

pub(super) fn unaligned_offsets_and_buffers(h: &Harness<'_>) -> CheckResult {
    let path = h.path("unaligned");
    let mut want = data::bytes(3 * 65536 + 777, 7);
    h.create(&path, &want)?;
    let mut seed = 1000;
    for offset in [0u64, 1, 511, 4096, 4097, 12345] {
        for len in [1usize, 4096, 8193, 70_000] {
            for misalign in [0usize, 1, 7, 512] {
                seed += 1;
                let chunk = data::bytes(len, seed);
                h.put(&path, offset, &chunk, misalign)?;
                let end = offset as usize + len;
                if want.len() < end {
                    want.resize(end, 0);
                }
                want[offset as usize..end].copy_from_slice(&chunk);
                let f = h.open(&path, OpenMode::Read)?;
                let got = h.read(f.as_ref(), offset, len, (misalign + 3) % 4096)?;
                compare(
                    &format!("region at {offset}+{len} (buffer misaligned by {misalign})"),
                    &got,
                    &chunk,
                )?;
            }
        }
    }
    file_matches(h, &path, "whole file after unaligned writes", &want)
}

pub(super) fn overwrite_keeps_neighbours(h: &Harness<'_>) -> CheckResult {
    let TestFile {
        path,
        content: mut want,
        f,
    } = test_file(h, "overwrite", (MIB, 11), OpenMode::ReadWrite)?;
    for (offset, len) in [
        (300_001usize, 5000usize),
        (4096, 4096),
        (65_535, 2),
        (MIB - 10, 10),
    ] {
        let patch = data::bytes(len, offset as u64);
        h.write(f.as_ref(), offset as u64, &patch, 0)?;
        want[offset..offset + len].copy_from_slice(&patch);
    }
    f.sync().map_err(|e| e.to_string())?;
    has_len(f.as_ref(), MIB as u64, "overwrites left the file")?;
    file_matches(h, &path, "file after overwrites", &want)
}

pub(super) fn read_past_end_is_short(h: &Harness<'_>) -> CheckResult {
    let TestFile { content, f, .. } = test_file(h, "eof", (10_000, 3), OpenMode::Read)?;
    let f = f.as_ref();
    read_matches(
        h,
        f,
        (9000, 4096),
        "read crossing the end",
        &content[9000..],
    )?;
    let what = "aligned read crossing the end";
    read_matches(h, f, (8192, 8192), what, &content[8192..])?;
    for offset in [10_000u64, 10_001, 1 << 40] {
        reads_nothing(
            h,
            f,
            offset,
            4096,
            &format!("read at {offset}, past the end,"),
        )?;
    }
    Ok(())
}

/// A handle reads the file as it is when each read begins, however another handle changed
/// it: grown, the new bytes are read; cut, a read across the new end is short (no error) and
/// one past it reads nothing. (A handle may remember the length; it may not trust it.)
pub(super) fn file_changed_through_another_handle(h: &Harness<'_>) -> CheckResult {
    let path = h.path("changed");
    let content = data::bytes(3 * 4096, 11);
    h.create(&path, &content[..2 * 4096])?;
    let file = h.open(&path, OpenMode::Read)?;
    let f = file.as_ref();
    read_matches(h, f, (0, 4096), "read before the change", &content[..4096])?;
    let other = h.open(&path, OpenMode::ReadWrite)?;
    h.write(other.as_ref(), 2 * 4096, &content[2 * 4096..], 0)?;
    let what = "read of bytes another handle appended";
    read_matches(h, f, (8000, 4096), what, &content[8000..12096])?;
    other
        .set_len(5000)
        .map_err(|e| format!("set_len(5000) failed: {e}"))?;
    let what = "read across the end another handle cut";
    read_matches(h, f, (4000, 4096), what, &content[4000..5000])?;
    let what = "read at 6000, past the end another handle cut at 5000,";
    reads_nothing(h, f, 6000, 100, what)
}

pub(super) fn batch_of_small_requests(h: &Harness<'_>) -> CheckResult {
    let path = h.path("batch");
    let mut layout = Vec::new();
    let mut offset = 0u64;
    for i in 0..1000u64 {
        let len = 1 + ((i * 7919) % 4096) as usize;
        offset += (i * 31) % 1000;
        layout.push((offset, data::bytes(len, i)));
        offset += len as u64;
    }
    if h.caps.write {
        let f = h.open(&path, OpenMode::Truncate)?;
        let mut bufs = Vec::new();
        for (i, (_, bytes)) in layout.iter().enumerate() {
            let mut b = h.memory.alloc(bytes.len(), i % 3);
            b.upload(bytes);
            bufs.push(b);
        }
        let reqs: Vec<WriteRequest<'_>> = layout
            .iter()
            .zip(&bufs)
            .map(|((off, _), b)| WriteRequest {
                offset: *off,
                src: b.as_mem(),
            })
            .collect();
        f.write_batch(&reqs)
            .map_err(|e| format!("write_batch failed: {e}"))?;
        f.sync().map_err(|e| e.to_string())?;
    } else {
        for (off, bytes) in &layout {
            h.put(&path, *off, bytes, 0)?;
        }
    }
    let f = h.open(&path, OpenMode::Read)?;
    let mut bufs: Vec<_> = layout
        .iter()
        .enumerate()
        .map(|(i, (_, b))| h.memory.alloc(b.len(), (i * 5) % 64))
        .collect();
    let mut reqs: Vec<ReadRequest<'_>> = layout
        .iter()
        .zip(bufs.iter_mut())
        .map(|((off, _), b)| ReadRequest {
            offset: *off,
            dst: b.as_mem_mut(),
            done: 0,
        })
        .collect();
    f.read_batch(&mut reqs)
        .map_err(|e| format!("read_batch failed: {e}"))?;
    let done: Vec<usize> = reqs.iter().map(|r| r.done).collect();
    drop(reqs);
    for (i, ((off, want), buf)) in layout.iter().zip(&bufs).enumerate() {
        if done[i] != want.len() {
            return Err(format!(
                "batch request {i} at {off}: {} of {} bytes read",
                done[i],
                want.len()
            ));
        }
        compare(
            &format!("batch request {i} at {off}"),
            &buf.download(),
            want,
        )?;
    }
    Ok(())
}

pub(super) fn threads_share_one_handle(h: &Harness<'_>) -> CheckResult {
    const THREADS: usize = 8;
    const REGION: usize = 100_003; // not a multiple of any block: neighbours share blocks
    let path = h.path("threads");
    let regions: Vec<Vec<u8>> = (0..THREADS)
        .map(|i| data::bytes(REGION, 500 + i as u64))
        .collect();
    let want: Vec<u8> = regions.concat();
    if h.caps.write {
        let f = h.open(&path, OpenMode::Truncate)?;
        let f = f.as_ref();
        on_threads(&regions, "writer", |i, r| {
            h.write(f, (i * REGION) as u64, r, i % 2)
        })?;
        f.sync().map_err(|e| e.to_string())?;
    } else {
        h.create(&path, &want)?;
    }
    let f = h.open(&path, OpenMode::Read)?;
    let f = f.as_ref();
    on_threads(&regions, "reader", |i, r| {
        let got = h.read(f, (i * REGION) as u64, REGION, i % 3)?;
        compare(&format!("thread {i}'s region"), &got, r)
    })?;
    file_matches(h, &path, "file written by threads", &want)
}

/// Runs `each(i, region)` for every region of `regions` at once, a thread each, and waits for
/// them all: the first failure in region order, a `who` thread's panic as a failure.
fn on_threads<F>(regions: &[Vec<u8>], who: &str, each: F) -> CheckResult
where
    F: Fn(usize, &[u8]) -> CheckResult + Sync,
{
    let each = &each;
    let results: Vec<CheckResult> = std::thread::scope(|s| {
        let handles: Vec<_> = regions
            .iter()
            .enumerate()
            .map(|(i, r)| s.spawn(move || each(i, r)))
            .collect();
        handles
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err(format!("{who} thread panicked")))
            })
            .collect()
    });
    results.into_iter().collect()
}

pub(super) fn missing_file_is_not_found(h: &Harness<'_>) -> CheckResult {
    let path = h.path("missing");
    let modes = [OpenMode::Read, OpenMode::ReadWrite];
    open_fails(h, &path, &modes, ErrorKind::NotFound, "a missing file")
}

pub(super) fn directory_is_refused(h: &Harness<'_>) -> CheckResult {
    let dir = h.path("dir");
    std::fs::create_dir(&dir).map_err(|e| e.to_string())?;
    let modes = [OpenMode::Read, OpenMode::ReadWrite, OpenMode::Create];
    open_fails(h, &dir, &modes, ErrorKind::InvalidInput, "a directory")
}

/// Opening `path` (`what`) in each of `modes` (its writable ones only when the backend
/// writes) fails with `kind`, the error naming `path`.
fn open_fails(
    h: &Harness<'_>,
    path: &std::path::Path,
    modes: &[OpenMode],
    kind: ErrorKind,
    what: &str,
) -> CheckResult {
    for &mode in modes.iter().filter(|m| h.caps.write || !m.writable()) {
        match h.backend.open(path, mode) {
            Ok(_) => return Err(format!("opening {what} ({mode:?}) succeeded")),
            Err(e) if e.kind() != kind => {
                return Err(format!(
                    "{what} ({mode:?}) gave {:?}, not {kind:?}: {e}",
                    e.kind()
                ))
            }
            Err(e) if !e.to_string().contains(&*path.to_string_lossy()) => {
                return Err(format!("the error does not name {what}: {e}"))
            }
            Err(_) => {}
        }
    }
    Ok(())
}

pub(super) fn read_only_handle_refuses_writes(h: &Harness<'_>) -> CheckResult {
    let TestFile { path, content, f } = test_file(h, "readonly", (8192, 9), OpenMode::Read)?;
    let mut buf = h.memory.alloc(4096, 0);
    buf.upload(&[0xAB; 4096]);
    match f.write_at(0, buf.as_mem()) {
        Ok(()) => return Err("a write through a read-only handle succeeded".into()),
        Err(e) if !e.to_string().contains(&*path.to_string_lossy()) => {
            return Err(format!("the error does not name the file: {e}"))
        }
        Err(_) => {}
    }
    file_matches(h, &path, "file after a refused write", &content)
}

pub(super) fn zero_length_transfers(h: &Harness<'_>) -> CheckResult {
    let path = h.path("zero");
    h.create(&path, &[])?;
    let f = h.open(
        &path,
        if h.caps.write {
            OpenMode::ReadWrite
        } else {
            OpenMode::Read
        },
    )?;
    if h.caps.write {
        h.write(f.as_ref(), 0, &[], 0)?;
        h.write(f.as_ref(), 5000, &[], 3)?;
        has_len(f.as_ref(), 0, "zero-length writes left the file")?;
    }
    for offset in [0u64, 4096] {
        reads_nothing(h, f.as_ref(), offset, 0, "a zero-length read")?;
        reads_nothing(h, f.as_ref(), offset, 100, "a read of an empty file")?;
    }
    Ok(())
}

pub(super) fn write_past_end_sets_exact_length(h: &Harness<'_>) -> CheckResult {
    for (gap, len) in [
        (10_000u64, 5usize),
        (4096, 4096),
        (8191, 9000),
        (1 << 20, (1 << 20) + 1),
    ] {
        let path = h.path("extend");
        let f = h.open(&path, OpenMode::Truncate)?;
        let patch = data::bytes(len, gap);
        h.write(f.as_ref(), gap, &patch, 0)?;
        f.sync().map_err(|e| e.to_string())?;
        let what = format!("a write of {len} bytes at {gap} left the file");
        has_len(f.as_ref(), gap + len as u64, &what)?;
        let mut want = vec![0u8; gap as usize];
        want.extend_from_slice(&patch);
        file_matches(h, &path, &format!("file after a write at {gap}"), &want)?;
    }
    Ok(())
}

pub(super) fn set_len_cuts_and_extends(h: &Harness<'_>) -> CheckResult {
    let TestFile { path, content, f } = test_file(h, "setlen", (20_000, 21), OpenMode::ReadWrite)?;
    f.set_len(5000)
        .map_err(|e| format!("set_len(5000) failed: {e}"))?;
    file_matches(h, &path, "file cut to 5000 bytes", &content[..5000])?;
    f.set_len(9000)
        .map_err(|e| format!("set_len(9000) failed: {e}"))?;
    let mut want = content[..5000].to_vec();
    want.resize(9000, 0);
    file_matches(h, &path, "file extended to 9000 bytes", &want)
}

pub(super) fn proptest_offsets_lengths_alignment(h: &Harness<'_>) -> CheckResult {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestCaseError, TestRunner};
    let path = h.path("prop");
    let base = data::bytes(600_000, 77);
    h.create(&path, &base)?;
    let want = std::sync::Mutex::new(base);
    let mut runner = TestRunner::new(Config {
        cases: 32,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (0u64..300_000, 0usize..200_000, 0usize..4097, any::<u64>());
    runner
        .run(&strategy, |(offset, len, misalign, seed)| {
            let chunk = data::bytes(len, seed);
            h.put(&path, offset, &chunk, misalign)
                .map_err(TestCaseError::fail)?;
            let mut want = want.lock().unwrap_or_else(|p| p.into_inner());
            let end = offset as usize + len;
            if want.len() < end {
                want.resize(end, 0);
            }
            want[offset as usize..end].copy_from_slice(&chunk);
            let f = h.open(&path, OpenMode::Read).map_err(TestCaseError::fail)?;
            let got = h
                .read(f.as_ref(), offset, len, misalign)
                .map_err(TestCaseError::fail)?;
            compare("region", &got, &chunk).map_err(TestCaseError::fail)?;
            let whole = h.read_whole(&path).map_err(TestCaseError::fail)?;
            compare("whole file", &whole, &want).map_err(TestCaseError::fail)?;
            Ok(())
        })
        .map_err(|e| e.to_string())
}
