//! CONNECT throughput: 100 MB pushed through the real `airlock sidecar`'s
//! forward proxy to a sink on 127.0.0.1, against the same transfer sent to
//! the sink directly and through the transparent plane (the runtime's
//! carrier, in this process, on the synthetic address issued for the sink's
//! name, to the same sidecar), in the same run, alternating. Then the
//! connect time of each path: connect (and CONNECT), one byte, the sink's
//! answer read; the transparent path's first bytes are a TLS ClientHello
//! naming the sink (the sidecar reads its SNI before it dials, and the
//! tunnel carries it on; a plain-HTTP head would be served as one request).
//!
//! `cargo bench -p airlock --bench connect_throughput` (env `MB` changes the
//! size, `ROUNDS` the number of alternating rounds, `CONNECTS` the connect
//! samples per path).
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use airlock_runtime::Dial;
use airlock_runtime::transparent::carry;

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

/// What the transparent path's client sends first: a TLS ClientHello
/// naming the sink, made by rustls.
fn client_hello() -> Vec<u8> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cfg = rustls::ClientConfig::builder()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(HOST).unwrap();
    let mut c = rustls::ClientConnection::new(std::sync::Arc::new(cfg), name).unwrap();
    let mut out = Vec::new();
    c.write_tls(&mut out).unwrap();
    out
}

/// How a transfer reaches the sink.
#[derive(Clone, Copy)]
enum Path {
    Direct,
    Proxy,
    Transparent,
}

/// Ends of the three paths.
struct Paths {
    sink: SocketAddr,
    proxy: SocketAddr,
    token: String,
    /// The synthetic address issued for [`HOST`], at the sink's port.
    synthetic: SocketAddr,
    /// [`client_hello`]'s.
    hello: Vec<u8>,
}

impl Paths {
    /// A connection to the sink, and what was sent on it already.
    fn open(&self, path: Path) -> (TcpStream, &[u8]) {
        match path {
            Path::Direct => (TcpStream::connect(self.sink).unwrap(), b""),
            Path::Proxy => (
                through_proxy(self.proxy, &self.token, self.sink.port()),
                b"",
            ),
            Path::Transparent => {
                let mut s = TcpStream::connect(self.synthetic).unwrap();
                s.write_all(&self.hello).unwrap();
                (s, &self.hello)
            }
        }
    }

    /// `total` bytes pushed along `path`.
    fn push(&self, path: Path, total: u64) -> Duration {
        let (s, sent) = self.open(path);
        push(s, total, sent.len() as u64)
    }

    /// Connect, one byte, the sink's answer.
    fn connect_time(&self, path: Path) -> Duration {
        let start = Instant::now();
        let (s, sent) = self.open(path);
        push(s, 1, sent.len() as u64);
        start.elapsed()
    }
}

/// Sends `total` bytes over `s`, half-closes, and checks the sink's count
/// (`already` more: sent before).
fn push(mut s: TcpStream, total: u64, already: u64) -> Duration {
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
        total + already,
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
    let connects: usize = std::env::var("CONNECTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
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
    // The runtime's carrier, as in a sandbox, on the address issued for HOST.
    let synthetic = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 18, 0, 1)), sink_addr.port());
    let carrier = rt
        .block_on(tokio::net::TcpListener::bind(synthetic))
        .unwrap();
    rt.block_on(async {
        carry::serve_on(carrier, HOST.into(), Dial::Tcp(proxy), token.clone().into());
    });
    let paths = Paths {
        sink: sink_addr,
        proxy,
        token,
        synthetic,
        hello: client_hello(),
    };
    let all = [
        ("direct", Path::Direct),
        ("through the proxy", Path::Proxy),
        ("transparent plane", Path::Transparent),
    ];

    // Warm-up (page cache, TCP windows), not counted.
    for (_, p) in all {
        paths.push(p, 10_000_000);
    }
    let mut rates = vec![Vec::new(); all.len()];
    for _ in 0..rounds {
        for (i, (_, p)) in all.iter().enumerate() {
            rates[i].push(mbps(total, paths.push(*p, total)));
        }
    }
    println!("connect_throughput: {mb} MB per transfer, {rounds} alternating rounds, loopback");
    for (i, (name, _)) in all.iter().enumerate() {
        println!(
            "  {name:<18} median {:8.1} MB/s   (rounds: {})",
            median(rates[i].clone()),
            fmt(&rates[i])
        );
    }
    let d = median(rates[0].clone());
    for (i, (name, _)) in all.iter().enumerate().skip(1) {
        println!(
            "  ratio {name}/direct: {:.1}%",
            100.0 * median(rates[i].clone()) / d
        );
    }
    let mut times = vec![Vec::new(); all.len()];
    for _ in 0..connects {
        for (i, (_, p)) in all.iter().enumerate() {
            times[i].push(paths.connect_time(*p).as_secs_f64() * 1e6);
        }
    }
    println!(
        "connect time: {connects} alternating samples per path (connect, one byte, the answer)"
    );
    for (i, (name, _)) in all.iter().enumerate() {
        let mut t = times[i].clone();
        t.sort_by(|a, b| a.total_cmp(b));
        println!(
            "  {name:<18} median {:8.0} us   p90 {:8.0} us",
            t[t.len() / 2],
            t[t.len() * 9 / 10]
        );
    }
    drop(sc);
    drop(platform);
}

fn fmt(v: &[f64]) -> String {
    v.iter()
        .map(|x| format!("{x:.0}"))
        .collect::<Vec<_>>()
        .join(", ")
}
