//! Scratch files and directories of a command: removed when their guard drops, and on
//! SIGINT, SIGTERM and SIGHUP too, after which the process ends as the signal would have
//! ended it (the shell sees status 130 for SIGINT, 143 for SIGTERM).

use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The scratch paths that exist now.
static LIVE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Starts the thread that cleans up on SIGINT, SIGTERM and SIGHUP. Call once, first thing.
/// Without it (when the handlers cannot be installed) the guards still clean up on drop.
pub fn install() {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]) else {
        return;
    };
    std::thread::spawn(move || {
        if let Some(sig) = signals.forever().next() {
            remove_all();
            // Ends the process as the signal's default action does; should that fail, exits
            // with the shell's status for it.
            let _ = signal_hook::low_level::emulate_default_handler(sig);
            std::process::exit(128 + sig);
        }
    });
}

fn live() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    LIVE.lock().unwrap_or_else(|p| p.into_inner())
}

fn remove(path: &Path) {
    if path.is_dir() {
        // Another thread may still create a file in the directory while it is emptied
        // (its last `rmdir` then fails, not empty): again until the directory is gone, after
        // which no file can be created in it.
        for _ in 0..100 {
            if std::fs::remove_dir_all(path).is_ok() || !path.exists() {
                break;
            }
        }
    } else {
        let _ = std::fs::remove_file(path);
    }
}

/// Removes every scratch path now (the lock stays held, so no new one appears meanwhile).
fn remove_all() {
    for p in live().iter() {
        remove(p);
    }
}

/// A scratch file or directory at `path`: removed when dropped, or on a signal.
#[derive(Debug)]
pub struct Scratch(PathBuf);

impl Scratch {
    /// Registers `path` (not created here) for removal.
    pub fn new(path: PathBuf) -> Scratch {
        live().push(path.clone());
        Scratch(path)
    }

    /// The path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let mut live = live();
        remove(&self.0);
        if let Some(i) = live.iter().position(|p| *p == self.0) {
            live.swap_remove(i);
        }
    }
}
