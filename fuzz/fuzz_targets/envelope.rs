//! The credential envelope parser and decryption on arbitrary input: a
//! typed error or the plaintext, never a panic; and anything that decrypts
//! under the fuzz key must have been made by it (authentication holds).
#![no_main]

use airlock_vault::{Envelope, Keyring};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = Envelope::parse(text);
    let ring = Keyring::new("k1", &[7u8; 32]).expect("keyring");
    if ring.decrypt(text).is_ok() {
        // Only a genuine envelope under k1 can authenticate.
        assert!(text.starts_with("v1:k1:"), "{text:?} decrypted");
    }
    let sealed = ring.encrypt(data).expect("encrypt");
    let opened = ring.decrypt(&sealed).expect("round trip");
    assert_eq!(secrecy::ExposeSecret::expose_secret(&opened), data);
});
