//! A run's audit through `airlock serve`: `GET /v1/runs/{id}/audit.jsonl`
//! streams every decision of the run in pages, in time order, typed and
//! versioned, as native records or OCSF events; to its own organization
//! only.

use std::collections::BTreeSet;

use airlock_api::v1::{AuditDecider, AuditDecision, AuditKind, AuditRecord};
use airlock_platform_api::wire::RunEvent;
use airlock_store::{
    BatchWrite, EgressDecision, EgressOutcome, EgressPlane, EgressSource, NewEgress, NewEvent,
    RefusalCode, Store, StoreOptions,
};
use serde_json::{Value, json};

use crate::support::serve::{Server, agent_body, base_env, create_org, wait_for};

/// More than two pages of each table (a page reads 500 rows of each).
const EGRESS: i64 = 1234;
const EXCLUSIONS: i64 = 1100;

/// Writes the run's decisions into the server's store, as its sidecar's
/// journal would: egress records (every tenth refused by an L7 rule) and
/// tool exclusions between them in time, and log lines that are no
/// decision. Returns the first time used.
fn record_decisions(home: &std::path::Path, run_id: &str) -> i64 {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = Store::open_sqlite(&home.join("airlock.db"), &StoreOptions::default())
            .await
            .unwrap();
        let t0 = airlock_platform_api::clock::now_ms() + 60_000;
        let urls: Vec<String> = (0..EGRESS)
            .map(|i| format!("https://api.example.test/items/{i}"))
            .collect();
        let records: Vec<NewEgress<'_>> = urls
            .iter()
            .zip(0..)
            .map(|(url, i)| {
                let refused = i % 10 == 0;
                NewEgress {
                    run_id,
                    at: t0 + 2 * i,
                    source: EgressSource::ApiCall,
                    plane: EgressPlane::Api,
                    integration: Some("items"),
                    method: if refused { "DELETE" } else { "GET" },
                    url,
                    host: "api.example.test",
                    decision: if refused {
                        EgressDecision::Refused
                    } else {
                        EgressDecision::Allowed
                    },
                    reason: refused.then_some(RefusalCode::RuleRefused),
                    status: (!refused).then_some(200),
                    duration_ms: (!refused).then_some(3),
                    bytes_out: 0,
                    bytes_in: if refused { 0 } else { 100 },
                    seq: Some(i),
                    outcome: (!refused).then_some(EgressOutcome::Completed),
                    metering: None,
                    rule: refused.then_some("items-read"),
                }
            })
            .collect();
        store
            .append_egress_batch(&records, BatchWrite::Whole)
            .await
            .unwrap();
        for i in 0..EXCLUSIONS {
            let at = t0 + 1 + 2 * i;
            let e = RunEvent::ToolExcluded {
                at,
                integration: "items".into(),
                tool: format!("tool{i}"),
                called: i % 2 == 0,
            };
            for (kind, payload) in [
                (e.kind(), serde_json::to_string(&e).unwrap()),
                (
                    "log",
                    json!({"type": "log", "at": at, "stream": "stdout", "line": "no decision"})
                        .to_string(),
                ),
            ] {
                store
                    .append_event(&NewEvent {
                        run_id,
                        at,
                        payload: payload.as_str(),
                        kind,
                    })
                    .await
                    .unwrap();
            }
        }
        t0
    })
}

#[test]
fn a_runs_audit_streams_every_decision_in_order_and_to_its_organization_only() {
    let home = tempfile::Builder::new()
        .prefix("airlock-serve-")
        .tempdir()
        .unwrap();
    let env = base_env(home.path(), None);
    let s = Server::start(&env, "process", home.path().join("serve.log"));
    let (_, a_key) = create_org(&env, "A", &[]);
    let (_, b_key) = create_org(&env, "B", &[]);
    let a = Some(a_key.as_str());
    assert_eq!(
        s.call(
            "POST",
            "/v1/agents",
            a,
            Some(&agent_body("bot", "print('hi')", 10))
        )
        .0,
        201
    );
    let (st, run) = s.call("POST", "/v1/runs", a, Some(&json!({"agent": "bot"})));
    assert_eq!(st, 202, "{run}");
    let run_id = run["id"].as_str().unwrap().to_owned();
    wait_for(&s, &format!("/v1/runs/{run_id}"), &a_key, 60, |v| {
        v["status"] == "succeeded"
    });
    let t0 = record_decisions(home.path(), &run_id);
    let path = format!("/v1/runs/{run_id}/audit.jsonl");

    // The native form: every decision once, typed, versioned, in time order.
    let (st, headers, body) = s.raw("GET", &path, a, None, "");
    assert_eq!(st, 200, "{}", String::from_utf8_lossy(&body));
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(header("content-type"), Some("application/jsonl"));
    assert_eq!(
        header("transfer-encoding"),
        Some("chunked"),
        "streamed, not sized whole"
    );
    let text = String::from_utf8(body).unwrap();
    assert!(text.ends_with('\n'));
    let records: Vec<AuditRecord> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let ours: Vec<&AuditRecord> = records.iter().filter(|r| r.at >= t0).collect();
    let count = |n: i64| usize::try_from(n).unwrap();
    assert_eq!(
        ours.len(),
        count(EGRESS + EXCLUSIONS),
        "every decision, no log line"
    );
    assert!(
        records
            .iter()
            .all(|r| r.schema_version == 1 && r.run_id == run_id)
    );
    let ids: BTreeSet<&str> = records.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids.len(), records.len(), "each record once");
    assert!(
        ours.windows(2).all(|w| w[0].at < w[1].at),
        "in time order across pages"
    );
    let refused: Vec<_> = ours
        .iter()
        .filter(|r| r.decision == AuditDecision::Refused)
        .collect();
    assert_eq!(refused.len(), count((EGRESS + 9) / 10));
    assert!(refused.iter().all(|r| r.decider == AuditDecider::L7Rule
        && r.rule.as_deref() == Some("items-read")
        && r.code.as_deref() == Some("rule_refused")
        && r.method.as_deref() == Some("DELETE")));
    // Each egress record names the path that carried it, as the log does.
    let egress: Vec<_> = ours
        .iter()
        .filter(|r| r.kind == AuditKind::Egress)
        .collect();
    assert_eq!(egress.len(), count(EGRESS));
    assert!(
        egress
            .iter()
            .all(|r| r.plane.as_deref() == Some("api") && r.source.as_deref() == Some("api_call")),
        "the egress log's plane"
    );
    let allowed = ours
        .iter()
        .find(|r| r.decision == AuditDecision::Allowed)
        .unwrap();
    assert_eq!(
        (
            allowed.status,
            allowed.bytes_in,
            allowed.duration_ms,
            allowed.outcome.as_deref()
        ),
        (Some(200), 100, Some(3), Some("completed"))
    );
    let hidden: Vec<_> = ours
        .iter()
        .filter(|r| r.kind == AuditKind::ToolExcluded)
        .collect();
    assert_eq!(hidden.len(), count(EXCLUSIONS));
    assert!(hidden.iter().all(|r| r.decision == AuditDecision::Hidden
        && r.decider == AuditDecider::ToolAllowlist
        && r.tool.is_some()
        && r.called.is_some()));
    // Each record's fields are the document's AuditRecord's.
    let doc = s.call("GET", "/v1/openapi.json", None, None).1;
    let props = doc["components"]["schemas"]["AuditRecord"]["properties"]
        .as_object()
        .unwrap();
    let first: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    for k in first.as_object().unwrap().keys() {
        assert!(
            props.contains_key(k),
            "{k} is not in the AuditRecord schema"
        );
    }
    // A second export is the same (stable ids, append-only).
    let again = s.raw("GET", &path, a, None, "").2;
    assert_eq!(String::from_utf8(again).unwrap(), text);

    // The OCSF form: the network decisions, each of its class.
    let (st, _, body) = s.raw("GET", &format!("{path}?format=ocsf"), a, None, "");
    assert_eq!(st, 200);
    let events: Vec<Value> = String::from_utf8(body)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let egress = records
        .iter()
        .filter(|r| r.kind == AuditKind::Egress)
        .count();
    assert_eq!(events.len(), egress, "tool exclusions have no OCSF form");
    assert!(
        events
            .iter()
            .all(|e| e["class_uid"] == 4002 && e["category_uid"] == 4)
    );
    assert!(
        events
            .iter()
            .any(|e| e["firewall_rule"]["uid"] == "items-read")
    );

    // The CLI writes the same bytes, from the server, in both forms.
    let cli = |key: &str, extra: &[&str]| {
        let mut args = vec!["runs", "audit", run_id.as_str()];
        args.extend_from_slice(extra);
        std::process::Command::new(crate::support::AIRLOCK)
            .args(&args)
            .env_remove("DATABASE_URL")
            .env("AIRLOCK_HOME", "/nonexistent/never-used")
            .env("AIRLOCK_SERVER", format!("http://{}", s.addr))
            .env("AIRLOCK_API_KEY", key)
            .output()
            .unwrap()
    };
    let out = cli(&a_key, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8(out.stdout).unwrap(), text);
    let out = cli(&a_key, &["--ocsf"]);
    assert!(out.status.success());
    assert_eq!(
        out.stdout,
        s.raw("GET", &format!("{path}?format=ocsf"), a, None, "").2
    );
    let out = cli(&b_key, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no run"));
    assert!(out.stdout.is_empty());

    // Another organization finds nothing; a bad query is typed.
    let (st, v) = s.call("GET", &path, Some(&b_key), None);
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (404, Some("not_found")),
        "{v}"
    );
    assert!(!v.to_string().contains(&run_id));
    let (st, v) = s.call("GET", &format!("{path}?format=xml"), a, None);
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (400, Some("bad_request")),
        "{v}"
    );
    let (st, _) = s.call("GET", "/v1/runs/run_0000000000000000/audit.jsonl", a, None);
    assert_eq!(st, 404);
}
