//! What `airlock serve` adds to the store: organizations and their API keys,
//! registered agents, the run queue shared by every replica, replicas and
//! the leader lease, webhooks and their deliveries.
//!
//! Every row an organization owns carries its `org_id`, and every query here
//! that reads or changes such a row names the organization: an id guessed
//! from another organization finds nothing.
//!
//! The outbox: a run's end and the webhook deliveries it owes are written in
//! one transaction ([`Store::finish_run`], the leader's sweep, a queued
//! run's cancel), whoever ends the run, so a crash never keeps one without
//! the other; a run event has at most one delivery per webhook (one id,
//! whoever sends it).

use sqlx::Row as _;

use crate::{Pool, Run, RunEnd, RunStatus, Store, StoreError, now_ms, validate_name};

/// An organization (a tenant of `airlock serve`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Organization {
    pub id: String,
    pub name: String,
    /// Its own ceiling on running runs (`None`: only the platform's).
    pub max_concurrent_runs: Option<i64>,
    pub created_at: i64,
}

/// An API key as stored: its hash, never the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKeyRow {
    pub id: String,
    pub org_id: String,
    pub name: String,
    /// Lowercase hex of the keyed hash of the key's secret part.
    pub hash: String,
    pub created_at: i64,
    pub revoked_at: Option<i64>,
}

/// A registered agent: its manifest and the files of its directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentRow {
    pub org_id: String,
    pub name: String,
    /// The manifest's TOML text.
    pub manifest: String,
    /// JSON object: relative path → file content (UTF-8 text).
    pub files: String,
    pub created_at: i64,
    pub updated_at: i64,
}

/// A run to queue.
#[derive(Debug, Clone, Copy)]
pub struct NewQueuedRun<'a> {
    pub org: &'a str,
    pub id: &'a str,
    pub agent: &'a str,
    pub backend: &'a str,
    pub model: Option<&'a str>,
    pub prompt: Option<&'a str>,
    /// JSON of the limit hints asked for with the run.
    pub hints: Option<&'a str>,
}

/// A queued run a replica has claimed: it is now `running` and the replica's.
#[derive(Debug, Clone)]
pub struct ClaimedRun {
    pub run: Run,
    pub prompt: Option<String>,
    pub hints: Option<String>,
}

/// What a cancel request found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelOutcome {
    /// It was queued: it is now `cancelled`.
    CancelledQueued,
    /// It is running: its replica stops it.
    Requested,
    /// It had already ended.
    AlreadyEnded(RunStatus),
    NotFound,
}

/// A webhook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookRow {
    pub id: String,
    pub org_id: String,
    pub url: String,
    /// JSON array of event names.
    pub events: String,
    /// Its signing secret, as a `v1:` envelope.
    pub secret_envelope: String,
    pub created_at: i64,
}

/// One event to deliver to one webhook, and how its delivery went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryRow {
    pub id: String,
    pub webhook_id: String,
    pub org_id: String,
    pub run_id: String,
    pub event: String,
    pub payload: String,
    /// `pending`, `delivered` or `failed` (gave up).
    pub state: String,
    pub attempts: i64,
    pub last_status: Option<i64>,
    pub last_error: Option<String>,
    pub next_attempt_at: i64,
    pub created_at: i64,
    pub delivered_at: Option<i64>,
}

/// How one delivery attempt ended.
#[derive(Debug, Clone, Copy)]
pub struct DeliveryAttempt<'a> {
    pub status: Option<i64>,
    pub error: Option<&'a str>,
    /// Delivered (a 2xx).
    pub delivered: bool,
    /// When to try again (`None`: give up, unless delivered).
    pub retry_at: Option<i64>,
}

/// The message a run of a dead replica is failed with.
pub const REPLICA_GONE: &str = "the platform stopped while this run was running (its airlock serve replica is gone); reclaimed by another replica";

/// The webhook event a run in `status` is (`None` while queued).
pub fn run_event(status: RunStatus) -> Option<&'static str> {
    Some(match status {
        RunStatus::Running => "run.started",
        RunStatus::Succeeded => "run.succeeded",
        RunStatus::Failed => "run.failed",
        RunStatus::Cancelled => "run.cancelled",
        RunStatus::TimedOut => "run.timed_out",
        RunStatus::Queued => return None,
    })
}

/// What the leader's sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sweep {
    /// Replicas dropped (silent for longer than the lease).
    pub dropped: Vec<String>,
    /// Runs failed with [`REPLICA_GONE`] (they ran under a replica that is
    /// not registered).
    pub failed: Vec<String>,
    /// Webhook deliveries whose claim by such a replica was released.
    pub released: u64,
}

/// Ends run `$id` with `$end` on the transaction `$tx`, and queues its
/// deliveries ([`queue_deliveries_in`]). `Ok(false)` when the run had
/// already ended (nothing is queued then).
macro_rules! end_run_in {
    ($self:expr, $tx:ident, $id:expr, $end:expr) => {
        async {
            let id: &str = $id;
            let end: &RunEnd<'_> = $end;
            let n = sqlx::query(
                "UPDATE runs SET status = $2, exit_code = $3, error = $4, ended_at = $5 \
                 WHERE id = $1 AND ended_at IS NULL",
            )
            .bind(id)
            .bind(end.status.as_str())
            .bind(end.exit_code)
            .bind(end.error)
            .bind(end.at)
            .execute(&mut *$tx)
            .await
            .map_err(|e| $self.err(e))?
            .rows_affected();
            if n > 0 {
                queue_deliveries_in!($self, $tx, id, end.status, end.at).await?;
            }
            Ok::<bool, StoreError>(n > 0)
        }
    };
}

/// Queues, on the transaction `$tx`, a delivery of run `$id`'s event (the
/// one `$status` is) for each of its organization's webhooks that
/// subscribed to it, its body rendered when first sent. Written once, for
/// both backends.
macro_rules! queue_deliveries_in {
    ($self:expr, $tx:ident, $id:expr, $status:expr, $at:expr) => {
        async {
            let id: &str = $id;
            let at: i64 = $at;
            let Some(event) = run_event($status) else {
                return Ok::<(), StoreError>(());
            };
            let org: String = sqlx::query_scalar("SELECT org_id FROM runs WHERE id = $1")
                .bind(id)
                .fetch_one(&mut *$tx)
                .await
                .map_err(|e| $self.err(e))?;
            let hooks: Vec<(String, String)> =
                sqlx::query_as("SELECT id, events FROM webhooks WHERE org_id = $1")
                    .bind(&org)
                    .fetch_all(&mut *$tx)
                    .await
                    .map_err(|e| $self.err(e))?;
            for (hook, events) in hooks {
                if !subscribes(&events, event) {
                    continue;
                }
                sqlx::query(
                    "INSERT INTO webhook_deliveries (id, webhook_id, org_id, run_id, event, \
                     payload, state, attempts, next_attempt_at, created_at, event_key) \
                     VALUES ($1, $2, $3, $4, $5, '', 'pending', 0, $6, $6, $7) \
                     ON CONFLICT DO NOTHING",
                )
                .bind(new_delivery_id()?)
                .bind(&hook)
                .bind(&org)
                .bind(id)
                .bind(event)
                .bind(at)
                .bind(event_key(id, event))
                .execute(&mut *$tx)
                .await
                .map_err(|e| $self.err(e))?;
            }
            Ok(())
        }
    };
}

/// Whether a webhook's `events` (a JSON array of names) holds `event`.
fn subscribes(events: &str, event: &str) -> bool {
    serde_json::from_str::<Vec<String>>(events).is_ok_and(|v| v.iter().any(|e| e == event))
}

/// What makes a delivery one of its kind: one per webhook per run event.
fn event_key(run_id: &str, event: &str) -> String {
    format!("{run_id}:{event}")
}

/// A fresh delivery id (`dlv_` and 16 hex digits).
pub fn new_delivery_id() -> Result<String, StoreError> {
    airlock_vault::random_hex::<8>()
        .map(|h| format!("dlv_{h}"))
        .map_err(|_| StoreError::Invalid {
            what: "delivery id",
            reason: "the system's random source failed",
        })
}

macro_rules! delivery_row {
    ($r:expr, $s:expr) => {
        DeliveryRow {
            id: $r.try_get("id").map_err(|e| $s.err(e))?,
            webhook_id: $r.try_get("webhook_id").map_err(|e| $s.err(e))?,
            org_id: $r.try_get("org_id").map_err(|e| $s.err(e))?,
            run_id: $r.try_get("run_id").map_err(|e| $s.err(e))?,
            event: $r.try_get("event").map_err(|e| $s.err(e))?,
            payload: $r.try_get("payload").map_err(|e| $s.err(e))?,
            state: $r.try_get("state").map_err(|e| $s.err(e))?,
            attempts: $r.try_get("attempts").map_err(|e| $s.err(e))?,
            last_status: $r.try_get("last_status").map_err(|e| $s.err(e))?,
            last_error: $r.try_get("last_error").map_err(|e| $s.err(e))?,
            next_attempt_at: $r.try_get("next_attempt_at").map_err(|e| $s.err(e))?,
            created_at: $r.try_get("created_at").map_err(|e| $s.err(e))?,
            delivered_at: $r.try_get("delivered_at").map_err(|e| $s.err(e))?,
        }
    };
}

macro_rules! api_key_row {
    ($r:expr, $s:expr) => {
        ApiKeyRow {
            id: $r.try_get("id").map_err(|e| $s.err(e))?,
            org_id: $r.try_get("org_id").map_err(|e| $s.err(e))?,
            name: $r.try_get("name").map_err(|e| $s.err(e))?,
            hash: $r.try_get("hash").map_err(|e| $s.err(e))?,
            created_at: $r.try_get("created_at").map_err(|e| $s.err(e))?,
            revoked_at: $r.try_get("revoked_at").map_err(|e| $s.err(e))?,
        }
    };
}

macro_rules! agent_row {
    ($r:expr, $s:expr) => {
        AgentRow {
            org_id: $r.try_get("org_id").map_err(|e| $s.err(e))?,
            name: $r.try_get("name").map_err(|e| $s.err(e))?,
            manifest: $r.try_get("manifest").map_err(|e| $s.err(e))?,
            files: $r.try_get("files").map_err(|e| $s.err(e))?,
            created_at: $r.try_get("created_at").map_err(|e| $s.err(e))?,
            updated_at: $r.try_get("updated_at").map_err(|e| $s.err(e))?,
        }
    };
}

macro_rules! webhook_row {
    ($r:expr, $s:expr) => {
        WebhookRow {
            id: $r.try_get("id").map_err(|e| $s.err(e))?,
            org_id: $r.try_get("org_id").map_err(|e| $s.err(e))?,
            url: $r.try_get("url").map_err(|e| $s.err(e))?,
            events: $r.try_get("events").map_err(|e| $s.err(e))?,
            secret_envelope: $r.try_get("secret_envelope").map_err(|e| $s.err(e))?,
            created_at: $r.try_get("created_at").map_err(|e| $s.err(e))?,
        }
    };
}

macro_rules! delivery_columns {
    () => {
        "id, webhook_id, org_id, run_id, event, payload, state, attempts, \
         last_status, last_error, next_attempt_at, created_at, delivered_at"
    };
}

/// A strictly increasing position in the run queue for this process
/// (microseconds, bumped on a tie): runs queued one after another by one
/// client start in that order.
fn next_queue_seq() -> i64 {
    use std::sync::atomic::{AtomicI64, Ordering};
    static LAST: AtomicI64 = AtomicI64::new(0);
    let now = now_ms().saturating_mul(1000);
    let mut prev = LAST.load(Ordering::Relaxed);
    loop {
        let next = now.max(prev + 1);
        match LAST.compare_exchange_weak(prev, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return next,
            Err(p) => prev = p,
        }
    }
}

impl Store {
    // ---- organizations ----

    pub async fn create_org(
        &self,
        id: &str,
        name: &str,
        max_concurrent_runs: Option<i64>,
    ) -> Result<Organization, StoreError> {
        validate_name("organization id", id)?;
        validate_name("organization name", name)?;
        let now = now_ms();
        let res = on_pool!(self, p => sqlx::query(
            "INSERT INTO organizations (id, name, max_concurrent_runs, created_at) \
             VALUES ($1, $2, $3, $4)",
        )
        .bind(id)
        .bind(name)
        .bind(max_concurrent_runs)
        .bind(now)
        .execute(p)
        .await
        .map(|_| ()));
        match res {
            Err(e) if crate::is_unique_violation(&e) => Err(StoreError::Invalid {
                what: "organization id",
                reason: "already exists",
            }),
            Err(e) => Err(self.err(e)),
            Ok(_) => Ok(Organization {
                id: id.to_owned(),
                name: name.to_owned(),
                max_concurrent_runs,
                created_at: now,
            }),
        }
    }

    pub async fn get_org(&self, id: &str) -> Result<Option<Organization>, StoreError> {
        on_pool!(self, p => {
            let row = sqlx::query(
                "SELECT id, name, max_concurrent_runs, created_at FROM organizations WHERE id = $1",
            )
            .bind(id)
            .fetch_optional(p)
            .await
            .map_err(|e| self.err(e))?;
            row.map(|r| -> Result<Organization, StoreError> {
                Ok(Organization {
                    id: r.try_get("id").map_err(|e| self.err(e))?,
                    name: r.try_get("name").map_err(|e| self.err(e))?,
                    max_concurrent_runs: r.try_get("max_concurrent_runs").map_err(|e| self.err(e))?,
                    created_at: r.try_get("created_at").map_err(|e| self.err(e))?,
                })
            })
            .transpose()
        })
    }

    pub async fn list_orgs(&self) -> Result<Vec<Organization>, StoreError> {
        on_pool!(self, p => {
            let rows = sqlx::query(
                "SELECT id, name, max_concurrent_runs, created_at FROM organizations ORDER BY created_at, id",
            )
            .fetch_all(p)
            .await
            .map_err(|e| self.err(e))?;
            rows.iter().map(|r| Ok(Organization {
                id: r.try_get("id").map_err(|e| self.err(e))?,
                name: r.try_get("name").map_err(|e| self.err(e))?,
                max_concurrent_runs: r.try_get("max_concurrent_runs").map_err(|e| self.err(e))?,
                created_at: r.try_get("created_at").map_err(|e| self.err(e))?,
            })).collect()
        })
    }

    // ---- API keys ----

    /// Stores a new API key of `org`, unless `org` already has `max` keys
    /// not revoked ([`StoreError::QuotaExceeded`]).
    pub async fn insert_api_key(
        &self,
        id: &str,
        org: &str,
        name: &str,
        hash: &str,
        max: Option<u64>,
    ) -> Result<ApiKeyRow, StoreError> {
        validate_name("API key name", name)?;
        let now = now_ms();
        let inserted = self
            .insert_within_quota(
                org,
                "INSERT INTO api_keys (id, org_id, name, hash, created_at) \
                 SELECT $1, $2, $3, $4, $5 WHERE (SELECT COUNT(*) FROM api_keys \
                 WHERE org_id = $2 AND revoked_at IS NULL) < $6",
                &[id, org, name, hash],
                now,
                max,
            )
            .await?;
        if !inserted {
            return Err(StoreError::QuotaExceeded {
                what: "API keys",
                limit: max.unwrap_or(u64::MAX),
            });
        }
        Ok(ApiKeyRow {
            id: id.to_owned(),
            org_id: org.to_owned(),
            name: name.to_owned(),
            hash: hash.to_owned(),
            created_at: now,
            revoked_at: None,
        })
    }

    /// A key by its id (the public part of the key), any organization's:
    /// what authentication looks up before it compares the hash.
    pub async fn get_api_key(&self, id: &str) -> Result<Option<ApiKeyRow>, StoreError> {
        on_pool!(self, p => {
            let row = sqlx::query(
                "SELECT id, org_id, name, hash, created_at, revoked_at FROM api_keys WHERE id = $1",
            )
            .bind(id)
            .fetch_optional(p)
            .await
            .map_err(|e| self.err(e))?;
            row.map(|r| -> Result<ApiKeyRow, StoreError> { Ok(api_key_row!(r, self)) })
                .transpose()
        })
    }

    pub async fn list_api_keys(&self, org: &str) -> Result<Vec<ApiKeyRow>, StoreError> {
        on_pool!(self, p => {
            let rows = sqlx::query(
                "SELECT id, org_id, name, hash, created_at, revoked_at FROM api_keys \
                 WHERE org_id = $1 ORDER BY created_at, id",
            )
            .bind(org)
            .fetch_all(p)
            .await
            .map_err(|e| self.err(e))?;
            rows.iter().map(|r| Ok(api_key_row!(r, self))).collect()
        })
    }

    /// Revokes one of `org`'s keys; `false` when it has no such live key.
    pub async fn revoke_api_key(&self, org: &str, id: &str) -> Result<bool, StoreError> {
        let n = on_pool!(self, p => sqlx::query(
            "UPDATE api_keys SET revoked_at = $3 WHERE org_id = $1 AND id = $2 AND revoked_at IS NULL",
        )
        .bind(org)
        .bind(id)
        .bind(now_ms())
        .execute(p)
        .await
        .map_err(|e| self.err(e))?
        .rows_affected());
        Ok(n > 0)
    }

    // ---- agents ----

    /// Registers (or replaces) one of `org`'s agents.
    pub async fn put_agent(
        &self,
        org: &str,
        name: &str,
        manifest: &str,
        files: &str,
    ) -> Result<AgentRow, StoreError> {
        validate_name("agent name", name)?;
        let now = now_ms();
        on_pool!(self, p => sqlx::query(
            "INSERT INTO agents (org_id, name, manifest, files, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $5) \
             ON CONFLICT (org_id, name) DO UPDATE SET manifest = excluded.manifest, \
             files = excluded.files, updated_at = excluded.updated_at",
        )
        .bind(org)
        .bind(name)
        .bind(manifest)
        .bind(files)
        .bind(now)
        .execute(p)
        .await
        .map(|_| ())
        .map_err(|e| self.err(e))?);
        self.get_agent(org, name)
            .await?
            .ok_or_else(|| StoreError::Corrupt(format!("agent {name:?} vanished after its write")))
    }

    pub async fn get_agent(&self, org: &str, name: &str) -> Result<Option<AgentRow>, StoreError> {
        on_pool!(self, p => {
            let row = sqlx::query(
                "SELECT org_id, name, manifest, files, created_at, updated_at FROM agents \
                 WHERE org_id = $1 AND name = $2",
            )
            .bind(org)
            .bind(name)
            .fetch_optional(p)
            .await
            .map_err(|e| self.err(e))?;
            row.map(|r| -> Result<AgentRow, StoreError> { Ok(agent_row!(r, self)) }).transpose()
        })
    }

    pub async fn list_agents(&self, org: &str) -> Result<Vec<AgentRow>, StoreError> {
        on_pool!(self, p => {
            let rows = sqlx::query(
                "SELECT org_id, name, manifest, files, created_at, updated_at FROM agents \
                 WHERE org_id = $1 ORDER BY name",
            )
            .bind(org)
            .fetch_all(p)
            .await
            .map_err(|e| self.err(e))?;
            rows.iter().map(|r| Ok(agent_row!(r, self))).collect()
        })
    }

    pub async fn delete_agent(&self, org: &str, name: &str) -> Result<bool, StoreError> {
        let n = on_pool!(self, p => sqlx::query("DELETE FROM agents WHERE org_id = $1 AND name = $2")
            .bind(org)
            .bind(name)
            .execute(p)
            .await
            .map_err(|e| self.err(e))?
            .rows_affected());
        Ok(n > 0)
    }

    // ---- the run queue ----

    /// Queues a run (status `queued`); replicas claim queued runs in order.
    pub async fn enqueue_run(&self, r: &NewQueuedRun<'_>) -> Result<(), StoreError> {
        validate_name("run id", r.id)?;
        let res = on_pool!(self, p => sqlx::query(
            "INSERT INTO runs (id, agent, status, backend, model, created_at, org_id, prompt, \
             hints, queue_seq) VALUES ($1, $2, 'queued', $3, $4, $5, $6, $7, $8, $9)",
        )
        .bind(r.id)
        .bind(r.agent)
        .bind(r.backend)
        .bind(r.model)
        .bind(now_ms())
        .bind(r.org)
        .bind(r.prompt)
        .bind(r.hints)
        .bind(next_queue_seq())
        .execute(p)
        .await
        .map(|_| ()));
        match res {
            Err(e) if crate::is_unique_violation(&e) => Err(StoreError::RunExists(r.id.to_owned())),
            Err(e) => Err(self.err(e)),
            Ok(_) => Ok(()),
        }
    }

    /// Claims the oldest queued run that may start now for `owner`: fewer
    /// than `max_running` runs are running in the store (when set) and fewer
    /// than its organization's `max_concurrent_runs`. Counting and claiming
    /// are one atomic step, as in [`Store::insert_run_within_limit`].
    pub async fn claim_next_run(
        &self,
        owner: &str,
        max_running: Option<u32>,
    ) -> Result<Option<ClaimedRun>, StoreError> {
        let max = max_running.map_or(i64::MAX, i64::from);
        let pick = "SELECT r.id FROM runs r LEFT JOIN organizations o ON o.id = r.org_id \
             WHERE r.status = 'queued' AND (SELECT COUNT(*) FROM runs a WHERE a.status = 'running') < $1 \
             AND (o.max_concurrent_runs IS NULL OR (SELECT COUNT(*) FROM runs x \
                  WHERE x.org_id = r.org_id AND x.status = 'running') < o.max_concurrent_runs) \
             ORDER BY r.queue_seq, r.id LIMIT 1";
        let claim =
            "UPDATE runs SET status = 'running', owner = $2 WHERE id = $1 AND status = 'queued'";
        let id: Option<String> = match &self.pool {
            Pool::Sqlite(p) => {
                let mut c = p.acquire().await.map_err(|e| self.err(e))?;
                let res: Result<Option<String>, sqlx::Error> = async {
                    sqlx::query("BEGIN IMMEDIATE").execute(&mut *c).await?;
                    let body = async {
                        let id: Option<String> = sqlx::query_scalar(pick)
                            .bind(max)
                            .fetch_optional(&mut *c)
                            .await?;
                        if let Some(id) = &id {
                            sqlx::query(claim)
                                .bind(id)
                                .bind(owner)
                                .execute(&mut *c)
                                .await?;
                        }
                        Ok::<_, sqlx::Error>(id)
                    }
                    .await;
                    let end = if matches!(body, Ok(Some(_))) {
                        "COMMIT"
                    } else {
                        "ROLLBACK"
                    };
                    sqlx::query(end).execute(&mut *c).await?;
                    body
                }
                .await;
                res.map_err(|e| self.err(e))?
            }
            Pool::Postgres(p) => {
                let res: Result<Option<String>, sqlx::Error> = async {
                    let mut tx = p.begin().await?;
                    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('airlock.run_slots'))")
                        .execute(&mut *tx)
                        .await?;
                    let id: Option<String> = sqlx::query_scalar(pick)
                        .bind(max)
                        .fetch_optional(&mut *tx)
                        .await?;
                    if let Some(id) = &id {
                        sqlx::query(claim)
                            .bind(id)
                            .bind(owner)
                            .execute(&mut *tx)
                            .await?;
                    }
                    tx.commit().await?;
                    Ok(id)
                }
                .await;
                res.map_err(|e| self.err(e))?
            }
        };
        let Some(id) = id else { return Ok(None) };
        let run = self
            .get_run(&id)
            .await?
            .ok_or_else(|| StoreError::RunNotFound(id.clone()))?;
        let (prompt, hints): (Option<String>, Option<String>) = on_pool!(self, p => {
            let r = sqlx::query("SELECT prompt, hints FROM runs WHERE id = $1")
                .bind(&id)
                .fetch_one(p)
                .await
                .map_err(|e| self.err(e))?;
            (r.try_get("prompt").map_err(|e| self.err(e))?, r.try_get("hints").map_err(|e| self.err(e))?)
        });
        Ok(Some(ClaimedRun { run, prompt, hints }))
    }

    /// How many queued runs are ahead of `id` (`None`: it is not queued).
    pub async fn queue_position(&self, id: &str) -> Result<Option<i64>, StoreError> {
        on_pool!(self, p => sqlx::query_scalar(
            "SELECT (SELECT COUNT(*) FROM runs q WHERE q.status = 'queued' \
             AND (q.queue_seq < r.queue_seq OR (q.queue_seq = r.queue_seq AND q.id < r.id))) \
             FROM runs r WHERE r.id = $1 AND r.status = 'queued'",
        )
        .bind(id)
        .fetch_optional(p)
        .await
        .map_err(|e| self.err(e)))
    }

    /// One of `org`'s runs.
    pub async fn get_run_in(&self, org: &str, id: &str) -> Result<Option<Run>, StoreError> {
        Ok(self.get_run(id).await?.filter(|r| r.org_id == org))
    }

    /// Cancels one of `org`'s runs, saying why (`reason`, e.g. which API
    /// key asked): a queued run ends `cancelled` now, with `reason` (and
    /// its deliveries, in the same transaction); a running one is marked
    /// for its replica to stop, which records `reason` as its end.
    pub async fn request_cancel(
        &self,
        org: &str,
        id: &str,
        reason: &str,
    ) -> Result<CancelOutcome, StoreError> {
        let queued_end = RunEnd {
            status: RunStatus::Cancelled,
            exit_code: None,
            error: Some(reason),
            at: now_ms(),
        };
        let ended = on_pool!(self, p => {
            let mut tx = p.begin().await.map_err(|e| self.err(e))?;
            // Only a run of this organization still queued is ended here
            // (one that a replica claims meanwhile is running: below).
            let n = sqlx::query(
                "UPDATE runs SET status = 'cancelled', error = $3, ended_at = $4 \
                 WHERE org_id = $1 AND id = $2 AND status = 'queued'",
            )
            .bind(org)
            .bind(id)
            .bind(queued_end.error)
            .bind(queued_end.at)
            .execute(&mut *tx)
            .await
            .map_err(|e| self.err(e))?
            .rows_affected();
            if n > 0 {
                queue_deliveries_in!(self, tx, id, queued_end.status, queued_end.at).await?;
            }
            tx.commit().await.map_err(|e| self.err(e))?;
            n > 0
        });
        if ended {
            return Ok(CancelOutcome::CancelledQueued);
        }
        let n = on_pool!(self, p => sqlx::query(
            "UPDATE runs SET cancel_requested = 1, cancel_reason = $3 \
             WHERE org_id = $1 AND id = $2 AND status = 'running'",
        )
        .bind(org)
        .bind(id)
        .bind(reason)
        .execute(p)
        .await
        .map_err(|e| self.err(e))?
        .rows_affected());
        if n > 0 {
            return Ok(CancelOutcome::Requested);
        }
        Ok(match self.get_run_in(org, id).await? {
            None => CancelOutcome::NotFound,
            Some(r) if r.status.is_terminal() => CancelOutcome::AlreadyEnded(r.status),
            // Raced: it started between the two statements.
            Some(_) => Box::pin(self.request_cancel(org, id, reason)).await?,
        })
    }

    /// `owner`'s running runs that were asked to stop, with why.
    pub async fn cancel_requests_of(
        &self,
        owner: &str,
    ) -> Result<Vec<(String, String)>, StoreError> {
        on_pool!(self, p => sqlx::query_as(
            "SELECT id, COALESCE(cancel_reason, 'cancelled through the API') FROM runs \
             WHERE owner = $1 AND status = 'running' AND cancel_requested <> 0",
        )
        .bind(owner)
        .fetch_all(p)
        .await
        .map_err(|e| self.err(e)))
    }

    /// The runs the store counts as `running` under `owner`, each with
    /// whether it has started (its sandbox was asked for).
    pub async fn running_runs_of(&self, owner: &str) -> Result<Vec<(String, bool)>, StoreError> {
        let rows: Vec<(String, Option<i64>)> = on_pool!(self, p => sqlx::query_as(
            "SELECT id, started_at FROM runs WHERE owner = $1 AND status = 'running'",
        )
        .bind(owner)
        .fetch_all(p)
        .await
        .map_err(|e| self.err(e))?);
        Ok(rows.into_iter().map(|(id, s)| (id, s.is_some())).collect())
    }

    /// Puts a run `owner` claimed but never started back in the queue, in
    /// its place (a claim whose answer never reached its replica). `false`
    /// when it is not such a run.
    pub async fn requeue_unstarted(&self, id: &str, owner: &str) -> Result<bool, StoreError> {
        let n = on_pool!(self, p => sqlx::query(
            "UPDATE runs SET status = 'queued', owner = NULL \
             WHERE id = $1 AND owner = $2 AND status = 'running' AND started_at IS NULL",
        )
        .bind(id)
        .bind(owner)
        .execute(p)
        .await
        .map_err(|e| self.err(e))?
        .rows_affected());
        Ok(n > 0)
    }

    // ---- replicas and the leader lease ----

    /// Registers replica `id` (again, if its row was dropped: a replica
    /// judged dead that is alive registers under its own id).
    pub async fn register_replica(&self, id: &str, host: &str, pid: u32) -> Result<(), StoreError> {
        let now = now_ms();
        on_pool!(self, p => sqlx::query(
            "INSERT INTO replicas (id, host, pid, started_at, heartbeat_at) VALUES ($1, $2, $3, $4, $4) \
             ON CONFLICT (id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at",
        )
        .bind(id)
        .bind(host)
        .bind(i64::from(pid))
        .bind(now)
        .execute(p)
        .await
        .map(|_| ())
        .map_err(|e| self.err(e))?);
        Ok(())
    }

    /// `false` when the replica's row is gone (another replica judged it
    /// dead and failed its runs: it must stop taking work).
    pub async fn heartbeat_replica(&self, id: &str) -> Result<bool, StoreError> {
        let n = on_pool!(self, p => sqlx::query("UPDATE replicas SET heartbeat_at = $2 WHERE id = $1")
            .bind(id)
            .bind(now_ms())
            .execute(p)
            .await
            .map_err(|e| self.err(e))?
            .rows_affected());
        Ok(n > 0)
    }

    pub async fn remove_replica(&self, id: &str) -> Result<(), StoreError> {
        on_pool!(self, p => sqlx::query("DELETE FROM replicas WHERE id = $1")
            .bind(id)
            .execute(p)
            .await
            .map(|_| ())
            .map_err(|e| self.err(e))?);
        Ok(())
    }

    /// Takes or renews the lease `name` for `holder` for `ttl_ms`: `true`
    /// when `holder` holds it now. A lease whose holder stopped renewing is
    /// taken over once it expires.
    pub async fn try_lease(
        &self,
        name: &str,
        holder: &str,
        ttl_ms: i64,
    ) -> Result<bool, StoreError> {
        let now = now_ms();
        let res = on_pool!(self, p => sqlx::query(
            "INSERT INTO leases (name, holder, expires_at) VALUES ($1, $2, $3) \
             ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at \
             WHERE leases.holder = excluded.holder OR leases.expires_at < $4",
        )
        .bind(name)
        .bind(holder)
        .bind(now + ttl_ms)
        .bind(now)
        .execute(p)
        .await
        .map_err(|e| self.err(e))?
        .rows_affected());
        Ok(res > 0)
    }

    /// Gives the lease up (a clean shutdown), if `holder` holds it.
    pub async fn release_lease(&self, name: &str, holder: &str) -> Result<(), StoreError> {
        on_pool!(self, p => sqlx::query("DELETE FROM leases WHERE name = $1 AND holder = $2")
            .bind(name)
            .bind(holder)
            .execute(p)
            .await
            .map(|_| ())
            .map_err(|e| self.err(e))?);
        Ok(())
    }

    /// The leader's sweep, in one transaction: replicas other than
    /// `sweeper` silent for more than `lease_ms` are dropped; every run
    /// still `running` under a replica that is not registered is failed
    /// with [`REPLICA_GONE`] (and its deliveries queued); deliveries such a
    /// replica had claimed are released at once. Runs of the embedded
    /// platform (no owner) are not touched. The caller judges whether its
    /// own view of the store is evidence enough to sweep (docs/serve.md).
    pub async fn sweep_dead_replicas(
        &self,
        lease_ms: i64,
        sweeper: &str,
    ) -> Result<Sweep, StoreError> {
        let now = now_ms();
        let end = RunEnd {
            status: RunStatus::Failed,
            exit_code: None,
            error: Some(REPLICA_GONE),
            at: now,
        };
        on_pool!(self, p => {
            let mut tx = p.begin().await.map_err(|e| self.err(e))?;
            let dropped: Vec<String> = sqlx::query_scalar(
                "DELETE FROM replicas WHERE heartbeat_at < $1 AND id <> $2 RETURNING id",
            )
            .bind(now - lease_ms)
            .bind(sweeper)
            .fetch_all(&mut *tx)
            .await
            .map_err(|e| self.err(e))?;
            let orphans: Vec<String> = sqlx::query_scalar(
                "SELECT id FROM runs WHERE status = 'running' AND owner IS NOT NULL \
                 AND owner NOT IN (SELECT id FROM replicas)",
            )
            .fetch_all(&mut *tx)
            .await
            .map_err(|e| self.err(e))?;
            let mut failed = Vec::new();
            for id in orphans {
                if end_run_in!(self, tx, &id, &end).await? {
                    failed.push(id);
                }
            }
            let released = sqlx::query(
                "UPDATE webhook_deliveries SET claimed_by = NULL, claimed_until = NULL \
                 WHERE state = 'pending' AND claimed_by IS NOT NULL \
                 AND claimed_by NOT IN (SELECT id FROM replicas)",
            )
            .execute(&mut *tx)
            .await
            .map_err(|e| self.err(e))?
            .rows_affected();
            tx.commit().await.map_err(|e| self.err(e))?;
            Ok(Sweep { dropped, failed, released })
        })
    }

    /// Ends a run and queues the deliveries its end owes, in one
    /// transaction (see the module's outbox). `false` if it had already
    /// ended.
    pub(crate) async fn end_run(&self, id: &str, end: &RunEnd<'_>) -> Result<bool, StoreError> {
        on_pool!(self, p => {
            let mut tx = p.begin().await.map_err(|e| self.err(e))?;
            let ended = end_run_in!(self, tx, id, end).await?;
            tx.commit().await.map_err(|e| self.err(e))?;
            Ok(ended)
        })
    }

    // ---- webhooks ----

    /// Stores a webhook, unless its organization already has `max`
    /// ([`StoreError::QuotaExceeded`]).
    pub async fn create_webhook(&self, w: &WebhookRow, max: Option<u64>) -> Result<(), StoreError> {
        let inserted = self
            .insert_within_quota(
                &w.org_id,
                "INSERT INTO webhooks (id, org_id, url, events, secret_envelope, created_at) \
                 SELECT $1, $2, $3, $4, $5, $6 WHERE (SELECT COUNT(*) FROM webhooks \
                 WHERE org_id = $2) < $7",
                &[&w.id, &w.org_id, &w.url, &w.events, &w.secret_envelope],
                w.created_at,
                max,
            )
            .await?;
        if !inserted {
            return Err(StoreError::QuotaExceeded {
                what: "webhooks",
                limit: max.unwrap_or(u64::MAX),
            });
        }
        Ok(())
    }

    /// Runs `sql` (an `INSERT … SELECT` of `texts` as `$1…`, then `at`,
    /// then the quota, that inserts only while the count is under it) for
    /// `org`; whether it inserted. On PostgreSQL the organization's
    /// creations are serialised by an advisory lock for the transaction:
    /// two at the same instant cannot both pass the count (SQLite has one
    /// writer at a time anyway).
    async fn insert_within_quota(
        &self,
        org: &str,
        sql: &'static str,
        texts: &[&str],
        at: i64,
        max: Option<u64>,
    ) -> Result<bool, StoreError> {
        let max = max.and_then(|m| i64::try_from(m).ok()).unwrap_or(i64::MAX);
        on_pool!(self, p => {
            let mut tx = p.begin().await.map_err(|e| self.err(e))?;
            if matches!(self.pool, Pool::Postgres(_)) {
                sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
                    .bind(org)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| self.err(e))?;
            }
            let mut q = sqlx::query(sql);
            for t in texts {
                q = q.bind(*t);
            }
            let n = q
                .bind(at)
                .bind(max)
                .execute(&mut *tx)
                .await
                .map_err(|e| self.err(e))?
                .rows_affected();
            tx.commit().await.map_err(|e| self.err(e))?;
            Ok(n > 0)
        })
    }

    pub async fn list_webhooks(&self, org: &str) -> Result<Vec<WebhookRow>, StoreError> {
        on_pool!(self, p => {
            let rows = sqlx::query(
                "SELECT id, org_id, url, events, secret_envelope, created_at FROM webhooks \
                 WHERE org_id = $1 ORDER BY created_at, id",
            )
            .bind(org)
            .fetch_all(p)
            .await
            .map_err(|e| self.err(e))?;
            rows.iter().map(|r| Ok(webhook_row!(r, self))).collect()
        })
    }

    pub async fn get_webhook(&self, org: &str, id: &str) -> Result<Option<WebhookRow>, StoreError> {
        on_pool!(self, p => {
            let row = sqlx::query(
                "SELECT id, org_id, url, events, secret_envelope, created_at FROM webhooks \
                 WHERE org_id = $1 AND id = $2",
            )
            .bind(org)
            .bind(id)
            .fetch_optional(p)
            .await
            .map_err(|e| self.err(e))?;
            row.map(|r| -> Result<WebhookRow, StoreError> { Ok(webhook_row!(r, self)) }).transpose()
        })
    }

    pub async fn delete_webhook(&self, org: &str, id: &str) -> Result<bool, StoreError> {
        let n = on_pool!(self, p => sqlx::query("DELETE FROM webhooks WHERE org_id = $1 AND id = $2")
            .bind(org)
            .bind(id)
            .execute(p)
            .await
            .map_err(|e| self.err(e))?
            .rows_affected());
        Ok(n > 0)
    }

    /// Queues one delivery (due at `next_attempt_at`), unless this run
    /// event already has one for this webhook: `false` then (one delivery
    /// id per event, whoever queues it).
    pub async fn enqueue_delivery(&self, d: &DeliveryRow) -> Result<bool, StoreError> {
        let n = on_pool!(self, p => sqlx::query(
            "INSERT INTO webhook_deliveries (id, webhook_id, org_id, run_id, event, payload, state, \
             attempts, next_attempt_at, created_at, event_key) \
             VALUES ($1, $2, $3, $4, $5, $6, 'pending', 0, $7, $8, $9) ON CONFLICT DO NOTHING",
        )
        .bind(&d.id)
        .bind(&d.webhook_id)
        .bind(&d.org_id)
        .bind(&d.run_id)
        .bind(&d.event)
        .bind(&d.payload)
        .bind(d.next_attempt_at)
        .bind(d.created_at)
        .bind(event_key(&d.run_id, &d.event))
        .execute(p)
        .await
        .map_err(|e| self.err(e))?
        .rows_affected());
        Ok(n > 0)
    }

    /// Sets the body of a delivery queued by a run's end (an outbox row is
    /// queued without one), once: every retry sends the same bytes.
    /// Returns the body the delivery has now.
    pub async fn render_delivery(&self, id: &str, payload: &str) -> Result<String, StoreError> {
        on_pool!(self, p => {
            sqlx::query("UPDATE webhook_deliveries SET payload = $2 WHERE id = $1 AND payload = ''")
                .bind(id)
                .bind(payload)
                .execute(p)
                .await
                .map_err(|e| self.err(e))?;
            sqlx::query_scalar("SELECT payload FROM webhook_deliveries WHERE id = $1")
                .bind(id)
                .fetch_one(p)
                .await
                .map_err(|e| self.err(e))
        })
    }

    /// Releases every claim `claimer` holds on a pending delivery (a
    /// replica that stops): another replica may send them at once.
    pub async fn release_delivery_claims(&self, claimer: &str) -> Result<u64, StoreError> {
        on_pool!(self, p => sqlx::query(
            "UPDATE webhook_deliveries SET claimed_by = NULL, claimed_until = NULL \
             WHERE claimed_by = $1 AND state = 'pending'",
        )
        .bind(claimer)
        .execute(p)
        .await
        .map(|r| r.rows_affected())
        .map_err(|e| self.err(e)))
    }

    /// Claims up to `limit` pending deliveries that are due, for `claimer`,
    /// for `hold_ms` (another replica does not take them meanwhile; if the
    /// claimer dies they are due again when the hold ends). No fairness:
    /// [`Store::claim_due_deliveries_fairly`] with no bound per organization.
    pub async fn claim_due_deliveries(
        &self,
        claimer: &str,
        hold_ms: i64,
        limit: i64,
    ) -> Result<Vec<DeliveryRow>, StoreError> {
        self.claim_due_deliveries_fairly(claimer, hold_ms, limit, |_| limit)
            .await
    }

    /// As [`Store::claim_due_deliveries`], taken fairly: organizations in
    /// turn (each one's oldest due first, then each one's second, …), and
    /// at most `room(org)` of one organization's (the claimer's free share
    /// for it). One organization's backlog never fills a batch while
    /// another's delivery is due.
    pub async fn claim_due_deliveries_fairly(
        &self,
        claimer: &str,
        hold_ms: i64,
        limit: i64,
        room: impl Fn(&str) -> i64,
    ) -> Result<Vec<DeliveryRow>, StoreError> {
        let now = now_ms();
        let candidates: Vec<(String, String)> = on_pool!(self, p => sqlx::query_as(
            "SELECT id, org_id FROM (SELECT id, org_id, next_attempt_at, \
             ROW_NUMBER() OVER (PARTITION BY org_id ORDER BY next_attempt_at, id) AS turn \
             FROM webhook_deliveries WHERE state = 'pending' AND next_attempt_at <= $1 \
             AND (claimed_until IS NULL OR claimed_until < $1)) due \
             WHERE turn <= $2 ORDER BY turn, next_attempt_at, id LIMIT $3",
        )
        .bind(now)
        .bind(limit)
        .bind(limit.saturating_mul(4))
        .fetch_all(p)
        .await
        .map_err(|e| self.err(e))?);
        let mut taken: std::collections::HashMap<&str, i64> = std::collections::HashMap::new();
        let mut ids = Vec::new();
        for (id, org) in &candidates {
            if i64::try_from(ids.len()).unwrap_or(i64::MAX) >= limit {
                break;
            }
            let t = taken.entry(org.as_str()).or_default();
            if *t < room(org) {
                *t += 1;
                ids.push(id.clone());
            }
        }
        let mut out = Vec::new();
        for id in ids {
            let n = on_pool!(self, p => sqlx::query(
                "UPDATE webhook_deliveries SET claimed_by = $2, claimed_until = $3 \
                 WHERE id = $1 AND state = 'pending' AND (claimed_until IS NULL OR claimed_until < $4)",
            )
            .bind(&id)
            .bind(claimer)
            .bind(now + hold_ms)
            .bind(now)
            .execute(p)
            .await
            .map_err(|e| self.err(e))?
            .rows_affected());
            if n == 0 {
                continue;
            }
            let row = on_pool!(self, p => {
                let r = sqlx::query(concat!("SELECT ", delivery_columns!(), " FROM webhook_deliveries WHERE id = $1"))
                    .bind(&id)
                    .fetch_one(p)
                    .await
                    .map_err(|e| self.err(e))?;
                delivery_row!(r, self)
            });
            out.push(row);
        }
        Ok(out)
    }

    /// Records one attempt's outcome and releases the claim.
    pub async fn record_delivery_attempt(
        &self,
        id: &str,
        a: &DeliveryAttempt<'_>,
    ) -> Result<(), StoreError> {
        let now = now_ms();
        let state = if a.delivered {
            "delivered"
        } else if a.retry_at.is_some() {
            "pending"
        } else {
            "failed"
        };
        on_pool!(self, p => sqlx::query(
            "UPDATE webhook_deliveries SET attempts = attempts + 1, state = $2, last_status = $3, \
             last_error = $4, next_attempt_at = $5, delivered_at = $6, claimed_by = NULL, \
             claimed_until = NULL WHERE id = $1",
        )
        .bind(id)
        .bind(state)
        .bind(a.status)
        .bind(a.error)
        .bind(a.retry_at.unwrap_or(now))
        .bind(a.delivered.then_some(now))
        .execute(p)
        .await
        .map(|_| ())
        .map_err(|e| self.err(e))?);
        Ok(())
    }

    /// One of `org`'s webhook's deliveries, newest first, at most `limit`;
    /// with `before` (a page's last `(created_at, id)`), those after it in
    /// that order (the next page).
    pub async fn list_deliveries(
        &self,
        org: &str,
        webhook_id: &str,
        limit: i64,
        before: Option<(i64, &str)>,
    ) -> Result<Vec<DeliveryRow>, StoreError> {
        let (before_at, before_id) = match before {
            Some((at, id)) => (at, Some(id)),
            None => (i64::MAX, None),
        };
        on_pool!(self, p => {
            let rows = sqlx::query(concat!(
                "SELECT ", delivery_columns!(), " FROM webhook_deliveries \
                 WHERE org_id = $1 AND webhook_id = $2 \
                 AND (created_at < $4 OR (created_at = $4 AND $5 IS NOT NULL AND id < $5)) \
                 ORDER BY created_at DESC, id DESC LIMIT $3"
            ))
            .bind(org)
            .bind(webhook_id)
            .bind(limit)
            .bind(before_at)
            .bind(before_id)
            .fetch_all(p)
            .await
            .map_err(|e| self.err(e))?;
            rows.iter().map(|r| Ok(delivery_row!(r, self))).collect()
        })
    }
}
