//! `GET /v1/runs/{id}/audit.jsonl`: a run's audit, every decision made for
//! it, one JSON object a line ([`v1::AuditRecord`], or its OCSF form).
//!
//! Contract: the answer streams from the store a page at a time
//! ([`AUDIT_PAGE`] rows of each table at most): however long the run, the
//! server never holds more than a page of it. A store failure after the
//! first byte ends the answer early (the client sees a body cut short, not
//! a line cut in two: each page is written whole).

use airlock_api::audit::AUDIT_PAGE;
use airlock_api::v1;
use airlock_store::{AuditCursor, AuditPage};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use crate::auth::Tenant;
use crate::error::{ApiResult, KeyedFailures};
use crate::extract::{Path, Query};
use crate::routes::runs::the_run;
use crate::state::AppState;

/// The media type of the answer: JSON Lines.
pub const JSONL: &str = "application/jsonl";

/// Every decision made for the run, oldest first.
#[utoipa::path(
    get,
    path = "/v1/runs/{id}/audit.jsonl",
    operation_id = "get_run_audit",
    tag = "runs",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "the run's id"), v1::AuditQuery),
    responses(
        (status = 200, description = "the run's audit, one record a line (application/jsonl): every egress decision on every path, refusals counted per host, tools an allowlist hid; with format=ocsf each network decision as an OCSF 1.1 event", body = v1::AuditRecord, content_type = "application/jsonl"),
        (status = 400, description = "bad_request: the query or path is malformed", body = v1::Error),
        (status = 404, description = "not_found: no such run in the caller's organization", body = v1::Error),
        KeyedFailures,
    ),
)]
pub async fn audit(
    State(app): State<AppState>,
    t: Tenant,
    Path(id): Path<String>,
    Query(q): Query<v1::AuditQuery>,
) -> ApiResult<Response> {
    the_run(&app, &t, &id).await?;
    let format = q.format.unwrap_or_default();
    // The first page is read before the answer starts: a store that does
    // not answer is a typed error, not an empty body.
    let first = app
        .store()
        .audit_page(&id, AuditCursor::default(), AUDIT_PAGE)
        .await?;
    let pages =
        futures_util::stream::unfold((Some(first), app, id), move |(page, app, id)| async move {
            let page = page?;
            let bytes = lines(&page, format);
            let next = match page.next {
                None => None,
                Some(cursor) => match app.store().audit_page(&id, cursor, AUDIT_PAGE).await {
                    Ok(p) => Some(p),
                    Err(e) => {
                        tracing::error!(run = %id, "audit export cut short: {e}");
                        return Some((Err(std::io::Error::other(e.to_string())), (None, app, id)));
                    }
                },
            };
            Some((Ok::<_, std::io::Error>(bytes), (next, app, id)))
        });
    Ok((
        [
            (header::CONTENT_TYPE, JSONL),
            (header::CACHE_CONTROL, "no-store"),
        ],
        Body::from_stream(pages),
    )
        .into_response())
}

/// A page's lines in `format`.
fn lines(page: &AuditPage, format: v1::AuditFormat) -> Bytes {
    let mut out = Vec::new();
    airlock_api::audit::write_lines(&page.entries, format, &mut out);
    Bytes::from(out)
}
