//! `airlock`: the command-line entry point. Thin: every subcommand parses its
//! arguments and calls a library crate.

#![forbid(unsafe_code)]

mod cmd;
mod logging;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "airlock",
    version,
    about = "Run untrusted agent code in a sandbox whose only way out is its sidecar"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Inspect the egress guard (URL policy, SSRF protection).
    #[command(subcommand)]
    Egress(cmd::egress::EgressCommand),
    /// Run an agent in a sandbox beside its sidecar, then print the run report.
    Run(cmd::run::RunArgs),
    /// The platform as a long-lived HTTP API server (tenants, queued runs, replicas, webhooks).
    Serve(cmd::serve::ServeArgs),
    /// Organizations and their API keys for `airlock serve` (the admin's bootstrap).
    #[command(subcommand)]
    Orgs(cmd::orgs::OrgsCommand),
    /// The caller's organization on an `airlock serve`: its model budgets.
    Org(cmd::org::OrgArgs),
    /// Inspect recorded runs.
    Runs(cmd::runs::RunsArgs),
    /// Which backends and isolation features work on this host: a verdict
    /// and the next step per backend.
    Doctor(cmd::doctor::DoctorArgs),
    /// Airlock's main job end to end with a local example API and model.
    #[command(after_help = "Examples:\n  airlock demo\n  airlock demo --backend docker")]
    Demo {
        /// process | namespace | docker | auto (default: RUN_ADAPTER, else auto).
        #[arg(long)]
        backend: Option<String>,
    },
    /// Run one run's sidecar (configuration as JSON on stdin; started by
    /// the platform only).
    #[command(hide = true)]
    Sidecar,
    /// The in-sandbox launcher (run secrets as JSON on stdin).
    #[command(hide = true)]
    Runtime {
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// The in-sandbox launcher of a local MCP runner (its secrets as JSON on stdin).
    #[command(hide = true)]
    Runner {
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Manage stored connections (encrypted credentials).
    Connections(cmd::connections::ConnectionsArgs),
    /// Manage the connection-encryption keys.
    #[command(subcommand)]
    Keys(cmd::keys::KeysCommand),
    /// Agent bundles: pack a directory's manifest, sign it, verify it as the platform does.
    #[command(subcommand)]
    Bundle(cmd::bundle::BundleCommand),
    /// The live model catalog's signing tool: keys, signatures, verification.
    #[command(subcommand)]
    Catalog(cmd::catalog::CatalogCommand),
    /// The docker backend's images (built locally, no registry).
    #[command(subcommand)]
    Images(cmd::images::ImagesCommand),
    /// The namespace sandbox's setup process (started by the backend only).
    #[command(hide = true)]
    SandboxInit,
    /// PID 1 of a docker sandbox's container (started by the backend only).
    #[command(hide = true)]
    ContainerInit {
        /// The run's command follows on stdin's first line (a warm pool's container).
        #[arg(long)]
        command_on_stdin: bool,
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Prints the OpenAPI document `airlock serve` serves (the SDKs are generated from it).
    #[command(hide = true)]
    Openapi,
}

fn main() -> std::process::ExitCode {
    // The sandbox's init starts for every run, on its critical path: straight
    // to it, without building the parser of the whole command line (it takes
    // no argument).
    let mut args = std::env::args_os().skip(1);
    if let (Some(sub), None) = (args.next(), args.next())
        && sub == airlock_sandbox::namespace::INIT_SUBCOMMAND
    {
        return cmd::sandbox_init::run();
    }
    let mut args = std::env::args_os().skip(1);
    if let (Some(sub), None) = (args.next(), args.next()) {
        if sub == airlock_sandbox::microvm::image::VM_INIT_SUBCOMMAND {
            return cmd::sandbox_init::vm_init();
        }
        if sub == airlock_sandbox::microvm::host::HOST_SUBCOMMAND {
            return cmd::sandbox_init::microvm_host();
        }
    }
    let cli = Cli::parse();
    match cli.command {
        Command::Egress(c) => cmd::egress::run(c),
        Command::Run(a) => cmd::run::run(a),
        Command::Runs(c) => cmd::runs::run(c),
        Command::Serve(a) => cmd::serve::run(a),
        Command::Orgs(c) => cmd::orgs::run(c),
        Command::Org(a) => cmd::org::run(a),
        Command::Doctor(a) => cmd::doctor::run(a),
        Command::Demo { backend } => cmd::demo::run(backend),
        Command::Sidecar => cmd::sidecar::run(),
        Command::Runtime { command } => cmd::runtime::run(command, cmd::runtime::Role::Agent),
        Command::Runner { command } => cmd::runtime::run(command, cmd::runtime::Role::Runner),
        Command::Connections(c) => cmd::connections::run(c),
        Command::Keys(c) => cmd::keys::run(c),
        Command::Images(c) => cmd::images::run(c),
        Command::Catalog(c) => cmd::catalog::run(c),
        Command::Bundle(c) => cmd::bundle::run(c),
        Command::SandboxInit => cmd::sandbox_init::run(),
        Command::ContainerInit {
            command,
            command_on_stdin,
        } => cmd::sandbox_init::container(&command, command_on_stdin),
        Command::Openapi => cmd::openapi::run(),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    /// Every argument a person can see says what it is for.
    fn undescribed(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
        for a in cmd.get_arguments() {
            let id = a.get_id().as_str();
            if a.is_hide_set() || id == "help" || id == "version" {
                continue;
            }
            if a.get_help().is_none() && a.get_long_help().is_none() {
                out.push(format!("{path} {id}"));
            }
        }
        for sub in cmd.get_subcommands() {
            if !sub.is_hide_set() {
                undescribed(sub, &format!("{path} {}", sub.get_name()), out);
            }
        }
    }

    #[test]
    fn every_visible_argument_is_described() {
        let mut out = Vec::new();
        undescribed(&super::Cli::command(), "airlock", &mut out);
        assert!(out.is_empty(), "arguments without a description: {out:?}");
    }
}
