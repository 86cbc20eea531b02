//! `airlock runtime -- CMD…`: the in-sandbox launcher (see `airlock-runtime`).

use std::io::Read;
use std::process::ExitCode;

use airlock_runtime::{MAX_SECRETS_BYTES, RuntimeSecrets};

pub fn run(command: Vec<String>) -> ExitCode {
    crate::logging::init();
    tracing::debug!(target: "airlock::phase", "runtime: main");
    // Built first: the secrets arrive once the sidecar is ready, which may
    // be later than this process.
    let rt = match super::multi_thread_runtime() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("airlock runtime: {e}");
            return ExitCode::from(125);
        }
    };
    let mut buf = Vec::new();
    if let Err(e) = std::io::stdin()
        .take(MAX_SECRETS_BYTES as u64 + 1)
        .read_to_end(&mut buf)
    {
        eprintln!("airlock runtime: cannot read the run secrets from stdin: {e}");
        return ExitCode::from(125);
    }
    let secrets = match RuntimeSecrets::from_json(&buf) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("airlock runtime: {e}");
            return ExitCode::from(125);
        }
    };
    buf.iter_mut().for_each(|b| *b = 0);
    match rt.block_on(airlock_runtime::run(secrets, command)) {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("airlock runtime: {e}");
            ExitCode::from(125)
        }
    }
}
