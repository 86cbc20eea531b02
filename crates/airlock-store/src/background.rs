//! Work that no request waits for, and how it gives way to the work that
//! requests wait for: its threads run at the lowest CPU priority, [`NICE`].
//!
//! Egress records of a busy run are stored in batches of ~150 every 50 ms
//! (`airlock_platform::journal`), a few milliseconds of CPU each. Done
//! beside the requests of the runs, at their priority, each batch held up
//! the answers around it: a credentialed `api_call` came back 0.5 ms late
//! every 50 ms. The platform runs that work on a thread of its own at this
//! priority, and [`crate::Store::background`] gives it a connection whose
//! SQLite thread runs at it too.
//!
//! A nice value, not `SCHED_IDLE`: a background write holds SQLite's write
//! lock while it runs, and a thread at nice 19 still gets a share of a
//! saturated CPU, so a writer waiting behind it waits for a while, not
//! forever.

use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};

use crate::StoreOptions;

/// The nice value of background work's threads (the lowest priority).
pub const NICE: i32 = 19;

/// Gives the calling thread background priority. (On Linux a nice value is
/// a thread's own, not its process's.)
pub fn lower_this_thread() -> std::io::Result<()> {
    rustix::process::setpriority_process(None, NICE)?;
    Ok(())
}

/// The name of the SQLite thread of [`crate::Store::background`]'s
/// connection: `airlock-bgdb-N`.
pub const SQLITE_THREAD_PREFIX: &str = "airlock-bgdb-";

/// The pool of [`crate::Store::background`]: one connection, opened when
/// first used, whose SQLite thread lowers its own priority.
pub(crate) fn sqlite_pool(connect: SqliteConnectOptions, opts: &StoreOptions) -> SqlitePool {
    SqlitePoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        .acquire_timeout(opts.acquire_timeout)
        .after_connect(|conn, _| Box::pin(lower_sqlite_thread(conn)))
        .connect_lazy_with(connect.thread_name(|n| format!("{SQLITE_THREAD_PREFIX}{n}")))
}

/// Lowers the priority of `conn`'s SQLite thread from inside it: SQLite
/// calls a progress handler on the thread that runs the statement, so one
/// statement run with a handler set runs [`lower_this_thread`] there.
async fn lower_sqlite_thread(conn: &mut sqlx::SqliteConnection) -> Result<(), sqlx::Error> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let mut tx = Some(tx);
    conn.lock_handle().await?.set_progress_handler(1, move || {
        if let Some(tx) = tx.take() {
            let _ = tx.send(lower_this_thread());
        }
        true
    });
    let ran = sqlx::query("SELECT 1").execute(&mut *conn).await;
    conn.lock_handle().await?.remove_progress_handler();
    ran?;
    // Work done at the usual priority is slower for the rest, not wrong.
    match rx.try_recv() {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!("store: the background connection keeps its priority: {e}"),
        Err(_) => tracing::warn!("store: the background connection keeps its priority"),
    }
    Ok(())
}
