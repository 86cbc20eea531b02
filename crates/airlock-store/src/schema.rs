//! Migrations, one list per backend, applied in order at open.
//!
//! Hand-rolled rather than `sqlx::migrate!` (which needs sqlx's proc macros): a version table,
//! each migration in its own transaction, the version row inserted first so that two processes
//! migrating at once cannot both apply one (the second hits the primary key and backs off).
//!
//! Bounds: `airlock_schema_migrations` holds one row per migration applied.

use crate::{Backend, Store, StoreError, is_unique_violation, now_ms};

pub(crate) struct Migration {
    pub version: i64,
    pub description: &'static str,
    pub sql: &'static str,
}

pub(crate) const VERSION_TABLE: &str = "CREATE TABLE IF NOT EXISTS airlock_schema_migrations (
    version BIGINT PRIMARY KEY,
    description TEXT NOT NULL,
    applied_at BIGINT NOT NULL
)";

/// Version 5's tables and columns, the same on both backends (each adds
/// its own way of re-keying `connections`).
macro_rules! version_5_common {
    () => {
        r#"
CREATE TABLE organizations (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    max_concurrent_runs BIGINT,
    created_at BIGINT NOT NULL
);
CREATE TABLE api_keys (
    id TEXT PRIMARY KEY,
    org_id TEXT NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    hash TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    revoked_at BIGINT,
    last_used_at BIGINT
);
CREATE INDEX api_keys_org ON api_keys (org_id);
CREATE TABLE agents (
    org_id TEXT NOT NULL,
    name TEXT NOT NULL,
    manifest TEXT NOT NULL,
    files TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (org_id, name)
);
CREATE TABLE webhooks (
    id TEXT PRIMARY KEY,
    org_id TEXT NOT NULL,
    url TEXT NOT NULL,
    events TEXT NOT NULL,
    secret_envelope TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE INDEX webhooks_org ON webhooks (org_id);
CREATE TABLE webhook_deliveries (
    id TEXT PRIMARY KEY,
    webhook_id TEXT NOT NULL REFERENCES webhooks (id) ON DELETE CASCADE,
    org_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    event TEXT NOT NULL,
    payload TEXT NOT NULL,
    state TEXT NOT NULL,
    attempts BIGINT NOT NULL DEFAULT 0,
    last_status BIGINT,
    last_error TEXT,
    next_attempt_at BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    delivered_at BIGINT,
    claimed_by TEXT,
    claimed_until BIGINT
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (state, next_attempt_at);
CREATE INDEX webhook_deliveries_hook ON webhook_deliveries (webhook_id, created_at);
CREATE TABLE replicas (
    id TEXT PRIMARY KEY,
    host TEXT NOT NULL,
    pid BIGINT NOT NULL,
    started_at BIGINT NOT NULL,
    heartbeat_at BIGINT NOT NULL
);
CREATE TABLE leases (
    name TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    expires_at BIGINT NOT NULL
);
ALTER TABLE runs ADD COLUMN org_id TEXT NOT NULL DEFAULT 'local';
ALTER TABLE runs ADD COLUMN owner TEXT;
ALTER TABLE runs ADD COLUMN prompt TEXT;
ALTER TABLE runs ADD COLUMN hints TEXT;
ALTER TABLE runs ADD COLUMN queue_seq BIGINT NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN cancel_requested BIGINT NOT NULL DEFAULT 0;
CREATE INDEX runs_org ON runs (org_id, created_at);
CREATE INDEX runs_queue ON runs (status, queue_seq);
ALTER TABLE memories ADD COLUMN org_id TEXT NOT NULL DEFAULT 'local';
"#
    };
}

/// Version 6's counter of connection changes, the same on both backends
/// (each moves it with its own kind of trigger).
macro_rules! version_6_common {
    () => {
        r#"
CREATE TABLE connections_changes (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    n BIGINT NOT NULL
);
INSERT INTO connections_changes (id, n) VALUES (1, 0);
"#
    };
}

/// Version 7's columns for the fleet, the same on both backends: why a
/// running run was asked to stop (and by whom), and one delivery per
/// webhook per run event (`event_key` is `<run id>:<event>`; older rows
/// have none, and NULLs never collide).
/// Version 8: an event read from a run's journal carries its place there
/// (`seq`, the line's byte offset): reading the journal again (a retry
/// after the store failed, the boot reclaim) stores each event once.
macro_rules! version_8_common {
    () => {
        r#"
ALTER TABLE run_events ADD COLUMN seq BIGINT;
CREATE UNIQUE INDEX run_events_run_seq ON run_events (run_id, seq);
"#
    };
}

macro_rules! version_7_common {
    () => {
        r#"
ALTER TABLE runs ADD COLUMN cancel_reason TEXT;
ALTER TABLE webhook_deliveries ADD COLUMN event_key TEXT;
CREATE UNIQUE INDEX webhook_deliveries_event ON webhook_deliveries (webhook_id, event_key);
CREATE INDEX runs_owner ON runs (owner, status);
"#
    };
}

/// Retention and quotas: what the sweep finds by end time, and what it
/// measures per organization.
macro_rules! version_9_common {
    () => {
        r#"
CREATE INDEX runs_ended ON runs (ended_at);
CREATE TABLE org_usage (
    org_id TEXT PRIMARY KEY,
    stored_bytes BIGINT NOT NULL,
    measured_at BIGINT NOT NULL
);
"#
    };
}

/// Version 10: organizations' model budgets and what each period spent,
/// the same on both backends.
macro_rules! version_10_common {
    () => {
        r#"
CREATE TABLE org_budgets (
    org_id TEXT PRIMARY KEY,
    day_tokens BIGINT,
    day_cost_microusd BIGINT,
    day_requests BIGINT,
    month_tokens BIGINT,
    month_cost_microusd BIGINT,
    month_requests BIGINT,
    updated_at BIGINT NOT NULL
);
CREATE TABLE org_spend (
    org_id TEXT NOT NULL,
    period TEXT NOT NULL,
    tokens BIGINT NOT NULL DEFAULT 0,
    cost_microusd BIGINT NOT NULL DEFAULT 0,
    requests BIGINT NOT NULL DEFAULT 0,
    reserved_tokens BIGINT NOT NULL DEFAULT 0,
    reserved_cost_microusd BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (org_id, period)
);
"#
    };
}

/// Version 12: a run's model budget (its own limits, as the relay keeps
/// them; `NULL`: not limited) and its metered model requests beside its
/// tokens and cost.
macro_rules! version_12_common {
    () => {
        r#"
ALTER TABLE runs ADD COLUMN requests BIGINT NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN budget_tokens BIGINT;
ALTER TABLE runs ADD COLUMN budget_cost_microusd BIGINT;
ALTER TABLE runs ADD COLUMN budget_requests BIGINT;
"#
    };
}

/// Version 13: each budget threshold crossed, once per budget, measure,
/// threshold and period (`event_key`, also its deliveries'), and each
/// organization's thresholds (`NULL`: the default).
macro_rules! version_13_common {
    () => {
        r#"
CREATE TABLE budget_crossings (
    org_id TEXT NOT NULL,
    event_key TEXT NOT NULL,
    budget TEXT NOT NULL,
    period TEXT NOT NULL,
    measure TEXT NOT NULL,
    threshold BIGINT NOT NULL,
    spent BIGINT NOT NULL,
    limit_value BIGINT NOT NULL,
    run_id TEXT NOT NULL,
    crossed_at BIGINT NOT NULL,
    PRIMARY KEY (org_id, event_key)
);
CREATE INDEX budget_crossings_at ON budget_crossings (crossed_at);
ALTER TABLE org_budgets ADD COLUMN thresholds TEXT;
"#
    };
}

/// Version 14: the path that carried each egress record to the guard
/// (`api`, `proxy`, `transparent`: the wire's `EgressPlane`); the records
/// kept before it have the one their source implies.
macro_rules! version_14_common {
    () => {
        r#"
ALTER TABLE egress_log ADD COLUMN plane TEXT NOT NULL DEFAULT 'api';
UPDATE egress_log SET plane = 'proxy' WHERE source IN ('proxy', 'runner');
"#
    };
}

/// Version 15: the audit's rule id: a `rule_refused` egress record names
/// the L7 rule that refused it (`NULL` for every other record).
macro_rules! version_15_common {
    () => {
        r#"
ALTER TABLE egress_log ADD COLUMN rule TEXT;
"#
    };
}

/// Version 16: a run's phases between its start and its end: when its
/// sandbox was up and its sidecar ready (Unix ms; `NULL`: not reached, or a
/// run from before).
macro_rules! version_16_common {
    () => {
        r#"
ALTER TABLE runs ADD COLUMN sandbox_up_at BIGINT;
ALTER TABLE runs ADD COLUMN sidecar_up_at BIGINT;
"#
    };
}

/// Version 17: operator proxies. An organization's choice among the
/// operator's `SYSTEM_PROXIES` (by name; `NULL`: none, `PROXY_URL` or
/// direct), and the proxy each run's guarded connections went through (the
/// name, `PROXY_URL`, or `NULL` for direct), never a URL.
macro_rules! version_17_common {
    () => {
        r#"
ALTER TABLE organizations ADD COLUMN proxy TEXT;
ALTER TABLE runs ADD COLUMN proxy TEXT;
"#
    };
}

/// Version 18: live policy. Each run's policy versions (0: its manifest's
/// rules; then each change, with who made it), removed with the run, and
/// the version its sidecar last reported applied.
macro_rules! version_18_common {
    () => {
        r#"
CREATE TABLE run_policy (
    run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    version BIGINT NOT NULL,
    rules TEXT NOT NULL,
    actor TEXT NOT NULL,
    at BIGINT NOT NULL,
    PRIMARY KEY (run_id, version)
);
ALTER TABLE runs ADD COLUMN policy_applied BIGINT;
"#
    };
}

/// Version 19: human approval. The requests a run's sidecar held under an
/// `ask` rule: what each would do (never a credential, header, query or
/// body), its state (`pending`, then once `allowed_once`, `allowed_run`,
/// `denied`, `expired` or `dropped`), who answered, and when; removed with
/// the run.
macro_rules! version_19_common {
    () => {
        r#"
CREATE TABLE approvals (
    id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    org_id TEXT NOT NULL,
    state TEXT NOT NULL,
    method TEXT NOT NULL,
    host TEXT NOT NULL,
    path TEXT NOT NULL,
    integration TEXT,
    rule TEXT NOT NULL,
    answered_by TEXT,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    settled_at BIGINT
);
CREATE INDEX approvals_run ON approvals (run_id, created_at);
"#
    };
}

/// Version 11: files in and out of a run. A run's input files (JSON of
/// path → text, as asked at its creation), and the artifacts its agent
/// left: each stored (`body`) or refused (`refused` says why, no body),
/// removed with its run.
macro_rules! version_11 {
    ($blob:literal) => {
        concat!(
            "ALTER TABLE runs ADD COLUMN inputs TEXT;\n",
            "CREATE TABLE artifacts (\n",
            "    run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,\n",
            "    org_id TEXT NOT NULL,\n",
            "    path TEXT NOT NULL,\n",
            "    bytes BIGINT NOT NULL,\n",
            "    body ",
            $blob,
            ",\n",
            "    refused TEXT,\n",
            "    created_at BIGINT NOT NULL,\n",
            "    PRIMARY KEY (run_id, path)\n",
            ");\n",
            "CREATE INDEX artifacts_org ON artifacts (org_id);\n",
        )
    };
}

pub(crate) const SQLITE: &[Migration] = &[
    Migration {
        version: 1,
        description: "initial schema",
        sql: r#"
CREATE TABLE connections (
    name TEXT PRIMARY KEY,
    integration TEXT NOT NULL,
    auth_type TEXT NOT NULL,
    kid TEXT NOT NULL,
    envelope TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
CREATE INDEX connections_kid ON connections (kid);

CREATE TABLE runs (
    id TEXT PRIMARY KEY,
    agent TEXT NOT NULL,
    status TEXT NOT NULL,
    backend TEXT NOT NULL,
    model TEXT,
    created_at BIGINT NOT NULL,
    started_at BIGINT,
    ended_at BIGINT,
    last_heartbeat_at BIGINT,
    exit_code BIGINT,
    error TEXT,
    tokens_in BIGINT NOT NULL DEFAULT 0,
    tokens_out BIGINT NOT NULL DEFAULT 0,
    cost_microusd BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX runs_created ON runs (created_at DESC);
CREATE INDEX runs_status ON runs (status);

CREATE TABLE run_events (
    id INTEGER PRIMARY KEY,
    run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    at BIGINT NOT NULL,
    kind TEXT NOT NULL,
    payload TEXT NOT NULL
);
CREATE INDEX run_events_run ON run_events (run_id, id);

CREATE TABLE egress_log (
    id INTEGER PRIMARY KEY,
    run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    at BIGINT NOT NULL,
    source TEXT NOT NULL,
    integration TEXT,
    method TEXT NOT NULL,
    url TEXT NOT NULL,
    host TEXT NOT NULL,
    decision TEXT NOT NULL,
    reason TEXT,
    status BIGINT,
    duration_ms BIGINT
);
CREATE INDEX egress_log_run ON egress_log (run_id, id);

CREATE TABLE memories (
    id INTEGER PRIMARY KEY,
    agent TEXT NOT NULL,
    run_id TEXT,
    content TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE INDEX memories_agent ON memories (agent, id);

CREATE TABLE results (
    run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    id TEXT NOT NULL,
    content_type TEXT NOT NULL,
    body BLOB NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (run_id, id)
);
"#,
    },
    Migration {
        version: 2,
        description: "egress log byte counts",
        sql: r#"
ALTER TABLE egress_log ADD COLUMN bytes_out BIGINT NOT NULL DEFAULT 0;
ALTER TABLE egress_log ADD COLUMN bytes_in BIGINT NOT NULL DEFAULT 0;
"#,
    },
    Migration {
        version: 3,
        description: "egress log outcome, record sequence and metering",
        sql: r#"
ALTER TABLE egress_log ADD COLUMN seq BIGINT;
ALTER TABLE egress_log ADD COLUMN outcome TEXT;
ALTER TABLE egress_log ADD COLUMN metering TEXT;
CREATE UNIQUE INDEX egress_log_run_seq ON egress_log (run_id, seq);
-- Older rows in today's terms: a dial or upstream failure was logged with
-- the code upstream_failed (as refused by api_call and the proxy, allowed by
-- /llm); the guard had allowed each of them. Every other allowed row was
-- written once the request was over.
UPDATE egress_log SET decision = 'allowed', reason = NULL, outcome = 'upstream_failed'
    WHERE reason = 'upstream_failed';
UPDATE egress_log SET outcome = 'completed' WHERE decision = 'allowed' AND outcome IS NULL;
"#,
    },
    Migration {
        version: 4,
        description: "key-check values per key id",
        sql: r#"
CREATE TABLE key_checks (
    kid TEXT PRIMARY KEY,
    check_value TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
"#,
    },
    Migration {
        version: 5,
        description: "organizations, API keys, agents, webhooks, replicas; runs, connections and memories per organization",
        sql: concat!(
            version_5_common!(),
            r#"-- Connections are an organization's: the key becomes (org_id, name).
CREATE TABLE connections_v5 (
    org_id TEXT NOT NULL DEFAULT 'local',
    name TEXT NOT NULL,
    integration TEXT NOT NULL,
    auth_type TEXT NOT NULL,
    kid TEXT NOT NULL,
    envelope TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (org_id, name)
);
INSERT INTO connections_v5 (org_id, name, integration, auth_type, kid, envelope, created_at, updated_at)
    SELECT 'local', name, integration, auth_type, kid, envelope, created_at, updated_at FROM connections;
DROP TABLE connections;
ALTER TABLE connections_v5 RENAME TO connections;
CREATE INDEX connections_kid ON connections (kid);
"#
        ),
    },
    Migration {
        version: 6,
        description: "a version of the connections that every change moves",
        sql: concat!(
            version_6_common!(),
            r#"CREATE TRIGGER connections_changed_by_insert AFTER INSERT ON connections
BEGIN
    UPDATE connections_changes SET n = n + 1 WHERE id = 1;
END;
CREATE TRIGGER connections_changed_by_update AFTER UPDATE ON connections
BEGIN
    UPDATE connections_changes SET n = n + 1 WHERE id = 1;
END;
CREATE TRIGGER connections_changed_by_delete AFTER DELETE ON connections
BEGIN
    UPDATE connections_changes SET n = n + 1 WHERE id = 1;
END;
"#
        ),
    },
    Migration {
        version: 7,
        description: "cancel reasons; one webhook delivery per run event",
        sql: version_7_common!(),
    },
    Migration {
        version: 8,
        description: "run events numbered by their place in the run's journal",
        sql: version_8_common!(),
    },
    Migration {
        version: 9,
        description: "retention by end time; stored bytes per organization",
        sql: version_9_common!(),
    },
    Migration {
        version: 10,
        description: "organizations' model budgets and spend per period",
        sql: version_10_common!(),
    },
    Migration {
        version: 11,
        description: "a run's input files and its artifacts",
        sql: version_11!("BLOB"),
    },
    Migration {
        version: 12,
        description: "a run's model budget and its metered requests",
        sql: version_12_common!(),
    },
    Migration {
        version: 13,
        description: "budget thresholds crossed, and each organization's thresholds",
        sql: version_13_common!(),
    },
    Migration {
        version: 14,
        description: "the plane that carried each egress record",
        sql: version_14_common!(),
    },
    Migration {
        version: 15,
        description: "the L7 rule that refused an egress record",
        sql: version_15_common!(),
    },
    Migration {
        version: 16,
        description: "when a run's sandbox was up and its sidecar ready",
        sql: version_16_common!(),
    },
    Migration {
        version: 17,
        description: "an organization's operator proxy and the proxy each run used",
        sql: version_17_common!(),
    },
    Migration {
        version: 18,
        description: "each run's live policy changes and the version its sidecar applied",
        sql: version_18_common!(),
    },
    Migration {
        version: 19,
        description: "the requests held for a person's approval",
        sql: version_19_common!(),
    },
];

pub(crate) const POSTGRES: &[Migration] = &[
    Migration {
        version: 1,
        description: "initial schema",
        sql: r#"
CREATE TABLE connections (
    name TEXT PRIMARY KEY,
    integration TEXT NOT NULL,
    auth_type TEXT NOT NULL,
    kid TEXT NOT NULL,
    envelope TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
CREATE INDEX connections_kid ON connections (kid);

CREATE TABLE runs (
    id TEXT PRIMARY KEY,
    agent TEXT NOT NULL,
    status TEXT NOT NULL,
    backend TEXT NOT NULL,
    model TEXT,
    created_at BIGINT NOT NULL,
    started_at BIGINT,
    ended_at BIGINT,
    last_heartbeat_at BIGINT,
    exit_code BIGINT,
    error TEXT,
    tokens_in BIGINT NOT NULL DEFAULT 0,
    tokens_out BIGINT NOT NULL DEFAULT 0,
    cost_microusd BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX runs_created ON runs (created_at DESC);
CREATE INDEX runs_status ON runs (status);

CREATE TABLE run_events (
    id BIGSERIAL PRIMARY KEY,
    run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    at BIGINT NOT NULL,
    kind TEXT NOT NULL,
    payload TEXT NOT NULL
);
CREATE INDEX run_events_run ON run_events (run_id, id);

CREATE TABLE egress_log (
    id BIGSERIAL PRIMARY KEY,
    run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    at BIGINT NOT NULL,
    source TEXT NOT NULL,
    integration TEXT,
    method TEXT NOT NULL,
    url TEXT NOT NULL,
    host TEXT NOT NULL,
    decision TEXT NOT NULL,
    reason TEXT,
    status BIGINT,
    duration_ms BIGINT
);
CREATE INDEX egress_log_run ON egress_log (run_id, id);

CREATE TABLE memories (
    id BIGSERIAL PRIMARY KEY,
    agent TEXT NOT NULL,
    run_id TEXT,
    content TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE INDEX memories_agent ON memories (agent, id);

CREATE TABLE results (
    run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    id TEXT NOT NULL,
    content_type TEXT NOT NULL,
    body BYTEA NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (run_id, id)
);
"#,
    },
    Migration {
        version: 2,
        description: "egress log byte counts",
        sql: r#"
ALTER TABLE egress_log ADD COLUMN bytes_out BIGINT NOT NULL DEFAULT 0;
ALTER TABLE egress_log ADD COLUMN bytes_in BIGINT NOT NULL DEFAULT 0;
"#,
    },
    Migration {
        version: 3,
        description: "egress log outcome, record sequence and metering",
        sql: r#"
ALTER TABLE egress_log ADD COLUMN seq BIGINT;
ALTER TABLE egress_log ADD COLUMN outcome TEXT;
ALTER TABLE egress_log ADD COLUMN metering TEXT;
CREATE UNIQUE INDEX egress_log_run_seq ON egress_log (run_id, seq);
-- Older rows in today's terms: a dial or upstream failure was logged with
-- the code upstream_failed (as refused by api_call and the proxy, allowed by
-- /llm); the guard had allowed each of them. Every other allowed row was
-- written once the request was over.
UPDATE egress_log SET decision = 'allowed', reason = NULL, outcome = 'upstream_failed'
    WHERE reason = 'upstream_failed';
UPDATE egress_log SET outcome = 'completed' WHERE decision = 'allowed' AND outcome IS NULL;
"#,
    },
    Migration {
        version: 4,
        description: "key-check values per key id",
        sql: r#"
CREATE TABLE key_checks (
    kid TEXT PRIMARY KEY,
    check_value TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
"#,
    },
    Migration {
        version: 5,
        description: "organizations, API keys, agents, webhooks, replicas; runs, connections and memories per organization",
        sql: concat!(
            version_5_common!(),
            r#"-- Connections are an organization's: the key becomes (org_id, name).
ALTER TABLE connections ADD COLUMN org_id TEXT NOT NULL DEFAULT 'local';
ALTER TABLE connections DROP CONSTRAINT connections_pkey;
ALTER TABLE connections ADD PRIMARY KEY (org_id, name);
"#
        ),
    },
    Migration {
        version: 6,
        description: "a version of the connections that every change moves",
        sql: concat!(
            version_6_common!(),
            r#"CREATE FUNCTION connections_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE connections_changes SET n = n + 1 WHERE id = 1;
    RETURN NULL;
END
$$;
-- Per row, as on SQLite: a statement that changes nothing moves nothing.
CREATE TRIGGER connections_changed AFTER INSERT OR UPDATE OR DELETE ON connections
    FOR EACH ROW EXECUTE FUNCTION connections_changed();
CREATE TRIGGER connections_truncated AFTER TRUNCATE ON connections
    FOR EACH STATEMENT EXECUTE FUNCTION connections_changed();
"#
        ),
    },
    Migration {
        version: 7,
        description: "cancel reasons; one webhook delivery per run event",
        sql: version_7_common!(),
    },
    Migration {
        version: 8,
        description: "run events numbered by their place in the run's journal",
        sql: version_8_common!(),
    },
    Migration {
        version: 9,
        description: "retention by end time; stored bytes per organization",
        sql: version_9_common!(),
    },
    Migration {
        version: 10,
        description: "organizations' model budgets and spend per period",
        sql: version_10_common!(),
    },
    Migration {
        version: 11,
        description: "a run's input files and its artifacts",
        sql: version_11!("BYTEA"),
    },
    Migration {
        version: 12,
        description: "a run's model budget and its metered requests",
        sql: version_12_common!(),
    },
    Migration {
        version: 13,
        description: "budget thresholds crossed, and each organization's thresholds",
        sql: version_13_common!(),
    },
    Migration {
        version: 14,
        description: "the plane that carried each egress record",
        sql: version_14_common!(),
    },
    Migration {
        version: 15,
        description: "the L7 rule that refused an egress record",
        sql: version_15_common!(),
    },
    Migration {
        version: 16,
        description: "when a run's sandbox was up and its sidecar ready",
        sql: version_16_common!(),
    },
    Migration {
        version: 17,
        description: "an organization's operator proxy and the proxy each run used",
        sql: version_17_common!(),
    },
    Migration {
        version: 18,
        description: "each run's live policy changes and the version its sidecar applied",
        sql: version_18_common!(),
    },
    Migration {
        version: 19,
        description: "the requests held for a person's approval",
        sql: version_19_common!(),
    },
];

impl Store {
    /// Applies every migration this version knows that the store has not
    /// had yet, each in its own transaction; refuses a store migrated by a
    /// newer version.
    pub(crate) async fn migrate(&self) -> Result<(), StoreError> {
        let migrations = match self.backend() {
            Backend::Sqlite => SQLITE,
            Backend::Postgres => POSTGRES,
        };
        on_pool!(self, p => {
            sqlx::raw_sql(VERSION_TABLE)
                .execute(p)
                .await
                .map_err(|e| self.err(e))?;
            let applied: Option<i64> =
                sqlx::query_scalar("SELECT MAX(version) FROM airlock_schema_migrations")
                    .fetch_one(p)
                    .await
                    .map_err(|e| self.err(e))?;
            let known = migrations.last().map_or(0, |m| m.version);
            if let Some(found) = applied.filter(|v| *v > known) {
                return Err(StoreError::SchemaTooNew { found, known });
            }
            for m in migrations.iter().filter(|m| applied.is_none_or(|a| m.version > a)) {
                let mut tx = p.begin().await.map_err(|e| self.err(e))?;
                let claimed = sqlx::query(
                    "INSERT INTO airlock_schema_migrations (version, description, applied_at) \
                     VALUES ($1, $2, $3)",
                )
                .bind(m.version)
                .bind(m.description)
                .bind(now_ms())
                .execute(&mut *tx)
                .await;
                match claimed {
                    Ok(_) => {}
                    Err(e) if is_unique_violation(&e) => continue, // another process applied it
                    Err(e) => return Err(self.err(e)),
                }
                sqlx::raw_sql(m.sql).execute(&mut *tx).await.map_err(|source| {
                    StoreError::Migration { version: m.version, detail: source.to_string(), source }
                })?;
                tx.commit().await.map_err(|e| self.err(e))?;
                tracing::info!(version = m.version, database = %self.display, "applied migration");
            }
            Ok(())
        })
    }

    /// The schema version in force.
    pub async fn schema_version(&self) -> Result<i64, StoreError> {
        on_pool!(self, p => {
            let v: Option<i64> =
                sqlx::query_scalar("SELECT MAX(version) FROM airlock_schema_migrations")
                    .fetch_one(p)
                    .await
                    .map_err(|e| self.err(e))?;
            Ok(v.unwrap_or(0))
        })
    }
}
