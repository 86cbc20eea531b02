//! Shared helpers for the end-to-end tests that drive the real `airlock`
//! binary: start a sidecar against a test platform, talk plain HTTP to it,
//! and check for the Python test clients.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

pub const AIRLOCK: &str = env!("CARGO_BIN_EXE_airlock");

pub use airlock_test_support::sidecar::SidecarProcess;
pub use airlock_test_support::sidecar_config::{
    IntegrationBuilder, Limits, NetworkEgress, Provider, SidecarConfig, SidecarConfigBuilder,
    document, integration, refused_document,
};

/// `curl` that takes no proxy from the environment (`--noproxy ""`, the
/// proxy variables removed): it reaches what it reaches through the `-x`
/// or `--resolve` the test gives it, and nothing else.
pub fn curl_without_proxy_env() -> std::process::Command {
    let mut c = std::process::Command::new("curl");
    c.args(["--noproxy", ""]);
    for k in [
        "http_proxy",
        "https_proxy",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "all_proxy",
    ] {
        c.env_remove(k);
    }
    c
}

/// Starts this build's `airlock sidecar` with `config` on stdin and waits
/// for readiness. `log` sets `AIRLOCK_LOG` (e.g. `trace` for the canary tests).
pub fn spawn_sidecar_with_log(config: &SidecarConfig, log: &str) -> SidecarProcess {
    SidecarProcess::spawn(std::path::Path::new(AIRLOCK), config, log)
}

pub fn spawn_sidecar(config: &SidecarConfig) -> SidecarProcess {
    spawn_sidecar_with_log(config, "info")
}

/// Starts this build's `airlock sidecar` with `document`, which it must
/// refuse: what it printed and how it ended.
pub fn sidecar_refusal(document: &[u8]) -> std::process::Output {
    airlock_test_support::sidecar::refused(std::path::Path::new(AIRLOCK), document)
}

/// A plain HTTP/1.1 exchange (`Connection: close`). Returns status, headers
/// (lowercased names) and body.
pub fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let mut s = TcpStream::connect(addr).expect("connect to sidecar");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    parse_response(&raw)
}

/// [`http`]: a JSON `body` posted to `path` with the sidecar `token`.
pub fn post_json(
    addr: SocketAddr,
    path: &str,
    token: &str,
    body: &Value,
) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let auth = format!("Bearer {token}");
    let headers = [
        ("authorization", auth.as_str()),
        ("content-type", "application/json"),
    ];
    http(addr, "POST", path, &headers, body.to_string().as_bytes())
}

pub fn parse_response(raw: &[u8]) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("no header end in response");
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .expect("status line");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    if headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"))
    {
        body = dechunk(&body);
    }
    (status, headers, body)
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = b.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(
            String::from_utf8_lossy(&b[..eol])
                .split(';')
                .next()
                .unwrap_or("0")
                .trim(),
            16,
        )
        .unwrap_or(0);
        if size == 0 {
            break;
        }
        let start = eol + 2;
        let Some(chunk) = b.get(start..start + size) else {
            break;
        };
        out.extend_from_slice(chunk);
        b = b.get(start + size + 2..).unwrap_or_default();
    }
    out
}

/// Starts `tests/python/mcp_client.py` (the official MCP Python client)
/// with `input` (`{"url", "token", "mode", "uds", "ops"}`) on its stdin.
pub fn spawn_mcp_client(input: &Value) -> Child {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/mcp_client.py");
    let mut child = Command::new("python3")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.to_string().as_bytes())
        .expect("mcp_client.py input");
    child
}

/// The JSON document `mcp_client.py` printed.
pub fn mcp_client_output(child: Child) -> Value {
    let out = child.wait_with_output().expect("mcp_client.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|_| {
        panic!(
            "mcp_client.py printed no JSON: {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// The text blocks of an MCP tool result, joined by newlines.
pub fn text_of(result: &Value) -> String {
    result["content"]
        .as_array()
        .map(|c| {
            c.iter()
                .filter_map(|b| b["text"].as_str())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

/// True when `python3` (the one on PATH: the tests start it, and
/// `vendor.py` copies a sandboxed agent's modules from it) can import every
/// module. The probe is silent: its traceback is not the test's output.
/// Missing under CI is a failure; elsewhere the caller skips, counted.
pub fn python_has(modules: &[&str]) -> bool {
    let code = modules
        .iter()
        .map(|m| format!("import {m}"))
        .collect::<Vec<_>>()
        .join("; ");
    let ok = Command::new("python3")
        .args(["-c", &code])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    airlock_test_support::require_peer(
        "python modules",
        ok.then_some(()).ok_or_else(|| {
            format!(
                "{modules:?} are not importable by PATH's python3 (python3 -m pip install -r .ci/requirements.txt)"
            )
        }),
    )
    .is_some()
}

/// Polls `f` until it returns `Some`, for up to `secs` seconds.
pub async fn eventually<T, F, Fut>(secs: u64, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if std::time::Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The test-only isolation probe (`crates/airlock-probe`), beside the
/// `airlock` binary in the same target directory. `cargo test --workspace`
/// builds it; a narrower `cargo test -p airlock` builds it here on demand.
pub fn probe_exe() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = std::path::Path::new(AIRLOCK)
                .parent()
                .expect("the airlock binary has a directory");
            let exe = dir.join("airlock-probe");
            if !exe.exists() {
                let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
                let profile_dir = dir.file_name().and_then(|n| n.to_str()).unwrap_or("debug");
                let target = dir.parent().expect("a target directory");
                let mut cmd = Command::new(cargo);
                cmd.args(["build", "-q", "-p", "airlock-probe", "--target-dir"])
                    .arg(target);
                if profile_dir == "release" {
                    cmd.arg("--release");
                }
                let st = cmd.status().expect("run cargo build -p airlock-probe");
                assert!(st.success(), "cargo build -p airlock-probe failed");
            }
            assert!(exe.exists(), "{} is missing", exe.display());
            exe
        })
        .clone()
}

/// Where Airlock's cgroup parent may be: cgroup v2, the hybrid v2 mount,
/// and the v1 hierarchies it uses.
const CGROUP_ROOTS: [&str; 5] = [
    "/sys/fs/cgroup",
    "/sys/fs/cgroup/unified",
    "/sys/fs/cgroup/memory",
    "/sys/fs/cgroup/pids",
    "/sys/fs/cgroup/cpu",
];

/// The cgroup directories of run `run_id` on this machine (`airlock-<runId>`
/// under Airlock's parent in every hierarchy that has one).
pub fn run_cgroup_dirs(run_id: &str) -> Vec<PathBuf> {
    let mut v = vec![];
    for root in CGROUP_ROOTS {
        let p = std::path::Path::new(root)
            .join("airlock")
            .join(format!("airlock-{run_id}"));
        if p.exists() {
            v.push(p);
        }
    }
    v
}

/// The standby cgroup directories (`airlock-standby-<pid>-<n>`) that the
/// platform process `pid` made on this machine, in every hierarchy.
pub fn standby_cgroup_dirs(pid: u32) -> Vec<PathBuf> {
    let prefix = format!("airlock-standby-{pid}-");
    let mut v = vec![];
    for root in CGROUP_ROOTS {
        let dir = std::path::Path::new(root).join("airlock");
        v.extend(
            std::fs::read_dir(dir)
                .into_iter()
                .flatten()
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                .map(|e| e.path()),
        );
    }
    v
}

/// Whether the namespace backend works here: under `CI` it must, elsewhere a
/// test that needs it prints a loud SKIPPED.
pub fn namespace_available() -> bool {
    let b = airlock_sandbox::namespace::NamespaceBackend::with_exe(PathBuf::from(AIRLOCK));
    airlock_test_support::require_peer(
        "the namespace backend",
        airlock_sandbox::Backend::check(&b).map_err(|why| why.0),
    )
    .is_some()
}

/// A real `airlock run` of an agent: its own `AIRLOCK_HOME`, an agent
/// directory the sandbox may read (0755), a manifest.
pub struct RealRun {
    pub home: tempfile::TempDir,
    pub agent_dir: PathBuf,
    pub manifest: PathBuf,
    pub env: Vec<(String, String)>,
}

impl RealRun {
    /// `script` becomes `agent.py`, run by Debian's python3 with `timeout` seconds.
    pub fn python(script: &str, timeout: u64) -> RealRun {
        Self::with_manifest(
            script,
            &format!(
                "[agent]\nname = \"hostile\"\ncommand = [\"/usr/bin/python3\", \"agent.py\"]\ntimeout = {timeout}\n\n[network]\negress = \"none\"\n"
            ),
        )
    }

    pub fn with_manifest(script: &str, manifest: &str) -> RealRun {
        use std::os::unix::fs::PermissionsExt;
        let home = tempfile::Builder::new()
            .prefix("airlock-home-")
            .tempdir()
            .expect("home");
        let agent_dir = home.path().join("agent");
        std::fs::create_dir(&agent_dir).expect("agent dir");
        std::fs::set_permissions(&agent_dir, std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        std::fs::write(agent_dir.join("agent.py"), script).expect("agent.py");
        let manifest_path = agent_dir.join("airlock.toml");
        std::fs::write(&manifest_path, manifest).expect("manifest");
        RealRun {
            home,
            agent_dir,
            manifest: manifest_path,
            env: vec![],
        }
    }

    pub fn env(mut self, k: &str, v: &str) -> RealRun {
        self.env.push((k.into(), v.into()));
        self
    }

    /// `airlock run --json -f agent/airlock.toml --backend B EXTRA…`, not yet started.
    pub fn command(&self, backend: &str, extra: &[&str]) -> Command {
        let mut cmd = Command::new(AIRLOCK);
        cmd.args(["run", "--json", "--backend", backend, "-f"])
            .arg(&self.manifest)
            .args(extra)
            .env("AIRLOCK_HOME", self.home.path())
            .env_remove("DATABASE_URL")
            .env_remove("RUN_ADAPTER");
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }

    /// Runs it to its end: the process output and the JSON report.
    pub fn run(&self, backend: &str) -> (std::process::Output, Value) {
        let out = self.command(backend, &[]).output().expect("airlock run");
        let json = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        (out, json)
    }

    /// Runs it to its end with `--prompt prompt` on a blocking thread (an
    /// async test's servers keep answering meanwhile): the run back, the
    /// process output, and the JSON report, which must say the run
    /// succeeded.
    pub async fn run_prompted(
        self,
        backend: &'static str,
        prompt: String,
    ) -> (RealRun, std::process::Output, Value) {
        let (run, out) = tokio::task::spawn_blocking(move || {
            let o = self
                .command(backend, &["--prompt", &prompt])
                .output()
                .expect("airlock run");
            (self, o)
        })
        .await
        .expect("the run's thread");
        let report: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        assert_eq!(
            report["status"],
            "succeeded",
            "{report}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        (run, out, report)
    }

    /// Copies the installed Python distribution `dist` and what it requires
    /// into the agent's `vendor/` (`tests/python/vendor.py`): the sandbox's
    /// Python is Debian's, which sees only the host's `/usr`.
    pub fn vendor(&self, dist: &str) {
        let out = Command::new("python3")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/python/vendor.py"
            ))
            .arg(dist)
            .arg(self.agent_dir.join("vendor"))
            .output()
            .expect("python3");
        assert!(
            out.status.success(),
            "vendoring {dist}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Copies `tests/python/NAME` (a helper module the agent imports) into
    /// the agent's directory.
    pub fn helper(&self, name: &str) {
        let from = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/python")
            .join(name);
        std::fs::copy(&from, self.agent_dir.join(name))
            .unwrap_or_else(|e| panic!("{}: {e}", from.display()));
    }

    /// `airlock connections add NAME --integration NAME --type bearer` on
    /// this run's home, the fields on stdin, under `key` (base64).
    pub fn add_bearer_connection(&self, name: &str, fields: &Value, key: &str) {
        let mut child = Command::new(AIRLOCK)
            .args([
                "connections",
                "add",
                name,
                "--integration",
                name,
                "--type",
                "bearer",
            ])
            .env("AIRLOCK_HOME", self.home.path())
            .env("CONNECTION_ENCRYPTION_KEY", key)
            .env_remove("DATABASE_URL")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("airlock connections add");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(fields.to_string().as_bytes())
            .expect("fields");
        let out = child.wait_with_output().expect("airlock connections add");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The ids of the runs whose directories are in this home now (a live
    /// run's, or a crashed platform's).
    pub fn run_dirs(&self) -> Vec<String> {
        std::fs::read_dir(self.home.path().join("runs"))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Another `airlock` command on this run's home.
    pub fn airlock(&self, args: &[&str]) -> std::process::Output {
        Command::new(AIRLOCK)
            .args(args)
            .env("AIRLOCK_HOME", self.home.path())
            .env_remove("DATABASE_URL")
            .output()
            .expect("airlock")
    }
}

/// Stores the model key as a user does (`api_key`, field `key`) and grants
/// it to the run.
pub async fn add_model_key(p: &airlock_platform::testing::TestPlatform, key: &str) {
    p.add_connection("@model", airlock_store::AuthType::ApiKey, &[("key", key)])
        .await;
}

/// The cost event says the provider's usage never arrived.
pub fn unmetered(c: &airlock_platform_api::wire::CostRecord) -> bool {
    c.unmetered
}

/// What became of a logged request (`None` for a refusal), as the store spells it.
pub fn outcome(e: &airlock_store::EgressEntry) -> Option<&'static str> {
    e.outcome.map(|o| o.as_str())
}

/// Whether a logged model call was metered, as the store spells it.
pub fn metering(e: &airlock_store::EgressEntry) -> Option<&'static str> {
    e.metering.map(|m| m.as_str())
}

/// How many lines of `log` say a target was refused.
pub fn refusal_lines(log: &str) -> usize {
    log.lines().filter(|l| l.contains("Target refused")).count()
}

/// Sends SIGKILL to `sc` and waits for it: nothing of it runs afterwards.
pub fn kill(sc: &mut SidecarProcess) {
    let _ = sc.child.kill();
    let _ = sc.child.wait();
}

/// Sends SIGTERM (what the orchestrator does when the sandbox has ended) and
/// waits for the sidecar to exit by itself, returning how long that took.
/// Panics if it is still running after 5 s (the orchestrator's SIGKILL).
pub fn terminate(sc: &mut SidecarProcess) -> Duration {
    let started = std::time::Instant::now();
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(sc.pid().to_string())
        .status();
    loop {
        if let Ok(Some(_)) = sc.child.try_wait() {
            return started.elapsed();
        }
        if started.elapsed() > Duration::from_secs(5) {
            let _ = sc.child.kill();
            panic!(
                "the sidecar did not exit within 5 s of SIGTERM:\n{}",
                sc.stderr()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether a Docker daemon answers here (and the docker backend's images
/// are present, built once per test process from this `airlock`): under
/// `CI` it must, elsewhere a test that needs it prints a loud SKIPPED.
pub fn docker_available() -> bool {
    static READY: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    let r = READY.get_or_init(|| {
        let b = docker_backend().map_err(|e| e.to_string())?;
        airlock_sandbox::Backend::check(&b).map_err(|u| u.0)?;
        // Boot builds what is missing (kept warm); once here, not in every run.
        let out = Command::new(AIRLOCK)
            .args(["images", "check"])
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            let built = Command::new(AIRLOCK)
                .args(["images", "build"])
                .output()
                .map_err(|e| e.to_string())?;
            if !built.status.success() {
                return Err(format!(
                    "airlock images build failed: {}",
                    String::from_utf8_lossy(&built.stderr)
                ));
            }
        }
        // What a platform does at boot: the leftovers of stopped platforms
        // (an earlier test process killed mid-run) are reclaimed, so their
        // networks do not use up the daemon's address pools; the live runs
        // of other test processes are spared (reclaim judges by owner).
        airlock_sandbox::Backend::boot(&b, &|m| eprintln!("docker boot: {m}"))
            .map_err(|e| e.to_string())?;
        Ok(())
    });
    airlock_test_support::require_peer("a usable Docker daemon", r.as_ref()).is_some()
}

/// The docker backend as a run of this `airlock` would configure it.
pub fn docker_backend()
-> Result<airlock_sandbox::docker::DockerBackend, airlock_sandbox::SandboxError> {
    let vars: std::collections::HashMap<String, String> = std::env::vars().collect();
    let cfg =
        airlock_sandbox::docker::DockerConfig::from_vars(&vars, std::path::Path::new(AIRLOCK))?;
    Ok(airlock_sandbox::docker::DockerBackend::new(cfg))
}

/// The docker CLI (tests inspect and start their own containers with it).
pub fn docker(args: &[&str]) -> std::process::Output {
    Command::new("docker")
        .args(args)
        .output()
        .expect("the docker CLI (docker.io)")
}

/// `docker inspect` of one object, as JSON (`None` when it does not exist).
pub fn docker_inspect(kind: &str, name: &str) -> Option<Value> {
    let out = docker(&[kind, "inspect", name]);
    if !out.status.success() {
        return None;
    }
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    v.as_array()?.first().cloned()
}

/// The egress log entries of a run's report whose URL is `host:port`'s.
pub fn egress_to<'r>(report: &'r Value, host: &str, port: u16) -> Vec<&'r Value> {
    let at = format!("{host}:{port}");
    report["egress"]["entries"]
        .as_array()
        .map(|es| {
            es.iter()
                .filter(|e| e["url"].as_str().is_some_and(|u| u.contains(&at)))
                .collect()
        })
        .unwrap_or_default()
}

/// This host's address on the docker egress network (its bridge gateway):
/// where a test's own server is reached from a run's sidecar container.
pub fn docker_egress_gateway() -> std::net::IpAddr {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let b = docker_backend().unwrap();
        let d = b.docker().await.unwrap();
        airlock_sandbox::docker::egress_gateway(&d, b.cfg.egress_subnet)
            .await
            .unwrap()
    })
}

pub fn docker_leftovers(run_id: &str) -> Vec<String> {
    let mut v = vec![];
    let filter = format!("label=airlock.run={run_id}");
    for (kind, format) in [("ps -a", "{{.Names}}"), ("network ls", "{{.Name}}")] {
        let mut args: Vec<&str> = kind.split(' ').collect();
        args.extend(["--filter", &filter, "--format", format]);
        let out = docker(&args);
        v.extend(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|l| !l.is_empty())
                .map(str::to_owned),
        );
    }
    v
}

/// What a sandbox printed and how it ended (the backend-level suites).
pub struct Outcome {
    pub status: std::process::ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Outcome {
    /// The sandbox's JSON answer: all of stdout, or else its last line.
    pub fn json(&self) -> Value {
        let whole = self.stdout.trim();
        serde_json::from_str(whole)
            .or_else(|_| serde_json::from_str(whole.lines().last().unwrap_or_default()))
            .unwrap_or_else(|e| {
                panic!(
                    "output is not JSON ({e}): {}\nstderr: {}",
                    self.stdout, self.stderr
                )
            })
    }
}

/// Waits for a sandbox (killed past `timeout`), removes it, and returns
/// what it printed. A stream the caller took already reads as empty.
pub async fn finish_sandbox(mut sb: airlock_sandbox::Sandbox, timeout: Duration) -> Outcome {
    use tokio::io::AsyncReadExt;
    let (out, err) = sb.take_output();
    let empty = || Box::new(tokio::io::empty()) as airlock_sandbox::OutputStream;
    let (mut out, mut err) = (out.unwrap_or_else(empty), err.unwrap_or_else(empty));
    let reader = tokio::spawn(async move {
        let (mut o, mut e) = (Vec::new(), Vec::new());
        let _ = tokio::join!(out.read_to_end(&mut o), err.read_to_end(&mut e));
        (o, e)
    });
    let status = match tokio::time::timeout(timeout, sb.wait()).await {
        Ok(s) => s.unwrap(),
        Err(_) => {
            sb.kill();
            sb.wait().await.unwrap()
        }
    };
    sb.cleanup().await;
    let (o, e) = tokio::time::timeout(Duration::from_secs(10), reader)
        .await
        .expect("output streams ended")
        .unwrap();
    Outcome {
        status,
        stdout: String::from_utf8_lossy(&o).into_owned(),
        stderr: String::from_utf8_lossy(&e).into_owned(),
    }
}

/// Starts `airlock run` on `backend` and waits until the agent printed
/// `marker` (live view, on stderr, drained from then on); returns the
/// process and what was seen.
pub fn start_until(run: &RealRun, backend: &str, marker: &str) -> (Child, String) {
    let mut child = run
        .command(backend, &[])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        if err.read_line(&mut line).unwrap() == 0 {
            panic!("the run ended before {marker:?}: {seen}");
        }
        seen.push_str(&line);
        if line.contains(marker) {
            break;
        }
    }
    std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = err.read_to_string(&mut rest);
    });
    (child, seen)
}

/// Waits for a run started by [`start_until`] and returns its `--json` report.
pub fn finish_run(mut child: Child) -> Value {
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let _ = child.wait();
    serde_json::from_str(&out).unwrap_or(Value::Null)
}

/// The sidecars a platform (`parent`) started: its children that are
/// `airlock-sidecar`, or `airlock sidecar` where that binary is absent.
pub fn sidecars_of(parent: u32) -> Vec<u32> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        // `pid (comm) state ppid …`: comm may hold spaces, so count from its end.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid != Some(parent) {
            continue;
        }
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let mut argv = cmdline.split(|b| *b == 0);
        let a0 = argv.next().unwrap_or_default();
        let base = a0.rsplit(|b| *b == b'/').next().unwrap_or_default();
        if base == b"airlock-sidecar" || (base == b"airlock" && argv.next() == Some(b"sidecar")) {
            found.push(pid);
        }
    }
    found
}

/// A handle on process `pid` that tells when it has exited (a pidfd:
/// race-free against PID reuse). `None` when it is gone already.
pub fn pidfd(pid: u32) -> Option<std::os::fd::OwnedFd> {
    let pid = rustix::process::Pid::from_raw(i32::try_from(pid).ok()?)?;
    rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok()
}

/// Whether the process of `fd` ([`pidfd`]) exits within `timeout` (its
/// pidfd turns readable when it does).
pub fn exits_within(fd: &std::os::fd::OwnedFd, timeout: Duration) -> bool {
    use rustix::event::{PollFd, PollFlags, Timespec};
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let t = Timespec {
            tv_sec: i64::try_from(left.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(left.subsec_nanos()),
        };
        let mut fds = [PollFd::new(fd, PollFlags::IN)];
        match rustix::event::poll(&mut fds, Some(&t)) {
            Ok(n) if n > 0 => return true,
            Ok(_) => return false,
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return false,
        }
    }
}

/// Host processes whose parent is `ppid` and whose command line is
/// `airlock sandbox-init` (a namespace sandbox's init, or one waiting for its run).
pub fn inits_of(ppid: u32) -> Vec<u32> {
    let mut found = vec![];
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let parent = std::fs::read_to_string(e.path().join("stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')?
                    .1
                    .split_whitespace()
                    .nth(1)?
                    .parse()
                    .ok()
            });
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmdline.split(|c| *c == 0).collect();
        if parent == Some(ppid) && args.get(1) == Some(&&b"sandbox-init"[..]) {
            found.push(pid);
        }
    }
    found
}

/// Host PIDs of `root` and all its descendants.
pub fn process_tree(root: i32) -> Vec<i32> {
    let mut parent = vec![];
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        // `pid (comm) state ppid …`: comm may hold spaces, so after the last ')'.
        if let Ok(stat) = std::fs::read_to_string(e.path().join("stat"))
            && let Some((_, rest)) = stat.rsplit_once(')')
            && let Some(ppid) = rest.split_whitespace().nth(1)
            && let Ok(ppid) = ppid.parse::<i32>()
        {
            parent.push((pid, ppid));
        }
    }
    let mut tree = vec![root];
    let mut i = 0;
    while i < tree.len() {
        let p = tree[i];
        tree.extend(parent.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    tree
}

/// The strings of a JSON array (`[]` for anything else).
pub fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

pub mod serve;
#[allow(unused_imports)] // the benches that include this module use no TLS
pub use airlock_test_support::tls;
