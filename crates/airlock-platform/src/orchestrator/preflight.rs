//! What is checked before anything of a run starts or is recorded: every
//! connection it needs is stored and can be decrypted with a configured
//! key, and every local runner can start on this backend with a program
//! that is there, and a platform that issues workload identity when an
//! integration names it. A refusal ([`Refusal`]) says what to fix.

use std::path::{Path, PathBuf};

use airlock_sandbox::Backend;

use super::error::{Refusal, RunError};
use super::parts::{EPHEMERAL_KID, Orchestrator};
use crate::manifest::Manifest;

impl Orchestrator {
    /// What can be checked before anything starts: every connection the run
    /// needs is stored and can be decrypted with a configured key.
    pub(super) async fn preflight(
        &self,
        org: &str,
        m: &Manifest,
        agent_dir: &Path,
    ) -> Result<(), RunError> {
        // (The process backend isolates nothing: its agent sees the host.)
        if self.backend.isolates() {
            home_outside_agent_dir(&self.home, agent_dir)?;
        }
        self.check_bundle(agent_dir).await?;
        for i in &m.integrations {
            if i.names_identity() && self.api.issuer().is_none() {
                return Err(Refusal::NoIdentityIssuer {
                    namespace: i.namespace.to_string(),
                }
                .into());
            }
            let Some(command) = i.local_command() else {
                continue;
            };
            refuse_local_runner(self.backend.as_ref(), i.namespace.as_str())?;
            check_runner_program(
                i.namespace.as_str(),
                command,
                agent_dir,
                self.backend.host_programs(),
            )?;
        }
        let mut needed: Vec<(String, String)> = m
            .connections()
            .into_iter()
            .map(|(who, name)| (who, name.to_string()))
            .collect();
        if let Some(org_key) = self.model_key_source(org, m).await? {
            needed.push(("model (the organization's key)".into(), org_key));
        }
        let ring = self.api.keyring();
        for (who, name) in needed {
            let Some(rec) = self.store.get_connection(org, &name).await? else {
                return Err(Refusal::NotStored { who, name }.into());
            };
            let kid = match airlock_vault::Envelope::kid_of(&rec.envelope) {
                Ok(kid) => kid,
                Err(error) => {
                    return Err(Refusal::Envelope { who, name, error }.into());
                }
            };
            if !ring.kids().any(|k| k == kid) {
                let hint = if ring.active_kid() == EPHEMERAL_KID {
                    "CONNECTION_ENCRYPTION_KEY is not set".to_string()
                } else {
                    format!(
                        "the configured key ids are {}; an older key belongs in CONNECTION_ENCRYPTION_KEYS",
                        ring.kids().collect::<Vec<_>>().join(", ")
                    )
                };
                return Err(Refusal::KeyNotConfigured {
                    who,
                    name,
                    kid: kid.to_owned(),
                    hint,
                }
                .into());
            }
        }
        Ok(())
    }
}

impl Orchestrator {
    /// Where a run of `m` without `model.connection` takes its model key
    /// from ([`crate::provider_keys`]): the organization's connection for
    /// the provider (its name, checked like every connection the run
    /// needs), else the operator's key (`None`); neither is refused. A
    /// manifest that names its connection, or has no model, needs nothing
    /// here.
    async fn model_key_source(&self, org: &str, m: &Manifest) -> Result<Option<String>, RunError> {
        let Some(model) = m.model.as_ref().filter(|model| model.connection.is_none()) else {
            return Ok(None);
        };
        let org_connection = crate::provider_keys::org_connection(model.provider);
        if self
            .store
            .get_connection(org, &org_connection)
            .await?
            .is_some()
        {
            return Ok(Some(org_connection));
        }
        match self.settings.system_provider_keys.get(model.provider) {
            Some(_) => Ok(None),
            None => Err(Refusal::NoModelKey {
                provider: model.provider.as_str(),
                org_connection,
            }
            .into()),
        }
    }

    /// The agent's directory under the bundle signature policy
    /// ([`crate::bundle::check`]): refused before anything starts, or
    /// accepted with what was found.
    async fn check_bundle(&self, agent_dir: &Path) -> Result<(), RunError> {
        use crate::bundle::{BundleRefusal, SignaturePolicy, Verdict};
        let settings = self.settings.bundles.clone();
        if settings.policy == SignaturePolicy::Off {
            return Ok(());
        }
        let dir = agent_dir.to_owned();
        let verdict = tokio::task::spawn_blocking(move || crate::bundle::check(&dir, &settings))
            .await
            .unwrap_or_else(|e| Err(BundleRefusal::Unreadable(e.to_string())))
            .map_err(Refusal::Bundle)?;
        match verdict {
            Verdict::NotChecked => {}
            Verdict::Unsigned => {
                tracing::debug!(dir = %agent_dir.display(), "the agent is not a signed bundle");
            }
            Verdict::Verified { key_id } => {
                tracing::info!(dir = %agent_dir.display(), %key_id, "agent bundle verified");
            }
            Verdict::Untrusted(why) => tracing::warn!(
                dir = %agent_dir.display(),
                code = why.code(),
                "agent bundle not trusted (AFPS_SIGNATURE_POLICY=warn lets it run): {why}"
            ),
        }
        Ok(())
    }
}

/// Airlock's home must not lie inside the agent's directory (both taken
/// as the filesystem resolves them: a symlink or `..` does not hide it).
fn home_outside_agent_dir(home: &Path, agent_dir: &Path) -> Result<(), RunError> {
    let (Ok(home), Ok(agent)) = (home.canonicalize(), agent_dir.canonicalize()) else {
        // What cannot be resolved is refused where it is used, by name.
        return Ok(());
    };
    if home.starts_with(&agent) {
        return Err(Refusal::HomeInAgentDir {
            agent: agent.display().to_string(),
            home: home.display().to_string(),
        }
        .into());
    }
    Ok(())
}

/// Whether `backend` can start a local MCP runner (the backend's call,
/// [`airlock_sandbox::Backend::local_runners`]); the refusal says why not.
fn refuse_local_runner(backend: &dyn Backend, namespace: &str) -> Result<(), RunError> {
    backend.local_runners().map_err(|why| {
        RunError::Refused(Refusal::RunnerUnsupported {
            namespace: namespace.to_owned(),
            backend: backend.name(),
            why,
        })
    })
}

/// A runner's program must be there before anything starts (a typo in
/// the manifest is the operator's error now, not a tool that times out
/// later): an absolute path, a path in the agent's directory, or a name on
/// the sandbox's `PATH` (the host's `/usr/local/bin:/usr/bin:/bin`, which
/// the namespace sandbox sees read-only), and executable. Where the
/// sandbox's programs are not the host's (`host_programs` false: docker's
/// are the agent image's), only one in the agent's directory (bound at the
/// same path) is checked here.
fn check_runner_program(
    namespace: &str,
    command: &[String],
    agent_dir: &Path,
    host_programs: bool,
) -> Result<(), RunError> {
    use std::os::unix::fs::PermissionsExt;
    let Some(program) = command.first() else {
        return Ok(());
    };
    let in_agent_dir = program.contains('/') && agent_dir.join(program).starts_with(agent_dir);
    if !host_programs && !in_agent_dir {
        return Ok(());
    }
    let candidates: Vec<PathBuf> = if program.contains('/') {
        vec![agent_dir.join(program)]
    } else {
        ["/usr/local/bin", "/usr/bin", "/bin"]
            .iter()
            .map(|d| Path::new(d).join(program))
            .collect()
    };
    let runnable = candidates.iter().any(|p| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    });
    if runnable {
        return Ok(());
    }
    Err(RunError::Refused(Refusal::RunnerProgram {
        namespace: namespace.to_owned(),
        program: program.clone(),
        looked: candidates
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A home inside the agent's directory is refused by name, however the
    /// path is spelt (a symlink to it, `..`); a home beside it, or an
    /// agent's directory inside the home (`airlock serve`'s bundles), is not.
    #[test]
    fn a_home_inside_the_agents_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let agent = dir.path().join("agent");
        let home = agent.join(".airlock");
        std::fs::create_dir_all(&home).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&agent, &link).unwrap();
        for spelt in [
            home.clone(),
            link.join(".airlock"),
            agent.join("x/../.airlock"),
        ] {
            std::fs::create_dir_all(agent.join("x")).unwrap();
            let e = home_outside_agent_dir(&spelt, &agent)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("contains Airlock's home") && e.contains("AIRLOCK_HOME"),
                "{e}"
            );
        }
        let e = home_outside_agent_dir(&agent, &link)
            .unwrap_err()
            .to_string();
        assert!(e.contains("contains Airlock's home"), "{e}");
        let beside = dir.path().join("home");
        std::fs::create_dir_all(beside.join("bundles/a")).unwrap();
        assert!(home_outside_agent_dir(&beside, &agent).is_ok());
        assert!(home_outside_agent_dir(&beside, &beside.join("bundles/a")).is_ok());
    }

    #[test]
    fn local_runners_start_only_where_they_are_isolated() {
        use airlock_sandbox::docker::{DockerBackend, DockerConfig};
        let docker = |runtime: Option<&str>| {
            let mut vars = std::collections::HashMap::new();
            if let Some(r) = runtime {
                vars.insert("DOCKER_RUNTIME".to_owned(), r.to_owned());
            }
            DockerBackend::new(
                DockerConfig::from_vars(&vars, Path::new("/usr/bin/airlock")).unwrap(),
            )
        };
        assert!(refuse_local_runner(&docker(None), "gh").is_ok());
        assert!(refuse_local_runner(&docker(Some("runc")), "gh").is_ok());
        // gVisor too: one that may not connect to a bound socket is refused
        // at the backend's boot, for the agent as for a runner.
        assert!(refuse_local_runner(&docker(Some("runsc")), "gh").is_ok());
        let process = airlock_sandbox::process::ProcessBackend;
        let e = refuse_local_runner(&process, "gh").unwrap_err().to_string();
        assert!(
            e.contains("integration gh: ") && e.contains("the process backend isolates nothing"),
            "{e}"
        );
        assert!(e.contains("RUN_ADAPTER=namespace"), "{e}");
    }

    #[test]
    fn a_runner_program_is_found_as_the_sandbox_would_find_it() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("server.sh");
        std::fs::write(&script, "#!/bin/sh\n").unwrap();
        let cmd = |p: &str| vec![p.to_owned()];
        // Not executable yet: refused; then found relative to the agent's directory.
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
        let check = |p: &str, host: bool| check_runner_program("x", &cmd(p), dir.path(), host);
        assert!(check("./server.sh", true).is_err());
        // (Docker: the agent's directory is bound at the same path: checked too.)
        assert!(check("./server.sh", false).is_err());
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(check("./server.sh", true).is_ok());
        assert!(check(script.to_str().unwrap(), true).is_ok());
        assert!(check(script.to_str().unwrap(), false).is_ok());
        // A bare name on the sandbox's PATH; a directory is not a program.
        assert!(check("sh", true).is_ok());
        let e = check("/usr/bin", true).unwrap_err();
        assert!(e.to_string().contains("is not an executable file"), "{e}");
        assert!(check("nosuchserver", true).is_err());
        assert!(check("./nosuch.py", false).is_err());
        // Docker: a program of the image is not the host's to judge.
        assert!(check("nosuchserver", false).is_ok());
        assert!(check("/usr/bin/pyhton3", false).is_ok());
    }
}
