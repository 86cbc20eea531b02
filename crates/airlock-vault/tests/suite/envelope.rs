//! Envelope and keyring behaviour, including the cross-implementation fixture.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use airlock_vault::{
    ENV_KEY, ENV_KEY_ID, ENV_RETIRED_KEYS, ExposeSecret, KeyError, Keyring, VaultError,
    generate_key,
};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use std::collections::HashMap;

const K1: [u8; 32] = [7u8; 32];
const K0: [u8; 32] = [9u8; 32];

fn ring() -> Keyring {
    Keyring::new("k1", &K1).unwrap()
}

fn b64(b: &[u8]) -> String {
    STANDARD.encode(b)
}

#[test]
fn round_trip() {
    let r = ring();
    for pt in [&b""[..], b"x", b"hello world", &[0u8; 4096][..]] {
        let env = r.encrypt(pt).unwrap();
        assert!(env.starts_with("v1:k1:"));
        assert_eq!(r.decrypt(&env).unwrap().expose_secret(), pt);
    }
    let env = r.encrypt("sécret ✓".as_bytes()).unwrap();
    assert_eq!(r.decrypt_string(&env).unwrap().expose_secret(), "sécret ✓");
}

#[test]
fn ivs_are_random() {
    let r = ring();
    let mut ivs = std::collections::HashSet::new();
    let mut envs = std::collections::HashSet::new();
    for _ in 0..1000 {
        let env = r.encrypt(b"same plaintext").unwrap();
        let raw = STANDARD.decode(&env["v1:k1:".len()..]).unwrap();
        assert!(ivs.insert(raw[..12].to_vec()), "IV repeated");
        assert!(envs.insert(env));
    }
}

fn flip(env: &str, byte: usize, bit: u8) -> String {
    let (head, payload) = env.rsplit_once(':').unwrap();
    let mut raw = STANDARD.decode(payload).unwrap();
    raw[byte] ^= 1 << bit;
    format!("{head}:{}", b64(&raw))
}

#[test]
fn any_flipped_bit_fails() {
    let r = ring();
    let env = r.encrypt(b"a credential value").unwrap();
    let len = STANDARD
        .decode(env.rsplit_once(':').unwrap().1)
        .unwrap()
        .len();
    // every bit of iv (0..12), tag (12..28) and ciphertext (28..)
    for byte in 0..len {
        for bit in 0..8 {
            let bad = flip(&env, byte, bit);
            assert_eq!(
                r.decrypt(&bad).unwrap_err(),
                VaultError::AuthenticationFailed("k1".into()),
                "byte {byte} bit {bit}"
            );
        }
    }
}

#[test]
fn truncated_or_extended_fails() {
    let r = ring();
    let env = r.encrypt(b"a credential value").unwrap();
    let raw = STANDARD.decode(env.rsplit_once(':').unwrap().1).unwrap();
    for cut in 28..raw.len() {
        let bad = format!("v1:k1:{}", b64(&raw[..cut]));
        assert_eq!(
            r.decrypt(&bad).unwrap_err(),
            VaultError::AuthenticationFailed("k1".into())
        );
    }
    for cut in 0..28 {
        let bad = format!("v1:k1:{}", b64(&raw[..cut]));
        assert_eq!(r.decrypt(&bad).unwrap_err(), VaultError::TooShort(cut));
    }
    let mut longer = raw.clone();
    longer.push(0);
    let bad = format!("v1:k1:{}", b64(&longer));
    assert_eq!(
        r.decrypt(&bad).unwrap_err(),
        VaultError::AuthenticationFailed("k1".into())
    );
    // chopping characters off the text form breaks the base64
    assert_eq!(
        r.decrypt(&env[..env.len() - 1]).unwrap_err(),
        VaultError::BadBase64
    );
}

#[test]
fn wrong_key_with_right_kid_fails() {
    let env = ring().encrypt(b"secret").unwrap();
    let other = Keyring::new("k1", &K0).unwrap();
    let err = other.decrypt(&env).unwrap_err();
    assert_eq!(err, VaultError::AuthenticationFailed("k1".into()));
    assert!(err.to_string().contains("wrong key"), "{err}");
}

#[test]
fn swapping_kid_fails() {
    // an envelope relabelled with another kid the ring holds does not authenticate
    let r = Keyring::new("k1", &K1)
        .unwrap()
        .with_retired("k0", &K0)
        .unwrap();
    let env = r.encrypt(b"secret").unwrap();
    let relabelled = env.replacen("v1:k1:", "v1:k0:", 1);
    assert_eq!(
        r.decrypt(&relabelled).unwrap_err(),
        VaultError::AuthenticationFailed("k0".into())
    );
}

#[test]
fn retired_kid_decrypts_and_reencrypts() {
    let old = Keyring::new("k0", &K0).unwrap();
    let env = old.encrypt(b"legacy").unwrap();
    let new = Keyring::new("k1", &K1)
        .unwrap()
        .with_retired("k0", &K0)
        .unwrap();
    assert_eq!(new.decrypt(&env).unwrap().expose_secret(), b"legacy");
    assert!(!new.is_current(&env));
    let re = new.reencrypt(&env).unwrap().unwrap();
    assert!(re.starts_with("v1:k1:"));
    assert!(new.is_current(&re));
    assert_eq!(new.reencrypt(&re).unwrap(), None);
    assert_eq!(new.decrypt(&re).unwrap().expose_secret(), b"legacy");
    // the old keyring cannot read the new envelope
    let err = old.decrypt(&re).unwrap_err();
    assert_eq!(err, VaultError::UnknownKid("k1".into()));
}

#[test]
fn unknown_kid_names_the_variable() {
    let env = Keyring::new("k7", &K0).unwrap().encrypt(b"x").unwrap();
    let err = ring().decrypt(&env).unwrap_err();
    assert_eq!(err, VaultError::UnknownKid("k7".into()));
    let msg = err.to_string();
    assert!(
        msg.contains("CONNECTION_ENCRYPTION_KEYS") && msg.contains("k7"),
        "{msg}"
    );
}

#[test]
fn every_parse_error() {
    let r = ring();
    let cases: &[(&str, VaultError)] = &[
        ("", VaultError::MissingPrefix),
        ("v2:k1:AAAA", VaultError::MissingPrefix),
        ("V1:k1:AAAA", VaultError::MissingPrefix),
        ("v1:k1", VaultError::Malformed),
        ("v1::AAAA", VaultError::BadKid(String::new())),
        ("v1:k 1:AAAA", VaultError::BadKid("k 1".into())),
        ("v1:k1:not base64!", VaultError::BadBase64),
        ("v1:k1:AAAAAA", VaultError::BadBase64),
        (
            "v1:k1:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA==\n",
            VaultError::BadBase64,
        ),
        ("v1:k1:AAAA", VaultError::TooShort(3)),
    ];
    for (input, want) in cases {
        assert_eq!(&r.decrypt(input).unwrap_err(), want, "{input:?}");
    }
    let long_kid = format!("v1:{}:AAAA", "k".repeat(33));
    assert!(matches!(r.decrypt(&long_kid), Err(VaultError::BadKid(_))));
    // messages say what is wrong
    assert!(VaultError::MissingPrefix.to_string().contains("v1:"));
    assert!(VaultError::TooShort(3).to_string().contains("3 bytes"));
}

fn lookup(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |name| map.get(name).cloned()
}

#[test]
fn keyring_from_values() {
    let k1 = b64(&K1);
    let k0 = b64(&K0);
    let r = Keyring::from_lookup(lookup(&[(ENV_KEY, &k1)])).unwrap();
    assert_eq!(r.active_kid(), "k1");
    let retired = format!(r#"{{"old": "{k0}"}}"#);
    let r = Keyring::from_lookup(lookup(&[
        (ENV_KEY, &k1),
        (ENV_KEY_ID, "k2"),
        (ENV_RETIRED_KEYS, &retired),
    ]))
    .unwrap();
    assert_eq!(r.active_kid(), "k2");
    assert_eq!(r.kids().collect::<Vec<_>>(), ["k2", "old"]);
    let old = Keyring::new("old", &K0).unwrap().encrypt(b"v").unwrap();
    assert_eq!(r.decrypt(&old).unwrap().expose_secret(), b"v");
    // Debug shows kids, never keys
    let dbg = format!("{r:?}");
    assert!(
        dbg.contains("k2") && !dbg.contains(&k1) && !dbg.contains("7, 7"),
        "{dbg}"
    );
}

#[test]
fn keyring_config_errors() {
    let k1 = b64(&K1);
    let e = |vars: &[(&str, &str)]| Keyring::from_lookup(lookup(vars)).unwrap_err();
    assert_eq!(e(&[]), KeyError::MissingActiveKey);
    assert_eq!(e(&[(ENV_KEY, "")]), KeyError::MissingActiveKey);
    assert!(e(&[]).to_string().contains("CONNECTION_ENCRYPTION_KEY"));
    // not 32 bytes
    let short = b64(&[1u8; 16]);
    let err = e(&[(ENV_KEY, &short)]);
    assert_eq!(
        err,
        KeyError::KeyLength {
            var: ENV_KEY,
            kid: "k1".into(),
            len: 16
        }
    );
    assert!(err.to_string().contains("32"));
    let long = b64(&[1u8; 33]);
    assert!(matches!(
        e(&[(ENV_KEY, &long)]),
        KeyError::KeyLength { len: 33, .. }
    ));
    // strict base64: no missing padding, no whitespace, no url-safe alphabet
    let unpadded = k1.trim_end_matches('=').to_string();
    assert!(matches!(
        e(&[(ENV_KEY, &unpadded)]),
        KeyError::KeyBase64 { .. }
    ));
    let spaced = format!("{k1}\n");
    assert!(matches!(
        e(&[(ENV_KEY, &spaced)]),
        KeyError::KeyBase64 { .. }
    ));
    let urlsafe = b64(&[0xfb; 32]).replace('+', "-").replace('/', "_");
    assert!(matches!(
        e(&[(ENV_KEY, &urlsafe)]),
        KeyError::KeyBase64 { .. }
    ));
    // bad kid
    assert!(matches!(
        e(&[(ENV_KEY, &k1), (ENV_KEY_ID, "k.1")]),
        KeyError::BadKid { .. }
    ));
    let bad_json_kid = format!(r#"{{"bad kid": "{k1}"}}"#);
    assert!(matches!(
        e(&[(ENV_KEY, &k1), (ENV_RETIRED_KEYS, &bad_json_kid)]),
        KeyError::BadKid {
            var: ENV_RETIRED_KEYS,
            ..
        }
    ));
    // retired JSON: wrong shape, syntax; the message must not quote the value
    let secretish = "c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0MTI=";
    for bad in [
        format!(r#"["{secretish}"]"#),
        format!(r#"{{"k0": ["{secretish}"]}}"#),
        format!(r#"{{"k0": "{secretish}""#),
        "{k0: 1}".to_string(),
    ] {
        let err = e(&[(ENV_KEY, &k1), (ENV_RETIRED_KEYS, &bad)]);
        assert!(matches!(err, KeyError::RetiredJson(_)), "{bad}: {err:?}");
        assert!(!err.to_string().contains(secretish), "{err}");
    }
    // retired key of the wrong length
    let short_retired = format!(r#"{{"k0": "{short}"}}"#);
    assert!(matches!(
        e(&[(ENV_KEY, &k1), (ENV_RETIRED_KEYS, &short_retired)]),
        KeyError::KeyLength {
            var: ENV_RETIRED_KEYS,
            len: 16,
            ..
        }
    ));
    // the active kid again with another key
    let conflict = format!(r#"{{"k1": "{}"}}"#, b64(&K0));
    assert_eq!(
        e(&[(ENV_KEY, &k1), (ENV_RETIRED_KEYS, &conflict)]),
        KeyError::ConflictingKid("k1".into())
    );
    // ... and with the same key it is harmless
    let same = format!(r#"{{"k1": "{k1}"}}"#);
    assert!(Keyring::from_lookup(lookup(&[(ENV_KEY, &k1), (ENV_RETIRED_KEYS, &same)])).is_ok());
}

#[test]
fn generated_keys_work() {
    let a = generate_key().unwrap();
    let b = generate_key().unwrap();
    assert_ne!(a.expose_secret(), b.expose_secret());
    assert_eq!(STANDARD.decode(a.expose_secret()).unwrap().len(), 32);
    let r = Keyring::from_values(Some(a.expose_secret()), None, None).unwrap();
    let env = r.encrypt(b"x").unwrap();
    assert_eq!(r.decrypt(&env).unwrap().expose_secret(), b"x");
    assert_eq!(format!("{a:?}"), "SecretBox<str>([REDACTED])");
}

// ---- cross-implementation: pyca/cryptography ----

#[derive(serde::Deserialize)]
struct Fixture {
    keys: HashMap<String, String>,
    active_kid: String,
    cases: Vec<Case>,
}

#[derive(serde::Deserialize)]
struct Case {
    kid: String,
    plaintext_b64: String,
    iv_b64: String,
    envelope: String,
}

fn fixture() -> Fixture {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/envelopes.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn fixture_ring(f: &Fixture) -> Keyring {
    let retired: HashMap<_, _> = f.keys.iter().filter(|(k, _)| **k != f.active_kid).collect();
    Keyring::from_values(
        Some(&f.keys[&f.active_kid]),
        Some(&f.active_kid),
        Some(&serde_json::to_string(&retired).unwrap()),
    )
    .unwrap()
}

#[test]
fn we_decrypt_python_envelopes() {
    let f = fixture();
    let r = fixture_ring(&f);
    assert!(f.cases.len() >= 8);
    for c in &f.cases {
        assert!(c.envelope.starts_with(&format!("v1:{}:", c.kid)));
        let raw = STANDARD
            .decode(c.envelope.rsplit_once(':').unwrap().1)
            .unwrap();
        assert_eq!(b64(&raw[..12]), c.iv_b64, "iv comes first");
        let pt = r.decrypt(&c.envelope).unwrap();
        assert_eq!(b64(pt.expose_secret()), c.plaintext_b64);
        // and a flipped bit in their envelope fails here too
        let bad = flip(&c.envelope, 12, 0);
        assert!(matches!(
            r.decrypt(&bad),
            Err(VaultError::AuthenticationFailed(_))
        ));
    }
}

/// Whether `python3` with the `cryptography` module is usable. In CI its absence is a failure.
fn python_with_cryptography() -> bool {
    let ok = std::process::Command::new("python3")
        .args(["-c", "import cryptography.hazmat.primitives.ciphers.aead"])
        .output()
        .is_ok_and(|o| o.status.success());
    airlock_test_support::require_peer(
        "python3 with the `cryptography` module",
        ok.then_some(())
            .ok_or("not available; the Rust→Python envelope check did not run"),
    )
    .is_some()
}

#[test]
fn python_decrypts_our_envelopes() {
    if !python_with_cryptography() {
        return;
    }
    use std::io::Write as _;
    let f = fixture();
    let r = fixture_ring(&f);
    let mut plaintexts: Vec<Vec<u8>> = vec![
        b"".to_vec(),
        b"ghp_ourToken".to_vec(),
        "ünïcødé ✓".as_bytes().to_vec(),
        (0..=255u8).cycle().take(3000).collect(),
    ];
    let mut envelopes: Vec<String> = plaintexts.iter().map(|p| r.encrypt(p).unwrap()).collect();
    // one envelope under the retired key too
    let retired_kid = f.keys.keys().find(|k| **k != f.active_kid).unwrap();
    let key = STANDARD.decode(&f.keys[retired_kid]).unwrap();
    envelopes.push(
        Keyring::new(retired_kid, &key)
            .unwrap()
            .encrypt(b"old")
            .unwrap(),
    );
    plaintexts.push(b"old".to_vec());

    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/decrypt_envelope.py"
    );
    let mut child = std::process::Command::new("python3")
        .arg(script)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let req = serde_json::json!({ "keys": f.keys, "envelopes": envelopes });
    child
        .stdin
        .take()
        .unwrap()
        .write_all(req.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "python: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let resp: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let got: Vec<String> = serde_json::from_value(resp["plaintexts_b64"].clone()).unwrap();
    let want: Vec<String> = plaintexts.iter().map(|p| b64(p)).collect();
    assert_eq!(got, want);

    // a tampered envelope of ours fails in Python as well
    let mut child = std::process::Command::new("python3")
        .arg(script)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let req = serde_json::json!({ "keys": f.keys, "envelopes": [flip(&envelopes[1], 30, 3)] });
    child
        .stdin
        .take()
        .unwrap()
        .write_all(req.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

mod props {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trip_any(pt in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let r = ring();
            let env = r.encrypt(&pt).unwrap();
            let got = r.decrypt(&env).unwrap();
            prop_assert_eq!(got.expose_secret(), &pt[..]);
        }

        #[test]
        fn garbage_never_panics(s in ".{0,200}") {
            let _ = ring().decrypt(&s);
            let _ = ring().decrypt(&format!("v1:k1:{s}"));
        }
    }
}
