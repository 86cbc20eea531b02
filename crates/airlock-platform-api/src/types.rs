//! Validated values that cross Airlock's process boundaries (the manifest,
//! the sidecar's configuration): each type checks its value when it is
//! built or deserialized, so a bad one is refused with a message naming it
//! before anything starts, never found later by the process that uses it.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer, de};

/// Why a value was refused: the value, named, and the rule it breaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} {value:?} {why}")]
pub struct InvalidValue {
    pub what: &'static str,
    /// The value, shortened to 80 characters.
    pub value: String,
    pub why: Why,
}

/// The rule a refused value breaks: one per check.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Why {
    #[error("must be 1-{0} characters")]
    Length(usize),
    #[error("may hold only lowercase letters, digits, '_' and '-'")]
    NamespaceCharacters,
    #[error("must start with a letter or a digit")]
    Start,
    #[error("must end with a letter or a digit (a trailing '_' or '-' makes tool names ambiguous)")]
    End,
    #[error("must not contain \"__\" (it separates the namespace from the tool name)")]
    DoubleUnderscore,
    #[error("must not be empty")]
    Empty,
    #[error("must be at most {0} characters")]
    TooLong(usize),
    #[error("must be one line of printable characters (it holds {0:?})")]
    NotOneLine(char),
    #[error("must not hold a control character ({0:?})")]
    Control(char),
    #[error(
        "is not an HTTP header name (letters, digits and !#$%&'*+-.^_`|~, no spaces, no CR/LF)"
    )]
    NotHeaderName,
    #[error("must be at most {0} bytes")]
    TooManyBytes(usize),
    #[error("must not hold a control character ({0:?}): it would split the header")]
    SplitsHeader(char),
    #[error("is not one this API gave")]
    NotGiven,
}

fn invalid(what: &'static str, value: &str, why: Why) -> InvalidValue {
    let mut v: String = value.chars().take(80).collect();
    if value.chars().count() > 80 {
        v.push('…');
    }
    InvalidValue {
        what,
        value: v,
        why,
    }
}

macro_rules! validated_string {
    ($(#[$m:meta])* $name:ident, $what:literal, $check:expr) => {
        $(#[$m])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            pub fn parse(s: &str) -> Result<Self, InvalidValue> {
                let check: fn(&str) -> Result<(), Why> = $check;
                check(s).map_err(|why| invalid($what, s, why))?;
                Ok($name(s.to_owned()))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                $name::parse(&s).map_err(de::Error::custom)
            }
        }
    };
}

/// Longest namespace: its tools are `{namespace}__api_call`, and MCP tool
/// names are short.
pub const MAX_NAMESPACE: usize = 32;

validated_string!(
    /// An integration's namespace: 1–32 of `[a-z0-9_-]`, starting and
    /// ending with a letter or digit, without `__`. Its tools are
    /// `{namespace}__{tool}`, and these rules make that name split one way
    /// only (at its first `__`): `rm_` would make `rm_` + `api_call` and
    /// `rm` + `_api_call` the same name. Checked here for the manifest and
    /// for the sidecar's configuration alike.
    Namespace,
    "namespace",
    |s| {
        if s.is_empty() || s.len() > MAX_NAMESPACE {
            return Err(Why::Length(MAX_NAMESPACE));
        }
        if !s
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
        {
            return Err(Why::NamespaceCharacters);
        }
        if !s.as_bytes()[0].is_ascii_alphanumeric() {
            return Err(Why::Start);
        }
        if !s.as_bytes()[s.len() - 1].is_ascii_alphanumeric() {
            return Err(Why::End);
        }
        if s.contains("__") {
            return Err(Why::DoubleUnderscore);
        }
        Ok(())
    }
);

validated_string!(
    /// An agent's name: one line of 1–128 printable characters.
    AgentName,
    "agent.name",
    |s| {
        if s.trim().is_empty() {
            return Err(Why::Empty);
        }
        if s.chars().count() > 128 {
            return Err(Why::TooLong(128));
        }
        if let Some(c) = s.chars().find(|c| c.is_control()) {
            return Err(Why::NotOneLine(c));
        }
        Ok(())
    }
);

validated_string!(
    /// A stored connection's name (the store's rule: 1–128 characters, no
    /// control characters).
    ConnectionName,
    "connection",
    |s| {
        if s.is_empty() || s.chars().count() > 128 {
            return Err(Why::Length(128));
        }
        if let Some(c) = s.chars().find(|c| c.is_control()) {
            return Err(Why::Control(c));
        }
        Ok(())
    }
);

/// An HTTP header name (an RFC 9110 token), as written and as `http`'s
/// type: a name this accepts is one `http` accepts, so the sidecar that
/// delivers a credential under it has nothing left to check.
#[derive(Debug, Clone)]
pub struct HeaderName {
    text: String,
    http: http::HeaderName,
}

impl HeaderName {
    pub fn parse(s: &str) -> Result<Self, InvalidValue> {
        let tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
        let refused = || invalid("header name", s, Why::NotHeaderName);
        if s.is_empty() || s.len() > 256 || !s.bytes().all(tchar) {
            return Err(refused());
        }
        let http = http::HeaderName::from_bytes(s.as_bytes()).map_err(|_| refused())?;
        Ok(HeaderName {
            text: s.to_owned(),
            http,
        })
    }

    /// As written (the manifest's spelling).
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// As `http` has it (lowercase).
    pub fn http(&self) -> &http::HeaderName {
        &self.http
    }
}

impl PartialEq for HeaderName {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl Eq for HeaderName {}

impl std::hash::Hash for HeaderName {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.text.hash(h);
    }
}

impl fmt::Display for HeaderName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Serialize for HeaderName {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

impl<'de> Deserialize<'de> for HeaderName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        HeaderName::parse(&String::deserialize(d)?).map_err(de::Error::custom)
    }
}

validated_string!(
    /// Text that may sit in an HTTP header value (no CR, LF, NUL or other
    /// control character but tab).
    HeaderText,
    "header value",
    |s| {
        if s.len() > 1024 {
            return Err(Why::TooManyBytes(1024));
        }
        if let Some(c) = s.chars().find(|c| c.is_control() && *c != '\t') {
            return Err(Why::SplitsHeader(c));
        }
        Ok(())
    }
);

impl Default for HeaderText {
    /// The empty text (always valid).
    fn default() -> Self {
        HeaderText(String::new())
    }
}

/// The model provider a run's `/llm` relay speaks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Provider {
    Openai,
    Anthropic,
}

impl Provider {
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::Openai => "openai",
            Provider::Anthropic => "anthropic",
        }
    }
}

/// A run's network policy for its forward proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetworkEgress {
    /// Any destination that passes the egress guard.
    Public,
    /// No destination.
    None,
    /// Only destinations matching one of these `authorized_uris`-style patterns.
    Allow(Vec<String>),
}

impl Serialize for NetworkEgress {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            NetworkEgress::Public => s.serialize_str("public"),
            NetworkEgress::None => s.serialize_str("none"),
            NetworkEgress::Allow(p) => p.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for NetworkEgress {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> de::Visitor<'de> for V {
            type Value = NetworkEgress;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("\"public\", \"none\" or a list of URL patterns")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<NetworkEgress, E> {
                match v {
                    "public" => Ok(NetworkEgress::Public),
                    "none" => Ok(NetworkEgress::None),
                    other => Err(E::custom(format!(
                        "{other:?} is not \"public\", \"none\" or a list of URL patterns"
                    ))),
                }
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut a: A) -> Result<NetworkEgress, A::Error> {
                let mut v = Vec::new();
                while let Some(p) = a.next_element::<String>()? {
                    v.push(p);
                }
                Ok(NetworkEgress::Allow(v))
            }
        }
        d.deserialize_any(V)
    }
}

/// Where a page of a `/v1` list (newest first) ended: its last row's
/// `(created_at, id)`, written `<created_at>.<id>`. The API gives it as
/// `next_cursor` when a page is full; passed back as `cursor`, the next page
/// starts after it. Any other text is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageCursor {
    pub created_at: i64,
    pub id: String,
}

impl PageCursor {
    pub fn after(created_at: i64, id: &str) -> PageCursor {
        PageCursor {
            created_at,
            id: id.to_owned(),
        }
    }
}

impl fmt::Display for PageCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.created_at, self.id)
    }
}

impl std::str::FromStr for PageCursor {
    type Err = InvalidValue;
    fn from_str(s: &str) -> Result<PageCursor, InvalidValue> {
        s.split_once('.')
            .and_then(|(at, id)| {
                let ok = !id.is_empty()
                    && id.len() <= 64
                    && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
                Some(PageCursor::after(at.parse().ok()?, id)).filter(|_| ok)
            })
            .ok_or_else(|| invalid("cursor", s, Why::NotGiven))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces() {
        for ok in ["github", "a", "gh-2", "my_api", "x1"] {
            Namespace::parse(ok).unwrap();
        }
        for bad in [
            "",
            "a b/../c",
            "GitHub",
            "_x",
            "-x",
            "a__b",
            "rm_",
            "rm-",
            &"x".repeat(33),
            "ns\0",
        ] {
            assert!(Namespace::parse(bad).is_err(), "{bad:?}");
        }
        let e = Namespace::parse("a b/../c").unwrap_err().to_string();
        assert!(e.contains("namespace \"a b/../c\""), "{e}");
    }

    #[test]
    fn names_headers_and_egress() {
        assert!(AgentName::parse("").is_err());
        assert!(AgentName::parse("two\nlines").is_err());
        assert!(AgentName::parse(&"n".repeat(200_000)).is_err());
        let long = AgentName::parse(&"n".repeat(200_000)).unwrap_err();
        assert!(long.value.chars().count() <= 81, "{long}");
        AgentName::parse("triage bot ✓").unwrap();
        assert!(HeaderName::parse("Authorization").is_ok());
        for bad in ["X-A\r\nInjected", "a b", "", "Auth:"] {
            assert!(HeaderName::parse(bad).is_err(), "{bad:?}");
        }
        assert!(HeaderText::parse("Bearer ").is_ok());
        assert!(HeaderText::parse("x\r\nEvil: 1").is_err());
        let p: NetworkEgress = serde_json::from_str("\"public\"").unwrap();
        assert_eq!(p, NetworkEgress::Public);
        let l: NetworkEgress = serde_json::from_str("[\"https://pypi.org/**\"]").unwrap();
        assert_eq!(l, NetworkEgress::Allow(vec!["https://pypi.org/**".into()]));
        for bad in ["42", "\"sometimes\"", "{}", "[1]"] {
            assert!(serde_json::from_str::<NetworkEgress>(bad).is_err(), "{bad}");
        }
        assert_eq!(
            serde_json::to_string(&l).unwrap(),
            "[\"https://pypi.org/**\"]"
        );
        assert!(serde_json::from_str::<Provider>("\"ollama\"").is_err());
    }
}
