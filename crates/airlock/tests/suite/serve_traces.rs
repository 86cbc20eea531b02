//! `airlock serve`'s OpenTelemetry traces (issue 49), received by a
//! loopback OTLP/HTTP receiver that decodes the official
//! `opentelemetry-proto` messages: one run's span tree (its root, start,
//! each `api_call` and its model call with the sidecar's own steps as their
//! children, teardown) in one trace, with no canary in any attribute; and a collector
//! the egress guard refuses stops the boot, having received nothing.

use std::time::{Duration, Instant};

use airlock_test_support::fake_provider;
use airlock_test_support::otlp_receiver::{OtlpReceiver, ReceivedSpan};
use serde_json::json;

use crate::serve_metrics::register_probe;
use crate::support::serve::{Server, base_env, command, create_org, wait_for};

const CANARY: &str = "CANARY-traces-51c2e8";

#[test]
fn one_run_is_one_trace_with_its_requests_and_no_secret() {
    if !crate::support::namespace_available() {
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let fake = rt.block_on(fake_provider::start(Duration::ZERO));
    let receiver = rt.block_on(OtlpReceiver::start());
    let home = tempfile::Builder::new()
        .prefix("airlock-traces-")
        .tempdir()
        .unwrap();
    let mut env = base_env(home.path(), None);
    env.push(("OTEL_EXPORTER_OTLP_ENDPOINT".into(), receiver.endpoint()));
    // The SDK's own variable: export soon after a span ends.
    env.push(("OTEL_BSP_SCHEDULE_DELAY".into(), "100".into()));
    env.push(("OTEL_SERVICE_NAME".into(), "airlock-test".into()));
    let s = Server::start(&env, "namespace", home.path().join("serve.log"));
    let (_, key) = create_org(&env, "Acme", &[]);
    register_probe(&s, &key, fake.port(), CANARY);
    let (st, v) = s.call(
        "POST",
        "/v1/runs",
        Some(&key),
        Some(&json!({"agent": "probe", "prompt": format!("refuse call model {CANARY}")})),
    );
    assert_eq!(st, 202, "{v}");
    let id = v["id"].as_str().unwrap().to_owned();
    let run = wait_for(&s, &format!("/v1/runs/{id}"), &key, 120, |v| {
        v["status"] != "queued" && v["status"] != "running"
    });
    assert_eq!(run["status"], "succeeded", "{run}");

    // The run's spans arrive in the exporter's batches: wait for its root.
    let deadline = Instant::now() + Duration::from_secs(30);
    let spans: Vec<ReceivedSpan> = loop {
        let spans = receiver.spans();
        let root = spans
            .iter()
            .find(|sp| sp.name == "run" && sp.attribute("airlock.run.id") == Some(&id));
        if let Some(root) = root {
            let trace = root.trace_id.clone();
            break spans
                .into_iter()
                .filter(|sp| sp.trace_id == trace)
                .collect();
        }
        assert!(
            Instant::now() < deadline,
            "no run span received ({} requests, spans {spans:#?})\n{}",
            receiver.requests(),
            s.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let names = |n: &str| spans.iter().filter(|sp| sp.name == n).collect::<Vec<_>>();
    let root = names("run")[0].clone();
    assert!(root.parent_span_id.is_empty(), "the run's span is the root");
    assert_eq!(root.trace_id.len(), 16);
    assert_eq!(
        root.service, "airlock-test",
        "OTEL_SERVICE_NAME is honoured"
    );
    assert_eq!(root.attribute("airlock.run.status"), Some("succeeded"));
    let children_of_root = ["start", "teardown", "api_call", "model_call"];
    for name in children_of_root {
        let found = names(name);
        assert!(!found.is_empty(), "no {name} span: {spans:#?}");
        for sp in found {
            assert_eq!(
                sp.parent_span_id, root.span_id,
                "{name}'s parent is the run"
            );
        }
    }
    // The sidecar's own steps are children of the request they belong to.
    let steps_of = |parent: &ReceivedSpan| {
        let mut names: Vec<String> = spans
            .iter()
            .filter(|sp| sp.parent_span_id == parent.span_id)
            .map(|sp| sp.name.clone())
            .collect();
        names.sort();
        names
    };
    let calls = names("api_call");
    assert_eq!(calls.len(), 3, "{calls:#?}");
    let (refused, allowed): (Vec<_>, Vec<_>) = calls
        .into_iter()
        .partition(|c| c.attribute("airlock.egress.decision") == Some("refused"));
    assert_eq!(refused.len(), 2, "{refused:#?}");
    for c in &refused {
        assert_eq!(c.attribute("airlock.egress.code"), Some("not_authorized"));
        assert_eq!(steps_of(c), ["guard"], "a refusal's one step");
    }
    assert_eq!(
        allowed[0].attribute("http.response.status_code"),
        Some("200")
    );
    assert_eq!(
        steps_of(allowed[0]),
        ["credential", "guard", "redaction", "upstream"],
        "a credentialed api_call's steps"
    );
    let model = names("model_call");
    assert_eq!(model.len(), 1);
    assert_eq!(model[0].attribute("http.response.status_code"), Some("200"));
    assert_eq!(
        steps_of(model[0]),
        ["credential", "guard", "upstream"],
        "a model call's steps (its redaction streams within the upstream's)"
    );
    for name in ["guard", "credential", "upstream", "redaction"] {
        for sp in names(name) {
            let parent = spans.iter().find(|p| p.span_id == sp.parent_span_id);
            assert!(
                parent.is_some_and(|p| p.start_unix_nano <= sp.start_unix_nano
                    && sp.end_unix_nano <= p.end_unix_nano),
                "{name} lies within its request: {sp:#?} {parent:#?}"
            );
        }
    }
    for sp in &spans {
        assert!(sp.start_unix_nano <= sp.end_unix_nano, "{sp:#?}");
        for (k, v) in &sp.attributes {
            assert!(
                !v.contains(CANARY) && !k.contains(CANARY),
                "the canary in {}'s {k}: {v}",
                sp.name
            );
            assert!(!v.contains('?'), "a query in {}'s {k}: {v}", sp.name);
        }
    }
}

#[test]
fn a_collector_the_egress_guard_refuses_stops_the_boot() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let receiver = rt.block_on(OtlpReceiver::start());
    let home = tempfile::Builder::new()
        .prefix("airlock-traces-refused-")
        .tempdir()
        .unwrap();
    let mut env: Vec<(String, String)> = base_env(home.path(), None)
        .into_iter()
        .filter(|(k, _)| k != "EGRESS_ALLOW_INTERNAL_HOSTS")
        .collect();
    env.push(("OTEL_EXPORTER_OTLP_ENDPOINT".into(), receiver.endpoint()));
    let out = command(&env)
        .args(["serve", "--listen", "127.0.0.1:0", "--backend", "process"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("OTEL_EXPORTER_OTLP_ENDPOINT")
            && stderr.contains("blocked_address")
            && stderr.contains("EGRESS_ALLOW_INTERNAL_HOSTS"),
        "{stderr}"
    );
    assert_eq!(receiver.requests(), 0, "nothing was sent to it");
}
