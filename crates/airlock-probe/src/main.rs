//! `airlock-probe`: the isolation probe of the escape tests. It runs inside
//! a sandbox, tries what an escaping agent would try, and prints what it
//! could do as one JSON object. A test-only binary: the `airlock` release
//! binary carries none of this attack code.
#![deny(unsafe_code)]

mod probe;
#[allow(unsafe_code)]
mod sys;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

#[derive(Parser)]
#[command(name = "airlock-probe")]
struct Args {
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
    /// A setuid copy of this probe, run as `<path> --quick`.
    #[arg(long)]
    setuid: Option<PathBuf>,
    /// Read stdin and report it.
    #[arg(long)]
    stdin: bool,
    /// Identity and capabilities only.
    #[arg(long)]
    quick: bool,
}

fn main() -> ExitCode {
    let a = Args::parse();
    let args = probe::ProbeArgs {
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
    println!("{}", probe::run(&args));
    ExitCode::SUCCESS
}
