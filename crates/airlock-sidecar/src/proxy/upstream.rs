//! Dialling an admitted target: directly at a pinned address, or through the
//! operator's upstream proxy (`PROXY_URL`) with a CONNECT to that same pinned
//! address. Which of the two is the sidecar's one [`airlock_egress::upstream::Via`],
//! shared with its guarded client (api_call, `/llm`, remote MCP): see that
//! module for why the proxy gets the pinned address and is itself dialled
//! without the guard.

use std::net::SocketAddr;

use airlock_egress::upstream::{UpstreamError, Via, ViaError};
use airlock_egress::{Admitted, EgressCode, EgressError, GuardStep};
use tokio::net::TcpStream;

use super::ProxySettings;
use crate::state::Sidecar;

/// Why an admitted target could not be dialled: each step that fails. The
/// message becomes the `upstream_failed` refusal's detail; none repeats
/// `PROXY_URL` (it may hold a password) or the address dialled (the agent
/// reads the detail; the address is the operator's: [`DialError::address`]).
#[derive(Debug, thiserror::Error)]
pub(crate) enum DialError {
    #[error("no address to dial")]
    NoAddress,
    #[error("connect failed: {source}")]
    Connect {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("connect timed out after {after:?}")]
    TimedOut {
        addr: SocketAddr,
        after: std::time::Duration,
    },
    #[error("{0}")]
    Upstream(#[source] UpstreamError),
    #[error("{0}")]
    Unusable(String),
}

impl DialError {
    /// The address the dial was to, if the failure is about one.
    fn address(&self) -> Option<SocketAddr> {
        match self {
            DialError::Connect { addr, .. }
            | DialError::TimedOut { addr, .. }
            | DialError::Upstream(UpstreamError::Refused { addr, .. }) => Some(*addr),
            _ => None,
        }
    }
}

fn failed(admitted: &Admitted, e: &DialError) -> EgressError {
    let failed = EgressError::new(
        EgressCode::UpstreamFailed,
        GuardStep::Upstream,
        Some(&admitted.target.host().bare()),
        e.to_string(),
    );
    match e.address() {
        Some(addr) => failed.at(addr),
        None => failed,
    }
}

/// Opens a connection to the admitted target: the first pinned address that
/// answers within the connect timeout. (The guard already refused the
/// sidecar's own listeners by address; a connection that still turns out to
/// loop back into it, through one of the host's own addresses, is refused
/// with `blocked_address`.)
pub(crate) async fn dial(
    sidecar: &Sidecar,
    admitted: &Admitted,
    settings: &ProxySettings,
) -> Result<TcpStream, EgressError> {
    admitted.unheld()?;
    let port = admitted.target.port_or_default();
    let host = admitted.target.host().bare();
    let loop_refusal = |addr: SocketAddr| {
        EgressError::new(
            EgressCode::BlockedAddress,
            GuardStep::AddressTable,
            Some(&host),
            "the address is the sidecar's own listener",
        )
        .at(addr)
    };
    let policy = sidecar.client.guard().policy();
    let via: &Via = &sidecar.via;
    let direct = matches!(via, Via::Direct);
    let mut last = DialError::NoAddress;
    for ip in &admitted.addrs {
        let addr = SocketAddr::new(*ip, port);
        let attempt = async {
            via.connect(addr).await.map_err(|e| match e {
                ViaError::Connect(source) => DialError::Connect { addr, source },
                ViaError::Upstream(e) => DialError::Upstream(e),
                ViaError::Unusable(why) => DialError::Unusable(why),
            })
        };
        match tokio::time::timeout(settings.connect_timeout, attempt).await {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                // The same host (peer address = our own address) on one of
                // our ports is a loop too, whatever address named it.
                if direct
                    && policy.has_own_listeners()
                    && let (Ok(peer), Ok(local)) = (stream.peer_addr(), stream.local_addr())
                    && policy.is_loop(local, peer)
                {
                    return Err(loop_refusal(peer));
                }
                return Ok(stream);
            }
            Ok(Err(e)) => last = e,
            Err(_) => {
                last = DialError::TimedOut {
                    addr,
                    after: settings.connect_timeout,
                }
            }
        }
    }
    Err(failed(admitted, &last))
}
