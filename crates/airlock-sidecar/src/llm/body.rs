//! The body handed to the agent: upstream frames, metered as they pass
//! ([`RelayBody`]); a streamed answer's first event written on its own
//! ([`FlushFirst`]). A body dropped before its end (the agent hung up)
//! has the rest of a metered answer read in the background, so an agent
//! cannot skip its cost by hanging up.

use std::pin::Pin;
use std::task::{Context, Poll};

use airlock_egress::EgressError;
use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};

use super::answer::{End, Relay};

/// The body handed to the agent: upstream frames, metered as they pass.
pub(super) struct RelayBody {
    relay: Option<Relay>,
    ended: bool,
    /// Resolves when the sidecar stops: a body still being read then ends,
    /// recorded with what was seen (its client is gone with the sandbox).
    stop: Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
}

impl RelayBody {
    /// The body of `relay`'s answer; it ends (recorded with what was seen)
    /// once `stop` resolves.
    pub(super) fn new(
        relay: Relay,
        stop: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Self {
        RelayBody {
            relay: Some(relay),
            ended: false,
            stop: Box::pin(stop),
        }
    }
}

impl Body for RelayBody {
    type Data = Bytes;
    type Error = EgressError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, EgressError>>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        let Some(relay) = this.relay.as_mut() else {
            return Poll::Ready(None);
        };
        if this.stop.as_mut().poll(cx).is_ready() {
            relay.finish(End::Cut("the sidecar stopped before the answer ended"));
            this.ended = true;
            return Poll::Ready(None);
        }
        loop {
            match Pin::new(&mut relay.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        let out = relay.on_data(data);
                        if !out.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(out))));
                        }
                    }
                    // Trailers pass only where nothing is redacted (they
                    // could carry the key too).
                    Err(frame) if !relay.passage.redacts() => {
                        return Poll::Ready(Some(Ok(frame)));
                    }
                    Err(_) => {}
                },
                Poll::Ready(Some(Err(e))) => {
                    relay.finish(End::Failed);
                    this.ended = true;
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(None) => {
                    let rest = relay.on_end();
                    relay.finish(End::Whole);
                    this.ended = true;
                    return Poll::Ready((!rest.is_empty()).then(|| Ok(Frame::data(rest))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }

    fn size_hint(&self) -> SizeHint {
        match &self.relay {
            Some(r) if !r.passage.reshapes() => r.inner.size_hint(),
            _ => SizeHint::default(),
        }
    }
}

impl Drop for RelayBody {
    fn drop(&mut self) {
        let Some(mut relay) = self.relay.take() else {
            return;
        };
        if relay.flight.is_none() {
            return; // already recorded
        }
        match tokio::runtime::Handle::try_current() {
            // A metered answer is read to its end in the background, so an
            // agent cannot skip its cost by hanging up. The drain's record
            // is in flight meanwhile: a stopping sidecar waits for it.
            Ok(h) if relay.cost.is_some() => {
                h.spawn(relay.drain());
            }
            _ => relay.finish(End::Cut("the client closed the stream early")),
        }
    }
}

/// A streamed answer whose first data frame is written to the agent on its
/// own. hyper writes what a body gives only once the body has nothing more
/// ready, so when the provider's head and several events arrive in one read
/// the first event would otherwise wait for the metering of every event
/// behind it: the time to the first token is the provider's, not the
/// relay's. After the first data frame the body says once that it has
/// nothing ready (and wakes its task at once), which makes hyper write;
/// everything after that is written as it comes. One write more per
/// streamed answer.
pub(super) struct FlushFirst<B> {
    inner: B,
    first: FirstFrame,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FirstFrame {
    /// No data frame has gone out yet.
    Awaiting,
    /// The first data frame went out; the next poll lets hyper write it.
    Given,
    /// Written: frames pass as they come.
    Written,
}

impl<B> FlushFirst<B> {
    pub(super) fn new(inner: B) -> Self {
        FlushFirst {
            inner,
            first: FirstFrame::Awaiting,
        }
    }
}

impl<B: Body + Unpin> Body for FlushFirst<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.get_mut();
        if this.first == FirstFrame::Given {
            this.first = FirstFrame::Written;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if this.first == FirstFrame::Awaiting
            && matches!(&polled, Poll::Ready(Some(Ok(frame))) if frame.is_data())
        {
            this.first = FirstFrame::Given;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// A body whose frames are all ready at once (as when the provider's
    /// head and events arrive in one read).
    struct AllReady(std::collections::VecDeque<Frame<Bytes>>);

    impl Body for AllReady {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Ready(self.get_mut().0.pop_front().map(Ok))
        }
    }

    struct Wakes(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// What a body gives, poll by poll: `Some(data)` for a data frame,
    /// `None` for the end, and `Pending` with the wakes seen by then.
    fn polls<B: Body<Data = Bytes> + Unpin>(mut body: B, n: usize) -> Vec<String>
    where
        B::Error: std::fmt::Debug,
    {
        let wakes = Arc::new(Wakes(std::sync::atomic::AtomicUsize::new(0)));
        let waker = std::task::Waker::from(wakes.clone());
        let mut cx = Context::from_waker(&waker);
        (0..n)
            .map(|_| match Pin::new(&mut body).poll_frame(&mut cx) {
                Poll::Pending => format!(
                    "pending, woken {}",
                    wakes.0.load(std::sync::atomic::Ordering::SeqCst)
                ),
                Poll::Ready(None) => "end".to_owned(),
                Poll::Ready(Some(f)) => match f.unwrap().into_data() {
                    Ok(d) => String::from_utf8_lossy(&d).into_owned(),
                    Err(_) => "not data".to_owned(),
                },
            })
            .collect()
    }

    #[test]
    fn the_first_event_is_written_before_the_rest_are_read() {
        let frames = |texts: &[&str]| {
            AllReady(
                texts
                    .iter()
                    .map(|t| Frame::data(Bytes::copy_from_slice(t.as_bytes())))
                    .collect(),
            )
        };
        // Everything ready at once: after the first event the body has
        // nothing ready, once, and its task is woken to go on at once.
        assert_eq!(
            polls(FlushFirst::new(frames(&["a", "b", "c"])), 6),
            ["a", "pending, woken 1", "b", "c", "end", "end"]
        );
        // A lone event, then the end.
        assert_eq!(
            polls(FlushFirst::new(frames(&["a"])), 3),
            ["a", "pending, woken 1", "end"]
        );
        // Without the wrapper, hyper would get every ready frame in a row.
        assert_eq!(polls(frames(&["a", "b"]), 3), ["a", "b", "end"]);
        // A frame that is not data (trailers) does not count as the first event.
        let mut trailers = frames(&["a", "b"]);
        trailers
            .0
            .push_front(Frame::trailers(http::HeaderMap::new()));
        assert_eq!(
            polls(FlushFirst::new(trailers), 5),
            ["not data", "a", "pending, woken 1", "b", "end"]
        );
    }
}
