//! `mpsfleet`: the one binary. Parses the command line and calls into the library crates.

mod bench;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "mpsfleet", version, about = "Run GPU workloads that share NVIDIA GPUs through MPS")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Benchmarks that print their figures as a final JSON line.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Bench(cmd) => bench::run(cmd),
    }
}
