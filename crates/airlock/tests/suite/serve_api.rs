//! `airlock serve`'s API from a client's side: the OpenAPI document against
//! the routes, typed errors for bad input, rate limits, and the tenants'
//! isolation, attacked with another organization's key on every route.

use serde_json::{Value, json};

use crate::support::serve::{Server, agent_body, base_env, create_org, wait_for};

struct Two {
    _home: tempfile::TempDir,
    s: Server,
    env: Vec<(String, String)>,
}

fn start(extra: &[(&str, &str)]) -> Two {
    let home = tempfile::Builder::new()
        .prefix("airlock-serve-")
        .tempdir()
        .unwrap();
    let mut env = base_env(home.path(), None);
    for (k, v) in extra {
        env.push(((*k).into(), (*v).into()));
    }
    // The API tests run no agent that needs isolation: the process backend
    // keeps them independent of the host's sandbox support.
    let s = Server::start(&env, "process", home.path().join("serve.log"));
    Two {
        _home: home,
        s,
        env,
    }
}

#[test]
fn the_openapi_document_lists_exactly_the_routes_and_each_answers() {
    let t = start(&[]);
    let (st, doc) = t.s.call("GET", "/v1/openapi.json", None, None);
    assert_eq!(st, 200);
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = doc["paths"].as_object().unwrap();
    let mut documented = Vec::new();
    for (p, ops) in paths {
        for m in ops.as_object().unwrap().keys() {
            documented.push((m.clone(), p.clone()));
        }
    }
    documented.sort();
    let mut table: Vec<(String, String)> = airlock_server::openapi::ROUTES
        .iter()
        .map(|r| (r.method.to_owned(), r.path.to_owned()))
        .collect();
    table.sort();
    assert_eq!(documented, table, "the document and the route table differ");
    // Every route exists on the server: without a key, a keyed route is a
    // 401 (never a 404 or 405); an open one answers.
    for r in airlock_server::openapi::ROUTES {
        let path = r
            .path
            .replace("{id}", "x")
            .replace("{name}", "x")
            .replace("{result_id}", "x");
        let (st, body) = t.s.call(
            &r.method.to_uppercase(),
            &path,
            None,
            r.body.map(|_| json!({})).as_ref(),
        );
        if r.auth {
            assert_eq!(
                st, 401,
                "{} {} without a key: {st} {body}",
                r.method, r.path
            );
            assert_eq!(body["error"]["code"], "unauthorized");
        } else if r.path == "/v1/runs/{id}/artifacts/download" {
            // Open, but only with a signed URL's query: a well-formed one
            // that is not signed is refused by the route itself.
            let (st, body) = t.s.call(
                "GET",
                &format!("{path}?path=a&expires=1&signature={}", "0".repeat(64)),
                None,
                None,
            );
            assert_eq!(
                (st, body["error"]["code"].as_str()),
                (403, Some("signature_expired")),
                "{body}"
            );
        } else {
            assert_eq!(st, 200, "{} {}: {st} {body}", r.method, r.path);
        }
        // Each documented body and answer schema exists.
        for name in r.body.into_iter().chain(r.answer) {
            assert!(
                doc["components"]["schemas"][name].is_object(),
                "schema {name}"
            );
        }
    }
    // An unlisted route, or a listed one with another method, is a typed error.
    let (st, body) = t.s.call("GET", "/v1/nope", None, None);
    assert_eq!(
        (st, body["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
    let (st, body) = t.s.call("PATCH", "/v1/runs", None, None);
    assert_eq!(
        (st, body["error"]["code"].as_str()),
        (405, Some("method_not_allowed"))
    );
}

#[test]
fn bad_input_gets_a_typed_error_and_changes_nothing() {
    let t = start(&[]);
    let (_, key) = create_org(&t.env, "Acme", &[]);
    let k = Some(key.as_str());
    let s = &t.s;
    let code = |(st, v): (u16, Value)| (st, v["error"]["code"].as_str().unwrap_or("").to_owned());
    // Malformed JSON, a wrong content type, unknown and missing fields.
    let (st, _, b) = s.raw(
        "POST",
        "/v1/runs",
        k,
        Some("{\"agent\": "),
        "application/json",
    );
    assert_eq!(st, 400, "{}", String::from_utf8_lossy(&b));
    let (st, _, _) = s.raw(
        "POST",
        "/v1/runs",
        k,
        Some("{\"agent\":\"a\"}"),
        "text/plain",
    );
    assert_eq!(st, 415);
    assert_eq!(
        code(s.call("POST", "/v1/runs", k, Some(&json!({"agnet": "a"})))),
        (422, "invalid".into())
    );
    assert_eq!(
        code(s.call("POST", "/v1/runs", k, Some(&json!({})))),
        (422, "invalid".into())
    );
    // A manifest with a typo is refused with the reason, nothing stored.
    let (st, v) = s.call(
        "POST",
        "/v1/agents",
        k,
        Some(&json!({"manifest": "[agent]\nname = \"a\"\ncommand = [\"true\"]\ntimout = 5\n"})),
    );
    assert_eq!(st, 422, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("timout"),
        "{v}"
    );
    assert_eq!(s.call("GET", "/v1/agents", k, None).1["agents"], json!([]));
    // Hostile file paths in a bundle.
    for p in ["../x", "/etc/passwd", "a/../../b", "a//b", "a\\b", ""] {
        let mut body = agent_body("a", "print(1)", 5);
        body["files"] = json!({ p: "x" });
        let (st, v) = s.call("POST", "/v1/agents", k, Some(&body));
        assert_eq!(st, 422, "path {p:?}: {v}");
    }
    // A run of an agent that does not exist; a prompt too large; bad limits.
    assert_eq!(
        s.call("POST", "/v1/runs", k, Some(&json!({"agent": "ghost"})))
            .0,
        404
    );
    assert_eq!(
        s.call(
            "POST",
            "/v1/agents",
            k,
            Some(&agent_body("a", "print(1)", 5))
        )
        .0,
        201
    );
    let big = "x".repeat(300 * 1024);
    assert_eq!(
        code(s.call(
            "POST",
            "/v1/runs",
            k,
            Some(&json!({"agent": "a", "prompt": big}))
        ))
        .0,
        413
    );
    assert_eq!(
        code(s.call(
            "POST",
            "/v1/runs",
            k,
            Some(&json!({"agent": "a", "limits": {"cpus": -1}}))
        )),
        (422, "invalid".into())
    );
    assert_eq!(
        code(s.call(
            "POST",
            "/v1/runs",
            k,
            Some(&json!({"agent": "a", "limits": {"gpus": 1}}))
        )),
        (422, "invalid".into())
    );
    // A body over the route's limit.
    let huge = json!({"name": "x".repeat(2 << 20)});
    assert_eq!(s.call("POST", "/v1/api-keys", k, Some(&huge)).0, 413);
    // A manifest naming a connection the organization does not have: the
    // run is refused before it is queued.
    let m = "[agent]\nname = \"needs\"\ncommand = [\"true\"]\n\n[[integrations]]\nnamespace = \"gh\"\nconnection = \"missing\"\nauthorized_uris = [\"https://api.example.com/**\"]\n";
    assert_eq!(
        s.call("POST", "/v1/agents", k, Some(&json!({"manifest": m})))
            .0,
        201
    );
    let (st, v) = s.call("POST", "/v1/runs", k, Some(&json!({"agent": "needs"})));
    assert_eq!(st, 422, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("missing"));
    // Connections: an unknown type, missing fields, a bad name.
    for body in [
        json!({"name": "c", "integration": "gh", "type": "token", "fields": {"token": "t"}}),
        json!({"name": "c", "integration": "gh", "type": "bearer", "fields": {}}),
        json!({"name": "c", "integration": "gh", "type": "basic", "fields": {"username": "u"}}),
        json!({"name": "../c", "integration": "gh", "type": "bearer", "fields": {"token": "t"}}),
    ] {
        assert_eq!(
            s.call("POST", "/v1/connections", k, Some(&body)).0,
            422,
            "{body}"
        );
    }
    assert_eq!(
        s.call("GET", "/v1/connections", k, None).1["connections"],
        json!([])
    );
    // List parameters.
    assert_eq!(s.call("GET", "/v1/runs?limit=0", k, None).0, 400);
    assert_eq!(s.call("GET", "/v1/runs?limit=abc", k, None).0, 400);
    assert_eq!(s.call("GET", "/v1/runs?status=done", k, None).0, 400);
    assert_eq!(s.call("GET", "/v1/runs?cursor=zzz", k, None).0, 400);
    // Webhooks: a URL the guard refuses, an unknown event.
    for body in [
        json!({"url": "http://169.254.169.254/latest", "events": ["run.failed"]}),
        json!({"url": "http://10.0.0.1/hook", "events": ["run.failed"]}),
        json!({"url": "file:///etc/passwd", "events": ["run.failed"]}),
        json!({"url": format!("http://{}/v1/org", s.addr), "events": ["run.failed"]}),
        json!({"url": "http://127.0.0.1:9/h", "events": ["run.exploded"]}),
        json!({"url": "http://127.0.0.1:9/h", "events": []}),
    ] {
        let (st, v) = s.call("POST", "/v1/webhooks", k, Some(&body));
        assert_eq!(st, 422, "{body}: {v}");
    }
    assert_eq!(
        s.call("GET", "/v1/webhooks", k, None).1["webhooks"],
        json!([])
    );
    // Keys: garbage, a key of the right shape that does not exist, revoked.
    for bad in [
        "alk_",
        "alk_zz_zz",
        "Bearer",
        &format!("{key}x"),
        &key.replace("alk_", "alk-"),
    ] {
        assert_eq!(s.call("GET", "/v1/org", Some(bad), None).0, 401, "{bad}");
    }
    let (st, second) = s.call("POST", "/v1/api-keys", k, Some(&json!({"name": "ci"})));
    assert_eq!(st, 201);
    let second_key = second["key"].as_str().unwrap();
    assert_eq!(s.call("GET", "/v1/org", Some(second_key), None).0, 200);
    // Listing never shows a key.
    let listed = s.call("GET", "/v1/api-keys", k, None).1;
    assert!(!listed.to_string().contains(&second_key[20..]));
    let id = second["id"].as_str().unwrap();
    assert_eq!(
        s.call("DELETE", &format!("/v1/api-keys/{id}"), k, None).0,
        204
    );
    assert_eq!(s.call("GET", "/v1/org", Some(second_key), None).0, 401);
    assert_eq!(
        s.call("DELETE", &format!("/v1/api-keys/{id}"), k, None).0,
        404
    );
    // Nothing above was a 500, and the server is still up.
    assert_eq!(s.call("GET", "/healthz", None, None).0, 200);
    assert!(!t.s.log_text().contains("panicked"), "{}", t.s.log_text());
}

/// A webhook host is judged by what its name resolves to, through the
/// resolver the sidecars use (`AIRLOCK_DNS_SERVER`, a nameserver this test
/// runs on loopback): a name that points at the metadata address or at
/// loopback is refused before anything is stored, and nothing is sent.
#[test]
fn a_webhook_name_that_resolves_to_a_blocked_address_is_refused() {
    let metadata =
        crate::egress_check::nameserver("hooks.example.com", "169.254.169.254".parse().unwrap());
    let t = start(&[("AIRLOCK_DNS_SERVER", &metadata.to_string())]);
    let (_, key) = create_org(&t.env, "A", &[]);
    let (st, v) = t.s.call(
        "POST",
        "/v1/webhooks",
        Some(&key),
        Some(&json!({"url": "https://hooks.example.com/in", "events": ["run.failed"]})),
    );
    assert_eq!(st, 422, "{v}");
    assert_eq!(v["error"]["code"], "url_refused");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("blocked_address"),
        "{v}"
    );
    let (st, v) = t.s.call(
        "POST",
        "/v1/webhooks",
        Some(&key),
        Some(&json!({"url": "https://unknown.example.com/in", "events": ["run.failed"]})),
    );
    assert_eq!(st, 422, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("unresolvable"),
        "{v}"
    );
    assert_eq!(
        t.s.call("GET", "/v1/webhooks", Some(&key), None).1["webhooks"],
        json!([])
    );
    drop(t);
    let lo = crate::egress_check::nameserver("hooks.example.com", "127.0.0.1".parse().unwrap());
    let t = start(&[("AIRLOCK_DNS_SERVER", &lo.to_string())]);
    let (_, key) = create_org(&t.env, "A", &[]);
    let (st, v) = t.s.call(
        "POST",
        "/v1/webhooks",
        Some(&key),
        Some(&json!({"url": "http://hooks.example.com:9/in", "events": ["run.failed"]})),
    );
    assert_eq!(st, 422, "a name is not the exempted 127.0.0.1: {v}");
}

/// A refusal is not a DNS oracle (issue 44.12): a tenant registering a
/// webhook at a name the instance's resolver maps to a private address
/// learns which rule refused it, never the address; the operator's log keeps
/// the address. A webhook the guard admits is still created.
#[test]
fn a_webhook_refusal_names_the_rule_not_the_resolved_address() {
    let ns = crate::egress_check::nameserver("db.corp.example.com", "10.20.30.40".parse().unwrap());
    let t = start(&[("AIRLOCK_DNS_SERVER", &ns.to_string())]);
    let (_, key) = create_org(&t.env, "A", &[]);
    let (st, v) = t.s.call(
        "POST",
        "/v1/webhooks",
        Some(&key),
        Some(&json!({"url": "https://db.corp.example.com/in", "events": ["run.failed"]})),
    );
    assert_eq!(st, 422, "{v}");
    assert_eq!(v["error"]["code"], "url_refused");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("blocked_address"), "{v}");
    assert!(message.contains("private"), "the rule is named: {v}");
    assert!(
        !v.to_string().contains("10.20.30.40"),
        "the address leaked: {v}"
    );
    // The operator's log has it.
    assert!(t.s.log_text().contains("10.20.30.40"), "{}", t.s.log_text());
    // The legitimate path: an admitted URL is stored.
    let (st, v) = t.s.call(
        "POST",
        "/v1/webhooks",
        Some(&key),
        Some(&json!({"url": "http://127.0.0.1:9/in", "events": ["run.failed"]})),
    );
    assert_eq!(st, 201, "{v}");
    assert_eq!(
        t.s.call("GET", "/v1/webhooks", Some(&key), None).1["webhooks"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

#[test]
fn a_key_over_its_rate_gets_429_with_retry_after() {
    let t = start(&[("API_RATE_PER_SECOND", "1"), ("API_RATE_BURST", "5")]);
    let (_, a) = create_org(&t.env, "A", &[]);
    let (_, b) = create_org(&t.env, "B", &[]);
    for _ in 0..5 {
        assert_eq!(t.s.call("GET", "/v1/org", Some(&a), None).0, 200);
    }
    let (st, headers, body) = t.s.raw("GET", "/v1/org", Some(&a), None, "");
    assert_eq!(st, 429, "{}", String::from_utf8_lossy(&body));
    let retry: u64 = headers
        .iter()
        .find(|(k, _)| k == "retry-after")
        .map(|(_, v)| v.parse().unwrap())
        .expect("Retry-After");
    assert!((1..=2).contains(&retry), "{retry}");
    // Another organization's key is not slowed by it.
    assert_eq!(t.s.call("GET", "/v1/org", Some(&b), None).0, 200);
}

#[test]
fn a_client_that_keeps_failing_to_authenticate_is_slowed_down() {
    let t = start(&[("API_AUTH_FAILURE_BURST", "5")]);
    let (_, key) = create_org(&t.env, "A", &[]);
    let bad = format!("alk_{}_{}", "0".repeat(16), "1".repeat(64));
    for _ in 0..5 {
        assert_eq!(t.s.call("GET", "/v1/org", Some(&bad), None).0, 401);
    }
    let (st, headers, _) = t.s.raw("GET", "/v1/org", Some(&bad), None, "");
    assert_eq!(st, 429);
    assert!(headers.iter().any(|(k, _)| k == "retry-after"));
    // A good key from the same address still works (another tenant behind
    // a shared address is not locked out).
    assert_eq!(t.s.call("GET", "/v1/org", Some(&key), None).0, 200);
    assert_eq!(t.s.call("GET", "/v1/org", None, None).0, 429);
    // Open routes are not.
    assert_eq!(t.s.call("GET", "/healthz", None, None).0, 200);
}

#[test]
fn an_organization_holds_at_most_its_share_of_event_streams() {
    use std::io::{Read as _, Write as _};
    let t = start(&[("API_MAX_STREAMS", "2")]);
    let (_, a) = create_org(&t.env, "A", &[]);
    let (_, b) = create_org(&t.env, "B", &[]);
    let body = agent_body(
        "sleeper",
        "import time\nprint('up', flush=True)\ntime.sleep(60)\n",
        90,
    );
    assert_eq!(t.s.call("POST", "/v1/agents", Some(&a), Some(&body)).0, 201);
    let (_, run) = t.s.call(
        "POST",
        "/v1/runs",
        Some(&a),
        Some(&json!({"agent": "sleeper"})),
    );
    let id = run["id"].as_str().unwrap().to_owned();
    let open = |key: &str| {
        let mut s = std::net::TcpStream::connect(t.s.addr).unwrap();
        write!(
            s,
            "GET /v1/runs/{id}/logs HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {key}\r\naccept: text/event-stream\r\n\r\n"
        )
        .unwrap();
        let mut head = [0u8; 12];
        s.read_exact(&mut head).unwrap();
        (String::from_utf8_lossy(&head).to_string(), s)
    };
    let (h1, s1) = open(&a);
    let (h2, _s2) = open(&a);
    assert!(h1.ends_with("200") && h2.ends_with("200"), "{h1} {h2}");
    let (h3, _) = open(&a);
    assert!(h3.ends_with("429"), "a third stream: {h3}");
    // Another organization's are its own; a closed stream frees its slot.
    let (hb, _) = open(&b);
    assert!(hb.ends_with("404"), "B cannot follow A's run at all: {hb}");
    drop(s1);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (h, _s) = open(&a);
        if h.ends_with("200") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the closed stream's slot never came back"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    t.s.call("POST", &format!("/v1/runs/{id}/cancel"), Some(&a), None);
}

/// Everything organization A owns, attacked with B's key on every route.
#[test]
fn every_route_with_another_organizations_key_finds_nothing() {
    let t = start(&[]);
    let s = &t.s;
    let (org_a, a_key) = create_org(&t.env, "A", &[]);
    let (org_b, b) = create_org(&t.env, "B", &[]);
    let a = Some(a_key.as_str());
    let b = Some(b.as_str());
    const SECRET: &str = "a-secret-token-CANARY-4242";
    assert_eq!(
        s.call(
            "POST",
            "/v1/agents",
            a,
            Some(&agent_body("bot", "print('from A')", 10))
        )
        .0,
        201
    );
    let (st, conn) = s.call(
        "POST",
        "/v1/connections",
        a,
        Some(&json!({"name": "gh", "integration": "gh", "type": "bearer", "fields": {"token": SECRET}})),
    );
    assert_eq!(st, 201, "{conn}");
    assert!(!conn.to_string().contains("CANARY"));
    let (st, run) = s.call(
        "POST",
        "/v1/runs",
        a,
        Some(&json!({"agent": "bot", "prompt": "A's prompt"})),
    );
    assert_eq!(st, 202, "{run}");
    let run_id = run["id"].as_str().unwrap().to_owned();
    let (st, hook) = s.call(
        "POST",
        "/v1/webhooks",
        a,
        Some(&json!({"url": "http://127.0.0.1:9/a", "events": ["run.succeeded"]})),
    );
    assert_eq!(st, 201, "{hook}");
    let hook_id = hook["id"].as_str().unwrap().to_owned();
    let key_a = s.call("GET", "/v1/api-keys", a, None).1["api_keys"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    wait_for(s, &format!("/v1/runs/{run_id}"), &a_key, 60, |v| {
        v["status"] == "succeeded"
    });

    // Every route that names something, with A's ids and B's key.
    for r in airlock_server::openapi::ROUTES
        .iter()
        .filter(|r| r.auth && r.path.contains('{'))
    {
        let path = r
            .path
            .replace("/api-keys/{id}", &format!("/api-keys/{key_a}"))
            .replace("/runs/{id}", &format!("/runs/{run_id}"))
            .replace("/webhooks/{id}", &format!("/webhooks/{hook_id}"))
            .replace("/agents/{name}", "/agents/bot")
            .replace("/connections/{name}", "/connections/gh")
            .replace("{result_id}", "r1")
            .replace("{approval_id}", "apr_0123456789abcdef");
        let body = match r.body {
            Some("RotateConnection") => Some(json!({"fields": {"token": "B-overwrites"}})),
            // (A valid answer: an invalid one is refused before the run is looked up.)
            Some("AnswerApproval") => Some(json!({"decision": "allow_once"})),
            Some(_) => Some(json!({})),
            None => None,
        };
        let (st, v) = s.call(&r.method.to_uppercase(), &path, b, body.as_ref());
        assert!(
            st == 404 || st == 403,
            "{} {path} with another organization's key: {st} {v}",
            r.method
        );
        for leak in [&run_id, &hook_id, &org_a, "A's prompt", "from A", "CANARY"] {
            assert!(
                !v.to_string().contains(leak),
                "{} {path} leaked {leak:?}: {v}",
                r.method
            );
        }
    }
    // Every list, and creating with A's names, stays within B.
    for p in [
        "/v1/runs",
        "/v1/agents",
        "/v1/connections",
        "/v1/webhooks",
        "/v1/api-keys",
        "/v1/org",
    ] {
        let (st, v) = s.call("GET", p, b, None);
        assert_eq!(st, 200, "{p}");
        for leak in [&run_id, &hook_id, &org_a, &key_a, "bot", "\"gh\""] {
            assert!(!v.to_string().contains(leak), "{p} leaked {leak:?}: {v}");
        }
    }
    assert_eq!(s.call("GET", "/v1/org", b, None).1["id"], org_b);
    assert_eq!(
        s.call("POST", "/v1/runs", b, Some(&json!({"agent": "bot"})))
            .0,
        404
    );
    let (st, _) = s.call(
        "POST",
        "/v1/connections",
        b,
        Some(&json!({"name": "gh", "integration": "gh", "type": "bearer", "fields": {"token": "B's own"}})),
    );
    assert_eq!(st, 201, "B has its own namespace of names");
    // A's rows are as they were.
    assert_eq!(s.call("GET", "/v1/agents/bot", a, None).0, 200);
    assert_eq!(
        s.call("GET", &format!("/v1/webhooks/{hook_id}"), a, None).0,
        200
    );
    assert_eq!(
        s.call("GET", &format!("/v1/runs/{run_id}"), a, None).1["status"],
        "succeeded"
    );
    assert_eq!(
        s.call("GET", "/v1/org", a, None).0,
        200,
        "A's key was not revoked by B"
    );
    let c = s.call("GET", "/v1/connections/gh", a, None).1;
    assert_eq!(
        c["created_at"], c["updated_at"],
        "A's secret was not rotated by B: {c}"
    );
    // What the routes answer is what the document says they answer: every
    // field of each answer is a documented property of its schema.
    let doc = s.call("GET", "/v1/openapi.json", None, None).1;
    for (path, schema) in [
        (format!("/v1/runs/{run_id}"), "Run"),
        ("/v1/org".to_owned(), "Organization"),
        ("/v1/agents/bot".to_owned(), "Agent"),
        ("/v1/connections/gh".to_owned(), "Connection"),
        (format!("/v1/webhooks/{hook_id}"), "Webhook"),
        (format!("/v1/runs/{run_id}/cost"), "RunCost"),
    ] {
        let (st, v) = s.call("GET", &path, a, None);
        assert_eq!(st, 200, "{path}");
        let props = doc["components"]["schemas"][schema]["properties"]
            .as_object()
            .unwrap();
        for k in v.as_object().unwrap().keys() {
            assert!(
                props.contains_key(k),
                "{path}: field {k:?} is not in the {schema} schema"
            );
        }
    }
    // Guessed ids of the right shape find nothing either.
    for guess in ["run_0000000000000000", "run_ffffffffffffffff"] {
        assert_eq!(s.call("GET", &format!("/v1/runs/{guess}"), b, None).0, 404);
    }
}

/// `airlock run`, `runs` and `connections` against a server, as an
/// organization's operator would use them.
#[test]
fn the_cli_runs_lists_and_stores_through_a_server() {
    use std::io::Write as _;
    let t = start(&[]);
    let (_, key) = create_org(&t.env, "Acme", &[]);
    let url = format!("http://{}", t.s.addr);
    let cli = |args: &[&str], key: &str| {
        let mut c = std::process::Command::new(crate::support::AIRLOCK);
        c.args(args)
            .env_remove("DATABASE_URL")
            .env("AIRLOCK_HOME", "/nonexistent/never-used")
            .env("AIRLOCK_SERVER", &url)
            .env("AIRLOCK_API_KEY", key)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        c
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("airlock.toml"),
        "[agent]\nname = \"cli\"\ncommand = [\"/usr/bin/python3\", \"agent.py\"]\ntimeout = 30\n",
    )
    .unwrap();
    std::fs::create_dir(dir.path().join("lib")).unwrap();
    std::fs::write(dir.path().join("lib/words.txt"), "from a file").unwrap();
    std::fs::write(
        dir.path().join("agent.py"),
        "import os\nprint(open('lib/words.txt').read(), open(os.environ['AIRLOCK_PROMPT_FILE']).read(), flush=True)\n",
    )
    .unwrap();
    let manifest = dir.path().join("airlock.toml");
    let out = cli(
        &[
            "run",
            "--json",
            "--prompt",
            "and a prompt",
            "-f",
            manifest.to_str().unwrap(),
        ],
        &key,
    )
    .output()
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let end: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(end["status"], "succeeded", "{end}");
    let id = end["id"].as_str().unwrap();
    let out = cli(&["runs", "logs", id], &key).output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "from a file and a prompt"
    );
    let out = cli(&["runs", "list"], &key).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains(id));
    // A connection stored through the server: its secret never printed.
    let mut child = cli(
        &[
            "connections",
            "add",
            "gh",
            "--integration",
            "gh",
            "--type",
            "bearer",
        ],
        &key,
    )
    .spawn()
    .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(br#"{"token": "CANARY-cli-secret"}"#)
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = cli(&["connections", "list", "--json"], &key)
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        listed.contains("\"gh\"") && !listed.contains("CANARY"),
        "{listed}"
    );
    assert_eq!(
        t.s.call("GET", "/v1/connections/gh", Some(&key), None).1["type"],
        "bearer"
    );
    // A wrong key, an https URL: clear errors, nothing done.
    let out = cli(&["runs", "list"], "alk_nope").output().unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("401"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = cli(
        &["runs", "list", "--server", "https://example.invalid"],
        &key,
    )
    .output()
    .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("http:// only"));
    let out = cli(&["connections", "remove", "gh"], &key)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(
        t.s.call("GET", "/v1/connections/gh", Some(&key), None).0,
        404
    );
}

/// An answer to `GET path` (with `key`) within `within`, from a thread of its
/// own: `None` when none came in time (the thread is left to its fate).
fn answered_within(
    addr: std::net::SocketAddr,
    path: &'static str,
    key: Option<String>,
    within: std::time::Duration,
) -> Option<u16> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let auth = key.map(|k| format!("Bearer {k}"));
        let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("authorization", &a[..])).collect();
        let (st, _, _) = crate::support::http(addr, "GET", path, &headers, b"");
        let _ = tx.send(st);
    });
    rx.recv_timeout(within).ok()
}

/// Descriptors the process `pid` holds open.
fn open_descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Slowloris (issue 45, item 11): far more idle anonymous connections than
/// the server has descriptors, from one address and from several, and a
/// client trickling its request head. Another client's `/healthz` and
/// `GET /v1/org` are still answered in time, the server holds no more than
/// its cap, and the header-read timeout closes what never sends a request.
#[test]
fn thousands_of_idle_connections_keep_no_client_from_its_answer() {
    use rustix::process::{Resource, Rlimit, getrlimit, prlimit, setrlimit};
    use std::io::{Read, Write};
    use std::time::{Duration, Instant};

    const ONE_ADDRESS: usize = 1200;
    const OTHERS: u8 = 8;
    const EACH: usize = 100;
    const SERVER_FILES: u64 = 1024;
    let t = start(&[
        ("API_MAX_CONNECTIONS", "600"),
        ("API_MAX_CONNECTIONS_PER_ADDRESS", "200"),
        ("API_HEADER_READ_TIMEOUT_SECONDS", "3"),
    ]);
    let (_, key) = create_org(&t.env, "A", &[]);
    // The server gets 1,024 descriptors; the attack uses more than that.
    let pid = t.s.child.id();
    prlimit(
        rustix::process::Pid::from_raw(pid.cast_signed()),
        Resource::Nofile,
        Rlimit {
            current: Some(SERVER_FILES),
            maximum: Some(SERVER_FILES),
        },
    )
    .expect("lower the server's open-file limit");
    let own = getrlimit(Resource::Nofile);
    let need = (ONE_ADDRESS + usize::from(OTHERS) * EACH + 200) as u64;
    assert!(
        own.maximum.is_none_or(|m| m >= need),
        "this test needs an open-file limit of at least {need} (hard limit {:?})",
        own.maximum
    );
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: own.maximum,
            maximum: own.maximum,
        },
    )
    .expect("raise the test's own open-file limit");

    // A client trickling its head, a header line a second.
    let mut trickle = std::net::TcpStream::connect(t.s.addr).unwrap();
    trickle
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n")
        .unwrap();
    let trickle_from = Instant::now();
    let trickled = std::thread::spawn(move || {
        for i in 0..20 {
            std::thread::sleep(Duration::from_secs(1));
            if trickle
                .write_all(format!("x-{i}: y\r\n").as_bytes())
                .is_err()
            {
                break;
            }
        }
        let mut rest = Vec::new();
        trickle
            .set_read_timeout(Some(Duration::from_secs(1)))
            .unwrap();
        let _ = trickle.read_to_end(&mut rest);
        (trickle_from.elapsed(), rest)
    });

    // The flood: connections that never send a byte.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let addr = t.s.addr;
    let flood = rt.block_on(async move {
        let open = |from: [u8; 4], n: usize| async move {
            let mut held = Vec::new();
            for _ in 0..n {
                let s = tokio::net::TcpSocket::new_v4().unwrap();
                s.bind((std::net::Ipv4Addr::from(from), 0).into()).unwrap();
                if let Ok(Ok(c)) =
                    tokio::time::timeout(Duration::from_millis(500), s.connect(addr)).await
                {
                    held.push(c);
                }
            }
            held
        };
        let mut held = open([127, 0, 0, 2], ONE_ADDRESS).await;
        for i in 0..OTHERS {
            held.extend(open([127, 0, 0, 3 + i], EACH).await);
        }
        held
    });
    assert!(
        flood.len() as u64 > SERVER_FILES,
        "the flood opened {} connections",
        flood.len()
    );

    // A legitimate client is answered, again and again, in time.
    for _ in 0..5 {
        assert_eq!(
            answered_within(t.s.addr, "/healthz", None, Duration::from_secs(3)),
            Some(200),
            "/healthz during the flood:\n{}",
            t.s.log_text()
        );
        assert_eq!(
            answered_within(
                t.s.addr,
                "/v1/org",
                Some(key.clone()),
                Duration::from_secs(3)
            ),
            Some(200),
            "GET /v1/org during the flood"
        );
    }
    // The server holds its cap, not the flood.
    let held = open_descriptors(pid);
    assert!(held < 600 + 100, "the server holds {held} descriptors");

    // The header-read timeout closed the trickling client, long before its
    // twenty lines.
    let (after, rest) = trickled.join().unwrap();
    assert!(
        after < Duration::from_secs(12),
        "a trickled head was held {after:?}"
    );
    assert!(
        !String::from_utf8_lossy(&rest).contains("200 OK"),
        "a trickled head was answered"
    );
    // And closes every idle connection that is left: the descriptors go
    // back near what an idle server holds.
    let deadline = Instant::now() + Duration::from_secs(15);
    while open_descriptors(pid) > 100 {
        assert!(
            Instant::now() < deadline,
            "idle connections still open past the header-read timeout: {}",
            open_descriptors(pid)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(flood);
    assert_eq!(t.s.call("GET", "/v1/org", Some(&key), None).0, 200);
}

/// Issue 45, item 13: an API run's `limits` pass the manifest's own checks
/// (`memory_mb` 1 was accepted through the API while a manifest needs 16;
/// `cpus` had no upper bound).
#[test]
fn a_runs_limits_are_checked_as_a_manifests_are() {
    let t = start(&[]);
    let (_, key) = create_org(&t.env, "Acme", &[]);
    let k = Some(key.as_str());
    let s = &t.s;
    assert_eq!(
        s.call(
            "POST",
            "/v1/agents",
            k,
            Some(&agent_body("a", "print(1)", 5))
        )
        .0,
        201
    );
    for (limits, names) in [
        (json!({"memory_mb": 1}), "16 MiB"),
        (json!({"memory_mb": 15}), "16 MiB"),
        (json!({"cpus": 1e308}), "at most 1024"),
        (json!({"cpus": 0.0}), "above 0"),
        (json!({"timeout_seconds": 0}), "at least 1"),
    ] {
        let (st, v) = s.call(
            "POST",
            "/v1/runs",
            k,
            Some(&json!({"agent": "a", "limits": limits})),
        );
        assert_eq!(st, 422, "{limits}: {v}");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(names), "{limits}: {v}");
    }
    // What a manifest may ask for, a run may.
    let (st, v) = s.call(
        "POST",
        "/v1/runs",
        k,
        Some(&json!({"agent": "a", "limits": {"memory_mb": 16, "cpus": 1024}})),
    );
    assert_eq!(st, 202, "{v}");
}

/// Issue 45, item 13: a clean stop removes the replica's own internal-API
/// socket (`$AIRLOCK_HOME/sockets/platform-<pid>.sock`).
#[test]
fn a_clean_stop_removes_its_own_socket() {
    let mut t = start(&[]);
    let socket = t
        ._home
        .path()
        .join("sockets")
        .join(format!("platform-{}.sock", t.s.child.id()));
    assert!(socket.exists(), "{} while serving", socket.display());
    assert!(t.s.terminate().success(), "{}", t.s.log_text());
    assert!(
        !socket.exists(),
        "{} left after a clean stop",
        socket.display()
    );
}

/// Issue 45, item 13: a server's log is every organization's; an agent's
/// lines are left to the store (its run's log), never echoed into
/// `airlock serve`'s stderr untagged.
#[test]
fn an_agents_lines_go_to_its_runs_log_not_the_servers() {
    let t = start(&[]);
    let (_, key) = create_org(&t.env, "Acme", &[]);
    let k = Some(key.as_str());
    let s = &t.s;
    let script = "print('agent-line-7f3a', flush=True)\n";
    assert_eq!(
        s.call(
            "POST",
            "/v1/agents",
            k,
            Some(&agent_body("talker", script, 30))
        )
        .0,
        201
    );
    let (st, run) = s.call("POST", "/v1/runs", k, Some(&json!({"agent": "talker"})));
    assert_eq!(st, 202, "{run}");
    let id = run["id"].as_str().unwrap();
    let end = wait_for(s, &format!("/v1/runs/{id}"), &key, 60, |v| {
        v["status"] != "queued" && v["status"] != "running"
    });
    assert_eq!(end["status"], "succeeded", "{end}\n{}", s.log_text());
    let logs = wait_for(s, &format!("/v1/runs/{id}/logs?after=0"), &key, 10, |v| {
        v.to_string().contains("agent-line-7f3a")
    });
    assert!(logs.to_string().contains("agent-line-7f3a"));
    let log = s.log_text();
    assert!(
        !log.contains("agent-line-7f3a"),
        "the agent's line is in the server's log:\n{log}"
    );
}

/// Issue 45, item 13: `GET /v1/webhooks/{id}/deliveries` pages with a
/// cursor (it showed the newest 100 and no more): full pages give a
/// `next_cursor`, the pages together are the whole list in order, once
/// each; a cursor the API did not give is `400`.
#[test]
fn a_webhooks_deliveries_page_with_a_cursor() {
    let t = start(&[]);
    let (_, key) = create_org(&t.env, "Acme", &[]);
    let k = Some(key.as_str());
    let s = &t.s;
    let rx = crate::support::serve::Receiver::start(|_| 204);
    let (st, hook) = s.call(
        "POST",
        "/v1/webhooks",
        k,
        Some(&json!({"url": format!("http://{}/hook", rx.addr), "events": ["run.succeeded"]})),
    );
    assert_eq!(st, 201, "{hook}");
    let hook_id = hook["id"].as_str().unwrap().to_owned();
    assert_eq!(
        s.call(
            "POST",
            "/v1/agents",
            k,
            Some(&agent_body("a", "print(1)", 30))
        )
        .0,
        201
    );
    for _ in 0..5 {
        let (st, v) = s.call("POST", "/v1/runs", k, Some(&json!({"agent": "a"})));
        assert_eq!(st, 202, "{v}");
    }
    let path = format!("/v1/webhooks/{hook_id}/deliveries");
    let all = wait_for(s, &path, &key, 120, |v| {
        v["deliveries"].as_array().is_some_and(|d| d.len() == 5)
    });
    assert_eq!(all["next_cursor"], Value::Null, "{all}");
    let ids = |v: &Value| -> Vec<String> {
        v["deliveries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["id"].as_str().unwrap().to_owned())
            .collect()
    };
    let mut paged = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let url = match &cursor {
            Some(c) => format!("{path}?limit=2&cursor={c}"),
            None => format!("{path}?limit=2"),
        };
        let (st, page) = s.call("GET", &url, k, None);
        assert_eq!(st, 200, "{page}");
        paged.extend(ids(&page));
        pages += 1;
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
        assert!(pages < 10, "paging does not end: {page}");
    }
    assert_eq!(
        paged,
        ids(&all),
        "the pages are the list, in order, once each"
    );
    assert_eq!(pages, 3);
    for bad in ["x", "12", "12.", "abc.d_1", "1.a%20b"] {
        let (st, v) = s.call("GET", &format!("{path}?cursor={bad}"), k, None);
        assert_eq!(st, 400, "cursor {bad}: {v}");
    }
}

#[test]
fn an_organizations_budgets_are_set_and_read_through_the_api_and_its_own() {
    let t = start(&[]);
    let s = &t.s;
    let (_, a) = create_org(&t.env, "A", &[]);
    let (_, b) = create_org(&t.env, "B", &[]);
    let (a, b) = (Some(a.as_str()), Some(b.as_str()));
    let (st, v) = s.call("GET", "/v1/org/budget", a, None);
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        v["day"]["tokens"],
        Value::Null,
        "no limit until one is set: {v}"
    );
    assert_eq!(v["day_spend"]["tokens"], 0);
    assert!(
        v["day_spend"]["period"]
            .as_str()
            .unwrap()
            .starts_with("day:")
    );
    assert!(
        v["month_spend"]["period"]
            .as_str()
            .unwrap()
            .starts_with("month:")
    );
    let set =
        json!({"day": {"tokens": 100000, "requests": 50}, "month": {"cost_microusd": 2000000}});
    let (st, v) = s.call("PUT", "/v1/org/budget", a, Some(&set));
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["day"]["tokens"], 100000);
    assert_eq!(v["month"]["cost_microusd"], 2000000);
    assert_eq!(
        s.call("GET", "/v1/org/budget", a, None).1["day"]["requests"],
        50
    );
    // Another organization's budgets are its own.
    assert_eq!(
        s.call("GET", "/v1/org/budget", b, None).1["day"]["tokens"],
        Value::Null
    );
    // A limit below 1, or a field the API does not know: 422, nothing changed.
    for bad in [
        json!({"day": {"tokens": 0}, "month": {}}),
        json!({"day": {"tokens": -5}, "month": {}}),
        json!({"day": {"token": 5}, "month": {}}),
        json!({"day": {}, "month": {}, "week": {}}),
        json!({"day": {}}),
    ] {
        let (st, v) = s.call("PUT", "/v1/org/budget", a, Some(&bad));
        assert_eq!(st, 422, "{bad}: {v}");
    }
    assert_eq!(
        s.call("GET", "/v1/org/budget", a, None).1["day"]["tokens"],
        100000
    );
}
