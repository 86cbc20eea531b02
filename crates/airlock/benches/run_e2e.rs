//! A trivial agent end to end, sidecar included, and 50 concurrent runs.
//!
//! `cargo bench -p airlock --bench run_e2e [-- BACKEND]` (default `auto`)
//!
//! Prints, per backend: the wall time of `airlock run` (process start, store,
//! internal API, sidecar, sandbox, runtime, agent, teardown, report) and the
//! run's own duration as the orchestrator measured it (request to end), p50
//! and p99 over 30 runs; then 50 concurrent runs on one store: how many
//! succeeded and whether anything was left behind.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use std::path::Path;
use std::process::Command;
use std::time::Instant;

const AIRLOCK: &str = env!("CARGO_BIN_EXE_airlock");

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn one(home: &Path, manifest: &Path, backend: &str) -> (f64, f64, bool) {
    let t = Instant::now();
    let out = Command::new(AIRLOCK)
        .args(["run", "--json", "--backend", backend, "-f"])
        .arg(manifest)
        .env("AIRLOCK_HOME", home)
        .env_remove("DATABASE_URL")
        .output()
        .expect("airlock run");
    let wall = t.elapsed().as_secs_f64() * 1000.0;
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let inner = json["duration_ms"].as_f64().unwrap_or(f64::NAN);
    (wall, inner, json["status"] == "succeeded")
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let backend = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .unwrap_or_else(|| "auto".into());
    let home = tempfile::tempdir().unwrap();
    let manifest = home.path().join("airlock.toml");
    std::fs::write(
        &manifest,
        "[agent]\nname = \"trivial\"\ncommand = [\"/bin/true\"]\n",
    )
    .unwrap();
    one(home.path(), &manifest, &backend);
    let (mut wall, mut inner) = (Vec::new(), Vec::new());
    for _ in 0..30 {
        let (w, i, ok) = one(home.path(), &manifest, &backend);
        assert!(ok, "a trivial run failed");
        wall.push(w);
        inner.push(i);
    }
    println!(
        "trivial agent, backend {backend}: `airlock run` wall  p50 {:7.1} ms  p99 {:7.1} ms",
        pct(&mut wall, 0.5),
        pct(&mut wall, 0.99)
    );
    println!(
        "trivial agent, backend {backend}: run (orchestrator) p50 {:7.1} ms  p99 {:7.1} ms",
        pct(&mut inner, 0.5),
        pct(&mut inner, 0.99)
    );

    let t = Instant::now();
    let handles: Vec<_> = (0..50)
        .map(|_| {
            let (h, m, b) = (home.path().to_owned(), manifest.clone(), backend.clone());
            std::thread::spawn(move || one(&h, &m, &b).2)
        })
        .collect();
    let ok = handles
        .into_iter()
        .map(|h| h.join().unwrap_or(false))
        .filter(|ok| *ok)
        .count();
    let left = std::fs::read_dir(home.path().join("runs"))
        .map(|r| r.count())
        .unwrap_or(0);
    println!(
        "50 concurrent runs, backend {backend}: {ok}/50 succeeded in {:.1} s; run directories left: {left}",
        t.elapsed().as_secs_f64()
    );
}
