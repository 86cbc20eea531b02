//! `airlock-store`: the platform's state.
//!
//! SQLite by default (`$AIRLOCK_HOME/airlock.db`, WAL), PostgreSQL when
//! `DATABASE_URL=postgres://…`. Migrations run at [`Store::open`]. Every query is written once
//! (`$n` placeholders, which both backends accept) and dispatched to the backend's own pool, so
//! both get their native types and the same test suite runs on both.
//!
//! This file holds the [`Store`] handle: opening, the pools, the backend
//! dispatch (`on_pool!`) and the helpers every table's queries share. Each
//! table's (or close group of tables') reads and writes are an `impl Store`
//! block in a module of their own, whose opening comment says what it keeps
//! and what bounds it:
//!
//! - the embedded platform's and every run's: `connections.rs` (encrypted
//!   credentials: only envelopes are stored), `key_checks.rs`, `reencrypt.rs`,
//!   `runs.rs`, `usage.rs` (a run's metered totals), `events.rs` (`run_events`),
//!   `egress.rs` (`egress_log`), `memories.rs`, `results.rs`;
//! - what `airlock serve` adds: `orgs.rs`, `api_keys.rs`, `agents.rs`, `queue.rs`
//!   (the run queue shared by every replica), `replicas.rs` (and the leader
//!   lease), `webhooks.rs`, `deliveries.rs`, `outbox.rs` (a run's end with the
//!   deliveries it owes), `budgets.rs` (organizations' budgets and spend),
//!   `thresholds.rs` (the budget thresholds crossed, with their deliveries);
//! - `schema.rs` (migrations) and `retention.rs` (what is kept, for how long,
//!   and the organizations' quotas).
//!
//! Contracts that hold in every module: every row an organization owns
//! carries its `org_id`, and every query that reads or changes such a row
//! names the organization (an id guessed from another organization finds
//! nothing); every write has a bound, named in its module's comment.
//! Timestamps are Unix milliseconds (`i64`).

#![forbid(unsafe_code)]

mod error;
mod model;

use std::path::{Path, PathBuf};
use std::str::FromStr as _;
use std::time::Duration;

use sqlx::Connection as _;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

pub use artifacts::{ArtifactBody, ArtifactCaps, ArtifactRow};
pub use error::{Chain, StoreError};
pub use model::*;

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
            $crate::Pool::Sqlite($p) => $body,
            $crate::Pool::Postgres($p) => $body,
        }
    };
}

/// Inside [`on_pool!`]: a transaction on `$p` that, on PostgreSQL, holds
/// the advisory lock of `$key` until it ends, so that writes which count
/// an organization's rows before they add one are serialised (SQLite has
/// one writer at a time anyway). Evaluates to `Result<Transaction, sqlx::Error>`.
macro_rules! locked_tx {
    ($self:expr, $p:ident, $key:expr) => {
        async {
            let mut tx = $p.begin().await?;
            if matches!($self.pool, $crate::Pool::Postgres(_)) {
                sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
                    .bind($key)
                    .execute(&mut *tx)
                    .await?;
            }
            Ok::<_, sqlx::Error>(tx)
        }
    };
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

// After the macros above, which they use.
mod agents;
mod api_keys;
mod approval_hooks;
mod approvals;
mod artifacts;
mod audit;
mod budgets;
mod connections;
mod deliveries;
mod egress;
mod events;
mod key_checks;
mod memories;
mod orgs;
mod outbox;
mod policy;
mod queue;
mod reencrypt;
mod replicas;
mod results;
mod retention;
mod runs;
mod schema;
mod thresholds;
mod usage;
mod webhooks;

pub use agents::AgentRow;
pub use api_keys::{ApiKeyRow, MAX_REVOKED_KEYS};
pub use approval_hooks::{APPROVAL_PENDING_EVENT, APPROVAL_SETTLED_EVENT};
pub use approvals::{ApprovalRow, ApprovalState, MAX_APPROVALS_PER_RUN, NewApproval};
pub use audit::{AUDIT_EVENT_KINDS, AuditCursor, AuditEntry, AuditPage};
pub use budgets::{
    BudgetLimits, Charge, Measure, OrgBudget, Period, PeriodSpend, Periods, Reservation,
};
pub use deliveries::{DeliveryAttempt, DeliveryRow};
pub use egress::{BatchWrite, EGRESS_BATCH_ROWS};
pub use memories::{MAX_MEMORIES_PER_AGENT, MAX_MEMORY_BYTES};
pub use orgs::Organization;
pub use outbox::{new_delivery_id, run_event};
pub use policy::{MAX_POLICY_CHANGES, PolicyRow};
pub use queue::{CancelOutcome, ClaimedRun, NewQueuedRun};
pub use replicas::{REPLICA_GONE, Sweep};
pub use retention::*;
pub use thresholds::{
    BudgetKind, CROSSINGS_KEPT_DAYS, Crossing, MAX_THRESHOLDS, THRESHOLD_EVENT, Thresholds,
    ThresholdsError,
};
pub use webhooks::WebhookRow;

/// Which database a store talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A SQLite file.
    Sqlite,
    /// A PostgreSQL server.
    Postgres,
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
    /// Moved by every live policy change and sidecar report made through
    /// this handle or a clone ([`Store::policy_watch`]).
    policy_writes: std::sync::Arc<tokio::sync::watch::Sender<u64>>,
    /// [`Store::own_connection`], once opened: shared by every clone.
    own: std::sync::Arc<tokio::sync::OnceCell<Store>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("database", &self.display)
            .finish()
    }
}

/// Current time in Unix milliseconds: the contract crate's clock.
pub use airlock_platform_api::clock::now_ms;

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
        let opening = OpenLock::take(path, opts.busy_timeout, &display).await?;
        // Every connection's settings: none of them writes to a store that
        // exists (WAL is recorded in the file once; saying it again only
        // reads it), so a reader never waits for a busy writer.
        let connect = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(false)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(opts.busy_timeout)
            .foreign_keys(true);
        // Space a sweep frees goes back to the file system: a new (empty)
        // file is made `auto_vacuum = INCREMENTAL` by one connection, before
        // its first page (a store created before this setting keeps its
        // mode until VACUUM). Not a setting of every connection: saying it
        // to a store that has pages is a write transaction (SQLite records
        // the mode again), which made every reader that opened the store —
        // `airlock runs logs` beside a run printing fast — wait for the
        // writer's lock and fail after the busy timeout.
        if std::fs::metadata(path).map(|m| m.len()).unwrap_or(0) == 0 {
            let first = connect
                .clone()
                .auto_vacuum(sqlx::sqlite::SqliteAutoVacuum::Incremental);
            let c = sqlx::SqliteConnection::connect_with(&first)
                .await
                .map_err(|e| StoreError::from_sqlx(&display, e))?;
            c.close()
                .await
                .map_err(|e| StoreError::from_sqlx(&display, e))?;
        }
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
            policy_writes: std::sync::Arc::new(tokio::sync::watch::channel(0).0),
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
        drop(opening);
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
            policy_writes: std::sync::Arc::new(tokio::sync::watch::channel(0).0),
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
                    policy_writes: self.policy_writes.clone(),
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
            policy_writes: self.policy_writes.clone(),
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

/// The id an `INSERT … RETURNING id` gave back. Such a statement is always
/// read with `fetch_all`, never `fetch_one`: SQLite commits a statement
/// outside a transaction only when it is stepped to its end, and a commit
/// that fails there (a full disk) is reported only to a reader that gets
/// that far; `fetch_one` stops at the row and reports a write that was
/// rolled back as done.
fn returned_id(ids: Vec<i64>) -> Result<i64, StoreError> {
    ids.into_iter().next().ok_or(StoreError::NoRowReturned)
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

/// Held while a process opens a SQLite store (its first connection's
/// settings, its check, its migrations), so that the first opens of a new
/// file are one process's after another's. Without it, processes that
/// opened one new store at once (`airlock run` started four times in one
/// shell line) failed now and then with "locked": SQLite answers BUSY at
/// once, without its busy wait, to a change of journal mode and to a
/// migration that read before it wrote. An advisory lock (`flock`) on a
/// file of its own beside the database, never on the database (closing any
/// descriptor of that drops this process's POSIX locks on it, SQLite's);
/// released when dropped, or when the process dies.
struct OpenLock {
    _held: std::fs::File,
}

impl OpenLock {
    /// The lock file of the database at `path`.
    fn path_of(path: &Path) -> PathBuf {
        let mut name = path.as_os_str().to_owned();
        name.push(".open-lock");
        PathBuf::from(name)
    }

    /// Takes the lock of the database at `path`, waiting for another
    /// process's open up to `wait` (the store's busy timeout): past it,
    /// [`StoreError::Locked`].
    async fn take(path: &Path, wait: Duration, display: &str) -> Result<OpenLock, StoreError> {
        let lock_path = Self::path_of(path);
        let mut o = std::fs::OpenOptions::new();
        o.read(true).write(true).create(true).truncate(false);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt as _;
            o.mode(0o600);
        }
        let io = |source| StoreError::Io {
            path: lock_path.display().to_string(),
            source,
        };
        let file = o.open(&lock_path).map_err(io)?;
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(OpenLock { _held: file }),
                Err(std::fs::TryLockError::WouldBlock)
                    if tokio::time::Instant::now() < deadline =>
                {
                    // Another process's open takes milliseconds: polled,
                    // as SQLite's own busy wait polls its locks.
                    tokio::time::sleep(OPEN_LOCK_POLL).await;
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(StoreError::Locked(display.to_owned()));
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
            }
        }
    }
}

/// How often a process waiting for another's open of the store looks again.
const OPEN_LOCK_POLL: Duration = Duration::from_millis(5);

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
