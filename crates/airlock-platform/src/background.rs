//! Where the platform's work that no request waits for runs: a live run's
//! egress journal followed into the store ([`crate::journal::Follower`]).
//!
//! It runs on one thread of its own, `airlock-bg`, with a runtime of its
//! own, under `SCHED_IDLE` (and at [`NICE`]). On the runtime that answers
//! the sidecars, a read of a busy journal (parsing ~150 records, ~0.35 ms)
//! held a worker while a credential fetch that came in waited behind it: at
//! 2000 sequential credentialed `api_call`s, the slowest 1 % were the calls
//! made during such reads. At nice 19 alone the thread still ran each
//! parse to its end before a woken request thread got its CPU (the
//! scheduler lets a running task finish its slice whatever its nice value);
//! a `SCHED_IDLE` task gives its CPU up the moment any other task wakes.
//!
//! Its writes to the store go through the store's own connection
//! ([`airlock_store::Store::own_connection`]), opened from this thread, never
//! through the shared pool. Each SQLite connection is a thread (sqlx's
//! worker), which takes the scheduling policy of the thread that starts
//! it: the own connection's thread (`sqlx-sqlite-own`) runs at idle
//! priority too, so storing a busy run's records gives way to every
//! request on the host. Stored at normal priority (on the platform's
//! runtime), each read's statements held a CPU for ~1–3 ms every 50 ms,
//! and every process on the host felt it: the nginx hop beside a bench's
//! sidecar had its added p99 double. But a pooled connection opened from
//! here would serve every later query of the process, foreground ones
//! too, at idle priority (seen: three of a bench's five SQLite threads
//! ran `SCHED_IDLE`): nothing here may call the shared pool.
//!
//! The price: while the own connection runs a statement it holds the
//! database's write lock, and on a host whose CPUs are all busy it runs
//! only in their idle time (or at a tiny weight against each busy thread).
//! A foreground writer then waits for that statement, up to the store's
//! busy timeout (5 s by default); a statement is at most 64 rows (~0.25 ms
//! of work). Measured with four spinning threads on this 2-CPU host while
//! the background stored 20,000 records: the foreground's single-row
//! writes took p50 0.2 ms, at most 16 ms. And work here falls behind on
//! such a host (those 20,000 records took 134 s, 0.15 s on an idle host):
//! a live run's egress log reaches the store late there, and whole when
//! the run ends ([`crate::journal::Follower::finish`] stores the rest at
//! normal priority). Reading and parsing the journal here always had that
//! lag; storing adds to the work that waits.
//!
//! Work here must never hold what others wait for across an await
//! otherwise.

use std::future::Future;
use std::sync::OnceLock;

use tokio::runtime::Handle;
use tokio::task::JoinHandle;

/// The name of the background thread.
pub const THREAD: &str = "airlock-bg";

/// The background thread's nice value (the lowest), for a kernel that
/// ignores `SCHED_IDLE`.
pub const NICE: i32 = 19;

/// Gives the calling thread background priority: `SCHED_IDLE`, at
/// [`NICE`]. (On Linux both are a thread's own, not its process's.)
fn lower_this_thread() -> std::io::Result<()> {
    use thread_priority::{
        NormalThreadSchedulePolicy, ThreadPriority, ThreadSchedulePolicy,
        set_thread_priority_and_policy, thread_native_id,
    };
    let idle = set_thread_priority_and_policy(
        thread_native_id(),
        ThreadPriority::Min,
        ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Idle),
    )
    .map_err(|e| std::io::Error::other(format!("SCHED_IDLE: {e}")));
    // The nice value even where SCHED_IDLE was refused.
    rustix::process::setpriority_process(None, NICE)?;
    idle
}

/// Runs `work` on the background thread (on the current runtime should
/// that thread not start).
pub fn spawn<F>(work: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    match runtime() {
        Some(bg) => bg.spawn(work),
        None => tokio::spawn(work),
    }
}

/// The background runtime, started on first use; it lives as long as the
/// process.
fn runtime() -> Option<&'static Handle> {
    static RUNTIME: OnceLock<Option<Handle>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| match start() {
            Ok(handle) => Some(handle),
            Err(e) => {
                tracing::warn!("no background thread ({e}): background work shares the runtime");
                None
            }
        })
        .as_ref()
}

fn start() -> std::io::Result<Handle> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name(THREAD.to_owned())
        .spawn(move || {
            if let Err(e) = lower_this_thread() {
                tracing::warn!("the background thread keeps its priority: {e}");
            }
            match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => {
                    let _ = tx.send(Ok(rt.handle().clone()));
                    rt.block_on(std::future::pending::<()>());
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            }
        })?;
    rx.recv()
        .map_err(|_| std::io::Error::other("the background thread ended"))?
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) const SCHED_IDLE: u32 = 5;

    /// Held by every test that reads the priorities of this process's
    /// threads ([`threads`]): the control below opens pooled connections at
    /// idle priority on purpose, which another such test running at the
    /// same moment would see as its own (as CI's did).
    pub(crate) static THREAD_PRIORITIES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    /// (policy, nice value) of a thread at the priority this test process
    /// was started with: the normal policy, and whatever nice value the
    /// test runner was given (`nice cargo test` must not fail these tests).
    /// Call it from a test's own thread.
    pub(crate) fn normal() -> (u32, i32) {
        (0, rustix::process::getpriority_process(None).unwrap())
    }

    /// (scheduling policy, nice value) of each of this process's threads
    /// whose name starts with `prefix`, from `/proc/self/task`.
    pub(crate) fn threads(prefix: &str) -> Vec<(u32, i32)> {
        let mut out = Vec::new();
        for task in std::fs::read_dir("/proc/self/task").unwrap() {
            let dir = task.unwrap().path();
            let Ok(stat) = std::fs::read_to_string(dir.join("stat")) else {
                continue; // the thread has ended
            };
            let (head, rest) = stat.rsplit_once(") ").unwrap();
            let name = &head[head.find('(').unwrap() + 1..];
            if !name.starts_with(prefix) {
                continue;
            }
            // `rest` starts at field 3 (state): nice is field 19, policy 41.
            let fields: Vec<&str> = rest.split_whitespace().collect();
            out.push((fields[38].parse().unwrap(), fields[16].parse().unwrap()));
        }
        out
    }

    fn this_thread() -> (Option<String>, u32, i32) {
        let policy = match thread_priority::thread_schedule_policy().unwrap() {
            thread_priority::ThreadSchedulePolicy::Normal(
                thread_priority::NormalThreadSchedulePolicy::Idle,
            ) => SCHED_IDLE,
            _ => 0,
        };
        (
            std::thread::current().name().map(str::to_owned),
            policy,
            rustix::process::getpriority_process(None).unwrap(),
        )
    }

    /// Background work runs on the background thread, at idle priority;
    /// the thread that spawned it keeps its own.
    #[tokio::test]
    async fn work_runs_on_the_background_thread_at_idle_priority() {
        let here = this_thread();
        assert_eq!(
            (here.1, here.2),
            normal(),
            "the test's thread runs as usual"
        );
        let bg = spawn(async { this_thread() }).await.unwrap();
        assert_eq!(bg, (Some(THREAD.to_owned()), SCHED_IDLE, NICE));
        assert_eq!(this_thread(), here);
    }

    /// The attack on priority: background work writes to the store while
    /// the foreground opens pooled connections before and after. Its
    /// writes go through the store's own connection, whose thread runs at
    /// idle priority; every pooled connection's thread stays at normal
    /// priority. Calling the shared pool from the background thread (the
    /// control, showing this test sees the hazard) would make pooled
    /// connections inherit idle priority.
    #[tokio::test]
    async fn background_writes_run_at_idle_priority_and_never_lend_it_to_the_pool() {
        use airlock_store::{OWN_CONNECTION_THREAD, Store, StoreOptions};
        async fn five_at_once(store: &Store) {
            let q = || store.get_run("run_none");
            let (a, b, c, d, e) = tokio::join!(q(), q(), q(), q(), q());
            for r in [a, b, c, d, e] {
                assert!(r.unwrap().is_none());
            }
        }
        let _alone = THREAD_PRIORITIES.lock().await;
        let normal = normal();
        let dir = tempfile::tempdir().unwrap();
        let opts = StoreOptions::default();
        let store = Store::open_sqlite(&dir.path().join("fg.db"), &opts)
            .await
            .unwrap();
        five_at_once(&store).await;
        let s = store.clone();
        spawn(async move {
            let own = s.own_connection().await.unwrap();
            five_at_once(&own).await;
            five_at_once(&s.own_connection().await.unwrap()).await;
        })
        .await
        .unwrap();
        five_at_once(&store).await;
        let own = threads(OWN_CONNECTION_THREAD);
        assert!(
            own.contains(&(SCHED_IDLE, NICE)),
            "the own connection opened from the background thread runs at its priority: {own:?}"
        );
        let workers = threads("sqlx-sqlite-wor");
        assert!(!workers.is_empty(), "the store's connections are threads");
        assert!(
            workers.iter().all(|w| *w == normal),
            "every pooled connection's thread at normal priority: {workers:?}"
        );
        store.close().await;

        let control = Store::open_sqlite(&dir.path().join("bg.db"), &opts)
            .await
            .unwrap();
        let c = control.clone();
        spawn(async move { five_at_once(&c).await }).await.unwrap();
        let inherited = threads("sqlx-sqlite")
            .into_iter()
            .filter(|w| *w == (SCHED_IDLE, NICE))
            .count();
        control.close().await;
        assert!(
            inherited > 0,
            "connections opened on the background thread run at its priority"
        );
    }
}
