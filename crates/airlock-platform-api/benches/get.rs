//! The platform client's `GET` with a JSON answer (the credential fetch of
//! every credentialed `api_call`) over the `get` module, alternated in one
//! run with the same `GET` over hyper's client (issue 46 item 5: the `get`
//! module stays only while it pays at least 5 %, more than the rounds'
//! spread).
//!
//! `cargo bench -p airlock-platform-api --bench get`
//!
//! A platform on a unix socket, in a thread of its own, answers every
//! request of a kept-alive connection with a credential. `GET_ROUNDS`
//! rounds (default 15) of 2,000 fetches per path, in a shuffled order:
//! the fetch's latency (µs of wall) and the client thread's CPU per fetch,
//! median [min–max]; the per-round ratio hyper / `get` and whether `get`
//! pays ([`twin_verdict`]).
#![allow(clippy::unwrap_used)] // a bench may unwrap: a panic is its failure
#![allow(clippy::cast_precision_loss)] // figures are printed, not computed on

use std::time::Instant;

use airlock_platform_api::PlatformClient;
use airlock_test_support::bench::{answer_each_request, spread, twin_verdict};

const ANSWER: &str = r#"{"integration":"svc","connection":"c","auth_type":"bearer","fields":{"token":"tok-0123456789abcdef0123456789abcdef"}}"#;
const FETCHES: usize = 2000;

/// Nanoseconds on CPU of the calling thread.
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn platform(path: std::path::PathBuf) {
    let (ready_tx, ready) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::UnixListener::bind(&path).unwrap();
            ready_tx.send(()).unwrap();
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{ANSWER}",
                ANSWER.len()
            );
            while let Ok((s, _)) = listener.accept().await {
                let answer = answer.clone();
                tokio::spawn(async move { answer_each_request(s, answer.as_bytes()).await });
            }
        });
    });
    ready.recv().unwrap();
}

fn report(name: &str, twin: &[f64], plain: &[f64]) {
    println!(
        "{name}\n  get   {} µs\n  hyper {} µs\n  hyper/get {}",
        spread(twin, 2),
        spread(plain, 2),
        twin_verdict(twin, plain)
    );
}

fn main() {
    let rounds: usize = std::env::var("GET_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(15);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("api.sock");
    platform(path.clone());
    let token = secrecy::SecretString::from("run_bench.00".to_owned());
    let twin = PlatformClient::new(&path, token.clone());
    let plain = PlatformClient::new(&path, token).with_hyper_get();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let batch = |client: &PlatformClient| {
        let (c0, t0) = (thread_cpu_ns(), Instant::now());
        rt.block_on(async {
            for _ in 0..FETCHES {
                let c = client.credential("svc").await.unwrap();
                assert_eq!(
                    c.auth_type,
                    airlock_platform_api::connection_types::AuthType::Bearer
                );
            }
        });
        (
            t0.elapsed().as_secs_f64() * 1e6 / FETCHES as f64,
            (thread_cpu_ns() - c0) as f64 / 1e3 / FETCHES as f64,
        )
    };
    batch(&twin);
    batch(&plain);
    let (mut tw, mut tc, mut pw, mut pc) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut seed = 46u64;
    for _ in 0..rounds {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let order = if seed & 1 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for twin_first in order {
            if twin_first {
                let (w, c) = batch(&twin);
                tw.push(w);
                tc.push(c);
            } else {
                let (w, c) = batch(&plain);
                pw.push(w);
                pc.push(c);
            }
        }
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "# get: {rounds} rounds of {FETCHES} fetches, load {}",
        load.trim()
    );
    report("credential fetch latency (wall)", &tw, &pw);
    report("credential fetch, client thread CPU", &tc, &pc);
}
