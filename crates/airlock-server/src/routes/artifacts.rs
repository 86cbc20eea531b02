//! A run's artifacts: the files its agent left in its output directory
//! (`agent.outputs`), listed with a short-lived signed download URL each.
//!
//! The download route takes no API key: the URL's signature
//! (`UPLOAD_SIGNING_SECRET`, [`airlock_vault::UrlSigner`]) names the run,
//! the path and the expiry, and is verified (constant-time) before anything
//! is read, so a URL reads exactly one artifact until it expires, and
//! nothing without a valid one says whether a run or a path exists.

use airlock_api::v1;
use airlock_vault::{SignedUrlError, UrlSignature};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::auth::Tenant;
use crate::error::{ApiError, ApiResult, KeyedFailures};
use crate::extract::{Path, Query};
use crate::state::AppState;

/// What a download URL signs: the run and the artifact's path.
fn resource(run_id: &str, path: &str) -> String {
    format!("{run_id}/{path}")
}

fn now_s() -> i64 {
    airlock_store::now_ms() / 1000
}

/// The artifacts a run's agent left, each stored one with a signed URL.
#[utoipa::path(
    get,
    path = "/v1/runs/{id}/artifacts",
    operation_id = "list_run_artifacts",
    tag = "artifacts",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "the run's id")),
    responses(
        (status = 200, description = "every artifact recorded for the run, by path: stored ones with a download URL valid ARTIFACT_URL_SECONDS, refused ones with the reason", body = v1::ArtifactList),
        (status = 400, description = "bad_request: the path is malformed", body = v1::Error),
        (status = 404, description = "not_found: no such run in the caller's organization", body = v1::Error),
        KeyedFailures,
    ),
)]
pub async fn list(
    State(app): State<AppState>,
    t: Tenant,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<v1::ArtifactList>> {
    app.store()
        .get_run_in(&t.org_id, &id)
        .await?
        .ok_or_else(|| ApiError::not_found("run"))?;
    let rows = app.store().list_artifacts(&id).await?;
    let now = now_s();
    let cfg = app.cfg();
    let artifacts = rows
        .into_iter()
        .map(|a| {
            let signed = a.refused.is_none().then(|| {
                cfg.downloads
                    .sign(&resource(&id, &a.path), now, cfg.download_ttl)
            });
            v1::Artifact {
                bytes: a.bytes,
                created_at: a.created_at,
                download_url: signed.as_ref().map(|s| download_url(&id, &a.path, s)),
                download_expires_at: signed.map(|s| s.expires),
                path: a.path,
                refused: a.refused,
            }
        })
        .collect();
    Ok(axum::Json(v1::ArtifactList { artifacts }))
}

/// The download URL of `path` of `run_id`, relative to the server.
fn download_url(run_id: &str, path: &str, s: &UrlSignature) -> String {
    let q = |v: &str| {
        percent_encoding::utf8_percent_encode(v, percent_encoding::NON_ALPHANUMERIC).to_string()
    };
    format!(
        "/v1/runs/{}/artifacts/download?path={}&expires={}&signature={}",
        q(run_id),
        q(path),
        s.expires,
        s.signature
    )
}

/// One artifact's bytes, by a signed URL (no API key).
#[utoipa::path(
    get,
    path = "/v1/runs/{id}/artifacts/download",
    operation_id = "download_artifact",
    tag = "artifacts",
    params(("id" = String, Path, description = "the run's id"), v1::ArtifactDownload),
    responses(
        (status = 200, description = "the artifact's bytes (application/octet-stream, X-Content-Type-Options: nosniff)"),
        (status = 400, description = "bad_request: the path or the query is malformed", body = v1::Error),
        (status = 403, description = "signature_invalid: the signature is not this run's, path's and expiry's (or is malformed); signature_expired: the URL has expired", body = v1::Error),
        (status = 404, description = "not_found: the signature is valid but the artifact is no longer stored (retention)", body = v1::Error),
        (status = 500, description = "internal: the platform failed (its log has the cause)", body = v1::Error),
        (status = 503, description = "unavailable: the store does not answer", body = v1::Error),
    ),
)]
pub async fn download(
    State(app): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<v1::ArtifactDownload>,
) -> ApiResult<Response> {
    check_signature(&app, &resource(&id, &q.path), q.expires, q.signature)?;
    let (_, body) = app
        .store()
        .get_artifact(&id, &q.path)
        .await?
        .ok_or_else(|| ApiError::not_found("artifact"))?;
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response())
}

/// Whether a signed URL's `expires` and `signature` let its holder read
/// `resource` now (`UPLOAD_SIGNING_SECRET`): a 403 naming why not
/// (`signature_expired`, `signature_invalid`).
pub fn check_signature(
    app: &AppState,
    resource: &str,
    expires: i64,
    signature: String,
) -> ApiResult<()> {
    let sig = UrlSignature { expires, signature };
    app.cfg()
        .downloads
        .verify(resource, &sig, now_s())
        .map_err(refused)
}

fn refused(e: SignedUrlError) -> ApiError {
    let code = match e {
        SignedUrlError::Expired { .. } => "signature_expired",
        SignedUrlError::Malformed | SignedUrlError::TooLong | SignedUrlError::Mismatch => {
            "signature_invalid"
        }
    };
    ApiError::new(StatusCode::FORBIDDEN, code, e.to_string())
}
