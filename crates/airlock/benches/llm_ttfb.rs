//! `/llm` streaming: time to the first SSE event through the sidecar's relay
//! versus directly from the same fake provider, measured in the same run.
//!
//! `cargo bench -p airlock --bench llm_ttfb` (env `LLM_TTFB_ITERS`, default 400).
//! Everything runs on 127.0.0.1: the fake provider in this process, the real
//! `airlock sidecar` binary against a real test platform.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

#[path = "../tests/support/fake_provider.rs"]
mod fake_provider;
#[path = "../tests/support/mod.rs"]
mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use airlock_platform::testing::TestPlatform;
use airlock_store::AuthType;
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
        let body =
            json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]})
                .to_string();
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
            assert!(n > 0, "connection closed mid-response");
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

fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let iters: usize = std::env::var("LLM_TTFB_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let p = TestPlatform::start("bench-llm").await;
        p.add_connection("@model", AuthType::ApiKey, &[("key", "sk-bench-key")]).await;
        let fake = fake_provider::start(Duration::ZERO).await;
        let mut cfg = p.sidecar_config(json!({"tcp": "127.0.0.1:0", "unix": p.dir.path().join("sidecar.sock")}));
        support::merge(
            &mut cfg,
            json!({
                "model": {"provider": "openai", "base_url": format!("http://api.internal.test:{}/v1", fake.port())},
                "egress": {"allow_internal_hosts": ["api.internal.test"], "resolve": {"api.internal.test": ["127.0.0.1"]}},
            }),
        );
        let sc = tokio::task::spawn_blocking(move || support::spawn_sidecar_with_log(&cfg, "warn")).await.unwrap();
        let token = p.sidecar_token.expose_secret().to_owned();
        let mut conns = [
            ("direct (tcp)", Conn::tcp(fake.addr, "/v1/chat/completions", None).await),
            ("relay (unix socket)", Conn::unix(&sc.unix(), "/llm/v1/chat/completions", Some(&token)).await),
            ("relay (tcp)", Conn::tcp(sc.tcp(), "/llm/v1/chat/completions", Some(&token)).await),
        ];
        for _ in 0..50 {
            for (_, c) in conns.iter_mut() {
                c.once().await;
            }
        }
        let mut first: Vec<Vec<Duration>> = vec![vec![]; conns.len()];
        let mut total: Vec<Vec<Duration>> = vec![vec![]; conns.len()];
        for _ in 0..iters {
            for (i, (_, c)) in conns.iter_mut().enumerate() {
                let (f, t) = c.once().await;
                first[i].push(f);
                total[i].push(t);
            }
        }
        println!("llm_ttfb: OpenAI-style streaming chat completion (8 events), {iters} iterations each, keep-alive, loopback");
        println!("{:<22} {:>24} {:>24}", "", "first event (µs)", "whole stream (µs)");
        println!("{:<22} {:>8} {:>7} {:>7} {:>8} {:>7} {:>7}", "", "median", "p90", "p99", "median", "p90", "p99");
        let base = stats(first[0].clone());
        for (i, (name, _)) in conns.iter().enumerate() {
            let f = stats(first[i].clone());
            let t = stats(total[i].clone());
            println!("{name:<22} {:>8.0} {:>7.0} {:>7.0} {:>8.0} {:>7.0} {:>7.0}", f.0, f.1, f.2, t.0, t.1, t.2);
            if i > 0 {
                println!("{:<22} {:>8.0} {:>7.0} {:>7.0}", "  added vs direct", f.0 - base.0, f.1 - base.1, f.2 - base.2);
            }
        }
        // The part of the added time that is the per-call key fetch (platform
        // internal API over its unix socket: store read + decrypt).
        let platform = airlock_platform_api::PlatformClient::new(&p.socket, p.run_token.clone());
        let mut fetch = vec![];
        for _ in 0..iters {
            let t0 = Instant::now();
            platform.credential("@model").await.unwrap();
            fetch.push(t0.elapsed());
        }
        let f = stats(fetch);
        println!("{:<22} {:>8.0} {:>7.0} {:>7.0}", "  of which key fetch", f.0, f.1, f.2);
        println!("(the relay path includes the per-call credential fetch from the platform and a cost event)");
        drop(sc);
    });
}
