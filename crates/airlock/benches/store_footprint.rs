//! What a run costs the store: bytes per trivial run, per 1 MiB of agent
//! output (within the run's log cap), and for 40 MiB of output (past it).
//!
//! `cargo bench -p airlock --bench store_footprint [-- BACKEND]` (default
//! `process`; `namespace` and `docker` where they work)
//!
//! Each figure is the growth of the SQLite store (the pages its database
//! uses, what its write-ahead log holds included) of one home over `AIRLOCK_BENCH_N` runs (default 10),
//! after a first run that creates it. Beside it, measured in the same run,
//! the baseline: the bytes the agent printed (what a store that kept every
//! line would hold at least). Before issue 45 a trivial run cost 5.8 KB and
//! 40 MiB of output grew the store by 41–90 MiB (the figures).
#![allow(clippy::unwrap_used)] // a bench may unwrap: a panic is its failure

use std::path::Path;
use std::process::Command;

use airlock_test_support::store_bytes;

const AIRLOCK: &str = env!("CARGO_BIN_EXE_airlock");

/// An agent directory in `home` printing `lines` lines of `width` bytes.
fn agent(home: &Path, name: &str, lines: u64, width: u64) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dir = home.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        dir.join("agent.py"),
        format!(
            "import sys\nline = 'x' * {} + '\\n'\nfor _ in range({lines}):\n    sys.stdout.write(line)\n",
            width.saturating_sub(1)
        ),
    )
    .unwrap();
    let manifest = dir.join("airlock.toml");
    std::fs::write(
        &manifest,
        format!("[agent]\nname = \"{name}\"\ncommand = [\"/usr/bin/python3\", \"agent.py\"]\ntimeout = 300\n\n[network]\negress = \"none\"\n"),
    )
    .unwrap();
    manifest
}

fn run(home: &Path, backend: &str, manifest: &Path) {
    let out = Command::new(AIRLOCK)
        .args(["run", "--json", "--backend", backend, "-f"])
        .arg(manifest)
        .env("AIRLOCK_HOME", home)
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    assert_eq!(
        report["status"],
        "succeeded",
        "{report}\n{}",
        String::from_utf8_lossy(&out.stderr[out.stderr.len().saturating_sub(2000)..])
    );
}

/// The store's growth per run over `n` runs of `manifest`.
fn per_run(home: &Path, backend: &str, manifest: &Path, n: u64) -> f64 {
    let before = store_bytes(home);
    for _ in 0..n {
        run(home, backend, manifest);
    }
    (store_bytes(home) - before) as f64 / n as f64
}

fn main() {
    let backend = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .unwrap_or_else(|| "process".into());
    let n: u64 = std::env::var("AIRLOCK_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let home = tempfile::Builder::new()
        .prefix("airlock-bench-store-")
        .tempdir()
        .unwrap();
    let trivial = agent(home.path(), "trivial", 1, 6);
    let mib = agent(home.path(), "mib", 1024, 1024);
    let forty = agent(home.path(), "forty", 40 * 1024, 1024);
    // The store exists, with its schema and first pages.
    run(home.path(), backend.as_str(), &trivial);
    println!("store footprint, {backend} backend, {n} runs each (SQLite file growth)");
    // Four times as many trivial runs: each is a few of SQLite's 4 KiB pages.
    let t = per_run(home.path(), &backend, &trivial, 4 * n);
    println!(
        "  trivial run (1 line of 6 B):      {t:>12.0} B/run   (agent output 6 B; {} runs)",
        4 * n
    );
    let m = per_run(home.path(), &backend, &mib, n);
    println!(
        "  1 MiB of output (1024 lines):     {m:>12.0} B/run   (agent output {} B; {:.2}× it)",
        1 << 20,
        m / f64::from(1u32 << 20)
    );
    let f = per_run(home.path(), &backend, &forty, 1);
    println!(
        "  40 MiB of output (past the cap):  {f:>12.0} B/run   (agent output {} B; {:.2}× it)",
        40u64 << 20,
        f / (40u64 << 20) as f64
    );
}
