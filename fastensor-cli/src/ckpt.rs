//! `fastensor ckpt ...`: inspect and re-save safetensors checkpoints.

use clap::Subcommand;
use fastensor::checkpoint;
use fastensor::{Engine, Result};
use std::path::PathBuf;

/// `fastensor ckpt ...`.
#[derive(Debug, Subcommand)]
pub enum CkptCommand {
    /// Print a checkpoint's tensors: names, dtypes, shapes, bytes.
    Inspect {
        /// A safetensors file.
        file: PathBuf,
    },
    /// Re-save a checkpoint through the fast path (aligns a file written elsewhere).
    Copy {
        /// The checkpoint to read.
        src: PathBuf,
        /// Where to write the copy (atomically).
        dst: PathBuf,
    },
}

/// Runs `fastensor ckpt ...`.
pub fn run(cmd: CkptCommand) -> Result<()> {
    match cmd {
        CkptCommand::Inspect { file } => {
            let header = checkpoint::inspect(&file)?;
            print!("{}", checkpoint::format_table(&header));
            Ok(())
        }
        CkptCommand::Copy { src, dst } => {
            let engine = Engine::new()?;
            let bytes = checkpoint::copy(&engine, &src, &dst)?;
            println!(
                "copied {bytes} bytes of tensors from {} to {}",
                src.display(),
                dst.display()
            );
            Ok(())
        }
    }
}
