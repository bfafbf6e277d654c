//! fastensor io_uring backend (in progress).
#![deny(missing_docs)]

/// Makes sure this crate is linked, so its registrations are seen.
#[inline(never)]
pub fn link() {}
