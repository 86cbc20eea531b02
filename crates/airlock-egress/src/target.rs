//! Parsing and canonicalising outbound targets (docs/egress.md, "URL handling").
//!
//! The WHATWG parser (`url`) is the single source of truth for what a URL
//! means: the host it yields is the host we judge, resolve and dial, so the
//! classic parser-confusion tricks (`https://good.com\@evil.com`,
//! `https://evil.com#@good.com`, full-width dots, `0x7f.1`) cannot make the
//! guard judge one host while the connection goes to another. On top of the
//! parser we refuse what no honest caller sends: control characters anywhere,
//! `%` or spaces in the raw host (percent-encoded hosts, IPv6 zone ids), and
//! hosts that are not plain LDH labels after IDNA.

use std::fmt;
use std::net::IpAddr;

use url::{Host, Url};

use crate::error::EgressError;

/// Longest target URL the guard accepts.
pub const MAX_URL_LEN: usize = 16 * 1024;

/// The host of a canonical target.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TargetHost {
    /// Lowercase, punycode, without a trailing dot.
    Domain(String),
    Ip(IpAddr),
}

impl fmt::Display for TargetHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TargetHost::Domain(d) => f.write_str(d),
            TargetHost::Ip(IpAddr::V4(v4)) => write!(f, "{v4}"),
            TargetHost::Ip(IpAddr::V6(v6)) => write!(f, "[{v6}]"),
        }
    }
}

impl TargetHost {
    /// The host as written in an allow-list or in `EGRESS_ALLOW_INTERNAL_HOSTS`
    /// (IPv6 without brackets). Borrowed for a name (the common case: no copy per check), written out
    /// for an address.
    pub fn bare(&self) -> std::borrow::Cow<'_, str> {
        match self {
            TargetHost::Domain(d) => std::borrow::Cow::Borrowed(d),
            TargetHost::Ip(ip) => std::borrow::Cow::Owned(ip.to_string()),
        }
    }
}

/// A parsed, canonical outbound target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    url: Url,
    host: TargetHost,
    had_userinfo: bool,
}

impl Target {
    /// Parses an http(s) target.
    pub fn parse(input: &str) -> Result<Target, EgressError> {
        Self::parse_with(input, false)
    }

    /// Parses a target, also admitting `ws`/`wss` (for tunnels that ask for them).
    pub fn parse_with(input: &str, allow_websocket: bool) -> Result<Target, EgressError> {
        if input.len() > MAX_URL_LEN {
            return Err(EgressError::invalid_url(format!(
                "target is {} bytes, longer than the {MAX_URL_LEN}-byte limit",
                input.len()
            )));
        }
        // The WHATWG parser silently drops tabs and newlines and trims
        // surrounding controls/spaces; a target that needs that is refused
        // rather than reinterpreted.
        if let Some(c) = input.chars().find(|c| c.is_control()) {
            return Err(EgressError::invalid_url(format!(
                "target contains a control character (U+{:04X})",
                c as u32
            )));
        }
        if input.starts_with(' ') || input.ends_with(' ') {
            return Err(EgressError::invalid_url("target has surrounding spaces"));
        }
        check_raw_host(input)?;
        let mut url = Url::parse(input)
            .map_err(|e| EgressError::invalid_url(format!("target does not parse: {e}")))?;
        match url.scheme() {
            "http" | "https" => {}
            "ws" | "wss" if allow_websocket => {}
            other => {
                return Err(EgressError::invalid_url(format!(
                    "scheme {other:?} is not allowed (only http and https)"
                )));
            }
        }
        let host = match url.host() {
            Some(Host::Domain(d)) => TargetHost::Domain(canonical_domain(d)?),
            Some(Host::Ipv4(v4)) => TargetHost::Ip(IpAddr::V4(v4)),
            Some(Host::Ipv6(v6)) => TargetHost::Ip(IpAddr::V6(v6)),
            None => return Err(EgressError::invalid_url("target has no host")),
        };
        let had_userinfo = !url.username().is_empty() || url.password().is_some();
        if had_userinfo {
            // Cannot fail for http(s) URLs that have a host.
            let _ = url.set_username("");
            let _ = url.set_password(None);
        }
        if url.fragment().is_some() {
            url.set_fragment(None);
        }
        if let TargetHost::Domain(d) = &host
            && url.host_str() != Some(d.as_str())
        {
            url.set_host(Some(d))
                .map_err(|e| EgressError::invalid_url(format!("host rewrite failed: {e}")))?;
        }
        Ok(Target {
            url,
            host,
            had_userinfo,
        })
    }

    /// Builds the target of a CONNECT request (`host:port`) as
    /// `https://host:port/`, through the same parser: the raw authority never
    /// reaches a resolver.
    pub fn from_authority(authority: &str) -> Result<Target, EgressError> {
        if authority.is_empty()
            || authority.contains(['/', '\\', '@', '?', '#', ' '])
            || !authority.is_ascii()
        {
            return Err(EgressError::invalid_url(format!(
                "CONNECT authority {authority:?} is not host:port"
            )));
        }
        let (_, port) = authority
            .rsplit_once(':')
            .ok_or_else(|| EgressError::invalid_url("CONNECT authority has no port"))?;
        if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
            return Err(EgressError::invalid_url(format!(
                "CONNECT port {port:?} is not a number"
            )));
        }
        Self::parse(&format!("https://{authority}/"))
    }

    pub fn url(&self) -> &Url {
        &self.url
    }

    pub fn host(&self) -> &TargetHost {
        &self.host
    }

    pub fn scheme(&self) -> &str {
        self.url.scheme()
    }

    pub fn is_https(&self) -> bool {
        matches!(self.url.scheme(), "https" | "wss")
    }

    /// The explicit port, `None` when it is the scheme's default.
    pub fn port(&self) -> Option<u16> {
        self.url.port()
    }

    pub fn port_or_default(&self) -> u16 {
        self.url
            .port_or_known_default()
            .unwrap_or(if self.is_https() { 443 } else { 80 })
    }

    /// Path and query as sent on the request line (`/a/b?c`).
    pub fn path_and_query(&self) -> &str {
        &self.url[url::Position::BeforePath..url::Position::AfterQuery]
    }

    /// The value of the `Host` header: host, plus the port when not default.
    pub fn authority(&self) -> String {
        match self.port() {
            Some(p) => format!("{}:{p}", self.host),
            None => self.host.to_string(),
        }
    }

    /// What messages and logs may show: scheme, host, port and path, never
    /// the query (where a substituted credential may sit).
    pub fn loggable(&self) -> String {
        let path = self.url.path();
        match self.url.query() {
            Some(_) => format!("{}://{}{path}?…", self.scheme(), self.authority()),
            None => format!("{}://{}{path}", self.scheme(), self.authority()),
        }
    }

    /// True when the original input carried `user:pass@`.
    pub fn had_userinfo(&self) -> bool {
        self.had_userinfo
    }

    /// Same scheme, host and port.
    pub fn same_origin(&self, other: &Target) -> bool {
        self.scheme() == other.scheme()
            && self.host == other.host
            && self.port_or_default() == other.port_or_default()
    }

    /// The target as a server that percent-decodes `/`, `\` and `.` in
    /// the path (`%2F`, `%5C`, `%2E`, and `%25` before them, as a server
    /// decoding twice would) and then normalises it may route it: `None`
    /// when decoding changes nothing (the path means the same to every
    /// server). Refused (`invalid_url`) when the path is still changing after
    /// [`MAX_DECODE_ROUNDS`] decodings.
    pub fn as_decoded_by_servers(&self) -> Result<Option<Target>, EgressError> {
        let raw = self.url.path();
        if !raw.contains('%') {
            return Ok(None);
        }
        let mut path = raw.to_owned();
        let mut changed = false;
        for _ in 0..MAX_DECODE_ROUNDS {
            match decode_separators(&path) {
                Some(next) => {
                    path = next;
                    changed = true;
                }
                None => {
                    if !changed {
                        return Ok(None);
                    }
                    let mut url = self.url.clone();
                    // The WHATWG path setter turns `\` into `/` and removes
                    // dot segments, as the server would.
                    url.set_path(&path);
                    return Ok(Some(Target {
                        url,
                        host: self.host.clone(),
                        had_userinfo: self.had_userinfo,
                    }));
                }
            }
        }
        Err(EgressError::invalid_url(format!(
            "the path is percent-encoded more than {MAX_DECODE_ROUNDS} times over"
        )))
    }

    /// Resolves a `Location` header against this target.
    pub fn join(&self, location: &str) -> Result<Target, EgressError> {
        if let Some(c) = location.chars().find(|c| c.is_control()) {
            return Err(EgressError::invalid_url(format!(
                "redirect location contains a control character (U+{:04X})",
                c as u32
            )));
        }
        let next = self.url.join(location).map_err(|e| {
            EgressError::invalid_url(format!("redirect location does not parse: {e}"))
        })?;
        Self::parse(next.as_str())
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.url.as_str())
    }
}

/// The last few targets parsed, by the exact text they were parsed from.
///
/// An agent calls the same few URLs over and over, and a parse (the WHATWG
/// parser, then the checks above) is the largest piece of the guard's own
/// work on an `api_call`. [`Target::parse`] is a function of its input
/// alone, so a target parsed from the same text is the same target: the
/// memo hands back a copy of it. Only targets that parsed are kept; a
/// refused input is parsed (and refused) every time. Shared by clones.
#[derive(Debug, Default, Clone)]
pub struct TargetMemo {
    recent: std::sync::Arc<std::sync::Mutex<Recent>>,
}

/// The memo's targets, newest first, each with the text it was parsed from.
type Recent = std::collections::VecDeque<(Box<str>, Target)>;

impl TargetMemo {
    /// How many targets the memo keeps (the oldest goes first).
    pub const CAPACITY: usize = 16;
    /// The longest text the memo keeps a target of: at most
    /// `CAPACITY` × 2 × this many bytes are held (text and target), however
    /// long the URLs an agent sends.
    pub const MAX_TEXT: usize = 1024;

    /// [`Target::parse`] of `input`, from the memo when it parsed that text
    /// recently.
    pub fn parse(&self, input: &str) -> Result<Target, EgressError> {
        if let Ok(recent) = self.recent.lock()
            && let Some((_, t)) = recent.iter().find(|(text, _)| &**text == input)
        {
            return Ok(t.clone());
        }
        let target = Target::parse(input)?;
        if input.len() > Self::MAX_TEXT {
            return Ok(target);
        }
        if let Ok(mut recent) = self.recent.lock() {
            if recent.len() >= Self::CAPACITY {
                recent.pop_back();
            }
            recent.push_front((input.into(), target.clone()));
        }
        Ok(target)
    }

    /// The texts whose targets the memo holds, newest first (what of an
    /// agent's URLs outlives its calls).
    pub fn texts(&self) -> Vec<String> {
        self.recent
            .lock()
            .map(|r| r.iter().map(|(text, _)| text.to_string()).collect())
            .unwrap_or_default()
    }
}

/// How many rounds of decoding [`Target::as_decoded_by_servers`] follows.
pub const MAX_DECODE_ROUNDS: usize = 4;

/// One round of decoding `%2F`, `%5C`, `%2E` and `%25` (either case) in a
/// path, or `None` when it holds none of them.
fn decode_separators(path: &str) -> Option<String> {
    let b = path.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut changed = false;
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let decoded = match (b[i + 1], b[i + 2].to_ascii_uppercase()) {
                (b'2', b'F') => Some(b'/'),
                (b'5', b'C') => Some(b'\\'),
                (b'2', b'E') => Some(b'.'),
                (b'2', b'5') => Some(b'%'),
                _ => None,
            };
            if let Some(c) = decoded {
                out.push(c);
                changed = true;
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    // Only ASCII was replaced by ASCII: still UTF-8.
    changed.then(|| String::from_utf8_lossy(&out).into_owned())
}

/// Refuses `%`, spaces and other junk in the host as the caller wrote it,
/// before the parser percent-decodes it away.
fn check_raw_host(input: &str) -> Result<(), EgressError> {
    let Some((_, rest)) = input.split_once("://") else {
        return Ok(()); // the parser reports it
    };
    let end = rest.find(['/', '\\', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..end];
    let host_port = authority
        .rsplit_once('@')
        .map(|(_, h)| h)
        .unwrap_or(authority);
    if host_port.is_empty() {
        return Err(EgressError::invalid_url("target has an empty host"));
    }
    if host_port.contains('%') {
        return Err(EgressError::invalid_url(
            "host contains '%' (percent-encoded hosts and IPv6 zone ids are refused)",
        ));
    }
    if host_port.contains(' ') {
        return Err(EgressError::invalid_url("host contains a space"));
    }
    Ok(())
}

/// Lowercase punycode LDH labels, one trailing dot stripped.
fn canonical_domain(d: &str) -> Result<String, EgressError> {
    let d = d.strip_suffix('.').unwrap_or(d);
    if d.is_empty() || d.len() > 253 {
        return Err(EgressError::invalid_url(
            "host is empty or longer than 253 bytes",
        ));
    }
    for label in d.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err(EgressError::invalid_url(format!(
                "host {d:?} has an empty or over-long label"
            )));
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        {
            return Err(EgressError::invalid_url(format!(
                "host {d:?} contains a character outside letters, digits, '-' and '_'"
            )));
        }
    }
    Ok(d.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EgressCode;

    fn canon(s: &str) -> String {
        Target::parse(s).unwrap().to_string()
    }

    fn refused(s: &str) {
        let e = Target::parse(s).unwrap_err();
        assert_eq!(e.code, EgressCode::InvalidUrl, "{s}: {e}");
    }

    #[test]
    fn canonical_forms() {
        assert_eq!(
            canon("HTTPS://API.Example.COM:443/a/./b/../c?q=1#frag"),
            "https://api.example.com/a/c?q=1"
        );
        assert_eq!(canon("http://example.com:80"), "http://example.com/");
        assert_eq!(
            canon("https://example.com.:8443/X"),
            "https://example.com:8443/X"
        );
        assert_eq!(
            canon("https://user:pw@example.com/"),
            "https://example.com/"
        );
        assert!(
            Target::parse("https://user:pw@example.com/")
                .unwrap()
                .had_userinfo()
        );
        assert_eq!(
            canon("https://bücher.example/"),
            "https://xn--bcher-kva.example/"
        );
        assert_eq!(
            canon("https://ｅｘａｍｐｌｅ．com/"),
            "https://example.com/",
            "full-width forms"
        );
    }

    #[test]
    fn ipv4_spellings_normalise() {
        for s in [
            "http://2130706433/",
            "http://0177.0.0.1/",
            "http://0x7f.1/",
            "http://127.1/",
            "http://0x7f000001/",
        ] {
            assert_eq!(
                *Target::parse(s).unwrap().host(),
                TargetHost::Ip("127.0.0.1".parse().unwrap()),
                "{s}"
            );
        }
        assert_eq!(
            *Target::parse("http://[::ffff:127.0.0.1]/").unwrap().host(),
            TargetHost::Ip("::ffff:7f00:1".parse().unwrap())
        );
    }

    #[test]
    fn parser_confusion_yields_the_real_host() {
        assert_eq!(
            Target::parse("https://evil.com\\@good.com/")
                .unwrap()
                .host()
                .bare(),
            "evil.com"
        );
        assert_eq!(
            Target::parse("https://evil.com#@good.com/")
                .unwrap()
                .host()
                .bare(),
            "evil.com"
        );
        assert_eq!(
            Target::parse("https://good.com@evil.com/")
                .unwrap()
                .host()
                .bare(),
            "evil.com"
        );
        assert_eq!(
            Target::parse("https://good.com?@evil.com/")
                .unwrap()
                .host()
                .bare(),
            "good.com"
        );
    }

    #[test]
    fn refusals() {
        refused("not a url");
        refused("ftp://example.com/");
        refused("file:///etc/passwd");
        refused("gopher://example.com/");
        refused("ws://example.com/");
        refused("https://exa%6Dple.com/");
        refused("http://[fe80::1%25eth0]/");
        refused("https://example.com/\r\nHost: evil");
        refused("https://example.com\u{0}.evil.com/");
        refused("https://exa mple.com/");
        refused(" https://example.com/");
        refused("https://example.com../");
        refused("https://a..b.com/");
        refused("https:///path");
        refused("https://*.example.com/");
        refused("https://ex!ample.com/");
        refused(&format!("https://example.com/{}", "a".repeat(MAX_URL_LEN)));
        assert!(Target::parse_with("wss://example.com/", true).is_ok());
    }

    #[test]
    fn authority_form() {
        let t = Target::from_authority("example.com:443").unwrap();
        assert_eq!(t.to_string(), "https://example.com/");
        assert_eq!(
            Target::from_authority("[::1]:8443").unwrap().host().bare(),
            "::1"
        );
        for bad in [
            "example.com",
            "example.com:",
            "example.com:x",
            "a@b:443",
            "a/b:443",
            "",
            "evil.com:443#",
        ] {
            assert_eq!(
                Target::from_authority(bad).unwrap_err().code,
                EgressCode::InvalidUrl,
                "{bad}"
            );
        }
    }

    #[test]
    fn loggable_form_drops_the_query() {
        let t = Target::parse("https://u:p@api.example.com:8443/v1/x?key=sk-secret#f").unwrap();
        assert_eq!(t.loggable(), "https://api.example.com:8443/v1/x?…");
        assert!(!t.loggable().contains("sk-secret"));
    }

    #[test]
    fn path_and_authority() {
        let t = Target::parse("https://example.com:8443/a/b?c=d").unwrap();
        assert_eq!(t.path_and_query(), "/a/b?c=d");
        assert_eq!(t.authority(), "example.com:8443");
        assert_eq!(
            Target::parse("http://[::1]:80").unwrap().authority(),
            "[::1]"
        );
    }

    /// The memo answers exactly what a fresh parse answers, for text it has
    /// seen, text it has not, text it refused and text it has forgotten;
    /// texts that differ only in case, userinfo or fragment stay apart.
    #[test]
    fn the_memo_answers_what_a_parse_answers() {
        let memo = TargetMemo::default();
        let mut inputs: Vec<String> = vec![
            "https://api.example.com/v1/items?q=1".into(),
            "HTTPS://API.EXAMPLE.COM/v1/items?q=1".into(),
            "https://user:pw@api.example.com/v1/items".into(),
            "https://api.example.com/v1/items#frag".into(),
            "http://127.0.0.1:8080/x".into(),
            "http://[::1]:80/".into(),
            "https://ex%61mple.com/".into(),
            "ftp://example.com/".into(),
            "https://exa mple.com/".into(),
            "not a url".into(),
        ];
        // More distinct texts than the memo keeps: the first ones are forgotten.
        inputs.extend((0..TargetMemo::CAPACITY + 4).map(|i| format!("https://h{i}.example/p")));
        // A text longer than the memo keeps is parsed every time.
        let long = format!(
            "https://api.example.com/{}",
            "a".repeat(TargetMemo::MAX_TEXT)
        );
        inputs.push(long.clone());
        for round in 0..3 {
            for input in &inputs {
                let fresh = Target::parse(input);
                let memo_says = memo.parse(input);
                match (fresh, memo_says) {
                    (Ok(a), Ok(b)) => {
                        assert_eq!(a, b, "round {round}: {input}");
                        assert_eq!(a.had_userinfo(), b.had_userinfo(), "{input}");
                    }
                    (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "{input}"),
                    (a, b) => panic!("round {round}: {input}: parse {a:?} but memo {b:?}"),
                }
            }
        }
        assert!(memo.recent.lock().unwrap().len() <= TargetMemo::CAPACITY);
        assert!(
            memo.recent
                .lock()
                .unwrap()
                .iter()
                .all(|(text, _)| text.len() <= TargetMemo::MAX_TEXT && **text != *long)
        );
        memo.parse(&long).unwrap();
        assert!(
            memo.recent
                .lock()
                .unwrap()
                .iter()
                .all(|(text, _)| **text != *long)
        );
        // A refused text is never kept.
        assert!(
            memo.recent
                .lock()
                .unwrap()
                .iter()
                .all(|(text, _)| Target::parse(text).is_ok())
        );
    }
}
