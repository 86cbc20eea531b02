//! The per-run certificate authority of the sidecar's intercepting proxy
//! (`inject = "proxy"`): generated for one run, never stored or reused. Its
//! key is handed to that run's sidecar on stdin and forgotten here; its
//! certificate is the only trust anchor the sandbox gets from it.

use airlock_platform_api::launch::ProxyCa;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use secrecy::SecretString;

#[derive(Debug, thiserror::Error)]
#[error("the run's proxy CA could not be made: {0}")]
pub struct CaError(String);

/// A fresh CA for `run_id`, valid for two days (no run lives longer).
pub fn generate(run_id: &str) -> Result<ProxyCa, CaError> {
    let err = |e: rcgen::Error| CaError(e.to_string());
    let key = KeyPair::generate().map_err(err)?;
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "Airlock");
    let short: String = run_id.chars().take(40).collect();
    dn.push(DnType::CommonName, format!("Airlock run {short}"));
    params.distinguished_name = dn;
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(2);
    let cert = params.self_signed(&key).map_err(err)?;
    Ok(ProxyCa {
        cert_pem: cert.pem(),
        key_pem: SecretString::from(key.serialize_pem()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use secrecy::ExposeSecret;

    #[test]
    fn each_run_gets_its_own_ca() {
        let a = generate("run_a").unwrap();
        let b = generate("run_b").unwrap();
        assert!(a.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(a.key_pem.expose_secret().contains("PRIVATE KEY"));
        assert_ne!(a.cert_pem, b.cert_pem);
        assert_ne!(a.key_pem.expose_secret(), b.key_pem.expose_secret());
        assert!(!a.cert_pem.contains("PRIVATE KEY"));
    }
}
