//! Atomic, durable replacement of a file: what every save of fastensor (checkpoints,
//! profiles, benchmark reports) goes through.
//!
//! [`AtomicFile::new`] opens the target's directory and makes an unnamed temporary file
//! (`O_TMPFILE`) in it, or where the file system lacks it a hidden named one
//! (`.NAME.tmp.PID.N`, created with `O_CREAT | O_EXCL | O_NOFOLLOW`); the caller writes it;
//! [`AtomicFile::commit`] syncs it, gives it the mode and group of the file it replaces
//! where the saver may set them, renames it over the target's name within that same open
//! directory
//! (`renameat`) and syncs the directory. Every step after the directory is opened works
//! relative to that directory's descriptor: nothing is looked up by path again.
//!
//! The contract:
//! * After `commit` returns, the target holds the new bytes, durably. Before, and after a
//!   crash at any point, it holds the old bytes, whole (or does not exist, if it did not).
//! * A crash leaves no temporary file behind where `O_TMPFILE` works (it has no name until
//!   the instant before the rename); elsewhere a named temporary of a dead process is removed
//!   by the next save to the same target. A failed or dropped save removes its own.
//! * A target that exists and is not a regular file (directory, device, FIFO, socket) is
//!   refused with [`ErrorKind::InvalidInput`] naming it, never replaced.
//! * A symbolic link at the target is **replaced**, never followed: afterwards the target
//!   path is a regular file holding the new bytes, and the file the link pointed to (if
//!   any) is left as it was, as `rename(2)` and `install(1)` do. (Following the link in
//!   user space would write wherever a link planted by another user points, out of reach
//!   of the kernel's `protected_symlinks` rule.) The directories on the way to the target
//!   may be symbolic links: the kernel resolves them, under its own rules, when the
//!   directory is opened.
//! * A save never gives a file to another user: the new file is the saver's, whoever owned
//!   the file it replaces (root saving over another user's file, say in a sticky `/tmp`,
//!   keeps its bytes its own). A regular file replaced gives the new one its group where
//!   the saver may set it (root, or a member of that group; else the saver's), and its
//!   permission and sticky bits; its set-user-ID bit only when the old file was the
//!   saver's too, its set-group-ID bit only when the new file has the old one's group. A
//!   new file, or one replacing a symbolic link, gets `0o666` less the umask.

use fastensor_core::{Error, ErrorKind, Result};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, CWD};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::hash::{BuildHasher, Hasher};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Names tried for a named temporary before giving up (each is new and random, so only
/// another process creating the same names on purpose makes more than one fail).
const NAME_TRIES: usize = 64;

/// A temporary file that replaces its target atomically on [`commit`](Self::commit); dropped
/// uncommitted, it leaves nothing behind.
#[derive(Debug)]
pub struct AtomicFile {
    /// The path given: its last component is the name replaced in `dir`.
    target: PathBuf,
    /// The target's directory, opened once; every later step is relative to it.
    dir: File,
    /// The target's name in `dir`.
    name: OsString,
    /// The temporary file, open for reading and writing.
    file: File,
    /// Its name in `dir` when it has one (no `O_TMPFILE`); removed unless committed.
    named: Option<OsString>,
    /// Mode, owner and group of the regular file replaced (see [`inherit`]).
    old: Option<(u32, u32, u32)>,
}

impl AtomicFile {
    /// A temporary file for replacing `path` (see the [module docs](self) for what a
    /// symbolic link at `path` means: it is replaced, not followed). Refuses a `path` that
    /// exists and is neither a regular file nor a symbolic link, and names `path` in every
    /// error. Removes the named temporaries of `path` that dead processes of this user left.
    pub fn new(path: &Path) -> Result<AtomicFile> {
        let name = path.file_name().map(OsStr::to_os_string).ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidInput,
                "a save needs a file name, not a directory",
            )
            .with_path(path)
        })?;
        let dir = open_dir(parent(path))
            .map_err(|e| Error::io(e, "cannot open the directory to save into").with_path(path))?;
        let old = replaced(&dir, &name, path)?;
        remove_stale(&dir, &name);
        if let Some(file) = unnamed_temp(&dir).map_err(|e| cannot_create(e, path))? {
            return Ok(AtomicFile {
                target: path.to_path_buf(),
                dir,
                name,
                file,
                named: None,
                old,
            });
        }
        let mut last = None;
        for _ in 0..NAME_TRIES {
            let temp = temp_name(&name, std::process::id(), unique());
            match rustix::fs::openat(
                &dir,
                temp.as_os_str(),
                OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::RDWR | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o666),
            ) {
                Ok(fd) => {
                    return Ok(AtomicFile {
                        target: path.to_path_buf(),
                        dir,
                        name,
                        file: File::from(fd),
                        named: Some(temp),
                        old,
                    })
                }
                Err(e) if e == rustix::io::Errno::EXIST => last = Some(e),
                Err(e) => return Err(cannot_create(e.into(), path)),
            }
        }
        let e = last.unwrap_or(rustix::io::Errno::EXIST);
        Err(cannot_create(e.into(), path))
    }

    /// The temporary file, open for reading and writing.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// A path that opens the temporary file again (for writers that open by path, such as
    /// the backends): `/proc/self/fd/N`, or where `/proc` is missing the named temporary's
    /// path. Valid until commit or drop.
    pub fn path(&self) -> PathBuf {
        match &self.named {
            Some(name) if !proc_fd_available() => parent(&self.target).join(name),
            _ => fd_path(&self.file),
        }
    }

    /// The path [`commit`](Self::commit) replaces: the path given, whatever it names now
    /// (a symbolic link there is replaced, not followed).
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// Makes the temporary file the target: syncs it, gives it the replaced file's group
    /// and mode where the saver may (see the [module docs](self); its owner stays the
    /// saver), renames it over the target's name in the directory opened by
    /// [`new`](Self::new) and syncs that directory. Errors name the target.
    pub fn commit(mut self) -> Result<()> {
        let target = self.target.clone();
        let fail = |e: std::io::Error, what: &str| save_error(e, what).with_path(&target);
        if let Some(old) = self.old {
            inherit(&self.file, old).map_err(|(e, what)| fail(e, what))?;
        }
        self.file
            .sync_all()
            .map_err(|e| fail(e, "cannot sync the new file"))?;
        let temp = match self.named.take() {
            Some(temp) => temp,
            // Named only for the rename; a crash in between leaves a name that the next
            // save removes.
            None => self
                .link_unnamed()
                .map_err(|e| fail(e, "cannot link the new file"))?,
        };
        if let Err(e) = rustix::fs::renameat(
            &self.dir,
            temp.as_os_str(),
            &self.dir,
            self.name.as_os_str(),
        ) {
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

    /// Gives the unnamed temporary a fresh name in the directory (`linkat` through its
    /// `/proc/self/fd` link, which creates a new name and never replaces one).
    fn link_unnamed(&self) -> std::io::Result<OsString> {
        let mut last = rustix::io::Errno::EXIST;
        for _ in 0..NAME_TRIES {
            let temp = temp_name(&self.name, std::process::id(), unique());
            match rustix::fs::linkat(
                CWD,
                fd_path(&self.file),
                &self.dir,
                temp.as_os_str(),
                AtFlags::SYMLINK_FOLLOW,
            ) {
                Ok(()) => return Ok(temp),
                Err(e) if e == rustix::io::Errno::EXIST => last = e,
                Err(e) => return Err(e.into()),
            }
        }
        Err(last.into())
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if let Some(temp) = self.named.take() {
            let _ = rustix::fs::unlinkat(&self.dir, temp.as_os_str(), AtFlags::empty());
        }
    }
}

/// Gives `new` (a file this process just made) what it may keep of the file it replaces,
/// `(mode, owner, group)`: the group where this process may set it, then the mode bits (see
/// the [module docs](self)). Never the owner. An error says what failed.
fn inherit(
    new: &File,
    (mode, uid, gid): (u32, u32, u32),
) -> std::result::Result<(), (std::io::Error, &'static str)> {
    use std::os::unix::fs::MetadataExt;
    let meta = new
        .metadata()
        .map_err(|e| (e, "cannot stat the new file"))?;
    let mut group = meta.gid();
    if gid != group {
        match std::os::unix::fs::fchown(new, None, Some(gid)) {
            Ok(()) => group = gid,
            // Not a group this process may give its files: the new file keeps its own.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EPERM | libc::EINVAL)) => {}
            Err(e) => return Err((e, "cannot give the new file the old one's group")),
        }
    }
    const SET_UID: u32 = 0o4000;
    const SET_GID: u32 = 0o2000;
    let mut keep = mode & 0o1777;
    if uid == meta.uid() {
        keep |= mode & SET_UID;
    }
    if gid == group {
        keep |= mode & SET_GID;
    }
    new.set_permissions(std::fs::Permissions::from_mode(keep))
        .map_err(|e| (e, "cannot give the new file the old one's mode"))
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

/// Opens the directory `dir` (the kernel resolves the symbolic links on its way) for the
/// `*at` calls of a save, and for syncing it.
fn open_dir(dir: &Path) -> std::io::Result<File> {
    let fd = rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    Ok(File::from(fd))
}

/// Mode, owner and group of the regular file called `name` in `dir`, `None` when there is
/// none or it is a symbolic link (replaced as it is, never followed); anything else there
/// is refused. Errors name `path`.
fn replaced(dir: &File, name: &OsStr, path: &Path) -> Result<Option<(u32, u32, u32)>> {
    let st = match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(rustix::io::Errno::NOENT) => return Ok(None),
        Err(e) => {
            return Err(Error::io(e.into(), "cannot stat the save target").with_path(path));
        }
    };
    match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => Ok(Some((st.st_mode & 0o7777, st.st_uid, st.st_gid))),
        FileType::Symlink => Ok(None),
        other => Err(Error::new(
            ErrorKind::InvalidInput,
            format!(
                "refusing to save over {}: not a regular file",
                crate::type_in_words(other)
            ),
        )
        .with_path(path)),
    }
}

/// A number for a temporary's name that no other save (of this process or another) is
/// likely to pick: random, and different at every call.
fn unique() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.finish()
}

/// Whether `/proc/self/fd` can reopen descriptors by path.
fn proc_fd_available() -> bool {
    Path::new("/proc/self/fd").is_dir()
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
    if !proc_fd_available() {
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
/// process ends: `O_TMPFILE`, or where the file system lacks it a new file called `name`
/// (never an existing one, nor a symbolic link's target), unlinked as soon as it is open.
/// Open it by path through [`fd_path`].
pub fn unnamed_file(dir: &Path, name: &str) -> std::io::Result<File> {
    let dir_file = open_dir(dir)?;
    if let Some(file) = unnamed_temp(&dir_file)? {
        return Ok(file);
    }
    let fd = rustix::fs::openat(
        &dir_file,
        name,
        OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::RDWR | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )?;
    rustix::fs::unlinkat(&dir_file, name, AtFlags::empty())?;
    Ok(File::from(fd))
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
/// `.NAME.tmp.PID`) whose process is dead: regular files owned by this process's user
/// only. Best effort: errors are ignored.
fn remove_stale(dir: &File, name: &OsStr) {
    let mut prefix = b".".to_vec();
    prefix.extend_from_slice(name.as_bytes());
    prefix.extend_from_slice(b".tmp.");
    let Ok(entries) = rustix::fs::Dir::read_from(dir) else {
        return;
    };
    let me = rustix::process::geteuid().as_raw();
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(rest) = file_name.to_bytes().strip_prefix(prefix.as_slice()) else {
            continue;
        };
        let Some(pid) = stale_pid(rest) else {
            continue;
        };
        let alive = match rustix::process::Pid::from_raw(pid) {
            Some(p) => rustix::process::test_kill_process(p) != Err(rustix::io::Errno::SRCH),
            None => true,
        };
        if alive {
            continue;
        }
        let ours = rustix::fs::statat(dir, file_name, AtFlags::SYMLINK_NOFOLLOW).is_ok_and(|st| {
            FileType::from_raw_mode(st.st_mode) == FileType::RegularFile && st.st_uid == me
        });
        if ours {
            let _ = rustix::fs::unlinkat(dir, file_name, AtFlags::empty());
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
