//! The decision: may this request leave, and to which addresses?
//!
//! [`Guard::admit`] runs the checks of docs/egress.md in their fixed order and
//! returns the addresses the client may dial. The order matters for safety,
//! not only for error codes: policy and blocked names are judged before any
//! lookup, so a refused target never even causes a DNS query, and the
//! internal-host exemption comes *after* the blocked names, so no operator
//! setting can ever open `localhost` or `metadata.google.internal`.
//!
//! The guard never logs: a refused target may hold a credential substituted
//! into it, and only the caller knows what to redact. Callers record (and
//! log) the decision with the credential removed.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use crate::addr;
use crate::error::{EgressCode, EgressError, GuardStep};
use crate::pattern::AuthorizedUris;
use crate::resolve::{Resolve, SystemResolver};
use crate::rules::{Hold, Intent};
use crate::target::{Target, TargetHost};

/// The operator's setting that exempts named internal hosts from the
/// address table (docs/configuration.md); a refusal by that table names it.
pub const INTERNAL_HOSTS_VAR: &str = "EGRESS_ALLOW_INTERNAL_HOSTS";

/// Names refused on every call, whatever they resolve to.
pub const BLOCKED_NAMES: &[&str] = &[
    "localhost",
    "sidecar",
    "agent",
    "host.docker.internal",
    "metadata.google.internal",
    "metadata.azure.internal",
];

/// What one call is allowed to reach.
#[derive(Debug, Clone, Copy)]
pub struct CallRules<'a> {
    pub authorized: &'a AuthorizedUris,
    /// Any destination that passes the SSRF checks. Ignored when the call
    /// carries a credential (rule 2).
    pub allow_all_uris: bool,
    /// The call carries a credential (rules 2–4 apply).
    pub credentialed: bool,
}

/// Operator-level settings shared by every call of a process.
#[derive(Debug, Clone, Default)]
pub struct EgressPolicy {
    internal_hosts: HashSet<String>,
    extra_blocked_names: HashSet<String>,
    /// Addresses this process listens on: never dialled (a loop back into
    /// the process), whatever exemption applies.
    own_listeners: Vec<SocketAddr>,
}

impl EgressPolicy {
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads `EGRESS_ALLOW_INTERNAL_HOSTS` from the environment.
    pub fn from_env() -> Self {
        let mut p = Self::new();
        if let Ok(v) = std::env::var(INTERNAL_HOSTS_VAR) {
            p.allow_internal_hosts(v.split(','));
        }
        p
    }

    /// Adds operator-trusted internal hosts (host names or IP addresses).
    pub fn allow_internal_hosts<'a>(&mut self, hosts: impl IntoIterator<Item = &'a str>) {
        for h in hosts {
            let h = h.trim().to_ascii_lowercase();
            let h = h.trim_start_matches('[').trim_end_matches(']');
            let h = h.strip_suffix('.').unwrap_or(h);
            if h.is_empty() {
                continue;
            }
            let canonical = h
                .parse::<IpAddr>()
                .map(|ip| ip.to_string())
                .unwrap_or_else(|_| h.to_owned());
            self.internal_hosts.insert(canonical);
        }
    }

    /// Adds names refused on every call (the run's own container names).
    pub fn block_names<'a>(&mut self, names: impl IntoIterator<Item = &'a str>) {
        for n in names {
            self.extra_blocked_names
                .insert(n.trim().to_ascii_lowercase());
        }
    }

    /// Refuses every address that reaches one of these listeners of this
    /// process (`blocked_address`), even through the internal-host exemption:
    /// the sidecar registers the addresses it bound, so a loop back into it
    /// is refused for every egress site by the same step, without a lookup.
    pub fn refuse_own_listeners(&mut self, addrs: impl IntoIterator<Item = SocketAddr>) {
        for a in addrs {
            let a = SocketAddr::new(a.ip().to_canonical(), a.port());
            if !self.own_listeners.contains(&a) {
                self.own_listeners.push(a);
            }
        }
    }

    /// True when dialling `addr` reaches one of the registered listeners: the
    /// same address and port, or a loopback or unspecified address on the
    /// port of a listener bound to loopback or to every address.
    pub fn is_own_listener(&self, addr: SocketAddr) -> bool {
        let ip = addr.ip().to_canonical();
        let local = |ip: IpAddr| ip.is_loopback() || ip.is_unspecified();
        self.own_listeners.iter().any(|own| {
            own.port() == addr.port() && (own.ip() == ip || (local(own.ip()) && local(ip)))
        })
    }

    /// True when an open connection from `local` to `peer` loops back into
    /// this process: a registered listener, or this host itself (peer and
    /// local address equal) on the port of one (a listener bound to every
    /// address is reachable at each of the host's own addresses).
    pub fn is_loop(&self, local: SocketAddr, peer: SocketAddr) -> bool {
        !self.own_listeners.is_empty()
            && (self.is_own_listener(peer)
                || (peer.ip().to_canonical() == local.ip().to_canonical()
                    && self.own_listeners.iter().any(|o| o.port() == peer.port())))
    }

    /// True when listeners are registered ([`EgressPolicy::refuse_own_listeners`]).
    pub fn has_own_listeners(&self) -> bool {
        !self.own_listeners.is_empty()
    }

    /// Steps 2–4: the synchronous part of the decision.
    pub fn check(
        &self,
        target: &Target,
        intent: Intent<'_>,
        rules: &CallRules<'_>,
    ) -> Result<Checked, EgressError> {
        check_authorization(target, rules)?;
        let hold = check_rules(target, intent, rules.authorized)?;
        let internal = self.check_name(target, rules)?;
        Ok(Checked { internal, hold })
    }

    /// Steps 3–4: blocked names, then whether the target is an
    /// operator-trusted internal host.
    fn check_name(&self, target: &Target, rules: &CallRules<'_>) -> Result<bool, EgressError> {
        let host = target.host();
        if let TargetHost::Domain(d) = host
            && self.is_blocked_name(d)
        {
            return Err(EgressError::new(
                EgressCode::BlockedHost,
                GuardStep::BlockedNames,
                Some(d),
                format!("{d} is a blocked name (loopback, metadata or the run's own containers)"),
            ));
        }
        if self.internal_hosts.is_empty() {
            return Ok(false);
        }
        let bare = host.bare();
        Ok(self.internal_hosts.contains(bare.as_ref())
            && rules.authorized.names_host_literally(&bare))
    }

    fn is_blocked_name(&self, d: &str) -> bool {
        BLOCKED_NAMES.contains(&d)
            || d.ends_with(".localhost")
            || (!self.extra_blocked_names.is_empty() && self.extra_blocked_names.contains(d))
    }
}

/// Step 2: `authorized_uris` and the credential rules.
fn check_authorization(target: &Target, rules: &CallRules<'_>) -> Result<(), EgressError> {
    let refuse = |code, guard, detail: String| {
        Err(EgressError::new(
            code,
            guard,
            Some(&target.host().bare()),
            detail,
        ))
    };
    if !rules.credentialed {
        if rules.allow_all_uris || rules.authorized.entries().iter().any(|p| p.matches(target)) {
            return Ok(());
        }
        return refuse(
            EgressCode::NotAuthorized,
            GuardStep::AuthorizedUris,
            format!("{} matches no authorized_uris entry", target.loggable()),
        );
    }
    if target.had_userinfo() {
        return Err(EgressError::invalid_url(
            "a target with user:password@ is refused for calls that carry a credential",
        ));
    }
    let mut matched_but_too_wide = None;
    for p in rules.authorized.entries() {
        if p.matches(target) {
            if p.carries_credential_to(target) {
                return check_decoded_path(target, rules.authorized);
            }
            matched_but_too_wide.get_or_insert(p.source());
        }
    }
    if let Some(entry) = matched_but_too_wide {
        return refuse(
            EgressCode::CredentialExfiltrationRefused,
            GuardStep::CredentialRules,
            format!(
                "{} matches {entry:?}, but that entry may not carry a credential to {} \
                 (the host is chosen by the caller or lies outside the entry's registrable domain)",
                target.loggable(),
                target.host()
            ),
        );
    }
    if rules.allow_all_uris {
        return refuse(
            EgressCode::CredentialExfiltrationRefused,
            GuardStep::CredentialRules,
            format!(
                "allow_all_uris is ignored for calls that carry a credential, and {} matches no authorized_uris entry",
                target.loggable()
            ),
        );
    }
    let detail = if rules.authorized.is_empty() {
        "the integration's authorized_uris is empty, which authorizes nothing".to_owned()
    } else {
        format!("{} matches no authorized_uris entry", target.loggable())
    };
    refuse(EgressCode::NotAuthorized, GuardStep::AuthorizedUris, detail)
}

/// What steps 2–4 decided about a target they did not refuse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    /// An operator-trusted internal host (its addresses are not judged).
    pub internal: bool,
    /// An `ask` rule admitted it: it waits for a person's answer.
    pub hold: Option<Hold>,
}

/// Step 2, continued: the L7 rules that narrow the list ([`crate::rules`]),
/// judged once the list has admitted the target; `Some` when an `ask` rule
/// holds it.
fn check_rules(
    target: &Target,
    intent: Intent<'_>,
    authorized: &AuthorizedUris,
) -> Result<Option<Hold>, EgressError> {
    let rules = authorized.rules();
    if rules.is_empty() {
        return Ok(None);
    }
    rules.judge(target, intent).map_err(|refusal| {
        EgressError::new(
            EgressCode::RuleRefused,
            GuardStep::Rules,
            Some(&target.host().bare()),
            format!("{}: {refusal}", target.loggable()),
        )
        .by_rule(refusal)
    })
}

/// The credential rule for encoded separators (issue 44.3): a credentialed
/// target must also carry its credential where a server that decodes `%2F`,
/// `%5C` and `%2E` (and normalises `..`) would route it. `/api/..%2fprivate`
/// matches `/api/**` as written but is `/private` to many servers: refused
/// (`invalid_url`, the credential rules), on every path the guard judges.
/// An encoded separator that stays inside what an entry covers
/// (`/api/v4/projects/group%2Fproject` under `/api/**`) is admitted.
fn check_decoded_path(target: &Target, authorized: &AuthorizedUris) -> Result<(), EgressError> {
    let Some(view) = target.as_decoded_by_servers()? else {
        return Ok(());
    };
    if authorized
        .entries()
        .iter()
        .any(|p| p.matches(&view) && p.carries_credential_to(&view))
    {
        return Ok(());
    }
    Err(EgressError::new(
        EgressCode::InvalidUrl,
        GuardStep::CredentialRules,
        Some(&target.host().bare()),
        format!(
            "{} holds an encoded '/', '\\' or '.' in its path, and decoded ({}) it matches \
             no authorized_uris entry that may carry the credential",
            target.loggable(),
            view.loggable()
        ),
    ))
}

/// A target the guard let through, with the only addresses it may be dialled at.
#[derive(Debug, Clone)]
pub struct Admitted {
    pub target: Target,
    pub addrs: Vec<IpAddr>,
    /// Reached through the operator's internal-host exemption (addresses not judged).
    pub internal: bool,
    /// An `ask` rule holds it: nothing of it may leave until a person
    /// allowed it (the caller's to ask; [`crate::Admission::release`]).
    pub hold: Option<Hold>,
}

impl Admitted {
    /// Refuses (`approval_required`) what an `ask` rule still holds: no
    /// byte of a held request is sent, on any path, until its caller asked
    /// a person and released it.
    pub fn unheld(&self) -> Result<(), EgressError> {
        match &self.hold {
            None => Ok(()),
            Some(hold) => Err(EgressError::new(
                EgressCode::ApprovalRequired,
                GuardStep::Approval,
                Some(&self.target.host().bare()),
                format!(
                    "{}: rule {:?} holds it for a person's answer, which this path cannot wait for",
                    self.target.loggable(),
                    hold.rule
                ),
            )),
        }
    }
}

/// The policy plus a resolver: the full decision for one request or hop.
#[derive(Clone)]
pub struct Guard {
    policy: Arc<EgressPolicy>,
    resolver: Arc<dyn Resolve>,
}

impl Guard {
    pub fn new(policy: EgressPolicy, resolver: Arc<dyn Resolve>) -> Self {
        Guard {
            policy: Arc::new(policy),
            resolver,
        }
    }

    /// The system resolver and `EGRESS_ALLOW_INTERNAL_HOSTS` from the environment.
    pub fn from_env() -> Self {
        Self::new(EgressPolicy::from_env(), Arc::new(SystemResolver))
    }

    pub fn policy(&self) -> &EgressPolicy {
        &self.policy
    }

    /// Steps 2–6 for a parsed target and what the request does there
    /// ([`Intent`]: its method, or a tunnel): the addresses it may be
    /// dialled at, or the refusal (never logged here; see the module docs).
    pub async fn admit(
        &self,
        target: &Target,
        intent: Intent<'_>,
        rules: &CallRules<'_>,
    ) -> Result<Admitted, EgressError> {
        self.admit_inner(target, intent, rules).await
    }

    /// Step 1 too: parse, then admit.
    pub async fn admit_url(
        &self,
        url: &str,
        intent: Intent<'_>,
        rules: &CallRules<'_>,
    ) -> Result<Admitted, EgressError> {
        self.admit(&Target::parse(url)?, intent, rules).await
    }

    async fn admit_inner(
        &self,
        target: &Target,
        intent: Intent<'_>,
        rules: &CallRules<'_>,
    ) -> Result<Admitted, EgressError> {
        let Checked { internal, hold } = self.policy.check(target, intent, rules)?;
        let host = target.host();
        let addrs = match host {
            TargetHost::Ip(ip) => vec![*ip],
            TargetHost::Domain(d) => {
                // A trusted internal host is resolved the way the system
                // resolves it (docs/egress.md, "Internal hosts"); every other
                // host by the guard's own resolver.
                let lookup = if internal {
                    self.resolver.lookup_internal(d)
                } else {
                    self.resolver.lookup(d)
                };
                let answers = lookup.await.map_err(|e| {
                    EgressError::new(
                        EgressCode::Unresolvable,
                        GuardStep::Resolver,
                        Some(d),
                        format!("target host could not be resolved: {e}"),
                    )
                })?;
                if answers.is_empty() {
                    return Err(EgressError::new(
                        EgressCode::Unresolvable,
                        GuardStep::Resolver,
                        Some(d),
                        "target host could not be resolved: no A or AAAA answer",
                    ));
                }
                answers
            }
        };
        if !self.policy.own_listeners.is_empty() {
            let port = target.port_or_default();
            if let Some(ip) = addrs
                .iter()
                .find(|ip| self.policy.is_own_listener(SocketAddr::new(**ip, port)))
            {
                return Err(EgressError::new(
                    EgressCode::BlockedAddress,
                    GuardStep::AddressTable,
                    Some(&host.bare()),
                    format!(
                        "{} resolves to the sidecar's own listener (port {port})",
                        host.bare()
                    ),
                )
                .at(ip));
            }
        }
        if !internal {
            // Refuse if ANY answer is blocked: picking the "good" answer would
            // leave the choice of address to whoever controls the zone.
            for ip in &addrs {
                if let Some(why) = addr::blocked_reason(*ip) {
                    return Err(EgressError::new(
                        EgressCode::BlockedAddress,
                        GuardStep::AddressTable,
                        Some(&host.bare()),
                        format!(
                            "{} resolves to a blocked address: {why} (an operator who means to reach it lists the host in {INTERNAL_HOSTS_VAR})",
                            host.bare()
                        ),
                    )
                    .at(ip));
                }
            }
        }
        Ok(Admitted {
            target: target.clone(),
            addrs,
            internal,
            hold,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resolve::StaticResolver;

    const GET: Intent<'static> = Intent::Request(&http::Method::GET);

    fn rules(list: &AuthorizedUris, credentialed: bool) -> CallRules<'_> {
        CallRules {
            authorized: list,
            allow_all_uris: false,
            credentialed,
        }
    }

    fn guard(static_answers: &[(&str, &str)], internal: &[&str]) -> Guard {
        let mut r = StaticResolver::new();
        for (h, ip) in static_answers {
            r.insert_spec(&format!("{h}={ip}")).unwrap();
        }
        let mut p = EgressPolicy::new();
        p.allow_internal_hosts(internal.iter().copied());
        Guard::new(p, Arc::new(r))
    }

    async fn code(g: &Guard, url: &str, list: &AuthorizedUris, cred: bool) -> Option<EgressCode> {
        g.admit_url(url, GET, &rules(list, cred))
            .await
            .err()
            .map(|e| e.code)
    }

    #[tokio::test]
    async fn credential_rules() {
        use EgressCode::*;
        let g = guard(
            &[
                ("api.github.com", "140.82.112.6"),
                ("sts.amazonaws.com", "52.94.0.1"),
                ("dynamodb.us-east-1.amazonaws.com", "52.94.0.2"),
                ("evil.com", "93.184.216.34"),
            ],
            &[],
        );
        let empty = AuthorizedUris::default();
        assert_eq!(
            code(&g, "https://api.github.com/", &empty, true).await,
            Some(NotAuthorized),
            "rule 1"
        );
        assert_eq!(
            code(&g, "https://api.github.com/", &empty, false).await,
            Some(NotAuthorized),
            "rule 1 uncredentialed"
        );
        let all = CallRules {
            authorized: &empty,
            allow_all_uris: true,
            credentialed: true,
        };
        assert_eq!(
            g.admit_url("https://evil.com/", GET, &all)
                .await
                .unwrap_err()
                .code,
            CredentialExfiltrationRefused,
            "rule 2"
        );
        let all_uncred = CallRules {
            authorized: &empty,
            allow_all_uris: true,
            credentialed: false,
        };
        assert!(
            g.admit_url("https://evil.com/", GET, &all_uncred)
                .await
                .is_ok()
        );
        let wide = AuthorizedUris::parse(&["https://**", "https://*.com/**"]);
        assert_eq!(
            code(&g, "https://evil.com/x", &wide, true).await,
            Some(CredentialExfiltrationRefused),
            "rule 3"
        );
        assert_eq!(
            code(&g, "https://evil.com/x", &wide, false).await,
            None,
            "rule 3 is only for credentials"
        );
        let aws = AuthorizedUris::parse(&["https://*.amazonaws.com/**"]);
        assert_eq!(
            code(&g, "https://sts.amazonaws.com/", &aws, true).await,
            None,
            "rule 4 inside"
        );
        assert_eq!(
            code(&g, "https://dynamodb.us-east-1.amazonaws.com/", &aws, true).await,
            Some(CredentialExfiltrationRefused),
            "rule 4 outside"
        );
        let gh = AuthorizedUris::parse(&["https://api.github.com/**"]);
        assert_eq!(
            code(&g, "https://api.github.com/repos", &gh, true).await,
            None
        );
        assert_eq!(
            code(&g, "https://evil.com/", &gh, true).await,
            Some(NotAuthorized)
        );
        assert_eq!(
            code(&g, "https://x:y@api.github.com/", &gh, true).await,
            Some(InvalidUrl),
            "userinfo with a credential"
        );
    }

    #[tokio::test]
    async fn refusal_messages_never_carry_the_query() {
        let g = guard(&[], &[]);
        let list = AuthorizedUris::parse(&["https://*.com/**", "https://api.x.com/**"]);
        for url in [
            "https://evil.com/steal?key=sk-canary-1",
            "https://evil.org/steal?key=sk-canary-1",
        ] {
            let e = g
                .admit_url(url, GET, &rules(&list, true))
                .await
                .unwrap_err();
            assert!(!e.to_string().contains("sk-canary-1"), "{e}");
        }
        let all = CallRules {
            authorized: &list,
            allow_all_uris: true,
            credentialed: true,
        };
        let e = g
            .admit_url("https://evil.org/?key=sk-canary-1", GET, &all)
            .await
            .unwrap_err();
        assert!(!e.to_string().contains("sk-canary-1"), "{e}");
    }

    #[tokio::test]
    async fn blocked_names_come_before_any_exemption() {
        let g = guard(&[], &["localhost", "metadata.google.internal", "sidecar"]);
        for host in [
            "localhost",
            "a.localhost",
            "sidecar",
            "agent",
            "host.docker.internal",
            "metadata.google.internal",
            "metadata.azure.internal",
            "LOCALHOST.",
            "x.LocalHost",
        ] {
            let url = format!("http://{host}/x");
            let list = AuthorizedUris::parse(&[format!(
                "http://{}/**",
                host.to_ascii_lowercase().trim_end_matches('.')
            )]);
            assert_eq!(
                code(&g, &url, &list, false).await,
                Some(EgressCode::BlockedHost),
                "{host}"
            );
        }
        let mut p = EgressPolicy::new();
        p.block_names(["run-42-agent"]);
        let g = Guard::new(p, Arc::new(StaticResolver::new()));
        let list = AuthorizedUris::parse(&["http://run-42-agent/**"]);
        assert_eq!(
            code(&g, "http://run-42-agent/", &list, false).await,
            Some(EgressCode::BlockedHost)
        );
    }

    #[tokio::test]
    async fn internal_hosts_need_both_sides() {
        let answers = [("api.internal", "10.0.0.5")];
        let literal = AuthorizedUris::parse(&["http://api.internal:8080/**"]);
        let wildcard = AuthorizedUris::parse(&["http://*.internal:8080/**"]);
        // Operator opt-in + literal entry: allowed, addresses not judged.
        let both = guard(&answers, &["api.internal"]);
        let ok = both
            .admit_url("http://api.internal:8080/x", GET, &rules(&literal, true))
            .await
            .unwrap();
        assert!(ok.internal);
        assert_eq!(ok.addrs, vec!["10.0.0.5".parse::<IpAddr>().unwrap()]);
        // Only the operator: a wildcard entry is not naming the host.
        assert_eq!(
            code(&both, "http://api.internal:8080/x", &wildcard, false).await,
            Some(EgressCode::BlockedAddress)
        );
        // Only the entry.
        let entry_only = guard(&answers, &[]);
        assert_eq!(
            code(&entry_only, "http://api.internal:8080/x", &literal, true).await,
            Some(EgressCode::BlockedAddress)
        );
        // IP literals work the same way.
        let ip = guard(&[], &["127.0.0.1"]);
        let l = AuthorizedUris::parse(&["http://127.0.0.1:9/**"]);
        assert!(
            ip.admit_url("http://127.0.0.1:9/", GET, &rules(&l, true))
                .await
                .unwrap()
                .internal
        );
        assert_eq!(
            code(
                &ip,
                "http://127.0.0.2:9/",
                &AuthorizedUris::parse(&["http://127.0.0.2:9/**"]),
                true
            )
            .await,
            Some(EgressCode::BlockedAddress)
        );
    }

    #[tokio::test]
    async fn any_blocked_answer_refuses() {
        let g = guard(
            &[
                ("mixed.example", "93.184.216.34,127.0.0.1"),
                ("v6.example", "2606:4700::1,fd00::1"),
                ("ok.example", "93.184.216.34,2606:4700::1"),
            ],
            &[],
        );
        let all = AuthorizedUris::parse(&["https://*.example/**"]);
        assert_eq!(
            code(&g, "https://mixed.example/", &all, false).await,
            Some(EgressCode::BlockedAddress)
        );
        assert_eq!(
            code(&g, "https://v6.example/", &all, false).await,
            Some(EgressCode::BlockedAddress)
        );
        assert_eq!(code(&g, "https://ok.example/", &all, false).await, None);
        assert_eq!(
            code(&g, "https://none.example/", &all, false).await,
            Some(EgressCode::Unresolvable)
        );
    }

    #[tokio::test]
    async fn own_listeners_are_refused_even_for_internal_hosts() {
        let answers = [("api.internal", "127.0.0.1"), ("wide.internal", "0.0.0.0")];
        let mut r = StaticResolver::new();
        for (h, ip) in answers {
            r.insert_spec(&format!("{h}={ip}")).unwrap();
        }
        let mut p = EgressPolicy::new();
        p.allow_internal_hosts(["api.internal", "wide.internal", "127.0.0.2"]);
        p.refuse_own_listeners([
            "127.0.0.1:8080".parse().unwrap(),
            "[::]:8081".parse().unwrap(),
        ]);
        let g = Guard::new(p, Arc::new(r));
        let list = AuthorizedUris::parse(&[
            "http://api.internal:*/**",
            "http://wide.internal:*/**",
            "http://127.0.0.2:*/**",
        ]);
        for url in [
            "http://api.internal:8080/mcp",
            "http://api.internal:8081/",
            "http://wide.internal:8080/",
            "http://127.0.0.2:8081/",
        ] {
            assert_eq!(
                code(&g, url, &list, true).await,
                Some(EgressCode::BlockedAddress),
                "{url}"
            );
        }
        // Other ports of the same opted-in hosts are reachable.
        assert_eq!(
            code(&g, "http://api.internal:9000/", &list, true).await,
            None
        );
        assert_eq!(code(&g, "http://127.0.0.2:9000/", &list, true).await, None);
        assert!(
            g.policy()
                .is_own_listener("[::ffff:127.0.0.1]:8080".parse().unwrap())
        );
        assert!(!g.policy().is_own_listener("10.0.0.1:8080".parse().unwrap()));
    }

    /// A resolver that records every lookup, to prove refused targets are
    /// never looked up.
    struct Recording(std::sync::Mutex<Vec<String>>);
    impl Resolve for Recording {
        fn lookup<'a>(&'a self, host: &'a str) -> crate::resolve::LookupFuture<'a> {
            self.0.lock().unwrap().push(host.to_owned());
            Box::pin(async { Ok(vec!["93.184.216.34".parse().unwrap()]) })
        }
    }

    /// An `ask` rule's match is admitted with its hold, after every other
    /// check (a blocked address is still refused first), and the admission
    /// refuses to be sent until released.
    #[tokio::test]
    async fn an_ask_rule_admits_with_a_hold_that_blocks_the_send() {
        use crate::rules::{Action, Preset, RuleSpec, Rules};
        let g = guard(
            &[("api.x.com", "93.184.216.34"), ("in.x.com", "10.0.0.1")],
            &[],
        );
        let spec = |host: &str| RuleSpec {
            id: Some("ask".into()),
            host: host.into(),
            access: Some(Preset::Full),
            methods: vec![],
            paths: vec![],
            query: Default::default(),
            action: Action::Ask,
            timeout: Some(7),
        };
        let list = AuthorizedUris::parse(&["https://*.x.com/**"]).with_rules(Arc::new(
            Rules::compile(&[
                spec("https://api.x.com"),
                RuleSpec {
                    id: Some("ask-in".into()),
                    ..spec("https://in.x.com")
                },
            ])
            .unwrap(),
        ));
        let a = g
            .admit_url("https://api.x.com/a", GET, &rules(&list, false))
            .await
            .unwrap();
        let hold = a.hold.clone().unwrap();
        assert_eq!(hold.rule, "ask");
        assert_eq!(hold.timeout, std::time::Duration::from_secs(7));
        let e = a.unheld().unwrap_err();
        assert_eq!(e.code, EgressCode::ApprovalRequired);
        assert_eq!(e.guard, GuardStep::Approval);
        let e = g
            .admit_url("https://in.x.com/a", GET, &rules(&list, false))
            .await
            .unwrap_err();
        assert_eq!(e.code, EgressCode::BlockedAddress, "never held, refused");
    }

    #[tokio::test]
    async fn l7_rules_refuse_before_any_lookup_and_name_the_rule() {
        use crate::rules::{Missing, Preset, RuleSpec, Rules};
        let rec = Arc::new(Recording(Default::default()));
        let g = Guard::new(EgressPolicy::new(), rec.clone());
        let spec = RuleSpec {
            id: Some("gh-read".into()),
            host: "https://api.x.com".into(),
            access: Some(Preset::ReadOnly),
            methods: vec![],
            paths: vec!["/repos/**".into()],
            query: Default::default(),
            action: Default::default(),
            timeout: None,
        };
        let list = AuthorizedUris::parse(&["https://api.x.com/**"])
            .with_rules(Arc::new(Rules::compile(&[spec]).unwrap()));
        let post = Intent::Request(&http::Method::POST);
        let e = g
            .admit_url("https://api.x.com/repos/a", post, &rules(&list, true))
            .await
            .unwrap_err();
        assert_eq!(e.code, EgressCode::RuleRefused);
        assert_eq!(e.guard, GuardStep::Rules);
        let refusal = e.rule.as_deref().unwrap();
        assert_eq!(refusal.rule, "gh-read");
        assert_eq!(
            refusal.missing,
            Missing::Method {
                method: "POST".into()
            }
        );
        assert!(e.to_string().contains("gh-read"), "{e}");
        let e = g
            .admit_url("https://api.x.com/orgs/a", GET, &rules(&list, true))
            .await
            .unwrap_err();
        assert_eq!(
            e.rule.as_deref().unwrap().missing,
            Missing::Path {
                path: "/orgs/a".into()
            }
        );
        assert!(rec.0.lock().unwrap().is_empty());
        g.admit_url("https://api.x.com/repos/a", GET, &rules(&list, true))
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn no_lookup_for_a_target_refused_earlier() {
        let rec = Arc::new(Recording(Default::default()));
        let g = Guard::new(EgressPolicy::new(), rec.clone());
        let list = AuthorizedUris::parse(&["https://api.x.com/**"]);
        for url in [
            "https://evil.com/",
            "https://localhost/",
            "ftp://api.x.com/",
            "https://api.x.com:8443/",
        ] {
            assert!(
                g.admit_url(url, GET, &rules(&list, true)).await.is_err(),
                "{url}"
            );
        }
        assert!(
            rec.0.lock().unwrap().is_empty(),
            "refused targets were looked up: {:?}",
            rec.0.lock().unwrap()
        );
        g.admit_url("https://api.x.com/", GET, &rules(&list, true))
            .await
            .unwrap();
        assert_eq!(*rec.0.lock().unwrap(), vec!["api.x.com".to_owned()]);
    }

    #[tokio::test]
    async fn an_encoded_separator_may_not_take_a_credential_outside_its_entry() {
        use EgressCode::*;
        let g = guard(&[("api.example.com", "93.184.216.34")], &[]);
        let list = AuthorizedUris::parse(&["https://api.example.com/api/**"]);
        for escape in [
            "/api/..%2fprivate/echo",
            "/api/..%2Fprivate/echo",
            "/api/%2e%2e%2fprivate",
            "/api/%2E%2E%5Cprivate",
            "/api/..%5cprivate",
            "/api/%252e%252e%252fprivate",
            "/api/a/..%2f..%2fprivate",
        ] {
            let url = format!("https://api.example.com{escape}");
            assert_eq!(
                code(&g, &url, &list, true).await,
                Some(InvalidUrl),
                "{escape}"
            );
            // Without a credential the entry as written decides.
            assert_eq!(code(&g, &url, &list, false).await, None, "{escape}");
        }
        for fine in [
            "/api/x",
            "/api/group%2Fproject",
            "/api/a/..%2fb",
            "/api/v1%2Ejson",
            "/api/%41",
        ] {
            let url = format!("https://api.example.com{fine}");
            assert_eq!(code(&g, &url, &list, true).await, None, "{fine}");
        }
        let url = format!("https://api.example.com/api/%{}2f", "25".repeat(8));
        assert_eq!(code(&g, &url, &list, true).await, Some(InvalidUrl));
    }
}
