//! `/llm` streaming: time to the first SSE event through the sidecar's relay
//! versus directly from the same fake provider, measured in the same run.
//!
//! `cargo bench -p airlock --bench llm_ttfb` (env `LLM_TTFB_ITERS`, default 400).
//! Everything runs on 127.0.0.1: the fake provider in this process, the real
//! `airlock sidecar` binary against a real test platform.

#[path = "../tests/support/fake_provider.rs"]
mod fake_provider;
#[path = "../tests/support/mod.rs"]
#[allow(dead_code, unused_imports)]
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
struct Conn {
    s: TcpStream,
    req: Vec<u8>,
}

impl Conn {
    async fn new(addr: SocketAddr, path: &str, auth: Option<&str>) -> Conn {
        let s = TcpStream::connect(addr).await.unwrap();
        s.set_nodelay(true).unwrap();
        let body = json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]}).to_string();
        let auth = auth.map(|a| format!("authorization: Bearer {a}\r\n")).unwrap_or_default();
        let req = format!(
            "POST {path} HTTP/1.1\r\nhost: bench\r\n{auth}content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        Conn { s, req: req.into_bytes() }
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
    (us(v[v.len() / 2]), us(v[v.len() * 9 / 10]), us(v[v.len() * 99 / 100]))
}

fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let iters: usize = std::env::var("LLM_TTFB_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(400);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async move {
        let p = TestPlatform::start("bench-llm").await;
        p.add_connection("@model", AuthType::ApiKey, &[("api_key", "sk-bench-key")]).await;
        let fake = fake_provider::start(Duration::ZERO).await;
        let mut cfg = p.sidecar_config(json!({"tcp": "127.0.0.1:0"}));
        support::merge(
            &mut cfg,
            json!({
                "model": {"provider": "openai", "base_url": format!("http://api.internal.test:{}/v1", fake.port())},
                "egress": {"allow_internal_hosts": ["api.internal.test"], "resolve": {"api.internal.test": ["127.0.0.1"]}},
            }),
        );
        let sc = tokio::task::spawn_blocking(move || support::spawn_sidecar_with_log(&cfg, "warn")).await.unwrap();
        let token = p.sidecar_token.expose_secret().to_owned();
        let mut direct = Conn::new(fake.addr, "/v1/chat/completions", None).await;
        let mut relay = Conn::new(sc.tcp(), "/llm/v1/chat/completions", Some(&token)).await;
        for _ in 0..50 {
            direct.once().await;
            relay.once().await;
        }
        let (mut d_first, mut d_total, mut r_first, mut r_total) = (vec![], vec![], vec![], vec![]);
        for _ in 0..iters {
            let (f, t) = direct.once().await;
            d_first.push(f);
            d_total.push(t);
            let (f, t) = relay.once().await;
            r_first.push(f);
            r_total.push(t);
        }
        let (df, dt, rf, rt_) = (stats(d_first), stats(d_total), stats(r_first), stats(r_total));
        println!("llm_ttfb: OpenAI-style streaming chat completion, {iters} iterations, keep-alive, 127.0.0.1");
        println!("                        median      p90      p99   (µs)");
        println!("direct   first event  {:>8.0} {:>8.0} {:>8.0}", df.0, df.1, df.2);
        println!("relay    first event  {:>8.0} {:>8.0} {:>8.0}", rf.0, rf.1, rf.2);
        println!("added    first event  {:>8.0} {:>8.0} {:>8.0}", rf.0 - df.0, rf.1 - df.1, rf.2 - df.2);
        println!("direct   whole stream {:>8.0} {:>8.0} {:>8.0}", dt.0, dt.1, dt.2);
        println!("relay    whole stream {:>8.0} {:>8.0} {:>8.0}", rt_.0, rt_.1, rt_.2);
        println!("(the relay path includes the per-call credential fetch from the platform and a cost event)");
        drop(sc);
    });
}
