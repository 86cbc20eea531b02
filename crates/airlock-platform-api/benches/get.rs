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
//! median [min–max]; the per-round ratio hyper / `get` (median [p25–p75]).
//! It pays when its gain (the median ratio less one) is at least 5 % and
//! more than the distance from the median down to the first quartile.
#![allow(clippy::unwrap_used)] // a bench may unwrap: a panic is its failure
#![allow(clippy::cast_precision_loss)] // figures are printed, not computed on

use std::time::Instant;

use airlock_platform_api::PlatformClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

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
            while let Ok((mut s, _)) = listener.accept().await {
                let answer = answer.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut tmp = [0u8; 4096];
                    loop {
                        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            buf.drain(..end + 4);
                            if s.write_all(answer.as_bytes()).await.is_err() {
                                return;
                            }
                        }
                        match s.read(&mut tmp).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&tmp[..n]),
                        }
                    }
                });
            }
        });
    });
    ready.recv().unwrap();
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn spread(v: &[f64]) -> String {
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{:.2} [{min:.2}–{max:.2}]", median(v.to_vec()))
}

fn report(name: &str, twin: &[f64], plain: &[f64]) {
    let mut ratios: Vec<f64> = plain.iter().zip(twin).map(|(p, t)| p / t).collect();
    ratios.sort_by(f64::total_cmp);
    // The quartile `num / 4` (nearest rank below).
    let q = |num: usize| ratios[(ratios.len() - 1) * num / 4];
    let gain = median(ratios.clone()) - 1.0;
    // The spread: from the median ratio down to its first quartile. The
    // gain clears it when the twin is faster in three rounds of four.
    let below = median(ratios.clone()) - q(1);
    let verdict = if gain >= 0.05 && gain > below {
        "pays"
    } else {
        "does not pay"
    };
    println!(
        "{name}\n  get   {} µs\n  hyper {} µs\n  hyper/get {:.3} [{:.3}–{:.3}]: gain {:+.1} %, spread {:.1} %: {verdict}",
        spread(twin),
        spread(plain),
        median(ratios.clone()),
        q(1),
        q(3),
        gain * 100.0,
        below * 100.0
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
                assert_eq!(c.auth_type, "bearer");
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
