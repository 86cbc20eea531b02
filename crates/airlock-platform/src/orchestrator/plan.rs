//! A run's plan: everything it is started with — what it may fetch from the
//! platform (its grant), its sidecar's configuration, the runtime's secrets,
//! the specs of its sandbox and of each local runner's — decided from the
//! manifest, the operator's settings and where the backend puts things.
//!
//! Building a plan is pure: no file, process, clock or random source is
//! touched ([`Keys::mint`] draws the run's secrets before; the start makes
//! the directories the plan names). Model: firecracker's jailer, which
//! builds its `Env` whole before it runs anything.

use std::path::{Path, PathBuf};
use std::time::Duration;

use airlock_platform_api::launch;
use airlock_platform_api::transparent::TransparentPlane;
use airlock_platform_api::types::NetworkEgress;
use airlock_sandbox::{RunPaths, SandboxKind, SandboxSpec, SidecarPlacement, SidecarSpec};
use airlock_vault::{RunTokens, SecretString};

use super::error::RunError;
use super::request::{Echo, RunRequest};
use crate::identity::IdentityGrant;
use crate::internal_api::Grant;
use crate::manifest::{Inject, IntegrationSection, Manifest};
use crate::settings::Settings;

/// In a runner's sockets' directory: its MCP stream and its proxy.
pub const RUNNER_MCP_SOCKET: &str = "mcp.sock";
pub const RUNNER_PROXY_SOCKET: &str = "proxy.sock";

/// The grant's key of the model's connection.
pub use airlock_platform_api::wire::MODEL_CREDENTIAL as MODEL_GRANT;

/// The `PATH` of every sandbox.
const SANDBOX_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// The most processes a sandbox may hold.
const PIDS_MAX: u64 = 256;

/// The secrets of one run, drawn before its plan is built.
pub struct Keys {
    /// What the runtime shows the sidecar.
    pub sidecar_token: SecretString,
    /// What the sidecar shows the platform.
    pub run_token: SecretString,
    /// What each local runner shows the sidecar, in the manifest's order.
    pub runner_tokens: Vec<SecretString>,
    /// The run's own CA, when an integration asks for the intercepting
    /// proxy: its key goes to the sidecar, its certificate to the
    /// sandboxes, and neither is kept here.
    pub proxy_ca: Option<launch::ProxyCa>,
}

impl Keys {
    /// Draws the secrets run `run_id` of `m` needs.
    pub fn mint(run_id: &str, m: &Manifest, tokens: &RunTokens) -> Result<Keys, RunError> {
        let token = || airlock_vault::generate_sidecar_token().map_err(RunError::Token);
        Ok(Keys {
            sidecar_token: token()?,
            run_token: tokens.issue(run_id),
            runner_tokens: local_runners(m)
                .map(|_| token())
                .collect::<Result<Vec<_>, RunError>>()?,
            proxy_ca: match needs_proxy_ca(m) {
                true => Some(crate::proxy_ca::generate(run_id)?),
                false => None,
            },
        })
    }
}

/// Whether a run of `m` has its own CA: an integration injects through
/// the intercepting proxy, or has a local runner (whose proxy is one), or
/// `[network]` has rules (a run without any has no CA).
pub fn needs_proxy_ca(m: &Manifest) -> bool {
    m.integrations
        .iter()
        .any(|i| i.inject == Some(Inject::Proxy) || i.local_command().is_some())
        || network_has_rules(m)
}

/// Whether `[network]` has L7 rules: the agent then trusts the run's CA,
/// whether a rule must see inside its HTTPS requests from the start or
/// only after a person narrows one live (docs/egress.md, "Live policy").
/// Which CONNECTs are intercepted is the sidecar's decision, per host,
/// under the rules live at the time: a host whose rules need not see
/// inside keeps its plain tunnel.
fn network_has_rules(m: &Manifest) -> bool {
    m.network
        .as_ref()
        .is_some_and(|n| !n.rules.compiled().is_empty())
}

/// The integrations of `m` with a local runner: their index in the
/// manifest, the integration, its command.
fn local_runners(m: &Manifest) -> impl Iterator<Item = (usize, &IntegrationSection, &[String])> {
    m.integrations
        .iter()
        .enumerate()
        .filter_map(|(n, i)| i.local_command().map(|c| (n, i, c)))
}

/// Where a run happens: its directory, where the backend puts its sandbox's
/// view and its sidecar, and the programs and logs of its processes.
pub struct Site<'a> {
    pub run_id: &'a str,
    /// The platform's directory of the run (`runs/<id>`).
    pub run_dir: &'a Path,
    pub paths: &'a RunPaths,
    pub placement: &'a SidecarPlacement,
    /// The `airlock` binary on the host, and as the sandbox sees it.
    pub exe: &'a Path,
    pub runtime_exe: &'a Path,
    /// `airlock-sidecar` of the same build, when there is one.
    pub sidecar_exe: Option<&'a Path>,
    /// The platform's internal-API socket on the host.
    pub api_socket: &'a Path,
    /// The run's organization has model budgets (or they could not be
    /// read): the sidecar reserves each model call with the platform.
    pub org_budget: bool,
    /// The upstream proxy the run's sidecar dials through (`None`:
    /// direct): `PROXY_URL`, or the organization's `SYSTEM_PROXIES` choice
    /// ([`crate::proxies::RunProxy::choose`]).
    pub proxy_url: Option<&'a secrecy::SecretString>,
    /// The run is traced: its sidecar times its steps of each request.
    pub traced: bool,
    /// `AIRLOCK_LOG` of the runtime and of the sidecar.
    pub runtime_log: &'a str,
    pub sidecar_log: &'a str,
    /// The model registry's prices for the run's model provider.
    pub known_prices: &'a [launch::ModelPrice],
    /// The backend's sandboxes are ready for the transparent plane
    /// ([`airlock_sandbox::Backend::transparent_plane`]): the runtimes are
    /// told to serve it.
    pub transparent_plane: bool,
}

/// One local MCP runner of a run.
pub struct RunnerPlan {
    pub namespace: String,
    /// Its sockets' directory on the host (seen by its sandbox only, and by
    /// the sidecar at [`launch::Runner`]'s endpoints).
    pub dir: PathBuf,
    pub spec: SandboxSpec,
}

/// Everything a run is started with.
pub struct RunPlan {
    /// What the run may fetch from the platform.
    pub grant: Grant,
    /// The sidecar (its configuration on its stdin).
    pub sidecar: SidecarSpec,
    /// The agent's sandbox (the runtime's secrets on its stdin, held back
    /// until the sidecar is ready).
    pub sandbox: SandboxSpec,
    pub runners: Vec<RunnerPlan>,
    /// The unix sockets the sidecar makes on the host, opened to the
    /// sandboxes' uids once it is ready.
    pub sockets: Vec<PathBuf>,
    /// The run's timeout, in seconds (within the operator's ceiling).
    pub timeout_secs: u64,
    /// The prefix of the platform's own lines about this run
    /// ([`Echo::Tagged`]); `None`: the live view.
    pub tag: Option<String>,
}

impl RunPlan {
    /// The plan of `req` as run `site.run_id`, with the secrets `keys`.
    pub fn build(
        req: &RunRequest,
        settings: &Settings,
        site: &Site<'_>,
        keys: Keys,
    ) -> Result<RunPlan, RunError> {
        let m = &req.manifest;
        let (memory_mb, cpus, timeout_secs) =
            settings.effective(m.agent.memory_mb, m.agent.cpus, m.agent.timeout);
        let proxy_ca_pem = keys.proxy_ca.as_ref().map(|c| c.cert_pem.clone());
        let runners = runner_listeners(m, site, &keys.runner_tokens);
        let sandbox = SandboxSpec {
            run_id: site.run_id.to_owned(),
            command: runtime_command(site.runtime_exe, "runtime", agent_command(req)),
            env: vec![
                ("PATH".into(), SANDBOX_PATH.into()),
                ("AIRLOCK_LOG".into(), site.runtime_log.to_owned()),
            ],
            stdin: agent_secrets(req, settings, site, &keys, proxy_ca_pem.as_deref()).to_json(),
            // Released once the sidecar is ready: the runtime's first
            // connection to it succeeds, and a run whose sidecar never came
            // up never hands the runtime its secrets.
            hold_stdin: true,
            sockets_dir: site.paths.sockets_host.clone(),
            // The agent's directory (and its run's inputs): the binary is
            // the backend's to provide.
            ro_paths: std::iter::once(req.agent_dir.clone())
                .chain(req.inputs_dir.clone())
                .collect(),
            workspace: site.paths.workspace.clone(),
            workspace_size_mb: settings.workspace_tmpfs_mb,
            memory_mb,
            cpus,
            pids_max: PIDS_MAX,
            kind: SandboxKind::Agent,
        };
        let runner_plans = runners
            .iter()
            .map(|r| r.plan(req, settings, site, &sandbox, proxy_ca_pem.as_deref()))
            .collect();
        let config = sidecar_config(m, settings, site, keys, &runners)?;
        let sockets = site
            .placement
            .host_sockets
            .iter()
            .cloned()
            .chain(
                runners
                    .iter()
                    .flat_map(|r| [RUNNER_MCP_SOCKET, RUNNER_PROXY_SOCKET].map(|s| r.dir.join(s))),
            )
            .collect();
        Ok(RunPlan {
            grant: grant(req, settings, Duration::from_secs(timeout_secs)),
            sidecar: SidecarSpec {
                run_id: site.run_id.to_owned(),
                exe: site.exe.to_owned(),
                own_binary: site.sidecar_exe.map(Path::to_path_buf),
                log: site.sidecar_log.to_owned(),
                config: config.to_json(),
                platform_socket: site.api_socket.to_owned(),
                egress_journal: crate::journal::path_in(site.run_dir),
                sockets_dir: site.paths.sockets_host.clone(),
                runner_dirs: runners
                    .iter()
                    .map(|r| (r.dir.clone(), r.inside.clone()))
                    .collect(),
            },
            sandbox,
            runners: runner_plans,
            sockets,
            timeout_secs,
            tag: match req.echo {
                Echo::LiveView => None,
                Echo::Tagged => Some(format!("[run {} org {}] ", site.run_id, req.org)),
            },
        })
    }
}

/// What a run of `req` may fetch from the platform: the connection of each
/// integration that names one, the model's, and an identity token (living
/// no longer than `timeout`) for each integration whose delivery names it.
fn grant(req: &RunRequest, settings: &Settings, timeout: Duration) -> Grant {
    let m = &req.manifest;
    let mut grant = Grant {
        org: req.org.clone(),
        agent: m.agent.name.to_string(),
        connections: Default::default(),
        identity: IdentityGrant {
            audiences: Default::default(),
            timeout,
        },
        model: m
            .model
            .as_ref()
            .map(|model| crate::internal_api::ModelGrant {
                provider: model.provider,
                system_key: settings.system_provider_keys.get(model.provider).cloned(),
            }),
    };
    for i in &m.integrations {
        if let Some(c) = &i.connection {
            grant
                .connections
                .insert(i.namespace.to_string(), c.to_string());
        }
        if let Some(d) = i.delivery.as_ref().filter(|d| d.names_identity()) {
            grant
                .identity
                .audiences
                .insert(i.namespace.to_string(), d.identity_audience().to_owned());
        }
    }
    if let Some(c) = m.model.as_ref().and_then(|model| model.connection.as_ref()) {
        grant.connections.insert(MODEL_GRANT.into(), c.to_string());
    }
    grant
}

/// The agent's command: the request's, else the manifest's.
fn agent_command(req: &RunRequest) -> Vec<String> {
    req.command
        .clone()
        .unwrap_or_else(|| req.manifest.agent.command.clone())
}

/// `airlock <launcher> -- COMMAND…` as the sandbox runs it.
fn runtime_command(runtime_exe: &Path, launcher: &str, command: Vec<String>) -> Vec<String> {
    let mut argv = vec![
        runtime_exe.display().to_string(),
        launcher.into(),
        "--".into(),
    ];
    argv.extend(command);
    argv
}

/// The agent runtime's secrets: where its sidecar is, its token, and the
/// placeholders (and CA) of the integrations it may use through the proxy.
fn agent_secrets(
    req: &RunRequest,
    settings: &Settings,
    site: &Site<'_>,
    keys: &Keys,
    proxy_ca_pem: Option<&str>,
) -> launch::RuntimeSecrets {
    let intercepted: Vec<&IntegrationSection> = req
        .manifest
        .integrations
        .iter()
        .filter(|i| i.inject == Some(Inject::Proxy))
        .collect();
    launch::RuntimeSecrets {
        run_id: site.run_id.to_owned(),
        sidecar: site.placement.reach.0.clone(),
        proxy: Some(site.placement.reach.1.clone()),
        sidecar_token: keys.sidecar_token.clone(),
        heartbeat_interval_secs: settings.heartbeat_interval_secs,
        workspace: site.paths.workspace.clone(),
        cwd: Some(req.agent_dir.clone()),
        prompt: req.prompt.clone(),
        env: intercepted
            .iter()
            .map(|i| {
                let p = launch::placeholder(i.namespace.as_str());
                (p.clone(), p)
            })
            .collect(),
        proxy_ca_pem: proxy_ca_pem
            .filter(|_| !intercepted.is_empty() || network_has_rules(&req.manifest))
            .map(str::to_owned),
        inputs: req.inputs_dir.clone(),
        outputs: req.manifest.agent.outputs.clone(),
        transparent: site.transparent_plane.then(|| {
            let network = match &req.manifest.network {
                Some(n) => match &n.egress {
                    NetworkEgress::Allow(patterns) => patterns.as_slice(),
                    NetworkEgress::Public | NetworkEgress::None => &[],
                },
                None => &[],
            };
            let integrations = intercepted.iter().flat_map(|i| &i.authorized_uris);
            TransparentPlane::with_ports(named_ports(network.iter().chain(integrations)))
        }),
    }
}

/// The ports `patterns` name other than their schemes' defaults: the
/// transparent plane carries them beside 80 and 443.
fn named_ports<'p>(patterns: impl Iterator<Item = &'p String>) -> impl Iterator<Item = u16> {
    patterns.filter_map(|p| airlock_egress::UriPattern::parse(p).ok()?.exact_port())
}

/// One local runner, as the sidecar is told of it.
struct RunnerListener<'m> {
    namespace: &'m str,
    command: &'m [String],
    /// Its integration's `authorized_uris` (the ports its plane carries).
    authorized_uris: &'m [String],
    credentialed: bool,
    /// Its sandbox's id (its cgroup and host uid derive from it).
    sandbox_id: String,
    /// Its sockets' directory on the host…
    dir: PathBuf,
    /// …and as the sidecar sees it.
    inside: PathBuf,
    listen: launch::Runner,
}

/// Each local runner: its sockets' directory (seen only by its own
/// sandbox), its token, and where the sidecar listens for it.
fn runner_listeners<'m>(
    m: &'m Manifest,
    site: &Site<'_>,
    tokens: &[SecretString],
) -> Vec<RunnerListener<'m>> {
    local_runners(m)
        .zip(tokens)
        .map(|((n, i, command), token)| {
            let dir = site.run_dir.join(format!("runner-{n}"));
            let inside = site.placement.runner_dir(&dir);
            RunnerListener {
                namespace: i.namespace.as_str(),
                command,
                authorized_uris: &i.authorized_uris,
                credentialed: i.connection.is_some(),
                sandbox_id: format!("{}-r{n}", site.run_id),
                listen: launch::Runner {
                    mcp: launch::Endpoint::Unix(inside.join(RUNNER_MCP_SOCKET)),
                    proxy: launch::Endpoint::Unix(inside.join(RUNNER_PROXY_SOCKET)),
                    token: token.clone(),
                },
                dir,
                inside,
            }
        })
        .collect()
}

impl RunnerListener<'_> {
    /// Its sandbox beside the agent's: its own sockets (its MCP stream and
    /// its proxy), its own uid and cgroup, the agent's limits.
    fn plan(
        &self,
        req: &RunRequest,
        settings: &Settings,
        site: &Site<'_>,
        agent: &SandboxSpec,
        proxy_ca_pem: Option<&str>,
    ) -> RunnerPlan {
        let ph = launch::placeholder(self.namespace);
        let secrets = launch::RuntimeSecrets {
            run_id: site.run_id.to_owned(),
            sidecar: launch::Endpoint::Unix(site.paths.sockets.join(RUNNER_MCP_SOCKET)),
            proxy: Some(launch::Endpoint::Unix(
                site.paths.sockets.join(RUNNER_PROXY_SOCKET),
            )),
            sidecar_token: self.listen.token.clone(),
            heartbeat_interval_secs: settings.heartbeat_interval_secs,
            workspace: site.paths.workspace.clone(),
            cwd: Some(req.agent_dir.clone()),
            prompt: None,
            env: match self.credentialed {
                true => vec![(ph.clone(), ph)],
                false => vec![],
            },
            proxy_ca_pem: proxy_ca_pem.map(str::to_owned),
            inputs: None,
            outputs: None,
            transparent: site
                .transparent_plane
                .then(|| TransparentPlane::with_ports(named_ports(self.authorized_uris.iter()))),
        };
        RunnerPlan {
            namespace: self.namespace.to_owned(),
            dir: self.dir.clone(),
            spec: SandboxSpec {
                run_id: self.sandbox_id.clone(),
                command: runtime_command(site.runtime_exe, "runner", self.command.to_vec()),
                stdin: secrets.to_json(),
                sockets_dir: self.dir.clone(),
                kind: SandboxKind::Runner {
                    run: site.run_id.to_owned(),
                },
                ..agent.clone()
            },
        }
    }
}

/// The sidecar's configuration: its tokens, where it listens, each
/// integration as the manifest says it, the model, the egress policy.
fn sidecar_config(
    m: &Manifest,
    settings: &Settings,
    site: &Site<'_>,
    keys: Keys,
    runners: &[RunnerListener<'_>],
) -> Result<launch::SidecarConfig, RunError> {
    let placement = site.placement;
    Ok(launch::SidecarConfig {
        run_id: site.run_id.to_owned(),
        sidecar_token: keys.sidecar_token,
        run_token: keys.run_token,
        platform_socket: placement.platform_socket.clone(),
        listen: launch::Listen::from_endpoints(&placement.listen.0, &placement.listen.1)?,
        integrations: m
            .integrations
            .iter()
            .map(|i| launch_integration(i, runners))
            .collect(),
        model: m.model.as_ref().map(|x| launch::Model {
            provider: x.provider,
            base_url: x.base_url.clone(),
            price_in_per_mtok_usd: x.price_in_per_mtok_usd,
            price_out_per_mtok_usd: x.price_out_per_mtok_usd,
            provider_tools: x.provider_tools.clone(),
            provider_fetch_uris: x.provider_fetch_uris.clone(),
            known_prices: site.known_prices.to_vec(),
        }),
        network: launch::Network {
            egress: m
                .network
                .as_ref()
                .map(|n| n.egress.clone())
                .unwrap_or(NetworkEgress::None),
            rules: m
                .network
                .as_ref()
                .map(|n| n.rules.clone())
                .unwrap_or_default(),
        },
        egress: launch::EgressSettings {
            allow_internal_hosts: settings.allow_internal_hosts.clone(),
            dns_server: settings.dns_server.clone(),
            resolve: settings.resolve.clone(),
            extra_ca_pem: settings.extra_ca_pem.clone(),
            blocked_names: placement.blocked_names.clone(),
        },
        limits: launch::Limits::default(),
        proxy_url: site.proxy_url.cloned(),
        // The platform's file in the run's directory (never in the
        // sandbox's view), as the sidecar sees it.
        egress_journal: Some(
            placement
                .egress_journal_inside
                .clone()
                .unwrap_or_else(|| crate::journal::path_in(site.run_dir)),
        ),
        proxy_ca: keys.proxy_ca,
        budget: airlock_platform_api::budget::RunBudget {
            run: settings.run_budget(m.budget.as_ref()),
            org: site.org_budget,
            default_max_output_tokens: m
                .budget
                .as_ref()
                .and_then(|b| b.default_max_tokens)
                .unwrap_or(0),
        },
        trace_steps: site.traced,
    })
}

/// One integration of the manifest in the launch contract.
fn launch_integration(
    i: &IntegrationSection,
    runners: &[RunnerListener<'_>],
) -> launch::Integration {
    launch::Integration {
        namespace: i.namespace.clone(),
        authorized_uris: i.authorized_uris.clone(),
        allow_all_uris: i.allow_all_uris,
        rules: i.rules.clone(),
        live_rules: None,
        tools: i.tools.clone(),
        has_connection: i.carries_credential(),
        delivery: i.delivery.clone(),
        mcp_url: i.remote_mcp_url().map(str::to_owned),
        inject_proxy: i.inject == Some(Inject::Proxy),
        runner: runners
            .iter()
            .find(|r| r.namespace == i.namespace.as_str())
            .map(|r| r.listen.clone()),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use airlock_vault::ExposeSecret;

    use super::*;

    const MODEL: &str = "[model]\nprovider = \"anthropic\"\nbase_url = \"https://api.anthropic.com\"\nconnection = \"anthropic\"\n";
    const PROXIED: &str = "[[integrations]]\nnamespace = \"gh\"\nconnection = \"gh-token\"\n\
        authorized_uris = [\"https://api.github.com/**\"]\ninject = \"proxy\"\n\
        delivery = { header = \"Authorization\", prefix = \"Bearer \", field = \"token\" }\n";
    const RUNNERS: &str = "[[integrations]]\nnamespace = \"open\"\nauthorized_uris = [\"https://example.com/**\"]\n\
        [[integrations]]\nnamespace = \"local\"\nsource = { kind = \"local\", command = [\"srv\", \"--stdio\"] }\n";

    /// A run whose `[network]` has rules has its own CA, the agent trusting
    /// it: a rule that must see inside now needs it, and so does a `full`
    /// rule a person may narrow live. A run without rules has none.
    #[test]
    fn network_rules_make_a_ca_and_no_rules_none() {
        let net = |rule: &str| {
            request(
                &format!(
                    "[network]\negress = \"public\"\n[[network.rules]]\nhost = \"https://pypi.org\"\n{rule}\n"
                ),
                Echo::LiveView,
            )
        };
        // Each rule: one that sees inside now, and `full` on every path,
        // which a person may narrow live. The agent trusts the CA its proxy
        // presents.
        for rule in [
            "access = \"read-only\"",
            "access = \"full\"\npaths = [\"/simple/**\"]",
            "access = \"full\"\nquery = \"none\"",
            "access = \"full\"",
        ] {
            let req = net(rule);
            assert!(needs_proxy_ca(&req.manifest), "{rule}");
            let p = plan(&req, &settings(&[]));
            let ca = config(&p)
                .proxy_ca
                .unwrap_or_else(|| panic!("{rule}: the run's CA goes to the sidecar"));
            assert_eq!(
                secrets(&p.sandbox).proxy_ca_pem.as_deref(),
                Some(ca.cert_pem.as_str()),
                "{rule}: the agent trusts the CA its proxy presents"
            );
        }
        assert!(!needs_proxy_ca(
            &request("[network]\negress = \"public\"\n", Echo::LiveView).manifest
        ));
    }

    fn request(manifest: &str, echo: Echo) -> RunRequest {
        let text =
            format!("[agent]\nname = \"planned\"\ncommand = [\"/bin/agent\", \"go\"]\n{manifest}");
        RunRequest {
            org: "org_1".into(),
            manifest: Manifest::parse(&text).expect("manifest"),
            agent_dir: "/srv/agent".into(),
            prompt: Some("hello".into()),
            inputs_dir: None,
            command: None,
            echo,
        }
    }

    fn settings(pairs: &[(&str, &str)]) -> Settings {
        let vars: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Settings::from_vars(&vars).expect("settings")
    }

    fn keys(req: &RunRequest) -> Keys {
        let token = |c: char| SecretString::from(c.to_string().repeat(64));
        Keys {
            sidecar_token: token('s'),
            run_token: SecretString::from("run_1.MAC".to_owned()),
            runner_tokens: local_runners(&req.manifest)
                .map(|(n, ..)| token(char::from(b'a' + u8::try_from(n).unwrap_or(0))))
                .collect(),
            proxy_ca: needs_proxy_ca(&req.manifest)
                .then(|| crate::proxy_ca::generate("run_1").expect("CA")),
        }
    }

    /// The plan of `req` on the host placement (the process and namespace
    /// backends'), in `/home/a/runs/run_1`.
    fn plan(req: &RunRequest, settings: &Settings) -> RunPlan {
        let run_dir = Path::new("/home/a/runs/run_1");
        let paths = RunPaths {
            sockets_host: run_dir.join("sockets"),
            sockets: "/run/airlock".into(),
            workspace: "/workspace".into(),
        };
        let placement =
            airlock_sandbox::host_sidecar_placement(&paths, Path::new("/home/a/sockets/p.sock"));
        let site = Site {
            run_id: "run_1",
            run_dir,
            paths: &paths,
            placement: &placement,
            exe: Path::new("/usr/bin/airlock"),
            runtime_exe: Path::new("/.airlock/airlock"),
            sidecar_exe: None,
            api_socket: Path::new("/home/a/sockets/p.sock"),
            runtime_log: "warn",
            sidecar_log: "info",
            org_budget: false,
            proxy_url: settings.proxy_url.as_ref(),
            known_prices: &[],
            transparent_plane: true,
            traced: false,
        };
        RunPlan::build(req, settings, &site, keys(req)).expect("plan")
    }

    fn secrets(spec: &SandboxSpec) -> launch::RuntimeSecrets {
        launch::RuntimeSecrets::from_json(&spec.stdin).expect("runtime secrets")
    }

    fn config(plan: &RunPlan) -> launch::SidecarConfig {
        launch::SidecarConfig::from_json(&plan.sidecar.config).expect("sidecar config")
    }

    #[test]
    fn the_sidecar_keeps_the_manifests_budget_within_the_ceilings() {
        let bare = config(&plan(&request("", Echo::LiveView), &settings(&[])));
        assert!(
            !bare.budget.enforced(),
            "no budget: the relay reserves nothing"
        );
        let req = request(
            &format!(
                "{MODEL}price_in_per_mtok_usd = 3.0\n[budget]\ntokens = 90000\ncost_usd = 0.75\ndefault_max_tokens = 256\n"
            ),
            Echo::LiveView,
        );
        let c = config(&plan(
            &req,
            &settings(&[(
                "PLATFORM_RUN_LIMITS",
                r#"{"run_tokens_ceiling": 50000, "run_requests_ceiling": 20}"#,
            )]),
        ));
        assert_eq!(
            c.budget.run,
            airlock_platform_api::budget::Limits {
                tokens: Some(50000),
                cost_microusd: Some(750_000),
                requests: Some(20),
            }
        );
        assert_eq!(c.budget.default_output(), 256);
        assert!(!c.budget.org, "the organization has no budget");
    }

    #[test]
    fn a_bare_agent_gets_a_sandbox_a_sidecar_and_nothing_else() {
        let req = request("", Echo::LiveView);
        let p = plan(&req, &settings(&[]));
        assert!(p.grant.connections.is_empty());
        assert_eq!(
            (p.grant.org.as_str(), p.grant.agent.as_str()),
            ("org_1", "planned")
        );
        assert_eq!(
            p.sandbox.command,
            ["/.airlock/airlock", "runtime", "--", "/bin/agent", "go"]
        );
        assert!(p.sandbox.hold_stdin, "the secrets wait for the sidecar");
        assert_eq!(p.sandbox.kind, SandboxKind::Agent);
        assert_eq!(p.sandbox.ro_paths, [PathBuf::from("/srv/agent")]);
        assert_eq!(
            p.sandbox.sockets_dir,
            Path::new("/home/a/runs/run_1/sockets")
        );
        assert!(
            p.sandbox
                .env
                .contains(&("AIRLOCK_LOG".into(), "warn".into()))
        );
        let s = secrets(&p.sandbox);
        assert_eq!(s.prompt.as_deref(), Some("hello"));
        assert_eq!(s.sidecar_token.expose_secret(), "s".repeat(64));
        assert!(s.env.is_empty() && s.proxy_ca_pem.is_none());
        let c = config(&p);
        assert_eq!(c.run_token.expose_secret(), "run_1.MAC");
        assert!(c.integrations.is_empty() && c.model.is_none() && c.proxy_ca.is_none());
        assert_eq!(c.network.egress, NetworkEgress::None);
        assert_eq!(
            c.egress_journal.as_deref(),
            Some(crate::journal::path_in(Path::new("/home/a/runs/run_1")).as_path())
        );
        assert_eq!(p.sidecar.log, "info");
        assert!(p.runners.is_empty() && p.sidecar.runner_dirs.is_empty());
        assert_eq!(
            p.sockets,
            [
                PathBuf::from("/home/a/runs/run_1/sockets").join(airlock_sandbox::SIDECAR_SOCKET),
                PathBuf::from("/home/a/runs/run_1/sockets").join(airlock_sandbox::PROXY_SOCKET),
            ]
        );
        assert_eq!(p.tag, None);
    }

    #[test]
    fn the_transparent_plane_carries_80_443_and_the_ports_the_rules_name() {
        let req = request(
            "[network]\negress = [\"https://a.example:8443/**\", \"http://b.example:80/**\", \"https://c.example:*/**\"]\n",
            Echo::LiveView,
        );
        let s = secrets(&plan(&req, &settings(&[])).sandbox);
        let plane = s.transparent.expect("the backend has the plane");
        assert_eq!(plane.ports, [80, 443, 8443]);
    }

    #[test]
    fn limits_are_the_manifests_within_the_operators_ceilings() {
        let req = request("", Echo::Tagged);
        let mut req = RunRequest {
            command: Some(vec!["/bin/other".into()]),
            ..req
        };
        req.manifest.agent.memory_mb = Some(4096);
        req.manifest.agent.timeout = Some(60);
        let p = plan(
            &req,
            &settings(&[(
                "PLATFORM_RUN_LIMITS",
                "{\"agent_memory_ceiling_mb\": 1024, \"agent_cpu_ceiling\": 0.5}",
            )]),
        );
        assert_eq!((p.sandbox.memory_mb, p.sandbox.cpus), (1024, 0.5));
        assert_eq!(p.timeout_secs, 60);
        assert_eq!(p.sandbox.command[3..], ["/bin/other"]);
        assert_eq!(p.tag.as_deref(), Some("[run run_1 org org_1] "));
    }

    #[test]
    fn connections_are_granted_and_a_proxied_integration_gets_its_placeholder_and_ca() {
        let req = request(&format!("{MODEL}{PROXIED}"), Echo::LiveView);
        let p = plan(&req, &settings(&[]));
        assert_eq!(p.grant.connections.len(), 2);
        assert_eq!(p.grant.connections["gh"], "gh-token");
        assert_eq!(p.grant.connections[MODEL_GRANT], "anthropic");
        let s = secrets(&p.sandbox);
        let ph = launch::placeholder("gh");
        assert_eq!(s.env, [(ph.clone(), ph)]);
        let c = config(&p);
        let ca = c
            .proxy_ca
            .as_ref()
            .expect("the run's CA goes to the sidecar");
        assert_eq!(s.proxy_ca_pem.as_deref(), Some(ca.cert_pem.as_str()));
        assert!(c.integrations[0].inject_proxy && c.integrations[0].has_connection);
        assert_eq!(
            c.model.as_ref().map(|m| m.base_url.as_str()),
            Some("https://api.anthropic.com")
        );
    }

    /// An integration whose delivery names `${airlock.identity}` carries a
    /// credential without a connection; its grant holds the audience and the
    /// run's timeout, which no token outlives.
    #[test]
    fn an_identity_delivery_is_granted_its_audience_within_the_runs_timeout() {
        let m = "timeout = 42\n[[integrations]]\nnamespace = \"aws\"\n\
                 authorized_uris = [\"https://sts.amazonaws.com/**\"]\n\
                 delivery = { header = \"Authorization\", field = \"${airlock.identity}\", audience = \"a\" }\n";
        let req = request(m, Echo::LiveView);
        let p = plan(&req, &settings(&[]));
        assert!(p.grant.connections.is_empty());
        assert_eq!(p.grant.identity.audiences["aws"], "a");
        assert_eq!(p.grant.identity.timeout, Duration::from_secs(42));
        let c = config(&p);
        assert!(
            c.integrations[0].has_connection,
            "its calls carry a credential"
        );
        let bare = plan(&request("", Echo::LiveView), &settings(&[]));
        assert!(bare.grant.identity.audiences.is_empty());
    }

    #[test]
    fn a_local_runner_gets_its_own_sandbox_sockets_and_token() {
        let req = request(RUNNERS, Echo::LiveView);
        let p = plan(&req, &settings(&[]));
        let [r] = &p.runners[..] else {
            panic!("one runner expected")
        };
        assert_eq!(r.namespace, "local");
        let dir = Path::new("/home/a/runs/run_1/runner-1");
        assert_eq!(r.dir, dir);
        assert_eq!(r.spec.run_id, "run_1-r1");
        assert_eq!(
            r.spec.command,
            ["/.airlock/airlock", "runner", "--", "srv", "--stdio"]
        );
        assert_eq!(
            r.spec.kind,
            SandboxKind::Runner {
                run: "run_1".into()
            }
        );
        assert_eq!(r.spec.sockets_dir, dir);
        assert_eq!(
            (r.spec.memory_mb, r.spec.ro_paths.clone()),
            (p.sandbox.memory_mb, p.sandbox.ro_paths.clone())
        );
        let s = secrets(&r.spec);
        assert_eq!(s.sidecar_token.expose_secret(), "b".repeat(64));
        assert!(s.env.is_empty(), "no connection: no placeholder");
        assert!(s.prompt.is_none());
        assert!(
            s.proxy_ca_pem.is_some(),
            "a runner's proxy is an intercepting one"
        );
        // The agent is not intercepted: no CA for it.
        assert!(secrets(&p.sandbox).proxy_ca_pem.is_none());
        let c = config(&p);
        let local = c
            .integrations
            .iter()
            .find(|i| i.namespace.as_str() == "local")
            .expect("local");
        let listen = local.runner.as_ref().expect("the sidecar listens for it");
        assert_eq!(
            listen.mcp,
            launch::Endpoint::Unix(dir.join(RUNNER_MCP_SOCKET))
        );
        assert_eq!(listen.token.expose_secret(), "b".repeat(64));
        assert!(c.integrations[0].runner.is_none());
        assert_eq!(p.sidecar.runner_dirs, [(dir.to_owned(), dir.to_owned())]);
        assert!(p.sockets.contains(&dir.join(RUNNER_PROXY_SOCKET)));
    }
}
