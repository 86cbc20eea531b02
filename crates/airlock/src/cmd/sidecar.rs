//! `airlock sidecar`: one run's sidecar. Reads its configuration and secrets
//! as one JSON document on stdin (never argv or the environment), prints a
//! readiness line on stdout, logs to stderr, stops on SIGTERM/SIGINT
//! ([`airlock_sidecar::server::main_from_stdin`]).

use std::process::ExitCode;

pub fn run() -> ExitCode {
    crate::logging::init();
    tracing::debug!(target: "airlock::phase", "sidecar: main");
    airlock_sidecar::server::main_from_stdin()
}
