//! Signed agent bundles (docs/bundles.md): an agent's directory with a
//! manifest of every file ([`BundleManifest`]) and a detached signature of
//! it, verified before a run starts under `AFPS_SIGNATURE_POLICY` with the
//! keys of `AFPS_TRUST_ROOT`.
//!
//! Contracts:
//! - `off`: nothing is read or checked;
//! - `warn` (the default): an unsigned agent runs; a signed one is checked,
//!   and what the signature proves wrong (a file changed, added, removed or
//!   renamed, a path out of the bundle, an invalid signature, a malformed
//!   file) refuses the run, while what it cannot prove (a key or chain the
//!   platform does not trust) is a warning and the run goes on;
//! - `required`: anything but a bundle signed by a trusted key, whose files
//!   are exactly its manifest's, refuses the run;
//! - a refusal is typed ([`BundleRefusal::code`]) and reaches the run's
//!   stored failure reason and the CLI before anything starts.

mod manifest;

use std::path::Path;

pub use manifest::{
    BUNDLE_SCHEMA_VERSION, BundleFile, BundleManifest, MANIFEST_FILE, MAX_BUNDLE_FILES,
    MAX_MANIFEST_BYTES, SIGNATURE_FILE,
};

use crate::settings::SettingsError;
use crate::signing::{Purpose, Signature, SigningError, TrustRoot};

/// `off`, `warn` or `required`.
pub const ENV_POLICY: &str = "AFPS_SIGNATURE_POLICY";
/// The keys a bundle may be signed by: a JSON list of `{"key_id", "public_key"}`.
pub const ENV_TRUST_ROOT: &str = "AFPS_TRUST_ROOT";

/// How bundle signatures are enforced.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SignaturePolicy {
    Off,
    #[default]
    Warn,
    Required,
}

/// `AFPS_SIGNATURE_POLICY` and `AFPS_TRUST_ROOT`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BundleSettings {
    pub policy: SignaturePolicy,
    pub trust: TrustRoot,
}

impl BundleSettings {
    pub fn from_vars(
        policy: Option<&str>,
        trust: Option<&str>,
    ) -> Result<BundleSettings, SettingsError> {
        let policy = match policy.map(str::trim) {
            None => SignaturePolicy::default(),
            Some("off") => SignaturePolicy::Off,
            Some("warn") => SignaturePolicy::Warn,
            Some("required") => SignaturePolicy::Required,
            Some(v) => {
                return Err(SettingsError {
                    var: ENV_POLICY,
                    message: format!("{v:?} is not off, warn or required"),
                });
            }
        };
        let trust = match trust {
            None => TrustRoot::default(),
            Some(t) => TrustRoot::parse(t).map_err(|e| SettingsError {
                var: ENV_TRUST_ROOT,
                message: e.to_string(),
            })?,
        };
        if policy == SignaturePolicy::Required && trust.is_empty() {
            return Err(SettingsError {
                var: ENV_TRUST_ROOT,
                message: "AFPS_SIGNATURE_POLICY=required needs at least one trusted key: \
                          every run would be refused"
                    .into(),
            });
        }
        Ok(BundleSettings { policy, trust })
    }
}

/// Why a bundle is refused: one variant per reason, each with its code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BundleRefusal {
    #[error("{0}")]
    Malformed(String),
    #[error("{0}")]
    Unreadable(String),
    #[error("the signature of {MANIFEST_FILE} does not verify")]
    SignatureInvalid,
    #[error("signed by key {0:?}, which is not in AFPS_TRUST_ROOT")]
    KeyUntrusted(String),
    #[error("{0}")]
    ChainUntrusted(String),
    #[error(
        "the agent is not a signed bundle and AFPS_SIGNATURE_POLICY is required (sign it with `airlock bundle pack` and `airlock bundle sign`)"
    )]
    UnsignedRequired,
    #[error("{0:?} is a path out of the bundle (a symbolic link, an absolute path or a `..`)")]
    PathEscape(String),
    #[error("{0:?} changed after signing")]
    FileChanged(String),
    #[error("{0:?} was added after signing")]
    FileAdded(String),
    #[error("{0:?} was removed (or renamed) after signing")]
    FileRemoved(String),
}

impl BundleRefusal {
    /// The reason's code, as stored and shown.
    pub fn code(&self) -> &'static str {
        match self {
            BundleRefusal::Malformed(_) => "malformed",
            BundleRefusal::Unreadable(_) => "unreadable",
            BundleRefusal::SignatureInvalid => "signature_invalid",
            BundleRefusal::KeyUntrusted(_) => "key_untrusted",
            BundleRefusal::ChainUntrusted(_) => "chain_untrusted",
            BundleRefusal::UnsignedRequired => "unsigned_required",
            BundleRefusal::PathEscape(_) => "path_escape",
            BundleRefusal::FileChanged(_) => "file_changed",
            BundleRefusal::FileAdded(_) => "file_added",
            BundleRefusal::FileRemoved(_) => "file_removed",
        }
    }

    /// What the signature cannot prove (rather than proves wrong): a
    /// warning under `warn`.
    fn is_trust(&self) -> bool {
        matches!(
            self,
            BundleRefusal::KeyUntrusted(_) | BundleRefusal::ChainUntrusted(_)
        )
    }
}

impl From<SigningError> for BundleRefusal {
    fn from(e: SigningError) -> Self {
        match e {
            SigningError::BadSignature => BundleRefusal::SignatureInvalid,
            SigningError::UntrustedKey(id) => BundleRefusal::KeyUntrusted(id),
            SigningError::ChainUntrusted(why) => BundleRefusal::ChainUntrusted(why),
            e => BundleRefusal::Malformed(format!("{SIGNATURE_FILE}: {e}")),
        }
    }
}

/// What the check of an agent's directory found (when it does not refuse).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// `off`: not looked at.
    NotChecked,
    /// `warn`: no bundle manifest or signature.
    Unsigned,
    /// Signed by this trusted key; every file is the manifest's.
    Verified { key_id: String },
    /// `warn`: the files are the signed manifest's, by a key not trusted.
    Untrusted(BundleRefusal),
}

/// Reads a file of the bundle's root: None when it is not there.
fn read_root_file(dir: &Path, name: &str) -> Result<Option<Vec<u8>>, BundleRefusal> {
    let path = dir.join(name);
    match std::fs::symlink_metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(BundleRefusal::Unreadable(format!(
                "{}: {e}",
                path.display()
            )));
        }
        Ok(m) if !m.file_type().is_file() => return Err(BundleRefusal::PathEscape(name.into())),
        Ok(m) if m.len() > MAX_MANIFEST_BYTES as u64 => {
            return Err(BundleRefusal::Malformed(format!("{name} is too large")));
        }
        Ok(_) => {}
    }
    std::fs::read(&path)
        .map(Some)
        .map_err(|e| BundleRefusal::Unreadable(format!("{}: {e}", path.display())))
}

/// Verifies `dir` as a bundle under `trust`, whatever the policy: its
/// manifest and signature are well formed, its files are exactly the
/// manifest's, and the signature verifies by a trusted key. None: there
/// is no signed bundle (no manifest or no signature).
pub fn verify(dir: &Path, trust: &TrustRoot) -> Result<Option<String>, BundleRefusal> {
    let (Some(manifest), Some(sig)) = (
        read_root_file(dir, MANIFEST_FILE)?,
        read_root_file(dir, SIGNATURE_FILE)?,
    ) else {
        return Ok(None);
    };
    let sig = Signature::from_file(&sig)?;
    let parsed = BundleManifest::parse(&manifest)?;
    parsed.check_dir(dir)?;
    Ok(Some(trust.verify(Purpose::Bundle, &manifest, &sig)?))
}

/// The check of an agent's directory before a run starts, under `settings`.
pub fn check(dir: &Path, settings: &BundleSettings) -> Result<Verdict, BundleRefusal> {
    if settings.policy == SignaturePolicy::Off {
        return Ok(Verdict::NotChecked);
    }
    match verify(dir, &settings.trust) {
        Ok(Some(key_id)) => Ok(Verdict::Verified { key_id }),
        Ok(None) if settings.policy == SignaturePolicy::Required => {
            Err(BundleRefusal::UnsignedRequired)
        }
        Ok(None) => Ok(Verdict::Unsigned),
        Err(e) if e.is_trust() && settings.policy == SignaturePolicy::Warn => {
            Ok(Verdict::Untrusted(e))
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests;
