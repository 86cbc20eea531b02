//! The `airlock` crate's one test binary: end-to-end suites that drive the
//! real `airlock` binary (a module a suite), sharing `tests/support`, and
//! the hostile agents of `tests/agents`. `cargo test -p airlock --test suite
//! -- boundary::` runs one suite.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

#[path = "../support/mod.rs"]
mod support;

mod agent_errors;
mod boundary;
mod budgets;
mod cli_conventions;
mod connections_canary;
mod credential_encodings;
mod docker_backend;
mod docker_pool;
mod docker_runs;
mod docs;
mod egress_check;
mod integrity;
mod keys_reencrypt;
mod l7_rules;
mod live_policy_paths;
mod local_runner;
mod microvm;
mod microvm_pool;
mod platform_api;
mod provider_keys;
mod proxy_inject;
mod remote_mcp;
mod run_lifecycle;
mod run_record;
mod sandbox_escape;
mod sandbox_host;
mod serve_api;
mod serve_approval_hooks;
mod serve_approvals;
mod serve_audit;
mod serve_console;
mod serve_files;
mod serve_fleet;
mod serve_holds;
mod serve_identity;
mod serve_metrics;
mod serve_policy;
mod serve_policy_paths;
mod serve_proxies;
mod serve_run_end;
mod serve_runs;
mod serve_tenants;
mod serve_traces;
mod sidecar_basics;
mod sidecar_egress_log;
mod sidecar_llm;
mod sidecar_mcp;
mod sidecar_proxy;
mod signing_tools;
mod slowloris;
mod transparent;
mod transparent_records;
