//! Boot reclaim: what a platform that is gone left behind — run directories
//! (their journal and kept end stored first), runs still `running` in the
//! store with no live owner, the agents' files of ended runs, internal-API
//! sockets, cgroups — is reclaimed by the next platform that starts on the
//! same home. Live runs of other platforms are never touched.

use std::path::{Path, PathBuf};

use airlock_store::{RunStatus, Store, StoreError};
use tokio::sync::Notify;

use super::end::{END_FILE, MAX_END_FILE, PendingEnd, fail_run, store_pending_end};
use super::rundir::{MAX_OWNER_FILE, OWNER_FILE, owner_pid};

/// What a run failed by a boot reclaim records.
const RECLAIMED: &str =
    "the platform stopped while this run was running; reclaimed at the next start";

/// Boot reclaim: run directories whose owner process is gone are removed
/// (their egress journal read into the store first), and runs the store
/// still has as `running` with no live owner are failed (`ends` is told).
pub async fn reclaim(home: &Path, store: &Store, ends: &Notify) -> Result<Vec<String>, StoreError> {
    let runs = home.join("runs");
    let mut reclaimed = reclaim_run_dirs(&runs, store).await;
    // The store first, then the directories: a run is recorded only after
    // its directory exists, so every run in this snapshot that is alive has
    // its directory in the listing below.
    let running = store
        .list_runs(&airlock_store::RunQuery {
            status: Some(RunStatus::Running),
            limit: Some(10_000),
            ..Default::default()
        })
        .await?;
    let live: Vec<String> = std::fs::read_dir(&runs)
        .map(|r| {
            r.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    // A run an `airlock serve` replica owns is that replica's to end, or,
    // when the replica is gone, its leader's sweep's
    // ([`airlock_store::Store::sweep_dead_replicas`]), never another
    // process's guess from this machine's run directories.
    for run in running
        .into_iter()
        .filter(|r| !live.contains(&r.id) && r.owner.is_none())
    {
        fail_run(store, ends, &run.id, RECLAIMED).await?;
        if !reclaimed.contains(&run.id) {
            reclaimed.push(run.id);
        }
    }
    reclaim_leftovers(home, &reclaimed, &live);
    Ok(reclaimed)
}

/// The run directories in `runs` whose owner is gone: what each holds is
/// stored, then it is removed. Returns their runs.
async fn reclaim_run_dirs(runs: &Path, store: &Store) -> Vec<String> {
    let mut reclaimed = Vec::new();
    let Ok(entries) = std::fs::read_dir(runs) else {
        return reclaimed;
    };
    for e in entries.flatten() {
        if owner_alive(&e) {
            continue;
        }
        // What its sidecar journalled reaches the store before the run is
        // failed (by the caller) and its directory goes; a run that ended
        // while the store was down is ended as it ended.
        let run_id = e.file_name().to_string_lossy().into_owned();
        let end = airlock_sandbox::untrusted::read_file(&e.path().join(END_FILE), MAX_END_FILE)
            .ok()
            .and_then(|b| serde_json::from_slice::<PendingEnd>(&b).ok());
        let stored = match &end {
            Some(end) => store_pending_end(store, &run_id, &e.path(), end).await,
            None => crate::journal::ingest_run_dir(store, &run_id, &e.path()).await,
        };
        if !stored {
            // Kept for the next reclaim: the store did not take it.
            continue;
        }
        let _ = std::fs::remove_dir_all(e.path());
        reclaimed.push(run_id);
    }
    reclaimed
}

/// Whether the run directory `e` has a live owner (another process than
/// this one), or is being created right now.
fn owner_alive(e: &std::fs::DirEntry) -> bool {
    // Never trusted, followed or read whole: no symlink, no FIFO, a few bytes.
    let owner = airlock_sandbox::untrusted::read_file(&e.path().join(OWNER_FILE), MAX_OWNER_FILE);
    match owner {
        Ok(b) => match owner_pid(&b) {
            Some(pid) => {
                Path::new(&format!("/proc/{pid}")).exists()
                    && i32::try_from(std::process::id()).ok() != Some(pid)
            }
            None => false,
        },
        // Being created right now by another platform (the owner file
        // follows the directory within microseconds).
        Err(airlock_sandbox::untrusted::UntrustedFileError::Io { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            e.metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().is_ok_and(|age| age.as_secs() < 60))
        }
        // A FIFO, a symlink, a device, a huge file: not an owner.
        Err(_) => false,
    }
}

/// What else the runs `reclaimed` (and platforms that are gone) left on
/// this machine: agents' files, internal-API sockets, cgroups.
fn reclaim_leftovers(home: &Path, reclaimed: &[String], live: &[String]) {
    // The agents' files of the runs `airlock serve` ran (`bundles/<runId>`,
    // removed at a run's end): those of the runs just reclaimed, and any
    // other with no run directory, once older than a minute (a bundle is
    // written just before its run's directory: a younger one may be a run
    // that another platform on this home is starting).
    let bundles = reclaim_bundles(&home.join("bundles"), reclaimed, live);
    if bundles > 0 {
        tracing::info!("removed the agent files of {bundles} ended run(s)");
    }
    // The internal-API sockets of platforms that are gone.
    let stale = reclaim_platform_sockets(&home.join("sockets"));
    if stale > 0 {
        tracing::info!("removed {stale} socket(s) of stopped platforms");
    }
    // Cgroups of those runs (only theirs: another live platform's new run
    // may have an empty cgroup for a moment), when there are any.
    let cgroups = reclaim_cgroups_of(reclaimed);
    if cgroups > 0 {
        tracing::info!("reclaimed {cgroups} cgroup(s) of crashed runs");
    }
    // And those made ahead for the next run of a platform that is gone
    // (a pooled microVM guest's among them).
    let standby = reclaim_standby_cgroups();
    if standby > 0 {
        tracing::info!("removed {standby} standby cgroup(s) of stopped platforms");
    }
    // The warm pools' directories of platforms that are gone (what `airlock
    // doctor` reads of a microVM pool, a docker pool's pair directories):
    // their sandboxes went with them, or go at the backend's boot.
    use airlock_sandbox::docker::pool::{POOL_DIR, reclaim_dirs};
    let pools = reclaim_dirs(&home.join(POOL_DIR));
    if pools > 0 {
        tracing::info!("removed the warm pool directories of {pools} stopped platform(s)");
    }
}

/// Removes this machine's cgroups of the runs `ids` (ended runs whose
/// platform is gone) whose processes are all gone; returns how many
/// directories went. Only those runs': another live platform's new run may
/// have an empty cgroup for a moment. A cgroup still populated stays (the
/// next boot on its platform's home reclaims it).
pub fn reclaim_cgroups_of(ids: &[String]) -> usize {
    if ids.is_empty() {
        return 0;
    }
    use airlock_sandbox::namespace::cgroup::{PREFIX, SIDECAR_SUFFIX};
    // A run's own (`airlock-<runId>`) and its host sidecar's (`…-sidecar`).
    airlock_sandbox::namespace::cgroup::reclaim_matching(|name| {
        name.strip_prefix(PREFIX).is_some_and(|id| {
            let id = id.strip_suffix(SIDECAR_SUFFIX).unwrap_or(id);
            ids.iter().any(|d| d == id)
        })
    })
    .len()
}

/// Removes this machine's standby cgroups (made ahead for a platform's next
/// run) of platforms that are gone; returns how many directories went.
pub fn reclaim_standby_cgroups() -> usize {
    airlock_sandbox::namespace::cgroup::reclaim_standby().len()
}

/// Removes the directories of `bundles` that belong to no live run (see
/// [`reclaim`]); returns how many went.
fn reclaim_bundles(bundles: &Path, reclaimed: &[String], live: &[String]) -> usize {
    let Ok(entries) = std::fs::read_dir(bundles) else {
        return 0;
    };
    let mut removed = 0;
    for e in entries.flatten() {
        let id = e.file_name().to_string_lossy().into_owned();
        let dead = reclaimed.contains(&id)
            || (!live.contains(&id)
                && e.metadata()
                    .and_then(|m| m.modified())
                    .is_ok_and(|t| t.elapsed().is_ok_and(|age| age.as_secs() >= 60)));
        // Never followed: a symlink is removed as itself.
        if dead
            && std::fs::remove_dir_all(e.path())
                .or_else(|_| std::fs::remove_file(e.path()))
                .is_ok()
        {
            removed += 1;
        }
    }
    removed
}

/// This process's internal-API socket on `home`: made at its start, removed
/// at its clean stop (`airlock run`'s end, `airlock serve`'s stop).
pub fn own_platform_socket(home: &Path) -> PathBuf {
    home.join("sockets")
        .join(platform_socket_name(std::process::id()))
}

/// The name of a platform's internal-API socket in `$AIRLOCK_HOME/sockets`.
pub fn platform_socket_name(pid: u32) -> String {
    format!("platform-{pid}.sock")
}

/// Removes `platform-<pid>.sock` files whose platform process is gone;
/// returns how many.
fn reclaim_platform_sockets(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("platform-")?.strip_suffix(".sock"))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let alive = pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists();
        if !alive && std::fs::remove_file(e.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Boot reclaim removes the agent files (`bundles/<runId>`) of the runs
    /// it reclaims and of any run with no directory left once a minute old;
    /// a live run's, and a young one (a run starting), stay (issue 45,
    /// item 13: they were left every time).
    #[test]
    fn boot_reclaim_removes_the_bundles_of_dead_runs_only() {
        let home = tempfile::tempdir().expect("tempdir");
        let bundles = home.path().join("bundles");
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        for id in ["run_dead", "run_orphan", "run_young", "run_live"] {
            let d = bundles.join(id);
            std::fs::create_dir_all(&d).expect("bundle");
            std::fs::write(d.join("agent.py"), "print(1)").expect("file");
            if id != "run_young" {
                std::fs::File::open(&d)
                    .and_then(|f| f.set_modified(old))
                    .expect("mtime");
            }
        }
        let removed = reclaim_bundles(&bundles, &["run_dead".into()], &["run_live".into()]);
        assert_eq!(removed, 2);
        let mut left: Vec<String> = std::fs::read_dir(&bundles)
            .expect("bundles")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["run_live", "run_young"]);
    }
}
