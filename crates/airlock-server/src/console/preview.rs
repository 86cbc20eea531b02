//! Agents' HTML previews (spec: "Agent HTML previews"). A run whose result
//! is HTML ([`airlock_api::v1::html_result`]) is shown by the console only
//! inside `<iframe sandbox="allow-scripts">` (no `allow-same-origin`: the
//! preview runs in an opaque origin, with no cookie, storage or DOM of the
//! console's), loaded from a short-lived signed URL ([`url`]; the
//! signature names the run, as an artifact's download URL does).
//!
//! Where: `USERCONTENT_URL` when set, an origin of its own (its own cookie
//! jar and storage partition when it is another registrable domain),
//! served by this process on `USERCONTENT_LISTEN` ([`serve`]) and not on
//! the API's listener; unset, this server under [`PATH_PREFIX`].
//!
//! What an answer is decided by how it was asked for ([`rendered`]): only
//! a frame's load (`Sec-Fetch-Dest: iframe`, a header page scripts cannot
//! set) gets `text/html`; anything else, a top-level navigation included,
//! gets the source as `text/plain`. Every answer also carries
//! `Content-Security-Policy: sandbox allow-scripts` (so even a browser
//! that rendered it at the top level would give it an opaque origin), no
//! network (`default-src 'none'`, only its own inline script and style),
//! and no form targets.

use airlock_api::v1;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse as _, Response};
use axum::routing::get;
use serde::Deserialize;

use crate::error::{ApiError, ApiResult};
use crate::extract::{Path, Query};
use crate::routes::runs;
use crate::state::AppState;

/// Where previews are served when they have no origin of their own.
pub const PATH_PREFIX: &str = "/usercontent";

/// Every preview's policy: a sandbox with scripts only, no network.
pub const POLICY: &str = "sandbox allow-scripts; default-src 'none'; \
     script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; \
     form-action 'none'; base-uri 'none'";

/// What a run id is escaped with in a URL's path (its `_` kept).
const SEGMENT: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'_').remove(b'-');

/// What a preview's signature names.
fn resource(run_id: &str) -> String {
    format!("preview/{run_id}")
}

/// The signed URL of `run_id`'s preview, valid `ARTIFACT_URL_SECONDS`:
/// absolute on `USERCONTENT_URL` when set, else relative to this server.
pub fn url(app: &AppState, run_id: &str) -> String {
    let cfg = app.cfg();
    let s = cfg.downloads.sign(
        &resource(run_id),
        super::operator::now_s(),
        cfg.download_ttl,
    );
    let origin = cfg
        .console
        .usercontent
        .as_ref()
        .map_or("", |u| u.origin.as_str());
    let id = percent_encoding::utf8_percent_encode(run_id, SEGMENT);
    format!(
        "{origin}{PATH_PREFIX}/runs/{id}/preview?expires={}&signature={}",
        s.expires, s.signature
    )
}

pub fn router() -> axum::Router<AppState> {
    axum::Router::new().route(&format!("{PATH_PREFIX}/runs/{{id}}/preview"), get(answer))
}

/// Serves the previews alone on `listener` (`USERCONTENT_LISTEN`) until the
/// process ends.
pub async fn serve(listener: tokio::net::TcpListener, app: AppState) {
    crate::serve::serve_apart(listener, router().with_state(app)).await;
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Signed {
    expires: i64,
    signature: String,
}

/// Whether the request is a frame's load: the one case a preview is
/// rendered as HTML.
pub fn rendered(headers: &HeaderMap) -> bool {
    headers
        .get("sec-fetch-dest")
        .is_some_and(|v| v.as_bytes() == b"iframe")
}

async fn answer(
    State(app): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<Signed>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    crate::routes::artifacts::check_signature(&app, &resource(&id), q.expires, q.signature)?;
    let result = runs::result_of(&app, &id).await?;
    let html = result
        .as_ref()
        .and_then(v1::html_result)
        .ok_or_else(|| ApiError::not_found("preview"))?
        .to_owned();
    let content_type = if rendered(&headers) {
        "text/html; charset=utf-8"
    } else {
        "text/plain; charset=utf-8"
    };
    let mut res = html.into_response();
    let h = res.headers_mut();
    for (k, v) in [
        (header::CONTENT_TYPE, content_type),
        (header::CONTENT_SECURITY_POLICY, POLICY),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::CACHE_CONTROL, "no-store"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::VARY, "Sec-Fetch-Dest"),
    ] {
        h.insert(k, HeaderValue::from_static(v));
    }
    Ok(res)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_frames_load_is_rendered() {
        let mut h = HeaderMap::new();
        assert!(!rendered(&h), "no header: text");
        for dest in ["document", "empty", "script", "IFRAME", "iframe "] {
            h.insert("sec-fetch-dest", HeaderValue::from_static(dest));
            assert!(!rendered(&h), "{dest}");
        }
        h.insert("sec-fetch-dest", HeaderValue::from_static("iframe"));
        assert!(rendered(&h));
    }

    #[test]
    fn the_policy_sandboxes_without_the_origin_and_the_network() {
        assert!(POLICY.starts_with("sandbox allow-scripts;"));
        assert!(!POLICY.contains("allow-same-origin"));
        assert!(!POLICY.contains("allow-top-navigation"));
        assert!(!POLICY.contains("allow-forms"));
        assert!(POLICY.contains("default-src 'none'"));
        assert!(POLICY.contains("form-action 'none'"));
    }
}
