//! `airlock sandbox-init` (hidden): the namespace sandbox's setup process.
//! Started by the namespace backend only; reads its header from stdin.

use std::process::ExitCode;

pub fn run() -> ExitCode {
    // No logging, no runtime, no threads: init forks and must stay single-threaded.
    let code = airlock_sandbox::namespace::init::main();
    ExitCode::from(u8::try_from(code).unwrap_or(125))
}
