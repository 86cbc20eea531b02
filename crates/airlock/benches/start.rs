//! Sandbox start-up: time from `spawn` until a `true` command has exited,
//! for the `namespace` backend beside bubblewrap measured in the same run and
//! the same loop (alternating, so both see the same load); the `process`
//! backend for scale; then 50 concurrent namespace sandboxes (all must
//! succeed and leave nothing behind).
//!
//! The namespace backend twice: **prepared**, as the platform starts every
//! run (`Backend::prepare` when the run is asked for, here before the idle:
//! its init is started ahead and waits for the spawn), and **cold** (no
//! init waiting: the spawn starts it).
//!
//! Two loops, because the host's state between starts matters:
//! - **spaced** (the figure that counts): every start follows at least
//!   `AIRLOCK_BENCH_IDLE_MS` (default 150) ms of idle, as real runs are
//!   spaced. On cgroup v1 a process migration (`cgroup.procs`) after ≥ 50 ms
//!   of idle waits for an RCU grace period (5–25 ms) that back-to-back starts
//!   never see, so only this loop shows it.
//! - **back to back**: no pause between starts.
//!
//! `cargo bench -p airlock --bench start`; `AIRLOCK_BENCH_N` pairs in the
//! spaced loop (default 100), twice that back to back; `AIRLOCK_BENCH_DUMP=1`
//! also prints every sample (to see a bimodal distribution for what it is).
//! The baseline: `bwrap --unshare-all --die-with-parent` with the same view
//! (read-only /usr and /etc, the /bin,/lib* links, fresh /proc, minimal /dev,
//! tmpfs /tmp), which is what a bare `bwrap --unshare-all true` needs to run at all.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use airlock_sandbox::namespace::NamespaceBackend;
use airlock_sandbox::process::ProcessBackend;
use airlock_sandbox::{Backend, SandboxSpec};
use airlock_test_support::bench::{ms, pcts};

const AIRLOCK: &str = env!("CARGO_BIN_EXE_airlock");
const BWRAP: &str = "/usr/bin/bwrap";

fn spec(i: usize, run_dir: &Path) -> SandboxSpec {
    SandboxSpec {
        run_id: format!("bench{}-{i}", std::process::id()),
        command: vec!["/usr/bin/true".into()],
        env: vec![],
        stdin: vec![],
        hold_stdin: false,
        sockets_dir: run_dir.to_path_buf(),
        ro_paths: vec![],
        workspace: PathBuf::from("/workspace"),
        workspace_size_mb: 16,
        memory_mb: 256,
        cpus: 1.0,
        pids_max: 64,
        kind: airlock_sandbox::SandboxKind::Agent,
    }
}

fn line(name: &str, v: &[Duration]) {
    let [p50, p90, p99] = pcts(v);
    println!(
        "  {name:<30} n={:<4} p50 {:>7.2} ms   p90 {:>7.2} ms   p99 {:>7.2} ms",
        v.len(),
        ms(p50),
        ms(p90),
        ms(p99)
    );
}

/// Every line, the ratios to bwrap, and the tail of each (starts over 2×
/// bwrap's p50: the RCU-wait mode of the old cgroup join showed here, while
/// the host's own noise shows on every side alike).
fn compare(title: &str, prepared: &[Duration], cold: &[Duration], bw: &[Duration]) {
    println!("{title}");
    if std::env::var_os("AIRLOCK_BENCH_DUMP").is_some() {
        let dump = |v: &[Duration]| {
            v.iter()
                .map(|d| format!("{:.1}", ms(*d)))
                .collect::<Vec<_>>()
                .join(" ")
        };
        println!("  prepared: {}", dump(prepared));
        println!("  cold:     {}", dump(cold));
        println!("  bwrap:    {}", dump(bw));
    }
    line("namespace, prepared", prepared);
    line("namespace, cold", cold);
    line("bwrap --unshare-all (peer)", bw);
    let b = pcts(bw);
    let over = |v: &[Duration]| {
        v.iter()
            .filter(|d| d.as_secs_f64() > 2.0 * b[0].as_secs_f64())
            .count()
    };
    for (name, v) in [("prepared", prepared), ("cold", cold)] {
        let n = pcts(v);
        let r = |i: usize| n[i].as_secs_f64() / b[i].as_secs_f64();
        println!(
            "  {:<30}        p50 {:>7.2}x     p90 {:>7.2}x     p99 {:>7.2}x   (target p50 ≤ 1.0x)",
            format!("ratio {name} / bwrap"),
            r(0),
            r(1),
            r(2),
        );
    }
    println!(
        "  {:<30} prepared {}/{}, cold {}/{}, bwrap {}/{}",
        "starts over 2× bwrap p50",
        over(prepared),
        prepared.len(),
        over(cold),
        cold.len(),
        over(bw),
        bw.len()
    );
}

async fn start_once(b: &dyn Backend, s: &SandboxSpec) -> Duration {
    let t = Instant::now();
    let mut sb = b.spawn(s).expect("spawn");
    let st = sb.wait().await.expect("wait");
    let took = t.elapsed();
    assert!(st.success(), "{} run failed: {st}", b.name());
    sb.cleanup().await;
    took
}

async fn bwrap_once(args: &[String]) -> Duration {
    let t = Instant::now();
    let st = tokio::process::Command::new(BWRAP)
        .args(args)
        .status()
        .await
        .unwrap();
    let took = t.elapsed();
    assert!(st.success(), "bwrap failed: {st}");
    took
}

/// `n` prepared namespace starts, `n` cold ones and `n` bwrap starts,
/// alternating (the order turning every round), each after `idle` of doing
/// nothing. A prepared start's `prepare` comes before its idle.
async fn alternate(
    ns: &NamespaceBackend,
    args: &[String],
    n: usize,
    idle: Duration,
    first: usize,
    run_dir: &Path,
) -> [Vec<Duration>; 3] {
    let mut out: [Vec<Duration>; 3] = Default::default();
    for i in 0..n {
        for turn in 0..3 {
            let kind = (i + turn) % 3;
            if kind == 0 {
                ns.prepare();
            }
            if !idle.is_zero() {
                tokio::time::sleep(idle).await;
            }
            let s = spec(2 * (first + i) + usize::from(kind == 1), run_dir);
            out[kind].push(match kind {
                2 => bwrap_once(args).await,
                _ => start_once(ns, &s).await,
            });
        }
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

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n = usize::try_from(env_num("AIRLOCK_BENCH_N", 100).max(1)).unwrap_or(usize::MAX);
    let idle = Duration::from_millis(env_num("AIRLOCK_BENCH_IDLE_MS", 150));
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    println!(
        "sandbox start → `true` exited (load average {})",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );

    let mut process = Vec::with_capacity(n);
    for i in 0..n {
        let mut s = spec(i, dir.path());
        s.workspace = ws.clone();
        process.push(start_once(&ProcessBackend, &s).await);
    }
    println!("process backend (no isolation), back to back:");
    line("process", &process);

    let ns = NamespaceBackend::with_exe(PathBuf::from(AIRLOCK));
    if let Err(why) = ns.check() {
        println!("namespace: SKIPPED ({})", why.0);
        return;
    }
    assert!(
        Path::new(BWRAP).exists(),
        "{BWRAP} is the peer every figure is measured beside (apt-get install bubblewrap)"
    );
    let args = bwrap_args();
    // Warm the page cache for both; not counted.
    start_once(&ns, &spec(usize::MAX / 2, dir.path())).await;
    bwrap_once(&args).await;

    let [p, c, b] = alternate(&ns, &args, n, idle, 0, dir.path()).await;
    compare(
        &format!(
            "spaced: {} ms idle before every start, namespace (prepared, cold) and bwrap alternating:",
            idle.as_millis()
        ),
        &p,
        &c,
        &b,
    );
    let [p, c, b] = alternate(&ns, &args, 2 * n, Duration::ZERO, n, dir.path()).await;
    compare(
        "back to back: no idle (a prepared start's init is started just before it), alternating:",
        &p,
        &c,
        &b,
    );

    // 50 concurrent sandboxes, beside 50 concurrent bwraps.
    let bw_t = Instant::now();
    let bws: Vec<_> = (0..50)
        .map(|_| {
            let args = args.clone();
            tokio::spawn(async move {
                tokio::process::Command::new(BWRAP)
                    .args(&args)
                    .status()
                    .await
                    .map(|s| s.success())
                    .unwrap_or(false)
            })
        })
        .collect();
    let mut bw_ok = 0;
    for h in bws {
        bw_ok += usize::from(h.await.unwrap());
    }
    let bw_wall = bw_t.elapsed();
    tokio::time::sleep(idle).await;

    let t = Instant::now();
    let specs: Vec<SandboxSpec> = (0..50)
        .map(|i| {
            let mut s = spec(10_000_000 + i, dir.path());
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
        .filter(|l| {
            let me = std::process::id();
            l.name.contains(&format!("bench{me}-"))
                || l.name.starts_with(&format!("airlock-standby-{me}-"))
        })
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
    println!("50 concurrent:");
    println!(
        "  namespace sandboxes: {ok}/50 succeeded in {:.0} ms; bwrap peer: {bw_ok}/50 in {:.0} ms ({:.2}x); leftovers: {} cgroups, {inits} init processes, {dirs} entries in run_dir (mounts live only in the runs' own mount namespaces)",
        ms(wall),
        ms(bw_wall),
        wall.as_secs_f64() / bw_wall.as_secs_f64(),
        mine.len()
    );
    assert_eq!(ok, 50);
    assert_eq!(bw_ok, 50);
    assert!(mine.is_empty() && inits == 0 && dirs == 0);
}
