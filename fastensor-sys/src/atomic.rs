//! Atomic, durable replacement of a file: what every save of fastensor (checkpoints,
//! profiles, benchmark reports) goes through.
//!
//! [`AtomicFile::new`] makes an unnamed temporary file (`O_TMPFILE`) in the target's
//! directory, or where the file system lacks it a hidden named one (`.NAME.tmp.PID.N`);
//! the caller writes it; [`AtomicFile::commit`] syncs it, gives it the mode (and, as root,
//! the owner) of the file it replaces, renames it over the target and syncs the directory.
//!
//! The contract:
//! * After `commit` returns, the target holds the new bytes, durably. Before, and after a
//!   crash at any point, it holds the old bytes, whole (or does not exist, if it did not).
//! * A crash leaves no temporary file behind where `O_TMPFILE` works (it has no name until
//!   the instant before the rename); elsewhere a named temporary of a dead process is removed
//!   by the next save to the same target. A failed or dropped save removes its own.
//! * A target that exists and is not a regular file (directory, device, FIFO, socket) is
//!   refused with [`ErrorKind::InvalidInput`] naming it, never replaced.
//! * A symbolic link is followed: the file it points to is replaced, and the link is kept.

use fastensor_core::{Error, ErrorKind, Result};
use rustix::fs::{AtFlags, Mode, OFlags, CWD};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Symbolic links followed before a target is refused (the kernel's own limit).
const MAX_LINKS: usize = 40;

/// A temporary file that replaces its target atomically on [`commit`](Self::commit); dropped
/// uncommitted, it leaves nothing behind.
#[derive(Debug)]
pub struct AtomicFile {
    /// The file replaced: the path given, its symbolic links followed.
    target: PathBuf,
    /// The target's directory.
    dir: File,
    /// The temporary file, open for reading and writing.
    file: File,
    /// Its name in `dir` when it has one (no `O_TMPFILE`); removed unless committed.
    named: Option<OsString>,
    /// Mode and owner of the file replaced.
    old: Option<(u32, u32, u32)>,
}

impl AtomicFile {
    /// A temporary file for replacing `path`. Refuses a `path` that exists and is not a
    /// regular file (or a symbolic link to one), and names `path` in every error. Removes the
    /// named temporaries of `path` that dead processes left.
    pub fn new(path: &Path) -> Result<AtomicFile> {
        let (target, old) = resolve(path)?;
        let name = target.file_name().map(OsStr::to_os_string).ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidInput,
                "a save needs a file name, not a directory",
            )
            .with_path(path)
        })?;
        let dir_path = parent(&target);
        let dir = File::open(dir_path)
            .map_err(|e| Error::io(e, "cannot open the directory to save into").with_path(path))?;
        remove_stale(dir_path, &name);
        let old = old.map(|m| (m.mode() & 0o7777, m.uid(), m.gid()));
        if let Some(file) = unnamed_temp(&dir).map_err(|e| cannot_create(e, path))? {
            return Ok(AtomicFile {
                target,
                dir,
                file,
                named: None,
                old,
            });
        }
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        loop {
            let temp = temp_name(
                &name,
                std::process::id(),
                COUNTER.fetch_add(1, Ordering::Relaxed),
            );
            match std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o666)
                .open(dir_path.join(&temp))
            {
                Ok(file) => {
                    return Ok(AtomicFile {
                        target,
                        dir,
                        file,
                        named: Some(temp),
                        old,
                    })
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(cannot_create(e, path)),
            }
        }
    }

    /// The temporary file, open for reading and writing.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// A path that opens the temporary file again (for writers that open by path, such as
    /// the backends): `/proc/self/fd/N` for an unnamed one. Valid until commit or drop.
    pub fn path(&self) -> PathBuf {
        match &self.named {
            Some(name) => parent(&self.target).join(name),
            None => fd_path(&self.file),
        }
    }

    /// The file that [`commit`](Self::commit) replaces (symbolic links followed).
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// Makes the temporary file the target: syncs it, gives it the replaced file's mode
    /// (and owner, when running as root), renames it over the target and syncs the
    /// directory. Errors name the target.
    pub fn commit(mut self) -> Result<()> {
        let target = self.target.clone();
        let fail = |e: std::io::Error, what: &str| save_error(e, what).with_path(&target);
        if let Some((mode, uid, gid)) = self.old {
            self.file
                .set_permissions(std::fs::Permissions::from_mode(mode))
                .map_err(|e| fail(e, "cannot give the new file the old one's mode"))?;
            if rustix::process::geteuid().is_root() {
                std::os::unix::fs::fchown(&self.file, Some(uid), Some(gid))
                    .map_err(|e| fail(e, "cannot give the new file the old one's owner"))?;
            }
        }
        self.file
            .sync_all()
            .map_err(|e| fail(e, "cannot sync the new file"))?;
        let name = self
            .target
            .file_name()
            .expect("checked in new")
            .to_os_string();
        let temp = match self.named.take() {
            Some(temp) => temp,
            None => {
                // Named only for the rename; a crash in between leaves a name that the
                // next save removes.
                static COUNTER: AtomicU64 = AtomicU64::new(0);
                let temp = temp_name(
                    &name,
                    std::process::id(),
                    COUNTER.fetch_add(1, Ordering::Relaxed),
                );
                rustix::fs::linkat(
                    CWD,
                    fd_path(&self.file),
                    &self.dir,
                    temp.as_os_str(),
                    AtFlags::SYMLINK_FOLLOW,
                )
                .map_err(|e| fail(e.into(), "cannot link the new file"))?;
                temp
            }
        };
        if let Err(e) =
            rustix::fs::renameat(&self.dir, temp.as_os_str(), &self.dir, name.as_os_str())
        {
            let _ = rustix::fs::unlinkat(&self.dir, temp.as_os_str(), AtFlags::empty());
            return Err(fail(
                e.into(),
                "cannot rename the new file over the old one",
            ));
        }
        self.dir
            .sync_all()
            .map_err(|e| fail(e, "cannot sync the directory"))
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if let Some(temp) = self.named.take() {
            let _ = rustix::fs::unlinkat(&self.dir, temp.as_os_str(), AtFlags::empty());
        }
    }
}

/// Replaces `path` with `bytes`, atomically and durably (see [`AtomicFile`]).
pub fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    let temp = AtomicFile::new(path)?;
    (&temp.file)
        .write_all(bytes)
        .map_err(|e| save_error(e, "cannot write the new file").with_path(path))?;
    temp.commit()
}

/// Refuses to read `path` unless it is a regular file: opens it without blocking (a FIFO
/// would block the open until a writer comes) and checks what it is. Errors name `path`.
pub fn open_regular(path: &Path) -> Result<File> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(OFlags::NONBLOCK.bits() as i32)
        .open(path)
        .map_err(|e| Error::io(e, "cannot open for reading").with_path(path))?;
    let meta = file
        .metadata()
        .map_err(|e| Error::io(e, "cannot stat").with_path(path))?;
    if !meta.is_file() {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!("not a regular file ({})", describe(&meta.file_type())),
        )
        .with_path(path));
    }
    rustix::fs::fcntl_getfl(&file)
        .and_then(|fl| rustix::fs::fcntl_setfl(&file, fl - OFlags::NONBLOCK))
        .map_err(|e| Error::io(e.into(), "cannot clear O_NONBLOCK").with_path(path))?;
    Ok(file)
}

/// What a file type is, in words ("a FIFO", "a directory", ...): [`crate::file_kind`].
pub fn describe(ft: &std::fs::FileType) -> &'static str {
    crate::file_kind(ft)
}

/// The file a save to `path` replaces, symbolic links followed, and its metadata when it
/// exists; refuses one that is not a regular file.
fn resolve(path: &Path) -> Result<(PathBuf, Option<std::fs::Metadata>)> {
    let mut p = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                let to = std::fs::read_link(&p)
                    .map_err(|e| Error::io(e, "cannot read the symbolic link").with_path(&p))?;
                p = parent(&p).join(to);
            }
            Ok(m) if m.is_file() => return Ok((p, Some(m))),
            Ok(m) => {
                let via = if p == path {
                    String::new()
                } else {
                    format!(" (the link's target {})", p.display())
                };
                return Err(Error::new(
                    ErrorKind::InvalidInput,
                    format!(
                        "refusing to save over {}{via}: not a regular file",
                        describe(&m.file_type())
                    ),
                )
                .with_path(path));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((p, None)),
            Err(e) => return Err(Error::io(e, "cannot stat the save target").with_path(path)),
        }
    }
    Err(Error::new(ErrorKind::InvalidInput, "too many levels of symbolic links").with_path(path))
}

/// The directory of `path` (`.` for a bare file name).
fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// `/proc/self/fd/N` for `file`: a path that opens it again.
pub fn fd_path(file: &File) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

/// An unnamed temporary file in `dir`; `None` where the file system (or the kernel, or a
/// missing `/proc` to link it through) does not support it.
fn unnamed_temp(dir: &File) -> std::io::Result<Option<File>> {
    if !Path::new("/proc/self/fd").is_dir() {
        return Ok(None);
    }
    match rustix::fs::openat(
        dir,
        ".",
        OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o666),
    ) {
        Ok(fd) => Ok(Some(File::from(fd))),
        Err(e)
            if [
                rustix::io::Errno::OPNOTSUPP,
                rustix::io::Errno::ISDIR,
                rustix::io::Errno::INVAL,
                rustix::io::Errno::NOENT,
            ]
            .contains(&e) =>
        {
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

/// A new file in `dir` for scratch data, with no name, so that nothing is left however the
/// process ends: `O_TMPFILE`, or where the file system lacks it a file called `name`,
/// unlinked as soon as it is open. Open it by path through [`fd_path`].
pub fn unnamed_file(dir: &Path, name: &str) -> std::io::Result<File> {
    let dir_file = File::open(dir)?;
    if let Some(file) = unnamed_temp(&dir_file)? {
        return Ok(file);
    }
    let path = dir.join(name);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)?;
    std::fs::remove_file(&path)?;
    Ok(file)
}

fn cannot_create(e: std::io::Error, target: &Path) -> Error {
    save_error(e, "cannot create the temporary file to save").with_path(target)
}

/// The error of a save that failed doing `what`, saying so in words when the disk is full.
fn save_error(e: std::io::Error, what: &str) -> Error {
    let kind = fastensor_core::kind_of_io(&e);
    let message = match kind {
        ErrorKind::StorageFull => format!("{what}: no space left on device"),
        _ => what.to_string(),
    };
    Error::new(kind, message).with_source(e)
}

/// `.NAME.tmp.PID.N`: the name of a named temporary of `name`.
fn temp_name(name: &OsStr, pid: u32, n: u64) -> OsString {
    let mut temp = OsString::from(".");
    temp.push(name);
    temp.push(format!(".tmp.{pid}.{n}"));
    temp
}

/// Removes, in `dir`, the temporaries of `name` (`.NAME.tmp.PID.N`, and the older
/// `.NAME.tmp.PID`) whose process is dead. Best effort: errors are ignored.
fn remove_stale(dir: &Path, name: &OsStr) {
    let mut prefix = b".".to_vec();
    prefix.extend_from_slice(name.as_bytes());
    prefix.extend_from_slice(b".tmp.");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(rest) = file_name.as_bytes().strip_prefix(prefix.as_slice()) else {
            continue;
        };
        let Some(pid) = stale_pid(rest) else {
            continue;
        };
        let alive = match rustix::process::Pid::from_raw(pid) {
            Some(p) => rustix::process::test_kill_process(p) != Err(rustix::io::Errno::SRCH),
            None => true,
        };
        if !alive && entry.file_type().is_ok_and(|t| t.is_file()) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// The PID in the tail `PID.N` or `PID` of a temporary's name.
fn stale_pid(rest: &[u8]) -> Option<i32> {
    let text = std::str::from_utf8(rest).ok()?;
    let (pid, n) = text.split_once('.').unwrap_or((text, "0"));
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    pid.parse().ok().filter(|&p| p > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_names_parse_back_to_their_pid() {
        assert_eq!(stale_pid(b"123.4"), Some(123));
        assert_eq!(stale_pid(b"123"), Some(123));
        assert_eq!(stale_pid(b"12x.4"), None);
        assert_eq!(stale_pid(b"123.x"), None);
        assert_eq!(stale_pid(b"0.1"), None);
    }
}
