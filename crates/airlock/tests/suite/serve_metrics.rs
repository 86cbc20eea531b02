//! `airlock serve`'s `/metrics` (issue 49): on `METRICS_LISTEN` only,
//! behind `METRICS_TOKEN`; parsed by Prometheus's own Python parser, its
//! counts match the runs the test made (succeeded, failed, refused
//! `api_call`s, a metered model call), and a canary the runs carried (in
//! their prompt, a target's query, the model key) appears nowhere in it.

use std::process::Command;
use std::time::{Duration, Instant};

use airlock_test_support::fake_provider;
use serde_json::{Value, json};

use crate::support::python_has;
use crate::support::serve::{Server, base_env, create_org, wait_for};

const CANARY: &str = "CANARY-metrics-7f3a9c";
const TOKEN: &str = "metrics-token-0123456789";

/// One agent, whose prompt's words say what it does: `ok`, `fail`,
/// `refuse` (two `api_call`s the guard refuses), `call` (one credentialed
/// `api_call` to the fake provider's model list), `model` (one model call);
/// its last word is put in the targets' query.
pub(crate) const AGENT: &str = r#"
import json, os, sys, urllib.request
prompt = open(os.environ['AIRLOCK_PROMPT_FILE']).read()
print('prompt: ' + prompt, flush=True)
words = prompt.split()
meta = {'io.modelcontextprotocol/protocolVersion': '2026-07-28', 'io.modelcontextprotocol/clientCapabilities': {}}
def post(url, body, headers):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method='POST')
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read().decode()
if 'fail' in words:
    sys.exit(3)
if 'refuse' in words:
    for i in range(2):
        call = {'jsonrpc': '2.0', 'id': i + 1, 'method': 'tools/call', 'params': {
            'name': 'open__api_call', 'arguments': {'target': 'https://elsewhere.example/x?key=' + words[-1]}, '_meta': meta}}
        out = post(os.environ['AIRLOCK_MCP_URL'], call, {
            'content-type': 'application/json', 'accept': 'application/json, text/event-stream',
            'mcp-protocol-version': '2026-07-28', 'mcp-method': 'tools/call', 'mcp-name': 'open__api_call'})
        assert 'not_authorized' in out, out
if 'call' in words:
    call = {'jsonrpc': '2.0', 'id': 9, 'method': 'tools/call', 'params': {
        'name': 'models__api_call', 'arguments': {'target': os.environ['FAKE_MODELS'] + '?key=' + words[-1]}, '_meta': meta}}
    out = post(os.environ['AIRLOCK_MCP_URL'], call, {
        'content-type': 'application/json', 'accept': 'application/json, text/event-stream',
        'mcp-protocol-version': '2026-07-28', 'mcp-method': 'tools/call', 'mcp-name': 'models__api_call'})
    assert '"status":200' in out.replace(' ', ''), out
if 'model' in words:
    out = post(os.environ['OPENAI_BASE_URL'] + '/chat/completions',
        {'model': 'gpt-fake', 'messages': [{'role': 'user', 'content': prompt}]},
        {'content-type': 'application/json', 'authorization': 'Bearer ' + os.environ.get('OPENAI_API_KEY', '')})
    assert 'usage' in out, out
"#;

/// Registers the agent `probe` ([`AGENT`]) in the organization of `key`,
/// its model served by the fake provider on `port`, whose key (stored as
/// the connection `llm`) holds `canary`.
pub(crate) fn register_probe(s: &Server, key: &str, port: u16, canary: &str) {
    let k = Some(key);
    let (st, v) = s.call(
        "POST",
        "/v1/connections",
        k,
        Some(&json!({"name": "llm", "integration": "llm", "type": "api_key", "fields": {"key": format!("sk-{canary}")}})),
    );
    assert_eq!(st, 201, "{v}");
    let agent = AGENT.replace(
        "os.environ['FAKE_MODELS']",
        &format!("'http://127.0.0.1:{port}/v1/models'"),
    );
    let manifest = format!(
        "[agent]\nname = \"probe\"\ncommand = [\"/usr/bin/python3\", \"agent.py\"]\ntimeout = 60\n\n\
         [network]\negress = \"none\"\n\n\
         [model]\nprovider = \"openai\"\nbase_url = \"http://127.0.0.1:{port}/v1\"\nconnection = \"llm\"\n\n\
         [[integrations]]\nnamespace = \"open\"\nauthorized_uris = [\"https://api.example.test/**\"]\n\n\
         [[integrations]]\nnamespace = \"models\"\nconnection = \"llm\"\n\
         authorized_uris = [\"http://127.0.0.1:{port}/**\"]\n\
         delivery = {{ header = \"Authorization\", prefix = \"Bearer \", field = \"key\" }}\n"
    );
    let (st, v) = s.call(
        "POST",
        "/v1/agents",
        k,
        Some(&json!({"manifest": manifest, "files": {"agent.py": agent}})),
    );
    assert_eq!(st, 201, "{v}");
}

/// Prometheus's parser, run on `text`: every sample as
/// `{name, labels, value}`.
fn parse(text: &str) -> Vec<Value> {
    let code = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
out = []
for fam in text_string_to_metric_families(open(sys.argv[1]).read()):
    for s in fam.samples:
        out.append({"name": s.name, "labels": s.labels, "value": s.value})
print(json.dumps(out))
"#;
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), text).unwrap();
    let out = Command::new("python3")
        .arg("-c")
        .arg(code)
        .arg(file.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the parser refused the text: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<Vec<Value>>(&out.stdout).unwrap()
}

/// The sum of the samples named `name` whose labels include `labels`.
fn sum(samples: &[Value], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s["name"] == name)
        .filter(|s| labels.iter().all(|(k, v)| s["labels"][*k] == *v))
        .map(|s| s["value"].as_f64().unwrap())
        .sum()
}

/// `GET /metrics` on `addr` with `token`: status and body.
fn scrape(addr: std::net::SocketAddr, token: Option<&str>) -> (u16, String) {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("authorization", a.as_str())).collect();
    let (st, _, body) = crate::support::http(addr, "GET", "/metrics", &headers, b"");
    (st, String::from_utf8_lossy(&body).into_owned())
}

#[test]
fn metrics_count_the_runs_made_and_carry_no_secret() {
    if !crate::support::namespace_available() || !python_has(&["prometheus_client"]) {
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let fake = rt.block_on(fake_provider::start(Duration::ZERO));
    let home = tempfile::Builder::new()
        .prefix("airlock-metrics-")
        .tempdir()
        .unwrap();
    let mut env = base_env(home.path(), None);
    env.push(("METRICS_LISTEN".into(), "127.0.0.1:0".into()));
    env.push(("METRICS_TOKEN".into(), TOKEN.into()));
    let s = Server::start(&env, "namespace", home.path().join("serve.log"));
    let metrics_addr: std::net::SocketAddr = s
        .log_text()
        .lines()
        .find_map(|l| l.split("metrics on http://").nth(1))
        .and_then(|r| r.strip_suffix("/metrics"))
        .and_then(|a| a.parse().ok())
        .expect("the metrics address in the log");
    assert_ne!(metrics_addr, s.addr, "a listener of its own");
    let (_, key) = create_org(&env, "Acme", &[]);
    let k = Some(key.as_str());

    // Not on the API's listener, not without the token, not with an API key.
    assert_eq!(s.call("GET", "/metrics", k, None).0, 404);
    assert_eq!(scrape(metrics_addr, None).0, 401);
    assert_eq!(scrape(metrics_addr, Some(&key)).0, 401);

    register_probe(&s, &key, fake.port(), CANARY);

    let modes = ["ok", "ok", "fail", "refuse", "model"];
    let ids: Vec<String> = modes
        .iter()
        .map(|m| {
            let (st, v) = s.call(
                "POST",
                "/v1/runs",
                k,
                Some(&json!({"agent": "probe", "prompt": format!("{m} {CANARY}")})),
            );
            assert_eq!(st, 202, "{v}");
            v["id"].as_str().unwrap().to_owned()
        })
        .collect();
    for (id, m) in ids.iter().zip(modes) {
        let run = wait_for(&s, &format!("/v1/runs/{id}"), &key, 120, |v| {
            v["status"] != "queued" && v["status"] != "running"
        });
        let want = if m == "fail" { "failed" } else { "succeeded" };
        assert_eq!(run["status"], want, "{m}: {run}");
    }
    assert_eq!(fake.requests().len(), 1, "one model call");

    // A run's end is counted once it is recorded: the scrape waits for the
    // fifth (each scrape is an event of the server's, not a sleep).
    let deadline = Instant::now() + Duration::from_secs(30);
    let (text, samples) = loop {
        let (st, text) = scrape(metrics_addr, Some(TOKEN));
        assert_eq!(st, 200, "{text}");
        let samples = parse(&text);
        if sum(&samples, "airlock_runs_ended_total", &[]) >= 5.0 || Instant::now() > deadline {
            break (text, samples);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let ns = ("backend", "namespace");
    let count = |name: &str, labels: &[(&str, &str)]| sum(&samples, name, labels);
    assert_eq!(
        count("airlock_runs_ended_total", &[("status", "succeeded"), ns]),
        4.0,
        "{text}"
    );
    assert_eq!(
        count("airlock_runs_ended_total", &[("status", "failed"), ns]),
        1.0
    );
    assert_eq!(count("airlock_runs_ended_total", &[]), 5.0);
    assert_eq!(count("airlock_run_duration_seconds_count", &[ns]), 5.0);
    assert_eq!(count("airlock_sidecar_start_seconds_count", &[ns]), 5.0);
    assert_eq!(count("airlock_sandbox_start_seconds_count", &[ns]), 5.0);
    assert_eq!(count("airlock_runs_running", &[ns]), 0.0);
    assert_eq!(count("airlock_queue_depth", &[]), 0.0);
    let refused = [("source", "api_call"), ("decision", "refused")];
    assert_eq!(count("airlock_egress_requests_total", &refused), 2.0);
    assert_eq!(
        count(
            "airlock_egress_refusals_total",
            &[("code", "not_authorized")]
        ),
        2.0
    );
    let llm = [("source", "llm"), ("decision", "allowed")];
    assert_eq!(count("airlock_egress_requests_total", &llm), 1.0);
    let openai = ("provider", "openai");
    assert_eq!(count("airlock_model_calls_total", &[openai]), 1.0);
    let (i, o) = fake_provider::CHAT_USAGE;
    assert_eq!(
        count("airlock_model_tokens_total", &[openai, ("kind", "input")]),
        i as f64
    );
    assert_eq!(
        count("airlock_model_tokens_total", &[openai, ("kind", "output")]),
        o as f64
    );

    // Nothing of the runs' secrets, prompts, ids or organization.
    for secret in [CANARY, &key, TOKEN, "elsewhere.example"]
        .into_iter()
        .chain(ids.iter().map(String::as_str))
    {
        assert!(!text.contains(secret), "{secret} in /metrics:\n{text}");
    }
}
