//! The microVM backend's warm pool: guests booted before any run, kept up to
//! `MICROVM_WARM_POOL` per [`PoolKey`], each claimed by one run and
//! destroyed with it (the QEMU driver's; Firecracker's guests start cold).
//!
//! A pooled guest holds nothing of any run until claimed. Its helper
//! (`airlock microvm-host`) was given the machine alone
//! ([`super::config::HostLine::Pooled`]: kernel, root, memory, vCPUs, no
//! disk but the root), booted it to the point where `airlock vm-init` has
//! said it is ready and waits for its header, said so on its stdout
//! ([`POOLED_READY`]), and waits for its run on stdin. At the claim
//! ([`MicrovmBackend::claim_guest`], then [`MicrovmBackend::spawn`]) the
//! helper is given the run's line ([`HostRun`]: its sockets, its header;
//! the helper draws the run's nonce then), then the agent's directory as a
//! tar archive, then (once the sidecar is ready) the runtime's secrets:
//! everything of the run crosses the channel after the claim, as a cold
//! start's header and secrets cross it after boot. The guest's init
//! unpacks the archive on a tmpfs of its own at the directory's path and
//! makes it read-only ([`super::config::GuestView`]): a pooled guest cannot
//! have been given the run's disk at boot.
//!
//! Which runs can take a guest: an agent with one agent directory within
//! [`crate::warm`]'s bounds (64 MiB, 4,096 entries), under the QEMU driver.
//! Every other run starts cold, as does one that finds no idle guest, or
//! whose tenant holds its share of claimed guests already
//! ([`crate::warm::share_of`]: half the pool, at least one).
//!
//! A guest that dies while idle is removed and replaced (its helper's
//! pidfd says so). A platform that stops (SIGTERM) destroys its idle
//! guests; one killed (SIGKILL) takes them with it: each helper and its
//! VMM die with the platform's thread that started them (the parent death
//! signal), a guest has no file on the host (its channel is a socket pair,
//! its only disk the shared read-only root), and its cgroups are named as
//! standby cgroups of the platform's PID (`airlock-standby-<pid>-vm<n>`),
//! which the next boot's reclaim removes
//! ([`crate::namespace::cgroup::reclaim_standby`]).
//!
//! What `airlock doctor` shows of a running platform's pool (its size, its
//! idle guests per key) is a small file the pool rewrites on each change,
//! `$AIRLOCK_HOME/pool/<owner>/microvm.json`, removed with the pool's
//! directory of a dead platform by the next pool of that home
//! ([`crate::docker::pool::reclaim_dirs`], the docker pool's decision).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::MicrovmBackend;
use super::config::{GuestHeader, GuestView, HostRun, POOLED_READY};
pub use crate::warm::PoolStatus;
use crate::warm::{Late, Share, Shelf};
use crate::{Sandbox, SandboxError, SandboxKind, SandboxSpec, SidecarSpec};

/// Idle guests kept per key (0, the default: no pool).
pub const ENV_MICROVM_WARM_POOL: &str = "MICROVM_WARM_POOL";
/// The largest `MICROVM_WARM_POOL`.
pub const MAX_WARM_POOL: usize = 64;
/// How long a guest has to boot before it is given up (TCG boots are slow,
/// the more so several at once).
const FILL_WITHIN: Duration = Duration::from_secs(180);
/// The file of a platform's pool in its directory of `$AIRLOCK_HOME/pool`.
pub const STATUS_FILE: &str = "microvm.json";

/// `MICROVM_WARM_POOL` from `value` (unset or empty: 0).
pub fn size_from(value: Option<&str>) -> Result<usize, SandboxError> {
    match value.filter(|v| !v.is_empty()) {
        None => Ok(0),
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| *n <= MAX_WARM_POOL)
            .ok_or_else(|| SandboxError::Config {
                var: ENV_MICROVM_WARM_POOL,
                message: format!("{v:?} is not a number of guests from 0 to {MAX_WARM_POOL}"),
            }),
    }
}

/// What a pooled guest is booted for: everything of its machine fixed at
/// boot. Two runs with the same key can take each other's guests; nothing
/// in it belongs to a run.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PoolKey {
    kernel: PathBuf,
    root: PathBuf,
    memory_mb: u64,
    millicpus: u64,
    workspace: PathBuf,
    workspace_mb: u64,
    /// `$AIRLOCK_HOME/pool`: where the pool says what it holds.
    pool_dir: PathBuf,
}

/// Why a run starts cold (said at debug level).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cold {
    NotAnAgent,
    NotOneDirectory,
    JournalOutsideRuns,
    NotQemu,
    /// Beyond [`crate::warm::MAX_VIEW_BYTES`] or its entries, or holding
    /// what is not a file, directory or link.
    DirectoryNotCopied,
}

impl PoolKey {
    /// The key of a run of `sandbox` and `sidecar` on guests of `image`,
    /// and its agent directory; or why it starts cold.
    pub fn of(
        sandbox: &SandboxSpec,
        sidecar: &SidecarSpec,
        image: &super::image::GuestImage,
    ) -> Result<(PoolKey, PathBuf), Cold> {
        if sandbox.kind != SandboxKind::Agent || !sidecar.runner_dirs.is_empty() {
            return Err(Cold::NotAnAgent);
        }
        let [dir] = sandbox.ro_paths.as_slice() else {
            return Err(Cold::NotOneDirectory);
        };
        if !dir.is_dir() || !dir.is_absolute() {
            return Err(Cold::NotOneDirectory);
        }
        let home = crate::warm::home_of(sidecar).ok_or(Cold::JournalOutsideRuns)?;
        let key = PoolKey {
            kernel: image.kernel.clone(),
            root: image.root.clone(),
            memory_mb: sandbox.memory_mb,
            millicpus: crate::whole(sandbox.cpus * 1000.0, u64::MAX),
            workspace: sandbox.workspace.clone(),
            workspace_mb: sandbox.workspace_size_mb,
            pool_dir: home.join(crate::docker::pool::POOL_DIR),
        };
        Ok((key, dir.clone()))
    }

    /// How `airlock doctor` names the key.
    fn describe(&self) -> String {
        format!(
            "{} MiB, {} vCPU(s), workspace {} MiB, root {}",
            self.memory_mb,
            self.millicpus.div_ceil(1000).max(1),
            self.workspace_mb,
            self.root
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        )
    }
}

/// The agent's directory `dir` as a tar archive (entries under it, owners
/// and modes kept, links as links), within [`crate::warm`]'s bounds, and
/// its view for the guest at the same path.
fn pack_view(dir: &Path) -> std::io::Result<(Vec<u8>, GuestView)> {
    let mut b = tar::Builder::new(Vec::new());
    b.follow_symlinks(false);
    let (mut file_bytes, mut entries) = (0u64, 0u64);
    crate::warm::walk_view(dir, &mut |path, rel, meta| {
        entries += 1;
        if meta.is_file() {
            file_bytes += meta.len();
        }
        match rel.as_os_str().is_empty() {
            true => Ok(()),
            false => b.append_path_with_name(path, rel),
        }
    })?;
    let archive = b.into_inner()?;
    let view = GuestView {
        path: dir.to_owned(),
        bytes: archive.len() as u64,
        file_bytes,
        entries,
    };
    Ok((archive, view))
}

/// A booted guest, idle: its helper's sandbox and stdin, and the task that
/// watches it die.
struct Guest {
    id: String,
    sandbox: Sandbox,
    stdin: tokio::process::ChildStdin,
    watch: Watch,
}

/// The task watching an idle guest, stopped with the guest's entry.
struct Watch(Option<tokio::task::JoinHandle<()>>);

impl Drop for Watch {
    fn drop(&mut self) {
        if let Some(w) = self.0.take() {
            w.abort();
        }
    }
}

/// A guest claimed by a run, until its spawn takes it.
struct Claimed {
    guest: Guest,
    archive: Vec<u8>,
    view: GuestView,
    share: Share,
}

/// The pool of one backend (its clones share it): idle guests per key on
/// the shared shelf ([`crate::warm::Shelf`]); a guest finishing its boot
/// once the platform stops is destroyed at once.
pub struct Pool {
    shelf: Shelf<PoolKey, Guest, Claimed>,
    /// This platform, as the owner of its pool's directory.
    owner: String,
}

/// What a platform's pool file says (`airlock doctor` reads it).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PoolFile {
    pub size: usize,
    /// Idle guests per key.
    pub idle: Vec<(String, usize)>,
    pub filling: usize,
}

impl Pool {
    pub fn new(size: usize) -> Pool {
        Pool {
            shelf: Shelf::new(size, Late::Drop),
            owner: crate::docker::reclaim::owner_label(),
        }
    }

    /// Guests kept idle per key (`MICROVM_WARM_POOL`; 0: no pool).
    pub(crate) fn size(&self) -> usize {
        self.shelf.size()
    }

    pub fn status(&self) -> PoolStatus {
        self.shelf.status()
    }

    /// Rewrites this platform's pool file in each home it pools for
    /// (bounded: a line per key, [`crate::warm::MAX_KEYS`] keys).
    fn publish(&self) {
        let size = self.shelf.size();
        let (keys, dirs) = self.shelf.snapshot();
        let mut files: HashMap<PathBuf, PoolFile> = HashMap::new();
        for (k, idle, filling) in &keys {
            let f = files.entry(k.pool_dir.clone()).or_default();
            f.size = size;
            f.idle.push((k.describe(), *idle));
            f.filling += filling;
        }
        for dir in dirs {
            let f = files.get(&dir).cloned().unwrap_or(PoolFile {
                size,
                ..PoolFile::default()
            });
            let own = crate::docker::pool::own_dir(&dir, &self.owner);
            let _ = write_status(&own, &f);
        }
    }

    /// A boot of `key` is over: the guest joins the pool or goes
    /// ([`Shelf::settle`]); the pool file says so.
    fn settle(&self, key: &PoolKey, guest: Option<Guest>) {
        self.shelf.settle(key, guest);
        self.publish();
    }
}

/// Writes `f` as `dir/microvm.json` (a whole file: written aside, renamed).
fn write_status(dir: &Path, f: &PoolFile) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!("{STATUS_FILE}.tmp"));
    std::fs::write(&tmp, serde_json::to_vec(f).map_err(std::io::Error::other)?)?;
    std::fs::rename(tmp, dir.join(STATUS_FILE))
}

/// The pools of the platforms on `home` as `airlock doctor` shows them:
/// live platforms' files, and how many of dead platforms are left.
pub fn read_pool_files(home: &Path) -> (Vec<PoolFile>, usize) {
    let (mut live, mut dead) = (vec![], 0);
    let Ok(entries) = std::fs::read_dir(home.join(crate::docker::pool::POOL_DIR)) else {
        return (live, dead);
    };
    for e in entries.flatten() {
        let label = e.file_name().to_string_lossy().replace('_', ":");
        let path = e.path().join(STATUS_FILE);
        let Ok(bytes) = crate::untrusted::read_file(&path, 64 * 1024) else {
            continue;
        };
        match crate::docker::reclaim::judge_owner(Some(&label)) {
            crate::docker::reclaim::Owner::Alive => {
                if let Ok(f) = serde_json::from_slice::<PoolFile>(&bytes) {
                    live.push(f);
                }
            }
            crate::docker::reclaim::Owner::Dead => dead += 1,
            crate::docker::reclaim::Owner::Unknown => {}
        }
    }
    (live, dead)
}

/// `airlock doctor`'s line of the microVM pool on `home`.
pub fn diagnose(home: &Path, size: usize) -> crate::Diagnosis {
    let setting = match size {
        0 => format!("{ENV_MICROVM_WARM_POOL}=0 here (no pool)"),
        n => format!(
            "{ENV_MICROVM_WARM_POOL}={n} idle guest(s) per key, at most {} claimed per organization",
            crate::warm::share_of(n)
        ),
    };
    let (live, dead) = read_pool_files(home);
    let mut found = vec![];
    for f in &live {
        for (key, idle) in &f.idle {
            found.push(format!("{idle} idle guest(s) of {key}"));
        }
        if f.filling > 0 {
            found.push(format!("{} booting", f.filling));
        }
    }
    let found = match found.is_empty() {
        true => "no idle guest".to_owned(),
        false => found.join(", "),
    };
    if dead == 0 {
        crate::Diagnosis::works("microVM warm pool", format!("{setting}; {found}"))
    } else {
        crate::Diagnosis::fails(
            "microVM warm pool",
            format_args!(
                "{setting}; {found}; the pools of {dead} stopped platform(s) (removed at the next boot)"
            ),
        )
    }
}

/// A fresh guest id: a standby name of this platform's PID (its cgroups'
/// name, which the boot reclaim of a platform that died removes).
fn guest_id() -> String {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!(
        "{}{}-vm{n}",
        crate::namespace::cgroup::STANDBY,
        std::process::id()
    )
}

impl MicrovmBackend {
    /// Sets aside an idle guest for the run of `sandbox` and `sidecar`
    /// (tenant `tenant`), with its agent directory packed for it. Refills
    /// the pool of its key either way.
    pub(crate) fn claim_guest(
        &self,
        tenant: &str,
        sandbox: &SandboxSpec,
        sidecar: &SidecarSpec,
    ) -> bool {
        if self.pool.size() == 0 {
            return false;
        }
        let cold = |why: &dyn std::fmt::Debug| {
            tracing::debug!(run = %sandbox.run_id, "microVM cold start: {why:?}");
            false
        };
        if self.driver != super::driver::Driver::Qemu {
            return cold(&Cold::NotQemu);
        }
        let Ok(image) = super::image::GuestImage::find_with(&self.images, &self.exe, self.kernel)
        else {
            return false;
        };
        let (key, dir) = match PoolKey::of(sandbox, sidecar, &image) {
            Ok(k) => k,
            Err(why) => return cold(&why),
        };
        // Packed before a guest is taken: a directory too large (or not
        // one a guest can be given) starts cold and leaves the pool as it was.
        let (archive, view) = match pack_view(&dir) {
            Ok(p) => p,
            Err(e) => return cold(&format_args!("{:?}: {e}", Cold::DirectoryNotCopied)),
        };
        let Some((guest, share)) = self.pool.shelf.take(&key, tenant) else {
            self.refill(&key);
            return false;
        };
        self.refill(&key);
        let claimed = Claimed {
            guest,
            archive,
            view,
            share,
        };
        self.pool
            .shelf
            .claimed(|c| c.insert(sandbox.run_id.clone(), claimed));
        self.pool.publish();
        true
    }

    /// The guest claimed for run `spec.run_id`, if any: its run's line and
    /// agent directory written to its helper now, the secrets once released.
    pub(crate) fn take_claimed(&self, spec: &SandboxSpec) -> Option<Result<Sandbox, SandboxError>> {
        let c = self.pool.shelf.claimed(|c| c.remove(&spec.run_id))?;
        Some(self.hand_claimed(spec, c))
    }

    fn hand_claimed(&self, spec: &SandboxSpec, c: Claimed) -> Result<Sandbox, SandboxError> {
        let Claimed {
            guest,
            archive,
            view,
            share,
        } = c;
        let Guest {
            mut sandbox,
            mut stdin,
            watch,
            ..
        } = guest;
        drop(watch);
        let run = HostRun {
            sockets_dir: spec.sockets_dir.clone(),
            guest: GuestHeader::of(spec, vec![], Some(view)),
        };
        let mut line = serde_json::to_vec(&run).map_err(|e| SandboxError::Io(e.into()))?;
        line.push(b'\n');
        // The tenant's share comes back once the guest is gone.
        sandbox.also_clean(Box::new(move || drop(share)));
        let gate = spec.hold_stdin.then(|| sandbox.gate_stdin());
        let secrets = spec.stdin.clone();
        tokio::spawn(async move {
            if stdin.write_all(&line).await.is_err() || stdin.write_all(&archive).await.is_err() {
                return;
            }
            drop(archive);
            if let Some(gate) = gate
                && gate.await.is_err()
            {
                let _ = stdin.shutdown().await;
                return;
            }
            let _ = stdin.write_all(&secrets).await;
            let _ = stdin.shutdown().await;
        });
        Ok(sandbox)
    }

    /// Boots the guests `key` lacks, in the background.
    fn refill(&self, key: &PoolKey) {
        self.pool
            .shelf
            .refill(key, &key.pool_dir, "a pooled microVM guest", |k| {
                self.fill_one(k)
            });
        self.pool.publish();
    }

    /// Starts one guest of `key`; it joins the pool once booted.
    fn fill_one(&self, key: &PoolKey) -> Result<(), SandboxError> {
        let id = guest_id();
        let spec = SandboxSpec {
            run_id: id.clone(),
            command: vec![],
            env: vec![],
            stdin: vec![],
            hold_stdin: false,
            sockets_dir: PathBuf::new(),
            ro_paths: vec![],
            workspace: key.workspace.clone(),
            workspace_size_mb: key.workspace_mb,
            memory_mb: key.memory_mb,
            cpus: key.millicpus as f64 / 1000.0,
            pids_max: 256,
            kind: SandboxKind::Agent,
        };
        let (mut child, cgroups) = self.start_pooled(&spec)?;
        let stdout = child.stdout.take();
        let stdin = child.stdin.take();
        let mut sandbox = Sandbox::in_cgroups(child, cgroups)?;
        let (Some(mut stdout), Some(stdin)) = (stdout, stdin) else {
            return Err(SandboxError::ExitedBeforeStart);
        };
        let backend = self.clone();
        let key = key.clone();
        tokio::spawn(async move {
            let mut said = vec![0u8; POOLED_READY.len()];
            let booted = tokio::time::timeout(FILL_WITHIN, stdout.read_exact(&mut said)).await;
            let guest = match booted {
                Ok(Ok(_)) if said == POOLED_READY => {
                    sandbox.set_stdout(Box::new(stdout));
                    let watch = Watch(backend.watch(&key, &id, sandbox.pid));
                    Some(Guest {
                        id,
                        sandbox,
                        stdin,
                        watch,
                    })
                }
                other => {
                    let mut err = sandbox.take_output().1;
                    let mut why = String::new();
                    if let Some(e) = err.as_mut() {
                        let _ = tokio::time::timeout(
                            Duration::from_secs(1),
                            e.take(4096).read_to_string(&mut why),
                        )
                        .await;
                    }
                    tracing::warn!(
                        "a pooled microVM guest did not boot ({}): {}",
                        match other {
                            Err(_) => "timed out".to_owned(),
                            Ok(Err(e)) => e.to_string(),
                            Ok(Ok(_)) => "it said something else".to_owned(),
                        },
                        why.trim()
                    );
                    sandbox.cleanup().await;
                    None
                }
            };
            backend.pool.settle(&key, guest);
        });
        Ok(())
    }

    /// Watches the idle guest `id`'s helper (`pid`): once it dies, the
    /// guest is removed and another booted in its place.
    fn watch(&self, key: &PoolKey, id: &str, pid: u32) -> Option<tokio::task::JoinHandle<()>> {
        let fd = crate::pid_fd(Some(pid))?;
        let (backend, key, id) = (self.clone(), key.clone(), id.to_owned());
        Some(tokio::spawn(async move {
            if crate::namespace::sys::pidfd_exited(fd).await.is_err() {
                return;
            }
            if let Some(mut g) = backend.pool.shelf.remove_idle(&key, |g| g.id == id) {
                // This task is the guest's watch: not aborted by its drop.
                g.watch.0 = None;
                tracing::warn!("a pooled microVM guest died while idle: replaced");
                drop(g);
                backend.refill(&key);
            }
        }))
    }

    /// Destroys every guest of the pool now (the platform stops).
    pub(crate) fn drain_pool(&self) {
        let (idle, claimed) = self.pool.shelf.drain(Duration::ZERO);
        drop((idle, claimed));
        self.pool.publish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn specs(dir: &Path, home: &Path, id: &str) -> (SandboxSpec, SidecarSpec) {
        let sandbox = SandboxSpec {
            run_id: id.into(),
            command: vec!["/.airlock/airlock".into(), "runtime".into(), "--".into()],
            env: vec![("MARK".into(), format!("env-of-{id}"))],
            stdin: format!("secret-of-{id}").into_bytes(),
            hold_stdin: true,
            sockets_dir: home.join("runs").join(id).join("sock"),
            ro_paths: vec![dir.to_owned()],
            workspace: "/workspace".into(),
            workspace_size_mb: 16,
            memory_mb: 256,
            cpus: 1.0,
            pids_max: 64,
            kind: SandboxKind::Agent,
        };
        let sidecar = SidecarSpec {
            run_id: id.into(),
            exe: "/usr/local/bin/airlock".into(),
            own_binary: None,
            log: "warn".into(),
            config: b"{}".to_vec(),
            platform_socket: home.join("sockets/p.sock"),
            egress_journal: home.join("runs").join(id).join("egress.journal"),
            sockets_dir: home.join("runs").join(id).join("sock"),
            runner_dirs: vec![],
        };
        (sandbox, sidecar)
    }

    fn image() -> super::super::image::GuestImage {
        super::super::image::GuestImage {
            kind: super::super::kernel::KernelKind::Minimal,
            kernel: "/i/kernel-min".into(),
            initrd: "/i/initrd-min.cpio".into(),
            root: "/i/root-t.ext4".into(),
        }
    }

    /// The key holds nothing of a run: two runs with other ids, commands,
    /// environments, secrets and agent directories share it; runs a guest
    /// cannot serve start cold.
    #[test]
    fn the_key_holds_nothing_of_a_run() {
        let home = tempfile::tempdir().unwrap();
        let (a, b) = (home.path().join("bundles/a"), home.path().join("bundles/b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        let (s1, c1) = specs(&a, home.path(), "run_one");
        let (s2, c2) = specs(&b, home.path(), "run_two");
        let (k1, d1) = PoolKey::of(&s1, &c1, &image()).unwrap();
        let (k2, d2) = PoolKey::of(&s2, &c2, &image()).unwrap();
        assert_eq!(k1, k2);
        assert_eq!((d1, d2), (a.clone(), b));
        let k = format!("{k1:?}");
        for run_thing in ["run_one", "env-of", "secret-of", "bundles"] {
            assert!(!k.contains(run_thing), "{run_thing} in {k}");
        }
        let mut two = s1.clone();
        two.ro_paths.push(a.clone());
        assert_eq!(
            PoolKey::of(&two, &c1, &image()).unwrap_err(),
            Cold::NotOneDirectory
        );
        let mut elsewhere = c1.clone();
        elsewhere.egress_journal = "/elsewhere/egress.journal".into();
        assert_eq!(
            PoolKey::of(&s1, &elsewhere, &image()).unwrap_err(),
            Cold::JournalOutsideRuns
        );
        assert!(size_from(Some("65")).is_err());
        assert_eq!(size_from(Some("")).unwrap(), 0);
        assert_eq!(size_from(Some("2")).unwrap(), 2);
    }

    /// The archive a claimed guest unpacks is the agent's directory: files
    /// with their modes, subdirectories, links as links; its view counts
    /// what the guest's tmpfs must hold.
    #[test]
    fn the_archive_is_the_agent_directory() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let from = crate::warm::agent_dir_fixture(t.path());
        let (archive, view) = pack_view(&from).unwrap();
        assert_eq!(view.path, from);
        assert_eq!(view.bytes, archive.len() as u64);
        assert_eq!((view.file_bytes, view.entries), (8, 4));
        let to = t.path().join("unpacked");
        std::fs::create_dir_all(&to).unwrap();
        tar::Archive::new(&archive[..]).unpack(&to).unwrap();
        assert_eq!(
            std::fs::read_to_string(to.join("sub/a.py")).unwrap(),
            "print(1)"
        );
        let mode = std::fs::metadata(to.join("sub/a.py"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o640);
        assert_eq!(
            std::fs::read_link(to.join("link")).unwrap(),
            Path::new("sub/a.py")
        );
        let _l = std::os::unix::net::UnixListener::bind(from.join("s.sock")).unwrap();
        assert!(pack_view(&from).is_err(), "a socket was packed");
    }

    /// The pool never boots more than its size per key, counts a failed
    /// boot out, and boots nothing once closing.
    #[test]
    fn the_pool_is_bounded_by_its_size() {
        let home = tempfile::tempdir().unwrap();
        let a = home.path().join("bundles/a");
        std::fs::create_dir_all(&a).unwrap();
        let (s, c) = specs(&a, home.path(), "run_one");
        let (key, _) = PoolKey::of(&s, &c, &image()).unwrap();
        let pool = Pool::new(2).shelf;
        assert_eq!(pool.to_fill(&key), 0, "a key no run has asked for");
        assert!(pool.take(&key, "org_a").is_none(), "nothing idle yet");
        assert_eq!(pool.to_fill(&key), 2);
        assert_eq!(pool.to_fill(&key), 0, "two are booting");
        pool.settle(&key, None);
        assert_eq!(pool.to_fill(&key), 1, "one failed: one more");
        let (idle, claimed) = pool.drain(Duration::ZERO);
        assert!(idle.is_empty() && claimed.is_empty());
        assert_eq!(pool.to_fill(&key), 0, "closing");
        assert!(pool.take(&key, "org_a").is_none());
    }
}
