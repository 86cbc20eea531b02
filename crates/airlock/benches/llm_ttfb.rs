//! `/llm` streaming: time to the first SSE event through the sidecar's relay,
//! beside its peer (one `nginx` reverse-proxy hop, unbuffered, to the same
//! fake provider) and directly from the provider, in the same run:
//! alternating request by request (in a fresh random order each round),
//! three repetitions, a fresh sidecar each.
//!
//! `cargo bench -p airlock --bench llm_ttfb` (env `LLM_TTFB_ITERS`, default
//! 2000, as `mcp_api_call`: with 400, the nginx hop's added p50, the
//! ratio's denominator, swung 54–101 µs between runs; `LLM_TTFB_REPS`, default 3; `LLM_TTFB_TURNS`, default 1: the turns
//! of conversation each request carries, 100 for an agent's ~50 KB body).
//! Everything runs on 127.0.0.1: the fake provider in this process, the real
//! `airlock sidecar` binary against a real test platform, on a runtime of
//! its own as a deployed platform is a process of its own (`peers::Platform`).
//! Last, the machine's hand-off floor (`peers::handoff_rtt`).
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

mod peers;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use airlock_store::AuthType;
use airlock_test_support::fake_provider;
use airlock_vault::ExposeSecret;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One keep-alive connection; each call sends a streaming chat request and
/// returns (time to the first `data:` event, time to the end of the stream).
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

struct Conn {
    s: Box<dyn Io>,
    req: Vec<u8>,
}

impl Conn {
    async fn tcp(addr: SocketAddr, path: &str, auth: Option<&str>) -> Conn {
        let s = TcpStream::connect(addr).await.unwrap();
        s.set_nodelay(true).unwrap();
        Self::over(Box::new(s), path, auth)
    }

    async fn unix(path_: &std::path::Path, path: &str, auth: Option<&str>) -> Conn {
        let s = tokio::net::UnixStream::connect(path_).await.unwrap();
        Self::over(Box::new(s), path, auth)
    }

    fn over(s: Box<dyn Io>, path: &str, auth: Option<&str>) -> Conn {
        let body = request_body();
        let auth = auth
            .map(|a| format!("authorization: Bearer {a}\r\n"))
            .unwrap_or_default();
        let req = format!(
            "POST {path} HTTP/1.1\r\nhost: bench\r\n{auth}content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        Conn {
            s,
            req: req.into_bytes(),
        }
    }

    async fn once(&mut self) -> (Duration, Duration) {
        let t0 = Instant::now();
        self.s.write_all(&self.req).await.unwrap();
        let mut buf = Vec::with_capacity(8192);
        let mut b = [0u8; 8192];
        let mut first = None;
        loop {
            let n = self.s.read(&mut b).await.unwrap();
            assert!(
                n > 0,
                "connection closed mid-response: {}",
                String::from_utf8_lossy(&buf)
            );
            buf.extend_from_slice(&b[..n]);
            if first.is_none() && buf.windows(5).any(|w| w == b"data:") {
                first = Some(t0.elapsed());
            }
            if buf.ends_with(b"0\r\n\r\n") && buf.windows(6).any(|w| w == b"[DONE]") {
                break;
            }
        }
        (first.unwrap(), t0.elapsed())
    }
}

fn stats(mut v: Vec<Duration>) -> (f64, f64, f64) {
    v.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    (
        us(v[v.len() / 2]),
        us(v[v.len() * 9 / 10]),
        us(v[v.len() * 99 / 100]),
    )
}

/// Turns of the conversation each request carries (`LLM_TTFB_TURNS`,
/// default 1: one "hi"). An agent's request carries its whole history:
/// 100 turns is a ~50 KB body.
fn turns() -> usize {
    std::env::var("LLM_TTFB_TURNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

/// The streamed chat request every path is sent.
fn request_body() -> String {
    json!({"model": "m", "stream": true, "messages": conversation()}).to_string()
}

fn conversation() -> serde_json::Value {
    let n = turns();
    if n <= 1 {
        return json!([{"role": "user", "content": "hi"}]);
    }
    let text =
        "A line of an earlier turn, about as long as the ones agents keep in their history. ";
    (0..n)
        .map(|i| {
            let role = if i % 2 == 0 { "user" } else { "assistant" };
            json!({"role": role, "content": text.repeat(6)})
        })
        .collect()
}

fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let iters: usize = std::env::var("LLM_TTFB_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let reps: usize = std::env::var("LLM_TTFB_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let p = peers::Platform::start(
        &rt,
        "bench-llm",
        "@model",
        AuthType::ApiKey,
        &[("key", "sk-bench-key")],
    );
    // A second run whose relay keeps budgets (the run's, and its
    // organization's through the platform and the store) that never refuse:
    // what reserving and settling each call adds. Not for a baseline build,
    // which has no budgets.
    let budgeted = peers::baseline().is_none().then(|| {
        p.handle().block_on(async {
            let huge = airlock_store::BudgetLimits {
                tokens: Some(i64::MAX / 4),
                ..airlock_store::BudgetLimits::default()
            };
            p.store()
                .set_org_budget(
                    airlock_store::LOCAL_ORG,
                    &airlock_store::OrgBudget {
                        day: huge,
                        month: huge,
                    },
                )
                .await
                .unwrap();
            let dir = p.dir.path().join("budgeted");
            std::fs::create_dir_all(&dir).unwrap();
            let journal = airlock_platform::journal::create(&dir).unwrap();
            let (id, token) = p.another_run("bench-llm-budgeted").await;
            // The main run's grant: its model key.
            p.api.grant(&id, p.api.grant_of_run(&p.run_id).unwrap());
            (id, token, journal)
        })
    });
    let p = &p;
    let budgeted = &budgeted;
    rt.block_on(async move {
        let fake = fake_provider::start(Duration::ZERO).await;
        let nginx = peers::nginx(fake.addr);
        let token = p.sidecar_token.expose_secret().to_owned();
        let body_len = request_body().len();
        println!("llm_ttfb: OpenAI-style streaming chat completion (8 events; request body {body_len} bytes, {} turn(s)), {iters} iterations per figure, {reps} repetitions, alternating, keep-alive, loopback; load {}", turns(), peers::load());
        println!("  {}; {}", peers::describe(), p.describe());
        // (label, per-rep medians of first event, of the whole stream)
        let mut names: Vec<&'static str> = vec!["direct (tcp)"];
        if nginx.is_some() {
            names.push("nginx hop (peer)");
        }
        names.push("relay (unix socket)");
        if budgeted.is_some() {
            names.push("relay, budgets (tcp)");
        }
        names.push("relay (tcp)");
        let mut first_by: Vec<Vec<f64>> = vec![vec![]; names.len()];
        let mut p99_by: Vec<Vec<f64>> = vec![vec![]; names.len()];
        let mut cpu_by: Vec<f64> = vec![];
        for rep in 0..reps {
            let model = |b: peers::SidecarConfigBuilder| {
                b.model(
                    peers::Provider::Openai,
                    &format!("http://api.internal.test:{}/v1", fake.port()),
                )
                .loopback_host("api.internal.test")
            };
            let cfg = model(
                p.sidecar_config()
                    .tcp()
                    .unix(p.dir.path().join(format!("sidecar-{rep}.sock"))),
            )
            .build();
            let sc = peers::spawn_sidecar(cfg);
            let sc_budgets = budgeted.as_ref().map(|(id, run_token, journal)| {
                let cfg = model(
                    peers::SidecarConfigBuilder::new(id, &p.sidecar_token, run_token, &p.socket)
                        .journal(journal)
                        .tcp(),
                )
                .budget(|b| {
                    b.run.tokens = Some(u64::MAX / 4);
                    b.org = true;
                })
                .build();
                peers::spawn_sidecar(cfg)
            });
            let unix = sc.unix();
            let mut conns: Vec<Conn> = vec![Conn::tcp(fake.addr, "/v1/chat/completions", None).await];
            if let Some(n) = &nginx {
                conns.push(Conn::tcp(n.addr, "/v1/chat/completions", None).await);
            }
            conns.push(Conn::unix(&unix, "/llm/v1/chat/completions", Some(&token)).await);
            if let Some(b) = &sc_budgets {
                conns.push(Conn::tcp(b.tcp(), "/llm/v1/chat/completions", Some(&token)).await);
            }
            conns.push(Conn::tcp(sc.tcp(), "/llm/v1/chat/completions", Some(&token)).await);
            for _ in 0..50 {
                for c in conns.iter_mut() {
                    c.once().await;
                }
            }
            let mut first: Vec<Vec<Duration>> = vec![vec![]; conns.len()];
            let mut total: Vec<Vec<Duration>> = vec![vec![]; conns.len()];
            let relay_tcp = conns.len() - 1;
            let mut cpu = 0u64;
            let meter = peers::CpuMeter::of(sc.pid());
            let mut shuffle = peers::Shuffle::new(0x11f ^ rep as u64);
            for _ in 0..iters {
                // A fresh order each round: a fixed one locks each path to a
                // phase of the sidecar's event batches.
                for i in shuffle.order(conns.len()) {
                    let c = &mut conns[i];
                    let c0 = if i == relay_tcp { meter.ns() } else { 0 };
                    let (f, t) = c.once().await;
                    if i == relay_tcp {
                        cpu += meter.ns().saturating_sub(c0);
                    }
                    first[i].push(f);
                    total[i].push(t);
                }
            }
            println!("  rep {rep}: {:<22} {:>24} {:>24}", "", "first event (µs)", "whole stream (µs)");
            println!("         {:<22} {:>8} {:>7} {:>7} {:>8} {:>7} {:>7}", "", "median", "p90", "p99", "median", "p90", "p99");
            let base = stats(first[0].clone());
            for (i, name) in names.iter().enumerate() {
                let f = stats(first[i].clone());
                let t = stats(total[i].clone());
                println!("         {name:<22} {:>8.0} {:>7.0} {:>7.0} {:>8.0} {:>7.0} {:>7.0}", f.0, f.1, f.2, t.0, t.1, t.2);
                if i > 0 {
                    println!("         {:<22} {:>8.0} {:>7.0} {:>7.0}", "  added vs direct", f.0 - base.0, f.1 - base.1, f.2 - base.2);
                }
                first_by[i].push(f.0 - base.0);
                p99_by[i].push(f.2 - base.2);
            }
            cpu_by.push(cpu as f64 / iters as f64 / 1000.0);
            println!("         sidecar CPU per streamed call (tcp): {:.0} µs", cpu as f64 / iters as f64 / 1000.0);
            drop(conns);
            drop(sc);
            drop(sc_budgets);
        }
        // The key fetch (platform internal API over its unix socket): in a
        // call's path only when the relay holds no key (a run's first call,
        // then once per `MODEL_KEY_HOLD`).
        let platform = airlock_platform_api::PlatformClient::new(&p.socket, p.run_token.clone());
        let mut fetch = vec![];
        for _ in 0..iters {
            let t0 = Instant::now();
            platform.credential("@model").await.unwrap();
            fetch.push(t0.elapsed());
        }
        let f = stats(fetch);
        println!("summary (median [min–max] of {reps} repetitions), time to first event added vs direct:");
        for (i, name) in names.iter().enumerate().skip(1) {
            println!("  {name:<22} p50 {:<22} p99 {}", peers::spread(&first_by[i], 0), peers::spread(&p99_by[i], 0));
        }
        if nginx.is_some() {
            let ng = &first_by[1];
            for (i, name) in names.iter().enumerate().skip(2) {
                let ratio: Vec<f64> = first_by[i].iter().zip(ng).map(|(a, n)| a / n).collect();
                println!("  {name:<22} added p50 / nginx's: {}", peers::spread(&ratio, 2));
            }
        }
        println!("  sidecar CPU per streamed call (tcp): {} µs", peers::spread(&cpu_by, 0));
        println!("  a model key fetch (platform round trip; in a call's path once per {} s of holding): p50 {:.0} µs p90 {:.0} µs p99 {:.0} µs", airlock_sidecar::llm::MODEL_KEY_HOLD.as_secs(), f.0, f.1, f.2);
        peers::print_handoff_floor();
    });
}
