//! What a run records, attacked from inside real runs (namespace and docker
//! backends): floods of output and of refused requests, and model calls
//! made while the agent floods its stdout. The agent's end, its result, its
//! usage and its egress records are never shed; log lines may be, and are
//! then counted; a run's store footprint is bounded by its caps plus a
//! constant; the operator's log is bounded too.
//!
//! Network rule: the only peer is this test's own fake model provider on
//! loopback (reached by the namespace backend's host sidecar); refused
//! requests are refused by the sidecar before any connection is made.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use std::io::Write as _;
use std::process::Stdio;

use airlock_platform_api::wire::RUN_LOG_MAX_BYTES;
use airlock_test_support::store_bytes;
use serde_json::Value;

use crate::sidecar_llm::fake_provider;
use crate::support::{self, RealRun, docker_available, namespace_available, python_has};

/// Lines the flooding agent prints before it writes its result.
const FLOOD_LINES: u64 = 300_000;

/// Prints `FLOOD_LINES` lines as fast as Python can, then writes its result
/// and exits 0.
const FLOOD_AGENT: &str = r#"
import json, os, sys
w = sys.stdout.write
for i in range(300000):
    w("flood line %06d\n" % i)
sys.stdout.flush()
json.dump({"kept": True}, open(os.environ["AIRLOCK_RESULT_FILE"], "w"))
"#;

/// A trivial run in `run`'s home first (the store exists, its schema and
/// first pages too); returns the store's size after it.
fn warm_up(run: &RealRun, backend: &str) -> u64 {
    let dir = run.home.path().join("warm");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::write(dir.join("agent.py"), "print('warm')\n").unwrap();
    let manifest = dir.join("airlock.toml");
    std::fs::write(
        &manifest,
        "[agent]\nname = \"warm\"\ncommand = [\"/usr/bin/python3\", \"agent.py\"]\ntimeout = 60\n\n[network]\negress = \"none\"\n",
    )
    .unwrap();
    let out = run.airlock(&[
        "run",
        "--json",
        "--backend",
        backend,
        "-f",
        manifest.to_str().unwrap(),
    ]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert_eq!(report["status"], "succeeded", "{report}");
    store_bytes(run.home.path())
}

/// The log lines of `stream` that `airlock runs logs RUN --json` prints.
fn kept_lines(run: &RealRun, run_id: &str, stream: &str) -> u64 {
    let out = run.airlock(&["runs", "logs", run_id, "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["stream"] == stream)
        .count() as u64
}

fn a_flood_keeps_the_result_and_the_status_and_counts_what_was_shed(backend: &str) {
    let run = RealRun::python(FLOOD_AGENT, 300);
    let (out, report) = run.run(backend);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let tail = &stderr[stderr.len().saturating_sub(3000)..];
    assert_eq!(report["status"], "succeeded", "{report}\n{tail}");
    assert_eq!(report["exit_code"], 0);
    assert_eq!(report["result"], serde_json::json!({"kept": true}));
    let run_id = report["id"].as_str().unwrap();
    let shed = report["logs_shed"]["lines"].as_u64().unwrap();
    let kept = kept_lines(&run, run_id, "stdout");
    // Every line is either kept or counted: none silently lost.
    assert_eq!(
        kept + shed,
        FLOOD_LINES,
        "kept {kept} + shed {shed}: {}",
        report["logs_shed"]
    );
    // The flood is past the run's log cap: the rest was counted.
    assert!(shed > 0, "{report}");
    assert!(kept > 1000, "the lines within the cap are kept: {kept}");
    // `runs logs` shows the count. (Whether the sidecar's cap was reached,
    // with its marker, or the runtime shed the lines first depends on the
    // host's load: both are counted.)
    let logs = run.airlock(&["runs", "logs", run_id]);
    let said = String::from_utf8_lossy(&logs.stderr);
    assert!(said.contains("were shed: counted, not kept"), "{said}");
}

#[test]
fn a_flood_of_output_keeps_the_result_and_the_status_on_namespace() {
    if !namespace_available() {
        return;
    }
    a_flood_keeps_the_result_and_the_status_and_counts_what_was_shed("namespace");
}

#[test]
fn a_flood_of_output_keeps_the_result_and_the_status_on_docker() {
    if !docker_available() {
        return;
    }
    a_flood_keeps_the_result_and_the_status_and_counts_what_was_shed("docker");
}

/// 40 MiB of output grows the store by the run's log cap and a constant,
/// not by the output (it grew by 41–90 MiB).
fn forty_mib_of_output_grows_the_store_within_its_cap(backend: &str) {
    let run = RealRun::python(
        r#"
import json, os, sys
line = "x" * 999 + "\n"
for i in range(42000):
    sys.stdout.write(line)
sys.stdout.flush()
json.dump({"done": True}, open(os.environ["AIRLOCK_RESULT_FILE"], "w"))
"#,
        300,
    );
    let before = warm_up(&run, backend);
    let (_, report) = run.run(backend);
    assert_eq!(report["status"], "succeeded", "{report}");
    assert_eq!(report["result"]["done"], true);
    let grown = store_bytes(run.home.path()).saturating_sub(before);
    let bound = 2 * RUN_LOG_MAX_BYTES + (1 << 20);
    assert!(
        grown <= bound,
        "40 MiB of output grew the store by {grown} bytes (bound {bound})"
    );
    assert!(report["logs_shed"]["lines"].as_u64().unwrap() > 0);
}

#[test]
fn forty_mib_of_output_grows_the_store_within_its_cap_on_namespace() {
    if !namespace_available() {
        return;
    }
    forty_mib_of_output_grows_the_store_within_its_cap("namespace");
}

#[test]
fn forty_mib_of_output_grows_the_store_within_its_cap_on_docker() {
    if !docker_available() {
        return;
    }
    forty_mib_of_output_grows_the_store_within_its_cap("docker");
}

/// 6,500 refused requests with 15 KB paths (through the sidecar's forward
/// proxy; the run's network is `none`): the store grows by the refusal
/// bounds and a constant (it grew by 106–191 MiB), the refusals are all
/// counted per code and host, and the operator's log stays small (it got
/// 95–176 MiB, each refusal's whole path).
#[test]
fn refused_floods_are_counted_not_stored_or_logged_one_by_one() {
    if !namespace_available() {
        return;
    }
    let agent = r#"
import json, os, socket, urllib.parse
proxy = urllib.parse.urlsplit(os.environ["HTTP_PROXY"])
path = "/" + "p" * 15000
refused = 0
for i in range(6500):
    s = socket.create_connection((proxy.hostname, proxy.port))
    s.sendall(("GET http://refused.test%s HTTP/1.1\r\nHost: refused.test\r\nConnection: close\r\n\r\n" % path).encode())
    answer = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        answer += b
    s.close()
    if answer.startswith(b"HTTP/1.1 403") or answer.startswith(b"HTTP/1.0 403"):
        refused += 1
json.dump({"refused": refused}, open(os.environ["AIRLOCK_RESULT_FILE"], "w"))
"#;
    let run = RealRun::python(agent, 600);
    let before = warm_up(&run, "namespace");
    let (out, report) = run.run("namespace");
    assert_eq!(report["status"], "succeeded", "{report}");
    assert_eq!(report["result"]["refused"], 6500, "{}", report["result"]);
    let grown = store_bytes(run.home.path()).saturating_sub(before);
    assert!(grown <= 2 << 20, "the store grew by {grown} bytes");
    // Every refusal is in the report's counts: samples plus counted.
    let summary = report["egress"]["summary"].as_array().unwrap();
    let refused: u64 = summary
        .iter()
        .filter(|c| c["decision"] == "refused")
        .map(|c| c["count"].as_u64().unwrap())
        .sum();
    assert_eq!(refused, 6500, "{summary:?}");
    let samples = report["egress"]["entries"].as_array().unwrap();
    assert!(samples.len() <= 200, "{}", samples.len());
    assert!(
        samples
            .iter()
            .all(|e| e["url"].as_str().unwrap().len() <= 1024),
        "a record keeps at most 1 KiB of its URL"
    );
    let counted = report["egress"]["refusals_counted"].as_array().unwrap();
    assert!(!counted.is_empty(), "{report}");
    assert!(
        out.stderr.len() < 512 * 1024,
        "the operator's log got {} bytes",
        out.stderr.len()
    );
}

/// Forty model calls through the official OpenAI SDK, made while another
/// thread floods stdout: the run records what the provider billed, call for
/// call (it recorded 90 of 600 tokens, `unmetered_calls: 0`).
#[tokio::test(flavor = "multi_thread")]
async fn model_calls_made_during_a_flood_are_all_metered() {
    if !python_has(&["openai"]) || !namespace_available() {
        return;
    }
    let fake = fake_provider::start(std::time::Duration::ZERO).await;
    let agent = r#"
import json, os, sys, threading
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "vendor"))
from openai import OpenAI
done = threading.Event()
def flood():
    i = 0
    while not done.is_set():
        sys.stdout.write("flood %d\n" % i)
        i += 1
t = threading.Thread(target=flood)
t.start()
client = OpenAI()
seen = 0
for _ in range(40):
    r = client.chat.completions.create(model="gpt-fake", messages=[{"role": "user", "content": "hi"}])
    seen += r.usage.prompt_tokens + r.usage.completion_tokens
done.set()
t.join()
json.dump({"tokens": seen}, open(os.environ["AIRLOCK_RESULT_FILE"], "w"))
"#;
    let key = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, [0x3cu8; 32]);
    let run = RealRun::with_manifest(
        agent,
        &format!(
            "[agent]\nname = \"metered\"\ncommand = [\"/usr/bin/python3\", \"agent.py\"]\ntimeout = 300\n\n\
             [network]\negress = \"none\"\n\n\
             [model]\nprovider = \"openai\"\nbase_url = \"http://127.0.0.1:{}/v1\"\nconnection = \"llm\"\n",
            fake.port()
        ),
    )
    .env("EGRESS_ALLOW_INTERNAL_HOSTS", "127.0.0.1")
    .env("CONNECTION_ENCRYPTION_KEY", &key);
    run.vendor("openai");
    add_api_key_connection(&run, "llm", "sk-fake-metering", &key);
    let run = std::sync::Arc::new(run);
    let r = run.clone();
    let (out, report) = tokio::task::spawn_blocking(move || r.run("namespace"))
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let tail = &stderr[stderr.len().saturating_sub(3000)..];
    assert_eq!(report["status"], "succeeded", "{report}\n{tail}");
    let calls = fake
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/chat/completions"))
        .count() as u64;
    assert_eq!(calls, 40);
    let (i, o) = fake_provider::CHAT_USAGE;
    let billed = calls * (i + o);
    assert_eq!(report["result"]["tokens"], billed, "what the agent saw");
    let recorded = report["cost"]["tokens_in"].as_u64().unwrap()
        + report["cost"]["tokens_out"].as_u64().unwrap();
    assert_eq!(recorded, billed, "{}", report["cost"]);
    assert_eq!(report["unmetered_model_calls"], 0);
    let llm = report["egress"]["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["source"] == "llm")
        .count() as u64;
    assert_eq!(llm, calls, "one egress record per call");
}

/// `airlock connections add NAME --integration NAME --type api_key` with the
/// field `key`, on the run's home.
fn add_api_key_connection(run: &RealRun, name: &str, api_key: &str, key: &str) {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_airlock"))
        .args([
            "connections",
            "add",
            name,
            "--integration",
            name,
            "--type",
            "api_key",
        ])
        .env("AIRLOCK_HOME", run.home.path())
        .env("CONNECTION_ENCRYPTION_KEY", key)
        .env_remove("DATABASE_URL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(serde_json::json!({"key": api_key}).to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `airlock ARGS…` on `run`'s home with the store at `url`.
fn airlock_on(run: &RealRun, url: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_airlock"))
        .args(args)
        .env("AIRLOCK_HOME", run.home.path())
        .env("DATABASE_URL", url)
        .output()
        .unwrap()
}

/// The store (PostgreSQL, the test's own cluster) stops while a run is live;
/// the agent then logs, writes its result and exits 0. Its end and events
/// stay on disk, bounded, and once the store is back (the next boot's
/// reclaim) the run is stored as it ended: succeeded, its result and log
/// lines kept — not failed with "ended without reporting the agent's end".
#[test]
fn a_run_that_ends_while_the_store_is_down_is_stored_as_it_ended() {
    if !namespace_available() {
        return;
    }
    let Some(pg) = crate::serve_fleet::OwnPostgres::init() else {
        return;
    };
    pg.start();
    let agent = r#"
import json, os, sys, time
here = os.path.dirname(os.path.abspath(__file__))
print("ready", flush=True)
while not os.path.exists(os.path.join(here, "go")):
    time.sleep(0.05)
for i in range(500):
    print("after the outage %d" % i)
sys.stdout.flush()
json.dump({"kept": True}, open(os.environ["AIRLOCK_RESULT_FILE"], "w"))
"#;
    let run = RealRun::python(agent, 120).env("DATABASE_URL", &pg.url());
    let (child, _) = support::start_until(&run, "namespace", "ready");
    let ids = run.run_dirs();
    assert_eq!(ids.len(), 1, "{ids:?}");
    let run_id = ids[0].clone();
    pg.stop();
    std::fs::write(run.agent_dir.join("go"), b"").unwrap();
    let _ = support::finish_run(child);
    // Kept on disk while the store is down: the journal and the end.
    let dir = run.home.path().join("runs").join(&run_id);
    let end: Value =
        serde_json::from_slice(&std::fs::read(dir.join("end.json")).expect("the end on disk"))
            .unwrap();
    assert_eq!(end["status"], "succeeded", "{end}");
    pg.start();
    // The next start's reclaim stores it.
    let warm = warm_up_on(&run, &pg.url());
    assert!(
        String::from_utf8_lossy(&warm.stderr).contains(&run_id),
        "reclaimed at the next start: {}",
        String::from_utf8_lossy(&warm.stderr)
    );
    assert!(!dir.exists(), "the run's directory goes once stored");
    let shown = airlock_on(&run, &pg.url(), &["runs", "show", &run_id, "--json"]);
    let report: Value = serde_json::from_slice(&shown.stdout).unwrap_or(Value::Null);
    assert_eq!(report["status"], "succeeded", "{report}");
    assert_eq!(report["exit_code"], 0);
    assert_eq!(report["error"], Value::Null);
    assert_eq!(report["result"], serde_json::json!({"kept": true}));
    let logs = airlock_on(&run, &pg.url(), &["runs", "logs", &run_id]);
    let text = String::from_utf8_lossy(&logs.stdout);
    assert!(text.contains("after the outage 499"), "{text}");
    assert_eq!(
        text.matches("after the outage").count(),
        500,
        "each line once"
    );
}

/// [`warm_up`] with the store at `url`: a trivial run whose start reclaims.
fn warm_up_on(run: &RealRun, url: &str) -> std::process::Output {
    let dir = run.home.path().join("warm");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::write(dir.join("agent.py"), "print('warm')\n").unwrap();
    let manifest = dir.join("airlock.toml");
    std::fs::write(
        &manifest,
        "[agent]\nname = \"warm\"\ncommand = [\"/usr/bin/python3\", \"agent.py\"]\ntimeout = 60\n\n[network]\negress = \"none\"\n",
    )
    .unwrap();
    airlock_on(
        run,
        url,
        &[
            "run",
            "--json",
            "--backend",
            "namespace",
            "-f",
            manifest.to_str().unwrap(),
        ],
    )
}
