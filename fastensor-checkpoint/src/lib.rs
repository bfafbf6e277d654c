//! Checkpoints in the [safetensors](https://github.com/huggingface/safetensors) format,
//! saved and loaded at device speed.
//!
//! * [`save`] writes a valid safetensors file whose data section starts on a 4096-byte
//!   boundary (the JSON header is padded with spaces), in large aligned writes issued in
//!   parallel, durably and atomically (temporary file, sync, rename, directory sync).
//! * [`load`] reads the data section into one aligned arena and hands out zero-copy views;
//!   [`load_selected`] reads only the tensors asked for (merging neighbours);
//!   [`load_into`] fills the caller's buffers; [`CheckpointFile::read_slice`] reads only the
//!   bytes a slice of one tensor covers.
//! * Every checkpoint form (one file, a sharded checkpoint's index and shards, raw files
//!   read by byte ranges) is one [`CheckpointSource`], opened and validated once; all its
//!   reads (into caller memory, into a new arena, slices, raw ranges) go through one
//!   planner: one job per file, small neighbours staged, the files' reads in flight together.
//!   [`CheckpointFile`] and [`ShardedFile`] are its single-file and sharded faces.
//! * [`serialize`] lays tensors out as a file in memory, as the `safetensors` crate does.
//! * [`parse_header`] validates hostile input without panicking; every defect is an
//!   [`fastensor_core::ErrorKind::Corrupt`] error naming the file and the tensor.
//! * [`inspect`], [`rows`] and [`copy`] serve the command line.
//!
//! Files written by other tools (unaligned data sections) load too.
//!
//! Every transfer goes through a [`FileOpener`]: the facade's `Engine` (which picks the
//! backend per transfer), or any [`Backend`](fastensor_core::Backend). This crate knows no
//! backend, no engine and no object store: what differs between files and objects is asked
//! of the opener.
#![deny(missing_docs)]

mod arena;
pub mod checksum;
pub mod group;
mod header;
mod into_arena;
mod load;
mod loaded;
mod mapped;
mod plan;
mod retry;
mod save;
mod serialize;
mod shard_index;
pub mod sharded;
mod slice;
mod source;
mod source_file;
mod sums;
mod tools;
mod view;

pub use arena::{Arena, Placement};
pub use checksum::{verify_file, Checksums, Verified, CHECKSUMS_KEY};
pub use header::{
    parse_header, Header, HeaderEntry, DATA_ALIGN, MAX_HEADER_LEN, MAX_RANK, METADATA_KEY,
};
pub use load::{
    load, load_into, load_later, load_placed, load_selected, load_verified, open, CheckpointFile,
};
pub use loaded::{Checkpoint, CheckpointParts};
pub use mapped::PendingPages;
pub use plan::{congruent_pad, direct_read_pad};
pub use retry::LOAD_ATTEMPTS;
pub use save::{save, save_checked, save_section, save_with_metadata};
pub use serialize::{serialize, serialized, Serialized, SERIALIZED_ALIGN};
pub use sharded::{
    load_into_sharded, load_selected_sharded, load_sharded, open_sharded, read_ranges,
    save_sharded, save_sharded_with_metadata, ShardedCheckpoint, ShardedFile, ShardedIndex,
};
pub use slice::{slice_runs, DimSelection};
pub use source::CheckpointSource;
pub use tools::{copy, format_table, inspect, rows, write_table, InspectRow};
pub use view::TensorView;

pub use fastensor_core::FileOpener;

// The core's names, as the modules of this crate use them (`crate::Error`, ...).
use fastensor_core::{
    BackendFile, DType, Error, ErrorKind, HostBuffer, MemMut, MemRef, OpenMode, Result, TensorDesc,
};

/// Threads that issue the transfers of one checkpoint (the caller's included).
pub(crate) const IO_THREADS: usize = 4;
