//! `airlock serve` running real runs: twenty queued behind four slots, a
//! run's logs followed live to its end, cancellation, signed webhooks, and
//! two replicas on one PostgreSQL, one of them SIGKILLed mid-run.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::serve::{
    Receiver, Server, agent_body, base_env, create_org, signature_ok, wait_for,
};

const LINES: &str = "import os, time\np = open(os.environ['AIRLOCK_PROMPT_FILE']).read()\nfor i in range(5):\n    print(f'line {i} {p}', flush=True)\n    time.sleep(0.1)\n";
const SLEEPER: &str = "import time\nprint('sleeping', flush=True)\ntime.sleep(120)\n";

fn ids(v: &Value) -> Vec<String> {
    v["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_owned())
        .collect()
}

/// Most runs at once: the largest number of [started_at, ended_at] spans
/// that overlap.
fn max_overlap(runs: &[Value]) -> usize {
    let mut edges: Vec<(i64, i32)> = Vec::new();
    for r in runs {
        edges.push((r["started_at"].as_i64().unwrap(), 1));
        edges.push((r["ended_at"].as_i64().unwrap(), -1));
    }
    // An end at the same millisecond as a start frees its slot first.
    edges.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, d) in edges {
        now += d;
        most = most.max(now);
    }
    usize::try_from(most).unwrap()
}

#[test]
fn twenty_runs_queue_behind_four_slots_are_followed_cancelled_and_reported_by_webhook() {
    if !crate::support::namespace_available() {
        return;
    }
    let home = tempfile::Builder::new()
        .prefix("airlock-serve-")
        .tempdir()
        .unwrap();
    let mut env = base_env(home.path(), None);
    env.push((
        "PLATFORM_RUN_LIMITS".into(),
        r#"{"max_concurrent_runs": 4}"#.into(),
    ));
    env.push(("WEBHOOK_RETRY_BASE_MS".into(), "100".into()));
    let s = Server::start(&env, "namespace", home.path().join("serve.log"));
    let (_, key) = create_org(&env, "Acme", &[]);
    let k = Some(key.as_str());
    // The receiver fails its first delivery: it must be retried.
    let rx = Receiver::start(|n| if n == 0 { 500 } else { 204 });
    let (st, hook) = s.call(
        "POST",
        "/v1/webhooks",
        k,
        Some(&json!({"url": format!("http://{}/hook", rx.addr), "events": ["run.started", "run.succeeded", "run.failed", "run.cancelled", "run.timed_out"]})),
    );
    assert_eq!(st, 201, "{hook}");
    let secret = hook["secret"].as_str().unwrap().to_owned();
    assert!(secret.starts_with("whsec_"));
    assert!(
        !s.call("GET", "/v1/webhooks", k, None)
            .1
            .to_string()
            .contains(&secret),
        "the secret is shown once"
    );
    assert_eq!(
        s.call(
            "POST",
            "/v1/agents",
            k,
            Some(&agent_body("lines", LINES, 60))
        )
        .0,
        201
    );
    assert_eq!(
        s.call(
            "POST",
            "/v1/agents",
            k,
            Some(&agent_body("sleeper", SLEEPER, 300))
        )
        .0,
        201
    );

    // One long run first: it holds a slot until it is cancelled.
    let (st, long) = s.call("POST", "/v1/runs", k, Some(&json!({"agent": "sleeper"})));
    assert_eq!(st, 202, "{long}");
    let long_id = long["id"].as_str().unwrap().to_owned();
    wait_for(
        &s,
        &format!("/v1/runs/{long_id}/logs?after=0"),
        &key,
        60,
        |v| v["events"].as_array().is_some_and(|e| !e.is_empty()),
    );
    // Twenty at once.
    let created: Vec<String> = (0..20)
        .map(|i| {
            let (st, v) = s.call(
                "POST",
                "/v1/runs",
                k,
                Some(&json!({"agent": "lines", "prompt": format!("p{i}")})),
            );
            assert_eq!(st, 202, "{v}");
            v["id"].as_str().unwrap().to_owned()
        })
        .collect();
    // At most three of them fit beside the sleeper: the rest are visibly queued.
    let queued = s.call("GET", "/v1/runs?status=queued&limit=100", k, None).1;
    assert!(ids(&queued).len() >= 16, "{queued}");
    let one = s
        .call("GET", &format!("/v1/runs/{}", created[19]), k, None)
        .1;
    assert_eq!(one["status"], "queued", "{one}");
    assert!(one["queue_position"].as_i64().unwrap() >= 15, "{one}");

    // Cancel one that is queued: it ends at once, never runs.
    let (st, c) = s.call("POST", &format!("/v1/runs/{}/cancel", created[18]), k, None);
    assert_eq!((st, c["status"].as_str()), (202, Some("cancelled")), "{c}");

    // Follow one run's logs live, with a real client, to its end.
    let follow = created[10].clone();
    let out = Command::new("curl")
        .args(["-sN", "--max-time", "120", "-H"])
        .arg(format!("Authorization: Bearer {key}"))
        .args(["-H", "Accept: text/event-stream"])
        .arg(s.url(&format!("/v1/runs/{follow}/logs")))
        .stderr(Stdio::inherit())
        .output()
        .expect("curl");
    let sse = String::from_utf8_lossy(&out.stdout).to_string();
    let lines: Vec<&str> = sse.lines().filter(|l| l.starts_with("data: ")).collect();
    assert_eq!(lines.len(), 6, "five log events, then the end:\n{sse}");
    for (i, l) in lines[..5].iter().enumerate() {
        let v: Value = serde_json::from_str(&l["data: ".len()..]).unwrap();
        assert_eq!(v["payload"]["line"], format!("line {i} p10"), "{sse}");
    }
    assert!(sse.contains("event: end"), "{sse}");
    let end: Value = serde_json::from_str(&lines[5]["data: ".len()..]).unwrap();
    assert_eq!(end["status"], "succeeded", "{sse}");
    // Resuming with Last-Event-ID gives what came after, and the end.
    let event_ids: Vec<i64> = sse
        .lines()
        .filter_map(|l| l.strip_prefix("id: "))
        .map(|i| i.parse().unwrap())
        .collect();
    assert_eq!(event_ids.len(), 5, "{sse}");
    let out = Command::new("curl")
        .args(["-sN", "--max-time", "30", "-H"])
        .arg(format!("Authorization: Bearer {key}"))
        .args(["-H", "Accept: text/event-stream", "-H"])
        .arg(format!("Last-Event-ID: {}", event_ids[1]))
        .arg(s.url(&format!("/v1/runs/{follow}/logs")))
        .output()
        .expect("curl");
    let resumed = String::from_utf8_lossy(&out.stdout).to_string();
    // Lines 2, 3 and 4, then the end.
    assert_eq!(
        resumed.lines().filter(|l| l.starts_with("data: ")).count(),
        4,
        "{resumed}"
    );
    assert!(
        resumed.contains("line 2 p10") && !resumed.contains("line 1 p10"),
        "{resumed}"
    );

    // Cancel the running sleeper: its replica stops it.
    let (st, _) = s.call("POST", &format!("/v1/runs/{long_id}/cancel"), k, None);
    assert_eq!(st, 202);
    wait_for(&s, &format!("/v1/runs/{long_id}"), &key, 30, |v| {
        v["status"] == "cancelled"
    });
    assert_eq!(
        s.call("POST", &format!("/v1/runs/{long_id}/cancel"), k, None)
            .0,
        409
    );

    // Every other run drains, nothing lost, never more than four at once.
    let mut done = Vec::new();
    for id in created.iter().filter(|id| **id != created[18]) {
        let v = wait_for(&s, &format!("/v1/runs/{id}"), &key, 120, |v| {
            v["status"]
                .as_str()
                .is_some_and(|s| s != "queued" && s != "running")
        });
        assert_eq!(v["status"], "succeeded", "{v}");
        assert_eq!(v["exit_code"], 0);
        done.push(v);
    }
    let mut spans = done.clone();
    spans.push(s.call("GET", &format!("/v1/runs/{long_id}"), k, None).1);
    assert!(max_overlap(&spans) <= 4, "more than four runs at once");
    assert!(max_overlap(&spans) >= 2, "the slots were used in parallel");
    // Each run's own logs are its own.
    let logs = s
        .call("GET", &format!("/v1/runs/{}/logs", created[3]), k, None)
        .1;
    let text = logs.to_string();
    assert!(
        text.contains("line 4 p3") && !text.contains("p4\""),
        "{text}"
    );
    assert_eq!(
        s.call("GET", &format!("/v1/runs/{}/result", created[3]), k, None)
            .1["exit_code"],
        0
    );

    // Webhooks: for every run that started, run.started and its end; all
    // signed; the failed first delivery was retried and recorded.
    let expect = 2 * 19 + 2 + 1; // 19 ran (+ the sleeper), one cancelled while queued
    let deadline = Instant::now() + Duration::from_secs(60);
    while rx.received().len() < expect + 1 {
        assert!(
            Instant::now() < deadline,
            "{} of {} deliveries",
            rx.received().len(),
            expect + 1
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let got = rx.received();
    let mut seen = std::collections::BTreeMap::<String, Vec<String>>::new();
    let mut ids_seen = std::collections::BTreeSet::new();
    for r in &got {
        assert!(signature_ok(r, &secret), "bad signature: {:?}", r.headers);
        assert!(!signature_ok(r, "whsec_wrong"));
        let v: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(r.header("airlock-event"), v["type"].as_str());
        assert_eq!(r.header("airlock-delivery"), v["id"].as_str());
        ids_seen.insert(v["id"].as_str().unwrap().to_owned());
        seen.entry(v["data"]["run"]["id"].as_str().unwrap().to_owned())
            .or_default()
            .push(v["type"].as_str().unwrap().to_owned());
    }
    assert_eq!(
        ids_seen.len(),
        expect,
        "one retry, every other delivery once"
    );
    assert_eq!(seen[&created[18]], vec!["run.cancelled"]);
    assert!(seen[&long_id].contains(&"run.cancelled".to_owned()));
    for id in created.iter().filter(|id| **id != created[18]) {
        let mut ev = seen[id].clone();
        ev.dedup();
        assert!(
            ev.contains(&"run.started".into()) && ev.contains(&"run.succeeded".into()),
            "{id}: {ev:?}"
        );
    }
    let deliveries = s
        .call(
            "GET",
            &format!(
                "/v1/webhooks/{}/deliveries?limit=100",
                hook["id"].as_str().unwrap()
            ),
            k,
            None,
        )
        .1;
    let list = deliveries["deliveries"].as_array().unwrap();
    assert!(
        list.iter().all(|d| d["state"] == "delivered"),
        "{deliveries}"
    );
    assert!(
        list.iter()
            .any(|d| d["attempts"] == 2 && d["last_status"] == 204),
        "the retried one: {deliveries}"
    );
    assert!(!s.log_text().contains("panicked"));
}

/// A fresh PostgreSQL schema for one test, dropped at the end.
pub(crate) struct Schema {
    pub(crate) url: String,
    admin: String,
    name: String,
}

impl Schema {
    pub(crate) fn new() -> Option<Schema> {
        let admin = airlock_test_support::require_peer(
            "PostgreSQL",
            std::env::var("AIRLOCK_TEST_DATABASE_URL")
                .map_err(|_| "not available (set AIRLOCK_TEST_DATABASE_URL)"),
        )?;
        let name = format!("serve_{}", airlock_vault::random_hex::<6>().unwrap());
        psql(&admin, &format!("CREATE SCHEMA {name}"));
        let sep = if admin.contains('?') { '&' } else { '?' };
        Some(Schema {
            url: format!("{admin}{sep}options[search_path]={name}"),
            admin,
            name,
        })
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        psql(
            &self.admin,
            &format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name),
        );
    }
}

fn psql(url: &str, sql: &str) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        use sqlx::Connection as _;
        let mut c = sqlx::PgConnection::connect(url).await.unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(&mut c)
            .await
            .unwrap();
        c.close().await.unwrap();
    });
}

#[test]
fn two_replicas_share_the_work_and_one_takes_over_when_the_other_is_killed() {
    if !crate::support::namespace_available() {
        return;
    }
    let Some(db) = Schema::new() else { return };
    // Two machines' worth of homes (each replica its own), one store.
    let home_a = tempfile::Builder::new()
        .prefix("airlock-rep-a-")
        .tempdir()
        .unwrap();
    let home_b = tempfile::Builder::new()
        .prefix("airlock-rep-b-")
        .tempdir()
        .unwrap();
    let env_of = |home: &std::path::Path| {
        let mut e = base_env(home, Some(&db.url));
        e.push(("AIRLOCK_REPLICA_LEASE_SECONDS".into(), "2".into()));
        e.push((
            "PLATFORM_RUN_LIMITS".into(),
            r#"{"max_concurrent_runs": 4}"#.into(),
        ));
        // Each replica's own capacity: three of the four slots, so both take work.
        e.push(("AIRLOCK_REPLICA_MAX_RUNS".into(), "3".into()));
        e
    };
    let (env_a, env_b) = (env_of(home_a.path()), env_of(home_b.path()));
    let mut a = Server::start(&env_a, "namespace", home_a.path().join("serve.log"));
    let b = Server::start(&env_b, "namespace", home_b.path().join("serve.log"));
    let (_, key) = create_org(&env_a, "Acme", &[]);
    let k = Some(key.as_str());
    let rx = Receiver::start(|_| 200);
    let (st, hook) = b.call(
        "POST",
        "/v1/webhooks",
        k,
        Some(&json!({"url": format!("http://{}/hook", rx.addr), "events": ["run.failed"]})),
    );
    assert_eq!(st, 201);
    // Registered through one replica, visible through the other.
    assert_eq!(
        a.call(
            "POST",
            "/v1/agents",
            k,
            Some(&agent_body("sleeper", SLEEPER, 300))
        )
        .0,
        201
    );
    assert_eq!(b.call("GET", "/v1/agents/sleeper", k, None).0, 200);
    // Six long runs: four run (spread over both replicas), two wait.
    let runs: Vec<String> = (0..6)
        .map(|i| {
            let via = if i % 2 == 0 { &a } else { &b };
            let (st, v) = via.call("POST", "/v1/runs", k, Some(&json!({"agent": "sleeper"})));
            assert_eq!(st, 202, "{v}");
            v["id"].as_str().unwrap().to_owned()
        })
        .collect();
    let running = wait_for(&b, "/v1/runs?status=running", &key, 60, |v| {
        ids(v).len() == 4
    });
    let by_replica = |v: &Value, rep: &str| -> Vec<String> {
        v["runs"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["replica"] == rep)
            .map(|r| r["id"].as_str().unwrap().to_owned())
            .collect()
    };
    let on_a = by_replica(&running, &a.replica);
    let on_b = by_replica(&running, &b.replica);
    assert_eq!(on_a.len() + on_b.len(), 4, "{running}");
    assert!(
        !on_a.is_empty() && !on_b.is_empty(),
        "both replicas take work: {running}"
    );
    // Each of A's runs is really running: its sandbox logged.
    for id in &on_a {
        wait_for(&b, &format!("/v1/runs/{id}/logs"), &key, 60, |v| {
            !v["events"].as_array().unwrap().is_empty()
        });
    }

    // A is SIGKILLed mid-run.
    let a_pid = a.child.id();
    a.kill();
    // B (the leader once A's lease lapses) fails A's runs, and only those.
    for id in &on_a {
        let v = wait_for(&b, &format!("/v1/runs/{id}"), &key, 30, |v| {
            v["status"] != "running"
        });
        assert_eq!(v["status"], "failed", "{v}");
        assert_eq!(v["error"], airlock_store::REPLICA_GONE, "{v}");
    }
    // A's sandboxes died with it; the cgroups they leave on this machine go
    // with B's sweep, not only once A boots again on its home (it may never).
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let mut left: Vec<_> = on_a
            .iter()
            .flat_map(|id| crate::support::run_cgroup_dirs(id))
            .collect();
        // and the standby cgroups A made for its next run.
        left.extend(crate::support::standby_cgroup_dirs(a_pid));
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the cgroups of A's failed runs are still here after B's sweep: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for id in &on_b {
        assert_eq!(
            b.call("GET", &format!("/v1/runs/{id}"), k, None).1["status"],
            "running",
            "B's run {id} is untouched"
        );
    }
    // The freed slots go to the queued runs (two), on B, up to its capacity.
    let want = (on_b.len() + on_a.len().min(2)).min(3);
    let now = wait_for(&b, "/v1/runs?status=running", &key, 30, |v| {
        ids(v).len() == want
    });
    assert_eq!(by_replica(&now, &b.replica).len(), want, "{now}");
    let queued = runs
        .iter()
        .filter(|r| b.call("GET", &format!("/v1/runs/{r}"), k, None).1["status"] == "queued")
        .count();
    assert_eq!(queued, 2 - (want - on_b.len()), "{now}");
    // The webhook said so, for each of A's runs.
    let deadline = Instant::now() + Duration::from_secs(30);
    while rx.received().len() < on_a.len() {
        assert!(Instant::now() < deadline, "webhooks for A's failed runs");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        rx.received()
            .iter()
            .all(|r| signature_ok(r, hook["secret"].as_str().unwrap()))
    );

    // A comes back on its home: its leftovers are reclaimed, B's live runs
    // are not touched.
    let a2 = Server::start(&env_a, "namespace", home_a.path().join("serve2.log"));
    let log = a2.log_text();
    for id in &on_a {
        assert!(
            log.contains(id.as_str()),
            "A's restart reclaims {id}:\n{log}"
        );
        assert!(!home_a.path().join("runs").join(id).exists());
        assert!(
            !home_a.path().join("bundles").join(id).exists(),
            "A's restart removes the agent files of {id}"
        );
    }
    // and takes what is still queued.
    let total = (want + queued).min(4);
    let still = wait_for(&a2, "/v1/runs?status=running", &key, 30, |v| {
        ids(v).len() == total
    });
    assert!(
        by_replica(&still, &b.replica).len() == want,
        "B's runs are still B's: {still}"
    );
    // Cancel everything through the new A: B stops its runs.
    for id in ids(&still) {
        assert_eq!(
            a2.call("POST", &format!("/v1/runs/{id}/cancel"), k, None).0,
            202
        );
    }
    for id in ids(&still) {
        wait_for(&a2, &format!("/v1/runs/{id}"), &key, 30, |v| {
            v["status"] == "cancelled"
        });
    }
    drop(b);
    drop(a2);
    drop(db);
}
