//! Loads of a file that is replaced while it is read: tried again, whole.

use crate::{ErrorKind, Result};

/// Tries of one load whose file is replaced (renamed over) while it is read: the one
/// retry of fastensor (the Python package adds none).
pub const LOAD_ATTEMPTS: usize = 5;

/// Runs `attempt` (a whole load: open the path, read the header, read the data) again
/// while it fails with [`ErrorKind::Changed`] (the file was replaced by another while it was
/// read), at most [`LOAD_ATTEMPTS`] times in all; each try reads one version of the file,
/// and a failed try's bytes are never returned. The last error is returned as it is.
pub(crate) fn retry_changed<T>(mut attempt: impl FnMut() -> Result<T>) -> Result<T> {
    let mut tries = 1;
    loop {
        match attempt() {
            Err(e) if e.kind() == ErrorKind::Changed && tries < LOAD_ATTEMPTS => tries += 1,
            done => return done,
        }
    }
}
