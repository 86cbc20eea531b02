//! The platform's internal API from the sidecar's side: `PlatformClient`
//! against the real server (SQLite store, real keyring, run tokens).
//!
//! Every refusal is tried from the caller's side (a forged token, a token of
//! an ended run, of a run this platform does not host, a foreign
//! integration) next to the legitimate fetch; and the client's keep-alive
//! pool is shown to survive the platform closing its connections.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use airlock_platform::internal_api::WATCH_EVERY;
use airlock_platform::testing::TestPlatform;
use airlock_platform_api::{PlatformClient, PlatformError};
use airlock_store::{AuthType, RunStatus};
use airlock_vault::{ExposeSecret, SecretString};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixListener;

fn refused(r: Result<impl std::fmt::Debug, PlatformError>) -> (u16, String) {
    match r {
        Err(PlatformError::Refused { status, code, .. }) => (status, code),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn run_tokens_are_checked_and_each_refusal_is_typed() {
    let p = TestPlatform::start("agent-a").await;
    p.add_connection("svc", AuthType::Bearer, &[("api_key", "canary-value-1")])
        .await;

    // The legitimate path, several times over one pooled connection.
    let client = PlatformClient::new(&p.socket, p.run_token.clone());
    for _ in 0..5 {
        let c = client.credential("svc").await.expect("credential");
        assert_eq!(c.fields["api_key"].expose_secret(), "canary-value-1");
        assert_eq!(c.connection, "svc-conn");
    }

    // An integration the run was not granted.
    assert_eq!(
        refused(client.credential("other").await),
        (403, "integration_not_granted".into())
    );

    // A forged token, a token with its MAC altered, no token at all.
    for forged in [
        "run_x.0000".to_owned(),
        format!("{}0", "a".repeat(10)),
        String::new(),
    ] {
        let c = PlatformClient::new(&p.socket, SecretString::from(forged.clone()));
        assert_eq!(
            refused(c.credential("svc").await),
            (401, "unauthorized".into()),
            "{forged:?}"
        );
    }
    let mut tampered = airlock_vault::ExposeSecret::expose_secret(&p.run_token).to_owned();
    let last = tampered.pop().expect("token");
    tampered.push(if last == '0' { '1' } else { '0' });
    let c = PlatformClient::new(&p.socket, SecretString::from(tampered));
    assert_eq!(refused(c.credential("svc").await).0, 401);

    // A well-signed token of a run this platform does not host.
    let stranger = PlatformClient::new(&p.socket, p.token_for("run_notours"));
    assert_eq!(
        refused(stranger.credential("svc").await),
        (404, "unknown_run".into())
    );

    // Another running run of the same platform cannot use the first run's grant.
    let (other_id, other_token) = p.another_run("agent-b").await;
    let other = PlatformClient::new(&p.socket, other_token);
    assert_eq!(
        refused(other.credential("svc").await),
        (403, "integration_not_granted".into())
    );

    // Once the run has ended its token fetches nothing, even on a pooled connection.
    p.end_run(&other_id, RunStatus::Succeeded).await;
    assert_eq!(
        refused(other.credential("svc").await),
        (403, "run_not_running".into())
    );
    p.end_run(&p.run_id, RunStatus::Cancelled).await;
    assert_eq!(
        refused(client.credential("svc").await),
        (403, "run_not_running".into())
    );
}

/// The raw answer to `head` (a request without a body) over the platform's
/// socket: status, content type and body.
async fn over_the_socket(socket: &std::path::Path, head: &str) -> (u16, String, String) {
    let mut s = tokio::net::UnixStream::connect(socket).await.unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let status = head[9..12].parse().unwrap();
    let content_type = head
        .lines()
        .find_map(|l| l.strip_prefix("content-type: "))
        .unwrap_or("")
        .to_owned();
    (
        status,
        content_type,
        String::from_utf8_lossy(&raw[split + 4..]).into_owned(),
    )
}

/// The credential fetch has a path of its own in front of the router (it
/// is on every credentialed call); whatever an agent's sidecar sends, it
/// answers exactly as the router's route does: the legitimate fetch, a
/// percent-encoded name, names that decode to a slash or to bad UTF-8, a
/// longer path, other methods, forged and missing tokens.
#[tokio::test]
async fn the_credential_fetch_answers_as_the_router_does() {
    use http_body_util::BodyExt;
    let p = TestPlatform::start("agent-a").await;
    p.add_connection("svc", AuthType::Bearer, &[("api_key", "canary-value-2")])
        .await;
    let token = airlock_vault::ExposeSecret::expose_secret(&p.run_token).to_owned();
    let cases: &[(&str, &str, Option<&str>, u16)] = &[
        ("GET", "svc", Some(&token), 200),
        ("GET", "%73vc", Some(&token), 200),
        ("GET", "svc?x=1", Some(&token), 200),
        ("GET", "other", Some(&token), 403),
        ("GET", "sv%2Fc", Some(&token), 403),
        ("GET", "%FF", Some(&token), 400),
        ("GET", "svc/more", Some(&token), 404),
        ("GET", "", Some(&token), 404),
        ("HEAD", "svc", Some(&token), 200),
        ("POST", "svc", Some(&token), 405),
        ("GET", "svc", Some("run_x.0000"), 401),
        ("GET", "svc", None, 401),
    ];
    for (method, name, bearer, want) in cases {
        let auth = bearer.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
        let head = format!(
            "{method} /internal/v1/credentials/{name} HTTP/1.1\r\nHost: platform\r\n{auth}Connection: close\r\n\r\n"
        );
        let socket = over_the_socket(&p.socket, &head).await;

        let mut req = http::Request::builder()
            .method(*method)
            .uri(format!("/internal/v1/credentials/{name}"))
            .header("host", "platform");
        if let Some(t) = bearer {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let req = req
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap();
        let mut router = p.api.router();
        let resp = tower_service::Service::call(&mut router, req)
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let content_type = resp
            .headers()
            .get("content-type")
            .map_or(String::new(), |v| v.to_str().unwrap().to_ascii_lowercase());
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let body = String::from_utf8_lossy(&body).into_owned();
        let routed = (status, content_type, body);
        assert_eq!(socket, routed, "{method} {name:?}");
        assert_eq!(socket.0, *want, "{method} {name:?}");
        if *want == 200 && *method == "GET" {
            assert!(socket.2.contains("canary-value-2"), "{method} {name:?}");
        }
    }
}

/// A platform that answers one request per connection and then closes it
/// without saying so: the client's pooled connection is dead by the next
/// call, which must still succeed, once, on a new connection.
#[tokio::test]
async fn a_connection_the_platform_closed_is_replaced_and_nothing_is_sent_twice() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("platform.sock");
    let listener = UnixListener::bind(&socket).expect("bind");
    let (seen_tx, mut seen_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let seen = seen_tx.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&got).to_string();
                let _ = seen.send(head.lines().next().unwrap_or("").to_owned());
                let body = br#"{"integration":"svc","connection":"c","auth_type":"bearer","fields":{"k":"v"}}"#;
                let resp = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                    body.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
                let _ = s.write_all(body).await;
                // Closed without `connection: close`.
            });
        }
    });
    let client = PlatformClient::new(&socket, SecretString::from("run_a.00".to_owned()));
    for i in 0..4 {
        let c = client.credential("svc").await.unwrap_or_else(|e| {
            panic!("call {i} failed after the platform closed the pooled connection: {e}")
        });
        assert_eq!(c.fields["k"].expose_secret(), "v");
        // Let the close reach the client before the next call half the time.
        if i % 2 == 0 {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
    let mut requests = 0;
    while let Ok(line) = seen_rx.try_recv() {
        assert!(
            line.starts_with("GET /internal/v1/credentials/svc "),
            "{line}"
        );
        requests += 1;
    }
    assert_eq!(requests, 4, "each call reached the platform exactly once");
}

/// Connection rows are kept in memory by the platform (a fetch is then a
/// lookup and a decrypt), yet a connection replaced or removed is what the
/// next fetches get: at once when the change went through the platform's
/// own store (`airlock serve`'s API, the run's platform), within the
/// watcher's check (every 500 ms) when another process made it (`airlock
/// connections rm` beside a running server). Never a removed one for long.
#[tokio::test]
async fn a_changed_connection_is_what_the_next_fetches_get() {
    let p = TestPlatform::start("agent-cache").await;
    p.add_connection("svc", AuthType::Bearer, &[("api_key", "first-value")])
        .await;
    let client = PlatformClient::new(&p.socket, p.run_token.clone());
    let value = || async {
        client
            .credential("svc")
            .await
            .map(|c| c.fields["api_key"].expose_secret().to_owned())
    };
    for _ in 0..3 {
        assert_eq!(value().await.unwrap(), "first-value");
    }
    // Replaced in this process, as `airlock serve`'s API does: the very
    // next fetch has the new value, then the cache serves it.
    assert!(
        p.store()
            .delete_connection(airlock_store::LOCAL_ORG, "svc-conn")
            .await
            .unwrap()
    );
    p.add_connection("svc", AuthType::Bearer, &[("api_key", "second-value")])
        .await;
    for _ in 0..3 {
        assert_eq!(value().await.unwrap(), "second-value");
    }
    // Removed in this process: refused from the next fetch on.
    assert!(
        p.store()
            .delete_connection(airlock_store::LOCAL_ORG, "svc-conn")
            .await
            .unwrap()
    );
    for _ in 0..3 {
        let got = value().await;
        assert!(
            matches!(got, Err(PlatformError::Refused { status: 404, .. })),
            "a removed connection was served: {got:?}"
        );
    }

    // Another process sharing the database: its changes are seen once the
    // watcher has checked.
    let other = airlock_store::Store::open_sqlite(
        &p.dir.path().join("airlock.db"),
        &airlock_store::StoreOptions::default(),
    )
    .await
    .unwrap();
    p.add_connection("svc", AuthType::Bearer, &[("api_key", "third-value")])
        .await;
    for _ in 0..3 {
        assert_eq!(value().await.unwrap(), "third-value");
    }
    assert!(
        other
            .delete_connection(airlock_store::LOCAL_ORG, "svc-conn")
            .await
            .unwrap()
    );
    until(
        &client,
        "removed by another process, refused as unknown",
        |got| matches!(got, Err(PlatformError::Refused { status: 404, .. })),
    )
    .await;
}

/// Fetches `svc` until `done` holds of the answer. The watcher notices a
/// change within [`WATCH_EVERY`] plus one store query; the deadline is
/// twenty times that, for a loaded CI machine, and a miss says what was
/// served last.
async fn until(
    client: &PlatformClient,
    what: &str,
    done: impl Fn(&Result<airlock_platform_api::wire::CredentialResponse, PlatformError>) -> bool,
) {
    let deadline = tokio::time::Instant::now() + WATCH_EVERY * 20;
    loop {
        let got = client.credential("svc").await;
        if done(&got) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not after {:?}; last answer {:?}",
            WATCH_EVERY * 20,
            got.map(|c| c.fields.get("api_key").cloned())
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// The live policy's long-poll (docs/egress.md, "Live policy"): a run's
/// sidecar gets its own run's newer version at once, and a change made
/// while it waits wakes it; another run's token never sees it; a forged
/// token is refused; the version a sidecar reports applied is recorded.
#[tokio::test]
async fn a_runs_live_policy_reaches_its_own_sidecar_only() {
    use airlock_platform_api::policy::PolicyRules;
    use std::time::Duration;
    let p = TestPlatform::start("agent-a").await;
    let rules = |id: &str| {
        serde_json::to_string(&serde_json::json!({"network": [
            {"id": id, "host": "https://a.example", "access": "read-only"}
        ]}))
        .unwrap()
    };
    let store = p.store();
    store
        .put_policy_ceiling(&p.run_id, &rules("m"))
        .await
        .unwrap();
    store
        .change_policy(&p.run_id, 0, &rules("one"), "key k")
        .await
        .unwrap();
    let client = PlatformClient::new(&p.socket, p.run_token.clone());
    let got = client.policy(0).await.unwrap();
    assert_eq!(got.version, 1);
    let doc: PolicyRules = got.rules.unwrap();
    assert_eq!(doc.network[0].id.as_deref(), Some("one"));

    // Another run: nothing newer of its own, so it waits (its answer is not
    // the first run's); a change of its own wakes it.
    let (other, other_token) = p.another_run("agent-a").await;
    let other_client = PlatformClient::new(&p.socket, other_token);
    let mut poll = Box::pin(other_client.policy(0));
    tokio::select! {
        r = &mut poll => panic!("another run's change answered this run's poll: {r:?}"),
        () = tokio::time::sleep(Duration::from_millis(300)) => {}
    }
    store
        .change_policy(&other, 0, &rules("two"), "key k")
        .await
        .unwrap();
    let woken = tokio::time::timeout(Duration::from_secs(5), poll)
        .await
        .expect("woken by the change")
        .unwrap();
    assert_eq!(woken.rules.unwrap().network[0].id.as_deref(), Some("two"));

    // The report: the next poll's `after` is recorded as applied.
    assert_eq!(store.policy_applied(&p.run_id).await.unwrap(), 0);
    let _ = tokio::time::timeout(Duration::from_millis(300), client.policy(1)).await;
    assert_eq!(store.policy_applied(&p.run_id).await.unwrap(), 1);

    // A forged token.
    let forged = PlatformClient::new(&p.socket, SecretString::from("run_x.0000".to_owned()));
    assert_eq!(
        refused(forged.policy(0).await),
        (401, "unauthorized".into())
    );
}
