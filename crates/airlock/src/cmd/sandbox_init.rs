//! `airlock sandbox-init` (hidden): the namespace sandbox's setup process,
//! started by the namespace backend only, which reads its header from
//! stdin; and `airlock container-init -- CMD…` (hidden), PID 1 of a docker
//! sandbox's container.

use std::process::ExitCode;

pub fn run() -> ExitCode {
    // No logging, no runtime, no threads: init forks and must stay single-threaded.
    let code = airlock_sandbox::namespace::init::main();
    ExitCode::from(u8::try_from(code).unwrap_or(125))
}

pub fn container(command: &[String], command_on_stdin: bool) -> ExitCode {
    // As above: no logging, no runtime, no threads (its seccomp filters
    // apply to the thread that installs them).
    let code = airlock_sandbox::docker::init::main(command, command_on_stdin);
    ExitCode::from(u8::try_from(code).unwrap_or(125))
}

/// `airlock vm-init` (hidden): PID 1 of a microVM guest.
pub fn vm_init() -> ExitCode {
    let code = airlock_sandbox::microvm::guest::main();
    ExitCode::from(u8::try_from(code.clamp(0, 255)).unwrap_or(125))
}

/// `airlock microvm-host` (hidden): the host side of one microVM guest.
pub fn microvm_host() -> ExitCode {
    let code = airlock_sandbox::microvm::host::main();
    ExitCode::from(u8::try_from(code.clamp(0, 255)).unwrap_or(125))
}
