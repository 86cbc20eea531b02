//! The proxy's request-head parser.
//!
//! Written by hand (rather than taking hyper's lenient server parser as is)
//! because the proxy must refuse every ambiguity a request-smuggling attack
//! relies on, and hyper silently repairs some of them (it drops
//! `Content-Length` when `Transfer-Encoding` is present, accepts bare LF line
//! ends). The rules here are a strict subset of RFC 9112: lines end in CRLF
//! and nothing else, no obs-fold, no control characters, one framing header at
//! most. A head this parser accepts is read identically by hyper, which the
//! absolute-form path hands the (already validated) bytes to for body framing.
//! Pure and allocation-bounded: the fuzz target `proxy_request` drives it.

use http::header::{CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, HeaderValue, Method};

/// Largest request head (request line and headers) accepted.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Most header lines in one request.
pub const MAX_HEADERS: usize = 100;

/// Why a request head was refused. Messages are fixed strings: nothing from
/// the request is echoed back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    #[error("request head is larger than {MAX_HEAD_BYTES} bytes")]
    TooLarge,
    #[error("malformed request: {0}")]
    Malformed(&'static str),
}

impl HeadError {
    pub fn http_status(&self) -> u16 {
        match self {
            HeadError::TooLarge => 431,
            HeadError::Malformed(_) => 400,
        }
    }
}

/// The request-target of a proxy request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestTarget {
    /// `CONNECT host:port`.
    Authority(String),
    /// `GET http://host/path`.
    Absolute(String),
}

/// How the request body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFraming {
    None,
    Length(u64),
    Chunked,
}

/// A validated request head.
#[derive(Debug, Clone)]
pub struct RequestHead {
    pub method: Method,
    pub target: RequestTarget,
    /// `HTTP/1.0` (otherwise `HTTP/1.1`).
    pub http10: bool,
    pub headers: HeaderMap,
    pub body: BodyFraming,
    /// Bytes of the head, including the final empty line.
    pub len: usize,
}

impl RequestHead {
    /// The head in canonical form (single spaces, CRLF, `name: value`):
    /// what the absolute-form path hands hyper. Parsing it again yields the
    /// same head (the fuzz target checks this).
    pub fn serialize(&self) -> Vec<u8> {
        let target = match &self.target {
            RequestTarget::Authority(a) | RequestTarget::Absolute(a) => a.as_str(),
        };
        let mut out = Vec::with_capacity(self.len);
        out.extend_from_slice(self.method.as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(target.as_bytes());
        out.extend_from_slice(if self.http10 {
            b" HTTP/1.0\r\n"
        } else {
            b" HTTP/1.1\r\n"
        });
        for (k, v) in &self.headers {
            out.extend_from_slice(k.as_str().as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(v.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"\r\n");
        out
    }
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn is_value_byte(b: u8) -> bool {
    b == b'\t' || (0x20..0x7f).contains(&b) || b >= 0x80
}

fn malformed(why: &'static str) -> HeadError {
    HeadError::Malformed(why)
}

/// Parses the head at the start of `buf`. `Ok(None)`: incomplete, read more.
pub fn parse_head(buf: &[u8]) -> Result<Option<RequestHead>, HeadError> {
    // A bare LF or a NUL anywhere in what has arrived is refused at once,
    // without waiting for a terminator that a bare-LF client never sends.
    let window = &buf[..buf.len().min(MAX_HEAD_BYTES)];
    let Some(end) = window.windows(4).position(|w| w == b"\r\n\r\n") else {
        if let Some(err) = early_error(window) {
            return Err(err);
        }
        if buf.len() >= MAX_HEAD_BYTES {
            return Err(HeadError::TooLarge);
        }
        return Ok(None);
    };
    let head = window.get(..end).ok_or(malformed("head"))?;
    let len = end + 4;
    let mut collected: Vec<&[u8]> = Vec::new();
    let mut rest = head;
    loop {
        let (line, next) = match rest.windows(2).position(|w| w == b"\r\n") {
            Some(i) => {
                let (line, tail) = rest.split_at(i);
                (line, Some(tail.get(2..).unwrap_or_default()))
            }
            None => (rest, None),
        };
        if line.contains(&b'\r') || line.contains(&b'\n') {
            return Err(malformed("bare CR or LF in the request head"));
        }
        if line.contains(&0) {
            return Err(malformed("NUL in the request head"));
        }
        collected.push(line);
        if collected.len() > MAX_HEADERS + 1 {
            return Err(malformed("too many header lines"));
        }
        match next {
            Some(n) => rest = n,
            None => break,
        }
    }
    let (request_line, header_lines) = collected.split_first().ok_or(malformed("empty request"))?;
    let (method, target, http10) = parse_request_line(request_line)?;

    let mut headers = HeaderMap::new();
    for line in header_lines {
        let (name, value) = parse_header_line(line)?;
        headers.append(name, value);
    }

    let body = framing(&method, http10, &headers)?;
    if headers.get_all(HOST).iter().count() > 1 {
        return Err(malformed("more than one Host header"));
    }
    Ok(Some(RequestHead {
        method,
        target,
        http10,
        headers,
        body,
        len,
    }))
}

fn early_error(window: &[u8]) -> Option<HeadError> {
    if window.contains(&0) {
        return Some(malformed("NUL in the request head"));
    }
    let mut prev = 0u8;
    for &b in window {
        if b == b'\n' && prev != b'\r' {
            return Some(malformed("bare LF in the request head"));
        }
        prev = b;
    }
    None
}

fn parse_request_line(line: &[u8]) -> Result<(Method, RequestTarget, bool), HeadError> {
    let mut parts = line.split(|&b| b == b' ');
    let (Some(m), Some(t), Some(v), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(malformed("request line is not METHOD SP TARGET SP VERSION"));
    };
    if m.is_empty() || !m.iter().all(|&b| is_tchar(b)) {
        return Err(malformed("bad method"));
    }
    let method = Method::from_bytes(m).map_err(|_| malformed("bad method"))?;
    let http10 = match v {
        b"HTTP/1.1" => false,
        b"HTTP/1.0" => true,
        _ => return Err(malformed("unsupported HTTP version")),
    };
    if t.is_empty() || !t.iter().all(|b| (0x21..0x7f).contains(b)) {
        return Err(malformed("bad request-target"));
    }
    // Checked ASCII above, so this cannot fail; no panic either way.
    let t = std::str::from_utf8(t)
        .map_err(|_| malformed("bad request-target"))?
        .to_owned();
    let target = if method == Method::CONNECT {
        RequestTarget::Authority(t)
    } else {
        let lower = t.get(..8).map(str::to_ascii_lowercase).unwrap_or_default();
        if !(lower.starts_with("http://") || lower.starts_with("https://")) {
            return Err(malformed(
                "a proxy request needs an absolute http:// target (or CONNECT)",
            ));
        }
        RequestTarget::Absolute(t)
    };
    Ok((method, target, http10))
}

fn parse_header_line(line: &[u8]) -> Result<(HeaderName, HeaderValue), HeadError> {
    if line.first().is_some_and(|&b| b == b' ' || b == b'\t') {
        return Err(malformed("obsolete line folding"));
    }
    let colon = line
        .iter()
        .position(|&b| b == b':')
        .ok_or(malformed("header line without a colon"))?;
    let (name, rest) = line.split_at(colon);
    if name.is_empty() || !name.iter().all(|&b| is_tchar(b)) {
        return Err(malformed("bad header name"));
    }
    let value = rest.get(1..).unwrap_or_default();
    let value = trim_ows(value);
    if !value.iter().all(|&b| is_value_byte(b)) {
        return Err(malformed("control character in a header value"));
    }
    let name = HeaderName::from_bytes(name).map_err(|_| malformed("bad header name"))?;
    let value = HeaderValue::from_bytes(value).map_err(|_| malformed("bad header value"))?;
    Ok((name, value))
}

fn trim_ows(mut v: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = v {
        v = rest;
    }
    v
}

fn framing(method: &Method, http10: bool, headers: &HeaderMap) -> Result<BodyFraming, HeadError> {
    let te: Vec<&HeaderValue> = headers.get_all(TRANSFER_ENCODING).iter().collect();
    let cl: Vec<&HeaderValue> = headers.get_all(CONTENT_LENGTH).iter().collect();
    if !te.is_empty() && !cl.is_empty() {
        return Err(malformed("both Content-Length and Transfer-Encoding"));
    }
    let framing = match (te.as_slice(), cl.as_slice()) {
        ([], []) => BodyFraming::None,
        ([te], []) => {
            if http10 {
                return Err(malformed("Transfer-Encoding in an HTTP/1.0 request"));
            }
            if !te.as_bytes().eq_ignore_ascii_case(b"chunked") {
                return Err(malformed("Transfer-Encoding other than chunked"));
            }
            BodyFraming::Chunked
        }
        ([], [cl]) => {
            let v = cl.as_bytes();
            if v.is_empty() || v.len() > 18 || !v.iter().all(u8::is_ascii_digit) {
                return Err(malformed("bad Content-Length"));
            }
            let n = std::str::from_utf8(v)
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or(malformed("bad Content-Length"))?;
            BodyFraming::Length(n)
        }
        ([], _) => return Err(malformed("more than one Content-Length")),
        _ => return Err(malformed("more than one Transfer-Encoding")),
    };
    if *method == Method::CONNECT && !matches!(framing, BodyFraming::None | BodyFraming::Length(0))
    {
        return Err(malformed("CONNECT with a body"));
    }
    Ok(framing)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(raw: &str) -> RequestHead {
        parse_head(raw.as_bytes()).unwrap().unwrap()
    }

    fn bad(raw: &[u8]) -> HeadError {
        parse_head(raw).unwrap_err()
    }

    #[test]
    fn connect_and_absolute_form() {
        let h = ok(
            "CONNECT api.example:443 HTTP/1.1\r\nHost: api.example:443\r\nProxy-Authorization: Bearer x\r\n\r\nTLS",
        );
        assert_eq!(h.method, Method::CONNECT);
        assert_eq!(h.target, RequestTarget::Authority("api.example:443".into()));
        assert_eq!(h.len, "CONNECT api.example:443 HTTP/1.1\r\nHost: api.example:443\r\nProxy-Authorization: Bearer x\r\n\r\n".len());
        assert_eq!(h.headers.get("proxy-authorization").unwrap(), "Bearer x");
        let h =
            ok("POST http://a.example/x?y HTTP/1.0\r\nContent-Length: 3\r\nX-A:  v v \t\r\n\r\n");
        assert_eq!(
            h.target,
            RequestTarget::Absolute("http://a.example/x?y".into())
        );
        assert_eq!(h.body, BodyFraming::Length(3));
        assert_eq!(h.headers.get("x-a").unwrap(), "v v");
        assert!(h.http10);
        assert_eq!(
            ok("GET http://a/ HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n").body,
            BodyFraming::Chunked
        );
        assert_eq!(ok("GET HTTP://a/ HTTP/1.1\r\n\r\n").body, BodyFraming::None);
    }

    #[test]
    fn incomplete_heads_wait() {
        for raw in [
            "",
            "GET",
            "GET http://a/ HTTP/1.1\r\n",
            "GET http://a/ HTTP/1.1\r\nHost: a\r\n\r",
        ] {
            assert!(parse_head(raw.as_bytes()).unwrap().is_none(), "{raw:?}");
        }
    }

    #[test]
    fn smuggling_shapes_are_refused() {
        let cases: &[&[u8]] = &[
            b"GET http://a/ HTTP/1.1\r\nX: a\nInjected: 1\r\n\r\n",
            b"GET http://a/ HTTP/1.1\r\nX: a\rInjected: 1\r\n\r\n",
            b"GET http://a/ HTTP/1.1\r\nX: a\0b\r\n\r\n",
            b"GET http://a/ HTTP/1.1\nHost: a\n\n",
            b"GET http://a/ HTTP/1.1\r\nX: a\r\n b\r\n\r\n",
            b"GET http://a/ HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"GET http://a/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 1\r\n\r\n",
            b"GET http://a/ HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
            b"GET http://a/ HTTP/1.1\r\nContent-Length: 1, 1\r\n\r\n",
            b"GET http://a/ HTTP/1.1\r\nContent-Length: +1\r\n\r\n",
            b"GET http://a/ HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            b"GET http://a/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"GET http://a/ HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"GET http://a/ HTTP/1.1\r\nTransfer-Encoding : chunked\r\n\r\n",
            b"GET http://a/ HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            b"CONNECT a:443 HTTP/1.1\r\nContent-Length: 5\r\n\r\n",
            b"CONNECT a:443 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"GET /local HTTP/1.1\r\nHost: a\r\n\r\n",
            b"GET * HTTP/1.1\r\n\r\n",
            b"GET  http://a/ HTTP/1.1\r\n\r\n",
            b"GET http://a/ HTTP/1.1 \r\n\r\n",
            b"GET http://a/\x7f HTTP/1.1\r\n\r\n",
            b"GET http://a/ HTTP/2.0\r\n\r\n",
            b"G(T http://a/ HTTP/1.1\r\n\r\n",
            b"\r\nGET http://a/ HTTP/1.1\r\n\r\n",
            b"GET http://a/ HTTP/1.1\r\nno-colon\r\n\r\n",
            b"GET http://a/ HTTP/1.1\r\n: empty\r\n\r\n",
            b"GET http://a/ HTTP/1.1\r\nX: \x01\r\n\r\n",
            b"GET http://a/ HTTP/1.1\r\nX: a\x7f\r\n\r\n",
        ];
        for raw in cases {
            assert!(
                matches!(bad(raw), HeadError::Malformed(_)),
                "{:?}",
                String::from_utf8_lossy(raw)
            );
        }
    }

    #[test]
    fn early_refusal_without_terminator() {
        assert!(matches!(
            bad(b"GET http://a/ HTTP/1.1\nX: y"),
            HeadError::Malformed(_)
        ));
        assert!(matches!(bad(b"GET http://a/\0"), HeadError::Malformed(_)));
    }

    #[test]
    fn size_limits() {
        let mut big = b"GET http://a/ HTTP/1.1\r\nX: ".to_vec();
        big.resize(MAX_HEAD_BYTES + 10, b'a');
        assert_eq!(bad(&big), HeadError::TooLarge);
        let mut many = String::from("GET http://a/ HTTP/1.1\r\n");
        for i in 0..=MAX_HEADERS {
            many.push_str(&format!("X-{i}: v\r\n"));
        }
        many.push_str("\r\n");
        assert!(matches!(bad(many.as_bytes()), HeadError::Malformed(_)));
    }
}
