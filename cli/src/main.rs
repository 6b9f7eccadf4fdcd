//! `proftap`: the command-line front end. Arguments become plain option
//! structs here; the libraries never see clap.

mod commands;
mod output;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Exact call counts, per-call costs and line counts of unmodified Linux programs.
#[derive(Parser)]
#[command(name = "proftap", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List the functions (and line rows) of a binary or a running process.
    Symbols(commands::symbols::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Symbols(args) => commands::symbols::run(args),
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("proftap: {}", output::error_sentence(&error));
            ExitCode::from(2)
        }
    }
}
