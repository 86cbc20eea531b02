//! A trivial agent end to end, sidecar included, and 50 concurrent runs.
//!
//! `cargo bench -p airlock --bench run_e2e [-- BACKEND]` (default `auto`)
//!
//! Prints, per backend: the wall time of `airlock run` (process start, store,
//! internal API, sidecar, sandbox, runtime, agent, teardown, report) and the
//! run's own duration as the orchestrator measured it (request to end), p50
//! and p99 over `AIRLOCK_BENCH_N` runs (default 30), beside a peer measured
//! in the same loop, alternating: `airlock --version`, one start of the same
//! binary (a run starts it four times: the platform, the sidecar, the
//! sandbox's init and its runtime), which shows the host's load.
//!
//! Then the per-phase breakdown: as many runs again, alternating with the
//! others, with the `airlock::phase` milestones logged (`AIRLOCK_LOG`,
//! `AIRLOCK_SIDECAR_LOG`, `AIRLOCK_RUNTIME_LOG` set to
//! `warn,airlock::phase=debug`): each milestone's median time since the
//! spawn of `airlock run`, in order, and the median step from the one
//! before (every milestone is logged by the process named before its colon,
//! the platform's own unnamed). These runs are not in the headline figures.
//!
//! Then 50 concurrent runs on one store: how many succeeded and whether
//! anything was left behind.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

const AIRLOCK: &str = env!("CARGO_BIN_EXE_airlock");
const PHASES: &str = "warn,airlock::phase=debug";

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    // A rank in 0..len for p in [0, 1].
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let rank = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[rank]
}

/// Seconds since midnight UTC (what the log lines' timestamps say).
fn time_of_day(t: SystemTime) -> f64 {
    let d = t.duration_since(UNIX_EPOCH).unwrap();
    (d.as_secs() % 86_400) as f64 + f64::from(d.subsec_nanos()) * 1e-9
}

/// `HH:MM:SS.ffffff` of a log line's `…THH:MM:SS.ffffffZ` timestamp, and
/// the milestone after `airlock::phase: `.
fn phase_line(line: &str) -> Option<(f64, String)> {
    let (head, name) = line.split_once("airlock::phase: ")?;
    let t = head.find('T')?;
    let hms = head[t + 1..].split('Z').next()?;
    let mut it = hms.split(':');
    let (h, m, s): (f64, f64, f64) = (
        it.next()?.parse().ok()?,
        it.next()?.parse().ok()?,
        it.next()?.parse().ok()?,
    );
    Some((h * 3600.0 + m * 60.0 + s, name.trim().to_owned()))
}

struct Run {
    wall: f64,
    inner: f64,
    /// Why the run did not succeed, as `airlock run` said it (`None`: it
    /// succeeded).
    failure: Option<String>,
    /// Milestone → ms since the spawn (traced runs only).
    phases: Vec<(String, f64)>,
}

fn one(home: &Path, manifest: &Path, backend: &str, traced: bool) -> Run {
    let mut cmd = Command::new(AIRLOCK);
    cmd.args(["run", "--json", "--backend", backend, "-f"])
        .arg(manifest)
        .env("AIRLOCK_HOME", home)
        .env_remove("DATABASE_URL");
    if traced {
        for v in ["AIRLOCK_LOG", "AIRLOCK_SIDECAR_LOG", "AIRLOCK_RUNTIME_LOG"] {
            cmd.env(v, PHASES);
        }
    }
    let spawned = SystemTime::now();
    let t = Instant::now();
    let out = cmd.output().expect("airlock run");
    let wall = t.elapsed().as_secs_f64() * 1000.0;
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let inner = json["duration_ms"].as_f64().unwrap_or(f64::NAN);
    let t0 = time_of_day(spawned);
    let mut phases: Vec<(String, f64)> = String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter_map(phase_line)
        .map(|(t, name)| {
            // A run across midnight.
            let t = if t < t0 - 43_200.0 { t + 86_400.0 } else { t };
            (name, (t - t0) * 1000.0)
        })
        .collect();
    if traced {
        phases.push(("(airlock run exited)".into(), wall));
    }
    let failure = (json["status"] != "succeeded").then(|| {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(3).collect();
        format!(
            "{} (status {}, error {}); stderr ends: {}",
            out.status,
            json["status"],
            json["error"],
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        )
    });
    Run {
        wall,
        inner,
        failure,
        phases,
    }
}

fn peer() -> f64 {
    let t = Instant::now();
    let st = Command::new(AIRLOCK)
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(st.success());
    t.elapsed().as_secs_f64() * 1000.0
}

fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let backend = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .unwrap_or_else(|| "auto".into());
    let n = env_num("AIRLOCK_BENCH_N", 30).max(1);
    let home = tempfile::tempdir().unwrap();
    let manifest = home.path().join("airlock.toml");
    std::fs::write(
        &manifest,
        "[agent]\nname = \"trivial\"\ncommand = [\"/bin/true\"]\n",
    )
    .unwrap();
    println!(
        "`airlock run` of a trivial agent (load average {})",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    // Warm the page cache and the store; not counted.
    one(home.path(), &manifest, &backend, false);
    peer();
    let (mut wall, mut inner, mut peers) = (Vec::new(), Vec::new(), Vec::new());
    let mut traced: Vec<Run> = Vec::new();
    for i in 0..n {
        // The order turns every round, so no kind always follows another.
        for turn in 0..3 {
            match (i + turn) % 3 {
                0 => {
                    let r = one(home.path(), &manifest, &backend, false);
                    assert!(r.failure.is_none(), "a trivial run failed: {:?}", r.failure);
                    wall.push(r.wall);
                    inner.push(r.inner);
                }
                1 => {
                    let r = one(home.path(), &manifest, &backend, true);
                    assert!(r.failure.is_none(), "a trivial run failed: {:?}", r.failure);
                    traced.push(r);
                }
                _ => peers.push(peer()),
            }
        }
    }
    println!(
        "trivial agent, backend {backend}: `airlock run` wall  p50 {:7.1} ms  p99 {:7.1} ms   (target p50 ≤ 40 ms)",
        pct(&mut wall, 0.5),
        pct(&mut wall, 0.99)
    );
    println!(
        "trivial agent, backend {backend}: run (orchestrator) p50 {:7.1} ms  p99 {:7.1} ms",
        pct(&mut inner, 0.5),
        pct(&mut inner, 0.99)
    );
    println!(
        "peer, same loop: `airlock --version`        wall  p50 {:7.1} ms  p99 {:7.1} ms",
        pct(&mut peers, 0.5),
        pct(&mut peers, 0.99)
    );

    // Each milestone's median offset, over the runs that logged it.
    let mut at: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for r in &traced {
        for (name, ms) in &r.phases {
            at.entry(name.clone()).or_default().push(*ms);
        }
    }
    let mut rows: Vec<(String, f64, usize)> = at
        .into_iter()
        .map(|(name, mut v)| {
            let k = v.len();
            (name, pct(&mut v, 0.5), k)
        })
        .collect();
    rows.sort_by(|a, b| a.1.total_cmp(&b.1));
    let mut traced_wall: Vec<f64> = traced.iter().map(|r| r.wall).collect();
    println!(
        "per phase ({} traced runs, wall p50 {:.1} ms): median ms since `airlock run` was spawned, and the step from the line before",
        traced.len(),
        pct(&mut traced_wall, 0.5)
    );
    let mut prev = 0.0;
    println!("  {:>8}  {:>7}  spawned", "0.0", "");
    for (name, ms, k) in rows {
        let seen = if k == traced.len() {
            String::new()
        } else {
            format!("   (in {k}/{} runs)", traced.len())
        };
        println!("  {ms:>8.1}  {:>+7.1}  {name}{seen}", ms - prev);
        prev = ms;
    }

    let t = Instant::now();
    let handles: Vec<_> = (0..50)
        .map(|_| {
            let (h, m, b) = (home.path().to_owned(), manifest.clone(), backend.clone());
            std::thread::spawn(move || one(&h, &m, &b, false).failure)
        })
        .collect();
    let failures: Vec<String> = handles
        .into_iter()
        .filter_map(|h| {
            h.join()
                .unwrap_or_else(|_| Some("the bench's thread panicked".into()))
        })
        .collect();
    let ok = 50 - failures.len();
    let left = std::fs::read_dir(home.path().join("runs"))
        .map(|r| r.count())
        .unwrap_or(0);
    println!(
        "50 concurrent runs, backend {backend}: {ok}/50 succeeded in {:.1} s; run directories left: {left}",
        t.elapsed().as_secs_f64()
    );
    for f in &failures {
        println!("  a run that did not succeed: {f}");
    }
}
