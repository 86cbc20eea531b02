//! The egress log, end to end, across its three sites (`api_call` through
//! the official MCP Python SDK, `/llm`, the forward proxy through curl), the
//! real `airlock sidecar` against a real platform:
//!
//! - every request that left is in the log, also when the agent walks away
//!   from it, the run ends while it is in flight, or the sidecar is killed
//!   (then it stays `incomplete`): each record is written ahead to the run's
//!   egress journal before its request leaves, and the journal reaches the
//!   store when the run ends — or, when the platform itself was killed, at
//!   the next start's reclaim (while the run is live the platform follows
//!   the journal, so its log is in the store as it runs); a request whose
//!   record cannot be journalled
//!   does not leave, and a sidecar without a journal does not start;
//! - one failure means one thing at every site: a dial failure is the
//!   guard's `allowed` with the upstream's `upstream_failed`, and each
//!   refusal is one log line;
//! - a loop back into the sidecar is refused at every site.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use crate::support::*;
use airlock_platform::testing::TestPlatform;
use airlock_store::{AuthType, EgressDecision, EgressEntry};
use airlock_vault::ExposeSecret;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const CANARY: &str = "canary-Egr3ssL0g-9xQ2";
const HOST: &str = "api.internal.test";

/// A loopback upstream that records each request's path as soon as its head
/// arrives, then answers `/hang` never, `/wait` once released
/// ([`Upstream::release`]) and anything else at once.
struct Upstream {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<String>>>,
    released: Arc<tokio::sync::Notify>,
}

impl Upstream {
    async fn start() -> Upstream {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let released = Arc::new(tokio::sync::Notify::new());
        let (rec, release) = (seen.clone(), released.clone());
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let (rec, release) = (rec.clone(), release.clone());
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut tmp = [0u8; 4096];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut tmp).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&tmp[..n]),
                        }
                    }
                    let head = String::from_utf8_lossy(&buf).to_string();
                    let path = head.split(' ').nth(1).unwrap_or("").to_owned();
                    rec.lock().unwrap().push(path.clone());
                    if path.starts_with("/hang") {
                        // Never answers; holds the connection until the peer goes.
                        while let Ok(n) = s.read(&mut tmp).await {
                            if n == 0 {
                                break;
                            }
                        }
                        return;
                    }
                    if path.starts_with("/wait") {
                        release.notified().await;
                    }
                    let body = b"{\"ok\":true}";
                    let resp = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = s.write_all(resp.as_bytes()).await;
                    let _ = s.write_all(body).await;
                    let _ = s.shutdown().await;
                });
            }
        });
        Upstream {
            addr,
            seen,
            released,
        }
    }

    /// Lets one request for `/wait` be answered.
    fn release(&self) {
        self.released.notify_one();
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }

    fn url(&self, path: &str) -> String {
        format!("http://{HOST}:{}{path}", self.addr.port())
    }

    /// Waits until the upstream has received `n` requests for `path`.
    async fn wait_for(&self, path: &str, n: usize) {
        eventually(20, || async {
            (self.seen().iter().filter(|p| p.as_str() == path).count() >= n).then_some(())
        })
        .await
        .unwrap_or_else(|| panic!("the upstream never saw {n} × {path}: {:?}", self.seen()));
    }
}

/// A port nothing listens on.
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

struct Env {
    p: TestPlatform,
    up: Upstream,
    sc: SidecarProcess,
}

impl Env {
    fn token(&self) -> String {
        self.p.sidecar_token.expose_secret().to_owned()
    }
    fn mcp_url(&self) -> String {
        format!("http://{}/mcp", self.sc.tcp())
    }
    fn proxy(&self) -> String {
        format!("http://{}", self.sc.proxy_tcp())
    }
    fn egress_of(log: &[EgressEntry], source: &str) -> Vec<EgressEntry> {
        log.iter()
            .filter(|e| e.source.as_str() == source)
            .cloned()
            .collect()
    }
}

/// A sidecar on TCP (API and proxy) whose integrations, model and network
/// policy all reach `api.internal.test` (= 127.0.0.1) on any port.
async fn setup(model_port: u16, api: SocketAddr) -> Env {
    let p = TestPlatform::start("egress-log-agent").await;
    p.add_connection("svc", AuthType::Bearer, &[("token", CANARY)])
        .await;
    add_model_key(&p, "sk-egress-log-model").await;
    let up = Upstream::start().await;
    let cfg = p
        .sidecar_config()
        .tcp_at(api)
        .proxy_tcp()
        .integration(
            integration("svc")
                .authorized([format!("http://{HOST}:*/**")])
                .bearer("token"),
        )
        .integration(open_integration())
        .model(Provider::Openai, &format!("http://{HOST}:{model_port}/v1"))
        .network_allow([
            format!("http://{HOST}:*/**"),
            format!("https://{HOST}:*/**"),
        ])
        .loopback_host(HOST)
        .build();
    let sc = spawn_sidecar(&cfg);
    Env { p, up, sc }
}

/// The API on any free loopback port.
fn any_port() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// `open`: any URL on `api.internal.test`, no credential.
fn open_integration() -> IntegrationBuilder {
    integration("open")
        .authorized([format!("http://{HOST}:*/**")])
        .without_connection()
}

/// A sidecar (API and proxy on TCP) whose one integration is
/// [`open_integration`] and whose network reaches `api.internal.test` over
/// HTTP.
fn open_config(p: &TestPlatform) -> SidecarConfigBuilder {
    p.sidecar_config()
        .tcp()
        .proxy_tcp()
        .integration(open_integration())
        .network_allow([format!("http://{HOST}:*/**")])
        .loopback_host(HOST)
}

/// Starts the MCP Python SDK with `ops` and returns the running process.
fn spawn_agent(url: &str, token: &str, ops: Value) -> Child {
    spawn_mcp_client(
        &json!({"url": url, "token": token, "mode": "2026-07-28", "uds": null, "ops": ops}),
    )
}

fn agent_output(child: Child) -> Value {
    mcp_client_output(child)
}

/// curl through the proxy, left running.
fn spawn_curl(proxy: &str, token: &str, url: &str) -> Child {
    Command::new("curl")
        .args(["-sS", "--max-time", "60", "--noproxy", "", "-x", proxy])
        .args(["--proxy-user", &format!("run:{token}"), url])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("curl must be installed (.ci/run installs it)")
}

fn curl_status(proxy: &str, token: &str, url: &str) -> u16 {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "20", "--noproxy", "", "-x", proxy])
        .args(["--proxy-user", &format!("run:{token}")])
        .args(["-o", "/dev/null", "-w", "%{http_code}", url])
        .output()
        .expect("curl");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

fn kill_child(mut c: Child) {
    let _ = c.kill();
    let _ = c.wait();
}

/// The agent starts a slow `api_call` and a slow proxy request, then exits
/// while both are in flight, and the run ends (SIGTERM): both reached the
/// upstream, so both are in the egress log, completed (the sidecar stopped
/// waiting: `aborted`), none left `incomplete`, within the drain deadline.
#[tokio::test(flavor = "multi_thread")]
async fn requests_in_flight_when_the_agent_exits_are_in_the_log() {
    if !python_has(&["mcp", "httpx2"]) {
        return;
    }
    let mut env = setup(closed_port(), any_port()).await;
    let token = env.token();
    let agent = spawn_agent(
        &env.mcp_url(),
        &token,
        json!([{"op": "call", "name": "svc__api_call", "args": {"target": env.up.url("/hang?k={{token}}")}}]),
    );
    let curl = spawn_curl(&env.proxy(), &token, &env.up.url("/hang"));
    eventually(20, || async {
        (env.up
            .seen()
            .iter()
            .filter(|p| p.starts_with("/hang"))
            .count()
            >= 2)
            .then_some(())
    })
    .await
    .expect("both requests reached the upstream");
    kill_child(agent);
    kill_child(curl);
    let took = terminate(&mut env.sc);
    assert!(
        took < std::time::Duration::from_secs(4),
        "the drain took {took:?}"
    );

    let log = env.p.egress_log().await;
    let api = Env::egress_of(&log, "api_call");
    assert_eq!(
        api.len(),
        1,
        "the api_call that reached the upstream: {log:?}"
    );
    assert_eq!(api[0].decision, EgressDecision::Allowed);
    assert!(api[0].url.ends_with("/hang"), "{:?}", api[0]);
    assert_eq!(outcome(&api[0]), Some("aborted"), "{:?}", api[0]);
    let proxy = Env::egress_of(&log, "proxy");
    assert_eq!(
        proxy.len(),
        1,
        "the proxy request that reached the upstream: {log:?}"
    );
    assert_eq!(proxy[0].method, "GET");
    assert_eq!(outcome(&proxy[0]), Some("aborted"), "{:?}", proxy[0]);
    assert!(!format!("{log:?}").contains(CANARY));
}

/// The platform stops answering, then the agent sends a slow `api_call`
/// and a slow proxy request, and the sidecar is killed (SIGKILL) while both
/// are in flight: both left (their records were journalled, no platform
/// round trip needed), nothing reached the store through the events, and
/// once the platform reads the journal (as at the run's end) both are
/// there, `incomplete`.
#[tokio::test(flavor = "multi_thread")]
async fn requests_in_flight_when_the_sidecar_is_killed_stay_incomplete() {
    if !python_has(&["mcp", "httpx2"]) {
        return;
    }
    let mut env = setup(closed_port(), any_port()).await;
    let token = env.token();
    env.p.stop_serving().await;
    let agent = spawn_agent(
        &env.mcp_url(),
        &token,
        json!([{"op": "call", "name": "open__api_call", "args": {"target": env.up.url("/hang")}}]),
    );
    let curl = spawn_curl(&env.proxy(), &token, &env.up.url("/hang"));
    env.up.wait_for("/hang", 2).await;
    kill(&mut env.sc);
    kill_child(agent);
    kill_child(curl);

    assert_eq!(
        env.p.stored_egress_log().await,
        [],
        "the platform was not answering: only the journal can hold these"
    );
    let log = env.p.egress_log().await;
    for source in ["api_call", "proxy"] {
        let e = Env::egress_of(&log, source);
        assert_eq!(e.len(), 1, "{source}: {log:?}");
        assert_eq!(e[0].decision, EgressDecision::Allowed, "{source}");
        assert_eq!(outcome(&e[0]), Some("incomplete"), "{source}: {:?}", e[0]);
        assert!(e[0].url.ends_with("/hang"), "{:?}", e[0]);
    }
}

/// A run's journal is bounded: once a record would take it past its bound,
/// the request is not sent (`egress_journal_full` at every site) and the
/// upstream sees nothing more; what was sent before is all in the log.
#[tokio::test(flavor = "multi_thread")]
async fn past_the_journal_bound_nothing_leaves() {
    if !python_has(&["mcp", "httpx2"]) {
        return;
    }
    let p = TestPlatform::start("egress-journal-bound").await;
    let up = Upstream::start().await;
    let cfg = open_config(&p)
        // Room for a few records (start + completion are ~0.6 KiB a request).
        .limits(|l| l.egress_journal_bytes = 2048)
        .build();
    let mut sc = spawn_sidecar(&cfg);
    let token = p.sidecar_token.expose_secret().to_owned();
    let proxy = format!("http://{}", sc.proxy_tcp());
    let mut statuses = Vec::new();
    for _ in 0..8 {
        statuses.push(curl_status(&proxy, &token, &up.url("/ok")));
    }
    let sent = statuses.iter().filter(|s| **s == 200).count();
    assert!(sent >= 1, "{statuses:?}");
    assert!(
        statuses[sent..].iter().all(|s| *s == 503),
        "once full, every request is refused: {statuses:?}"
    );
    assert_eq!(
        up.seen().len(),
        sent,
        "a request left although it could not be journalled"
    );
    let out = agent_output(spawn_agent(
        &format!("http://{}/mcp", sc.tcp()),
        &token,
        json!([{"op": "call", "name": "open__api_call", "args": {"target": up.url("/ok")}}]),
    ));
    assert_eq!(out["results"][0]["isError"], json!(true), "{out}");
    assert!(out.to_string().contains("egress_journal_full"), "{out}");
    assert_eq!(up.seen().len(), sent);
    terminate(&mut sc);
    // The bound admits starts; each admitted start's completion is written
    // past it (a request that left always has its end recorded).
    let journal = std::fs::metadata(&p.journal).unwrap().len();
    assert!(journal <= 2 * 2048 + 512, "{journal}");
    let log = p.egress_log().await;
    let allowed: Vec<_> = log
        .iter()
        .filter(|e| e.decision == EgressDecision::Allowed)
        .collect();
    assert_eq!(allowed.len(), sent, "{log:?}");
    assert!(
        allowed.iter().all(|e| outcome(e) == Some("completed")),
        "{log:?}"
    );
}

/// A configuration without a journal (none that a platform of this build
/// writes: every egress record is written ahead to the run's journal) is
/// refused: the sidecar exits before it serves anything, so no request can
/// leave unrecorded, and the upstream sees nothing.
#[tokio::test(flavor = "multi_thread")]
async fn without_a_journal_the_sidecar_does_not_start() {
    let p = TestPlatform::start("egress-log-agent").await;
    let up = Upstream::start().await;
    let cfg = open_config(&p).without_journal().build();
    let out = sidecar_refusal(&document(&cfg));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "",
        "no readiness line"
    );
    assert!(stderr.contains("no egress journal"), "{stderr}");
    assert!(up.seen().is_empty(), "{:?}", up.seen());
    assert_eq!(std::fs::metadata(&p.journal).unwrap().len(), 0);
}

/// The platform itself (a real `airlock run`) is killed with SIGKILL while
/// the agent's slow request is in flight through the proxy. Its sidecar
/// notices, records the request's end (`aborted`: the agent went with the
/// platform) in the run's journal — there is no platform left to send it to
/// — and exits. The next start's reclaim reads the journal into the store
/// before failing the run: `airlock runs show` has the request, completed.
#[tokio::test(flavor = "multi_thread")]
async fn what_left_before_the_platform_was_killed_reaches_the_store_at_the_next_start() {
    let up = Upstream::start().await;
    let port = up.addr.port();
    let target = format!("http://127.0.0.1:{port}/hang");
    let run = RealRun::with_manifest(
        "",
        &format!(
            // Through the sidecar's proxy (the process backend could reach
            // loopback directly, and NO_PROXY names 127.0.0.1 for the relays).
            "[agent]\nname = \"journal\"\ncommand = [\"/bin/sh\", \"-c\", \"exec curl -sS --max-time 60 --noproxy '' -x \\\"$HTTP_PROXY\\\" {target}\"]\ntimeout = 120\n\n[network]\negress = [\"http://127.0.0.1:{port}/**\"]\n"
        ),
    )
    .env("EGRESS_ALLOW_INTERNAL_HOSTS", "127.0.0.1");
    let mut platform = run
        .command("process", &[])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    up.wait_for("/hang", 1).await;
    let sidecars = sidecars_of(platform.id());
    assert_eq!(sidecars.len(), 1, "the run's sidecar");
    let run_dirs = run.run_dirs();
    assert_eq!(run_dirs.len(), 1, "{run_dirs:?}");
    let run_id = run_dirs[0].clone();
    platform.kill().unwrap();
    platform.wait().unwrap();
    // The sidecar sees its platform go, records what it still had, exits.
    eventually(20, || async {
        (!std::path::Path::new(&format!("/proc/{}", sidecars[0])).exists()).then_some(())
    })
    .await
    .expect("the sidecar outlived its platform");

    let next = RealRun::with_manifest(
        "",
        "[agent]\nname = \"next\"\ncommand = [\"true\"]\ntimeout = 30\n\n[network]\negress = \"none\"\n",
    );
    let out = Command::new(env!("CARGO_BIN_EXE_airlock"))
        .args(["run", "--json", "--backend", "process", "-f"])
        .arg(&next.manifest)
        .env("AIRLOCK_HOME", run.home.path())
        .env_remove("DATABASE_URL")
        .env_remove("RUN_ADAPTER")
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("reclaimed 1 leftover run"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown = run.airlock(&["runs", "show", &run_id, "--json"]);
    let report: Value = serde_json::from_slice(&shown.stdout)
        .unwrap_or_else(|_| panic!("runs show: {}", String::from_utf8_lossy(&shown.stderr)));
    assert_eq!(report["status"], "failed", "{report}");
    let entries = report["egress"]["entries"].as_array().unwrap();
    let hang: Vec<&Value> = entries
        .iter()
        .filter(|e| e["url"].as_str().is_some_and(|u| u.ends_with("/hang")))
        .collect();
    assert_eq!(hang.len(), 1, "{report}");
    assert_eq!(hang[0]["source"], "proxy", "{report}");
    assert_eq!(hang[0]["decision"], "allowed", "{report}");
    // Its end was recorded after the platform was gone: only the journal had it.
    assert_eq!(hang[0]["outcome"], "aborted", "{report}");
}

/// The live view: the platform follows the run's journal into the store
/// while the run runs, so `airlock runs show` of a live run lists what has
/// left — a finished request completed, one still in flight `incomplete` —
/// and the run's end completes it, once (nothing listed twice).
#[tokio::test(flavor = "multi_thread")]
async fn a_live_runs_egress_log_is_in_the_store_while_it_runs() {
    let up = Upstream::start().await;
    let port = up.addr.port();
    let curl = |path: &str| {
        format!(
            "curl -sS --max-time 60 --noproxy '' -x \\\"$HTTP_PROXY\\\" http://127.0.0.1:{port}{path}"
        )
    };
    let run = RealRun::with_manifest(
        "",
        &format!(
            "[agent]\nname = \"live\"\ncommand = [\"/bin/sh\", \"-c\", \"{} && {}\"]\ntimeout = 120\n\n[network]\negress = [\"http://127.0.0.1:{port}/**\"]\n",
            curl("/first"),
            curl("/wait")
        ),
    )
    .env("EGRESS_ALLOW_INTERNAL_HOSTS", "127.0.0.1");
    let mut platform = run
        .command("process", &[])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    up.wait_for("/wait", 1).await;
    let run_dirs = run.run_dirs();
    assert_eq!(run_dirs.len(), 1, "the live run's directory: {run_dirs:?}");
    let run_id = run_dirs[0].clone();
    let outcome_of = |report: &Value, path: &str| -> Vec<Value> {
        report["egress"]["entries"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["url"].as_str().is_some_and(|u| u.ends_with(path)))
            .map(|e| e["outcome"].clone())
            .collect()
    };
    let live = eventually(10, || async {
        let shown = run.airlock(&["runs", "show", &run_id, "--json"]);
        let report: Value = serde_json::from_slice(&shown.stdout).ok()?;
        (outcome_of(&report, "/wait") == [json!("incomplete")]).then_some(report)
    })
    .await
    .expect("the request in flight is in the store while the run is live");
    assert_eq!(live["status"], "running", "{live}");
    assert_eq!(outcome_of(&live, "/first"), [json!("completed")], "{live}");

    up.release();
    let out = tokio::task::spawn_blocking(move || {
        let status = platform.wait().unwrap();
        let mut stdout = String::new();
        std::io::Read::read_to_string(platform.stdout.as_mut().unwrap(), &mut stdout).unwrap();
        (status, stdout)
    })
    .await
    .unwrap();
    assert!(out.0.success(), "{}", out.1);
    let shown = run.airlock(&["runs", "show", &run_id, "--json"]);
    let ended: Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(ended["status"], "succeeded", "{ended}");
    assert_eq!(
        outcome_of(&ended, "/first"),
        [json!("completed")],
        "{ended}"
    );
    assert_eq!(outcome_of(&ended, "/wait"), [json!("completed")], "{ended}");
}

/// A connection refused by the upstream at each site: the guard allowed it
/// (`allowed`, no code) and the upstream failed (`upstream_failed`), the
/// same at all three. A refusal is one log line; a dial failure none.
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_dial_means_the_same_at_every_site_and_each_refusal_is_one_line() {
    if !python_has(&["mcp", "httpx2"]) {
        return;
    }
    let closed = closed_port();
    let mut env = setup(closed, any_port()).await;
    let token = env.token();
    let dead = format!("http://{HOST}:{closed}/x");
    let out = agent_output(spawn_agent(
        &env.mcp_url(),
        &token,
        json!([
            {"op": "call", "name": "svc__api_call", "args": {"target": dead}},
            {"op": "call", "name": "svc__api_call", "args": {"target": "http://elsewhere.test/"}},
        ]),
    ));
    assert_eq!(out["results"][0]["isError"], json!(true), "{out}");
    assert!(out.to_string().contains("upstream_failed"), "{out}");
    let auth = format!("Bearer {token}");
    let (status, _, _) = http(
        env.sc.tcp(),
        "POST",
        "/llm/v1/chat/completions",
        &[
            ("authorization", &auth),
            ("content-type", "application/json"),
        ],
        br#"{"model":"m","messages":[]}"#,
    );
    assert_eq!(status, 502);
    assert_eq!(curl_status(&env.proxy(), &token, &dead), 502);
    terminate(&mut env.sc);

    let log = env.p.egress_log().await;
    for source in ["api_call", "llm", "proxy"] {
        let failed: Vec<_> = Env::egress_of(&log, source)
            .into_iter()
            .filter(|e| e.url.contains(&closed.to_string()))
            .collect();
        assert_eq!(failed.len(), 1, "{source}: {log:?}");
        let e = &failed[0];
        assert_eq!(
            (e.decision, e.reason.map(|r| r.as_str()), outcome(e)),
            (EgressDecision::Allowed, None, Some("upstream_failed")),
            "{source}: {e:?}"
        );
    }
    let refused: Vec<_> = log
        .iter()
        .filter(|e| e.decision == EgressDecision::Refused)
        .collect();
    assert_eq!(refused.len(), 1, "{log:?}");
    assert_eq!(
        refused[0].reason.map(|r| r.as_str()),
        Some("not_authorized")
    );
    assert_eq!(outcome(refused[0]), None);
    env.sc.stop();
    let stderr = env.sc.stderr();
    assert_eq!(
        refusal_lines(&stderr),
        1,
        "one refusal, one line:\n{stderr}"
    );
}

/// The operator opted the host in on every port, and the sidecar listens on
/// it: `api_call`, `/llm` and the proxy all refuse to loop back into the
/// sidecar (`blocked_address`), while another port of the host is reachable.
#[tokio::test(flavor = "multi_thread")]
async fn a_loop_back_into_the_sidecar_is_refused_at_every_site() {
    if !python_has(&["mcp", "httpx2"]) {
        return;
    }
    // The model is the sidecar itself: its port is chosen up front.
    let api_port = closed_port();
    let mut env = setup(api_port, SocketAddr::from(([127, 0, 0, 1], api_port))).await;
    let token = env.token();
    let proxy_port = env.sc.proxy_tcp().port();
    let own = |port: u16, path: &str| format!("http://{HOST}:{port}{path}");
    let out = agent_output(spawn_agent(
        &env.mcp_url(),
        &token,
        json!([
            {"op": "call", "name": "svc__api_call", "args": {"target": own(api_port, "/health")}},
            {"op": "call", "name": "open__api_call", "args": {"target": own(api_port, "/health")}},
            {"op": "call", "name": "open__api_call", "args": {"target": own(proxy_port, "/")}},
            {"op": "call", "name": "svc__api_call", "args": {"target": env.up.url("/ok")}},
        ]),
    ));
    let results = out["results"].as_array().unwrap();
    for r in &results[..3] {
        assert_eq!(r["isError"], json!(true), "{r}");
        assert!(r.to_string().contains("blocked_address"), "{r}");
    }
    assert_eq!(results[3]["isError"], json!(false), "{}", results[3]);
    let auth = format!("Bearer {token}");
    let (status, _, body) = http(
        env.sc.tcp(),
        "POST",
        "/llm/v1/chat/completions",
        &[
            ("authorization", &auth),
            ("content-type", "application/json"),
        ],
        br#"{"model":"m","messages":[]}"#,
    );
    assert_eq!(status, 403, "{}", String::from_utf8_lossy(&body));
    assert!(String::from_utf8_lossy(&body).contains("blocked_address"));
    for port in [api_port, proxy_port] {
        assert_eq!(
            curl_status(&env.proxy(), &token, &own(port, "/health")),
            403
        );
    }
    assert_eq!(curl_status(&env.proxy(), &token, &env.up.url("/ok")), 200);
    terminate(&mut env.sc);

    let log = env.p.egress_log().await;
    let loops: Vec<_> = log
        .iter()
        .filter(|e| e.reason.map(|r| r.as_str()) == Some("blocked_address"))
        .map(|e| e.source.as_str())
        .collect();
    assert_eq!(
        loops,
        ["api_call", "api_call", "api_call", "llm", "proxy", "proxy"],
        "{log:?}"
    );
    // The sidecar served nothing to itself: every request it saw came from here.
    assert_eq!(env.up.seen(), ["/ok", "/ok"]);
}

/// One stateless `tools/call` on its own connection, as a plain HTTP client
/// sends it: the status and the body.
async fn call_on_own_connection(
    addr: SocketAddr,
    token: &str,
    tool: &str,
    target: &str,
) -> (u16, String) {
    use http_body_util::{BodyExt, Full};
    let s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(s))
        .await
        .unwrap();
    tokio::spawn(conn);
    let body = json!({
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {
            "name": tool,
            "arguments": {"target": target},
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {}
            }
        }
    })
    .to_string();
    let req = hyper::Request::post("/mcp")
        .header("host", "127.0.0.1")
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", tool)
        .body(Full::new(bytes::Bytes::from(body)))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

/// 200 credentialed `api_call`s at once, each on its own connection (a
/// platform fetch each): the sidecar runs `max_concurrent_calls` (16) at a
/// time and queues the rest. Every call answers with the upstream's body and
/// not the credential, the upstream sees each path exactly once, and the
/// egress log holds one completed record per path with distinct sequence
/// numbers: nothing lost, nothing doubled.
#[tokio::test(flavor = "multi_thread")]
async fn two_hundred_concurrent_api_calls_all_answer_and_all_are_logged() {
    const CALLS: usize = 200;
    let mut env = setup(closed_port(), any_port()).await;
    let token = env.token();
    let addr = env.sc.tcp();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..CALLS {
        let token = token.clone();
        let target = env.up.url(&format!("/load/{i}"));
        tasks.spawn(async move {
            (
                i,
                call_on_own_connection(addr, &token, "svc__api_call", &target).await,
            )
        });
    }
    let mut answered = 0;
    while let Some(r) = tasks.join_next().await {
        let (i, (status, body)) = r.unwrap();
        assert_eq!(status, 200, "call {i}: {body}");
        assert!(body.contains(r#""isError":false"#), "call {i}: {body}");
        assert!(body.contains(r#"{\"ok\":true}"#), "call {i}: {body}");
        assert!(!body.contains(CANARY), "call {i} returned the credential");
        answered += 1;
    }
    assert_eq!(answered, CALLS);
    let mut seen: Vec<String> = env
        .up
        .seen()
        .into_iter()
        .filter(|p| p.starts_with("/load/"))
        .collect();
    assert_eq!(seen.len(), CALLS, "the upstream saw {seen:?}");
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), CALLS, "a request reached the upstream twice");
    terminate(&mut env.sc);
    let log = env.p.egress_log().await;
    let calls: Vec<&EgressEntry> = log
        .iter()
        .filter(|e| e.source.as_str() == "api_call" && e.url.contains("/load/"))
        .collect();
    assert_eq!(calls.len(), CALLS, "{log:?}");
    assert!(
        calls.iter().all(|e| e.decision == EgressDecision::Allowed
            && outcome(e) == Some("completed")
            && e.status == Some(200)
            && e.integration.as_deref() == Some("svc")),
        "{calls:?}"
    );
    let mut urls: Vec<&str> = calls.iter().map(|e| e.url.as_str()).collect();
    urls.sort_unstable();
    urls.dedup();
    assert_eq!(urls.len(), CALLS, "one record per path");
    let mut seqs: Vec<i64> = calls.iter().filter_map(|e| e.seq).collect();
    seqs.sort_unstable();
    seqs.dedup();
    assert_eq!(seqs.len(), CALLS, "distinct sequence numbers");
}
