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
    if let Some(ver) = version.as_ref().and_then(|v| v.version.as_deref()) {
        // The daemon reads the resolvers of its own host: judged only when
        // that host is this one.
        let feature = "internal networks' DNS";
        out.push(
            match internal_dns_verdict(ver, host_resolv_conf(&cfg.host).as_deref()) {
                Ok(fine) => Diagnosis::works(feature, fine.to_string()),
                Err(risk) => Diagnosis::fails(feature, risk),
            },
        );
    }
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
            Diagnosis::works("DOCKER_RUNTIME", format!("{r}: agents run under it"))
        } else {
            Diagnosis::fails(
                "DOCKER_RUNTIME",
                format_args!("{r} is not registered with dockerd: runs will fail to start"),
            )
        });
    }
    out
}

/// A registered runtime tried: a container without a network, then (once
/// that works) one on a bridge, what a run needs.
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
            Err(e) => Diagnosis::fails(
                feature,
                format_args!(
                    "starts containers with --network=none only; on a bridge network (what a run needs: the agent reaches its sidecar over it) it fails: {e}"
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

/// The resolvers of the daemon's host, when that host is this one.
pub(crate) fn host_resolv_conf(docker_host: &str) -> Option<String> {
    docker_host
        .starts_with("unix://")
        .then(|| std::fs::read_to_string("/etc/resolv.conf").ok())
        .flatten()
}

/// Whether an agent on a run's internal network can resolve external names
/// through the daemon's embedded DNS (CVE-2024-29018, a DNS exfiltration
/// channel): daemons before 26.0.0, 25.0.5 and 23.0.11 forward such a query
/// from the host's own network namespace when the host's resolver is on a
/// loopback address; otherwise from the container's, where an internal
/// network has no route. Distributions may have backported the fix: an old
/// version with a loopback resolver is reported as a risk, not a proof.
pub(crate) fn internal_dns_verdict(
    version: &str,
    resolv_conf: Option<&str>,
) -> Result<NoDnsChannel, DnsChannel> {
    let nums: Vec<u32> = version
        .split(|c: char| !c.is_ascii_digit())
        .take(3)
        .map(|n| n.parse().unwrap_or(0))
        .collect();
    let v = (
        nums.first().copied().unwrap_or(0),
        nums.get(1).copied().unwrap_or(0),
        nums.get(2).copied().unwrap_or(0),
    );
    let version = version.to_owned();
    let fixed =
        v >= (26, 0, 0) || (v.0 == 25 && v >= (25, 0, 5)) || (v.0 == 23 && v >= (23, 0, 11));
    if fixed {
        return Ok(NoDnsChannel::Fixed { version });
    }
    let Some(conf) = resolv_conf else {
        return Err(DnsChannel::UnknownResolvers { version });
    };
    let loopback: Vec<&str> = conf
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .map(str::trim)
        .filter(|a| {
            a.parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
        })
        .collect();
    if loopback.is_empty() {
        Ok(NoDnsChannel::NoLoopbackResolver { version })
    } else {
        Err(DnsChannel::LoopbackResolver {
            version,
            resolvers: loopback.join(", "),
        })
    }
}

/// Why an internal network's queries are no channel out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum NoDnsChannel {
    #[error(
        "Docker {version} does not forward an internal network's queries (CVE-2024-29018 fixed)"
    )]
    Fixed { version: String },
    #[error(
        "Docker {version} predates the CVE-2024-29018 fix, but no resolver of this host is on loopback: \
         an internal network's queries go out of the run's own namespace, where they have no route"
    )]
    NoLoopbackResolver { version: String },
}

/// Why an agent may send data out in DNS names through the daemon.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum DnsChannel {
    #[error(
        "Docker {version} predates the CVE-2024-29018 fix and its host's resolvers are unknown here: \
         if they are on a loopback address, agents can send data out in DNS names"
    )]
    UnknownResolvers { version: String },
    #[error(
        "Docker {version} predates the CVE-2024-29018 fix and this host resolves through {resolvers}: \
         the daemon may forward an agent's queries there from the host's namespace, so agents can \
         send data out in DNS names. Upgrade Docker (26.0.0, 25.0.5, 23.0.11 or later) or point \
         /etc/resolv.conf at a resolver that is not on loopback"
    )]
    LoopbackResolver { version: String, resolvers: String },
}

#[cfg(test)]
mod tests {
    use super::{gvisor_binary, internal_dns_verdict};

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
    fn an_old_daemon_with_a_loopback_resolver_is_a_dns_channel() {
        let local = "# managed\nnameserver 127.0.0.1\noptions edns0\n";
        let remote = "nameserver 10.255.255.53\n";
        let e = internal_dns_verdict("20.10.24+dfsg1", Some(local))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("127.0.0.1") && e.contains("CVE-2024-29018"),
            "{e}"
        );
        assert!(internal_dns_verdict("20.10.24+dfsg1", Some("nameserver ::1\n")).is_err());
        let ok = internal_dns_verdict("20.10.24+dfsg1", Some(remote))
            .unwrap()
            .to_string();
        assert!(ok.contains("no route"), "{ok}");
        assert!(internal_dns_verdict("20.10.24", None).is_err());
        for fixed in ["26.0.0", "27.3.1", "25.0.5", "23.0.11", "28.0.0-rc1"] {
            assert!(internal_dns_verdict(fixed, Some(local)).is_ok(), "{fixed}");
        }
        for old in ["25.0.4", "23.0.10", "24.0.9"] {
            assert!(internal_dns_verdict(old, Some(local)).is_err(), "{old}");
        }
    }
}
