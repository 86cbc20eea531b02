//! Issue 44: the sidecar's answers to the agent never name an address the
//! guard resolved. An agent that may reach a name (`api_call` of an
//! allow-all integration, the proxy's `network.egress`, the model's
//! `base_url`) and is refused because the name resolves to a blocked
//! address reads the rule and the name it gave; the address (the
//! instance's internal DNS) is in the operator's log only, never in the
//! agent's answer or in the egress record tenants read (on main every one
//! of these answers named it).

use std::io::{Read, Write};
use std::time::Duration;

use crate::support::*;
use airlock_platform::testing::TestPlatform;
use airlock_test_support::sidecar_config::{Provider, integration};
use airlock_vault::ExposeSecret;
use serde_json::{Value, json};

/// A name the test's own nameserver answers with [`ADDRESS`], a private
/// address the guard refuses (no packet is ever sent to it).
const NAME: &str = "db.corp.test";
const ADDRESS: &str = "10.77.66.55";

/// A raw exchange with the sidecar's proxy: the status and what followed.
fn proxy_exchange(sc: &SidecarProcess, request: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(sc.proxy_tcp()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let (status, _, body) = parse_response(&raw);
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refusal_names_the_rule_to_the_agent_and_the_address_to_the_operator() {
    let ns = crate::egress_check::nameserver(NAME, ADDRESS.parse().unwrap());
    let p = TestPlatform::start("agent-addresses").await;
    add_model_key(&p, "sk-live-address-test-key").await;
    let cfg = p
        .sidecar_config()
        .tcp()
        .proxy_tcp()
        .network_allow([format!("https://{NAME}/**"), format!("http://{NAME}/**")])
        .integration(integration("open").allow_all_uris().without_connection())
        .model(Provider::Openai, &format!("http://{NAME}/v1"))
        .egress_with(|e| e.dns_server = Some(ns.to_string()))
        .build();
    let mut sc = spawn_sidecar(&cfg);
    let token = p.sidecar_token.expose_secret().to_owned();
    let auth = format!("Bearer {token}");
    let mut answers: Vec<(&str, u16, String)> = Vec::new();

    // api_call, a stateless MCP call by hand.
    let meta = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}});
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "open__api_call", "arguments": {"target": format!("http://{NAME}/rows")}, "_meta": meta}});
    let (status, _, b) = http(
        sc.tcp(),
        "POST",
        "/mcp",
        &[
            ("authorization", &auth),
            ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"),
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "open__api_call"),
        ],
        call.to_string().as_bytes(),
    );
    answers.push(("api_call", status, String::from_utf8_lossy(&b).into_owned()));

    // The proxy: a CONNECT tunnel and a plain-http request.
    let proxy_auth = format!("Proxy-Authorization: Bearer {token}\r\n");
    let (status, body) = proxy_exchange(
        &sc,
        &format!("CONNECT {NAME}:443 HTTP/1.1\r\nHost: {NAME}:443\r\n{proxy_auth}\r\n"),
    );
    answers.push(("proxy CONNECT", status, body));
    let (status, body) = proxy_exchange(
        &sc,
        &format!(
            "GET http://{NAME}/rows HTTP/1.1\r\nHost: {NAME}\r\n{proxy_auth}Connection: close\r\n\r\n"
        ),
    );
    answers.push(("proxy http", status, body));

    // The model relay.
    let (status, _, b) = post_json(
        sc.tcp(),
        "/llm/v1/chat/completions",
        &token,
        &json!({"model": "m", "messages": []}),
    );
    answers.push(("llm", status, String::from_utf8_lossy(&b).into_owned()));

    for (site, status, body) in &answers {
        assert!(
            body.contains("blocked_address") && body.contains(NAME),
            "{site} ({status}): the agent does not read the rule and the name: {body}"
        );
        assert!(
            !body.contains(ADDRESS),
            "{site} ({status}): the resolved address reached the agent: {body}"
        );
    }
    let statuses: Vec<u16> = answers.iter().map(|a| a.1).collect();
    // The MCP answer is a tool error inside a 200.
    assert_eq!(statuses, [200, 403, 403, 403], "{answers:?}");
    let v: Value = serde_json::from_str(&answers[0].2).unwrap();
    assert_eq!(v["result"]["isError"], json!(true), "{v}");

    sc.stop();
    // The operator's log names the address of each refusal.
    let log = sc.stderr();
    let named = log
        .lines()
        .filter(|l| l.contains("Target refused") && l.contains(ADDRESS))
        .count();
    assert_eq!(named, 4, "the operator's log: {log}");
    // The egress record, which tenants read through /v1, does not.
    let records = p.egress_log().await;
    assert_eq!(records.len(), 4, "{records:?}");
    assert!(!format!("{records:?}").contains(ADDRESS), "{records:?}");
}
