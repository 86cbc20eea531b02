//! CONNECT throughput: 100 MB pushed through the real `airlock sidecar`'s
//! forward proxy to a sink on 127.0.0.1, against the same transfer sent to
//! the sink directly, in the same run.
//!
//! `cargo bench -p airlock --bench connect_throughput` (env `MB` changes the
//! size, `ROUNDS` the number of alternating rounds).
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use airlock_platform::testing::TestPlatform;
use airlock_test_support::sidecar::SidecarProcess;
use airlock_vault::ExposeSecret;

const AIRLOCK: &str = env!("CARGO_BIN_EXE_airlock");
const HOST: &str = "sink.internal.test";
const CHUNK: usize = 64 * 1024;

/// Reads every byte of each connection, then answers with the count (8 bytes).
fn sink() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            std::thread::spawn(move || {
                let mut buf = vec![0u8; CHUNK];
                let mut n = 0u64;
                loop {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(k) => n += k as u64,
                    }
                }
                let _ = s.write_all(&n.to_be_bytes());
            });
        }
    });
    addr
}

/// Sends `total` bytes over `s`, half-closes, and checks the sink's count.
fn push(mut s: TcpStream, total: u64) -> Duration {
    s.set_nodelay(true).unwrap();
    let chunk = vec![0x5au8; CHUNK];
    let start = Instant::now();
    let mut sent = 0u64;
    while sent < total {
        let n = usize::try_from((total - sent).min(CHUNK as u64)).unwrap_or(CHUNK);
        s.write_all(&chunk[..n]).unwrap();
        sent += n as u64;
    }
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut count = [0u8; 8];
    s.read_exact(&mut count).unwrap();
    let elapsed = start.elapsed();
    assert_eq!(
        u64::from_be_bytes(count),
        total,
        "the sink did not receive every byte"
    );
    elapsed
}

fn through_proxy(proxy: SocketAddr, token: &str, port: u16) -> TcpStream {
    let mut s = TcpStream::connect(proxy).unwrap();
    write!(s, "CONNECT {HOST}:{port} HTTP/1.1\r\nHost: {HOST}:{port}\r\nProxy-Authorization: Bearer {token}\r\n\r\n").unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut b).unwrap(), 1, "proxy closed during CONNECT");
        head.push(b[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    s
}

fn mbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / 1e6 / d.as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let mb: u64 = std::env::var("MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let rounds: usize = std::env::var("ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        // Single loopback rounds range from ~0.5 to ~3.9 GB/s on a shared
        // two-core machine; nine alternating rounds give a stable median.
        .unwrap_or(9);
    let total = mb * 1_000_000;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let platform = rt.block_on(TestPlatform::start("bench"));
    let sink_addr = sink();
    let cfg = platform
        .sidecar_config()
        .tcp()
        .proxy_tcp()
        .network_allow([format!("https://{HOST}:{}/**", sink_addr.port())])
        .loopback_host(HOST)
        .build();
    let sc = SidecarProcess::spawn(std::path::Path::new(AIRLOCK), &cfg, "warn");
    let proxy = sc.proxy_tcp();
    let token = platform.sidecar_token.expose_secret().to_owned();

    // Warm-up (page cache, TCP windows), not counted.
    push(TcpStream::connect(sink_addr).unwrap(), 10_000_000);
    push(through_proxy(proxy, &token, sink_addr.port()), 10_000_000);

    let (mut direct, mut proxied) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        direct.push(mbps(
            total,
            push(TcpStream::connect(sink_addr).unwrap(), total),
        ));
        proxied.push(mbps(
            total,
            push(through_proxy(proxy, &token, sink_addr.port()), total),
        ));
    }
    let (d, p) = (median(direct.clone()), median(proxied.clone()));
    println!("connect_throughput: {mb} MB per transfer, {rounds} alternating rounds, loopback");
    println!(
        "  direct            median {d:8.1} MB/s   (rounds: {})",
        fmt(&direct)
    );
    println!(
        "  through the proxy median {p:8.1} MB/s   (rounds: {})",
        fmt(&proxied)
    );
    println!(
        "  ratio proxy/direct: {:.1}% (target >= 80%)",
        100.0 * p / d
    );
    drop(sc);
    drop(platform);
}

fn fmt(v: &[f64]) -> String {
    v.iter()
        .map(|x| format!("{x:.0}"))
        .collect::<Vec<_>>()
        .join(", ")
}
