//! `airlock demo`: Airlock's main job end to end, on this machine, with
//! nothing to set up. It starts a local example API (which wants a bearer
//! token) and a local fake model provider, stores the demo credential
//! encrypted in a fresh store, and runs the example agent
//! (`examples/demo/agent.py`) in the default backend beside its sidecar.
//! The agent tries five things; the run report and the checks that follow
//! show what got out and what was refused. Everything it prints happened.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use airlock_platform::manifest::Manifest;
use airlock_platform::orchestrator::RunRequest;
use airlock_platform::platform::{Parts, Platform};
use airlock_platform::settings::Settings;
use airlock_platform_api::wire::RunEvent;
use airlock_store::{AuthType, EgressDecision, EgressSource, Store, StoreOptions};
use airlock_vault::Keyring;
use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::json;

const AGENT: &str = include_str!("../../../../examples/demo/agent.py");

pub fn run(backend: Option<String>) -> ExitCode {
    crate::logging::init_quiet();
    let rt = match super::multi_thread_runtime() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(demo(backend)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {}", super::out::error_line(&e));
            ExitCode::from(2)
        }
    }
}

type Handler = Arc<dyn Fn(http::Request<Bytes>) -> http::Response<Full<Bytes>> + Send + Sync>;

async fn serve(ip: std::net::IpAddr, h: Handler) -> Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind((ip, 0)).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let h = h.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let h = h.clone();
                    async move {
                        let (parts, body) = req.into_parts();
                        let body = body
                            .collect()
                            .await
                            .map(|c| c.to_bytes())
                            .unwrap_or_default();
                        Ok::<_, std::convert::Infallible>(h(http::Request::from_parts(parts, body)))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    Ok(addr)
}

fn json_response(status: u16, v: serde_json::Value) -> http::Response<Full<Bytes>> {
    http::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(v.to_string())))
        .unwrap_or_default()
}

async fn demo(backend: Option<String>) -> Result<bool> {
    let home = std::env::temp_dir().join(format!(
        "airlock-demo-{}",
        airlock_vault::random_hex::<4>()?
    ));
    std::fs::create_dir_all(&home)?;
    let result = demo_in(&home, backend).await;
    let _ = std::fs::remove_dir_all(&home);
    result
}

/// Where the example API and the model listen: loopback, where the sidecar
/// is a host process; for the docker backend, this host's address on the
/// shared egress network (the sidecar's container reaches the host there;
/// the agent's container does not).
async fn servers_ip(backend: Option<&str>) -> Result<std::net::IpAddr> {
    let adapter = backend
        .map(str::to_owned)
        .or_else(|| std::env::var("RUN_ADAPTER").ok().filter(|v| !v.is_empty()))
        .unwrap_or_else(|| "auto".into());
    if adapter != "docker" {
        return Ok(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let cfg = airlock_sandbox::docker::DockerConfig::from_env()?;
    let d = airlock_sandbox::docker::connect(&cfg.host).await?;
    Ok(airlock_sandbox::docker::egress_gateway(&d, cfg.egress_subnet).await?)
}

/// The example API and the fake model, and the secrets each wants.
struct Servers {
    api: SocketAddr,
    provider: SocketAddr,
    api_token: String,
    model_key: String,
}

async fn demo_in(home: &std::path::Path, backend: Option<String>) -> Result<bool> {
    let ip = servers_ip(backend.as_deref()).await?;
    let servers = start_servers(ip).await?;
    let key = airlock_vault::random_bytes::<32>()?;
    let keyring = Arc::new(Keyring::new("demo", &key)?);
    let store = Store::open_sqlite(&home.join("airlock.db"), &StoreOptions::default()).await?;
    store_credentials(&store, &keyring, &servers).await?;
    let (agent_dir, manifest_path) = write_agent(home, &servers)?;
    let manifest = Manifest::load(&manifest_path)?;
    eprintln!(
        "Airlock demo: example API on {} (wants a bearer token), fake model on {}.",
        servers.api, servers.provider
    );
    eprintln!(
        "The demo credential and the model key are stored encrypted in {}; the agent gets neither.",
        home.join("airlock.db").display()
    );
    eprintln!("Manifest: {}\n", manifest_path.display());

    let mut vars: std::collections::HashMap<String, String> = std::env::vars().collect();
    // The operator's opt-in for the local example API and fake model (both on
    // loopback, or on this host's egress-network address for docker).
    vars.insert("EGRESS_ALLOW_INTERNAL_HOSTS".into(), ip.to_string());
    let settings = Settings::from_vars(&vars).map_err(|e| anyhow::anyhow!("{e}"))?;
    let backend = airlock_platform::platform::select_backend(backend.as_deref(), &settings)?;
    let platform = Platform::start(Parts {
        home: home.to_owned(),
        store: store.clone(),
        keyring,
        tokens: airlock_platform::platform::ephemeral_tokens()?,
        settings,
        backend,
        sidecar_build: airlock_sidecar::BUILD,
        issuer: None,
    })
    .await?;
    let orch = &platform.orch;
    let progress = super::run::progress_printer(false);
    let outcome = orch
        .run(
            RunRequest {
                org: airlock_store::LOCAL_ORG.to_owned(),
                manifest,
                agent_dir: agent_dir.clone(),
                prompt: Some("Show what Airlock lets out.".into()),
                inputs_dir: None,
                command: None,
                echo: airlock_platform::orchestrator::Echo::LiveView,
            },
            super::run::cancel_on_ctrl_c(),
            &progress,
        )
        .await?;
    super::run::show(
        &super::run::report_of(&store, &outcome.run_id).await?,
        false,
    );
    platform.stop();
    platform.finish_removals().await;
    platform.finish_traces().await;
    check(&store, &outcome, &servers).await
}

async fn start_servers(ip: std::net::IpAddr) -> Result<Servers> {
    let api_token = format!("demo-token-{}", airlock_vault::random_hex::<16>()?);
    let model_key = format!("sk-demo-{}", airlock_vault::random_hex::<16>()?);

    // The example API: answers only with the right bearer token.
    let expected = format!("Bearer {api_token}");
    let api = serve(
        ip,
        Arc::new(move |req: http::Request<Bytes>| {
            let auth = req
                .headers()
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            if auth == expected {
                json_response(
                    200,
                    json!({"user": "demo-user", "authenticated": true, "path": req.uri().path()}),
                )
            } else {
                json_response(401, json!({"error": "missing or wrong token"}))
            }
        }),
    )
    .await?;
    // The fake model provider: OpenAI's chat-completions JSON, usage included.
    let expected_key = format!("Bearer {model_key}");
    let provider = serve(ip, Arc::new(move |req: http::Request<Bytes>| {
        let auth = req.headers().get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("");
        if auth != expected_key {
            return json_response(401, json!({"error": {"message": "invalid api key", "type": "invalid_request_error"}}));
        }
        json_response(200, json!({
            "id": "chatcmpl-demo", "object": "chat.completion", "created": 0, "model": "demo-model",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "Hello, Airlock! (from the local fake model)"}}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 9, "total_tokens": 21}
        }))
    }))
    .await?;
    Ok(Servers {
        api,
        provider,
        api_token,
        model_key,
    })
}

/// The demo's credentials, stored the way a user stores them.
async fn store_credentials(store: &Store, keyring: &Keyring, s: &Servers) -> Result<()> {
    for (name, integration, auth_type, field, value) in [
        ("demo-api", "demo", AuthType::Bearer, "token", &s.api_token),
        (
            "demo-model",
            "openai",
            AuthType::ApiKey,
            "key",
            &s.model_key,
        ),
    ] {
        let fields = [(field.to_owned(), zeroize::Zeroizing::new(value.clone()))]
            .into_iter()
            .collect();
        super::connections::store_connection(store, keyring, name, integration, auth_type, &fields)
            .await?;
    }
    Ok(())
}

/// The demo agent and its manifest, in `home/agent`.
fn write_agent(
    home: &std::path::Path,
    s: &Servers,
) -> Result<(std::path::PathBuf, std::path::PathBuf)> {
    let (api, provider) = (s.api, s.provider);
    let agent_dir = home.join("agent");
    std::fs::create_dir_all(&agent_dir)?;
    std::fs::write(agent_dir.join("agent.py"), AGENT)?;
    let manifest_text = format!(
        r#"[agent]
name = "demo"
command = ["/usr/bin/env", "DEMO_API_URL=http://{api}", "python3", "agent.py"]
timeout = 60
memory_mb = 512
cpus = 1

[model]
provider = "openai"
base_url = "http://{provider}/v1"
connection = "demo-model"
price_in_per_mtok_usd = 2.5
price_out_per_mtok_usd = 10.0

[network]
egress = "public"

[[integrations]]
namespace = "demo"
connection = "demo-api"
authorized_uris = ["http://{api}/**"]
delivery = {{ header = "Authorization", prefix = "Bearer ", field = "token" }}
"#
    );
    let manifest_path = agent_dir.join("airlock.toml");
    std::fs::write(&manifest_path, &manifest_text)?;
    Ok((agent_dir, manifest_path))
}

/// The checks: what the store recorded of the demo's run, compared with
/// what should have happened.
async fn check(
    store: &Store,
    outcome: &airlock_platform::orchestrator::RunOutcome,
    s: &Servers,
) -> Result<bool> {
    let (api, api_token, model_key) = (s.api, &s.api_token, &s.model_key);
    let egress = store.list_egress(&outcome.run_id, 10_000).await?;
    let run = store
        .get_run(&outcome.run_id)
        .await?
        .context("run missing")?;
    let mut logs = String::new();
    let mut after = 0;
    loop {
        let page = store.list_events(&outcome.run_id, after, 500).await?;
        let Some(last) = page.last() else { break };
        after = last.id;
        for e in &page {
            if let Ok(RunEvent::Log { line, .. }) = serde_json::from_str::<RunEvent>(&e.payload) {
                logs.push_str(&line);
                logs.push('\n');
            }
        }
    }
    let api_host = api.to_string();
    let checks = [
        ("the run succeeded", outcome.status.as_str() == "succeeded"),
        (
            "(a) api_call reached the example API with the credential injected (HTTP 200)",
            egress.iter().any(|e| {
                e.source == EgressSource::ApiCall
                    && e.decision == EgressDecision::Allowed
                    && e.status == Some(200)
                    && e.url.contains(&api_host)
            }),
        ),
        (
            "(b) sending the credential to another host was refused",
            egress.iter().any(|e| {
                e.source == EgressSource::ApiCall
                    && e.decision == EgressDecision::Refused
                    && e.host.contains("evil.example")
            }),
        ),
        (
            "(c) the cloud metadata address was refused by the proxy",
            egress.iter().any(|e| {
                e.source == EgressSource::Proxy
                    && e.decision == EgressDecision::Refused
                    && e.host.contains("169.254.169.254")
            }),
        ),
        (
            "(d) a direct connection to the host found no route",
            logs.contains("(d) connect straight to a host server: no route"),
        ),
        (
            "(e) the model answered through the relay and its usage was metered",
            logs.contains("Hello, Airlock!") && run.tokens_in == 12 && run.tokens_out == 9,
        ),
        (
            "the agent's output never contained the API token or the model key",
            !logs.contains(api_token.as_str()) && !logs.contains(model_key.as_str()),
        ),
    ];
    eprintln!("\nDemo checks (from the store's records of this run):");
    let mut all = true;
    for (what, ok) in checks {
        eprintln!("  {} {what}", if ok { "✓" } else { "✗" });
        all &= ok;
    }
    if !all && outcome.backend == "process" {
        eprintln!("  (the process backend isolates nothing, so (d) cannot hold there)");
    }
    if !all {
        bail!("some demo checks failed");
    }
    Ok(all)
}
