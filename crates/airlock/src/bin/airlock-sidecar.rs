//! `airlock-sidecar`: the sidecar alone, the same as `airlock sidecar`
//! (configuration as one JSON document on stdin, readiness line on stdout,
//! logs on stderr), in a binary that holds nothing else: a run's sidecar
//! maps and faults in only its own code. The platform starts
//! it when it sits next to `airlock` and says it is of the same build
//! (`--build`), else `airlock sidecar`.

#![forbid(unsafe_code)]

use std::process::ExitCode;

/// mimalloc rather than the C library's allocator: a call on the sidecar's
/// hot paths makes many short-lived allocations. Only this binary:
/// `airlock` is also the in-sandbox runtime, whose seccomp filter and
/// memory are left as they are.
#[global_allocator]
static ALLOC: airlock_sidecar::MiMalloc = airlock_sidecar::MiMalloc;

fn main() -> ExitCode {
    // What the platform asks before it starts this binary: which build.
    if std::env::args_os().nth(1).is_some_and(|a| a == "--build") {
        println!("{}", airlock_sidecar::BUILD);
        return ExitCode::SUCCESS;
    }
    // `AIRLOCK_LOG` as `target=level` directives (`info`, `warn`,
    // `airlock::egress=debug,info`): the sidecar needs no span-field
    // filters, and the plain parser keeps a regex engine out of its memory.
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = std::env::var("AIRLOCK_LOG")
        .ok()
        .and_then(|v| v.parse::<tracing_subscriber::filter::Targets>().ok())
        .unwrap_or_else(|| {
            tracing_subscriber::filter::Targets::new()
                .with_default(tracing::level_filters::LevelFilter::INFO)
        });
    // Colours only on a terminal, as `airlock`'s own logs: a run's sidecar
    // writes to its platform's pipe.
    let ansi = {
        use std::io::IsTerminal;
        std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none()
    };
    let _ = tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(ansi)
                // A platform gone takes the pipe's reader with it: a line
                // lost then is not reported on that pipe (a panic).
                .log_internal_errors(false),
        )
        .with(filter)
        .try_init();
    tracing::debug!(target: "airlock::phase", "sidecar: main");
    airlock_sidecar::server::main_from_stdin()
}
