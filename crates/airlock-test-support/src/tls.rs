//! TLS for the tests: a CA of the test's own and HTTPS upstreams on
//! loopback addresses with certificates from it (the sidecar trusts the CA
//! through `EGRESS_EXTRA_CA_FILE`).
#![allow(clippy::unwrap_used)] // test support: a panic is the calling test's failure

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::net::TcpListener;

/// What an upstream saw: path and Authorization of each request.
pub type Log = Arc<Mutex<Vec<(String, Option<String>)>>>;

/// The paths an upstream saw, in order.
pub fn paths(log: &Log) -> Vec<String> {
    log.lock().unwrap().iter().map(|(p, _)| p.clone()).collect()
}

/// An HTTPS upstream on `ip` with a certificate from `ca` for that address:
/// records each request and echoes its Authorization header in the body and
/// in a response header (an upstream that reflects the credential).
pub async fn upstream(ip: &str, ca: &TestCa) -> (u16, Log) {
    upstream_named(ip, &[ip], ca).await
}

/// A TLS acceptor (HTTP/1.1) with a certificate for each of `names`, signed
/// by the test's own CA.
pub fn acceptor_for(names: &[&str], ca: &TestCa) -> tokio_rustls::TlsAcceptor {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params =
        rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .unwrap();
    // A subject of its own: with rcgen's default one (the CA's too) OpenSSL
    // (Node) takes the leaf for self-signed.
    if let Some(first) = names.first() {
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, *first);
    }
    let cert = params.signed_by(&key, &ca.issuer).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    tokio_rustls::TlsAcceptor::from(Arc::new(cfg))
}

/// [`upstream`] with a certificate for each of `names` (DNS names or addresses).
pub async fn upstream_named(ip: &str, names: &[&str], ca: &TestCa) -> (u16, Log) {
    let l = TcpListener::bind(format!("{ip}:0")).await.unwrap();
    let port = l.local_addr().unwrap().port();
    let log: Log = Arc::default();
    let seen = log.clone();
    serve_https(l, acceptor_for(names, ca), move |req| {
        let auth = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        seen.lock()
            .unwrap()
            .push((req.uri().path().to_owned(), auth.clone()));
        let body = json!({"path": req.uri().path(), "auth": auth}).to_string();
        Response::builder()
            .header("content-type", "application/json")
            .header("x-echo-auth", auth.unwrap_or_default())
            .body(Full::new(Bytes::from(body)))
            .unwrap()
    });
    (port, log)
}

/// Serves HTTP/1.1 over TLS (`acceptor`) on `l` until the test ends: each
/// request is answered by `answer` (its head: the body is not read).
pub fn serve_https<F>(l: TcpListener, acceptor: tokio_rustls::TlsAcceptor, answer: F)
where
    F: Fn(&Request<hyper::body::Incoming>) -> Response<Full<Bytes>> + Clone + Send + Sync + 'static,
{
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let (acceptor, answer) = (acceptor.clone(), answer.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(s).await else {
                    return;
                };
                let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    let resp = answer(&req);
                    async move { Ok::<_, Infallible>(resp) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
}

pub struct TestCa {
    pub issuer: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
}

pub fn test_ca() -> TestCa {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    TestCa {
        issuer: rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap())
            .unwrap(),
    }
}

/// The two HTTPS hosts of the placeholder tests, on loopback addresses other
/// than the sandbox's own 127.0.0.1: `main` (an integration's) on
/// 127.0.0.2 and `other` on 127.0.0.3, as base URLs with their logs.
pub struct TwoHosts {
    pub main: String,
    pub main_port: u16,
    pub main_log: Log,
    pub other: String,
    pub other_port: u16,
    pub other_log: Log,
}

pub async fn two_hosts(ca: &TestCa) -> TwoHosts {
    two_hosts_on("127.0.0.2", "127.0.0.3", ca).await
}

/// [`two_hosts`] on addresses of the caller's choice (the same one twice
/// gives two hosts on two ports).
pub async fn two_hosts_on(main_ip: &str, other_ip: &str, ca: &TestCa) -> TwoHosts {
    let (main_port, main_log) = upstream(main_ip, ca).await;
    let (other_port, other_log) = upstream(other_ip, ca).await;
    TwoHosts {
        main: format!("https://{main_ip}:{main_port}"),
        main_port,
        main_log,
        other: format!("https://{other_ip}:{other_port}"),
        other_port,
        other_log,
    }
}
