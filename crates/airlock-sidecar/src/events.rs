//! `POST /events`: what the runtime reports (heartbeats, log lines, the
//! result, how many lines it shed), kept as [`crate::keep`] decides. Cost,
//! egress and refusal counts are the sidecar's own and are refused from the
//! agent side: it could forge them.
//!
//! The agent's end is answered `202` only once it is kept (in the run's
//! journal): a `503` tells the runtime to send it again. Once kept, the
//! platform is told ([`airlock_platform_api::wire::ENDED_PATH`]).

use std::sync::Arc;

use airlock_platform_api::wire::{EventBatch, RunEvent};
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::json;

use crate::state::Sidecar;

/// Most events in one request.
pub const MAX_EVENTS_PER_REQUEST: usize = 1000;

pub async fn ingest(State(sidecar): State<Arc<Sidecar>>, body: Bytes) -> Response {
    let batch: EventBatch = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => return bad_request(format!("body is not an event batch: {e}")),
    };
    if batch.events.len() > MAX_EVENTS_PER_REQUEST {
        return bad_request(format!(
            "more than {MAX_EVENTS_PER_REQUEST} events in one request"
        ));
    }
    if let Some(bad) = batch.events.iter().find(|e| {
        matches!(
            e,
            RunEvent::Cost(_)
                | RunEvent::Egress(_)
                | RunEvent::Refusals { .. }
                | RunEvent::ToolExcluded { .. }
        )
    }) {
        let kind = bad.kind();
        return (
            StatusCode::FORBIDDEN,
            Json(json!({"error": "forbidden_event", "message": format!("{kind} events are recorded by the sidecar, not reported by the runtime")})),
        )
            .into_response();
    }
    let n = batch.events.len();
    for e in batch.events {
        match e {
            RunEvent::Log { .. } => sidecar.keep.log(e),
            RunEvent::Shed { lines, bytes, .. } => sidecar.keep.shed(lines, bytes),
            RunEvent::Result { .. } => {
                // What was shed before the end is counted before it.
                sidecar.keep.report_shed();
                if let Err(e) = sidecar.keep.vital(e) {
                    return (
                        StatusCode::SERVICE_UNAVAILABLE,
                        Json(json!({"error": "not_kept", "message": e.to_string()})),
                    )
                        .into_response();
                }
                // Kept: the platform may end the run now, without waiting
                // for the sandbox's exit to be reported. Off the answer's
                // path; should the word not arrive, the platform ends the
                // run at the sandbox's exit, as it would without it.
                let platform = sidecar.platform.clone();
                tokio::spawn(async move {
                    if let Err(e) = platform.ended().await {
                        tracing::warn!("the platform was not told the agent's end is kept: {e}");
                    }
                });
            }
            other => sidecar.events.send(other),
        }
    }
    (StatusCode::ACCEPTED, Json(json!({"accepted": n}))).into_response()
}

fn bad_request(message: String) -> Response {
    (
        StatusCode::BAD_REQUEST,
        Json(json!({"error": "bad_request", "message": message})),
    )
        .into_response()
}
