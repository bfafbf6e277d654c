//! `fastensor`: list the I/O backends of this build and benchmark them on your disk.
// One `unsafe` block maps a file for the safetensors reference row of `ckpt bench`.
#![deny(unsafe_code)]

mod backends;
mod bench;
mod ckpt;
mod ckpt_bench;
mod scratch;
mod sizes;
mod table;
mod tune;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Moves tensors between SSD files and memory through the fastest I/O path.
#[derive(Debug, Parser)]
#[command(name = "fastensor", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List every backend of this build: available or why not, origin, capabilities.
    Backends,
    /// Measure every backend (and its knobs) for sizes x directions x page-cache states on a
    /// directory's file system; `bench compare A.json B.json` for two runs.
    Bench(Box<bench::BenchCli>),
    /// Explore the backends on a directory's file system and write the selection profile.
    Tune(tune::TuneArgs),
    /// Work with selection profiles.
    #[command(subcommand)]
    Profile(tune::ProfileCommand),
    /// Inspect and copy safetensors checkpoints.
    #[command(subcommand)]
    Ckpt(ckpt::CkptCommand),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    scratch::install();
    let result = match cli.command {
        Command::Backends => backends::run(),
        Command::Bench(args) => bench::run(*args),
        Command::Tune(args) => tune::run_tune(args),
        Command::Profile(cmd) => tune::run_profile(cmd),
        Command::Ckpt(cmd) => ckpt::run(cmd),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fastensor: error: {e}");
            ExitCode::FAILURE
        }
    }
}
