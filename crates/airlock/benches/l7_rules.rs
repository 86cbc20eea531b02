//! The egress guard's decision time under L7 rules: 100 rules beside 1
//! rule and beside none, measured in the same run, rounds alternated.
//!
//! `cargo bench -p airlock --bench l7_rules`
//!
//! Each figure is the synchronous decision ([`EgressPolicy::check`]:
//! `authorized_uris`, the credential rules, the L7 rules, blocked names) of
//! one credentialed `GET` the list allows, in nanoseconds per decision
//! (p50 and p99 of the rounds' means). "100 rules, one host" puts the rule
//! that admits the request last, behind 99 rules on the same host with
//! other paths (every one is judged); "100 rules, 100 hosts" spreads them
//! over hosts, as a manifest with many integrations' hosts would.
#![allow(clippy::unwrap_used)] // a bench may unwrap: a panic is its failure

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_egress::{
    AuthorizedUris, CallRules, EgressPolicy, Intent, Preset, RuleSpec, Rules, Target,
};
use airlock_test_support::bench::{load, pcts};

const URL: &str = "https://api.github.com/repos/airlock/airlock/issues?state=open&page=2";
const ROUNDS: usize = 60;
const PER_ROUND: u32 = 20_000;

fn rule(host: &str, paths: &[String]) -> RuleSpec {
    RuleSpec {
        id: None,
        host: host.into(),
        access: Some(Preset::ReadOnly),
        methods: vec![],
        paths: paths.to_vec(),
        query: airlock_egress::QuerySpec::Names(vec!["state".into(), "page".into()]),
        action: airlock_egress::Action::Allow,
        timeout: None,
    }
}

fn list(specs: &[RuleSpec]) -> AuthorizedUris {
    AuthorizedUris::parse(&["https://api.github.com/**", "https://*.example.com/**"])
        .with_rules(Arc::new(Rules::compile(specs).unwrap()))
}

fn cases() -> Vec<(&'static str, AuthorizedUris)> {
    let gh = "https://api.github.com";
    let admit = vec![
        "/repos/*/*/issues".to_owned(),
        "/repos/*/*/issues/**".to_owned(),
    ];
    let one = vec![rule(gh, &admit)];
    let mut same_host: Vec<RuleSpec> = (0..99)
        .map(|i| rule(gh, &[format!("/orgs/o{i}/**"), format!("/users/u{i}")]))
        .collect();
    same_host.push(rule(gh, &admit));
    let mut many_hosts: Vec<RuleSpec> = (0..99)
        .map(|i| rule(&format!("https://h{i}.example.com"), &admit))
        .collect();
    many_hosts.push(rule(gh, &admit));
    vec![
        ("no rules", list(&[])),
        ("1 rule", list(&one)),
        ("100 rules, one host", list(&same_host)),
        ("100 rules, 100 hosts", list(&many_hosts)),
    ]
}

/// The mean time of one decision over `PER_ROUND` decisions.
fn round(policy: &EgressPolicy, target: &Target, authorized: &AuthorizedUris) -> Duration {
    let rules = CallRules {
        authorized,
        allow_all_uris: false,
        credentialed: true,
    };
    let get = http::Method::GET;
    let start = Instant::now();
    for _ in 0..PER_ROUND {
        let d = policy.check(black_box(target), Intent::Request(&get), &rules);
        black_box(d.is_ok());
    }
    start.elapsed() / PER_ROUND
}

fn main() {
    let policy = EgressPolicy::new();
    let target = Target::parse(URL).unwrap();
    let cases = cases();
    for (name, authorized) in &cases {
        let rules = CallRules {
            authorized,
            allow_all_uris: false,
            credentialed: true,
        };
        let get = http::Method::GET;
        assert!(
            policy.check(&target, Intent::Request(&get), &rules).is_ok(),
            "{name}"
        );
        let delete = http::Method::DELETE;
        let refused = policy
            .check(&target, Intent::Request(&delete), &rules)
            .is_err();
        assert_eq!(refused, *name != "no rules", "{name}");
    }
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); cases.len()];
    for _ in 0..ROUNDS {
        // Alternated: every case runs once per round, so drift in the
        // machine's load falls on all of them alike.
        for (i, (_, authorized)) in cases.iter().enumerate() {
            times[i].push(round(&policy, &target, authorized));
        }
    }
    println!(
        "l7_rules: the guard's decision, GET {URL} (load {})",
        load()
    );
    println!("{:<24} {:>10} {:>10}", "rules", "p50 ns", "p99 ns");
    for ((name, _), t) in cases.iter().zip(&times) {
        let [p50, _, p99] = pcts(t);
        println!("{name:<24} {:>10} {:>10}", p50.as_nanos(), p99.as_nanos());
    }
}
