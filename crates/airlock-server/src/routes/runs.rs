//! Runs: queued by `POST /v1/runs`, started in order by whichever replica
//! has a free slot, followed live through Server-Sent Events.

use std::convert::Infallible;
use std::time::Duration;

use airlock_api::v1;
use airlock_platform::manifest::Manifest;
use airlock_store::{CancelOutcome, NewQueuedRun, Run, RunQuery, RunStatus};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{self, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt as _;

use airlock_platform_api::files::{MAX_INPUT_BYTES, MAX_INPUT_FILE_BYTES, MAX_INPUT_FILES};

use crate::auth::Tenant;
use crate::error::{ApiError, ApiResult, BodyFailures, KeyedFailures, WriteFailures};
use crate::extract::{Json, Path, Query};
use crate::state::AppState;

/// Largest prompt accepted.
pub const MAX_PROMPT: usize = 256 * 1024;
/// The run-creation route's body limit, above the API's 1 MiB: its body
/// may carry input files of [`MAX_INPUT_BYTES`] (4 MiB) and a prompt,
/// which JSON escaping can nearly double; so any body within the files'
/// and the prompt's own caps arrives and is judged by them (a typed 413
/// naming which) rather than cut at the transport.
pub const MAX_BODY: usize = 2 * (MAX_INPUT_BYTES + MAX_PROMPT);
/// How often a live event stream looks for new events.
const STREAM_POLL: Duration = Duration::from_millis(150);
/// How often a live event stream checks that its API key is still live: a
/// key revoked (through another replica, or `airlock orgs revoke-key`)
/// while its stream is open reads nothing more after this. A key revoked
/// through this replica is checked at once.
const KEY_RECHECK: Duration = Duration::from_millis(250);

/// Queues a run of an agent; it starts when a slot is free.
#[utoipa::path(
    post,
    path = "/v1/runs",
    operation_id = "create_run",
    tag = "runs",
    security(("apiKey" = [])),
    request_body = v1::NewRun,
    responses(
        (status = 202, description = "queued (queue_position: how many queued runs are ahead)", body = v1::Run),
        (status = 403, description = "quota_exceeded: the organization is over ORG_MAX_STORED_BYTES; nothing was queued", body = v1::Error),
        (status = 429, description = "queue_full: the organization has ORG_MAX_QUEUED_RUNS runs queued; nothing was queued (Retry-After)", body = v1::Error),
        (status = 404, description = "not_found: no such agent in the caller's organization", body = v1::Error),
        BodyFailures,
        WriteFailures,
        KeyedFailures,
        // After BodyFailures: these are the ones documented.
        (status = 413, description = "too_large: the prompt is longer than 256 KiB, an input file than 1 MiB, the input files than 4 MiB together, or the body than 9 MiB", body = v1::Error),
        (status = 422, description = "invalid: a field, a limit, an input file's path (as a bundle's: relative, no . or .. segment) or count (at most 64), the agent's manifest, or a connection it names that is not stored", body = v1::Error),
    ),
)]
pub async fn create(
    State(app): State<AppState>,
    t: Tenant,
    Json(b): Json<v1::NewRun>,
) -> ApiResult<Response> {
    if b.prompt.as_ref().is_some_and(|p| p.len() > MAX_PROMPT) {
        return Err(ApiError::too_large(format!(
            "the prompt is longer than {MAX_PROMPT} bytes"
        )));
    }
    check_inputs(&b.files)?;
    if let Some(h) = &b.limits {
        // The manifest's own checks: what a manifest may not ask for, an
        // API run may not either.
        if let Some(m) = h.memory_mb {
            airlock_platform::manifest::check_memory_mb(m)
                .map_err(|e| ApiError::invalid(format!("limits.memory_mb: {e}")))?;
        }
        if let Some(c) = h.cpus {
            airlock_platform::manifest::check_cpus(c)
                .map_err(|e| ApiError::invalid(format!("limits.cpus: {e}")))?;
        }
        if h.timeout_seconds == Some(0) {
            return Err(ApiError::invalid(
                "limits.timeout_seconds must be at least 1",
            ));
        }
    }
    let agent = app
        .store()
        .get_agent(&t.org_id, &b.agent)
        .await?
        .ok_or_else(|| ApiError::not_found("agent"))?;
    // What can be checked before the run is queued is checked now: the
    // manifest, and that every connection it names is stored.
    let m = Manifest::parse(&agent.manifest)
        .map_err(|e| ApiError::invalid(format!("the agent's manifest: {e}")))?;
    for (who, name) in m.connections() {
        if app
            .store()
            .get_connection(&t.org_id, name.as_str())
            .await?
            .is_none()
        {
            return Err(ApiError::invalid(format!(
                "{who}: connection {:?} is not stored in this organization (POST /v1/connections)",
                name.as_str()
            )));
        }
    }
    // An organization over its stored-bytes quota (as the leader last
    // measured it) gets no new run until retention brings it back under.
    app.store()
        .check_stored_bytes(&t.org_id, app.cfg().quotas.stored_bytes)
        .await?;
    let id = format!(
        "run_{}",
        airlock_vault::random_hex::<8>().map_err(ApiError::internal)?
    );
    let inputs = (!b.files.is_empty())
        .then(|| serde_json::to_string(&b.files))
        .transpose()
        .map_err(ApiError::internal)?;
    let hints = b
        .limits
        .map(|h| serde_json::to_string(&h))
        .transpose()
        .map_err(ApiError::internal)?;
    app.store()
        .enqueue_run(&NewQueuedRun {
            org: &t.org_id,
            id: &id,
            agent: &b.agent,
            backend: app.orch().backend.name(),
            model: m.model.as_ref().map(|x| x.provider.as_str()),
            prompt: b.prompt.as_deref(),
            hints: hints.as_deref(),
            inputs: inputs.as_deref(),
            max_queued: app.cfg().quotas.queued_runs,
        })
        .await
        .map_err(queue_full)?;
    app.kick_scheduler();
    let run = app
        .store()
        .get_run_in(&t.org_id, &id)
        .await?
        .ok_or_else(|| ApiError::internal("a queued run vanished"))?;
    let pos = app.store().queue_position(&id).await?;
    Ok((StatusCode::ACCEPTED, axum::Json(v1::Run::of(&run, pos))).into_response())
}

/// The organization's queue is full: a 429 to retry once runs have started.
fn queue_full(e: airlock_store::StoreError) -> ApiError {
    match e {
        airlock_store::StoreError::QuotaExceeded {
            what: "queued runs",
            limit,
        } => ApiError {
            retry_after: Some(5),
            ..ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "queue_full",
                format!(
                    "the organization has {limit} runs queued (ORG_MAX_QUEUED_RUNS); nothing was queued: retry once some have started"
                ),
            )
        },
        e => ApiError::from(e),
    }
}

/// A run's input files: their paths as a bundle's, their count and sizes
/// within the caps.
fn check_inputs(files: &std::collections::BTreeMap<String, String>) -> ApiResult<()> {
    if files.len() > MAX_INPUT_FILES {
        return Err(ApiError::invalid(format!(
            "at most {MAX_INPUT_FILES} input files"
        )));
    }
    let mut total = 0usize;
    for (p, body) in files {
        crate::bundle::check_path(p)?;
        if p == ".airlock" || p.starts_with(".airlock/") {
            return Err(ApiError::invalid(format!(
                "file path {p:?}: the workspace's .airlock directory is the runtime's"
            )));
        }
        if body.len() > MAX_INPUT_FILE_BYTES {
            return Err(ApiError::too_large(format!(
                "input file {p:?} is larger than {MAX_INPUT_FILE_BYTES} bytes"
            )));
        }
        total += body.len();
    }
    if total > MAX_INPUT_BYTES {
        return Err(ApiError::too_large(format!(
            "the input files hold more than {MAX_INPUT_BYTES} bytes"
        )));
    }
    Ok(())
}

/// Runs, newest first (status, agent, limit, cursor).
#[utoipa::path(
    get,
    path = "/v1/runs",
    operation_id = "list_runs",
    tag = "runs",
    security(("apiKey" = [])),
    params(v1::RunsQuery),
    responses(
        (status = 200, description = "one page of runs, newest first", body = v1::RunList),
        (status = 400, description = "bad_request: the query is malformed, a status unknown, or limit out of range", body = v1::Error),
        KeyedFailures,
    ),
)]
pub async fn list(
    State(app): State<AppState>,
    t: Tenant,
    Query(q): Query<v1::RunsQuery>,
) -> ApiResult<axum::Json<v1::RunList>> {
    let limit = super::page_limit(q.limit)?;
    let status = q
        .status
        .as_deref()
        .map(|s| {
            RunStatus::parse(s).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "status {s:?} is not one of {}",
                    RunStatus::ALL.map(RunStatus::as_str).join(", ")
                ))
            })
        })
        .transpose()?;
    let cursor = super::page_cursor(q.cursor.as_deref())?;
    let runs = app
        .store()
        .list_runs(&RunQuery {
            org: Some(&t.org_id),
            status,
            agent: q.agent.as_deref(),
            before: cursor.as_ref().map(|c| c.created_at),
            before_id: cursor.as_ref().map(|c| c.id.as_str()),
            limit: Some(limit),
        })
        .await?;
    let next_cursor = super::next_cursor(&runs, limit, |r| (r.created_at, r.id.as_str()));
    let pending = pending_approvals(&app, &t, &runs).await?;
    Ok(axum::Json(v1::RunList {
        next_cursor,
        runs: runs
            .iter()
            .map(|r| v1::Run::of(r, None).with_pending(&pending))
            .collect(),
    }))
}

/// How many requests each running run of `runs` holds for a person (read
/// only when one of them is running).
async fn pending_approvals(
    app: &AppState,
    t: &Tenant,
    runs: &[Run],
) -> ApiResult<std::collections::HashMap<String, i64>> {
    if !runs.iter().any(|r| r.status == RunStatus::Running) {
        return Ok(Default::default());
    }
    Ok(app.store().pending_approval_counts(&t.org_id).await?)
}

pub(crate) async fn the_run(app: &AppState, t: &Tenant, id: &str) -> ApiResult<Run> {
    app.store()
        .get_run_in(&t.org_id, id)
        .await?
        .ok_or_else(|| ApiError::not_found("run"))
}

/// One run (queue_position while queued, pending_approvals while running).
#[utoipa::path(
    get,
    path = "/v1/runs/{id}",
    operation_id = "get_run",
    tag = "runs",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "the run's id")),
    responses(
        (status = 200, description = "the run", body = v1::Run),
        (status = 400, description = "bad_request: the path is malformed", body = v1::Error),
        (status = 404, description = "not_found: no such run in the caller's organization", body = v1::Error),
        KeyedFailures,
    ),
)]
pub async fn get(
    State(app): State<AppState>,
    t: Tenant,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<v1::Run>> {
    let run = the_run(&app, &t, &id).await?;
    let pos = if run.status == RunStatus::Queued {
        app.store().queue_position(&id).await?
    } else {
        None
    };
    let pending = pending_approvals(&app, &t, std::slice::from_ref(&run)).await?;
    Ok(axum::Json(v1::Run::of(&run, pos).with_pending(&pending)))
}

/// Cancels a queued or running run (409 when it has ended).
#[utoipa::path(
    post,
    path = "/v1/runs/{id}/cancel",
    operation_id = "cancel_run",
    tag = "runs",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "the run's id")),
    responses(
        (status = 202, description = "cancelled if queued; else its replica stops it, its end naming this key", body = v1::Run),
        (status = 400, description = "bad_request: the path is malformed", body = v1::Error),
        (status = 404, description = "not_found: no such run in the caller's organization", body = v1::Error),
        (status = 409, description = "conflict: the run has already ended", body = v1::Error),
        WriteFailures,
        KeyedFailures,
    ),
)]
pub async fn cancel(
    State(app): State<AppState>,
    t: Tenant,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    // Its end says who asked: the API key, by id (never "the operator").
    let reason = format!("cancelled through the API with key {}", t.key_id);
    match app.orch().cancel_run(&t.org_id, &id, &reason).await? {
        CancelOutcome::NotFound => return Err(ApiError::not_found("run")),
        CancelOutcome::AlreadyEnded(s) => {
            return Err(ApiError::conflict(format!(
                "the run has already ended ({s})"
            )));
        }
        // Ended: its webhooks were queued with its end, and their sender told.
        CancelOutcome::CancelledQueued => {}
        // Its replica stops it: at once when it is this one, else within
        // its cancel poll.
        CancelOutcome::Requested => {
            app.cancel_local(&id, &reason);
        }
    }
    let run = the_run(&app, &t, &id).await?;
    Ok((StatusCode::ACCEPTED, axum::Json(v1::Run::of(&run, None))).into_response())
}

/// Tokens and cost metered by the run's model relay.
#[utoipa::path(
    get,
    path = "/v1/runs/{id}/cost",
    operation_id = "get_run_cost",
    tag = "runs",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "the run's id")),
    responses(
        (status = 200, description = "the run's metered usage so far, and each call with the key that paid", body = v1::RunCost),
        (status = 400, description = "bad_request: the path is malformed", body = v1::Error),
        (status = 404, description = "not_found: no such run in the caller's organization", body = v1::Error),
        KeyedFailures,
    ),
)]
pub async fn cost(
    State(app): State<AppState>,
    t: Tenant,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<v1::RunCost>> {
    let run = the_run(&app, &t, &id).await?;
    let costs = app.store().events_of_kind(&id, "cost", 10_000).await?;
    let payers = app
        .store()
        .events_of_kind(&id, airlock_platform::provider_keys::PAYER_EVENT, 10_000)
        .await?;
    Ok(axum::Json(v1::RunCost::of(&run, &costs, &payers)))
}

/// Every request that left the run's sandbox, and every refusal.
#[utoipa::path(
    get,
    path = "/v1/runs/{id}/egress",
    operation_id = "list_run_egress",
    tag = "runs",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "the run's id"), v1::LimitQuery),
    responses(
        (status = 200, description = "the run's egress log, in order", body = v1::EgressLog),
        (status = 400, description = "bad_request: the query or path is malformed", body = v1::Error),
        (status = 404, description = "not_found: no such run in the caller's organization", body = v1::Error),
        KeyedFailures,
    ),
)]
pub async fn egress(
    State(app): State<AppState>,
    t: Tenant,
    Path(id): Path<String>,
    Query(q): Query<v1::LimitQuery>,
) -> ApiResult<axum::Json<v1::EgressLog>> {
    let limit = q.limit.unwrap_or(1000).clamp(1, 10_000);
    the_run(&app, &t, &id).await?;
    let log = app.store().list_egress(&id, limit).await?;
    Ok(axum::Json(v1::EgressLog {
        egress: log.iter().map(v1::EgressRecord::from).collect(),
    }))
}

/// The run's last reported result.
#[utoipa::path(
    get,
    path = "/v1/runs/{id}/result",
    operation_id = "get_run_result",
    tag = "runs",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "the run's id")),
    responses(
        (status = 200, description = "the result event the run reported last, as JSON"),
        (status = 400, description = "bad_request: the path is malformed", body = v1::Error),
        (status = 404, description = "not_found: no such run in the caller's organization, or it reported no result", body = v1::Error),
        KeyedFailures,
    ),
)]
pub async fn result(
    State(app): State<AppState>,
    t: Tenant,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    let payload = last_result(&app, &t, &id)
        .await?
        .ok_or_else(|| ApiError::not_found("result"))?;
    Ok(axum::Json(payload).into_response())
}

/// The result the run `id` of `t`'s organization reported last (`None`:
/// none yet); a run of another organization is not found.
pub async fn last_result(
    app: &AppState,
    t: &Tenant,
    id: &str,
) -> ApiResult<Option<serde_json::Value>> {
    the_run(app, t, id).await?;
    result_of(app, id).await
}

/// The result the run `id` reported last, whoever asks: only for a caller
/// that has already established its right to the run (its organization, or
/// a signature naming it).
pub async fn result_of(app: &AppState, id: &str) -> ApiResult<Option<serde_json::Value>> {
    let Some(e) = app.store().last_event_of_kind(id, "result").await? else {
        return Ok(None);
    };
    serde_json::from_str(&e.payload)
        .map(Some)
        .map_err(ApiError::internal)
}

/// A large result the run stored, with its content type.
#[utoipa::path(
    get,
    path = "/v1/runs/{id}/results/{result_id}",
    operation_id = "get_result",
    tag = "runs",
    security(("apiKey" = [])),
    params(
        ("id" = String, Path, description = "the run's id"),
        ("result_id" = String, Path, description = "the stored result's id"),
    ),
    responses(
        (status = 200, description = "the stored bytes, under the content type they were stored with (and X-Content-Type-Options: nosniff)"),
        (status = 400, description = "bad_request: the path is malformed", body = v1::Error),
        (status = 404, description = "not_found: no such run in the caller's organization, or no such result of it", body = v1::Error),
        KeyedFailures,
    ),
)]
pub async fn stored_result(
    State(app): State<AppState>,
    t: Tenant,
    Path((id, rid)): Path<(String, String)>,
) -> ApiResult<Response> {
    the_run(&app, &t, &id).await?;
    let r = app
        .store()
        .get_result(&id, &rid)
        .await?
        .ok_or_else(|| ApiError::not_found("result"))?;
    let ct = http::HeaderValue::from_str(&r.content_type)
        .unwrap_or(http::HeaderValue::from_static("application/octet-stream"));
    Ok((
        [
            (header::CONTENT_TYPE, ct),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                http::HeaderValue::from_static("nosniff"),
            ),
        ],
        r.body,
    )
        .into_response())
}

fn wants_stream(h: &HeaderMap) -> bool {
    h.get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"))
}

fn last_event_id(h: &HeaderMap) -> Result<Option<i64>, ApiError> {
    h.get("last-event-id")
        .map(|v| {
            v.to_str()
                .ok()
                .and_then(|s| s.trim().parse::<i64>().ok())
                .ok_or_else(|| ApiError::bad_request("Last-Event-ID is not an event id"))
        })
        .transpose()
}

/// One SSE event's data: an answer type's JSON (plain data: serializing it
/// cannot fail).
fn json_text<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// Which events a view shows: every kind but heartbeats, or only logs
/// (with the counts of the lines shed).
#[derive(Clone, Copy)]
enum View {
    Events,
    Logs,
}

impl View {
    fn shows(self, kind: &str) -> bool {
        match self {
            View::Events => kind != "heartbeat",
            // The count of shed lines belongs with the lines kept.
            View::Logs => kind == "log" || kind == "shed",
        }
    }
}

/// What `/events` and `/logs` can answer besides a page or a stream (and
/// [`KeyedFailures`]).
#[derive(utoipa::IntoResponses)]
pub enum FeedFailures {
    /// bad_request: the query, the path or Last-Event-ID is malformed, or
    /// limit is out of range
    #[response(status = 400)]
    Malformed(v1::Error),
    /// not_found: no such run in the caller's organization
    #[response(status = 404)]
    NotFound(v1::Error),
    /// rate_limited: too many requests with this key, or (a stream) the
    /// organization has API_MAX_STREAMS streams open on this replica
    #[response(status = 429)]
    RateLimited(v1::Error),
}

/// The run's events: JSON (after, limit), or Server-Sent Events with Accept: text/event-stream (resume with Last-Event-ID); the stream ends with an `end` event.
///
/// A stream's events carry an Event each (the SSE id is its id, the SSE
/// event its kind); the last is `end`, carrying the Run, or `error`,
/// carrying an Error (the key was revoked: `unauthorized`; the replica
/// shuts down: `unavailable`, reconnect with Last-Event-ID).
#[utoipa::path(
    get,
    path = "/v1/runs/{id}/events",
    operation_id = "stream_run_events",
    tag = "runs",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "the run's id"), v1::EventsQuery),
    responses(
        (status = 200, description = "one page of events (every kind but heartbeats), or a live stream", content(
            (v1::EventPage = "application/json"),
            (String = "text/event-stream"),
        )),
        KeyedFailures,
        // After KeyedFailures: its 429 is the one documented.
        FeedFailures,
    ),
)]
pub async fn events(
    State(app): State<AppState>,
    t: Tenant,
    Path(id): Path<String>,
    Query(q): Query<v1::EventsQuery>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    feed(app, t, id, q, headers, View::Events).await
}

/// The run's log events only, as /events.
#[utoipa::path(
    get,
    path = "/v1/runs/{id}/logs",
    operation_id = "get_run_logs",
    tag = "runs",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "the run's id"), v1::EventsQuery),
    responses(
        (status = 200, description = "one page of log events (and counts of lines shed), or a live stream", content(
            (v1::EventPage = "application/json"),
            (String = "text/event-stream"),
        )),
        KeyedFailures,
        // After KeyedFailures: its 429 is the one documented.
        FeedFailures,
    ),
)]
pub async fn logs(
    State(app): State<AppState>,
    t: Tenant,
    Path(id): Path<String>,
    Query(q): Query<v1::EventsQuery>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    feed(app, t, id, q, headers, View::Logs).await
}

async fn feed(
    app: AppState,
    t: Tenant,
    id: String,
    q: v1::EventsQuery,
    headers: HeaderMap,
    view: View,
) -> ApiResult<Response> {
    the_run(&app, &t, &id).await?;
    let after = last_event_id(&headers)?.or(q.after).unwrap_or(0);
    if !wants_stream(&headers) {
        let limit = super::page_limit(q.limit)?;
        let evs = app.store().list_events(&id, after, limit).await?;
        let next = evs.last().map_or(after, |e| e.id);
        return Ok(axum::Json(v1::EventPage {
            events: evs
                .iter()
                .filter(|e| view.shows(&e.kind))
                .map(v1::Event::from)
                .collect(),
            next_after: next,
        })
        .into_response());
    }
    let Some(slot) = app.open_stream(&t.org_id) else {
        let mut e = ApiError::too_many(5);
        e.message = format!(
            "this organization has {} event streams open on this server; close one",
            app.cfg().max_streams
        );
        return Err(e);
    };
    let live = LiveFeed {
        revocations: app.revocations(),
        app,
        id,
        key_id: t.key_id,
        after,
        view,
        done: false,
        key_checked: std::time::Instant::now(),
        _slot: slot,
    };
    let stream = futures_util::stream::unfold(live, |mut live| async move {
        live.next().await.map(|events| (events, live))
    })
    .flat_map(|v| futures_util::stream::iter(v.into_iter().map(Ok::<_, Infallible>)));
    Ok(Sse::new(stream)
        .keep_alive(sse::KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}

/// A live stream: every stored event after `after`, as it is stored; once
/// the run has ended and nothing is left, an `end` event with the run's
/// final state, then the stream closes. Each event's SSE id is its store
/// id, so a client that reconnects with `Last-Event-ID` resumes.
struct LiveFeed {
    app: AppState,
    id: String,
    key_id: String,
    after: i64,
    view: View,
    done: bool,
    key_checked: std::time::Instant,
    revocations: u64,
    _slot: crate::state::StreamSlot,
}

/// What a stream's key check found.
enum KeyCheck {
    Live,
    Revoked,
    /// Not checked: the store is not answering.
    Unknown,
}

/// Where a stream with nothing new stands.
enum Tail {
    /// The run has ended and every event was sent: the `end` event.
    End(sse::Event),
    /// The run has ended, with events stored since the last read.
    EventsLeft,
    /// The run goes on (or the store did not say).
    Going,
}

/// The stream's last event when it is cut short: the API's error type.
fn error_event(code: &str, message: &str) -> sse::Event {
    sse::Event::default()
        .event("error")
        .data(json_text(&v1::Error::new(code, message)))
}

impl LiveFeed {
    /// The next events to send; `None` once the stream has ended.
    async fn next(&mut self) -> Option<Vec<sse::Event>> {
        if self.done {
            return None;
        }
        loop {
            match self.check_key().await {
                KeyCheck::Live => {}
                KeyCheck::Revoked => {
                    self.done = true;
                    let e = error_event(
                        "unauthorized",
                        "the API key this stream was opened with was revoked; the stream is closed",
                    );
                    return Some(vec![e]);
                }
                // Nothing sent: its events could not be read either.
                KeyCheck::Unknown => {
                    tokio::time::sleep(STREAM_POLL).await;
                    continue;
                }
            }
            if self.app.is_closing() {
                self.done = true;
                let e = error_event(
                    "unavailable",
                    "this replica is shutting down; reconnect with Last-Event-ID to resume",
                );
                return Some(vec![e]);
            }
            let evs = match self
                .app
                .store()
                .list_events(&self.id, self.after, 200)
                .await
            {
                Ok(e) => e,
                Err(e) => {
                    self.app.store_watch().failed("an event stream", &e);
                    tokio::time::sleep(STREAM_POLL).await;
                    continue;
                }
            };
            if let Some(last) = evs.last() {
                self.after = last.id;
                let view = self.view;
                let out: Vec<sse::Event> = evs
                    .iter()
                    .filter(|e| view.shows(&e.kind))
                    .map(|e| {
                        sse::Event::default()
                            .id(e.id.to_string())
                            .event(e.kind.clone())
                            .data(json_text(&v1::Event::from(e)))
                    })
                    .collect();
                if !out.is_empty() {
                    return Some(out);
                }
                continue;
            }
            match self.end().await {
                Tail::End(end) => return Some(vec![end]),
                Tail::EventsLeft => continue,
                Tail::Going => tokio::time::sleep(STREAM_POLL).await,
            }
        }
    }

    /// The key that opened the stream, checked again at least every
    /// KEY_RECHECK and whenever a key was revoked through this replica:
    /// revoked (or its organization gone), the stream ends with a typed
    /// error event and sends nothing more.
    async fn check_key(&mut self) -> KeyCheck {
        let revocations = self.app.revocations();
        if self.key_checked.elapsed() < KEY_RECHECK && revocations == self.revocations {
            return KeyCheck::Live;
        }
        match self.app.store().get_api_key(&self.key_id).await {
            Ok(Some(k)) if k.revoked_at.is_none() => {
                self.key_checked = std::time::Instant::now();
                self.revocations = revocations;
                KeyCheck::Live
            }
            Ok(_) => KeyCheck::Revoked,
            Err(e) => {
                self.app
                    .store_watch()
                    .failed("checking a stream's API key", &e);
                KeyCheck::Unknown
            }
        }
    }

    /// Nothing new: has the run ended? (Read after the events: an event
    /// stored before the end is never missed.)
    async fn end(&mut self) -> Tail {
        let run = match self.app.store().get_run(&self.id).await {
            Ok(Some(run)) if run.status.is_terminal() => run,
            _ => return Tail::Going,
        };
        let tail = self.app.store().list_events(&self.id, self.after, 1).await;
        if !tail.is_ok_and(|t| t.is_empty()) {
            return Tail::EventsLeft;
        }
        self.done = true;
        Tail::End(
            sse::Event::default()
                .event("end")
                .data(json_text(&v1::Run::of(&run, None))),
        )
    }
}
