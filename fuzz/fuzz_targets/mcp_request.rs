//! The MCP request path without the network: the JSON-RPC envelope
//! pre-check, tool-argument parsing and validation, placeholder substitution
//! with the credential, and redaction of what would go back to the agent.
//!
//! Input: a JSON-RPC message as the agent would POST it to `/mcp`.
//! Invariants beyond "no panic, no hang":
//! - an envelope the pre-check accepts is one rmcp can parse;
//! - a prepared request has exactly one delivery header, carrying the credential;
//! - no header value holds CR, LF or NUL;
//! - redacted text never contains the credential.
#![no_main]

use std::collections::BTreeMap;

use airlock_platform_api::types::{HeaderName, HeaderText};
use airlock_sidecar::config::Delivery;
use airlock_sidecar::mcp::args::{self, Redactor, ToolCall};
use libfuzzer_sys::fuzz_target;
use secrecy::{ExposeSecret, SecretString};
use serde_json::Value;

const SECRET: &str = "fuzz-s3cret/v@lue\"x";

fuzz_target!(|data: &[u8]| {
    let accepted = args::check_envelope(data).is_ok();
    let Ok(value) = serde_json::from_slice::<Value>(data) else {
        assert!(!accepted, "non-JSON accepted");
        return;
    };
    if accepted {
        serde_json::from_value::<rmcp_check::Msg>(value.clone())
            .expect("an accepted envelope parses for rmcp");
    }
    let params = value.get("params");
    let name = params
        .and_then(|p| p.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("svc__api_call");
    let arguments = params
        .and_then(|p| p.get("arguments"))
        .and_then(Value::as_object);
    let Ok(call) = args::parse_tool_call(name, arguments, |ns| ns == "svc", 4096) else {
        return;
    };
    let ToolCall::ApiCall { args: call, .. } = call else {
        return;
    };
    let fields: BTreeMap<String, SecretString> = BTreeMap::from([
        ("api_key".to_owned(), SECRET.into()),
        ("org".to_owned(), "acme".into()),
    ]);
    let delivery = Delivery {
        header: HeaderName::parse("Authorization").expect("a valid header name"),
        prefix: HeaderText::parse("Bearer ").expect("a valid header text"),
        field: "api_key".into(),
        audience: None,
    };
    let redactor = Redactor::new(fields.values().map(ExposeSecret::expose_secret));
    match args::prepare(&call, &fields, Some(&delivery)) {
        Ok(p) => {
            let auth: Vec<_> = p.headers.get_all("authorization").iter().collect();
            assert_eq!(auth.len(), 1);
            assert_eq!(auth[0].as_bytes(), format!("Bearer {SECRET}").as_bytes());
            for (_, v) in &p.headers {
                assert!(!v.as_bytes().iter().any(|b| matches!(b, b'\r' | b'\n' | 0)));
            }
            assert!(p.credential_headers.iter().any(|h| h == "authorization"));
            let shown = redactor.str(&p.url);
            assert!(!shown.contains(SECRET) && !shown.contains(&args::percent_encode(SECRET)));
            let body = redactor.bytes(&p.body);
            assert!(!body.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()));
        }
        Err(e) => assert!(
            !e.message.contains(SECRET),
            "an error message carries the credential"
        ),
    }
});

mod rmcp_check {
    /// rmcp's own message type, through the sidecar's re-export.
    pub type Msg = airlock_sidecar::mcp::ClientMessage;
}
