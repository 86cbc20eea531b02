//! Each fast path of the sidecar beside the plain path it stands in for,
//! alternated in one run (issue 46 item 5: a twin stays only while it pays
//! at least 5 % on its own figure, more than the rounds' spread).
//!
//! `cargo bench -p airlock-sidecar --bench twins`
//!
//! `TWINS_ROUNDS` rounds (default 15); in each, the twin and the plain path
//! each run one batch, in a shuffled order. Printed per pair: each path's
//! figure (median [min–max] over the rounds), and the per-round ratio
//! plain / twin (median [p25–p75]): the twin's gain is the median ratio
//! less one, its spread the distance from the median down to the first
//! quartile. A twin pays when its gain is at least 5 % and more than its
//! spread (it is faster in three rounds of four).
//!
//! The pairs:
//! - the usage of a 1 MiB JSON answer: scanned as it streams, or gathered
//!   and parsed by serde (µs per MiB);
//! - a chat stream's events read in place, or parsed into a `Value`
//!   (µs per 1,000 events);
//! - the same stream split by the relay's splitter, or by `sse-stream`;
//! - a chat request body prepared in place, or by way of the parsed tree
//!   (µs per body, 16 KiB);
//! - an uncredentialed `api_call` through `/mcp` in-process, on the
//!   stateless fast path or rmcp's (µs of wall and of CPU per call).
#![allow(clippy::unwrap_used)] // a bench may unwrap: a panic is its failure
#![allow(clippy::cast_precision_loss)] // figures are printed, not computed on

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use airlock_sidecar::llm::twins;
use airlock_test_support::bench::{
    CpuMeter, Shuffle, answer_each_request, load, spread, twin_verdict,
};
use bytes::Bytes;
use tower::ServiceExt;

fn rounds() -> usize {
    std::env::var("TWINS_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(15)
}

/// Runs `twin` and `plain` (each one batch, returning its figure: lower is
/// better) alternately for [`rounds`] rounds and prints both and the ratio.
fn alternate(
    name: &str,
    unit: &str,
    shuffle: &mut Shuffle,
    mut twin: impl FnMut() -> f64,
    mut plain: impl FnMut() -> f64,
) {
    // One batch each first, unrecorded: caches and pools warm.
    twin();
    plain();
    let (mut t, mut p) = (Vec::new(), Vec::new());
    for _ in 0..rounds() {
        for i in shuffle.order(2) {
            if i == 0 {
                t.push(twin());
            } else {
                p.push(plain());
            }
        }
    }
    println!(
        "{name}\n  twin  {} {unit}\n  plain {} {unit}\n  plain/twin {}",
        spread(&t, 1),
        spread(&p, 1),
        twin_verdict(&t, &p),
    );
}

/// [`alternate`] of two readings of the same answer, `n` readings a batch,
/// once it is checked that both meter the same tokens.
fn metered_pair(
    name: &str,
    unit: &str,
    (answer, n): (&[Bytes], usize),
    twin: fn(&[Bytes]) -> twins::Metered,
    plain: fn(&[Bytes]) -> twins::Metered,
    shuffle: &mut Shuffle,
) {
    assert_eq!(twin(answer), plain(answer), "{name}");
    alternate(
        name,
        unit,
        shuffle,
        || per(n, || sink(twin(answer))),
        || per(n, || sink(plain(answer))),
    );
}

/// Time per unit of `f` run `n` times, in µs.
fn per(n: usize, mut f: impl FnMut()) -> f64 {
    let start = Instant::now();
    for _ in 0..n {
        f();
    }
    start.elapsed().as_secs_f64() * 1e6 / n as f64
}

/// Keeps `t` from being optimised away.
fn sink<T>(t: T) {
    black_box(t);
}

fn chunks(all: &[u8], size: usize) -> Vec<Bytes> {
    all.chunks(size).map(Bytes::copy_from_slice).collect()
}

/// A 1 MiB embeddings answer with its usage at the end.
fn json_answer() -> Vec<u8> {
    let mut a = br#"{"object":"list","data":["#.to_vec();
    let mut i = 0;
    while a.len() < (1 << 20) {
        if i > 0 {
            a.push(b',');
        }
        a.extend_from_slice(format!(r#"{{"object":"embedding","index":{i},"embedding":[0.0123,-0.4567,0.891,0.2345,-0.6789,0.0101,0.5,-0.25]}}"#).as_bytes());
        i += 1;
    }
    a.extend_from_slice(
        br#"],"model":"text-embedding-x","usage":{"prompt_tokens":812,"total_tokens":812}}"#,
    );
    a
}

/// A chat completion stream of 1,000 content chunks and its usage chunk.
fn sse_answer() -> Vec<u8> {
    let mut s = Vec::new();
    for i in 0..1000 {
        s.extend_from_slice(format!("data: {{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"gpt-x\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"tok{i} \"}},\"finish_reason\":null}}]}}\n\n").as_bytes());
    }
    s.extend_from_slice(b"data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"model\":\"gpt-x\",\"choices\":[],\"usage\":{\"prompt_tokens\":20,\"completion_tokens\":1000,\"total_tokens\":1020}}\n\ndata: [DONE]\n\n");
    s
}

/// A 16 KiB chat request that asks for a stream.
fn chat_body() -> Bytes {
    let mut messages = Vec::new();
    let mut len = 0;
    let mut i = 0;
    while len < 16 * 1024 {
        let m = serde_json::json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": format!("message {i}: the quick brown fox jumps over the lazy dog, \"quoted\" and é")});
        len += m.to_string().len();
        messages.push(m);
        i += 1;
    }
    let body = serde_json::json!({"model": "gpt-x", "stream": true, "temperature": 0.2, "messages": messages, "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]});
    Bytes::from(serde_json::to_vec(&body).unwrap())
}

use airlock_test_support::sidecar_config::{SidecarConfigBuilder, open_to};
use std::path::Path;
const META: &str = r#"{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}"#;

/// A loopback upstream answering every request of a kept-alive connection
/// with the same small JSON answer.
async fn upstream() -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let _ = s.set_nodelay(true);
            tokio::spawn(async move {
                let body = r#"{"ok":true,"items":[1,2,3]}"#;
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                answer_each_request(s, answer.as_bytes()).await;
            });
        }
    });
    port
}

fn sidecar(port: u16, journal: &std::path::Path) -> Arc<airlock_sidecar::Sidecar> {
    let cfg = SidecarConfigBuilder::detached("run_twins", Path::new("/nonexistent/platform.sock"))
        .integration(open_to("api.internal.test", port))
        .loopback_host("api.internal.test")
        .build();
    let journal = airlock_sidecar::journal::Journal::open(journal, 1 << 34).unwrap();
    airlock_sidecar::Sidecar::new(cfg, &[], journal).unwrap()
}

/// One `api_call` through `endpoint`; panics unless it is answered 200.
async fn api_call(endpoint: &airlock_sidecar::mcp::Endpoint, port: u16) {
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"open__api_call","arguments":{{"target":"http://api.internal.test:{port}/data?q=1"}},"_meta":{META}}}}}"#
    );
    let req = axum::http::Request::post("/")
        .header("host", "127.0.0.1")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "open__api_call")
        .body(axum::body::Body::from(body))
        .unwrap();
    let resp = endpoint.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let bytes = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    assert!(
        bytes.windows(9).any(|w| w == b"ok\\\":true"),
        "{}",
        String::from_utf8_lossy(&bytes)
    );
}

fn main() {
    println!("# twins: {} rounds, load {}", rounds(), load());
    let mut shuffle = Shuffle::new(46);

    let json = chunks(&json_answer(), 16 * 1024);
    assert_eq!(twins::json_usage_scanned(&json).0, Some(812));
    metered_pair(
        "JSON usage of a 1 MiB answer (json_usage.rs vs gathered + serde)",
        "µs/MiB",
        (&json, 20),
        twins::json_usage_scanned,
        twins::json_usage_parsed,
        &mut shuffle,
    );
    println!(
        "  memory held per answer: twin ≤ 64 KiB (its usage value), plain the whole answer (1 MiB here)"
    );

    let sse = chunks(&sse_answer(), 4096);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let want = twins::sse_in_place(&sse);
    assert_eq!(want, (Some(20), Some(1000)));
    assert_eq!(rt.block_on(twins::sse_stream_crate(&sse)), want);
    metered_pair(
        "SSE events read in place (event.rs vs serde_json::Value), per 1,000 events",
        "µs",
        (&sse, 10),
        twins::sse_in_place,
        twins::sse_by_value,
        &mut shuffle,
    );
    alternate(
        "SSE stream split (sse.rs vs the sse-stream crate), per 1,000 events",
        "µs",
        &mut shuffle,
        || per(10, || sink(twins::sse_in_place(&sse))),
        || per(10, || sink(rt.block_on(twins::sse_stream_crate(&sse)))),
    );

    let body = chat_body();
    assert_eq!(
        twins::prepared_in_place(body.clone()).1,
        twins::prepared_by_value(body.clone()).1
    );
    alternate(
        "chat request body prepared (prepare vs prepare_by_value), 16 KiB",
        "µs",
        &mut shuffle,
        || per(200, || sink(twins::prepared_in_place(body.clone()))),
        || per(200, || sink(twins::prepared_by_value(body.clone()))),
    );

    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("egress.journal");
    std::fs::write(&journal, b"").unwrap();
    let cpu = CpuMeter::of(std::process::id());
    let (port, sc) = rt.block_on(async {
        let port = upstream().await;
        (port, sidecar(port, &journal))
    });
    let lean = airlock_sidecar::mcp::endpoint_with(sc.clone(), true);
    let rmcp = airlock_sidecar::mcp::endpoint_with(sc.clone(), false);
    const CALLS: usize = 300;
    let batch = |endpoint: &airlock_sidecar::mcp::Endpoint, cpu_time: bool| {
        let (c0, t0) = (cpu.ns(), Instant::now());
        rt.block_on(async {
            for _ in 0..CALLS {
                api_call(endpoint, port).await;
            }
        });
        if cpu_time {
            (cpu.ns() - c0) as f64 / 1e3 / CALLS as f64
        } else {
            t0.elapsed().as_secs_f64() * 1e6 / CALLS as f64
        }
    };
    for (what, cpu_time) in [("wall", false), ("CPU", true)] {
        alternate(
            &format!("api_call through /mcp in-process, {what} (stateless_call.rs vs rmcp)"),
            "µs/call",
            &mut shuffle,
            || batch(&lean, cpu_time),
            || batch(&rmcp, cpu_time),
        );
    }
}
