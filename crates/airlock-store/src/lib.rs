//! `airlock-store`: the platform's state.
//!
//! SQLite by default (`$AIRLOCK_HOME/airlock.db`, WAL), PostgreSQL when
//! `DATABASE_URL=postgres://…`. Migrations run at [`Store::open`]. Every query is written once
//! (`$n` placeholders, which both backends accept) and dispatched to the backend's own pool, so
//! both get their native types and the same test suite runs on both.
//!
//! Tables: `connections` (encrypted credentials: only envelopes are stored), `runs` (with the
//! columns a run list needs), `run_events`, `egress_log`, `memories`, `results`.
//! Timestamps are Unix milliseconds (`i64`).

#![forbid(unsafe_code)]

mod error;
mod model;
mod schema;

use std::path::{Path, PathBuf};
use std::str::FromStr as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use airlock_vault::{Envelope, Keyring};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Connection as _, Row as _};

pub use error::{Chain, StoreError};
pub use model::*;

/// Between an organization and a connection name in a re-encryption cursor:
/// below every character a name may hold (no control characters), so the
/// cursor orders as the pair `(org_id, name)` does.
const CURSOR_SEP: &str = "\u{1f}";

/// The organization of everything the embedded platform (`airlock run`, the
/// CLI) stores; `airlock serve`'s organizations have their own ids.
pub const LOCAL_ORG: &str = "local";

/// Where the default SQLite database lives, below `AIRLOCK_HOME`.
pub const DB_FILE: &str = "airlock.db";

#[derive(Clone)]
enum Pool {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// Runs the same code against whichever pool the store has. The body is compiled once per
/// backend, so it sees concrete types.
macro_rules! on_pool {
    ($self:expr, $p:ident => $body:expr) => {
        match &$self.pool {
            Pool::Sqlite($p) => $body,
            Pool::Postgres($p) => $body,
        }
    };
}

/// The egress log's columns, in the order [`bind_egress!`] binds them.
macro_rules! egress_columns {
    () => {
        "(run_id, at, source, integration, method, url, host, decision, \
         reason, status, duration_ms, bytes_out, bytes_in, seq, outcome, metering)"
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
         outcome = excluded.outcome, metering = excluded.metering \
         WHERE excluded.outcome IS NULL OR excluded.outcome <> 'incomplete'"
    };
}

/// Binds one [`NewEgress`] to a query, in [`egress_columns!`]'s order.
macro_rules! bind_egress {
    ($q:expr, $e:expr) => {
        $q.bind($e.run_id)
            .bind($e.at)
            .bind($e.source)
            .bind($e.integration)
            .bind($e.method)
            .bind($e.url)
            .bind($e.host)
            .bind($e.decision.as_str())
            .bind($e.reason)
            .bind($e.status)
            .bind($e.duration_ms)
            .bind($e.bytes_out)
            .bind($e.bytes_in)
            .bind($e.seq)
            .bind($e.outcome.map(EgressOutcome::as_str))
            .bind($e.metering.map(EgressMetering::as_str))
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
        16,
        rows,
        numbered,
        egress_upsert!(),
    )
}

/// `head`, then `rows` parenthesised lists of `cols` placeholders
/// (PostgreSQL's `$n`, numbered across rows, or SQLite's `?`), then `tail`:
/// one statement that writes many rows.
fn multi_row_insert(head: &str, cols: usize, rows: usize, numbered: bool, tail: &str) -> String {
    use std::fmt::Write as _;
    let mut sql = String::from(head);
    for i in 0..rows {
        if i > 0 {
            sql.push_str(", ");
        }
        sql.push('(');
        for c in 0..cols {
            if c > 0 {
                sql.push_str(", ");
            }
            if numbered {
                let _ = write!(sql, "${}", i * cols + c + 1);
            } else {
                sql.push('?');
            }
        }
        sql.push(')');
    }
    sql.push_str(tail);
    sql
}

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

/// Maps a connections row (without envelope) to [`ConnectionInfo`].
macro_rules! connection_info {
    ($r:expr, $s:expr) => {{
        let auth: String = $r.try_get("auth_type").map_err(|e| $s.err(e))?;
        ConnectionInfo {
            org_id: $r.try_get("org_id").map_err(|e| $s.err(e))?,
            name: $r.try_get("name").map_err(|e| $s.err(e))?,
            integration: $r.try_get("integration").map_err(|e| $s.err(e))?,
            auth_type: AuthType::parse(&auth)
                .ok_or_else(|| StoreError::Corrupt(format!("connection auth_type {auth:?}")))?,
            kid: $r.try_get("kid").map_err(|e| $s.err(e))?,
            created_at: $r.try_get("created_at").map_err(|e| $s.err(e))?,
            updated_at: $r.try_get("updated_at").map_err(|e| $s.err(e))?,
        }
    }};
}

macro_rules! run_columns {
    () => {
        "id, agent, status, backend, model, created_at, started_at, ended_at, \
         last_heartbeat_at, exit_code, error, tokens_in, tokens_out, cost_microusd, org_id, owner"
    };
}

/// Maps a runs row (selected with `run_columns!`) to [`Run`].
macro_rules! run_row {
    ($r:expr, $s:expr) => {{
        let status: String = $r.try_get("status").map_err(|e| $s.err(e))?;
        Run {
            id: $r.try_get("id").map_err(|e| $s.err(e))?,
            agent: $r.try_get("agent").map_err(|e| $s.err(e))?,
            status: RunStatus::parse(&status)
                .ok_or_else(|| StoreError::Corrupt(format!("run status {status:?}")))?,
            backend: $r.try_get("backend").map_err(|e| $s.err(e))?,
            model: $r.try_get("model").map_err(|e| $s.err(e))?,
            created_at: $r.try_get("created_at").map_err(|e| $s.err(e))?,
            started_at: $r.try_get("started_at").map_err(|e| $s.err(e))?,
            ended_at: $r.try_get("ended_at").map_err(|e| $s.err(e))?,
            last_heartbeat_at: $r.try_get("last_heartbeat_at").map_err(|e| $s.err(e))?,
            exit_code: $r.try_get("exit_code").map_err(|e| $s.err(e))?,
            error: $r.try_get("error").map_err(|e| $s.err(e))?,
            tokens_in: $r.try_get("tokens_in").map_err(|e| $s.err(e))?,
            tokens_out: $r.try_get("tokens_out").map_err(|e| $s.err(e))?,
            cost_microusd: $r.try_get("cost_microusd").map_err(|e| $s.err(e))?,
            org_id: $r.try_get("org_id").map_err(|e| $s.err(e))?,
            owner: $r.try_get("owner").map_err(|e| $s.err(e))?,
        }
    }};
}

// After the macros above, which it uses.
mod tenants;
pub use tenants::*;
mod retention;
pub use retention::*;

/// Which database a store talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A SQLite file.
    Sqlite,
    /// A PostgreSQL server.
    Postgres,
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

/// How to open a store.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// How long SQLite waits for another writer before reporting [`StoreError::Locked`].
    pub busy_timeout: Duration,
    /// How long to wait for a pooled connection (PostgreSQL: also for the server).
    pub acquire_timeout: Duration,
    /// Pool size.
    pub max_connections: u32,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            busy_timeout: Duration::from_secs(5),
            acquire_timeout: Duration::from_secs(10),
            max_connections: 5,
        }
    }
}

/// The name of the thread that runs a SQLite store's
/// [`Store::own_connection`] (the shared pool's are sqlx's
/// `sqlx-sqlite-worker-N`).
pub const OWN_CONNECTION_THREAD: &str = "sqlx-sqlite-own";

/// A handle on the database: cheap to clone.
#[derive(Clone)]
pub struct Store {
    pool: Pool,
    display: String,
    /// Connection writes made through this handle or a clone of it: what a
    /// cache in this process follows at once (another process's writes
    /// show in [`Store::connections_version`]).
    connection_writes: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// [`Store::own_connection`], once opened: shared by every clone.
    own: std::sync::Arc<tokio::sync::OnceCell<Store>>,
}

/// Held by every method that writes `connections`: counts the write in
/// [`Store::connection_writes`] when the method is done with the database
/// (on success, error or drop alike), so that a reader that sees the count
/// move reads what the write left.
struct ConnectionsWrite<'a>(&'a std::sync::atomic::AtomicU64);

impl Drop for ConnectionsWrite<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("database", &self.display)
            .finish()
    }
}

/// Current time in Unix milliseconds.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// `$AIRLOCK_HOME`, default `~/.local/share/airlock`.
pub fn airlock_home() -> Result<PathBuf, StoreError> {
    if let Some(h) = std::env::var_os("AIRLOCK_HOME").filter(|h| !h.is_empty()) {
        return Ok(PathBuf::from(h));
    }
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .ok_or(StoreError::NoHome)?;
    Ok(PathBuf::from(home).join(".local/share/airlock"))
}

/// The store the process environment names (`DATABASE_URL`, else SQLite
/// at `$AIRLOCK_HOME/airlock.db`), printable (its password redacted),
/// without opening it.
pub fn default_store_name() -> Result<String, StoreError> {
    match std::env::var("DATABASE_URL").ok().filter(|v| !v.is_empty()) {
        Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
            Ok(redact_url(&url))
        }
        Some(url) => Ok(url),
        None => Ok(airlock_home()?.join(DB_FILE).display().to_string()),
    }
}

/// A URL safe to print: any password replaced by `***`.
fn redact_url(raw: &str) -> String {
    match url::Url::parse(raw) {
        Ok(mut u) => {
            if u.password().is_some() {
                let _ = u.set_password(Some("***"));
            }
            u.to_string()
        }
        Err(_) => "<unparseable database URL>".to_owned(),
    }
}

impl Store {
    /// Opens the store the process environment asks for: `DATABASE_URL` when set, else SQLite
    /// at `$AIRLOCK_HOME/airlock.db`.
    pub async fn open_default() -> Result<Self, StoreError> {
        match std::env::var("DATABASE_URL").ok().filter(|v| !v.is_empty()) {
            Some(url) => Self::open(&url, &StoreOptions::default()).await,
            None => {
                let path = airlock_home()?.join(DB_FILE);
                Self::open_sqlite(&path, &StoreOptions::default()).await
            }
        }
    }

    /// Opens `postgres://…` / `postgresql://…` or `sqlite://PATH` / `sqlite:PATH`.
    pub async fn open(url: &str, opts: &StoreOptions) -> Result<Self, StoreError> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Self::open_postgres(url, opts).await
        } else if let Some(path) = url
            .strip_prefix("sqlite://")
            .or_else(|| url.strip_prefix("sqlite:"))
        {
            let path = path.split('?').next().unwrap_or(path);
            Self::open_sqlite(Path::new(path), opts).await
        } else {
            Err(StoreError::UnsupportedUrl(redact_url(url)))
        }
    }

    /// Opens (creating if needed) a SQLite database file, in WAL mode. A new file and its
    /// directory are made private to the user (0600 / 0700).
    pub async fn open_sqlite(path: &Path, opts: &StoreOptions) -> Result<Self, StoreError> {
        let display = path.display().to_string();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            create_private_dir(dir).map_err(|source| StoreError::Io {
                path: dir.display().to_string(),
                source,
            })?;
        }
        create_private_file(path).map_err(|source| StoreError::Io {
            path: display.clone(),
            source,
        })?;
        let connect = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(false)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(opts.busy_timeout)
            .foreign_keys(true)
            // Space a sweep frees goes back to the file system (a store
            // created before this setting keeps its mode until VACUUM).
            .auto_vacuum(sqlx::sqlite::SqliteAutoVacuum::Incremental);
        let pool = SqlitePoolOptions::new()
            .max_connections(opts.max_connections.max(1))
            .acquire_timeout(opts.acquire_timeout)
            .connect_with(connect)
            .await
            .map_err(|e| StoreError::from_sqlx(&display, e))?;
        tracing::debug!(target: "airlock::phase", "store connected");
        let store = Self {
            pool: Pool::Sqlite(pool),
            display,
            connection_writes: Default::default(),
            own: Default::default(),
        };
        // SQLite's check reads the whole file (~1.3 ms per MiB here): up to
        // QUICK_CHECK_MAX_BYTES it runs before the store is used; a larger
        // store is checked in the background and a damage found is logged
        // as an error (a large store belongs on PostgreSQL anyway).
        let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        if size <= QUICK_CHECK_MAX_BYTES {
            store.check_sqlite_structure().await?;
        } else {
            let bg = store.clone();
            tokio::spawn(async move {
                if let Err(e) = bg.check_sqlite_structure().await {
                    tracing::error!("{e}");
                }
            });
        }
        tracing::debug!(target: "airlock::phase", "store checked");
        store.migrate().await?;
        Ok(store)
    }

    /// SQLite's own check of every b-tree and page of the file (`PRAGMA
    /// quick_check`): a damaged store is refused with a clear error, never
    /// used. (It cannot see a flipped byte inside a value: SQLite keeps no
    /// per-row checksum.)
    pub async fn check_sqlite_structure(&self) -> Result<(), StoreError> {
        let Pool::Sqlite(p) = &self.pool else {
            return Ok(());
        };
        let rows: Vec<String> = sqlx::query_scalar("PRAGMA quick_check(8)")
            .fetch_all(p)
            .await
            .map_err(|e| self.err(e))?;
        if rows.len() == 1 && rows[0] == "ok" {
            return Ok(());
        }
        Err(StoreError::Damaged {
            path: self.display.clone(),
            detail: rows.join("; "),
        })
    }

    /// Connects to PostgreSQL.
    pub async fn open_postgres(url: &str, opts: &StoreOptions) -> Result<Self, StoreError> {
        let display = redact_url(url);
        let connect = PgConnectOptions::from_str(url)
            .map_err(|_| StoreError::UnsupportedUrl(display.clone()))?;
        // One connection first, alone: a pool that cannot connect reports
        // only that it timed out, this says why (refused, authentication,
        // name resolution).
        match tokio::time::timeout(
            opts.acquire_timeout,
            sqlx::PgConnection::connect_with(&connect),
        )
        .await
        {
            Ok(Ok(c)) => {
                let _ = c.close().await;
            }
            Ok(Err(e)) => return Err(StoreError::from_sqlx(&display, e)),
            Err(_) => {
                return Err(StoreError::Unavailable {
                    database: display,
                    detail: format!("no answer within {} s", opts.acquire_timeout.as_secs_f64()),
                    source: None,
                });
            }
        }
        let pool = PgPoolOptions::new()
            .max_connections(opts.max_connections.max(1))
            .acquire_timeout(opts.acquire_timeout)
            .connect_with(connect)
            .await
            .map_err(|e| StoreError::from_sqlx(&display, e))?;
        let store = Self {
            pool: Pool::Postgres(pool),
            display,
            connection_writes: Default::default(),
            own: Default::default(),
        };
        store.migrate().await?;
        Ok(store)
    }

    /// Which backend this store uses.
    pub fn backend(&self) -> Backend {
        match self.pool {
            Pool::Sqlite(_) => Backend::Sqlite,
            Pool::Postgres(_) => Backend::Postgres,
        }
    }

    /// The database, printable (passwords redacted).
    pub fn display_name(&self) -> &str {
        &self.display
    }

    /// Closes every pooled connection (SQLite: checkpoints the WAL).
    pub async fn close(&self) {
        // (Nothing asks an own connection for one of its own.)
        if let Some(own) = self.own.get() {
            on_pool!(own, p => p.close().await);
        }
        on_pool!(self, p => p.close().await)
    }

    /// This store over one connection of its own, apart from the shared
    /// pool: opened by the first call, on the calling thread, and used by
    /// every clone of this store that asks after it. It is for work that
    /// should run at the priority of the thread that asks (work no request
    /// waits for): SQLite runs each connection's statements on a thread of
    /// the connection's own, which takes the scheduling policy of the
    /// thread that opens it, so that work's statements run at its priority
    /// without ever lending it to a pooled connection that later serves
    /// requests. (PostgreSQL runs statements in its server; the connection
    /// is kept apart all the same.) Kept open until [`Store::close`]:
    /// nothing reopens it from elsewhere (no idle or lifetime limit).
    pub async fn own_connection(&self) -> Result<Store, StoreError> {
        self.own
            .get_or_try_init(|| async {
                fn own<DB: sqlx::Database>(p: &sqlx::Pool<DB>) -> sqlx::pool::PoolOptions<DB> {
                    sqlx::pool::PoolOptions::new()
                        .max_connections(1)
                        .min_connections(0)
                        .idle_timeout(None)
                        .max_lifetime(None)
                        .acquire_timeout(p.options().get_acquire_timeout())
                }
                let pool = match &self.pool {
                    Pool::Sqlite(p) => Pool::Sqlite(
                        own(p)
                            .connect_with(
                                (*p.connect_options())
                                    .clone()
                                    .thread_name(|_| OWN_CONNECTION_THREAD.to_owned()),
                            )
                            .await
                            .map_err(|e| self.err(e))?,
                    ),
                    Pool::Postgres(p) => Pool::Postgres(
                        own(p)
                            .connect_with((*p.connect_options()).clone())
                            .await
                            .map_err(|e| self.err(e))?,
                    ),
                };
                Ok(Store {
                    pool,
                    display: self.display.clone(),
                    connection_writes: self.connection_writes.clone(),
                    own: Default::default(),
                })
            })
            .await
            .cloned()
    }

    /// This store over a pool of its own (`max_connections`, each wait for
    /// a connection bounded by `acquire_timeout`), connected on first use:
    /// for work that must not queue behind the shared pool's, such as a
    /// replica's heartbeat.
    pub fn apart(&self, max_connections: u32, acquire_timeout: Duration) -> Store {
        fn opts<DB: sqlx::Database>(n: u32, t: Duration) -> sqlx::pool::PoolOptions<DB> {
            sqlx::pool::PoolOptions::new()
                .max_connections(n.max(1))
                .acquire_timeout(t)
        }
        let pool = match &self.pool {
            Pool::Sqlite(p) => Pool::Sqlite(
                opts(max_connections, acquire_timeout)
                    .connect_lazy_with((*p.connect_options()).clone()),
            ),
            Pool::Postgres(p) => Pool::Postgres(
                opts(max_connections, acquire_timeout)
                    .connect_lazy_with((*p.connect_options()).clone()),
            ),
        };
        Store {
            pool,
            display: self.display.clone(),
            connection_writes: self.connection_writes.clone(),
            own: Default::default(),
        }
    }

    /// Why the store does not answer, if it does not: one fresh connection
    /// and a query, outside the pool (whose own failure says only that it
    /// timed out). `Ok` when it answers.
    pub async fn probe(&self, timeout: Duration) -> Result<(), StoreError> {
        let attempt = async {
            match &self.pool {
                Pool::Sqlite(p) => {
                    let mut c = sqlx::SqliteConnection::connect_with(&p.connect_options()).await?;
                    sqlx::query("SELECT 1").execute(&mut c).await?;
                    c.close().await
                }
                Pool::Postgres(p) => {
                    let mut c = sqlx::PgConnection::connect_with(&p.connect_options()).await?;
                    sqlx::query("SELECT 1").execute(&mut c).await?;
                    c.close().await
                }
            }
        };
        match tokio::time::timeout(timeout, attempt).await {
            Ok(r) => r.map_err(|e| self.err(e)),
            Err(_) => Err(StoreError::Unavailable {
                database: self.display.clone(),
                detail: format!("no answer within {} s", timeout.as_secs_f64()),
                source: None,
            }),
        }
    }

    fn err(&self, e: sqlx::Error) -> StoreError {
        StoreError::from_sqlx(&self.display, e)
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        let migrations = match self.backend() {
            Backend::Sqlite => schema::SQLITE,
            Backend::Postgres => schema::POSTGRES,
        };
        on_pool!(self, p => {
            sqlx::raw_sql(schema::VERSION_TABLE)
                .execute(p)
                .await
                .map_err(|e| self.err(e))?;
            let applied: Option<i64> =
                sqlx::query_scalar("SELECT MAX(version) FROM airlock_schema_migrations")
                    .fetch_one(p)
                    .await
                    .map_err(|e| self.err(e))?;
            let known = migrations.last().map_or(0, |m| m.version);
            if let Some(found) = applied.filter(|v| *v > known) {
                return Err(StoreError::SchemaTooNew { found, known });
            }
            for m in migrations.iter().filter(|m| applied.is_none_or(|a| m.version > a)) {
                let mut tx = p.begin().await.map_err(|e| self.err(e))?;
                let claimed = sqlx::query(
                    "INSERT INTO airlock_schema_migrations (version, description, applied_at) \
                     VALUES ($1, $2, $3)",
                )
                .bind(m.version)
                .bind(m.description)
                .bind(now_ms())
                .execute(&mut *tx)
                .await;
                match claimed {
                    Ok(_) => {}
                    Err(e) if is_unique_violation(&e) => continue, // another process applied it
                    Err(e) => return Err(self.err(e)),
                }
                sqlx::raw_sql(m.sql).execute(&mut *tx).await.map_err(|source| {
                    StoreError::Migration { version: m.version, detail: source.to_string(), source }
                })?;
                tx.commit().await.map_err(|e| self.err(e))?;
                tracing::info!(version = m.version, database = %self.display, "applied migration");
            }
            Ok(())
        })
    }

    /// The schema version in force.
    pub async fn schema_version(&self) -> Result<i64, StoreError> {
        on_pool!(self, p => {
            let v: Option<i64> =
                sqlx::query_scalar("SELECT MAX(version) FROM airlock_schema_migrations")
                    .fetch_one(p)
                    .await
                    .map_err(|e| self.err(e))?;
            Ok(v.unwrap_or(0))
        })
    }

    // ---- connections ----

    /// Stores a new connection. The envelope must be a `v1:` envelope (its kid is recorded so
    /// re-encryption can find what is left to do). Fails if the name is taken.
    pub async fn insert_connection(&self, c: &NewConnection<'_>) -> Result<(), StoreError> {
        let _write = self.connections_write();
        validate_name("connection name", c.name)?;
        validate_name("integration", c.integration)?;
        let kid = Envelope::kid_of(c.envelope).map_err(StoreError::BadEnvelope)?;
        let now = now_ms();
        let res = on_pool!(self, p => {
            sqlx::query(
                "INSERT INTO connections \
                 (name, integration, auth_type, kid, envelope, created_at, updated_at, org_id) \
                 VALUES ($1, $2, $3, $4, $5, $6, $6, $7)",
            )
            .bind(c.name)
            .bind(c.integration)
            .bind(c.auth_type.as_str())
            .bind(kid)
            .bind(c.envelope)
            .bind(now)
            .bind(c.org)
            .execute(p)
            .await
            .map(|_| ())
        });
        match res {
            Err(e) if is_unique_violation(&e) => {
                Err(StoreError::ConnectionExists(c.name.to_owned()))
            }
            other => other.map_err(|e| self.err(e)),
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

    fn connections_write(&self) -> ConnectionsWrite<'_> {
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

    /// Checks that `ring`'s key for `kid` is the key this store's `kid`
    /// envelopes were written with: against the key-check value the store
    /// keeps for `kid`, or — for a store written before it kept them — by
    /// decrypting one of its `kid` envelopes (then the value is kept). A key
    /// id the store has never used passes. [`StoreError::KeyMismatch`] when
    /// the key differs.
    pub async fn check_key(&self, ring: &Keyring, kid: &str) -> Result<(), StoreError> {
        let Some(check) = ring.key_check(kid) else {
            return Ok(());
        };
        let known: Option<String> = on_pool!(self, p => sqlx::query_scalar(
            "SELECT check_value FROM key_checks WHERE kid = $1",
        )
        .bind(kid)
        .fetch_optional(p)
        .await
        .map_err(|e| self.err(e))?);
        if let Some(known) = known {
            return if airlock_vault::ct_eq(known.as_bytes(), check.as_bytes()) {
                Ok(())
            } else {
                Err(StoreError::KeyMismatch {
                    kid: kid.to_owned(),
                })
            };
        }
        let sample: Option<String> = on_pool!(self, p => sqlx::query_scalar(
            "SELECT envelope FROM connections WHERE kid = $1 LIMIT 1",
        )
        .bind(kid)
        .fetch_optional(p)
        .await
        .map_err(|e| self.err(e))?);
        let Some(sample) = sample else {
            return Ok(());
        };
        match ring.decrypt(&sample) {
            Ok(_) => self.keep_key_check(kid, &check).await,
            Err(airlock_vault::VaultError::AuthenticationFailed(_)) => {
                Err(StoreError::KeyMismatch {
                    kid: kid.to_owned(),
                })
            }
            Err(e) => Err(StoreError::BadEnvelope(e)),
        }
    }

    /// [`Store::check_key`] for every key of `ring`.
    pub async fn check_keyring(&self, ring: &Keyring) -> Result<(), StoreError> {
        for kid in ring.kids() {
            self.check_key(ring, kid).await?;
        }
        Ok(())
    }

    /// Before writing envelopes under `ring`'s active key: checks it, and
    /// keeps its key-check value so a different key under the same id is
    /// refused from now on.
    pub async fn record_active_key(&self, ring: &Keyring) -> Result<(), StoreError> {
        let kid = ring.active_kid();
        self.check_key(ring, kid).await?;
        match ring.key_check(kid) {
            Some(check) => self.keep_key_check(kid, &check).await,
            None => Ok(()),
        }
    }

    async fn keep_key_check(&self, kid: &str, check: &str) -> Result<(), StoreError> {
        on_pool!(self, p => sqlx::query(
            "INSERT INTO key_checks (kid, check_value, created_at) VALUES ($1, $2, $3) \
             ON CONFLICT (kid) DO NOTHING",
        )
        .bind(kid)
        .bind(check)
        .bind(now_ms())
        .execute(p)
        .await
        .map(|_| ())
        .map_err(|e| self.err(e)))?;
        // Two writers at once: whichever value won must be this one.
        let kept: Option<String> = on_pool!(self, p => sqlx::query_scalar(
            "SELECT check_value FROM key_checks WHERE kid = $1",
        )
        .bind(kid)
        .fetch_optional(p)
        .await
        .map_err(|e| self.err(e))?);
        match kept {
            Some(k) if k != check => Err(StoreError::KeyMismatch {
                kid: kid.to_owned(),
            }),
            _ => Ok(()),
        }
    }

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
        let active = ring.active_kid();
        let now = now_ms();
        match &self.pool {
            Pool::Sqlite(p) => {
                let mut conn = p.acquire().await.map_err(|e| self.err(e))?;
                // BEGIN IMMEDIATE: take the write lock before reading, so the read and the
                // writes see one snapshot and a second writer waits (busy_timeout) or fails.
                let mut tx = conn
                    .begin_with("BEGIN IMMEDIATE")
                    .await
                    .map_err(|e| self.err(e))?;
                let rows = sqlx::query(
                    "SELECT org_id, name, envelope, org_id || $5 || name AS cursor FROM connections \
                     WHERE (org_id, name) > ($3, $4) AND kid <> $1 \
                     ORDER BY org_id, name LIMIT $2",
                )
                .bind(active)
                .bind(limit)
                .bind(after_org)
                .bind(after_name)
                .bind(CURSOR_SEP)
                .fetch_all(&mut *tx)
                .await
                .map_err(|e| self.err(e))?;
                let mut triples = Vec::with_capacity(rows.len());
                let mut cursor = None;
                for r in &rows {
                    cursor = Some(r.try_get::<String, _>("cursor").map_err(|e| self.err(e))?);
                    let org: String = r.try_get("org_id").map_err(|e| self.err(e))?;
                    let name: String = r.try_get("name").map_err(|e| self.err(e))?;
                    let old: String = r.try_get("envelope").map_err(|e| self.err(e))?;
                    let new = reencrypt_one(ring, &name, &old)?;
                    triples.push([org, name, old, new]);
                }
                let Some(last) = cursor else {
                    tx.commit().await.map_err(|e| self.err(e))?;
                    return Ok(BatchOutcome::default());
                };
                // One statement for the whole batch: the rows go in as one JSON array of
                // [org, name, old envelope, new envelope] (envelopes only: no plaintext);
                // each is found by its primary key.
                let batch_json = serde_json::to_string(&triples)
                    .map_err(|e| StoreError::Corrupt(format!("batch encoding: {e}")))?;
                let res = sqlx::query(
                    "UPDATE connections SET envelope = u.new, kid = $1, updated_at = $2 \
                     FROM (SELECT value ->> 0 AS org, value ->> 1 AS name, value ->> 2 AS old, \
                           value ->> 3 AS new FROM json_each($3)) AS u \
                     WHERE connections.org_id = u.org AND connections.name = u.name \
                     AND connections.envelope = u.old",
                )
                .bind(active)
                .bind(now)
                .bind(&batch_json)
                .execute(&mut *tx)
                .await
                .map_err(|e| self.err(e))?;
                tx.commit().await.map_err(|e| self.err(e))?;
                Ok(BatchOutcome {
                    rewritten: usize::try_from(res.rows_affected()).unwrap_or(0),
                    scanned: triples.len(),
                    last,
                })
            }
            Pool::Postgres(p) => {
                let mut tx = p.begin().await.map_err(|e| self.err(e))?;
                let rows = sqlx::query(
                    "SELECT org_id, name, envelope, org_id || $5 || name AS cursor FROM connections \
                     WHERE (org_id, name) > ($3, $4) AND kid <> $1 \
                     ORDER BY org_id, name LIMIT $2 FOR UPDATE SKIP LOCKED",
                )
                .bind(active)
                .bind(limit)
                .bind(after_org)
                .bind(after_name)
                .bind(CURSOR_SEP)
                .fetch_all(&mut *tx)
                .await
                .map_err(|e| self.err(e))?;
                let mut orgs = Vec::with_capacity(rows.len());
                let mut names = Vec::with_capacity(rows.len());
                let mut olds = Vec::with_capacity(rows.len());
                let mut news = Vec::with_capacity(rows.len());
                let mut cursor = None;
                for r in &rows {
                    cursor = Some(r.try_get::<String, _>("cursor").map_err(|e| self.err(e))?);
                    let name: String = r.try_get("name").map_err(|e| self.err(e))?;
                    let old: String = r.try_get("envelope").map_err(|e| self.err(e))?;
                    news.push(reencrypt_one(ring, &name, &old)?);
                    orgs.push(r.try_get::<String, _>("org_id").map_err(|e| self.err(e))?);
                    names.push(name);
                    olds.push(old);
                }
                let Some(last) = cursor else {
                    return Ok(BatchOutcome::default());
                };
                // One statement for the whole batch.
                let res = sqlx::query(
                    "UPDATE connections AS c SET envelope = u.new, kid = $1, updated_at = $2 \
                     FROM UNNEST($3::text[], $4::text[], $5::text[], $6::text[]) AS u(name, old, new, org) \
                     WHERE c.org_id = u.org AND c.name = u.name AND c.envelope = u.old",
                )
                .bind(active)
                .bind(now)
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
                    scanned: names.len(),
                    last,
                })
            }
        }
    }

    // ---- runs ----

    /// Records a new run (status `queued` unless given).
    pub async fn insert_run(&self, r: &NewRun<'_>) -> Result<(), StoreError> {
        validate_name("run id", r.id)?;
        let res = on_pool!(self, p => {
            sqlx::query(
                "INSERT INTO runs (id, agent, status, backend, model, created_at, org_id, owner) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            )
            .bind(r.id)
            .bind(r.agent)
            .bind(r.status.as_str())
            .bind(r.backend)
            .bind(r.model)
            .bind(r.created_at.unwrap_or_else(now_ms))
            .bind(r.org)
            .bind(r.owner)
            .execute(p)
            .await
            .map(|_| ())
        });
        match res {
            Err(e) if is_unique_violation(&e) => Err(StoreError::RunExists(r.id.to_owned())),
            other => other.map_err(|e| self.err(e)),
        }
    }

    /// Inserts `r` as `running` only while fewer than `max` runs are
    /// `running` in this store (every platform sharing it counts): `false`
    /// when the limit is reached. Counting and inserting are one atomic step
    /// (SQLite: an immediate transaction, which takes the write lock first;
    /// PostgreSQL: a transaction-scoped advisory lock).
    pub async fn insert_run_within_limit(
        &self,
        r: &NewRun<'_>,
        max: u32,
    ) -> Result<bool, StoreError> {
        validate_name("run id", r.id)?;
        let count_sql = "SELECT COUNT(*) FROM runs WHERE status = 'running'";
        let insert_sql = "INSERT INTO runs \
                          (id, agent, status, backend, model, created_at, org_id, owner) \
                          VALUES ($1, $2, 'running', $3, $4, $5, $6, $7)";
        let res: Result<bool, sqlx::Error> = match &self.pool {
            Pool::Sqlite(p) => {
                let mut c = p.acquire().await.map_err(|e| self.err(e))?;
                async {
                    sqlx::query("BEGIN IMMEDIATE").execute(&mut *c).await?;
                    let body = async {
                        let n: i64 = sqlx::query_scalar(count_sql).fetch_one(&mut *c).await?;
                        if n >= i64::from(max) {
                            return Ok(false);
                        }
                        sqlx::query(insert_sql)
                            .bind(r.id)
                            .bind(r.agent)
                            .bind(r.backend)
                            .bind(r.model)
                            .bind(r.created_at.unwrap_or_else(now_ms))
                            .bind(r.org)
                            .bind(r.owner)
                            .execute(&mut *c)
                            .await?;
                        Ok(true)
                    }
                    .await;
                    let end = if matches!(body, Ok(true)) {
                        "COMMIT"
                    } else {
                        "ROLLBACK"
                    };
                    sqlx::query(end).execute(&mut *c).await?;
                    body
                }
                .await
            }
            Pool::Postgres(p) => {
                async {
                    let mut tx = p.begin().await?;
                    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('airlock.run_slots'))")
                        .execute(&mut *tx)
                        .await?;
                    let n: i64 = sqlx::query_scalar(count_sql).fetch_one(&mut *tx).await?;
                    if n >= i64::from(max) {
                        return Ok(false);
                    }
                    sqlx::query(insert_sql)
                        .bind(r.id)
                        .bind(r.agent)
                        .bind(r.backend)
                        .bind(r.model)
                        .bind(r.created_at.unwrap_or_else(now_ms))
                        .bind(r.org)
                        .bind(r.owner)
                        .execute(&mut *tx)
                        .await?;
                    tx.commit().await?;
                    Ok(true)
                }
                .await
            }
        };
        match res {
            Err(e) if is_unique_violation(&e) => Err(StoreError::RunExists(r.id.to_owned())),
            other => other.map_err(|e| self.err(e)),
        }
    }

    /// One run.
    pub async fn get_run(&self, id: &str) -> Result<Option<Run>, StoreError> {
        on_pool!(self, p => {
            let row = sqlx::query(concat!("SELECT ", run_columns!(), " FROM runs WHERE id = $1"))
                .bind(id)
                .fetch_optional(p)
                .await
                .map_err(|e| self.err(e))?;
            row.map(|r| Ok(run_row!(r, self))).transpose()
        })
    }

    /// Runs, newest first, optionally only those with `status`, at most `limit`, created before
    /// `before` (Unix ms) for paging.
    pub async fn list_runs(&self, q: &RunQuery<'_>) -> Result<Vec<Run>, StoreError> {
        let limit = i64::from(q.limit.unwrap_or(100));
        let status = q.status.map(RunStatus::as_str);
        let agent = q.agent;
        let before = q.before.unwrap_or(i64::MAX);
        on_pool!(self, p => {
            let rows = sqlx::query(concat!(
                "SELECT ", run_columns!(), " FROM runs \
                 WHERE ($1 IS NULL OR status = $1) AND ($2 IS NULL OR agent = $2) \
                 AND ($5 IS NULL OR org_id = $5) \
                 AND (created_at < $3 OR (created_at = $3 AND $6 IS NOT NULL AND id < $6)) \
                 ORDER BY created_at DESC, id DESC LIMIT $4"
            ))
            .bind(status)
            .bind(agent)
            .bind(before)
            .bind(limit)
            .bind(q.org)
            .bind(q.before_id)
            .fetch_all(p)
            .await
            .map_err(|e| self.err(e))?;
            rows.iter().map(|r| Ok(run_row!(r, self))).collect()
        })
    }

    /// Marks a run started (status `running`, `started_at`, first heartbeat).
    pub async fn mark_run_started(&self, id: &str, at: i64) -> Result<(), StoreError> {
        // Never a run that has ended (failed by a reclaim, cancelled):
        // marking it `running` again would revive it in name only.
        match self
            .update_run(
                id,
                "UPDATE runs SET status = 'running', started_at = $2, last_heartbeat_at = $2 \
                 WHERE id = $1 AND ended_at IS NULL",
                at,
            )
            .await
        {
            Err(StoreError::RunNotFound(_)) => match self.get_run(id).await? {
                Some(run) => Err(StoreError::RunEnded {
                    id: id.to_owned(),
                    reason: run
                        .error
                        .unwrap_or_else(|| format!("it is {}", run.status.as_str())),
                }),
                None => Err(StoreError::RunNotFound(id.to_owned())),
            },
            other => other,
        }
    }

    /// Records a heartbeat.
    pub async fn record_heartbeat(&self, id: &str, at: i64) -> Result<(), StoreError> {
        self.update_run(
            id,
            "UPDATE runs SET last_heartbeat_at = $2 WHERE id = $1",
            at,
        )
        .await
    }

    async fn update_run(&self, id: &str, sql: &'static str, at: i64) -> Result<(), StoreError> {
        let n = on_pool!(self, p => sqlx::query(sql)
            .bind(id)
            .bind(at)
            .execute(p)
            .await
            .map_err(|e| self.err(e))?
            .rows_affected());
        if n == 0 {
            return Err(StoreError::RunNotFound(id.to_owned()));
        }
        Ok(())
    }

    /// Ends a run: final status, exit code, error, end time. A run already ended is left as
    /// it is (`false`).
    ///
    /// The webhook deliveries the end owes (its organization's webhooks
    /// subscribed to its event) are queued in the same transaction: an end
    /// is never stored without them, whoever records it.
    pub async fn finish_run(&self, id: &str, end: &RunEnd<'_>) -> Result<bool, StoreError> {
        let ended = self.end_run(id, end).await?;
        if !ended && self.get_run(id).await?.is_none() {
            return Err(StoreError::RunNotFound(id.to_owned()));
        }
        Ok(ended)
    }

    /// Ends a run as `failed` now, with `reason` (the one place a run that
    /// never got going, or whose platform is gone, is failed). `false` if it
    /// had already ended.
    pub async fn fail_run(&self, id: &str, reason: &str) -> Result<bool, StoreError> {
        self.finish_run(
            id,
            &RunEnd {
                status: RunStatus::Failed,
                exit_code: None,
                error: Some(reason),
                at: now_ms(),
            },
        )
        .await
    }

    /// Adds metered usage to a run's totals.
    pub async fn add_run_usage(&self, id: &str, u: &Usage) -> Result<(), StoreError> {
        let n = on_pool!(self, p => sqlx::query(
            "UPDATE runs SET tokens_in = tokens_in + $2, tokens_out = tokens_out + $3, \
             cost_microusd = cost_microusd + $4 WHERE id = $1",
        )
        .bind(id)
        .bind(u.tokens_in)
        .bind(u.tokens_out)
        .bind(u.cost_microusd)
        .execute(p)
        .await
        .map_err(|e| self.err(e))?
        .rows_affected());
        if n == 0 {
            return Err(StoreError::RunNotFound(id.to_owned()));
        }
        Ok(())
    }

    // ---- run events ----

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
                        sqlx::query(
                            "UPDATE runs SET tokens_in = tokens_in + $2, tokens_out = tokens_out + $3, \
                             cost_microusd = cost_microusd + $4 WHERE id = $1",
                        )
                        .bind(run_id)
                        .bind(u.tokens_in)
                        .bind(u.tokens_out)
                        .bind(u.cost_microusd)
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
        on_pool!(self, p => {
            let rows = sqlx::query(
                "SELECT id, run_id, at, kind, payload FROM run_events \
                 WHERE run_id = $1 AND kind = $2 ORDER BY id LIMIT $3",
            )
            .bind(run_id)
            .bind(kind)
            .bind(i64::from(limit))
            .fetch_all(p)
            .await
            .map_err(|e| self.err(e))?;
            rows.iter()
                .map(|r| {
                    Ok(event_row!(r, self))
                })
                .collect()
        })
    }

    /// A run's events with id greater than `after`, oldest first, at most `limit`.
    pub async fn list_events(
        &self,
        run_id: &str,
        after: i64,
        limit: u32,
    ) -> Result<Vec<Event>, StoreError> {
        on_pool!(self, p => {
            let rows = sqlx::query(
                "SELECT id, run_id, at, kind, payload FROM run_events \
                 WHERE run_id = $1 AND id > $2 ORDER BY id LIMIT $3",
            )
            .bind(run_id)
            .bind(after)
            .bind(i64::from(limit))
            .fetch_all(p)
            .await
            .map_err(|e| self.err(e))?;
            rows.iter()
                .map(|r| {
                    Ok(event_row!(r, self))
                })
                .collect()
        })
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

    // ---- egress log ----

    /// Appends one outbound request to its run's log, or, when `e.seq` names
    /// a request already logged, completes it (see [`NewEgress`]). Returns
    /// the row id.
    pub async fn append_egress(&self, e: &NewEgress<'_>) -> Result<i64, StoreError> {
        let inserted: Option<i64> = on_pool!(self, p => bind_egress!(sqlx::query_scalar(
            concat!(
                "INSERT INTO egress_log ",
                egress_columns!(),
                " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)",
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
        on_pool!(self, p => {
            let rows = sqlx::query(
                "SELECT id, run_id, at, source, integration, method, url, host, decision, \
                 reason, status, duration_ms, bytes_out, bytes_in, seq, outcome, metering \
                 FROM egress_log WHERE run_id = $1 ORDER BY id \
                 LIMIT $2",
            )
            .bind(run_id)
            .bind(i64::from(limit))
            .fetch_all(p)
            .await
            .map_err(|e| self.err(e))?;
            rows.iter()
                .map(|r| {
                    let decision: String = r.try_get("decision").map_err(|e| self.err(e))?;
                    let outcome: Option<String> = r.try_get("outcome").map_err(|e| self.err(e))?;
                    let metering: Option<String> = r.try_get("metering").map_err(|e| self.err(e))?;
                    Ok(EgressEntry {
                        id: r.try_get("id").map_err(|e| self.err(e))?,
                        run_id: r.try_get("run_id").map_err(|e| self.err(e))?,
                        at: r.try_get("at").map_err(|e| self.err(e))?,
                        source: r.try_get("source").map_err(|e| self.err(e))?,
                        integration: r.try_get("integration").map_err(|e| self.err(e))?,
                        method: r.try_get("method").map_err(|e| self.err(e))?,
                        url: r.try_get("url").map_err(|e| self.err(e))?,
                        host: r.try_get("host").map_err(|e| self.err(e))?,
                        decision: EgressDecision::parse(&decision)
                            .ok_or_else(|| StoreError::Corrupt(format!("egress decision {decision:?}")))?,
                        reason: r.try_get("reason").map_err(|e| self.err(e))?,
                        status: r.try_get("status").map_err(|e| self.err(e))?,
                        duration_ms: r.try_get("duration_ms").map_err(|e| self.err(e))?,
                        bytes_out: r.try_get("bytes_out").map_err(|e| self.err(e))?,
                        bytes_in: r.try_get("bytes_in").map_err(|e| self.err(e))?,
                        seq: r.try_get("seq").map_err(|e| self.err(e))?,
                        outcome: outcome
                            .map(|o| EgressOutcome::parse(&o)
                                .ok_or_else(|| StoreError::Corrupt(format!("egress outcome {o:?}"))))
                            .transpose()?,
                        metering: metering
                            .map(|m| EgressMetering::parse(&m)
                                .ok_or_else(|| StoreError::Corrupt(format!("egress metering {m:?}"))))
                            .transpose()?,
                    })
                })
                .collect()
        })
    }

    // ---- memories ----

    /// Stores a memory for an agent.
    pub async fn add_memory(
        &self,
        org: &str,
        agent: &str,
        run_id: Option<&str>,
        content: &str,
    ) -> Result<i64, StoreError> {
        on_pool!(self, p => sqlx::query_scalar(
            "INSERT INTO memories (agent, run_id, content, created_at, org_id) \
             VALUES ($1, $2, $3, $4, $5) RETURNING id",
        )
        .bind(agent)
        .bind(run_id)
        .bind(content)
        .bind(now_ms())
        .bind(org)
        .fetch_all(p)
        .await
        .map_err(|e| self.err(e)))
        .and_then(returned_id)
    }

    /// An agent's memories, newest first.
    pub async fn list_memories(
        &self,
        org: &str,
        agent: &str,
        limit: u32,
    ) -> Result<Vec<Memory>, StoreError> {
        on_pool!(self, p => {
            let rows = sqlx::query(
                "SELECT id, agent, run_id, content, created_at FROM memories \
                 WHERE agent = $1 AND org_id = $3 ORDER BY id DESC LIMIT $2",
            )
            .bind(agent)
            .bind(i64::from(limit))
            .bind(org)
            .fetch_all(p)
            .await
            .map_err(|e| self.err(e))?;
            rows.iter()
                .map(|r| {
                    Ok(Memory {
                        id: r.try_get("id").map_err(|e| self.err(e))?,
                        agent: r.try_get("agent").map_err(|e| self.err(e))?,
                        run_id: r.try_get("run_id").map_err(|e| self.err(e))?,
                        content: r.try_get("content").map_err(|e| self.err(e))?,
                        created_at: r.try_get("created_at").map_err(|e| self.err(e))?,
                    })
                })
                .collect()
        })
    }

    // ---- stored results ----

    /// Stores a large result body for a run under `id`.
    pub async fn put_result(
        &self,
        run_id: &str,
        id: &str,
        content_type: &str,
        body: &[u8],
    ) -> Result<(), StoreError> {
        validate_name("result id", id)?;
        let res = on_pool!(self, p => sqlx::query(
            "INSERT INTO results (run_id, id, content_type, body, created_at) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(run_id)
        .bind(id)
        .bind(content_type)
        .bind(body)
        .bind(now_ms())
        .execute(p)
        .await
        .map(|_| ()));
        match res {
            Err(e) if is_unique_violation(&e) => Err(StoreError::ResultExists {
                run_id: run_id.to_owned(),
                id: id.to_owned(),
            }),
            other => other.map_err(|e| self.run_fk(e, run_id)),
        }
    }

    /// A stored result, only for the run that stored it.
    pub async fn get_result(
        &self,
        run_id: &str,
        id: &str,
    ) -> Result<Option<StoredResult>, StoreError> {
        on_pool!(self, p => {
            let row = sqlx::query(
                "SELECT content_type, body, created_at FROM results WHERE run_id = $1 AND id = $2",
            )
            .bind(run_id)
            .bind(id)
            .fetch_optional(p)
            .await
            .map_err(|e| self.err(e))?;
            row.map(|r| {
                Ok(StoredResult {
                    run_id: run_id.to_owned(),
                    id: id.to_owned(),
                    content_type: r.try_get("content_type").map_err(|e| self.err(e))?,
                    body: r.try_get("body").map_err(|e| self.err(e))?,
                    created_at: r.try_get("created_at").map_err(|e| self.err(e))?,
                })
            })
            .transpose()
        })
    }

    /// Total bytes of results stored for a run (for per-run caps).
    pub async fn result_bytes(&self, run_id: &str) -> Result<u64, StoreError> {
        on_pool!(self, p => {
            let n: Option<i64> = sqlx::query_scalar(
                "SELECT CAST(SUM(LENGTH(body)) AS BIGINT) FROM results WHERE run_id = $1",
            )
            .bind(run_id)
            .fetch_one(p)
            .await
            .map_err(|e| self.err(e))?;
            Ok(n.and_then(|n| u64::try_from(n).ok()).unwrap_or(0))
        })
    }

    fn run_fk(&self, e: sqlx::Error, run_id: &str) -> StoreError {
        if e.as_database_error()
            .is_some_and(|d| d.is_foreign_key_violation())
        {
            StoreError::RunNotFound(run_id.to_owned())
        } else {
            self.err(e)
        }
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

/// The id an `INSERT … RETURNING id` gave back. Such a statement is always
/// read with `fetch_all`, never `fetch_one`: SQLite commits a statement
/// outside a transaction only when it is stepped to its end, and a commit
/// that fails there (a full disk) is reported only to a reader that gets
/// that far; `fetch_one` stops at the row and reports a write that was
/// rolled back as done.
fn returned_id(ids: Vec<i64>) -> Result<i64, StoreError> {
    ids.into_iter()
        .next()
        .ok_or_else(|| StoreError::Corrupt("an INSERT … RETURNING returned no row".into()))
}

fn is_unique_violation(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .is_some_and(|d| d.is_unique_violation())
}

/// Largest SQLite store checked in full before it is used ([`Store::open_sqlite`]).
pub const QUICK_CHECK_MAX_BYTES: u64 = 64 << 20;

/// Names (connections, integrations, run ids, result ids): 1–128 printable characters, no
/// control characters.
fn validate_name(what: &'static str, v: &str) -> Result<(), StoreError> {
    if v.is_empty() || v.chars().count() > 128 || v.chars().any(char::is_control) {
        return Err(StoreError::Invalid {
            what,
            reason: "must be 1-128 characters with no control characters",
        });
    }
    Ok(())
}

fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt as _;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
    }
    #[cfg(not(unix))]
    std::fs::create_dir_all(dir)
}

fn create_private_file(path: &Path) -> std::io::Result<()> {
    // Never open an existing database file here: closing any descriptor of a file drops every
    // POSIX lock this process holds on it, which would break SQLite's locking for connections
    // still open (or closing) in this process.
    if path.exists() {
        return Ok(());
    }
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        o.mode(0o600);
    }
    match o.open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}
