//! What a sandbox wrote, handled without trusting it: [`file`] reads a file
//! it could have written or replaced (no symlink, no FIFO, bounded), and
//! [`terminal`] makes its text safe to print to the operator's terminal.
//!
//! Both the platform (through `airlock-sandbox`) and the in-sandbox runtime
//! use them; this crate stays small so the runtime links none of the
//! sandbox backends.

#![forbid(unsafe_code)]

pub mod file;
pub mod terminal;
