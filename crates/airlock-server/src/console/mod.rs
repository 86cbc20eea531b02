//! The operator's console (docs/console.md): server-rendered pages under
//! `/console` for an organization's runs, connections and usage, and the
//! agents' HTML previews.
//!
//! - [`session`]: who the browser is (a signed session cookie made from an
//!   API key) and the CSRF tokens of its forms.
//! - [`pages`]: the pages, rendered by [`render`]'s templates from the
//!   answers of the `/v1` handlers themselves ([`crate::routes`]): the
//!   console has no query of its own.
//! - [`data`]: the same `/v1` handlers under `/console/data`, for the
//!   pages' scripts (live logs over SSE, the runs list, the usage chart),
//!   authenticated by the session cookie instead of a bearer key. Reads
//!   only: every change goes through a form and its CSRF token.
//! - [`preview`]: agents' HTML results, served where they cannot act with
//!   the console's origin.
//!
//! Every console answer carries [`security_headers`]: a Content-Security-
//! Policy with no inline script or style (the pages' script and style are
//! files this server serves, [`assets`]), no framing, and frames only from
//! the previews' origin.

pub mod assets;
pub mod data;
pub mod operator;
pub mod pages;
pub mod preview;
pub mod render;
pub mod session;

use std::net::SocketAddr;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::Response;

use crate::state::AppState;

/// The previews' own origin (`USERCONTENT_URL`) and where this process
/// serves it (`USERCONTENT_LISTEN`).
pub const ENV_USERCONTENT_URL: &str = "USERCONTENT_URL";
pub const ENV_USERCONTENT_LISTEN: &str = "USERCONTENT_LISTEN";

/// The console's settings.
#[derive(Debug, Clone)]
pub struct ConsoleConfig {
    pub sessions: session::Sessions,
    /// Where previews are served from; `None`: this server, under
    /// [`preview::PATH_PREFIX`].
    pub usercontent: Option<Usercontent>,
}

/// A separate origin for previews: its URL (an origin: scheme, host,
/// port) and the address this process serves it on.
#[derive(Debug, Clone)]
pub struct Usercontent {
    pub origin: String,
    pub listen: SocketAddr,
}

impl ConsoleConfig {
    /// The origin previews are framed from, as a CSP source.
    fn frame_source(&self) -> &str {
        self.usercontent.as_ref().map_or("'self'", |u| &u.origin)
    }
}

/// A `USERCONTENT_URL` as an origin: http(s), a host, nothing after it.
pub fn usercontent_origin(v: &str) -> Result<String, String> {
    let url = url::Url::parse(v).map_err(|e| format!("{v:?} is not a URL: {e}"))?;
    let bare = matches!(url.scheme(), "https" | "http")
        && url.host_str().is_some_and(|h| !h.is_empty())
        && url.path() == "/"
        && url.query().is_none()
        && url.fragment().is_none()
        && url.username().is_empty()
        && url.password().is_none();
    if !bare {
        return Err(format!(
            "{v:?} is not an origin: an http(s) URL with a host and nothing after it, e.g. https://usercontent.example.net"
        ));
    }
    Ok(url.origin().ascii_serialization())
}

/// The console's routes, merged into the server's router: its pages and
/// data under the console's headers, and the previews (with headers of
/// their own) when they have no origin of their own.
pub fn router(app: &AppState) -> axum::Router<AppState> {
    let console = pages::router()
        .nest("/console/data", data::router(app))
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            security_headers,
        ));
    match app.cfg().console.usercontent {
        None => console.merge(preview::router()),
        Some(_) => console,
    }
}

/// The Content-Security-Policy of every console answer (a preview's is
/// its own, [`preview`]).
fn policy(frames: &str) -> String {
    format!(
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
         connect-src 'self'; frame-src {frames}; form-action 'self'; \
         frame-ancestors 'none'; base-uri 'none'"
    )
}

/// Adds the console's headers to an answer that has none of its own.
pub async fn security_headers(State(app): State<AppState>, req: Request, next: Next) -> Response {
    let mut res = next.run(req).await;
    let h = res.headers_mut();
    if !h.contains_key(header::CONTENT_SECURITY_POLICY) {
        let csp = policy(app.cfg().console.frame_source());
        if let Ok(v) = HeaderValue::from_str(&csp) {
            h.insert(header::CONTENT_SECURITY_POLICY, v);
        }
    }
    for (k, v) in [
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        h.entry(k).or_insert(HeaderValue::from_static(v));
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_allows_no_inline_code_and_frames_only_previews() {
        let p = policy("https://uc.example.net");
        assert!(!p.contains("unsafe"), "{p}");
        assert!(p.contains("script-src 'self';"));
        assert!(p.contains("frame-src https://uc.example.net;"));
        assert!(p.contains("frame-ancestors 'none'"));
    }

    #[test]
    fn usercontent_url_is_an_origin() {
        assert_eq!(
            usercontent_origin("https://uc.example.net").unwrap(),
            "https://uc.example.net"
        );
        assert_eq!(
            usercontent_origin("http://localhost:9000/").unwrap(),
            "http://localhost:9000"
        );
        for bad in [
            "uc.example.net",
            "ftp://uc.example.net",
            "https://uc.example.net/x",
            "https://u@uc.example.net",
            "https://uc.example.net/?a",
        ] {
            assert!(usercontent_origin(bad).is_err(), "{bad}");
        }
    }
}
