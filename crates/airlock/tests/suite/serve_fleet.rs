//! `airlock serve`'s fleet against its database's bad days, with real
//! components: two real replicas on a PostgreSQL cluster of the test's own
//! (stopped and started by the test; never the shared one), a real full
//! filesystem under a SQLite store (a tmpfs the test mounts), SIGKILLs
//! placed by the test-only fail points, SIGTERM drains, and a key revoked
//! while its event stream is open. Every wait is for a condition, with a
//! deadline.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead as _, BufReader, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::serve::{Receiver, Server, base_env, create_org, wait_for};

/// An agent that says it waits, then waits for a file `go` to appear in its
/// directory (the test puts it there), then ends with a result.
const WAITER: &str = r#"import json, os, time
print("waiting", flush=True)
while not os.path.exists("go"):
    time.sleep(0.05)
print("done", flush=True)
json.dump({"ok": True}, open(os.environ["AIRLOCK_RESULT_FILE"], "w"))
"#;

/// As [`WAITER`], printing a numbered line every 50 ms while it waits.
const TALKER: &str = r#"import json, os, time
i = 0
while not os.path.exists("go"):
    print(f"line {i}", flush=True)
    i += 1
    time.sleep(0.05)
print("done", flush=True)
"#;

/// The replica lease in these tests (seconds).
const LEASE: u64 = 2;

fn agent(name: &str, script: &str) -> Value {
    json!({
        "manifest": format!("[agent]\nname = \"{name}\"\ncommand = [\"/usr/bin/python3\", \"agent.py\"]\ntimeout = 300\n\n[network]\negress = \"none\"\n"),
        "files": { "agent.py": script },
    })
}

/// Lets a [`WAITER`] run end: the file it waits for, in its directory on
/// the home of the replica that runs it.
fn go(home: &Path, run: &str) {
    let dir = home.join("bundles").join(run);
    // (A run is `running` from its claim; its directory is written next.)
    wait_until(&format!("{} is there", dir.display()), 60, || {
        dir.join("agent.py").is_file()
    });
    std::fs::write(dir.join("go"), b"").unwrap();
}

fn wait_until(what: &str, secs: u64, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The id part of an API key `alk_<id>_<secret>`.
fn key_id(key: &str) -> &str {
    &key[4..20]
}

/// What a webhook receiver got, per (run, event): the delivery ids.
fn deliveries(rx: &Receiver) -> BTreeMap<(String, String), Vec<String>> {
    let mut m: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for r in rx.received() {
        let body: Value = serde_json::from_slice(&r.body).unwrap();
        let key = (
            body["data"]["run"]["id"].as_str().unwrap().to_owned(),
            body["type"].as_str().unwrap().to_owned(),
        );
        let id = r.header("airlock-delivery").unwrap().to_owned();
        assert_eq!(body["id"], id.as_str(), "the body names its delivery");
        m.entry(key).or_default().push(id);
    }
    m
}

/// A PostgreSQL cluster of the test's own: its own data directory and port
/// (below the ephemeral range), initialised and run as `postgres`, stopped
/// and started by the test. Never the shared cluster of `.ci/postgres.sh`.
pub(crate) struct OwnPostgres {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
}

impl OwnPostgres {
    /// Initialised, not started. `None` (loudly) where PostgreSQL's server
    /// binaries are missing; a failure under CI.
    pub(crate) fn init() -> Option<OwnPostgres> {
        let bin = std::fs::read_dir("/usr/lib/postgresql").ok().and_then(|d| {
            d.flatten()
                .map(|e| e.path().join("bin"))
                .filter(|b| b.join("pg_ctl").exists())
                .max()
        });
        let bin = airlock_test_support::require_peer(
            "PostgreSQL's server binaries",
            bin.ok_or("not installed (apt-get install postgresql)"),
        )?;
        let dir = tempfile::Builder::new()
            .prefix("airlock-own-pg-")
            .tempdir_in("/var/tmp")
            .unwrap();
        assert!(
            Command::new("chown")
                .args(["postgres:postgres"])
                .arg(dir.path())
                .status()
                .unwrap()
                .success()
        );
        let out = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(bin.join("initdb"))
            .arg("-D")
            .arg(dir.path().join("data"))
            .args([
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // A free port below the ephemeral range (32768-): one an outgoing
        // connection's local end cannot take while the cluster is stopped.
        let seed = u64::from(std::process::id()) ^ airlock_store::now_ms().unsigned_abs();
        let port = (0..200)
            .map(|i| 20_000 + ((seed + i * 7919) % 12_000) as u16)
            .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
            .expect("a free port");
        Some(OwnPostgres { dir, bin, port })
    }

    pub(crate) fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    fn pg_ctl(&self, args: &[&str]) {
        let out = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pg_ctl {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub(crate) fn start(&self) {
        let opts = format!(
            "-c listen_addresses=127.0.0.1 -p {} -k {} -c fsync=off -c max_connections=100",
            self.port,
            self.dir.path().display()
        );
        let log = self.dir.path().join("server.log");
        self.pg_ctl(&[
            "-l",
            log.to_str().unwrap(),
            "-w",
            "-t",
            "60",
            "-o",
            &opts,
            "start",
        ]);
    }

    pub(crate) fn stop(&self) {
        self.pg_ctl(&["-m", "fast", "-w", "-t", "60", "stop"]);
    }

    /// Runs `sql` and returns the first column of each row.
    fn query(&self, sql: &str) -> Vec<String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            use sqlx::{Connection as _, Row as _};
            let mut c = sqlx::PgConnection::connect(&self.url()).await.unwrap();
            let rows = sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
                .fetch_all(&mut c)
                .await
                .unwrap();
            let out = rows
                .iter()
                .map(|r| {
                    r.try_get::<String, _>(0)
                        .or_else(|_| r.try_get::<i64, _>(0).map(|n| n.to_string()))
                        .unwrap()
                })
                .collect();
            c.close().await.unwrap();
            out
        })
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        let _ = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-m", "immediate", "-w", "stop"])
            .output();
        if std::thread::panicking() {
            let log =
                std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            eprintln!(
                "--- own PostgreSQL log, last lines ---\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
    }
}

/// A replica's home (its own, as on its own machine).
fn home(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("airlock-fleet-{tag}-"))
        .tempdir()
        .unwrap()
}

fn fleet_env(home: &Path, db: &str, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut e = base_env(home, Some(db));
    e.push(("AIRLOCK_REPLICA_LEASE_SECONDS".into(), LEASE.to_string()));
    // Deliveries retried fast: a receiver that was unreachable is tried again soon.
    e.push(("WEBHOOK_RETRY_BASE_MS".into(), "200".into()));
    for (k, v) in extra {
        e.push(((*k).into(), (*v).into()));
    }
    e
}

/// A webhook subscribed to every event, to `rx`.
fn subscribe(s: &Server, key: &str, rx: &Receiver) {
    let (st, v) = s.call(
        "POST",
        "/v1/webhooks",
        Some(key),
        Some(&json!({
            "url": format!("http://{}/hook", rx.addr),
            "events": ["run.started", "run.succeeded", "run.failed", "run.cancelled", "run.timed_out"],
        })),
    );
    assert_eq!(st, 201, "{v}");
}

fn queue(s: &Server, key: &str, agent: &str) -> String {
    let (st, v) = s.call(
        "POST",
        "/v1/runs",
        Some(key),
        Some(&json!({"agent": agent})),
    );
    assert_eq!(st, 202, "{v}");
    v["id"].as_str().unwrap().to_owned()
}

fn run_of(s: &Server, key: &str, id: &str) -> Value {
    let (st, v) = s.call("GET", &format!("/v1/runs/{id}"), Some(key), None);
    assert_eq!(st, 200, "{v}");
    v
}

fn log_lines(s: &Server, key: &str, id: &str) -> Vec<String> {
    let (st, v) = s.call(
        "GET",
        &format!("/v1/runs/{id}/logs?limit=100"),
        Some(key),
        None,
    );
    assert_eq!(st, 200, "{v}");
    v["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["payload"]["line"].as_str().unwrap_or_default().to_owned())
        .collect()
}

fn alive(s: &mut Server) -> bool {
    matches!(s.child.try_wait(), Ok(None))
}

/// PostgreSQL stopped for three leases under two replicas with six runs in
/// flight, then started: every replica stays up, nobody is judged dead,
/// every run goes on and ends truly (succeeded, its log and result kept),
/// and each run event is delivered once, under one delivery id.
#[test]
fn postgres_stopped_for_three_leases_under_two_replicas_loses_nothing() {
    if !crate::support::namespace_available() {
        return;
    }
    let Some(pg) = OwnPostgres::init() else {
        return;
    };
    pg.start();
    let (home_a, home_b) = (home("a"), home("b"));
    let cap = [("AIRLOCK_REPLICA_MAX_RUNS", "3")];
    let env_a = fleet_env(home_a.path(), &pg.url(), &cap);
    let env_b = fleet_env(home_b.path(), &pg.url(), &cap);
    let mut a = Server::start(&env_a, "namespace", home_a.path().join("serve.log"));
    let mut b = Server::start(&env_b, "namespace", home_b.path().join("serve.log"));
    let (_, key) = create_org(&env_a, "Acme", &[]);
    let rx = Receiver::start(|_| 200);
    subscribe(&a, &key, &rx);
    assert_eq!(
        a.call(
            "POST",
            "/v1/agents",
            Some(&key),
            Some(&agent("waiter", WAITER))
        )
        .0,
        201
    );
    let runs: Vec<String> = (0..6)
        .map(|i| queue(if i % 2 == 0 { &a } else { &b }, &key, "waiter"))
        .collect();
    // Each runs (three on each replica: their capacity) and has said so.
    let mut home_of: BTreeMap<String, PathBuf> = BTreeMap::new();
    for id in &runs {
        let v = wait_for(&a, &format!("/v1/runs/{id}"), &key, 60, |v| {
            v["status"] == "running"
        });
        let rep = v["replica"].as_str().unwrap();
        let h = if rep == a.replica {
            home_a.path()
        } else {
            assert_eq!(rep, b.replica, "{v}");
            home_b.path()
        };
        home_of.insert(id.clone(), h.to_owned());
        wait_until(&format!("{id} says it waits"), 60, || {
            log_lines(&a, &key, id)
                .iter()
                .any(|l| l.contains("waiting"))
        });
    }
    assert_eq!(
        home_of
            .values()
            .filter(|h| h.as_path() == home_a.path())
            .count(),
        3
    );

    // The outage: three leases; twice (on the code before this test, a
    // single outage lost runs in 5 of 6 trials).
    for cycle in 0..2 {
        pg.stop();
        let down = Instant::now();
        let outage = Duration::from_secs(3 * LEASE);
        // Meanwhile each replica stays up and says it is not ready.
        wait_until("both replicas say the store is down", 30, || {
            a.call("GET", "/readyz", None, None).0 == 503
                && b.call("GET", "/readyz", None, None).0 == 503
        });
        assert_eq!(a.call("GET", "/healthz", None, None).0, 200);
        while down.elapsed() < outage {
            assert!(
                alive(&mut a) && alive(&mut b),
                "a replica exited during outage {cycle}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        pg.start();
        let back = airlock_store::now_ms();
        // Two leases of heartbeats from both replicas after the store came
        // back: the time a leader would have taken to judge anyone.
        wait_until(
            "both replicas heartbeat two leases past the outage",
            60,
            || {
                let beats = pg.query(&format!(
                    "SELECT heartbeat_at FROM replicas WHERE heartbeat_at > {}",
                    back + 2_000 * i64::try_from(LEASE).unwrap()
                ));
                beats.len() == 2
            },
        );
    }
    assert!(alive(&mut a) && alive(&mut b), "a replica exited");
    for id in &runs {
        let v = run_of(&b, &key, id);
        assert_eq!(v["status"], "running", "{v}");
    }
    // Every run is let go and ends as it truly ends.
    for (id, h) in &home_of {
        go(h, id);
    }
    for id in &runs {
        let v = wait_for(&b, &format!("/v1/runs/{id}"), &key, 60, |v| {
            v["status"] != "running"
        });
        assert_eq!(v["status"], "succeeded", "{v}");
        let lines = log_lines(&b, &key, id);
        assert!(
            lines.iter().any(|l| l.contains("waiting")) && lines.iter().any(|l| l.contains("done")),
            "{id}'s log before and after the outage: {lines:?}"
        );
        let (st, r) = b.call("GET", &format!("/v1/runs/{id}/result"), Some(&key), None);
        assert_eq!(st, 200, "{id}'s result: {r}");
    }
    // Each run: run.started and run.succeeded, once each, one id each.
    wait_until("every run's two webhooks", 60, || {
        deliveries(&rx).len() == 2 * runs.len()
    });
    let got = deliveries(&rx);
    for id in &runs {
        for ev in ["run.started", "run.succeeded"] {
            let ids = &got[&(id.clone(), ev.to_owned())];
            assert_eq!(ids.len(), 1, "{id} {ev}: {ids:?}");
        }
    }
    assert_eq!(got.len(), 2 * runs.len(), "nothing else: {got:?}");
    for s in [&a, &b] {
        let log = s.log_text();
        assert!(!log.contains("judged dead by the leader"), "{log}");
        assert!(!log.contains("failed a run of a replica"), "{log}");
        assert!(!log.contains("panicked"), "{log}");
    }
    assert!(alive(&mut a) && alive(&mut b));
    if std::env::var_os("AIRLOCK_TEST_SHOW_LOGS").is_some() {
        eprintln!("--- A ---\n{}\n--- B ---\n{}", a.log_text(), b.log_text());
    }
    drop(a);
    drop(b);
    drop(pg);
}

/// A replica SIGKILLed (aborted by the test-only fail point) right after a
/// run's end is stored: the webhook is still delivered, once, by the
/// surviving replica. Then one aborted right after claiming that delivery:
/// another replica sends it as soon as the aborted one is judged dead, not
/// after the claim's two-minute hold.
#[test]
fn a_crash_between_a_runs_end_and_its_webhook_loses_nothing() {
    if !crate::support::namespace_available() {
        return;
    }
    let Some(pg) = OwnPostgres::init() else {
        return;
    };
    pg.start();
    let (home_a, home_b, home_c) = (home("a"), home("b"), home("c"));
    let env_a = fleet_env(
        home_a.path(),
        &pg.url(),
        &[("AIRLOCK_TEST_FAIL_POINT", "after-run-end")],
    );
    let env_b = fleet_env(home_b.path(), &pg.url(), &[]);
    let (_, key) = create_org(&env_b, "Acme", &[]);
    let rx = Receiver::start(|_| 200);
    // A alone: it takes the run.
    let mut a = Server::start(&env_a, "namespace", home_a.path().join("serve.log"));
    let body = json!({"url": format!("http://{}/hook", rx.addr), "events": ["run.succeeded"]});
    assert_eq!(
        a.call("POST", "/v1/webhooks", Some(&key), Some(&body)).0,
        201
    );
    assert_eq!(
        a.call(
            "POST",
            "/v1/agents",
            Some(&key),
            Some(&agent("waiter", WAITER))
        )
        .0,
        201
    );
    let r1 = queue(&a, &key, "waiter");
    wait_for(&a, &format!("/v1/runs/{r1}"), &key, 60, |v| {
        v["status"] == "running" && v["replica"] == a.replica.as_str()
    });
    // B joins; A's run ends, A dies the moment its end is stored.
    let b = Server::start(&env_b, "namespace", home_b.path().join("serve.log"));
    go(home_a.path(), &r1);
    let st = a.exit_within(60);
    assert!(!st.success(), "A aborted at its fail point: {st}");
    assert!(a.log_text().contains("AIRLOCK_TEST_FAIL_POINT"));
    let v = run_of(&b, &key, &r1);
    assert_eq!(v["status"], "succeeded", "{v}");
    wait_until("r1's webhook, sent by B", 30, || !rx.received().is_empty());
    // Once, and never again (B keeps running: a second send would come now).
    let r1_sent = deliveries(&rx)[&(r1.clone(), "run.succeeded".to_owned())].clone();
    assert_eq!(r1_sent.len(), 1, "{r1_sent:?}");

    // C takes the next run and dies having claimed its delivery, unsent.
    drop(b);
    let env_c = fleet_env(
        home_c.path(),
        &pg.url(),
        &[("AIRLOCK_TEST_FAIL_POINT", "after-delivery-claim")],
    );
    let mut c = Server::start(&env_c, "namespace", home_c.path().join("serve.log"));
    let r2 = queue(&c, &key, "waiter");
    wait_for(&c, &format!("/v1/runs/{r2}"), &key, 60, |v| {
        v["status"] == "running"
    });
    go(home_c.path(), &r2);
    let st = c.exit_within(60);
    assert!(!st.success(), "C aborted at its fail point: {st}");
    let held = pg.query("SELECT claimed_by FROM webhook_deliveries WHERE claimed_by IS NOT NULL");
    assert_eq!(held, vec![c.replica.clone()], "C held r2's delivery");
    // A replica comes back: it judges C dead after a lease (and a lease of
    // its own heartbeats) and sends r2's webhook then, not after 120 s.
    let b2 = Server::start(&env_b, "namespace", home_b.path().join("serve2.log"));
    let since = Instant::now();
    wait_until(
        "r2's webhook, sent by the replica that came back",
        30,
        || deliveries(&rx).contains_key(&(r2.clone(), "run.succeeded".to_owned())),
    );
    eprintln!(
        "r2's delivery was sent {:.1} s after a replica came back (lease {LEASE} s)",
        since.elapsed().as_secs_f64()
    );
    wait_until("the deliveries recorded delivered", 30, || {
        pg.query("SELECT state FROM webhook_deliveries")
            .iter()
            .all(|s| s == "delivered")
    });
    let got = deliveries(&rx);
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(got.values().all(|ids| ids.len() == 1), "{got:?}");
    drop(b2);
    drop(pg);
}

/// A replica paused (SIGSTOP) for longer than the lease is judged dead by
/// the other, which fails its run. Resumed, it does not exit: it registers
/// again under its id, stops the run the store ended (its failure stands,
/// its webhook sent once), and takes new work; the other replica's run is
/// untouched throughout.
#[test]
fn a_replica_judged_dead_registers_again_and_stops_only_what_was_ended() {
    if !crate::support::namespace_available() {
        return;
    }
    let Some(pg) = OwnPostgres::init() else {
        return;
    };
    pg.start();
    let (home_a, home_b) = (home("a"), home("b"));
    let cap = [("AIRLOCK_REPLICA_MAX_RUNS", "1")];
    let env_a = fleet_env(home_a.path(), &pg.url(), &cap);
    let env_b = fleet_env(home_b.path(), &pg.url(), &cap);
    let mut a = Server::start(&env_a, "namespace", home_a.path().join("serve.log"));
    let mut b = Server::start(&env_b, "namespace", home_b.path().join("serve.log"));
    let (_, key) = create_org(&env_a, "Acme", &[]);
    let rx = Receiver::start(|_| 200);
    let body = json!({"url": format!("http://{}/hook", rx.addr), "events": ["run.succeeded", "run.failed", "run.cancelled"]});
    assert_eq!(
        a.call("POST", "/v1/webhooks", Some(&key), Some(&body)).0,
        201
    );
    assert_eq!(
        a.call(
            "POST",
            "/v1/agents",
            Some(&key),
            Some(&agent("waiter", WAITER))
        )
        .0,
        201
    );
    let (r1, r2) = (queue(&a, &key, "waiter"), queue(&a, &key, "waiter"));
    let mut on = BTreeMap::new();
    for id in [&r1, &r2] {
        let v = wait_for(&a, &format!("/v1/runs/{id}"), &key, 60, |v| {
            v["status"] == "running"
        });
        on.insert(v["replica"].as_str().unwrap().to_owned(), id.clone());
        wait_until("the run says it waits", 60, || {
            log_lines(&a, &key, id)
                .iter()
                .any(|l| l.contains("waiting"))
        });
    }
    let (on_a, on_b) = (on[&a.replica].clone(), on[&b.replica].clone());
    // B pauses for longer than the lease: A judges it dead, fails its run.
    let pid = rustix::process::Pid::from_raw(i32::try_from(b.child.id()).unwrap()).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::STOP).unwrap();
    let v = wait_for(&a, &format!("/v1/runs/{on_b}"), &key, 60, |v| {
        v["status"] != "running"
    });
    assert_eq!(v["status"], "failed", "{v}");
    assert_eq!(v["error"], airlock_store::REPLICA_GONE, "{v}");
    rustix::process::kill_process(pid, rustix::process::Signal::CONT).unwrap();
    // B finds itself judged dead, registers again, stays.
    wait_until("B registers again", 30, || {
        b.log_text().contains("it registers again")
            && pg.query("SELECT id FROM replicas").contains(&b.replica)
    });
    b.wait_ready(30);
    assert!(alive(&mut b), "B exited:\n{}", b.log_text());
    // The run the store ended is stopped on B, and stays failed.
    wait_until("B stops the run the store ended", 30, || {
        b.log_text().contains("stopping a run the store ended")
    });
    wait_until("its run directory goes", 30, || {
        !home_b.path().join("runs").join(&on_b).exists()
    });
    assert_eq!(run_of(&a, &key, &on_b)["status"], "failed");
    assert_eq!(
        run_of(&a, &key, &on_a)["status"],
        "running",
        "A's run untouched"
    );
    // B takes new work (A is full).
    let r3 = queue(&b, &key, "waiter");
    let v = wait_for(&b, &format!("/v1/runs/{r3}"), &key, 60, |v| {
        v["status"] == "running"
    });
    assert_eq!(v["replica"], b.replica.as_str(), "{v}");
    go(home_a.path(), &on_a);
    go(home_b.path(), &r3);
    for id in [&on_a, &r3] {
        let v = wait_for(&b, &format!("/v1/runs/{id}"), &key, 60, |v| {
            v["status"] != "running"
        });
        assert_eq!(v["status"], "succeeded", "{v}");
    }
    wait_until("three ends' webhooks", 30, || deliveries(&rx).len() == 3);
    let got = deliveries(&rx);
    assert_eq!(
        got[&(on_b.clone(), "run.failed".to_owned())].len(),
        1,
        "{got:?}"
    );
    assert!(got.values().all(|ids| ids.len() == 1), "{got:?}");
    assert!(alive(&mut a) && alive(&mut b));
    drop(a);
    drop(b);
    drop(pg);
}

/// A replica started while its PostgreSQL is down: it answers `/healthz`,
/// `/readyz` 503 with the cause, logs the cause and retries, and is ready
/// once the database starts; it never exits.
#[test]
fn a_replica_started_while_its_postgres_is_down_waits_and_says_why() {
    let Some(pg) = OwnPostgres::init() else {
        return;
    };
    let h = home("down");
    let env = fleet_env(h.path(), &pg.url(), &[]);
    let mut s = Server::spawn(&env, "process", h.path().join("serve.log"));
    assert_eq!(s.call("GET", "/healthz", None, None).0, 200);
    let (st, v) = s.call("GET", "/readyz", None, None);
    assert_eq!(st, 503, "{v}");
    assert_eq!(v["error"]["code"], "unavailable", "{v}");
    // It retries, saying why each time.
    wait_until("a third attempt", 30, || {
        s.log_text().contains("attempt 3)")
    });
    let log = s.log_text();
    assert!(log.contains("connection refused"), "{log}");
    let (st, v) = s.call("GET", "/readyz", None, None);
    assert_eq!(st, 503, "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("connection refused"), "{v}");
    assert!(!msg.contains("127.0.0.1"), "names no database: {v}");
    assert!(
        s.call("GET", "/v1/org", Some("alk_x"), None).0 == 503,
        "the API says it is starting"
    );
    assert!(alive(&mut s));
    pg.start();
    s.wait_ready(60);
    let (_, key) = create_org(&env, "Acme", &[]);
    assert_eq!(s.call("GET", "/v1/org", Some(&key), None).0, 200);
    assert!(alive(&mut s));
}

/// A tmpfs of a few MiB of the test's own (tests run as root), unmounted
/// on drop.
struct SmallFs {
    dir: tempfile::TempDir,
}

impl SmallFs {
    fn mount(mib: u32) -> Option<SmallFs> {
        let dir = tempfile::tempdir().unwrap();
        let ok = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={mib}m,mode=0755"),
                "tmpfs",
            ])
            .arg(dir.path())
            .status()
            .is_ok_and(|s| s.success());
        airlock_test_support::require_peer(
            "root (to mount a tmpfs)",
            ok.then_some(()).ok_or("cannot mount a tmpfs (not root?)"),
        )?;
        Some(SmallFs { dir })
    }
    fn path(&self) -> &Path {
        self.dir.path()
    }
    fn fill(&self) {
        let mut f = std::fs::File::create(self.path().join("filler")).unwrap();
        let chunk = vec![0u8; 4096];
        while f.write_all(&chunk).is_ok() {}
        let _ = f.sync_all();
    }
    fn unfill(&self) {
        std::fs::remove_file(self.path().join("filler")).unwrap();
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// A full filesystem under a SQLite store: a new run gets 507
/// `storage_full` (never a 500), the cause is in the log, nothing is
/// half-written; the run in flight goes on, and once space is back it ends
/// truly, its webhook delivered once; the replica never stops.
#[test]
fn a_full_disk_under_a_sqlite_store_is_507_storage_full_and_loses_nothing() {
    if !crate::support::namespace_available() {
        return;
    }
    let Some(fs) = SmallFs::mount(8) else { return };
    let h = home("full");
    let db = format!("sqlite://{}", fs.path().join("airlock.db").display());
    let env = fleet_env(h.path(), &db, &[]);
    let mut s = Server::start(&env, "namespace", h.path().join("serve.log"));
    let (_, key) = create_org(&env, "Acme", &[]);
    let rx = Receiver::start(|_| 200);
    let body = json!({"url": format!("http://{}/hook", rx.addr), "events": ["run.succeeded", "run.failed"]});
    assert_eq!(
        s.call("POST", "/v1/webhooks", Some(&key), Some(&body)).0,
        201
    );
    assert_eq!(
        s.call(
            "POST",
            "/v1/agents",
            Some(&key),
            Some(&agent("waiter", WAITER))
        )
        .0,
        201
    );
    let r1 = queue(&s, &key, "waiter");
    wait_for(&s, &format!("/v1/runs/{r1}"), &key, 60, |v| {
        v["status"] == "running"
    });
    wait_until("r1 says it waits", 60, || {
        log_lines(&s, &key, &r1)
            .iter()
            .any(|l| l.contains("waiting"))
    });
    fs.fill();
    // Every new run is refused, typed, until space is back (a write may
    // still fit in the WAL's room: a few are tried).
    let mut refused = None;
    for _ in 0..50 {
        let big = "p".repeat(200 * 1024);
        let (st, v) = s.call(
            "POST",
            "/v1/runs",
            Some(&key),
            Some(&json!({"agent": "waiter", "prompt": big})),
        );
        assert_ne!(st, 500, "never a 500: {v}");
        if st == 507 {
            refused = Some(v);
            break;
        }
        assert_eq!(st, 202, "{v}");
    }
    let v = refused.expect("a full disk answers 507");
    assert_eq!(v["error"]["code"], "storage_full", "{v}");
    // The log has the store's error and its source, the driver's own words.
    let log = s.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("out of space") && l.contains("database or disk is full")),
        "the cause, with its source, in the log: {log}"
    );
    // Longer than a lease full: the replica stays up (no judgement on its
    // own stale heartbeat when the store takes writes again).
    let full_since = Instant::now();
    while full_since.elapsed() < Duration::from_secs(2 * LEASE) {
        assert!(alive(&mut s), "the replica exited on a full disk");
        std::thread::sleep(Duration::from_millis(100));
    }
    fs.unfill();
    go(h.path(), &r1);
    let v = wait_for(&s, &format!("/v1/runs/{r1}"), &key, 60, |v| {
        v["status"] != "running"
    });
    assert_eq!(v["status"], "succeeded", "{v}");
    wait_until("r1's webhook", 30, || {
        deliveries(&rx).contains_key(&(r1.clone(), "run.succeeded".to_owned()))
    });
    // The runs queued before the refusal run and end; the refused one
    // left nothing.
    let (_, list) = s.call("GET", "/v1/runs?limit=100", Some(&key), None);
    for r in list["runs"].as_array().unwrap() {
        assert_ne!(r["status"], "failed", "{r}");
    }
    assert!(alive(&mut s));
    let log = s.log_text();
    assert!(!log.contains("judged dead"), "{log}");
    drop(s);
    drop(fs);
}

/// SIGTERM drains: the replica claims nothing more (its queued run stays
/// queued, and another replica takes it), its running run ends as it would
/// have (succeeded), a run that outlives the grace is cancelled with the
/// true reason; the replica exits 0. A cancel through the API records the
/// key that asked.
#[test]
fn sigterm_drains_a_replica_within_its_grace() {
    if !crate::support::namespace_available() {
        return;
    }
    let Some(pg) = OwnPostgres::init() else {
        return;
    };
    pg.start();
    let (home_a, home_b) = (home("a"), home("b"));
    let env_a = fleet_env(
        home_a.path(),
        &pg.url(),
        &[
            ("AIRLOCK_REPLICA_MAX_RUNS", "2"),
            ("SHUTDOWN_GRACE_SECONDS", "12"),
        ],
    );
    let env_b = fleet_env(home_b.path(), &pg.url(), &[]);
    let (_, key) = create_org(&env_a, "Acme", &[]);
    let mut a = Server::start(&env_a, "namespace", home_a.path().join("serve.log"));
    let rx = Receiver::start(|_| 200);
    subscribe(&a, &key, &rx);
    assert_eq!(
        a.call(
            "POST",
            "/v1/agents",
            Some(&key),
            Some(&agent("waiter", WAITER))
        )
        .0,
        201
    );
    let finishes = queue(&a, &key, "waiter");
    let outlives = queue(&a, &key, "waiter");
    for id in [&finishes, &outlives] {
        wait_for(&a, &format!("/v1/runs/{id}"), &key, 60, |v| {
            v["status"] == "running"
        });
        wait_until("the run says it waits", 60, || {
            log_lines(&a, &key, id)
                .iter()
                .any(|l| l.contains("waiting"))
        });
    }
    // A is full: the third waits in the queue.
    let queued = queue(&a, &key, "waiter");
    let status_of =
        |id: &str| pg.query(&format!("SELECT status FROM runs WHERE id = '{id}'"))[0].clone();
    a.sigterm();
    // A running run ends within the grace as it would have.
    go(home_a.path(), &finishes);
    wait_until("the run let go ends", 30, || {
        status_of(&finishes) != "running"
    });
    let why = pg.query(&format!(
        "SELECT COALESCE(error, '') FROM runs WHERE id = '{finishes}'"
    ));
    assert_eq!(status_of(&finishes), "succeeded", "{why:?}");
    // Meanwhile A drains: it says so, and claims nothing.
    let (st, v) = a.call("GET", "/readyz", None, None);
    assert_eq!(st, 503, "{v}");
    assert!(v.to_string().contains("stopping"), "{v}");
    assert_eq!(a.call("GET", "/healthz", None, None).0, 200);
    assert_eq!(status_of(&queued), "queued");
    let st = a.exit_within(60);
    assert!(
        st.success(),
        "A drained and exited 0: {st}\n{}",
        a.log_text()
    );
    assert_eq!(status_of(&queued), "queued");
    // The one that outlived the grace: cancelled, saying so.
    let b = Server::start(&env_b, "namespace", home_b.path().join("serve.log"));
    let v = run_of(&b, &key, &outlives);
    assert_eq!(v["status"], "cancelled", "{v}");
    let why = v["error"].as_str().unwrap();
    assert!(why.contains("this replica shut down"), "{v}");
    assert!(!why.contains("operator"), "{v}");
    // The queued one stayed queued for another replica: B takes it.
    let v = wait_for(&b, &format!("/v1/runs/{queued}"), &key, 60, |v| {
        v["status"] == "running"
    });
    assert_eq!(v["replica"], b.replica.as_str(), "{v}");
    // A cancel through the API records which key asked.
    let (st, v) = b.call(
        "POST",
        &format!("/v1/runs/{queued}/cancel"),
        Some(&key),
        None,
    );
    assert_eq!(st, 202, "{v}");
    let v = wait_for(&b, &format!("/v1/runs/{queued}"), &key, 30, |v| {
        v["status"] == "cancelled"
    });
    assert_eq!(
        v["error"],
        format!("cancelled through the API with key {}", key_id(&key)),
        "{v}"
    );
    // Each end's webhook, once.
    wait_until("the three ends' webhooks", 30, || {
        let got = deliveries(&rx);
        [&finishes, &outlives, &queued]
            .iter()
            .all(|id| got.keys().any(|(r, e)| r == *id && e != "run.started"))
    });
    let got = deliveries(&rx);
    assert!(got.values().all(|ids| ids.len() == 1), "{got:?}");
    assert!(got.contains_key(&(finishes.clone(), "run.succeeded".into())));
    assert!(got.contains_key(&(outlives.clone(), "run.cancelled".into())));
    assert!(got.contains_key(&(queued.clone(), "run.cancelled".into())));
    drop(b);
    drop(pg);
}

/// One SSE stream read on a thread: each line as it came, with when.
struct Stream {
    lines: Arc<Mutex<Vec<(Instant, String)>>>,
    ended: Arc<Mutex<Option<Instant>>>,
}

impl Stream {
    fn open(addr: SocketAddr, path: &str, key: &str) -> Stream {
        let mut c = TcpStream::connect(addr).unwrap();
        write!(
            c,
            "GET {path} HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {key}\r\naccept: text/event-stream\r\nconnection: close\r\n\r\n"
        )
        .unwrap();
        let lines: Arc<Mutex<Vec<(Instant, String)>>> = Arc::default();
        let ended: Arc<Mutex<Option<Instant>>> = Arc::default();
        let (l, e) = (lines.clone(), ended.clone());
        std::thread::spawn(move || {
            c.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
            let r = BufReader::new(c);
            for line in r.lines() {
                let Ok(line) = line else { break };
                l.lock().unwrap().push((Instant::now(), line));
            }
            *e.lock().unwrap() = Some(Instant::now());
        });
        Stream { lines, ended }
    }

    /// The `data:` lines of events of `kind` (`event: <kind>`), with when.
    fn events(&self, kind: &str) -> Vec<(Instant, String)> {
        let lines = self.lines.lock().unwrap();
        let mut out = Vec::new();
        let mut current = None::<String>;
        for (at, l) in lines.iter() {
            if let Some(k) = l.strip_prefix("event: ") {
                current = Some(k.trim().to_owned());
            } else if let Some(d) = l.strip_prefix("data: ") {
                if current.as_deref() == Some(kind) {
                    out.push((*at, d.to_owned()));
                }
            } else if l.is_empty() {
                current = None;
            }
        }
        out
    }

    fn ended(&self) -> Option<Instant> {
        *self.ended.lock().unwrap()
    }
}

/// A key revoked while its SSE log stream is open (through the API, or by
/// the operator's `airlock orgs revoke-key` on the store): the stream ends
/// within about a second with a typed `error` event and sends nothing
/// after; the same run's stream under a live key goes on to the run's `end`.
#[test]
fn a_revoked_keys_event_stream_ends_within_a_second() {
    if !crate::support::namespace_available() {
        return;
    }
    let h = home("sse");
    let db = format!("sqlite://{}", h.path().join("airlock.db").display());
    let env = fleet_env(h.path(), &db, &[]);
    let s = Server::start(&env, "namespace", h.path().join("serve.log"));
    let (org, key) = create_org(&env, "Acme", &[]);
    let new_key = |name: &str| {
        let (st, v) = s.call(
            "POST",
            "/v1/api-keys",
            Some(&key),
            Some(&json!({"name": name})),
        );
        assert_eq!(st, 201, "{v}");
        (
            v["key"].as_str().unwrap().to_owned(),
            v["id"].as_str().unwrap().to_owned(),
        )
    };
    let (by_api, by_api_id) = new_key("reader");
    let (by_cli, by_cli_id) = new_key("other-reader");
    assert_eq!(
        s.call(
            "POST",
            "/v1/agents",
            Some(&key),
            Some(&agent("talker", TALKER))
        )
        .0,
        201
    );
    let run = queue(&s, &key, "talker");
    let path = format!("/v1/runs/{run}/logs");
    let api_stream = Stream::open(s.addr, &path, &by_api);
    let cli_stream = Stream::open(s.addr, &path, &by_cli);
    let kept = Stream::open(s.addr, &path, &key);
    wait_until("the streams read lines", 60, || {
        [&api_stream, &cli_stream, &kept]
            .iter()
            .all(|s| s.events("log").len() >= 5)
    });
    // Revoked through the API …
    let (st, _) = s.call(
        "DELETE",
        &format!("/v1/api-keys/{by_api_id}"),
        Some(&key),
        None,
    );
    assert_eq!(st, 204);
    let at = Instant::now();
    check_cut(&api_stream, at, "the API");
    // … and by the operator, on the store (no replica is told).
    let out = Command::new(crate::support::AIRLOCK)
        .args(["orgs", "revoke-key", &org, &by_cli_id])
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .env_remove("RUN_ADAPTER")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let at = Instant::now();
    check_cut(&cli_stream, at, "airlock orgs revoke-key");
    // The live key's stream goes on, and ends with the run.
    let n = kept.events("log").len();
    wait_until("the live key's stream still reads", 30, || {
        kept.events("log").len() > n + 5
    });
    assert!(kept.ended().is_none());
    go(h.path(), &run);
    wait_until("the live key's stream ends with the run", 60, || {
        kept.ended().is_some()
    });
    assert_eq!(kept.events("end").len(), 1);
    assert!(kept.events("error").is_empty());
    let logs: BTreeSet<String> = kept.events("log").into_iter().map(|(_, d)| d).collect();
    assert!(logs.iter().any(|d| d.contains("done")), "{logs:?}");
    // The revoked keys read nothing else either.
    assert_eq!(s.call("GET", &path, Some(&by_api), None).0, 401);
    assert_eq!(s.call("GET", &path, Some(&by_cli), None).0, 401);
}

/// `stream`, whose key was revoked at `at` (by `how`), ends within about a
/// second with one typed `error` event.
fn check_cut(stream: &Stream, at: Instant, how: &str) {
    wait_until(
        &format!("the stream of a key revoked by {how} ends"),
        10,
        || stream.ended().is_some(),
    );
    let took = stream.ended().unwrap() - at;
    let after = stream
        .events("log")
        .into_iter()
        .filter(|(t, _)| *t > at)
        .count();
    eprintln!(
        "revoked by {how}: the stream ended {:.2} s after, {after} log event(s) after the revocation",
        took.as_secs_f64(),
    );
    assert!(took < Duration::from_millis(1200), "ended after {took:?}");
    let errs = stream.events("error");
    assert_eq!(errs.len(), 1, "one typed error event");
    let e: Value = serde_json::from_str(&errs[0].1).unwrap();
    assert_eq!(e["error"]["code"], "unauthorized", "{e}");
    assert!(stream.events("end").is_empty());
}
