//! `egress_log`: every outbound request a run's sidecar decided on, and
//! what became of it.
//!
//! Contracts: a record with a `seq` is an upsert on `(run_id, seq)`: a
//! completion replaces a start and a repeated start never undoes a
//! completion, in a single write as in a batch. A batch is cut into
//! statements of [`EGRESS_BATCH_ROWS`] rows only, so their texts are
//! prepared once per connection.
//!
//! Bounds: the retention sweep (`RETENTION_EGRESS_DAYS`, and with the run);
//! their bytes count toward the organization's stored-bytes quota
//! (`ORG_MAX_STORED_BYTES`).

use sqlx::Row as _;

use crate::{
    EgressEntry, EgressMetering, EgressOutcome, NewEgress, Pool, RefusalCode, Store, StoreError,
    multi_row_insert,
};

/// The egress log's columns, in the order [`bind_egress!`] binds them.
macro_rules! egress_columns {
    () => {
        "(run_id, at, source, integration, method, url, host, decision, \
         reason, status, duration_ms, bytes_out, bytes_in, seq, outcome, metering, plane, rule)"
    };
}

/// How a record meets the row its `(run_id, seq)` already has: a
/// completion replaces a start, a repeated start never undoes a completion.
macro_rules! egress_upsert {
    () => {
        " ON CONFLICT (run_id, seq) DO UPDATE SET source = excluded.source, \
         integration = excluded.integration, method = excluded.method, url = excluded.url, \
         host = excluded.host, decision = excluded.decision, reason = excluded.reason, \
         status = excluded.status, duration_ms = excluded.duration_ms, \
         bytes_out = excluded.bytes_out, bytes_in = excluded.bytes_in, \
         outcome = excluded.outcome, metering = excluded.metering, plane = excluded.plane, rule = excluded.rule \
         WHERE excluded.outcome IS NULL OR excluded.outcome <> 'incomplete'"
    };
}

/// Binds one [`NewEgress`] to a query, in [`egress_columns!`]'s order.
macro_rules! bind_egress {
    ($q:expr, $e:expr) => {
        $q.bind($e.run_id)
            .bind($e.at)
            .bind($e.source.as_str())
            .bind($e.integration)
            .bind($e.method)
            .bind($e.url)
            .bind($e.host)
            .bind($e.decision.as_str())
            .bind($e.reason.map(RefusalCode::as_str))
            .bind($e.status)
            .bind($e.duration_ms)
            .bind($e.bytes_out)
            .bind($e.bytes_in)
            .bind($e.seq)
            .bind($e.outcome.map(EgressOutcome::as_str))
            .bind($e.metering.map(EgressMetering::as_str))
            .bind($e.plane.as_str())
            .bind($e.rule)
    };
}

/// The row counts of the multi-row egress insert. A batch is cut into
/// statements of these sizes only, largest first, so each statement's text
/// is one of a few, prepared once per connection and then reused (a
/// statement of any other length would be parsed anew every time).
pub const EGRESS_BATCH_ROWS: [usize; 4] = [64, 16, 4, 1];

/// The statement that inserts the first rows of a batch of `len` records,
/// and how many rows it takes. SQLite's parameters are anonymous (`?`): it
/// finds a numbered one's index by a walk of its list of names, so a
/// statement of a thousand `$N` cost a million string comparisons to bind.
fn egress_insert(pool: &Pool, len: usize) -> (&'static str, usize) {
    type Texts = std::sync::OnceLock<[String; EGRESS_BATCH_ROWS.len()]>;
    static SQLITE: Texts = std::sync::OnceLock::new();
    static POSTGRES: Texts = std::sync::OnceLock::new();
    let numbered = matches!(pool, Pool::Postgres(_));
    let texts = if numbered { &POSTGRES } else { &SQLITE }
        .get_or_init(|| EGRESS_BATCH_ROWS.map(|rows| egress_insert_sql(rows, numbered)));
    // The largest that fits (the last, one row, always does).
    let at = EGRESS_BATCH_ROWS
        .iter()
        .position(|rows| *rows <= len)
        .unwrap_or(EGRESS_BATCH_ROWS.len() - 1);
    (&texts[at], EGRESS_BATCH_ROWS[at])
}

fn egress_insert_sql(rows: usize, numbered: bool) -> String {
    multi_row_insert(
        concat!("INSERT INTO egress_log ", egress_columns!(), " VALUES "),
        18,
        rows,
        numbered,
        egress_upsert!(),
    )
}

/// How [`Store::append_egress_batch`] writes a batch: what it holds the
/// database's write lock across.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchWrite {
    /// One transaction: stored whole or not at all, and one commit (the
    /// pages the rows touch, the table's last and the indexes', go to the
    /// WAL once per batch). The write lock is held from the first
    /// statement to the commit, across the caller's own work between them.
    Whole,
    /// Each statement its own transaction: the write lock is held only
    /// while the database runs one statement, never while the caller
    /// prepares the next. For a caller that may wait long for a CPU (any
    /// caller on a saturated host, a background one most): holding the
    /// lock across that wait held every other writer (measured with both
    /// CPUs saturated: other writes waited up to 0.4–2.6 s behind batches
    /// of 2000 records written whole by a thread at nice 19, up to 0.15 s
    /// written by statement). A failed batch may be stored in part: for
    /// records that can be written again (an egress journal's, which
    /// complete by `seq`).
    ByStatement,
}

impl Store {
    /// Appends one outbound request to its run's log, or, when `e.seq` names
    /// a request already logged, completes it (see [`NewEgress`]). Returns
    /// the row id.
    pub async fn append_egress(&self, e: &NewEgress<'_>) -> Result<i64, StoreError> {
        let inserted: Option<i64> = on_pool!(self, p => bind_egress!(sqlx::query_scalar(
            concat!(
                "INSERT INTO egress_log ",
                egress_columns!(),
                " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)",
                egress_upsert!(),
                " RETURNING id"
            ),
        ), e)
        .fetch_all(p)
        .await
        .map_err(|err| self.run_fk(err, e.run_id)))?
        .into_iter()
        .next();
        if let Some(id) = inserted {
            return Ok(id);
        }
        // A repeated start of a request already completed: nothing changed.
        on_pool!(self, p => sqlx::query_scalar(
            "SELECT id FROM egress_log WHERE run_id = $1 AND seq = $2",
        )
        .bind(e.run_id)
        .bind(e.seq)
        .fetch_one(p)
        .await
        .map_err(|err| self.err(err)))
    }

    /// [`Store::append_egress`] for many records at once, in a few
    /// statements of [`EGRESS_BATCH_ROWS`] rows each, written as `write`
    /// says. A batch naming one `(run_id, seq)` twice keeps its last record
    /// (a start never replaces a completion).
    pub async fn append_egress_batch(
        &self,
        records: &[NewEgress<'_>],
        write: BatchWrite,
    ) -> Result<(), StoreError> {
        let unique = last_per_seq(records);
        if unique.is_empty() {
            return Ok(());
        }
        on_pool!(self, p => {
            let mut tx = match write {
                BatchWrite::Whole => Some(p.begin().await.map_err(|e| self.err(e))?),
                BatchWrite::ByStatement => None,
            };
            let mut rest = unique.as_slice();
            while let Some(head) = rest.first() {
                let run_id = head.run_id;
                let (sql, rows) = egress_insert(&self.pool, rest.len());
                let (chunk, tail) = rest.split_at(rows.min(rest.len()));
                rest = tail;
                let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
                for e in chunk {
                    q = bind_egress!(q, e);
                }
                match &mut tx {
                    Some(tx) => q.execute(&mut **tx).await,
                    None => q.execute(p).await,
                }
                .map_err(|err| self.run_fk(err, run_id))?;
            }
            if let Some(tx) = tx {
                tx.commit().await.map_err(|e| self.err(e))?;
            }
        });
        Ok(())
    }

    /// A run's egress log, oldest first.
    pub async fn list_egress(
        &self,
        run_id: &str,
        limit: u32,
    ) -> Result<Vec<EgressEntry>, StoreError> {
        self.egress_after(run_id, 0, limit).await
    }

    /// A run's egress records with id greater than `after` (row ids start
    /// at 1), oldest first, at most `limit`.
    pub async fn egress_after(
        &self,
        run_id: &str,
        after: i64,
        limit: u32,
    ) -> Result<Vec<EgressEntry>, StoreError> {
        on_pool!(self, p => {
            let rows = sqlx::query(
                "SELECT id, run_id, at, source, integration, method, url, host, decision, \
                 reason, status, duration_ms, bytes_out, bytes_in, seq, outcome, metering, plane, rule \
                 FROM egress_log WHERE run_id = $1 AND id > $2 ORDER BY id \
                 LIMIT $3",
            )
            .bind(run_id)
            .bind(after)
            .bind(i64::from(limit))
            .fetch_all(p)
            .await
            .map_err(|e| self.err(e))?;
            rows.iter()
                .map(|r| {
                    let text = |column: &'static str| -> Result<Option<String>, StoreError> {
                        r.try_get(column).map_err(|e| self.err(e))
                    };
                    Ok(EgressEntry {
                        id: r.try_get("id").map_err(|e| self.err(e))?,
                        run_id: r.try_get("run_id").map_err(|e| self.err(e))?,
                        at: r.try_get("at").map_err(|e| self.err(e))?,
                        source: spelled("egress_log.source", text("source")?)?,
                        integration: r.try_get("integration").map_err(|e| self.err(e))?,
                        method: r.try_get("method").map_err(|e| self.err(e))?,
                        url: r.try_get("url").map_err(|e| self.err(e))?,
                        host: r.try_get("host").map_err(|e| self.err(e))?,
                        decision: spelled("egress_log.decision", text("decision")?)?,
                        reason: spelled_opt("egress_log.reason", text("reason")?)?,
                        status: r.try_get("status").map_err(|e| self.err(e))?,
                        duration_ms: r.try_get("duration_ms").map_err(|e| self.err(e))?,
                        bytes_out: r.try_get("bytes_out").map_err(|e| self.err(e))?,
                        bytes_in: r.try_get("bytes_in").map_err(|e| self.err(e))?,
                        seq: r.try_get("seq").map_err(|e| self.err(e))?,
                        outcome: spelled_opt("egress_log.outcome", text("outcome")?)?,
                        metering: spelled_opt("egress_log.metering", text("metering")?)?,
                        plane: spelled("egress_log.plane", text("plane")?)?,
                        rule: text("rule")?,
                    })
                })
                .collect()
        })
    }
}

/// A column of `egress_log` (`egress_log.<column>`) that holds one of an
/// enum's `as_str`s.
fn spelled<T: std::str::FromStr>(
    column: &'static str,
    text: Option<String>,
) -> Result<T, StoreError> {
    spelled_opt(column, text)?.ok_or(StoreError::Unspelled {
        column,
        value: None,
    })
}

/// [`spelled`] of a nullable column.
fn spelled_opt<T: std::str::FromStr>(
    column: &'static str,
    text: Option<String>,
) -> Result<Option<T>, StoreError> {
    text.map(|t| {
        t.parse().map_err(|_| StoreError::Unspelled {
            column,
            value: Some(t),
        })
    })
    .transpose()
}

/// `records` with one record per `(run_id, seq)`, in the place of its first:
/// the last one, except that a start never replaces a completion (records
/// without a `seq` are all kept).
fn last_per_seq<'r, 'a>(records: &'r [NewEgress<'a>]) -> Vec<&'r NewEgress<'a>> {
    let mut unique: Vec<&NewEgress<'_>> = Vec::with_capacity(records.len());
    // (run_id, seq) → its place in `unique`: a run's whole journal can
    // come in one call.
    let mut seen: std::collections::HashMap<(&str, i64), usize> =
        std::collections::HashMap::with_capacity(records.len());
    for r in records {
        let same = r.seq.and_then(|s| seen.get(&(r.run_id, s)).copied());
        match same {
            Some(i) if r.outcome != Some(EgressOutcome::Incomplete) => unique[i] = r,
            Some(_) => {}
            None => {
                if let Some(s) = r.seq {
                    seen.insert((r.run_id, s), unique.len());
                }
                unique.push(r);
            }
        }
    }
    unique
}
