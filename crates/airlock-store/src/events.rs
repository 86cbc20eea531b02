//! `run_events`: a run's event log (heartbeats, logs, results, costs, and
//! what the sidecar's journal recorded).
//!
//! Contracts: ids increase per database (readers page by id); a journalled
//! event is stored once per `(run_id, seq)` however often its journal is
//! read, and its usage is added to the run only then, in the same
//! transaction.
//!
//! Bounds: the retention sweep takes a run's events with the run
//! (`RETENTION_RUNS_DAYS`); their bytes count toward the organization's
//! stored-bytes quota (`ORG_MAX_STORED_BYTES`), which stops new runs.

use sqlx::Row as _;

use crate::audit::AUDIT_EVENT_KINDS;
use crate::thresholds::cross_run_in;
use crate::usage::add_run_usage;
use crate::{
    Event, JournalledEvent, NewEvent, Pool, Store, StoreError, multi_row_insert, returned_id,
};

/// Maps a `run_events` row (`id, run_id, at, kind, payload`) to [`Event`].
macro_rules! event_row {
    ($r:expr, $s:expr) => {
        Event {
            id: $r.try_get("id").map_err(|e| $s.err(e))?,
            run_id: $r.try_get("run_id").map_err(|e| $s.err(e))?,
            at: $r.try_get("at").map_err(|e| $s.err(e))?,
            kind: $r.try_get("kind").map_err(|e| $s.err(e))?,
            payload: $r.try_get("payload").map_err(|e| $s.err(e))?,
        }
    };
}

/// The `run_events` rows that `tail` (the `WHERE`, `ORDER BY` and `LIMIT`,
/// binding `$1`… in order) selects, as [`Event`]s.
macro_rules! select_events {
    ($s:expr, $tail:literal, $($bind:expr),+) => {
        on_pool!($s, p => {
            let rows = sqlx::query(concat!(
                "SELECT id, run_id, at, kind, payload FROM run_events ",
                $tail
            ))
            $(.bind($bind))+
            .fetch_all(p)
            .await
            .map_err(|e| $s.err(e))?;
            rows.iter().map(|r| Ok(event_row!(r, $s))).collect()
        })
    };
}

impl Store {
    /// Appends an event; returns its id (increasing per database).
    pub async fn append_event(&self, e: &NewEvent<'_>) -> Result<i64, StoreError> {
        let ids: Vec<i64> = on_pool!(self, p => sqlx::query_scalar(
            "INSERT INTO run_events (run_id, at, kind, payload) VALUES ($1, $2, $3, $4) \
             RETURNING id",
        )
        .bind(e.run_id)
        .bind(e.at)
        .bind(e.kind)
        .bind(e.payload)
        .fetch_all(p)
        .await
        .map_err(|err| self.run_fk(err, e.run_id)))?;
        returned_id(ids)
    }

    /// Appends events of one run and one kind, each its time and payload,
    /// in their order, in one transaction (all or none).
    pub async fn append_events(
        &self,
        run_id: &str,
        kind: &str,
        events: &[(i64, String)],
    ) -> Result<(), StoreError> {
        /// Rows in one statement (4 values each).
        const ROWS: usize = 100;
        if events.is_empty() {
            return Ok(());
        }
        let numbered = matches!(self.pool, Pool::Postgres(_));
        on_pool!(self, p => {
            let mut tx = p.begin().await.map_err(|e| self.err(e))?;
            for chunk in events.chunks(ROWS) {
                let sql = multi_row_insert(
                    "INSERT INTO run_events (run_id, at, kind, payload) VALUES ",
                    4,
                    chunk.len(),
                    numbered,
                    "",
                );
                let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
                for (at, payload) in chunk {
                    q = q.bind(run_id).bind(*at).bind(kind).bind(payload.as_str());
                }
                q.execute(&mut *tx)
                    .await
                    .map_err(|err| self.run_fk(err, run_id))?;
            }
            tx.commit().await.map_err(|e| self.err(e))?;
        });
        Ok(())
    }

    /// Stores a run's journalled events in one transaction: an event whose
    /// `(run_id, seq)` is stored already is skipped, and so is its usage
    /// (reading a journal again stores nothing twice). Returns how many
    /// were new.
    pub async fn append_journal_events(
        &self,
        run_id: &str,
        events: &[JournalledEvent],
    ) -> Result<usize, StoreError> {
        /// Rows in one statement of events without usage (5 values each).
        const ROWS: usize = 100;
        if events.is_empty() {
            return Ok(0);
        }
        let numbered = matches!(self.pool, Pool::Postgres(_));
        let insert_sql = |rows: usize, returning: bool| {
            multi_row_insert(
                "INSERT INTO run_events (run_id, at, kind, payload, seq) VALUES ",
                5,
                rows,
                numbered,
                if returning {
                    " ON CONFLICT (run_id, seq) DO NOTHING RETURNING id"
                } else {
                    " ON CONFLICT (run_id, seq) DO NOTHING"
                },
            )
        };
        let mut new = 0usize;
        on_pool!(self, p => {
            let mut tx = p.begin().await.map_err(|e| self.err(e))?;
            let mut usage_added = false;
            let mut rest = events;
            while let Some(head) = rest.first() {
                if let Some(u) = &head.usage {
                    let sql = insert_sql(1, true);
                    let ids: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                        .bind(run_id)
                        .bind(head.at)
                        .bind(head.kind.as_str())
                        .bind(head.payload.as_str())
                        .bind(head.seq)
                        .fetch_all(&mut *tx)
                        .await
                        .map_err(|err| self.run_fk(err, run_id))?;
                    if !ids.is_empty() {
                        new += 1;
                        usage_added = true;
                        add_run_usage!(run_id, u)
                        .execute(&mut *tx)
                        .await
                        .map_err(|e| self.err(e))?;
                    }
                    rest = &rest[1..];
                    continue;
                }
                let plain = rest
                    .iter()
                    .take(ROWS)
                    .take_while(|e| e.usage.is_none())
                    .count();
                let (chunk, tail) = rest.split_at(plain);
                rest = tail;
                let sql = insert_sql(chunk.len(), false);
                let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
                for e in chunk {
                    q = q
                        .bind(run_id)
                        .bind(e.at)
                        .bind(e.kind.as_str())
                        .bind(e.payload.as_str())
                        .bind(e.seq);
                }
                let done = q
                    .execute(&mut *tx)
                    .await
                    .map_err(|err| self.run_fk(err, run_id))?;
                new += usize::try_from(done.rows_affected()).unwrap_or(usize::MAX);
            }
            if usage_added {
                cross_run_in!(self, tx, run_id).await?;
            }
            tx.commit().await.map_err(|e| self.err(e))?;
        });
        Ok(new)
    }

    /// A run's events of `kind`, oldest first, at most `limit`.
    pub async fn events_of_kind(
        &self,
        run_id: &str,
        kind: &str,
        limit: u32,
    ) -> Result<Vec<Event>, StoreError> {
        select_events!(
            self,
            "WHERE run_id = $1 AND kind = $2 ORDER BY id LIMIT $3",
            run_id,
            kind,
            i64::from(limit)
        )
    }

    /// A run's events with id greater than `after`, oldest first, at most `limit`.
    pub async fn list_events(
        &self,
        run_id: &str,
        after: i64,
        limit: u32,
    ) -> Result<Vec<Event>, StoreError> {
        select_events!(
            self,
            "WHERE run_id = $1 AND id > $2 ORDER BY id LIMIT $3",
            run_id,
            after,
            i64::from(limit)
        )
    }

    /// A run's events of the audit's kinds ([`AUDIT_EVENT_KINDS`]) with id
    /// greater than `after`, oldest first, at most `limit`.
    pub async fn audit_events_after(
        &self,
        run_id: &str,
        after: i64,
        limit: u32,
    ) -> Result<Vec<Event>, StoreError> {
        let [a, b, c, d, e] = AUDIT_EVENT_KINDS;
        select_events!(
            self,
            "WHERE run_id = $1 AND id > $2 AND kind IN ($3, $4, $5, $6, $7) ORDER BY id LIMIT $8",
            run_id,
            after,
            a,
            b,
            c,
            d,
            e,
            i64::from(limit)
        )
    }

    /// A run's latest event of `kind` (e.g. `result`), if any.
    pub async fn last_event_of_kind(
        &self,
        run_id: &str,
        kind: &str,
    ) -> Result<Option<Event>, StoreError> {
        on_pool!(self, p => {
            let row = sqlx::query(
                "SELECT id, run_id, at, kind, payload FROM run_events \
                 WHERE run_id = $1 AND kind = $2 ORDER BY id DESC LIMIT 1",
            )
            .bind(run_id)
            .bind(kind)
            .fetch_optional(p)
            .await
            .map_err(|e| self.err(e))?;
            row.map(|r| {
                Ok(event_row!(r, self))
            })
            .transpose()
        })
    }
}
