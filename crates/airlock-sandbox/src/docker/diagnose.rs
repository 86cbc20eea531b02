//! What `airlock doctor` says about the docker backend: the daemon and its
//! API version, the container runtimes (each tried for real), the images,
//! the networks.

use std::collections::HashMap;
use std::time::Duration;

use bollard::Docker;
use bollard::models::{ContainerCreateBody, HostConfig, SystemVersion};
use bollard::query_parameters as q;
use futures_util::StreamExt;

use super::{
    DockerConfig, EGRESS_NETWORK, LABEL_MANAGED, LABEL_OWNER, LABEL_ROLE, images, reclaim,
};
use crate::Diagnosis;

/// Why a trial container did not run ([`try_runtime`]).
#[derive(Debug, thiserror::Error)]
enum TrialError {
    #[error(transparent)]
    Api(#[from] super::ApiError),
    #[error("the container has no network interface (exit {0})")]
    NoInterface(i64),
    #[error("no exit status")]
    NoExit,
    #[error("did not finish within 20 s")]
    Timeout,
}

/// Where Docker 20.10 keeps its runtimes' state (`runsc --root`).
const RUNTIME_ROOT: &str = "/var/run/docker/runtime-runc/moby";

/// Ends the gVisor sandbox a failed start of container `id` left running
/// out of Docker's sight (gVisor releases before 2023 on Docker 20.10:
/// `runsc-sandbox` and `runsc-gofer` stay after the container is removed).
/// `runsc` is the runtime's binary as the daemon registered it; nothing
/// left (or a daemon on another host) makes this a no-op.
async fn end_gvisor_leftover(runsc: &str, id: &str) {
    let _ = tokio::process::Command::new(runsc)
        .args(["--root", RUNTIME_ROOT, "delete", "--force", id])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .await;
}

/// Starts `true` in `image` under `runtime` on `network`; the error if it
/// fails. Leaves nothing behind: the container is removed, and a gVisor
/// runtime's (`runsc`, its binary) sandbox of a failed start is ended.
async fn try_runtime(
    dk: &Docker,
    image: &str,
    runtime: &str,
    runsc: Option<&str>,
    network: &str,
) -> Result<(), TrialError> {
    let name = format!("airlock-doctor-{runtime}-{network}-{}", std::process::id());
    let body = ContainerCreateBody {
        image: Some(image.into()),
        // On a network, the container must see an interface besides `lo`
        // (gVisor's `--network=none` runs, but without one).
        cmd: Some(if network == "none" {
            vec!["/bin/true".into()]
        } else {
            vec![
                "/bin/sh".into(),
                "-c".into(),
                "grep -q eth0 /proc/net/dev".into(),
            ]
        }),
        labels: Some(HashMap::from([
            (LABEL_MANAGED.into(), "true".into()),
            (LABEL_ROLE.into(), "doctor".into()),
            (LABEL_OWNER.into(), reclaim::owner_label()),
        ])),
        host_config: Some(HostConfig {
            runtime: Some(runtime.into()),
            network_mode: Some(network.into()),
            cap_drop: Some(vec!["ALL".into()]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut id = None;
    let r = async {
        id = Some(
            dk.create_container(
                Some(
                    q::CreateContainerOptionsBuilder::default()
                        .name(&name)
                        .build(),
                ),
                body,
            )
            .await
            .map_err(|e| super::ApiError::new("create", e))?
            .id,
        );
        dk.start_container(&name, None::<q::StartContainerOptions>)
            .await
            .map_err(|e| super::ApiError::new("start", e))?;
        let mut w = dk.wait_container(&name, None::<q::WaitContainerOptions>);
        match tokio::time::timeout(Duration::from_secs(20), w.next()).await {
            Ok(Some(Ok(_))) => Ok(()),
            Ok(Some(Err(bollard::errors::Error::DockerContainerWaitError { code, .. }))) => {
                Err(TrialError::NoInterface(code))
            }
            Ok(Some(Err(e))) => Err(super::ApiError::new("run", e).into()),
            Ok(None) => Err(TrialError::NoExit),
            Err(_) => Err(TrialError::Timeout),
        }
    }
    .await;
    let _ = dk
        .remove_container(
            &name,
            Some(
                q::RemoveContainerOptionsBuilder::default()
                    .force(true)
                    .build(),
            ),
        )
        .await;
    if r.is_err()
        && let (Some(runsc), Some(id)) = (runsc, &id)
    {
        end_gvisor_leftover(runsc, id).await;
    }
    r
}

/// The binary of gVisor's `runsc` when the daemon runs `rt` with it.
fn gvisor_binary<'a>(info: Option<&'a bollard::models::SystemInfo>, rt: &str) -> Option<&'a str> {
    info.and_then(|i| i.runtimes.as_ref())
        .and_then(|r| r.get(rt))
        .and_then(|r| r.path.as_deref())
        .filter(|p| p.rsplit('/').next() == Some("runsc"))
}

/// The docker backend's lines of `airlock doctor`.
pub async fn diagnose(cfg: &DockerConfig) -> Vec<Diagnosis> {
    let dk = match super::connect(&cfg.host).await {
        Ok(dk) => dk,
        Err(e) => {
            return vec![Diagnosis::fails(
                "docker daemon",
                format_args!("{e} (DOCKER_HOST={})", cfg.host),
            )];
        }
    };
    let version = dk.version().await.ok();
    let mut out = vec![daemon(&dk, cfg, version.as_ref())];
    out.extend(socket(cfg));
    let info = dk.info().await.ok();
    out.extend(runtimes(&dk, cfg, info.as_ref()).await);
    out.extend(images_lines(&dk, cfg).await);
    out.push(egress_network(&dk).await);
    out.extend(run_networks(&dk).await);
    out.extend(warm_pool(&dk, cfg).await);
    out
}

/// The warm pools' pairs on this daemon ([`super::pool`]): idle, claimed by
/// a run, or left by a stopped platform (its containers go at the next
/// boot's reclaim).
async fn warm_pool(dk: &Docker, cfg: &DockerConfig) -> Option<Diagnosis> {
    use super::pool::{LABEL_POOL, PAIR_PREFIX};
    let filters = HashMap::from([(
        "label",
        vec![
            format!("{LABEL_MANAGED}=true"),
            format!("{LABEL_POOL}=true"),
            format!("{LABEL_ROLE}=agent"),
        ],
    )]);
    let listing = q::ListContainersOptionsBuilder::default()
        .all(true)
        .filters(&filters)
        .build();
    let pairs = dk.list_containers(Some(listing)).await.ok()?;
    let (mut idle, mut claimed, mut dead) = (0, 0, 0);
    for c in &pairs {
        let owner = c
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_OWNER))
            .map(String::as_str);
        let unclaimed = c.names.iter().flatten().any(|n| {
            n.trim_start_matches('/')
                .starts_with(&format!("airlock-{PAIR_PREFIX}"))
        });
        match (reclaim::judge_owner(owner), unclaimed) {
            (reclaim::Owner::Dead, _) => dead += 1,
            (_, true) => idle += 1,
            (_, false) => claimed += 1,
        }
    }
    let size = cfg.warm_pool;
    let setting = match size {
        0 => "DOCKER_WARM_POOL=0 here (no pool)".to_owned(),
        n => format!(
            "DOCKER_WARM_POOL={n} idle pair(s) per key, at most {} claimed per organization",
            super::pool::share_of(n)
        ),
    };
    let found = format!("{idle} idle pair(s), {claimed} claimed by a run");
    Some(if dead == 0 {
        Diagnosis::works("warm pool", format!("{setting}; {found}"))
    } else {
        Diagnosis::fails(
            "warm pool",
            format_args!(
                "{setting}; {found}; {dead} pair(s) of stopped platforms (removed at the next boot)"
            ),
        )
    })
}

/// The daemon, its version and the API version negotiated.
fn daemon(dk: &Docker, cfg: &DockerConfig, version: Option<&SystemVersion>) -> Diagnosis {
    let v = dk.client_version();
    Diagnosis::works(
        "docker daemon",
        format!(
            "{} at {}, API {}.{} negotiated (daemon speaks {}, needs ≥ {})",
            version
                .and_then(|v| v.version.clone())
                .map(|v| format!("Docker {v}"))
                .unwrap_or_else(|| "a daemon".into()),
            cfg.host,
            v.major_version,
            v.minor_version,
            version
                .and_then(|v| v.api_version.clone())
                .unwrap_or_else(|| "?".into()),
            super::MIN_API_VERSION
        ),
    )
}

/// The daemon's unix socket: who may open it is root on this host.
fn socket(cfg: &DockerConfig) -> Option<Diagnosis> {
    use std::os::unix::fs::MetadataExt;
    let path = cfg.host.strip_prefix("unix://")?;
    let m = std::fs::metadata(path).ok()?;
    Some(Diagnosis::works(
        "docker socket",
        format!(
            "{path} (mode {:o}, uid {}, gid {}): whoever can open it is root on this host",
            m.mode() & 0o777,
            m.uid(),
            m.gid()
        ),
    ))
}

/// Each container runtime, tried for real: runc, runsc, and every other
/// runtime registered (gVisor is often registered twice: `runsc` and a
/// `--network=host` variant); then `DOCKER_RUNTIME`, when set.
async fn runtimes(
    dk: &Docker,
    cfg: &DockerConfig,
    info: Option<&bollard::models::SystemInfo>,
) -> Vec<Diagnosis> {
    let registered: Vec<String> = info
        .and_then(|i| i.runtimes.as_ref())
        .map(|r| r.keys().cloned().collect())
        .unwrap_or_default();
    let default_rt = info
        .and_then(|i| i.default_runtime.clone())
        .unwrap_or_else(|| "runc".into());
    let agent_present = images::present(dk, &cfg.images.agent)
        .await
        .unwrap_or(false);
    let image = cfg.images.agent.to_string();
    let mut tried: Vec<String> = vec!["runc".into(), "runsc".into()];
    tried.extend(
        registered
            .iter()
            .filter(|r| !r.starts_with("io.containerd.") && !tried.contains(r))
            .cloned()
            .collect::<Vec<_>>(),
    );
    let mut out = vec![];
    for rt in &tried {
        let rt = rt.as_str();
        let feature = format!("runtime {rt}");
        out.push(if !registered.iter().any(|r| r == rt) {
            if rt == "runsc" && std::path::Path::new("/usr/bin/runsc").exists() {
                Diagnosis::fails(feature, "installed (/usr/bin/runsc) but not registered with dockerd: add it to \"runtimes\" in /etc/docker/daemon.json and reload dockerd (SIGHUP)")
            } else {
                Diagnosis::fails(
                    feature,
                    format_args!(
                        "not registered with dockerd (it knows {})",
                        registered.join(", ")
                    ),
                )
            }
        } else if !agent_present {
            Diagnosis::fails(
                feature,
                format_args!("registered; not tried: {image} is missing (airlock images build)"),
            )
        } else {
            let default = rt == default_rt;
            trial(dk, &image, rt, gvisor_binary(info, rt), default, feature).await
        });
    }
    if let Some(r) = &cfg.runtime {
        out.push(if registered.contains(r) {
            match host_sockets_verdict(info, r) {
                Ok(()) => Diagnosis::works(
                    "DOCKER_RUNTIME",
                    format!("{r}: agents run under it, reaching their sidecar's unix sockets"),
                ),
                Err(e) => Diagnosis::fails("DOCKER_RUNTIME", e),
            }
        } else {
            Diagnosis::fails(
                "DOCKER_RUNTIME",
                format_args!("{r} is not registered with dockerd: runs will fail to start"),
            )
        });
    }
    out
}

/// A registered runtime tried: a container without a network (what an
/// agent's is: the verdict), then (once that works) one on a bridge (said).
async fn trial(
    dk: &Docker,
    image: &str,
    rt: &str,
    runsc: Option<&str>,
    default: bool,
    feature: String,
) -> Diagnosis {
    // On a bridge only once a start without a network worked.
    match try_runtime(dk, image, rt, runsc, "none").await {
        Err(e) => Diagnosis::fails(feature, format_args!("cannot start a container: {e}")),
        Ok(()) => match try_runtime(dk, image, rt, runsc, "bridge").await {
            Ok(()) => Diagnosis::works(
                feature,
                format!(
                    "starts containers, with and without a network{}",
                    if default {
                        " (the daemon's default)"
                    } else {
                        ""
                    }
                ),
            ),
            // An agent's container has no network: this runtime can carry it.
            Err(e) => Diagnosis::works(
                feature,
                format!(
                    "starts containers without a network (what an agent's is), not on a bridge network: {e}"
                ),
            ),
        },
    }
}

/// The two images, and their tag contract.
async fn images_lines(dk: &Docker, cfg: &DockerConfig) -> Vec<Diagnosis> {
    let mut out = vec![];
    for (what, image, default) in [
        (
            "agent image",
            &cfg.images.agent,
            cfg.images.agent_is_default,
        ),
        (
            "sidecar image",
            &cfg.images.sidecar,
            cfg.images.sidecar_is_default,
        ),
    ] {
        out.push(match images::present(dk, image).await {
            Ok(true) => Diagnosis::works(what, format!("{image} present")),
            Ok(false) if default => Diagnosis::fails(
                what,
                format_args!(
                    "{image} missing: the next boot builds it (or `airlock images build`)"
                ),
            ),
            Ok(false) => Diagnosis::fails(
                what,
                format_args!("{image} missing: load it onto the daemon (Airlock pulls nothing)"),
            ),
            Err(e) => Diagnosis::fails(what, e),
        });
    }
    let contract = "image tag contract";
    out.push(
        match images::check_tag_contract(&cfg.images.agent, &cfg.images.sidecar, images::VERSION) {
            Ok(()) => Diagnosis::works(
                contract,
                format!(
                    "agent and sidecar tags agree ({}), platform {}",
                    cfg.images.agent.tag(),
                    images::VERSION
                ),
            ),
            Err(e) => Diagnosis::fails(contract, e),
        },
    );
    out
}

/// The shared egress network, and whether its containers may reach one
/// another.
async fn egress_network(dk: &Docker) -> Diagnosis {
    let feature = "egress network";
    match dk
        .inspect_network(EGRESS_NETWORK, None::<q::InspectNetworkOptions>)
        .await
    {
        Ok(n) => Diagnosis::works(
            feature,
            format!(
                "{EGRESS_NETWORK} exists ({}, inter-container traffic {})",
                n.ipam
                    .and_then(|i| i.config)
                    .and_then(|c| c.into_iter().next())
                    .and_then(|c| c.subnet)
                    .unwrap_or_default(),
                if n.options
                    .unwrap_or_default()
                    .get("com.docker.network.bridge.enable_icc")
                    .map(String::as_str)
                    == Some("false")
                {
                    "off"
                } else {
                    "ON"
                }
            ),
        ),
        Err(e) if super::not_found(&e) => Diagnosis::fails(
            feature,
            format_args!("{EGRESS_NETWORK} does not exist yet: the first docker run creates it"),
        ),
        Err(e) => Diagnosis::fails(feature, super::ApiError::new("inspect", e)),
    }
}

/// The run networks on the daemon, by whose they are (a live platform's,
/// a stopped one's, another host's).
async fn run_networks(dk: &Docker) -> Option<Diagnosis> {
    let filters = HashMap::from([(
        "label",
        vec![
            format!("{LABEL_MANAGED}=true"),
            format!("{LABEL_ROLE}=network"),
        ],
    )]);
    let nets = dk
        .list_networks(Some(
            q::ListNetworksOptionsBuilder::default()
                .filters(&filters)
                .build(),
        ))
        .await
        .ok()?;
    let (mut live, mut dead, mut other) = (0, 0, 0);
    for n in &nets {
        match reclaim::judge_owner(
            n.labels
                .as_ref()
                .and_then(|l| l.get(LABEL_OWNER))
                .map(String::as_str),
        ) {
            reclaim::Owner::Alive => live += 1,
            reclaim::Owner::Dead => dead += 1,
            reclaim::Owner::Unknown => other += 1,
        }
    }
    Some(if dead == 0 {
        Diagnosis::works(
            "run networks",
            format!("{live} of live platforms, {other} of other hosts"),
        )
    } else {
        Diagnosis::fails(
            "run networks",
            format_args!(
                "{live} of live platforms, {dead} of stopped platforms (reclaimed at the next boot), {other} of other hosts"
            ),
        )
    })
}

/// Whether agents under runtime `rt` can connect to their sidecar's unix
/// sockets, bound into their container: a gVisor runtime (told by its
/// binary, [`gvisor_binary`]) must be registered with `--host-uds=open`
/// (or `all`); any other runtime is taken to run on this host's kernel, as
/// runc does. A runtime the daemon does not list is not judged here (its
/// runs fail to start, naming it).
pub(crate) fn host_sockets_verdict(
    info: Option<&bollard::models::SystemInfo>,
    rt: &str,
) -> Result<(), super::DockerError> {
    let Some(path) = gvisor_binary(info, rt) else {
        return Ok(());
    };
    let args = info
        .and_then(|i| i.runtimes.as_ref())
        .and_then(|r| r.get(rt))
        .and_then(|r| r.runtime_args.clone())
        .unwrap_or_default();
    match gvisor_host_uds(&args).as_deref() {
        Some("open" | "all") => Ok(()),
        _ => Err(super::DockerError::GvisorWithoutHostSockets {
            runtime: rt.to_owned(),
            path: path.to_owned(),
        }),
    }
}

/// The value of runsc's `--host-uds` among `args`, as runsc's flag parser
/// reads it (`-`/`--`, `=v` or a separate value; the last one counts;
/// the deprecated `--fsgofer-host-uds` means `all`).
fn gvisor_host_uds(args: &[String]) -> Option<String> {
    let mut found = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let flag = a.trim_start_matches('-');
        if a == flag {
            continue;
        }
        match flag.split_once('=') {
            Some(("host-uds", v)) => found = Some(v.to_owned()),
            Some(("fsgofer-host-uds", v)) => {
                found = (v == "true").then(|| "all".to_owned()).or(found);
            }
            None if flag == "host-uds" => found = it.next().cloned(),
            None if flag == "fsgofer-host-uds" => found = Some("all".to_owned()),
            _ => {}
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::{gvisor_binary, host_sockets_verdict};

    #[test]
    fn gvisor_is_told_by_the_runtimes_binary_not_its_name() {
        let info: bollard::models::SystemInfo = serde_json::from_value(serde_json::json!({
            "Runtimes": {
                "runc": {"path": "runc"},
                "runsc": {"path": "/usr/bin/runsc"},
                "sandboxed": {"path": "/opt/gvisor/runsc", "runtimeArgs": ["--network=host"]},
                "runsc-lookalike": {"path": "/usr/local/bin/not-runsc"}
            }
        }))
        .unwrap();
        assert!(gvisor_binary(Some(&info), "runsc").is_some());
        assert!(gvisor_binary(Some(&info), "sandboxed").is_some());
        assert!(gvisor_binary(Some(&info), "runc").is_none());
        assert!(gvisor_binary(Some(&info), "runsc-lookalike").is_none());
        assert!(gvisor_binary(Some(&info), "absent").is_none());
        assert!(gvisor_binary(None, "runsc").is_none());
    }

    #[test]
    fn a_gvisor_runtime_needs_host_sockets_open() {
        let info: bollard::models::SystemInfo = serde_json::from_value(serde_json::json!({
            "Runtimes": {
                "runc": {"path": "runc"},
                "runsc": {"path": "/usr/bin/runsc"},
                "runsc-host": {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=host"]},
                "open": {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=host", "--host-uds=open"]},
                "spaced": {"path": "/usr/bin/runsc", "runtimeArgs": ["-host-uds", "all"]},
                "old": {"path": "/usr/bin/runsc", "runtimeArgs": ["--fsgofer-host-uds"]},
                "undone": {"path": "/usr/bin/runsc", "runtimeArgs": ["--host-uds=open", "--host-uds=none"]},
                "create": {"path": "/usr/bin/runsc", "runtimeArgs": ["--host-uds=create"]},
                "crun": {"path": "/usr/bin/crun"}
            }
        }))
        .unwrap();
        for ok in ["runc", "crun", "open", "spaced", "old", "unregistered"] {
            assert!(host_sockets_verdict(Some(&info), ok).is_ok(), "{ok}");
        }
        for refused in ["runsc", "runsc-host", "undone", "create"] {
            let e = host_sockets_verdict(Some(&info), refused)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!("DOCKER_RUNTIME={refused} is gVisor"))
                    && e.contains("--host-uds=open"),
                "{e}"
            );
        }
    }
}
