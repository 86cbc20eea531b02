//! `airlock keys reencrypt` against the real binary: SIGKILL half-way, run again, lose nothing.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use airlock_store::{Store, StoreOptions};
use airlock_vault::{ExposeSecret as _, Keyring};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

const OLD: [u8; 32] = [0x11; 32];
const NEW: [u8; 32] = [0x22; 32];

fn airlock(home: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_airlock"));
    c.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("AIRLOCK_HOME", home)
        .env("CONNECTION_ENCRYPTION_KEY", STANDARD.encode(NEW))
        .env("CONNECTION_ENCRYPTION_KEY_ID", "k2")
        .env(
            "CONNECTION_ENCRYPTION_KEYS",
            format!(r#"{{"k1": "{}"}}"#, STANDARD.encode(OLD)),
        );
    c
}

async fn seed(home: &Path, n: usize) -> BTreeMap<String, String> {
    use sqlx::Connection as _;
    let store = Store::open_sqlite(&home.join("airlock.db"), &StoreOptions::default())
        .await
        .unwrap();
    store.close().await;
    let mut c =
        sqlx::SqliteConnection::connect(&format!("sqlite://{}", home.join("airlock.db").display()))
            .await
            .unwrap();
    let old = Keyring::new("k1", &OLD).unwrap();
    let mut want = BTreeMap::new();
    let mut tx = c.begin().await.unwrap();
    for i in 0..n {
        let name = format!("conn-{i:06}");
        let value = format!(r#"{{"token":"value-{i}-{}"}}"#, "x".repeat(i % 50));
        let env = old.encrypt(value.as_bytes()).unwrap();
        sqlx::query(
            "INSERT INTO connections (name, integration, auth_type, kid, envelope, created_at, \
             updated_at) VALUES ($1, 'ns', 'bearer', 'k1', $2, 0, 0)",
        )
        .bind(&name)
        .bind(env)
        .execute(&mut *tx)
        .await
        .unwrap();
        want.insert(name, value);
    }
    tx.commit().await.unwrap();
    want
}

async fn counts(home: &Path) -> BTreeMap<String, u64> {
    let store = Store::open_sqlite(&home.join("airlock.db"), &StoreOptions::default())
        .await
        .unwrap();
    let c = store
        .envelope_counts_by_kid()
        .await
        .unwrap()
        .into_iter()
        .collect();
    store.close().await;
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_half_way_then_rerun_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let total = 20_000;
    let want = seed(home, total).await;

    // Start, wait until some batches are committed but not all, then SIGKILL.
    let mut killed_mid_way = false;
    for attempt in 0..3 {
        let batch = ["20", "10", "5"][attempt];
        let mut child = airlock(home)
            .args(["keys", "reencrypt", "--batch", batch])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let c = counts(home).await;
            let done = c.get("k2").copied().unwrap_or(0);
            let done = usize::try_from(done).unwrap();
            if done >= total / 3 && done < total - 1000 {
                child.kill().unwrap(); // SIGKILL on Unix
                child.wait().unwrap();
                killed_mid_way = true;
                break;
            }
            if let Some(status) = child.try_wait().unwrap() {
                let mut err = String::new();
                std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
                assert!(status.success(), "reencrypt failed: {err}");
                break;
            }
            assert!(Instant::now() < deadline, "reencrypt made no progress");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if killed_mid_way {
            break;
        }
        // finished before we could kill it: put everything back under k1 and try smaller batches
        let store = Store::open_sqlite(&home.join("airlock.db"), &StoreOptions::default())
            .await
            .unwrap();
        let back = Keyring::new("k1", &OLD)
            .unwrap()
            .with_retired("k2", &NEW)
            .unwrap();
        while store.reencrypt_batch(&back, 5000).await.unwrap() > 0 {}
        store.close().await;
    }
    assert!(killed_mid_way, "could not catch reencrypt mid-way");

    let mid = counts(home).await;
    eprintln!("after SIGKILL: {mid:?}");
    assert_eq!(mid.values().sum::<u64>(), total as u64, "no row lost");
    assert!(mid.get("k1").copied().unwrap_or(0) > 0);

    // Every row still decrypts (mixed kids) right after the kill.
    let both = Keyring::new("k2", &NEW)
        .unwrap()
        .with_retired("k1", &OLD)
        .unwrap();
    check_all(home, &both, &want).await;

    // Run again: it resumes and finishes.
    let out = airlock(home).args(["keys", "reencrypt"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains(&format!("k2: {total}")), "{stdout}");
    assert!(!stdout.contains("k1:"), "{stdout}");

    // Every connection decrypts to its original value under the new key alone.
    let only_new = Keyring::new("k2", &NEW).unwrap();
    check_all(home, &only_new, &want).await;
}

async fn check_all(home: &Path, ring: &Keyring, want: &BTreeMap<String, String>) {
    let store = Store::open_sqlite(&home.join("airlock.db"), &StoreOptions::default())
        .await
        .unwrap();
    let list = store
        .list_connections(airlock_store::LOCAL_ORG)
        .await
        .unwrap();
    assert_eq!(list.len(), want.len());
    for (name, value) in want {
        let c = store
            .get_connection(airlock_store::LOCAL_ORG, name)
            .await
            .unwrap()
            .unwrap();
        let got = ring.decrypt_string(&c.envelope).unwrap();
        assert_eq!(got.expose_secret(), value, "{name}");
    }
    store.close().await;
}

#[tokio::test]
async fn wrong_key_fails_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    seed(home, 50).await;
    let before = counts(home).await;
    // The retired key given for k1 is wrong.
    let out = airlock(home)
        .env(
            "CONNECTION_ENCRYPTION_KEYS",
            format!(r#"{{"k1": "{}"}}"#, STANDARD.encode([9u8; 32])),
        )
        .args(["keys", "reencrypt", "--batch", "1000"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("is not the key this store's \"k1\" envelopes were written with"),
        "{err}"
    );
    assert_eq!(counts(home).await, before);
    // No key for k1 at all: the message names the variable.
    let out = airlock(home)
        .env_remove("CONNECTION_ENCRYPTION_KEYS")
        .args(["keys", "reencrypt"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("CONNECTION_ENCRYPTION_KEYS") && err.contains("\"k1\""),
        "{err}"
    );
    assert_eq!(counts(home).await, before);
    // No active key.
    let out = airlock(home)
        .env_remove("CONNECTION_ENCRYPTION_KEY")
        .args(["keys", "reencrypt"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("CONNECTION_ENCRYPTION_KEY is not set"));
}

#[test]
fn generate_prints_a_fresh_32_byte_key() {
    let dir = tempfile::tempdir().unwrap();
    let a = airlock(dir.path())
        .args(["keys", "generate"])
        .output()
        .unwrap();
    let b = airlock(dir.path())
        .args(["keys", "generate"])
        .output()
        .unwrap();
    assert!(a.status.success());
    let ka = String::from_utf8(a.stdout).unwrap();
    let kb = String::from_utf8(b.stdout).unwrap();
    assert_ne!(ka, kb);
    assert_eq!(STANDARD.decode(ka.trim()).unwrap().len(), 32);
}

/// `keys reencrypt` throughput on SQLite. Run with
/// `cargo test --release -p airlock --test suite -- keys_reencrypt:: --ignored --nocapture`
/// (AIRLOCK_BENCH_ROWS, default 100000).
#[tokio::test]
#[ignore]
async fn bench_reencrypt_sqlite() {
    let n: usize = std::env::var("AIRLOCK_BENCH_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    seed(home, n).await;
    let t = Instant::now();
    let out = airlock(home).args(["keys", "reencrypt"]).output().unwrap();
    let secs = t.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{}", String::from_utf8_lossy(&out.stdout));
    eprintln!(
        "BENCH keys reencrypt (SQLite): {n} rows in {secs:.2}s = {:.0} rows/s (whole process)",
        n as f64 / secs
    );
}

/// `keys reencrypt` throughput on PostgreSQL (needs AIRLOCK_TEST_DATABASE_URL). Run with
/// `cargo test --release -p airlock --test suite -- keys_reencrypt:: --ignored --nocapture`.
#[tokio::test]
#[ignore]
async fn bench_reencrypt_postgres() {
    use sqlx::Connection as _;
    let Some(url) = airlock_test_support::require_peer(
        "PostgreSQL",
        std::env::var("AIRLOCK_TEST_DATABASE_URL")
            .map_err(|_| "not available (set AIRLOCK_TEST_DATABASE_URL)"),
    ) else {
        return;
    };
    let n: usize = std::env::var("AIRLOCK_BENCH_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let schema = format!("bench_{}", std::process::id());
    let mut c = sqlx::PgConnection::connect(&url).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
    )))
    .execute(&mut c)
    .await
    .unwrap();
    let sep = if url.contains('?') { '&' } else { '?' };
    let scoped = format!("{url}{sep}options[search_path]={schema}");
    Store::open(&scoped, &StoreOptions::default())
        .await
        .unwrap()
        .close()
        .await;
    let mut s = sqlx::PgConnection::connect(&scoped).await.unwrap();
    let old = Keyring::new("k1", &OLD).unwrap();
    let mut names = Vec::with_capacity(n);
    let mut envs = Vec::with_capacity(n);
    for i in 0..n {
        names.push(format!("conn-{i:07}"));
        envs.push(
            old.encrypt(format!(r#"{{"token":"value-{i}"}}"#).as_bytes())
                .unwrap(),
        );
    }
    sqlx::query(
        "INSERT INTO connections (name, integration, auth_type, kid, envelope, created_at, \
         updated_at) SELECT n, 'ns', 'bearer', 'k1', e, 0, 0 FROM UNNEST($1::text[], $2::text[]) \
         AS u(n, e)",
    )
    .bind(&names)
    .bind(&envs)
    .execute(&mut s)
    .await
    .unwrap();
    s.close().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let t = Instant::now();
    let out = airlock(dir.path())
        .env("DATABASE_URL", &scoped)
        .args(["keys", "reencrypt"])
        .output()
        .unwrap();
    let secs = t.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{}", String::from_utf8_lossy(&out.stdout));
    eprintln!(
        "BENCH keys reencrypt (PostgreSQL): {n} rows in {secs:.2}s = {:.0} rows/s (whole process)",
        n as f64 / secs
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(&mut c)
        .await
        .unwrap();
}
