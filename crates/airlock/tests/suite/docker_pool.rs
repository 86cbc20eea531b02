//! The docker backend's warm pool (`DOCKER_WARM_POOL`), driven through
//! `airlock serve`: a pooled pair holds nothing of any run before its
//! claim, a claimed pair serves exactly one run and goes with it, the pool
//! stays within its size, and after a SIGKILL of the platform the next
//! boot leaves no pooled container, nor a container of a run whose end
//! was recorded before the removal of its containers was done.
//!
//! Needs a Docker daemon: under `CI` a missing one fails loudly, elsewhere
//! the tests print SKIPPED.

use std::path::Path;
use std::time::Duration;

use airlock_platform::orchestrator::REMOVAL_WITHIN;

use serde_json::{Value, json};

use crate::support::serve::{Server, agent_body, holds_within, pooled_server, run_to_end};
use crate::support::{docker, docker_available, docker_inspect, docker_leftovers};

/// The pairs of the platform whose PID is `pid`: (pair id, idle).
fn pairs_of(pid: u32) -> Vec<(String, bool)> {
    let out = docker(&[
        "ps",
        "-a",
        "--filter",
        "label=airlock.pool=true",
        "--filter",
        "label=airlock.role=agent",
        "--format",
        "{{.Label \"airlock.run\"}} {{.Names}} {{.Label \"airlock.owner\"}}",
    ]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut it = l.split(' ');
            let (pair, name, owner) = (it.next()?, it.next()?, it.next()?);
            (owner.split(':').nth(1) == Some(&pid.to_string())).then(|| {
                (
                    pair.to_owned(),
                    name.starts_with(&format!("airlock-{pair}-")),
                )
            })
        })
        .collect()
}

/// The idle pairs of `s`, once there are `n` (never more: the pool's
/// bound), within two minutes.
fn wait_idle(s: &Server, n: usize) -> Vec<String> {
    let mut idle = vec![];
    for _ in 0..1200 {
        idle = pairs_of(s.child.id())
            .into_iter()
            .filter_map(|(p, idle)| idle.then_some(p))
            .collect();
        assert!(
            idle.len() <= n,
            "more idle pairs than the pool's size: {idle:?}"
        );
        if idle.len() == n {
            return idle;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("the pool never filled ({idle:?}):\n{}", s.log_text());
}

/// Asserts that pair `pair` holds nothing of any run: neither of its
/// containers names, in its configuration, a run or anything a run
/// brought (`marks`), and its host directories are empty.
fn holds_nothing(home: &Path, pair: &str, marks: &[String]) {
    for role in ["agent", "sidecar"] {
        let name = airlock_sandbox::docker::container_name(pair, role);
        let v = docker_inspect("container", &name).expect("the pooled container");
        let text = v.to_string();
        for m in marks {
            assert!(!text.contains(m.as_str()), "{name} holds {m}: {text}");
        }
        assert!(!text.contains("run_"), "{name} names a run: {text}");
        let env = v["Config"]["Env"].to_string();
        assert!(
            !env.contains("TOKEN") && !env.contains("SECRET"),
            "{name}: {env}"
        );
    }
    let dirs: Vec<_> = std::fs::read_dir(home.join("pool"))
        .unwrap()
        .flatten()
        .map(|owner| owner.path().join(pair))
        .filter(|d| d.exists())
        .collect();
    let [dir] = dirs.as_slice() else {
        panic!("one directory of pair {pair}: {dirs:?}");
    };
    let view: Vec<_> = std::fs::read_dir(dir.join("view")).unwrap().collect();
    assert!(view.is_empty(), "the view of {pair} holds {view:?}");
    let run: Vec<String> = std::fs::read_dir(dir.join("run"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    // The platform socket's mount point, the agent's sockets' directory
    // (empty) and its resolver file, and nothing of a run.
    assert!(
        run.iter()
            .all(|f| ["platform.sock", "agent", "agent.resolv.conf"].contains(&f.as_str())),
        "the run directory of {pair} holds {run:?}"
    );
    let sockets: Vec<_> = std::fs::read_dir(dir.join("run/agent")).unwrap().collect();
    assert!(
        sockets.is_empty(),
        "the sockets' directory of {pair} holds {sockets:?}"
    );
}

/// Whether every container and network labelled with one of `runs` (run
/// or pair ids) is gone within `bound`.
fn removed_within(runs: &[&str], bound: Duration) -> bool {
    holds_within(bound, || {
        runs.iter().all(|r| docker_leftovers(r).is_empty())
    })
}

/// Runs `agent` with `prompt` to its success: its id, and the uid its
/// agent printed.
fn run_once(s: &Server, key: &str, agent: &str, prompt: &str) -> (String, u32) {
    let (id, lines) = run_to_end(s, key, agent, prompt, 120);
    let uid = lines
        .iter()
        .find_map(|l| l.strip_prefix("uid "))
        .and_then(|u| u.trim().parse().ok())
        .unwrap_or_else(|| panic!("no uid line: {lines:?}"));
    (id, uid)
}

/// `airlock serve` with a pool of `size`, and the agent `pooled` running
/// `script`.
fn pooled(size: usize, script: &str) -> (tempfile::TempDir, Vec<(String, String)>, Server, String) {
    let agents = [agent_body("pooled", script, 60)];
    pooled_server("docker", ("DOCKER_WARM_POOL", size), &agents)
}

const AGENT: &str = "import os\nprint('uid', os.getuid(), flush=True)\n";

#[test]
fn a_pooled_pair_holds_nothing_of_a_run_and_serves_exactly_one() {
    if !docker_available() {
        return;
    }
    let marker = format!("pooled-file-marker-{}", std::process::id());
    let script = format!("{AGENT}MARK = '{marker}'\n");
    let (home, _env, mut s, key) = pooled(2, &script);
    let mut marks = vec![marker.clone()];
    // The first run starts cold: the pool learns what its runs need.
    let prompt = |n: usize| format!("pooled-prompt-{n}-{}", std::process::id());
    let (first, _) = run_once(&s, &key, "pooled", &prompt(1));
    marks.extend([first, prompt(1)]);
    let idle = wait_idle(&s, 2);
    for p in &idle {
        holds_nothing(home.path(), p, &marks);
    }
    let mut served = vec![];
    for n in 2..=4 {
        let before = wait_idle(&s, 2);
        let (run, uid) = run_once(&s, &key, "pooled", &prompt(n));
        // Served by one of the idle pairs (each has its own uid)…
        let by: Vec<&String> = before
            .iter()
            .filter(|p| airlock_sandbox::docker::agent_ids(p).uid == uid)
            .collect();
        let [pair] = by.as_slice() else {
            panic!("run {run} (uid {uid}) was served by none of {before:?}");
        };
        // …which goes with it (removed once its end is recorded, within
        // the removal's bound): a pair serves one run.
        assert!(
            removed_within(&[pair.as_str(), run.as_str()], REMOVAL_WITHIN),
            "pair {pair} of run {run} outlived it: {:?} {:?}",
            docker_leftovers(pair),
            docker_leftovers(&run)
        );
        assert!(!served.contains(*pair), "{pair} served twice");
        served.push((*pair).clone());
        marks.extend([run, prompt(n)]);
        // The pairs waiting now hold nothing of the runs before them.
        for p in wait_idle(&s, 2) {
            holds_nothing(home.path(), &p, &marks);
        }
    }
    // Stopped as an operator stops it: its idle pairs go with it.
    let pid = s.child.id();
    assert!(s.terminate().success());
    assert!(
        pairs_of(pid).is_empty(),
        "pairs outlived their platform: {:?}",
        pairs_of(pid)
    );
}

#[test]
fn after_a_sigkill_the_next_boot_leaves_no_pooled_container() {
    if !docker_available() {
        return;
    }
    let (home, env, mut s, key) = pooled(1, AGENT);
    run_once(&s, &key, "pooled", "learn");
    let [pair] = wait_idle(&s, 1).try_into().unwrap();
    // `airlock doctor` shows it.
    let doctor = crate::support::serve::command(&env)
        .args(["doctor", "--backend", "docker", "--json"])
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&doctor.stdout).unwrap();
    let line = report["docker"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["feature"] == "warm pool")
        .unwrap_or_else(|| panic!("no warm pool line: {report}"))
        .clone();
    assert!(line.to_string().contains("1 idle pair(s)"), "{line}");
    s.kill();
    assert_eq!(
        docker_leftovers(&pair).len(),
        2,
        "the killed platform's pair (two containers, no network) outlives it until a boot"
    );
    let mut env = env;
    env.retain(|(k, _)| k != "DOCKER_WARM_POOL");
    let _next = Server::start(&env, "docker", home.path().join("serve2.log"));
    assert!(
        docker_leftovers(&pair).is_empty(),
        "left after the next boot: {:?}",
        docker_leftovers(&pair)
    );
}

/// A run's end is recorded before its containers are removed; a platform
/// that dies in between (it aborts the moment the end is stored) leaves
/// them, and the next boot takes them, the run's end and result kept.
#[test]
fn a_platform_killed_between_a_runs_end_and_its_removal_leaves_nothing_after_the_next_boot() {
    if !docker_available() {
        return;
    }
    let (home, env, mut s, key) = pooled(0, AGENT);
    drop(s);
    let mut dying = env.clone();
    dying.push(("AIRLOCK_TEST_FAIL_POINT".into(), "after-run-end".into()));
    s = Server::start(&dying, "docker", home.path().join("serve1.log"));
    let (st, v) = s.call(
        "POST",
        "/v1/runs",
        Some(&key),
        Some(&json!({"agent": "pooled", "prompt": "die after the end"})),
    );
    assert_eq!(st, 202, "{v}");
    let run = v["id"].as_str().unwrap().to_owned();
    let died = s.exit_within(120);
    assert!(
        !died.success(),
        "the platform aborted at its fail point: {died}"
    );
    assert!(
        !docker_leftovers(&run).is_empty(),
        "the platform died before its run's containers were removed"
    );
    let next = Server::start(&env, "docker", home.path().join("serve2.log"));
    assert!(
        docker_leftovers(&run).is_empty(),
        "left after the next boot: {:?}",
        docker_leftovers(&run)
    );
    let (_, ended) = next.call("GET", &format!("/v1/runs/{run}"), Some(&key), None);
    assert_eq!(ended["status"], "succeeded", "{ended}");
    assert!(ended["ended_at"].is_number(), "{ended}");
    let logs = next
        .call("GET", &format!("/v1/runs/{run}/logs"), Some(&key), None)
        .1;
    assert!(
        logs.to_string().contains("uid "),
        "its output is kept: {logs}"
    );
}
