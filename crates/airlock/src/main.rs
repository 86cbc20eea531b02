//! `airlock`: the command-line entry point. Thin: every subcommand parses its
//! arguments and calls a library crate.

mod cmd;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "airlock", version, about = "Run untrusted agent code in a sandbox whose only way out is its sidecar")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Inspect the egress guard (URL policy, SSRF protection).
    #[command(subcommand)]
    Egress(cmd::egress::EgressCommand),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Egress(c) => cmd::egress::run(c),
    }
}
