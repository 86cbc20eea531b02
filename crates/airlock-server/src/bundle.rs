//! What an agent's bundle (`POST /v1/agents`'s files) may hold: checked when
//! it is registered, and again when a run writes it out for its sandbox.

use crate::error::ApiError;

/// At most this many files in a bundle.
pub const MAX_FILES: usize = 256;
/// At most this many bytes of file content in a bundle.
pub const MAX_BUNDLE_BYTES: usize = 4 << 20;

/// A bundle path: relative, `/`-separated, no `.`/`..`/empty segment, no
/// control characters, at most 200 bytes.
pub fn check_path(p: &str) -> Result<(), ApiError> {
    let bad = |why: &str| Err(ApiError::invalid(format!("file path {p:?}: {why}")));
    if p.is_empty() || p.len() > 200 {
        return bad("must be 1-200 bytes");
    }
    if p.starts_with('/') || p.contains('\\') {
        return bad("must be relative, with / between segments");
    }
    if p.chars().any(char::is_control) {
        return bad("has a control character");
    }
    if p.split('/').any(|s| s.is_empty() || s == "." || s == "..") {
        return bad("has an empty, . or .. segment");
    }
    Ok(())
}
