//! Test peers for the egress guard: HTTP(S) servers that record what reached
//! them, a DNS server with scripted answers, hostile upstreams, and a dialer
//! that refuses to send a single packet off loopback. Everything listens on
//! 127.0.0.1; nothing here ever contacts another address.

#![allow(dead_code)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use airlock_egress::Dial;
use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};

pub fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// What one request looked like when it reached a test server.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

pub type Handler = Arc<dyn Fn(&Recorded) -> Response<Full<Bytes>> + Send + Sync>;

pub struct TestServer {
    pub addr: SocketAddr,
    pub requests: Arc<Mutex<Vec<Recorded>>>,
    pub connections: Arc<AtomicUsize>,
}

impl TestServer {
    pub fn port(&self) -> u16 {
        self.addr.port()
    }
    pub fn request_count(&self) -> usize {
        self.requests.lock().unwrap().len()
    }
    pub fn connection_count(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
    pub fn last(&self) -> Recorded {
        self.requests
            .lock()
            .unwrap()
            .last()
            .cloned()
            .expect("no request reached the server")
    }
}

pub fn respond(status: u16, headers: &[(&str, &str)], body: &str) -> Response<Full<Bytes>> {
    let mut r = Response::builder().status(StatusCode::from_u16(status).unwrap());
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    r.body(Full::new(Bytes::from(body.to_owned()))).unwrap()
}

pub fn handler(f: impl Fn(&Recorded) -> Response<Full<Bytes>> + Send + Sync + 'static) -> Handler {
    Arc::new(f)
}

/// A trust anchor and a server certificate for `names`, signed by it.
pub struct TestPki {
    pub ca_der: CertificateDer<'static>,
    pub server_config: Arc<rustls::ServerConfig>,
}

pub fn pki(names: &[&str]) -> TestPki {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        .unwrap()
        .signed_by(&leaf_key, &ca)
        .unwrap();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let server_config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![leaf.der().clone()], key)
        .unwrap();
    TestPki {
        ca_der: ca.der().clone(),
        server_config: Arc::new(server_config),
    }
}

async fn serve_one<S>(io: S, h: Handler, log: Arc<Mutex<Vec<Recorded>>>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
        let h = h.clone();
        let log = log.clone();
        async move {
            let (parts, body) = req.into_parts();
            let body = body
                .collect()
                .await
                .map(|c| c.to_bytes())
                .unwrap_or_default();
            let rec = Recorded {
                method: parts.method.to_string(),
                path: parts.uri.to_string(),
                headers: parts.headers,
                body,
            };
            log.lock().unwrap().push(rec.clone());
            Ok::<_, Infallible>(h(&rec))
        }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(io), svc)
        .await;
}

/// An HTTP/1.1 server on 127.0.0.1 (or `tls`: HTTPS) answering with `h`.
pub async fn server(h: Handler, tls: Option<Arc<rustls::ServerConfig>>) -> TestServer {
    server_on("127.0.0.1:0".parse().unwrap(), h, tls).await
}

pub async fn server_on(
    bind: SocketAddr,
    h: Handler,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> TestServer {
    let listener = TcpListener::bind(bind).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let requests = Arc::new(Mutex::new(Vec::new()));
    let connections = Arc::new(AtomicUsize::new(0));
    let (log, conns) = (requests.clone(), connections.clone());
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            conns.fetch_add(1, Ordering::SeqCst);
            let (h, log) = (h.clone(), log.clone());
            match &tls {
                Some(cfg) => {
                    let acceptor = tokio_rustls::TlsAcceptor::from(cfg.clone());
                    tokio::spawn(async move {
                        if let Ok(s) = acceptor.accept(tcp).await {
                            serve_one(s, h, log).await;
                        }
                    });
                }
                None => {
                    tokio::spawn(serve_one(tcp, h, log));
                }
            }
        }
    });
    TestServer {
        addr,
        requests,
        connections,
    }
}

/// A listener that counts connections and never answers (a victim that must
/// never be reached, or a server that stalls).
pub struct Silent {
    pub addr: SocketAddr,
    pub connections: Arc<AtomicUsize>,
}

pub async fn silent() -> Silent {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let c = connections.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            c.fetch_add(1, Ordering::SeqCst);
            held.push(s);
        }
    });
    Silent { addr, connections }
}

/// A raw upstream that runs `behave` on each accepted connection.
pub async fn raw<F, Fut>(behave: F) -> SocketAddr
where
    F: Fn(TcpStream) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let behave = Arc::new(behave);
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(behave(s));
        }
    });
    addr
}

/// Reads a request head, then streams a chunked body forever.
pub async fn endless_body(mut s: TcpStream) {
    let mut buf = [0u8; 4096];
    let _ = s.read(&mut buf).await;
    if s.write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        .await
        .is_err()
    {
        return;
    }
    let chunk = format!("{:x}\r\n{}\r\n", 8192, "x".repeat(8192));
    while s.write_all(chunk.as_bytes()).await.is_ok() {}
}

/// Sends the status line, then one header byte per second.
pub async fn slow_drip(mut s: TcpStream) {
    let mut buf = [0u8; 4096];
    let _ = s.read(&mut buf).await;
    let _ = s.write_all(b"HTTP/1.1 200 OK\r\n").await;
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if s.write_all(b"x").await.is_err() {
            return;
        }
    }
}

/// Answers a TLS ClientHello with garbage.
pub async fn garbage_tls(mut s: TcpStream) {
    let mut buf = [0u8; 4096];
    let _ = s.read(&mut buf).await;
    let _ = s
        .write_all(b"\x15\x03\x03\x00\x02\x02\x28garbage that is not TLS at all\r\n\r\n")
        .await;
}

/// A dialer for tests. Loopback is dialled as is; a few "public" addresses
/// are routed to loopback servers (the test's stand-in for the internet);
/// every other address is refused without sending anything. Every dial is
/// logged.
#[derive(Default)]
pub struct TestNet {
    pub routes: Mutex<HashMap<SocketAddr, SocketAddr>>,
    pub dialled: Mutex<Vec<SocketAddr>>,
}

impl TestNet {
    pub fn route(&self, public: SocketAddr, to: SocketAddr) {
        self.routes.lock().unwrap().insert(public, to);
    }
    pub fn dialled(&self) -> Vec<SocketAddr> {
        self.dialled.lock().unwrap().clone()
    }
}

impl Dial for TestNet {
    fn dial(
        &self,
        addr: SocketAddr,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<TcpStream>> + Send + '_>>
    {
        self.dialled.lock().unwrap().push(addr);
        let routed = self.routes.lock().unwrap().get(&addr).copied();
        Box::pin(async move {
            let to = match routed {
                Some(to) => to,
                None if addr.ip().is_loopback() => addr,
                None => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::ConnectionRefused,
                        format!("test network: no route to {addr} (nothing leaves loopback)"),
                    ));
                }
            };
            TcpStream::connect(to).await
        })
    }
}

/// Scripted answers: (name without trailing dot, nth query for that name
/// and type, starting at 0) -> addresses. An empty list is NXDOMAIN.
pub type DnsScript = Arc<dyn Fn(&str, bool, usize) -> Vec<IpAddr> + Send + Sync>;

pub struct TestDns {
    pub addr: SocketAddr,
    pub queries: Arc<Mutex<Vec<String>>>,
}

/// A UDP DNS server on 127.0.0.1 answering A and AAAA from `script`, TTL 0.
pub async fn dns(script: DnsScript) -> TestDns {
    use hickory_proto::op::{Message, ResponseCode};
    use hickory_proto::rr::{RData, Record, RecordType};
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = sock.local_addr().unwrap();
    let queries = Arc::new(Mutex::new(Vec::new()));
    let q = queries.clone();
    tokio::spawn(async move {
        let mut counts: HashMap<(String, bool), usize> = HashMap::new();
        let mut buf = vec![0u8; 4096];
        loop {
            let Ok((n, peer)) = sock.recv_from(&mut buf).await else {
                return;
            };
            let Ok(req) = Message::from_vec(&buf[..n]) else {
                continue;
            };
            let mut resp = Message::response(req.metadata.id, req.metadata.op_code);
            resp.metadata.recursion_desired = req.metadata.recursion_desired;
            resp.metadata.recursion_available = true;
            resp.metadata.authoritative = true;
            let mut any = false;
            for query in &req.queries {
                resp.add_query(query.clone());
                let name = query.name().to_ascii();
                let name = name.trim_end_matches('.').to_ascii_lowercase();
                let v6 = match query.query_type() {
                    RecordType::A => false,
                    RecordType::AAAA => true,
                    _ => continue,
                };
                q.lock()
                    .unwrap()
                    .push(format!("{name} {}", if v6 { "AAAA" } else { "A" }));
                let nth = counts.entry((name.clone(), v6)).or_default();
                let answers = script(&name, v6, *nth);
                *nth += 1;
                for ip in answers {
                    if ip.is_ipv6() == v6 {
                        any = true;
                        resp.add_answer(Record::from_rdata(
                            query.name().clone(),
                            0,
                            RData::from(ip),
                        ));
                    }
                }
                if !any && script(&name, !v6, 0).is_empty() {
                    resp.metadata.response_code = ResponseCode::NXDomain;
                }
            }
            if let Ok(bytes) = resp.to_vec() {
                let _ = sock.send_to(&bytes, peer).await;
            }
        }
    });
    TestDns { addr, queries }
}
