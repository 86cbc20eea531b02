//! What the benches put beside their figures, and the real peers they
//! start on loopback: `nginx` (one keep-alive reverse-proxy hop) and `squid`
//! (a forward proxy), from Debian's packages (`.ci/run` installs them). A
//! missing peer is said loudly and its figures are left out (a bench, unlike
//! a test, does not fail for it); nothing else is started.
//!
//! Also percentiles, CPU time of a process tree (from
//! `/proc/PID/task/*/schedstat`, nanoseconds: [`CpuMeter`]), memory, the
//! machine's load and its hand-off floor.
#![allow(clippy::unwrap_used)] // bench support: a panic is the bench's failure

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// p50 and p99 of `v`, in µs.
pub fn p50_99(mut v: Vec<Duration>) -> (f64, f64) {
    v.sort();
    (us(percentile(&v, 0.5)), us(percentile(&v, 0.99)))
}

/// A keep-alive HTTP/1.1 connection to `addr` (TCP_NODELAY).
pub async fn client(
    addr: SocketAddr,
) -> hyper::client::conn::http1::SendRequest<http_body_util::Full<bytes::Bytes>> {
    let s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let _ = s.set_nodelay(true);
    let (sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(s))
        .await
        .expect("handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    sender
}

/// The machine's load average, for the header of every bench.
pub fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    // A rank in 0..len for p in [0, 1].
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// p50, p90, p99 of `v` (nearest rank).
pub fn pcts(v: &[Duration]) -> [Duration; 3] {
    let mut v = v.to_vec();
    v.sort();
    [0.50, 0.90, 0.99].map(|p| percentile(&v, p))
}

/// `d` in milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

pub fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// `median [min–max]` of repetitions.
pub fn spread(v: &[f64], digits: usize) -> String {
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!(
        "{:.d$} [{:.d$}–{:.d$}]",
        median(v.to_vec()),
        min,
        max,
        d = digits
    )
}

/// Answers each request head read from a kept-alive connection with `answer`
/// (a whole HTTP answer), until the peer closes it.
pub async fn answer_each_request<S>(mut s: S, answer: &[u8])
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = Vec::new();
    let mut tmp = [0u8; 8192];
    loop {
        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            buf.drain(..end + 4);
            if s.write_all(answer).await.is_err() {
                return;
            }
        }
        match s.read(&mut tmp).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&tmp[..n]),
        }
    }
}

/// How a fast path compares with the plain path it stands in for, from the
/// figures of rounds that ran both (lower is better; `twin[i]` and
/// `plain[i]` from the same round): the per-round ratio plain / twin,
/// median [first–third quartile] (min, max), the gain (the median ratio
/// less one), the spread (from the median down to the first quartile), and
/// whether the twin pays: a gain of at least 5 % and more than the spread,
/// so the twin is faster in three rounds of four (issue 46 item 5).
pub fn twin_verdict(twin: &[f64], plain: &[f64]) -> String {
    let mut ratios: Vec<f64> = plain.iter().zip(twin).map(|(p, t)| p / t).collect();
    if ratios.is_empty() {
        return "no rounds".into();
    }
    ratios.sort_by(f64::total_cmp);
    // The quartile `num / 4` (nearest rank below).
    let q = |num: usize| ratios[(ratios.len() - 1) * num / 4];
    let mid = median(ratios.clone());
    let (gain, below) = (mid - 1.0, mid - q(1));
    let verdict = if gain >= 0.05 && gain > below {
        "pays"
    } else {
        "does not pay"
    };
    format!(
        "{mid:.3} [{:.3}–{:.3}] (min {:.3}, max {:.3}): gain {:+.1} %, spread {:.1} %: {verdict}",
        q(1),
        q(3),
        ratios[0],
        ratios[ratios.len() - 1],
        gain * 100.0,
        below * 100.0,
    )
}

/// CPU time of a process tree, cheap enough to read around every request:
/// the tree's threads are listed once (a scan of all of `/proc`, which costs
/// milliseconds and would load the machine under test if done per request)
/// and listed again only when one of them is gone.
pub struct CpuMeter {
    pid: u32,
    files: std::cell::RefCell<Vec<PathBuf>>,
}

impl CpuMeter {
    pub fn of(pid: u32) -> CpuMeter {
        CpuMeter {
            pid,
            files: std::cell::RefCell::new(Self::list(pid)),
        }
    }

    fn list(pid: u32) -> Vec<PathBuf> {
        tree(pid)
            .into_iter()
            .flat_map(|p| {
                std::fs::read_dir(format!("/proc/{p}/task"))
                    .map(|r| r.flatten().map(|t| t.path().join("schedstat")).collect())
                    .unwrap_or_else(|_| Vec::new())
            })
            .collect()
    }

    /// Nanoseconds on CPU of the tree's threads so far.
    pub fn ns(&self) -> u64 {
        let read = |files: &[PathBuf]| -> Option<u64> {
            files.iter().try_fold(0u64, |total, f| {
                let s = std::fs::read_to_string(f).ok()?;
                Some(total + s.split_whitespace().next()?.parse::<u64>().ok()?)
            })
        };
        if let Some(n) = read(&self.files.borrow()) {
            return n;
        }
        let fresh = Self::list(self.pid);
        let n = read(&fresh).unwrap_or(0);
        *self.files.borrow_mut() = fresh;
        n
    }
}

/// A small deterministic generator (xorshift64*), for the order in which a
/// bench's paths take their turn within a round: a fixed order would lock
/// each path to the same phase of the sidecar's periodic work (its event
/// batches), favouring one path and burdening another.
pub struct Shuffle(u64);

impl Shuffle {
    pub fn new(seed: u64) -> Shuffle {
        Shuffle(seed | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// `0..n` in a fresh random order (Fisher–Yates).
    pub fn order(&mut self, n: usize) -> Vec<usize> {
        let mut v: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            let j = usize::try_from(self.next() % (i as u64 + 1)).unwrap_or(0);
            v.swap(i, j);
        }
        v
    }
}

/// `pid` and its descendants.
pub fn tree(pid: u32) -> Vec<u32> {
    let mut all = vec![pid];
    let mut i = 0;
    let procs: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .map(|r| {
            r.flatten()
                .filter_map(|e| {
                    let p = e.file_name().to_string_lossy().parse::<u32>().ok()?;
                    let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
                    let ppid = stat
                        .rsplit_once(')')?
                        .1
                        .split_whitespace()
                        .nth(1)?
                        .parse()
                        .ok()?;
                    Some((p, ppid))
                })
                .collect()
        })
        .unwrap_or_default();
    while i < all.len() {
        let parent = all[i];
        all.extend(
            procs
                .iter()
                .filter(|(_, pp)| *pp == parent)
                .map(|(p, _)| *p),
        );
        i += 1;
    }
    all
}

/// A `/proc/PID/status` field in KiB, summed over the tree (`VmRSS:`, `VmHWM:`).
pub fn kib(pid: u32, field: &str) -> u64 {
    tree(pid)
        .iter()
        .map(|p| {
            std::fs::read_to_string(format!("/proc/{p}/status"))
                .unwrap_or_default()
                .lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        })
        .sum()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
}

fn wait_listening(addr: SocketAddr, child: &mut Child, what: &str) -> bool {
    let until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < until {
        if TcpStream::connect(addr).is_ok() {
            return true;
        }
        if let Ok(Some(status)) = child.try_wait() {
            eprintln!("!!! {what} exited before it listened ({status})");
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("!!! {what} did not listen on {addr} within 20 s");
    false
}

/// A peer server process, stopped when dropped.
pub struct Peer {
    pub name: &'static str,
    pub child: Child,
    pub addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Peer {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The command that starts peer `bin`, which dies with the bench: run
/// through util-linux's `setpriv --pdeathsig KILL` (the signal survives its
/// exec of `bin`, and the pid stays the peer's, whose CPU is read by pid), so
/// a bench killed outright (a timeout, ^C twice, `kill -9`) leaves no nginx
/// or squid behind holding a port. Peers are started from the bench's main
/// thread, which lives as long as the bench (the signal follows the thread
/// that started the child, not the process). Without `setpriv`, `bin`
/// itself, and a warning.
fn peer_command(bin: &Path) -> Command {
    match find("setpriv") {
        Some(setpriv) => {
            let mut c = Command::new(setpriv);
            c.args(["--pdeathsig", "KILL", "--"]).arg(bin);
            c
        }
        None => {
            eprintln!(
                "!!! setpriv (util-linux) is missing: {} outlives this bench if the bench is killed",
                bin.display()
            );
            Command::new(bin)
        }
    }
}

fn find(bin: &str) -> Option<PathBuf> {
    ["/usr/sbin", "/usr/bin", "/sbin", "/bin", "/usr/local/sbin"]
        .iter()
        .map(|d| Path::new(d).join(bin))
        .find(|p| p.exists())
}

fn missing(name: &str) {
    eprintln!();
    eprintln!("!!! ------------------------------------------------------------------");
    eprintln!("!!! PEER MISSING: `{name}` is not installed: its figures are left out.");
    eprintln!("!!! apt-get install -y --no-install-recommends {name}   (.ci/run does)");
    eprintln!("!!! ------------------------------------------------------------------");
    eprintln!();
}

/// nginx as one keep-alive reverse-proxy hop to `upstream` (one process, no
/// master: its CPU is that process's), unbuffered both ways: an answer and
/// a request body pass as they come (a body held in memory, never in a temp
/// file), as the sidecar passes them.
pub fn nginx(upstream: SocketAddr) -> Option<Peer> {
    let Some(bin) = find("nginx") else {
        missing("nginx");
        return None;
    };
    let dir = tempfile::tempdir().ok()?;
    let port = free_port();
    let d = dir.path().display();
    let conf = format!(
        "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
         events {{ worker_connections 1024; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n\
           fastcgi_temp_path {d}/fcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
           keepalive_requests 1000000;\n\
           upstream up {{ server {upstream}; keepalive 64; }}\n\
           server {{\n    listen 127.0.0.1:{port};\n    location / {{\n      proxy_pass http://up;\n\
               proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n      proxy_buffering off;\n\
               proxy_request_buffering off;\n      client_body_buffer_size 1m;\n    }}\n  }}\n}}\n"
    );
    let conf_path = dir.path().join("nginx.conf");
    std::fs::write(&conf_path, conf).ok()?;
    let mut child = peer_command(&bin)
        .arg("-c")
        .arg(&conf_path)
        .arg("-p")
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    if !wait_listening(addr, &mut child, "nginx") {
        let _ = child.kill();
        return None;
    }
    Some(Peer {
        name: "nginx",
        child,
        addr,
        _dir: dir,
    })
}

/// squid as a forward proxy on loopback: no cache, no logs, any destination
/// (the bench sends only to 127.0.0.1), CONNECT to any port.
pub fn squid() -> Option<Peer> {
    let Some(bin) = find("squid") else {
        missing("squid");
        return None;
    };
    let dir = tempfile::tempdir().ok()?;
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777));
    }
    let port = free_port();
    let d = dir.path().display();
    let conf = format!(
        "http_port 127.0.0.1:{port}\nhttp_access allow all\n\
         cache deny all\ncache_mem 8 MB\naccess_log none\ncache_store_log none\ncache_log {d}/cache.log\n\
         pid_filename none\ncoredump_dir {d}\nshutdown_lifetime 0 seconds\nvia off\nforwarded_for delete\n\
         dns_nameservers 127.0.0.1\nhosts_file none\nclient_persistent_connections on\nserver_persistent_connections on\n\
         max_filedescriptors 4096\nworkers 1\n"
    );
    let conf_path = dir.path().join("squid.conf");
    std::fs::write(&conf_path, conf).ok()?;
    let mut child = peer_command(&bin)
        .args(["-N", "-f"])
        .arg(&conf_path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    if !wait_listening(addr, &mut child, "squid") {
        let _ = child.kill();
        eprintln!(
            "!!! squid's log: {}",
            std::fs::read_to_string(dir.path().join("cache.log")).unwrap_or_default()
        );
        return None;
    }
    Some(Peer {
        name: "squid",
        child,
        addr,
        _dir: dir,
    })
}

/// This machine's floor for one hand-off between processes: the round trip
/// of one byte between two threads over a unix socket pair, each blocked in
/// `read(2)` until the other writes (p50, p99 in µs). Each side sleeps and is
/// woken once per trip, as a proxy and its peer are. An nginx hop adds two
/// such hand-offs to a request (client → nginx → upstream and back); a call
/// that also fetches a credential from the platform adds four.
pub fn handoff_rtt(n: usize) -> (f64, f64) {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;
    let (mut a, mut b) = UnixStream::pair().expect("socketpair");
    let echo = std::thread::spawn(move || {
        let mut byte = [0u8; 1];
        while matches!(b.read(&mut byte), Ok(1)) {
            if b.write_all(&byte).is_err() {
                break;
            }
        }
    });
    let mut t = Vec::with_capacity(n);
    let mut byte = [0u8; 1];
    for _ in 0..n {
        let start = Instant::now();
        a.write_all(b"x").expect("hand-off write");
        a.read_exact(&mut byte).expect("hand-off read");
        t.push(start.elapsed());
    }
    drop(a);
    let _ = echo.join();
    p50_99(t)
}

/// The line every latency bench prints under its figures.
pub fn print_handoff_floor() {
    let (p50, p99) = handoff_rtt(20_000);
    println!(
        "  this machine's hand-off floor (one byte there and back between two threads over a unix socket): p50 {p50:.1} µs p99 {p99:.1} µs"
    );
}
