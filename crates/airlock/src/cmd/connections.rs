//! `airlock connections add|list|remove`: encrypted credentials in the store.
//!
//! Secret field values are read from standard input (a JSON object of string fields) or, when
//! standard input is a terminal, prompted for without echo. They never come from argv or the
//! environment, are held in zeroizing buffers, and reach the store only as a `v1:` envelope.

use std::collections::BTreeMap;
use std::io::{IsTerminal as _, Read as _, Write as _};
use std::process::ExitCode;

use airlock_api::v1;
use airlock_store::{AuthType, Store};
use airlock_vault::Keyring;
use anyhow::{Context as _, Result, bail};
use clap::Subcommand;
use zeroize::Zeroizing;

/// Largest accepted stdin document (a credential, not a file).
const MAX_STDIN: u64 = 1024 * 1024;

#[derive(clap::Args, Debug)]
pub struct ConnectionsArgs {
    /// Manage the connections of the organization whose key is in
    /// AIRLOCK_API_KEY on an `airlock serve` at this URL (default:
    /// AIRLOCK_SERVER) instead of the local store.
    #[arg(long, global = true)]
    pub server: Option<String>,
    #[command(subcommand)]
    pub cmd: ConnectionsCommand,
}

#[derive(Subcommand, Debug)]
pub enum ConnectionsCommand {
    /// Store a credential, encrypted. Fields come from stdin as a JSON object of strings
    /// (e.g. `{"token": "…"}`), or are prompted for without echo on a terminal.
    Add {
        /// Name the manifest refers to (`connection = "NAME"`).
        name: String,
        /// The integration namespace this credential is for.
        #[arg(long)]
        integration: String,
        /// How the credential is presented upstream.
        #[arg(long = "type", value_parser = auth_type())]
        auth_type: AuthType,
    },
    /// List stored connections (names, integrations, types, key ids; never a secret).
    List {
        /// Print JSON lines instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Remove a stored connection.
    Remove {
        /// The connection's name.
        name: String,
    },
}

/// `--type`: one of [`AuthType`]'s spellings, listed in `--help` and in
/// the error for any other.
fn auth_type() -> impl clap::builder::TypedValueParser<Value = AuthType> {
    use clap::builder::TypedValueParser as _;
    clap::builder::PossibleValuesParser::new(AuthType::ALL.map(AuthType::as_str))
        .try_map(|s| AuthType::parse(&s).ok_or(format!("{s:?} is not a connection type")))
}

fn required_fields(t: AuthType) -> &'static [&'static str] {
    airlock_platform::connections::required_fields(t)
}

/// Stores one of the local organization's connections
/// ([`airlock_platform::connections::store_connection`]).
pub(crate) async fn store_connection(
    store: &Store,
    ring: &Keyring,
    name: &str,
    integration: &str,
    auth_type: AuthType,
    fields: &Fields,
) -> Result<()> {
    let owner = airlock_platform::connections::Owner {
        org: airlock_store::LOCAL_ORG,
        max_connections: None,
    };
    airlock_platform::connections::store_connection(
        store,
        ring,
        owner,
        name,
        integration,
        auth_type,
        fields,
    )
    .await?;
    Ok(())
}

/// Logs go to stderr, filtered by `AIRLOCK_LOG` (warnings by default).
pub(crate) fn init_logging() {
    crate::logging::init_quiet();
}

pub(crate) fn runtime() -> Result<tokio::runtime::Runtime> {
    super::current_thread_runtime().context("cannot start the async runtime")
}

/// Reports an error (with its causes) and returns the failure exit code.
pub(crate) fn report(result: Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", super::out::error_line(&e));
            ExitCode::FAILURE
        }
    }
}

pub fn run(args: ConnectionsArgs) -> ExitCode {
    init_logging();
    let cmd = args.cmd;
    match super::remote::server(args.server.as_deref()) {
        Some(server) => report(runtime().and_then(|rt| rt.block_on(remote(&server, cmd)))),
        None => report(runtime().and_then(|rt| rt.block_on(run_async(cmd)))),
    }
}

/// The connections, as `{"connections": [...]}` (the API's answer) or as a
/// table; the same from a store or a server. Never a secret: there is none
/// in a [`v1::Connection`].
fn print_list(list: &v1::ConnectionList, json: bool) -> Result<()> {
    use super::out::outln;
    use airlock_sandbox::terminal::safe;
    if json {
        outln!("{}", serde_json::to_string(list)?);
        return Ok(());
    }
    let cs = &list.connections;
    if cs.is_empty() {
        outln!("no connections");
        return Ok(());
    }
    let w = cs.iter().map(|c| c.name.len()).max().unwrap_or(4).max(4);
    let wi = cs
        .iter()
        .map(|c| c.integration.len())
        .max()
        .unwrap_or(11)
        .max(11);
    outln!(
        "{:<w$}  {:<wi$}  {:<8}  {:<10}  UPDATED",
        "NAME",
        "INTEGRATION",
        "TYPE",
        "KID"
    );
    for c in cs {
        outln!(
            "{:<w$}  {:<wi$}  {:<8}  {:<10}  {}",
            safe(&c.name),
            safe(&c.integration),
            c.auth_type,
            c.kid,
            super::report::when(Some(c.updated_at))
        );
    }
    Ok(())
}

/// The same, on a server (the secret fields are read as locally, and sent
/// once, in the request that stores them).
async fn remote(server: &str, cmd: ConnectionsCommand) -> Result<()> {
    let r = super::remote::Remote::new(server)?;
    match cmd {
        ConnectionsCommand::Add {
            name,
            integration,
            auth_type,
        } => {
            let fields = read_fields(auth_type)?;
            let body = v1::NewConnection {
                fields: fields
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str().to_owned()))
                    .collect(),
                integration: integration.clone(),
                name: name.clone(),
                auth_type: auth_type.as_str().to_owned(),
            };
            let c: v1::Connection = r.send_json("POST", "/v1/connections", &body).await?;
            super::out::outln!(
                "stored connection {name:?} ({auth_type}, integration {integration:?}) on {server} under key {}",
                c.kid
            );
        }
        ConnectionsCommand::List { json } => {
            let v: v1::ConnectionList = r.get("/v1/connections").await?;
            print_list(&v, json)?;
        }
        ConnectionsCommand::Remove { name } => {
            r.delete(&format!("/v1/connections/{name}")).await?;
            super::out::outln!("removed connection {name:?} on {server}");
        }
    }
    Ok(())
}

async fn run_async(cmd: ConnectionsCommand) -> Result<()> {
    match cmd {
        ConnectionsCommand::Add {
            name,
            integration,
            auth_type,
        } => {
            // Check the key before asking for secrets.
            let ring = Keyring::from_env().context("connection encryption keyring")?;
            let fields = read_fields(auth_type)?;
            let store = Store::open_default().await?;
            let stored =
                store_connection(&store, &ring, &name, &integration, auth_type, &fields).await;
            store.close().await;
            stored?;
            let names: Vec<&str> = fields.keys().map(String::as_str).collect();
            super::out::outln!(
                "stored connection {name:?} ({auth_type}, integration {integration:?}, fields: {}) under key {}",
                names.join(", "),
                ring.active_kid()
            );
            Ok(())
        }
        ConnectionsCommand::List { json } => {
            let store = Store::open_default().await?;
            let list = store.list_connections(airlock_store::LOCAL_ORG).await?;
            store.close().await;
            print_list(
                &v1::ConnectionList {
                    connections: list.iter().map(v1::Connection::from).collect(),
                },
                json,
            )
        }
        ConnectionsCommand::Remove { name } => {
            let store = Store::open_default().await?;
            let removed = store
                .delete_connection(airlock_store::LOCAL_ORG, &name)
                .await?;
            store.close().await;
            if !removed {
                bail!(airlock_store::StoreError::ConnectionNotFound(name));
            }
            super::out::outln!("removed connection {name:?}");
            Ok(())
        }
    }
}

pub(crate) use airlock_platform::connections::Fields;

fn check_fields(t: AuthType, fields: &Fields) -> Result<()> {
    Ok(airlock_platform::connections::check_fields(t, fields)?)
}

fn read_fields(t: AuthType) -> Result<Fields> {
    let stdin = std::io::stdin();
    let fields = if stdin.is_terminal() {
        prompt_fields(t)?
    } else {
        let mut raw = Zeroizing::new(Vec::new());
        stdin
            .lock()
            .take(MAX_STDIN + 1)
            .read_to_end(&mut raw)
            .context("cannot read the credential fields from stdin")?;
        if raw.len() as u64 > MAX_STDIN {
            bail!(
                "stdin holds more than {MAX_STDIN} bytes: expected a small JSON object of fields"
            );
        }
        parse_fields(&raw)?
    };
    check_fields(t, &fields)?;
    Ok(fields)
}

/// Parses `{"field": "value", …}`. Errors say where and what, never quoting a value.
fn parse_fields(raw: &[u8]) -> Result<Fields> {
    if raw.iter().all(u8::is_ascii_whitespace) {
        bail!(
            "no credential fields on stdin: pipe a JSON object of string fields, e.g. \
             {{\"token\": \"…\"}}"
        );
    }
    let map: BTreeMap<String, String> = serde_json::from_slice(raw).map_err(|e| {
        let what = match e.classify() {
            serde_json::error::Category::Syntax => "is not valid JSON",
            serde_json::error::Category::Eof => "ends before the JSON object does",
            serde_json::error::Category::Data => {
                "must be a JSON object whose values are all strings"
            }
            serde_json::error::Category::Io => "could not be read",
        };
        anyhow::anyhow!(
            "credential fields on stdin {what} (line {}, column {})",
            e.line(),
            e.column()
        )
    })?;
    Ok(map
        .into_iter()
        .map(|(k, v)| (k, Zeroizing::new(v)))
        .collect())
}

fn prompt_secret(prompt: &str) -> Result<Zeroizing<String>> {
    Ok(Zeroizing::new(
        rpassword::prompt_password(prompt).context("cannot read from the terminal")?,
    ))
}

fn prompt_fields(t: AuthType) -> Result<Fields> {
    let mut fields = Fields::new();
    for f in required_fields(t) {
        fields.insert((*f).to_owned(), prompt_secret(&format!("{f}: "))?);
    }
    eprintln!("more fields? enter a field name, or an empty line to finish");
    loop {
        eprint!("field name: ");
        std::io::stderr().flush().ok();
        let mut name = String::new();
        std::io::stdin().read_line(&mut name)?;
        let name = name.trim();
        if name.is_empty() {
            break;
        }
        let value = prompt_secret(&format!("{name}: "))?;
        fields.insert(name.to_owned(), value);
    }
    Ok(fields)
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_platform_api::connection_types::{CONNECTION_TYPES, ConnectionType, types_summary};

    #[test]
    fn every_stored_type_has_its_schema() {
        for t in AuthType::ALL {
            assert!(ConnectionType::named(t.as_str()).is_some(), "{t}");
        }
        assert_eq!(CONNECTION_TYPES.len(), AuthType::ALL.len());
        let fields = |pairs: &[(&str, &str)]| -> Fields {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), Zeroizing::new((*v).to_owned())))
                .collect()
        };
        // The model key as docs/configuration.md tells a user to store it.
        assert!(check_fields(AuthType::ApiKey, &fields(&[("key", "sk-1")])).is_ok());
        assert!(check_fields(AuthType::ApiKey, &fields(&[("api_key", "sk-1")])).is_err());
    }

    #[test]
    fn the_configuration_doc_lists_the_schema() {
        let readme = include_str!("../../../../docs/configuration.md");
        let flat = readme.split_whitespace().collect::<Vec<_>>().join(" ");
        let line = types_summary();
        assert!(
            flat.contains(&line),
            "docs/configuration.md must list the connection types as the schema does:\n{line}"
        );
    }
}
