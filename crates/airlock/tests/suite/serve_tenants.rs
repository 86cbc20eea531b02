//! What one tenant can do to the others, from its side: a tenant that keeps
//! creating keys, webhooks, agents and runs is held to its quotas (and only it is),
//! its hanging webhook receivers delay only its own deliveries; old runs go
//! by themselves, and a retention typo stops the server before it starts.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::serve::{Server, agent_body, base_env, command, create_org, wait_for};

fn start(home: &std::path::Path, extra: &[(&str, &str)]) -> (Server, Vec<(String, String)>) {
    let mut env = base_env(home, None);
    for (k, v) in extra {
        env.push(((*k).into(), (*v).into()));
    }
    let s = Server::start(&env, "process", home.join("serve.log"));
    (s, env)
}

fn quota_refusal(st: u16, v: &Value) {
    assert_eq!(st, 403, "{v}");
    assert_eq!(v["error"]["code"], "quota_exceeded", "{v}");
}

/// A tenant queueing run after run (at once) stops at `ORG_MAX_QUEUED_RUNS`
/// with a typed 429 that says when to retry; another organization queues
/// its own. Connections stop at `ORG_MAX_CONNECTIONS` with a typed 403.
#[test]
fn a_tenants_queue_and_connections_stop_at_their_caps() {
    let home = tempfile::tempdir().unwrap();
    let (s, env) = start(
        home.path(),
        &[
            ("ORG_MAX_QUEUED_RUNS", "2"),
            ("ORG_MAX_CONNECTIONS", "2"),
            ("PLATFORM_RUN_LIMITS", r#"{"max_concurrent_runs": 1}"#),
        ],
    );
    let (_, a) = create_org(&env, "A", &[]);
    let (_, b) = create_org(&env, "B", &[]);
    let sleeper = agent_body("sleeper", "import time\ntime.sleep(120)\n", 300);
    for k in [&a, &b] {
        assert_eq!(s.call("POST", "/v1/agents", Some(k), Some(&sleeper)).0, 201);
    }
    type Answer = (u16, Vec<(String, String)>, Vec<u8>);
    let answers: Vec<Answer> = std::thread::scope(|scope| {
        let tries: Vec<_> = (0..8)
            .map(|_| {
                let (s, a) = (&s, &a);
                scope.spawn(move || {
                    let body = json!({"agent": "sleeper"}).to_string();
                    s.raw("POST", "/v1/runs", Some(a), Some(&body), "application/json")
                })
            })
            .collect();
        tries.into_iter().map(|t| t.join().unwrap()).collect()
    });
    // One may have started (one slot): at most three accepted, two queued.
    let accepted = answers.iter().filter(|(st, _, _)| *st == 202).count();
    assert!((2..=3).contains(&accepted), "{accepted} accepted");
    for (st, headers, body) in answers.iter().filter(|(st, _, _)| *st != 202) {
        let v: Value = serde_json::from_slice(body).unwrap();
        assert_eq!(
            (*st, v["error"]["code"].as_str()),
            (429, Some("queue_full")),
            "{v}"
        );
        assert!(
            headers.iter().any(|(k, _)| k == "retry-after"),
            "{headers:?}"
        );
    }
    let (_, queued) = s.call("GET", "/v1/runs?status=queued", Some(&a), None);
    assert!(queued["runs"].as_array().unwrap().len() <= 2, "{queued}");
    let (st, v) = s.call(
        "POST",
        "/v1/runs",
        Some(&b),
        Some(&json!({"agent": "sleeper"})),
    );
    assert_eq!(st, 202, "another organization's queue: {v}");

    let conn = |n: u32| json!({"name": format!("c{n}"), "integration": "github", "type": "bearer", "fields": {"token": "t0123456789abcdef"}});
    for n in 0..2 {
        let (st, v) = s.call("POST", "/v1/connections", Some(&a), Some(&conn(n)));
        assert_eq!(st, 201, "{v}");
    }
    let (st, v) = s.call("POST", "/v1/connections", Some(&a), Some(&conn(2)));
    quota_refusal(st, &v);
    assert_eq!(
        s.call("POST", "/v1/connections", Some(&b), Some(&conn(0)))
            .0,
        201
    );
    // Nothing left running behind.
    let (_, all) = s.call("GET", "/v1/runs?limit=100", Some(&a), None);
    for r in all["runs"].as_array().unwrap() {
        let id = r["id"].as_str().unwrap();
        s.call("POST", &format!("/v1/runs/{id}/cancel"), Some(&a), None);
    }
    let (_, all) = s.call("GET", "/v1/runs?limit=100", Some(&b), None);
    for r in all["runs"].as_array().unwrap() {
        let id = r["id"].as_str().unwrap();
        s.call("POST", &format!("/v1/runs/{id}/cancel"), Some(&b), None);
    }
}

/// A hostile tenant registering agent after agent (at once) stops at
/// `ORG_MAX_AGENTS`; replacing one of its agents still works at the cap,
/// and another organization registers its own.
#[test]
fn a_tenant_registering_agents_without_end_stops_at_its_quota() {
    let home = tempfile::tempdir().unwrap();
    let (s, env) = start(home.path(), &[("ORG_MAX_AGENTS", "3")]);
    let (_, a) = create_org(&env, "A", &[]);
    let (_, b) = create_org(&env, "B", &[]);
    let answers: Vec<(u16, Value)> = std::thread::scope(|scope| {
        let tries: Vec<_> = (0..12)
            .map(|n| {
                let (s, a) = (&s, &a);
                scope.spawn(move || {
                    let body = agent_body(&format!("bot{n}"), "print('hi')", 10);
                    s.call("POST", "/v1/agents", Some(a), Some(&body))
                })
            })
            .collect();
        tries.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let made = answers.iter().filter(|(st, _)| *st == 201).count();
    for (st, v) in answers.iter().filter(|(st, _)| *st != 201) {
        quota_refusal(*st, v);
    }
    assert_eq!(made, 3);
    let (_, list) = s.call("GET", "/v1/agents", Some(&a), None);
    assert_eq!(list["agents"].as_array().map(Vec::len), Some(3), "{list}");
    let kept = list["agents"][0]["name"].as_str().unwrap().to_owned();
    let (st, v) = s.call(
        "POST",
        "/v1/agents",
        Some(&a),
        Some(&agent_body(&kept, "print('again')", 10)),
    );
    assert_eq!(st, 200, "replacing an agent at the cap: {v}");
    let (st, v) = s.call(
        "POST",
        "/v1/agents",
        Some(&b),
        Some(&agent_body("bot0", "print('hi')", 10)),
    );
    assert_eq!(st, 201, "{v}");
}

#[test]
fn a_tenant_is_held_to_its_quotas_and_no_other_is() {
    let home = tempfile::tempdir().unwrap();
    let (s, env) = start(
        home.path(),
        &[("ORG_MAX_API_KEYS", "2"), ("ORG_MAX_WEBHOOKS", "2")],
    );
    let (_, a) = create_org(&env, "A", &[]);
    let (_, b) = create_org(&env, "B", &[]);
    let hook =
        |n: u32| json!({"url": format!("http://127.0.0.1:9/hook{n}"), "events": ["run.failed"]});
    // Twenty webhooks asked for: two made, the rest refused, typed.
    let mut made = 0;
    for n in 0..20 {
        let (st, v) = s.call("POST", "/v1/webhooks", Some(&a), Some(&hook(n)));
        if st == 201 {
            made += 1;
        } else {
            quota_refusal(st, &v);
        }
    }
    assert_eq!(made, 2);
    let (_, list) = s.call("GET", "/v1/webhooks", Some(&a), None);
    assert_eq!(list["webhooks"].as_array().map(Vec::len), Some(2), "{list}");
    // The org's first key counts: one more, then refused; revoking one
    // frees its place.
    let (st, k2) = s.call(
        "POST",
        "/v1/api-keys",
        Some(&a),
        Some(&json!({"name": "ci"})),
    );
    assert_eq!(st, 201, "{k2}");
    let (st, v) = s.call(
        "POST",
        "/v1/api-keys",
        Some(&a),
        Some(&json!({"name": "more"})),
    );
    quota_refusal(st, &v);
    let k2_id = k2["id"].as_str().unwrap();
    let (st, v) = s.call("DELETE", &format!("/v1/api-keys/{k2_id}"), Some(&a), None);
    assert!(st == 200 || st == 204, "{st} {v}");
    let (st, v) = s.call(
        "POST",
        "/v1/api-keys",
        Some(&a),
        Some(&json!({"name": "again"})),
    );
    assert_eq!(st, 201, "{v}");
    // Another organization is not counted against A.
    for n in 0..2 {
        assert_eq!(
            s.call("POST", "/v1/webhooks", Some(&b), Some(&hook(n))).0,
            201
        );
    }
    assert_eq!(
        s.call(
            "POST",
            "/v1/api-keys",
            Some(&b),
            Some(&json!({"name": "ci"}))
        )
        .0,
        201
    );
}

const HELLO: &str = "import os\nprint('x' * 4000)\nopen(os.environ['AIRLOCK_RESULT_FILE'], 'w').write('{\"ok\": true}')\n";

fn run_to_end(s: &Server, key: &str) -> String {
    let (st, v) = s.call(
        "POST",
        "/v1/runs",
        Some(key),
        Some(&json!({"agent": "hello"})),
    );
    assert_eq!(st, 202, "{v}");
    let id = v["id"].as_str().unwrap().to_owned();
    wait_for(s, &format!("/v1/runs/{id}"), key, 60, |v| {
        v["status"] == "succeeded"
    });
    id
}

/// A run over for longer than its retention is gone from the API by
/// itself, swept by the leader; a run that is younger stays.
#[test]
fn old_runs_are_swept_by_the_leader() {
    let home = tempfile::tempdir().unwrap();
    // Two seconds of retention (0.0000231 days), a sweep every second.
    let (s, env) = start(
        home.path(),
        &[
            ("RETENTION_RUNS_DAYS", "0.0000231"),
            ("RETENTION_SWEEP_SECONDS", "1"),
        ],
    );
    let (_, a) = create_org(&env, "A", &[]);
    assert_eq!(
        s.call(
            "POST",
            "/v1/agents",
            Some(&a),
            Some(&agent_body("hello", HELLO, 60))
        )
        .0,
        201
    );
    let id = run_to_end(&s, &a);
    let deadline = Instant::now() + Duration::from_secs(30);
    // Gone from the API, and the sweep's line in the operator's log (it is
    // written once the sweep's batches and its vacuum are done, after the
    // delete the API already sees).
    loop {
        let (st, _) = s.call("GET", &format!("/v1/runs/{id}"), Some(&a), None);
        if st == 404 && s.log_text().contains("retention sweep") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the run was never swept (last GET: {st}):\n{}",
            s.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// An organization whose stored runs reach its stored-bytes quota gets
/// no new run (typed), once the sweep has measured it; another does.
#[test]
fn an_organization_over_its_stored_bytes_gets_no_new_run() {
    let home = tempfile::tempdir().unwrap();
    let (s, env) = start(
        home.path(),
        &[
            ("ORG_MAX_STORED_BYTES", "2000"),
            ("RETENTION_SWEEP_SECONDS", "1"),
        ],
    );
    let (_, a) = create_org(&env, "A", &[]);
    let (_, b) = create_org(&env, "B", &[]);
    for k in [&a, &b] {
        assert_eq!(
            s.call(
                "POST",
                "/v1/agents",
                Some(k),
                Some(&agent_body("hello", HELLO, 60))
            )
            .0,
            201
        );
    }
    run_to_end(&s, &a);
    // The next sweep measures A's 4 KB of output: then A is refused.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (st, v) = s.call(
            "POST",
            "/v1/runs",
            Some(&a),
            Some(&json!({"agent": "hello"})),
        );
        if st == 403 {
            quota_refusal(st, &v);
            break;
        }
        assert_eq!(st, 202, "{v}");
        assert!(
            Instant::now() < deadline,
            "A was never refused:\n{}",
            s.log_text()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // B has stored little: it still runs.
    run_to_end(&s, &b);
}

/// A retention or quota typo is refused before the server starts, naming
/// the setting.
#[test]
fn a_retention_typo_stops_the_server_before_it_starts() {
    let home = tempfile::tempdir().unwrap();
    for (var, bad) in [("RETENTION_RUNS_DAYS", "30d"), ("ORG_MAX_WEBHOOKS", "0")] {
        let mut env = base_env(home.path(), None);
        env.push((var.into(), bad.into()));
        let out = command(&env)
            .args(["serve", "--listen", "127.0.0.1:0", "--backend", "process"])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{var}={bad} was accepted: {err}");
        assert!(err.contains(var) && err.contains(bad), "{err}");
    }
}

/// One tenant's 32 webhooks to a receiver that accepts and never answers
/// hold at most its share of the delivery slots; another tenant's webhook
/// is delivered at once meanwhile (with one organization allowed every slot,
/// as before, it waited 7.8 s behind them here).
#[test]
fn a_tenants_hanging_receivers_delay_only_its_own_webhooks() {
    use crate::support::serve::Receiver;
    use std::sync::{Arc, Mutex};
    // The hanging receiver: accepts, reads nothing, answers nothing.
    let hang = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hang_addr = hang.local_addr().unwrap();
    let held: Arc<Mutex<Vec<(std::net::TcpStream, Instant)>>> = Arc::default();
    {
        let held = held.clone();
        std::thread::spawn(move || {
            for c in hang.incoming().flatten() {
                held.lock().unwrap().push((c, Instant::now()));
            }
        });
    }
    let fast = Receiver::start(|_| 204);
    let home = tempfile::tempdir().unwrap();
    let (s, env) = start(home.path(), &[("WEBHOOK_TIMEOUT_SECONDS", "8")]);
    let (_, a) = create_org(&env, "A", &[]);
    let (_, b) = create_org(&env, "B", &[]);
    for k in [&a, &b] {
        assert_eq!(
            s.call(
                "POST",
                "/v1/agents",
                Some(k),
                Some(&agent_body("hello", HELLO, 60))
            )
            .0,
            201
        );
    }
    for n in 0..32 {
        let (st, v) = s.call(
            "POST",
            "/v1/webhooks",
            Some(&a),
            Some(&json!({"url": format!("http://{hang_addr}/h{n}"), "events": ["run.succeeded"]})),
        );
        assert_eq!(st, 201, "{v}");
    }
    let (st, v) = s.call(
        "POST",
        "/v1/webhooks",
        Some(&b),
        Some(&json!({"url": format!("http://{}/b", fast.addr), "events": ["run.succeeded"]})),
    );
    assert_eq!(st, 201, "{v}");
    // A's run ends: 32 deliveries, to a receiver that hangs.
    run_to_end(&s, &a);
    let deadline = Instant::now() + Duration::from_secs(20);
    while held.lock().unwrap().is_empty() {
        assert!(
            Instant::now() < deadline,
            "no delivery of A's reached its receiver"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let first_hang = held.lock().unwrap()[0].1;
    // B's run ends while A's hang: B's delivery arrives promptly.
    let b_run = run_to_end(&s, &b);
    let b_ended = Instant::now();
    let deadline = b_ended + Duration::from_secs(20);
    let got = loop {
        if let Some(r) = fast.received().into_iter().next() {
            break r;
        }
        assert!(
            Instant::now() < deadline,
            "B's webhook never arrived:\n{}",
            s.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(String::from_utf8_lossy(&got.body).contains(&b_run));
    let waited = got.at.saturating_duration_since(b_ended);
    assert!(
        waited < Duration::from_secs(3),
        "B's delivery waited {waited:?} behind A's hanging receivers"
    );
    // And A never held more than its share at once (all within the first
    // attempt's timeout, before any of A's first wave gave up).
    assert!(got.at.duration_since(first_hang) < Duration::from_secs(8));
    let open_at_once = held.lock().unwrap().len();
    assert!(
        open_at_once <= 4,
        "A held {open_at_once} of the slots at once"
    );
}
