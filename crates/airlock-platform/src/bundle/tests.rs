//! The attacks on a signed bundle, each refused with its code; the
//! legitimate bundle verifies.

use std::path::Path;

use super::*;
use crate::signing::SecretKey;

fn write(dir: &Path, rel: &str, text: &str) {
    let p = dir.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

/// An agent directory, packed and signed by `key`.
fn signed_bundle(key: &SecretKey) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    write(
        d.path(),
        "airlock.toml",
        "[agent]\nname = \"a\"\ncommand = [\"python3\", \"agent.py\"]\n",
    );
    write(d.path(), "agent.py", "print('hi')\n");
    write(d.path(), "lib/util.py", "X = 1\n");
    pack_and_sign(d.path(), key);
    d
}

fn pack_and_sign(dir: &Path, key: &SecretKey) {
    let m = BundleManifest::of_dir(dir).unwrap().to_file();
    std::fs::write(dir.join(MANIFEST_FILE), &m).unwrap();
    sign_manifest(dir, key, m.as_bytes());
}

fn sign_manifest(dir: &Path, key: &SecretKey, manifest: &[u8]) {
    let sig = key.sign(Purpose::Bundle, manifest).to_file();
    std::fs::write(dir.join(SIGNATURE_FILE), sig).unwrap();
}

fn settings(policy: SignaturePolicy, key: &SecretKey) -> BundleSettings {
    BundleSettings {
        policy,
        trust: TrustRoot::of(vec![key.public()]),
    }
}

fn code(dir: &Path, s: &BundleSettings) -> &'static str {
    check(dir, s).unwrap_err().code()
}

#[test]
fn the_legitimate_signed_bundle_verifies() {
    let key = SecretKey::generate().unwrap();
    let d = signed_bundle(&key);
    let m = BundleManifest::parse(&std::fs::read(d.path().join(MANIFEST_FILE)).unwrap()).unwrap();
    let paths: Vec<&str> = m.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, ["agent.py", "airlock.toml", "lib/util.py"]);
    assert_eq!(m.files[0].size, 12);
    for policy in [SignaturePolicy::Warn, SignaturePolicy::Required] {
        assert_eq!(
            check(d.path(), &settings(policy, &key)),
            Ok(Verdict::Verified {
                key_id: key.public().id().to_owned()
            })
        );
    }
}

#[test]
fn a_file_changed_added_removed_or_renamed_after_signing_is_refused() {
    let key = SecretKey::generate().unwrap();
    let s = settings(SignaturePolicy::Warn, &key);
    type Attack = fn(&Path);
    let cases: [(&str, Attack); 5] = [
        ("file_changed", |d| write(d, "agent.py", "print('pwned')\n")),
        ("file_changed", |d| write(d, "lib/util.py", "X = 2\n")),
        ("file_added", |d| write(d, "zz_extra.py", "")),
        ("file_removed", |d| {
            std::fs::remove_file(d.join("lib/util.py")).unwrap()
        }),
        ("file_removed", |d| {
            std::fs::rename(d.join("agent.py"), d.join("agent2.py")).unwrap();
        }),
    ];
    for (want, attack) in cases {
        let d = signed_bundle(&key);
        attack(d.path());
        assert_eq!(code(d.path(), &s), want);
    }
}

#[test]
fn a_path_out_of_the_bundle_is_refused() {
    let key = SecretKey::generate().unwrap();
    let s = settings(SignaturePolicy::Required, &key);
    // A symbolic link out, signed or added.
    let d = signed_bundle(&key);
    std::os::unix::fs::symlink("/etc/passwd", d.path().join("lib/passwd")).unwrap();
    assert_eq!(code(d.path(), &s), "path_escape");
    assert!(matches!(
        BundleManifest::of_dir(d.path()),
        Err(BundleRefusal::PathEscape(p)) if p == "lib/passwd"
    ));
    // A manifest (validly signed) naming `../` or an absolute path.
    for bad in ["../outside.py", "/etc/passwd", "lib/../../x"] {
        let d = signed_bundle(&key);
        let text = std::fs::read_to_string(d.path().join(MANIFEST_FILE)).unwrap();
        let text = text.replace("\"agent.py\"", &format!("{bad:?}"));
        std::fs::write(d.path().join(MANIFEST_FILE), &text).unwrap();
        sign_manifest(d.path(), &key, text.as_bytes());
        assert_eq!(code(d.path(), &s), "path_escape", "{bad}");
    }
}

#[test]
fn signatures_by_untrusted_keys_or_over_other_content_are_refused() {
    let key = SecretKey::generate().unwrap();
    let stranger = SecretKey::generate().unwrap();
    // A valid signature by a key that is not trusted.
    let d = signed_bundle(&stranger);
    assert_eq!(
        code(d.path(), &settings(SignaturePolicy::Required, &key)),
        "key_untrusted"
    );
    // Under warn it runs, with the reason.
    assert!(matches!(
        check(d.path(), &settings(SignaturePolicy::Warn, &key)),
        Ok(Verdict::Untrusted(BundleRefusal::KeyUntrusted(_)))
    ));
    // A trusted key's signature of another manifest.
    let d = signed_bundle(&key);
    sign_manifest(d.path(), &key, b"{}");
    assert_eq!(
        code(d.path(), &settings(SignaturePolicy::Warn, &key)),
        "signature_invalid"
    );
    // A chain from a stranger.
    let d = signed_bundle(&key);
    let leaf = SecretKey::generate().unwrap();
    let m = std::fs::read(d.path().join(MANIFEST_FILE)).unwrap();
    let mut sig = leaf.sign(Purpose::Bundle, &m);
    sig.chain = vec![stranger.endorse(&leaf.public())];
    std::fs::write(d.path().join(SIGNATURE_FILE), sig.to_file()).unwrap();
    assert_eq!(
        code(d.path(), &settings(SignaturePolicy::Required, &key)),
        "chain_untrusted"
    );
    // The same leaf endorsed by the trusted key verifies.
    sig.chain = vec![key.endorse(&leaf.public())];
    std::fs::write(d.path().join(SIGNATURE_FILE), sig.to_file()).unwrap();
    assert!(matches!(
        check(d.path(), &settings(SignaturePolicy::Required, &key)),
        Ok(Verdict::Verified { key_id }) if key_id == leaf.public().id()
    ));
}

#[test]
fn the_policy_decides_for_an_unsigned_or_malformed_bundle() {
    let key = SecretKey::generate().unwrap();
    let d = tempfile::tempdir().unwrap();
    write(d.path(), "agent.py", "");
    assert_eq!(
        code(d.path(), &settings(SignaturePolicy::Required, &key)),
        "unsigned_required"
    );
    assert_eq!(
        check(d.path(), &settings(SignaturePolicy::Warn, &key)),
        Ok(Verdict::Unsigned)
    );
    // Off reads nothing, even of a tampered bundle.
    let d = signed_bundle(&key);
    write(d.path(), "agent.py", "changed");
    assert_eq!(
        check(d.path(), &settings(SignaturePolicy::Off, &key)),
        Ok(Verdict::NotChecked)
    );
    // Malformed manifests and signatures.
    for (file, text) in [
        (MANIFEST_FILE, "not json"),
        (MANIFEST_FILE, r#"{"schema_version": 2, "files": []}"#),
        (
            MANIFEST_FILE,
            r#"{"schema_version": 1, "files": [], "x": 1}"#,
        ),
        (
            SIGNATURE_FILE,
            r#"{"schema_version": 1, "key_id": "x", "signature": "AAAA"}"#,
        ),
    ] {
        let d = signed_bundle(&key);
        std::fs::write(d.path().join(file), text).unwrap();
        if file == MANIFEST_FILE {
            sign_manifest(d.path(), &key, text.as_bytes());
        }
        assert_eq!(
            code(d.path(), &settings(SignaturePolicy::Warn, &key)),
            "malformed",
            "{text}"
        );
    }
    // Unsorted or repeated paths.
    let d = signed_bundle(&key);
    let mut m =
        BundleManifest::parse(&std::fs::read(d.path().join(MANIFEST_FILE)).unwrap()).unwrap();
    m.files.swap(0, 1);
    let text = serde_json::to_string(&m).unwrap();
    std::fs::write(d.path().join(MANIFEST_FILE), &text).unwrap();
    sign_manifest(d.path(), &key, text.as_bytes());
    assert_eq!(
        code(d.path(), &settings(SignaturePolicy::Warn, &key)),
        "malformed"
    );
}

#[test]
fn the_settings_are_checked() {
    let key = SecretKey::generate().unwrap();
    let trust = format!("[{}]", key.public().to_file());
    let s = BundleSettings::from_vars(None, None).unwrap();
    assert_eq!(s.policy, SignaturePolicy::Warn);
    let s = BundleSettings::from_vars(Some("required"), Some(&trust)).unwrap();
    assert_eq!(s.policy, SignaturePolicy::Required);
    assert_eq!(
        BundleSettings::from_vars(Some("strict"), None)
            .unwrap_err()
            .var,
        ENV_POLICY
    );
    assert_eq!(
        BundleSettings::from_vars(Some("required"), None)
            .unwrap_err()
            .var,
        ENV_TRUST_ROOT
    );
    assert_eq!(
        BundleSettings::from_vars(None, Some("[1]"))
            .unwrap_err()
            .var,
        ENV_TRUST_ROOT
    );
}
