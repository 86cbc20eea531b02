//! The catalog reader against a loopback catalog server this test runs:
//! every refusal, and the accepted file. Nothing leaves loopback.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use airlock_egress::{EgressCode, EgressPolicy, Guard, SystemResolver};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;

use super::*;
use crate::signing::SecretKey;

/// What the server answers on a path.
#[derive(Clone)]
enum Answer {
    Ok(Vec<u8>),
    Redirect(&'static str),
    /// Reads the request and never answers.
    Hang,
}

/// A loopback HTTP/1.1 server answering each path as told, recording the
/// paths asked for.
struct Server {
    base: String,
    answers: Arc<Mutex<HashMap<String, Answer>>>,
    seen: Arc<Mutex<Vec<String>>>,
}

impl Server {
    async fn start() -> Server {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", l.local_addr().unwrap());
        let answers: Arc<Mutex<HashMap<String, Answer>>> = Arc::default();
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let (a, s) = (answers.clone(), seen.clone());
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = l.accept().await {
                let (a, s) = (a.clone(), s.clone());
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match conn.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let head = String::from_utf8_lossy(&buf).into_owned();
                    let path = head.split(' ').nth(1).unwrap_or_default().to_owned();
                    s.lock().unwrap().push(path.clone());
                    let answer = a.lock().unwrap().get(&path).cloned();
                    let out = match answer {
                        Some(Answer::Ok(body)) => {
                            let mut o = format!(
                                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                                body.len()
                            )
                            .into_bytes();
                            o.extend_from_slice(&body);
                            o
                        }
                        Some(Answer::Redirect(to)) => format!(
                            "HTTP/1.1 302 Found\r\nlocation: {to}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                        )
                        .into_bytes(),
                        Some(Answer::Hang) => {
                            std::future::pending::<()>().await;
                            return;
                        }
                        None => b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                            .to_vec(),
                    };
                    let _ = conn.write_all(&out).await;
                });
            }
        });
        Server {
            base,
            answers,
            seen,
        }
    }

    fn answer(&self, path: &str, a: Answer) {
        self.answers.lock().unwrap().insert(path.into(), a);
    }

    /// Serves `catalog` at `/c.json` and `sig` at `/c.json.sig`.
    fn serve(&self, catalog: &[u8], sig: &[u8]) {
        self.answer("/c.json", Answer::Ok(catalog.to_vec()));
        self.answer("/c.json.sig", Answer::Ok(sig.to_vec()));
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

fn catalog_text(serial: u64) -> Vec<u8> {
    format!(
        r#"{{"schema_version": 1, "serial": {serial}, "models": [
            {{"provider": "anthropic", "id": "claude-cat-{serial}", "price_in_per_mtok_usd": 3, "price_out_per_mtok_usd": 15}}]}}"#
    )
    .into_bytes()
}

fn signed(key: &SecretKey, text: &[u8]) -> Vec<u8> {
    key.sign(Purpose::Catalog, text).to_file().into_bytes()
}

/// A reader of the server's `/c.json` trusting `key`, the loopback address
/// an operator-listed internal host (as a private mirror would be).
fn reader(s: &Server, key: &SecretKey, timeout: Duration) -> (CatalogReader, Arc<ModelRegistry>) {
    let mut policy = EgressPolicy::new();
    policy.allow_internal_hosts(["127.0.0.1"]);
    let guard = Guard::new(policy, Arc::new(SystemResolver));
    let registry = Arc::new(ModelRegistry::new());
    let r = CatalogReader::new(
        &format!("{}/c.json", s.base),
        TrustRoot::of(vec![key.public()]),
        guard,
        Arc::new(airlock_egress::TcpDialer),
        Vec::new(),
        timeout,
        registry.clone(),
    )
    .unwrap();
    (r, registry)
}

fn assert_failed_reading_the_catalog(e: &RefreshError) {
    assert!(
        matches!(
            e,
            RefreshError::Get {
                file: File::Catalog,
                ..
            }
        ),
        "{e}"
    );
}

#[tokio::test]
async fn a_signed_catalog_is_accepted_with_two_gets() {
    let s = Server::start().await;
    let key = SecretKey::generate().unwrap();
    let text = catalog_text(3);
    s.serve(&text, &signed(&key, &text));
    let (r, registry) = reader(&s, &key, READ_TIMEOUT);
    assert_eq!(r.refresh().await.unwrap(), Offer::Accepted { serial: 3 });
    assert_eq!(s.seen(), ["/c.json", "/c.json.sig"]);
    let prices = registry.prices_for(airlock_platform_api::types::Provider::Anthropic);
    assert_eq!(prices[0].model, "claude-cat-3");
    assert_eq!(prices[0].price_out_per_mtok_usd, Some(15.0));
    // Read again: the same serial changes nothing.
    assert_eq!(r.refresh().await.unwrap(), Offer::Unchanged { serial: 3 });
}

#[tokio::test]
async fn a_bad_signature_or_an_untrusted_key_is_refused() {
    let s = Server::start().await;
    let key = SecretKey::generate().unwrap();
    let (r, registry) = reader(&s, &key, READ_TIMEOUT);
    let text = catalog_text(3);
    // Signed over other content: the file was changed after signing.
    s.serve(&text, &signed(&key, &catalog_text(4)));
    let e = r.refresh().await.unwrap_err();
    assert!(
        matches!(e, RefreshError::Signature(SigningError::BadSignature)),
        "{e}"
    );
    // Signed by a key the platform does not trust.
    let other = SecretKey::generate().unwrap();
    s.serve(&text, &signed(&other, &text));
    let e = r.refresh().await.unwrap_err();
    assert!(
        matches!(e, RefreshError::Signature(SigningError::UntrustedKey(_))),
        "{e}"
    );
    // Not a signature file at all.
    s.serve(&text, b"not json");
    let e = r.refresh().await.unwrap_err();
    assert!(
        matches!(e, RefreshError::Signature(SigningError::Malformed(_))),
        "{e}"
    );
    assert_eq!(registry.serial(), None);
    assert!(registry.models().is_empty());
}

#[tokio::test]
async fn a_lower_serial_is_a_refused_rollback() {
    let s = Server::start().await;
    let key = SecretKey::generate().unwrap();
    let (r, registry) = reader(&s, &key, READ_TIMEOUT);
    let v5 = catalog_text(5);
    s.serve(&v5, &signed(&key, &v5));
    r.refresh().await.unwrap();
    let v4 = catalog_text(4);
    s.serve(&v4, &signed(&key, &v4));
    let e = r.refresh().await.unwrap_err();
    assert!(
        matches!(
            e,
            RefreshError::Rollback(Rollback {
                offered: 4,
                current: 5
            })
        ),
        "{e}"
    );
    assert_eq!(registry.serial(), Some(5));
    assert_eq!(registry.models()[0].id, "claude-cat-5");
}

#[tokio::test]
async fn signed_malformed_records_are_refused() {
    let s = Server::start().await;
    let key = SecretKey::generate().unwrap();
    let (r, registry) = reader(&s, &key, READ_TIMEOUT);
    for text in [
        &br#"{"schema_version": 1, "serial": 2, "models": [{"provider": "openai", "id": "x", "price_in_per_mtok_usd": "free"}]}"#[..],
        br#"{"schema_version": 1, "serial": 2, "models": [{"provider": "openai", "id": "bad id"}]}"#,
        br#"{"schema_version": 9, "serial": 2, "models": []}"#,
    ] {
        s.serve(text, &signed(&key, text));
        let e = r.refresh().await.unwrap_err();
        assert!(matches!(e, RefreshError::Format(_)), "{e}");
    }
    assert_eq!(registry.serial(), None);
}

#[tokio::test]
async fn an_oversized_file_is_refused_before_its_signature_is_read() {
    let s = Server::start().await;
    let key = SecretKey::generate().unwrap();
    let (r, _) = reader(&s, &key, READ_TIMEOUT);
    let big = vec![b' '; MAX_CATALOG_BYTES + 1];
    s.serve(&big, &signed(&key, &big));
    let e = r.refresh().await.unwrap_err();
    assert_failed_reading_the_catalog(&e);
    assert_eq!(s.seen(), ["/c.json"]);
}

#[tokio::test]
async fn a_redirect_is_refused_and_not_followed() {
    let s = Server::start().await;
    let key = SecretKey::generate().unwrap();
    let (r, _) = reader(&s, &key, READ_TIMEOUT);
    let text = catalog_text(1);
    s.answer("/c.json", Answer::Redirect("/elsewhere.json"));
    s.answer("/elsewhere.json", Answer::Ok(text.clone()));
    s.answer("/c.json.sig", Answer::Ok(signed(&key, &text)));
    let e = r.refresh().await.unwrap_err();
    match e {
        RefreshError::Get { file, source } => {
            assert_eq!(file, File::Catalog);
            assert_eq!(source.code, EgressCode::TooManyRedirects);
        }
        e => panic!("{e}"),
    }
    assert_eq!(s.seen(), ["/c.json"]);
}

#[tokio::test]
async fn a_server_that_never_answers_is_cut_at_the_timeout() {
    let s = Server::start().await;
    let key = SecretKey::generate().unwrap();
    let (r, registry) = reader(&s, &key, Duration::from_millis(300));
    s.answer("/c.json", Answer::Hang);
    let e = r.refresh().await.unwrap_err();
    assert_failed_reading_the_catalog(&e);
    assert_eq!(registry.serial(), None);
}

#[tokio::test]
async fn a_missing_signature_is_refused() {
    let s = Server::start().await;
    let key = SecretKey::generate().unwrap();
    let (r, _) = reader(&s, &key, READ_TIMEOUT);
    s.answer("/c.json", Answer::Ok(catalog_text(1)));
    let e = r.refresh().await.unwrap_err();
    assert!(
        matches!(
            e,
            RefreshError::Status {
                file: File::Signature,
                status: 404
            }
        ),
        "{e}"
    );
}

#[tokio::test]
async fn off_starts_nothing_and_sends_nothing() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let key = SecretKey::generate().unwrap();
    let trust = format!("[{}]", key.public().to_file());
    let vars: HashMap<String, String> = [
        (ENV_URL.to_owned(), "off".to_owned()),
        (ENV_TRUST_ROOT.to_owned(), trust),
        (
            "EGRESS_ALLOW_INTERNAL_HOSTS".to_owned(),
            "127.0.0.1".to_owned(),
        ),
    ]
    .into();
    let settings = crate::settings::Settings::from_vars(&vars).unwrap();
    assert_eq!(settings.catalog.url, None);
    let registry = Arc::new(ModelRegistry::new());
    assert!(start(&settings, &registry).is_none());
    // The default reads nothing either while no catalog is published.
    let settings = crate::settings::Settings::from_vars(&HashMap::new()).unwrap();
    assert!(start(&settings, &registry).is_none());
    // No task exists that could connect; nothing has.
    assert!(
        tokio::time::timeout(Duration::ZERO, l.accept())
            .await
            .is_err(),
        "a connection reached {addr}"
    );
}

#[tokio::test]
async fn the_background_reader_reads_at_start() {
    let s = Server::start().await;
    let key = SecretKey::generate().unwrap();
    let text = catalog_text(8);
    s.serve(&text, &signed(&key, &text));
    let vars: HashMap<String, String> = [
        (ENV_URL.to_owned(), format!("{}/c.json", s.base)),
        (
            ENV_TRUST_ROOT.to_owned(),
            format!("[{}]", key.public().to_file()),
        ),
        (
            "EGRESS_ALLOW_INTERNAL_HOSTS".to_owned(),
            "127.0.0.1".to_owned(),
        ),
    ]
    .into();
    let settings = crate::settings::Settings::from_vars(&vars).unwrap();
    let registry = Arc::new(ModelRegistry::new());
    let task = start(&settings, &registry).expect("a reader");
    // Boot does not wait: the read happens on the task; its acceptance is told.
    let mut accepted = registry.watch();
    tokio::time::timeout(READ_TIMEOUT * 2, accepted.wait_for(Option::is_some))
        .await
        .expect("the first read within its timeouts")
        .expect("the registry lives");
    task.abort();
    assert_eq!(registry.serial(), Some(8));
}
