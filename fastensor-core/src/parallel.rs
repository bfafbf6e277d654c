//! Runs independent pieces of one transfer on a few threads at once.
//!
//! No thread outlives the call that started it (they are scoped to it), and no state is
//! kept between calls: a process made by `fork` while another thread was in a call has no
//! pool to rebuild and no lock of it to inherit.

use crate::Result;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Runs `work` on every item, using up to `threads` threads (the caller's included), and
/// returns the first error. Items are taken in order; after an error no new item starts.
///
/// With one item or one thread everything runs on the caller's thread, so small transfers pay
/// no thread start-up.
pub fn for_each<T, F>(items: Vec<T>, threads: usize, work: F) -> Result<()>
where
    T: Send,
    F: Fn(T) -> Result<()> + Sync,
{
    let workers = threads.max(1).min(items.len());
    if workers <= 1 {
        return items.into_iter().try_for_each(work);
    }
    let queue = Mutex::new(items.into_iter());
    let failed = AtomicBool::new(false);
    let first_error = Mutex::new(None);
    let run = || loop {
        if failed.load(Ordering::Relaxed) {
            return;
        }
        let next = queue.lock().unwrap_or_else(|p| p.into_inner()).next();
        let Some(item) = next else { return };
        if let Err(e) = work(item) {
            failed.store(true, Ordering::Relaxed);
            first_error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert(e);
            return;
        }
    };
    std::thread::scope(|scope| {
        for _ in 1..workers {
            scope.spawn(run);
        }
        run();
    });
    match first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Error, ErrorKind};
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn runs_every_item_once() {
        let sum = AtomicUsize::new(0);
        for_each((1..=100usize).collect(), 4, |i| {
            sum.fetch_add(i, Ordering::Relaxed);
            Ok(())
        })
        .unwrap();
        assert_eq!(sum.into_inner(), 5050);
    }

    #[test]
    fn returns_an_error() {
        let err = for_each((0..50).collect(), 3, |i: i32| {
            if i == 7 {
                Err(Error::new(ErrorKind::Io, "boom"))
            } else {
                Ok(())
            }
        })
        .unwrap_err();
        assert_eq!(err.message(), "boom");
    }
}
