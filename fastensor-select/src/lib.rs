//! fastensor backend selection (in progress).
#![deny(missing_docs)]
#![forbid(unsafe_code)]
