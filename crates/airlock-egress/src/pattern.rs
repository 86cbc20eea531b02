//! `authorized_uris` patterns: parsing, load-time diagnostics, templates and
//! matching against canonical targets (docs/egress.md).
//!
//! A pattern is `scheme://host[:port][/path]`. Its literal parts are
//! canonicalised like a target (lowercase scheme and host, trailing dot
//! stripped, `:443` on https is no port, the path and query percent-encoded
//! as the URL parser encodes a target's). Entries that could never match, or
//! that would be ambiguous to a human reader, are not "fixed up": they match
//! nothing and are reported with the reason when the list is loaded.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use secrecy::{ExposeSecret, SecretString};

use crate::glob::{Glob, Kind};
use crate::rules::Rules;
use crate::rules::live::LiveRules;
use crate::target::{Target, TargetHost};

/// Why an entry matches nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    #[error("pattern has no scheme (expected scheme://host/...)")]
    MissingScheme,
    #[error("scheme {0:?} is not http or https")]
    BadScheme(String),
    #[error("pattern has an empty host")]
    EmptyHost,
    #[error("authority contains {0:?}, which no canonical target has")]
    ForbiddenCharInAuthority(char),
    #[error("authority is not ASCII (write the host in punycode)")]
    NonAsciiAuthority,
    #[error("host {0:?} is not a canonical IP address or domain (write {1})")]
    NonCanonicalHost(String, String),
    #[error("wildcard in an IP address host {0:?}")]
    WildcardIp(String),
    #[error("port {0:?} is not a number 1-65535 or *")]
    BadPort(String),
    #[error("path {0:?} contains a dot segment, which no canonical target has")]
    DotSegment(String),
    #[error("path contains {0:?}, which no canonical target path has")]
    ForbiddenCharInPath(char),
    #[error("path {0:?} does not parse as a URL path")]
    BadPath(String),
    #[error("pattern is too long")]
    TooLong,
    #[error("template {{$credential.{0}}} names a field the connection does not have")]
    UnknownTemplateField(String),
    #[error(
        "template {{$credential.{0}}} renders to a value with characters that would change the pattern"
    )]
    UnsafeTemplateValue(String),
    #[error("unterminated template")]
    BadTemplate,
}

/// How far a credential may travel through an entry (credential rules 3 and 4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CredentialScope {
    /// A literal host: exactly that host.
    ExactHost,
    /// A host wildcard under a registrable domain: hosts whose own
    /// registrable domain equals this one.
    RegistrableDomain(String),
    /// The caller chooses the host: never with a credential.
    CallerChosen(&'static str),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum HostPattern {
    /// `scheme://**`: any host, any port, any path.
    CatchAll,
    Domain(String),
    Ip(IpAddr),
    Glob(Glob),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PortPattern {
    Default,
    Exact(u16),
    Any,
}

/// One parsed `authorized_uris` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UriPattern {
    source: String,
    scheme: String,
    host: HostPattern,
    port: PortPattern,
    path: Glob,
    scope: CredentialScope,
}

impl UriPattern {
    pub fn parse(src: &str) -> Result<UriPattern, PatternError> {
        if src.len() > 2048 {
            return Err(PatternError::TooLong);
        }
        let (scheme, rest) = src.split_once("://").ok_or(PatternError::MissingScheme)?;
        let scheme = scheme.to_ascii_lowercase();
        if scheme != "http" && scheme != "https" {
            return Err(PatternError::BadScheme(scheme));
        }
        if rest == "**" {
            return Ok(UriPattern {
                source: src.to_owned(),
                scheme,
                host: HostPattern::CatchAll,
                port: PortPattern::Any,
                path: Glob::compile("/**", Kind::Path).map_err(|_| PatternError::TooLong)?,
                scope: CredentialScope::CallerChosen("the entry matches every host"),
            });
        }
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        if !authority.is_ascii() {
            return Err(PatternError::NonAsciiAuthority);
        }
        if let Some(c) = authority
            .chars()
            .find(|c| "%\\@?# \t".contains(*c) || c.is_ascii_control())
        {
            return Err(PatternError::ForbiddenCharInAuthority(c));
        }
        let (host_src, port_src) = split_port(authority);
        let port = match port_src {
            None => PortPattern::Default,
            Some("*") => PortPattern::Any,
            Some(p) => match p.parse::<u16>() {
                Ok(n) if n > 0 && p.bytes().all(|b| b.is_ascii_digit()) => {
                    if default_port(&scheme) == n {
                        PortPattern::Default
                    } else {
                        PortPattern::Exact(n)
                    }
                }
                _ => return Err(PatternError::BadPort(p.to_owned())),
            },
        };
        let host_lc = host_src.to_ascii_lowercase();
        let host_lc = host_lc.strip_suffix('.').unwrap_or(&host_lc).to_owned();
        if host_lc.is_empty() {
            return Err(PatternError::EmptyHost);
        }
        let (host, scope) = parse_host(&host_lc)?;
        let path = canonical_path_pattern(path)?;
        Ok(UriPattern {
            source: src.to_owned(),
            scheme,
            host,
            port,
            path: Glob::compile(&path, Kind::Path).map_err(|_| PatternError::TooLong)?,
            scope,
        })
    }

    /// The port the pattern names, when it names one that is not its
    /// scheme's default (`*` and the default are `None`).
    pub fn exact_port(&self) -> Option<u16> {
        match self.port {
            PortPattern::Exact(p) => Some(p),
            _ => None,
        }
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn credential_scope(&self) -> &CredentialScope {
        &self.scope
    }

    /// The host this entry names literally, if it names one.
    pub fn literal_host(&self) -> Option<String> {
        match &self.host {
            HostPattern::Domain(d) => Some(d.clone()),
            HostPattern::Ip(ip) => Some(ip.to_string()),
            _ => None,
        }
    }

    /// Whole-target match.
    pub fn matches(&self, t: &Target) -> bool {
        self.matches_authority(t)
            && (self.host == HostPattern::CatchAll || self.path.matches(t.path_and_query()))
    }

    /// Whether the entry's path pattern matches `path` (a path without its
    /// query): an L7 rule's paths ([`crate::rules`]) are judged this way,
    /// once the rule's host has matched the target's authority.
    pub fn matches_path(&self, path: &str) -> bool {
        self.host == HostPattern::CatchAll || self.path.matches(path)
    }

    /// Whether some path of `t`'s scheme, host and port matches: what a
    /// tunnel to that authority may carry (each request in it is then
    /// matched whole).
    pub fn matches_authority(&self, t: &Target) -> bool {
        if self.scheme != t.scheme() {
            return false;
        }
        let host_ok = match (&self.host, t.host()) {
            (HostPattern::CatchAll, _) => return true,
            (HostPattern::Domain(p), TargetHost::Domain(d)) => p == d,
            (HostPattern::Ip(p), TargetHost::Ip(ip)) => p == ip,
            (HostPattern::Glob(g), TargetHost::Domain(d)) => g.matches(d),
            _ => false,
        };
        host_ok
            && match self.port {
                PortPattern::Any => true,
                PortPattern::Default => t.port().is_none(),
                PortPattern::Exact(p) => t.port() == Some(p),
            }
    }

    /// Credential rule 4: may a credential reach `t` through this entry?
    pub fn carries_credential_to(&self, t: &Target) -> bool {
        match &self.scope {
            CredentialScope::ExactHost => true,
            CredentialScope::CallerChosen(_) => false,
            CredentialScope::RegistrableDomain(rd) => match t.host() {
                TargetHost::Domain(d) => registrable_domain(d).as_deref() == Some(rd.as_str()),
                TargetHost::Ip(_) => false,
            },
        }
    }
}

fn default_port(scheme: &str) -> u16 {
    if scheme == "https" { 443 } else { 80 }
}

fn split_port(authority: &str) -> (&str, Option<&str>) {
    if authority.starts_with('[') {
        return match authority.find(']') {
            Some(i) => {
                let rest = &authority[i + 1..];
                (&authority[..=i], rest.strip_prefix(':'))
            }
            None => (authority, None),
        };
    }
    match authority.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (authority, None),
    }
}

fn parse_host(host: &str) -> Result<(HostPattern, CredentialScope), PatternError> {
    if host.contains('*') {
        if looks_numeric(host) || host.starts_with('[') {
            return Err(PatternError::WildcardIp(host.to_owned()));
        }
        check_ldh(host, true)?;
        let glob = Glob::compile(host, Kind::Host).map_err(|_| PatternError::TooLong)?;
        // The literal part is every label after the last label holding a wildcard.
        let labels: Vec<&str> = host.split('.').collect();
        let last_wild_label = labels.iter().rposition(|l| l.contains('*')).unwrap_or(0);
        let literal = &labels[last_wild_label + 1..];
        let scope = if literal.is_empty() {
            CredentialScope::CallerChosen("the wildcard covers the whole host")
        } else {
            match registrable_domain(&literal.join(".")) {
                Some(rd) => CredentialScope::RegistrableDomain(rd),
                None => CredentialScope::CallerChosen(
                    "the wildcard's literal part is a public suffix, not under a registrable domain",
                ),
            }
        };
        return Ok((HostPattern::Glob(glob), scope));
    }
    // A literal host must already be canonical: parse it as a target would be
    // parsed and insist on getting the same text back.
    let probe = Target::parse(&format!("https://{host}/"))
        .map_err(|_| PatternError::NonCanonicalHost(host.to_owned(), "a plain host name".into()))?;
    match probe.host() {
        TargetHost::Ip(ip) => {
            let canonical = probe.host().to_string();
            if canonical != host && !(host.starts_with('[') && ip.is_ipv6()) {
                return Err(PatternError::NonCanonicalHost(host.to_owned(), canonical));
            }
            Ok((HostPattern::Ip(*ip), CredentialScope::ExactHost))
        }
        TargetHost::Domain(d) => {
            if d != host {
                return Err(PatternError::NonCanonicalHost(host.to_owned(), d.clone()));
            }
            Ok((HostPattern::Domain(d.clone()), CredentialScope::ExactHost))
        }
    }
}

/// A host whose last label is numeric (or hex) would be an IPv4 address to
/// the WHATWG parser.
fn looks_numeric(host: &str) -> bool {
    let last = host.rsplit('.').next().unwrap_or("");
    !last.is_empty()
        && (last.bytes().all(|b| b.is_ascii_digit())
            || (last.starts_with("0x") && last[2..].bytes().all(|b| b.is_ascii_hexdigit())))
}

fn check_ldh(host: &str, allow_star: bool) -> Result<(), PatternError> {
    for label in host.split('.') {
        let ok = !label.is_empty()
            && label.bytes().all(|b| {
                b.is_ascii_lowercase()
                    || b.is_ascii_digit()
                    || b == b'-'
                    || b == b'_'
                    || (allow_star && b == b'*')
            });
        if !ok {
            return Err(PatternError::NonCanonicalHost(
                host.to_owned(),
                "letters, digits, '-', '_' and '*' in non-empty labels".into(),
            ));
        }
    }
    Ok(())
}

/// Path patterns are compared with canonical paths, so their literal parts
/// are canonicalised exactly as the WHATWG parser canonicalises a target's
/// path and query: the pattern's path is run through the same parser, which
/// percent-encodes what it encodes in a target (`a b` becomes `a%20b`, `{id}`
/// becomes `%7Bid%7D`, non-ASCII becomes UTF-8 percent-encoded) and leaves
/// `*` alone, so wildcards keep their meaning. What the parser would
/// *reinterpret* rather than encode is refused instead, since the entry
/// would not mean what it says: dot segments (also spelled `%2e`), `\`
/// (a `/` to the parser), `#` (a fragment), control characters (dropped or
/// refused in targets) and a trailing space (trimmed).
fn canonical_path_pattern(path: &str) -> Result<String, PatternError> {
    if let Some(c) = path
        .chars()
        .find(|c| c.is_control() || matches!(c, '#' | '\\'))
    {
        return Err(PatternError::ForbiddenCharInPath(c));
    }
    if path.ends_with(' ') {
        return Err(PatternError::ForbiddenCharInPath(' '));
    }
    let p = path.split_once('?').map_or(path, |(p, _)| p);
    if p.split('/').any(is_dot_segment) {
        return Err(PatternError::DotSegment(path.to_owned()));
    }
    let url = url::Url::parse(&format!("https://pattern.invalid{path}"))
        .map_err(|_| PatternError::BadPath(path.to_owned()))?;
    Ok(url[url::Position::BeforePath..url::Position::AfterQuery].to_owned())
}

/// `.` or `..`, in any spelling the parser treats as one (`%2e`, `.%2E`, …).
fn is_dot_segment(s: &str) -> bool {
    let decoded = s.replace("%2e", ".").replace("%2E", ".");
    decoded == "." || decoded == ".."
}

/// The registrable domain (eTLD+1) of a canonical host, per the Public Suffix
/// List (ICANN and PRIVATE sections). `None` for a public suffix itself.
pub fn registrable_domain(host: &str) -> Option<String> {
    let d = psl::domain(host.as_bytes())?;
    // psl applies the implicit `*` rule to unknown TLDs; a bare unknown TLD
    // (`internal`) is not registrable.
    std::str::from_utf8(d.as_bytes()).ok().map(str::to_owned)
}

/// A load-time finding about one entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub entry: String,
    /// `true`: the entry matches nothing. `false`: it loads, with a warning.
    pub matches_nothing: bool,
    pub reason: String,
}

/// An integration's parsed `authorized_uris` (or the run's network egress
/// list), with the L7 rules that narrow it ([`crate::rules`]).
#[derive(Debug, Clone, Default)]
pub struct AuthorizedUris {
    entries: Vec<UriPattern>,
    diagnostics: Vec<Diagnostic>,
    rules: RulesSource,
}

/// Where a list's L7 rules come from: fixed when it was built, or a run's
/// live rule set, read at each decision ([`crate::rules::live`]).
#[derive(Debug, Clone)]
pub enum RulesSource {
    Fixed(Arc<Rules>),
    Live(LiveRules),
}

impl Default for RulesSource {
    fn default() -> Self {
        RulesSource::Fixed(Arc::default())
    }
}

impl RulesSource {
    /// The rules now: one decision reads them once.
    pub fn load(&self) -> Arc<Rules> {
        match self {
            RulesSource::Fixed(r) => r.clone(),
            RulesSource::Live(l) => l.load(),
        }
    }
}

impl From<Arc<Rules>> for RulesSource {
    fn from(r: Arc<Rules>) -> Self {
        RulesSource::Fixed(r)
    }
}

impl From<LiveRules> for RulesSource {
    fn from(r: LiveRules) -> Self {
        RulesSource::Live(r)
    }
}

impl AuthorizedUris {
    /// The same list, narrowed by `rules` (shared: a list rendered per call
    /// keeps its integration's rules without copying them).
    #[must_use]
    pub fn with_rules(mut self, rules: impl Into<RulesSource>) -> Self {
        self.rules = rules.into();
        self
    }

    /// The L7 rules that narrow this list now: one decision reads them once.
    pub fn rules(&self) -> Arc<Rules> {
        self.rules.load()
    }

    /// Parses entries without templates (a template makes the entry match nothing).
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> AuthorizedUris {
        Self::render(entries, &BTreeMap::new())
    }

    /// Renders `{$credential.field}` templates with a connection's fields,
    /// then parses. A value is substituted only if it cannot change the
    /// pattern's structure (no wildcard, separator or authority character).
    pub fn render<S: AsRef<str>>(
        entries: &[S],
        fields: &BTreeMap<String, SecretString>,
    ) -> AuthorizedUris {
        let mut out = AuthorizedUris::default();
        for e in entries {
            let e = e.as_ref();
            let parsed = render_template(e, fields).and_then(|r| UriPattern::parse(&r));
            match parsed {
                Ok(p) => {
                    if let CredentialScope::CallerChosen(why) = p.credential_scope() {
                        out.diagnostics.push(Diagnostic {
                            entry: e.to_owned(),
                            matches_nothing: false,
                            reason: format!("refused for credentialed calls: {why}"),
                        });
                    }
                    out.entries.push(p);
                }
                Err(err) => out.diagnostics.push(Diagnostic {
                    entry: e.to_owned(),
                    matches_nothing: true,
                    reason: err.to_string(),
                }),
            }
        }
        out
    }

    /// True when some entry holds a `{$credential.…}` template: such a list
    /// must be rendered with each call's credential; any other parses once.
    pub fn has_templates<S: AsRef<str>>(entries: &[S]) -> bool {
        entries.iter().any(|e| e.as_ref().contains(TEMPLATE_OPEN))
    }

    pub fn entries(&self) -> &[UriPattern] {
        &self.entries
    }

    pub fn diagnostics(&self) -> &[Diagnostic] {
        &self.diagnostics
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// True when some request to `t`'s scheme, host and port could match
    /// an entry ([`UriPattern::matches_authority`]).
    pub fn covers_authority(&self, t: &Target) -> bool {
        self.entries.iter().any(|p| p.matches_authority(t))
    }

    /// True when an entry names `host` literally (internal-host exemption).
    pub fn names_host_literally(&self, host: &str) -> bool {
        self.entries.iter().any(|p| match &p.host {
            HostPattern::Domain(d) => d == host,
            HostPattern::Ip(ip) => host.parse::<IpAddr>().is_ok_and(|h| h == *ip),
            _ => false,
        })
    }
}

/// Opens a `{$credential.field}` template in an `authorized_uris` entry.
const TEMPLATE_OPEN: &str = "{$";

fn render_template(
    src: &str,
    fields: &BTreeMap<String, SecretString>,
) -> Result<String, PatternError> {
    if !src.contains(TEMPLATE_OPEN) {
        return Ok(src.to_owned());
    }
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while let Some(i) = rest.find(TEMPLATE_OPEN) {
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        let end = after.find('}').ok_or(PatternError::BadTemplate)?;
        let expr = &after[..end];
        let field = expr
            .strip_prefix("credential.")
            .ok_or(PatternError::BadTemplate)?;
        let value = fields
            .get(field)
            .ok_or_else(|| PatternError::UnknownTemplateField(field.to_owned()))?
            .expose_secret();
        let safe = !value.is_empty()
            && value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
        if !safe || value.contains("..") {
            return Err(PatternError::UnsafeTemplateValue(field.to_owned()));
        }
        out.push_str(value);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Target {
        Target::parse(s).unwrap()
    }
    fn p(s: &str) -> UriPattern {
        UriPattern::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn literal_and_wildcard_matching() {
        assert!(p("https://api.github.com/**").matches(&t("https://api.github.com/repos/x?y=1")));
        assert!(!p("https://api.github.com/**").matches(&t("http://api.github.com/")));
        assert!(!p("https://api.github.com/**").matches(&t("https://api.github.com.evil.com/")));
        assert!(p("https://API.GitHub.com./**").matches(&t("https://api.github.com/")));
        assert!(p("https://*.example.com/v1/*").matches(&t("https://a.b.example.com/v1/x")));
        assert!(!p("https://*.example.com/v1/*").matches(&t("https://example.com/v1/x")));
        assert!(p("https://api.example.com").matches(&t("https://api.example.com")));
        assert!(!p("https://api.example.com").matches(&t("https://api.example.com/x")));
    }

    #[test]
    fn ports() {
        assert!(p("https://a.com:443/**").matches(&t("https://a.com/")));
        assert!(!p("https://a.com/**").matches(&t("https://a.com:8443/")));
        assert!(p("https://a.com:8443/**").matches(&t("https://a.com:8443/")));
        assert!(p("https://a.com:*/**").matches(&t("https://a.com:8443/")));
        assert!(p("https://a.com:*/**").matches(&t("https://a.com/")));
        assert!(p("http://a.com:80/**").matches(&t("http://a.com/")));
        assert!(p("https://**").matches(&t("https://x.y:9/z?q")));
        assert!(!p("https://**").matches(&t("http://x.y/")));
        for bad in [
            "https://a.com:0/",
            "https://a.com:99999/",
            "https://a.com:x/",
            "https://a.com:+1/",
        ] {
            assert!(
                matches!(UriPattern::parse(bad), Err(PatternError::BadPort(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn ip_hosts_must_be_canonical() {
        assert!(p("http://127.0.0.1:8080/**").matches(&t("http://127.0.0.1:8080/x")));
        assert!(p("http://[::1]:8080/**").matches(&t("http://[::1]:8080/x")));
        for bad in [
            "http://0x7f.1/**",
            "http://127.1/**",
            "http://2130706433/**",
            "http://0177.0.0.1/**",
        ] {
            assert!(
                matches!(
                    UriPattern::parse(bad),
                    Err(PatternError::NonCanonicalHost(..))
                ),
                "{bad}"
            );
        }
        assert!(matches!(
            UriPattern::parse("http://10.*.0.1/**"),
            Err(PatternError::WildcardIp(_))
        ));
    }

    #[test]
    fn entries_that_match_nothing() {
        let cases = [
            ("api.github.com/**", "no scheme"),
            ("ftp://a.com/**", "scheme"),
            ("https:///x", "empty host"),
            ("https://a%2ecom/**", "%"),
            ("https://a.com\\@b.com/**", "\\"),
            ("https://user@a.com/**", "@"),
            ("https://a.com?x/**", "?"),
            ("https://a.com#x/**", "#"),
            ("https://a .com/**", "space"),
            ("https://bücher.de/**", "non-ASCII"),
            ("https://a.com/../x", "dot segment"),
            ("https://a.com/.%2e/x", "dot segment spelled with %2e"),
            ("https://a.com/x/%2E.", "dot segment spelled with %2E"),
            ("https://a.com/x#y", "# in path"),
            ("https://a.com/x\\y", "backslash in path"),
            ("https://a.com/x\ty", "tab in path"),
            ("https://a.com/x ", "trailing space"),
        ];
        for (src, why) in cases {
            let list = AuthorizedUris::parse(&[src]);
            assert!(list.is_empty(), "{src} ({why}) should match nothing");
            assert_eq!(list.diagnostics().len(), 1);
            assert!(list.diagnostics()[0].matches_nothing);
        }
    }

    #[test]
    fn credential_scopes() {
        use CredentialScope::*;
        assert_eq!(
            p("https://api.github.com/**").credential_scope(),
            &ExactHost
        );
        assert!(matches!(
            p("https://**").credential_scope(),
            CallerChosen(_)
        ));
        assert!(matches!(
            p("https://*/**").credential_scope(),
            CallerChosen(_)
        ));
        assert!(matches!(
            p("https://*.com/**").credential_scope(),
            CallerChosen(_)
        ));
        assert!(matches!(
            p("https://api*.io/**").credential_scope(),
            CallerChosen(_)
        ));
        assert!(matches!(
            p("https://*.co.uk/**").credential_scope(),
            CallerChosen(_)
        ));
        assert!(matches!(
            p("https://*.vercel.app/**").credential_scope(),
            CallerChosen(_)
        ));
        assert_eq!(
            p("https://*.example.co.uk/**").credential_scope(),
            &RegistrableDomain("example.co.uk".into())
        );
        assert_eq!(
            p("https://*.amazonaws.com/**").credential_scope(),
            &RegistrableDomain("amazonaws.com".into())
        );
        assert_eq!(
            p("https://*.myapp.vercel.app/**").credential_scope(),
            &RegistrableDomain("myapp.vercel.app".into())
        );
    }

    #[test]
    fn rule_four_keeps_the_credential_inside_the_registrable_domain() {
        let e = p("https://*.amazonaws.com/**");
        assert!(e.carries_credential_to(&t("https://sts.amazonaws.com/")));
        assert!(e.matches(&t("https://dynamodb.us-east-1.amazonaws.com/")));
        assert!(!e.carries_credential_to(&t("https://dynamodb.us-east-1.amazonaws.com/")));
        let e = p("https://*.example.com/**");
        assert!(e.carries_credential_to(&t("https://a.b.example.com/")));
    }

    #[test]
    fn templates_render_per_connection() {
        let mut f = BTreeMap::new();
        f.insert("subdomain".to_owned(), SecretString::from("acme"));
        f.insert("evil".to_owned(), SecretString::from("x.com/**"));
        f.insert("star".to_owned(), SecretString::from("*"));
        assert!(AuthorizedUris::has_templates(&[
            "https://api.github.com/**",
            "https://{$credential.subdomain}.zendesk.com/api/**"
        ]));
        assert!(!AuthorizedUris::has_templates(&[
            "https://api.github.com/**"
        ]));
        let l = AuthorizedUris::render(&["https://{$credential.subdomain}.zendesk.com/api/**"], &f);
        assert!(l.entries()[0].matches(&t("https://acme.zendesk.com/api/v2")));
        assert_eq!(
            l.entries()[0].credential_scope(),
            &CredentialScope::ExactHost
        );
        for bad in [
            "https://{$credential.evil}/**",
            "https://{$credential.star}.a.com/**",
            "https://{$credential.nope}.a.com/",
            "https://{$credential.subdomain/",
        ] {
            let l = AuthorizedUris::render(&[bad], &f);
            assert!(l.is_empty(), "{bad}");
            assert!(l.diagnostics()[0].matches_nothing);
        }
    }

    /// Issue 10, item 19: literal path parts are canonicalised the way the
    /// WHATWG parser canonicalises a target's path and query.
    #[test]
    fn literal_path_parts_are_canonicalised_like_targets() {
        for (pattern, targets) in [
            (
                "https://a.com/v1/a b",
                &["https://a.com/v1/a%20b", "https://a.com/v1/a b"][..],
            ),
            (
                "https://a.com/v1/{id}",
                &["https://a.com/v1/%7Bid%7D", "https://a.com/v1/{id}"][..],
            ),
            (
                "https://a.com/v1/{x}/*/y z/**",
                &["https://a.com/v1/%7Bx%7D/abc/y%20z/q?r=1"][..],
            ),
            (
                "https://a.com/q\"\u{60}<>",
                &["https://a.com/q%22%60%3C%3E"][..],
            ),
            (
                "https://a.com/caf\u{e9}/*",
                &["https://a.com/caf%C3%A9/x", "https://a.com/caf\u{e9}/x"][..],
            ),
            (
                "https://a.com/s?q=a b&w=*",
                &["https://a.com/s?q=a b&w=x", "https://a.com/s?q=a%20b&w=x"][..],
            ),
            ("https://a.com/v1/a%20b", &["https://a.com/v1/a b"][..]),
        ] {
            let pat = p(pattern);
            for target in targets {
                assert!(pat.matches(&t(target)), "{pattern} should match {target}");
            }
        }
        for (pattern, target) in [
            ("https://a.com/v1/a b", "https://a.com/v1/a+b"),
            ("https://a.com/v1/a b", "https://a.com/v1/a%2520b"),
            ("https://a.com/v1/{id}", "https://a.com/v1/id"),
            ("https://a.com/v1/{x}/*", "https://a.com/v1/%7Bx%7D/a/b"),
        ] {
            assert!(!p(pattern).matches(&t(target)), "{pattern} vs {target}");
        }
        // Templates are rendered first; literal braces around them stay literal.
        let mut f = BTreeMap::new();
        f.insert("team".to_owned(), SecretString::from("acme"));
        let l = AuthorizedUris::render(&["https://a.com/t/{$credential.team}/{id}/**"], &f);
        assert!(l.diagnostics().is_empty(), "{:?}", l.diagnostics());
        assert!(l.entries()[0].matches(&t("https://a.com/t/acme/%7Bid%7D/x")));
        assert!(!l.entries()[0].matches(&t("https://a.com/t/other/%7Bid%7D/x")));
    }

    #[test]
    fn caller_chosen_entries_are_reported_at_load() {
        let l = AuthorizedUris::parse(&["https://**", "https://api.x.com/**"]);
        assert_eq!(l.entries().len(), 2);
        assert_eq!(l.diagnostics().len(), 1);
        assert!(!l.diagnostics()[0].matches_nothing);
        assert!(l.names_host_literally("api.x.com"));
        assert!(!l.names_host_literally("x.com"));
    }
}
