//! `fastensor`: list the I/O backends of this build and benchmark them on your disk.
#![forbid(unsafe_code)]

mod backends;
mod bench;
mod sizes;
mod table;

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
    /// Measure every backend for sizes x directions on a directory's file system.
    Bench(bench::BenchArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Backends => backends::run(),
        Command::Bench(args) => bench::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fastensor: error: {e}");
            ExitCode::FAILURE
        }
    }
}
