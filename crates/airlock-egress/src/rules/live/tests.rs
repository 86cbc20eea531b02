//! The live policy's ceiling, from both sides: every narrowing a person may
//! ask for loads, nothing wider does, and a withdrawn rule's host is refused
//! rather than left to the list alone.

use std::collections::HashMap;
use std::sync::Arc;

use http::Method;

use super::*;
use crate::rules::{Action, Intent, Missing, Preset, QuerySpec, RuleRefusal};

fn spec(
    id: &str,
    host: &str,
    access: Option<Preset>,
    methods: &[&str],
    paths: &[&str],
) -> RuleSpec {
    RuleSpec {
        id: Some(id.to_owned()),
        host: host.to_owned(),
        access,
        methods: methods.iter().map(|m| (*m).to_owned()).collect(),
        paths: paths.iter().map(|p| (*p).to_owned()).collect(),
        query: QuerySpec::Unset,
        action: Action::Allow,
        timeout: None,
    }
}

fn manifest_specs() -> Vec<RuleSpec> {
    vec![
        spec(
            "api",
            "https://api.example",
            Some(Preset::ReadWrite),
            &[],
            &["/repos/**", "/user"],
        ),
        spec("any", "https://*.cdn.example", Some(Preset::Full), &[], &[]),
        spec(
            "only-get",
            "http://plain.example:8080",
            None,
            &["GET"],
            &["/a/**"],
        ),
    ]
}

fn manifest() -> Rules {
    Rules::compile(&manifest_specs()).unwrap()
}

fn judge(rules: &Rules, method: &str, url: &str) -> Result<(), RuleRefusal> {
    let m = Method::from_bytes(method.as_bytes()).unwrap();
    let held = rules.judge(&Target::parse(url).unwrap(), Intent::Request(&m))?;
    assert!(held.is_none(), "no rule here asks: {held:?}");
    Ok(())
}

fn beyond(live: &[RuleSpec]) -> String {
    match narrowed(&manifest(), live) {
        Err(LiveRuleError::Beyond { rule }) => rule,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn narrowings_load() {
    let ok = [
        spec(
            "a",
            "https://api.example",
            Some(Preset::ReadOnly),
            &[],
            &["/repos/**"],
        ),
        spec(
            "b",
            "https://api.example",
            None,
            &["GET", "POST"],
            &["/repos/acme/*", "/user"],
        ),
        spec(
            "c",
            "https://img.cdn.example",
            Some(Preset::ReadOnly),
            &[],
            &["/x"],
        ),
        spec("d", "http://plain.example:8080", None, &["GET"], &["/a/b"]),
        spec(
            "e",
            "https://API.example",
            Some(Preset::ReadWrite),
            &[],
            &["/repos/**", "/user"],
        ),
    ];
    for s in ok {
        narrowed(&manifest(), std::slice::from_ref(&s)).unwrap_or_else(|e| panic!("{s:?}: {e}"));
    }
    narrowed(&manifest(), &[]).unwrap();
}

#[test]
fn widenings_are_refused_naming_the_rule() {
    // A method the manifest's rule lacks (DELETE is not read-write's).
    assert_eq!(
        beyond(&[spec(
            "del",
            "https://api.example",
            Some(Preset::Full),
            &[],
            &["/repos/**"]
        )]),
        "del"
    );
    assert_eq!(
        beyond(&[spec(
            "del2",
            "https://api.example",
            None,
            &["DELETE"],
            &["/user"]
        )]),
        "del2"
    );
    // A path outside the manifest's.
    assert_eq!(
        beyond(&[spec(
            "root",
            "https://api.example",
            Some(Preset::ReadOnly),
            &[],
            &["/**"]
        )]),
        "root"
    );
    assert_eq!(
        beyond(&[spec(
            "sib",
            "https://api.example",
            Some(Preset::ReadOnly),
            &[],
            &["/users"]
        )]),
        "sib"
    );
    // A host no manifest rule names, and a wildcard wider than one.
    assert_eq!(
        beyond(&[spec(
            "other",
            "https://evil.example",
            Some(Preset::ReadOnly),
            &[],
            &[]
        )]),
        "other"
    );
    assert_eq!(
        beyond(&[spec(
            "wild",
            "https://*.example",
            Some(Preset::ReadOnly),
            &[],
            &[]
        )]),
        "wild"
    );
    // Another port, another scheme.
    assert_eq!(
        beyond(&[spec(
            "port",
            "http://plain.example:8081",
            None,
            &["GET"],
            &["/a/b"]
        )]),
        "port"
    );
    assert_eq!(
        beyond(&[spec(
            "tls",
            "https://plain.example:8080",
            None,
            &["GET"],
            &["/a/b"]
        )]),
        "tls"
    );
    // A query wider than the manifest's.
    let mut m = spec(
        "q",
        "https://api.example",
        Some(Preset::ReadOnly),
        &[],
        &["/user"],
    );
    m.query = QuerySpec::Names(vec!["page".into()]);
    let strict = Rules::compile(&[m.clone()]).unwrap();
    let mut wider = m.clone();
    wider.query = QuerySpec::Unset;
    assert!(matches!(
        narrowed(&strict, &[wider]),
        Err(LiveRuleError::Beyond { .. })
    ));
    assert!(narrowed(&strict, &[m]).is_ok());
    // A rule that does not load is refused as such.
    assert!(matches!(
        narrowed(
            &manifest(),
            &[spec("bad", "https://api.example", None, &[], &[])]
        ),
        Err(LiveRuleError::Rule(_))
    ));
}

/// The manifest narrowed to one read-only rule `ro` of api.example on `path`.
fn read_only_api(path: &str) -> Result<Rules, LiveRuleError> {
    narrowed(
        &manifest(),
        &[spec(
            "ro",
            "https://api.example",
            Some(Preset::ReadOnly),
            &[],
            &[path],
        )],
    )
}

#[test]
fn a_withdrawn_rule_refuses_its_host() {
    let live = read_only_api("/repos/**").unwrap();
    assert!(judge(&live, "GET", "https://api.example/repos/x").is_ok());
    let post = judge(&live, "POST", "https://api.example/repos/x").unwrap_err();
    assert_eq!(post.rule, "ro");
    assert!(matches!(post.missing, Missing::Method { .. }));
    let user = judge(&live, "GET", "https://api.example/user").unwrap_err();
    assert!(matches!(user.missing, Missing::Path { .. }));
    // The manifest's other rules were not named: their hosts are refused,
    // never left to the list alone; tunnels too.
    let cdn = judge(&live, "GET", "https://a.cdn.example/").unwrap_err();
    assert_eq!(
        (cdn.rule.as_str(), cdn.missing),
        ("any", Missing::Withdrawn)
    );
    let tunnel = live
        .judge(
            &Target::parse("https://a.cdn.example/").unwrap(),
            Intent::Tunnel,
        )
        .unwrap_err();
    assert_eq!(tunnel.missing, Missing::Withdrawn);
    // A host no manifest rule covers stays the list's alone.
    assert!(judge(&live, "DELETE", "https://elsewhere.example/").is_ok());
    // Reset: the manifest's rules as live rules decide as the manifest does.
    let reset = narrowed(&manifest(), &manifest_specs()).unwrap();
    for (m, u) in [
        ("POST", "https://api.example/user"),
        ("DELETE", "https://x.cdn.example/"),
        ("GET", "http://plain.example:8080/a/b"),
    ] {
        assert!(judge(&reset, m, u).is_ok(), "{m} {u}");
    }
    assert!(
        reset
            .judge(
                &Target::parse("https://x.cdn.example/").unwrap(),
                Intent::Tunnel
            )
            .is_ok()
    );
}

#[test]
fn one_swap_covers_every_list_and_a_read_keeps_its_snapshot() {
    let set = LiveRuleSet::new(HashMap::from([(
        "network".to_owned(),
        Arc::new(manifest()),
    )]));
    let network = set.list("network");
    let other = set.list("integration:gh");
    let before = network.load();
    assert!(judge(&before, "POST", "https://api.example/user").is_ok());
    assert!(other.load().is_empty());
    let ro = read_only_api("/user").unwrap();
    set.swap(HashMap::from([
        ("network".to_owned(), Arc::new(ro)),
        ("integration:gh".to_owned(), Arc::new(manifest())),
    ]));
    // The snapshot read before the swap still admits; every later read refuses.
    assert!(judge(&before, "POST", "https://api.example/user").is_ok());
    assert!(judge(&network.load(), "POST", "https://api.example/user").is_err());
    assert!(!other.load().is_empty());
}

/// A manifest rule that asks a person keeps asking under any live set: a
/// live rule within it that would let its requests go unasked is a
/// widening; one that asks, or asks where the manifest allowed, loads.
#[test]
fn a_rule_that_asks_cannot_be_turned_into_one_that_allows() {
    let ask = |id: &str| RuleSpec {
        action: Action::Ask,
        ..spec(id, "https://api.example", None, &["POST"], &["/repos/**"])
    };
    let manifest = Rules::compile(&[ask("post-asks")]).unwrap();
    let allow = spec(
        "post-free",
        "https://api.example",
        None,
        &["POST"],
        &["/repos/**"],
    );
    match narrowed(&manifest, &[allow]) {
        Err(LiveRuleError::Beyond { rule }) => assert_eq!(rule, "post-free"),
        other => panic!("an ask rule widened to allow: {other:?}"),
    }
    let live = narrowed(&manifest, &[ask("still-asks")]).unwrap();
    let m = Method::POST;
    let held = live
        .judge(
            &Target::parse("https://api.example/repos/a").unwrap(),
            Intent::Request(&m),
        )
        .unwrap();
    assert_eq!(held.map(|h| h.rule), Some("still-asks".to_owned()));
    // Narrowing an allowing rule into one that asks is within it.
    let asks_more = RuleSpec {
        action: Action::Ask,
        ..spec(
            "asks",
            "https://api.example",
            None,
            &["GET"],
            &["/repos/**"],
        )
    };
    assert!(narrowed(&manifest_for_allow(), &[asks_more]).is_ok());
}

fn manifest_for_allow() -> Rules {
    Rules::compile(&[spec(
        "api",
        "https://api.example",
        Some(Preset::ReadWrite),
        &[],
        &["/repos/**"],
    )])
    .unwrap()
}
