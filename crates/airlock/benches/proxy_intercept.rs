//! The intercepting proxy (`inject = "proxy"`) beside the plain CONNECT
//! tunnel of the same sidecar build, in the same run, to one HTTPS upstream
//! on loopback: per-request latency on an open tunnel (the plain tunnel,
//! interception without a credential, interception with the placeholder
//! replaced, interception because an L7 network rule must see each request),
//! tunnel set-up (CONNECT, TLS, first answer) and the throughput of a 100 MB
//! download through each. Alternating, three repetitions. The
//! platform runs on a runtime of its own, as a deployed platform is a
//! process of its own (`peers::Platform`).
//!
//! Run: `cargo bench -p airlock --bench proxy_intercept` (`INTERCEPT_BENCH_N`
//! sets the request count, default 1000; `INTERCEPT_BENCH_MB` the download,
//! default 100). Loopback traffic only.
#![allow(clippy::unwrap_used)] // a bench may unwrap: a panic is its failure

mod peers;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use airlock_store::AuthType;
use airlock_test_support::tls;
use airlock_vault::ExposeSecret;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use peers::p50_99;

const UP_IP: &str = "127.0.0.2";
const CREDENTIAL: &str = "bench-intercept-credential";
const PLACEHOLDER: &str = "AIRLOCK_PLACEHOLDER_SVC";
const SMALL: &str =
    r#"{"ok":true,"items":[1,2,3],"note":"a small JSON answer like most API calls get"}"#;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The upstream: `/small` (a small JSON) and `/big?mb=N` (N MiB, streamed).
async fn upstream(ca: &tls::TestCa) -> SocketAddr {
    let acceptor = tls::acceptor_for(&[UP_IP], ca);
    let l = TcpListener::bind(format!("{UP_IP}:0")).await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let _ = s.set_nodelay(true);
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(s).await else {
                    return;
                };
                let svc = hyper::service::service_fn(
                    |req: hyper::Request<hyper::body::Incoming>| async move {
                        let body: http_body_util::combinators::BoxBody<Bytes, Infallible> =
                            if req.uri().path() == "/big" {
                                let mb: usize = req
                                    .uri()
                                    .query()
                                    .and_then(|q| q.strip_prefix("mb="))
                                    .and_then(|v| v.parse().ok())
                                    .unwrap_or(1);
                                let chunk = Bytes::from(vec![0x5au8; 1 << 20]);
                                let frames =
                                    futures_util::stream::iter((0..mb).map(move |_| {
                                        Ok::<_, Infallible>(Frame::data(chunk.clone()))
                                    }));
                                StreamBody::new(frames).boxed()
                            } else {
                                Full::new(Bytes::from_static(SMALL.as_bytes())).boxed()
                            };
                        Ok::<_, Infallible>(
                            hyper::Response::builder()
                                .header("content-type", "application/json")
                                .body(body)
                                .unwrap(),
                        )
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    addr
}

/// A CONNECT through the proxy at `proxy`, then TLS trusting `roots`, then
/// an HTTP/1.1 connection on it.
async fn open(
    proxy: SocketAddr,
    token: &str,
    authority: &str,
    roots: &rustls::RootCertStore,
) -> SendRequest<Full<Bytes>> {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    let _ = s.set_nodelay(true);
    s.write_all(
        format!(
            "CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\nProxy-Authorization: Bearer {token}\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = s.read(&mut b).await.unwrap();
        assert!(n == 1, "proxy closed: {}", String::from_utf8_lossy(&head));
        head.push(b[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots.clone())
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let name = rustls::pki_types::ServerName::try_from(UP_IP.to_owned()).unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(name, s)
        .await
        .expect("TLS through the proxy");
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    sender
}

/// `GET path` on `c`; returns the body length.
async fn get(c: &mut SendRequest<Full<Bytes>>, path: &str, placeholder: bool) -> usize {
    let mut req = hyper::Request::get(path).header("host", UP_IP);
    if placeholder {
        req = req.header("authorization", format!("Bearer {PLACEHOLDER}"));
    }
    c.ready().await.unwrap();
    let resp = c
        .send_request(req.body(Full::new(Bytes::new())).unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let mut n = 0;
    while let Some(f) = body.frame().await {
        if let Some(d) = f.unwrap().data_ref() {
            n += d.len();
        }
    }
    n
}

fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let p = peers::Platform::start(
        &rt,
        "bench-agent",
        "svc",
        AuthType::Bearer,
        &[("token", CREDENTIAL)],
    );
    rt.block_on(run(&p));
}

async fn run(p: &peers::Platform) {
    let n: usize = std::env::var("INTERCEPT_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let mb: usize = std::env::var("INTERCEPT_BENCH_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let reps = 3;
    let up_ca = tls::test_ca();
    let up = upstream(&up_ca).await;
    let authority = format!("{UP_IP}:{}", up.port());

    let token = p.sidecar_token.expose_secret().to_owned();
    println!(
        "TLS interception (inject = \"proxy\") vs the plain CONNECT tunnel, {n} requests per figure on an open tunnel, {reps} repetitions, alternating; {mb} MiB downloads; load {}",
        peers::load()
    );
    println!("  {}; {}", peers::describe(), p.describe());
    let mut sum: Vec<[f64; 10]> = Vec::new();
    for rep in 0..reps {
        let run_ca = airlock_platform::proxy_ca::generate(&p.run_id).unwrap();
        let mut run_roots = rustls::RootCertStore::empty();
        {
            use rustls::pki_types::pem::PemObject;
            for c in rustls::pki_types::CertificateDer::pem_slice_iter(run_ca.cert_pem.as_bytes()) {
                run_roots.add(c.unwrap()).unwrap();
            }
        }
        let mut up_roots = rustls::RootCertStore::empty();
        up_roots.add(up_ca.issuer.der().clone()).unwrap();
        let base =
            |intercept: bool, ca: Option<&airlock_platform_api::launch::ProxyCa>, rule: bool| {
                let mut cfg = p
                    .sidecar_config()
                    .tcp()
                    .proxy_tcp()
                    .integration(
                        peers::integration("svc")
                            .authorized([format!("https://{authority}/**")])
                            .bearer("token")
                            .inject_proxy_if(intercept),
                    )
                    .network_allow([format!("https://{authority}/**")])
                    .allow_internal_hosts([UP_IP])
                    .egress_with(|e| e.extra_ca_pem = Some(up_ca.issuer.pem()))
                    .limits(|l| l.max_response_bytes = (mb + 1) << 20);
                if let Some(ca) = ca {
                    cfg = cfg.proxy_ca(&ca.cert_pem, &ca.key_pem);
                }
                if rule {
                    // A read-only rule on the upstream's paths: the proxy must see
                    // each request, so it intercepts with no credential to inject.
                    cfg = cfg.network_rules(serde_json::json!([{
                        "id": "bench-read", "host": format!("https://{authority}"),
                        "access": "read-only", "paths": ["/small", "/big"],
                    }]));
                }
                peers::spawn_sidecar(cfg.build())
            };
        let plain_sc = base(false, None, false);
        let icpt_sc = base(true, Some(&run_ca), false);
        let rule_sc = base(false, Some(&run_ca), true);
        let plain_proxy = plain_sc.proxy_tcp();
        let icpt_proxy = icpt_sc.proxy_tcp();

        let mut plain = open(plain_proxy, &token, &authority, &up_roots).await;
        let mut icpt = open(icpt_proxy, &token, &authority, &run_roots).await;
        let mut ruled = open(rule_sc.proxy_tcp(), &token, &authority, &run_roots).await;
        for _ in 0..100 {
            get(&mut plain, "/small", false).await;
            get(&mut icpt, "/small", false).await;
            get(&mut icpt, "/small", true).await;
            get(&mut ruled, "/small", false).await;
        }
        let (mut t_plain, mut t_anon, mut t_cred) = (Vec::new(), Vec::new(), Vec::new());
        let mut t_rule = Vec::new();
        for _ in 0..n {
            let t = Instant::now();
            get(&mut plain, "/small", false).await;
            t_plain.push(t.elapsed());
            let t = Instant::now();
            get(&mut icpt, "/small", false).await;
            t_anon.push(t.elapsed());
            let t = Instant::now();
            get(&mut icpt, "/small", true).await;
            t_cred.push(t.elapsed());
            let t = Instant::now();
            get(&mut ruled, "/small", false).await;
            t_rule.push(t.elapsed());
        }
        // Set-up: CONNECT, TLS and the first answer, on fresh tunnels.
        let (mut s_plain, mut s_icpt) = (Vec::new(), Vec::new());
        for _ in 0..100 {
            let t = Instant::now();
            let mut c = open(plain_proxy, &token, &authority, &up_roots).await;
            get(&mut c, "/small", false).await;
            s_plain.push(t.elapsed());
            let t = Instant::now();
            let mut c = open(icpt_proxy, &token, &authority, &run_roots).await;
            get(&mut c, "/small", false).await;
            s_icpt.push(t.elapsed());
        }
        // Throughput of one download each.
        let path = format!("/big?mb={mb}");
        let t = Instant::now();
        let got = get(&mut plain, &path, false).await;
        let plain_mbs = got as f64 / (1 << 20) as f64 / t.elapsed().as_secs_f64();
        let t = Instant::now();
        let got2 = get(&mut icpt, &path, false).await;
        let icpt_mbs = got2 as f64 / (1 << 20) as f64 / t.elapsed().as_secs_f64();
        assert_eq!(got, mb << 20);
        assert_eq!(got2, mb << 20);

        let (pl, an, cr) = (p50_99(t_plain), p50_99(t_anon), p50_99(t_cred));
        let ru = p50_99(t_rule);
        let (sp, si) = (p50_99(s_plain), p50_99(s_icpt));
        println!("  rep {rep}:");
        println!(
            "    {:<52} p50 {:>7.1} µs  p99 {:>7.1} µs",
            "request, plain tunnel (TLS end to end)", pl.0, pl.1
        );
        println!(
            "    {:<52} p50 {:>7.1} µs  p99 {:>7.1} µs  added p50 {:>6.1} p99 {:>6.1}",
            "request, intercepted, no credential",
            an.0,
            an.1,
            an.0 - pl.0,
            an.1 - pl.1
        );
        println!(
            "    {:<52} p50 {:>7.1} µs  p99 {:>7.1} µs  added p50 {:>6.1} p99 {:>6.1}",
            "request, intercepted, placeholder → credential",
            cr.0,
            cr.1,
            cr.0 - pl.0,
            cr.1 - pl.1
        );
        println!(
            "    {:<52} p50 {:>7.1} µs  p99 {:>7.1} µs  added p50 {:>6.1} p99 {:>6.1}",
            "request, intercepted for a read-only L7 rule",
            ru.0,
            ru.1,
            ru.0 - pl.0,
            ru.1 - pl.1
        );
        println!(
            "    {:<52} plain p50 {:>7.1} µs  intercepted p50 {:>7.1} µs (p99 {:.1} / {:.1})",
            "tunnel set-up (CONNECT + TLS + first answer)", sp.0, si.0, sp.1, si.1
        );
        println!(
            "    {:<52} plain {:>7.0} MiB/s  intercepted {:>7.0} MiB/s  ({:.2}×)",
            format!("{mb} MiB download"),
            plain_mbs,
            icpt_mbs,
            icpt_mbs / plain_mbs
        );
        sum.push([
            an.0 - pl.0,
            an.1 - pl.1,
            cr.0 - pl.0,
            cr.1 - pl.1,
            sp.0,
            si.0,
            plain_mbs,
            icpt_mbs,
            ru.0 - pl.0,
            ru.1 - pl.1,
        ]);
    }
    println!("summary (median [min–max] of {reps} repetitions):");
    let labels = [
        "added per request, no credential, p50 µs",
        "added per request, no credential, p99 µs",
        "added per request, credential injected, p50 µs",
        "added per request, credential injected, p99 µs",
        "tunnel set-up p50, plain tunnel µs",
        "tunnel set-up p50, intercepted µs",
        "download, plain tunnel MiB/s",
        "download, intercepted MiB/s",
        "added per request, L7 rule (read-only), p50 µs",
        "added per request, L7 rule (read-only), p99 µs",
    ];
    for (i, l) in labels.iter().enumerate() {
        let v: Vec<f64> = sum.iter().map(|r| r[i]).collect();
        println!("  {l:<52} {}", peers::spread(&v, 1));
    }
}
