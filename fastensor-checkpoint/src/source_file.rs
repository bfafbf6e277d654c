//! One open file of a [`CheckpointSource`](super::CheckpointSource): what the planner reads
//! through.

use super::header::Header;
use super::sums::Checksums;
use crate::BackendFile;
use std::path::PathBuf;

/// One open file of a source.
pub(crate) struct SourceFile {
    /// The path it was opened at (errors name it).
    pub path: PathBuf,
    /// The open file: every read of the source goes through it, so that a file renamed
    /// over the path later is never read (the engine's files check their identity).
    pub file: Box<dyn BackendFile>,
    /// Its validated header; `None` for a file read as raw byte ranges.
    pub header: Option<Header>,
    /// Set by [`CheckpointSource::verifying`](super::CheckpointSource::verifying): the checksums its header stores.
    pub checksums: Option<Checksums>,
}

impl SourceFile {
    /// The file's header (a file of a checkpoint has one).
    pub(crate) fn header(&self) -> &Header {
        self.header
            .as_ref()
            .expect("a checkpoint's file has a validated header")
    }
}
