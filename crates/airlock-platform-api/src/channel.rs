//! The microVM channel: one byte stream (a virtio-serial port) between a
//! guest and its host, carrying the run's header and secrets in, the
//! runtime's output and its end out, and the runtime's relays to the
//! sidecar (each connection one stream) both ways.
//!
//! A frame is a 9-byte head — kind (1 byte), stream (u32, big endian),
//! length (u32, big endian) — and at most [`MAX_PAYLOAD`] bytes. Stream 0 is
//! the control stream; relay streams are opened by the guest only, with
//! ids that only grow. The host reads what the guest writes as hostile:
//! [`Decoder`] refuses an unknown kind, an oversized frame or a malformed
//! payload, and [`GuestStreams`] a frame that does not fit the streams'
//! state (data on a stream never opened, an id opened out of order, a kind
//! only the host sends, an end without the run's nonce). Each refusal is a
//! [`ChannelError`], after which the host closes the channel and stops the
//! guest: nothing a guest sends makes the host panic, allocate past
//! [`MAX_PAYLOAD`] per frame, or guess.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// Largest payload of one frame.
pub const MAX_PAYLOAD: usize = 64 * 1024;
/// Bytes of a frame's head.
pub const HEAD_LEN: usize = 9;
/// Most relay streams open at once on one channel.
pub const MAX_OPEN_STREAMS: usize = 256;
/// The run's nonce: drawn by the host per run, known to the guest's init
/// only (sent in the header), carried by the one frame that ends the run.
pub const NONCE_LEN: usize = 16;
/// An exit frame's payload: the nonce and the exit code (i32, big endian).
const EXIT_LEN: u32 = 20;
const _: () = assert!(EXIT_LEN as usize == NONCE_LEN + 4);
/// The name of the guest's port (`virtserialport,name=…`).
pub const PORT_NAME: &str = "airlock.0";

/// Which of the sidecar's listeners a relay stream goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Relay {
    /// The sidecar's API (`/mcp`, `/llm`, `/events`, `/artifacts`).
    Api,
    /// Its forward proxy.
    Proxy,
}

/// One frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Guest → host: booted, waiting for its header.
    Ready,
    /// Host → guest: the run's header (JSON; no secret in it).
    Header(Bytes),
    /// Host → guest: bytes of the runtime's stdin (its secrets).
    Stdin(Bytes),
    /// Host → guest: the runtime's stdin is complete.
    StdinEnd,
    /// Host → guest: the platform stops the run (a cancel, its timeout):
    /// the guest's init passes it on to the runtime as `SIGTERM`, which ends
    /// the agent and reports what it holds before its end frame.
    Stop,
    /// Guest → host: the runtime's stdout, stderr.
    Stdout(Bytes),
    Stderr(Bytes),
    /// Guest → host: the runtime exited with `code`; `nonce` is the run's.
    Exit {
        nonce: [u8; NONCE_LEN],
        code: i32,
    },
    /// Guest → host: a new connection of the runtime to `relay`.
    Open {
        stream: u32,
        relay: Relay,
    },
    /// Either way: bytes on a stream.
    Data {
        stream: u32,
        data: Bytes,
    },
    /// Either way: the sender writes no more on this stream.
    Eof {
        stream: u32,
    },
    /// Either way: the stream is gone (its bytes in flight are dropped).
    Reset {
        stream: u32,
    },
}

/// Why a channel is closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChannelError {
    #[error("the channel's frame announces {len} bytes (at most {MAX_PAYLOAD})")]
    Oversized { len: u32 },
    #[error("the channel's frame kind {0} is unknown")]
    UnknownKind(u8),
    #[error("the channel's {kind} frame is malformed")]
    Malformed { kind: &'static str },
    #[error("the guest sent a {0} frame, which only the host sends")]
    WrongDirection(&'static str),
    #[error("the guest used stream {0}, which it never opened")]
    UnknownStream(u32),
    #[error("the guest opened stream {stream} after stream {last} (ids only grow)")]
    OutOfOrder { stream: u32, last: u32 },
    #[error("the guest opened more than {MAX_OPEN_STREAMS} streams at once")]
    TooManyStreams,
    #[error("the guest sent data on stream {0} after ending it")]
    DataAfterEof(u32),
    #[error("the guest's end does not carry the run's nonce (forged)")]
    ForgedExit,
    #[error("the guest sent a second {0}")]
    Repeated(&'static str),
    #[error("the channel ended in the middle of a frame")]
    Truncated,
}

const K_READY: u8 = 1;
const K_HEADER: u8 = 2;
const K_STDIN: u8 = 3;
const K_STDIN_END: u8 = 4;
const K_STDOUT: u8 = 5;
const K_STDERR: u8 = 6;
const K_EXIT: u8 = 7;
const K_OPEN: u8 = 8;
const K_DATA: u8 = 9;
const K_EOF: u8 = 10;
const K_RESET: u8 = 11;
const K_STOP: u8 = 12;
/// The highest kind: one past it is unknown.
const K_LAST: u8 = K_STOP;

impl Frame {
    /// The frame's name, for errors.
    pub fn name(&self) -> &'static str {
        match self {
            Frame::Ready => "ready",
            Frame::Header(_) => "header",
            Frame::Stdin(_) => "stdin",
            Frame::StdinEnd => "stdin-end",
            Frame::Stop => "stop",
            Frame::Stdout(_) => "stdout",
            Frame::Stderr(_) => "stderr",
            Frame::Exit { .. } => "exit",
            Frame::Open { .. } => "open",
            Frame::Data { .. } => "data",
            Frame::Eof { .. } => "eof",
            Frame::Reset { .. } => "reset",
        }
    }

    /// Appends the frame to `out`. A payload over [`MAX_PAYLOAD`] is the
    /// sender's bug: [`chunks`] splits bytes before they are framed.
    pub fn encode(&self, out: &mut BytesMut) {
        let (kind, stream, payload): (u8, u32, &[u8]) = match self {
            Frame::Ready => (K_READY, 0, &[]),
            Frame::Header(b) => (K_HEADER, 0, b),
            Frame::Stdin(b) => (K_STDIN, 0, b),
            Frame::StdinEnd => (K_STDIN_END, 0, &[]),
            Frame::Stop => (K_STOP, 0, &[]),
            Frame::Stdout(b) => (K_STDOUT, 0, b),
            Frame::Stderr(b) => (K_STDERR, 0, b),
            Frame::Exit { nonce, code } => {
                let mut p = [0u8; NONCE_LEN + 4];
                p[..NONCE_LEN].copy_from_slice(nonce);
                p[NONCE_LEN..].copy_from_slice(&code.to_be_bytes());
                out.put_u8(K_EXIT);
                out.put_u32(0);
                out.put_u32(EXIT_LEN);
                out.put_slice(&p);
                return;
            }
            Frame::Open { stream, relay } => {
                let r = match relay {
                    Relay::Api => [1u8],
                    Relay::Proxy => [2u8],
                };
                out.put_u8(K_OPEN);
                out.put_u32(*stream);
                out.put_u32(1);
                out.put_slice(&r);
                return;
            }
            Frame::Data { stream, data } => (K_DATA, *stream, data),
            Frame::Eof { stream } => (K_EOF, *stream, &[]),
            Frame::Reset { stream } => (K_RESET, *stream, &[]),
        };
        debug_assert!(payload.len() <= MAX_PAYLOAD);
        out.put_u8(kind);
        out.put_u32(stream);
        out.put_u32(u32::try_from(payload.len()).unwrap_or(u32::MAX));
        out.put_slice(payload);
    }

    /// The frame as bytes.
    pub fn to_bytes(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(HEAD_LEN + 64);
        self.encode(&mut b);
        b.freeze()
    }
}

/// `data` in pieces of at most [`MAX_PAYLOAD`] bytes (none for none).
pub fn chunks(data: Bytes) -> impl Iterator<Item = Bytes> {
    let mut rest = data;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let n = rest.len().min(MAX_PAYLOAD);
        Some(rest.split_to(n))
    })
}

/// Frames out of a byte stream: bytes are pushed as they arrive, whole
/// frames come out. Holds at most one frame's bytes beyond what was pushed
/// and not yet taken.
#[derive(Default)]
pub struct Decoder {
    buf: BytesMut,
}

impl Decoder {
    /// Bytes read from the channel.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Whether bytes of an unfinished frame are held (at the channel's end:
    /// [`ChannelError::Truncated`]).
    pub fn partial(&self) -> bool {
        !self.buf.is_empty()
    }

    /// The next whole frame, if one is buffered.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, ChannelError> {
        if self.buf.len() < HEAD_LEN {
            return Ok(None);
        }
        let kind = self.buf[0];
        let stream = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]);
        let len = u32::from_be_bytes([self.buf[5], self.buf[6], self.buf[7], self.buf[8]]);
        if len as usize > MAX_PAYLOAD {
            return Err(ChannelError::Oversized { len });
        }
        if !(K_READY..=K_LAST).contains(&kind) {
            return Err(ChannelError::UnknownKind(kind));
        }
        if self.buf.len() < HEAD_LEN + len as usize {
            return Ok(None);
        }
        self.buf.advance(HEAD_LEN);
        let payload = self.buf.split_to(len as usize).freeze();
        parse(kind, stream, payload).map(Some)
    }
}

fn parse(kind: u8, stream: u32, p: Bytes) -> Result<Frame, ChannelError> {
    let control = |f: Frame| {
        if stream == 0 {
            Ok(f)
        } else {
            Err(ChannelError::Malformed { kind: f.name() })
        }
    };
    let empty = |f: Frame| {
        if p.is_empty() {
            Ok(f)
        } else {
            Err(ChannelError::Malformed { kind: f.name() })
        }
    };
    let relay = |f: Frame| {
        if stream == 0 {
            Err(ChannelError::Malformed { kind: f.name() })
        } else {
            Ok(f)
        }
    };
    match kind {
        K_READY => control(empty(Frame::Ready)?),
        K_HEADER => control(Frame::Header(p)),
        K_STDIN => control(Frame::Stdin(p)),
        K_STDIN_END => control(empty(Frame::StdinEnd)?),
        K_STOP => control(empty(Frame::Stop)?),
        K_STDOUT => control(Frame::Stdout(p)),
        K_STDERR => control(Frame::Stderr(p)),
        K_EXIT => {
            let exit = |nonce, code| Frame::Exit { nonce, code };
            if p.len() != NONCE_LEN + 4 {
                return Err(ChannelError::Malformed { kind: "exit" });
            }
            let mut nonce = [0u8; NONCE_LEN];
            nonce.copy_from_slice(&p[..NONCE_LEN]);
            let code = i32::from_be_bytes([p[16], p[17], p[18], p[19]]);
            control(exit(nonce, code))
        }
        K_OPEN => {
            let r = match p.as_ref() {
                [1] => Relay::Api,
                [2] => Relay::Proxy,
                _ => return Err(ChannelError::Malformed { kind: "open" }),
            };
            relay(Frame::Open { stream, relay: r })
        }
        K_DATA => relay(Frame::Data { stream, data: p }),
        K_EOF => relay(empty(Frame::Eof { stream })?),
        K_RESET => relay(empty(Frame::Reset { stream })?),
        other => Err(ChannelError::UnknownKind(other)),
    }
}

/// The state of a channel's streams as the host sees the guest's frames:
/// the one place that decides whether a guest's frame is acceptable.
pub struct GuestStreams {
    nonce: [u8; NONCE_LEN],
    /// The highest id opened so far.
    last: u32,
    /// Open streams, and whether the guest has ended its side of each.
    open: std::collections::HashMap<u32, bool>,
    ready: bool,
    ended: bool,
}

impl GuestStreams {
    pub fn new(nonce: [u8; NONCE_LEN]) -> GuestStreams {
        GuestStreams {
            nonce,
            last: 0,
            open: std::collections::HashMap::new(),
            ready: false,
            ended: false,
        }
    }

    /// The host has closed `stream` (its dial failed, or both sides ended):
    /// what the guest still sends on it is dropped.
    pub fn close(&mut self, stream: u32) {
        self.open.remove(&stream);
    }

    /// Judges one frame from the guest: the frame, to act on (an exit's
    /// nonce checked, a stream's open recorded), or `None` for one on a
    /// stream the host has closed (dropped).
    pub fn accept(&mut self, f: Frame) -> Result<Option<Frame>, ChannelError> {
        if self.ended {
            return Err(ChannelError::Repeated("frame after the exit"));
        }
        match f {
            Frame::Header(_) | Frame::Stdin(_) | Frame::StdinEnd | Frame::Stop => {
                Err(ChannelError::WrongDirection(f.name()))
            }
            Frame::Ready if self.ready => Err(ChannelError::Repeated("ready")),
            Frame::Ready => {
                self.ready = true;
                Ok(Some(f))
            }
            Frame::Stdout(_) | Frame::Stderr(_) => Ok(Some(f)),
            Frame::Exit { nonce, .. } => {
                // One guess only: a wrong nonce closes the channel, so its
                // comparison's timing tells a guest nothing it can use.
                if nonce != self.nonce {
                    return Err(ChannelError::ForgedExit);
                }
                self.ended = true;
                Ok(Some(f))
            }
            Frame::Open { stream, .. } => {
                if stream <= self.last {
                    return Err(ChannelError::OutOfOrder {
                        stream,
                        last: self.last,
                    });
                }
                if self.open.len() >= MAX_OPEN_STREAMS {
                    return Err(ChannelError::TooManyStreams);
                }
                self.last = stream;
                self.open.insert(stream, false);
                Ok(Some(f))
            }
            Frame::Data { stream, .. } => match self.known(stream)? {
                Some(true) => Err(ChannelError::DataAfterEof(stream)),
                Some(false) => Ok(Some(f)),
                None => Ok(None),
            },
            Frame::Eof { stream } => match self.known(stream)? {
                Some(_) => {
                    self.open.insert(stream, true);
                    Ok(Some(f))
                }
                None => Ok(None),
            },
            Frame::Reset { stream } => match self.known(stream)? {
                Some(_) => {
                    self.open.remove(&stream);
                    Ok(Some(f))
                }
                None => Ok(None),
            },
        }
    }

    /// Whether `stream` is open (and ended by the guest), closed (`None`),
    /// or was never opened (an error).
    fn known(&self, stream: u32) -> Result<Option<bool>, ChannelError> {
        match self.open.get(&stream) {
            Some(ended) => Ok(Some(*ended)),
            None if stream <= self.last => Ok(None),
            None => Err(ChannelError::UnknownStream(stream)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> Vec<Frame> {
        vec![
            Frame::Ready,
            Frame::Header(Bytes::from_static(b"{\"x\":1}")),
            Frame::Stdin(Bytes::from_static(b"secret")),
            Frame::StdinEnd,
            Frame::Stop,
            Frame::Stdout(Bytes::from_static(b"line\n")),
            Frame::Stderr(Bytes::new()),
            Frame::Exit {
                nonce: [7; NONCE_LEN],
                code: -3,
            },
            Frame::Open {
                stream: 1,
                relay: Relay::Proxy,
            },
            Frame::Data {
                stream: 1,
                data: Bytes::from(vec![9u8; MAX_PAYLOAD]),
            },
            Frame::Eof { stream: 1 },
            Frame::Reset { stream: 2 },
        ]
    }

    /// Every frame comes back as it was sent, whatever pieces the bytes
    /// arrive in.
    #[test]
    fn frames_round_trip_through_any_split() {
        let mut wire = BytesMut::new();
        for f in all() {
            f.encode(&mut wire);
        }
        for step in [1, 7, 4096, wire.len()] {
            let mut d = Decoder::default();
            let mut got = vec![];
            for piece in wire.chunks(step) {
                d.push(piece);
                while let Some(f) = d.next_frame().unwrap() {
                    got.push(f);
                }
            }
            assert_eq!(got, all(), "split {step}");
            assert!(!d.partial());
        }
    }

    fn decode(bytes: &[u8]) -> Result<Option<Frame>, ChannelError> {
        let mut d = Decoder::default();
        d.push(bytes);
        d.next_frame()
    }

    /// A hostile byte stream: an oversized length is refused from the head
    /// alone (nothing is buffered for it), so are an unknown kind and
    /// payloads that do not fit their kind.
    #[test]
    fn hostile_heads_are_typed_errors() {
        let mut big = vec![K_DATA, 0, 0, 0, 1];
        big.extend_from_slice(&(u32::MAX).to_be_bytes());
        assert_eq!(decode(&big), Err(ChannelError::Oversized { len: u32::MAX }));
        assert_eq!(
            decode(&[0xEE, 0, 0, 0, 0, 0, 0, 0, 0]),
            Err(ChannelError::UnknownKind(0xEE))
        );
        assert_eq!(
            decode(&[0, 0, 0, 0, 0, 0, 0, 0, 0]),
            Err(ChannelError::UnknownKind(0))
        );
        // An exit whose payload is short, an open naming no relay, data on
        // the control stream, a ready with a payload, stdout on a relay stream.
        for (bytes, kind) in [
            (vec![K_EXIT, 0, 0, 0, 0, 0, 0, 0, 1, 0], "exit"),
            (vec![K_OPEN, 0, 0, 0, 1, 0, 0, 0, 1, 9], "open"),
            (vec![K_DATA, 0, 0, 0, 0, 0, 0, 0, 1, 9], "data"),
            (vec![K_READY, 0, 0, 0, 0, 0, 0, 0, 1, 9], "ready"),
            (vec![K_STDOUT, 0, 0, 0, 3, 0, 0, 0, 0], "stdout"),
        ] {
            assert_eq!(decode(&bytes), Err(ChannelError::Malformed { kind }));
        }
    }

    /// The host's judge of the guest's frames: out-of-order and unknown
    /// streams, data after an end, host-only kinds and a forged end are
    /// errors; frames for a stream the host closed are dropped.
    #[test]
    fn the_guest_cannot_step_outside_its_streams() {
        let nonce = [42; NONCE_LEN];
        let open = |stream| Frame::Open {
            stream,
            relay: Relay::Api,
        };
        let data = |stream| Frame::Data {
            stream,
            data: Bytes::from_static(b"x"),
        };
        let mut g = GuestStreams::new(nonce);
        assert_eq!(g.accept(Frame::Ready), Ok(Some(Frame::Ready)));
        assert_eq!(g.accept(Frame::Ready), Err(ChannelError::Repeated("ready")));
        assert_eq!(g.accept(data(1)), Err(ChannelError::UnknownStream(1)));
        assert_eq!(g.accept(open(5)), Ok(Some(open(5))));
        assert_eq!(
            g.accept(open(3)),
            Err(ChannelError::OutOfOrder { stream: 3, last: 5 })
        );
        assert_eq!(
            g.accept(open(5)),
            Err(ChannelError::OutOfOrder { stream: 5, last: 5 })
        );
        assert_eq!(g.accept(data(5)), Ok(Some(data(5))));
        assert_eq!(
            g.accept(Frame::Eof { stream: 5 }),
            Ok(Some(Frame::Eof { stream: 5 }))
        );
        assert_eq!(g.accept(data(5)), Err(ChannelError::DataAfterEof(5)));
        g.close(5);
        assert_eq!(g.accept(data(5)), Ok(None));
        // An id below the last that was never opened is one the host closed.
        assert_eq!(g.accept(data(4)), Ok(None));
        assert_eq!(g.accept(data(6)), Err(ChannelError::UnknownStream(6)));
        for f in [
            Frame::Header(Bytes::new()),
            Frame::Stdin(Bytes::new()),
            Frame::StdinEnd,
            Frame::Stop,
        ] {
            let name = f.name();
            assert_eq!(g.accept(f), Err(ChannelError::WrongDirection(name)));
        }
        assert_eq!(
            g.accept(Frame::Exit {
                nonce: [41; NONCE_LEN],
                code: 0
            }),
            Err(ChannelError::ForgedExit)
        );
        assert_eq!(
            g.accept(Frame::Exit { nonce, code: 3 }),
            Ok(Some(Frame::Exit { nonce, code: 3 }))
        );
        assert!(g.accept(Frame::Stdout(Bytes::new())).is_err());
    }

    #[test]
    fn at_most_so_many_streams_are_open() {
        let mut g = GuestStreams::new([0; NONCE_LEN]);
        for s in 1..=u32::try_from(MAX_OPEN_STREAMS).unwrap() {
            g.accept(Frame::Open {
                stream: s,
                relay: Relay::Api,
            })
            .unwrap();
        }
        assert_eq!(
            g.accept(Frame::Open {
                stream: 10_000,
                relay: Relay::Api
            }),
            Err(ChannelError::TooManyStreams)
        );
        g.close(1);
        assert!(
            g.accept(Frame::Open {
                stream: 10_001,
                relay: Relay::Api
            })
            .is_ok()
        );
    }

    #[test]
    fn chunks_cover_the_bytes_in_bounded_pieces() {
        let data = Bytes::from(vec![1u8; MAX_PAYLOAD * 2 + 5]);
        let parts: Vec<Bytes> = chunks(data).collect();
        assert_eq!(
            parts.iter().map(Bytes::len).collect::<Vec<_>>(),
            [MAX_PAYLOAD, MAX_PAYLOAD, 5]
        );
        assert_eq!(chunks(Bytes::new()).count(), 0);
    }
}
