//! Heartbeats, log lines and the result, batched to the sidecar's `/events`.

use std::time::Duration;

use airlock_platform_api::wire::{EventBatch, RunEvent};
use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use secrecy::{ExposeSecret, SecretString};

use crate::relay::Dial;
use tokio::sync::{mpsc, oneshot};

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

enum Msg {
    Event(Box<RunEvent>),
    Flush(oneshot::Sender<()>),
}

#[derive(Clone)]
pub struct Reporter {
    tx: mpsc::Sender<Msg>,
}

impl Reporter {
    pub fn start(socket: Dial, token: SecretString) -> Reporter {
        let (tx, mut rx) = mpsc::channel::<Msg>(4096);
        tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                let mut events = Vec::new();
                let mut waiters = Vec::new();
                let take =
                    |m: Msg, events: &mut Vec<RunEvent>, waiters: &mut Vec<oneshot::Sender<()>>| {
                        match m {
                            Msg::Event(e) => events.push(*e),
                            Msg::Flush(w) => waiters.push(w),
                        }
                    };
                take(first, &mut events, &mut waiters);
                // Gather what arrives in the next few milliseconds into one request.
                let deadline = tokio::time::Instant::now() + Duration::from_millis(20);
                while let Ok(Some(m)) = tokio::time::timeout_at(deadline, rx.recv()).await {
                    take(m, &mut events, &mut waiters);
                    if events.len() >= 500 {
                        break;
                    }
                }
                if !events.is_empty()
                    && let Err(e) = post(&socket, &token, events).await
                {
                    eprintln!("airlock runtime warning: events not delivered: {e}");
                }
                for w in waiters {
                    let _ = w.send(());
                }
            }
        });
        Reporter { tx }
    }

    pub fn send(&self, e: RunEvent) {
        let _ = self.tx.try_send(Msg::Event(Box::new(e)));
    }

    pub async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Msg::Flush(tx)).await.is_ok() {
            let _ = tokio::time::timeout(Duration::from_secs(10), rx).await;
        }
    }
}

async fn post(socket: &Dial, token: &SecretString, events: Vec<RunEvent>) -> Result<(), String> {
    let body = serde_json::to_vec(&EventBatch { events }).map_err(|e| e.to_string())?;
    let stream = socket.connect().await.map_err(|e| e.to_string())?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let req = Request::post("/events")
        .header("host", "sidecar")
        .header("content-type", "application/json")
        .header("x-airlock-sidecar-auth", token.expose_secret())
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    if !resp.status().is_success() {
        return Err(format!("sidecar answered {}", resp.status()));
    }
    Ok(())
}
