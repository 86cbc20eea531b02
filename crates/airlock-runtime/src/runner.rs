//! `airlock runner -- CMD…`: the first process of a local MCP runner's
//! sandbox (an integration with `source = { kind = "local", command }`).
//!
//! It receives the runner's secrets on stdin (a [`RuntimeSecrets`] whose
//! `sidecar` is the runner's MCP socket and whose `proxy` is the runner's
//! own proxy socket), makes itself non-dumpable and starts the server
//! command with piped stdin and stdout, and:
//! - relays the server's stdio to the sidecar's MCP socket for this runner
//!   (newline-delimited JSON-RPC: the sidecar is the client);
//! - serves `HTTP_PROXY`/`HTTPS_PROXY` on 127.0.0.1, relayed to the
//!   runner's proxy with the runner's token added: the server's only way
//!   out, bounded by its integration's `authorized_uris`;
//! - makes the server's tools trust the run's CA, so that its placeholder
//!   (`AIRLOCK_PLACEHOLDER_<NS>`, in its environment) becomes the credential
//!   at the sidecar. The server never holds the credential.
//!
//! The server's stderr is this process's stderr (the platform logs it).
//! The runner ends when the server exits, or when the sidecar closes the
//! stream (the server is then killed).

use std::process::Stdio;

use tokio::io::AsyncWriteExt;

use crate::{
    RuntimeError, RuntimeSecrets, exit_code, harden_and_split, launch_env, spawn_command,
    start_proxy_relay, start_transparent_plane, wait_for_sidecar,
};

/// Runs the runner's server to completion; returns its exit code.
pub async fn run(secrets: RuntimeSecrets, command: Vec<String>) -> Result<i32, RuntimeError> {
    let (program, args) = harden_and_split(&command)?;
    // The one connection the sidecar takes as this runner's stream (a
    // probe connection first would be taken instead).
    let (_, stream) = wait_for_sidecar(&secrets.sidecar).await?;
    let proxy = start_proxy_relay(&secrets).await?;
    start_transparent_plane(&secrets).await;
    let ws = &secrets.workspace;
    let meta = ws.join(".airlock");
    std::fs::create_dir_all(&meta).map_err(RuntimeError::Workspace)?;
    let env = launch_env(&secrets, &meta, proxy, vec![])?;
    let mut child = spawn_command(
        program,
        args,
        env,
        secrets.cwd.as_deref().unwrap_or(ws),
        [Stdio::piped(), Stdio::piped(), Stdio::inherit()],
    )
    .map_err(|e| match e {
        RuntimeError::Spawn { cmd, source } => RuntimeError::SpawnServer { cmd, source },
        other => other,
    })?;
    drop(secrets);
    let group = child
        .id()
        .and_then(|p| rustix::process::Pid::from_raw(i32::try_from(p).ok()?));
    let (Some(mut to_server), Some(mut from_server)) = (child.stdin.take(), child.stdout.take())
    else {
        return Err(RuntimeError::Spawn {
            cmd: program.clone(),
            source: std::io::Error::other("no stdio pipes"),
        });
    };
    let (mut from_sidecar, mut to_sidecar) = tokio::io::split(stream);
    let down = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut from_sidecar, &mut to_server).await;
        let _ = to_server.shutdown().await;
    });
    let up = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut from_server, &mut to_sidecar).await;
        let _ = to_sidecar.shutdown().await;
    });
    let kill_group = move || {
        if let Some(pgid) = group {
            let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL);
        }
    };
    let status = tokio::select! {
        status = child.wait() => status.map_err(|source| RuntimeError::Spawn { cmd: program.clone(), source })?,
        _ = down => {
            // The sidecar closed the stream: the server has no client left.
            kill_group();
            child.wait().await.map_err(|source| RuntimeError::Spawn { cmd: program.clone(), source })?
        }
    };
    kill_group();
    let _ = up.await;
    Ok(exit_code(status))
}
