//! Throttled wrapper (arrives with the selection work).
