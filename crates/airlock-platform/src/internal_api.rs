//! The internal API server (protocol: `airlock_platform_api::wire`).
//!
//! Authentication is the run token alone: the platform verifies its HMAC,
//! takes the run id from it, and then answers only about that run. A token of
//! a run the platform does not host is 404, a run that is not `running` is
//! 403, and an integration the run was not granted is 403, so a sidecar
//! cannot fetch another run's credentials even with a valid token of its own.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};

use airlock_platform_api::budget;
use airlock_platform_api::launch::IDENTITY_CREDENTIAL_FIELD;
use airlock_platform_api::read_interest::ReadInterestListener;
use airlock_platform_api::wire::{
    Accepted, ArtifactAnswer, CredentialResponse, ErrorBody, EventBatch, HistoryEntry,
    HistoryResponse, MemoriesResponse, MemoryEntry, RunEvent, StoredResultRef,
};
use airlock_platform_api::wire::{ENDED_PATH, EgressRecord};
use airlock_store::{
    BatchWrite, ConnectionRecord, NewEgress, NewEvent, RunQuery, RunStatus, Store, Usage,
};
use airlock_vault::{ExposeSecret, Keyring, RunTokens};

use crate::identity::{IdentityError, Issuer, Minter};
use crate::provider_keys::Payer;
use axum::Router;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use serde::Deserialize;
use std::convert::Infallible;
use tokio::net::UnixListener;

/// What one run may ask for.
#[derive(Debug, Clone, Default)]
pub struct Grant {
    /// The organization the run belongs to: its connections, history and
    /// memories are the only ones the run can reach.
    pub org: String,
    /// The agent the run belongs to (history and memories are the agent's).
    pub agent: String,
    /// integration namespace (or `@model`) → stored connection name.
    pub connections: HashMap<String, String>,
    /// The integrations whose delivery names the run's identity token.
    pub identity: crate::identity::IdentityGrant,
    /// The run's model provider and the operator's key for it, when the
    /// manifest has a `[model]` section: without a `@model` connection the
    /// credential fetch for `@model` answers with the organization's key,
    /// else this one ([`crate::provider_keys`]).
    pub model: Option<ModelGrant>,
}

/// What a run's model key may come from beside the manifest's connection.
#[derive(Debug, Clone)]
pub struct ModelGrant {
    pub provider: airlock_platform_api::types::Provider,
    /// `SYSTEM_PROVIDER_KEYS`' key for the provider (redacted in `Debug`).
    pub system_key: Option<airlock_vault::SecretString>,
}

struct Inner {
    store: Store,
    keyring: Arc<Keyring>,
    tokens: RunTokens,
    /// Shared, not copied, on the request path.
    grants: RwLock<HashMap<String, Arc<Grant>>>,
    /// Events are written one write at a time: concurrent writers to SQLite
    /// would otherwise meet its busy handler, which sleeps (1 ms and up)
    /// where this lock hands over at once. A sidecar waits for the write of
    /// an egress record before its request leaves (a sidecar without a
    /// journal).
    writes: tokio::sync::Mutex<()>,
    /// Connection rows (still encrypted) the request path has read, so a
    /// credential fetch is a map lookup and a decrypt, not a store query.
    connections: ConnectionCache,
    /// Model budget reservations charged and not yet settled.
    reservations: crate::budget::Reservations,
    /// What a run's artifacts may take in the store.
    artifacts: airlock_store::ArtifactCaps,
    /// The workload identity issuer (`airlock serve`; none for `airlock run`).
    issuer: Option<Arc<Issuer>>,
    /// The identity tokens minted for the running runs.
    minter: Minter,
    /// Per run, the payer last recorded ([`record_payer`]).
    payers: std::sync::Mutex<HashMap<String, String>>,
    /// The held requests this replica's sidecars wait on.
    approvals: crate::approvals::Approvals,
    /// Per running run, told when its sidecar says the agent's end is kept
    /// ([`ENDED_PATH`]): the run's watch waits on it.
    end_reports: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Notify>>>,
}

/// Stored connections as read from the store, envelopes still encrypted.
/// Used only while [`InternalApi::serve`] runs its watcher, which clears it
/// whenever the store's connections change (any process: a connection
/// added, removed, replaced or re-encrypted), within [`WATCH_EVERY`]; a
/// change made through this process's store clears it before the next
/// fetch reads it ([`ConnectionCache::follow_writes`]).
#[derive(Default)]
struct ConnectionCache {
    /// organization → connection name → row (shared, not copied, on the
    /// request path).
    rows: RwLock<HashMap<String, HashMap<String, Arc<ConnectionRecord>>>>,
    /// Bumped by every clear: a row read before a clear is not kept after it.
    generation: std::sync::atomic::AtomicU64,
    watching: std::sync::atomic::AtomicBool,
    /// The store's [`Store::connection_writes`] when last followed.
    writes_seen: std::sync::atomic::AtomicU64,
    /// Off: every fetch reads the store (to measure what the cache saves).
    disabled: std::sync::atomic::AtomicBool,
}

/// How often the connection cache's watcher asks the store whether the
/// connections changed.
pub const WATCH_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

impl ConnectionCache {
    fn usable(&self) -> bool {
        self.watching.load(Ordering::Acquire) && !self.disabled.load(Ordering::Acquire)
    }

    /// Clears the cache if this process wrote connections since the last
    /// call (`writes` is [`Store::connection_writes`], read now): the write
    /// is done, so what the next read finds is what it left.
    fn follow_writes(&self, writes: u64) {
        // Read first: the fetch path writes the shared word only when it moved.
        if self.writes_seen.load(Ordering::Acquire) != writes
            && self.writes_seen.swap(writes, Ordering::AcqRel) != writes
        {
            self.clear();
        }
    }

    fn get(&self, org: &str, name: &str) -> Option<Arc<ConnectionRecord>> {
        if !self.usable() {
            return None;
        }
        self.rows.read().ok()?.get(org)?.get(name).cloned()
    }

    fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Keeps `rec`, read when the cache was at `generation`.
    fn put(&self, generation: u64, rec: &Arc<ConnectionRecord>) {
        if !self.usable() {
            return;
        }
        if let Ok(mut rows) = self.rows.write()
            && self.generation() == generation
        {
            rows.entry(rec.info.org_id.clone())
                .or_default()
                .insert(rec.info.name.clone(), rec.clone());
        }
    }

    fn forget(&self, org: &str, name: &str) {
        if let Ok(mut rows) = self.rows.write() {
            self.generation.fetch_add(1, Ordering::AcqRel);
            if let Some(of_org) = rows.get_mut(org) {
                of_org.remove(name);
            }
        }
    }

    fn clear(&self) {
        if let Ok(mut rows) = self.rows.write() {
            self.generation.fetch_add(1, Ordering::AcqRel);
            rows.clear();
        }
    }
}

/// The server's state. Cheap to clone.
#[derive(Clone)]
pub struct InternalApi {
    inner: Arc<Inner>,
}

/// Largest body accepted on the internal API (stored results included).
pub const MAX_BODY: usize = 64 * 1024 * 1024;

#[derive(Clone)]
struct RunId(String);

/// The grant the request was authenticated under (looked up once).
#[derive(Clone)]
struct RunGrant(Arc<Grant>);

fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    (
        status,
        axum::Json(ErrorBody {
            error: code.to_owned(),
            message: message.into(),
        }),
    )
        .into_response()
}

fn internal(e: impl std::fmt::Display) -> Response {
    tracing::error!("internal API: {e}");
    error(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        "the platform failed; see its log",
    )
}

impl InternalApi {
    /// The keys connections are decrypted with (their ids, for checks before a run).
    pub fn keyring(&self) -> &Keyring {
        &self.inner.keyring
    }

    pub fn new(
        store: Store,
        keyring: Arc<Keyring>,
        tokens: RunTokens,
        artifacts: airlock_store::ArtifactCaps,
        issuer: Option<Arc<Issuer>>,
    ) -> Self {
        InternalApi {
            inner: Arc::new(Inner {
                store,
                keyring,
                tokens,
                grants: RwLock::default(),
                writes: tokio::sync::Mutex::new(()),
                connections: ConnectionCache::default(),
                reservations: crate::budget::Reservations::default(),
                artifacts,
                issuer,
                minter: Minter::default(),
                payers: std::sync::Mutex::default(),
                approvals: crate::approvals::Approvals::default(),
                end_reports: std::sync::Mutex::default(),
            }),
        }
    }

    /// Turns the in-memory cache of connection rows off (every credential
    /// fetch then reads the store, as before it existed) or back on.
    pub fn set_connection_cache(&self, on: bool) {
        self.inner
            .connections
            .disabled
            .store(!on, Ordering::Release);
        self.inner.connections.clear();
    }

    /// Lets `run_id` use the API with `grant` (called when a run starts).
    pub fn grant(&self, run_id: &str, grant: Grant) {
        let now = crate::identity::now_secs();
        self.inner.minter.granted(run_id, &grant.identity, now);
        if let Ok(mut g) = self.inner.grants.write() {
            g.insert(run_id.to_owned(), Arc::new(grant));
        }
    }

    /// Withdraws a run's grant (called when the run ends).
    pub fn revoke(&self, run_id: &str) {
        if let Ok(mut g) = self.inner.grants.write() {
            g.remove(run_id);
        }
        self.inner.reservations.forget_run(run_id);
        if let Ok(mut p) = self.inner.payers.lock() {
            p.remove(run_id);
        }
        self.inner.minter.revoked(run_id);
        self.inner.approvals.run_ended(run_id);
        if let Ok(mut r) = self.inner.end_reports.lock() {
            r.remove(run_id);
        }
    }

    /// Told (one permit, kept until taken) when `run_id`'s sidecar says the
    /// agent's end is kept in the run's journal ([`ENDED_PATH`]); the same
    /// one for the run until it is revoked. Only the run's own sidecar can
    /// tell it: the request is authenticated by the run's token, which the
    /// sandbox never holds. It says nothing of what the end is (that is read
    /// from the journal), so a word sent early costs the run its remaining
    /// time, never a record: the run is torn down as at any other end.
    pub fn end_reports(&self, run_id: &str) -> Arc<tokio::sync::Notify> {
        match self.inner.end_reports.lock() {
            Ok(mut r) => r.entry(run_id.to_owned()).or_default().clone(),
            // Poisoned (a panic elsewhere): a notify nobody tells; the run
            // ends at its sandbox's exit.
            Err(_) => Arc::default(),
        }
    }

    /// The held requests of this replica's runs ([`crate::approvals`]).
    pub fn approvals(&self) -> &crate::approvals::Approvals {
        &self.inner.approvals
    }

    /// The workload identity issuer, if this platform has one.
    pub fn issuer(&self) -> Option<&Arc<Issuer>> {
        self.inner.issuer.as_ref()
    }

    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    pub fn router(&self) -> Router {
        Router::new()
            .route(&format!("{CREDENTIALS}{{integration}}"), get(credential))
            .route("/internal/v1/history", get(history))
            .route("/internal/v1/memories", get(memories))
            .route("/internal/v1/events", post(events))
            .route(ENDED_PATH, post(ended))
            .route("/internal/v1/results", post(put_result))
            .route("/internal/v1/results/{id}", get(get_result))
            .route(budget::RESERVE_PATH, post(reserve_budget))
            .route(budget::SETTLE_PATH, post(settle_budget))
            .route(airlock_platform_api::approval::ASK_PATH, post(ask_approval))
            .route("/internal/v1/artifacts", post(put_artifact))
            .route(airlock_platform_api::policy::POLICY_PATH, get(policy))
            .layer(middleware::from_fn_with_state(self.clone(), authenticate))
            .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
            .with_state(self.clone())
    }

    /// The API as the socket serves it: [`Endpoint`] in front of [`InternalApi::router`].
    pub fn endpoint(&self) -> Endpoint {
        Endpoint {
            api: self.clone(),
            router: self.router(),
        }
    }

    /// Serves the API on a unix socket until the task is dropped, with the
    /// watcher that keeps the connection cache in step with the store.
    pub async fn serve(self, listener: UnixListener) -> std::io::Result<()> {
        let watcher = self.clone();
        let policies = self.clone();
        let watch = async move {
            tokio::join!(watcher.watch_connections(), policies.watch_policies());
            std::future::pending::<()>().await;
        };
        tokio::select! {
            // Connections watched for readability only: a sidecar reading
            // an answer does not wake the platform (`read_interest`).
            served = axum::serve(ReadInterestListener(listener), axum::ServiceExt::<Request>::into_make_service(self.endpoint())) => served,
            () = watch => Ok(()),
        }
    }

    /// Clears the connection cache whenever the store's connections change
    /// (asked every [`WATCH_EVERY`]); the cache is used only while this runs.
    async fn watch_connections(&self) {
        let cache = &self.inner.connections;
        let mut last = None;
        loop {
            match self.inner.store.connections_version().await {
                Ok(version) => {
                    if last != Some(version) {
                        cache.clear();
                        last = Some(version);
                    }
                    cache.watching.store(true, Ordering::Release);
                }
                Err(e) => {
                    // Unsure what the store holds: read it on every fetch.
                    cache.watching.store(false, Ordering::Release);
                    cache.clear();
                    last = None;
                    tracing::warn!("internal API: cannot check the stored connections: {e}");
                }
            }
            tokio::time::sleep(WATCH_EVERY).await;
        }
    }

    /// Wakes this process's policy long-polls when another process changed
    /// a run's policy (asked every [`WATCH_EVERY`]); a change made through
    /// this process's store wakes them at once. (A sidecar's report taken
    /// by another replica is read by `?wait=true`'s own bounded poll.)
    async fn watch_policies(&self) {
        let store = &self.inner.store;
        let mut last = None;
        loop {
            match store.policy_mark().await {
                Ok(mark) => {
                    if last.is_some_and(|l| l != mark) {
                        store.policy_written();
                    }
                    last = Some(mark);
                }
                Err(e) => tracing::warn!("internal API: cannot check the runs' policies: {e}"),
            }
            tokio::time::sleep(WATCH_EVERY).await;
        }
    }

    /// Serves until the task is dropped, logging a failure instead of returning it.
    pub async fn serve_forever(self, listener: UnixListener) {
        if let Err(e) = self.serve(listener).await {
            tracing::error!("internal API stopped: {e}");
        }
    }

    /// The grant of a run, if it has one.
    pub fn grant_of_run(&self, run_id: &str) -> Option<Grant> {
        self.grant_of(run_id).map(|g| (*g).clone())
    }

    fn grant_of(&self, run_id: &str) -> Option<Arc<Grant>> {
        self.inner.grants.read().ok()?.get(run_id).cloned()
    }
}

/// The internal API as one plain service. The credential fetch, which
/// every credentialed call of every run waits for, is answered here, with
/// the same check and the same answer as the router's route but without
/// its matching, middleware and extractors; everything else (a `HEAD`, a
/// path the route would not match or decode) goes to the router.
#[derive(Clone)]
pub struct Endpoint {
    api: InternalApi,
    router: Router,
}

const CREDENTIALS: &str = "/internal/v1/credentials/";

impl tower_service::Service<Request> for Endpoint {
    type Response = Response;
    type Error = Infallible;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request) -> Self::Future {
        let Some(integration) = credential_fetch(&req) else {
            return Box::pin(self.router.call(req));
        };
        let api = self.api.clone();
        Box::pin(async move {
            Ok(match authorize(&api, req.headers()).await {
                Ok((run_id, grant)) => credential_for(&api, &run_id, &grant, integration).await,
                Err(refused) => refused,
            })
        })
    }
}

/// The integration a `GET /internal/v1/credentials/{integration}` names,
/// percent-decoded as the router's `Path` decodes it.
fn credential_fetch(req: &Request) -> Option<String> {
    if req.method() != Method::GET {
        return None;
    }
    let name = req.uri().path().strip_prefix(CREDENTIALS)?;
    if name.is_empty() || name.contains('/') {
        return None;
    }
    percent_encoding::percent_decode_str(name)
        .decode_utf8()
        .ok()
        .map(std::borrow::Cow::into_owned)
}

/// Who is asking: the run its token names, and that run's grant. The one
/// check of every internal API request (the credential fetch's own path and
/// the router's middleware).
async fn authorize(
    api: &InternalApi,
    headers: &HeaderMap,
) -> Result<(String, Arc<Grant>), Response> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let Some(run_id) = token.and_then(|t| api.inner.tokens.verify(t)) else {
        return Err(error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or invalid run token",
        ));
    };
    // The grant is the authority on whether the run may still fetch: the
    // orchestrator grants it before the sidecar starts and revokes it before
    // the run's end is recorded, so a granted run is running and the request
    // path needs no store query. Without a grant the store only picks the
    // answer (an ended run gets 403, a stranger 404).
    match api.grant_of(&run_id) {
        Some(grant) => Ok((run_id, grant)),
        None => Err(match api.inner.store.get_run(&run_id).await {
            Ok(Some(run)) if run.status != RunStatus::Running => error(
                StatusCode::FORBIDDEN,
                "run_not_running",
                format!("the run is {}", run.status),
            ),
            Ok(_) => error(
                StatusCode::NOT_FOUND,
                "unknown_run",
                "this platform hosts no such run",
            ),
            Err(e) => internal(e),
        }),
    }
}

async fn authenticate(State(api): State<InternalApi>, mut req: Request, next: Next) -> Response {
    let (run_id, grant) = match authorize(&api, req.headers()).await {
        Ok(who) => who,
        Err(refused) => return refused,
    };
    req.extensions_mut().insert(RunId(run_id));
    req.extensions_mut().insert(RunGrant(grant));
    next.run(req).await
}

fn run_of(req_ext: &axum::http::Extensions) -> Option<String> {
    req_ext.get::<RunId>().map(|r| r.0.clone())
}

async fn credential(
    State(api): State<InternalApi>,
    Path(integration): Path<String>,
    req: Request,
) -> Response {
    let (Some(run_id), Some(RunGrant(grant))) =
        (run_of(req.extensions()), req.extensions().get::<RunGrant>())
    else {
        return internal("no run id");
    };
    credential_for(&api, &run_id, grant, integration).await
}

/// The credential of `integration` for `run_id`, decrypted for this answer.
/// `@model` is answered from the first of the manifest's connection, the
/// organization's key for the provider and the operator's
/// ([`crate::provider_keys`]); the source is recorded ([`record_payer`]).
async fn credential_for(
    api: &InternalApi,
    run_id: &str,
    grant: &Grant,
    integration: String,
) -> Response {
    let identity = match identity_field(api, run_id, grant, &integration) {
        Ok(field) => field,
        Err(e) => return identity_refused(e),
    };
    let is_model = integration == airlock_platform_api::wire::MODEL_CREDENTIAL;
    let (connection, auth_type, mut fields, payer) = match grant.connections.get(&integration) {
        Some(connection) => match stored_fields(api, &grant.org, connection).await {
            Ok(Some((auth_type, fields))) => (
                connection.clone(),
                auth_type,
                fields,
                is_model.then(|| Payer::Manifest(connection.clone())),
            ),
            Ok(None) => {
                return error(
                    StatusCode::NOT_FOUND,
                    "unknown_connection",
                    format!("connection {connection:?} does not exist"),
                );
            }
            Err(answer) => return answer,
        },
        None => match grant.model.as_ref().filter(|_| is_model) {
            Some(model) => match model_key(api, grant, model).await {
                Ok(Some(found)) => found,
                Ok(None) => {
                    return error(
                        StatusCode::FORBIDDEN,
                        "integration_not_granted",
                        format!(
                            "no key for the provider {}: no model.connection, no organization connection {:?}, no SYSTEM_PROVIDER_KEYS entry",
                            model.provider.as_str(),
                            crate::provider_keys::org_connection(model.provider)
                        ),
                    );
                }
                Err(answer) => return answer,
            },
            // An integration whose credential is the run's identity alone
            // (a set of fields: `custom`).
            None if identity.is_some() => (
                String::new(),
                airlock_platform_api::connection_types::AuthType::Custom,
                airlock_platform_api::wire::CredentialFields::default(),
                None,
            ),
            None => {
                return error(
                    StatusCode::FORBIDDEN,
                    "integration_not_granted",
                    format!("the run has no connection for {integration:?}"),
                );
            }
        },
    };
    // The identity wins over a stored field of the same name.
    fields.extend(identity);
    if let Some(payer) = payer {
        record_payer(api, run_id, &payer).await;
    }
    tracing::debug!(
        run_id,
        integration,
        connection,
        "credential handed to the sidecar"
    );
    axum::Json(CredentialResponse {
        integration,
        connection,
        auth_type,
        fields,
    })
    .into_response()
}

/// The identity token field of `integration`'s credential, when its
/// delivery names the run's identity.
fn identity_field(
    api: &InternalApi,
    run_id: &str,
    grant: &Grant,
    integration: &str,
) -> Result<Option<(String, secrecy::SecretString)>, IdentityError> {
    if !grant.identity.audiences.contains_key(integration) {
        return Ok(None);
    }
    let who = crate::identity::Subject {
        run_id,
        org: &grant.org,
        agent: &grant.agent,
        namespace: integration,
    };
    let now = crate::identity::now_secs();
    let issuer = api.inner.issuer.as_deref();
    let token = api.inner.minter.token(issuer, &grant.identity, &who, now)?;
    Ok(Some((
        IDENTITY_CREDENTIAL_FIELD.to_owned(),
        secrecy::SecretString::from(token),
    )))
}

/// The answer when no identity token can be handed.
fn identity_refused(e: IdentityError) -> Response {
    match e {
        IdentityError::Sign(_) => internal(e),
        IdentityError::NoIssuer | IdentityError::PastTimeout | IdentityError::NotGranted => {
            error(StatusCode::FORBIDDEN, "identity_unavailable", e.to_string())
        }
    }
}

/// One credential answer: the connection it names, its type and fields,
/// and who pays when it is the model's.
type Answer = (
    String,
    airlock_platform_api::connection_types::AuthType,
    airlock_platform_api::wire::CredentialFields,
    Option<Payer>,
);

/// The model key of a run whose manifest names no model connection: the
/// organization's connection for the provider, else the operator's key
/// (an `api_key` credential of one field, `key`), else none.
async fn model_key(
    api: &InternalApi,
    grant: &Grant,
    model: &ModelGrant,
) -> Result<Option<Answer>, Response> {
    let org_connection = crate::provider_keys::org_connection(model.provider);
    if let Some((auth_type, fields)) = stored_fields(api, &grant.org, &org_connection).await? {
        let payer = Payer::Organization(org_connection.clone());
        return Ok(Some((org_connection, auth_type, fields, Some(payer))));
    }
    Ok(model.system_key.as_ref().map(|key| {
        let payer = Payer::System(model.provider);
        let fields = [("key".to_owned(), key.clone())].into_iter().collect();
        (
            payer.label(),
            airlock_platform_api::connection_types::AuthType::ApiKey,
            fields,
            Some(payer),
        )
    }))
}

/// Records, as a `model_key` event of the run, which key the platform
/// hands its relay, each time that changes (the first fetch, a key the
/// organization added or removed): the run's cost records name their payer
/// from it. Never the key. A failed write is logged; the call goes on.
async fn record_payer(api: &InternalApi, run_id: &str, payer: &Payer) {
    let label = payer.label();
    {
        let Ok(mut payers) = api.inner.payers.lock() else {
            return;
        };
        if payers.get(run_id) == Some(&label) {
            return;
        }
        payers.insert(run_id.to_owned(), label.clone());
    }
    let at = airlock_store::now_ms();
    let payload = serde_json::json!({ "paid_by": label, "at": at }).to_string();
    let _writing = api.inner.writes.lock().await;
    if let Err(e) = api
        .inner
        .store
        .append_event(&NewEvent {
            run_id,
            at,
            kind: crate::provider_keys::PAYER_EVENT,
            payload: &payload,
        })
        .await
    {
        tracing::warn!(run_id, "cannot record which model key pays: {e}");
    }
}

/// The decrypted fields of `org`'s stored `connection` (`None`: not
/// stored), read through the connection cache.
async fn stored_fields(
    api: &InternalApi,
    org: &str,
    connection: &str,
) -> Result<
    Option<(
        airlock_platform_api::connection_types::AuthType,
        airlock_platform_api::wire::CredentialFields,
    )>,
    Response,
> {
    let cache = &api.inner.connections;
    // The stored row, if there is one.
    let read_row = || async {
        match api.inner.store.get_connection(org, connection).await {
            Ok(r) => Ok(r.map(Arc::new)),
            Err(e) => Err(internal(e)),
        }
    };
    cache.follow_writes(api.inner.store.connection_writes());
    let cached = cache.get(org, connection);
    let from_cache = cached.is_some();
    let record = match cached {
        Some(r) => r,
        None => {
            let generation = cache.generation();
            match read_row().await? {
                Some(r) => {
                    cache.put(generation, &r);
                    r
                }
                None => return Ok(None),
            }
        }
    };
    let undecryptable = |e: &dyn std::fmt::Display| {
        internal(format!(
            "connection {connection:?} cannot be decrypted: {e}"
        ))
    };
    let (record, plain) = match api.inner.keyring.decrypt_string(&record.envelope) {
        Ok(p) => (record, p),
        Err(_) if from_cache => {
            // Re-encrypted meanwhile under a key this platform has, and the
            // watcher has not noticed yet: read the row again.
            cache.forget(org, connection);
            let Some(fresh) = read_row().await? else {
                return Ok(None);
            };
            match api.inner.keyring.decrypt_string(&fresh.envelope) {
                Ok(p) => (fresh, p),
                Err(e) => return Err(undecryptable(&e)),
            }
        }
        Err(e) => return Err(undecryptable(&e)),
    };
    match serde_json::from_str(plain.expose_secret()) {
        Ok(fields) => Ok(Some((record.info.auth_type, fields))),
        Err(_) => Err(internal(format!(
            "connection {connection:?} does not hold a JSON object of string fields"
        ))),
    }
}

#[derive(Deserialize)]
struct HistoryQuery {
    limit: Option<u32>,
    fields: Option<String>,
}

async fn history(
    State(api): State<InternalApi>,
    Query(q): Query<HistoryQuery>,
    req: Request,
) -> Response {
    let Some(run_id) = run_of(req.extensions()) else {
        return internal("no run id");
    };
    let limit = q.limit.unwrap_or(10);
    if !(1..=50).contains(&limit) {
        return error(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "limit must be 1..50",
        );
    }
    let fields: Vec<&str> = q
        .fields
        .as_deref()
        .unwrap_or("")
        .split(',')
        .filter(|f| !f.is_empty())
        .collect();
    if let Some(bad) = fields
        .iter()
        .find(|f| !matches!(**f, "checkpoint" | "result"))
    {
        return error(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("unknown field {bad:?} (checkpoint, result)"),
        );
    }
    let grant = api.grant_of(&run_id).unwrap_or_default();
    let Grant { org, agent, .. } = &*grant;
    let runs = match api
        .inner
        .store
        .list_runs(&RunQuery {
            org: Some(org),
            agent: Some(agent),
            limit: Some(limit + 1),
            ..Default::default()
        })
        .await
    {
        Ok(r) => r,
        Err(e) => return internal(e),
    };
    let mut out = Vec::new();
    for run in runs
        .into_iter()
        .filter(|r| r.id != run_id)
        .take(limit as usize)
    {
        let mut entry = HistoryEntry {
            run_id: run.id.clone(),
            status: run.status.to_string(),
            started_at: run.started_at,
            ended_at: run.ended_at,
            checkpoint: None,
            result: None,
        };
        if !fields.is_empty()
            && let Some(RunEvent::Result {
                result, checkpoint, ..
            }) = last_result(&api.inner.store, &run.id).await
        {
            if fields.contains(&"result") {
                entry.result = result;
            }
            if fields.contains(&"checkpoint") {
                entry.checkpoint = checkpoint;
            }
        }
        out.push(entry);
    }
    axum::Json(HistoryResponse { runs: out }).into_response()
}

async fn last_result(store: &Store, run_id: &str) -> Option<RunEvent> {
    let e = store.last_event_of_kind(run_id, "result").await.ok()??;
    serde_json::from_str::<RunEvent>(&e.payload).ok()
}

#[derive(Deserialize)]
struct MemoriesQuery {
    q: Option<String>,
    limit: Option<u32>,
}

async fn memories(
    State(api): State<InternalApi>,
    Query(q): Query<MemoriesQuery>,
    req: Request,
) -> Response {
    let Some(run_id) = run_of(req.extensions()) else {
        return internal("no run id");
    };
    let limit = q.limit.unwrap_or(10).clamp(1, 100);
    let grant = api.grant_of(&run_id).unwrap_or_default();
    let Grant { org, agent, .. } = &*grant;
    let all = match api.inner.store.list_memories(org, agent, 1000).await {
        Ok(m) => m,
        Err(e) => return internal(e),
    };
    let needle = q.q.unwrap_or_default().to_lowercase();
    let memories = all
        .into_iter()
        .filter(|m| needle.is_empty() || m.content.to_lowercase().contains(&needle))
        .take(limit as usize)
        .map(|m| MemoryEntry {
            id: m.id,
            content: m.content,
            created_at: m.created_at,
        })
        .collect();
    axum::Json(MemoriesResponse { memories }).into_response()
}

/// Charges a model call's reservation to the run's organization's budgets.
/// A store that cannot be read is a 503: the sidecar refuses the call.
async fn reserve_budget(State(api): State<InternalApi>, req: Request) -> Response {
    let (Some(run_id), Some(RunGrant(grant))) = (
        run_of(req.extensions()),
        req.extensions().get::<RunGrant>().cloned(),
    ) else {
        return internal("no run id");
    };
    let body: budget::ReserveRequest = match read_json(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    match api
        .inner
        .reservations
        .reserve(&api.inner.store, &run_id, &grant.org, &body)
        .await
    {
        Ok(answer) => axum::Json(answer).into_response(),
        Err(e) => budget_unavailable(&e),
    }
}

/// Replaces a reservation with what its call used.
async fn settle_budget(State(api): State<InternalApi>, req: Request) -> Response {
    let Some(run_id) = run_of(req.extensions()) else {
        return internal("no run id");
    };
    let body: budget::SettleRequest = match read_json(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    match api
        .inner
        .reservations
        .settle(&api.inner.store, &run_id, &body)
        .await
    {
        Ok(true) => axum::Json(serde_json::json!({})).into_response(),
        Ok(false) => error(
            StatusCode::NOT_FOUND,
            "not_found",
            "this run holds no such reservation",
        ),
        Err(e) => budget_unavailable(&e),
    }
}

/// Holds a request of the run for a person's answer: creates the pending
/// approval and answers once it is settled (long-poll, at most the hold's
/// time; [`crate::approvals::Approvals::ask`]).
async fn ask_approval(State(api): State<InternalApi>, req: Request) -> Response {
    use crate::approvals::ApprovalError;
    let (Some(run_id), Some(RunGrant(grant))) = (
        run_of(req.extensions()),
        req.extensions().get::<RunGrant>().cloned(),
    ) else {
        return internal("no run id");
    };
    let body: airlock_platform_api::approval::AskRequest = match read_json(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let running = || api.grant_of(&run_id).is_some();
    match api
        .inner
        .approvals
        .ask(&api.inner.store, (&run_id, &grant.org), body, running)
        .await
    {
        Ok(answer) => axum::Json(answer).into_response(),
        Err(e @ ApprovalError::Exhausted { .. }) => error(
            StatusCode::TOO_MANY_REQUESTS,
            airlock_platform_api::approval::EXHAUSTED,
            e.to_string(),
        ),
        Err(e @ ApprovalError::RunEnding) => error(
            StatusCode::CONFLICT,
            airlock_platform_api::approval::RUN_ENDING,
            e.to_string(),
        ),
        Err(e) => internal(e),
    }
}

fn budget_unavailable(e: &airlock_store::StoreError) -> Response {
    tracing::error!("internal API: model budget: {e}");
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "budget_unavailable",
        "the organization's budget cannot be read or written now",
    )
}

/// A small JSON request body (at most 64 KiB), or the 400 that says why not.
async fn read_json<T: serde::de::DeserializeOwned>(req: Request) -> Result<T, Response> {
    let body = axum::body::to_bytes(req.into_body(), 64 * 1024)
        .await
        .map_err(|e| error(StatusCode::BAD_REQUEST, "bad_request", e.to_string()))?;
    serde_json::from_slice(&body)
        .map_err(|e| error(StatusCode::BAD_REQUEST, "bad_request", e.to_string()))
}

/// `POST /internal/v1/ended`: the run's sidecar kept the agent's end
/// ([`InternalApi::end_reports`]).
async fn ended(State(api): State<InternalApi>, req: Request) -> Response {
    let Some(run_id) = run_of(req.extensions()) else {
        return internal("no run id");
    };
    tracing::debug!(target: "airlock::phase", "event: end kept");
    let told = match api.inner.end_reports.lock() {
        Ok(r) => r.get(&run_id).cloned(),
        Err(_) => None,
    };
    if let Some(n) = told {
        n.notify_one();
    }
    (StatusCode::ACCEPTED, axum::Json(Accepted { accepted: 1 })).into_response()
}

async fn events(State(api): State<InternalApi>, req: Request) -> Response {
    let Some(run_id) = run_of(req.extensions()) else {
        return internal("no run id");
    };
    let body = match axum::body::to_bytes(req.into_body(), MAX_BODY).await {
        Ok(b) => b,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!("cannot read the body: {e}"),
            );
        }
    };
    let batch: EventBatch = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!("not an event batch: {e}"),
            );
        }
    };
    let store = &api.inner.store;
    let n = batch.events.len();
    // The egress records of a batch go in as one write (they are their own
    // table: their order against the other events does not matter).
    let (egress, others): (Vec<RunEvent>, Vec<RunEvent>) = batch
        .events
        .into_iter()
        .partition(|e| matches!(e, RunEvent::Egress(_)));
    let records: Vec<NewEgress<'_>> = egress
        .iter()
        .filter_map(|e| match e {
            RunEvent::Egress(r) => Some(new_egress(&run_id, r)),
            _ => None,
        })
        .collect();
    // One write at a time, each under the lock (not the whole batch): a
    // sidecar's start record waits for at most one statement of a batch.
    let written = {
        let _writing = api.inner.writes.lock().await;
        match records.as_slice() {
            [] => Ok(()),
            [one] => store.append_egress(one).await.map(|_| ()),
            many => store.append_egress_batch(many, BatchWrite::Whole).await,
        }
    };
    if let Err(e) = written {
        return internal(e);
    }
    for event in others {
        let _writing = api.inner.writes.lock().await;
        if let Err(e) = record(store, &run_id, event).await {
            return internal(e);
        }
    }
    axum::Json(Accepted { accepted: n }).into_response()
}

pub(crate) fn new_egress<'a>(run_id: &'a str, e: &'a EgressRecord) -> NewEgress<'a> {
    NewEgress {
        run_id,
        at: e.at,
        source: e.source,
        integration: e.integration.as_deref(),
        method: &e.method,
        url: &e.url,
        host: &e.host,
        decision: e.decision,
        reason: e.code,
        status: e.status.map(i64::from),
        duration_ms: e.duration_ms.map(|d| i64::try_from(d).unwrap_or(i64::MAX)),
        bytes_out: i64::try_from(e.bytes_out).unwrap_or(i64::MAX),
        bytes_in: i64::try_from(e.bytes_in).unwrap_or(i64::MAX),
        seq: e.seq.and_then(|s| i64::try_from(s).ok()),
        outcome: e.outcome,
        metering: e.metering,
        plane: e.plane(),
        rule: e.rule.as_ref().map(|r| r.rule.as_str()),
    }
}

async fn record(
    store: &Store,
    run_id: &str,
    event: RunEvent,
) -> Result<(), airlock_store::StoreError> {
    // The relay bounds a call's numbers; they are bounded again here (a
    // sidecar of another version), in the event stored as in the run's
    // totals: never a negative or wrapped count or cost.
    let event = match event {
        RunEvent::Cost(c) => {
            if let Some(why) = c.implausible() {
                tracing::warn!(run = %run_id, "a model call is recorded as unmetered: {why}");
            }
            RunEvent::Cost(c.bounded())
        }
        other => other,
    };
    let (kind, at) = match &event {
        RunEvent::Heartbeat { at } => {
            tracing::debug!(target: "airlock::phase", "event: heartbeat");
            store.record_heartbeat(run_id, *at).await?;
            ("heartbeat", *at)
        }
        RunEvent::Log { at, .. } => ("log", *at),
        RunEvent::Result { at, .. } => {
            tracing::debug!(target: "airlock::phase", "event: result");
            ("result", *at)
        }
        RunEvent::Cost(c) => {
            // Bounded above: each number fits an i64.
            let at_most = |n: u64| i64::try_from(n).unwrap_or(0);
            let usage = Usage {
                tokens_in: at_most(c.input_tokens),
                tokens_out: at_most(c.output_tokens),
                cost_microusd: at_most(c.cost_microusd.unwrap_or(0)),
            };
            store.add_run_usage(run_id, &usage).await?;
            ("cost", c.at)
        }
        RunEvent::Egress(e) => {
            store.append_egress(&new_egress(run_id, e)).await?;
            return Ok(());
        }
        RunEvent::Shed { .. } | RunEvent::Refusals { .. } | RunEvent::ToolExcluded { .. } => {
            (event.kind(), event.at())
        }
        // The platform's own: a sidecar's report of one is not kept.
        RunEvent::ApprovalPending { .. } | RunEvent::ApprovalSettled { .. } => {
            tracing::warn!(run_id, "a sidecar reported an approval event; not kept");
            return Ok(());
        }
    };
    let payload = serde_json::to_string(&event).unwrap_or_else(|_| "{}".into());
    store
        .append_event(&NewEvent {
            run_id,
            at,
            kind,
            payload: &payload,
        })
        .await?;
    Ok(())
}

async fn put_result(State(api): State<InternalApi>, headers: HeaderMap, req: Request) -> Response {
    let Some(run_id) = run_of(req.extensions()) else {
        return internal("no run id");
    };
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/octet-stream")
        .to_owned();
    let body: Bytes = match axum::body::to_bytes(req.into_body(), MAX_BODY).await {
        Ok(b) => b,
        Err(_) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                format!("results are limited to {MAX_BODY} bytes"),
            );
        }
    };
    let id = match airlock_vault::random_bytes::<12>() {
        Ok(b) => b.iter().map(|x| format!("{x:02x}")).collect::<String>(),
        Err(e) => return internal(e),
    };
    if let Err(e) = api
        .inner
        .store
        .put_result(&run_id, &id, &content_type, &body)
        .await
    {
        return internal(e);
    }
    axum::Json(StoredResultRef {
        uri: format!("airlock://result/{run_id}/{id}"),
        id,
        bytes: body.len() as u64,
    })
    .into_response()
}

/// One artifact of the run: checked by the one path rule (a path it
/// refuses is a 400, nothing recorded), bounded by
/// [`MAX_ARTIFACT_FILE_BYTES`], then recorded by the store within the
/// run's and the organization's caps.
async fn put_artifact(
    State(api): State<InternalApi>,
    headers: HeaderMap,
    req: Request,
) -> Response {
    use airlock_platform_api::files::{
        ARTIFACT_PATH_HEADER, ARTIFACT_REFUSED_HEADER, ArtifactRefusal, MAX_ARTIFACT_FILE_BYTES,
        check_relative_path,
    };
    use airlock_store::ArtifactBody;
    let Some(run_id) = run_of(req.extensions()) else {
        return internal("no run id");
    };
    let bad = |m: String| error(StatusCode::BAD_REQUEST, "bad_request", m);
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let Some(path) = header(ARTIFACT_PATH_HEADER)
        .and_then(|p| percent_encoding::percent_decode_str(p).decode_utf8().ok())
    else {
        return bad(format!("{ARTIFACT_PATH_HEADER}: missing or not UTF-8"));
    };
    if let Err(e) = check_relative_path(&path) {
        return bad(format!("artifact path {path:?}: {e}"));
    }
    let refused = match header(ARTIFACT_REFUSED_HEADER).map(|v| v.split_once(' ')) {
        None => None,
        Some(Some((why, n))) => match (why.parse::<ArtifactRefusal>(), n.parse::<u64>()) {
            (Ok(why), Ok(bytes)) => Some((why, bytes)),
            _ => {
                return bad(format!(
                    "{ARTIFACT_REFUSED_HEADER}: not a reason and a size"
                ));
            }
        },
        Some(None) => {
            return bad(format!(
                "{ARTIFACT_REFUSED_HEADER}: not a reason and a size"
            ));
        }
    };
    let limit = usize::try_from(MAX_ARTIFACT_FILE_BYTES).unwrap_or(usize::MAX);
    let Ok(data) = axum::body::to_bytes(req.into_body(), limit).await else {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("an artifact is limited to {MAX_ARTIFACT_FILE_BYTES} bytes"),
        );
    };
    let body = match refused {
        Some((why, bytes)) => ArtifactBody::Refused { why, bytes },
        None => ArtifactBody::File(&data),
    };
    match api
        .inner
        .store
        .put_artifact(&run_id, &path, body, api.inner.artifacts)
        .await
    {
        Ok(refused) => axum::Json(ArtifactAnswer { refused }).into_response(),
        Err(e @ airlock_store::StoreError::QuotaExceeded { .. }) => {
            error(StatusCode::FORBIDDEN, "quota_exceeded", e.to_string())
        }
        Err(e @ airlock_store::StoreError::ArtifactExists { .. }) => {
            error(StatusCode::CONFLICT, "conflict", e.to_string())
        }
        Err(e) => internal(e.chain()),
    }
}

#[derive(Deserialize)]
struct PolicyPoll {
    after: u64,
}

/// The run's live policy once its version is past `after`, the version
/// the sidecar applied (recorded: what `?wait=true` and `GET
/// /v1/runs/{id}/policy` report); else, after
/// [`airlock_platform_api::policy::POLICY_WAIT`], no change.
async fn policy(
    State(api): State<InternalApi>,
    Query(q): Query<PolicyPoll>,
    req: Request,
) -> Response {
    use airlock_platform_api::policy::{POLICY_WAIT, PolicyRules, PolicyUpdate};
    let Some(run_id) = run_of(req.extensions()) else {
        return internal("no run id");
    };
    let store = &api.inner.store;
    let after = i64::try_from(q.after).unwrap_or(i64::MAX);
    if after > 0
        && let Err(e) = store.record_policy_applied(&run_id, after).await
    {
        return internal(e);
    }
    let mut writes = store.policy_watch();
    let deadline = tokio::time::Instant::now() + POLICY_WAIT;
    loop {
        writes.borrow_and_update();
        let version = match store.policy_version(&run_id).await {
            Ok(v) => v,
            Err(e) => return internal(e),
        };
        if version > after {
            let rules = match store.policy_at(&run_id, version).await {
                Ok(Some(row)) => serde_json::from_str::<PolicyRules>(&row.rules),
                Ok(None) => return internal(format!("policy version {version} vanished")),
                Err(e) => return internal(e),
            };
            return match rules {
                Ok(rules) => axum::Json(PolicyUpdate {
                    version: u64::try_from(version).unwrap_or(0),
                    rules: Some(rules),
                })
                .into_response(),
                Err(e) => internal(format!("policy version {version}: {e}")),
            };
        }
        tokio::select! {
            _ = writes.changed() => {}
            () = tokio::time::sleep_until(deadline) => {
                return axum::Json(PolicyUpdate { version: q.after, rules: None }).into_response();
            }
        }
    }
}

async fn get_result(
    State(api): State<InternalApi>,
    Path(id): Path<String>,
    req: Request,
) -> Response {
    let Some(run_id) = run_of(req.extensions()) else {
        return internal("no run id");
    };
    match api.inner.store.get_result(&run_id, &id).await {
        Ok(Some(r)) => ([(header::CONTENT_TYPE, r.content_type)], r.body).into_response(),
        Ok(None) => error(
            StatusCode::NOT_FOUND,
            "not_found",
            "no such result for this run",
        ),
        Err(airlock_store::StoreError::Invalid { .. }) => error(
            StatusCode::NOT_FOUND,
            "not_found",
            "no such result for this run",
        ),
        Err(e) => internal(e),
    }
}
