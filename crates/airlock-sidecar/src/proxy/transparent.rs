//! The transparent plane's one check at the sidecar: a connection the
//! sandbox's runtime carried here (a tool that ignores proxy variables
//! asked the sandbox's resolver for a name, got a synthetic address and
//! connected to it; `airlock-runtime`'s `transparent` module has the whole
//! design) arrives as a `CONNECT name:port` marked with
//! [`PLANE_HEADER`]`: transparent`, the client's first bytes behind it.
//!
//! Before the CONNECT goes the way every CONNECT goes (the scope's tunnel
//! rule, interception or the guard under the listener's rules, the record
//! before the dial, the dial at a pinned address: one code path in
//! [`super::serve_connection_with`]), this module reads the name the client
//! itself presents: the TLS ClientHello's SNI (read by rustls's
//! [`Acceptor`], no CA needed), or the HTTP request's `Host`. It must be
//! the name the synthetic address was issued for: the client cannot send
//! its bytes to one name under the cover of another's address. A mismatch,
//! a client that presents no name (no SNI, not HTTP, a server-speaks-first
//! protocol) or one that does not within the head timeout is refused
//! (`not_authorized` at [`GuardStep::TransparentName`]), recorded like every
//! refusal.
//!
//! A client that presented its name in TLS keeps the CONNECT's tunnel (its
//! bytes pass as they came, or through interception). One that presented
//! it as an HTTP `Host` is a plain-HTTP client: its request is served as
//! the forward proxy serves an absolute-form `http://` one
//! ([`as_proxy_request`]: the same strict head parser, the guard judging
//! the method and URL under the same rules, one request per connection),
//! so plain HTTP is never judged as the CONNECT's `https`.
//!
//! The marker only ever adds this check: a client of the forward proxy
//! that sends it itself gains nothing.

use airlock_egress::{EgressCode, EgressError, GuardStep, Target};
use airlock_platform_api::transparent::{PLANE_HEADER, PLANE_TRANSPARENT};
use bytes::BytesMut;
use rustls::server::Acceptor;
use tokio::io::{AsyncRead, AsyncReadExt};

use super::head::{HeadError, RequestHead, parse_head};

/// Most bytes read ahead for the client's name: a ClientHello (with its
/// extensions, post-quantum key shares included) or a request head.
pub const MAX_PEEK_BYTES: usize = 32 * 1024;

/// Whether the request is the transparent plane's.
pub(super) fn asked(head: &RequestHead) -> bool {
    head.headers.get(PLANE_HEADER).is_some_and(|v| {
        v.as_bytes()
            .eq_ignore_ascii_case(PLANE_TRANSPARENT.as_bytes())
    })
}

/// What a client that presented its name speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Speaks {
    /// TLS: the name was its SNI.
    Tls,
    /// Plain HTTP: the name was its request's `Host`.
    Http,
}

/// What the client's first bytes say of the name it wants.
#[derive(Debug, PartialEq, Eq)]
enum Presented {
    /// More bytes are needed.
    Partial,
    /// A name (the SNI, or `Host` without its port).
    Name(String),
    /// TLS without SNI, HTTP without `Host`, or neither protocol.
    Nameless,
}

/// The name the first bytes present, once they are enough to tell.
fn presented(first: &[u8]) -> Presented {
    match first.first() {
        None => Presented::Partial,
        // A TLS handshake record.
        Some(0x16) => client_hello_sni(first),
        Some(_) => http_host(first),
    }
}

fn client_hello_sni(first: &[u8]) -> Presented {
    let mut acceptor = Acceptor::default();
    let mut rd = first;
    while !rd.is_empty() {
        if acceptor.read_tls(&mut rd).is_err() {
            return Presented::Nameless;
        }
    }
    match acceptor.accept() {
        Ok(None) => Presented::Partial,
        Ok(Some(accepted)) => match accepted.client_hello().server_name() {
            Some(n) => Presented::Name(n.to_owned()),
            None => Presented::Nameless,
        },
        Err(_) => Presented::Nameless,
    }
}

fn http_host(first: &[u8]) -> Presented {
    let mut headers = [httparse::EMPTY_HEADER; 100];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(first) {
        Ok(httparse::Status::Partial) => Presented::Partial,
        Ok(httparse::Status::Complete(_)) => {
            let host = req
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("host"))
                .and_then(|h| std::str::from_utf8(h.value).ok());
            match host {
                Some(h) => Presented::Name(h.to_owned()),
                None => Presented::Nameless,
            }
        }
        Err(_) => Presented::Nameless,
    }
}

/// Whether `presented` (a name, or a `Host` with or without a port) names
/// the same host as `issued`, both read by the guard's own parser.
fn same_host(issued: &Target, presented: &str) -> bool {
    let port = issued
        .port()
        .unwrap_or(if issued.is_https() { 443 } else { 80 });
    let authority = match presented.rsplit_once(':') {
        Some((_, p)) if !presented.ends_with(']') && p.bytes().all(|b| b.is_ascii_digit()) => {
            presented.to_owned()
        }
        _ => format!("{presented}:{port}"),
    };
    Target::from_authority(&authority).is_ok_and(|t| t.host() == issued.host())
}

/// Reads the client's first bytes (behind the head, into `buf`) until they
/// present a name, and checks it against `issued`: what the client speaks
/// when it is that name. `Ok(None)`: the client closed first (nothing to
/// record).
pub(super) async fn confirm<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
    head_len: usize,
    issued: &Target,
    timeout: std::time::Duration,
) -> Result<Option<Speaks>, EgressError> {
    let host = issued.host().bare();
    let refuse = |why: String| {
        EgressError::new(
            EgressCode::NotAuthorized,
            GuardStep::TransparentName,
            Some(&host),
            why,
        )
    };
    let read = async {
        loop {
            match presented(buf.get(head_len..).unwrap_or_default()) {
                Presented::Partial => {}
                done => return Ok(Some(done)),
            }
            if buf.len() - head_len >= MAX_PEEK_BYTES {
                return Ok(Some(Presented::Nameless));
            }
            buf.reserve(4096);
            if stream.read_buf(buf).await? == 0 {
                return Ok::<_, std::io::Error>(None);
            }
        }
    };
    match tokio::time::timeout(timeout, read).await {
        Ok(Ok(Some(Presented::Name(n)))) if same_host(issued, &n) => {
            Ok(Some(match buf.get(head_len) {
                Some(0x16) => Speaks::Tls,
                _ => Speaks::Http,
            }))
        }
        Ok(Ok(Some(Presented::Name(_)))) => Err(refuse(format!(
            "the connection to the address issued for {host} presented another name"
        ))),
        Ok(Ok(Some(_))) => Err(refuse(format!(
            "the connection to the address issued for {host} presented no name (no TLS SNI, no HTTP Host)"
        ))),
        Ok(Ok(None)) | Ok(Err(_)) => Ok(None),
        Err(_) => Err(refuse(format!(
            "the connection to the address issued for {host} presented no name in time"
        ))),
    }
}

/// A plain-HTTP client's request (`first`: its bytes so far, a whole head
/// and what followed) as the forward proxy's absolute-form request to the
/// name `issued` was issued for, at its port: the origin-form target
/// becomes `http://name:port/path`, the rest is kept byte for byte, and the
/// whole head goes through the proxy's strict parser. Returns the head and
/// the bytes it was parsed from (the rewritten head, then what followed).
/// Any other request-target (absolute, `*`, an authority) is refused: the
/// request names nothing but the path on its `Host`.
pub(super) fn as_proxy_request(
    first: &[u8],
    issued: &Target,
) -> Result<(RequestHead, BytesMut), HeadError> {
    let malformed = HeadError::Malformed;
    let line_end = first
        .windows(2)
        .position(|w| w == b"\r\n")
        .ok_or(malformed("request line"))?;
    let line = first.get(..line_end).ok_or(malformed("request line"))?;
    let mut parts = line.splitn(3, |&b| b == b' ');
    let (Some(method), Some(path), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err(malformed("request line is not METHOD SP TARGET SP VERSION"));
    };
    if path.first() != Some(&b'/') {
        return Err(malformed(
            "a request through the transparent plane names a path (origin-form)",
        ));
    }
    let host = issued.url().host_str().ok_or(malformed("host"))?;
    let origin = format!("http://{host}:{}", issued.port_or_default());
    let mut out = BytesMut::with_capacity(first.len() + origin.len());
    out.extend_from_slice(method);
    out.extend_from_slice(b" ");
    out.extend_from_slice(origin.as_bytes());
    out.extend_from_slice(path);
    out.extend_from_slice(b" ");
    out.extend_from_slice(version);
    out.extend_from_slice(first.get(line_end..).unwrap_or_default());
    let head = parse_head(&out)?.ok_or(malformed("incomplete head"))?;
    Ok((head, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(a: &str) -> Target {
        Target::from_authority(a).unwrap()
    }

    /// A real ClientHello, made by rustls itself for `sni`.
    fn client_hello(sni: &str) -> Vec<u8> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let roots = rustls::RootCertStore::empty();
        let cfg = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = rustls_pki_types::ServerName::try_from(sni.to_owned()).unwrap();
        let mut c = rustls::ClientConnection::new(std::sync::Arc::new(cfg), name).unwrap();
        let mut out = Vec::new();
        c.write_tls(&mut out).unwrap();
        out
    }

    #[test]
    fn a_client_hello_presents_its_sni_once_whole() {
        let hello = client_hello("api.example.com");
        assert_eq!(presented(&hello[..hello.len() / 2]), Presented::Partial);
        assert_eq!(presented(&hello), Presented::Name("api.example.com".into()));
    }

    #[test]
    fn an_http_request_presents_its_host() {
        assert_eq!(
            presented(b"GET / HTTP/1.1\r\nHost: a.example"),
            Presented::Partial
        );
        assert_eq!(
            presented(b"GET / HTTP/1.1\r\nHost: a.example:8080\r\n\r\n"),
            Presented::Name("a.example:8080".into())
        );
        assert_eq!(presented(b"GET / HTTP/1.1\r\n\r\n"), Presented::Nameless);
        assert_eq!(presented(b"SSH-2.0-OpenSSH_9.6\r\n"), Presented::Nameless);
    }

    #[test]
    fn names_compare_as_the_guard_reads_them() {
        let t = target("api.example.com:443");
        assert!(same_host(&t, "API.example.com"));
        assert!(same_host(&t, "api.example.com."));
        assert!(same_host(&t, "api.example.com:443"));
        assert!(!same_host(&t, "evil.example"));
        assert!(!same_host(&t, "api.example.com.evil.example"));
        assert!(!same_host(&t, ""));
    }

    #[tokio::test]
    async fn a_mismatched_sni_is_refused_and_a_matching_one_passes() {
        let t = target("api.example.com:443");
        let timeout = std::time::Duration::from_secs(5);
        let (mut a, mut b) = tokio::io::duplex(64 * 1024);
        let hello = client_hello("other.example");
        tokio::io::AsyncWriteExt::write_all(&mut b, &hello)
            .await
            .unwrap();
        let mut buf = BytesMut::new();
        let e = confirm(&mut a, &mut buf, 0, &t, timeout).await.unwrap_err();
        assert_eq!(e.code, EgressCode::NotAuthorized);
        assert_eq!(e.guard, GuardStep::TransparentName);

        let (mut a, mut b) = tokio::io::duplex(64 * 1024);
        let hello = client_hello("api.example.com");
        tokio::io::AsyncWriteExt::write_all(&mut b, &hello)
            .await
            .unwrap();
        let mut buf = BytesMut::from(&b"HEAD"[..]);
        assert_eq!(
            confirm(&mut a, &mut buf, 4, &t, timeout).await.unwrap(),
            Some(Speaks::Tls)
        );
        assert_eq!(
            &buf[4..],
            &hello[..],
            "the peeked bytes stay for the tunnel"
        );
    }

    #[tokio::test]
    async fn a_host_named_request_speaks_plain_http() {
        let t = target("api.example.com:8080");
        let (mut a, mut b) = tokio::io::duplex(64 * 1024);
        let req = b"GET /x HTTP/1.1\r\nHost: api.example.com:8080\r\n\r\n";
        tokio::io::AsyncWriteExt::write_all(&mut b, req)
            .await
            .unwrap();
        let mut buf = BytesMut::new();
        let timeout = std::time::Duration::from_secs(5);
        assert_eq!(
            confirm(&mut a, &mut buf, 0, &t, timeout).await.unwrap(),
            Some(Speaks::Http)
        );
    }

    #[test]
    fn a_plain_request_becomes_the_proxys_absolute_form_for_the_issued_name() {
        use super::super::head::RequestTarget;
        let t = target("api.example.com:8080");
        let first =
            b"POST /a/b?c=d HTTP/1.1\r\nHost: api.example.com:8080\r\nContent-Length: 2\r\n\r\nhi";
        let (head, buf) = as_proxy_request(first, &t).unwrap();
        assert_eq!(
            head.target,
            RequestTarget::Absolute("http://api.example.com:8080/a/b?c=d".into())
        );
        assert_eq!(head.method, http::Method::POST);
        assert_eq!(&buf[head.len..], b"hi", "the body follows the head");
        // Port 80 is the scheme's own; the name is always the issued one.
        let (head, _) = as_proxy_request(
            b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n",
            &target("a.test:80"),
        )
        .unwrap();
        assert_eq!(
            head.target,
            RequestTarget::Absolute("http://a.test:80/".into())
        );
        for bad in [
            &b"GET http://evil.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n"[..],
            b"OPTIONS * HTTP/1.1\r\nHost: a.test\r\n\r\n",
            b"GET /x HTTP/1.1\r\nHost: a.test\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"GET /x HTTP/1.1\r\n",
        ] {
            assert!(
                as_proxy_request(bad, &target("a.test:80")).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
