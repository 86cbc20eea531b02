//! Files in and out of a run: the one check every path a tenant or an
//! agent names goes through (an agent's bundle, a run's inputs, its
//! artifacts), and the bounds on what a run takes in and leaves behind.
//!
//! Inputs are written by the platform into a directory the sandbox sees
//! read-only, and copied by the runtime into the workspace before the agent
//! starts. Artifacts are the regular files the agent leaves under its
//! declared output directory: after the agent has exited (its process group
//! killed), the runtime reads each one (no symlink is followed, no FIFO
//! opened) and hands it to the sidecar, which stores it with the run through
//! the platform, within the run's and the organization's quota. What is not
//! stored is recorded with the reason ([`ArtifactRefusal`]), never dropped
//! silently.

/// Longest path, in bytes.
pub const MAX_PATH_BYTES: usize = 200;
/// At most this many input files at a run's creation.
pub const MAX_INPUT_FILES: usize = 64;
/// At most this many bytes in one input file.
pub const MAX_INPUT_FILE_BYTES: usize = 1 << 20;
/// At most this many bytes of input files in one run.
pub const MAX_INPUT_BYTES: usize = 4 << 20;
/// At most this many bytes in one artifact (a larger file is recorded
/// refused, [`ArtifactRefusal::TooLarge`]).
pub const MAX_ARTIFACT_FILE_BYTES: u64 = 4 << 20;
/// At most this many artifacts (stored or refused) recorded for one run: the
/// runtime looks at no more files than this, the store records no more.
pub const MAX_RUN_ARTIFACTS: usize = 64;
/// The header the runtime and the sidecar name an artifact's path with.
pub const ARTIFACT_PATH_HEADER: &str = "x-airlock-artifact-path";
/// The header saying why the runtime did not read an artifact (the body is then empty).
pub const ARTIFACT_REFUSED_HEADER: &str = "x-airlock-artifact-refused";

/// Why a path was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("must be 1-{MAX_PATH_BYTES} bytes")]
    Length,
    #[error("must be relative, with / between segments")]
    NotRelative,
    #[error("has a control character")]
    Control,
    #[error("has an empty, . or .. segment")]
    Segment,
}

/// A path a tenant or an agent names inside a directory of the run's:
/// relative, `/`-separated, no `.`/`..`/empty segment, no control
/// characters, at most [`MAX_PATH_BYTES`] bytes. Joined to its directory it
/// never leaves it (what a symlink on the way points to is the reader's
/// and writer's care: they follow none).
pub fn check_relative_path(p: &str) -> Result<(), PathError> {
    if p.is_empty() || p.len() > MAX_PATH_BYTES {
        return Err(PathError::Length);
    }
    if p.starts_with('/') || p.contains('\\') {
        return Err(PathError::NotRelative);
    }
    if p.chars().any(char::is_control) {
        return Err(PathError::Control);
    }
    if p.split('/').any(|s| s.is_empty() || s == "." || s == "..") {
        return Err(PathError::Segment);
    }
    Ok(())
}

/// Why an artifact the agent left was not stored. Spelled in snake case on
/// the wire, in the store and in `/v1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ArtifactRefusal {
    /// A symbolic link (never followed: it may point outside the output directory).
    Symlink,
    /// Neither a regular file nor a directory (a FIFO, a socket, a device).
    NotAFile,
    /// Larger than [`MAX_ARTIFACT_FILE_BYTES`].
    TooLarge,
    /// Its path is not one [`check_relative_path`] accepts.
    BadPath,
    /// The file could not be read.
    Unreadable,
    /// The run already holds [`MAX_RUN_ARTIFACTS`] artifacts.
    RunFiles,
    /// Storing it would pass the run's artifact bytes (`RUN_MAX_ARTIFACT_BYTES`).
    RunQuota,
    /// Storing it would pass the organization's artifact bytes (`ORG_MAX_ARTIFACT_BYTES`).
    OrgQuota,
}

impl ArtifactRefusal {
    pub const ALL: [ArtifactRefusal; 8] = [
        ArtifactRefusal::Symlink,
        ArtifactRefusal::NotAFile,
        ArtifactRefusal::TooLarge,
        ArtifactRefusal::BadPath,
        ArtifactRefusal::Unreadable,
        ArtifactRefusal::RunFiles,
        ArtifactRefusal::RunQuota,
        ArtifactRefusal::OrgQuota,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ArtifactRefusal::Symlink => "symlink",
            ArtifactRefusal::NotAFile => "not_a_file",
            ArtifactRefusal::TooLarge => "too_large",
            ArtifactRefusal::BadPath => "bad_path",
            ArtifactRefusal::Unreadable => "unreadable",
            ArtifactRefusal::RunFiles => "run_files",
            ArtifactRefusal::RunQuota => "run_quota",
            ArtifactRefusal::OrgQuota => "org_quota",
        }
    }
}

/// A spelling that is no [`ArtifactRefusal`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an artifact refusal")]
pub struct UnknownRefusal(pub String);

impl std::str::FromStr for ArtifactRefusal {
    type Err = UnknownRefusal;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ArtifactRefusal::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| UnknownRefusal(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_that_leave_their_directory_are_refused() {
        for (p, e) in [
            ("", PathError::Length),
            ("/etc/passwd", PathError::NotRelative),
            ("a\\b", PathError::NotRelative),
            ("../x", PathError::Segment),
            ("a/../../x", PathError::Segment),
            ("a//b", PathError::Segment),
            ("./a", PathError::Segment),
            ("a/", PathError::Segment),
            ("a\nb", PathError::Control),
        ] {
            assert_eq!(check_relative_path(p), Err(e), "{p:?}");
        }
        assert_eq!(
            check_relative_path(&"a".repeat(201)),
            Err(PathError::Length)
        );
        assert_eq!(check_relative_path("out/report.md"), Ok(()));
        assert_eq!(check_relative_path("..a/b.."), Ok(()));
    }

    #[test]
    fn a_refusal_is_spelled_the_same_by_serde_and_as_str() {
        use std::str::FromStr as _;
        for r in ArtifactRefusal::ALL {
            let json = serde_json::to_string(&r).unwrap();
            assert_eq!(json, format!("\"{}\"", r.as_str()));
            assert_eq!(ArtifactRefusal::from_str(r.as_str()), Ok(r));
        }
    }
}
