//! A run from its request to its recorded end, phase by phase: checked
//! ([`preflight`](super::preflight)), recorded within the run slots,
//! planned ([`plan`](super::plan)), started ([`start`](super::start)),
//! watched ([`watch`](super::watch)), stopped and ended
//! ([`end`](super::end)), then removed ([`removal`](super::removal)).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use airlock_store::{NewRun, RunStatus};

use super::end::{Judged, Verdict, judge};
use super::error::RunError;
use super::parts::{AGENT_STOP_GRACE, Orchestrator};
use super::removal::Leftovers;
use super::request::{Cancel, Progress, ProgressFn, RunOutcome, RunRequest};
use super::rundir::{create_private_dir, write_owner};
use super::watch::Ended;

/// How often a run waiting for a slot asks the store again.
const SLOT_POLL: Duration = Duration::from_millis(200);

impl Orchestrator {
    /// Runs one agent to its end. `cancel` set cancels the run, with its reason.
    pub async fn run(
        &self,
        req: RunRequest,
        mut cancel: Cancel,
        progress: ProgressFn<'_>,
    ) -> Result<RunOutcome, RunError> {
        // Whatever the backend can start before the spec is known starts
        // now, beside the checks and the store's records.
        self.backend.prepare();
        let run_id = format!(
            "run_{}",
            airlock_vault::random_hex::<6>().map_err(RunError::RunId)?
        );
        let m = &req.manifest;
        self.preflight(&req.org, m, &req.agent_dir).await?;
        // The run directory and its owner file exist before the run is in the
        // store, so a concurrent platform's boot reclaim never mistakes a
        // starting run for a crashed one.
        let run_dir = self.home.join("runs").join(&run_id);
        make_run_dir(&run_dir)?;
        let new_run = NewRun {
            org: &req.org,
            owner: None,
            id: &run_id,
            agent: m.agent.name.as_str(),
            backend: self.backend.name(),
            model: m.model.as_ref().map(|x| x.provider.as_str()),
            status: RunStatus::Running,
            created_at: None,
        };
        if let Err(e) = self
            .record_within_slots(&new_run, &mut cancel, progress)
            .await
        {
            let _ = std::fs::remove_dir_all(&run_dir);
            return Err(e);
        }
        tracing::debug!(target: "airlock::phase", "run recorded");
        self.execute(run_id, run_dir, req, cancel, progress).await
    }

    /// Records `new_run` as started, within `max_concurrent_runs` when set:
    /// it waits, in the open, for a slot (every platform on this store
    /// shares them); a cancel gives up.
    async fn record_within_slots(
        &self,
        new_run: &NewRun<'_>,
        cancel: &mut Cancel,
        progress: ProgressFn<'_>,
    ) -> Result<(), RunError> {
        match self.settings.limits.max_concurrent_runs {
            None => self.store.insert_run(new_run).await?,
            Some(limit) => {
                let mut told = false;
                while !self.store.insert_run_within_limit(new_run, limit).await? {
                    if !told {
                        progress(Progress::Queued { limit });
                        told = true;
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(SLOT_POLL) => {}
                        _ = cancel.changed() => {
                            if cancel.borrow().is_some() {
                                return Err(RunError::CancelledWhileQueued);
                            }
                        }
                    }
                }
            }
        }
        self.store
            .mark_run_started(new_run.id, airlock_store::now_ms())
            .await?;
        Ok(())
    }

    /// Runs a run `airlock serve` queued and this replica has claimed (it is
    /// `running` in the store, owned by this replica). A run that cannot
    /// start is failed with the reason, as every other failed run.
    pub async fn run_claimed(
        &self,
        run_id: String,
        req: RunRequest,
        cancel: Cancel,
        progress: ProgressFn<'_>,
    ) -> Result<RunOutcome, RunError> {
        self.backend.prepare();
        let fail = |reason: String| async {
            if self.fail_run(&run_id, &reason).await? {
                self.metrics
                    .run_ended(RunStatus::Failed, self.backend.name(), None);
            }
            Ok::<RunOutcome, RunError>(RunOutcome {
                run_id: run_id.clone(),
                status: RunStatus::Failed,
                exit_code: None,
                error: Some(reason),
                duration: Duration::ZERO,
                backend: self.backend.name(),
            })
        };
        if let Err(e) = self
            .preflight(&req.org, &req.manifest, &req.agent_dir)
            .await
        {
            return fail(e.to_string()).await;
        }
        let run_dir = self.home.join("runs").join(&run_id);
        if let Err(e) = make_run_dir(&run_dir) {
            return fail(e.to_string()).await;
        }
        if let Err(e) = self
            .store
            .mark_run_started(&run_id, airlock_store::now_ms())
            .await
        {
            let _ = std::fs::remove_dir_all(&run_dir);
            return Err(e.into());
        }
        self.execute(run_id, run_dir, req, cancel, progress).await
    }

    /// A recorded run, from its start to its recorded end.
    async fn execute(
        &self,
        run_id: String,
        run_dir: PathBuf,
        req: RunRequest,
        mut cancel: Cancel,
        progress: ProgressFn<'_>,
    ) -> Result<RunOutcome, RunError> {
        // The run starts now (a wait for a slot is not part of it: the boot
        // deadline and the duration count from here).
        let started = Instant::now();
        let running = self.metrics.run_started(self.backend.name());
        let trace = self
            .traces
            .as_ref()
            .map(|t| t.run(&run_id, self.backend.name()));
        progress(Progress::Starting {
            run_id: run_id.clone(),
            backend: self.backend.name(),
            isolates: self.backend.isolates(),
        });
        // Every egress record the sidecar journals reaches the store from
        // here while the run is live (the sidecar sends none itself).
        let observe = crate::journal::Observe {
            metrics: Some(self.metrics.clone()),
            keep_records: trace.is_some(),
        };
        let journal = crate::journal::Follower::start(&self.store, &run_id, &run_dir, observe);
        let (judged, leftovers) = match self
            .start_and_watch(
                &run_id,
                &run_dir,
                &req,
                &mut cancel,
                progress,
                (started, trace.as_ref()),
            )
            .await
        {
            Ok((judged, leftovers)) => (Ok(judged), leftovers),
            Err(e) => (Err(e), Leftovers::default()),
        };
        self.api.revoke(&run_id);
        // A request still held when the run ended is dropped (its sidecar
        // refuses it, if still there to). A run that was watched dropped
        // them before its teardown already (idempotent: nothing is pending
        // then); this is for a start that failed before it was watched.
        if let Err(e) = self.api.approvals().drop_run(&self.store, &run_id).await {
            tracing::warn!(
                run_id,
                "the run's pending approvals could not be dropped: {e}"
            );
        }
        self.api.approvals().forget(&run_id);
        // The sidecar has flushed: the rest of what it journalled (every
        // request that left and how each ended, the agent's end, its usage
        // and log lines) goes into the store before the run's end is
        // recorded and its directory removed.
        let kept = journal.finish().await;
        if let Some(t) = &trace {
            t.requests(&kept.records);
        }
        let verdict: Verdict = self.verdict(&run_id, judged, kept.result).await;
        tracing::debug!(target: "airlock::phase", "run judged");
        progress(Progress::Ending {
            status: verdict.status,
        });
        let outcome = self
            .record_end(run_id.clone(), &run_dir, started, verdict, kept.stored)
            .await;
        // Its end is visible: what the backends made for it goes now, and
        // what they held back for runs to come starts.
        self.removals.spawn(&run_id, leftovers);
        self.backend.run_ended();
        drop(running);
        if let Ok(o) = &outcome {
            self.metrics
                .run_ended(o.status, o.backend, Some(o.duration));
        }
        if let Some(t) = trace {
            t.end(outcome.as_ref().map_or(RunStatus::Failed, |o| o.status));
        }
        outcome
    }

    /// Records the model budget the run is held to (its report and
    /// `GET /v1/runs/{id}` show it beside its spend). A store that cannot
    /// take it costs the report its limits, not the run: the sidecar holds
    /// the run to them either way.
    async fn record_budget(&self, run_id: &str, req: &RunRequest) {
        let l = self.settings.run_budget(req.manifest.budget.as_ref());
        let count = |v: Option<u64>| v.map(|n| i64::try_from(n).unwrap_or(i64::MAX));
        let limits = airlock_store::BudgetLimits {
            tokens: count(l.tokens),
            cost_microusd: count(l.cost_microusd),
            requests: count(l.requests),
        };
        if limits.any()
            && let Err(e) = self.store.set_run_budget(run_id, &limits).await
        {
            tracing::warn!(run = run_id, "the run's model budget is not recorded: {e}");
        }
    }

    /// Stores the manifest's L7 rules as the run's live policy version 0,
    /// the ceiling of every change (docs/egress.md, "Live policy"): only
    /// when it has rules (none stored reads as none). Fails closed: a
    /// ceiling that cannot be stored fails the run rather than let a change
    /// be judged against none.
    async fn record_policy_ceiling(&self, run_id: &str, req: &RunRequest) -> Result<(), RunError> {
        let m = &req.manifest;
        let ceiling = airlock_platform_api::policy::PolicyRules {
            network: m
                .network
                .as_ref()
                .map(|n| n.rules.specs().to_vec())
                .unwrap_or_default(),
            integrations: m
                .integrations
                .iter()
                .map(|i| (i.namespace.to_string(), i.rules.specs().to_vec()))
                .collect(),
        };
        if ceiling.is_empty() {
            return Ok(());
        }
        let text = serde_json::to_string(&ceiling).unwrap_or_default();
        self.store.put_policy_ceiling(run_id, &text).await?;
        Ok(())
    }

    /// The upstream proxy of a run of `org` ([`crate::proxies::RunProxy::choose`]),
    /// recorded on the run by its label. Fails closed: an organization's
    /// choice that cannot be read fails the run rather than take another
    /// way out.
    async fn run_proxy(
        &self,
        run_id: &str,
        org: &str,
    ) -> Result<crate::proxies::RunProxy, RunError> {
        let chosen = self.store.org_proxy(org).await?;
        let proxy = crate::proxies::RunProxy::choose(
            &self.settings.system_proxies,
            self.settings.proxy_url.as_ref(),
            chosen.as_deref(),
        );
        if proxy.label.is_some()
            && let Err(e) = self
                .store
                .set_run_proxy(run_id, proxy.label.as_deref())
                .await
        {
            tracing::warn!(run = run_id, "the run's proxy is not recorded: {e}");
        }
        Ok(proxy)
    }

    /// Plans the run, grants it its connections, starts it, watches it,
    /// and tears it down: the same teardown whatever ended it (each phase a
    /// span of the run's `trace`, when it is traced). What is left to
    /// remove is removed once its end is recorded (a start that failed
    /// has its own removed at once).
    async fn start_and_watch(
        &self,
        run_id: &str,
        run_dir: &Path,
        req: &RunRequest,
        cancel: &mut Cancel,
        progress: ProgressFn<'_>,
        (started, trace): (Instant, Option<&crate::traces::RunTrace>),
    ) -> Result<(Judged, Leftovers), RunError> {
        let starting = trace.map(|t| t.phase("start"));
        // Fail closed: budgets that cannot be read are kept by the platform,
        // which refuses each call while it cannot read them.
        let org_budget = match self.store.org_budget(&req.org).await {
            Ok(b) => b.any(),
            Err(e) => {
                tracing::warn!(
                    run = run_id,
                    "the organization's model budgets cannot be read ({e}); each model call will ask"
                );
                true
            }
        };
        let proxy = self.run_proxy(run_id, &req.org).await?;
        let mut plan = self.plan(run_id, run_dir, req, org_budget, &proxy)?;
        self.record_budget(run_id, req).await;
        self.record_policy_ceiling(run_id, req).await?;
        self.api.grant(run_id, std::mem::take(&mut plan.grant));
        let reported = self.api.end_reports(run_id);
        let mut run = self
            .start(run_id, &req.org, &plan, progress, started)
            .await?;
        drop(starting);
        let ended = self
            .watch(
                &mut run,
                run_id,
                plan.timeout_secs,
                cancel,
                progress,
                started,
                &reported,
            )
            .await;
        let tearing_down = trace.map(|t| t.phase("teardown"));
        // The run is over: a request its sidecar still holds is dropped
        // first, so the sidecar's drain (and its flush) does not wait on
        // an answer that can no longer matter, and nothing its sandbox does
        // while it is stopped asks anyone.
        if let Err(e) = self.api.approvals().run_ending(&self.store, run_id).await {
            tracing::warn!(
                run_id,
                "the run's pending approvals could not be dropped: {e}"
            );
        }
        // A run the platform stops while it lives is asked to stop first;
        // so is one whose end is kept while its sandbox has not exited yet
        // (its runtime is on its way out: this waits for its exit, not for
        // the grace). Either way the sandbox is halted — everything in it
        // gone — before the sidecar is drained, and the end is recorded
        // only after both: nothing the agent or a child it left could send
        // is let out once the run reads as ended.
        let grace =
            matches!(ended, Ended::Stopped(..) | Ended::Reported).then_some(AGENT_STOP_GRACE);
        let remains = run.teardown(grace).await;
        drop(tearing_down);
        Ok((judge(ended, &remains), remains.leftovers))
    }
}

/// The run's directory (0700) and its owner file.
fn make_run_dir(run_dir: &Path) -> Result<(), RunError> {
    create_private_dir(run_dir)
        .and_then(|()| write_owner(run_dir))
        .map_err(|error| RunError::RunDir {
            path: run_dir.to_owned(),
            error,
        })
}
