use thiserror::Error;

/// What went wrong talking to the store. Database names in messages have passwords redacted.
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
    #[error("database {database} is unavailable: {detail}")]
    Unavailable { database: String, detail: String },
    /// The database was migrated by a newer Airlock.
    #[error("database schema version {found} is newer than this airlock understands ({known})")]
    SchemaTooNew { found: i64, known: i64 },
    /// A migration failed (and was rolled back).
    #[error("migration {version} failed and was rolled back: {detail}")]
    Migration { version: i64, detail: String },
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
    #[error("corrupt row: {0}")]
    Corrupt(String),
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
        if let Some(db) = e.as_database_error() {
            // SQLite: 5 SQLITE_BUSY, 6 SQLITE_LOCKED (and their extended codes, code & 0xff).
            // PostgreSQL: 55P03 lock_not_available.
            let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
            let primary = code.parse::<i64>().map(|c| c & 0xff).ok();
            if matches!(primary, Some(5 | 6)) || code == "55P03" {
                return StoreError::Locked(database);
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
                return StoreError::Unavailable {
                    database,
                    detail: db.message().to_owned(),
                };
            }
            return StoreError::Database {
                database,
                source: e,
            };
        }
        match e {
            sqlx::Error::Io(io) => StoreError::Unavailable {
                database,
                detail: io.to_string(),
            },
            sqlx::Error::PoolTimedOut => StoreError::Unavailable {
                database,
                detail: "timed out waiting for a connection".into(),
            },
            sqlx::Error::PoolClosed => StoreError::Unavailable {
                database,
                detail: "the store was closed".into(),
            },
            sqlx::Error::Tls(t) => StoreError::Unavailable {
                database,
                detail: format!("TLS: {t}"),
            },
            other => StoreError::Database {
                database,
                source: other,
            },
        }
    }
}
