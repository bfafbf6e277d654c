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
            eprintln!("fastensor: error: {}", shorten_lines(&e.to_string()));
            ExitCode::FAILURE
        }
    }
}

/// Longest line of an error message printed whole; longer lines (a parser quoting a huge
/// input line) are cut, saying how much was left out.
const MAX_LINE: usize = 300;

/// `msg` with every line longer than [`MAX_LINE`] characters cut to that length.
fn shorten_lines(msg: &str) -> String {
    msg.split('\n')
        .map(|line| match line.char_indices().nth(MAX_LINE) {
            Some((cut, _)) => {
                let rest = line[cut..].chars().count();
                format!("{}... ({rest} more characters)", &line[..cut])
            }
            None => line.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lines_are_cut_short_ones_kept() {
        let long = "x".repeat(1000);
        let out = shorten_lines(&format!("short\n{long}\nend"));
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "short");
        assert!(lines[1].len() < MAX_LINE + 40, "{}", lines[1]);
        assert!(lines[1].ends_with("(700 more characters)"), "{}", lines[1]);
        assert_eq!(lines[2], "end");
        assert_eq!(
            shorten_lines("é".repeat(400).as_str()).chars().count(),
            300 + 25
        );
    }
}
