//! The egress crate's test binary: the guarded client against hostile
//! upstreams, every spelling of an address, streaming. (`proxy_env.rs` is a
//! binary of its own: it sets process environment variables, which no other
//! test's threads may see.)
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

#[path = "../support/mod.rs"]
mod support;

mod client;
mod spellings;
mod streaming;
mod upstream;
