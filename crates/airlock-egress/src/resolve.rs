//! Name resolution behind a small trait, so the guard can use the system
//! resolver in production, a given nameserver (`AIRLOCK_DNS_SERVER`), or
//! static answers in tests, without changing what it checks.
//!
//! A resolver only answers; it never judges. The guard checks every answer
//! it returns against the block table and refuses when *any* is blocked.
//!
//! Operator-trusted internal hosts (docs/egress.md, "Internal hosts") are
//! asked through [`Resolve::lookup_internal`]: the system's view of the name
//! (`/etc/hosts`, a container network's DNS), even when the guard's own
//! lookups go to a given nameserver.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use hickory_resolver::TokioResolver;
use hickory_resolver::config::{
    ConnectionConfig, LookupIpStrategy, NameServerConfig, ResolveHosts, ResolverConfig,
    ResolverOpts,
};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::rr::Name;

/// A lookup that produced no usable answer.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct ResolveError(pub String);

pub type LookupFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<IpAddr>, ResolveError>> + Send + 'a>>;

/// Resolves a canonical host name to all of its A and AAAA answers.
pub trait Resolve: Send + Sync + 'static {
    fn lookup<'a>(&'a self, host: &'a str) -> LookupFuture<'a>;

    /// Resolves an operator-trusted internal host the way the system does
    /// (hosts file, a container network's DNS). The default is
    /// [`Resolve::lookup`]: right for a resolver that *is* the system's view
    /// or that answers fixed names; a resolver that bypasses the system
    /// ([`DnsServerResolver`]) overrides it.
    fn lookup_internal<'a>(&'a self, host: &'a str) -> LookupFuture<'a> {
        self.lookup(host)
    }
}

/// The operating system's resolver (`getaddrinfo`, A and AAAA), run on
/// tokio's blocking pool (`lookup_host`), never on an async worker thread.
#[derive(Debug, Default, Clone)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn lookup<'a>(&'a self, host: &'a str) -> LookupFuture<'a> {
        Box::pin(async move {
            let addrs = tokio::net::lookup_host((host, 0))
                .await
                .map_err(|e| ResolveError(format!("system resolver: {e}")))?;
            let mut ips: Vec<IpAddr> = addrs.map(|a| a.ip()).collect();
            ips.sort();
            ips.dedup();
            Ok(ips)
        })
    }
}

/// Asks one nameserver directly (UDP, then TCP), A and AAAA, no cache, no
/// hosts file: what the nameserver says is what the guard judges.
///
/// Operator-trusted internal hosts are the exception: they go to the system
/// resolver ([`SystemResolver`] unless replaced with
/// [`DnsServerResolver::with_system_resolver`]), since a name only
/// `/etc/hosts` or a container's DNS knows must stay reachable.
#[derive(Clone)]
pub struct DnsServerResolver {
    inner: Arc<TokioResolver>,
    system: Arc<dyn Resolve>,
}

impl DnsServerResolver {
    pub fn new(server: SocketAddr) -> Result<Self, ResolveError> {
        let mut udp = ConnectionConfig::udp();
        udp.port = server.port();
        let mut tcp = ConnectionConfig::tcp();
        tcp.port = server.port();
        let ns = NameServerConfig::new(server.ip(), true, vec![udp, tcp]);
        let mut opts = ResolverOpts::default();
        opts.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
        opts.cache_size = 0;
        opts.use_hosts_file = ResolveHosts::Never;
        opts.timeout = Duration::from_secs(2);
        opts.attempts = 1;
        opts.ndots = 0;
        let inner = TokioResolver::builder_with_config(
            ResolverConfig::from_name_servers(vec![ns]),
            TokioRuntimeProvider::default(),
        )
        .with_options(opts)
        .build()
        .map_err(|e| ResolveError(format!("cannot build resolver for {server}: {e}")))?;
        Ok(DnsServerResolver {
            inner: Arc::new(inner),
            system: Arc::new(SystemResolver),
        })
    }

    /// Replaces the resolver asked for operator-trusted internal hosts (the
    /// system resolver by default), e.g. with a test double.
    pub fn with_system_resolver(mut self, system: Arc<dyn Resolve>) -> Self {
        self.system = system;
        self
    }

    /// Reads `AIRLOCK_DNS_SERVER` (`ip` or `ip:port`).
    pub fn parse_addr(s: &str) -> Result<SocketAddr, ResolveError> {
        s.parse::<SocketAddr>()
            .or_else(|_| s.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, 53)))
            .map_err(|_| ResolveError(format!("{s:?} is not a nameserver address (ip or ip:port)")))
    }
}

impl Resolve for DnsServerResolver {
    fn lookup<'a>(&'a self, host: &'a str) -> LookupFuture<'a> {
        Box::pin(async move {
            let name = query_name(host)?;
            let answer = self
                .inner
                .lookup_ip(name)
                .await
                .map_err(|e| ResolveError(format!("nameserver lookup: {e}")))?;
            let mut ips: Vec<IpAddr> = answer.iter().collect();
            ips.sort();
            ips.dedup();
            Ok(ips)
        })
    }

    fn lookup_internal<'a>(&'a self, host: &'a str) -> LookupFuture<'a> {
        self.system.lookup_internal(host)
    }
}

/// The query name for a canonical host, label by label as written.
///
/// Not through `&str` into `Name`: hickory would run the text through IDNA
/// with STD3 rules, which refuses `_` (`llm_svc`, `foo_bar.example.com`)
/// before asking anything. The guard's hosts are already canonical (the URL
/// parser did IDNA: letters, digits, `-`, `_`), so the labels are
/// taken as they are, after checking they are that. The name is fully
/// qualified: no search list applies.
fn query_name(host: &str) -> Result<Name, ResolveError> {
    let canonical = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    if !canonical {
        return Err(ResolveError(format!(
            "{host:?} is not a canonical host name (letters, digits, '-', '_')"
        )));
    }
    Name::from_labels(host.split('.').map(str::as_bytes))
        .map_err(|e| ResolveError(format!("{host:?} is not a DNS name: {e}")))
}

/// Fixed answers for some hosts (`--resolve HOST=IP,…`); other hosts go to
/// the fallback resolver, or resolve to nothing when there is none.
#[derive(Clone, Default)]
pub struct StaticResolver {
    answers: foldhash::HashMap<String, Vec<IpAddr>>,
    fallback: Option<Arc<dyn Resolve>>,
}

impl StaticResolver {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_fallback(mut self, fallback: Arc<dyn Resolve>) -> Self {
        self.fallback = Some(fallback);
        self
    }

    /// Adds answers for `host` (lowercased, one trailing dot stripped).
    pub fn insert(&mut self, host: &str, ips: impl IntoIterator<Item = IpAddr>) {
        let h = host.to_ascii_lowercase();
        let h = h.strip_suffix('.').unwrap_or(&h).to_owned();
        self.answers.entry(h).or_default().extend(ips);
    }

    /// Parses `HOST=IP[,IP…]`.
    pub fn insert_spec(&mut self, spec: &str) -> Result<(), ResolveError> {
        let (host, ips) = spec
            .split_once('=')
            .ok_or_else(|| ResolveError(format!("{spec:?} is not HOST=IP[,IP…]")))?;
        if host.is_empty() {
            return Err(ResolveError(format!("{spec:?} has an empty host")));
        }
        let mut parsed = Vec::new();
        for ip in ips.split(',') {
            let ip = ip.trim().trim_start_matches('[').trim_end_matches(']');
            parsed.push(
                ip.parse::<IpAddr>().map_err(|_| {
                    ResolveError(format!("{ip:?} in {spec:?} is not an IP address"))
                })?,
            );
        }
        self.insert(host, parsed);
        Ok(())
    }
}

impl Resolve for StaticResolver {
    fn lookup<'a>(&'a self, host: &'a str) -> LookupFuture<'a> {
        Box::pin(async move {
            if let Some(ips) = self.answers.get(host) {
                return Ok(ips.clone());
            }
            match &self.fallback {
                Some(f) => f.lookup(host).await,
                None => Err(ResolveError(format!("no answer configured for {host}"))),
            }
        })
    }

    /// Fixed answers win here too (`--resolve`: no other lookup is made for
    /// the host); otherwise the fallback's internal-host lookup.
    fn lookup_internal<'a>(&'a self, host: &'a str) -> LookupFuture<'a> {
        Box::pin(async move {
            if let Some(ips) = self.answers.get(host) {
                return Ok(ips.clone());
            }
            match &self.fallback {
                Some(f) => f.lookup_internal(host).await,
                None => Err(ResolveError(format!("no answer configured for {host}"))),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_names_keep_underscores_and_are_fully_qualified() {
        for host in [
            "llm_svc",
            "foo_bar.example.com",
            "_svc._tcp.example.com",
            "a-b.c",
        ] {
            let name = query_name(host).unwrap();
            assert!(name.is_fqdn(), "{host}");
            assert_eq!(name.to_ascii(), format!("{host}."));
        }
        for bad in ["", "a..b", "a b.com", "a.com.", "caf\u{e9}.com", "a/b"] {
            assert!(query_name(bad).is_err(), "{bad:?}");
        }
    }
}
