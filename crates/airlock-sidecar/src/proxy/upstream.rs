//! Dialling an admitted target: directly at a pinned address, or through the
//! operator's upstream proxy (`PROXY_URL`) with a CONNECT to that same pinned
//! address.
//!
//! The upstream proxy itself is dialled WITHOUT the guard, by design: it is
//! operator configuration (its own infrastructure, typically on a private
//! address the guard would refuse), not something the sandbox can choose. The
//! guard still decides and still resolves every target; the upstream proxy is
//! only asked to CONNECT to an `IP:port` the guard validated, so it never
//! resolves a name on the sandbox's behalf. Absolute-form requests use the
//! same CONNECT and speak HTTP inside it, which keeps the pin.

use std::net::SocketAddr;

use airlock_egress::{Admitted, EgressCode, EgressError, GuardStep};
use secrecy::ExposeSecret;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::ProxySettings;
use crate::state::Sidecar;

/// Largest response head accepted from the upstream proxy.
const MAX_UPSTREAM_HEAD: usize = 8 * 1024;

/// Why an admitted target could not be dialled: each step that fails. The
/// message becomes the `upstream_failed` refusal's detail; none repeats
/// `PROXY_URL` (it may hold a password) or the address dialled (the agent
/// reads the detail; the address is the operator's: [`DialError::address`]).
#[derive(Debug, thiserror::Error)]
pub(crate) enum DialError {
    #[error("PROXY_URL does not parse")]
    ProxyUrlUnparsable,
    #[error("PROXY_URL must be an http:// proxy")]
    ProxyUrlNotHttp,
    #[error("PROXY_URL has no host")]
    ProxyUrlNoHost,
    #[error("no address to dial")]
    NoAddress,
    #[error("connect failed: {source}")]
    Connect {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("connect timed out after {after:?}")]
    TimedOut {
        addr: SocketAddr,
        after: std::time::Duration,
    },
    #[error("PROXY_URL host does not resolve: {0}")]
    ProxyUnresolvable(#[source] std::io::Error),
    #[error("PROXY_URL host has no address")]
    ProxyNoAddress,
    #[error("cannot reach the upstream proxy: {0}")]
    ProxyUnreachable(#[source] std::io::Error),
    #[error("upstream proxy write failed: {0}")]
    ProxyWrite(#[source] std::io::Error),
    #[error("upstream proxy read failed: {0}")]
    ProxyRead(#[source] std::io::Error),
    #[error("the upstream proxy's response head is too large")]
    ProxyHeadTooLarge,
    #[error("the upstream proxy closed the connection during CONNECT")]
    ProxyClosed,
    #[error("the upstream proxy's response is not HTTP")]
    ProxyNotHttp,
    #[error("the upstream proxy answered CONNECT with status {status}")]
    ProxyRefused { addr: SocketAddr, status: u16 },
}

impl DialError {
    /// The address the dial was to, if the failure is about one.
    fn address(&self) -> Option<SocketAddr> {
        match self {
            DialError::Connect { addr, .. }
            | DialError::TimedOut { addr, .. }
            | DialError::ProxyRefused { addr, .. } => Some(*addr),
            _ => None,
        }
    }
}

/// The parsed `PROXY_URL`: where it is and what to present.
pub(crate) struct UpstreamProxy {
    host: String,
    port: u16,
    /// `Basic …`, from the URL's userinfo.
    authorization: Option<secrecy::SecretString>,
}

impl UpstreamProxy {
    /// Parses `http://[user:pass@]host[:port]`. Errors never repeat the URL
    /// (it may hold a password).
    pub(crate) fn parse(raw: &str) -> Result<UpstreamProxy, DialError> {
        let url = url::Url::parse(raw).map_err(|_| DialError::ProxyUrlUnparsable)?;
        if url.scheme() != "http" {
            return Err(DialError::ProxyUrlNotHttp);
        }
        let host = match url.host() {
            Some(url::Host::Domain(d)) => d.to_owned(),
            Some(url::Host::Ipv4(ip)) => ip.to_string(),
            Some(url::Host::Ipv6(ip)) => ip.to_string(),
            None => return Err(DialError::ProxyUrlNoHost),
        };
        let port = url.port_or_known_default().unwrap_or(80);
        let authorization = if url.username().is_empty() && url.password().is_none() {
            None
        } else {
            use base64::Engine;
            let user = percent_decode(url.username());
            let pass = percent_decode(url.password().unwrap_or(""));
            let pair = format!("{user}:{pass}");
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
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            if let Some(v) = hex {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn failed(admitted: &Admitted, e: &DialError) -> EgressError {
    let failed = EgressError::new(
        EgressCode::UpstreamFailed,
        GuardStep::Upstream,
        Some(&admitted.target.host().bare()),
        e.to_string(),
    );
    match e.address() {
        Some(addr) => failed.at(addr),
        None => failed,
    }
}

/// Opens a connection to the admitted target: the first pinned address that
/// answers within the connect timeout. (The guard already refused the
/// sidecar's own listeners by address; a connection that still turns out to
/// loop back into it, through one of the host's own addresses, is refused
/// with `blocked_address`.)
pub(crate) async fn dial(
    sidecar: &Sidecar,
    admitted: &Admitted,
    settings: &ProxySettings,
) -> Result<TcpStream, EgressError> {
    let port = admitted.target.port_or_default();
    let host = admitted.target.host().bare();
    let loop_refusal = |addr: SocketAddr| {
        EgressError::new(
            EgressCode::BlockedAddress,
            GuardStep::AddressTable,
            Some(&host),
            "the address is the sidecar's own listener",
        )
        .at(addr)
    };
    let policy = sidecar.client.guard().policy();
    let via = match &sidecar.proxy_url {
        Some(raw) => {
            Some(UpstreamProxy::parse(raw.expose_secret()).map_err(|e| failed(admitted, &e))?)
        }
        None => None,
    };
    let mut last = DialError::NoAddress;
    for ip in &admitted.addrs {
        let addr = SocketAddr::new(*ip, port);
        let attempt = async {
            match &via {
                None => TcpStream::connect(addr)
                    .await
                    .map_err(|source| DialError::Connect { addr, source }),
                Some(p) => connect_via(p, addr).await,
            }
        };
        match tokio::time::timeout(settings.connect_timeout, attempt).await {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                // The same host (peer address = our own address) on one of
                // our ports is a loop too, whatever address named it.
                if via.is_none()
                    && policy.has_own_listeners()
                    && let (Ok(peer), Ok(local)) = (stream.peer_addr(), stream.local_addr())
                    && policy.is_loop(local, peer)
                {
                    return Err(loop_refusal(peer));
                }
                return Ok(stream);
            }
            Ok(Err(e)) => last = e,
            Err(_) => {
                last = DialError::TimedOut {
                    addr,
                    after: settings.connect_timeout,
                }
            }
        }
    }
    Err(failed(admitted, &last))
}

/// Opens a tunnel to `addr` through the upstream proxy.
async fn connect_via(p: &UpstreamProxy, addr: SocketAddr) -> Result<TcpStream, DialError> {
    let proxies: Vec<SocketAddr> = tokio::net::lookup_host((p.host.as_str(), p.port))
        .await
        .map_err(DialError::ProxyUnresolvable)?
        .collect();
    let mut last = DialError::ProxyNoAddress;
    for proxy in proxies {
        let mut s = match TcpStream::connect(proxy).await {
            Ok(s) => s,
            Err(e) => {
                last = DialError::ProxyUnreachable(e);
                continue;
            }
        };
        let _ = s.set_nodelay(true);
        let mut req = format!("CONNECT {addr} HTTP/1.1\r\nHost: {addr}\r\n");
        if let Some(a) = &p.authorization {
            req.push_str("Proxy-Authorization: ");
            req.push_str(a.expose_secret());
            req.push_str("\r\n");
        }
        req.push_str("\r\n");
        s.write_all(req.as_bytes())
            .await
            .map_err(DialError::ProxyWrite)?;
        drop(req);
        let status = read_response_head(&mut s).await?;
        if !(200..300).contains(&status) {
            return Err(DialError::ProxyRefused { addr, status });
        }
        return Ok(s);
    }
    Err(last)
}

/// Reads the upstream proxy's response head one byte at a time (so no byte of
/// the tunnel behind it is consumed) and returns its status code.
async fn read_response_head(s: &mut TcpStream) -> Result<u16, DialError> {
    let mut head = Vec::with_capacity(256);
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() >= MAX_UPSTREAM_HEAD {
            return Err(DialError::ProxyHeadTooLarge);
        }
        let n = s.read(&mut byte).await.map_err(DialError::ProxyRead)?;
        if n == 0 {
            return Err(DialError::ProxyClosed);
        }
        head.extend_from_slice(&byte);
    }
    parse_status(&head).ok_or(DialError::ProxyNotHttp)
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
        assert_eq!(p.authorization.unwrap().expose_secret(), expected);
        let p = UpstreamProxy::parse("http://10.0.0.1").unwrap();
        assert_eq!(p.port, 80);
        assert!(p.authorization.is_none());
        let e = UpstreamProxy::parse("https://u:secretpw@p:1")
            .err()
            .unwrap();
        assert!(!e.to_string().contains("secretpw"));
        assert!(UpstreamProxy::parse("not a url").is_err());
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
