//! The audit's OCSF form checked against the OCSF 1.1.0 schema of its two
//! classes (vendored in `tests/data`, see its `_source`): every attribute
//! an event carries is one its class or object defines, of that type and
//! within its enumeration; every required one is there; the derived
//! numbers (`type_uid`, the category) agree.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use airlock_api::ocsf;
use airlock_api::v1::AuditRecord;
use airlock_platform_api::wire::{RefusalCode, RunEvent};
use airlock_store::{
    AuditEntry, EgressDecision, EgressEntry, EgressOutcome, EgressPlane, EgressSource, Event,
};
use serde_json::{Map, Value, json};

fn schema() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/ocsf-1.1.0-network.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// What is wrong with `event` under `schema` (empty: nothing).
fn violations(schema: &Value, event: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let Some(class_uid) = event["class_uid"].as_i64() else {
        return vec!["no class_uid".into()];
    };
    let Some(class) = schema["classes"]
        .as_object()
        .unwrap()
        .values()
        .find(|c| c["uid"] == class_uid)
    else {
        return vec![format!("class {class_uid} is not in the schema")];
    };
    if event["category_uid"] != class["category_uid"] {
        out.push(format!(
            "category_uid {} is not its class's",
            event["category_uid"]
        ));
    }
    let activity = event["activity_id"].as_i64().unwrap_or(-1);
    if event["type_uid"].as_i64() != Some(class_uid * 100 + activity) {
        out.push(format!(
            "type_uid {} is not class_uid × 100 + activity_id",
            event["type_uid"]
        ));
    }
    if activity != 99 {
        let caption = &class["attributes"]["activity_id"]["enum"][activity.to_string()]["caption"];
        if event.get("activity_name").is_some_and(|n| n != caption) {
            out.push(format!(
                "activity_name {} is not {caption}",
                event["activity_name"]
            ));
        }
    }
    check_object(schema, class, event, "", &mut out);
    out
}

fn check_object(schema: &Value, def: &Value, value: &Value, at: &str, out: &mut Vec<String>) {
    let Some(fields) = value.as_object() else {
        out.push(format!("{at}: not an object"));
        return;
    };
    let attributes = def["attributes"].as_object().unwrap();
    for (name, a) in attributes {
        if a["requirement"] == "required" && fields.get(name).is_none_or(Value::is_null) {
            out.push(format!("{at}{name}: required, missing"));
        }
    }
    if let Some(one_of) = def["constraints"]["at_least_one"].as_array()
        && !one_of
            .iter()
            .any(|n| fields.get(n.as_str().unwrap()).is_some())
    {
        out.push(format!("{at}: needs one of {one_of:?}"));
    }
    for (name, v) in fields {
        let Some(a) = attributes.get(name) else {
            out.push(format!("{at}{name}: not an attribute here"));
            continue;
        };
        if v.is_null() {
            continue;
        }
        check_value(schema, a, v, &format!("{at}{name}"), out);
    }
}

fn check_value(schema: &Value, a: &Value, v: &Value, at: &str, out: &mut Vec<String>) {
    let ty = a["type"].as_str().unwrap();
    let t = &schema["types"][ty];
    let ok = match t["json"].as_str().unwrap() {
        "integer" => v.as_i64().is_some_and(|n| {
            t["min"].as_i64().is_none_or(|m| n >= m) && t["max"].as_i64().is_none_or(|m| n <= m)
        }),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "object" => v.is_object(),
        other => panic!("type {other}"),
    };
    if !ok {
        out.push(format!("{at}: {v} is not a {ty}"));
        return;
    }
    if let Some(values) = a["enum"].as_object()
        && !values.contains_key(&v.to_string())
    {
        out.push(format!("{at}: {v} is not in its enumeration"));
    }
    if let Some(object) = a["object_type"].as_str() {
        let def = &schema["objects"][object];
        assert!(def.is_object(), "object {object} is not vendored");
        check_object(schema, def, v, &format!("{at}."), out);
    }
}

fn egress(
    id: i64,
    method: &str,
    source: EgressSource,
    refused: Option<RefusalCode>,
) -> EgressEntry {
    EgressEntry {
        id,
        run_id: "run_0123456789abcdef".into(),
        at: 1_800_000_000_000 + id,
        source,
        plane: EgressPlane::implied_by(source),
        integration: Some("github".into()),
        method: method.into(),
        url: "https://api.github.test/repos/a/issues".into(),
        host: "api.github.test".into(),
        decision: if refused.is_some() {
            EgressDecision::Refused
        } else {
            EgressDecision::Allowed
        },
        reason: refused,
        status: refused.is_none().then_some(200),
        duration_ms: refused.is_none().then_some(12),
        bytes_out: 10,
        bytes_in: 2048,
        seq: Some(id),
        outcome: refused.is_none().then_some(EgressOutcome::Completed),
        metering: None,
        rule: (refused == Some(RefusalCode::RuleRefused)).then(|| "issues-read".into()),
    }
}

fn event(id: i64, e: &RunEvent) -> Event {
    Event {
        id,
        run_id: "run_0123456789abcdef".into(),
        at: e.at(),
        kind: e.kind().into(),
        payload: serde_json::to_string(e).unwrap(),
    }
}

/// One of every kind of record the audit holds.
fn entries() -> Vec<AuditEntry> {
    let mut v: Vec<AuditEntry> = [
        ("GET", EgressSource::ApiCall, None),
        ("POST", EgressSource::Llm, None),
        (
            "DELETE",
            EgressSource::ApiCall,
            Some(RefusalCode::RuleRefused),
        ),
        ("PATCH", EgressSource::Mcp, None),
        (
            "HEAD",
            EgressSource::Runner,
            Some(RefusalCode::BlockedAddress),
        ),
        ("CONNECT", EgressSource::Proxy, None),
        (
            "CONNECT",
            EgressSource::Proxy,
            Some(RefusalCode::NotAuthorized),
        ),
        (
            "GET",
            EgressSource::Proxy,
            Some(RefusalCode::CredentialExfiltrationRefused),
        ),
    ]
    .into_iter()
    .zip(1..)
    .map(|((m, s, r), id)| AuditEntry::Egress(egress(id, m, s, r)))
    .collect();
    v.push(AuditEntry::Event(event(
        50,
        &RunEvent::Refusals {
            at: 1_800_000_000_100,
            code: RefusalCode::BlockedHost,
            host: "metadata.google.internal".into(),
            count: 4000,
        },
    )));
    v.push(AuditEntry::Event(event(
        51,
        &RunEvent::ToolExcluded {
            at: 1_800_000_000_101,
            integration: "github".into(),
            tool: "delete_repo".into(),
            called: true,
        },
    )));
    let change = airlock_platform_api::policy::PolicyChange {
        at: 1_800_000_000_102,
        actor: "key k_1".into(),
        version: 2,
        old_version: 1,
        old_rules: vec!["network:api".into()],
        new_rules: vec!["network:api-read".into()],
        reset: false,
    };
    v.push(AuditEntry::Event(Event {
        id: 52,
        run_id: "run_0123456789abcdef".into(),
        at: change.at,
        kind: airlock_platform_api::policy::POLICY_CHANGE_EVENT.into(),
        payload: serde_json::to_string(&change).unwrap(),
    }));
    v
}

#[test]
fn every_network_decision_is_a_valid_ocsf_event_of_its_class() {
    let schema = schema();
    let records: Vec<AuditRecord> = entries().iter().filter_map(AuditRecord::of).collect();
    assert_eq!(records.len(), 11, "every entry is a record");
    let mut classes = Vec::new();
    for r in &records {
        let Some(e) = ocsf::event(r) else {
            assert!(
                r.tool.as_deref() == Some("delete_repo")
                    || r.kind == airlock_api::audit::AuditKind::PolicyChange,
                "only a tool exclusion and a policy change have no OCSF form: {r:?}"
            );
            continue;
        };
        let wrong = violations(&schema, &e);
        assert!(wrong.is_empty(), "{r:?} → {e}: {wrong:#?}");
        assert_eq!(e["metadata"]["uid"], json!(r.id));
        assert_eq!(e["time"], json!(r.at));
        classes.push((
            e["class_uid"].as_i64().unwrap(),
            e["activity_id"].as_i64().unwrap(),
            e["action_id"].as_i64().unwrap(),
        ));
    }
    assert_eq!(
        classes,
        [
            (4002, 3, 1),  // GET let out
            (4002, 6, 1),  // a model call
            (4002, 2, 2),  // DELETE refused by an L7 rule
            (4002, 99, 1), // PATCH: Other
            (4002, 4, 2),  // HEAD refused by the guard
            (4001, 1, 1),  // a plain tunnel opened
            (4001, 5, 2),  // a tunnel refused
            (4002, 3, 2),  // an intercepted GET refused
            (4001, 5, 2),  // refusals counted per host
        ]
    );
    let rule = ocsf::event(&records[2]).unwrap();
    assert_eq!(rule["firewall_rule"]["uid"], "issues-read");
    assert_eq!(rule["status_detail"], "rule_refused");
    // A policy change: its native record names who, the version, and the
    // rules before and after.
    let change = &records[10];
    assert_eq!(change.actor.as_deref(), Some("key k_1"));
    assert_eq!(change.version, Some(2));
    assert_eq!(
        change.old_rules.as_deref(),
        Some(&["network:api".to_owned()][..])
    );
    assert_eq!(
        change.new_rules.as_deref(),
        Some(&["network:api-read".to_owned()][..])
    );
    let counted = ocsf::event(&records[8]).unwrap();
    assert_eq!(counted["count"], 4000);
    assert_eq!(
        counted["dst_endpoint"]["hostname"],
        "metadata.google.internal"
    );
}

/// A change that makes an event wrong.
type Fault = fn(&mut Map<String, Value>);

/// The check is not vacuous: each kind of fault it looks for is found.
#[test]
fn the_schema_check_finds_what_is_wrong() {
    let schema = schema();
    let record = AuditRecord::of(&entries()[0]).unwrap();
    let good = ocsf::event(&record).unwrap();
    assert!(violations(&schema, &good).is_empty());
    let faults: [(&str, Fault); 7] = [
        ("required, missing", |e| {
            e.remove("time");
        }),
        ("metadata.product.vendor_name: required", |e| {
            e["metadata"]["product"]
                .as_object_mut()
                .unwrap()
                .remove("vendor_name");
        }),
        ("not in its enumeration", |e| {
            e.insert("severity_id".into(), json!(42));
        }),
        ("not an attribute here", |e| {
            e.insert("rule".into(), json!("x"));
        }),
        ("is not a integer_t", |e| {
            e.insert("http_status".into(), json!("200"));
        }),
        ("type_uid", |e| {
            e.insert("type_uid".into(), json!(400201));
        }),
        ("is not a port_t", |e| {
            e["http_request"]["url"]["port"] = json!(70000);
        }),
    ];
    for (expected, fault) in faults {
        let mut e = good.as_object().unwrap().clone();
        fault(&mut e);
        let wrong = violations(&schema, &Value::Object(e));
        assert!(
            wrong.iter().any(|w| w.contains(expected)),
            "{expected}: {wrong:?}"
        );
    }
}

/// A request held for a person and each way it is settled: valid OCSF
/// HTTP Activity, Other while held, Approved or Blocked once settled, the
/// key that answered under `unmapped`, the rule as `firewall_rule`.
#[test]
fn a_held_request_and_its_answer_are_valid_ocsf_events() {
    use airlock_api::audit::{AuditDecider, AuditDecision, AuditKind};
    use airlock_platform_api::approval::{Description, Outcome, Pending};
    let schema = schema();
    let pending = RunEvent::ApprovalPending {
        at: 1_800_000_000_200,
        approval: Pending {
            id: "apr_1".into(),
            request: Description {
                method: "POST".into(),
                host: "api.github.test".into(),
                path: "/repos/a/issues".into(),
                integration: Some("github".into()),
                rule: "comment".into(),
            },
            expires_at: 1_800_000_120_200,
        },
    };
    let settled = |outcome, by: Option<&str>| RunEvent::ApprovalSettled {
        at: 1_800_000_000_300,
        id: "apr_1".into(),
        rule: "comment".into(),
        outcome,
        answered_by: by.map(str::to_owned),
    };
    let cases = [
        (pending, AuditDecision::Held, AuditDecider::L7Rule, (99, 99)),
        (
            settled(Outcome::AllowedOnce, Some("key_1")),
            AuditDecision::Allowed,
            AuditDecider::Person,
            (1, 8),
        ),
        (
            settled(Outcome::AllowedRun, Some("key_1")),
            AuditDecision::Allowed,
            AuditDecider::Person,
            (1, 8),
        ),
        (
            settled(Outcome::Denied, Some("key_2")),
            AuditDecision::Refused,
            AuditDecider::Person,
            (2, 2),
        ),
        (
            settled(Outcome::Expired, None),
            AuditDecision::Refused,
            AuditDecider::L7Rule,
            (2, 2),
        ),
        (
            settled(Outcome::Dropped, None),
            AuditDecision::Refused,
            AuditDecider::L7Rule,
            (2, 2),
        ),
    ];
    for (i, (ev, decision, decider, (action, disposition))) in cases.into_iter().enumerate() {
        let r = AuditRecord::of(&AuditEntry::Event(event(
            60 + i64::try_from(i).unwrap(),
            &ev,
        )))
        .unwrap();
        assert_eq!(r.kind, AuditKind::Approval);
        assert_eq!((r.decision, r.decider), (decision, decider), "{r:?}");
        assert_eq!(r.approval_id.as_deref(), Some("apr_1"));
        assert_eq!(r.rule.as_deref(), Some("comment"));
        let e = ocsf::event(&r).unwrap();
        let wrong = violations(&schema, &e);
        assert!(wrong.is_empty(), "{r:?} → {e}: {wrong:#?}");
        assert_eq!(e["class_uid"], 4002);
        assert_eq!(
            (e["action_id"].as_i64(), e["disposition_id"].as_i64()),
            (Some(action), Some(disposition))
        );
        assert_eq!(e["unmapped"]["airlock_answered_by"], json!(r.answered_by));
    }
}
