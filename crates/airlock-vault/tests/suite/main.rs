//! The vault crate's test binary: envelopes (fixtures, a Python
//! cross-implementation, properties) and token signing.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

mod envelope;
mod signing;
