//! The sidecar's front door, driven as the runtime and an attacker would:
//! the real `airlock sidecar` against a real platform (SQLite, internal API).
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use crate::support::*;
use airlock_platform::testing::TestPlatform;
use airlock_platform_api::wire::RunEvent;
use airlock_vault::ExposeSecret;
use serde_json::json;

fn on_tcp(p: &TestPlatform) -> SidecarConfig {
    p.sidecar_config().tcp().build()
}

#[tokio::test(flavor = "multi_thread")]
async fn health_is_open_everything_else_needs_the_token() {
    let p = TestPlatform::start("agent-a").await;
    let sc = spawn_sidecar(&on_tcp(&p));
    let token = p.sidecar_token.expose_secret().to_owned();
    let (status, _, body) = http(sc.tcp(), "GET", "/health", &[], b"");
    assert_eq!(status, 200);
    assert!(String::from_utf8_lossy(&body).contains(&p.run_id));
    let wrong = "0".repeat(token.len());
    let almost = format!("{}x", &token[..token.len() - 1]);
    let attempts: Vec<Vec<(&str, String)>> = vec![
        vec![],
        vec![("authorization", format!("Bearer {wrong}"))],
        vec![("authorization", format!("Bearer {almost}"))],
        vec![("authorization", token.clone())],
        vec![("x-api-key", token.to_uppercase())],
        vec![("proxy-authorization", format!("Bearer {token}"))],
        vec![("cookie", format!("token={token}"))],
    ];
    for headers in attempts {
        let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        // (`/mcp` and everything below it is one endpoint: no path under it
        // skips the check.)
        for path in [
            "/events",
            "/mcp",
            "/mcp/",
            "/mcp/anything",
            "/llm/v1/chat/completions",
        ] {
            let (status, _, body) = http(sc.tcp(), "POST", path, &h, b"{}");
            assert_eq!(status, 401, "{path} with {headers:?}");
            assert_eq!(
                serde_json::from_slice::<serde_json::Value>(&body).unwrap(),
                json!({"error": "unauthorized"})
            );
        }
        // (`POST /mcp` has a path of its own to the endpoint; every other
        // method goes through the router: both check.)
        for method in ["GET", "DELETE", "PUT"] {
            for path in ["/mcp", "/mcp/"] {
                let (status, _, _) = http(sc.tcp(), method, path, &h, b"");
                assert_eq!(status, 401, "{method} {path} with {headers:?}");
            }
        }
    }
    for header in ["authorization", "x-api-key", "x-airlock-sidecar-auth"] {
        let value = if header == "authorization" {
            format!("Bearer {token}")
        } else {
            token.clone()
        };
        let batch = json!({"events": [{"type": "heartbeat", "at": 1}]}).to_string();
        let (status, _, _) = http(
            sc.tcp(),
            "POST",
            "/events",
            &[(header, &value), ("content-type", "application/json")],
            batch.as_bytes(),
        );
        assert_eq!(status, 202, "{header}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn events_reach_the_platform_and_forged_ones_are_refused() {
    let p = TestPlatform::start("agent-b").await;
    let mut sc = spawn_sidecar(&on_tcp(&p));
    let auth = format!("Bearer {}", p.sidecar_token.expose_secret());
    let h = [
        ("authorization", auth.as_str()),
        ("content-type", "application/json"),
    ];
    let batch = json!({"events": [
        {"type": "heartbeat", "at": 1000},
        {"type": "log", "at": 1001, "stream": "stdout", "line": "hello from the agent"},
        {"type": "result", "at": 1002, "exit_code": 0, "result": {"answer": 42}}
    ]});
    let (status, _, body) = http(
        sc.tcp(),
        "POST",
        "/events",
        &h,
        batch.to_string().as_bytes(),
    );
    assert_eq!(status, 202, "{}", String::from_utf8_lossy(&body));
    for forged in [
        json!({"events": [{"type": "cost", "at": 1, "provider": "openai", "model": "m", "input_tokens": 0, "output_tokens": 0}]}),
        json!({"events": [{"type": "egress", "at": 1, "source": "api_call", "method": "GET", "url": "x", "host": "x", "decision": "allowed"}]}),
        // The audit's own decisions: an agent cannot write them either.
        json!({"events": [{"type": "refusals", "at": 1, "code": "blocked_host", "host": "x", "count": 1}]}),
        json!({"events": [{"type": "tool_excluded", "at": 1, "integration": "gh", "tool": "x", "called": true}]}),
    ] {
        let (status, _, _) = http(
            sc.tcp(),
            "POST",
            "/events",
            &h,
            forged.to_string().as_bytes(),
        );
        assert_eq!(status, 403, "{forged}");
    }
    for bad in [
        &b"not json"[..],
        b"{\"events\": [{\"type\": \"nope\"}]}",
        b"{\"events\": 3}",
        b"{\"events\": [{\"type\": \"log\"",
    ] {
        let (status, _, _) = http(sc.tcp(), "POST", "/events", &h, bad);
        assert_eq!(status, 400, "{}", String::from_utf8_lossy(bad));
    }
    sc.stop();
    let events = p.events().await;
    assert!(
        events.contains(&RunEvent::Heartbeat { at: 1000 }),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|e| matches!(e, RunEvent::Log { line, .. } if line == "hello from the agent"))
    );
    assert!(
        events
            .iter()
            .any(|e| matches!(e, RunEvent::Result { exit_code: 0, .. }))
    );
    assert!(
        !events.iter().any(|e| matches!(e, RunEvent::Cost(_))),
        "a forged cost event was recorded"
    );
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, RunEvent::ToolExcluded { .. } | RunEvent::Refusals { .. })),
        "a forged audit event was recorded: {events:?}"
    );
    let run = p.store().get_run(&p.run_id).await.unwrap().unwrap();
    assert_eq!(run.last_heartbeat_at, Some(1000));
}

#[tokio::test(flavor = "multi_thread")]
async fn oversized_bodies_get_413_naming_the_limit_and_the_sidecar_keeps_serving() {
    let p = TestPlatform::start("agent-c").await;
    let cfg = p
        .sidecar_config()
        .tcp()
        .limits(|l| l.max_request_bytes = 4096)
        .build();
    let sc = spawn_sidecar(&cfg);
    let auth = format!("Bearer {}", p.sidecar_token.expose_secret());
    let big = vec![b'x'; 10_000];
    let (status, _, body) = http(
        sc.tcp(),
        "POST",
        "/events",
        &[("authorization", &auth)],
        &big,
    );
    assert_eq!(status, 413);
    assert!(
        String::from_utf8_lossy(&body).contains("4096"),
        "{}",
        String::from_utf8_lossy(&body)
    );
    let (status, _, _) = http(sc.tcp(), "GET", "/health", &[], b"");
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_configuration_is_refused_clearly() {
    use std::io::Write;
    for (cfg, want) in [
        ("not json", "not valid JSON"),
        ("{\"run_id\": \"r\"}", "missing field"),
        (
            "{\"run_id\":\"r\",\"sidecar_token\":\"short\",\"run_token\":\"r.x\",\"platform_socket\":\"/nonexistent\",\"listen\":{\"tcp\":\"127.0.0.1:0\"}}",
            "shorter than 32",
        ),
    ] {
        let mut child = std::process::Command::new(AIRLOCK)
            .arg("sidecar")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(cfg.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{cfg}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{cfg}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_token_is_not_in_the_sidecars_environment_or_command_line() {
    let p = TestPlatform::start("agent-d").await;
    let mut sc = spawn_sidecar_with_log(&on_tcp(&p), "trace");
    let token = p.sidecar_token.expose_secret().to_owned();
    let run_token = p.run_token.expose_secret().to_owned();
    let auth = format!("Bearer {token}");
    let (status, _, _) = http(
        sc.tcp(),
        "POST",
        "/events",
        &[("authorization", &auth)],
        json!({"events": [{"type": "heartbeat", "at": 5}]})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(status, 202);
    for file in ["environ", "cmdline"] {
        let raw = std::fs::read(format!("/proc/{}/{file}", sc.pid())).unwrap();
        let text = String::from_utf8_lossy(&raw);
        assert!(!text.contains(&token), "sidecar token in /proc/PID/{file}");
        assert!(!text.contains(&run_token), "run token in /proc/PID/{file}");
    }
    // The whole log, read to its end once the sidecar has exited.
    sc.stop();
    let log = sc.stderr();
    assert!(
        log.contains("sidecar ready"),
        "trace log was captured: {log}"
    );
    assert!(!log.contains(&token), "sidecar token in the sidecar log");
    assert!(!log.contains(&run_token), "run token in the sidecar log");
}
