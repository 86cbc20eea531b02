//! Proxy environment variables never redirect the guarded client: the guard
//! decides where a request goes, and `HTTP_PROXY` set by anyone (an agent's
//! image, a CI runner) must not silently route around it.
//!
//! One test in its own binary, because it sets process environment variables.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

mod support;

use std::sync::Arc;

use airlock_egress::{
    AuthorizedUris, CallRules, ClientConfig, EgressPolicy, Guard, GuardedClient, OutboundRequest,
    StaticResolver,
};
use support::*;

#[test]
fn proxy_variables_are_ignored() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (proxy, origin) = rt.block_on(async {
        (
            server(handler(|_| respond(200, &[], "from the proxy")), None).await,
            server(handler(|_| respond(200, &[], "from the origin")), None).await,
        )
    });
    let proxy_url = format!("http://127.0.0.1:{}", proxy.port());
    for var in [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ] {
        // SAFETY: this test binary has a single test and sets the variables
        // before any thread that could read the environment concurrently is
        // doing so (the runtime's worker only runs the servers' accept loops).
        unsafe { std::env::set_var(var, &proxy_url) };
    }
    rt.block_on(async {
        install_crypto();
        let mut r = StaticResolver::new();
        r.insert("api.internal.test", ["127.0.0.1".parse().unwrap()]);
        let mut p = EgressPolicy::new();
        p.allow_internal_hosts(["api.internal.test"]);
        let client =
            GuardedClient::new(Guard::new(p, Arc::new(r)), ClientConfig::default()).unwrap();
        let list =
            AuthorizedUris::parse(&[format!("http://api.internal.test:{}/**", origin.port())]);
        let rules = CallRules {
            authorized: &list,
            allow_all_uris: false,
            credentialed: true,
        };
        let resp = client
            .send(
                OutboundRequest::get(format!("http://api.internal.test:{}/", origin.port())),
                &rules,
            )
            .await
            .unwrap();
        assert_eq!(&resp.body[..], b"from the origin");
    });
    assert_eq!(
        proxy.connection_count(),
        0,
        "the proxy from the environment was used"
    );
    assert_eq!(origin.request_count(), 1);
}
