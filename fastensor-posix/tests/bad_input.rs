//! Bad input on real file systems: each case gives a typed error naming the file, never a
//! panic. Cases that need root (mounting a small file system, `chattr +i`) skip, saying why,
//! when the machine does not allow them.

use fastensor_core::{Backend, ErrorKind, HostBuffer, OpenMode};
use fastensor_posix::{DirectBackend, MmapBackend, PosixBackend};
use fastensor_testkit::ok_or_skip;
use fastensor_testkit::skip::Mount;
use std::path::Path;
use std::process::Command;

fn backends() -> Vec<Box<dyn Backend>> {
    vec![
        Box::new(PosixBackend),
        Box::new(DirectBackend::default()),
        Box::new(MmapBackend),
    ]
}

#[test]
fn a_file_system_refusing_o_direct_gives_unsupported() {
    // /proc refuses O_DIRECT everywhere.
    let err = DirectBackend::default()
        .open(Path::new("/proc/self/status"), OpenMode::Read)
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    assert!(err.to_string().contains("/proc/self/status"), "{err}");
    assert!(err.to_string().contains("O_DIRECT"), "{err}");
}

/// ramfs refuses O_DIRECT too, for files we create; the page-cache backend works there.
#[test]
fn ramfs_refuses_o_direct_and_takes_page_cache_writes() {
    let m = ok_or_skip!(Mount::new("ramfs", "mode=755"));
    let path = m.path().join("t.bin");
    let err = DirectBackend::default()
        .open(&path, OpenMode::Create)
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    assert!(err.to_string().contains("t.bin"), "{err}");
    let f = PosixBackend.open(&path, OpenMode::Create).unwrap();
    f.write_at(0, b"hello"[..].into()).unwrap();
}

#[test]
fn a_full_disk_gives_storage_full_naming_the_file() {
    let m = ok_or_skip!(Mount::new("tmpfs", "size=1m"));
    let data = HostBuffer::new(4 << 20).unwrap();
    for b in backends() {
        if !b.capabilities().write {
            continue;
        }
        let path = m.path().join(format!("{}.bin", b.name()));
        let f = b.open(&path, OpenMode::Truncate).unwrap();
        let err = f
            .write_at(0, data.as_mem())
            .and_then(|()| f.sync())
            .expect_err("writing 4 MiB into a 1 MiB file system must fail");
        assert_eq!(err.kind(), ErrorKind::StorageFull, "{}: {err}", b.name());
        assert!(err.to_string().contains(&*path.to_string_lossy()), "{err}");
        drop(f);
        std::fs::remove_file(&path).unwrap();
    }
}

#[test]
fn an_immutable_file_refuses_writers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("frozen.bin");
    std::fs::write(&path, [7u8; 8192]).unwrap();
    let frozen = Command::new("chattr")
        .arg("+i")
        .arg(&path)
        .status()
        .is_ok_and(|s| s.success());
    if !frozen {
        fastensor_testkit::skip!(
            "chattr +i is not available here (needs root and a file system with the attribute)"
        );
    }
    for b in backends() {
        for mode in [OpenMode::ReadWrite, OpenMode::Truncate] {
            let err = b.open(&path, mode).unwrap_err();
            let expected = if b.capabilities().write {
                ErrorKind::PermissionDenied
            } else {
                ErrorKind::Unsupported
            };
            assert_eq!(err.kind(), expected, "{} {mode:?}: {err}", b.name());
            assert!(err.to_string().contains("frozen.bin"), "{err}");
        }
        // Reading still works.
        let f = b.open(&path, OpenMode::Read).unwrap();
        let mut buf = vec![0u8; 8192];
        assert_eq!(f.read_at(0, (&mut buf[..]).into()).unwrap(), 8192);
        assert!(buf.iter().all(|&x| x == 7));
    }
    let _ = Command::new("chattr").arg("-i").arg(&path).status();
    assert_eq!(
        std::fs::read(&path).unwrap(),
        vec![7u8; 8192],
        "nothing was changed"
    );
}

#[test]
fn device_memory_on_a_host_backend_is_unsupported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.bin");
    std::fs::write(&path, [1u8; 4096]).unwrap();
    for b in backends() {
        let f = b.open(&path, OpenMode::Read).unwrap();
        // SAFETY: the pointer is never dereferenced: host backends refuse device memory
        // before touching it.
        let dst = unsafe { fastensor_core::DeviceSliceMut::from_raw(0x1000, 4096, 0) };
        let err = f
            .read_at(0, fastensor_core::MemMut::Device(dst))
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
        assert!(err.to_string().contains("device:0"), "{err}");
    }
}

#[test]
fn an_overflowing_offset_is_invalid_input() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("o.bin");
    for b in [
        Box::new(PosixBackend) as Box<dyn Backend>,
        Box::new(DirectBackend::default()),
    ] {
        let f = b.open(&path, OpenMode::Create).unwrap();
        let err = f.write_at(u64::MAX - 2, b"abcdef"[..].into()).unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::InvalidInput), "{err}");
    }
}
