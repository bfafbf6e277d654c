//! Sharded checkpoints in the Hugging Face layout: `model-00001-of-00003.safetensors`, ...
//! next to `model.safetensors.index.json` (`metadata.total_size` and a `weight_map` from
//! tensor name to shard file), and ranged reads across many files as one job.
//!
//! * [`save_sharded`] splits the tensors (in order) into shards of at most
//!   `max_shard_bytes` (a tensor larger than that gets a shard of its own), writes the shards
//!   concurrently, each durably and atomically as [`save`](super::save) does, and writes the
//!   index last, atomically ([`fastensor_sys::atomic::write`]). An index already
//!   in the directory is removed first, so a crash leaves either no index or one whose every
//!   shard is whole and of the same save. Under an object prefix the shards' names carry a
//!   tag of their save and the index object is the commit point: a crash leaves the
//!   previous index and its shards.
//! * [`open_sharded`] validates the index and every shard's header; its
//!   [`read_into`](ShardedFile::read_into) fills caller buffers with requests of all files
//!   in flight together. [`load_sharded`], [`load_selected_sharded`] and
//!   [`load_into_sharded`] are built on it.
//! * [`read_ranges`] reads raw byte ranges of any files into caller buffers, in one job
//!   (the `torch.distributed.checkpoint` reader's path).
mod read;
mod save;

pub use super::shard_index::{
    is_sharded, is_sharded_at, read_index, resolve_index, shard_name, tagged_shard_name,
    ShardedIndex, INDEX_NAME,
};
pub use read::{
    load_into_sharded, load_selected_sharded, load_sharded, open_sharded, read_ranges,
    ShardedCheckpoint, ShardedFile,
};
pub use save::{
    copy_sharded, inspect_sharded, plan_shards, save_sharded, save_sharded_with_metadata,
};
