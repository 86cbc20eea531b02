//! The store suite: every test runs on SQLite and on PostgreSQL.
//!
//! PostgreSQL comes from `AIRLOCK_TEST_DATABASE_URL` (`.ci/postgres.sh` starts one); each test
//! gets its own schema. Unset: a failure in CI, a loud skip elsewhere.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use airlock_store::*;
use airlock_vault::{ExposeSecret as _, Keyring, VaultError};
use std::time::Duration;

/// A new SQLite store in a directory of its own (its file: [`db_file`]).
async fn sqlite() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_sqlite(&db_file(&dir), &StoreOptions::default())
        .await
        .unwrap();
    (dir, store)
}

/// The database file of a store [`sqlite`] made in `dir`.
fn db_file(dir: &tempfile::TempDir) -> std::path::PathBuf {
    dir.path().join("airlock.db")
}

fn pg_url() -> Option<String> {
    let url = std::env::var("AIRLOCK_TEST_DATABASE_URL")
        .ok()
        .filter(|u| !u.is_empty());
    airlock_test_support::require_peer(
        "PostgreSQL",
        url.ok_or("not available (set AIRLOCK_TEST_DATABASE_URL)"),
    )
}

/// A store on a fresh PostgreSQL schema (dropped by [`drop_schema`] when the test passes).
async fn postgres() -> Option<(Store, String, String)> {
    use sqlx::Connection as _;
    let url = pg_url()?;
    let schema = format!(
        "t_{}_{}",
        std::process::id(),
        airlock_vault::random_bytes::<6>()
            .unwrap()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
    let mut c = sqlx::PgConnection::connect(&url).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .execute(&mut c)
        .await
        .unwrap();
    c.close().await.unwrap();
    let sep = if url.contains('?') { '&' } else { '?' };
    let scoped = format!("{url}{sep}options[search_path]={schema}");
    let store = Store::open(&scoped, &StoreOptions::default())
        .await
        .unwrap();
    Some((store, url, schema))
}

async fn drop_schema(url: &str, schema: &str) {
    use sqlx::Connection as _;
    let mut c = sqlx::PgConnection::connect(url).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(&mut c)
        .await
        .unwrap();
    c.close().await.unwrap();
}

macro_rules! on_both {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test]
            async fn sqlite() {
                let (_dir, s) = super::sqlite().await;
                assert_eq!(s.backend(), super::Backend::Sqlite);
                super::$name(&s).await;
            }
            #[tokio::test]
            async fn postgres() {
                let Some((s, url, schema)) = super::postgres().await else { return };
                assert_eq!(s.backend(), super::Backend::Postgres);
                super::$name(&s).await;
                s.close().await;
                super::drop_schema(&url, &schema).await;
            }
        }
    )*};
}

on_both!(
    migrations_are_idempotent,
    an_organizations_proxy_and_a_runs,
    an_approval_is_settled_once_and_seen_only_by_its_organization,
    a_runs_approvals_are_bounded_exactly_even_when_asked_for_at_once,
    connections_crud,
    reencrypt_in_batches,
    reencrypt_failure_rolls_back_the_batch,
    runs,
    a_runs_phases_are_stored_once_each,
    events,
    egress_log,
    a_runs_audit_pages_through_both_tables_in_time_order,
    egress_records_are_started_then_completed,
    egress_batches_written_whole,
    egress_batches_written_by_statement,
    the_own_connection_writes_what_the_pool_reads,
    memories,
    results,
    journalled_events_are_stored_once_and_their_usage_added_once,
    run_slots_are_claimed_atomically,
    a_different_key_under_a_known_key_id_is_refused,
    organizations_see_only_their_own_rows,
    the_queue_starts_runs_in_order_within_both_limits,
    cancelling_a_queued_or_running_run,
    the_leader_lease_is_taken_over_only_when_it_expires,
    a_dead_replicas_runs_are_failed_and_no_other_runs,
    webhook_deliveries_are_claimed_once_and_retried,
    every_change_to_the_connections_moves_their_version,
    a_runs_end_queues_its_deliveries_once_whoever_ends_it,
    a_dead_replicas_claimed_deliveries_are_released_by_the_sweep,
    a_replica_judged_dead_registers_again_and_a_lost_claim_is_requeued,
    retention_sweeps_what_is_over_and_old_and_nothing_else,
    quotas_bound_keys_and_webhooks_even_when_created_at_once,
    agents_are_bounded_per_organization_even_when_registered_at_once,
    stored_bytes_are_measured_per_organization_and_refuse_new_runs,
    org_budgets_are_reserved_within_every_limit_and_settled,
    past_budget_spend_is_swept_and_the_current_periods_kept,
    racing_reservations_never_pass_a_budget_that_fits_fewer,
    a_runs_budget_crosses_each_threshold_once_with_its_deliveries,
    an_approvals_deliveries_are_queued_once_per_webhook_and_event,
    racing_settlements_cross_an_org_threshold_once,
    artifacts_are_stored_within_the_run_and_organization_caps_even_at_once,
    queued_runs_and_connections_are_bounded_per_organization_even_at_once,
    revoked_keys_and_memories_are_kept_bounded,
    a_runs_policy_changes_are_versioned_bounded_and_never_lost,
);

fn queued<'a>(org: &'a str, id: &'a str) -> airlock_store::NewQueuedRun<'a> {
    airlock_store::NewQueuedRun {
        org,
        id,
        agent: "a",
        backend: "process",
        model: None,
        prompt: Some("hello"),
        hints: None,
        inputs: None,
        max_queued: None,
    }
}

/// Every lookup that names an organization finds only that organization's
/// rows, whatever id is guessed.
async fn organizations_see_only_their_own_rows(s: &Store) {
    s.create_org("org_a", "A", None).await.unwrap();
    s.create_org("org_b", "B", None).await.unwrap();
    assert!(s.create_org("org_a", "again", None).await.is_err());
    let r = ring("k1", 1);
    for org in ["org_a", "org_b"] {
        let env = r.encrypt(org.as_bytes()).unwrap();
        // The same name in two organizations: two connections.
        s.insert_connection(&NewConnection {
            org,
            name: "gh",
            integration: "gh",
            auth_type: AuthType::Bearer,
            envelope: &env,
        })
        .await
        .unwrap();
    }
    let a = s.get_connection("org_a", "gh").await.unwrap().unwrap();
    let b = s.get_connection("org_b", "gh").await.unwrap().unwrap();
    assert_ne!(a.envelope, b.envelope);
    assert_eq!(
        r.decrypt_string(&b.envelope).unwrap().expose_secret(),
        "org_b"
    );
    assert!(
        s.get_connection(airlock_store::LOCAL_ORG, "gh")
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(s.list_connections("org_a").await.unwrap().len(), 1);
    assert!(!s.delete_connection("org_a", "nope").await.unwrap());
    assert!(s.delete_connection("org_a", "gh").await.unwrap());
    assert!(s.get_connection("org_b", "gh").await.unwrap().is_some());

    s.enqueue_run(&queued("org_a", "run_a1")).await.unwrap();
    assert!(s.get_run_in("org_a", "run_a1").await.unwrap().is_some());
    assert!(s.get_run_in("org_b", "run_a1").await.unwrap().is_none());
    assert_eq!(
        s.request_cancel("org_b", "run_a1", "test").await.unwrap(),
        airlock_store::CancelOutcome::NotFound
    );
    assert_eq!(
        s.get_run("run_a1").await.unwrap().unwrap().status,
        RunStatus::Queued
    );
    let q = |org| RunQuery {
        org: Some(org),
        ..Default::default()
    };
    assert_eq!(s.list_runs(&q("org_a")).await.unwrap().len(), 1);
    assert!(s.list_runs(&q("org_b")).await.unwrap().is_empty());

    s.put_agent("org_a", "bot", "[agent]", "{}", None)
        .await
        .unwrap();
    assert!(s.get_agent("org_b", "bot").await.unwrap().is_none());
    assert!(!s.delete_agent("org_b", "bot").await.unwrap());
    assert!(s.get_agent("org_a", "bot").await.unwrap().is_some());

    s.insert_api_key("key_a", "org_a", "ci", "h", None)
        .await
        .unwrap();
    assert!(!s.revoke_api_key("org_b", "key_a").await.unwrap());
    assert!(
        s.get_api_key("key_a")
            .await
            .unwrap()
            .unwrap()
            .revoked_at
            .is_none()
    );
    assert!(s.revoke_api_key("org_a", "key_a").await.unwrap());
    assert!(
        s.get_api_key("key_a")
            .await
            .unwrap()
            .unwrap()
            .revoked_at
            .is_some()
    );

    s.add_memory("org_a", "bot", None, "a's").await.unwrap();
    assert!(
        s.list_memories("org_b", "bot", 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(s.list_memories("org_a", "bot", 10).await.unwrap().len(), 1);
}

/// Queued runs start in the order they were queued, never more than the
/// platform's limit at once, nor more than an organization's own.
async fn the_queue_starts_runs_in_order_within_both_limits(s: &Store) {
    s.create_org("small", "S", Some(1)).await.unwrap();
    s.create_org("big", "B", None).await.unwrap();
    for id in ["s1", "s2", "b1", "b2", "b3"] {
        let org = if id.starts_with('s') { "small" } else { "big" };
        s.enqueue_run(&queued(org, id)).await.unwrap();
    }
    assert_eq!(s.queue_position("s1").await.unwrap(), Some(0));
    assert_eq!(s.queue_position("b3").await.unwrap(), Some(4));
    let claim = || async {
        s.claim_next_run("rep1", Some(3))
            .await
            .unwrap()
            .map(|c| c.run.id)
    };
    assert_eq!(claim().await.as_deref(), Some("s1"));
    // s2 waits for its organization's one slot; b1 goes past it.
    assert_eq!(claim().await.as_deref(), Some("b1"));
    assert_eq!(claim().await.as_deref(), Some("b2"));
    // Three running: the platform's limit.
    assert_eq!(claim().await, None);
    let c = s.get_run("s1").await.unwrap().unwrap();
    assert_eq!(
        (c.status, c.owner.as_deref()),
        (RunStatus::Running, Some("rep1"))
    );
    s.finish_run(
        "s1",
        &RunEnd {
            status: RunStatus::Succeeded,
            exit_code: Some(0),
            error: None,
            at: 1,
        },
    )
    .await
    .unwrap();
    let next = s.claim_next_run("rep2", Some(3)).await.unwrap().unwrap();
    assert_eq!(next.run.id, "s2");
    assert_eq!(next.prompt.as_deref(), Some("hello"));
    assert_eq!(s.queue_position("b3").await.unwrap(), Some(0));
    assert_eq!(s.queue_position("s2").await.unwrap(), None);
}

async fn cancelling_a_queued_or_running_run(s: &Store) {
    s.enqueue_run(&queued("o", "q1")).await.unwrap();
    s.enqueue_run(&queued("o", "q2")).await.unwrap();
    use airlock_store::CancelOutcome;
    assert_eq!(
        s.request_cancel("o", "q1", "cancelled through the API with key k1")
            .await
            .unwrap(),
        CancelOutcome::CancelledQueued
    );
    assert_eq!(
        s.get_run("q1").await.unwrap().unwrap().status,
        RunStatus::Cancelled
    );
    // A cancelled run is never claimed.
    let c = s.claim_next_run("rep", None).await.unwrap().unwrap();
    assert_eq!(c.run.id, "q2");
    assert!(s.cancel_requests_of("rep").await.unwrap().is_empty());
    assert_eq!(
        s.request_cancel("o", "q2", "cancelled through the API with key k2")
            .await
            .unwrap(),
        CancelOutcome::Requested
    );
    assert_eq!(
        s.cancel_requests_of("rep").await.unwrap(),
        vec![(
            "q2".to_owned(),
            "cancelled through the API with key k2".to_owned()
        )]
    );
    // Each end says who asked.
    assert_eq!(
        s.get_run("q1").await.unwrap().unwrap().error.as_deref(),
        Some("cancelled through the API with key k1")
    );
    assert!(s.cancel_requests_of("other").await.unwrap().is_empty());
    assert_eq!(
        s.request_cancel("o", "q1", "cancelled through the API with key k1")
            .await
            .unwrap(),
        CancelOutcome::AlreadyEnded(RunStatus::Cancelled)
    );
}

async fn the_leader_lease_is_taken_over_only_when_it_expires(s: &Store) {
    assert!(s.try_lease("leader", "a", 60_000).await.unwrap());
    assert!(!s.try_lease("leader", "b", 60_000).await.unwrap());
    assert!(s.try_lease("leader", "a", 60_000).await.unwrap(), "renewal");
    // a stops renewing: a lease that has expired is b's.
    assert!(s.try_lease("leader", "a", -1).await.unwrap());
    assert!(s.try_lease("leader", "b", 60_000).await.unwrap());
    assert!(!s.try_lease("leader", "a", 60_000).await.unwrap());
    s.release_lease("leader", "a").await.unwrap();
    assert!(
        !s.try_lease("leader", "a", 60_000).await.unwrap(),
        "a released nothing"
    );
    s.release_lease("leader", "b").await.unwrap();
    assert!(s.try_lease("leader", "a", 60_000).await.unwrap());
}

async fn a_dead_replicas_runs_are_failed_and_no_other_runs(s: &Store) {
    s.register_replica("live", "h", 1).await.unwrap();
    s.register_replica("dead", "h", 2).await.unwrap();
    for id in ["l1", "d1", "d2", "w1"] {
        s.enqueue_run(&queued("o", id)).await.unwrap();
    }
    for owner in ["live", "dead", "dead"] {
        s.claim_next_run(owner, None).await.unwrap().unwrap();
    }
    new_run(s, "embedded").await;
    assert!(
        s.sweep_dead_replicas(60_000, "live")
            .await
            .unwrap()
            .failed
            .is_empty()
    );
    // "dead" stops its heartbeats; "live" keeps them.
    s.remove_replica("dead").await.unwrap();
    assert!(s.heartbeat_replica("live").await.unwrap());
    assert!(
        !s.heartbeat_replica("dead").await.unwrap(),
        "a swept replica must stop"
    );
    let mut failed = s.sweep_dead_replicas(60_000, "live").await.unwrap().failed;
    failed.sort();
    assert_eq!(failed, vec!["d1".to_owned(), "d2".to_owned()]);
    let d1 = s.get_run("d1").await.unwrap().unwrap();
    assert_eq!(d1.status, RunStatus::Failed);
    assert_eq!(d1.error.as_deref(), Some(airlock_store::REPLICA_GONE));
    for (id, st) in [
        ("l1", RunStatus::Running),
        ("w1", RunStatus::Queued),
        ("embedded", RunStatus::Running),
    ] {
        assert_eq!(s.get_run(id).await.unwrap().unwrap().status, st, "{id}");
    }
    // A replica silent past the lease is dropped, then its runs failed;
    // never the sweeper itself.
    let swept = s.sweep_dead_replicas(-1, "sweeper").await.unwrap();
    assert_eq!(swept.failed, vec!["l1".to_owned()]);
    assert_eq!(swept.dropped, vec!["live".to_owned()]);
}

async fn webhook_deliveries_are_claimed_once_and_retried(s: &Store) {
    let hook = airlock_store::WebhookRow {
        id: "wh1".into(),
        org_id: "o".into(),
        url: "http://127.0.0.1:1/".into(),
        events: "[\"run.succeeded\"]".into(),
        secret_envelope: "v1:k1:x".into(),
        created_at: 1,
    };
    s.create_webhook(&hook, None).await.unwrap();
    assert!(s.get_webhook("other", "wh1").await.unwrap().is_none());
    assert_eq!(s.list_webhooks("o").await.unwrap(), vec![hook.clone()]);
    let d = airlock_store::DeliveryRow {
        id: "d1".into(),
        webhook_id: "wh1".into(),
        org_id: "o".into(),
        run_id: "r".into(),
        event: "run.succeeded".into(),
        payload: "{}".into(),
        state: "pending".into(),
        attempts: 0,
        last_status: None,
        last_error: None,
        next_attempt_at: 0,
        created_at: 1,
        delivered_at: None,
    };
    s.enqueue_delivery(&d).await.unwrap();
    let got = s.claim_due_deliveries("a", 60_000, 10).await.unwrap();
    assert_eq!(got.len(), 1);
    assert!(
        s.claim_due_deliveries("b", 60_000, 10)
            .await
            .unwrap()
            .is_empty(),
        "claimed once"
    );
    s.record_delivery_attempt(
        "d1",
        &airlock_store::DeliveryAttempt {
            status: Some(500),
            error: Some("HTTP 500"),
            delivered: false,
            retry_at: Some(0),
        },
    )
    .await
    .unwrap();
    let again = s.claim_due_deliveries("b", 60_000, 10).await.unwrap();
    assert_eq!(again[0].attempts, 1);
    assert_eq!(again[0].last_status, Some(500));
    s.record_delivery_attempt(
        "d1",
        &airlock_store::DeliveryAttempt {
            status: Some(204),
            error: None,
            delivered: true,
            retry_at: None,
        },
    )
    .await
    .unwrap();
    let list = s.list_deliveries("o", "wh1", 10, None).await.unwrap();
    assert_eq!((list[0].state.as_str(), list[0].attempts), ("delivered", 2));
    assert!(
        s.list_deliveries("other", "wh1", 10, None)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(s.claim_due_deliveries("c", 0, 10).await.unwrap().is_empty());
    assert!(!s.delete_webhook("other", "wh1").await.unwrap());
    assert!(s.delete_webhook("o", "wh1").await.unwrap());
}

fn hook(id: &str, org: &str, events: &[&str]) -> airlock_store::WebhookRow {
    airlock_store::WebhookRow {
        id: id.into(),
        org_id: org.into(),
        url: "http://127.0.0.1:1/".into(),
        events: serde_json::to_string(events).unwrap(),
        secret_envelope: "v1:k1:x".into(),
        created_at: 1,
    }
}

/// The outbox: a run's end queues a delivery for each webhook of its
/// organization subscribed to its event, in the write that stores the end;
/// whoever ends it, and however often a second end is tried, one delivery
/// (one id) per webhook per event; its body is set once.
async fn a_runs_end_queues_its_deliveries_once_whoever_ends_it(s: &Store) {
    s.create_webhook(&hook("wh_f", "o", &["run.failed", "run.cancelled"]), None)
        .await
        .unwrap();
    s.create_webhook(&hook("wh_s", "o", &["run.succeeded"]), None)
        .await
        .unwrap();
    s.create_webhook(&hook("wh_x", "other", &["run.failed"]), None)
        .await
        .unwrap();
    s.register_replica("rep", "h", 1).await.unwrap();
    for id in ["r1", "r2", "q1"] {
        s.enqueue_run(&queued("o", id)).await.unwrap();
    }
    for _ in 0..2 {
        s.claim_next_run("rep", None).await.unwrap().unwrap();
    }
    // r1 ends through its replica's orchestrator …
    assert!(s.fail_run("r1", "the agent exited 3").await.unwrap());
    let d = s.list_deliveries("o", "wh_f", 10, None).await.unwrap();
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(
        (
            d[0].run_id.as_str(),
            d[0].event.as_str(),
            d[0].state.as_str()
        ),
        ("r1", "run.failed", "pending")
    );
    assert!(d[0].id.starts_with("dlv_"), "{}", d[0].id);
    assert!(d[0].payload.is_empty(), "rendered when first sent");
    assert!(
        s.list_deliveries("o", "wh_s", 10, None)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        s.list_deliveries("other", "wh_x", 10, None)
            .await
            .unwrap()
            .is_empty()
    );
    // … and a second end (a sweep, a reclaim, a late replica) changes
    // nothing and queues nothing.
    assert!(!s.fail_run("r1", airlock_store::REPLICA_GONE).await.unwrap());
    assert!(
        !s.finish_run(
            "r1",
            &RunEnd {
                status: RunStatus::Succeeded,
                exit_code: Some(0),
                error: None,
                at: 2,
            }
        )
        .await
        .unwrap()
    );
    // Queueing the same event by hand is refused as well.
    let mut again = d[0].clone();
    again.id = "dlv_other".into();
    assert!(!s.enqueue_delivery(&again).await.unwrap());
    assert_eq!(
        s.list_deliveries("o", "wh_f", 10, None)
            .await
            .unwrap()
            .len(),
        1
    );
    let r1 = s.get_run("r1").await.unwrap().unwrap();
    assert_eq!(r1.error.as_deref(), Some("the agent exited 3"));
    // The body is set once: every retry sends the same bytes.
    assert_eq!(
        s.render_delivery(&d[0].id, "{\"a\":1}").await.unwrap(),
        "{\"a\":1}"
    );
    assert_eq!(
        s.render_delivery(&d[0].id, "{\"b\":2}").await.unwrap(),
        "{\"a\":1}"
    );
    // r2's replica dies: the sweep's end queues its delivery, once.
    s.remove_replica("rep").await.unwrap();
    let swept = s.sweep_dead_replicas(60_000, "leader").await.unwrap();
    assert_eq!(swept.failed, vec!["r2".to_owned()]);
    assert!(
        s.sweep_dead_replicas(60_000, "leader")
            .await
            .unwrap()
            .failed
            .is_empty()
    );
    // A queued run cancelled through the API: its delivery with its end.
    assert_eq!(
        s.request_cancel("o", "q1", "cancelled through the API with key k1")
            .await
            .unwrap(),
        CancelOutcome::CancelledQueued
    );
    let mut events: Vec<(String, String)> = s
        .list_deliveries("o", "wh_f", 10, None)
        .await
        .unwrap()
        .into_iter()
        .map(|d| (d.run_id, d.event))
        .collect();
    events.sort();
    assert_eq!(
        events,
        [
            ("q1", "run.cancelled"),
            ("r1", "run.failed"),
            ("r2", "run.failed")
        ]
        .map(|(a, b)| (a.to_owned(), b.to_owned()))
    );
}

/// A delivery claimed by a replica that died is due again as soon as the
/// leader judges it dead, not after the claim's hold.
async fn a_dead_replicas_claimed_deliveries_are_released_by_the_sweep(s: &Store) {
    s.create_webhook(&hook("wh1", "o", &["run.succeeded"]), None)
        .await
        .unwrap();
    s.register_replica("dead", "h", 1).await.unwrap();
    s.register_replica("live", "h", 2).await.unwrap();
    s.enqueue_run(&queued("o", "r1")).await.unwrap();
    s.claim_next_run("live", None).await.unwrap().unwrap();
    assert!(
        s.finish_run(
            "r1",
            &RunEnd {
                status: RunStatus::Succeeded,
                exit_code: Some(0),
                error: None,
                at: now_ms(),
            }
        )
        .await
        .unwrap()
    );
    let held = s.claim_due_deliveries("dead", 120_000, 10).await.unwrap();
    assert_eq!(held.len(), 1);
    assert!(
        s.claim_due_deliveries("live", 120_000, 10)
            .await
            .unwrap()
            .is_empty()
    );
    // "dead" stops heartbeating; "live" sweeps (it is never swept itself).
    s.heartbeat_replica("live").await.unwrap();
    let swept = s.sweep_dead_replicas(-1, "live").await.unwrap();
    assert_eq!(swept.dropped, vec!["dead".to_owned()]);
    assert_eq!(swept.released, 1);
    let due = s.claim_due_deliveries("live", 120_000, 10).await.unwrap();
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].id, held[0].id, "the same delivery, the same id");
    // A replica that stops releases its own.
    assert_eq!(s.release_delivery_claims("live").await.unwrap(), 1);
    assert_eq!(
        s.claim_due_deliveries("x", 120_000, 10)
            .await
            .unwrap()
            .len(),
        1
    );
}

/// A replica whose row was dropped registers again under its id; a run it
/// claimed but never started (the claim's answer lost) goes back to the
/// queue, in its place; a started one is never requeued.
async fn a_replica_judged_dead_registers_again_and_a_lost_claim_is_requeued(s: &Store) {
    s.register_replica("rep", "h", 1).await.unwrap();
    s.register_replica("rep", "h", 1).await.unwrap();
    s.remove_replica("rep").await.unwrap();
    assert!(!s.heartbeat_replica("rep").await.unwrap());
    s.register_replica("rep", "h", 1).await.unwrap();
    assert!(s.heartbeat_replica("rep").await.unwrap());
    for id in ["a", "b"] {
        s.enqueue_run(&queued("o", id)).await.unwrap();
    }
    let a = s.claim_next_run("rep", None).await.unwrap().unwrap();
    assert_eq!(a.run.id, "a");
    assert_eq!(
        s.running_runs_of("rep").await.unwrap(),
        vec![("a".to_owned(), false)]
    );
    assert!(!s.requeue_unstarted("a", "other").await.unwrap());
    assert!(s.requeue_unstarted("a", "rep").await.unwrap());
    let a = s.get_run("a").await.unwrap().unwrap();
    assert_eq!((a.status, a.owner), (RunStatus::Queued, None));
    // Still first in the queue.
    let again = s.claim_next_run("rep", None).await.unwrap().unwrap();
    assert_eq!(again.run.id, "a");
    s.mark_run_started("a", now_ms()).await.unwrap();
    assert_eq!(
        s.running_runs_of("rep").await.unwrap(),
        vec![("a".to_owned(), true)]
    );
    assert!(!s.requeue_unstarted("a", "rep").await.unwrap());
}

/// The end and its deliveries are one transaction: when the deliveries
/// cannot be written, the end is not stored either (and is stored, with
/// them, once they can).
#[tokio::test]
async fn sqlite_an_end_is_never_stored_without_its_deliveries() {
    use sqlx::Connection as _;
    let (dir, s) = sqlite().await;
    s.create_webhook(&hook("wh1", "o", &["run.failed"]), None)
        .await
        .unwrap();
    s.enqueue_run(&queued("o", "r1")).await.unwrap();
    s.claim_next_run("rep", None).await.unwrap().unwrap();
    let raw = |sql: &'static str| {
        let path = db_file(&dir);
        async move {
            let mut c = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
                .await
                .unwrap();
            sqlx::raw_sql(sql).execute(&mut c).await.unwrap();
            c.close().await.unwrap();
        }
    };
    raw("ALTER TABLE webhook_deliveries RENAME TO webhook_deliveries_away").await;
    let err = s.fail_run("r1", "boom").await.unwrap_err();
    assert!(
        err.chain().to_string().contains("webhook_deliveries"),
        "{}",
        err.chain()
    );
    let r1 = s.get_run("r1").await.unwrap().unwrap();
    assert_eq!((r1.status, r1.ended_at), (RunStatus::Running, None));
    raw("ALTER TABLE webhook_deliveries_away RENAME TO webhook_deliveries").await;
    assert!(s.fail_run("r1", "boom").await.unwrap());
    assert_eq!(
        s.list_deliveries("o", "wh1", 10, None).await.unwrap().len(),
        1
    );
}

/// A full disk under a SQLite store is its own error, with the cause kept
/// as its source (a tmpfs of 1 MiB, mounted here: needs root).
#[tokio::test]
async fn sqlite_a_full_disk_is_a_typed_error_with_its_cause() {
    let Some(mnt) = SmallFs::mount(1) else { return };
    let s = Store::open_sqlite(&mnt.path().join("airlock.db"), &StoreOptions::default())
        .await
        .unwrap();
    s.enqueue_run(&queued("o", "r1")).await.unwrap();
    mnt.fill();
    let big = "x".repeat(256 * 1024);
    let mut err = None;
    let mut stored = 0;
    for i in 0..64 {
        match s
            .append_event(&NewEvent {
                run_id: "r1",
                at: i,
                kind: "log",
                payload: &big,
            })
            .await
        {
            Ok(_) => stored += 1,
            Err(e) => {
                err = Some(e);
                break;
            }
        }
    }
    // (A write SQLite rolled back at its commit was once reported as done:
    // 16 MiB "stored" on a full 1 MiB disk.)
    let err = err.expect("a full disk refuses a write, and says so");
    assert!(matches!(err, StoreError::Full { .. }), "{err:?}");
    assert!(err.is_transient());
    let chain = err.chain().to_string();
    assert!(chain.contains("full"), "the cause is kept: {chain}");
    assert!(
        std::error::Error::source(&err).is_some(),
        "the driver's error is the source"
    );
    // Space again: the store works; what it refused is not there, what it
    // said it stored is.
    mnt.unfill();
    s.append_event(&NewEvent {
        run_id: "r1",
        at: 99,
        kind: "log",
        payload: "after",
    })
    .await
    .unwrap();
    let evs = s.list_events("r1", 0, 1000).await.unwrap();
    assert_eq!(evs.last().map(|e| e.payload.as_str()), Some("after"));
    assert_eq!(evs.len(), stored + 1, "exactly what was said stored");
    s.close().await;
}

/// A tmpfs of a few MiB of the test's own, unmounted on drop.
struct SmallFs {
    dir: tempfile::TempDir,
}

impl SmallFs {
    fn mount(mib: u32) -> Option<SmallFs> {
        let dir = tempfile::tempdir().unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(dir.path())
            .status()
            .is_ok_and(|s| s.success());
        airlock_test_support::require_peer(
            "root (to mount a tmpfs)",
            ok.then_some(()).ok_or("cannot mount a tmpfs (not root?)"),
        )?;
        Some(SmallFs { dir })
    }
    fn path(&self) -> &std::path::Path {
        self.dir.path()
    }
    /// Fills what is left with a file.
    fn fill(&self) {
        use std::io::Write as _;
        let mut f = std::fs::File::create(self.path().join("filler")).unwrap();
        let chunk = vec![0u8; 4096];
        while f.write_all(&chunk).is_ok() {}
        let _ = f.sync_all();
    }
    fn unfill(&self) {
        std::fs::remove_file(self.path().join("filler")).unwrap();
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// A key id names one key for the life of a store: another key under the
/// same id (a typo, another machine's key) is refused before it writes or
/// reads anything, also on a store written before key-check values.
async fn a_different_key_under_a_known_key_id_is_refused(s: &Store) {
    let a = ring("k1", 1);
    let b = ring("k1", 2);
    let put = |name: &'static str, r: &Keyring| {
        let env = r.encrypt(b"{\"token\":\"t\"}").unwrap();
        let s = s.clone();
        async move {
            s.insert_connection(&NewConnection {
                org: airlock_store::LOCAL_ORG,
                name,
                integration: "gh",
                auth_type: AuthType::Bearer,
                envelope: &env,
            })
            .await
        }
    };
    // A store that predates key checks: envelopes under k1, no check value.
    put("old", &a).await.unwrap();
    assert!(matches!(
        s.check_key(&b, "k1").await,
        Err(StoreError::KeyMismatch { kid }) if kid == "k1"
    ));
    s.check_key(&a, "k1").await.unwrap();
    // From now on the check value decides, without decrypting anything.
    assert!(matches!(
        s.record_active_key(&b).await,
        Err(StoreError::KeyMismatch { .. })
    ));
    s.record_active_key(&a).await.unwrap();
    assert!(matches!(
        s.check_keyring(&b).await,
        Err(StoreError::KeyMismatch { .. })
    ));
    // A new key id is learnt on first write.
    let c = ring("k2", 3);
    s.check_key(&c, "k2").await.unwrap();
    s.record_active_key(&c).await.unwrap();
    assert!(matches!(
        s.record_active_key(&ring("k2", 4)).await,
        Err(StoreError::KeyMismatch { .. })
    ));
    // Re-encryption checks the ring before it touches a row.
    assert!(matches!(
        s.reencrypt_batch_after(&b, 10, "").await,
        Err(StoreError::KeyMismatch { .. })
    ));
    assert_eq!(
        s.envelope_counts_by_kid().await.unwrap(),
        [("k1".to_string(), 1)]
    );
}

#[tokio::test]
async fn a_damaged_sqlite_file_is_refused_at_open() {
    let (dir, s) = sqlite().await;
    for i in 0..400 {
        let id = format!("run-{i:04}");
        new_run(&s, &id).await;
        s.append_event(&NewEvent {
            run_id: &id,
            at: 1,
            kind: "log",
            payload: &"x".repeat(200),
        })
        .await
        .unwrap();
    }
    s.close().await;
    let path = db_file(&dir);
    let len = std::fs::metadata(&path).unwrap().len();
    assert!(len > 16 * 4096, "several pages: {len}");
    // Flip bytes in the page headers of a few pages in the middle.
    let mut bytes = std::fs::read(&path).unwrap();
    for page in [len / 4096 / 2, len / 4096 / 2 + 1, len / 4096 / 2 + 2] {
        let off = usize::try_from(page * 4096).unwrap();
        for b in &mut bytes[off..off + 12] {
            *b ^= 0xa5;
        }
    }
    std::fs::write(&path, &bytes).unwrap();
    let Err(e) = Store::open_sqlite(&path, &StoreOptions::default()).await else {
        panic!("a damaged store opened");
    };
    assert!(matches!(e, StoreError::Damaged { .. }), "{e}");
    assert!(e.to_string().contains("damaged"), "{e}");
    // A file that is not a database at all.
    bytes[..16].copy_from_slice(b"not a database!!");
    std::fs::write(&path, &bytes).unwrap();
    let Err(e) = Store::open_sqlite(&path, &StoreOptions::default()).await else {
        panic!("garbage opened");
    };
    assert!(matches!(e, StoreError::Damaged { .. }), "{e}");
}

/// `max_concurrent_runs`: of many platforms claiming at once, exactly the
/// limit gets a slot; a slot frees when a run ends.
async fn run_slots_are_claimed_atomically(s: &Store) {
    let tries = (0..12).map(|i| {
        let s = s.clone();
        tokio::spawn(async move {
            let id = format!("slot-{i}");
            let r = NewRun {
                org: airlock_store::LOCAL_ORG,
                owner: None,
                id: &id,
                agent: "a",
                backend: "process",
                model: None,
                status: RunStatus::Running,
                created_at: None,
            };
            s.insert_run_within_limit(&r, 3).await.unwrap()
        })
    });
    let mut got = 0;
    for t in tries.collect::<Vec<_>>() {
        got += usize::from(t.await.unwrap());
    }
    assert_eq!(got, 3, "exactly the limit claims a slot");
    let running = s
        .list_runs(&RunQuery {
            status: Some(RunStatus::Running),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(running.len(), 3);
    let late = NewRun {
        org: airlock_store::LOCAL_ORG,
        owner: None,
        id: "slot-late",
        agent: "a",
        backend: "process",
        model: None,
        status: RunStatus::Running,
        created_at: None,
    };
    assert!(!s.insert_run_within_limit(&late, 3).await.unwrap());
    s.finish_run(
        &running[0].id,
        &RunEnd {
            status: RunStatus::Succeeded,
            exit_code: Some(0),
            error: None,
            at: now_ms(),
        },
    )
    .await
    .unwrap();
    assert!(s.insert_run_within_limit(&late, 3).await.unwrap());
    assert!(matches!(
        s.insert_run_within_limit(&late, 10).await,
        Err(StoreError::RunExists(_))
    ));
}

fn ring(kid: &str, byte: u8) -> Keyring {
    Keyring::new(kid, &[byte; 32]).unwrap()
}

async fn migrations_are_idempotent(s: &Store) {
    assert_eq!(s.schema_version().await.unwrap(), 19);
    // opening again over the same database applies nothing and fails nothing
    if s.backend() == Backend::Sqlite {
        let again = Store::open(
            &format!("sqlite://{}", s.display_name()),
            &StoreOptions::default(),
        )
        .await
        .unwrap();
        assert_eq!(again.schema_version().await.unwrap(), 19);
    }
}

async fn connections_crud(s: &Store) {
    let r = ring("k1", 1);
    let env = r.encrypt(br#"{"token":"abc"}"#).unwrap();
    let c = NewConnection {
        org: airlock_store::LOCAL_ORG,
        name: "github",
        integration: "github",
        auth_type: AuthType::Bearer,
        envelope: &env,
    };
    s.insert_connection(&c).await.unwrap();
    assert!(matches!(
        s.insert_connection(&c).await.unwrap_err(),
        StoreError::ConnectionExists(n) if n == "github"
    ));
    let env2 = r.encrypt(b"{}").unwrap();
    s.insert_connection(&NewConnection {
        org: airlock_store::LOCAL_ORG,
        name: "aws",
        integration: "aws",
        auth_type: AuthType::Custom,
        envelope: &env2,
    })
    .await
    .unwrap();
    let got = s
        .get_connection(airlock_store::LOCAL_ORG, "github")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.envelope, env);
    assert_eq!(got.info.auth_type, AuthType::Bearer);
    assert_eq!(got.info.kid, "k1");
    assert_eq!(
        r.decrypt_string(&got.envelope).unwrap().expose_secret(),
        r#"{"token":"abc"}"#
    );
    assert!(
        s.get_connection(airlock_store::LOCAL_ORG, "nope")
            .await
            .unwrap()
            .is_none()
    );
    let list = s.list_connections(airlock_store::LOCAL_ORG).await.unwrap();
    assert_eq!(
        list.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
        ["aws", "github"]
    );
    assert_eq!(
        s.envelope_counts_by_kid().await.unwrap(),
        [("k1".to_string(), 2)]
    );
    // only envelopes go in
    let err = s
        .insert_connection(&NewConnection {
            org: airlock_store::LOCAL_ORG,
            envelope: "plaintext!",
            ..c
        })
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::BadEnvelope(VaultError::MissingPrefix)),
        "{err}"
    );
    let err = s
        .insert_connection(&NewConnection {
            org: airlock_store::LOCAL_ORG,
            name: "",
            ..c
        })
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Invalid { .. }), "{err}");
    let err = s
        .insert_connection(&NewConnection {
            org: airlock_store::LOCAL_ORG,
            name: "a\nb",
            ..c
        })
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Invalid { .. }), "{err}");
    assert!(
        s.delete_connection(airlock_store::LOCAL_ORG, "github")
            .await
            .unwrap()
    );
    assert!(
        !s.delete_connection(airlock_store::LOCAL_ORG, "github")
            .await
            .unwrap()
    );
    assert_eq!(
        s.list_connections(airlock_store::LOCAL_ORG)
            .await
            .unwrap()
            .len(),
        1
    );
}

/// What a cache of connection rows checks: the version moves on every
/// change, also one that brings the rows back to what they were (added
/// then removed, replaced within one millisecond), which a count and the
/// latest `updated_at` did not see; a read does not move it.
async fn every_change_to_the_connections_moves_their_version(s: &Store) {
    let r = ring("k1", 1);
    let org = airlock_store::LOCAL_ORG;
    let mut seen = vec![s.connections_version().await.unwrap()];
    let mut changed = |v: i64, what: &str| {
        assert!(
            !seen.contains(&v),
            "{what}: version {v} was seen before ({seen:?})"
        );
        seen.push(v);
    };
    let env = r.encrypt(br#"{"token":"one"}"#).unwrap();
    let c = NewConnection {
        org,
        name: "svc",
        integration: "svc",
        auth_type: AuthType::Bearer,
        envelope: &env,
    };
    // This process's writes also show, without a query, in the counter
    // every clone of the handle shares.
    let clone = s.clone();
    let writes = clone.connection_writes();
    s.insert_connection(&c).await.unwrap();
    assert_eq!(clone.connection_writes(), writes + 1);
    changed(s.connections_version().await.unwrap(), "added");
    assert!(s.delete_connection(org, "svc").await.unwrap());
    changed(
        s.connections_version().await.unwrap(),
        "removed (no rows, as at first)",
    );
    // Replaced back to back: the same count, and often the same updated_at.
    s.insert_connection(&c).await.unwrap();
    changed(s.connections_version().await.unwrap(), "added again");
    let env2 = r.encrypt(br#"{"token":"two"}"#).unwrap();
    assert!(s.delete_connection(org, "svc").await.unwrap());
    s.insert_connection(&NewConnection {
        envelope: &env2,
        ..c
    })
    .await
    .unwrap();
    changed(s.connections_version().await.unwrap(), "replaced");
    let env3 = r.encrypt(br#"{"token":"three"}"#).unwrap();
    assert!(
        s.replace_connection_envelope(org, "svc", &env3)
            .await
            .unwrap()
    );
    changed(s.connections_version().await.unwrap(), "envelope replaced");
    let rotated = ring("k2", 2).with_retired("k1", &[1; 32]).unwrap();
    assert_eq!(s.reencrypt_batch(&rotated, 10).await.unwrap(), 1);
    changed(s.connections_version().await.unwrap(), "re-encrypted");
    // What changes nothing moves nothing.
    let now = s.connections_version().await.unwrap();
    let writes = s.connection_writes();
    s.get_connection(org, "svc").await.unwrap().unwrap();
    s.list_connections(org).await.unwrap();
    assert_eq!(s.connection_writes(), writes, "reads are not writes");
    assert!(!s.delete_connection(org, "absent").await.unwrap());
    assert!(
        s.insert_connection(&c).await.is_err(),
        "a second svc is refused"
    );
    assert_eq!(s.connections_version().await.unwrap(), now);
}

async fn reencrypt_in_batches(s: &Store) {
    let old = ring("k0", 1);
    let mut want = Vec::new();
    for i in 0..250 {
        let name = format!("conn-{i:04}");
        let value = format!("secret-value-{i}");
        let env = old.encrypt(value.as_bytes()).unwrap();
        s.insert_connection(&NewConnection {
            org: airlock_store::LOCAL_ORG,
            name: &name,
            integration: "ns",
            auth_type: AuthType::ApiKey,
            envelope: &env,
        })
        .await
        .unwrap();
        want.push((name, value));
    }
    let new = ring("k1", 2).with_retired("k0", &[1; 32]).unwrap();
    assert_eq!(s.count_envelopes_not_under("k1").await.unwrap(), 250);
    let mut done = Vec::new();
    loop {
        let n = s.reencrypt_batch(&new, 100).await.unwrap();
        if n == 0 {
            break;
        }
        done.push(n);
    }
    assert_eq!(done, [100, 100, 50]);
    assert_eq!(
        s.envelope_counts_by_kid().await.unwrap(),
        [("k1".to_string(), 250)]
    );
    let only_new = ring("k1", 2);
    for (name, value) in &want {
        let c = s
            .get_connection(airlock_store::LOCAL_ORG, name)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(c.info.kid, "k1");
        assert_eq!(
            only_new
                .decrypt_string(&c.envelope)
                .unwrap()
                .expose_secret(),
            value
        );
    }
    // a second run has nothing to do
    assert_eq!(s.reencrypt_batch(&new, 100).await.unwrap(), 0);

    // the cursor form walks the names once, batch by batch, and says where it stopped
    let newer = ring("k2", 3).with_retired("k1", &[2; 32]).unwrap();
    let first = s.reencrypt_batch_after(&newer, 100, "").await.unwrap();
    assert_eq!((first.rewritten, first.scanned), (100, 100));
    // (the cursor is the pair organization, name)
    assert_eq!(first.last, "local\u{1f}conn-0099");
    let second = s
        .reencrypt_batch_after(&newer, 200, &first.last)
        .await
        .unwrap();
    assert_eq!(
        (second.rewritten, second.last.as_str()),
        (150, "local\u{1f}conn-0249")
    );
    let done = s
        .reencrypt_batch_after(&newer, 200, &second.last)
        .await
        .unwrap();
    assert_eq!(done, BatchOutcome::default());
    assert_eq!(
        s.envelope_counts_by_kid().await.unwrap(),
        [("k2".to_string(), 250)]
    );
}

async fn reencrypt_failure_rolls_back_the_batch(s: &Store) {
    let old = ring("k0", 1);
    let stranger = ring("kx", 9);
    for i in 0..10 {
        let r = if i == 5 { &stranger } else { &old };
        let env = r.encrypt(format!("v{i}").as_bytes()).unwrap();
        s.insert_connection(&NewConnection {
            org: airlock_store::LOCAL_ORG,
            name: &format!("c{i}"),
            integration: "ns",
            auth_type: AuthType::ApiKey,
            envelope: &env,
        })
        .await
        .unwrap();
    }
    let before: Vec<_> = futures_snapshot(s).await;
    let new = ring("k1", 2).with_retired("k0", &[1; 32]).unwrap();
    let err = s.reencrypt_batch(&new, 100).await.unwrap_err();
    match &err {
        StoreError::Reencrypt { name, source } => {
            assert_eq!(name, "c5");
            assert_eq!(source, &VaultError::UnknownKid("kx".into()));
        }
        other => panic!("unexpected {other}"),
    }
    let chain = format!("{err}: {}", std::error::Error::source(&err).unwrap());
    assert!(chain.contains("CONNECTION_ENCRYPTION_KEYS"), "{chain}");
    // nothing of that batch was written
    assert_eq!(futures_snapshot(s).await, before);
    // a batch that stops before the bad row goes through
    assert_eq!(s.reencrypt_batch(&new, 5).await.unwrap(), 5);
}

async fn futures_snapshot(s: &Store) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for c in s.list_connections(airlock_store::LOCAL_ORG).await.unwrap() {
        let r = s
            .get_connection(airlock_store::LOCAL_ORG, &c.name)
            .await
            .unwrap()
            .unwrap();
        out.push((c.name, r.envelope));
    }
    out
}

async fn runs(s: &Store) {
    for (i, id) in ["r1", "r2", "r3"].iter().enumerate() {
        s.insert_run(&NewRun {
            org: airlock_store::LOCAL_ORG,
            owner: None,
            id,
            agent: if i == 2 { "other" } else { "triage" },
            backend: "process",
            model: Some("gpt-x"),
            status: RunStatus::Queued,
            created_at: Some(1_000 + i64::try_from(i).unwrap()),
        })
        .await
        .unwrap();
    }
    let dup = NewRun {
        org: airlock_store::LOCAL_ORG,
        owner: None,
        id: "r1",
        agent: "a",
        backend: "process",
        model: None,
        status: RunStatus::Queued,
        created_at: None,
    };
    assert!(matches!(
        s.insert_run(&dup).await.unwrap_err(),
        StoreError::RunExists(_)
    ));
    s.mark_run_started("r1", 2_000).await.unwrap();
    s.record_heartbeat("r1", 2_500).await.unwrap();
    s.add_run_usage(
        "r1",
        &Usage {
            tokens_in: 10,
            tokens_out: 5,
            cost_microusd: 300,
        },
    )
    .await
    .unwrap();
    s.add_run_usage(
        "r1",
        &Usage {
            tokens_in: 1,
            tokens_out: 1,
            cost_microusd: 1,
        },
    )
    .await
    .unwrap();
    let end = RunEnd {
        status: RunStatus::Failed,
        exit_code: Some(3),
        error: Some("agent exited 3"),
        at: 3_000,
    };
    assert!(s.finish_run("r1", &end).await.unwrap());
    // a run ends once
    assert!(
        !s.finish_run(
            "r1",
            &RunEnd {
                status: RunStatus::Succeeded,
                ..end
            }
        )
        .await
        .unwrap()
    );
    // An ended run is never marked started again (a platform whose run a
    // concurrent reclaim failed meanwhile learns why, and starts nothing).
    match s.mark_run_started("r1", 3_500).await.unwrap_err() {
        StoreError::RunEnded { id, reason } => {
            assert_eq!(id, "r1");
            assert_eq!(reason, "agent exited 3", "the stored reason");
        }
        other => panic!("expected RunEnded, got {other:?}"),
    }
    assert!(matches!(
        s.mark_run_started("zz", 1).await.unwrap_err(),
        StoreError::RunNotFound(_)
    ));
    let r = s.get_run("r1").await.unwrap().unwrap();
    assert_eq!(r.status, RunStatus::Failed);
    assert_eq!(r.started_at, Some(2_000));
    assert_eq!(r.last_heartbeat_at, Some(2_500));
    assert_eq!(r.ended_at, Some(3_000));
    assert_eq!(r.exit_code, Some(3));
    assert_eq!(r.error.as_deref(), Some("agent exited 3"));
    assert_eq!((r.tokens_in, r.tokens_out, r.cost_microusd), (11, 6, 301));
    assert_eq!(r.model.as_deref(), Some("gpt-x"));
    // Each usage is one model call; the budget is none until recorded.
    assert_eq!(r.requests, 2);
    assert!(!r.budget.any());
    let limits = BudgetLimits {
        tokens: Some(500),
        cost_microusd: None,
        requests: Some(9),
    };
    s.set_run_budget("r1", &limits).await.unwrap();
    assert_eq!(s.get_run("r1").await.unwrap().unwrap().budget, limits);
    assert!(matches!(
        s.set_run_budget("zz", &limits).await.unwrap_err(),
        StoreError::RunNotFound(_)
    ));

    let all = s.list_runs(&RunQuery::default()).await.unwrap();
    assert_eq!(
        all.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        ["r3", "r2", "r1"]
    );
    let queued = s
        .list_runs(&RunQuery {
            status: Some(RunStatus::Queued),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        queued.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        ["r3", "r2"]
    );
    let triage = s
        .list_runs(&RunQuery {
            agent: Some("triage"),
            limit: Some(1),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        triage.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        ["r2"]
    );
    let page = s
        .list_runs(&RunQuery {
            before: Some(1_002),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        page.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        ["r2", "r1"]
    );

    assert!(matches!(
        s.record_heartbeat("zz", 1).await.unwrap_err(),
        StoreError::RunNotFound(_)
    ));
    assert!(matches!(
        s.finish_run("zz", &end).await.unwrap_err(),
        StoreError::RunNotFound(_)
    ));
    assert!(s.get_run("zz").await.unwrap().is_none());
}

/// A started run's phases (sandbox up, sidecar up) are stored with their
/// times, each once: the first time recorded is kept.
async fn a_runs_phases_are_stored_once_each(s: &Store) {
    new_run(s, "p1").await;
    let fresh = s.get_run("p1").await.unwrap().unwrap();
    assert_eq!((fresh.sandbox_up_at, fresh.sidecar_up_at), (None, None));
    s.mark_run_started("p1", 2_000).await.unwrap();
    s.record_run_phase("p1", RunPhase::SandboxUp, 2_100)
        .await
        .unwrap();
    let r = s.get_run("p1").await.unwrap().unwrap();
    assert_eq!((r.sandbox_up_at, r.sidecar_up_at), (Some(2_100), None));
    s.record_run_phase("p1", RunPhase::SidecarUp, 2_300)
        .await
        .unwrap();
    s.record_run_phase("p1", RunPhase::SandboxUp, 9_999)
        .await
        .unwrap();
    let r = s.get_run("p1").await.unwrap().unwrap();
    assert_eq!(
        (r.sandbox_up_at, r.sidecar_up_at),
        (Some(2_100), Some(2_300))
    );
    let listed = s.list_runs(&RunQuery::default()).await.unwrap();
    assert_eq!(
        listed[0].sidecar_up_at,
        Some(2_300),
        "a list carries them too"
    );
    assert!(matches!(
        s.record_run_phase("zz", RunPhase::SidecarUp, 1)
            .await
            .unwrap_err(),
        StoreError::RunNotFound(_)
    ));
}

/// An organization's proxy choice is a name it can set and clear; a run
/// records the label of the proxy it used.
async fn an_organizations_proxy_and_a_runs(s: &Store) {
    s.create_org("org_p", "P", None).await.unwrap();
    assert_eq!(s.org_proxy("org_p").await.unwrap(), None);
    s.set_org_proxy("org_p", Some("eu")).await.unwrap();
    assert_eq!(s.org_proxy("org_p").await.unwrap().as_deref(), Some("eu"));
    s.set_org_proxy("org_p", None).await.unwrap();
    assert_eq!(s.org_proxy("org_p").await.unwrap(), None);
    assert!(matches!(
        s.set_org_proxy("org_none", Some("eu")).await,
        Err(StoreError::Invalid { .. })
    ));
    assert_eq!(s.org_proxy("org_none").await.unwrap(), None);
    new_run(s, "rp").await;
    assert_eq!(s.get_run("rp").await.unwrap().unwrap().proxy, None);
    s.set_run_proxy("rp", Some("PROXY_URL")).await.unwrap();
    assert_eq!(
        s.get_run("rp").await.unwrap().unwrap().proxy.as_deref(),
        Some("PROXY_URL")
    );
}

async fn an_approval_is_settled_once_and_seen_only_by_its_organization(s: &Store) {
    new_run(s, "ra").await;
    let org = airlock_store::LOCAL_ORG;
    let a = |id| NewApproval {
        id,
        run_id: "ra",
        org_id: org,
        method: "POST",
        host: "api.test",
        path: "/x",
        integration: Some("gh"),
        rule: "ask",
        expires_at: 9,
    };
    s.insert_approval(&a("a1"), None).await.unwrap();
    s.insert_approval(&a("a2"), None).await.unwrap();
    let got = s.get_approval(org, "ra", "a1").await.unwrap().unwrap();
    assert_eq!(got.state, ApprovalState::Pending);
    assert_eq!((got.method.as_str(), got.path.as_str()), ("POST", "/x"));
    assert_eq!(s.get_approval("other-org", "ra", "a1").await.unwrap(), None);
    assert!(
        s.list_approvals("other-org", "ra")
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        s.settle_approval("a1", ApprovalState::AllowedRun, Some("key1"), None)
            .await
            .unwrap()
    );
    assert!(
        !s.settle_approval("a1", ApprovalState::Denied, Some("key2"), None)
            .await
            .unwrap(),
        "answered once"
    );
    let got = s.approval_state("a1").await.unwrap().unwrap();
    assert_eq!(got.state, ApprovalState::AllowedRun);
    assert_eq!(got.answered_by.as_deref(), Some("key1"));
    assert!(got.settled_at.is_some());
    let pending = s.list_pending_approvals("ra").await.unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].id, "a2");
    // The count per running run: its organization's, pending ones only;
    // a run that ended holding one (a crash before the drop) is left out.
    new_run(s, "ra_ended").await;
    s.insert_approval(
        &NewApproval {
            run_id: "ra_ended",
            ..a("a3")
        },
        None,
    )
    .await
    .unwrap();
    let end = airlock_store::RunEnd {
        status: RunStatus::Failed,
        exit_code: None,
        error: None,
        at: 1,
    };
    assert!(s.finish_run("ra_ended", &end).await.unwrap());
    let counts = s.pending_approval_counts(org).await.unwrap();
    assert_eq!(counts, [("ra".to_owned(), 1)].into_iter().collect());
    assert!(
        s.pending_approval_counts("other-org")
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        s.settle_approval("a2", ApprovalState::Dropped, None, None)
            .await
            .unwrap()
    );
    let states: Vec<_> = s
        .list_approvals(org, "ra")
        .await
        .unwrap()
        .iter()
        .map(|r| r.state)
        .collect();
    assert_eq!(states, [ApprovalState::AllowedRun, ApprovalState::Dropped]);
    assert!(s.pending_approval_counts(org).await.unwrap().is_empty());
}

/// Of many approvals asked for one run at once across the bound, exactly
/// [`MAX_APPROVALS_PER_RUN`] are stored and every other is refused by
/// name ([`StoreError::ApprovalsExhausted`]); another run is not affected.
async fn a_runs_approvals_are_bounded_exactly_even_when_asked_for_at_once(s: &Store) {
    new_run(s, "rx").await;
    new_run(s, "ry").await;
    let ids: Vec<String> = (0..MAX_APPROVALS_PER_RUN + 40)
        .map(|i| format!("apr_{i}"))
        .collect();
    fn a<'a>(id: &'a str, run_id: &'a str) -> NewApproval<'a> {
        NewApproval {
            id,
            run_id,
            org_id: airlock_store::LOCAL_ORG,
            method: "POST",
            host: "api.test",
            path: "/x",
            integration: None,
            rule: "ask",
            expires_at: 9,
        }
    }
    // Most of the bound one by one, the last 30 places raced by 70.
    let before = usize::try_from(MAX_APPROVALS_PER_RUN - 30).unwrap();
    for id in &ids[..before] {
        s.insert_approval(&a(id, "rx"), None).await.unwrap();
    }
    let raced = ids[before..].iter().map(|id| {
        let n = a(id, "rx");
        async move { s.insert_approval(&n, None).await }
    });
    let results = futures_util::future::join_all(raced).await;
    let stored = results.iter().filter(|r| r.is_ok()).count();
    let refused = results
        .iter()
        .filter(|r| {
            matches!(r, Err(StoreError::ApprovalsExhausted { run_id, limit })
                if run_id == "rx" && *limit == MAX_APPROVALS_PER_RUN)
        })
        .count();
    assert_eq!(
        (stored, refused),
        (30, 40),
        "{:?}",
        results.iter().find(|r| r.is_err())
    );
    let rows = s
        .list_approvals(airlock_store::LOCAL_ORG, "rx")
        .await
        .unwrap();
    assert_eq!(rows.len(), usize::try_from(MAX_APPROVALS_PER_RUN).unwrap());
    s.insert_approval(&a("apr_other", "ry"), None)
        .await
        .unwrap();
}

/// An approval's webhook deliveries: one per subscribed webhook of its
/// organization per event (none to another organization's, none to one
/// not subscribed), however often queued; each finds its approval, and
/// another organization's delivery id finds nothing.
async fn an_approvals_deliveries_are_queued_once_per_webhook_and_event(s: &Store) {
    use airlock_store::{APPROVAL_PENDING_EVENT, APPROVAL_SETTLED_EVENT};
    new_run(s, "rh").await;
    let org = airlock_store::LOCAL_ORG;
    for (id, o, events) in [
        ("wh_p", org, &[APPROVAL_PENDING_EVENT][..]),
        (
            "wh_both",
            org,
            &[APPROVAL_PENDING_EVENT, APPROVAL_SETTLED_EVENT][..],
        ),
        ("wh_r", org, &["run.failed"][..]),
        ("wh_x", "other", &[APPROVAL_PENDING_EVENT][..]),
    ] {
        s.create_webhook(&hook(id, o, events), None).await.unwrap();
    }
    let a = NewApproval {
        id: "ah",
        run_id: "rh",
        org_id: org,
        method: "POST",
        host: "api.test",
        path: "/x",
        integration: None,
        rule: "ask",
        expires_at: 9,
    };
    // The pending deliveries are queued with the hold itself, and the run's
    // `approval.pending` event stored, the settled ones with its settlement
    // (one transaction each): queueing again adds nothing.
    let pending = NewEvent {
        run_id: "rh",
        at: 5,
        kind: APPROVAL_PENDING_EVENT,
        payload: r#"{"type":"approval.pending","approval":{"id":"ah"}}"#,
    };
    s.insert_approval(&a, Some(&pending)).await.unwrap();
    let stored = s
        .events_of_kind("rh", APPROVAL_PENDING_EVENT, 10)
        .await
        .unwrap();
    assert_eq!(stored.len(), 1, "{stored:?}");
    assert_eq!(
        (stored[0].at, stored[0].payload.as_str()),
        (5, pending.payload)
    );
    // A hold its run may no longer ask for stores neither its event nor
    // its deliveries.
    for i in 1..MAX_APPROVALS_PER_RUN {
        let id = format!("ah{i}");
        let more = NewApproval { id: &id, ..a };
        s.insert_approval(&more, None).await.unwrap();
    }
    let over = NewApproval { id: "ah_over", ..a };
    assert!(matches!(
        s.insert_approval(&over, Some(&pending)).await,
        Err(StoreError::ApprovalsExhausted { .. })
    ));
    assert_eq!(
        s.events_of_kind("rh", APPROVAL_PENDING_EVENT, 10)
            .await
            .unwrap()
            .len(),
        1
    );
    let which = (org, "rh", "ah");
    assert_eq!(
        s.queue_approval_deliveries(which, APPROVAL_PENDING_EVENT, 5)
            .await
            .unwrap(),
        0,
        "the hold's deliveries were queued with it"
    );
    assert!(
        s.settle_approval(
            "ah",
            ApprovalState::AllowedOnce,
            Some("key1"),
            Some((org, "rh", 6))
        )
        .await
        .unwrap()
    );
    assert_eq!(
        s.queue_approval_deliveries(which, APPROVAL_SETTLED_EVENT, 6)
            .await
            .unwrap(),
        0,
        "queued again: nothing new"
    );
    for (hook, want) in [
        ("wh_p", &[APPROVAL_PENDING_EVENT][..]),
        (
            "wh_both",
            &[APPROVAL_PENDING_EVENT, APPROVAL_SETTLED_EVENT][..],
        ),
        ("wh_r", &[][..]),
    ] {
        let d = s.list_deliveries(org, hook, 10, None).await.unwrap();
        let mut got: Vec<&str> = d.iter().map(|x| x.event.as_str()).collect();
        got.sort_unstable();
        assert_eq!(got, want, "{hook}");
        for x in &d {
            let found = s.delivery_approval(org, &x.id).await.unwrap().unwrap();
            assert_eq!((found.id.as_str(), found.run_id.as_str()), ("ah", "rh"));
            assert_eq!(s.delivery_approval("other", &x.id).await.unwrap(), None);
        }
    }
    assert!(
        s.list_deliveries("other", "wh_x", 10, None)
            .await
            .unwrap()
            .is_empty()
    );
}

async fn new_run(s: &Store, id: &str) {
    s.insert_run(&NewRun {
        org: airlock_store::LOCAL_ORG,
        owner: None,
        id,
        agent: "a",
        backend: "process",
        model: None,
        status: RunStatus::Running,
        created_at: None,
    })
    .await
    .unwrap();
}

async fn events(s: &Store) {
    new_run(s, "r1").await;
    new_run(s, "r2").await;
    let mut ids = Vec::new();
    for (run, kind) in [
        ("r1", "heartbeat"),
        ("r2", "log"),
        ("r1", "log"),
        ("r1", "result"),
    ] {
        let payload = format!(r#"{{"kind":"{kind}"}}"#);
        ids.push(
            s.append_event(&NewEvent {
                run_id: run,
                at: 5,
                kind,
                payload: &payload,
            })
            .await
            .unwrap(),
        );
    }
    assert!(ids.windows(2).all(|w| w[0] < w[1]));
    let ev = s.list_events("r1", 0, 100).await.unwrap();
    assert_eq!(
        ev.iter().map(|e| e.kind.as_str()).collect::<Vec<_>>(),
        ["heartbeat", "log", "result"]
    );
    let after = s.list_events("r1", ev[0].id, 1).await.unwrap();
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].kind, "log");
    assert_eq!(after[0].payload, r#"{"kind":"log"}"#);
    let err = s
        .append_event(&NewEvent {
            run_id: "ghost",
            at: 1,
            kind: "log",
            payload: "{}",
        })
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::RunNotFound(ref r) if r == "ghost"),
        "{err}"
    );

    // A batch (more rows than one statement holds) is stored whole, in
    // its order; a batch of an unknown run is refused, by its name.
    let batch: Vec<(i64, String)> = (0..250).map(|i| (6, format!(r#"{{"i":{i}}}"#))).collect();
    s.append_events("r2", "log", &batch).await.unwrap();
    let stored = s.list_events("r2", 0, 1000).await.unwrap();
    assert_eq!(stored.len(), 251);
    let got: Vec<(i64, String)> = stored[1..]
        .iter()
        .map(|e| {
            assert_eq!(e.kind, "log");
            (e.at, e.payload.clone())
        })
        .collect();
    assert_eq!(got, batch);
    let err = s.append_events("ghost", "log", &batch).await.unwrap_err();
    assert!(
        matches!(err, StoreError::RunNotFound(ref r) if r == "ghost"),
        "{err}"
    );
    assert!(s.list_events("ghost", 0, 10).await.unwrap().is_empty());
}

/// A run's audit read page by page: its egress records (the refusing rule
/// kept) and its decision events, merged by time, each once, nothing of
/// another run or of another kind; a short page's table is not asked again.
async fn a_runs_audit_pages_through_both_tables_in_time_order(s: &Store) {
    new_run(s, "r1").await;
    new_run(s, "r2").await;
    for (run, n) in [("r1", 7), ("r2", 3)] {
        for i in 0..n {
            let refused = i % 3 == 0;
            s.append_egress(&NewEgress {
                run_id: run,
                at: 100 + 10 * i,
                source: EgressSource::Proxy,
                plane: EgressPlane::Proxy,
                integration: None,
                method: "POST",
                url: "https://h.test/x",
                host: "h.test",
                decision: if refused {
                    EgressDecision::Refused
                } else {
                    EgressDecision::Allowed
                },
                reason: refused.then_some(RefusalCode::RuleRefused),
                rule: refused.then_some("read-only"),
                status: None,
                duration_ms: None,
                bytes_out: 1,
                bytes_in: 2,
                seq: Some(i),
                outcome: None,
                metering: None,
            })
            .await
            .unwrap();
        }
        for (kind, i) in ["tool_excluded", "log", "refusals", "cost", "tool_excluded"]
            .into_iter()
            .zip(0..)
        {
            let at = 105 + 20 * i;
            s.append_event(&NewEvent {
                run_id: run,
                kind,
                at,
                payload: "{}",
            })
            .await
            .unwrap();
        }
    }
    let mut pages = 0;
    let mut seen: Vec<(i64, bool)> = Vec::new();
    let mut cursor = Some(AuditCursor::default());
    while let Some(after) = cursor {
        let page = s.audit_page("r1", after, 2).await.unwrap();
        assert!(page.entries.len() <= 2);
        pages += 1;
        for e in &page.entries {
            match e {
                AuditEntry::Egress(r) => {
                    assert_eq!(r.run_id, "r1");
                    assert_eq!(r.rule.is_some(), r.reason == Some(RefusalCode::RuleRefused));
                    seen.push((r.at, true));
                }
                AuditEntry::Event(v) => {
                    assert_eq!(v.run_id, "r1");
                    assert!(AUDIT_EVENT_KINDS.contains(&v.kind.as_str()), "{v:?}");
                    seen.push((v.at, false));
                }
            }
        }
        cursor = page.next;
    }
    assert!(pages >= 5, "{pages} pages of at most 2");
    let egress: Vec<i64> = seen.iter().filter(|e| e.1).map(|e| e.0).collect();
    assert_eq!(egress, [100, 110, 120, 130, 140, 150, 160]);
    let events: Vec<i64> = seen.iter().filter(|e| !e.1).map(|e| e.0).collect();
    assert_eq!(events, [105, 145, 185], "the decisions only");
    assert!(seen.windows(2).all(|w| w[0].0 <= w[1].0), "{seen:?}");
    assert_eq!(
        s.audit_page("nope", AuditCursor::default(), 10)
            .await
            .unwrap(),
        AuditPage {
            entries: vec![],
            next: None
        }
    );
}

async fn egress_log(s: &Store) {
    new_run(s, "r1").await;
    let allowed = NewEgress {
        run_id: "r1",
        at: 10,
        source: EgressSource::ApiCall,
        integration: Some("github"),
        method: "GET",
        url: "https://api.github.com/user",
        host: "api.github.com",
        decision: EgressDecision::Allowed,
        reason: None,
        status: Some(200),
        duration_ms: Some(42),
        bytes_out: 120,
        bytes_in: 5_000_000_000,
        seq: None,
        outcome: Some(EgressOutcome::Completed),
        metering: None,
        plane: EgressPlane::Proxy,
        rule: None,
    };
    s.append_egress(&allowed).await.unwrap();
    s.append_egress(&NewEgress {
        integration: None,
        source: EgressSource::Proxy,
        url: "http://169.254.169.254/",
        host: "169.254.169.254",
        decision: EgressDecision::Refused,
        reason: Some(RefusalCode::BlockedAddress),
        status: None,
        duration_ms: None,
        bytes_out: 0,
        bytes_in: 0,
        outcome: None,
        ..allowed
    })
    .await
    .unwrap();
    let log = s.list_egress("r1", 100).await.unwrap();
    assert_eq!(log.len(), 2);
    assert_eq!(log[0].outcome, Some(EgressOutcome::Completed));
    assert_eq!(log[1].outcome, None);
    assert_eq!(log[0].decision, EgressDecision::Allowed);
    assert_eq!(log[0].status, Some(200));
    assert_eq!(log[0].integration.as_deref(), Some("github"));
    assert_eq!((log[0].bytes_out, log[0].bytes_in), (120, 5_000_000_000));
    assert_eq!((log[1].bytes_out, log[1].bytes_in), (0, 0));
    assert_eq!(log[1].decision, EgressDecision::Refused);
    assert_eq!(
        log[1].reason.map(RefusalCode::as_str),
        Some("blocked_address")
    );
    assert_eq!(log[1].status, None);
    assert!(s.list_egress("r2", 100).await.unwrap().is_empty());
    assert!(matches!(
        s.append_egress(&NewEgress {
            run_id: "ghost",
            ..allowed
        })
        .await
        .unwrap_err(),
        StoreError::RunNotFound(_)
    ));
}

/// A request is written when it starts and completed later under the same
/// `seq`: one row, whose start survives if the completion never comes and
/// which a repeated start (a retried batch) never reverts.
async fn egress_records_are_started_then_completed(s: &Store) {
    new_run(s, "r1").await;
    new_run(s, "r2").await;
    let start = NewEgress {
        run_id: "r1",
        at: 10,
        source: EgressSource::Llm,
        integration: Some("@model"),
        method: "POST",
        url: "https://api.example/v1/chat/completions",
        host: "api.example",
        decision: EgressDecision::Allowed,
        reason: None,
        status: None,
        duration_ms: None,
        bytes_out: 99,
        bytes_in: 0,
        seq: Some(7),
        outcome: Some(EgressOutcome::Incomplete),
        metering: None,
        plane: EgressPlane::Proxy,
        rule: None,
    };
    let id = s.append_egress(&start).await.unwrap();
    // Another run's record 7 is another row.
    let other = s
        .append_egress(&NewEgress {
            run_id: "r2",
            ..start
        })
        .await
        .unwrap();
    assert_ne!(id, other);
    let log = s.list_egress("r1", 10).await.unwrap();
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].outcome, Some(EgressOutcome::Incomplete));
    assert_eq!(log[0].seq, Some(7));
    let done = NewEgress {
        status: Some(200),
        duration_ms: Some(1500),
        bytes_in: 4096,
        outcome: Some(EgressOutcome::Completed),
        metering: Some(EgressMetering::Unmetered),
        ..start
    };
    assert_eq!(s.append_egress(&done).await.unwrap(), id);
    // The start again (a batch sent twice): the completion stays.
    assert_eq!(s.append_egress(&start).await.unwrap(), id);
    let log = s.list_egress("r1", 10).await.unwrap();
    assert_eq!(log.len(), 1, "{log:?}");
    let e = &log[0];
    assert_eq!(
        (e.id, e.at, e.status, e.duration_ms, e.bytes_out, e.bytes_in),
        (id, 10, Some(200), Some(1500), 99, 4096)
    );
    assert_eq!(e.outcome, Some(EgressOutcome::Completed));
    assert_eq!(e.metering, Some(EgressMetering::Unmetered));
    // A completion whose start was lost is a row of its own.
    s.append_egress(&NewEgress {
        seq: Some(8),
        ..done
    })
    .await
    .unwrap();
    assert_eq!(s.list_egress("r1", 10).await.unwrap().len(), 2);
    // Rows without a seq never collide.
    for _ in 0..2 {
        s.append_egress(&NewEgress { seq: None, ..done })
            .await
            .unwrap();
    }
    assert_eq!(s.list_egress("r1", 10).await.unwrap().len(), 4);
}

async fn egress_batches_written_whole(s: &Store) {
    egress_batches(s, BatchWrite::Whole).await;
}

async fn egress_batches_written_by_statement(s: &Store) {
    egress_batches(s, BatchWrite::ByStatement).await;
}

/// Writes through the store's own connection (the platform's background
/// work makes them) mean what they mean through the pool, and the pool
/// reads them at once; every clone gets the same connection, and it closes
/// with the store.
async fn the_own_connection_writes_what_the_pool_reads(s: &Store) {
    let own = s.own_connection().await.unwrap();
    egress_batches(&own, BatchWrite::ByStatement).await;
    let rows = |log: Vec<airlock_store::EgressEntry>| -> Vec<_> {
        log.into_iter().map(|e| (e.id, e.seq, e.outcome)).collect()
    };
    let through_pool = rows(s.list_egress("r1", 1000).await.unwrap());
    assert!(through_pool.len() > 100, "{}", through_pool.len());
    assert_eq!(
        rows(own.list_egress("r1", 1000).await.unwrap()),
        through_pool
    );
    let again = s.clone().own_connection().await.unwrap();
    assert_eq!(
        rows(again.list_egress("r1", 1000).await.unwrap()),
        through_pool
    );
    s.close().await;
    assert!(
        own.list_egress("r1", 1).await.is_err(),
        "the own connection closed with the store"
    );
}

/// A batch of records (more than one statement's worth) means what the same
/// records written one by one mean, written either way; a failed batch is
/// stored whole or not at all, or up to its failed statement.
async fn egress_batches(s: &Store, write: BatchWrite) {
    new_run(s, "r1").await;
    let rec = |seq: i64, outcome: EgressOutcome| NewEgress {
        run_id: "r1",
        at: seq,
        source: EgressSource::Proxy,
        integration: None,
        method: "CONNECT",
        url: "https://a.example/",
        host: "a.example",
        decision: EgressDecision::Allowed,
        reason: None,
        status: (outcome == EgressOutcome::Completed).then_some(200),
        duration_ms: None,
        bytes_out: seq,
        bytes_in: 0,
        seq: Some(seq),
        outcome: Some(outcome),
        metering: None,
        plane: EgressPlane::Proxy,
        rule: None,
    };
    // Starts written first (as the sidecar does, one by one).
    for seq in 0..150 {
        s.append_egress(&rec(seq, EgressOutcome::Incomplete))
            .await
            .unwrap();
    }
    // Then completions of all but the last ten, a new record completed in
    // the same batch it starts in, a refusal without a seq, and a stale
    // start of one being completed.
    let mut batch: Vec<NewEgress<'_>> = (0..140)
        .map(|seq| rec(seq, EgressOutcome::Completed))
        .collect();
    batch.push(rec(500, EgressOutcome::Incomplete));
    batch.push(rec(500, EgressOutcome::Aborted));
    batch.push(rec(3, EgressOutcome::Incomplete));
    batch.push(NewEgress {
        decision: EgressDecision::Refused,
        reason: Some(RefusalCode::BlockedAddress),
        seq: None,
        outcome: None,
        ..rec(0, EgressOutcome::Completed)
    });
    s.append_egress_batch(&batch, write).await.unwrap();
    let log = s.list_egress("r1", 1000).await.unwrap();
    assert_eq!(log.len(), 152, "one row per request");
    let by_seq = |seq: i64| log.iter().find(|e| e.seq == Some(seq)).unwrap();
    assert_eq!(by_seq(0).outcome, Some(EgressOutcome::Completed));
    assert_eq!(by_seq(3).outcome, Some(EgressOutcome::Completed));
    assert_eq!(by_seq(139).status, Some(200));
    assert_eq!(by_seq(140).outcome, Some(EgressOutcome::Incomplete));
    assert_eq!(by_seq(500).outcome, Some(EgressOutcome::Aborted));
    assert_eq!(
        log.iter()
            .filter(|e| e.decision == EgressDecision::Refused)
            .count(),
        1
    );
    assert!(matches!(
        s.append_egress_batch(
            &[NewEgress {
                run_id: "ghost",
                ..rec(1, EgressOutcome::Completed)
            }],
            write
        )
        .await
        .unwrap_err(),
        StoreError::RunNotFound(_)
    ));
    // 100 new records of r1 (statements of 64, 16, 16 and 4 rows) and,
    // last, in a statement of its own, one of a run that does not exist:
    // whole, r1's log stays as it was; by statement, the statements before
    // the failed one are stored.
    let mut doomed: Vec<NewEgress<'_>> = (1000..1100)
        .map(|seq| rec(seq, EgressOutcome::Completed))
        .collect();
    doomed.push(NewEgress {
        run_id: "ghost",
        ..rec(2000, EgressOutcome::Completed)
    });
    assert!(matches!(
        s.append_egress_batch(&doomed, write).await.unwrap_err(),
        StoreError::RunNotFound(_)
    ));
    let stored = match write {
        BatchWrite::Whole => 152,
        BatchWrite::ByStatement => 252,
    };
    assert_eq!(s.list_egress("r1", 1000).await.unwrap().len(), stored);
}

async fn memories(s: &Store) {
    s.add_memory(airlock_store::LOCAL_ORG, "triage", None, "first")
        .await
        .unwrap();
    s.add_memory(airlock_store::LOCAL_ORG, "triage", Some("r1"), "second ✓")
        .await
        .unwrap();
    s.add_memory(airlock_store::LOCAL_ORG, "other", None, "x")
        .await
        .unwrap();
    let m = s
        .list_memories(airlock_store::LOCAL_ORG, "triage", 10)
        .await
        .unwrap();
    assert_eq!(
        m.iter().map(|m| m.content.as_str()).collect::<Vec<_>>(),
        ["second ✓", "first"]
    );
    assert_eq!(m[0].run_id.as_deref(), Some("r1"));
    assert_eq!(
        s.list_memories(airlock_store::LOCAL_ORG, "triage", 1)
            .await
            .unwrap()
            .len(),
        1
    );
    assert!(
        s.list_memories(airlock_store::LOCAL_ORG, "nobody", 10)
            .await
            .unwrap()
            .is_empty()
    );
}

/// The attack on a journal read twice (a retry after the store failed, the
/// boot reclaim after a crash): each event is stored once and a model
/// call's usage added once, however often the same lines come.
async fn journalled_events_are_stored_once_and_their_usage_added_once(s: &Store) {
    new_run(s, "r1").await;
    let ev = |seq: i64, kind: &str, usage: Option<Usage>| JournalledEvent {
        seq,
        at: seq,
        kind: kind.to_owned(),
        payload: format!("{{\"n\":{seq}}}"),
        usage,
    };
    let usage = Usage {
        tokens_in: 10,
        tokens_out: 5,
        cost_microusd: 7,
    };
    let mut batch: Vec<JournalledEvent> = (0..250).map(|i| ev(i * 10, "log", None)).collect();
    batch.insert(100, ev(5, "cost", Some(usage)));
    batch.push(ev(9999, "result", None));
    assert_eq!(s.append_journal_events("r1", &batch).await.unwrap(), 252);
    // The same lines again, and one new.
    batch.push(ev(10_007, "cost", Some(usage)));
    assert_eq!(s.append_journal_events("r1", &batch).await.unwrap(), 1);
    let run = s.get_run("r1").await.unwrap().unwrap();
    assert_eq!(
        (run.tokens_in, run.tokens_out, run.cost_microusd),
        (20, 10, 14)
    );
    assert_eq!(s.list_events("r1", 0, 1000).await.unwrap().len(), 253);
    assert_eq!(s.events_of_kind("r1", "cost", 10).await.unwrap().len(), 2);
    // An unknown run is a typed error, and nothing is stored.
    assert!(s.append_journal_events("nope", &batch[..1]).await.is_err());
}

async fn results(s: &Store) {
    new_run(s, "r1").await;
    new_run(s, "r2").await;
    let body: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    s.put_result("r1", "res-1", "application/json", &body)
        .await
        .unwrap();
    s.put_result("r1", "res-2", "text/plain", b"hi")
        .await
        .unwrap();
    let got = s.get_result("r1", "res-1").await.unwrap().unwrap();
    assert_eq!(got.body, body);
    assert_eq!(got.content_type, "application/json");
    // only the run that stored it can read it
    assert!(s.get_result("r2", "res-1").await.unwrap().is_none());
    assert_eq!(s.result_bytes("r1").await.unwrap(), 300_002);
    assert_eq!(s.result_bytes("r2").await.unwrap(), 0);
    assert!(matches!(
        s.put_result("r1", "res-1", "x", b"").await.unwrap_err(),
        StoreError::ResultExists { .. }
    ));
    assert!(matches!(
        s.put_result("ghost", "res-1", "x", b"").await.unwrap_err(),
        StoreError::RunNotFound(_)
    ));
}

// ---- backend-specific failure modes ----

#[tokio::test]
async fn sqlite_file_is_private_and_wal() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let s = Store::open_sqlite(&home.join("airlock.db"), &StoreOptions::default())
        .await
        .unwrap();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&home), 0o700);
    assert_eq!(mode(&home.join("airlock.db")), 0o600);
    assert!(home.join("airlock.db-wal").exists(), "WAL mode");
    s.close().await;
}

/// A batch written by statement holds the write lock only while the
/// database runs a statement: its caller stopped between two statements
/// (as a thread at background priority waits for a CPU) holds no other
/// writer. Written whole, the same pause holds them all.
#[tokio::test]
async fn sqlite_a_batch_by_statement_holds_no_lock_while_its_caller_waits() {
    use sqlx::Connection as _;
    use std::future::Future as _;
    let (dir, s) = sqlite().await;
    new_run(&s, "r1").await;
    let urls: Vec<String> = (0..640).map(|i| format!("http://a.test/{i}")).collect();
    let batch: Vec<NewEgress<'_>> = urls
        .iter()
        .enumerate()
        .map(|(i, url)| NewEgress {
            run_id: "r1",
            at: 1,
            source: EgressSource::Proxy,
            integration: None,
            method: "GET",
            url,
            host: "a.test",
            decision: EgressDecision::Allowed,
            reason: None,
            status: Some(200),
            duration_ms: None,
            bytes_out: 0,
            bytes_in: 0,
            seq: Some(i64::try_from(i).unwrap()),
            outcome: Some(EgressOutcome::Completed),
            metering: None,
            plane: EgressPlane::Proxy,
            rule: None,
        })
        .collect();
    let url = format!("sqlite://{}", db_file(&dir).display());
    let mut other = sqlx::SqliteConnection::connect(&url).await.unwrap();
    sqlx::raw_sql("PRAGMA busy_timeout = 100")
        .execute(&mut other)
        .await
        .unwrap();
    let mut write = Box::pin(s.append_egress_batch(&batch, BatchWrite::ByStatement));
    // Driven one step at a time until its first statement is stored (ten
    // statements of 64 rows: it is then mid-batch), then left waiting.
    loop {
        let step = std::future::poll_fn(|cx| std::task::Poll::Ready(write.as_mut().poll(cx))).await;
        assert!(step.is_pending(), "the batch finished before it was paused");
        let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM egress_log")
            .fetch_one(&mut other)
            .await
            .unwrap();
        if stored > 0 {
            assert!(stored < 640, "{stored} rows: not mid-batch");
            break;
        }
        tokio::task::yield_now().await;
    }
    // Another writer gets the lock while the batch's caller waits.
    sqlx::raw_sql("BEGIN IMMEDIATE; ROLLBACK")
        .execute(&mut other)
        .await
        .unwrap();
    write.await.unwrap();
    assert_eq!(s.list_egress("r1", 1000).await.unwrap().len(), 640);

    // The same pause in a batch written whole: the other writer is refused.
    let more: Vec<NewEgress<'_>> = batch
        .iter()
        .map(|e| NewEgress {
            seq: e.seq.map(|n| n + 1000),
            ..*e
        })
        .collect();
    let mut write = Box::pin(s.append_egress_batch(&more, BatchWrite::Whole));
    let locked = loop {
        let step = std::future::poll_fn(|cx| std::task::Poll::Ready(write.as_mut().poll(cx))).await;
        assert!(step.is_pending(), "the batch finished before it was paused");
        match sqlx::raw_sql("BEGIN IMMEDIATE; ROLLBACK")
            .execute(&mut other)
            .await
        {
            Ok(_) => tokio::task::yield_now().await,
            Err(e) => break e,
        }
    };
    assert!(locked.to_string().contains("locked"), "{locked}");
    write.await.unwrap();
    assert_eq!(s.list_egress("r1", 2000).await.unwrap().len(), 1280);
}

/// A reader never waits for a writer (WAL): with another process holding
/// the store's write lock for longer than the reader's busy timeout (an
/// `airlock run` writing its agent's lines), the store opens and its runs
/// and events are read, by the pool and by a connection of its own. Each
/// open said `auto_vacuum = INCREMENTAL` again, a write transaction, and
/// failed as locked. A new store is still made incremental.
#[tokio::test]
async fn sqlite_a_reader_opens_and_reads_while_another_process_writes() {
    use sqlx::Connection as _;
    let (dir, s) = sqlite().await;
    let path = db_file(&dir);
    new_run(&s, "r1").await;
    s.append_event(&NewEvent {
        run_id: "r1",
        at: 5,
        kind: "log",
        payload: r#"{"kind":"log"}"#,
    })
    .await
    .unwrap();
    let mut writer = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    let mode: i64 = sqlx::query_scalar("PRAGMA auto_vacuum")
        .fetch_one(&mut writer)
        .await
        .unwrap();
    assert_eq!(mode, 2, "a new store is not auto_vacuum = INCREMENTAL");
    sqlx::raw_sql("BEGIN IMMEDIATE; INSERT INTO run_events (run_id, at, kind, payload) VALUES ('r1', 6, 'log', '{}')")
        .execute(&mut writer)
        .await
        .unwrap();
    let opts = StoreOptions {
        busy_timeout: Duration::from_millis(200),
        ..Default::default()
    };
    let reader = Store::open_sqlite(&path, &opts).await.unwrap();
    assert_eq!(
        reader.list_runs(&RunQuery::default()).await.unwrap().len(),
        1
    );
    assert!(reader.get_run("r1").await.unwrap().is_some());
    assert_eq!(reader.list_events("r1", 0, 100).await.unwrap().len(), 1);
    let own = reader.own_connection().await.unwrap();
    assert_eq!(own.list_events("r1", 0, 100).await.unwrap().len(), 1);
    // The writer held its lock throughout: a write of the reader's waits
    // for it and is refused, as ever.
    let err = reader
        .append_event(&NewEvent {
            run_id: "r1",
            at: 7,
            kind: "log",
            payload: "{}",
        })
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Locked(_)), "{err:?}");
    sqlx::raw_sql("COMMIT").execute(&mut writer).await.unwrap();
    assert_eq!(reader.list_events("r1", 0, 100).await.unwrap().len(), 2);
}

#[tokio::test]
async fn sqlite_locked_is_a_typed_error_and_writes_nothing() {
    use sqlx::Connection as _;
    let dir = tempfile::tempdir().unwrap();
    let path = db_file(&dir);
    let opts = StoreOptions {
        busy_timeout: Duration::from_millis(200),
        ..Default::default()
    };
    let s = Store::open_sqlite(&path, &opts).await.unwrap();
    let old = ring("k0", 1);
    let env = old.encrypt(b"v").unwrap();
    s.insert_connection(&NewConnection {
        org: airlock_store::LOCAL_ORG,
        name: "c",
        integration: "ns",
        auth_type: AuthType::ApiKey,
        envelope: &env,
    })
    .await
    .unwrap();
    // another process holds the write lock
    let mut other = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    sqlx::raw_sql("BEGIN IMMEDIATE")
        .execute(&mut other)
        .await
        .unwrap();
    let new = ring("k1", 2).with_retired("k0", &[1; 32]).unwrap();
    let err = s.reencrypt_batch(&new, 10).await.unwrap_err();
    assert!(matches!(err, StoreError::Locked(_)), "{err:?}");
    assert!(err.to_string().contains("locked"), "{err}");
    let err = s
        .insert_connection(&NewConnection {
            org: airlock_store::LOCAL_ORG,
            name: "d",
            integration: "ns",
            auth_type: AuthType::ApiKey,
            envelope: &env,
        })
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Locked(_)), "{err:?}");
    sqlx::raw_sql("ROLLBACK").execute(&mut other).await.unwrap();
    assert_eq!(
        s.get_connection(airlock_store::LOCAL_ORG, "c")
            .await
            .unwrap()
            .unwrap()
            .envelope,
        env
    );
    assert!(
        s.get_connection(airlock_store::LOCAL_ORG, "d")
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(s.reencrypt_batch(&new, 10).await.unwrap(), 1);
}

/// A database written by the first schema (no byte counts in the egress
/// log) is upgraded in place when opened: its rows survive and read back
/// with zero bytes.
#[tokio::test]
async fn a_version_1_database_is_upgraded_and_keeps_its_rows() {
    use sqlx::Connection as _;
    let (dir, s) = sqlite().await;
    let path = db_file(&dir);
    new_run(&s, "r1").await;
    s.close().await;
    // Turn it back into what version 1 wrote.
    let mut c = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    sqlx::raw_sql(UNDO_V5_SQLITE).execute(&mut c).await.unwrap();
    sqlx::raw_sql(
        "DROP INDEX egress_log_run_seq; \
         ALTER TABLE egress_log DROP COLUMN seq; \
         ALTER TABLE egress_log DROP COLUMN outcome; \
         ALTER TABLE egress_log DROP COLUMN metering; \
         ALTER TABLE egress_log DROP COLUMN bytes_out; \
         ALTER TABLE egress_log DROP COLUMN bytes_in; \
         DROP TABLE key_checks; \
         DELETE FROM airlock_schema_migrations WHERE version >= 2; \
         INSERT INTO egress_log (run_id, at, source, integration, method, url, host, decision, \
           reason, status, duration_ms) \
         VALUES ('r1', 5, 'proxy', NULL, 'CONNECT', 'https://a.example/', 'a.example', \
           'allowed', NULL, 200, 7)",
    )
    .execute(&mut c)
    .await
    .unwrap();
    c.close().await.unwrap();

    let s = Store::open_sqlite(&path, &StoreOptions::default())
        .await
        .unwrap();
    assert_eq!(s.schema_version().await.unwrap(), 19);
    let log = s.list_egress("r1", 10).await.unwrap();
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].host, "a.example");
    assert_eq!((log[0].bytes_out, log[0].bytes_in), (0, 0));
    assert_eq!(log[0].outcome, Some(EgressOutcome::Completed));
}

/// Turns a version-3 database back into what version 2 wrote, with the
/// rows version 2 wrote for each kind of request.
/// Undoes versions 19 (approvals), 18 (live policy), 17 (operator proxies), 16 (a run's phases), 15 (the refusing rule's id), 14 (the egress log's plane), 13 (budget thresholds crossed), 12 (a run's budget), 11 (inputs and artifacts), 10 (organizations' budgets), 9 (retention's index, stored bytes per organization), 8 (journalled events' places), 7 (cancel reasons, one delivery per event), 6 (the
/// connections' version) and 5 (organizations) on SQLite, for the tests that
/// build an older database from a new one.
const UNDO_V5_SQLITE: &str = "DROP TABLE approvals; DROP TABLE run_policy; ALTER TABLE runs DROP COLUMN policy_applied; \
     ALTER TABLE runs DROP COLUMN sandbox_up_at; ALTER TABLE runs DROP COLUMN sidecar_up_at; \
     ALTER TABLE organizations DROP COLUMN proxy; ALTER TABLE runs DROP COLUMN proxy; \
     ALTER TABLE egress_log DROP COLUMN rule; ALTER TABLE egress_log DROP COLUMN plane; \
     DROP TABLE budget_crossings; ALTER TABLE runs DROP COLUMN requests; ALTER TABLE runs DROP COLUMN budget_tokens; \
     ALTER TABLE runs DROP COLUMN budget_cost_microusd; ALTER TABLE runs DROP COLUMN budget_requests; \
     DROP TABLE artifacts; ALTER TABLE runs DROP COLUMN inputs; \
     DROP TABLE org_spend; DROP TABLE org_budgets; \
     DROP INDEX runs_ended; DROP TABLE org_usage; \
     DROP INDEX run_events_run_seq; ALTER TABLE run_events DROP COLUMN seq; \
     DROP INDEX runs_owner; ALTER TABLE runs DROP COLUMN cancel_reason; \
     DROP TRIGGER connections_changed_by_insert; \
     DROP TRIGGER connections_changed_by_update; DROP TRIGGER connections_changed_by_delete; \
     DROP TABLE connections_changes; DROP TABLE webhook_deliveries; DROP TABLE webhooks; \
     DROP TABLE api_keys; DROP TABLE organizations; DROP TABLE agents; DROP TABLE replicas; \
     DROP TABLE leases; DROP INDEX runs_org; DROP INDEX runs_queue; \
     ALTER TABLE runs DROP COLUMN org_id; ALTER TABLE runs DROP COLUMN owner; \
     ALTER TABLE runs DROP COLUMN prompt; ALTER TABLE runs DROP COLUMN hints; \
     ALTER TABLE runs DROP COLUMN queue_seq; ALTER TABLE runs DROP COLUMN cancel_requested; \
     ALTER TABLE memories DROP COLUMN org_id; \
     CREATE TABLE c4 (name TEXT PRIMARY KEY, integration TEXT NOT NULL, auth_type TEXT NOT NULL, \
       kid TEXT NOT NULL, envelope TEXT NOT NULL, created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL); \
     INSERT INTO c4 SELECT name, integration, auth_type, kid, envelope, created_at, updated_at FROM connections; \
     DROP TABLE connections; ALTER TABLE c4 RENAME TO connections; \
     CREATE INDEX connections_kid ON connections (kid); \
     DELETE FROM airlock_schema_migrations WHERE version >= 5; ";

/// The same on PostgreSQL.
const UNDO_V5_POSTGRES: &str = "DROP TABLE approvals; DROP TABLE run_policy; ALTER TABLE runs DROP COLUMN policy_applied; \
     ALTER TABLE runs DROP COLUMN sandbox_up_at; ALTER TABLE runs DROP COLUMN sidecar_up_at; \
     ALTER TABLE organizations DROP COLUMN proxy; ALTER TABLE runs DROP COLUMN proxy; \
     ALTER TABLE egress_log DROP COLUMN rule; ALTER TABLE egress_log DROP COLUMN plane; \
     DROP TABLE budget_crossings; ALTER TABLE runs DROP COLUMN requests; ALTER TABLE runs DROP COLUMN budget_tokens; \
     ALTER TABLE runs DROP COLUMN budget_cost_microusd; ALTER TABLE runs DROP COLUMN budget_requests; \
     DROP TABLE artifacts; ALTER TABLE runs DROP COLUMN inputs; \
     DROP TABLE org_spend; DROP TABLE org_budgets; \
     DROP INDEX runs_ended; DROP TABLE org_usage; \
     DROP INDEX run_events_run_seq; ALTER TABLE run_events DROP COLUMN seq; \
     DROP INDEX runs_owner; ALTER TABLE runs DROP COLUMN cancel_reason; \
     DROP FUNCTION connections_changed() CASCADE; \
     DROP TABLE connections_changes; DROP TABLE webhook_deliveries; DROP TABLE webhooks; \
     DROP TABLE api_keys; DROP TABLE organizations; DROP TABLE agents; DROP TABLE replicas; \
     DROP TABLE leases; DROP INDEX runs_org; DROP INDEX runs_queue; \
     ALTER TABLE runs DROP COLUMN org_id; ALTER TABLE runs DROP COLUMN owner; \
     ALTER TABLE runs DROP COLUMN prompt; ALTER TABLE runs DROP COLUMN hints; \
     ALTER TABLE runs DROP COLUMN queue_seq; ALTER TABLE runs DROP COLUMN cancel_requested; \
     ALTER TABLE memories DROP COLUMN org_id; \
     ALTER TABLE connections DROP CONSTRAINT connections_pkey; \
     ALTER TABLE connections DROP COLUMN org_id; ALTER TABLE connections ADD PRIMARY KEY (name); \
     DELETE FROM airlock_schema_migrations WHERE version >= 5; ";

const TO_VERSION_2: &str = "DROP INDEX egress_log_run_seq; \
     ALTER TABLE egress_log DROP COLUMN seq; \
     ALTER TABLE egress_log DROP COLUMN outcome; \
     ALTER TABLE egress_log DROP COLUMN metering; \
     DROP TABLE key_checks; \
     DELETE FROM airlock_schema_migrations WHERE version >= 3; \
     INSERT INTO egress_log (run_id, at, source, integration, method, url, host, decision, \
       reason, status, duration_ms, bytes_out, bytes_in) VALUES \
     ('r1', 1, 'api_call', 'svc', 'GET', 'http://a.example:1/', 'a.example', 'refused', \
       'upstream_failed', 502, 3, 0, 0), \
     ('r1', 2, 'llm', '@model', 'POST', 'http://m.example/v1/x', 'm.example', 'allowed', \
       'upstream_failed', NULL, 4, 10, 0), \
     ('r1', 3, 'proxy', NULL, 'CONNECT', 'https://b.example/', 'b.example', 'allowed', \
       NULL, 200, 7, 300, 4000), \
     ('r1', 4, 'proxy', NULL, 'GET', 'http://169.254.169.254/', '169.254.169.254', \
       'refused', 'blocked_address', 403, NULL, 0, 0)";

/// What version 3 makes of version 2's rows: the guard's decision apart
/// from the upstream's outcome, every row in the same terms as new ones
/// (and version 4 after it).
async fn check_upgraded_to_3(s: &Store) {
    assert_eq!(s.schema_version().await.unwrap(), 19);
    let log = s.list_egress("r1", 10).await.unwrap();
    let got: Vec<_> = log
        .iter()
        .map(|e| {
            (
                e.source.as_str(),
                e.decision,
                e.reason.map(RefusalCode::as_str),
                e.outcome,
                e.bytes_in,
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (
                "api_call",
                EgressDecision::Allowed,
                None,
                Some(EgressOutcome::UpstreamFailed),
                0
            ),
            (
                "llm",
                EgressDecision::Allowed,
                None,
                Some(EgressOutcome::UpstreamFailed),
                0
            ),
            (
                "proxy",
                EgressDecision::Allowed,
                None,
                Some(EgressOutcome::Completed),
                4000
            ),
            (
                "proxy",
                EgressDecision::Refused,
                Some("blocked_address"),
                None,
                0
            ),
        ]
    );
    assert!(log.iter().all(|e| e.seq.is_none() && e.metering.is_none()));
    // Version 14: each kept row has the plane its source implies.
    let planes: Vec<_> = log.iter().map(|e| e.plane).collect();
    assert_eq!(
        planes,
        [
            EgressPlane::Api,
            EgressPlane::Api,
            EgressPlane::Proxy,
            EgressPlane::Proxy
        ]
    );
    // The upgraded table takes started-then-completed records.
    let start = NewEgress {
        run_id: "r1",
        at: 9,
        source: EgressSource::Proxy,
        integration: None,
        method: "CONNECT",
        url: "https://c.example/",
        host: "c.example",
        decision: EgressDecision::Allowed,
        reason: None,
        status: None,
        duration_ms: None,
        bytes_out: 0,
        bytes_in: 0,
        seq: Some(1),
        outcome: Some(EgressOutcome::Incomplete),
        metering: None,
        plane: EgressPlane::Proxy,
        rule: None,
    };
    let id = s.append_egress(&start).await.unwrap();
    let done = NewEgress {
        outcome: Some(EgressOutcome::Aborted),
        ..start
    };
    assert_eq!(s.append_egress(&done).await.unwrap(), id);
    assert_eq!(s.list_egress("r1", 10).await.unwrap().len(), 5);
}

#[tokio::test]
async fn a_version_2_database_is_upgraded_on_sqlite() {
    use sqlx::Connection as _;
    let (dir, s) = sqlite().await;
    let path = db_file(&dir);
    new_run(&s, "r1").await;
    s.close().await;
    let mut c = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    sqlx::raw_sql(UNDO_V5_SQLITE).execute(&mut c).await.unwrap();
    sqlx::raw_sql(TO_VERSION_2).execute(&mut c).await.unwrap();
    c.close().await.unwrap();
    let s = Store::open_sqlite(&path, &StoreOptions::default())
        .await
        .unwrap();
    check_upgraded_to_3(&s).await;
}

#[tokio::test]
async fn a_version_2_database_is_upgraded_on_postgres() {
    use sqlx::Connection as _;
    let Some((s, url, schema)) = postgres().await else {
        return;
    };
    new_run(&s, "r1").await;
    s.close().await;
    let sep = if url.contains('?') { '&' } else { '?' };
    let scoped = format!("{url}{sep}options[search_path]={schema}");
    let mut c = sqlx::PgConnection::connect(&scoped).await.unwrap();
    sqlx::raw_sql(UNDO_V5_POSTGRES)
        .execute(&mut c)
        .await
        .unwrap();
    sqlx::raw_sql(TO_VERSION_2).execute(&mut c).await.unwrap();
    c.close().await.unwrap();
    let s = Store::open(&scoped, &StoreOptions::default())
        .await
        .unwrap();
    check_upgraded_to_3(&s).await;
    s.close().await;
    drop_schema(&url, &schema).await;
}

#[tokio::test]
async fn sqlite_gone_is_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let err = Store::open_sqlite(&file.join("airlock.db"), &StoreOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Io { .. }), "{err:?}");
    // a file that is not a database
    let junk = dir.path().join("junk.db");
    std::fs::write(&junk, vec![0x42u8; 8192]).unwrap();
    let err = Store::open_sqlite(&junk, &StoreOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Damaged { .. }), "{err:?}");
    assert!(err.to_string().contains("junk.db"), "{err}");
}

#[tokio::test]
async fn bad_urls_and_unreachable_postgres() {
    let err = Store::open("mysql://x", &StoreOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::UnsupportedUrl(_)), "{err:?}");
    // nothing listens on port 1 of loopback; the password never shows
    let opts = StoreOptions {
        acquire_timeout: Duration::from_secs(2),
        ..Default::default()
    };
    let err = Store::open("postgres://u:hunter2hunter2@127.0.0.1:1/db", &opts)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Unavailable { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(!msg.contains("hunter2"), "{msg}");
    assert!(msg.contains("127.0.0.1:1"), "{msg}");
    // It says why, not only that a connection timed out; the driver's
    // error is kept below it.
    assert!(msg.contains("connection refused"), "{msg}");
    assert!(!msg.contains("timed out"), "{msg}");
    assert!(err.is_transient());
    assert!(
        err.chain().to_string().contains("os error"),
        "{}",
        err.chain()
    );
    // A role the server does not know: an authentication failure, named.
    let Some(url) = pg_url() else { return };
    let mut u = url::Url::parse(&url).unwrap();
    u.set_username("no_such_role_here").unwrap();
    let err = Store::open(u.as_str(), &opts).await.unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, StoreError::Unavailable { .. }), "{err:?}");
    assert!(msg.contains("authentication failed"), "{msg}");
    assert!(msg.contains("no_such_role_here"), "{msg}");
}

// ---- retention and quotas ----

const DAY: i64 = 86_400_000;

/// A run of `LOCAL_ORG` with an event, an egress record and a result;
/// ended `ended_days_ago` days before `now` (or still running).
async fn run_with_records(s: &Store, id: &str, now: i64, ended_days_ago: Option<i64>) {
    new_run(s, id).await;
    s.append_event(&NewEvent {
        run_id: id,
        at: now - 50 * DAY,
        kind: "log",
        payload: "{\"line\":\"hello\"}",
    })
    .await
    .unwrap();
    s.append_egress(&NewEgress {
        run_id: id,
        at: now - 50 * DAY,
        source: EgressSource::ApiCall,
        integration: None,
        method: "GET",
        url: "https://example.test/x",
        host: "example.test",
        decision: EgressDecision::Allowed,
        reason: None,
        status: Some(200),
        duration_ms: Some(1),
        bytes_out: 1,
        bytes_in: 1,
        seq: None,
        outcome: Some(EgressOutcome::Completed),
        metering: None,
        plane: EgressPlane::Proxy,
        rule: None,
    })
    .await
    .unwrap();
    s.put_result(id, "res", "text/plain", &[7u8; 20_000])
        .await
        .unwrap();
    if let Some(days) = ended_days_ago {
        assert!(
            s.finish_run(
                id,
                &RunEnd {
                    status: RunStatus::Succeeded,
                    exit_code: Some(0),
                    error: None,
                    at: now - days * DAY,
                },
            )
            .await
            .unwrap()
        );
    }
}

/// With the clock the test gives: a run over for longer than `runs` goes
/// with all of it; a younger one loses only what a shorter kind keeps
/// less long; a running run and an owed delivery are never touched,
/// however old; a second sweep finds nothing.
async fn retention_sweeps_what_is_over_and_old_and_nothing_else(s: &Store) {
    let now = 1_000 * DAY;
    run_with_records(s, "r_old", now, Some(40)).await;
    run_with_records(s, "r_mid", now, Some(10)).await;
    run_with_records(s, "r_new", now, Some(1)).await;
    run_with_records(s, "r_live", now, None).await;
    s.create_webhook(&hook("wh1", "o", &["run.succeeded"]), None)
        .await
        .unwrap();
    for (id, state) in [
        ("d_done", "delivered"),
        ("d_gaveup", "failed"),
        ("d_owed", "pending"),
    ] {
        s.enqueue_delivery(&airlock_store::DeliveryRow {
            id: id.into(),
            webhook_id: "wh1".into(),
            org_id: "o".into(),
            run_id: format!("run_of_{id}"),
            event: "run.succeeded".into(),
            payload: "{}".into(),
            state: "pending".into(),
            attempts: 0,
            last_status: None,
            last_error: None,
            next_attempt_at: now + DAY,
            created_at: now - 20 * DAY,
            delivered_at: None,
        })
        .await
        .unwrap()
        .then_some(())
        .expect("queued");
        if state != "pending" {
            s.record_delivery_attempt(
                id,
                &airlock_store::DeliveryAttempt {
                    status: Some(200),
                    error: None,
                    delivered: state == "delivered",
                    retry_at: None,
                },
            )
            .await
            .unwrap();
        }
    }
    let keep = Retention {
        runs: Some(Duration::from_secs(30 * 86_400)),
        egress: Some(Duration::from_secs(5 * 86_400)),
        results: Some(Duration::from_secs(5 * 86_400)),
        deliveries: Some(Duration::from_secs(7 * 86_400)),
    };
    let r = s.sweep_retention(&keep, now).await.unwrap();
    assert_eq!(
        (r.runs, r.egress, r.results, r.deliveries),
        (1, 1, 1, 2),
        "{r:?}"
    );
    assert!(s.get_run("r_old").await.unwrap().is_none());
    assert!(s.list_events("r_old", 0, 10).await.unwrap().is_empty());
    assert!(s.list_egress("r_old", 10).await.unwrap().is_empty());
    // r_mid: the run and its events kept, its egress records and results gone.
    assert!(s.get_run("r_mid").await.unwrap().is_some());
    assert_eq!(s.list_events("r_mid", 0, 10).await.unwrap().len(), 1);
    assert!(s.list_egress("r_mid", 10).await.unwrap().is_empty());
    assert_eq!(s.result_bytes("r_mid").await.unwrap(), 0);
    // The young and the running runs keep everything.
    for id in ["r_new", "r_live"] {
        assert_eq!(s.list_egress(id, 10).await.unwrap().len(), 1, "{id}");
        assert_eq!(s.result_bytes(id).await.unwrap(), 20_000, "{id}");
    }
    let left: Vec<String> = s
        .list_deliveries("o", "wh1", 10, None)
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.id)
        .collect();
    assert_eq!(left, ["d_owed"], "an owed delivery is never swept");
    if s.backend() == Backend::Sqlite {
        assert!(r.freed_pages > 0, "SQLite gives the space back: {r:?}");
    }
    let again = s.sweep_retention(&keep, now).await.unwrap();
    assert!(again.is_empty(), "{again:?}");
    // Kept forever: nothing goes, however old.
    let forever = Retention {
        runs: None,
        egress: None,
        results: None,
        deliveries: None,
    };
    assert!(
        s.sweep_retention(&forever, now + 10_000 * DAY)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(s.get_run("r_mid").await.unwrap().is_some());
}

/// Every refusal among `results` is the typed quota refusal of `what` at `limit`.
fn refused_for_quota<T>(results: &[Result<T, StoreError>], what: &str, limit: u64) {
    for r in results.iter().filter_map(|r| r.as_ref().err()) {
        assert!(
            matches!(r, StoreError::QuotaExceeded { what: w, limit: l } if *w == what && *l == limit),
            "{r}"
        );
    }
}

/// A tenant creating keys and webhooks, twenty at once, gets exactly its
/// quota and a typed refusal for the rest; a revoked key frees its place;
/// another organization is not counted against it.
async fn quotas_bound_keys_and_webhooks_even_when_created_at_once(s: &Store) {
    s.create_org("org_q", "Q", None).await.unwrap();
    s.create_org("org_r", "R", None).await.unwrap();
    let keys = futures_util::future::join_all((0..20).map(|i| async move {
        s.insert_api_key(&format!("kq{i}"), "org_q", "k", "h", Some(5))
            .await
    }))
    .await;
    let made = keys.iter().filter(|r| r.is_ok()).count();
    assert_eq!(made, 5, "{keys:?}");
    refused_for_quota(&keys, "API keys", 5);
    s.insert_api_key("kr", "org_r", "k", "h", Some(5))
        .await
        .unwrap();
    let live = s.list_api_keys("org_q").await.unwrap();
    assert!(s.revoke_api_key("org_q", &live[0].id).await.unwrap());
    s.insert_api_key("kq_after", "org_q", "k", "h", Some(5))
        .await
        .unwrap();
    let hooks = futures_util::future::join_all((0..20).map(|i| async move {
        s.create_webhook(&hook(&format!("wq{i}"), "org_q", &["run.failed"]), Some(3))
            .await
    }))
    .await;
    assert_eq!(hooks.iter().filter(|r| r.is_ok()).count(), 3, "{hooks:?}");
    assert_eq!(s.list_webhooks("org_q").await.unwrap().len(), 3);
    s.create_webhook(&hook("wr", "org_r", &["run.failed"]), Some(3))
        .await
        .unwrap();
}

/// A tenant registering twenty agents at once gets exactly its quota and a
/// typed refusal for the rest; replacing one of them at the cap is no new
/// agent; another organization is not counted against it.
async fn agents_are_bounded_per_organization_even_when_registered_at_once(s: &Store) {
    let tries = futures_util::future::join_all((0..20).map(|i| async move {
        s.put_agent("org_q", &format!("bot{i}"), "[agent]", "{}", Some(4))
            .await
    }))
    .await;
    assert_eq!(tries.iter().filter(|r| r.is_ok()).count(), 4, "{tries:?}");
    refused_for_quota(&tries, "agents", 4);
    let kept = tries.iter().find_map(|r| r.as_ref().ok()).unwrap();
    let replaced = s
        .put_agent("org_q", &kept.name, "[agent] # again", "{}", Some(4))
        .await
        .unwrap();
    assert_eq!(replaced.manifest, "[agent] # again");
    s.put_agent("org_r", "bot0", "[agent]", "{}", Some(4))
        .await
        .unwrap();
}

/// The sweep measures each organization's stored bytes; a run for one at
/// or over its quota is refused, another organization's is not.
async fn stored_bytes_are_measured_per_organization_and_refuse_new_runs(s: &Store) {
    let now = 1_000 * DAY;
    run_with_records(s, "r1", now, Some(1)).await;
    assert_eq!(
        s.org_stored_bytes(LOCAL_ORG).await.unwrap(),
        0,
        "never measured"
    );
    s.measure_org_usage(now).await.unwrap();
    let used = s.org_stored_bytes(LOCAL_ORG).await.unwrap();
    assert!((20_000..21_000).contains(&used), "{used}");
    s.check_stored_bytes(LOCAL_ORG, Some(used + 1))
        .await
        .unwrap();
    let err = s
        .check_stored_bytes(LOCAL_ORG, Some(used))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::QuotaExceeded {
                what: "stored bytes",
                ..
            }
        ),
        "{err}"
    );
    s.check_stored_bytes("org_other", Some(1)).await.unwrap();
    s.check_stored_bytes(LOCAL_ORG, None).await.unwrap();
    // Swept away, measured again: back under.
    let all = Retention {
        runs: Some(Duration::from_secs(1)),
        ..Retention::default()
    };
    assert_eq!(s.sweep_retention(&all, now).await.unwrap().runs, 1);
    s.measure_org_usage(now).await.unwrap();
    assert_eq!(s.org_stored_bytes(LOCAL_ORG).await.unwrap(), 0);
}

/// A run's artifacts: stored within its cap and its organization's, the
/// rest recorded refused with the reason (no body kept); one record per
/// path; at most `MAX_RUN_ARTIFACTS` records; another organization's
/// artifacts do not count, and parallel writes never pass a cap.
async fn artifacts_are_stored_within_the_run_and_organization_caps_even_at_once(s: &Store) {
    use airlock_platform_api::files::{ArtifactRefusal, MAX_RUN_ARTIFACTS};
    for (org, id) in [
        ("org_a", "run_a1"),
        ("org_a", "run_a2"),
        ("org_b", "run_b1"),
    ] {
        s.enqueue_run(&queued(org, id)).await.unwrap();
    }
    let caps = ArtifactCaps {
        run_bytes: 100,
        org_bytes: Some(150),
    };
    let put = |run: &'static str, path: String, n: usize| async move {
        s.put_artifact(run, &path, ArtifactBody::File(&vec![b'x'; n]), caps)
            .await
    };
    assert_eq!(put("run_a1", "out/a.txt".into(), 60).await.unwrap(), None);
    // 60 + 50 > 100: over the run's cap, recorded without its body.
    assert_eq!(
        put("run_a1", "out/b.txt".into(), 50).await.unwrap(),
        Some(ArtifactRefusal::RunQuota)
    );
    assert_eq!(put("run_a1", "out/c.txt".into(), 40).await.unwrap(), None);
    // The organization holds 100 of 150: ten writers of 20 bytes at once,
    // exactly two fit.
    let tries =
        futures_util::future::join_all((0..10).map(|i| put("run_a2", format!("p{i}"), 20))).await;
    let stored = tries.iter().filter(|r| matches!(r, Ok(None))).count();
    assert_eq!(stored, 2, "{tries:?}");
    assert!(
        tries
            .iter()
            .all(|r| matches!(r, Ok(None) | Ok(Some(ArtifactRefusal::OrgQuota)))),
        "{tries:?}"
    );
    // Another organization starts from nothing.
    assert_eq!(put("run_b1", "x".into(), 100).await.unwrap(), None);
    // What the runtime refused itself is recorded as it said.
    let link = ArtifactBody::Refused {
        why: ArtifactRefusal::Symlink,
        bytes: 0,
    };
    assert_eq!(
        s.put_artifact("run_b1", "link", link, caps).await.unwrap(),
        Some(ArtifactRefusal::Symlink)
    );
    assert!(matches!(
        s.put_artifact("run_b1", "x", link, caps).await,
        Err(StoreError::ArtifactExists { .. })
    ));
    let listed = s.list_artifacts("run_a1").await.unwrap();
    let seen: Vec<_> = listed
        .iter()
        .map(|a| (a.path.as_str(), a.bytes, a.refused))
        .collect();
    assert_eq!(
        seen,
        [
            ("out/a.txt", 60, None),
            ("out/b.txt", 50, Some(ArtifactRefusal::RunQuota)),
            ("out/c.txt", 40, None)
        ]
    );
    let (row, body) = s
        .get_artifact("run_a1", "out/a.txt")
        .await
        .unwrap()
        .unwrap();
    assert_eq!((row.bytes, body.len()), (60, 60));
    assert!(
        s.get_artifact("run_a1", "out/b.txt")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        s.get_artifact("run_b1", "out/a.txt")
            .await
            .unwrap()
            .is_none()
    );
    // A bounded number of records per run, whatever they hold.
    s.enqueue_run(&queued("org_c", "run_c1")).await.unwrap();
    let empty = ArtifactBody::Refused {
        why: ArtifactRefusal::NotAFile,
        bytes: 0,
    };
    for i in 0..MAX_RUN_ARTIFACTS {
        s.put_artifact("run_c1", &format!("f{i}"), empty, caps)
            .await
            .unwrap();
    }
    assert!(matches!(
        s.put_artifact("run_c1", "one-more", empty, caps).await,
        Err(StoreError::QuotaExceeded {
            what: "artifacts of one run",
            ..
        })
    ));
    assert!(matches!(
        s.put_artifact("run_none", "x", empty, caps).await,
        Err(StoreError::RunNotFound(_))
    ));
}

/// Twenty runs queued at once stop at the organization's cap; a started
/// run frees its place; another organization is not counted. The same for
/// connections.
async fn queued_runs_and_connections_are_bounded_per_organization_even_at_once(s: &Store) {
    let ids: Vec<String> = (0..20).map(|i| format!("run_q{i}")).collect();
    let tries = futures_util::future::join_all(ids.iter().map(|id| async move {
        s.enqueue_run(&NewQueuedRun {
            max_queued: Some(5),
            ..queued("org_q", id)
        })
        .await
    }))
    .await;
    assert_eq!(tries.iter().filter(|r| r.is_ok()).count(), 5, "{tries:?}");
    refused_for_quota(&tries, "queued runs", 5);
    s.enqueue_run(&NewQueuedRun {
        max_queued: Some(5),
        ..queued("org_r", "run_r0")
    })
    .await
    .unwrap();
    // A claimed run is no longer queued: one more fits.
    assert!(s.claim_next_run("replica", None).await.unwrap().is_some());
    s.enqueue_run(&NewQueuedRun {
        max_queued: Some(5),
        ..queued("org_q", "run_q_more")
    })
    .await
    .unwrap();

    let ring = ring("k1", 1);
    let envelope = ring.encrypt(b"{}").unwrap();
    let names: Vec<String> = (0..12).map(|i| format!("c{i}")).collect();
    let tries = futures_util::future::join_all(names.iter().map(|name| {
        let envelope = &envelope;
        async move {
            let c = NewConnection {
                org: "org_q",
                name,
                integration: "github",
                auth_type: AuthType::Bearer,
                envelope,
            };
            s.insert_connection_within(&c, Some(3)).await
        }
    }))
    .await;
    assert_eq!(tries.iter().filter(|r| r.is_ok()).count(), 3, "{tries:?}");
    refused_for_quota(&tries, "connections", 3);
    let taken = NewConnection {
        org: "org_q",
        name: names.iter().zip(&tries).find(|(_, r)| r.is_ok()).unwrap().0,
        integration: "github",
        auth_type: AuthType::Bearer,
        envelope: &envelope,
    };
    assert!(matches!(
        s.insert_connection_within(&taken, Some(100)).await,
        Err(StoreError::ConnectionExists(_))
    ));
}

/// Revoked keys are kept, the newest `MAX_REVOKED_KEYS`; memories, the
/// newest `MAX_MEMORIES_PER_AGENT` of an agent, each bounded in size.
async fn revoked_keys_and_memories_are_kept_bounded(s: &Store) {
    s.create_org("org_k", "K", None).await.unwrap();
    let n = usize::try_from(MAX_REVOKED_KEYS).unwrap() + 5;
    for i in 0..n {
        let id = format!("key{i:04}");
        s.insert_api_key(&id, "org_k", &format!("n{i}"), &format!("h{i}"), None)
            .await
            .unwrap();
        assert!(s.revoke_api_key("org_k", &id).await.unwrap());
    }
    s.insert_api_key("live", "org_k", "live", "h", None)
        .await
        .unwrap();
    let keys = s.list_api_keys("org_k").await.unwrap();
    let revoked = keys.iter().filter(|k| k.revoked_at.is_some()).count();
    assert_eq!(revoked, usize::try_from(MAX_REVOKED_KEYS).unwrap());
    assert!(
        keys.iter()
            .any(|k| k.id == "live" && k.revoked_at.is_none())
    );
    assert!(
        keys.iter().any(|k| k.id == format!("key{:04}", n - 1)),
        "the newest kept"
    );
    assert!(
        s.get_api_key("key0000").await.unwrap().is_none(),
        "the oldest forgotten"
    );

    let cap = usize::try_from(MAX_MEMORIES_PER_AGENT).unwrap();
    for i in 0..cap + 3 {
        s.add_memory("org_m", "bot", None, &format!("m{i}"))
            .await
            .unwrap();
    }
    s.add_memory("org_m", "other", None, "kept").await.unwrap();
    let all = s
        .list_memories("org_m", "bot", u32::try_from(cap + 10).unwrap())
        .await
        .unwrap();
    assert_eq!(all.len(), cap);
    assert_eq!(all[0].content, format!("m{}", cap + 2));
    assert_eq!(
        s.list_memories("org_m", "other", 10).await.unwrap().len(),
        1
    );
    assert!(matches!(
        s.add_memory("org_m", "bot", None, &"x".repeat(MAX_MEMORY_BYTES + 1))
            .await,
        Err(StoreError::Invalid { .. })
    ));
}

/// Retention and quota settings: defaults, `forever` / `unlimited`, and a
/// typo refused with the setting's name.
#[test]
fn retention_and_quota_settings_are_parsed_strictly() {
    let none = |_: &str| None;
    assert_eq!(Retention::from_lookup(none).unwrap(), Retention::default());
    assert_eq!(OrgQuotas::from_lookup(none).unwrap(), OrgQuotas::default());
    let r = Retention::from_lookup(|k| match k {
        "RETENTION_RUNS_DAYS" => Some("forever".into()),
        "RETENTION_EGRESS_DAYS" => Some("0.5".into()),
        _ => None,
    })
    .unwrap();
    assert_eq!(r.runs, None);
    assert_eq!(r.egress, Some(Duration::from_secs(43_200)));
    for bad in ["0", "-1", "30d", "1e308", "NaN"] {
        let e = Retention::from_lookup(|k| (k == "RETENTION_RESULTS_DAYS").then(|| bad.to_owned()))
            .unwrap_err();
        assert_eq!(e.var, "RETENTION_RESULTS_DAYS", "{bad}");
    }
    let q =
        OrgQuotas::from_lookup(|k| (k == "ORG_MAX_WEBHOOKS").then(|| "unlimited".into())).unwrap();
    assert_eq!(q.webhooks, None);
    for bad in ["0", "-3", "ten", "1.5"] {
        let e = OrgQuotas::from_lookup(|k| (k == "ORG_MAX_API_KEYS").then(|| bad.to_owned()))
            .unwrap_err();
        assert_eq!(e.var, "ORG_MAX_API_KEYS", "{bad}");
    }
}

fn periods(day: &str) -> Periods {
    Periods {
        day: format!("day:{day}"),
        month: format!("month:{}", &day[..7]),
    }
}

/// Retention bounds `org_spend`: the spend of days past `SPEND_DAYS_KEPT`
/// and of months past `SPEND_MONTHS_KEPT` goes, the current day's and
/// month's (reservations still charged to them included) stay, and
/// nothing else of the organization's budget is touched.
async fn past_budget_spend_is_swept_and_the_current_periods_kept(s: &Store) {
    const DAY: i64 = 86_450_000;
    // 2026-12-06T12:00:00Z.
    let now = 1_796_558_450_000;
    assert_eq!(Periods::at(now), periods("2026-12-06"));
    let c = Charge {
        tokens: 10,
        cost_microusd: 1,
        requests: 1,
    };
    let at = |days_ago: i64| Periods::at(now - days_ago * DAY);
    for days_ago in [0, 1, SPEND_DAYS_KEPT - 1, SPEND_DAYS_KEPT + 1, 450, 500] {
        assert_eq!(
            s.reserve_org_budget("o-sweep", &at(days_ago), &c)
                .await
                .unwrap(),
            Reservation::Granted
        );
    }
    let budget = OrgBudget {
        day: BudgetLimits {
            tokens: Some(1000),
            ..BudgetLimits::default()
        },
        month: BudgetLimits::default(),
    };
    s.set_org_budget("o-sweep", &budget).await.unwrap();
    let keep_all = Retention {
        runs: None,
        egress: None,
        results: None,
        deliveries: None,
    };
    let r = s.sweep_retention(&keep_all, now).await.unwrap();
    // Days 36, 450 and 500 ago; the months of 450 and 500 days ago (the
    // month of 36 days ago is kept: 13 months are).
    assert_eq!(r.spend, 5, "{r:?}");
    for days_ago in [0, 1, SPEND_DAYS_KEPT - 1] {
        let (day, month) = s.org_spend("o-sweep", &at(days_ago)).await.unwrap();
        assert_eq!(
            (day.tokens, day.reserved_tokens),
            (10, 10),
            "{days_ago} days ago"
        );
        assert!(month.tokens >= 10, "{days_ago} days ago: {month:?}");
    }
    for days_ago in [SPEND_DAYS_KEPT + 1, 450, 500] {
        let (day, _) = s.org_spend("o-sweep", &at(days_ago)).await.unwrap();
        assert_eq!(day, PeriodSpend::default(), "{days_ago} days ago");
    }
    for days_ago in [450, 500] {
        let (_, month) = s.org_spend("o-sweep", &at(days_ago)).await.unwrap();
        assert_eq!(month, PeriodSpend::default(), "{days_ago} days ago");
    }
    assert_eq!(s.org_budget("o-sweep").await.unwrap(), budget);
    assert_eq!(s.sweep_retention(&keep_all, now).await.unwrap().spend, 0);
}

/// A reservation is charged to the day and the month only when it fits
/// every limit of both; settling replaces it with what was used; another
/// organization's spend is its own.
async fn org_budgets_are_reserved_within_every_limit_and_settled(s: &Store) {
    let p = periods("2026-12-06");
    assert_eq!(s.org_budget("o1").await.unwrap(), OrgBudget::default());
    let budget = OrgBudget {
        day: BudgetLimits {
            tokens: Some(1000),
            cost_microusd: None,
            requests: Some(3),
        },
        month: BudgetLimits {
            tokens: None,
            cost_microusd: Some(500),
            requests: None,
        },
    };
    s.set_org_budget("o1", &budget).await.unwrap();
    assert_eq!(s.org_budget("o1").await.unwrap(), budget);
    let c = |tokens, cost_microusd| Charge {
        tokens,
        cost_microusd,
        requests: 1,
    };
    assert_eq!(
        s.reserve_org_budget("o1", &p, &c(600, 100)).await.unwrap(),
        Reservation::Granted
    );
    // 600 + 600 passes the day's 1000 tokens: nothing is charged.
    assert_eq!(
        s.reserve_org_budget("o1", &p, &c(600, 100)).await.unwrap(),
        Reservation::Exceeded {
            period: Period::Day,
            measure: Measure::Tokens,
            limit: 1000,
            spent: 600
        }
    );
    let (day, month) = s.org_spend("o1", &p).await.unwrap();
    assert_eq!(
        (day.tokens, day.requests, day.reserved_tokens),
        (600, 1, 600)
    );
    assert_eq!(
        (month.cost_microusd, month.reserved_cost_microusd),
        (100, 100)
    );
    // The call used less: the rest is free again.
    s.settle_org_budget("o1", "r1", &p, &c(600, 100), &c(200, 40))
        .await
        .unwrap();
    let (day, month) = s.org_spend("o1", &p).await.unwrap();
    assert_eq!((day.tokens, day.reserved_tokens, day.requests), (200, 0, 1));
    assert_eq!((month.cost_microusd, month.reserved_cost_microusd), (40, 0));
    // The month's cost passes before the day's tokens do.
    assert_eq!(
        s.reserve_org_budget("o1", &p, &c(100, 461)).await.unwrap(),
        Reservation::Exceeded {
            period: Period::Month,
            measure: Measure::CostMicrousd,
            limit: 500,
            spent: 40
        }
    );
    // The day's requests: 1 + 2 more, then no more.
    for _ in 0..2 {
        assert_eq!(
            s.reserve_org_budget("o1", &p, &c(1, 1)).await.unwrap(),
            Reservation::Granted
        );
    }
    assert!(matches!(
        s.reserve_org_budget("o1", &p, &c(1, 1)).await.unwrap(),
        Reservation::Exceeded {
            measure: Measure::Requests,
            ..
        }
    ));
    // A new day is a new day's budget, within the same month's.
    let next = periods("2026-12-07");
    assert_eq!(
        s.reserve_org_budget("o1", &next, &c(900, 1)).await.unwrap(),
        Reservation::Granted
    );
    let (day, month) = s.org_spend("o1", &next).await.unwrap();
    assert_eq!((day.tokens, month.tokens), (900, 202 + 900));
    // Another organization, no budget: charged, never refused.
    assert_eq!(
        s.reserve_org_budget("o2", &p, &c(1 << 40, 1 << 40))
            .await
            .unwrap(),
        Reservation::Granted
    );
    assert_eq!(s.org_spend("o1", &p).await.unwrap().0.tokens, 202);
}

/// Reservations made at once, over many connections, against a budget that
/// fits some of them: exactly those pass.
async fn racing_reservations_never_pass_a_budget_that_fits_fewer(s: &Store) {
    race_reservations(s, s).await;
}

/// Races 16 reservations of 100 tokens against a day budget of 550, half
/// of them through `a`, half through `b`: exactly 5 pass.
async fn race_reservations(a: &Store, b: &Store) {
    let p = periods("2026-12-06");
    let budget = OrgBudget {
        day: BudgetLimits {
            tokens: Some(550),
            ..BudgetLimits::default()
        },
        ..OrgBudget::default()
    };
    a.set_org_budget("race", &budget).await.unwrap();
    let charge = Charge {
        tokens: 100,
        cost_microusd: 0,
        requests: 1,
    };
    let tries = (0..16).map(|i| {
        let (s, p) = (if i % 2 == 0 { a } else { b }, &p);
        async move { s.reserve_org_budget("race", p, &charge).await.unwrap() }
    });
    let answers = futures_util::future::join_all(tries).await;
    let granted = answers
        .iter()
        .filter(|a| **a == Reservation::Granted)
        .count();
    assert_eq!(granted, 5, "{answers:?}");
    assert_eq!(a.org_spend("race", &p).await.unwrap().0.tokens, 500);
}

/// Two replicas (two stores on one PostgreSQL database) racing one
/// organization's day budget cannot both take its last share.
#[tokio::test]
async fn two_replicas_racing_one_budget_on_postgres_pass_only_what_fits() {
    let Some((a, b, url, schema)) = two_replicas().await else {
        return;
    };
    race_reservations(&a, &b).await;
    a.close().await;
    b.close().await;
    drop_schema(&url, &schema).await;
}

/// Two stores on one fresh PostgreSQL schema (two replicas): with its URL
/// and schema, for [`drop_schema`].
async fn two_replicas() -> Option<(Store, Store, String, String)> {
    let (a, url, schema) = postgres().await?;
    let sep = if url.contains('?') { '&' } else { '?' };
    let b = Store::open(
        &format!("{url}{sep}options[search_path]={schema}"),
        &StoreOptions::default(),
    )
    .await
    .unwrap();
    Some((a, b, url, schema))
}

/// Thresholds [0.5, 1]: a run whose usage reaches 60 %, then 70 %, then
/// 100 % of its token budget crosses 50 % once and 100 % once, each with
/// one delivery per subscribed webhook (none to another organization's or
/// to one not subscribed), whichever write added the usage.
async fn a_runs_budget_crosses_each_threshold_once_with_its_deliveries(s: &Store) {
    let t = Thresholds::from_fractions(&[0.5, 1.0]).unwrap();
    s.set_budget_thresholds("ot", &t).await.unwrap();
    assert_eq!(s.budget_thresholds("ot").await.unwrap(), t);
    assert_eq!(
        s.budget_thresholds("other").await.unwrap(),
        Thresholds::default()
    );
    for (id, org, events) in [
        ("wh_b", "ot", &[THRESHOLD_EVENT][..]),
        ("wh_r", "ot", &["run.failed"][..]),
        ("wh_x", "other", &[THRESHOLD_EVENT][..]),
    ] {
        s.create_webhook(&hook(id, org, events), None)
            .await
            .unwrap();
    }
    s.enqueue_run(&queued("ot", "rb")).await.unwrap();
    s.set_run_budget(
        "rb",
        &BudgetLimits {
            tokens: Some(1000),
            ..BudgetLimits::default()
        },
    )
    .await
    .unwrap();
    let usage = |tokens_in, tokens_out| Usage {
        tokens_in,
        tokens_out,
        cost_microusd: 1,
    };
    s.add_run_usage("rb", &usage(500, 100)).await.unwrap();
    s.add_run_usage("rb", &usage(100, 0)).await.unwrap();
    // The last 300 tokens with a journalled event.
    let journalled = JournalledEvent {
        seq: 1,
        at: 5,
        kind: "cost".into(),
        payload: "{}".into(),
        usage: Some(usage(200, 100)),
    };
    s.append_journal_events("rb", std::slice::from_ref(&journalled))
        .await
        .unwrap();
    // Read again: stored once, nothing crossed twice.
    s.append_journal_events("rb", &[journalled]).await.unwrap();
    let crossed: Vec<_> = s
        .budget_crossings("ot", 10)
        .await
        .unwrap()
        .into_iter()
        .map(|c| (c.budget, c.period, c.measure, c.threshold, c.spent, c.limit))
        .collect();
    assert_eq!(
        crossed,
        vec![
            ("run".into(), "rb".into(), "tokens".into(), 500, 600, 1000),
            ("run".into(), "rb".into(), "tokens".into(), 1000, 1000, 1000),
        ]
    );
    let d = s.list_deliveries("ot", "wh_b", 10, None).await.unwrap();
    assert_eq!(d.len(), 2, "{d:?}");
    for x in &d {
        assert_eq!(
            (x.event.as_str(), x.run_id.as_str()),
            (THRESHOLD_EVENT, "rb")
        );
        let c = s.delivery_crossing("ot", &x.id).await.unwrap().unwrap();
        assert_eq!(c.run_id, "rb");
        // Another organization's delivery id finds nothing.
        assert_eq!(s.delivery_crossing("other", &x.id).await.unwrap(), None);
    }
    for (org, hook) in [("ot", "wh_r"), ("other", "wh_x")] {
        let none = s.list_deliveries(org, hook, 10, None).await.unwrap();
        assert!(none.is_empty(), "{hook}: {none:?}");
    }
    // A run with no budget crosses nothing.
    s.enqueue_run(&queued("ot", "rn")).await.unwrap();
    s.add_run_usage("rn", &usage(1 << 30, 0)).await.unwrap();
    assert_eq!(s.budget_crossings("ot", 10).await.unwrap().len(), 2);
}

/// Two runs racing through an organization's day budget: each threshold
/// is crossed once, with one delivery.
async fn racing_settlements_cross_an_org_threshold_once(s: &Store) {
    race_settlements(s, s).await;
}

/// Settles 10 calls of 100 tokens (runs `ra` and `rb` in turn, half
/// through `a`, half through `b`) against a day budget of 1000 tokens at
/// the default thresholds: 50 %, 80 % and 100 % are crossed once each.
async fn race_settlements(a: &Store, b: &Store) {
    let p = periods("2026-12-06");
    a.set_org_budget(
        "oc",
        &OrgBudget {
            day: BudgetLimits {
                tokens: Some(1000),
                ..BudgetLimits::default()
            },
            ..OrgBudget::default()
        },
    )
    .await
    .unwrap();
    a.create_webhook(&hook("wh_c", "oc", &[THRESHOLD_EVENT]), None)
        .await
        .unwrap();
    let c = Charge {
        tokens: 100,
        cost_microusd: 0,
        requests: 1,
    };
    for _ in 0..10 {
        assert_eq!(
            a.reserve_org_budget("oc", &p, &c).await.unwrap(),
            Reservation::Granted
        );
    }
    // Reserved, not settled: nothing is spent yet.
    assert!(a.budget_crossings("oc", 10).await.unwrap().is_empty());
    let settle = (0..10).map(|i| {
        let (s, p) = (if i % 2 == 0 { a } else { b }, &p);
        let run = if i % 2 == 0 { "ra" } else { "rb" };
        async move { s.settle_org_budget("oc", run, p, &c, &c).await.unwrap() }
    });
    futures_util::future::join_all(settle).await;
    let crossed: Vec<_> = a
        .budget_crossings("oc", 10)
        .await
        .unwrap()
        .into_iter()
        .map(|c| (c.budget, c.period, c.measure, c.threshold, c.limit))
        .collect();
    let day = |t| {
        (
            "org_day".to_owned(),
            "day:2026-12-06".to_owned(),
            "tokens".to_owned(),
            t,
            1000,
        )
    };
    let mut sorted = crossed.clone();
    sorted.sort_by_key(|c| c.3);
    assert_eq!(sorted, vec![day(500), day(800), day(1000)], "{crossed:?}");
    let d = a.list_deliveries("oc", "wh_c", 10, None).await.unwrap();
    assert_eq!(d.len(), 3, "{d:?}");
    assert_eq!(a.org_spend("oc", &p).await.unwrap().0.tokens, 1000);
}

/// Two replicas (two stores on one PostgreSQL database) settling one
/// organization's calls at once cross each threshold once.
#[tokio::test]
async fn two_replicas_settling_at_once_on_postgres_cross_each_threshold_once() {
    let Some((a, b, url, schema)) = two_replicas().await else {
        return;
    };
    race_settlements(&a, &b).await;
    a.close().await;
    b.close().await;
    drop_schema(&url, &schema).await;
}

/// Each change lands on the version it replaces (a second change on the
/// same version is refused, nothing written), up to the bound; the
/// sidecar's report only moves forward; a watcher in this process wakes.
async fn a_runs_policy_changes_are_versioned_bounded_and_never_lost(s: &Store) {
    new_run(s, "rp").await;
    assert_eq!(s.policy_version("rp").await.unwrap(), 0);
    assert_eq!(s.policy_at("rp", 0).await.unwrap(), None);
    let mut watch = s.policy_watch();
    s.put_policy_ceiling("rp", r#"{"network":[]}"#)
        .await
        .unwrap();
    assert!(watch.has_changed().unwrap());
    watch.borrow_and_update();
    assert_eq!(s.change_policy("rp", 0, "{}", "key k1").await.unwrap(), 1);
    assert!(matches!(
        s.change_policy("rp", 0, "{}", "key k2").await,
        Err(StoreError::PolicyChanged { latest: 1, .. })
    ));
    let row = s.policy_at("rp", 1).await.unwrap().unwrap();
    assert_eq!((row.rules.as_str(), row.actor.as_str()), ("{}", "key k1"));
    assert_eq!(
        s.policy_at("rp", 0).await.unwrap().unwrap().actor,
        "manifest"
    );
    for v in 1..airlock_store::MAX_POLICY_CHANGES {
        s.change_policy("rp", v, "{}", "key k1").await.unwrap();
    }
    assert!(matches!(
        s.change_policy("rp", airlock_store::MAX_POLICY_CHANGES, "{}", "key k1")
            .await,
        Err(StoreError::PolicyChangesExhausted { .. })
    ));
    assert_eq!(
        s.policy_version("rp").await.unwrap(),
        airlock_store::MAX_POLICY_CHANGES
    );
    assert_eq!(s.policy_applied("rp").await.unwrap(), 0);
    s.record_policy_applied("rp", 3).await.unwrap();
    s.record_policy_applied("rp", 2).await.unwrap();
    assert_eq!(s.policy_applied("rp").await.unwrap(), 3);
    assert!(watch.has_changed().unwrap());
    let (changes, _) = s.policy_mark().await.unwrap();
    assert_eq!(changes, airlock_store::MAX_POLICY_CHANGES + 1);
}
