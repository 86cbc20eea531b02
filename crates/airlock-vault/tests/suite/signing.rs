//! Signing keyrings, run tokens, sidecar tokens.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use airlock_vault::{
    ExposeSecret, RunTokens, SigningError, SigningKeyring, ct_eq, generate_sidecar_token,
};
use hmac::{Hmac, KeyInit as _, Mac as _};
use sha2::Sha256;

const OLD: &str = "old-secret-0123456789";
const NEW: &str = "new-secret-abcdefghij";

fn tokens(v: &str) -> RunTokens {
    RunTokens::new(SigningKeyring::parse("RUN_TOKEN_SECRET", v).unwrap())
}

#[test]
fn run_token_format_is_hmac_sha256_lowercase_hex() {
    let t = tokens(NEW).issue("run_42");
    let mut mac = Hmac::<Sha256>::new_from_slice(NEW.as_bytes()).unwrap();
    mac.update(b"run_42");
    let want = format!("run_42.{}", hex::encode(mac.finalize().into_bytes()));
    assert_eq!(t.expose_secret(), want);
    // RFC 4231-style independent known answer: HMAC-SHA256("key", "The quick brown fox...")
    let k = SigningKeyring::parse("X", "key-key-key-key-key").unwrap();
    let mut mac = Hmac::<Sha256>::new_from_slice(b"key-key-key-key-key").unwrap();
    mac.update(b"The quick brown fox jumps over the lazy dog");
    assert_eq!(
        k.sign(b"The quick brown fox jumps over the lazy dog"),
        hex::encode(mac.finalize().into_bytes())
    );
}

#[test]
fn rotation_old_verifies_new_signs() {
    let before = tokens(OLD);
    let old_token = before.issue("run-1");
    let rotated = tokens(&format!("{NEW},{OLD}"));
    // old key still verifies
    assert_eq!(
        rotated.verify(old_token.expose_secret()).as_deref(),
        Some("run-1")
    );
    // new key signs
    let new_token = rotated.issue("run-1");
    assert_eq!(
        new_token.expose_secret(),
        tokens(NEW).issue("run-1").expose_secret()
    );
    assert_ne!(new_token.expose_secret(), old_token.expose_secret());
    assert_eq!(before.verify(new_token.expose_secret()), None);
    // once the old key is dropped, its tokens stop verifying
    assert_eq!(tokens(NEW).verify(old_token.expose_secret()), None);
    assert!(rotated.verify_for(&new_token, "run-1"));
    assert!(!rotated.verify_for(&new_token, "run-2"));
}

#[test]
fn tampered_tokens_fail() {
    let t = tokens(NEW);
    let good = t.issue("run-1").expose_secret().to_string();
    let (id, sig) = good.rsplit_once('.').unwrap();
    assert_eq!(
        t.verify(&format!("{id}.{}", sig.to_uppercase())),
        None,
        "uppercase hex"
    );
    assert_eq!(t.verify(&format!("run-2.{sig}")), None, "other run id");
    assert_eq!(t.verify(&format!("{id}.{}", &sig[..63])), None, "short");
    assert_eq!(t.verify(&format!("{id}.{sig}0")), None, "long");
    assert_eq!(t.verify(id), None, "no signature");
    assert_eq!(t.verify(&format!(".{sig}")), None, "no run id");
    assert_eq!(t.verify(""), None);
    let mut flipped = sig.as_bytes().to_vec();
    flipped[10] = if flipped[10] == b'a' { b'b' } else { b'a' };
    let flipped = String::from_utf8(flipped).unwrap();
    assert_eq!(t.verify(&format!("{id}.{flipped}")), None);
    // run ids may contain dots: the signature is after the last one
    let dotted = t.issue("a.b.c");
    assert_eq!(t.verify(dotted.expose_secret()).as_deref(), Some("a.b.c"));
}

#[test]
fn keyring_parse_errors() {
    let v = "RUN_TOKEN_SECRET";
    assert_eq!(
        SigningKeyring::parse(v, "").unwrap_err(),
        SigningError::Missing { var: v }
    );
    assert_eq!(
        SigningKeyring::parse(v, "  ").unwrap_err(),
        SigningError::Missing { var: v }
    );
    assert_eq!(
        SigningKeyring::parse(v, "short").unwrap_err(),
        SigningError::TooShort {
            var: v,
            index: 1,
            len: 5
        }
    );
    assert_eq!(
        SigningKeyring::parse(v, &format!("{NEW},fifteen-chars!!")).unwrap_err(),
        SigningError::TooShort {
            var: v,
            index: 2,
            len: 15
        }
    );
    assert_eq!(
        SigningKeyring::parse(v, &format!("{NEW},,{OLD}")).unwrap_err(),
        SigningError::Empty { var: v, index: 2 }
    );
    assert_eq!(
        SigningKeyring::parse(v, &format!("{NEW},")).unwrap_err(),
        SigningError::Empty { var: v, index: 2 }
    );
    let err = SigningKeyring::parse(v, "short").unwrap_err().to_string();
    assert!(
        err.contains("RUN_TOKEN_SECRET") && err.contains("16"),
        "{err}"
    );
    assert!(!err.contains("short\""), "the secret is not echoed: {err}");
    let ring = SigningKeyring::parse(v, &format!(" {NEW} , {OLD} ")).unwrap();
    assert_eq!(ring.len(), 2);
    let dbg = format!("{ring:?}");
    assert!(!dbg.contains(NEW) && !dbg.contains(OLD), "{dbg}");
    // exactly 16 characters is enough (counted in characters, not bytes)
    assert!(SigningKeyring::parse(v, "0123456789abcdef").is_ok());
    assert!(SigningKeyring::parse(v, "ééééééééééééééé").is_err());
}

#[test]
fn sidecar_tokens() {
    let a = generate_sidecar_token().unwrap();
    let b = generate_sidecar_token().unwrap();
    assert_eq!(a.expose_secret().len(), 64);
    assert!(
        a.expose_secret()
            .bytes()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
    );
    assert_ne!(a.expose_secret(), b.expose_secret());
    assert!(ct_eq(
        a.expose_secret().as_bytes(),
        a.expose_secret().as_bytes()
    ));
    assert!(!ct_eq(
        a.expose_secret().as_bytes(),
        b.expose_secret().as_bytes()
    ));
    assert!(!ct_eq(
        a.expose_secret().as_bytes(),
        &a.expose_secret().as_bytes()[..63]
    ));
    assert!(!format!("{a:?}").contains(a.expose_secret()));
}

#[test]
fn random_hex_is_lowercase_hex_of_the_asked_length_and_fresh() {
    let a = airlock_vault::random_hex::<6>().unwrap();
    let b = airlock_vault::random_hex::<6>().unwrap();
    assert_eq!(a.len(), 12);
    assert!(
        a.bytes()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
    );
    assert_ne!(a, b);
}
