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
    /// System call numbers to make (`1,2,5-9`), each in a child of its
    /// own, every argument -1.
    #[arg(long)]
    syscalls: Option<String>,
    /// Attack the calls whose arguments the filter checks (and use them).
    #[arg(long)]
    checked: bool,
}

/// `1,2,5-9` as numbers.
fn numbers(s: &str) -> Result<Vec<u32>, String> {
    let mut v = Vec::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        let bad = |e: std::num::ParseIntError| format!("{part}: {e}");
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().map_err(bad)?, b.parse().map_err(bad)?);
                v.extend(a..=b);
            }
            None => v.push(part.parse().map_err(bad)?),
        }
    }
    Ok(v)
}

fn main() -> ExitCode {
    let a = Args::parse();
    let syscalls = match a.syscalls.as_deref().map(numbers).transpose() {
        Ok(v) => v.unwrap_or_default(),
        Err(e) => {
            eprintln!("airlock-probe: --syscalls {e}");
            return ExitCode::from(2);
        }
    };
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
        syscalls,
        checked: a.checked,
    };
    let report = probe::run(&args).to_string();
    // In a real run, the report is also the run's result.
    if let Some(path) = std::env::var_os("AIRLOCK_RESULT_FILE")
        && let Err(e) = std::fs::write(&path, &report)
    {
        eprintln!("airlock-probe: the result file: {e}");
    }
    println!("{report}");
    ExitCode::SUCCESS
}
