//! The audit's OCSF form (`GET /v1/runs/{id}/audit.jsonl?format=ocsf`): each
//! network decision of [`AuditRecord`] as an OCSF 1.1 event, for a SIEM
//! that reads the Open Cybersecurity Schema Framework.
//!
//! Mapping (docs/audit.md has the table):
//! - a request on any egress path → HTTP Activity (`class_uid` 4002), the
//!   activity its method names (`Get` 3, `Post` 6, … `Other` 99);
//! - a plain tunnel of the forward proxy (`CONNECT`, the proxy could not
//!   see inside) and refusals counted per host → Network Activity (4001):
//!   `Open` 1 when let out, `Refuse` 5 when refused;
//! - a tool an allowlist hid, and a change to the run's live egress rules,
//!   are no network activity: they have no OCSF form here and are left out
//!   of it (the native form carries them, actor and versions included);
//! - a request held for a person's approval → HTTP Activity of its method,
//!   `action_id` and `disposition_id` Other (99) while held; its
//!   settlement → Allowed / Approved (1 / 8) or Denied / Blocked (2 / 2),
//!   the key that answered under `unmapped.airlock_answered_by`.
//!
//! Both classes are in the Network Activity category (4), with the
//! Security Control profile's `action_id` / `disposition_id` (allowed 1;
//! denied 2 / blocked 2), the refusing L7 rule as `firewall_rule`, and the
//! fields OCSF has no attribute for (the record id's kind, integration,
//! source, refusal code) under `unmapped`.

use serde_json::{Map, Value, json};

use crate::audit::{AuditDecider, AuditDecision, AuditKind, AuditRecord};

/// The OCSF version the events declare (`metadata.version`).
pub const OCSF_VERSION: &str = "1.1.0";
/// The Network Activity category.
pub const CATEGORY_NETWORK: i64 = 4;
/// Network Activity.
pub const CLASS_NETWORK_ACTIVITY: i64 = 4001;
/// HTTP Activity.
pub const CLASS_HTTP_ACTIVITY: i64 = 4002;

/// `record` as an OCSF event, or `None` when it has no OCSF form.
pub fn event(record: &AuditRecord) -> Option<Value> {
    let tunnel = record.kind == AuditKind::Refusals
        || record.method.as_deref() == Some("CONNECT") && record.source.as_deref() == Some("proxy");
    let refused = record.decision == AuditDecision::Refused;
    let (class_uid, class_name, (activity_id, activity_name)) = match record.kind {
        AuditKind::ToolExcluded | AuditKind::PolicyChange => return None,
        _ if tunnel => (
            CLASS_NETWORK_ACTIVITY,
            "Network Activity",
            if refused { (5, "Refuse") } else { (1, "Open") },
        ),
        _ => (
            CLASS_HTTP_ACTIVITY,
            "HTTP Activity",
            http_activity(record.method.as_deref().unwrap_or("")),
        ),
    };
    let mut e = Map::new();
    e.insert("activity_id".into(), json!(activity_id));
    e.insert("activity_name".into(), json!(activity_name));
    e.insert("category_uid".into(), json!(CATEGORY_NETWORK));
    e.insert("category_name".into(), json!("Network Activity"));
    e.insert("class_uid".into(), json!(class_uid));
    e.insert("class_name".into(), json!(class_name));
    e.insert("type_uid".into(), json!(class_uid * 100 + activity_id));
    e.insert(
        "type_name".into(),
        json!(format!("{class_name}: {activity_name}")),
    );
    e.insert("time".into(), json!(record.at));
    // Informational when let out, Low when refused: a refusal is the
    // policy working, worth a look, not an incident by itself.
    e.insert("severity_id".into(), json!(if refused { 2 } else { 1 }));
    e.insert(
        "severity".into(),
        json!(if refused { "Low" } else { "Informational" }),
    );
    let (status, action, disposition) = match (record.decision, record.kind) {
        (AuditDecision::Held, _) => ((99, "Other"), (99, "Other"), (99, "Other")),
        (AuditDecision::Refused, _) => ((2, "Failure"), (2, "Denied"), (2, "Blocked")),
        (_, AuditKind::Approval) => ((1, "Success"), (1, "Allowed"), (8, "Approved")),
        _ => ((1, "Success"), (1, "Allowed"), (1, "Allowed")),
    };
    e.insert("status_id".into(), json!(status.0));
    e.insert("status".into(), json!(status.1));
    e.insert("action_id".into(), json!(action.0));
    e.insert("action".into(), json!(action.1));
    e.insert("disposition_id".into(), json!(disposition.0));
    e.insert("disposition".into(), json!(disposition.1));
    e.insert("metadata".into(), metadata(record));
    if let Some(code) = &record.code {
        e.insert("status_detail".into(), json!(code));
    }
    if let Some(n) = record.count {
        e.insert("count".into(), json!(n));
    }
    if let Some(d) = record.duration_ms {
        e.insert("duration".into(), json!(d));
    }
    e.insert(
        "src_endpoint".into(),
        json!({"uid": record.run_id, "name": "sandbox"}),
    );
    if let Some(host) = &record.host {
        e.insert("dst_endpoint".into(), json!({"hostname": host}));
    }
    e.insert(
        "traffic".into(),
        json!({"bytes_in": record.bytes_in, "bytes_out": record.bytes_out}),
    );
    if let (AuditDecider::L7Rule, Some(rule)) = (record.decider, &record.rule) {
        e.insert(
            "firewall_rule".into(),
            json!({"uid": rule, "name": rule, "type": "l7_rule"}),
        );
    }
    if class_uid == CLASS_HTTP_ACTIVITY {
        http(record, &mut e);
    }
    e.insert(
        "unmapped".into(),
        json!({
            "airlock_integration": record.integration,
            "airlock_source": record.source,
            "airlock_plane": record.plane,
            "airlock_outcome": record.outcome,
            "airlock_decider": record.decider,
            "airlock_approval_id": record.approval_id,
            "airlock_answered_by": record.answered_by,
        }),
    );
    Some(Value::Object(e))
}

/// HTTP Activity's activity for a method (OCSF 1.1's enumeration;
/// `PATCH` and the rest are `Other`).
fn http_activity(method: &str) -> (i64, &'static str) {
    match method {
        "CONNECT" => (1, "Connect"),
        "DELETE" => (2, "Delete"),
        "GET" => (3, "Get"),
        "HEAD" => (4, "Head"),
        "OPTIONS" => (5, "Options"),
        "POST" => (6, "Post"),
        "PUT" => (7, "Put"),
        "TRACE" => (8, "Trace"),
        _ => (99, "Other"),
    }
}

fn metadata(record: &AuditRecord) -> Value {
    json!({
        "version": OCSF_VERSION,
        "uid": record.id,
        "correlation_uid": record.run_id,
        "log_name": "airlock.audit",
        "product": {
            "name": "Airlock",
            "vendor_name": "Airlock",
            "version": env!("CARGO_PKG_VERSION"),
        },
    })
}

/// HTTP Activity's request and answer.
fn http(record: &AuditRecord, e: &mut Map<String, Value>) {
    let mut url = Map::new();
    if let Some(u) = &record.url {
        url.insert("url_string".into(), json!(u));
        if let Ok(parsed) = url::Url::parse(u) {
            url.insert("scheme".into(), json!(parsed.scheme()));
            url.insert("path".into(), json!(parsed.path()));
            if let Some(port) = parsed.port_or_known_default() {
                url.insert("port".into(), json!(port));
            }
        }
    }
    if let Some(host) = &record.host {
        url.insert("hostname".into(), json!(host));
    }
    let mut request = Map::new();
    if let Some(m) = &record.method {
        request.insert("http_method".into(), json!(m));
    }
    request.insert("url".into(), Value::Object(url));
    e.insert("http_request".into(), Value::Object(request));
    if let Some(code) = record.status {
        e.insert("http_response".into(), json!({"code": code}));
        e.insert("http_status".into(), json!(code));
    }
}
