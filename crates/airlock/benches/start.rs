//! Sandbox start-up: time from `spawn` until a `true` command has exited,
//! for the `process` and `namespace` backends, with bubblewrap as the
//! baseline measured in the same run; then 50 concurrent namespace
//! sandboxes (all must succeed and leave nothing behind).
//!
//! `cargo bench -p airlock --bench start` (AIRLOCK_BENCH_N iterations, default 200).
//! The baseline: `bwrap --unshare-all --die-with-parent` with the same view
//! (read-only /usr and /etc, the /bin,/lib* links, fresh /proc, minimal /dev,
//! tmpfs /tmp), which is what a bare `bwrap --unshare-all true` needs to run at all.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use std::path::PathBuf;
use std::time::{Duration, Instant};

use airlock_sandbox::namespace::NamespaceBackend;
use airlock_sandbox::process::ProcessBackend;
use airlock_sandbox::{Backend, SandboxSpec};

const AIRLOCK: &str = env!("CARGO_BIN_EXE_airlock");

fn spec(i: usize, run_dir: &std::path::Path) -> SandboxSpec {
    SandboxSpec {
        run_id: format!("bench{}-{i}", std::process::id()),
        command: vec!["/usr/bin/true".into()],
        env: vec![],
        stdin: vec![],
        sockets_dir: run_dir.to_path_buf(),
        ro_paths: vec![],
        workspace: PathBuf::from("/workspace"),
        workspace_size_mb: 16,
        memory_mb: 256,
        cpus: 1.0,
        pids_max: 64,
    }
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn report(name: &str, v: &mut [Duration]) -> Duration {
    let (p50, p99) = (pct(v, 0.50), pct(v, 0.99));
    println!(
        "{name:<28} n={:<4} p50 {:>8.2} ms   p99 {:>8.2} ms",
        v.len(),
        p50.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3
    );
    p50
}

async fn time_backend(
    b: &dyn Backend,
    n: usize,
    run_dir: &std::path::Path,
    ws: &std::path::Path,
) -> Vec<Duration> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let mut s = spec(i, run_dir);
        if !b.isolates() {
            s.workspace = ws.to_path_buf();
        }
        let t = Instant::now();
        let mut sb = b.spawn(&s).expect("spawn");
        let st = sb.wait().await.expect("wait");
        out.push(t.elapsed());
        assert!(st.success(), "{} run failed: {st}", b.name());
        sb.cleanup().await;
    }
    out
}

fn bwrap_args() -> Vec<String> {
    let mut a: Vec<String> = [
        "--unshare-all",
        "--die-with-parent",
        "--ro-bind",
        "/usr",
        "/usr",
        "--ro-bind",
        "/etc",
        "/etc",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for l in ["/bin", "/sbin", "/lib", "/lib64", "/lib32"] {
        if let Ok(t) = std::fs::read_link(l) {
            a.extend(["--symlink".into(), t.display().to_string(), l.into()]);
        }
    }
    a.push("/usr/bin/true".into());
    a
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::var("AIRLOCK_BENCH_N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    println!("sandbox start → `true` exited, {n} sequential runs each");

    let mut process = time_backend(&ProcessBackend, n, dir.path(), &ws).await;
    report("process", &mut process);

    let ns = NamespaceBackend::with_exe(PathBuf::from(AIRLOCK));
    if let Err(why) = ns.check() {
        println!("namespace: SKIPPED ({})", why.0);
        return;
    }
    let mut namespace = time_backend(&ns, n, dir.path(), &ws).await;
    let ns_p50 = report("namespace (with cgroups)", &mut namespace);

    if std::path::Path::new("/usr/bin/bwrap").exists() {
        let args = bwrap_args();
        let mut bw = Vec::with_capacity(n);
        for _ in 0..n {
            let t = Instant::now();
            let st = tokio::process::Command::new("/usr/bin/bwrap")
                .args(&args)
                .status()
                .await
                .unwrap();
            bw.push(t.elapsed());
            assert!(st.success(), "bwrap failed: {st}");
        }
        let bw_p50 = report("bwrap --unshare-all (baseline)", &mut bw);
        println!(
            "namespace p50 / bwrap p50 = {:.2}x (target ≤ 1.5x)",
            ns_p50.as_secs_f64() / bw_p50.as_secs_f64()
        );
    } else {
        println!("bwrap: not installed (apt-get install bubblewrap), no baseline");
    }

    // 50 concurrent sandboxes.
    let t = Instant::now();
    let specs: Vec<SandboxSpec> = (0..50)
        .map(|i| {
            let mut s = spec(10_000 + i, dir.path());
            s.command = vec!["/bin/sh".into(), "-c".into(), "echo ok".into()];
            s
        })
        .collect();
    let mut handles = vec![];
    for s in &specs {
        let mut sb = ns.spawn(s).expect("spawn");
        handles.push(tokio::spawn(async move {
            let st = sb.wait().await;
            sb.cleanup().await;
            st
        }));
    }
    let mut ok = 0;
    for h in handles {
        if h.await.unwrap().map(|s| s.success()).unwrap_or(false) {
            ok += 1;
        }
    }
    let wall = t.elapsed();
    let mine: Vec<_> = airlock_sandbox::namespace::cgroup::leftovers()
        .into_iter()
        .filter(|l| l.name.contains(&format!("bench{}-", std::process::id())))
        .collect();
    let inits = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read(e.path().join("cmdline"))
                .map(|c| {
                    c.starts_with(AIRLOCK.as_bytes())
                        && String::from_utf8_lossy(&c).contains("sandbox-init")
                })
                .unwrap_or(false)
        })
        .count();
    let dirs = std::fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| e.as_ref().map(|e| e.path() != ws).unwrap_or(true))
        .count();
    println!(
        "50 concurrent namespace sandboxes: {ok}/50 succeeded in {:.0} ms; leftovers: {} cgroups, {inits} init processes, {dirs} entries in run_dir (mounts live only in the runs' own mount namespaces)",
        wall.as_secs_f64() * 1e3,
        mine.len()
    );
    assert_eq!(ok, 50);
    assert!(mine.is_empty() && inits == 0 && dirs == 0);
}
