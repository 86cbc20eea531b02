//! What went wrong talking to the store.
//!
//! Contract: every error that came from the database driver or the system
//! keeps it as its `#[source]`, so a log line that prints the chain
//! ([`Chain`]) says why (refused, authentication, name resolution, a full
//! disk), not only which database. Database names in messages have
//! passwords redacted.

use thiserror::Error;

/// What went wrong talking to the store.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The URL is neither `postgres://…` nor `sqlite:…`.
    #[error("unsupported database URL {0}: use postgres://… or sqlite://PATH")]
    UnsupportedUrl(String),
    /// Neither `AIRLOCK_HOME` nor `HOME` is set.
    #[error("cannot find the store: set AIRLOCK_HOME (or HOME)")]
    NoHome,
    /// A file or directory could not be created or opened.
    #[error("cannot open {path}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// Another process holds the database's write lock for longer than the busy timeout.
    #[error("database {0} is locked by another process; nothing was written, try again")]
    Locked(String),
    /// The database cannot be reached, or its file is gone or unreadable.
    /// `detail` names the cause in a few words; `source` is the driver's
    /// error, when there is one.
    #[error("database {database} is unavailable: {detail}")]
    Unavailable {
        database: String,
        detail: String,
        #[source]
        source: Option<sqlx::Error>,
    },
    /// The disk under the database is full (SQLite `SQLITE_FULL`,
    /// PostgreSQL `53100 disk_full`, `ENOSPC`): nothing was written.
    #[error("database {database} is out of space (its disk is full); nothing was written")]
    Full {
        database: String,
        #[source]
        source: sqlx::Error,
    },
    /// The database was migrated by a newer Airlock.
    #[error("database schema version {found} is newer than this airlock understands ({known})")]
    SchemaTooNew { found: i64, known: i64 },
    /// A migration failed (and was rolled back).
    #[error("migration {version} failed and was rolled back: {detail}")]
    Migration {
        version: i64,
        detail: String,
        #[source]
        source: sqlx::Error,
    },
    /// An organization is at its quota ([`crate::OrgQuotas`]): nothing was written.
    #[error("the organization is at its quota of {limit} {what}; nothing was written")]
    QuotaExceeded { what: &'static str, limit: u64 },
    /// An input is not acceptable.
    #[error("invalid {what}: {reason}")]
    Invalid {
        what: &'static str,
        reason: &'static str,
    },
    /// The value to store is not a `v1:` envelope.
    #[error("refusing to store a connection: the value is not a v1 envelope")]
    BadEnvelope(#[source] airlock_vault::VaultError),
    /// A connection of that name exists.
    #[error("connection {0:?} already exists (remove it first)")]
    ConnectionExists(String),
    /// No connection of that name.
    #[error("connection {0:?} not found")]
    ConnectionNotFound(String),
    /// A run of that id exists.
    #[error("run {0:?} already exists")]
    RunExists(String),
    /// No run of that id.
    #[error("run {0:?} not found")]
    RunNotFound(String),
    /// The run had ended (failed, cancelled) before it could be started.
    #[error("run {id:?} ended before it started: {reason}")]
    RunEnded { id: String, reason: String },
    /// A result of that id exists for the run.
    #[error("result {id:?} already exists for run {run_id:?}")]
    ResultExists { run_id: String, id: String },
    /// An artifact path is recorded once per run.
    #[error("run {run_id} already has an artifact {path:?}")]
    ArtifactExists { run_id: String, path: String },
    /// A stored envelope could not be re-encrypted: the batch was rolled back.
    #[error("cannot re-encrypt connection {name:?} (its batch was rolled back)")]
    Reencrypt {
        name: String,
        #[source]
        source: airlock_vault::VaultError,
    },
    /// A stored value is not what this version writes.
    #[error(
        "the key given for key id {kid:?} is not the key this store's {kid:?} envelopes were written with: check CONNECTION_ENCRYPTION_KEY (and CONNECTION_ENCRYPTION_KEY_ID, CONNECTION_ENCRYPTION_KEYS); nothing was written"
    )]
    KeyMismatch { kid: String },
    #[error(
        "the store at {path} is damaged ({detail}): restore it from a backup, or move it aside to start an empty one"
    )]
    Damaged { path: String, detail: String },
    /// A column (`table.column`) holding what is none of its type's
    /// spellings (or nothing where a value must be).
    #[error("corrupt row: {column} holds {value:?}, which this version never writes")]
    Unspelled {
        column: &'static str,
        value: Option<String>,
    },
    /// An `INSERT … RETURNING` returned no row.
    #[error("corrupt row: an INSERT … RETURNING returned no row")]
    NoRowReturned,
    /// A row written a moment ago was not there to read back.
    #[error("corrupt row: {what} {name:?} vanished after its write")]
    Vanished { what: &'static str, name: String },
    /// A re-encryption batch could not be encoded for its statement.
    #[error("corrupt row: batch encoding: {0}")]
    BatchEncoding(#[source] serde_json::Error),
    /// A run's end written before its journal is stored (the journal is
    /// read first: the end waits on disk for it).
    #[error("the run's journal is not stored yet")]
    JournalNotStored,
    /// A live policy change made on a version another change replaced.
    #[error(
        "run {run_id:?}'s policy changed meanwhile (now version {latest}); nothing was written"
    )]
    PolicyChanged { run_id: String, latest: i64 },
    /// A run whose policy was changed as often as it may be.
    #[error(
        "run {run_id:?}'s policy has been changed {limit} times, its bound; nothing was written"
    )]
    PolicyChangesExhausted { run_id: String, limit: i64 },
    /// A run that asked for as many approvals as it may
    /// ([`crate::MAX_APPROVALS_PER_RUN`]).
    #[error("run {run_id:?} has asked for {limit} approvals, its bound; nothing was written")]
    ApprovalsExhausted { run_id: String, limit: i64 },
    /// Any other database error.
    #[error("database {database} failed")]
    Database {
        database: String,
        #[source]
        source: sqlx::Error,
    },
}

impl StoreError {
    pub(crate) fn from_sqlx(database: &str, e: sqlx::Error) -> Self {
        let database = database.to_owned();
        let unavailable = |detail: String, e: sqlx::Error| StoreError::Unavailable {
            database: database.clone(),
            detail,
            source: Some(e),
        };
        if let Some(db) = e.as_database_error() {
            // SQLite: 5 SQLITE_BUSY, 6 SQLITE_LOCKED (and their extended codes, code & 0xff).
            // PostgreSQL: 55P03 lock_not_available.
            let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
            let primary = code.parse::<i64>().map(|c| c & 0xff).ok();
            if matches!(primary, Some(5 | 6)) || code == "55P03" {
                return StoreError::Locked(database);
            }
            // SQLite: 13 FULL; PostgreSQL: 53100 disk_full.
            if primary == Some(13) || code == "53100" {
                return StoreError::Full {
                    database,
                    source: e,
                };
            }
            // SQLite: 11 CORRUPT, 26 NOTADB: the file itself is damaged.
            if matches!(primary, Some(11 | 26)) {
                return StoreError::Damaged {
                    path: database,
                    detail: db.message().to_owned(),
                };
            }
            // SQLite: 14 CANTOPEN, 10 IOERR, 8 READONLY.
            if matches!(primary, Some(8 | 10 | 14)) {
                let detail = db.message().to_owned();
                return unavailable(detail, e);
            }
            // PostgreSQL: 28000 invalid_authorization_specification, 28P01
            // invalid_password, 3D000 invalid_catalog_name (no such
            // database), 57P01-57P03 the server is shutting down or starting.
            let why = match code.as_str() {
                "28000" | "28P01" => Some("authentication failed"),
                "3D000" => Some("no such database"),
                "57P01" | "57P02" | "57P03" => Some("the server is shutting down or starting"),
                _ => None,
            };
            if let Some(why) = why {
                let detail = format!("{why} ({})", db.message());
                return unavailable(detail, e);
            }
            return StoreError::Database {
                database,
                source: e,
            };
        }
        match e {
            sqlx::Error::Io(ref io) if io.kind() == std::io::ErrorKind::StorageFull => {
                StoreError::Full {
                    database,
                    source: e,
                }
            }
            sqlx::Error::Io(ref io) => {
                let detail = match io.kind() {
                    std::io::ErrorKind::ConnectionRefused => {
                        "connection refused (is the server running, on that port?)".to_owned()
                    }
                    std::io::ErrorKind::TimedOut => "connecting timed out".to_owned(),
                    // The resolver's failure is an `Other` I/O error.
                    _ if io.to_string().contains("lookup address") => {
                        format!("its host name does not resolve ({io})")
                    }
                    _ => io.to_string(),
                };
                unavailable(detail, e)
            }
            sqlx::Error::PoolTimedOut => {
                unavailable("timed out waiting for a connection".into(), e)
            }
            sqlx::Error::PoolClosed => unavailable("the store was closed".into(), e),
            sqlx::Error::Tls(ref t) => {
                let detail = format!("TLS: {t}");
                unavailable(detail, e)
            }
            other => StoreError::Database {
                database,
                source: other,
            },
        }
    }

    /// Whether waiting and trying again may succeed (the database is
    /// unreachable, busy or full), as opposed to an error no retry fixes.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            StoreError::Unavailable { .. } | StoreError::Locked(_) | StoreError::Full { .. }
        )
    }

    /// Whether this says only that no pooled connection could be had in
    /// time, not why ([`crate::Store::probe`] finds out).
    pub fn is_pool_timeout(&self) -> bool {
        matches!(
            self,
            StoreError::Unavailable {
                source: Some(sqlx::Error::PoolTimedOut),
                ..
            }
        )
    }

    /// This error and every cause below it, for a log line.
    pub fn chain(&self) -> Chain<'_> {
        Chain(self)
    }
}

/// An error and its causes, displayed as `error: cause: cause`; a cause
/// whose text its parent already shows is not repeated.
pub struct Chain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut shown = self.0.to_string();
        f.write_str(&shown)?;
        let mut next = self.0.source();
        while let Some(e) = next {
            let text = e.to_string();
            if !shown.contains(&text) {
                write!(f, ": {text}")?;
            }
            shown = text;
            next = e.source();
        }
        Ok(())
    }
}
