//! Workload identity through a real `airlock serve`: the token a run's
//! sidecar delivers where its integration names `${airlock.identity}`,
//! captured by a loopback upstream, verified by PyJWT against the JWKS the
//! server publishes (found through its OpenID configuration); refused once
//! expired, under another instance's key, or forged under this one's key
//! id; still verified after a key rotation while new tokens use the new
//! key; and never in the agent's view (its environment, /proc, the tool's
//! answer, an upstream that reflects it).

use std::io::Write as _;
use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::serve::{
    Recorder, Seen, Server, base_env, create_org, mcp_agent, run_agent_once,
};

/// The agent: calls the integration once through MCP (the token placed in
/// the query by its placeholder too, as AWS STS takes it), prints the whole
/// answer, then looks for a JWT wherever it can read.
const AGENT_REST: &str = r#"
import glob
out = mcp("tools/call", {"name": "sts__api_call", "arguments": {"target": UPSTREAM + "/assume?WebIdentityToken={{airlock.identity}}"}})
print("ANSWER " + json.dumps(out), flush=True)
needle = b"eyJ0eXAiOiJKV1Qi"
found = [k for k, v in os.environ.items() if needle.decode() in v]
for p in glob.glob("/proc/*/environ") + glob.glob("/proc/*/cmdline"):
    try:
        if needle in open(p, "rb").read():
            found.append(p)
    except OSError:
        pass
print("FOUND " + json.dumps(found), flush=True)
"#;

/// PyJWT's view of a token: the server's OpenID configuration gives the
/// issuer, its JWKS (`PyJWKClient`) the key named by the token's `kid`.
/// The issuer URL is a name of its own (`AIRLOCK_ISSUER_URL`, the same
/// across the restart), so the keys are fetched from the server itself.
/// `verify`: decoded claims or the error's class; `forge`: the same claims
/// signed by a key of its own under the token's `kid`, then verified.
const PYJWT: &str = r#"
import json, sys, urllib.request
import jwt
from cryptography.hazmat.primitives.asymmetric import ec
base, token, aud, mode = sys.argv[1:5]
conf = json.load(urllib.request.urlopen(base + "/.well-known/openid-configuration"))
if mode == "forge":
    claims = jwt.decode(token, options={"verify_signature": False})
    kid = jwt.get_unverified_header(token)["kid"]
    token = jwt.encode(claims, ec.generate_private_key(ec.SECP256R1()), algorithm="ES256", headers={"kid": kid})
try:
    key = jwt.PyJWKClient(base + "/.well-known/jwks.json").get_signing_key_from_jwt(token)
    claims = jwt.decode(token, key.key, algorithms=["ES256"], audience=aud, issuer=conf["issuer"])
    print(json.dumps({"ok": True, "claims": claims, "kid": key.key_id, "conf": conf}))
except jwt.PyJWTError as e:
    print(json.dumps({"ok": False, "error": type(e).__name__, "message": str(e)}))
"#;

const AUDIENCE: &str = "airlock-test-audience";
const ISSUER: &str = "https://issuer.airlock.test";

/// A loopback upstream: records each request's line and `Authorization`
/// and answers with the header reflected in its body.
struct Upstream {
    addr: SocketAddr,
    seen: Seen,
}

impl Upstream {
    fn start() -> Upstream {
        let r = Recorder::start("authorization", |mut c, _, auth| {
            let body = format!("{{\"you_sent\": \"{auth}\"}}");
            let _ = write!(
                c,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        });
        Upstream {
            addr: r.addr,
            seen: r.seen,
        }
    }

    fn last_token(&self) -> String {
        let seen = self.seen.lock().unwrap();
        let (line, auth) = seen.last().expect("the upstream got a request");
        let token = auth
            .strip_prefix("Bearer ")
            .unwrap_or_else(|| panic!("not a bearer token: {auth}"));
        // The same token where the target names `{{airlock.identity}}`.
        assert!(
            line.contains(&format!("WebIdentityToken={token} ")),
            "{line}"
        );
        token.to_owned()
    }
}

fn manifest(upstream: SocketAddr, timeout: u64) -> String {
    format!(
        "[agent]\nname = \"ident\"\ncommand = [\"/usr/bin/python3\", \"agent.py\"]\ntimeout = {timeout}\n\n\
         [network]\negress = \"none\"\n\n[[integrations]]\nnamespace = \"sts\"\n\
         authorized_uris = [\"http://{upstream}/**\"]\n\
         delivery = {{ header = \"Authorization\", prefix = \"Bearer \", field = \"${{airlock.identity}}\", audience = \"{AUDIENCE}\" }}\n"
    )
}

/// Runs the agent once; its logs' text and the run.
fn run_once(s: &Server, key: &str, upstream: &Upstream, timeout: u64) -> (String, Value) {
    let manifest = manifest(upstream.addr, timeout);
    let prompt = format!("http://{}", upstream.addr);
    let (run, logs) = run_agent_once(
        s,
        key,
        ("ident", &manifest),
        &mcp_agent(AGENT_REST),
        &prompt,
    );
    (logs, run)
}

fn pyjwt(s: &Server, token: &str, mode: &str) -> Value {
    let out = Command::new("python3")
        .args(["-c", PYJWT, &s.url(""), token, AUDIENCE, mode])
        .env_remove("HTTP_PROXY")
        .env_remove("HTTPS_PROXY")
        .env_remove("http_proxy")
        .env_remove("https_proxy")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// What the agent saw: the tool's answer with the reflected token
/// redacted, and no token anywhere it looked.
fn agent_saw_no_token(logs: &str, token: &str) {
    assert!(!logs.contains(token), "the token reached the agent: {logs}");
    assert!(logs.contains("ANSWER"), "{logs}");
    assert!(
        logs.contains("[REDACTED]"),
        "the reflection is redacted: {logs}"
    );
    assert!(
        logs.contains("FOUND []"),
        "a JWT in the agent's view: {logs}"
    );
}

#[test]
fn a_runs_identity_token_verifies_with_pyjwt_expires_and_survives_a_key_rotation() {
    if !crate::support::namespace_available()
        || !crate::support::python_has(&["jwt", "cryptography"])
    {
        return;
    }
    let home = tempfile::Builder::new()
        .prefix("airlock-identity-")
        .tempdir()
        .unwrap();
    let old_key = airlock_vault::generate_identity_key().unwrap();
    let new_key = airlock_vault::generate_identity_key().unwrap();
    let kid = |k: &str| {
        airlock_vault::IdentityKeyring::parse("K", k)
            .unwrap()
            .signing_kid()
            .to_owned()
    };
    let mut env = base_env(home.path(), None);
    env.push(("IDENTITY_SIGNING_KEYS".into(), old_key.to_string()));
    env.push(("AIRLOCK_ISSUER_URL".into(), format!("{ISSUER}/")));
    let mut s = Server::start(&env, "namespace", home.path().join("serve.log"));
    let (org, key) = create_org(&env, "Acme", &[]);
    let upstream = Upstream::start();

    // A run's token, as the upstream got it, verifies against the JWKS.
    let (logs, run) = run_once(&s, &key, &upstream, 60);
    let first = upstream.last_token();
    agent_saw_no_token(&logs, &first);
    let v = pyjwt(&s, &first, "verify");
    assert_eq!(v["ok"], true, "{v}");
    let c = &v["claims"];
    let run_id = run["id"].as_str().unwrap();
    assert_eq!(c["sub"], run_id, "{v}");
    assert_eq!(c["run_id"], run_id);
    assert_eq!(
        (c["org"].as_str(), c["agent"].as_str()),
        (Some(org.as_str()), Some("ident"))
    );
    assert_eq!(c["aud"], AUDIENCE);
    assert_eq!(c["iss"], ISSUER);
    assert_eq!(
        v["conf"]["jwks_uri"],
        format!("{ISSUER}/.well-known/jwks.json")
    );
    let (iat, exp) = (c["iat"].as_u64().unwrap(), c["exp"].as_u64().unwrap());
    assert!(
        exp > iat && exp - iat <= 60,
        "expiry within the run's timeout: {v}"
    );
    assert_eq!(v["kid"], kid(&old_key));
    assert_eq!(
        v["conf"]["id_token_signing_alg_values_supported"],
        json!(["ES256"])
    );

    // Another instance's key: a key id the JWKS does not hold, or this
    // one's key id over another key's signature.
    let other = airlock_vault::IdentityKeyring::generate().unwrap();
    let claims: airlock_vault::IdentityClaims = serde_json::from_value(c.clone()).unwrap();
    let foreign = other.sign(&claims).unwrap();
    let v = pyjwt(&s, &foreign, "verify");
    assert_eq!(v["ok"], false, "{v}");
    let v = pyjwt(&s, &first, "forge");
    assert_eq!(
        (v["ok"].as_bool(), v["error"].as_str()),
        (Some(false), Some("InvalidSignatureError")),
        "{v}"
    );

    // Rotation: the new key first, the old one still published.
    s.kill();
    let mut env = base_env(home.path(), None);
    env.push((
        "IDENTITY_SIGNING_KEYS".into(),
        format!("{},{}", *new_key, *old_key),
    ));
    env.push(("AIRLOCK_ISSUER_URL".into(), ISSUER.into()));
    let s = Server::start(&env, "namespace", home.path().join("serve2.log"));
    let jwks = s.call("GET", "/.well-known/jwks.json", None, None).1;
    let kids: Vec<_> = jwks["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["kid"].clone())
        .collect();
    assert_eq!(
        kids,
        vec![json!(kid(&new_key)), json!(kid(&old_key))],
        "{jwks}"
    );
    let v = pyjwt(&s, &first, "verify");
    assert_eq!(
        v["ok"], true,
        "a token in flight verifies after the rotation: {v}"
    );
    // A short run: its token lives no longer than the run's 8 s.
    let (logs, _) = run_once(&s, &key, &upstream, 8);
    let second = upstream.last_token();
    agent_saw_no_token(&logs, &second);
    let v = pyjwt(&s, &second, "verify");
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["kid"], kid(&new_key), "new tokens use the new key");
    let exp = v["claims"]["exp"].as_u64().unwrap();
    assert!(exp - v["claims"]["iat"].as_u64().unwrap() <= 8, "{v}");
    // Past its expiry the same token is refused.
    let now = || airlock_platform_api::clock::now_ms() / 1000;
    while u64::try_from(now()).unwrap() <= exp {
        std::thread::sleep(Duration::from_millis(200));
    }
    let v = pyjwt(&s, &second, "verify");
    assert_eq!(
        (v["ok"].as_bool(), v["error"].as_str()),
        (Some(false), Some("ExpiredSignatureError")),
        "{v}"
    );
}

/// `airlock run` has no issuer anyone could verify against: a manifest
/// naming `${airlock.identity}` is refused before anything starts, saying so.
#[test]
fn airlock_run_refuses_an_identity_it_cannot_publish() {
    let run = crate::support::RealRun::with_manifest(
        "print('never')\n",
        &manifest("127.0.0.1:9".parse().unwrap(), 30),
    );
    let (out, _) = run.run("process");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("needs a platform that issues workload identity"),
        "{said}"
    );
    assert!(!said.contains("never"), "{said}");
}
