//! The hot request, served without rmcp's per-request machinery: a
//! stateless (2026-07-28) `tools/call` of an `{namespace}__api_call` tool.
//!
//! rmcp answers such a request by spawning a one-shot service (a task, two
//! channels, a cancellation token), serialising the parsed message back to a
//! `Value` to check the SEP-2243 headers, and parsing the body through its
//! flattened model. Here the same request is parsed once into
//! rmcp's own parameter type, run by the same [`McpState::call`] the rmcp
//! handler runs (as [`McpState::call_answer`]), and answered as rmcp's
//! stateless JSON mode answers (`application/json`, status 200): the usual
//! answer, an upstream body inline as text, written directly
//! ([`write_text_answer`], byte for byte what rmcp writes for the same
//! result), any other with rmcp's own response type.
//!
//! Only a request that rmcp would serve the same way takes this path: every
//! header and field is checked strictly (a subset of what rmcp accepts), and
//! anything else — another method or tool, a session, an `Origin`, weighted
//! `Accept` ranges, `Mcp-Param-*` headers, a missing or contradicting
//! standard header, unknown envelope fields, missing `_meta` keys — goes to
//! rmcp, which accepts or refuses it as before. `stateless_call_and_rmcp_answer_alike`
//! (below) checks both paths byte for byte.

use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, StatusCode, header};
use axum::response::{IntoResponse, Response};
use rmcp::model::{
    CallToolResponse, NumberOrString, RequestMetaObject, ServerJsonRpcMessage, ServerResult,
};
use serde::Deserialize;
use serde_json::Value;

use super::api_call::{Answer, TextAnswer};
use super::{
    ALLOWED_HOSTS, CredentialPrefetch, LAST_EVENT_ID, MCP_METHOD, MCP_NAME, MCP_PROTOCOL_VERSION,
    MCP_SESSION_ID, McpState, args,
};

const PROTOCOL: &str = "2026-07-28";
const META_PROTOCOL: &str = "io.modelcontextprotocol/protocolVersion";
const META_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";

/// A request for the stateless call path.
pub(crate) struct LeanCall {
    id: NumberOrString,
    name: String,
    arguments: Option<serde_json::Map<String, Value>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope {
    jsonrpc: String,
    id: Value,
    method: String,
    params: Params,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    name: String,
    #[serde(default)]
    arguments: Option<serde_json::Map<String, Value>>,
    /// Parsed as rmcp's own type, once (what rmcp would refuse goes to rmcp).
    #[serde(rename = "_meta")]
    meta: RequestMetaObject,
}

/// The single value of header `name`, if it has exactly one.
fn one<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Option<&'a str> {
    let mut all = headers.get_all(name).iter();
    let first = all.next()?;
    if all.next().is_some() {
        return None;
    }
    first.to_str().ok()
}

fn host_allowed(headers: &HeaderMap) -> bool {
    let Some(host) = one(headers, &header::HOST) else {
        return false;
    };
    let bare = match host.rsplit_once(':') {
        Some((h, port))
            if !h.is_empty()
                && !port.is_empty()
                && port.bytes().all(|b| b.is_ascii_digit())
                && port.len() <= 5 =>
        {
            h
        }
        _ => host,
    };
    ALLOWED_HOSTS.iter().any(|a| {
        if *a == "::1" {
            bare == "[::1]"
        } else {
            bare == *a
        }
    })
}

/// `Accept` names both media types, with no parameters (no weights).
fn accepts_both(headers: &HeaderMap) -> bool {
    let (mut json, mut sse) = (false, false);
    for v in headers.get_all(header::ACCEPT) {
        let Ok(v) = v.to_str() else { return false };
        for item in v.split(',') {
            let item = item.trim();
            if item.contains(';') || item.contains('"') {
                return false;
            }
            json |= item.eq_ignore_ascii_case("application/json");
            sse |= item.eq_ignore_ascii_case("text/event-stream");
        }
    }
    json && sse
}

fn headers_fit(headers: &HeaderMap) -> bool {
    let plain_json = one(headers, &header::CONTENT_TYPE)
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    plain_json
        && host_allowed(headers)
        && accepts_both(headers)
        && !headers.contains_key(&MCP_SESSION_ID)
        && !headers.contains_key(header::ORIGIN)
        && !headers.contains_key(&LAST_EVENT_ID)
        && one(headers, &MCP_PROTOCOL_VERSION) == Some(PROTOCOL)
        && one(headers, &MCP_METHOD) == Some("tools/call")
        && !headers.keys().any(|k| k.as_str().starts_with("mcp-param-"))
}

/// The request, when it is one the stateless call path answers exactly as rmcp would.
pub(crate) fn take(parts: &Parts, body: &[u8], state: &McpState) -> Option<LeanCall> {
    if !state.stateless_calls || !headers_fit(&parts.headers) {
        return None;
    }
    let env: Envelope = serde_json::from_slice(body).ok()?;
    if env.jsonrpc != "2.0" || env.method != "tools/call" {
        return None;
    }
    let id = match env.id {
        Value::String(s) => NumberOrString::String(s.into()),
        Value::Number(n) => NumberOrString::Number(n.as_i64()?),
        _ => return None,
    };
    let p = env.params;
    if one(&parts.headers, &MCP_NAME) != Some(p.name.as_str()) {
        return None;
    }
    let ns = args::api_call_namespace(&p.name)?;
    if !state.sidecar.integrations.contains_key(ns) {
        return None;
    }
    let meta = &(p.meta.0).0;
    let protocol_ok = meta.get(META_PROTOCOL).and_then(Value::as_str) == Some(PROTOCOL);
    let capabilities_ok = meta.get(META_CAPABILITIES).is_some_and(Value::is_object);
    if !protocol_ok || !capabilities_ok {
        return None;
    }
    // The arguments are taken as they are, never copied.
    Some(LeanCall {
        id,
        name: p.name,
        arguments: p.arguments,
    })
}

/// Writes the JSON-RPC response to `id` whose result is `a`'s: exactly
/// the bytes of rmcp's serialisation of [`TextAnswer::into_result`]
/// (`text_answers_are_written_as_rmcp_writes_them` checks it), the
/// `_meta` keys in the order of serde_json's map (sorted).
fn write_text_answer(
    out: &mut Vec<u8>,
    id: &NumberOrString,
    a: &TextAnswer,
) -> serde_json::Result<()> {
    out.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
    serde_json::to_writer(&mut *out, id)?;
    out.extend_from_slice(
        br#","result":{"resultType":"complete","content":[{"type":"text","text":"#,
    );
    serde_json::to_writer(&mut *out, &a.text)?;
    out.extend_from_slice(br#"}],"isError":false,"_meta":{"bytes":"#);
    serde_json::to_writer(&mut *out, &a.text.len())?;
    out.extend_from_slice(br#","credentialStripped":"#);
    serde_json::to_writer(&mut *out, &a.head.credential_stripped)?;
    out.extend_from_slice(br#","encoding":"utf-8","headers":{"#);
    for (i, (name, value)) in a.head.headers.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        serde_json::to_writer(&mut *out, name.as_str())?;
        out.push(b':');
        serde_json::to_writer(&mut *out, value)?;
    }
    out.extend_from_slice(br#"},"redirects":"#);
    serde_json::to_writer(&mut *out, &a.head.redirects)?;
    out.extend_from_slice(br#","status":"#);
    serde_json::to_writer(&mut *out, &a.head.status)?;
    out.extend_from_slice(br#","url":"#);
    serde_json::to_writer(&mut *out, &a.head.url)?;
    out.extend_from_slice(b"}}}");
    Ok(())
}

/// Runs the call and answers as rmcp's stateless JSON mode does.
pub(crate) async fn serve(
    call: LeanCall,
    state: &McpState,
    prefetch: Option<&CredentialPrefetch>,
) -> Response {
    let LeanCall {
        id,
        name,
        arguments,
    } = call;
    // Boxed: the call's state machine (the guarded client, hyper, the
    // journal) is ~7.5 KiB, and every layer above (axum's handler box, the
    // middleware) would otherwise move it whole (memcpy) on the way; the
    // box is one pointer.
    let answer = Box::pin(state.call_answer(&name, arguments.as_ref(), prefetch)).await;
    // Room for a small answer, not grown from serde_json's 128 bytes.
    let mut body = Vec::with_capacity(1024);
    let written = match answer {
        // The usual answer, written as rmcp would write its result, without
        // building that result first.
        Ok(Answer::Text(text)) => write_text_answer(&mut body, &id, &text),
        Ok(Answer::Result(result)) => serde_json::to_writer(
            &mut body,
            &ServerJsonRpcMessage::response(ServerResult::from(CallToolResponse::from(result)), id),
        ),
        // (Only an unknown tool fails here, and the tool was checked.)
        Err(e) => serde_json::to_writer(&mut body, &ServerJsonRpcMessage::error(e, Some(id))),
    };
    match written {
        Ok(()) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::mcp::api_call::AnswerHead;
    use http_body_util::BodyExt;
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tower::ServiceExt;

    use airlock_test_support::sidecar_config::{SidecarConfigBuilder, open_to};
    use std::path::Path;

    /// A loopback upstream that reads each request's head and writes back
    /// whole what `answer` makes of it (the connection then closes).
    pub(crate) async fn upstream_answering(answer: fn(&str) -> String) -> u16 {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut tmp = [0u8; 4096];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut tmp).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&tmp[..n]),
                        }
                    }
                    let _ = s
                        .write_all(answer(&String::from_utf8_lossy(&buf)).as_bytes())
                        .await;
                });
            }
        });
        port
    }

    /// An upstream with a fixed answer (no `date`: both paths see the same bytes).
    async fn upstream() -> u16 {
        upstream_answering(|_| {
            let body = r#"{"ok":true,"n":[1,2,3]}"#;
            format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-request-id: r-1\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            )
        })
        .await
    }

    pub(crate) fn sidecar(port: u16, journal: &std::path::Path) -> Arc<crate::Sidecar> {
        let cfg =
            SidecarConfigBuilder::detached("run_lean", Path::new("/nonexistent/platform.sock"))
                .integration(open_to("api.internal.test", port))
                .loopback_host("api.internal.test")
                .build();
        let journal = crate::journal::Journal::open(journal, 1 << 20).unwrap();
        crate::Sidecar::new(cfg, &[], journal).unwrap()
    }

    fn request(headers: &[(&str, &str)], body: &str) -> axum::http::Request<axum::body::Body> {
        let mut b = axum::http::Request::post("/");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(axum::body::Body::from(body.to_owned())).unwrap()
    }

    async fn answer(
        router: &super::super::Endpoint,
        headers: &[(&str, &str)],
        body: &str,
    ) -> (u16, Option<String>, Vec<u8>) {
        let resp = router
            .clone()
            .oneshot(request(headers, body))
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let ct = resp
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let bytes = resp
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec();
        (status, ct, bytes)
    }

    fn call(id: &str, name: &str, arguments: &str, meta: &str) -> String {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{name}","arguments":{arguments},"_meta":{meta}}}}}"#
        )
    }

    const META: &str = r#"{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}"#;

    /// Every request, sent to the router with the stateless call path and to the one
    /// without (rmcp alone), gets the same status, type and bytes; the
    /// requests the stateless call path takes are the ones meant for it.
    /// The stateless call path's writer of the usual answer against rmcp's own
    /// serialisation of the same result, byte for byte: texts that need
    /// escaping (quotes, backslashes, controls, non-ASCII, U+2028), no
    /// header or several (a repeated one joined), ids of both kinds.
    #[test]
    fn text_answers_are_written_as_rmcp_writes_them() {
        let texts = [
            "",
            r#"{"ok":true,"items":[1,2,3]}"#,
            "quote \" backslash \\ slash / tab \t nl \n cr \r nul \u{0} bell \u{7} del \u{7f}",
            "é ü 中文 🦀 \u{2028}\u{2029} \u{fffd}",
        ];
        let header_sets: Vec<Vec<(http::HeaderName, String)>> = vec![
            vec![],
            vec![(header::CONTENT_TYPE, "application/json".into())],
            vec![
                (header::CACHE_CONTROL, "no-store".into()),
                (header::CONTENT_TYPE, "text/plain; charset=\"utf-8\"".into()),
                (HeaderName::from_static("x-many"), "a, b".into()),
            ],
        ];
        let ids = [
            NumberOrString::Number(0),
            NumberOrString::Number(-7),
            NumberOrString::Number(i64::MAX),
            NumberOrString::String("".into()),
            NumberOrString::String("a\"b\\c é".into()),
        ];
        let mut checked = 0;
        for (t, text) in texts.iter().enumerate() {
            for headers in &header_sets {
                for id in &ids {
                    let answer = || TextAnswer {
                        head: AnswerHead {
                            status: [200, 404, 599][t % 3],
                            headers: headers.clone(),
                            url: format!("http://api.internal.test:8/p?q={t}&r=\"é\""),
                            redirects: u32::try_from(t).unwrap(),
                            credential_stripped: t % 2 == 1,
                        },
                        text: text.to_string(),
                    };
                    let mut ours = Vec::new();
                    write_text_answer(&mut ours, id, &answer()).unwrap();
                    let rmcp = serde_json::to_vec(&ServerJsonRpcMessage::response(
                        ServerResult::from(CallToolResponse::from(answer().into_result())),
                        id.clone(),
                    ))
                    .unwrap();
                    assert_eq!(
                        String::from_utf8_lossy(&ours),
                        String::from_utf8_lossy(&rmcp),
                        "text {t}, id {id:?}"
                    );
                    checked += 1;
                }
            }
        }
        assert_eq!(checked, texts.len() * header_sets.len() * ids.len());
    }

    #[tokio::test]
    async fn stateless_call_and_rmcp_answer_alike() {
        let port = upstream().await;
        let dir = tempfile::tempdir().unwrap();
        let j = dir.path().join("egress.journal");
        std::fs::write(&j, b"").unwrap();
        let sc = sidecar(port, &j);
        let lean = super::super::endpoint_with(sc.clone(), true);
        let rmcp_only = super::super::endpoint_with(sc.clone(), false);
        let state = McpState::new(sc.clone());
        let target = format!("http://api.internal.test:{port}/data?q=1");
        let args = format!(r#"{{"target":"{target}"}}"#);
        let post = format!(
            r#"{{"target":"{target}","method":"POST","headers":{{"x-a":"b"}},"body":{{"k":[1,"two"]}}}}"#
        );
        let refused = r#"{"target":"http://elsewhere.test/"}"#;
        let bad_args = r#"{"target":"http://api.internal.test/","method":"BREW"}"#;
        let std_headers: Vec<(&'static str, &'static str)> = vec![
            ("host", "127.0.0.1"),
            ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"),
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "open__api_call"),
        ];
        let with = |extra: &[(&'static str, &'static str)], drop: &[&str]| {
            let mut h: Vec<(&'static str, &'static str)> = std_headers
                .iter()
                .filter(|(k, _)| !drop.contains(k))
                .copied()
                .collect();
            h.extend_from_slice(extra);
            h
        };
        // (headers, body, taken by the stateless call path)
        type Case<'a> = (Vec<(&'a str, &'a str)>, String, bool);
        let cases: Vec<Case> = vec![
            (
                with(&[], &[]),
                call("1", "open__api_call", &args, META),
                true,
            ),
            (
                with(&[], &[]),
                call("\"a-\\u0041\"", "open__api_call", &args, META),
                true,
            ),
            (
                with(&[], &[]),
                call("-7", "open__api_call", &post, META),
                true,
            ),
            (
                with(&[], &[]),
                call("2", "open__api_call", refused, META),
                true,
            ),
            (
                with(&[], &[]),
                call("3", "open__api_call", bad_args, META),
                true,
            ),
            (
                with(&[("host", "localhost:8080")], &["host"]),
                call("4", "open__api_call", &args, META),
                true,
            ),
            (
                with(&[], &[]),
                call(
                    "5",
                    "open__api_call",
                    &args,
                    r#"{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"x":{}},"io.modelcontextprotocol/clientInfo":{"name":"c","version":"1"}}"#,
                ),
                true,
            ),
            // Everything else is rmcp's.
            (
                with(&[("mcp-name", "other")], &["mcp-name"]),
                call("6", "open__api_call", &args, META),
                false,
            ),
            (
                with(&[], &["mcp-method"]),
                call("7", "open__api_call", &args, META),
                false,
            ),
            (
                with(&[], &["mcp-name"]),
                call("8", "open__api_call", &args, META),
                false,
            ),
            (
                with(
                    &[("accept", "application/json;q=0, text/event-stream")],
                    &["accept"],
                ),
                call("9", "open__api_call", &args, META),
                false,
            ),
            (
                with(&[("accept", "application/json")], &["accept"]),
                call("10", "open__api_call", &args, META),
                false,
            ),
            (
                with(&[("mcp-param-target", "x")], &[]),
                call("11", "open__api_call", &args, META),
                false,
            ),
            (
                with(&[("origin", "http://evil.test")], &[]),
                call("12", "open__api_call", &args, META),
                false,
            ),
            (
                with(&[("host", "evil.test")], &["host"]),
                call("13", "open__api_call", &args, META),
                false,
            ),
            (
                with(&[], &[]),
                call(
                    "14",
                    "open__api_call",
                    &args,
                    r#"{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}"#,
                ),
                false,
            ),
            (
                with(&[], &[]),
                call("15", "open__api_call", &args, r#"{}"#),
                false,
            ),
            (
                with(&[], &[]),
                call("1.5", "open__api_call", &args, META),
                false,
            ),
            (
                with(&[], &[]),
                call("null", "open__api_call", &args, META),
                false,
            ),
            (
                with(&[("mcp-name", "nope__api_call")], &["mcp-name"]),
                call("16", "nope__api_call", &args, META),
                false,
            ),
            (
                with(&[("mcp-name", "run_history")], &["mcp-name"]),
                call("17", "run_history", "{}", META),
                false,
            ),
            (
                with(&[], &[]),
                format!(
                    r#"{{"jsonrpc":"2.0","id":18,"method":"tools/call","params":{{"name":"open__api_call","arguments":{args},"_meta":{META}}},"extra":1}}"#
                ),
                false,
            ),
            (
                with(
                    &[("mcp-protocol-version", "2025-11-25")],
                    &["mcp-protocol-version"],
                ),
                call("19", "open__api_call", &args, META),
                false,
            ),
            (
                with(
                    &[("content-type", "application/json; charset=utf-8")],
                    &["content-type"],
                ),
                call("20", "open__api_call", &args, META),
                false,
            ),
        ];
        for (i, (headers, body, lean_takes)) in cases.iter().enumerate() {
            let req = request(headers, body);
            let (parts, _) = req.into_parts();
            assert_eq!(
                take(&parts, body.as_bytes(), &state).is_some(),
                *lean_takes,
                "case {i}: {headers:?} {body}"
            );
            let a = answer(&lean, headers, body).await;
            let b = answer(&rmcp_only, headers, body).await;
            assert_eq!(
                (a.0, &a.1, String::from_utf8_lossy(&a.2)),
                (b.0, &b.1, String::from_utf8_lossy(&b.2)),
                "case {i}: {headers:?} {body}"
            );
            if *lean_takes {
                assert_eq!(a.0, 200, "case {i}: {}", String::from_utf8_lossy(&a.2));
            }
            let text = String::from_utf8_lossy(&a.2);
            match i {
                // The upstream's answer, passed on.
                0 => assert!(
                    text.contains(r#"{\"ok\":true,\"n\":[1,2,3]}"#)
                        && text.contains(r#""isError":false"#),
                    "{text}"
                ),
                3 => assert!(text.contains("not_authorized"), "{text}"),
                _ => {}
            }
        }
    }
}
