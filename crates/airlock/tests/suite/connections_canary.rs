//! A stored secret's value appears in no log line (trace level), no CLI output and no file
//! under AIRLOCK_HOME (the database, its -wal and -shm included): only its envelope is stored.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

const CANARY: &str = "CANARY-7f3a9c1e-d00d-4b1d-secret-value";

fn airlock(home: &Path, key: &[u8; 32], kid: &str, retired: Option<(&str, &[u8; 32])>) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_airlock"));
    c.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("AIRLOCK_HOME", home)
        .env("AIRLOCK_LOG", "trace")
        .env("RUST_LOG", "trace")
        .env("CONNECTION_ENCRYPTION_KEY", STANDARD.encode(key))
        .env("CONNECTION_ENCRYPTION_KEY_ID", kid);
    if let Some((rkid, rkey)) = retired {
        c.env(
            "CONNECTION_ENCRYPTION_KEYS",
            format!(r#"{{"{rkid}": "{}"}}"#, STANDARD.encode(rkey)),
        );
    }
    c
}

fn run_with_stdin(mut cmd: Command, stdin: &[u8]) -> Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A command that refuses before reading its stdin may be gone already.
    match child.stdin.take().unwrap().write_all(stdin) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        other => other.unwrap(),
    }
    child.wait_with_output().unwrap()
}

fn assert_clean(what: &str, out: &Output) {
    for (stream, bytes) in [("stdout", &out.stdout), ("stderr", &out.stderr)] {
        let text = String::from_utf8_lossy(bytes);
        assert!(
            !text.contains(CANARY),
            "{what}: canary in {stream}:\n{text}"
        );
    }
}

fn assert_no_file_holds_canary(dir: &Path) {
    let mut seen = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            assert_no_file_holds_canary(&path);
            continue;
        }
        seen += 1;
        let bytes = std::fs::read(&path).unwrap();
        assert!(
            !bytes.windows(CANARY.len()).any(|w| w == CANARY.as_bytes()),
            "canary in plaintext in {}",
            path.display()
        );
    }
    assert!(seen > 0 || dir.read_dir().is_ok());
}

#[test]
fn canary_never_leaks() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let k1 = [0x31u8; 32];
    let k2 = [0x32u8; 32];

    let fields = format!(r#"{{"token": "{CANARY}", "note": "x"}}"#);
    let mut cmd = airlock(home, &k1, "k1", None);
    cmd.args([
        "connections",
        "add",
        "canary",
        "--integration",
        "github",
        "--type",
        "bearer",
    ]);
    let out = run_with_stdin(cmd, fields.as_bytes());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_clean("connections add", &out);
    // trace logging really was on (sqlx logs each statement)
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.contains("DEBUG") && log.contains("INSERT INTO connections"),
        "{log}"
    );

    // files while a second process has the database open and after
    let files: Vec<_> = std::fs::read_dir(home)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(files.iter().any(|f| f == "airlock.db"), "{files:?}");
    assert_no_file_holds_canary(home);

    // duplicate add: the error does not echo the value either
    let mut cmd = airlock(home, &k1, "k1", None);
    cmd.args([
        "connections",
        "add",
        "canary",
        "--integration",
        "github",
        "--type",
        "bearer",
    ]);
    let out = run_with_stdin(cmd, fields.as_bytes());
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("already exists"));
    assert_clean("connections add (duplicate)", &out);

    // malformed JSON holding the canary: typed error, no echo, nothing stored
    for bad in [
        format!(r#"{{"token": "{CANARY}""#),
        format!(r#"{{"token": ["{CANARY}"]}}"#),
        format!(r#"["{CANARY}"]"#),
        format!(r#"{{"token": "{CANARY}", "n": 5}}"#),
        CANARY.to_string(),
    ] {
        let mut cmd = airlock(home, &k1, "k1", None);
        cmd.args([
            "connections",
            "add",
            "bad",
            "--integration",
            "github",
            "--type",
            "bearer",
        ]);
        let out = run_with_stdin(cmd, bad.as_bytes());
        assert!(!out.status.success(), "{bad}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("credential fields on stdin"));
        assert_clean("connections add (malformed)", &out);
    }

    let out = airlock(home, &k1, "k1", None)
        .args(["connections", "list"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let listing = String::from_utf8_lossy(&out.stdout);
    assert!(
        listing.contains("canary") && listing.contains("bearer"),
        "{listing}"
    );
    assert!(!listing.contains("bad"), "{listing}");
    assert!(
        !listing.contains("v1:"),
        "list prints no envelope: {listing}"
    );
    assert_clean("connections list", &out);
    let out = airlock(home, &k1, "k1", None)
        .args(["connections", "list", "--json"])
        .output()
        .unwrap();
    assert_clean("connections list --json", &out);

    // rotate and re-encrypt: still nothing
    let out = airlock(home, &k2, "k2", Some(("k1", &k1)))
        .args(["keys", "reencrypt"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("k2: 1"));
    assert_clean("keys reencrypt", &out);
    assert_no_file_holds_canary(home);

    let out = airlock(home, &k2, "k2", None)
        .args(["connections", "remove", "canary"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_clean("connections remove", &out);
    assert_no_file_holds_canary(home);
}

#[test]
fn add_refuses_bad_input_without_touching_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let k = [0x41u8; 32];
    let cases: &[(&str, &[&str], &str)] = &[
        ("", &["--type", "bearer"], "no credential fields"),
        ("{}", &["--type", "bearer"], "no credential fields given"),
        (r#"{"username":"u"}"#, &["--type", "basic"], "password"),
        (r#"{"token":""}"#, &["--type", "bearer"], "empty"),
        (r#"{"bad name":"v"}"#, &["--type", "custom"], "field name"),
    ];
    for (stdin, args, want) in cases {
        let mut cmd = airlock(home, &k, "k1", None);
        cmd.args(["connections", "add", "c", "--integration", "ns"])
            .args(*args);
        let out = run_with_stdin(cmd, stdin.as_bytes());
        assert!(!out.status.success(), "{stdin}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{stdin}: {err}");
    }
    // bad key configuration is reported before any secret is read
    let mut cmd = airlock(home, &k, "bad kid!", None);
    cmd.args([
        "connections",
        "add",
        "c",
        "--integration",
        "ns",
        "--type",
        "bearer",
    ]);
    let out = run_with_stdin(cmd, br#"{"token":"t"}"#);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("CONNECTION_ENCRYPTION_KEY_ID"));
    // secret values are not accepted on argv
    let out = airlock(home, &k, "k1", None)
        .args([
            "connections",
            "add",
            "c",
            "--integration",
            "ns",
            "--type",
            "bearer",
            "--token",
            "x",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let out = airlock(home, &k, "k1", None)
        .args(["connections", "list"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("no connections"));
    // removing what is not there is an error
    let out = airlock(home, &k, "k1", None)
        .args(["connections", "remove", "nope"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not found"));
}
