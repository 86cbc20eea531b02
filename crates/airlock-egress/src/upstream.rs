//! The operator's upstream proxy (`PROXY_URL`): whether an admitted target
//! is dialled directly or through it ([`Via`], the one place that decides),
//! and the CONNECT that opens a tunnel through it ([`UpstreamProxy::connect`]).
//!
//! The guard decides and resolves every target first, as without a proxy;
//! the proxy is only asked to CONNECT to the `IP:port` the guard pinned, so
//! it never resolves a name on a sandbox's behalf and cannot be steered to
//! an address the guard did not judge (the name stays in TLS's SNI and in
//! `Host`, inside the tunnel). Plain http goes through the same CONNECT and
//! speaks HTTP inside it, which keeps the pin.
//!
//! The proxy itself is dialled WITHOUT the guard, by design: it is operator
//! configuration (its own infrastructure, typically on a private address
//! the guard would refuse), not something a sandbox can choose. Its
//! credentials (the URL's `user:pass`) are sent as `Proxy-Authorization`
//! and never shown: errors never repeat the URL, and [`UpstreamProxy`]
//! displays as `http://host:port` ([`UpstreamProxy::redacted`]).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;

use secrecy::ExposeSecret as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::client::Dial;

/// Largest response head accepted from the upstream proxy.
const MAX_UPSTREAM_HEAD: usize = 8 * 1024;

/// Why the upstream proxy could not open a tunnel: each step that fails.
/// None repeats `PROXY_URL` (it may hold a password).
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("PROXY_URL does not parse")]
    UrlUnparsable,
    #[error("PROXY_URL must be an http:// proxy")]
    UrlNotHttp,
    #[error("PROXY_URL has no host")]
    UrlNoHost,
    #[error("PROXY_URL host does not resolve: {0}")]
    Unresolvable(#[source] io::Error),
    #[error("PROXY_URL host has no address")]
    NoAddress,
    #[error("cannot reach the upstream proxy: {0}")]
    Unreachable(#[source] io::Error),
    #[error("upstream proxy write failed: {0}")]
    Write(#[source] io::Error),
    #[error("upstream proxy read failed: {0}")]
    Read(#[source] io::Error),
    #[error("the upstream proxy's response head is too large")]
    HeadTooLarge,
    #[error("the upstream proxy closed the connection during CONNECT")]
    Closed,
    #[error("the upstream proxy's response is not HTTP")]
    NotHttp,
    #[error("the upstream proxy answered CONNECT with status {status}")]
    Refused { addr: SocketAddr, status: u16 },
}

/// The parsed `PROXY_URL`: where it is and what to present.
pub struct UpstreamProxy {
    host: String,
    port: u16,
    /// `Basic …`, from the URL's userinfo.
    authorization: Option<secrecy::SecretString>,
}

impl std::fmt::Debug for UpstreamProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl UpstreamProxy {
    /// Parses `http://[user:pass@]host[:port]`. Errors never repeat the URL
    /// (it may hold a password).
    pub fn parse(raw: &str) -> Result<UpstreamProxy, UpstreamError> {
        let url = url::Url::parse(raw).map_err(|_| UpstreamError::UrlUnparsable)?;
        if url.scheme() != "http" {
            return Err(UpstreamError::UrlNotHttp);
        }
        let host = match url.host() {
            Some(url::Host::Domain(d)) => d.to_owned(),
            Some(url::Host::Ipv4(ip)) => ip.to_string(),
            Some(url::Host::Ipv6(ip)) => ip.to_string(),
            None => return Err(UpstreamError::UrlNoHost),
        };
        let port = url.port_or_known_default().unwrap_or(80);
        let authorization = if url.username().is_empty() && url.password().is_none() {
            None
        } else {
            use base64::Engine as _;
            let decode = |s: &str| {
                percent_encoding::percent_decode_str(s)
                    .decode_utf8_lossy()
                    .into_owned()
            };
            let pair = format!(
                "{}:{}",
                decode(url.username()),
                decode(url.password().unwrap_or(""))
            );
            Some(secrecy::SecretString::from(format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(pair)
            )))
        };
        Ok(UpstreamProxy {
            host,
            port,
            authorization,
        })
    }

    /// The proxy as it may be logged and recorded: `http://host:port`, never
    /// its credentials.
    pub fn redacted(&self) -> String {
        if self.host.contains(':') {
            format!("http://[{}]:{}", self.host, self.port)
        } else {
            format!("http://{}:{}", self.host, self.port)
        }
    }

    /// Opens a tunnel to `addr` (a pinned address) through the proxy.
    pub async fn connect(&self, addr: SocketAddr) -> Result<TcpStream, UpstreamError> {
        let proxies: Vec<SocketAddr> = tokio::net::lookup_host((self.host.as_str(), self.port))
            .await
            .map_err(UpstreamError::Unresolvable)?
            .collect();
        let mut last = UpstreamError::NoAddress;
        for proxy in proxies {
            let mut s = match TcpStream::connect(proxy).await {
                Ok(s) => s,
                Err(e) => {
                    last = UpstreamError::Unreachable(e);
                    continue;
                }
            };
            let _ = s.set_nodelay(true);
            let mut req = format!("CONNECT {addr} HTTP/1.1\r\nHost: {addr}\r\n");
            if let Some(a) = &self.authorization {
                req.push_str("Proxy-Authorization: ");
                req.push_str(a.expose_secret());
                req.push_str("\r\n");
            }
            req.push_str("\r\n");
            s.write_all(req.as_bytes())
                .await
                .map_err(UpstreamError::Write)?;
            drop(req);
            let status = read_response_head(&mut s).await?;
            if !(200..300).contains(&status) {
                return Err(UpstreamError::Refused { addr, status });
            }
            return Ok(s);
        }
        Err(last)
    }
}

/// How the guarded connections of a process leave: directly, or through
/// the operator's upstream proxy. A `PROXY_URL` that does not parse is kept
/// as its error, so that every dial fails rather than bypass the proxy.
#[derive(Debug)]
pub enum Via {
    Direct,
    Proxy(UpstreamProxy),
    Unusable(UpstreamError),
}

impl Via {
    /// What `PROXY_URL` (unset or empty: none) decides.
    pub fn from_url(raw: Option<&str>) -> Via {
        match raw.filter(|r| !r.trim().is_empty()) {
            None => Via::Direct,
            Some(r) => match UpstreamProxy::parse(r) {
                Ok(p) => Via::Proxy(p),
                Err(e) => Via::Unusable(e),
            },
        }
    }

    /// The proxy as it may be recorded (`None`: direct).
    pub fn redacted(&self) -> Option<String> {
        match self {
            Via::Direct => None,
            Via::Proxy(p) => Some(p.redacted()),
            Via::Unusable(_) => Some("PROXY_URL (unusable)".into()),
        }
    }

    /// Opens a connection to the pinned address `addr` this way.
    pub async fn connect(&self, addr: SocketAddr) -> Result<TcpStream, ViaError> {
        match self {
            Via::Direct => {
                let s = TcpStream::connect(addr).await.map_err(ViaError::Connect)?;
                let _ = s.set_nodelay(true);
                Ok(s)
            }
            Via::Proxy(p) => p.connect(addr).await.map_err(ViaError::Upstream),
            Via::Unusable(e) => Err(ViaError::Unusable(e.to_string())),
        }
    }
}

/// Why [`Via::connect`] failed.
#[derive(Debug, thiserror::Error)]
pub enum ViaError {
    #[error("connect failed: {0}")]
    Connect(#[source] io::Error),
    #[error("{0}")]
    Upstream(#[source] UpstreamError),
    #[error("{0}")]
    Unusable(String),
}

impl Dial for Via {
    fn dial(
        &self,
        addr: SocketAddr,
    ) -> Pin<Box<dyn Future<Output = io::Result<TcpStream>> + Send + '_>> {
        Box::pin(async move {
            self.connect(addr).await.map_err(|e| match e {
                ViaError::Connect(e) => e,
                other => io::Error::other(other),
            })
        })
    }
}

/// Reads the upstream proxy's response head one byte at a time (so no byte of
/// the tunnel behind it is consumed) and returns its status code.
async fn read_response_head(s: &mut TcpStream) -> Result<u16, UpstreamError> {
    let mut head = Vec::with_capacity(256);
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() >= MAX_UPSTREAM_HEAD {
            return Err(UpstreamError::HeadTooLarge);
        }
        let n = s.read(&mut byte).await.map_err(UpstreamError::Read)?;
        if n == 0 {
            return Err(UpstreamError::Closed);
        }
        head.extend_from_slice(&byte);
    }
    parse_status(&head).ok_or(UpstreamError::NotHttp)
}

fn parse_status(head: &[u8]) -> Option<u16> {
    let line = head.split(|&b| b == b'\r').next()?;
    let mut parts = line.split(|&b| b == b' ');
    let version = parts.next()?;
    if !version.starts_with(b"HTTP/1.") {
        return None;
    }
    let code = parts.next()?;
    if code.len() != 3 {
        return None;
    }
    std::str::from_utf8(code).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_url_parsing() {
        let p = UpstreamProxy::parse("http://us%40r:p%3Ass@proxy.corp:3128").unwrap();
        assert_eq!((p.host.as_str(), p.port), ("proxy.corp", 3128));
        use base64::Engine;
        let expected = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode("us@r:p:ss")
        );
        assert_eq!(p.authorization.as_ref().unwrap().expose_secret(), expected);
        assert_eq!(p.redacted(), "http://proxy.corp:3128");
        assert_eq!(format!("{p:?}"), "http://proxy.corp:3128");
        let p = UpstreamProxy::parse("http://10.0.0.1").unwrap();
        assert_eq!(p.port, 80);
        assert!(p.authorization.is_none());
        let e = UpstreamProxy::parse("https://u:secretpw@p:1")
            .err()
            .unwrap();
        assert!(!e.to_string().contains("secretpw"));
        assert!(UpstreamProxy::parse("not a url").is_err());
        assert!(matches!(Via::from_url(None), Via::Direct));
        assert!(matches!(Via::from_url(Some(" ")), Via::Direct));
        let bad = Via::from_url(Some("ftp://u:secretpw@p:1"));
        assert!(matches!(bad, Via::Unusable(_)));
        assert!(!format!("{bad:?}").contains("secretpw"));
    }

    #[test]
    fn status_line() {
        assert_eq!(
            parse_status(b"HTTP/1.1 200 Connection established\r\n\r\n"),
            Some(200)
        );
        assert_eq!(parse_status(b"HTTP/1.0 407 Auth\r\n\r\n"), Some(407));
        assert_eq!(parse_status(b"SSH-2.0\r\n\r\n"), None);
        assert_eq!(parse_status(b"HTTP/1.1 2000 x\r\n\r\n"), None);
    }
}
