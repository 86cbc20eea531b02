//! The docker backend's warm pool: pairs (an agent container and its
//! sidecar's, shaped as a cold run's) started before any run, kept up
//! to `DOCKER_WARM_POOL` per [`PoolKey`], each claimed by one run and
//! removed with it. The pair that replaces a claimed one is started once
//! the run that claimed it has ended ([`crate::Backend::run_ended`]), so
//! the daemon's work for it does not slow that run; at the claim when it
//! took the last idle pair of its key.
//!
//! A pooled pair holds nothing of any run until claimed. Its agent
//! container runs `airlock container-init --command-on-stdin -- airlock
//! runtime --` and its sidecar `airlock sidecar`, both waiting on stdin;
//! their only host directories are the pair's own, empty: `view/` (bound
//! read-only where the agent's directory's parent is) and `run/` (bound at
//! `/run/airlock` in the sidecar, beside the platform's socket), whose
//! `agent/` is the agent's sockets' directory (bound read-only at
//! `/run/airlock` in the agent, and so at
//! [`super::AGENT_SOCKETS_IN_SIDECAR`] in the sidecar, where a cold run's
//! is), and the agent's resolver file (`run/agent.resolv.conf`,
//! [`super::plane`]). At the claim ([`DockerBackend::claim_pair`]) the
//! run's agent directory is copied into `view/`, its egress journal
//! hard-linked into `run/`, the run's sockets' directory made a link to
//! `run/agent/` (where the platform opens the sidecar's sockets to the
//! agent), the containers renamed to the run's names, the agent's command
//! written to its stdin, the sidecar's configuration to the sidecar's, and
//! the runtime's secrets once the sidecar is ready, as for a cold start.
//!
//! Which runs can take a pair is [`PoolKey::of`]'s decision: an agent with
//! no local runner, one agent directory whose parent is not a directory of
//! the image or of the container's own mounts, small enough to copy.
//! Every other run starts cold, as does a run that finds no idle pair.
//!
//! Per-tenant share: one tenant holds at most [`crate::warm::share_of`] claimed
//! pairs at once (half the pool, at least one); its runs beyond start
//! cold, so one organization cannot drain the pool for the others.
//!
//! Pairs carry the owner label every object of the backend carries: a
//! platform that dies (SIGKILL) leaves them to the next boot's reclaim
//! ([`super::reclaim`]); its pair directories are removed by the next
//! pool of the same home ([`reclaim_dirs`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncWriteExt;

use super::{
    AIRLOCK_IN_IMAGE, DockerBackend, EGRESS_JOURNAL_INSIDE, Feed, Parked, SOCKETS_INSIDE,
    container_name, init,
};
pub use crate::warm::PoolStatus;
use crate::warm::{Late, Share, Shelf};
use crate::{Sandbox, SandboxKind, SandboxSpec, SidecarSpec};

/// Labels a pooled pair's containers: `true`.
pub const LABEL_POOL: &str = "airlock.pool";
/// The prefix of a pair's id: its containers' names until claimed are
/// `airlock-pool_…-agent` and `airlock-pool_…-sidecar`.
pub const PAIR_PREFIX: &str = "pool_";
/// The directory of `$AIRLOCK_HOME` that holds the pairs' directories.
pub const POOL_DIR: &str = "pool";
/// How long a pair has to start before it is given up.
const FILL_WITHIN: Duration = Duration::from_secs(60);
/// First components of an agent directory's parent that a pair cannot bind
/// over or under: the image's own directories.
const IMAGE_DIRS: &[&str] = &[
    "bin", "boot", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "run", "sbin", "sys",
    "usr",
];
/// The container's own mounts: a pair's view may be under them (as a cold
/// start's agent directory may), not over them.
const OWN_MOUNTS: &[&str] = &["/tmp"];

/// How many claimed pairs one tenant may hold at once: the decision every
/// pool shares ([`crate::warm`]).
pub use crate::warm::share_of;

/// What a pooled pair is made for: everything of its two containers that
/// is fixed when they are created. Two runs with the same key can take
/// each other's pairs; nothing in it belongs to a run.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PoolKey {
    /// The launcher before the agent's command (`airlock runtime --`).
    launcher: Vec<String>,
    env: Vec<(String, String)>,
    /// Where the agent's directory's parent is, in the agent container.
    view: PathBuf,
    workspace: PathBuf,
    workspace_size_mb: u64,
    memory_mb: u64,
    millicpus: u64,
    pids_max: u64,
    sidecar_log: String,
    platform_socket: PathBuf,
    /// `$AIRLOCK_HOME/pool`: beside the runs' directories (one filesystem,
    /// so the run's journal can be linked into the pair's).
    pool_dir: PathBuf,
}

/// Why a run starts cold (said at debug level).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cold {
    NotAnAgent,
    LocalRunners,
    NotOneDirectory,
    ViewOverImage,
    NoLauncher,
    JournalOutsideRuns,
}

impl PoolKey {
    /// The key of a run of `sandbox` and `sidecar`, its agent's command and
    /// its agent directory; or why it starts cold.
    pub fn of(
        sandbox: &SandboxSpec,
        sidecar: &SidecarSpec,
    ) -> Result<(PoolKey, Vec<String>, PathBuf), Cold> {
        if sandbox.kind != SandboxKind::Agent {
            return Err(Cold::NotAnAgent);
        }
        if !sidecar.runner_dirs.is_empty() {
            return Err(Cold::LocalRunners);
        }
        let [dir] = sandbox.ro_paths.as_slice() else {
            return Err(Cold::NotOneDirectory);
        };
        if !dir.is_dir() || !dir.is_absolute() || dir.file_name().is_none() {
            return Err(Cold::NotOneDirectory);
        }
        let view = dir.parent().ok_or(Cold::ViewOverImage)?;
        if !view_allowed(view, &sandbox.workspace) {
            return Err(Cold::ViewOverImage);
        }
        let split = sandbox
            .command
            .iter()
            .position(|a| a == "--")
            .ok_or(Cold::NoLauncher)?;
        let (launcher, command) = sandbox.command.split_at(split + 1);
        if command.is_empty() || launcher.first().map(String::as_str) != Some(AIRLOCK_IN_IMAGE) {
            return Err(Cold::NoLauncher);
        }
        // `$AIRLOCK_HOME/runs/<id>/egress.journal`.
        let home = crate::warm::home_of(sidecar).ok_or(Cold::JournalOutsideRuns)?;
        let key = PoolKey {
            launcher: launcher.to_vec(),
            env: sandbox.env.clone(),
            view: view.to_owned(),
            workspace: sandbox.workspace.clone(),
            workspace_size_mb: sandbox.workspace_size_mb,
            memory_mb: sandbox.memory_mb,
            millicpus: crate::whole(sandbox.cpus * 1000.0, u64::MAX),
            pids_max: sandbox.pids_max,
            sidecar_log: sidecar.log.clone(),
            platform_socket: sidecar.platform_socket.clone(),
            pool_dir: home.join(POOL_DIR),
        };
        Ok((key, command.to_vec(), dir.clone()))
    }
}

/// Whether a pair may bind its `view/` at `view` (the agent directory's
/// parent): not over or under a directory of the image, not over one of
/// the container's own mounts (`workspace` among them), and bindable.
fn view_allowed(view: &Path, workspace: &Path) -> bool {
    let Some(s) = view.to_str() else {
        return false;
    };
    let parts: Vec<&str> = s.split('/').filter(|p| !p.is_empty()).collect();
    let first = parts.first().copied().unwrap_or("");
    view.is_absolute()
        && !s.contains(':')
        && !parts.is_empty()
        && !IMAGE_DIRS.contains(&first)
        // `/var` and `/var/lib` hold the image's own state; deeper is free.
        && (first != "var" || parts.len() >= 3)
        && !OWN_MOUNTS.iter().any(|m| Path::new(m).starts_with(view))
        && !workspace.starts_with(view)
}

/// A pair's host directory and, once claimed, its tenant's share: the
/// share given back once its agent has stopped, the directory removed
/// when both of the pair's containers are let go.
pub struct SlotGuard {
    dir: PathBuf,
    share: Mutex<Option<Share>>,
}

impl SlotGuard {
    /// Gives the tenant's share back: the pair's run is over (its agent
    /// has stopped), though its containers may not be removed yet.
    pub(crate) fn release_share(&self) {
        if let Ok(mut s) = self.share.lock() {
            s.take();
        }
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One container of a pair: its handle and, once started, its stdin.
struct Half {
    sandbox: Sandbox,
    parked: Parked,
}

/// A started pair, idle.
pub(crate) struct Pair {
    id: String,
    guard: Arc<SlotGuard>,
    agent: Half,
    sidecar: Half,
}

/// A pair claimed by a run, until its two spawns take it.
pub(crate) struct Claimed {
    agent: Option<(Half, Vec<String>)>,
    sidecar: Option<Half>,
    /// Told once both containers bear the run's names (renamed from the
    /// claim on): the agent gets its secrets only then.
    renamed: Option<tokio::sync::oneshot::Receiver<()>>,
}

/// The pool of one backend: idle pairs per key on the shared shelf
/// ([`crate::warm::Shelf`]). A pair that finishes starting once the
/// platform stops is kept for [`DockerBackend::drain_pool`], which waits
/// for those starting (at most [`FILL_WITHIN`]) and removes them all with
/// a client of its own.
pub(crate) type Pool = Shelf<PoolKey, Pair, Claimed>;

/// The pool of `size` pairs per key (0: none).
pub(crate) fn new_pool(size: usize) -> Pool {
    Shelf::new(size, Late::Keep)
}

/// An idle pair of `key`, taken for `tenant` within its share: its share
/// held by its slot until the run's agent has stopped.
fn take(pool: &Pool, key: &PoolKey, tenant: &str) -> Option<Pair> {
    let (pair, share) = pool.take(key, tenant)?;
    if let Ok(mut s) = pair.guard.share.lock() {
        *s = Some(share);
    }
    Some(pair)
}

/// A pair taken for a run that could not take it (nothing of the run left
/// in it): its tenant's share given back, idle again or gone
/// ([`Shelf::put_back`]).
fn put_back(pool: &Pool, key: &PoolKey, pair: Pair) {
    pair.guard.release_share();
    pool.put_back(key, pair);
}

/// The pair's agent sockets' directory, in its `run/`.
const AGENT_SOCKETS: &str = "run/agent";

/// Makes the run's sockets' directory `run_sockets` (empty, the
/// platform's) a link to the claimed pair's, `pair_sockets`: the platform
/// opens the sidecar's sockets to the agent where it made the directory.
/// A link that cannot be made leaves the directory as it was.
fn link_sockets(run_sockets: &Path, pair_sockets: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let mode = std::fs::metadata(run_sockets)?.permissions().mode();
    std::fs::remove_dir(run_sockets)?;
    std::os::unix::fs::symlink(pair_sockets, run_sockets).inspect_err(|_| {
        let _ = std::fs::DirBuilder::new().mode(mode).create(run_sockets);
        let _ = std::fs::set_permissions(run_sockets, std::fs::Permissions::from_mode(mode));
    })
}

/// Removes `path` (a directory with all it holds, or a file); gone
/// already is fine.
fn remove_any(path: &Path) -> std::io::Result<()> {
    let removed = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
    };
    match removed {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// This platform's directory of pairs under `pool_dir`, named for its
/// owner label (`:` is not bindable).
pub(crate) fn own_dir(pool_dir: &Path, owner: &str) -> PathBuf {
    pool_dir.join(owner.replace(':', "_"))
}

/// Removes the pair directories of platforms that are gone (their
/// containers went at the boot reclaim).
pub fn reclaim_dirs(pool_dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(pool_dir) else {
        return 0;
    };
    let mut removed = 0;
    for e in entries.flatten() {
        let label = e.file_name().to_string_lossy().replace('_', ":");
        if super::reclaim::judge_owner(Some(&label)) == super::reclaim::Owner::Dead
            && std::fs::remove_dir_all(e.path()).is_ok()
        {
            removed += 1;
        }
    }
    removed
}

/// A fresh pair id (`pool_` and 12 hex digits).
fn pair_id() -> String {
    use sha2::Digest;
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let h = sha2::Sha256::digest(format!("{}:{t}:{n}", std::process::id()));
    format!("{PAIR_PREFIX}{}", hex::encode(&h[..6]))
}

/// Creates `dir` with `mode`.
fn make_dir(dir: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
}

/// Copies the agent's directory `from` to `to` (modes kept, symbolic links
/// as links), within [`crate::warm::walk_view`]'s bounds; anything else (a
/// device, a socket, too much) is refused.
fn copy_view(from: &Path, to: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    // Each directory's mode once what it holds is in (it may be read-only).
    let mut dirs = vec![];
    crate::warm::walk_view(from, &mut |path, rel, meta| {
        let at = to.join(rel);
        let ft = meta.file_type();
        if ft.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(path)?, &at)
        } else if ft.is_dir() {
            std::fs::create_dir(&at)?;
            dirs.push((at, meta.mode() & 0o7777));
            Ok(())
        } else {
            std::fs::copy(path, &at).map(drop)
        }
    })?;
    for (dir, mode) in dirs.into_iter().rev() {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

impl DockerBackend {
    /// Sets aside an idle pair for the run of `sandbox` and `sidecar`
    /// (tenant `tenant`), made ready for it: its agent directory copied in,
    /// its journal linked in. Refills the pool of its key: at once when it
    /// finds none idle or takes the last, else once the run has ended.
    pub(crate) fn claim_pair(
        &self,
        tenant: &str,
        sandbox: &SandboxSpec,
        sidecar: &SidecarSpec,
    ) -> bool {
        if self.pool.size() == 0 {
            return false;
        }
        let (key, command, dir) = match PoolKey::of(sandbox, sidecar) {
            Ok(k) => k,
            Err(why) => {
                tracing::debug!(run = %sandbox.run_id, "cold start: {why:?}");
                return false;
            }
        };
        let Some(pair) = take(&self.pool, &key, tenant) else {
            self.refill(&key);
            return false;
        };
        // Checked as a cold start checks it, with the pair's uid; a pair
        // that cannot take the run goes back, holding nothing of it.
        if let Err(e) = crate::namespace::readable_by(&dir, super::agent_ids(&pair.id)) {
            tracing::debug!(run = %sandbox.run_id, "cold start: {e}");
            put_back(&self.pool, &key, pair);
            return false;
        }
        let view = pair
            .guard
            .dir
            .join("view")
            .join(dir.file_name().unwrap_or_default());
        let journal = pair.guard.dir.join("run").join(
            Path::new(EGRESS_JOURNAL_INSIDE)
                .file_name()
                .unwrap_or_default(),
        );
        let ready = copy_view(&dir, &view)
            .and_then(|()| std::fs::hard_link(&sidecar.egress_journal, &journal))
            .and_then(|()| link_sockets(&sandbox.sockets_dir, &pair.guard.dir.join(AGENT_SOCKETS)));
        if let Err(e) = ready {
            tracing::debug!(run = %sandbox.run_id, "cold start: the pair cannot take the run: {e}");
            let emptied = [view.as_path(), journal.as_path()]
                .iter()
                .all(|p| remove_any(p).is_ok());
            if emptied {
                put_back(&self.pool, &key, pair);
            }
            return false;
        }
        // The pair that replaces this one starts once the run's end is
        // recorded ([`DockerBackend::refill_pool`]), off the run's path;
        // at once when none is left idle (the next run would start cold).
        if self.pool.idle_of(&key) == 0 {
            self.refill(&key);
        }
        let Pair {
            agent, sidecar: sc, ..
        } = pair;
        let ids = [agent.parked.id.clone(), sc.parked.id.clone()];
        let claimed = Claimed {
            agent: Some((agent, command)),
            sidecar: Some(sc),
            renamed: self.rename_claimed(&sandbox.run_id, ids),
        };
        self.pool
            .claimed(|c| c.insert(sandbox.run_id.clone(), claimed));
        true
    }

    /// The claimed agent container of run `spec.run_id`, if it has one: its
    /// command written to its stdin now, its secrets once released.
    pub(crate) fn take_claimed_agent(&self, spec: &SandboxSpec) -> Option<Sandbox> {
        let (half, command, renamed) = self.pool.claimed(|claimed| {
            let c = claimed.get_mut(&spec.run_id)?;
            let (half, command) = c.agent.take()?;
            Some((half, command, c.renamed.take()))
        })?;
        let Half {
            mut sandbox,
            parked,
        } = half;
        if let Some(c) = sandbox.container_mut() {
            c.name_by_id(parked.id.clone());
        }
        let gate = spec.hold_stdin.then(|| sandbox.gate_stdin());
        let secrets = spec.stdin.clone();
        let mut input = parked.input;
        tokio::spawn(async move {
            if input
                .write_all(&init::command_header(&command))
                .await
                .is_err()
            {
                return;
            }
            if let Some(gate) = gate
                && gate.await.is_err()
            {
                let _ = input.shutdown().await;
                return;
            }
            // The pair bears the run's names before its agent runs (a
            // rename that failed was said; the run goes on by ids).
            if let Some(renamed) = renamed {
                let _ = renamed.await;
            }
            let _ = input.write_all(&secrets).await;
            let _ = input.shutdown().await;
        });
        Some(sandbox)
    }

    /// Renames the claimed pair's containers (`ids`: agent, sidecar) to
    /// run `run`'s names, in the background from the claim on, beside the
    /// sidecar's start; what tells once both are done (or given up: said
    /// as a warning). The agent's secrets wait for it, so nothing of the
    /// run runs under the pair's names.
    fn rename_claimed(
        &self,
        run: &str,
        ids: [String; 2],
    ) -> Option<tokio::sync::oneshot::Receiver<()>> {
        let handle = tokio::runtime::Handle::try_current().ok()?;
        let (done, renamed) = tokio::sync::oneshot::channel();
        let run = run.to_owned();
        let (host, daemon) = (self.cfg.host.clone(), self.docker.clone());
        handle.spawn(async move {
            if let Ok(d) = super::client_of(&daemon, &host).await {
                let [agent, sidecar] = ids;
                let rename = |id: String, role: &'static str| {
                    let d = d.clone();
                    let name = container_name(&run, role);
                    async move {
                        let opts =
                            bollard::query_parameters::RenameContainerOptionsBuilder::default()
                                .name(&name)
                                .build();
                        if let Err(e) = d.rename_container(&id, opts).await {
                            tracing::warn!("renaming the pooled {role} container to {name}: {e}");
                        }
                    }
                };
                futures_util::future::join(rename(agent, "agent"), rename(sidecar, "sidecar"))
                    .await;
            }
            let _ = done.send(());
        });
        Some(renamed)
    }

    /// The claimed sidecar container of run `spec.run_id`, if it has one:
    /// its configuration written to its stdin at once (the pair's renames
    /// go on beside it, [`DockerBackend::rename_claimed`]).
    pub(crate) fn take_claimed_sidecar(&self, spec: &SidecarSpec) -> Option<Sandbox> {
        let Claimed { sidecar, .. } = self.pool.claimed(|c| c.remove(&spec.run_id))?;
        let Half {
            mut sandbox,
            parked,
        } = sidecar?;
        if let Some(c) = sandbox.container_mut() {
            c.name_by_id(parked.id.clone());
        }
        let config = spec.config.clone();
        let mut input = parked.input;
        tokio::spawn(async move {
            let _ = input.write_all(&config).await;
            let _ = input.shutdown().await;
        });
        Some(sandbox)
    }

    /// Starts the pairs every key lacks, in the background (a run's end
    /// is recorded).
    pub(crate) fn refill_pool(&self) {
        for key in &self.pool.keys() {
            self.refill(key);
        }
    }

    /// Starts the pairs `key` lacks, in the background.
    fn refill(&self, key: &PoolKey) {
        self.pool
            .refill(key, &key.pool_dir, "a warm pair", |k| self.fill_one(k));
    }

    /// Starts one pair of `key`; it joins the pool once both have started.
    fn fill_one(&self, key: &PoolKey) -> Result<(), crate::SandboxError> {
        let id = pair_id();
        let dir = own_dir(&key.pool_dir, &self.owner).join(&id);
        make_dir(&dir.join("view"), 0o755)?;
        make_dir(&dir.join("run"), 0o700)?;
        // The platform's sockets' directory's mode (its `create_sockets_dir`).
        make_dir(&dir.join(AGENT_SOCKETS), 0o711)?;
        let guard = Arc::new(SlotGuard {
            dir: dir.clone(),
            share: Mutex::new(None),
        });
        // The agent's first: neither waits for the other (nothing of the
        // agent's looks up its sidecar before the claim).
        let bodies = self.pooled_bodies(key, &id, &dir)?;
        let mut started = Vec::with_capacity(2);
        for (role, body) in bodies {
            let (tx, rx) = tokio::sync::oneshot::channel::<Parked>();
            let feed = Feed::Parked(tx);
            let mut sb = self.launch(
                &id,
                container_name(&id, role),
                body,
                feed,
                role == "sidecar",
            )?;
            if let Some(c) = sb.container_mut() {
                c.hold_slot(guard.clone());
            }
            started.push((sb, rx));
        }
        let (Some((sidecar, sidecar_rx)), Some((agent, agent_rx))) = (started.pop(), started.pop())
        else {
            self.pool.settle(key, None);
            return Ok(());
        };
        let (shelf, key) = (self.pool.clone(), key.clone());
        tokio::spawn(async move {
            let both = futures_util::future::join(agent_rx, sidecar_rx);
            let pair = match tokio::time::timeout(FILL_WITHIN, both).await {
                Ok((Ok(a), Ok(s))) => Some(Pair {
                    id,
                    guard,
                    agent: Half {
                        sandbox: agent,
                        parked: a,
                    },
                    sidecar: Half {
                        sandbox: sidecar,
                        parked: s,
                    },
                }),
                _ => None,
            };
            shelf.settle(&key, pair);
        });
        Ok(())
    }

    /// A pair's two containers. The agent's: the cold one's confinement
    /// and limits, its command read from stdin at the claim, the pair's
    /// `view/` bound read-only where the agent's directory's parent is. The
    /// sidecar's: the cold one's, with the pair's `run/` at `/run/airlock`
    /// (the run's journal is linked into it at the claim) beside the
    /// platform's socket.
    fn pooled_bodies(
        &self,
        key: &PoolKey,
        id: &str,
        dir: &Path,
    ) -> Result<[(&'static str, bollard::models::ContainerCreateBody); 2], crate::SandboxError>
    {
        let (view, run) = (dir.join("view"), dir.join("run"));
        let sockets = dir.join(AGENT_SOCKETS);
        let mut agent = self.sandbox_body(&SandboxSpec {
            run_id: id.to_owned(),
            command: key.launcher.clone(),
            env: key.env.clone(),
            stdin: Vec::new(),
            hold_stdin: false,
            sockets_dir: sockets.clone(),
            ro_paths: Vec::new(),
            workspace: key.workspace.clone(),
            workspace_size_mb: key.workspace_size_mb,
            memory_mb: key.memory_mb,
            cpus: key.millicpus as f64 / 1000.0,
            pids_max: key.pids_max,
            kind: SandboxKind::Agent,
        })?;
        if let Some(cmd) = agent.cmd.as_mut() {
            // `airlock container-init --command-on-stdin -- LAUNCHER…`
            cmd.insert(2, "--command-on-stdin".into());
        }
        let view_bind = format!(
            "{}:{}:ro",
            super::bindable(&view)?,
            super::bindable(&key.view)?
        );
        if let Some(hc) = agent.host_config.as_mut() {
            hc.binds.get_or_insert_with(Vec::new).push(view_bind);
        }
        let mut sidecar = self.sidecar_body(&SidecarSpec {
            run_id: id.to_owned(),
            exe: PathBuf::from(AIRLOCK_IN_IMAGE),
            own_binary: None,
            log: key.sidecar_log.clone(),
            config: Vec::new(),
            platform_socket: key.platform_socket.clone(),
            egress_journal: run.join("egress.journal"),
            sockets_dir: sockets,
            runner_dirs: Vec::new(),
        })?;
        let binds = vec![
            format!("{}:{SOCKETS_INSIDE}:rw", super::bindable(&run)?),
            format!(
                "{}:{}:ro",
                super::bindable(&key.platform_socket)?,
                super::PLATFORM_SOCKET_INSIDE
            ),
        ];
        if let Some(hc) = sidecar.host_config.as_mut() {
            hc.binds = Some(binds);
        }
        for body in [&mut agent, &mut sidecar] {
            body.labels
                .get_or_insert_with(HashMap::new)
                .insert(LABEL_POOL.into(), "true".into());
        }
        Ok([("agent", agent), ("sidecar", sidecar)])
    }

    /// This process's pool as it stands.
    pub fn pool_status(&self) -> PoolStatus {
        self.pool.status()
    }

    /// Removes every idle pair now (the platform stops), with a client of
    /// its own: the caller's runtime may be about to end.
    pub(crate) fn drain_pool(&self) {
        let (mut pairs, claimed) = self.pool.drain(FILL_WITHIN);
        drop(claimed);
        if pairs.is_empty() {
            return;
        }
        let ids: Vec<String> = pairs
            .iter()
            .flat_map(|p| [p.agent.parked.id.clone(), p.sidecar.parked.id.clone()])
            .collect();
        let host = self.cfg.host.clone();
        super::block_on(async move {
            let Ok(d) = super::connect(&host).await else {
                return;
            };
            let opts = || {
                Some(
                    bollard::query_parameters::RemoveContainerOptionsBuilder::default()
                        .force(true)
                        .build(),
                )
            };
            futures_util::future::join_all(ids.iter().map(|id| d.remove_container(id, opts())))
                .await;
        });
        for p in &mut pairs {
            for sb in [&mut p.agent.sandbox, &mut p.sidecar.sandbox] {
                if let Some(c) = sb.container_mut() {
                    c.disown();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn specs(dir: &Path, home: &Path) -> (SandboxSpec, SidecarSpec) {
        let sandbox = SandboxSpec {
            run_id: "run_x".into(),
            command: vec![
                AIRLOCK_IN_IMAGE.into(),
                "runtime".into(),
                "--".into(),
                "/usr/bin/python3".into(),
                "a.py".into(),
            ],
            env: vec![("PATH".into(), "/usr/bin".into())],
            stdin: b"secret".to_vec(),
            hold_stdin: true,
            sockets_dir: home.join("runs/run_x/sock"),
            ro_paths: vec![dir.to_owned()],
            workspace: "/workspace".into(),
            workspace_size_mb: 16,
            memory_mb: 256,
            cpus: 1.0,
            pids_max: 64,
            kind: SandboxKind::Agent,
        };
        let sidecar = SidecarSpec {
            run_id: "run_x".into(),
            exe: "/usr/local/bin/airlock".into(),
            own_binary: None,
            log: "warn".into(),
            config: b"{}".to_vec(),
            platform_socket: home.join("sockets/p.sock"),
            egress_journal: home.join("runs/run_x/egress.journal"),
            sockets_dir: home.join("runs/run_x/sock"),
            runner_dirs: vec![],
        };
        (sandbox, sidecar)
    }

    /// A home (not under `/tmp`, which a pair cannot bind over), an agent
    /// directory in it, and a run's specs.
    fn fixture() -> (tempfile::TempDir, PathBuf, SandboxSpec, SidecarSpec) {
        let home = tempfile::tempdir_in("/var/tmp").unwrap();
        let dir = home.path().join("bundles/run_x");
        std::fs::create_dir_all(&dir).unwrap();
        let (a, s) = specs(&dir, home.path());
        (home, dir, a, s)
    }

    /// The key holds nothing of the run: two runs of the same agent with
    /// other secrets, ids and commands share it.
    #[test]
    fn the_key_holds_nothing_of_a_run() {
        let (home, dir, a, s) = fixture();
        let (key, command, agent_dir) = PoolKey::of(&a, &s).unwrap();
        assert_eq!(command, ["/usr/bin/python3", "a.py"]);
        assert_eq!(agent_dir, dir);
        let (mut b, mut t) = specs(&dir, home.path());
        b.run_id = "run_y".into();
        b.stdin = b"other".to_vec();
        b.command[4] = "b.py".into();
        t.run_id = "run_y".into();
        t.config = b"{\"x\":1}".to_vec();
        t.egress_journal = home.path().join("runs/run_y/egress.journal");
        assert_eq!(PoolKey::of(&b, &t).unwrap().0, key);
        let k = format!("{key:?}");
        for run_thing in ["run_x", "secret", "a.py", "python3"] {
            assert!(!k.contains(run_thing), "{run_thing} in {k}");
        }
        assert_eq!(key.pool_dir, home.path().join("pool"));
    }

    /// A pooled sidecar, its pair's `run/` at `/run/airlock`, listens for
    /// the agent where a cold one does: the placement is the same for both.
    #[test]
    fn a_pooled_sidecar_sees_its_agents_sockets_where_a_cold_one_does() {
        let inside = Path::new(SOCKETS_INSIDE).join(
            Path::new(AGENT_SOCKETS)
                .strip_prefix("run")
                .expect("in the pair's run/"),
        );
        assert_eq!(inside, Path::new(super::super::AGENT_SOCKETS_IN_SIDECAR));
    }

    /// The run's sockets' directory becomes a link to the pair's; a link
    /// that cannot be made leaves it as it was.
    #[test]
    fn the_runs_sockets_directory_links_to_the_pairs() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let (run, pair) = (t.path().join("sock"), t.path().join("pair"));
        std::fs::create_dir(&run).unwrap();
        std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o711)).unwrap();
        std::fs::create_dir(&pair).unwrap();
        link_sockets(&run, &pair).unwrap();
        assert_eq!(std::fs::read_link(&run).unwrap(), pair);
        std::fs::write(pair.join("sidecar.sock"), "").unwrap();
        assert!(run.join("sidecar.sock").exists());
        // Not an empty directory: refused, left as it was.
        let full = t.path().join("full");
        std::fs::create_dir(&full).unwrap();
        std::fs::write(full.join("x"), "").unwrap();
        assert!(link_sockets(&full, &pair).is_err());
        assert!(full.join("x").exists());
    }

    /// Runs a pair cannot serve start cold.
    #[test]
    fn runs_a_pair_cannot_serve_start_cold() {
        let (_home, dir, a, s) = fixture();
        let mut r = s.clone();
        r.runner_dirs = vec![(dir.clone(), "/run/airlock/runners/runner-0".into())];
        assert_eq!(PoolKey::of(&a, &r).unwrap_err(), Cold::LocalRunners);
        let mut two = a.clone();
        two.ro_paths.push(dir.clone());
        assert_eq!(PoolKey::of(&two, &s).unwrap_err(), Cold::NotOneDirectory);
        let mut runner = a.clone();
        runner.kind = SandboxKind::Runner {
            run: "run_x".into(),
        };
        assert_eq!(PoolKey::of(&runner, &s).unwrap_err(), Cold::NotAnAgent);
        let mut bare = a.clone();
        bare.command = vec!["/bin/true".into()];
        assert_eq!(PoolKey::of(&bare, &s).unwrap_err(), Cold::NoLauncher);
        let mut elsewhere = s.clone();
        elsewhere.egress_journal = "/elsewhere/egress.journal".into();
        assert_eq!(
            PoolKey::of(&a, &elsewhere).unwrap_err(),
            Cold::JournalOutsideRuns
        );
        let ws = Path::new("/workspace");
        for view in [
            "/tmp",
            "/usr/src",
            "/",
            "/var/lib",
            "/workspace",
            "/a:b",
            "/run/x",
        ] {
            assert!(!view_allowed(Path::new(view), ws), "{view}");
        }
        for view in [
            "/srv/agents",
            "/var/lib/airlock/bundles",
            "/home/u",
            "/tmp/x/bundles",
        ] {
            assert!(view_allowed(Path::new(view), ws), "{view}");
        }
    }

    /// An idle pair of pair directory `dir` (its two halves: processes
    /// that sleep, standing for its containers).
    fn idle_pair(id: &str, dir: &Path) -> Pair {
        let half = || {
            let child = tokio::process::Command::new("sleep")
                .arg("600")
                .kill_on_drop(true)
                .spawn()
                .unwrap();
            Half {
                sandbox: Sandbox::new(child, Box::new(|| {}), None).unwrap(),
                parked: Parked {
                    id: id.to_owned(),
                    input: Box::pin(tokio::io::sink()),
                },
            }
        };
        Pair {
            id: id.to_owned(),
            guard: Arc::new(SlotGuard {
                dir: dir.to_owned(),
                share: Mutex::new(None),
            }),
            agent: half(),
            sidecar: half(),
        }
    }

    /// A pair taken for a run that could not take it goes back idle, its
    /// tenant's share given back; one more than the pool holds goes.
    #[tokio::test]
    async fn a_pair_that_cannot_take_its_run_goes_back() {
        let (home, _dir, a, s) = fixture();
        let (key, ..) = PoolKey::of(&a, &s).unwrap();
        let pool = new_pool(1);
        assert!(take(&pool, &key, "org_a").is_none(), "the key is learned");
        assert_eq!(pool.to_fill(&key), 1);
        let dir = home.path().join("pool/p1");
        std::fs::create_dir_all(&dir).unwrap();
        pool.settle(&key, Some(idle_pair("p1", &dir)));
        let p = take(&pool, &key, "org_a").expect("idle");
        assert_eq!(pool.status().claimed.get("org_a"), Some(&1));
        put_back(&pool, &key, p);
        assert_eq!(pool.status().idle, 1);
        assert!(pool.status().claimed.is_empty(), "its share is back");
        assert!(dir.exists(), "kept for the next run");
        let p = take(&pool, &key, "org_a").expect("the same pair, again");
        assert_eq!(p.id, "p1");
        // The pool refilled meanwhile: the pair taken is one too many.
        let other = home.path().join("pool/p2");
        std::fs::create_dir_all(&other).unwrap();
        assert_eq!(pool.to_fill(&key), 1);
        pool.settle(&key, Some(idle_pair("p2", &other)));
        put_back(&pool, &key, p);
        assert_eq!(pool.status().idle, 1);
        assert!(!dir.exists(), "the extra pair went");
        assert!(other.exists());
    }

    /// The pool never starts more than its size per key: what is idle and
    /// what is starting count, and a start that fails is counted out.
    #[test]
    fn the_pool_is_bounded_by_its_size() {
        let (_home, _dir, a, s) = fixture();
        let (key, ..) = PoolKey::of(&a, &s).unwrap();
        let pool = new_pool(2);
        assert_eq!(pool.to_fill(&key), 0, "a key no run has asked for");
        assert!(take(&pool, &key, "org_a").is_none(), "nothing idle yet");
        assert_eq!(pool.to_fill(&key), 2);
        assert_eq!(pool.to_fill(&key), 0, "two are starting");
        assert_eq!(pool.status().filling, 2);
        pool.settle(&key, None);
        assert_eq!(pool.to_fill(&key), 1, "one failed: one more");
        assert_eq!(pool.status().filling, 2);
    }

    /// The agent's directory is copied with its modes and links; anything
    /// else is refused.
    #[test]
    fn the_view_is_a_copy_of_the_agent_directory() {
        use std::os::unix::fs::MetadataExt;
        let t = tempfile::tempdir().unwrap();
        let from = crate::warm::agent_dir_fixture(t.path());
        let to = t.path().join("view/agent");
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        copy_view(&from, &to).unwrap();
        assert_eq!(
            std::fs::read_to_string(to.join("sub/a.py")).unwrap(),
            "print(1)"
        );
        assert_eq!(
            std::fs::metadata(to.join("sub/a.py")).unwrap().mode() & 0o7777,
            0o640
        );
        assert_eq!(
            std::fs::read_link(to.join("link")).unwrap(),
            Path::new("sub/a.py")
        );
        let sock = from.join("s.sock");
        let _l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let again = t.path().join("view/again");
        assert!(copy_view(&from, &again).is_err());
        // What a failed copy left is taken out whole (the pair goes back
        // to the pool empty); gone already is fine.
        remove_any(&again).unwrap();
        assert!(!again.exists());
        remove_any(&again).unwrap();
        let file = t.path().join("view/journal");
        std::fs::write(&file, "x").unwrap();
        remove_any(&file).unwrap();
        assert!(!file.exists());
    }
}
