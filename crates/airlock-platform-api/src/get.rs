//! A `GET` with a JSON answer (the credential fetch on every credentialed
//! call, history, memories) exchanged on a kept-alive connection to the
//! platform's socket: the request head written in one `write`, the answer's
//! head parsed by `httparse` (hyper's own parser) and its body read by its
//! `Content-Length`, in the caller's task.
//!
//! It stands in for hyper's client dispatch (a request channel, the
//! connection's state machine, a response channel and a body stream) on
//! the credential fetch of every credentialed call: the platform is
//! Airlock's own server on a local socket and always answers a `GET` with a
//! `Content-Length` body, so this path reads exactly that and refuses
//! anything else ([`Exchange::Bad`]): a chunked or close-delimited answer,
//! an interim (1xx) answer, a head over [`MAX_HEAD`] or a body over the
//! caller's limit. What it saves is in `docs/performance.md` (the `get`
//! bench).

use std::io;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use zeroize::{Zeroize, Zeroizing};

/// Largest answer head read.
pub(crate) const MAX_HEAD: usize = 16 * 1024;
/// The read buffer a kept connection holds on to.
const KEPT_BUFFER: usize = 4096;
/// Most header lines an answer head may have.
const MAX_HEADERS: usize = 32;

/// A kept-alive connection and its read buffer (reused: an exchange
/// allocates nothing once the buffer has grown to the answers' size).
pub(crate) struct Kept {
    stream: UnixStream,
    buf: Vec<u8>,
}

impl Kept {
    pub(crate) fn new(stream: UnixStream) -> Kept {
        Kept {
            stream,
            buf: Vec::with_capacity(KEPT_BUFFER),
        }
    }
}

/// How an exchange failed.
#[derive(Debug)]
pub(crate) enum Exchange {
    /// The connection was found closed before any byte of an answer
    /// arrived (the request could not be written, or the platform closed
    /// the kept connection instead of answering): the `GET`, which changes
    /// nothing, may go out once more on a fresh connection.
    Closed(io::Error),
    /// The connection failed mid-answer.
    Io(io::Error),
    /// The answer is not one this path reads.
    Bad(String),
}

/// An answer: its status and where its body lies in the connection's
/// buffer ([`Kept::body`]), to be read before the connection is reused.
pub(crate) struct Answer {
    pub(crate) status: u16,
    body: std::ops::Range<usize>,
    /// Whether the connection may carry another request.
    pub(crate) keep: bool,
}

/// The request head of `GET path`, authenticated with `token`; `None` if
/// either holds a byte an HTTP request line or header value cannot (a
/// control character or a space), which hyper's request builder refuses too.
pub(crate) fn request_head(path: &str, token: &str) -> Option<Zeroizing<Vec<u8>>> {
    let visible = |s: &str| s.bytes().all(|b| b.is_ascii_graphic());
    if !path.starts_with('/') || !visible(path) || !visible(token) {
        return None;
    }
    let mut head = Zeroizing::new(Vec::with_capacity(64 + path.len() + token.len()));
    for part in [
        "GET ",
        path,
        " HTTP/1.1\r\nhost: platform\r\nauthorization: Bearer ",
        token,
        "\r\n\r\n",
    ] {
        head.extend_from_slice(part.as_bytes());
    }
    Some(head)
}

/// Writes `head` on `conn` and reads its answer, of at most `max_body`
/// bytes.
pub(crate) async fn exchange(
    conn: &mut Kept,
    head: &[u8],
    max_body: usize,
) -> Result<Answer, Exchange> {
    // (The buffer is empty: a new connection's, or one [`Kept::forget`]
    // cleared before it was kept.)
    conn.stream
        .write_all(head)
        .await
        .map_err(Exchange::Closed)?;
    let (status, head_len, body_len, keep) = loop {
        if let Some(parsed) = parse_head(&conn.buf, max_body)? {
            break parsed;
        }
        if conn.buf.len() >= MAX_HEAD {
            return Err(Exchange::Bad(format!(
                "the answer's head is over {MAX_HEAD} bytes"
            )));
        }
        read_more(conn).await?;
    };
    let end = head_len + body_len;
    while conn.buf.len() < end {
        read_more(conn).await?;
    }
    // One request at a time: bytes past the answer are a broken peer's.
    let keep = keep && conn.buf.len() == end;
    Ok(Answer {
        status,
        body: head_len..end,
        keep,
    })
}

impl Kept {
    /// The body of `answer`, the last one read on this connection.
    pub(crate) fn body(&self, answer: &Answer) -> &[u8] {
        self.buf.get(answer.body.clone()).unwrap_or_default()
    }

    /// The read buffer's capacity (what an idle connection holds on to).
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// Clears (and zeroes: it held a credential) what the last exchange
    /// read; a buffer a large answer grew goes back to its usual size, not
    /// kept with the idle connection.
    pub(crate) fn forget(&mut self) {
        self.buf.as_mut_slice().zeroize();
        self.buf.clear();
        if self.buf.capacity() > KEPT_BUFFER {
            self.buf.shrink_to(KEPT_BUFFER);
        }
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        self.buf.as_mut_slice().zeroize();
    }
}

/// Reads what the connection has into the buffer; its end is an error
/// ([`Exchange::Closed`] if nothing of the answer had come yet).
async fn read_more(conn: &mut Kept) -> Result<(), Exchange> {
    if conn.buf.capacity() == conn.buf.len() {
        // Grown by hand, not by `reserve`: a reallocation would free the
        // old block (part of an answer, maybe a credential) unzeroed.
        let mut grown = Vec::with_capacity(conn.buf.len() + KEPT_BUFFER.max(conn.buf.len()));
        grown.extend_from_slice(&conn.buf);
        conn.buf.as_mut_slice().zeroize();
        conn.buf = grown;
    }
    let first = conn.buf.is_empty();
    match conn.stream.read_buf(&mut conn.buf).await {
        Ok(0) => {
            let e = io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the platform closed the connection",
            );
            Err(if first {
                Exchange::Closed(e)
            } else {
                Exchange::Io(e)
            })
        }
        Ok(_) => Ok(()),
        Err(e) if first => Err(Exchange::Closed(e)),
        Err(e) => Err(Exchange::Io(e)),
    }
}

/// The answer head at the start of `buf`, once it is whole: status, head
/// length, body length and whether the connection stays open.
fn parse_head(buf: &[u8], max_body: usize) -> Result<Option<(u16, usize, usize, bool)>, Exchange> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut answer = httparse::Response::new(&mut headers);
    let head_len = match answer.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(Exchange::Bad(format!("unreadable answer head: {e}"))),
    };
    let status = answer.code.unwrap_or(0);
    if !(200..=599).contains(&status) {
        return Err(Exchange::Bad(format!("unexpected answer status {status}")));
    }
    let mut length = None;
    let mut keep = answer.version == Some(1);
    for h in answer.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            let n = std::str::from_utf8(h.value)
                .ok()
                .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|v| v.parse::<usize>().ok())
                .ok_or_else(|| Exchange::Bad("an invalid Content-Length".into()))?;
            if length.is_some_and(|l| l != n) {
                return Err(Exchange::Bad("conflicting Content-Length headers".into()));
            }
            length = Some(n);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(Exchange::Bad(
                "a transfer-encoded answer (the platform answers with a Content-Length)".into(),
            ));
        } else if h.name.eq_ignore_ascii_case("connection")
            && h.value
                .split(|&b| b == b',')
                .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"))
        {
            keep = false;
        }
    }
    let length = match length {
        Some(n) => n,
        // A 204 or 304 has no body; any other answer says how long it is.
        None if status == 204 || status == 304 => 0,
        None => return Err(Exchange::Bad("an answer without a Content-Length".into())),
    };
    if length > max_body {
        return Err(Exchange::Bad(format!(
            "an answer of {length} bytes (at most {max_body} are read)"
        )));
    }
    Ok(Some((status, head_len, length, keep)))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure
    use super::*;

    #[test]
    fn a_request_head_refuses_what_would_split_it() {
        let head = request_head("/internal/v1/credentials/svc", "r.t").unwrap();
        assert_eq!(
            head.as_slice(),
            b"GET /internal/v1/credentials/svc HTTP/1.1\r\nhost: platform\r\nauthorization: Bearer r.t\r\n\r\n"
        );
        for (path, token) in [
            ("/a\r\nx-injected: 1", "t"),
            ("/a b", "t"),
            ("/a", "t\r\nx-injected: 1"),
            ("/a", "t t"),
            ("a", "t"),
            ("/é", "t"),
        ] {
            assert!(request_head(path, token).is_none(), "{path:?} {token:?}");
        }
    }

    #[test]
    fn an_answer_head_is_read_only_when_whole_and_framed_by_its_length() {
        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}";
        for cut in 0..ok.len() - 2 {
            assert!(parse_head(&ok[..cut], 10).unwrap().is_none(), "{cut}");
        }
        assert_eq!(
            parse_head(ok, 10).unwrap(),
            Some((200, ok.len() - 2, 2, true))
        );
        let close =
            b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: keep-alive, Close\r\n\r\n";
        assert_eq!(
            parse_head(close, 10).unwrap(),
            Some((403, close.len(), 0, false))
        );
        let old = b"HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n";
        assert!(
            !parse_head(old, 10).unwrap().unwrap().3,
            "HTTP/1.0 is not kept"
        );
        let same_twice = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 2\r\n\r\n";
        assert_eq!(parse_head(same_twice, 10).unwrap().unwrap().2, 2);
        for bad in [
            &b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: +1\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: 99999999999999999999999\r\n\r\n",
            b"HTTP/1.1 100 Continue\r\n\r\n",
            b"HTTP/1.1 999 What\r\ncontent-length: 0\r\n\r\n",
            b"SMTP ready\r\n\r\n",
        ] {
            assert!(
                matches!(parse_head(bad, 10), Err(Exchange::Bad(_))),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
