//! A table of the live handles of one kind (streams, events, registered files, batches).
//! A handle is the table's tag plus a counter, never reused; looking up or removing a handle
//! the table does not hold counts an `invalid_handle` violation.

use crate::stats;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

/// The live handles of one kind and what each names.
pub(crate) struct Handles<T> {
    tag: usize,
    /// What a live handle is, for the violation: "a live stream".
    what: &'static str,
    next: AtomicUsize,
    map: Mutex<Option<HashMap<usize, T>>>,
}

impl<T: Clone> Handles<T> {
    /// An empty table whose handles start at `tag`; `what` names a live handle.
    pub(crate) const fn new(tag: usize, what: &'static str) -> Self {
        Self {
            tag,
            what,
            next: AtomicUsize::new(1),
            map: Mutex::new(None),
        }
    }

    fn map(&self) -> MutexGuard<'_, Option<HashMap<usize, T>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds `value` under a new handle; that handle.
    pub(crate) fn insert(&self, value: T) -> *mut c_void {
        let h = self.tag + 16 * self.next.fetch_add(1, Ordering::Relaxed);
        self.map().get_or_insert_with(HashMap::new).insert(h, value);
        h as *mut c_void
    }

    /// What `handle` names; `None`, counted as a violation of `call`, when it is not live.
    pub(crate) fn get(&self, call: &str, handle: *mut c_void) -> Option<T> {
        let found = self
            .map()
            .as_ref()
            .and_then(|m| m.get(&(handle as usize)).cloned());
        found.or_else(|| self.invalid(call, handle))
    }

    /// Removes `handle`; what it named, or `None`, counted as a violation of `call`, when it
    /// was not live.
    pub(crate) fn remove(&self, call: &str, handle: *mut c_void) -> Option<T> {
        let removed = self
            .map()
            .as_mut()
            .and_then(|m| m.remove(&(handle as usize)));
        removed.or_else(|| self.invalid(call, handle))
    }

    /// What every live handle names.
    pub(crate) fn values(&self) -> Vec<T> {
        self.map()
            .as_ref()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    /// How many handles are live.
    pub(crate) fn len(&self) -> usize {
        self.map().as_ref().map_or(0, HashMap::len)
    }

    fn invalid(&self, call: &str, handle: *mut c_void) -> Option<T> {
        let what = self.what;
        stats::violation(
            "invalid_handle",
            &format!("{call}: {handle:?} is not {what}"),
        );
        None
    }
}
