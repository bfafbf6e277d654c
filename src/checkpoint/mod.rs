//! Checkpoints in the [safetensors](https://github.com/huggingface/safetensors) format,
//! saved and loaded at device speed.
//!
//! * [`save`] writes a valid safetensors file whose data section starts on a 4096-byte
//!   boundary (the JSON header is padded with spaces), in large aligned writes issued in
//!   parallel, durably and atomically (temporary file, sync, rename, directory sync).
//! * [`load`] reads the data section into one aligned arena and hands out zero-copy views;
//!   [`load_selected`] reads only the tensors asked for (merging neighbours);
//!   [`load_into`] fills the caller's buffers.
//! * [`parse_header`] validates hostile input without panicking; every defect is an
//!   [`ErrorKind::Corrupt`](crate::ErrorKind::Corrupt) error naming the file and the tensor.
//! * [`inspect`], [`rows`] and [`copy`] serve the command line; [`bench`] builds the
//!   benchmark's state dict and measures the disk.
//!
//! Files written by other tools (unaligned data sections) load too.
//!
//! Every transfer goes through a [`FileOpener`]: any [`Backend`] today.
// NOTE(engine): when `fastensor::Engine` lands, add `impl FileOpener for Engine` (in
// src/engine, or here) so that the engine picks the backend per transfer; the functions below
// are generic over `FileOpener` and need no other change.

#[cfg(feature = "posix")]
pub mod bench;
mod header;
mod load;
mod save;
mod tools;
mod validate;

pub use header::{parse_header, Header, HeaderEntry, DATA_ALIGN, MAX_HEADER_LEN, METADATA_KEY};
pub use load::{load, load_into, load_selected, Checkpoint};
pub use save::{save, save_with_metadata, TensorView};
pub use tools::{copy, format_table, inspect, rows, InspectRow};

use crate::{Backend, BackendFile, OpenMode, Result};
use std::path::Path;

/// Threads that issue the transfers of one checkpoint (the caller's included).
pub(crate) const IO_THREADS: usize = 4;

/// Opens files for checkpoint transfers: a [`Backend`] now, the engine (which picks a backend
/// per transfer) once it exists.
pub trait FileOpener: Send + Sync {
    /// Opens `path` in `mode`. Errors name the file.
    fn open_file(&self, path: &Path, mode: OpenMode) -> Result<Box<dyn BackendFile>>;
}

impl<B: Backend + ?Sized> FileOpener for B {
    fn open_file(&self, path: &Path, mode: OpenMode) -> Result<Box<dyn BackendFile>> {
        self.open(path, mode)
    }
}
