//! The bundle manifest (`airlock-bundle.json`, docs/bundles.md): every
//! file of an agent's directory with its SHA-256 and size, sorted by path,
//! and the scan of a directory that makes or checks one.

use std::io::Read as _;
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use super::BundleRefusal;

/// The version of the manifest this Airlock reads.
pub const BUNDLE_SCHEMA_VERSION: u32 = 1;
/// The manifest's name in the bundle's root (not itself listed).
pub const MANIFEST_FILE: &str = "airlock-bundle.json";
/// The signature's name in the bundle's root (not itself listed).
pub const SIGNATURE_FILE: &str = "airlock-bundle.sig";
/// Most files a bundle may hold.
pub const MAX_BUNDLE_FILES: usize = 10_000;
/// Largest manifest read.
pub const MAX_MANIFEST_BYTES: usize = 4 << 20;
/// Deepest directory nesting scanned.
const MAX_DEPTH: usize = 32;

/// One file of a bundle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleFile {
    /// Relative, `/`-separated (`airlock_platform_api::files::check_relative_path`).
    pub path: String,
    /// Lowercase hex of SHA-256 over the file's bytes.
    pub sha256: String,
    pub size: u64,
}

/// A bundle's manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleManifest {
    pub schema_version: u32,
    /// Sorted by `path` (bytewise), each path once.
    pub files: Vec<BundleFile>,
}

fn malformed(why: impl Into<String>) -> BundleRefusal {
    BundleRefusal::Malformed(why.into())
}

impl BundleManifest {
    /// The manifest of `dir` as it is now.
    pub fn of_dir(dir: &Path) -> Result<BundleManifest, BundleRefusal> {
        Ok(BundleManifest {
            schema_version: BUNDLE_SCHEMA_VERSION,
            files: scan(dir)?,
        })
    }

    /// The manifest file's text (what is signed).
    pub fn to_file(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).unwrap_or_default();
        s.push('\n');
        s
    }

    /// Parses and checks a manifest file.
    pub fn parse(bytes: &[u8]) -> Result<BundleManifest, BundleRefusal> {
        if bytes.len() > MAX_MANIFEST_BYTES {
            return Err(malformed(format!(
                "{MANIFEST_FILE} is above {MAX_MANIFEST_BYTES} bytes"
            )));
        }
        let m: BundleManifest = serde_json::from_slice(bytes)
            .map_err(|e| malformed(format!("{MANIFEST_FILE}: {e}")))?;
        if m.schema_version != BUNDLE_SCHEMA_VERSION {
            return Err(malformed(format!(
                "{MANIFEST_FILE}: schema_version {} is not {BUNDLE_SCHEMA_VERSION}",
                m.schema_version
            )));
        }
        if m.files.len() > MAX_BUNDLE_FILES {
            return Err(malformed(format!("more than {MAX_BUNDLE_FILES} files")));
        }
        for f in &m.files {
            if airlock_platform_api::files::check_relative_path(&f.path).is_err()
                || is_bundle_file(&f.path)
            {
                return Err(BundleRefusal::PathEscape(f.path.clone()));
            }
            if f.sha256.len() != 64
                || !f
                    .sha256
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            {
                return Err(malformed(format!(
                    "{}: sha256 is not 64 lowercase hex",
                    f.path
                )));
            }
        }
        if !m.files.windows(2).all(|w| w[0].path < w[1].path) {
            return Err(malformed("files are not sorted by path, each once"));
        }
        Ok(m)
    }

    /// `dir` holds exactly these files, with these sizes and digests.
    pub fn check_dir(&self, dir: &Path) -> Result<(), BundleRefusal> {
        let on_disk = scan(dir)?;
        let mut want = self.files.iter().peekable();
        let mut have = on_disk.iter().peekable();
        loop {
            match (want.peek(), have.peek()) {
                (None, None) => return Ok(()),
                (Some(w), Some(h)) if w.path == h.path => {
                    if w != h {
                        return Err(BundleRefusal::FileChanged(w.path.clone()));
                    }
                    want.next();
                    have.next();
                }
                (Some(w), Some(h)) if w.path < h.path => {
                    return Err(BundleRefusal::FileRemoved(w.path.clone()));
                }
                (Some(w), None) => return Err(BundleRefusal::FileRemoved(w.path.clone())),
                (_, Some(h)) => return Err(BundleRefusal::FileAdded(h.path.clone())),
            }
        }
    }
}

/// The manifest and signature files, in the root only.
fn is_bundle_file(path: &str) -> bool {
    path == MANIFEST_FILE || path == SIGNATURE_FILE
}

/// Every regular file under `dir` but the bundle's own two, sorted by
/// path. A symbolic link anywhere is refused (it may point out of the
/// bundle), as is anything but a regular file or a directory, and a name
/// that is not UTF-8.
fn scan(dir: &Path) -> Result<Vec<BundleFile>, BundleRefusal> {
    let mut out = Vec::new();
    walk(dir, "", 0, &mut out)?;
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

fn unreadable(path: &Path, e: &std::io::Error) -> BundleRefusal {
    BundleRefusal::Unreadable(format!("{}: {e}", path.display()))
}

fn walk(
    dir: &Path,
    prefix: &str,
    depth: usize,
    out: &mut Vec<BundleFile>,
) -> Result<(), BundleRefusal> {
    if depth > MAX_DEPTH {
        return Err(malformed(format!(
            "{prefix}: nested deeper than {MAX_DEPTH}"
        )));
    }
    let entries = std::fs::read_dir(dir).map_err(|e| unreadable(dir, &e))?;
    for entry in entries {
        let entry = entry.map_err(|e| unreadable(dir, &e))?;
        let name = entry.file_name();
        let name = name.to_str().ok_or_else(|| {
            malformed(format!(
                "{prefix}{}: not a UTF-8 name",
                name.to_string_lossy()
            ))
        })?;
        let rel = format!("{prefix}{name}");
        let path = entry.path();
        let meta = std::fs::symlink_metadata(&path).map_err(|e| unreadable(&path, &e))?;
        let kind = meta.file_type();
        if kind.is_symlink() {
            return Err(BundleRefusal::PathEscape(rel));
        }
        if kind.is_dir() {
            walk(&path, &format!("{rel}/"), depth + 1, out)?;
            continue;
        }
        if !kind.is_file() {
            return Err(malformed(format!(
                "{rel}: not a regular file or a directory"
            )));
        }
        if depth == 0 && is_bundle_file(&rel) {
            continue;
        }
        airlock_platform_api::files::check_relative_path(&rel)
            .map_err(|_| BundleRefusal::PathEscape(rel.clone()))?;
        if out.len() >= MAX_BUNDLE_FILES {
            return Err(malformed(format!("more than {MAX_BUNDLE_FILES} files")));
        }
        let (sha256, size) = digest(&path)?;
        out.push(BundleFile {
            path: rel,
            sha256,
            size,
        });
    }
    Ok(())
}

/// SHA-256 (hex) and size of the file at `path`, read without following a
/// symbolic link put in its place since the scan.
fn digest(path: &Path) -> Result<(String, u64), BundleRefusal> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits().cast_signed())
        .open(path)
        .map_err(|e| unreadable(path, &e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 << 10];
    let mut size = 0u64;
    loop {
        let n = f.read(&mut buf).map_err(|e| unreadable(path, &e))?;
        if n == 0 {
            break;
        }
        size += n as u64;
        h.update(&buf[..n]);
    }
    Ok((hex::encode(h.finalize()), size))
}
