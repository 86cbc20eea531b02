//! L7 rules: which methods, paths and query parameters a request to a host
//! may use (docs/egress.md, "L7 rules").
//!
//! A rule narrows what a list of `authorized_uris` (or the run's network
//! egress list) already allows; it never widens it. A request whose
//! authority (scheme, host, port) no rule of its list covers is judged by
//! the list alone, as before rules existed. A request whose authority some
//! rule covers must be admitted by one of the rules covering it: its method
//! in the rule's methods, its path matched by one of the rule's path
//! patterns, its query within the rule's query constraint. The refusal
//! names the closest rule and what it lacks ([`RuleRefusal`]).
//!
//! Hosts and paths are matched by the `authorized_uris` matcher itself
//! ([`UriPattern`]): a rule's `host` and each of its `paths` are one
//! `authorized_uris` pattern, so their grammar, canonicalisation and
//! load-time refusals are that of an entry. Paths are matched against the
//! path alone (never the query, which has its own constraint), and against
//! every spelling a server may route the same request by: as written, as
//! decoded by servers that decode `%2F`, `%5C` and `%2E`
//! ([`Target::as_decoded_by_servers`]), and with empty segments (`//`)
//! collapsed. Every spelling must be admitted.

use std::sync::Arc;
use std::time::Duration;

use http::Method;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::pattern::{PatternError, UriPattern};
use crate::target::Target;

/// Longest list of rules, and of paths or methods or query names in one rule.
pub const MAX_RULES: usize = 1024;
const MAX_ITEMS: usize = 256;

/// A method preset (`access`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Preset {
    /// `GET`, `HEAD`, `OPTIONS`.
    ReadOnly,
    /// `read-only` and `POST`, `PUT`, `PATCH` (never `DELETE`).
    ReadWrite,
    /// Every method.
    Full,
}

impl Preset {
    pub const ALL: [Preset; 3] = [Preset::ReadOnly, Preset::ReadWrite, Preset::Full];

    pub fn as_str(self) -> &'static str {
        match self {
            Preset::ReadOnly => "read-only",
            Preset::ReadWrite => "read-write",
            Preset::Full => "full",
        }
    }

    /// The methods the preset allows; `None`: every method.
    pub fn methods(self) -> Option<&'static [Method]> {
        const READ: &[Method] = &[Method::GET, Method::HEAD, Method::OPTIONS];
        const WRITE: &[Method] = &[
            Method::GET,
            Method::HEAD,
            Method::OPTIONS,
            Method::POST,
            Method::PUT,
            Method::PATCH,
        ];
        match self {
            Preset::ReadOnly => Some(READ),
            Preset::ReadWrite => Some(WRITE),
            Preset::Full => None,
        }
    }
}

/// What a rule does with a request it admits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// The request goes on (the default).
    #[default]
    Allow,
    /// The request is held until a person answers (docs/egress.md, "Human
    /// approval"), at most the rule's `timeout`; no answer denies it.
    Ask,
}

impl Action {
    fn is_allow(&self) -> bool {
        *self == Action::Allow
    }
}

/// How long an `ask` rule holds a request by default, and the bounds of
/// its `timeout` (seconds).
pub const DEFAULT_ASK_TIMEOUT: Duration = Duration::from_secs(120);
pub const ASK_TIMEOUT_BOUNDS: std::ops::RangeInclusive<u64> = 1..=3600;

/// A request an `ask` rule admitted: it waits for a person's answer, at
/// most `timeout`, before it may go on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    /// The `ask` rule's id.
    pub rule: String,
    pub timeout: Duration,
}

/// What a rule allows of the query.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(untagged)]
pub enum QuerySpec {
    /// `"any"` (the default) or `"none"`.
    Keyword(QueryKeyword),
    /// Only these parameter names (compared after percent-decoding, case
    /// sensitive; `&` and `;` both separate parameters).
    Names(Vec<String>),
    #[default]
    #[serde(skip)]
    Unset,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QueryKeyword {
    Any,
    None,
}

/// One rule as the manifest writes it (`[[integrations.rules]]`,
/// `[[network.rules]]`), and as the launch contract carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    /// Named in refusals and records; default `rules[N]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `scheme://host[:port]`, wildcards as in `authorized_uris`.
    pub host: String,
    /// A method preset; exactly one of `access` and `methods` is given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<Preset>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
    /// Path patterns (`authorized_uris` path syntax, no query); default `["/**"]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
    #[serde(default, skip_serializing_if = "QuerySpec::is_unset")]
    pub query: QuerySpec,
    /// `"allow"` (the default) or `"ask"`: hold what the rule admits until
    /// a person answers.
    #[serde(default, skip_serializing_if = "Action::is_allow")]
    pub action: Action,
    /// `ask` only: seconds a held request waits for its answer
    /// ([`ASK_TIMEOUT_BOUNDS`]; default [`DEFAULT_ASK_TIMEOUT`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u64>,
}

impl QuerySpec {
    fn is_unset(&self) -> bool {
        matches!(self, QuerySpec::Unset)
    }
}

/// Why a rule cannot be loaded (the manifest is refused with it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    #[error("rule {rule}: host {host:?} must be scheme://host[:port], without a path")]
    HostHasPath { rule: String, host: String },
    #[error("rule {rule}: host {host:?}: {source}")]
    Host {
        rule: String,
        host: String,
        source: PatternError,
    },
    #[error("rule {rule}: path {path:?}: {source}")]
    Path {
        rule: String,
        path: String,
        source: PatternError,
    },
    #[error(
        "rule {rule}: path {path:?} must start with '/' and hold no '?' (the query has its own constraint)"
    )]
    PathShape { rule: String, path: String },
    #[error("rule {rule}: give exactly one of access (a preset) and methods")]
    Methods { rule: String },
    #[error("rule {rule}: {method:?} is not an HTTP method token")]
    BadMethod { rule: String, method: String },
    #[error("rule {rule}: query parameter name {name:?} is empty or holds '&', ';', '=' or '#'")]
    BadQueryName { rule: String, name: String },
    #[error("rule {rule}: more than {MAX_ITEMS} methods, paths or query names")]
    TooManyItems { rule: String },
    #[error("rule {rule}: timeout is for action = \"ask\" only")]
    TimeoutWithoutAsk { rule: String },
    #[error("rule {rule}: timeout {timeout} s is outside 1..=3600 s")]
    TimeoutOutOfBounds { rule: String, timeout: u64 },
    #[error("more than {MAX_RULES} rules")]
    TooManyRules,
    #[error("two rules are named {0:?}")]
    DuplicateId(String),
}

/// What a request does at its target, beyond the URL: the part L7 rules
/// judge.
#[derive(Debug, Clone, Copy)]
pub enum Intent<'a> {
    /// A request with this method (methods are case-sensitive tokens:
    /// `get` is not `GET`).
    Request(&'a Method),
    /// A tunnel whose requests the guard does not see (a plain CONNECT):
    /// admitted only where no rule needs to see inside.
    Tunnel,
}

/// What the closest rule lacked, in a refusal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Missing {
    /// The method is not among the rule's.
    Method { method: String },
    /// No path pattern of the rule matches this path (the spelling refused).
    Path { path: String },
    /// The query holds a parameter the rule does not allow (or any, under `"none"`).
    Query { parameter: String },
    /// A plain tunnel to a host whose rule needs to see each request.
    Tunnel,
    /// The run's live policy withdrew the rule (no live rule covers the
    /// host it covered): nothing reaches its host ([`live`]).
    Withdrawn,
}

/// A refusal by an L7 rule: which rule, and what it lacked. Travels in the
/// egress record and the agent's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleRefusal {
    pub rule: String,
    pub missing: Missing,
}

impl std::fmt::Display for RuleRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.missing {
            Missing::Method { method } => {
                write!(f, "rule {:?} does not allow the method {method}", self.rule)
            }
            Missing::Path { path } => {
                write!(f, "rule {:?} does not allow the path {path}", self.rule)
            }
            Missing::Query { parameter } => write!(
                f,
                "rule {:?} does not allow the query parameter {parameter:?}",
                self.rule
            ),
            Missing::Tunnel => write!(
                f,
                "rule {:?} must see each request, and a plain tunnel hides them",
                self.rule
            ),
            Missing::Withdrawn => write!(
                f,
                "rule {:?} was withdrawn by the run's live policy",
                self.rule
            ),
        }
    }
}

#[derive(Debug, Clone)]
enum Query {
    Any,
    None,
    Names(Vec<String>),
}

/// One compiled rule.
#[derive(Debug, Clone)]
pub struct Rule {
    id: String,
    /// `host` and `paths` as written: what [`live`] compares.
    host_src: String,
    path_srcs: Vec<String>,
    host: UriPattern,
    /// `None`: every method.
    methods: Option<Vec<Method>>,
    /// Each `{host}{path}`: matched by path alone ([`UriPattern::matches_path`]).
    paths: Vec<UriPattern>,
    query: Query,
    sees_inside: bool,
    /// `Some` for an `ask` rule: how long it holds a request.
    ask: Option<Duration>,
}

impl Rule {
    pub fn compile(spec: &RuleSpec, index: usize) -> Result<Rule, RuleError> {
        let id = spec.id.clone().unwrap_or_else(|| format!("rules[{index}]"));
        let too_many = spec.methods.len() > MAX_ITEMS
            || spec.paths.len() > MAX_ITEMS
            || matches!(&spec.query, QuerySpec::Names(n) if n.len() > MAX_ITEMS);
        if too_many {
            return Err(RuleError::TooManyItems { rule: id });
        }
        let after_scheme = spec.host.split_once("://").map_or("", |(_, r)| r);
        if after_scheme.contains('/') {
            return Err(RuleError::HostHasPath {
                rule: id,
                host: spec.host.clone(),
            });
        }
        let host =
            UriPattern::parse(&format!("{}/**", spec.host)).map_err(|source| RuleError::Host {
                rule: id.clone(),
                host: spec.host.clone(),
                source,
            })?;
        let methods = rule_methods(spec, &id)?;
        let default_paths = ["/**".to_owned()];
        let srcs: &[String] = if spec.paths.is_empty() {
            &default_paths
        } else {
            &spec.paths
        };
        let mut paths = Vec::with_capacity(srcs.len());
        for p in srcs {
            if !p.starts_with('/') || p.contains('?') {
                return Err(RuleError::PathShape {
                    rule: id,
                    path: p.clone(),
                });
            }
            let pattern = UriPattern::parse(&format!("{}{p}", spec.host)).map_err(|source| {
                RuleError::Path {
                    rule: id.clone(),
                    path: p.clone(),
                    source,
                }
            })?;
            paths.push(pattern);
        }
        let query = match &spec.query {
            QuerySpec::Unset | QuerySpec::Keyword(QueryKeyword::Any) => Query::Any,
            QuerySpec::Keyword(QueryKeyword::None) => Query::None,
            QuerySpec::Names(names) => {
                if let Some(bad) = names
                    .iter()
                    .find(|n| n.is_empty() || n.contains(['&', ';', '=', '#']))
                {
                    return Err(RuleError::BadQueryName {
                        rule: id,
                        name: bad.clone(),
                    });
                }
                Query::Names(names.clone())
            }
        };
        let ask = rule_ask(spec, &id)?;
        // An `ask` rule holds each request, so it must see each one.
        let sees_inside = methods.is_some()
            || !matches!(query, Query::Any)
            || !srcs.iter().all(|p| p == "/**")
            || ask.is_some();
        Ok(Rule {
            id,
            host_src: spec.host.clone(),
            path_srcs: srcs.to_vec(),
            host,
            methods,
            paths,
            query,
            sees_inside,
            ask,
        })
    }

    /// `Some` for an `ask` rule: how long it holds a request it admits.
    pub fn ask_timeout(&self) -> Option<Duration> {
        self.ask
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// Whether requests to `t`'s scheme, host and port are this rule's.
    pub fn covers(&self, t: &Target) -> bool {
        self.host.matches_authority(t)
    }

    /// Whether judging it needs each request (a CONNECT to a host it covers
    /// is then intercepted, or refused where it cannot be).
    pub fn sees_inside(&self) -> bool {
        self.sees_inside
    }

    /// `None`: the rule admits the request; else what it lacks.
    fn judge(&self, method: &Method, paths: &[String], query: Option<&str>) -> Option<Missing> {
        if let Some(m) = &self.methods
            && !m.contains(method)
        {
            return Some(Missing::Method {
                method: method.as_str().to_owned(),
            });
        }
        if let Some(p) = paths
            .iter()
            .find(|p| !self.paths.iter().any(|pat| pat.matches_path(p)))
        {
            return Some(Missing::Path { path: p.clone() });
        }
        self.judge_query(query)
    }

    fn judge_query(&self, query: Option<&str>) -> Option<Missing> {
        let names = || {
            query
                .unwrap_or("")
                .split(['&', ';'])
                .filter(|kv| !kv.is_empty())
                .map(|kv| {
                    let name = kv.split_once('=').map_or(kv, |(n, _)| n);
                    let name = name.replace('+', " ");
                    percent_encoding::percent_decode_str(&name)
                        .decode_utf8_lossy()
                        .into_owned()
                })
        };
        match &self.query {
            Query::Any => None,
            Query::None => query.map(|q| Missing::Query {
                parameter: names().next().unwrap_or_else(|| q.to_owned()),
            }),
            Query::Names(allowed) => names()
                .find(|n| !allowed.contains(n))
                .map(|parameter| Missing::Query { parameter }),
        }
    }
}

/// An `ask` rule's hold time; `None` for an `allow` rule (which may not
/// name a timeout).
fn rule_ask(spec: &RuleSpec, id: &str) -> Result<Option<Duration>, RuleError> {
    match (spec.action, spec.timeout) {
        (Action::Allow, None) => Ok(None),
        (Action::Allow, Some(_)) => Err(RuleError::TimeoutWithoutAsk {
            rule: id.to_owned(),
        }),
        (Action::Ask, None) => Ok(Some(DEFAULT_ASK_TIMEOUT)),
        (Action::Ask, Some(t)) if ASK_TIMEOUT_BOUNDS.contains(&t) => {
            Ok(Some(Duration::from_secs(t)))
        }
        (Action::Ask, Some(timeout)) => Err(RuleError::TimeoutOutOfBounds {
            rule: id.to_owned(),
            timeout,
        }),
    }
}

fn rule_methods(spec: &RuleSpec, id: &str) -> Result<Option<Vec<Method>>, RuleError> {
    match (spec.access, spec.methods.is_empty()) {
        (Some(p), true) => Ok(p.methods().map(<[Method]>::to_vec)),
        (None, false) => spec
            .methods
            .iter()
            .map(|m| {
                Method::from_bytes(m.as_bytes()).map_err(|_| RuleError::BadMethod {
                    rule: id.to_owned(),
                    method: m.clone(),
                })
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        _ => Err(RuleError::Methods {
            rule: id.to_owned(),
        }),
    }
}

/// A list's compiled rules.
#[derive(Debug, Clone, Default)]
pub struct Rules {
    rules: Vec<Rule>,
    /// Under a live policy ([`live`]), the manifest's rules: a request one
    /// of them covers and no live rule covers is refused (a withdrawn rule
    /// never lets its host fall back to the list alone). Empty otherwise.
    ceiling: Vec<Rule>,
}

impl Rules {
    /// Compiles every rule, or refuses the list with the first error.
    pub fn compile(specs: &[RuleSpec]) -> Result<Rules, RuleError> {
        if specs.len() > MAX_RULES {
            return Err(RuleError::TooManyRules);
        }
        let mut rules: Vec<Rule> = Vec::with_capacity(specs.len());
        for (i, s) in specs.iter().enumerate() {
            let r = Rule::compile(s, i)?;
            if rules.iter().any(|o| o.id == r.id) {
                return Err(RuleError::DuplicateId(r.id));
            }
            rules.push(r);
        }
        Ok(Rules {
            rules,
            ceiling: Vec::new(),
        })
    }

    /// Whether no rule narrows the list (nor withdraws a host from it).
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty() && self.ceiling.is_empty()
    }

    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// Whether some rule is an `ask` rule: a request of the list may be
    /// held for a person.
    pub fn any_asks(&self) -> bool {
        self.rules.iter().any(|r| r.ask.is_some())
    }

    /// Whether some rule needs to see inside the requests it covers.
    pub fn any_sees_inside(&self) -> bool {
        self.rules.iter().any(Rule::sees_inside)
    }

    /// Whether a CONNECT to `t` must be opened to be judged: some rule
    /// covering it needs to see inside.
    pub fn sees_inside(&self, t: &Target) -> bool {
        self.rules.iter().any(|r| r.covers(t) && r.sees_inside())
    }

    /// The decision on a request to `t`: `Ok(None)` when no rule covers its
    /// authority or an `allow` rule covering it admits it; `Ok(Some(hold))`
    /// when no `allow` rule does and an `ask` rule admits it (the first
    /// such); else the refusal of the closest covering rule (the first that
    /// admits method and path and lacks the query, else the first that
    /// admits the method and lacks the path, else the first covering rule,
    /// which lacks the method).
    /// Under a live policy, a request that only a withdrawn manifest rule
    /// covers is refused with [`Missing::Withdrawn`].
    pub fn judge(&self, t: &Target, intent: Intent<'_>) -> Result<Option<Hold>, RuleRefusal> {
        let mut covering = self.rules.iter().filter(|r| r.covers(t)).peekable();
        if covering.peek().is_none() {
            return match self.ceiling.iter().find(|r| r.covers(t)) {
                Some(r) => Err(RuleRefusal {
                    rule: r.id.clone(),
                    missing: Missing::Withdrawn,
                }),
                None => Ok(None),
            };
        }
        let method = match intent {
            Intent::Request(m) => m,
            Intent::Tunnel => {
                return match self.rules.iter().find(|r| r.covers(t) && r.sees_inside) {
                    Some(r) => Err(RuleRefusal {
                        rule: r.id.clone(),
                        missing: Missing::Tunnel,
                    }),
                    None => Ok(None),
                };
            }
        };
        let Some(paths) = path_spellings(t) else {
            let first = self.rules.iter().find(|r| r.covers(t));
            return Err(RuleRefusal {
                rule: first.map(|r| r.id.clone()).unwrap_or_default(),
                missing: Missing::Path {
                    path: t.url().path().to_owned(),
                },
            });
        };
        let query = t.url().query();
        let mut closest: Option<(u8, RuleRefusal)> = None;
        let mut hold = None;
        for r in covering {
            let Some(missing) = r.judge(method, &paths, query) else {
                match r.ask {
                    None => return Ok(None),
                    Some(timeout) => {
                        hold.get_or_insert_with(|| Hold {
                            rule: r.id.clone(),
                            timeout,
                        });
                        continue;
                    }
                }
            };
            let rank = match missing {
                Missing::Query { .. } => 0,
                Missing::Path { .. } => 1,
                _ => 2,
            };
            if closest.as_ref().is_none_or(|(best, _)| rank < *best) {
                closest = Some((
                    rank,
                    RuleRefusal {
                        rule: r.id.clone(),
                        missing,
                    },
                ));
            }
        }
        if hold.is_some() {
            return Ok(hold);
        }
        match closest {
            Some((_, refusal)) => Err(refusal),
            None => Ok(None),
        }
    }
}

/// A list of rules as written, compiled once when it is read: the
/// manifest's `rules`, and the launch contract's, which therefore can only
/// hold rules that load (a rule that does not is a parse error with the
/// rule's reason).
#[derive(Debug, Clone, Default)]
pub struct RuleList {
    specs: Vec<RuleSpec>,
    compiled: Arc<Rules>,
}

impl RuleList {
    pub fn new(specs: Vec<RuleSpec>) -> Result<RuleList, RuleError> {
        let compiled = Arc::new(Rules::compile(&specs)?);
        Ok(RuleList { specs, compiled })
    }

    pub fn specs(&self) -> &[RuleSpec] {
        &self.specs
    }

    /// The compiled rules, shared ([`crate::AuthorizedUris::with_rules`]).
    pub fn compiled(&self) -> Arc<Rules> {
        self.compiled.clone()
    }

    pub fn is_empty(&self) -> bool {
        self.specs.is_empty()
    }
}

impl PartialEq for RuleList {
    fn eq(&self, other: &Self) -> bool {
        self.specs == other.specs
    }
}

impl Serialize for RuleList {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.specs.serialize(s)
    }
}

impl<'de> Deserialize<'de> for RuleList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<RuleList, D::Error> {
        let specs = Vec::<RuleSpec>::deserialize(d)?;
        RuleList::new(specs).map_err(serde::de::Error::custom)
    }
}

/// Every spelling of `t`'s path a server may route by: as written, as
/// decoded by servers, each with empty segments collapsed. `None`: a path
/// whose decoding does not settle (no rule admits it).
fn path_spellings(t: &Target) -> Option<Vec<String>> {
    let mut out = vec![t.url().path().to_owned()];
    if let Some(decoded) = t.as_decoded_by_servers().ok()? {
        out.push(decoded.url().path().to_owned());
    }
    let collapsed: Vec<String> = out
        .iter()
        .filter(|p| p.contains("//"))
        .map(|p| collapse_empty_segments(p))
        .collect();
    for c in collapsed {
        if !out.contains(&c) {
            out.push(c);
        }
    }
    Some(out)
}

fn collapse_empty_segments(p: &str) -> String {
    let mut out = String::with_capacity(p.len());
    let mut prev_slash = false;
    for c in p.chars() {
        if c == '/' && prev_slash {
            continue;
        }
        prev_slash = c == '/';
        out.push(c);
    }
    out
}

pub mod live;
#[cfg(test)]
mod tests;
