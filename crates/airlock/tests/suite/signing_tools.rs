//! The signing tools of the built binary: `airlock catalog keygen|sign|
//! verify` (and `airlock bundle`), each refusal a failing exit with its
//! reason. Files only: nothing is sent anywhere.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use std::path::Path;
use std::process::{Command, Output};

use crate::support::AIRLOCK;

fn airlock(home: &Path, args: &[&str]) -> Output {
    Command::new(AIRLOCK)
        .args(args)
        .env("AIRLOCK_HOME", home)
        .output()
        .unwrap()
}

fn ok(o: &Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn refused(o: &Output, why: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains(why), "{err}");
}

#[test]
fn catalog_keygen_sign_verify_and_refusals() {
    let dir = tempfile::tempdir().unwrap();
    let d = |f: &str| dir.path().join(f).to_str().unwrap().to_owned();
    ok(&airlock(dir.path(), &["catalog", "keygen", &d("k")]));
    ok(&airlock(dir.path(), &["catalog", "keygen", &d("other")]));
    // A key is never overwritten.
    refused(
        &airlock(dir.path(), &["catalog", "keygen", &d("k")]),
        "creating",
    );
    let catalog = r#"{"schema_version": 1, "serial": 2, "models": [{"provider": "openai", "id": "gpt-cat", "price_in_per_mtok_usd": 1}]}"#;
    std::fs::write(d("c.json"), catalog).unwrap();
    let out = ok(&airlock(
        dir.path(),
        &["catalog", "sign", "--key", &d("k"), &d("c.json")],
    ));
    assert!(out.contains("serial 2, 1 models"), "{out}");
    let out = ok(&airlock(
        dir.path(),
        &["catalog", "verify", "--trust", &d("k.pub"), &d("c.json")],
    ));
    assert!(out.contains("verifies"), "{out}");
    // Another key's public file does not trust it.
    refused(
        &airlock(
            dir.path(),
            &[
                "catalog",
                "verify",
                "--trust",
                &d("other.pub"),
                &d("c.json"),
            ],
        ),
        "not trusted",
    );
    // Changed after signing.
    std::fs::write(d("c.json"), catalog.replace("gpt-cat", "gpt-dog")).unwrap();
    refused(
        &airlock(
            dir.path(),
            &["catalog", "verify", "--trust", &d("k.pub"), &d("c.json")],
        ),
        "does not verify",
    );
    // A malformed catalog is never signed.
    std::fs::write(
        d("bad.json"),
        r#"{"schema_version": 1, "serial": 0, "models": []}"#,
    )
    .unwrap();
    refused(
        &airlock(
            dir.path(),
            &["catalog", "sign", "--key", &d("k"), &d("bad.json")],
        ),
        "serial",
    );
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(d("k")).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);
}
