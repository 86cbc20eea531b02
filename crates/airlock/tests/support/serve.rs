//! `airlock serve` processes for the tests: started on their own home (and,
//! for replicas, a shared PostgreSQL schema), reached over plain HTTP on
//! loopback; a loopback webhook receiver.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::AIRLOCK;

/// The secrets every test server shares (the CLI that makes organizations
/// must hash keys as the server does).
pub const API_AUTH_SECRET: &str = "test-api-auth-secret-0123456789";
pub const CONNECTION_KEY: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";

/// What the server and `airlock orgs` run with.
pub fn base_env(home: &Path, database_url: Option<&str>) -> Vec<(String, String)> {
    let mut env = vec![
        ("AIRLOCK_HOME".into(), home.display().to_string()),
        ("API_AUTH_SECRET".into(), API_AUTH_SECRET.into()),
        ("CONNECTION_ENCRYPTION_KEY".into(), CONNECTION_KEY.into()),
        ("EGRESS_ALLOW_INTERNAL_HOSTS".into(), "127.0.0.1".into()),
        ("AIRLOCK_LOG".into(), "info".into()),
        // The suites send many keyless requests on purpose (one test
        // checks the limit on failed authentications itself).
        ("API_AUTH_FAILURE_BURST".into(), "100000".into()),
    ];
    if let Some(u) = database_url {
        env.push(("DATABASE_URL".into(), u.into()));
    }
    env
}

/// This build's `airlock` with `env` ([`airlock_test_support::serve::command`]).
pub fn command(env: &[(String, String)]) -> Command {
    airlock_test_support::serve::command(Path::new(AIRLOCK), env)
}

/// A running `airlock serve`; SIGKILLed on drop.
pub struct Server {
    pub child: Child,
    pub addr: SocketAddr,
    pub log: PathBuf,
    pub replica: String,
}

impl Server {
    /// Starts one on `127.0.0.1:0` and waits until it is ready (`/readyz`
    /// 200).
    pub fn start(env: &[(String, String)], backend: &str, log: PathBuf) -> Server {
        let mut s = Server::spawn(env, backend, log);
        s.wait_ready(60);
        s
    }

    /// Waits until `/readyz` answers 200; panics (with the log) if the
    /// process exits first or `secs` pass.
    pub fn wait_ready(&mut self, secs: u64) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            if self.call("GET", "/readyz", None, None).0 == 200 {
                return;
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!(
                    "airlock serve exited ({st}) before it was ready:\n{}",
                    self.log_text()
                );
            }
            assert!(
                Instant::now() < deadline,
                "airlock serve was not ready within {secs} s:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts one on `127.0.0.1:0` and returns once it listens (it answers
    /// `/healthz`; it may not be ready).
    pub fn spawn(env: &[(String, String)], backend: &str, log: PathBuf) -> Server {
        let started =
            airlock_test_support::serve::spawn(Path::new(AIRLOCK), env, backend, &log, false);
        Server {
            child: started.child,
            addr: started.addr,
            log,
            replica: started.replica,
        }
    }

    /// One API call: status and JSON body (`Null` when there is none).
    pub fn call(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        body: Option<&Value>,
    ) -> (u16, Value) {
        let (status, _, bytes) = self.raw(
            method,
            path,
            key,
            body.map(|b| b.to_string()).as_deref(),
            "application/json",
        );
        let v = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()))
        };
        (status, v)
    }

    pub fn raw(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        body: Option<&str>,
        content_type: &str,
    ) -> (u16, Vec<(String, String)>, Vec<u8>) {
        let auth = key.map(|k| format!("Bearer {k}"));
        let mut headers: Vec<(&str, &str)> = vec![];
        if let Some(a) = &auth {
            headers.push(("authorization", a));
        }
        if body.is_some() {
            headers.push(("content-type", content_type));
        }
        super::http(
            self.addr,
            method,
            path,
            &headers,
            body.unwrap_or("").as_bytes(),
        )
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Its exit status, once it has exited by itself (within `secs`).
    pub fn exit_within(&mut self, secs: u64) -> std::process::ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            assert!(
                Instant::now() < deadline,
                "airlock serve did not exit within {secs} s:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM, then waits for it to exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        self.sigterm();
        self.child.wait().unwrap()
    }

    /// Sends SIGTERM (does not wait).
    pub fn sigterm(&self) {
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(i32::try_from(self.child.id()).unwrap()).unwrap(),
            rustix::process::Signal::TERM,
        );
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Stopped as an operator stops it (SIGTERM: its runs are cancelled
        // and their sandboxes and cgroups removed), so that a test ending
        // with runs still going leaves nothing on the machine; killed if it
        // has not exited within the grace period.
        if matches!(self.child.try_wait(), Ok(None)) {
            self.sigterm();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
            while matches!(self.child.try_wait(), Ok(None)) && std::time::Instant::now() < deadline
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
        self.kill();
        // A failing test shows every server's log, not only the one it was
        // talking to.
        if std::thread::panicking() {
            let text = self.log_text();
            let tail: Vec<&str> = text.lines().rev().take(80).collect();
            eprintln!(
                "--- log of airlock serve {} ({}), last lines ---\n{}",
                self.replica,
                self.log.display(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
    }
}

/// `airlock orgs create NAME …`: the org id and its first API key.
pub fn create_org(env: &[(String, String)], name: &str, extra: &[&str]) -> (String, String) {
    airlock_test_support::serve::create_org(Path::new(AIRLOCK), env, name, extra)
}

pub use airlock_test_support::serve::agent_body;

/// Polls `GET path` until `pred` holds of the JSON, for up to `secs`.
pub fn wait_for(
    s: &Server,
    path: &str,
    key: &str,
    secs: u64,
    pred: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let (st, v) = s.call("GET", path, Some(key), None);
        if st == 200 && pred(&v) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "GET {path} never reached the state waited for; last {st} {v}\nserver log:\n{}",
            s.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One request a webhook receiver got.
#[derive(Debug, Clone)]
pub struct Received {
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub at: Instant,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A loopback HTTP server that records every request and answers the
/// status `answer` gives for the n-th request (0-based).
pub struct Receiver {
    pub addr: SocketAddr,
    pub got: Arc<Mutex<Vec<Received>>>,
}

impl Receiver {
    pub fn start(answer: impl Fn(usize) -> u16 + Send + 'static) -> Receiver {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let got: Arc<Mutex<Vec<Received>>> = Arc::default();
        let sink = got.clone();
        std::thread::spawn(move || {
            for (n, conn) in l.incoming().enumerate() {
                let Ok(mut c) = conn else { continue };
                c.set_read_timeout(Some(Duration::from_secs(10))).ok();
                let mut r = BufReader::new(c.try_clone().unwrap());
                let mut headers = Vec::new();
                let mut line = String::new();
                if r.read_line(&mut line).is_err() {
                    continue;
                }
                loop {
                    line.clear();
                    if r.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    if let Some((k, v)) = line.trim_end().split_once(':') {
                        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
                    }
                }
                let len: usize = headers
                    .iter()
                    .find(|(k, _)| k == "content-length")
                    .and_then(|(_, v)| v.parse().ok())
                    .unwrap_or(0);
                let mut body = vec![0; len];
                if r.read_exact(&mut body).is_err() {
                    continue;
                }
                let status = answer(n);
                sink.lock().unwrap().push(Received {
                    headers,
                    body,
                    at: Instant::now(),
                });
                let _ = write!(
                    c,
                    "HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                );
            }
        });
        Receiver { addr, got }
    }

    pub fn received(&self) -> Vec<Received> {
        self.got.lock().unwrap().clone()
    }
}

/// Checks a delivery's `Airlock-Signature` as a receiver would: HMAC-SHA256
/// of `"<t>.<body>"` under the webhook's secret (the contract's
/// [`airlock_api::webhook::verify`]; the server's unit test checks the MAC
/// against a known answer).
pub fn signature_ok(r: &Received, secret: &str) -> bool {
    r.header(airlock_api::webhook::SIGNATURE_HEADER)
        .is_some_and(|sig| airlock_api::webhook::verify(secret.as_bytes(), sig, &r.body).is_some())
}

/// The start of a Python agent that speaks MCP to its sidecar: `mcp(method,
/// params)` (a session kept, SSE answers read), `UPSTREAM` the prompt's
/// text, the session initialized.
const MCP_AGENT_PRELUDE: &str = r#"
import json, os, urllib.request
MCP = os.environ["AIRLOCK_MCP_URL"]
UPSTREAM = open(os.environ["AIRLOCK_PROMPT_FILE"]).read().strip()
state = {"sid": None, "n": 0}

def mcp(method, params=None, notify=False):
    msg = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        msg["params"] = params
    if not notify:
        state["n"] += 1
        msg["id"] = state["n"]
    h = {"content-type": "application/json", "accept": "application/json, text/event-stream",
         "mcp-protocol-version": "2025-11-25"}
    if state["sid"]:
        h["mcp-session-id"] = state["sid"]
    req = urllib.request.Request(MCP, data=json.dumps(msg).encode(), headers=h, method="POST")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=30) as r:
        state["sid"] = r.headers.get("mcp-session-id") or state["sid"]
        body = r.read().decode()
    if notify or not body.strip():
        return None
    if body.lstrip().startswith("{"):
        return json.loads(body)
    for line in body.splitlines():
        if line.startswith("data:") and line[5:].strip():
            d = json.loads(line[5:])
            if d.get("id") == msg.get("id"):
                return d

mcp("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "airlock-test", "version": "1"}})
mcp("notifications/initialized", notify=True)
"#;

/// A Python agent: [`MCP_AGENT_PRELUDE`], then `rest`.
pub fn mcp_agent(rest: &str) -> String {
    format!("{MCP_AGENT_PRELUDE}{rest}")
}

/// What a [`Recorder`] saw of each request: its first line and one header.
pub type Seen = Arc<Mutex<Vec<(String, String)>>>;

/// A loopback listener that records each request's first line and the
/// value of one header (`""` when absent), then hands the connection on to
/// `answer` (its head read; on a thread of its own).
pub struct Recorder {
    pub addr: SocketAddr,
    pub seen: Seen,
}

impl Recorder {
    pub fn start(header: &'static str, answer: fn(std::net::TcpStream, &str, &str)) -> Recorder {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let seen: Seen = Arc::default();
        let sink = seen.clone();
        std::thread::spawn(move || {
            for conn in l.incoming() {
                let Ok(c) = conn else { continue };
                let sink = sink.clone();
                std::thread::spawn(move || {
                    c.set_read_timeout(Some(Duration::from_secs(10))).ok();
                    let mut r = BufReader::new(c.try_clone().unwrap());
                    let mut first = String::new();
                    r.read_line(&mut first).ok();
                    let mut value = String::new();
                    let mut line = String::new();
                    while r.read_line(&mut line).unwrap_or(0) > 0 && line != "\r\n" {
                        if let Some((k, v)) = line.trim_end().split_once(':')
                            && k.eq_ignore_ascii_case(header)
                        {
                            value = v.trim().to_owned();
                        }
                        line.clear();
                    }
                    let first = first.trim_end().to_owned();
                    sink.lock().unwrap().push((first.clone(), value.clone()));
                    answer(c, &first, &value);
                });
            }
        });
        Recorder { addr, seen }
    }

    pub fn seen(&self) -> Vec<(String, String)> {
        self.seen.lock().unwrap().clone()
    }
}

/// A [`Recorder`]'s answer: `200 {}` (and the connection closed), once the
/// flag of the first of `held` whose text the request line `first` holds is
/// set by the test (90 s at most); a request none of them names is
/// answered at once.
pub fn answer_when_released(
    mut c: std::net::TcpStream,
    first: &str,
    held: &[(&str, &std::sync::atomic::AtomicBool)],
) {
    if let Some((_, flag)) = held.iter().find(|(text, _)| first.contains(text)) {
        let deadline = Instant::now() + Duration::from_secs(90);
        while !flag.load(std::sync::atomic::Ordering::Acquire) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let _ = c.write_all(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}",
    );
}

/// Registers an agent (its manifest and `agent.py`) and starts a run of it
/// with `prompt`: the run's id (accepted, not yet ended).
pub fn start_agent(
    s: &Server,
    key: &str,
    (name, manifest): (&str, &str),
    agent_py: &str,
    prompt: &str,
) -> String {
    let k = Some(key);
    let body = json!({"manifest": manifest, "files": {"agent.py": agent_py}});
    let (st, v) = s.call("POST", "/v1/agents", k, Some(&body));
    assert!(st == 201 || st == 200, "{st} {v}");
    let (st, run) = s.call(
        "POST",
        "/v1/runs",
        k,
        Some(&json!({"agent": name, "prompt": prompt})),
    );
    assert_eq!(st, 202, "{run}");
    run["id"].as_str().unwrap().to_owned()
}

/// Registers an agent (its manifest and `agent.py`), runs it once with
/// `prompt`, and waits until it succeeded: the run, and its logs' text.
pub fn run_agent_once(
    s: &Server,
    key: &str,
    agent: (&str, &str),
    agent_py: &str,
    prompt: &str,
) -> (Value, String) {
    let k = Some(key);
    let id = start_agent(s, key, agent, agent_py, prompt);
    let run = wait_for(s, &format!("/v1/runs/{id}"), key, 60, |v| {
        v["status"] != "queued" && v["status"] != "running"
    });
    assert_eq!(run["status"], "succeeded", "{run}\n{}", s.log_text());
    let logs = s
        .call("GET", &format!("/v1/runs/{id}/logs?after=0"), k, None)
        .1;
    (run, logs.to_string())
}

/// What the warm pool tests of every backend start from: `airlock serve`
/// on `backend` with its pool of `size` (`pool_var`) on a home of its own,
/// the organization `Acme`, and `agents` registered ([`agent_body`]'s
/// shape): the home, the environment, the server and the API key.
pub fn pooled_server(
    backend: &str,
    (pool_var, size): (&str, usize),
    agents: &[Value],
) -> (tempfile::TempDir, Vec<(String, String)>, Server, String) {
    let home = tempfile::tempdir().unwrap();
    let mut env = base_env(home.path(), None);
    env.push((pool_var.into(), size.to_string()));
    let s = Server::start(&env, backend, home.path().join("serve.log"));
    let (_, key) = create_org(&env, "Acme", &[]);
    for a in agents {
        let (st, v) = s.call("POST", "/v1/agents", Some(&key), Some(a));
        assert_eq!(st, 201, "{v}");
    }
    (home, env, s, key)
}

/// Runs `agent` with `prompt` to its end (within `secs`), which must be a
/// success: its id and its output lines.
pub fn run_to_end(
    s: &Server,
    key: &str,
    agent: &str,
    prompt: &str,
    secs: u64,
) -> (String, Vec<String>) {
    let (st, v) = s.call(
        "POST",
        "/v1/runs",
        Some(key),
        Some(&json!({"agent": agent, "prompt": prompt})),
    );
    assert_eq!(st, 202, "{v}");
    let id = v["id"].as_str().unwrap().to_owned();
    let lines = succeeded_lines(s, key, &id, secs);
    (id, lines)
}

/// Waits (within `secs`) for run `id` to end, which must be a success:
/// its output lines.
pub fn succeeded_lines(s: &Server, key: &str, id: &str, secs: u64) -> Vec<String> {
    let done = wait_for(s, &format!("/v1/runs/{id}"), key, secs, |v| {
        v["ended_at"].is_number()
    });
    assert_eq!(done["status"], "succeeded", "{done}\n{}", s.log_text());
    let logs = s
        .call("GET", &format!("/v1/runs/{id}/logs"), Some(key), None)
        .1;
    logs["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["payload"]["line"].as_str().map(str::to_owned))
        .collect()
}

/// The first of `lines` that starts with `prefix` (a panic naming them
/// all if none does).
pub fn line_starting<'a>(lines: &'a [String], prefix: &str) -> &'a str {
    lines
        .iter()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line {prefix}: {lines:#?}"))
}

/// Whether `done` holds within `bound` (looked at every 50 ms).
pub fn holds_within(bound: Duration, done: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + bound;
    loop {
        if done() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
