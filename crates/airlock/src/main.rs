//! `airlock`: the command-line entry point. Thin: every subcommand parses its
//! arguments and calls a library crate.

mod cmd;
mod logging;

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
    /// Run one run's sidecar (configuration as JSON on stdin).
    Sidecar,
    /// Manage stored connections (encrypted credentials).
    #[command(subcommand)]
    Connections(cmd::connections::ConnectionsCommand),
    /// Manage the connection-encryption keys.
    #[command(subcommand)]
    Keys(cmd::keys::KeysCommand),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Egress(c) => cmd::egress::run(c),
        Command::Sidecar => cmd::sidecar::run(),
        Command::Connections(c) => cmd::connections::run(c),
        Command::Keys(c) => cmd::keys::run(c),
    }
}
