//! This replica's share of the work.
//!
//! - It registers in the store's replica set and heartbeats every fifth of
//!   the lease (through a pool of its own, each attempt bounded by that
//!   interval). A heartbeat that finds its row gone means the leader judged
//!   it dead (a pause or a partition longer than the lease): it registers
//!   again under its own id and reconciles ([`reconcile`]) instead of
//!   exiting: runs the store has meanwhile ended elsewhere are stopped
//!   here, the others go on.
//! - Whoever holds the `leader` lease (taken over once its holder stops
//!   renewing it) sweeps ([`airlock_platform::orchestrator::fail_runs_of_gone_replicas`]):
//!   replicas silent past the lease are dropped, their runs failed (with
//!   their webhooks, in one transaction) and their claimed deliveries
//!   released. Never on evidence gathered while the store was unreachable
//!   ([`Evidence`]): the leader sweeps only once its own heartbeats have
//!   reached the store without a gap for a full lease, so after an outage
//!   every live replica has had a whole lease to heartbeat again.
//! - A replica that cannot reach the store keeps its runs going: a failed
//!   heartbeat, claim or poll is logged (rate-limited, with its cause) and
//!   retried, nothing is cancelled for it.
//! - Queued runs are claimed in order, atomically, within
//!   `PLATFORM_RUN_LIMITS` `max_concurrent_runs` (shared by every replica and
//!   every `airlock run` on the store) and each organization's own limit.
//!   A claimed run is this replica's; its own watchdog, timeout and
//!   cancellation apply (the orchestrator's). A claim whose answer was lost
//!   (the run is this replica's in the store, never started, unknown here)
//!   is put back in the queue by the reconcile.
//! - Cancel requests for its runs (made through any replica) are polled;
//!   each run's end records who asked.
//! - [`drain`]: on SIGTERM it stops claiming, lets its runs end within the
//!   grace, then cancels the rest with [`SHUT_DOWN`].

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use airlock_api::v1::RunLimits;
use airlock_platform::manifest::Manifest;
use airlock_platform::orchestrator::{RunError, RunRequest};
use airlock_store::{ClaimedRun, StoreError, now_ms};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::failpoint::FailPoint;
use crate::state::AppState;

/// The lease the leader holds.
pub const LEADER_LEASE: &str = "leader";
/// What a run cancelled by its replica's shutdown records.
pub const SHUT_DOWN: &str =
    "this replica shut down (SIGTERM) before the run ended, after SHUTDOWN_GRACE_SECONDS";
/// What a run still going here records when the store says it has ended
/// elsewhere (this replica was judged dead meanwhile; its end stands).
const ENDED_ELSEWHERE: &str =
    "stopped on its replica: the store had already ended it while the replica was judged dead";
/// How often an idle scheduler looks at the queue (runs queued through
/// another replica are seen within this).
const QUEUE_POLL: Duration = Duration::from_millis(200);
/// How often cancel requests made through other replicas are looked for.
const CANCEL_POLL: Duration = Duration::from_millis(300);
/// How long a drain waits for its cancelled runs to end.
const CANCELLED_END: Duration = Duration::from_secs(60);

/// The replica's background work.
pub struct Work {
    tasks: Vec<JoinHandle<()>>,
    deliverer: JoinHandle<()>,
    deliverer_stop: watch::Sender<bool>,
}

impl Work {
    /// After [`drain`]: stops the deliverer (its attempts under way end
    /// first, bounded by the webhook timeout), the other tasks, and leaves
    /// the replica set and the lease; deliveries it still held are
    /// released for another replica at once.
    pub async fn finish(self, app: &AppState) {
        let _ = self.deliverer_stop.send(true);
        let mut deliverer = self.deliverer;
        let bound = app.cfg().webhook_timeout + Duration::from_secs(2);
        if tokio::time::timeout(bound, &mut deliverer).await.is_err() {
            deliverer.abort();
        }
        for t in &self.tasks {
            t.abort();
        }
        let store = app.fleet_store();
        if let Err(e) = store.release_delivery_claims(app.replica()).await {
            tracing::warn!("releasing this replica's deliveries: {}", e.chain());
        }
        if let Err(e) = store.remove_replica(app.replica()).await {
            tracing::warn!("leaving the replica set: {}", e.chain());
        }
        let _ = store.release_lease(LEADER_LEASE, app.replica()).await;
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "unknown".into())
}

/// What this replica's own heartbeats say about its view of the store: the
/// evidence a sweep needs. A replica is judged dead only by a leader whose
/// heartbeats have reached the store without a gap for a whole lease: after
/// a store outage (or a pause of the leader) every live replica has had a
/// full lease to heartbeat again before anyone is judged.
#[derive(Default)]
pub struct Evidence {
    /// Since when (Unix ms) heartbeats have reached the store without a
    /// gap; 0 while they fail.
    ok_since: AtomicI64,
    /// The last heartbeat that reached it (Unix ms); 0: none yet.
    last_ok: AtomicI64,
}

impl Evidence {
    /// A heartbeat reached the store at `now`. A gap longer than `gap_ms`
    /// since the last one starts the count again, even if no failure was
    /// seen (a stalled process).
    pub fn ok(&self, now: i64, gap_ms: i64) {
        let last = self.last_ok.swap(now, Ordering::AcqRel);
        if last == 0 || now - last > gap_ms || self.ok_since.load(Ordering::Acquire) == 0 {
            self.ok_since.store(now, Ordering::Release);
        }
    }

    /// A heartbeat failed (or timed out).
    pub fn failed(&self) {
        self.ok_since.store(0, Ordering::Release);
    }

    /// Whether a sweep at `now` may judge others dead.
    pub fn may_judge(&self, now: i64, lease_ms: i64, gap_ms: i64) -> bool {
        let since = self.ok_since.load(Ordering::Acquire);
        let last = self.last_ok.load(Ordering::Acquire);
        since != 0 && now - since >= lease_ms && now - last <= gap_ms
    }
}

/// Registers this replica, retrying (with its cause logged) until the store
/// takes it: a store that blinks at this moment does not stop the replica.
async fn register(app: &AppState) {
    let mut wait = Duration::from_millis(200);
    loop {
        match app
            .fleet_store()
            .register_replica(app.replica(), &hostname(), std::process::id())
            .await
        {
            Ok(()) => {
                app.store_watch().ok();
                return;
            }
            Err(e) => {
                app.store_watch().failed("registering the replica", &e);
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// The intervals the fleet's loops keep, from the replica lease.
#[derive(Clone, Copy)]
struct Beat {
    /// Between two heartbeats (and two tries at the lease): a fifth of it.
    every: Duration,
    /// One heartbeat attempt waits at most this.
    bound: Duration,
    /// Longer than this between two heartbeats that reached the store is a
    /// gap in the evidence (two attempts' worth).
    gap_ms: i64,
    lease_ms: i64,
}

impl Beat {
    fn of(lease: Duration) -> Beat {
        let every = lease / 5;
        let bound = every.max(Duration::from_secs(1));
        Beat {
            every,
            bound,
            gap_ms: i64::try_from((2 * bound).as_millis()).unwrap_or(i64::MAX),
            lease_ms: i64::try_from(lease.as_millis()).unwrap_or(i64::MAX),
        }
    }

    fn ticks(&self) -> tokio::time::Interval {
        let mut tick = tokio::time::interval(self.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick
    }
}

pub async fn start(app: AppState) -> Work {
    register(&app).await;
    tracing::info!(replica = app.replica(), "replica registered");
    let evidence = Arc::new(Evidence::default());
    let beat = Beat::of(app.cfg().replica_lease);
    let tasks = vec![
        tokio::spawn(heartbeat_loop(app.clone(), evidence.clone(), beat)),
        tokio::spawn(leader_loop(app.clone(), evidence, beat)),
        tokio::spawn(cancel_poll_loop(app.clone())),
        tokio::spawn(claim_loop(app.clone())),
    ];
    let (deliverer_stop, stop_rx) = watch::channel(false);
    let deliverer = tokio::spawn(crate::webhooks::deliver_loop(app.clone(), stop_rx));
    Work {
        tasks,
        deliverer,
        deliverer_stop,
    }
}

/// Heartbeats every [`Beat::every`], each bounded; a row gone means the
/// leader judged this replica dead: it registers again and reconciles.
async fn heartbeat_loop(app: AppState, evidence: Arc<Evidence>, beat: Beat) {
    let mut tick = beat.ticks();
    let mut beats: u64 = 0;
    loop {
        tick.tick().await;
        beats += 1;
        let res = match tokio::time::timeout(
            beat.bound,
            app.fleet_store().heartbeat_replica(app.replica()),
        )
        .await
        {
            Ok(r) => r,
            Err(_) => Err(StoreError::Unavailable {
                database: app.store().display_name().to_owned(),
                detail: format!(
                    "a heartbeat got no answer within {} s",
                    beat.bound.as_secs_f64()
                ),
                source: None,
            }),
        };
        match res {
            Ok(true) => {
                evidence.ok(now_ms(), beat.gap_ms);
                app.store_watch().ok();
                // Once a lease: is what the store counts as ours what runs here?
                if beats.is_multiple_of(5) {
                    reconcile(&app, false).await;
                }
            }
            Ok(false) => {
                evidence.failed();
                tracing::error!(
                    replica = app.replica(),
                    "this replica was judged dead by the leader (its heartbeats did not reach the store for longer than the replica lease); it registers again and keeps the runs the store still counts as its own"
                );
                register(&app).await;
                reconcile(&app, true).await;
            }
            Err(e) => {
                evidence.failed();
                // The pool says only that it timed out: a fresh connection
                // says why (refused, authentication …).
                let e = if e.is_pool_timeout() {
                    app.store().probe(beat.bound).await.err().unwrap_or(e)
                } else {
                    e
                };
                app.store_watch().failed("replica heartbeat", &e);
            }
        }
    }
}

/// Tries for the leader lease every [`Beat::every`]; while it holds it,
/// starts the retention sweep when due and sweeps the replicas that are
/// gone once its own heartbeats are evidence enough ([`Evidence`]).
async fn leader_loop(app: AppState, evidence: Arc<Evidence>, beat: Beat) {
    let mut tick = beat.ticks();
    let mut leading = false;
    let mut waited_said = false;
    let mut retention = RetentionTimer::default();
    loop {
        tick.tick().await;
        match app
            .fleet_store()
            .try_lease(LEADER_LEASE, app.replica(), beat.lease_ms)
            .await
        {
            Ok(now) => {
                if now != leading {
                    tracing::info!(replica = app.replica(), leader = now, "leader lease");
                }
                leading = now;
            }
            Err(e) => {
                app.store_watch().failed("leader lease", &e);
                leading = false;
            }
        }
        if !leading {
            continue;
        }
        retention.start_if_due(&app);
        if !evidence.may_judge(now_ms(), beat.lease_ms, beat.gap_ms) {
            if !waited_said {
                tracing::info!(
                    "the leader judges no replica until its own heartbeats have reached the store for a whole lease"
                );
                waited_said = true;
            }
            continue;
        }
        waited_said = false;
        sweep(&app, beat.lease_ms).await;
    }
}

/// Stops the runs of this replica that were asked to stop through any
/// replica, every [`CANCEL_POLL`].
async fn cancel_poll_loop(app: AppState) {
    let mut tick = tokio::time::interval(CANCEL_POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match app.store().cancel_requests_of(app.replica()).await {
            Ok(asked) => {
                for (id, reason) in asked {
                    app.cancel_local(&id, &reason);
                }
            }
            Err(e) => app.store_watch().failed("polling cancel requests", &e),
        }
    }
}

/// When the leader last started a retention sweep, and whether one is
/// still going (one at a time, off the leader's loop: a long sweep never
/// delays a heartbeat or a judgement, and it uses the shared pool, not the
/// fleet's small one).
#[derive(Default)]
struct RetentionTimer {
    last: Option<std::time::Instant>,
    busy: Arc<std::sync::atomic::AtomicBool>,
}

impl RetentionTimer {
    fn start_if_due(&mut self, app: &AppState) {
        if self
            .last
            .is_some_and(|t| t.elapsed() < app.cfg().retention_sweep)
            || self.busy.swap(true, Ordering::AcqRel)
        {
            return;
        }
        self.last = Some(std::time::Instant::now());
        let (app, busy) = (app.clone(), self.busy.clone());
        tokio::spawn(async move {
            retention_sweep(&app).await;
            busy.store(false, Ordering::Release);
        });
    }
}

/// Deletes what retention no longer keeps, then measures each
/// organization's stored bytes (the quota a new run is checked against).
async fn retention_sweep(app: &AppState) {
    let now = now_ms();
    match app.store().sweep_retention(&app.cfg().retention, now).await {
        Ok(r) if !r.is_empty() => tracing::info!(
            runs = r.runs,
            egress = r.egress,
            results = r.results,
            deliveries = r.deliveries,
            spend = r.spend,
            crossings = r.crossings,
            freed_pages = r.freed_pages,
            "retention sweep"
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!("retention sweep: {}", e.chain()),
    }
    if let Err(e) = app.store().measure_org_usage(now).await {
        tracing::warn!("measuring stored bytes per organization: {}", e.chain());
    }
}

/// The leader's sweep, once it may judge.
async fn sweep(app: &AppState, lease_ms: i64) {
    let swept = airlock_platform::orchestrator::fail_runs_of_gone_replicas(
        app.fleet_store(),
        &app.orch().ends,
        lease_ms,
        app.replica(),
    )
    .await;
    match swept {
        Ok(swept) => {
            for r in &swept.dropped {
                tracing::warn!(replica = %r, "dropped a replica silent for longer than the lease");
            }
            // A replica on this machine leaves its runs' cgroups behind (its
            // sandboxes died with it), and the standby ones it made for its
            // next run: removed here, not only when it boots again on its
            // home, which may never happen. Elsewhere nothing matches.
            let cgroups = airlock_platform::orchestrator::reclaim_cgroups_of(&swept.failed)
                + airlock_platform::orchestrator::reclaim_standby_cgroups();
            if cgroups > 0 {
                tracing::info!("removed {cgroups} cgroup(s) of platforms that are gone");
            }
            for id in &swept.failed {
                tracing::warn!(run = %id, "failed a run of a replica that is gone");
            }
            if swept.released > 0 {
                tracing::info!(
                    "released {} webhook deliveries held by replicas that are gone",
                    swept.released
                );
            }
            if !swept.failed.is_empty() || swept.released > 0 {
                app.kick_deliveries();
                app.kick_scheduler();
            }
        }
        Err(e) => app.store_watch().failed("replica sweep", &e),
    }
}

/// Makes this replica's runs and the store's view of them agree:
/// - a run the store counts as this replica's, never started and unknown
///   here (a claim whose answer was lost) goes back to the queue;
/// - once `judged_dead` (its row was dropped by a sweep): a run still going
///   here that the store has ended meanwhile (failed by that sweep), or
///   gives to another owner, is stopped here (its stored end stands).
///
/// A run the store counts as this replica's that has started and is not
/// here is left alone: its end is on its way to the store.
pub async fn reconcile(app: &AppState, judged_dead: bool) {
    let _claiming = app.claiming().lock().await;
    let theirs = match app.store().running_runs_of(app.replica()).await {
        Ok(r) => r,
        Err(e) => {
            app.store_watch()
                .failed("reconciling this replica's runs", &e);
            return;
        }
    };
    let here: HashSet<String> = app.running_ids().into_iter().collect();
    let counted: HashSet<&str> = theirs.iter().map(|(id, _)| id.as_str()).collect();
    for (id, started) in &theirs {
        if !started && !here.contains(id) {
            match app.store().requeue_unstarted(id, app.replica()).await {
                Ok(true) => tracing::warn!(
                    run = %id,
                    "put back in the queue: claimed by this replica, never started on it"
                ),
                Ok(false) => {}
                Err(e) => app.store_watch().failed("requeueing a lost claim", &e),
            }
        }
    }
    if !judged_dead {
        return;
    }
    for id in here.iter().filter(|id| !counted.contains(id.as_str())) {
        match app.store().get_run(id).await {
            Ok(Some(run))
                if run.status.is_terminal() || run.owner.as_deref() != Some(app.replica()) =>
            {
                if app.cancel_local(id, ENDED_ELSEWHERE) {
                    tracing::warn!(
                        run = %id,
                        status = %run.status,
                        "stopping a run the store ended while this replica was judged dead"
                    );
                }
            }
            Ok(_) => {}
            Err(e) => app
                .store_watch()
                .failed("reconciling this replica's runs", &e),
        }
    }
}

async fn claim_loop(app: AppState) {
    let limit = app.orch().settings.limits.max_concurrent_runs;
    loop {
        if app.is_stopping() {
            return;
        }
        // This replica's own capacity, beside the store-wide limits.
        let full = app
            .cfg()
            .replica_max_runs
            .is_some_and(|cap| app.running_count() >= cap);
        if !full {
            let claiming = app.claiming().lock().await;
            if app.is_stopping() {
                return;
            }
            match app.store().claim_next_run(app.replica(), limit).await {
                Ok(Some(claimed)) => {
                    app.store_watch().ok();
                    spawn_run(app.clone(), claimed);
                    drop(claiming);
                    continue;
                }
                Ok(None) => app.store_watch().ok(),
                Err(e) => app.store_watch().failed("claiming a queued run", &e),
            }
        }
        tokio::select! {
            () = app.scheduler_kicked().notified() => {}
            () = tokio::time::sleep(QUEUE_POLL) => {}
        }
    }
}

fn spawn_run(app: AppState, claimed: ClaimedRun) {
    let id = claimed.run.id.clone();
    let (tx, rx) = watch::channel(None);
    app.enter_running(&id, tx);
    tokio::spawn(async move {
        crate::webhooks::emit_started(&app, &claimed.run).await;
        let ended = run_one(&app, claimed, rx).await;
        if ended.is_ok() {
            // Test-only: a crash right after the end is stored.
            FailPoint::AfterRunEnd.hit(app.cfg().fail_point);
        }
        if let Err(e) = &ended {
            tracing::error!(run = %id, "run: {e}");
            record_failure(&app, &id, &e.to_string()).await;
        }
        // Its deliveries were queued with its end: send them now.
        app.kick_deliveries();
        app.leave_running(&id);
        app.kick_scheduler();
    });
}

/// Fails a run that could not run, with why, retrying while the store
/// does not take it (the run stays this replica's meanwhile: it is never
/// left `running` with nobody to end it).
async fn record_failure(app: &AppState, id: &str, reason: &str) {
    let mut wait = Duration::from_millis(200);
    loop {
        match app.orch().fail_run(id, reason).await {
            Ok(_) => {
                app.store_watch().ok();
                return;
            }
            Err(e) if e.is_transient() => {
                app.store_watch().failed("recording a run's failure", &e);
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
            }
            Err(e) => {
                tracing::error!(run = %id, "recording the run's failure: {}", e.chain());
                return;
            }
        }
    }
}

/// On the first SIGTERM: no new claim (queued runs stay queued for other
/// replicas; `/readyz` answers 503), running runs go on to their end for
/// up to `SHUTDOWN_GRACE_SECONDS` (a second signal cuts it short), then the
/// rest are cancelled with [`SHUT_DOWN`] and their ends awaited.
/// `signals_seen` is the signal count that started the drain.
pub async fn drain(app: &AppState, signals: &mut watch::Receiver<u32>, signals_seen: u32) {
    app.stop_claiming();
    let grace = app.cfg().shutdown_grace;
    let n = app.running_count();
    if n > 0 {
        tracing::warn!(
            "draining: {n} running run(s) may end within {} s (SHUTDOWN_GRACE_SECONDS); no new run is claimed here, queued runs stay queued for other replicas; a second signal cuts the grace short",
            grace.as_secs_f64()
        );
    }
    let deadline = tokio::time::Instant::now() + grace;
    while app.running_count() > 0 {
        let over = app.run_over().notified();
        tokio::pin!(over);
        over.as_mut().enable();
        if app.running_count() == 0 {
            break;
        }
        tokio::select! {
            () = over => {}
            () = tokio::time::sleep_until(deadline) => break,
            _ = signals.wait_for(|n| *n > signals_seen) => {
                tracing::warn!("a second signal: the shutdown grace is cut short");
                break;
            }
        }
    }
    let left = app.running_count();
    if left == 0 {
        return;
    }
    tracing::warn!("cancelling {left} run(s) still running: {SHUT_DOWN}");
    app.cancel_all(SHUT_DOWN);
    let deadline = tokio::time::Instant::now() + CANCELLED_END;
    while app.running_count() > 0 {
        let over = app.run_over().notified();
        tokio::pin!(over);
        over.as_mut().enable();
        if app.running_count() == 0 {
            break;
        }
        tokio::select! {
            () = over => {}
            () = tokio::time::sleep_until(deadline) => {
                tracing::error!(
                    "{} run(s) did not end within {} s of their cancel",
                    app.running_count(),
                    CANCELLED_END.as_secs()
                );
                return;
            }
        }
    }
}

/// Why a claimed run could not run, or its end could not be recorded: one
/// variant per step, each with every cause. Its text is the run's failure.
#[derive(Debug, thiserror::Error)]
pub enum ClaimedRunError {
    #[error("reading the run's agent: {}", .0.chain())]
    ReadAgent(StoreError),
    #[error("the run's stored limits: {0}")]
    Hints(serde_json::Error),
    #[error("the agent's stored files: {0}")]
    Files(serde_json::Error),
    #[error("the run's stored input files: {0}")]
    Inputs(serde_json::Error),
    #[error("recording the run's failure: {}", .0.chain())]
    RecordFailure(StoreError),
    #[error("the store failed while the run was started or ended: {}", .0.chain())]
    Store(StoreError),
    #[error(transparent)]
    Run(RunError),
}

impl From<RunError> for ClaimedRunError {
    fn from(e: RunError) -> Self {
        match e {
            RunError::Store(e) => ClaimedRunError::Store(e),
            e => ClaimedRunError::Run(e),
        }
    }
}

/// One claimed run, to its recorded end. `Err`: why it could not run (or
/// its end could not be recorded).
async fn run_one(
    app: &AppState,
    claimed: ClaimedRun,
    cancel: airlock_platform::orchestrator::Cancel,
) -> Result<(), ClaimedRunError> {
    let run = &claimed.run;
    let orch = app.orch();
    let fail = |reason: String| async move {
        orch.fail_run(&run.id, &reason)
            .await
            .map(|_| ())
            .map_err(ClaimedRunError::RecordFailure)
    };
    let Some(agent) = app
        .store()
        .get_agent(&run.org_id, &run.agent)
        .await
        .map_err(ClaimedRunError::ReadAgent)?
    else {
        return fail(format!(
            "agent {:?} was deleted before the run started",
            run.agent
        ))
        .await;
    };
    let mut manifest = match Manifest::parse(&agent.manifest) {
        Ok(m) => m,
        Err(e) => return fail(format!("the agent's manifest: {e}")).await,
    };
    if let Some(h) = claimed.hints.as_deref() {
        let h: RunLimits = serde_json::from_str(h).map_err(ClaimedRunError::Hints)?;
        if h.memory_mb.is_some() {
            manifest.agent.memory_mb = h.memory_mb;
        }
        if h.cpus.is_some() {
            manifest.agent.cpus = h.cpus;
        }
        if h.timeout_seconds.is_some() {
            manifest.agent.timeout = h.timeout_seconds;
        }
    }
    let files: BTreeMap<String, String> =
        serde_json::from_str(&agent.files).map_err(ClaimedRunError::Files)?;
    let bundle = orch.home.join("bundles").join(&run.id);
    if let Err(e) = write_bundle(&bundle, Some(&agent.manifest), &files) {
        let _ = std::fs::remove_dir_all(&bundle);
        return fail(format!("writing the agent's files: {e}")).await;
    }
    let inputs: Option<BTreeMap<String, String>> = claimed
        .inputs
        .as_deref()
        .map(serde_json::from_str)
        .transpose()
        .map_err(ClaimedRunError::Inputs)?;
    let inputs_dir = inputs
        .as_ref()
        .map(|_| orch.home.join("inputs").join(&run.id));
    if let (Some(dir), Some(inputs)) = (&inputs_dir, &inputs)
        && let Err(e) = write_bundle(dir, None, inputs)
    {
        let _ = std::fs::remove_dir_all(&bundle);
        let _ = std::fs::remove_dir_all(dir);
        return fail(format!("writing the run's input files: {e}")).await;
    }
    let req = RunRequest {
        org: run.org_id.clone(),
        manifest,
        agent_dir: bundle.clone(),
        prompt: claimed.prompt.clone(),
        inputs_dir: inputs_dir.clone(),
        command: None,
        echo: airlock_platform::orchestrator::Echo::Tagged,
    };
    let outcome = orch
        .run_claimed(run.id.clone(), req, cancel, &|_p| {})
        .await;
    let _ = std::fs::remove_dir_all(&bundle);
    if let Some(dir) = &inputs_dir {
        let _ = std::fs::remove_dir_all(dir);
    }
    outcome.map(|_| ()).map_err(ClaimedRunError::from)
}

/// The agent's directory for one run (its manifest and files), or its
/// input files' (no manifest): readable by the sandbox (which mounts it
/// read-only), nothing else.
fn write_bundle(
    dir: &std::path::Path,
    manifest: Option<&str>,
    files: &BTreeMap<String, String>,
) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    let write = |rel: &str, body: &str| -> std::io::Result<()> {
        // Paths were checked at registration (relative, no `..`); checked again.
        crate::bundle::check_path(rel)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.message))?;
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(parent)?;
        }
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)?;
        std::io::Write::write_all(&mut f, body.as_bytes())?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))
    };
    if let Some(manifest) = manifest {
        write("airlock.toml", manifest)?;
    }
    for (rel, body) in files {
        if manifest.is_none() || rel != "airlock.toml" {
            write(rel, body)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Evidence;

    #[test]
    fn a_leader_judges_only_after_a_whole_lease_of_its_own_heartbeats() {
        let (lease, gap) = (15_000, 6_000);
        let e = Evidence::default();
        assert!(!e.may_judge(0, lease, gap), "no heartbeat yet");
        e.ok(1_000, gap);
        assert!(!e.may_judge(10_000, lease, gap));
        for t in (4_000..=16_000).step_by(3_000) {
            e.ok(t, gap);
        }
        assert!(e.may_judge(16_000, lease, gap));
        // The store goes away: no judgement, and after it returns a whole
        // lease of heartbeats again first.
        e.failed();
        assert!(!e.may_judge(17_000, lease, gap));
        e.ok(40_000, gap);
        assert!(!e.may_judge(41_000, lease, gap));
        for t in (43_000..=55_000).step_by(3_000) {
            e.ok(t, gap);
        }
        assert!(e.may_judge(55_000, lease, gap));
        // A gap without a failure seen (the process was stopped): the same.
        e.ok(90_000, gap);
        assert!(!e.may_judge(90_000, lease, gap));
        // Heartbeats that stop without a failure seen (they hang): none.
        assert!(!e.may_judge(200_000, lease, gap));
    }
}
