//! What `airlock doctor` says about the docker backend: the daemon and its
//! API version, the container runtimes (each tried for real), the images,
//! the networks.

use std::collections::HashMap;
use std::time::Duration;

use bollard::Docker;
use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters as q;
use futures_util::StreamExt;

use super::{
    DockerConfig, EGRESS_NETWORK, LABEL_MANAGED, LABEL_OWNER, LABEL_ROLE, images, reclaim,
};
use crate::Diagnosis;

fn d(feature: impl Into<String>, r: Result<String, String>) -> Diagnosis {
    let (works, detail) = match r {
        Ok(s) => (true, s),
        Err(s) => (false, s),
    };
    Diagnosis {
        feature: feature.into(),
        works,
        detail,
    }
}

/// Starts `true` in `image` under `runtime` on `network`; the error if it fails.
async fn try_runtime(dk: &Docker, image: &str, runtime: &str, network: &str) -> Result<(), String> {
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
    let r = async {
        dk.create_container(
            Some(
                q::CreateContainerOptionsBuilder::default()
                    .name(&name)
                    .build(),
            ),
            body,
        )
        .await
        .map_err(|e| super::api_err("create", e))?;
        dk.start_container(&name, None::<q::StartContainerOptions>)
            .await
            .map_err(|e| super::api_err("start", e))?;
        let mut w = dk.wait_container(&name, None::<q::WaitContainerOptions>);
        match tokio::time::timeout(Duration::from_secs(20), w.next()).await {
            Ok(Some(Ok(_))) => Ok(()),
            Ok(Some(Err(bollard::errors::Error::DockerContainerWaitError { code, .. }))) => Err(
                format!("the container has no network interface (exit {code})"),
            ),
            Ok(Some(Err(e))) => Err(super::api_err("run", e)),
            Ok(None) => Err("no exit status".into()),
            Err(_) => Err("did not finish within 20 s".into()),
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
    r
}

/// Whether the daemon runs `rt` with gVisor's `runsc`.
fn is_gvisor(info: Option<&bollard::models::SystemInfo>, rt: &str) -> bool {
    info.and_then(|i| i.runtimes.as_ref())
        .and_then(|r| r.get(rt))
        .and_then(|r| r.path.as_deref())
        .is_some_and(|p| p.rsplit('/').next() == Some("runsc"))
}

/// The docker backend's lines of `airlock doctor`.
pub async fn diagnose(cfg: &DockerConfig) -> Vec<Diagnosis> {
    let mut out = vec![];
    let dk = match super::connect(&cfg.host).await {
        Ok(dk) => dk,
        Err(e) => {
            out.push(d(
                "docker daemon",
                Err(format!("{e} (DOCKER_HOST={})", cfg.host)),
            ));
            return out;
        }
    };
    let v = dk.client_version();
    let version = dk.version().await.ok();
    out.push(d(
        "docker daemon",
        Ok(format!(
            "{} at {}, API {}.{} negotiated (daemon speaks {}, needs ≥ {})",
            version
                .as_ref()
                .and_then(|v| v.version.clone())
                .map(|v| format!("Docker {v}"))
                .unwrap_or_else(|| "a daemon".into()),
            cfg.host,
            v.major_version,
            v.minor_version,
            version
                .as_ref()
                .and_then(|v| v.api_version.clone())
                .unwrap_or_else(|| "?".into()),
            super::MIN_API_VERSION
        )),
    ));
    if let Some(ver) = version.as_ref().and_then(|v| v.version.as_deref()) {
        // The daemon reads the resolvers of its own host: judged only when
        // that host is this one.
        out.push(d(
            "internal networks' DNS",
            internal_dns_verdict(ver, host_resolv_conf(&cfg.host).as_deref()),
        ));
    }
    if cfg.host.starts_with("unix://") {
        let path = cfg.host.trim_start_matches("unix://");
        if let Ok(m) = std::fs::metadata(path) {
            use std::os::unix::fs::MetadataExt;
            out.push(d(
                "docker socket",
                Ok(format!(
                    "{path} (mode {:o}, uid {}, gid {}): whoever can open it is root on this host",
                    m.mode() & 0o777,
                    m.uid(),
                    m.gid()
                )),
            ));
        }
    }
    let info = dk.info().await.ok();
    let runtimes: Vec<String> = info
        .as_ref()
        .and_then(|i| i.runtimes.as_ref())
        .map(|r| r.keys().cloned().collect())
        .unwrap_or_default();
    let default_rt = info
        .as_ref()
        .and_then(|i| i.default_runtime.clone())
        .unwrap_or_else(|| "runc".into());
    let agent_present = images::present(&dk, &cfg.images.agent)
        .await
        .unwrap_or(false);
    let image = cfg.images.agent.to_string();
    // runc, runsc, and every other runtime registered (gVisor is often
    // registered twice: `runsc` and a `--network=host` variant).
    let mut tried: Vec<String> = vec!["runc".into(), "runsc".into()];
    tried.extend(
        runtimes
            .iter()
            .filter(|r| !r.starts_with("io.containerd.") && !tried.contains(r))
            .cloned()
            .collect::<Vec<_>>(),
    );
    for rt in &tried {
        let rt = rt.as_str();
        let r = if !runtimes.iter().any(|r| r == rt) {
            Err(
                if rt == "runsc" && std::path::Path::new("/usr/bin/runsc").exists() {
                    "installed (/usr/bin/runsc) but not registered with dockerd: add it to \"runtimes\" in /etc/docker/daemon.json and reload dockerd (SIGHUP)".to_string()
                } else {
                    format!(
                        "not registered with dockerd (it knows {})",
                        runtimes.join(", ")
                    )
                },
            )
        } else if !agent_present {
            Err(format!(
                "registered; not tried: {image} is missing (airlock images build)"
            ))
        } else {
            // A failed start may leave something behind (`leftover`): on a
            // bridge only once a start without a network worked.
            let leftover = if is_gvisor(info.as_ref(), rt) {
                " (gVisor releases before 2023 leave the sandbox of a failed start running, out of Docker's sight: `runsc --root /var/run/docker/runtime-runc/moby list` shows it, `delete --force ID` ends it)"
            } else {
                ""
            };
            match try_runtime(&dk, &image, rt, "none").await {
                Err(e) => Err(format!("cannot start a container: {e}{leftover}")),
                Ok(()) => match try_runtime(&dk, &image, rt, "bridge").await {
                    Ok(()) => Ok(format!(
                        "starts containers, with and without a network{}",
                        if rt == default_rt {
                            " (the daemon's default)"
                        } else {
                            ""
                        }
                    )),
                    Err(e) => Err(format!(
                        "starts containers with --network=none only; on a bridge network (what a run needs: the agent reaches its sidecar over it) it fails: {e}{leftover}"
                    )),
                },
            }
        };
        out.push(d(format!("runtime {rt}"), r));
    }
    if let Some(r) = &cfg.runtime {
        out.push(d(
            "DOCKER_RUNTIME",
            if runtimes.contains(r) {
                Ok(format!("{r}: agents run under it"))
            } else {
                Err(format!(
                    "{r} is not registered with dockerd: runs will fail to start"
                ))
            },
        ));
    }
    let contract =
        images::check_tag_contract(&cfg.images.agent, &cfg.images.sidecar, images::VERSION);
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
        let r = match images::present(&dk, image).await {
            Ok(true) => Ok(format!("{image} present")),
            Ok(false) if default => Err(format!(
                "{image} missing: the next boot builds it (or `airlock images build`)"
            )),
            Ok(false) => Err(format!(
                "{image} missing: load it onto the daemon (Airlock pulls nothing)"
            )),
            Err(e) => Err(e.to_string()),
        };
        out.push(d(what, r));
    }
    out.push(d(
        "image tag contract",
        contract.map(|()| {
            format!(
                "agent and sidecar tags agree ({}), platform {}",
                cfg.images.agent.tag(),
                images::VERSION
            )
        }),
    ));
    let egress = dk
        .inspect_network(EGRESS_NETWORK, None::<q::InspectNetworkOptions>)
        .await;
    out.push(d(
        "egress network",
        match egress {
            Ok(n) => Ok(format!(
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
            )),
            Err(e) if super::not_found(&e) => Err(format!(
                "{EGRESS_NETWORK} does not exist yet: the first docker run creates it"
            )),
            Err(e) => Err(super::api_err("inspect", e)),
        },
    ));
    let filters = HashMap::from([(
        "label",
        vec![
            format!("{LABEL_MANAGED}=true"),
            format!("{LABEL_ROLE}=network"),
        ],
    )]);
    if let Ok(nets) = dk
        .list_networks(Some(
            q::ListNetworksOptionsBuilder::default()
                .filters(&filters)
                .build(),
        ))
        .await
    {
        let mut live = 0;
        let mut dead = 0;
        let mut other = 0;
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
        out.push(d(
            "run networks",
            if dead == 0 {
                Ok(format!("{live} of live platforms, {other} of other hosts"))
            } else {
                Err(format!("{live} of live platforms, {dead} of stopped platforms (reclaimed at the next boot), {other} of other hosts"))
            },
        ));
    }
    out
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
) -> Result<String, String> {
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
    let fixed =
        v >= (26, 0, 0) || (v.0 == 25 && v >= (25, 0, 5)) || (v.0 == 23 && v >= (23, 0, 11));
    if fixed {
        return Ok(format!(
            "Docker {version} does not forward an internal network's queries (CVE-2024-29018 fixed)"
        ));
    }
    let Some(conf) = resolv_conf else {
        return Err(format!(
            "Docker {version} predates the CVE-2024-29018 fix and its host's resolvers are unknown here: \
             if they are on a loopback address, agents can send data out in DNS names"
        ));
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
        Ok(format!(
            "Docker {version} predates the CVE-2024-29018 fix, but no resolver of this host is on loopback: \
             an internal network's queries go out of the run's own namespace, where they have no route"
        ))
    } else {
        Err(format!(
            "Docker {version} predates the CVE-2024-29018 fix and this host resolves through {}: \
             the daemon may forward an agent's queries there from the host's namespace, so agents can \
             send data out in DNS names. Upgrade Docker (26.0.0, 25.0.5, 23.0.11 or later) or point \
             /etc/resolv.conf at a resolver that is not on loopback",
            loopback.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::{internal_dns_verdict, is_gvisor};

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
        assert!(is_gvisor(Some(&info), "runsc"));
        assert!(is_gvisor(Some(&info), "sandboxed"));
        assert!(!is_gvisor(Some(&info), "runc"));
        assert!(!is_gvisor(Some(&info), "runsc-lookalike"));
        assert!(!is_gvisor(Some(&info), "absent"));
        assert!(!is_gvisor(None, "runsc"));
    }

    #[test]
    fn an_old_daemon_with_a_loopback_resolver_is_a_dns_channel() {
        let local = "# managed\nnameserver 127.0.0.1\noptions edns0\n";
        let remote = "nameserver 10.255.255.53\n";
        let e = internal_dns_verdict("20.10.24+dfsg1", Some(local)).unwrap_err();
        assert!(
            e.contains("127.0.0.1") && e.contains("CVE-2024-29018"),
            "{e}"
        );
        assert!(internal_dns_verdict("20.10.24+dfsg1", Some("nameserver ::1\n")).is_err());
        let ok = internal_dns_verdict("20.10.24+dfsg1", Some(remote)).unwrap();
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
