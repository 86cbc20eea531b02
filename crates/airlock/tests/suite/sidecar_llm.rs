//! The `/llm` model relay, end to end: the real `airlock sidecar` against a
//! real platform, the real `openai` and `anthropic` Python SDKs as the agent,
//! and a fake provider on 127.0.0.1 speaking the real formats.
//!
//! What is checked: answers arrive intact; streams arrive as they are sent
//! (not buffered); the platform records exactly the usage the provider
//! reported; the provider sees the real key and never the sidecar token or
//! the agent's placeholder; the agent never sees the key; refusals and
//! failures are typed (503 / 403 / 502) and reach nothing.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

pub(crate) use airlock_test_support::fake_provider;

use std::process::Command;
use std::time::Duration;

use crate::support::*;
use airlock_platform::testing::TestPlatform;
use airlock_platform_api::wire::{CostRecord, RunEvent};
use airlock_store::EgressDecision;
use airlock_vault::ExposeSecret;
use fake_provider::*;
use serde_json::{Value, json};

const PROVIDER_KEY: &str = "sk-live-provider-key-7f3a9c";
const HOST: &str = "api.internal.test";
/// Between two stream events: long enough that a buffering relay is obvious.
const EVENT_DELAY: Duration = Duration::from_millis(150);

fn script(name: &str) -> String {
    format!("{}/tests/python/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// A sidecar for `p` whose model is `provider` at `base_url`, with
/// `api.internal.test` mapped to 127.0.0.1 and opted in as an internal host.
fn config_builder(p: &TestPlatform, provider: Provider, base_url: &str) -> SidecarConfigBuilder {
    p.sidecar_config()
        .tcp()
        .model(provider, base_url)
        .model_with(|m| {
            m.price_in_per_mtok_usd = Some(2.5);
            m.price_out_per_mtok_usd = Some(10.0);
        })
        .loopback_host(HOST)
        .resolve("blocked.internal.test", "127.0.0.1")
}

/// [`config_builder`], built.
fn config(p: &TestPlatform, provider: Provider, base_url: &str) -> SidecarConfig {
    config_builder(p, provider, base_url).build()
}

async fn run_python(args: Vec<String>) -> Value {
    let out = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .args(&args)
            .output()
            .expect("run python3")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "python failed: {}\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("python output is not JSON ({e}): {stdout}"))
}

fn costs(events: &[RunEvent]) -> Vec<CostRecord> {
    events
        .iter()
        .filter_map(|e| {
            if let RunEvent::Cost(c) = e {
                Some(c.clone())
            } else {
                None
            }
        })
        .collect()
}

/// The key never reached the agent; neither token nor placeholder reached the provider.
fn assert_no_leaks(fake: &FakeProvider, agent_saw: &Value, token: &str, placeholder: Option<&str>) {
    let agent_text = agent_saw.to_string();
    assert!(
        !agent_text.contains(PROVIDER_KEY),
        "the provider key reached the agent: {agent_text}"
    );
    assert!(
        !agent_text.contains("x-upstream-auth") && !agent_text.contains("set-cookie"),
        "unsafe headers reached the agent"
    );
    let reqs = fake.requests();
    assert!(!reqs.is_empty());
    for r in &reqs {
        for (k, v) in &r.headers {
            assert!(
                !v.contains(token),
                "the sidecar token reached the provider in {k}"
            );
            if let Some(ph) = placeholder {
                assert!(
                    !v.contains(ph),
                    "the agent's placeholder reached the provider in {k}"
                );
            }
            assert_ne!(k, "x-airlock-sidecar-auth");
        }
        assert!(
            !String::from_utf8_lossy(&r.body).contains(token),
            "the sidecar token reached the provider in a body"
        );
    }
}

/// The first chunk reached the agent well before the provider sent the last.
fn assert_streamed(name: &str, arrivals: &Value, last_sent_ms: f64) {
    let arrivals: Vec<f64> = arrivals
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert!(arrivals.len() >= 5, "{name}: {arrivals:?}");
    let first = arrivals[0];
    // The provider spaces its events EVENT_DELAY apart: a relay that
    // buffered would deliver the first chunk after the last was sent.
    assert!(
        first + 3.0 * EVENT_DELAY.as_millis() as f64 <= last_sent_ms,
        "{name}: first chunk at {first}, last sent at {last_sent_ms}: the stream was buffered"
    );
    let spread = arrivals.last().unwrap() - first;
    assert!(
        spread >= 3.0 * EVENT_DELAY.as_millis() as f64,
        "{name}: all chunks arrived within {spread} ms"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn openai_sdk_through_the_relay() {
    if !python_has(&["openai"]) {
        return;
    }
    let p = TestPlatform::start("agent-llm-openai").await;
    add_model_key(&p, PROVIDER_KEY).await;
    let fake = fake_provider::start(EVENT_DELAY).await;
    let mut sc = spawn_sidecar(&config(
        &p,
        Provider::Openai,
        &format!("http://{HOST}:{}/v1", fake.port()),
    ));
    let token = p.sidecar_token.expose_secret().to_owned();
    let base = format!("http://{}/llm/v1", sc.tcp());
    let out = run_python(vec![script("llm_openai.py"), base, token.clone()]).await;

    let text = PIECES.concat();
    assert_eq!(out["chat"]["content"], text.as_str());
    assert_eq!(out["chat"]["model"], CHAT_MODEL);
    assert_eq!(out["chat"]["usage"], json!([CHAT_USAGE.0, CHAT_USAGE.1]));
    // The relay asked for usage but the client did not: it sees no usage chunk.
    assert_eq!(out["stream"]["content"], text.as_str());
    assert_eq!(
        out["stream"]["usage_only_chunks"], 0,
        "the relay's usage chunk reached the client"
    );
    assert_eq!(out["stream"]["usage"], Value::Null);
    // The client asked: it gets it, unchanged.
    assert_eq!(out["stream_with_usage"]["content"], text.as_str());
    assert_eq!(out["stream_with_usage"]["usage_only_chunks"], 1);
    assert_eq!(
        out["stream_with_usage"]["usage"],
        json!([CHAT_USAGE.0, CHAT_USAGE.1])
    );
    assert_eq!(out["responses"]["text"], text.as_str());
    assert_eq!(
        out["responses"]["usage"],
        json!([RESPONSES_USAGE.0, RESPONSES_USAGE.1])
    );
    assert_eq!(out["responses_stream"]["content"], text.as_str());
    assert_eq!(
        out["responses_stream"]["usage"],
        json!([RESPONSES_USAGE.0, RESPONSES_USAGE.1])
    );
    assert_eq!(out["models"], json!([CHAT_MODEL]));
    assert_eq!(
        out["files"], 404,
        "an endpoint outside the relay's list was served"
    );
    // Safe headers came through.
    assert_eq!(out["headers"][0]["x-request-id"], "req_fake_1");
    assert_eq!(out["headers"][0]["x-ratelimit-remaining-tokens"], "999");

    let sent = fake.last_event_sent_ms.lock().unwrap().clone();
    assert_eq!(sent.len(), 3, "three streams reached the provider");
    assert_streamed("chat stream", &out["stream"]["arrivals"], sent[0]);
    assert_streamed(
        "chat stream with usage",
        &out["stream_with_usage"]["arrivals"],
        sent[1],
    );
    assert_streamed(
        "responses stream",
        &out["responses_stream"]["arrivals"],
        sent[2],
    );

    // What the provider saw: the real key, paths mapped onto base_url, usage asked for.
    let reqs = fake.requests();
    let paths: Vec<&str> = reqs.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "/v1/chat/completions",
            "/v1/chat/completions",
            "/v1/chat/completions",
            "/v1/responses",
            "/v1/responses",
            "/v1/models"
        ]
    );
    for r in &reqs {
        assert_eq!(
            r.header("authorization"),
            Some(format!("Bearer {PROVIDER_KEY}").as_str()),
            "{}",
            r.path
        );
        assert_eq!(r.header("x-api-key"), None);
        assert_eq!(
            r.header("host"),
            Some(format!("{HOST}:{}", fake.port()).as_str())
        );
    }
    assert_eq!(
        reqs[1].json()["stream_options"]["include_usage"],
        true,
        "the relay did not ask for usage"
    );
    assert_eq!(reqs[1].json()["messages"][0]["content"], "say hello");
    assert_no_leaks(&fake, &out, &token, None);

    sc.stop();
    let events = p.events().await;
    let c = costs(&events);
    let metered: Vec<(String, u64, u64)> = c
        .iter()
        .map(|c| (c.model.clone(), c.input_tokens, c.output_tokens))
        .collect();
    let chat = (CHAT_MODEL.to_owned(), CHAT_USAGE.0, CHAT_USAGE.1);
    let resp = (CHAT_MODEL.to_owned(), RESPONSES_USAGE.0, RESPONSES_USAGE.1);
    assert_eq!(
        metered,
        [chat.clone(), chat.clone(), chat, resp.clone(), resp],
        "one cost event per generation call, as reported"
    );
    for c in &c {
        assert_eq!(c.provider, "openai");
        // Small counts at small prices: a positive whole number of µUSD.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let expect = (c.input_tokens as f64 * 2.5 + c.output_tokens as f64 * 10.0).round() as u64;
        assert_eq!(c.cost_microusd, Some(expect));
    }
    let log = p.egress_log().await;
    let llm: Vec<_> = log.iter().filter(|e| e.source.as_str() == "llm").collect();
    assert_eq!(llm.len(), 6, "{log:?}");
    assert!(
        llm.iter().all(|e| e.decision == EgressDecision::Allowed
            && e.host == HOST
            && e.status == Some(200)),
        "{llm:?}"
    );
    assert!(!format!("{log:?}").contains(PROVIDER_KEY));
    // Stopped above: the log is whole.
    assert!(
        !sc.stderr().contains(PROVIDER_KEY) && !sc.stderr().contains(&token),
        "a secret reached the sidecar log"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn anthropic_sdk_through_the_relay() {
    if !python_has(&["anthropic"]) {
        return;
    }
    let p = TestPlatform::start("agent-llm-anthropic").await;
    add_model_key(&p, PROVIDER_KEY).await;
    let fake = fake_provider::start(EVENT_DELAY).await;
    let mut sc = spawn_sidecar(&config(
        &p,
        Provider::Anthropic,
        &format!("http://{HOST}:{}", fake.port()),
    ));
    let token = p.sidecar_token.expose_secret().to_owned();
    let base = format!("http://{}/llm", sc.tcp());
    let out = run_python(vec![script("llm_anthropic.py"), base, token.clone()]).await;

    let text = PIECES.concat();
    assert_eq!(out["message"]["content"], text.as_str());
    assert_eq!(out["message"]["model"], ANTHROPIC_MODEL);
    assert_eq!(
        out["message"]["usage"],
        json!([ANTHROPIC_USAGE.0, ANTHROPIC_USAGE.1])
    );
    assert_eq!(out["stream"]["content"], text.as_str());
    assert_eq!(
        out["stream"]["usage"],
        json!([ANTHROPIC_USAGE.0, ANTHROPIC_USAGE.1])
    );
    assert_eq!(out["stream_helper"]["content"], text.as_str());
    assert_eq!(
        out["stream_helper"]["usage"],
        json!([ANTHROPIC_USAGE.0, ANTHROPIC_USAGE.1])
    );
    let sent = fake.last_event_sent_ms.lock().unwrap().clone();
    assert_eq!(sent.len(), 2);
    assert_streamed("messages stream", &out["stream"]["arrivals"], sent[0]);

    let reqs = fake.requests();
    assert_eq!(reqs.len(), 3);
    for r in &reqs {
        assert_eq!(r.path, "/v1/messages");
        assert_eq!(r.header("x-api-key"), Some(PROVIDER_KEY));
        assert_eq!(
            r.header("authorization"),
            None,
            "the agent's Authorization was forwarded"
        );
        assert!(
            r.header("anthropic-version").is_some(),
            "anthropic-version was dropped"
        );
    }
    assert_no_leaks(&fake, &out, &token, Some("sk-ant-placeholder-not-a-key"));

    sc.stop();
    let c = costs(&p.events().await);
    assert_eq!(c.len(), 3, "{c:?}");
    for c in &c {
        assert_eq!(
            (c.provider.as_str(), c.model.as_str()),
            ("anthropic", ANTHROPIC_MODEL)
        );
        assert_eq!((c.input_tokens, c.output_tokens), ANTHROPIC_USAGE);
    }
}

/// A raw client that reads only the first event of a stream and hangs up:
/// the usage is still metered.
#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_hangs_up_early_is_still_metered() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let p = TestPlatform::start("agent-llm-hangup").await;
    add_model_key(&p, PROVIDER_KEY).await;
    let fake = fake_provider::start(Duration::from_millis(50)).await;
    let mut sc = spawn_sidecar(&config(
        &p,
        Provider::Openai,
        &format!("http://{HOST}:{}/v1", fake.port()),
    ));
    let token = p.sidecar_token.expose_secret().to_owned();
    let body = json!({"model": "m", "stream": true, "messages": []}).to_string();
    let mut s = tokio::net::TcpStream::connect(sc.tcp()).await.unwrap();
    let req = format!(
        "POST /llm/v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = s.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    drop(s);
    let recorded = eventually(10, || async {
        let c = costs(&p.events().await);
        (!c.is_empty()).then_some(c)
    })
    .await
    .expect("no cost event after the client hung up");
    assert_eq!(
        (recorded[0].input_tokens, recorded[0].output_tokens),
        CHAT_USAGE
    );
    sc.stop();
}

#[tokio::test(flavor = "multi_thread")]
async fn refusals_and_failures_are_typed_and_reach_nothing() {
    let p = TestPlatform::start("agent-llm-errors").await;
    let token = p.sidecar_token.expose_secret().to_owned();
    let auth = format!("Bearer {token}");
    let h = [
        ("authorization", auth.as_str()),
        ("content-type", "application/json"),
    ];
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let err = |b: &[u8]| -> Value { serde_json::from_slice(b).unwrap_or(Value::Null) };

    // No model configured: 503.
    let sc = spawn_sidecar(&p.sidecar_config().tcp().build());
    let (status, _, b) = http(
        sc.tcp(),
        "POST",
        "/llm/v1/chat/completions",
        &h,
        body.as_bytes(),
    );
    assert_eq!(status, 503, "{}", String::from_utf8_lossy(&b));
    assert_eq!(err(&b)["error"]["code"], "model_not_configured");
    drop(sc);

    // A model but no credential for it: 503, and the provider saw nothing.
    let fake = fake_provider::start(Duration::ZERO).await;
    let sc = spawn_sidecar(&config(
        &p,
        Provider::Openai,
        &format!("http://{HOST}:{}/v1", fake.port()),
    ));
    let (status, _, b) = http(
        sc.tcp(),
        "POST",
        "/llm/v1/chat/completions",
        &h,
        body.as_bytes(),
    );
    assert_eq!(status, 503, "{}", String::from_utf8_lossy(&b));
    assert_eq!(err(&b)["error"]["code"], "model_credential_missing");
    assert_eq!(fake.requests().len(), 0);
    drop(sc);

    add_model_key(&p, PROVIDER_KEY).await;
    // Wrong token: 401 before anything else.
    let sc = spawn_sidecar(&config(
        &p,
        Provider::Openai,
        &format!("http://{HOST}:{}/v1", fake.port()),
    ));
    let (status, _, _) = http(
        sc.tcp(),
        "POST",
        "/llm/v1/chat/completions",
        &[("authorization", "Bearer sk-placeholder")],
        body.as_bytes(),
    );
    assert_eq!(status, 401);
    // Paths outside the relay's list, and the other provider's API: 404.
    for (method, path) in [
        ("POST", "/llm/v1/files"),
        ("POST", "/llm/v1/messages"),
        ("GET", "/llm/v1/../v1/files"),
        ("DELETE", "/llm/v1/models/x"),
    ] {
        let (status, _, _) = http(sc.tcp(), method, path, &h, body.as_bytes());
        assert_eq!(status, 404, "{method} {path}");
    }
    assert_eq!(
        fake.requests().len(),
        0,
        "a refused path reached the provider"
    );
    // The legitimate path works with the same sidecar.
    let (status, _, b) = http(
        sc.tcp(),
        "POST",
        "/llm/v1/chat/completions",
        &h,
        body.as_bytes(),
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&b));
    assert_eq!(err(&b)["usage"]["prompt_tokens"], CHAT_USAGE.0);
    assert_eq!(fake.requests().len(), 1);
    drop(sc);

    // The provider on a loopback address the operator did not opt in: 403, nothing reached.
    let victim = fake_provider::start(Duration::ZERO).await;
    for base in [
        format!("http://blocked.internal.test:{}/v1", victim.port()),
        format!("http://127.0.0.1:{}/v1", victim.port()),
    ] {
        let sc = spawn_sidecar(&config(&p, Provider::Openai, &base));
        let (status, _, b) = http(
            sc.tcp(),
            "POST",
            "/llm/v1/chat/completions",
            &h,
            body.as_bytes(),
        );
        assert_eq!(status, 403, "{base}: {}", String::from_utf8_lossy(&b));
        assert_eq!(err(&b)["error"]["type"], "blocked");
        assert_eq!(err(&b)["error"]["code"], "blocked_address");
    }
    // The metadata address and `localhost` are refused before any connection.
    for (base, code) in [
        ("http://169.254.169.254/v1", "blocked_address"),
        (
            &*format!("http://localhost:{}/v1", victim.port()),
            "blocked_host",
        ),
    ] {
        let sc = spawn_sidecar(&config(&p, Provider::Openai, base));
        let (status, _, b) = http(
            sc.tcp(),
            "POST",
            "/llm/v1/chat/completions",
            &h,
            body.as_bytes(),
        );
        assert_eq!(status, 403, "{base}: {}", String::from_utf8_lossy(&b));
        assert_eq!(err(&b)["error"]["code"], code);
        assert!(!String::from_utf8_lossy(&b).contains(PROVIDER_KEY));
    }
    assert_eq!(
        victim.requests().len(),
        0,
        "a blocked provider address was reached"
    );
    assert_eq!(
        victim.connections.load(std::sync::atomic::Ordering::SeqCst),
        0
    );

    // The provider is down: 502.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut sc = spawn_sidecar(&config(
        &p,
        Provider::Openai,
        &format!("http://{HOST}:{port}/v1"),
    ));
    let (status, _, b) = http(
        sc.tcp(),
        "POST",
        "/llm/v1/chat/completions",
        &h,
        body.as_bytes(),
    );
    assert_eq!(status, 502, "{}", String::from_utf8_lossy(&b));
    assert_eq!(err(&b)["error"]["code"], "upstream_failed");
    // An oversized request: 413.
    // (declared, not sent: the sidecar answers before reading the body)
    {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(sc.tcp()).unwrap();
        let head = format!(
            "POST /llm/v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: {auth}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            11 * 1024 * 1024
        );
        s.write_all(head.as_bytes()).unwrap();
        let mut raw = Vec::new();
        let _ = s.read_to_end(&mut raw);
        assert_eq!(parse_response(&raw).0, 413);
    }
    sc.stop();

    let log = p.egress_log().await;
    let refused: Vec<_> = log
        .iter()
        .filter(|e| e.source.as_str() == "llm" && e.decision == EgressDecision::Refused)
        .collect();
    assert_eq!(refused.len(), 4, "{log:?}");
    // The provider down: the guard allowed it, the upstream failed.
    assert!(
        log.iter().any(|e| e.source.as_str() == "llm"
            && e.decision == EgressDecision::Allowed
            && e.reason.is_none()
            && outcome(e) == Some("upstream_failed")),
        "{log:?}"
    );
}

/// The model key stored the way the README says (`airlock connections add
/// … --type api_key` with the field `key`, by the real CLI) is the key the
/// relay sends.
#[tokio::test(flavor = "multi_thread")]
async fn a_model_key_stored_as_the_readme_says_reaches_the_provider() {
    use base64::Engine as _;
    use std::io::Write as _;
    let p = TestPlatform::start("agent-llm-cli-key").await;
    let mut child = Command::new(AIRLOCK)
        .args([
            "connections",
            "add",
            "openai-key",
            "--integration",
            "openai",
            "--type",
            "api_key",
        ])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("AIRLOCK_HOME", p.dir.path())
        .env(
            "CONNECTION_ENCRYPTION_KEY",
            base64::engine::general_purpose::STANDARD.encode(p.connection_key()),
        )
        .env("CONNECTION_ENCRYPTION_KEY_ID", "k1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(format!(r#"{{"key": "{PROVIDER_KEY}"}}"#).as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "connections add: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    p.grant_connection("@model", "openai-key");
    let fake = fake_provider::start(Duration::ZERO).await;
    let sc = spawn_sidecar(&config(
        &p,
        Provider::Openai,
        &format!("http://{HOST}:{}/v1", fake.port()),
    ));
    let token = p.sidecar_token.expose_secret().to_owned();
    let auth = format!("Bearer {token}");
    let (status, _, b) = http(
        sc.tcp(),
        "POST",
        "/llm/v1/chat/completions",
        &[
            ("authorization", &auth),
            ("content-type", "application/json"),
        ],
        br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&b));
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(
        reqs[0].header("authorization"),
        Some(format!("Bearer {PROVIDER_KEY}").as_str())
    );
    assert!(!String::from_utf8_lossy(&b).contains(PROVIDER_KEY));
}

/// The relay holds the model key between calls (spec: the sidecar "holds,
/// or fetches, the provider credential"), and a provider's refusal of it
/// makes the relay fetch it again: a key rotated on the platform after a
/// provider revoked the old one is in use from the call after the refusal.
/// The agent never sees either key, and a refused call is typed as the
/// provider's 401, not retried behind the agent's back.
#[tokio::test(flavor = "multi_thread")]
async fn a_held_model_key_is_fetched_again_when_the_provider_refuses_it() {
    const OLD: &str = "sk-live-old-key-41d2";
    const NEW: &str = "sk-live-new-key-9be0";
    let (p, fake, sc) = openai_env("agent-llm-key-rotation", OLD).await;
    let token = p.sidecar_token.expose_secret().to_owned();
    let auth = format!("Bearer {token}");
    let call = || {
        http(
            sc.tcp(),
            "POST",
            "/llm/v1/chat/completions",
            &[
                ("authorization", &auth),
                ("content-type", "application/json"),
            ],
            br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
        )
    };
    let (status, _, b) = call();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&b));
    // The operator rotates the key on the platform; the provider has not
    // revoked the old one yet: the held key still serves (for at most a
    // minute, which this test does not wait for).
    p.replace_connection("@model", &[("key", NEW)]).await;
    let (status, _, b) = call();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&b));
    // The provider revokes the old key: that call fails as the provider
    // said, once, and the relay forgets the key.
    fake.revoke(OLD);
    let (status, _, b) = call();
    assert_eq!(status, 401, "{}", String::from_utf8_lossy(&b));
    let refused = String::from_utf8_lossy(&b).to_string();
    assert!(refused.contains("invalid_api_key"), "{refused}");
    // The next call fetches the platform's key of now.
    let (status, _, b) = call();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&b));
    assert_eq!(fake.keys(), [OLD, OLD, OLD, NEW]);
    for answer in [&refused, &String::from_utf8_lossy(&b).to_string()] {
        assert!(!answer.contains(OLD) && !answer.contains(NEW), "{answer}");
    }
}

/// A sidecar whose model is an OpenAI-style fake (no delay between
/// events), with `key` as the model key.
async fn openai_env(agent: &str, key: &str) -> (TestPlatform, FakeProvider, SidecarProcess) {
    let p = TestPlatform::start(agent).await;
    add_model_key(&p, key).await;
    let (fake, sc) = openai_sidecar(&p).await;
    (p, fake, sc)
}

/// An OpenAI-style fake (no delay between events), and a sidecar of `p`
/// whose model it is.
async fn openai_sidecar(p: &TestPlatform) -> (FakeProvider, SidecarProcess) {
    let fake = fake_provider::start(Duration::ZERO).await;
    let sc = spawn_sidecar(&config(
        p,
        Provider::Openai,
        &format!("http://{HOST}:{}/v1", fake.port()),
    ));
    (fake, sc)
}

/// A sidecar for an Anthropic-style fake with `delay` between events.
async fn anthropic_env(
    agent: &str,
    delay: Duration,
) -> (TestPlatform, FakeProvider, SidecarProcess) {
    let p = TestPlatform::start(agent).await;
    add_model_key(&p, PROVIDER_KEY).await;
    let fake = fake_provider::start(delay).await;
    let sc = spawn_sidecar(&config(
        &p,
        Provider::Anthropic,
        &format!("http://{HOST}:{}", fake.port()),
    ));
    (p, fake, sc)
}

/// An agent opens a model stream, reads two events, closes it and exits;
/// the run ends at once (SIGTERM). The sidecar reads the rest before it
/// exits: the call is metered in full and in the egress log.
#[tokio::test(flavor = "multi_thread")]
async fn an_agent_that_leaves_a_stream_and_exits_still_pays() {
    if !python_has(&["anthropic"]) {
        return;
    }
    let (p, _fake, mut sc) = anthropic_env("agent-llm-leaves", Duration::from_millis(100)).await;
    let token = p.sidecar_token.expose_secret().to_owned();
    let base = format!("http://{}/llm", sc.tcp());
    let out = run_python(vec![
        script("llm_hangup.py"),
        base,
        token,
        ANTHROPIC_MODEL.into(),
        "2".into(),
    ])
    .await;
    assert_eq!(
        out["events"],
        json!(["message_start", "content_block_start"])
    );
    terminate(&mut sc);
    let c = costs(&p.events().await);
    assert_eq!(
        c.len(),
        1,
        "no cost event for the stream the agent left: {c:?}"
    );
    assert_eq!((c[0].input_tokens, c[0].output_tokens), ANTHROPIC_USAGE);
    assert!(!unmetered(&c[0]), "{c:?}");
    let log = p.egress_log().await;
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(
        (
            log[0].source.as_str(),
            log[0].status,
            outcome(&log[0]),
            metering(&log[0])
        ),
        ("llm", Some(200), Some("completed"), Some("metered")),
        "{log:?}"
    );
    assert!(log[0].bytes_in > 0);
}

/// The same, but the provider's stream never ends (its usage never comes):
/// the sidecar does not wait past its drain deadline, and the call is
/// recorded as unmetered with the tokens it saw (the input, from
/// `message_start`).
#[tokio::test(flavor = "multi_thread")]
async fn usage_that_never_arrives_is_recorded_as_unmetered() {
    if !python_has(&["anthropic"]) {
        return;
    }
    let (p, _fake, mut sc) = anthropic_env("agent-llm-stalls", Duration::from_millis(20)).await;
    let token = p.sidecar_token.expose_secret().to_owned();
    let base = format!("http://{}/llm", sc.tcp());
    let out = run_python(vec![
        script("llm_hangup.py"),
        base,
        token,
        STALL_MODEL.into(),
        "2".into(),
    ])
    .await;
    assert_eq!(out["events"].as_array().map(Vec::len), Some(2), "{out}");
    let took = terminate(&mut sc);
    assert!(took < Duration::from_secs(4), "the drain took {took:?}");
    let c = costs(&p.events().await);
    assert_eq!(c.len(), 1, "{c:?}");
    assert!(unmetered(&c[0]), "{c:?}");
    assert_eq!(
        c[0].input_tokens, ANTHROPIC_USAGE.0,
        "the tokens seen: {c:?}"
    );
    let log = p.egress_log().await;
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(
        (outcome(&log[0]), metering(&log[0])),
        (Some("aborted"), Some("unmetered")),
        "{log:?}"
    );
    let run = p.store().get_run(&p.run_id).await.unwrap().unwrap();
    assert_eq!(run.tokens_in, i64::try_from(ANTHROPIC_USAGE.0).unwrap());
}

/// A full embeddings batch (2,048 inputs) whose answer is larger than
/// 16 MiB arrives intact through the official SDK and is metered.
#[tokio::test(flavor = "multi_thread")]
async fn an_answer_past_16_mib_is_metered() {
    if !python_has(&["openai"]) {
        return;
    }
    let p = TestPlatform::start("agent-llm-embeddings").await;
    add_model_key(&p, PROVIDER_KEY).await;
    let fake = fake_provider::start(Duration::ZERO).await;
    let mut sc = spawn_sidecar(&config(
        &p,
        Provider::Openai,
        &format!("http://{HOST}:{}/v1", fake.port()),
    ));
    let token = p.sidecar_token.expose_secret().to_owned();
    let (n, dims) = (2048usize, 2000usize);
    let out = run_python(vec![
        script("llm_embeddings.py"),
        format!("http://{}/llm/v1", sc.tcp()),
        token,
        n.to_string(),
        dims.to_string(),
    ])
    .await;
    let expected_sum: f64 = (0..n)
        .map(|i| {
            (0..dims)
                .map(|j| f64::from(((i * 31 + j) % 1000) as f32 / 1000.0))
                .sum::<f64>()
        })
        .sum();
    let tokens = n as u64 * EMBED_TOKENS_PER_INPUT;
    assert_eq!(out["count"], json!(n));
    assert_eq!(out["dims"], json!([dims]));
    assert!(
        (out["checksum"].as_f64().unwrap() - expected_sum).abs() < 1.0,
        "{out} vs {expected_sum}"
    );
    assert_eq!(out["usage"], json!([tokens, tokens]));
    sc.stop();
    let log = p.egress_log().await;
    assert_eq!(log.len(), 1, "{log:?}");
    assert!(
        log[0].bytes_in > 16 * 1024 * 1024,
        "the answer is past the old metering copy: {} bytes",
        log[0].bytes_in
    );
    let c = costs(&p.events().await);
    assert_eq!(c.len(), 1, "{c:?}");
    assert_eq!(
        (c[0].input_tokens, c[0].output_tokens),
        (tokens, 0),
        "{c:?}"
    );
}

/// A hostile agent asks the *provider* to reach hosts for it (an image by
/// URL, a hosted MCP server, web search and fetch, the betas that enable
/// them): each is refused before the provider is called, typed, with an
/// egress record of source `llm`; `data:` images and plain requests go
/// through, and what the manifest names (a tool, a URL pattern) is allowed,
/// the URL still judged by the guard (on main all of these reached the
/// provider unchanged).
#[tokio::test(flavor = "multi_thread")]
async fn a_model_request_that_asks_the_provider_to_fetch_is_refused() {
    let p = TestPlatform::start("agent-llm-provider-fetch").await;
    add_model_key(&p, PROVIDER_KEY).await;
    let token = p.sidecar_token.expose_secret().to_owned();
    let auth = format!("Bearer {token}");
    let h = [
        ("authorization", auth.as_str()),
        ("content-type", "application/json"),
    ];
    let err = |b: &[u8]| -> Value { serde_json::from_slice(b).unwrap_or(Value::Null) };
    let fake = fake_provider::start(Duration::ZERO).await;
    let base = format!("http://{HOST}:{}/v1", fake.port());
    let image = |url: &str| {
        json!({"model": "m", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "what is in it?"},
            {"type": "image_url", "image_url": {"url": url}},
        ]}]})
        .to_string()
    };
    let mut sc = spawn_sidecar(&config(&p, Provider::Openai, &base));
    let attacks = [
        image("https://img.test/cat.png"),
        image("http://169.254.169.254/latest/meta-data/"),
        json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
               "tools": [{"type": "web_search_preview"}]})
        .to_string(),
        json!({"model": "m", "input": "hi",
               "tools": [{"type": "mcp", "server_label": "x", "server_url": "https://mcp.evil.test/sse", "require_approval": "never"}]})
        .to_string(),
    ];
    for (i, a) in attacks.iter().enumerate() {
        let path = if i == 3 {
            "/llm/v1/responses"
        } else {
            "/llm/v1/chat/completions"
        };
        let (status, _, b) = http(sc.tcp(), "POST", path, &h, a.as_bytes());
        assert_eq!(status, 403, "attack {i}: {}", String::from_utf8_lossy(&b));
        assert_eq!(err(&b)["error"]["code"], "not_authorized", "attack {i}");
    }
    assert_eq!(fake.requests().len(), 0, "an attack reached the provider");
    // The legitimate paths: a data: image, a plain request.
    let data = image("data:image/png;base64,iVBORw0KGgo=");
    let plain = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).to_string();
    for b in [&data, &plain] {
        let (status, _, body) = http(
            sc.tcp(),
            "POST",
            "/llm/v1/chat/completions",
            &h,
            b.as_bytes(),
        );
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    }
    assert_eq!(fake.requests().len(), 2);
    sc.stop();

    // Anthropic: hosted MCP servers, the web_fetch server tool, the beta.
    let mut sc = spawn_sidecar(&config(
        &p,
        Provider::Anthropic,
        &format!("http://{HOST}:{}", fake.port()),
    ));
    let msg = |extra: Value| {
        let mut m = json!({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]});
        if let (Some(m), Value::Object(extra)) = (m.as_object_mut(), extra) {
            m.extend(extra);
        }
        m.to_string()
    };
    let beta = [
        ("authorization", auth.as_str()),
        ("content-type", "application/json"),
        ("anthropic-beta", "mcp-client-2025-04-04"),
    ];
    for (hdrs, body) in [
        (
            &h[..],
            msg(
                json!({"mcp_servers": [{"type": "url", "url": "https://mcp.evil.test/mcp", "name": "m"}]}),
            ),
        ),
        (
            &h[..],
            msg(json!({"tools": [{"type": "web_fetch_20250910", "name": "web_fetch"}]})),
        ),
        (&beta[..], msg(json!({}))),
    ] {
        let (status, _, b) = http(sc.tcp(), "POST", "/llm/v1/messages", hdrs, body.as_bytes());
        assert_eq!(status, 403, "{}", String::from_utf8_lossy(&b));
    }
    assert_eq!(
        fake.requests().len(),
        2,
        "an Anthropic attack reached the provider"
    );
    sc.stop();

    let log = p.egress_log().await;
    let refused: Vec<&str> = log
        .iter()
        .filter(|e| e.source.as_str() == "llm" && e.decision == EgressDecision::Refused)
        .map(|e| e.url.as_str())
        .collect();
    assert_eq!(refused.len(), 7, "{log:?}");
    assert!(refused.contains(&"https://img.test/cat.png"), "{refused:?}");
    assert!(
        refused.contains(&"provider-tool:web_search_preview"),
        "{refused:?}"
    );

    // Named in the manifest: the tool and the URL go through; a URL the
    // pattern covers but the guard refuses (a blocked address) does not.
    let cfg = config_builder(&p, Provider::Openai, &base)
        .model_with(|m| {
            m.provider_tools = vec!["web_search_preview".into()];
            m.provider_fetch_uris = vec![
                "https://img.test/**".into(),
                "https://blocked.internal.test/**".into(),
            ];
        })
        .resolve("img.test", "93.184.215.14")
        .build();
    let mut sc = spawn_sidecar(&cfg);
    for b in [&attacks[0], &attacks[2]] {
        let (status, _, body) = http(
            sc.tcp(),
            "POST",
            "/llm/v1/chat/completions",
            &h,
            b.as_bytes(),
        );
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    }
    let (status, _, b) = http(
        sc.tcp(),
        "POST",
        "/llm/v1/chat/completions",
        &h,
        image("https://blocked.internal.test/x.png").as_bytes(),
    );
    assert_eq!(status, 403, "{}", String::from_utf8_lossy(&b));
    assert_eq!(err(&b)["error"]["code"], "blocked_address");
    assert_eq!(fake.requests().len(), 4);
    sc.stop();
}

/// Issue 44.6: a provider reporting `prompt_tokens = 2^64-1` (and 2^63
/// out) must not leave the run with negative or wrapped tokens or cost:
/// the call is recorded as unmetered with a reason, and the run's totals
/// stay what the believable calls made them. The legitimate call before it
/// is metered as reported.
#[tokio::test(flavor = "multi_thread")]
async fn hostile_usage_numbers_are_recorded_as_unmetered_never_wrapped() {
    let (p, _fake, sc) = openai_env("agent-llm-huge", PROVIDER_KEY).await;
    let c = chat_costs(&p, &sc, &[CHAT_MODEL, HUGE_USAGE_MODEL]).await;
    assert!(!unmetered(&c[0]), "{c:?}");
    assert_eq!((c[0].input_tokens, c[0].output_tokens), CHAT_USAGE);
    assert!(unmetered(&c[1]), "{c:?}");
    assert_eq!((c[1].input_tokens, c[1].output_tokens), (0, 0), "{c:?}");
    assert_eq!(c[1].cost_microusd, Some(0), "{c:?}");
    let why = c[1].unmetered_reason.as_deref().unwrap_or("");
    assert!(why.contains("18446744073709551615"), "{c:?}");
    let run = p.store().get_run(&p.run_id).await.unwrap().unwrap();
    assert_eq!(
        (run.tokens_in, run.tokens_out),
        (
            i64::try_from(CHAT_USAGE.0).unwrap(),
            i64::try_from(CHAT_USAGE.1).unwrap()
        ),
        "{run:?}"
    );
    assert!(run.cost_microusd >= 0, "{run:?}");
    drop(sc);
}

/// One chat completion through the relay for each of `models` (each
/// answered 200), and the cost events of them all.
async fn chat_costs(p: &TestPlatform, sc: &SidecarProcess, models: &[&str]) -> Vec<CostRecord> {
    let auth = format!("Bearer {}", p.sidecar_token.expose_secret());
    let h = [
        ("authorization", auth.as_str()),
        ("content-type", "application/json"),
    ];
    for model in models {
        let body =
            json!({"model": model, "messages": [{"role": "user", "content": "hi"}]}).to_string();
        let (status, _, b) = http(
            sc.tcp(),
            "POST",
            "/llm/v1/chat/completions",
            &h,
            body.as_bytes(),
        );
        assert_eq!(status, 200, "{model}: {}", String::from_utf8_lossy(&b));
    }
    eventually(10, || async {
        let c = costs(&p.events().await);
        (c.len() == models.len()).then_some(c)
    })
    .await
    .expect("a cost event per call")
}

/// Issue 44.1, the model relay: a provider (or an echoing proxy in front of
/// it) that reflects the key it received — raw, JSON-escaped,
/// percent-encoded, base64 in both alphabets, in its text and in a header
/// the relay passes back, a stream written one byte per chunk — hands no
/// piece of it to the agent, in a JSON answer, a stream (usage chunk
/// dropped or asked for) or an error. The legitimate text arrives and the
/// calls are metered as the provider reported; an answer encoded so the
/// relay cannot read it is withheld (on main every form reached the agent).
#[tokio::test(flavor = "multi_thread")]
async fn a_provider_that_reflects_the_key_does_not_hand_it_to_the_agent() {
    const KEY: &str = "sk-live-Pr0vider/Key+7f3a&9c<x>";
    let (p, _fake, sc) = openai_env("agent-llm-reflect", KEY).await;
    let token = p.sidecar_token.expose_secret().to_owned();
    // No 12 characters in a row of any reflection reach the agent.
    let pieces: Vec<String> = reflections(KEY)
        .iter()
        .flat_map(|r| {
            let r: Vec<char> = r.chars().collect();
            r.windows(12)
                .map(|w| w.iter().collect::<String>())
                .collect::<Vec<_>>()
        })
        .collect();
    let assert_clean = |what: &str, headers: &[(String, String)], body: &[u8]| {
        let seen = format!("{headers:?} {}", String::from_utf8_lossy(body));
        for piece in &pieces {
            assert!(
                !seen.contains(piece.as_str()),
                "{what}: {piece:?} reached the agent: {seen}"
            );
        }
    };
    let call = |extra: Value| {
        let mut body =
            json!({"model": REFLECT_MODEL, "messages": [{"role": "user", "content": "hi"}]});
        if let (Some(b), Value::Object(extra)) = (body.as_object_mut(), extra) {
            b.extend(extra);
        }
        post_json(sc.tcp(), "/llm/v1/chat/completions", &token, &body)
    };

    let (status, headers, b) = call(json!({}));
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&b));
    assert_clean("JSON", &headers, &b);
    let answer: Value = serde_json::from_slice(&b).expect("a JSON answer");
    let text = answer["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(text.starts_with(&PIECES.concat()), "{text}");
    assert!(text.contains("[REDACTED]"), "{text}");
    let request_id = headers.iter().find(|(k, _)| k == "x-request-id");
    assert_eq!(request_id.map(|(_, v)| v.as_str()), Some("req_[REDACTED]"));

    for (what, extra) in [
        ("a stream", json!({"stream": true})),
        (
            "a stream asking for usage",
            json!({"stream": true, "stream_options": {"include_usage": true}}),
        ),
    ] {
        let (status, headers, b) = call(extra);
        assert_eq!(status, 200, "{what}: {}", String::from_utf8_lossy(&b));
        assert_clean(what, &headers, &b);
        let body = String::from_utf8_lossy(&b);
        let text: String = body
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .filter_map(|v| {
                v["choices"][0]["delta"]["content"]
                    .as_str()
                    .map(str::to_owned)
            })
            .collect();
        assert!(text.starts_with(&PIECES.concat()), "{what}: {text}");
        assert_eq!(text.matches("[REDACTED]").count(), 5, "{what}: {text}");
        assert_eq!(
            body.contains("\"prompt_tokens\""),
            what.contains("usage"),
            "{what}: {body}"
        );
    }

    let (status, headers, b) = call(json!({"user": "error"}));
    assert_eq!(status, 400, "{}", String::from_utf8_lossy(&b));
    assert_clean("an error", &headers, &b);
    assert!(String::from_utf8_lossy(&b).contains("bad request from"));

    let (status, headers, b) = call(json!({"user": "gzip"}));
    assert_eq!(status, 502, "{}", String::from_utf8_lossy(&b));
    assert_clean("an encoded answer", &headers, &b);
    let err: Value = serde_json::from_slice(&b).unwrap_or(Value::Null);
    assert_eq!(err["error"]["code"], "unredactable_response", "{err}");

    let c = eventually(10, || async {
        let c = costs(&p.events().await);
        (c.len() == 4).then_some(c)
    })
    .await
    .expect("a cost event for each generation that answered 200");
    for record in &c[..3] {
        assert!(!unmetered(record), "{c:?}");
        assert_eq!((record.input_tokens, record.output_tokens), CHAT_USAGE);
    }
    assert!(unmetered(&c[3]), "{c:?}");
    let log = eventually(10, || async {
        let log = p.egress_log().await;
        (log.len() == 5).then_some(log)
    })
    .await
    .expect("an egress record for each call");
    assert_eq!(outcome(&log[4]), Some("withheld"), "{log:?}");
    drop(sc);
}

/// Issue 50.1: a model the registry prices (the live catalog's prices, in
/// the run's `known_prices`) is metered at that price when the manifest
/// names none; a model it does not list stays unpriced; and a manifest
/// price wins over the registry's.
#[tokio::test(flavor = "multi_thread")]
async fn the_registry_prices_a_call_the_manifest_does_not() {
    let known = |m: &mut airlock_platform_api::launch::Model| {
        m.known_prices = vec![airlock_platform_api::launch::ModelPrice {
            model: CHAT_MODEL.into(),
            price_in_per_mtok_usd: Some(4.0),
            price_out_per_mtok_usd: Some(20.0),
        }];
    };
    for (manifest_price, want) in [
        (None, Some((4.0, 20.0))),
        (Some((2.5, 10.0)), Some((2.5, 10.0))),
    ] {
        let p = TestPlatform::start("agent-llm-catalog").await;
        add_model_key(&p, PROVIDER_KEY).await;
        let fake = fake_provider::start(Duration::ZERO).await;
        let base = format!("http://{HOST}:{}/v1", fake.port());
        let cfg = config_builder(&p, Provider::Openai, &base)
            .model_with(|m| {
                m.price_in_per_mtok_usd = manifest_price.map(|p| p.0);
                m.price_out_per_mtok_usd = manifest_price.map(|p| p.1);
                known(m);
            })
            .build();
        let sc = spawn_sidecar(&cfg);
        let c = chat_costs(&p, &sc, &[CHAT_MODEL, "gpt-not-in-the-catalog"]).await;
        let (pin, pout) = want.unwrap();
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let expect =
            (c[0].input_tokens as f64 * pin + c[0].output_tokens as f64 * pout).round() as u64;
        assert_eq!(c[0].cost_microusd, Some(expect), "{c:?}");
        // The fake answers every model as CHAT_MODEL; the price follows
        // the request's model, which the catalog does not list.
        let other = if manifest_price.is_some() {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let e =
                (c[1].input_tokens as f64 * pin + c[1].output_tokens as f64 * pout).round() as u64;
            Some(e)
        } else {
            None
        };
        assert_eq!(c[1].cost_microusd, other, "{c:?}");
        drop(sc);
    }
}

/// Issue 50.4: a run's model key is the manifest's connection, else the
/// organization's connection for the provider (`model.openai`), else the
/// operator's (`SYSTEM_PROVIDER_KEYS`), resolved at each fetch of the
/// relay. The fake provider records which key reached it; the agent's
/// answers (the provider reflecting the key back included) hold none of
/// them; and each call's cost names the key that paid, from what the
/// platform handed, never the key itself.
#[tokio::test(flavor = "multi_thread")]
async fn provider_keys_come_from_the_manifest_then_the_organization_then_the_operator() {
    const SYSTEM: &str = "sk-live-system-key-5e1c";
    const ORG: &str = "sk-live-organization-key-a83d";
    const MANIFEST: &str = "sk-live-manifest-key-2b77";
    use airlock_store::AuthType::ApiKey;
    let p = TestPlatform::start("agent-llm-provider-keys").await;
    p.grant_model(Provider::Openai, Some(SYSTEM));
    let (fake, sc) = openai_sidecar(&p).await;
    let token = p.sidecar_token.expose_secret().to_owned();
    let call = |model: &str| {
        post_json(
            sc.tcp(),
            "/llm/v1/chat/completions",
            &token,
            &json!({"model": model, "messages": [{"role": "user", "content": "hi"}]}),
        )
    };
    let mut answers = Vec::new();
    // The provider refuses the key the relay holds (which makes the relay
    // fetch the platform's key of now), then two calls are answered, one
    // by the model that reflects the key it received.
    let mut refused_then_answered = |held: Option<&str>| {
        if let Some(held) = held {
            fake.revoke(held);
            assert_eq!(call("m").0, 401);
        }
        for model in ["m", REFLECT_MODEL] {
            let (status, headers, b) = call(model);
            assert_eq!(status, 200, "{}", String::from_utf8_lossy(&b));
            answers.push(format!("{headers:?} {}", String::from_utf8_lossy(&b)));
        }
    };
    // The operator's key.
    refused_then_answered(None);
    // The organization stores its own key: in use from the relay's next
    // fetch.
    p.store_connection("model.openai", ApiKey, &[("key", ORG)])
        .await;
    refused_then_answered(Some(SYSTEM));
    // The manifest's own connection wins over both.
    p.add_connection("@model", ApiKey, &[("key", MANIFEST)])
        .await;
    refused_then_answered(Some(ORG));
    assert_eq!(
        fake.keys(),
        [SYSTEM, SYSTEM, SYSTEM, ORG, ORG, ORG, MANIFEST, MANIFEST]
    );
    for answer in &answers {
        for key in [SYSTEM, ORG, MANIFEST] {
            for reflection in reflections(key) {
                assert!(
                    !answer.contains(&reflection),
                    "{key} reached the agent: {answer}"
                );
            }
        }
    }
    // Each answered call's cost names its payer.
    let store = p.store();
    let paid_by = eventually(10, || async {
        p.ingest_journal().await;
        let costs = store.events_of_kind(&p.run_id, "cost", 100).await.unwrap();
        let payers = store
            .events_of_kind(&p.run_id, airlock_platform::provider_keys::PAYER_EVENT, 100)
            .await
            .unwrap();
        let run = store.get_run(&p.run_id).await.unwrap()?;
        let cost = airlock_api::v1::RunCost::of(&run, &costs, &payers);
        let paid: Vec<Option<String>> = cost
            .calls
            .iter()
            .filter(|c| c.tokens_in > 0)
            .map(|c| c.paid_by.clone())
            .collect();
        (paid.len() == 6).then_some((paid, payers))
    })
    .await
    .expect("a cost event for each answered call");
    let (paid, payers) = paid_by;
    let label = |s: &str| Some(s.to_owned());
    assert_eq!(
        paid,
        [
            label("system:openai"),
            label("system:openai"),
            label("organization:model.openai"),
            label("organization:model.openai"),
            label("manifest:model-conn"),
            label("manifest:model-conn"),
        ]
    );
    for e in &payers {
        for key in [SYSTEM, ORG, MANIFEST] {
            assert!(!e.payload.contains(key), "{}", e.payload);
        }
    }
    drop(sc);
}

/// A run whose model has no key anywhere (no manifest connection, no
/// organization connection, no operator key) gets none from the platform:
/// the relay's call is refused typed, and reaches nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_model_with_no_key_anywhere_is_refused_and_reaches_nothing() {
    let p = TestPlatform::start("agent-llm-no-key").await;
    p.grant_model(Provider::Openai, None);
    let (fake, sc) = openai_sidecar(&p).await;
    let token = p.sidecar_token.expose_secret().to_owned();
    let (status, _, b) = post_json(
        sc.tcp(),
        "/llm/v1/chat/completions",
        &token,
        &json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(status, 503, "{}", String::from_utf8_lossy(&b));
    assert!(String::from_utf8_lossy(&b).contains("model_credential_missing"));
    assert!(fake.requests().is_empty());
}
