//! `connections`: each organization's credentials, by name, as `v1:`
//! envelopes (the store never sees plaintext), and the change counter a
//! cache of them follows.
//!
//! Contracts: a connection is one of its organization's, found by
//! `(org_id, name)`; every write counts itself in
//! [`Store::connection_writes`] once it is done with the database, and the
//! schema's triggers count it in [`Store::connections_version`] in its own
//! transaction.
//!
//! Bounds: one row per `(org_id, name)` (a second insert of a name is
//! refused, a rotation or a re-encryption replaces the envelope in place);
//! rows are written by an organization (the CLI, the `/v1` API, each body
//! bounded by the API's limit), never by a run. An organization's count of
//! connections has no cap of its own.

use airlock_vault::Envelope;
use sqlx::Row as _;

use crate::{
    AuthType, ConnectionInfo, ConnectionRecord, NewConnection, Store, StoreError,
    is_unique_violation, now_ms, validate_name,
};

/// Held by every method that writes `connections`: counts the write in
/// [`Store::connection_writes`] when the method is done with the database
/// (on success, error or drop alike), so that a reader that sees the count
/// move reads what the write left.
pub(crate) struct ConnectionsWrite<'a>(&'a std::sync::atomic::AtomicU64);

impl Drop for ConnectionsWrite<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// Maps a connections row (without envelope) to [`ConnectionInfo`].
macro_rules! connection_info {
    ($r:expr, $s:expr) => {{
        let auth: String = $r.try_get("auth_type").map_err(|e| $s.err(e))?;
        ConnectionInfo {
            org_id: $r.try_get("org_id").map_err(|e| $s.err(e))?,
            name: $r.try_get("name").map_err(|e| $s.err(e))?,
            integration: $r.try_get("integration").map_err(|e| $s.err(e))?,
            auth_type: AuthType::parse(&auth).ok_or(StoreError::Unspelled {
                column: "connections.auth_type",
                value: Some(auth),
            })?,
            kid: $r.try_get("kid").map_err(|e| $s.err(e))?,
            created_at: $r.try_get("created_at").map_err(|e| $s.err(e))?,
            updated_at: $r.try_get("updated_at").map_err(|e| $s.err(e))?,
        }
    }};
}

impl Store {
    /// Stores a new connection. The envelope must be a `v1:` envelope (its kid is recorded so
    /// re-encryption can find what is left to do). Fails if the name is taken.
    pub async fn insert_connection(&self, c: &NewConnection<'_>) -> Result<(), StoreError> {
        self.insert_connection_within(c, None).await
    }

    /// [`Store::insert_connection`] while the organization holds fewer than
    /// `max` connections (`ORG_MAX_CONNECTIONS`), counted inside the insert;
    /// else [`StoreError::QuotaExceeded`] of `connections`, nothing written.
    pub async fn insert_connection_within(
        &self,
        c: &NewConnection<'_>,
        max: Option<u64>,
    ) -> Result<(), StoreError> {
        let _write = self.connections_write();
        validate_name("connection name", c.name)?;
        validate_name("integration", c.integration)?;
        let kid = Envelope::kid_of(c.envelope).map_err(StoreError::BadEnvelope)?;
        let limit = max.and_then(|m| i64::try_from(m).ok()).unwrap_or(i64::MAX);
        let res = on_pool!(self, p => {
            async {
                let mut tx = locked_tx!(self, p, c.org).await?;
                let n = sqlx::query(
                    "INSERT INTO connections \
                     (name, integration, auth_type, kid, envelope, created_at, updated_at, org_id) \
                     SELECT $1, $2, $3, $4, $5, $6, $6, $7 \
                     WHERE (SELECT COUNT(*) FROM connections WHERE org_id = $7) < $8",
                )
                .bind(c.name)
                .bind(c.integration)
                .bind(c.auth_type.as_str())
                .bind(kid)
                .bind(c.envelope)
                .bind(now_ms())
                .bind(c.org)
                .bind(limit)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                tx.commit().await?;
                Ok::<u64, sqlx::Error>(n)
            }
            .await
        });
        match res {
            Err(e) if is_unique_violation(&e) => {
                Err(StoreError::ConnectionExists(c.name.to_owned()))
            }
            Err(e) => Err(self.err(e)),
            Ok(0) => Err(StoreError::QuotaExceeded {
                what: "connections",
                limit: max.unwrap_or(u64::MAX),
            }),
            Ok(_) => Ok(()),
        }
    }

    /// One of `org`'s connections, envelope included (still encrypted).
    pub async fn get_connection(
        &self,
        org: &str,
        name: &str,
    ) -> Result<Option<ConnectionRecord>, StoreError> {
        on_pool!(self, p => {
            let row = sqlx::query(
                "SELECT org_id, name, integration, auth_type, kid, envelope, created_at, updated_at \
                 FROM connections WHERE org_id = $1 AND name = $2",
            )
            .bind(org)
            .bind(name)
            .fetch_optional(p)
            .await
            .map_err(|e| self.err(e))?;
            row.map(|r| -> Result<ConnectionRecord, StoreError> {
                Ok(ConnectionRecord {
                    info: connection_info!(r, self),
                    envelope: r.try_get("envelope").map_err(|e| self.err(e))?,
                })
            })
            .transpose()
        })
    }

    /// How many connection writes this handle and its clones have made (a
    /// counter, read without touching the database): a cache of connection
    /// rows in this process drops them when it moves, so a change made here
    /// is seen by the next read. Moved once the write is done with the
    /// database; a write whose future is dropped mid-query may commit after
    /// the move, which [`Store::connections_version`] still shows.
    pub fn connection_writes(&self) -> u64 {
        self.connection_writes
            .load(std::sync::atomic::Ordering::Acquire)
    }

    pub(crate) fn connections_write(&self) -> ConnectionsWrite<'_> {
        ConnectionsWrite(&self.connection_writes)
    }

    /// A number that moves whenever a connection is added, removed,
    /// re-encrypted or replaced, by any process sharing the store, and never
    /// comes back: the schema's triggers count every row added to, changed
    /// in or removed from `connections`, in the change's transaction. (What a cache of connection rows
    /// checks, off the request path. A count and the latest `updated_at`
    /// came back to an earlier value when a connection was added and then
    /// removed between two checks.)
    pub async fn connections_version(&self) -> Result<i64, StoreError> {
        on_pool!(self, p => {
            sqlx::query_scalar("SELECT n FROM connections_changes WHERE id = 1")
                .fetch_one(p)
                .await
                .map_err(|e| self.err(e))
        })
    }

    /// Every connection of `org`, by name, without envelopes.
    pub async fn list_connections(&self, org: &str) -> Result<Vec<ConnectionInfo>, StoreError> {
        on_pool!(self, p => {
            let rows = sqlx::query(
                "SELECT org_id, name, integration, auth_type, kid, created_at, updated_at \
                 FROM connections WHERE org_id = $1 ORDER BY name",
            )
            .bind(org)
            .fetch_all(p)
            .await
            .map_err(|e| self.err(e))?;
            rows.iter().map(|r| Ok(connection_info!(r, self))).collect()
        })
    }

    /// Replaces the envelope of one of `org`'s connections (a rotation);
    /// `false` if there is none.
    pub async fn replace_connection_envelope(
        &self,
        org: &str,
        name: &str,
        envelope: &str,
    ) -> Result<bool, StoreError> {
        let _write = self.connections_write();
        let kid = Envelope::kid_of(envelope).map_err(StoreError::BadEnvelope)?;
        let n = on_pool!(self, p => sqlx::query(
            "UPDATE connections SET envelope = $3, kid = $4, updated_at = $5 \
             WHERE org_id = $1 AND name = $2",
        )
        .bind(org)
        .bind(name)
        .bind(envelope)
        .bind(kid)
        .bind(now_ms())
        .execute(p)
        .await
        .map_err(|e| self.err(e))?
        .rows_affected());
        Ok(n > 0)
    }

    /// Removes one of `org`'s connections; `false` if there was none.
    pub async fn delete_connection(&self, org: &str, name: &str) -> Result<bool, StoreError> {
        let _write = self.connections_write();
        on_pool!(self, p => {
            let r = sqlx::query("DELETE FROM connections WHERE org_id = $1 AND name = $2")
                .bind(org)
                .bind(name)
                .execute(p)
                .await
                .map_err(|e| self.err(e))?;
            Ok(r.rows_affected() > 0)
        })
    }
}
