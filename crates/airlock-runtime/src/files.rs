//! Files in and out of a run, on the sandbox's side.
//!
//! In: the run's input files, in a directory the platform wrote and the
//! sandbox sees read-only, are copied into the workspace before the agent
//! starts (their paths were checked when the run was created).
//!
//! Out: once the agent has exited (its process group killed), the regular
//! files under its output directory are handed to the sidecar one by one
//! (`POST /artifacts`), at most [`MAX_RUN_ARTIFACTS`]. Nothing the agent
//! left is trusted: no symlink is followed (a symlink anywhere in a path is
//! refused, see [`airlock_untrusted::file`]), no FIFO or device is opened, no
//! file is read past [`MAX_ARTIFACT_FILE_BYTES`]. What is not read is still
//! handed over, with the reason ([`ArtifactRefusal`]), so the run records it.

use std::path::{Path, PathBuf};

use airlock_platform_api::files::{
    ARTIFACT_PATH_HEADER, ARTIFACT_REFUSED_HEADER, ArtifactRefusal, MAX_ARTIFACT_FILE_BYTES,
    MAX_RUN_ARTIFACTS, check_relative_path,
};
use bytes::Bytes;
use secrecy::SecretString;

use crate::relay::Dial;

/// Deepest directory looked into below the output directory.
const MAX_DEPTH: usize = 16;
/// Most directory entries looked at in all (files, directories, links).
const MAX_ENTRIES: usize = 4096;

/// Copies every file under `from` into `workspace` at the same relative path.
pub(crate) fn place_inputs(from: &Path, workspace: &Path) -> std::io::Result<()> {
    let mut dirs = vec![PathBuf::new()];
    while let Some(rel) = dirs.pop() {
        for entry in std::fs::read_dir(from.join(&rel))? {
            let entry = entry?;
            let rel = rel.join(entry.file_name());
            let kind = entry.file_type()?;
            if kind.is_dir() {
                std::fs::create_dir_all(workspace.join(&rel))?;
                dirs.push(rel);
            } else if kind.is_file() {
                std::fs::copy(from.join(&rel), workspace.join(&rel))?;
            }
        }
    }
    Ok(())
}

/// One artifact as the runtime found it.
#[derive(Debug, PartialEq)]
pub(crate) struct Found {
    /// Relative to the output directory, `/`-separated.
    pub path: String,
    pub body: Result<Vec<u8>, (ArtifactRefusal, u64)>,
}

/// What the agent left under `root`, each file read or refused; at most
/// [`MAX_RUN_ARTIFACTS`]. A `root` that is a symlink or not a directory
/// holds nothing.
pub(crate) fn collect(root: &Path) -> Vec<Found> {
    let mut found = Vec::new();
    match std::fs::symlink_metadata(root) {
        Ok(m) if m.is_dir() => {}
        _ => return found,
    }
    let mut seen = 0usize;
    let mut dirs = vec![(PathBuf::new(), 0usize)];
    while let Some((rel, depth)) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(root.join(&rel)) else {
            continue;
        };
        for entry in entries.flatten() {
            seen += 1;
            if seen > MAX_ENTRIES || found.len() >= MAX_RUN_ARTIFACTS {
                return found;
            }
            let rel = rel.join(entry.file_name());
            let Ok(meta) = std::fs::symlink_metadata(root.join(&rel)) else {
                continue;
            };
            let kind = meta.file_type();
            if kind.is_dir() {
                if depth < MAX_DEPTH {
                    dirs.push((rel, depth + 1));
                }
                continue;
            }
            let Some(path) = spelled(&rel) else {
                eprintln!(
                    "airlock runtime warning: artifact {} not kept: its path is not one a run may hold",
                    rel.display()
                );
                continue;
            };
            let body = if kind.is_symlink() {
                Err((ArtifactRefusal::Symlink, 0))
            } else if !kind.is_file() {
                Err((ArtifactRefusal::NotAFile, 0))
            } else if meta.len() > MAX_ARTIFACT_FILE_BYTES {
                Err((ArtifactRefusal::TooLarge, meta.len()))
            } else {
                read(&root.join(&rel), meta.len())
            };
            found.push(Found { path, body });
        }
    }
    found.sort_by(|a, b| a.path.cmp(&b.path));
    found
}

/// The file's bytes, never through a symlink (anywhere in its path) nor
/// past the cap.
fn read(path: &Path, seen_len: u64) -> Result<Vec<u8>, (ArtifactRefusal, u64)> {
    use airlock_untrusted::file::{UntrustedFileError, read_file};
    read_file(path, MAX_ARTIFACT_FILE_BYTES).map_err(|e| match e {
        UntrustedFileError::TooLarge { .. } => (ArtifactRefusal::TooLarge, seen_len),
        UntrustedFileError::NotRegular { .. } => (ArtifactRefusal::NotAFile, 0),
        // ELOOP: a directory on the way became a symlink.
        UntrustedFileError::Io { source, .. } if source.raw_os_error() == Some(40) => {
            (ArtifactRefusal::Symlink, 0)
        }
        UntrustedFileError::Io { .. } => (ArtifactRefusal::Unreadable, seen_len),
    })
}

/// `rel` as the run records it, when it is UTF-8 and a path
/// [`check_relative_path`] accepts.
fn spelled(rel: &Path) -> Option<String> {
    let parts: Option<Vec<&str>> = rel.iter().map(|c| c.to_str()).collect();
    let path = parts?.join("/");
    check_relative_path(&path).ok().map(|()| path)
}

/// Hands each of `found` to the sidecar; a refusal or a failure is said on
/// the runtime's stderr and the next one is tried.
pub(crate) async fn hand_over(sidecar: &Dial, token: &SecretString, found: Vec<Found>) {
    for f in found {
        let mut headers = http::HeaderMap::new();
        let encoded: String =
            percent_encoding::utf8_percent_encode(&f.path, percent_encoding::NON_ALPHANUMERIC)
                .collect();
        let Ok(path) = http::HeaderValue::from_str(&encoded) else {
            continue;
        };
        headers.insert(ARTIFACT_PATH_HEADER, path);
        let body = match f.body {
            Ok(b) => Bytes::from(b),
            Err((why, n)) => {
                if let Ok(v) = http::HeaderValue::from_str(&format!("{} {n}", why.as_str())) {
                    headers.insert(ARTIFACT_REFUSED_HEADER, v);
                }
                Bytes::new()
            }
        };
        if let Err(e) = crate::report::send(sidecar, token, "/artifacts", headers, body).await {
            eprintln!(
                "airlock runtime warning: artifact {} not handed over: {e}",
                f.path
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_are_placed_at_their_paths() {
        let (from, ws) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        std::fs::create_dir_all(from.path().join("data/deep")).unwrap();
        std::fs::write(from.path().join("a.txt"), "A").unwrap();
        std::fs::write(from.path().join("data/deep/b.csv"), "B").unwrap();
        place_inputs(from.path(), ws.path()).unwrap();
        assert_eq!(
            std::fs::read_to_string(ws.path().join("a.txt")).unwrap(),
            "A"
        );
        assert_eq!(
            std::fs::read_to_string(ws.path().join("data/deep/b.csv")).unwrap(),
            "B"
        );
    }

    #[test]
    fn what_the_agent_left_is_read_and_links_and_specials_refused() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("out");
        std::fs::create_dir_all(out.join("sub")).unwrap();
        std::fs::write(out.join("report.md"), "done").unwrap();
        std::fs::write(out.join("sub/data.bin"), [0u8, 1, 2]).unwrap();
        std::fs::write(d.path().join("secret"), "outside").unwrap();
        std::os::unix::fs::symlink(d.path().join("secret"), out.join("link")).unwrap();
        std::os::unix::fs::symlink("/etc", out.join("etc")).unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(out.join("fifo"))
            .status()
            .unwrap();
        assert!(made.success());
        let big = std::fs::File::create(out.join("big")).unwrap();
        big.set_len(MAX_ARTIFACT_FILE_BYTES + 1).unwrap();
        let found = collect(&out);
        type Seen<'a> = (&'a str, Result<&'a [u8], (ArtifactRefusal, u64)>);
        let seen: Vec<Seen> = found
            .iter()
            .map(|f| {
                (
                    f.path.as_str(),
                    f.body.as_ref().map(Vec::as_slice).map_err(|e| *e),
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                (
                    "big",
                    Err((ArtifactRefusal::TooLarge, MAX_ARTIFACT_FILE_BYTES + 1))
                ),
                ("etc", Err((ArtifactRefusal::Symlink, 0))),
                ("fifo", Err((ArtifactRefusal::NotAFile, 0))),
                ("link", Err((ArtifactRefusal::Symlink, 0))),
                ("report.md", Ok(&b"done"[..])),
                ("sub/data.bin", Ok(&[0u8, 1, 2][..])),
            ]
        );
        // An output directory that is itself a link holds nothing.
        std::os::unix::fs::symlink(d.path(), d.path().join("out2")).unwrap();
        assert!(collect(&d.path().join("out2")).is_empty());
        assert!(collect(&d.path().join("missing")).is_empty());
    }

    #[test]
    fn no_more_than_a_runs_worth_of_files_is_looked_at() {
        let d = tempfile::tempdir().unwrap();
        for i in 0..(MAX_RUN_ARTIFACTS + 10) {
            std::fs::write(d.path().join(format!("f{i}")), "x").unwrap();
        }
        assert_eq!(collect(d.path()).len(), MAX_RUN_ARTIFACTS);
    }
}
