//! Webhooks: run events, and budget thresholds reached, delivered to an
//! organization's URLs, signed.
//!
//! Signing (docs/serve.md): each delivery is a POST of a JSON body with
//! `Airlock-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`,
//! `Airlock-Event` and `Airlock-Delivery` (the delivery's id, the same on
//! every retry: receivers deduplicate on it). A receiver recomputes the MAC
//! over the exact bytes it received and refuses a timestamp older than its
//! tolerance (five minutes is usual), which stops replays.
//!
//! The URL is judged by the egress guard when the webhook is created and
//! again at every delivery (resolve-and-pin: the address the guard approved
//! is the one dialled). Redirects are not followed. A delivery never blocks
//! a run: events are queued in the store and sent by every replica's
//! deliverer, each due delivery claimed by one replica at a time ([`hold`]:
//! released at once when the replica stops or is judged dead); failures
//! are retried with exponential backoff up to `WEBHOOK_MAX_ATTEMPTS`, and
//! every attempt is recorded.
//!
//! A run's end queues its deliveries in the transaction that stores the
//! end (the store's outbox), whoever ends it: they are sent even if the
//! process that ended the run dies at once. Their body is rendered when
//! first sent (the run has ended: it no longer changes) and kept, so every
//! retry sends the same bytes. `run.started` is queued here, once the run
//! is claimed. One run event has one delivery (one id) per webhook. A
//! budget threshold reached queues its `budget.threshold` deliveries in the
//! store too, with the spend that reached it (once per budget, threshold
//! and period, across replicas); their body is rendered from that record.
//! A held request's `approval.pending` and `approval.settled` are queued
//! in the store when the approval is asked for and settled (one per
//! approval and event); their body is rendered from the stored approval.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use airlock_egress::{AuthorizedUris, CallRules, OutboundRequest};
use airlock_store::{DeliveryAttempt, DeliveryRow, Run, RunStatus};
use secrecy::ExposeSecret as _;

use crate::state::AppState;

/// The events a webhook may subscribe to.
pub use airlock_api::v1::WEBHOOK_EVENTS as EVENTS;

/// The event a run's current state is.
pub fn event_of(status: RunStatus) -> Option<&'static str> {
    airlock_store::run_event(status)
}

/// What a webhook URL may reach: its own origin (any path), no credential.
/// Naming the host literally is what lets an operator's
/// `EGRESS_ALLOW_INTERNAL_HOSTS` entry apply, as for an integration's
/// `authorized_uris`; every SSRF check applies as to a sandbox's request.
pub fn authorized_for(url: &str) -> Result<AuthorizedUris, airlock_egress::EgressError> {
    let t = airlock_egress::Target::parse(url)?;
    Ok(AuthorizedUris::parse(&[format!(
        "{}://{}/**",
        t.scheme(),
        t.authority()
    )]))
}

pub fn rules(authorized: &AuthorizedUris) -> CallRules<'_> {
    CallRules {
        authorized,
        allow_all_uris: false,
        credentialed: false,
    }
}

/// `t=…,v1=…` for `body` at `t` (Unix seconds) under `secret`: the API
/// contract's one signing.
pub use airlock_api::webhook::sign as signature;

/// What a delivery's event is about besides its run.
#[derive(Default)]
struct About {
    /// `budget.threshold`'s threshold reached.
    crossing: Option<airlock_store::Crossing>,
    /// An approval event's approval, as the event shows it.
    approval: Option<airlock_api::v1::Approval>,
}

/// The body of a delivery of `event` about `run` (and what else it is
/// `about`).
fn payload(id: &str, event: &str, created_at: i64, run: &Run, about: &About) -> String {
    let body = airlock_api::v1::WebhookEvent {
        created_at,
        data: airlock_api::v1::WebhookEventData {
            approval: about.approval.clone(),
            budget: about
                .crossing
                .as_ref()
                .map(airlock_api::v1::BudgetThreshold::from),
            run: airlock_api::v1::Run::of(run, None),
        },
        id: id.to_owned(),
        event: event.to_owned(),
    };
    // Plain data: its serialization cannot fail.
    serde_json::to_string(&body).unwrap_or_default()
}

/// Queues `run.started` for each of the run's organization's webhooks that
/// subscribed to it (the run as it is now, just claimed). Never fails the
/// caller: a store error is logged. (A run's end queues its own deliveries,
/// in the store, with the end.)
pub async fn emit_started(app: &AppState, run: &Run) {
    let Some(event) = event_of(run.status).filter(|e| *e == "run.started") else {
        return;
    };
    let hooks = match app.store().list_webhooks(&run.org_id).await {
        Ok(h) => h,
        Err(e) => {
            app.store_watch().failed("queueing run.started", &e);
            return;
        }
    };
    let now = airlock_store::now_ms();
    let mut any = false;
    for h in hooks {
        let wants: Vec<String> = serde_json::from_str(&h.events).unwrap_or_default();
        if !wants.iter().any(|e| e == event) {
            continue;
        }
        let Ok(id) = airlock_store::new_delivery_id() else {
            continue;
        };
        let d = DeliveryRow {
            payload: payload(&id, event, now, run, &About::default()),
            id,
            webhook_id: h.id.clone(),
            org_id: run.org_id.clone(),
            run_id: run.id.clone(),
            event: event.to_owned(),
            state: "pending".into(),
            attempts: 0,
            last_status: None,
            last_error: None,
            next_attempt_at: now,
            created_at: now,
            delivered_at: None,
        };
        match app.store().enqueue_delivery(&d).await {
            Ok(queued) => any |= queued,
            Err(e) => app.store_watch().failed("queueing run.started", &e),
        }
    }
    if any {
        app.kick_deliveries();
    }
}

/// How long a replica holds a delivery it claimed before another may take
/// it: two minutes, or twice the attempt's timeout if that is longer (an
/// attempt under way is never sent twice at once). A replica that stops
/// releases its claims; the leader releases those of a replica it judges
/// dead; the hold only matters when neither happened (docs/serve.md).
pub fn hold(webhook_timeout: Duration) -> Duration {
    Duration::from_secs(120).max(webhook_timeout * 2)
}
/// Deliveries sent at once by one replica.
const AT_ONCE: u32 = 16;

/// Deliveries under way on this replica, per organization: what each may
/// still claim of its share (`WEBHOOK_SLOTS_PER_ORG`).
#[derive(Clone, Default)]
struct InFlight(Arc<Mutex<HashMap<String, usize>>>);

impl InFlight {
    fn room(&self, org: &str, share: usize) -> i64 {
        let held = self
            .0
            .lock()
            .map_or(share, |m| m.get(org).copied().unwrap_or(0));
        i64::try_from(share.saturating_sub(held)).unwrap_or(0)
    }

    fn add(&self, org: &str) {
        if let Ok(mut m) = self.0.lock() {
            *m.entry(org.to_owned()).or_default() += 1;
        }
    }

    fn done(&self, org: &str) {
        if let Ok(mut m) = self.0.lock()
            && let Some(n) = m.get_mut(org)
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                m.remove(org);
            }
        }
    }
}

/// Claims and sends due deliveries until `stop` turns true; then waits for
/// the attempts under way to be recorded.
///
/// Fairness: the replica's [`AT_ONCE`] slots are claimed organization by
/// organization in turn, and one organization holds at most its share
/// (`WEBHOOK_SLOTS_PER_ORG`) of them at once: slow or hanging receivers of
/// one tenant delay only that tenant's deliveries.
pub async fn deliver_loop(app: AppState, mut stop: tokio::sync::watch::Receiver<bool>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(AT_ONCE as usize));
    let in_flight = InFlight::default();
    let share = app.cfg().webhook_slots_per_org;
    let hold_ms = i64::try_from(hold(app.cfg().webhook_timeout).as_millis()).unwrap_or(i64::MAX);
    loop {
        if *stop.borrow() {
            break;
        }
        let free = slots.available_permits();
        if free > 0 {
            match app
                .store()
                .claim_due_deliveries_fairly(
                    app.replica(),
                    hold_ms,
                    i64::try_from(free).unwrap_or(i64::MAX),
                    |org| in_flight.room(org, share),
                )
                .await
            {
                Ok(due) => {
                    if !due.is_empty() {
                        // Test-only: a crash with deliveries claimed, unsent.
                        crate::failpoint::FailPoint::AfterDeliveryClaim.hit(app.cfg().fail_point);
                    }
                    for d in due {
                        let Ok(permit) = slots.clone().acquire_owned().await else {
                            return;
                        };
                        let (app, in_flight) = (app.clone(), in_flight.clone());
                        in_flight.add(&d.org_id);
                        tokio::spawn(async move {
                            let org = d.org_id.clone();
                            deliver(&app, d).await;
                            in_flight.done(&org);
                            drop(permit);
                            app.kick_deliveries();
                        });
                    }
                }
                Err(e) => app.store_watch().failed("claiming webhook deliveries", &e),
            }
        }
        tokio::select! {
            () = app.orch().ends.notified() => {}
            () = tokio::time::sleep(Duration::from_millis(250)) => {}
            _ = stop.changed() => {}
        }
    }
    let _ = slots.acquire_many(AT_ONCE).await;
}

/// Why one delivery attempt was not answered by its receiver: one variant
/// per step. Its text is the delivery's `last_error`, which the tenant
/// reads: a refusal names the rule, never a resolved address.
#[derive(Debug, thiserror::Error)]
pub enum AttemptError {
    #[error("gone: the run was deleted")]
    RunDeleted,
    #[error("store: {}", .0.chain())]
    ReadCrossing(airlock_store::StoreError),
    #[error("gone: the budget threshold's record was deleted")]
    CrossingDeleted,
    #[error("store: {}", .0.chain())]
    ReadApproval(airlock_store::StoreError),
    #[error("gone: the approval was deleted")]
    ApprovalDeleted,
    #[error("store: {}", .0.chain())]
    ReadRun(airlock_store::StoreError),
    #[error("store: {}", .0.chain())]
    KeepBody(airlock_store::StoreError),
    #[error("gone: the webhook was deleted")]
    WebhookDeleted,
    #[error("store: {}", .0.chain())]
    ReadWebhook(airlock_store::StoreError),
    #[error("gone: the webhook's secret cannot be decrypted: {0}")]
    Secret(airlock_vault::VaultError),
    #[error("{0}")]
    Header(http::header::InvalidHeaderValue),
    #[error("gone: {}", .0.tenant_message())]
    Url(airlock_egress::EgressError),
    #[error("{}", .0.tenant_message())]
    Send(airlock_egress::EgressError),
}

impl AttemptError {
    /// No later attempt can succeed: the delivery is not retried.
    pub fn is_gone(&self) -> bool {
        matches!(
            self,
            AttemptError::RunDeleted
                | AttemptError::CrossingDeleted
                | AttemptError::ApprovalDeleted
                | AttemptError::WebhookDeleted
                | AttemptError::Secret(_)
                | AttemptError::Url(_)
        )
    }
}

/// What delivery `d`'s event is about besides its run: a
/// `budget.threshold`'s crossing; an approval event's approval, which
/// `approval.pending` shows as it was when held (pending, unanswered),
/// however it stands when first sent.
async fn about(app: &AppState, d: &DeliveryRow) -> Result<About, AttemptError> {
    let mut about = About::default();
    if d.event == airlock_store::THRESHOLD_EVENT {
        let c = app
            .store()
            .delivery_crossing(&d.org_id, &d.id)
            .await
            .map_err(AttemptError::ReadCrossing)?
            .ok_or(AttemptError::CrossingDeleted)?;
        about.crossing = Some(c);
    } else if d.event == airlock_store::APPROVAL_PENDING_EVENT
        || d.event == airlock_store::APPROVAL_SETTLED_EVENT
    {
        let row = app
            .store()
            .delivery_approval(&d.org_id, &d.id)
            .await
            .map_err(AttemptError::ReadApproval)?
            .ok_or(AttemptError::ApprovalDeleted)?;
        let mut a = airlock_api::v1::Approval::from(&row);
        if d.event == airlock_store::APPROVAL_PENDING_EVENT {
            a.state = airlock_api::v1::ApprovalState::Pending;
            a.answered_by = None;
            a.settled_at = None;
        }
        about.approval = Some(a);
    }
    Ok(about)
}

/// The body a delivery sends: a run end's is rendered from the ended run
/// the first time (and kept); a `budget.threshold`'s from its crossing and
/// the run whose call reached it; an approval event's from its approval
/// and its run.
async fn body_of(app: &AppState, d: &DeliveryRow) -> Result<String, AttemptError> {
    if !d.payload.is_empty() {
        return Ok(d.payload.clone());
    }
    let about = about(app, d).await?;
    let run = app
        .store()
        .get_run_in(&d.org_id, &d.run_id)
        .await
        .map_err(AttemptError::ReadRun)?
        .ok_or(AttemptError::RunDeleted)?;
    let body = payload(&d.id, &d.event, d.created_at, &run, &about);
    app.store()
        .render_delivery(&d.id, &body)
        .await
        .map_err(AttemptError::KeepBody)
}

/// One attempt of one delivery, and its record.
async fn deliver(app: &AppState, mut d: DeliveryRow) {
    let outcome = match body_of(app, &d).await {
        Ok(body) => {
            d.payload = body;
            attempt(app, &d).await
        }
        Err(e) => Err(e),
    };
    let d = &d;
    let attempts = d.attempts + 1;
    let (status, error, delivered) = match &outcome {
        Ok(s) if (200..300).contains(s) => (Some(i64::from(*s)), None, true),
        Ok(s) => (
            Some(i64::from(*s)),
            Some(format!("the receiver answered HTTP {s}")),
            false,
        ),
        Err(e) => (None, Some(e.to_string()), false),
    };
    let give_up = outcome.as_ref().is_err_and(AttemptError::is_gone);
    let retry_at = (!delivered && !give_up && attempts < i64::from(app.cfg().webhook_max_attempts))
        .then(|| {
            let base = i64::try_from(app.cfg().webhook_retry_base.as_millis()).unwrap_or(i64::MAX);
            let backoff = base
                .saturating_mul(1i64 << (attempts - 1).clamp(0, 30))
                .min(3_600_000);
            airlock_store::now_ms() + backoff
        });
    if let Err(e) = app
        .store()
        .record_delivery_attempt(
            &d.id,
            &DeliveryAttempt {
                status,
                error: error.as_deref(),
                delivered,
                retry_at,
            },
        )
        .await
    {
        tracing::warn!(delivery = %d.id, "recording a delivery attempt: {}", e.chain());
    }
}

async fn attempt(app: &AppState, d: &DeliveryRow) -> Result<u16, AttemptError> {
    let hook = match app.store().get_webhook(&d.org_id, &d.webhook_id).await {
        Ok(Some(h)) => h,
        Ok(None) => return Err(AttemptError::WebhookDeleted),
        Err(e) => return Err(AttemptError::ReadWebhook(e)),
    };
    let secret = app
        .keyring()
        .decrypt_string(&hook.secret_envelope)
        .map_err(AttemptError::Secret)?;
    let t = airlock_store::now_ms() / 1000;
    let body = d.payload.as_bytes();
    let sig = signature(secret.expose_secret().as_bytes(), t, body);
    let mut req = OutboundRequest::get(hook.url.clone());
    req.method = http::Method::POST;
    req.body = bytes::Bytes::copy_from_slice(body);
    let h = &mut req.headers;
    let val = |s: &str| http::HeaderValue::from_str(s).map_err(AttemptError::Header);
    h.insert(http::header::CONTENT_TYPE, val("application/json")?);
    h.insert(airlock_api::webhook::SIGNATURE_HEADER, val(&sig)?);
    h.insert("airlock-event", val(&d.event)?);
    h.insert("airlock-delivery", val(&d.id)?);
    h.insert(
        http::header::USER_AGENT,
        val(concat!("airlock-webhooks/", env!("CARGO_PKG_VERSION")))?,
    );
    let authorized = authorized_for(&hook.url).map_err(AttemptError::Url)?;
    match app.webhook_client().send(req, &rules(&authorized)).await {
        Ok(r) => Ok(r.status.as_u16()),
        Err(e) => {
            tracing::info!(delivery = %d.id, "webhook delivery failed: {e}");
            Err(AttemptError::Send(e))
        }
    }
}
