//! What an agent's bundle (`POST /v1/agents`'s files) may hold: checked when
//! it is registered, and again when a run writes it out for its sandbox.
//! A run's input files are checked by the same path rule.

use crate::error::ApiError;

/// At most this many files in a bundle.
pub const MAX_FILES: usize = 256;
/// At most this many bytes of file content in a bundle.
pub const MAX_BUNDLE_BYTES: usize = 4 << 20;

/// A bundle or input path: [`airlock_platform_api::files::check_relative_path`]
/// (relative, `/`-separated, no `.`/`..`/empty segment, no control
/// characters, at most 200 bytes), refused as a 422 naming it.
pub fn check_path(p: &str) -> Result<(), ApiError> {
    airlock_platform_api::files::check_relative_path(p)
        .map_err(|why| ApiError::invalid(format!("file path {p:?}: {why}")))
}
