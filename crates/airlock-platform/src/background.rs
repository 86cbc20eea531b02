//! Where the platform's work that no request waits for runs: a live run's
//! egress journal followed into the store ([`crate::journal::Follower`]).
//!
//! It runs on one thread of its own, `airlock-bg`, with a runtime of its
//! own, at the lowest CPU priority ([`NICE`]). On the runtime that answers
//! the sidecars, a read of a busy journal (parsing ~150 records, ~0.35 ms)
//! held a worker while a credential fetch that came in waited behind it: at
//! 2000 sequential credentialed `api_call`s, the slowest 1 % were the calls
//! made during such reads.
//!
//! Work here must never hold what others wait for across an await: this
//! thread may wait long for a CPU on a busy host. Its writes hold the
//! store's write lock one statement at a time
//! ([`airlock_store::BatchWrite::ByStatement`]).

use std::future::Future;
use std::sync::OnceLock;

use tokio::runtime::Handle;
use tokio::task::JoinHandle;

/// The name of the background thread.
pub const THREAD: &str = "airlock-bg";

/// The background thread's nice value (the lowest priority).
pub const NICE: i32 = 19;

/// Gives the calling thread background priority. (On Linux a nice value is
/// a thread's own, not its process's.)
fn lower_this_thread() -> std::io::Result<()> {
    rustix::process::setpriority_process(None, NICE)?;
    Ok(())
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
mod tests {
    use super::*;

    /// Background work runs on the background thread, at background
    /// priority, and the runtime it was spawned from keeps its own.
    #[tokio::test]
    async fn work_runs_on_the_background_thread_at_its_priority() {
        let here = rustix::process::getpriority_process(None).unwrap();
        assert_eq!(here, 0, "the test's own thread runs at the usual priority");
        let (name, nice) = spawn(async {
            (
                std::thread::current().name().map(str::to_owned),
                rustix::process::getpriority_process(None).unwrap(),
            )
        })
        .await
        .unwrap();
        assert_eq!(name.as_deref(), Some(THREAD));
        assert_eq!(nice, NICE);
        assert_eq!(rustix::process::getpriority_process(None).unwrap(), 0);
    }
}
