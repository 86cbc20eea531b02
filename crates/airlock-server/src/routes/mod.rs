//! The `/v1` API's handlers. Each takes the caller's [`crate::auth::Tenant`] and
//! reaches only rows of the tenant's organization: an id from another
//! organization is a 404, exactly as an id that does not exist. Each reads
//! and answers the types of [`airlock_api::v1`], and declares in its
//! `#[utoipa::path]` every status it can answer (the OpenAPI document is
//! derived from them).

pub mod agents;
pub mod approvals;
pub mod artifacts;
pub mod audit;
pub mod budget;
pub mod connections;
pub mod health;
pub mod identity;
pub mod keys;
pub mod org_proxy;
pub mod policy;
pub mod runs;
pub mod webhooks;

use crate::error::ApiError;

/// `?limit=` for lists: 1–100, default 50.
pub fn page_limit(l: Option<u32>) -> Result<u32, ApiError> {
    match l {
        None => Ok(50),
        Some(n @ 1..=100) => Ok(n),
        Some(n) => Err(ApiError::bad_request(format!(
            "limit {n} is out of range (1-100)"
        ))),
    }
}

/// A name of something a tenant owns (agent, connection, API key name):
/// 1–64 characters of `A-Z a-z 0-9 _ - .`, starting with a letter or digit.
pub fn check_name(what: &str, v: &str) -> Result<(), ApiError> {
    let ok = !v.is_empty()
        && v.len() <= 64
        && v.as_bytes()[0].is_ascii_alphanumeric()
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(format!(
            "{what} {v:?} must be 1-64 characters of A-Z a-z 0-9 _ - . starting with a letter or digit"
        )))
    }
}

/// The `cursor` of a paged list's query, checked: `400` for any text the
/// API did not give.
pub fn page_cursor(
    cursor: Option<&str>,
) -> Result<Option<airlock_platform_api::types::PageCursor>, ApiError> {
    cursor
        .map(|c| c.parse().map_err(|e| ApiError::bad_request(format!("{e}"))))
        .transpose()
}

/// A page's `next_cursor`: its last row's, when the page is full (there may
/// be more); `None` when it is the last.
pub fn next_cursor<T>(page: &[T], limit: u32, key: impl Fn(&T) -> (i64, &str)) -> Option<String> {
    if page.len() < limit as usize {
        return None;
    }
    page.last().map(|r| {
        let (at, id) = key(r);
        airlock_platform_api::types::PageCursor::after(at, id).to_string()
    })
}
