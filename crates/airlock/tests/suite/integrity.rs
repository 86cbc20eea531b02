//! Runs end with their real reason, limits and settings are checked before
//! anything starts, and what crashed platforms leave is reclaimed (issue 10:
//! runs and limits, bad input). Real `airlock run`s, on the process backend
//! (and the namespace backend where it matters).
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use crate::support;
use std::io::BufRead;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::{RealRun, finish_run, namespace_available, sidecars_of, start_until};
use serde_json::Value;

fn backends() -> Vec<&'static str> {
    let mut v = vec!["process"];
    if namespace_available() {
        v.push("namespace");
    }
    v
}

/// The ids of the (at most 10 latest) runs of `run`'s home, from `runs list`.
fn run_ids(run: &RealRun) -> Vec<String> {
    let list = run.airlock(&["runs", "list", "--limit", "10"]);
    String::from_utf8_lossy(&list.stdout)
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

#[test]
fn a_killed_sidecar_fails_the_run_and_stops_the_sandbox() {
    for backend in backends() {
        let run = RealRun::python(
            "import time\nprint('ready', flush=True)\ntime.sleep(60)\n",
            120,
        );
        let (child, _) = start_until(&run, backend, "ready");
        let sidecars = sidecars_of(child.id());
        assert_eq!(sidecars.len(), 1, "{backend}: one sidecar");
        let t = Instant::now();
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(i32::try_from(sidecars[0]).unwrap()).unwrap(),
            rustix::process::Signal::KILL,
        )
        .unwrap();
        let report = finish_run(child);
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "{backend}: the run went on"
        );
        assert_eq!(report["status"], "failed", "{backend}: {report}");
        let err = report["error"].as_str().unwrap();
        assert!(
            err.contains("the sidecar stopped unexpectedly") && err.contains("signal 9"),
            "{backend}: {err}"
        );
        assert!(report["exit_code"].is_null(), "{backend}: {report}");
    }
}

#[test]
fn a_killed_runtime_and_a_missing_agent_are_named_as_such() {
    for backend in backends() {
        // The agent kills the runtime (its parent): not "the agent exited with 137".
        let run = RealRun::python(
            "import os, time\nos.kill(os.getppid(), 9)\ntime.sleep(30)\n",
            60,
        );
        let (_, report) = run.run(backend);
        assert_eq!(report["status"], "failed", "{backend}: {report}");
        let err = report["error"].as_str().unwrap();
        assert!(
            err.contains("the runtime in the sandbox ended without reporting the agent's end"),
            "{backend}: {err}"
        );
        assert!(!err.contains("the agent exited"), "{backend}: {err}");

        // A program that does not exist: the runtime's own words, not "code 125".
        let run =
            RealRun::with_manifest("", "[agent]\nname = \"t\"\ncommand = [\"/nope/agent\"]\n");
        let (_, report) = run.run(backend);
        assert_eq!(report["status"], "failed", "{backend}: {report}");
        let err = report["error"].as_str().unwrap();
        assert!(
            err.contains("cannot start the agent") && err.contains("/nope/agent"),
            "{backend}: {err}"
        );
        assert!(report["exit_code"].is_null(), "{backend}: {report}");
        assert!(!err.contains("code 125"), "{backend}: {err}");

        // The legitimate path: the agent's own exit code, said as such.
        let run = RealRun::python("import sys\nsys.exit(3)\n", 30);
        let (_, report) = run.run(backend);
        assert_eq!(report["exit_code"], 3, "{backend}: {report}");
        assert_eq!(report["error"], "the agent exited with code 3", "{backend}");
    }
}

#[test]
fn bad_limits_and_settings_are_refused_before_anything_starts() {
    let agent = "[agent]\nname = \"t\"\ncommand = [\"/bin/true\"]\n";
    for (manifest_extra, env, must) in [
        ("memory_mb = 0\n", None, "agent.memory_mb"),
        ("cpus = 0\n", None, "agent.cpus"),
        ("cpus = -1\n", None, "agent.cpus"),
        (
            "",
            Some(("PLATFORM_RUN_LIMITS", "[1024]")),
            "PLATFORM_RUN_LIMITS",
        ),
        (
            "",
            Some(("PLATFORM_RUN_LIMITS", r#"{"agent_memory_ceiling_mb": 0}"#)),
            "PLATFORM_RUN_LIMITS",
        ),
        (
            "",
            Some(("PLATFORM_RUN_LIMITS", r#"{"max_concurrent_runs": 0}"#)),
            "max_concurrent_runs",
        ),
        (
            "",
            Some(("AIRLOCK_DNS_SERVER", "dns.example")),
            "AIRLOCK_DNS_SERVER",
        ),
        (
            "",
            Some(("CONNECTION_ENCRYPTION_KEY", "c2hvcnQ=")),
            "CONNECTION_ENCRYPTION_KEY",
        ),
        (
            "[[integrations]]\nnamespace = \"gh\"\nconnection = \"github\"\nauthorized_uris = [\"https://api.github.com/**\"]\n",
            None,
            "connection \"github\" is not stored",
        ),
        (
            "[network]\negress = 42\n",
            None,
            "\"public\", \"none\" or a list",
        ),
        (
            "[[integrations]]\nnamespace = \"a b/../c\"\n",
            None,
            "namespace \"a b/../c\"",
        ),
    ] {
        let manifest = if manifest_extra.starts_with('[') {
            format!("{agent}{manifest_extra}")
        } else {
            agent.replacen("]\n", &format!("]\n{manifest_extra}"), 1)
        };
        let mut run = RealRun::with_manifest("", &manifest);
        if let Some((k, v)) = env {
            run = run.env(k, v);
        }
        let (out, _) = run.run("process");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{must}: {stderr}");
        assert!(stderr.contains(must), "{must:?} not in {stderr}");
        // Nothing started, nothing recorded.
        let list = run.airlock(&["runs", "list"]);
        assert_eq!(
            String::from_utf8_lossy(&list.stdout).lines().count(),
            1,
            "{must}: a run was recorded: {}",
            String::from_utf8_lossy(&list.stdout)
        );
    }
}

#[test]
fn a_stored_connection_needs_its_key() {
    let run = RealRun::with_manifest(
        "",
        "[agent]\nname = \"t\"\ncommand = [\"/bin/true\"]\n[[integrations]]\nnamespace = \"gh\"\nconnection = \"github\"\nauthorized_uris = [\"https://api.github.com/**\"]\ndelivery = { header = \"Authorization\", prefix = \"Bearer \", field = \"token\" }\n",
    );
    let key = String::from_utf8(run.airlock(&["keys", "generate"]).stdout).unwrap();
    let mut add = std::process::Command::new(support::AIRLOCK)
        .args([
            "connections",
            "add",
            "github",
            "--integration",
            "gh",
            "--type",
            "bearer",
        ])
        .env("AIRLOCK_HOME", run.home.path())
        .env("CONNECTION_ENCRYPTION_KEY", key.trim())
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(add.stdin.as_mut().unwrap(), br#"{"token":"ghp_x"}"#).unwrap();
    drop(add.stdin.take());
    assert!(add.wait().unwrap().success());
    // Without the key: refused before the start, saying which key is missing.
    let (out, _) = run.run("process");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("CONNECTION_ENCRYPTION_KEY is not set") && stderr.contains("github"),
        "{stderr}"
    );
    // With it: the run starts and succeeds.
    let (out, report) = run
        .env("CONNECTION_ENCRYPTION_KEY", key.trim())
        .run("process");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(report["status"], "succeeded");
}

#[test]
fn max_concurrent_runs_holds_across_platforms_sharing_a_store() {
    let run = RealRun::python("import time\ntime.sleep(1.5)\nprint('done')\n", 60)
        .env("PLATFORM_RUN_LIMITS", r#"{"max_concurrent_runs": 2}"#);
    let children: Vec<_> = (0..4)
        .map(|_| {
            run.command("process", &[])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut waited = 0;
    for c in children {
        let o = c.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        if String::from_utf8_lossy(&o.stderr).contains("waiting for a free run slot") {
            waited += 1;
        }
    }
    assert!(waited >= 2, "the queued runs said so: {waited}");
    // From the store: never more than two running at once.
    let ids = run_ids(&run);
    assert_eq!(ids.len(), 4);
    let mut spans = vec![];
    for id in &ids {
        let r: Value =
            serde_json::from_slice(&run.airlock(&["runs", "show", id, "--json"]).stdout).unwrap();
        spans.push((
            r["started_at"].as_i64().unwrap(),
            r["ended_at"].as_i64().unwrap(),
        ));
    }
    for (s, _) in &spans {
        let overlapping = spans.iter().filter(|(a, b)| a <= s && s < b).count();
        assert!(overlapping <= 2, "{overlapping} runs at once: {spans:?}");
    }
}

#[test]
fn the_init_a_waiting_platform_started_ahead_dies_with_it() {
    if !support::namespace_available() {
        return;
    }
    let run = RealRun::python(
        "import time\nprint('holding', flush=True)\ntime.sleep(60)\n",
        120,
    )
    .env("PLATFORM_RUN_LIMITS", r#"{"max_concurrent_runs": 1}"#);
    let start = |what: &str| {
        let mut c = run
            .command("namespace", &[])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = std::io::BufReader::new(c.stderr.take().unwrap()).lines();
        let seen = lines
            .by_ref()
            .map_while(Result::ok)
            .any(|l| l.contains(what));
        assert!(seen, "no {what:?} from the platform");
        (c, lines)
    };
    // One platform holds the only slot; the next waits for it, with the
    // init it started for its run.
    let (mut holder, _h) = start("holding");
    let (mut waiter, _w) = start("waiting for a free run slot");
    let inits = support::inits_of(waiter.id());
    assert_eq!(inits.len(), 1, "one init started ahead: {inits:?}");
    let fd = support::pidfd(inits[0]).expect("it is alive");
    let waiter_pid = waiter.id();
    waiter.kill().unwrap();
    waiter.wait().unwrap();
    assert!(
        support::exits_within(&fd, Duration::from_secs(10)),
        "the init started ahead outlived its killed platform"
    );
    holder.kill().unwrap();
    holder.wait().unwrap();
    // Both crashed: the holder left its run (and its cgroups), the waiter
    // the standby cgroups it made for its init (cgroup v1). The next
    // platform on this home reclaims both.
    std::fs::write(run.agent_dir.join("agent.py"), "print('next')\n").unwrap();
    let (out, report) = run.run("namespace");
    assert_eq!(
        report["status"],
        "succeeded",
        "{report} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ids = run_ids(&run);
    assert_eq!(ids.len(), 2, "the crashed run and the next: {ids:?}");
    let mut left = support::standby_cgroup_dirs(waiter_pid);
    left.extend(ids.iter().flat_map(|id| support::run_cgroup_dirs(id)));
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn sockets_of_stopped_platforms_are_reclaimed() {
    let run = RealRun::python("print('hi')\n", 30);
    let sockets = run.home.path().join("sockets");
    std::fs::create_dir_all(&sockets).unwrap();
    // A PID that is not running (the highest ones are never reached here).
    let dead = (4_000_000u32..4_194_304)
        .find(|p| !std::path::Path::new(&format!("/proc/{p}")).exists())
        .unwrap();
    let stale = sockets.join(format!("platform-{dead}.sock"));
    let live = sockets.join(format!("platform-{}.sock", std::process::id()));
    let _l1 = std::os::unix::net::UnixListener::bind(&stale).unwrap();
    let _l2 = std::os::unix::net::UnixListener::bind(&live).unwrap();
    let (out, _) = run.run("process");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!stale.exists(), "the dead platform's socket is reclaimed");
    assert!(live.exists(), "a live platform's socket is kept");
    let left: Vec<_> = std::fs::read_dir(&sockets).unwrap().flatten().collect();
    assert_eq!(
        left.len(),
        1,
        "the run's own socket is removed at its end: {left:?}"
    );
}

fn add_connection(run: &RealRun, name: &str, key: &str) -> std::process::Output {
    let mut add = std::process::Command::new(support::AIRLOCK)
        .args([
            "connections",
            "add",
            name,
            "--integration",
            "gh",
            "--type",
            "bearer",
        ])
        .env("AIRLOCK_HOME", run.home.path())
        .env("CONNECTION_ENCRYPTION_KEY", key)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(add.stdin.as_mut().unwrap(), br#"{"token":"ghp_x"}"#).unwrap();
    drop(add.stdin.take());
    add.wait_with_output().unwrap()
}

#[test]
fn another_key_under_the_same_key_id_is_refused() {
    let run = RealRun::python("print('hi')\n", 30);
    let key = |r: &RealRun| String::from_utf8(r.airlock(&["keys", "generate"]).stdout).unwrap();
    let (a, b) = (key(&run), key(&run));
    assert!(add_connection(&run, "one", a.trim()).status.success());
    let o = add_connection(&run, "two", b.trim());
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "a second key under k1 was accepted");
    assert!(
        stderr.contains("is not the key this store's \"k1\" envelopes were written with"),
        "{stderr}"
    );
    let list = String::from_utf8(run.airlock(&["connections", "list"]).stdout).unwrap();
    assert!(list.contains("one") && !list.contains("two"), "{list}");
    // A run with the wrong key is refused too; the right one works.
    let (out, _) = run.run("process");
    assert!(out.status.success());
    let wrong = RealRun {
        env: vec![("CONNECTION_ENCRYPTION_KEY".into(), b.trim().into())],
        ..run
    };
    let (out, _) = wrong.run("process");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not the key"));
    assert!(add_connection(&wrong, "three", a.trim()).status.success());
}

#[test]
fn a_damaged_store_is_refused_with_a_clear_error() {
    let run = RealRun::python("print('x' * 100)\n", 30);
    for _ in 0..3 {
        let (out, _) = run.run("process");
        assert!(out.status.success());
    }
    let db = run.home.path().join("airlock.db");
    // Everything in the main file first (no page left only in the WAL).
    std::process::Command::new("python3")
        .args([
            "-c",
            "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute('PRAGMA wal_checkpoint(TRUNCATE)'); c.close()",
        ])
        .arg(&db)
        .status()
        .unwrap();
    let mut bytes = std::fs::read(&db).unwrap();
    let pages = bytes.len() / 4096;
    assert!(pages >= 4, "{pages} pages");
    for page in 2..pages {
        let off = page * 4096;
        for b in &mut bytes[off..off + 8] {
            *b ^= 0x5a;
        }
    }
    std::fs::write(&db, &bytes).unwrap();
    for args in [&["runs", "list"][..], &["connections", "list"][..]] {
        let o = run.airlock(args);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} used a damaged store");
        assert!(stderr.contains("is damaged"), "{args:?}: {stderr}");
    }
    let (out, _) = run.run("process");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is damaged"));
}
