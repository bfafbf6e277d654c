//! Round trips and edge cases of the `uring` backend against plain std file I/O.

use fastensor_core::{
    Backend, BackendFile, ErrorKind, HostBuffer, MemMut, MemRef, OpenMode, ReadRequest,
    WriteRequest,
};
use fastensor_uring::{UringBackend, UringConfig};
use std::path::Path;

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn backends() -> Vec<UringBackend> {
    let b = UringBackend::default();
    if !b.probe().is_available() {
        eprintln!("SKIPPED: uring unavailable: {}", b.probe());
        return Vec::new();
    }
    vec![
        b,
        UringBackend::new(UringConfig {
            queue_depth: 2,
            chunk_size: 64 << 10,
            staging_size: 64 << 10,
            ..UringConfig::default()
        }),
        UringBackend::new(UringConfig {
            register_buffers: false,
            register_files: false,
            ..UringConfig::default()
        }),
    ]
}

/// For each backend of [`backends`]: `data` written to a new file (its path is the
/// callback's second argument), that file opened in `mode`, and `check` run on it.
fn with_each_file(data: &[u8], mode: OpenMode, check: impl Fn(&dyn BackendFile, &Path)) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    for (i, backend) in backends().into_iter().enumerate() {
        let path = dir.path().join(format!("file{i}"));
        std::fs::write(&path, data).unwrap();
        let f = backend.open(&path, mode).unwrap();
        check(f.as_ref(), &path);
    }
}

/// An unaligned view of `len` bytes inside a page-aligned buffer.
fn unaligned(len: usize, misalign: usize) -> (HostBuffer, usize) {
    (HostBuffer::new(len + misalign).unwrap(), misalign)
}

#[test]
fn round_trips_at_awkward_sizes_offsets_and_alignments() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    for (bi, backend) in backends().iter().enumerate() {
        let sizes = [
            0usize,
            1,
            511,
            4095,
            4096,
            4097,
            (1 << 20) - 1,
            1 << 20,
            (1 << 20) + 1,
        ];
        for &len in &sizes {
            for &offset in &[0u64, 1, 4095, 4096, 10_000] {
                for &mis in &[0usize, 3] {
                    let path = dir.path().join(format!("rt-{bi}-{len}-{offset}-{mis}"));
                    let data = pattern(len, len as u64 + offset);
                    let f = backend.open(&path, OpenMode::Truncate).unwrap();
                    let (mut src, m) = unaligned(len, mis);
                    src[m..].copy_from_slice(&data);
                    f.write_at(offset, MemRef::Host(&src[m..])).unwrap();
                    let expect_len = if len == 0 { 0 } else { offset + len as u64 };
                    assert_eq!(f.len().unwrap(), expect_len, "len {len} at {offset}");
                    let on_disk = std::fs::read(&path).unwrap();
                    if len > 0 {
                        assert!(on_disk[..offset as usize].iter().all(|&b| b == 0));
                        assert_eq!(&on_disk[offset as usize..], &data[..]);
                    }
                    let (mut dst, m) = unaligned(len, mis);
                    let n = f.read_at(offset, MemMut::Host(&mut dst[m..])).unwrap();
                    assert_eq!(n, len);
                    assert!(
                        dst[m..] == data[..],
                        "read back {len} at {offset} mis {mis}"
                    );
                }
            }
        }
    }
}

#[test]
fn large_transfer_64mib_plus_3() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let len = (64 << 20) + 3;
    let data = pattern(len, 7);
    for (bi, backend) in backends().iter().take(2).enumerate() {
        let path = dir.path().join(format!("big-{bi}"));
        let f = backend.open(&path, OpenMode::Truncate).unwrap();
        let src = HostBuffer::from_slice(&data).unwrap();
        f.write_at(0, src.as_mem()).unwrap();
        assert_eq!(f.len().unwrap(), len as u64);
        let mut dst = HostBuffer::new(len).unwrap();
        assert_eq!(f.read_at(0, dst.as_mem_mut()).unwrap(), len);
        assert!(dst[..] == data[..]);
        // Unaligned destination: through the staging area.
        let mut v = vec![0u8; len + 1];
        assert_eq!(f.read_at(0, MemMut::Host(&mut v[1..])).unwrap(), len);
        assert!(v[1..] == data[..]);
    }
}

#[test]
fn reads_past_the_end_are_short() {
    let data = pattern(5000, 1);
    with_each_file(&data, OpenMode::Read, |f, _| {
        let mut buf = HostBuffer::new(16384).unwrap();
        assert_eq!(f.read_at(0, buf.as_mem_mut()).unwrap(), 5000);
        assert_eq!(&buf[..5000], &data[..]);
        assert_eq!(f.read_at(4096, buf.as_mem_mut()).unwrap(), 904);
        assert_eq!(&buf[..904], &data[4096..]);
        assert_eq!(f.read_at(4999, buf.as_mem_mut()).unwrap(), 1);
        assert_eq!(f.read_at(5000, buf.as_mem_mut()).unwrap(), 0);
        assert_eq!(f.read_at(1 << 40, buf.as_mem_mut()).unwrap(), 0);
        let mut reqs = vec![ReadRequest::new(4000, MemMut::Host(&mut buf[..2000]))];
        f.read_batch(&mut reqs).unwrap();
        assert_eq!(reqs[0].done, 1000);
    });
}

#[test]
fn writes_touch_only_their_range() {
    let base = pattern(20_000, 2);
    with_each_file(&base, OpenMode::ReadWrite, |f, path| {
        let patch = pattern(9000, 3);
        f.write_at(1234, MemRef::Host(&patch)).unwrap();
        let mut expect = base.clone();
        expect[1234..1234 + 9000].copy_from_slice(&patch);
        assert_eq!(std::fs::read(path).unwrap(), expect);
        // Extending from inside the file ends exactly at offset + len.
        f.write_at(19_000, MemRef::Host(&patch)).unwrap();
        assert_eq!(f.len().unwrap(), 28_000);
    });
}

#[test]
fn batch_of_1000_small_reads_and_writes() {
    let data = pattern(4 << 20, 4);
    with_each_file(&data, OpenMode::ReadWrite, |f, path| {
        let specs: Vec<(u64, usize)> = (0..1000u64)
            .map(|i| {
                (
                    (i * 7919 * 13) % (4 << 20),
                    [1usize, 100, 4096, 5000][i as usize % 4],
                )
            })
            .collect();
        let mut bufs: Vec<Vec<u8>> = specs.iter().map(|&(_, l)| vec![0; l]).collect();
        let mut reqs: Vec<ReadRequest<'_>> = specs
            .iter()
            .zip(bufs.iter_mut())
            .map(|(&(o, _), b)| ReadRequest::new(o, MemMut::Host(b)))
            .collect();
        f.read_batch(&mut reqs).unwrap();
        let dones: Vec<usize> = reqs.iter().map(|r| r.done).collect();
        drop(reqs);
        for ((&(o, l), b), done) in specs.iter().zip(&bufs).zip(dones) {
            let end = (o as usize + l).min(data.len());
            assert_eq!(done, end - o as usize);
            assert_eq!(&b[..done], &data[o as usize..end]);
        }
        // Aligned batch: zero copy.
        let mut aligned: Vec<HostBuffer> =
            (0..1000).map(|_| HostBuffer::new(4096).unwrap()).collect();
        let mut reqs: Vec<ReadRequest<'_>> = aligned
            .iter_mut()
            .enumerate()
            .map(|(i, b)| ReadRequest::new((i as u64 * 4096 * 7) % (4 << 20), b.as_mem_mut()))
            .collect();
        f.read_batch(&mut reqs).unwrap();
        drop(reqs);
        for (i, b) in aligned.iter().enumerate() {
            let o = (i * 4096 * 7) % (4 << 20);
            assert_eq!(&b[..], &data[o..o + 4096]);
        }
        // Batch of disjoint small writes.
        let patches: Vec<(u64, Vec<u8>)> = (0..1000u64)
            .map(|i| (i * 4000 + i % 7, pattern(100 + i as usize % 3000, i)))
            .collect();
        let wreqs: Vec<WriteRequest<'_>> = patches
            .iter()
            .map(|(o, p)| WriteRequest::new(*o, MemRef::Host(p)))
            .collect();
        f.write_batch(&wreqs).unwrap();
        let mut expect = data.clone();
        for (o, p) in &patches {
            expect[*o as usize..*o as usize + p.len()].copy_from_slice(p);
        }
        assert_eq!(std::fs::read(path).unwrap(), expect);
    });
}

#[test]
fn several_threads_share_one_handle() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    for backend in backends() {
        let path = dir.path().join("threads");
        let f = backend.open(&path, OpenMode::Truncate).unwrap();
        let piece = 300_001usize;
        std::thread::scope(|s| {
            for t in 0..6u64 {
                let f: &dyn BackendFile = f.as_ref();
                s.spawn(move || {
                    let data = pattern(piece, t);
                    for _ in 0..3 {
                        f.write_at(t * piece as u64, MemRef::Host(&data)).unwrap();
                        let mut back = vec![0u8; piece];
                        assert_eq!(
                            f.read_at(t * piece as u64, MemMut::Host(&mut back))
                                .unwrap(),
                            piece
                        );
                        assert!(back == data);
                    }
                });
            }
        });
        let all = std::fs::read(&path).unwrap();
        assert_eq!(all.len(), 6 * piece);
        for t in 0..6 {
            assert!(all[t * piece..(t + 1) * piece] == pattern(piece, t as u64)[..]);
        }
    }
}

#[test]
fn errors_carry_errno_path_and_backend() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    for backend in backends() {
        let missing = dir.path().join("missing");
        let e = backend.open(&missing, OpenMode::Read).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound);
        let path = dir.path().join("ro");
        std::fs::write(&path, b"hello").unwrap();
        let f = backend.open(&path, OpenMode::Read).unwrap();
        // A write through a read-only handle fails with EBADF from the ring.
        let e = f.write_at(0, MemRef::Host(&[1u8; 8192])).unwrap_err();
        let text = format!("{e}");
        assert!(
            text.contains("uring") && text.contains(path.to_str().unwrap()),
            "{text}"
        );
        assert!(text.contains("offset"), "{text}");
        assert_eq!(e.raw_os_error(), Some(9), "EBADF expected: {text}");
        assert_eq!(e.backend(), Some("uring"));
        assert_eq!(std::fs::read(&path).unwrap(), b"hello");
        assert!(backend.open(Path::new("/"), OpenMode::Read).is_err());
    }
}
