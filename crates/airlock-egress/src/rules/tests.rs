//! The L7 rules from the attacker's side: a method or path slipped past a
//! rule by case, dot segments, encoded separators, empty segments or the
//! query; and the legitimate requests beside each.

use http::Method;

use super::*;

fn spec(host: &str, access: Option<Preset>, methods: &[&str], paths: &[&str]) -> RuleSpec {
    RuleSpec {
        id: None,
        host: host.into(),
        access,
        methods: methods.iter().map(|m| (*m).to_owned()).collect(),
        paths: paths.iter().map(|p| (*p).to_owned()).collect(),
        query: QuerySpec::Unset,
        action: Action::Allow,
        timeout: None,
    }
}

fn t(url: &str) -> Target {
    Target::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"))
}

/// The decision of `allow` rules, which never hold.
fn judge(rules: &Rules, method: &str, url: &str) -> Result<(), RuleRefusal> {
    decide(rules, method, url).map(|hold| assert_eq!(hold, None, "{method} {url}"))
}

fn decide(rules: &Rules, method: &str, url: &str) -> Result<Option<Hold>, RuleRefusal> {
    let m = Method::from_bytes(method.as_bytes()).unwrap_or_else(|e| panic!("{method}: {e}"));
    rules.judge(&t(url), Intent::Request(&m))
}

fn read_only_repos() -> Rules {
    Rules::compile(&[spec(
        "https://api.github.com",
        Some(Preset::ReadOnly),
        &[],
        &["/repos/*/issues", "/repos/*/issues/**"],
    )])
    .unwrap()
}

#[test]
fn presets_name_their_methods() {
    let r = |p| Rules::compile(&[spec("https://a.com", Some(p), &[], &[])]).unwrap();
    for m in ["GET", "HEAD", "OPTIONS"] {
        assert!(
            judge(&r(Preset::ReadOnly), m, "https://a.com/x").is_ok(),
            "{m}"
        );
    }
    for m in ["POST", "PUT", "PATCH", "DELETE"] {
        let e = judge(&r(Preset::ReadOnly), m, "https://a.com/x").unwrap_err();
        assert_eq!(e.missing, Missing::Method { method: m.into() });
        assert_eq!(e.rule, "rules[0]");
    }
    for m in ["GET", "POST", "PUT", "PATCH"] {
        assert!(
            judge(&r(Preset::ReadWrite), m, "https://a.com/x").is_ok(),
            "{m}"
        );
    }
    assert!(judge(&r(Preset::ReadWrite), "DELETE", "https://a.com/x").is_err());
    for m in ["GET", "DELETE", "PROPFIND"] {
        assert!(judge(&r(Preset::Full), m, "https://a.com/x").is_ok(), "{m}");
    }
}

#[test]
fn hosts_without_a_rule_are_the_lists_alone() {
    let rules = read_only_repos();
    assert!(judge(&rules, "DELETE", "https://uploads.github.com/anything").is_ok());
    assert!(judge(&rules, "DELETE", "http://api.github.com/x").is_ok());
    assert!(judge(&rules, "DELETE", "https://api.github.com:8443/x").is_ok());
}

#[test]
fn legitimate_requests_pass() {
    let rules = read_only_repos();
    for (m, url) in [
        ("GET", "https://api.github.com/repos/a/issues"),
        ("HEAD", "https://api.github.com/repos/a/issues/1"),
        ("GET", "https://API.GitHub.com./repos/a/issues?state=open"),
        ("GET", "https://api.github.com/repos/a/issues/1/comments"),
    ] {
        assert!(judge(&rules, m, url).is_ok(), "{m} {url}");
    }
}

#[test]
fn method_case_and_head_vs_get() {
    let rules = read_only_repos();
    // Methods are case-sensitive tokens: `get` is an extension method.
    let e = judge(&rules, "get", "https://api.github.com/repos/a/issues").unwrap_err();
    assert_eq!(
        e.missing,
        Missing::Method {
            method: "get".into()
        }
    );
    assert!(judge(&rules, "Delete", "https://api.github.com/repos/a/issues").is_err());
    // A rule naming HEAD does not admit GET (or the other way around).
    let head_only = Rules::compile(&[spec("https://a.com", None, &["HEAD"], &[])]).unwrap();
    assert!(judge(&head_only, "HEAD", "https://a.com/x").is_ok());
    let e = judge(&head_only, "GET", "https://a.com/x").unwrap_err();
    assert_eq!(
        e.missing,
        Missing::Method {
            method: "GET".into()
        }
    );
    let get_only = Rules::compile(&[spec("https://a.com", None, &["GET"], &[])]).unwrap();
    assert!(judge(&get_only, "HEAD", "https://a.com/x").is_err());
}

#[test]
fn paths_slipped_past_a_rule_are_refused() {
    let rules = read_only_repos();
    for url in [
        // Case: paths are case-sensitive.
        "https://api.github.com/REPOS/a/issues",
        // Dot segments, as written and encoded (the parser resolves them first).
        "https://api.github.com/repos/a/issues/../../../admin",
        "https://api.github.com/repos/a/issues/%2e%2e/%2E%2E/%2e%2e/admin",
        // Encoded separators a server decodes.
        "https://api.github.com/repos/a/issues/..%2f..%2f..%2fadmin",
        "https://api.github.com/repos/a%2f..%2f..%2fadmin/issues",
        "https://api.github.com/repos/a%252f..%252f..%252fadmin/issues",
        "https://api.github.com/repos/a/issues%5c..%5c..%5c..%5cadmin",
        // Empty segments a server collapses (`/repos/issues` is another resource).
        "https://api.github.com/repos//issues",
        // Another repository's secrets beside it.
        "https://api.github.com/repos/a/secrets",
        "https://api.github.com/",
    ] {
        let e = judge(&rules, "GET", url).unwrap_err();
        assert!(matches!(e.missing, Missing::Path { .. }), "{url}: {e:?}");
    }
}

#[test]
fn the_query_is_not_a_path() {
    // `**` in a rule's path never reaches into the query, and a path in the
    // query is not the request's path.
    let rules = Rules::compile(&[spec(
        "https://a.com",
        Some(Preset::Full),
        &[],
        &["/public/**"],
    )])
    .unwrap();
    assert!(judge(&rules, "GET", "https://a.com/public/x?next=/private").is_ok());
    assert!(judge(&rules, "GET", "https://a.com/private?/public/x").is_err());
    assert!(judge(&rules, "GET", "https://a.com/private#/public/x").is_err());
    assert!(judge(&rules, "GET", "https://a.com/private%3F/public/x").is_err());
}

#[test]
fn query_constraints() {
    let mut s = spec("https://a.com", Some(Preset::ReadOnly), &[], &[]);
    s.query = QuerySpec::Names(vec!["page".into(), "per_page".into()]);
    s.id = Some("paged".into());
    let rules = Rules::compile(&[s]).unwrap();
    assert!(judge(&rules, "GET", "https://a.com/x?page=2&per_page=50").is_ok());
    assert!(judge(&rules, "GET", "https://a.com/x").is_ok());
    for (url, param) in [
        ("https://a.com/x?page=2&token=t", "token"),
        // `;` separates parameters on many servers.
        ("https://a.com/x?page=2;token=t", "token"),
        // An encoded name is the name it decodes to.
        ("https://a.com/x?page=1&%74oken=t", "token"),
        ("https://a.com/x?Page=1", "Page"),
    ] {
        let e = judge(&rules, "GET", url).unwrap_err();
        assert_eq!(e.rule, "paged");
        assert_eq!(
            e.missing,
            Missing::Query {
                parameter: param.into()
            },
            "{url}"
        );
    }
    let mut none = spec("https://a.com", Some(Preset::ReadOnly), &[], &[]);
    none.query = QuerySpec::Keyword(QueryKeyword::None);
    let none = Rules::compile(&[none]).unwrap();
    assert!(judge(&none, "GET", "https://a.com/x").is_ok());
    assert!(judge(&none, "GET", "https://a.com/x?a").is_err());
}

#[test]
fn the_closest_rule_is_named() {
    let rules = Rules::compile(&[
        RuleSpec {
            id: Some("read".into()),
            ..spec("https://a.com", Some(Preset::ReadOnly), &[], &["/**"])
        },
        RuleSpec {
            id: Some("write-items".into()),
            ..spec("https://a.com", None, &["POST"], &["/items"])
        },
    ])
    .unwrap();
    assert!(judge(&rules, "POST", "https://a.com/items").is_ok());
    let e = judge(&rules, "POST", "https://a.com/users").unwrap_err();
    assert_eq!(e.rule, "write-items");
    assert_eq!(
        e.missing,
        Missing::Path {
            path: "/users".into()
        }
    );
    let e = judge(&rules, "DELETE", "https://a.com/items").unwrap_err();
    assert_eq!(e.rule, "read");
    assert_eq!(
        e.missing,
        Missing::Method {
            method: "DELETE".into()
        }
    );
}

#[test]
fn tunnels_pass_only_rules_that_need_not_see_inside() {
    let rules = read_only_repos();
    let e = rules
        .judge(&t("https://api.github.com/"), Intent::Tunnel)
        .unwrap_err();
    assert_eq!(e.missing, Missing::Tunnel);
    assert!(rules.sees_inside(&t("https://api.github.com/")));
    assert!(!rules.sees_inside(&t("https://pypi.org/")));
    assert!(rules.judge(&t("https://pypi.org/"), Intent::Tunnel).is_ok());
    let open = Rules::compile(&[spec("https://a.com", Some(Preset::Full), &[], &[])]).unwrap();
    assert!(!open.sees_inside(&t("https://a.com/")));
    assert!(open.judge(&t("https://a.com/"), Intent::Tunnel).is_ok());
}

#[test]
fn wildcard_hosts_and_ports() {
    let rules = Rules::compile(&[spec(
        "https://*.example.com:*",
        Some(Preset::ReadOnly),
        &[],
        &[],
    )])
    .unwrap();
    assert!(judge(&rules, "GET", "https://a.example.com:8443/x").is_ok());
    assert!(judge(&rules, "POST", "https://a.example.com:8443/x").is_err());
    assert!(judge(&rules, "POST", "https://example.com/x").is_ok());
}

#[test]
fn rules_that_cannot_load_are_refused() {
    let bad = [
        (
            spec("https://a.com/x", Some(Preset::Full), &[], &[]),
            "without a path",
        ),
        (spec("a.com", Some(Preset::Full), &[], &[]), "scheme"),
        (spec("https://a.com", None, &[], &[]), "exactly one"),
        (
            spec("https://a.com", Some(Preset::Full), &["GET"], &[]),
            "exactly one",
        ),
        (spec("https://a.com", None, &["G ET"], &[]), "method token"),
        (
            spec("https://a.com", Some(Preset::Full), &[], &["x"]),
            "start with '/'",
        ),
        (
            spec("https://a.com", Some(Preset::Full), &[], &["/a?b"]),
            "start with '/'",
        ),
        (
            spec("https://a.com", Some(Preset::Full), &[], &["/a/../b"]),
            "dot segment",
        ),
    ];
    for (s, why) in bad {
        let e = Rules::compile(std::slice::from_ref(&s)).unwrap_err();
        assert!(e.to_string().contains(why), "{s:?}: {e}");
    }
    let mut q = spec("https://a.com", Some(Preset::Full), &[], &[]);
    q.query = QuerySpec::Names(vec!["a=b".into()]);
    assert!(matches!(
        Rules::compile(&[q]),
        Err(RuleError::BadQueryName { .. })
    ));
    let twice = RuleSpec {
        id: Some("x".into()),
        ..spec("https://a.com", Some(Preset::Full), &[], &[])
    };
    assert!(matches!(
        Rules::compile(&[twice.clone(), twice]),
        Err(RuleError::DuplicateId(_))
    ));
}

#[test]
fn the_manifest_grammar_reads() {
    let doc = r#"
        id = "gh"
        host = "https://api.github.com"
        access = "read-only"
        paths = ["/repos/**"]
        query = ["page"]
    "#;
    let s: RuleSpec = toml_like(doc);
    assert_eq!(s.access, Some(Preset::ReadOnly));
    assert_eq!(s.query, QuerySpec::Names(vec!["page".into()]));
    let s: RuleSpec =
        serde_json::from_str(r#"{"host":"https://a.com","methods":["GET"],"query":"none"}"#)
            .unwrap();
    assert_eq!(s.query, QuerySpec::Keyword(QueryKeyword::None));
    let back = serde_json::to_string(&s).unwrap();
    assert_eq!(serde_json::from_str::<RuleSpec>(&back).unwrap(), s);
    assert!(
        serde_json::from_str::<RuleSpec>(r#"{"host":"https://a.com","access":"write"}"#).is_err()
    );
    assert!(
        serde_json::from_str::<RuleSpec>(r#"{"host":"https://a.com","verbs":["GET"]}"#).is_err()
    );
}

/// The grammar through JSON (the crate has no TOML reader; the manifest's
/// TOML maps onto the same serde shape).
fn toml_like(doc: &str) -> RuleSpec {
    let mut obj = serde_json::Map::new();
    for line in doc.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let (k, v) = line.split_once(" = ").unwrap();
        obj.insert(k.to_owned(), serde_json::from_str(v).unwrap());
    }
    serde_json::from_value(serde_json::Value::Object(obj)).unwrap()
}

fn ask(id: &str, methods: &[&str], paths: &[&str], timeout: Option<u64>) -> RuleSpec {
    RuleSpec {
        id: Some(id.into()),
        action: Action::Ask,
        timeout,
        ..spec("https://api.github.com", None, methods, paths)
    }
}

#[test]
fn an_ask_rule_holds_what_it_admits_and_an_allow_rule_beside_it_wins() {
    let rules = Rules::compile(&[
        RuleSpec {
            id: Some("read".into()),
            ..spec("https://api.github.com", Some(Preset::ReadOnly), &[], &[])
        },
        ask("close", &["PATCH"], &["/repos/*/*/issues/*"], Some(30)),
    ])
    .unwrap();
    assert_eq!(
        decide(&rules, "GET", "https://api.github.com/repos/o/r/issues/7"),
        Ok(None)
    );
    assert_eq!(
        decide(&rules, "PATCH", "https://api.github.com/repos/o/r/issues/7"),
        Ok(Some(Hold {
            rule: "close".into(),
            timeout: Duration::from_secs(30),
        }))
    );
    // What the ask rule does not admit is refused, never held.
    let e = decide(&rules, "PATCH", "https://api.github.com/repos/o/r/pulls/7").unwrap_err();
    assert_eq!(e.rule, "close");
    assert!(matches!(e.missing, Missing::Path { .. }), "{e:?}");
    let e = decide(
        &rules,
        "DELETE",
        "https://api.github.com/repos/o/r/issues/7",
    )
    .unwrap_err();
    assert!(matches!(e.missing, Missing::Method { .. }), "{e:?}");
    // A dot segment or an encoded separator does not slip into the hold's
    // paths, nor out of them to an allow rule.
    assert!(
        decide(
            &rules,
            "PATCH",
            "https://api.github.com/repos/o/r/issues/..%2f..%2fadmin"
        )
        .is_err()
    );
}

#[test]
fn an_ask_rule_sees_inside_and_a_plain_tunnel_is_refused() {
    let rules = Rules::compile(&[ask("all", &[], &[], None)]);
    // `methods` is empty and `access` unset: refused as any rule would be.
    assert!(matches!(rules, Err(RuleError::Methods { .. })));
    let rules = Rules::compile(&[RuleSpec {
        access: Some(Preset::Full),
        ..ask("all", &[], &[], None)
    }])
    .unwrap();
    assert!(rules.any_sees_inside());
    assert_eq!(
        decide(&rules, "GET", "https://api.github.com/x"),
        Ok(Some(Hold {
            rule: "all".into(),
            timeout: DEFAULT_ASK_TIMEOUT,
        }))
    );
    let e = rules
        .judge(&t("https://api.github.com/"), Intent::Tunnel)
        .unwrap_err();
    assert_eq!(e.missing, Missing::Tunnel);
}

#[test]
fn an_ask_timeout_is_bounded_and_only_for_ask() {
    let full = |timeout, action| RuleSpec {
        access: Some(Preset::Full),
        timeout,
        action,
        ..spec("https://a.com", None, &[], &[])
    };
    for bad in [0, 3601, u64::MAX] {
        assert!(matches!(
            Rules::compile(&[full(Some(bad), Action::Ask)]),
            Err(RuleError::TimeoutOutOfBounds { .. })
        ));
    }
    for good in [1, 3600] {
        assert!(Rules::compile(&[full(Some(good), Action::Ask)]).is_ok());
    }
    assert!(matches!(
        Rules::compile(&[full(Some(5), Action::Allow)]),
        Err(RuleError::TimeoutWithoutAsk { .. })
    ));
    let spec: RuleSpec = serde_json::from_str(
        r#"{"host":"https://a.com","access":"full","action":"ask","timeout":9}"#,
    )
    .unwrap();
    assert_eq!(spec.action, Action::Ask);
    assert_eq!(spec.timeout, Some(9));
    assert!(
        serde_json::from_str::<RuleSpec>(
            r#"{"host":"https://a.com","access":"full","action":"maybe"}"#
        )
        .is_err()
    );
}
