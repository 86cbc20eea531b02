//! Egress guard figures, each beside its baseline measured in the same run.
//!
//! `cargo bench -p airlock-egress --bench egress`
//!
//! 1. Policy decision for one URL against a 20-entry `authorized_uris` list
//!    (target ≤ 1 µs median): the synchronous decision on a parsed target, and
//!    parse + decide from the raw string.
//! 2. The address block table, judged once per resolved answer.
//! 3. Keep-alive GET to a loopback server through the guarded client, beside
//!    a plain hyper client on the same server (target: added median ≤ 50 µs).
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use std::hint::black_box;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_egress::{
    AuthorizedUris, CallRules, ClientConfig, EgressPolicy, Guard, GuardedClient, Intent,
    OutboundRequest, StaticResolver, Target, addr,
};

const GET: Intent<'static> = Intent::Request(&http::Method::GET);
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

fn percentile(sorted: &[f64], p: f64) -> f64 {
    // A rank in 0..len for p in [0, 1]: neither negative nor past usize.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let rank = ((sorted.len() as f64 - 1.0) * p.clamp(0.0, 1.0)).round() as usize;
    sorted[rank]
}

/// Per-call nanoseconds: `samples` samples of `batch` calls each.
fn measure(samples: usize, batch: usize, mut f: impl FnMut()) -> Vec<f64> {
    for _ in 0..batch {
        f();
    }
    let mut out = Vec::with_capacity(samples);
    for _ in 0..samples {
        let t = Instant::now();
        for _ in 0..batch {
            f();
        }
        out.push(t.elapsed().as_nanos() as f64 / batch as f64);
    }
    out.sort_by(f64::total_cmp);
    out
}

fn report(name: &str, ns: &[f64]) {
    println!(
        "{name:<48} median {:>9.1} ns   p99 {:>9.1} ns",
        percentile(ns, 0.5),
        percentile(ns, 0.99)
    );
}

fn twenty_entries() -> Vec<String> {
    let mut v: Vec<String> = (0..17)
        .map(|i| format!("https://api{i}.service{i}.com/v{i}/**"))
        .collect();
    v.push("https://*.amazonaws.com/**".into());
    v.push("https://uploads.github.com/repos/*/releases/**".into());
    v.push("https://api.github.com/repos/**".into());
    v
}

fn policy_bench() {
    let list = AuthorizedUris::parse(&twenty_entries());
    assert_eq!(list.entries().len(), 20);
    let policy = EgressPolicy::new();
    let rules = CallRules {
        authorized: &list,
        allow_all_uris: false,
        credentialed: true,
    };
    let url = "https://api.github.com/repos/airlock/airlock/issues?state=open&per_page=50";
    let target = Target::parse(url).unwrap();
    let miss = Target::parse("https://evil.example.com/exfil?token=x").unwrap();
    assert!(policy.check(&target, GET, &rules).is_ok());
    assert!(policy.check(&miss, GET, &rules).is_err());
    let hit = measure(300, 2000, || {
        black_box(policy.check(black_box(&target), GET, &rules).is_ok());
    });
    report("policy decision, 20 entries, allowed (last entry)", &hit);
    let refused = measure(300, 2000, || {
        black_box(policy.check(black_box(&miss), GET, &rules).is_ok());
    });
    report("policy decision, 20 entries, refused", &refused);
    let parsed = measure(300, 2000, || {
        let t = Target::parse(black_box(url)).unwrap();
        black_box(policy.check(&t, GET, &rules).is_ok());
    });
    report("parse + canonicalise + decide, 20 entries", &parsed);
}

/// The block table, judged per resolved answer: a public IPv4 and IPv6
/// answer (the full scan) and a blocked one.
fn address_table_bench() {
    let public: [IpAddr; 2] = [
        "93.184.216.34".parse().unwrap(),
        "2606:4700:4700::1111".parse().unwrap(),
    ];
    let blocked: IpAddr = "fe80::1".parse().unwrap();
    assert!(public.iter().all(|ip| !addr::is_blocked(*ip)));
    assert!(addr::is_blocked(blocked));
    let pass = measure(300, 2000, || {
        for ip in &public {
            black_box(addr::is_blocked(black_box(*ip)));
        }
    });
    report("address table, public IPv4 + IPv6 (both pass)", &pass);
    let refused = measure(300, 2000, || {
        black_box(addr::is_blocked(black_box(blocked)));
    });
    report("address table, blocked IPv6", &refused);
}

async fn loopback_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            s.set_nodelay(true).unwrap();
            tokio::spawn(async move {
                let svc = service_fn(|_req| async {
                    Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(
                        Bytes::from_static(b"ok"),
                    )))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    addr
}

fn client_bench() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let addr = rt.block_on(loopback_server());
    // Plain hyper, one kept-alive connection.
    let mut sender = rt.block_on(async {
        let s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.set_nodelay(true).unwrap();
        let (sender, conn) =
            hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(s))
                .await
                .unwrap();
        tokio::spawn(conn);
        sender
    });
    let host = format!("bench.internal:{}", addr.port());
    // The guarded client, reaching the loopback server through the
    // operator's internal-host opt-in with a static resolver.
    let mut r = StaticResolver::new();
    r.insert("bench.internal", [addr.ip()]);
    let mut p = EgressPolicy::new();
    p.allow_internal_hosts(["bench.internal"]);
    let client = GuardedClient::new(Guard::new(p, Arc::new(r)), ClientConfig::default()).unwrap();
    let list = AuthorizedUris::parse(&[format!("http://bench.internal:{}/**", addr.port())]);
    let url = format!("http://bench.internal:{}/v1/items?x=1", addr.port());
    let rules = CallRules {
        authorized: &list,
        allow_all_uris: false,
        credentialed: true,
    };

    let mut plain_once = || {
        rt.block_on(async {
            let req = hyper::Request::get("/v1/items?x=1")
                .header("host", &host)
                .body(Full::new(Bytes::new()))
                .unwrap();
            sender.ready().await.unwrap();
            let resp = sender.send_request(req).await.unwrap();
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(&body[..], b"ok");
        })
    };
    let guarded_once = || {
        rt.block_on(async {
            let resp = client
                .send(OutboundRequest::get(url.as_str()), &rules)
                .await
                .unwrap();
            assert_eq!(&resp.body[..], b"ok");
        })
    };
    // Interleave rounds so drift in machine load hits both alike.
    let (mut plain, mut guarded) = (Vec::new(), Vec::new());
    for _ in 0..10 {
        plain.extend(measure(200, 1, &mut plain_once));
        guarded.extend(measure(200, 1, guarded_once));
    }
    plain.sort_by(f64::total_cmp);
    guarded.sort_by(f64::total_cmp);
    report("keep-alive GET, plain hyper (baseline)", &plain);
    report("keep-alive GET, guarded client", &guarded);
    println!(
        "{:<48} median {:>9.1} ns   p99 {:>9.1} ns",
        "added by the guard",
        percentile(&guarded, 0.5) - percentile(&plain, 0.5),
        percentile(&guarded, 0.99) - percentile(&plain, 0.99)
    );
    let _ = Duration::ZERO;
}

fn main() {
    // `cargo test --benches` runs bench binaries with `--bench` absent; keep that quick.
    if !std::env::args().any(|a| a == "--bench") {
        println!("egress bench: run with `cargo bench -p airlock-egress --bench egress`");
        return;
    }
    policy_bench();
    address_table_bench();
    client_bench();
}
