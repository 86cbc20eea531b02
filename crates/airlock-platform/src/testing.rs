//! A real platform for tests: a temporary SQLite store, a fresh keyring, a
//! `running` run, and the internal API on a unix socket. Sidecar tests start
//! the real `airlock sidecar` against it and read back what it recorded.

use std::path::PathBuf;

use airlock_platform_api::wire::RunEvent;
use airlock_store::{AuthType, EgressEntry, NewConnection, NewRun, RunStatus, Store, StoreOptions};
use airlock_test_support::sidecar_config::SidecarConfigBuilder;
use airlock_vault::{ExposeSecret, Keyring, RunTokens, SecretString, SigningKeyring};
use serde_json::{Value, json};
use tokio::net::UnixListener;

use crate::internal_api::{Grant, InternalApi};

pub struct TestPlatform {
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    /// The main run's egress journal (created empty, 0600), named in
    /// [`TestPlatform::sidecar_config`] as the orchestrator names it.
    pub journal: PathBuf,
    pub run_id: String,
    pub run_token: SecretString,
    pub sidecar_token: SecretString,
    pub api: InternalApi,
    keyring: std::sync::Arc<Keyring>,
    /// The keyring's key (kid `k1`), for driving the CLI against this store.
    key: [u8; 32],
    tokens: RunTokens,
    task: tokio::task::JoinHandle<()>,
    /// Following the run's journal (until dropped).
    follow: std::sync::Mutex<Option<crate::journal::Follower>>,
}

impl Drop for TestPlatform {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TestPlatform {
    /// A platform with one `running` run of `agent`.
    pub async fn start(agent: &str) -> TestPlatform {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open_sqlite(&dir.path().join("airlock.db"), &StoreOptions::default())
            .await
            .expect("open store");
        let key = airlock_vault::random_bytes::<32>().expect("key");
        let keyring = std::sync::Arc::new(Keyring::new("k1", &key).expect("keyring"));
        let secret = airlock_vault::random_hex::<24>().expect("secret");
        let tokens = RunTokens::new(
            SigningKeyring::parse("RUN_TOKEN_SECRET", &secret).expect("signing keyring"),
        );
        let run_id = format!("run_{}", airlock_vault::random_hex::<6>().expect("id"));
        store
            .insert_run(&NewRun {
                org: airlock_store::LOCAL_ORG,
                owner: None,
                id: &run_id,
                agent,
                backend: "test",
                model: None,
                status: RunStatus::Running,
                created_at: None,
            })
            .await
            .expect("insert run");
        let api = InternalApi::new(
            store,
            keyring.clone(),
            tokens.clone(),
            airlock_store::ArtifactCaps {
                run_bytes: crate::settings::DEFAULT_RUN_ARTIFACT_BYTES,
                org_bytes: Some(crate::settings::DEFAULT_ORG_ARTIFACT_BYTES),
            },
            None,
        );
        api.grant(
            &run_id,
            Grant {
                org: airlock_store::LOCAL_ORG.to_owned(),
                agent: agent.to_owned(),
                ..Default::default()
            },
        );
        let socket = dir.path().join("platform.sock");
        let journal = crate::journal::create(dir.path()).expect("egress journal");
        let listener = UnixListener::bind(&socket).expect("bind platform socket");
        // The platform serves its API and follows the run's journal, as
        // the orchestrator does for a live run.
        let follow = crate::journal::Follower::start(
            api.store(),
            &run_id,
            dir.path(),
            crate::journal::Observe::default(),
        );
        let task = tokio::spawn(api.clone().serve_forever(listener));
        let run_token = tokens.issue(&run_id);
        let sidecar_token = airlock_vault::generate_sidecar_token().expect("sidecar token");
        TestPlatform {
            dir,
            socket,
            journal,
            run_id,
            run_token,
            sidecar_token,
            api,
            keyring,
            key,
            tokens,
            task,
            follow: std::sync::Mutex::new(Some(follow)),
        }
    }

    /// The store's connection key (`CONNECTION_ENCRYPTION_KEY` is its
    /// base64, with kid `k1`): a test can store connections with the real
    /// CLI (`AIRLOCK_HOME` = [`TestPlatform::dir`]).
    pub fn connection_key(&self) -> &[u8; 32] {
        &self.key
    }

    /// Grants the main run the stored connection `name` for `integration`.
    pub fn grant_connection(&self, integration: &str, name: &str) {
        let mut grant = self.api.grant_of_run(&self.run_id).unwrap_or_default();
        grant
            .connections
            .insert(integration.to_owned(), name.to_owned());
        self.api.grant(&self.run_id, grant);
    }

    /// Gives the main run a model of `provider` with `system_key` as the
    /// operator's key for it (`SYSTEM_PROVIDER_KEYS`), as a manifest's
    /// `[model]` section does.
    pub fn grant_model(
        &self,
        provider: airlock_platform_api::types::Provider,
        system_key: Option<&str>,
    ) {
        let mut grant = self.api.grant_of_run(&self.run_id).unwrap_or_default();
        grant.model = Some(crate::internal_api::ModelGrant {
            provider,
            system_key: system_key.map(|k| SecretString::from(k.to_owned())),
        });
        self.api.grant(&self.run_id, grant);
    }

    /// Stores an encrypted connection `name` in the organization, granted
    /// to no run (an organization's provider key is found by its name).
    pub async fn store_connection(&self, name: &str, auth_type: AuthType, fields: &[(&str, &str)]) {
        let (_, envelope) = self.sealed(name, fields);
        self.store()
            .insert_connection(&NewConnection {
                org: airlock_store::LOCAL_ORG,
                name,
                integration: name,
                auth_type,
                envelope: &envelope,
            })
            .await
            .expect("insert connection");
    }

    /// Stops serving the internal API (and following the journal), as a
    /// killed platform would: its socket goes away and nothing answers there
    /// any more (the store and what it holds stay readable). Once this
    /// returns, no read of the journal is under way or to come.
    pub async fn stop_serving(&self) {
        let follow = self
            .follow
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(follow) = follow {
            follow.stop().await;
        }
        self.task.abort();
        let _ = std::fs::remove_file(&self.socket);
    }

    pub fn store(&self) -> &Store {
        self.api.store()
    }

    /// Stores `rules` as the main run's next live policy version, as
    /// `PATCH /v1/runs/{id}/policy` stores it (`{"network": [...],
    /// "integrations": {...}}`, on the latest version): the version.
    pub async fn store_policy(&self, rules: &Value) -> i64 {
        let store = self.store();
        let latest = store.policy_version(&self.run_id).await.expect("version");
        store
            .change_policy(&self.run_id, latest, &rules.to_string(), "key test")
            .await
            .expect("change policy")
    }

    /// Whether the run's sidecar reports `version` applied within 30 s
    /// (its report is a write through this store: it wakes the wait).
    pub async fn policy_applied(&self, version: i64) -> bool {
        let store = self.store();
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
        let mut writes = store.policy_watch();
        loop {
            writes.borrow_and_update();
            if store.policy_applied(&self.run_id).await.expect("applied") >= version {
                return true;
            }
            if tokio::time::timeout_at(deadline, writes.changed())
                .await
                .is_err()
            {
                return false;
            }
        }
    }

    /// [`TestPlatform::store_policy`], then waits until the run's sidecar
    /// applied it (at most 30 s); the version.
    pub async fn change_policy(&self, rules: Value) -> i64 {
        let version = self.store_policy(&rules).await;
        assert!(
            self.policy_applied(version).await,
            "the sidecar did not apply policy version {version} within 30 s"
        );
        version
    }

    /// A second run of the same platform (for cross-run checks): its id and run token.
    pub async fn another_run(&self, agent: &str) -> (String, SecretString) {
        let id = format!("run_{}", airlock_vault::random_hex::<6>().expect("id"));
        self.store()
            .insert_run(&NewRun {
                org: airlock_store::LOCAL_ORG,
                owner: None,
                id: &id,
                agent,
                backend: "test",
                model: None,
                status: RunStatus::Running,
                created_at: None,
            })
            .await
            .expect("insert run");
        self.api.grant(
            &id,
            Grant {
                org: airlock_store::LOCAL_ORG.to_owned(),
                agent: agent.to_owned(),
                ..Default::default()
            },
        );
        (id.clone(), self.tokens.issue(&id))
    }

    /// A run token for any run id (the platform may not know the run).
    pub fn token_for(&self, run_id: &str) -> SecretString {
        self.tokens.issue(run_id)
    }

    /// Ends a run the way the orchestrator does: the grant goes, then the
    /// end is recorded.
    pub async fn end_run(&self, run_id: &str, status: RunStatus) {
        self.api.revoke(run_id);
        self.store()
            .finish_run(
                run_id,
                &airlock_store::RunEnd {
                    status,
                    exit_code: Some(0),
                    error: None,
                    at: 1,
                },
            )
            .await
            .expect("finish run");
    }

    /// Stores an encrypted connection for `integration` (or `@model`) and
    /// grants it to the main run.
    pub async fn add_connection(
        &self,
        integration: &str,
        auth_type: AuthType,
        fields: &[(&str, &str)],
    ) {
        let (name, envelope) = self.sealed(integration, fields);
        self.store()
            .insert_connection(&NewConnection {
                org: airlock_store::LOCAL_ORG,
                name: &name,
                integration,
                auth_type,
                envelope: &envelope,
            })
            .await
            .expect("insert connection");
        let mut grant = Grant {
            org: airlock_store::LOCAL_ORG.to_owned(),
            agent: String::new(),
            ..Default::default()
        };
        if let Some(existing) = self.api.grant_of_run(&self.run_id) {
            grant = existing;
        }
        grant.connections.insert(integration.to_owned(), name);
        self.api.grant(&self.run_id, grant);
    }

    /// The name [`add_connection`](TestPlatform::add_connection) gives
    /// `integration`'s connection, and `fields` sealed with the keyring.
    fn sealed(&self, integration: &str, fields: &[(&str, &str)]) -> (String, String) {
        let map: serde_json::Map<String, Value> = fields
            .iter()
            .map(|(k, v)| ((*k).to_owned(), json!(v)))
            .collect();
        let envelope = self
            .keyring
            .encrypt(Value::Object(map).to_string().as_bytes())
            .expect("encrypt");
        let name = format!("{}-conn", integration.trim_start_matches('@'));
        (name, envelope)
    }

    /// Replaces the credential of the connection [`add_connection`] made
    /// for `integration` (a key rotated on the platform), and checks that
    /// the internal API serves the new one from the next fetch on (a change
    /// through the platform's own store clears its connection cache).
    ///
    /// [`add_connection`]: TestPlatform::add_connection
    pub async fn replace_connection(&self, integration: &str, fields: &[(&str, &str)]) {
        let (name, envelope) = self.sealed(integration, fields);
        let replaced = self
            .store()
            .replace_connection_envelope(airlock_store::LOCAL_ORG, &name, &envelope)
            .await
            .expect("replace connection");
        assert!(replaced, "no connection {name} to replace");
        let client =
            airlock_platform_api::PlatformClient::new(&self.socket, self.run_token.clone());
        let served = client
            .credential(integration)
            .await
            .expect("credential fetch");
        assert!(
            fields
                .iter()
                .all(|(k, v)| served.fields.get(*k).map(ExposeSecret::expose_secret) == Some(*v)),
            "the platform still serves the old credential of {integration}"
        );
    }

    /// Every event the run recorded so far, the run's journal read in first
    /// (idempotent; the sidecar's sink is asynchronous: poll or flush
    /// before asserting on heartbeats).
    pub async fn events(&self) -> Vec<RunEvent> {
        self.ingest_journal().await;
        let mut out = Vec::new();
        let mut after = 0;
        loop {
            let page = self
                .store()
                .list_events(&self.run_id, after, 500)
                .await
                .expect("events");
            let Some(last) = page.last() else { break };
            after = last.id;
            out.extend(
                page.iter()
                    .filter_map(|e| serde_json::from_str::<RunEvent>(&e.payload).ok()),
            );
        }
        out
    }

    /// Reads the main run's egress journal into the store, as the
    /// orchestrator does when a run ends (idempotent).
    pub async fn ingest_journal(&self) -> usize {
        crate::journal::ingest(self.store(), &self.run_id, &self.journal)
            .await
            .expect("ingest the egress journal")
    }

    /// The main run's egress log as the store has it once the run has
    /// ended: the journal is read in first (a record already stored stays
    /// as it is unless the journal completes it).
    pub async fn egress_log(&self) -> Vec<EgressEntry> {
        self.ingest_journal().await;
        self.stored_egress_log().await
    }

    /// The main run's egress log as the store has it now (what following
    /// the journal brought so far; the journal not read to its end).
    pub async fn stored_egress_log(&self) -> Vec<EgressEntry> {
        self.store()
            .list_egress(&self.run_id, 10_000)
            .await
            .expect("egress log")
    }

    /// A sidecar configuration for the main run, with the run's egress
    /// journal; add its listeners, integrations, model, network and egress.
    pub fn sidecar_config(&self) -> SidecarConfigBuilder {
        SidecarConfigBuilder::new(
            &self.run_id,
            &self.sidecar_token,
            &self.run_token,
            &self.socket,
        )
        .journal(&self.journal)
    }
}
