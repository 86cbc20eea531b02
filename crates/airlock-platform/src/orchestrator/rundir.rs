//! A run's directory on the platform's side (`$AIRLOCK_HOME/runs/<id>`,
//! 0700): its owner file, its sockets' directories, its private files.

use std::path::Path;

/// In a run directory: the PID of the platform that owns the run.
pub const OWNER_FILE: &str = "owner.pid";
/// Largest owner file reclaim reads (a PID).
pub(super) const MAX_OWNER_FILE: u64 = 32;

pub(super) fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// Writes the owner file of `run_dir`: this process's PID, whole or not at
/// all (written beside it, then renamed). A concurrent platform's boot
/// reclaim reads it at any moment: a file caught half-written (empty) read
/// as no owner, and that reclaim removed a starting run's directory and
/// failed the run (one in ~150 of 50 concurrent `airlock run`s).
pub(super) fn write_owner(run_dir: &Path) -> std::io::Result<()> {
    let pid = std::process::id().to_string();
    let partial = run_dir.join(format!("{OWNER_FILE}.partial"));
    std::fs::write(&partial, pid)?;
    std::fs::rename(&partial, run_dir.join(OWNER_FILE))
}

/// The PID an owner file names; `None` if it names none (garbage).
pub(super) fn owner_pid(contents: &[u8]) -> Option<i32> {
    std::str::from_utf8(contents)
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
}

/// The sockets' directory: the platform's, searchable (not listable or
/// writable) by the sandbox's unprivileged uid.
pub(super) fn create_sockets_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o711)
        .create(dir)?;
    // The umask may have taken bits the mode asked for.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))
}

/// Writes a new private file (0600, never through a link).
pub(super) fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits().cast_signed())
        .open(path)?;
    f.write_all(bytes)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    /// A reader of the owner file (a concurrent platform's boot reclaim)
    /// never catches it half-written: it finds no file yet, or the whole
    /// PID. (Written in place, an empty file was caught and read as no
    /// owner: the starting run's directory was removed and the run failed.)
    #[test]
    fn the_owner_file_is_never_read_half_written() {
        let home = tempfile::tempdir().expect("tempdir");
        let dirs: Vec<PathBuf> = (0..1000)
            .map(|i| home.path().join(format!("run_{i}")))
            .collect();
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (dirs, done) = (dirs.clone(), done.clone());
            std::thread::spawn(move || {
                let (mut whole, mut torn) = (0u32, Vec::new());
                while !done.load(std::sync::atomic::Ordering::Acquire) {
                    for d in &dirs {
                        // (Not there yet: a reclaim waits for it.)
                        let read = airlock_sandbox::untrusted::read_file(
                            &d.join(OWNER_FILE),
                            MAX_OWNER_FILE,
                        );
                        if let Ok(b) = read {
                            match owner_pid(&b) {
                                Some(_) => whole += 1,
                                None => torn.push(b),
                            }
                        }
                    }
                }
                (whole, torn)
            })
        };
        for d in &dirs {
            create_private_dir(d).expect("run directory");
            write_owner(d).expect("owner file");
        }
        done.store(true, std::sync::atomic::Ordering::Release);
        let (whole, torn) = reader.join().expect("reader");
        assert!(torn.is_empty(), "owner files read half-written: {torn:?}");
        assert!(whole > 0, "the reader saw owner files at all");
        for d in &dirs {
            let b = std::fs::read(d.join(OWNER_FILE)).expect("owner file");
            assert_eq!(owner_pid(&b), i32::try_from(std::process::id()).ok());
            assert!(!d.join(format!("{OWNER_FILE}.partial")).exists());
        }
    }
}
