//! `airlock probe` (hidden): run inside a sandbox, tries to escape and prints
//! what it could do as JSON. Used by the escape tests.

use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct ProbeArgs {
    /// host:port to try a TCP connect to (repeatable).
    #[arg(long)]
    connect: Vec<String>,
    /// A file to try to create (repeatable).
    #[arg(long)]
    write: Vec<PathBuf>,
    /// A host PID to attack (ptrace, process_vm_readv, environ, kill).
    #[arg(long)]
    pid: Option<i32>,
    /// A string to look for in every visible /proc/*/environ and cmdline.
    #[arg(long)]
    canary: Option<String>,
    /// A unix socket to send "ping" to.
    #[arg(long)]
    unix: Option<PathBuf>,
    /// A file to fill until writing fails.
    #[arg(long)]
    fill: Option<PathBuf>,
    /// A setuid binary to run as `<path> probe --quick`.
    #[arg(long)]
    setuid: Option<PathBuf>,
    /// Read stdin and report it.
    #[arg(long)]
    stdin: bool,
    /// Identity and capabilities only.
    #[arg(long)]
    quick: bool,
}

pub fn run(a: ProbeArgs) -> ExitCode {
    let args = airlock_sandbox::probe::ProbeArgs {
        connect: a.connect,
        write: a.write,
        pid: a.pid,
        canary: a.canary,
        unix: a.unix,
        fill: a.fill,
        setuid: a.setuid,
        stdin: a.stdin,
        quick: a.quick,
    };
    println!("{}", airlock_sandbox::probe::run(&args));
    ExitCode::SUCCESS
}
