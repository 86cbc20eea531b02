//! `api_call` through the real `airlock sidecar` versus the same request
//! straight to the loopback upstream, measured in the same run.
//!
//! Prints: p50/p99 of both and the added latency, for an integration whose
//! credential is fetched from the platform on every call (the normal case)
//! and for one without a connection (guard + MCP overhead only); the
//! sidecar's RSS when idle (VmRSS of the process) and its peak (VmHWM) under
//! 100 concurrent `api_call`s.
//!
//! Run: `cargo bench -p airlock --bench mcp_api_call` (`MCP_BENCH_N` sets
//! the sequential sample count, default 3000). Loopback traffic only.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use std::convert::Infallible;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use airlock_platform::testing::TestPlatform;
use airlock_store::AuthType;
use airlock_vault::ExposeSecret;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};

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

async fn client(addr: SocketAddr) -> SendRequest<Full<Bytes>> {
    let s = TcpStream::connect(addr).await.expect("connect");
    let _ = s.set_nodelay(true);
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
        .await
        .expect("handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    sender
}

async fn direct(c: &mut SendRequest<Full<Bytes>>, addr: SocketAddr) -> usize {
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

async fn via_sidecar(
    c: &mut SendRequest<Full<Bytes>>,
    token: &str,
    tool: &str,
    body: String,
) -> usize {
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
    let needle: &[u8] = b"\"isError\":false";
    let ok = bytes.windows(needle.len()).any(|w| w == needle);
    if status != 200 || !ok {
        panic!(
            "api_call failed: {status} {}",
            String::from_utf8_lossy(&bytes)
        );
    }
    bytes.len()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or_default()
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn proc_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

struct Sidecar {
    child: std::process::Child,
    tcp: SocketAddr,
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(cfg: &Value) -> Sidecar {
    let mut child = Command::new(env!("CARGO_BIN_EXE_airlock"))
        .arg("sidecar")
        .env("AIRLOCK_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start airlock sidecar");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(cfg.to_string().as_bytes())
        .expect("config");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("readiness line");
    std::thread::spawn(move || {
        let mut rest = Vec::new();
        let _ = out.read_to_end(&mut rest);
    });
    let ready: Value = serde_json::from_str(line.trim()).expect("readiness JSON");
    let tcp = ready["listen"]["tcp"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("tcp listener");
    Sidecar { child, tcp }
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run());
}

async fn run() {
    let n: usize = std::env::var("MCP_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000);
    let p = TestPlatform::start("bench-agent").await;
    p.add_connection(
        "svc",
        AuthType::Bearer,
        &[("api_key", "bench-credential-value")],
    )
    .await;
    let up = upstream().await;
    let port = up.port();
    let mut cfg = p.sidecar_config(json!({"tcp": "127.0.0.1:0"}));
    let patch = json!({
        "integrations": [
            {"namespace": "svc", "authorized_uris": [format!("http://{API}:{port}/**")],
             "delivery": {"header": "Authorization", "prefix": "Bearer ", "field": "api_key"}},
            {"namespace": "anon", "authorized_uris": [format!("http://{API}:{port}/**")], "has_connection": false}
        ],
        "egress": {"allow_internal_hosts": [API], "resolve": {API: ["127.0.0.1"]}},
        "limits": {"max_concurrent_calls": 128}
    });
    if let (Value::Object(a), Value::Object(b)) = (&mut cfg, patch) {
        a.extend(b);
    }
    let sc = spawn(&cfg);
    let pid = sc.child.id();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let idle_kib = proc_kib(pid, "VmRSS:");
    let token = p.sidecar_token.expose_secret().to_owned();
    let target = format!("http://{API}:{port}/data");

    let mut d = client(up).await;
    let mut s = client(sc.tcp).await;
    for i in 0..200 {
        direct(&mut d, up).await;
        via_sidecar(
            &mut s,
            &token,
            "svc__api_call",
            call_body("svc__api_call", &target, i),
        )
        .await;
        via_sidecar(
            &mut s,
            &token,
            "anon__api_call",
            call_body("anon__api_call", &target, i),
        )
        .await;
    }
    let after_warmup_kib = proc_kib(pid, "VmRSS:");

    // Interleaved so drift affects all three alike.
    let (mut t_direct, mut t_cred, mut t_anon) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    for i in 0..n as u64 {
        let t = Instant::now();
        direct(&mut d, up).await;
        t_direct.push(t.elapsed());
        let body = call_body("svc__api_call", &target, i);
        let t = Instant::now();
        via_sidecar(&mut s, &token, "svc__api_call", body).await;
        t_cred.push(t.elapsed());
        let body = call_body("anon__api_call", &target, i);
        let t = Instant::now();
        via_sidecar(&mut s, &token, "anon__api_call", body).await;
        t_anon.push(t.elapsed());
    }
    for v in [&mut t_direct, &mut t_cred, &mut t_anon] {
        v.sort();
    }
    let (d50, d99) = (percentile(&t_direct, 0.5), percentile(&t_direct, 0.99));
    println!(
        "mcp api_call latency, {n} sequential calls each (loopback upstream, keep-alive, 2026-07-28 stateless JSON):"
    );
    println!(
        "  {:<44} p50 {:>8.1} µs   p99 {:>8.1} µs",
        "direct to upstream (baseline)",
        us(d50),
        us(d99)
    );
    for (label, t) in [
        ("via sidecar, credential fetched per call", &t_cred),
        ("via sidecar, no connection (guard + MCP)", &t_anon),
    ] {
        let (p50, p99) = (percentile(t, 0.5), percentile(t, 0.99));
        println!(
            "  {label:<44} p50 {:>8.1} µs   p99 {:>8.1} µs   added p50 {:>7.1} µs  p99 {:>7.1} µs",
            us(p50),
            us(p99),
            us(p50) - us(d50),
            us(p99) - us(d99)
        );
    }

    // One extra loopback hop with no work: the sidecar's `GET /health`.
    let mut t_health = Vec::with_capacity(n);
    for _ in 0..n {
        let req = hyper::Request::get("/health")
            .header("host", "127.0.0.1")
            .body(Full::new(Bytes::new()))
            .expect("request");
        let t = Instant::now();
        s.ready().await.expect("sidecar connection");
        let resp = s.send_request(req).await.expect("health");
        let _ = resp.into_body().collect().await.expect("body");
        t_health.push(t.elapsed());
    }
    t_health.sort();
    println!(
        "  {:<44} p50 {:>8.1} µs   p99 {:>8.1} µs",
        "sidecar GET /health (the hop alone)",
        us(percentile(&t_health, 0.5)),
        us(percentile(&t_health, 0.99))
    );

    // The platform round trip alone (what a credentialed call adds at least).
    let platform = airlock_platform_api::PlatformClient::new(&p.socket, p.run_token.clone());
    let mut t_fetch = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        platform.credential("svc").await.expect("credential");
        t_fetch.push(t.elapsed());
    }
    t_fetch.sort();
    println!(
        "  {:<44} p50 {:>8.1} µs   p99 {:>8.1} µs",
        "platform credential fetch alone",
        us(percentile(&t_fetch, 0.5)),
        us(percentile(&t_fetch, 0.99))
    );

    // 100 concurrent api_calls, 20 rounds, each on its own connection.
    let mut tasks = tokio::task::JoinSet::new();
    let started = Instant::now();
    for c in 0..100u64 {
        let token = token.clone();
        let target = target.clone();
        let addr = sc.tcp;
        tasks.spawn(async move {
            let mut s = client(addr).await;
            for i in 0..20 {
                via_sidecar(
                    &mut s,
                    &token,
                    "svc__api_call",
                    call_body("svc__api_call", &target, c * 100 + i),
                )
                .await;
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.expect("concurrent client");
    }
    let elapsed = started.elapsed();
    let peak_kib = proc_kib(pid, "VmHWM:");
    let after_kib = proc_kib(pid, "VmRSS:");
    println!("sidecar memory (pid {pid}):");
    println!(
        "  idle after start              VmRSS {:>7.2} MiB",
        idle_kib as f64 / 1024.0
    );
    println!(
        "  idle after warm-up            VmRSS {:>7.2} MiB",
        after_warmup_kib as f64 / 1024.0
    );
    println!(
        "  100 concurrent api_calls      VmHWM {:>7.2} MiB (peak; 2000 calls in {:.2} s, {:.0} calls/s)",
        peak_kib as f64 / 1024.0,
        elapsed.as_secs_f64(),
        2000.0 / elapsed.as_secs_f64()
    );
    println!(
        "  after the burst               VmRSS {:>7.2} MiB",
        after_kib as f64 / 1024.0
    );
}
