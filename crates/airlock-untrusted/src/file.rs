//! Reading a file that a sandbox could have written (or replaced): never
//! follow a symlink, never block on a FIFO or a device, never read more
//! than a bound. The platform's boot reclaim and the runtime's result file
//! go through [`read_file`]; a live run's egress journal is followed
//! through [`open_regular`].

use std::io::Read;
use std::path::Path;

use rustix::fs::{Mode, OFlags, ResolveFlags};

#[derive(Debug, thiserror::Error)]
pub enum UntrustedFileError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is not a regular file")]
    NotRegular { path: String },
    #[error("{path} is larger than {max} bytes")]
    TooLarge { path: String, max: u64 },
}

/// The regular file at `path`, opened for reading. A symlink anywhere in
/// the path, a FIFO, a socket, a device or a directory is an error,
/// returned at once.
pub fn open_regular(path: &Path) -> Result<std::fs::File, UntrustedFileError> {
    let name = || path.display().to_string();
    let io = |source: std::io::Error| UntrustedFileError::Io {
        path: name(),
        source,
    };
    let flags =
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
    let fd = match rustix::fs::openat2(
        rustix::fs::CWD,
        path,
        flags,
        Mode::empty(),
        ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    ) {
        Err(rustix::io::Errno::NOSYS) => rustix::fs::open(path, flags, Mode::empty()),
        other => other,
    }
    .map_err(|e| io(e.into()))?;
    let st = rustix::fs::fstat(&fd).map_err(|e| io(e.into()))?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(UntrustedFileError::NotRegular { path: name() });
    }
    Ok(std::fs::File::from(fd))
}

/// The content of the regular file at `path` ([`open_regular`]), at most
/// `max` bytes.
pub fn read_file(path: &Path, max: u64) -> Result<Vec<u8>, UntrustedFileError> {
    let mut out = Vec::new();
    open_regular(path)?
        .take(max.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(|source| UntrustedFileError::Io {
            path: path.display().to_string(),
            source,
        })?;
    if out.len() as u64 > max {
        return Err(UntrustedFileError::TooLarge {
            path: path.display().to_string(),
            max,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regular_files_are_read_and_everything_else_refused_at_once() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("owner.pid");
        std::fs::write(&f, "1234").unwrap();
        assert_eq!(read_file(&f, 16).unwrap(), b"1234");
        assert!(matches!(
            read_file(&f, 3),
            Err(UntrustedFileError::TooLarge { max: 3, .. })
        ));
        // a symlink to a device that never ends
        let zero = d.path().join("zero");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        assert!(matches!(
            read_file(&zero, 16),
            Err(UntrustedFileError::Io { .. })
        ));
        // a symlinked directory in the path
        let sub = d.path().join("real");
        std::fs::create_dir(&sub).unwrap();
        std::fs::write(sub.join("x"), "1").unwrap();
        std::os::unix::fs::symlink(&sub, d.path().join("link")).unwrap();
        assert!(read_file(&d.path().join("link/x"), 16).is_err());
        // a FIFO nobody writes to: refused at once, no hang
        let fifo = d.path().join("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let t = std::time::Instant::now();
        assert!(matches!(
            read_file(&fifo, 16),
            Err(UntrustedFileError::NotRegular { .. })
        ));
        assert!(t.elapsed() < std::time::Duration::from_secs(2));
        // the device itself
        assert!(matches!(
            read_file(Path::new("/dev/zero"), 16),
            Err(UntrustedFileError::NotRegular { .. })
        ));
    }
}
