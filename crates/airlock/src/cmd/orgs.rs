//! `airlock orgs`: the admin's bootstrap of `airlock serve`'s tenants, on the
//! store directly (closed mode: there is no sign-up route). A key is printed
//! once; only its hash is stored.

use std::process::ExitCode;

use airlock_server::ApiAuth;
use airlock_store::Store;
use anyhow::{Context as _, Result};
use clap::Subcommand;

#[derive(Subcommand)]
pub enum OrgsCommand {
    /// Creates an organization and its first API key (printed once, as JSON).
    Create {
        /// A display name.
        name: String,
        /// The organization's id (default: generated).
        #[arg(long)]
        id: Option<String>,
        /// Its own ceiling on running runs (beside the platform's).
        #[arg(long)]
        max_concurrent_runs: Option<u32>,
    },
    /// Lists organizations.
    List,
    /// Creates another API key for an organization (printed once).
    AddKey {
        /// The organization's id (`airlock orgs create` printed it).
        org: String,
        /// The key's name, for telling keys apart.
        #[arg(long, default_value = "admin")]
        name: String,
    },
    /// Revokes an API key.
    RevokeKey {
        /// The organization's id.
        org: String,
        /// The key's id (not its secret).
        key_id: String,
    },
}

pub fn run(cmd: OrgsCommand) -> ExitCode {
    crate::logging::init_quiet();
    super::connections::report(
        super::connections::runtime().and_then(|rt| rt.block_on(run_async(cmd))),
    )
}

fn auth() -> Result<ApiAuth> {
    ApiAuth::from_env()
        .context("API keys are hashed with API_AUTH_SECRET: set it as airlock serve has it")
}

async fn run_async(cmd: OrgsCommand) -> Result<()> {
    let store = Store::open_default().await?;
    let done = async {
        match cmd {
            OrgsCommand::Create {
                name,
                id,
                max_concurrent_runs,
            } => {
                let auth = auth()?;
                let id = match id {
                    Some(i) => i,
                    None => format!("org_{}", airlock_vault::random_hex::<6>()?),
                };
                if id == airlock_store::LOCAL_ORG {
                    anyhow::bail!("{id:?} is the embedded platform's organization");
                }
                let org = store
                    .create_org(&id, &name, max_concurrent_runs.map(i64::from))
                    .await?;
                let (key, secret) = auth
                    .create_key(&store, &org.id, "admin", None)
                    .await
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                super::out::outln!(
                    "{}",
                    serde_json::json!({
                        "org": org.id,
                        "name": org.name,
                        "api_key_id": key.id,
                        "api_key": airlock_server::auth::expose(&secret),
                    })
                );
                eprintln!("the API key is shown once; store it now");
            }
            OrgsCommand::List => {
                for o in store.list_orgs().await? {
                    super::out::outln!(
                        "{}",
                        serde_json::json!({ "id": o.id, "name": o.name, "max_concurrent_runs": o.max_concurrent_runs, "created_at": o.created_at })
                    );
                }
            }
            OrgsCommand::AddKey { org, name } => {
                let auth = auth()?;
                if store.get_org(&org).await?.is_none() {
                    anyhow::bail!("no organization {org:?}");
                }
                let (key, secret) = auth
                    .create_key(&store, &org, &name, None)
                    .await
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                super::out::outln!(
                    "{}",
                    serde_json::json!({ "org": org, "api_key_id": key.id, "api_key": airlock_server::auth::expose(&secret) })
                );
            }
            OrgsCommand::RevokeKey { org, key_id } => {
                if !store.revoke_api_key(&org, &key_id).await? {
                    anyhow::bail!("organization {org:?} has no live key {key_id:?}");
                }
                super::out::outln!("revoked {key_id}");
            }
        }
        Ok::<(), anyhow::Error>(())
    }
    .await;
    store.close().await;
    done
}
