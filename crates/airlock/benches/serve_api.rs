//! `airlock serve` through its API.
//!
//! `cargo bench -p airlock --bench serve_api [-- BACKEND]` (default `namespace`)
//!
//! 1. Request overhead: `GET /v1/runs/{id}` (key check, the run's row, JSON)
//!    on one keep-alive connection, p50/p99 over `AIRLOCK_BENCH_N` requests
//!    (default 2000), alternating call by call with two peers measured in the
//!    same loop: `GET /healthz` on the same server (routing alone), and nginx
//!    serving the same bytes as a static file (started by the bench; missing,
//!    it says so and its figure is left out). Three repetitions.
//! 2. Runs started per second: 40 runs of a trivial agent posted at once
//!    with no run limit, on the backend given; the span from the first POST
//!    to the last run's start, and to the last run's end. Beside it, the
//!    same 40 runs as 40 `airlock run` processes started at once (the
//!    embedded platform, each its own process).
//! 3. 500 runs queued at once behind `max_concurrent_runs` 8: all drained,
//!    each checked (status, its own log line), the drain time; meanwhile,
//!    on a connection of its own, `GET /v1/runs/{id}` under that load,
//!    p50/p99, alternating call by call with `GET /healthz` (routing alone,
//!    under the same load).
#![allow(clippy::unwrap_used)] // a bench may unwrap: a panic is its failure

mod peers;

use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use peers::serve::{AIRLOCK, Conn, TRIVIAL, agent, org, post_runs, start, wait_all_ended};

/// nginx serving `body` at `/run` from a file, keep-alive.
fn nginx_static(body: &[u8]) -> Option<(Child, SocketAddr, tempfile::TempDir)> {
    let bin = ["/usr/sbin/nginx", "/usr/bin/nginx"]
        .into_iter()
        .find(|p| Path::new(p).exists());
    let Some(bin) = bin else {
        eprintln!(
            "\n!!! PEER MISSING: `nginx` is not installed: its figures are left out (apt-get install nginx; .ci/run does)\n"
        );
        return None;
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("run"), body).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let d = dir.path().display();
    let conf = format!(
        "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
         events {{ worker_connections 64; }}\nhttp {{\n  access_log off;\n  keepalive_requests 1000000;\n\
         client_body_temp_path {d}/b;\n  proxy_temp_path {d}/p;\n  fastcgi_temp_path {d}/f;\n  uwsgi_temp_path {d}/u;\n  scgi_temp_path {d}/s;\n\
         server {{\n    listen 127.0.0.1:{port};\n    root {d};\n    default_type application/json;\n  }}\n}}\n"
    );
    std::fs::write(dir.path().join("nginx.conf"), conf).unwrap();
    let child = Command::new(bin)
        .arg("-c")
        .arg(dir.path().join("nginx.conf"))
        .arg("-p")
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(addr).is_err() {
        if Instant::now() > deadline {
            eprintln!("!!! nginx did not listen");
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Some((child, addr, dir))
}

fn main() {
    let backend = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .unwrap_or_else(|| "namespace".into());
    let n: usize = std::env::var("AIRLOCK_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    println!("serve_api: backend {backend}, load {}", peers::load());

    // 1. Request overhead.
    let home = tempfile::Builder::new()
        .prefix("airlock-bench-serve-")
        .tempdir()
        .unwrap();
    let s = start(home.path(), &backend, None);
    let key = org(&s);
    let mut c = Conn::open(s.addr);
    assert_eq!(
        c.json("POST", "/v1/agents", &key, Some(&agent("trivial")))
            .0,
        201
    );
    let id = post_runs(&mut c, &key, "trivial", 1).remove(0);
    let ended = wait_all_ended(&mut c, &key, std::slice::from_ref(&id), 60);
    assert_eq!(ended[0]["status"], "succeeded", "{}", ended[0]);
    let path = format!("/v1/runs/{id}");
    let (_, body) = c.req("GET", &path, Some(&key), None);
    let nginx = nginx_static(&body);
    let mut ng = nginx.as_ref().map(|(_, a, _)| Conn::open(*a));
    let mut health = Conn::open(s.addr);
    println!(
        "\n1. GET /v1/runs/{{id}} on a keep-alive connection ({} bytes of JSON), {n} requests x 3",
        body.len()
    );
    println!("   {:<34} {:>9} {:>9}", "", "p50 µs", "p99 µs");
    for rep in 1..=3 {
        let (mut api, mut hz, mut st) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        for _ in 0..n {
            let t = Instant::now();
            let (code, _) = c.req("GET", &path, Some(&key), None);
            api.push(t.elapsed());
            assert_eq!(code, 200);
            let t = Instant::now();
            health.req("GET", "/healthz", None, None);
            hz.push(t.elapsed());
            if let Some(g) = ng.as_mut() {
                let t = Instant::now();
                let (code, _) = g.req("GET", "/run", None, None);
                st.push(t.elapsed());
                assert_eq!(code, 200);
            }
        }
        for v in [&mut api, &mut hz, &mut st] {
            v.sort();
        }
        let row = |name: &str, v: &[Duration]| {
            if !v.is_empty() {
                println!(
                    "   rep {rep} {:<28} {:>9.0} {:>9.0}",
                    name,
                    peers::us(peers::percentile(v, 0.5)),
                    peers::us(peers::percentile(v, 0.99))
                );
            }
        };
        row("airlock serve GET /v1/runs/{id}", &api);
        row("airlock serve GET /healthz", &hz);
        row("nginx, the same bytes (static)", &st);
        if !st.is_empty() {
            println!(
                "   rep {rep} the API's own cost (p50 vs nginx): +{:.0} µs",
                peers::us(peers::percentile(&api, 0.5)) - peers::us(peers::percentile(&st, 0.5))
            );
        }
    }
    drop(ng);
    if let Some((mut child, _, _)) = nginx {
        let _ = child.kill();
        let _ = child.wait();
    }

    // 2. Runs started per second.
    const STARTS: usize = 40;
    let t0 = Instant::now();
    let ids = post_runs(&mut c, &key, "trivial", STARTS);
    let posted = t0.elapsed();
    let runs = wait_all_ended(&mut c, &key, &ids, 300);
    let all_ended = t0.elapsed();
    let first_created = runs
        .iter()
        .map(|r| r["created_at"].as_i64().unwrap())
        .min()
        .unwrap();
    let last_started = runs
        .iter()
        .map(|r| r["started_at"].as_i64().unwrap())
        .max()
        .unwrap();
    let ok = runs.iter().filter(|r| r["status"] == "succeeded").count();
    let start_span = (last_started - first_created) as f64 / 1000.0;
    println!("\n2. {STARTS} runs of a trivial agent posted at once, no run limit ({backend})");
    println!(
        "   API: posted in {:.0} ms; all started within {:.2} s ({:.1} starts/s); all ended after {:.2} s ({:.1} runs/s); {ok}/{STARTS} succeeded",
        posted.as_secs_f64() * 1000.0,
        start_span,
        STARTS as f64 / start_span,
        all_ended.as_secs_f64(),
        STARTS as f64 / all_ended.as_secs_f64()
    );
    drop(c);
    drop(health);
    drop(s);
    // Peer: the same runs, each its own `airlock run` process.
    let peer_home = tempfile::Builder::new()
        .prefix("airlock-bench-run-")
        .tempdir()
        .unwrap();
    let agent_dir = peer_home.path().join("agent");
    std::fs::create_dir(&agent_dir).unwrap();
    std::fs::write(agent_dir.join("agent.py"), TRIVIAL).unwrap();
    std::fs::write(
        agent_dir.join("airlock.toml"),
        agent("trivial")["manifest"].as_str().unwrap(),
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&agent_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let t0 = Instant::now();
    let children: Vec<Child> = (0..STARTS)
        .map(|i| {
            Command::new(AIRLOCK)
                .args([
                    "run",
                    "--json",
                    "--backend",
                    &backend,
                    "--prompt",
                    &format!("p{i}"),
                    "-f",
                ])
                .arg(agent_dir.join("airlock.toml"))
                .env("AIRLOCK_HOME", peer_home.path())
                .env_remove("DATABASE_URL")
                .env_remove("PLATFORM_RUN_LIMITS")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut peer_ok = 0;
    for mut ch in children {
        if ch.wait().unwrap().success() {
            peer_ok += 1;
        }
    }
    let peer_all = t0.elapsed();
    println!(
        "   peer, {STARTS} `airlock run` at once: all ended after {:.2} s ({:.1} runs/s); {peer_ok}/{STARTS} succeeded",
        peer_all.as_secs_f64(),
        STARTS as f64 / peer_all.as_secs_f64()
    );

    // 3. 500 queued runs drained, and the API's latency under that load.
    const QUEUED: usize = 500;
    let home = tempfile::Builder::new()
        .prefix("airlock-bench-serve-")
        .tempdir()
        .unwrap();
    let s = start(home.path(), &backend, Some(r#"{"max_concurrent_runs": 8}"#));
    let key = org(&s);
    let mut c = Conn::open(s.addr);
    assert_eq!(
        c.json("POST", "/v1/agents", &key, Some(&agent("trivial")))
            .0,
        201
    );
    let t0 = Instant::now();
    let ids = post_runs(&mut c, &key, "trivial", QUEUED);
    let posted = t0.elapsed();
    let (_, queued) = c.json("GET", "/v1/runs?status=queued&limit=100", &key, None);
    let queued_now = queued["runs"].as_array().map_or(0, Vec::len);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let prober = {
        let (stop, addr, key, path) = (
            stop.clone(),
            s.addr,
            key.clone(),
            format!("/v1/runs/{}", ids[0]),
        );
        std::thread::spawn(move || {
            let (mut api, mut hz) = (Conn::open(addr), Conn::open(addr));
            let (mut a, mut h) = (Vec::new(), Vec::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let t = Instant::now();
                assert_eq!(api.req("GET", &path, Some(&key), None).0, 200);
                a.push(t.elapsed());
                let t = Instant::now();
                assert_eq!(hz.req("GET", "/healthz", None, None).0, 200);
                h.push(t.elapsed());
            }
            a.sort();
            h.sort();
            (a, h)
        })
    };
    let runs = wait_all_ended(&mut c, &key, &ids, 1800);
    let drained = t0.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (api, hz) = prober.join().unwrap();
    let ok = runs.iter().filter(|r| r["status"] == "succeeded").count();
    // Nothing lost: every run has its own line, and only its own.
    let mut lines_ok = 0;
    for (i, id) in ids.iter().enumerate() {
        let (_, logs) = c.json("GET", &format!("/v1/runs/{id}/logs"), &key, None);
        let text = logs.to_string();
        if text.contains(&format!("ran p{i}\"")) {
            lines_ok += 1;
        }
    }
    let most = {
        let mut edges: Vec<(i64, i32)> = runs
            .iter()
            .flat_map(|r| {
                [
                    (r["started_at"].as_i64().unwrap(), 1),
                    (r["ended_at"].as_i64().unwrap(), -1),
                ]
            })
            .collect();
        edges.sort();
        let (mut now, mut most) = (0, 0);
        for (_, d) in edges {
            now += d;
            most = most.max(now);
        }
        most
    };
    println!("\n3. {QUEUED} runs posted at once behind max_concurrent_runs 8 ({backend})");
    println!(
        "   posted in {:.2} s ({}{} visibly queued right after); drained in {:.1} s ({:.1} runs/s); {ok}/{QUEUED} succeeded; {lines_ok}/{QUEUED} with their own log line; at most {most} at once",
        posted.as_secs_f64(),
        if queued_now == 100 { "≥ " } else { "" },
        queued_now,
        drained.as_secs_f64(),
        QUEUED as f64 / drained.as_secs_f64()
    );
    println!(
        "   under that load: GET /v1/runs/{{id}} p50 {:.2} ms, p99 {:.2} ms ({} requests); GET /healthz beside it p50 {:.2} ms, p99 {:.2} ms",
        peers::us(peers::percentile(&api, 0.5)) / 1000.0,
        peers::us(peers::percentile(&api, 0.99)) / 1000.0,
        api.len(),
        peers::us(peers::percentile(&hz, 0.5)) / 1000.0,
        peers::us(peers::percentile(&hz, 0.99)) / 1000.0,
    );
    assert_eq!(ok, QUEUED, "runs lost or failed");
    assert_eq!(lines_ok, QUEUED, "log lines lost");
    assert!(most <= 8, "the limit was exceeded");
}
