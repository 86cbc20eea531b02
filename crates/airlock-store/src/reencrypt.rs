//! Re-encryption of `connections` under the keyring's active key, batch by
//! batch, and the counts that say how much is left.
//!
//! Contracts: a batch is one transaction, rewritten whole or not at all;
//! a row is rewritten only while it still holds the envelope that was read
//! (a rotation meanwhile wins); the cursor is the pair `(org_id, name)`, so
//! each batch costs the same however much is done.
//!
//! Bounds: rows are rewritten in place (never added), at most `batch` per
//! transaction.

use airlock_vault::Keyring;
use sqlx::postgres::PgPool;
use sqlx::sqlite::SqlitePool;
use sqlx::{Connection as _, Row as _};

use crate::{BatchOutcome, Pool, Store, StoreError, now_ms};

/// Between an organization and a connection name in a re-encryption cursor:
/// below every character a name may hold (no control characters), so the
/// cursor orders as the pair `(org_id, name)` does.
const CURSOR_SEP: &str = "\u{1f}";

/// Where a re-encryption batch starts, and what it writes.
struct Scan<'a> {
    /// The keyring's active key id: rows under any other are read, and
    /// rewritten under it.
    active: &'a str,
    /// Rows per batch.
    limit: i64,
    /// The cursor: the last `(org_id, name)` done.
    after_org: &'a str,
    after_name: &'a str,
    /// The rewritten rows' `updated_at`.
    now: i64,
}

/// One row of a batch: where it is, the envelope read and the envelope to
/// write in its place.
struct Rewrite {
    org: String,
    name: String,
    old: String,
    new: String,
}

/// The rows of a batch past the cursor, with each one's cursor: `$1` the
/// active key id, `$2` the batch size, `($3, $4)` the cursor's pair, `$5`
/// [`CURSOR_SEP`].
macro_rules! next_rows {
    () => {
        "SELECT org_id, name, envelope, org_id || $5 || name AS cursor FROM connections \
         WHERE (org_id, name) > ($3, $4) AND kid <> $1 \
         ORDER BY org_id, name LIMIT $2"
    };
}

/// `$sql` (a [`next_rows!`]) bound to a [`Scan`].
macro_rules! select_batch {
    ($sql:expr, $scan:expr) => {
        sqlx::query($sql)
            .bind($scan.active)
            .bind($scan.limit)
            .bind($scan.after_org)
            .bind($scan.after_name)
            .bind(CURSOR_SEP)
    };
}

impl Store {
    /// How many envelopes each key id holds, by kid.
    pub async fn envelope_counts_by_kid(&self) -> Result<Vec<(String, u64)>, StoreError> {
        on_pool!(self, p => {
            let rows = sqlx::query(
                "SELECT kid, COUNT(*) AS n FROM connections GROUP BY kid ORDER BY kid",
            )
            .fetch_all(p)
            .await
            .map_err(|e| self.err(e))?;
            rows.iter()
                .map(|r| {
                    let kid: String = r.try_get("kid").map_err(|e| self.err(e))?;
                    let n: i64 = r.try_get("n").map_err(|e| self.err(e))?;
                    Ok((kid, u64::try_from(n).unwrap_or(0)))
                })
                .collect()
        })
    }

    /// How many envelopes are not yet under `kid`.
    pub async fn count_envelopes_not_under(&self, kid: &str) -> Result<u64, StoreError> {
        on_pool!(self, p => {
            let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM connections WHERE kid <> $1")
                .bind(kid)
                .fetch_one(p)
                .await
                .map_err(|e| self.err(e))?;
            Ok(u64::try_from(n).unwrap_or(0))
        })
    }

    /// Re-encrypts up to `batch` envelopes that are not under the keyring's active kid, in one
    /// transaction: either the whole batch is rewritten or none of it. Returns how many rows
    /// were rewritten; `0` means nothing is left. Safe to interrupt at any point and to run
    /// again (each row is rewritten only if it still holds the envelope that was read).
    pub async fn reencrypt_batch(&self, ring: &Keyring, batch: usize) -> Result<usize, StoreError> {
        Ok(self.reencrypt_batch_after(ring, batch, "").await?.rewritten)
    }

    /// Like [`Store::reencrypt_batch`], but only over connections named after `after` (a
    /// cursor: pass the previous outcome's `last`, or `""` to start). Keeps each batch's cost
    /// independent of how much is already done. `scanned == 0` means nothing is left past
    /// the cursor.
    pub async fn reencrypt_batch_after(
        &self,
        ring: &Keyring,
        batch: usize,
        after: &str,
    ) -> Result<BatchOutcome, StoreError> {
        let _write = self.connections_write();
        // Every key it decrypts with must be the store's, and the one it
        // writes with is kept.
        self.check_keyring(ring).await?;
        self.record_active_key(ring).await?;
        let limit = i64::try_from(batch.max(1)).unwrap_or(i64::MAX);
        // The cursor is the pair (organization, name) of the last row done,
        // compared as a row value so the primary key's index serves it.
        let (after_org, after_name) = after.split_once(CURSOR_SEP).unwrap_or((after, ""));
        let scan = Scan {
            active: ring.active_kid(),
            limit,
            after_org,
            after_name,
            now: now_ms(),
        };
        match &self.pool {
            Pool::Sqlite(p) => self.reencrypt_sqlite(p, ring, &scan).await,
            Pool::Postgres(p) => self.reencrypt_postgres(p, ring, &scan).await,
        }
    }

    /// [`Store::reencrypt_batch_after`] on SQLite: the rows go back in one
    /// statement, as one JSON array of `[org, name, old envelope, new
    /// envelope]` (envelopes only: no plaintext), each found by its primary
    /// key.
    async fn reencrypt_sqlite(
        &self,
        p: &SqlitePool,
        ring: &Keyring,
        scan: &Scan<'_>,
    ) -> Result<BatchOutcome, StoreError> {
        let mut conn = p.acquire().await.map_err(|e| self.err(e))?;
        // BEGIN IMMEDIATE: take the write lock before reading, so the read and the
        // writes see one snapshot and a second writer waits (busy_timeout) or fails.
        let mut tx = conn
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(|e| self.err(e))?;
        let rows = select_batch!(next_rows!(), scan)
            .fetch_all(&mut *tx)
            .await
            .map_err(|e| self.err(e))?;
        let (rewrites, cursor) = self.rewrites(ring, &rows)?;
        let Some(last) = cursor else {
            tx.commit().await.map_err(|e| self.err(e))?;
            return Ok(BatchOutcome::default());
        };
        let quads: Vec<[&str; 4]> = rewrites
            .iter()
            .map(|w| [w.org.as_str(), &w.name, &w.old, &w.new])
            .collect();
        let batch_json = serde_json::to_string(&quads).map_err(StoreError::BatchEncoding)?;
        let res = sqlx::query(
            "UPDATE connections SET envelope = u.new, kid = $1, updated_at = $2 \
             FROM (SELECT value ->> 0 AS org, value ->> 1 AS name, value ->> 2 AS old, \
                   value ->> 3 AS new FROM json_each($3)) AS u \
             WHERE connections.org_id = u.org AND connections.name = u.name \
             AND connections.envelope = u.old",
        )
        .bind(scan.active)
        .bind(scan.now)
        .bind(&batch_json)
        .execute(&mut *tx)
        .await
        .map_err(|e| self.err(e))?;
        tx.commit().await.map_err(|e| self.err(e))?;
        Ok(BatchOutcome {
            rewritten: usize::try_from(res.rows_affected()).unwrap_or(0),
            scanned: rewrites.len(),
            last,
        })
    }

    /// [`Store::reencrypt_batch_after`] on PostgreSQL: the rows read are
    /// locked (rows another batch holds are skipped) and go back in one
    /// statement, as four arrays.
    async fn reencrypt_postgres(
        &self,
        p: &PgPool,
        ring: &Keyring,
        scan: &Scan<'_>,
    ) -> Result<BatchOutcome, StoreError> {
        let mut tx = p.begin().await.map_err(|e| self.err(e))?;
        let rows = select_batch!(concat!(next_rows!(), " FOR UPDATE SKIP LOCKED"), scan)
            .fetch_all(&mut *tx)
            .await
            .map_err(|e| self.err(e))?;
        let (rewrites, cursor) = self.rewrites(ring, &rows)?;
        let Some(last) = cursor else {
            return Ok(BatchOutcome::default());
        };
        let names: Vec<&str> = rewrites.iter().map(|w| w.name.as_str()).collect();
        let olds: Vec<&str> = rewrites.iter().map(|w| w.old.as_str()).collect();
        let news: Vec<&str> = rewrites.iter().map(|w| w.new.as_str()).collect();
        let orgs: Vec<&str> = rewrites.iter().map(|w| w.org.as_str()).collect();
        let res = sqlx::query(
            "UPDATE connections AS c SET envelope = u.new, kid = $1, updated_at = $2 \
             FROM UNNEST($3::text[], $4::text[], $5::text[], $6::text[]) AS u(name, old, new, org) \
             WHERE c.org_id = u.org AND c.name = u.name AND c.envelope = u.old",
        )
        .bind(scan.active)
        .bind(scan.now)
        .bind(&names)
        .bind(&olds)
        .bind(&news)
        .bind(&orgs)
        .execute(&mut *tx)
        .await
        .map_err(|e| self.err(e))?;
        tx.commit().await.map_err(|e| self.err(e))?;
        Ok(BatchOutcome {
            rewritten: usize::try_from(res.rows_affected()).unwrap_or(0),
            scanned: rewrites.len(),
            last,
        })
    }

    /// The batch's rows re-encrypted under the active key, and the last
    /// row's cursor (`None`: nothing was left).
    fn rewrites<R>(
        &self,
        ring: &Keyring,
        rows: &[R],
    ) -> Result<(Vec<Rewrite>, Option<String>), StoreError>
    where
        R: sqlx::Row,
        &'static str: sqlx::ColumnIndex<R>,
        String: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    {
        let mut out = Vec::with_capacity(rows.len());
        let mut cursor = None;
        for r in rows {
            cursor = Some(r.try_get::<String, _>("cursor").map_err(|e| self.err(e))?);
            let org: String = r.try_get("org_id").map_err(|e| self.err(e))?;
            let name: String = r.try_get("name").map_err(|e| self.err(e))?;
            let old: String = r.try_get("envelope").map_err(|e| self.err(e))?;
            let new = reencrypt_one(ring, &name, &old)?;
            out.push(Rewrite {
                org,
                name,
                old,
                new,
            });
        }
        Ok((out, cursor))
    }
}

fn reencrypt_one(ring: &Keyring, name: &str, old: &str) -> Result<String, StoreError> {
    let wrap = |source| StoreError::Reencrypt {
        name: name.to_owned(),
        source,
    };
    match ring.reencrypt(old).map_err(wrap)? {
        Some(new) => Ok(new),
        // kid column and envelope disagree: write the envelope back with its real kid.
        None => Ok(old.to_owned()),
    }
}
