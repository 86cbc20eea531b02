//! Moving bytes over the channel, the same on both sides: one writer task
//! that owns the channel's write half ([`writer`]), and one [`carry`] per
//! relay stream between its socket and the channel.
//!
//! Backpressure, not buffers: a stream's inbound queue holds a few frames,
//! and the side that reads the channel waits when it is full (so a slow
//! socket slows the whole channel, and nothing grows without bound).

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use airlock_platform_api::channel::{Frame, MAX_PAYLOAD};

/// Frames queued for the channel.
pub type FrameTx = mpsc::Sender<Frame>;

/// What the channel brings a stream.
#[derive(Debug)]
pub enum Inbound {
    Data(Bytes),
    /// The other side writes no more.
    Eof,
}

/// Frames queued per stream before the channel's reader waits.
pub const STREAM_QUEUE: usize = 8;

/// The task that writes every frame to the channel, in the order queued;
/// it ends (with the channel's write error, if any) once every sender is gone.
pub fn writer<W>(mut w: W) -> (FrameTx, tokio::task::JoinHandle<std::io::Result<()>>)
where
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (tx, mut rx) = mpsc::channel::<Frame>(64);
    let task = tokio::spawn(async move {
        let mut buf = BytesMut::with_capacity(MAX_PAYLOAD + 64);
        while let Some(f) = rx.recv().await {
            f.encode(&mut buf);
            // What else is queued goes out in the same write.
            while buf.len() < MAX_PAYLOAD {
                match rx.try_recv() {
                    Ok(f) => f.encode(&mut buf),
                    Err(_) => break,
                }
            }
            w.write_all(&buf).await?;
            buf.clear();
            w.flush().await?;
        }
        Ok(())
    });
    (tx, task)
}

/// Carries `stream` between `sock` and the channel until both directions
/// have ended: what `sock` yields goes out as data (then an end of
/// stream), what `inbound` brings is written to `sock` (an end shuts its
/// write side down). A socket error, or `inbound` closed under it (a reset),
/// ends the stream with a reset.
pub async fn carry<S>(stream: u32, sock: S, tx: FrameTx, mut inbound: mpsc::Receiver<Inbound>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let (mut r, mut w) = tokio::io::split(sock);
    let out = async {
        let mut buf = vec![0u8; MAX_PAYLOAD];
        loop {
            match r.read(&mut buf).await {
                Ok(0) => return tx.send(Frame::Eof { stream }).await.is_ok(),
                Ok(n) => {
                    let data = Bytes::copy_from_slice(&buf[..n]);
                    if tx.send(Frame::Data { stream, data }).await.is_err() {
                        return false;
                    }
                }
                Err(_) => return false,
            }
        }
    };
    let back = async {
        while let Some(m) = inbound.recv().await {
            match m {
                Inbound::Data(d) => {
                    if w.write_all(&d).await.is_err() {
                        return false;
                    }
                }
                Inbound::Eof => return w.shutdown().await.is_ok(),
            }
        }
        false
    };
    let (sent, received) = tokio::join!(out, back);
    if !(sent && received) {
        let _ = tx.send(Frame::Reset { stream }).await;
    }
}

/// Sends `data` to the channel in frames of at most [`MAX_PAYLOAD`] bytes,
/// each made by `frame`.
pub async fn send_chunked(tx: &FrameTx, data: Bytes, frame: fn(Bytes) -> Frame) -> bool {
    for piece in airlock_platform_api::channel::chunks(data) {
        if tx.send(frame(piece)).await.is_err() {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_platform_api::channel::Decoder;

    /// A stream carried over a channel pair: bytes both ways, the end of
    /// each direction, in frames the decoder reads back.
    #[tokio::test]
    async fn a_stream_is_carried_both_ways_with_its_ends() {
        let (chan_w, mut chan_r) = tokio::io::duplex(1 << 20);
        let (tx, writer_task) = writer(chan_w);
        let (mut app, sock) = tokio::io::duplex(1 << 20);
        let (in_tx, in_rx) = mpsc::channel(STREAM_QUEUE);
        let carried = tokio::spawn(carry(7, sock, tx.clone(), in_rx));
        drop(tx);
        let big = vec![5u8; MAX_PAYLOAD * 2 + 1];
        app.write_all(&big).await.unwrap();
        app.shutdown().await.unwrap();
        in_tx
            .send(Inbound::Data(Bytes::from_static(b"back")))
            .await
            .unwrap();
        in_tx.send(Inbound::Eof).await.unwrap();
        let mut got = Vec::new();
        app.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"back");
        carried.await.unwrap();
        writer_task.await.unwrap().unwrap();
        let mut wire = Vec::new();
        chan_r.read_to_end(&mut wire).await.unwrap();
        let mut d = Decoder::default();
        d.push(&wire);
        let mut data = 0;
        let mut frames = vec![];
        while let Some(f) = d.next_frame().unwrap() {
            if let Frame::Data { stream: 7, data: b } = &f {
                data += b.len();
            } else {
                frames.push(f);
            }
        }
        assert_eq!(data, big.len());
        assert_eq!(frames, vec![Frame::Eof { stream: 7 }]);
    }

    /// A stream whose inbound is dropped (the other side reset it) ends
    /// with a reset of its own.
    #[tokio::test]
    async fn a_dropped_inbound_resets_the_stream() {
        let (chan_w, mut chan_r) = tokio::io::duplex(1 << 16);
        let (tx, writer_task) = writer(chan_w);
        let (_app, sock) = tokio::io::duplex(1 << 16);
        let (in_tx, in_rx) = mpsc::channel(STREAM_QUEUE);
        drop(in_tx);
        let (mut app2, sock2) = (_app, sock);
        let carried = tokio::spawn(carry(3, sock2, tx.clone(), in_rx));
        app2.shutdown().await.unwrap();
        carried.await.unwrap();
        drop(tx);
        writer_task.await.unwrap().unwrap();
        let mut wire = Vec::new();
        chan_r.read_to_end(&mut wire).await.unwrap();
        let mut d = Decoder::default();
        d.push(&wire);
        let mut frames = vec![];
        while let Some(f) = d.next_frame().unwrap() {
            frames.push(f);
        }
        assert_eq!(frames.last(), Some(&Frame::Reset { stream: 3 }));
    }
}
