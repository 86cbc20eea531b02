//! `airlock runtime -- CMD…`: the first process of a sandbox.
//!
//! It receives the run's secrets on stdin ([`RuntimeSecrets`]), makes itself
//! non-dumpable, and starts the agent command with an environment that holds
//! no secret: the agent sees ordinary local endpoints (`AIRLOCK_MCP_URL`,
//! `OPENAI_BASE_URL`, `ANTHROPIC_BASE_URL`, `HTTP_PROXY`) served by this
//! process on 127.0.0.1, which relays them to the sidecar ([`Endpoint`]: its
//! unix sockets, or its TCP listeners on a docker run's network) and adds
//! the sidecar token on the way, so the agent's own code never holds it.
//! Meanwhile it sends heartbeats, turns the agent's output into log events,
//! and reports the exit code and the optional result file as the result.
//!
//! Its two output streams mean different things to the platform: stdout
//! carries the agent's lines (both of the agent's streams, for the
//! operator's live view), stderr only the runtime's own diagnostics — the
//! agent has no descriptor of it, so what arrives there is the runtime's.

#![forbid(unsafe_code)]

mod files;
mod relay;
mod report;
pub mod runner;
pub mod transparent;

use std::process::Stdio;

use std::time::Duration;

use airlock_platform_api::clock::now_ms;
use airlock_platform_api::wire::RunEvent;
use tokio::io::BufReader;

pub use relay::{Dial, proxy_relay, sidecar_relay};
use report::Reporter;

pub use airlock_platform_api::launch::{Endpoint, MAX_SECRETS_BYTES, RuntimeSecrets};

/// The system's trust anchors (Debian's bundle), read to build the run's.
const SYSTEM_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Makes the agent's tools trust the run's CA (the sidecar's intercepting
/// proxy signs with it): `.airlock/ca.pem` (the CA alone, for Node, which
/// adds it to its own roots) and `.airlock/ca-bundle.pem` (the system's
/// anchors and the CA, for OpenSSL, curl, Python `requests`, git, which
/// replace theirs with the file; pip, which reads `PIP_CERT`). Only the certificate: the key stays in
/// the sidecar.
fn trust_run_ca(meta: &std::path::Path, ca: &str) -> std::io::Result<Vec<(String, String)>> {
    let ca_file = meta.join("ca.pem");
    std::fs::write(&ca_file, ca)?;
    let mut bundle = std::fs::read_to_string(SYSTEM_BUNDLE).unwrap_or_default();
    if !bundle.is_empty() && !bundle.ends_with('\n') {
        bundle.push('\n');
    }
    bundle.push_str(ca);
    let bundle_file = meta.join("ca-bundle.pem");
    std::fs::write(&bundle_file, bundle)?;
    let b = bundle_file.display().to_string();
    Ok(vec![
        ("SSL_CERT_FILE".into(), b.clone()),
        ("REQUESTS_CA_BUNDLE".into(), b.clone()),
        ("CURL_CA_BUNDLE".into(), b.clone()),
        ("PIP_CERT".into(), b.clone()),
        ("GIT_SSL_CAINFO".into(), b),
        ("NODE_EXTRA_CA_CERTS".into(), ca_file.display().to_string()),
    ])
}

/// Largest result document (`$AIRLOCK_RESULT_FILE`) reported.
pub const MAX_RESULT_BYTES: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("cannot make the runtime non-dumpable: {0}")]
    Hardening(std::io::Error),
    #[error("cannot start the local relays: {0}")]
    Relay(std::io::Error),
    #[error("cannot start the agent {cmd:?}: {source}")]
    Spawn { cmd: String, source: std::io::Error },
    #[error("cannot start the runner's server {cmd:?}: {source}")]
    SpawnServer { cmd: String, source: std::io::Error },
    #[error("the sidecar at {0} did not come up")]
    SidecarDown(String),
    #[error("workspace: {0}")]
    Workspace(std::io::Error),
}

/// The placeholder key the agent's model SDK holds. Not a secret: the
/// sidecar replaces it with the provider key.
pub const PLACEHOLDER_KEY: &str = "airlock-placeholder-key";

/// Runs the agent to completion; returns its exit code (128+signal if killed).
pub async fn run(secrets: RuntimeSecrets, command: Vec<String>) -> Result<i32, RuntimeError> {
    let mut stop = listen_for_stop();
    let (program, args) = harden_and_split(&command)?;
    let token = secrets.sidecar_token.clone();
    let heartbeat_every = Duration::from_secs(secrets.heartbeat_interval_secs.max(1));
    let (sidecar, probe) = wait_for_sidecar(&secrets.sidecar).await?;
    drop(probe);
    tracing::debug!(target: "airlock::phase", "runtime: sidecar reachable");

    let reporter = Reporter::start(sidecar.clone(), token.clone());
    let sidecar_dial = sidecar.clone();
    let api = relay::sidecar_relay(sidecar, token.clone())
        .await
        .map_err(RuntimeError::Relay)?;
    let proxy = start_proxy_relay(&secrets).await?;
    start_transparent_plane(&secrets).await;
    let files = AgentFiles::write(&secrets)?;
    let env = launch_env(&secrets, &files.meta, proxy, files.env(api))?;
    let mut child = spawn_command(
        program,
        args,
        env,
        secrets.cwd.as_deref().unwrap_or(&secrets.workspace),
        [Stdio::null(), Stdio::piped(), Stdio::piped()],
    )?;
    drop(secrets);
    tracing::debug!(target: "airlock::phase", "runtime: agent started");
    let agent_group = child
        .id()
        .and_then(|p| rustix::process::Pid::from_raw(i32::try_from(p).ok()?));
    let kill_group = move || {
        if let Some(pgid) = agent_group {
            let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL);
        }
    };
    let heartbeat = heartbeats(reporter.clone(), heartbeat_every);
    let pumps = report_output(&mut child, &reporter);
    let status = tokio::select! {
        status = child.wait() => status.map_err(|source| RuntimeError::Spawn { cmd: program.clone(), source })?,
        () = stop_asked(&mut stop) => {
            // The platform ends the run (a cancel, its timeout): the agent
            // goes now, and what it wrote before is reported below, as at
            // its own end, within the platform's grace.
            tracing::debug!(target: "airlock::phase", "runtime: stop asked");
            kill_group();
            child.wait().await.map_err(|source| RuntimeError::Spawn { cmd: program.clone(), source })?
        }
        _ = parent_gone() => {
            // The platform died (SIGKILL, crash): take the agent down with us.
            kill_group();
            let _ = child.wait().await;
            return Ok(137);
        }
    };
    tracing::debug!(target: "airlock::phase", "runtime: agent exited");
    // Background processes the agent left in its group end with it.
    kill_group();
    for p in pumps {
        let _ = p.await;
    }
    if let Some(out) = &files.outputs {
        // The agent and its group are gone: what it left is read now.
        files::hand_over(&sidecar_dial, &token, files::collect(out)).await;
    }
    heartbeat.abort();
    let exit_code = exit_code(status);
    reporter
        .end(RunEvent::Result {
            at: now_ms(),
            exit_code,
            result: read_result(&files.result),
            checkpoint: None,
        })
        .await;
    tracing::debug!(target: "airlock::phase", "runtime: result delivered");
    Ok(exit_code)
}

/// The agent's files in its workspace (`.airlock/`): the prompt, written
/// before it starts, and where it may leave its result; its input files,
/// placed before it starts, and its output directory.
struct AgentFiles {
    meta: std::path::PathBuf,
    prompt: std::path::PathBuf,
    result: std::path::PathBuf,
    /// The output directory, made before the agent starts.
    outputs: Option<std::path::PathBuf>,
}

impl AgentFiles {
    /// Writes the prompt, and removes a result left from before.
    fn write(secrets: &RuntimeSecrets) -> Result<AgentFiles, RuntimeError> {
        let meta = secrets.workspace.join(".airlock");
        std::fs::create_dir_all(&meta).map_err(RuntimeError::Workspace)?;
        let prompt = meta.join("prompt.txt");
        std::fs::write(&prompt, secrets.prompt.as_deref().unwrap_or(""))
            .map_err(RuntimeError::Workspace)?;
        let result = meta.join("result.json");
        let _ = std::fs::remove_file(&result);
        if let Some(from) = &secrets.inputs {
            files::place_inputs(from, &secrets.workspace).map_err(RuntimeError::Workspace)?;
        }
        let outputs = secrets.outputs.as_ref().map(|o| secrets.workspace.join(o));
        if let Some(out) = &outputs {
            std::fs::create_dir_all(out).map_err(RuntimeError::Workspace)?;
        }
        Ok(AgentFiles {
            meta,
            prompt,
            result,
            outputs,
        })
    }

    /// The agent's own variables: its files, and the local relay `api` as
    /// its MCP and model endpoints (with the placeholder key).
    fn env(&self, api: std::net::SocketAddr) -> Vec<(String, String)> {
        let outputs = self
            .outputs
            .iter()
            .map(|o| ("AIRLOCK_OUTPUT_DIR".to_owned(), o.display().to_string()));
        let mut env = vec![
            (
                "AIRLOCK_PROMPT_FILE".into(),
                self.prompt.display().to_string(),
            ),
            (
                "AIRLOCK_RESULT_FILE".into(),
                self.result.display().to_string(),
            ),
            ("AIRLOCK_MCP_URL".into(), format!("http://{api}/mcp")),
            ("OPENAI_BASE_URL".into(), format!("http://{api}/llm/v1")),
            ("OPENAI_API_KEY".into(), PLACEHOLDER_KEY.into()),
            ("ANTHROPIC_BASE_URL".into(), format!("http://{api}/llm")),
            ("ANTHROPIC_API_KEY".into(), PLACEHOLDER_KEY.into()),
            ("NO_PROXY".into(), "127.0.0.1,localhost".into()),
            ("no_proxy".into(), "127.0.0.1,localhost".into()),
        ];
        env.extend(outputs);
        env
    }
}

/// A heartbeat every `every`, until aborted.
fn heartbeats(reporter: Reporter, every: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            reporter.send(RunEvent::Heartbeat { at: now_ms() });
            tokio::time::sleep(every).await;
        }
    })
}

/// The agent's two streams, line by line, echoed for the operator's live
/// view and reported as log events; one task per stream, ending with it.
fn report_output(
    child: &mut tokio::process::Child,
    reporter: &Reporter,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut pumps = Vec::new();
    for (stream, pipe) in [
        (
            "stdout",
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
        ),
        (
            "stderr",
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
        ),
    ] {
        let Some(pipe) = pipe else { continue };
        let reporter = reporter.clone();
        pumps.push(tokio::spawn(async move {
            // Bounded lines, invalid UTF-8 replaced: binary or endless output
            // never stalls the agent nor grows a buffer without limit.
            let mut pipe = BufReader::new(pipe);
            use airlock_untrusted::terminal;
            while let Ok(Some(line)) = terminal::next_line(&mut pipe, terminal::MAX_LINE).await {
                // Echo for the operator's live view (on stdout, whichever
                // stream: stderr is the runtime's own), then report.
                println!("{line}");
                reporter.send(RunEvent::Log {
                    at: now_ms(),
                    stream: stream.to_owned(),
                    line,
                });
            }
        }));
    }
    pumps
}

/// The agent's result document, if it left one that is JSON. The agent
/// wrote (or replaced) this file: no symlink, no FIFO, bounded.
fn read_result(path: &std::path::Path) -> Option<serde_json::Value> {
    match airlock_untrusted::file::read_file(path, MAX_RESULT_BYTES) {
        Ok(b) => match serde_json::from_slice::<serde_json::Value>(&b) {
            Ok(v) => Some(v),
            Err(e) => {
                eprintln!(
                    "airlock runtime warning: the result file is not JSON ({e}); no result reported"
                );
                None
            }
        },
        Err(airlock_untrusted::file::UntrustedFileError::Io { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            None
        }
        Err(e) => {
            eprintln!("airlock runtime warning: result file refused: {e}");
            None
        }
    }
}

/// What each launcher does first: makes itself non-dumpable (its memory
/// holds a token), and splits its command into program and arguments.
fn harden_and_split(command: &[String]) -> Result<(&String, &[String]), RuntimeError> {
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(|e| RuntimeError::Hardening(e.into()))?;
    command.split_first().ok_or_else(|| RuntimeError::Spawn {
        cmd: String::new(),
        source: std::io::Error::other("empty command"),
    })
}

/// The local relay to the sandbox's forward proxy (the sidecar's, or a
/// runner's own), adding the token the secrets hold; `None` without one.
async fn start_proxy_relay(
    secrets: &RuntimeSecrets,
) -> Result<Option<std::net::SocketAddr>, RuntimeError> {
    let Some(p) = &secrets.proxy else {
        return Ok(None);
    };
    let dial = Dial::resolve(p).await.map_err(RuntimeError::Relay)?;
    relay::proxy_relay(dial, secrets.sidecar_token.clone())
        .await
        .map(Some)
        .map_err(RuntimeError::Relay)
}

/// The transparent plane ([`transparent`]), where the sandbox has one:
/// carried to the launcher's proxy with its token. A plane that cannot
/// start leaves the sandbox as it was without one (tools that ignore the
/// proxy variables cannot connect), with a warning.
async fn start_transparent_plane(secrets: &RuntimeSecrets) {
    let (Some(plane), Some(p)) = (&secrets.transparent, &secrets.proxy) else {
        return;
    };
    let started = match Dial::resolve(p).await {
        Ok(dial) => transparent::start(plane, dial, secrets.sidecar_token.clone()).await,
        Err(e) => Err(e),
    };
    if let Err(e) = started {
        eprintln!("airlock runtime warning: no transparent plane: {e}");
    }
}

/// The environment a launcher gives its command (nothing inherited, no
/// secret): the system's path, the workspace as home, the run's id, then
/// the launcher's `own` variables, the proxy relay as `HTTP(S)_PROXY`, the
/// run CA's trust, and the platform's extra variables (placeholders).
fn launch_env(
    secrets: &RuntimeSecrets,
    meta: &std::path::Path,
    proxy: Option<std::net::SocketAddr>,
    own: Vec<(String, String)>,
) -> Result<Vec<(String, String)>, RuntimeError> {
    let ws = secrets.workspace.display().to_string();
    let mut env: Vec<(String, String)> = vec![
        ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
        ("HOME".into(), ws.clone()),
        ("LANG".into(), "C.UTF-8".into()),
        ("AIRLOCK_RUN_ID".into(), secrets.run_id.clone()),
        ("AIRLOCK_WORKSPACE".into(), ws),
    ];
    env.extend(own);
    if let Some(p) = proxy {
        for k in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
            env.push((k.into(), format!("http://{p}")));
        }
    }
    if let Some(ca) = &secrets.proxy_ca_pem {
        env.extend(trust_run_ca(meta, ca).map_err(RuntimeError::Workspace)?);
    }
    env.extend(secrets.env.iter().cloned());
    Ok(env)
}

/// Starts a launcher's command with `env` only, `stdio` as (stdin,
/// stdout, stderr), in its own process group (so what it leaves behind
/// can be killed with it), killed if dropped.
fn spawn_command(
    program: &str,
    args: &[String],
    env: Vec<(String, String)>,
    cwd: &std::path::Path,
    [stdin, stdout, stderr]: [Stdio; 3],
) -> Result<tokio::process::Child, RuntimeError> {
    tokio::process::Command::new(program)
        .args(args)
        .env_clear()
        .envs(env)
        .current_dir(cwd)
        .stdin(stdin)
        .stdout(stdout)
        .stderr(stderr)
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| RuntimeError::Spawn {
            cmd: program.to_owned(),
            source,
        })
}

fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// Listens for the platform's stop (`SIGTERM`: the sandbox's init passes
/// it on) from the runtime's start, so that a stop that comes before the
/// agent's is not lost; `None` (said) if it cannot be listened for: the
/// sandbox is then killed at the end of the platform's grace.
fn listen_for_stop() -> Option<tokio::signal::unix::Signal> {
    use tokio::signal::unix::{SignalKind, signal};
    signal(SignalKind::terminate())
        .map_err(|e| eprintln!("airlock runtime warning: a stop cannot be listened for: {e}"))
        .ok()
}

/// Resolves when the stop came (never without a listener).
async fn stop_asked(stop: &mut Option<tokio::signal::unix::Signal>) {
    match stop {
        Some(term) => {
            term.recv().await;
        }
        None => std::future::pending().await,
    }
}

/// Resolves when our parent is gone (we were re-parented). As PID 1 of a
/// pid namespace the parent is invisible (0) and this never fires: there the
/// sandbox's own death signal does the job.
async fn parent_gone() {
    let parent = rustix::process::getppid();
    if parent.is_none() {
        return std::future::pending().await;
    }
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        if rustix::process::getppid() != parent {
            return;
        }
    }
}

/// The sidecar starts in parallel with the sandbox. The platform hands the
/// secrets over once it is ready, so the first attempt succeeds; a launcher
/// that handed them earlier is waited for here (up to 30 s, the platform's
/// own patience with a sidecar) until it accepts a connection. Returns where
/// to dial it, and that first connection (a runner's one MCP stream).
pub(crate) async fn wait_for_sidecar(ep: &Endpoint) -> Result<(Dial, relay::Conn), RuntimeError> {
    let down = |why: String| {
        RuntimeError::SidecarDown(match ep {
            Endpoint::Unix(p) => format!("{} ({why})", p.display()),
            Endpoint::Tcp(h) => format!("{h} ({why})"),
        })
    };
    let mut last = String::from("not tried");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while tokio::time::Instant::now() < deadline {
        // A name (docker: `sidecar`) resolves once its container is on the network.
        match Dial::resolve(ep).await {
            Ok(dial) => match dial.connect().await {
                Ok(conn) => return Ok((dial, conn)),
                Err(e) => last = e.to_string(),
            },
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Err(down(last))
}
