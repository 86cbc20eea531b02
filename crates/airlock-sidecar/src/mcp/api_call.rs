//! `{namespace}__api_call`: fetch the credential at request time, inject it,
//! send through the egress guard, and return the answer without it.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Instant;

use airlock_egress::{AuthorizedUris, CallRules, OutboundRequest, Target};
use airlock_platform_api::wire::EgressRecord;
use base64::Engine;
use bytes::Bytes;
use rmcp::model::{CallToolResult, ContentBlock, MetaObject, Resource};
use serde_json::{Map, Value, json};

use super::args::{self, ApiCallArgs, ArgError, Redactor};
use super::{CredentialPrefetch, McpState};
use crate::config::Integration;
use crate::state::{loggable_url, now_ms};

/// An `isError` result: `{"error": code, "message": …, "status": n}`.
pub fn error_result(code: &str, message: &str, status: u16) -> CallToolResult {
    let body = json!({"error": code, "message": message, "status": status});
    let mut r = CallToolResult::error(vec![ContentBlock::text(body.to_string())]);
    r.structured_content = Some(body);
    r
}

pub fn arg_error(e: &ArgError) -> CallToolResult {
    error_result(e.code, &e.message, e.status)
}

/// Runs one `api_call` of `integration`. Never fails at the protocol level:
/// every refusal is an `isError` result.
pub async fn run(
    state: &McpState,
    integration: &Integration,
    args: ApiCallArgs,
    prefetch: Option<&CredentialPrefetch>,
) -> CallToolResult {
    let sidecar = &state.sidecar;
    let Ok(_permit) = sidecar.api_calls.acquire().await else {
        return error_result("unavailable", "the sidecar is shutting down", 503);
    };
    let ns = integration.namespace.as_str();
    // The credential lives for this call only; `fields` is dropped on return.
    let fields: BTreeMap<String, String> = if integration.has_connection {
        let fetched = match prefetch {
            Some(p) => p.take(ns).await,
            None => None,
        };
        let fetched = match fetched {
            Some(f) => f,
            None => sidecar.platform.credential(ns).await,
        };
        match fetched {
            Ok(c) => c.fields,
            Err(e) => {
                tracing::warn!(
                    integration = ns,
                    status = e.status().unwrap_or(0),
                    "credential unavailable"
                );
                return error_result(
                    "credential_unavailable",
                    &format!(
                        "the platform did not provide the {ns} credential ({})",
                        e.status().map_or("unreachable".into(), |s| s.to_string())
                    ),
                    502,
                );
            }
        }
    } else {
        BTreeMap::new()
    };
    let redactor = Redactor::new(fields.values().map(String::as_str));
    let delivery = integration
        .delivery
        .as_ref()
        .filter(|_| integration.has_connection);
    let prepared = match args::prepare(&args, &fields, delivery) {
        Ok(p) => p,
        Err(e) => return error_result(e.code, &redactor.str(&e.message), e.status),
    };
    let rendered;
    let authorized = match state.static_uris.get(ns) {
        Some(parsed) => parsed,
        None => {
            rendered = AuthorizedUris::render(&integration.authorized_uris, &fields);
            &rendered
        }
    };
    let rules = CallRules {
        authorized,
        allow_all_uris: integration.allow_all_uris,
        credentialed: integration.has_connection,
    };
    let method = prepared.method.clone();
    let log_url = redactor.str(&loggable_url(&redactor.str(&prepared.url)));
    let req_host = Target::parse(&prepared.url)
        .map(|t| t.host().bare())
        .unwrap_or_else(|_| "-".into());
    let bytes_out = prepared.body.len() as u64;
    let req = OutboundRequest {
        method: prepared.method,
        url: prepared.url,
        headers: prepared.headers,
        body: prepared.body,
        credential_headers: prepared.credential_headers,
    };
    let started = Instant::now();
    let sent = sidecar.client.send(req, &rules).await;
    let duration_ms = Some(started.elapsed().as_millis() as u64);
    let mut record = EgressRecord {
        at: now_ms(),
        source: "api_call".into(),
        integration: Some(ns.to_owned()),
        method: method.to_string(),
        url: log_url,
        host: req_host,
        decision: "allowed".into(),
        code: None,
        status: None,
        bytes_out,
        bytes_in: 0,
        duration_ms,
    };
    let resp = match sent {
        Ok(r) => r,
        Err(e) => {
            let level_ssrf = e.code.is_ssrf();
            record.decision = "refused".into();
            record.code = Some(e.code.as_str().to_owned());
            if let Some(h) = &e.host {
                record.host = redactor.str(h);
            }
            if level_ssrf {
                tracing::warn!(code = e.code.as_str(), host = %record.host, "Target refused (SSRF)");
            } else {
                tracing::info!(code = e.code.as_str(), host = %record.host, "Target refused (policy)");
            }
            sidecar.record_egress(record);
            return error_result(
                e.code.as_str(),
                &redactor.str(&e.to_string()),
                e.http_status(),
            );
        }
    };
    record.status = Some(resp.status.as_u16());
    record.bytes_in = resp.body.len() as u64;
    sidecar.record_egress(record);
    success(state, &redactor, resp).await
}

async fn success(
    state: &McpState,
    redactor: &Redactor,
    resp: airlock_egress::GuardedResponse,
) -> CallToolResult {
    let content_type = resp
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body: Bytes = if redactor.is_empty() {
        resp.body
    } else {
        Bytes::from(redactor.bytes(&resp.body))
    };
    let mut headers = Map::new();
    for (name, value) in &resp.headers {
        if !args::is_safe_response_header(name.as_str()) {
            continue;
        }
        if let Ok(v) = value.to_str() {
            let v = redactor.str(v);
            match headers.get_mut(name.as_str()) {
                Some(Value::String(prev)) => {
                    prev.push_str(", ");
                    prev.push_str(&v);
                }
                _ => {
                    headers.insert(name.as_str().to_owned(), Value::String(v));
                }
            }
        }
    }
    // Valid UTF-8 is returned as text whatever the declared type; anything
    // else is base64 (a textual content type with bad bytes included).
    let text = std::str::from_utf8(&body).ok();
    let binary = text.is_none();
    let mut meta = Map::new();
    meta.insert("status".into(), json!(resp.status.as_u16()));
    meta.insert("headers".into(), Value::Object(headers));
    meta.insert(
        "url".into(),
        json!(redactor.str(resp.final_url.url().as_str())),
    );
    meta.insert("redirects".into(), json!(resp.redirects));
    meta.insert("credentialStripped".into(), json!(resp.credential_stripped));
    meta.insert("bytes".into(), json!(body.len()));
    meta.insert(
        "encoding".into(),
        json!(if binary { "base64" } else { "utf-8" }),
    );

    let content = if body.len() > state.sidecar.limits.inline_result_bytes {
        match store(
            state,
            content_type
                .as_deref()
                .unwrap_or("application/octet-stream"),
            body.clone(),
        )
        .await
        {
            Ok(link) => {
                meta.insert("resourceUri".into(), json!(link.uri));
                vec![
                    ContentBlock::text(format!(
                        "The response body ({} bytes) is larger than the {}-byte inline limit; it was stored for this run. Read it with resources/read on {}.",
                        body.len(),
                        state.sidecar.limits.inline_result_bytes,
                        link.uri
                    )),
                    ContentBlock::resource_link(link),
                ]
            }
            Err(r) => return r,
        }
    } else if let Some(t) = text {
        vec![ContentBlock::text(t.to_owned())]
    } else {
        vec![
            ContentBlock::text(format!(
                "[binary response body: {} bytes of {}; base64-encoded in the next block]",
                body.len(),
                content_type.as_deref().unwrap_or("unknown type")
            )),
            ContentBlock::text(base64::engine::general_purpose::STANDARD.encode(&body)),
        ]
    };
    let mut result = CallToolResult::success(content);
    result.meta = Some(MetaObject(meta));
    result
}

/// Stores a large body for the run within `limits.run_result_bytes`.
async fn store(
    state: &McpState,
    content_type: &str,
    body: Bytes,
) -> Result<Resource, CallToolResult> {
    let len = body.len() as u64;
    let cap = state.sidecar.limits.run_result_bytes;
    let reserved = state
        .stored_bytes
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
            used.checked_add(len).filter(|n| *n <= cap)
        });
    if reserved.is_err() {
        return Err(error_result(
            "run_result_limit",
            &format!(
                "the response body ({len} bytes) is larger than the inline limit and storing it would exceed the run's {cap}-byte limit for stored results ({} bytes used)",
                state.stored_bytes.load(Ordering::SeqCst)
            ),
            413,
        ));
    }
    match state.sidecar.platform.put_result(content_type, body).await {
        Ok(r) => {
            let uri = super::result_uri(&state.sidecar.run_id, &r.id);
            Ok(Resource::new(uri, format!("api_call result {}", r.id))
                .with_mime_type(content_type)
                .with_size(len))
        }
        Err(e) => {
            state.stored_bytes.fetch_sub(len, Ordering::SeqCst);
            tracing::warn!(
                status = e.status().unwrap_or(0),
                "storing a large result failed"
            );
            Err(error_result(
                "result_store_failed",
                "the platform could not store the large response body",
                502,
            ))
        }
    }
}
