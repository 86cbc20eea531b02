//! The warning a manifest gets at load when an integration's
//! `authorized_uris` or its `model.base_url` name a loopback or private
//! address that the egress guard refuses unless the operator lists the host
//! in `EGRESS_ALLOW_INTERNAL_HOSTS`: said before the run, not found in its
//! egress log after.

use std::net::IpAddr;

use airlock_egress::policy::INTERNAL_HOSTS_VAR;
use airlock_platform::manifest::Manifest;

/// The host of a URL pattern (`https://host:port/path`), without its port
/// or IPv6 brackets; `None` when it has no `scheme://`.
fn host_of(pattern: &str) -> Option<&str> {
    let rest = pattern.split_once("://")?.1;
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if let Some(v6) = authority.strip_prefix('[') {
        return v6.split(']').next();
    }
    Some(authority.split(':').next().unwrap_or(authority))
}

/// One warning per (integration, host) whose address the guard refuses and
/// `allowed` (the setting's hosts) does not list.
pub fn warnings(manifest: &Manifest, allowed: &[String]) -> Vec<String> {
    let refused = |url: &str| {
        let host = host_of(url)?;
        let ip = host.parse::<IpAddr>().ok()?;
        (airlock_egress::addr::is_blocked(ip) && !allowed.iter().any(|a| a == host))
            .then(|| host.to_owned())
    };
    let mut out = Vec::new();
    let mut warn = |what: String, host: String| {
        let w = format!(
            "warning: {what} names {host}, an address the egress guard refuses unless the operator lists it in {INTERNAL_HOSTS_VAR} (e.g. {INTERNAL_HOSTS_VAR}={host})"
        );
        if !out.contains(&w) {
            out.push(w);
        }
    };
    if let Some(model) = &manifest.model
        && let Some(host) = refused(&model.base_url)
    {
        warn("model.base_url".into(), host);
    }
    for integ in &manifest.integrations {
        for p in &integ.authorized_uris {
            if let Some(host) = refused(p) {
                warn(
                    format!("integration {}: authorized_uris", integ.namespace.as_str()),
                    host,
                );
            }
        }
    }
    out
}

/// The hosts the operator's setting lists.
pub fn allowed_from_env() -> Vec<String> {
    std::env::var(INTERNAL_HOSTS_VAR)
        .unwrap_or_default()
        .split(',')
        .map(|h| {
            h.trim()
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned()
        })
        .filter(|h| !h.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_of_patterns() {
        assert_eq!(host_of("http://127.0.0.1:8080/api/**"), Some("127.0.0.1"));
        assert_eq!(host_of("https://[::1]:8443/**"), Some("::1"));
        assert_eq!(host_of("https://api.github.com/**"), Some("api.github.com"));
        assert_eq!(host_of("no scheme"), None);
    }

    #[test]
    fn a_private_address_warns_unless_the_setting_lists_it() {
        let m = Manifest::parse(
            "[agent]\nname = \"w\"\ncommand = [\"true\"]\n\n[[integrations]]\nnamespace = \"svc\"\n\
             authorized_uris = [\"http://10.1.2.3:9/**\", \"https://api.github.com/**\"]\n",
        )
        .unwrap();
        let w = warnings(&m, &[]);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("EGRESS_ALLOW_INTERNAL_HOSTS=10.1.2.3"),
            "{w:?}"
        );
        assert!(warnings(&m, &["10.1.2.3".into()]).is_empty());
    }
}
