//! The transparent plane: tools that ignore `HTTP(S)_PROXY` (many Go and
//! Node programs, git over some transports, gRPC clients) still get out,
//! through the same guard and into the same egress log as the forward
//! proxy's. This module is its sandbox half; the sidecar's half is
//! `airlock-sidecar`'s `proxy::transparent`; the constants both read are
//! `airlock_platform_api::transparent`.
//!
//! # Design
//!
//! A namespace sandbox has loopback only and no iptables; the runtime, its
//! first process, already serves the agent's local endpoints there and
//! relays them to the sidecar's sockets. The plane adds three things, all
//! in the runtime, none needing a privilege the sandbox does not have:
//!
//! 1. **Names** ([`names`]): each name the sandbox asks for gets a synthetic
//!    address from `127.18.0.0/16`, fixed for the run (asking again gives
//!    the same one; the table is bounded). The range is inside loopback's
//!    `127/8`, which every network namespace routes to itself: no address,
//!    route or tun device to create (in a container, whose runtime cannot
//!    have `CAP_NET_ADMIN`, neither), and the guard refuses every `127/8`
//!    address as a destination, so a synthetic address never means a real
//!    host anywhere. (The benchmark range `198.18.0.0/15` would need an
//!    address added to `lo`, a privileged step in every backend.)
//! 2. **The responder** ([`dns`], UDP `127.0.0.53:53`, the one nameserver of
//!    the sandbox's `/etc/resolv.conf`): an `A` question gets the name's
//!    synthetic address; `AAAA` and every other type an empty answer
//!    (NOERROR, no records: clients fall back to `A`); an address literal
//!    or a name that is not a host name NXDOMAIN. Nothing is ever resolved
//!    for real here: the sidecar's guard resolves the name itself, pins
//!    what it judged, and a name's synthetic answer never changes, so DNS
//!    rebinding has nothing to rebind. Parsing and answers are
//!    `hickory-proto`'s.
//! 3. **The carrier** ([`carry`]): when the responder issues an address,
//!    before its answer leaves, a listener at that address on each port the
//!    plane carries (80, 443 and each port the run's rules name: a sandbox
//!    cannot listen on every port, and a connection to another port of a
//!    synthetic address is refused by the kernel like any closed port).
//!    Only issued addresses listen: every other address and port of the
//!    sandbox's loopback is as it was, and an address never issued refuses.
//!    The book is bounded so the listeners stay within the runtime's share
//!    of the sandbox's open files (past it: REFUSED). A connection is
//!    carried to the sidecar's forward proxy as `CONNECT name:port` with
//!    the token and `airlock-plane: transparent`, the client's bytes
//!    following at once. The sidecar reads the SNI or `Host` the client
//!    presents, refuses it unless it is that name, then treats the CONNECT
//!    exactly as the proxy's own (the listener's rules, interception with
//!    the run's CA where the run has it, resolve-and-pin, one egress
//!    record). Its answer head is read here: on `200` the bytes flow both
//!    ways; on a refusal the client's connection is closed.
//!
//! A docker agent's container has the same plane (under runc; the
//! container's part is `airlock-sandbox`'s `docker::plane`): `127/8` is its
//! own loopback's too, its `/etc/resolv.conf` names the responder first and
//! Docker's embedded resolver second, for this runtime's one lookup of its
//! sidecar's name, which [`start`]'s callers make before the responder
//! listens.
//!
//! What stays unreachable: every address outside loopback (the namespace
//! has no other route: a literal IP is `ENETUNREACH`), UDP to anything but
//! the responder (nothing else listens), synthetic addresses never issued,
//! and ports the plane does not carry. A run's local MCP runners get the
//! plane in their own sandboxes, carried to their own proxy listeners, so
//! each is judged under its integration's `authorized_uris`.
//!
//! Tools that honour the proxy variables keep using the proxy: they hand
//! the name to the proxy and never ask the responder. Both planes end in
//! the same egress record (source `proxy` or `runner`, method `CONNECT`).

pub mod carry;
pub mod dns;
pub mod names;

use std::sync::Arc;

use airlock_platform_api::transparent::{RESPONDER, TransparentPlane};
use secrecy::SecretString;

use crate::relay::Dial;

/// Starts the responder (for the sandbox's life); each name it issues
/// gets its listeners from the carrier. No responder is an error.
pub async fn start(
    plane: &TransparentPlane,
    proxy: Dial,
    token: SecretString,
) -> std::io::Result<()> {
    let carrier = Arc::new(carry::Carrier::new(plane.ports.clone(), proxy, token));
    dns::serve(RESPONDER, carrier).await
}
