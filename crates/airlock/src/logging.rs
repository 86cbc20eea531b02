//! Log setup for the long-running subcommands: to stderr, filtered by
//! `AIRLOCK_LOG` (`RUST_LOG` syntax), `info` by default. A line stderr
//! cannot take (a pipe nobody reads) is lost, not reported on stderr:
//! tracing's report of it would panic there.

pub fn init() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("AIRLOCK_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colour())
        .log_internal_errors(false)
        .try_init();
}

/// For interactive commands: warnings and errors only, unless `AIRLOCK_LOG` says otherwise.
pub fn init_quiet() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("AIRLOCK_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colour())
        .log_internal_errors(false)
        .try_init();
}

/// Colours only on a terminal (and not with `NO_COLOR`): a sidecar's log is
/// read through a pipe by its platform.
fn colour() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none()
}
