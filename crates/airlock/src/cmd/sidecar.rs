//! `airlock sidecar`: one run's sidecar. Reads its configuration and secrets
//! as one JSON document on stdin (never argv or the environment), prints a
//! readiness line on stdout, logs to stderr, stops on SIGTERM/SIGINT.

use std::io::Read;
use std::process::ExitCode;

use airlock_sidecar::SidecarConfig;
use airlock_sidecar::config::MAX_CONFIG_BYTES;

pub fn run() -> ExitCode {
    crate::logging::init();
    tracing::debug!(target: "airlock::phase", "sidecar: main");
    let mut buf = Vec::new();
    let read = std::io::stdin()
        .take(MAX_CONFIG_BYTES as u64 + 1)
        .read_to_end(&mut buf);
    if let Err(e) = read {
        eprintln!("airlock sidecar: cannot read the configuration from stdin: {e}");
        return ExitCode::from(2);
    }
    let cfg = match SidecarConfig::from_json(&buf) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("airlock sidecar: {e}");
            return ExitCode::from(2);
        }
    };
    // Zero the raw document (it held the tokens) now that it is parsed.
    buf.iter_mut().for_each(|b| *b = 0);
    drop(buf);
    // One thread: a sidecar serves one run, its work is I/O (tunnels are
    // spliced in the kernel), and a single thread saves the cross-thread
    // wake-ups that dominated the api_call latency on two cores.
    let runtime = match super::current_thread_runtime() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("airlock sidecar: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(airlock_sidecar::run(cfg)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("airlock sidecar: {e}");
            ExitCode::FAILURE
        }
    }
}
