//! The CLI's conventions (gh, kubectl and docker are the bar), each held by
//! a test of the built binary on the process backend, with its own
//! AIRLOCK_HOME: one versioned run report everywhere, exit statuses that
//! pass the agent's through, a closed pipe that ends quietly, human text,
//! a doctor with a verdict, and a README that says what is built.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

use crate::support::AIRLOCK;

fn airlock(home: &Path, args: &[&str]) -> Output {
    Command::new(AIRLOCK)
        .args(args)
        .env("AIRLOCK_HOME", home)
        .env_remove("DATABASE_URL")
        .env_remove("AIRLOCK_SERVER")
        .output()
        .unwrap()
}

fn manifest(dir: &Path, command: &str, timeout: u64) -> PathBuf {
    let p = dir.join("airlock.toml");
    std::fs::write(
        &p,
        format!("[agent]\nname = \"conv\"\ncommand = [\"/bin/sh\", \"-c\", {command:?}]\ntimeout = {timeout}\n\n[network]\negress = \"none\"\n"),
    )
    .unwrap();
    p
}

/// `airlock run` of `manifest` on the process backend, its report as JSON.
fn run_json_args(manifest: &Path) -> Vec<&str> {
    let m = manifest.to_str().unwrap();
    vec!["run", "--backend", "process", "--json", "-f", m]
}

fn run_json(home: &Path, command: &str, timeout: u64) -> (Output, Value) {
    let m = manifest(home, command, timeout);
    let out = airlock(home, &run_json_args(&m));
    let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out, v)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn one_versioned_run_report_for_run_runs_show_and_runs_list() {
    let home = tempfile::tempdir().unwrap();
    let (out, report) = run_json(home.path(), "echo hi", 30);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(report["schema"], "airlock.run/v1", "{report}");
    assert_eq!(report["status"], "succeeded");
    let id = report["id"].as_str().unwrap();
    // `runs show --json` prints the same document, byte for byte.
    let shown = airlock(home.path(), &["runs", "show", id, "--json"]);
    assert!(shown.status.success(), "{}", text(&shown.stderr));
    assert_eq!(text(&shown.stdout).trim(), text(&out.stdout).trim());
    // `runs list --json`: the API's run answers, each a subset of its report.
    let listed = airlock(home.path(), &["runs", "list", "--json"]);
    assert!(listed.status.success(), "{}", text(&listed.stderr));
    let list: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let run = &list["runs"][0];
    assert_eq!(run["id"], id, "{list}");
    for (k, v) in run.as_object().unwrap() {
        assert_eq!(&report[k], v, "{k}: the list and the report disagree");
    }
    // `connections list --json`: the API's answer too.
    let conns = airlock(home.path(), &["connections", "list", "--json"]);
    assert!(conns.status.success(), "{}", text(&conns.stderr));
    let conns: Value = serde_json::from_slice(&conns.stdout).unwrap();
    assert_eq!(conns, serde_json::json!({"connections": []}));
    // The text view: human times, the status, never raw Unix seconds.
    let shown = text(&airlock(home.path(), &["runs", "show", id]).stdout);
    assert!(shown.contains("status      succeeded"), "{shown}");
    assert!(shown.contains(" UTC"), "{shown}");
    let started = report["started_at"].as_i64().unwrap().to_string();
    assert!(!shown.contains(&started[..10]), "{shown}");
}

#[test]
fn the_agents_exit_code_passes_through_and_airlocks_own_are_distinct() {
    let home = tempfile::tempdir().unwrap();
    let (out, report) = run_json(home.path(), "exit 7", 30);
    assert_eq!(out.status.code(), Some(7), "{report}");
    let (out, report) = run_json(home.path(), "sleep 30", 1);
    assert_eq!(report["status"], "timed_out", "{report}");
    assert_eq!(out.status.code(), Some(124), "as timeout(1)");
    // A bad setting: nothing started, 2 (clap's usage errors are 2 too).
    let m = manifest(home.path(), "true", 30);
    let out = Command::new(AIRLOCK)
        .args(["run", "--backend", "nonsense", "-f", m.to_str().unwrap()])
        .env("AIRLOCK_HOME", home.path())
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let out = airlock(home.path(), &["run", "--no-such-flag"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn an_unknown_run_is_no_run_and_exits_1() {
    let home = tempfile::tempdir().unwrap();
    for args in [
        &["runs", "logs", "run_nonesuch"][..],
        &["runs", "show", "run_nonesuch"][..],
        &["runs", "show", "run_nonesuch", "--json"][..],
        &["runs", "audit", "run_nonesuch"][..],
    ] {
        let out = airlock(home.path(), args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(
            text(&out.stderr).contains("no run run_nonesuch"),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
}

#[test]
fn a_missing_manifest_says_pass_f_once() {
    let home = tempfile::tempdir().unwrap();
    let out = Command::new(AIRLOCK)
        .args(["run", "--backend", "process"])
        .current_dir(home.path())
        .env("AIRLOCK_HOME", home.path())
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.matches("pass -f PATH").count(), 1, "{err}");
}

/// An error whose cause is also in its own words says that cause once
/// ("docker at …: Socket not found: X" was followed by ": X" again). A
/// daemon socket that does not exist: nothing is reached.
#[test]
fn an_error_says_each_cause_once() {
    let home = tempfile::tempdir().unwrap();
    let sock = home.path().join("no-daemon.sock");
    let out = Command::new(AIRLOCK)
        .args(["images", "build"])
        .env("AIRLOCK_HOME", home.path())
        .env("DOCKER_HOST", format!("unix://{}", sock.display()))
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let cause = format!("Socket not found: {}", sock.display());
    assert_eq!(err.matches(&cause).count(), 1, "{err}");
}

/// Commands started at once in a new home (`airlock run` four times in
/// one shell line) all open its one new store: none fails "locked". Before
/// the store's opens were one process's after another's, about 1 in 90 of
/// six such openers failed (so 60 rounds of six failed nearly always).
#[test]
fn commands_started_at_once_in_a_new_home_all_open_its_store() {
    for round in 0..60 {
        let home = tempfile::tempdir().unwrap();
        let children: Vec<_> = (0..6)
            .map(|_| {
                Command::new(AIRLOCK)
                    .args(["runs", "list", "--json"])
                    .env("AIRLOCK_HOME", home.path())
                    .env_remove("DATABASE_URL")
                    .env_remove("AIRLOCK_SERVER")
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for c in children {
            let out = c.wait_with_output().unwrap();
            assert!(out.status.success(), "round {round}: {}", text(&out.stderr));
            let v: Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(v["runs"], serde_json::json!([]), "round {round}");
        }
    }
}

/// Runs `args` with its stdout a pipe whose reader is already gone.
fn with_closed_stdout(home: &Path, args: &[&str]) -> Output {
    let mut child = Command::new(AIRLOCK)
        .args(args)
        .env("AIRLOCK_HOME", home)
        .env_remove("DATABASE_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    child.wait_with_output().unwrap()
}

#[test]
fn a_closed_pipe_ends_quietly_and_the_run_is_still_ended() {
    let home = tempfile::tempdir().unwrap();
    let m = manifest(home.path(), "echo hi", 30);
    let out = with_closed_stdout(home.path(), &run_json_args(&m));
    let err = text(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(out.status.code(), Some(0), "the run's own status: {err}");
    for args in [
        &["runs", "list"][..],
        &["doctor", "--backend", "process"][..],
    ] {
        let out = with_closed_stdout(home.path(), args);
        let err = text(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
    }
    // The run ended as it should: nothing left for the next start to reclaim.
    let list: Value =
        serde_json::from_slice(&airlock(home.path(), &["runs", "list", "--json"]).stdout).unwrap();
    assert_eq!(list["runs"][0]["status"], "succeeded", "{list}");
    let next = airlock(
        home.path(),
        &["run", "--backend", "process", "-f", m.to_str().unwrap()],
    );
    assert!(
        !text(&next.stderr).contains("reclaimed"),
        "{}",
        text(&next.stderr)
    );
}

/// Runs `args` with no stderr: closed (`2>&-`), or a pipe whose reader is
/// already gone (each write fails with EPIPE).
fn without_stderr(home: &Path, args: &[&str], closed: bool) -> Output {
    let mut cmd = if closed {
        let mut c = Command::new("/bin/sh");
        c.args(["-c", "exec \"$0\" \"$@\" 2>&-", AIRLOCK]);
        c
    } else {
        Command::new(AIRLOCK)
    };
    cmd.args(args)
        .env("AIRLOCK_HOME", home)
        .env_remove("DATABASE_URL")
        .env_remove("AIRLOCK_SERVER")
        .stdout(Stdio::piped());
    let (reader, writer) = std::io::pipe().unwrap();
    if !closed {
        cmd.stderr(writer);
    }
    drop(reader);
    let out = cmd.output().unwrap();
    drop(cmd);
    out
}

/// An agent with lines on both of its streams (the live view echoes them).
const BOTH_STREAMS: &str = "for i in 1 2 3; do echo out $i; echo err $i >&2; done";

/// The live view and the milestones are the operator's, on stderr: with it
/// closed, or a pipe nobody reads, the run goes on, unseen, to its end, and
/// its report (stdout) is whole.
#[test]
fn a_closed_stderr_does_not_end_the_run() {
    let home = tempfile::tempdir().unwrap();
    let m = manifest(home.path(), BOTH_STREAMS, 30);
    let text_args = ["run", "--backend", "process", "-f", m.to_str().unwrap()];
    for closed in [true, false] {
        let out = without_stderr(home.path(), &run_json_args(&m), closed);
        let report: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        assert_eq!(out.status.code(), Some(0), "closed {closed}: {report}");
        assert_eq!(report["status"], "succeeded", "closed {closed}: {report}");
        // Without --json the milestones and the report are stderr's too.
        let out = without_stderr(home.path(), &text_args, closed);
        assert_eq!(out.status.code(), Some(0), "closed {closed}, text");
    }
    let list: Value =
        serde_json::from_slice(&airlock(home.path(), &["runs", "list", "--json"]).stdout).unwrap();
    let statuses: Vec<&Value> = list["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["status"])
        .collect();
    assert_eq!(statuses, ["succeeded"; 4], "{list}");
}

#[test]
fn doctor_gives_a_verdict_per_backend_as_json_and_fails_for_a_backend_that_cannot_run() {
    let home = tempfile::tempdir().unwrap();
    let out = airlock(home.path(), &["doctor", "--backend", "process", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["schema"], "airlock.doctor/v1");
    assert_eq!(v["chosen"], "process");
    assert_eq!(v["chosen_works"], true);
    let names: Vec<&str> = v["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["backend"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["namespace", "docker", "process"]);
    for b in v["backends"].as_array().unwrap() {
        assert!(
            b["works"].as_bool().unwrap() || b["next_step"].is_string(),
            "a backend that cannot run says what to do next: {b}"
        );
    }
    // A daemon that is not there: docker cannot run, and says how to fix it.
    let out = Command::new(AIRLOCK)
        .args(["doctor", "--backend", "docker"])
        .env("AIRLOCK_HOME", home.path())
        .env(
            "DOCKER_HOST",
            format!("unix://{}/no.sock", home.path().display()),
        )
        .output()
        .unwrap();
    let said = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("install docker.io and start dockerd"),
        "{said}"
    );
    assert!(said.contains("✗ chosen: docker"), "{said}");
}

#[test]
fn help_describes_every_argument_and_hides_internal_subcommands() {
    let home = tempfile::tempdir().unwrap();
    let top = text(&airlock(home.path(), &["--help"]).stdout);
    for internal in [
        "sandbox-init",
        "container-init",
        "runtime",
        "runner",
        "sidecar",
    ] {
        assert!(
            !top.lines()
                .any(|l| l.trim_start().starts_with(&format!("{internal} "))),
            "{internal} is internal: {top}"
        );
    }
    for args in [
        &["run", "--help"][..],
        &["runs", "list", "--help"][..],
        &["runs", "show", "--help"][..],
        &["runs", "logs", "--help"][..],
        &["runs", "audit", "--help"][..],
        &["doctor", "--help"][..],
    ] {
        let help = text(&airlock(home.path(), args).stdout);
        assert!(help.contains("Examples:"), "{args:?}: {help}");
    }
}

fn readme() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md")).unwrap()
}

/// The rows of README's "What works" table: (part, crates, state).
fn what_works(readme: &str) -> Vec<(String, String, String)> {
    let table = readme
        .split("## What works")
        .nth(1)
        .unwrap()
        .split("\n## ")
        .next()
        .unwrap();
    table
        .lines()
        .filter(|l| l.starts_with('|') && !l.starts_with("|---") && !l.starts_with("| part"))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split(" | ").map(str::trim).collect();
            (cells[0].into(), cells[1].into(), cells[2].into())
        })
        .collect()
}

#[test]
fn readmes_what_works_table_says_what_is_built() {
    let readme = readme();
    let rows = what_works(&readme);
    let remote_mcp = airlock_platform::manifest::Manifest::parse(
        "[agent]\nname = \"m\"\ncommand = [\"true\"]\n\n[[integrations]]\nnamespace = \"gh\"\n\
         authorized_uris = [\"https://mcp.example.com/**\"]\n\
         source = { kind = \"remote\", url = \"https://mcp.example.com/mcp\" }\n",
    )
    .map_err(|e| eprintln!("remote MCP refused: {e}"))
    .is_ok();
    let local_mcp = airlock_platform::manifest::Manifest::parse(
        "[agent]\nname = \"m\"\ncommand = [\"true\"]\n\n[[integrations]]\nnamespace = \"svc\"\n\
         source = { kind = \"local\", command = [\"/usr/bin/python3\", \"runner.py\"] }\n",
    )
    .is_ok();
    let no_backend = |name: &str| {
        airlock_sandbox::select(name)
            .err()
            .is_some_and(|e| e.to_string().contains("no backend named"))
    };
    // (what a row names, whether the code has it)
    for (part, built) in [
        ("MCP integrations", remote_mcp && local_mcp),
        ("`firecracker` backend", !no_backend("firecracker")),
        ("`airlock serve`", true),
    ] {
        let (_, _, state) = rows
            .iter()
            .find(|(p, _, _)| p.contains(part))
            .unwrap_or_else(|| panic!("README's table has no row for {part}: {rows:?}"));
        assert_eq!(
            state.starts_with("done"),
            built,
            "README says {part} is {state:?}"
        );
        assert_eq!(state == "not built yet", !built, "{part}: {state:?}");
    }
    // Every crate the table or the layout names exists, and the layout
    // names every crate there is.
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for (_, names, _) in &rows {
        for name in names.split('`').filter(|n| n.starts_with("airlock")) {
            assert!(crates.join(name).is_dir(), "README names {name}");
        }
    }
    for dir in std::fs::read_dir(&crates).unwrap().flatten() {
        let name = dir.file_name().to_string_lossy().into_owned();
        assert!(
            readme.contains(&format!("\ncrates/{name} ")),
            "README's layout does not list crates/{name}"
        );
    }
}

#[test]
fn an_authorized_private_address_is_warned_of_at_load_with_the_setting_that_allows_it() {
    let home = tempfile::tempdir().unwrap();
    let m = home.path().join("airlock.toml");
    std::fs::write(
        &m,
        "[agent]\nname = \"w\"\ncommand = [\"/bin/true\"]\ntimeout = 30\n\n[[integrations]]\n\
         namespace = \"svc\"\nauthorized_uris = [\"http://127.0.0.1:9/**\"]\n",
    )
    .unwrap();
    let run = |allow: Option<&str>| {
        let mut c = Command::new(AIRLOCK);
        c.args(["run", "--backend", "process", "-f", m.to_str().unwrap()])
            .env("AIRLOCK_HOME", home.path())
            .env_remove("DATABASE_URL")
            .env_remove("EGRESS_ALLOW_INTERNAL_HOSTS");
        if let Some(a) = allow {
            c.env("EGRESS_ALLOW_INTERNAL_HOSTS", a);
        }
        text(&c.output().unwrap().stderr)
    };
    let warned = run(None);
    assert!(
        warned.contains("EGRESS_ALLOW_INTERNAL_HOSTS=127.0.0.1"),
        "{warned}"
    );
    let allowed = run(Some("127.0.0.1"));
    assert!(!allowed.contains("warning: integration svc"), "{allowed}");
}

/// Item 7: an agent file the sandbox's uid cannot read (a root platform
/// runs each sandbox as an unprivileged uid; the operator's `agent.py` is
/// 0600) is refused before anything starts, naming the file and the fix,
/// as its directory would be; after the fix the same run succeeds. Only
/// a root platform has a sandbox uid that is not the file's owner.
#[test]
fn an_agent_file_the_sandbox_cannot_read_is_refused_before_the_run_with_the_fix() {
    use std::os::unix::fs::PermissionsExt;
    if !rustix::process::geteuid().is_root() {
        airlock_test_support::require_peer::<(), _>(
            "a root platform (its sandbox runs as another uid)",
            Err("this test process is not root".to_owned()),
        );
        return;
    }
    if !crate::support::namespace_available() {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let dir = home.path().join("agent");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let agent = dir.join("agent.py");
    std::fs::write(&agent, "print('read me')\n").unwrap();
    std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o600)).unwrap();
    let m = dir.join("airlock.toml");
    std::fs::write(
        &m,
        "[agent]\nname = \"unreadable\"\ncommand = [\"/usr/bin/python3\", \"agent.py\"]\ntimeout = 60\n\n[network]\negress = \"none\"\n",
    )
    .unwrap();
    let args = ["run", "--backend", "namespace", "-f", m.to_str().unwrap()];
    let out = airlock(home.path(), &args);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "Airlock's own failure: {err}");
    assert!(err.contains("agent.py"), "the file is named: {err}");
    assert!(err.contains("chmod o+rX"), "the fix is said: {err}");
    assert!(
        !text(&out.stdout).contains("read me"),
        "the agent never ran"
    );
    std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = airlock(home.path(), &args);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("read me"),
        "the agent ran (its output, live): {err}"
    );
}

/// An operator's typo: Airlock's home inside the agent's directory (here
/// `AIRLOCK_HOME=$AGENT/.airlock`; as well the default home under an
/// agent directory of `~`). An isolating sandbox sees the agent's
/// directory, so it would see the platform's store files and sockets: the
/// run is refused before anything starts, naming both and the fix, and
/// nothing is recorded; with the home moved out the same run succeeds.
#[test]
fn a_home_inside_the_agents_directory_is_refused_before_anything_starts() {
    if !crate::support::namespace_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let agent = dir.path().join("agent");
    std::fs::create_dir(&agent).unwrap();
    let m = manifest(&agent, "echo the agent ran; ls -a", 30);
    let inside = agent.join(".airlock");
    let args = ["run", "--backend", "namespace", "-f", m.to_str().unwrap()];
    let out = airlock(&inside, &args);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "nothing was started: {err}");
    assert!(
        err.contains("contains Airlock's home") && err.contains("AIRLOCK_HOME"),
        "both and the fix are named: {err}"
    );
    assert!(!err.contains("the agent ran"), "the agent never ran: {err}");
    let listed = airlock(&inside, &["runs", "list", "--json"]);
    assert!(listed.status.success(), "{}", text(&listed.stderr));
    let runs: Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(
        runs["runs"].as_array().map(Vec::len),
        Some(0),
        "a refused run is not recorded: {}",
        text(&listed.stdout)
    );
    let beside = dir.path().join("home");
    let out = airlock(&beside, &args);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("the agent ran"), "{err}");
}
