//! `airlock egress check`: the egress guard's decision for one URL, for
//! operators debugging a policy and for external test suites.
//!
//! Exit codes: 0 allow, 1 refuse, 2 usage error.

use std::net::IpAddr;
use std::process::ExitCode;
use std::sync::Arc;

use airlock_egress::{
    AuthorizedUris, CallRules, DnsServerResolver, EgressPolicy, Guard, Intent, Resolve,
    RuleRefusal, RuleSpec, Rules, StaticResolver, SystemResolver,
};
use clap::{Args, Subcommand};
use serde::Serialize;

#[derive(Subcommand)]
pub enum EgressCommand {
    /// Print the guard's decision for URL: allow or refuse, the code, the
    /// guard that tripped and the addresses the connection would be pinned to.
    Check(CheckArgs),
}

#[derive(Args)]
pub struct CheckArgs {
    /// An `authorized_uris` entry (repeatable).
    #[arg(long = "authorized-uri", value_name = "PATTERN")]
    authorized_uris: Vec<String>,
    /// Allow any destination that passes the SSRF checks (ignored for credentialed calls).
    #[arg(long)]
    allow_all_uris: bool,
    /// The call carries a credential (the default).
    #[arg(long, conflicts_with = "uncredentialed")]
    credentialed: bool,
    /// The call carries no credential.
    #[arg(long)]
    uncredentialed: bool,
    /// An operator-trusted internal host, as in EGRESS_ALLOW_INTERNAL_HOSTS (repeatable).
    #[arg(long = "allow-internal-host", value_name = "HOST")]
    allow_internal_hosts: Vec<String>,
    /// Fixed DNS answers for HOST; no other lookup is made for it (repeatable).
    #[arg(long = "resolve", value_name = "HOST=IP[,IP…]")]
    resolve: Vec<String>,
    /// Ask this nameserver (ip or ip:port) instead of the system resolver.
    #[arg(long, value_name = "ADDR")]
    dns_server: Option<String>,
    /// The request's method, judged by the L7 rules (`--rule`).
    #[arg(long, value_name = "METHOD", default_value = "GET")]
    method: String,
    /// An L7 rule narrowing the entries, as JSON (`{"host":"https://a.com",
    /// "access":"read-only","paths":["/v1/**"]}`; repeatable).
    #[arg(long = "rule", value_name = "JSON")]
    rules: Vec<String>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    /// The target URL.
    url: String,
}

#[derive(Serialize)]
struct Decision {
    decision: &'static str,
    code: Option<&'static str>,
    message: String,
    addresses: Vec<IpAddr>,
    /// The L7 rule that refused, and what it lacked.
    #[serde(skip_serializing_if = "Option::is_none")]
    rule: Option<RuleRefusal>,
}

/// The `--authorized-uri` entries narrowed by the `--rule`s, with the
/// entries' load-time findings printed.
fn authorized_of(args: &CheckArgs) -> Result<AuthorizedUris, String> {
    let specs = args
        .rules
        .iter()
        .map(|r| serde_json::from_str::<RuleSpec>(r).map_err(|e| format!("--rule {r}: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    let rules = Rules::compile(&specs).map_err(|e| format!("--rule: {e}"))?;
    let authorized = AuthorizedUris::parse(&args.authorized_uris).with_rules(Arc::new(rules));
    for d in authorized.diagnostics() {
        let what = if d.matches_nothing {
            "matches nothing"
        } else {
            "warning"
        };
        eprintln!("authorized_uris entry {:?} {what}: {}", d.entry, d.reason);
    }
    Ok(authorized)
}

fn usage_error(msg: String) -> ExitCode {
    eprintln!("error: {msg}");
    ExitCode::from(2)
}

pub fn run(cmd: EgressCommand) -> ExitCode {
    match cmd {
        EgressCommand::Check(args) => check(args),
    }
}

fn check(args: CheckArgs) -> ExitCode {
    let fallback: Arc<dyn Resolve> = match &args.dns_server {
        Some(s) => match DnsServerResolver::parse_addr(s).and_then(DnsServerResolver::new) {
            Ok(r) => Arc::new(r),
            Err(e) => return usage_error(format!("--dns-server: {e}")),
        },
        None => Arc::new(SystemResolver),
    };
    let mut resolver = StaticResolver::new().with_fallback(fallback);
    for spec in &args.resolve {
        if let Err(e) = resolver.insert_spec(spec) {
            return usage_error(format!("--resolve: {e}"));
        }
    }
    let mut policy = EgressPolicy::new();
    policy.allow_internal_hosts(args.allow_internal_hosts.iter().map(String::as_str));
    let authorized = match authorized_of(&args) {
        Ok(a) => a,
        Err(e) => return usage_error(e),
    };
    let Ok(method) = http::Method::from_bytes(args.method.as_bytes()) else {
        return usage_error(format!("--method {:?} is not an HTTP method", args.method));
    };
    let rules = CallRules {
        authorized: &authorized,
        allow_all_uris: args.allow_all_uris,
        credentialed: !args.uncredentialed,
    };
    let guard = Guard::new(policy, Arc::new(resolver));
    let runtime = match super::current_thread_runtime() {
        Ok(r) => r,
        Err(e) => return usage_error(format!("cannot start the async runtime: {e}")),
    };
    let outcome = runtime.block_on(guard.admit_url(&args.url, Intent::Request(&method), &rules));
    let (decision, exit) = match outcome {
        Ok(a) => (
            Decision {
                decision: "allow",
                code: None,
                message: if a.internal {
                    format!(
                        "{} is allowed (operator-trusted internal host; addresses not judged)",
                        a.target
                    )
                } else {
                    format!("{} is allowed", a.target)
                },
                addresses: a.addrs,
                rule: None,
            },
            ExitCode::SUCCESS,
        ),
        Err(e) => (
            Decision {
                decision: "refuse",
                code: Some(e.code.as_str()),
                message: format!(
                    "refused by the {} guard{}: {}",
                    e.guard.as_str(),
                    e.host
                        .as_deref()
                        .map(|h| format!(" for host {h}"))
                        .unwrap_or_default(),
                    e.detail
                ),
                addresses: Vec::new(),
                rule: e.rule.map(|r| *r),
            },
            ExitCode::from(1),
        ),
    };
    if args.json {
        match serde_json::to_string(&decision) {
            Ok(s) => super::out::outln!("{s}"),
            Err(e) => return usage_error(format!("cannot print JSON: {e}")),
        }
    } else {
        super::out::outln!("decision:  {}", decision.decision);
        if let Some(code) = decision.code {
            super::out::outln!("code:      {code}");
        }
        super::out::outln!("message:   {}", decision.message);
        let addrs: Vec<String> = decision.addresses.iter().map(ToString::to_string).collect();
        super::out::outln!(
            "addresses: {}",
            if addrs.is_empty() {
                "-".into()
            } else {
                addrs.join(", ")
            }
        );
    }
    exit
}
