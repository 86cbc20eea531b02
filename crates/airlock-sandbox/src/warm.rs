//! What the warm pools of every backend decide the same way
//! ([`crate::docker::pool`], [`crate::microvm::pool`]): their [`Shelf`]
//! (idle sandboxes per key, those starting, the keys learned, the claimed
//! ones until their spawns take them), the per-tenant share of a pool, and
//! which agent directories a claimed sandbox may be given (copied in at its
//! claim, never before) within one bound.

use std::collections::HashMap;
use std::hash::Hash;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// The largest agent directory a pooled sandbox is given at its claim
/// (bytes of its files, entries); a larger one starts cold.
pub const MAX_VIEW_BYTES: u64 = 64 << 20;
pub const MAX_VIEW_ENTRIES: usize = 4096;

/// How many claimed sandboxes one tenant may hold at once in a pool of
/// `size` per key: half, at least one.
pub fn share_of(size: usize) -> usize {
    (size / 2).max(1)
}

/// The claimed sandboxes each tenant holds, within its share.
#[derive(Clone)]
pub(crate) struct Shares {
    pub(crate) per_tenant: usize,
    claims: Arc<Mutex<HashMap<String, usize>>>,
}

impl Shares {
    /// The shares of a pool of `size` per key ([`share_of`]).
    pub(crate) fn of_pool(size: usize) -> Shares {
        Shares {
            per_tenant: share_of(size),
            claims: Arc::default(),
        }
    }

    /// One more claimed sandbox for `tenant`, unless it holds its share
    /// already; given back when the [`Share`] is dropped.
    pub(crate) fn claim(&self, tenant: &str) -> Option<Share> {
        let mut c = self.claims.lock().unwrap_or_else(|p| p.into_inner());
        let held = c.entry(tenant.to_owned()).or_default();
        if *held >= self.per_tenant {
            return None;
        }
        *held += 1;
        Some(Share {
            claims: self.claims.clone(),
            tenant: tenant.to_owned(),
        })
    }

    /// Claimed sandboxes per tenant (those holding none left out).
    pub(crate) fn held(&self) -> HashMap<String, usize> {
        let mut c = self
            .claims
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        c.retain(|_, n| *n > 0);
        c
    }
}

/// One claimed sandbox counted against its tenant.
pub(crate) struct Share {
    claims: Arc<Mutex<HashMap<String, usize>>>,
    tenant: String,
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut c = self.claims.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = c.get_mut(&self.tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.remove(&self.tenant);
            }
        }
    }
}

/// Most keys a pool keeps at once: the oldest learned goes (its idle
/// sandboxes too).
pub(crate) const MAX_KEYS: usize = 4;

/// What this process's pool holds (`airlock doctor` and the tests).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolStatus {
    /// Idle sandboxes kept per key (0: no pool).
    pub size: usize,
    /// Idle sandboxes, all keys.
    pub idle: usize,
    /// Sandboxes starting.
    pub filling: usize,
    /// Claimed sandboxes per tenant.
    pub claimed: HashMap<String, usize>,
}

/// What becomes of a sandbox whose start is over once its pool is closing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Late {
    /// Dropped at once (its drop destroys it).
    Drop,
    /// Kept idle, for [`Shelf::drain`] (which waits for those starting)
    /// to hand to the backend, which removes them together.
    Keep,
}

/// One backend's warm pool, its bookkeeping: at most `size` idle sandboxes
/// `I` per key `K` (at most [`MAX_KEYS`] keys, learned from the runs that
/// ask), those starting counted so that idle and starting never exceed
/// `size`, the sandboxes claimed by runs (`C`, by run id) until their spawns
/// take them, and each tenant's [`Shares`]. How a sandbox is started,
/// watched and destroyed is the backend's: it starts one when
/// [`Shelf::refill`] asks, says when the start is over
/// ([`Shelf::settle`]), and a sandbox is destroyed by its drop, always
/// outside the shelf's lock. Clones share the shelf.
pub(crate) struct Shelf<K, I, C> {
    inner: Arc<Inner<K, I, C>>,
}

impl<K, I, C> Clone for Shelf<K, I, C> {
    fn clone(&self) -> Self {
        Shelf {
            inner: self.inner.clone(),
        }
    }
}

struct Inner<K, I, C> {
    size: usize,
    late: Late,
    state: Mutex<State<K, I, C>>,
    /// Told whenever a start is over (either way).
    settled: Condvar,
    shares: Shares,
}

struct State<K, I, C> {
    idle: HashMap<K, Vec<I>>,
    filling: HashMap<K, usize>,
    /// Keys learned from runs, oldest first.
    keys: Vec<K>,
    claimed: HashMap<String, C>,
    /// The pool directories whose dead platforms' files were removed.
    swept: Vec<PathBuf>,
    /// The platform stops: nothing is claimed or started any more.
    closing: bool,
}

impl<K: Eq + Hash + Clone, I, C> Shelf<K, I, C> {
    /// A pool of `size` per key (0: none) whose late starts go as `late` says.
    pub(crate) fn new(size: usize, late: Late) -> Self {
        Shelf {
            inner: Arc::new(Inner {
                size,
                late,
                state: Mutex::new(State {
                    idle: HashMap::new(),
                    filling: HashMap::new(),
                    keys: Vec::new(),
                    claimed: HashMap::new(),
                    swept: Vec::new(),
                    closing: false,
                }),
                settled: Condvar::new(),
                shares: Shares::of_pool(size),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<K, I, C>> {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Idle sandboxes kept per key (0: no pool).
    pub(crate) fn size(&self) -> usize {
        self.inner.size
    }

    pub(crate) fn status(&self) -> PoolStatus {
        let st = self.lock();
        PoolStatus {
            size: self.inner.size,
            idle: st.idle.values().map(Vec::len).sum(),
            filling: st.filling.values().sum(),
            claimed: self.inner.shares.held(),
        }
    }

    /// The keys learned, oldest first, each with its idle and starting
    /// sandboxes; and the pool directories swept (those the pool says what
    /// it holds in).
    pub(crate) fn snapshot(&self) -> (Vec<(K, usize, usize)>, Vec<PathBuf>) {
        let st = self.lock();
        let keys = st
            .keys
            .iter()
            .map(|k| {
                let idle = st.idle.get(k).map_or(0, Vec::len);
                (k.clone(), idle, st.filling.get(k).copied().unwrap_or(0))
            })
            .collect();
        (keys, st.swept.clone())
    }

    /// Learns `key` (the oldest key beyond [`MAX_KEYS`] goes, with its idle
    /// sandboxes) and takes an idle sandbox of it for `tenant` within its
    /// share (given back when the [`Share`] is dropped).
    pub(crate) fn take(&self, key: &K, tenant: &str) -> Option<(I, Share)> {
        let mut dropped = Vec::new();
        let got = {
            let mut st = self.lock();
            if st.closing {
                return None;
            }
            st.keys.retain(|k| k != key);
            st.keys.push(key.clone());
            while st.keys.len() > MAX_KEYS {
                let old = st.keys.remove(0);
                dropped.extend(st.idle.remove(&old).unwrap_or_default());
            }
            match st.idle.get(key).is_some_and(|v| !v.is_empty()) {
                true => self
                    .inner
                    .shares
                    .claim(tenant)
                    .and_then(|share| Some((st.idle.get_mut(key)?.pop()?, share))),
                false => None,
            }
        };
        drop(dropped);
        got
    }

    /// A sandbox taken for a run that could not take it (nothing of the run
    /// left in it, its share dropped): idle again; or gone, when the pool
    /// is full or closing.
    pub(crate) fn put_back(&self, key: &K, item: I) {
        let extra = {
            let mut st = self.lock();
            let closing = st.closing;
            let idle = st.idle.entry(key.clone()).or_default();
            match !closing && idle.len() < self.inner.size {
                true => {
                    idle.push(item);
                    None
                }
                false => Some(item),
            }
        };
        drop(extra);
    }

    /// The idle sandboxes of `key`.
    pub(crate) fn idle_of(&self, key: &K) -> usize {
        self.lock().idle.get(key).map_or(0, Vec::len)
    }

    /// The keys learned, oldest first.
    pub(crate) fn keys(&self) -> Vec<K> {
        self.lock().keys.clone()
    }

    /// How many sandboxes of `key` to start now to keep [`Shelf::size`]
    /// idle (none for a key no run asked for, or once closing); counted as
    /// starting until each is [settled](Shelf::settle).
    pub(crate) fn to_fill(&self, key: &K) -> usize {
        let mut st = self.lock();
        if st.closing || !st.keys.contains(key) {
            return 0;
        }
        let have = st.idle.get(key).map_or(0, Vec::len) + st.filling.get(key).copied().unwrap_or(0);
        let need = self.inner.size.saturating_sub(have);
        *st.filling.entry(key.clone()).or_default() += need;
        need
    }

    /// A start of `key` is over: the sandbox (`None`: it failed) joins the
    /// idle ones, or goes (its key forgotten, the pool full); once closing,
    /// as [`Late`] says.
    pub(crate) fn settle(&self, key: &K, item: Option<I>) {
        let extra = {
            let mut st = self.lock();
            if let Some(n) = st.filling.get_mut(key) {
                *n = n.saturating_sub(1);
            }
            match item {
                Some(item) if st.closing && self.inner.late == Late::Keep => {
                    st.idle.entry(key.clone()).or_default().push(item);
                    None
                }
                Some(item) if !st.closing && st.keys.contains(key) => {
                    let idle = st.idle.entry(key.clone()).or_default();
                    if idle.len() < self.inner.size {
                        idle.push(item);
                        None
                    } else {
                        Some(item)
                    }
                }
                other => other,
            }
        };
        self.inner.settled.notify_all();
        drop(extra);
    }

    /// The first idle sandbox of `key` that `is` picks, out of the pool (it
    /// died).
    pub(crate) fn remove_idle(&self, key: &K, is: impl Fn(&I) -> bool) -> Option<I> {
        let mut st = self.lock();
        let idle = st.idle.get_mut(key)?;
        let i = idle.iter().position(is)?;
        Some(idle.swap_remove(i))
    }

    /// `f` on the claimed sandboxes, by run id.
    pub(crate) fn claimed<R>(&self, f: impl FnOnce(&mut HashMap<String, C>) -> R) -> R {
        f(&mut self.lock().claimed)
    }

    /// Whether the pool directories of dead platforms under `pool_dir` are
    /// still to be removed (once per directory).
    fn first_in(&self, pool_dir: &Path) -> bool {
        let mut st = self.lock();
        if st.swept.iter().any(|p| p == pool_dir) {
            return false;
        }
        st.swept.push(pool_dir.to_owned());
        true
    }

    /// Starts what `key` lacks ([`Shelf::to_fill`]): `fill` starts one in
    /// the background, which [settles](Shelf::settle) once its start is
    /// over; one `fill` cannot start is counted out at once (said as a
    /// warning, `what` naming it). The first refill under `pool_dir`
    /// removes the pool directories its dead platforms left
    /// ([`crate::docker::pool::reclaim_dirs`]).
    pub(crate) fn refill(
        &self,
        key: &K,
        pool_dir: &Path,
        what: &str,
        fill: impl Fn(&K) -> Result<(), crate::SandboxError>,
    ) {
        let need = self.to_fill(key);
        if need > 0 && self.first_in(pool_dir) {
            let n = crate::docker::pool::reclaim_dirs(pool_dir);
            if n > 0 {
                tracing::info!("removed the warm pool directories of {n} stopped platform(s)");
            }
        }
        for _ in 0..need {
            if let Err(e) = fill(key) {
                tracing::warn!("cannot start {what}: {e}");
                self.settle(key, None);
            }
        }
    }

    /// Every idle and claimed-but-untaken sandbox, out of the pool (the
    /// platform stops), once those still starting are over (at most `wait`;
    /// zero: at once); nothing is claimed or started any more.
    pub(crate) fn drain(&self, wait: Duration) -> (Vec<I>, Vec<C>) {
        let mut st = self.lock();
        st.keys.clear();
        st.closing = true;
        if !wait.is_zero() {
            st = self
                .inner
                .settled
                .wait_timeout_while(st, wait, |st| st.filling.values().sum::<usize>() > 0)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        let claimed = st.claimed.drain().map(|(_, c)| c).collect();
        (st.idle.drain().flat_map(|(_, v)| v).collect(), claimed)
    }
}

/// The platform's home of a run of `sidecar`, from its egress journal
/// (`$AIRLOCK_HOME/runs/<id>/egress.journal`): where a pool keeps its
/// files, beside the runs' directories.
pub(crate) fn home_of(sidecar: &crate::SidecarSpec) -> Option<&Path> {
    sidecar
        .egress_journal
        .parent()
        .and_then(Path::parent)
        .filter(|runs| runs.file_name().is_some_and(|n| n == "runs"))
        .and_then(Path::parent)
}

/// The error of an agent directory beyond [`MAX_VIEW_BYTES`] or
/// [`MAX_VIEW_ENTRIES`].
pub(crate) fn too_large() -> std::io::Error {
    std::io::Error::other("the agent's directory is too large for a warm start")
}

/// Walks the agent's directory `root` depth first, each directory before
/// what it holds, calling `visit` with each entry's path, its path under
/// `root` (empty for `root` itself) and its metadata (links not followed),
/// within [`MAX_VIEW_BYTES`] and [`MAX_VIEW_ENTRIES`]. Only files,
/// directories and symbolic links are given: anything else (a device, a
/// socket, a FIFO) is refused, as is too much.
pub(crate) fn walk_view(
    root: &Path,
    visit: &mut dyn FnMut(&Path, &Path, &std::fs::Metadata) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let mut budget = (MAX_VIEW_BYTES, MAX_VIEW_ENTRIES);
    walk(root, Path::new(""), &mut budget, visit)
}

fn walk(
    from: &Path,
    rel: &Path,
    budget: &mut (u64, usize),
    visit: &mut dyn FnMut(&Path, &Path, &std::fs::Metadata) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let meta = std::fs::symlink_metadata(from)?;
    budget.1 = budget.1.checked_sub(1).ok_or_else(too_large)?;
    let ft = meta.file_type();
    if ft.is_file() {
        budget.0 = budget.0.checked_sub(meta.len()).ok_or_else(too_large)?;
    } else if !ft.is_dir() && !ft.is_symlink() {
        return Err(std::io::Error::other(format!(
            "{}: not a file, directory or link",
            from.display()
        )));
    }
    visit(from, rel, &meta)?;
    if ft.is_dir() {
        for e in std::fs::read_dir(from)? {
            let e = e?;
            walk(&e.path(), &rel.join(e.file_name()), budget, visit)?;
        }
    }
    Ok(())
}

/// An agent's directory `agent` under `t` as the pools' tests give it:
/// `sub/a.py` (`print(1)`, mode 0640) and `link`, a symbolic link to it.
#[cfg(test)]
pub(crate) fn agent_dir_fixture(t: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let from = t.join("agent");
    std::fs::create_dir_all(from.join("sub")).unwrap();
    std::fs::write(from.join("sub/a.py"), "print(1)").unwrap();
    std::fs::set_permissions(
        from.join("sub/a.py"),
        std::fs::Permissions::from_mode(0o640),
    )
    .unwrap();
    std::os::unix::fs::symlink("sub/a.py", from.join("link")).unwrap();
    from
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The share: half the pool, at least one; a tenant at its share
    /// claims nothing more while another still can, and a claim let go
    /// gives its share back.
    #[test]
    fn a_tenant_holds_at_most_half_the_pool() {
        assert_eq!(share_of(1), 1);
        assert_eq!(share_of(5), 2);
        let shares = Shares::of_pool(4);
        assert_eq!(shares.per_tenant, 2);
        let a1 = shares.claim("org_a").expect("first");
        let a2 = shares.claim("org_a").expect("second");
        assert!(shares.claim("org_a").is_none(), "beyond its share");
        let b1 = shares.claim("org_b").expect("another tenant");
        assert_eq!(shares.held().get("org_a"), Some(&2));
        drop(a1);
        let a3 = shares.claim("org_a").expect("a share given back");
        drop((a2, a3, b1));
        assert!(shares.held().is_empty());
    }

    /// The numbers of the items dropped.
    type Gone = Arc<Mutex<Vec<usize>>>;

    /// A sandbox standing for any backend's: its drop counted.
    struct Item(usize, Gone);

    impl Drop for Item {
        fn drop(&mut self) {
            self.1.lock().unwrap().push(self.0);
        }
    }

    /// A shelf of `size` for key `k`, learned, filled with `size` items.
    fn filled(size: usize, late: Late) -> (Shelf<&'static str, Item, ()>, Gone) {
        let gone: Gone = Arc::default();
        let shelf = Shelf::new(size, late);
        assert!(shelf.take(&"k", "org_a").is_none(), "the key is learned");
        assert_eq!(shelf.to_fill(&"k"), size);
        for i in 0..size {
            shelf.settle(&"k", Some(Item(i, gone.clone())));
        }
        (shelf, gone)
    }

    /// The per-tenant share, as both pools take: a tenant holding its
    /// share (half the pool) takes nothing more though sandboxes are idle,
    /// and its run starts cold, while another tenant still takes one; a
    /// claim let go gives its share back.
    #[test]
    fn a_tenant_takes_at_most_its_share_of_the_shelf() {
        let (shelf, _gone) = filled(4, Late::Drop);
        assert_eq!(shelf.inner.shares.per_tenant, 2);
        let a1 = shelf.take(&"k", "org_a").expect("first");
        let a2 = shelf.take(&"k", "org_a").expect("second");
        assert!(shelf.take(&"k", "org_a").is_none(), "beyond its share");
        assert_eq!(shelf.idle_of(&"k"), 2, "what it could not take stays idle");
        let b1 = shelf.take(&"k", "org_b").expect("another tenant");
        assert_eq!(shelf.status().claimed.get("org_a"), Some(&2));
        assert_eq!(shelf.status().claimed.get("org_b"), Some(&1));
        drop(a1);
        let a3 = shelf.take(&"k", "org_a").expect("a share given back");
        drop((a2, a3, b1));
        assert!(shelf.status().claimed.is_empty());
        assert_eq!(shelf.status().idle, 0);
    }

    /// Idle and starting never exceed the size; a failed start is counted
    /// out; one more than the size goes at once; the oldest key beyond
    /// [`MAX_KEYS`] goes with its idle sandboxes; a drain takes everything,
    /// and once closing nothing is taken or started, a late start going as
    /// [`Late`] says.
    #[test]
    fn the_shelf_is_bounded_and_drains_whole() {
        let (shelf, gone) = filled(2, Late::Drop);
        assert_eq!(shelf.to_fill(&"k"), 0, "full");
        let (one, _share) = shelf.take(&"k", "org_a").unwrap();
        assert_eq!(shelf.to_fill(&"k"), 1);
        shelf.settle(&"k", None);
        assert_eq!(shelf.to_fill(&"k"), 1, "one failed: one more");
        shelf.settle(&"k", Some(Item(7, gone.clone())));
        shelf.put_back(&"k", one);
        assert_eq!(shelf.idle_of(&"k"), 2);
        assert_eq!(gone.lock().unwrap().len(), 1, "the one too many went");
        for k in ["k2", "k3", "k4", "k5"] {
            assert!(shelf.take(&k, "org_a").is_none());
        }
        assert_eq!(shelf.keys(), ["k2", "k3", "k4", "k5"]);
        assert_eq!(shelf.idle_of(&"k"), 0, "the oldest key went");
        assert_eq!(gone.lock().unwrap().len(), 3, "with its idle ones");
        let (shelf, gone) = filled(2, Late::Keep);
        let (taken, share) = shelf.take(&"k", "org_a").unwrap();
        drop(share);
        assert_eq!(shelf.to_fill(&"k"), 1);
        shelf.claimed(|c| c.insert("run_x".into(), ()));
        let (idle, claimed) = shelf.drain(Duration::ZERO);
        assert_eq!((idle.len(), claimed.len()), (1, 1));
        assert_eq!(shelf.to_fill(&"k"), 0, "closing");
        assert!(shelf.take(&"k", "org_a").is_none(), "closing");
        shelf.settle(&"k", Some(taken));
        assert_eq!(shelf.status().idle, 1, "kept for the backend's drain");
        assert_eq!(shelf.drain(Duration::from_secs(1)).0.len(), 1);
        drop(idle);
        assert_eq!(gone.lock().unwrap().len(), 2);
    }

    /// Every entry is visited, parents first; too many bytes or entries,
    /// or a socket, are refused.
    #[test]
    fn the_walk_is_bounded_and_takes_only_files_directories_and_links() {
        let t = tempfile::tempdir().unwrap();
        let root = agent_dir_fixture(t.path());
        let mut seen = vec![];
        walk_view(&root, &mut |_, rel, _| {
            seen.push(rel.to_owned());
            Ok(())
        })
        .unwrap();
        assert_eq!(seen[0], Path::new(""));
        let sub = seen.iter().position(|p| p == Path::new("sub")).unwrap();
        let file = seen
            .iter()
            .position(|p| p == Path::new("sub/a.py"))
            .unwrap();
        assert!(sub < file, "{seen:?}");
        assert!(seen.contains(&Path::new("link").to_owned()));
        let mut budget = (4, 10);
        let e = walk(&root, Path::new(""), &mut budget, &mut |_, _, _| Ok(())).unwrap_err();
        assert!(e.to_string().contains("too large"), "{e}");
        let mut budget = (1 << 20, 2);
        assert!(walk(&root, Path::new(""), &mut budget, &mut |_, _, _| Ok(())).is_err());
        let _l = std::os::unix::net::UnixListener::bind(root.join("s.sock")).unwrap();
        assert!(walk_view(&root, &mut |_, _, _| Ok(())).is_err());
    }
}
