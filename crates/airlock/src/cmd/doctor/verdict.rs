//! The doctor's verdict on each backend: can it run agents here, and if
//! not, the next step. Read from what the backends' own checks and the
//! docker diagnosis found.

use airlock_sandbox::docker::DockerConfig;
use serde::Serialize;

use super::Line;

#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    pub backend: &'static str,
    /// Whether it can run agents here now.
    pub works: bool,
    /// Whether it isolates the agent from the host at all.
    pub isolates: bool,
    pub detail: String,
    /// What to do next, when there is something to do.
    pub next_step: Option<String>,
}

/// The verdicts on namespace, docker and process, in that order.
pub fn all(docker_cfg: Option<&DockerConfig>, docker: &[Line]) -> Vec<Verdict> {
    vec![namespace(), self::docker(docker_cfg, docker), process()]
}

/// Whether the backend `chosen` names (`auto` included) can run agents.
pub fn chosen_works(chosen: &str, verdicts: &[Verdict]) -> bool {
    let works = |name: &str| verdicts.iter().any(|v| v.backend == name && v.works);
    match chosen {
        // auto falls back to the process backend, which always runs.
        "auto" => works("namespace") || works("process"),
        name => works(name),
    }
}

fn namespace() -> Verdict {
    match airlock_sandbox::select("namespace") {
        Ok(_) => Verdict {
            backend: "namespace",
            works: true,
            isolates: true,
            detail: "works".into(),
            next_step: None,
        },
        Err(e) => Verdict {
            backend: "namespace",
            works: false,
            isolates: true,
            detail: e.to_string(),
            next_step: Some(
                "run airlock as root, or allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1; on Ubuntu 24.04+ kernel.apparmor_restrict_unprivileged_userns=0); or use --backend docker"
                    .into(),
            ),
        },
    }
}

fn process() -> Verdict {
    Verdict {
        backend: "process",
        works: true,
        isolates: false,
        detail: "works (isolates NOTHING)".into(),
        next_step: None,
    }
}

fn failed(l: &[Line], feature: &str) -> Option<String> {
    l.iter()
        .find(|l| l.feature == feature && !l.works)
        .map(|l| l.detail.clone())
}

fn docker(cfg: Option<&DockerConfig>, lines: &[Line]) -> Verdict {
    let verdict = |works: bool, detail: String, next: Option<String>| Verdict {
        backend: "docker",
        works,
        isolates: true,
        detail,
        next_step: next,
    };
    let Some(cfg) = cfg else {
        let why = failed(lines, "settings").unwrap_or_default();
        return verdict(
            false,
            why,
            Some("fix the DOCKER_* setting named above".into()),
        );
    };
    if let Some(why) = failed(lines, "docker daemon").or_else(|| failed(lines, "docker")) {
        return verdict(
            false,
            format!("no daemon: {why}"),
            Some("install docker.io and start dockerd (`systemctl start docker`), or point DOCKER_HOST at a daemon".into()),
        );
    }
    if let Some(why) = failed(lines, "DOCKER_RUNTIME") {
        return verdict(
            false,
            why,
            Some("register the runtime in /etc/docker/daemon.json and reload dockerd, or unset DOCKER_RUNTIME".into()),
        );
    }
    if let Some(rt) = &cfg.runtime
        && let Some(why) = failed(lines, &format!("runtime {rt}"))
        && !why.contains("not tried")
    {
        return verdict(
            false,
            format!("DOCKER_RUNTIME={rt} cannot start a container: {why}"),
            Some("choose a runtime that starts containers (`runc`), or fix this one".into()),
        );
    }
    let missing: Vec<(&str, bool)> = [
        ("agent image", cfg.images.agent_is_default),
        ("sidecar image", cfg.images.sidecar_is_default),
    ]
    .into_iter()
    .filter(|(f, _)| failed(lines, f).is_some())
    .collect();
    if missing.iter().any(|(_, default)| !default) {
        return verdict(
            false,
            "an image it was told to use is missing".into(),
            Some(
                "load the images named under Docker onto the daemon (Airlock pulls nothing)".into(),
            ),
        );
    }
    if !missing.is_empty() {
        return verdict(
            true,
            "works once its images are built (the first run builds them)".into(),
            Some(
                "`airlock images build` now, then `airlock doctor` again tries each runtime".into(),
            ),
        );
    }
    verdict(true, "works".into(), None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(backend: &'static str, works: bool) -> Verdict {
        Verdict {
            backend,
            works,
            isolates: true,
            detail: String::new(),
            next_step: None,
        }
    }

    #[test]
    fn auto_works_where_namespace_or_process_does_and_a_name_is_judged_alone() {
        let vs = [
            v("namespace", false),
            v("docker", false),
            v("process", true),
        ];
        assert!(chosen_works("auto", &vs));
        assert!(!chosen_works("docker", &vs));
        assert!(!chosen_works("namespace", &vs));
        assert!(chosen_works("process", &vs));
        assert!(!chosen_works("nonsense", &vs));
    }

    #[test]
    fn no_daemon_says_to_install_and_start_it() {
        let lines = [Line::new(false, "docker daemon", "connection refused")];
        let cfg = DockerConfig::from_env().unwrap();
        let d = docker(Some(&cfg), &lines);
        assert!(!d.works);
        assert!(
            d.next_step
                .unwrap()
                .contains("install docker.io and start dockerd")
        );
    }
}
