//! What the warm pools of every backend decide the same way
//! ([`crate::docker::pool`], [`crate::microvm::pool`]): the per-tenant
//! share of a pool, and which agent directories a claimed sandbox may be
//! given (copied in at its claim, never before) within one bound.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

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

    /// Every entry is visited, parents first; too many bytes or entries,
    /// or a socket, are refused.
    #[test]
    fn the_walk_is_bounded_and_takes_only_files_directories_and_links() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("agent");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/a.py"), "print(1)").unwrap();
        std::os::unix::fs::symlink("sub/a.py", root.join("link")).unwrap();
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
