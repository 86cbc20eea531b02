//! `api_call` through the real `airlock sidecar` beside its peer, one
//! keep-alive `nginx` reverse-proxy hop to the same loopback upstream, and
//! the request straight to the upstream, in the same run: alternating call
//! by call (in a fresh random order each round), three repetitions, a fresh sidecar for each (as a run starts
//! one).
//!
//! Prints per repetition and as medians [min–max]: p50/p99 and the latency
//! each adds to the direct request, for an integration whose credential is
//! fetched from the platform on every call (the normal case) and for one
//! without a connection (guard + MCP), as ratios to the nginx hop; CPU per
//! call of the sidecar and of nginx; the sidecar's RSS idle (VmRSS) and its
//! peak (VmHWM) under 100 concurrent `api_call`s.
//! Each path's clock runs from sending the request to having read its answer
//! whole; the bench's own check of a sidecar answer comes after.
//! The platform runs on a runtime of its own, as a deployed platform is a
//! process of its own (`peers::Platform`; `AIRLOCK_BENCH_SHARED_PLATFORM=1`
//! puts it on the bench's runtime, beside the bench's client and upstream,
//! where its answers came faster than a deployment's).
//! Last, the machine's hand-off floor (`peers::handoff_rtt`): what each
//! hop between processes costs here before any work is done.
//!
//! Run: `cargo bench -p airlock --bench mcp_api_call` (`MCP_BENCH_N` sets
//! the sequential sample count, default 2000; `MCP_BENCH_REPS`, default 3).
//! `MCP_BENCH_PROFILE=anon` (or `credential`) makes only that path's calls,
//! measuring nothing: for the sidecar's profile of one path (with
//! `AIRLOCK_BENCH_WRAP`).
//! `MCP_BENCH_NULL_PLATFORM=1` gives the sidecar, instead of the platform, a
//! bare hyper server that answers every request at once with the credential:
//! the credentialed figure is then the round trip alone, the floor of any
//! fetch per call on this machine. `MCP_BENCH_NULL_PLATFORM=raw` answers
//! from a blocking thread per connection with no HTTP library: the floor of
//! any server answering that fetch, however lean.
//! `MCP_BENCH_DUMP=/path/prefix` writes every timed call of repetition R
//! to `/path/prefix.R`, one line each: the path (1 nginx, 2 credential,
//! 3 without a connection), when it started and how long it took, in µs
//! since the repetition's first call (to see when the slow calls happen).
//! Loopback traffic only.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

mod peers;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use airlock_store::AuthType;
use airlock_vault::ExposeSecret;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::net::TcpListener;

const API: &str = "api.internal.test";
const BODY: &str =
    r#"{"ok":true,"items":[1,2,3],"note":"a small JSON answer like most API calls get"}"#;

async fn upstream() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind upstream");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let _ = s.set_nodelay(true);
            tokio::spawn(async move {
                let svc = service_fn(|_req: hyper::Request<hyper::body::Incoming>| async {
                    Ok::<_, Infallible>(
                        hyper::Response::builder()
                            .header("content-type", "application/json")
                            .body(Full::new(Bytes::from_static(BODY.as_bytes())))
                            .expect("response"),
                    )
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    addr
}

/// What the null platforms answer: the bench's credential.
const NULL_CREDENTIAL: &[u8] = br#"{"integration":"svc","connection":"svc","auth_type":"bearer","fields":{"api_key":"bench-credential-value"}}"#;

/// A platform that answers every request at once with the bench's
/// credential (no token check, no store, no decrypt): what a credentialed
/// call costs when the platform's own work is nil, i.e. the round trip alone.
/// With `raw`, no HTTP library and no runtime either: [`raw_platform`].
fn null_platform(p: &peers::Platform, rep: usize, raw: bool) -> std::path::PathBuf {
    let path = p.dir.path().join(format!("null-platform-{rep}.sock"));
    let l = std::os::unix::net::UnixListener::bind(&path).expect("bind null platform");
    if raw {
        std::thread::spawn(move || raw_platform(&l));
        return path;
    }
    l.set_nonblocking(true).expect("nonblocking");
    // Served where the platform is served.
    p.handle().spawn(async move {
        let l = tokio::net::UnixListener::from_std(l).expect("null platform listener");
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(async move {
                let svc = service_fn(|_req: hyper::Request<hyper::body::Incoming>| async {
                    Ok::<_, Infallible>(
                        hyper::Response::builder()
                            .header("content-type", "application/json")
                            .body(Full::new(Bytes::from_static(NULL_CREDENTIAL)))
                            .expect("response"),
                    )
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    path
}

/// Serves `l` with a blocking thread per connection that answers each
/// request head (the credential fetch is a `GET`: no body) with the bench's
/// credential, written at once: the least any server can do per fetch here.
fn raw_platform(l: &std::os::unix::net::UnixListener) {
    use std::io::{Read, Write};
    let mut answer = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        NULL_CREDENTIAL.len()
    )
    .into_bytes();
    answer.extend_from_slice(NULL_CREDENTIAL);
    for s in l.incoming() {
        let Ok(mut s) = s else { return };
        let answer = answer.clone();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 16 * 1024];
            let mut have = 0;
            loop {
                match s.read(&mut buf[have..]) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => have += n,
                }
                // Every complete head gets its answer; a partial one waits.
                while let Some(end) = buf[..have].windows(4).position(|w| w == b"\r\n\r\n") {
                    if s.write_all(&answer).is_err() {
                        return;
                    }
                    buf.copy_within(end + 4..have, 0);
                    have -= end + 4;
                }
                assert!(have < buf.len(), "raw platform: request head too large");
            }
        });
    }
}

async fn direct(c: &mut SendRequest<Full<Bytes>>, addr: SocketAddr) -> usize {
    get_data(c, addr).await
}

/// `GET /data` on `c` (to the upstream, or to nginx in front of it).
async fn get_data(c: &mut SendRequest<Full<Bytes>>, addr: SocketAddr) -> usize {
    let req = hyper::Request::get("/data")
        .header("host", format!("{API}:{}", addr.port()))
        .header("authorization", "Bearer bench-credential-value")
        .body(Full::new(Bytes::new()))
        .expect("request");
    c.ready().await.expect("upstream connection");
    let resp = c.send_request(req).await.expect("direct request");
    resp.into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes()
        .len()
}

fn call_body(tool: &str, target: &str, id: u64) -> String {
    json!({
        "jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {
            "name": tool,
            "arguments": {"target": target},
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {}
            }
        }
    })
    .to_string()
}

/// A sidecar's answer, read whole: checked by [`Answer::expect_ok`] once
/// the clock has stopped (the check is the bench's work, not the hop's).
struct Answer {
    status: hyper::StatusCode,
    bytes: Bytes,
}

impl Answer {
    fn expect_ok(self) {
        let needle: &[u8] = b"\"isError\":false";
        let ok = self.bytes.windows(needle.len()).any(|w| w == needle);
        if self.status != 200 || !ok {
            panic!(
                "api_call failed: {} {}",
                self.status,
                String::from_utf8_lossy(&self.bytes)
            );
        }
    }
}

async fn via_sidecar(
    c: &mut SendRequest<Full<Bytes>>,
    token: &str,
    tool: &str,
    body: String,
) -> Answer {
    let req = hyper::Request::post("/mcp")
        .header("host", "127.0.0.1")
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", tool)
        .body(Full::new(Bytes::from(body)))
        .expect("request");
    c.ready().await.expect("sidecar connection");
    let resp = c.send_request(req).await.expect("sidecar request");
    let status = resp.status();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    Answer { status, bytes }
}

use peers::{client, p50_99};

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let p = peers::Platform::start(
        &rt,
        "bench-agent",
        "svc",
        AuthType::Bearer,
        &[("api_key", "bench-credential-value")],
    );
    rt.block_on(run(&p));
}

struct Rep {
    direct: (f64, f64),
    nginx: Option<(f64, f64)>,
    cred: (f64, f64),
    anon: (f64, f64),
    cpu_cred_us: f64,
    cpu_anon_us: f64,
    cpu_nginx_us: Option<f64>,
    idle_mib: f64,
    warm_mib: f64,
    peak_mib: f64,
    burst_cps: f64,
}

async fn run(p: &peers::Platform) {
    let n: usize = std::env::var("MCP_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let reps: usize = std::env::var("MCP_BENCH_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let up = upstream().await;
    let port = up.port();
    let nginx = peers::nginx(up);
    println!(
        "mcp api_call, {n} sequential calls per figure, {reps} repetitions, alternating (loopback upstream, keep-alive, 2026-07-28 stateless JSON); load {}",
        peers::load()
    );
    println!("  {}; {}", peers::describe(), p.describe());
    match std::env::var("MCP_BENCH_NULL_PLATFORM").as_deref() {
        Ok("raw") => println!(
            "  MCP_BENCH_NULL_PLATFORM=raw: the sidecar fetches from a blocking thread with no HTTP library answering at once"
        ),
        Ok(_) => println!(
            "  MCP_BENCH_NULL_PLATFORM: the sidecar fetches from a bare hyper server answering at once"
        ),
        Err(_) => {}
    }
    let token = p.sidecar_token.expose_secret().to_owned();
    let profile_only = match std::env::var("MCP_BENCH_PROFILE").ok().as_deref() {
        None => None,
        Some("anon") => Some("anon__api_call"),
        Some("credential") => Some("svc__api_call"),
        Some(other) => panic!("MCP_BENCH_PROFILE={other}: expected anon or credential"),
    };
    let target = format!("http://{API}:{port}/data");
    let mut results = Vec::new();
    for rep in 0..reps {
        let mut cfg = p
            .sidecar_config()
            .tcp()
            .integration(
                peers::integration("svc")
                    .authorized([format!("http://{API}:{port}/**")])
                    .bearer("api_key"),
            )
            .integration(
                peers::integration("anon")
                    .authorized([format!("http://{API}:{port}/**")])
                    .without_connection(),
            )
            .loopback_host(API)
            .limits(|l| l.max_concurrent_calls = 128);
        if let Some(null) = std::env::var_os("MCP_BENCH_NULL_PLATFORM") {
            cfg = cfg.platform_socket(null_platform(p, rep, null == "raw"));
        }
        let sc = peers::spawn_sidecar(cfg.build());
        let pid = sc.pid();
        let sc_addr = sc.tcp();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let idle_kib = peers::kib(pid, "VmRSS:");

        let mut d = client(up).await;
        let mut s = client(sc_addr).await;
        if let Some(tool) = &profile_only {
            // Profile mode: this one path's calls only; the sidecar's user
            // and kernel time per call (from /proc, in clock ticks).
            let tick_us = 1e6 / rustix::param::clock_ticks_per_second() as f64;
            let ticks = || -> (u64, u64) {
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                let after = stat.rsplit_once(')').map_or("", |x| x.1);
                let f: Vec<u64> = after
                    .split_whitespace()
                    .map(|x| x.parse().unwrap_or(0))
                    .collect();
                (
                    f.get(11).copied().unwrap_or(0),
                    f.get(12).copied().unwrap_or(0),
                )
            };
            let (u0, s0) = ticks();
            let t = Instant::now();
            for i in 0..n as u64 {
                via_sidecar(&mut s, &token, tool, call_body(tool, &target, i))
                    .await
                    .expect_ok();
            }
            let wall = t.elapsed();
            let (u1, s1) = ticks();
            let per = |t: u64| t as f64 * tick_us / n as f64;
            println!(
                "  rep {rep}: {n} calls of {tool} (profile mode), {:.1} µs each; sidecar user {:.1} µs, kernel {:.1} µs per call",
                wall.as_secs_f64() * 1e6 / n as f64,
                per(u1 - u0),
                per(s1 - s0)
            );
            drop(sc);
            continue;
        }
        let mut ng = match &nginx {
            Some(n) => Some((client(n.addr).await, n.addr, n.pid())),
            None => None,
        };
        for i in 0..200 {
            direct(&mut d, up).await;
            if let Some((c, a, _)) = &mut ng {
                get_data(c, *a).await;
            }
            via_sidecar(
                &mut s,
                &token,
                "svc__api_call",
                call_body("svc__api_call", &target, i),
            )
            .await
            .expect_ok();
            via_sidecar(
                &mut s,
                &token,
                "anon__api_call",
                call_body("anon__api_call", &target, i),
            )
            .await
            .expect_ok();
        }
        let warm_kib = peers::kib(pid, "VmRSS:");

        // Interleaved so drift affects every path alike, in a fresh order
        // each round (a fixed one locks each path to a phase of the
        // sidecar's event batches).
        let (mut t_direct, mut t_nginx, mut t_cred, mut t_anon) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        let (mut cpu_cred, mut cpu_anon, mut cpu_nginx) = (0u64, 0u64, 0u64);
        let sidecar_cpu = peers::CpuMeter::of(pid);
        let nginx_cpu = ng.as_ref().map(|(_, _, npid)| peers::CpuMeter::of(*npid));
        let mut shuffle = peers::Shuffle::new(0x5eed ^ rep as u64);
        // (path, start since t0, took), for MCP_BENCH_DUMP.
        let t0 = Instant::now();
        let mut dump: Vec<(u8, Duration, Duration)> = Vec::with_capacity(3 * n);
        for i in 0..n as u64 {
            for path in shuffle.order(4) {
                match path {
                    0 => {
                        let t = Instant::now();
                        direct(&mut d, up).await;
                        t_direct.push(t.elapsed());
                    }
                    1 => {
                        if let (Some((c, a, _)), Some(meter)) = (&mut ng, &nginx_cpu) {
                            let c0 = meter.ns();
                            let t = Instant::now();
                            get_data(c, *a).await;
                            let took = t.elapsed();
                            t_nginx.push(took);
                            dump.push((1, t - t0, took));
                            cpu_nginx += meter.ns().saturating_sub(c0);
                        }
                    }
                    2 => {
                        let body = call_body("svc__api_call", &target, i);
                        let c0 = sidecar_cpu.ns();
                        let t = Instant::now();
                        let answer = via_sidecar(&mut s, &token, "svc__api_call", body).await;
                        let took = t.elapsed();
                        t_cred.push(took);
                        dump.push((2, t - t0, took));
                        cpu_cred += sidecar_cpu.ns().saturating_sub(c0);
                        answer.expect_ok();
                    }
                    _ => {
                        let body = call_body("anon__api_call", &target, i);
                        let c0 = sidecar_cpu.ns();
                        let t = Instant::now();
                        let answer = via_sidecar(&mut s, &token, "anon__api_call", body).await;
                        let took = t.elapsed();
                        t_anon.push(took);
                        dump.push((3, t - t0, took));
                        cpu_anon += sidecar_cpu.ns().saturating_sub(c0);
                        answer.expect_ok();
                    }
                }
            }
        }

        if let Some(path) = std::env::var_os("MCP_BENCH_DUMP") {
            use std::io::Write;
            let mut f = std::io::BufWriter::new(
                std::fs::File::create(format!("{}.{rep}", path.to_string_lossy()))
                    .expect("MCP_BENCH_DUMP: create the dump file"),
            );
            for (p, at, took) in &dump {
                writeln!(f, "{p} {:.1} {:.1}", peers::us(*at), peers::us(*took)).unwrap();
            }
        }
        // 100 concurrent api_calls, 20 rounds, each on its own connection.
        let mut tasks = tokio::task::JoinSet::new();
        let started = Instant::now();
        for c in 0..100u64 {
            let token = token.clone();
            let target = target.clone();
            tasks.spawn(async move {
                let mut s = client(sc_addr).await;
                for i in 0..20 {
                    via_sidecar(
                        &mut s,
                        &token,
                        "svc__api_call",
                        call_body("svc__api_call", &target, c * 100 + i),
                    )
                    .await
                    .expect_ok();
                }
            });
        }
        while let Some(r) = tasks.join_next().await {
            r.expect("concurrent client");
        }
        let elapsed = started.elapsed();
        let per = |ns: u64| ns as f64 / n as f64 / 1000.0;
        let r = Rep {
            direct: p50_99(t_direct),
            nginx: ng.as_ref().map(|_| p50_99(t_nginx.clone())),
            cred: p50_99(t_cred),
            anon: p50_99(t_anon),
            cpu_cred_us: per(cpu_cred),
            cpu_anon_us: per(cpu_anon),
            cpu_nginx_us: ng.as_ref().map(|_| per(cpu_nginx)),
            idle_mib: idle_kib as f64 / 1024.0,
            warm_mib: warm_kib as f64 / 1024.0,
            peak_mib: peers::kib(pid, "VmHWM:") as f64 / 1024.0,
            burst_cps: 2000.0 / elapsed.as_secs_f64(),
        };
        let added = |x: (f64, f64)| (x.0 - r.direct.0, x.1 - r.direct.1);
        println!("  rep {rep}:");
        println!(
            "    {:<40} p50 {:>7.1} µs  p99 {:>7.1} µs",
            "direct to upstream", r.direct.0, r.direct.1
        );
        if let Some(nx) = r.nginx {
            let a = added(nx);
            println!(
                "    {:<40} p50 {:>7.1} µs  p99 {:>7.1} µs  added p50 {:>6.1} p99 {:>6.1}  CPU/call {:>5.1} µs",
                "nginx hop (peer)",
                nx.0,
                nx.1,
                a.0,
                a.1,
                r.cpu_nginx_us.unwrap_or(0.0)
            );
        }
        for (label, x, cpu) in [
            ("airlock, no connection", r.anon, r.cpu_anon_us),
            (
                "airlock, credential fetched per call",
                r.cred,
                r.cpu_cred_us,
            ),
        ] {
            let a = added(x);
            let ratio = r
                .nginx
                .map(|nx| {
                    let na = added(nx);
                    format!("  ×nginx p50 {:.2} p99 {:.2}", a.0 / na.0, a.1 / na.1)
                })
                .unwrap_or_default();
            println!(
                "    {label:<40} p50 {:>7.1} µs  p99 {:>7.1} µs  added p50 {:>6.1} p99 {:>6.1}  CPU/call {:>5.1} µs{ratio}",
                x.0, x.1, a.0, a.1, cpu
            );
        }
        println!(
            "    sidecar memory: idle {:.2} MiB, after warm-up {:.2} MiB, peak under 100 concurrent api_calls {:.2} MiB ({:.0} calls/s)",
            r.idle_mib, r.warm_mib, r.peak_mib, r.burst_cps
        );
        results.push(r);
        drop(sc);
    }

    if profile_only.is_some() {
        return;
    }
    // The platform round trip alone (what a credentialed call adds at least).
    let platform = airlock_platform_api::PlatformClient::new(&p.socket, p.run_token.clone());
    let mut t_fetch = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        platform.credential("svc").await.expect("credential");
        t_fetch.push(t.elapsed());
    }
    let fetch = p50_99(t_fetch);

    println!("summary (median [min–max] of {reps} repetitions):");
    let col = |f: &dyn Fn(&Rep) -> f64| -> Vec<f64> { results.iter().map(f).collect() };
    let line = |label: &str, v: Vec<f64>| println!("  {label:<52} {}", peers::spread(&v, 1));
    // The goals are ratios at two decimals (1.96 is not "2.0").
    let ratio = |label: &str, v: Vec<f64>| println!("  {label:<52} {}", peers::spread(&v, 2));
    line("direct p50 (µs)", col(&|r| r.direct.0));
    if nginx.is_some() {
        line(
            "nginx hop added p50 (µs)",
            col(&|r| r.nginx.map_or(f64::NAN, |x| x.0 - r.direct.0)),
        );
        line(
            "nginx hop added p99 (µs)",
            col(&|r| r.nginx.map_or(f64::NAN, |x| x.1 - r.direct.1)),
        );
        line(
            "nginx CPU per call (µs)",
            col(&|r| r.cpu_nginx_us.unwrap_or(f64::NAN)),
        );
    }
    for (label, get, cpu) in [
        (
            "no connection",
            (|r: &Rep| r.anon) as fn(&Rep) -> (f64, f64),
            (|r: &Rep| r.cpu_anon_us) as fn(&Rep) -> f64,
        ),
        (
            "credential per call",
            |r: &Rep| r.cred,
            |r: &Rep| r.cpu_cred_us,
        ),
    ] {
        line(
            &format!("airlock {label}: added p50 (µs)"),
            col(&|r| get(r).0 - r.direct.0),
        );
        line(
            &format!("airlock {label}: added p99 (µs)"),
            col(&|r| get(r).1 - r.direct.1),
        );
        line(
            &format!("airlock {label}: CPU per call (µs)"),
            col(&|r| cpu(r)),
        );
        if nginx.is_some() {
            ratio(
                &format!("airlock {label}: added p50 / nginx's"),
                col(&|r| (get(r).0 - r.direct.0) / r.nginx.map_or(f64::NAN, |x| x.0 - r.direct.0)),
            );
            ratio(
                &format!("airlock {label}: added p99 / nginx's"),
                col(&|r| (get(r).1 - r.direct.1) / r.nginx.map_or(f64::NAN, |x| x.1 - r.direct.1)),
            );
        }
    }
    line("sidecar RSS idle (MiB)", col(&|r| r.idle_mib));
    line("sidecar RSS after warm-up (MiB)", col(&|r| r.warm_mib));
    line(
        "sidecar peak RSS, 100 concurrent api_calls (MiB)",
        col(&|r| r.peak_mib),
    );
    line("100 concurrent api_calls (calls/s)", col(&|r| r.burst_cps));
    println!(
        "  platform credential fetch alone: p50 {:.1} µs p99 {:.1} µs",
        fetch.0, fetch.1
    );
    peers::print_handoff_floor();
}
