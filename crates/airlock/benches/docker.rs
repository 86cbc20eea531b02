//! The docker backend, each figure beside its peer measured in the same run
//! and the same loop (alternating, so both see the same load):
//!
//! 1. **container start**: the backend's `spawn` of `/bin/true` in the agent
//!    image (its run network created first, as for every run) until it has
//!    exited, and until everything is removed — beside `docker run --rm
//!    --network none IMG true` (the CLI: create, attach, start, wait, remove).
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
//! `cargo bench -p airlock --bench docker`; `AIRLOCK_BENCH_N` samples per
//! side in loop 1 (default 20), loop 2 uses half. Needs a Docker daemon
//! (the images are built first if missing).
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

fn spec(i: usize) -> SandboxSpec {
    SandboxSpec {
        run_id: format!("bench{}-{i}", std::process::id()),
        command: vec!["/bin/true".into()],
        env: vec![],
        stdin: vec![],
        hold_stdin: false,
        sockets_dir: PathBuf::from("/nonexistent"),
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
    // One of each first: warm the daemon's caches, not counted.
    rt.block_on(async {
        let mut sb = backend.spawn(&spec(usize::MAX)).unwrap();
        sb.wait().await.unwrap();
        sb.cleanup().await;
    });
    docker_run_true(&image);
    for i in 0..n {
        let (e, r) = rt.block_on(async {
            let t = Instant::now();
            let mut sb = backend.spawn(&spec(i)).unwrap();
            let st = sb.wait().await.unwrap();
            assert!(st.success());
            let e = t.elapsed();
            sb.cleanup().await;
            (e, t.elapsed())
        });
        exited.push(e);
        removed.push(r);
        cli.push(docker_run_true(&image));
        cli_net.push(docker_run_true_on(&image, &bench_net));
    }
    let _ = Command::new("docker")
        .args(["network", "rm", &bench_net])
        .output();
    line("backend spawn → exited (network, create, start)", &exited);
    line("backend spawn → removed (container and network)", &removed);
    line("peer: docker run --rm --network none IMG true", &cli);
    line("scale: the same on an existing internal network", &cli_net);
    let ratio = |a: &[Duration]| ms(pcts(a)[0]) / ms(pcts(&cli)[0]);
    println!(
        "  ratio p50: exited {:.2}×, removed {:.2}× the CLI (goal ≤ 1.2×)",
        ratio(&exited),
        ratio(&removed)
    );
    // The shape of a run has a network; the CLI with one is the floor of that shape.
    let ratio_net = |a: &[Duration]| ms(pcts(a)[0]) / ms(pcts(&cli_net)[0]);
    println!(
        "  ratio p50 to the CLI on an internal network: exited {:.2}×, removed {:.2}×",
        ratio_net(&exited),
        ratio_net(&removed)
    );

    println!("docker: a trivial run end to end (`airlock run`, one line of python)");
    let agent = Trivial::new(60, "");
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

    cold_and_warm(n.div_ceil(2), &cli);

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
    use peers::serve::{Conn, agent, base_env, org, start_env};
    println!("docker: a trivial run end to end through airlock serve, cold and warm pool");
    let homes: Vec<tempfile::TempDir> = (0..2)
        .map(|_| {
            tempfile::Builder::new()
                .prefix("airlock-bench-pool-")
                .tempdir()
                .unwrap()
        })
        .collect();
    let mut warm_env = base_env(homes[1].path(), None);
    warm_env.push(("DOCKER_WARM_POOL".into(), "2".into()));
    let servers = [
        start_env(homes[0].path(), "docker", base_env(homes[0].path(), None)),
        start_env(homes[1].path(), "docker", warm_env),
    ];
    let mut sides: Vec<(Conn, String)> = servers
        .iter()
        .map(|s| {
            let key = org(s);
            let mut c = Conn::open(s.addr);
            assert_eq!(
                c.json("POST", "/v1/agents", &key, Some(&agent("trivial")))
                    .0,
                201
            );
            (c, key)
        })
        .collect();
    let mut recorded = [vec![], vec![]];
    let mut seen = [vec![], vec![]];
    // One run each first: the warm server's pool learns what this agent's
    // runs need (that run starts cold), not counted.
    for (i, (c, key)) in sides.iter_mut().enumerate() {
        timed_run(c, key, i);
    }
    for round in 0..n {
        for (i, (c, key)) in sides.iter_mut().enumerate() {
            if i == 1 {
                wait_pool_full(servers[1].child.id(), 2);
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
    line(
        "peer: docker run --rm --network none IMG true (part 1)",
        cli,
    );
    let warm = ms(pcts(&recorded[1])[0]);
    println!(
        "  ratio p50 warm/cold (recorded): {:.2}×; warm ÷ docker run: {:.2}× (goal: warm ≤ 150 ms)",
        warm / ms(pcts(&recorded[0])[0]),
        warm / ms(pcts(cli)[0])
    );
    // Stopped as an operator stops them: the idle pairs go with the server.
    for mut s in servers {
        let pid = rustix::process::Pid::from_raw(i32::try_from(s.child.id()).unwrap()).unwrap();
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        let _ = s.child.wait();
    }
}

/// One run of `trivial`: its span as recorded, and as seen by the client.
fn timed_run(c: &mut peers::serve::Conn, key: &str, round: usize) -> (Duration, Duration) {
    let t = Instant::now();
    let (st, v) = c.json(
        "POST",
        "/v1/runs",
        key,
        Some(&serde_json::json!({"agent": "trivial", "prompt": format!("p{round}")})),
    );
    assert_eq!(st, 202, "{v}");
    let id = v["id"].as_str().unwrap().to_owned();
    loop {
        let (_, r) = c.json("GET", &format!("/v1/runs/{id}"), key, None);
        if let Some(end) = r["ended_at"].as_u64() {
            let seen = t.elapsed();
            assert_eq!(r["status"], "succeeded", "{r}");
            let start = r["created_at"].as_u64().unwrap();
            return (Duration::from_millis(end - start), seen);
        }
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "run {id} never ended"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
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
