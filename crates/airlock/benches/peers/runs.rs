//! Whole runs through `airlock run` (the path a user's run takes: the
//! platform, its store, the sidecar, the backend), shared by the backend
//! benches: one trivial agent, one run of it timed, and many at once.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::{ms, pcts};

/// The `airlock` of this build (the backend benches measure this build only).
const AIRLOCK: &str = env!("CARGO_BIN_EXE_airlock");

/// One figure: p50, p90, p99 of `v`, in milliseconds.
pub fn line(name: &str, v: &[Duration]) {
    let [p50, p90, p99] = pcts(v);
    println!(
        "  {name:<52} p50 {:8.1} ms  p90 {:8.1} ms  p99 {:8.1} ms  (n={})",
        ms(p50),
        ms(p90),
        ms(p99),
        v.len()
    );
}

/// An agent that prints one line of python, with no egress, in a home of
/// its own (`AIRLOCK_HOME`: its store and run directories); both are
/// readable by others, as the namespace backend's run uid needs.
pub struct Trivial {
    pub home: tempfile::TempDir,
    pub manifest: PathBuf,
}

impl Trivial {
    /// `extra`: more `[agent]` keys (`memory_mb = 512\n`), each a line.
    pub fn new(timeout_s: u64, extra: &str) -> Trivial {
        use std::os::unix::fs::PermissionsExt;
        let home = tempfile::tempdir().unwrap();
        let agent = home.path().join("agent");
        std::fs::create_dir(&agent).unwrap();
        std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755)).unwrap();
        let manifest = agent.join("airlock.toml");
        std::fs::write(
            &manifest,
            format!(
                "[agent]\nname = \"bench\"\ncommand = [\"/usr/bin/python3\", \"-c\", \"print('hi')\"]\ntimeout = {timeout_s}\n{extra}\n[network]\negress = \"none\"\n"
            ),
        )
        .unwrap();
        Trivial { home, manifest }
    }

    /// `airlock run --json --backend BACKEND` of the agent, to its end: how
    /// long, and whether it succeeded.
    pub fn run(&self, backend: &str) -> (Duration, bool) {
        trivial_run(self.home.path(), &self.manifest, backend)
    }
}

/// `airlock run --json --backend BACKEND -f MANIFEST` in `home`, to its end.
pub fn trivial_run(home: &Path, manifest: &Path, backend: &str) -> (Duration, bool) {
    let t = Instant::now();
    let out = Command::new(AIRLOCK)
        .args(["run", "--json", "--backend", backend, "-f"])
        .arg(manifest)
        .env("AIRLOCK_HOME", home)
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    if !out.status.success() {
        // The report (its status and why), then what the command said.
        let report = String::from_utf8_lossy(&out.stdout);
        eprintln!(
            "run on {backend} failed ({}): report {}; stderr: {}",
            out.status,
            report.chars().take(1500).collect::<String>(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    (t.elapsed(), out.status.success())
}

/// Whether the namespace backend can run here (the end-to-end figures'
/// usual peer).
pub fn namespace_available() -> bool {
    use airlock_sandbox::Backend;
    airlock_sandbox::namespace::NamespaceBackend::with_exe(PathBuf::from(AIRLOCK))
        .check()
        .is_ok()
}

/// `n` of something at once, each on a thread of its own, started together.
pub struct Concurrent {
    /// How many succeeded.
    pub ok: usize,
    /// From the first start to the last end.
    pub wall: Duration,
    /// Each one's own time, start to end.
    pub each: Vec<Duration>,
}

impl Concurrent {
    /// One line: successes, the wall time, and each one's p50/p90.
    pub fn print(&self, name: &str, n: usize) {
        let [p50, p90, _] = pcts(&self.each);
        println!(
            "  {name}: {}/{n} succeeded in {:.1} s wall; each p50 {:.1} s, p90 {:.1} s",
            self.ok,
            self.wall.as_secs_f64(),
            ms(p50) / 1000.0,
            ms(p90) / 1000.0
        );
    }
}

/// Runs `f(i)` for each `i` in `0..n` at once (threads released together
/// by a barrier).
pub fn concurrent<F>(n: usize, f: F) -> Concurrent
where
    F: Fn(usize) -> (Duration, bool) + Send + Sync + 'static,
{
    let f = std::sync::Arc::new(f);
    let go = std::sync::Arc::new(std::sync::Barrier::new(n + 1));
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let (f, go) = (f.clone(), go.clone());
            std::thread::spawn(move || {
                go.wait();
                f(i)
            })
        })
        .collect();
    go.wait();
    let t = Instant::now();
    let results: Vec<(Duration, bool)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    Concurrent {
        ok: results.iter().filter(|r| r.1).count(),
        wall: t.elapsed(),
        each: results.into_iter().map(|r| r.0).collect(),
    }
}
