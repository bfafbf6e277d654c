//! `fastensor ckpt ...`: inspect, re-save and benchmark safetensors checkpoints.

use clap::Subcommand;
use fastensor::checkpoint::Header;
use fastensor::checkpoint::{self, sharded};
use fastensor::{Engine, Result};
use std::path::{Path, PathBuf};

/// `fastensor ckpt ...`.
#[derive(Debug, Subcommand)]
pub enum CkptCommand {
    /// Print a checkpoint's tensors: names, dtypes, shapes, bytes.
    Inspect {
        /// A safetensors file, or a sharded checkpoint (its directory or its index); or an
        /// object, `s3://bucket/key` (a key not ending in `.safetensors` is a sharded
        /// checkpoint's prefix).
        file: PathBuf,
    },
    /// Check every tensor of a checkpoint against the checksums saved with it
    /// (`save_file(..., checksum=True)`), without loading it anywhere.
    Verify {
        /// A safetensors file, or a sharded checkpoint (its directory or its index).
        file: PathBuf,
    },
    /// Re-save a checkpoint through the fast path (aligns a file written elsewhere).
    Copy {
        /// The checkpoint to read: a file, or a sharded checkpoint (directory or index); or
        /// an object or prefix, `s3://bucket/key`.
        src: PathBuf,
        /// Where to write the copy (atomically): a file, or for a sharded checkpoint a
        /// directory (its shards keep their split; the index is written last).
        dst: PathBuf,
    },
    /// Save and load a GPT-2-medium-shaped state dict (1.4 GB of f32, 292 tensors) through
    /// fastensor, the safetensors crate and plain buffered I/O, next to the disk's limit.
    Bench {
        /// Directory on the file system to measure.
        #[arg(long)]
        dir: PathBuf,
        /// Size factor of the state dict (1.0: the full model; 0.25 for a quick run).
        #[arg(long, default_value_t = 1.0)]
        scale: f64,
        /// Rounds to run; with several, the best of each row is printed too.
        #[arg(long, default_value_t = 1)]
        rounds: usize,
    },
}

/// Runs `fastensor ckpt ...`.
pub fn run(cmd: CkptCommand) -> Result<()> {
    match cmd {
        CkptCommand::Inspect { file } => inspect(&file),
        CkptCommand::Verify { file } => verify(&file),
        CkptCommand::Bench { dir, scale, rounds } => crate::ckpt_bench::run(&dir, scale, rounds),
        CkptCommand::Copy { src, dst } => {
            let engine = Engine::new()?;
            let bytes = if sharded::is_sharded(&engine, &src) {
                sharded::copy_sharded(&engine, &src, &dst)?
            } else {
                checkpoint::copy(&engine, &src, &dst)?
            };
            println!(
                "copied {bytes} bytes of tensors from {} to {}",
                src.display(),
                dst.display()
            );
            Ok(())
        }
    }
}

/// `fastensor ckpt inspect`: a file's header, or a sharded checkpoint's index and shard
/// headers; where the engine's place for `path` has no directories (an object, `s3://…`),
/// by ranged reads through the engine.
fn inspect(path: &Path) -> Result<()> {
    let place = fastensor::engine::place_of(path);
    if !place.directories {
        return inspect_object(&Engine::new()?, path);
    }
    if sharded::is_sharded_at(place, path) {
        let (index, shards) = sharded::inspect_sharded(path)?;
        print_sharded(&index, &shards);
        return Ok(());
    }
    print_table(&checkpoint::inspect(path)?)
}

/// [`inspect`] of an object: its header by ranged reads, or a sharded checkpoint's index
/// and shard headers under a prefix.
fn inspect_object(engine: &Engine, url: &Path) -> Result<()> {
    if sharded::is_sharded(engine, url) {
        let file = checkpoint::open_sharded(engine, url)?;
        let shards: Vec<(PathBuf, Header)> = file
            .shard_paths()
            .into_iter()
            .zip(file.headers())
            .map(|(p, h)| (p.to_path_buf(), h.clone()))
            .collect();
        print_sharded(file.index(), &shards);
        return Ok(());
    }
    print_table(checkpoint::open(engine, url)?.header())
}

/// The listing of one file's header.
fn print_table(header: &Header) -> Result<()> {
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    checkpoint::write_table(header, &mut out)
        .and_then(|()| std::io::Write::flush(&mut out))
        .map_err(|e| fastensor::Error::io(e, "cannot print the table"))
}

/// The listing of a sharded checkpoint: each shard's table, then a summary line.
fn print_sharded(index: &sharded::ShardedIndex, shards: &[(PathBuf, Header)]) {
    let (mut tensors, mut bytes) = (0usize, 0u64);
    for (path, header) in shards {
        println!("== {}", path.display());
        print!("{}", checkpoint::format_table(header));
        tensors += header.entries().len();
        bytes += header.data_len();
    }
    println!(
        "{}: {} shards, {} tensors in the weight map ({tensors} in the shards), {bytes} data bytes{}",
        index.path.display(),
        shards.len(),
        index.weight_map.len(),
        index
            .total_size
            .map(|t| format!(", total_size {t}"))
            .unwrap_or_default()
    );
}

/// `fastensor ckpt verify`: each file's tensors against their checksums; the first mismatch
/// is the error (naming the file and the tensor).
fn verify(path: &std::path::Path) -> Result<()> {
    let engine = Engine::new()?;
    let files: Vec<PathBuf> = if sharded::is_sharded(&engine, path) {
        let ckpt = checkpoint::open_sharded(&engine, path)?;
        ckpt.shard_paths().iter().map(|p| p.to_path_buf()).collect()
    } else {
        vec![path.to_path_buf()]
    };
    let (mut tensors, mut bytes) = (0usize, 0u64);
    for file in &files {
        let v = checkpoint::verify_file(&engine, file)?;
        println!(
            "ok  {}: {} tensors, {} bytes",
            file.display(),
            v.tensors,
            v.bytes
        );
        tensors += v.tensors;
        bytes += v.bytes;
    }
    println!(
        "verified {tensors} tensors ({bytes} bytes) in {} file(s): every checksum matches",
        files.len()
    );
    Ok(())
}
