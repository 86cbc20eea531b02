//! What a model request asks the *provider* to reach on the agent's behalf,
//! and whether the run allows it.
//!
//! A provider can fetch an image by URL, call an MCP server, search or
//! fetch the web: egress that leaves from the provider's machines, outside
//! every rule and record of the run's (even `[network] egress = "none"`).
//! The relay reads each model request for such asks before it is sent:
//!
//! - URLs the provider would fetch: OpenAI `image_url` parts and the
//!   Responses API's `input_image` / `input_file` URLs, `mcp` tools'
//!   `server_url`; Anthropic `image` / `document` sources of type `url`
//!   and `mcp_servers[].url`. `data:` URLs carry their bytes: no ask.
//! - Provider-side tools: a tool whose `type` is not one the agent runs
//!   itself (`function`, `custom`, Anthropic's client tools), and
//!   `anthropic-beta` values that turn the server tools on.
//!
//! By default every ask is refused (typed, with an egress record of source
//! `llm`). The manifest allows named tools (`model.provider_tools`) and URLs
//! (`model.provider_fetch_uris`, judged by the same guard as any request:
//! authorized patterns, blocked names and addresses).

use airlock_egress::{AuthorizedUris, EgressCode, EgressError, GuardStep};
use http::HeaderMap;
use serde_json::Value;

use crate::config::Provider;

/// One thing a request asks the provider to reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Ask {
    /// Fetch or call this URL (`what` names where in the request it is).
    Url { url: String, what: &'static str },
    /// Use this provider-side tool (its `type`, or the beta that enables it).
    Tool { name: String },
}

/// What the run allows the provider to reach.
pub(super) struct ProviderFetchPolicy {
    tools: Vec<String>,
    pub(super) uris: AuthorizedUris,
}

/// Tool types the agent runs itself: asking for them reaches nothing.
const CLIENT_TOOLS: &[&str] = &["function", "custom"];
/// Anthropic's client tools (versioned: `bash_20250124`, …).
const CLIENT_TOOL_PREFIXES: &[&str] = &["bash_", "text_editor_", "computer_", "memory_"];

/// Members of a body that can hold an ask: a body without any of them is
/// not parsed again.
const MARKERS: &[&[u8]] = &[b"url\"", b"\"tools\"", b"\"mcp_servers\""];

impl ProviderFetchPolicy {
    pub(super) fn new(tools: &[String], fetch_uris: &[String]) -> Self {
        ProviderFetchPolicy {
            tools: tools.to_vec(),
            uris: AuthorizedUris::parse(fetch_uris),
        }
    }

    /// Whether the manifest names this tool (exactly, or a dated version of
    /// a name it gives: `web_search` covers `web_search_20250305`).
    fn allows_tool(&self, name: &str) -> bool {
        self.tools.iter().any(|t| {
            name == t
                || name
                    .strip_prefix(t.as_str())
                    .and_then(|rest| rest.strip_prefix('_'))
                    .is_some_and(|v| {
                        !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit() || b == b'_')
                    })
        })
    }

    /// The first tool asked for that the manifest does not name, as the
    /// refusal to record (the URL field of its record names the tool).
    pub(super) fn refused_tool(&self, asks: &[Ask]) -> Option<(String, EgressError)> {
        asks.iter().find_map(|a| match a {
            Ask::Tool { name } if !self.allows_tool(name) => Some((
                format!("provider-tool:{name}"),
                EgressError::new(
                    EgressCode::NotAuthorized,
                    GuardStep::AuthorizedUris,
                    None,
                    format!(
                        "the model request asks the provider to use its tool {name:?}, which reaches hosts outside this run's egress rules; name it in the manifest's model.provider_tools to allow it"
                    ),
                ),
            )),
            _ => None,
        })
    }
}

/// The URLs among `asks`: each is judged by the guard under the policy's
/// patterns before the request is sent.
pub(super) fn urls(asks: &[Ask]) -> impl Iterator<Item = (&str, &'static str)> {
    asks.iter().filter_map(|a| match a {
        Ask::Url { url, what } => Some((url.as_str(), *what)),
        Ask::Tool { .. } => None,
    })
}

/// Every ask in a model request (body and headers) to `provider`.
pub(super) fn asks(provider: Provider, body: &[u8], headers: &HeaderMap) -> Vec<Ask> {
    let mut out = Vec::new();
    if provider == Provider::Anthropic {
        for v in headers.get_all("anthropic-beta") {
            for beta in v.to_str().unwrap_or_default().split(',') {
                let beta = beta.trim();
                for (prefix, tool) in [
                    ("mcp-client", "mcp"),
                    ("web-fetch", "web_fetch"),
                    ("web-search", "web_search"),
                ] {
                    if beta.starts_with(prefix) {
                        out.push(Ask::Tool { name: tool.into() });
                    }
                }
            }
        }
    }
    let marked = MARKERS
        .iter()
        .any(|m| memchr::memmem::find(body, m).is_some());
    if !marked {
        return out;
    }
    // A body that is not JSON asks for nothing the provider would honour.
    let Ok(Value::Object(top)) = serde_json::from_slice::<Value>(body) else {
        return out;
    };
    if let Some(Value::Array(tools)) = top.get("tools") {
        for t in tools {
            tool_asks(t, &mut out);
        }
    }
    if let Some(Value::Array(servers)) = top.get("mcp_servers") {
        for s in servers {
            out.push(Ask::Tool { name: "mcp".into() });
            if let Some(u) = s.get("url").and_then(Value::as_str) {
                push_url(&mut out, u, "mcp_servers[].url");
            }
        }
    }
    for key in ["messages", "input", "system"] {
        if let Some(v) = top.get(key) {
            content_asks(v, &mut out, 0);
        }
    }
    out
}

/// A tool definition's ask, if it is not one the agent runs itself.
fn tool_asks(t: &Value, out: &mut Vec<Ask>) {
    let Some(kind) = t.get("type").and_then(Value::as_str) else {
        return; // Anthropic's custom tools have no type.
    };
    if CLIENT_TOOLS.contains(&kind) || CLIENT_TOOL_PREFIXES.iter().any(|p| kind.starts_with(p)) {
        return;
    }
    out.push(Ask::Tool { name: kind.into() });
    if let Some(u) = t.get("server_url").and_then(Value::as_str) {
        push_url(out, u, "tools[].server_url");
    }
}

/// Content parts that make the provider fetch a URL, anywhere in the
/// conversation (nested `content` arrays, tool results). Bounded depth: a
/// hostile nesting is read no deeper than a provider would accept.
fn content_asks(v: &Value, out: &mut Vec<Ask>, depth: usize) {
    if depth > 16 {
        return;
    }
    match v {
        Value::Array(items) => {
            for i in items {
                content_asks(i, out, depth + 1);
            }
        }
        Value::Object(o) => {
            match o.get("type").and_then(Value::as_str) {
                // OpenAI chat: {"type":"image_url","image_url":{"url":…}} (or a string).
                Some("image_url") => match o.get("image_url") {
                    Some(Value::String(u)) => push_url(out, u, "image_url"),
                    Some(Value::Object(i)) => {
                        if let Some(u) = i.get("url").and_then(Value::as_str) {
                            push_url(out, u, "image_url");
                        }
                    }
                    _ => {}
                },
                // OpenAI Responses: input_image's image_url, input_file's file_url.
                Some("input_image") => {
                    if let Some(u) = o.get("image_url").and_then(Value::as_str) {
                        push_url(out, u, "input_image.image_url");
                    }
                }
                Some("input_file") => {
                    if let Some(u) = o.get("file_url").and_then(Value::as_str) {
                        push_url(out, u, "input_file.file_url");
                    }
                }
                // Anthropic: an image or document whose source is a URL.
                Some("image" | "document") => {
                    if let Some(src) = o.get("source")
                        && src.get("type").and_then(Value::as_str) == Some("url")
                        && let Some(u) = src.get("url").and_then(Value::as_str)
                    {
                        push_url(out, u, "source.url");
                    }
                }
                _ => {}
            }
            if let Some(c) = o.get("content") {
                content_asks(c, out, depth + 1);
            }
        }
        _ => {}
    }
}

/// A URL ask, unless it carries its own bytes (`data:`).
fn push_url(out: &mut Vec<Ask>, url: &str, what: &'static str) {
    let scheme = url
        .split_once(':')
        .map(|(s, _)| s.trim())
        .unwrap_or_default();
    if scheme.eq_ignore_ascii_case("data") {
        return;
    }
    out.push(Ask::Url {
        url: url.to_owned(),
        what,
    });
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure
mod tests {
    use super::*;

    fn body(v: Value) -> Vec<u8> {
        serde_json::to_vec(&v).unwrap()
    }

    #[test]
    fn every_openai_and_anthropic_ask_is_found_and_data_urls_are_not() {
        let h = HeaderMap::new();
        let openai = body(serde_json::json!({
            "model": "m",
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "https://img.example/a.png"}},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            ]}],
            "tools": [
                {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"url": {"type": "string"}}}}},
                {"type": "mcp", "server_label": "x", "server_url": "https://mcp.example/sse"},
                {"type": "web_search_preview"},
            ],
        }));
        assert_eq!(
            asks(Provider::Openai, &openai, &h),
            vec![
                Ask::Tool { name: "mcp".into() },
                Ask::Url {
                    url: "https://mcp.example/sse".into(),
                    what: "tools[].server_url"
                },
                Ask::Tool {
                    name: "web_search_preview".into()
                },
                Ask::Url {
                    url: "https://img.example/a.png".into(),
                    what: "image_url"
                },
            ]
        );
        let responses = body(serde_json::json!({
            "input": [{"role": "user", "content": [
                {"type": "input_image", "image_url": "http://10.0.0.1/x"},
                {"type": "input_file", "file_url": "https://f.example/doc.pdf"},
            ]}],
        }));
        assert_eq!(asks(Provider::Openai, &responses, &h).len(), 2);
        let mut beta = HeaderMap::new();
        beta.insert(
            "anthropic-beta",
            "mcp-client-2025-04-04, web-fetch-2025-09-10"
                .parse()
                .unwrap(),
        );
        let anthropic = body(serde_json::json!({
            "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "url", "url": "https://img.example/b.png"}},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
                {"type": "tool_result", "tool_use_id": "t", "content": [
                    {"type": "document", "source": {"type": "url", "url": "https://d.example/x.pdf"}}
                ]},
            ]}],
            "tools": [{"name": "mine", "input_schema": {}}, {"type": "bash_20250124", "name": "bash"}, {"type": "web_fetch_20250910", "name": "web_fetch"}],
            "mcp_servers": [{"type": "url", "url": "https://mcp.example/mcp", "name": "m"}],
        }));
        let got = asks(Provider::Anthropic, &anthropic, &beta);
        assert_eq!(
            got,
            vec![
                Ask::Tool { name: "mcp".into() },
                Ask::Tool {
                    name: "web_fetch".into()
                },
                Ask::Tool {
                    name: "web_fetch_20250910".into()
                },
                Ask::Tool { name: "mcp".into() },
                Ask::Url {
                    url: "https://mcp.example/mcp".into(),
                    what: "mcp_servers[].url"
                },
                Ask::Url {
                    url: "https://img.example/b.png".into(),
                    what: "source.url"
                },
                Ask::Url {
                    url: "https://d.example/x.pdf".into(),
                    what: "source.url"
                },
            ]
        );
        // A plain conversation asks for nothing (and is not parsed twice).
        let plain = body(
            serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "fetch https://x.example for me"}]}),
        );
        assert!(asks(Provider::Openai, &plain, &h).is_empty());
    }

    #[test]
    fn names_and_patterns_allow_only_what_they_name() {
        let p =
            ProviderFetchPolicy::new(&["web_search".into()], &["https://img.example/**".into()]);
        assert!(p.allows_tool("web_search"));
        assert!(p.allows_tool("web_search_20250305"));
        assert!(!p.allows_tool("web_search_preview"));
        assert!(!p.allows_tool("web_fetch"));
        let none = ProviderFetchPolicy::new(&[], &[]);
        let (what, e) = none
            .refused_tool(&[Ask::Tool { name: "mcp".into() }])
            .unwrap();
        assert_eq!(
            (what.as_str(), e.code),
            ("provider-tool:mcp", EgressCode::NotAuthorized)
        );
        assert!(none.refused_tool(&[]).is_none());
        assert!(
            p.refused_tool(&[Ask::Tool {
                name: "web_search_20250305".into()
            }])
            .is_none()
        );
    }
}
