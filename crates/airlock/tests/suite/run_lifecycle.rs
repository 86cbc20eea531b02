//! `airlock run` end to end on the process backend: the four end states,
//! the watchdog, limits validation, boot reclaim and cleanup. Each test has
//! its own AIRLOCK_HOME.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

const AIRLOCK: &str = env!("CARGO_BIN_EXE_airlock");

fn manifest(dir: &Path, command: &str, timeout: u64) -> std::path::PathBuf {
    let p = dir.join("airlock.toml");
    std::fs::write(
        &p,
        format!("[agent]\nname = \"t\"\ncommand = [\"/bin/sh\", \"-c\", {command:?}]\ntimeout = {timeout}\n\n[network]\negress = \"none\"\n"),
    )
    .unwrap();
    p
}

fn run(home: &Path, manifest: &Path, env: &[(&str, &str)]) -> (Output, Value) {
    let mut cmd = Command::new(AIRLOCK);
    cmd.args(["run", "--backend", "process", "--json", "-f"])
        .arg(manifest)
        .env("AIRLOCK_HOME", home)
        .env_remove("DATABASE_URL");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let json = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out, json)
}

/// The backends this machine runs: the process backend, and each
/// isolating one whose peer is here (under CI each must be: the support
/// module's checks fail there when one is missing).
fn backends_here() -> Vec<&'static str> {
    let mut backends = vec!["process"];
    if crate::support::namespace_available() {
        backends.push("namespace");
    }
    if crate::support::docker_available() {
        backends.push("docker");
    }
    if crate::microvm::guest().is_some() {
        backends.push("microvm");
    }
    backends
}

/// A local `airlock run --json -f` of `manifest` on `backend` with its
/// store in `home`, its report on the child's stdout. Its terminal output
/// (every line again) goes to the file returned: a pipe no one reads until
/// the end would stop the run when it is full.
fn local_run(
    home: &Path,
    backend: &str,
    manifest: &Path,
) -> (std::process::Child, std::path::PathBuf) {
    let stderr = home.join("stderr");
    let child = Command::new(AIRLOCK)
        .args(["run", "--backend", backend, "--json", "-f"])
        .arg(manifest)
        .env("AIRLOCK_HOME", home)
        .env_remove("DATABASE_URL")
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    (child, stderr)
}

/// `airlock ARGS` on the store in `home`: its stdout, or its whole output
/// when it failed.
fn cli_in(home: &Path, args: &[&str]) -> Result<String, Output> {
    let out = Command::new(AIRLOCK)
        .args(args)
        .env("AIRLOCK_HOME", home)
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
        .ok_or(out)
}

fn no_leftovers(home: &Path) {
    let runs: Vec<_> = std::fs::read_dir(home.join("runs"))
        .map(|r| r.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(runs.is_empty(), "run directories left behind: {runs:?}");
}

#[test]
fn a_successful_run_reports_and_cleans_up() {
    let home = tempfile::tempdir().unwrap();
    let m = manifest(
        home.path(),
        "echo hello from the agent; echo '{\"ok\":true}' > \"$AIRLOCK_RESULT_FILE\"; env",
        30,
    );
    let (out, json) = run(home.path(), &m, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(json["status"], "succeeded");
    assert_eq!(json["exit_code"], 0);
    assert_eq!(json["backend"], "process");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("isolates NOTHING"),
        "the process backend must say so: {stderr}"
    );
    // The agent's environment holds no secret: no token, no key.
    let env = String::from_utf8_lossy(&out.stderr);
    for forbidden in [
        "sidecar_token",
        "RUN_TOKEN",
        "CONNECTION_ENCRYPTION_KEY",
        "AIRLOCK_SIDECAR",
    ] {
        assert!(
            !env.contains(forbidden),
            "{forbidden} in the agent's environment"
        );
    }
    // The sidecar token is 64 hex characters: nothing like it may be visible.
    let hexrun = env
        .split(|c: char| !c.is_ascii_hexdigit())
        .any(|w| w.len() >= 64);
    assert!(!hexrun, "a token-like value is in the agent's environment");
    assert!(env.contains("AIRLOCK_MCP_URL=http://127.0.0.1:"));
    assert!(env.contains("OPENAI_API_KEY=airlock-placeholder-key"));
    no_leftovers(home.path());
    // runs list / show / logs read the same run back.
    let id = json["id"].as_str().unwrap();
    let logs = Command::new(AIRLOCK)
        .args(["runs", "logs", id])
        .env("AIRLOCK_HOME", home.path())
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&logs.stdout).contains("hello from the agent"));
    let list = Command::new(AIRLOCK)
        .args(["runs", "list"])
        .env("AIRLOCK_HOME", home.path())
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&list.stdout).contains(id));
    let show = Command::new(AIRLOCK)
        .args(["runs", "show", id])
        .env("AIRLOCK_HOME", home.path())
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&show.stdout).contains("succeeded"));
}

#[test]
fn failure_and_timeout() {
    let home = tempfile::tempdir().unwrap();
    let m = manifest(home.path(), "exit 3", 30);
    let (out, json) = run(home.path(), &m, &[]);
    // The agent's exit code passes through (as `docker run` does).
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(json["status"], "failed");
    assert_eq!(json["exit_code"], 3);
    let m = manifest(home.path(), "sleep 30", 1);
    let started = std::time::Instant::now();
    let (_, json) = run(home.path(), &m, &[]);
    assert_eq!(json["status"], "timed_out", "{json}");
    assert!(started.elapsed().as_secs() < 15);
    no_leftovers(home.path());
}

#[test]
fn a_stalled_run_is_stopped_by_the_watchdog() {
    let home = tempfile::tempdir().unwrap();
    // The agent freezes its parent, the runtime: heartbeats stop.
    let m = manifest(home.path(), "kill -STOP $PPID; sleep 30", 60);
    let env = [
        ("RUN_HEARTBEAT_INTERVAL_SECONDS", "1"),
        ("RUN_STALL_THRESHOLD_SECONDS", "3"),
        ("RUN_WATCHDOG_INTERVAL_SECONDS", "1"),
    ];
    let (_, json) = run(home.path(), &m, &env);
    assert_eq!(json["status"], "failed", "{json}");
    assert!(
        json["error"]
            .as_str()
            .unwrap_or("")
            .contains("no heartbeat"),
        "{json}"
    );
    no_leftovers(home.path());
}

#[test]
fn bad_operator_settings_stop_the_start() {
    let home = tempfile::tempdir().unwrap();
    let m = manifest(home.path(), "true", 30);
    for (env, var) in [
        (
            vec![
                ("RUN_HEARTBEAT_INTERVAL_SECONDS", "10"),
                ("RUN_STALL_THRESHOLD_SECONDS", "20"),
            ],
            "RUN_STALL_THRESHOLD_SECONDS",
        ),
        (
            vec![("PLATFORM_RUN_LIMITS", "{\"agent_memory_ceiling\": 1}")],
            "PLATFORM_RUN_LIMITS",
        ),
        (vec![("RUN_ADAPTER", "vm")], "RUN_ADAPTER"),
    ] {
        let mut cmd = Command::new(AIRLOCK);
        cmd.args(["run", "-f"])
            .arg(&m)
            .env("AIRLOCK_HOME", home.path());
        for (k, v) in &env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{env:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(var),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The processes of the runs under `home` (found by the home's path in
/// their command line or environment): `airlock` ones and the test agents.
fn processes_of(home: &Path) -> Vec<String> {
    let home = home.display().to_string();
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let env = std::fs::read(e.path().join("environ")).unwrap_or_default();
        let ours = String::from_utf8_lossy(&env).contains(&home) || cmdline.contains(&home);
        if ours && (cmdline.contains("airlock") || cmdline.contains("sleep 30")) {
            found.push(format!("{}: {cmdline}", e.file_name().to_string_lossy()));
        }
    }
    found
}

/// Waits (30 s at most) until the agent running `command` under `home` is
/// a process.
fn wait_for_agent(home: &Path, command: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !processes_of(home).iter().any(|p| p.contains(command)) {
        assert!(
            std::time::Instant::now() < deadline,
            "the agent {command:?} never ran: {:?}",
            processes_of(home)
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn leftovers_of_a_crashed_platform_are_reclaimed() {
    let home = tempfile::tempdir().unwrap();
    let m = manifest(home.path(), "sleep 30", 60);
    let mut child = Command::new(AIRLOCK)
        .args(["run", "--backend", "process", "-f"])
        .arg(&m)
        .env("AIRLOCK_HOME", home.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Once its agent runs, crash the platform.
    wait_for_agent(home.path(), "sleep 30");
    let platform_pid = child.id();
    child.kill().unwrap();
    child.wait().unwrap();
    // Its sidecar, runtime and agent notice and go away too.
    let orphans = || processes_of(home.path());
    let _ = platform_pid;
    let mut left = orphans();
    for _ in 0..40 {
        if left.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        left = orphans();
    }
    assert!(
        left.is_empty(),
        "processes outlived the killed platform: {left:?}"
    );
    let m2 = manifest(home.path(), "true", 30);
    let (out, json) = run(home.path(), &m2, &[]);
    assert_eq!(
        json["status"],
        "succeeded",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("reclaimed 1 leftover run"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list = Command::new(AIRLOCK)
        .args(["runs", "list"])
        .env("AIRLOCK_HOME", home.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&list.stdout);
    assert_eq!(text.matches("failed").count(), 1, "{text}");
    no_leftovers(home.path());
}

#[test]
fn ctrl_c_cancels_cleanly() {
    let home = tempfile::tempdir().unwrap();
    let m = manifest(home.path(), "sleep 30", 60);
    let child = Command::new(AIRLOCK)
        .args(["run", "--backend", "process", "--json", "-f"])
        .arg(&m)
        .env("AIRLOCK_HOME", home.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_agent(home.path(), "sleep 30");
    Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let json: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert_eq!(
        json["status"],
        "cancelled",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    no_leftovers(home.path());
}

/// A run the platform stops (here Ctrl-C's cancel, on the process,
/// namespace, docker and microvm backends) loses no line its agent wrote
/// before the stop: each is in the run's log or counted there as shed. The
/// runtime is asked to stop and reports what it read and its count of what
/// it shed; killed at once, as it was, the lines it still held and that
/// count were lost without a trace (96,001 of 100,000 on the process
/// backend).
#[test]
fn a_cancel_keeps_or_counts_every_line_the_agent_wrote_before_it() {
    // 48,894 bytes: within a pipe's 64 KiB, so all written at once, long
    // before the first of them can be in the store.
    const LINES: u64 = 10_000;
    for backend in backends_here() {
        let home = tempfile::tempdir().unwrap();
        // The agent's directory, readable by an isolated sandbox's uid and
        // outside the home.
        let agent = tempfile::tempdir().unwrap();
        std::fs::set_permissions(
            agent.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let m = manifest(agent.path(), &format!("seq 1 {LINES}; exec sleep 100"), 120);
        let (mut child, stderr) = local_run(home.path(), backend, &m);
        // The stop comes as soon as the run's first line is in its store:
        // the agent has written them all, most are still on their way.
        let cli = |args: &[&str]| {
            cli_in(home.path(), args).unwrap_or_else(|out| panic!("{backend}: {args:?}: {out:?}"))
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        let said = || std::fs::read_to_string(&stderr).unwrap_or_default();
        let id = loop {
            if let Some(status) = child.try_wait().unwrap() {
                panic!(
                    "{backend}: the run ended ({status}) before a line of its agent's was in the store: {}",
                    said()
                );
            }
            // (A read of the store never fails while the run writes to it.)
            let runs: Value = serde_json::from_str(&cli(&["runs", "list", "--json"])).unwrap();
            assert!(
                std::time::Instant::now() < deadline,
                "{backend}: no line of the agent's reached the store in 120 s; runs: {runs}; stderr: {}",
                said()
            );
            if let Some(id) = runs["runs"][0]["id"].as_str()
                && !cli(&["runs", "logs", "--json", id]).is_empty()
            {
                break id.to_owned();
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status()
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let report: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        assert_eq!(
            (report["status"].as_str(), report["id"].as_str()),
            (Some("cancelled"), Some(id.as_str())),
            "{backend}: {}",
            said()
        );
        let (mut kept, mut shed) = (std::collections::BTreeSet::new(), 0u64);
        for line in cli(&["runs", "logs", "--json", &id]).lines() {
            let v: Value = serde_json::from_str(line).unwrap();
            let text = v["line"].as_str().unwrap();
            if v["stream"] == "stdout" {
                let n: u64 = text.trim().parse().unwrap();
                assert!(
                    (1..=LINES).contains(&n) && kept.insert(n),
                    "{backend}: {text}"
                );
            } else if let Some(rest) = text.strip_prefix("[airlock: ") {
                shed += rest.split(' ').next().unwrap().parse::<u64>().unwrap();
            }
        }
        assert_eq!(
            kept.len() as u64 + shed,
            LINES,
            "{backend}: {} lines kept and {shed} counted as shed of the {LINES} written",
            kept.len()
        );
        no_leftovers(home.path());
    }
}

/// An agent's directory under a directory the sandbox's own system has
/// (a fresh one in `/var/tmp`, which the microVM guest's image has,
/// read-only) runs on every backend here: the agent reads its file at the
/// same path as on the host and, where the backend isolates, cannot write
/// there. The guest failed it with "Read-only file system", cold and warm,
/// making its mount point inside the image; the image's `/var/tmp` is
/// still seen there as it was (its sticky mode, read-only).
#[test]
fn an_agent_directory_under_var_tmp_runs_on_every_backend() {
    use std::os::unix::fs::PermissionsExt;
    for backend in backends_here() {
        let home = tempfile::tempdir().unwrap();
        let fresh = tempfile::Builder::new()
            .prefix("airlock-test-")
            .tempdir_in("/var/tmp")
            .unwrap();
        let agent = fresh.path().join("agents/a");
        std::fs::create_dir_all(&agent).unwrap();
        // Readable by an isolated sandbox's uid, as an operator's would be.
        for d in [fresh.path(), &fresh.path().join("agents"), &agent] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let note = format!("note-{backend}-{}", std::process::id());
        std::fs::write(agent.join("note.txt"), &note).unwrap();
        let dir = agent.display();
        let m = manifest(
            &agent,
            &format!(
                "cat {dir}/note.txt; echo; \
                 if touch {dir}/planted 2>/dev/null; then echo dir writable; else echo dir read-only; fi; \
                 echo var-tmp $(stat -c '%a %U' /var/tmp)"
            ),
            120,
        );
        let mut cmd = Command::new(AIRLOCK);
        cmd.args(["run", "--backend", backend, "--json", "-f"])
            .arg(&m)
            .env("AIRLOCK_HOME", home.path())
            .env_remove("DATABASE_URL");
        let out = cmd.output().unwrap();
        let json: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        assert_eq!(
            json["status"],
            "succeeded",
            "{backend}: {json}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let id = json["id"].as_str().unwrap();
        let logs = Command::new(AIRLOCK)
            .args(["runs", "logs", id])
            .env("AIRLOCK_HOME", home.path())
            .env_remove("DATABASE_URL")
            .output()
            .unwrap();
        assert!(logs.status.success(), "{backend}: {logs:?}");
        let text = String::from_utf8_lossy(&logs.stdout);
        let said = |tag: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(tag))
                .unwrap_or_else(|| panic!("{backend}: no {tag:?} in {text}"))
                .trim()
                .to_owned()
        };
        assert!(text.lines().any(|l| l == note), "{backend}: {text}");
        if backend != "process" {
            assert_eq!(said("dir "), "read-only", "{backend}: {text}");
        }
        if backend == "microvm" {
            assert_eq!(said("var-tmp "), "1777 root", "{backend}: {text}");
        }
        no_leftovers(home.path());
    }
}

/// `airlock runs list` and `airlock runs logs` read the store while a local
/// run whose agent prints 100,000 lines writes them to it: every read
/// succeeds (a reader never waits for the writer: WAL), while the run is
/// running and after. They failed with "database … is locked by another
/// process": each opening of the store asked for the write lock.
#[test]
fn readers_of_the_store_never_fail_while_a_busy_run_writes_it() {
    const LINES: u64 = 100_000;
    let home = tempfile::tempdir().unwrap();
    let m = manifest(home.path(), &format!("seq 1 {LINES}"), 120);
    let (mut child, stderr) = local_run(home.path(), "process", &m);
    let cli = |args: &[&str]| {
        cli_in(home.path(), args).unwrap_or_else(|out| {
            panic!(
                "{args:?} failed while the run writes: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
    };
    // Reads while the run is running (its lines reach the store as the
    // platform takes them; here most are shed and counted).
    let mut reads = 0;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        assert!(std::time::Instant::now() < deadline, "the run never ended");
        let runs: Value = serde_json::from_str(&cli(&["runs", "list", "--json"])).unwrap();
        let Some(id) = runs["runs"][0]["id"].as_str() else {
            continue;
        };
        cli(&["runs", "logs", "--json", id]);
        if runs["runs"][0]["status"] == "running" {
            reads += 1;
        }
    }
    let out = child.wait_with_output().unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert_eq!(
        report["status"],
        "succeeded",
        "{}",
        std::fs::read_to_string(&stderr).unwrap_or_default()
    );
    assert!(reads > 0, "no read while the run was running");
    let id = report["id"].as_str().unwrap();
    let logs = cli(&["runs", "logs", "--json", id]);
    assert!(
        logs.contains("\"line\":\"1\""),
        "the run's first line is not in its log"
    );
    no_leftovers(home.path());
}
