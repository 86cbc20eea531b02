//! The headers of a relayed call: towards the provider only a safe list
//! from the agent, then the key ([`upstream_headers`]); back towards the
//! agent only a safe list ([`safe_response_headers`]). What authenticates
//! never passes either way.

use axum::response::Response;
use http::StatusCode;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use secrecy::{ExposeSecret, SecretString};

use super::error::error;
use crate::config::Provider;

/// Request headers taken from the agent.
const FORWARDED_REQUEST_HEADERS: &[&str] = &[
    "content-type",
    "accept",
    "user-agent",
    "anthropic-version",
    "anthropic-beta",
    "openai-beta",
    "idempotency-key",
];

/// Response headers passed back to the agent (exact names).
const SAFE_RESPONSE_HEADERS: &[&str] = &[
    "content-type",
    "content-encoding",
    "cache-control",
    "x-request-id",
    "request-id",
    "openai-processing-ms",
    "openai-version",
    "retry-after",
    "retry-after-ms",
    "x-should-retry",
];

/// Response header prefixes passed back (rate-limit information).
const SAFE_RESPONSE_PREFIXES: &[&str] = &["x-ratelimit-", "anthropic-ratelimit-"];

/// The headers sent upstream: the safe list from the agent, then the key.
pub(super) fn upstream_headers(
    agent: &HeaderMap,
    provider: Provider,
    key: &SecretString,
) -> Result<HeaderMap, Box<Response>> {
    let mut out = HeaderMap::new();
    for name in FORWARDED_REQUEST_HEADERS {
        for v in agent.get_all(*name) {
            out.append(HeaderName::from_static(name), v.clone());
        }
    }
    out.insert(
        header::ACCEPT_ENCODING,
        HeaderValue::from_static("identity"),
    );
    let bad_key = || {
        Box::new(error(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_configured",
            "model_credential_invalid",
            "the model credential is not a valid header value",
        ))
    };
    let (name, mut value) = match provider {
        Provider::Openai => (
            header::AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {}", key.expose_secret()))
                .map_err(|_| bad_key())?,
        ),
        Provider::Anthropic => (
            HeaderName::from_static("x-api-key"),
            HeaderValue::from_str(key.expose_secret()).map_err(|_| bad_key())?,
        ),
    };
    value.set_sensitive(true);
    out.insert(name, value);
    Ok(out)
}

/// The upstream's headers passed back to the agent.
pub(super) fn safe_response_headers(upstream: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::new();
    for (name, value) in upstream {
        let n = name.as_str();
        if SAFE_RESPONSE_HEADERS.contains(&n)
            || SAFE_RESPONSE_PREFIXES.iter().any(|p| n.starts_with(p))
        {
            out.append(name.clone(), value.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agents_keys_never_go_upstream() {
        let mut agent = HeaderMap::new();
        agent.insert(
            "authorization",
            HeaderValue::from_static("Bearer sidecar-token-or-placeholder"),
        );
        agent.insert("x-api-key", HeaderValue::from_static("placeholder"));
        agent.insert("cookie", HeaderValue::from_static("c=1"));
        agent.insert("x-airlock-sidecar-auth", HeaderValue::from_static("t"));
        agent.insert("anthropic-version", HeaderValue::from_static("2023-06-01"));
        agent.insert("anthropic-beta", HeaderValue::from_static("tools-2024"));
        agent.insert("content-type", HeaderValue::from_static("application/json"));
        agent.insert("accept-encoding", HeaderValue::from_static("gzip"));
        let key = SecretString::from("sk-real".to_owned());
        let h = upstream_headers(&agent, Provider::Anthropic, &key).unwrap();
        assert_eq!(h["x-api-key"], "sk-real");
        assert!(h["x-api-key"].is_sensitive());
        assert!(
            !h.contains_key("authorization")
                && !h.contains_key("cookie")
                && !h.contains_key("x-airlock-sidecar-auth")
        );
        assert_eq!(h["anthropic-version"], "2023-06-01");
        assert_eq!(h["anthropic-beta"], "tools-2024");
        assert_eq!(h["accept-encoding"], "identity");
        let h = upstream_headers(&agent, Provider::Openai, &key).unwrap();
        assert_eq!(h["authorization"], "Bearer sk-real");
        assert!(!h.contains_key("x-api-key"));
        let bad = SecretString::from("sk\r\nx-evil: 1".to_owned());
        assert!(upstream_headers(&agent, Provider::Openai, &bad).is_err());
    }

    #[test]
    fn response_headers_are_reduced_to_the_safe_list() {
        let mut up = HeaderMap::new();
        for (k, v) in [
            ("content-type", "text/event-stream"),
            ("x-request-id", "req_1"),
            ("request-id", "req_2"),
            ("x-ratelimit-remaining-tokens", "99"),
            ("anthropic-ratelimit-requests-limit", "5"),
            ("retry-after", "1"),
            ("set-cookie", "s=1"),
            ("www-authenticate", "Bearer"),
            ("authorization", "Bearer leak"),
            ("x-api-key", "leak"),
            ("openai-organization", "org"),
            ("server", "x"),
        ] {
            up.insert(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        let h = safe_response_headers(&up);
        let mut names: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        names.sort();
        assert_eq!(
            names,
            [
                "anthropic-ratelimit-requests-limit",
                "content-type",
                "request-id",
                "retry-after",
                "x-ratelimit-remaining-tokens",
                "x-request-id"
            ]
        );
    }
}
