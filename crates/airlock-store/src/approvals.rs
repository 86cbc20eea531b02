//! `approvals`: the requests a run's sidecar held under an `ask` rule
//! (docs/egress.md, "Human approval"), each waiting for a person's answer.
//!
//! Contracts: an approval leaves `pending` once, by one conditional write
//! ([`Store::settle_approval`]): of two answers (two replicas, two people)
//! only one lands, and an answer after the hold expired or its run ended
//! finds it settled. What is stored describes the request (method, host,
//! path, integration, rule), never a credential, a header, a query or a
//! body.
//!
//! Bounds: at most [`MAX_APPROVALS_PER_RUN`] rows per run, exactly, even
//! when many are asked for at once (the sidecar holds at most 8 at once; a
//! run asking more often is refused, [`StoreError::ApprovalsExhausted`]);
//! removed with its run.

use crate::approval_hooks::{APPROVAL_PENDING_EVENT, APPROVAL_SETTLED_EVENT, queue_owed};
use crate::{Store, StoreError, now_ms};

/// Most approvals one run may ask for.
pub const MAX_APPROVALS_PER_RUN: i64 = 1000;

/// Most running runs [`Store::pending_approval_counts`] reports on.
pub const MAX_PENDING_COUNTS: i64 = 10_000;

/// Where an approval stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ApprovalState {
    Pending,
    AllowedOnce,
    AllowedRun,
    Denied,
    /// No answer within the hold's time.
    Expired,
    /// Its run ended while it was pending.
    Dropped,
}

impl ApprovalState {
    pub const ALL: [ApprovalState; 6] = [
        ApprovalState::Pending,
        ApprovalState::AllowedOnce,
        ApprovalState::AllowedRun,
        ApprovalState::Denied,
        ApprovalState::Expired,
        ApprovalState::Dropped,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalState::Pending => "pending",
            ApprovalState::AllowedOnce => "allowed_once",
            ApprovalState::AllowedRun => "allowed_run",
            ApprovalState::Denied => "denied",
            ApprovalState::Expired => "expired",
            ApprovalState::Dropped => "dropped",
        }
    }

    fn parse(s: &str) -> Option<ApprovalState> {
        ApprovalState::ALL.into_iter().find(|a| a.as_str() == s)
    }
}

/// A held request to store as pending.
#[derive(Debug, Clone)]
pub struct NewApproval<'a> {
    pub id: &'a str,
    pub run_id: &'a str,
    pub org_id: &'a str,
    pub method: &'a str,
    pub host: &'a str,
    pub path: &'a str,
    pub integration: Option<&'a str>,
    pub rule: &'a str,
    /// Unix ms after which no answer expires it.
    pub expires_at: i64,
}

/// One stored approval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalRow {
    pub id: String,
    pub run_id: String,
    pub org_id: String,
    pub state: ApprovalState,
    pub method: String,
    pub host: String,
    pub path: String,
    pub integration: Option<String>,
    pub rule: String,
    /// Who answered (an API key's id), when someone did.
    pub answered_by: Option<String>,
    pub created_at: i64,
    pub expires_at: i64,
    /// When it left `pending`.
    pub settled_at: Option<i64>,
}

/// The columns an [`ApprovalRow`] is read from.
macro_rules! columns {
    () => {
        "id, run_id, org_id, state, method, host, path, integration, rule, \
         answered_by, created_at, expires_at, settled_at"
    };
}

fn row_of<R: sqlx::Row>(r: &R) -> Result<ApprovalRow, sqlx::Error>
where
    for<'c> &'c str: sqlx::ColumnIndex<R>,
    for<'d> String: sqlx::Decode<'d, R::Database> + sqlx::Type<R::Database>,
    for<'d> Option<String>: sqlx::Decode<'d, R::Database> + sqlx::Type<R::Database>,
    for<'d> i64: sqlx::Decode<'d, R::Database> + sqlx::Type<R::Database>,
    for<'d> Option<i64>: sqlx::Decode<'d, R::Database> + sqlx::Type<R::Database>,
{
    let state: String = r.try_get("state")?;
    Ok(ApprovalRow {
        id: r.try_get("id")?,
        run_id: r.try_get("run_id")?,
        org_id: r.try_get("org_id")?,
        state: ApprovalState::parse(&state).ok_or_else(|| sqlx::Error::ColumnDecode {
            index: "state".into(),
            source: format!("{state:?} is no approval state").into(),
        })?,
        method: r.try_get("method")?,
        host: r.try_get("host")?,
        path: r.try_get("path")?,
        integration: r.try_get("integration")?,
        rule: r.try_get("rule")?,
        answered_by: r.try_get("answered_by")?,
        created_at: r.try_get("created_at")?,
        expires_at: r.try_get("expires_at")?,
        settled_at: r.try_get("settled_at")?,
    })
}

impl Store {
    /// Stores a pending approval, or [`StoreError::ApprovalsExhausted`]
    /// (nothing written) when its run already asked for
    /// [`MAX_APPROVALS_PER_RUN`]. The count and the insert are one
    /// statement (SQLite takes its write lock before the count: no read
    /// transaction to upgrade, which SQLite refuses under a concurrent
    /// writer), inside a transaction that on PostgreSQL holds the run's
    /// advisory lock, so that two inserts at once cannot both count one
    /// below the bound: the bound is exact on both backends.
    ///
    /// With `announce` (the run's `approval.pending` event), the event is
    /// appended to the run's events and the deliveries the hold owes its
    /// organization's webhooks are queued (at the event's time), in the same
    /// transaction: a crash cannot store the hold and lose its
    /// announcement, and a hold refused stores neither.
    pub async fn insert_approval(
        &self,
        a: &NewApproval<'_>,
        announce: Option<&crate::NewEvent<'_>>,
    ) -> Result<(), StoreError> {
        let owed = match announce {
            Some(_) => Some(
                self.owed_approval_deliveries(a.org_id, a.id, APPROVAL_PENDING_EVENT)
                    .await?,
            ),
            None => None,
        };
        let res = on_pool!(self, p => {
            async {
                let mut tx = locked_tx!(self, p, format!("approvals:{}", a.run_id)).await?;
                let n = sqlx::query(
                    "INSERT INTO approvals (id, run_id, org_id, state, method, host, path, \
                     integration, rule, created_at, expires_at) \
                     SELECT $1, $2, $3, 'pending', $4, $5, $6, $7, $8, $9, $10 \
                     WHERE (SELECT COUNT(*) FROM approvals WHERE run_id = $2) < $11",
                )
                .bind(a.id)
                .bind(a.run_id)
                .bind(a.org_id)
                .bind(a.method)
                .bind(a.host)
                .bind(a.path)
                .bind(a.integration)
                .bind(a.rule)
                .bind(now_ms())
                .bind(a.expires_at)
                .bind(MAX_APPROVALS_PER_RUN)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                if let (true, Some(owed), Some(event)) = (n > 0, &owed, announce) {
                    sqlx::query(
                        "INSERT INTO run_events (run_id, at, kind, payload) VALUES ($1, $2, $3, $4)",
                    )
                    .bind(event.run_id)
                    .bind(event.at)
                    .bind(event.kind)
                    .bind(event.payload)
                    .execute(&mut *tx)
                    .await?;
                    queue_owed!(tx, owed, a.org_id, a.run_id, event.at);
                }
                tx.commit().await?;
                Ok::<u64, sqlx::Error>(n)
            }
            .await
        });
        match res.map_err(|e| self.run_fk(e, a.run_id))? {
            0 => Err(StoreError::ApprovalsExhausted {
                run_id: a.run_id.to_owned(),
                limit: MAX_APPROVALS_PER_RUN,
            }),
            _ => Ok(()),
        }
    }

    /// One approval of `run_id`, only for its organization `org_id`.
    pub async fn get_approval(
        &self,
        org_id: &str,
        run_id: &str,
        id: &str,
    ) -> Result<Option<ApprovalRow>, StoreError> {
        on_pool!(self, p => {
            let row = sqlx::query(concat!(
                "SELECT ",
                columns!(),
                " FROM approvals WHERE org_id = $1 AND run_id = $2 AND id = $3"
            ))
            .bind(org_id)
            .bind(run_id)
            .bind(id)
            .fetch_optional(p)
            .await
            .map_err(|e| self.err(e))?;
            row.map(|r| row_of(&r)).transpose().map_err(|e| self.err(e))
        })
    }

    /// A run's approvals, oldest first (at most [`MAX_APPROVALS_PER_RUN`]).
    pub async fn list_approvals(
        &self,
        org_id: &str,
        run_id: &str,
    ) -> Result<Vec<ApprovalRow>, StoreError> {
        on_pool!(self, p => {
            let rows = sqlx::query(concat!(
                "SELECT ",
                columns!(),
                " FROM approvals WHERE org_id = $1 AND run_id = $2 ORDER BY created_at, id LIMIT $3"
            ))
            .bind(org_id)
            .bind(run_id)
            .bind(MAX_APPROVALS_PER_RUN)
            .fetch_all(p)
            .await
            .map_err(|e| self.err(e))?;
            rows.iter().map(row_of).collect::<Result<_, _>>().map_err(|e| self.err(e))
        })
    }

    /// Moves a pending approval to `state` (answered by `by`, if a person
    /// did); `false` when it was no longer pending.
    ///
    /// With `announce` (its organization, run and time), the
    /// `approval.settled` deliveries it owes are queued in the same
    /// transaction as the settlement.
    pub async fn settle_approval(
        &self,
        id: &str,
        state: ApprovalState,
        by: Option<&str>,
        announce: Option<(&str, &str, i64)>,
    ) -> Result<bool, StoreError> {
        let owed = match announce {
            Some((org_id, _, _)) => Some(
                self.owed_approval_deliveries(org_id, id, APPROVAL_SETTLED_EVENT)
                    .await?,
            ),
            None => None,
        };
        let res = on_pool!(self, p => {
            async {
                let mut tx = p.begin().await?;
                let done = sqlx::query(
                    "UPDATE approvals SET state = $1, answered_by = $2, settled_at = $3 \
                     WHERE id = $4 AND state = 'pending'",
                )
                .bind(state.as_str())
                .bind(by)
                .bind(now_ms())
                .bind(id)
                .execute(&mut *tx)
                .await?
                .rows_affected()
                    == 1;
                if let (true, Some(owed), Some((org_id, run_id, at))) = (done, &owed, announce) {
                    queue_owed!(tx, owed, org_id, run_id, at);
                }
                tx.commit().await?;
                Ok::<bool, sqlx::Error>(done)
            }
            .await
        });
        res.map_err(|e| self.err(e))
    }

    /// A run's approvals still pending (at most [`MAX_APPROVALS_PER_RUN`]).
    pub async fn list_pending_approvals(
        &self,
        run_id: &str,
    ) -> Result<Vec<ApprovalRow>, StoreError> {
        on_pool!(self, p => {
            let rows = sqlx::query(concat!(
                "SELECT ",
                columns!(),
                " FROM approvals WHERE run_id = $1 AND state = 'pending' ORDER BY created_at, id LIMIT $2"
            ))
            .bind(run_id)
            .bind(MAX_APPROVALS_PER_RUN)
            .fetch_all(p)
            .await
            .map_err(|e| self.err(e))?;
            rows.iter().map(row_of).collect::<Result<_, _>>().map_err(|e| self.err(e))
        })
    }

    /// How many requests each running run of `org_id` holds for a
    /// person's answer: runs with none are left out. Read through the
    /// running runs (bounded by the platform's concurrency), at most
    /// [`MAX_PENDING_COUNTS`] of them.
    pub async fn pending_approval_counts(
        &self,
        org_id: &str,
    ) -> Result<std::collections::HashMap<String, i64>, StoreError> {
        on_pool!(self, p => {
            let rows: Vec<(String, i64)> = sqlx::query_as(
                "SELECT r.id, COUNT(a.id) FROM runs r \
                 JOIN approvals a ON a.run_id = r.id AND a.state = 'pending' \
                 WHERE r.status = 'running' AND r.org_id = $1 GROUP BY r.id LIMIT $2",
            )
            .bind(org_id)
            .bind(MAX_PENDING_COUNTS)
            .fetch_all(p)
            .await
            .map_err(|e| self.err(e))?;
            Ok(rows.into_iter().collect())
        })
    }

    /// The state of approval `id` (`None`: no such approval).
    pub async fn approval_state(&self, id: &str) -> Result<Option<ApprovalRow>, StoreError> {
        on_pool!(self, p => {
            let row = sqlx::query(concat!("SELECT ", columns!(), " FROM approvals WHERE id = $1"))
                .bind(id)
                .fetch_optional(p)
                .await
                .map_err(|e| self.err(e))?;
            row.map(|r| row_of(&r)).transpose().map_err(|e| self.err(e))
        })
    }
}
