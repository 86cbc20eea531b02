//! Boot reclaim of docker leftovers: containers and run networks whose
//! platform is gone. Several platforms may share one daemon, so a leftover
//! is judged by its owner ([`super::LABEL_OWNER`]: the boot id of the host,
//! the PID and the start time of the platform process that made it), never
//! by its state alone: a live platform's run — starting, running, or ended
//! and not yet removed — is never touched, and an owner on another host
//! (another boot id) is not judged at all.

use std::collections::{BTreeSet, HashMap};

use bollard::Docker;
use bollard::query_parameters as q;

use super::{ApiError, DockerError, LABEL_MANAGED, LABEL_OWNER, LABEL_ROLE, LABEL_RUN};
use crate::SandboxError;

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// Field 22 of `/proc/<pid>/stat`: when the process started (clock ticks
/// since boot), which tells a PID's reuse from its first owner.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// This process as the owner of what it creates.
pub fn owner_label() -> String {
    owner_label_of(std::process::id())
        .unwrap_or_else(|| format!("{}:{}:0", boot_id(), std::process::id()))
}

pub fn owner_label_of(pid: u32) -> Option<String> {
    Some(format!("{}:{pid}:{}", boot_id(), start_time(pid)?))
}

/// What a leftover's owner label says about its platform.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// The platform process is running: hands off.
    Alive,
    /// It ran on this host (this boot) and is gone: reclaim.
    Dead,
    /// Another host or boot, or a label that does not parse: not ours to judge.
    Unknown,
}

pub fn judge_owner(label: Option<&str>) -> Owner {
    let Some(label) = label else {
        return Owner::Unknown;
    };
    let mut it = label.split(':');
    let (Some(boot), Some(pid), Some(start), None) = (it.next(), it.next(), it.next(), it.next())
    else {
        return Owner::Unknown;
    };
    let (Ok(pid), Ok(start)) = (pid.parse::<u32>(), start.parse::<u64>()) else {
        return Owner::Unknown;
    };
    if boot.is_empty() || boot != boot_id() {
        return Owner::Unknown;
    }
    match start_time(pid) {
        Some(t) if t == start => Owner::Alive,
        _ => Owner::Dead,
    }
}

/// What a reclaim removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Reclaimed {
    /// Runs whose leftovers were removed.
    pub runs: BTreeSet<String>,
    pub containers: Vec<String>,
    pub networks: Vec<String>,
    /// Leftovers of platforms on another host (or unlabelled): kept.
    pub not_judged: usize,
}

fn label_filter(extra: &[&str]) -> HashMap<&'static str, Vec<String>> {
    let mut v = vec![format!("{LABEL_MANAGED}=true")];
    v.extend(extra.iter().map(|s| s.to_string()));
    HashMap::from([("label", v)])
}

/// Removes the containers and run networks of dead platforms.
pub async fn reclaim(d: &Docker) -> Result<Reclaimed, SandboxError> {
    let mut out = Reclaimed::default();
    let containers = d
        .list_containers(Some(
            q::ListContainersOptionsBuilder::default()
                .all(true)
                .filters(&label_filter(&[]))
                .build(),
        ))
        .await
        .map_err(|e| DockerError::from(ApiError::new("listing containers", e)))?;
    for c in containers {
        let labels = c.labels.unwrap_or_default();
        match judge_owner(labels.get(LABEL_OWNER).map(String::as_str)) {
            Owner::Alive => {}
            Owner::Unknown => out.not_judged += 1,
            Owner::Dead => {
                let Some(id) = c.id else { continue };
                let removed = d
                    .remove_container(
                        &id,
                        Some(
                            q::RemoveContainerOptionsBuilder::default()
                                .force(true)
                                .build(),
                        ),
                    )
                    .await;
                if removed.is_ok() || removed.as_ref().is_err_and(super::not_found) {
                    let name = c
                        .names
                        .and_then(|n| n.into_iter().next())
                        .unwrap_or(id)
                        .trim_start_matches('/')
                        .to_owned();
                    out.containers.push(name);
                    if let Some(run) = labels.get(LABEL_RUN) {
                        out.runs.insert(run.clone());
                    }
                }
            }
        }
    }
    let networks = d
        .list_networks(Some(
            q::ListNetworksOptionsBuilder::default()
                .filters(&label_filter(&[&format!("{LABEL_ROLE}=network")]))
                .build(),
        ))
        .await
        .map_err(|e| DockerError::from(ApiError::new("listing networks", e)))?;
    for n in networks {
        let labels = n.labels.unwrap_or_default();
        match judge_owner(labels.get(LABEL_OWNER).map(String::as_str)) {
            Owner::Alive => {}
            Owner::Unknown => out.not_judged += 1,
            Owner::Dead => {
                let Some(name) = n.name else { continue };
                super::remove_network(d, &name).await;
                out.networks.push(name);
                if let Some(run) = labels.get(LABEL_RUN) {
                    out.runs.insert(run.clone());
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_are_judged_by_boot_pid_and_start_time() {
        assert_eq!(judge_owner(Some(&owner_label())), Owner::Alive);
        // PID 1 is alive, but not with that start time: a reused PID.
        let reused = format!("{}:1:{}", boot_id(), u64::MAX);
        assert_eq!(judge_owner(Some(&reused)), Owner::Dead);
        // A PID that cannot exist.
        assert_eq!(
            judge_owner(Some(&format!("{}:{}:5", boot_id(), u32::MAX))),
            Owner::Dead
        );
        assert_eq!(judge_owner(Some("another-boot:1:5")), Owner::Unknown);
        assert_eq!(judge_owner(Some("garbage")), Owner::Unknown);
        assert_eq!(judge_owner(None), Owner::Unknown);
    }
}
