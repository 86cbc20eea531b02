//! `airlock runtime -- CMD…`: the in-sandbox launcher (see `airlock-runtime`);
//! `airlock runner -- CMD…`: a local MCP runner's (`airlock_runtime::runner`).

use std::io::Read;
use std::process::ExitCode;

use airlock_runtime::{MAX_SECRETS_BYTES, RuntimeSecrets};

/// Which launcher: the agent's, or a local MCP runner's.
#[derive(Debug, Clone, Copy)]
pub enum Role {
    Agent,
    Runner,
}

pub fn run(command: Vec<String>, role: Role) -> ExitCode {
    crate::logging::init();
    let me = match role {
        Role::Agent => "airlock runtime",
        Role::Runner => "airlock runner",
    };
    tracing::debug!(target: "airlock::phase", "runtime: main");
    // Built first: the secrets arrive once the sidecar is ready, which may
    // be later than this process.
    let rt = match super::multi_thread_runtime() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{me}: {e}");
            return ExitCode::from(125);
        }
    };
    let mut buf = Vec::new();
    if let Err(e) = std::io::stdin()
        .take(MAX_SECRETS_BYTES as u64 + 1)
        .read_to_end(&mut buf)
    {
        eprintln!("{me}: cannot read the run secrets from stdin: {e}");
        return ExitCode::from(125);
    }
    let secrets = match RuntimeSecrets::from_json(&buf) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{me}: {e}");
            return ExitCode::from(125);
        }
    };
    buf.iter_mut().for_each(|b| *b = 0);
    let ran = match role {
        Role::Agent => rt.block_on(airlock_runtime::run(secrets, command)),
        Role::Runner => rt.block_on(airlock_runtime::runner::run(secrets, command)),
    };
    // Its work is over (the agent's end is kept by the sidecar, or it
    // failed and says so below): its relays and listeners are not waited
    // for, so the sandbox exits now and the platform's halt is not held.
    rt.shutdown_background();
    match ran {
        Ok(code) => ExitCode::from(u8::try_from(code.clamp(0, 255)).unwrap_or(u8::MAX)),
        Err(e) => {
            eprintln!("{me}: {e}");
            ExitCode::from(125)
        }
    }
}
