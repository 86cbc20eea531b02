//! `artifacts`: the files a run's agent left in its output directory, each
//! stored with the run or recorded refused with the reason; and the run's
//! input files (`runs.inputs`).
//!
//! Contract: an artifact is recorded once per run and path. Whether it is
//! stored is decided inside the write, in one transaction: the run holds
//! fewer than [`MAX_RUN_ARTIFACTS`] records (else nothing is written:
//! [`StoreError::QuotaExceeded`]), its stored bytes stay within the run's
//! cap and its organization's within the organization's (else the record
//! is written refused, without its body). On PostgreSQL an organization's
//! artifact writes are serialised by an advisory lock for the transaction.
//!
//! Bounds: per run [`MAX_RUN_ARTIFACTS`] records and the run's cap of
//! bytes; per organization its cap; everything goes with its run (ON
//! DELETE CASCADE, retention).

use airlock_platform_api::files::{ArtifactRefusal, MAX_RUN_ARTIFACTS};
use sqlx::Row as _;

use crate::{Pool, Store, StoreError, now_ms};

/// What may be stored, in bytes of artifact bodies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArtifactCaps {
    /// Of one run (`RUN_MAX_ARTIFACT_BYTES`).
    pub run_bytes: u64,
    /// Of one organization's runs together (`ORG_MAX_ARTIFACT_BYTES`; `None`: no cap).
    pub org_bytes: Option<u64>,
}

/// What the runtime hands over for one path.
#[derive(Debug, Clone, Copy)]
pub enum ArtifactBody<'a> {
    /// The file's bytes.
    File(&'a [u8]),
    /// The runtime did not read it, for this reason; `bytes` as it saw them.
    Refused { why: ArtifactRefusal, bytes: u64 },
}

/// One recorded artifact (without its body).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArtifactRow {
    pub run_id: String,
    pub path: String,
    pub bytes: u64,
    /// Why it was not stored; `None`: stored, downloadable.
    pub refused: Option<ArtifactRefusal>,
    pub created_at: i64,
}

/// An [`ArtifactRow`] of a row of `path, bytes, refused, created_at`
/// (either backend's row type).
macro_rules! artifact_row {
    ($self:expr, $run_id:expr, $r:expr) => {{
        let r = $r;
        let refused: Option<String> = r.try_get("refused").map_err(|e| $self.err(e))?;
        let refused = refused
            .map(|s| {
                s.parse::<ArtifactRefusal>()
                    .map_err(|_| StoreError::Unspelled {
                        column: "artifacts.refused",
                        value: Some(s),
                    })
            })
            .transpose()?;
        let bytes: i64 = r.try_get("bytes").map_err(|e| $self.err(e))?;
        Ok::<ArtifactRow, StoreError>(ArtifactRow {
            run_id: $run_id.to_owned(),
            path: r.try_get("path").map_err(|e| $self.err(e))?,
            bytes: u64::try_from(bytes).unwrap_or(0),
            refused,
            created_at: r.try_get("created_at").map_err(|e| $self.err(e))?,
        })
    }};
}

fn i64_of(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Store {
    /// Records `path` of `run_id` as [`ArtifactBody`] says, stored only
    /// within `caps`; answers what was recorded (`Some(why)`: refused).
    pub async fn put_artifact(
        &self,
        run_id: &str,
        path: &str,
        body: ArtifactBody<'_>,
        caps: ArtifactCaps,
    ) -> Result<Option<ArtifactRefusal>, StoreError> {
        let (mut refused, bytes, data) = match body {
            ArtifactBody::File(b) => (None, b.len() as u64, Some(b)),
            ArtifactBody::Refused { why, bytes } => (Some(why), bytes, None),
        };
        // SQLite: the write lock is taken before the sums are read (a
        // deferred transaction could not upgrade under a concurrent writer).
        let begin = match self.pool {
            Pool::Sqlite(_) => "BEGIN IMMEDIATE",
            Pool::Postgres(_) => "BEGIN",
        };
        on_pool!(self, p => {
            let mut tx = p.begin_with(begin).await.map_err(|e| self.err(e))?;
            let org: Option<String> = sqlx::query_scalar("SELECT org_id FROM runs WHERE id = $1")
                .bind(run_id)
                .fetch_optional(&mut *tx)
                .await
                .map_err(|e| self.err(e))?;
            let Some(org) = org else {
                return Err(StoreError::RunNotFound(run_id.to_owned()));
            };
            if matches!(self.pool, Pool::Postgres(_)) {
                sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
                    .bind(format!("artifacts:{org}"))
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| self.err(e))?;
            }
            let r = sqlx::query(
                "SELECT COUNT(*) AS n, CAST(COALESCE(SUM(CASE WHEN body IS NULL THEN 0 ELSE bytes END), 0) AS BIGINT) AS b \
                 FROM artifacts WHERE run_id = $1",
            )
            .bind(run_id)
            .fetch_one(&mut *tx)
            .await
            .map_err(|e| self.err(e))?;
            let n: i64 = r.try_get("n").map_err(|e| self.err(e))?;
            let run_used: i64 = r.try_get("b").map_err(|e| self.err(e))?;
            if usize::try_from(n).unwrap_or(usize::MAX) >= MAX_RUN_ARTIFACTS {
                return Err(StoreError::QuotaExceeded {
                    what: "artifacts of one run",
                    limit: MAX_RUN_ARTIFACTS as u64,
                });
            }
            if refused.is_none() && run_used.saturating_add(i64_of(bytes)) > i64_of(caps.run_bytes) {
                refused = Some(ArtifactRefusal::RunQuota);
            }
            if refused.is_none() && let Some(cap) = caps.org_bytes {
                let org_used: i64 = sqlx::query_scalar(
                    "SELECT CAST(COALESCE(SUM(bytes), 0) AS BIGINT) FROM artifacts \
                     WHERE org_id = $1 AND body IS NOT NULL",
                )
                .bind(&org)
                .fetch_one(&mut *tx)
                .await
                .map_err(|e| self.err(e))?;
                if org_used.saturating_add(i64_of(bytes)) > i64_of(cap) {
                    refused = Some(ArtifactRefusal::OrgQuota);
                }
            }
            let body = if refused.is_some() { None } else { data };
            let res = sqlx::query(
                "INSERT INTO artifacts (run_id, org_id, path, bytes, body, refused, created_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7)",
            )
            .bind(run_id)
            .bind(&org)
            .bind(path)
            .bind(i64_of(bytes))
            .bind(body)
            .bind(refused.map(ArtifactRefusal::as_str))
            .bind(now_ms())
            .execute(&mut *tx)
            .await;
            match res {
                Err(e) if crate::is_unique_violation(&e) => {
                    return Err(StoreError::ArtifactExists {
                        run_id: run_id.to_owned(),
                        path: path.to_owned(),
                    });
                }
                other => other.map_err(|e| self.err(e))?,
            };
            tx.commit().await.map_err(|e| self.err(e))?;
        });
        Ok(refused)
    }

    /// The artifacts recorded for `run_id`, by path.
    pub async fn list_artifacts(&self, run_id: &str) -> Result<Vec<ArtifactRow>, StoreError> {
        on_pool!(self, p => {
            let rows = sqlx::query(
                "SELECT path, bytes, refused, created_at FROM artifacts WHERE run_id = $1 ORDER BY path",
            )
            .bind(run_id)
            .fetch_all(p)
            .await
            .map_err(|e| self.err(e))?;
            rows.iter().map(|r| artifact_row!(self, run_id, r)).collect()
        })
    }

    /// A stored artifact's row and body (`None`: no such artifact, or it
    /// was refused and has none).
    pub async fn get_artifact(
        &self,
        run_id: &str,
        path: &str,
    ) -> Result<Option<(ArtifactRow, Vec<u8>)>, StoreError> {
        on_pool!(self, p => {
            let row = sqlx::query(
                "SELECT path, bytes, refused, created_at, body FROM artifacts \
                 WHERE run_id = $1 AND path = $2 AND body IS NOT NULL",
            )
            .bind(run_id)
            .bind(path)
            .fetch_optional(p)
            .await
            .map_err(|e| self.err(e))?;
            row.map(|r| {
                let body: Vec<u8> = r.try_get("body").map_err(|e| self.err(e))?;
                Ok((artifact_row!(self, run_id, &r)?, body))
            })
            .transpose()
        })
    }

    /// The input files a run was created with (JSON of path → text).
    pub async fn run_inputs(&self, run_id: &str) -> Result<Option<String>, StoreError> {
        on_pool!(self, p => {
            let v: Option<Option<String>> = sqlx::query_scalar("SELECT inputs FROM runs WHERE id = $1")
                .bind(run_id)
                .fetch_optional(p)
                .await
                .map_err(|e| self.err(e))?;
            Ok(v.flatten())
        })
    }
}
