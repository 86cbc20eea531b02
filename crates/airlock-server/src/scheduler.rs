//! This replica's share of the work.
//!
//! - It registers in the store's replica set and heartbeats every fifth of
//!   the lease. If a heartbeat finds its row gone, another replica judged it
//!   dead and failed its runs: it stops.
//! - Whoever holds the `leader` lease (taken over once its holder stops
//!   renewing it) sweeps: replicas silent past the lease are dropped and
//!   their runs failed ([`airlock_store::Store::sweep_dead_replicas`]),
//!   never a live replica's.
//! - Queued runs are claimed in order, atomically, within
//!   `PLATFORM_RUN_LIMITS` `max_concurrent_runs` (shared by every replica and
//!   every `airlock run` on the store) and each organization's own limit.
//!   A claimed run is this replica's; its own watchdog, timeout and
//!   cancellation apply (the orchestrator's).
//! - Cancel requests for its runs (made through any replica) are polled.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use airlock_platform::manifest::Manifest;
use airlock_platform::orchestrator::RunRequest;
use airlock_store::ClaimedRun;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use crate::{AppState, ServeError};

/// The lease the leader holds.
pub const LEADER_LEASE: &str = "leader";
/// How often an idle scheduler looks at the queue (runs queued through
/// another replica are seen within this).
const QUEUE_POLL: Duration = Duration::from_millis(200);
/// How often cancel requests made through other replicas are looked for.
const CANCEL_POLL: Duration = Duration::from_millis(300);

/// The replica's background work.
pub struct Work {
    tasks: Vec<JoinHandle<()>>,
    /// Notified when the replica finds itself judged dead.
    pub dead: Arc<Notify>,
    dead_flag: Arc<AtomicBool>,
}

impl Work {
    pub fn judged_dead(&self) -> bool {
        self.dead_flag.load(Ordering::Acquire)
    }

    /// Stops taking work, cancels this replica's runs, waits for them to
    /// end, and leaves the replica set (and the lease).
    pub async fn finish(self, app: &AppState) {
        app.stop();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while app.running_count() > 0 && tokio::time::Instant::now() < deadline {
            tokio::select! {
                () = app.inner.kick.notified() => {}
                () = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
        }
        for t in &self.tasks {
            t.abort();
        }
        if !self.judged_dead() {
            let _ = app.store().remove_replica(app.replica()).await;
        }
        let _ = app.store().release_lease(LEADER_LEASE, app.replica()).await;
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "unknown".into())
}

pub async fn start(app: AppState) -> Result<Work, ServeError> {
    app.store()
        .register_replica(app.replica(), &hostname(), std::process::id())
        .await?;
    tracing::info!(replica = app.replica(), "replica registered");
    let dead = Arc::new(Notify::new());
    let dead_flag = Arc::new(AtomicBool::new(false));
    let beat = app.cfg().replica_lease / 5;
    let mut tasks = Vec::new();
    {
        let app = app.clone();
        let dead = dead.clone();
        let flag = dead_flag.clone();
        tasks.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(beat);
            loop {
                tick.tick().await;
                match app.store().heartbeat_replica(app.replica()).await {
                    Ok(true) => tracing::trace!(replica = app.replica(), "heartbeat"),
                    Ok(false) => {
                        tracing::error!(
                            replica = app.replica(),
                            "this replica was judged dead by the leader (its heartbeats stopped reaching the store); stopping"
                        );
                        flag.store(true, Ordering::Release);
                        app.stop();
                        dead.notify_one();
                        return;
                    }
                    Err(e) => tracing::warn!("replica heartbeat: {e}"),
                }
            }
        }));
    }
    {
        let app = app.clone();
        tasks.push(tokio::spawn(async move {
            let lease_ms = i64::try_from(app.cfg().replica_lease.as_millis()).unwrap_or(i64::MAX);
            let mut tick = tokio::time::interval(beat);
            let mut leading = false;
            loop {
                tick.tick().await;
                match app
                    .store()
                    .try_lease(LEADER_LEASE, app.replica(), lease_ms)
                    .await
                {
                    Ok(now) => {
                        if now != leading {
                            tracing::info!(replica = app.replica(), leader = now, "leader lease");
                        }
                        leading = now;
                    }
                    Err(e) => {
                        tracing::warn!("leader lease: {e}");
                        leading = false;
                    }
                }
                if !leading {
                    continue;
                }
                match app.store().sweep_dead_replicas(lease_ms).await {
                    Ok(failed) => {
                        // A replica on this machine leaves its runs' cgroups
                        // behind (its sandboxes died with it), and the
                        // standby ones it made for its next run: removed
                        // here, not only when it boots again on its home,
                        // which may never happen. Elsewhere nothing matches.
                        let cgroups = airlock_platform::orchestrator::reclaim_cgroups_of(&failed)
                            + airlock_platform::orchestrator::reclaim_standby_cgroups();
                        if cgroups > 0 {
                            tracing::info!(
                                "removed {cgroups} cgroup(s) of platforms that are gone"
                            );
                        }
                        for id in failed {
                            tracing::warn!(run = %id, "failed a run of a replica that is gone");
                            if let Ok(Some(run)) = app.store().get_run(&id).await {
                                crate::webhooks::emit(&app, &run).await;
                            }
                        }
                    }
                    Err(e) => tracing::warn!("replica sweep: {e}"),
                }
            }
        }));
    }
    {
        let app = app.clone();
        tasks.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(CANCEL_POLL);
            loop {
                tick.tick().await;
                if let Ok(ids) = app.store().cancel_requests_of(app.replica()).await {
                    for id in ids {
                        app.cancel_local(&id);
                    }
                }
            }
        }));
    }
    tasks.push(tokio::spawn(claim_loop(app.clone())));
    tasks.push(tokio::spawn(crate::webhooks::deliver_loop(app.clone())));
    Ok(Work {
        tasks,
        dead,
        dead_flag,
    })
}

async fn claim_loop(app: AppState) {
    let limit = app.orch().settings.limits.max_concurrent_runs;
    loop {
        if app.is_stopping() {
            return;
        }
        // This replica's own capacity, beside the store-wide limits.
        let full = app
            .cfg()
            .replica_max_runs
            .is_some_and(|cap| app.running_count() >= cap);
        if full {
            tokio::select! {
                () = app.inner.kick.notified() => {}
                () = tokio::time::sleep(QUEUE_POLL) => {}
            }
            continue;
        }
        match app.store().claim_next_run(app.replica(), limit).await {
            Ok(Some(claimed)) => {
                spawn_run(app.clone(), claimed);
                continue;
            }
            Ok(None) => {}
            Err(e) => tracing::warn!("claiming a queued run: {e}"),
        }
        tokio::select! {
            () = app.inner.kick.notified() => {}
            () = tokio::time::sleep(QUEUE_POLL) => {}
        }
    }
}

fn spawn_run(app: AppState, claimed: ClaimedRun) {
    let id = claimed.run.id.clone();
    let (tx, rx) = watch::channel(false);
    if let Ok(mut r) = app.inner.running.lock() {
        r.insert(id.clone(), tx);
    }
    tokio::spawn(async move {
        crate::webhooks::emit(&app, &claimed.run).await;
        let ended = run_one(&app, claimed, rx).await;
        if let Err(e) = &ended {
            tracing::error!(run = %id, "run: {e}");
            let _ = app.store().fail_run(&id, e).await;
        }
        if let Ok(mut r) = app.inner.running.lock() {
            r.remove(&id);
        }
        if let Ok(Some(run)) = app.store().get_run(&id).await {
            crate::webhooks::emit(&app, &run).await;
        }
        // A slot is free (and `finish` waits on this too).
        app.inner.kick.notify_waiters();
        app.kick_scheduler();
    });
}

/// The limit hints a run was queued with.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hints {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u64>,
}

async fn run_one(
    app: &AppState,
    claimed: ClaimedRun,
    cancel: watch::Receiver<bool>,
) -> Result<(), String> {
    let run = &claimed.run;
    let orch = app.orch();
    let fail = |reason: String| async move {
        app.store()
            .fail_run(&run.id, &reason)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    let Some(agent) = app
        .store()
        .get_agent(&run.org_id, &run.agent)
        .await
        .map_err(|e| e.to_string())?
    else {
        return fail(format!(
            "agent {:?} was deleted before the run started",
            run.agent
        ))
        .await;
    };
    let mut manifest = match Manifest::parse(&agent.manifest) {
        Ok(m) => m,
        Err(e) => return fail(format!("the agent's manifest: {e}")).await,
    };
    if let Some(h) = claimed.hints.as_deref() {
        let h: Hints = serde_json::from_str(h).map_err(|e| e.to_string())?;
        if h.memory_mb.is_some() {
            manifest.agent.memory_mb = h.memory_mb;
        }
        if h.cpus.is_some() {
            manifest.agent.cpus = h.cpus;
        }
        if h.timeout_seconds.is_some() {
            manifest.agent.timeout = h.timeout_seconds;
        }
    }
    let files: BTreeMap<String, String> =
        serde_json::from_str(&agent.files).map_err(|e| e.to_string())?;
    let bundle = orch.home.join("bundles").join(&run.id);
    if let Err(e) = write_bundle(&bundle, &agent.manifest, &files) {
        let _ = std::fs::remove_dir_all(&bundle);
        return fail(format!("writing the agent's files: {e}")).await;
    }
    let req = RunRequest {
        org: run.org_id.clone(),
        manifest,
        agent_dir: bundle.clone(),
        prompt: claimed.prompt.clone(),
        command: None,
    };
    let outcome = orch
        .run_claimed(run.id.clone(), req, cancel, &|_p| {})
        .await;
    let _ = std::fs::remove_dir_all(&bundle);
    outcome.map(|_| ()).map_err(|e| e.to_string())
}

/// The agent's directory for one run: its manifest and files, readable by
/// the sandbox (which mounts it read-only), nothing else.
fn write_bundle(
    dir: &std::path::Path,
    manifest: &str,
    files: &BTreeMap<String, String>,
) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    let write = |rel: &str, body: &str| -> std::io::Result<()> {
        // Paths were checked at registration (relative, no `..`); checked again.
        crate::routes::agents::check_path(rel)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.message))?;
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(parent)?;
        }
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)?;
        std::io::Write::write_all(&mut f, body.as_bytes())?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))
    };
    write("airlock.toml", manifest)?;
    for (rel, body) in files {
        if rel != "airlock.toml" {
            write(rel, body)?;
        }
    }
    Ok(())
}
