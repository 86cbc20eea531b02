//! Issue 50.4 in real runs (namespace backend): the operator's model key
//! (`SYSTEM_PROVIDER_KEYS`) pays for a run whose manifest names no model
//! connection, and the agent cannot read it — not in its environment, not
//! in any process's it can see, not in the relay's answers when the
//! provider reflects it back; a run with no key anywhere is refused before
//! it starts, typed.
//!
//! Network rule: the only peer is this test's own fake model provider on
//! loopback (reached by the namespace backend's host sidecar).
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use crate::sidecar_llm::fake_provider;
use crate::support::{RealRun, namespace_available};

const SYSTEM_KEY: &str = "sk-live-operator-key-c0ffee42";

/// Calls the relay with the model that reflects the key, then looks for
/// the key everywhere it can: its environment, every readable
/// `/proc/*/environ`, the answer. Writes what it saw as its result.
const AGENT: &str = r#"
import glob, json, os, urllib.request
base = os.environ.get("OPENAI_BASE_URL", "")
req = urllib.request.Request(
    base.rstrip("/") + "/chat/completions",
    data=json.dumps({"model": "fake-reflect", "messages": [{"role": "user", "content": "hi"}]}).encode(),
    headers={"content-type": "application/json", "authorization": "Bearer " + os.environ.get("OPENAI_API_KEY", "")},
)
with urllib.request.urlopen(req, timeout=30) as r:
    answer = {"status": r.status, "headers": dict(r.headers), "body": r.read().decode("utf-8", "replace")}
environs = []
for path in glob.glob("/proc/*/environ"):
    try:
        environs.append(open(path, "rb").read().decode("utf-8", "replace"))
    except OSError:
        pass
json.dump({"env": dict(os.environ), "environs": environs, "answer": answer},
          open(os.environ["AIRLOCK_RESULT_FILE"], "w"))
"#;

fn manifest(port: u16) -> String {
    format!(
        "[agent]\nname = \"system-key\"\ncommand = [\"/usr/bin/python3\", \"agent.py\"]\ntimeout = 120\n\n\
         [network]\negress = \"none\"\n\n\
         [model]\nprovider = \"openai\"\nbase_url = \"http://127.0.0.1:{port}/v1\"\n"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn the_operator_key_pays_and_the_agent_cannot_read_it() {
    if !namespace_available() {
        return;
    }
    let fake = fake_provider::start(std::time::Duration::ZERO).await;
    let run = RealRun::with_manifest(AGENT, &manifest(fake.port()))
        .env("EGRESS_ALLOW_INTERNAL_HOSTS", "127.0.0.1")
        .env(
            "SYSTEM_PROVIDER_KEYS",
            &serde_json::json!({ "openai": SYSTEM_KEY }).to_string(),
        );
    let (out, report) = tokio::task::spawn_blocking(move || run.run("namespace"))
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(report["status"], "succeeded", "{report}\n{stderr}");
    assert_eq!(
        fake.keys(),
        [SYSTEM_KEY],
        "the operator's key reached the provider"
    );
    let seen = report["result"].to_string();
    assert!(
        seen.contains("[REDACTED]"),
        "the provider reflected it: {seen}"
    );
    for reflection in fake_provider::reflections(SYSTEM_KEY) {
        assert!(!seen.contains(&reflection), "the agent saw the key: {seen}");
    }
    assert!(!stderr.contains(SYSTEM_KEY), "the key was logged");
}

#[test]
fn a_run_whose_model_has_no_key_anywhere_is_refused_before_it_starts() {
    if !namespace_available() {
        return;
    }
    let run = RealRun::with_manifest(
        "open('/tmp/started', 'w')\n",
        &manifest(9), // never reached
    );
    let (out, report) = run.run("namespace");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{report}");
    assert!(
        stderr.contains("model: no key for the provider openai")
            && stderr.contains("model.openai")
            && stderr.contains("SYSTEM_PROVIDER_KEYS"),
        "{stderr}"
    );
}
