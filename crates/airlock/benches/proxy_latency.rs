//! The forward proxy's latency, beside squid's, in the same run,
//! alternating sample by sample, three repetitions (a fresh sidecar each,
//! like a run's), to two destinations in turn:
//!
//! - 127.0.0.1, a destination on this host (opted in as an internal host
//!   for the sidecar);
//! - 10.231.N.2, an address in a network namespace the bench creates and
//!   joins to this one by a veth pair (opted in likewise, as a private
//!   address): an upstream on another host, as far as either proxy can
//!   tell. This needs root; without it the bench says so and measures the
//!   first destination only. Before any packet is sent the bench checks
//!   that the kernel routes the address through its own veth.
//!
//! For each destination:
//!
//! - GET: a new connection to the proxy, one absolute-form GET, the answer
//!   read (the clock starts before `connect(2)`);
//! - CONNECT set-up: connect, `CONNECT`, the `200` read — and the first
//!   exchange through the tunnel (the clock starts before `connect(2)`);
//! - a burst: 100 concurrent clients, each doing GETs on new connections;
//! - CPU per GET of the proxy process (`/proc/PID/schedstat`).
//!
//! `cargo bench -p airlock --bench proxy_latency` (`PROXY_BENCH_N` samples
//! per figure, default 400; `PROXY_BENCH_REPS`, default 3). Traffic goes to
//! loopback and to the bench's own namespace only.
#![allow(clippy::unwrap_used)] // a bench may unwrap: a panic is its failure

mod peers;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::process::Command;
use std::time::{Duration, Instant};

use airlock_platform::testing::TestPlatform;
use airlock_vault::ExposeSecret;

const BODY: &[u8] = br#"{"ok":true,"items":[1,2,3],"note":"a small JSON answer"}"#;

/// A keep-alive HTTP/1.1 upstream on `l`: a thread per connection, a fixed
/// small answer to every request.
fn upstream(l: TcpListener) -> SocketAddr {
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

/// Runs `ip ARGS`; its stdout, or what it said on failure.
fn ip(args: &[&str]) -> Result<String, String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run `ip`: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A network namespace of the bench's own, joined to this one by a veth
/// pair (`here` on this side, `there` inside, a /30 between them).
/// Deleted with its veth pair on drop.
struct VethNamespace {
    name: String,
    host_if: String,
    there: Ipv4Addr,
}

impl VethNamespace {
    fn create() -> Result<VethNamespace, String> {
        if !rustix::process::geteuid().is_root() {
            return Err("creating a namespace and a veth pair needs root".into());
        }
        Self::remove_stale();
        let pid = std::process::id();
        let net = u8::try_from(pid % 250).unwrap_or(0) + 1;
        let here = Ipv4Addr::new(10, 231, net, 1);
        let there = Ipv4Addr::new(10, 231, net, 2);
        let (host_if, ns_if) = (format!("alb{pid}h"), format!("alb{pid}n"));
        let ns = VethNamespace {
            name: format!("airlock-bench-{pid}"),
            host_if: host_if.clone(),
            there,
        };
        ip(&["netns", "add", &ns.name])?;
        ip(&[
            "link", "add", &host_if, "type", "veth", "peer", "name", &ns_if, "netns", &ns.name,
        ])?;
        ip(&["addr", "add", &format!("{here}/30"), "dev", &host_if])?;
        ip(&["link", "set", &host_if, "up"])?;
        ip(&[
            "-n",
            &ns.name,
            "addr",
            "add",
            &format!("{there}/30"),
            "dev",
            &ns_if,
        ])?;
        ip(&["-n", &ns.name, "link", "set", &ns_if, "up"])?;
        // Nothing is sent unless the kernel sends `there` through our veth.
        let route = ip(&["-4", "route", "get", &there.to_string()])?;
        let words: Vec<&str> = route.split_whitespace().collect();
        if !words.windows(2).any(|w| w == ["dev", host_if.as_str()]) {
            return Err(format!(
                "{there} is not routed through {host_if}: {}",
                route.trim()
            ));
        }
        Ok(ns)
    }

    /// Removes what an earlier run that did not get to its drop (an
    /// interrupted bench: Ctrl-C, a kill) left: the namespace and veth of a
    /// bench whose process is gone. A stale pair could otherwise hold the
    /// address a later run routes to (which then refuses to measure).
    fn remove_stale() {
        let Ok(list) = ip(&["netns", "list"]) else {
            return;
        };
        for name in list.lines().filter_map(|l| l.split_whitespace().next()) {
            let Some(pid) = name
                .strip_prefix("airlock-bench-")
                .and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            // A bench still running (or the pid reused) is not ours to touch;
            // a killed one whose parent has not reaped it yet is gone.
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok();
            let zombie = state
                .as_deref()
                .and_then(|st| st.rsplit_once(')'))
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
            if state.is_some() && !zombie {
                continue;
            }
            let _ = ip(&["link", "del", &format!("alb{pid}h")]);
            match ip(&["netns", "del", name]) {
                Ok(_) => eprintln!("proxy_latency: removed {name}, left by an interrupted run"),
                Err(e) => eprintln!("proxy_latency: {e}"),
            }
        }
    }

    /// A listener on `there`, port chosen by the kernel, bound from a thread
    /// that joined the namespace (the socket stays in it; the thread ends).
    fn listen(&self) -> Result<TcpListener, String> {
        let path = format!("/run/netns/{}", self.name);
        let there = self.there;
        std::thread::spawn(move || -> std::io::Result<TcpListener> {
            let f = std::fs::File::open(&path)?;
            rustix::thread::move_into_link_name_space(
                f.as_fd(),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )?;
            TcpListener::bind((there, 0))
        })
        .join()
        .map_err(|_| "the namespace thread panicked".to_owned())?
        .map_err(|e| format!("cannot listen in the namespace: {e}"))
    }
}

impl Drop for VethNamespace {
    fn drop(&mut self) {
        // The pair first, at once: a namespace whose sockets are still open
        // outlives its name, and its veth with it.
        let pair = ip(&["link", "del", &self.host_if]);
        let name = ip(&["netns", "del", &self.name]);
        for e in [pair.err(), name.err()].into_iter().flatten() {
            eprintln!("proxy_latency: {e}");
        }
    }
}

/// Waits until `up` accepts a connection (the veth's carrier is up).
fn wait_reachable(up: SocketAddr) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match TcpStream::connect_timeout(&up, Duration::from_millis(500)) {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() > deadline => {
                return Err(format!("{up} is not reachable over the veth: {e}"));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Where the proxies send their requests.
struct Destination {
    label: String,
    up: SocketAddr,
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
    println!(
        "proxy_latency: {n} samples per figure, {reps} repetitions, alternating; load {}",
        peers::load()
    );
    println!("  {}", peers::describe());
    let mut destinations = vec![Destination {
        label: "127.0.0.1 (this host, an internal host for the sidecar)".into(),
        up: upstream(TcpListener::bind("127.0.0.1:0").unwrap()),
    }];
    // Kept until the end: dropping it deletes the namespace.
    let veth = VethNamespace::create().and_then(|ns| {
        let up = upstream(ns.listen()?);
        wait_reachable(up)?;
        Ok((ns, up))
    });
    match &veth {
        Ok((_, up)) => destinations.push(Destination {
            label: format!(
                "{} (another namespace over a veth, a private address opted in for the sidecar)",
                up.ip()
            ),
            up: *up,
        }),
        Err(e) => println!(
            "  !! NOT MEASURED: the destination in another namespace over a veth ({e}); run the bench as root"
        ),
    }
    for dest in &destinations {
        println!("to {}:", dest.label);
        measure(&platform, dest, n, reps);
    }
    drop(veth);
    drop(platform);
}

/// The figures of both proxies to `dest`, per repetition and summed up.
fn measure(platform: &TestPlatform, dest: &Destination, n: usize, reps: usize) {
    let mut all: Vec<(&'static str, Vec<Figures>)> = vec![("airlock", vec![]), ("squid", vec![])];
    for rep in 0..reps {
        // A fresh squid each repetition, as the sidecar is fresh (a run's).
        let squid = peers::squid();
        let (host, port) = (dest.up.ip(), dest.up.port());
        let cfg = platform
            .sidecar_config()
            .tcp()
            .proxy_tcp()
            .network_allow([
                format!("http://{host}:{port}/**"),
                format!("https://{host}:{port}/**"),
            ])
            .allow_internal_hosts([host])
            .build();
        let sc = peers::spawn_sidecar(cfg);
        let mut under = vec![ProxyUnderTest {
            name: "airlock",
            addr: sc.proxy_tcp(),
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
                p.get(dest.up);
                p.connect(dest.up);
            }
        }
        let mut gets: Vec<Vec<Duration>> = vec![vec![]; under.len()];
        let mut cpu: Vec<u64> = vec![0; under.len()];
        let meters: Vec<peers::CpuMeter> =
            under.iter().map(|p| peers::CpuMeter::of(p.pid)).collect();
        for _ in 0..n {
            for (i, p) in under.iter().enumerate() {
                let c0 = meters[i].ns();
                gets[i].push(p.get(dest.up));
                cpu[i] += meters[i].ns().saturating_sub(c0);
            }
        }
        let mut setups: Vec<Vec<Duration>> = vec![vec![]; under.len()];
        let mut firsts: Vec<Vec<Duration>> = vec![vec![]; under.len()];
        for _ in 0..n {
            for (i, p) in under.iter().enumerate() {
                let (s, f) = p.connect(dest.up);
                setups[i].push(s);
                firsts[i].push(f);
            }
        }
        let mut rates = vec![0.0; under.len()];
        for (i, p) in under.iter().enumerate() {
            rates[i] = burst(p, dest.up, 100, 20);
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
    println!(
        "summary, to {} (median [min–max] of {reps} repetitions):",
        dest.label
    );
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
}
