//! Who is signed in: the session cookie, verified, and the API key it was
//! opened with, still live. One decision for the pages and their data.

use axum::http::HeaderMap;

use super::session::{self, Session};
use crate::auth::Tenant;
use crate::error::ApiError;
use crate::state::AppState;

/// A signed-in operator: the organization (as a [`Tenant`], what the `/v1`
/// handlers take) and the session.
#[derive(Debug, Clone)]
pub struct Operator {
    pub tenant: Tenant,
    pub session: Session,
}

/// Unix seconds now.
pub fn now_s() -> i64 {
    airlock_store::now_ms() / 1000
}

impl Operator {
    /// The operator of a request: `None` without a valid session, or when
    /// its key was revoked since; the key's rate limit applies as to
    /// `/v1`.
    pub async fn of(app: &AppState, headers: &HeaderMap) -> Result<Option<Operator>, ApiError> {
        let Some(value) = session::cookie(headers, session::COOKIE) else {
            return Ok(None);
        };
        let Some(s) = app.cfg().console.sessions.verify(value, now_s()) else {
            return Ok(None);
        };
        let Some(row) = app.store().get_api_key(&s.key_id).await? else {
            return Ok(None);
        };
        if row.revoked_at.is_some() {
            return Ok(None);
        }
        if let Err(wait) = app.limiter().check(&row.id) {
            let secs = wait
                .as_secs()
                .saturating_add(u64::from(wait.subsec_nanos() > 0));
            return Err(ApiError::too_many(secs));
        }
        Ok(Some(Operator {
            tenant: Tenant {
                org_id: row.org_id,
                key_id: row.id,
            },
            session: s,
        }))
    }
}
