//! `airlock container-init -- CMD…`: PID 1 of each docker sandbox's
//! container (the agent's, a runner's), in place of Docker's `docker-init`.
//!
//! It is not dumpable, so the sandbox's processes (its own uid) can neither
//! open its `/proc/1/mem` nor read its environment or descriptors; it
//! installs the seccomp filters every sandbox gets ([`crate::seccomp`]:
//! the same allow list and argument checks as the namespace sandbox's,
//! inside the daemon's profile), then starts the command (with an empty
//! signal mask), forwards the signals a container's PID 1 is sent (stop,
//! interrupt) to it, reaps every orphan, and exits with the command's code
//! (128+signal when it was killed). Single-threaded: no runtime, no threads.

use std::io::Write;
use std::process::Command;

use rustix::process::{Pid, Signal, WaitOptions};

use crate::namespace::sys;
use crate::seccomp::Filters;

/// The hidden subcommand of the `airlock` binary that runs [`main`].
pub const SUBCOMMAND: &str = "container-init";
/// Exit code of a setup failure (before the command ran).
pub const SETUP_FAILED: i32 = 125;

/// Signals passed on to the command.
const FORWARDED: &[i32] = &[
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

/// Entry point; returns the process's exit code.
pub fn main(command: &[String]) -> i32 {
    match run(command) {
        Ok(code) => code,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "airlock container-init: {e}");
            SETUP_FAILED
        }
    }
}

fn run(command: &[String]) -> Result<i32, String> {
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(|e| format!("non-dumpable: {e}"))?;
    let (prog, args) = command
        .split_first()
        .ok_or_else(|| "no command".to_string())?;
    let mut waited: Vec<i32> = FORWARDED.to_vec();
    waited.push(libc::SIGCHLD);
    sys::block_signals(&waited).map_err(|e| format!("signal mask: {e}"))?;
    let filters = Filters::compile().map_err(|e| e.to_string())?;
    rustix::thread::set_no_new_privs(true).map_err(|e| format!("no_new_privs: {e}"))?;
    filters.install().map_err(|e| e.to_string())?;
    let child = Command::new(prog)
        .args(args)
        .spawn()
        .map_err(|e| format!("{prog}: {e}"))?;
    // A pid fits an i32 (pid_max is at most 2^22).
    let main = i32::try_from(child.id()).map_err(|e| format!("{prog}: pid: {e}"))?;
    drop(child);
    loop {
        let sig = sys::wait_signal(&waited).map_err(|e| format!("sigwaitinfo: {e}"))?;
        if sig != libc::SIGCHLD {
            if let (Some(pid), Some(sig)) = (Pid::from_raw(main), Signal::from_named_raw(sig)) {
                let _ = rustix::process::kill_process(pid, sig);
            }
            continue;
        }
        // Every child that ended (orphans included); the command's end is ours.
        loop {
            match rustix::process::wait(WaitOptions::NOHANG) {
                Ok(Some((pid, st))) if pid.as_raw_nonzero().get() == main => {
                    return Ok(exit_code(st));
                }
                Ok(Some(_)) | Err(rustix::io::Errno::INTR) => continue,
                Ok(None) | Err(_) => break,
            }
        }
    }
}

fn exit_code(st: rustix::process::WaitStatus) -> i32 {
    if let Some(c) = st.exit_status() {
        c
    } else if let Some(sig) = st.terminating_signal() {
        128 + sig
    } else {
        SETUP_FAILED
    }
}
