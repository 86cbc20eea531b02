//! The docker backend, each figure beside its peer measured in the same run
//! and the same loop (alternating, so both see the same load):
//!
//! 1. **container start**: the backend's `spawn` of `/bin/true` in the agent
//!    image (on `--network none`, its sockets' directory bound in, as for
//!    every run) until it has exited, and until it is removed — beside
//!    `docker run --rm --network none IMG true` (the CLI: create, attach,
//!    start, wait, remove); for scale, the CLI on an existing internal
//!    network (the floor of the earlier shape, a run network per run).
//! 2. **a trivial run end to end**: `airlock run --backend docker` of a
//!    python agent that prints one line — beside the same run on the
//!    namespace backend.
//! 3. **a trivial run end to end through `airlock serve`, cold and warm**:
//!    the same agent on two servers of this build, one without a warm pool
//!    and one with `DOCKER_WARM_POOL=2`, a run on each in turn (the warm
//!    one posted once its pool is full again): from the POST to the run's
//!    end as the server records them (`ended_at - created_at`), and as the
//!    client sees it (polling every 10 ms); the warm one also beside part
//!    1's `docker run --rm --network none IMG true`.
//! 4. **20 concurrent runs**: all must succeed and leave nothing — beside 20
//!    concurrent `docker run --rm --network none IMG true` (20 sidecars on
//!    `airlock-egress` at once: the daemon's address pools must hold them).
//!
//! Then, not in the figures above, **where a warm run's time goes**: as
//! many warm runs again on a third server whose platform, sidecars and
//! runtimes log their `airlock::phase` milestones
//! (`warn,airlock::phase=debug`), each milestone's median time since the
//! POST, in order, and the median step from the one before (a milestone
//! is logged by the process named before its colon, the platform's own
//! unnamed; every process reads the host's clock).
//!
//! `cargo bench -p airlock --bench docker`; `AIRLOCK_BENCH_N` samples per
//! side in loop 1 (default 20), loops 2 and 3 use half;
//! `AIRLOCK_BENCH_PARTS` (default `1,2,3,phases,4`) the parts run. Needs a
//! Docker daemon (the images are built first if missing).
#![allow(clippy::unwrap_used)] // a bench may unwrap: a panic is its failure

mod peers;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use airlock_sandbox::docker::{DockerBackend, DockerConfig};
use airlock_sandbox::{Backend, SandboxSpec};
use peers::runs::{Trivial, concurrent, line, namespace_available};
use peers::{ms, pcts};

const AIRLOCK: &str = env!("CARGO_BIN_EXE_airlock");

/// Sample `i`'s spec; its sockets' directory made in `dir` as the
/// platform makes a run's (0711).
fn spec(i: usize, dir: &Path) -> SandboxSpec {
    use std::os::unix::fs::PermissionsExt;
    let sockets_dir = dir.join(format!("sock-{i}"));
    std::fs::create_dir_all(&sockets_dir).unwrap();
    std::fs::set_permissions(&sockets_dir, std::fs::Permissions::from_mode(0o711)).unwrap();
    SandboxSpec {
        run_id: format!("bench{}-{i}", std::process::id()),
        command: vec!["/bin/true".into()],
        env: vec![],
        stdin: vec![],
        hold_stdin: false,
        sockets_dir,
        ro_paths: vec![],
        workspace: PathBuf::from("/workspace"),
        workspace_size_mb: 16,
        memory_mb: 256,
        cpus: 1.0,
        pids_max: 64,
        kind: airlock_sandbox::SandboxKind::Agent,
    }
}

fn docker_run_true(image: &str) -> Duration {
    docker_run_true_on(image, "none")
}

fn docker_run_true_on(image: &str, network: &str) -> Duration {
    let t = Instant::now();
    let st = Command::new("docker")
        .args(["run", "--rm", "--network", network, image, "/bin/true"])
        .status()
        .unwrap();
    assert!(st.success());
    t.elapsed()
}

fn main() {
    let n: usize = std::env::var("AIRLOCK_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let vars = std::env::vars().collect();
    let cfg = DockerConfig::from_vars(&vars, Path::new(AIRLOCK)).unwrap();
    let image = cfg.images.agent.to_string();
    let built = Command::new(AIRLOCK)
        .args(["images", "check"])
        .output()
        .unwrap();
    if !built.status.success() {
        assert!(
            Command::new(AIRLOCK)
                .args(["images", "build"])
                .status()
                .unwrap()
                .success()
        );
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let backend = DockerBackend::new(cfg);
    rt.block_on(backend.ensure_egress_network()).unwrap();
    let parts = std::env::var("AIRLOCK_BENCH_PARTS").unwrap_or_else(|_| "1,2,3,phases,4".into());
    let part = |p: &str| parts.split(',').any(|x| x.trim() == p);
    let cli = match part("1") {
        true => container_start(&rt, &backend, &image, n),
        false => vec![],
    };
    let agent = Trivial::new(60, "");
    if part("2") {
        trivial_runs(&agent, n);
    }
    if part("3") {
        cold_and_warm(n.div_ceil(2), &cli);
    }
    if part("phases") {
        warm_phases(n.div_ceil(2));
    }
    if part("4") {
        concurrent_runs(agent, &image);
    }
}

/// Part 1: the backend's start beside the CLI's, alternating; the CLI's
/// samples (`docker run --rm --network none IMG true`).
fn container_start(
    rt: &tokio::runtime::Runtime,
    backend: &DockerBackend,
    image: &str,
    n: usize,
) -> Vec<Duration> {
    println!("docker: container start ({image})");
    let (mut exited, mut removed, mut cli, mut cli_net) = (vec![], vec![], vec![], vec![]);
    // For scale: the CLI on an internal network like a run's (made once here).
    let bench_net = format!("airlock-bench-{}", std::process::id());
    assert!(
        Command::new("docker")
            .args([
                "network",
                "create",
                "--internal",
                "-o",
                "com.docker.network.bridge.inhibit_ipv4=true",
                &bench_net
            ])
            .output()
            .unwrap()
            .status
            .success()
    );
    // One sample of the backend's: spawn → exited, → removed.
    let dirs = tempfile::Builder::new()
        .prefix("airlock-bench-docker-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let sample = |i: usize| {
        let spec = spec(i, dirs.path());
        rt.block_on(async {
            let t = Instant::now();
            let mut sb = backend.spawn(&spec).unwrap();
            let st = sb.wait().await.unwrap();
            assert!(st.success());
            let e = t.elapsed();
            sb.cleanup().await;
            (e, t.elapsed())
        })
    };
    // One of each first: warm the daemon's caches, not counted.
    sample(usize::MAX);
    docker_run_true(image);
    for i in 0..n {
        let (e, r) = sample(i);
        exited.push(e);
        removed.push(r);
        cli.push(docker_run_true(image));
        cli_net.push(docker_run_true_on(image, &bench_net));
    }
    let _ = Command::new("docker")
        .args(["network", "rm", &bench_net])
        .output();
    line(
        "backend spawn → exited (create, start; --network none)",
        &exited,
    );
    line("backend spawn → removed", &removed);
    line("peer: docker run --rm --network none IMG true", &cli);
    line("scale: the same on an existing internal network", &cli_net);
    let ratio = |a: &[Duration]| ms(pcts(a)[0]) / ms(pcts(&cli)[0]);
    println!(
        "  ratio p50: exited {:.2}×, removed {:.2}× the CLI (goal ≤ 1.2×)",
        ratio(&exited),
        ratio(&removed)
    );
    // The earlier shape's floor (a run network per run): for scale.
    let ratio_net = |a: &[Duration]| ms(pcts(a)[0]) / ms(pcts(&cli_net)[0]);
    println!(
        "  ratio p50 to the CLI on an internal network: exited {:.2}×, removed {:.2}×",
        ratio_net(&exited),
        ratio_net(&removed)
    );
    cli
}

/// Part 2: `airlock run` on the docker backend beside the namespace one.
fn trivial_runs(agent: &Trivial, n: usize) {
    println!("docker: a trivial run end to end (`airlock run`, one line of python)");
    let ns = namespace_available();
    agent.run("docker");
    let (mut dk, mut nsv) = (vec![], vec![]);
    for _ in 0..n.div_ceil(2) {
        let (d, ok) = agent.run("docker");
        assert!(ok);
        dk.push(d);
        if ns {
            let (d, ok) = agent.run("namespace");
            assert!(ok);
            nsv.push(d);
        }
    }
    line("airlock run --backend docker", &dk);
    if ns {
        line("peer: airlock run --backend namespace", &nsv);
    } else {
        println!("  (peer: the namespace backend is not available here)");
    }
}

/// Part 4: 20 concurrent runs beside 20 concurrent `docker run`.
fn concurrent_runs(agent: Trivial, image: &str) {
    println!("docker: 20 concurrent runs");
    let agent = std::sync::Arc::new(agent);
    let runs = {
        let agent = agent.clone();
        concurrent(20, move |_| agent.run("docker"))
    };
    let left = Command::new("docker")
        .args([
            "ps",
            "-aq",
            "--filter",
            "label=airlock.managed=true",
            "--filter",
            "label=airlock.role=agent",
        ])
        .output()
        .unwrap();
    let image = image.to_owned();
    let peers = concurrent(20, move |_| (docker_run_true(&image), true));
    runs.print("20 × airlock run --backend docker", 20);
    println!(
        "  agent containers left: {}",
        String::from_utf8_lossy(&left.stdout).lines().count()
    );
    peers.print("peer: 20 × docker run --rm --network none IMG true", 20);
    assert_eq!(runs.ok, 20);
}

/// Part 3: `n` trivial runs on a server without a pool and on one with
/// `DOCKER_WARM_POOL=2`, alternating; the warm one also beside `cli`, part
/// 1's `docker run --rm --network none IMG true`.
fn cold_and_warm(n: usize, cli: &[Duration]) {
    println!("docker: a trivial run end to end through airlock serve, cold and warm pool");
    let mut cw = peers::serve::ColdAndWarm::start(
        "docker",
        "airlock-bench-pool-",
        None,
        ("DOCKER_WARM_POOL", 2),
    );
    let mut recorded = [vec![], vec![]];
    let mut seen = [vec![], vec![]];
    // One run each first: the warm server's pool learns what this agent's
    // runs need (that run starts cold), not counted.
    for (c, key) in &mut cw.sides {
        timed_run(c, key, 0);
    }
    for round in 0..n {
        for (i, (c, key)) in cw.sides.iter_mut().enumerate() {
            if i == 1 {
                wait_pool_full(cw.servers[1].child.id(), 2);
            }
            let (r, w) = timed_run(c, key, round);
            recorded[i].push(r);
            seen[i].push(w);
        }
    }
    line("cold: POST → ended (the server's record)", &recorded[0]);
    line("cold: POST → seen ended (client, 10 ms polls)", &seen[0]);
    line("warm: POST → ended (the server's record)", &recorded[1]);
    line("warm: POST → seen ended (client, 10 ms polls)", &seen[1]);
    let warm = ms(pcts(&recorded[1])[0]);
    println!(
        "  ratio p50 warm/cold (recorded): {:.2}× (goal: warm ≤ 150 ms)",
        warm / ms(pcts(&recorded[0])[0]),
    );
    if !cli.is_empty() {
        line(
            "peer: docker run --rm --network none IMG true (part 1)",
            cli,
        );
        println!("  warm ÷ docker run: {:.2}×", warm / ms(pcts(cli)[0]));
    }
    cw.stop();
}

/// One run of `trivial`: its span as recorded, and as seen by the client
/// (10 ms polls).
fn timed_run(c: &mut peers::serve::Conn, key: &str, round: usize) -> (Duration, Duration) {
    peers::serve::timed_run(
        c,
        key,
        round,
        Duration::from_secs(120),
        Duration::from_millis(10),
    )
}

/// Until the platform of PID `pid` has `n` idle pairs.
fn wait_pool_full(pid: u32, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let out = Command::new("docker")
            .args([
                "ps",
                "--filter",
                "label=airlock.pool=true",
                "--filter",
                "label=airlock.role=agent",
                "--format",
                "{{.Names}} {{.Label \"airlock.owner\"}}",
            ])
            .output()
            .unwrap();
        let idle = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| {
                l.starts_with("airlock-pool_")
                    && l.split(':').nth(1) == Some(pid.to_string().as_str())
            })
            .count();
        if idle >= n {
            return;
        }
        assert!(Instant::now() < deadline, "the pool never filled");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The phases of `n` warm runs, on a server of their own whose processes
/// log their `airlock::phase` milestones (not in part 3's figures).
fn warm_phases(n: usize) {
    use peers::serve::{Conn, agent, base_env, org, start_env};
    println!("docker: where a warm run's time goes (its own server, milestones logged)");
    let home = tempfile::Builder::new()
        .prefix("airlock-bench-phases-")
        .tempdir()
        .unwrap();
    let mut env = base_env(home.path(), None);
    env.push(("DOCKER_WARM_POOL".into(), "2".into()));
    for v in ["AIRLOCK_LOG", "AIRLOCK_SIDECAR_LOG", "AIRLOCK_RUNTIME_LOG"] {
        env.push((v.into(), "warn,airlock::phase=debug".into()));
    }
    let mut server = start_env(home.path(), "docker", env);
    let key = org(&server);
    let mut c = Conn::open(server.addr);
    assert_eq!(
        c.json("POST", "/v1/agents", &key, Some(&agent("trivial")))
            .0,
        201
    );
    timed_run(&mut c, &key, 0);
    // Per run: when it was posted (time of day, s) and when it ended as
    // recorded (ms after its POST).
    let mut runs = Vec::new();
    for round in 0..n {
        wait_pool_full(server.child.id(), 2);
        let posted = time_of_day(std::time::SystemTime::now());
        let (recorded, seen) = timed_run(&mut c, &key, round);
        runs.push((posted, ms(recorded), ms(seen)));
    }
    peers::serve::terminate(&mut server);
    let log = std::fs::read_to_string(home.path().join("serve.log")).unwrap();
    let mut lines: Vec<(f64, String)> = log.lines().filter_map(phase_line).collect();
    lines.sort_by(|a, b| a.0.total_cmp(&b.0));
    // Milestone → its ms after each run's POST (the first of each name in
    // a run's window: from its POST to the next run's).
    let mut at: std::collections::BTreeMap<String, Vec<f64>> = Default::default();
    for (i, (posted, recorded, seen)) in runs.iter().enumerate() {
        let until = runs.get(i + 1).map_or(f64::MAX, |r| r.0);
        let mut seen_names = std::collections::BTreeSet::new();
        for (t, name) in lines.iter().filter(|(t, _)| *t >= *posted && *t < until) {
            if seen_names.insert(name.clone()) {
                at.entry(name.clone())
                    .or_default()
                    .push((t - posted) * 1000.0);
            }
        }
        at.entry("(end, as recorded)".into())
            .or_default()
            .push(*recorded);
        at.entry("(end, as the client saw it)".into())
            .or_default()
            .push(*seen);
    }
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mut order: Vec<(f64, &String, usize)> =
        at.iter().map(|(k, v)| (median(v), k, v.len())).collect();
    order.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut before = 0.0;
    for (t, name, count) in order {
        println!(
            "  {name:<46} {t:8.1} ms after the POST (step {:+7.1} ms, n={count})",
            t - before
        );
        before = t;
    }
}

/// Seconds since midnight UTC (what the log lines' timestamps say).
fn time_of_day(t: std::time::SystemTime) -> f64 {
    let d = t.duration_since(std::time::UNIX_EPOCH).unwrap();
    (d.as_secs() % 86_400) as f64 + f64::from(d.subsec_nanos()) * 1e-9
}

/// A log line's time of day (its `THH:MM:SS.ffffff` timestamp, the last
/// before the milestone: a process's line echoed by the platform carries
/// the process's own) and the milestone after `airlock::phase: `.
fn phase_line(line: &str) -> Option<(f64, String)> {
    let (head, name) = line.split_once("airlock::phase: ")?;
    let b = head.as_bytes();
    let t = (0..b.len().saturating_sub(8))
        .rev()
        .find(|&i| b[i] == b'T' && b[i + 3] == b':' && b[i + 6] == b':')?;
    let hms = head[t + 1..].split(['Z', ' ']).next()?;
    let mut it = hms.split(':');
    let (h, m, s): (f64, f64, f64) = (
        it.next()?.parse().ok()?,
        it.next()?.parse().ok()?,
        it.next()?.parse().ok()?,
    );
    // Fields follow the milestone (`run=…`): the name alone.
    let name: Vec<&str> = name
        .split_whitespace()
        .filter(|w| !w.contains('='))
        .collect();
    Some((h * 3600.0 + m * 60.0 + s, name.join(" ")))
}
