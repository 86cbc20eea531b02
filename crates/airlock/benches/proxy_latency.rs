//! The forward proxy's latency, beside squid's, to a destination on this
//! host (127.0.0.1, opted in as an internal host for the sidecar), in the
//! same run, alternating sample by sample, three repetitions (a fresh
//! sidecar each, like a run's):
//!
//! - GET: a new connection to the proxy, one absolute-form GET, the answer
//!   read (the clock starts before `connect(2)`);
//! - CONNECT set-up: connect, `CONNECT`, the `200` read — and the first
//!   exchange through the tunnel (the clock starts before `connect(2)`);
//! - a burst: 100 concurrent clients, each doing GETs on new connections;
//! - CPU per GET of the proxy process (`/proc/PID/schedstat`).
//!
//! `cargo bench -p airlock --bench proxy_latency` (`PROXY_BENCH_N` samples
//! per figure, default 400; `PROXY_BENCH_REPS`, default 3). Loopback only.
#![allow(clippy::unwrap_used)] // a bench may unwrap: a panic is its failure

mod peers;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use airlock_platform::testing::TestPlatform;
use airlock_vault::ExposeSecret;
use serde_json::json;

const BODY: &[u8] = br#"{"ok":true,"items":[1,2,3],"note":"a small JSON answer"}"#;

/// A keep-alive HTTP/1.1 upstream on 127.0.0.1: a thread per connection,
/// a fixed small answer to every request.
fn upstream() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let _ = s.set_nodelay(true);
            std::thread::spawn(move || {
                let mut buf = Vec::with_capacity(4096);
                let mut tmp = [0u8; 4096];
                loop {
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut tmp) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&tmp[..n]),
                        }
                    }
                    let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
                    buf.drain(..end);
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                        BODY.len()
                    );
                    let mut out = head.into_bytes();
                    out.extend_from_slice(BODY);
                    if s.write_all(&out).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// Reads one response (head + content-length body) from `s`.
fn read_response(s: &mut TcpStream) -> u16 {
    let mut buf = Vec::with_capacity(1024);
    let mut tmp = [0u8; 2048];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let status = head
                .split_whitespace()
                .nth(1)
                .and_then(|c| c.parse().ok())
                .unwrap_or(0);
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            while buf.len() < end + 4 + len {
                let n = s.read(&mut tmp).unwrap();
                assert!(n > 0, "closed mid-body");
                buf.extend_from_slice(&tmp[..n]);
            }
            return status;
        }
        let n = s.read(&mut tmp).unwrap();
        assert!(
            n > 0,
            "closed before the answer: {:?}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&tmp[..n]);
    }
}

/// Reads a CONNECT answer's head (no body).
fn read_connect_head(s: &mut TcpStream) -> u16 {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut b).unwrap(), 1, "proxy closed during CONNECT");
        head.push(b[0]);
    }
    String::from_utf8_lossy(&head)
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

#[derive(Clone)]
struct ProxyUnderTest {
    name: &'static str,
    addr: SocketAddr,
    auth: Option<String>,
    pid: u32,
}

impl ProxyUnderTest {
    fn auth_header(&self) -> String {
        self.auth
            .as_deref()
            .map(|t| format!("Proxy-Authorization: Bearer {t}\r\n"))
            .unwrap_or_default()
    }

    /// One GET on a new connection; the time from before `connect(2)`.
    fn get(&self, up: SocketAddr) -> Duration {
        let t = Instant::now();
        let mut s = TcpStream::connect(self.addr).unwrap();
        s.set_nodelay(true).unwrap();
        write!(
            s,
            "GET http://{up}/data HTTP/1.1\r\nHost: {up}\r\n{}Connection: close\r\n\r\n",
            self.auth_header()
        )
        .unwrap();
        let status = read_response(&mut s);
        let d = t.elapsed();
        assert_eq!(status, 200, "{} GET", self.name);
        d
    }

    /// CONNECT: (set-up until the 200, set-up plus the first exchange).
    fn connect(&self, up: SocketAddr) -> (Duration, Duration) {
        let t = Instant::now();
        let mut s = TcpStream::connect(self.addr).unwrap();
        s.set_nodelay(true).unwrap();
        write!(
            s,
            "CONNECT {up} HTTP/1.1\r\nHost: {up}\r\n{}\r\n",
            self.auth_header()
        )
        .unwrap();
        let status = read_connect_head(&mut s);
        let setup = t.elapsed();
        assert_eq!(status, 200, "{} CONNECT", self.name);
        write!(s, "GET /data HTTP/1.1\r\nHost: {up}\r\n\r\n").unwrap();
        assert_eq!(read_response(&mut s), 200);
        (setup, t.elapsed())
    }
}

struct Figures {
    get50: f64,
    get99: f64,
    setup50: f64,
    first50: f64,
    burst_rps: f64,
    cpu_per_get_us: f64,
}

fn burst(p: &ProxyUnderTest, up: SocketAddr, clients: usize, each: usize) -> f64 {
    let started = Instant::now();
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let p = p.clone();
            std::thread::spawn(move || {
                for _ in 0..each {
                    p.get(up);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    (clients * each) as f64 / started.elapsed().as_secs_f64()
}

fn main() {
    let n: usize = std::env::var("PROXY_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400);
    let reps: usize = std::env::var("PROXY_BENCH_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let platform = rt.block_on(TestPlatform::start("bench-proxy"));
    let up = upstream();
    println!(
        "proxy_latency: to 127.0.0.1 (an internal host for the sidecar), {n} samples per figure, {reps} repetitions, alternating; load {}",
        peers::load()
    );
    println!("  {}", peers::describe());
    let mut all: Vec<(&'static str, Vec<Figures>)> = vec![("airlock", vec![]), ("squid", vec![])];
    for rep in 0..reps {
        // A fresh squid each repetition, as the sidecar is fresh (a run's).
        let squid = peers::squid();
        let mut cfg =
            platform.sidecar_config(json!({"tcp": "127.0.0.1:0", "proxy_tcp": "127.0.0.1:0"}));
        if let serde_json::Value::Object(o) = &mut cfg {
            o.insert("network".into(), json!({"egress": [format!("http://127.0.0.1:{}/**", up.port()), format!("https://127.0.0.1:{}/**", up.port())]}));
            o.insert(
                "egress".into(),
                json!({"allow_internal_hosts": ["127.0.0.1"]}),
            );
        }
        let sc = peers::spawn_sidecar(&cfg);
        let mut under = vec![ProxyUnderTest {
            name: "airlock",
            addr: sc.addr("proxy_tcp"),
            auth: Some(platform.sidecar_token.expose_secret().to_owned()),
            pid: sc.pid(),
        }];
        if let Some(s) = &squid {
            under.push(ProxyUnderTest {
                name: "squid",
                addr: s.addr,
                auth: None,
                pid: s.pid(),
            });
        }
        for _ in 0..50 {
            for p in &under {
                p.get(up);
                p.connect(up);
            }
        }
        let mut gets: Vec<Vec<Duration>> = vec![vec![]; under.len()];
        let mut cpu: Vec<u64> = vec![0; under.len()];
        let meters: Vec<peers::CpuMeter> =
            under.iter().map(|p| peers::CpuMeter::of(p.pid)).collect();
        for _ in 0..n {
            for (i, p) in under.iter().enumerate() {
                let c0 = meters[i].ns();
                gets[i].push(p.get(up));
                cpu[i] += meters[i].ns().saturating_sub(c0);
            }
        }
        let mut setups: Vec<Vec<Duration>> = vec![vec![]; under.len()];
        let mut firsts: Vec<Vec<Duration>> = vec![vec![]; under.len()];
        for _ in 0..n {
            for (i, p) in under.iter().enumerate() {
                let (s, f) = p.connect(up);
                setups[i].push(s);
                firsts[i].push(f);
            }
        }
        let mut rates = vec![0.0; under.len()];
        for (i, p) in under.iter().enumerate() {
            rates[i] = burst(p, up, 100, 20);
        }
        for (i, p) in under.iter().enumerate() {
            for v in [&mut gets[i], &mut setups[i], &mut firsts[i]] {
                v.sort();
            }
            let f = Figures {
                get50: peers::us(peers::percentile(&gets[i], 0.5)),
                get99: peers::us(peers::percentile(&gets[i], 0.99)),
                setup50: peers::us(peers::percentile(&setups[i], 0.5)),
                first50: peers::us(peers::percentile(&firsts[i], 0.5)),
                burst_rps: rates[i],
                cpu_per_get_us: cpu[i] as f64 / n as f64 / 1000.0,
            };
            println!(
                "  rep {rep} {:<8} GET p50 {:>7.0} µs p99 {:>7.0} µs | CONNECT set-up p50 {:>7.0} µs, +first exchange {:>7.0} µs | 100-client burst {:>6.0} req/s | CPU/GET {:>5.0} µs",
                p.name, f.get50, f.get99, f.setup50, f.first50, f.burst_rps, f.cpu_per_get_us
            );
            all.iter_mut()
                .find(|(n, _)| *n == p.name)
                .unwrap()
                .1
                .push(f);
        }
        drop(sc);
    }
    println!("summary (median [min–max] of {reps} repetitions):");
    let col = |name: &str, get: fn(&Figures) -> f64| -> Vec<f64> {
        all.iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.iter().map(get).collect())
            .unwrap_or_default()
    };
    type Row = (&'static str, fn(&Figures) -> f64, bool);
    let rows: [Row; 6] = [
        ("GET p50 (µs)", |f| f.get50, true),
        ("GET p99 (µs)", |f| f.get99, true),
        ("CONNECT set-up p50 (µs)", |f| f.setup50, true),
        ("CONNECT + first exchange p50 (µs)", |f| f.first50, true),
        ("100-client burst (req/s)", |f| f.burst_rps, false),
        ("CPU per GET (µs)", |f| f.cpu_per_get_us, true),
    ];
    for (label, get, lower_is_better) in rows {
        let a = col("airlock", get);
        let s = col("squid", get);
        let ratio = if s.is_empty() {
            "squid missing".to_owned()
        } else {
            let r = peers::median(a.clone()) / peers::median(s.clone());
            format!(
                "airlock/squid {r:.2}× ({})",
                if lower_is_better {
                    "lower is better"
                } else {
                    "higher is better"
                }
            )
        };
        println!(
            "  {label:<36} airlock {:<24} squid {:<24} {ratio}",
            peers::spread(&a, 0),
            if s.is_empty() {
                "-".into()
            } else {
                peers::spread(&s, 0)
            }
        );
    }
    drop(platform);
}
