//! The event sink: the run's lossy events (heartbeats, and the egress
//! records the journal could not take) forwarded to the platform in
//! batches, off the request path. What must never be shed goes to the
//! run's journal instead ([`crate::keep`]).

use std::time::Duration;

use airlock_platform_api::PlatformClient;
use airlock_platform_api::wire::RunEvent;
use tokio::sync::{mpsc, oneshot};

enum SinkMsg {
    Event(Box<RunEvent>),
    /// Who waits until what was queued before is handed to the platform.
    Flush(oneshot::Sender<bool>),
}

/// Forwards events to the platform in batches, off the request path.
#[derive(Clone)]
pub struct EventSink {
    tx: mpsc::Sender<SinkMsg>,
}

const SINK_CAPACITY: usize = 16 * 1024;
const BATCH: usize = 256;
/// How long the sink waits for more events before sending a batch (not
/// when someone waits for it: a flush).
const LINGER: Duration = Duration::from_millis(5);

/// Sends `events`, retrying a refusal a few times; `false` if they were dropped.
async fn deliver(platform: &PlatformClient, events: Vec<RunEvent>) -> bool {
    let n = events.len();
    let mut attempt = 0;
    loop {
        match platform.events(events.clone()).await {
            Ok(_) => return true,
            Err(e) if attempt < 3 => {
                attempt += 1;
                tracing::warn!("event sink: platform refused {n} events (attempt {attempt}): {e}");
                tokio::time::sleep(Duration::from_millis(100 * attempt)).await;
            }
            Err(e) => {
                tracing::error!("event sink: dropped {n} events: {e}");
                return false;
            }
        }
    }
}

/// The sink's task. Events are gathered for up to [`LINGER`] (or [`BATCH`]
/// of them), so a busy run costs the platform one request per batch, not
/// per event; a flush sends at once. It ends once every sender is gone and
/// what they queued was handed over.
async fn forward(platform: PlatformClient, mut rx: mpsc::Receiver<SinkMsg>) {
    let mut pending: Vec<RunEvent> = Vec::new();
    let mut due_at: Option<tokio::time::Instant> = None;
    let mut closed = false;
    while !(closed && pending.is_empty()) {
        let mut flushes: Vec<oneshot::Sender<bool>> = Vec::new();
        let next = match due_at {
            _ if closed => None,
            Some(at) => tokio::time::timeout_at(at, rx.recv()).await.ok(),
            None => Some(rx.recv().await),
        };
        let mut take = |m: SinkMsg, pending: &mut Vec<RunEvent>| match m {
            SinkMsg::Event(e) => pending.push(*e),
            SinkMsg::Flush(w) => flushes.push(w),
        };
        match next {
            Some(Some(m)) => {
                take(m, &mut pending);
                while let Ok(m) = rx.try_recv() {
                    take(m, &mut pending);
                }
            }
            Some(None) => closed = true,
            None => {}
        }
        let now = tokio::time::Instant::now();
        if due_at.is_none() && !pending.is_empty() {
            due_at = Some(now + LINGER);
        }
        let due = closed
            || !flushes.is_empty()
            || pending.len() >= BATCH
            || due_at.is_some_and(|at| at <= now);
        if due {
            let delivered =
                pending.is_empty() || deliver(&platform, std::mem::take(&mut pending)).await;
            due_at = None;
            for w in flushes {
                let _ = w.send(delivered);
            }
        }
    }
}

impl EventSink {
    /// Starts the sink's task ([`forward`]).
    pub fn start(platform: PlatformClient) -> Self {
        let (tx, rx) = mpsc::channel::<SinkMsg>(SINK_CAPACITY);
        tokio::spawn(forward(platform, rx));
        EventSink { tx }
    }

    /// Queues an event; never blocks the request path.
    pub fn send(&self, event: RunEvent) {
        if self.tx.try_send(SinkMsg::Event(Box::new(event))).is_err() {
            tracing::error!("event sink is full or closed: an event was dropped");
        }
    }

    /// Waits until every event queued before this call was handed to the
    /// platform; `false` if some of them could not be.
    pub async fn flush(&self) -> bool {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(SinkMsg::Flush(tx)).await.is_err() {
            return false;
        }
        rx.await.unwrap_or(false)
    }
}
