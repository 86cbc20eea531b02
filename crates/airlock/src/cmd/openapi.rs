//! `airlock openapi` (hidden): prints the OpenAPI document `airlock serve`
//! serves at `GET /v1/openapi.json`, without a server. The SDKs under
//! `sdks/` are generated from it.

use std::io::Write as _;
use std::process::ExitCode;

pub fn run() -> ExitCode {
    let doc = airlock_server::openapi::spec();
    let text = match serde_json::to_string_pretty(&doc) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: the OpenAPI document: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{text}") {
        Ok(()) => ExitCode::SUCCESS,
        // A closed pipe (`| head`) is not an error of this command.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: writing the OpenAPI document: {e}");
            ExitCode::FAILURE
        }
    }
}
