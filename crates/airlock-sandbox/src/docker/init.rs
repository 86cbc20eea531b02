//! `airlock container-init -- CMD…`: PID 1 of each docker sandbox's
//! container (the agent's, a runner's), in place of Docker's `docker-init`.
//!
//! It is not dumpable, so the sandbox's processes (its own uid) can neither
//! open its `/proc/1/mem` nor read its environment or descriptors; it
//! installs the seccomp filters every sandbox gets ([`crate::seccomp`]:
//! the same allow list and argument checks as the namespace sandbox's,
//! inside the daemon's profile), then starts the command, forwards the signals a container's PID 1 is sent (stop,
//! interrupt: [`sys::FORWARDED`]) to it, reaps every orphan, and exits with the command's code
//! (128+signal when it was killed). Single-threaded: no runtime, no threads.
//!
//! A container started before its run (a warm pool's, [`super::pool`]) is
//! started as `airlock container-init --command-on-stdin -- LAUNCHER…`: it
//! holds nothing of any run until claimed, then reads the agent's command
//! from the first line of its stdin ([`command_header`]), appends it to
//! `LAUNCHER…`, and goes on as above; the rest of stdin is the launcher's.

use std::io::Write;
use std::process::Command;

use rustix::process::Pid;

use crate::namespace::sys;
use crate::seccomp::{Filters, SeccompError};

/// The hidden subcommand of the `airlock` binary that runs [`main`].
pub const SUBCOMMAND: &str = "container-init";
/// Exit code of a setup failure (before the command ran).
pub const SETUP_FAILED: i32 = 125;

/// The longest command header read from stdin ([`command_header`]).
pub const MAX_COMMAND_HEADER: usize = 64 * 1024;

/// The first line of a pooled container's stdin: the run's command, as one
/// JSON array of strings ending in a newline.
pub fn command_header(command: &[String]) -> Vec<u8> {
    let mut line = serde_json::to_vec(command).unwrap_or_else(|_| b"[]".to_vec());
    line.push(b'\n');
    line
}

/// Reads the command header from stdin one byte at a time (never past its
/// newline: the rest is the launcher's).
fn read_command_header() -> Result<Vec<String>, ContainerInitError> {
    use ContainerInitError as E;
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        match rustix::io::read(std::io::stdin(), &mut byte) {
            Ok(0) => return Err(E::HeaderRead(std::io::ErrorKind::UnexpectedEof.into())),
            Ok(_) if byte[0] == b'\n' => break,
            Ok(_) if line.len() >= MAX_COMMAND_HEADER => {
                return Err(E::HeaderRead(std::io::Error::other(format!(
                    "longer than {MAX_COMMAND_HEADER} bytes"
                ))));
            }
            Ok(_) => line.push(byte[0]),
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(E::HeaderRead(e.into())),
        }
    }
    serde_json::from_slice(&line).map_err(E::HeaderParse)
}

/// Entry point; returns the process's exit code. `command_on_stdin`: the
/// run's command is read from stdin first ([`command_header`]) and appended
/// to `command`.
pub fn main(command: &[String], command_on_stdin: bool) -> i32 {
    let command = if command_on_stdin {
        match read_command_header() {
            Ok(rest) => command.iter().cloned().chain(rest).collect(),
            Err(e) => {
                let _ = writeln!(std::io::stderr(), "airlock container-init: {e}");
                return SETUP_FAILED;
            }
        }
    } else {
        command.to_vec()
    };
    match run(&command) {
        Ok(code) => code,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "airlock container-init: {e}");
            SETUP_FAILED
        }
    }
}

/// A setup step of the container init that failed.
#[derive(Debug, thiserror::Error)]
enum ContainerInitError {
    #[error("non-dumpable: {0}")]
    NonDumpable(#[source] std::io::Error),
    #[error("no command")]
    NoCommand,
    /// Failed, ended before its newline, or longer than [`MAX_COMMAND_HEADER`].
    #[error("reading the command header: {0}")]
    HeaderRead(#[source] std::io::Error),
    #[error("the command header is not a JSON array of strings: {0}")]
    HeaderParse(#[source] serde_json::Error),
    #[error(transparent)]
    Seccomp(#[from] SeccompError),
    #[error("no_new_privs: {0}")]
    NoNewPrivs(#[source] std::io::Error),
    #[error("{program}: {source}")]
    Exec {
        program: String,
        source: std::io::Error,
    },
    #[error("{program}: no pid")]
    Pid { program: String },
    #[error("waiting for the command: {0}")]
    Wait(#[source] std::io::Error),
}

fn run(command: &[String]) -> Result<i32, ContainerInitError> {
    use ContainerInitError as E;
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(|e| E::NonDumpable(e.into()))?;
    let (prog, args) = command.split_first().ok_or(E::NoCommand)?;
    let filters = Filters::compile()?;
    rustix::thread::set_no_new_privs(true).map_err(|e| E::NoNewPrivs(e.into()))?;
    filters.install()?;
    let child = Command::new(prog)
        .args(args)
        .spawn()
        .map_err(|source| E::Exec {
            program: prog.clone(),
            source,
        })?;
    // A pid fits an i32 (pid_max is at most 2^22).
    let main = i32::try_from(child.id())
        .ok()
        .and_then(Pid::from_raw)
        .ok_or_else(|| E::Pid {
            program: prog.clone(),
        })?;
    drop(child);
    // The signals are blocked only now that the command runs: it would
    // inherit the mask, and never see the stop it is passed.
    sys::wait_forwarding(main, sys::Reap::All).map_err(E::Wait)
}
